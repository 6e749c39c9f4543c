//! Packet codec tests: byte vectors written from the specifications, every
//! malformed case, partial input, and round-trip proptests.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::*;
use crate::error::DecodeError as E;
use crate::properties::{allowed, id, Ctx};
use crate::{reason, DecodeError, EncodeError, Properties};

const MAX: usize = DEFAULT_MAX_PACKET_SIZE;
const V3: Option<Version> = Some(Version::V311);
const V5: Option<Version> = Some(Version::V5);

fn dec(bytes: &[u8], v: Option<Version>) -> Result<Option<Packet>, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    decode(&mut buf, v, MAX)
}

/// Decodes `bytes` as exactly one packet, checks every proper prefix gives
/// `Ok(None)` without consuming, and returns it.
fn one(bytes: &[u8], v: Option<Version>) -> Packet {
    for cut in 0..bytes.len() {
        let mut part = BytesMut::from(&bytes[..cut]);
        assert_eq!(decode(&mut part, v, MAX), Ok(None), "prefix {cut}");
        assert_eq!(part.len(), cut);
    }
    let mut buf = BytesMut::from(bytes);
    let p = decode(&mut buf, v, MAX).unwrap().expect("whole packet");
    assert!(buf.is_empty(), "{} bytes left", buf.len());
    p
}

fn enc(p: &Packet, v: Version) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(p, v, &mut out).unwrap();
    assert_eq!(encoded_len(p, v), Ok(out.len()));
    out.to_vec()
}

/// `bytes` decodes to `p` and `p` encodes to `bytes`.
fn exact(bytes: &[u8], v: Option<Version>, p: &Packet) {
    assert_eq!(&one(bytes, v), p);
    let ver = match p {
        Packet::Connect(c) => c.version,
        _ => v.unwrap(),
    };
    assert_eq!(enc(p, ver), bytes);
    crate::fuzz::fuzz_decode(bytes);
}

fn err(bytes: &[u8], v: Option<Version>, e: DecodeError, code: u8) {
    assert_eq!(dec(bytes, v), Err(e.clone()), "{bytes:02x?}");
    assert_eq!(e.reason_code(), code, "{e:?}");
}

fn user(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

// ---- CONNECT ----

#[test]
fn connect_v311_minimal() {
    let bytes = [
        0x10, 0x0f, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 3, b'a', b'b', b'c',
    ];
    let p = Packet::Connect(Connect {
        version: Version::V311,
        client_id: "abc".into(),
        clean_start: true,
        keep_alive: 60,
        username: None,
        password: None,
        will: None,
        properties: Properties::default(),
    });
    exact(&bytes, None, &p);
    // A CONNECT decodes by its own level in any state.
    assert_eq!(one(&bytes, V5), p);
}

#[test]
fn connect_v311_will_user_password() {
    let bytes = [
        0x10, 0x1e, 0, 4, b'M', b'Q', b'T', b'T', 4, 0xee, 0, 10, // header
        0, 1, b'c', // client id
        0, 3, b'w', b'/', b't', // will topic
        0, 3, b'b', b'y', b'e', // will payload
        0, 1, b'u', // user name
        0, 2, 1, 2, // password
    ];
    let p = Packet::Connect(Connect {
        version: Version::V311,
        client_id: "c".into(),
        clean_start: true,
        keep_alive: 10,
        username: Some("u".into()),
        password: Some(Bytes::from_static(&[1, 2])),
        will: Some(Will {
            topic: "w/t".into(),
            payload: Bytes::from_static(b"bye"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: Properties::default(),
        }),
        properties: Properties::default(),
    });
    exact(&bytes, None, &p);
}

fn connect_v5_bytes() -> Vec<u8> {
    vec![
        0x10, 0x37, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x96, 0, 10, // header
        15, // properties
        0x11, 0, 0, 0, 120, // session expiry
        0x21, 0, 20, // receive maximum
        0x26, 0, 1, b'k', 0, 1, b'v', // user property
        0, 2, b'i', b'd', // client id
        14,   // will properties
        0x01, 1, // payload format indicator
        0x03, 0, 4, b't', b'e', b'x', b't', // content type
        0x18, 0, 0, 0, 5, // will delay interval
        0, 1, b't', // will topic
        0, 1, b'x', // will payload
        0, 2, b'm', b'e', // user name
    ]
}

fn connect_v5() -> Packet {
    Packet::Connect(Connect {
        version: Version::V5,
        client_id: "id".into(),
        clean_start: true,
        keep_alive: 10,
        username: Some("me".into()),
        password: None,
        will: Some(Will {
            topic: "t".into(),
            payload: Bytes::from_static(b"x"),
            qos: QoS::ExactlyOnce,
            retain: false,
            properties: Properties {
                payload_format_indicator: Some(1),
                content_type: Some("text".into()),
                will_delay_interval: Some(5),
                ..Properties::default()
            },
        }),
        properties: Properties {
            session_expiry_interval: Some(120),
            receive_maximum: Some(20),
            user_properties: vec![user("k", "v")],
            ..Properties::default()
        },
    })
}

#[test]
fn connect_v5_properties_and_will() {
    exact(&connect_v5_bytes(), None, &connect_v5());
}

#[test]
fn connect_v5_properties_in_any_order() {
    let mut b = connect_v5_bytes();
    // Swap the will's payload format indicator and will delay interval.
    let will_props = 33; // offset of the will property bytes
    assert_eq!(b[will_props], 0x01);
    let reordered = [
        0x18, 0, 0, 0, 5, 0x03, 0, 4, b't', b'e', b'x', b't', 0x01, 1,
    ];
    b[will_props..will_props + 14].copy_from_slice(&reordered);
    assert_eq!(one(&b, None), connect_v5());
}

#[test]
fn connect_v5_password_without_username_is_allowed() {
    let bytes = [
        0x10, 0x10, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x40, 0, 0, 0, 0, 0, 0, 1, 9,
    ];
    let Packet::Connect(c) = one(&bytes, None) else {
        panic!("not a CONNECT")
    };
    assert_eq!(
        (c.username, c.password),
        (None, Some(Bytes::from_static(&[9])))
    );
    assert!(!c.clean_start);
}

#[test]
fn connect_errors() {
    let base = |flags: u8| {
        vec![
            0x10, 0x0d, 0, 4, b'M', b'Q', b'T', b'T', 4, flags, 0, 60, 0, 1, b'a',
        ]
    };
    assert!(dec(&base(0x02), None).unwrap().is_some());
    err(
        &base(0x03),
        None,
        E::ConnectReservedFlag,
        reason::MALFORMED_PACKET,
    );
    err(
        &base(0x0a),
        None,
        E::InvalidWillFlags,
        reason::MALFORMED_PACKET,
    );
    err(
        &base(0x22),
        None,
        E::InvalidWillFlags,
        reason::MALFORMED_PACKET,
    );
    err(
        &base(0x1e),
        None,
        E::InvalidWillFlags,
        reason::MALFORMED_PACKET,
    );
    err(
        &base(0x42),
        None,
        E::PasswordWithoutUsername,
        reason::MALFORMED_PACKET,
    );
    // Trailing byte after the payload.
    let mut t = base(0x02);
    t[1] += 1;
    t.push(0);
    err(&t, None, E::TrailingBytes(1), reason::MALFORMED_PACKET);
    // Missing client identifier.
    let short = [0x10, 0x0a, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60];
    err(&short, None, E::UnexpectedEof, reason::MALFORMED_PACKET);
    // Will topic with a wildcard.
    let will = [
        0x10, 0x12, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x06, 0, 60, 0, 1, b'a', 0, 1, b'#', 0, 0,
    ];
    assert_eq!(will[1] as usize, will.len() - 2);
    err(&will, None, E::InvalidTopicName, reason::TOPIC_NAME_INVALID);
}

#[test]
fn connect_protocol_versions() {
    let mqisdp = [
        0x10, 0x0f, 0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 2, 0, 60, 0, 1, b'a',
    ];
    err(
        &mqisdp,
        None,
        E::UnsupportedProtocolVersion(3),
        reason::UNSUPPORTED_PROTOCOL_VERSION,
    );
    assert_eq!(
        reason::connack_v311(E::UnsupportedProtocolVersion(3).reason_code()),
        reason::V311_UNACCEPTABLE_PROTOCOL_VERSION
    );
    let level6 = [
        0x10, 0x0d, 0, 4, b'M', b'Q', b'T', b'T', 6, 2, 0, 60, 0, 1, b'a',
    ];
    err(
        &level6,
        None,
        E::UnsupportedProtocolVersion(6),
        reason::UNSUPPORTED_PROTOCOL_VERSION,
    );
    let name = [
        0x10, 0x0d, 0, 4, b'M', b'Q', b'T', b'X', 4, 2, 0, 60, 0, 1, b'a',
    ];
    err(
        &name,
        None,
        E::InvalidProtocolName,
        reason::UNSUPPORTED_PROTOCOL_VERSION,
    );
}

#[test]
fn only_connect_before_connect() {
    err(
        &[0xc0, 0],
        None,
        E::ExpectedConnect(12),
        reason::PROTOCOL_ERROR,
    );
    err(&[0x30], None, E::ExpectedConnect(3), reason::PROTOCOL_ERROR);
    err(
        &[0x11, 0],
        None,
        E::InvalidFlags {
            packet_type: 1,
            flags: 1,
        },
        0x81,
    );
}

// ---- CONNACK ----

#[test]
fn connack() {
    let p = Packet::ConnAck(ConnAck {
        session_present: true,
        code: 0,
        properties: Properties::default(),
    });
    exact(&[0x20, 0x02, 0x01, 0x00], V3, &p);
    exact(&[0x20, 0x03, 0x01, 0x00, 0x00], V5, &p);
    let p = Packet::ConnAck(ConnAck {
        session_present: false,
        code: 0,
        properties: Properties {
            topic_alias_maximum: Some(10),
            maximum_qos: Some(1),
            ..Properties::default()
        },
    });
    exact(&[0x20, 0x08, 0, 0, 5, 0x22, 0, 10, 0x24, 1], V5, &p);
    // 3.1.1 return codes above 5 are reserved; flags bits 1-7 are reserved.
    err(&[0x20, 2, 0, 6], V3, E::InvalidReasonCode(6), 0x81);
    err(&[0x20, 2, 2, 0], V3, E::ReservedBitsSet, 0x81);
    // 3.1.1 never carries properties.
    let v3 = ConnAck {
        code: 5,
        ..ConnAck::default()
    };
    let mut with_props = v3.clone();
    with_props.properties.reason_string = Some("no".into());
    assert_eq!(
        enc(&Packet::ConnAck(with_props), Version::V311),
        [0x20, 2, 0, 5]
    );
}

// ---- PUBLISH ----

#[test]
fn publish_qos0() {
    let p = Packet::Publish(Publish {
        topic: "a/b".into(),
        payload: Bytes::from_static(b"hello"),
        ..Publish::default()
    });
    let v3 = [
        0x30, 0x0a, 0, 3, b'a', b'/', b'b', b'h', b'e', b'l', b'l', b'o',
    ];
    exact(&v3, V3, &p);
    let v5 = [
        0x30, 0x0b, 0, 3, b'a', b'/', b'b', 0, b'h', b'e', b'l', b'l', b'o',
    ];
    exact(&v5, V5, &p);
    // Empty payload.
    let e = Packet::Publish(Publish {
        topic: "t".into(),
        ..Publish::default()
    });
    exact(&[0x30, 4, 0, 1, b't', 0], V5, &e);
}

#[test]
fn publish_payload_is_zero_copy() {
    let v3 = [0x30, 0x05, 0, 1, b't', b'h', b'i'];
    let mut buf = BytesMut::from(&v3[..]);
    let start = buf.as_ptr() as usize;
    let Some(Packet::Publish(p)) = decode(&mut buf, V3, MAX).unwrap() else {
        panic!("not a PUBLISH")
    };
    assert_eq!(p.payload.as_ptr() as usize, start + 5);
}

#[test]
fn publish_qos1_retain_v311() {
    let p = Packet::Publish(Publish {
        qos: QoS::AtLeastOnce,
        retain: true,
        topic: "t".into(),
        packet_id: Some(10),
        payload: Bytes::from_static(b"hi"),
        ..Publish::default()
    });
    exact(&[0x33, 0x07, 0, 1, b't', 0, 10, b'h', b'i'], V3, &p);
}

#[test]
fn publish_qos2_dup_v5_properties() {
    let bytes = [
        0x3c, 0x14, 0, 1, b't', 0, 5,  // topic, packet id
        13, // properties
        0x02, 0, 0, 0, 60, // message expiry
        0x0b, 1, // subscription identifier 1
        0x0b, 0x80, 0x01, // subscription identifier 128
        0x23, 0, 1,    // topic alias
        b'p', // payload
    ];
    let p = Packet::Publish(Publish {
        dup: true,
        qos: QoS::ExactlyOnce,
        retain: false,
        topic: "t".into(),
        packet_id: Some(5),
        properties: Properties {
            message_expiry_interval: Some(60),
            subscription_identifiers: vec![1, 128],
            topic_alias: Some(1),
            ..Properties::default()
        },
        payload: Bytes::from_static(b"p"),
    });
    exact(&bytes, V5, &p);
}

#[test]
fn publish_v5_topic_alias_only() {
    let p = Packet::Publish(Publish {
        properties: Properties {
            topic_alias: Some(3),
            ..Properties::default()
        },
        payload: Bytes::from_static(b"x"),
        ..Publish::default()
    });
    exact(&[0x30, 7, 0, 0, 3, 0x23, 0, 3, b'x'], V5, &p);
    err(
        &[0x30, 4, 0, 0, 0, b'x'],
        V5,
        E::EmptyTopicWithoutAlias,
        0x82,
    );
    err(&[0x30, 3, 0, 0, b'x'], V3, E::InvalidTopicName, 0x90);
}

#[test]
fn publish_errors() {
    err(&[0x36, 3, 0, 1, b't'], V3, E::InvalidQoS, 0x81);
    err(&[0x38, 4, 0, 1, b't', 0], V5, E::DupWithQoS0, 0x82);
    // 3.1.1 tolerates DUP on QoS 0.
    let Some(Packet::Publish(p)) = dec(&[0x38, 3, 0, 1, b't'], V3).unwrap() else {
        panic!()
    };
    assert!(p.dup);
    err(&[0x30, 4, 0, 2, 0xc3, 0x28], V3, E::InvalidUtf8, 0x81);
    err(&[0x30, 4, 0, 2, b'a', 0], V3, E::NullCharacter, 0x81);
    err(&[0x32, 5, 0, 1, b't', 0, 0], V3, E::ZeroPacketId, 0x82);
    err(&[0x32, 4, 0, 1, b't', 0], V3, E::UnexpectedEof, 0x81);
    err(&[0x30, 4, 0, 2, b'a', b'+'], V3, E::InvalidTopicName, 0x90);
    err(&[0x30, 4, 0, 2, b'#', b'a'], V5, E::InvalidTopicName, 0x90);
    // Property length runs past the body.
    err(&[0x30, 4, 0, 1, b't', 5], V5, E::UnexpectedEof, 0x81);
}

#[test]
fn property_errors() {
    let publish = |props: &[u8]| {
        let mut b = vec![0x30, 0, 0, 1, b't', props.len() as u8];
        b.extend_from_slice(props);
        b[1] = (b.len() - 2) as u8;
        b
    };
    err(
        &publish(&[0x11, 0, 0, 0, 1]),
        V5,
        E::PropertyNotAllowed(0x11),
        0x82,
    );
    err(
        &publish(&[0x02, 0, 0, 0, 1, 0x02, 0, 0, 0, 2]),
        V5,
        E::DuplicateProperty(0x02),
        0x82,
    );
    err(&publish(&[0x05, 0]), V5, E::UnknownProperty(0x05), 0x81);
    err(
        &publish(&[0x01, 2]),
        V5,
        E::InvalidPropertyValue(0x01),
        0x82,
    );
    err(
        &publish(&[0x23, 0, 0]),
        V5,
        E::InvalidPropertyValue(0x23),
        0x82,
    );
    err(
        &publish(&[0x0b, 0]),
        V5,
        E::InvalidPropertyValue(0x0b),
        0x82,
    );
    err(
        &publish(&[0x08, 0, 1, b'+']),
        V5,
        E::InvalidPropertyValue(0x08),
        0x82,
    );
    err(&publish(&[0x02, 0, 0]), V5, E::UnexpectedEof, 0x81);
    // User properties may repeat.
    let Some(Packet::Publish(p)) = dec(
        &publish(&[0x26, 0, 1, b'a', 0, 0, 0x26, 0, 1, b'a', 0, 0]),
        V5,
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(
        p.properties.user_properties,
        vec![user("a", ""), user("a", "")]
    );
    // CONNECT: receive maximum 0, maximum packet size 0.
    let connect = |props: &[u8]| {
        let mut b = vec![0x10, 0, 0, 4, b'M', b'Q', b'T', b'T', 5, 2, 0, 0];
        b.push(props.len() as u8);
        b.extend_from_slice(props);
        b.extend_from_slice(&[0, 0]);
        b[1] = (b.len() - 2) as u8;
        b
    };
    assert!(dec(&connect(&[0x21, 0, 1]), None).unwrap().is_some());
    err(
        &connect(&[0x21, 0, 0]),
        None,
        E::InvalidPropertyValue(0x21),
        0x82,
    );
    err(
        &connect(&[0x27, 0, 0, 0, 0]),
        None,
        E::InvalidPropertyValue(0x27),
        0x82,
    );
    err(
        &connect(&[0x17, 1, 0x17, 1]),
        None,
        E::DuplicateProperty(0x17),
        0x82,
    );
    err(
        &connect(&[0x23, 0, 1]),
        None,
        E::PropertyNotAllowed(0x23),
        0x82,
    );
}

// ---- acks ----

#[test]
fn acks() {
    let a = Ack::new(7);
    exact(&[0x40, 2, 0, 7], V3, &Packet::PubAck(a.clone()));
    exact(&[0x40, 2, 0, 7], V5, &Packet::PubAck(a.clone()));
    exact(&[0x50, 2, 0, 7], V5, &Packet::PubRec(a.clone()));
    exact(&[0x62, 2, 0, 7], V3, &Packet::PubRel(a.clone()));
    exact(&[0x70, 2, 0, 7], V5, &Packet::PubComp(a.clone()));
    // Reason code, no properties.
    let nms = Ack {
        code: reason::NO_MATCHING_SUBSCRIBERS,
        ..a.clone()
    };
    exact(&[0x40, 3, 0, 7, 0x10], V5, &Packet::PubAck(nms.clone()));
    // An explicit empty property block decodes to the same ack.
    assert_eq!(
        one(&[0x40, 4, 0, 7, 0x10, 0], V5),
        Packet::PubAck(nms.clone())
    );
    assert_eq!(one(&[0x40, 4, 0, 7, 0, 0], V5), Packet::PubAck(a.clone()));
    // Reason string.
    let rs = Ack {
        properties: Properties {
            reason_string: Some("x".into()),
            ..Properties::default()
        },
        ..nms.clone()
    };
    exact(
        &[0x40, 8, 0, 7, 0x10, 4, 0x1f, 0, 1, b'x'],
        V5,
        &Packet::PubAck(rs.clone()),
    );
    // 3.1.1 drops code and properties.
    assert_eq!(enc(&Packet::PubAck(rs), Version::V311), [0x40, 2, 0, 7]);
    err(
        &[0x60, 2, 0, 7],
        V3,
        E::InvalidFlags {
            packet_type: 6,
            flags: 0,
        },
        0x81,
    );
    err(
        &[0x42, 2, 0, 7],
        V3,
        E::InvalidFlags {
            packet_type: 4,
            flags: 2,
        },
        0x81,
    );
    err(&[0x40, 3, 0, 7, 0], V3, E::TrailingBytes(1), 0x81);
    err(&[0x40, 2, 0, 0], V5, E::ZeroPacketId, 0x82);
    err(&[0x40, 1, 0], V5, E::UnexpectedEof, 0x81);
}

// ---- SUBSCRIBE / SUBACK ----

#[test]
fn subscribe_v311() {
    let bytes = [
        0x82, 0x0e, 0, 10, 0, 3, b'a', b'/', b'b', 1, 0, 3, b'c', b'/', b'#', 2,
    ];
    let p = Packet::Subscribe(Subscribe {
        packet_id: 10,
        filters: vec![
            SubscribeFilter {
                filter: "a/b".into(),
                options: SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..Default::default()
                },
            },
            SubscribeFilter {
                filter: "c/#".into(),
                options: SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    ..Default::default()
                },
            },
        ],
        properties: Properties::default(),
    });
    exact(&bytes, V3, &p);
}

#[test]
fn subscribe_v5_options_and_identifier() {
    let bytes = [0x82, 0x0b, 0, 11, 2, 0x0b, 7, 0, 3, b'x', b'/', b'+', 0x2d];
    let p = Packet::Subscribe(Subscribe {
        packet_id: 11,
        filters: vec![SubscribeFilter {
            filter: "x/+".into(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                no_local: true,
                retain_as_published: true,
                retain_handling: 2,
            },
        }],
        properties: Properties {
            subscription_identifiers: vec![7],
            ..Properties::default()
        },
    });
    exact(&bytes, V5, &p);
    // 3.1.1 keeps only the QoS.
    assert_eq!(
        enc(&p, Version::V311),
        [0x82, 8, 0, 11, 0, 3, b'x', b'/', b'+', 1]
    );
}

#[test]
fn subscribe_errors() {
    err(&[0x82, 2, 0, 1], V3, E::NoTopicFilters, 0x82);
    err(&[0x82, 3, 0, 1, 0], V5, E::NoTopicFilters, 0x82);
    err(&[0x82, 6, 0, 0, 0, 1, b'a', 0], V3, E::ZeroPacketId, 0x82);
    err(
        &[0x80, 6, 0, 1, 0, 1, b'a', 0],
        V3,
        E::InvalidFlags {
            packet_type: 8,
            flags: 0,
        },
        0x81,
    );
    err(
        &[0x82, 6, 0, 1, 0, 1, b'a', 4],
        V3,
        E::ReservedBitsSet,
        0x81,
    );
    err(
        &[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x40],
        V5,
        E::ReservedBitsSet,
        0x81,
    );
    err(
        &[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x30],
        V5,
        E::InvalidRetainHandling,
        0x82,
    );
    err(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 3], V5, E::InvalidQoS, 0x81);
    err(&[0x82, 5, 0, 1, 0, 1, b'a'], V3, E::UnexpectedEof, 0x81);
    err(
        &[0x82, 0x0b, 0, 1, 4, 0x0b, 1, 0x0b, 2, 0, 1, b'a', 0],
        V5,
        E::DuplicateProperty(0x0b),
        0x82,
    );
}

#[test]
fn suback() {
    let p = Packet::SubAck(SubAck {
        packet_id: 10,
        codes: vec![1, 2, 0x80],
        properties: Properties::default(),
    });
    exact(&[0x90, 5, 0, 10, 1, 2, 0x80], V3, &p);
    let p5 = Packet::SubAck(SubAck {
        packet_id: 11,
        codes: vec![1, reason::TOPIC_FILTER_INVALID],
        properties: Properties::default(),
    });
    exact(&[0x90, 5, 0, 11, 0, 1, 0x8f], V5, &p5);
    // 3.1.1 has a single failure code.
    assert_eq!(enc(&p5, Version::V311), [0x90, 4, 0, 11, 1, 0x80]);
    err(
        &[0x90, 3, 0, 10, 0x8f],
        V3,
        E::InvalidReasonCode(0x8f),
        0x81,
    );
}

// ---- UNSUBSCRIBE / UNSUBACK ----

#[test]
fn unsubscribe() {
    let p = Packet::Unsubscribe(Unsubscribe {
        packet_id: 12,
        filters: vec!["a/b".into()],
        properties: Properties::default(),
    });
    exact(&[0xa2, 7, 0, 12, 0, 3, b'a', b'/', b'b'], V3, &p);
    exact(&[0xa2, 8, 0, 12, 0, 0, 3, b'a', b'/', b'b'], V5, &p);
    err(&[0xa2, 2, 0, 12], V3, E::NoTopicFilters, 0x82);
    err(
        &[0xa0, 2, 0, 12],
        V3,
        E::InvalidFlags {
            packet_type: 10,
            flags: 0,
        },
        0x81,
    );
    err(&[0xa2, 5, 0, 0, 0, 1, b'a'], V3, E::ZeroPacketId, 0x82);
}

#[test]
fn unsuback() {
    let p = Packet::UnsubAck(UnsubAck {
        packet_id: 12,
        codes: vec![],
        properties: Properties::default(),
    });
    exact(&[0xb0, 2, 0, 12], V3, &p);
    let p5 = Packet::UnsubAck(UnsubAck {
        packet_id: 12,
        codes: vec![0, reason::NO_SUBSCRIPTION_EXISTED],
        properties: Properties::default(),
    });
    exact(&[0xb0, 5, 0, 12, 0, 0, 0x11], V5, &p5);
    assert_eq!(enc(&p5, Version::V311), [0xb0, 2, 0, 12]);
}

// ---- PINGREQ, PINGRESP, DISCONNECT, AUTH ----

#[test]
fn ping() {
    exact(&[0xc0, 0], V3, &Packet::PingReq);
    exact(&[0xd0, 0], V5, &Packet::PingResp);
    err(&[0xc0, 1, 0], V3, E::TrailingBytes(1), 0x81);
    err(
        &[0xc1, 0],
        V3,
        E::InvalidFlags {
            packet_type: 12,
            flags: 1,
        },
        0x81,
    );
}

#[test]
fn disconnect() {
    let normal = Packet::Disconnect(Disconnect::default());
    exact(&[0xe0, 0], V3, &normal);
    exact(&[0xe0, 0], V5, &normal);
    let will = Packet::Disconnect(Disconnect {
        code: reason::DISCONNECT_WITH_WILL,
        properties: Properties::default(),
    });
    exact(&[0xe0, 1, 0x04], V5, &will);
    assert_eq!(enc(&will, Version::V311), [0xe0, 0]);
    let shutdown = Packet::Disconnect(Disconnect {
        code: reason::SERVER_SHUTTING_DOWN,
        properties: Properties {
            reason_string: Some("x".into()),
            ..Properties::default()
        },
    });
    exact(&[0xe0, 6, 0x8b, 4, 0x1f, 0, 1, b'x'], V5, &shutdown);
    err(&[0xe0, 1, 0], V3, E::TrailingBytes(1), 0x81);
    err(&[0xe0, 2, 0, 1], V5, E::UnexpectedEof, 0x81);
}

#[test]
fn auth() {
    exact(&[0xf0, 0], V5, &Packet::Auth(Auth::default()));
    let p = Packet::Auth(Auth {
        code: reason::CONTINUE_AUTHENTICATION,
        properties: Properties {
            authentication_method: Some("SCRAM".into()),
            ..Properties::default()
        },
    });
    exact(
        &[0xf0, 10, 0x18, 8, 0x15, 0, 5, b'S', b'C', b'R', b'A', b'M'],
        V5,
        &p,
    );
    err(&[0xf0, 0], V3, E::InvalidPacketType(15), 0x81);
    let mut out = BytesMut::new();
    assert_eq!(
        encode(&p, Version::V311, &mut out),
        Err(EncodeError::UnsupportedInVersion)
    );
    assert!(out.is_empty());
}

// ---- fixed header, sizes, streams ----

#[test]
fn fixed_header_errors() {
    err(&[0x00, 0], V3, E::InvalidPacketType(0), 0x81);
    err(
        &[0x30, 0xff, 0xff, 0xff, 0xff, 0x01],
        V5,
        E::MalformedVarInt,
        0x81,
    );
    err(
        &[0x30, 0x80, 0x80, 0x80, 0x80],
        V5,
        E::MalformedVarInt,
        0x81,
    );
    // Three continuation bytes are still a valid prefix.
    assert_eq!(dec(&[0x30, 0x80, 0x80, 0x80], V5), Ok(None));
}

#[test]
fn oversized_packet_rejected_from_fixed_header() {
    // Header of a 268 MB PUBLISH, without its body.
    let mut buf = BytesMut::from(&[0x30, 0xff, 0xff, 0xff, 0x7f][..]);
    assert_eq!(
        decode(&mut buf, V5, 1000),
        Err(E::PacketTooLarge {
            size: DEFAULT_MAX_PACKET_SIZE,
            max: 1000
        })
    );
    assert_eq!(buf.len(), 5, "nothing consumed");
    assert_eq!(E::PacketTooLarge { size: 0, max: 0 }.reason_code(), 0x95);
    // Exactly at the limit is fine; the size counts the fixed header.
    let p = [0x30, 4, 0, 1, b't', 0];
    assert!(decode(&mut BytesMut::from(&p[..]), V5, 6)
        .unwrap()
        .is_some());
    assert!(matches!(
        decode(&mut BytesMut::from(&p[..2]), V5, 5),
        Err(E::PacketTooLarge { size: 6, max: 5 })
    ));
    // Even before CONNECT.
    assert!(matches!(
        decode(&mut BytesMut::from(&[0x10, 0xe8, 0x07][..]), None, 100),
        Err(E::PacketTooLarge {
            size: 1003,
            max: 100
        })
    ));
}

#[test]
fn stream_of_packets() {
    let mut stream = connect_v5_bytes();
    stream.extend_from_slice(&[0x82, 6, 0, 1, 0, 0, 1, b'a', 1][..0]);
    stream.extend_from_slice(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 1]);
    stream.extend_from_slice(&[0xc0, 0, 0xe0, 0]);
    stream.extend_from_slice(&[0x30]); // start of the next packet
    let mut buf = BytesMut::from(&stream[..]);
    let mut v = None;
    let mut names = Vec::new();
    while let Some(p) = decode(&mut buf, v, MAX).unwrap() {
        if let Packet::Connect(c) = &p {
            v = Some(c.version);
        }
        names.push(p.name());
    }
    assert_eq!(names, ["CONNECT", "SUBSCRIBE", "PINGREQ", "DISCONNECT"]);
    assert_eq!(&buf[..], &[0x30]);
}

#[test]
fn encode_errors() {
    let mut out = BytesMut::new();
    let mut p = Publish {
        qos: QoS::AtLeastOnce,
        topic: "t".into(),
        ..Publish::default()
    };
    let check = |p: &Packet, e: EncodeError, out: &mut BytesMut| {
        assert_eq!(encode(p, Version::V5, out), Err(e.clone()));
        assert_eq!(encoded_len(p, Version::V5), Err(e));
        assert!(out.is_empty());
    };
    check(
        &Packet::Publish(p.clone()),
        EncodeError::InvalidPacketId,
        &mut out,
    );
    p.packet_id = Some(0);
    check(
        &Packet::Publish(p.clone()),
        EncodeError::InvalidPacketId,
        &mut out,
    );
    p.qos = QoS::AtMostOnce;
    p.packet_id = Some(1);
    check(
        &Packet::Publish(p.clone()),
        EncodeError::InvalidPacketId,
        &mut out,
    );
    p.packet_id = None;
    p.topic = "x".repeat(70_000);
    check(
        &Packet::Publish(p.clone()),
        EncodeError::FieldTooLong(70_000),
        &mut out,
    );
    p.topic = "t".into();
    p.properties.subscription_identifiers = vec![crate::MAX_VARINT + 1];
    check(
        &Packet::Publish(p.clone()),
        EncodeError::InvalidVarInt(crate::MAX_VARINT + 1),
        &mut out,
    );
    let s = Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: "a".into(),
            options: SubscriptionOptions {
                retain_handling: 3,
                ..Default::default()
            },
        }],
        properties: Properties::default(),
    };
    check(
        &Packet::Subscribe(s),
        EncodeError::InvalidRetainHandling(3),
        &mut out,
    );
    let c = Connect {
        version: Version::V311,
        client_id: String::new(),
        clean_start: true,
        keep_alive: 0,
        username: None,
        password: Some(Bytes::new()),
        will: None,
        properties: Properties::default(),
    };
    check(
        &Packet::Connect(c),
        EncodeError::PasswordWithoutUsername,
        &mut out,
    );
}

#[test]
fn encoder_drops_properties_not_allowed() {
    let ack = Ack {
        packet_id: 1,
        code: 0,
        properties: Properties {
            topic_alias: Some(4),
            ..Properties::default()
        },
    };
    assert_eq!(enc(&Packet::PubAck(ack), Version::V5), [0x40, 2, 0, 1]);
}

#[test]
fn large_payload_lengths() {
    for n in [0usize, 120, 121, 122, 16_380, 16_384, 2_097_152] {
        let p = Packet::Publish(Publish {
            topic: "t".into(),
            payload: Bytes::from(vec![7u8; n]),
            ..Publish::default()
        });
        let bytes = enc(&p, Version::V311);
        assert_eq!(bytes.len(), encoded_len(&p, Version::V311).unwrap());
        let mut buf = BytesMut::from(&bytes[..]);
        assert_eq!(decode(&mut buf, V3, MAX).unwrap(), Some(p));
    }
}

// ---- property-based ----

fn string() -> impl Strategy<Value = String> {
    "[a-z/é]{0,6}"
}

fn topic() -> impl Strategy<Value = String> {
    "[a-z$]{1,3}(/[a-z]{0,3}){0,2}"
}

fn binary() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from)
}

fn flag() -> impl Strategy<Value = Option<bool>> {
    proptest::option::of(any::<bool>())
}

fn nonzero() -> impl Strategy<Value = Option<u16>> {
    proptest::option::of(1..=u16::MAX)
}

prop_compose! {
    fn properties_inner()(
        a in (
            proptest::option::of(0u8..=1),
            any::<Option<u32>>(),
            proptest::option::of(string()),
            proptest::option::of(topic()),
            proptest::option::of(binary()),
            proptest::collection::vec(1..=crate::MAX_VARINT, 0..3),
            any::<Option<u32>>(),
            proptest::option::of(string()),
            any::<Option<u16>>(),
            proptest::option::of(string()),
            proptest::option::of(binary()),
            flag(),
        ),
        b in (
            any::<Option<u32>>(),
            flag(),
            proptest::option::of(string()),
            proptest::option::of(string()),
            proptest::option::of(string()),
            nonzero(),
            any::<Option<u16>>(),
            nonzero(),
            proptest::option::of(0u8..=1),
            flag(),
            proptest::collection::vec((string(), string()), 0..3),
            proptest::option::of(1..=u32::MAX),
        ),
        c in (flag(), flag(), flag()),
    ) -> Properties {
        Properties {
            payload_format_indicator: a.0,
            message_expiry_interval: a.1,
            content_type: a.2,
            response_topic: a.3,
            correlation_data: a.4,
            subscription_identifiers: a.5,
            session_expiry_interval: a.6,
            assigned_client_identifier: a.7,
            server_keep_alive: a.8,
            authentication_method: a.9,
            authentication_data: a.10,
            request_problem_information: a.11,
            will_delay_interval: b.0,
            request_response_information: b.1,
            response_information: b.2,
            server_reference: b.3,
            reason_string: b.4,
            receive_maximum: b.5,
            topic_alias_maximum: b.6,
            topic_alias: b.7,
            maximum_qos: b.8,
            retain_available: b.9,
            user_properties: b.10,
            maximum_packet_size: b.11,
            wildcard_subscription_available: c.0,
            subscription_identifier_available: c.1,
            shared_subscription_available: c.2,
        }
    }
}

fn properties() -> BoxedStrategy<Properties> {
    properties_inner().boxed()
}

/// Clears the properties a packet type may not carry, as the encoder skips
/// them.
fn only_allowed(mut p: Properties, ctx: Ctx) -> Properties {
    let ok = |pid| allowed(pid, ctx) == Some(true);
    macro_rules! clear {
        ($($pid:ident => $field:ident),* $(,)?) => {
            $(if !ok(id::$pid) { p.$field = Default::default(); })*
        };
    }
    clear!(
        PAYLOAD_FORMAT_INDICATOR => payload_format_indicator,
        MESSAGE_EXPIRY_INTERVAL => message_expiry_interval,
        CONTENT_TYPE => content_type,
        RESPONSE_TOPIC => response_topic,
        CORRELATION_DATA => correlation_data,
        SUBSCRIPTION_IDENTIFIER => subscription_identifiers,
        SESSION_EXPIRY_INTERVAL => session_expiry_interval,
        ASSIGNED_CLIENT_IDENTIFIER => assigned_client_identifier,
        SERVER_KEEP_ALIVE => server_keep_alive,
        AUTHENTICATION_METHOD => authentication_method,
        AUTHENTICATION_DATA => authentication_data,
        REQUEST_PROBLEM_INFORMATION => request_problem_information,
        WILL_DELAY_INTERVAL => will_delay_interval,
        REQUEST_RESPONSE_INFORMATION => request_response_information,
        RESPONSE_INFORMATION => response_information,
        SERVER_REFERENCE => server_reference,
        REASON_STRING => reason_string,
        RECEIVE_MAXIMUM => receive_maximum,
        TOPIC_ALIAS_MAXIMUM => topic_alias_maximum,
        TOPIC_ALIAS => topic_alias,
        MAXIMUM_QOS => maximum_qos,
        RETAIN_AVAILABLE => retain_available,
        USER_PROPERTY => user_properties,
        MAXIMUM_PACKET_SIZE => maximum_packet_size,
        WILDCARD_SUBSCRIPTION_AVAILABLE => wildcard_subscription_available,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE => subscription_identifier_available,
        SHARED_SUBSCRIPTION_AVAILABLE => shared_subscription_available,
    );
    if ctx == Ctx::Subscribe {
        p.subscription_identifiers.truncate(1);
    }
    p
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

fn will() -> BoxedStrategy<Will> {
    (topic(), binary(), qos(), any::<bool>(), properties())
        .prop_map(|(topic, payload, qos, retain, p)| Will {
            topic,
            payload,
            qos,
            retain,
            properties: only_allowed(p, Ctx::Will),
        })
        .boxed()
}

fn connect() -> BoxedStrategy<Connect> {
    (
        any::<bool>(),
        string(),
        any::<bool>(),
        any::<u16>(),
        proptest::option::of(string()),
        proptest::option::of(binary()),
        proptest::option::of(will()),
        properties(),
    )
        .prop_map(
            |(v5, client_id, clean_start, keep_alive, username, password, will, p)| Connect {
                version: if v5 { Version::V5 } else { Version::V311 },
                client_id,
                clean_start,
                keep_alive,
                password: if v5 || username.is_some() {
                    password
                } else {
                    None
                },
                username,
                will,
                properties: only_allowed(p, Ctx::Connect),
            },
        )
        .boxed()
}

fn publish() -> BoxedStrategy<Publish> {
    (
        any::<bool>(),
        qos(),
        any::<bool>(),
        proptest::option::of(topic()),
        1..=u16::MAX,
        properties(),
        binary(),
    )
        .prop_map(|(dup, qos, retain, topic, id, p, payload)| {
            let properties = only_allowed(p, Ctx::Publish);
            let topic = match topic {
                Some(t) => t,
                None if properties.topic_alias.is_some() => String::new(),
                None => "t".into(),
            };
            Publish {
                dup: dup && qos != QoS::AtMostOnce,
                qos,
                retain,
                topic,
                packet_id: (qos != QoS::AtMostOnce).then_some(id),
                properties,
                payload,
            }
        })
        .boxed()
}

fn code_props(ctx: Ctx) -> BoxedStrategy<(u8, Properties)> {
    (prop_oneof![Just(0u8), any::<u8>()], properties())
        .prop_map(move |(c, p)| (c, only_allowed(p, ctx)))
        .boxed()
}

fn ack() -> BoxedStrategy<Ack> {
    (1..=u16::MAX, code_props(Ctx::Ack))
        .prop_map(|(packet_id, (code, properties))| Ack {
            packet_id,
            code,
            properties,
        })
        .boxed()
}

fn options() -> BoxedStrategy<SubscriptionOptions> {
    (qos(), any::<bool>(), any::<bool>(), 0u8..=2)
        .prop_map(|(qos, nl, rap, rh)| SubscriptionOptions {
            qos,
            no_local: nl,
            retain_as_published: rap,
            retain_handling: rh,
        })
        .boxed()
}

fn packet() -> BoxedStrategy<Packet> {
    prop_oneof![
        connect().prop_map(Packet::Connect),
        (any::<bool>(), any::<u8>(), properties()).prop_map(|(s, code, p)| {
            Packet::ConnAck(ConnAck {
                session_present: s,
                code,
                properties: only_allowed(p, Ctx::ConnAck),
            })
        }),
        publish().prop_map(Packet::Publish),
        ack().prop_map(Packet::PubAck),
        ack().prop_map(Packet::PubRec),
        ack().prop_map(Packet::PubRel),
        ack().prop_map(Packet::PubComp),
        (
            1..=u16::MAX,
            proptest::collection::vec((string(), options()), 1..4),
            properties()
        )
            .prop_map(|(packet_id, f, p)| Packet::Subscribe(Subscribe {
                packet_id,
                filters: f
                    .into_iter()
                    .map(|(filter, options)| SubscribeFilter { filter, options })
                    .collect(),
                properties: only_allowed(p, Ctx::Subscribe),
            })),
        (
            1..=u16::MAX,
            proptest::collection::vec(any::<u8>(), 0..4),
            properties()
        )
            .prop_map(|(packet_id, codes, p)| Packet::SubAck(SubAck {
                packet_id,
                codes,
                properties: only_allowed(p, Ctx::SubAck),
            })),
        (
            1..=u16::MAX,
            proptest::collection::vec(string(), 1..4),
            properties()
        )
            .prop_map(|(packet_id, filters, p)| Packet::Unsubscribe(Unsubscribe {
                packet_id,
                filters,
                properties: only_allowed(p, Ctx::Unsubscribe),
            })),
        (
            1..=u16::MAX,
            proptest::collection::vec(any::<u8>(), 0..4),
            properties()
        )
            .prop_map(|(packet_id, codes, p)| Packet::UnsubAck(UnsubAck {
                packet_id,
                codes,
                properties: only_allowed(p, Ctx::UnsubAck),
            })),
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        code_props(Ctx::Disconnect)
            .prop_map(|(code, properties)| Packet::Disconnect(Disconnect { code, properties })),
        code_props(Ctx::Auth)
            .prop_map(|(code, properties)| Packet::Auth(Auth { code, properties })),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// MQTT 5 carries every field: decode(encode(p)) == p.
    #[test]
    fn roundtrip_v5(p in packet()) {
        let bytes = enc(&p, Version::V5);
        let v = if matches!(p, Packet::Connect(_)) { None } else { V5 };
        let ver = match &p { Packet::Connect(c) => c.version, _ => Version::V5 };
        let mut buf = BytesMut::from(&bytes[..]);
        let got = decode(&mut buf, v, MAX).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        if ver == Version::V5 {
            prop_assert_eq!(&got, &p);
        }
        crate::fuzz::fuzz_decode(&bytes);
    }

    /// MQTT 3.1.1 drops what it cannot carry; what is left round-trips and
    /// re-encodes to the same bytes.
    #[test]
    fn roundtrip_v311(p in packet()) {
        if matches!(p, Packet::Auth(_)) {
            prop_assert_eq!(
                encode(&p, Version::V311, &mut BytesMut::new()),
                Err(EncodeError::UnsupportedInVersion)
            );
            return Ok(());
        }
        let bytes = enc(&p, Version::V311);
        let v = if matches!(p, Packet::Connect(_)) { None } else { V3 };
        let mut buf = BytesMut::from(&bytes[..]);
        match decode(&mut buf, v, MAX) {
            Ok(Some(got)) => {
                let ver = match &got { Packet::Connect(c) => c.version, _ => Version::V311 };
                prop_assert_eq!(enc(&got, ver), bytes.clone());
            }
            // A 3.1.1 CONNACK code above 5 is reserved.
            Err(DecodeError::InvalidReasonCode(c)) => prop_assert!(c > 5),
            // 3.1.1 has no topic aliases.
            Err(DecodeError::InvalidTopicName) => {
                prop_assert!(matches!(&p, Packet::Publish(x) if x.topic.is_empty()))
            }
            other => prop_assert!(false, "{:?}", other),
        }
        crate::fuzz::fuzz_decode(&bytes);
    }

    /// Mutated encodings never panic and whatever is accepted round-trips.
    #[test]
    fn mutations(p in packet(), at in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let ver = match &p { Packet::Connect(c) => c.version, _ => Version::V5 };
        let mut bytes = enc(&p, ver);
        let i = at.index(bytes.len());
        bytes[i] = byte;
        crate::fuzz::fuzz_decode(&bytes);
        let n = cut.index(bytes.len() + 1);
        crate::fuzz::fuzz_decode(&bytes[..n]);
    }
}
