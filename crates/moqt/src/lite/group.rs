//! Group streams, frames and datagrams.
//!
//! A group stream is `GROUP` (type 0x0 written by the caller) followed by
//! frames until FIN: `Payload Length, Payload` (01…04) or `Timestamp Delta
//! (zigzag), Payload Length, Payload` (05+; the first delta of a stream is
//! relative to 0). [`GroupReader`] turns the bytes of such a stream (after
//! its type byte) into a header and whole frames, zero-copy where a frame
//! arrives in one chunk.

use bytes::{BufMut, Bytes, BytesMut};

use super::message::MAX_MESSAGE_SIZE;
use super::wire::{get_msg, get_vi, put_msg, put_vi, unzigzag, zigzag};
use super::{stream, DecodeError, Version};

/// Largest frame accepted (a keyframe of 4K video fits many times).
pub const MAX_FRAME_SIZE: usize = 16 * 1024 * 1024;

/// GROUP: the header of a group stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupHeader {
    /// The Subscribe ID the group answers.
    pub subscribe: u64,
    /// Group sequence.
    pub sequence: u64,
    /// lite-06: index of the first frame on the stream (0 elsewhere).
    pub frame_start: u64,
}

impl GroupHeader {
    /// Encodes it, stream type 0x0 included.
    /// `frame_start` goes on the wire on 06 only.
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        put_vi(out, stream::GROUP);
        put_msg(out, |b| {
            put_vi(b, self.subscribe);
            put_vi(b, self.sequence);
            if v.has_announce_ids() {
                put_vi(b, self.frame_start);
            }
        });
    }

    /// Decodes it (after the stream type).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        get_msg(buf, MAX_MESSAGE_SIZE, |b| {
            Ok(Self {
                subscribe: get_vi(b)?,
                sequence: get_vi(b)?,
                frame_start: if v.has_announce_ids() { get_vi(b)? } else { 0 },
            })
        })
    }
}

/// Writes a frame's header: on 05+ the zigzag timestamp delta, then the
/// payload length. The payload follows, written by the caller.
/// A delta outside ±2^61 cannot be carried (the zigzag value would exceed a
/// QUIC varint) and is written as the largest varint.
pub fn encode_frame_header(v: Version, timestamp_delta: i64, len: usize, out: &mut BytesMut) {
    if v.has_track_stream() {
        put_vi(out, zigzag(timestamp_delta));
    }
    put_vi(out, len as u64);
}

/// One frame read from a group stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Absolute timestamp in the track's timescale (05+; 0 before).
    pub timestamp: u64,
    /// The payload.
    pub payload: Bytes,
}

/// Incremental reader of a group stream after its type byte.
///
/// Only an incomplete header or frame is buffered: a frame that arrives
/// whole within one chunk is a slice of that chunk, and the bytes of one
/// that straddles chunks are gathered once and frozen.
#[derive(Debug)]
pub struct GroupReader {
    version: Version,
    buf: BytesMut,
    header: Option<GroupHeader>,
    timestamp: u64,
    max_frame: usize,
    /// A FETCH response: frames only, no GROUP header.
    headerless: bool,
}

impl GroupReader {
    /// A reader for `v`, refusing frames above `max_frame` bytes.
    pub fn new(v: Version, max_frame: usize) -> Self {
        Self {
            version: v,
            buf: BytesMut::new(),
            header: None,
            timestamp: 0,
            max_frame,
            headerless: false,
        }
    }

    /// A reader of a FETCH response body (05+): the same frames, with no
    /// GROUP header before them ([`Self::header`] stays `None`).
    pub fn new_fetch(v: Version, max_frame: usize) -> Self {
        Self {
            headerless: true,
            ..Self::new(v, max_frame)
        }
    }

    /// The header, once read.
    pub fn header(&self) -> Option<GroupHeader> {
        self.header
    }

    /// Adds bytes; once they complete the header it is available from
    /// [`Self::header`], and every complete frame they finish is appended to
    /// `frames`. Errors are fatal for the stream: a frame longer than
    /// `max_frame` ([`DecodeError::TooLong`], as soon as its length is read),
    /// a malformed header, a timestamp outside 0…2^64 − 1.
    pub fn push(&mut self, chunk: Bytes, frames: &mut Vec<Frame>) -> Result<(), DecodeError> {
        let mut found = Vec::new();
        if self.buf.is_empty() {
            // Nothing pending: frames are slices of the chunk itself.
            let res = self.parse(&chunk, &mut found);
            frames.extend(found.into_iter().map(|(timestamp, r)| Frame {
                timestamp,
                payload: chunk.slice(r),
            }));
            let used = res?;
            if used < chunk.len() {
                self.buf.extend_from_slice(&chunk[used..]);
            }
            return Ok(());
        }
        self.buf.extend_from_slice(&chunk);
        let buf = std::mem::take(&mut self.buf);
        let res = self.parse(&buf, &mut found);
        self.buf = buf;
        // Frames before an error are delivered too, as they would have been
        // had they come in an earlier chunk.
        let used = match &res {
            Ok(used) => *used,
            Err(_) => found.last().map_or(0, |(_, r)| r.end),
        };
        if used > 0 {
            // The finished part leaves the buffer without a copy; what is
            // left (a partial frame) stays.
            let done = self.buf.split_to(used).freeze();
            frames.extend(found.into_iter().map(|(timestamp, r)| Frame {
                timestamp,
                payload: done.slice(r),
            }));
        }
        res.map(|_| ())
    }

    /// Parses the header (once) and every whole frame at the start of
    /// `data` into `found` (timestamp, payload range); returns how many bytes
    /// they took.
    fn parse(
        &mut self,
        data: &[u8],
        found: &mut Vec<(u64, std::ops::Range<usize>)>,
    ) -> Result<usize, DecodeError> {
        let mut cur = data;
        if self.header.is_none() && !self.headerless {
            match GroupHeader::decode(&mut cur, self.version) {
                Ok(h) => self.header = Some(h),
                Err(DecodeError::Short) => return Ok(0),
                Err(e) => return Err(e),
            }
        }
        loop {
            let start = data.len() - cur.len();
            let mut c = cur;
            let ts = if self.version.has_track_stream() {
                let delta = match get_vi(&mut c) {
                    Ok(d) => unzigzag(d),
                    Err(DecodeError::Short) => return Ok(start),
                    Err(e) => return Err(e),
                };
                // Deltas add up to an absolute timestamp, which cannot go
                // below 0 nor past 2^64 - 1.
                u64::try_from(i128::from(self.timestamp) + i128::from(delta))
                    .map_err(|_| DecodeError::Invalid("frame timestamp out of range"))?
            } else {
                0
            };
            let len = match get_vi(&mut c) {
                Ok(n) => n,
                Err(DecodeError::Short) => return Ok(start),
                Err(e) => return Err(e),
            };
            if len > self.max_frame as u64 {
                return Err(DecodeError::TooLong);
            }
            let len = len as usize;
            if c.len() < len {
                return Ok(start);
            }
            let at = data.len() - c.len();
            found.push((ts, at..at + len));
            self.timestamp = ts;
            cur = &c[len..];
        }
    }

    /// The stream ended: fine only at a frame boundary after the header.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.header.is_none() && !self.headerless {
            return Err(DecodeError::Invalid("group stream ended before its header"));
        }
        if !self.buf.is_empty() {
            return Err(DecodeError::Invalid("group stream ended inside a frame"));
        }
        Ok(())
    }
}

/// A lite-05+ datagram: a one-frame group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Subscribe ID.
    pub subscribe: u64,
    /// Group sequence.
    pub sequence: u64,
    /// Absolute timestamp, track timescale.
    pub timestamp: u64,
    /// Payload (to the end of the datagram).
    pub payload: Bytes,
}

impl Datagram {
    /// Encodes the header; the payload follows.
    pub fn encode_header(&self, out: &mut BytesMut) {
        put_vi(out, self.subscribe);
        put_vi(out, self.sequence);
        put_vi(out, self.timestamp);
    }

    /// Encodes header and payload.
    pub fn encode(&self, out: &mut BytesMut) {
        self.encode_header(out);
        out.put_slice(&self.payload);
    }

    /// Decodes one, zero-copy (the payload is a slice of `src`).
    pub fn decode(src: &Bytes) -> Result<Self, DecodeError> {
        let mut cur = &src[..];
        let subscribe = get_vi(&mut cur)?;
        let sequence = get_vi(&mut cur)?;
        let timestamp = get_vi(&mut cur)?;
        Ok(Self {
            subscribe,
            sequence,
            timestamp,
            payload: src.slice(src.len() - cur.len()..),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::test_util::{check, hex, hex_of};
    use super::*;

    const HI_YO_04: &str = "02 68 69 02 79 6f";
    const HI_YO_05: &str = "47 d0 02 68 69 40 42 02 79 6f";

    fn frames(ts: [u64; 2]) -> Vec<Frame> {
        vec![
            Frame {
                timestamp: ts[0],
                payload: Bytes::from_static(b"hi"),
            },
            Frame {
                timestamp: ts[1],
                payload: Bytes::from_static(b"yo"),
            },
        ]
    }

    /// The §6 group-stream vector of `v`, and the frames in it.
    fn vector(v: Version) -> (String, GroupHeader, Vec<Frame>) {
        let h = GroupHeader {
            subscribe: 1,
            sequence: 7,
            frame_start: 0,
        };
        match v {
            Version::Lite06 => (
                format!("00 03 01 07 00 {HI_YO_05}"),
                h,
                frames([1000, 1033]),
            ),
            Version::Lite05 => (format!("00 02 01 07 {HI_YO_05}"), h, frames([1000, 1033])),
            _ => (format!("00 02 01 07 {HI_YO_04}"), h, frames([0, 0])),
        }
    }

    fn encode_stream(v: Version, h: &GroupHeader, fs: &[Frame]) -> BytesMut {
        let mut out = BytesMut::new();
        h.encode(v, &mut out);
        let mut prev = 0i64;
        for f in fs {
            encode_frame_header(v, f.timestamp as i64 - prev, f.payload.len(), &mut out);
            out.put_slice(&f.payload);
            prev = f.timestamp as i64;
        }
        out
    }

    #[test]
    fn group_stream_vectors() {
        for v in Version::ALL {
            let (bytes, h, fs) = vector(v);
            let out = encode_stream(v, &h, &fs);
            assert_eq!(hex_of(&out), hex_of(&hex(&bytes)), "{v:?}");

            // The header alone, after the stream type.
            let body = hex(&bytes);
            let hlen = usize::from(body[1]) + 2;
            check(
                &hex_of(&body[1..hlen]),
                &h,
                |h, out| {
                    let mut full = BytesMut::new();
                    h.encode(v, &mut full);
                    out.put_slice(&full[1..]);
                },
                |b| GroupHeader::decode(b, v),
            );

            // The reader, after the stream type: at once, then a byte at a time.
            let data = Bytes::from(body[1..].to_vec());
            let mut r = GroupReader::new(v, MAX_FRAME_SIZE);
            let mut got = Vec::new();
            r.push(data.clone(), &mut got).unwrap();
            assert_eq!(got, fs, "{v:?}");
            assert_eq!(r.header(), Some(h));
            r.finish().unwrap();

            let mut r = GroupReader::new(v, MAX_FRAME_SIZE);
            let mut got = Vec::new();
            for i in 0..data.len() {
                r.push(data.slice(i..i + 1), &mut got).unwrap();
            }
            assert_eq!(got, fs, "{v:?} byte by byte");
            r.finish().unwrap();
        }
    }

    #[test]
    fn lite06_frame_start() {
        let h = GroupHeader {
            subscribe: 1,
            sequence: 7,
            frame_start: 5,
        };
        check(
            "03 01 07 05",
            &h,
            |h, out| {
                let mut full = BytesMut::new();
                h.encode(Version::Lite06, &mut full);
                out.put_slice(&full[1..]);
            },
            |b| GroupHeader::decode(b, Version::Lite06),
        );
        // Not on the wire before 06.
        let mut out = BytesMut::new();
        h.encode(Version::Lite05, &mut out);
        assert_eq!(&out[..], &hex("00 02 01 07")[..]);
    }

    #[test]
    fn fetch_bodies() {
        for v in [Version::Lite03, Version::Lite05, Version::Lite06] {
            let (body, fs) = if v >= Version::Lite05 {
                (HI_YO_05, frames([1000, 1033]))
            } else {
                (HI_YO_04, frames([0, 0]))
            };
            let data = Bytes::from(hex(body));
            let mut r = GroupReader::new_fetch(v, MAX_FRAME_SIZE);
            let mut got = Vec::new();
            r.push(data, &mut got).unwrap();
            assert_eq!(got, fs);
            assert_eq!(r.header(), None);
            r.finish().unwrap();
        }
    }

    #[test]
    fn every_split_gives_the_same_frames() {
        // Mixed sizes, an empty frame, a negative delta, on 05.
        let v = Version::Lite05;
        let h = GroupHeader {
            subscribe: 3,
            sequence: 1000,
            frame_start: 0,
        };
        let fs = vec![
            Frame {
                timestamp: 5000,
                payload: Bytes::from(vec![1u8; 300]),
            },
            Frame {
                timestamp: 4990,
                payload: Bytes::new(),
            },
            Frame {
                timestamp: 100_000,
                payload: Bytes::from(vec![2u8; 70]),
            },
        ];
        let data = encode_stream(v, &h, &fs).freeze().slice(1..);
        for a in 0..data.len() {
            for b in [a, (a + 37).min(data.len()), data.len()] {
                let mut r = GroupReader::new(v, 1000);
                let mut got = Vec::new();
                for (x, y) in [(0, a), (a, b), (b, data.len())] {
                    r.push(data.slice(x..y), &mut got).unwrap();
                }
                assert_eq!(got, fs, "split at {a}, {b}");
                r.finish().unwrap();
            }
        }
    }

    #[test]
    fn finish_inside_a_frame_or_before_the_header() {
        let v = Version::Lite04;
        let data = Bytes::from(hex(&format!("02 01 07 {HI_YO_04}")));
        for n in 0..data.len() {
            let mut r = GroupReader::new(v, MAX_FRAME_SIZE);
            let mut got = Vec::new();
            r.push(data.slice(..n), &mut got).unwrap();
            // Only 3 (after the header) and 6 (after "hi") are boundaries.
            assert_eq!(r.finish().is_ok(), n == 3 || n == 6, "cut at {n}");
        }
        assert!(GroupReader::new(v, 10).finish().is_err());
        assert!(GroupReader::new_fetch(v, 10).finish().is_ok());
    }

    #[test]
    fn oversize_frame() {
        // The length alone is enough to refuse.
        for v in [Version::Lite04, Version::Lite05] {
            let mut r = GroupReader::new(v, 100);
            let mut b = hex("02 01 07");
            if v >= Version::Lite05 {
                b.push(0);
            }
            b.extend_from_slice(&hex("40 65"));
            assert_eq!(
                r.push(Bytes::from(b), &mut Vec::new()),
                Err(DecodeError::TooLong)
            );
        }
        // And the group header's own length.
        let mut b = Vec::new();
        put_vi(&mut b, MAX_MESSAGE_SIZE as u64 + 1);
        let mut r = GroupReader::new(Version::Lite05, 100);
        assert_eq!(
            r.push(Bytes::from(b), &mut Vec::new()),
            Err(DecodeError::TooLong)
        );
    }

    #[test]
    fn timestamps_stay_in_range() {
        let v = Version::Lite05;
        // A first delta of -1.
        let mut r = GroupReader::new(v, 100);
        let b = hex("02 01 07 01 00");
        assert!(matches!(
            r.push(Bytes::from(b), &mut Vec::new()),
            Err(DecodeError::Invalid(_))
        ));
        // Deltas that climb past 2^64 - 1: 2^61 - 1 at a time.
        let mut b = hex("02 01 07");
        let mut got = Vec::new();
        for _ in 0..9 {
            put_vi(&mut b, zigzag((1 << 61) - 1));
            b.push(0);
        }
        let mut r = GroupReader::new(v, 100);
        assert!(matches!(
            r.push(Bytes::from(b), &mut got),
            Err(DecodeError::Invalid(_))
        ));
        // The frames before the bad one still came out.
        assert_eq!(got.len(), 8);
        assert_eq!(got[7].timestamp, 8 * ((1u64 << 61) - 1));
    }

    #[test]
    fn zero_copy_when_whole() {
        let v = Version::Lite04;
        let data = Bytes::from(hex(&format!("02 01 07 {HI_YO_04}")));
        let mut r = GroupReader::new(v, 100);
        let mut got = Vec::new();
        r.push(data.clone(), &mut got).unwrap();
        let at = data.as_ptr() as usize;
        let p = got[0].payload.as_ptr() as usize;
        assert!(
            p >= at && p < at + data.len(),
            "payload is a slice of the chunk"
        );
    }

    #[test]
    fn datagram() {
        let d = Datagram {
            subscribe: 7,
            sequence: 42,
            timestamp: 1000,
            payload: Bytes::from_static(b"hello"),
        };
        let bytes = hex("07 2a 43 e8 68 65 6c 6c 6f");
        let mut out = BytesMut::new();
        d.encode_header(&mut out);
        out.put_slice(&d.payload);
        assert_eq!(&out[..], &bytes[..]);
        let mut out2 = BytesMut::new();
        d.encode(&mut out2);
        assert_eq!(out, out2);
        let src = Bytes::from(bytes);
        assert_eq!(Datagram::decode(&src), Ok(d));
        for n in 0..4 {
            assert_eq!(
                Datagram::decode(&src.slice(..n)),
                Err(DecodeError::Short),
                "cut at {n}"
            );
        }
        // An empty payload is a datagram too.
        assert_eq!(
            Datagram::decode(&src.slice(..4)).map(|d| d.payload.len()),
            Ok(0)
        );
    }
}
