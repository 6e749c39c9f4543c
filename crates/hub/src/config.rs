//! The configuration: one TOML file of nested sections (`[relay]`, `[quic]`,
//! `[mqtt]`, `[http]`, `[tcp]`, `[tls]`, `[auth]`, `[metrics]`, `[store]`),
//! every key optional (its default when absent), unknown keys refused with
//! the file, line and column. `quichub relay`'s flags each set one key (see
//! docs/configuration.md).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use quichub_auth::AuthConfig;
use quichub_gateway::{BrokerConfig, ConnConfig};
use quichub_net::tcp_limits::TcpLimits;
use quichub_net::{AckFrequency, QuicConfig};
use serde::{Deserialize, Serialize};

/// Everything a hub is started with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[relay]`: the MoQT relay core's limits.
    pub relay: quichub_relay::Config,
    /// `[quic]`: the UDP endpoint (raw QUIC, WebTransport, HTTP/3, MQTT over
    /// QUIC), its transport limits and connection admission.
    pub quic: QuicSection,
    /// `[mqtt]`: the broker's listeners and limits.
    pub mqtt: MqttSection,
    /// `[http]`: the HTTP API's listener and limits.
    pub http: HttpSection,
    /// `[tcp]`: what every TCP listener (MQTT, MQTT over TLS, HTTP, metrics)
    /// admits, and the HTTP timeouts.
    pub tcp: TcpLimits,
    /// `[tls]`: the certificate of every TLS listener, and client certificates.
    pub tls: TlsSection,
    /// `[auth]`: authentication and authorisation (re-read on reload).
    pub auth: AuthConfig,
    /// `[metrics]`: the Prometheus endpoint (also `/healthz`, `/readyz`).
    pub metrics: MetricsSection,
    /// `[store]`: the broker's durable state (and the self-signed certificate).
    pub store: StoreSection,
    /// `[cluster]`: other relays this one follows.
    pub cluster: ClusterSection,
    /// The file this configuration was read from: [`crate::Hub::reload`]
    /// re-reads its `[auth]` section.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[cluster]`: relays this one follows over MoQT (`quichub_relay::origin`),
/// and the registry of a cluster of relays (`quichub-cluster`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// Origin relays: this relay subscribes to their namespaces, one
    /// upstream SUBSCRIBE per track however many subscribers it has here.
    pub origins: Vec<OriginSection>,
    /// The registry of the cluster this relay is one of:
    /// `etcd://host:port[,host:port…][/prefix]` (`etcds://` over TLS), or
    /// `file:PATH` (a fixed list of relays); empty: no cluster.
    pub registry: String,
    /// Where the other relays reach this one (`moqt://host:port/` or
    /// `https://host:port/`); empty: `moqt://` and `quic.bind`, when that is
    /// a specific address.
    pub node_url: String,
    /// This relay's name in the registry; empty: its `node_url`.
    pub node_id: String,
    /// Seconds after its last renewal that a relay which stopped (died) is
    /// dropped from the registry with its namespaces (etcd lease TTL).
    pub lease_ttl_s: u64,
    /// A token this relay presents to the other relays (`?jwt=`), when
    /// they require one.
    pub token: String,
    /// PEM file of the CAs that sign the relays' certificates. Unset, each
    /// relay registers its certificate's SHA-256 and the others pin it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// PEM file of the CAs that sign etcd's certificate: TLS to etcd
    /// (`etcds://` without it checks against the system's CAs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM file of this relay's client certificate for etcd (with
    /// `etcd_key`; etcd's `--client-cert-auth`): TLS to etcd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_cert: Option<PathBuf>,
    /// PEM file of `etcd_cert`'s private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_key: Option<PathBuf>,
    /// The etcd user this relay authenticates as (with
    /// `etcd_password_file`); empty: none.
    pub etcd_user: String,
    /// A file holding `etcd_user`'s password (its first line), kept out of
    /// the configuration so that printing or sharing it shows no secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_password_file: Option<PathBuf>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            origins: Vec::new(),
            registry: String::new(),
            node_url: String::new(),
            node_id: String::new(),
            lease_ttl_s: 10,
            token: String::new(),
            ca: None,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            etcd_user: String::new(),
            etcd_password_file: None,
        }
    }
}

impl ClusterSection {
    /// How to reach the etcd of `registry` (an `etcd://` or `etcds://`
    /// one): its URL with TLS and the user's password (read from its file)
    /// as configured.
    pub fn etcd_options(&self) -> anyhow::Result<quichub_cluster::etcd::EtcdOptions> {
        use quichub_cluster::etcd::{EtcdOptions, EtcdTls, EtcdUser};
        let mut o = EtcdOptions::from_url(
            &self.registry,
            std::time::Duration::from_secs(self.lease_ttl_s),
        )
        .context("cluster.registry / cluster.lease_ttl_s")?;
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            _ => anyhow::bail!("cluster.etcd_cert and cluster.etcd_key: both or neither"),
        };
        if self.etcd_ca.is_some() || identity.is_some() {
            let ca = self.etcd_ca.clone();
            // etcds:// alone checks against the system's CAs.
            o = o.with_tls(EtcdTls { ca, identity });
        }
        match (self.etcd_user.is_empty(), &self.etcd_password_file) {
            (true, None) => {}
            (false, Some(f)) => {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("cluster.etcd_password_file {}", f.display()))?;
                let password = text.lines().next().unwrap_or("").to_string();
                anyhow::ensure!(
                    !password.is_empty(),
                    "cluster.etcd_password_file {}: empty",
                    f.display()
                );
                o = o.with_user(EtcdUser {
                    name: self.etcd_user.clone(),
                    password,
                });
            }
            _ => anyhow::bail!("cluster.etcd_user and cluster.etcd_password_file: both or neither"),
        }
        Ok(o)
    }

    /// `node_url`, or `moqt://` with the QUIC address when that is a
    /// specific one.
    pub fn node_url(&self, quic: SocketAddr) -> anyhow::Result<String> {
        if !self.node_url.is_empty() {
            let u: url::Url = self
                .node_url
                .parse()
                .with_context(|| format!("cluster.node_url {:?}", self.node_url))?;
            anyhow::ensure!(
                matches!(u.scheme(), "moqt" | "https") && u.host().is_some(),
                "cluster.node_url {:?}: moqt://host:port/ or https://host:port/",
                self.node_url
            );
            return Ok(self.node_url.clone());
        }
        anyhow::ensure!(
            !quic.ip().is_unspecified(),
            "cluster.node_url (--node-url): how the other relays reach this one; \
             quic.bind {quic} names no single address"
        );
        Ok(format!("moqt://{quic}/"))
    }
}

/// One `[[cluster.origins]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OriginSection {
    /// `moqt://host:port/`, `https://host:port/` (WebTransport), or
    /// `wss://host:https-port/` / `ws://host:http-port/` (MoQT over
    /// WebSocket, for a network that blocks UDP; `ws://` is cleartext and
    /// takes no fingerprint or ca); `?jwt=` authenticates this relay there.
    pub url: String,
    /// Namespace prefixes to follow (`/`-separated); empty: every namespace.
    pub prefixes: Vec<String>,
    /// SHA-256 of the origin's certificate (hex), as `quichub relay` prints it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// PEM file of the CAs that sign the origin's certificate (checked for
    /// the URL's host name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
}

impl OriginSection {
    /// What `quichub_relay::origin::follow` takes, and how to check the
    /// origin's certificate.
    pub fn resolve(
        &self,
    ) -> anyhow::Result<(quichub_relay::origin::Origin, quichub_net::tls::Verify)> {
        let url: url::Url = self
            .url
            .parse()
            .with_context(|| format!("cluster.origins url {:?}", self.url))?;
        // ws:// and wss:// reach an origin over TCP where UDP is blocked.
        anyhow::ensure!(
            matches!(url.scheme(), "moqt" | "https" | "ws" | "wss"),
            "cluster.origins url {:?}: moqt://, https://, ws:// or wss://",
            self.url
        );
        let verify = match (&self.fingerprint, &self.ca) {
            // Cleartext: no certificate to check (only for a path the
            // operator trusts, such as a private network).
            (None, None) if url.scheme() == "ws" => quichub_net::tls::Verify::Insecure,
            _ if url.scheme() == "ws" => anyhow::bail!(
                "cluster.origins {}: ws:// has no certificate to check (use wss:// with a fingerprint or ca)",
                self.url
            ),
            (Some(f), None) => {
                quichub_net::tls::Verify::Fingerprints(vec![quichub_net::tls::unhex(f)
                    .filter(|b| b.len() == 32)
                    .with_context(|| {
                        format!("cluster.origins fingerprint {f:?}: 64 hex digits")
                    })?])
            }
            (None, Some(ca)) => quichub_net::tls::Verify::ca_file(ca)
                .with_context(|| format!("cluster.origins ca for {}", self.url))?,
            _ => anyhow::bail!(
                "cluster.origins {}: give its certificate's fingerprint or a ca file (one of them)",
                self.url
            ),
        };
        let prefixes = if self.prefixes.is_empty() {
            vec![moqt::TrackNamespace::default()]
        } else {
            self.prefixes
                .iter()
                .map(|p| moqt::TrackNamespace::from_path(p))
                .collect()
        };
        Ok((
            quichub_relay::origin::Origin {
                url,
                prefixes,
                held: Vec::new(),
            },
            verify,
        ))
    }
}

/// `[quic]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QuicSection {
    /// UDP address: `IP:PORT` or `HOST:PORT` (a name binds its first IPv4
    /// address, else its first). `--bind`.
    pub bind: String,
    /// What peers are asked about acknowledgements (the ACK frequency
    /// extension): `"PACKETS,MILLISECONDS"` or `"off"`. `--ack-frequency`.
    pub ack_frequency: String,
    /// The HTTP API over HTTP/3 on this port (ALPN `h3`, beside
    /// WebTransport). `--http3 on|off`.
    pub http3: bool,
    /// The transport's limits and connection admission.
    #[serde(flatten)]
    pub limits: QuicConfig,
    /// Keys nothing else took (refused after parsing: `flatten` cannot
    /// refuse them itself).
    #[serde(flatten, skip_serializing_if = "toml::Table::is_empty")]
    unknown: toml::Table,
}

impl Default for QuicSection {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:4443".into(),
            ack_frequency: DEFAULT_ACK_FREQUENCY.into(),
            http3: true,
            // The relay uses every core it may: one endpoint per CPU.
            limits: QuicConfig {
                endpoints: 0,
                ..QuicConfig::default()
            },
            unknown: toml::Table::new(),
        }
    }
}

/// `quic.ack_frequency`'s default: [`AckFrequency::default`].
pub const DEFAULT_ACK_FREQUENCY: &str = "9,100";

impl QuicSection {
    /// The bound address to ask for.
    pub fn bind_addr(&self) -> anyhow::Result<SocketAddr> {
        resolve_addr(&self.bind).map_err(|e| anyhow::anyhow!("quic.bind (--bind): {e}"))
    }

    /// `ack_frequency` parsed (`None`: off).
    pub fn ack(&self) -> anyhow::Result<Option<AckFrequency>> {
        match self.ack_frequency.as_str() {
            "off" => Ok(None),
            v => v.parse::<AckFrequency>().map(Some).context(
                "quic.ack_frequency (--ack-frequency) must be PACKETS,MILLISECONDS or off",
            ),
        }
    }
}

/// `[mqtt]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MqttSection {
    /// TCP address of MQTT 3.1.1/5.0, or `"off"`: the broker off (no MQTT
    /// over TCP, TLS or QUIC, no broker state on disk). `--mqtt`.
    pub tcp: String,
    /// TCP address of MQTT over TLS, or `"off"`. `--mqtt-tls`.
    pub tls: String,
    /// Largest packet accepted from a client (Maximum Packet Size), bytes.
    pub max_packet_size: u32,
    /// QoS 2 publishes a client may have unreleased (Receive Maximum).
    pub receive_maximum: u16,
    /// Topic aliases a client may use (Topic Alias Maximum).
    pub topic_alias_maximum: u16,
    /// Time allowed between a connection and its CONNECT, milliseconds.
    pub connect_timeout_ms: u64,
    /// PUBLISH packets per second per connection, after `publish_burst`
    /// (more wait unread); 0: no limit.
    pub publish_rate: u64,
    /// PUBLISH packets a connection may send at once (0: one second's worth).
    pub publish_burst: u64,
    /// Bytes of PUBLISH packets per second per connection, after
    /// `publish_bytes_burst`; 0: no limit.
    pub publish_bytes_rate: u64,
    /// Bytes of PUBLISH packets a connection may send at once (0: one
    /// second's worth).
    pub publish_bytes_burst: u64,
    /// The broker's limits.
    #[serde(flatten)]
    pub broker: BrokerConfig,
    /// Keys nothing else took (refused after parsing).
    #[serde(flatten, skip_serializing_if = "toml::Table::is_empty")]
    unknown: toml::Table,
}

impl Default for MqttSection {
    fn default() -> Self {
        let c = ConnConfig::default();
        Self {
            tcp: "127.0.0.1:1883".into(),
            tls: "127.0.0.1:8883".into(),
            max_packet_size: c.max_packet_size,
            receive_maximum: c.receive_maximum,
            topic_alias_maximum: c.topic_alias_maximum,
            connect_timeout_ms: duration_ms(c.connect_timeout),
            publish_rate: c.publish_rate,
            publish_burst: c.publish_burst,
            publish_bytes_rate: c.publish_bytes_rate,
            publish_bytes_burst: c.publish_bytes_burst,
            broker: BrokerConfig::default(),
            unknown: toml::Table::new(),
        }
    }
}

impl MqttSection {
    /// The per-connection limits.
    pub fn conn_config(&self) -> ConnConfig {
        ConnConfig {
            max_packet_size: self.max_packet_size,
            receive_maximum: self.receive_maximum,
            topic_alias_maximum: self.topic_alias_maximum,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            publish_rate: self.publish_rate,
            publish_burst: self.publish_burst,
            publish_bytes_rate: self.publish_bytes_rate,
            publish_bytes_burst: self.publish_bytes_burst,
        }
    }

    /// Sets the per-connection limits from `c`.
    pub fn set_conn_config(&mut self, c: &ConnConfig) {
        self.max_packet_size = c.max_packet_size;
        self.receive_maximum = c.receive_maximum;
        self.topic_alias_maximum = c.topic_alias_maximum;
        self.connect_timeout_ms = duration_ms(c.connect_timeout);
        self.publish_rate = c.publish_rate;
        self.publish_burst = c.publish_burst;
        self.publish_bytes_rate = c.publish_bytes_rate;
        self.publish_bytes_burst = c.publish_bytes_burst;
    }
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSection {
    /// TCP address of the HTTP API (HTTP/1.1, cleartext HTTP/2) and the web
    /// pages, or `"off"`. `--http`.
    pub address: String,
    /// TCP address of the same over TLS with the relay's certificate
    /// (HTTPS, `wss://` for MoQT over WebSocket), or `"off"` (the
    /// default). `--https`.
    pub tls: String,
    /// Largest request body (a published message), bytes: beyond it 413.
    pub max_body: usize,
    /// Topics in the registry: beyond it `PUT` answers 507.
    pub max_topics: usize,
    /// Concurrent `GET` streams: beyond it 503.
    pub max_subscribers: usize,
    /// Largest `X-History-Length`: beyond it 400.
    pub max_history: usize,
    /// Deliveries queued for one stream not yet read by its client; beyond
    /// it messages for that stream are dropped (and counted).
    pub queue: usize,
    /// A comment line on an idle stream this often, milliseconds.
    pub keepalive_ms: u64,
    /// Longest wait for the broker's durable store before a `POST` of a
    /// persisted message answers, milliseconds.
    pub durable_timeout_ms: u64,
    /// Publishes (`POST`) per second per client address, after
    /// `publish_burst` (more get 429); 0: no limit.
    pub publish_rate: u64,
    /// Publishes one address may make at once (0: one second's worth).
    pub publish_burst: u64,
    /// MoQT over WebSocket (QMux, subprotocol `qmux-01.moqt-18`) on this
    /// port: an upgrade on any path is a relay session, for browsers
    /// without WebTransport and networks that block UDP.
    pub websocket: bool,
    /// Origins (`scheme://host[:port]`) whose web pages may make
    /// state-changing requests and WebSocket upgrades here, besides the
    /// relay's own (the pages it serves itself); `"*"`: any page of any
    /// site (dangerous on an open relay).
    pub allowed_origins: Vec<String>,
    /// Host names a loopback listener answers for besides loopback
    /// addresses and `localhost` (DNS rebinding); `"*"`: any.
    pub allowed_hosts: Vec<String>,
}

impl Default for HttpSection {
    fn default() -> Self {
        let mut s = Self {
            address: "127.0.0.1:8080".into(),
            tls: "off".into(),
            max_body: 0,
            max_topics: 0,
            max_subscribers: 0,
            max_history: 0,
            queue: 0,
            keepalive_ms: 0,
            durable_timeout_ms: 0,
            publish_rate: 0,
            publish_burst: 0,
            websocket: true,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
        };
        s.set_api_config(&quichub_gateway::http::ApiConfig::default());
        s
    }
}

impl HttpSection {
    /// The API's limits and allowed origins and hosts; an entry of
    /// `allowed_origins` or `allowed_hosts` that is not one is an error.
    pub fn api_config(&self) -> anyhow::Result<quichub_gateway::http::ApiConfig> {
        use quichub_gateway::http::origin::{normalize_host, normalize_origin};
        let allowed_origins = self
            .allowed_origins
            .iter()
            .map(|o| {
                normalize_origin(o).with_context(|| {
                    format!("http.allowed_origins: {o:?} is not an origin: scheme://host[:port] (no path), or \"*\"")
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let allowed_hosts = self
            .allowed_hosts
            .iter()
            .map(|h| {
                normalize_host(h).with_context(|| {
                    format!("http.allowed_hosts: {h:?} is not a host name or IP address (no port), or \"*\"")
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(quichub_gateway::http::ApiConfig {
            max_body: self.max_body,
            max_topics: self.max_topics,
            max_subscribers: self.max_subscribers,
            max_history: self.max_history,
            queue: self.queue,
            keepalive: Duration::from_millis(self.keepalive_ms),
            durable_timeout: Duration::from_millis(self.durable_timeout_ms),
            publish_rate: self.publish_rate,
            publish_burst: self.publish_burst,
            allowed_origins,
            allowed_hosts,
        })
    }

    /// Sets the API's limits, allowed origins and hosts from `c`.
    pub fn set_api_config(&mut self, c: &quichub_gateway::http::ApiConfig) {
        self.max_body = c.max_body;
        self.max_topics = c.max_topics;
        self.max_subscribers = c.max_subscribers;
        self.max_history = c.max_history;
        self.queue = c.queue;
        self.keepalive_ms = duration_ms(c.keepalive);
        self.durable_timeout_ms = duration_ms(c.durable_timeout);
        self.publish_rate = c.publish_rate;
        self.publish_burst = c.publish_burst;
        self.allowed_origins = c.allowed_origins.clone();
        self.allowed_hosts = c.allowed_hosts.clone();
    }
}

/// `[tls]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// PEM certificate chain (with `key`; re-read on reload). Unset: a
    /// self-signed certificate, kept in `store.data_dir`. `--cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM private key. `--key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// PEM certificates of the CAs that sign client certificates (MQTT over
    /// TLS and over QUIC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// Refuse clients without a certificate signed by `client_ca` on every
    /// listener that can carry one: the QUIC port (MQTT over QUIC, MoQT,
    /// WebTransport, HTTP/3), MQTT over TLS and HTTPS. Plain MQTT/TCP and
    /// HTTP cannot, and stay on loopback unless `[auth]` protects them.
    pub require_certificate: bool,
    /// The client certificate's Common Name is the MQTT user name.
    pub use_identity_as_username: bool,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// TCP address of `/metrics`, `/healthz` and `/readyz`, or `"off"`.
    /// `--metrics`.
    pub address: String,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:9090".into(),
        }
    }
}

/// `[store]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// Directory of the broker's durable state and of the self-signed
    /// certificate (`tls/`), or `"off"` (both in memory only). Unset:
    /// `$XDG_STATE_HOME/quichub`, else `~/.local/state/quichub`. `--data-dir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
    /// When the broker's log reaches the disk before a QoS 1/2 publish is
    /// acknowledged. `--fsync`.
    pub fsync: FsyncPolicy,
    /// What to do with a corrupt broker log. `--store-recovery`.
    pub recovery: RecoveryPolicy,
}

impl StoreSection {
    /// The data directory in effect (`None`: off).
    pub fn dir(&self) -> Option<PathBuf> {
        match self.data_dir.as_deref() {
            Some("off") => None,
            Some(d) => Some(PathBuf::from(d)),
            None => default_data_dir(),
        }
    }
}

/// `store.fsync`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncPolicy {
    /// fdatasync, group commit: survives power loss.
    #[default]
    Always,
    /// Written to the OS: survives a crash of the process.
    Never,
}

impl From<FsyncPolicy> for quichub_gateway::store::Fsync {
    fn from(p: FsyncPolicy) -> Self {
        match p {
            FsyncPolicy::Always => Self::Always,
            FsyncPolicy::Never => Self::Never,
        }
    }
}

/// `store.recovery`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryPolicy {
    /// Refuse to start.
    Strict,
    /// Skip the damaged bytes (logged), keep the file aside, start.
    #[default]
    Salvage,
}

impl From<RecoveryPolicy> for quichub_gateway::store::Recovery {
    fn from(p: RecoveryPolicy) -> Self {
        match p {
            RecoveryPolicy::Strict => Self::Strict,
            RecoveryPolicy::Salvage => Self::Salvage,
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

fn default_data_dir() -> Option<PathBuf> {
    data_dir_from(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"))
}

/// An empty or relative `XDG_STATE_HOME` is ignored, as the XDG spec says:
/// it would put broker state in whatever directory the relay started in.
fn data_dir_from(
    xdg_state_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    xdg_state_home
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .or_else(|| home.map(|h| PathBuf::from(h).join(".local/state")))
        .map(|d| d.join("quichub"))
}

/// Parses `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT`; a host name resolves to
/// its first IPv4 address, else its first (the one `quichub pub`/`sub` dial).
pub fn resolve_addr(v: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = v.parse() {
        return Ok(a);
    }
    let resolved = v.to_socket_addrs().map_err(|e| {
        if v.rsplit_once(':')
            .is_none_or(|(_, p)| p.parse::<u16>().is_err())
        {
            format!("{v:?} is not HOST:PORT (e.g. 127.0.0.1:4443, [::1]:4443, localhost:4443)")
        } else {
            format!("cannot resolve {v:?}: {e}")
        }
    })?;
    let addrs: Vec<SocketAddr> = resolved.collect();
    // IPv4 first, as quichub's clients (on an IPv4 socket) dial a name.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{v:?} resolves to no address"))
}

/// A listener address key: `HOST:PORT`, or `None` for `"off"`.
pub fn listen_addr(key: &str, v: &str) -> anyhow::Result<Option<SocketAddr>> {
    if v == "off" {
        return Ok(None);
    }
    resolve_addr(v)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("{key} must be HOST:PORT or off: {e}"))
}

impl Config {
    /// Parses a file's text; errors name `name:LINE:COLUMN`.
    pub fn parse(text: &str, name: &str) -> anyhow::Result<Self> {
        parse(text).map_err(|e| anyhow::anyhow!("{}", e.display(name, text)))
    }

    /// Reads and parses `path`, and remembers it as [`Config::source`].
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let mut c = Self::parse(&text, &path.display().to_string())?;
        c.source = Some(path.to_path_buf());
        Ok(c)
    }

    /// The configuration as TOML (every key; what `quichub config print`
    /// shows).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the configuration serialises to TOML")
    }

    /// Checks what parsing cannot: addresses, combinations of keys, and that
    /// the certificate files load. [`crate::Hub::start`] runs it first.
    pub fn validate(&self) -> anyhow::Result<()> {
        for o in &self.cluster.origins {
            o.resolve()?;
        }
        let c = &self.cluster;
        if !c.registry.is_empty() {
            let etcd = c.registry.starts_with("etcd://") || c.registry.starts_with("etcds://");
            anyhow::ensure!(
                etcd || c.registry.starts_with("file:"),
                "cluster.registry {}: etcd://host:port[/prefix], etcds://… or file:PATH",
                quichub_relay::origin::redact(&c.registry)
            );
            if etcd {
                c.etcd_options()?;
            } else {
                let etcd_keys = c.etcd_ca.is_some()
                    || c.etcd_cert.is_some()
                    || c.etcd_key.is_some()
                    || !c.etcd_user.is_empty()
                    || c.etcd_password_file.is_some();
                anyhow::ensure!(
                    !etcd_keys,
                    "cluster.etcd_*: for an etcd:// or etcds:// registry only"
                );
            }
            if !c.node_url.is_empty() {
                c.node_url("127.0.0.1:1".parse().expect("address"))?;
            }
            if let Some(ca) = &c.ca {
                quichub_net::tls::Verify::ca_file(ca).context("cluster.ca")?;
            }
        }
        let uri = &self.relay.goaway_uri;
        if !uri.is_empty() {
            let ok = uri.len() <= 8192
                && url::Url::parse(uri)
                    .is_ok_and(|u| matches!(u.scheme(), "moqt" | "https") && u.host().is_some());
            anyhow::ensure!(
                ok,
                "relay.goaway_uri {uri:?}: a moqt:// or https:// URL of another relay (at most 8192 bytes)"
            );
        }
        self.quic.bind_addr()?;
        self.quic.ack()?;
        self.quic
            .limits
            .validate()
            .map_err(|e| anyhow::anyhow!("[quic]: {e}"))?;
        listen_addr("mqtt.tcp (--mqtt)", &self.mqtt.tcp)?;
        listen_addr("mqtt.tls (--mqtt-tls)", &self.mqtt.tls)?;
        listen_addr("http.address (--http)", &self.http.address)?;
        listen_addr("metrics.address (--metrics)", &self.metrics.address)?;
        let t = &self.tls;
        match (&t.cert, &t.key) {
            (Some(c), Some(k)) => {
                quichub_net::tls::Identity::from_pem_files(c, k)
                    .with_context(|| format!("tls.cert {} / tls.key {}", c.display(), k.display()))?
                    .rotating()
                    .context("tls.cert and tls.key")?;
            }
            (None, None) => {}
            _ => anyhow::bail!("tls.cert and tls.key go together: set both or neither"),
        }
        if t.require_certificate && t.client_ca.is_none() {
            anyhow::bail!("tls.require_certificate needs tls.client_ca (the CAs that sign client certificates)");
        }
        if t.use_identity_as_username && !t.require_certificate {
            anyhow::bail!("tls.use_identity_as_username needs tls.require_certificate = true");
        }
        if let Some(ca) = &t.client_ca {
            std::fs::metadata(ca).with_context(|| format!("tls.client_ca {}", ca.display()))?;
        }
        self.check_exposure()
    }

    /// mosquitto 2's safe default: with no authentication configured,
    /// clients are served only on loopback addresses. A client listener on
    /// any other address needs `[auth]` (keys, password or ACL file, public
    /// prefixes), or an explicit `auth.allow_anonymous = true` (the open
    /// mode: no authentication at all). `tls.require_certificate` counts
    /// only for listeners that carry a client certificate (the QUIC port:
    /// MQTT over QUIC, MoQT, WebTransport, HTTP/3; MQTT over TLS; HTTPS):
    /// plain MQTT/TCP and plain HTTP (API, WebSocket MoQT) cannot, so they
    /// stay on loopback unless `[auth]` protects them.
    pub(crate) fn check_exposure(&self) -> anyhow::Result<()> {
        let a = &self.auth;
        let authenticated = a.configured() || !a.public.is_empty() || !a.public_read.is_empty();
        if authenticated || a.allow_anonymous == Some(true) {
            return Ok(());
        }
        // (key, address, whether a client certificate can be asked for)
        let listeners = [
            ("quic.bind (--bind)", Some(self.quic.bind_addr()?), true),
            (
                "mqtt.tcp (--mqtt)",
                listen_addr("mqtt.tcp", &self.mqtt.tcp)?,
                false,
            ),
            (
                "mqtt.tls (--mqtt-tls)",
                listen_addr("mqtt.tls", &self.mqtt.tls)?,
                true,
            ),
            (
                "http.address (--http)",
                listen_addr("http.address", &self.http.address)?,
                false,
            ),
            (
                "http.tls (--https)",
                listen_addr("http.tls", &self.http.tls)?,
                true,
            ),
        ];
        for (key, addr, carries_certificate) in listeners {
            let Some(addr) = addr.filter(|a| !a.ip().is_loopback()) else {
                continue;
            };
            if carries_certificate && self.tls.require_certificate {
                continue;
            }
            if self.tls.require_certificate {
                anyhow::bail!(
                    "{key} = {addr} is not a loopback address and is plain TCP, which cannot \
                     carry the client certificate tls.require_certificate asks for, and no \
                     [auth] is configured, so anyone who reaches it could publish and \
                     subscribe to everything. Put it on loopback or off, or configure [auth] \
                     (docs/auth.md)"
                );
            }
            anyhow::bail!(
                "{key} = {addr} is not a loopback address and no authentication is \
                 configured, so anyone who reaches it could publish and subscribe to \
                 everything. Configure [auth] (key, key_dir or jwks for JWTs; \
                 password_file and acl_file as mosquitto's; public prefixes; or the \
                 flags --auth-key, --password-file, --acl-file, --public), require client \
                 certificates on TLS listeners (tls.require_certificate), or set \
                 auth.allow_anonymous = true (--allow-anonymous) to serve everything to \
                 anyone on the network deliberately (docs/auth.md)"
            );
        }
        Ok(())
    }
}

/// A parse error and where it is (a byte range of the text).
struct ParseError {
    span: Option<std::ops::Range<usize>>,
    message: String,
}

impl ParseError {
    fn display(&self, name: &str, text: &str) -> String {
        match &self.span {
            Some(s) => {
                let (line, col) = line_col(text, s.start);
                format!("{name}:{line}:{col}: {}", self.message)
            }
            None => format!("{name}: {}", self.message),
        }
    }
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// toml's error text without its own "TOML parse error at ..." heading and
/// snippet (we print `file:line:col` instead).
fn toml_message(e: &toml::de::Error) -> String {
    e.message().trim().to_string()
}

fn parse(text: &str) -> Result<Config, ParseError> {
    let doc: toml_edit::ImDocument<&str> =
        toml_edit::ImDocument::parse(text).map_err(|e| ParseError {
            span: e.span(),
            message: e.message().trim().to_string(),
        })?;
    // The relay's limits were top-level keys before sections existed: say
    // where they go now rather than only "unknown key".
    let relay_keys = toml::Table::try_from(quichub_relay::Config::default()).unwrap_or_default();
    for (k, item) in doc.as_table().iter() {
        if !item.is_table_like() && relay_keys.contains_key(k) {
            return Err(ParseError {
                span: doc.as_table().key(k).and_then(|k| k.span()),
                message: format!(
                    "`{k}` is a relay key: move it under [relay] (top-level relay keys are no longer read)"
                ),
            });
        }
    }
    let mut config: Config = match toml::from_str(text) {
        Ok(c) => c,
        Err(e) => {
            // An error inside a flattened section points at the section (or
            // the whole file): find the key that fails alone.
            let vague = e.span().is_none_or(|s| {
                s.start == 0 || text.get(s.start..).is_some_and(|t| t.starts_with('['))
            });
            let found = vague.then(|| locate(&doc, text)).flatten();
            return Err(found.unwrap_or(ParseError {
                span: e.span(),
                message: toml_message(&e),
            }));
        }
    };
    // `[quic]`'s transport keys are flattened from QuicConfig, which serde
    // fills from the library's defaults (one endpoint) whenever the section
    // is present: the relay's default is one endpoint per CPU.
    let endpoints_given = doc
        .get("quic")
        .and_then(|s| s.as_table_like())
        .is_some_and(|t| t.contains_key("endpoints"));
    if !endpoints_given {
        config.quic.limits.endpoints = QuicSection::default().limits.endpoints;
    }
    for (section, unknown) in [
        ("quic", &config.quic.unknown),
        ("mqtt", &config.mqtt.unknown),
    ] {
        if let Some(k) = unknown.keys().next() {
            let span = doc
                .get(section)
                .and_then(|s| s.as_table_like())
                .and_then(|t| t.get_key_value(k))
                .and_then(|(k, _)| k.span());
            return Err(ParseError {
                span,
                message: format!("unknown key `{k}` in [{section}]"),
            });
        }
    }
    Ok(config)
}

/// The first `[section] key` that fails to parse on its own.
fn locate(doc: &toml_edit::ImDocument<&str>, text: &str) -> Option<ParseError> {
    let table: toml::Table = toml::from_str(text).unwrap_or_default();
    for (section, v) in &table {
        let Some(t) = v.as_table() else { continue };
        for (k, v) in t {
            let one = toml::Table::from_iter([(
                section.clone(),
                toml::Value::Table(toml::Table::from_iter([(k.clone(), v.clone())])),
            )]);
            if let Err(e) = toml::Value::Table(one).try_into::<Config>() {
                let span = doc
                    .get(section)
                    .and_then(|s| s.as_table_like())
                    .and_then(|t| t.get_key_value(k))
                    .and_then(|(_, v)| v.span());
                return Some(ParseError {
                    span,
                    message: format!("{section}.{k}: {}", toml_message(&e)),
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text, "t.toml").unwrap_err().to_string()
    }

    #[test]
    fn sections() {
        let c = Config::parse(
            "[relay]\nmax_sessions = 7\n[quic]\nmax_handshakes = 3\nbind = \"127.0.0.1:0\"\n\
             [mqtt]\nmax_queued = 5\nreceive_maximum = 9\ntcp = \"off\"\n[http]\nmax_body = 10\n\
             [tcp]\nmax_connections_per_ip = 3\n[store]\nfsync = \"never\"\ndata_dir = \"off\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.relay.max_sessions, 7);
        assert_eq!(c.quic.limits.max_handshakes, 3);
        assert_eq!(c.quic.bind, "127.0.0.1:0");
        assert_eq!(c.mqtt.broker.max_queued, 5);
        assert_eq!(c.mqtt.conn_config().receive_maximum, 9);
        assert_eq!(c.mqtt.tcp, "off");
        assert_eq!(c.http.api_config().unwrap().max_body, 10);
        assert_eq!(c.tcp.max_connections_per_ip, 3);
        assert_eq!(c.store.fsync, FsyncPolicy::Never);
        assert_eq!(c.store.dir(), None);
        assert_eq!(Config::parse("", "t").unwrap(), Config::default());
    }

    #[test]
    fn http_allowed_origins_and_hosts_are_checked_and_normalized() {
        let text = "[http]\nallowed_origins = [\"https://App.Example:443/\", \"*\"]\n\
                    allowed_hosts = [\"Relay.LAN.\", \"::1\"]\n";
        let c = Config::parse(text, "t").unwrap().http.api_config().unwrap();
        assert_eq!(c.allowed_origins, ["https://app.example", "*"]);
        assert_eq!(c.allowed_hosts, ["relay.lan", "[::1]"]);
        for (key, bad) in [
            ("allowed_origins", "https://app.example/path"),
            ("allowed_origins", "app.example"),
            ("allowed_origins", "null"),
            ("allowed_hosts", "relay.lan:8080"),
            ("allowed_hosts", "http://relay.lan"),
        ] {
            let text = format!("[http]\n{key} = [{bad:?}]\n");
            let e = Config::parse(&text, "t").unwrap().http.api_config();
            let e = e.unwrap_err().to_string();
            assert!(e.contains(&format!("http.{key}")) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn network_listeners_need_auth_or_an_explicit_allow_anonymous() {
        let exposed = |extra: &str| {
            let text = format!("[quic]\nbind = \"0.0.0.0:4443\"\n{extra}");
            Config::parse(&text, "t").unwrap().check_exposure()
        };
        let e = exposed("").unwrap_err().to_string();
        assert!(
            e.contains("quic.bind") && e.contains("allow_anonymous"),
            "{e}"
        );
        let e = Config::parse("[mqtt]\ntcp = \"0.0.0.0:1883\"\n", "t")
            .unwrap()
            .check_exposure()
            .unwrap_err()
            .to_string();
        assert!(e.contains("mqtt.tcp"), "{e}");
        // The HTTPS listener carries the API and MoQT over wss:// too.
        let e = Config::parse("[http]\ntls = \"0.0.0.0:8443\"\n", "t")
            .unwrap()
            .check_exposure()
            .unwrap_err()
            .to_string();
        assert!(e.contains("http.tls"), "{e}");
        exposed("[auth]\nallow_anonymous = true\n").unwrap();
        exposed("[auth]\npassword_file = \"/etc/quichub/passwd\"\n").unwrap();
        exposed("[auth]\npublic = [\"anon\"]\n").unwrap();
        // Loopback everywhere (the defaults): nothing to configure.
        Config::default().check_exposure().unwrap();
        Config::parse("[quic]\nbind = \"[::1]:4443\"\n", "t")
            .unwrap()
            .check_exposure()
            .unwrap();
    }

    /// tls.require_certificate protects the listeners that carry a client
    /// certificate; plain TCP ones exposed with it alone are refused.
    #[test]
    fn required_certificates_cover_only_tls_listeners() {
        let check = |listeners: &str| {
            let text = format!(
                "{listeners}[tls]\nclient_ca = \"/etc/ca.pem\"\nrequire_certificate = true\n"
            );
            Config::parse(&text, "t").unwrap().check_exposure()
        };
        check("[quic]\nbind = \"0.0.0.0:4443\"\n").unwrap();
        check("[mqtt]\ntls = \"0.0.0.0:8883\"\n").unwrap();
        check("[http]\ntls = \"0.0.0.0:8443\"\n").unwrap();
        for (listeners, key) in [
            ("[mqtt]\ntcp = \"0.0.0.0:1883\"\n", "mqtt.tcp"),
            ("[http]\naddress = \"0.0.0.0:8080\"\n", "http.address"),
        ] {
            let e = check(listeners).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("plain TCP"), "{e}");
        }
        // With [auth] the plain listeners are protected by it.
        let text = "[mqtt]\ntcp = \"0.0.0.0:1883\"\n[auth]\npassword_file = \"/p\"\n";
        Config::parse(text, "t").unwrap().check_exposure().unwrap();
    }

    #[test]
    fn unknown_keys_are_refused_with_their_line() {
        assert_eq!(
            err("[relay]\nmax_sessions = 1\n\n[quic]\nbogus = 1\n"),
            "t.toml:5:1: unknown key `bogus` in [quic]"
        );
        assert_eq!(
            err("[mqtt]\n  nope = 1\n"),
            "t.toml:2:3: unknown key `nope` in [mqtt]"
        );
        let e = err("[relay]\nmax_sesions = 1\n");
        assert!(
            e.starts_with("t.toml:2:1: unknown field `max_sesions`"),
            "{e}"
        );
        let e = err("[http]\nmax_bdy = 1\n");
        assert!(e.starts_with("t.toml:2:1: unknown field `max_bdy`"), "{e}");
        let e = err("[tcp]\nmax_conections = 1\n");
        assert!(e.starts_with("t.toml:2:1:"), "{e}");
        let e = err("x = 1\n[no_such_section]\nx = 1\n");
        assert!(e.starts_with("t.toml:"), "{e}");
        assert!(e.contains("unknown field"), "{e}");
        let e = err("[auth]\nallow_anonymus = true\n");
        assert!(e.starts_with("t.toml:2:1:"), "{e}");
    }

    #[test]
    fn type_errors_have_a_line_even_in_flattened_sections() {
        let e = err("[quic]\nbind = \"127.0.0.1:1\"\nmax_handshakes = \"many\"\n");
        assert!(
            e.starts_with("t.toml:3:18: quic.max_handshakes: invalid type"),
            "{e}"
        );
        let e = err("[mqtt]\nmax_queued = -1\n");
        assert!(e.starts_with("t.toml:2:14:"), "{e}");
        let e = err("[relay]\nmax_sessions = \"x\"\n");
        assert!(e.starts_with("t.toml:2:16:"), "{e}");
        let e = err("[store]\nfsync = \"sometimes\"\n");
        assert!(e.starts_with("t.toml:2:9:"), "{e}");
        let e = err("[quic\n");
        assert!(e.starts_with("t.toml:1:"), "{e}");
        let e = err("[quic]\ncongestion_control = \"fast\"\n");
        assert!(e.starts_with("t.toml:2:22:"), "{e}");
    }

    /// The per-client rate limits of each protocol reach what enforces them.
    #[test]
    fn rate_limits_reach_their_listeners() {
        let c = Config::parse(
            "[relay]\nmax_requests_per_second = 7\nrequest_burst = 9\n\
             [mqtt]\npublish_rate = 5\npublish_burst = 6\npublish_bytes_rate = 1000\npublish_bytes_burst = 2000\n\
             [http]\npublish_rate = 3\npublish_burst = 4\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            (c.relay.max_requests_per_second, c.relay.request_burst),
            (7, 9)
        );
        let m = c.mqtt.conn_config();
        assert_eq!(
            (
                m.publish_rate,
                m.publish_burst,
                m.publish_bytes_rate,
                m.publish_bytes_burst
            ),
            (5, 6, 1000, 2000)
        );
        let h = c.http.api_config().unwrap();
        assert_eq!((h.publish_rate, h.publish_burst), (3, 4));
        let d = Config::default();
        assert_eq!(d.mqtt.conn_config().publish_rate, 0);
        assert_eq!(d.http.api_config().unwrap().publish_rate, 1000);
        assert_eq!(d.relay.max_requests_per_second, 1000);
    }

    #[test]
    fn congestion_control_reaches_the_transport() {
        let c = Config::parse("[quic]\ncongestion_control = \"bbr\"\n", "t").unwrap();
        assert_eq!(
            c.quic.limits.congestion_control,
            quichub_net::CongestionControl::Bbr
        );
        assert_eq!(
            Config::default().quic.limits.congestion_control,
            quichub_net::CongestionControl::Cubic
        );
    }

    #[test]
    fn old_top_level_relay_keys_say_where_they_go() {
        assert_eq!(
            err("# limits\nmax_sessions = 7\n"),
            "t.toml:2:1: `max_sessions` is a relay key: move it under [relay] (top-level relay keys are no longer read)"
        );
    }

    #[test]
    fn prints_and_reads_back() {
        let mut c = Config::default();
        c.relay.max_sessions = 3;
        c.mqtt.tcp = "off".into();
        c.tls.cert = Some("/c.pem".into());
        c.tls.key = Some("/k.pem".into());
        c.store.data_dir = Some("/var/lib/q".into());
        let text = c.to_toml();
        assert_eq!(Config::parse(&text, "t").unwrap(), c, "{text}");
    }

    #[test]
    fn validation() {
        let mut c = Config::default();
        c.validate().unwrap();
        c.quic.ack_frequency = "fast".into();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("ack_frequency"));
        let mut c = Config::default();
        c.http.address = "nowhere".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("http.address"), "{e}");
        let mut c = Config::default();
        c.tls.cert = Some("/nonexistent.pem".into());
        assert!(c.validate().is_err());
        let mut c = Config::default();
        c.tls.require_certificate = true;
        assert!(c.validate().unwrap_err().to_string().contains("client_ca"));
        let mut c = Config::default();
        c.tls.use_identity_as_username = true;
        assert!(c.validate().is_err());
    }

    #[test]
    fn addresses_accept_host_names() {
        assert_eq!(
            resolve_addr("127.0.0.1:4443").unwrap(),
            "127.0.0.1:4443".parse().unwrap()
        );
        assert_eq!(resolve_addr("[::1]:0").unwrap(), "[::1]:0".parse().unwrap());
        let a = resolve_addr("localhost:4443").unwrap();
        assert!(a.ip().is_loopback(), "{a}");
        assert_eq!(a.port(), 4443);
        for bad in ["localhost", "4443", "127.0.0.1", "localhost:http-ish", ""] {
            let e = resolve_addr(bad).unwrap_err();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
        assert_eq!(listen_addr("http", "off").unwrap(), None);
        let a = listen_addr("http", "localhost:0").unwrap().unwrap();
        assert!(a.ip().is_loopback());
        let e = listen_addr("metrics.address", "nowhere")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.address"), "{e}");
    }

    #[test]
    fn empty_or_relative_xdg_state_home_is_ignored() {
        let home = Some("/home/u".into());
        let want = Some(PathBuf::from("/home/u/.local/state/quichub"));
        assert_eq!(data_dir_from(Some("".into()), home.clone()), want);
        assert_eq!(data_dir_from(Some("state".into()), home.clone()), want);
        assert_eq!(data_dir_from(None, home.clone()), want);
        assert_eq!(
            data_dir_from(Some("/var/state".into()), home),
            Some(PathBuf::from("/var/state/quichub"))
        );
        assert_eq!(data_dir_from(Some("".into()), None), None);
    }

    #[test]
    fn default_ack_frequency_is_the_library_default() {
        assert_eq!(
            DEFAULT_ACK_FREQUENCY.parse::<AckFrequency>().unwrap(),
            AckFrequency::default()
        );
    }

    /// The sample shipped for packagers and admins.
    const SAMPLE: &str = include_str!("../../../contrib/relay.toml");

    #[test]
    fn sample_config_is_the_defaults() {
        let sample = Config::parse(SAMPLE, "contrib/relay.toml").unwrap();
        assert_eq!(
            sample,
            Config::default(),
            "contrib/relay.toml must show every key at its default"
        );
    }

    /// Every key (the defaults serialised, sections included) is in the
    /// sample, and nothing else.
    #[test]
    fn sample_config_names_every_key() {
        fn keys(prefix: &str, t: &toml::Table, out: &mut Vec<String>) {
            for (k, v) in t {
                match v {
                    toml::Value::Table(section) => keys(&format!("{prefix}{k}."), section, out),
                    _ => out.push(format!("{prefix}{k}")),
                }
            }
        }
        let (mut want, mut have) = (Vec::new(), Vec::new());
        keys(
            "",
            &toml::Table::try_from(Config::default()).unwrap(),
            &mut want,
        );
        keys("", &SAMPLE.parse().unwrap(), &mut have);
        let missing: Vec<_> = want.iter().filter(|k| !have.contains(k)).collect();
        let extra: Vec<_> = have.iter().filter(|k| !want.contains(k)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "contrib/relay.toml: missing {missing:?}, unknown {extra:?}"
        );
        assert!(want.len() > 50, "{want:?}");
        assert!(want.contains(&"quic.max_handshakes".to_string()));
    }

    /// etcd's TLS and user: keys that go together, the password read from
    /// its file (never shown), TLS implied by a CA or a client certificate.
    #[test]
    fn etcd_security_keys() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\nignored\n").unwrap();
        let parse = |extra: &str| {
            let text = format!(
                "[cluster]\nregistry = \"etcd://10.0.0.9:2379/q\"\nnode_url = \"moqt://10.0.0.1:4443/\"\n{extra}"
            );
            Config::parse(&text, "t").unwrap()
        };
        let c = parse(&format!(
            "etcd_user = \"relay\"\netcd_password_file = {:?}\netcd_ca = \"/etc/ca.pem\"\n",
            pw.display().to_string()
        ));
        c.validate().unwrap();
        let o = c.cluster.etcd_options().unwrap();
        assert_eq!(o.endpoints, ["https://10.0.0.9:2379"]);
        let user = o.user.as_ref().unwrap();
        assert_eq!(
            (user.name.as_str(), user.password.as_str()),
            ("relay", "s3cret")
        );
        assert!(!format!("{o:?}{c:?}").contains("s3cret"));
        // The password file alone, or the user alone, is a mistake.
        let e = parse("etcd_user = \"relay\"\n").validate().unwrap_err();
        assert!(format!("{e:#}").contains("etcd_password_file"), "{e:#}");
        let e = parse("etcd_cert = \"/c.pem\"\n").validate().unwrap_err();
        assert!(format!("{e:#}").contains("etcd_key"), "{e:#}");
        std::fs::write(&pw, "\n").unwrap();
        let e = parse(&format!(
            "etcd_user = \"relay\"\netcd_password_file = {:?}\n",
            pw.display().to_string()
        ))
        .validate()
        .unwrap_err();
        assert!(format!("{e:#}").contains("empty"), "{e:#}");
        // etcds:// alone is TLS against the system's CAs.
        let mut c = parse("");
        c.cluster.registry = "etcds://10.0.0.9:2379".into();
        let o = c.cluster.etcd_options().unwrap();
        assert_eq!(o.endpoints, ["https://10.0.0.9:2379"]);
        assert!(o.tls.unwrap().ca.is_none());
        // Not with a file registry.
        let mut c = parse("etcd_ca = \"/etc/ca.pem\"\n");
        c.cluster.registry = "file:/etc/cluster.toml".into();
        assert!(c.validate().is_err());
    }

    /// A `[quic]` section without `endpoints` keeps the relay's default (one
    /// per CPU), not the library's (serde fills flattened keys from it).
    #[test]
    fn quic_section_keeps_the_endpoints_default() {
        let c = Config::parse("[quic]\nbind = \"127.0.0.1:1\"\n", "t").unwrap();
        assert_eq!(c.quic.limits.endpoints, 0);
        assert_eq!(Config::default().quic.limits.endpoints, 0);
        let c = Config::parse("[quic]\nendpoints = 3\n", "t").unwrap();
        assert_eq!(c.quic.limits.endpoints, 3);
    }

    /// Every key in the sample, and each optional one, is documented.
    #[test]
    fn every_key_is_documented() {
        let doc = include_str!("../../../docs/configuration.md");
        let table = toml::Table::try_from(Config::default()).unwrap();
        let optional = [
            ("tls", "cert"),
            ("tls", "key"),
            ("tls", "client_ca"),
            ("store", "data_dir"),
            ("auth", "key"),
            ("auth", "key_dir"),
            ("auth", "jwks"),
            ("auth", "password_file"),
            ("auth", "acl_file"),
            ("auth", "allow_anonymous"),
            ("cluster", "etcd_ca"),
            ("cluster", "etcd_cert"),
            ("cluster", "etcd_key"),
            ("cluster", "etcd_password_file"),
        ];
        let mut missing = Vec::new();
        for (section, v) in &table {
            for k in v.as_table().unwrap().keys() {
                if !doc.contains(&format!("`{k}`")) {
                    missing.push(format!("{section}.{k}"));
                }
            }
            if !doc.contains(&format!("[{section}]")) {
                missing.push(format!("[{section}]"));
            }
        }
        for (s, k) in optional {
            if !doc.contains(&format!("`{k}`")) {
                missing.push(format!("{s}.{k}"));
            }
        }
        assert!(
            missing.is_empty(),
            "docs/configuration.md lacks {missing:?}"
        );
    }
}
