//! The lab's experiments end to end, one test binary: each module runs one
//! experiment's CI-sized run (`--quick`), through the library or through
//! the `quichub-lab` binary, and checks the structure and consistency of
//! what it writes, never timing thresholds. Each skips (and passes) where
//! the link emulator cannot run (no root, no TUN, no network namespaces).

mod fingerprint;
mod h3_vs_mqtt;
mod imu;
mod live_video;
mod mar;
mod uplink;
mod video_priority;
mod zero_rtt;

use std::sync::{Mutex, MutexGuard};

use quichub_lab::LabArgs;

/// [`LabArgs`] as a command line of its own.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    lab: LabArgs,
}

/// One experiment at a time, as when each was a test binary of its own:
/// they load the machine, and share it badly.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
