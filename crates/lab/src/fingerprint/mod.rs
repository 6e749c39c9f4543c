//! `lab fingerprint`: can an on-path observer tell the resolution of a
//! video that quichub streams, from the sizes and times of its encrypted
//! QUIC packets alone? And what does it cost to stop it? After A.
//! Sengupta, "Streaming over QUIC: Applications in Media and IoT", 2025
//! (its fingerprinting section: bitrate bounds, 93 % on a MoQT testbed;
//! burst sizes, 77 % on YouTube).
//!
//! The same content is encoded by ffmpeg at 360p, 480p, 720p and 1080p
//! (H.264, typical ladder bitrates, 1 s GOPs, capped VBR with a 1 s buffer).
//! Many short sessions each publish a slice of one of them (starting at a
//! random GOP) in real time: a quichub client in the emulator's client
//! namespace publishes (hang format, one group per GOP) to quichub's relay
//! in the server namespace, and a subscriber in the client namespace
//! receives it back across the link. The four resolutions of a batch run at
//! once, each on its own connection (ports tell them apart). The emulator
//! records every packet's size and time ([`Emulator::start_capture`]), which
//! is all an on-path observer sees; the attacker ([`classify`]) classifies each session from its publisher's
//! uplink (the hop the defence shapes) and from its subscriber's downlink.
//!
//! Defences are `quichub pub --shape-rate` / `--pad-objects`
//! ([`quichub_client::shape`]), applied per session as each setting says.

mod classify;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{mpsc as smpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::{
    ClientSession, ConnectOptions, ShapeConfig, Shaper, SubscribeOptions, SubscriptionEvent,
    TrackMode,
};
use quichub_media::fmp4::Fmp4Demuxer;
use quichub_media::hang;
use quichub_media::{Demuxer, Event, Frame, Limits, TrackKind};
use quichub_netem::emulator::{Capture, Emulator};
use quichub_netem::model::{LinkConfig, QueueLimit};
use quichub_netem::profile::Profile;
use serde::Serialize;

use crate::common::rt::{runtime, step, STEP};
use crate::common::stats::Spread;
use crate::common::studies::SENGUPTA_2025;
use crate::common::svg::{category_chart, line_chart, CatSeries, Series, COLORS};
use crate::common::Options;
use classify::{self as fc, Classifier, Score, SessionFeatures};

/// Options of `lab fingerprint`.
#[derive(clap::Args, Debug, Clone)]
pub struct FingerprintArgs {
    /// Seconds of video per session (default 4, or 2 with --quick).
    #[arg(long)]
    pub session_secs: Option<f64>,
    /// Sessions per resolution and content (default 8, or 3 with --quick).
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Contents, comma-separated ffmpeg lavfi sources among testsrc2,
    /// mandelbrot, life (default all three, or testsrc2 with --quick).
    #[arg(long)]
    pub contents: Option<String>,
    /// Defence settings, comma-separated, among none, buckets-1.5,
    /// rate-own-1.25, rate-2-rungs, rate-5400 (default all, or
    /// none,rate-5400 with --quick).
    #[arg(long)]
    pub defences: Option<String>,
    /// Cross-validation folds (stratified; fewer when a class has fewer
    /// sessions).
    #[arg(long, default_value_t = 5)]
    pub folds: usize,
    /// Starting state of the pseudo-random session plan and fold shuffling
    /// (repetition r of the cross-validation uses this + r).
    #[arg(long, default_value_t = 14)]
    pub random_state: u64,
    /// The ffmpeg binary.
    #[arg(long, default_value = "ffmpeg")]
    pub ffmpeg: String,
}

/// The resolutions: name, width, height, target kbit/s (a typical ladder,
/// near the study's Table 1 medians for 360p, 720p and 1080p).
pub const RESOLUTIONS: [(&str, u32, u32, u64); 4] = [
    ("360p", 640, 360, 800),
    ("480p", 854, 480, 1500),
    ("720p", 1280, 720, 3000),
    ("1080p", 1920, 1080, 4500),
];

/// Every content source the experiment knows.
pub const CONTENTS: [&str; 3] = ["testsrc2", "mandelbrot", "life"];

/// Every defence setting, in table order.
pub const DEFENCES: [&str; 5] = [
    "none",
    "buckets-1.5",
    "rate-own-1.25",
    "rate-2-rungs",
    "rate-5400",
];

/// GOP length of the encodes, frames (1 s at 30 fps).
const GOP: u32 = 30;
const FPS: u32 = 30;
/// The link: 20 ms RTT, 50 Mbit/s each way, no loss.
const LINK_MBPS: u64 = 50;
/// Study's Table 1 (kbit/s per video, 7 videos) for 360p, 720p, 1080p.
const STUDY_TABLE1: [(&str, [f64; 7]); 3] = [
    ("360p", [801., 831., 798., 822., 1050., 1320., 680.]),
    ("720p", [2944., 3098., 2941., 3101., 3249., 3987., 2964.]),
    ("1080p", [4482., 4316., 4364., 4938., 5082., 5476., 3624.]),
];

/// What a defence setting does to a session of resolution `class`.
pub fn defence_config(name: &str, class: usize) -> anyhow::Result<Option<ShapeConfig>> {
    let kbps = RESOLUTIONS[class].3;
    let rate = |k: u64| {
        Some(ShapeConfig {
            rate_bps: Some(k * 1000),
            ..Default::default()
        })
    };
    Ok(match name {
        "none" => None,
        "buckets-1.5" => Some(ShapeConfig {
            bucket_ratio: Some(1.5),
            ..Default::default()
        }),
        "rate-own-1.25" => rate(kbps * 5 / 4),
        "rate-2-rungs" => rate(if class < 2 { 2000 } else { 5400 }),
        "rate-5400" => rate(5400),
        n => bail!("unknown defence {n:?}: one of {}", DEFENCES.join(", ")),
    })
}

fn describe_defence(name: &str) -> &'static str {
    match name {
        "none" => "no shaping",
        "buckets-1.5" => "`--pad-objects 1.5`: every object padded to the next size of 256 B × 1.5^k",
        "rate-own-1.25" => "`--shape-rate` at 1.25 × the rendition's own target bitrate (1000, 1875, 3750, 5625 kbit/s): the 25 % budget, rate still per resolution",
        "rate-2-rungs" => "`--shape-rate 2000` for 360p and 480p, `--shape-rate 5400` for 720p and 1080p: two rungs",
        "rate-5400" => "`--shape-rate 5400` for every resolution (1.2 × the 1080p target)",
        _ => "",
    }
}

/// The run's settings.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Seconds per session.
    pub session_secs: f64,
    /// Sessions per (resolution, content).
    pub sessions: usize,
    /// Contents.
    pub contents: Vec<String>,
    /// Defences.
    pub defences: Vec<String>,
    /// Clip length, s.
    pub clip_secs: u32,
    /// Folds asked for.
    pub folds: usize,
    /// Starting state of the pseudo-random plan and folds.
    pub random_state: u64,
    /// Cross-validation repetitions (`--reps`).
    pub reps: u32,
}

/// Resolves the options.
pub fn settings(args: &Options, f: &FingerprintArgs) -> anyhow::Result<Settings> {
    let session_secs = f.session_secs.unwrap_or(if args.quick { 2.0 } else { 4.0 });
    anyhow::ensure!(
        (1.0..=20.0).contains(&session_secs),
        "--session-secs must be in [1, 20]"
    );
    let sessions = f.sessions.unwrap_or(if args.quick { 3 } else { 8 });
    anyhow::ensure!(
        (2..=100).contains(&sessions),
        "--sessions must be in [2, 100]"
    );
    let list = |s: &Option<String>, quick: &str, all: &[&str]| -> anyhow::Result<Vec<String>> {
        let s = s.clone().unwrap_or_else(|| {
            if args.quick {
                quick.into()
            } else {
                all.join(",")
            }
        });
        let v: Vec<String> = s
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect();
        for x in &v {
            anyhow::ensure!(
                all.contains(&x.as_str()),
                "unknown {x:?}: one of {}",
                all.join(", ")
            );
        }
        anyhow::ensure!(!v.is_empty(), "empty list");
        Ok(v)
    };
    let contents = list(&f.contents, "testsrc2", &CONTENTS)?;
    let defences = list(&f.defences, "none,rate-5400", &DEFENCES)?;
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    anyhow::ensure!(f.folds >= 2, "--folds must be at least 2");
    // Room for sessions starting at several GOPs.
    let clip_secs = (session_secs.ceil() as u32 * 2 + 2).max(4);
    Ok(Settings {
        session_secs,
        sessions,
        contents,
        defences,
        clip_secs,
        folds: f.folds,
        random_state: f.random_state,
        reps: args.reps,
    })
}

/// The link of the experiment.
pub fn link() -> Profile {
    let dir = LinkConfig {
        delay: Duration::from_millis(10),
        rate_bps: Some(LINK_MBPS * 1_000_000),
        queue: QueueLimit::Time(Duration::from_millis(50)),
        ..Default::default()
    };
    Profile {
        name: "fp-20ms-50mbit".into(),
        up: dir.clone(),
        down: dir,
        source:
            "lab fingerprint: 20 ms RTT, 50 Mbit/s each way, no loss (above every setting's rate)"
                .into(),
    }
}

/// One encoded clip.
#[derive(Debug, Clone, Serialize)]
pub struct ClipInfo {
    /// Content source.
    pub content: String,
    /// Resolution name.
    pub resolution: &'static str,
    /// Target kbit/s.
    pub target_kbps: u64,
    /// Frames.
    pub frames: usize,
    /// Mean bitrate of the frames, kbit/s.
    pub media_kbps: f64,
    #[serde(skip)]
    frames_data: Vec<Frame>,
    #[serde(skip)]
    keyframes: Vec<usize>,
}

/// Encodes `content` at every resolution into `dir` with ffmpeg and loads
/// the frames.
fn encode(ffmpeg: &str, content: &str, secs: u32, dir: &Path) -> anyhow::Result<Vec<ClipInfo>> {
    let mut filter = format!("[0:v]split={}", RESOLUTIONS.len());
    for i in 0..RESOLUTIONS.len() {
        filter.push_str(&format!("[s{i}]"));
    }
    for (i, (_, w, h, _)) in RESOLUTIONS.iter().enumerate() {
        // Grain after scaling gives every resolution camera-like detail.
        filter.push_str(&format!(";[s{i}]scale={w}:{h},noise=alls=6:allf=t[o{i}]"));
    }
    let mut cmd = std::process::Command::new(ffmpeg);
    // `-t` before `-i` bounds the (endless) lavfi source for every output;
    // `-frames:v` bounds each output again.
    cmd.args([
        "-hide_banner",
        "-loglevel",
        "error",
        "-nostdin",
        "-y",
        "-f",
        "lavfi",
    ])
    .args(["-t", &secs.to_string(), "-i"])
    .arg(format!("{content}=size=960x540:rate={FPS}"))
    .args(["-filter_complex", &filter]);
    let frames = (secs * FPS).to_string();
    let mut paths = Vec::new();
    for (i, (name, _, _, kbps)) in RESOLUTIONS.iter().enumerate() {
        let p = dir.join(format!("{content}-{name}.mp4"));
        cmd.args(["-map", &format!("[o{i}]"), "-frames:v", &frames])
            .args(["-c:v", "libx264", "-preset", "veryfast"])
            .args(["-b:v", &format!("{kbps}k"), "-maxrate", &format!("{kbps}k")])
            .args(["-bufsize", &format!("{kbps}k"), "-g", &GOP.to_string()])
            .args([
                "-keyint_min",
                &GOP.to_string(),
                "-sc_threshold",
                "0",
                "-bf",
                "0",
            ])
            .args([
                "-pix_fmt",
                "yuv420p",
                "-threads",
                "1",
                "-f",
                "mp4",
                "-movflags",
            ])
            .arg("cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame")
            .arg(&p);
        paths.push(p);
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {ffmpeg} (is ffmpeg installed?)"))?;
    anyhow::ensure!(
        out.status.success(),
        "ffmpeg failed encoding {content}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut clips = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let frames = load(p)?;
        let keyframes: Vec<usize> = (0..frames.len()).filter(|&i| frames[i].keyframe).collect();
        anyhow::ensure!(
            keyframes.first() == Some(&0),
            "{} starts without a keyframe",
            p.display()
        );
        let bytes: usize = frames.iter().map(|f| f.data.len()).sum();
        let span = frames.len() as f64 / f64::from(FPS);
        clips.push(ClipInfo {
            content: content.into(),
            resolution: RESOLUTIONS[i].0,
            target_kbps: RESOLUTIONS[i].3,
            frames: frames.len(),
            media_kbps: bytes as f64 * 8.0 / 1000.0 / span.max(1e-9),
            frames_data: frames,
            keyframes,
        });
        let _ = std::fs::remove_file(p);
    }
    Ok(clips)
}

fn load(path: &Path) -> anyhow::Result<Vec<Frame>> {
    let data = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let mut d = Fmp4Demuxer::new(Limits::default());
    d.push(&data);
    d.end();
    let (mut video, mut frames) = (None, Vec::new());
    while let Some(ev) = d.next()? {
        match ev {
            Event::Tracks(t) => {
                video = video.or_else(|| {
                    t.into_iter()
                        .find(|t| t.kind == TrackKind::Video)
                        .map(|t| t.id)
                })
            }
            Event::Frame(f) if Some(f.track) == video => frames.push(f),
            Event::Frame(_) => {}
        }
    }
    anyhow::ensure!(!frames.is_empty(), "no video frames in {}", path.display());
    Ok(frames)
}

/// What the observer saw of one flow.
#[derive(Debug, Clone, Serialize)]
pub struct Observed {
    /// Data packets in the window.
    pub packets: usize,
    /// Their IP bytes.
    pub bytes: u64,
    /// Features.
    pub features: SessionFeatures,
}

/// One session.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRecord {
    /// Defence setting.
    pub defence: String,
    /// Batch (the four resolutions of a batch ran at once).
    pub batch: usize,
    /// Content.
    pub content: String,
    /// Resolution.
    pub resolution: &'static str,
    /// Class index.
    pub class: usize,
    /// First GOP of the slice.
    pub start_gop: usize,
    /// Frames published.
    pub frames_sent: u64,
    /// Objects the subscriber received.
    pub objects_received: u64,
    /// Media bytes (object payloads) published.
    pub media_bytes: u64,
    /// Padding bytes the shaper sent.
    pub padding_bytes: u64,
    /// Padding bytes refused (no datagrams).
    pub padding_refused: u64,
    /// Shaper overruns.
    pub overruns: u64,
    /// Longest a media piece waited in the shaper, ms.
    pub shaper_max_wait_ms: f64,
    /// The publisher's QUIC connection: packets lost, congestion events and
    /// the congestion window at the end.
    pub quic_lost_packets: u64,
    /// Congestion events.
    pub quic_congestion_events: u64,
    /// Congestion window at the end, bytes.
    pub quic_cwnd: u64,
    /// Frame due → object at the subscriber, ms: median.
    pub latency_p50_ms: Option<f64>,
    /// The same, 95th percentile.
    pub latency_p95_ms: Option<f64>,
    /// Publisher → relay (the uplink), data direction.
    pub uplink: Option<Observed>,
    /// Relay → subscriber (the downlink), data direction.
    pub downlink: Option<Observed>,
    /// Why it failed.
    pub error: Option<String>,
}

impl SessionRecord {
    fn one_line(&self) -> String {
        match &self.error {
            Some(e) => format!(
                "{} batch {} {} {}: FAILED: {e}",
                self.defence, self.batch, self.content, self.resolution
            ),
            None => format!(
                "{:<13} batch {:>2} {:<10} {:<5} gop {}: {}/{} objects, up {:.0} kbit/s down {:.0} kbit/s, latency p50 {} ms, padding {} B, overruns {}, shaper wait max {:.0} ms, QUIC lost {} cwnd {}",
                self.defence,
                self.batch,
                self.content,
                self.resolution,
                self.start_gop,
                self.objects_received,
                self.frames_sent,
                self.uplink.as_ref().map_or(0.0, |o| o.features.kbps),
                self.downlink.as_ref().map_or(0.0, |o| o.features.kbps),
                self.latency_p50_ms.map_or("–".into(), |v| format!("{v:.1}")),
                self.padding_bytes,
                self.overruns,
                self.shaper_max_wait_ms,
                self.quic_lost_packets,
                self.quic_cwnd
            ),
        }
    }
}

/// A batch to run: one content, one start GOP, every resolution at once.
#[derive(Debug, Clone)]
struct Batch {
    content: usize,
    start_gop: usize,
}

fn plan(s: &Settings, clips: &[Vec<ClipInfo>]) -> Vec<Batch> {
    let mut rng = fc::SplitMix(s.random_state);
    let mut out = Vec::new();
    for (ci, c) in clips.iter().enumerate() {
        // Start GOPs from which a whole session's frames exist in every clip.
        let gops = c.iter().map(|x| x.keyframes.len()).min().unwrap_or(1);
        let need = s.session_secs.ceil() as usize;
        let starts = gops.saturating_sub(need).max(1);
        for _ in 0..s.sessions {
            out.push(Batch {
                content: ci,
                start_gop: rng.below(starts),
            });
        }
    }
    out
}

/// Commands from the client thread to the thread that owns the emulator.
enum Cmd {
    Start(smpsc::Sender<()>),
    Stop(smpsc::Sender<Capture>),
}

/// One session's live state on the client side.
struct Live {
    class: usize,
    pub_port: u16,
    sub_port: u16,
    publisher: ClientSession,
    subscriber: ClientSession,
    track: Arc<quichub_client::LocalTrack>,
    sub: Option<quichub_client::Subscription>,
    shaper: Option<Arc<Shaper>>,
}

async fn setup(
    relay: SocketAddr,
    class: usize,
    tag: &str,
    defence: &str,
    port_base: u16,
) -> anyhow::Result<Live> {
    // Ports tell the sessions apart in the capture; each batch has its own
    // (a closed session's socket lingers while the connection drains).
    let pub_port = port_base + 2 * class as u16;
    let sub_port = pub_port + 1;
    let url = format!("moqt://{relay}/");
    let opts = |port: u16| ConnectOptions {
        bind: SocketAddr::from(([0, 0, 0, 0], port)),
        ..Default::default()
    };
    let shape = defence_config(defence, class)?;
    let mut pub_opts = opts(pub_port);
    if shape.is_some_and(|c| c.rate_bps.is_some()) {
        // As `quichub pub --shape-rate` does: full-size packets only.
        pub_opts.endpoint = Some(
            quichub_net::client::Client::new(pub_opts.bind, pub_opts.verify.clone())?
                .pad_to_mtu(true),
        );
    }
    let publisher = step("publisher connect", ClientSession::connect(&url, pub_opts)).await?;
    let name = FullTrackName {
        namespace: TrackNamespace::from_path(&format!("fp/{tag}/{class}")),
        name: Bytes::from_static(b"video"),
    };
    let track = publisher
        .create_track(name.clone(), 96, TrackMode::Announce)
        .await?;
    let announced = step(
        "PUBLISH_NAMESPACE",
        publisher.publish_namespace(name.namespace.clone()),
    )
    .await?;
    std::mem::forget(announced);
    let shaper = shape.map(|cfg| {
        let s = Shaper::start(&publisher, cfg);
        track.set_shaper(s.clone());
        s
    });
    let subscriber = step(
        "subscriber connect",
        ClientSession::connect(&url, opts(sub_port)),
    )
    .await?;
    let sub = step(
        "SUBSCRIBE",
        subscriber.subscribe(name, SubscribeOptions::default()),
    )
    .await?;
    let t0 = Instant::now();
    while !track.is_forwarding() {
        anyhow::ensure!(t0.elapsed() < STEP, "the relay never subscribed upstream");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Live {
        class,
        pub_port,
        sub_port,
        publisher,
        subscriber,
        track,
        sub: Some(sub),
        shaper,
    })
}

/// Per-session result of the client side (before the capture is read).
struct Played {
    frames_sent: u64,
    media_bytes: u64,
    received: u64,
    latencies_ms: Vec<f64>,
}

async fn play(
    live: &mut Live,
    clip: &ClipInfo,
    start_gop: usize,
    start: Instant,
    secs: f64,
) -> anyhow::Result<Played> {
    let first = clip.keyframes[start_gop.min(clip.keyframes.len() - 1)];
    let frames = &clip.frames_data[first..];
    let dts0 = frames[0].dts;
    let due: Arc<Mutex<HashMap<(u64, u64), Instant>>> = Arc::default();
    let span_us = (secs * 1e6) as i64;
    // The subscriber collects until told to stop.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let expected = frames.iter().take_while(|f| f.dts - dts0 < span_us).count() as u64;
    let mut sub = live.sub.take().context("subscription already used")?;
    let due_s = due.clone();
    let collector = tokio::spawn(async move {
        let (mut n, mut lat) = (0u64, Vec::new());
        loop {
            let ev = tokio::select! {
                ev = sub.next() => ev,
                _ = stop_rx.changed() => break,
            };
            match ev {
                Some(SubscriptionEvent::Object(o)) => {
                    n += 1;
                    if let Some(d) = due_s.lock().expect("due").get(&(o.group, o.object_id)) {
                        lat.push(o.arrived.saturating_duration_since(*d).as_secs_f64() * 1000.0);
                    }
                    if n >= expected {
                        break;
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        (n, lat)
    });
    let (mut group, mut object) = (0u64, 0u64);
    let mut writer = None;
    let (mut sent, mut bytes) = (0u64, 0u64);
    let mut streams = 0;
    for f in frames {
        let t = f.dts - dts0;
        if t >= span_us {
            break;
        }
        let at = start + Duration::from_micros(t.max(0) as u64);
        tokio::time::sleep_until(at.into()).await;
        if f.keyframe || writer.is_none() {
            if let Some(w) = writer.take() {
                quichub_client::SubgroupWriter::finish(w);
            }
            if sent > 0 {
                group += 1;
            }
            object = 0;
            writer = live.track.open_subgroup(group, 0).await?;
            streams += 1;
        }
        let payload = hang::encode_legacy(f.pts.max(0) as u64, &f.data);
        due.lock().expect("due").insert((group, object), at);
        bytes += payload.len() as u64;
        if let Some(w) = writer.as_mut() {
            w.write(object, payload).await?;
        }
        object += 1;
        sent += 1;
    }
    if let Some(w) = writer.take() {
        w.finish();
    }
    let _ = live.track.finish(streams).await;
    // Drain: every object, or 2 s.
    let deadline = tokio::time::sleep(Duration::from_secs(2));
    tokio::pin!(deadline);
    let mut collector = collector;
    let (received, latencies_ms) = tokio::select! {
        r = &mut collector => r?,
        _ = &mut deadline => {
            stop_tx.send_replace(true);
            collector.await?
        }
    };
    Ok(Played {
        frames_sent: sent,
        media_bytes: bytes,
        received,
        latencies_ms,
    })
}

fn observed(cap: &Capture, up: bool, port: u16, from_us: u64, span_us: u64) -> Observed {
    let mut pkts: Vec<(u64, u32)> = cap
        .packets
        .iter()
        .filter(|p| {
            p.proto == 17
                && p.up == up
                && !p.dropped
                && if up {
                    p.src_port == port
                } else {
                    p.dst_port == port
                }
                && p.t_us >= from_us
                && p.t_us < from_us + span_us
        })
        .map(|p| (p.t_us - from_us, p.len))
        .collect();
    pkts.sort_unstable();
    Observed {
        packets: pkts.len(),
        bytes: pkts.iter().map(|p| u64::from(p.1)).sum(),
        features: fc::features(&pkts, span_us),
    }
}

fn percentile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[((v.len() - 1) as f64 * q).round() as usize])
}

#[allow(clippy::too_many_arguments)]
async fn run_batch(
    relay: SocketAddr,
    clips: &[ClipInfo],
    b: &Batch,
    bi: usize,
    defence: &str,
    secs: f64,
    epoch: Instant,
    cmd: &smpsc::Sender<Cmd>,
    port_base: u16,
) -> Vec<SessionRecord> {
    let rec = |class: usize, err: Option<String>| SessionRecord {
        defence: defence.into(),
        batch: bi,
        content: clips[class].content.clone(),
        resolution: RESOLUTIONS[class].0,
        class,
        start_gop: b.start_gop,
        frames_sent: 0,
        objects_received: 0,
        media_bytes: 0,
        padding_bytes: 0,
        padding_refused: 0,
        overruns: 0,
        shaper_max_wait_ms: 0.0,
        quic_lost_packets: 0,
        quic_congestion_events: 0,
        quic_cwnd: 0,
        latency_p50_ms: None,
        latency_p95_ms: None,
        uplink: None,
        downlink: None,
        error: err,
    };
    let tag = format!("{defence}/{bi}");
    let mut lives = Vec::new();
    for (class, res) in RESOLUTIONS.iter().enumerate() {
        match setup(relay, class, &tag, defence, port_base).await {
            Ok(l) => lives.push(l),
            Err(e) => {
                for l in &lives {
                    l.publisher.close(0, "setup failed");
                    l.subscriber.close(0, "setup failed");
                }
                return (0..RESOLUTIONS.len())
                    .map(|c| rec(c, Some(format!("setup of {}: {e:#}", res.0))))
                    .collect();
            }
        }
    }
    let (ack_tx, ack_rx) = smpsc::channel();
    let _ = cmd.send(Cmd::Start(ack_tx));
    let _ = ack_rx.recv_timeout(STEP);
    // Shaper ticks run from their start; a short settle lets padding reach
    // its steady state before the observed window opens.
    let start = Instant::now() + Duration::from_millis(300);
    let from_us = start.saturating_duration_since(epoch).as_micros() as u64;
    let span_us = (secs * 1e6) as u64;
    let played: Vec<anyhow::Result<Played>> = futures_join(
        lives
            .iter_mut()
            .map(|l| {
                let clip = &clips[l.class];
                Box::pin(play(l, clip, b.start_gop, start, secs))
                    as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>>
            })
            .collect(),
    )
    .await;
    let (cap_tx, cap_rx) = smpsc::channel();
    let _ = cmd.send(Cmd::Stop(cap_tx));
    let cap = cap_rx.recv_timeout(STEP).unwrap_or_default();
    let mut out = Vec::new();
    for (l, p) in lives.iter().zip(played) {
        let mut r = rec(l.class, None);
        match p {
            Ok(mut p) => {
                r.frames_sent = p.frames_sent;
                r.objects_received = p.received;
                r.media_bytes = p.media_bytes;
                r.latency_p50_ms = percentile(&mut p.latencies_ms, 0.5);
                r.latency_p95_ms = percentile(&mut p.latencies_ms, 0.95);
                r.uplink = Some(observed(&cap, true, l.pub_port, from_us, span_us));
                r.downlink = Some(observed(&cap, false, l.sub_port, from_us, span_us));
                if cap.missed > 0 {
                    r.error = Some(format!("the capture missed {} packets", cap.missed));
                }
            }
            Err(e) => r.error = Some(format!("{e:#}")),
        }
        if let Some(s) = &l.shaper {
            s.drain().await;
            let st = s.stats();
            s.stop();
            r.padding_bytes = st.padding_bytes;
            r.padding_refused = st.padding_refused;
            r.overruns = st.overruns;
            r.shaper_max_wait_ms = st.max_wait_us as f64 / 1000.0;
        }
        // The lab dials QUIC (moqt://), never a WebSocket.
        if let Some(quic) = l.publisher.session().quic() {
            let q = web_transport_quinn::quinn::Connection::stats(quic);
            r.quic_lost_packets = q.path.lost_packets;
            r.quic_congestion_events = q.path.congestion_events;
            r.quic_cwnd = q.path.cwnd;
        }
        l.publisher.close(0, "done");
        l.subscriber.close(0, "done");
        out.push(r);
    }
    // Let the closes reach the relay before the next batch reuses the ports.
    tokio::time::sleep(Duration::from_millis(100)).await;
    out
}

/// Runs futures concurrently on the current task, results in order.
async fn futures_join<'a, T>(
    futs: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>>,
) -> Vec<T> {
    let n = futs.len();
    let mut futs: Vec<Option<_>> = futs.into_iter().map(Some).collect();
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for i in 0..n {
            if let Some(f) = futs[i].as_mut() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        out[i] = Some(v);
                        futs[i] = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future finished"))
        .collect()
}

async fn relay_side(
    info: smpsc::Sender<anyhow::Result<SocketAddr>>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let started: anyhow::Result<_> = async {
        let mut config = quichub_hub::Config::default();
        config.quic.bind = "0.0.0.0:0".into();
        config.mqtt.tcp = "off".into();
        config.mqtt.tls = "off".into();
        config.http.address = "off".into();
        config.metrics.address = "off".into();
        config.store.data_dir = Some("off".into());
        config.auth.allow_anonymous = Some(true);
        let hub = quichub_hub::Hub::start(config).await?;
        Ok((hub.addr(), hub))
    }
    .await;
    match started {
        Ok((addr, hub)) => {
            let _ = info.send(Ok(addr));
            let _ = stop.await;
            hub.server().close(0, b"done");
            Ok(())
        }
        Err(e) => {
            let _ = info.send(Err(e));
            bail!("relay setup failed")
        }
    }
}

/// Runs every batch of every defence; returns the sessions.
fn run_sessions(
    emu: &Emulator,
    s: &Settings,
    clips: Vec<Vec<ClipInfo>>,
    batches: Vec<Batch>,
) -> anyhow::Result<Vec<SessionRecord>> {
    let (info_tx, info_rx) = smpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<()> { runtime()?.block_on(relay_side(info_tx, stop_rx)) })
        .context("starting the relay thread")?;
    let addr = match info_rx.recv_timeout(STEP) {
        Ok(Ok(a)) => SocketAddr::from((emu.server().addr(), a.port())),
        Ok(Err(e)) => return Err(e.context("relay setup")),
        Err(_) => bail!("relay did not start: {:?}", server.join()),
    };
    let (cmd_tx, cmd_rx) = smpsc::channel::<Cmd>();
    let epoch = emu.epoch();
    let defences = s.defences.clone();
    let secs = s.session_secs;
    let total = defences.len() * batches.len() * RESOLUTIONS.len();
    let client = emu
        .client()
        .spawn(move || -> anyhow::Result<Vec<SessionRecord>> {
            let rt = runtime()?;
            let mut out = Vec::new();
            let mut n = 0u16;
            for d in &defences {
                for (bi, b) in batches.iter().enumerate() {
                    let port_base = 20_000 + (n % 5000) * 8;
                    n += 1;
                    let recs = rt.block_on(run_batch(
                        addr,
                        &clips[b.content],
                        b,
                        bi,
                        d,
                        secs,
                        epoch,
                        &cmd_tx,
                        port_base,
                    ));
                    for r in recs {
                        eprintln!("  [{}/{total}] {}", out.len() + 1, r.one_line());
                        out.push(r);
                    }
                }
            }
            Ok(out)
        })
        .context("starting the client thread")?;
    // Serve the client's capture commands until it is done.
    for c in cmd_rx {
        match c {
            Cmd::Start(ack) => {
                emu.start_capture();
                let _ = ack.send(());
            }
            Cmd::Stop(tx) => {
                let _ = tx.send(emu.stop_capture());
            }
        }
    }
    let c = client
        .join()
        .map_err(|_| anyhow!("client thread panicked"))?
        .map_err(|e| anyhow!("client thread: {e}"));
    let _ = stop_tx.send(());
    let _ = server.join();
    c?
}

/// Scores of one (defence, hop).
#[derive(Debug, Clone, Serialize)]
pub struct AttackRow {
    /// Defence.
    pub defence: String,
    /// `uplink` (publisher → relay, the shaped hop) or `downlink`.
    pub hop: &'static str,
    /// Sessions classified.
    pub samples: usize,
    /// Folds used.
    pub folds: usize,
    /// Per classifier: accuracy (%) over the repetitions of the
    /// cross-validation (random states random_state..random_state + reps).
    pub accuracy: Vec<(&'static str, Option<Spread>)>,
    /// Per classifier: the first repetition's scores (confusion matrix).
    pub scores: Vec<Score>,
    /// Thresholds the bitrate classifier learnt on all sessions, kbit/s.
    pub bitrate_bounds_kbps: Vec<f64>,
    /// Bytes on this hop over those of `none` for the same sessions, minus 1 (%).
    pub wire_overhead_pct: Option<f64>,
}

/// Per defence: costs.
#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    /// Defence.
    pub defence: String,
    /// Padding bytes over media bytes, % (the shaper's own count).
    pub padding_pct: f64,
    /// Uplink IP bytes over `none`'s, minus 1, %.
    pub wire_overhead_pct: Option<f64>,
    /// Per resolution: uplink wire overhead, %.
    pub wire_overhead_by_class_pct: Vec<Option<f64>>,
    /// Median over sessions of the per-session median latency, ms.
    pub latency_p50_ms: Option<Spread>,
    /// Median over sessions of the per-session 95th percentile, ms.
    pub latency_p95_ms: Option<Spread>,
    /// Added to `none`'s median latency, ms.
    pub added_p50_ms: Option<f64>,
    /// Added to `none`'s 95th percentile, ms.
    pub added_p95_ms: Option<f64>,
    /// Shaper overruns (pieces sent above the rate).
    pub overruns: u64,
    /// Padding refused.
    pub padding_refused: u64,
    /// Objects received / frames sent.
    pub delivered: (u64, u64),
}

/// Everything a run writes (results.json).
#[derive(Debug, Clone, Serialize)]
pub struct Output {
    /// Experiment.
    pub experiment: &'static str,
    /// Quick mode.
    pub quick: bool,
    /// Settings.
    pub settings: Settings,
    /// Link.
    pub link: Profile,
    /// Encoded clips.
    pub clips: Vec<ClipInfo>,
    /// Attack scores.
    pub attacks: Vec<AttackRow>,
    /// Costs.
    pub costs: Vec<CostRow>,
    /// Per resolution: uplink kbit/s over the undefended sessions.
    pub bitrate_kbps: Vec<(&'static str, Option<Spread>)>,
    /// The study's fixed bounds (360p < 1500, 720p 2500–4000, 1080p > 4000
    /// kbit/s) applied to our undefended 360p/720p/1080p uplink sessions:
    /// (correct, sessions).
    pub study_bounds: Option<(usize, usize)>,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Every session.
    pub sessions: Vec<SessionRecord>,
}

fn study_bound_class(kbps: f64) -> Option<&'static str> {
    if kbps < 1500.0 {
        Some("360p")
    } else if (2500.0..=4000.0).contains(&kbps) {
        Some("720p")
    } else if kbps > 4000.0 {
        Some("1080p")
    } else {
        None
    }
}

impl Output {
    /// Aggregates the sessions.
    pub fn new(
        args: &Options,
        settings: Settings,
        clips: Vec<ClipInfo>,
        sessions: Vec<SessionRecord>,
        wall_s: f64,
    ) -> Self {
        let classes = RESOLUTIONS.len();
        let ok = |r: &&SessionRecord| r.error.is_none();
        let bytes_of = |d: &str, up: bool, class: Option<usize>| -> u64 {
            sessions
                .iter()
                .filter(ok)
                .filter(|r| r.defence == d && class.is_none_or(|c| r.class == c))
                .map(|r| {
                    if up { &r.uplink } else { &r.downlink }
                        .as_ref()
                        .map_or(0, |o| o.bytes)
                })
                .sum()
        };
        let has_none = settings.defences.iter().any(|d| d == "none");
        let overhead = |d: &str, up: bool, class: Option<usize>| -> Option<f64> {
            let base = bytes_of("none", up, class);
            (has_none && base > 0)
                .then(|| 100.0 * (bytes_of(d, up, class) as f64 / base as f64 - 1.0))
        };
        let mut attacks = Vec::new();
        for d in &settings.defences {
            for (hop, up) in [("uplink", true), ("downlink", false)] {
                let samples: Vec<(SessionFeatures, usize)> = sessions
                    .iter()
                    .filter(ok)
                    .filter(|r| &r.defence == d)
                    .filter_map(|r| {
                        if up { &r.uplink } else { &r.downlink }
                            .as_ref()
                            .map(|o| (o.features.clone(), r.class))
                    })
                    .collect();
                if samples.len() < 2 * classes {
                    continue;
                }
                let mut accuracy = Vec::new();
                let mut scores = Vec::new();
                let mut folds = 0;
                for clf in Classifier::ALL {
                    let mut acc = Vec::new();
                    for rep in 0..settings.reps {
                        let s = fc::cross_validate(
                            clf,
                            &samples,
                            classes,
                            settings.folds,
                            settings.random_state + u64::from(rep),
                        );
                        folds = s.fold_accuracy.len();
                        acc.push(100.0 * s.accuracy);
                        if rep == 0 {
                            scores.push(s);
                        }
                    }
                    accuracy.push((clf.key(), Spread::of(&acc)));
                }
                let bounds = fc::Thresholds::fit(
                    &samples.iter().map(|s| (s.0.kbps, s.1)).collect::<Vec<_>>(),
                    classes,
                )
                .bounds();
                attacks.push(AttackRow {
                    defence: d.clone(),
                    hop,
                    samples: samples.len(),
                    folds,
                    accuracy,
                    scores,
                    bitrate_bounds_kbps: bounds,
                    wire_overhead_pct: overhead(d, up, None),
                });
            }
        }
        let lat = |d: &str, p95: bool| -> Vec<f64> {
            sessions
                .iter()
                .filter(ok)
                .filter(|r| r.defence == d)
                .filter_map(|r| {
                    if p95 {
                        r.latency_p95_ms
                    } else {
                        r.latency_p50_ms
                    }
                })
                .collect()
        };
        let none_p50 = Spread::of(&lat("none", false)).map(|s| s.median);
        let none_p95 = Spread::of(&lat("none", true)).map(|s| s.median);
        let costs = settings
            .defences
            .iter()
            .map(|d| {
                let of: Vec<&SessionRecord> = sessions
                    .iter()
                    .filter(ok)
                    .filter(|r| &r.defence == d)
                    .collect();
                let media: u64 = of.iter().map(|r| r.media_bytes).sum();
                let pad: u64 = of.iter().map(|r| r.padding_bytes).sum();
                let p50 = Spread::of(&lat(d, false));
                let p95 = Spread::of(&lat(d, true));
                CostRow {
                    defence: d.clone(),
                    padding_pct: 100.0 * pad as f64 / media.max(1) as f64,
                    wire_overhead_pct: overhead(d, true, None),
                    wire_overhead_by_class_pct: (0..classes)
                        .map(|c| overhead(d, true, Some(c)))
                        .collect(),
                    added_p50_ms: p50.zip(none_p50).map(|(a, b)| a.median - b),
                    added_p95_ms: p95.zip(none_p95).map(|(a, b)| a.median - b),
                    latency_p50_ms: p50,
                    latency_p95_ms: p95,
                    overruns: of.iter().map(|r| r.overruns).sum(),
                    padding_refused: of.iter().map(|r| r.padding_refused).sum(),
                    delivered: (
                        of.iter().map(|r| r.objects_received).sum(),
                        of.iter().map(|r| r.frames_sent).sum(),
                    ),
                }
            })
            .collect();
        let base = |c: usize| -> Vec<f64> {
            sessions
                .iter()
                .filter(ok)
                .filter(|r| r.defence == "none" && r.class == c)
                .filter_map(|r| r.uplink.as_ref().map(|o| o.features.kbps))
                .collect()
        };
        let bitrate_kbps = (0..classes)
            .map(|c| (RESOLUTIONS[c].0, Spread::of(&base(c))))
            .collect();
        let judged: Vec<(&str, f64)> = sessions
            .iter()
            .filter(ok)
            .filter(|r| r.defence == "none" && r.resolution != "480p")
            .filter_map(|r| r.uplink.as_ref().map(|o| (r.resolution, o.features.kbps)))
            .collect();
        let study_bounds = (!judged.is_empty()).then(|| {
            (
                judged
                    .iter()
                    .filter(|(res, k)| study_bound_class(*k) == Some(*res))
                    .count(),
                judged.len(),
            )
        });
        Self {
            experiment: "fingerprint",
            quick: args.quick,
            settings,
            link: link(),
            clips,
            attacks,
            costs,
            bitrate_kbps,
            study_bounds,
            wall_s,
            sessions,
        }
    }

    fn acc(&self, d: &str, hop: &str, clf: &str) -> Option<Spread> {
        self.attacks
            .iter()
            .find(|a| a.defence == d && a.hop == hop)
            .and_then(|a| a.accuracy.iter().find(|x| x.0 == clf))
            .and_then(|x| x.1)
    }

    /// The main table (Markdown).
    pub fn main_table(&self) -> String {
        let mut o = String::from(
            "| defence | hop | sessions | bitrate thresholds % | burst-size thresholds % | k-NN % | uplink overhead % | padding/media % | latency p50 ms (added) | latency p95 ms (added) | overruns |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for a in &self.attacks {
            let c = self.costs.iter().find(|c| c.defence == a.defence);
            let show = |k: &str| crate::common::stats::show(&self.acc(&a.defence, a.hop, k), 0);
            let up = a.hop == "uplink";
            o.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                a.defence,
                a.hop,
                a.samples,
                show("bitrate"),
                show("burst"),
                show("knn"),
                if up {
                    c.and_then(|c| c.wire_overhead_pct)
                        .map_or("–".into(), |v| format!("{v:.0}"))
                } else {
                    a.wire_overhead_pct
                        .map_or("–".into(), |v| format!("{v:.0}"))
                },
                if up {
                    c.map_or("–".into(), |c| format!("{:.0}", c.padding_pct))
                } else {
                    "–".into()
                },
                c.filter(|_| up).map_or("–".into(), |c| format!(
                    "{} ({})",
                    c.latency_p50_ms
                        .map_or("–".into(), |s| format!("{:.1}", s.median)),
                    c.added_p50_ms.map_or("–".into(), |v| format!("{v:+.1}"))
                )),
                c.filter(|_| up).map_or("–".into(), |c| format!(
                    "{} ({})",
                    c.latency_p95_ms
                        .map_or("–".into(), |s| format!("{:.1}", s.median)),
                    c.added_p95_ms.map_or("–".into(), |v| format!("{v:+.1}"))
                )),
                c.filter(|_| up)
                    .map_or("–".into(), |c| c.overruns.to_string()),
            ));
        }
        o
    }

    fn markdown(&self) -> String {
        let s = &self.settings;
        let classes = RESOLUTIONS.len();
        let mut o = String::from(
            "# lab fingerprint — video resolution from encrypted QUIC, and a defence\n\n",
        );
        o.push_str(&format!(
            "After {} (its section on fingerprinting attacks on QUIC media streaming).{}\n\n",
            SENGUPTA_2025.cite(),
            if self.quick {
                " **Quick (CI) mode.**"
            } else {
                ""
            }
        ));
        o.push_str(&format!(
            "**How measured.** ffmpeg (libx264 veryfast, 30 fps, 1 s GOPs, no B-frames, `-b:v` = `-maxrate` = \
             `-bufsize` = the target: capped VBR with a 1 s buffer, as live encoders run) encodes {} s of each \
             content ({}: ffmpeg lavfi sources generated at 960×540, scaled, with temporal grain `noise=alls=6`) \
             at {}. Each session publishes {} s of one clip from a random GOP (random state {}) in real time with \
             quichub's client library (hang format, one group per GOP, one object per frame) from the emulator's \
             client namespace to quichub's relay in the server namespace, and a subscriber in the client namespace \
             receives it back; the four resolutions of a batch run at once on their own connections. {} batches \
             per defence ({} sessions per resolution). Link: {}. The emulator records each packet's time, size \
             and ports (what an on-path observer sees; payloads are encrypted); the observed window is the {} s \
             from the first frame's due time, data direction only (uplink: the publisher's packets to the relay, \
             the hop the defence shapes; downlink: the relay's packets to the subscriber). Accuracy: stratified \
             {}-fold cross-validation (folds shuffled with random states {}..{}), median [min–max] over the {} \
             repetitions; chance is {:.0} %. Overhead: IP bytes on the uplink over those of the undefended \
             sessions (same clips and start GOPs), minus 1. Latency: a frame's due time at the publisher to the \
             whole object at the subscriber (one process, one clock); median over sessions of the per-session \
             median / 95th percentile. Wall time {:.0} s.\n\n",
            s.clip_secs,
            s.contents.join(", "),
            RESOLUTIONS
                .iter()
                .map(|r| format!("{} ({}×{}, {} kbit/s)", r.0, r.1, r.2, r.3))
                .collect::<Vec<_>>()
                .join(", "),
            s.session_secs,
            s.random_state,
            s.contents.len() * s.sessions,
            s.contents.len() * s.sessions,
            crate::common::one_line(&self.link),
            s.session_secs,
            s.folds,
            s.random_state,
            s.random_state + u64::from(s.reps) - 1,
            s.reps,
            100.0 / classes as f64,
            self.wall_s,
        ));
        o.push_str("Classifiers (`crates/lab/src/fingerprint_classify.rs`):\n\n");
        o.push_str(&format!(
            "- **bitrate thresholds** — the study's testbed method: a session's mean bitrate; bounds between \
             resolutions learnt on the training folds (midway, in log scale, between neighbouring classes' \
             medians). The study reports 93 % (360p/720p/1080p).\n\
             - **burst-size thresholds** — the study's YouTube method: the median bytes of a burst (packets less \
             than {} ms apart), bounds learnt the same way. The study reports 77 % (on YouTube, with its \
             countermeasures).\n\
             - **k-NN** — k = {}, Euclidean on {} z-scored features: bytes per 100 ms and per 1 s window \
             (mean, spread, quantiles), packet sizes, inter-packet gaps, bursts.\n\n",
            fc::BURST_GAP_US / 1000,
            fc::K,
            fc::FEATURES.len()
        ));
        o.push_str("Defences (`quichub pub --shape-rate KBPS`, `--pad-objects RATIO`; `crates/client/src/shape.rs`):\n\n");
        for d in &s.defences {
            o.push_str(&format!("- `{d}`: {}\n", describe_defence(d)));
        }
        o.push_str("\n## Results\n\n");
        o.push_str(&self.main_table());
        o.push_str(
            "\n![accuracy against uplink overhead](accuracy_overhead.svg)\n\n\
             ![accuracy per defence](accuracy.svg)\n\n",
        );
        // Costs per resolution.
        o.push_str("### Uplink overhead per resolution, %\n\n| defence |");
        for r in RESOLUTIONS {
            o.push_str(&format!(" {} |", r.0));
        }
        o.push_str(" all |\n|---|");
        for _ in 0..=classes {
            o.push_str("---|");
        }
        o.push('\n');
        for c in &self.costs {
            o.push_str(&format!("| {} |", c.defence));
            for v in &c.wire_overhead_by_class_pct {
                o.push_str(&format!(
                    " {} |",
                    v.map_or("–".into(), |v| format!("{v:.0}"))
                ));
            }
            o.push_str(&format!(
                " {} |\n",
                c.wire_overhead_pct
                    .map_or("–".into(), |v| format!("{v:.0}"))
            ));
        }
        // Bitrates beside the study's Table 1.
        o.push_str(
            "\n### Bitrate per resolution beside the study's Table 1\n\n\
             Ours: uplink IP kbit/s of the undefended sessions, median [min–max] over sessions (all contents). \
             The study: its Table 1, median [min–max] over its 7 local videos.\n\n\
             | resolution | ours kbit/s | encoder target | study kbit/s |\n|---|---|---|---|\n",
        );
        for (i, (name, sp)) in self.bitrate_kbps.iter().enumerate() {
            let study = STUDY_TABLE1
                .iter()
                .find(|t| t.0 == *name)
                .and_then(|t| Spread::of(&t.1));
            o.push_str(&format!(
                "| {name} | {} | {} | {} |\n",
                crate::common::stats::show(sp, 0),
                RESOLUTIONS[i].3,
                crate::common::stats::show(&study, 0)
            ));
        }
        o.push_str("\n![bitrate per resolution](bitrate.svg)\n");
        if let Some((right, n)) = self.study_bounds {
            o.push_str(&format!(
                "\nThe study's own bounds (360p < 1500, 720p 2500–4000, 1080p > 4000 kbit/s) applied unchanged to \
                 our undefended 360p, 720p and 1080p uplink sessions: {right}/{n} right ({:.0} %; the study: 93 %).\n",
                100.0 * right as f64 / n.max(1) as f64
            ));
        }
        // Confusion matrices.
        o.push_str("\n### Confusion matrices (first repetition; rows: true, columns: predicted)\n");
        for a in &self.attacks {
            for sc in &a.scores {
                o.push_str(&format!(
                    "\n`{}`, {}, {} ({} sessions, {:.0} %):\n\n| true \\ predicted |",
                    a.defence,
                    a.hop,
                    sc.classifier,
                    sc.samples,
                    100.0 * sc.accuracy
                ));
                for r in RESOLUTIONS {
                    o.push_str(&format!(" {} |", r.0));
                }
                o.push_str("\n|---|");
                for _ in 0..classes {
                    o.push_str("---|");
                }
                o.push('\n');
                for (t, row) in sc.confusion.iter().enumerate() {
                    o.push_str(&format!("| {} |", RESOLUTIONS[t].0));
                    for v in row {
                        o.push_str(&format!(" {v} |"));
                    }
                    o.push('\n');
                }
            }
        }
        o.push_str(&self.differs());
        let failed: Vec<&SessionRecord> =
            self.sessions.iter().filter(|r| r.error.is_some()).collect();
        if !failed.is_empty() {
            o.push_str("\n## Failed sessions\n\n");
            for r in failed {
                o.push_str(&format!("- {}\n", r.one_line()));
            }
        }
        o
    }

    fn differs(&self) -> String {
        use crate::common::differs::{Cell, Rule};
        let mut cells = Vec::new();
        if let Some(a) = self.acc("none", "uplink", "bitrate") {
            cells.push(Cell {
                what: "bitrate-threshold accuracy, undefended".into(),
                paper: 93.0,
                ours: a.median,
                unit: "%",
                rule: Rule::Points,
                explanation: Some(
                    "ours tells four resolutions apart (480p too), the study three; our encodes are capped \
                     VBR at fixed targets, which spreads the classes further apart than the study's videos"
                        .into(),
                ),
                hint: None,
            });
        }
        if let Some(a) = self.acc("none", "uplink", "burst") {
            cells.push(Cell {
                what: "burst-size-threshold accuracy, undefended".into(),
                paper: 77.0,
                ours: a.median,
                unit: "%",
                rule: Rule::Points,
                explanation: Some(
                    "the study's 77 % is on YouTube (segment downloads, randomised delivery); a live MoQT \
                     stream sends each frame as it is encoded, so a burst is one frame and its median size \
                     scales with the resolution"
                        .into(),
                ),
                hint: None,
            });
        }
        for (name, sp) in &self.bitrate_kbps {
            let (Some(sp), Some(t)) = (sp, STUDY_TABLE1.iter().find(|t| t.0 == *name)) else {
                continue;
            };
            let Some(st) = Spread::of(&t.1) else { continue };
            cells.push(Cell {
                what: format!("{name} median bitrate"),
                paper: st.median,
                ours: sp.median,
                unit: "kbit/s",
                rule: Rule::Ratio,
                explanation: None,
                hint: Some("the encoder targets differ from the study's videos".into()),
            });
        }
        let s = crate::common::differs::section(&cells);
        if s.is_empty() {
            let mut o =
                String::from("\n## Beside the paper\n\n| figure | paper | ours |\n|---|---|---|\n");
            for c in &cells {
                o.push_str(&format!(
                    "| {} | {:.0} {} | {:.0} {} |\n",
                    c.what, c.paper, c.unit, c.ours, c.unit
                ));
            }
            o.push_str(
                "\nNo figure differs from the paper's by more than ×2 (or 20 percentage points).\n",
            );
            o
        } else {
            format!("\n{s}")
        }
    }

    fn overhead_chart(&self) -> String {
        let mut series = Vec::new();
        for (i, clf) in Classifier::ALL.iter().enumerate() {
            let mut pts: Vec<(f64, f64, f64, f64)> = self
                .costs
                .iter()
                .filter_map(|c| {
                    let a = self.acc(&c.defence, "uplink", clf.key())?;
                    Some((c.wire_overhead_pct?, a.median, a.min, a.max))
                })
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                label: clf.label().into(),
                color: COLORS[i % COLORS.len()].into(),
                dashed: false,
                points: pts.iter().map(|p| (p.0, p.1)).collect(),
                band: pts.iter().map(|p| (p.0, p.2, p.3)).collect(),
            });
        }
        let xmax = self
            .costs
            .iter()
            .filter_map(|c| c.wire_overhead_pct)
            .fold(25.0, f64::max);
        let chance = 100.0 / RESOLUTIONS.len() as f64;
        series.push(Series {
            label: format!("chance ({chance:.0} %) + 10 points"),
            color: "black".into(),
            dashed: true,
            points: vec![(0.0, chance + 10.0), (xmax, chance + 10.0)],
            band: Vec::new(),
        });
        series.push(Series {
            label: "the study: bitrate 93 %, burst 77 % (undefended)".into(),
            color: "grey".into(),
            dashed: true,
            points: vec![(0.0, 93.0), (0.0, 77.0)],
            band: Vec::new(),
        });
        let labels = self
            .costs
            .iter()
            .map(|c| {
                format!(
                    "{} {}",
                    c.defence,
                    c.wire_overhead_pct
                        .map_or("–".into(), |v| format!("{v:.0} %"))
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        line_chart(
            "Resolution inference accuracy against bandwidth overhead (uplink)",
            &format!(
                "{} sessions per resolution of {} s, 4 resolutions, link {}; stratified {}-fold CV, median and \
                 min–max over {} repetitions; overhead: uplink IP bytes over the undefended sessions' − 1\n\
                 points: {labels}",
                self.settings.sessions * self.settings.contents.len(),
                self.settings.session_secs,
                self.link.name,
                self.settings.folds,
                self.settings.reps,
            ),
            "uplink bandwidth overhead (%)",
            "accuracy (%)",
            &series,
        )
    }

    fn accuracy_chart(&self) -> String {
        let cats: Vec<String> = self
            .settings
            .defences
            .iter()
            .flat_map(|d| [format!("{d} up"), format!("{d} down")])
            .collect();
        let mut series: Vec<CatSeries> = Classifier::ALL
            .iter()
            .enumerate()
            .map(|(i, clf)| CatSeries {
                label: clf.label().into(),
                color: COLORS[i % COLORS.len()].into(),
                hollow: false,
                values: self
                    .settings
                    .defences
                    .iter()
                    .flat_map(|d| {
                        [
                            self.acc(d, "uplink", clf.key()),
                            self.acc(d, "downlink", clf.key()),
                        ]
                    })
                    .map(|s| s.map(|s| (s.median, s.min, s.max)))
                    .collect(),
            })
            .collect();
        series.push(CatSeries {
            label: "the study, undefended (bitrate 93 %, burst 77 %)".into(),
            color: "black".into(),
            hollow: true,
            values: cats
                .iter()
                .enumerate()
                .map(|(i, _)| (i == 0).then_some((93.0, 77.0, 93.0)))
                .collect(),
        });
        category_chart(
            "Resolution inference accuracy per defence and observed hop",
            &format!(
                "up: publisher → relay (shaped); down: relay → subscriber; {} sessions per resolution; \
                 stratified {}-fold CV, marker median, whisker min–max over {} repetitions; chance {:.0} %\n\
                 hollow: the study's figures (marker 93 %, whisker down to 77 %)",
                self.settings.sessions * self.settings.contents.len(),
                self.settings.folds,
                self.settings.reps,
                100.0 / RESOLUTIONS.len() as f64
            ),
            "defence, hop",
            &cats,
            "accuracy (%)",
            &series,
        )
    }

    fn bitrate_chart(&self) -> String {
        let cats: Vec<String> = RESOLUTIONS.iter().map(|r| r.0.to_string()).collect();
        let ours = CatSeries {
            label: "ours: uplink IP kbit/s, undefended".into(),
            color: COLORS[0].into(),
            hollow: false,
            values: self
                .bitrate_kbps
                .iter()
                .map(|(_, s)| s.map(|s| (s.median, s.min, s.max)))
                .collect(),
        };
        let study = CatSeries {
            label: "the study's Table 1 (7 local videos)".into(),
            color: "black".into(),
            hollow: true,
            values: RESOLUTIONS
                .iter()
                .map(|r| {
                    STUDY_TABLE1
                        .iter()
                        .find(|t| t.0 == r.0)
                        .and_then(|t| Spread::of(&t.1))
                        .map(|s| (s.median, s.min, s.max))
                })
                .collect(),
        };
        category_chart(
            "Bitrate per resolution",
            &format!(
                "ours: {} s sessions, median and min–max over {} sessions per resolution ({}); \
                 the study: its Table 1, median and min–max over 7 videos",
                self.settings.session_secs,
                self.settings.sessions * self.settings.contents.len(),
                self.settings.contents.join(", ")
            ),
            "resolution",
            &cats,
            "kbit/s",
            &[ours, study],
        )
    }

    /// Writes results.json, report.md and the plots into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let w = |name: &str, body: String| {
            std::fs::write(dir.join(name), body).with_context(|| format!("writing {name}"))
        };
        w("results.json", serde_json::to_string_pretty(self)?)?;
        w("accuracy_overhead.svg", self.overhead_chart())?;
        w("accuracy.svg", self.accuracy_chart())?;
        w("bitrate.svg", self.bitrate_chart())?;
        w("report.md", self.markdown())?;
        Ok(())
    }
}

/// Runs the experiment; returns its directory and whether every session
/// succeeded.
pub fn run(args: &Options, f: &FingerprintArgs) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(why) = quichub_netem::privileges::missing() {
        bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    let s = settings(args, f)?;
    let t0 = Instant::now();
    let tmp = std::env::temp_dir().join(format!("qh-fingerprint-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let mut clips = Vec::new();
    for c in &s.contents {
        eprintln!(
            "encoding {c} at {} resolutions ({} s)",
            RESOLUTIONS.len(),
            s.clip_secs
        );
        let r = encode(&f.ffmpeg, c, s.clip_secs, &tmp);
        if r.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        clips.push(r?);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    for c in clips.iter().flatten() {
        eprintln!(
            "  {} {}: {} frames, {:.0} kbit/s (target {})",
            c.content, c.resolution, c.frames, c.media_kbps, c.target_kbps
        );
    }
    let batches = plan(&s, &clips);
    let dir = crate::common::result_dir(&args.out, "fingerprint")?;
    let l = link();
    eprintln!("link {}: {}", l.name, l.describe());
    let emu = Emulator::start(quichub_netem::emulator::EmulatorConfig::new(l))
        .context("starting the emulator")?;
    let flat: Vec<ClipInfo> = clips.iter().flatten().cloned().collect();
    let r = run_sessions(&emu, &s, clips, batches);
    emu.shutdown();
    let sessions = r?;
    let ok = sessions.iter().all(|r| r.error.is_none());
    let out = Output::new(args, s, flat, sessions, t0.elapsed().as_secs_f64());
    out.write(&dir)?;
    println!("{}", out.main_table());
    Ok((dir, ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use crate::TestCli as Cli;

    #[test]
    fn defences_and_settings() {
        let a = Cli::try_parse_from(["lab", "fingerprint"]).unwrap().lab;
        let crate::Experiment::Fingerprint(f) = &a.experiment else {
            panic!("fingerprint")
        };
        let s = settings(&a, f).unwrap();
        assert_eq!(s.defences.len(), DEFENCES.len());
        assert_eq!(s.contents.len(), 3);
        let q = Cli::try_parse_from(["lab", "fingerprint", "--quick"])
            .unwrap()
            .lab;
        let crate::Experiment::Fingerprint(f) = &q.experiment else {
            panic!("fingerprint")
        };
        let s = settings(&q, f).unwrap();
        assert_eq!(s.defences, ["none", "rate-5400"]);
        for d in DEFENCES {
            for c in 0..RESOLUTIONS.len() {
                defence_config(d, c).unwrap();
            }
        }
        assert!(defence_config("none", 0).unwrap().is_none());
        assert_eq!(
            defence_config("rate-own-1.25", 3)
                .unwrap()
                .unwrap()
                .rate_bps,
            Some(5_625_000)
        );
        assert!(defence_config("nope", 0).is_err());
        assert_eq!(study_bound_class(800.0), Some("360p"));
        assert_eq!(study_bound_class(2000.0), None);
        assert_eq!(study_bound_class(4500.0), Some("1080p"));
    }
}
