//! The subscriber's side of a broadcast, sans-IO: the catalog as it
//! evolves (hang's `catalog.json` or MSF's `catalog`), the renditions chosen
//! from it, and each rendition's objects turned back into timed frames for
//! the fMP4 muxer. The client's `media::subscribe` moves the bytes.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::codec::sample_entry;
use crate::fmp4::Fmp4Demuxer;
use crate::hang::{self, Container};
use crate::loc::LocProperties;
use crate::msf::{self, CatalogObject, Packaging};
use crate::mux::{init_segment, Fragmenter};
use crate::{Demuxer, Error, Event, Frame, TrackInfo, TrackKind};

/// Which catalog a broadcast has.
#[derive(Clone, Debug)]
pub enum AnyCatalog {
    /// moq-dev's hang `catalog.json`.
    Hang(hang::Catalog),
    /// IETF MSF `catalog`.
    Msf(msf::Catalog),
}

impl AnyCatalog {
    /// Reads one catalog object, in track order, into the current catalog:
    /// hang's latest object replaces it; for MSF an independent catalog
    /// replaces it and a delta update is applied to it.
    pub fn read(cur: &mut Option<AnyCatalog>, is_msf: bool, payload: &[u8]) -> Result<(), Error> {
        if !is_msf {
            *cur = Some(AnyCatalog::Hang(hang::Catalog::parse(payload)?));
            return Ok(());
        }
        match CatalogObject::parse(payload)? {
            CatalogObject::Independent(c) => *cur = Some(AnyCatalog::Msf(c)),
            CatalogObject::Delta(d) => {
                // A delta before any independent catalog is ignored (§Catalog:
                // updates before the group's first object do not count).
                if let Some(AnyCatalog::Msf(c)) = cur {
                    c.apply(&d)?
                }
            }
        }
        Ok(())
    }

    /// The names of the tracks it lists.
    pub fn track_names(&self) -> Vec<String> {
        match self {
            AnyCatalog::Msf(c) => c.tracks.iter().map(|t| t.name.clone()).collect(),
            AnyCatalog::Hang(c) => c.renditions().map(|(_, n, _)| n.clone()).collect(),
        }
    }

    /// The renditions to play: `video` / `audio` by name (`none` for
    /// neither), else the first of each kind the catalog lists that this
    /// crate can decode.
    pub fn choose(&self, video: Option<&str>, audio: Option<&str>) -> Result<Vec<Chosen>, Error> {
        match self {
            AnyCatalog::Hang(c) => choose_hang(c, video, audio),
            AnyCatalog::Msf(c) => choose_msf(c, video, audio),
        }
    }
}

/// What a catalog update that arrived during playback changed.
#[derive(Clone, Debug, PartialEq)]
pub enum CatalogChange {
    /// It could not be read, and was skipped.
    Ignored(String),
    /// The broadcast is over (MSF's `isComplete`).
    Complete,
    /// The list of tracks is now this.
    Tracks(Vec<String>),
    /// Nothing that playback shows.
    None,
}

/// Applies a catalog update that arrived during playback and says what it
/// changed. The tracks being played stay as they are (a new configuration
/// would need a new init segment); a bad update is reported and skipped.
pub fn catalog_update(cur: &mut Option<AnyCatalog>, is_msf: bool, payload: &[u8]) -> CatalogChange {
    let names = |c: &Option<AnyCatalog>| c.as_ref().map_or_else(Vec::new, AnyCatalog::track_names);
    let before = names(cur);
    if let Err(e) = AnyCatalog::read(cur, is_msf, payload) {
        return CatalogChange::Ignored(e.to_string());
    }
    let after = names(cur);
    if let Some(AnyCatalog::Msf(c)) = cur {
        if c.is_complete {
            return CatalogChange::Complete;
        }
    }
    if before != after {
        CatalogChange::Tracks(after)
    } else {
        CatalogChange::None
    }
}

/// How a subscribed rendition's objects are packaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// hang's legacy container: timestamp varint + frame.
    Legacy,
    /// CMAF chunks (hang `cmaf`, MSF `cmaf`).
    Cmaf,
    /// LOC: the frame, with metadata in object properties.
    Loc,
}

/// A rendition chosen from the catalog: its track name and how to decode it.
#[derive(Clone, Debug)]
pub struct Chosen {
    /// The track's name in the broadcast.
    pub name: String,
    /// What the catalog says of it.
    pub info: TrackInfo,
    /// How its objects are packaged.
    pub packing: Packing,
    /// The init segment of a CMAF rendition.
    pub init: Option<Bytes>,
    /// Frames per second, if the catalog says.
    pub framerate: Option<f64>,
}

fn unplayable(msg: String) -> Error {
    Error::Unplayable(msg)
}

/// The renditions to play from a hang catalog.
fn choose_hang(
    c: &hang::Catalog,
    video: Option<&str>,
    audio: Option<&str>,
) -> Result<Vec<Chosen>, Error> {
    let pick = |want: Option<&str>, section: &hang::Section| -> Option<(String, hang::Rendition)> {
        match want {
            Some("none") => None,
            Some(n) => section
                .renditions
                .get(n)
                .map(|r| (n.to_string(), r.clone())),
            None => section
                .renditions
                .iter()
                .next()
                .map(|(n, r)| (n.clone(), r.clone())),
        }
    };
    let mut out = Vec::new();
    for (kind, picked) in [
        (TrackKind::Video, pick(video, &c.video)),
        (TrackKind::Audio, pick(audio, &c.audio)),
    ] {
        let Some((name, r)) = picked else { continue };
        let (info, packing, init) = match &r.container {
            Container::Legacy => (r.to_track(0, kind)?, Packing::Legacy, None),
            Container::Cmaf { init } => (r.to_track(0, kind)?, Packing::Cmaf, Some(init.clone())),
            other => {
                return Err(unplayable(format!(
                    "rendition {name}: container {:?} is not supported (legacy and cmaf are)",
                    other.kind()
                )))
            }
        };
        out.push(Chosen {
            name,
            info,
            packing,
            init,
            framerate: r.framerate,
        });
    }
    if out.is_empty() {
        return Err(unplayable(format!(
            "the catalog has no rendition to play (video: {:?}, audio: {:?})",
            c.video.renditions.keys().collect::<Vec<_>>(),
            c.audio.renditions.keys().collect::<Vec<_>>()
        )));
    }
    Ok(out)
}

/// The renditions to play from an MSF catalog: `video` / `audio` by
/// track name, else the first video and the first audio track in the
/// catalog's own namespace whose packaging is `loc` or `cmaf`.
fn choose_msf(
    c: &msf::Catalog,
    video: Option<&str>,
    audio: Option<&str>,
) -> Result<Vec<Chosen>, Error> {
    let playable = |t: &&msf::Track| {
        t.namespace.is_none() && matches!(t.packaging, Some(Packaging::Loc | Packaging::Cmaf))
    };
    let pick = |want: Option<&str>, kind: TrackKind| -> Option<&msf::Track> {
        match want {
            Some("none") => None,
            Some(n) => c.track(n),
            None => c
                .tracks
                .iter()
                .filter(playable)
                .find(|t| t.kind() == Some(kind)),
        }
    };
    let mut out = Vec::new();
    for kind in [TrackKind::Video, TrackKind::Audio] {
        let want = match kind {
            TrackKind::Video => video,
            TrackKind::Audio => audio,
        };
        let Some(t) = pick(want, kind) else { continue };
        let (packing, init) = match &t.packaging {
            Some(Packaging::Loc) => (Packing::Loc, None),
            Some(Packaging::Cmaf) => match c.init_data(t)? {
                Some(init) => (Packing::Cmaf, Some(init)),
                None => {
                    return Err(unplayable(format!(
                        "track {}: cmaf packaging without init data",
                        t.name
                    )))
                }
            },
            other => {
                return Err(unplayable(format!(
                    "track {}: packaging {:?} is not supported (loc and cmaf are)",
                    t.name,
                    other.as_ref().map(Packaging::as_str)
                )))
            }
        };
        out.push(Chosen {
            name: t.name.clone(),
            info: t.to_info(0)?,
            packing,
            init,
            framerate: t.framerate,
        });
    }
    if out.is_empty() {
        return Err(unplayable(format!(
            "the catalog has no track to play: {:?}",
            c.tracks
                .iter()
                .map(|t| (t.name.as_str(), t.packaging.as_ref().map(Packaging::as_str)))
                .collect::<Vec<_>>()
        )));
    }
    Ok(out)
}

/// One chosen rendition's objects back to frames with decode times, as
/// the fMP4 muxer takes them.
#[derive(Debug)]
pub struct Decoder {
    info: TrackInfo,
    packing: Packing,
    /// For CMAF objects: a demuxer primed with the init segment.
    cmaf: Option<Fmp4Demuxer>,
    /// Synthesised decode times for legacy and LOC video (µs): the previous one.
    last_dts: Option<i64>,
    frame_us: i64,
    waiting_keyframe: bool,
    /// Whether `info` says enough to write the init segment. LOC tracks
    /// learn their decoder configuration from the objects' Video/Audio
    /// Config properties, so output waits for it.
    configured: bool,
    /// `Some(h265)` for H.264/H.265 legacy frames in Annex B (see
    /// [`Decoder::unpack_annexb`]).
    annexb: Option<bool>,
}

impl Decoder {
    /// A decoder for `c`, whose frames carry track ID `id` in the output.
    pub fn new(c: &Chosen, id: u32) -> Result<Self, Error> {
        let (info, cmaf) = match (&c.packing, &c.init) {
            (Packing::Cmaf, Some(init)) => {
                let mut d = Fmp4Demuxer::default();
                d.push(init);
                let t = match d.next() {
                    Ok(Some(Event::Tracks(t))) if !t.is_empty() => t[0].clone(),
                    other => {
                        return Err(unplayable(format!(
                            "rendition {}: bad init segment ({other:?})",
                            c.name
                        )))
                    }
                };
                (TrackInfo { id, ..t }, Some(d))
            }
            _ => {
                // Legacy and LOC timestamps are µs; the output's timescale
                // is the one an fMP4 of the track would have.
                let mut t = TrackInfo {
                    id,
                    ..c.info.clone()
                };
                t.timescale = match t.kind {
                    TrackKind::Video => 90_000,
                    TrackKind::Audio => t.sample_rate.max(1),
                };
                (t, None)
            }
        };
        let frame_us = c
            .framerate
            .filter(|f| *f > 0.0)
            // A catalog's framerate is peer input: 1 to 1000 frames per second.
            .map_or(33_333, |f| (1e6 / f).clamp(1_000.0, 1_000_000.0) as i64);
        let configured = sample_entry(&info).is_ok();
        // A legacy H.264/H.265 rendition without a `description` is Annex B
        // with its parameter sets in band, as WebCodecs reads such a catalog
        // (`@moq/publish` encodes `avc: {format: "annexb"}` and writes none).
        let family = info.codec.split('.').next().unwrap_or("");
        let annexb = (c.packing == Packing::Legacy && info.description.is_none())
            .then_some(family)
            .and_then(|f| match f {
                "avc1" | "avc3" => Some(false),
                "hvc1" | "hev1" => Some(true),
                _ => None,
            });
        Ok(Self {
            info,
            packing: c.packing,
            cmaf,
            last_dts: None,
            frame_us,
            waiting_keyframe: true,
            configured,
            annexb,
        })
    }

    /// The output track (its decoder configuration once known).
    pub fn info(&self) -> &TrackInfo {
        &self.info
    }

    /// Whether the decoder configuration is known, so the init segment
    /// can be written.
    pub fn is_configured(&self) -> bool {
        self.configured
    }

    /// Turns one object (its payload and property block), in order, into
    /// frames with decode times; nothing before the first keyframe.
    pub fn decode(
        &mut self,
        starts_group: bool,
        payload: Bytes,
        properties: &Bytes,
    ) -> Result<Vec<Frame>, Error> {
        let mut frames = Vec::new();
        match self.packing {
            Packing::Cmaf => {
                if let Some(d) = self.cmaf.as_mut() {
                    d.push(&payload);
                    while let Some(ev) = d.next()? {
                        if let Event::Frame(f) = ev {
                            frames.push(Frame {
                                track: self.info.id,
                                ..f
                            });
                        }
                    }
                }
            }
            Packing::Legacy => {
                let (pts, mut data) = hang::decode_legacy(&payload)?;
                if let Some(h265) = self.annexb {
                    data = self.unpack_annexb(h265, &data)?;
                }
                let keyframe = starts_group || self.info.kind == TrackKind::Audio;
                frames.push(self.timed_frame(pts as i64, keyframe, data));
            }
            Packing::Loc => {
                let p = LocProperties::decode(properties)?;
                let pts = p
                    .pts_micros()
                    .ok_or_else(|| unplayable("LOC object without a Timestamp property".into()))?;
                // The frame marking's I bit says where decoding can start; a
                // publisher without it starts each group with a keyframe (MSF).
                let keyframe = match p.frame_marking {
                    Some(m) => m.independent,
                    None => starts_group || self.info.kind == TrackKind::Audio,
                };
                let config = match self.info.kind {
                    TrackKind::Video => p.video_config,
                    TrackKind::Audio => p.audio_config,
                };
                if let Some(c) = config {
                    if !self.configured {
                        self.info.description = Some(c);
                        self.configured = sample_entry(&self.info).is_ok();
                    }
                }
                frames.push(self.timed_frame(pts, keyframe, payload));
            }
        }
        // Nothing decodes before the first keyframe.
        if self.waiting_keyframe {
            if let Some(i) = frames.iter().position(|f| f.keyframe) {
                frames.drain(..i);
                self.waiting_keyframe = false;
            } else {
                frames.clear();
            }
        }
        Ok(frames)
    }

    /// An Annex B frame in the length-prefixed form fMP4 carries (4-byte
    /// lengths), without its parameter sets and access unit delimiters;
    /// the first complete set of parameter sets (VPS, SPS, PPS) makes the
    /// decoder configuration, as a catalog `description` would. Later sets
    /// are dropped too: the init segment is written once (as with a
    /// catalog's), so a change of resolution mid-stream is not followed.
    fn unpack_annexb(&mut self, h265: bool, frame: &[u8]) -> Result<Bytes, Error> {
        let (mut vps, mut sps, mut pps) = (Vec::new(), Vec::new(), Vec::new());
        let mut out = Vec::with_capacity(frame.len() + 16);
        for nal in crate::ts::annexb_nals(frame) {
            let kind = if h265 {
                match (nal[0] >> 1) & 0x3f {
                    32 => Some(&mut vps),
                    33 => Some(&mut sps),
                    34 => Some(&mut pps),
                    35 => continue,
                    _ => None,
                }
            } else {
                match nal[0] & 0x1f {
                    7 => Some(&mut sps),
                    8 => Some(&mut pps),
                    9 => continue,
                    _ => None,
                }
            };
            match kind {
                Some(sets) => sets.push(nal.to_vec()),
                None => {
                    out.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                    out.extend_from_slice(nal);
                }
            }
        }
        let complete = !sps.is_empty() && !pps.is_empty() && (!h265 || !vps.is_empty());
        if !self.configured && complete {
            let t = if h265 {
                crate::ts::hevc_track(self.info.id, &vps, &sps, &pps)?
            } else {
                crate::ts::avc_track(self.info.id, &sps, &pps)?
            };
            // The parameter sets say the codec and size exactly; the
            // catalog's may be rounder (`avc1` alone, no size).
            self.info.codec = t.codec;
            self.info.description = t.description;
            self.info.nal_length_size = 4;
            if self.info.width == 0 || self.info.height == 0 {
                (self.info.width, self.info.height) = (t.width, t.height);
            }
            self.configured = sample_entry(&self.info).is_ok();
        }
        Ok(Bytes::from(out))
    }

    /// A frame of a format that carries presentation times only (hang
    /// legacy, LOC). Decode times are made up: a frame's duration apart,
    /// starting two frames before the GOP's keyframe presents (room for B
    /// frames), re-anchored whenever a keyframe shows the estimate has
    /// drifted.
    fn timed_frame(&mut self, pts: i64, keyframe: bool, data: Bytes) -> Frame {
        let frame_us = self.frame_us;
        let dts = match (self.info.kind, self.last_dts) {
            (TrackKind::Audio, _) => pts,
            (TrackKind::Video, None) => pts.saturating_sub(2 * frame_us),
            (TrackKind::Video, Some(last)) => {
                // Timestamps are peer input: saturate rather than overflow.
                let next = last.saturating_add(frame_us);
                let anchor = pts.saturating_sub(2 * frame_us);
                if keyframe && next.abs_diff(anchor) > (frame_us / 2) as u64 {
                    anchor.max(last.saturating_add(1))
                } else {
                    next
                }
            }
        };
        self.last_dts = Some(dts);
        Frame {
            track: self.info.id,
            pts,
            dts,
            duration: if self.info.kind == TrackKind::Video {
                frame_us as u32
            } else {
                0
            },
            keyframe,
            disposable: false,
            data,
        }
    }
}

/// Frames held at most while waiting for decoder configurations.
const MAX_PENDING: usize = 1024;

/// The chosen renditions' frames as one fragmented MP4: the init segment
/// once every [`Decoder`] knows its configuration (frames wait for it until
/// then), then one fragment per frame, its times counted from the first
/// frame's decode time so that none is negative.
#[derive(Debug, Default)]
pub struct Muxer {
    fragmenter: Fragmenter,
    first_dts: Option<i64>,
    pending: VecDeque<(usize, Frame)>,
    started: bool,
}

impl Muxer {
    /// A muxer that has written nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues frame `f` of the `output`th rendition.
    pub fn push(&mut self, output: usize, f: Frame) {
        self.pending.push_back((output, f));
    }

    /// Whether the init segment has been given out.
    pub fn is_started(&self) -> bool {
        self.started
    }

    /// The init segment for the renditions `(name, decoder)`, once every
    /// decoder is configured; `None` before then (and after it was given
    /// out). An error when too many frames waited for a configuration.
    pub fn init(&mut self, decoders: &[(&str, &Decoder)]) -> Result<Option<Bytes>, Error> {
        if self.started {
            return Ok(None);
        }
        if decoders.iter().all(|(_, d)| d.is_configured()) {
            let tracks: Vec<TrackInfo> = decoders.iter().map(|(_, d)| d.info().clone()).collect();
            let init = init_segment(&tracks)?;
            self.started = true;
            return Ok(Some(init));
        }
        if self.pending.len() > MAX_PENDING {
            let missing: Vec<_> = decoders
                .iter()
                .filter(|(_, d)| !d.is_configured())
                .map(|(n, _)| *n)
                .collect();
            return Err(unplayable(format!(
                "no decoder configuration arrived for {missing:?}"
            )));
        }
        Ok(None)
    }

    /// The next fragment and the rendition whose frame it holds, once the
    /// init segment is out; `info(i)` is the `i`th rendition's output track.
    pub fn next_fragment<'a>(
        &mut self,
        info: impl Fn(usize) -> &'a TrackInfo,
    ) -> Result<Option<(usize, Bytes)>, Error> {
        if !self.started {
            return Ok(None);
        }
        let Some((i, mut f)) = self.pending.pop_front() else {
            return Ok(None);
        };
        let base = *self.first_dts.get_or_insert(f.dts);
        f.dts = f.dts.saturating_sub(base);
        f.pts = f.pts.saturating_sub(base);
        Ok(Some((i, self.fragmenter.fragment(info(i), &f)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loc::FrameMarking;

    /// A baseline H.264 `avcC` body (one SPS, one PPS).
    const AVCC: &[u8] = &[
        1, 0x42, 0xc0, 0x1e, 0xff, 0xe1, 0x00, 0x04, 0x67, 0x42, 0xc0, 0x1e, 0x01, 0x00, 0x02,
        0x68, 0xce,
    ];

    fn video() -> TrackInfo {
        let mut v = TrackInfo::video(1, "avc1.42c01e", 640, 360);
        v.description = Some(Bytes::from_static(AVCC));
        v
    }

    fn hang_catalog() -> hang::Catalog {
        let mut c = hang::Catalog::default();
        c.insert("video", &video(), Container::Legacy);
        c.insert(
            "audio",
            &TrackInfo::audio(2, "opus", 48_000, 2),
            Container::Legacy,
        );
        c
    }

    fn names(c: &[Chosen]) -> Vec<&str> {
        c.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn hang_renditions_are_chosen_by_name_or_first() {
        let c = AnyCatalog::Hang(hang_catalog());
        let both = c.choose(None, None).unwrap();
        assert_eq!(names(&both), ["video", "audio"]);
        assert_eq!(both[0].packing, Packing::Legacy);
        assert_eq!(names(&c.choose(Some("none"), None).unwrap()), ["audio"]);
        assert_eq!(names(&c.choose(None, Some("none")).unwrap()), ["video"]);
        let e = c.choose(Some("none"), Some("none")).unwrap_err();
        assert!(e.to_string().contains("no rendition to play"), "{e}");
        // A name the catalog lacks is no rendition.
        assert_eq!(names(&c.choose(Some("hd"), None).unwrap()), ["audio"]);
    }

    #[test]
    fn msf_tracks_need_a_packaging_this_crate_plays() {
        let mut m = msf::Catalog::new();
        m.push(
            msf::Track::from_info("video", &video(), Packaging::Loc),
            None,
        );
        let c = AnyCatalog::Msf(m.clone());
        let chosen = c.choose(None, None).unwrap();
        assert_eq!(names(&chosen), ["video"]);
        assert_eq!(chosen[0].packing, Packing::Loc);
        // CMAF without init data cannot be played.
        let mut cmaf = msf::Catalog::new();
        cmaf.push(
            msf::Track::from_info("video", &video(), Packaging::Cmaf),
            None,
        );
        let e = AnyCatalog::Msf(cmaf)
            .choose(Some("video"), None)
            .unwrap_err();
        assert!(e.to_string().contains("without init data"), "{e}");
        let e = AnyCatalog::Msf(msf::Catalog::new())
            .choose(None, None)
            .unwrap_err();
        assert!(e.to_string().contains("no track to play"), "{e}");
    }

    #[test]
    fn catalog_updates_say_what_changed() {
        let mut cur = None;
        let c = hang_catalog();
        AnyCatalog::read(&mut cur, false, &c.to_bytes()).unwrap();
        assert_eq!(
            catalog_update(&mut cur, false, &c.to_bytes()),
            CatalogChange::None
        );
        let mut fewer = hang::Catalog::default();
        fewer.insert("video", &video(), Container::Legacy);
        assert_eq!(
            catalog_update(&mut cur, false, &fewer.to_bytes()),
            CatalogChange::Tracks(vec!["video".into()])
        );
        assert!(matches!(
            catalog_update(&mut cur, false, b"{"),
            CatalogChange::Ignored(_)
        ));
        let mut m = None;
        let done = msf::Catalog {
            is_complete: true,
            ..msf::Catalog::new()
        };
        assert_eq!(
            catalog_update(&mut m, true, &done.to_bytes()),
            CatalogChange::Complete
        );
    }

    fn chosen(packing: Packing, info: TrackInfo) -> Chosen {
        Chosen {
            name: "video".into(),
            info,
            packing,
            init: None,
            framerate: Some(25.0),
        }
    }

    #[test]
    fn legacy_objects_become_frames_from_the_first_keyframe() {
        let mut d = Decoder::new(&chosen(Packing::Legacy, video()), 1).unwrap();
        assert!(d.is_configured());
        assert_eq!(d.info().timescale, 90_000);
        let none = Bytes::new();
        // Mid-group: nothing decodes yet.
        let obj = |pts: u64| hang::encode_legacy(pts, b"frame");
        assert!(d.decode(false, obj(0), &none).unwrap().is_empty());
        let f = d.decode(true, obj(80_000), &none).unwrap();
        assert_eq!(f.len(), 1);
        assert!(f[0].keyframe);
        // Decode times start two frames (40 ms at 25 fps) before the keyframe.
        assert_eq!((f[0].pts, f[0].dts, f[0].duration), (80_000, 0, 40_000));
        let f = d.decode(false, obj(200_000), &none).unwrap();
        assert_eq!((f[0].dts, f[0].keyframe), (40_000, false));
    }

    /// H.264 in hang's legacy container with no catalog `description`
    /// (what `@moq/publish` sends: WebCodecs' Annex B output): the first
    /// keyframe's SPS and PPS make the `avcC`, and frames leave in 4-byte
    /// length-prefixed form without parameter sets or delimiters.
    #[test]
    fn legacy_annex_b_frames_configure_the_track_from_their_parameter_sets() {
        use mp4_atom::Atom;
        fn unhex(s: &str) -> Vec<u8> {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        }
        // x264's SPS and PPS for 320x240, High profile, level 1.3.
        let sps = unhex("6764000dacd94141fb0110000003001000000303c0f1429960");
        let pps = unhex("68ebe3cb22c0");
        let mut info = TrackInfo::video(1, "avc1.640028", 0, 0);
        info.description = None;
        let mut d = Decoder::new(&chosen(Packing::Legacy, info), 1).unwrap();
        assert!(!d.is_configured());
        let annexb = |nals: &[&[u8]]| {
            let mut b = Vec::new();
            for (i, n) in nals.iter().enumerate() {
                // A 4-byte start code first, 3-byte ones after, as encoders do.
                b.extend_from_slice(if i == 0 {
                    &[0, 0, 0, 1][..]
                } else {
                    &[0, 0, 1]
                });
                b.extend_from_slice(n);
            }
            b
        };
        let none = Bytes::new();
        // A frame before any parameter set configures nothing.
        let delta: &[u8] = &[0x41, 0x9a, 0x01];
        let f = d
            .decode(false, hang::encode_legacy(0, &annexb(&[delta])), &none)
            .unwrap();
        assert!(f.is_empty() && !d.is_configured());
        let aud: &[u8] = &[0x09, 0xf0];
        let idr: &[u8] = &[0x65, 0x88, 0x84, 0x21];
        let key = annexb(&[aud, &sps, &pps, idr]);
        let f = d
            .decode(true, hang::encode_legacy(40_000, &key), &none)
            .unwrap();
        assert!(d.is_configured());
        assert_eq!(d.info().codec, "avc1.64000d");
        assert_eq!((d.info().width, d.info().height), (320, 240));
        let avcc = mp4_atom::Avcc::decode_body(&mut d.info().description.clone().unwrap().as_ref())
            .unwrap();
        assert_eq!(avcc.sequence_parameter_sets, vec![sps.clone()]);
        assert_eq!(avcc.picture_parameter_sets, vec![pps.clone()]);
        assert_eq!(f.len(), 1);
        assert!(f[0].keyframe);
        assert_eq!(&f[0].data[..], &[0, 0, 0, 4, 0x65, 0x88, 0x84, 0x21]);
        let f = d
            .decode(
                false,
                hang::encode_legacy(80_000, &annexb(&[aud, delta])),
                &none,
            )
            .unwrap();
        assert_eq!(&f[0].data[..], &[0, 0, 0, 3, 0x41, 0x9a, 0x01]);
        // With a description the frames are taken as they are.
        let mut d = Decoder::new(&chosen(Packing::Legacy, video()), 1).unwrap();
        let f = d
            .decode(true, hang::encode_legacy(0, b"\0\0\0\x01\x65"), &none)
            .unwrap();
        assert_eq!(&f[0].data[..], b"\0\0\0\x01\x65");
    }

    #[test]
    fn loc_tracks_learn_their_configuration_from_object_properties() {
        let mut info = video();
        info.description = None;
        let mut d = Decoder::new(&chosen(Packing::Loc, info), 1).unwrap();
        assert!(!d.is_configured());
        let props = |config: Option<Bytes>, key: bool| {
            LocProperties {
                timestamp: Some(1_000),
                timescale: Some(1_000_000),
                video_config: config,
                frame_marking: Some(FrameMarking::frame(key, false)),
                ..LocProperties::default()
            }
            .encode()
        };
        let payload = Bytes::from_static(b"frame");
        let f = d
            .decode(
                true,
                payload.clone(),
                &props(Some(Bytes::from_static(AVCC)), true),
            )
            .unwrap();
        assert!(d.is_configured());
        assert_eq!((f.len(), f[0].pts), (1, 1_000));
        // An object without a timestamp is an error.
        let e = d
            .decode(false, payload, &LocProperties::default().encode())
            .unwrap_err();
        assert!(e.to_string().contains("without a Timestamp"), "{e}");
    }

    #[test]
    fn the_muxer_writes_the_init_segment_once_every_rendition_is_configured() {
        let legacy = Decoder::new(&chosen(Packing::Legacy, video()), 1).unwrap();
        let mut info = video();
        info.description = None;
        let loc = Decoder::new(&chosen(Packing::Loc, info), 2).unwrap();
        let mut m = Muxer::new();
        let frame = |pts| Frame {
            track: 1,
            pts,
            dts: pts,
            duration: 40_000,
            keyframe: true,
            disposable: false,
            data: Bytes::from_static(&[0, 0, 0, 1, 0x65]),
        };
        m.push(0, frame(1_000_000));
        // The LOC rendition's configuration is unknown: frames wait.
        assert_eq!(m.init(&[("v", &legacy), ("l", &loc)]).unwrap(), None);
        assert_eq!(m.next_fragment(|_| legacy.info()).unwrap(), None);
        for _ in 0..MAX_PENDING {
            m.push(0, frame(1_000_000));
        }
        let e = m.init(&[("v", &legacy), ("l", &loc)]).unwrap_err();
        assert!(e.to_string().contains(r#"["l"]"#), "{e}");
        // With every rendition configured, the init segment, then fragments.
        let init = m.init(&[("v", &legacy)]).unwrap().unwrap();
        assert_eq!(&init[4..8], b"ftyp");
        assert_eq!(m.init(&[("v", &legacy)]).unwrap(), None);
        let (i, frag) = m.next_fragment(|_| legacy.info()).unwrap().unwrap();
        assert_eq!(i, 0);
        assert_eq!(&frag[4..8], b"moof");
    }
}
