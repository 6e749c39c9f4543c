//! [`Hub`]: everything `quichub relay` runs, started from a [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use quichub_auth::{Auth, AuthConfig, SharedAuth};
use quichub_gateway::bridge::Bridge;
use quichub_gateway::http::Api;
use quichub_gateway::store::Store;
use quichub_gateway::Broker;
use quichub_net::server::Server;
use quichub_net::tls::{ClientCertConfig, Identity, SelfSigned};
use quichub_relay::tokens::TokenAuthorizer;
use quichub_relay::Relay;

use crate::config::{listen_addr, Config};

/// Names in the self-signed certificate.
const NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// How often the broker's timers (keep alive, session expiry, will delay)
/// and the self-signed certificate's renewal are looked at.
const BROKER_TICK: Duration = Duration::from_secs(1);
const RENEWAL_CHECK: Duration = Duration::from_secs(3600);

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
    /// address at fault.
    pub async fn start(config: Config) -> anyhow::Result<Hub> {
        config.validate()?;
        let data_dir = config.store.dir();
        // The certificate of every TLS listener: the configured files, or a
        // self-signed one, kept in the data directory (so pinned hashes and
        // --cafile copies survive restarts) and renewed while running. Both
        // are presented through a rotation, so renewal and reload replace
        // it without dropping connections.
        let mut self_signed = None;
        let identity = match (&config.tls.cert, &config.tls.key, &data_dir) {
            (Some(c), Some(k), _) => Identity::from_pem_files(c, k)?.rotating()?,
            (_, _, Some(dir)) => {
                let tls_dir = dir.join("tls");
                let s = SelfSigned::load_or_make(&tls_dir, NAMES)
                    .with_context(|| format!("self-signed certificate in {}", tls_dir.display()))?;
                let id = s.identity.clone();
                self_signed = Some(s);
                id
            }
            _ => Identity::self_signed(NAMES)?.rotating()?,
        };
        let self_signed_file = self_signed.as_ref().map(|s| SelfSignedFile {
            path: s.cert_path.clone(),
            reused: s.reused,
            renew_after: s.expires() - SelfSigned::RENEW_BEFORE,
        });
        // The hash the pages' `/certificate.sha256` serves: renewal and
        // reload replace it.
        let fingerprint = Arc::new(RwLock::new(identity.fingerprint_hex()));
        if let Some(s) = self_signed {
            tokio::spawn(renew(s, fingerprint.clone()));
        }
        // Client certificates (mosquitto's cafile, require_certificate,
        // use_identity_as_username) for MQTT over TLS and over QUIC.
        let clients = Arc::new(ClientCertConfig {
            cafile: config.tls.client_ca.clone(),
            require_certificate: config.tls.require_certificate,
            use_identity_as_username: config.tls.use_identity_as_username,
        });
        let server = Arc::new(Server::bind_clients(
            config.quic.bind_addr()?,
            &identity,
            config.quic.ack()?,
            &config.quic.limits,
            &clients,
        )?);
        let addr = server.local_addr()?;
        let auth = SharedAuth::new(Auth::load(&config.auth).context("[auth]")?);
        let relay = Relay::with_authorizer(
            config.relay.clone(),
            TokenAuthorizer::for_cluster(
                auth.clone(),
                config.auth.max_token_cache,
                &config.cluster.token,
            ),
        );
        let mqtt_addr = listen_addr("mqtt.tcp", &config.mqtt.tcp)?;
        let broker = match (&mqtt_addr, &data_dir) {
            (Some(_), Some(dir)) => {
                let (store, recovered) =
                    Store::open(dir, config.store.fsync.into(), config.store.recovery.into())
                        .with_context(|| format!("open broker state in {}", dir.display()))?;
                tracing::info!(
                    "broker state {}: {} records, {} sessions, {} retained",
                    store.path().display(),
                    recovered.records,
                    recovered.sessions.len(),
                    recovered.retained.len()
                );
                Broker::with_store(config.mqtt.broker.clone(), store, recovered)
            }
            _ => Broker::new(config.mqtt.broker.clone()),
        };
        broker.set_auth(auth.clone());
        let bridge = Bridge::start(relay.clone(), &broker);
        let api = Api::new(
            broker.clone(),
            Some(bridge.clone()),
            config.http.api_config()?,
        );
        api.set_auth(auth.clone());
        // The dashboard (`/`) and the player (`/watch/{broadcast}`) on the HTTP port.
        api.serve_web(
            quichub_gateway::http::web::Web::new(relay.clone(), addr.port(), fingerprint.clone())
                .with_websocket(config.http.websocket),
        );
        if config.http.websocket {
            api.serve_websocket(quichub_gateway::http::websocket::WebSocketMoqt::new(
                relay.clone(),
                &config.quic.limits,
            ));
        }
        let b = broker.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(BROKER_TICK);
            loop {
                t.tick().await;
                b.tick(std::time::Instant::now());
            }
        });
        let conn_config = Arc::new(config.mqtt.conn_config());
        // TCP listeners share the descriptors: raise the soft limit, then
        // give each client listener an equal share ([tcp]).
        let tcp = &config.tcp;
        let mqtt_tls_addr =
            listen_addr("mqtt.tls", &config.mqtt.tls)?.filter(|_| mqtt_addr.is_some());
        let http_addr = listen_addr("http.address", &config.http.address)?;
        let https_addr = listen_addr("http.tls", &config.http.tls)?;
        let nofile = quichub_net::tcp_limits::raise_nofile_limit();
        let listeners = [
            mqtt_addr.is_some(),
            mqtt_tls_addr.is_some(),
            http_addr.is_some(),
            https_addr.is_some(),
        ]
        .iter()
        .filter(|on| **on)
        .count();
        tracing::info!(
            "tcp: {nofile} descriptors, {} connections per listener, {} per address",
            tcp.listener_cap(nofile, listeners),
            tcp.max_connections_per_ip
        );
        let mqtt = match mqtt_addr {
            Some(a) => Some(
                quichub_gateway::listener::spawn_tcp_with(
                    a,
                    broker.clone(),
                    conn_config.clone(),
                    tcp.limiter("mqtt", listeners),
                )
                .await
                .with_context(|| {
                    format!("bind MQTT {a} (mqtt.tcp, --mqtt: off or another address)")
                })?,
            ),
            None => None,
        };
        let mqtt_tls = match mqtt_tls_addr {
            Some(a) => {
                let tls = quichub_net::tls::tcp_server_config_with_clients(
                    &identity,
                    &[b"mqtt"],
                    &clients,
                )?;
                Some(
                    quichub_gateway::listener::spawn_tls_clients(
                        a,
                        broker.clone(),
                        conn_config.clone(),
                        tls,
                        tcp.limiter("mqtt-tls", listeners),
                        clients.clone(),
                    )
                    .await
                    .with_context(|| {
                        format!(
                            "bind MQTT over TLS {a} (mqtt.tls, --mqtt-tls: off or another address)"
                        )
                    })?,
                )
            }
            None => None,
        };
        // MQTT over QUIC on the relay's UDP port (ALPN `mqtt`) whenever the broker runs.
        let mut alpn_handlers = quichub_relay::endpoint::AlpnHandlers::new();
        if mqtt.is_some() {
            let (b, c, k) = (broker.clone(), conn_config.clone(), clients.clone());
            let handler: quichub_relay::endpoint::AlpnHandler = Arc::new(move |conn| {
                Box::pin(quichub_gateway::quic::serve_quic_clients(
                    conn,
                    b.clone(),
                    c.clone(),
                    k.clone(),
                ))
            });
            alpn_handlers.insert(quichub_net::server::ALPN_MQTT.to_vec(), handler);
        }
        // The HTTP API over HTTP/3 on the same port (ALPN `h3`, beside WebTransport).
        let http3: Option<quichub_relay::endpoint::Http3Handler> = config.quic.http3.then(|| {
            let api = api.clone();
            api.origins().add_listener(true, addr);
            let listener = quichub_gateway::http::origin::Listener::new(true, addr);
            let h: quichub_relay::endpoint::Http3Handler = Arc::new(move |conn| {
                Box::pin(quichub_gateway::http::h3::serve_h3(
                    api.clone(),
                    conn,
                    listener,
                ))
            });
            h
        });
        tokio::spawn(quichub_relay::endpoint::serve_endpoint(
            relay.clone(),
            server.clone(),
            alpn_handlers,
            http3,
        ));
        // Relays this one follows ([cluster] origins): a client endpoint
        // each, checking the origin's certificate as configured.
        for o in &config.cluster.origins {
            let (origin, verify) = o.resolve()?;
            let client = quichub_net::client::Client::new("0.0.0.0:0".parse()?, verify)
                .context("client endpoint for [cluster] origins")?;
            tokio::spawn(quichub_relay::origin::follow(relay.clone(), client, origin));
        }
        // A cluster of relays ([cluster] registry): registered, claiming
        // its publishers' namespaces, following the other members.
        let cluster = join_cluster(&config, &relay, addr, &identity)
            .await?
            .map(Arc::new);
        // A renewed or reloaded certificate is registered again, so the
        // other relays pin the new one (with a cluster CA nothing is pinned).
        if let (Some(c), None) = (&cluster, &config.cluster.ca) {
            let (registry, fp) = (c.registry().clone(), fingerprint.clone());
            let mut shutdown = relay.shutdown_signal();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(FINGERPRINT_CHECK);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = shutdown.wait_for(|s| *s) => return,
                    }
                    let now = fp.read().unwrap_or_else(|e| e.into_inner()).clone();
                    registry.update_fingerprint(now);
                }
            });
        }
        // MQTT across the cluster: this relay's messages on its cluster
        // track, the other members' into the broker.
        let mqtt_link = match &cluster {
            Some(c) => Some(link_mqtt(&relay, &broker, &bridge, c.registry())?),
            None => None,
        };
        let http = match http_addr {
            Some(a) => Some(
                quichub_gateway::http::tcp::spawn_tcp_with(
                    a,
                    api.clone(),
                    tcp.clone(),
                    tcp.limiter("http", listeners),
                )
                .await
                .with_context(|| {
                    format!("bind HTTP {a} (http.address, --http: off or another address)")
                })?,
            ),
            None => None,
        };
        let https = match https_addr {
            Some(a) => {
                // Browsers ask their user to pick a certificate whenever a
                // server asks for one, so the HTTPS port asks only when
                // `require_certificate` makes it a must.
                let asked = match clients.require_certificate {
                    true => (*clients).clone(),
                    false => ClientCertConfig::default(),
                };
                let tls = quichub_net::tls::tcp_server_config_with_clients(
                    &identity,
                    &[b"h2", b"http/1.1"],
                    &asked,
                )?;
                Some(
                    quichub_gateway::http::tcp::spawn_tls_with(
                        a,
                        api.clone(),
                        tcp.clone(),
                        tcp.limiter("https", listeners),
                        tls,
                    )
                    .await
                    .with_context(|| {
                        format!("bind HTTPS {a} (http.tls, --https: off or another address)")
                    })?,
                )
            }
            None => None,
        };
        let reloads = Arc::new(crate::metrics::Reloads::default());
        let metrics = match listen_addr("metrics.address", &config.metrics.address)? {
            Some(a) => {
                let listener = quichub_net::metrics_http::bind(a).await.with_context(|| {
                    format!("bind metrics {a} (metrics.address, --metrics: off or another address)")
                })?;
                let bound = listener.local_addr()?;
                let (r, b, q, a) = (relay.clone(), broker.clone(), server.stats(), auth.clone());
                let c = cluster.clone();
                let l = mqtt_link.clone();
                let h = api.clone();
                let reloaded = reloads.clone();
                tokio::spawn(quichub_net::metrics_http::serve_with(
                    quichub_net::tcp_limits::Acceptor::new(listener, tcp.metrics_limiter()),
                    Arc::new(move || {
                        crate::metrics::text(&r, &b, &q)
                            + &a.metrics.render()
                            + &c.as_ref().map(|c| c.render_metrics()).unwrap_or_default()
                            + &l.as_ref().map(|l| l.render_metrics()).unwrap_or_default()
                            + &h.metrics.render()
                            + &h.publish_rate().render()
                            + &reloaded.render()
                    }),
                    crate::metrics::readiness(&relay),
                    tcp.http_header_timeout(),
                ));
                Some(bound)
            }
            None => None,
        };
        Ok(Hub {
            auth: Arc::new(RwLock::new(config.auth.clone())),
            shared_auth: auth,
            reloads,
            cluster,
            mqtt_link,
            config,
            addr,
            fingerprint,
            identity,
            self_signed: self_signed_file,
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

/// How often a cluster member checks whether its certificate changed.
const FINGERPRINT_CHECK: Duration = Duration::from_secs(5);

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

/// Links the broker to the other members of the cluster
/// (`quichub_gateway::cluster`), following the registry's members.
fn link_mqtt(
    relay: &Arc<Relay>,
    broker: &Arc<Broker>,
    bridge: &Arc<Bridge>,
    registry: &Arc<dyn quichub_cluster::Registry>,
) -> anyhow::Result<Arc<quichub_gateway::cluster::Link>> {
    let me = registry.me().id;
    let mut members = registry.members();
    let id = me.clone();
    let others = move |m: &quichub_cluster::Members| -> std::collections::BTreeSet<String> {
        m.keys().filter(|k| **k != id).cloned().collect()
    };
    let (tx, rx) = tokio::sync::watch::channel(others(&members.borrow_and_update()));
    let link =
        quichub_gateway::cluster::start(relay.clone(), broker, bridge, &registry.me().id, rx)
            .map_err(|r| anyhow::anyhow!("cluster MQTT track: {}", r.reason))?;
    let mut shutdown = relay.shutdown_signal();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = members.changed() => if r.is_err() { return },
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let now = others(&members.borrow_and_update());
            tx.send_if_modified(|o| {
                let changed = *o != now;
                *o = now;
                changed
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    Ok(link)
}

/// Joins the cluster of `[cluster] registry`, if any.
async fn join_cluster(
    config: &Config,
    relay: &Arc<Relay>,
    quic: SocketAddr,
    identity: &Identity,
) -> anyhow::Result<Option<quichub_cluster::member::Membership>> {
    use quichub_cluster::{etcd, file, member, Node, Registry};
    let c = &config.cluster;
    if c.registry.is_empty() {
        return Ok(None);
    }
    let url = c.node_url(quic)?;
    let me = Node {
        id: if c.node_id.is_empty() {
            url.clone()
        } else {
            c.node_id.clone()
        },
        url,
        // With a cluster CA the others check the certificate against it;
        // else they pin this one.
        fingerprint: c.ca.is_none().then(|| identity.fingerprint_hex()),
    };
    let ttl = Duration::from_secs(c.lease_ttl_s);
    let registry: Arc<dyn Registry> = match c.registry.strip_prefix("file:") {
        Some(path) => Arc::new(file::StaticRegistry::load(path.as_ref(), me.clone())?),
        None => Arc::new(etcd::EtcdRegistry::new(me.clone(), c.etcd_options()?).await?),
    };
    let verify = match &c.ca {
        Some(ca) => Some(quichub_net::tls::Verify::ca_file(ca).context("cluster.ca")?),
        None => None,
    };
    {
        use quichub_relay::origin::Redacted;
        tracing::info!(
            node = %me.id,
            url = %Redacted(&me.url),
            registry = %Redacted(&c.registry),
            "joining the cluster"
        );
    }
    Ok(Some(member::join(
        relay.clone(),
        registry,
        member::PeerOptions {
            token: (!c.token.is_empty()).then(|| c.token.clone()),
            verify,
            retry_ms: ttl.as_millis() as u64,
        },
    )))
}

/// Renews the self-signed certificate before it expires.
async fn renew(mut s: SelfSigned, fingerprint: Arc<RwLock<String>>) {
    let mut tick = tokio::time::interval(RENEWAL_CHECK);
    loop {
        tick.tick().await;
        match s.renew_if_due(time::OffsetDateTime::now_utc()) {
            Ok(Some(hash)) => {
                tracing::warn!(
                    sha256 = %hash,
                    file = %s.cert_path.display(),
                    "self-signed certificate renewed; clients pinning the old hash need the new one"
                );
                *fingerprint.write().unwrap_or_else(|e| e.into_inner()) = hash;
            }
            Ok(None) => {}
            Err(e) => tracing::error!("renewing the self-signed certificate: {e:#}"),
        }
    }
}
