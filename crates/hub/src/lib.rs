//! quichub's server as a library: [`Config`] (the TOML file of nested
//! sections, with `quichub relay`'s flags merged over it by the binary) and
//! [`Hub::start`], which binds the UDP endpoint (raw QUIC MoQT, WebTransport,
//! HTTP/3, MQTT over QUIC) and the TCP listeners (MQTT, MQTT over TLS, the
//! HTTP API and web pages, metrics), and runs the relay, the broker, its
//! durable store and the bridge between them. The binary, the tests, the
//! demo and the lab start exactly this.

mod config;
mod hub;
mod metrics;
mod start;

pub use config::{
    listen_addr, resolve_addr, ClusterSection, Config, FsyncPolicy, HttpSection, MetricsSection,
    MqttSection, OriginSection, QuicSection, RecoveryPolicy, StoreSection, TlsSection,
    DEFAULT_ACK_FREQUENCY,
};
pub use hub::{Hub, SelfSignedFile};
