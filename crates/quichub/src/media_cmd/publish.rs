//! `pub --broadcast`: demux, pace, package and publish.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::{FullTrackName, KeyValue, TrackNamespace};
use quichub_client::{ClientSession, LocalTrack, SubgroupWriter, TrackMode};
use quichub_media::fmp4::Fmp4Demuxer;
use quichub_media::hang::{self, Container};
use quichub_media::loc::{FrameMarking, LocProperties};
use quichub_media::msf::{self, Packaging};
use quichub_media::mux::{init_segment, Fragmenter};
use quichub_media::ts::TsDemuxer;
use quichub_media::{Demuxer, Event, Frame, Limits, TrackInfo, TrackKind};
use tokio::time::Instant;

use super::*;

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
    let shape = a.shape_config()?;
    let shaper = shape
        .active()
        .then(|| quichub_client::Shaper::start(session, shape));
    if let Some(s) = &shaper {
        catalog_track.set_shaper(s.clone());
    }
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
                        if let Some(s) = &shaper {
                            for r in &renditions {
                                r.track.set_shaper(s.clone());
                            }
                        }
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
    if let Some(s) = &shaper {
        s.drain().await;
        let st = s.stats();
        s.stop();
        eprintln!(
            "shaping: {} media bytes, {} padding bytes ({:.1}% overhead), {} overruns{}",
            st.media_bytes,
            st.padding_bytes,
            100.0 * st.padding_bytes as f64 / st.media_bytes.max(1) as f64,
            st.overruns,
            if st.padding_refused > 0 {
                format!(
                    ", {} padding bytes refused (datagrams off?)",
                    st.padding_refused
                )
            } else {
                String::new()
            }
        );
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

pub(super) fn describe(t: &TrackInfo) -> String {
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
    }
}
