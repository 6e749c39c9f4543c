//! MQTT over QUIC (ALPN `mqtt`) on the relay's UDP port, driven by MQTT-over-QUIC
//! clients written elsewhere, from crates.io, built by
//! `scripts/install-mqtt-tools.sh` into `$QUICHUB_TOOLS/bin`:
//!
//! - `mqttv5` (crate `mqttv5-cli`, on the `mqtt5` library): single-stream mode
//!   (`quics://` URLs, every packet on one bidirectional stream);
//! - `mqtt-quic-probe` (`tools/mqtt-quic-probe`: a command line around EMQX's
//!   own SDK, `flowsdk`, whose `QuicMqttEngine` speaks EMQX's multi-stream
//!   mode): a control stream plus one data stream per SUBSCRIBE and per
//!   PUBLISH, answers and deliveries expected on the data stream;
//!
//! and mosquitto's TCP clients on the other side of the cross-protocol tests.
//! Without the tools the tests are skipped, unless `QUICHUB_MQTT_PYTHON` is set
//! (as `scripts/test.sh` does): then they fail.

use quichub_testkit as common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quichub_net::tls::Identity;
use web_transport_quinn::quinn;

/// The MQTT-over-QUIC clients, found in `$QUICHUB_TOOLS/bin` (default
/// `~/.cache/quichub/tools/bin`).
struct Tools {
    mqttv5: PathBuf,
    probe: PathBuf,
}

fn tools() -> Option<Tools> {
    let required = std::env::var_os("QUICHUB_MQTT_PYTHON").is_some();
    let dir = std::env::var_os("QUICHUB_TOOLS")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/quichub/tools")))
        .map(|d| d.join("bin"))
        .unwrap_or_default();
    let runs = |p: &Path, arg: &str| {
        Command::new(p)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let t = Tools {
        mqttv5: dir.join("mqttv5"),
        probe: dir.join("mqtt-quic-probe"),
    };
    let have_mosquitto = Command::new("mosquitto_pub").arg("--help").output().is_ok();
    let have = have_mosquitto && runs(&t.mqttv5, "--version") && runs(&t.probe, "--version-info");
    match (have, required) {
        (true, _) => Some(t),
        (false, true) => panic!(
            "QUICHUB_MQTT_PYTHON is set but {} / {} or mosquitto_pub is missing: run scripts/install-mqtt-tools.sh",
            t.mqttv5.display(),
            t.probe.display()
        ),
        (false, false) => {
            eprintln!(
                "SKIPPED: MQTT-over-QUIC clients not installed in {} (scripts/install-mqtt-tools.sh)",
                dir.display()
            );
            None
        }
    }
}

/// A relay whose endpoint also serves MQTT over QUIC, the broker bridged onto
/// it, MQTT over TCP beside, and the certificate in a PEM file for clients.
struct Gateway {
    udp: SocketAddr,
    tcp: SocketAddr,
    broker: Arc<quichub_gateway::Broker>,
    _hub: quichub_hub::Hub,
    dir: PathBuf,
    identity: Identity,
}

impl Gateway {
    /// What `quichub relay` runs (a [`quichub_hub::Hub`]) with MQTT over
    /// TCP and QUIC on loopback and the directory's certificate.
    async fn start(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("quichub-mqtt-quic-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let id = Identity::self_signed(&["localhost", "127.0.0.1"]).unwrap();
        id.write_pem(&dir.join("cert.pem"), &dir.join("key.pem"))
            .unwrap();
        let mut config = quichub_hub::Config::default();
        config.quic.bind = "127.0.0.1:0".into();
        config.mqtt.tcp = "127.0.0.1:0".into();
        config.mqtt.tls = "off".into();
        config.http.address = "off".into();
        config.metrics.address = "off".into();
        config.store.data_dir = Some("off".into());
        config.tls.cert = Some(dir.join("cert.pem"));
        config.tls.key = Some(dir.join("key.pem"));
        let hub = quichub_hub::Hub::start(config).await.unwrap();
        Self {
            udp: hub.addr(),
            tcp: hub.mqtt_addr().unwrap(),
            broker: hub.broker().clone(),
            _hub: hub,
            dir,
            identity: id,
        }
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    fn url(&self) -> String {
        format!("quics://127.0.0.1:{}", self.udp.port())
    }

    /// `mqttv5 pub` over QUIC (single-stream mode); returns its output.
    fn quic_pub(&self, t: &Tools, extra: &[&str]) -> String {
        let out = Command::new(&t.mqttv5)
            .arg("pub")
            .args(["--url", &self.url(), "--non-interactive", "--ca-cert"])
            .arg(self.cert())
            .args(extra)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "mqttv5 pub {extra:?}: {text}");
        text
    }

    /// `mqttv5 sub` over QUIC (single-stream mode), running.
    fn quic_sub(&self, t: &Tools, extra: &[&str]) -> Child {
        Command::new(&t.mqttv5)
            .arg("sub")
            .args([
                "--url",
                &self.url(),
                "--non-interactive",
                "--verbose",
                "--ca-cert",
            ])
            .arg(self.cert())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn probe(&self, t: &Tools, extra: &[&str]) -> Child {
        Command::new(&t.probe)
            .args(["--addr", &self.udp.to_string(), "--ca"])
            .arg(self.cert())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Waits until `client` has `n` subscriptions in the broker.
    async fn subscribed(&self, client: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.broker.client_subscriptions(client) != n {
            assert!(
                Instant::now() < deadline,
                "{client} never had {n} subscriptions"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (without blocking the runtime) for `child` to exit; its stdout and stderr.
async fn finish(mut child: Child, secs: u64) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let read = |r: Option<Box<dyn std::io::Read>>| {
        let mut s = String::new();
        if let Some(r) = r {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                s.push_str(&line);
                s.push('\n');
            }
        }
        s
    };
    let out = read(child.stdout.take().map(|r| Box::new(r) as _));
    let err = read(child.stderr.take().map(|r| Box::new(r) as _));
    (status.is_some_and(|s| s.success()), out, err)
}

/// The value of `key=` on the first line starting with `prefix`.
fn field(out: &str, prefix: &str, key: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_stream_qos0_and_qos1_round_trip() {
    let Some(t) = tools() else { return };
    let gw = Gateway::start("single").await;
    for (version, client) in [("5", "quic-sub-v5"), ("3.1.1", "quic-sub-v311")] {
        let sub = gw.quic_sub(
            &t,
            &[
                "-t",
                "quic/single/#",
                "-q",
                "1",
                "-n",
                "2",
                "-c",
                client,
                "--protocol-version",
                version,
            ],
        );
        gw.subscribed(client, 1).await;
        gw.quic_pub(
            &t,
            &[
                "-t",
                "quic/single/a",
                "-m",
                "zero",
                "-q",
                "0",
                "--protocol-version",
                version,
            ],
        );
        gw.quic_pub(
            &t,
            &[
                "-t",
                "quic/single/b",
                "-m",
                "one",
                "-q",
                "1",
                "--protocol-version",
                version,
            ],
        );
        let (ok, out, err) = finish(sub, 15).await;
        assert!(ok, "MQTT {version} subscriber: {out}{err}");
        assert!(out.contains("quic/single/a: zero"), "{out}");
        assert!(out.contains("quic/single/b: one"), "{out}");
        // The QUIC connection ended: its clean session is gone from the broker.
        let deadline = Instant::now() + Duration::from_secs(5);
        while gw.broker.client_subscriptions(client) != 0 {
            assert!(
                Instant::now() < deadline,
                "{client}'s session outlived its connection"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_publisher_reaches_tcp_subscriber() {
    let Some(t) = tools() else { return };
    let gw = Gateway::start("q2t").await;
    let sub = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &gw.tcp.port().to_string()])
        .args([
            "-t",
            "cross/q2t/#",
            "-q",
            "1",
            "-C",
            "2",
            "-v",
            "-i",
            "tcp-sub",
            "-W",
            "15",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    gw.subscribed("tcp-sub", 1).await;
    gw.quic_pub(&t, &["-t", "cross/q2t/a", "-m", "over-quic-0", "-q", "0"]);
    gw.quic_pub(&t, &["-t", "cross/q2t/b", "-m", "over-quic-1", "-q", "1"]);
    let (ok, out, err) = finish(sub, 15).await;
    assert!(ok, "mosquitto_sub: {out}{err}");
    assert!(out.contains("cross/q2t/a over-quic-0"), "{out}");
    assert!(out.contains("cross/q2t/b over-quic-1"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_publisher_reaches_quic_subscriber() {
    let Some(t) = tools() else { return };
    let gw = Gateway::start("t2q").await;
    let sub = gw.quic_sub(
        &t,
        &["-t", "cross/t2q/#", "-q", "1", "-n", "2", "-c", "quic-sub"],
    );
    gw.subscribed("quic-sub", 1).await;
    for (q, m) in [("0", "over-tcp-0"), ("1", "over-tcp-1")] {
        let st = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &gw.tcp.port().to_string()])
            .args(["-t", "cross/t2q/x", "-m", m, "-q", q])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let (ok, out, err) = finish(sub, 15).await;
    assert!(ok, "mqttv5 sub: {out}{err}");
    assert!(out.contains("cross/t2q/x: over-tcp-0"), "{out}");
    assert!(out.contains("cross/t2q/x: over-tcp-1"), "{out}");
}

/// EMQX multi-stream mode: SUBSCRIBE on one data stream, PUBLISH on another;
/// the SUBACK and the delivery come back on the subscription's stream, the
/// publish acknowledgement on the publish's stream (the probe waits for each
/// on the stream it expects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_stream_answers_on_the_request_stream() {
    let Some(t) = tools() else { return };
    let gw = Gateway::start("multi").await;
    for qos in ["0", "1", "2"] {
        let topic = format!("multi/q{qos}/a");
        let probe = gw.probe(
            &t,
            &[
                "--qos",
                qos,
                "--sub",
                "multi/#",
                "--pub",
                &format!("{topic}=hello-{qos}"),
                "--count",
                "1",
                "--timeout",
                "10",
            ],
        );
        let (ok, out, err) = finish(probe, 15).await;
        assert!(ok, "probe QoS {qos}: {out}{err}");
        let control = field(&out, "connected", "control");
        let sub_stream = field(&out, "subscribed multi/#", "stream");
        let pub_stream = field(&out, &format!("published {topic}"), "stream");
        let got = field(&out, "message", "stream");
        assert_ne!(sub_stream, control, "{out}");
        assert_ne!(pub_stream, sub_stream, "{out}");
        assert_eq!(
            got, sub_stream,
            "delivered on the subscription's stream: {out}"
        );
        assert!(out.contains(&format!("{topic} hello-{qos}")), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_stream_cross_protocol() {
    let Some(t) = tools() else { return };
    let gw = Gateway::start("multi-cross").await;
    // TCP publisher → multi-stream subscriber: delivered on its data stream.
    let probe = gw.probe(
        &t,
        &[
            "--qos",
            "1",
            "--sub",
            "mx/t2q/#",
            "--count",
            "1",
            "--timeout",
            "10",
            "--client-id",
            "probe-sub",
        ],
    );
    gw.subscribed("probe-sub", 1).await;
    let st = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &gw.tcp.port().to_string()])
        .args(["-t", "mx/t2q/x", "-m", "from-tcp", "-q", "1"])
        .status()
        .unwrap();
    assert!(st.success());
    let (ok, out, err) = finish(probe, 15).await;
    assert!(ok, "probe: {out}{err}");
    assert_eq!(
        field(&out, "message", "stream"),
        field(&out, "subscribed mx/t2q/#", "stream"),
        "{out}"
    );
    assert!(out.contains("mx/t2q/x from-tcp"), "{out}");

    // Multi-stream publisher → TCP subscriber.
    let sub = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &gw.tcp.port().to_string()])
        .args([
            "-t", "mx/q2t/#", "-q", "1", "-C", "1", "-v", "-i", "tcp-sub2", "-W", "15",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    gw.subscribed("tcp-sub2", 1).await;
    let probe = gw.probe(
        &t,
        &[
            "--qos",
            "1",
            "--pub",
            "mx/q2t/y=from-quic",
            "--timeout",
            "10",
        ],
    );
    let (ok, pout, perr) = finish(probe, 15).await;
    assert!(ok, "probe: {pout}{perr}");
    let (ok, out, err) = finish(sub, 15).await;
    assert!(ok, "mosquitto_sub: {out}{err}");
    assert!(out.contains("mx/q2t/y from-quic"), "{out}");
}

/// A bare QUIC connection with ALPN `mqtt` that trusts the gateway's certificate.
async fn raw_quic(gw: &Gateway) -> quinn::Connection {
    use quinn::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(gw.identity.chain[0].clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(quichub_net::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"mqtt".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    ep.connect(gw.udp, "localhost").unwrap().await.unwrap()
}

async fn send(s: &mut quinn::SendStream, p: &quichub_mqtt::Packet) {
    let mut b = bytes::BytesMut::new();
    quichub_mqtt::encode(p, quichub_mqtt::Version::V5, &mut b).unwrap();
    s.write_all(&b).await.unwrap();
}

async fn recv(r: &mut quinn::RecvStream, buf: &mut bytes::BytesMut) -> quichub_mqtt::Packet {
    loop {
        if let Some(p) =
            quichub_mqtt::decode(buf, Some(quichub_mqtt::Version::V5), usize::MAX).unwrap()
        {
            return p;
        }
        let chunk = common::within(5, r.read_chunk(4096, true))
            .await
            .unwrap()
            .expect("stream ended");
        buf.extend_from_slice(&chunk.bytes);
    }
}

/// Multi-stream rules that need no third-party client: a SUBSCRIBE on a data
/// stream is answered there, and closing the control stream ends the
/// connection and the session (hand-made packets, our own codec).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_stream_end_ends_the_connection_and_session() {
    use quichub_mqtt::{Connect, Packet, Properties, Subscribe, SubscribeFilter};
    let gw = Gateway::start("control").await;
    let conn = raw_quic(&gw).await;
    let (mut ctl_tx, mut ctl_rx) = conn.open_bi().await.unwrap();
    let connect = Connect {
        version: quichub_mqtt::Version::V5,
        client_id: "raw-multi".into(),
        clean_start: true,
        keep_alive: 30,
        username: None,
        password: None,
        will: None,
        properties: Properties::default(),
    };
    send(&mut ctl_tx, &Packet::Connect(connect)).await;
    let mut cbuf = bytes::BytesMut::new();
    assert!(matches!(
        recv(&mut ctl_rx, &mut cbuf).await,
        Packet::ConnAck(a) if a.code == 0
    ));
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    let sub = Subscribe {
        packet_id: 7,
        filters: vec![SubscribeFilter {
            filter: "raw/#".into(),
            options: Default::default(),
        }],
        properties: Properties::default(),
    };
    send(&mut tx, &Packet::Subscribe(sub)).await;
    let mut dbuf = bytes::BytesMut::new();
    match recv(&mut rx, &mut dbuf).await {
        Packet::SubAck(a) => assert_eq!(a.packet_id, 7),
        p => panic!("expected SUBACK on the data stream, got {}", p.name()),
    }
    assert_eq!(gw.broker.client_subscriptions("raw-multi"), 1);
    // Ending the control stream ends the connection ...
    ctl_tx.finish().unwrap();
    common::within(5, conn.closed()).await;
    // ... and the clean session with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while gw.broker.client_subscriptions("raw-multi") != 0 {
        assert!(Instant::now() < deadline, "session outlived its connection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
