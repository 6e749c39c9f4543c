//! # quichub-mqtt
//!
//! MQTT 3.1.1 (protocol level 4) and MQTT 5.0 (level 5) for a broker: the
//! packet codec ([`packet`], [`properties`], [`reason`]) and topic names,
//! filters, shared subscriptions and a subscription trie ([`topic`]).
//! Sans-IO: bytes in, values and bytes out; no sockets, no async runtime, no
//! clocks. Decoding never panics on peer input, and payloads and binary
//! fields are [`bytes::Bytes`] slices of the receive buffer (zero copy).
//!
//! Why not a crate from crates.io: the candidates did not fit a server.
//! `mqttbytes` has had no release since 2021; rumqttc's internal `mqttbytes`
//! is client-oriented and tied to its tokio event loop; `ntex-mqtt` brings its
//! own runtime; others handle only 3.1.1 or only one side. None combined
//! server-side 3.1.1 + 5.0 decoding, zero-copy payloads and the full
//! validation a broker needs (per-packet property tables, duplicate
//! properties, flag rules, early packet-size rejection), so the codec is
//! written here, in the style of the `moqt` crate.
//!
//! - [`packet`]: [`Packet`] and its parts, [`decode`], [`encode`], [`encoded_len`].
//! - [`properties`]: [`Properties`], the MQTT 5 property set.
//! - [`reason`]: reason codes and 3.1.1 return codes.
//! - [`error`]: [`DecodeError`] (with its reason code) and [`EncodeError`].
//! - [`topic`]: topic name/filter validation, matching, `$share`, [`TopicTree`].
//! - `fuzz` (feature `fuzz`): bodies of the fuzz targets in `crates/mqtt/fuzz/`.
#![warn(missing_docs)]

mod codec;
pub mod error;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
pub mod packet;
pub mod properties;
pub mod reason;
pub mod topic;

pub use codec::MAX_VARINT;
pub use error::{DecodeError, EncodeError};
pub use packet::{
    decode, encode, encoded_len, Ack, Auth, ConnAck, Connect, Disconnect, Packet, Publish, QoS,
    SubAck, Subscribe, SubscribeFilter, SubscriptionOptions, UnsubAck, Unsubscribe, Version, Will,
    DEFAULT_MAX_PACKET_SIZE,
};
pub use properties::Properties;
pub use topic::{
    matches, parse_subscription, valid_topic_filter, valid_topic_name, Filter, SharedFilter,
    TopicError, TopicTree,
};
