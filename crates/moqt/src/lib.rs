//! # moqt
//!
//! The wire format of Media over QUIC Transport, draft-ietf-moq-transport-18,
//! and the pure parts of its session logic. Sans-IO: bytes in, values and bytes
//! out; no sockets, no async runtime, no clocks.
//!
//! - [`coding`]: `vi64`, Locations, Key-Value-Pairs.
//! - [`names`]: Track Namespaces and Full Track Names.
//! - [`params`]: Message Parameters and Subscription Filters.
//! - [`message`]: every control message.
//! - [`data`]: subgroup streams, datagrams, fetch streams, padding.
//! - [`session`]: SETUP validation, request-ID rules, control-stream framing.
//! - [`deviation`]: the departures from draft 18 of widely used peers that are accepted.
//! - [`sniff`]: which draft (14 or 18) or moq-lite version a session speaks, from its first stream.
//! - [`lite`]: moq-lite 01…06 (moq-dev's protocol), its messages, group streams and paths.
//! - [`token`]: the AUTHORIZATION TOKEN structure and the per-session token cache.
//! - `fuzz` (feature `fuzz`): the bodies of the fuzz targets in `crates/moqt/fuzz/`.
#![warn(missing_docs)]

pub mod coding;
pub mod data;
pub mod deviation;
pub mod error;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
pub mod legacy;
pub mod lite;
pub mod message;
pub mod names;
pub mod params;
pub mod priority;
pub mod session;
pub mod sniff;
pub mod token;

pub use coding::{KeyValue, KvValue, Location};
pub use error::{DecodeError, SessionErrorCode};
pub use message::Message;
pub use names::{FullTrackName, TrackNamespace};
pub use params::{GroupOrder, Parameters, SubscriptionFilter};

/// ALPN for raw QUIC and the WebTransport subprotocol for this draft.
pub const ALPN: &str = "moqt-18";
