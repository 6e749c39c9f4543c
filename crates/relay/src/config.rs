//! Relay limits and defaults. Every value a peer can push against has a bound here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Relay configuration (also the schema of the `--config` TOML file).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Most concurrent sessions that completed SETUP; further ones are closed
    /// when their SETUP arrives.
    pub max_sessions: usize,
    /// Most connections that have not yet sent CLIENT_SETUP; further ones are
    /// closed at once. Kept apart from `max_sessions` so connections that
    /// never speak cannot take the slots of real sessions.
    pub max_half_open_sessions: usize,
    /// Longest a connection may take to send CLIENT_SETUP, in milliseconds;
    /// then it is closed with CONTROL_MESSAGE_TIMEOUT. Data and request
    /// streams that arrive before SETUP wait (unread, within the QUIC flow
    /// control windows) at most this long.
    pub setup_timeout_ms: u64,
    /// Longest a new data stream may take to deliver its type and (for a
    /// subgroup) its SUBGROUP_HEADER, in milliseconds, counted once SETUP is
    /// done; then it is stopped (STOP_SENDING CANCELLED). A subgroup stream
    /// idle between objects is not timed out: publishers keep them open.
    pub stream_header_timeout_ms: u64,
    /// Most open requests (subscriptions, fetches, namespaces...) per session.
    pub max_requests_per_session: usize,
    /// Requests a session may make per second, every type (SUBSCRIBE,
    /// FETCH, TRACK_STATUS, PUBLISH, PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE,
    /// SUBSCRIBE_TRACKS, REQUEST_UPDATE), after a burst of `request_burst`;
    /// beyond it a new request gets REQUEST_ERROR EXCESSIVE_LOAD with a
    /// Retry Interval, and a REQUEST_UPDATE waits its turn. 0: no limit.
    /// Another relay of the cluster is not limited.
    pub max_requests_per_second: u64,
    /// Requests a session may make at once above `max_requests_per_second`
    /// (0: one second's worth).
    pub request_burst: u64,
    /// Most tracks the relay holds at once.
    pub max_tracks: usize,
    /// Largest object payload accepted, in bytes.
    pub max_object_size: usize,
    /// Cache bytes per track (recent groups, for FETCH and joining FETCH).
    pub cache_bytes_per_track: usize,
    /// Cache bytes over all tracks.
    pub cache_bytes_total: usize,
    /// Oldest a cached object may be, in milliseconds.
    pub cache_max_age_ms: u64,
    /// Objects buffered per track for fan-out; a subscriber further behind loses
    /// the oldest ones.
    pub fanout_buffer: usize,
    /// Objects a subscriber may lose before it is ended with TOO_FAR_BEHIND.
    pub max_lag_objects: u64,
    /// Longest a write to one subscriber's stream may block (flow control or a
    /// full send buffer) before that stream is reset and its subscriber skips
    /// ahead, in milliseconds. Keeps a stalled subscriber from pinning state.
    pub write_stall_ms: u64,
    /// Longest RENDEZVOUS_TIMEOUT honoured, in milliseconds; also how long a
    /// track whose upstream relay went away waits for its namespace to be
    /// published again ([`crate::core::Relay`]'s re-attachment).
    pub max_rendezvous_ms: u64,
    /// GOAWAY timeout announced on shutdown, in milliseconds.
    pub goaway_timeout_ms: u64,
    /// New Session URI sent in GOAWAY on shutdown (another relay of the
    /// cluster, `moqt://` or `https://`), for clients and following relays
    /// to reconnect to; empty: none.
    pub goaway_uri: String,
    /// Time to wait for the upstream publisher's answer, in milliseconds.
    pub upstream_timeout_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_sessions: 10_000,
            max_half_open_sessions: 1_000,
            setup_timeout_ms: 10_000,
            stream_header_timeout_ms: 10_000,
            max_requests_per_session: 1_000,
            // Far above a player's or a publisher's few requests a second,
            // and a session may open all its `max_requests_per_session` at
            // once (a client back after a reconnect); it still keeps one
            // session from churning SUBSCRIBEs (each may cost an upstream
            // one) as fast as it can send them.
            max_requests_per_second: 1_000,
            request_burst: 1_000,
            max_tracks: 100_000,
            max_object_size: 4 * 1024 * 1024,
            cache_bytes_per_track: 8 * 1024 * 1024,
            cache_bytes_total: 512 * 1024 * 1024,
            cache_max_age_ms: 30_000,
            fanout_buffer: 4096,
            max_lag_objects: 20_000,
            write_stall_ms: 2_000,
            max_rendezvous_ms: 30_000,
            goaway_timeout_ms: 2_000,
            goaway_uri: String::new(),
            upstream_timeout_ms: 5_000,
        }
    }
}

impl Config {
    /// Cache age as a Duration.
    pub fn cache_max_age(&self) -> Duration {
        Duration::from_millis(self.cache_max_age_ms)
    }
}
