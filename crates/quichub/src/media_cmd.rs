//! `quichub pub --broadcast` and `quichub sub --broadcast`: real media.
//!
//! Publishing: fMP4/CMAF or MPEG-TS (a file or stdin) is demuxed by
//! `quichub-media` and published as a hang broadcast (a `catalog.json`
//! track) or an MSF one (a `catalog` track, LOC or CMAF packaging), with
//! one track per rendition, one group per GOP. Subscribing: whichever
//! catalog track the broadcast has is read, the renditions subscribed, and
//! fragmented MP4 written for `ffplay -` or a file. This module only moves
//! bytes and keeps time; the packaging is the media crate's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::message::FetchKind;
use moqt::{FullTrackName, KeyValue, Parameters, SubscriptionFilter, TrackNamespace};
use quichub_client::{
    ClientSession, LocalTrack, SubgroupWriter, SubscribeOptions, SubscriptionEvent, TrackMode,
};
use quichub_media::codec::sample_entry;
use quichub_media::fmp4::Fmp4Demuxer;
use quichub_media::hang::{self, Container};
use quichub_media::loc::{FrameMarking, LocProperties};
use quichub_media::msf::{self, CatalogObject, Packaging};
use quichub_media::mux::{init_segment, Fragmenter};
use quichub_media::ts::TsDemuxer;
use quichub_media::{Demuxer, Event, Frame, Limits, TrackInfo, TrackKind};
use tokio::time::Instant;

/// Media packaging on the wire.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
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
    fn is_msf(self) -> bool {
        matches!(self, Format::Msf | Format::Cmsf)
    }

    fn catalog_track(self) -> &'static str {
        if self.is_msf() {
            msf::CATALOG_TRACK
        } else {
            hang::CATALOG_TRACK
        }
    }
}

/// Container of the input.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InputFormat {
    /// Judge by the first bytes.
    #[default]
    Auto,
    /// Fragmented MP4 / CMAF.
    Fmp4,
    /// MPEG transport stream.
    Ts,
}

/// How frames of a GOP are spread over subgroups (streams).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Delivery {
    /// One subgroup (one stream) per group: frames arrive in order.
    #[default]
    Group,
    /// Subgroup 0 keyframes, 1 other reference frames, 2 frames nothing
    /// references, each at a lower priority, so a congested link drops the
    /// disposable frames first (Sengupta 2025's per-frame-type delivery).
    FrameType,
}

/// `pub` options for real media (with `--broadcast`).
#[derive(clap::Args, Debug, Clone)]
pub struct MediaPubArgs {
    /// Publish a media broadcast under this name (the track namespace,
    /// `/`-separated), read from `--input`, instead of a synthetic profile.
    #[arg(long)]
    pub broadcast: Option<String>,
    /// Packaging of the broadcast.
    #[arg(long, value_enum, default_value_t = Format::Hang)]
    pub format: Format,
    /// Media input: a file, or `-` for standard input (e.g. `ffmpeg … -f mp4
    /// -movflags cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame -`).
    #[arg(long, default_value = "-")]
    pub input: String,
    /// Container of the input.
    #[arg(long, value_enum, default_value_t = InputFormat::Auto)]
    pub input_format: InputFormat,
    /// Send as fast as the input arrives instead of in real time (by default
    /// frames leave when their timestamps say, so a file plays as if live).
    #[arg(long)]
    pub no_pace: bool,
    /// How each GOP is spread over streams.
    #[arg(long, value_enum, default_value_t = Delivery::Group)]
    pub delivery: Delivery,
    /// Target latency in ms: objects older than this are not worth
    /// delivering (the tracks' OBJECT_DELIVERY_TIMEOUT); 0 for none.
    #[arg(long, default_value_t = 2000)]
    pub target_latency_ms: u64,
}

/// `sub` options for real media (with `--broadcast`).
#[derive(clap::Args, Debug, Clone)]
pub struct MediaSubArgs {
    /// Subscribe to this media broadcast (catalog and renditions).
    #[arg(long)]
    pub broadcast: Option<String>,
    /// Where the fragmented MP4 goes: a file, or `-` for standard output
    /// (`| ffplay -`).
    #[arg(long, default_value = "-")]
    pub output: String,
    /// Video rendition to take (default: the first in the catalog; `none` for audio only).
    #[arg(long)]
    pub video: Option<String>,
    /// Audio rendition to take (default: the first; `none` for video only).
    #[arg(long)]
    pub audio: Option<String>,
}

/// Priorities (lower is more important): the catalog, then audio (small,
/// and its gaps are heard), then video by how much depends on a frame.
const PRIO_CATALOG: u8 = 0;
const PRIO_AUDIO: u8 = 64;
const PRIO_VIDEO: [u8; 3] = [96, 128, 160];

/// Audio groups start with each video group; without video, this often.
const AUDIO_GROUP: Duration = Duration::from_secs(1);

fn sniff(head: &[u8]) -> InputFormat {
    if head.first() == Some(&0x47) && (head.len() < 189 || head[188] == 0x47) {
        InputFormat::Ts
    } else {
        InputFormat::Fmp4
    }
}

/// Reads the input on a thread (files and pipes block) into a channel.
fn spawn_reader(
    input: &str,
) -> anyhow::Result<tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>> {
    let mut src: Box<dyn Read + Send> = if input == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(input).with_context(|| format!("open {input}"))?)
    };
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || loop {
        let mut buf = vec![0u8; 64 * 1024];
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                buf.truncate(n);
                if tx.blocking_send(Ok(buf)).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                break;
            }
        }
    });
    Ok(rx)
}

/// One published rendition.
struct Rendition {
    info: TrackInfo,
    track: Arc<LocalTrack>,
    /// Current group and next object ID in it.
    group: Option<u64>,
    next_object: u64,
    group_started: Option<i64>,
    writers: BTreeMap<u64, SubgroupWriter<'static>>,
    streams: u64,
    frames: u64,
    fragmenter: Fragmenter,
}

/// Publishes a media broadcast; see [`MediaPubArgs`].
pub async fn publish(
    a: &MediaPubArgs,
    broadcast: &str,
    session: &ClientSession,
    mode: TrackMode,
    until: Instant,
) -> anyhow::Result<()> {
    let ns = TrackNamespace::from_path(broadcast);
    let name = |t: &str| FullTrackName {
        namespace: ns.clone(),
        name: Bytes::from(t.to_string()),
    };
    let catalog_track = session
        .create_track(name(a.format.catalog_track()), PRIO_CATALOG, mode)
        .await?;
    // The broadcast's namespace is published in both modes: players that
    // find broadcasts with SUBSCRIBE_NAMESPACE (moq-dev's, which then
    // subscribe to `catalog.json`) learn of a pushed one only this way.
    let _announced = session.publish_namespace(ns.clone()).await?;
    let mut rx = spawn_reader(&a.input)?;
    let mut demux: Option<Box<dyn Demuxer + Send>> = None;
    let mut renditions: Vec<Rendition> = Vec::new();
    let mut catalog = CatalogWriter {
        track: catalog_track.clone(),
        group: 0,
        current: None,
        served: 0,
    };
    let mut clock: Option<Clock> = None;
    // The wall clock of PTS zero in the catalog's `clock`, and whether the
    // catalog must go out (again) before the next frame.
    let mut published_wall: Option<u64> = None;
    let mut catalog_dirty = false;
    let mut dropped_before_keyframe = 0u64;
    let mut eof = false;
    let limits = Limits::default();
    'input: loop {
        catalog.serve_new_subscriber().await?;
        // Drain every event the demuxer has before reading more.
        while let Some(d) = demux.as_mut() {
            let ev = match d.next() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => bail!("input: {e}"),
            };
            match ev {
                Event::Tracks(tracks) => {
                    if renditions.is_empty() {
                        renditions = create_renditions(session, &name, &tracks, mode, a).await?;
                    } else {
                        // A new init segment (an encoder restart): same
                        // renditions if the codecs are, new config otherwise.
                        for t in tracks {
                            if let Some(r) = renditions.iter_mut().find(|r| r.info.kind == t.kind) {
                                r.info = TrackInfo { id: t.id, ..t };
                            }
                        }
                        clock = None;
                    }
                    // The catalog goes out before the next frame, when its
                    // clock is known.
                    catalog_dirty = true;
                }
                Event::Frame(f) => {
                    catalog.serve_new_subscriber().await?;
                    let c = pace(&mut clock, f.dts, !a.no_pace).await;
                    if Instant::now() >= until {
                        break 'input;
                    }
                    // Players turn PTS into wall-clock time (for the latency
                    // they show) with the catalog's clock; a re-anchored
                    // clock (paused encoder) goes out as a new catalog.
                    let wall = c.wall_of_zero();
                    if catalog_dirty || published_wall.is_none_or(|p| p.abs_diff(wall) > 50_000) {
                        // Every catalog is a complete one in a group of its
                        // own (MSF requires an independent catalog to start
                        // a new group; hang subscribers take the latest).
                        catalog.write(build_catalog(&renditions, a, wall)?).await?;
                        published_wall = Some(wall);
                        catalog_dirty = false;
                    }
                    send_frame(&mut renditions, f, a, &mut dropped_before_keyframe).await?;
                }
            }
        }
        if eof {
            break;
        }
        let chunk = tokio::select! {
            c = rx.recv() => c,
            _ = tokio::time::sleep_until(until) => break,
            // A stalled input must not keep a new subscriber from the catalog.
            _ = catalog.subscribed() => continue,
        };
        match chunk {
            Some(Ok(data)) => {
                let d = demux.get_or_insert_with(|| {
                    let kind = match a.input_format {
                        InputFormat::Auto => sniff(&data),
                        k => k,
                    };
                    match kind {
                        InputFormat::Ts => Box::new(TsDemuxer::new(limits)),
                        _ => Box::new(Fmp4Demuxer::new(limits)),
                    }
                });
                d.push(&data);
            }
            Some(Err(e)) => return Err(e).context("read input"),
            None => {
                if let Some(d) = demux.as_mut() {
                    d.end();
                }
                eof = true;
            }
        }
    }
    if renditions.is_empty() {
        bail!("the input ended before describing any track");
    }
    let mut sent = Vec::new();
    for r in &mut renditions {
        for (_, w) in std::mem::take(&mut r.writers) {
            w.finish();
        }
    }
    // PUBLISH_DONE may overtake the last streams: it carries their count,
    // and the relay waits for them before it ends the track.
    for r in &mut renditions {
        r.track.finish(r.streams).await?;
        sent.push(format!("{} {} frames", r.info.codec, r.frames));
    }
    if a.format.is_msf() {
        // msf-01 §Ending a live broadcast: after the tracks' PUBLISH_DONE,
        // an independent catalog with isComplete and no tracks.
        let done = msf::Catalog {
            is_complete: true,
            generated_at: Some(unix_ms()),
            ..msf::Catalog::new()
        };
        catalog.write(done.to_bytes()).await?;
    }
    catalog_track.finish(catalog.group).await?;
    if dropped_before_keyframe > 0 {
        eprintln!("dropped {dropped_before_keyframe} frames before the first keyframe");
    }
    eprintln!("published {broadcast}: {}", sent.join(", "));
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

/// The catalog track and its latest version.
struct CatalogWriter {
    track: Arc<LocalTrack>,
    /// The next group to write.
    group: u64,
    /// The latest catalog object written.
    current: Option<Bytes>,
    /// SUBSCRIBEs answered when the catalog was last written.
    served: u64,
}

impl CatalogWriter {
    /// Writes `catalog` as the next group (dropped when nobody subscribes):
    /// every catalog is a complete one in a group of its own.
    async fn write(&mut self, catalog: Bytes) -> anyhow::Result<()> {
        self.served = self.track.subscriptions_served();
        if let Some(mut w) = self.track.open_subgroup(self.group, 0).await? {
            w.write(0, catalog.clone()).await?;
            w.finish();
        }
        self.group += 1;
        self.current = Some(catalog);
        Ok(())
    }

    /// Whether a SUBSCRIBE has come in since the current version was
    /// written, and objects flow to it.
    fn unserved(&self) -> bool {
        self.current.is_some()
            && self.track.subscriptions_served() > self.served
            && self.track.is_forwarding()
    }

    /// Returns once [`Self::unserved`] holds (polled: the client library
    /// counts SUBSCRIBEs but does not signal them).
    async fn subscribed(&self) {
        while !self.unserved() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// With `--mode announce` a track is sent only while the relay
    /// subscribes, so a catalog written before then never reached it and a
    /// player waits for one forever: when a SUBSCRIBE has come in since
    /// the last version was written, write it again as a new group.
    async fn serve_new_subscriber(&mut self) -> anyhow::Result<()> {
        if self.unserved() {
            if let Some(c) = self.current.take() {
                self.write(c).await?;
            }
        }
        Ok(())
    }
}

/// The mapping from media time to now: frame time `base` (µs) was due at
/// `start`, which was `unix` µs since the Unix epoch.
#[derive(Clone, Copy, Debug)]
struct Clock {
    start: Instant,
    base: i64,
    unix: u64,
}

impl Clock {
    fn new(base: i64) -> Self {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            start: Instant::now(),
            base,
            unix,
        }
    }

    /// Wall-clock time of media time zero, in µs since the MoQ epoch.
    fn wall_of_zero(&self) -> u64 {
        (self.unix as i64 - self.base - hang::MOQ_EPOCH_UNIX_MICROS as i64).max(0) as u64
    }
}

/// Anchors the clock at the first frame and, with `wait`, sleeps until the
/// wall clock reaches frame time `dts` (µs). A jump of more than two seconds
/// either way (a paused or restarted encoder, a discontinuity) re-anchors the
/// clock rather than stalling or bursting. Returns the clock in force.
async fn pace(clock: &mut Option<Clock>, dts: i64, wait: bool) -> Clock {
    let c = *clock.get_or_insert_with(|| Clock::new(dts));
    if !wait {
        return c;
    }
    let now = Instant::now();
    let due = c.start + Duration::from_micros((dts - c.base).max(0) as u64);
    let ahead = due.saturating_duration_since(now);
    let behind = now.saturating_duration_since(due);
    if dts < c.base || ahead > Duration::from_secs(2) || behind > Duration::from_secs(2) {
        let fresh = Clock::new(dts);
        *clock = Some(fresh);
        return fresh;
    }
    if !ahead.is_zero() {
        tokio::time::sleep(ahead).await;
    }
    c
}

async fn create_renditions(
    session: &ClientSession,
    name: &impl Fn(&str) -> FullTrackName,
    tracks: &[TrackInfo],
    mode: TrackMode,
    a: &MediaPubArgs,
) -> anyhow::Result<Vec<Rendition>> {
    let mut out = Vec::new();
    let mut counts = HashMap::new();
    for t in tracks {
        let base = match t.kind {
            TrackKind::Video => "video",
            TrackKind::Audio => "audio",
        };
        let n = counts.entry(base).or_insert(0u32);
        let track_name = if *n == 0 {
            base.to_string()
        } else {
            format!("{base}{n}")
        };
        *n += 1;
        let prio = match t.kind {
            TrackKind::Video => PRIO_VIDEO[0],
            TrackKind::Audio => PRIO_AUDIO,
        };
        let mut props = Vec::new();
        if a.target_latency_ms > 0 {
            props.push(KeyValue::int(
                moqt::params::kind::OBJECT_DELIVERY_TIMEOUT,
                a.target_latency_ms,
            ));
        }
        let track = session
            .create_track_with(name(&track_name), prio, mode, props)
            .await?;
        out.push(Rendition {
            info: t.clone(),
            track,
            group: None,
            next_object: 0,
            group_started: None,
            writers: BTreeMap::new(),
            streams: 0,
            frames: 0,
            fragmenter: Fragmenter::new(),
        });
        eprintln!("track {track_name}: {} ({})", t.codec, describe(t));
    }
    Ok(out)
}

fn describe(t: &TrackInfo) -> String {
    match t.kind {
        TrackKind::Video => format!("{}x{}", t.width, t.height),
        TrackKind::Audio => format!("{} Hz, {} ch", t.sample_rate, t.channels),
    }
}

/// The catalog object describing `renditions` in `a.format`.
/// The catalog for `renditions`; `wall` is the wall time of PTS zero (µs
/// since the MoQ epoch), carried as hang's `clock`.
fn build_catalog(renditions: &[Rendition], a: &MediaPubArgs, wall: u64) -> anyhow::Result<Bytes> {
    if a.format.is_msf() {
        let mut c = msf::Catalog::new();
        c.generated_at = Some(unix_ms());
        for r in renditions {
            let name = track_name_of(r);
            let (packaging, init, timescale) = match a.format {
                // LOC timestamps are in µs (the Timescale property says so).
                Format::Msf => (Packaging::Loc, None, 1_000_000),
                _ => (
                    Packaging::Cmaf,
                    Some(init_segment(std::slice::from_ref(&r.info))?),
                    r.info.timescale.into(),
                ),
            };
            let mut t = msf::Track::from_info(&name, &r.info, packaging);
            t.timescale = Some(timescale);
            t.target_latency = (a.target_latency_ms > 0).then_some(a.target_latency_ms);
            c.push(t, init.as_deref());
        }
        return Ok(c.to_bytes());
    }
    let mut c = hang::Catalog::default();
    for r in renditions {
        let container = match a.format {
            Format::HangCmaf => Container::Cmaf {
                init: init_segment(std::slice::from_ref(&r.info))?,
            },
            _ => Container::Legacy,
        };
        c.insert(&track_name_of(r), &r.info, container);
    }
    c.set_clock(wall);
    Ok(c.to_bytes())
}

/// Milliseconds since the Unix epoch (MSF's `generatedAt`).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn track_name_of(r: &Rendition) -> String {
    String::from_utf8_lossy(&r.track.name.name).into_owned()
}

async fn send_frame(
    renditions: &mut [Rendition],
    f: Frame,
    a: &MediaPubArgs,
    dropped: &mut u64,
) -> anyhow::Result<()> {
    let Some(idx) = renditions.iter().position(|r| r.info.id == f.track) else {
        return Ok(());
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
        *dropped += 1;
        return Ok(());
    }
    let r = &mut renditions[idx];
    if new_group {
        for (_, w) in std::mem::take(&mut r.writers) {
            w.finish();
        }
        r.group = Some(r.group.map_or(0, |g| g + 1));
        r.next_object = 0;
        r.group_started = Some(f.pts);
    }
    let Some(group) = r.group else {
        // No keyframe yet: nothing a subscriber could decode.
        *dropped += 1;
        return Ok(());
    };
    let (subgroup, prio) = match (kind, a.delivery) {
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
    let (payload, properties) = match a.format {
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
    if !r.writers.contains_key(&subgroup) {
        let opened = if a.format == Format::Msf {
            r.track
                .open_subgroup_owned_with_properties(group, subgroup, prio)
                .await?
        } else {
            r.track.open_subgroup_owned(group, subgroup, prio).await?
        };
        match opened {
            Some(w) => {
                r.writers.insert(subgroup, w);
                r.streams += 1;
            }
            None => return Ok(()),
        }
    }
    if let Some(w) = r.writers.get_mut(&subgroup) {
        w.write_with_properties(object, properties, payload).await?;
    }
    Ok(())
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

/// One object as the subscription tasks pass it on.
#[derive(Clone, Debug, Default)]
struct Obj {
    payload: Bytes,
    /// The object's property block (LOC's metadata).
    properties: Bytes,
}

/// What the subscription tasks pass to the writer.
enum Arrival {
    /// (group, subgroup (`None` if fetched), object, the object).
    Object(u64, Option<u64>, u64, Obj),
    /// A subgroup stream ended: (group, subgroup).
    SubgroupEnd(u64, u64),
    /// The subscription ended.
    Done,
    /// Time to give up on old gaps.
    Tick,
}

/// How a subscribed rendition's objects are packaged.
#[derive(Clone, Debug)]
enum Packing {
    /// hang's legacy container: timestamp varint + frame.
    Legacy,
    /// CMAF chunks (hang `cmaf`, MSF `cmaf`).
    Cmaf,
    /// LOC: the frame, with metadata in object properties.
    Loc,
}

/// One subscribed rendition on the subscriber side.
struct Output {
    info: TrackInfo,
    packing: Packing,
    /// For CMAF objects: a demuxer primed with the init segment.
    cmaf: Option<Fmp4Demuxer>,
    reorder: Reorder<Obj>,
    /// Synthesised decode times for legacy and LOC video (µs): the previous one.
    last_dts: Option<i64>,
    frame_us: i64,
    frames: u64,
    waiting_keyframe: bool,
    /// Whether `info` says enough to write the init segment. LOC tracks
    /// learn their decoder configuration from the objects' Video/Audio
    /// Config properties, so output waits for it.
    configured: bool,
}

/// Puts objects back in (Group, Object ID) order. They arrive on one
/// stream per subgroup, and QUIC orders nothing across streams: the first
/// objects of group N+1 can overtake the last of group N, and frame-type
/// subgroups interleave. A gap is waited for until the streams of its group
/// have all ended, or for [`REORDER_WAIT`], then skipped.
#[derive(Default)]
struct Reorder<T> {
    /// The position expected next: (group, object).
    next: Option<(u64, u64)>,
    held: BTreeMap<(u64, u64), T>,
    /// Bytes in `held`.
    held_bytes: usize,
    /// Subgroup streams of each group still open.
    open: HashMap<u64, HashSet<u64>>,
    /// Groups all of whose streams have ended.
    ended: HashSet<u64>,
    /// Since when the head of `held` waits on a gap.
    stuck_since: Option<std::time::Instant>,
    /// Objects that came after their place was given up.
    late: u64,
}

/// How long a gap is waited for.
const REORDER_WAIT: Duration = Duration::from_millis(500);
/// Most objects held behind a gap.
const MAX_HELD: usize = 256;
/// Most bytes held behind a gap: a publisher's objects can be large.
const MAX_HELD_BYTES: usize = 64 << 20;

/// What [`Reorder`] holds: something with a size in bytes.
trait Held {
    fn len(&self) -> usize;
}

impl Held for Bytes {
    fn len(&self) -> usize {
        Bytes::len(self)
    }
}

impl Held for Obj {
    fn len(&self) -> usize {
        self.payload.len() + self.properties.len()
    }
}

impl<T: Held> Reorder<T> {
    /// Takes an object (`subgroup` `None` for one fetched from the cache)
    /// and returns the payloads now in order, each with whether it starts
    /// its group.
    fn object(
        &mut self,
        group: u64,
        subgroup: Option<u64>,
        object: u64,
        payload: T,
    ) -> Vec<(bool, T)> {
        if self.next.is_some_and(|n| (group, object) < n) {
            self.late += 1;
            return Vec::new();
        }
        if let Some(sg) = subgroup {
            self.open.entry(group).or_default().insert(sg);
        }
        self.held_bytes += payload.len();
        if let Some(old) = self.held.insert((group, object), payload) {
            self.held_bytes -= old.len();
        }
        self.release(false)
    }

    /// A subgroup stream ended.
    fn subgroup_end(&mut self, group: u64, subgroup: u64) -> Vec<(bool, T)> {
        if let Some(open) = self.open.get_mut(&group) {
            open.remove(&subgroup);
            if open.is_empty() {
                self.open.remove(&group);
                self.ended.insert(group);
            }
        }
        self.release(false)
    }

    /// Releases what is in order; with `flush`, everything.
    fn release(&mut self, flush: bool) -> Vec<(bool, T)> {
        let mut out = Vec::new();
        while let Some((&(g, o), _)) = self.held.first_key_value() {
            let in_order = match self.next {
                None => true,
                Some((ng, no)) => {
                    (g, o) == (ng, no) || (g > ng && o == 0 && self.ended.contains(&ng))
                }
            };
            let give_up = flush
                || self.held.len() > MAX_HELD
                || self.held_bytes > MAX_HELD_BYTES
                || self
                    .stuck_since
                    .is_some_and(|t| t.elapsed() >= REORDER_WAIT);
            if !in_order && !give_up {
                self.stuck_since.get_or_insert_with(std::time::Instant::now);
                break;
            }
            self.stuck_since = None;
            if let Some(p) = self.held.remove(&(g, o)) {
                self.held_bytes -= p.len();
                out.push((o == 0, p));
            }
            if let Some((ng, _)) = self.next {
                if g > ng {
                    // Groups left behind are done with, whatever their streams say.
                    self.ended.retain(|&e| e >= g);
                    self.open.retain(|&k, _| k >= g);
                }
            }
            self.next = Some((g, o + 1));
        }
        out
    }
}

/// Which catalog a broadcast has, as read at the start.
enum AnyCatalog {
    Hang(hang::Catalog),
    Msf(msf::Catalog),
}

/// A rendition chosen from the catalog: its track name and how to decode it.
struct Chosen {
    name: String,
    info: TrackInfo,
    packing: Packing,
    /// The init segment of a CMAF rendition.
    init: Option<Bytes>,
    framerate: Option<f64>,
}

/// Subscribes to whichever catalog track `broadcast` has: MSF's `catalog`
/// or hang's `catalog.json`. Both are asked for at once (a subscriber
/// started before the publisher waits for it with RENDEZVOUS_TIMEOUT); the
/// first to be accepted wins, and a refusal of one leaves the other.
async fn subscribe_catalog(
    session: &ClientSession,
    broadcast: &str,
    opts: SubscribeOptions,
) -> anyhow::Result<(bool, quichub_client::Subscription)> {
    let m = session.subscribe(
        FullTrackName::new(broadcast, msf::CATALOG_TRACK),
        opts.clone(),
    );
    let h = session.subscribe(FullTrackName::new(broadcast, hang::CATALOG_TRACK), opts);
    tokio::pin!(m, h);
    let (is_msf, r) = tokio::select! {
        r = &mut m => match r {
            Ok(s) => (true, Ok(s)),
            Err(_) => (false, h.await),
        },
        r = &mut h => match r {
            Ok(s) => (false, Ok(s)),
            Err(_) => (true, m.await),
        },
    };
    let sub = r.with_context(|| {
        format!(
            "subscribe to {broadcast}/{} or {broadcast}/{}",
            msf::CATALOG_TRACK,
            hang::CATALOG_TRACK
        )
    })?;
    Ok((is_msf, sub))
}

/// Reads catalog objects in track order into the current catalog: hang's
/// latest object replaces it; for MSF an independent catalog replaces it
/// and a delta update is applied to it.
fn read_catalog(cur: &mut Option<AnyCatalog>, is_msf: bool, payload: &[u8]) -> anyhow::Result<()> {
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

/// The renditions to play from a hang catalog.
fn choose_hang(a: &MediaSubArgs, c: &hang::Catalog) -> anyhow::Result<Vec<Chosen>> {
    let pick =
        |want: &Option<String>, section: &hang::Section| -> Option<(String, hang::Rendition)> {
            match want.as_deref() {
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
        (TrackKind::Video, pick(&a.video, &c.video)),
        (TrackKind::Audio, pick(&a.audio, &c.audio)),
    ] {
        let Some((name, r)) = picked else { continue };
        let (info, packing, init) = match &r.container {
            Container::Legacy => (r.to_track(0, kind)?, Packing::Legacy, None),
            Container::Cmaf { init } => (r.to_track(0, kind)?, Packing::Cmaf, Some(init.clone())),
            other => bail!(
                "rendition {name}: container {:?} is not supported (legacy and cmaf are)",
                other.kind()
            ),
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
        bail!(
            "the catalog has no rendition to play (video: {:?}, audio: {:?})",
            c.video.renditions.keys().collect::<Vec<_>>(),
            c.audio.renditions.keys().collect::<Vec<_>>()
        );
    }
    Ok(out)
}

/// The renditions to play from an MSF catalog: `--video` / `--audio` by
/// track name, else the first video and the first audio track in the
/// catalog's own namespace whose packaging is `loc` or `cmaf`.
fn choose_msf(a: &MediaSubArgs, c: &msf::Catalog) -> anyhow::Result<Vec<Chosen>> {
    let playable = |t: &&msf::Track| {
        t.namespace.is_none() && matches!(t.packaging, Some(Packaging::Loc | Packaging::Cmaf))
    };
    let pick = |want: &Option<String>, kind: TrackKind| -> Option<&msf::Track> {
        match want.as_deref() {
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
            TrackKind::Video => &a.video,
            TrackKind::Audio => &a.audio,
        };
        let Some(t) = pick(want, kind) else { continue };
        let (packing, init) = match &t.packaging {
            Some(Packaging::Loc) => (Packing::Loc, None),
            Some(Packaging::Cmaf) => match c.init_data(t)? {
                Some(init) => (Packing::Cmaf, Some(init)),
                None => bail!("track {}: cmaf packaging without init data", t.name),
            },
            other => bail!(
                "track {}: packaging {:?} is not supported (loc and cmaf are)",
                t.name,
                other.as_ref().map(Packaging::as_str)
            ),
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
        bail!(
            "the catalog has no track to play: {:?}",
            c.tracks
                .iter()
                .map(|t| (t.name.as_str(), t.packaging.as_ref().map(Packaging::as_str)))
                .collect::<Vec<_>>()
        );
    }
    Ok(out)
}

/// Subscribes to a media broadcast and writes fragmented MP4; see [`MediaSubArgs`].
pub async fn subscribe(
    a: &MediaSubArgs,
    broadcast: &str,
    session: &ClientSession,
    rendezvous_ms: u64,
    until: Instant,
    count: Option<u64>,
) -> anyhow::Result<()> {
    let opts = SubscribeOptions {
        rendezvous_ms: (rendezvous_ms > 0).then_some(rendezvous_ms),
        ..Default::default()
    };
    let (is_msf, mut cat_sub) = tokio::select! {
        r = subscribe_catalog(session, broadcast, opts) => r?,
        _ = tokio::time::sleep_until(until) => return Ok(()),
    };
    // The current catalog is the latest group's: fetch it (MSF: object 0
    // and the delta updates after it, a Joining FETCH as §Catalog asks) if
    // the subscription started after it, else wait for it.
    let mut catalog = None;
    if cat_sub.largest.is_some() {
        let r = session
            .fetch(
                FetchKind::RelativeJoining {
                    joining_request_id: cat_sub.request_id,
                    joining_start: 0,
                },
                Parameters::default(),
            )
            .await?;
        let objects: Vec<_> = if is_msf {
            r.objects
        } else {
            r.objects.into_iter().last().into_iter().collect()
        };
        for o in objects.iter().filter(|o| !o.payload.is_empty()) {
            read_catalog(&mut catalog, is_msf, &o.payload)?;
        }
    }
    while catalog.is_none() {
        let ev = tokio::select! {
            ev = cat_sub.next() => ev,
            _ = tokio::time::sleep_until(until) => return Ok(()),
        };
        match ev {
            Some(SubscriptionEvent::Object(o)) if !o.payload.is_empty() => {
                read_catalog(&mut catalog, is_msf, &o.payload)?
            }
            Some(SubscriptionEvent::Done { .. }) | None => {
                bail!("the broadcast ended before its catalog")
            }
            _ => {}
        }
    }
    let Some(catalog) = catalog else {
        bail!("no catalog");
    };
    let chosen = match &catalog {
        AnyCatalog::Hang(c) => choose_hang(a, c),
        AnyCatalog::Msf(c) => choose_msf(a, c),
    }
    .with_context(|| format!("broadcast {broadcast}"))?;
    eprintln!(
        "catalog: {}",
        if is_msf {
            "MSF (draft-ietf-moq-msf-01)"
        } else {
            "hang"
        }
    );
    let mut outputs = Vec::new();
    for (i, c) in chosen.into_iter().enumerate() {
        let id = i as u32 + 1;
        let (info, cmaf) = match (&c.packing, &c.init) {
            (Packing::Cmaf, Some(init)) => {
                let mut d = Fmp4Demuxer::default();
                d.push(init);
                let t = match d.next() {
                    Ok(Some(Event::Tracks(t))) if !t.is_empty() => t[0].clone(),
                    other => bail!("rendition {}: bad init segment ({other:?})", c.name),
                };
                (TrackInfo { id, ..t }, Some(d))
            }
            _ => {
                // Legacy and LOC timestamps are µs; the output's timescale
                // is the one an fMP4 of the track would have.
                let mut t = TrackInfo { id, ..c.info };
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
            .map_or(33_333, |f| (1e6 / f) as i64);
        let configured = sample_entry(&info).is_ok();
        eprintln!("rendition {}: {} ({})", c.name, info.codec, describe(&info));
        outputs.push((
            c.name,
            Output {
                info,
                packing: c.packing,
                cmaf,
                reorder: Reorder::default(),
                last_dts: None,
                frame_us,
                frames: 0,
                waiting_keyframe: true,
                configured,
            },
        ));
    }
    let mut out: Box<dyn Write + Send> = if a.output == "-" {
        Box::new(std::io::stdout())
    } else {
        Box::new(std::io::BufWriter::new(
            std::fs::File::create(&a.output).with_context(|| format!("create {}", a.output))?,
        ))
    };

    // Subscribe each rendition from the latest object, and fetch the
    // current group up to it, so output starts at the GOP's keyframe at once.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Arrival)>();
    let mut subs = Vec::new();
    for (i, (track_name, _)) in outputs.iter().enumerate() {
        let name = FullTrackName::new(broadcast, track_name);
        let mut sub = session
            .subscribe(
                name,
                SubscribeOptions {
                    filter: Some(SubscriptionFilter::LargestObject),
                    rendezvous_ms: (rendezvous_ms > 0).then_some(rendezvous_ms),
                    ..Default::default()
                },
            )
            .await
            .with_context(|| format!("subscribe to {track_name}"))?;
        if sub.largest.is_some() {
            let r = session
                .fetch(
                    FetchKind::RelativeJoining {
                        joining_request_id: sub.request_id,
                        joining_start: 0,
                    },
                    Parameters::default(),
                )
                .await?;
            for o in r.objects {
                let obj = Obj {
                    payload: o.payload,
                    properties: o.properties,
                };
                let _ = tx.send((i, Arrival::Object(o.group, None, o.object_id, obj)));
            }
        }
        let tx = tx.clone();
        subs.push(tokio::spawn(async move {
            while let Some(ev) = sub.next().await {
                match ev {
                    SubscriptionEvent::Object(o) => {
                        let obj = Obj {
                            payload: o.payload,
                            properties: o.properties,
                        };
                        let a = Arrival::Object(o.group, o.subgroup, o.object_id, obj);
                        if tx.send((i, a)).is_err() {
                            break;
                        }
                    }
                    SubscriptionEvent::SubgroupEnd {
                        group, subgroup, ..
                    } => {
                        let _ = tx.send((i, Arrival::SubgroupEnd(group, subgroup)));
                    }
                    SubscriptionEvent::Done { .. } => break,
                }
            }
            let _ = tx.send((i, Arrival::Done));
            sub.cancel();
        }));
    }
    drop(tx);
    // Catalog updates keep coming on the catalog subscription: read them
    // (and say what changed) while the media plays.
    let (cat_tx, mut cat_rx) = tokio::sync::mpsc::unbounded_channel::<Option<Bytes>>();
    let cat_task = tokio::spawn(async move {
        while let Some(ev) = cat_sub.next().await {
            let payload = match ev {
                SubscriptionEvent::Object(o) => o.payload,
                SubscriptionEvent::Done { .. } => break,
                _ => continue,
            };
            if !payload.is_empty() && cat_tx.send(Some(payload)).is_err() {
                break;
            }
        }
        let _ = cat_tx.send(None);
        cat_sub.cancel();
    });
    let mut catalog = Some(catalog);
    let mut catalog_open = true;
    let mut fragmenter = Fragmenter::new();
    let mut open = outputs.len();
    let mut written = 0u64;
    let mut first_dts: Option<i64> = None;
    // Frames held until every output knows its decoder configuration
    // (LOC), so the init segment can be written first.
    let mut pending: Vec<(usize, Frame)> = Vec::new();
    let mut started = false;
    let result: anyhow::Result<()> = async {
        let mut tick = tokio::time::interval(REORDER_WAIT / 4);
        // Once the media has ended, a moment more for the catalog's last
        // word (MSF's isComplete), which comes after the tracks end.
        let mut linger: Option<Instant> = None;
        while open > 0 || (catalog_open && linger.is_none_or(|l| Instant::now() < l)) {
            if open == 0 && linger.is_none() {
                linger = Some(Instant::now() + Duration::from_secs(1));
            }
            let msg = tokio::select! {
                m = rx.recv(), if open > 0 => m,
                c = cat_rx.recv(), if catalog_open => {
                    match c.flatten() {
                        Some(p) => catalog_update(&mut catalog, is_msf, &p),
                        None => catalog_open = false,
                    }
                    continue;
                }
                _ = tick.tick() => Some((usize::MAX, Arrival::Tick)),
                _ = tokio::time::sleep_until(until) => break,
            };
            let Some((i, arrival)) = msg else { break };
            let ready: Vec<(usize, bool, Obj)> = match arrival {
                Arrival::Object(group, subgroup, object, obj) => outputs[i]
                    .1
                    .reorder
                    .object(group, subgroup, object, obj)
                    .into_iter()
                    .map(|(s, p)| (i, s, p))
                    .collect(),
                Arrival::SubgroupEnd(group, subgroup) => outputs[i]
                    .1
                    .reorder
                    .subgroup_end(group, subgroup)
                    .into_iter()
                    .map(|(s, p)| (i, s, p))
                    .collect(),
                Arrival::Done => {
                    open -= 1;
                    outputs[i]
                        .1
                        .reorder
                        .release(true)
                        .into_iter()
                        .map(|(s, p)| (i, s, p))
                        .collect()
                }
                Arrival::Tick => {
                    let mut v = Vec::new();
                    for (j, (_, o)) in outputs.iter_mut().enumerate() {
                        v.extend(o.reorder.release(false).into_iter().map(|(s, p)| (j, s, p)));
                    }
                    v
                }
            };
            for (i, starts_group, obj) in ready {
                let o = &mut outputs[i].1;
                for f in decode_object(o, starts_group, obj)? {
                    pending.push((i, f));
                }
            }
            if !started {
                if outputs.iter().all(|(_, o)| o.configured) {
                    let tracks: Vec<TrackInfo> =
                        outputs.iter().map(|(_, o)| o.info.clone()).collect();
                    out.write_all(&init_segment(&tracks)?)?;
                    started = true;
                } else if pending.len() > MAX_PENDING {
                    let missing: Vec<_> = outputs
                        .iter()
                        .filter(|(_, o)| !o.configured)
                        .map(|(n, _)| n.as_str())
                        .collect();
                    bail!("no decoder configuration arrived for {missing:?}");
                } else {
                    continue;
                }
            }
            for (i, mut f) in pending.drain(..) {
                let o = &mut outputs[i].1;
                // Output time starts at the first frame's decode time, so
                // no decode time is negative.
                let base = *first_dts.get_or_insert(f.dts);
                f.dts -= base;
                f.pts -= base;
                let frag = fragmenter.fragment(&o.info, &f)?;
                match out.write_all(&frag).and_then(|_| out.flush()) {
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    r => r.context("write output")?,
                }
                o.frames += 1;
                written += 1;
                if count.is_some_and(|c| written >= c) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
    .await;
    for s in subs {
        s.abort();
    }
    cat_task.abort();
    let summary: Vec<_> = outputs
        .iter()
        .map(|(n, o)| {
            let late = o.reorder.late;
            match late {
                0 => format!("{n} {} frames", o.frames),
                l => format!("{n} {} frames ({l} arrived too late)", o.frames),
            }
        })
        .collect();
    eprintln!("wrote {}: {}", a.output, summary.join(", "));
    result
}

/// Frames held at most while waiting for decoder configurations.
const MAX_PENDING: usize = 1024;

/// Applies a catalog update that arrived during playback and says what it
/// changed. The tracks being played stay as they are (a new configuration
/// would need a new init segment); a bad update is reported and skipped.
fn catalog_update(cur: &mut Option<AnyCatalog>, is_msf: bool, payload: &[u8]) {
    let names = |c: &Option<AnyCatalog>| -> Vec<String> {
        match c {
            Some(AnyCatalog::Msf(c)) => c.tracks.iter().map(|t| t.name.clone()).collect(),
            Some(AnyCatalog::Hang(c)) => c.renditions().map(|(_, n, _)| n.clone()).collect(),
            None => Vec::new(),
        }
    };
    let before = names(cur);
    if let Err(e) = read_catalog(cur, is_msf, payload) {
        eprintln!("catalog update ignored: {e}");
        return;
    }
    let after = names(cur);
    if let Some(AnyCatalog::Msf(c)) = cur {
        if c.is_complete {
            eprintln!("catalog: broadcast complete");
            return;
        }
    }
    if before != after {
        eprintln!("catalog update: tracks {after:?}");
    }
}

/// Turns one object into frames with decode times.
fn decode_object(o: &mut Output, starts_group: bool, obj: Obj) -> anyhow::Result<Vec<Frame>> {
    let mut frames = Vec::new();
    match o.packing {
        Packing::Cmaf => {
            if let Some(d) = o.cmaf.as_mut() {
                d.push(&obj.payload);
                while let Some(ev) = d.next()? {
                    if let Event::Frame(f) = ev {
                        frames.push(Frame {
                            track: o.info.id,
                            ..f
                        });
                    }
                }
            }
        }
        Packing::Legacy => {
            let (pts, data) = hang::decode_legacy(&obj.payload)?;
            let keyframe = starts_group || o.info.kind == TrackKind::Audio;
            frames.push(timed_frame(o, pts as i64, keyframe, data));
        }
        Packing::Loc => {
            let p = LocProperties::decode(&obj.properties)?;
            let pts = p
                .pts_micros()
                .context("LOC object without a Timestamp property")?;
            // The frame marking's I bit says where decoding can start; a
            // publisher without it starts each group with a keyframe (MSF).
            let keyframe = match p.frame_marking {
                Some(m) => m.independent,
                None => starts_group || o.info.kind == TrackKind::Audio,
            };
            let config = match o.info.kind {
                TrackKind::Video => p.video_config,
                TrackKind::Audio => p.audio_config,
            };
            if let Some(c) = config {
                if !o.configured {
                    o.info.description = Some(c);
                    o.configured = sample_entry(&o.info).is_ok();
                }
            }
            frames.push(timed_frame(o, pts, keyframe, obj.payload));
        }
    }
    // Nothing decodes before the first keyframe.
    if o.waiting_keyframe {
        if let Some(i) = frames.iter().position(|f| f.keyframe) {
            frames.drain(..i);
            o.waiting_keyframe = false;
        } else {
            frames.clear();
        }
    }
    Ok(frames)
}

/// A frame of a format that carries presentation times only (hang legacy,
/// LOC). Decode times are made up: a frame's duration apart, starting two
/// frames before the GOP's keyframe presents (room for B frames),
/// re-anchored whenever a keyframe shows the estimate has drifted.
fn timed_frame(o: &mut Output, pts: i64, keyframe: bool, data: Bytes) -> Frame {
    let dts = match (o.info.kind, o.last_dts) {
        (TrackKind::Audio, _) => pts,
        (TrackKind::Video, None) => pts - 2 * o.frame_us,
        (TrackKind::Video, Some(last)) => {
            let next = last + o.frame_us;
            let anchor = pts - 2 * o.frame_us;
            if keyframe && (next - anchor).abs() > o.frame_us / 2 {
                anchor.max(last + 1)
            } else {
                next
            }
        }
    };
    o.last_dts = Some(dts);
    Frame {
        track: o.info.id,
        pts,
        dts,
        duration: if o.info.kind == TrackKind::Video {
            o.frame_us as u32
        } else {
            0
        },
        keyframe,
        disposable: false,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorder_waits_for_the_previous_group_to_end() {
        let mut r = Reorder::default();
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let p = |v: Vec<(bool, Bytes)>| v.into_iter().map(|(_, p)| p).collect::<Vec<_>>();
        assert_eq!(p(r.object(0, Some(0), 0, b("0.0"))), vec![b("0.0")]);
        // Group 1 overtakes the end of group 0: held.
        assert!(r.object(1, Some(0), 0, b("1.0")).is_empty());
        assert_eq!(p(r.object(0, Some(0), 1, b("0.1"))), vec![b("0.1")]);
        // Group 0's stream ends: group 1 may go.
        assert_eq!(p(r.subgroup_end(0, 0)), vec![b("1.0")]);
        // Frame-type subgroups: object 2 (subgroup 2) before 1 (subgroup 1).
        assert!(r.object(1, Some(2), 2, b("1.2")).is_empty());
        assert_eq!(
            p(r.object(1, Some(1), 1, b("1.1"))),
            vec![b("1.1"), b("1.2")]
        );
        // Late objects of a group already passed are dropped and counted.
        assert!(r.object(0, Some(0), 2, b("late")).is_empty());
        assert_eq!(r.late, 1);
        // A gap never filled is given up at the flush.
        assert!(r.object(1, Some(0), 4, b("1.4")).is_empty());
        assert_eq!(p(r.release(true)), vec![b("1.4")]);
    }

    #[test]
    fn sniffs_ts_and_mp4() {
        let mut ts = vec![0u8; 376];
        ts[0] = 0x47;
        ts[188] = 0x47;
        assert_eq!(sniff(&ts), InputFormat::Ts);
        assert_eq!(sniff(b"\0\0\0\x18ftypiso6"), InputFormat::Fmp4);
    }
}
