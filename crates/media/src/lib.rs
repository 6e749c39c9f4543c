//! # quichub-media
//!
//! Media packaging, sans-IO: bytes in, frames and packaged objects out. No
//! sockets, no clocks, no tasks; `quichub_client::media` (behind `quichub pub
//! --broadcast` and `quichub sub --broadcast`) moves the bytes.
//!
//! - [`fmp4`]: an incremental fragmented-MP4 (CMAF) demuxer: an init segment
//!   and `moof`+`mdat` fragments in, [`TrackInfo`]s and [`Frame`]s out.
//! - [`ts`]: an incremental MPEG-TS demuxer with the same output.
//! - [`codec`]: decoder configurations (`avcC`, `hvcC`, `esds`, `dOps`) to
//!   WebCodecs codec strings, and back to ISO BMFF sample entries.
//! - [`mux`]: a fragmented-MP4 muxer (init segment, one fragment per frame),
//!   for `sub --output` and for CMAF packaging.
//! - [`hang`]: moq-dev's hang format (catalog and the "legacy" container).
//! - [`msf`]: the IETF MSF catalog (draft-ietf-moq-msf-01) with CMSF's
//!   `cmaf` packaging (draft-ietf-moq-cmsf-01): tracks, init data, delta
//!   updates.
//! - [`loc`]: LOC (draft-ietf-moq-loc-04) object properties: timestamp,
//!   timescale, video/audio config, frame marking, audio level.
//! - [`broadcast`]: a publisher's decisions: track names, the catalog, and
//!   each frame's group, subgroup, object ID, priority and packaging; pacing.
//! - [`playback`]: a subscriber's: the catalog as it evolves, the renditions
//!   chosen, their objects back to timed frames.
//! - [`reorder`]: objects back in (Group, Object ID) order across streams.
//!
//! The box layer is the `mp4-atom` crate; this crate adds the parts a live
//! relay needs that it does not have: incremental parsing with bounded
//! buffering, and the MoQ catalogs.
#![warn(missing_docs)]

pub mod broadcast;
pub mod codec;
pub mod fmp4;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
pub mod hang;
pub mod loc;
pub mod msf;
pub mod mux;
pub mod playback;
pub mod reorder;
pub mod ts;

use bytes::Bytes;

/// What a track carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrackKind {
    /// Pictures.
    Video,
    /// Sound.
    Audio,
}

/// One elementary stream of the input, as a decoder needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct TrackInfo {
    /// The container's track ID (fMP4 `track_ID`, MPEG-TS PID).
    pub id: u32,
    /// Video or audio.
    pub kind: TrackKind,
    /// The WebCodecs codec string (`avc1.64001f`, `hvc1.1.6.L93.B0`,
    /// `mp4a.40.2`, `opus`).
    pub codec: String,
    /// The decoder configuration record WebCodecs calls `description`: the
    /// body of `avcC` / `hvcC`, the AudioSpecificConfig of AAC, the OpusHead
    /// of Opus. `None` where the codec carries its configuration in band.
    pub description: Option<Bytes>,
    /// Units per second of this track's timestamps in the input.
    pub timescale: u32,
    /// Coded width in pixels (video).
    pub width: u32,
    /// Coded height in pixels (video).
    pub height: u32,
    /// Samples per second (audio).
    pub sample_rate: u32,
    /// Channels (audio).
    pub channels: u32,
    /// Bytes per NAL length prefix in frames (H.264/H.265 in AVCC form), 4
    /// when not given.
    pub nal_length_size: u8,
}

impl TrackInfo {
    /// A video track with the given codec and size; the rest defaulted.
    pub fn video(id: u32, codec: &str, width: u32, height: u32) -> Self {
        Self {
            id,
            kind: TrackKind::Video,
            codec: codec.to_string(),
            description: None,
            timescale: 90_000,
            width,
            height,
            sample_rate: 0,
            channels: 0,
            nal_length_size: 4,
        }
    }

    /// An audio track with the given codec, rate and channels; the rest defaulted.
    pub fn audio(id: u32, codec: &str, sample_rate: u32, channels: u32) -> Self {
        Self {
            id,
            kind: TrackKind::Audio,
            codec: codec.to_string(),
            description: None,
            timescale: sample_rate.max(1),
            width: 0,
            height: 0,
            sample_rate,
            channels,
            nal_length_size: 4,
        }
    }

    /// `640x360` for video, `48000 Hz, 2 ch` for audio.
    pub fn describe(&self) -> String {
        match self.kind {
            TrackKind::Video => format!("{}x{}", self.width, self.height),
            TrackKind::Audio => format!("{} Hz, {} ch", self.sample_rate, self.channels),
        }
    }
}

/// One coded frame (an access unit) of a track.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The [`TrackInfo::id`] this frame belongs to.
    pub track: u32,
    /// Presentation time in microseconds.
    pub pts: i64,
    /// Decode time in microseconds (frames arrive in decode order).
    pub dts: i64,
    /// Duration in microseconds (0 when unknown).
    pub duration: u32,
    /// A random access point: decoding can start here.
    pub keyframe: bool,
    /// No other frame references this one (a non-reference B frame): it can
    /// be dropped without breaking the decoding of the rest.
    pub disposable: bool,
    /// The codec payload (AVCC length-prefixed NAL units for H.264/H.265).
    pub data: Bytes,
}

/// What a demuxer produces.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The input's tracks, before any of their frames. A later `Tracks`
    /// replaces the set (a new init segment, a new PMT).
    Tracks(Vec<TrackInfo>),
    /// The next frame, in decode order within its track.
    Frame(Frame),
}

/// Why input was refused. Every variant names what was wrong so the user can
/// fix the encoder's command line.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Error {
    /// A box or packet is malformed.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// The structure (`moov`, `moof`, `PES`, …).
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// A box declares more bytes than the demuxer is allowed to buffer.
    #[error("{what} of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The structure.
        what: String,
        /// Its declared size.
        size: u64,
        /// The configured limit.
        limit: u64,
    },
    /// A codec this crate cannot describe to a decoder.
    #[error("unsupported codec {0}")]
    UnsupportedCodec(String),
    /// Frames arrived before the tracks were described.
    #[error("{0} before the init segment")]
    NoInit(&'static str),
    /// A broadcast this crate cannot play: what is missing or unsupported.
    #[error("{0}")]
    Unplayable(String),
    /// The input is not the container it was opened as.
    #[error("not {expected}: {detail}")]
    WrongFormat {
        /// The format that was expected.
        expected: &'static str,
        /// What was found instead.
        detail: String,
    },
}

impl Error {
    pub(crate) fn malformed(what: &'static str, detail: impl std::fmt::Display) -> Self {
        Error::Malformed {
            what,
            detail: detail.to_string(),
        }
    }
}

/// Converts `t` in `timescale` units to microseconds, saturating.
pub fn to_micros(t: i64, timescale: u32) -> i64 {
    if timescale == 0 {
        return 0;
    }
    let v = div_round((t as i128) * 1_000_000, timescale as i128);
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// `n / d` rounded to the nearest integer (halves away from zero), `d > 0`.
pub(crate) fn div_round(n: i128, d: i128) -> i128 {
    if n >= 0 {
        (n + d / 2) / d
    } else {
        (n - d / 2) / d
    }
}

/// Converts `us` microseconds to `timescale` units, saturating.
pub fn from_micros(us: i64, timescale: u32) -> i64 {
    let v = div_round((us as i128) * timescale as i128, 1_000_000);
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// An incremental demuxer: feed it bytes as they arrive, take events out.
///
/// Sans-IO: it never blocks and never reads; a caller loops `push` then
/// `next` until `Ok(None)`, and calls `end` at end of input so the last
/// buffered frame comes out.
pub trait Demuxer {
    /// Appends input bytes.
    fn push(&mut self, data: &[u8]);
    /// The next event, `Ok(None)` when more input is needed (or, after
    /// [`Demuxer::end`], when everything has been produced).
    fn next(&mut self) -> Result<Option<Event>, Error>;
    /// Marks the end of the input: frames held back waiting for more bytes
    /// are produced; a truncated tail is an error from the next `next`.
    fn end(&mut self);
}

/// Limits on what a demuxer buffers, against hostile or broken input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest box (or PES packet) buffered whole, in bytes. An `mdat` or
    /// `moof` claiming more is refused before anything is read into memory.
    pub max_box: u64,
    /// Most tracks an input may declare.
    pub max_tracks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // A 4K keyframe at 50 Mbit/s is a few MB; 64 MiB leaves headroom
            // for a fragment of several frames without letting a 1 GB length
            // field allocate.
            max_box: 64 << 20,
            max_tracks: 16,
        }
    }
}
