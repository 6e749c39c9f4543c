//! `sub --broadcast`: read the catalog, subscribe the renditions, write fMP4.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::message::FetchKind;
use moqt::{FullTrackName, Parameters, SubscriptionFilter};
use quichub_client::{ClientSession, SubscribeOptions, SubscriptionEvent};
use quichub_media::codec::sample_entry;
use quichub_media::fmp4::Fmp4Demuxer;
use quichub_media::hang::{self, Container};
use quichub_media::loc::LocProperties;
use quichub_media::msf::{self, CatalogObject, Packaging};
use quichub_media::mux::{init_segment, Fragmenter};
use quichub_media::{Demuxer, Event, Frame, TrackInfo, TrackKind};
use tokio::time::Instant;

use super::publish::describe;
use super::reorder::*;
use super::*;

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
            // A catalog's framerate is peer input: 1 to 1000 frames per second.
            .map_or(33_333, |f| (1e6 / f).clamp(1_000.0, 1_000_000.0) as i64);
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
            // Objects go to the muxer as they arrive: the group's keyframe
            // plays before the rest of the group is in.
            let mut r = session
                .fetch_stream(
                    FetchKind::RelativeJoining {
                        joining_request_id: sub.request_id,
                        joining_start: 0,
                    },
                    Parameters::default(),
                )
                .await?;
            while let Some(o) = r.next().await? {
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
                f.dts = f.dts.saturating_sub(base);
                f.pts = f.pts.saturating_sub(base);
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
        (TrackKind::Video, None) => pts.saturating_sub(2 * o.frame_us),
        (TrackKind::Video, Some(last)) => {
            // Timestamps are peer input: saturate rather than overflow.
            let next = last.saturating_add(o.frame_us);
            let anchor = pts.saturating_sub(2 * o.frame_us);
            if keyframe && next.abs_diff(anchor) > (o.frame_us / 2) as u64 {
                anchor.max(last.saturating_add(1))
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

impl Held for Obj {
    fn len(&self) -> usize {
        self.payload.len() + self.properties.len()
    }
}
