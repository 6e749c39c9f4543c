//! [`Hub`]: everything `quichub relay` runs, started from a [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use quichub_auth::{Auth, AuthConfig, SharedAuth};
use quichub_gateway::bridge::Bridge;
use quichub_gateway::http::Api;
use quichub_gateway::Broker;
use quichub_net::server::Server;
use quichub_net::tls::Identity;
use quichub_relay::Relay;

use crate::config::{listen_addr, Config};

/// The self-signed certificate kept in the data directory.
#[derive(Debug, Clone)]
pub struct SelfSignedFile {
    /// Its PEM file (`DATA_DIR/tls/cert.pem`).
    pub path: PathBuf,
    /// Whether it was kept from an earlier run (false: made now).
    pub reused: bool,
    /// When it will be replaced by a new one.
    pub renew_after: time::OffsetDateTime,
}

/// A running hub: the relay, the broker and their listeners. Its tasks run
/// on the Tokio runtime it was started on until [`Hub::shutdown`] drains the
/// sessions, or the runtime ends.
pub struct Hub {
    config: Config,
    addr: SocketAddr,
    fingerprint: Arc<RwLock<String>>,
    identity: Identity,
    self_signed: Option<SelfSignedFile>,
    relay: Arc<Relay>,
    server: Arc<Server>,
    broker: Arc<Broker>,
    bridge: Arc<Bridge>,
    api: Arc<Api>,
    mqtt: Option<SocketAddr>,
    mqtt_tls: Option<SocketAddr>,
    http: Option<SocketAddr>,
    https: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    auth: Arc<RwLock<AuthConfig>>,
    shared_auth: Arc<SharedAuth>,
    reloads: Arc<crate::metrics::Reloads>,
    cluster: Option<Arc<quichub_cluster::member::Membership>>,
    mqtt_link: Option<Arc<quichub_gateway::cluster::Link>>,
}

impl Hub {
    /// Validates `config`, binds every listener it turns on and starts their
    /// tasks on the current Tokio runtime. An error names the key or the
    /// address at fault. One step per configuration section, in the order
    /// their listeners come up (crate::start).
    pub async fn start(config: Config) -> anyhow::Result<Hub> {
        use crate::start;
        config.validate()?;
        let tls = start::tls(&config)?;
        let server = start::quic(&config, &tls)?;
        let addr = server.local_addr()?;
        let auth = SharedAuth::new(Auth::load(&config.auth).context("[auth]")?);
        let relay = start::relay(&config, &auth);
        let mqtt_addr = listen_addr("mqtt.tcp", &config.mqtt.tcp)?;
        let (broker, bridge) = start::broker(&config, mqtt_addr.is_some(), &relay, &auth)?;
        let api = start::api(&config, &relay, &broker, &bridge, &auth, addr, &tls)?;
        let tcp = start::TcpPlan::new(&config, mqtt_addr)?;
        let (mqtt, mqtt_tls) = start::mqtt(&config, &tcp, &broker, &tls).await?;
        start::endpoint(
            &config,
            &relay,
            &server,
            mqtt.is_some().then_some(&broker),
            &api,
            &tls,
            addr,
        );
        let (cluster, mqtt_link) =
            start::cluster(&config, &relay, &broker, &bridge, addr, &tls).await?;
        let (http, https) = start::http(&tcp, &api, &tls).await?;
        let reloads = Arc::new(crate::metrics::Reloads::default());
        let metrics = start::metrics(
            &config,
            start::Metered {
                relay: &relay,
                broker: &broker,
                server: &server,
                auth: &auth,
                cluster: &cluster,
                mqtt_link: &mqtt_link,
                api: &api,
                reloads: &reloads,
            },
        )
        .await?;
        Ok(Hub {
            auth: Arc::new(RwLock::new(config.auth.clone())),
            shared_auth: auth,
            reloads,
            cluster,
            mqtt_link,
            config,
            addr,
            fingerprint: tls.fingerprint,
            identity: tls.identity,
            self_signed: tls.self_signed,
            relay,
            server,
            broker,
            bridge,
            api,
            mqtt,
            mqtt_tls,
            http,
            https,
            metrics,
        })
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The bound UDP address (raw QUIC, WebTransport, HTTP/3, MQTT over QUIC).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// SHA-256 (hex) of the certificate presented now (renewal and
    /// [`Hub::reload`] change it).
    pub fn fingerprint(&self) -> String {
        self.fingerprint
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The self-signed certificate kept in the data directory, if that is
    /// what is presented.
    pub fn self_signed(&self) -> Option<&SelfSignedFile> {
        self.self_signed.as_ref()
    }

    /// The relay core.
    pub fn relay(&self) -> &Arc<Relay> {
        &self.relay
    }

    /// The UDP endpoint.
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }

    /// The MQTT broker (present even with `mqtt.tcp = "off"`: the HTTP API
    /// The broker's link to the other relays of the cluster, if in one.
    pub fn cluster_mqtt(&self) -> Option<&Arc<quichub_gateway::cluster::Link>> {
        self.mqtt_link.as_ref()
    }

    /// uses it).
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// The bridge between the broker and the relay.
    pub fn bridge(&self) -> &Arc<Bridge> {
        &self.bridge
    }

    /// The HTTP API (served on [`Hub::http_addr`] and over HTTP/3).
    pub fn http_api(&self) -> &Arc<Api> {
        &self.api
    }

    /// The bound MQTT TCP address, if on.
    pub fn mqtt_addr(&self) -> Option<SocketAddr> {
        self.mqtt
    }

    /// The bound MQTT-over-TLS address, if on.
    pub fn mqtt_tls_addr(&self) -> Option<SocketAddr> {
        self.mqtt_tls
    }

    /// Whether MQTT over QUIC is served on [`Hub::addr`] (ALPN `mqtt`).
    pub fn mqtt_quic(&self) -> bool {
        self.mqtt.is_some()
    }

    /// The bound HTTP API address, if on.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    /// Where the HTTPS listener (`[http] tls`) is bound, if it runs.
    pub fn https_addr(&self) -> Option<SocketAddr> {
        self.https
    }

    /// Whether the HTTP API is served over HTTP/3 on [`Hub::addr`].
    pub fn http3(&self) -> bool {
        self.config.quic.http3
    }

    /// The bound metrics address, if on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
    }

    /// The `[auth]` section in effect: the started configuration's, then
    /// the configuration file's as of the last [`Hub::reload`].
    pub fn auth_config(&self) -> &Arc<RwLock<AuthConfig>> {
        &self.auth
    }

    /// The authentication and authorisation in force for MoQT, MQTT and
    /// HTTP clients ([`Hub::reload`] replaces what it holds).
    pub fn auth(&self) -> &Arc<SharedAuth> {
        &self.shared_auth
    }

    /// What SIGHUP does: re-reads the certificate and key files
    /// (`tls.cert`, `tls.key`) and presents them from the next handshake on
    /// (QUIC and TLS over TCP alike; sessions already up keep theirs), and
    /// re-reads the `[auth]` section of the configuration file.
    ///
    /// All or nothing: the reloaded configuration must pass every check
    /// startup makes ([`Config::validate`], which includes the exposure
    /// check, on the file as it now is, and the exposure check again for
    /// the listeners actually running with the new `[auth]`), and every
    /// file must load; otherwise nothing changes, the refusal is logged at
    /// ERROR and counted (`quichub_config_reloads_total{result="refused"}`).
    /// A reload must never do what a restart would refuse, such as leaving
    /// an exposed relay open because the file lost its keys.
    pub fn reload(&self) -> anyhow::Result<()> {
        self.reload_with(&|_| {})
    }

    /// [`Hub::reload`], with `flags` applied over the file's configuration
    /// before it is checked and used, so that command-line flags keep
    /// winning over the file after a reload. Without a configuration file
    /// the configuration in effect is re-read (its key, password and ACL
    /// files, and the certificate).
    pub fn reload_with(&self, flags: &dyn Fn(&mut Config)) -> anyhow::Result<()> {
        let result = self.try_reload(flags);
        match &result {
            Ok(()) => self.reloads.applied.fetch_add(1, Relaxed),
            Err(e) => {
                tracing::error!("reload refused, the configuration in effect stays: {e:#}");
                self.reloads.refused.fetch_add(1, Relaxed)
            }
        };
        result
    }

    fn try_reload(&self, flags: &dyn Fn(&mut Config)) -> anyhow::Result<()> {
        let mut next = match &self.config.source {
            Some(path) => Config::load(path)?,
            None => Config {
                auth: self.auth.read().unwrap_or_else(|e| e.into_inner()).clone(),
                ..self.config.clone()
            },
        };
        flags(&mut next);
        next.validate()
            .context("the reloaded configuration fails startup's checks")?;
        // The listeners do not move on reload: the ones running must be as
        // safe with the new [auth] as the file's are.
        Config {
            auth: next.auth.clone(),
            source: None,
            ..self.config.clone()
        }
        .check_exposure()
        .context("the listeners running with the reloaded [auth]")?;
        let auth = Auth::load(&next.auth).context("[auth]")?;
        // Loaded before anything is applied, so a bad certificate file
        // refuses the [auth] change too.
        let certificate = match (&self.config.tls.cert, &self.config.tls.key) {
            (Some(c), Some(k)) => Some(
                Identity::from_pem_files(c, k)
                    .with_context(|| format!("certificate {} / {}", c.display(), k.display()))?,
            ),
            _ => None,
        };
        if let Some(new) = certificate {
            let hash = self.reload_certificate(&new)?;
            tracing::info!(sha256 = %hash, "certificate reloaded");
        }
        self.shared_auth.set(auth);
        *self.auth.write().unwrap_or_else(|e| e.into_inner()) = next.auth;
        tracing::info!("[auth] reloaded");
        Ok(())
    }

    fn reload_certificate(&self, new: &Identity) -> anyhow::Result<String> {
        let rotation = self
            .identity
            .rotation
            .as_ref()
            .context("the certificate was not loaded with a rotation")?;
        rotation.set(new)?;
        let hash = new.fingerprint_hex();
        *self.fingerprint.write().unwrap_or_else(|e| e.into_inner()) = hash.clone();
        Ok(hash)
    }

    /// Stops admitting (`/readyz` answers 503), sends GOAWAY to every
    /// session and waits up to `relay.goaway_timeout_ms` for them to leave.
    pub async fn shutdown(&self) {
        // In a cluster, with no goaway_uri of its own, clients are sent to
        // another member.
        if let (true, Some(c)) = (self.relay.goaway_uri().is_empty(), &self.cluster) {
            if let Some(other) = other_member(c.registry().as_ref()) {
                tracing::info!(to = %quichub_relay::origin::Redacted(&other), "draining: GOAWAY sends clients to another relay of the cluster");
                self.relay.set_goaway_uri(other);
            }
        }
        quichub_relay::endpoint::shutdown(&self.relay, &self.server).await;
        // Once the sessions are gone: the other relays drop this one (and
        // its namespaces) now rather than when its lease expires.
        if let Some(c) = &self.cluster {
            c.leave().await;
        }
    }
}

/// Another live member's URL: the one after this relay in id order
/// (wrapping), so relays draining together spread their clients.
fn other_member(registry: &dyn quichub_cluster::Registry) -> Option<String> {
    let me = registry.me().id;
    let members = registry.members().borrow().clone();
    members
        .range::<String, _>((std::ops::Bound::Excluded(&me), std::ops::Bound::Unbounded))
        .chain(members.range::<String, _>(..&me))
        .map(|(_, n)| n.url.clone())
        .next()
}
