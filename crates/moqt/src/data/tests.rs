//! Data stream and datagram tests: the draft's §11.6 examples byte by byte, every
//! SUBGROUP_HEADER and OBJECT_DATAGRAM type, FETCH serialization flags, object
//! status rules, proptest round trips and never-panic properties.

use super::*;
use crate::coding::{get_kvps, KeyValue};

use proptest::collection::vec;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn obj(object_id: u64, payload: &'static [u8]) -> SubgroupObject {
    SubgroupObject {
        object_id,
        properties: Bytes::new(),
        status: ObjectStatus::Normal,
        payload: Bytes::from_static(payload),
    }
}

/// Encodes a subgroup stream.
fn encode_subgroup(h: &SubgroupHeader, objects: &[SubgroupObject]) -> Vec<u8> {
    let mut b = Vec::new();
    h.encode(&mut b);
    let mut prev = None;
    for o in objects {
        o.encode(&mut b, prev, h.has_properties).unwrap();
        prev = Some(o.object_id);
    }
    b
}

/// Decodes a whole subgroup stream.
fn decode_subgroup(b: &[u8]) -> Result<(SubgroupHeader, Vec<SubgroupObject>), DecodeError> {
    let src = Bytes::copy_from_slice(b);
    let mut s = &src[..];
    let h = SubgroupHeader::decode(&mut s)?;
    let mut out = Vec::new();
    let mut prev = None;
    while !s.is_empty() {
        let o = SubgroupObject::decode(&mut s, &src, prev, h.has_properties, MAX_OBJECT_PAYLOAD)?;
        prev = Some(o.object_id);
        out.push(o);
    }
    Ok((h, out))
}

// ---------------------------------------------------------------------------
// §11.6 Examples.
// ---------------------------------------------------------------------------

/// First example of §11.6: type 0x14, alias 2, group 0, subgroup 0, priority 0,
/// objects 0 "abcd" and 1 "efgh".
#[test]
fn spec_example_subgroup() {
    let h = SubgroupHeader {
        track_alias: 2,
        group: 0,
        subgroup: SubgroupId::Explicit(0),
        priority: Some(0),
        has_properties: false,
        end_of_group: false,
        first_object: false,
    };
    assert_eq!(h.type_byte(), 0x14);
    let objects = [obj(0, b"abcd"), obj(1, b"efgh")];
    let bytes = hex("14 02 00 00 00   00 04 61626364   00 04 65666768");
    assert_eq!(encode_subgroup(&h, &objects), bytes);
    let (dh, dobjs) = decode_subgroup(&bytes).unwrap();
    assert_eq!(dh, h);
    assert_eq!(dobjs, objects);
}

/// Second example of §11.6: type 0x35 (PROPERTIES, Subgroup ID present, default
/// priority), the first object carrying two properties.
///
/// Checked byte by byte, the draft's numbers do not add up under its own
/// draft-18 encoding: Type 4 = 2186796243 is delta 0x04 plus a 5-byte vi64
/// (6 bytes), and Type 77 is delta 73 (0x49), Length 14 and the 14 bytes of
/// "traceID:123456" (16 bytes), so Properties Length is 22, not 33, and the
/// second property's Length is 14, not 21. (33 is what the draft-≤16 QUIC
/// varints give with a 21-byte value: 1 + 8 + 2 + 1 + 21.) We encode what the
/// draft-18 rules produce.
#[test]
fn spec_example_subgroup_with_properties() {
    let h = SubgroupHeader {
        track_alias: 2,
        group: 0,
        subgroup: SubgroupId::Explicit(0),
        priority: None,
        has_properties: true,
        end_of_group: false,
        first_object: false,
    };
    assert_eq!(h.type_byte(), 0x35);

    let kvs = vec![
        KeyValue::int(4, 2_186_796_243),
        KeyValue::bytes(77, Bytes::from_static(b"traceID:123456")),
    ];
    let mut props = Vec::new();
    crate::coding::put_kvps(&mut props, &kvs);
    assert_eq!(
        props,
        hex("04 f08257dcd3   49 0e 747261636549443a313233343536")
    );
    assert_eq!(props.len(), 22);

    let objects = [
        SubgroupObject {
            object_id: 0,
            properties: Bytes::from(props.clone()),
            status: ObjectStatus::Normal,
            payload: Bytes::from_static(b"abcd"),
        },
        obj(1, b"efgh"),
    ];
    let bytes = hex("35 02 00 00
         00 16 04f08257dcd3 490e747261636549443a313233343536 04 61626364
         00 00 04 65666768");
    assert_eq!(encode_subgroup(&h, &objects), bytes);
    let (dh, dobjs) = decode_subgroup(&bytes).unwrap();
    assert_eq!(dh, h);
    assert_eq!(dobjs, objects);
    // Object 1: Object ID Delta 0 after Object 0 is Object ID 1.
    assert_eq!(dobjs[1].object_id, 1);
    // The property block parses back to the two pairs.
    let pb = dobjs[0].properties.clone();
    assert_eq!(get_kvps(&mut &pb[..], &pb).unwrap(), kvs);

    // The literal Length values from the draft (33 and 21) do not frame.
    let literal = hex("35 02 00 00
         00 21 04f08257dcd3 4915747261636549443a313233343536 04 61626364
         00 00 04 65666768");
    assert_ne!(decode_subgroup(&literal).ok(), Some((h, objects.to_vec())));
}

// ---------------------------------------------------------------------------
// SUBGROUP_HEADER types.
// ---------------------------------------------------------------------------

/// The valid types as the SUBGROUP_HEADER figure lists them.
fn spec_subgroup_types() -> Vec<u8> {
    let mut v = Vec::new();
    for base in [0x10u8, 0x30, 0x50, 0x70] {
        v.extend(base..=base + 0x05);
        v.extend(base + 0x08..=base + 0x0d);
    }
    v
}

#[test]
fn subgroup_types_match_the_spec_list() {
    let spec = spec_subgroup_types();
    assert_eq!(spec.len(), 48);
    for t in 0..=255u8 {
        assert_eq!(SubgroupHeader::valid_type(t), spec.contains(&t), "{t:#04x}");
    }
    // The reserved SUBGROUP_ID_MODE 0b11 values named in the draft.
    for t in [
        0x16, 0x17, 0x1E, 0x1F, 0x36, 0x37, 0x3E, 0x3F, 0x56, 0x57, 0x5E, 0x5F, 0x76, 0x77, 0x7E,
        0x7F,
    ] {
        assert!(!SubgroupHeader::valid_type(t));
    }
}

#[test]
fn every_valid_subgroup_type_roundtrips() {
    for t in spec_subgroup_types() {
        // Header bytes as the figure lays them out: Type, Track Alias, Group ID,
        // [Subgroup ID], [Publisher Priority].
        let mut bytes = vec![t, 0x81, 0x00, 0x05];
        if t & 0x06 == 0x04 {
            bytes.push(0x09);
        }
        if t & 0x20 == 0 {
            bytes.push(0xc8);
        }
        let mut s = &bytes[..];
        let h = SubgroupHeader::decode(&mut s).unwrap();
        assert!(s.is_empty(), "{t:#x}");
        assert_eq!(h.type_byte(), t);
        assert_eq!(h.track_alias, 256);
        assert_eq!(h.group, 5);
        assert_eq!(h.has_properties, t & 0x01 != 0);
        assert_eq!(h.end_of_group, t & 0x08 != 0);
        assert_eq!(h.first_object, t & 0x40 != 0);
        assert_eq!(h.priority, (t & 0x20 == 0).then_some(200));
        assert_eq!(
            h.subgroup,
            match t & 0x06 {
                0 => SubgroupId::Zero,
                2 => SubgroupId::FirstObject,
                _ => SubgroupId::Explicit(9),
            }
        );
        let mut enc = Vec::new();
        h.encode(&mut enc);
        assert_eq!(enc, bytes, "{t:#x}");
        assert_eq!(StreamType::from_code(t as u64), Ok(StreamType::Subgroup(t)));
        // Followed by objects, with or without properties.
        let objs = vec![
            SubgroupObject {
                object_id: 3,
                properties: if h.has_properties {
                    Bytes::from_static(b"\x02\x01")
                } else {
                    Bytes::new()
                },
                status: ObjectStatus::Normal,
                payload: Bytes::from_static(b"x"),
            },
            SubgroupObject {
                object_id: 7,
                properties: Bytes::new(),
                status: ObjectStatus::EndOfGroup,
                payload: Bytes::new(),
            },
        ];
        assert_eq!(
            decode_subgroup(&encode_subgroup(&h, &objs)).unwrap(),
            (h, objs)
        );
    }
}

#[test]
fn every_invalid_subgroup_type_is_rejected() {
    let valid = spec_subgroup_types();
    for t in 0..0x80u8 {
        if valid.contains(&t) {
            continue;
        }
        let bytes = [t, 1, 2, 3, 4, 5];
        assert_eq!(
            SubgroupHeader::decode(&mut &bytes[..]),
            Err(DecodeError::UnknownType(t as u64)),
            "{t:#x}"
        );
        assert_eq!(
            SubgroupHeader::decode_after_type(t, &mut &bytes[1..]),
            Err(DecodeError::UnknownType(t as u64))
        );
    }
    // Types of 0x80 and above take two or more vi64 bytes; none is a SUBGROUP_HEADER.
    for t in [0x80u64, 0x90, 0xB4, 0x3FFF, 0x2F00, u64::MAX] {
        let mut b = Vec::new();
        put_vi64(&mut b, t);
        b.extend_from_slice(&[0; 4]);
        assert_eq!(
            SubgroupHeader::decode(&mut &b[..]),
            Err(DecodeError::UnknownType(t))
        );
    }
}

#[test]
fn stream_types() {
    assert_eq!(StreamType::from_code(0x05), Ok(StreamType::Fetch));
    assert_eq!(StreamType::from_code(0x2F00), Ok(StreamType::Control));
    assert_eq!(StreamType::from_code(0x132B_3E28), Ok(StreamType::Padding));
    for bad in [
        0x00u64,
        0x01,
        0x04,
        0x06,
        0x0F,
        0x16,
        0x20,
        0x80,
        0x2F01,
        0x132B_3E29,
        u64::MAX,
    ] {
        assert_eq!(
            StreamType::from_code(bad),
            Err(DecodeError::UnknownType(bad)),
            "{bad:#x}"
        );
    }
    // peek reports the type's length and consumes nothing.
    let mut b = Vec::new();
    put_vi64(&mut b, PADDING_STREAM);
    b.extend_from_slice(&[0, 0, 0]);
    assert_eq!(StreamType::peek(&b), Ok((StreamType::Padding, 5)));
    assert_eq!(StreamType::peek(&[0x05, 0x07]), Ok((StreamType::Fetch, 1)));
    assert_eq!(StreamType::peek(&[0xaf]), Err(DecodeError::Short));
    // A non-minimal type still classifies.
    assert_eq!(
        StreamType::peek(&[0x80, 0x14]),
        Ok((StreamType::Subgroup(0x14), 2))
    );
}

#[test]
fn header_decode_is_atomic() {
    let h = SubgroupHeader {
        track_alias: 1_000_000,
        group: 70_000,
        subgroup: SubgroupId::Explicit(300),
        priority: Some(1),
        has_properties: true,
        end_of_group: true,
        first_object: true,
    };
    let mut b = Vec::new();
    h.encode(&mut b);
    for n in 0..b.len() {
        let mut s = &b[..n];
        assert_eq!(SubgroupHeader::decode(&mut s), Err(DecodeError::Short));
        assert_eq!(s.len(), n);
    }
    assert_eq!(SubgroupHeader::decode(&mut &b[..]), Ok(h));
}

// ---------------------------------------------------------------------------
// Subgroup objects and Object Status.
// ---------------------------------------------------------------------------

#[test]
fn object_status_codes() {
    for (c, s) in [
        (0, ObjectStatus::Normal),
        (3, ObjectStatus::EndOfGroup),
        (4, ObjectStatus::EndOfTrack),
    ] {
        assert_eq!(ObjectStatus::from_code(c), Ok(s));
        assert_eq!(s.code(), c);
    }
    for c in [1, 2, 5, 6, 0x80, u64::MAX] {
        assert!(ObjectStatus::from_code(c).is_err(), "{c}");
    }
}

#[test]
fn subgroup_object_status_rules() {
    let src = |b: &[u8]| Bytes::copy_from_slice(b);
    let dec = |b: &Bytes, props: bool| {
        SubgroupObject::decode(&mut &b[..], b, None, props, MAX_OBJECT_PAYLOAD)
    };
    // Zero-length payload: the status follows; Normal, EndOfGroup, EndOfTrack.
    for (c, st) in [
        (0, ObjectStatus::Normal),
        (3, ObjectStatus::EndOfGroup),
        (4, ObjectStatus::EndOfTrack),
    ] {
        let b = src(&[5, 0, c]);
        let o = dec(&b, false).unwrap();
        assert_eq!((o.object_id, o.status, o.payload.len()), (5, st, 0));
    }
    // A non-zero length has no status field: the next byte is payload.
    let b = src(&[0, 1, 4]);
    let o = dec(&b, false).unwrap();
    assert_eq!(
        (o.status, &o.payload[..]),
        (ObjectStatus::Normal, &[4u8][..])
    );
    // Unknown status values.
    for c in [1u8, 2, 5, 0x7f] {
        assert!(dec(&src(&[0, 0, c]), false).is_err(), "{c}");
    }
    // Properties on a Normal empty object are fine; on End of Group they are not.
    assert!(dec(&src(&[0, 2, 0x02, 0x01, 0, 0]), true).is_ok());
    assert!(matches!(
        dec(&src(&[0, 2, 0x02, 0x01, 0, 3]), true),
        Err(DecodeError::Invalid(_))
    ));
    assert!(dec(&src(&[0, 0, 0, 3]), true).is_ok());
    // Truncated payload.
    assert_eq!(dec(&src(&[0, 5, 1, 2]), false), Err(DecodeError::Short));
    // Payload over the caller's limit.
    let b = src(&[0, 0x83, 0xe8]);
    assert_eq!(
        SubgroupObject::decode(&mut &b[..], &b, None, false, 999),
        Err(DecodeError::TooLong)
    );
}

#[test]
fn subgroup_object_ids() {
    // Delta + 1 added to the previous ID; the first object carries its ID.
    let b = Bytes::from_static(&[3, 1, b'a', 0, 1, b'b', 2, 1, b'c']);
    let mut s = &b[..];
    let mut prev = None;
    let mut ids = Vec::new();
    while !s.is_empty() {
        let o = SubgroupObject::decode(&mut s, &b, prev, false, 100).unwrap();
        prev = Some(o.object_id);
        ids.push(o.object_id);
    }
    assert_eq!(ids, [3, 4, 7]);
    // Overflow past 2^64-1.
    let b = Bytes::from_static(&[0, 1, b'a']);
    assert!(SubgroupObject::decode(&mut &b[..], &b, Some(u64::MAX), false, 100).is_err());
    let b = Bytes::from_static(&[5, 1, b'a']);
    assert!(SubgroupObject::decode(&mut &b[..], &b, Some(u64::MAX - 5), false, 100).is_err());
}

#[test]
fn subgroup_object_encode_errors() {
    let mut b = Vec::new();
    let mut o = obj(5, b"x");
    // IDs must increase.
    assert!(o.encode(&mut b, Some(5), false).is_err());
    assert!(o.encode(&mut b, Some(9), false).is_err());
    assert!(o.encode(&mut b, Some(u64::MAX), false).is_err());
    // Properties need the header's PROPERTIES bit.
    o.properties = Bytes::from_static(b"\x02\x01");
    assert!(o.encode(&mut b, None, false).is_err());
    // A status other than Normal carries neither payload nor properties.
    o.status = ObjectStatus::EndOfGroup;
    o.properties = Bytes::new();
    assert!(o.encode(&mut b, None, false).is_err());
    o.payload = Bytes::new();
    o.properties = Bytes::from_static(b"\x02\x01");
    assert!(o.encode(&mut b, None, true).is_err());
    assert!(b.is_empty(), "failed encodes wrote nothing");
    o.properties = Bytes::new();
    o.encode(&mut b, Some(4), true).unwrap();
    assert_eq!(b, [0, 0, 0, 3]);
}

// ---------------------------------------------------------------------------
// OBJECT_DATAGRAM types.
// ---------------------------------------------------------------------------

/// The valid types as the OBJECT_DATAGRAM figure lists them.
fn spec_datagram_types() -> Vec<u64> {
    let mut v: Vec<u64> = (0x00..=0x0f).collect();
    v.extend([0x20, 0x21, 0x24, 0x25, 0x28, 0x29, 0x2c, 0x2d]);
    v
}

#[test]
fn datagram_types_match_the_spec_list() {
    let spec = spec_datagram_types();
    for t in 0..=0x1ffu64 {
        assert_eq!(ObjectDatagram::valid_type(t), spec.contains(&t), "{t:#x}");
    }
    assert!(!ObjectDatagram::valid_type(PADDING_DATAGRAM));
}

#[test]
fn every_datagram_type_0x00_to_0x2f() {
    let spec = spec_datagram_types();
    for t in 0..=0x2fu64 {
        // Fields as the figure lays them out.
        let mut bytes = vec![t as u8, 0x07, 0x80, 0x80];
        if t & 0x04 == 0 {
            bytes.push(0x09);
        }
        if t & 0x08 == 0 {
            bytes.push(0x40);
        }
        if t & 0x01 != 0 {
            bytes.extend_from_slice(&[2, 0x0e, 0x05]);
        }
        if t & 0x20 != 0 {
            bytes.push(0x00);
        } else {
            bytes.extend_from_slice(b"payload");
        }
        let src = Bytes::from(bytes.clone());
        let r = ObjectDatagram::decode(&src);
        if !spec.contains(&t) {
            assert_eq!(r, Err(DecodeError::UnknownType(t)), "{t:#x}");
            continue;
        }
        let d = r.unwrap_or_else(|e| panic!("{t:#x}: {e}"));
        assert_eq!(d.track_alias, 7);
        assert_eq!(d.group, 128);
        assert_eq!(d.object_id, if t & 0x04 == 0 { 9 } else { 0 });
        assert_eq!(d.priority, (t & 0x08 == 0).then_some(0x40));
        assert_eq!(d.end_of_group, t & 0x02 != 0);
        assert_eq!(d.properties.is_empty(), t & 0x01 == 0);
        if t & 0x20 != 0 {
            assert_eq!(d.status, Some(ObjectStatus::Normal));
            assert!(d.payload.is_empty());
        } else {
            assert_eq!(d.status, None);
            assert_eq!(&d.payload[..], b"payload");
        }
        assert_eq!(d.type_code(), t);
        let mut enc = Vec::new();
        d.encode(&mut enc);
        assert_eq!(enc, bytes, "{t:#x}");
    }
    for t in [
        0x30u64,
        0x40,
        0x7f,
        0x80,
        0x2F00,
        PADDING_DATAGRAM,
        u64::MAX,
    ] {
        let mut b = Vec::new();
        put_vi64(&mut b, t);
        b.extend_from_slice(&[1, 1, 1, 1]);
        assert_eq!(
            ObjectDatagram::decode(&Bytes::from(b)),
            Err(DecodeError::UnknownType(t))
        );
    }
}

#[test]
fn datagram_field_rules() {
    let dec = |b: &[u8]| ObjectDatagram::decode(&Bytes::copy_from_slice(b));
    // PROPERTIES bit with a zero Properties Length.
    assert!(matches!(
        dec(&[0x0d, 1, 1, 0]),
        Err(DecodeError::Invalid(_))
    ));
    // STATUS + PROPERTIES: only Normal may carry properties.
    assert!(dec(&[0x2d, 1, 1, 2, 0x0e, 5, 0]).is_ok());
    assert!(matches!(
        dec(&[0x2d, 1, 1, 2, 0x0e, 5, 3]),
        Err(DecodeError::Invalid(_))
    ));
    assert!(matches!(
        dec(&[0x2d, 1, 1, 2, 0x0e, 5, 4]),
        Err(DecodeError::Invalid(_))
    ));
    // Nothing may follow the status.
    assert!(matches!(
        dec(&[0x2c, 1, 1, 3, 0]),
        Err(DecodeError::Invalid(_))
    ));
    // Unknown status values.
    assert!(dec(&[0x2c, 1, 1, 2]).is_err());
    // An empty payload is a valid (Normal) object.
    let d = dec(&[0x0c, 1, 1]).unwrap();
    assert!(d.payload.is_empty() && d.status.is_none());
    // Truncated headers.
    for b in [
        &[][..],
        &[0x00],
        &[0x00, 1],
        &[0x00, 1, 1],
        &[0x00, 1, 1, 1],
        &[0x2c, 1, 1],
    ] {
        assert_eq!(dec(b), Err(DecodeError::Short), "{b:02x?}");
    }
}

#[test]
fn datagram_encoder_never_writes_invalid_types() {
    let base = ObjectDatagram {
        track_alias: 1,
        group: 2,
        object_id: 3,
        priority: None,
        properties: Bytes::new(),
        end_of_group: true,
        status: None,
        payload: Bytes::new(),
    };
    // Normal status ending the group: sent as an empty payload with END_OF_GROUP.
    let d = ObjectDatagram {
        status: Some(ObjectStatus::Normal),
        ..base.clone()
    };
    let mut b = Vec::new();
    d.encode(&mut b);
    assert_eq!(b, [0x0a, 1, 2, 3]);
    assert_eq!(ObjectDatagram::decode(&Bytes::from(b)).unwrap(), base);
    // End of Group / End of Track: the status already ends the group.
    for st in [ObjectStatus::EndOfGroup, ObjectStatus::EndOfTrack] {
        let d = ObjectDatagram {
            status: Some(st),
            ..base.clone()
        };
        assert!(ObjectDatagram::valid_type(d.type_code()));
        let mut b = Vec::new();
        d.encode(&mut b);
        assert_eq!(b, [0x28, 1, 2, 3, st.code() as u8]);
        d.validate().unwrap();
    }
    // Properties on a status object are not written, and validate() says why.
    let d = ObjectDatagram {
        status: Some(ObjectStatus::EndOfTrack),
        properties: Bytes::from_static(b"\x02\x01"),
        end_of_group: false,
        ..base.clone()
    };
    assert!(d.validate().is_err());
    let mut b = Vec::new();
    d.encode(&mut b);
    assert_eq!(b, [0x28, 1, 2, 3, 4]);
    assert!(ObjectDatagram {
        status: Some(ObjectStatus::Normal),
        payload: Bytes::from_static(b"x"),
        ..base.clone()
    }
    .validate()
    .is_err());
    // Object 0 uses ZERO_OBJECT_ID.
    let d = ObjectDatagram {
        object_id: 0,
        priority: Some(9),
        end_of_group: false,
        payload: Bytes::from_static(b"hi"),
        ..base
    };
    let mut b = Vec::new();
    d.encode_header(&mut b);
    assert_eq!(b, [0x04, 1, 2, 9]);
}

// ---------------------------------------------------------------------------
// FETCH streams.
// ---------------------------------------------------------------------------

fn fobj(group: u64, subgroup: Option<u64>, object_id: u64, priority: u8) -> FetchEntry {
    FetchEntry::Object(FetchObject {
        group,
        subgroup,
        object_id,
        priority,
        properties: Bytes::new(),
        payload: Bytes::from_static(b"p"),
    })
}

fn encode_fetch(descending: bool, entries: &[FetchEntry]) -> Vec<u8> {
    let mut st = FetchState::new(descending);
    let mut b = Vec::new();
    for e in entries {
        st.encode(&mut b, e);
    }
    b
}

fn decode_fetch(descending: bool, b: &[u8]) -> Result<Vec<FetchEntry>, DecodeError> {
    let src = Bytes::copy_from_slice(b);
    let mut s = &src[..];
    let mut st = FetchState::new(descending);
    let mut out = Vec::new();
    while !s.is_empty() {
        out.push(st.decode(&mut s, &src, MAX_OBJECT_PAYLOAD)?);
    }
    Ok(out)
}

fn fetch_roundtrip(descending: bool, entries: &[FetchEntry]) -> Vec<u8> {
    let b = encode_fetch(descending, entries);
    assert_eq!(decode_fetch(descending, &b).unwrap(), entries);
    b
}

#[test]
fn fetch_header() {
    let mut b = Vec::new();
    encode_fetch_header(&mut b, 300);
    assert_eq!(b, [0x05, 0x81, 0x2c]);
    assert_eq!(StreamType::peek(&b), Ok((StreamType::Fetch, 1)));
}

#[test]
fn fetch_flags_ascending_byte_by_byte() {
    let entries = [
        // First: group and object present (0x08|0x04), priority (0x10), subgroup 0.
        fobj(4, Some(0), 0, 7),
        // Same group, next object, same subgroup 0 and priority: flags 0x00.
        fobj(4, Some(0), 1, 7),
        // Next object, subgroup = prior + 1 (0x02).
        fobj(4, Some(1), 2, 7),
        // Same subgroup as prior (0x01), Object ID Delta 3 (0x04), new priority (0x10).
        fobj(4, Some(1), 5, 9),
        // New group: Group ID Delta 1 means group 6; Object ID absolute (0x08|0x04),
        // explicit subgroup 9 (0x03): flags 0x0f.
        fobj(6, Some(9), 0, 9),
        // Datagram object: 0x40, no Subgroup ID.
        fobj(6, None, 1, 9),
        // End of Non-Existent Range at {8, 4}: delta 1, object 4.
        FetchEntry::EndOfNonExistentRange(Location::new(8, 4)),
        // Object after the range: same group as its Location, next object; prior
        // priority and subgroup come from the last actual object.
        fobj(8, Some(0), 5, 9),
        FetchEntry::EndOfUnknownRange(Location::new(9, 0)),
    ];
    let b = fetch_roundtrip(false, &entries);
    let expected = hex("1c 04 00 07 01 70
         00 01 70
         02 01 70
         15 03 09 01 70
         0f 01 09 00 01 70
         40 01 70
         808c 01 04
         00 01 70
         810c 00 00");
    assert_eq!(b, expected);
}

#[test]
fn fetch_descending_order() {
    let entries = [
        fobj(10, Some(0), 3, 1),
        fobj(10, Some(0), 4, 1),
        fobj(7, Some(0), 0, 1),
        FetchEntry::EndOfNonExistentRange(Location::new(5, 9)),
        fobj(2, Some(2), 0, 1),
        fobj(0, Some(2), 0, 1),
    ];
    let b = fetch_roundtrip(true, &entries);
    // Group 7 after 10: delta 2 (10 - (2 + 1)).
    assert_eq!(&b[9..12], &[0x0c, 0x02, 0x00]);
    // The same bytes read in ascending order mean other groups.
    let asc = decode_fetch(false, &b).unwrap();
    assert_ne!(asc, entries);
    // Descending below group 0 is a PROTOCOL_VIOLATION.
    let src = hex("1c 00 00 01 00   0c 00 00 00");
    assert!(decode_fetch(true, &src).is_err());
    assert!(decode_fetch(false, &src).is_ok());
}

#[test]
fn fetch_subgroup_modes() {
    // Every two-bit mode, read from hand-made bytes.
    let b = hex("1f 02 05 00 01 00
         03 06 00
         01 00
         02 00
         00 00
         43 00");
    let got = decode_fetch(false, &b).unwrap();
    let subs: Vec<Option<u64>> = got
        .iter()
        .map(|e| match e {
            FetchEntry::Object(o) => o.subgroup,
            _ => unreachable!(),
        })
        .collect();
    // 0x43: datagram, the low bits are ignored and no Subgroup ID is read.
    assert_eq!(subs, [Some(5), Some(6), Some(6), Some(7), Some(0), None]);
    let ids: Vec<u64> = got
        .iter()
        .map(|e| match e {
            FetchEntry::Object(o) => o.object_id,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5]);
}

#[test]
fn fetch_first_object_must_carry_group_and_object() {
    for bad in [
        "14 00 01 01",       // no group
        "18 00 01 01",       // no object
        "0c 00 00 01 01",    // no priority: refers to the prior object
        "1d 00 00 07 01 01", // subgroup = prior
        "1e 00 00 07 01 01", // subgroup = prior + 1
    ] {
        assert!(
            matches!(decode_fetch(false, &hex(bad)), Err(DecodeError::Invalid(_))),
            "{bad}"
        );
    }
    assert!(decode_fetch(false, &hex("1c 00 00 07 01 01")).is_ok());
    // After an End of Range first, the prior group and object exist but the prior
    // subgroup and priority do not.
    assert!(decode_fetch(false, &hex("808c 03 04   00 01 01")).is_err());
    assert!(decode_fetch(false, &hex("808c 03 04   11 07 01 01")).is_err());
    let ok = decode_fetch(false, &hex("808c 03 04   10 07 01 70")).unwrap();
    assert_eq!(ok[1], fobj(3, Some(0), 5, 7));
}

#[test]
fn fetch_invalid_serialization_flags() {
    for f in [0x80u64, 0x8b, 0x8d, 0x10b, 0x10d, 0x20c, 0x3fff, u64::MAX] {
        let mut b = Vec::new();
        put_vi64(&mut b, f);
        b.extend_from_slice(&[0, 0, 0, 0]);
        assert!(
            matches!(decode_fetch(false, &b), Err(DecodeError::Invalid(_))),
            "{f:#x}"
        );
    }
}

#[test]
fn fetch_overflow_is_rejected() {
    // Group ID Delta overflowing past 2^64-1.
    let b = hex("1c ffffffffffffffffff 00 01 00   0c 00 00 00");
    assert!(decode_fetch(false, &b).is_err());
    // Object ID overflow: prior u64::MAX, no Object ID Delta.
    let b = hex("1c 00 ffffffffffffffffff 01 00   00 00");
    assert!(decode_fetch(false, &b).is_err());
    // Subgroup prior + 1 overflow.
    let b = hex("1f 00 ffffffffffffffffff 00 01 00   02 00");
    assert!(decode_fetch(false, &b).is_err());
}

#[test]
fn fetch_state_is_untouched_by_failed_decode() {
    let entries = [
        fobj(1, Some(3), 0, 5),
        fobj(1, Some(3), 1, 5),
        fobj(2, Some(4), 0, 6),
    ];
    let b = encode_fetch(false, &entries);
    let src = Bytes::from(b);
    // Feed the stream one byte longer each time, as a reader does.
    let mut st = FetchState::new(false);
    let mut got = Vec::new();
    let mut pos = 0;
    for end in 1..=src.len() {
        let part = src.slice(..end);
        let mut s = &part[pos..];
        match st.decode(&mut s, &part, MAX_OBJECT_PAYLOAD) {
            Ok(e) => {
                got.push(e);
                pos = end - s.len();
            }
            Err(DecodeError::Short) => assert_eq!(s.len(), end - pos),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, entries);
}

#[test]
fn fetch_properties_and_payload() {
    let e = FetchEntry::Object(FetchObject {
        group: 1,
        subgroup: Some(0),
        object_id: 2,
        priority: 3,
        properties: Bytes::from_static(b"\x0e\x05"),
        payload: Bytes::from(vec![7u8; 300]),
    });
    let b = fetch_roundtrip(false, std::slice::from_ref(&e));
    assert_eq!(&b[..7], &hex("3c 01 02 03 02 0e 05")[..]);
    assert_eq!(&b[7..9], &[0x81, 0x2c]);
}

#[test]
fn fetch_try_encode_refuses_unencodable_entries() {
    let mut st = FetchState::new(false);
    let mut b = Vec::new();
    st.try_encode(&mut b, &fobj(5, Some(0), 3, 1)).unwrap();
    let len = b.len();
    // Against the group order.
    assert!(st.try_encode(&mut b, &fobj(4, Some(0), 0, 1)).is_err());
    // Object IDs going backwards within a group.
    assert!(st.try_encode(&mut b, &fobj(5, Some(0), 2, 1)).is_err());
    // End of Range in the same group as the prior entry: its Group ID Delta
    // always moves to another group.
    assert!(st
        .try_encode(&mut b, &FetchEntry::EndOfUnknownRange(Location::new(5, 9)))
        .is_err());
    assert_eq!(b.len(), len, "refused entries wrote nothing");
    // The state still works.
    st.try_encode(&mut b, &fobj(5, Some(0), 4, 1)).unwrap();
    let mut d = FetchState::new(true);
    let mut b = Vec::new();
    d.try_encode(&mut b, &fobj(5, Some(0), 3, 1)).unwrap();
    assert!(d.try_encode(&mut b, &fobj(6, Some(0), 0, 1)).is_err());
    assert!(d.try_encode(&mut b, &fobj(5, Some(0), u64::MAX, 1)).is_ok());
}

#[test]
fn fetch_header_only_encoding() {
    let entries = [fobj(1, Some(0), 0, 1), fobj(1, Some(0), 1, 1)];
    let mut st = FetchState::new(false);
    let mut b = Vec::new();
    for e in &entries {
        st.try_encode_header(&mut b, e).unwrap();
        if let FetchEntry::Object(o) = e {
            b.extend_from_slice(&o.payload);
        }
    }
    assert_eq!(b, encode_fetch(false, &entries));
}

#[test]
#[should_panic(expected = "unencodable fetch entry")]
fn fetch_encode_panics_on_unencodable_entries() {
    encode_fetch(false, &[fobj(5, Some(0), 3, 1), fobj(4, Some(0), 3, 1)]);
}

#[test]
fn fetch_encoder_does_not_refer_across_datagram_objects() {
    // After a datagram object the "prior Subgroup ID" is ambiguous, so the encoder
    // spells the subgroup out even though it equals the last one it sent.
    let entries = [
        fobj(1, Some(4), 0, 1),
        fobj(1, None, 1, 1),
        fobj(1, Some(4), 2, 1),
    ];
    let b = fetch_roundtrip(false, &entries);
    assert_eq!(&b[b.len() - 4..], &[0x03, 0x04, 0x01, b'p']);
    // Our decoder accepts a reference to the last known Subgroup ID there.
    let b = hex("1f 01 04 00 01 01 70   40 01 70   01 01 70");
    let got = decode_fetch(false, &b).unwrap();
    assert_eq!(got[2], fobj(1, Some(4), 2, 1));
}

// ---------------------------------------------------------------------------
// Proptest strategies and round trips.
// ---------------------------------------------------------------------------

fn vint() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..300, 1 => any::<u64>()]
}

fn small_bytes(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

fn header_s() -> impl Strategy<Value = SubgroupHeader> {
    (
        vint(),
        vint(),
        prop_oneof![
            Just(SubgroupId::Zero),
            Just(SubgroupId::FirstObject),
            vint().prop_map(SubgroupId::Explicit)
        ],
        proptest::option::of(any::<u8>()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(track_alias, group, subgroup, priority, p, e, f)| SubgroupHeader {
                track_alias,
                group,
                subgroup,
                priority,
                has_properties: p,
                end_of_group: e,
                first_object: f,
            },
        )
}

/// A header and objects with increasing IDs, statuses and properties consistent
/// with the header.
fn subgroup_stream_s() -> impl Strategy<Value = (SubgroupHeader, Vec<SubgroupObject>)> {
    (
        header_s(),
        vint(),
        vec(
            (
                0u64..5,
                small_bytes(6),
                prop_oneof![
                    6 => Just(ObjectStatus::Normal),
                    1 => Just(ObjectStatus::EndOfGroup),
                    1 => Just(ObjectStatus::EndOfTrack)
                ],
                small_bytes(20),
            ),
            0..8,
        ),
    )
        .prop_map(|(h, first, items)| {
            let mut next = Some(first);
            let mut out = Vec::new();
            for (gap, props, status, payload) in items {
                let Some(id) = next.and_then(|n| n.checked_add(gap)) else {
                    break;
                };
                let normal = status == ObjectStatus::Normal;
                out.push(SubgroupObject {
                    object_id: id,
                    properties: if h.has_properties && normal {
                        props
                    } else {
                        Bytes::new()
                    },
                    status,
                    payload: if normal { payload } else { Bytes::new() },
                });
                next = id.checked_add(1);
            }
            (h, out)
        })
}

fn datagram_s() -> impl Strategy<Value = ObjectDatagram> {
    (
        (vint(), vint(), prop_oneof![Just(0u64), vint()]),
        proptest::option::of(any::<u8>()),
        prop_oneof![
            Just(Bytes::new()),
            vec(any::<u8>(), 1..8).prop_map(Bytes::from)
        ],
        any::<bool>(),
        proptest::option::of(prop_oneof![
            Just(ObjectStatus::Normal),
            Just(ObjectStatus::EndOfGroup),
            Just(ObjectStatus::EndOfTrack)
        ]),
        small_bytes(32),
    )
        .prop_map(
            |((track_alias, group, object_id), priority, properties, eog, status, payload)| {
                // Only what the wire can say: a status excludes END_OF_GROUP and a
                // payload, and only Normal carries properties.
                let (end_of_group, properties, payload) = match status {
                    None => (eog, properties, payload),
                    Some(ObjectStatus::Normal) => (false, properties, Bytes::new()),
                    Some(_) => (false, Bytes::new(), Bytes::new()),
                };
                ObjectDatagram {
                    track_alias,
                    group,
                    object_id,
                    priority,
                    properties,
                    end_of_group,
                    status,
                    payload,
                }
            },
        )
}

#[derive(Debug, Clone)]
enum Step {
    /// Same group, object ID + gap.
    Next(u64),
    /// Another group (by `u64` groups in the stream's order), this object ID.
    Group(u64, u64),
    /// An End of Range in another group.
    Range(bool, u64, u64),
}

/// A valid FETCH stream in either order.
fn fetch_stream_s() -> impl Strategy<Value = (bool, Vec<FetchEntry>)> {
    let step = prop_oneof![
        4 => (0u64..4).prop_map(Step::Next),
        2 => (1u64..4, vint()).prop_map(|(g, o)| Step::Group(g, o)),
        1 => (any::<bool>(), 1u64..4, vint()).prop_map(|(k, g, o)| Step::Range(k, g, o)),
    ];
    let meta = (
        prop_oneof![
            Just(None),
            Just(Some(0u64)),
            Just(Some(u64::MAX)),     // "same as the previous object's subgroup"
            Just(Some(u64::MAX - 1)), // "previous + 1"
            vint().prop_map(Some)
        ],
        prop_oneof![3 => Just(None), 1 => any::<u8>().prop_map(Some)],
        prop_oneof![
            Just(Bytes::new()),
            vec(any::<u8>(), 1..6).prop_map(Bytes::from)
        ],
        small_bytes(12),
    );
    (any::<bool>(), vint(), vint(), vec((step, meta), 0..12)).prop_map(
        |(descending, g0, o0, steps)| {
            let mut group = if descending {
                g0.saturating_add(1000)
            } else {
                g0
            };
            let mut object = o0;
            let mut sub: Option<u64> = None;
            let mut prio = 128u8;
            let mut out = Vec::new();
            let mut first = true;
            for (step, (s, p, props, payload)) in steps {
                let mut range = None;
                if !first {
                    match step {
                        Step::Next(gap) => match object.checked_add(gap) {
                            Some(o) => object = o,
                            None => break,
                        },
                        Step::Group(d, o) | Step::Range(_, d, o) => {
                            let g = if descending {
                                group.checked_sub(d)
                            } else {
                                group.checked_add(d)
                            };
                            match g {
                                Some(g) => group = g,
                                None => break,
                            }
                            object = o;
                            if let Step::Range(k, _, _) = step {
                                range = Some(k);
                            }
                        }
                    }
                }
                first = false;
                if let Some(k) = range {
                    let l = Location::new(group, object);
                    out.push(if k {
                        FetchEntry::EndOfNonExistentRange(l)
                    } else {
                        FetchEntry::EndOfUnknownRange(l)
                    });
                    continue;
                }
                let subgroup = match s {
                    Some(u64::MAX) => sub.or(Some(1)),
                    Some(x) if x == u64::MAX - 1 => {
                        Some(sub.and_then(|v| v.checked_add(1)).unwrap_or(2))
                    }
                    other => other,
                };
                if subgroup.is_some() {
                    sub = subgroup;
                }
                if let Some(p) = p {
                    prio = p;
                }
                out.push(FetchEntry::Object(FetchObject {
                    group,
                    subgroup,
                    object_id: object,
                    priority: prio,
                    properties: props,
                    payload,
                }));
            }
            (descending, out)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn prop_subgroup_stream_roundtrip((h, objs) in subgroup_stream_s()) {
        let b = encode_subgroup(&h, &objs);
        let (dh, dobjs) = decode_subgroup(&b).unwrap();
        prop_assert_eq!(dh, h);
        prop_assert_eq!(dobjs, objs);
        crate::fuzz::fuzz_subgroup_stream(&b);
    }

    #[test]
    fn prop_subgroup_prefixes_are_short((h, objs) in subgroup_stream_s(), cut in any::<prop::sample::Index>()) {
        let b = encode_subgroup(&h, &objs);
        let n = cut.index(b.len());
        let src = Bytes::copy_from_slice(&b[..n]);
        let mut s = &src[..];
        match SubgroupHeader::decode(&mut s) {
            Err(e) => prop_assert_eq!(e, DecodeError::Short),
            Ok(dh) => {
                prop_assert_eq!(&dh, &h);
                let mut prev = None;
                loop {
                    if s.is_empty() {
                        break;
                    }
                    match SubgroupObject::decode(&mut s, &src, prev, h.has_properties, MAX_OBJECT_PAYLOAD) {
                        Ok(o) => prev = Some(o.object_id),
                        Err(e) => {
                            prop_assert_eq!(e, DecodeError::Short);
                            break;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn prop_datagram_roundtrip(d in datagram_s()) {
        prop_assert!(d.validate().is_ok());
        prop_assert!(ObjectDatagram::valid_type(d.type_code()));
        let mut b = Vec::new();
        d.encode(&mut b);
        prop_assert_eq!(ObjectDatagram::decode(&Bytes::from(b)).unwrap(), d);
    }

    #[test]
    fn prop_fetch_roundtrip((descending, entries) in fetch_stream_s()) {
        let mut st = FetchState::new(descending);
        let mut b = Vec::new();
        for e in &entries {
            st.try_encode(&mut b, e).unwrap();
        }
        prop_assert_eq!(decode_fetch(descending, &b).unwrap(), entries);
        let mut f = vec![descending as u8];
        f.extend_from_slice(&b);
        crate::fuzz::fuzz_fetch_stream(&f);
    }

    /// Valid encodings with a few bytes changed go through the fuzz bodies.
    #[test]
    fn prop_mutated_data(
        (h, objs) in subgroup_stream_s(),
        d in datagram_s(),
        (descending, entries) in fetch_stream_s(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mutate = |mut b: Vec<u8>| {
            if !b.is_empty() {
                for (i, v) in &edits {
                    let i = i.index(b.len());
                    b[i] = *v;
                }
            }
            b
        };
        crate::fuzz::fuzz_subgroup_stream(&mutate(encode_subgroup(&h, &objs)));
        let mut db = Vec::new();
        d.encode(&mut db);
        crate::fuzz::fuzz_datagram(&mutate(db));
        let mut fb = vec![descending as u8];
        fb.extend(encode_fetch(descending, &entries));
        let fb = mutate(fb);
        crate::fuzz::fuzz_fetch_stream(&fb);
    }

    /// Every data-plane decoder on arbitrary bytes: no panic, atomic failure.
    #[test]
    fn prop_data_decoders_never_panic(data in vec(any::<u8>(), 0..200), props in any::<bool>(), prev in proptest::option::of(vint())) {
        let src = Bytes::from(data);
        let _ = StreamType::peek(&src);
        let mut s = &src[..];
        if SubgroupHeader::decode(&mut s).is_err() {
            prop_assert_eq!(s.len(), src.len());
        }
        let mut s = &src[..];
        if SubgroupObject::decode(&mut s, &src, prev, props, 64).is_err() {
            prop_assert_eq!(s.len(), src.len());
        }
        let _ = ObjectDatagram::decode(&src);
        for desc in [false, true] {
            let mut st = FetchState::new(desc);
            let mut s = &src[..];
            while !s.is_empty() {
                let n = s.len();
                if st.decode(&mut s, &src, 64).is_err() {
                    prop_assert_eq!(s.len(), n);
                    break;
                }
            }
        }
    }
}

#[test]
fn fetch_needed_is_the_whole_entry_once_its_header_is_in() {
    let o = FetchObject {
        group: 3,
        subgroup: Some(0),
        object_id: 0,
        priority: 7,
        properties: Bytes::new(),
        payload: Bytes::from(vec![1u8; 5000]),
    };
    let mut st = FetchState::new(false);
    let mut b = bytes::BytesMut::new();
    st.encode(&mut b, &FetchEntry::Object(o));
    let wire = b.freeze();
    let dec = FetchState::new(false);
    for cut in [1, 3] {
        // Header cut: unknown.
        assert_eq!(dec.needed(&wire[..cut], &wire, 1 << 20), None, "{cut}");
    }
    for cut in [10, 100, wire.len() - 1] {
        assert_eq!(
            dec.needed(&wire[..cut], &wire, 1 << 20),
            Some(wire.len()),
            "{cut}"
        );
    }
    // Asking changes nothing: the entry still decodes whole.
    let mut dec = dec;
    let mut s = &wire[..];
    assert!(dec.decode(&mut s, &wire, 1 << 20).is_ok());
    assert!(s.is_empty());
}
