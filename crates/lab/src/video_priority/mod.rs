//! `quichub-lab video-priority`: real H.264 video (I, P and B frames from ffmpeg)
//! published through the relay in encode order on one stream per GOP
//! (`--delivery group`, the "first encode, first send" of the study) and on
//! one subgroup per frame type (`--delivery frame-type`: I, P, B at falling
//! priority), across a link whose rate steps down below the video's bitrate
//! (8 → 4 → 2 Mbit/s by default). After A. Sengupta, "Streaming over QUIC:
//! Applications in Media and IoT", 2025, which describes both strategies
//! (after Curley et al., "Prioritization in Media over QUIC Transport") but
//! measures neither.
//!
//! Topology: the relay (quichub's hub, in this process) and the publisher
//! (`quichub pub --broadcast`'s library, `quichub_client::media`, in this
//! process) run in the emulator's server namespace; the subscriber (the client library, in this process) in the
//! client namespace. The relay sends to the subscriber server → client, so
//! the rate steps apply to the emulator's down direction; the up direction
//! (acknowledgements, control) has the same delay and no rate limit.
//!
//! The subscriber records when each frame's object arrived whole. The
//! publisher's catalog `clock` gives the wall time of media time zero, so
//! each frame's publish time (clock + DTS, the publisher paces by DTS) and
//! play-out deadline (clock + PTS + the play-out buffer) are known on the
//! same clock (one machine). Frame types come from the H.264 slice headers of
//! the file; decode dependencies from the encoder's fixed GOP structure (see
//! [`FrameInfo::refs`]).

mod report;
mod types;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc as smpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use moqt::message::FetchKind;
use moqt::{FullTrackName, GroupOrder, Parameters, TrackNamespace};
use quichub_client::{ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent};
use quichub_media::fmp4::Fmp4Demuxer;
use quichub_media::hang;
use quichub_media::ts::TsDemuxer;
use quichub_media::{Demuxer, Event, Limits, TrackKind};
use quichub_netem::emulator::Emulator;
use quichub_netem::profile::Direction;
use tokio::sync::oneshot;

use crate::common::rt::{runtime, step, STEP};
use crate::common::Options;

pub use types::{Config, FrameInfo, Kind, RawRun};

/// The deliveries `--deliveries` accepts.
pub const DELIVERIES: [&str; 4] = ["group", "frame-type", "group-newest", "frame-type-newest"];

/// The publisher's `--delivery` of a delivery label, and whether the
/// subscriber asks for newest groups first.
pub fn delivery_parts(label: &str) -> (&str, bool) {
    match label.strip_suffix("-newest") {
        Some(base) => (base, true),
        None => (label, false),
    }
}

/// The broadcast's name at the relay.
const BROADCAST: &str = "lab/video-priority";

/// Options of `lab video-priority`.
#[derive(clap::Args, Debug, Clone)]
pub struct VideoPriorityArgs {
    /// Link rates of the steps, Mbit/s, comma-separated, applied to the
    /// relay → subscriber direction one after another.
    #[arg(long, default_value = "8,4,2")]
    pub steps: String,
    /// Seconds of each rate step (default 10, or 2 with --quick); the video
    /// lasts one warm-up GOP plus (number of steps) × this.
    #[arg(long)]
    pub step_secs: Option<f64>,
    /// Target bitrate of the encoded video, kbit/s (x264 ABR).
    #[arg(long, default_value_t = 5000)]
    pub video_kbps: u64,
    /// Picture size WxH of the encoded video.
    #[arg(long, default_value = "1280x720")]
    pub size: String,
    /// Frames per second.
    #[arg(long, default_value_t = 30)]
    pub fps: u32,
    /// GOP length in frames (a keyframe every this many frames).
    #[arg(long, default_value_t = 60)]
    pub gop: u32,
    /// Consecutive B frames between reference frames.
    #[arg(long, default_value_t = 2)]
    pub bframes: u32,
    /// Play-out buffer, ms: a frame is on time when it arrives before its
    /// presentation time (catalog clock + PTS) plus this.
    #[arg(long, default_value_t = 500)]
    pub playout_ms: u64,
    /// The publisher's `--target-latency-ms` (OBJECT_DELIVERY_TIMEOUT: the
    /// relay drops objects older than this).
    #[arg(long, default_value_t = 500)]
    pub target_latency_ms: u64,
    /// One-way delay of both directions, ms.
    #[arg(long, default_value_t = 20)]
    pub delay_ms: u64,
    /// Drop-tail queue in front of the rate limiter, ms at the current rate.
    #[arg(long, default_value_t = 100)]
    pub queue_ms: u64,
    /// Deliveries to compare, comma-separated: `group`, `frame-type` (the
    /// publisher's `--delivery`), and `group-newest`, `frame-type-newest`:
    /// the same with the subscriber asking for GROUP_ORDER descending
    /// (newer groups' streams before older ones at equal priority).
    #[arg(long, default_value = "group,frame-type")]
    pub deliveries: String,
}

/// Builds the run's [`Config`] from the options.
pub fn config(args: &Options, v: &VideoPriorityArgs) -> anyhow::Result<Config> {
    let steps_bps = v
        .steps
        .split(',')
        .map(|s| {
            let m: f64 = s
                .trim()
                .parse()
                .with_context(|| format!("bad step {s:?}: use Mbit/s, e.g. 4"))?;
            anyhow::ensure!(
                (0.1..=1000.0).contains(&m),
                "step {m} Mbit/s out of [0.1, 1000]"
            );
            Ok((m * 1e6) as u64)
        })
        .collect::<anyhow::Result<Vec<u64>>>()?;
    anyhow::ensure!(
        !steps_bps.is_empty() && steps_bps.len() <= 10,
        "1 to 10 steps"
    );
    let step_secs = v.step_secs.unwrap_or(if args.quick { 2.0 } else { 10.0 });
    anyhow::ensure!(
        (1.0..=120.0).contains(&step_secs),
        "--step-secs must be in [1, 120]"
    );
    let (w, h) = v
        .size
        .split_once(['x', 'X'])
        .with_context(|| format!("bad --size {:?}: use WxH", v.size))?;
    let size: (u32, u32) = (w.trim().parse()?, h.trim().parse()?);
    anyhow::ensure!(
        (16..=3840).contains(&size.0) && (16..=2160).contains(&size.1) && size.0 % 2 == 0,
        "--size out of range"
    );
    anyhow::ensure!((1..=120).contains(&v.fps), "--fps must be in [1, 120]");
    anyhow::ensure!((2..=600).contains(&v.gop), "--gop must be in [2, 600]");
    anyhow::ensure!(v.bframes <= 4, "--bframes must be at most 4");
    anyhow::ensure!(
        (100..=100_000).contains(&v.video_kbps),
        "--video-kbps must be in [100, 100000]"
    );
    anyhow::ensure!(v.playout_ms <= 10_000 && v.target_latency_ms <= 60_000);
    anyhow::ensure!(v.delay_ms <= 1000 && (1..=5000).contains(&v.queue_ms));
    let deliveries: Vec<String> = v
        .deliveries
        .split(',')
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .collect();
    for d in &deliveries {
        anyhow::ensure!(
            DELIVERIES.contains(&d.as_str()),
            "unknown delivery {d:?}: one of {}",
            DELIVERIES.join(", ")
        );
    }
    anyhow::ensure!(!deliveries.is_empty(), "no deliveries");
    let mut c = Config {
        steps_bps,
        step_secs,
        warmup_s: f64::from(v.gop) / f64::from(v.fps),
        video_kbps: v.video_kbps,
        size,
        fps: v.fps,
        gop: v.gop,
        bframes: v.bframes,
        playout_ms: v.playout_ms,
        target_latency_ms: v.target_latency_ms,
        delay_ms: v.delay_ms,
        queue_ms: v.queue_ms,
        deliveries,
        ffmpeg: Vec::new(),
    };
    c.ffmpeg = ffmpeg_args(&c, Path::new("video.mp4"));
    Ok(c)
}

/// The ffmpeg command that makes the video: testsrc2 (moving colour bars,
/// a clock), H.264 with x264 in ABR mode, a fixed GOP structure (closed
/// GOPs of `gop` frames, no scene cuts, always `bframes` B frames between
/// reference frames, B frames never referenced, one reference picture), as
/// fragmented MP4 with one fragment per frame.
pub fn ffmpeg_args(c: &Config, out: &Path) -> Vec<String> {
    let kbps = c.video_kbps;
    [
        "-hide_banner",
        "-loglevel",
        "error",
        "-y",
        "-f",
        "lavfi",
        "-i",
        &format!("testsrc2=size={}x{}:rate={}", c.size.0, c.size.1, c.fps),
        "-t",
        &format!("{}", c.duration()),
        "-c:v",
        "libx264",
        "-preset",
        "veryfast",
        "-pix_fmt",
        "yuv420p",
        "-b:v",
        &format!("{kbps}k"),
        "-maxrate",
        &format!("{kbps}k"),
        "-bufsize",
        &format!("{kbps}k"),
        "-x264-params",
        &format!(
            "keyint={g}:min-keyint={g}:scenecut=0:bframes={b}:b-adapt=0:b-pyramid=none:ref=1:open-gop=0",
            g = c.gop,
            b = c.bframes
        ),
        "-f",
        "mp4",
        "-movflags",
        "cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame",
        &out.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Why ffmpeg cannot be used, or `None` when `ffmpeg -version` runs.
pub fn ffmpeg_missing() -> Option<String> {
    match std::process::Command::new("ffmpeg")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("`ffmpeg -version` failed ({s})")),
        Err(e) => Some(format!(
            "ffmpeg not found ({e}); install it (apt install ffmpeg)"
        )),
    }
}

/// Encodes the test video into `out` (bounded: 5 minutes).
pub fn encode(c: &Config, out: &Path) -> anyhow::Result<()> {
    if let Some(why) = ffmpeg_missing() {
        bail!("{why}");
    }
    let mut child = std::process::Command::new("ffmpeg")
        .args(ffmpeg_args(c, out))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ffmpeg")?;
    let status = wait_bounded(&mut child, Duration::from_secs(300))?;
    if !status.is_some_and(|s| s.success()) {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        bail!("ffmpeg failed ({status:?}): {}", err.trim());
    }
    Ok(())
}

/// Waits for `child` at most `limit`; kills it (and reaps it) past that.
/// `None` when it had to be killed.
fn wait_bounded(
    child: &mut Child,
    limit: Duration,
) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let until = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The publisher thread's result, waiting at most `limit`; past it the
/// publisher is told to stop (and then ends its tracks), and the run fails.
fn join_bounded<E: std::fmt::Display>(
    publisher: std::thread::JoinHandle<Result<anyhow::Result<()>, E>>,
    stop: oneshot::Sender<()>,
    limit: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + limit;
    while !publisher.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let timed_out = !publisher.is_finished();
    let _ = stop.send(());
    let r = publisher
        .join()
        .map_err(|_| anyhow!("publisher thread panicked"))?
        .map_err(|e| anyhow!("publisher thread: {e}"))?;
    if timed_out {
        bail!("still publishing after {limit:?}");
    }
    r
}

/// Reads an unsigned Exp-Golomb code.
fn ue(bits: &mut impl Iterator<Item = bool>) -> Option<u32> {
    let mut zeros = 0;
    while !bits.next()? {
        zeros += 1;
        if zeros > 31 {
            return None;
        }
    }
    let mut v = 1u64;
    for _ in 0..zeros {
        v = (v << 1) | u64::from(bits.next()?);
    }
    u32::try_from(v - 1).ok()
}

/// The (`slice_type` mod 5, `nal_ref_idc`) of the first slice in an AVCC
/// frame with `nal_len`-byte length prefixes.
pub fn slice_type(data: &[u8], nal_len: u8) -> Option<(u32, u8)> {
    let n = usize::from(nal_len.clamp(1, 4));
    let mut rest = data;
    while rest.len() > n {
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        rest = &rest[n..];
        let nal = rest.get(..len)?;
        rest = &rest[len..];
        let (&h, body) = nal.split_first()?;
        let t = h & 0x1f;
        if t == 1 || t == 5 {
            // Remove emulation prevention bytes from the first bytes, enough
            // for two Exp-Golomb codes.
            let mut rbsp = Vec::with_capacity(16);
            let mut zeros = 0;
            for &b in body.iter().take(16) {
                if zeros >= 2 && b == 3 {
                    zeros = 0;
                    continue;
                }
                zeros = if b == 0 { zeros + 1 } else { 0 };
                rbsp.push(b);
            }
            let mut bits = rbsp
                .iter()
                .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1 == 1));
            let _first_mb = ue(&mut bits)?;
            let st = ue(&mut bits)?;
            return Some((st % 5, (h >> 5) & 3));
        }
    }
    None
}

/// The video track's frames of `path` (fMP4 or MPEG-TS), grouped as the
/// publisher groups them, with types and dependencies; and notes on where
/// the stream departs from the assumed structure.
pub fn load(path: &Path) -> anyhow::Result<(Vec<FrameInfo>, Vec<String>)> {
    let data = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let mut d: Box<dyn Demuxer> = if data.first() == Some(&0x47) {
        Box::new(TsDemuxer::new(Limits::default()))
    } else {
        Box::new(Fmp4Demuxer::new(Limits::default()))
    };
    d.push(&data);
    d.end();
    let mut video = None;
    let mut frames = Vec::new();
    let mut notes = Vec::new();
    let (mut group, mut object) = (None::<u64>, 0u64);
    let mut gop_refs: Vec<usize> = Vec::new();
    while let Some(ev) = d.next()? {
        match ev {
            Event::Tracks(t) => {
                video = video.or_else(|| t.into_iter().find(|t| t.kind == TrackKind::Video))
            }
            Event::Frame(f) => {
                let Some(v) = video.as_ref().filter(|v| v.id == f.track) else {
                    continue;
                };
                anyhow::ensure!(
                    v.codec.starts_with("avc"),
                    "the lab reads H.264 slice types; the video is {}",
                    v.codec
                );
                if f.keyframe {
                    group = Some(group.map_or(0, |g| g + 1));
                    object = 0;
                    gop_refs.clear();
                }
                let Some(g) = group else {
                    notes.push("a frame before the first keyframe (the publisher drops it)".into());
                    continue;
                };
                let (st, ref_idc) = slice_type(&f.data, v.nal_length_size)
                    .with_context(|| format!("no slice in frame {}", frames.len()))?;
                let kind = match st {
                    2 | 4 => Kind::I,
                    0 | 3 => Kind::P,
                    _ => Kind::B,
                };
                let idx = frames.len();
                if f.keyframe != (kind == Kind::I) {
                    notes.push(format!(
                        "frame {idx}: keyframe flag {} but {kind:?} slice",
                        f.keyframe
                    ));
                }
                if kind == Kind::B && ref_idc != 0 {
                    notes.push(format!("frame {idx}: a referenced B frame (B pyramid)"));
                }
                if (ref_idc == 0) != f.disposable {
                    notes.push(format!(
                        "frame {idx}: nal_ref_idc {ref_idc} but disposable {}",
                        f.disposable
                    ));
                }
                let need = match kind {
                    Kind::I => 0,
                    Kind::P => 1,
                    Kind::B => 2,
                };
                let refs: Vec<usize> = gop_refs.iter().rev().take(need).rev().copied().collect();
                if refs.len() < need && kind != Kind::I {
                    notes.push(format!(
                        "frame {idx}: {kind:?} with {} earlier references in its GOP",
                        refs.len()
                    ));
                }
                if ref_idc != 0 {
                    gop_refs.push(idx);
                }
                frames.push(FrameInfo {
                    group: g,
                    object,
                    pts: f.pts,
                    dts: f.dts,
                    bytes: f.data.len(),
                    kind,
                    reference: ref_idc != 0,
                    refs,
                });
                object += 1;
            }
        }
    }
    anyhow::ensure!(!frames.is_empty(), "no video frames in {}", path.display());
    notes.truncate(20);
    Ok((frames, notes))
}

fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Runs one delivery once: a fresh relay, the publisher, the subscriber,
/// and the rate steps on the down link.
pub fn run_once(
    emu: &Emulator,
    video: &Path,
    frames: &[FrameInfo],
    cfg: &Config,
    delivery: &str,
) -> anyhow::Result<RawRun> {
    emu.set_link(Direction::Down, cfg.down_link(0))?;
    let (port_tx, port_rx) = smpsc::channel::<anyhow::Result<u16>>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<()> { runtime()?.block_on(relay(port_tx, stop_rx)) })
        .context("starting the relay thread")?;
    let result = (|| {
        let port = match port_rx.recv_timeout(STEP) {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(e.context("relay setup")),
            Err(_) => bail!("the relay did not start"),
        };
        let url = format!("moqt://{}:{port}/", emu.server().addr());
        let index: std::collections::HashMap<(u64, u64), usize> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| ((f.group, f.object), i))
            .collect();
        let pts: Vec<u64> = frames.iter().map(|f| f.pts.max(0) as u64).collect();
        let n = frames.len();
        let limit = Duration::from_secs_f64(cfg.duration() + 15.0);
        let (ready_tx, ready_rx) = smpsc::channel::<()>();
        let sub_url = url.clone();
        let (pub_delivery, newest) = delivery_parts(delivery);
        let subscriber = emu
            .client()
            .spawn(move || -> anyhow::Result<RawRun> {
                runtime()?.block_on(subscribe(&sub_url, index, pts, n, ready_tx, limit, newest))
            })
            .context("starting the subscriber thread")?;
        if ready_rx.recv_timeout(STEP + STEP).is_err() {
            let r = subscriber.join();
            bail!("the subscriber did not start: {r:?}");
        }
        let stats0 = emu.stats().down;
        let start = SystemTime::now();
        let (stop_pub, stop_pub_rx) = oneshot::channel::<()>();
        let publisher = {
            let mut opts = quichub_client::media::MediaPublishOptions::new(BROADCAST);
            opts.delivery = match pub_delivery {
                "frame-type" => quichub_client::media::Delivery::FrameType,
                _ => quichub_client::media::Delivery::Group,
            };
            opts.target_latency_ms = cfg.target_latency_ms;
            let (url, video) = (url.clone(), video.to_path_buf());
            emu.server()
                .spawn(move || -> anyhow::Result<()> {
                    let input = std::fs::File::open(&video)
                        .with_context(|| format!("open {}", video.display()))?;
                    let stop = async move {
                        let _ = stop_pub_rx.await;
                    };
                    tokio::runtime::Builder::new_multi_thread()
                        .enable_all()
                        .build()?
                        .block_on(crate::common::moq_media::publish(
                            &url,
                            quichub_client::Verify::Insecure,
                            &opts,
                            input,
                            stop,
                        ))
                })
                .context("starting the publisher thread")?
        };
        let first = start + Duration::from_secs_f64(cfg.warmup_s);
        let mut steps_unix_us = vec![unix_us(first)];
        for k in 1..cfg.steps_bps.len() {
            let at = first + Duration::from_secs_f64(cfg.step_secs * k as f64);
            if let Ok(d) = at.duration_since(SystemTime::now()) {
                std::thread::sleep(d);
            }
            emu.set_link(Direction::Down, cfg.down_link(k))?;
            steps_unix_us.push(unix_us(SystemTime::now()));
        }
        let published = join_bounded(publisher, stop_pub, limit);
        let raw = subscriber
            .join()
            .map_err(|_| anyhow!("subscriber thread panicked"))?
            .map_err(|e| anyhow!("subscriber thread: {e}"))?;
        let stats1 = emu.stats().down;
        published.context("the publisher failed")?;
        let mut raw = raw?;
        raw.steps_unix_us = steps_unix_us;
        raw.down_dropped = stats1
            .link
            .dropped_queue
            .saturating_sub(stats0.link.dropped_queue);
        raw.down_delivered = stats1.link.delivered.saturating_sub(stats0.link.delivered);
        Ok(raw)
    })();
    let _ = stop_tx.send(());
    let s = server
        .join()
        .map_err(|_| anyhow!("relay thread panicked"))?
        .map_err(|e| anyhow!("relay thread: {e}"))?;
    // Let the last packets drain and the queue empty before the next run.
    emu.set_link(Direction::Down, cfg.down_link(0))?;
    std::thread::sleep(Duration::from_millis(500));
    let raw = result?;
    s.context("relay")?;
    Ok(raw)
}

/// quichub's relay (the hub, MQTT and HTTP off) on every interface of the
/// server namespace; sends its UDP port, runs until `stop`.
async fn relay(
    port: smpsc::Sender<anyhow::Result<u16>>,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let mut config = quichub_hub::Config::default();
    config.quic.bind = "0.0.0.0:0".into();
    config.mqtt.tcp = "off".into();
    config.mqtt.tls = "off".into();
    config.http.address = "off".into();
    config.metrics.address = "off".into();
    config.store.data_dir = Some("off".into());
    config.auth.allow_anonymous = Some(true);
    match quichub_hub::Hub::start(config).await {
        Ok(hub) => {
            let _ = port.send(Ok(hub.addr().port()));
            let _ = stop.await;
            hub.server().close(0, b"done");
            Ok(())
        }
        Err(e) => {
            let _ = port.send(Err(anyhow!("{e:#}")));
            bail!("relay setup failed")
        }
    }
}

/// The subscriber: the catalog (for its clock) and the video track, every
/// object's arrival time, until PUBLISH_DONE or `limit`.
async fn subscribe(
    url: &str,
    index: std::collections::HashMap<(u64, u64), usize>,
    pts: Vec<u64>,
    n: usize,
    ready: smpsc::Sender<()>,
    limit: Duration,
    newest: bool,
) -> anyhow::Result<RawRun> {
    let base_i = Instant::now();
    let base_u = unix_us(SystemTime::now());
    let to_unix = |t: Instant| base_u + t.saturating_duration_since(base_i).as_micros() as u64;
    let session = step(
        "connect",
        ClientSession::connect(url, ConnectOptions::default()),
    )
    .await?;
    let ns = TrackNamespace::from_path(BROADCAST);
    let name = |t: &str| FullTrackName {
        namespace: ns.clone(),
        name: Bytes::from(t.to_string()),
    };
    let opts = SubscribeOptions {
        rendezvous_ms: Some(20_000),
        ..Default::default()
    };
    // The catalog track exists (PUBLISH) before the publisher announces its
    // namespace, so a SUBSCRIBE waiting at the relay (rendezvous) finds it.
    // The video track is created when the input's tracks are read, just
    // before the first catalog: it is subscribed once the catalog is here
    // (a SUBSCRIBE for a track the announced publisher does not have yet is
    // refused), and what of its first group went out before that comes by
    // a joining FETCH.
    let s1 = session.clone();
    let n1 = name(hang::CATALOG_TRACK);
    let cat = tokio::spawn(async move { s1.subscribe(n1, opts).await });
    // SUBSCRIBE is on its way (it waits at the relay for the publisher).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = ready.send(());
    let mut cat = step("catalog SUBSCRIBE", async { cat.await? }).await?;
    let until = tokio::time::Instant::now() + limit;
    let mut raw = RawRun {
        arrivals: vec![None; n],
        subgroups: vec![None; n],
        ..Default::default()
    };
    while raw.catalogs == 0 {
        let ev = tokio::select! {
            ev = cat.next() => ev,
            _ = tokio::time::sleep_until(until) => bail!("no catalog before the time limit"),
        };
        match ev {
            Some(SubscriptionEvent::Object(o)) if !o.payload.is_empty() => {
                let c = hang::Catalog::parse(&o.payload)?;
                raw.clock_unix_us = c.clock_unix_micros().context("the catalog has no clock")?;
                raw.catalogs += 1;
            }
            Some(_) => {}
            None => bail!("the catalog track ended before a catalog"),
        }
    }
    let mut vid = step(
        "video SUBSCRIBE",
        session.subscribe(
            name("video"),
            SubscribeOptions {
                group_order: newest.then_some(GroupOrder::Descending),
                ..Default::default()
            },
        ),
    )
    .await?;
    let record = |raw: &mut RawRun,
                  group: u64,
                  object: u64,
                  subgroup: Option<u64>,
                  payload: &Bytes,
                  at: Instant| {
        let Ok((ts, _)) = hang::decode_legacy(payload) else {
            raw.unmatched += 1;
            return;
        };
        match index.get(&(group, object)) {
            Some(&i) if pts[i] == ts => {
                if raw.arrivals[i].is_none() {
                    raw.arrivals[i] = Some(to_unix(at));
                    raw.subgroups[i] = subgroup;
                }
            }
            _ => raw.unmatched += 1,
        }
    };
    if vid.largest.is_some() {
        let r = step(
            "joining FETCH",
            session.fetch(
                FetchKind::RelativeJoining {
                    joining_request_id: vid.request_id,
                    joining_start: 0,
                },
                Parameters::default(),
            ),
        )
        .await?;
        let at = Instant::now();
        raw.fetched = r.objects.len() as u64;
        for o in &r.objects {
            record(&mut raw, o.group, o.object_id, o.subgroup, &o.payload, at);
        }
    }
    let mut cat_open = true;
    loop {
        let ev = tokio::select! {
            ev = vid.next() => ev,
            ev = cat.next(), if cat_open => {
                match ev {
                    Some(SubscriptionEvent::Object(o)) if !o.payload.is_empty() => raw.catalogs += 1,
                    Some(_) => {}
                    None => cat_open = false,
                }
                continue;
            }
            _ = tokio::time::sleep_until(until) => break,
        };
        match ev {
            Some(SubscriptionEvent::Object(o)) => record(
                &mut raw,
                o.group,
                o.object_id,
                o.subgroup,
                &o.payload,
                o.arrived,
            ),
            Some(SubscriptionEvent::SubgroupEnd { fin, .. }) => {
                if fin {
                    raw.streams += 1;
                } else {
                    raw.resets += 1;
                }
            }
            Some(SubscriptionEvent::Done { .. }) => {
                raw.done = true;
                break;
            }
            None => break,
        }
    }
    anyhow::ensure!(raw.catalogs > 0, "no catalog arrived");
    session.close(0, "done");
    Ok(raw)
}

/// Runs the experiment: encodes the video, then every delivery `--reps`
/// times (alternating) through one emulator. Returns the result directory
/// and whether every run succeeded.
pub fn run(args: &Options, v: &VideoPriorityArgs) -> anyhow::Result<(PathBuf, bool)> {
    use report::{analyse, Output, RunRecord, VideoInfo};
    if let Some(why) = quichub_netem::privileges::missing() {
        bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    if let Some(why) = ffmpeg_missing() {
        bail!("lab video-priority encodes its video with ffmpeg: {why}");
    }
    anyhow::ensure!((1..=50).contains(&args.reps), "--reps must be in [1, 50]");
    let started = Instant::now();
    let cfg = config(args, v)?;
    let scratch = std::env::temp_dir().join(format!("qh-lab-vp-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let video = scratch.join("video.mp4");
    eprintln!(
        "encoding {:.0} s of video: ffmpeg {}",
        cfg.duration(),
        cfg.ffmpeg.join(" ")
    );
    let loaded = encode(&cfg, &video).and_then(|()| load(&video));
    let (frames, notes) = match loaded {
        Ok(x) => x,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(e);
        }
    };
    let info = VideoInfo::of(&frames, cfg.fps, notes);
    eprintln!(
        "video: {} frames (I/P/B {}/{}/{}), {:.2} Mbit/s",
        info.frames,
        info.frames_by_type[0],
        info.frames_by_type[1],
        info.frames_by_type[2],
        info.mbps
    );
    let link = cfg.profile();
    link.validate()?;
    eprintln!("link: {}", link.source);
    let dir = crate::common::result_dir(&args.out, "video-priority")?;
    let emu = Emulator::start(quichub_netem::emulator::EmulatorConfig::new(link.clone()))
        .context("starting the emulator");
    let emu = match emu {
        Ok(e) => e,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(e);
        }
    };
    let mut runs = Vec::new();
    for rep in 0..args.reps {
        for d in &cfg.deliveries {
            let rec = match run_once(&emu, &video, &frames, &cfg, d) {
                Ok(raw) => analyse(d, rep, &frames, &raw, &cfg),
                Err(e) => RunRecord::failed(d, rep, &e),
            };
            eprintln!("  {}", rec.one_line());
            runs.push(rec);
        }
    }
    emu.shutdown();
    let _ = std::fs::remove_dir_all(&scratch);
    let ok = runs.iter().all(|r| r.error.is_none());
    let out = Output::new(args, cfg, link, info, runs, started.elapsed().as_secs_f64());
    out.write(&dir)?;
    println!("{}", out.main_table());
    Ok((dir, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_make_the_config() {
        use clap::Parser;
        let parse = |argv: &[&str]| {
            let a = crate::TestCli::try_parse_from(argv).unwrap().lab;
            let crate::Experiment::VideoPriority(v) = a.experiment.clone() else {
                panic!("video-priority")
            };
            config(&a, &v)
        };
        let c = parse(&["lab", "video-priority"]).unwrap();
        assert_eq!(c.steps_bps, [8_000_000, 4_000_000, 2_000_000]);
        assert_eq!(c.duration(), 32.0);
        assert_eq!(c.deliveries, ["group", "frame-type"]);
        assert!(c.ffmpeg.iter().any(|a| a.contains("b-pyramid=none")));
        let q = parse(&["lab", "video-priority", "--quick", "--steps", "3,1.5"]).unwrap();
        assert_eq!(q.duration(), 2.0 + 2.0 * 2.0);
        assert_eq!(q.down_link(1).rate_bps, Some(1_500_000));
        assert_eq!(q.down_link(9).rate_bps, Some(1_500_000));
        assert!(parse(&["lab", "video-priority", "--deliveries", "fefs"]).is_err());
        assert!(parse(&["lab", "video-priority", "--steps", "0"]).is_err());
        assert_eq!(delivery_parts("frame-type-newest"), ("frame-type", true));
        assert_eq!(delivery_parts("group"), ("group", false));
    }

    #[test]
    fn exp_golomb_and_slice_types() {
        // AVCC, 4-byte lengths: an IDR slice (type 5, nal_ref_idc 3) with
        // first_mb 0 ('1') and slice_type 7 ('0001000': I), then a non-IDR
        // slice with nal_ref_idc 0 and slice_type 1 ('010': B).
        let idr = [0, 0, 0, 2, 0x65, 0b1000_1000];
        assert_eq!(slice_type(&idr, 4), Some((2, 3)));
        let b = [0, 0, 0, 2, 0x01, 0b1010_0000];
        assert_eq!(slice_type(&b, 4), Some((1, 0)));
        // SEI first, then a P slice (slice_type 5: '00110') with ref_idc 2.
        let p = [0, 0, 0, 1, 0x06, 0, 0, 0, 2, 0x41, 0b1001_1000];
        assert_eq!(slice_type(&p, 4), Some((0, 2)));
        assert_eq!(slice_type(&[0, 0, 0, 9, 0x65], 4), None);
    }
}
