//! The publisher's side of a broadcast, sans-IO: what the input is, the
//! tracks and their names, the catalog, and where each frame goes (group,
//! subgroup, object ID, priority) packaged as what. The client's
//! `media::publish` moves the bytes and keeps time.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::hang::{self, Container};
use crate::loc::{FrameMarking, LocProperties};
use crate::msf::{self, Packaging};
use crate::mux::{init_segment, Fragmenter};
use crate::{Error, Frame, TrackInfo, TrackKind};

/// Media packaging on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// moq-dev's hang: catalog.json + one timestamped frame per object.
    Hang,
    /// hang with CMAF fragments as objects (init segments in the catalog).
    HangCmaf,
    /// IETF MSF (draft-ietf-moq-msf-01): a `catalog` track, LOC packaging
    /// (draft-ietf-moq-loc-04): one codec frame per object, timestamp,
    /// frame marking and decoder config as object properties.
    Msf,
    /// IETF CMSF (draft-ietf-moq-cmsf-01): the MSF catalog with `cmaf`
    /// packaging, one CMAF chunk per object, init segments in the catalog.
    Cmsf,
}

impl Format {
    /// Whether the catalog is MSF's (else hang's).
    pub fn is_msf(self) -> bool {
        matches!(self, Format::Msf | Format::Cmsf)
    }

    /// The name of the catalog track.
    pub fn catalog_track(self) -> &'static str {
        if self.is_msf() {
            msf::CATALOG_TRACK
        } else {
            hang::CATALOG_TRACK
        }
    }
}

/// Container of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InputFormat {
    /// Judge by the first bytes.
    #[default]
    Auto,
    /// Fragmented MP4 / CMAF.
    Fmp4,
    /// MPEG transport stream.
    Ts,
}

impl InputFormat {
    /// The container of an input starting with `head`: `self` unless
    /// [`InputFormat::Auto`], else MPEG-TS if it starts with sync bytes,
    /// else fragmented MP4.
    pub fn resolve(self, head: &[u8]) -> InputFormat {
        match self {
            InputFormat::Auto => sniff(head),
            k => k,
        }
    }
}

fn sniff(head: &[u8]) -> InputFormat {
    if head.first() == Some(&0x47) && (head.len() < 189 || head[188] == 0x47) {
        InputFormat::Ts
    } else {
        InputFormat::Fmp4
    }
}

/// How frames of a GOP are spread over subgroups (streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Delivery {
    /// One subgroup (one stream) per group: frames arrive in order.
    #[default]
    Group,
    /// Subgroup 0 keyframes, 1 other reference frames, 2 frames nothing
    /// references, each at a lower priority, so a congested link drops the
    /// disposable frames first (Sengupta 2025's per-frame-type delivery).
    FrameType,
}

/// Priorities (lower is more important): the catalog, then audio (small,
/// and its gaps are heard), then video by how much depends on a frame.
pub const PRIO_CATALOG: u8 = 0;
/// The audio tracks' priority.
pub const PRIO_AUDIO: u8 = 64;
/// Video priorities: keyframes, other reference frames, disposable frames.
pub const PRIO_VIDEO: [u8; 3] = [96, 128, 160];

/// Audio groups start with each video group; without video, this often.
const AUDIO_GROUP: Duration = Duration::from_secs(1);

/// The track names of `tracks`: `video`, `audio`, then `video1`, `audio1`, …
pub fn track_names(tracks: &[TrackInfo]) -> Vec<String> {
    let (mut videos, mut audios) = (0u32, 0u32);
    tracks
        .iter()
        .map(|t| {
            let (base, n) = match t.kind {
                TrackKind::Video => ("video", &mut videos),
                TrackKind::Audio => ("audio", &mut audios),
            };
            let name = if *n == 0 {
                base.to_string()
            } else {
                format!("{base}{n}")
            };
            *n += 1;
            name
        })
        .collect()
}

/// The publishing priority of a track of `kind` (its keyframes for video).
pub fn priority(kind: TrackKind) -> u8 {
    match kind {
        TrackKind::Video => PRIO_VIDEO[0],
        TrackKind::Audio => PRIO_AUDIO,
    }
}

/// One published rendition.
#[derive(Debug)]
pub struct Rendition {
    /// Its track name.
    pub name: String,
    /// The input track.
    pub info: TrackInfo,
    /// Current group and next object ID in it.
    group: Option<u64>,
    next_object: u64,
    group_started: Option<i64>,
    frames: u64,
    fragmenter: Fragmenter,
}

impl Rendition {
    /// Frames packaged so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }
}

/// Where a frame goes: an object of a rendition's track.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    /// Index of the rendition in [`Packager::renditions`].
    pub rendition: usize,
    /// The group; `new_group` when this object starts it (so the previous
    /// group's subgroup streams are done with).
    pub group: u64,
    /// Whether this object starts `group`.
    pub new_group: bool,
    /// The subgroup (stream) within the group.
    pub subgroup: u64,
    /// The subgroup's priority.
    pub priority: u8,
    /// The object ID.
    pub object: u64,
    /// The object's payload.
    pub payload: Bytes,
    /// The object's property block (LOC's metadata; empty otherwise).
    pub properties: Bytes,
}

/// Frames in, objects out: groups per GOP (audio following video's), the
/// subgroup and priority per [`Delivery`], the payload per [`Format`].
#[derive(Debug)]
pub struct Packager {
    format: Format,
    delivery: Delivery,
    target_latency_ms: u64,
    renditions: Vec<Rendition>,
    dropped_before_keyframe: u64,
}

impl Packager {
    /// A packager for the input's `tracks`, named by [`track_names`].
    /// `target_latency_ms` (0 for none) goes into MSF catalogs.
    pub fn new(
        format: Format,
        delivery: Delivery,
        target_latency_ms: u64,
        tracks: &[TrackInfo],
    ) -> Self {
        let renditions = track_names(tracks)
            .into_iter()
            .zip(tracks)
            .map(|(name, t)| Rendition {
                name,
                info: t.clone(),
                group: None,
                next_object: 0,
                group_started: None,
                frames: 0,
                fragmenter: Fragmenter::new(),
            })
            .collect();
        Self {
            format,
            delivery,
            target_latency_ms,
            renditions,
            dropped_before_keyframe: 0,
        }
    }

    /// The renditions, in the input's track order.
    pub fn renditions(&self) -> &[Rendition] {
        &self.renditions
    }

    /// Frames dropped because nothing could decode them: before the first
    /// keyframe, or audio before the first video group.
    pub fn dropped_before_keyframe(&self) -> u64 {
        self.dropped_before_keyframe
    }

    /// A new init segment (an encoder restart): same renditions if the
    /// codecs are, new config otherwise.
    pub fn retrack(&mut self, tracks: Vec<TrackInfo>) {
        for t in tracks {
            if let Some(r) = self.renditions.iter_mut().find(|r| r.info.kind == t.kind) {
                r.info = t;
            }
        }
    }

    /// Places frame `f`; `None` if it belongs to no rendition or cannot be
    /// decoded by anyone (counted in [`Self::dropped_before_keyframe`]).
    pub fn frame(&mut self, f: Frame) -> Result<Option<Placed>, Error> {
        let renditions = &mut self.renditions;
        let Some(idx) = renditions.iter().position(|r| r.info.id == f.track) else {
            return Ok(None);
        };
        let kind = renditions[idx].info.kind;
        // Where a new group starts: a video keyframe; audio follows the video's
        // groups, or cuts every AUDIO_GROUP without video.
        let has_video = renditions.iter().any(|r| r.info.kind == TrackKind::Video);
        let new_group = match kind {
            TrackKind::Video => f.keyframe,
            TrackKind::Audio => {
                let r = &renditions[idx];
                r.group.is_none()
                    || if has_video {
                        let video_group = renditions
                            .iter()
                            .filter(|v| v.info.kind == TrackKind::Video)
                            .filter_map(|v| v.group_started)
                            .max();
                        video_group
                            .is_some_and(|v| r.group_started.is_some_and(|s| v > s) && f.pts >= v)
                    } else {
                        r.group_started
                            .is_some_and(|s| f.pts - s >= AUDIO_GROUP.as_micros() as i64)
                    }
            }
        };
        // Audio waits for the first video group so both start together.
        if kind == TrackKind::Audio
            && has_video
            && renditions
                .iter()
                .all(|v| v.info.kind != TrackKind::Video || v.group.is_none())
        {
            self.dropped_before_keyframe += 1;
            return Ok(None);
        }
        let r = &mut renditions[idx];
        if new_group {
            r.group = Some(r.group.map_or(0, |g| g + 1));
            r.next_object = 0;
            r.group_started = Some(f.pts);
        }
        let Some(group) = r.group else {
            // No keyframe yet: nothing a subscriber could decode.
            self.dropped_before_keyframe += 1;
            return Ok(None);
        };
        let (subgroup, priority) = match (kind, self.delivery) {
            (TrackKind::Audio, _) => (0, PRIO_AUDIO),
            (TrackKind::Video, Delivery::Group) => (0, PRIO_VIDEO[0]),
            (TrackKind::Video, Delivery::FrameType) => {
                let layer = if f.keyframe {
                    0
                } else if f.disposable {
                    2
                } else {
                    1
                };
                (layer as u64, PRIO_VIDEO[layer])
            }
        };
        // Presentation times before zero (an edit list's pre-roll) are clamped,
        // as the wire formats carry unsigned times.
        let (payload, properties) = match self.format {
            Format::Hang => (
                hang::encode_legacy(f.pts.max(0) as u64, &f.data),
                Bytes::new(),
            ),
            Format::HangCmaf | Format::Cmsf => (r.fragmenter.fragment(&r.info, &f)?, Bytes::new()),
            Format::Msf => (f.data.clone(), loc_properties(&r.info, &f, new_group)),
        };
        let object = r.next_object;
        r.next_object += 1;
        r.frames += 1;
        Ok(Some(Placed {
            rendition: idx,
            group,
            new_group,
            subgroup,
            priority,
            object,
            payload,
            properties,
        }))
    }

    /// The catalog describing the renditions; `wall` is the wall time of
    /// PTS zero (µs since the MoQ epoch), carried as hang's `clock`, and
    /// `generated_at` MSF's `generatedAt` (ms since the Unix epoch).
    pub fn catalog(&self, wall: u64, generated_at: u64) -> Result<Bytes, Error> {
        if self.format.is_msf() {
            let mut c = msf::Catalog::new();
            c.generated_at = Some(generated_at);
            for r in &self.renditions {
                let (packaging, init, timescale) = match self.format {
                    // LOC timestamps are in µs (the Timescale property says so).
                    Format::Msf => (Packaging::Loc, None, 1_000_000),
                    _ => (
                        Packaging::Cmaf,
                        Some(init_segment(std::slice::from_ref(&r.info))?),
                        r.info.timescale.into(),
                    ),
                };
                let mut t = msf::Track::from_info(&r.name, &r.info, packaging);
                t.timescale = Some(timescale);
                t.target_latency = (self.target_latency_ms > 0).then_some(self.target_latency_ms);
                c.push(t, init.as_deref());
            }
            return Ok(c.to_bytes());
        }
        let mut c = hang::Catalog::default();
        for r in &self.renditions {
            let container = match self.format {
                Format::HangCmaf => Container::Cmaf {
                    init: init_segment(std::slice::from_ref(&r.info))?,
                },
                _ => Container::Legacy,
            };
            c.insert(&r.name, &r.info, container);
        }
        c.set_clock(wall);
        Ok(c.to_bytes())
    }

    /// The catalog that ends the broadcast, after the tracks' PUBLISH_DONE:
    /// for MSF an independent catalog with isComplete and no tracks
    /// (msf-01 §Ending a live broadcast); hang has none.
    pub fn final_catalog(&self, generated_at: u64) -> Option<Bytes> {
        self.format.is_msf().then(|| {
            msf::Catalog {
                is_complete: true,
                generated_at: Some(generated_at),
                ..msf::Catalog::new()
            }
            .to_bytes()
        })
    }
}

/// LOC properties of frame `f`: its timestamp in µs (Timescale 1000000, so
/// it is media time, not wall-clock time), and for video the frame marking;
/// the decoder configuration rides on every keyframe (video) or the first
/// object of each group (audio), so a subscriber joining at any group can
/// decode without the catalog holding it.
fn loc_properties(t: &TrackInfo, f: &Frame, new_group: bool) -> Bytes {
    let video = t.kind == TrackKind::Video;
    LocProperties {
        timestamp: Some(f.pts.max(0) as u64),
        timescale: Some(1_000_000),
        video_config: if video && f.keyframe {
            t.description.clone()
        } else {
            None
        },
        audio_config: if !video && new_group {
            t.description.clone()
        } else {
            None
        },
        frame_marking: video.then(|| FrameMarking::frame(f.keyframe, f.disposable)),
        ..LocProperties::default()
    }
    .encode()
}

/// The mapping from media time to now: frame time `base` (µs) was due at
/// `start`, which was `unix` µs since the Unix epoch.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
    base: i64,
    unix: u64,
}

impl Clock {
    /// Frame time `base` is due at `now`, `unix_micros` since the Unix epoch.
    pub fn new(base: i64, now: Instant, unix_micros: u64) -> Self {
        Self {
            start: now,
            base,
            unix: unix_micros,
        }
    }

    /// Wall-clock time of media time zero, in µs since the MoQ epoch.
    pub fn wall_of_zero(&self) -> u64 {
        (self.unix as i64 - self.base - hang::MOQ_EPOCH_UNIX_MICROS as i64).max(0) as u64
    }
}

/// Real-time pacing: when each frame is due, by its decode time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pacer {
    clock: Option<Clock>,
}

impl Pacer {
    /// Anchors the clock at the first frame and, with `wait`, says how long
    /// to wait until frame time `dts` (µs) is due. A jump of more than two
    /// seconds either way (a paused or restarted encoder, a discontinuity)
    /// re-anchors the clock rather than stalling or bursting. Returns the
    /// clock in force and the wait.
    pub fn pace(
        &mut self,
        dts: i64,
        wait: bool,
        now: Instant,
        unix_micros: u64,
    ) -> (Clock, Duration) {
        let c = *self
            .clock
            .get_or_insert_with(|| Clock::new(dts, now, unix_micros));
        if !wait {
            return (c, Duration::ZERO);
        }
        let due = c.start + Duration::from_micros((dts - c.base).max(0) as u64);
        let ahead = due.saturating_duration_since(now);
        let behind = now.saturating_duration_since(due);
        if dts < c.base || ahead > Duration::from_secs(2) || behind > Duration::from_secs(2) {
            let fresh = Clock::new(dts, now, unix_micros);
            self.clock = Some(fresh);
            return (fresh, Duration::ZERO);
        }
        (c, ahead)
    }

    /// Forgets the clock: the next frame anchors a new one (a new init
    /// segment).
    pub fn reset(&mut self) {
        self.clock = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_ts_and_mp4() {
        let mut ts = vec![0u8; 376];
        ts[0] = 0x47;
        ts[188] = 0x47;
        assert_eq!(sniff(&ts), InputFormat::Ts);
        assert_eq!(sniff(b"\0\0\0\x18ftypiso6"), InputFormat::Fmp4);
        assert_eq!(InputFormat::Fmp4.resolve(&ts), InputFormat::Fmp4);
        assert_eq!(InputFormat::Auto.resolve(&ts), InputFormat::Ts);
    }

    #[test]
    fn tracks_are_named_by_kind() {
        let v = TrackInfo::video(1, "avc1.64001f", 640, 360);
        let a = TrackInfo::audio(2, "opus", 48_000, 2);
        assert_eq!(
            track_names(&[v.clone(), a.clone(), v, a]),
            ["video", "audio", "video1", "audio1"]
        );
    }

    fn frame(track: u32, pts: i64, keyframe: bool, disposable: bool) -> Frame {
        Frame {
            track,
            pts,
            dts: pts,
            duration: 0,
            keyframe,
            disposable,
            data: Bytes::from_static(b"frame"),
        }
    }

    #[test]
    fn groups_follow_video_keyframes_and_audio_waits_for_video() {
        let v = TrackInfo::video(1, "avc1.64001f", 640, 360);
        let a = TrackInfo::audio(2, "opus", 48_000, 2);
        let mut p = Packager::new(Format::Hang, Delivery::FrameType, 0, &[v, a]);
        // Audio before any video group, and video before a keyframe: dropped.
        assert_eq!(p.frame(frame(2, 0, true, false)).unwrap(), None);
        assert_eq!(p.frame(frame(1, 0, false, false)).unwrap(), None);
        assert_eq!(p.dropped_before_keyframe(), 2);
        let k = p.frame(frame(1, 33, true, false)).unwrap().unwrap();
        assert_eq!(
            (k.rendition, k.group, k.new_group, k.object),
            (0, 0, true, 0)
        );
        assert_eq!((k.subgroup, k.priority), (0, PRIO_VIDEO[0]));
        let b = p.frame(frame(1, 66, false, true)).unwrap().unwrap();
        assert_eq!((b.group, b.new_group, b.object), (0, false, 1));
        assert_eq!((b.subgroup, b.priority), (2, PRIO_VIDEO[2]));
        let au = p.frame(frame(2, 40, true, false)).unwrap().unwrap();
        assert_eq!((au.rendition, au.group, au.new_group), (1, 0, true));
        // The next video group starts the next audio group.
        let k = p.frame(frame(1, 1000, true, false)).unwrap().unwrap();
        assert_eq!((k.group, k.new_group, k.object), (1, true, 0));
        let au = p.frame(frame(2, 1000, true, false)).unwrap().unwrap();
        assert_eq!((au.group, au.new_group), (1, true));
        // Frames of no rendition are not placed.
        assert_eq!(p.frame(frame(9, 0, true, false)).unwrap(), None);
        assert_eq!(p.renditions()[0].frames(), 3);
    }

    #[test]
    fn msf_catalogs_list_the_tracks_and_end_complete() {
        let mut v = TrackInfo::video(1, "avc1.64001f", 640, 360);
        v.description = Some(Bytes::from_static(&[1, 0x64, 0, 0x1f, 0xff, 0xe0, 0]));
        let p = Packager::new(Format::Msf, Delivery::Group, 1500, &[v]);
        let c = msf::Catalog::parse(&p.catalog(0, 7).unwrap()).unwrap();
        assert_eq!(c.tracks.len(), 1);
        assert_eq!(c.tracks[0].name, "video");
        assert_eq!(c.tracks[0].target_latency, Some(1500));
        let done = msf::Catalog::parse(&p.final_catalog(8).unwrap()).unwrap();
        assert!(done.is_complete && done.tracks.is_empty());
        let hang = Packager::new(Format::Hang, Delivery::Group, 0, &[]);
        assert_eq!(hang.final_catalog(8), None);
    }

    #[test]
    fn the_pacer_waits_for_frame_time_and_reanchors_on_jumps() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        let unix = 1_800_000_000_000_000;
        let (c, wait) = p.pace(1_000_000, true, t0, unix);
        assert_eq!(wait, Duration::ZERO);
        let (c2, wait) = p.pace(1_500_000, true, t0, unix);
        assert_eq!(wait, Duration::from_millis(500));
        assert_eq!(c.wall_of_zero(), c2.wall_of_zero());
        // Ten seconds ahead: a new anchor, no wait.
        let (c3, wait) = p.pace(11_000_000, true, t0, unix + 1_000_000);
        assert_eq!(wait, Duration::ZERO);
        assert_ne!(c3.wall_of_zero(), c.wall_of_zero());
        // Unpaced: never waits.
        assert_eq!(p.pace(11_900_000, false, t0, unix).1, Duration::ZERO);
    }
}
