//! What quichub's integration tests share (a dev-dependency only): relays
//! and hubs on OS-assigned loopback ports, deadlines, one MQTT test client
//! on the project's codec, a test PKI, a real etcd, ffmpeg helpers and the
//! lookup of third-party tools.
//!
//! Feature `hub` adds the fixtures that start the whole server
//! ([`TestRelay`], [`TestGateway`], [`TestHttp`], [`etcd`]); without it,
//! as for the relay's own tests, [`bare`] serves the routing core alone.
//!
//! Programs of the workspace: a test of the package that builds a binary
//! uses `env!("CARGO_BIN_EXE_name")` (Cargo builds it first); helpers here
//! that start one take its path as an argument, and [`workspace_bin`] finds
//! one another package built, as a sibling of the test executable.

pub mod bare;
pub mod docs;
#[cfg(feature = "hub")]
pub mod etcd;
mod h3;
#[cfg(feature = "hub")]
mod hub;
pub mod media;
pub mod mqtt;
pub mod pki;
mod tools;
mod wait;

use std::path::PathBuf;

pub use h3::{h3_body, H3Client};
#[cfg(feature = "hub")]
pub use hub::{knows, test_config, RawSubscriber, TestGateway, TestHttp, TestRelay};
pub use tools::{curl_http2, h3_python, mqtt_tools, openssl};
pub use wait::{until_async, until_forwarding, within};

/// The application close code of a closed session, for raw QUIC and WebTransport.
pub fn close_code(e: &quichub_net::mux::Error) -> Option<u64> {
    e.application_close().map(|(code, _)| code.into())
}

/// The binary `name` of the workspace, from the profile directory the test
/// runs from (`target/debug/deps/TEST` -> `target/debug/NAME`). Cargo builds
/// only the binaries of the test's own package, so a test needing another
/// package's program says how to build it when it is missing.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test executable under target/PROFILE/deps");
    let bin = profile.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build --bin {name}, with the test's profile)",
        bin.display()
    );
    bin
}
