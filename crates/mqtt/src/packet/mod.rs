//! MQTT control packets: their types, [`decode`], [`encode`] and
//! [`encoded_len`].
//!
//! The same types serve MQTT 3.1.1 and 5.0. Fields that exist only in 5.0
//! (properties, reason codes of acks, subscription options beyond QoS) are
//! left at their defaults when decoding 3.1.1 and are not written when
//! encoding 3.1.1.

use bytes::Bytes;

use crate::properties::Properties;

mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use decode::{decode, DEFAULT_MAX_PACKET_SIZE};
pub use encode::{encode, encoded_len};

/// Protocol version, from the CONNECT's Protocol Level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// MQTT 3.1.1, protocol level 4.
    V311,
    /// MQTT 5.0, protocol level 5.
    V5,
}

impl Version {
    /// The Protocol Level byte of the CONNECT.
    pub fn level(self) -> u8 {
        match self {
            Version::V311 => 4,
            Version::V5 => 5,
        }
    }

    /// The version of a Protocol Level, if supported.
    pub fn from_level(level: u8) -> Option<Version> {
        match level {
            4 => Some(Version::V311),
            5 => Some(Version::V5),
            _ => None,
        }
    }
}

/// Quality of Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    /// QoS 0.
    #[default]
    AtMostOnce = 0,
    /// QoS 1.
    AtLeastOnce = 1,
    /// QoS 2.
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS of a two-bit field value; `None` for 3.
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }

    /// The wire value.
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// An MQTT control packet.
// CONNECT holds two property sets (its own and the will's) and so is about
// twice the size of PUBLISH; boxing it would buy little (one CONNECT per
// connection) and cost the plain `Packet::Connect(Connect)` shape.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// CONNECT (1).
    Connect(Connect),
    /// CONNACK (2).
    ConnAck(ConnAck),
    /// PUBLISH (3).
    Publish(Publish),
    /// PUBACK (4).
    PubAck(Ack),
    /// PUBREC (5).
    PubRec(Ack),
    /// PUBREL (6).
    PubRel(Ack),
    /// PUBCOMP (7).
    PubComp(Ack),
    /// SUBSCRIBE (8).
    Subscribe(Subscribe),
    /// SUBACK (9).
    SubAck(SubAck),
    /// UNSUBSCRIBE (10).
    Unsubscribe(Unsubscribe),
    /// UNSUBACK (11).
    UnsubAck(UnsubAck),
    /// PINGREQ (12).
    PingReq,
    /// PINGRESP (13).
    PingResp,
    /// DISCONNECT (14).
    Disconnect(Disconnect),
    /// AUTH (15, MQTT 5 only).
    Auth(Auth),
}

impl Packet {
    /// The packet type number (high nibble of the first byte).
    pub fn packet_type(&self) -> u8 {
        match self {
            Packet::Connect(_) => 1,
            Packet::ConnAck(_) => 2,
            Packet::Publish(_) => 3,
            Packet::PubAck(_) => 4,
            Packet::PubRec(_) => 5,
            Packet::PubRel(_) => 6,
            Packet::PubComp(_) => 7,
            Packet::Subscribe(_) => 8,
            Packet::SubAck(_) => 9,
            Packet::Unsubscribe(_) => 10,
            Packet::UnsubAck(_) => 11,
            Packet::PingReq => 12,
            Packet::PingResp => 13,
            Packet::Disconnect(_) => 14,
            Packet::Auth(_) => 15,
        }
    }

    /// The packet type's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }
}

/// CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Protocol version (encoding a CONNECT uses this, not the `version`
    /// argument of [`encode`]).
    pub version: Version,
    /// Client Identifier; may be empty.
    pub client_id: String,
    /// Clean Start (5.0) / Clean Session (3.1.1).
    pub clean_start: bool,
    /// Keep Alive in seconds.
    pub keep_alive: u16,
    /// User Name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<Bytes>,
    /// Will Message.
    pub will: Option<Will>,
    /// CONNECT properties.
    pub properties: Properties,
}

/// The Will Message of a CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    /// Will Topic (a valid topic name).
    pub topic: String,
    /// Will Payload.
    pub payload: Bytes,
    /// Will QoS.
    pub qos: QoS,
    /// Will Retain.
    pub retain: bool,
    /// Will Properties (Will Delay Interval, Message Expiry Interval, Content
    /// Type, Response Topic, Correlation Data, Payload Format Indicator, User
    /// Properties).
    pub properties: Properties,
}

/// CONNACK.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnAck {
    /// Session Present.
    pub session_present: bool,
    /// MQTT 5 reason code, or MQTT 3.1.1 return code (0..=5): the encoder
    /// writes it as is, see [`crate::reason::connack_v311`].
    pub code: u8,
    /// CONNACK properties.
    pub properties: Properties,
}

/// PUBLISH.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Publish {
    /// DUP flag.
    pub dup: bool,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic Name; empty only in MQTT 5 with a Topic Alias property.
    pub topic: String,
    /// Packet Identifier: `Some` (non-zero) iff `qos` > 0.
    pub packet_id: Option<u16>,
    /// PUBLISH properties.
    pub properties: Properties,
    /// Application payload, a slice of the received buffer.
    pub payload: Bytes,
}

/// PUBACK, PUBREC, PUBREL or PUBCOMP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ack {
    /// Packet Identifier.
    pub packet_id: u16,
    /// MQTT 5 reason code (0 = success); not sent in 3.1.1, and omitted on the
    /// wire when 0 without properties.
    pub code: u8,
    /// Properties (Reason String, User Properties).
    pub properties: Properties,
}

impl Ack {
    /// A successful ack of `packet_id`.
    pub fn new(packet_id: u16) -> Ack {
        Ack {
            packet_id,
            ..Ack::default()
        }
    }
}

/// Subscription Options (§3.8.3.1). 3.1.1 has only the QoS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SubscriptionOptions {
    /// Maximum QoS.
    pub qos: QoS,
    /// No Local (5.0).
    pub no_local: bool,
    /// Retain As Published (5.0).
    pub retain_as_published: bool,
    /// Retain Handling, 0..=2 (5.0): 0 send retained on subscribe, 1 only if
    /// the subscription is new, 2 never.
    pub retain_handling: u8,
}

/// One topic filter of a SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    /// Topic Filter, possibly `$share/{group}/{filter}`. Not validated by
    /// the decoder beyond UTF-8: the broker answers invalid filters per
    /// filter (see [`crate::topic::parse_subscription`]).
    pub filter: String,
    /// Subscription Options.
    pub options: SubscriptionOptions,
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// Packet Identifier (non-zero).
    pub packet_id: u16,
    /// At least one topic filter.
    pub filters: Vec<SubscribeFilter>,
    /// Properties (Subscription Identifier, User Properties).
    pub properties: Properties,
}

/// SUBACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    /// Packet Identifier.
    pub packet_id: u16,
    /// One reason code per filter. For 3.1.1 codes other than 0, 1 and 2 are
    /// written as 0x80.
    pub codes: Vec<u8>,
    /// Properties (Reason String, User Properties).
    pub properties: Properties,
}

/// UNSUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    /// Packet Identifier (non-zero).
    pub packet_id: u16,
    /// At least one topic filter.
    pub filters: Vec<String>,
    /// Properties (User Properties).
    pub properties: Properties,
}

/// UNSUBACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    /// Packet Identifier.
    pub packet_id: u16,
    /// One reason code per filter (5.0); empty and not sent for 3.1.1.
    pub codes: Vec<u8>,
    /// Properties (Reason String, User Properties).
    pub properties: Properties,
}

/// DISCONNECT. 3.1.1 has no body: code and properties are not sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disconnect {
    /// Reason code (0 = normal disconnection).
    pub code: u8,
    /// Properties (Session Expiry Interval, Reason String, Server Reference,
    /// User Properties).
    pub properties: Properties,
}

/// AUTH (MQTT 5 only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// Reason code (0 success, 0x18 continue, 0x19 re-authenticate).
    pub code: u8,
    /// Properties (Authentication Method and Data, Reason String, User
    /// Properties).
    pub properties: Properties,
}
