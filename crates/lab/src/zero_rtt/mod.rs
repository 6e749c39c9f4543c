//! `lab zero-rtt`: how long from a client's start to its first MQTT PUBLISH
//! arriving at the broker, over TCP, TLS, QUIC with a full handshake, QUIC
//! with a resumed TLS session, and QUIC with 0-RTT; and the same for an
//! HTTP/3 POST (cold, resumed, 0-RTT) (docs/zero-rtt.md).
//!
//! It extends the time-to-broker measurement of "A Pure HTTP/3 Alternative
//! to MQTT-over-QUIC in Resource-Constrained IoT" (the Drift paper), which
//! set 0-RTT aside as affecting both protocols equally.
//!
//! The broker (quichub's gateway: MQTT over TCP, over TLS and over QUIC on the
//! relay endpoint, exactly as `quichub relay` serves them) runs in the
//! emulator's server namespace; the client in the client namespace, across a
//! link with a fixed RTT and no loss. Both sides are threads of this process,
//! so one monotonic clock times both ends: the client notes its start just
//! before it creates its socket, the broker's tap notes when the PUBLISH is
//! routed (CONNECT already processed). Every client sends CONNECT and a QoS 1
//! PUBLISH without waiting for CONNACK (a QoS 1 PUBLISH is what the broker
//! runs from 0-RTT data before the handshake completes).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{mpsc as smpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use quichub_netem::model::LinkConfig;
use quichub_netem::profile::Profile;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::common::mqtt::{self, PacketReader};
use crate::common::rt::{runtime, step, STEP};
use crate::common::stats::Spread;
use crate::common::studies::DRIFT;
use crate::common::svg::{category_chart, CatSeries, COLORS};
use crate::common::Options;

/// Options of `quichub-lab zero-rtt`.
#[derive(clap::Args, Debug, Clone)]
pub struct ZeroRttArgs {
    /// Round-trip times of the links, ms, comma-separated (default 50,200,
    /// or 50 with --quick).
    #[arg(long)]
    pub rtts: Option<String>,
}

/// The RTTs (ms) of the zero-rtt experiment's links.
pub fn rtts(args: &Options, z: &ZeroRttArgs) -> anyhow::Result<Vec<u64>> {
    let s = z
        .rtts
        .clone()
        .unwrap_or_else(|| if args.quick { "50" } else { "50,200" }.into());
    let rtts = s
        .split(',')
        .map(|r| {
            let v: u64 = r
                .trim()
                .parse()
                .with_context(|| format!("bad RTT {r:?}: use ms, e.g. 50"))?;
            anyhow::ensure!((2..=5000).contains(&v), "RTT {v} ms out of [2, 5000]");
            Ok(v)
        })
        .collect::<anyhow::Result<Vec<u64>>>()?;
    anyhow::ensure!(!rtts.is_empty(), "no RTTs");
    Ok(rtts)
}

/// One way of connecting and publishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Mode {
    /// MQTT over TCP: SYN, then CONNECT + PUBLISH.
    Tcp,
    /// MQTT over TLS 1.3 (full handshake) over TCP.
    Tls,
    /// MQTT over QUIC, no ticket: full handshake, then CONNECT + PUBLISH.
    QuicCold,
    /// MQTT over QUIC resuming a TLS session (PSK), no early data.
    QuicResumed,
    /// MQTT over QUIC resuming with 0-RTT: CONNECT + PUBLISH as early data.
    Quic0Rtt,
    /// HTTP/3 POST, no ticket: full handshake, then the request.
    H3Cold,
    /// HTTP/3 POST resuming a TLS session, no early data.
    H3Resumed,
    /// HTTP/3 POST resuming with 0-RTT: the request as early data.
    H30Rtt,
}

impl Mode {
    /// Every mode, in table order.
    pub const ALL: [Mode; 8] = [
        Mode::Tcp,
        Mode::Tls,
        Mode::QuicCold,
        Mode::QuicResumed,
        Mode::Quic0Rtt,
        Mode::H3Cold,
        Mode::H3Resumed,
        Mode::H30Rtt,
    ];

    /// Label in tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Tcp => "mqtt-tcp",
            Mode::Tls => "mqtt-tls",
            Mode::QuicCold => "mqtt-quic-cold",
            Mode::QuicResumed => "mqtt-quic-resumed",
            Mode::Quic0Rtt => "mqtt-quic-0rtt",
            Mode::H3Cold => "http3-cold",
            Mode::H3Resumed => "http3-resumed",
            Mode::H30Rtt => "http3-0rtt",
        }
    }

    /// Round trips a textbook client needs before the PUBLISH arrives.
    pub fn expected_rtts(self) -> f64 {
        match self {
            Mode::Tcp | Mode::QuicCold | Mode::QuicResumed => 1.5,
            Mode::H3Cold | Mode::H3Resumed => 1.5,
            Mode::Tls => 2.5,
            Mode::Quic0Rtt | Mode::H30Rtt => 0.5,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Mode::Tcp => "TCP handshake (1 RTT), then CONNECT + PUBLISH (½ RTT)",
            Mode::Tls => "TCP handshake (1 RTT), TLS 1.3 full handshake (1 RTT), then CONNECT + PUBLISH with the client Finished (½ RTT)",
            Mode::QuicCold => "QUIC + TLS 1.3 full handshake (1 RTT), then CONNECT + PUBLISH with the client Finished (½ RTT)",
            Mode::QuicResumed => "as cold, resuming the TLS session of an earlier connection (PSK) without early data",
            Mode::Quic0Rtt => "resumed session, CONNECT + PUBLISH as 0-RTT data in the first flight (½ RTT)",
            Mode::H3Cold => "HTTP/3 `POST /v1/t/{topic}`: QUIC + TLS 1.3 full handshake (1 RTT), then SETTINGS + the request with the client Finished (½ RTT)",
            Mode::H3Resumed => "as http3-cold, resuming the TLS session of an earlier connection without early data",
            Mode::H30Rtt => "resumed session, SETTINGS + the POST as 0-RTT data in the first flight (½ RTT)",
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Link name.
    pub link: String,
    /// The link's round-trip time, ms.
    pub rtt_ms: f64,
    /// Mode label.
    pub mode: &'static str,
    /// Repetition.
    pub rep: u32,
    /// Client start → PUBLISH routed by the broker, ms.
    pub publish_ms: Option<f64>,
    /// Client start → PUBACK back at the client, ms.
    pub puback_ms: Option<f64>,
    /// For the QUIC modes: whether the connection went 0-RTT and the server
    /// took the early data.
    pub zero_rtt: Option<bool>,
    /// Why the run failed.
    pub error: Option<String>,
}

impl RunRecord {
    /// A progress line.
    pub fn one_line(&self) -> String {
        match (&self.error, self.publish_ms) {
            (Some(e), _) => format!("{} {} rep {}: FAILED: {e}", self.link, self.mode, self.rep),
            (None, p) => format!(
                "{} {:<18} rep {}: publish at {} ms ({:.2} RTT), PUBACK at {} ms{}",
                self.link,
                self.mode,
                self.rep,
                p.map_or("–".into(), |v| format!("{v:.1}")),
                p.unwrap_or(f64::NAN) / self.rtt_ms,
                self.puback_ms.map_or("–".into(), |v| format!("{v:.1}")),
                match self.zero_rtt {
                    Some(true) => ", 0-RTT accepted",
                    _ => "",
                }
            ),
        }
    }
}

/// Aggregate of one (link, mode).
#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    /// Link name.
    pub link: String,
    /// RTT of the link, ms.
    pub rtt_ms: f64,
    /// Mode label.
    pub mode: &'static str,
    /// Successful repetitions.
    pub ok: usize,
    /// Repetitions run.
    pub reps: usize,
    /// Client start → PUBLISH at the broker, ms.
    pub publish_ms: Option<Spread>,
    /// The same in RTTs.
    pub publish_rtts: Option<Spread>,
    /// Client start → PUBACK at the client, ms.
    pub puback_ms: Option<Spread>,
    /// Textbook RTTs to the PUBLISH.
    pub expected_rtts: f64,
}

/// Everything a run writes (results.json).
#[derive(Debug, Clone, Serialize)]
pub struct Output {
    /// Experiment name.
    pub experiment: &'static str,
    /// Quick mode.
    pub quick: bool,
    /// Repetitions per (link, mode).
    pub reps: u32,
    /// Links.
    pub links: Vec<Profile>,
    /// Aggregates.
    pub summary: Vec<SummaryRow>,
    /// Every measurement.
    pub runs: Vec<RunRecord>,
}

/// A link with this RTT (half each way), no loss, no rate limit.
pub fn link(rtt_ms: u64) -> Profile {
    let one_way = Duration::from_micros(rtt_ms * 500);
    let dir = LinkConfig {
        delay: one_way,
        ..Default::default()
    };
    Profile {
        name: format!("rtt{rtt_ms}"),
        up: dir.clone(),
        down: dir,
        source: format!("lab zero-rtt: fixed {rtt_ms} ms RTT, no loss"),
    }
}

/// What the server thread tells the client thread.
struct ServerInfo {
    tcp: SocketAddr,
    tls: SocketAddr,
    quic: SocketAddr,
    fingerprint: Vec<u8>,
}

/// Topic → when the broker routed it.
type Arrivals = smpsc::Receiver<(String, Instant)>;

/// Runs every mode `reps` times on each link; returns the records.
pub fn run_links(links: &[Profile], reps: u32) -> anyhow::Result<Vec<RunRecord>> {
    let mut runs = Vec::new();
    for l in links {
        eprintln!("link {}: {}", l.name, l.describe());
        let emu = quichub_netem::emulator::Emulator::start(
            quichub_netem::emulator::EmulatorConfig::new(l.clone()),
        )
        .with_context(|| format!("starting the emulator for {}", l.name))?;
        let r = run_link(&emu, l, reps);
        emu.shutdown();
        runs.extend(r?);
    }
    Ok(runs)
}

fn run_link(
    emu: &quichub_netem::emulator::Emulator,
    link: &Profile,
    reps: u32,
) -> anyhow::Result<Vec<RunRecord>> {
    let (info_tx, info_rx) = smpsc::channel::<anyhow::Result<ServerInfo>>();
    let (arrive_tx, arrive_rx) = smpsc::channel::<(String, Instant)>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<()> {
            runtime()?.block_on(server_side(info_tx, arrive_tx, stop_rx))
        })
        .context("starting the server thread")?;
    let info = match info_rx.recv_timeout(STEP) {
        Ok(Ok(i)) => i,
        Ok(Err(e)) => return Err(e.context("server setup")),
        Err(_) => bail!("server did not start: {:?}", server.join()),
    };
    let ip = emu.server().addr();
    let info = ServerInfo {
        tcp: SocketAddr::from((ip, info.tcp.port())),
        tls: SocketAddr::from((ip, info.tls.port())),
        quic: SocketAddr::from((ip, info.quic.port())),
        fingerprint: info.fingerprint,
    };
    let rtt_ms = link.rtt().as_secs_f64() * 1000.0;
    let name = link.name.clone();
    let client = emu
        .client()
        .spawn(move || -> anyhow::Result<Vec<RunRecord>> {
            let rt = runtime()?;
            let mut out = Vec::new();
            // One unmeasured round first: lazy initialisation (TLS, sockets) stays out.
            for mode in Mode::ALL {
                let _ = rt.block_on(measure(mode, &info, &arrive_rx, "warmup"));
            }
            for rep in 0..reps {
                for mode in Mode::ALL {
                    let tag = format!("{}-{rep}", mode.label());
                    let r = rt.block_on(measure(mode, &info, &arrive_rx, &tag));
                    let rec = match r {
                        Ok(m) => RunRecord {
                            link: name.clone(),
                            rtt_ms,
                            mode: mode.label(),
                            rep,
                            publish_ms: Some(m.publish.as_secs_f64() * 1000.0),
                            puback_ms: Some(m.puback.as_secs_f64() * 1000.0),
                            zero_rtt: m.zero_rtt,
                            error: None,
                        },
                        Err(e) => RunRecord {
                            link: name.clone(),
                            rtt_ms,
                            mode: mode.label(),
                            rep,
                            publish_ms: None,
                            puback_ms: None,
                            zero_rtt: None,
                            error: Some(format!("{e:#}")),
                        },
                    };
                    eprintln!("  {}", rec.one_line());
                    out.push(rec);
                }
            }
            Ok(out)
        })
        .context("starting the client thread")?;
    let c = client
        .join()
        .map_err(|_| anyhow!("client thread panicked"))?
        .map_err(|e| anyhow!("client thread: {e}"));
    let _ = stop_tx.send(());
    let s = server
        .join()
        .map_err(|_| anyhow!("server thread panicked"))?
        .map_err(|e| anyhow!("server thread: {e}"))?;
    s.context("server")?;
    c?
}

async fn server_side(
    info: smpsc::Sender<anyhow::Result<ServerInfo>>,
    arrivals: smpsc::Sender<(String, Instant)>,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let started: anyhow::Result<_> = async {
        // What `quichub relay` runs, on every interface of the namespace
        // (anonymous clients allowed: the lab has no credentials).
        let any = "0.0.0.0:0".to_string();
        let mut config = quichub_hub::Config::default();
        config.quic.bind = any.clone();
        config.mqtt.tcp = any.clone();
        config.mqtt.tls = any;
        config.http.address = "off".into();
        config.metrics.address = "off".into();
        config.store.data_dir = Some("off".into());
        config.auth.allow_anonymous = Some(true);
        let hub = quichub_hub::Hub::start(config).await?;
        let arrivals = std::sync::Mutex::new(arrivals);
        hub.broker().set_tap(Arc::new(move |m| {
            let now = Instant::now();
            let _ = arrivals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send((m.topic.to_string(), now));
        }));
        // The HTTP/3 modes' topics.
        for m in [Mode::H3Cold, Mode::H3Resumed, Mode::H30Rtt] {
            let put =
                http::Request::put(format!("/v1/t/{}", h3_topic(m))).body(bytes::Bytes::new())?;
            let status = hub.http_api().handle(put).await.status();
            anyhow::ensure!(status.is_success(), "creating {}: {status}", h3_topic(m));
        }
        let (Some(tcp), Some(tls)) = (hub.mqtt_addr(), hub.mqtt_tls_addr()) else {
            bail!("the hub started without its MQTT listeners");
        };
        Ok((
            ServerInfo {
                tcp,
                tls,
                quic: hub.addr(),
                fingerprint: quichub_net::tls::unhex(&hub.fingerprint()).unwrap_or_default(),
            },
            hub.server().clone(),
            hub,
        ))
    }
    .await;
    match started {
        Ok((i, server, _hub)) => {
            let _ = info.send(Ok(i));
            let _ = stop.await;
            server.close(0, b"done");
            Ok(())
        }
        Err(e) => {
            let _ = info.send(Err(e));
            bail!("server setup failed")
        }
    }
}

/// One measurement's timings, from the client's start.
struct Measured {
    publish: Duration,
    puback: Duration,
    zero_rtt: Option<bool>,
}

async fn measure(
    mode: Mode,
    info: &ServerInfo,
    arrivals: &Arrivals,
    tag: &str,
) -> anyhow::Result<Measured> {
    // Arrivals of runs that failed earlier are stale.
    while arrivals.try_recv().is_ok() {}
    let topic = match mode {
        Mode::H3Cold | Mode::H3Resumed | Mode::H30Rtt => h3_topic(mode),
        _ => format!("zr/{tag}"),
    };
    let first = [connect(tag), publish(&topic, 1, tag.as_bytes())].concat();
    let verify = quichub_net::tls::Verify::Fingerprints(vec![info.fingerprint.clone()]);
    let (start, puback, zero_rtt) = match mode {
        Mode::Tcp => {
            let start = Instant::now();
            let mut s = step("TCP connect", tokio::net::TcpStream::connect(info.tcp)).await?;
            s.set_nodelay(true)?;
            s.write_all(&first).await?;
            expect_acks(&mut s).await?;
            (start, start.elapsed(), None)
        }
        Mode::Tls => {
            let config = quichub_net::client::tcp_client_config(verify, &[b"mqtt"])?;
            let start = Instant::now();
            let tcp = step("TCP connect", tokio::net::TcpStream::connect(info.tls)).await?;
            tcp.set_nodelay(true)?;
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost")?;
            let mut s = step(
                "TLS handshake",
                tokio_rustls::TlsConnector::from(config).connect(name, tcp),
            )
            .await?;
            s.write_all(&first).await?;
            s.flush().await?;
            expect_acks(&mut s).await?;
            (start, start.elapsed(), None)
        }
        Mode::H3Cold | Mode::H3Resumed | Mode::H30Rtt => {
            let bind = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
            let mut start = Instant::now();
            let client = quichub_net::client::Client::new(bind, verify)?;
            if mode != Mode::H3Cold {
                prime_h3(&client, info).await?;
                start = Instant::now();
            }
            let early = mode == Mode::H30Rtt;
            let dialed = step(
                "QUIC connect",
                client.dial(info.quic, "localhost", quichub_net::server::ALPN_H3, early),
            )
            .await?;
            let (conn, accepted) = match dialed {
                quichub_net::client::Dialed::Early { conn, accepted } => (conn, Some(accepted)),
                quichub_net::client::Dialed::Full(conn) => (conn, None),
            };
            anyhow::ensure!(accepted.is_some() == early, "0-RTT not as asked");
            let h3 = quichub_net::h3::client::Client::new(conn.clone()).await?;
            let path = format!("/v1/t/{}", h3_topic(mode));
            let no_headers = http::HeaderMap::new();
            let post = h3.request(
                &http::Method::POST,
                "localhost",
                &path,
                &no_headers,
                bytes::Bytes::copy_from_slice(tag.as_bytes()),
                4096,
            );
            let (resp, zero_rtt) = match accepted {
                Some(a) => {
                    let (r, z) = step("POST and handshake", async {
                        Ok::<_, anyhow::Error>(tokio::join!(post, a))
                    })
                    .await?;
                    (r?, Some(z))
                }
                None => (step("POST", post).await?, Some(false)),
            };
            anyhow::ensure!(resp.status == 204, "POST answered {}", resp.status);
            if early {
                anyhow::ensure!(zero_rtt == Some(true), "the server refused the 0-RTT data");
            }
            let answered = start.elapsed();
            conn.close(0u32.into(), b"");
            client.close();
            (start, answered, zero_rtt)
        }
        Mode::QuicCold | Mode::QuicResumed | Mode::Quic0Rtt => {
            let bind = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
            let mut start = Instant::now();
            let client = quichub_net::client::Client::new(bind, verify)?;
            if mode != Mode::QuicCold {
                prime(&client, info, tag).await?;
                start = Instant::now();
            }
            let early = mode == Mode::Quic0Rtt;
            let dialed = step(
                "QUIC connect",
                client.dial(
                    info.quic,
                    "localhost",
                    quichub_net::server::ALPN_MQTT,
                    early,
                ),
            )
            .await?;
            let (conn, accepted) = match dialed {
                quichub_net::client::Dialed::Early { conn, accepted } => (conn, Some(accepted)),
                quichub_net::client::Dialed::Full(conn) => (conn, None),
            };
            anyhow::ensure!(
                accepted.is_some() == early,
                "0-RTT {} though asked {}",
                if accepted.is_some() { "on" } else { "off" },
                if early { "on" } else { "off" }
            );
            let (mut send, mut recv) = step("open stream", conn.open_bi()).await?;
            send.write_all(&first).await?;
            let zero_rtt = match accepted {
                Some(a) => {
                    Some(step("handshake", async { Ok::<_, anyhow::Error>(a.await) }).await?)
                }
                None => Some(false),
            };
            if early {
                anyhow::ensure!(zero_rtt == Some(true), "the server refused the 0-RTT data");
            }
            expect_acks(&mut recv).await?;
            let puback = start.elapsed();
            send.write_all(&mqtt::disconnect()).await?;
            let _ = send.finish();
            conn.close(0u32.into(), b"");
            client.close();
            (start, puback, zero_rtt)
        }
    };
    let deadline = Instant::now() + STEP;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match arrivals.recv_timeout(left) {
            Ok((t, at)) if t == topic => {
                return Ok(Measured {
                    publish: at.saturating_duration_since(start),
                    puback,
                    zero_rtt,
                })
            }
            Ok(_) => continue,
            Err(_) => bail!("the broker never routed {topic}"),
        }
    }
}

/// A first connection that leaves a session ticket in `client`.
async fn prime(
    client: &quichub_net::client::Client,
    info: &ServerInfo,
    tag: &str,
) -> anyhow::Result<()> {
    let conn = match step(
        "priming connect",
        client.dial(
            info.quic,
            "localhost",
            quichub_net::server::ALPN_MQTT,
            false,
        ),
    )
    .await?
    {
        quichub_net::client::Dialed::Full(c) => c,
        quichub_net::client::Dialed::Early { .. } => bail!("0-RTT on a first connection"),
    };
    let (mut send, mut recv) = step("open stream", conn.open_bi()).await?;
    send.write_all(&[connect(&format!("{tag}-prime")), mqtt::pingreq()].concat())
        .await?;
    // CONNACK, then PINGRESP: a round trip after the handshake, so the
    // session tickets (sent as the handshake completes) are in.
    let mut packets = PacketReader::default();
    step("priming CONNACK", packets.next(&mut recv)).await?;
    step("priming PINGRESP", packets.next(&mut recv)).await?;
    send.write_all(&mqtt::disconnect()).await?;
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_secs(2), recv.read_to_end(64)).await;
    conn.close(0u32.into(), b"");
    Ok(())
}

/// The topic an HTTP/3 mode publishes to (created by the server beforehand:
/// `POST` needs an existing topic, and a `PUT` would cost a round trip).
fn h3_topic(mode: Mode) -> String {
    format!("zr/{}", mode.label())
}

/// A first HTTP/3 connection that leaves a session ticket in `client`.
async fn prime_h3(client: &quichub_net::client::Client, info: &ServerInfo) -> anyhow::Result<()> {
    let conn = match step(
        "priming connect",
        client.dial(info.quic, "localhost", quichub_net::server::ALPN_H3, false),
    )
    .await?
    {
        quichub_net::client::Dialed::Full(c) => c,
        quichub_net::client::Dialed::Early { .. } => bail!("0-RTT on a first connection"),
    };
    let h3 = quichub_net::h3::client::Client::new(conn.clone()).await?;
    // A round trip after the handshake, so the session tickets are in.
    let r = step(
        "priming GET",
        h3.request(
            &http::Method::GET,
            "localhost",
            "/v1/time",
            &http::HeaderMap::new(),
            bytes::Bytes::new(),
            4096,
        ),
    )
    .await?;
    anyhow::ensure!(r.status == 200, "GET /v1/time answered {}", r.status);
    conn.close(0u32.into(), b"");
    Ok(())
}

async fn expect_acks(r: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<()> {
    let mut packets = PacketReader::default();
    step("CONNACK", packets.connack(r)).await?;
    step("PUBACK", packets.puback(r)).await?;
    Ok(())
}

fn connect(client: &str) -> Vec<u8> {
    mqtt::connect(client)
}

fn publish(topic: &str, id: u16, payload: &[u8]) -> Vec<u8> {
    mqtt::publish(topic, quichub_mqtt::QoS::AtLeastOnce, id, payload)
}

impl Output {
    /// Aggregates `runs`.
    pub fn new(args: &Options, links: Vec<Profile>, runs: Vec<RunRecord>) -> Self {
        let mut summary = Vec::new();
        for l in &links {
            let rtt_ms = l.rtt().as_secs_f64() * 1000.0;
            for mode in Mode::ALL {
                let of: Vec<&RunRecord> = runs
                    .iter()
                    .filter(|r| r.link == l.name && r.mode == mode.label())
                    .collect();
                let ms: Vec<f64> = of.iter().filter_map(|r| r.publish_ms).collect();
                let rtts: Vec<f64> = ms.iter().map(|v| v / rtt_ms).collect();
                let ack: Vec<f64> = of.iter().filter_map(|r| r.puback_ms).collect();
                summary.push(SummaryRow {
                    link: l.name.clone(),
                    rtt_ms,
                    mode: mode.label(),
                    ok: ms.len(),
                    reps: of.len(),
                    publish_ms: Spread::of(&ms),
                    publish_rtts: Spread::of(&rtts),
                    puback_ms: Spread::of(&ack),
                    expected_rtts: mode.expected_rtts(),
                });
            }
        }
        Self {
            experiment: "zero-rtt",
            quick: args.quick,
            reps: args.reps,
            links,
            summary,
            runs,
        }
    }

    /// The main table (Markdown).
    pub fn main_table(&self) -> String {
        let mut o = String::from(
            "| RTT | mode | ok/reps | client start → PUBLISH at broker, ms | in RTTs | expected RTTs | → PUBACK at client, ms |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for r in &self.summary {
            o.push_str(&format!(
                "| {:.0} ms | {} | {}/{} | {} | {} | {:.1} | {} |\n",
                r.rtt_ms,
                r.mode,
                r.ok,
                r.reps,
                crate::common::stats::show(&r.publish_ms, 1),
                crate::common::stats::show(&r.publish_rtts, 2),
                r.expected_rtts,
                crate::common::stats::show(&r.puback_ms, 1),
            ));
        }
        o
    }

    fn markdown(&self) -> String {
        let mut o =
            String::from("# lab zero-rtt — time to the first MQTT PUBLISH, cold and resumed\n\n");
        o.push_str(&format!(
            "Extends the time-to-broker comparison of HTTP/3 and MQTT over QUIC in {}, which leaves \
             0-RTT out (\"expected to equally affect both\"), to cold, resumed and 0-RTT connections.\n\n",
            DRIFT.cite()
        ));
        o.push_str(&format!(
            "Time from a client's start (just before it creates its socket) to its first PUBLISH (QoS 1) being routed \
             by the broker (CONNECT already processed), measured on one clock: client in the emulator's client \
             namespace, quichub's broker (gateway) in the server namespace, fixed RTT, no loss. The client sends \
             CONNECT and PUBLISH together without waiting for CONNACK. Median [min–max] over {} repetitions per \
             mode (after one unmeasured warm-up round).{}\n\n",
            self.reps,
            if self.quick { " **Quick (CI) mode.**" } else { "" }
        ));
        o.push_str("Modes:\n\n");
        for m in Mode::ALL {
            o.push_str(&format!("- `{}`: {}.\n", m.label(), m.describe()));
        }
        o.push_str("\nLinks:\n\n");
        for l in &self.links {
            o.push_str(&format!(
                "- `{}`: {} ({})\n",
                l.name,
                crate::common::one_line(l),
                l.source
            ));
        }
        o.push_str("\n## Results\n\n");
        o.push_str(&self.main_table());
        o.push_str("\n![time to the first PUBLISH, in RTTs](publish.svg)\n");
        o.push_str(
            "\nThe 0-RTT PUBLISH is a QoS 1 one: the broker runs it before the handshake completes because \
             at-least-once delivery already tolerates the duplicate a replay could cause. A QoS 0 or QoS 2 \
             PUBLISH in 0-RTT data waits for the handshake (1.5 RTT); see docs/zero-rtt.md for the replay \
             policy. The HTTP/3 modes time a `POST /v1/t/{topic}` (204 once the broker has the message) to the same \
             broker; in 0-RTT data the API runs GET, HEAD, PUT and POST at once (a replay can at most publish a \
             message twice) and holds DELETE until the handshake completes.\n",
        );
        let failed: Vec<&RunRecord> = self.runs.iter().filter(|r| r.error.is_some()).collect();
        if !failed.is_empty() {
            o.push_str("\n## Failed runs\n\n");
            for r in failed {
                o.push_str(&format!("- {}\n", r.one_line()));
            }
        }
        o
    }

    /// Time to the PUBLISH in RTTs per mode (categories), a marker per link
    /// and the textbook figure.
    fn publish_chart(&self) -> String {
        let modes: Vec<String> = Mode::ALL.iter().map(|m| m.label().to_string()).collect();
        let mut series: Vec<CatSeries> = self
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| CatSeries {
                label: format!("{} ({:.0} ms RTT)", l.name, l.rtt().as_secs_f64() * 1000.0),
                color: COLORS[i % COLORS.len()].to_string(),
                hollow: false,
                values: Mode::ALL
                    .iter()
                    .map(|m| {
                        self.summary
                            .iter()
                            .find(|r| r.link == l.name && r.mode == m.label())
                            .and_then(|r| r.publish_rtts)
                            .map(|s| (s.median, s.min, s.max))
                    })
                    .collect(),
            })
            .collect();
        series.push(CatSeries {
            label: "textbook round trips".into(),
            color: "black".into(),
            hollow: true,
            values: Mode::ALL
                .iter()
                .map(|m| Some((m.expected_rtts(), m.expected_rtts(), m.expected_rtts())))
                .collect(),
        });
        category_chart(
            "Client start → first PUBLISH at the broker, in round trips",
            &format!(
                "fixed-RTT links, no loss; client and broker on one clock; {} repetitions after a warm-up round\n\
                 marker: median, whisker: min–max; hollow: the textbook count",
                self.reps
            ),
            "mode",
            &modes,
            "round trips (time / link RTT)",
            &series,
        )
    }

    /// Writes results.json, report.md and publish.svg into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let w = |name: &str, body: String| {
            std::fs::write(dir.join(name), body).with_context(|| format!("writing {name}"))
        };
        w("results.json", serde_json::to_string_pretty(self)?)?;
        w("publish.svg", self.publish_chart())?;
        w("report.md", self.markdown())?;
        Ok(())
    }
}

/// Runs the experiment; returns its directory and whether every run succeeded.
pub fn run(args: &Options, z: &ZeroRttArgs) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(why) = quichub_netem::privileges::missing() {
        anyhow::bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    let links: Vec<Profile> = rtts(args, z)?.into_iter().map(link).collect();
    let dir = crate::common::result_dir(&args.out, "zero-rtt")?;
    let runs = run_links(&links, args.reps)?;
    let ok = runs.iter().all(|r| r.error.is_none());
    let out = Output::new(args, links, runs);
    out.write(&dir)?;
    println!("{}", out.main_table());
    Ok((dir, ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use crate::TestCli as Cli;

    #[test]
    fn write_puts_the_plot_beside_the_report() {
        let args = Cli::try_parse_from(["lab", "zero-rtt", "--reps", "2"])
            .unwrap()
            .lab;
        let l = link(50);
        let runs: Vec<RunRecord> = (0..2)
            .flat_map(|rep| {
                Mode::ALL.iter().map(move |m| RunRecord {
                    link: "rtt50".into(),
                    rtt_ms: 50.0,
                    mode: m.label(),
                    rep,
                    publish_ms: Some(50.0 * m.expected_rtts() + rep as f64),
                    puback_ms: Some(50.0 * (m.expected_rtts() + 0.5)),
                    zero_rtt: None,
                    error: None,
                })
            })
            .collect();
        let out = Output::new(&args, vec![l], runs);
        let dir = std::env::temp_dir().join(format!("zero-rtt-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        out.write(&dir).unwrap();
        let svg = std::fs::read_to_string(dir.join("publish.svg")).unwrap();
        let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(report.contains("](publish.svg)"), "{report}");
        assert!(
            report.contains("A Pure HTTP/3 Alternative to MQTT-over-QUIC"),
            "{report}"
        );
        assert!(!report.to_lowercase().contains("seed"), "{report}");
        for m in Mode::ALL {
            assert_eq!(
                svg.matches(&format!(">{}</text>", m.label())).count(),
                1,
                "{m:?}"
            );
        }
        assert!(svg.contains("rtt50 (50 ms RTT)"), "legend");
    }
}
