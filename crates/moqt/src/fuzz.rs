//! Bodies of the fuzz targets in `crates/moqt/fuzz/`, one per decoder.
//!
//! They live here, behind the `fuzz` feature (and `cfg(test)`), so that the same
//! logic runs under libFuzzer (`cargo +nightly fuzz run <target>`) and under the
//! proptests of stable `cargo test`. Each function feeds arbitrary bytes to a
//! decoder and checks, by panicking, that:
//!
//! - the decoder never panics, never loops, and leaves its cursor untouched when
//!   it fails;
//! - whatever it accepts re-encodes, and the re-encoding decodes to the same value
//!   (and is never longer than the input, since our encoder is minimal).

use bytes::{Bytes, BytesMut};

use crate::coding::get_vi64;
use crate::data::{
    FetchEntry, FetchState, ObjectDatagram, StreamType, SubgroupHeader, SubgroupObject,
    MAX_OBJECT_PAYLOAD,
};
use crate::error::DecodeError;
use crate::message::Message;
use crate::params::{allowed, Allowed, Parameters};
use crate::session::FrameReader;

/// Decodes a sequence of control messages (`Message::decode`) and round-trips
/// every one it accepts.
pub fn fuzz_message(data: &[u8]) {
    let src = Bytes::copy_from_slice(data);
    let mut s = &src[..];
    while !s.is_empty() {
        let before = s;
        match Message::decode(&mut s, &src) {
            Ok(m) => {
                let used = before.len() - s.len();
                assert!(used >= 3, "a frame is at least type and length");
                let enc = m.to_bytes();
                assert!(enc.len() <= used, "re-encoding of {m:?} grew");
                let (again, n) = Message::decode_bytes(&enc).expect("re-encoded message decodes");
                assert_eq!(n, enc.len());
                assert_eq!(again, m);
                // The message's own accessors must not panic either.
                let _ = (
                    m.name(),
                    m.type_id(),
                    m.request_id(),
                    m.opens_request_stream(),
                );
            }
            Err(e) => {
                assert_eq!(
                    s.as_ptr(),
                    before.as_ptr(),
                    "failed decode moved the cursor"
                );
                assert_eq!(s.len(), before.len());
                let _ = e.session_code();
                return;
            }
        }
    }
}

/// Feeds the input to a [`FrameReader`] in chunks whose size is the first byte,
/// and checks it yields exactly what decoding the whole input at once yields.
pub fn fuzz_frame_reader(data: &[u8]) {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = (chunk as usize).max(1);

    // Reference: decode the whole buffer.
    let src = Bytes::copy_from_slice(rest);
    let mut s = &src[..];
    let mut expected = Vec::new();
    let expected_err = loop {
        if s.is_empty() {
            break None;
        }
        match Message::decode(&mut s, &src) {
            Ok(m) => expected.push(m),
            Err(DecodeError::Short) => break None,
            Err(e) => break Some(e),
        }
    };

    let mut r = FrameReader::new();
    let mut got = Vec::new();
    let mut got_err = None;
    'outer: for piece in rest.chunks(chunk) {
        r.push(piece);
        loop {
            match r.next() {
                Ok(Some(m)) => got.push(m),
                Ok(None) => break,
                Err(e) => {
                    got_err = Some(e);
                    break 'outer;
                }
            }
        }
    }
    assert_eq!(got, expected);
    assert_eq!(got_err, expected_err);
    if got_err.is_none() {
        assert_eq!(r.pending(), s.len());
    }
}

/// The parameter sets of every message that carries Message Parameters.
pub const PARAMETER_SETS: [Allowed; 11] = [
    allowed::SUBSCRIBE,
    allowed::SUBSCRIBE_OK,
    allowed::PUBLISH,
    allowed::PUBLISH_OK,
    allowed::REQUEST_OK,
    allowed::REQUEST_UPDATE,
    allowed::FETCH,
    allowed::FETCH_OK,
    allowed::TRACK_STATUS,
    allowed::PUBLISH_NAMESPACE,
    allowed::SUBSCRIBE_TRACKS,
];

/// Decodes a Message Parameters block with the parameter set picked by the first
/// byte, and round-trips what it accepts.
pub fn fuzz_parameters(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let set = PARAMETER_SETS[which as usize % PARAMETER_SETS.len()];
    let src = Bytes::copy_from_slice(rest);
    let mut s = &src[..];
    let Ok(p) = Parameters::decode(&mut s, &src, set) else {
        return;
    };
    let used = rest.len() - s.len();
    let mut enc = Vec::new();
    p.encode(&mut enc);
    assert!(enc.len() <= used, "re-encoding of {p:?} grew");
    let enc = Bytes::from(enc);
    let mut e = &enc[..];
    assert_eq!(Parameters::decode(&mut e, &enc, set).as_ref(), Ok(&p));
    assert!(e.is_empty());
}

/// Decodes a subgroup stream: SUBGROUP_HEADER, then objects until the input ends
/// or an object fails; re-encodes header and objects and decodes them again.
pub fn fuzz_subgroup_stream(data: &[u8]) {
    let src = Bytes::copy_from_slice(data);
    let mut s = &src[..];
    let _ = StreamType::peek(s);
    let Ok(h) = SubgroupHeader::decode(&mut s) else {
        assert_eq!(s.len(), src.len(), "failed header decode moved the cursor");
        return;
    };
    let mut objects = Vec::new();
    let mut prev = None;
    while !s.is_empty() {
        let before = s.len();
        match SubgroupObject::decode(&mut s, &src, prev, h.has_properties, MAX_OBJECT_PAYLOAD) {
            Ok(o) => {
                assert!(s.len() < before);
                prev = Some(o.object_id);
                objects.push(o);
            }
            Err(_) => {
                assert_eq!(s.len(), before, "failed object decode moved the cursor");
                break;
            }
        }
    }

    let mut enc = BytesMut::new();
    h.encode(&mut enc);
    let mut prev = None;
    for o in &objects {
        o.encode(&mut enc, prev, h.has_properties)
            .expect("a decoded object re-encodes");
        prev = Some(o.object_id);
    }
    let enc = enc.freeze();
    assert!(enc.len() <= data.len() - s.len());
    let mut e = &enc[..];
    assert_eq!(SubgroupHeader::decode(&mut e).as_ref(), Ok(&h));
    let mut prev = None;
    for o in &objects {
        let d = SubgroupObject::decode(&mut e, &enc, prev, h.has_properties, MAX_OBJECT_PAYLOAD)
            .expect("re-encoded object decodes");
        assert_eq!(&d, o);
        prev = Some(d.object_id);
    }
    assert!(e.is_empty());
}

/// Decodes one OBJECT_DATAGRAM and round-trips it.
pub fn fuzz_datagram(data: &[u8]) {
    let src = Bytes::copy_from_slice(data);
    let Ok(d) = ObjectDatagram::decode(&src) else {
        return;
    };
    d.validate().expect("a decoded datagram is consistent");
    assert!(ObjectDatagram::valid_type(d.type_code()));
    let mut enc = Vec::new();
    d.encode(&mut enc);
    assert!(enc.len() <= data.len());
    let enc = Bytes::from(enc);
    assert_eq!(ObjectDatagram::decode(&enc).as_ref(), Ok(&d));
}

/// Decodes a FETCH stream body (the first byte picks the group order, a FETCH_HEADER
/// may precede the entries), then re-encodes the entries with a fresh state and
/// decodes them again.
pub fn fuzz_fetch_stream(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let descending = mode & 1 != 0;
    let src = Bytes::copy_from_slice(rest);
    let mut s = &src[..];
    if mode & 2 != 0 {
        // FETCH_HEADER: type 0x05 and a Request ID.
        let mut h = s;
        match (get_vi64(&mut h), get_vi64(&mut h)) {
            (Ok(crate::data::FETCH_HEADER), Ok(_)) => s = h,
            _ => return,
        }
    }
    let mut state = FetchState::new(descending);
    let mut entries: Vec<FetchEntry> = Vec::new();
    while !s.is_empty() {
        let before = s.len();
        match state.decode(&mut s, &src, MAX_OBJECT_PAYLOAD) {
            Ok(e) => {
                assert!(s.len() < before);
                entries.push(e);
            }
            Err(_) => {
                assert_eq!(s.len(), before, "failed entry decode moved the cursor");
                break;
            }
        }
    }

    let mut enc = BytesMut::new();
    let mut w = FetchState::new(descending);
    for e in &entries {
        w.try_encode(&mut enc, e)
            .expect("a decoded fetch entry re-encodes in the same order");
    }
    // No length check here: the input may lean on references our encoder avoids
    // (the prior Subgroup ID after a datagram object, an implicit Object ID across
    // groups), so the re-encoding can be longer.
    let enc = enc.freeze();
    let mut r = FetchState::new(descending);
    let mut e = &enc[..];
    for want in &entries {
        let got = r
            .decode(&mut e, &enc, MAX_OBJECT_PAYLOAD)
            .expect("re-encoded fetch entry decodes");
        assert_eq!(&got, want);
    }
    assert!(e.is_empty());
}

/// The draft a legacy fuzz input speaks: its first byte, even for 14.
fn legacy_draft(b: u8) -> crate::legacy::Draft {
    if b % 2 == 0 {
        crate::legacy::Draft::D14
    } else {
        crate::legacy::Draft::D16
    }
}

/// Legacy control messages (drafts 14 and 16, the first byte picks):
/// `Control::decode` over a sequence of frames, never moving the cursor on
/// failure; an accepted message that re-encodes decodes to a value that
/// encodes the same (decoding normalises: it drops parameters draft 18 does
/// not allow, so the first round trip may lose some, the second none). The
/// same bytes through `LegacyFrameReader`, a byte at a time, give the same
/// messages.
pub fn fuzz_legacy_control(data: &[u8]) {
    use crate::legacy::control::{Control, LegacyFrameReader};
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let draft = legacy_draft(first);
    let src = Bytes::copy_from_slice(rest);
    let mut s = &src[..];
    let mut decoded = Vec::new();
    while !s.is_empty() {
        let before = s;
        match Control::decode(draft, &mut s, &src) {
            Ok(m) => {
                let _ = m.name();
                if let Ok(enc) = m.to_bytes(draft) {
                    let mut e = &enc[..];
                    let again = Control::decode(draft, &mut e, &enc).expect("re-encoded decodes");
                    assert!(e.is_empty());
                    let enc2 = again.to_bytes(draft).expect("decoded value encodes");
                    let mut e2 = &enc2[..];
                    let third = Control::decode(draft, &mut e2, &enc2).expect("decodes again");
                    assert_eq!(third, again, "second round trip changed {again:?}");
                }
                decoded.push(m);
            }
            Err(_) => {
                assert_eq!(
                    s.as_ptr(),
                    before.as_ptr(),
                    "failed decode moved the cursor"
                );
                break;
            }
        }
    }
    let mut r = LegacyFrameReader::new(draft);
    let mut got = Vec::new();
    'feed: for b in rest {
        r.push(&[*b]);
        loop {
            match r.next() {
                Ok(Some(m)) => got.push(m),
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
    assert_eq!(got[..], decoded[..got.len().min(decoded.len())]);
}

/// Legacy data streams and datagrams (the first byte picks the draft and
/// the direction): the transcoder never panics, and feeding the same bytes
/// whole or a byte at a time gives the same output and the same verdict.
pub fn fuzz_legacy_data(data: &[u8]) {
    use crate::legacy::data::{transcode_datagram, Direction, StreamTranscoder};
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let draft = legacy_draft(first);
    let dir = if first & 2 == 0 {
        Direction::ToModern
    } else {
        Direction::ToLegacy
    };
    let _ = transcode_datagram(draft, dir, rest);
    let whole = {
        let mut t = StreamTranscoder::new(draft, dir);
        let mut out = Vec::new();
        let r = t
            .push(Bytes::copy_from_slice(rest), &mut out)
            .map(|_| t.finish());
        (r.is_ok_and(|f| f.is_ok()), out.concat())
    };
    let split = {
        let mut t = StreamTranscoder::new(draft, dir);
        let mut out = Vec::new();
        let mut ok = true;
        for b in rest {
            if t.push(Bytes::copy_from_slice(&[*b]), &mut out).is_err() {
                ok = false;
                break;
            }
        }
        (ok && t.finish().is_ok(), out.concat())
    };
    assert_eq!(whole.0, split.0, "verdict depends on chunking");
    if whole.0 {
        assert_eq!(whole.1, split.1, "output depends on chunking");
    }
}

/// The lite version a fuzz input speaks: its first byte.
fn lite_version(b: u8) -> crate::lite::Version {
    crate::lite::Version::ALL[usize::from(b) % crate::lite::Version::ALL.len()]
}

/// Runs `dec` over a sequence of messages in `data`: each one accepted is
/// encoded with `enc` and must decode from that to the same value (and not
/// be longer than its input: the encoder is minimal); a failure must leave
/// the cursor where it was.
fn lite_messages<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    dec: impl Fn(&mut &[u8]) -> Result<T, DecodeError>,
    enc: impl Fn(&T, &mut BytesMut),
) {
    lite_messages_but(data, dec, enc, |_| false)
}

/// [`lite_messages`], except that values for which `decode_only` holds (a
/// skipped lite-06 announcement, which has no encoding) are not re-encoded.
fn lite_messages_but<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    dec: impl Fn(&mut &[u8]) -> Result<T, DecodeError>,
    enc: impl Fn(&T, &mut BytesMut),
    decode_only: impl Fn(&T) -> bool,
) {
    let mut s = data;
    while !s.is_empty() {
        let before = s;
        match dec(&mut s) {
            Ok(m) => {
                let used = before.len() - s.len();
                assert!(used > 0, "an accepted message takes bytes");
                if decode_only(&m) {
                    continue;
                }
                let mut out = BytesMut::new();
                enc(&m, &mut out);
                assert!(out.len() <= used, "re-encoding of {m:?} grew");
                let mut e = &out[..];
                assert_eq!(dec(&mut e).as_ref(), Ok(&m), "re-encoding of {m:?}");
                assert!(e.is_empty());
            }
            Err(_) => {
                assert_eq!(
                    s.as_ptr(),
                    before.as_ptr(),
                    "failed decode moved the cursor"
                );
                assert_eq!(s.len(), before.len());
                return;
            }
        }
    }
}

/// moq-lite (the first byte picks the version, 01…06): every control
/// message decoder over the rest as a sequence of messages, round-tripping
/// what it accepts; the datagram decoder; and `GroupReader` (group stream
/// and FETCH body), fed whole and a byte at a time, which must agree.
pub fn fuzz_lite(data: &[u8]) {
    use crate::lite::group::{Datagram, Frame, GroupReader};
    use crate::lite::message::{
        Announce, AnnounceRequest, Fetch, GoAway, LegacyClientSetup, Probe, SessionUpdate, Setup,
        Subscribe, SubscribeResponse, SubscribeUpdate, Track, TrackInfo,
    };
    use crate::lite::path;
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let v = lite_version(first);

    lite_messages(rest, LegacyClientSetup::decode, LegacyClientSetup::encode);
    lite_messages(rest, SessionUpdate::decode, SessionUpdate::encode);
    lite_messages(rest, Setup::decode, Setup::encode);
    lite_messages(
        rest,
        |b| AnnounceRequest::decode(b, v),
        |m, o| m.encode(v, o),
    );
    // Announcements: the first message of a stream, then the rest; an
    // `Unknown` (lite-06) has no encoding, so it is only decoded.
    for first in [true, false] {
        lite_messages_but(
            rest,
            |b| Announce::decode(b, v, first),
            |m, o| m.encode(v, o),
            |m| *m == Announce::Unknown,
        );
    }
    lite_messages(rest, |b| Subscribe::decode(b, v), |m, o| m.encode(v, o));
    lite_messages(
        rest,
        |b| SubscribeUpdate::decode(b, v),
        |m, o| m.encode(v, o),
    );
    lite_messages(
        rest,
        |b| SubscribeResponse::decode(b, v),
        |m, o| m.encode(v, o),
    );
    lite_messages(rest, |b| Fetch::decode(b, v), |m, o| m.encode(v, o));
    lite_messages(rest, |b| Track::decode(b, v), |m, o| m.encode(v, o));
    lite_messages(rest, |b| TrackInfo::decode(b, v), |m, o| m.encode(v, o));
    lite_messages(rest, |b| Probe::decode(b, v), |m, o| m.encode(v, o));
    lite_messages(rest, |b| GoAway::decode(b, v), |m, o| m.encode(v, o));

    let src = Bytes::copy_from_slice(rest);
    if let Ok(d) = Datagram::decode(&src) {
        let mut out = BytesMut::new();
        d.encode(&mut out);
        assert_eq!(Datagram::decode(&out.freeze()).as_ref(), Ok(&d));
    }

    // Paths: normalisation is idempotent; a namespace maps back.
    if let Ok(p) = std::str::from_utf8(rest) {
        let n = path::normalize(p);
        assert_eq!(path::normalize(&n), n);
        if let Some(ns) = path::to_namespace(&n) {
            if let Some(back) = path::from_namespace(&ns) {
                assert_eq!(path::to_namespace(&back).as_ref(), Some(&ns));
            }
        }
    }

    // Group streams (and FETCH bodies when bit 3 of the first byte is set):
    // the same frames and verdict whole and a byte at a time.
    let fetch = first & 8 != 0;
    let reader = || {
        if fetch {
            GroupReader::new_fetch(v, 256)
        } else {
            GroupReader::new(v, 256)
        }
    };
    let run = |pieces: &mut dyn Iterator<Item = Bytes>| {
        let mut r = reader();
        let mut frames: Vec<Frame> = Vec::new();
        let mut verdict = Ok(());
        for p in pieces {
            if let Err(e) = r.push(p, &mut frames) {
                verdict = Err(e);
                break;
            }
        }
        let verdict = verdict.and_then(|_| r.finish());
        (frames, verdict, r.header())
    };
    let whole = run(&mut std::iter::once(src.clone()));
    let split = run(&mut (0..src.len()).map(|i| src.slice(i..i + 1)));
    assert_eq!(whole, split, "group reader depends on chunking");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    #[test]
    fn empty_inputs() {
        for f in [
            fuzz_message,
            fuzz_frame_reader,
            fuzz_parameters,
            fuzz_subgroup_stream,
            fuzz_datagram,
            fuzz_fetch_stream,
            fuzz_legacy_control,
            fuzz_legacy_data,
            fuzz_lite,
        ] {
            f(&[]);
            f(&[0]);
            f(&[0xff; 9]);
        }
    }

    /// Valid lite messages and streams (`docs/lite-wire-notes.md` §6, without
    /// their stream types), each with every byte replaced in turn by a few
    /// telling values, through [`fuzz_lite`] under every version.
    #[test]
    fn lite_vector_mutations() {
        const VECTORS: [&[u8]; 14] = [
            &[0x05, 0x02, 0x01, 0x61, 0x01, 0x62],
            &[0x08, 0x01, 0x03, 0x63, 0x61, 0x6d, 0x02, 0x07, 0x09],
            &[0x00, 0x08, 0x03, 0x63, 0x61, 0x6d, 0x01, 0x07, 0x0c, 0x1e],
            &[0x02, 0x05, 0x03, 0x01, 0x07, 0x0c, 0x1e],
            &[
                0x12, 0x01, 0x04, 0x72, 0x6f, 0x6f, 0x6d, 0x05, 0x76, 0x69, 0x64, 0x65, 0x6f, 0x03,
                0x00, 0x40, 0xfa, 0x08, 0x0a,
            ],
            &[
                0x13, 0x01, 0x04, 0x72, 0x6f, 0x6f, 0x6d, 0x05, 0x76, 0x69, 0x64, 0x65, 0x6f, 0x03,
                0x40, 0xfa, 0x07, 0x0a, 0x04, 0x03,
            ],
            &[0x07, 0x05, 0x43, 0xe8, 0x00, 0x00, 0x00, 0x00],
            &[0x00, 0x05, 0x03, 0x00, 0x00, 0x00, 0x00],
            &[
                0x0f, 0x04, 0x72, 0x6f, 0x6f, 0x6d, 0x05, 0x76, 0x69, 0x64, 0x65, 0x6f, 0x03, 0x07,
                0x02, 0x07,
            ],
            &[0x06, 0x7f, 0x00, 0x53, 0x88, 0x43, 0xe8],
            &[0x08, 0x01, 0x02, 0x05, 0x2f, 0x61, 0x6e, 0x6f, 0x6e],
            &[
                0x03, 0x01, 0x07, 0x00, 0x47, 0xd0, 0x02, 0x68, 0x69, 0x40, 0x42, 0x02, 0x79, 0x6f,
            ],
            &[0x02, 0x01, 0x07, 0x02, 0x68, 0x69, 0x02, 0x79, 0x6f],
            &[
                0x20, 0x00, 0x1a, 0x03, 0xc0, 0x00, 0x00, 0x00, 0xff, 0x0d, 0xad, 0x02, 0xc0, 0x00,
                0x00, 0x00, 0xff, 0x0d, 0xad, 0x01, 0xc0, 0x00, 0x00, 0x00, 0xff, 0x00, 0x00, 0x0e,
                0x00,
            ],
        ];
        for v in [0u8, 1, 2, 3, 4, 5, 8, 13] {
            for vector in VECTORS {
                let mut b = vec![v];
                b.extend_from_slice(vector);
                fuzz_lite(&b);
                for i in 1..b.len() {
                    for x in [0, 1, 0x3f, 0x40, 0x80, 0xc0, 0xff, b[i] ^ 1] {
                        let mut m = b.clone();
                        m[i] = x;
                        fuzz_lite(&m);
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn message_random(data in vec(any::<u8>(), 0..256)) {
            fuzz_message(&data);
        }

        /// Random payloads behind a valid type and a matching length, so the
        /// payload decoders see most of the inputs.
        #[test]
        fn message_framed(
            ty in prop::sample::select(&[
                0x2F00u64, 0x10, 0x3, 0x4, 0x1D, 0x1E, 0xB, 0x16, 0x18, 0xD, 0x6,
                0x50, 0x51, 0x8, 0xE, 0xF, 0x2, 0x7, 0x5,
            ][..]),
            payload in vec(any::<u8>(), 0..96),
        ) {
            let mut b = Vec::new();
            crate::coding::put_vi64(&mut b, ty);
            b.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            b.extend_from_slice(&payload);
            fuzz_message(&b);
            let mut r = vec![3u8];
            r.extend_from_slice(&b);
            fuzz_frame_reader(&r);
        }

        #[test]
        fn frame_reader_random(data in vec(any::<u8>(), 0..256)) {
            fuzz_frame_reader(&data);
        }

        #[test]
        fn parameters_random(data in vec(any::<u8>(), 0..64)) {
            fuzz_parameters(&data);
        }

        /// Parameter blocks made of plausible type deltas and small values.
        #[test]
        fn parameters_plausible(
            which in any::<u8>(),
            items in vec((0u8..0x35, vec(0u8..4, 0..4)), 0..6),
        ) {
            let mut b = vec![which, items.len() as u8];
            for (t, v) in &items {
                b.push(*t);
                b.extend_from_slice(v);
            }
            fuzz_parameters(&b);
        }

        #[test]
        fn subgroup_random(data in vec(any::<u8>(), 0..256)) {
            fuzz_subgroup_stream(&data);
        }

        /// A valid header type in front of random bytes, so objects get decoded.
        #[test]
        fn subgroup_typed(t in 0x10u8..0x80, data in vec(any::<u8>(), 0..256)) {
            let mut b = vec![t];
            b.extend_from_slice(&data);
            fuzz_subgroup_stream(&b);
        }

        #[test]
        fn datagram_random(data in vec(any::<u8>(), 0..128)) {
            fuzz_datagram(&data);
        }

        #[test]
        fn datagram_typed(t in 0u8..0x30, data in vec(any::<u8>(), 0..64)) {
            let mut b = vec![t];
            b.extend_from_slice(&data);
            fuzz_datagram(&b);
        }

        #[test]
        fn fetch_random(data in vec(any::<u8>(), 0..256)) {
            fuzz_fetch_stream(&data);
        }

        #[test]
        fn legacy_control_random(data in vec(any::<u8>(), 0..256)) {
            fuzz_legacy_control(&data);
        }

        /// Random payloads behind a legacy type and a matching length.
        #[test]
        fn legacy_control_framed(
            draft in 0u8..2,
            ty in prop::sample::select(&[
                0x20u64, 0x21, 0x10, 0x15, 0x1A, 0x7, 0x5, 0x3, 0x4, 0x2, 0xA, 0x1D,
                0x1E, 0x1F, 0xB, 0x16, 0x18, 0x19, 0x17, 0xD, 0xE, 0xF, 0x6, 0x8,
                0x9, 0xC, 0x11, 0x12, 0x13, 0x14,
            ][..]),
            payload in vec(prop_oneof![0u8..0x40, any::<u8>()], 0..96),
        ) {
            let mut b = vec![draft];
            crate::legacy::varint::put_varint(&mut b, ty);
            b.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            b.extend_from_slice(&payload);
            fuzz_legacy_control(&b);
        }

        #[test]
        fn legacy_data_random(data in vec(any::<u8>(), 0..256)) {
            fuzz_legacy_data(&data);
        }

        /// A subgroup or fetch header type first, so objects get read.
        #[test]
        fn legacy_data_typed(
            mode in 0u8..4,
            t in prop::sample::select(&[0x05u8, 0x10, 0x11, 0x14, 0x15, 0x18, 0x1D, 0x30, 0x35, 0x38, 0x3D][..]),
            data in vec(prop_oneof![0u8..0x40, any::<u8>()], 0..200),
        ) {
            let mut b = vec![mode, t];
            b.extend_from_slice(&data);
            fuzz_legacy_data(&b);
        }

        #[test]
        fn lite_random(data in vec(any::<u8>(), 0..256)) {
            fuzz_lite(&data);
        }

        /// A plausible length first and small bytes after, so bodies get
        /// decoded rather than refused on their length.
        #[test]
        fn lite_framed(
            version in any::<u8>(),
            data in vec(prop_oneof![0u8..0x10, Just(0x2f), any::<u8>()], 0..64),
        ) {
            let mut b = vec![version, data.len() as u8];
            b.extend_from_slice(&data);
            fuzz_lite(&b);
            // And as a typed message (subscribe responses, lite-06 announcements).
            let mut t = vec![version, version % 4, data.len() as u8];
            t.extend_from_slice(&data);
            fuzz_lite(&t);
        }

        /// Small flag bytes and small values, so that entries chain.
        #[test]
        fn fetch_plausible(mode in 0u8..2, data in vec(prop_oneof![0u8..0x80, Just(0x80u8)], 0..128)) {
            let mut b = vec![mode];
            b.extend_from_slice(&data);
            fuzz_fetch_stream(&b);
        }
    }
}
