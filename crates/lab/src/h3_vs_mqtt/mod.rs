//! `quichub-lab h3-vs-mqtt`: network overhead and device overhead of a publisher
//! over HTTP/3 (`POST /v1/t/{topic}`), MQTT over QUIC (single-stream and
//! multi-stream mode), MQTT over TCP, MQTT over TLS and MoQT, on the NB-IoT
//! link of "A Pure HTTP/3 Alternative to MQTT-over-QUIC in
//! Resource-Constrained IoT" (the Drift paper, its Table IV), completing its
//! comparison (time to broker, network overhead, device overhead).
//!
//! quichub's broker (the gateway, as `quichub relay` runs it) runs in the
//! emulator's server namespace; every publisher is a real client run as a
//! child process in the client namespace: quichub's own (`quichub-lab
//! h3-vs-mqtt --client ...`, MoQT included) and third-party ones (aioquic,
//! mqttv5-cli, EMQX's flowsdk through `mqtt-quic-probe`, mosquitto_pub).
//! One connection per run publishes N messages; the emulator's packet
//! capture gives bytes and packets on the wire of that connection (both
//! directions, IP bytes), `wait4` the child's CPU time and peak RSS, and the
//! broker's tap the messages that arrived and when the first did.

mod client;
mod report;
mod types;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc as smpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use quichub_netem::emulator::{Capture, Emulator, EmulatorConfig};
use quichub_netem::profile::Profile;
use tokio::sync::oneshot;

use crate::common::rt::{runtime, STEP};
use crate::common::Options;

use types::Kind;
pub use types::{CaptureTotals, ClientInfo, H3VsMqttArgs, LinkRuns, Protocol, RunRecord, Skipped};

/// The paper's Table IV link, or the quick one.
pub fn link(args: &Options, h: &H3VsMqttArgs) -> anyhow::Result<Profile> {
    let mut p = Profile::named(h.link.as_deref().unwrap_or("nb-iot"))?;
    let rtt = h.rtt_ms.or(if args.quick && h.link.is_none() {
        Some(100)
    } else {
        None
    });
    if let Some(ms) = rtt {
        anyhow::ensure!((2..=10_000).contains(&ms), "--rtt-ms out of [2, 10000]");
        let half = Duration::from_micros(ms * 500);
        p.up.delay = half;
        p.down.delay = half;
        p.name = format!("{}-rtt{ms}", p.name);
        p.source = format!("{}; RTT set to {ms} ms", p.source);
        p.validate()?;
    }
    Ok(p)
}

/// Publishes per connection.
pub fn counts(args: &Options, h: &H3VsMqttArgs) -> anyhow::Result<Vec<u64>> {
    let s = h.counts.clone().unwrap_or_else(|| {
        if args.quick {
            "0,1,10".into()
        } else {
            "0,1,10,100".into()
        }
    });
    let mut v = s
        .split(',')
        .map(|c| {
            let n: u64 = c
                .trim()
                .parse()
                .with_context(|| format!("bad count {c:?}"))?;
            anyhow::ensure!(n <= 1000, "count {n} above 1000");
            Ok(n)
        })
        .collect::<anyhow::Result<Vec<u64>>>()?;
    v.sort_unstable();
    v.dedup();
    anyhow::ensure!(v.iter().any(|&n| n > 0), "--counts needs a count above 0");
    Ok(v)
}

/// Where the third-party tools live.
struct Tools {
    python: PathBuf,
    bin: PathBuf,
}

fn tools() -> Tools {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let dir = std::env::var_os("QUICHUB_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache/quichub/tools"));
    Tools {
        python: std::env::var_os("QUICHUB_MQTT_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("py/bin/python")),
        bin: dir.join("bin"),
    }
}

fn runs_ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every client, the ones whose tool is missing as [`Skipped`].
pub fn clients(quichub: &Path, scratch: &Path) -> anyhow::Result<(Vec<ClientInfo>, Vec<Skipped>)> {
    let t = tools();
    let mut ok = Vec::new();
    let mut skipped = Vec::new();
    let mut add = |protocol: Protocol,
                   implementation: &'static str,
                   how: &str,
                   zero: bool,
                   kind: Result<Kind, String>| {
        let label = format!("{}-{implementation}", protocol.label());
        match kind {
            Ok(kind) => ok.push(ClientInfo {
                label,
                protocol,
                implementation,
                how: how.into(),
                zero,
                max_n: None,
                kind,
            }),
            Err(reason) => skipped.push(Skipped { label, reason }),
        }
    };
    let own = Ok(Kind::Own(quichub.to_path_buf()));
    // aioquic's client, the gateway tests' script (written out for the run).
    let aioquic = if runs_ok(Command::new(&t.python).args(["-c", "import aioquic"])) {
        let script = scratch.join("h3_client.py");
        std::fs::write(&script, H3_CLIENT_PY)?;
        Ok(Kind::Aioquic(script))
    } else {
        Err(format!(
            "no python with aioquic at {} (scripts/install-mqtt-tools.sh)",
            t.python.display()
        ))
    };
    let mqttv5 = t.bin.join("mqttv5");
    let have_mqttv5 = runs_ok(Command::new(&mqttv5).arg("--version"));
    let no_mqttv5 = format!(
        "{} missing (scripts/install-mqtt-tools.sh)",
        mqttv5.display()
    );
    let probe = t.bin.join("mqtt-quic-probe");
    let have_probe = runs_ok(Command::new(&probe).arg("--version-info"));
    let have_mosquitto = Command::new("mosquitto_pub").arg("--help").output().is_ok();
    let mosq = |tls| {
        if have_mosquitto {
            Ok(Kind::Mosquitto { tls })
        } else {
            Err("mosquitto_pub not on PATH (apt-get install mosquitto-clients)".into())
        }
    };

    add(
        Protocol::Http3,
        "quichub",
        "quichub's HTTP/3 client (quinn): one POST per message, all at once",
        true,
        own.clone(),
    );
    add(
        Protocol::Http3,
        "aioquic",
        "aioquic 1.2 H3Connection (Python): one POST per message, all at once",
        true,
        aioquic,
    );
    add(
        Protocol::MqttQuicSingle,
        "quichub",
        "quichub's MQTT 3.1.1 over quinn, one stream: CONNECT and every PUBLISH (QoS 1) at once",
        true,
        own.clone(),
    );
    add(
        Protocol::MqttQuicSingle,
        "mqttv5",
        "mqttv5-cli 0.29 `pub --repeat N --interval 0` (MQTT 5, QoS 1), quics:// single-stream",
        false,
        if have_mqttv5 {
            Ok(Kind::Mqttv5 {
                bin: mqttv5.clone(),
                per_publish: false,
            })
        } else {
            Err(no_mqttv5.clone())
        },
    );
    add(Protocol::MqttQuicMulti, "quichub", "quichub's MQTT 3.1.1 over quinn: CONNECT on the control stream, then each PUBLISH (QoS 1) on its own stream", true, own.clone());
    add(
        Protocol::MqttQuicMulti,
        "flowsdk",
        "mqtt-quic-probe around EMQX's flowsdk QuicMqttEngine (MQTT 3.1.1, QoS 1): a data stream per PUBLISH",
        true,
        if have_probe {
            Ok(Kind::Probe(probe.clone()))
        } else {
            Err(format!("{} missing (scripts/install-mqtt-tools.sh)", probe.display()))
        },
    );
    add(
        Protocol::MqttQuicMulti,
        "mqttv5",
        "mqttv5-cli 0.29 `pub --repeat N --interval 0 --quic-stream-strategy per-publish` (MQTT 5, QoS 1)",
        false,
        if have_mqttv5 { Ok(Kind::Mqttv5 { bin: mqttv5, per_publish: true }) } else { Err(no_mqttv5) },
    );
    add(
        Protocol::MqttTcp,
        "quichub",
        "quichub's MQTT 3.1.1 over TCP: CONNECT and every PUBLISH (QoS 1) at once",
        true,
        own.clone(),
    );
    add(
        Protocol::MqttTcp,
        "mosquitto",
        "mosquitto_pub 2 `-l` (MQTT 3.1.1, QoS 1, one message per stdin line, 20 in flight)",
        true,
        mosq(false),
    );
    add(
        Protocol::MqttTls,
        "quichub",
        "quichub's MQTT 3.1.1 over TLS 1.3 (rustls): CONNECT and every PUBLISH (QoS 1) at once",
        true,
        own,
    );
    add(
        Protocol::MqttTls,
        "mosquitto",
        "mosquitto_pub 2 `-l --cafile` (OpenSSL, MQTT 3.1.1, QoS 1, 20 in flight)",
        true,
        mosq(true),
    );
    add(
        Protocol::Moqt,
        "quichub",
        "quichub's MoQT publisher, as `quichub pub --profile stdin`: one object per line on one subgroup stream, PUBLISH (push); its stdin is held open until the broker has every object, so its process lives for the whole run as the other clients' do",
        true,
        Ok(Kind::OwnMoqt(quichub.to_path_buf())),
    );
    for c in ok.iter_mut().filter(|c| c.implementation == "mqttv5") {
        c.max_n = Some((
            10,
            "mqttv5 `pub --repeat` sends the next message only after the previous one's PUBACK: one RTT per \
             message, 200 s for 100 on NB-IoT",
        ));
    }
    skipped.push(Skipped {
        label: "moqt-third-party".into(),
        reason: "no third-party MoQT client here publishes arbitrary messages: moq-dev's `moq import` takes media containers only".into(),
    });
    Ok((ok, skipped))
}

/// aioquic's HTTP/3 client from the gateway tests.
const H3_CLIENT_PY: &str = include_str!("../../../testkit/py/h3_client.py");

/// What the broker's thread tells the experiment.
struct ServerInfo {
    tcp: u16,
    tls: u16,
    quic: u16,
}

/// Topic → (messages routed, first arrival).
type Arrivals = Arc<Mutex<HashMap<String, (u64, Option<Instant>)>>>;

fn topic(c: &ClientInfo) -> String {
    format!("hvm/{}", c.label)
}

/// The topic of one run, its own: messages a client sent twice can still
/// be on the link when its next run starts, and a relay refuses a second
/// MoQT PUBLISH of a track whose earlier session's close is still on its way
/// over a 2 s RTT.
fn run_topic(c: &ClientInfo, n: u64, rep: u32) -> String {
    format!("{}/r{rep}n{n}", topic(c))
}

async fn server_side(
    dir: PathBuf,
    topics: Vec<String>,
    arrivals: Arrivals,
    info: smpsc::Sender<anyhow::Result<ServerInfo>>,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let started: anyhow::Result<_> = async {
        let any = "0.0.0.0:0".to_string();
        let mut config = quichub_hub::Config::default();
        config.quic.bind = any.clone();
        config.mqtt.tcp = any.clone();
        config.mqtt.tls = any;
        config.http.address = "off".into();
        config.metrics.address = "off".into();
        config.store.data_dir = Some("off".into());
        config.auth.allow_anonymous = Some(true);
        config.tls.cert = Some(dir.join("cert.pem"));
        config.tls.key = Some(dir.join("key.pem"));
        let hub = quichub_hub::Hub::start(config).await?;
        for t in &topics {
            let put = http::Request::put(format!("/v1/t/{t}")).body(bytes::Bytes::new())?;
            let status = hub.http_api().handle(put).await.status();
            anyhow::ensure!(status.is_success(), "creating {t}: {status}");
        }
        // Replaces the MoQT bridge's tap (nothing here subscribes over
        // MoQT); MoQT-published `mqtt/...` tracks still reach the broker.
        let arrivals_moqt = arrivals.clone();
        hub.broker().set_tap(Arc::new(move |m| {
            let now = Instant::now();
            let mut a = arrivals.lock().unwrap_or_else(|e| e.into_inner());
            let e = a.entry(m.topic.to_string()).or_insert((0, None));
            e.0 += 1;
            e.1.get_or_insert(now);
        }));
        let (Some(tcp), Some(tls)) = (hub.mqtt_addr(), hub.mqtt_tls_addr()) else {
            bail!("the hub started without its MQTT listeners");
        };
        // The tap does not see messages that came in over MoQT: count those
        // with an MQTT subscriber on the server's own loopback (off the link).
        let moqt: Vec<String> = topics
            .iter()
            .filter(|t| t.starts_with("hvm/moqt-"))
            .map(|t| format!("{t}/#"))
            .collect();
        if !moqt.is_empty() {
            let local = SocketAddr::from(([127, 0, 0, 1], tcp.port()));
            let counter = moqt_counter(local, moqt, arrivals_moqt);
            tokio::spawn(async move {
                if let Err(e) = counter.await {
                    tracing::warn!("MoQT message counter: {e:#}");
                }
            });
        }
        Ok((
            ServerInfo {
                tcp: tcp.port(),
                tls: tls.port(),
                quic: hub.addr().port(),
            },
            hub,
        ))
    }
    .await;
    match started {
        Ok((i, hub)) => {
            let _ = info.send(Ok(i));
            let _ = stop.await;
            hub.server().close(0, b"done");
            Ok(())
        }
        Err(e) => {
            let _ = info.send(Err(e));
            bail!("server setup failed")
        }
    }
}

/// Subscribes to `topics` over MQTT at `addr` and notes every message.
async fn moqt_counter(
    addr: SocketAddr,
    topics: Vec<String>,
    arrivals: Arrivals,
) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let enc = |p: quichub_mqtt::Packet| {
        let mut b = bytes::BytesMut::new();
        quichub_mqtt::encode(&p, quichub_mqtt::Version::V311, &mut b).map(|_| b.to_vec())
    };
    let connect = enc(quichub_mqtt::Packet::Connect(quichub_mqtt::Connect {
        version: quichub_mqtt::Version::V311,
        client_id: "hvm-moqt-counter".into(),
        clean_start: true,
        keep_alive: 0,
        username: None,
        password: None,
        will: None,
        properties: Default::default(),
    }))?;
    let sub = enc(quichub_mqtt::Packet::Subscribe(quichub_mqtt::Subscribe {
        packet_id: 1,
        filters: topics
            .iter()
            .map(|t| quichub_mqtt::SubscribeFilter {
                filter: t.clone(),
                options: Default::default(),
            })
            .collect(),
        properties: Default::default(),
    }))?;
    s.write_all(&[connect, sub].concat()).await?;
    loop {
        let first = s.read_u8().await?;
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let b = s.read_u8().await?;
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 || shift > 21 {
                break;
            }
        }
        let mut body = vec![0; len];
        s.read_exact(&mut body).await?;
        if first >> 4 == 3 && body.len() >= 2 {
            let tl = usize::from(u16::from_be_bytes([body[0], body[1]]));
            let topic =
                String::from_utf8_lossy(body.get(2..2 + tl).unwrap_or_default()).to_string();
            let now = Instant::now();
            let mut a = arrivals.lock().unwrap_or_else(|e| e.into_inner());
            let e = a.entry(topic).or_insert((0, None));
            e.0 += 1;
            e.1.get_or_insert(now);
        }
    }
}

/// What went wrong with aioquic's requests, from its last output line:
/// statuses other than 2xx and reset streams, counted.
fn aioquic_problems(output: &str) -> Option<String> {
    let last = output.lines().rev().find(|l| l.contains("\"responses\""))?;
    let v: serde_json::Value = serde_json::from_str(last).ok()?;
    let mut bad: std::collections::BTreeMap<String, u64> = Default::default();
    for r in v["responses"].as_array()? {
        let status = r["status"].as_u64();
        if !status.is_some_and(|s| (200..300).contains(&s)) {
            let key = match (&r["reset"], status) {
                (serde_json::Value::Null, Some(s)) => format!("status {s}"),
                (serde_json::Value::Null, None) => "no response".into(),
                (code, _) => format!("stream reset by the server (code {code})"),
            };
            *bad.entry(key).or_default() += 1;
        }
    }
    (!bad.is_empty()).then(|| {
        let parts: Vec<String> = bad.iter().map(|(k, n)| format!("{n} × {k}")).collect();
        format!("requests not answered 2xx: {}", parts.join(", "))
    })
}

/// A finished child: exit, CPU, memory.
struct ChildRun {
    ok: bool,
    wall: Duration,
    user: Duration,
    sys: Duration,
    max_rss_kib: u64,
    output: String,
}

/// Runs `cmd` with `input` on stdin, at most `limit`; its rusage from wait4.
/// `hold`, when given, keeps stdin open after `input` until it returns true
/// (or `limit` passes).
fn run_child(
    mut cmd: Command,
    input: Vec<u8>,
    hold: Option<Box<dyn Fn() -> bool + Send>>,
    limit: Duration,
    scratch: &Path,
) -> anyhow::Result<ChildRun> {
    let out_path = scratch.join("child.out");
    let out = std::fs::File::create(&out_path)?;
    cmd.stdin(Stdio::piped())
        .stdout(out.try_clone()?)
        .stderr(out);
    let start = Instant::now();
    let mut child = cmd.spawn().context("starting the client")?;
    let pid = child.id() as libc::pid_t;
    if let Some(mut stdin) = child.stdin.take() {
        // Small (at most a few hundred KiB); a writer thread keeps a slow
        // reader from blocking this one.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
            if let Some(done) = hold {
                let until = Instant::now() + limit;
                while !done() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            drop(stdin);
        });
    }
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let mut killed = false;
    loop {
        // SAFETY: pid is our child, not yet reaped; status and ru are valid.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        if r < 0 {
            bail!("wait4: {}", std::io::Error::last_os_error());
        }
        if start.elapsed() > limit && !killed {
            // SAFETY: signalling our own, unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = start.elapsed();
    // The child is reaped: keep std from waiting for it again.
    std::mem::forget(child);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok(ChildRun {
        ok: exited_ok && !killed,
        wall,
        user: tv(ru.ru_utime),
        sys: tv(ru.ru_stime),
        max_rss_kib: ru.ru_maxrss as u64,
        output: if killed {
            format!("killed after {limit:?}\n{output}")
        } else {
            output
        },
    })
}

/// The command and stdin of one run.
#[allow(clippy::too_many_arguments)]
fn command(
    c: &ClientInfo,
    ns: &quichub_netem::emulator::Namespace,
    server: std::net::Ipv4Addr,
    info: &ServerInfo,
    fingerprint: &str,
    cert: &Path,
    n: u64,
    rep: u32,
    payload: usize,
) -> (Command, Vec<u8>) {
    let t = run_topic(c, n, rep);
    let body = "x".repeat(payload);
    let lines = |n: u64| format!("{body}\n").repeat(n as usize).into_bytes();
    let quic = SocketAddr::from((server, info.quic));
    match &c.kind {
        Kind::Own(bin) => {
            let addr = match c.protocol {
                Protocol::MqttTcp => SocketAddr::from((server, info.tcp)),
                Protocol::MqttTls => SocketAddr::from((server, info.tls)),
                _ => quic,
            };
            let mut cmd = ns.command(bin);
            cmd.args(["h3-vs-mqtt", "--client", c.protocol.label_arg()])
                .args(["--server", &addr.to_string(), "--count", &n.to_string()])
                .args(["--payload", &payload.to_string(), "--topic", &t])
                .args(["--fingerprint", fingerprint])
                .env("RUST_LOG", "error");
            (cmd, Vec::new())
        }
        Kind::OwnMoqt(bin) => {
            let mut cmd = ns.command(bin);
            cmd.args(["h3-vs-mqtt", "--client", c.protocol.label_arg()])
                .args(["--server", &quic.to_string(), "--count", &n.to_string()])
                .args(["--topic", &t, "--fingerprint", fingerprint])
                .env("RUST_LOG", "error");
            (cmd, lines(n))
        }
        Kind::Aioquic(script) => {
            let py = tools().python;
            let mut cmd = ns.command(py);
            cmd.arg(script)
                .args([
                    "--host",
                    &server.to_string(),
                    "--port",
                    &info.quic.to_string(),
                ])
                .arg("--ca")
                .arg(cert);
            let reqs: Vec<serde_json::Value> = (0..n)
                .map(|_| {
                    serde_json::json!({"method": "POST", "path": format!("/v1/t/{t}"), "body": body, "timeout": 100})
                })
                .collect();
            let spec = serde_json::json!({"requests": reqs, "parallel": true});
            (cmd, spec.to_string().into_bytes())
        }
        Kind::Mqttv5 { bin, per_publish } => {
            let mut cmd = ns.command(bin);
            cmd.args([
                "pub",
                "--url",
                &format!("quics://{quic}"),
                "--non-interactive",
            ])
            .arg("--ca-cert")
            .arg(cert)
            .args(["-t", &t, "-m", &body, "-q", "1"])
            .args(["--repeat", &n.max(1).to_string(), "--interval", "0"]);
            if *per_publish {
                cmd.args(["--quic-stream-strategy", "per-publish"]);
            }
            (cmd, Vec::new())
        }
        Kind::Probe(bin) => {
            let mut cmd = ns.command(bin);
            cmd.args(["--addr", &quic.to_string(), "--ca"])
                .arg(cert)
                .args(["--version", "4", "--qos", "1", "--timeout", "100"]);
            for _ in 0..n {
                cmd.args(["--pub", &format!("{t}={body}")]);
            }
            (cmd, Vec::new())
        }
        Kind::Mosquitto { tls } => {
            let mut cmd = ns.command("mosquitto_pub");
            cmd.args(["-h", &server.to_string(), "-q", "1", "-t", &t, "-l"]);
            if *tls {
                cmd.args(["-p", &info.tls.to_string(), "--cafile"])
                    .arg(cert);
            } else {
                cmd.args(["-p", &info.tcp.to_string()]);
            }
            (cmd, lines(n))
        }
    }
}

impl Protocol {
    fn label_arg(self) -> &'static str {
        // clap's ValueEnum names are the labels.
        self.label()
    }
}

/// Runs every client `reps` times for every count on `link`.
pub fn run_link(
    link: &Profile,
    clients: &[ClientInfo],
    counts: &[u64],
    reps: u32,
    payload: usize,
    scratch: &Path,
) -> anyhow::Result<LinkRuns> {
    let ip_names = ["localhost", "10.201.0.2"];
    let id = quichub_net::tls::Identity::self_signed(&ip_names)?;
    id.write_pem(&scratch.join("cert.pem"), &scratch.join("key.pem"))?;
    let fingerprint = id.fingerprint_hex();
    let cert = scratch.join("cert.pem");
    let emu = Emulator::start(EmulatorConfig::new(link.clone()))
        .with_context(|| format!("starting the emulator for {}", link.name))?;
    let arrivals: Arrivals = Arc::default();
    let (info_tx, info_rx) = smpsc::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    // Every run's topic (HTTP/3 POSTs need it to exist), and each client's
    // prefix (the MoQT counter subscribes to `prefix/#`).
    let mut topics: Vec<String> = clients.iter().map(topic).collect();
    for c in clients.iter().filter(|c| c.protocol == Protocol::Http3) {
        for rep in 0..reps {
            for &n in counts.iter().filter(|&&n| c.runs(n)) {
                topics.push(run_topic(c, n, rep));
            }
        }
    }
    let dir = scratch.to_path_buf();
    let arr = arrivals.clone();
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<()> {
            runtime()?.block_on(server_side(dir, topics, arr, info_tx, stop_rx))
        })
        .context("starting the server thread")?;
    let info = match info_rx.recv_timeout(STEP) {
        Ok(Ok(i)) => i,
        Ok(Err(e)) => {
            emu.shutdown();
            return Err(e.context("server setup"));
        }
        Err(_) => {
            emu.shutdown();
            bail!("server did not start: {:?}", server.join());
        }
    };
    let server_ip = emu.server().addr();
    let rtt = link.rtt();
    // Longest one run may take: 100 messages of 1 KiB at 159 kbit/s take
    // 5 s, QUIC's slow start over a 2 s RTT a few round trips more.
    let limit = Duration::from_secs(60) + rtt * 20;
    emu.start_capture();
    let mut runs = Vec::new();
    let total = reps as usize
        * clients
            .iter()
            .map(|c| counts.iter().filter(|&&n| c.runs(n)).count())
            .sum::<usize>();
    for rep in 0..reps {
        for c in clients {
            for &n in counts {
                if !c.runs(n) {
                    continue;
                }
                let t = run_topic(c, n, rep);
                arrivals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&t);
                let (cmd, input) = command(
                    c,
                    emu.client(),
                    server_ip,
                    &info,
                    &fingerprint,
                    &cert,
                    n,
                    rep,
                    payload,
                );
                let t0 = emu.epoch().elapsed().as_micros() as u64;
                let start = Instant::now();
                // The MoQT publisher's stdin stays open until the broker has every
                // object, so its process (CPU, memory) spans the whole run as
                // the other clients' processes do.
                let hold: Option<Box<dyn Fn() -> bool + Send>> = matches!(c.kind, Kind::OwnMoqt(_))
                    .then(|| {
                        let (arr, t) = (arrivals.clone(), t.clone());
                        Box::new(move || {
                            arr.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get(&t)
                                .is_some_and(|a| a.0 >= n)
                                || n == 0
                        }) as Box<dyn Fn() -> bool + Send>
                    });
                let r = run_child(cmd, input, hold, limit, scratch);
                // Messages without an acknowledgement (MoQT objects) may
                // still be on their way: wait for them, a bounded time.
                let deadline = Instant::now() + rtt * 2 + Duration::from_secs(1);
                let arrived = loop {
                    let a = arrivals
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&t)
                        .copied()
                        .unwrap_or((0, None));
                    if a.0 >= n || Instant::now() > deadline {
                        break a;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                let t1 = emu.epoch().elapsed().as_micros() as u64;
                let mut rec = RunRecord {
                    client: c.label.clone(),
                    protocol: c.protocol,
                    n,
                    rep,
                    error: None,
                    delivered: arrived.0,
                    first_at_broker_ms: arrived
                        .1
                        .map(|at| at.saturating_duration_since(start).as_secs_f64() * 1000.0),
                    wall_ms: 0.0,
                    cpu_ms: 0.0,
                    user_ms: 0.0,
                    sys_ms: 0.0,
                    max_rss_kib: 0,
                    bytes_up: 0,
                    bytes_down: 0,
                    packets_up: 0,
                    packets_down: 0,
                    dropped: 0,
                    ports: Vec::new(),
                    window: (t0, t1),
                };
                match r {
                    Ok(ch) => {
                        rec.wall_ms = ch.wall.as_secs_f64() * 1000.0;
                        rec.user_ms = ch.user.as_secs_f64() * 1000.0;
                        rec.sys_ms = ch.sys.as_secs_f64() * 1000.0;
                        rec.cpu_ms = rec.user_ms + rec.sys_ms;
                        rec.max_rss_kib = ch.max_rss_kib;
                        if !ch.ok {
                            let tail: String = ch
                                .output
                                .lines()
                                .rev()
                                .take(3)
                                .collect::<Vec<_>>()
                                .join(" | ");
                            rec.error = Some(format!("client failed: {tail}"));
                        } else if let Some(e) = matches!(c.kind, Kind::Aioquic(_))
                            .then(|| aioquic_problems(&ch.output))
                            .flatten()
                        {
                            rec.error = Some(e);
                        } else if arrived.0 < n {
                            rec.error =
                                Some(format!("the broker routed {} of {n} messages", arrived.0));
                        }
                    }
                    Err(e) => rec.error = Some(format!("{e:#}")),
                }
                eprintln!("  [{}/{total}] {}", runs.len() + 1, rec.one_line_short());
                runs.push(rec);
            }
        }
    }
    // The last connection's closing packets.
    std::thread::sleep(rtt * 2 + Duration::from_millis(500));
    let capture = emu.stop_capture();
    let _ = stop_tx.send(());
    let s = server
        .join()
        .map_err(|_| anyhow!("server thread panicked"))?
        .map_err(|e| anyhow!("server thread: {e}"));
    let stats = emu.shutdown();
    s??;
    let mut totals = attribute(&capture, &mut runs);
    totals.emulator_packets = stats.up.link.packets + stats.down.link.packets;
    // Fill the progress lines' wire figures now that they are known.
    for r in &runs {
        eprintln!("  {}", r.one_line());
    }
    Ok(LinkRuns { runs, totals })
}

impl RunRecord {
    fn one_line_short(&self) -> String {
        let mut s = format!(
            "{:<26} n={:<3} rep {}: {}/{} at the broker, CPU {:.0} ms, RSS {} KiB, {:.1} s",
            self.client,
            self.n,
            self.rep,
            self.delivered,
            self.n,
            self.cpu_ms,
            self.max_rss_kib,
            self.wall_ms / 1000.0
        );
        if let Some(e) = &self.error {
            s.push_str(&format!(" FAILED: {e}"));
        }
        s
    }
}

/// How long a client port stays with its run after its last packet.
const PORT_IDLE_US: u64 = 30_000_000;

/// Gives every captured TCP/UDP packet to the run whose connection sent or
/// received it: a client port seen for the first time (or again after
/// [`PORT_IDLE_US`] of silence) belongs to the run whose window (child start
/// → its messages counted) holds that packet; later packets of the port
/// (closing handshakes after the child exited included) stay with that run.
pub fn attribute(capture: &Capture, runs: &mut [RunRecord]) -> CaptureTotals {
    let mut totals = CaptureTotals {
        missed: capture.missed,
        ..Default::default()
    };
    let mut pkts: Vec<_> = capture
        .packets
        .iter()
        .filter(|p| p.proto == 6 || p.proto == 17)
        .collect();
    pkts.sort_by_key(|p| p.t_us);
    let mut owner: HashMap<u16, (usize, u64)> = HashMap::new();
    for p in pkts {
        totals.packets += 1;
        totals.bytes += u64::from(p.len);
        let port = if p.up { p.src_port } else { p.dst_port };
        let run = match owner.get(&port) {
            Some(&(r, last)) if p.t_us.saturating_sub(last) < PORT_IDLE_US => Some(r),
            _ => runs
                .iter()
                .position(|r| r.window.0 <= p.t_us && p.t_us <= r.window.1),
        };
        let Some(i) = run else { continue };
        owner.insert(port, (i, p.t_us));
        let r = &mut runs[i];
        if !r.ports.contains(&port) {
            r.ports.push(port);
        }
        if p.up {
            r.bytes_up += u64::from(p.len);
            r.packets_up += 1;
        } else {
            r.bytes_down += u64::from(p.len);
            r.packets_down += 1;
        }
        if p.dropped {
            r.dropped += 1;
        }
        totals.attributed_packets += 1;
        totals.attributed_bytes += u64::from(p.len);
    }
    totals
}

/// `quichub-lab h3-vs-mqtt`: the experiment, or (with `--client`) one of
/// quichub's own publishers. `quichub` is the binary to run clients from
/// (this one: `quichub-lab`).
pub fn main(args: &Options, h: &H3VsMqttArgs, quichub: &Path) -> anyhow::Result<i32> {
    if h.client.is_some() {
        return client::main(h);
    }
    let (dir, ok) = run(args, h, quichub)?;
    eprintln!("results in {}", dir.display());
    Ok(if ok { 0 } else { 1 })
}

/// Runs the experiment; returns its directory and whether every run
/// succeeded. Fails, before running anything, if a third-party client is
/// missing while `QUICHUB_MQTT_PYTHON` is set (the test script's promise
/// that the tools are installed).
pub fn run(args: &Options, h: &H3VsMqttArgs, quichub: &Path) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(why) = quichub_netem::privileges::missing() {
        bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    anyhow::ensure!(
        (1..=65_000).contains(&h.payload),
        "--payload must be in [1, 65000]"
    );
    let link = link(args, h)?;
    let counts = counts(args, h)?;
    let dir = crate::common::result_dir(&args.out, "h3-vs-mqtt")?;
    let scratch = std::env::temp_dir().join(format!("quichub-h3-vs-mqtt-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = (|| {
        let (mut clients, mut skipped) = clients(quichub, &scratch)?;
        if let Some(only) = &h.clients {
            let want: Vec<&str> = only.split(',').map(str::trim).collect();
            for w in &want {
                anyhow::ensure!(
                    clients.iter().any(|c| c.label == *w) || skipped.iter().any(|s| s.label == *w),
                    "no client {w:?}"
                );
            }
            clients.retain(|c| want.contains(&c.label.as_str()));
            skipped.retain(|s| want.contains(&s.label.as_str()));
        }
        let required = std::env::var_os("QUICHUB_MQTT_PYTHON").is_some();
        for s in &skipped {
            if required && s.label != "moqt-third-party" {
                bail!("QUICHUB_MQTT_PYTHON is set but {}: {}", s.label, s.reason);
            }
            eprintln!("SKIPPED client {}: {}", s.label, s.reason);
        }
        eprintln!("link {}: {}", link.name, link.describe());
        let started = Instant::now();
        let r = run_link(&link, &clients, &counts, args.reps, h.payload, &scratch)?;
        let out = report::Output::new(
            args,
            link.clone(),
            counts.clone(),
            h.payload,
            clients,
            skipped,
            r,
            started.elapsed().as_secs_f64(),
        );
        out.write(&dir)?;
        println!("{}", out.main_table());
        Ok(out.runs.iter().all(|r| r.error.is_none()))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    Ok((dir, result?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quichub_netem::emulator::PacketRecord;

    fn rec(w: (u64, u64)) -> RunRecord {
        RunRecord {
            client: "c".into(),
            protocol: Protocol::MqttTcp,
            n: 1,
            rep: 0,
            error: None,
            delivered: 1,
            first_at_broker_ms: None,
            wall_ms: 0.0,
            cpu_ms: 0.0,
            user_ms: 0.0,
            sys_ms: 0.0,
            max_rss_kib: 0,
            bytes_up: 0,
            bytes_down: 0,
            packets_up: 0,
            packets_down: 0,
            dropped: 0,
            ports: Vec::new(),
            window: w,
        }
    }

    fn pkt(t_us: u64, up: bool, port: u16, len: u32) -> PacketRecord {
        PacketRecord {
            t_us,
            up,
            len,
            proto: 17,
            src_port: if up { port } else { 4443 },
            dst_port: if up { 4443 } else { port },
            dropped: false,
        }
    }

    #[test]
    fn packets_go_to_the_run_of_their_port() {
        let mut runs = vec![rec((100, 200)), rec((300, 400))];
        let cap = Capture {
            packets: vec![
                pkt(110, true, 5000, 1200),
                pkt(150, false, 5000, 1000),
                // run 0's closing packet, inside run 1's window
                pkt(310, true, 5000, 50),
                pkt(320, true, 6000, 1200),
                pkt(390, false, 6000, 300),
                // between windows, unknown port: nobody's
                pkt(250, true, 7000, 99),
            ],
            missed: 0,
        };
        let t = attribute(&cap, &mut runs);
        assert_eq!((runs[0].bytes_up, runs[0].bytes_down), (1250, 1000));
        assert_eq!((runs[0].packets_up, runs[0].packets_down), (2, 1));
        assert_eq!((runs[1].bytes(), runs[1].packets()), (1500, 2));
        assert_eq!(runs[0].ports, [5000]);
        assert_eq!(t.packets, 6);
        assert_eq!(t.attributed_packets, 5);
        assert_eq!(t.bytes - t.attributed_bytes, 99);
    }

    #[test]
    fn counts_and_link() {
        use clap::Parser;
        let a = crate::TestCli::try_parse_from(["lab", "h3-vs-mqtt", "--quick"])
            .unwrap()
            .lab;
        let crate::Experiment::H3VsMqtt(h) = &a.experiment else {
            panic!("h3-vs-mqtt")
        };
        assert_eq!(counts(&a, h).unwrap(), [0, 1, 10]);
        let l = link(&a, h).unwrap();
        assert_eq!(l.name, "nb-iot-rtt100");
        assert_eq!(l.rtt(), Duration::from_millis(100));
        let a = crate::TestCli::try_parse_from(["lab", "h3-vs-mqtt", "--counts", "10,0,1,10"])
            .unwrap()
            .lab;
        let crate::Experiment::H3VsMqtt(h) = &a.experiment else {
            panic!("h3-vs-mqtt")
        };
        assert_eq!(counts(&a, h).unwrap(), [0, 1, 10]);
        assert_eq!(link(&a, h).unwrap().rtt(), Duration::from_secs(2));
    }
}
