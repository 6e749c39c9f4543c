//! `quichub relay`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use quichub_gateway::bridge::Bridge;
use quichub_gateway::store::{Fsync, Recovery, Store};
use quichub_gateway::{Broker, ConnConfig};
use quichub_net::server::{AdmissionStats, Server};
use quichub_net::tls::{Identity, SelfSigned};
use quichub_net::AckFrequency;
use quichub_relay::{Config, Relay};

use crate::file_config::FileConfig;

/// `--ack-frequency` default: [`AckFrequency::default`].
pub const DEFAULT_ACK_FREQUENCY: &str = "9,100";

/// Relay options.
#[derive(clap::Args, Debug, Clone)]
pub struct RelayArgs {
    /// UDP address for QUIC (raw `moqt-18` and WebTransport `h3`): `IP:PORT`
    /// or `HOST:PORT` (a name binds its first IPv4 address, else its first:
    /// the one quichub's clients dial).
    #[arg(long, default_value = "127.0.0.1:4443", value_parser = resolve_addr)]
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
    /// sessions and their queued messages) and, without `--cert/--key`, of the
    /// self-signed certificate (`tls/cert.pem`, `tls/cert.sha256`: kept across
    /// restarts, renewed 3 days before it expires); `off` keeps both in memory
    /// only.
    /// Default: `$XDG_STATE_HOME/quichub`, else `~/.local/state/quichub`.
    /// Not opened with `--mqtt off`.
    #[arg(long)]
    pub data_dir: Option<String>,
    /// When the broker's log reaches the disk before a QoS 1/2 publish is
    /// acknowledged: `always` (fdatasync, group commit: survives power loss)
    /// or `never` (written to the OS: survives a crash of the process).
    #[arg(long, default_value = "always", value_parser = ["always", "never"])]
    pub fsync: String,
    /// What to do when the broker's log is corrupt (an incomplete last
    /// record, the trace of a crash, is always dropped): `salvage` skips the
    /// damaged bytes, logging each range, keeps the file aside as
    /// `broker.log.corrupt-<time>` and starts; `strict` refuses to start.
    #[arg(long, default_value = "salvage", value_parser = ["strict", "salvage"])]
    pub store_recovery: String,
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

/// `/metrics`: the relay's counters, then the broker's.
fn metrics_text(relay: &Relay, broker: &Broker, quic: &AdmissionStats) -> String {
    relay.metrics.render() + &quic.render() + &broker.render_metrics()
}

/// `/readyz`: ready until the relay starts draining (SIGTERM), so a load
/// balancer stops sending new clients before the sessions are told to go.
fn readiness(relay: &Arc<Relay>) -> quichub_net::metrics_http::Readiness {
    let shutdown = relay.shutdown_signal();
    Arc::new(move || (*shutdown.borrow()).then(|| "draining: shutting down".to_string()))
}

fn addr_or_off(flag: &str, v: &str) -> anyhow::Result<Option<SocketAddr>> {
    if v == "off" {
        return Ok(None);
    }
    resolve_addr(v)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--{flag} must be HOST:PORT or off: {e}"))
}

/// A relay running in this process.
pub struct Running {
    /// The bound UDP address.
    pub addr: SocketAddr,
    /// SHA-256 of the certificate.
    pub fingerprint: String,
    /// The self-signed certificate kept in the data directory: its file,
    /// whether it was reused from an earlier run, and when it will be renewed.
    pub cert_file: Option<(PathBuf, bool, time::OffsetDateTime)>,
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
    let data_dir = match args.data_dir.as_deref() {
        Some("off") => None,
        Some(d) => Some(PathBuf::from(d)),
        None => default_data_dir(),
    };
    const NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];
    // Without --cert/--key: a self-signed certificate, kept in the data
    // directory (so pinned hashes and --cafile copies survive restarts) and
    // renewed while running before it expires.
    let mut self_signed = None;
    let identity = match (&args.cert, &args.key, &data_dir) {
        (Some(c), Some(k), _) => Identity::from_pem_files(c, k)?,
        (_, _, Some(dir)) => {
            let tls_dir = dir.join("tls");
            let s = SelfSigned::load_or_make(&tls_dir, NAMES)
                .with_context(|| format!("self-signed certificate in {}", tls_dir.display()))?;
            let id = s.identity.clone();
            self_signed = Some(s);
            id
        }
        _ => Identity::self_signed(NAMES)?,
    };
    let cert_file = self_signed.as_ref().map(|s| {
        (
            s.cert_path.clone(),
            s.reused,
            s.expires() - SelfSigned::RENEW_BEFORE,
        )
    });
    // The hash the pages' `/certificate.sha256` serves: renewal replaces it.
    let fingerprint = Arc::new(std::sync::RwLock::new(identity.fingerprint_hex()));
    if let Some(mut s) = self_signed {
        let fingerprint = fingerprint.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                tick.tick().await;
                match s.renew_if_due(time::OffsetDateTime::now_utc()) {
                    Ok(Some(hash)) => {
                        tracing::warn!(
                            sha256 = %hash,
                            file = %s.cert_path.display(),
                            "self-signed certificate renewed; clients pinning the old hash need the new one"
                        );
                        *fingerprint.write().expect("fingerprint lock") = hash.to_string();
                    }
                    Ok(None) => {}
                    Err(e) => tracing::error!("renewing the self-signed certificate: {e:#}"),
                }
            }
        });
    }
    let ack = match args.ack_frequency.as_str() {
        "off" => None,
        v => Some(v.parse::<AckFrequency>().context("--ack-frequency")?),
    };
    let server = Arc::new(Server::bind_clients(
        args.bind, &identity, ack, &file.quic, &file.tls,
    )?);
    let addr = server.local_addr()?;
    let relay = Relay::new(config);
    let mqtt_addr = addr_or_off("mqtt", &args.mqtt)?;
    let broker = match (&mqtt_addr, data_dir) {
        (Some(_), Some(dir)) => {
            let fsync = if args.fsync == "never" {
                Fsync::Never
            } else {
                Fsync::Always
            };
            let recovery: Recovery = args.store_recovery.parse().map_err(anyhow::Error::msg)?;
            let (store, recovered) = Store::open(&dir, fsync, recovery)
                .with_context(|| format!("open broker state in {}", dir.display()))?;
            tracing::info!(
                "broker state {}: {} records, {} sessions, {} retained",
                store.path().display(),
                recovered.records,
                recovered.sessions.len(),
                recovered.retained.len()
            );
            Broker::with_store(file.mqtt.clone(), store, recovered)
        }
        _ => Broker::new(file.mqtt.clone()),
    };
    let bridge = Bridge::start(relay.clone(), &broker);
    let http_api = quichub_gateway::http::Api::new(
        broker.clone(),
        Some(bridge.clone()),
        quichub_gateway::http::ApiConfig::default(),
    );
    // The dashboard (`/`) and the player (`/watch/{broadcast}`) on the HTTP port.
    http_api.serve_web(quichub_gateway::http::web::Web::new(
        relay.clone(),
        addr.port(),
        fingerprint,
    ));
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
            let tls =
                quichub_net::tls::tcp_server_config_with_clients(&identity, &[b"mqtt"], &file.tls)?;
            let limiter = tcp.limiter("mqtt-tls", listeners);
            Some(
                quichub_gateway::listener::spawn_tls_clients(
                    a,
                    broker.clone(),
                    conn_config.clone(),
                    tls,
                    limiter,
                    Arc::new(file.tls.clone()),
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
        let clients = Arc::new(file.tls.clone());
        let handler: quichub_relay::endpoint::AlpnHandler = Arc::new(move |conn| {
            Box::pin(quichub_gateway::quic::serve_quic_clients(
                conn,
                b.clone(),
                c.clone(),
                clients.clone(),
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
        let (r, b, q) = (relay.clone(), broker.clone(), server.stats());
        tokio::spawn(quichub_net::metrics_http::serve_with(
            quichub_net::tcp_limits::Acceptor::new(listener, tcp.metrics_limiter()),
            Arc::new(move || metrics_text(&r, &b, &q)),
            readiness(&relay),
            tcp.http_header_timeout(),
        ));
        Some(bound)
    } else {
        None
    };
    Ok(Running {
        addr,
        fingerprint: identity.fingerprint_hex(),
        cert_file,
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
        if let Some((path, reused, renew)) = &r.cert_file {
            writeln!(
                out,
                "certificate {} (self-signed, {}; renewed after {})",
                path.display(),
                if *reused {
                    "kept from an earlier run"
                } else {
                    "made now"
                },
                renew.date()
            )?;
        }
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
            writeln!(
                out,
                "web dashboard http://{h}/ player http://{h}/watch/BROADCAST"
            )?;
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
    use quichub_gateway::BrokerConfig;

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
        assert_eq!(addr_or_off("http", "off").unwrap(), None);
        let a = addr_or_off("http", "localhost:0").unwrap().unwrap();
        assert!(a.ip().is_loopback());
        let e = addr_or_off("metrics", "nowhere").unwrap_err().to_string();
        assert!(e.contains("--metrics"), "{e}");
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            relay: RelayArgs,
        }
        let t = <T as clap::Parser>::try_parse_from(["t", "--bind", "localhost:4443"]).unwrap();
        assert!(t.relay.bind.ip().is_loopback());
        assert!(<T as clap::Parser>::try_parse_from(["t", "--bind", "localhost"]).is_err());
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

    #[tokio::test]
    async fn healthz_and_readyz() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let relay = Relay::new(Config::default());
        let listener = quichub_net::metrics_http::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = quichub_net::tcp_limits::TcpLimits::default();
        tokio::spawn(quichub_net::metrics_http::serve_with(
            quichub_net::tcp_limits::Acceptor::new(listener, limits.metrics_limiter()),
            Arc::new(String::new),
            readiness(&relay),
            limits.http_header_timeout(),
        ));
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut r = String::new();
            s.read_to_string(&mut r).await.unwrap();
            r
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        relay.begin_shutdown();
        let r = get("/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("draining"), "{r}");
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn metrics_include_the_brokers() {
        let text = metrics_text(
            &Relay::new(Config::default()),
            &Broker::new(BrokerConfig::default()),
            &AdmissionStats::default(),
        );
        assert!(text.contains("quichub_quic_handshakes 0"), "{text}");
        assert!(text.contains("quichub_sessions "), "{text}");
        assert!(
            text.contains("quichub_mqtt_messages_dropped_total{reason=\"queue_full\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn store_recovery_flag() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            relay: RelayArgs,
        }
        let recovery = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("quichub").chain(args.iter().copied()))
                .map(|c| c.relay.store_recovery.parse::<Recovery>())
        };
        assert_eq!(recovery(&[]).unwrap(), Ok(Recovery::Salvage));
        assert_eq!(
            recovery(&["--store-recovery", "strict"]).unwrap(),
            Ok(Recovery::Strict)
        );
        assert!(recovery(&["--store-recovery", "lenient"]).is_err());
    }

    #[test]
    fn default_ack_frequency_is_the_library_default() {
        assert_eq!(
            DEFAULT_ACK_FREQUENCY.parse::<AckFrequency>().unwrap(),
            AckFrequency::default()
        );
    }
}
