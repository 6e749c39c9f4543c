//! The MQTT 3.1.1 packets of the lab's own publishers, on the project's
//! codec (`quichub_mqtt`): what they send, encoded, and what comes back,
//! read whole from a byte stream (TCP, TLS, a QUIC stream).

use bytes::BytesMut;
use quichub_mqtt::{Packet, QoS, Version};
use tokio::io::{AsyncRead, AsyncReadExt};

/// `p` as MQTT 3.1.1 bytes.
pub fn encode(p: &Packet) -> Vec<u8> {
    let mut b = BytesMut::new();
    quichub_mqtt::encode(p, Version::V311, &mut b).expect("a valid packet");
    b.to_vec()
}

/// CONNECT: clean session, keep-alive 60 s.
pub fn connect(client_id: &str) -> Vec<u8> {
    encode(&Packet::Connect(quichub_mqtt::Connect {
        version: Version::V311,
        client_id: client_id.into(),
        clean_start: true,
        keep_alive: 60,
        username: None,
        password: None,
        will: None,
        properties: Default::default(),
    }))
}

/// PUBLISH of `payload` to `topic` at `qos`, packet id `id` (unused at QoS 0).
pub fn publish(topic: &str, qos: QoS, id: u16, payload: &[u8]) -> Vec<u8> {
    encode(&Packet::Publish(quichub_mqtt::Publish {
        qos,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then_some(id),
        payload: bytes::Bytes::copy_from_slice(payload),
        ..Default::default()
    }))
}

/// PINGREQ.
pub fn pingreq() -> Vec<u8> {
    encode(&Packet::PingReq)
}

/// DISCONNECT.
pub fn disconnect() -> Vec<u8> {
    encode(&Packet::Disconnect(Default::default()))
}

/// Whole packets from a byte stream; bytes read past one are kept for the
/// next.
#[derive(Default)]
pub struct PacketReader {
    buf: BytesMut,
}

impl PacketReader {
    /// The next packet from `r`.
    pub async fn next(&mut self, r: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<Packet> {
        loop {
            let decoded = quichub_mqtt::decode(
                &mut self.buf,
                Some(Version::V311),
                quichub_mqtt::DEFAULT_MAX_PACKET_SIZE,
            )?;
            if let Some(p) = decoded {
                return Ok(p);
            }
            if r.read_buf(&mut self.buf).await? == 0 {
                anyhow::bail!("the connection ended");
            }
        }
    }

    /// The next packet, which must be a CONNACK accepting the connection.
    pub async fn connack(&mut self, r: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<()> {
        match self.next(r).await? {
            Packet::ConnAck(c) if c.code == 0 => Ok(()),
            p => anyhow::bail!("expected CONNACK 0, got {p:?}"),
        }
    }

    /// The next packet, which must be a PUBACK.
    pub async fn puback(&mut self, r: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<()> {
        match self.next(r).await? {
            Packet::PubAck(_) => Ok(()),
            p => anyhow::bail!("expected PUBACK, got {p:?}"),
        }
    }
}
