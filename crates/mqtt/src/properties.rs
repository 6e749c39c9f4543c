//! MQTT 5 properties (§2.2.2): one typed field per property, with the table of
//! which packet may carry which.

use bytes::Bytes;

use crate::codec::{Counter, Reader, Sink};
use crate::error::{DecodeError, EncodeError};

/// Property identifiers.
pub mod id {
    /// Payload Format Indicator (byte).
    pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
    /// Message Expiry Interval (four-byte integer).
    pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
    /// Content Type (string).
    pub const CONTENT_TYPE: u8 = 0x03;
    /// Response Topic (string).
    pub const RESPONSE_TOPIC: u8 = 0x08;
    /// Correlation Data (binary).
    pub const CORRELATION_DATA: u8 = 0x09;
    /// Subscription Identifier (variable byte integer).
    pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
    /// Session Expiry Interval (four-byte integer).
    pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    /// Assigned Client Identifier (string).
    pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    /// Server Keep Alive (two-byte integer).
    pub const SERVER_KEEP_ALIVE: u8 = 0x13;
    /// Authentication Method (string).
    pub const AUTHENTICATION_METHOD: u8 = 0x15;
    /// Authentication Data (binary).
    pub const AUTHENTICATION_DATA: u8 = 0x16;
    /// Request Problem Information (byte).
    pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
    /// Will Delay Interval (four-byte integer).
    pub const WILL_DELAY_INTERVAL: u8 = 0x18;
    /// Request Response Information (byte).
    pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
    /// Response Information (string).
    pub const RESPONSE_INFORMATION: u8 = 0x1A;
    /// Server Reference (string).
    pub const SERVER_REFERENCE: u8 = 0x1C;
    /// Reason String (string).
    pub const REASON_STRING: u8 = 0x1F;
    /// Receive Maximum (two-byte integer).
    pub const RECEIVE_MAXIMUM: u8 = 0x21;
    /// Topic Alias Maximum (two-byte integer).
    pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
    /// Topic Alias (two-byte integer).
    pub const TOPIC_ALIAS: u8 = 0x23;
    /// Maximum QoS (byte).
    pub const MAXIMUM_QOS: u8 = 0x24;
    /// Retain Available (byte).
    pub const RETAIN_AVAILABLE: u8 = 0x25;
    /// User Property (string pair).
    pub const USER_PROPERTY: u8 = 0x26;
    /// Maximum Packet Size (four-byte integer).
    pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    /// Wildcard Subscription Available (byte).
    pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
    /// Subscription Identifier Available (byte).
    pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
    /// Shared Subscription Available (byte).
    pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
}

/// The property set of one MQTT 5 packet (or of a Will). Absent properties are
/// `None` / empty. Always empty for MQTT 3.1.1.
///
/// Encoding writes only the properties the packet type allows (§2.2.2.2), so a
/// set taken from one packet can be reused in another without leaking, e.g.,
/// a Topic Alias into a CONNACK.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    /// Payload Format Indicator: 0 unspecified bytes, 1 UTF-8 (PUBLISH, Will).
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval in seconds (PUBLISH, Will).
    pub message_expiry_interval: Option<u32>,
    /// Content Type (PUBLISH, Will).
    pub content_type: Option<String>,
    /// Response Topic (PUBLISH, Will).
    pub response_topic: Option<String>,
    /// Correlation Data (PUBLISH, Will).
    pub correlation_data: Option<Bytes>,
    /// Subscription Identifiers: any number in PUBLISH, at most one in
    /// SUBSCRIBE; each 1..=268,435,455.
    pub subscription_identifiers: Vec<u32>,
    /// Session Expiry Interval in seconds (CONNECT, CONNACK, DISCONNECT).
    pub session_expiry_interval: Option<u32>,
    /// Assigned Client Identifier (CONNACK).
    pub assigned_client_identifier: Option<String>,
    /// Server Keep Alive in seconds (CONNACK).
    pub server_keep_alive: Option<u16>,
    /// Authentication Method (CONNECT, CONNACK, AUTH).
    pub authentication_method: Option<String>,
    /// Authentication Data (CONNECT, CONNACK, AUTH).
    pub authentication_data: Option<Bytes>,
    /// Request Problem Information (CONNECT).
    pub request_problem_information: Option<bool>,
    /// Will Delay Interval in seconds (Will).
    pub will_delay_interval: Option<u32>,
    /// Request Response Information (CONNECT).
    pub request_response_information: Option<bool>,
    /// Response Information (CONNACK).
    pub response_information: Option<String>,
    /// Server Reference (CONNACK, DISCONNECT).
    pub server_reference: Option<String>,
    /// Reason String (CONNACK, acks, SUBACK, UNSUBACK, DISCONNECT, AUTH).
    pub reason_string: Option<String>,
    /// Receive Maximum, non-zero (CONNECT, CONNACK).
    pub receive_maximum: Option<u16>,
    /// Topic Alias Maximum (CONNECT, CONNACK).
    pub topic_alias_maximum: Option<u16>,
    /// Topic Alias, non-zero (PUBLISH).
    pub topic_alias: Option<u16>,
    /// Maximum QoS, 0 or 1 (CONNACK).
    pub maximum_qos: Option<u8>,
    /// Retain Available (CONNACK).
    pub retain_available: Option<bool>,
    /// User Properties, in order, duplicates allowed (every packet with
    /// properties).
    pub user_properties: Vec<(String, String)>,
    /// Maximum Packet Size, non-zero (CONNECT, CONNACK).
    pub maximum_packet_size: Option<u32>,
    /// Wildcard Subscription Available (CONNACK).
    pub wildcard_subscription_available: Option<bool>,
    /// Subscription Identifier Available (CONNACK).
    pub subscription_identifier_available: Option<bool>,
    /// Shared Subscription Available (CONNACK).
    pub shared_subscription_available: Option<bool>,
}

/// Which packet (or the Will) a property set belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ctx {
    Connect,
    Will,
    ConnAck,
    Publish,
    Ack,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

/// Whether property `pid` may appear in `ctx` (§2.2.2.2). `None` for an
/// unknown identifier.
pub(crate) fn allowed(pid: u8, ctx: Ctx) -> Option<bool> {
    use Ctx::*;
    Some(match pid {
        id::PAYLOAD_FORMAT_INDICATOR
        | id::MESSAGE_EXPIRY_INTERVAL
        | id::CONTENT_TYPE
        | id::RESPONSE_TOPIC
        | id::CORRELATION_DATA => matches!(ctx, Publish | Will),
        id::SUBSCRIPTION_IDENTIFIER => matches!(ctx, Publish | Subscribe),
        id::SESSION_EXPIRY_INTERVAL => matches!(ctx, Connect | ConnAck | Disconnect),
        id::ASSIGNED_CLIENT_IDENTIFIER
        | id::SERVER_KEEP_ALIVE
        | id::RESPONSE_INFORMATION
        | id::MAXIMUM_QOS
        | id::RETAIN_AVAILABLE
        | id::WILDCARD_SUBSCRIPTION_AVAILABLE
        | id::SUBSCRIPTION_IDENTIFIER_AVAILABLE
        | id::SHARED_SUBSCRIPTION_AVAILABLE => ctx == ConnAck,
        id::AUTHENTICATION_METHOD | id::AUTHENTICATION_DATA => {
            matches!(ctx, Connect | ConnAck | Auth)
        }
        id::REQUEST_PROBLEM_INFORMATION | id::REQUEST_RESPONSE_INFORMATION => ctx == Connect,
        id::WILL_DELAY_INTERVAL => ctx == Will,
        id::SERVER_REFERENCE => matches!(ctx, ConnAck | Disconnect),
        id::REASON_STRING => matches!(ctx, ConnAck | Ack | SubAck | UnsubAck | Disconnect | Auth),
        id::RECEIVE_MAXIMUM | id::TOPIC_ALIAS_MAXIMUM | id::MAXIMUM_PACKET_SIZE => {
            matches!(ctx, Connect | ConnAck)
        }
        id::TOPIC_ALIAS => ctx == Publish,
        id::USER_PROPERTY => true,
        _ => return None,
    })
}

/// Sets a single-valued property, rejecting a second occurrence.
fn once<T>(slot: &mut Option<T>, pid: u8, v: T) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::DuplicateProperty(pid));
    }
    *slot = Some(v);
    Ok(())
}

fn flag(pid: u8, r: &mut Reader) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError::InvalidPropertyValue(pid)),
    }
}

fn nonzero_u16(pid: u8, r: &mut Reader) -> Result<u16, DecodeError> {
    match r.u16()? {
        0 => Err(DecodeError::InvalidPropertyValue(pid)),
        v => Ok(v),
    }
}

impl Properties {
    /// Whether no property is set.
    pub fn is_empty(&self) -> bool {
        *self == Properties::default()
    }

    /// Reads a Property Length and the properties it covers.
    pub(crate) fn decode(r: &mut Reader, ctx: Ctx) -> Result<Properties, DecodeError> {
        let len = r.varint()?;
        let len = usize::try_from(len).map_err(|_| DecodeError::UnexpectedEof)?;
        let mut r = Reader::new(r.take(len)?);
        let mut p = Properties::default();
        while !r.is_empty() {
            // Identifiers are Variable Byte Integers; all defined ones are one
            // byte, so anything longer is unknown.
            let pid = r.varint()?;
            let pid = u8::try_from(pid).map_err(|_| DecodeError::UnknownProperty(0xff))?;
            match allowed(pid, ctx) {
                None => return Err(DecodeError::UnknownProperty(pid)),
                Some(false) => return Err(DecodeError::PropertyNotAllowed(pid)),
                Some(true) => {}
            }
            p.decode_one(pid, ctx, &mut r)?;
        }
        Ok(p)
    }

    fn decode_one(&mut self, pid: u8, ctx: Ctx, r: &mut Reader) -> Result<(), DecodeError> {
        match pid {
            id::PAYLOAD_FORMAT_INDICATOR => {
                let v = u8::from(flag(pid, r)?);
                once(&mut self.payload_format_indicator, pid, v)
            }
            id::MESSAGE_EXPIRY_INTERVAL => once(&mut self.message_expiry_interval, pid, r.u32()?),
            id::CONTENT_TYPE => once(&mut self.content_type, pid, r.string()?),
            id::RESPONSE_TOPIC => {
                let t = r.string()?;
                if !crate::topic::valid_topic_name(&t) {
                    return Err(DecodeError::InvalidPropertyValue(pid));
                }
                once(&mut self.response_topic, pid, t)
            }
            id::CORRELATION_DATA => once(&mut self.correlation_data, pid, r.binary()?),
            id::SUBSCRIPTION_IDENTIFIER => {
                let v = r.varint()?;
                if v == 0 {
                    return Err(DecodeError::InvalidPropertyValue(pid));
                }
                if ctx == Ctx::Subscribe && !self.subscription_identifiers.is_empty() {
                    return Err(DecodeError::DuplicateProperty(pid));
                }
                self.subscription_identifiers.push(v);
                Ok(())
            }
            id::SESSION_EXPIRY_INTERVAL => once(&mut self.session_expiry_interval, pid, r.u32()?),
            id::ASSIGNED_CLIENT_IDENTIFIER => {
                once(&mut self.assigned_client_identifier, pid, r.string()?)
            }
            id::SERVER_KEEP_ALIVE => once(&mut self.server_keep_alive, pid, r.u16()?),
            id::AUTHENTICATION_METHOD => once(&mut self.authentication_method, pid, r.string()?),
            id::AUTHENTICATION_DATA => once(&mut self.authentication_data, pid, r.binary()?),
            id::REQUEST_PROBLEM_INFORMATION => {
                once(&mut self.request_problem_information, pid, flag(pid, r)?)
            }
            id::WILL_DELAY_INTERVAL => once(&mut self.will_delay_interval, pid, r.u32()?),
            id::REQUEST_RESPONSE_INFORMATION => {
                once(&mut self.request_response_information, pid, flag(pid, r)?)
            }
            id::RESPONSE_INFORMATION => once(&mut self.response_information, pid, r.string()?),
            id::SERVER_REFERENCE => once(&mut self.server_reference, pid, r.string()?),
            id::REASON_STRING => once(&mut self.reason_string, pid, r.string()?),
            id::RECEIVE_MAXIMUM => once(&mut self.receive_maximum, pid, nonzero_u16(pid, r)?),
            id::TOPIC_ALIAS_MAXIMUM => once(&mut self.topic_alias_maximum, pid, r.u16()?),
            id::TOPIC_ALIAS => once(&mut self.topic_alias, pid, nonzero_u16(pid, r)?),
            id::MAXIMUM_QOS => {
                let v = u8::from(flag(pid, r)?);
                once(&mut self.maximum_qos, pid, v)
            }
            id::RETAIN_AVAILABLE => once(&mut self.retain_available, pid, flag(pid, r)?),
            id::USER_PROPERTY => {
                let k = r.string()?;
                let v = r.string()?;
                self.user_properties.push((k, v));
                Ok(())
            }
            id::MAXIMUM_PACKET_SIZE => {
                let v = r.u32()?;
                if v == 0 {
                    return Err(DecodeError::InvalidPropertyValue(pid));
                }
                once(&mut self.maximum_packet_size, pid, v)
            }
            id::WILDCARD_SUBSCRIPTION_AVAILABLE => once(
                &mut self.wildcard_subscription_available,
                pid,
                flag(pid, r)?,
            ),
            id::SUBSCRIPTION_IDENTIFIER_AVAILABLE => once(
                &mut self.subscription_identifier_available,
                pid,
                flag(pid, r)?,
            ),
            id::SHARED_SUBSCRIPTION_AVAILABLE => {
                once(&mut self.shared_subscription_available, pid, flag(pid, r)?)
            }
            _ => Err(DecodeError::UnknownProperty(pid)),
        }
    }

    /// Writes the Property Length and the properties allowed in `ctx`.
    pub(crate) fn encode<S: Sink>(&self, ctx: Ctx, out: &mut S) -> Result<(), EncodeError> {
        let mut c = Counter::default();
        self.encode_body(ctx, &mut c)?;
        let len = u32::try_from(c.0).map_err(|_| EncodeError::PacketTooLarge(c.0))?;
        out.varint(len)
            .map_err(|_| EncodeError::PacketTooLarge(c.0))?;
        self.encode_body(ctx, out)
    }

    /// Size of [`Properties::encode`]'s output.
    pub(crate) fn encoded_len(&self, ctx: Ctx) -> Result<usize, EncodeError> {
        let mut c = Counter::default();
        self.encode(ctx, &mut c)?;
        Ok(c.0)
    }

    fn encode_body<S: Sink>(&self, ctx: Ctx, out: &mut S) -> Result<(), EncodeError> {
        let ok = |pid| allowed(pid, ctx) == Some(true);
        macro_rules! put {
            ($pid:expr, $field:expr, |$v:ident| $write:expr) => {
                if let Some($v) = &$field {
                    if ok($pid) {
                        out.u8($pid);
                        $write;
                    }
                }
            };
        }
        put!(
            id::PAYLOAD_FORMAT_INDICATOR,
            self.payload_format_indicator,
            |v| out.u8(*v)
        );
        put!(
            id::MESSAGE_EXPIRY_INTERVAL,
            self.message_expiry_interval,
            |v| out.u32(*v)
        );
        put!(id::CONTENT_TYPE, self.content_type, |v| out.string(v)?);
        put!(id::RESPONSE_TOPIC, self.response_topic, |v| out
            .string(v)?);
        put!(id::CORRELATION_DATA, self.correlation_data, |v| out
            .binary(v)?);
        if ok(id::SUBSCRIPTION_IDENTIFIER) {
            for &v in &self.subscription_identifiers {
                if v == 0 {
                    return Err(EncodeError::InvalidVarInt(0));
                }
                out.u8(id::SUBSCRIPTION_IDENTIFIER);
                out.varint(v)?;
            }
        }
        put!(
            id::SESSION_EXPIRY_INTERVAL,
            self.session_expiry_interval,
            |v| out.u32(*v)
        );
        put!(
            id::ASSIGNED_CLIENT_IDENTIFIER,
            self.assigned_client_identifier,
            |v| out.string(v)?
        );
        put!(id::SERVER_KEEP_ALIVE, self.server_keep_alive, |v| out
            .u16(*v));
        put!(id::AUTHENTICATION_METHOD, self.authentication_method, |v| {
            out.string(v)?
        });
        put!(id::AUTHENTICATION_DATA, self.authentication_data, |v| out
            .binary(
            v
        )?);
        put!(
            id::REQUEST_PROBLEM_INFORMATION,
            self.request_problem_information,
            |v| out.u8(u8::from(*v))
        );
        put!(id::WILL_DELAY_INTERVAL, self.will_delay_interval, |v| out
            .u32(*v));
        put!(
            id::REQUEST_RESPONSE_INFORMATION,
            self.request_response_information,
            |v| out.u8(u8::from(*v))
        );
        put!(id::RESPONSE_INFORMATION, self.response_information, |v| out
            .string(v)?);
        put!(id::SERVER_REFERENCE, self.server_reference, |v| out
            .string(v)?);
        put!(id::REASON_STRING, self.reason_string, |v| out.string(v)?);
        put!(id::RECEIVE_MAXIMUM, self.receive_maximum, |v| out.u16(*v));
        put!(id::TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum, |v| out
            .u16(*v));
        put!(id::TOPIC_ALIAS, self.topic_alias, |v| out.u16(*v));
        put!(id::MAXIMUM_QOS, self.maximum_qos, |v| out.u8(*v));
        put!(id::RETAIN_AVAILABLE, self.retain_available, |v| out
            .u8(u8::from(*v)));
        if ok(id::USER_PROPERTY) {
            for (k, v) in &self.user_properties {
                out.u8(id::USER_PROPERTY);
                out.string(k)?;
                out.string(v)?;
            }
        }
        put!(id::MAXIMUM_PACKET_SIZE, self.maximum_packet_size, |v| out
            .u32(*v));
        put!(
            id::WILDCARD_SUBSCRIPTION_AVAILABLE,
            self.wildcard_subscription_available,
            |v| out.u8(u8::from(*v))
        );
        put!(
            id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            self.subscription_identifier_available,
            |v| out.u8(u8::from(*v))
        );
        put!(
            id::SHARED_SUBSCRIPTION_AVAILABLE,
            self.shared_subscription_available,
            |v| out.u8(u8::from(*v))
        );
        Ok(())
    }
}
