//! `quichub pub` and `quichub sub`.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::{FullTrackName, SubscriptionFilter, TrackNamespace};
use quichub_client::media;
use quichub_client::synth::{self, Profile};
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode,
};

use crate::framing::{self, InFraming, OutFraming};

/// Publisher options.
#[derive(clap::Args, Debug)]
pub struct PubArgs {
    /// Relay URL: `moqt://host:port/path` (raw QUIC), `https://host:port/path`
    /// (WebTransport), or `ws://host:http-port/path` / `wss://` (MoQT over
    /// WebSocket, the relay's HTTP port).
    pub url: String,
    /// Track namespace, `/`-separated fields.
    #[arg(long, default_value = "quichub/demo")]
    pub namespace: String,
    /// Track name (default: the profile's name).
    #[arg(long)]
    pub track: Option<String>,
    /// Source: audio (datagrams), video (streams, keyframe groups), imu, or
    /// stdin (objects cut from standard input by `--framing`).
    #[arg(long, default_value = "audio")]
    pub profile: String,
    /// How `--profile stdin` cuts its input into objects: `line` (one object
    /// per `\n`-terminated line, without the `\n`, any bytes), `length` (each
    /// object preceded by its length as a 4-byte big-endian unsigned integer)
    /// or `raw-chunks` (each read of at most `--chunk-size` bytes; binary
    /// files arrive byte for byte with `sub --framing raw`).
    /// [default: line]
    #[arg(long, value_enum)]
    pub framing: Option<InFraming>,
    /// Largest object `--framing raw-chunks` makes, in bytes (at most 4 MiB,
    /// the relay's default `max_object_size`) [default: 16384]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=(4 << 20)))]
    pub chunk_size: Option<u32>,
    /// `push` sends PUBLISH; `announce` sends PUBLISH_NAMESPACE and serves SUBSCRIBE.
    #[arg(long, default_value = "push")]
    pub mode: String,
    /// Stop after this many objects.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Pin the relay certificate by SHA-256 (hex); without it any certificate
    /// is accepted, and a token only with --insecure.
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// JWT for a relay with authentication (docs/auth.md), sent as the URL's
    /// `?jwt=` (the same as writing it into the URL); needs --fingerprint
    /// (or --insecure).
    #[arg(long, env = "QUICHUB_JWT", hide_env_values = true)]
    pub jwt: Option<String>,
    /// Send the token even to a relay whose certificate is not checked (no
    /// --fingerprint) or over ws://, where whoever answers gets it.
    #[arg(long)]
    pub insecure: bool,
    /// MoQT draft to speak: 18 (native), 16 or 14 (through quichub's
    /// translating bridge; `moqt://` and `https://` only).
    #[arg(long, value_parser = crate::parse_draft, default_value = "18")]
    pub draft: crate::Draft,
    /// Real media (`--broadcast`).
    #[command(flatten)]
    pub media: MediaPubArgs,
}

/// Subscriber options.
#[derive(clap::Args, Debug)]
pub struct SubArgs {
    /// Relay URL.
    pub url: String,
    /// Track namespace.
    #[arg(long, default_value = "quichub/demo")]
    pub namespace: String,
    /// Track name.
    #[arg(long, default_value = "audio")]
    pub track: String,
    /// Print live stats (objects/s, bitrate, latency, loss) instead of payloads.
    #[arg(long)]
    pub stats: bool,
    /// How payloads are written to stdout: `raw` (exactly as received,
    /// nothing added between them), `line` (each followed by `\n`, the
    /// inverse of `pub --framing line`) or `length` (each preceded by its
    /// length as a 4-byte big-endian unsigned integer).
    #[arg(long, value_enum, default_value_t = OutFraming::Raw)]
    pub framing: OutFraming,
    /// Stop after this many objects.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Wait up to this many ms for a publisher that is not there yet
    /// (RENDEZVOUS_TIMEOUT; the relay caps it at its `max_rendezvous_ms`);
    /// 0 fails at once.
    #[arg(long, default_value_t = 10_000)]
    pub rendezvous_ms: u64,
    /// Start at the next group instead of the next object.
    #[arg(long)]
    pub next_group: bool,
    /// Pin the relay certificate by SHA-256 (hex); without it any certificate
    /// is accepted, and a token only with --insecure.
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// JWT for a relay with authentication (docs/auth.md), sent as the URL's
    /// `?jwt=` (the same as writing it into the URL); needs --fingerprint
    /// (or --insecure).
    #[arg(long, env = "QUICHUB_JWT", hide_env_values = true)]
    pub jwt: Option<String>,
    /// Send the token even to a relay whose certificate is not checked (no
    /// --fingerprint) or over ws://, where whoever answers gets it.
    #[arg(long)]
    pub insecure: bool,
    /// MoQT draft to speak: 18 (native), 16 or 14 (through quichub's
    /// translating bridge; `moqt://` and `https://` only).
    #[arg(long, value_parser = crate::parse_draft, default_value = "18")]
    pub draft: crate::Draft,
    /// Real media (`--broadcast`).
    #[command(flatten)]
    pub media: MediaSubArgs,
}

// The media options (`--broadcast`) mirror quichub_client::media's, which
// do not depend on clap.

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

impl From<Format> for media::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Hang => media::Format::Hang,
            Format::HangCmaf => media::Format::HangCmaf,
            Format::Msf => media::Format::Msf,
            Format::Cmsf => media::Format::Cmsf,
        }
    }
}

impl From<InputFormat> for media::InputFormat {
    fn from(f: InputFormat) -> Self {
        match f {
            InputFormat::Auto => media::InputFormat::Auto,
            InputFormat::Fmp4 => media::InputFormat::Fmp4,
            InputFormat::Ts => media::InputFormat::Ts,
        }
    }
}

impl From<Delivery> for media::Delivery {
    fn from(d: Delivery) -> Self {
        match d {
            Delivery::Group => media::Delivery::Group,
            Delivery::FrameType => media::Delivery::FrameType,
        }
    }
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
    /// Constant-rate shaping against resolution fingerprinting, kbit/s: the
    /// media goes out at most this fast (bursts such as keyframes spread
    /// over 20 ms ticks), every tick's unused share is sent as MoQT PADDING
    /// datagrams and every QUIC packet is padded to full size, so the hop to
    /// the relay carries the same full-size packets every tick whatever the
    /// video. Pick it above the broadcast's peak rate over about a second;
    /// 0 is off.
    #[arg(long, default_value_t = 0, value_parser = parse_shape_rate)]
    pub shape_rate: u64,
    /// Pad every object (with PADDING datagrams after it) to the next size
    /// of the ladder 256 B × RATIO^k, e.g. 1.5: hides exact frame sizes,
    /// not the bitrate.
    #[arg(long)]
    pub pad_objects: Option<f64>,
    /// Longest a frame may wait for its share of `--shape-rate`, ms; beyond
    /// it, it goes out at once (counted and reported as an overrun).
    #[arg(long, default_value_t = 500)]
    pub shape_max_delay_ms: u64,
}

fn parse_shape_rate(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    quichub_client::shape::parse_kbps(s)
}

impl MediaPubArgs {
    /// The shaping `--shape-rate`, `--pad-objects` and
    /// `--shape-max-delay-ms` ask for.
    pub fn shape_config(&self) -> anyhow::Result<quichub_client::ShapeConfig> {
        if let Some(r) = self.pad_objects {
            anyhow::ensure!(
                r.is_finite() && r > 1.0 && r <= 16.0,
                "--pad-objects must be in (1, 16], e.g. 1.5"
            );
        }
        Ok(quichub_client::ShapeConfig {
            rate_bps: (self.shape_rate > 0).then_some(self.shape_rate * 1000),
            bucket_ratio: self.pad_objects,
            max_delay: std::time::Duration::from_millis(self.shape_max_delay_ms.clamp(10, 60_000)),
            ..Default::default()
        })
    }
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

fn deadline(d: Option<f64>) -> tokio::time::Instant {
    tokio::time::Instant::now()
        + d.map(Duration::from_secs_f64)
            .unwrap_or(Duration::from_secs(86_400 * 365))
}

/// `--framing` and `--chunk-size` of `pub`, refused where they would be
/// ignored: (framing, chunk size).
fn stdin_framing(a: &PubArgs) -> anyhow::Result<(InFraming, usize)> {
    if a.profile != "stdin" && (a.framing.is_some() || a.chunk_size.is_some()) {
        bail!("--framing and --chunk-size apply to --profile stdin only");
    }
    let framing = a.framing.unwrap_or_default();
    if a.chunk_size.is_some() && framing != InFraming::RawChunks {
        bail!("--chunk-size applies to --framing raw-chunks only");
    }
    let chunk = a
        .chunk_size
        .map_or(framing::DEFAULT_CHUNK_SIZE, |c| c as usize);
    Ok((framing, chunk))
}

pub async fn run_pub(a: PubArgs) -> anyhow::Result<()> {
    let mode = match a.mode.as_str() {
        "push" => TrackMode::Push,
        "announce" => TrackMode::Announce,
        m => bail!("--mode must be push or announce, not {m}"),
    };
    let profile = match a.profile.as_str() {
        "stdin" => None,
        p => Some(Profile::by_name(p).with_context(|| format!("unknown profile {p:?}"))?),
    };
    let (in_framing, chunk_size) = stdin_framing(&a)?;
    let verify = crate::verify_from(a.fingerprint.as_deref())?;
    // Constant-rate shaping sends full-size packets only, so the packet
    // sizes do not show where media ends and padding begins.
    let endpoint = (a.media.shape_rate > 0)
        .then(|| {
            quichub_net::client::Client::new("0.0.0.0:0".parse().expect("valid"), verify.clone())
                .map(|c| c.pad_to_mtu(true))
        })
        .transpose()?;
    let opts = ConnectOptions {
        verify,
        endpoint,
        draft: a.draft.0,
        ..Default::default()
    };
    let url = crate::with_jwt(&a.url, a.jwt.as_deref())?;
    crate::refuse_unverified_token(&url, &opts.verify, a.insecure)?;
    let session = ClientSession::connect(&url, opts).await?;
    let result = match &a.media.broadcast {
        Some(b) => publish_media(&a, b, &session, mode).await,
        None => publish(&a, &session, profile, mode, in_framing, chunk_size).await,
    };
    leave(&session, result).await
}

/// Whatever happened, tells the relay we leave (so it ends our tracks and
/// subscriptions at once, not at its idle timeout), then passes `result` on.
async fn leave(session: &ClientSession, result: anyhow::Result<()>) -> anyhow::Result<()> {
    // A session the relay closed (an expired token, GOAWAY's end) is why
    // whatever failed failed, or ended early: say so, with the code's name.
    let result = match (result, session.close_reason()) {
        (Err(e), Some((_, why))) => Err(e.context(format!("the relay closed the session: {why}"))),
        (Ok(()), Some((code, why))) if code != 0 => {
            Err(anyhow::anyhow!("the relay closed the session: {why}"))
        }
        (r, _) => r,
    };
    let (code, reason) = match &result {
        Ok(()) => (0, "done"),
        Err(_) => (1, "error"),
    };
    session.shutdown(code, reason).await;
    result
}

/// `pub --broadcast`: real media from `--input`, published by
/// [`media::publish`].
async fn publish_media(
    a: &PubArgs,
    broadcast: &str,
    session: &ClientSession,
    mode: TrackMode,
) -> anyhow::Result<()> {
    let m = &a.media;
    let opts = media::MediaPublishOptions {
        broadcast: broadcast.to_string(),
        format: m.format.into(),
        input_format: m.input_format.into(),
        mode,
        pace: !m.no_pace,
        delivery: m.delivery.into(),
        target_latency_ms: m.target_latency_ms,
        shape: m.shape_config()?,
    };
    // Files and pipes block: read on a thread of their own.
    let input: Box<dyn std::io::Read + Send> = if m.input == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(&m.input).with_context(|| format!("open {}", m.input))?)
    };
    let stop = tokio::time::sleep_until(deadline(a.duration));
    let input = media::read_on_thread(input);
    let summary = media::publish(session, &opts, input, stop, |n| eprintln!("{n}")).await?;
    eprintln!("{summary}");
    Ok(())
}

async fn publish(
    a: &PubArgs,
    session: &ClientSession,
    profile: Option<Profile>,
    mode: TrackMode,
    in_framing: InFraming,
    chunk_size: usize,
) -> anyhow::Result<()> {
    let ns = TrackNamespace::from_path(&a.namespace);
    let until = deadline(a.duration);
    let default_name = profile.as_ref().map_or("stdin", |p| p.name);
    let name = FullTrackName {
        namespace: ns.clone(),
        name: Bytes::from(a.track.clone().unwrap_or_else(|| default_name.to_string())),
    };
    let priority = profile.as_ref().map_or(128, |p| p.priority);
    // The track must exist before the namespace is announced: the relay may
    // subscribe to it at once.
    let track = session.create_track(name, priority, mode).await?;
    let _announced = if mode == TrackMode::Announce {
        Some(session.publish_namespace(ns).await?)
    } else {
        None
    };
    match profile {
        None => {
            if mode == TrackMode::Announce {
                // Lines are not a live source: hold them until someone subscribes.
                eprintln!("waiting for a subscriber");
                while !track.is_forwarding() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(64);
            std::thread::spawn(move || {
                let stdin = std::io::stdin();
                let mut input = stdin.lock();
                loop {
                    let next = framing::read_object(&mut input, in_framing, chunk_size);
                    let end = !matches!(next, Ok(Some(_)));
                    let Some(item) = next.transpose() else { break };
                    if tx.blocking_send(item).is_err() || end {
                        break;
                    }
                }
            });
            let mut w = None;
            let mut id = 0u64;
            while let Some(item) = rx.recv().await {
                let object = item.context("read stdin")?;
                if w.is_none() {
                    w = track.open_subgroup(0, 0).await?;
                }
                if let Some(w) = w.as_mut() {
                    w.write(id, Bytes::from(object)).await?;
                }
                id += 1;
                if a.count.is_some_and(|c| id >= c) {
                    break;
                }
            }
            // Everything read from stdin reaches the relay before the
            // session closes (closing drops unacknowledged data; a slow
            // uplink holds seconds of it).
            if let Some(w) = w {
                if !w.finish_and_wait(Duration::from_secs(30)).await {
                    eprintln!("warning: the relay did not acknowledge every object within 30 s");
                }
            }
            track.finish(1).await?;
            eprintln!("published {id} objects from stdin");
        }
        Some(profile) => {
            let sent = synth::run(&track, &profile, a.count, until).await?;
            track.finish(0).await?;
            eprintln!("published {sent} objects");
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

/// The send stamp of a synthetic object (`quichub pub --profile audio|video|imu`),
/// or `None` for any other payload: a stamp more than an hour from `now`
/// (media, stdin) is not one, whatever its first 16 bytes say.
fn plausible_stamp(payload: &[u8], now: u64) -> Option<(u64, u64)> {
    const HOUR_US: u64 = 3_600_000_000;
    synth::stamp(payload).filter(|(t, _)| t.abs_diff(now) < HOUR_US)
}

/// Objects missing between sequence numbers `prev` and `seq`; a jump back or
/// of more than 2^20 (a restarted publisher) counts none.
fn sequence_gap(prev: u64, seq: u64) -> u64 {
    match seq.checked_sub(prev + 1) {
        Some(gap) if gap < 1 << 20 => gap,
        _ => 0,
    }
}

pub async fn run_sub(a: SubArgs) -> anyhow::Result<()> {
    let opts = ConnectOptions {
        verify: crate::verify_from(a.fingerprint.as_deref())?,
        draft: a.draft.0,
        ..Default::default()
    };
    let url = crate::with_jwt(&a.url, a.jwt.as_deref())?;
    crate::refuse_unverified_token(&url, &opts.verify, a.insecure)?;
    let session = ClientSession::connect(&url, opts).await?;
    let result = match &a.media.broadcast {
        Some(b) => subscribe_media(&a, b, &session).await,
        None => subscribe(&a, &session).await,
    };
    leave(&session, result).await
}

/// `sub --broadcast`: a media broadcast played by [`media::subscribe`]
/// into `--output`.
async fn subscribe_media(
    a: &SubArgs,
    broadcast: &str,
    session: &ClientSession,
) -> anyhow::Result<()> {
    let m = &a.media;
    let opts = media::MediaSubscribeOptions {
        broadcast: broadcast.to_string(),
        video: m.video.clone(),
        audio: m.audio.clone(),
        rendezvous_ms: a.rendezvous_ms,
        count: a.count,
    };
    let stop = tokio::time::sleep_until(deadline(a.duration));
    let output: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = if m.output == "-" {
        Box::new(tokio::io::stdout())
    } else {
        let file = tokio::fs::File::create(&m.output)
            .await
            .with_context(|| format!("create {}", m.output))?;
        Box::new(tokio::io::BufWriter::new(file))
    };
    let (written, result) =
        match media::subscribe(session, &opts, output, stop, |n| eprintln!("{n}")).await {
            Ok(written) => (written, Ok(())),
            Err(e) => (e.written, Err(e.error)),
        };
    if let Some(w) = written {
        eprintln!("wrote {}: {w}", m.output);
    }
    result
}

async fn subscribe(a: &SubArgs, session: &ClientSession) -> anyhow::Result<()> {
    let name = FullTrackName::new(&a.namespace, &a.track);
    let mut sub = session
        .subscribe(
            name,
            SubscribeOptions {
                rendezvous_ms: (a.rendezvous_ms > 0).then_some(a.rendezvous_ms),
                filter: a.next_group.then_some(SubscriptionFilter::NextGroupStart),
                ..Default::default()
            },
        )
        .await
        .with_context(|| match a.rendezvous_ms {
            0 => "no waiting for a publisher (--rendezvous-ms 0)".to_string(),
            ms => format!("waited up to {ms} ms for a publisher (--rendezvous-ms)"),
        })?;
    let until = deadline(a.duration);
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    let (mut n, mut bytes, mut last_seq) = (0u64, 0u64, None::<u64>);
    let (mut lost, mut stamped) = (0u64, 0u64);
    let mut window = (Instant::now(), 0u64, 0u64);
    let mut out = std::io::stdout().lock();
    loop {
        let ev = tokio::select! {
            ev = sub.next() => ev,
            _ = tokio::time::sleep_until(until) => break,
        };
        match ev {
            Some(SubscriptionEvent::Object(o)) => {
                n += 1;
                bytes += o.payload.len() as u64;
                let written = if a.stats {
                    if let Some((t, seq)) = plausible_stamp(&o.payload, synth::now_micros()) {
                        let _ = hist.record(synth::now_micros().saturating_sub(t));
                        if let Some(p) = last_seq {
                            lost += sequence_gap(p, seq);
                        }
                        last_seq = Some(seq);
                        stamped += 1;
                    }
                    window.1 += 1;
                    window.2 += o.payload.len() as u64;
                    let el = window.0.elapsed();
                    if el >= Duration::from_secs(1) {
                        let w = writeln!(
                            out,
                            "{:>8.1} obj/s {:>10.1} kbit/s  latency p50 {:>7.2} ms p99 {:>7.2} ms  lost {}",
                            window.1 as f64 / el.as_secs_f64(),
                            window.2 as f64 * 8.0 / 1000.0 / el.as_secs_f64(),
                            hist.value_at_quantile(0.5) as f64 / 1000.0,
                            hist.value_at_quantile(0.99) as f64 / 1000.0,
                            lost
                        );
                        window = (Instant::now(), 0, 0);
                        w
                    } else {
                        Ok(())
                    }
                } else {
                    framing::write_object(&mut out, a.framing, &o.payload)
                };
                match written {
                    // The reader left (`| head`): not an error.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
                    Err(e) => return Err(e).context("write stdout"),
                    Ok(()) => {}
                }
                if a.count.is_some_and(|c| n >= c) {
                    break;
                }
            }
            Some(SubscriptionEvent::Done { status, .. }) => {
                eprintln!("PUBLISH_DONE status {status:#x}");
                break;
            }
            Some(_) => {}
            None => break,
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(e).context("write stdout")
        }
        _ => {}
    }
    if stamped > 0 || !a.stats {
        eprintln!("received {n} objects, {bytes} bytes, lost {lost}");
    } else {
        // Media or stdin objects carry no quichub send stamp: no latency and
        // no sequence to count losses by.
        eprintln!("received {n} objects, {bytes} bytes (no send stamps: latency and loss unknown)");
    }
    sub.cancel();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_synthetic_stamps_count_for_latency_and_loss() {
        let now = 1_800_000_000_000_000u64;
        let synthetic = quichub_client::synth::payload(7, 64);
        let real_now = quichub_client::synth::now_micros();
        assert_eq!(
            plausible_stamp(&synthetic, real_now).map(|(_, s)| s),
            Some(7)
        );
        // An H.264 frame's first bytes are no stamp.
        let mut frame = vec![0u8, 0, 0, 1, 0x65, 0x88, 0x84, 0x00];
        frame.extend_from_slice(&[0x33; 40]);
        assert_eq!(plausible_stamp(&frame, now), None);
        assert_eq!(plausible_stamp(b"short", now), None);
        assert_eq!(sequence_gap(4, 5), 0);
        assert_eq!(sequence_gap(4, 8), 3);
        assert_eq!(sequence_gap(9, 3), 0, "a jump back counts nothing");
        assert_eq!(sequence_gap(0, 1 << 40), 0, "nor a restart");
    }

    #[derive(clap::Parser)]
    struct T {
        #[command(flatten)]
        a: PubArgs,
    }

    fn framing_of(args: &[&str]) -> anyhow::Result<(InFraming, usize)> {
        let mut v = vec!["t", "moqt://127.0.0.1:1/x"];
        v.extend_from_slice(args);
        stdin_framing(&<T as clap::Parser>::try_parse_from(v).unwrap().a)
    }

    #[test]
    fn framing_flags_apply_to_stdin_only() {
        assert_eq!(
            framing_of(&["--profile", "stdin"]).unwrap(),
            (InFraming::Line, 16384)
        );
        assert_eq!(
            framing_of(&[
                "--profile",
                "stdin",
                "--framing",
                "raw-chunks",
                "--chunk-size",
                "100"
            ])
            .unwrap(),
            (InFraming::RawChunks, 100)
        );
        assert_eq!(
            framing_of(&["--profile", "stdin", "--framing", "length"]).unwrap(),
            (InFraming::Length, 16384)
        );
        let e = framing_of(&["--profile", "audio", "--framing", "line"]).unwrap_err();
        assert!(e.to_string().contains("--profile stdin"), "{e}");
        let e = framing_of(&["--profile", "stdin", "--chunk-size", "10"]).unwrap_err();
        assert!(e.to_string().contains("raw-chunks"), "{e}");
        assert!(framing_of(&["--profile", "audio"]).is_ok());
    }
}
