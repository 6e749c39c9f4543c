//! Packet encoding.

use bytes::BytesMut;

use super::{Ack, Connect, Packet, Publish, QoS, Subscribe, Version};
use crate::codec::{varint_len, Counter, Sink, MAX_VARINT};
use crate::error::EncodeError;
use crate::properties::{Ctx, Properties};

/// Appends the minimal encoding of `packet` for `version` to `out`.
///
/// Fields that 3.1.1 lacks (properties, ack reason codes, subscription
/// options other than QoS) are not written for [`Version::V311`], and 3.1.1
/// SUBACK codes other than 0, 1 and 2 are written as 0x80 (failure). A CONNECT is encoded
/// with its own [`Connect::version`]. MQTT 5 acks, DISCONNECT and AUTH omit
/// a zero reason code without properties, and empty properties after a reason
/// code.
///
/// On error nothing is appended.
pub fn encode(packet: &Packet, version: Version, out: &mut BytesMut) -> Result<(), EncodeError> {
    let remaining = body_len(packet, version)?;
    out.reserve(1 + varint_len(remaining) + remaining);
    out.u8(first_byte(packet));
    out.varint(u32::try_from(remaining).map_err(|_| EncodeError::PacketTooLarge(remaining))?)?;
    body(packet, version, out)
}

/// The number of bytes [`encode`] would append, computed without encoding
/// (the payload is not touched). Compare it with the peer's Maximum Packet
/// Size before sending.
pub fn encoded_len(packet: &Packet, version: Version) -> Result<usize, EncodeError> {
    let remaining = body_len(packet, version)?;
    Ok(1 + varint_len(remaining) + remaining)
}

fn body_len(packet: &Packet, version: Version) -> Result<usize, EncodeError> {
    let mut c = Counter::default();
    body(packet, version, &mut c)?;
    if c.0 > MAX_VARINT as usize {
        return Err(EncodeError::PacketTooLarge(c.0));
    }
    Ok(c.0)
}

fn first_byte(packet: &Packet) -> u8 {
    let flags = match packet {
        Packet::Publish(p) => (u8::from(p.dup) << 3) | (p.qos.as_u8() << 1) | u8::from(p.retain),
        Packet::PubRel(_) | Packet::Subscribe(_) | Packet::Unsubscribe(_) => 0b0010,
        _ => 0,
    };
    (packet.packet_type() << 4) | flags
}

fn body<S: Sink>(packet: &Packet, v: Version, out: &mut S) -> Result<(), EncodeError> {
    match packet {
        Packet::Connect(c) => connect(c, out),
        Packet::ConnAck(c) => {
            out.u8(u8::from(c.session_present));
            out.u8(c.code);
            props(&c.properties, v, Ctx::ConnAck, out)
        }
        Packet::Publish(p) => publish(p, v, out),
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            ack(a, v, out)
        }
        Packet::Subscribe(s) => subscribe(s, v, out),
        Packet::SubAck(s) => {
            out.u16(s.packet_id);
            props(&s.properties, v, Ctx::SubAck, out)?;
            for &code in &s.codes {
                out.u8(match (v, code) {
                    (Version::V311, 0..=2) | (Version::V5, _) => code,
                    (Version::V311, _) => crate::reason::V311_SUBACK_FAILURE,
                });
            }
            Ok(())
        }
        Packet::Unsubscribe(u) => {
            nonzero(u.packet_id)?;
            out.u16(u.packet_id);
            props(&u.properties, v, Ctx::Unsubscribe, out)?;
            for f in &u.filters {
                out.string(f)?;
            }
            Ok(())
        }
        Packet::UnsubAck(u) => {
            out.u16(u.packet_id);
            if v == Version::V5 {
                u.properties.encode(Ctx::UnsubAck, out)?;
                out.put(&u.codes);
            }
            Ok(())
        }
        Packet::PingReq | Packet::PingResp => Ok(()),
        Packet::Disconnect(d) => {
            code_and_properties(d.code, &d.properties, v, Ctx::Disconnect, out)
        }
        Packet::Auth(a) => match v {
            Version::V311 => Err(EncodeError::UnsupportedInVersion),
            Version::V5 => code_and_properties(a.code, &a.properties, v, Ctx::Auth, out),
        },
    }
}

fn nonzero(packet_id: u16) -> Result<(), EncodeError> {
    if packet_id == 0 {
        Err(EncodeError::InvalidPacketId)
    } else {
        Ok(())
    }
}

fn props<S: Sink>(p: &Properties, v: Version, ctx: Ctx, out: &mut S) -> Result<(), EncodeError> {
    match v {
        Version::V311 => Ok(()),
        Version::V5 => p.encode(ctx, out),
    }
}

fn connect<S: Sink>(c: &Connect, out: &mut S) -> Result<(), EncodeError> {
    let v = c.version;
    if v == Version::V311 && c.password.is_some() && c.username.is_none() {
        return Err(EncodeError::PasswordWithoutUsername);
    }
    out.string("MQTT")?;
    out.u8(v.level());
    let mut flags = u8::from(c.clean_start) << 1;
    if let Some(w) = &c.will {
        flags |= 0x04 | (w.qos.as_u8() << 3) | (u8::from(w.retain) << 5);
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    out.u8(flags);
    out.u16(c.keep_alive);
    props(&c.properties, v, Ctx::Connect, out)?;
    out.string(&c.client_id)?;
    if let Some(w) = &c.will {
        props(&w.properties, v, Ctx::Will, out)?;
        out.string(&w.topic)?;
        out.binary(&w.payload)?;
    }
    if let Some(u) = &c.username {
        out.string(u)?;
    }
    if let Some(p) = &c.password {
        out.binary(p)?;
    }
    Ok(())
}

fn publish<S: Sink>(p: &Publish, v: Version, out: &mut S) -> Result<(), EncodeError> {
    out.string(&p.topic)?;
    match (p.qos, p.packet_id) {
        (QoS::AtMostOnce, None) => {}
        (QoS::AtLeastOnce | QoS::ExactlyOnce, Some(id)) if id != 0 => out.u16(id),
        _ => return Err(EncodeError::InvalidPacketId),
    }
    props(&p.properties, v, Ctx::Publish, out)?;
    out.put(&p.payload);
    Ok(())
}

fn ack<S: Sink>(a: &Ack, v: Version, out: &mut S) -> Result<(), EncodeError> {
    out.u16(a.packet_id);
    code_and_properties(a.code, &a.properties, v, Ctx::Ack, out)
}

/// The optional reason code and properties ending acks, DISCONNECT and AUTH.
fn code_and_properties<S: Sink>(
    code: u8,
    p: &Properties,
    v: Version,
    ctx: Ctx,
    out: &mut S,
) -> Result<(), EncodeError> {
    if v == Version::V311 {
        return Ok(());
    }
    // An empty property block is a single zero length byte.
    let has_props = p.encoded_len(ctx)? > 1;
    if code == 0 && !has_props {
        return Ok(());
    }
    out.u8(code);
    if has_props {
        p.encode(ctx, out)?;
    }
    Ok(())
}

fn subscribe<S: Sink>(s: &Subscribe, v: Version, out: &mut S) -> Result<(), EncodeError> {
    nonzero(s.packet_id)?;
    out.u16(s.packet_id);
    props(&s.properties, v, Ctx::Subscribe, out)?;
    for f in &s.filters {
        out.string(&f.filter)?;
        let o = &f.options;
        let opts = match v {
            Version::V311 => o.qos.as_u8(),
            Version::V5 => {
                if o.retain_handling > 2 {
                    return Err(EncodeError::InvalidRetainHandling(o.retain_handling));
                }
                o.qos.as_u8()
                    | (u8::from(o.no_local) << 2)
                    | (u8::from(o.retain_as_published) << 3)
                    | (o.retain_handling << 4)
            }
        };
        out.u8(opts);
    }
    Ok(())
}
