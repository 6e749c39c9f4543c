//! MQTT authentication and authorisation end to end, with third-party tools
//! only on the client side: a `password_file` made by `mosquitto_passwd`,
//! a mosquitto `acl_file` (`topic read|write|readwrite|deny`, `pattern` with
//! `%c` and `%u`), `mosquitto_pub`/`mosquitto_sub` (3.1.1 and 5), Eclipse
//! Paho for the exact MQTT 5 reason codes, JWTs made by PyJWT as the MQTT
//! password, the same ACL user publishing over MoQT, and a reload.
//!
//! Skipped (with a message) when the tools of `scripts/install-mqtt-tools.sh`
//! are missing and `QUICHUB_MQTT_PYTHON` is unset.

use quichub_testkit as common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use bytes::Bytes;
use common::mqtt::Raw;
use common::{mqtt_tools, within, TestGateway};
use quichub_gateway::broker::{Message, Source};
use quichub_mqtt::{Properties, QoS, Version};

/// HMAC secret of the JWTs (a raw secret file, `*.secret`, as `auth.key`
/// accepts).
const SECRET: &str = "quichub-e2e-mqtt-auth-secret-0123456789";

const ACL: &str = "\
user alice
topic readwrite sensors/#
topic deny sensors/secret
topic write commands/#
topic read status/#

user bob
topic read sensors/#

user carol
topic write sensors/#

pattern readwrite clients/%c/#
pattern read users/%u/#
";

/// The files of one test, removed when dropped.
struct Files {
    dir: PathBuf,
}

impl Files {
    /// `passwd` (alice/apw, bob/bpw, by `mosquitto_passwd`), `acl`,
    /// `hs256.secret` and `quichub.toml` naming them in `[auth]` (no clock
    /// leeway: tokens expire when the tests count on it).
    fn make(name: &str) -> Files {
        let dir =
            std::env::temp_dir().join(format!("quichub-mqtt-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = Files { dir };
        f.passwd(&["-c", "-b"], "alice", "apw");
        f.passwd(&["-b"], "bob", "bpw");
        std::fs::write(f.path("acl"), ACL).unwrap();
        std::fs::write(f.path("hs256.secret"), SECRET).unwrap();
        std::fs::write(
            f.path("quichub.toml"),
            format!(
                "[auth]\npassword_file = {:?}\nacl_file = {:?}\nkey = {:?}\nleeway_s = 0\n",
                f.path("passwd"),
                f.path("acl"),
                f.path("hs256.secret")
            ),
        )
        .unwrap();
        f
    }

    /// `mosquitto_passwd ARGS passwd USER PASS`.
    fn passwd(&self, args: &[&str], user: &str, pass: &str) {
        let out = std::process::Command::new("mosquitto_passwd")
            .args(args)
            .arg(self.path("passwd"))
            .args([user, pass])
            .output()
            .expect("mosquitto_passwd");
        assert!(
            out.status.success(),
            "mosquitto_passwd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.join(f)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A gateway whose `[auth]` is `files`' `quichub.toml` (so `reload()`
/// re-reads it).
async fn gateway(files: &Files) -> TestGateway {
    let source = files.path("quichub.toml");
    let mut c = common::test_config();
    c.auth = quichub_hub::Config::load(&source).unwrap().auth;
    c.source = Some(source);
    TestGateway::with_hub_config(c).await
}

fn version_arg(v: Version) -> &'static str {
    match v {
        Version::V311 => "mqttv311",
        Version::V5 => "mqttv5",
    }
}

/// Runs a mosquitto client against the gateway.
async fn mosquitto(tool: &str, gw: &TestGateway, v: Version, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(tool);
    cmd.args(["-h", "127.0.0.1", "-p", &gw.mqtt.port().to_string()])
        .args(["-V", version_arg(v)])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    within(20, cmd.output()).await.unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `mosquitto_pub` of a retained QoS 1 message `payload` on `topic` as
/// `user` (`-i id`); whether the broker kept it (the PUBACK came back before
/// the tool exited, so the publish was handled).
async fn publishes(
    gw: &TestGateway,
    v: Version,
    user: &str,
    pass: &str,
    id: &str,
    topic: &str,
) -> bool {
    let payload = format!("{user}-{}", version_arg(v));
    let o = mosquitto(
        "mosquitto_pub",
        gw,
        v,
        &[
            "-u", user, "-P", pass, "-i", id, "-q", "1", "-r", "-t", topic, "-m", &payload,
        ],
    )
    .await;
    // Refused or not, the tool succeeds: 3.1.1 cannot tell, and MQTT 5's
    // PUBACK 0x87 is only a warning to it.
    assert!(o.status.success(), "{}", text(&o));
    gw.broker
        .retained(topic)
        .is_some_and(|m| m.payload == payload.as_bytes())
}

/// `mosquitto_sub -v -W 2 -C count` on `filter` as `user`: the messages it
/// printed (`topic payload` lines) and its output.
async fn receives(
    gw: &TestGateway,
    v: Version,
    user: &str,
    pass: &str,
    filter: &str,
    count: usize,
) -> (Vec<String>, Output) {
    let o = mosquitto(
        "mosquitto_sub",
        gw,
        v,
        &[
            "-u",
            user,
            "-P",
            pass,
            "-t",
            filter,
            "-v",
            "-C",
            &count.to_string(),
            "-W",
            "2",
        ],
    )
    .await;
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split(' ').next().unwrap_or("").to_string())
        .collect();
    (lines, o)
}

fn retain(gw: &TestGateway, topic: &str) {
    gw.broker.publish(Message::new(
        topic,
        Bytes::from_static(b"r"),
        QoS::AtLeastOnce,
        true,
        Source::Http,
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_clients_with_a_password_file_and_an_acl_file() {
    if mqtt_tools().is_none() {
        return;
    }
    let files = Files::make("mosquitto");
    let gw = gateway(&files).await;
    for v in [Version::V311, Version::V5] {
        // Credentials: right, wrong, none.
        let ok = mosquitto(
            "mosquitto_pub",
            &gw,
            v,
            &["-u", "alice", "-P", "apw", "-t", "sensors/a", "-m", "x"],
        )
        .await;
        assert!(ok.status.success(), "{}", text(&ok));
        let bad = mosquitto(
            "mosquitto_pub",
            &gw,
            v,
            &["-u", "alice", "-P", "wrong", "-t", "sensors/a", "-m", "x"],
        )
        .await;
        assert!(!bad.status.success());
        assert!(
            text(&bad)
                .to_lowercase()
                .contains("bad user name or password"),
            "{v:?}: {}",
            text(&bad)
        );
        let anon = mosquitto("mosquitto_pub", &gw, v, &["-t", "sensors/a", "-m", "x"]).await;
        assert!(!anon.status.success());
        assert!(
            text(&anon).to_lowercase().contains("not authori"),
            "{v:?}: {}",
            text(&anon)
        );
        // Exit codes are the CONNACK codes: 3.1.1 return codes 4 and 5,
        // MQTT 5 reason codes 0x86 and 0x87.
        let (b, n) = match v {
            Version::V311 => (4, 5),
            Version::V5 => (0x86, 0x87),
        };
        assert_eq!((bad.status.code(), anon.status.code()), (Some(b), Some(n)));

        // Publishing, per rule and pattern.
        let cases = [
            ("alice", "apw", "a1", "sensors/a", true),  // readwrite
            ("alice", "apw", "a1", "commands/x", true), // write
            ("alice", "apw", "a1", "status/x", false),  // read only
            ("alice", "apw", "a1", "sensors/secret", false), // deny
            ("alice", "apw", "a1", "other/x", false),   // no rule
            ("bob", "bpw", "b1", "sensors/b", false),   // read only
            ("bob", "bpw", "dev7", "clients/dev7/state", true), // %c
            ("bob", "bpw", "dev7", "clients/dev8/state", false),
            ("bob", "bpw", "b1", "users/bob/x", false), // pattern read
        ];
        for (user, pass, id, topic, allowed) in cases {
            assert_eq!(
                publishes(&gw, v, user, pass, id, topic).await,
                allowed,
                "{v:?} {user} ({id}) publishing {topic}"
            );
        }
    }

    // Reading (retained messages are checked as any delivery).
    for t in [
        "status/x",
        "users/bob/inbox",
        "users/alice/inbox",
        "sensors/secret",
        "commands/x",
    ] {
        retain(&gw, t);
    }
    for v in [Version::V311, Version::V5] {
        let (got, _) = receives(&gw, v, "alice", "apw", "status/#", 1).await;
        assert_eq!(got, ["status/x"], "{v:?} read rule");
        let (got, _) = receives(&gw, v, "bob", "bpw", "users/bob/#", 1).await;
        assert_eq!(got, ["users/bob/inbox"], "{v:?} %u pattern");
        // Refused subscriptions (SUBACK 0x80 / 0x87): nothing arrives.
        for (user, pass, filter) in [
            ("bob", "bpw", "users/alice/#"),
            ("alice", "apw", "commands/#"),
        ] {
            let (got, o) = receives(&gw, v, user, pass, filter, 1).await;
            assert!(got.is_empty(), "{v:?}: {}", text(&o));
            assert!(
                text(&o).contains("All subscription requests were denied"),
                "{v:?}: {}",
                text(&o)
            );
        }
        // A wildcard alice may subscribe to: sensors/secret is not delivered
        // (the read check per message), sensors/a is.
        let (got, _) = receives(&gw, v, "alice", "apw", "sensors/#", 2).await;
        assert_eq!(got, ["sensors/a"], "{v:?}");
    }
    let auth = gw.relay.hub.auth();
    assert!(auth.metrics.get("mqtt", true, "password") > 0);
    assert_eq!(auth.metrics.get("mqtt", false, "bad_credentials"), 2);
    assert_eq!(auth.metrics.get("mqtt", false, "no_credentials"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_reason_codes_and_jwts_as_passwords() {
    let Some(python) = mqtt_tools() else {
        return;
    };
    let files = Files::make("paho");
    let gw = gateway(&files).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mqtt/paho_auth.py");
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg("-u")
        .arg(script)
        .arg(gw.mqtt.ip().to_string())
        .arg(gw.mqtt.port().to_string())
        .arg(files.path("hs256.secret"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = within(60, cmd.output()).await.unwrap();
    assert!(out.status.success(), "paho_auth.py failed:\n{}", text(&out));
    println!("{}", text(&out));
    let m = &gw.relay.hub.auth().metrics;
    assert!(m.get("mqtt", true, "jwt") >= 4);
    assert!(
        m.get("mqtt", false, "expired") >= 2,
        "at CONNECT and mid-connection"
    );
}

/// A JWT made by PyJWT with `claims` (JSON).
fn pyjwt(python: &Path, claims: &str) -> String {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import json, sys, jwt; print(jwt.encode(json.loads(sys.argv[1]), sys.argv[2].encode(), algorithm='HS256'))",
            claims,
            SECRET,
        ])
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_publishes_the_same_topics_over_moqt() {
    let Some(python) = mqtt_tools() else {
        return;
    };
    let files = Files::make("moqt");
    let gw = gateway(&files).await;
    // carol may write sensors/# (ACL): over MoQT with a JWT whose `sub` is
    // carol, the namespace (mqtt, sensors) and nothing else.
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let carol = pyjwt(&python, &format!(r#"{{"sub":"carol","exp":{exp}}}"#));
    let alice = pyjwt(&python, &format!(r#"{{"sub":"alice","exp":{exp}}}"#));
    let moqt = |t: &str| {
        let url = format!("moqt://127.0.0.1:{}/?jwt={t}", gw.relay.addr.port());
        let opts = gw.relay.opts();
        async move { quichub_client::ClientSession::connect(&url, opts).await }
    };
    let unauthorized = format!(
        "UNAUTHORIZED ({:#x})",
        moqt::error::request_error::UNAUTHORIZED
    );
    let c = moqt(&carol).await.unwrap();
    let ok = c
        .publish_namespace(moqt::TrackNamespace::from_path("mqtt/sensors"))
        .await;
    assert!(ok.is_ok(), "{:?}", ok.err());
    for ns in ["mqtt/other", "mqtt", "sensors"] {
        let e = c
            .publish_namespace(moqt::TrackNamespace::from_path(ns))
            .await
            .err()
            .unwrap_or_else(|| panic!("{ns} allowed"));
        assert!(e.to_string().contains(&unauthorized), "{ns}: {e}");
    }
    // alice's `deny sensors/secret` lies under (mqtt, sensors): she may
    // not announce all of it, only a part without the denied topic.
    let a = moqt(&alice).await.unwrap();
    let e = a
        .publish_namespace(moqt::TrackNamespace::from_path("mqtt/sensors"))
        .await
        .err()
        .expect("(mqtt, sensors) holds sensors/secret");
    assert!(e.to_string().contains(&unauthorized), "{e}");
    let ok = a
        .publish_namespace(moqt::TrackNamespace::from_path("mqtt/sensors/room1"))
        .await;
    assert!(ok.is_ok(), "{:?}", ok.err());
    // Over MQTT, carol's JWT as the password: the same rule.
    for (topic, allowed) in [("sensors/c", true), ("other/c", false)] {
        assert_eq!(
            publishes(&gw, Version::V5, "jwt", &carol, "c1", topic).await,
            allowed,
            "{topic}"
        );
    }
    // And over MQTT with her password, the same rule.
    for (topic, allowed) in [("sensors/m", true), ("other/m", false)] {
        assert_eq!(
            publishes(&gw, Version::V5, "alice", "apw", "a2", topic).await,
            allowed,
            "{topic}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_passwords_for_new_and_connected_clients() {
    if mqtt_tools().is_none() {
        return;
    }
    let files = Files::make("reload");
    let gw = gateway(&files).await;
    // bob and alice stay connected (MQTT 5), idle, across the reload.
    let connect = |user: &str, pass: &str| quichub_mqtt::Connect {
        version: Version::V5,
        client_id: format!("raw-{user}"),
        clean_start: true,
        keep_alive: 30,
        username: Some(user.into()),
        password: Some(Bytes::copy_from_slice(pass.as_bytes())),
        will: None,
        properties: Properties::default(),
    };
    let (mut bob, ack) = Raw::connect_with(gw.mqtt, connect("bob", "bpw")).await;
    assert_eq!(ack.code, 0);
    let (mut alice, ack) = Raw::connect_with(gw.mqtt, connect("alice", "apw")).await;
    assert_eq!(ack.code, 0);
    // New passwords: alice's changed, bob removed.
    files.passwd(&["-c", "-b"], "alice", "apw2");
    gw.relay.hub.reload().unwrap();
    for v in [Version::V311, Version::V5] {
        let old = mosquitto(
            "mosquitto_pub",
            &gw,
            v,
            &["-u", "alice", "-P", "apw", "-t", "sensors/a", "-m", "x"],
        )
        .await;
        assert!(!old.status.success(), "{}", text(&old));
        let new = mosquitto(
            "mosquitto_pub",
            &gw,
            v,
            &["-u", "alice", "-P", "apw2", "-t", "sensors/a", "-m", "x"],
        )
        .await;
        assert!(new.status.success(), "{}", text(&new));
    }
    // Connected clients meet the new file at once, idle as they are (they
    // send nothing; keep-alive is 30 s): alice's old password no longer
    // authenticates either.
    for c in [&mut bob, &mut alice] {
        assert_eq!(c.closed().await, Some(0x87));
    }
}

/// `GET /metrics` of the hub's metrics listener.
async fn metrics(gw: &TestGateway) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = gw.relay.hub.metrics_addr().expect("metrics on");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut r = String::new();
    within(10, s.read_to_string(&mut r)).await.unwrap();
    r
}

/// A user name that matches no password file entry proves nothing: with
/// only `public` prefixes configured (`--public`), `mosquitto_pub -u
/// anyone` and `mosquitto_sub -u anyone` are anonymous clients (the public
/// prefix, nothing else), and with `allow_anonymous = false` alone they
/// are refused (bad user name or password), never given everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_name_alone_grants_no_more_than_no_credentials() {
    if mqtt_tools().is_none() {
        return;
    }
    let mut c = common::test_config();
    c.auth.public = vec!["mqtt/anon".into()];
    let gw = TestGateway::with_hub_config(c).await;
    retain(&gw, "secret/door");
    retain(&gw, "anon/door");
    for v in [Version::V311, Version::V5] {
        for (user, pass) in [("anyone", ""), ("anyone", "guess")] {
            assert!(
                !publishes(&gw, v, user, pass, "a1", "secret/door").await,
                "{v:?} {user}/{pass:?} wrote secret/door"
            );
            assert!(
                publishes(&gw, v, user, pass, "a1", "anon/x").await,
                "{v:?} {user}/{pass:?} could not write the public prefix"
            );
            let (got, o) = receives(&gw, v, user, pass, "secret/#", 1).await;
            assert!(got.is_empty(), "{v:?}: {}", text(&o));
            assert!(
                text(&o).contains("All subscription requests were denied"),
                "{v:?}: {}",
                text(&o)
            );
            // Retained: anon/door, and anon/x just published.
            let (mut got, _) = receives(&gw, v, user, pass, "anon/#", 2).await;
            got.sort();
            assert_eq!(got, ["anon/door", "anon/x"], "{v:?}");
        }
    }

    let mut c = common::test_config();
    c.auth.allow_anonymous = Some(false);
    let gw = TestGateway::with_hub_config(c).await;
    for v in [Version::V311, Version::V5] {
        let o = mosquitto(
            "mosquitto_pub",
            &gw,
            v,
            &["-u", "anyone", "-t", "secret/door", "-m", "x"],
        )
        .await;
        let code = match v {
            Version::V311 => 4,
            Version::V5 => 0x86,
        };
        assert_eq!(o.status.code(), Some(code), "{v:?}: {}", text(&o));
        assert!(gw.broker.retained("secret/door").is_none());
    }
}

/// A reload that startup would refuse is refused whole: on a relay whose
/// QUIC port is on the network, a file that drops the password file leaves
/// the old `[auth]` in force (passwords still checked, anonymous clients
/// still refused), and the refusal is counted in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_would_expose_the_relay_is_refused() {
    if mqtt_tools().is_none() {
        return;
    }
    let files = Files::make("reload-exposed");
    let source = files.path("quichub.toml");
    let mut c = common::test_config();
    c.auth = quichub_hub::Config::load(&source).unwrap().auth;
    c.source = Some(source.clone());
    c.quic.bind = "0.0.0.0:0".into();
    c.metrics.address = "127.0.0.1:0".into();
    let gw = TestGateway::with_hub_config(c).await;
    std::fs::write(&source, "[auth]\n").unwrap();
    let e = gw.relay.hub.reload().unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("quic.bind") && e.contains("not a loopback address"),
        "{e}"
    );
    let v = Version::V5;
    let anon = mosquitto("mosquitto_pub", &gw, v, &["-t", "sensors/a", "-m", "x"]).await;
    assert_eq!(anon.status.code(), Some(0x87), "{}", text(&anon));
    let ok = mosquitto(
        "mosquitto_pub",
        &gw,
        v,
        &["-u", "alice", "-P", "apw", "-t", "sensors/a", "-m", "x"],
    )
    .await;
    assert!(ok.status.success(), "{}", text(&ok));
    let m = metrics(&gw).await;
    assert!(
        m.contains("quichub_config_reloads_total{result=\"refused\"} 1"),
        "{m}"
    );
    // A file startup accepts is applied (and counted).
    std::fs::write(
        &source,
        format!("[auth]\npassword_file = {:?}\n", files.path("passwd")),
    )
    .unwrap();
    gw.relay.hub.reload().unwrap();
    let m = metrics(&gw).await;
    assert!(
        m.contains("quichub_config_reloads_total{result=\"applied\"} 1"),
        "{m}"
    );
}

/// MQTT clients never write `$SYS`, and MoQT publishers may not forge it
/// through the gateway either, even on an open relay where they may write
/// everything else under (`mqtt`): PUBLISH and PUBLISH_NAMESPACE of
/// (`mqtt`, `$SYS`, …) are refused with UNAUTHORIZED (so nothing reaches
/// the broker), while other topics still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moqt_publishers_cannot_forge_sys() {
    use quichub_client::TrackMode;
    let gw = TestGateway::with_hub_config(common::test_config()).await;
    let c = gw.relay.client("moqt").await;
    let unauthorized = format!(
        "UNAUTHORIZED ({:#x})",
        moqt::error::request_error::UNAUTHORIZED
    );
    let e = c
        .publish_namespace(moqt::TrackNamespace::from_path("mqtt/$SYS/broker"))
        .await
        .err()
        .expect("PUBLISH_NAMESPACE (mqtt, $SYS, broker) refused");
    assert!(e.to_string().contains(&unauthorized), "{e}");
    let forged = moqt::FullTrackName::new("mqtt/$SYS/broker", "load");
    let e = c
        .create_track(forged, 1, TrackMode::Push)
        .await
        .err()
        .expect("PUBLISH of $SYS/broker/load refused");
    assert!(format!("{e:#}").contains(&unauthorized), "{e:#}");
    // Other topics under (mqtt) still go through.
    let _track = c
        .create_track(
            moqt::FullTrackName::new("mqtt/sensors", "t"),
            1,
            TrackMode::Push,
        )
        .await
        .unwrap();
    assert!(c.session().close_reason().is_none());
}

/// `pattern write devices/%c/out` gives each MQTT client its own topic; an
/// anonymous MoQT session has no client id (""), which substitutes nothing:
/// it may not write `devices//out` (the track ((mqtt, devices, \0), out)).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_client_id_matches_no_pattern_level() {
    use quichub_client::TrackMode;
    let files = Files::make("empty-id");
    std::fs::write(files.path("acl"), "pattern write devices/%c/out\n").unwrap();
    let mut c = common::test_config();
    c.auth.acl_file = Some(files.path("acl"));
    c.auth.allow_anonymous = Some(true);
    let gw = TestGateway::with_hub_config(c).await;
    let s = gw.relay.client("moqt").await;
    let name = moqt::FullTrackName {
        namespace: moqt::TrackNamespace::from_strs(&["mqtt", "devices", "\0"]),
        name: "out".into(),
    };
    let e = s
        .create_track(name, 1, TrackMode::Push)
        .await
        .err()
        .expect("devices//out refused");
    assert!(format!("{e:#}").contains("UNAUTHORIZED"), "{e:#}");
    // An MQTT client with an id gets its own level, and only it.
    if mqtt_tools().is_some() {
        let v = Version::V5;
        let o = mosquitto(
            "mosquitto_pub",
            &gw,
            v,
            &[
                "-i",
                "dev7",
                "-q",
                "1",
                "-r",
                "-t",
                "devices/dev7/out",
                "-m",
                "x",
            ],
        )
        .await;
        assert!(o.status.success(), "{}", text(&o));
        assert!(gw.broker.retained("devices/dev7/out").is_some());
        let o = mosquitto(
            "mosquitto_pub",
            &gw,
            v,
            &[
                "-i",
                "dev7",
                "-q",
                "1",
                "-r",
                "-t",
                "devices/dev8/out",
                "-m",
                "x",
            ],
        )
        .await;
        assert!(o.status.success(), "{}", text(&o));
        assert!(gw.broker.retained("devices/dev8/out").is_none());
    }
}
