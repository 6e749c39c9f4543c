//! `quichub relay`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use quichub_gateway::bridge::Bridge;
use quichub_gateway::store::{Fsync, Store};
use quichub_gateway::{Broker, BrokerConfig, ConnConfig};
use quichub_net::server::Server;
use quichub_net::tls::Identity;
use quichub_net::AckFrequency;
use quichub_relay::{Config, Relay};

use crate::file_config::FileConfig;

/// `--ack-frequency` default: [`AckFrequency::default`].
pub const DEFAULT_ACK_FREQUENCY: &str = "9,100";

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
    /// TCP address of the MQTT 3.1.1/5 broker (`off` turns the broker off:
    /// no MQTT over TCP, TLS or QUIC, and no broker state on disk).
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub mqtt: String,
    /// TCP address of MQTT over TLS, with the relay's certificate (`off` to
    /// disable).
    #[arg(long, default_value = "127.0.0.1:8883")]
    pub mqtt_tls: String,
    /// Directory of the broker's durable state (retained messages, persistent
    /// sessions and their queued messages); `off` keeps it in memory only.
    /// Default: `$XDG_STATE_HOME/quichub`, else `~/.local/state/quichub`.
    /// Not opened with `--mqtt off`.
    #[arg(long)]
    pub data_dir: Option<String>,
    /// When the broker's log reaches the disk before a QoS 1/2 publish is
    /// acknowledged: `always` (fdatasync, group commit: survives power loss)
    /// or `never` (written to the OS: survives a crash of the process).
    #[arg(long, default_value = "always", value_parser = ["always", "never"])]
    pub fsync: String,
    /// TCP address of the HTTP pub/sub API over HTTP/1.1 and cleartext
    /// HTTP/2 (`off` to disable); see docs/http-api.md.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: String,
    /// The same HTTP API over HTTP/3 on the relay's UDP port (ALPN `h3`,
    /// beside WebTransport, with 0-RTT): `on` or `off`.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub http3: String,
    /// What QUIC peers are asked about acknowledgements (the ACK frequency
    /// extension): `PACKETS,MILLISECONDS` (acknowledge after more than PACKETS
    /// packets or after MILLISECONDS, and at once on a gap), or `off` for
    /// QUIC's default of every other packet. Fewer ACKs from subscribers cost
    /// the relay less CPU per object; a longer delay slows the detection of a
    /// lost last packet on streams. Peers without the extension ignore it.
    #[arg(long, default_value = DEFAULT_ACK_FREQUENCY)]
    pub ack_frequency: String,
}

fn default_data_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .map(|d| d.join("quichub"))
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
    /// The bound MQTT-over-TLS address, if any.
    pub mqtt_tls: Option<SocketAddr>,
    /// The bound HTTP API TCP address, if any.
    pub http: Option<SocketAddr>,
    /// Whether the HTTP API is served over HTTP/3 on `addr`.
    pub http3: bool,
}

/// Binds and starts the relay's tasks.
pub async fn start(args: &RelayArgs) -> anyhow::Result<Running> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let config: Config = file.relay.clone();
    let identity = match (&args.cert, &args.key) {
        (Some(c), Some(k)) => Identity::from_pem_files(c, k)?,
        _ => Identity::self_signed(&["localhost", "127.0.0.1", "::1"])?,
    };
    let ack = match args.ack_frequency.as_str() {
        "off" => None,
        v => Some(v.parse::<AckFrequency>().context("--ack-frequency")?),
    };
    let server = Arc::new(Server::bind_with(args.bind, &identity, ack)?);
    let addr = server.local_addr()?;
    let relay = Relay::new(config);
    let mqtt_addr = addr_or_off("mqtt", &args.mqtt)?;
    let data_dir = match args.data_dir.as_deref() {
        Some("off") => None,
        Some(d) => Some(PathBuf::from(d)),
        None => default_data_dir(),
    };
    let broker = match (&mqtt_addr, data_dir) {
        (Some(_), Some(dir)) => {
            let fsync = if args.fsync == "never" {
                Fsync::Never
            } else {
                Fsync::Always
            };
            let (store, recovered) = Store::open(&dir, fsync)
                .with_context(|| format!("open broker state in {}", dir.display()))?;
            tracing::info!(
                "broker state {}: {} records, {} sessions, {} retained",
                store.path().display(),
                recovered.records,
                recovered.sessions.len(),
                recovered.retained.len()
            );
            Broker::with_store(BrokerConfig::default(), store, recovered)
        }
        _ => Broker::new(BrokerConfig::default()),
    };
    let bridge = Bridge::start(relay.clone(), &broker);
    let http_api = quichub_gateway::http::Api::new(
        broker.clone(),
        Some(bridge.clone()),
        quichub_gateway::http::ApiConfig::default(),
    );
    let b = broker.clone();
    tokio::spawn(async move {
        let _bridge = bridge;
        let mut t = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            t.tick().await;
            b.tick(std::time::Instant::now());
        }
    });
    let conn_config = Arc::new(ConnConfig::default());
    // TCP listeners share the descriptors: raise the soft limit, then give
    // each client listener an equal share ([tcp] in the config file).
    let tcp = file.tcp.clone();
    let mqtt_tls_addr = addr_or_off("mqtt-tls", &args.mqtt_tls)?.filter(|_| mqtt_addr.is_some());
    let http_addr = addr_or_off("http", &args.http)?;
    let nofile = quichub_net::tcp_limits::raise_nofile_limit();
    let listeners = [
        mqtt_addr.is_some(),
        mqtt_tls_addr.is_some(),
        http_addr.is_some(),
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
            .with_context(|| format!("bind MQTT {a} (use --mqtt off or another address)"))?,
        ),
        None => None,
    };
    let mqtt_tls = match (mqtt.is_some(), mqtt_tls_addr) {
        (true, Some(a)) => {
            let tls = quichub_net::tls::tcp_server_config(&identity, &[b"mqtt"])?;
            let limiter = tcp.limiter("mqtt-tls", listeners);
            Some(
                quichub_gateway::listener::spawn_tls_with(
                    a,
                    broker.clone(),
                    conn_config.clone(),
                    tls,
                    limiter,
                )
                .await
                .with_context(|| {
                    format!("bind MQTT over TLS {a} (use --mqtt-tls off or another address)")
                })?,
            )
        }
        _ => None,
    };
    // MQTT over QUIC on the relay's UDP port (ALPN `mqtt`) whenever the broker runs.
    let mut alpn_handlers = quichub_relay::endpoint::AlpnHandlers::new();
    if mqtt.is_some() {
        let (b, c) = (broker.clone(), conn_config.clone());
        let handler: quichub_relay::endpoint::AlpnHandler = Arc::new(move |conn| {
            Box::pin(quichub_gateway::quic::serve_quic(
                conn,
                b.clone(),
                c.clone(),
            ))
        });
        alpn_handlers.insert(quichub_net::server::ALPN_MQTT.to_vec(), handler);
    }
    // The HTTP API over HTTP/3 on the same port (ALPN `h3`, beside WebTransport).
    let http3: Option<quichub_relay::endpoint::Http3Handler> = (args.http3 == "on").then(|| {
        let api = http_api.clone();
        let h: quichub_relay::endpoint::Http3Handler =
            Arc::new(move |conn| Box::pin(quichub_gateway::http::h3::serve_h3(api.clone(), conn)));
        h
    });
    tokio::spawn(quichub_relay::endpoint::serve_endpoint(
        relay.clone(),
        server.clone(),
        alpn_handlers,
        http3,
    ));
    let http = match http_addr {
        Some(a) => Some(
            quichub_gateway::http::tcp::spawn_tcp_with(
                a,
                http_api.clone(),
                tcp.clone(),
                tcp.limiter("http", listeners),
            )
            .await
            .with_context(|| format!("bind HTTP {a} (use --http off or another address)"))?,
        ),
        None => None,
    };
    let metrics = if let Some(a) = addr_or_off("metrics", &args.metrics)? {
        let listener = quichub_net::metrics_http::bind(a)
            .await
            .with_context(|| format!("bind metrics {a}"))?;
        let bound = listener.local_addr()?;
        let m = relay.metrics.clone();
        tokio::spawn(quichub_net::metrics_http::serve_with(
            quichub_net::tcp_limits::Acceptor::new(listener, tcp.metrics_limiter()),
            Arc::new(move || m.render()),
            tcp.http_header_timeout(),
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
        mqtt_tls,
        http,
        http3: args.http3 == "on",
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
        if let Some(m) = r.mqtt_tls {
            writeln!(out, "mqtt tls {m}")?;
        }
        if r.mqtt.is_some() {
            writeln!(out, "mqtt quic udp {} (ALPN mqtt)", r.addr)?;
        }
        if let Some(h) = r.http {
            writeln!(out, "http tcp {h} (HTTP/1.1, HTTP/2 cleartext)")?;
        }
        if r.http3 {
            writeln!(out, "http3 udp {} (ALPN h3, beside WebTransport)", r.addr)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ack_frequency_is_the_library_default() {
        assert_eq!(
            DEFAULT_ACK_FREQUENCY.parse::<AckFrequency>().unwrap(),
            AckFrequency::default()
        );
    }
}
