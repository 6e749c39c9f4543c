//! `quichub-bench media`: one real video broadcast (an fMP4 or MPEG-TS file,
//! e.g. 720p30 H.264 at 8 Mbit/s from ffmpeg) published in real time as hang
//! objects, one group per GOP, to N subscribers through a relay. Reports the
//! relay's CPU per delivered Mbit (from `/proc/PID/stat`), the egress one core
//! would carry at 95% busy, loss, and the latency from the moment the
//! publisher hands a frame to its QUIC stream to the moment a subscriber
//! holds the whole object (publisher and subscribers share this clock).
//! Works against any draft-18 relay (e.g. moq-dev's moq-relay).

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode,
};
use quichub_media::fmp4::Fmp4Demuxer;
use quichub_media::hang;
use quichub_media::ts::TsDemuxer;
use quichub_media::{Demuxer, Event, Frame, Limits, TrackInfo, TrackKind};

use crate::cpu::{cpu_ticks, ticks_per_sec};

/// Options.
#[derive(clap::Args, Debug)]
pub struct BenchMediaArgs {
    /// Relay URL.
    #[arg(long, default_value = "moqt://127.0.0.1:4443/bench")]
    pub relay: String,
    /// PID of the relay process (for its CPU time); omit to skip CPU figures.
    #[arg(long)]
    pub relay_pid: Option<u32>,
    /// Subscriber sessions (each its own QUIC connection).
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    /// The video: a fragmented MP4 or MPEG-TS file (its first video track is
    /// published; the file loops until `--duration` is over).
    #[arg(long)]
    pub input: std::path::PathBuf,
    /// Seconds of publishing measured (after one second of warm-up).
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// `announce` (PUBLISH_NAMESPACE, then serve the relay's SUBSCRIBE: what
    /// every draft-18 relay supports) or `push` (PUBLISH).
    #[arg(long, default_value = "announce")]
    pub mode: String,
    /// Print the result as JSON on stdout (the human lines go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Send a token (`?jwt=` in --relay) although the relay's certificate
    /// is not checked.
    #[arg(long)]
    pub insecure: bool,
}

/// The first video track of `path` and its frames.
fn load(path: &std::path::Path) -> anyhow::Result<(TrackInfo, Vec<Frame>)> {
    let data = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let mut d: Box<dyn Demuxer> = if data.first() == Some(&0x47) {
        Box::new(TsDemuxer::new(Limits::default()))
    } else {
        Box::new(Fmp4Demuxer::new(Limits::default()))
    };
    d.push(&data);
    d.end();
    let (mut video, mut frames) = (None, Vec::new());
    while let Some(ev) = d.next()? {
        match ev {
            Event::Tracks(t) => {
                video = video.or_else(|| t.into_iter().find(|t| t.kind == TrackKind::Video))
            }
            Event::Frame(f) if video.as_ref().is_some_and(|v| v.id == f.track) => frames.push(f),
            Event::Frame(_) => {}
        }
    }
    let video = video.context("no video track in the input")?;
    if !frames.first().is_some_and(|f| f.keyframe) {
        bail!("the input's video does not start with a keyframe");
    }
    Ok((video, frames))
}

/// Runs the benchmark.
pub async fn run(a: BenchMediaArgs) -> anyhow::Result<()> {
    let (info, frames) = load(&a.input)?;
    let span = frames
        .last()
        .map_or(0, |f| f.dts + i64::from(f.duration.max(1)))
        - frames[0].dts;
    let bytes: usize = frames.iter().map(|f| f.data.len()).sum();
    let bitrate = bytes as f64 * 8.0 / (span as f64 / 1e6);
    eprintln!(
        "input {}: {} {}x{}, {} frames in {:.1} s, {:.2} Mbit/s",
        a.input.display(),
        info.codec,
        info.width,
        info.height,
        frames.len(),
        span as f64 / 1e6,
        bitrate / 1e6
    );
    let name = FullTrackName {
        namespace: TrackNamespace::from_path("bench/media"),
        name: Bytes::from_static(b"video"),
    };
    let mode = match a.mode.as_str() {
        "push" => TrackMode::Push,
        "announce" => TrackMode::Announce,
        m => bail!("--mode must be push or announce, not {m}"),
    };
    quichub_client::refuse_unverified_token(
        &a.relay,
        &quichub_client::Verify::Insecure,
        a.insecure,
    )?;
    let publisher = ClientSession::connect(&a.relay, ConnectOptions::default()).await?;
    let track = publisher.create_track(name.clone(), 96, mode).await?;
    let _announced = if mode == TrackMode::Announce {
        Some(publisher.publish_namespace(name.namespace.clone()).await?)
    } else {
        None
    };

    // When each frame (by its timestamp on the wire) was handed to QUIC.
    let sent_at: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let received = Arc::new(AtomicU64::new(0));
    let received_bytes = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));
    let measuring = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut sessions = Vec::with_capacity(a.subscribers);
    let mut tasks = Vec::with_capacity(a.subscribers);
    let t0 = Instant::now();
    let mut endpoint = None;
    for i in 0..a.subscribers {
        // 100 sessions per UDP socket, as in `fanout`.
        if i % 100 == 0 {
            endpoint = Some(quichub_net::client::Client::new(
                "0.0.0.0:0".parse()?,
                quichub_client::Verify::Insecure,
            )?);
        }
        let opts = ConnectOptions {
            endpoint: endpoint.clone(),
            ..Default::default()
        };
        let s = ClientSession::connect(&a.relay, opts)
            .await
            .with_context(|| format!("subscriber {i}"))?;
        let mut sub = s
            .subscribe(name.clone(), SubscribeOptions::default())
            .await?;
        let (received, received_bytes, hist, measuring, sent_at) = (
            received.clone(),
            received_bytes.clone(),
            hist.clone(),
            measuring.clone(),
            sent_at.clone(),
        );
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut local = hdrhistogram::Histogram::<u64>::new(3).expect("hist");
            let (mut n, mut b) = (0u64, 0u64);
            loop {
                let ev = tokio::select! {
                    ev = sub.next() => ev,
                    _ = stop.changed() => break,
                };
                match ev {
                    Some(SubscriptionEvent::Object(o)) if measuring.load(Relaxed) => {
                        n += 1;
                        b += o.payload.len() as u64;
                        if let Ok((ts, _)) = hang::decode_legacy(&o.payload) {
                            let sent = sent_at.lock().expect("sent").get(&ts).copied();
                            if let Some(sent) = sent {
                                let us = o.arrived.saturating_duration_since(sent).as_micros();
                                let _ = local.record((us as u64).max(1));
                            }
                        }
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            received.fetch_add(n, Relaxed);
            received_bytes.fetch_add(b, Relaxed);
            hist.lock().expect("hist").add(&local).ok();
        }));
        sessions.push(s);
    }
    eprintln!(
        "{} subscribers connected in {:.1} s",
        a.subscribers,
        t0.elapsed().as_secs_f64()
    );

    // Publish in real time, looping the file, one group per GOP. The first
    // second warms up; then the relay's CPU is read around the measured part.
    let start = tokio::time::Instant::now();
    let warm = Duration::from_secs(1);
    let total = warm + Duration::from_secs_f64(a.duration);
    let (mut group, mut object) = (0u64, 0u64);
    let mut writer = None;
    let (mut sent, mut sent_bytes) = (0u64, 0u64);
    let mut cpu0 = None;
    let mut wall0 = None;
    'outer: for lap in 0.. {
        for f in &frames {
            let t = (f.dts - frames[0].dts) + lap * span;
            let due = start + Duration::from_micros(t.max(0) as u64);
            if due.duration_since(start) >= total {
                break 'outer;
            }
            tokio::time::sleep_until(due).await;
            if wall0.is_none() && due.duration_since(start) >= warm {
                measuring.store(true, Relaxed);
                cpu0 = a.relay_pid.map(cpu_ticks).transpose()?;
                wall0 = Some(Instant::now());
            }
            if f.keyframe {
                if let Some(w) = writer.take() {
                    quichub_client::SubgroupWriter::finish(w);
                }
                if sent > 0 || object > 0 {
                    group += 1;
                }
                object = 0;
                writer = track.open_subgroup(group, 0).await?;
            }
            let pts = (f.pts + lap * span).max(0) as u64;
            let payload = hang::encode_legacy(pts, &f.data);
            sent_at.lock().expect("sent").insert(pts, Instant::now());
            if let Some(w) = writer.as_mut() {
                w.write(object, payload.clone()).await?;
            }
            object += 1;
            if wall0.is_some() {
                sent += 1;
                sent_bytes += payload.len() as u64;
            }
        }
    }
    let wall = wall0.map_or(Duration::ZERO, |w| w.elapsed());
    let cpu1 = a.relay_pid.map(cpu_ticks).transpose()?;
    if let Some(w) = writer.take() {
        w.finish();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    measuring.store(false, Relaxed);
    stop_tx.send_replace(true);
    for t in tasks {
        let _ = t.await;
    }
    for s in &sessions {
        s.close(0, "bench done");
    }
    publisher.close(0, "bench done");

    let expected = sent * a.subscribers as u64;
    let got = received.load(Relaxed);
    let got_bytes = received_bytes.load(Relaxed);
    let loss = 100.0 * expected.saturating_sub(got) as f64 / expected.max(1) as f64;
    let secs = wall.as_secs_f64().max(1e-9);
    let egress_mbps = got_bytes as f64 * 8.0 / 1e6 / secs;
    let h = hist.lock().expect("hist").clone();
    let cpu = match (cpu0, cpu1) {
        (Some(c0), Some(c1)) => {
            let cpu_s = (c1 - c0) as f64 / ticks_per_sec() as f64;
            let busy = cpu_s / secs;
            let per_mbit_ms = cpu_s * 1e3 / (egress_mbps * secs).max(1e-9);
            let at95 = if busy > 0.0 {
                egress_mbps / busy * 0.95 / 1e3
            } else {
                0.0
            };
            Some((cpu_s, 100.0 * busy, per_mbit_ms, at95))
        }
        _ => None,
    };
    let mut out = super::flags::human_out(a.json);
    writeln!(
        out,
        "subscribers {} duration {secs:.1}s sent {sent} frames ({:.2} Mbit/s) received {got} of {expected} (loss {loss:.3}%) egress {:.1} Mbit/s",
        a.subscribers,
        sent_bytes as f64 * 8.0 / 1e6 / secs,
        egress_mbps
    )?;
    writeln!(
        out,
        "latency send-to-receive p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    )?;
    if let Some((cpu_s, pct, per_mbit, at95)) = cpu {
        writeln!(
            out,
            "relay cpu {cpu_s:.2} s ({pct:.1}% of one core), {per_mbit:.3} ms per delivered Mbit, {at95:.2} Gbit/s egress at 95% of one core"
        )?;
    }
    out.flush()?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "input": a.input, "codec": info.codec, "width": info.width, "height": info.height,
                "input_mbps": bitrate / 1e6, "subscribers": a.subscribers, "duration_s": secs,
                "sent": sent, "expected": expected, "received": got, "loss_pct": loss,
                "egress_mbps": egress_mbps,
                "latency_p50_ms": h.value_at_quantile(0.5) as f64 / 1000.0,
                "latency_p99_ms": h.value_at_quantile(0.99) as f64 / 1000.0,
                "latency_max_ms": h.max() as f64 / 1000.0,
                "relay_cpu_s": cpu.map(|c| c.0), "relay_cpu_pct": cpu.map(|c| c.1),
                "relay_ms_per_mbit": cpu.map(|c| c.2), "egress_gbps_at_95pct_core": cpu.map(|c| c.3),
            })
        );
    }
    Ok(())
}
