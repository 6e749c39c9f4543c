//! `quichub pub` and `quichub sub`.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::{FullTrackName, SubscriptionFilter, TrackNamespace};
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
    pub media: crate::media_cmd::MediaPubArgs,
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
    pub media: crate::media_cmd::MediaSubArgs,
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
        Some(b) => {
            crate::media_cmd::publish(&a.media, b, &session, mode, deadline(a.duration)).await
        }
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
        Some(b) => {
            crate::media_cmd::subscribe(
                &a.media,
                b,
                &session,
                a.rendezvous_ms,
                deadline(a.duration),
                a.count,
            )
            .await
        }
        None => subscribe(&a, &session).await,
    };
    leave(&session, result).await
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
