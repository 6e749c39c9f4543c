//! # quichub-net
//!
//! The thin IO layer under quichub: one quinn endpoint that serves raw QUIC
//! (ALPN `moqt-18`) and WebTransport over HTTP/3 (ALPN `h3`, subprotocol
//! `moqt-18`) on the same UDP port, plus bare QUIC connections of other
//! ALPNs (`mqtt`, see [`server::establish_any`]) for their own handlers; TLS
//! from PEM files or a short-lived self-signed certificate; client connections
//! by URL; framed control-message IO over streams; and a tiny HTTP server for
//! Prometheus metrics.
//!
//! Both ways in yield a [`web_transport_quinn::Session`], which gives raw QUIC
//! and WebTransport one API (streams and datagrams), so nothing above this
//! crate cares which one a peer used.
#![warn(missing_docs)]

pub mod client;
pub mod h3;
pub mod io;
pub mod metrics_http;
pub mod server;
pub mod tls;

pub use web_transport_quinn::{RecvStream, SendStream, Session};

/// How a session reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Raw QUIC with ALPN `moqt-18`.
    Quic,
    /// WebTransport over HTTP/3.
    WebTransport,
}

/// Transport parameters shared by server and client: generous stream limits
/// (one stream per subgroup and per request), datagrams on, keep-alives so idle
/// subscribers are not timed out.
pub fn transport_config() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(1024u32.into());
    t.max_concurrent_uni_streams(4096u32.into());
    t.datagram_receive_buffer_size(Some(1 << 20));
    t.datagram_send_buffer_size(1 << 20);
    t.keep_alive_interval(Some(std::time::Duration::from_secs(4)));
    // Bounds what a subscriber that stops reading can make us buffer.
    t.send_window(4 << 20);
    t.max_idle_timeout(Some(
        std::time::Duration::from_secs(30)
            .try_into()
            .expect("valid"),
    ));
    t
}
