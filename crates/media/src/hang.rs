//! moq-dev's hang format (draft-lcurley-moq-hang, as moq-dev's `hang` crate
//! 0.21 and `@moq/watch` read it): a `catalog.json` track describing the
//! renditions, and one track per rendition whose objects are frames.
//!
//! - Catalog: one JSON object per catalog version, `{"video": {"renditions":
//!   {NAME: config}}, "audio": {"renditions": {NAME: config}}}`, where each
//!   config carries a WebCodecs `codec`, a hex `description`, sizes or rates,
//!   and a `container`. Rendition names are the MoQT track names. Fields this
//!   module does not know are kept, so a catalog passes through unchanged.
//! - Container `legacy`: an object is a QUIC varint (RFC 9000 §16, not MoQT's
//!   vi64) presentation timestamp in microseconds, then the codec payload.
//! - Container `cmaf`: an object is a `moof` + `mdat` fragment; the
//!   rendition's init segment is in the catalog (base64).
//! - Groups: one per GOP, starting at a keyframe.
//!
//! Written here rather than taken from the `hang` crate because that crate
//! is bound to moq-dev's own transport (`moq-net`); the JSON is small.

use std::collections::BTreeMap;

use base64::Engine;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, TrackInfo, TrackKind};

/// The catalog's track name.
pub const CATALOG_TRACK: &str = "catalog.json";

/// The MoQ epoch (2020-01-01T00:00:00Z) in µs since the Unix epoch: the
/// origin of the catalog's `clock.wall`.
pub const MOQ_EPOCH_UNIX_MICROS: u64 = 1_577_836_800_000_000;

/// Largest catalog accepted, in bytes: renditions are few and small.
pub const MAX_CATALOG: usize = 1 << 20;

/// A hang catalog.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    /// Video renditions.
    #[serde(default)]
    pub video: Section,
    /// Audio renditions.
    #[serde(default)]
    pub audio: Section,
    /// Everything else (`json`, `binary`, `clock`, …), kept verbatim.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The renditions of one kind, by track name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Section {
    /// Rendition configs by track name.
    #[serde(default)]
    pub renditions: BTreeMap<String, Rendition>,
    /// Other fields (`display`, `rotation`, …).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One rendition's decoder configuration (video or audio).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rendition {
    /// WebCodecs codec string.
    pub codec: String,
    /// WebCodecs `description`, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Video: coded width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coded_width: Option<u32>,
    /// Video: coded height.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coded_height: Option<u32>,
    /// Video: frames per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framerate: Option<f64>,
    /// Audio: samples per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u32>,
    /// Audio: channels.
    #[serde(
        default,
        rename = "numberOfChannels",
        skip_serializing_if = "Option::is_none"
    )]
    pub channels: Option<u32>,
    /// Bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bitrate: Option<u64>,
    /// How objects are packaged.
    #[serde(default)]
    pub container: Container,
    /// Other fields (`jitter`, `delay`, `label`, …).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// How a rendition's objects are packaged.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Container {
    /// Timestamp varint + codec payload.
    #[default]
    Legacy,
    /// CMAF fragments; the init segment.
    Cmaf {
        /// `ftyp` + `moov` for this rendition alone.
        init: Bytes,
    },
    /// Anything else, verbatim (so it can be reported by name).
    Other(Map<String, Value>),
}

impl Container {
    /// The `kind` as written in the catalog.
    pub fn kind(&self) -> String {
        match self {
            Container::Legacy => "legacy".into(),
            Container::Cmaf { .. } => "cmaf".into(),
            Container::Other(m) => m
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("(none)")
                .to_string(),
        }
    }
}

impl Serialize for Container {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = match self {
            Container::Legacy => serde_json::json!({"kind": "legacy"}),
            Container::Cmaf { init } => serde_json::json!({
                "kind": "cmaf",
                "init": base64::engine::general_purpose::STANDARD.encode(init),
            }),
            Container::Other(m) => Value::Object(m.clone()),
        };
        v.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Container {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = Map::deserialize(d)?;
        match m.get("kind").and_then(Value::as_str) {
            Some("legacy") => Ok(Container::Legacy),
            Some("cmaf") => {
                let init = m
                    .get("init")
                    .and_then(Value::as_str)
                    .ok_or_else(|| serde::de::Error::custom("cmaf container without init"))?;
                let init = base64::engine::general_purpose::STANDARD
                    .decode(init)
                    .map_err(serde::de::Error::custom)?;
                Ok(Container::Cmaf { init: init.into() })
            }
            _ => Ok(Container::Other(m)),
        }
    }
}

impl Catalog {
    /// Parses a catalog object.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        if data.len() > MAX_CATALOG {
            return Err(Error::TooLarge {
                what: "catalog".into(),
                size: data.len() as u64,
                limit: MAX_CATALOG as u64,
            });
        }
        serde_json::from_slice(data).map_err(|e| Error::malformed("catalog.json", e))
    }

    /// The catalog as its JSON object payload.
    pub fn to_bytes(&self) -> Bytes {
        // Serialising maps of strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default().into()
    }

    /// Sets the broadcast's clock: PTS zero was `wall` µs after the MoQ
    /// epoch (`{"clock": {"wall": …, "timescale": 1000000}}`, as hang 0.21
    /// writes it), so a player can tell how far behind live it is.
    pub fn set_clock(&mut self, wall: u64) {
        self.other.insert(
            "clock".into(),
            serde_json::json!({"wall": wall, "timescale": 1_000_000}),
        );
    }

    /// The Unix time in µs of PTS zero, from the catalog's clock.
    pub fn clock_unix_micros(&self) -> Option<u64> {
        let c = self.other.get("clock")?;
        let wall = c.get("wall")?.as_u64()?;
        let scale = c
            .get("timescale")
            .and_then(Value::as_u64)
            .unwrap_or(1_000_000);
        if scale == 0 {
            return None;
        }
        let us = u128::from(wall) * 1_000_000 / u128::from(scale);
        u64::try_from(us).ok()?.checked_add(MOQ_EPOCH_UNIX_MICROS)
    }

    /// Adds a rendition for `track` under `name`.
    pub fn insert(&mut self, name: &str, track: &TrackInfo, container: Container) {
        let r = Rendition::from_track(track, container);
        let section = match track.kind {
            TrackKind::Video => &mut self.video,
            TrackKind::Audio => &mut self.audio,
        };
        section.renditions.insert(name.to_string(), r);
    }

    /// Every rendition: (kind, track name, config), video first.
    pub fn renditions(&self) -> impl Iterator<Item = (TrackKind, &String, &Rendition)> {
        let v = self
            .video
            .renditions
            .iter()
            .map(|(n, r)| (TrackKind::Video, n, r));
        let a = self
            .audio
            .renditions
            .iter()
            .map(|(n, r)| (TrackKind::Audio, n, r));
        v.chain(a)
    }
}

impl Rendition {
    /// The config a subscriber needs to decode `t`.
    pub fn from_track(t: &TrackInfo, container: Container) -> Self {
        let video = t.kind == TrackKind::Video;
        Rendition {
            codec: t.codec.clone(),
            description: t.description.as_ref().map(|d| hex(d)),
            coded_width: video.then_some(t.width),
            coded_height: video.then_some(t.height),
            framerate: None,
            sample_rate: (!video).then_some(t.sample_rate),
            channels: (!video).then_some(t.channels),
            bitrate: None,
            container,
            other: Map::new(),
        }
    }

    /// The track this rendition describes, for a muxer or decoder. Legacy
    /// timestamps are microseconds; the timescale is the one an fMP4 of it
    /// would use.
    pub fn to_track(&self, id: u32, kind: TrackKind) -> Result<TrackInfo, Error> {
        let description = match &self.description {
            Some(h) => Some(unhex(h)?),
            None => None,
        };
        let mut t = match kind {
            TrackKind::Video => TrackInfo::video(
                id,
                &self.codec,
                self.coded_width.unwrap_or(0),
                self.coded_height.unwrap_or(0),
            ),
            TrackKind::Audio => TrackInfo::audio(
                id,
                &self.codec,
                self.sample_rate.unwrap_or(48_000),
                self.channels.unwrap_or(2),
            ),
        };
        t.description = description;
        Ok(t)
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// Bytes of a hex string.
pub fn unhex(s: &str) -> Result<Bytes, Error> {
    let s = s.as_bytes();
    if s.len() % 2 != 0 {
        return Err(Error::malformed("catalog", "odd-length hex description"));
    }
    let nib = |c: u8| -> Result<u8, Error> {
        (c as char)
            .to_digit(16)
            .map(|d| d as u8)
            .ok_or_else(|| Error::malformed("catalog", "non-hex description"))
    };
    s.chunks(2)
        .map(|p| Ok(nib(p[0])? << 4 | nib(p[1])?))
        .collect::<Result<Vec<u8>, Error>>()
        .map(Bytes::from)
}

/// Encodes a legacy-container object: the timestamp varint, then `payload`.
pub fn encode_legacy(pts_micros: u64, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + payload.len());
    put_quic_varint(&mut b, pts_micros.min((1 << 62) - 1));
    b.put_slice(payload);
    b.freeze()
}

/// Splits a legacy-container object into (timestamp µs, payload), without copying.
pub fn decode_legacy(object: &Bytes) -> Result<(u64, Bytes), Error> {
    let mut b = object.as_ref();
    let ts = get_quic_varint(&mut b)
        .ok_or_else(|| Error::malformed("hang frame", "truncated timestamp"))?;
    let used = object.len() - b.len();
    Ok((ts, object.slice(used..)))
}

/// Writes `v` (< 2^62) as a QUIC variable-length integer.
pub fn put_quic_varint(b: &mut impl BufMut, v: u64) {
    if v < 1 << 6 {
        b.put_u8(v as u8);
    } else if v < 1 << 14 {
        b.put_u16(0x4000 | v as u16);
    } else if v < 1 << 30 {
        b.put_u32(0x8000_0000 | v as u32);
    } else {
        b.put_u64(0xc000_0000_0000_0000 | v);
    }
}

/// Reads a QUIC variable-length integer, `None` if truncated.
pub fn get_quic_varint(b: &mut &[u8]) -> Option<u64> {
    let first = *b.first()?;
    let len = 1usize << (first >> 6);
    if b.len() < len {
        return None;
    }
    let mut v = u64::from(first & 0x3f);
    for i in 1..len {
        v = (v << 8) | u64::from(b[i]);
    }
    b.advance(len);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalog of moq-dev's `hang` crate's own `simple` test, verbatim.
    const HANG_SIMPLE: &str = r#"{"video":{"renditions":{"video":{"codec":"avc1.64001f","codedWidth":1280,"codedHeight":720,"bitrate":6000000,"framerate":30.0,"container":{"kind":"legacy"}}}},"audio":{"renditions":{"audio":{"codec":"opus","sampleRate":48000,"numberOfChannels":2,"bitrate":128000,"container":{"kind":"legacy"}}}}}"#;

    #[test]
    fn reads_and_writes_moq_devs_catalog() {
        let c = Catalog::parse(HANG_SIMPLE.as_bytes()).unwrap();
        let v = &c.video.renditions["video"];
        assert_eq!(v.codec, "avc1.64001f");
        assert_eq!((v.coded_width, v.coded_height), (Some(1280), Some(720)));
        assert_eq!(v.framerate, Some(30.0));
        let a = &c.audio.renditions["audio"];
        assert_eq!((a.sample_rate, a.channels), (Some(48_000), Some(2)));
        assert_eq!(a.container, Container::Legacy);
        let back: Value = serde_json::from_slice(&c.to_bytes()).unwrap();
        let orig: Value = serde_json::from_str(HANG_SIMPLE).unwrap();
        assert_eq!(back, orig);
    }

    #[test]
    fn unknown_fields_and_containers_pass_through() {
        let j = r#"{"video":{"renditions":{"v":{"codec":"vp09.00.10.08","container":{"kind":"mkv","x":1},"jitter":30}},"display":{"width":1,"height":2}},"audio":{"renditions":{}},"clock":{"track":"clock"}}"#;
        let c = Catalog::parse(j.as_bytes()).unwrap();
        assert_eq!(c.video.renditions["v"].container.kind(), "mkv");
        let back: Value = serde_json::from_slice(&c.to_bytes()).unwrap();
        let orig: Value = serde_json::from_str(j).unwrap();
        assert_eq!(back, orig);
    }

    #[test]
    fn cmaf_init_is_base64() {
        let mut c = Catalog::default();
        let t = TrackInfo::audio(1, "opus", 48_000, 2);
        c.insert(
            "a",
            &t,
            Container::Cmaf {
                init: Bytes::from_static(b"\0\x01init"),
            },
        );
        let s = String::from_utf8(c.to_bytes().to_vec()).unwrap();
        assert!(
            s.contains(r#""container":{"init":"AAFpbml0","kind":"cmaf"}"#),
            "{s}"
        );
        assert_eq!(Catalog::parse(s.as_bytes()).unwrap(), c);
    }

    #[test]
    fn clock_is_hangs_wall_and_timescale() {
        let mut c = Catalog::default();
        c.set_clock(5_000_000);
        let s = String::from_utf8(c.to_bytes().to_vec()).unwrap();
        assert!(
            s.contains(r#""clock":{"timescale":1000000,"wall":5000000}"#),
            "{s}"
        );
        assert_eq!(
            c.clock_unix_micros(),
            Some(MOQ_EPOCH_UNIX_MICROS + 5_000_000)
        );
        // hang's own form with a millisecond timescale.
        let c = Catalog::parse(br#"{"clock":{"wall":7,"timescale":1000}}"#).unwrap();
        assert_eq!(c.clock_unix_micros(), Some(MOQ_EPOCH_UNIX_MICROS + 7_000));
        assert_eq!(
            Catalog::parse(br#"{"clock":{"wall":7,"timescale":0}}"#)
                .unwrap()
                .clock_unix_micros(),
            None
        );
    }

    #[test]
    fn bad_catalogs_are_errors() {
        assert!(Catalog::parse(b"{").is_err());
        assert!(Catalog::parse(br#"{"video":{"renditions":{"v":{}}}}"#).is_err());
        assert!(Catalog::parse(&vec![b' '; MAX_CATALOG + 1]).is_err());
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
        assert_eq!(unhex("01fF").unwrap().as_ref(), &[1, 255]);
    }

    #[test]
    fn legacy_frames_round_trip() {
        for ts in [0u64, 63, 64, 16_383, 16_384, 1 << 30, (1 << 62) - 1] {
            let o = encode_legacy(ts, b"payload");
            let (t, p) = decode_legacy(&o).unwrap();
            assert_eq!((t, p.as_ref()), (ts, &b"payload"[..]));
        }
        // RFC 9000 A.1 examples.
        let mut b = &[0x9d, 0x7f, 0x3e, 0x7d][..];
        assert_eq!(get_quic_varint(&mut b), Some(494_878_333));
        let mut b = &[0x7b, 0xbd][..];
        assert_eq!(get_quic_varint(&mut b), Some(15_293));
        assert!(decode_legacy(&Bytes::from_static(&[0x80, 0])).is_err());
        assert!(decode_legacy(&Bytes::new()).is_err());
    }
}
