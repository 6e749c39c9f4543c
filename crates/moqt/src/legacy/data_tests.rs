use bytes::{Bytes, BytesMut};

use super::*;
use crate::coding::{put_kvps, KeyValue};
use crate::data::{
    FetchEntry, FetchObject, FetchState as D18Fetch, ObjectDatagram, ObjectStatus, SubgroupHeader,
    SubgroupId, SubgroupObject,
};
use crate::Location;

const BOTH: [Draft; 2] = [Draft::D14, Draft::D16];

/// QUIC varint.
fn q(v: u64) -> Vec<u8> {
    let mut b = Vec::new();
    put_varint(&mut b, v);
    b
}

/// Draft-18 vi64.
fn m(v: u64) -> Vec<u8> {
    let mut b = Vec::new();
    put_vi64(&mut b, v);
    b
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn transcoder(draft: Draft, dir: Direction, descending: bool) -> StreamTranscoder {
    let mut t = StreamTranscoder::new(draft, dir);
    t.set_descending(descending);
    t
}

/// Feeds `input` in pieces of `chunk` bytes, then finishes.
fn feed(
    draft: Draft,
    dir: Direction,
    descending: bool,
    input: &[u8],
    chunk: usize,
) -> Result<Vec<u8>, TranscodeError> {
    let mut t = transcoder(draft, dir, descending);
    let mut out = Vec::new();
    for piece in input.chunks(chunk.max(1)) {
        t.push(Bytes::copy_from_slice(piece), &mut out)?;
        assert!(t.pending.len() <= MAX_HEADER);
    }
    t.finish()?;
    Ok(out.concat())
}

/// Translates a whole stream, checking that every way of cutting it up (whole,
/// byte by byte, odd chunks) gives the same bytes or the same error.
fn translate_with(
    draft: Draft,
    dir: Direction,
    descending: bool,
    input: &[u8],
) -> Result<Vec<u8>, TranscodeError> {
    let whole = feed(draft, dir, descending, input, input.len());
    for chunk in [1, 2, 3, 7, 64, 65, 1000] {
        assert_eq!(
            feed(draft, dir, descending, input, chunk),
            whole,
            "{draft:?} {dir:?} chunk {chunk}"
        );
    }
    whole
}

fn translate(draft: Draft, dir: Direction, input: &[u8]) -> Result<Vec<u8>, TranscodeError> {
    translate_with(draft, dir, false, input)
}

fn to_legacy(draft: Draft, input: &[u8]) -> Vec<u8> {
    translate(draft, Direction::ToLegacy, input).unwrap()
}

fn to_modern(draft: Draft, input: &[u8]) -> Vec<u8> {
    translate(draft, Direction::ToModern, input).unwrap()
}

// ---- draft-18 builders and readers, from the crate's own codec ----

fn props(kvs: &[KeyValue]) -> Bytes {
    let mut b = BytesMut::new();
    put_kvps(&mut b, kvs);
    b.freeze()
}

fn object(id: u64, props: Bytes, status: ObjectStatus, payload: &'static [u8]) -> SubgroupObject {
    SubgroupObject {
        object_id: id,
        properties: props,
        status,
        payload: Bytes::from_static(payload),
    }
}

fn subgroup_stream(h: &SubgroupHeader, objects: &[SubgroupObject]) -> Vec<u8> {
    let mut b = BytesMut::new();
    h.encode(&mut b);
    let mut prev = None;
    for o in objects {
        o.encode(&mut b, prev, h.has_properties).unwrap();
        prev = Some(o.object_id);
    }
    b.to_vec()
}

fn read_subgroup(bytes: &[u8]) -> (SubgroupHeader, Vec<SubgroupObject>) {
    let src = Bytes::copy_from_slice(bytes);
    let mut s = &src[..];
    let h = SubgroupHeader::decode(&mut s).unwrap();
    let mut objects = Vec::new();
    let mut prev = None;
    while !s.is_empty() {
        let o = SubgroupObject::decode(&mut s, &src, prev, h.has_properties, usize::MAX).unwrap();
        prev = Some(o.object_id);
        objects.push(o);
    }
    (h, objects)
}

fn fetch_stream(request_id: u64, descending: bool, entries: &[FetchEntry]) -> Vec<u8> {
    let mut b = BytesMut::new();
    crate::data::encode_fetch_header(&mut b, request_id);
    let mut st = D18Fetch::new(descending);
    for e in entries {
        st.encode(&mut b, e);
    }
    b.to_vec()
}

fn read_fetch(bytes: &[u8], descending: bool) -> (u64, Vec<FetchEntry>) {
    let src = Bytes::copy_from_slice(bytes);
    let mut s = &src[..];
    assert_eq!(get_vi64(&mut s).unwrap(), FETCH_HEADER);
    let id = get_vi64(&mut s).unwrap();
    let mut st = D18Fetch::new(descending);
    let mut entries = Vec::new();
    while !s.is_empty() {
        entries.push(st.decode(&mut s, &src, usize::MAX).unwrap());
    }
    (id, entries)
}

fn fobj(
    group: u64,
    subgroup: Option<u64>,
    id: u64,
    priority: u8,
    props: Bytes,
    payload: &'static [u8],
) -> FetchEntry {
    FetchEntry::Object(FetchObject {
        group,
        subgroup,
        object_id: id,
        priority,
        properties: props,
        payload: Bytes::from_static(payload),
    })
}

fn some_props() -> Bytes {
    props(&[
        KeyValue::int(0x02, 300),
        KeyValue::bytes(0x0b, &b"immutable"[..]),
        KeyValue::int(0x3c, (1 << 62) - 1),
        KeyValue::bytes(0x4d, vec![7u8; 200]),
    ])
}

// ---- vectors from the draft texts and moq-net ----

/// Draft 14 §10.5's first example (and draft 18 §11.5's): all values are
/// below 64, so the two encodings agree byte for byte.
#[test]
fn spec_example_subgroup_is_identical_in_both_encodings() {
    let stream = cat(&[
        &[0x14, 0x02, 0x00, 0x00, 0x00],
        &[0x00, 0x04],
        b"abcd",
        &[0x00, 0x04],
        b"efgh",
    ]);
    for d in BOTH {
        assert_eq!(to_modern(d, &stream), stream);
        assert_eq!(to_legacy(d, &stream), stream);
    }
}

/// Draft 14 §10.5's second example: extension type 4 = 2186796243 (an 8-byte
/// varint) and type 77 with 21 bytes. Draft 18 writes type 77 as delta 73 and
/// the value as a 5-byte vi64.
#[test]
fn spec_example_extensions_to_modern() {
    let value = [b'x'; 21];
    let ext = cat(&[&q(4), &q(2_186_796_243), &q(77), &q(21), &value]);
    assert_eq!(ext.len(), 33, "the length the draft-14 example gives");
    let legacy = cat(&[
        &[0x15, 0x02, 0x00, 0x00, 0x00],
        &[0x00],
        &q(33),
        &ext,
        &[0x04],
        b"abcd",
        &[0x00, 0x00, 0x04],
        b"efgh",
    ]);
    let modern_ext = cat(&[&m(4), &m(2_186_796_243), &m(73), &m(21), &value]);
    let expected = cat(&[
        &[0x15, 0x02, 0x00, 0x00, 0x00],
        &[0x00],
        &m(modern_ext.len() as u64),
        &modern_ext,
        &[0x04],
        b"abcd",
        &[0x00, 0x00, 0x04],
        b"efgh",
    ]);
    let out = to_modern(Draft::D14, &legacy);
    assert_eq!(out, expected);
    let (_, objects) = read_subgroup(&out);
    let kvs =
        crate::coding::get_kvps(&mut &objects[0].properties[..], &objects[0].properties).unwrap();
    assert_eq!(kvs[0], KeyValue::int(4, 2_186_796_243));
    assert_eq!(kvs[1], KeyValue::bytes(77, value.to_vec()));
    // And back: draft 14 gets absolute types again.
    assert_eq!(to_legacy(Draft::D14, &out), legacy);
}

/// Draft 14 lets absolute extension types come in any order; delta encoding
/// needs them ascending.
#[test]
fn d14_extensions_are_sorted_stably() {
    let ext = cat(&[&q(77), &q(1), b"a", &q(4), &q(9), &q(77), &q(1), b"b"]);
    let legacy = cat(&[
        &[0x11, 0x01, 0x00, 0x00, 0x00],
        &q(ext.len() as u64),
        &ext,
        &[0x01, b'z'],
    ]);
    let (_, objects) = read_subgroup(&to_modern(Draft::D14, &legacy));
    let p = &objects[0].properties;
    let kvs = crate::coding::get_kvps(&mut &p[..], p).unwrap();
    assert_eq!(
        kvs,
        vec![
            KeyValue::int(4, 9),
            KeyValue::bytes(77, &b"a"[..]),
            KeyValue::bytes(77, &b"b"[..]),
        ]
    );
}

/// moq-net's `datagram::tests::roundtrip_every_draft`: the same 12 bytes on
/// every draft (Type 0x07, alias 3, group 42, priority 7, properties
/// {0x10: 5}, "hello").
#[test]
fn moq_net_datagram_vector() {
    let wire = cat(&[&[0x07, 0x03, 0x2a, 0x07, 0x02, 0x10, 0x05], b"hello"]);
    for d in BOTH {
        for dir in [Direction::ToModern, Direction::ToLegacy] {
            assert_eq!(transcode_datagram(d, dir, &wire).unwrap()[..], wire[..]);
        }
    }
}

/// moq-net's `object_tests::the_first_object_spells_everything_out`, on a
/// draft-16 fetch stream: property value 0x40 takes two bytes as a QUIC
/// varint and one as a vi64.
#[test]
fn moq_net_fetch_vector_d16() {
    let d16 = cat(&[
        &[0x05, 0x01],
        &[0x3c, 0x04, 0x00, 0x00],
        &[0x03, 0x02, 0x40, 0x40],
        &[0x02],
        b"hi",
    ]);
    let d18 = cat(&[
        &[0x05, 0x01],
        &[0x3c, 0x04, 0x00, 0x00],
        &[0x02, 0x02, 0x40],
        &[0x02],
        b"hi",
    ]);
    assert_eq!(to_modern(Draft::D16, &d16), d18);
    assert_eq!(to_legacy(Draft::D16, &d18), d16);
    let (_, entries) = read_fetch(&d18, false);
    assert_eq!(
        entries,
        vec![fobj(
            4,
            Some(0),
            0,
            0,
            Bytes::from_static(&[0x02, 0x40]),
            b"hi"
        )]
    );
}

/// moq-net's draft-14 fetch writer (`write_fetch_group`): group, subgroup 0,
/// object, priority 0, properties, size, and status 0 after an empty object.
#[test]
fn moq_net_fetch_vector_d14() {
    let d14 = cat(&[
        &[0x05, 0x02],
        &[0x09, 0x00, 0x00, 0x00, 0x00, 0x03],
        b"abc",
        &[0x09, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00],
        &[0x09, 0x00, 0x02, 0x00, 0x00, 0x01],
        b"z",
    ]);
    let out = to_modern(Draft::D14, &d14);
    let (id, entries) = read_fetch(&out, false);
    assert_eq!(id, 2);
    assert_eq!(
        entries,
        vec![
            fobj(9, Some(0), 0, 0, Bytes::new(), b"abc"),
            fobj(9, Some(0), 1, 0, Bytes::new(), b""),
            fobj(9, Some(0), 2, 0, Bytes::new(), b"z"),
        ]
    );
    // Later objects inherit everything: flags 0x00 and the size.
    assert_eq!(
        &out[..9],
        &[0x05, 0x02, 0x1c, 0x09, 0x00, 0x00, 0x03, b'a', b'b']
    );
    assert_eq!(to_legacy(Draft::D14, &out), d14);
}

// ---- subgroup streams ----

fn all_d18_subgroup_types() -> impl Iterator<Item = u8> {
    (0x10..0x80u8).filter(|t| SubgroupHeader::valid_type(*t))
}

fn header_from_type(t: u8) -> SubgroupHeader {
    SubgroupHeader {
        track_alias: 70_000,
        group: 1 << 40,
        subgroup: match (t & 0x06) >> 1 {
            0 => SubgroupId::Zero,
            1 => SubgroupId::FirstObject,
            _ => SubgroupId::Explicit(300),
        },
        priority: (t & 0x20 == 0).then_some(9),
        has_properties: t & 0x01 != 0,
        end_of_group: t & 0x08 != 0,
        first_object: t & 0x40 != 0,
    }
}

fn sample_objects(with_props: bool) -> Vec<SubgroupObject> {
    let p = |b: Bytes| if with_props { b } else { Bytes::new() };
    vec![
        object(5, p(some_props()), ObjectStatus::Normal, b"first"),
        object(6, Bytes::new(), ObjectStatus::Normal, b""),
        object(200, p(some_props()), ObjectStatus::Normal, &[0xaa; 300]),
        object(70_000, Bytes::new(), ObjectStatus::EndOfGroup, b""),
    ]
}

/// What survives a trip through `draft`: the FIRST_OBJECT bit never does, and
/// draft 14 makes the inherited priority explicit.
fn normalised(draft: Draft, mut h: SubgroupHeader) -> SubgroupHeader {
    h.first_object = false;
    if draft == Draft::D14 && h.priority.is_none() {
        h.priority = Some(DEFAULT_PRIORITY);
    }
    h
}

#[test]
fn every_subgroup_type_round_trips() {
    for d in BOTH {
        for t in all_d18_subgroup_types() {
            let h = header_from_type(t);
            let objects = sample_objects(h.has_properties);
            let original = subgroup_stream(&h, &objects);
            let legacy = to_legacy(d, &original);
            let back = to_modern(d, &legacy);
            let (h2, o2) = read_subgroup(&back);
            assert_eq!(h2, normalised(d, h.clone()), "{d:?} type {t:#x}");
            assert_eq!(o2, objects, "{d:?} type {t:#x}");
            let legacy_type = legacy[0];
            match d {
                Draft::D14 => assert_eq!(legacy_type, t & 0x1f, "{t:#x}"),
                Draft::D16 => assert_eq!(legacy_type, t & 0x3f, "{t:#x}"),
            }
            if d == Draft::D16 && !h.first_object {
                assert_eq!(back, original, "lossless for type {t:#x}");
            }
        }
    }
}

#[test]
fn legacy_header_types() {
    // Draft 14 knows only the 0x10 range; draft 16 adds 0x30.
    for t in 0u64..0x100 {
        let stream = cat(&[
            &q(t),
            &[0x01, 0x02],
            &[0x03][..(t & 0x06 == 0x04) as usize],
            &[0x80][..(t & 0x20 == 0) as usize],
        ]);
        let valid14 = (0x10..=0x15).contains(&t) || (0x18..=0x1d).contains(&t);
        let valid16 = valid14 || (0x30..=0x35).contains(&t) || (0x38..=0x3d).contains(&t);
        let r14 = translate(Draft::D14, Direction::ToModern, &stream);
        let r16 = translate(Draft::D16, Direction::ToModern, &stream);
        if t != FETCH_HEADER {
            assert_eq!(r14.is_ok(), valid14, "d14 {t:#x}: {r14:?}");
            assert_eq!(r16.is_ok(), valid16, "d16 {t:#x}: {r16:?}");
        }
    }
}

#[test]
fn default_priority_is_made_explicit_for_draft_14() {
    let h = SubgroupHeader {
        track_alias: 1,
        group: 2,
        subgroup: SubgroupId::Zero,
        priority: None,
        has_properties: false,
        end_of_group: false,
        first_object: true,
    };
    let s = subgroup_stream(&h, &[object(0, Bytes::new(), ObjectStatus::Normal, b"x")]);
    assert_eq!(s[0], 0x70);
    assert_eq!(
        to_legacy(Draft::D14, &s),
        [0x10, 0x01, 0x02, 0x80, 0x00, 0x01, b'x']
    );
    assert_eq!(
        to_legacy(Draft::D16, &s),
        [0x30, 0x01, 0x02, 0x00, 0x01, b'x']
    );
    let mut t = StreamTranscoder::new(Draft::D14, Direction::ToLegacy);
    t.set_default_priority(3);
    let mut out = Vec::new();
    t.push(Bytes::from(s), &mut out).unwrap();
    assert_eq!(out.concat(), [0x10, 0x01, 0x02, 0x03, 0x00, 0x01, b'x']);
}

#[test]
fn payload_is_not_copied() {
    let h = header_from_type(0x14);
    let s = Bytes::from(subgroup_stream(
        &h,
        &[object(0, Bytes::new(), ObjectStatus::Normal, &[9; 1000])],
    ));
    let mut t = StreamTranscoder::new(Draft::D16, Direction::ToLegacy);
    let mut out = Vec::new();
    t.push(s.clone(), &mut out).unwrap();
    let payload = out
        .iter()
        .find(|b| b.len() == 1000)
        .expect("payload in one piece");
    let base = s.as_ptr() as usize;
    assert!((base..base + s.len()).contains(&(payload.as_ptr() as usize)));
}

#[test]
fn d14_does_not_exist_is_dropped() {
    // Objects 0, 1 (does not exist), 2, 3 (does not exist), 7.
    let legacy = cat(&[
        &[0x10, 0x01, 0x02, 0x05],
        &[0x00, 0x01, b'a'],
        &[0x00, 0x00, 0x01],
        &[0x00, 0x01, b'b'],
        &[0x00, 0x00, 0x01],
        &[0x03, 0x01, b'c'],
    ]);
    let out = to_modern(Draft::D14, &legacy);
    let (_, objects) = read_subgroup(&out);
    let ids: Vec<u64> = objects.iter().map(|o| o.object_id).collect();
    assert_eq!(ids, [0, 2, 7]);

    // As the first object it is simply left out in mode 0 (subgroup 0)...
    let first = cat(&[
        &[0x10, 0x01, 0x02, 0x05],
        &[0x04, 0x00, 0x01],
        &[0x00, 0x01, b'a'],
    ]);
    let (_, objects) = read_subgroup(&to_modern(Draft::D14, &first));
    assert_eq!(objects[0].object_id, 5);
    // ...but under mode 0b01 it names the subgroup.
    let named = cat(&[
        &[0x12, 0x01, 0x02, 0x05],
        &[0x04, 0x00, 0x01],
        &[0x00, 0x01, b'a'],
    ]);
    assert!(matches!(
        translate(Draft::D14, Direction::ToModern, &named),
        Err(TranscodeError::Unsupported(_))
    ));
    // Draft 16 never had status 1.
    let d16 = cat(&[&[0x10, 0x01, 0x02, 0x05], &[0x00, 0x00, 0x01]]);
    assert!(matches!(
        translate(Draft::D16, Direction::ToModern, &d16),
        Err(TranscodeError::Malformed(_))
    ));
}

#[test]
fn status_objects_lose_legacy_extensions() {
    // Draft 14 allows extensions on End of Group; draft 18 does not.
    let ext = cat(&[&q(2), &q(5)]);
    let legacy = cat(&[
        &[0x11, 0x01, 0x02, 0x05],
        &[0x00],
        &q(ext.len() as u64),
        &ext,
        &[0x00, 0x03],
    ]);
    for d in BOTH {
        let out = to_modern(d, &legacy);
        assert_eq!(out, [0x11, 0x01, 0x02, 0x05, 0x00, 0x00, 0x00, 0x03]);
    }
    // A draft-18 peer sending them is malformed.
    let d18 = cat(&[
        &[0x11, 0x01, 0x02, 0x05],
        &[0x00, 0x02, 0x02, 0x05, 0x00, 0x03],
    ]);
    assert!(matches!(
        translate(Draft::D14, Direction::ToLegacy, &d18),
        Err(TranscodeError::Malformed(_))
    ));
}

#[test]
fn unknown_status_is_malformed() {
    for d in BOTH {
        let s = [0x10, 0x01, 0x02, 0x05, 0x00, 0x00, 0x02];
        for dir in [Direction::ToModern, Direction::ToLegacy] {
            assert!(matches!(
                translate(d, dir, &s),
                Err(TranscodeError::Malformed(_))
            ));
        }
    }
}

#[test]
fn values_beyond_varints_are_too_large() {
    let big = 1u64 << 62;
    let h = |group| SubgroupHeader {
        track_alias: 1,
        group,
        subgroup: SubgroupId::Zero,
        priority: Some(1),
        has_properties: true,
        end_of_group: false,
        first_object: false,
    };
    let one = |id, p| [object(id, p, ObjectStatus::Normal, b"x")];
    let cases = [
        subgroup_stream(&h(big), &one(0, Bytes::new())),
        subgroup_stream(&h(0), &one(big, Bytes::new())),
        subgroup_stream(&h(0), &one(0, props(&[KeyValue::int(2, big)]))),
        subgroup_stream(&h(0), &one(0, props(&[KeyValue::int(big, 1)]))),
        fetch_stream(big, false, &[]),
        fetch_stream(1, false, &[fobj(big, Some(0), 0, 0, Bytes::new(), b"")]),
        // The second ID is omitted on the wire, but the peer still computes it.
        fetch_stream(
            1,
            false,
            &[
                fobj(0, Some(0), big - 1, 0, Bytes::new(), b""),
                fobj(0, Some(0), big, 0, Bytes::new(), b""),
            ],
        ),
        fetch_stream(
            1,
            false,
            &[fobj(0, Some(0), u64::MAX, 0, Bytes::new(), b"")],
        ),
    ];
    for d in BOTH {
        for (i, c) in cases.iter().enumerate() {
            assert_eq!(
                translate(d, Direction::ToLegacy, c),
                Err(TranscodeError::TooLarge),
                "{d:?} case {i}"
            );
        }
        // The largest varint still goes.
        let fits = subgroup_stream(&h(big - 1), &one(big - 1, Bytes::new()));
        assert!(translate(d, Direction::ToLegacy, &fits).is_ok());
    }
    let dg = ObjectDatagram {
        track_alias: big,
        group: 0,
        object_id: 0,
        priority: None,
        properties: Bytes::new(),
        end_of_group: false,
        status: None,
        payload: Bytes::new(),
    };
    let mut b = BytesMut::new();
    dg.encode(&mut b);
    assert_eq!(
        transcode_datagram(Draft::D16, Direction::ToLegacy, &b),
        Err(TranscodeError::TooLarge)
    );
}

#[test]
fn padding_is_unsupported() {
    let stream = m(PADDING_STREAM);
    let dgram = cat(&[&m(PADDING_DATAGRAM), &[0, 0, 0]]);
    for d in BOTH {
        assert_eq!(
            translate(d, Direction::ToLegacy, &cat(&[&stream, &[0, 0]])),
            Err(TranscodeError::Unsupported("padding"))
        );
        assert_eq!(
            transcode_datagram(d, Direction::ToLegacy, &dgram),
            Err(TranscodeError::Unsupported("padding"))
        );
    }
}

#[test]
fn finish_reports_where_the_stream_ended() {
    let s = subgroup_stream(
        &header_from_type(0x15),
        &[object(0, some_props(), ObjectStatus::Normal, b"abcdef")],
    );
    for d in BOTH {
        let header_len = s.len() - 1 - 2 - some_props().len() - 1 - 6;
        for cut in (0..s.len()).filter(|c| *c != header_len) {
            let r = feed(d, Direction::ToLegacy, false, &s[..cut], 1);
            assert!(
                matches!(r, Err(TranscodeError::Malformed(_))),
                "cut {cut}: {r:?}"
            );
        }
        assert!(feed(d, Direction::ToLegacy, false, &s, 1).is_ok());
        // A header alone is a whole stream.
        assert!(feed(d, Direction::ToLegacy, false, &s[..header_len], 1).is_ok());
    }
}

#[test]
fn errors_stick() {
    let mut t = StreamTranscoder::new(Draft::D14, Direction::ToModern);
    let mut out = Vec::new();
    let e = t.push(Bytes::from_static(&[0x3f]), &mut out).unwrap_err();
    assert_eq!(
        t.push(Bytes::from_static(&[0x10]), &mut out),
        Err(e.clone())
    );
    assert_eq!(t.finish(), Err(e));
}

#[test]
fn headers_are_bounded() {
    // A property block longer than any draft allows is refused at once.
    let s = cat(&[
        &[0x11, 0x01, 0x02, 0x05, 0x00],
        &m(MAX_PROPERTIES as u64 + 1),
    ]);
    assert!(matches!(
        translate(Draft::D16, Direction::ToLegacy, &s),
        Err(TranscodeError::Malformed(_))
    ));
    // The largest allowed block is buffered, then passes...
    let value = vec![0u8; MAX_PROPERTIES - 5];
    let block = cat(&[&q(1), &q(value.len() as u64), &value]);
    assert_eq!(block.len(), MAX_PROPERTIES);
    let s = cat(&[
        &[0x11, 0x01, 0x02, 0x05, 0x00],
        &q(block.len() as u64),
        &block,
        &[0x01, b'x'],
    ]);
    let mut t = StreamTranscoder::new(Draft::D16, Direction::ToModern);
    let mut out = Vec::new();
    for piece in s.chunks(1000) {
        t.push(Bytes::copy_from_slice(piece), &mut out).unwrap();
        assert!(t.pending.len() <= MAX_HEADER);
    }
    t.finish().unwrap();
    // ...but a draft-18 block at the limit whose length field needs one more
    // byte as a QUIC varint no longer fits.
    let value = vec![0u8; MAX_PROPERTIES - 4];
    let block = cat(&[&m(1), &m(value.len() as u64), &value]);
    assert_eq!(block.len(), MAX_PROPERTIES);
    let s = cat(&[
        &[0x11, 0x01, 0x02, 0x05, 0x00],
        &m(block.len() as u64),
        &block,
        &[0x01, b'x'],
    ]);
    assert!(matches!(
        translate(Draft::D16, Direction::ToLegacy, &s),
        Err(TranscodeError::Unsupported(_))
    ));
}

// ---- fetch streams ----

fn sample_fetch(descending: bool) -> Vec<FetchEntry> {
    let g = |i: u64| if descending { 1000 - i * 3 } else { 10 + i * 3 };
    vec![
        fobj(g(0), Some(0), 0, 5, Bytes::new(), b"a"),
        fobj(g(0), Some(0), 1, 5, some_props(), b""),
        fobj(g(0), Some(1), 2, 5, Bytes::new(), b"bb"),
        fobj(g(0), Some(1), 9, 6, Bytes::new(), b"c"),
        fobj(g(0), None, 10, 6, Bytes::new(), b"dgram"),
        fobj(g(0), Some(2), 11, 6, Bytes::new(), b"after datagram"),
        fobj(g(1), Some(70_000), 0, 7, some_props(), &[1; 500]),
        fobj(g(1), Some(70_000), 1, 7, Bytes::new(), b"e"),
        fobj(g(1), Some(70_001), 2, 7, Bytes::new(), b"f"),
        fobj(g(2), Some(0), 300, 0, Bytes::new(), b"g"),
    ]
}

fn with_ranges(descending: bool) -> Vec<FetchEntry> {
    let mut e = sample_fetch(descending);
    let g = |i: u64| if descending { 1000 - i * 3 } else { 10 + i * 3 };
    e.insert(
        6,
        FetchEntry::EndOfNonExistentRange(Location::new(
            if descending { g(1) + 1 } else { g(1) - 1 },
            4,
        )),
    );
    e.push(FetchEntry::EndOfUnknownRange(Location::new(g(3), 2)));
    e.push(fobj(g(3), Some(1), 3, 0, Bytes::new(), b"h"));
    e
}

#[test]
fn fetch_round_trips() {
    for d in BOTH {
        for descending in [false, true] {
            let entries = sample_fetch(descending);
            let original = fetch_stream(77, descending, &entries);
            let legacy = translate_with(d, Direction::ToLegacy, descending, &original).unwrap();
            let back = translate_with(d, Direction::ToModern, descending, &legacy).unwrap();
            let (id, e2) = read_fetch(&back, descending);
            assert_eq!(id, 77);
            let expected: Vec<FetchEntry> = match d {
                Draft::D16 => entries.clone(),
                // Draft 14 gives datagram objects their Object ID as Subgroup ID.
                Draft::D14 => entries
                    .iter()
                    .map(|e| match e {
                        FetchEntry::Object(o) if o.subgroup.is_none() => {
                            FetchEntry::Object(FetchObject {
                                subgroup: Some(o.object_id),
                                ..o.clone()
                            })
                        }
                        e => e.clone(),
                    })
                    .collect(),
            };
            assert_eq!(e2, expected, "{d:?} descending {descending}");
            if d == Draft::D16 {
                assert_eq!(back, original, "lossless on draft 16");
            }
        }
    }
}

#[test]
fn fetch_end_of_range() {
    for descending in [false, true] {
        let entries = with_ranges(descending);
        let original = fetch_stream(1, descending, &entries);
        // Draft 16 has both markers.
        let legacy =
            translate_with(Draft::D16, Direction::ToLegacy, descending, &original).unwrap();
        let back = translate_with(Draft::D16, Direction::ToModern, descending, &legacy).unwrap();
        assert_eq!(read_fetch(&back, descending).1, entries);
        // Draft 14 has neither: gaps already mean "does not exist", so that
        // one is dropped; an unknown range cannot be said.
        assert_eq!(
            translate_with(Draft::D14, Direction::ToLegacy, descending, &original),
            Err(TranscodeError::Unsupported(
                "End of Unknown Range on a draft-14 fetch"
            ))
        );
        let known: Vec<FetchEntry> = entries[..entries.len() - 2].to_vec();
        let legacy = translate_with(
            Draft::D14,
            Direction::ToLegacy,
            descending,
            &fetch_stream(1, descending, &known),
        )
        .unwrap();
        let back = translate_with(Draft::D14, Direction::ToModern, descending, &legacy).unwrap();
        let objects: Vec<FetchEntry> = known
            .iter()
            .filter(|e| matches!(e, FetchEntry::Object(_)))
            .cloned()
            .collect();
        assert_eq!(read_fetch(&back, descending).1.len(), objects.len());
    }
}

/// After an End of Range, draft 16's text leaves the prior object undefined,
/// so the next object is written out in full.
#[test]
fn d16_object_after_end_of_range_is_explicit() {
    let entries = [
        fobj(1, Some(0), 0, 5, Bytes::new(), b"a"),
        FetchEntry::EndOfNonExistentRange(Location::new(3, 5)),
        fobj(3, Some(0), 6, 5, Bytes::new(), b"b"),
    ];
    let legacy = to_legacy(Draft::D16, &fetch_stream(4, false, &entries));
    let expected = cat(&[
        &[0x05, 0x04],
        &[0x1c, 0x01, 0x00, 0x05, 0x01, b'a'],
        &q(0x8c),
        &[0x03, 0x05],
        &[0x1c, 0x03, 0x06, 0x05, 0x01, b'b'],
    ]);
    assert_eq!(legacy, expected);
}

/// Draft 16 allows an End of Range or a repeated Group ID that stays in the
/// prior group; draft 18's group field always moves.
#[test]
fn d16_same_group_markers() {
    let head = cat(&[&[0x05, 0x04], &[0x1c, 0x01, 0x00, 0x05, 0x01, b'a']]);
    let nonexistent = cat(&[&head, &q(0x8c), &[0x01, 0x04], &[0x04, 0x05, 0x01, b'b']]);
    let (_, e) = read_fetch(&to_modern(Draft::D16, &nonexistent), false);
    assert_eq!(
        e,
        vec![
            fobj(1, Some(0), 0, 5, Bytes::new(), b"a"),
            fobj(1, Some(0), 5, 5, Bytes::new(), b"b")
        ]
    );
    let unknown = cat(&[&head, &q(0x10c), &[0x01, 0x04]]);
    assert!(matches!(
        translate(Draft::D16, Direction::ToModern, &unknown),
        Err(TranscodeError::Unsupported(_))
    ));
    // A Group ID field naming the prior group, and an Object ID field alone
    // (absolute in draft 16's text).
    let repeat = cat(&[
        &head,
        &[0x0c, 0x01, 0x03, 0x01, b'b'],
        &[0x04, 0x07, 0x01, b'c'],
    ]);
    let (_, e) = read_fetch(&to_modern(Draft::D16, &repeat), false);
    let ids: Vec<(u64, u64)> = e
        .iter()
        .map(|e| match e {
            FetchEntry::Object(o) => (o.group, o.object_id),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(ids, [(1, 0), (1, 3), (1, 7)]);
}

#[test]
fn fetch_group_order_must_be_set() {
    let entries = sample_fetch(true);
    let d14 = to_legacy_desc(Draft::D14, &fetch_stream(1, true, &entries));
    assert!(matches!(
        translate_with(Draft::D14, Direction::ToModern, false, &d14),
        Err(TranscodeError::Malformed(
            "fetch groups against the group order"
        ))
    ));
    assert!(translate_with(Draft::D14, Direction::ToModern, true, &d14).is_ok());
}

fn to_legacy_desc(d: Draft, s: &[u8]) -> Vec<u8> {
    translate_with(d, Direction::ToLegacy, true, s).unwrap()
}

#[test]
fn d14_fetch_status_objects_are_dropped() {
    // Object 0, then 1 "does not exist", 2 end of group, then group 6.
    let d14 = cat(&[
        &[0x05, 0x00],
        &[0x05, 0x00, 0x00, 0x01, 0x00, 0x01, b'a'],
        &[0x05, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01],
        &[0x05, 0x00, 0x02, 0x01, 0x00, 0x00, 0x03],
        &[0x06, 0x00, 0x00, 0x01, 0x00, 0x01, b'b'],
    ]);
    let (_, e) = read_fetch(&to_modern(Draft::D14, &d14), false);
    assert_eq!(
        e,
        vec![
            fobj(5, Some(0), 0, 1, Bytes::new(), b"a"),
            fobj(6, Some(0), 0, 1, Bytes::new(), b"b")
        ]
    );
}

#[test]
fn fetch_request_id() {
    let mut t = StreamTranscoder::new(Draft::D16, Direction::ToModern);
    let mut out = Vec::new();
    t.push(Bytes::from_static(&[0x05]), &mut out).unwrap();
    assert_eq!(t.fetch_request_id(), None);
    t.push(Bytes::from_static(&[0x40, 0x80]), &mut out).unwrap();
    assert_eq!(t.fetch_request_id(), Some(128));
    assert_eq!(out.concat(), [0x05, 0x80, 0x80]);

    let mut t = StreamTranscoder::new(Draft::D16, Direction::ToModern);
    t.push(Bytes::from_static(&[0x10, 0x01, 0x02, 0x03]), &mut out)
        .unwrap();
    assert_eq!(t.fetch_request_id(), None);
}

#[test]
fn first_fetch_object_must_be_explicit() {
    for (d, s) in [
        (Draft::D16, cat(&[&[0x05, 0x00], &[0x18, 0x01, 0x05, 0x00]])),
        (Draft::D16, cat(&[&[0x05, 0x00], &[0x0c, 0x01, 0x00, 0x00]])),
    ] {
        assert!(matches!(
            translate(d, Direction::ToModern, &s),
            Err(TranscodeError::Malformed(_))
        ));
    }
    let d18 = cat(&[&[0x05, 0x00], &[0x0d, 0x01, 0x00, 0x00]]);
    assert!(matches!(
        translate(Draft::D16, Direction::ToLegacy, &d18),
        Err(TranscodeError::Malformed(_))
    ));
}

// ---- datagrams ----

fn datagram(t: u64) -> ObjectDatagram {
    let status = (t & 0x20 != 0).then_some(ObjectStatus::EndOfTrack);
    ObjectDatagram {
        track_alias: 90_000,
        group: 1 << 33,
        object_id: if t & 0x04 != 0 { 0 } else { 12_345 },
        priority: (t & 0x08 == 0).then_some(200),
        properties: if t & 0x01 != 0 {
            some_props()
        } else {
            Bytes::new()
        },
        end_of_group: t & 0x02 != 0,
        status: status.map(|s| {
            if t & 0x01 != 0 {
                ObjectStatus::Normal
            } else {
                s
            }
        }),
        payload: if t & 0x20 != 0 {
            Bytes::new()
        } else {
            Bytes::from_static(b"payload")
        },
    }
}

#[test]
fn every_datagram_type_round_trips() {
    for d in BOTH {
        for t in (0..0x30).filter(|t| ObjectDatagram::valid_type(*t)) {
            let dg = datagram(t);
            let mut b = BytesMut::new();
            dg.encode(&mut b);
            assert_eq!(b[0] as u64, t);
            let legacy = transcode_datagram(d, Direction::ToLegacy, &b).unwrap();
            let back = transcode_datagram(d, Direction::ToModern, &legacy).unwrap();
            let mut expected = dg.clone();
            if d == Draft::D14 && expected.priority.is_none() {
                expected.priority = Some(DEFAULT_PRIORITY);
            }
            assert_eq!(
                ObjectDatagram::decode(&back).unwrap(),
                expected,
                "{d:?} {t:#x}"
            );
            if d == Draft::D14 {
                let lt = legacy[0] as u64;
                assert!(lt <= 0x07 || lt == 0x20 || lt == 0x21, "{t:#x} -> {lt:#x}");
            }
        }
    }
}

#[test]
fn datagram_status_vectors() {
    // Draft 18: status End of Group... not allowed; End of Track on object 0,
    // default priority (0x2C). Draft 14: 0x20 with Object ID 0 and priority.
    let d18 = [0x2c, 0x01, 0x02, 0x04];
    let d14 = transcode_datagram(Draft::D14, Direction::ToLegacy, &d18).unwrap();
    assert_eq!(&d14[..], &[0x20, 0x01, 0x02, 0x00, 0x80, 0x04]);
    assert_eq!(
        &transcode_datagram_with_priority(Draft::D14, Direction::ToLegacy, &d18, 9).unwrap()[..],
        &[0x20, 0x01, 0x02, 0x00, 0x09, 0x04]
    );
    assert_eq!(
        &transcode_datagram(Draft::D14, Direction::ToModern, &d14).unwrap()[..],
        &[0x24, 0x01, 0x02, 0x80, 0x04]
    );
    assert_eq!(
        &transcode_datagram(Draft::D16, Direction::ToLegacy, &d18).unwrap()[..],
        &d18
    );
    // Draft 14's "does not exist" has no draft-18 counterpart.
    assert_eq!(
        transcode_datagram(
            Draft::D14,
            Direction::ToModern,
            &[0x20, 0x01, 0x02, 0x03, 0x80, 0x01]
        ),
        Err(TranscodeError::Unsupported(
            "object status 'does not exist'"
        ))
    );
    // Extensions on a legacy End of Group datagram are dropped.
    assert_eq!(
        &transcode_datagram(
            Draft::D14,
            Direction::ToModern,
            &[0x21, 0x01, 0x02, 0x03, 0x80, 0x02, 0x02, 0x05, 0x03]
        )
        .unwrap()[..],
        &[0x20, 0x01, 0x02, 0x03, 0x80, 0x03]
    );
}

#[test]
fn bad_datagrams() {
    let cases: [(Draft, Direction, &[u8]); 6] = [
        (Draft::D14, Direction::ToModern, &[0x08, 0x01, 0x02, 0x03]),
        (
            Draft::D14,
            Direction::ToModern,
            &[0x24, 0x01, 0x02, 0x80, 0x00],
        ),
        (
            Draft::D16,
            Direction::ToModern,
            &[0x22, 0x01, 0x02, 0x03, 0x80, 0x00],
        ),
        (
            Draft::D16,
            Direction::ToModern,
            &[0x01, 0x01, 0x02, 0x03, 0x80, 0x00],
        ),
        (
            Draft::D16,
            Direction::ToModern,
            &[0x20, 0x01, 0x02, 0x03, 0x80, 0x00, 0x00],
        ),
        (Draft::D16, Direction::ToLegacy, &[0x20, 0x01, 0x02, 0x03]),
    ];
    for (d, dir, b) in cases {
        assert!(
            matches!(
                transcode_datagram(d, dir, b),
                Err(TranscodeError::Malformed(_))
            ),
            "{b:x?}"
        );
    }
}

// ---- robustness ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn chop(rng: &mut Rng, t: &mut StreamTranscoder, bytes: &[u8]) {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = (1 + rng.below(40) as usize).min(rest.len());
        let _ = t.push(Bytes::copy_from_slice(&rest[..n]), &mut out);
        assert!(t.pending.len() <= MAX_HEADER);
        rest = &rest[n..];
    }
    let _ = t.finish();
}

/// Random bytes, and valid streams with bytes flipped, never panic.
#[test]
fn garbage_does_not_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let seeds: Vec<Vec<u8>> = vec![
        subgroup_stream(&header_from_type(0x3d), &sample_objects(true)),
        subgroup_stream(&header_from_type(0x12), &sample_objects(false)),
        fetch_stream(3, false, &with_ranges(false)),
        fetch_stream(3, true, &with_ranges(true)),
    ];
    let dirs = [Direction::ToModern, Direction::ToLegacy];
    for round in 0..3000 {
        let d = BOTH[round % 2];
        let dir = dirs[(round / 2) % 2];
        let mut bytes = if round % 3 == 0 {
            (0..rng.below(300)).map(|_| rng.next() as u8).collect()
        } else {
            seeds[rng.below(seeds.len() as u64) as usize].clone()
        };
        for _ in 0..=rng.below(4) {
            if !bytes.is_empty() {
                let i = rng.below(bytes.len() as u64) as usize;
                bytes[i] = rng.next() as u8;
            }
        }
        if round % 5 == 0 && !bytes.is_empty() {
            bytes[0] = [0x05, 0x10, 0x15, 0x1d, 0x35, 0x7d][rng.below(6) as usize];
        }
        let mut t = StreamTranscoder::new(d, dir);
        t.set_descending(round % 7 == 0);
        chop(&mut rng, &mut t, &bytes);
        let _ = transcode_datagram(d, dir, &bytes);
        if let Ok(legacy) = transcode_datagram(d, Direction::ToLegacy, &bytes) {
            let _ = transcode_datagram(d, Direction::ToModern, &legacy);
        }
    }
}

const FIVES: &[u8] = &[5; 3];

/// Random draft-18 subgroup streams survive 18 -> legacy -> 18.
#[test]
fn random_subgroup_round_trips() {
    let mut rng = Rng(42);
    let types: Vec<u8> = all_d18_subgroup_types().collect();
    for round in 0..400 {
        let d = BOTH[round % 2];
        let t = types[rng.below(types.len() as u64) as usize];
        let mut h = header_from_type(t);
        h.track_alias = rng.below(1 << 62);
        h.group = rng.below(1 << 62);
        let mut id = rng.below(1 << 20);
        let mut objects = Vec::new();
        for _ in 0..rng.below(6) {
            let p = if h.has_properties && rng.below(2) == 0 {
                let mut kinds: Vec<u64> = (0..rng.below(5)).map(|_| rng.below(1 << 20)).collect();
                kinds.sort_unstable();
                props(
                    &kinds
                        .iter()
                        .map(|k| match k % 2 {
                            0 => KeyValue::int(*k, rng.below(1 << 62)),
                            _ => KeyValue::bytes(*k, vec![0u8; rng.below(100) as usize]),
                        })
                        .collect::<Vec<_>>(),
                )
            } else {
                Bytes::new()
            };
            objects.push(object(
                id,
                p,
                ObjectStatus::Normal,
                &FIVES[..rng.below(4) as usize],
            ));
            id += 1 + rng.below(1000);
        }
        let original = subgroup_stream(&h, &objects);
        let legacy = feed(
            d,
            Direction::ToLegacy,
            false,
            &original,
            1 + rng.below(9) as usize,
        )
        .unwrap();
        let back = feed(
            d,
            Direction::ToModern,
            false,
            &legacy,
            1 + rng.below(9) as usize,
        )
        .unwrap();
        let (h2, o2) = read_subgroup(&back);
        assert_eq!(h2, normalised(d, h));
        assert_eq!(o2, objects);
    }
}
