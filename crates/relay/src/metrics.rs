//! Counters of the relay, rendered as Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Relay-wide counters. All relaxed atomics: they are statistics, not synchronisation.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Sessions currently open.
    pub sessions: AtomicI64,
    /// Sessions accepted since start.
    pub sessions_total: AtomicU64,
    /// Connections waiting for their CLIENT_SETUP.
    pub sessions_half_open: AtomicI64,
    /// Connections closed because no CLIENT_SETUP came in time.
    pub setup_timeouts: AtomicU64,
    /// Data streams stopped because their header did not come in time.
    pub stream_header_timeouts: AtomicU64,
    /// Requests refused by the authorizer (REQUEST_ERROR).
    pub requests_unauthorized: AtomicU64,
    /// Requests refused with EXCESSIVE_LOAD for the session's
    /// `max_requests_per_second`.
    pub requests_refused_rate: AtomicU64,
    /// REQUEST_UPDATEs held back for the session's `max_requests_per_second`.
    pub requests_delayed: AtomicU64,
    /// Sessions closed because their credentials expired.
    pub sessions_expired: AtomicU64,
    /// Sessions closed because a reload of the auth revoked their credentials.
    pub sessions_revoked: AtomicU64,
    /// Subscriptions ended because the token of their own that admitted
    /// them expired.
    pub subscriptions_expired: AtomicU64,
    /// Waiting (rendezvous) subscriptions that kept waiting after the
    /// namespace's publisher did not have the track yet.
    pub rendezvous_retries: AtomicU64,
    /// Tracks ended by PUBLISH_DONE before all the data streams its Stream
    /// Count announced had arrived and been read (after a grace period).
    pub publish_done_streams_missing: AtomicU64,
    /// Connections refused by a session limit, by which one.
    pub sessions_refused_half_open: AtomicU64,
    /// Sessions refused at SETUP because `max_sessions` were open.
    pub sessions_refused_full: AtomicU64,
    /// Sessions of an older MoQT draft (CLIENT_SETUP on a bidirectional
    /// stream), refused with VERSION_NEGOTIATION_FAILED.
    pub sessions_refused_draft: AtomicU64,
    /// MoQT sessions that came over a WebSocket (QMux) upgrade.
    pub websocket_sessions: AtomicU64,
    /// Sessions of draft 14 and of draft 16, served through the
    /// translating bridge (`quichub_net::legacy`).
    pub legacy_sessions: [AtomicU64; 2],
    /// moq-lite sessions, served through the lite bridge
    /// (`quichub_net::lite`), by version (lite-01 first).
    pub lite_sessions: [AtomicU64; 6],
    /// Departures from draft 18 of widely used peers, accepted (or, for
    /// LARGEST_OBJECT, accommodated), by [`moqt::deviation::Deviation::index`].
    pub deviations: [AtomicU64; moqt::deviation::Deviation::ALL.len()],
    /// WebSocket upgrades refused (not a valid handshake, no MoQT
    /// subprotocol offered, relay shutting down).
    pub websocket_refused: AtomicU64,
    /// Downstream subscriptions currently open.
    pub subscriptions: AtomicI64,
    /// Tracks currently held.
    pub tracks: AtomicI64,
    /// Objects received from publishers.
    pub objects_in: AtomicU64,
    /// Payload bytes received from publishers.
    pub bytes_in: AtomicU64,
    /// Objects written to subscribers.
    pub objects_out: AtomicU64,
    /// Payload bytes written to subscribers.
    pub bytes_out: AtomicU64,
    /// Objects dropped because a subscriber fell behind the fan-out ring.
    pub drops_lagged: AtomicU64,
    /// Objects dropped because their delivery timeout passed.
    pub drops_timeout: AtomicU64,
    /// Datagrams the transport refused (too large, or no datagram support).
    pub drops_datagram: AtomicU64,
    /// Subgroup streams reset (timeouts, gaps, cancellations).
    pub streams_reset: AtomicU64,
    /// Bytes held in track caches.
    pub cache_bytes: AtomicI64,
    /// Sessions closed for protocol violations.
    pub protocol_violations: AtomicU64,
    /// Sessions to origin relays up now (`[cluster] origins`).
    pub origin_sessions: AtomicI64,
    /// Times a session to an origin relay ended or could not be opened.
    pub origin_reconnects: AtomicU64,
    /// Tracks whose upstream relay went away and that went on from another
    /// relay holding their namespace, their subscribers kept.
    pub upstream_reattached: AtomicU64,
    /// FETCHes the relay sent upstream for objects it does not hold.
    pub fetch_upstream: AtomicU64,
    /// Downstream FETCHes served by an upstream FETCH already under way for
    /// the same range (no FETCH of their own sent upstream).
    pub fetch_upstream_shared: AtomicU64,
    /// Upstream FETCHes refused, timed out, broken off or cut at the
    /// memory limit.
    pub fetch_upstream_failed: AtomicU64,
    /// Bytes held by upstream FETCH responses being relayed (bounded by
    /// `cache_bytes_total`, apart from the track caches).
    pub fetch_upstream_bytes: AtomicI64,
    /// End of Unknown Range markers sent in FETCH responses (objects the
    /// relay could not get from upstream in time).
    pub fetch_unknown_ranges: AtomicU64,
    /// Datagram objects handed from the publisher's endpoint shard to
    /// another shard's subscribers (one per object and shard).
    pub shard_handoffs: AtomicU64,
    /// Wake-ups for new stream events handed to another endpoint shard's
    /// subscribers (at most one per event and shard; coalesced while one
    /// is pending).
    pub shard_wakeups: AtomicU64,
}

impl Metrics {
    /// Counts one accepted departure from draft 18.
    pub fn deviation(&self, d: moqt::deviation::Deviation) {
        self.deviations[d.index()].fetch_add(1, Relaxed);
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut g = |name: &str, help: &str, kind: &str, v: i128, labels: &str| {
            let _ = writeln!(s, "# HELP quichub_{name} {help}");
            let _ = writeln!(s, "# TYPE quichub_{name} {kind}");
            let _ = writeln!(s, "quichub_{name}{labels} {v}");
        };
        g(
            "sessions",
            "Open MoQT sessions.",
            "gauge",
            self.sessions.load(Relaxed) as i128,
            "",
        );
        g(
            "sessions_total",
            "MoQT sessions accepted.",
            "counter",
            self.sessions_total.load(Relaxed) as i128,
            "",
        );
        g(
            "sessions_half_open",
            "Connections waiting for their CLIENT_SETUP.",
            "gauge",
            self.sessions_half_open.load(Relaxed) as i128,
            "",
        );
        g(
            "setup_timeouts_total",
            "Connections closed because CLIENT_SETUP did not arrive in time.",
            "counter",
            self.setup_timeouts.load(Relaxed) as i128,
            "",
        );
        g(
            "requests_unauthorized_total",
            "MoQT requests refused by the authorizer (REQUEST_ERROR).",
            "counter",
            self.requests_unauthorized.load(Relaxed) as i128,
            "",
        );
        g(
            "sessions_expired_total",
            "MoQT sessions closed because their token expired.",
            "counter",
            self.sessions_expired.load(Relaxed) as i128,
            "",
        );
        g(
            "sessions_revoked_total",
            "MoQT sessions closed because a reload revoked their credentials.",
            "counter",
            self.sessions_revoked.load(Relaxed) as i128,
            "",
        );
        g(
            "subscriptions_expired_total",
            "Subscriptions ended (PUBLISH_DONE UNAUTHORIZED) because the token of their own that admitted them expired.",
            "counter",
            self.subscriptions_expired.load(Relaxed) as i128,
            "",
        );
        g(
            "rendezvous_retries_total",
            "Waiting subscriptions that kept waiting because the namespace's publisher did not have the track yet.",
            "counter",
            self.rendezvous_retries.load(Relaxed) as i128,
            "",
        );
        g(
            "stream_header_timeouts_total",
            "Data streams stopped because their type or header did not arrive in time.",
            "counter",
            self.stream_header_timeouts.load(Relaxed) as i128,
            "",
        );
        g(
            "publish_done_streams_missing_total",
            "Tracks ended by PUBLISH_DONE before all the data streams it counted had arrived (after a grace period).",
            "counter",
            self.publish_done_streams_missing.load(Relaxed) as i128,
            "",
        );
        g(
            "subscriptions",
            "Open downstream subscriptions.",
            "gauge",
            self.subscriptions.load(Relaxed) as i128,
            "",
        );
        g(
            "tracks",
            "Tracks held by the relay.",
            "gauge",
            self.tracks.load(Relaxed) as i128,
            "",
        );
        g(
            "objects_total",
            "Objects by direction.",
            "counter",
            self.objects_in.load(Relaxed) as i128,
            "{direction=\"in\"}",
        );
        let _ = writeln!(
            s,
            "quichub_objects_total{{direction=\"out\"}} {}",
            self.objects_out.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP quichub_bytes_total Payload bytes by direction.\n# TYPE quichub_bytes_total counter");
        let _ = writeln!(
            s,
            "quichub_bytes_total{{direction=\"in\"}} {}",
            self.bytes_in.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "quichub_bytes_total{{direction=\"out\"}} {}",
            self.bytes_out.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP quichub_drops_total Objects not delivered, by reason.\n# TYPE quichub_drops_total counter");
        let _ = writeln!(
            s,
            "quichub_drops_total{{reason=\"lagged\"}} {}",
            self.drops_lagged.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "quichub_drops_total{{reason=\"delivery_timeout\"}} {}",
            self.drops_timeout.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "quichub_drops_total{{reason=\"datagram\"}} {}",
            self.drops_datagram.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP quichub_streams_reset_total Subgroup streams reset.\n# TYPE quichub_streams_reset_total counter");
        let _ = writeln!(
            s,
            "quichub_streams_reset_total {}",
            self.streams_reset.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP quichub_cache_bytes Bytes held in track caches.\n# TYPE quichub_cache_bytes gauge");
        let _ = writeln!(s, "quichub_cache_bytes {}", self.cache_bytes.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_sessions_refused_total Connections refused by a session limit.\n# TYPE quichub_sessions_refused_total counter");
        let _ = writeln!(
            s,
            "quichub_sessions_refused_total{{limit=\"max_half_open_sessions\"}} {}",
            self.sessions_refused_half_open.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "quichub_sessions_refused_total{{limit=\"max_sessions\"}} {}",
            self.sessions_refused_full.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "quichub_sessions_refused_total{{limit=\"draft\"}} {}",
            self.sessions_refused_draft.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP quichub_websocket_sessions_total MoQT sessions over a WebSocket (QMux), by outcome of the upgrade.\n# TYPE quichub_websocket_sessions_total counter");
        let _ = writeln!(
            s,
            "quichub_websocket_sessions_total{{upgrade=\"accepted\"}} {}",
            self.websocket_sessions.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "quichub_websocket_sessions_total{{upgrade=\"refused\"}} {}",
            self.websocket_refused.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP quichub_legacy_sessions_total MoQT sessions of an older draft, served through the translating bridge.\n# TYPE quichub_legacy_sessions_total counter");
        for (i, draft) in ["14", "16"].iter().enumerate() {
            let _ = writeln!(
                s,
                "quichub_legacy_sessions_total{{draft=\"{draft}\"}} {}",
                self.legacy_sessions[i].load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP quichub_lite_sessions_total moq-lite sessions, served through the translating bridge, by version.\n# TYPE quichub_lite_sessions_total counter");
        for (i, n) in self.lite_sessions.iter().enumerate() {
            let _ = writeln!(
                s,
                "quichub_lite_sessions_total{{version=\"moq-lite-0{}\"}} {}",
                i + 1,
                n.load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP quichub_interop_deviations_total Departures from draft 18 of widely used peers that were accepted (crates/moqt/INTEROP.md), by peer and kind.\n# TYPE quichub_interop_deviations_total counter");
        for d in moqt::deviation::Deviation::ALL {
            let _ = writeln!(
                s,
                "quichub_interop_deviations_total{{peer=\"{}\",kind=\"{}\"}} {}",
                d.peer(),
                d.kind(),
                self.deviations[d.index()].load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP quichub_requests_rate_limited_total MoQT requests over their session's max_requests_per_second: refused (REQUEST_ERROR EXCESSIVE_LOAD) or, REQUEST_UPDATEs, delayed.\n# TYPE quichub_requests_rate_limited_total counter");
        for (action, v) in [
            ("refused", &self.requests_refused_rate),
            ("delayed", &self.requests_delayed),
        ] {
            let _ = writeln!(
                s,
                "quichub_requests_rate_limited_total{{action=\"{action}\"}} {}",
                v.load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP quichub_protocol_violations_total Sessions closed for protocol violations.\n# TYPE quichub_protocol_violations_total counter");
        let _ = writeln!(
            s,
            "quichub_protocol_violations_total {}",
            self.protocol_violations.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP quichub_origin_sessions Sessions to origin relays up now.\n# TYPE quichub_origin_sessions gauge\nquichub_origin_sessions {}", self.origin_sessions.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_origin_reconnects_total Times a session to an origin relay ended or could not be opened.\n# TYPE quichub_origin_reconnects_total counter\nquichub_origin_reconnects_total {}", self.origin_reconnects.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_upstream_reattached_total Tracks that lost their upstream relay and went on from another one, subscribers kept.\n# TYPE quichub_upstream_reattached_total counter\nquichub_upstream_reattached_total {}", self.upstream_reattached.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_fetch_upstream_total FETCHes sent upstream for objects the relay does not hold.\n# TYPE quichub_fetch_upstream_total counter\nquichub_fetch_upstream_total {}", self.fetch_upstream.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_fetch_upstream_shared_total Downstream FETCHes served by an upstream FETCH already under way for the same range.\n# TYPE quichub_fetch_upstream_shared_total counter\nquichub_fetch_upstream_shared_total {}", self.fetch_upstream_shared.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_fetch_upstream_failed_total Upstream FETCHes refused, timed out, broken off, cut at the memory limit or left unread.\n# TYPE quichub_fetch_upstream_failed_total counter\nquichub_fetch_upstream_failed_total {}", self.fetch_upstream_failed.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_fetch_upstream_bytes Bytes held by upstream FETCH responses being relayed.\n# TYPE quichub_fetch_upstream_bytes gauge\nquichub_fetch_upstream_bytes {}", self.fetch_upstream_bytes.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_fetch_unknown_ranges_total End of Unknown Range markers sent in FETCH responses.\n# TYPE quichub_fetch_unknown_ranges_total counter\nquichub_fetch_unknown_ranges_total {}", self.fetch_unknown_ranges.load(Relaxed));
        let _ = writeln!(s, "# HELP quichub_shard_handoffs_total Hand-offs to another endpoint shard's subscribers: datagram objects, and wake-ups for new stream events (at most one per object and shard).\n# TYPE quichub_shard_handoffs_total counter");
        let _ = writeln!(
            s,
            "quichub_shard_handoffs_total{{kind=\"datagram\"}} {}",
            self.shard_handoffs.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "quichub_shard_handoffs_total{{kind=\"stream_wakeup\"}} {}",
            self.shard_wakeups.load(Relaxed)
        );
        s
    }
}
/// `quichub_origin_upstream_tracks{origin="URL"}`: per relay this one has
/// a session to (`[cluster] origins` or cluster members), the tracks it
/// subscribes to there (one upstream subscription per track).
pub fn render_upstreams(by_origin: &[(std::sync::Arc<str>, usize)]) -> String {
    let mut s = String::from(
        "# HELP quichub_origin_upstream_tracks Tracks subscribed to upstream, per relay this one follows.\n\
         # TYPE quichub_origin_upstream_tracks gauge\n",
    );
    for (origin, n) in by_origin {
        let origin = origin.replace('\\', "\\\\").replace('"', "\\\"");
        let _ = writeln!(
            s,
            "quichub_origin_upstream_tracks{{origin=\"{origin}\"}} {n}"
        );
    }
    s
}
