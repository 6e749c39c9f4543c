//! # quichub-net
//!
//! The thin IO layer under quichub: one quinn endpoint that serves raw QUIC
//! (ALPN `moqt-18`) and WebTransport over HTTP/3 (ALPN `h3`, subprotocol
//! `moqt-18`) on the same UDP port, plus bare QUIC connections of other
//! ALPNs (`mqtt`, see [`server::establish_any`]) for their own handlers; TLS
//! from PEM files or a short-lived self-signed certificate; client connections
//! by URL; framed control-message IO over streams; a tiny HTTP server for
//! Prometheus metrics; and the limits every TCP listener of the process
//! shares ([`tcp_limits`]).
//!
//! Both ways in yield a [`web_transport_quinn::Session`], which gives raw QUIC
//! and WebTransport one API (streams and datagrams), so nothing above this
//! crate cares which one a peer used.
#![warn(missing_docs)]

pub mod alias;
mod bridge;
pub mod client;
pub mod flood;
pub mod h3;
pub mod io;
pub mod legacy;
pub mod lite;
pub mod metrics_http;
pub mod mux;
pub mod quic_config;
pub mod rate;
pub mod server;
pub mod shard;
pub mod sniff;
pub mod tcp_limits;
pub mod tls;
pub mod websocket;

pub use mux::{RecvStream, SendStream, Session};
pub use quic_config::QuicConfig;

/// How a session reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Raw QUIC with ALPN `moqt-18`.
    Quic,
    /// WebTransport over HTTP/3.
    WebTransport,
    /// QMux over a WebSocket (`ws://`, `wss://`).
    WebSocket,
}

/// How often a server asks its peers to acknowledge, through the QUIC ACK
/// frequency extension (draft-ietf-quic-ack-frequency, as quinn implements it):
/// after more than `threshold` ack-eliciting packets or after `max_delay`,
/// whichever comes first, and at once when packets arrive out of order.
///
/// A relay mostly sends, so most of what it receives are ACKs; with QUIC's
/// default (every other packet) each subscriber of a 20 ms audio track sends 25
/// ACKs a second; asking for fewer cut the relay's CPU per delivered object
/// by about a sixth (figures in docs/benchmarks.md, "ACK frequency"). Peers that do
/// not support the extension ignore the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckFrequency {
    /// Ack-eliciting packets a peer may receive before it must acknowledge.
    pub threshold: u32,
    /// Longest a peer may hold back an acknowledgement.
    pub max_delay: std::time::Duration,
}

impl AckFrequency {
    /// Largest accepted `max_delay`: beyond it the sender's loss detection and
    /// congestion control react too late to be useful.
    pub const MAX_DELAY_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);
    /// Largest accepted `threshold`.
    pub const THRESHOLD_LIMIT: u32 = 1000;
}

impl Default for AckFrequency {
    /// 9 packets or 100 ms: one ACK per 100 ms for 20 ms audio, one per ten
    /// packets for video, below the initial congestion window (12 packets) so
    /// a starting connection is still ACK-clocked.
    fn default() -> Self {
        Self {
            threshold: 9,
            max_delay: std::time::Duration::from_millis(100),
        }
    }
}

impl std::str::FromStr for AckFrequency {
    type Err = anyhow::Error;

    /// Parses `PACKETS,MILLISECONDS`, e.g. `9,100`.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (packets, ms) = s.split_once(',').ok_or_else(|| {
            anyhow::anyhow!("expected PACKETS,MILLISECONDS (e.g. 9,100), got {s:?}")
        })?;
        let threshold: u32 = packets
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("packet threshold {packets:?} is not a number"))?;
        let ms: u64 = ms
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("delay {ms:?} is not a number of milliseconds"))?;
        let max_delay = std::time::Duration::from_millis(ms);
        anyhow::ensure!(
            threshold <= Self::THRESHOLD_LIMIT,
            "packet threshold {threshold} is above {}",
            Self::THRESHOLD_LIMIT
        );
        anyhow::ensure!(
            ms >= 1 && max_delay <= Self::MAX_DELAY_LIMIT,
            "delay {ms} ms is outside 1..={} ms",
            Self::MAX_DELAY_LIMIT.as_millis()
        );
        Ok(Self {
            threshold,
            max_delay,
        })
    }
}

/// QUIC congestion controller: quinn's three.
///
/// - `cubic` (RFC 9438), quinn's default and Linux TCP's: loss-based, grows
///   the window along a cubic curve.
/// - `newreno` (RFC 9002 §7): loss-based, halves on loss, one packet per
///   round trip in congestion avoidance.
/// - `bbr`: model-based (bottleneck bandwidth and RTT); quinn marks its BBR
///   as experimental.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum CongestionControl {
    /// CUBIC (RFC 9438).
    #[default]
    Cubic,
    /// NewReno (RFC 9002 §7).
    NewReno,
    /// BBR (quinn's experimental implementation).
    Bbr,
}

impl CongestionControl {
    /// Every controller, in documentation order.
    pub const ALL: [CongestionControl; 3] = [
        CongestionControl::Cubic,
        CongestionControl::NewReno,
        CongestionControl::Bbr,
    ];

    /// The name used in flags and configuration files.
    pub fn name(self) -> &'static str {
        match self {
            CongestionControl::Cubic => "cubic",
            CongestionControl::NewReno => "newreno",
            CongestionControl::Bbr => "bbr",
        }
    }

    /// Makes `t` use this controller.
    pub fn apply(self, t: &mut quinn::TransportConfig) {
        use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
        match self {
            CongestionControl::Cubic => {
                t.congestion_controller_factory(std::sync::Arc::new(CubicConfig::default()))
            }
            CongestionControl::NewReno => {
                t.congestion_controller_factory(std::sync::Arc::new(NewRenoConfig::default()))
            }
            CongestionControl::Bbr => {
                t.congestion_controller_factory(std::sync::Arc::new(BbrConfig::default()))
            }
        };
    }
}

impl std::fmt::Display for CongestionControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CongestionControl {
    type Err = anyhow::Error;

    /// `cubic`, `newreno` (or `new-reno`) or `bbr`, any case.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cubic" => Ok(CongestionControl::Cubic),
            "newreno" | "new-reno" | "reno" => Ok(CongestionControl::NewReno),
            "bbr" => Ok(CongestionControl::Bbr),
            _ => anyhow::bail!("unknown congestion controller {s:?}: use cubic, newreno or bbr"),
        }
    }
}

/// Transport parameters shared by server and client: generous stream limits
/// (one stream per subgroup and per request), datagrams on, keep-alives so idle
/// subscribers are not timed out.
///
/// Clients keep quinn's generous stream counts (a subscriber of many tracks
/// receives one stream per subgroup); a server's limits are its
/// [`QuicConfig`].
pub fn transport_config() -> quinn::TransportConfig {
    transport_config_with(CongestionControl::default())
}

/// [`transport_config`] with the congestion controller `cc`.
pub fn transport_config_with(cc: CongestionControl) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    cc.apply(&mut t);
    t.max_concurrent_bidi_streams(1024u32.into());
    t.max_concurrent_uni_streams(4096u32.into());
    t.datagram_receive_buffer_size(Some(1 << 20));
    t.datagram_send_buffer_size(1 << 20);
    t.keep_alive_interval(Some(std::time::Duration::from_secs(4)));
    t.send_window(4 << 20);
    t.max_idle_timeout(Some(
        std::time::Duration::from_secs(30)
            .try_into()
            .expect("valid"),
    ));
    t
}

/// The server's transport settings: `quic`'s limits, asking peers to
/// acknowledge as `ack` says.
pub fn server_transport(quic: &QuicConfig, ack: Option<AckFrequency>) -> quinn::TransportConfig {
    let mut t = quic.transport();
    if let Some(ack) = ack {
        let mut a = quinn::AckFrequencyConfig::default();
        a.ack_eliciting_threshold(ack.threshold.into());
        // Honoured above the path RTT by the vendored quinn-proto (vendor/PATCHES.md).
        a.max_ack_delay(Some(ack.max_delay));
        t.ack_frequency_config(Some(a));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::CongestionControl;

    #[test]
    fn congestion_control_names_round_trip() {
        for cc in CongestionControl::ALL {
            assert_eq!(cc.name().parse::<CongestionControl>().unwrap(), cc);
            assert_eq!(cc.to_string(), cc.name());
        }
        assert_eq!(
            "New-Reno".parse::<CongestionControl>().unwrap(),
            CongestionControl::NewReno
        );
        let e = "fast".parse::<CongestionControl>().unwrap_err().to_string();
        assert!(e.contains("cubic, newreno or bbr"), "{e}");
        assert_eq!(CongestionControl::default(), CongestionControl::Cubic);
    }
}
