//! Shared helpers for end-to-end tests: an in-process relay on an OS-assigned
//! loopback port, client sessions, and raw transport sessions for sending
//! malformed input.

#![allow(dead_code)]

pub mod etcd;
pub mod media;
pub mod pki;
pub mod raw_mqtt;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quichub_client::{ClientSession, ConnectOptions, Verify};
use quichub_hub::Hub;
use quichub_net::server::Server;
use quichub_relay::{Config, Relay};

/// What `quichub relay` starts ([`Hub::start`]), on OS-assigned loopback
/// ports, with no state on disk and the listeners a test does not ask for off.
pub fn test_config() -> quichub_hub::Config {
    let mut c = quichub_hub::Config::default();
    c.quic.bind = "127.0.0.1:0".into();
    c.quic.http3 = false;
    c.mqtt.tcp = "off".into();
    c.mqtt.tls = "off".into();
    c.http.address = "off".into();
    c.metrics.address = "off".into();
    c.store.data_dir = Some("off".into());
    c
}

pub struct TestRelay {
    pub addr: SocketAddr,
    pub relay: Arc<Relay>,
    pub server: Arc<Server>,
    pub fingerprint: Vec<u8>,
    pub hub: Arc<Hub>,
}

impl TestRelay {
    pub async fn start() -> Self {
        Self::with_config(Config::default()).await
    }

    pub async fn with_config(config: Config) -> Self {
        Self::with_quic(config, quichub_net::QuicConfig::default()).await
    }

    /// A relay with these relay and QUIC limits.
    pub async fn with_quic(config: Config, quic: quichub_net::QuicConfig) -> Self {
        let mut c = test_config();
        c.relay = config;
        c.quic.limits = quic;
        Self::with_hub_config(c).await
    }

    /// A hub started with `config` (see [`test_config`]).
    pub async fn with_hub_config(config: quichub_hub::Config) -> Self {
        let hub = Hub::start(config).await.unwrap();
        Self {
            addr: hub.addr(),
            relay: hub.relay().clone(),
            server: hub.server().clone(),
            fingerprint: quichub_net::tls::unhex(&hub.fingerprint()).unwrap(),
            hub: Arc::new(hub),
        }
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}/test", self.addr.port())
    }

    pub fn opts(&self) -> ConnectOptions {
        ConnectOptions {
            verify: Verify::Fingerprints(vec![self.fingerprint.clone()]),
            bind: "127.0.0.1:0".parse().unwrap(),
            timeout: Duration::from_secs(5),
            endpoint: None,
            draft: None,
        }
    }

    pub async fn client(&self, scheme: &str) -> ClientSession {
        ClientSession::connect(&self.url(scheme), self.opts())
            .await
            .unwrap()
    }

    /// A raw QUIC session with ALPN `alpn` (`moqt-16`, `moq-00`) and nothing
    /// on it: hand-made bytes of an older draft reach the relay's bridge.
    pub async fn raw_alpn(&self, alpn: &str) -> quichub_net::Session {
        let c = quichub_net::client::Client::new("127.0.0.1:0".parse().unwrap(), Verify::Insecure)
            .unwrap();
        let dialed = c
            .dial(self.addr, "localhost", alpn.as_bytes(), false)
            .await
            .unwrap();
        let conn = dialed.connection().clone();
        std::mem::forget(c);
        web_transport_quinn::Session::raw(conn).into()
    }

    /// A raw transport session with no MoQT on it, for hand-made bytes.
    pub async fn raw(&self, scheme: &str) -> quichub_net::Session {
        let c = quichub_net::client::Client::new("127.0.0.1:0".parse().unwrap(), Verify::Insecure)
            .unwrap();
        let url = url::Url::parse(&self.url(scheme)).unwrap();
        let s = c.connect(&url).await.unwrap().session;
        // Keep the endpoint alive as long as the session (leaked on purpose in tests).
        std::mem::forget(c);
        s
    }
}

/// A relay with the MQTT broker bridged onto it, MQTT on an OS-assigned TCP port
/// (and over QUIC on the relay's port).
pub struct TestGateway {
    pub relay: TestRelay,
    pub broker: Arc<quichub_gateway::Broker>,
    pub bridge: Arc<quichub_gateway::bridge::Bridge>,
    pub mqtt: SocketAddr,
}

impl TestGateway {
    pub async fn start() -> Self {
        Self::with(
            quichub_gateway::BrokerConfig::default(),
            quichub_gateway::ConnConfig::default(),
        )
        .await
    }

    pub async fn with(
        broker: quichub_gateway::BrokerConfig,
        conn: quichub_gateway::ConnConfig,
    ) -> Self {
        let mut c = test_config();
        c.mqtt.broker = broker;
        c.mqtt.set_conn_config(&conn);
        Self::with_hub_config(c).await
    }

    /// A gateway whose relay endpoint also serves the HTTP API over HTTP/3
    /// (ALPN `h3`, beside WebTransport).
    pub async fn with_http3(
        config: quichub_gateway::http::ApiConfig,
    ) -> (Self, Arc<quichub_gateway::http::Api>) {
        let mut c = test_config();
        c.quic.http3 = true;
        c.http.set_api_config(&config);
        let gw = Self::with_hub_config(c).await;
        let api = gw.relay.hub.http_api().clone();
        (gw, api)
    }

    /// A hub started with `config` and the broker on (MQTT over TCP on an
    /// OS-assigned port unless `config` says otherwise).
    pub async fn with_hub_config(mut config: quichub_hub::Config) -> Self {
        if config.mqtt.tcp == "off" {
            config.mqtt.tcp = "127.0.0.1:0".into();
        }
        let relay = TestRelay::with_hub_config(config).await;
        let hub = relay.hub.clone();
        Self {
            broker: hub.broker().clone(),
            bridge: hub.bridge().clone(),
            mqtt: hub.mqtt_addr().unwrap(),
            relay,
        }
    }
}

/// The third-party MQTT tools, or `None` (test skipped) when they are not
/// installed and `QUICHUB_MQTT_PYTHON` is unset; with it set (as
/// `scripts/test.sh` does) a missing tool fails the test.
pub fn mqtt_tools() -> Option<std::path::PathBuf> {
    let required = std::env::var_os("QUICHUB_MQTT_PYTHON").map(std::path::PathBuf::from);
    let python = required.clone().or_else(|| {
        std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".cache/quichub/tools/py/bin/python"))
    });
    let have_mosquitto = std::process::Command::new("mosquitto_pub")
        .arg("--help")
        .output()
        .is_ok();
    let py_ok = python.as_ref().is_some_and(|p| {
        std::process::Command::new(p)
            .args(["-c", "import paho.mqtt"])
            .status()
            .is_ok_and(|s| s.success())
    });
    match (&required, have_mosquitto && py_ok) {
        (_, true) => python,
        (Some(p), false) => panic!(
            "QUICHUB_MQTT_PYTHON={} is set but mosquitto_pub or paho-mqtt is missing: run scripts/install-mqtt-tools.sh",
            p.display()
        ),
        (None, false) => {
            eprintln!("SKIPPED: mosquitto clients / paho-mqtt not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

/// A hand-driven subscriber: a raw session that sends SETUP and one
/// SUBSCRIBE, and never reads a data stream. Returns the session, its control
/// stream and the request stream (keep them alive as long as needed).
pub struct RawSubscriber {
    pub session: quichub_net::Session,
    pub control: quichub_net::SendStream,
    pub send: quichub_net::SendStream,
    pub recv: quichub_net::RecvStream,
}

impl TestRelay {
    pub async fn raw_subscriber(&self, track: moqt::FullTrackName) -> RawSubscriber {
        use moqt::message::{Message, Subscribe};
        let session = self.raw("moqt").await;
        let mut control = session.open_uni().await.unwrap();
        let setup = moqt::session::make_setup("raw", Some("127.0.0.1"), Some("/"));
        control
            .write_all(&Message::Setup(setup).to_bytes())
            .await
            .unwrap();
        let (mut send, recv) = session.open_bi().await.unwrap();
        let sub = Message::Subscribe(Subscribe {
            request_id: 0,
            track,
            params: moqt::Parameters::default(),
        });
        send.write_all(&sub.to_bytes()).await.unwrap();
        RawSubscriber {
            session,
            control,
            send,
            recv,
        }
    }
}

/// Waits (at most `secs`) until `cond` holds.
pub async fn until_async<F: std::future::Future<Output = bool>>(
    secs: u64,
    mut cond: impl FnMut() -> F,
) {
    within(secs, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Waits (at most 15 s) until `relay` knows namespace `ns`.
pub async fn knows(relay: &TestRelay, ns: &str) {
    let ns = moqt::TrackNamespace::from_path(ns);
    until_async(15, || {
        let known = relay
            .relay
            .snapshot()
            .namespaces
            .iter()
            .any(|n| n.namespace == ns);
        async move { known }
    })
    .await;
}

/// Runs `f` with a deadline so a hung test fails instead of blocking CI.
pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test step timed out")
}

/// Waits (at most 5 s) until `track` forwards: a subscription reached its
/// publisher, so what it writes now goes out.
pub async fn until_forwarding(track: &quichub_client::LocalTrack) {
    within(5, async {
        while !track.is_forwarding() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// The application close code of a closed session, for raw QUIC and WebTransport.
pub fn close_code(e: &quichub_net::mux::Error) -> Option<u64> {
    e.application_close().map(|(code, _)| code.into())
}

/// The HTTP pub/sub API of a [`TestGateway`], HTTP/1.1 and HTTP/2 on an
/// OS-assigned loopback TCP port.
pub struct TestHttp {
    pub api: Arc<quichub_gateway::http::Api>,
    pub addr: SocketAddr,
    pub limiter: Arc<quichub_net::tcp_limits::ConnLimiter>,
}

impl TestHttp {
    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl TestGateway {
    /// Starts the HTTP API on this gateway's broker and bridge.
    pub async fn http(&self, config: quichub_gateway::http::ApiConfig) -> TestHttp {
        self.http_with(config, quichub_net::tcp_limits::TcpLimits::default())
            .await
    }

    /// Starts the HTTP API within `limits` (one listener's share).
    pub async fn http_with(
        &self,
        config: quichub_gateway::http::ApiConfig,
        limits: quichub_net::tcp_limits::TcpLimits,
    ) -> TestHttp {
        let api =
            quichub_gateway::http::Api::new(self.broker.clone(), Some(self.bridge.clone()), config);
        let limiter = limits.limiter("http", 1);
        let addr = quichub_gateway::http::tcp::spawn_tcp_with(
            "127.0.0.1:0".parse().unwrap(),
            api.clone(),
            limits,
            limiter.clone(),
        )
        .await
        .unwrap();
        TestHttp { api, addr, limiter }
    }
}

/// Whether `curl` with HTTP/2 is installed; `None` skips the test, except
/// where `QUICHUB_MQTT_PYTHON` is set (scripts/test.sh), where it fails.
pub fn curl_http2() -> Option<()> {
    let ok = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("HTTP2"));
    match (ok, std::env::var_os("QUICHUB_MQTT_PYTHON").is_some()) {
        (true, _) => Some(()),
        (false, true) => panic!("curl with HTTP2 is missing: run scripts/install-mqtt-tools.sh"),
        (false, false) => {
            eprintln!("SKIPPED: curl with HTTP/2 not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

/// Python with aioquic (the venv of scripts/install-mqtt-tools.sh), or `None`
/// (test skipped) when missing and `QUICHUB_MQTT_PYTHON` is unset; with it
/// set a missing aioquic fails the test.
pub fn h3_python() -> Option<std::path::PathBuf> {
    let required = std::env::var_os("QUICHUB_MQTT_PYTHON").map(std::path::PathBuf::from);
    let python = required.clone().or_else(|| {
        std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".cache/quichub/tools/py/bin/python"))
    })?;
    let ok = std::process::Command::new(&python)
        .args(["-c", "import aioquic.h3.connection"])
        .status()
        .is_ok_and(|s| s.success());
    match (ok, required.is_some()) {
        (true, _) => Some(python),
        (false, true) => panic!(
            "QUICHUB_MQTT_PYTHON={} is set but aioquic is missing: run scripts/install-mqtt-tools.sh",
            python.display()
        ),
        (false, false) => {
            eprintln!("SKIPPED: aioquic not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

/// A run of `tests/http3/h3_client.py` (aioquic): its JSON lines as they come.
pub struct H3Client {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl H3Client {
    /// Starts the client against UDP `port` of 127.0.0.1 with `spec` (see the
    /// script) and extra arguments (`--ticket FILE`, `--zero-rtt`).
    pub async fn start(
        python: &std::path::Path,
        port: u16,
        spec: serde_json::Value,
        args: &[&str],
    ) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let script =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/http3/h3_client.py");
        let mut child = tokio::process::Command::new(python)
            .arg(script)
            .args(["--port", &port.to_string()])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("h3_client.py");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(spec.to_string().as_bytes()).await.unwrap();
        drop(stdin);
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// Waits until response `i`'s headers have arrived.
    pub async fn ready(&mut self, i: u64) {
        within(15, async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("h3_client ended early");
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                if v["ready"] == i {
                    return;
                }
            }
        })
        .await
    }

    /// The final result: `{"early_data_accepted", "responses": [...]}`.
    pub async fn result(mut self) -> serde_json::Value {
        let v = within(30, async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                if v.get("responses").is_some() {
                    return v;
                }
            }
            panic!("h3_client ended without a result")
        })
        .await;
        let status = within(10, self.child.wait()).await.unwrap();
        assert!(status.success(), "h3_client exited with {status}");
        v
    }
}

/// One exchange's response from [`H3Client::result`].
pub fn h3_body(r: &serde_json::Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(r["body_b64"].as_str().unwrap())
        .unwrap()
}
