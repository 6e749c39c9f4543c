//! Durability: `quichub relay` is killed with SIGKILL while a publisher
//! streams QoS 1 messages to two persistent sessions (one offline, one online
//! and acknowledging); after a restart on the same data directory, every
//! message the broker acknowledged reaches both, and retained messages are
//! still there.

use quichub_testkit as common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::mqtt::{qos1_flows, Raw};
use common::within;
use quichub_mqtt::{Ack, Connect, Packet, Properties, Publish, QoS, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_quichub");

/// Kills the relay when the test ends, also on failure.
struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the relay with the broker's state in `dir`; returns it and its MQTT address.
fn start(dir: &Path) -> (Relay, SocketAddr) {
    let mut child = Command::new(BIN)
        .args([
            "relay",
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--mqtt",
            "127.0.0.1:0",
            "--mqtt-tls",
            "off",
            "--http",
            "off",
        ])
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("relay output").unwrap();
        if let Some(rest) = line.strip_prefix("mqtt tcp ") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    // Keep reading, so the relay never writes to a closed pipe.
    std::thread::spawn(move || for _ in lines {});
    (Relay(child), addr)
}

fn persistent(id: &str) -> Connect {
    Connect {
        version: Version::V5,
        client_id: id.into(),
        clean_start: false,
        keep_alive: 60,
        username: None,
        password: None,
        will: None,
        properties: Properties {
            session_expiry_interval: Some(3600),
            ..Properties::default()
        },
    }
}

async fn subscribe(c: &mut Raw, filter: &str) {
    c.subscribe(filter, QoS::AtLeastOnce).await;
}

/// Receives and acknowledges messages until none arrives for `quiet`.
async fn drain(c: &mut Raw, quiet: Duration, got: &mut BTreeSet<String>) {
    while let Ok(Some(p)) = tokio::time::timeout(quiet, c.recv()).await {
        if let Packet::Publish(p) = p {
            got.insert(String::from_utf8(p.payload.to_vec()).unwrap());
            if let Some(id) = p.packet_id {
                c.send(&Packet::PubAck(Ack::new(id))).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_message() {
    let dir = std::env::temp_dir().join(format!("quichub-durability-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut relay, addr) = start(&dir);

    // Two persistent subscribers: one goes offline, one stays and acknowledges.
    let (mut offline, ack) = Raw::connect_with(addr, persistent("offline")).await;
    assert!(!ack.session_present);
    subscribe(&mut offline, "d/#").await;
    offline.send(&Packet::Disconnect(Default::default())).await;
    assert_eq!(offline.closed().await, None);
    let (mut online, _) = Raw::connect_with(addr, persistent("online")).await;
    subscribe(&mut online, "d/#").await;
    let mut online_got = BTreeSet::new();

    // A retained message, acknowledged before the crash.
    let (mut p, _) = Raw::connect_with(
        addr,
        Connect {
            clean_start: true,
            properties: Properties::default(),
            ..persistent("retainer")
        },
    )
    .await;
    p.send(&Packet::Publish(Publish {
        qos: QoS::AtLeastOnce,
        retain: true,
        topic: "state/door".into(),
        packet_id: Some(1),
        payload: Bytes::from_static(b"open"),
        ..Default::default()
    }))
    .await;
    assert!(matches!(p.recv().await, Some(Packet::PubAck(_))));

    // The publisher pipelines QoS 1 PUBLISHes on a raw socket and records the
    // PUBACKs; the relay is killed once 300 have been acknowledged.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut b = BytesMut::new();
    quichub_mqtt::encode(
        &Packet::Connect(Connect {
            clean_start: true,
            properties: Properties::default(),
            ..persistent("publisher")
        }),
        Version::V5,
        &mut b,
    )
    .unwrap();
    tcp.write_all(&b).await.unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    let writer = tokio::spawn(async move {
        // Below the broker's offline queue limit (1000 per session), past
        // which it drops messages for that session by design.
        for i in 1..=900u16 {
            let mut b = BytesMut::new();
            quichub_mqtt::encode(
                &Packet::Publish(Publish {
                    qos: QoS::AtLeastOnce,
                    topic: "d/x".into(),
                    packet_id: Some(i),
                    payload: Bytes::from(format!("m{i}")),
                    ..Default::default()
                }),
                Version::V5,
                &mut b,
            )
            .unwrap();
            if wr.write_all(&b).await.is_err() {
                return;
            }
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut acked = BTreeSet::new();
    let mut buf = BytesMut::new();
    let mut killed = false;
    loop {
        // The online subscriber keeps acknowledging what it gets meanwhile.
        drain(&mut online, Duration::from_millis(1), &mut online_got).await;
        let n = match tokio::time::timeout(Duration::from_secs(5), rd.read_buf(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
            Err(_) => panic!("publisher stalled"),
        };
        while let Ok(Some(p)) = quichub_mqtt::decode(&mut buf, Some(Version::V5), usize::MAX) {
            if let Packet::PubAck(a) = p {
                acked.insert(format!("m{}", a.packet_id));
            }
        }
        if n == 0 {
            break;
        }
        if !killed && acked.len() >= 300 {
            relay.0.kill().unwrap(); // SIGKILL
            killed = true;
        }
    }
    assert!(killed, "the publisher finished before the kill");
    relay.0.wait().unwrap();
    writer.abort();
    assert!(acked.len() >= 300);

    // Restart on the same state.
    let (relay, addr) = start(&dir);
    let (mut offline, ack) = Raw::connect_with(addr, persistent("offline")).await;
    assert!(ack.session_present, "persistent session survives");
    let mut offline_got = BTreeSet::new();
    within(
        30,
        drain(&mut offline, Duration::from_millis(1500), &mut offline_got),
    )
    .await;
    let missing: Vec<_> = acked.difference(&offline_got).collect();
    assert!(
        missing.is_empty(),
        "offline session lost acknowledged {missing:?}"
    );

    let (mut online, ack) = Raw::connect_with(addr, persistent("online")).await;
    assert!(ack.session_present);
    within(
        30,
        drain(&mut online, Duration::from_millis(1500), &mut online_got),
    )
    .await;
    let missing: Vec<_> = acked.difference(&online_got).collect();
    assert!(
        missing.is_empty(),
        "online session lost acknowledged {missing:?}"
    );

    // The retained message, for a new subscriber.
    let (mut fresh, _) = Raw::connect_with(
        addr,
        Connect {
            clean_start: true,
            properties: Properties::default(),
            ..persistent("fresh")
        },
    )
    .await;
    subscribe(&mut fresh, "state/#").await;
    match fresh.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!(p.payload, Bytes::from_static(b"open"));
            assert!(p.retain);
        }
        other => panic!("expected the retained message, got {other:?}"),
    }
    eprintln!(
        "acknowledged before kill: {}, offline got {}, online got {}",
        acked.len(),
        offline_got.len(),
        online_got.len()
    );
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

/// QoS 2 in flight survives kill -9 as session state (§4.4): after the
/// restart, a message the subscriber had PUBREC'd gets only its PUBREL
/// again, and one it had received but not acknowledged comes again with its
/// original Packet Identifier and DUP, so the client can recognise both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_keeps_qos2_packet_ids_and_pubrel_state() {
    let dir = std::env::temp_dir().join(format!("quichub-durability-q2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut relay, addr) = start(&dir);
    let (mut sub, _) = Raw::connect_with(addr, persistent("q2-durable")).await;
    sub.subscribe("q2/durable", QoS::ExactlyOnce).await;
    let (mut publisher, _) = Raw::connect_with(addr, persistent("q2-pub")).await;
    // Two completed flows first: "a" and "b" get identifiers 3 and 4, not
    // the ones a fresh connection would pick.
    qos1_flows(&mut publisher, &mut sub, "q2/durable", 50, 2).await;
    for (i, body) in ["a", "b"].into_iter().enumerate() {
        let id = i as u16 + 1;
        publisher
            .send(&Packet::Publish(Publish {
                qos: QoS::ExactlyOnce,
                topic: "q2/durable".into(),
                packet_id: Some(id),
                payload: Bytes::from_static(body.as_bytes()),
                ..Default::default()
            }))
            .await;
        assert!(matches!(publisher.recv().await, Some(Packet::PubRec(_))));
        publisher.send(&Packet::PubRel(Ack::new(id))).await;
        assert!(matches!(publisher.recv().await, Some(Packet::PubComp(_))));
    }
    let mut ids = Vec::new();
    while ids.len() < 2 {
        match sub.recv().await {
            Some(Packet::Publish(p)) => ids.push(p.packet_id.unwrap()),
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
    assert_eq!(ids, [3, 4]);
    sub.send(&Packet::PubRec(Ack::new(ids[0]))).await;
    assert!(matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.packet_id == ids[0]));
    // The log is written in order: once a later QoS 1 publish to the
    // persistent session is acknowledged (only when durable), the PUBREC's
    // record is on disk too.
    publisher
        .send(&Packet::Publish(Publish {
            qos: QoS::AtLeastOnce,
            topic: "q2/durable".into(),
            packet_id: Some(60),
            payload: Bytes::from_static(b"barrier"),
            ..Default::default()
        }))
        .await;
    assert!(matches!(publisher.recv().await, Some(Packet::PubAck(_))));
    relay.0.kill().unwrap();
    relay.0.wait().unwrap();
    drop(relay);
    let (_relay, addr) = start(&dir);
    let (mut sub, ack) = Raw::connect_with(addr, persistent("q2-durable")).await;
    assert!(ack.session_present);
    match sub.recv().await {
        Some(Packet::PubRel(r)) => assert_eq!(r.packet_id, ids[0], "PUBREL, not PUBLISH"),
        other => panic!("expected the PUBREL again, got {other:?}"),
    }
    match sub.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!(p.packet_id, Some(ids[1]), "original Packet Identifier");
            assert!(p.dup);
            assert_eq!(&p.payload[..], b"b");
        }
        other => panic!("expected b again, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
