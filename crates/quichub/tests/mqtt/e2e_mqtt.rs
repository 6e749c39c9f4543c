//! The MQTT broker end to end with Debian's mosquitto clients (3.1.1 and 5.0
//! over TCP), across protocols with MoQT, and against malformed input while
//! a healthy client keeps flowing.

use quichub_testkit as common;

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use common::mqtt::{persistent_connect, qos1_flows, Raw};
use common::{mqtt_tools, within, TestGateway};
use quichub_client::{SubscribeOptions, SubscriptionEvent, TrackMode};
use quichub_gateway::mapping::topic_to_track;
use quichub_mqtt::{Packet, Properties, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

fn port(gw: &TestGateway) -> String {
    gw.mqtt.port().to_string()
}

/// Starts `mosquitto_sub` and waits until the broker holds its subscription.
async fn sub(gw: &TestGateway, args: &[&str]) -> Child {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let id = format!(
        "sub{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut child = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port(gw), "-i", &id])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("mosquitto_sub");
    within(10, async {
        // (A `-C N` satisfied by retained messages may already be gone.)
        while gw.broker.client_subscriptions(&id) == 0 && child.try_wait().unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    child
}

async fn publish(gw: &TestGateway, args: &[&str]) {
    let out = within(
        10,
        Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port(gw)])
            .args(args)
            .output(),
    )
    .await
    .expect("mosquitto_pub");
    assert!(
        out.status.success(),
        "mosquitto_pub {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for a `mosquitto_sub -C N` to exit and returns its stdout.
async fn output(child: Child) -> String {
    let out = within(10, child.wait_with_output()).await.unwrap();
    assert!(
        out.status.success(),
        "mosquitto_sub failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_qos_0_1_2_in_both_versions() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    for v in ["mqttv311", "mqttv5"] {
        for q in ["0", "1", "2"] {
            let topic = format!("qos/{v}/{q}");
            let s = sub(
                &gw,
                &["-V", v, "-q", q, "-t", &topic, "-C", "2", "-F", "%q %p"],
            )
            .await;
            // One publish at each QoS: received QoS is the lower of the two.
            publish(&gw, &["-V", v, "-q", "2", "-t", &topic, "-m", "two"]).await;
            publish(&gw, &["-V", v, "-q", "0", "-t", &topic, "-m", "zero"]).await;
            let got = output(s).await;
            assert_eq!(got, format!("{q} two\n0 zero\n"), "{v} sub qos {q}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_retained_replaced_and_cleared() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    publish(&gw, &["-t", "r/a", "-m", "old", "-r", "-q", "1"]).await;
    publish(&gw, &["-t", "r/a", "-m", "new", "-r", "-q", "1"]).await;
    publish(&gw, &["-t", "r/b", "-m", "b", "-r"]).await;
    let s = sub(&gw, &["-t", "r/#", "-C", "2", "-F", "%r %t %p"]).await;
    let got = output(s).await;
    let mut lines: Vec<_> = got.lines().collect();
    lines.sort();
    assert_eq!(lines, ["1 r/a new", "1 r/b b"]);
    // An empty retained payload clears; a live message is not flagged retained.
    publish(&gw, &["-t", "r/a", "-r", "-n"]).await;
    let s = sub(&gw, &["-t", "r/#", "-C", "2", "-F", "%r %t %p"]).await;
    publish(&gw, &["-t", "r/c", "-m", "live"]).await;
    let got = output(s).await;
    assert_eq!(got, "1 r/b b\n0 r/c live\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_will_on_abrupt_close_only() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    let watcher = sub(&gw, &["-t", "wills/#", "-C", "1", "-F", "%t %p"]).await;
    // A clean exit sends DISCONNECT: no will.
    let clean = sub(
        &gw,
        &[
            "-t",
            "x",
            "-C",
            "1",
            "--will-topic",
            "wills/clean",
            "--will-payload",
            "no",
        ],
    )
    .await;
    publish(&gw, &["-t", "x", "-m", "bye"]).await;
    output(clean).await;
    // SIGKILL: the broker sees the TCP connection drop and publishes the will.
    let mut dying = sub(
        &gw,
        &[
            "-t",
            "y",
            "--will-topic",
            "wills/dead",
            "--will-payload",
            "gone",
            "--will-qos",
            "1",
        ],
    )
    .await;
    dying.kill().await.unwrap();
    assert_eq!(output(watcher).await, "wills/dead gone\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_wildcards_and_dollar_topics() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    let all = sub(&gw, &["-t", "#", "-C", "3", "-F", "%t"]).await;
    let plus = sub(&gw, &["-t", "+/b/#", "-C", "2", "-F", "%t"]).await;
    // (A `$` topic of its own: `$SYS/...` holds the broker's retained topics.)
    let sys = sub(&gw, &["-t", "$app/#", "-C", "1", "-F", "%t"]).await;
    for t in ["$app/load", "a/b", "a/b/c/d", "x/y"] {
        publish(&gw, &["-t", t, "-m", "m", "-q", "1"]).await;
    }
    assert_eq!(output(all).await, "a/b\na/b/c/d\nx/y\n", "# skips $ topics");
    assert_eq!(
        output(plus).await,
        "a/b\na/b/c/d\n",
        "+/b/# matches a/b too"
    );
    assert_eq!(output(sys).await, "$app/load\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_shared_subscriptions_split_the_stream() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    let a = sub(
        &gw,
        &["-V", "5", "-t", "$share/g/jobs", "-C", "5", "-F", "%p"],
    )
    .await;
    let b = sub(
        &gw,
        &["-V", "5", "-t", "$share/g/jobs", "-C", "5", "-F", "%p"],
    )
    .await;
    let all = sub(&gw, &["-t", "jobs", "-C", "10", "-F", "%p"]).await;
    for i in 0..10 {
        publish(&gw, &["-t", "jobs", "-m", &i.to_string(), "-q", "1"]).await;
    }
    let (a, b) = (output(a).await, output(b).await);
    let mut got: Vec<u32> = a
        .lines()
        .chain(b.lines())
        .map(|l| l.parse().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        (0..10).collect::<Vec<_>>(),
        "each message to one member"
    );
    assert_eq!(output(all).await.lines().count(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_v5_properties_pass_through() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    let s = sub(
        &gw,
        &["-V", "5", "-t", "p", "-C", "1", "-F", "%C|%P|%R|%F|%p"],
    )
    .await;
    publish(
        &gw,
        &[
            "-V",
            "5",
            "-t",
            "p",
            "-m",
            "body",
            "-q",
            "1",
            "-D",
            "publish",
            "content-type",
            "text/plain",
            "-D",
            "publish",
            "user-property",
            "site",
            "lab",
            "-D",
            "publish",
            "response-topic",
            "replies/1",
            "-D",
            "publish",
            "payload-format-indicator",
            "1",
        ],
    )
    .await;
    assert_eq!(output(s).await, "text/plain|site:lab|replies/1|1|body\n");
}

/// Cross-protocol: mosquitto_pub → MoQT subscriber, payload bytes untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_publish_reaches_moqt_subscriber() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    // The first message publishes the topic's track in the relay.
    publish(&gw, &["-t", "plant/line1/temp", "-m", "first"]).await;
    let client = gw.relay.client("https").await;
    let name = topic_to_track("plant/line1/temp").unwrap();
    assert_eq!(
        name,
        moqt::FullTrackName {
            namespace: moqt::TrackNamespace::from_strs(&["mqtt", "plant", "line1"]),
            name: Bytes::from_static(b"temp"),
        }
    );
    let mut s = client
        .subscribe(name, SubscribeOptions::default())
        .await
        .unwrap();
    let payload = "21.5 °C \u{1F321}";
    publish(&gw, &["-t", "plant/line1/temp", "-m", payload, "-q", "1"]).await;
    let o = within(5, async {
        loop {
            match s.next().await {
                Some(SubscriptionEvent::Object(o)) => return o,
                Some(_) => {}
                None => panic!("subscription ended"),
            }
        }
    })
    .await;
    assert_eq!(o.payload, Bytes::from(payload));
    assert_eq!(o.object_id, 0, "one message per group");
}

/// Cross-protocol: MoQT publisher (PUBLISH under `mqtt`) → mosquitto_sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moqt_publisher_reaches_mosquitto_sub() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    let s = sub(
        &gw,
        &["-t", "cam/+", "-q", "1", "-C", "3", "-F", "%t %q %p"],
    )
    .await;
    let publisher = gw.relay.client("moqt").await;
    let name = topic_to_track("cam/status").unwrap();
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    // The gateway's tap joins the track as soon as the relay accepts PUBLISH.
    within(5, async {
        while gw
            .relay
            .relay
            .find_track(&name)
            .is_none_or(|e| e.track.receivers() == 0)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // One subgroup keeps order (separate groups travel on separate streams).
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    for o in 0..2u64 {
        w.write(o, Bytes::from(format!("stream{o}"))).await.unwrap();
    }
    w.finish();
    // Datagram objects arrive as QoS 0 (best effort), stream objects as QoS 1.
    within(5, async {
        while !track.send_datagram(1, 0, Bytes::from_static(b"dgram")) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // The datagram takes no stream, so it may overtake the stream objects.
    let got = output(s).await;
    let mut lines: Vec<_> = got.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "cam/status 0 dgram",
            "cam/status 1 stream0",
            "cam/status 1 stream1"
        ]
    );
    assert!(
        got.find("stream0") < got.find("stream1"),
        "one subgroup keeps order"
    );
}

/// A fresh 3.1.1 client publishes `n` on `ok`; `healthy` must receive it.
async fn check_healthy(gw: &TestGateway, healthy: &mut Raw, n: u32) {
    let mut p = Raw::connect(gw, Version::V311, &format!("pub{n}")).await;
    p.send(&Packet::Publish(quichub_mqtt::Publish {
        topic: "ok".into(),
        payload: Bytes::from(n.to_string()),
        ..Default::default()
    }))
    .await;
    match healthy.recv().await {
        Some(Packet::Publish(m)) => assert_eq!(m.payload, Bytes::from(n.to_string())),
        other => panic!("healthy subscriber got {other:?}"),
    }
}

/// Bad input closes only the offending connection, with the right reason
/// code for MQTT 5; a healthy subscriber keeps receiving throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_closes_only_the_offender() {
    let gw = TestGateway::start().await;
    let mut healthy = Raw::connect(&gw, Version::V5, "healthy").await;
    healthy
        .send(&Packet::Subscribe(quichub_mqtt::Subscribe {
            packet_id: 1,
            filters: vec![quichub_mqtt::SubscribeFilter {
                filter: "ok".into(),
                options: Default::default(),
            }],
            properties: Properties::default(),
        }))
        .await;
    assert!(matches!(healthy.recv().await, Some(Packet::SubAck(_))));
    // PUBLISH before CONNECT: closed without an answer.
    let mut t = TcpStream::connect(gw.mqtt).await.unwrap();
    t.write_all(&[0x30, 0x05, 0x00, 0x01, b'a', b'h', b'i'])
        .await
        .unwrap();
    let mut sink = Vec::new();
    let read = within(5, t.read_to_end(&mut sink)).await;
    assert!(read.is_err() || sink.is_empty(), "no answer before CONNECT");
    check_healthy(&gw, &mut healthy, 1).await;

    // A wildcard in a PUBLISH topic: Topic Name invalid.
    let mut bad = Raw::connect(&gw, Version::V5, "wild").await;
    bad.send_raw(&[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'+', 0x00])
        .await;
    assert_eq!(
        bad.closed().await,
        Some(quichub_mqtt::reason::TOPIC_NAME_INVALID)
    );
    check_healthy(&gw, &mut healthy, 2).await;

    // A packet over the Maximum Packet Size, refused from its header alone.
    let mut big = Raw::connect(&gw, Version::V5, "big").await;
    big.send_raw(&[0x30, 0xff, 0xff, 0xff, 0x7f]).await;
    assert_eq!(
        big.closed().await,
        Some(quichub_mqtt::reason::PACKET_TOO_LARGE)
    );
    check_healthy(&gw, &mut healthy, 3).await;

    // Invalid UTF-8 in a topic: Malformed Packet.
    let mut utf = Raw::connect(&gw, Version::V5, "utf").await;
    utf.send_raw(&[0x30, 0x05, 0x00, 0x02, 0xc3, 0x28, 0x00])
        .await;
    assert_eq!(
        utf.closed().await,
        Some(quichub_mqtt::reason::MALFORMED_PACKET)
    );
    check_healthy(&gw, &mut healthy, 4).await;

    // A 3.1.1 client breaking a rule is just disconnected (no DISCONNECT in 3.1.1).
    let mut old = Raw::connect(&gw, Version::V311, "old").await;
    old.send_raw(&[0x82, 0x02, 0x00, 0x01]).await; // SUBSCRIBE with no filter
    assert_eq!(old.closed().await, None);
    check_healthy(&gw, &mut healthy, 5).await;

    // A second CONNECT is a protocol error.
    let mut twice = Raw::connect(&gw, Version::V5, "twice").await;
    twice
        .send(&Packet::Connect(quichub_mqtt::Connect {
            version: Version::V5,
            client_id: "twice".into(),
            clean_start: true,
            keep_alive: 0,
            username: None,
            password: None,
            will: None,
            properties: Properties::default(),
        }))
        .await;
    assert_eq!(
        twice.closed().await,
        Some(quichub_mqtt::reason::PROTOCOL_ERROR)
    );
    check_healthy(&gw, &mut healthy, 6).await;
}

/// An unsupported protocol level gets a CONNACK it can read, then the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_protocol_version_is_refused() {
    let gw = TestGateway::start().await;
    let mut t = TcpStream::connect(gw.mqtt).await.unwrap();
    // CONNECT "MQTT" level 6.
    t.write_all(&[
        0x10, 0x0d, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x06, 0x02, 0x00, 0x3c, 0x00, 0x01, b'x',
    ])
    .await
    .unwrap();
    let mut got = Vec::new();
    within(5, t.read_to_end(&mut got)).await.unwrap();
    assert_eq!(
        got,
        [0x20, 0x02, 0x00, 0x01],
        "CONNACK unacceptable protocol version"
    );
}

/// MQTT over TLS: mosquitto clients verify the broker's certificate (given
/// as their CA file) and exchange a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_over_tls() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    let id = quichub_net::tls::Identity::self_signed(&["localhost", "127.0.0.1"]).unwrap();
    let dir = std::env::temp_dir().join(format!("quichub-mqtt-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    id.write_pem(&cert, &key).unwrap();
    let tls = quichub_net::tls::tcp_server_config(&id, &[]).unwrap();
    let addr = quichub_gateway::listener::spawn_tls(
        "127.0.0.1:0".parse().unwrap(),
        gw.broker.clone(),
        std::sync::Arc::new(quichub_gateway::ConnConfig::default()),
        tls,
    )
    .await
    .unwrap();
    let port = addr.port().to_string();
    let cafile = cert.to_str().unwrap();
    let tls_args = ["-h", "localhost", "-p", &port, "--cafile", cafile];
    let before = gw.broker.subscriptions();
    let s = Command::new("mosquitto_sub")
        .args(tls_args)
        .args(["-t", "secure/#", "-C", "1", "-F", "%t %p"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    within(10, async {
        while gw.broker.subscriptions() == before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let out = Command::new("mosquitto_pub")
        .args(tls_args)
        .args(["-t", "secure/a", "-m", "over tls", "-q", "1"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(output(s).await, "secure/a over tls\n");
    // A client that does not trust the certificate is refused by its own TLS.
    let other = quichub_net::tls::Identity::self_signed(&["localhost"]).unwrap();
    let wrong = dir.join("other.pem");
    other.write_pem(&wrong, &dir.join("other-key.pem")).unwrap();
    let out = Command::new("mosquitto_pub")
        .args([
            "-h",
            "localhost",
            "-p",
            &port,
            "--cafile",
            wrong.to_str().unwrap(),
        ])
        .args(["-t", "secure/a", "-m", "x"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// QoS 2 exactly-once across a reconnect: the PUBREC is lost with the
/// connection, the client resumes its session and retransmits the PUBLISH
/// with DUP; the broker acknowledges it without routing it again (§4.3.3),
/// then completes the flow on PUBREL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos2_retransmission_after_reconnect_is_delivered_once() {
    let gw = TestGateway::start().await;
    let mut sub = Raw::connect(&gw, Version::V5, "q2-sub").await;
    sub.subscribe("q2", quichub_mqtt::QoS::ExactlyOnce).await;
    let persistent = |clean_start| persistent_connect(Version::V5, "q2-pub", clean_start);
    let publish = |dup| {
        Packet::Publish(quichub_mqtt::Publish {
            dup,
            qos: quichub_mqtt::QoS::ExactlyOnce,
            topic: "q2".into(),
            packet_id: Some(9),
            payload: Bytes::from_static(b"once"),
            ..Default::default()
        })
    };
    let (mut p, _) = Raw::connect_with(gw.mqtt, persistent(true)).await;
    p.send(&publish(false)).await;
    assert!(matches!(p.recv().await, Some(Packet::PubRec(_))));
    drop(p); // the connection drops before PUBREL
    let (mut p, ack) = Raw::connect_with(gw.mqtt, persistent(false)).await;
    assert!(ack.session_present);
    p.send(&publish(true)).await;
    assert!(matches!(p.recv().await, Some(Packet::PubRec(a)) if a.packet_id == 9));
    p.send(&Packet::PubRel(quichub_mqtt::Ack::new(9))).await;
    match p.recv().await {
        Some(Packet::PubComp(c)) => assert_eq!((c.packet_id, c.code), (9, 0)),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    // The subscriber got the message once: the next thing it sees is a marker.
    let (mut m, _) = Raw::connect_with(
        gw.mqtt,
        quichub_mqtt::Connect {
            client_id: "q2-marker".into(),
            properties: Properties::default(),
            ..persistent(true)
        },
    )
    .await;
    m.send(&Packet::Publish(quichub_mqtt::Publish {
        topic: "q2".into(),
        payload: Bytes::from_static(b"marker"),
        ..Default::default()
    }))
    .await;
    let mut got = Vec::new();
    while got.last().map(|b: &Bytes| &b[..]) != Some(b"marker") {
        match sub.recv().await {
            Some(Packet::Publish(m)) => {
                if let Some(id) = m.packet_id {
                    sub.send(&Packet::PubRec(quichub_mqtt::Ack::new(id))).await;
                }
                got.push(m.payload);
            }
            Some(Packet::PubRel(r)) => {
                sub.send(&Packet::PubComp(quichub_mqtt::Ack::new(r.packet_id)))
                    .await;
            }
            other => panic!("subscriber got {other:?}"),
        }
    }
    assert_eq!(
        got,
        [Bytes::from_static(b"once"), Bytes::from_static(b"marker")]
    );
}

/// §4.4: on a resumed session the broker sends unacknowledged QoS 1/2
/// PUBLISHes again with their original Packet Identifiers (DUP set), and a
/// QoS 2 message the client already acknowledged with PUBREC only gets its
/// PUBREL again, never a second PUBLISH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_session_resends_with_original_packet_ids_and_pubrel() {
    let gw = TestGateway::start().await;
    for version in [Version::V311, Version::V5] {
        let id = format!("resend-{version:?}");
        let topic = format!("resend/{version:?}");
        let connect = |clean_start| persistent_connect(version, &id, clean_start);
        // 3.1.1: Clean Session 0 makes the session persistent.
        let (mut sub, _) = Raw::connect_with(gw.mqtt, connect(version == Version::V5)).await;
        sub.subscribe(&topic, quichub_mqtt::QoS::ExactlyOnce).await;
        let mut publisher = Raw::connect(&gw, version, &format!("{id}-pub")).await;
        // Three completed QoS 1 flows first, so the messages below get
        // identifiers 4 to 6, not the ones a fresh connection would pick.
        qos1_flows(&mut publisher, &mut sub, &topic, 100, 3).await;
        for (i, (qos, body)) in [
            (quichub_mqtt::QoS::ExactlyOnce, "a"),
            (quichub_mqtt::QoS::ExactlyOnce, "b"),
            (quichub_mqtt::QoS::AtLeastOnce, "c"),
        ]
        .into_iter()
        .enumerate()
        {
            publisher
                .send(&Packet::Publish(quichub_mqtt::Publish {
                    qos,
                    topic: topic.clone(),
                    packet_id: Some(i as u16 + 1),
                    payload: Bytes::from_static(body.as_bytes()),
                    ..Default::default()
                }))
                .await;
        }
        // The subscriber takes all three and acknowledges only "a" (PUBREC;
        // the PUBREL comes and is not answered), then its connection drops.
        let mut first = Vec::new();
        while first.len() < 3 {
            match sub.recv().await {
                Some(Packet::Publish(p)) => first.push((p.packet_id.unwrap(), p.payload)),
                other => panic!("expected PUBLISH, got {other:?}"),
            }
        }
        let ids: Vec<u16> = first.iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, [4, 5, 6]);
        sub.send(&Packet::PubRec(quichub_mqtt::Ack::new(ids[0])))
            .await;
        match sub.recv().await {
            Some(Packet::PubRel(r)) => assert_eq!(r.packet_id, ids[0]),
            other => panic!("expected PUBREL, got {other:?}"),
        }
        drop(sub);
        // Give the broker a moment to see the connection gone.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (mut sub, ack) = Raw::connect_with(gw.mqtt, connect(false)).await;
        assert!(ack.session_present);
        match sub.recv().await {
            Some(Packet::PubRel(r)) => assert_eq!(r.packet_id, ids[0], "PUBREL, not PUBLISH"),
            other => panic!("{version:?}: expected the PUBREL again, got {other:?}"),
        }
        for (want_id, want_body) in [(ids[1], "b"), (ids[2], "c")] {
            match sub.recv().await {
                Some(Packet::Publish(p)) => {
                    assert_eq!(p.packet_id, Some(want_id), "original Packet Identifier");
                    assert!(p.dup, "DUP on a resend");
                    assert_eq!(&p.payload[..], want_body.as_bytes());
                }
                other => panic!("{version:?}: expected {want_body} again, got {other:?}"),
            }
        }
        // Completing the flows leaves nothing to resend.
        sub.send(&Packet::PubComp(quichub_mqtt::Ack::new(ids[0])))
            .await;
        sub.send(&Packet::PubRec(quichub_mqtt::Ack::new(ids[1])))
            .await;
        assert!(matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.packet_id == ids[1]));
        sub.send(&Packet::PubComp(quichub_mqtt::Ack::new(ids[1])))
            .await;
        sub.send(&Packet::PubAck(quichub_mqtt::Ack::new(ids[2])))
            .await;
        sub.send(&Packet::PingReq).await;
        assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
        drop(sub);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (mut sub, _) = Raw::connect_with(gw.mqtt, connect(false)).await;
        sub.send(&Packet::PingReq).await;
        assert!(
            matches!(sub.recv().await, Some(Packet::PingResp)),
            "nothing left to resend"
        );
    }
}

/// Session takeover with a message in flight (§4.4, §2.2.1): the new
/// connection gets it again under its Packet Identifier, and a message
/// published meanwhile never gets that identifier, whichever reaches the new
/// connection first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_keeps_packet_ids_in_use_apart() {
    let gw = TestGateway::start().await;
    let connect = |clean_start| persistent_connect(Version::V5, "takeover-q2", clean_start);
    let (mut a, _) = Raw::connect_with(gw.mqtt, connect(true)).await;
    a.subscribe("takeover/q2", quichub_mqtt::QoS::ExactlyOnce)
        .await;
    let mut publisher = Raw::connect(&gw, Version::V5, "takeover-pub").await;
    let publish = |id: u16, body: &'static str| {
        Packet::Publish(quichub_mqtt::Publish {
            qos: quichub_mqtt::QoS::AtLeastOnce,
            topic: "takeover/q2".into(),
            packet_id: Some(id),
            payload: Bytes::from_static(body.as_bytes()),
            ..Default::default()
        })
    };
    publisher.send(&publish(1, "x")).await;
    assert!(matches!(publisher.recv().await, Some(Packet::PubAck(_))));
    // QoS 1 deliveries (the publish is QoS 1): "x" stays unacknowledged.
    let x_id = match a.recv().await {
        Some(Packet::Publish(p)) => p.packet_id.unwrap(),
        other => panic!("expected x, got {other:?}"),
    };
    // B takes the session over while A still holds "x"; "y" follows at once.
    let (mut b, ack) = Raw::connect_with(gw.mqtt, connect(false)).await;
    assert!(ack.session_present);
    publisher.send(&publish(2, "y")).await;
    assert!(matches!(publisher.recv().await, Some(Packet::PubAck(_))));
    let mut got = std::collections::BTreeMap::new();
    while got.len() < 2 {
        match b.recv().await {
            Some(Packet::Publish(p)) => {
                let id = p.packet_id.unwrap();
                let body = String::from_utf8(p.payload.to_vec()).unwrap();
                if body == "x" {
                    assert_eq!(id, x_id, "x again under its identifier");
                    assert!(p.dup);
                }
                assert!(
                    got.insert(body, id).is_none(),
                    "one delivery each to the new connection"
                );
            }
            other => panic!("expected x and y, got {other:?}"),
        }
    }
    assert_ne!(got["y"], got["x"], "y never takes x's identifier: {got:?}");
}

/// Retained messages queue up for a subscriber until it reads them; filters
/// that would queue more than two full sets are refused with Quota exceeded
/// (0x97), so a client cannot grow the broker's memory without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_backlog_is_bounded_per_connection() {
    let gw = TestGateway::with(
        quichub_gateway::BrokerConfig {
            max_retained: 6_000,
            ..Default::default()
        },
        quichub_gateway::ConnConfig::default(),
    )
    .await;
    let mut publisher = Raw::connect(&gw, Version::V5, "bulk-pub").await;
    let mut batch = bytes::BytesMut::new();
    for i in 0..6_000 {
        quichub_mqtt::encode(
            &Packet::Publish(quichub_mqtt::Publish {
                retain: true,
                topic: format!("bulk/{i}"),
                payload: Bytes::from_static(b"r"),
                ..Default::default()
            }),
            Version::V5,
            &mut batch,
        )
        .unwrap();
    }
    publisher.send_raw(&batch).await;
    publisher.send(&Packet::PingReq).await;
    // 6 000 publishes and then 18 000 retained deliveries weighed: seconds
    // on a loaded 2-core machine in a debug build, so a wider bound.
    assert!(matches!(
        publisher.recv_within(60).await,
        Some(Packet::PingResp)
    ));
    let mut sub = Raw::connect(&gw, Version::V5, "bulk-sub").await;
    let filter = |f: &str| quichub_mqtt::SubscribeFilter {
        filter: f.into(),
        options: Default::default(),
    };
    sub.send(&Packet::Subscribe(quichub_mqtt::Subscribe {
        packet_id: 7,
        filters: vec![
            filter("#"),
            filter("+/#"),
            filter("bulk/#"),
            filter("bulk/+"),
        ],
        properties: Properties::default(),
    }))
    .await;
    match sub.recv_within(60).await {
        Some(Packet::SubAck(a)) => assert_eq!(a.codes, [0, 0, 0, 0x97]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sys_topics_reach_explicit_subscribers() {
    if mqtt_tools().is_none() {
        return;
    }
    let gw = TestGateway::start().await;
    // The first tick publishes every `$SYS` topic, retained.
    within(10, async {
        while gw
            .broker
            .retained("$SYS/broker/clients/connected")
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let connected = sub(&gw, &["-t", "$SYS/broker/clients/connected", "-C", "1"]).await;
    let n = output(connected).await;
    assert!(n.trim().parse::<u64>().is_ok(), "{n:?}");
    let version = sub(&gw, &["-t", "$SYS/broker/version", "-C", "1"]).await;
    assert!(output(version).await.starts_with("quichub version "));
    let loads = sub(&gw, &["-t", "$SYS/broker/load/+/+/1min", "-C", "4", "-v"]).await;
    let text = output(loads).await;
    for t in [
        "messages/received",
        "messages/sent",
        "bytes/received",
        "bytes/sent",
    ] {
        assert!(
            text.contains(&format!("$SYS/broker/load/{t}/1min ")),
            "{t} in {text}"
        );
    }
}
