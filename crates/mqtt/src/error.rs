//! Decoding and encoding errors.

use thiserror::Error;

use crate::reason;

/// Why a packet could not be decoded.
///
/// Every variant is fatal for the connection: the broker answers with the
/// reason code of [`DecodeError::reason_code`] (in a CONNACK if the failed
/// packet is the CONNECT, in a DISCONNECT for MQTT 5 otherwise) and closes it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The Remaining Length (or another Variable Byte Integer) is longer than
    /// four bytes.
    #[error("variable byte integer longer than 4 bytes")]
    MalformedVarInt,
    /// The packet, as announced by its fixed header, is larger than the
    /// maximum packet size; detected before its body is buffered.
    #[error("packet of {size} bytes exceeds the maximum of {max}")]
    PacketTooLarge {
        /// Total size of the packet (fixed header included).
        size: usize,
        /// The limit that was passed to `decode`.
        max: usize,
    },
    /// Reserved packet type (0, or 15 before MQTT 5).
    #[error("invalid packet type {0}")]
    InvalidPacketType(u8),
    /// The flags of the fixed header are wrong for the packet type.
    #[error("invalid fixed header flags {flags:#06b} for packet type {packet_type}")]
    InvalidFlags {
        /// The packet type (high nibble of the first byte).
        packet_type: u8,
        /// The flags (low nibble).
        flags: u8,
    },
    /// A QoS field holds 3.
    #[error("invalid QoS 3")]
    InvalidQoS,
    /// PUBLISH with QoS 0 and the DUP flag set (MQTT 5).
    #[error("DUP flag set on a QoS 0 PUBLISH")]
    DupWithQoS0,
    /// The body ends before a field it announces.
    #[error("packet body truncated")]
    UnexpectedEof,
    /// Bytes are left in the body after its last field.
    #[error("{0} trailing bytes in packet body")]
    TrailingBytes(usize),
    /// A string is not valid UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// A string contains U+0000.
    #[error("string contains U+0000")]
    NullCharacter,
    /// A Packet Identifier is 0 where a non-zero one is required.
    #[error("packet identifier 0")]
    ZeroPacketId,
    /// SUBSCRIBE or UNSUBSCRIBE without any topic filter.
    #[error("SUBSCRIBE or UNSUBSCRIBE without topic filters")]
    NoTopicFilters,
    /// Reserved bits (CONNACK flags, subscription options) are not zero.
    #[error("reserved bits set")]
    ReservedBitsSet,
    /// Retain Handling of 3 in the subscription options.
    #[error("invalid retain handling 3")]
    InvalidRetainHandling,
    /// The protocol name of a CONNECT is neither `MQTT` nor `MQIsdp`.
    #[error("invalid protocol name")]
    InvalidProtocolName,
    /// The protocol level of a CONNECT is not 4 (3.1.1) or 5 (5.0).
    #[error("unsupported protocol level {0}")]
    UnsupportedProtocolVersion(u8),
    /// The reserved bit of the CONNECT flags is set.
    #[error("CONNECT reserved flag set")]
    ConnectReservedFlag,
    /// Will QoS or Will Retain set without the Will Flag, or Will QoS 3.
    #[error("inconsistent will flags")]
    InvalidWillFlags,
    /// MQTT 3.1.1 CONNECT with the password flag but no user name.
    #[error("password without user name")]
    PasswordWithoutUsername,
    /// Before CONNECT only a CONNECT may be received.
    #[error("expected CONNECT, got packet type {0}")]
    ExpectedConnect(u8),
    /// An unknown property identifier.
    #[error("unknown property identifier {0:#04x}")]
    UnknownProperty(u8),
    /// A property not allowed in this packet type.
    #[error("property {0:#04x} not allowed in this packet")]
    PropertyNotAllowed(u8),
    /// A single-valued property appears twice.
    #[error("duplicate property {0:#04x}")]
    DuplicateProperty(u8),
    /// A property has an invalid value (e.g. a boolean that is not 0 or 1,
    /// a Receive Maximum of 0, a Subscription Identifier of 0).
    #[error("invalid value for property {0:#04x}")]
    InvalidPropertyValue(u8),
    /// A PUBLISH topic name (or will topic) contains wildcards, or is empty
    /// where it must not be.
    #[error("invalid topic name")]
    InvalidTopicName,
    /// MQTT 5 PUBLISH with an empty topic name and no Topic Alias.
    #[error("empty topic name without a topic alias")]
    EmptyTopicWithoutAlias,
    /// A reason or return code that is reserved in this packet type.
    #[error("invalid reason code {0:#04x}")]
    InvalidReasonCode(u8),
}

impl DecodeError {
    /// The MQTT 5 reason code to report this error with (in a CONNACK or a
    /// DISCONNECT). Use [`reason::connack_v311`] to map it for a 3.1.1 CONNACK.
    pub fn reason_code(&self) -> u8 {
        use DecodeError::*;
        match self {
            PacketTooLarge { .. } => reason::PACKET_TOO_LARGE,
            InvalidProtocolName | UnsupportedProtocolVersion(_) => {
                reason::UNSUPPORTED_PROTOCOL_VERSION
            }
            InvalidTopicName => reason::TOPIC_NAME_INVALID,
            ZeroPacketId
            | NoTopicFilters
            | InvalidRetainHandling
            | ExpectedConnect(_)
            | PropertyNotAllowed(_)
            | DuplicateProperty(_)
            | InvalidPropertyValue(_)
            | DupWithQoS0
            | EmptyTopicWithoutAlias => reason::PROTOCOL_ERROR,
            MalformedVarInt
            | InvalidPacketType(_)
            | InvalidFlags { .. }
            | InvalidQoS
            | UnexpectedEof
            | TrailingBytes(_)
            | InvalidUtf8
            | NullCharacter
            | ReservedBitsSet
            | ConnectReservedFlag
            | InvalidWillFlags
            | PasswordWithoutUsername
            | UnknownProperty(_)
            | InvalidReasonCode(_) => reason::MALFORMED_PACKET,
        }
    }
}

/// Why a packet could not be encoded. These are caller bugs, not peer input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// A string or binary field is longer than 65535 bytes.
    #[error("string or binary field of {0} bytes exceeds 65535")]
    FieldTooLong(usize),
    /// The packet's Remaining Length exceeds 268,435,455.
    #[error("remaining length {0} exceeds 268435455")]
    PacketTooLarge(usize),
    /// A Variable Byte Integer value (Subscription Identifier) exceeds
    /// 268,435,455 or is 0.
    #[error("invalid variable byte integer value {0}")]
    InvalidVarInt(u32),
    /// PUBLISH packet id present with QoS 0 or missing with QoS > 0, or a
    /// packet id of 0.
    #[error("packet identifier does not match the QoS or is 0")]
    InvalidPacketId,
    /// The packet type does not exist in this protocol version (AUTH in 3.1.1).
    #[error("packet not supported by this protocol version")]
    UnsupportedInVersion,
    /// MQTT 3.1.1 CONNECT with a password but no user name.
    #[error("password without user name")]
    PasswordWithoutUsername,
    /// Retain Handling above 2.
    #[error("invalid retain handling {0}")]
    InvalidRetainHandling(u8),
}
