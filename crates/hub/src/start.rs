//! [`Hub::start`](crate::Hub::start)'s steps, one per configuration section,
//! in the order their listeners come up: the certificate ([tls]), the UDP
//! endpoint ([quic]), the relay ([relay], [auth]), the broker and its store
//! ([mqtt], [store]), the HTTP API and pages ([http]), the TCP listeners
//! ([tcp], [mqtt], [http]), the protocols on the UDP port, the cluster
//! ([cluster]) and the metrics ([metrics]).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use quichub_auth::SharedAuth;
use quichub_gateway::bridge::Bridge;
use quichub_gateway::http::Api;
use quichub_gateway::store::Store;
use quichub_gateway::Broker;
use quichub_net::server::Server;
use quichub_net::tcp_limits::TcpLimits;
use quichub_net::tls::{ClientCertConfig, Identity, SelfSigned};
use quichub_relay::tokens::TokenAuthorizer;
use quichub_relay::Relay;

use crate::config::{listen_addr, Config};
use crate::hub::SelfSignedFile;

/// Names in the self-signed certificate.
const NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// How often the broker's timers (keep alive, session expiry, will delay)
/// and the self-signed certificate's renewal are looked at.
const BROKER_TICK: Duration = Duration::from_secs(1);
const RENEWAL_CHECK: Duration = Duration::from_secs(3600);

/// What [tls] gives every TLS listener.
pub(crate) struct Tls {
    pub identity: Identity,
    pub self_signed: Option<SelfSignedFile>,
    /// The hash the pages' `/certificate.sha256` serves: renewal and
    /// reload replace it.
    pub fingerprint: Arc<RwLock<String>>,
    /// Client certificates (mosquitto's cafile, require_certificate,
    /// use_identity_as_username).
    pub clients: Arc<ClientCertConfig>,
}

/// [tls]: the configured files, or a self-signed certificate kept in the
/// data directory (so pinned hashes and --cafile copies survive restarts)
/// and renewed while running. Both are presented through a rotation, so
/// renewal and reload replace it without dropping connections.
pub(crate) fn tls(config: &Config) -> anyhow::Result<Tls> {
    let mut self_signed = None;
    let identity = match (&config.tls.cert, &config.tls.key, &config.store.dir()) {
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
    let fingerprint = Arc::new(RwLock::new(identity.fingerprint_hex()));
    if let Some(s) = self_signed {
        tokio::spawn(renew(s, fingerprint.clone()));
    }
    let clients = Arc::new(ClientCertConfig {
        cafile: config.tls.client_ca.clone(),
        require_certificate: config.tls.require_certificate,
        use_identity_as_username: config.tls.use_identity_as_username,
    });
    Ok(Tls {
        identity,
        self_signed: self_signed_file,
        fingerprint,
        clients,
    })
}

/// [quic]: the UDP endpoint, bound (served by [`endpoint`] once every
/// handler exists).
pub(crate) fn quic(config: &Config, tls: &Tls) -> anyhow::Result<Arc<Server>> {
    Ok(Arc::new(Server::bind_clients(
        config.quic.bind_addr()?,
        &tls.identity,
        config.quic.ack()?,
        &config.quic.limits,
        &tls.clients,
    )?))
}

/// [relay], with [auth]'s tokens and the cluster's own token.
pub(crate) fn relay(config: &Config, auth: &Arc<SharedAuth>) -> Arc<Relay> {
    Relay::with_authorizer(
        config.relay.clone(),
        TokenAuthorizer::for_cluster(
            auth.clone(),
            config.auth.max_token_cache,
            &config.cluster.token,
        ),
    )
}

/// [mqtt]'s broker with [store]'s durable state (when MQTT listens and a
/// data directory is set), its timers, and its bridge to the relay's tracks.
pub(crate) fn broker(
    config: &Config,
    listens: bool,
    relay: &Arc<Relay>,
    auth: &Arc<SharedAuth>,
) -> anyhow::Result<(Arc<Broker>, Arc<Bridge>)> {
    let broker = match (listens, &config.store.dir()) {
        (true, Some(dir)) => {
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
    // The broker's messages reach MoQT subscribers through the bridge.
    broker.set_route(bridge.route());
    let b = broker.clone();
    tokio::spawn(async move {
        let mut t = tokio::time::interval(BROKER_TICK);
        loop {
            t.tick().await;
            b.tick(std::time::Instant::now());
        }
    });
    Ok((broker, bridge))
}

/// [http]'s API, with the dashboard (`/`), the player (`/watch/{broadcast}`)
/// and MoQT over WebSocket; its listeners come up in [`http`].
pub(crate) fn api(
    config: &Config,
    relay: &Arc<Relay>,
    broker: &Arc<Broker>,
    bridge: &Arc<Bridge>,
    auth: &Arc<SharedAuth>,
    quic: SocketAddr,
    tls: &Tls,
) -> anyhow::Result<Arc<Api>> {
    let api = Api::new(
        broker.clone(),
        Some(bridge.clone()),
        config.http.api_config()?,
    );
    api.set_auth(auth.clone());
    api.serve_web(
        quichub_gateway::http::web::Web::new(relay.clone(), quic.port(), tls.fingerprint.clone())
            .with_websocket(config.http.websocket),
    );
    if config.http.websocket {
        api.serve_websocket(quichub_gateway::http::websocket::WebSocketMoqt::new(
            relay.clone(),
            &config.quic.limits,
        ));
    }
    Ok(api)
}

/// [tcp]: the TCP listeners' addresses and their share of the descriptors
/// (the soft limit raised first, then an equal share each).
pub(crate) struct TcpPlan {
    tcp: TcpLimits,
    listeners: usize,
    mqtt: Option<SocketAddr>,
    mqtt_tls: Option<SocketAddr>,
    http: Option<SocketAddr>,
    https: Option<SocketAddr>,
}

impl TcpPlan {
    pub(crate) fn new(config: &Config, mqtt: Option<SocketAddr>) -> anyhow::Result<TcpPlan> {
        let mqtt_tls = listen_addr("mqtt.tls", &config.mqtt.tls)?.filter(|_| mqtt.is_some());
        let http = listen_addr("http.address", &config.http.address)?;
        let https = listen_addr("http.tls", &config.http.tls)?;
        let nofile = quichub_net::tcp_limits::raise_nofile_limit();
        let listeners = [mqtt, mqtt_tls, http, https]
            .iter()
            .filter(|a| a.is_some())
            .count();
        let tcp = config.tcp.clone();
        tracing::info!(
            "tcp: {nofile} descriptors, {} connections per listener, {} per address",
            tcp.listener_cap(nofile, listeners),
            tcp.max_connections_per_ip
        );
        Ok(TcpPlan {
            tcp,
            listeners,
            mqtt,
            mqtt_tls,
            http,
            https,
        })
    }
}

/// [mqtt]'s TCP and TLS listeners.
pub(crate) async fn mqtt(
    config: &Config,
    plan: &TcpPlan,
    broker: &Arc<Broker>,
    tls: &Tls,
) -> anyhow::Result<(Option<SocketAddr>, Option<SocketAddr>)> {
    let (tcp, listeners) = (&plan.tcp, plan.listeners);
    let conn_config = Arc::new(config.mqtt.conn_config());
    let mqtt = match plan.mqtt {
        Some(a) => Some(
            quichub_gateway::listener::spawn_tcp_with(
                a,
                broker.clone(),
                conn_config.clone(),
                tcp.limiter("mqtt", listeners),
            )
            .await
            .with_context(|| format!("bind MQTT {a} (mqtt.tcp, --mqtt: off or another address)"))?,
        ),
        None => None,
    };
    let mqtt_tls = match plan.mqtt_tls {
        Some(a) => {
            let server_config = quichub_net::tls::tcp_server_config_with_clients(
                &tls.identity,
                &[b"mqtt"],
                &tls.clients,
            )?;
            Some(
                quichub_gateway::listener::spawn_tls_clients(
                    a,
                    broker.clone(),
                    conn_config,
                    server_config,
                    tcp.limiter("mqtt-tls", listeners),
                    tls.clients.clone(),
                )
                .await
                .with_context(|| {
                    format!("bind MQTT over TLS {a} (mqtt.tls, --mqtt-tls: off or another address)")
                })?,
            )
        }
        None => None,
    };
    Ok((mqtt, mqtt_tls))
}

/// The UDP port's protocols, served: MoQT and WebTransport (the relay),
/// MQTT over QUIC (ALPN `mqtt`, with `mqtt`: the broker, when it listens)
/// and the HTTP API over HTTP/3 (ALPN `h3` beside WebTransport, [quic]
/// http3).
pub(crate) fn endpoint(
    config: &Config,
    relay: &Arc<Relay>,
    server: &Arc<Server>,
    mqtt: Option<&Arc<Broker>>,
    api: &Arc<Api>,
    tls: &Tls,
    quic: SocketAddr,
) {
    let mut alpn_handlers = quichub_relay::endpoint::AlpnHandlers::new();
    if let Some(broker) = mqtt {
        let (b, c, k) = (
            broker.clone(),
            Arc::new(config.mqtt.conn_config()),
            tls.clients.clone(),
        );
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
    let http3: Option<quichub_relay::endpoint::Http3Handler> = config.quic.http3.then(|| {
        let api = api.clone();
        api.origins().add_listener(true, quic);
        let listener = quichub_gateway::http::origin::Listener::new(true, quic);
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
}

/// [cluster]: the relays this one follows (origins, a client endpoint each,
/// checking the origin's certificate as configured), and membership of a
/// registry's cluster: registered, claiming its publishers' namespaces,
/// following the other members, its certificate kept current there, MQTT
/// linked to the other members' brokers.
pub(crate) async fn cluster(
    config: &Config,
    relay: &Arc<Relay>,
    broker: &Arc<Broker>,
    bridge: &Arc<Bridge>,
    quic: SocketAddr,
    tls: &Tls,
) -> anyhow::Result<(
    Option<Arc<quichub_cluster::member::Membership>>,
    Option<Arc<quichub_gateway::cluster::Link>>,
)> {
    for o in &config.cluster.origins {
        let (origin, verify) = o.resolve()?;
        let client = quichub_net::client::Client::new("0.0.0.0:0".parse()?, verify)
            .context("client endpoint for [cluster] origins")?;
        tokio::spawn(quichub_relay::origin::follow(relay.clone(), client, origin));
    }
    let cluster = join_cluster(config, relay, quic, &tls.identity)
        .await?
        .map(Arc::new);
    // A renewed or reloaded certificate is registered again, so the
    // other relays pin the new one (with a cluster CA nothing is pinned).
    if let (Some(c), None) = (&cluster, &config.cluster.ca) {
        let (registry, fp) = (c.registry().clone(), tls.fingerprint.clone());
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
        Some(c) => Some(link_mqtt(relay, broker, bridge, c.registry())?),
        None => None,
    };
    Ok((cluster, mqtt_link))
}

/// [http]'s HTTP and HTTPS listeners.
pub(crate) async fn http(
    plan: &TcpPlan,
    api: &Arc<Api>,
    tls: &Tls,
) -> anyhow::Result<(Option<SocketAddr>, Option<SocketAddr>)> {
    let (tcp, listeners) = (&plan.tcp, plan.listeners);
    let http = match plan.http {
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
    let https = match plan.https {
        Some(a) => {
            // Browsers ask their user to pick a certificate whenever a
            // server asks for one, so the HTTPS port asks only when
            // `require_certificate` makes it a must.
            let asked = match tls.clients.require_certificate {
                true => (*tls.clients).clone(),
                false => ClientCertConfig::default(),
            };
            let server_config = quichub_net::tls::tcp_server_config_with_clients(
                &tls.identity,
                &[b"h2", b"http/1.1"],
                &asked,
            )?;
            Some(
                quichub_gateway::http::tcp::spawn_tls_with(
                    a,
                    api.clone(),
                    tcp.clone(),
                    tcp.limiter("https", listeners),
                    server_config,
                )
                .await
                .with_context(|| {
                    format!("bind HTTPS {a} (http.tls, --https: off or another address)")
                })?,
            )
        }
        None => None,
    };
    Ok((http, https))
}

/// What `/metrics` reads.
pub(crate) struct Metered<'a> {
    pub relay: &'a Arc<Relay>,
    pub broker: &'a Arc<Broker>,
    pub server: &'a Arc<Server>,
    pub auth: &'a Arc<SharedAuth>,
    pub cluster: &'a Option<Arc<quichub_cluster::member::Membership>>,
    pub mqtt_link: &'a Option<Arc<quichub_gateway::cluster::Link>>,
    pub api: &'a Arc<Api>,
    pub reloads: &'a Arc<crate::metrics::Reloads>,
}

/// [metrics]: the Prometheus listener with the readiness probe.
pub(crate) async fn metrics(config: &Config, m: Metered<'_>) -> anyhow::Result<Option<SocketAddr>> {
    let Some(a) = listen_addr("metrics.address", &config.metrics.address)? else {
        return Ok(None);
    };
    let listener = quichub_net::metrics_http::bind(a).await.with_context(|| {
        format!("bind metrics {a} (metrics.address, --metrics: off or another address)")
    })?;
    let bound = listener.local_addr()?;
    let (r, b, q, au) = (
        m.relay.clone(),
        m.broker.clone(),
        m.server.stats(),
        m.auth.clone(),
    );
    let (c, l, h, reloaded) = (
        m.cluster.clone(),
        m.mqtt_link.clone(),
        m.api.clone(),
        m.reloads.clone(),
    );
    tokio::spawn(quichub_net::metrics_http::serve_with(
        quichub_net::tcp_limits::Acceptor::new(listener, config.tcp.metrics_limiter()),
        Arc::new(move || {
            crate::metrics::text(&r, &b, &q)
                + &au.metrics.render()
                + &c.as_ref().map(|c| c.render_metrics()).unwrap_or_default()
                + &l.as_ref().map(|l| l.render_metrics()).unwrap_or_default()
                + &h.metrics.render()
                + &h.publish_rate().render()
                + &reloaded.render()
        }),
        crate::metrics::readiness(m.relay),
        config.tcp.http_header_timeout(),
    ));
    Ok(Some(bound))
}

/// How often a cluster member checks whether its certificate changed.
const FINGERPRINT_CHECK: Duration = Duration::from_secs(5);

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
