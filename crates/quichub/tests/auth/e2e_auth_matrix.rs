//! The table "What each configuration grants" of docs/auth.md, end to end:
//! for each `[auth]` configuration (nothing, `public`, `public_read`,
//! `password_file`, a key, `acl_file`, `allow_anonymous = false`) one hub
//! with every listener on loopback, and for each listener and each kind of
//! credential it carries, what a client may read and write of a public
//! topic (`anon/x`, the MoQT track ((`mqtt`, `anon`), `x`), public as
//! `mqtt/anon`) and of a private one (`secret/door`). The expected answers
//! are those of the model's unit test (`credential_matrix` in
//! crates/auth/src/auth/tests.rs), written out again here, so that a
//! listener that does not reach the model's answer fails this test.
//!
//! The client certificate column (CN alice, `use_identity_as_username`)
//! runs over MQTT/TLS and MQTT/QUIC on a second hub of each configuration,
//! with `tls.client_ca` and `require_certificate` (which
//! `use_identity_as_username` needs); everything else on the first, which
//! asks for no certificate.
//!
//! Clients: `mosquitto_pub`/`mosquitto_sub` (MQTT 5) over TCP and over TLS
//! (`--cafile`, `--cert`), a quinn client on our MQTT codec over QUIC,
//! `quichub_client` sessions with `?jwt=` over raw QUIC, WebTransport and
//! WebSocket, curl over HTTP/1.1 and HTTP/2 (`Authorization: Bearer`, and
//! `?jwt=` on an event stream), aioquic over HTTP/3. Certificates are made
//! by the `openssl` command line, the password file by `mosquitto_passwd`.
//!
//! Skipped (with a message) when those tools are missing and
//! `QUICHUB_MQTT_PYTHON` is unset, as the other tests using them.

use quichub_testkit as common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::mqtt::Raw;
use common::pki::Pki;
use common::{curl_http2, h3_python, mqtt_tools, within, H3Client};
use moqt::FullTrackName;
use quichub_auth::jwt::{Claims, Key};
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode, Verify,
};
use quichub_gateway::broker::{Message, Source};
use quichub_mqtt::{Packet, Properties, QoS, Version};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::sync::Semaphore;
use web_transport_quinn::quinn;
use web_transport_quinn::quinn::rustls;

/// The HMAC secret of the key the `keys` hub checks tokens with.
const SECRET: &[u8] = b"quichub-e2e-auth-matrix-hs256-secret-0123456789";

/// The public and the private topic every cell reads (each cell writes
/// topics of its own below `anon/w/` and `secret/w/`).
const PUBLIC: &str = "anon/x";
const PRIVATE: &str = "secret/door";

/// Anonymous clients read `anon/#`; alice reads and writes `secret/#`.
const ACL: &str = "topic read anon/#\nuser alice\ntopic readwrite secret/#\n";

/// The configurations, rows of [`MODEL`].
const CONFIGS: [&str; 7] = [
    "nothing",
    "public",
    "public_read",
    "password_file",
    "keys",
    "acl",
    "not_anonymous",
];

/// `credential_matrix`'s answers (crates/auth/src/auth/tests.rs), which
/// docs/auth.md's table states: per configuration, per credential (none,
/// user name only, bad password, good password, bad JWT, expired JWT, good
/// JWT as the MQTT password, good JWT over MoQT/HTTP, client certificate
/// of user alice), either the rights on (read `anon/x`, write `anon/x`,
/// read `secret/door`, write `secret/door`) or the refusal's reason.
const MODEL: [[&str; 9]; 7] = [
    ["RWRW"; 9],
    [
        "RW--", "RW--", "RW--", "RW--", "RW--", "RW--", "RW--", "RW--", "RWRW",
    ],
    [
        "R---", "R---", "R---", "R---", "R---", "R---", "R---", "R---", "RWRW",
    ],
    [
        "refused:no_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "RWRW",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:no_credentials",
        "RWRW",
    ],
    [
        "refused:no_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:bad_signature",
        "refused:expired",
        "--RW",
        "--RW",
        "RWRW",
    ],
    [
        "R---", "R---", "R---", "R---", "R---", "R---", "R---", "R---", "--RW",
    ],
    [
        "refused:no_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:bad_credentials",
        "refused:no_credentials",
        "RWRW",
    ],
];

/// What a client brings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cred {
    None,
    /// User name `mallory`, no password.
    UserOnly,
    /// alice with a wrong password.
    BadPassword,
    /// alice with her password (`s3cret`).
    GoodPassword,
    /// A token signed with another secret.
    BadJwt,
    /// A token of the right key that expired an hour ago.
    ExpiredJwt,
    /// A token of the right key: `sub` alice, `put`/`get` `mqtt/secret`.
    GoodJwt,
    /// A client certificate of the test CA, CN alice
    /// (`use_identity_as_username`).
    Cert,
}

const MQTT_CREDS: [Cred; 8] = [
    Cred::None,
    Cred::UserOnly,
    Cred::BadPassword,
    Cred::GoodPassword,
    Cred::BadJwt,
    Cred::ExpiredJwt,
    Cred::GoodJwt,
    Cred::Cert,
];

const TOKEN_CREDS: [Cred; 4] = [Cred::None, Cred::BadJwt, Cred::ExpiredJwt, Cred::GoodJwt];

impl Cred {
    fn name(self) -> &'static str {
        match self {
            Cred::None => "none",
            Cred::UserOnly => "user-only",
            Cred::BadPassword => "bad-password",
            Cred::GoodPassword => "good-password",
            Cred::BadJwt => "bad-jwt",
            Cred::ExpiredJwt => "expired-jwt",
            Cred::GoodJwt => "good-jwt",
            Cred::Cert => "certificate",
        }
    }

    /// The column of [`MODEL`]. A bad or expired token over MoQT or HTTP
    /// has the rights of the same token as an MQTT password (the model has
    /// no column of its own for them).
    fn column(self, mqtt: bool) -> usize {
        match self {
            Cred::None => 0,
            Cred::UserOnly => 1,
            Cred::BadPassword => 2,
            Cred::GoodPassword => 3,
            Cred::BadJwt => 4,
            Cred::ExpiredJwt => 5,
            Cred::GoodJwt if mqtt => 6,
            Cred::GoodJwt => 7,
            Cred::Cert => 8,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listener {
    MqttTcp,
    MqttTls,
    MqttQuic,
    MoqtQuic,
    MoqtWebTransport,
    MoqtWebSocket,
    Http1,
    Http2,
    Http3,
    /// An event stream (HTTP/1.1, `Accept: text/event-stream`) with the
    /// token in `?jwt=`: reads only.
    SseQuery,
}

const LISTENERS: [Listener; 10] = [
    Listener::MqttTcp,
    Listener::MqttTls,
    Listener::MqttQuic,
    Listener::MoqtQuic,
    Listener::MoqtWebTransport,
    Listener::MoqtWebSocket,
    Listener::Http1,
    Listener::Http2,
    Listener::Http3,
    Listener::SseQuery,
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Mqtt,
    Moqt,
    Http,
}

impl Listener {
    fn name(self) -> &'static str {
        match self {
            Listener::MqttTcp => "mqtt-tcp",
            Listener::MqttTls => "mqtt-tls",
            Listener::MqttQuic => "mqtt-quic",
            Listener::MoqtQuic => "moqt-quic",
            Listener::MoqtWebTransport => "moqt-wt",
            Listener::MoqtWebSocket => "moqt-ws",
            Listener::Http1 => "http1",
            Listener::Http2 => "http2",
            Listener::Http3 => "http3",
            Listener::SseQuery => "sse-query",
        }
    }

    fn family(self) -> Family {
        match self {
            Listener::MqttTcp | Listener::MqttTls | Listener::MqttQuic => Family::Mqtt,
            Listener::MoqtQuic | Listener::MoqtWebTransport | Listener::MoqtWebSocket => {
                Family::Moqt
            }
            _ => Family::Http,
        }
    }

    /// The credentials it carries: MQTT user/password (a JWT as the
    /// password), a JWT elsewhere. (A client certificate, over MQTT/TLS and
    /// MQTT/QUIC, is tried on a hub of its own: see [`Ctx::certs`].)
    fn creds(self) -> &'static [Cred] {
        match self.family() {
            Family::Mqtt => &MQTT_CREDS[..7],
            _ => &TOKEN_CREDS,
        }
    }
}

/// What the listener should answer, from the model: MQTT refuses at
/// CONNECT (0x87 without credentials, 0x86 for bad ones); MoQT closes the
/// session at SETUP when it brings a token that is refused (EXPIRED_AUTH_TOKEN
/// for an expired one) and refuses each request (UNAUTHORIZED) of a session
/// without one; HTTP answers 401 to a refused or anonymous request, 403 to a
/// valid token without the grant, and an allowed read of a topic the HTTP
/// registry does not have is 404 (authorised, then not found).
fn expected(config: usize, l: Listener, cred: Cred, http_topics: [bool; 2]) -> String {
    let model = MODEL[config][cred.column(l.family() == Family::Mqtt)];
    let refused = model.strip_prefix("refused:");
    match (l.family(), refused) {
        (Family::Mqtt, Some("no_credentials")) => "refused:0x87".into(),
        (Family::Mqtt, Some(_)) => "refused:0x86".into(),
        (Family::Moqt, Some(_)) if cred == Cred::None => "----".into(),
        (Family::Moqt, Some("expired")) => "closed:EXPIRED_AUTH_TOKEN (0x18)".into(),
        (Family::Moqt, Some(_)) => "closed:UNAUTHORIZED (0x2)".into(),
        (Family::Mqtt | Family::Moqt, None) => model.into(),
        (Family::Http, _) => {
            let deny = match CONFIGS[config] == "keys" && cred == Cred::GoodJwt {
                true => "-403",
                false => "-401",
            };
            let rights = refused.map_or(model, |_| "----");
            rights
                .chars()
                .enumerate()
                .map(|(i, c)| match (i % 2, c) {
                    (0, 'R') if http_topics[i / 2] => "R",
                    (0, 'R') => "R404",
                    (1, _) if l == Listener::SseQuery => ".",
                    (1, 'W') => "W",
                    _ => deny,
                })
                .collect::<Vec<_>>()
                .join(" ")
        }
    }
}

/// The files of the test (CA and certificates, password file, ACL, key),
/// and the tokens; removed when dropped.
struct Fixture {
    dir: PathBuf,
    forged: String,
    expired: String,
    good: String,
}

impl Fixture {
    fn make() -> Fixture {
        let dir = std::env::temp_dir().join(format!("quichub-auth-matrix-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let key = Key::from_secret(SECRET).unwrap();
        let sign = |key: &Key, c: Claims| key.sign(&c, None).unwrap();
        let everything = |exp| Claims {
            put: vec!["".into()],
            get: vec!["".into()],
            iat: Some(now),
            exp: Some(exp),
            ..Claims::default()
        };
        let fx = Fixture {
            forged: sign(
                &Key::from_secret(b"another secret, long enough for HS256 use").unwrap(),
                everything(now + 600),
            ),
            expired: sign(&key, everything(now - 3600)),
            good: sign(
                &key,
                Claims {
                    sub: Some("alice".into()),
                    put: vec!["mqtt/secret".into()],
                    get: vec!["mqtt/secret".into()],
                    iat: Some(now),
                    exp: Some(now + 600),
                    ..Claims::default()
                },
            ),
            dir,
        };
        std::fs::write(fx.path("hs256.secret"), SECRET).unwrap();
        std::fs::write(fx.path("acl"), ACL).unwrap();
        fx.run(
            "mosquitto_passwd",
            &["-c", "-b", "passwd", "alice", "s3cret"],
        );
        Pki::ca_in(&fx.dir)
            .server()
            .leaf("client", "/CN=alice", "extendedKeyUsage=clientAuth\n");
        fx
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = std::process::Command::new(tool)
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.join(f)
    }

    fn s(&self, f: &str) -> String {
        self.path(f).display().to_string()
    }

    /// The token `cred` brings, if it is one.
    fn token(&self, cred: Cred) -> Option<&str> {
        match cred {
            Cred::BadJwt => Some(&self.forged),
            Cred::ExpiredJwt => Some(&self.expired),
            Cred::GoodJwt => Some(&self.good),
            _ => None,
        }
    }

    /// The MQTT user name and password `cred` brings.
    fn mqtt_login(&self, cred: Cred) -> (Option<&str>, Option<&str>) {
        match cred {
            Cred::None | Cred::Cert => (None, None),
            Cred::UserOnly => (Some("mallory"), None),
            Cred::BadPassword => (Some("alice"), Some("wrong")),
            Cred::GoodPassword => (Some("alice"), Some("s3cret")),
            Cred::BadJwt | Cred::ExpiredJwt | Cred::GoodJwt => (Some("jwt"), self.token(cred)),
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One configuration's hub and what its cells share.
struct Ctx {
    config: usize,
    fx: Arc<Fixture>,
    hub: quichub_hub::Hub,
    udp: SocketAddr,
    mqtt: SocketAddr,
    mqtt_tls: SocketAddr,
    http: SocketAddr,
    fingerprint: Vec<u8>,
    /// Bounds the external processes running at once (2 shared cores).
    procs: Arc<Semaphore>,
    /// The hub that checks client certificates: `tls.client_ca`,
    /// `require_certificate` and `use_identity_as_username` (which needs
    /// `require_certificate`), where only the certificate cells run.
    certs: bool,
    python: PathBuf,
}

impl Ctx {
    async fn start(
        config: usize,
        certs: bool,
        fx: Arc<Fixture>,
        procs: Arc<Semaphore>,
        python: PathBuf,
    ) -> Ctx {
        let mut c = common::test_config();
        c.quic.http3 = true;
        c.mqtt.tcp = "127.0.0.1:0".into();
        c.mqtt.tls = "127.0.0.1:0".into();
        c.http.address = "127.0.0.1:0".into();
        c.tls.cert = Some(fx.path("server.pem"));
        c.tls.key = Some(fx.path("server.key"));
        if certs {
            c.tls.client_ca = Some(fx.path("ca.pem"));
            c.tls.require_certificate = true;
            c.tls.use_identity_as_username = true;
        }
        let a = &mut c.auth;
        match CONFIGS[config] {
            "nothing" => {}
            "public" => a.public = vec!["mqtt/anon".into()],
            "public_read" => a.public_read = vec!["mqtt/anon".into()],
            "password_file" => a.password_file = Some(fx.path("passwd")),
            "keys" => a.key = Some(fx.path("hs256.secret")),
            "acl" => a.acl_file = Some(fx.path("acl")),
            "not_anonymous" => a.allow_anonymous = Some(false),
            other => unreachable!("{other}"),
        }
        let hub = quichub_hub::Hub::start(c)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", CONFIGS[config]));
        Ctx {
            config,
            udp: hub.addr(),
            mqtt: hub.mqtt_addr().unwrap(),
            mqtt_tls: hub.mqtt_tls_addr().unwrap(),
            http: hub.http_addr().unwrap(),
            fingerprint: quichub_net::tls::unhex(&hub.fingerprint()).unwrap(),
            hub,
            fx,
            procs,
            python,
            certs,
        }
    }

    fn name(&self) -> &'static str {
        CONFIGS[self.config]
    }

    /// The topic a cell writes under `anon` or `secret`.
    fn own_topic(&self, root: &str, l: Listener, cred: Cred) -> String {
        format!("{root}/w/{}-{}-{}", self.name(), l.name(), cred.name())
    }

    fn retained(&self, topic: &str, payload: &str) -> bool {
        self.hub
            .broker()
            .retained(topic)
            .is_some_and(|m| m.payload == payload.as_bytes())
    }
}

/// The answer of one cell: four results (read and write of [`PUBLIC`],
/// read and write of [`PRIVATE`]), or the refusal of the connection; and
/// what was seen that the answer does not say.
struct Cell {
    got: String,
    notes: Vec<String>,
}

/// Four per-operation results into a cell: a refusal common to all of them
/// stands for the whole connection.
fn combine(ops: [Result<String, String>; 4], sep: &str, notes: Vec<String>) -> Cell {
    let refusals: Vec<&String> = ops.iter().filter_map(|r| r.as_ref().err()).collect();
    let got = match refusals.len() {
        0 => ops
            .iter()
            .map(|r| r.as_ref().unwrap().as_str())
            .collect::<Vec<_>>()
            .join(sep),
        4 if refusals.iter().all(|r| *r == refusals[0]) => refusals[0].clone(),
        _ => format!(
            "mixed: {}",
            ops.iter()
                .map(|r| match r {
                    Ok(s) | Err(s) => s.as_str(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Cell { got, notes }
}

// ---- MQTT over TCP and TLS: mosquitto_pub / mosquitto_sub (MQTT 5) ----

async fn mosquitto(ctx: &Ctx, tool: &str, tls: bool, cred: Cred, args: &[&str]) -> Output {
    let _running = ctx.procs.acquire().await.unwrap();
    let mut cmd = Command::new(tool);
    match tls {
        // The server certificate names localhost (and 127.0.0.1, which
        // libmosquitto does not match against IP addresses).
        true => cmd
            .args(["-h", "localhost", "-p", &ctx.mqtt_tls.port().to_string()])
            .args(["--cafile", &ctx.fx.s("ca.pem")]),
        false => cmd.args(["-h", "127.0.0.1", "-p", &ctx.mqtt.port().to_string()]),
    };
    cmd.args(["-V", "mqttv5"]);
    if cred == Cred::Cert {
        cmd.args(["--cert", &ctx.fx.s("client.pem")])
            .args(["--key", &ctx.fx.s("client.key")]);
    }
    let (user, pass) = ctx.fx.mqtt_login(cred);
    if let Some(u) = user {
        cmd.args(["-u", u]);
    }
    if let Some(p) = pass {
        cmd.args(["-P", p]);
    }
    cmd.args(args).stdin(Stdio::null()).kill_on_drop(true);
    within(30, cmd.output()).await.unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
    .trim()
    .replace('\n', " / ")
}

/// The CONNACK refusal a mosquitto client exited with (MQTT 5: the exit
/// status is the reason code).
fn mosquitto_refusal(o: &Output) -> Option<String> {
    match o.status.code() {
        Some(c @ 128..=255) => Some(format!("refused:{c:#04x}")),
        _ => None,
    }
}

async fn mosquitto_cell(ctx: Arc<Ctx>, l: Listener, cred: Cred) -> Cell {
    let tls = l == Listener::MqttTls;
    let read = |topic: &'static str| {
        let ctx = ctx.clone();
        async move {
            let o = mosquitto(
                &ctx,
                "mosquitto_sub",
                tls,
                cred,
                &["-t", topic, "-v", "-C", "1", "-W", "10"],
            )
            .await;
            if let Some(r) = mosquitto_refusal(&o) {
                return (Err(r), None);
            }
            let out = text(&o);
            if String::from_utf8_lossy(&o.stdout).starts_with(&format!("{topic} tick-")) {
                (Ok("R".into()), None)
            } else if out.contains("denied") {
                (Ok("-".into()), None)
            } else {
                (
                    Ok("?".into()),
                    Some(format!("sub {topic}: {:?} {out}", o.status)),
                )
            }
        }
    };
    let write = |root: &'static str| {
        let ctx = ctx.clone();
        async move {
            let topic = ctx.own_topic(root, l, cred);
            let payload = format!("by-{topic}");
            let o = mosquitto(
                &ctx,
                "mosquitto_pub",
                tls,
                cred,
                &["-q", "1", "-r", "-t", &topic, "-m", &payload],
            )
            .await;
            if let Some(r) = mosquitto_refusal(&o) {
                return (Err(r), None);
            }
            let out = text(&o);
            let kept = ctx.retained(&topic, &payload);
            let warned = out.contains("Not authorized");
            match (o.status.success(), kept, warned) {
                (true, true, false) => (Ok("W".into()), None),
                // MQTT 5 PUBACK 0x87: a warning to mosquitto_pub.
                (true, false, true) => (Ok("-".into()), None),
                _ => (
                    Ok("?".into()),
                    Some(format!("pub {topic}: {:?} retained {kept} {out}", o.status)),
                ),
            }
        }
    };
    let (a, b, c, d) = tokio::join!(read(PUBLIC), write("anon"), read(PRIVATE), write("secret"));
    let notes = [&a.1, &b.1, &c.1, &d.1]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    combine([a.0, b.0, c.0, d.0], "", notes)
}

// ---- MQTT over QUIC: quinn and our codec (MQTT 5) ----

fn quic_endpoint(fx: &Fixture, cert: bool) -> quinn::Endpoint {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(fx.path("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots);
    let mut tls = match cert {
        true => {
            let chain = CertificateDer::pem_file_iter(fx.path("client.pem"))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(fx.path("client.key")).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        false => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![quichub_net::server::ALPN_MQTT.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    ep
}

/// An MQTT 5 connection on one QUIC stream: the tests' client, noting
/// the topics of the PUBLISHes that arrive.
struct QuicMqtt {
    mqtt: Raw<tokio::io::Join<quinn::RecvStream, quinn::SendStream>>,
    /// Topics of the PUBLISHes received.
    seen: HashSet<String>,
}

impl QuicMqtt {
    async fn send(&mut self, p: Packet) {
        self.mqtt.send(&p).await;
    }

    /// The next packet that is not a PUBLISH (those are noted in `seen`),
    /// or `None` when the connection ends or 10 s pass.
    async fn next(&mut self) -> Option<Packet> {
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(p) = self.mqtt.try_recv_within(10).await {
                match p {
                    Packet::Publish(p) => {
                        self.seen.insert(p.topic);
                    }
                    p => return Some(p),
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }

    /// Waits (at most 10 s) for a PUBLISH on `topic`.
    async fn delivered(&mut self, topic: &str) -> bool {
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.seen.contains(topic) {
            match tokio::time::timeout_at(until, self.mqtt.try_recv_within(10)).await {
                Ok(Some(Packet::Publish(p))) => {
                    self.seen.insert(p.topic);
                }
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
        true
    }
}

async fn quic_mqtt_cell(ctx: Arc<Ctx>, cred: Cred) -> Cell {
    let l = Listener::MqttQuic;
    let ep = quic_endpoint(&ctx.fx, cred == Cred::Cert);
    let conn = match within(10, ep.connect(ctx.udp, "localhost").unwrap()).await {
        Ok(c) => c,
        Err(e) => {
            return Cell {
                got: format!("handshake failed: {e}"),
                notes: vec![],
            }
        }
    };
    let (send, recv) = conn.open_bi().await.unwrap();
    let mut m = QuicMqtt {
        mqtt: Raw::new(tokio::io::join(recv, send), Version::V5),
        seen: HashSet::new(),
    };
    let (user, pass) = ctx.fx.mqtt_login(cred);
    m.send(Packet::Connect(quichub_mqtt::Connect {
        version: Version::V5,
        client_id: format!("{}-{}", ctx.name(), cred.name()),
        clean_start: true,
        keep_alive: 30,
        username: user.map(str::to_string),
        password: pass.map(|p| Bytes::copy_from_slice(p.as_bytes())),
        will: None,
        properties: Properties::default(),
    }))
    .await;
    match m.next().await {
        Some(Packet::ConnAck(a)) if a.code == 0 => {}
        Some(Packet::ConnAck(a)) => {
            return Cell {
                got: format!("refused:{:#04x}", a.code),
                notes: vec![],
            }
        }
        other => {
            return Cell {
                got: format!("no CONNACK: {other:?}"),
                notes: vec![],
            }
        }
    }
    let mut notes = Vec::new();
    let mut got = String::new();
    for (i, (read, topic)) in [
        (true, PUBLIC.to_string()),
        (false, ctx.own_topic("anon", l, cred)),
        (true, PRIVATE.to_string()),
        (false, ctx.own_topic("secret", l, cred)),
    ]
    .into_iter()
    .enumerate()
    {
        let pid = i as u16 + 1;
        let payload = format!("by-{topic}");
        if read {
            m.send(Packet::Subscribe(quichub_mqtt::Subscribe {
                packet_id: pid,
                filters: vec![quichub_mqtt::SubscribeFilter {
                    filter: topic.clone(),
                    options: quichub_mqtt::SubscriptionOptions::default(),
                }],
                properties: Properties::default(),
            }))
            .await;
        } else {
            m.send(Packet::Publish(quichub_mqtt::Publish {
                qos: QoS::AtLeastOnce,
                retain: true,
                topic: topic.clone(),
                packet_id: Some(pid),
                payload: Bytes::from(payload.clone()),
                ..Default::default()
            }))
            .await;
        }
        let code = match m.next().await {
            Some(Packet::SubAck(a)) if read && a.packet_id == pid => a.codes[0],
            Some(Packet::PubAck(a)) if !read && a.packet_id == pid => a.code,
            other => {
                notes.push(format!("{topic}: {other:?}"));
                got.push('?');
                continue;
            }
        };
        let r = match (read, code) {
            (true, 0x87) => '-',
            (true, c) if c < 0x80 => match m.delivered(&topic).await {
                true => 'R',
                false => {
                    notes.push(format!("{topic}: SUBACK {c:#x} but nothing delivered"));
                    'r'
                }
            },
            (false, 0x87) if !ctx.retained(&topic, &payload) => '-',
            (false, c) if c < 0x80 && ctx.retained(&topic, &payload) => 'W',
            (_, c) => {
                notes.push(format!("{topic}: code {c:#x}"));
                '?'
            }
        };
        got.push(r);
    }
    conn.close(0u32.into(), b"done");
    Cell { got, notes }
}

// ---- MoQT: raw QUIC, WebTransport, WebSocket, the token in `?jwt=` ----

fn moqt_error(e: &anyhow::Error) -> String {
    let s = format!("{e:#}");
    match s.split_once("the server closed the session: ") {
        Some((_, rest)) => match rest.find(')') {
            Some(end) => format!("closed:{}", &rest[..=end]),
            None => format!("closed:{rest}"),
        },
        None => format!("connect failed: {s}"),
    }
}

async fn moqt_cell(ctx: Arc<Ctx>, l: Listener, cred: Cred) -> Cell {
    let base = match l {
        Listener::MoqtQuic => format!("moqt://127.0.0.1:{}/matrix", ctx.udp.port()),
        Listener::MoqtWebTransport => format!("https://127.0.0.1:{}/matrix", ctx.udp.port()),
        _ => format!("ws://{}/matrix", ctx.http),
    };
    let url = match ctx.fx.token(cred) {
        Some(t) => format!("{base}?jwt={t}"),
        None => base,
    };
    let opts = ConnectOptions {
        verify: Verify::Fingerprints(vec![ctx.fingerprint.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        timeout: Duration::from_secs(10),
        endpoint: None,
        draft: None,
    };
    let session = match ClientSession::connect(&url, opts).await {
        Ok(s) => s,
        Err(e) => {
            return Cell {
                got: moqt_error(&e),
                notes: vec![],
            }
        }
    };
    let unauthorized = format!(
        "UNAUTHORIZED ({:#x})",
        moqt::error::request_error::UNAUTHORIZED
    );
    let mut notes = Vec::new();
    let mut got = String::new();
    for (read, ns, name) in [
        (true, "mqtt/anon".to_string(), "x".to_string()),
        (
            false,
            "mqtt/anon/w".to_string(),
            format!("{}-{}-{}", ctx.name(), l.name(), cred.name()),
        ),
        (true, "mqtt/secret".to_string(), "door".to_string()),
        (
            false,
            "mqtt/secret/w".to_string(),
            format!("{}-{}-{}", ctx.name(), l.name(), cred.name()),
        ),
    ] {
        let track = FullTrackName::new(&ns, &name);
        let r = if read {
            match within(15, session.subscribe(track, SubscribeOptions::default())).await {
                Ok(mut sub) => {
                    let object = tokio::time::timeout(Duration::from_secs(10), async {
                        loop {
                            match sub.next().await {
                                Some(SubscriptionEvent::Object(_)) => return true,
                                Some(_) => {}
                                None => return false,
                            }
                        }
                    })
                    .await;
                    match object {
                        Ok(true) => 'R',
                        _ => {
                            notes.push(format!("{ns}/{name}: SUBSCRIBE_OK, no object"));
                            'r'
                        }
                    }
                }
                Err(e) if e.to_string().contains(&unauthorized) => '-',
                Err(e) => {
                    notes.push(format!("{ns}/{name}: {e:#}"));
                    '?'
                }
            }
        } else {
            match within(15, session.create_track(track, 1, TrackMode::Push)).await {
                Ok(_) => 'W',
                Err(e) if e.to_string().contains(&unauthorized) => '-',
                Err(e) => {
                    notes.push(format!("{ns}/{name}: {e:#}"));
                    '?'
                }
            }
        };
        got.push(r);
    }
    // Over raw QUIC and WebTransport the relay's SETUP comes before it has
    // read ours (and the token in it or in the URL): a refused session is
    // up for the client, and closed before any request is served.
    if got.contains('?') {
        let _ = tokio::time::timeout(Duration::from_secs(5), session.closed()).await;
        if let Some((_, why)) = session.close_reason() {
            let why = match why.find(')') {
                Some(end) => &why[..=end],
                None => &why[..],
            };
            if got.chars().all(|c| c == '?') {
                return Cell {
                    got: format!("closed:{why}"),
                    notes: vec![],
                };
            }
            got = format!("{got}, then closed:{why}");
        }
    }
    session.close(0, "done");
    Cell { got, notes }
}

// ---- HTTP/1.1 and HTTP/2 (curl), event streams ----

/// `curl -X METHOD` once: the status.
async fn curl_status(
    ctx: &Ctx,
    version: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&str>,
) -> u16 {
    let _running = ctx.procs.acquire().await.unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-S", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["--max-time", "10", version, "-X", method]);
    if let Some(t) = bearer {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    if let Some(b) = body {
        cmd.args(["-H", "X-Retain: 1", "--data-binary", b]);
    }
    let out = within(20, {
        cmd.arg(format!("http://{}{path}", ctx.http))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
    })
    .await
    .unwrap();
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}

/// A GET of an event stream: `R` once an event came, `R404` for an
/// authorised request of a topic the registry lacks, `-401`/`-403`.
async fn curl_stream(ctx: &Ctx, version: &str, path: &str, bearer: Option<&str>) -> String {
    let _running = ctx.procs.acquire().await.unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-S", "-i", "-N", "--max-time", "20", version]);
    if let Some(t) = bearer {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let mut child = cmd
        .args(["-H", "Accept: text/event-stream"])
        .arg(format!("http://{}{path}", ctx.http))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = out.read(&mut chunk).await.unwrap_or(0);
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf);
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                if n == 0 {
                    return format!("?{text}");
                }
                continue;
            };
            let status: u16 = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            match status {
                200 if body.contains("\nevent: message\n") => return "R".to_string(),
                404 if body.contains("no such topic") => return "R404".to_string(),
                401 | 403 => return format!("-{status}"),
                _ if n == 0 => return format!("?{status}:{body}"),
                _ => {}
            }
        }
    })
    .await;
    r.unwrap_or_else(|_| format!("?no event: {}", String::from_utf8_lossy(&buf)))
}

/// PUT then POST (retained) a topic of the cell's own: `W` when both are
/// served and the message is kept, `-401`/`-403` when both are refused so.
fn write_result(ctx: &Ctx, put: u16, post: u16, topic: &str, payload: &str) -> String {
    let kept = ctx.retained(topic, payload);
    match (put, post, kept) {
        (200 | 201, 204, true) => "W".into(),
        (401 | 403, p, false) if p == put => format!("-{put}"),
        _ => format!("?PUT{put}/POST{post}/retained:{kept}"),
    }
}

async fn http_cell(ctx: Arc<Ctx>, l: Listener, cred: Cred) -> Cell {
    let version = match l {
        Listener::Http2 => "--http2-prior-knowledge",
        _ => "--http1.1",
    };
    let token = ctx.fx.token(cred);
    let read = |topic: &'static str| {
        let ctx = ctx.clone();
        async move {
            let r = match (l, token) {
                (Listener::SseQuery, Some(t)) => {
                    curl_stream(&ctx, version, &format!("/v1/t/{topic}?jwt={t}"), None).await
                }
                _ => curl_stream(&ctx, version, &format!("/v1/t/{topic}"), token).await,
            };
            Ok::<_, String>(r)
        }
    };
    let write = |root: &'static str| {
        let ctx = ctx.clone();
        async move {
            if l == Listener::SseQuery {
                return Ok::<_, String>(".".to_string());
            }
            let topic = ctx.own_topic(root, l, cred);
            let path = format!("/v1/t/{topic}");
            let payload = format!("by-{topic}");
            let put = curl_status(&ctx, version, "PUT", &path, token, None).await;
            let post = curl_status(&ctx, version, "POST", &path, token, Some(&payload)).await;
            Ok(write_result(&ctx, put, post, &topic, &payload))
        }
    };
    let (a, b, c, d) = tokio::join!(read(PUBLIC), write("anon"), read(PRIVATE), write("secret"));
    combine([a, b, c, d], " ", vec![])
}

// ---- HTTP/3 (aioquic): every credential's requests on one connection ----

async fn http3_cells(ctx: Arc<Ctx>) -> Vec<(Cred, Cell)> {
    let l = Listener::Http3;
    let mut requests = Vec::new();
    for cred in TOKEN_CREDS {
        let headers = match ctx.fx.token(cred) {
            Some(t) => json!({"authorization": format!("Bearer {t}")}),
            None => json!({}),
        };
        for (read, root) in [
            (true, PUBLIC),
            (false, "anon"),
            (true, PRIVATE),
            (false, "secret"),
        ] {
            if read {
                requests.push(json!({
                    "method": "GET", "path": format!("/v1/t/{root}"), "headers": headers,
                    // `: subscribed`, then the first event's id and name.
                    "stream": {"until_bytes": 35, "timeout": 10},
                }));
            } else {
                let topic = ctx.own_topic(root, l, cred);
                let path = format!("/v1/t/{topic}");
                requests.push(json!({"method": "PUT", "path": path, "headers": headers}));
                let mut h = headers.clone();
                h["x-retain"] = json!("1");
                requests.push(json!({
                    "method": "POST", "path": path, "headers": h, "body": format!("by-{topic}"),
                }));
            }
        }
    }
    let v = {
        let _running = ctx.procs.acquire().await.unwrap();
        H3Client::start(
            &ctx.python,
            ctx.udp.port(),
            json!({ "requests": requests }),
            &[],
        )
        .await
        .result()
        .await
    };
    let responses: &Vec<Value> = v["responses"].as_array().unwrap();
    let status = |i: usize| responses[i]["status"].as_u64().unwrap_or(0) as u16;
    let mut cells = Vec::new();
    let mut i = 0;
    for cred in TOKEN_CREDS {
        let mut ops = Vec::new();
        for (read, root) in [
            (true, PUBLIC),
            (false, "anon"),
            (true, PRIVATE),
            (false, "secret"),
        ] {
            if read {
                let body = String::from_utf8_lossy(&common::h3_body(&responses[i])).into_owned();
                ops.push(match status(i) {
                    200 if body.contains("\nevent: message") => "R".to_string(),
                    404 if body.contains("no such topic") => "R404".to_string(),
                    s @ (401 | 403) => format!("-{s}"),
                    s => format!("?{s}:{body}"),
                });
                i += 1;
            } else {
                let topic = ctx.own_topic(root, l, cred);
                let payload = format!("by-{topic}");
                ops.push(write_result(
                    &ctx,
                    status(i),
                    status(i + 1),
                    &topic,
                    &payload,
                ));
                i += 2;
            }
        }
        cells.push((
            cred,
            Cell {
                got: ops.join(" "),
                notes: vec![],
            },
        ));
    }
    cells
}

/// Creates [`PUBLIC`] and [`PRIVATE`] in the HTTP API's registry with
/// whichever credential may (in process, through the API's own
/// authentication), so that allowed reads find them; which exist.
async fn http_topics(ctx: &Ctx) -> [bool; 2] {
    let api = ctx.hub.http_api();
    let mut exist = [false; 2];
    for (i, topic) in [PUBLIC, PRIVATE].into_iter().enumerate() {
        for cred in TOKEN_CREDS {
            let mut req = http::Request::builder()
                .method("PUT")
                .uri(format!("/v1/t/{topic}"));
            if let Some(t) = ctx.fx.token(cred) {
                req = req.header("authorization", format!("Bearer {t}"));
            }
            let resp = api.handle(req.body(Bytes::new()).unwrap()).await;
            exist[i] |= resp.status().is_success();
        }
    }
    exist
}

/// One configuration: its hub, every cell at once while both topics get a
/// message every 100 ms; the rows of the matrix.
async fn run_config(ctx: Arc<Ctx>) -> Vec<String> {
    let http_topics = http_topics(&ctx).await;
    let broker = ctx.hub.broker().clone();
    let ticker = tokio::spawn(async move {
        for i in 0.. {
            for topic in [PUBLIC, PRIVATE] {
                broker.publish(Message::new(
                    topic,
                    Bytes::from(format!("tick-{i}")),
                    QoS::AtLeastOnce,
                    true,
                    Source::Http,
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // Let the first messages (retained, and the bridge's tracks) be there.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut set = tokio::task::JoinSet::new();
    if ctx.certs {
        for l in [Listener::MqttTls, Listener::MqttQuic] {
            let ctx = ctx.clone();
            set.spawn(async move {
                let cell = match l {
                    Listener::MqttTls => mosquitto_cell(ctx, l, Cred::Cert).await,
                    _ => quic_mqtt_cell(ctx, Cred::Cert).await,
                };
                vec![(l, Cred::Cert, cell)]
            });
        }
    }
    for l in LISTENERS.into_iter().filter(|_| !ctx.certs) {
        if l == Listener::Http3 {
            let ctx = ctx.clone();
            set.spawn(async move {
                http3_cells(ctx)
                    .await
                    .into_iter()
                    .map(|(cred, cell)| (l, cred, cell))
                    .collect::<Vec<_>>()
            });
            continue;
        }
        for &cred in l.creds() {
            let ctx = ctx.clone();
            set.spawn(async move {
                let cell = match l.family() {
                    Family::Mqtt if l == Listener::MqttQuic => quic_mqtt_cell(ctx, cred).await,
                    Family::Mqtt => mosquitto_cell(ctx, l, cred).await,
                    Family::Moqt => moqt_cell(ctx, l, cred).await,
                    Family::Http => http_cell(ctx, l, cred).await,
                };
                vec![(l, cred, cell)]
            });
        }
    }
    let mut cells = Vec::new();
    while let Some(r) = set.join_next().await {
        cells.extend(r.unwrap());
    }
    ticker.abort();
    cells.sort_by_key(|(l, cred, _)| {
        (
            LISTENERS.iter().position(|x| x == l),
            MQTT_CREDS.iter().position(|x| x == cred),
        )
    });
    let mut rows = Vec::new();
    for (l, cred, cell) in cells {
        let want = expected(ctx.config, l, cred, http_topics);
        let mark = if cell.got == want { "ok " } else { "BAD" };
        let mut row = format!(
            "{mark} {:<13} {:<10} {:<13} got {:<34} want {want}",
            ctx.name(),
            l.name(),
            cred.name(),
            cell.got
        );
        if !cell.notes.is_empty() {
            row += &format!("  ({})", cell.notes.join("; "));
        }
        rows.push(row);
    }
    rows
}

/// Every configuration × every listener × every credential it carries:
/// read and write of a public and a private topic, as the model says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_grants_what_the_model_does() {
    let Some(_) = mqtt_tools() else { return };
    if curl_http2().is_none() {
        return;
    }
    let Some(python) = h3_python() else { return };
    if common::openssl().is_none() {
        return;
    }
    let started = std::time::Instant::now();
    let fx = Arc::new(Fixture::make());
    let procs = Arc::new(Semaphore::new(8));
    let mut configs = tokio::task::JoinSet::new();
    for config in 0..CONFIGS.len() {
        for certs in [false, true] {
            let ctx = Ctx::start(config, certs, fx.clone(), procs.clone(), python.clone()).await;
            configs.spawn(async move { (config, certs, run_config(Arc::new(ctx)).await) });
        }
    }
    let mut rows = Vec::new();
    while let Some(r) = configs.join_next().await {
        rows.push(r.unwrap());
    }
    rows.sort_by_key(|(config, certs, _)| (*config, *certs));
    let rows: Vec<String> = rows.into_iter().flat_map(|(_, _, r)| r).collect();
    eprintln!(
        "read anon/x, write anon/x, read secret/door, write secret/door ({} cells, {:.1} s):\n{}",
        rows.len(),
        started.elapsed().as_secs_f64(),
        rows.join("\n")
    );
    let bad: Vec<&String> = rows.iter().filter(|r| r.starts_with("BAD")).collect();
    assert!(
        bad.is_empty(),
        "listeners disagree with the model:\n{bad:#?}"
    );
}
