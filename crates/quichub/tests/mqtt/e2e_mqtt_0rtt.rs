//! MQTT over QUIC with TLS session resumption and 0-RTT (docs/zero-rtt.md):
//! a client that holds a ticket from a first connection connects again and
//! sends CONNECT and a QoS 1 PUBLISH as early data; the server takes them
//! before the handshake completes and a subscriber (MQTT over TCP) gets the
//! message. A QoS 0 PUBLISH sent in the same early data is held back by the
//! replay gate until the handshake completes (unit-tested in
//! `quichub_gateway::quic`), and still arrives, after the QoS 1 one.

use std::net::SocketAddr;
use std::time::Duration;

use quichub_mqtt::{Packet, QoS, Version};
use quichub_net::client::{Client, Dialed};
use quichub_net::server::ALPN_MQTT;
use quichub_net::tls::{Identity, Verify};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

const STEP: Duration = Duration::from_secs(10);

struct Gateway {
    udp: SocketAddr,
    tcp: SocketAddr,
    identity: Identity,
    _hub: quichub_hub::Hub,
}

/// What `quichub relay` runs (a [`quichub_hub::Hub`]) with MQTT over TCP and
/// QUIC on loopback.
async fn gateway() -> Gateway {
    let dir = std::env::temp_dir().join(format!("quichub-mqtt-0rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let identity = Identity::self_signed(&["localhost", "127.0.0.1"]).unwrap();
    identity
        .write_pem(&dir.join("cert.pem"), &dir.join("key.pem"))
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
    // The certificate is loaded: the files are no longer needed.
    let _ = std::fs::remove_dir_all(&dir);
    Gateway {
        udp: hub.addr(),
        tcp: hub.mqtt_addr().unwrap(),
        identity,
        _hub: hub,
    }
}

/// One packet as MQTT 3.1.1 bytes, by the project's codec.
fn packet(p: Packet) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    quichub_mqtt::encode(&p, Version::V311, &mut b).unwrap();
    b.to_vec()
}

/// CONNECT, MQTT 3.1.1, clean session, keep-alive 60 s.
fn connect(client: &str) -> Vec<u8> {
    packet(Packet::Connect(quichub_mqtt::Connect {
        version: Version::V311,
        client_id: client.into(),
        clean_start: true,
        keep_alive: 60,
        username: None,
        password: None,
        will: None,
        properties: Default::default(),
    }))
}

fn publish(topic: &str, qos: u8, id: u16, payload: &[u8]) -> Vec<u8> {
    let qos = QoS::from_u8(qos).unwrap();
    packet(Packet::Publish(quichub_mqtt::Publish {
        qos,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then_some(id),
        payload: bytes::Bytes::copy_from_slice(payload),
        ..Default::default()
    }))
}

fn subscribe(id: u16, filter: &str, qos: u8) -> Vec<u8> {
    packet(Packet::Subscribe(quichub_mqtt::Subscribe {
        packet_id: id,
        filters: vec![quichub_mqtt::SubscribeFilter {
            filter: filter.into(),
            options: quichub_mqtt::SubscriptionOptions {
                qos: QoS::from_u8(qos).unwrap(),
                ..Default::default()
            },
        }],
        properties: Default::default(),
    }))
}

/// Reads one packet: its first byte and its body.
async fn read_packet(r: &mut (impl AsyncRead + Unpin)) -> (u8, Vec<u8>) {
    let first = r.read_u8().await.unwrap();
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let b = r.read_u8().await.unwrap();
        len |= usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            break;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.unwrap();
    (first, body)
}

/// A PUBLISH's topic and payload.
fn topic_payload(first: u8, body: &[u8]) -> (String, Vec<u8>) {
    let n = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let topic = String::from_utf8(body[2..2 + n].to_vec()).unwrap();
    let skip = if (first >> 1) & 3 > 0 { 2 } else { 0 };
    (topic, body[2 + n + skip..].to_vec())
}

#[tokio::test]
async fn resumed_connection_publishes_in_0rtt() {
    let gw = gateway().await;

    // A subscriber over TCP.
    let mut sub = tokio::net::TcpStream::connect(gw.tcp).await.unwrap();
    sub.write_all(&[connect("sub"), subscribe(1, "zr/#", 1)].concat())
        .await
        .unwrap();
    assert_eq!(read_packet(&mut sub).await.0, 0x20, "CONNACK");
    assert_eq!(read_packet(&mut sub).await.0, 0x90, "SUBACK");

    let client = Client::new(
        "127.0.0.1:0".parse().unwrap(),
        Verify::Fingerprints(vec![gw.identity.fingerprint().to_vec()]),
    )
    .unwrap();

    // First connection: no ticket yet, so a full handshake.
    let first = tokio::time::timeout(STEP, client.dial(gw.udp, "localhost", ALPN_MQTT, true))
        .await
        .unwrap()
        .unwrap();
    let Dialed::Full(conn) = first else {
        panic!("0-RTT without a ticket")
    };
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&connect("pub")).await.unwrap();
    assert_eq!(read_packet(&mut recv).await.0, 0x20, "CONNACK");
    // A round trip after the handshake: the session tickets are in.
    send.write_all(&[0xc0, 0]).await.unwrap();
    assert_eq!(read_packet(&mut recv).await.0, 0xd0, "PINGRESP");
    send.write_all(&[0xe0, 0]).await.unwrap();
    send.finish().unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), recv.read_to_end(64)).await;
    conn.close(0u32.into(), b"");

    // Second connection: resumed, CONNECT + QoS 1 + QoS 0 PUBLISH as 0-RTT data.
    let second = tokio::time::timeout(STEP, client.dial(gw.udp, "localhost", ALPN_MQTT, true))
        .await
        .unwrap()
        .unwrap();
    let Dialed::Early { conn, accepted } = second else {
        panic!("no 0-RTT with a ticket")
    };
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let early = [
        connect("pub"),
        publish("zr/qos1", 1, 7, b"early-1"),
        publish("zr/qos0", 0, 0, b"early-0"),
    ]
    .concat();
    send.write_all(&early).await.unwrap();
    // Before the handshake completes, this was sent as 0-RTT data: the
    // server took it.
    let took = tokio::time::timeout(STEP, accepted).await.unwrap();
    assert!(took, "the server rejected the 0-RTT data");
    let (connack, body) = read_packet(&mut recv).await;
    assert_eq!(connack, 0x20, "CONNACK");
    assert_eq!(body[1], 0, "CONNACK accepted");
    let (puback, body) = read_packet(&mut recv).await;
    assert_eq!((puback, &body[..]), (0x40, &[0u8, 7][..]), "PUBACK 7");

    // The subscriber gets both, the QoS 1 one first.
    let mut got = Vec::new();
    for _ in 0..2 {
        let (first, body) = tokio::time::timeout(STEP, read_packet(&mut sub))
            .await
            .unwrap();
        assert_eq!(first >> 4, 3, "PUBLISH");
        got.push(topic_payload(first, &body));
        if (first >> 1) & 3 == 1 {
            // PUBACK the delivery.
            let n = usize::from(u16::from_be_bytes([body[0], body[1]]));
            let id = [body[2 + n], body[3 + n]];
            sub.write_all(&[0x40, 2, id[0], id[1]]).await.unwrap();
        }
    }
    assert_eq!(
        got,
        [
            ("zr/qos1".to_string(), b"early-1".to_vec()),
            ("zr/qos0".to_string(), b"early-0".to_vec()),
        ]
    );
    conn.close(0u32.into(), b"");

    // Resumed without 0-RTT: a full handshake round trip, still resumed.
    let third = tokio::time::timeout(STEP, client.dial(gw.udp, "localhost", ALPN_MQTT, false))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(third, Dialed::Full(_)));
    third.connection().close(0u32.into(), b"");
}
