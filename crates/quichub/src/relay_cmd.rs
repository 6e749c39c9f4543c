//! `quichub relay`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use quichub_gateway::bridge::Bridge;
use quichub_gateway::{Broker, BrokerConfig, ConnConfig};
use quichub_net::server::Server;
use quichub_net::tls::Identity;
use quichub_relay::{Config, Relay};

/// Relay options.
#[derive(clap::Args, Debug, Clone)]
pub struct RelayArgs {
    /// UDP address for QUIC (raw `moqt-18` and WebTransport `h3`).
    #[arg(long, default_value = "127.0.0.1:4443")]
    pub bind: SocketAddr,
    /// PEM certificate chain (default: a self-signed ECDSA P-256 certificate made at start).
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key.
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
    /// Prometheus metrics address (`off` to disable).
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub metrics: String,
    /// TOML file with relay limits (see README for every key).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// TCP address of the MQTT 3.1.1/5 broker (`off` to disable).
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub mqtt: String,
}

fn addr_or_off(flag: &str, v: &str) -> anyhow::Result<Option<SocketAddr>> {
    if v == "off" {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .with_context(|| format!("--{flag} must be ADDR:PORT or off"))
}

/// A relay running in this process.
pub struct Running {
    /// The bound UDP address.
    pub addr: SocketAddr,
    /// SHA-256 of the certificate.
    pub fingerprint: String,
    /// The relay core.
    pub relay: Arc<Relay>,
    /// The endpoint.
    pub server: Arc<Server>,
    /// The bound metrics address, if any.
    pub metrics: Option<SocketAddr>,
    /// The bound MQTT TCP address, if any.
    pub mqtt: Option<SocketAddr>,
}

/// Binds and starts the relay's tasks.
pub async fn start(args: &RelayArgs) -> anyhow::Result<Running> {
    let config: Config = match &args.config {
        Some(p) => toml::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?,
        )
        .with_context(|| format!("parse {}", p.display()))?,
        None => Config::default(),
    };
    let identity = match (&args.cert, &args.key) {
        (Some(c), Some(k)) => Identity::from_pem_files(c, k)?,
        _ => Identity::self_signed(&["localhost", "127.0.0.1", "::1"])?,
    };
    let server = Arc::new(Server::bind(args.bind, &identity)?);
    let addr = server.local_addr()?;
    let relay = Relay::new(config);
    tokio::spawn(quichub_relay::endpoint::accept_loop(
        relay.clone(),
        server.clone(),
    ));
    let broker = Broker::new(BrokerConfig::default());
    let bridge = Bridge::start(relay.clone(), &broker);
    let b = broker.clone();
    tokio::spawn(async move {
        let _bridge = bridge;
        let mut t = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            t.tick().await;
            b.tick(std::time::Instant::now());
        }
    });
    let mqtt = match addr_or_off("mqtt", &args.mqtt)? {
        Some(a) => Some(
            quichub_gateway::listener::spawn_tcp(
                a,
                broker.clone(),
                Arc::new(ConnConfig::default()),
            )
            .await
            .with_context(|| format!("bind MQTT {a} (use --mqtt off or another address)"))?,
        ),
        None => None,
    };
    let metrics = if let Some(a) = addr_or_off("metrics", &args.metrics)? {
        let listener = quichub_net::metrics_http::bind(a)
            .await
            .with_context(|| format!("bind metrics {a}"))?;
        let bound = listener.local_addr()?;
        let m = relay.metrics.clone();
        tokio::spawn(quichub_net::metrics_http::serve(
            listener,
            Arc::new(move || m.render()),
        ));
        Some(bound)
    } else {
        None
    };
    Ok(Running {
        addr,
        fingerprint: identity.fingerprint_hex(),
        relay,
        server,
        metrics,
        mqtt,
    })
}

/// Runs until SIGTERM or Ctrl-C, then drains with GOAWAY.
pub async fn run(args: RelayArgs) -> anyhow::Result<()> {
    let r = start(&args).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "quichub relay listening on udp {} (raw QUIC moqt-18, WebTransport h3)",
            r.addr
        )?;
        writeln!(out, "certificate sha256 {}", r.fingerprint)?;
        if let Some(m) = r.mqtt {
            writeln!(out, "mqtt tcp {m} (MQTT 3.1.1 and 5.0)")?;
        }
        if let Some(m) = r.metrics {
            writeln!(out, "metrics http://{m}/metrics")?;
        }
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    eprintln!(
        "shutting down: GOAWAY sent to {} sessions",
        r.relay.sessions().len()
    );
    quichub_relay::endpoint::shutdown(&r.relay, &r.server).await;
    Ok(())
}
