//! Packet decoding.

use bytes::BytesMut;

use super::{
    Ack, Auth, ConnAck, Connect, Disconnect, Packet, Publish, QoS, SubAck, Subscribe,
    SubscribeFilter, SubscriptionOptions, UnsubAck, Unsubscribe, Version, Will,
};
use crate::codec::{parse_varint, Reader, MAX_VARINT};
use crate::error::DecodeError;
use crate::properties::{Ctx, Properties};
use crate::topic::valid_topic_name;

/// The largest packet MQTT can express: one type byte, four length bytes and
/// a Remaining Length of 268,435,455.
pub const DEFAULT_MAX_PACKET_SIZE: usize = 1 + 4 + MAX_VARINT as usize;

/// Decodes one packet from the front of `buf`.
///
/// - `Ok(None)`: `buf` does not yet hold a whole packet; nothing is consumed.
/// - `Ok(Some(p))`: exactly that packet's bytes are consumed. Binary fields
///   and the PUBLISH payload are slices of `buf`'s storage (no copy).
/// - `Err(e)`: the stream is broken and the connection must be closed (after
///   a CONNACK or DISCONNECT with [`DecodeError::reason_code`]). Errors found
///   in the fixed header consume nothing; errors in the body may leave the
///   packet consumed.
///
/// `version` is `None` until the CONNECT has been received: then only a
/// CONNECT is accepted, and its own protocol level decides how it is read
/// (the caller then passes `Some(connect.version)`). A CONNECT is decoded by
/// its own protocol level in any state; rejecting a second one is up to the
/// session.
///
/// `max_packet_size` bounds the whole packet (fixed header included); a larger
/// packet is rejected with [`DecodeError::PacketTooLarge`] as soon as its fixed
/// header is available, before its body is buffered. Use
/// [`DEFAULT_MAX_PACKET_SIZE`] for no limit.
pub fn decode(
    buf: &mut BytesMut,
    version: Option<Version>,
    max_packet_size: usize,
) -> Result<Option<Packet>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let packet_type = first >> 4;
    let flags = first & 0x0f;
    check_fixed_header(packet_type, flags, version)?;
    let Some((remaining, len_len)) = parse_varint(buf.get(1..).unwrap_or_default())? else {
        return Ok(None);
    };
    let header_len = 1 + len_len;
    let total = header_len.saturating_add(usize::try_from(remaining).unwrap_or(usize::MAX));
    if total > max_packet_size {
        return Err(DecodeError::PacketTooLarge {
            size: total,
            max: max_packet_size,
        });
    }
    if buf.len() < total {
        return Ok(None);
    }
    let frame = buf.split_to(total).freeze();
    let mut r = Reader::new(frame.slice(header_len..));
    let packet = decode_body(packet_type, flags, version, &mut r)?;
    r.finish()?;
    Ok(Some(packet))
}

/// Checks the first byte: packet type and its flags (§2.1.3).
fn check_fixed_header(
    packet_type: u8,
    flags: u8,
    version: Option<Version>,
) -> Result<(), DecodeError> {
    let Some(version) = version else {
        return if packet_type == 1 {
            check_flags(packet_type, flags, 0)
        } else {
            Err(DecodeError::ExpectedConnect(packet_type))
        };
    };
    match packet_type {
        0 => Err(DecodeError::InvalidPacketType(0)),
        15 if version == Version::V311 => Err(DecodeError::InvalidPacketType(15)),
        3 => {
            let qos = (flags >> 1) & 3;
            if qos == 3 {
                return Err(DecodeError::InvalidQoS);
            }
            if qos == 0 && flags & 0b1000 != 0 && version == Version::V5 {
                return Err(DecodeError::DupWithQoS0);
            }
            Ok(())
        }
        6 | 8 | 10 => check_flags(packet_type, flags, 0b0010),
        _ => check_flags(packet_type, flags, 0),
    }
}

fn check_flags(packet_type: u8, flags: u8, expected: u8) -> Result<(), DecodeError> {
    if flags == expected {
        Ok(())
    } else {
        Err(DecodeError::InvalidFlags { packet_type, flags })
    }
}

fn decode_body(
    packet_type: u8,
    flags: u8,
    version: Option<Version>,
    r: &mut Reader,
) -> Result<Packet, DecodeError> {
    if packet_type == 1 {
        return decode_connect(r).map(Packet::Connect);
    }
    // `check_fixed_header` only lets CONNECT through without a version.
    let v = version.ok_or(DecodeError::ExpectedConnect(packet_type))?;
    Ok(match packet_type {
        2 => Packet::ConnAck(decode_connack(v, r)?),
        3 => Packet::Publish(decode_publish(flags, v, r)?),
        4 => Packet::PubAck(decode_ack(v, r)?),
        5 => Packet::PubRec(decode_ack(v, r)?),
        6 => Packet::PubRel(decode_ack(v, r)?),
        7 => Packet::PubComp(decode_ack(v, r)?),
        8 => Packet::Subscribe(decode_subscribe(v, r)?),
        9 => Packet::SubAck(decode_suback(v, r)?),
        10 => Packet::Unsubscribe(decode_unsubscribe(v, r)?),
        11 => Packet::UnsubAck(decode_unsuback(v, r)?),
        12 => Packet::PingReq,
        13 => Packet::PingResp,
        14 => {
            let (code, properties) = code_and_properties(v, Ctx::Disconnect, r)?;
            Packet::Disconnect(Disconnect { code, properties })
        }
        15 => {
            let (code, properties) = code_and_properties(v, Ctx::Auth, r)?;
            Packet::Auth(Auth { code, properties })
        }
        t => return Err(DecodeError::InvalidPacketType(t)),
    })
}

fn properties(v: Version, ctx: Ctx, r: &mut Reader) -> Result<Properties, DecodeError> {
    match v {
        Version::V311 => Ok(Properties::default()),
        Version::V5 => Properties::decode(r, ctx),
    }
}

fn packet_id(r: &mut Reader) -> Result<u16, DecodeError> {
    match r.u16()? {
        0 => Err(DecodeError::ZeroPacketId),
        id => Ok(id),
    }
}

fn decode_connect(r: &mut Reader) -> Result<Connect, DecodeError> {
    let name = r.binary()?;
    let level = r.u8()?;
    let version = match &name[..] {
        b"MQTT" => Version::from_level(level),
        b"MQIsdp" => None,
        _ => return Err(DecodeError::InvalidProtocolName),
    }
    .ok_or(DecodeError::UnsupportedProtocolVersion(level))?;
    let flags = r.u8()?;
    if flags & 0x01 != 0 {
        return Err(DecodeError::ConnectReservedFlag);
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let has_password = flags & 0x40 != 0;
    let has_username = flags & 0x80 != 0;
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(DecodeError::InvalidWillFlags);
    }
    let will_qos = QoS::from_u8(will_qos).ok_or(DecodeError::InvalidWillFlags)?;
    if version == Version::V311 && has_password && !has_username {
        return Err(DecodeError::PasswordWithoutUsername);
    }
    let keep_alive = r.u16()?;
    let props = properties(version, Ctx::Connect, r)?;
    let client_id = r.string()?;
    let will = if will_flag {
        let properties = properties(version, Ctx::Will, r)?;
        let topic = r.string()?;
        if !valid_topic_name(&topic) {
            return Err(DecodeError::InvalidTopicName);
        }
        let payload = r.binary()?;
        Some(Will {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties,
        })
    } else {
        None
    };
    let username = if has_username {
        Some(r.string()?)
    } else {
        None
    };
    let password = if has_password {
        Some(r.binary()?)
    } else {
        None
    };
    Ok(Connect {
        version,
        client_id,
        clean_start,
        keep_alive,
        username,
        password,
        will,
        properties: props,
    })
}

fn decode_connack(v: Version, r: &mut Reader) -> Result<ConnAck, DecodeError> {
    let flags = r.u8()?;
    if flags & 0xfe != 0 {
        return Err(DecodeError::ReservedBitsSet);
    }
    let code = r.u8()?;
    if v == Version::V311 && code > 5 {
        return Err(DecodeError::InvalidReasonCode(code));
    }
    let properties = properties(v, Ctx::ConnAck, r)?;
    Ok(ConnAck {
        session_present: flags & 1 != 0,
        code,
        properties,
    })
}

fn decode_publish(flags: u8, v: Version, r: &mut Reader) -> Result<Publish, DecodeError> {
    let qos = QoS::from_u8((flags >> 1) & 3).ok_or(DecodeError::InvalidQoS)?;
    let topic = r.string()?;
    if topic.contains(['+', '#']) || (v == Version::V311 && topic.is_empty()) {
        return Err(DecodeError::InvalidTopicName);
    }
    let packet_id = if qos == QoS::AtMostOnce {
        None
    } else {
        Some(packet_id(r)?)
    };
    let properties = properties(v, Ctx::Publish, r)?;
    if topic.is_empty() && properties.topic_alias.is_none() {
        return Err(DecodeError::EmptyTopicWithoutAlias);
    }
    Ok(Publish {
        dup: flags & 0b1000 != 0,
        qos,
        retain: flags & 1 != 0,
        topic,
        packet_id,
        properties,
        payload: r.rest(),
    })
}

fn decode_ack(v: Version, r: &mut Reader) -> Result<Ack, DecodeError> {
    let packet_id = packet_id(r)?;
    let (code, properties) = code_and_properties(v, Ctx::Ack, r)?;
    Ok(Ack {
        packet_id,
        code,
        properties,
    })
}

/// The optional reason code and properties that end acks, DISCONNECT and
/// AUTH in MQTT 5: both may be omitted (code 0), or only the properties.
fn code_and_properties(
    v: Version,
    ctx: Ctx,
    r: &mut Reader,
) -> Result<(u8, Properties), DecodeError> {
    if v == Version::V311 || r.is_empty() {
        return Ok((0, Properties::default()));
    }
    let code = r.u8()?;
    if r.is_empty() {
        return Ok((code, Properties::default()));
    }
    Ok((code, Properties::decode(r, ctx)?))
}

fn decode_subscribe(v: Version, r: &mut Reader) -> Result<Subscribe, DecodeError> {
    let packet_id = packet_id(r)?;
    let properties = properties(v, Ctx::Subscribe, r)?;
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        let opts = r.u8()?;
        let reserved = match v {
            Version::V311 => 0xfc,
            Version::V5 => 0xc0,
        };
        if opts & reserved != 0 {
            return Err(DecodeError::ReservedBitsSet);
        }
        let qos = QoS::from_u8(opts & 3).ok_or(DecodeError::InvalidQoS)?;
        let retain_handling = (opts >> 4) & 3;
        if retain_handling == 3 {
            return Err(DecodeError::InvalidRetainHandling);
        }
        filters.push(SubscribeFilter {
            filter,
            options: SubscriptionOptions {
                qos,
                no_local: opts & 0x04 != 0,
                retain_as_published: opts & 0x08 != 0,
                retain_handling,
            },
        });
    }
    if filters.is_empty() {
        return Err(DecodeError::NoTopicFilters);
    }
    Ok(Subscribe {
        packet_id,
        filters,
        properties,
    })
}

fn decode_suback(v: Version, r: &mut Reader) -> Result<SubAck, DecodeError> {
    let packet_id = packet_id(r)?;
    let properties = properties(v, Ctx::SubAck, r)?;
    let codes = r.rest().to_vec();
    if v == Version::V311 {
        if let Some(&bad) = codes.iter().find(|&&c| !matches!(c, 0 | 1 | 2 | 0x80)) {
            return Err(DecodeError::InvalidReasonCode(bad));
        }
    }
    Ok(SubAck {
        packet_id,
        codes,
        properties,
    })
}

fn decode_unsubscribe(v: Version, r: &mut Reader) -> Result<Unsubscribe, DecodeError> {
    let packet_id = packet_id(r)?;
    let properties = properties(v, Ctx::Unsubscribe, r)?;
    let mut filters = Vec::new();
    while !r.is_empty() {
        filters.push(r.string()?);
    }
    if filters.is_empty() {
        return Err(DecodeError::NoTopicFilters);
    }
    Ok(Unsubscribe {
        packet_id,
        filters,
        properties,
    })
}

fn decode_unsuback(v: Version, r: &mut Reader) -> Result<UnsubAck, DecodeError> {
    let packet_id = packet_id(r)?;
    let properties = properties(v, Ctx::UnsubAck, r)?;
    let codes = match v {
        Version::V311 => Vec::new(),
        Version::V5 => r.rest().to_vec(),
    };
    Ok(UnsubAck {
        packet_id,
        codes,
        properties,
    })
}
