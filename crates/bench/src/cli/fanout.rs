//! `quichub-bench fanout`: one publisher, N subscribers through a relay, for
//! the relay's fan-out cost. Reads the relay's CPU time from `/proc/PID/stat`
//! before and after, and reports relay CPU per delivered object, loss and
//! one-way latency (publisher and subscribers share this machine's clock).
//! The full draft-evens-moq-bench tool is a separate command.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::synth::{self, Profile};
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode,
};

use crate::cpu::{cpu_ticks, ticks_per_sec};

/// Options.
#[derive(clap::Args, Debug)]
pub struct BenchFanoutArgs {
    /// Relay URL.
    #[arg(long, default_value = "moqt://127.0.0.1:4443/bench")]
    pub relay: String,
    /// JWT for a relay with authentication, sent by the publisher and every
    /// subscriber as the URL's `?jwt=`: it needs `put` and `get` on `bench`,
    /// and --fingerprint (or --insecure).
    #[arg(long, env = "QUICHUB_JWT", hide_env_values = true)]
    pub jwt: Option<String>,
    /// Pin the relay certificate by SHA-256 (hex); without it any certificate
    /// is accepted, and a token only with --insecure.
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// Send the token even to a relay whose certificate is not checked.
    #[arg(long)]
    pub insecure: bool,
    /// PID of the relay process (for its CPU time); omit to skip CPU figures.
    #[arg(long)]
    pub relay_pid: Option<u32>,
    /// Subscriber sessions (each its own QUIC connection).
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    /// Profile: audio (datagrams) or video (streams).
    #[arg(long, default_value = "audio")]
    pub profile: String,
    /// Seconds of publishing measured.
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// Print the result as JSON on stdout; the human-readable lines then go
    /// to stderr, so stdout is JSON only.
    #[arg(long)]
    pub json: bool,
    /// Subscribe over moq-lite (`moq-lite-03` … `moq-lite-06`, raw QUIC),
    /// as moq-dev's clients do, instead of draft 18: the relay's lite
    /// bridge's cost per delivered object (the publisher stays draft 18).
    #[arg(long, value_name = "VERSION")]
    pub lite: Option<String>,
}

pub async fn run(a: BenchFanoutArgs) -> anyhow::Result<()> {
    let profile = Profile::by_name(&a.profile).context("profile must be audio, video or imu")?;
    let opts = ConnectOptions {
        verify: quichub_client::verify_from(a.fingerprint.as_deref())?,
        ..Default::default()
    };
    let name = FullTrackName {
        namespace: TrackNamespace::from_path("bench"),
        name: Bytes::from_static(profile.name.as_bytes()),
    };
    let url = quichub_client::with_jwt(&a.relay, a.jwt.as_deref())?;
    quichub_client::refuse_unverified_token(&url, &opts.verify, a.insecure)?;
    let publisher = ClientSession::connect(&url, opts.clone()).await?;
    let track = publisher
        .create_track(name.clone(), profile.priority, TrackMode::Push)
        .await?;

    let received = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));
    let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut sessions = Vec::with_capacity(a.subscribers);
    let mut tasks = Vec::with_capacity(a.subscribers);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let t0 = Instant::now();
    // Subscribers share client endpoints (UDP sockets), 100 sessions each, so
    // the load generator spends its CPU on the sessions, not on sockets.
    let mut endpoint = None;
    let lite = a
        .lite
        .as_deref()
        .map(super::lite_sub::parse_version)
        .transpose()?;
    let tally = Arc::new(super::lite_sub::Tally {
        measuring: measuring.clone(),
        received: received.clone(),
        hist: hist.clone(),
    });
    let mut lite_conns = Vec::new();
    for i in 0..a.subscribers {
        if i % 100 == 0 {
            endpoint = Some(quichub_net::client::Client::new(
                "0.0.0.0:0".parse()?,
                opts.verify.clone(),
            )?);
        }
        if let (Some(v), Some(client)) = (lite, endpoint.as_ref()) {
            let parsed = url::Url::parse(&url)?;
            let remote = tokio::net::lookup_host(format!(
                "{}:{}",
                parsed.host_str().unwrap_or("127.0.0.1"),
                parsed.port().unwrap_or(4443)
            ))
            .await?
            .next()
            .context("relay address")?;
            let c =
                super::lite_sub::subscribe(client, remote, v, "bench", profile.name, tally.clone())
                    .await
                    .with_context(|| format!("lite subscriber {i}"))?;
            lite_conns.push(c);
            continue;
        }
        let opts = ConnectOptions {
            endpoint: endpoint.clone(),
            ..opts.clone()
        };
        let s = ClientSession::connect(&url, opts)
            .await
            .with_context(|| format!("subscriber {i}"))?;
        let mut sub = s
            .subscribe(name.clone(), SubscribeOptions::default())
            .await?;
        let (received, hist, measuring) = (received.clone(), hist.clone(), measuring.clone());
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut local = hdrhistogram::Histogram::<u64>::new(3).expect("hist");
            let mut n = 0u64;
            loop {
                let ev = tokio::select! {
                    ev = sub.next() => ev,
                    _ = stop.changed() => break,
                };
                match ev {
                    Some(SubscriptionEvent::Object(o)) if measuring.load(Relaxed) => {
                        n += 1;
                        if let Some((sent, _)) = synth::stamp(&o.payload) {
                            let _ = local.record(synth::now_micros().saturating_sub(sent).max(1));
                        }
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            received.fetch_add(n, Relaxed);
            hist.lock().expect("hist").add(&local).ok();
        }));
        sessions.push(s);
    }
    eprintln!(
        "{} subscribers connected in {:.1} s",
        a.subscribers,
        t0.elapsed().as_secs_f64()
    );

    // Warm up one second, then measure.
    let warm_until = tokio::time::Instant::now() + Duration::from_secs(1);
    synth::run(&track, &profile, None, warm_until).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    measuring.store(true, Relaxed);
    let cpu0 = a.relay_pid.map(cpu_ticks).transpose()?;
    let wall0 = Instant::now();
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(a.duration);
    let sent = synth::run(&track, &profile, None, until).await?;
    let wall = wall0.elapsed();
    let cpu1 = a.relay_pid.map(cpu_ticks).transpose()?;
    // Let in-flight objects land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    measuring.store(false, Relaxed);
    stop_tx.send_replace(true);
    for t in tasks {
        let _ = t.await;
    }
    for s in &sessions {
        s.close(0, "bench done");
    }
    for c in &lite_conns {
        c.close(0u32.into(), b"bench done");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let expected = sent * a.subscribers as u64;
    let got = received.load(Relaxed);
    let loss = if expected > 0 {
        100.0 * (expected.saturating_sub(got)) as f64 / expected as f64
    } else {
        0.0
    };
    let h = hist.lock().expect("hist").clone();
    let cpu = match (cpu0, cpu1) {
        (Some(c0), Some(c1)) => {
            let secs = (c1 - c0) as f64 / ticks_per_sec() as f64;
            Some((
                secs,
                secs * 1e6 / got.max(1) as f64,
                100.0 * secs / wall.as_secs_f64(),
            ))
        }
        _ => None,
    };
    let mut out = super::flags::human_out(a.json);
    writeln!(
        out,
        "profile {} subscribers {}{}{} duration {:.1}s sent {} expected {} received {} loss {:.3}%",
        profile.name,
        a.subscribers,
        lite.map_or(String::new(), |v| format!(" ({})", v.label())),
        if a.jwt.is_some() { " (with a JWT)" } else { "" },
        wall.as_secs_f64(),
        sent,
        expected,
        got,
        loss
    )?;
    writeln!(
        out,
        "latency one-way p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    )?;
    if let Some((secs, per_obj, pct)) = cpu {
        writeln!(
            out,
            "relay cpu {secs:.2} s ({pct:.1}% of one core), {per_obj:.2} us per delivered object"
        )?;
    }
    out.flush()?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "profile": profile.name, "subscribers": a.subscribers, "lite": lite.map(|v| v.label()), "jwt": a.jwt.is_some(), "duration_s": wall.as_secs_f64(),
                "sent": sent, "expected": expected, "received": got, "loss_pct": loss,
                "latency_p50_ms": h.value_at_quantile(0.5) as f64 / 1000.0,
                "latency_p99_ms": h.value_at_quantile(0.99) as f64 / 1000.0,
                "relay_cpu_s": cpu.map(|c| c.0), "relay_us_per_object": cpu.map(|c| c.1),
                "relay_cpu_pct": cpu.map(|c| c.2),
            })
        );
    }
    publisher.close(0, "bench done");
    Ok(())
}
