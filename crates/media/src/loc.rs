//! LOC, the Low Overhead Media Container (draft-ietf-moq-loc-04, 20 July
//! 2026), as MSF's `loc` packaging uses it.
//!
//! An object's payload is the codec's frame as WebCodecs' `EncodedVideoChunk`
//! / `EncodedAudioChunk` holds it (for H.264/H.265 the "canonical" form:
//! length-prefixed NAL units, with the parameter sets in the Video Config
//! property rather than in band). The metadata travels as MoQT object
//! properties (draft-18 Key-Value-Pairs, delta-coded types) with the IDs the
//! draft registers in its §IANA table; the codec of that block is `moqt`'s,
//! so these bytes are exactly what `SubgroupObject::properties` carries.
//!
//! LOC's "private properties" (inside an end-to-end encrypted payload) are
//! not used: quichub does not encrypt payloads.

use bytes::Bytes;
use moqt::coding::{get_kvps, put_kvps};
use moqt::{KeyValue, KvValue};

use crate::Error;

/// Property IDs registered by draft-ietf-moq-loc-04 §"MOQ Properties Registry".
pub mod id {
    /// TIMESTAMP (even: a `vi64`), in Timescale units.
    pub const TIMESTAMP: u64 = 0x10;
    /// TIMESCALE (even: a `vi64`), Timestamp units per second.
    pub const TIMESCALE: u64 = 0x08;
    /// VIDEO_FRAME_MARKING (odd: bytes), RFC 9626's frame marking.
    pub const VIDEO_FRAME_MARKING: u64 = 0x09;
    /// AUDIO_LEVEL (even: a `vi64`), RFC 6464's level and voice bit.
    pub const AUDIO_LEVEL: u64 = 0x0C;
    /// VIDEO_CONFIG (odd: bytes), WebCodecs' `VideoDecoderConfig.description`.
    pub const VIDEO_CONFIG: u64 = 0x0D;
    /// AUDIO_CONFIG (odd: bytes), WebCodecs' `AudioDecoderConfig.description`.
    pub const AUDIO_CONFIG: u64 = 0x0F;
}

/// RFC 9626 frame marking: the short (non-scalable) form is one byte
/// `S E I D B TID(3)`; the scalable forms add LID and TL0PICIDX bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameMarking {
    /// S: the object starts a frame.
    pub start: bool,
    /// E: the object ends a frame.
    pub end: bool,
    /// I: independent (a keyframe; decoding can start here).
    pub independent: bool,
    /// D: discardable (nothing references it).
    pub discardable: bool,
    /// B: base layer sync.
    pub base_layer_sync: bool,
    /// Temporal layer ID (0..=7).
    pub tid: u8,
    /// Layer ID (scalable form only).
    pub lid: Option<u8>,
    /// TL0PICIDX (scalable form only, after LID).
    pub tl0picidx: Option<u8>,
}

impl FrameMarking {
    /// The marking of one whole non-layered frame per object, as quichub
    /// publishes it.
    pub fn frame(keyframe: bool, disposable: bool) -> Self {
        Self {
            start: true,
            end: true,
            independent: keyframe,
            discardable: disposable,
            ..Self::default()
        }
    }

    /// The property value bytes.
    pub fn to_bytes(&self) -> Bytes {
        let b0 = (self.start as u8) << 7
            | (self.end as u8) << 6
            | (self.independent as u8) << 5
            | (self.discardable as u8) << 4
            | (self.base_layer_sync as u8) << 3
            | (self.tid & 0x07);
        let mut v = vec![b0];
        if let Some(lid) = self.lid {
            v.push(lid);
            if let Some(t) = self.tl0picidx {
                v.push(t);
            }
        }
        v.into()
    }

    /// Reads a property value: 1 to 4 bytes (the draft allows 4; a fourth
    /// byte is not defined by RFC 9626 and is ignored).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        let Some(&b0) = b.first() else {
            return Err(Error::malformed("LOC frame marking", "empty"));
        };
        if b.len() > 4 {
            return Err(Error::malformed(
                "LOC frame marking",
                format!("{} bytes (at most 4)", b.len()),
            ));
        }
        Ok(Self {
            start: b0 & 0x80 != 0,
            end: b0 & 0x40 != 0,
            independent: b0 & 0x20 != 0,
            discardable: b0 & 0x10 != 0,
            base_layer_sync: b0 & 0x08 != 0,
            tid: b0 & 0x07,
            lid: b.get(1).copied(),
            tl0picidx: b.get(2).copied(),
        })
    }
}

/// The LOC properties of one object. Properties of other specifications
/// (MoQT's own, MSF's) are kept in `other` so a block re-encodes whole.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocProperties {
    /// Presentation time in `timescale` units (or, without a timescale,
    /// microseconds since the Unix epoch).
    pub timestamp: Option<u64>,
    /// Timestamp units per second.
    pub timescale: Option<u64>,
    /// Video decoder configuration ("extradata": the body of `avcC` / `hvcC`).
    pub video_config: Option<Bytes>,
    /// Audio decoder configuration (AudioSpecificConfig, OpusHead).
    pub audio_config: Option<Bytes>,
    /// Video frame marking.
    pub frame_marking: Option<FrameMarking>,
    /// RFC 6464 audio level: bit 7 voice activity, bits 0-6 level in -dBov.
    pub audio_level: Option<u8>,
    /// Every other property, as received.
    pub other: Vec<KeyValue>,
}

impl LocProperties {
    /// The property block for an object (empty if there is nothing to say).
    pub fn encode(&self) -> Bytes {
        let mut kvs = self.other.clone();
        let int = |kvs: &mut Vec<KeyValue>, k, v: Option<u64>| {
            if let Some(v) = v {
                kvs.push(KeyValue::int(k, v));
            }
        };
        int(&mut kvs, id::TIMESTAMP, self.timestamp);
        int(&mut kvs, id::TIMESCALE, self.timescale);
        int(&mut kvs, id::AUDIO_LEVEL, self.audio_level.map(u64::from));
        if let Some(c) = &self.video_config {
            kvs.push(KeyValue::bytes(id::VIDEO_CONFIG, c.clone()));
        }
        if let Some(c) = &self.audio_config {
            kvs.push(KeyValue::bytes(id::AUDIO_CONFIG, c.clone()));
        }
        if let Some(m) = &self.frame_marking {
            kvs.push(KeyValue::bytes(id::VIDEO_FRAME_MARKING, m.to_bytes()));
        }
        // The wire carries type deltas, so pairs go in ascending type order.
        kvs.sort_by_key(|kv| kv.kind);
        let mut b = Vec::new();
        put_kvps(&mut b, &kvs);
        b.into()
    }

    /// Reads an object's property block. A LOC property with the wrong
    /// shape is an error; properties this module does not know are kept.
    pub fn decode(block: &Bytes) -> Result<Self, Error> {
        let mut buf = &block[..];
        let kvs =
            get_kvps(&mut buf, block).map_err(|e| Error::malformed("object properties", e))?;
        let mut p = Self::default();
        for kv in kvs {
            match (kv.kind, &kv.value) {
                (id::TIMESTAMP, KvValue::Int(v)) => p.timestamp = Some(*v),
                (id::TIMESCALE, KvValue::Int(v)) => {
                    if *v == 0 {
                        return Err(Error::malformed("LOC timescale", "zero"));
                    }
                    p.timescale = Some(*v)
                }
                // Only the least significant 8 bits carry the level (§Audio Level).
                (id::AUDIO_LEVEL, KvValue::Int(v)) => p.audio_level = Some(*v as u8),
                (id::VIDEO_CONFIG, KvValue::Bytes(b)) => p.video_config = Some(b.clone()),
                (id::AUDIO_CONFIG, KvValue::Bytes(b)) => p.audio_config = Some(b.clone()),
                (id::VIDEO_FRAME_MARKING, KvValue::Bytes(b)) => {
                    p.frame_marking = Some(FrameMarking::parse(b)?)
                }
                _ => p.other.push(kv),
            }
        }
        Ok(p)
    }

    /// The presentation time in microseconds, if a timestamp is present and
    /// in media time (a Timescale given). Saturates instead of overflowing.
    pub fn pts_micros(&self) -> Option<i64> {
        let ts = self.timestamp?;
        let scale = self.timescale.unwrap_or(1_000_000);
        let us = (ts as u128 * 1_000_000) / scale.max(1) as u128;
        Some(us.min(i64::MAX as u128) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_round_trip() {
        let p = LocProperties {
            timestamp: Some(1_234_567),
            timescale: Some(1_000_000),
            video_config: Some(Bytes::from_static(b"\x01\x64\x00\x1f")),
            audio_config: None,
            frame_marking: Some(FrameMarking::frame(true, false)),
            audio_level: Some(0x85),
            other: vec![KeyValue::int(0x3C, 7)],
        };
        let b = p.encode();
        assert_eq!(LocProperties::decode(&b).unwrap(), p);
        assert_eq!(p.pts_micros(), Some(1_234_567));
        assert!(LocProperties::default().encode().is_empty());
        assert_eq!(
            LocProperties::decode(&Bytes::new()).unwrap(),
            LocProperties::default()
        );
    }

    #[test]
    fn wire_bytes_follow_the_registered_ids() {
        // Timescale 0x08 = 90000, then Timestamp 0x10 = 3000 as delta 0x08,
        // then Video Frame Marking 0x09... sorted: 0x08, 0x09, 0x10.
        let p = LocProperties {
            timestamp: Some(3000),
            timescale: Some(90_000),
            frame_marking: Some(FrameMarking::frame(true, false)),
            ..Default::default()
        };
        let b = p.encode();
        let mut expect = Vec::new();
        moqt::coding::put_vi64(&mut expect, 0x08);
        moqt::coding::put_vi64(&mut expect, 90_000);
        moqt::coding::put_vi64(&mut expect, 0x01); // 0x09 - 0x08
        moqt::coding::put_vi64(&mut expect, 1); // length
        expect.push(0b1110_0000); // S E I
        moqt::coding::put_vi64(&mut expect, 0x07); // 0x10 - 0x09
        moqt::coding::put_vi64(&mut expect, 3000);
        assert_eq!(b.as_ref(), &expect[..]);
        assert_eq!(p.pts_micros(), Some(33_333));
    }

    #[test]
    fn frame_marking_forms() {
        let m = FrameMarking::parse(&[0b1101_1010, 3, 9]).unwrap();
        assert!(m.start && m.end && !m.independent && m.discardable && m.base_layer_sync);
        assert_eq!((m.tid, m.lid, m.tl0picidx), (2, Some(3), Some(9)));
        assert_eq!(m.to_bytes().as_ref(), &[0b1101_1010, 3, 9]);
        assert!(FrameMarking::parse(&[]).is_err());
        assert!(FrameMarking::parse(&[0; 5]).is_err());
        assert!(FrameMarking::parse(&[0; 4]).is_ok());
    }

    #[test]
    fn malformed_blocks_are_errors() {
        // Truncated vi64, a byte string longer than the block, a bad marking,
        // a zero timescale, a type overflow.
        for bad in [
            &[0x10, 0x80][..],
            &[0x09, 0x05, 1][..],
            &[0x09, 0x00][..],
            &[0x08, 0x00][..],
            &[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x01, 0,
            ][..],
        ] {
            assert!(
                LocProperties::decode(&Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}
