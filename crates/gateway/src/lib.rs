//! # quichub-gateway
//!
//! The IoT side of quichub: an MQTT 3.1.1 / 5.0 broker whose topics are MoQT
//! tracks of the relay's routing core, so a message published with any
//! protocol reaches subscribers of every protocol.
//!
//! - [`mapping`]: the reversible topic ↔ track and message ↔ object mapping.
//! - [`broker`]: sessions, subscriptions, shared subscriptions, retained
//!   messages, offline queues and wills.
//! - `session`: one MQTT connection's protocol state, without IO (packets
//!   and deliveries in, packets and broker calls out), run by `driver` over
//!   a transport.
//! - [`connection`]: MQTT over a byte stream (TCP, TLS).
//! - [`access`]: a connection's identity (CONNECT credentials through
//!   `quichub-auth`) and its checks on PUBLISH, SUBSCRIBE and delivery.
//! - [`listener`]: accept loops.
//! - [`quic`]: MQTT over QUIC (ALPN `mqtt`), single- and multi-stream.
//! - [`metrics`]: the broker's counters for `/metrics`.
//! - [`sys`]: the `$SYS/broker/...` topics.
//! - [`store`]: the durable log (retained messages, persistent sessions and
//!   their queued messages), with its fsync policy.
//! - [`bridge`]: the MoQT side, the broker's route out
//!   ([`Broker::set_route`], registered by the hub): MQTT messages become
//!   objects of relay tracks, and objects of MoQT-published tracks under
//!   `mqtt` become MQTT messages.
//! - [`cluster`]: MQTT across a cluster of relays (each relay's messages on
//!   one track the other relays subscribe to).
//! - [`http`]: the HTTP pub/sub API (Drift's routes, Server-Sent Events), its
//!   transport-independent core, HTTP/1.1 + HTTP/2 over TCP and HTTP/3 on the
//!   relay's UDP port.
#![warn(missing_docs)]

pub mod access;
pub mod bridge;
pub mod broker;
pub mod cluster;
pub mod connection;
mod driver;
pub mod http;
pub mod listener;
pub mod mapping;
pub mod metrics;
pub mod quic;
mod session;
pub mod store;
pub mod sys;

pub use broker::{Broker, BrokerConfig, DropReason, Transport};
pub use connection::ConnConfig;
