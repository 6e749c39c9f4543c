//! The QUIC transport's limits (the `[quic]` section of the relay's config):
//! flow-control windows, stream counts, datagram queues, timeouts, and the
//! admission of new connections (stateless Retry, a cap on handshakes in
//! flight).
//!
//! Why these defaults. A relay holds many small connections (a subscriber of
//! one audio track) and a few large ones (publishers). Upstream quinn-proto
//! allocates a slot up front for every stream a peer may open at once, which
//! made 4096 unidirectional and 1024 bidirectional streams cost about 277 kB
//! per idle connection; the vendored quinn-proto allocates a slot when the
//! peer first uses the stream (vendor/PATCHES.md), so an idle connection
//! costs about 43 kB whatever the counts (figures and the command that
//! measures them in docs/benchmarks.md, "Memory per connection"). quinn grants new
//! stream credit as streams end, so the counts bound streams open *at once*:
//! a publisher's concurrent subgroups and a session's concurrent requests
//! (1024, above `max_requests_per_session`, so a session over its request
//! limit is told so rather than left waiting for a stream). Flow-control
//! windows cost nothing until a peer fills them, but they are what a peer can
//! make the relay hold: the connection-wide `receive_window` caps that per
//! connection (quinn's default is unlimited).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// QUIC limits of a server endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuicConfig {
    /// Bidirectional streams a peer may have open at once (MoQT requests:
    /// subscriptions, fetches, namespaces).
    pub max_concurrent_bidi_streams: u32,
    /// Unidirectional streams a peer may have open at once (MoQT subgroups,
    /// control, HTTP/3's own streams).
    pub max_concurrent_uni_streams: u32,
    /// Bytes a peer may send on one stream ahead of what the relay has read.
    pub stream_receive_window: u32,
    /// Bytes a peer may send on all its streams together ahead of what the
    /// relay has read: the most relay memory one connection can pin with
    /// stream data.
    pub receive_window: u64,
    /// Bytes the relay buffers for sending on one connection (a subscriber
    /// that stops reading holds at most this much).
    pub send_window: u64,
    /// Bytes of received datagrams queued before the oldest are dropped.
    pub datagram_receive_buffer: usize,
    /// Bytes of datagrams queued for sending before the oldest are dropped.
    pub datagram_send_buffer: usize,
    /// A connection silent for this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Keep-alive interval, in milliseconds (0: none); below the idle timeout
    /// so that idle subscribers stay connected.
    pub keep_alive_ms: u64,
    /// Handshakes in flight (from the first packet until the TLS handshake
    /// completes); further connection attempts are refused
    /// (CONNECTION_REFUSED).
    pub max_handshakes: usize,
    /// Handshakes in flight above which a client must first prove its address
    /// with a stateless Retry (one extra round trip; no state is kept for a
    /// spoofed or silent client). 0: always.
    pub retry_above_handshakes: usize,
    /// Longest a handshake may take, in milliseconds; then the connection is
    /// closed (quinn would otherwise keep it until the idle timeout).
    pub handshake_timeout_ms: u64,
    /// Handshakes in flight from one address (IPv6: one /64) whose address
    /// is validated (it answered a Retry); further ones are refused
    /// (CONNECTION_REFUSED). Unvalidated attempts are not counted here, so
    /// that a spoofed flood cannot use up a victim's share: above
    /// `retry_above_handshakes` they must validate first, and then count.
    /// 0: no cap per address.
    pub max_handshakes_per_ip: usize,
    /// Connections open at once from one address (IPv6: one /64), as
    /// `[tcp] max_connections_per_ip` for TCP; further ones are closed as
    /// soon as they are accepted. 0: no cap per address.
    pub max_connections_per_ip: usize,
    /// Congestion controller of the connections: `cubic`, `newreno` or `bbr`
    /// (the lab's `--cc` compares them).
    pub congestion_control: crate::CongestionControl,
    /// QUIC endpoints serving the port, each on a thread of its own and a
    /// socket of one `SO_REUSEPORT` group (see `quichub_net::shard`); 0: one
    /// per CPU the process may run on. 1 (the library's default) runs the
    /// endpoint on the caller's runtime; the relay's configuration
    /// (`[quic] endpoints`) defaults to 0.
    pub endpoints: usize,
}

impl Default for QuicConfig {
    fn default() -> Self {
        Self {
            max_concurrent_bidi_streams: 1024,
            max_concurrent_uni_streams: 4096,
            stream_receive_window: 1 << 20,
            receive_window: 4 << 20,
            send_window: 4 << 20,
            datagram_receive_buffer: 256 << 10,
            datagram_send_buffer: 1 << 20,
            idle_timeout_ms: 30_000,
            keep_alive_ms: 4_000,
            max_handshakes: 1024,
            retry_above_handshakes: 64,
            handshake_timeout_ms: 10_000,
            max_handshakes_per_ip: 256,
            max_connections_per_ip: 4096,
            congestion_control: crate::CongestionControl::default(),
            endpoints: 1,
        }
    }
}

impl QuicConfig {
    /// The handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    /// Refuses values quinn would reject or that make no sense.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.max_concurrent_uni_streams >= 4,
            "[quic] max_concurrent_uni_streams must be at least 4 (control and HTTP/3 streams)"
        );
        anyhow::ensure!(
            self.max_concurrent_bidi_streams >= 1,
            "[quic] max_concurrent_bidi_streams must be at least 1"
        );
        anyhow::ensure!(
            self.receive_window >= u64::from(self.stream_receive_window),
            "[quic] receive_window must be at least stream_receive_window"
        );
        anyhow::ensure!(
            self.idle_timeout_ms > 0 && self.idle_timeout_ms < (1 << 62),
            "[quic] idle_timeout_ms must be positive"
        );
        anyhow::ensure!(
            self.keep_alive_ms < self.idle_timeout_ms,
            "[quic] keep_alive_ms must be below idle_timeout_ms"
        );
        anyhow::ensure!(
            self.max_handshakes >= 1,
            "[quic] max_handshakes must be at least 1"
        );
        anyhow::ensure!(
            self.endpoints <= crate::shard::MAX_SHARDS,
            "[quic] endpoints must be at most {}",
            crate::shard::MAX_SHARDS
        );
        anyhow::ensure!(
            self.handshake_timeout_ms > 0,
            "[quic] handshake_timeout_ms must be positive"
        );
        Ok(())
    }

    /// quinn's transport settings for these limits.
    pub fn transport(&self) -> quinn::TransportConfig {
        let mut t = quinn::TransportConfig::default();
        self.congestion_control.apply(&mut t);
        t.max_concurrent_bidi_streams(self.max_concurrent_bidi_streams.into());
        t.max_concurrent_uni_streams(self.max_concurrent_uni_streams.into());
        t.stream_receive_window(self.stream_receive_window.into());
        t.receive_window(
            quinn::VarInt::from_u64(self.receive_window).unwrap_or(quinn::VarInt::MAX),
        );
        t.send_window(self.send_window);
        t.datagram_receive_buffer_size(Some(self.datagram_receive_buffer));
        t.datagram_send_buffer_size(self.datagram_send_buffer);
        t.keep_alive_interval(
            (self.keep_alive_ms > 0).then(|| Duration::from_millis(self.keep_alive_ms)),
        );
        t.max_idle_timeout(
            quinn::IdleTimeout::try_from(Duration::from_millis(self.idle_timeout_ms)).ok(),
        );
        t
    }

    /// What to do with a new connection attempt while `in_flight` handshakes
    /// are under way.
    pub fn admit(&self, in_flight: usize, address_validated: bool) -> Admission {
        if in_flight >= self.max_handshakes {
            Admission::Refuse
        } else if !address_validated && in_flight >= self.retry_above_handshakes {
            Admission::Retry
        } else {
            Admission::Accept
        }
    }
}

/// The fate of a connection attempt (see [`QuicConfig::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Start the handshake.
    Accept,
    /// Answer with a stateless Retry; the client comes back with a token.
    Retry,
    /// Answer CONNECTION_REFUSED.
    Refuse,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_retries_then_refuses() {
        let c = QuicConfig {
            retry_above_handshakes: 2,
            max_handshakes: 4,
            ..Default::default()
        };
        assert_eq!(c.admit(0, false), Admission::Accept);
        assert_eq!(c.admit(1, false), Admission::Accept);
        assert_eq!(c.admit(2, false), Admission::Retry);
        // A client that came back with a Retry token is let in...
        assert_eq!(c.admit(2, true), Admission::Accept);
        // ...until the cap, which holds for everyone.
        assert_eq!(c.admit(4, true), Admission::Refuse);
        assert_eq!(c.admit(9, false), Admission::Refuse);
        let always = QuicConfig {
            retry_above_handshakes: 0,
            ..Default::default()
        };
        assert_eq!(always.admit(0, false), Admission::Retry);
    }

    #[test]
    fn defaults_are_valid_and_bad_values_refused() {
        QuicConfig::default().validate().unwrap();
        let bad = QuicConfig {
            keep_alive_ms: 40_000,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let bad = QuicConfig {
            receive_window: 1,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn parses_and_refuses_unknown_keys() {
        let c: QuicConfig = serde_json::from_str(r#"{"max_handshakes": 7}"#).unwrap();
        assert_eq!(c.max_handshakes, 7);
        assert_eq!(c.idle_timeout_ms, QuicConfig::default().idle_timeout_ms);
        assert!(serde_json::from_str::<QuicConfig>(r#"{"nope": 1}"#).is_err());
    }
}
