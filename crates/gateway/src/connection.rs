//! MQTT over a byte stream (TCP, TLS): a thin shell that reads bytes into
//! the [`Session`](crate::session) and writes its output, run by the
//! connection driver.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::broker::Broker;
use crate::driver::{self, Link, Progress};

pub use crate::session::{credentials, ConnConfig, ConnError, Credentials, Peer, MAX_WRITE_BUFFER};

/// Serves one MQTT connection over TCP until it ends.
pub async fn serve<R, W>(
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    rd: R,
    wr: W,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    serve_peer(broker, cfg, Peer::default(), rd, wr).await
}

/// Serves one MQTT connection of `peer` until it ends.
pub async fn serve_peer<R, W>(
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    peer: Peer,
    rd: R,
    wr: W,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    driver::serve(broker, cfg, peer, &mut Stream { rd, wr }).await
}

/// A byte stream's two halves.
struct Stream<R, W> {
    rd: R,
    wr: W,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> Link for Stream<R, W> {
    async fn io(
        &mut self,
        input: &mut BytesMut,
        read: bool,
        output: &mut BytesMut,
        write: bool,
    ) -> std::io::Result<Progress> {
        tokio::select! {
            n = self.rd.read_buf(input), if read => Ok(Progress::Read { more: n? > 0 }),
            n = self.wr.write(output), if write => {
                let n = n?;
                if n == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                output.advance(n);
                Ok(Progress::Wrote)
            }
        }
    }

    async fn shutdown(&mut self) {
        let _ = self.wr.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::{Message, Source};
    use crate::metrics::{DropReason, Transport};
    use crate::store::{Fsync, Recovery, Store};
    use crate::BrokerConfig;
    use quichub_mqtt::{
        decode, encode, Connect, Packet, Properties, Publish, QoS, Subscribe, Version,
    };
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// MQTT 3.1.1 CONNECT, Clean Session, client `c`.
    const CONNECT: &[u8] = &[
        0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 1, b'c',
    ];
    /// QoS 1 PUBLISH on `a`, packet id 1.
    const PUB1: &[u8] = &[0x32, 6, 0, 1, b'a', 0, 1, b'1'];

    #[tokio::test]
    async fn connections_messages_and_bytes_are_counted() {
        let broker = Broker::new(BrokerConfig::default());
        let (mut client, server) = tokio::io::duplex(4096);
        let (rd, wr) = tokio::io::split(server);
        let b = broker.clone();
        let task = tokio::spawn(serve_peer(
            b,
            Arc::new(ConnConfig::default()),
            Peer::on(Transport::Quic),
            rd,
            wr,
        ));
        client.write_all(CONNECT).await.unwrap();
        let mut connack = [0; 4];
        client.read_exact(&mut connack).await.unwrap();
        assert_eq!(connack, [0x20, 2, 0, 0]);
        assert_eq!(
            broker.metrics.connections[Transport::Quic as usize].load(Relaxed),
            1
        );
        // SUBSCRIBE `a` QoS 1, then a QoS 1 PUBLISH on it comes back.
        client
            .write_all(&[0x82, 6, 0, 1, 0, 1, b'a', 1])
            .await
            .unwrap();
        let mut suback = [0; 5];
        client.read_exact(&mut suback).await.unwrap();
        assert_eq!(suback, [0x90, 3, 0, 1, 1]);
        client.write_all(PUB1).await.unwrap();
        // PUBACK (4 bytes) and the PUBLISH (8) in any order.
        let mut back = [0; 12];
        client.read_exact(&mut back).await.unwrap();
        let m = &broker.metrics;
        assert_eq!(m.received_by_qos[1].load(Relaxed), 1);
        assert_eq!(m.sent_by_qos[1].load(Relaxed), 1);
        assert_eq!(
            m.bytes_received.load(Relaxed),
            (CONNECT.len() + 8 + PUB1.len()) as u64
        );
        assert_eq!(m.bytes_sent.load(Relaxed), 4 + 5 + 12);
        // DISCONNECT: the connection is no longer counted.
        client.write_all(&[0xe0, 0]).await.unwrap();
        task.await.unwrap().unwrap();
        assert_eq!(m.connected(), 0);
        assert_eq!(m.connections_accepted(), 1);
    }

    /// Writes `p` and reads the next packet the broker sends.
    async fn exchange(
        client: &mut tokio::io::DuplexStream,
        buf: &mut BytesMut,
        v: Version,
        p: Option<Packet>,
    ) -> Packet {
        if let Some(p) = p {
            let mut out = BytesMut::new();
            encode(&p, v, &mut out).unwrap();
            client.write_all(&out).await.unwrap();
        }
        loop {
            if let Some(p) = decode(buf, Some(v), 1 << 20).unwrap() {
                return p;
            }
            let n = tokio::time::timeout(Duration::from_secs(5), client.read_buf(buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed");
        }
    }

    fn connect(v: Version, user: &str, pass: &str, will: Option<&str>) -> Packet {
        Packet::Connect(Connect {
            version: v,
            client_id: "c1".into(),
            clean_start: true,
            keep_alive: 0,
            username: Some(user.into()),
            password: Some(bytes::Bytes::copy_from_slice(pass.as_bytes())),
            will: will.map(|t| quichub_mqtt::Will {
                topic: t.into(),
                payload: bytes::Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: Properties::default(),
            }),
            properties: Properties::default(),
        })
    }

    fn publish(topic: &str, qos: QoS, id: u16) -> Packet {
        Packet::Publish(Publish {
            qos,
            topic: topic.into(),
            packet_id: (qos != QoS::AtMostOnce).then_some(id),
            payload: bytes::Bytes::from_static(b"x"),
            ..Publish::default()
        })
    }

    #[tokio::test]
    async fn auth_reason_codes_on_the_wire() {
        let (_d, cfg, _key) = crate::access::tests::setup("wire");
        let broker = Broker::new(BrokerConfig::default());
        broker.set_auth(quichub_auth::SharedAuth::new(
            quichub_auth::Auth::load(&cfg).unwrap(),
        ));
        let start = || {
            let (client, server) = tokio::io::duplex(1 << 16);
            let (rd, wr) = tokio::io::split(server);
            let task = tokio::spawn(serve(
                broker.clone(),
                Arc::new(ConnConfig::default()),
                rd,
                wr,
            ));
            (client, task)
        };
        let code = |p: Packet| match p {
            Packet::ConnAck(a) => a.code,
            Packet::PubAck(a) | Packet::PubRec(a) => a.code,
            p => panic!("unexpected {}", p.name()),
        };
        // Wrong password: 0x86 / 4.
        for (v, want) in [(Version::V5, 0x86), (Version::V311, 4)] {
            let (mut c, _t) = start();
            let mut buf = BytesMut::new();
            let p = exchange(&mut c, &mut buf, v, Some(connect(v, "alice", "x", None))).await;
            assert_eq!(code(p), want);
        }
        // alice: sensors/# but not sensors/secret; her Will on `other` is
        // accepted at CONNECT and dropped when it would be published.
        let v = Version::V5;
        let (mut c, task) = start();
        let mut buf = BytesMut::new();
        let hello = connect(v, "alice", "s3cret", Some("other/will"));
        assert_eq!(code(exchange(&mut c, &mut buf, v, Some(hello)).await), 0);
        let sub = Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: ["sensors/#", "#", "$share/g/sensors/+"]
                .into_iter()
                .map(|f| quichub_mqtt::SubscribeFilter {
                    filter: f.into(),
                    options: quichub_mqtt::SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        ..Default::default()
                    },
                })
                .collect(),
            properties: Properties::default(),
        });
        match exchange(&mut c, &mut buf, v, Some(sub)).await {
            Packet::SubAck(s) => assert_eq!(s.codes, [1, 0x87, 1]),
            p => panic!("unexpected {}", p.name()),
        }
        let refused = [
            publish("other/x", QoS::AtLeastOnce, 2),
            publish("other/y", QoS::ExactlyOnce, 3),
            publish("$SYS/x", QoS::AtLeastOnce, 4),
        ];
        for p in refused {
            assert_eq!(code(exchange(&mut c, &mut buf, v, Some(p)).await), 0x87);
        }
        // QoS 0 is dropped silently; the next QoS 1 is the first answer.
        let p0 = publish("other/z", QoS::AtMostOnce, 0);
        let mut out = BytesMut::new();
        encode(&p0, v, &mut out).unwrap();
        c.write_all(&out).await.unwrap();
        // A message on sensors/secret from elsewhere (an HTTP POST) matches
        // her `sensors/#` but she may not read it: not delivered.
        broker.publish(Message::new(
            "sensors/secret",
            bytes::Bytes::from_static(b"s"),
            QoS::AtLeastOnce,
            false,
            Source::Http,
        ));
        let ok = publish("sensors/a", QoS::AtLeastOnce, 5);
        let mut got = Vec::new();
        got.push(exchange(&mut c, &mut buf, v, Some(ok)).await);
        got.push(exchange(&mut c, &mut buf, v, None).await);
        let topics: Vec<String> = got
            .iter()
            .filter_map(|p| match p {
                Packet::Publish(p) => Some(p.topic.clone()),
                _ => None,
            })
            .collect();
        // Its own message (once: the session's overlapping subscriptions
        // make one delivery), not the one on sensors/secret before it.
        assert_eq!(topics, ["sensors/a"], "{got:?}");
        assert!(got
            .iter()
            .any(|p| matches!(p, Packet::PubAck(a) if a.packet_id == 5 && a.code == 0)));
        assert_eq!(broker.metrics.dropped(DropReason::NotAuthorized), 1);
        // Gone without DISCONNECT: the Will on `other/will` is not hers to
        // publish.
        drop(c);
        let _ = task.await;
        assert!(broker.retained("other/will").is_none());
        let m = &broker.auth().metrics;
        assert_eq!(m.get("mqtt", false, "bad_credentials"), 2);
        assert_eq!(m.get("mqtt", true, "password"), 1);
        // #, other/x, other/y, $SYS/x, other/z, the will.
        assert_eq!(m.get("mqtt", false, "not_authorized"), 6);
    }

    #[tokio::test]
    async fn a_failing_store_refuses_only_publishes_it_must_persist() {
        let dir = std::env::temp_dir().join(format!("quichub-conn-failing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (store, rec) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
        let broker = Broker::with_store(BrokerConfig::default(), store.clone(), rec);
        store.fail_next_writes(u32::MAX);
        store.append(crate::store::Record::Unretain { topic: "x".into() });
        let mut synced = store.synced();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !store.failed() {
                synced.changed().await.unwrap();
            }
        })
        .await
        .unwrap();
        let (mut client, server) = tokio::io::duplex(4096);
        let (rd, wr) = tokio::io::split(server);
        tokio::spawn(serve(broker, Arc::new(ConnConfig::default()), rd, wr));
        client.write_all(CONNECT).await.unwrap();
        let mut connack = [0; 4];
        client.read_exact(&mut connack).await.unwrap();
        assert_eq!(connack, [0x20, 2, 0, 0]);
        // Nobody persistent subscribes to `a`: nothing to write, so the
        // failing store does not matter.
        client.write_all(PUB1).await.unwrap();
        let mut puback = [0; 4];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut puback))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(puback, [0x40, 2, 0, 1]);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
