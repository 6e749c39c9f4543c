//! The tests' one MQTT client, on the project's codec (`quichub_mqtt`):
//! it sends what a test says, acknowledges nothing by itself and keeps no
//! session, so a test controls every packet; [`Raw::send_raw`] writes bytes
//! no real client would send. Over TCP by default, or any byte stream: TLS,
//! a QUIC stream pair joined by [`tokio::io::join`]. Interoperability with
//! real clients is what mosquitto, paho and the QUIC clients are for.

use bytes::BytesMut;
use quichub_mqtt::{Packet, Properties, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::within;

/// An MQTT connection on `S` that does only what the test asks.
pub struct Raw<S = TcpStream> {
    io: S,
    buf: BytesMut,
    pub version: Version,
}

/// A CONNECT for a session that outlives its connection: `clean_start`
/// false resumes it; in 5 the session expires 60 s after a disconnect
/// (3.1.1 sessions without Clean Session never expire).
pub fn persistent_connect(version: Version, id: &str, clean_start: bool) -> quichub_mqtt::Connect {
    quichub_mqtt::Connect {
        version,
        client_id: id.into(),
        clean_start,
        keep_alive: 30,
        username: None,
        password: None,
        will: None,
        properties: Properties {
            session_expiry_interval: (version == Version::V5).then_some(60),
            ..Properties::default()
        },
    }
}

/// `n` complete QoS 1 flows on `topic` from `publisher` (identifiers from
/// `first_id`) to `sub`, which acknowledges each: afterwards the broker's
/// next identifiers towards `sub` are past the ones a fresh connection would
/// pick, so a test can tell reused identifiers from new ones.
pub async fn qos1_flows<S: AsyncRead + AsyncWrite + Unpin>(
    publisher: &mut Raw<S>,
    sub: &mut Raw<S>,
    topic: &str,
    first_id: u16,
    n: u16,
) {
    for i in 0..n {
        publisher
            .send(&Packet::Publish(quichub_mqtt::Publish {
                qos: quichub_mqtt::QoS::AtLeastOnce,
                topic: topic.into(),
                packet_id: Some(first_id + i),
                payload: bytes::Bytes::from_static(b"warm-up"),
                ..Default::default()
            }))
            .await;
        assert!(matches!(publisher.recv().await, Some(Packet::PubAck(_))));
        match sub.recv().await {
            Some(Packet::Publish(p)) => {
                sub.send(&Packet::PubAck(quichub_mqtt::Ack::new(
                    p.packet_id.unwrap(),
                )))
                .await
            }
            other => panic!("expected the warm-up PUBLISH, got {other:?}"),
        }
    }
}

#[cfg(feature = "hub")]
impl Raw {
    /// Connects to `gw`'s MQTT port with Clean Start and expects success.
    pub async fn connect(gw: &crate::TestGateway, version: Version, id: &str) -> Raw {
        let (r, ack) = Raw::connect_with(
            gw.mqtt,
            quichub_mqtt::Connect {
                version,
                client_id: id.into(),
                clean_start: true,
                keep_alive: 30,
                username: None,
                password: None,
                will: None,
                properties: Properties::default(),
            },
        )
        .await;
        assert_eq!(ack.code, 0);
        r
    }
}

impl Raw {
    /// Sends `connect` to TCP `addr` and returns the CONNACK.
    pub async fn connect_with(
        addr: std::net::SocketAddr,
        connect: quichub_mqtt::Connect,
    ) -> (Raw, quichub_mqtt::ConnAck) {
        Raw::handshake(TcpStream::connect(addr).await.unwrap(), connect).await
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    /// A client on `io` that has sent nothing yet, speaking `version`.
    pub fn new(io: S, version: Version) -> Self {
        Raw {
            io,
            buf: BytesMut::new(),
            version,
        }
    }

    /// Sends `connect` on `io` and returns the CONNACK.
    pub async fn handshake(io: S, connect: quichub_mqtt::Connect) -> (Self, quichub_mqtt::ConnAck) {
        let mut r = Raw::new(io, connect.version);
        r.send(&Packet::Connect(connect)).await;
        match r.recv().await {
            Some(Packet::ConnAck(a)) => (r, a),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    pub async fn send(&mut self, p: &Packet) {
        let mut b = BytesMut::new();
        quichub_mqtt::encode(p, self.version, &mut b).unwrap();
        self.io.write_all(&b).await.unwrap();
    }

    /// SUBSCRIBE to one filter at `qos` and expect the SUBACK.
    pub async fn subscribe(&mut self, filter: &str, qos: quichub_mqtt::QoS) {
        self.send(&Packet::Subscribe(quichub_mqtt::Subscribe {
            packet_id: 1,
            filters: vec![quichub_mqtt::SubscribeFilter {
                filter: filter.into(),
                options: quichub_mqtt::SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            }],
            properties: Properties::default(),
        }))
        .await;
        assert!(matches!(self.recv().await, Some(Packet::SubAck(_))));
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
    }

    /// The next packet, or `None` once the broker closed the connection.
    pub async fn recv(&mut self) -> Option<Packet> {
        self.recv_within(5).await
    }

    /// [`Raw::recv`] with a bound of `secs` seconds, for a step whose work
    /// grows with the test's data (a loaded machine takes its time).
    pub async fn recv_within(&mut self, secs: u64) -> Option<Packet> {
        within(secs, self.next()).await
    }

    /// The next packet, or `None` once the connection ends or `secs` pass
    /// (for a step where silence is an answer).
    pub async fn try_recv_within(&mut self, secs: u64) -> Option<Packet> {
        tokio::time::timeout(std::time::Duration::from_secs(secs), self.next())
            .await
            .ok()
            .flatten()
    }

    async fn next(&mut self) -> Option<Packet> {
        loop {
            if let Some(p) =
                quichub_mqtt::decode(&mut self.buf, Some(self.version), usize::MAX).unwrap()
            {
                return Some(p);
            }
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Reads until the broker's DISCONNECT (its reason code) or the close.
    pub async fn closed(&mut self) -> Option<u8> {
        let mut code = None;
        while let Some(p) = self.recv().await {
            if let Packet::Disconnect(d) = p {
                code = Some(d.code);
            }
        }
        code
    }
}
