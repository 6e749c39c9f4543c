//! `quichub pub` and `quichub sub`.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::{FullTrackName, SubscriptionFilter, TrackNamespace};
use quichub_client::synth::{self, Profile};
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode,
};

/// Publisher options.
#[derive(clap::Args, Debug)]
pub struct PubArgs {
    /// Relay URL: `moqt://host:port/path` (raw QUIC) or `https://host:port/path` (WebTransport).
    pub url: String,
    /// Track namespace, `/`-separated fields.
    #[arg(long, default_value = "quichub/demo")]
    pub namespace: String,
    /// Track name (default: the profile's name).
    #[arg(long)]
    pub track: Option<String>,
    /// Source: audio (datagrams), video (streams, keyframe groups), imu, or stdin (one object per line).
    #[arg(long, default_value = "audio")]
    pub profile: String,
    /// `push` sends PUBLISH; `announce` sends PUBLISH_NAMESPACE and serves SUBSCRIBE.
    #[arg(long, default_value = "push")]
    pub mode: String,
    /// Stop after this many objects.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Pin the relay certificate by SHA-256 (hex); default accepts any certificate.
    #[arg(long)]
    pub fingerprint: Option<String>,
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
    /// Stop after this many objects.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Wait up to this many ms for a publisher (RENDEZVOUS_TIMEOUT).
    #[arg(long, default_value_t = 0)]
    pub rendezvous_ms: u64,
    /// Start at the next group instead of the next object.
    #[arg(long)]
    pub next_group: bool,
    /// Pin the relay certificate by SHA-256 (hex).
    #[arg(long)]
    pub fingerprint: Option<String>,
}

fn deadline(d: Option<f64>) -> tokio::time::Instant {
    tokio::time::Instant::now()
        + d.map(Duration::from_secs_f64)
            .unwrap_or(Duration::from_secs(86_400 * 365))
}

pub async fn run_pub(a: PubArgs) -> anyhow::Result<()> {
    let opts = ConnectOptions {
        verify: crate::verify_from(a.fingerprint.as_deref())?,
        ..Default::default()
    };
    let session = ClientSession::connect(&a.url, opts).await?;
    let mode = match a.mode.as_str() {
        "push" => TrackMode::Push,
        "announce" => TrackMode::Announce,
        m => bail!("--mode must be push or announce, not {m}"),
    };
    let ns = TrackNamespace::from_path(&a.namespace);
    let until = deadline(a.duration);
    let profile = match a.profile.as_str() {
        "stdin" => None,
        p => Some(Profile::by_name(p).with_context(|| format!("unknown profile {p:?}"))?),
    };
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
            let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
            std::thread::spawn(move || {
                for line in std::io::stdin().lock().lines() {
                    let Ok(l) = line else { break };
                    if tx.blocking_send(l).is_err() {
                        break;
                    }
                }
            });
            let mut w = None;
            let mut id = 0u64;
            while let Some(line) = rx.recv().await {
                if w.is_none() {
                    w = track.open_subgroup(0, 0).await?;
                }
                if let Some(w) = w.as_mut() {
                    w.write(id, Bytes::from(line.into_bytes())).await?;
                }
                id += 1;
                if a.count.is_some_and(|c| id >= c) {
                    break;
                }
            }
            if let Some(w) = w {
                w.finish();
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
    session.close(0, "done");
    Ok(())
}

pub async fn run_sub(a: SubArgs) -> anyhow::Result<()> {
    let opts = ConnectOptions {
        verify: crate::verify_from(a.fingerprint.as_deref())?,
        ..Default::default()
    };
    let session = ClientSession::connect(&a.url, opts).await?;
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
        .await?;
    let until = deadline(a.duration);
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    let (mut n, mut bytes, mut last_seq) = (0u64, 0u64, None::<u64>);
    let mut lost = 0u64;
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
                if a.stats {
                    if let Some((t, seq)) = synth::stamp(&o.payload) {
                        let _ = hist.record(synth::now_micros().saturating_sub(t));
                        if let Some(p) = last_seq {
                            lost += seq.saturating_sub(p + 1);
                        }
                        last_seq = Some(seq);
                    }
                    window.1 += 1;
                    window.2 += o.payload.len() as u64;
                    let el = window.0.elapsed();
                    if el >= Duration::from_secs(1) {
                        writeln!(
                            out,
                            "{:>8.1} obj/s {:>10.1} kbit/s  latency p50 {:>7.2} ms p99 {:>7.2} ms  lost {}",
                            window.1 as f64 / el.as_secs_f64(),
                            window.2 as f64 * 8.0 / 1000.0 / el.as_secs_f64(),
                            hist.value_at_quantile(0.5) as f64 / 1000.0,
                            hist.value_at_quantile(0.99) as f64 / 1000.0,
                            lost
                        )?;
                        window = (Instant::now(), 0, 0);
                    }
                } else {
                    out.write_all(&o.payload)?;
                    out.write_all(b"\n")?;
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
    out.flush()?;
    eprintln!("received {n} objects, {bytes} bytes, lost {lost}");
    sub.cancel();
    session.close(0, "done");
    Ok(())
}
