//! The network side of `quichub-bench pub|sub|run|capacity`: publisher and
//! subscriber roles over any draft-18 MoQT relay, relay CPU sampling from
//! `/proc`, core pinning, and the capacity search. Everything measured is computed by the sans-IO
//! [`crate::metrics`] module; this module only moves objects and clocks.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use moqt::{FullTrackName, KeyValue, TrackNamespace};
use quichub_client::synth::now_micros;
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode, Verify,
};
use tokio::sync::watch;

// Where it always was, for callers of `run::process_cpu_seconds`.
pub use crate::cpu::process_cpu_seconds;
use crate::message::{data_object, ms_since_first_object};
use crate::metrics::{Aggregate, TrackReceiver};
use crate::profile::{Delivery, Profile, TrackProfile};
use crate::report::BenchReport;

/// How to reach the relay and how to behave.
#[derive(Clone)]
pub struct RunConfig {
    /// Relay URL (`moqt://` or `https://`).
    pub relay: String,
    /// Certificate check.
    pub verify: Verify,
    /// Speak this older draft to the relay (`None`: draft 18).
    pub draft: Option<moqt::legacy::Draft>,
    /// PUBLISH_NAMESPACE + serve SUBSCRIBE (works with any relay) or PUBLISH.
    pub publish_mode: TrackMode,
    /// How long a subscriber waits for the publisher (RENDEZVOUS_TIMEOUT,
    /// and retries for relays that answer DOES_NOT_EXIST at once).
    pub subscribe_wait: Duration,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Sample this process's CPU time during the DATA phase.
    pub relay_pid: Option<u32>,
}

/// What the publisher did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PublishSummary {
    /// DATA objects sent per track section.
    pub sent: Vec<(String, u64)>,
    /// Relay CPU seconds during the DATA phase, if sampled.
    pub relay_cpu_s: Option<f64>,
    /// Wall seconds of the DATA phase.
    pub data_phase_s: f64,
}

/// One benchmark run's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunResult {
    /// Subscriber sessions.
    pub subscribers: usize,
    /// Subscriptions that failed (refused, or session lost).
    pub failed_subscriptions: usize,
    /// Per-track and aggregated metrics.
    pub report: BenchReport,
    /// Publisher side.
    pub publish: PublishSummary,
    /// Relay CPU microseconds per delivered DATA object.
    pub relay_us_per_object: Option<f64>,
    /// Relay CPU as a share of one core during the DATA phase (percent).
    pub relay_cpu_pct: Option<f64>,
}

/// Pins process (or thread) `pid` (0 = this process) to `cpus`.
pub fn pin(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it for indices
    // below CPU_SETSIZE, which we check.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            anyhow::ensure!(c < libc::CPU_SETSIZE as usize, "cpu {c} out of range");
            libc::CPU_SET(c, &mut set);
        }
        let r = libc::sched_setaffinity(
            pid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        );
        anyhow::ensure!(
            r == 0,
            "sched_setaffinity({pid}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Pins every thread of process `pid` to `cpus` (the kernel applies affinity per thread).
pub fn pin_process(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    let dir = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("read {dir}"))? {
        let tid: u32 = entry?.file_name().to_string_lossy().parse()?;
        pin(tid, cpus)?;
    }
    Ok(())
}

fn track_name(tp: &TrackProfile, id: &str) -> FullTrackName {
    FullTrackName {
        namespace: tp.namespace(id),
        name: tp.name(id),
    }
}

/// Publishes every track of `profile` with interpolation id `id`, following
/// §5.2-5.3: START repeated during the start delay, DATA on schedule, then
/// COMPLETION. `ready` flips once the tracks are announced or published, so
/// subscribers can be started.
pub async fn publish(
    cfg: &RunConfig,
    profile: &Profile,
    id: &str,
    ready: Option<watch::Sender<bool>>,
) -> anyhow::Result<PublishSummary> {
    let opts = ConnectOptions {
        verify: cfg.verify.clone(),
        draft: cfg.draft,
        ..Default::default()
    };
    let session = ClientSession::connect(&cfg.relay, opts)
        .await
        .context("publisher connect")?;
    let mut tracks = Vec::new();
    for tp in &profile.tracks {
        // TTL: how long objects stay useful, i.e. their delivery timeout.
        let props = vec![KeyValue::int(0x02, tp.ttl_ms)];
        let t = session
            .create_track_with(track_name(tp, id), tp.priority, cfg.publish_mode, props)
            .await
            .with_context(|| format!("create track [{}]", tp.section))?;
        tracks.push((tp.clone(), t));
    }
    let mut announced = Vec::new();
    if cfg.publish_mode == TrackMode::Announce {
        let namespaces: BTreeSet<TrackNamespace> =
            profile.tracks.iter().map(|t| t.namespace(id)).collect();
        for ns in namespaces {
            announced.push(session.publish_namespace(ns).await?);
        }
    }
    if let Some(r) = ready {
        r.send_replace(true);
    }
    // All tracks share the same DATA start, after the longest start delay.
    let start = tokio::time::Instant::now();
    let data_start = start
        + Duration::from_millis(
            profile
                .tracks
                .iter()
                .map(|t| t.start_delay_ms)
                .max()
                .unwrap_or(0),
        );
    let cpu0 = Arc::new(Mutex::new(None));
    let mut tasks = Vec::new();
    for (tp, track) in tracks {
        tasks.push(tokio::spawn(publish_track(tp, track, start, data_start)));
    }
    // Relay CPU from the first DATA to the last.
    tokio::time::sleep_until(data_start).await;
    let wall0 = Instant::now();
    if let Some(pid) = cfg.relay_pid {
        *cpu0.lock().expect("cpu") = Some(process_cpu_seconds(pid)?);
    }
    let mut sent = Vec::new();
    for t in tasks {
        sent.push(t.await??);
    }
    let data_phase_s = wall0.elapsed().as_secs_f64();
    let relay_cpu_s = match (cfg.relay_pid, *cpu0.lock().expect("cpu")) {
        (Some(pid), Some(c0)) => Some(process_cpu_seconds(pid)? - c0),
        _ => None,
    };
    // Give subscribers time to read the COMPLETIONs before leaving.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(announced);
    session.close(0, "bench done");
    Ok(PublishSummary {
        sent,
        relay_cpu_s,
        data_phase_s,
    })
}

async fn publish_track(
    tp: TrackProfile,
    track: Arc<quichub_client::LocalTrack>,
    start: tokio::time::Instant,
    data_start: tokio::time::Instant,
) -> anyhow::Result<(String, u64)> {
    // START, repeated until the DATA phase and never after it. Each START is
    // a group of its own, so a subscriber joining a relay that starts it at
    // the next group (as moq-lite based relays do) still sees one.
    let start_msg = tp.start_message().to_bytes();
    let repeat = Duration::from_millis(tp.start_repeat_interval_ms());
    let mut group = 0u64;
    let mut next = start;
    while next < data_start {
        tokio::time::sleep_until(next).await;
        match tp.mode {
            Delivery::Datagram => {
                track.send_datagram(group, 0, start_msg.clone());
            }
            Delivery::Stream => {
                if let Some(mut w) = track.open_subgroup(group, 0).await? {
                    w.write(0, start_msg.clone()).await?;
                    w.finish();
                }
            }
        }
        group += 1;
        next += repeat;
    }
    // DATA: object index i is due at data_start + i × interval; DATA group g
    // travels as MoQT group `base + g`, one subgroup stream per group.
    let base = group;
    tokio::time::sleep_until(data_start).await;
    let transmit_us = tp.transmit_time_ms() * 1000;
    let first_us = now_micros();
    let mut last_us = first_us;
    let mut sent = 0u64;
    let mut writer = None;
    for index in 0.. {
        let slot = tp.object_at(index);
        if slot.due_us >= transmit_us {
            break;
        }
        tokio::time::sleep_until(data_start + Duration::from_micros(slot.due_us)).await;
        let now = now_micros();
        let payload = data_object(
            slot.group,
            slot.object,
            ms_since_first_object(first_us, now),
            now,
            slot.size,
        );
        let ok = match tp.mode {
            Delivery::Datagram => track.send_datagram(base + slot.group, slot.object, payload),
            Delivery::Stream => {
                if slot.object == 0 {
                    if let Some(w) = writer.take() {
                        quichub_client::SubgroupWriter::finish(w);
                    }
                    writer = track.open_subgroup(base + slot.group, 0).await?;
                }
                match writer.as_mut() {
                    Some(w) => w.write(slot.object, payload).await.is_ok(),
                    None => false,
                }
            }
        };
        if ok {
            sent += 1;
            last_us = now;
        }
    }
    if let Some(w) = writer.take() {
        w.finish();
    }
    // COMPLETION goes on a stream even for datagram tracks: it must arrive.
    let total_ms = u32::try_from((last_us - first_us) / 1000).unwrap_or(u32::MAX);
    let completion = tp.completion_message(sent, total_ms).to_bytes();
    if let Some(mut w) = track.open_subgroup(base + tp.groups() + 1, 0).await? {
        w.write(0, completion).await?;
        w.finish();
    }
    Ok((tp.section.clone(), sent))
}

/// How long a subscriber keeps reading after COMPLETION.
const COMPLETION_GRACE: Duration = Duration::from_millis(500);

/// Progress shared by subscriber tasks: counts, and each track's latest
/// Table 2 figures for the live line.
struct Progress {
    received: AtomicU64,
    finished: AtomicUsize,
    live: Mutex<Vec<Option<crate::metrics::TrackProgress>>>,
}

/// One line of §5.5.1 (Table 2) over all tracks: received objects and groups,
/// mean and max receive delta, mean publisher and receive variance, total rate.
fn live_line(live: &[Option<crate::metrics::TrackProgress>]) -> String {
    let v: Vec<_> = live.iter().flatten().collect();
    if v.is_empty() {
        return "waiting for START".into();
    }
    let n = v.len() as f64;
    let groups: u64 = v.iter().map(|p| p.received_groups).sum();
    let avg_delta = v.iter().map(|p| p.average_delta_ms).sum::<f64>() / n;
    let max_delta = v.iter().map(|p| p.max_delta_ms).fold(0.0, f64::max);
    let pubvar = v.iter().map(|p| p.publisher_variance_ms).sum::<f64>() / n;
    let rxvar = v.iter().map(|p| p.receive_variance_ms).sum::<f64>() / n;
    let kbps = v.iter().map(|p| p.average_bits_per_second).sum::<f64>() / 1000.0;
    let missing: u64 = v.iter().map(|p| p.missing_objects).sum();
    format!(
        "groups {groups} delta avg {avg_delta:.2} max {max_delta:.1} ms pubvar {pubvar:.2} rxvar {rxvar:.2} ms {kbps:.0} kbit/s missing {missing}"
    )
}

/// Runs `n` subscriber sessions, each subscribing to every track of
/// `profile` with interpolation id `id`, until every track completes or the
/// deadline passes. Sessions share client endpoints, 100 per UDP socket.
pub async fn subscribe(
    cfg: &RunConfig,
    profile: &Profile,
    n: usize,
    ids: &dyn Fn(usize) -> Vec<String>,
) -> anyhow::Result<(Vec<TrackReceiver>, usize)> {
    let slots: usize = (0..n).map(|i| ids(i).len()).sum::<usize>() * profile.tracks.len();
    let progress = Arc::new(Progress {
        received: AtomicU64::new(0),
        finished: AtomicUsize::new(0),
        live: Mutex::new(vec![None; slots]),
    });
    let longest = profile
        .tracks
        .iter()
        .map(|t| t.total_transmit_time_ms)
        .max()
        .unwrap_or(0);
    let deadline = tokio::time::Instant::now()
        + cfg.subscribe_wait
        + Duration::from_millis(longest)
        + Duration::from_secs(10);
    let mut tasks = Vec::new();
    let mut failed = 0usize;
    let mut sessions = Vec::new();
    let mut endpoint = None;
    let expected: u64 = profile.tracks.iter().map(|t| t.data_objects()).sum::<u64>() * n as u64;
    let bar = if cfg.progress {
        let b = indicatif::ProgressBar::new(expected.max(1));
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} objects {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    for i in 0..n {
        if i % 100 == 0 {
            endpoint = Some(quichub_net::client::Client::new(
                "0.0.0.0:0".parse()?,
                cfg.verify.clone(),
            )?);
        }
        let opts = ConnectOptions {
            verify: cfg.verify.clone(),
            endpoint: endpoint.clone(),
            draft: cfg.draft,
            ..Default::default()
        };
        let session = match ClientSession::connect(&cfg.relay, opts).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("subscriber {i}: {e:#}");
                failed += profile.tracks.len() * ids(i).len();
                continue;
            }
        };
        for id in ids(i) {
            for tp in &profile.tracks {
                let label = format!("{} id={id} sub={i}", tp.section);
                let name = track_name(tp, &id);
                let session = session.clone();
                let progress = progress.clone();
                let wait = cfg.subscribe_wait;
                let slot = tasks.len();
                tasks.push(tokio::spawn(async move {
                    let mut rx = TrackReceiver::new(label);
                    let sub = subscribe_with_retry(&session, name, wait).await;
                    let Ok(mut sub) = sub else {
                        return (rx, false);
                    };
                    // COMPLETION travels on its own stream and can overtake the
                    // last DATA objects: keep listening briefly after it.
                    let mut until = deadline;
                    loop {
                        let ev = tokio::select! {
                            ev = sub.next() => ev,
                            _ = tokio::time::sleep_until(until) => break,
                        };
                        match ev {
                            Some(SubscriptionEvent::Object(o)) => {
                                if let Ok(crate::metrics::Outcome::Counted) =
                                    rx.on_payload(&o.payload, now_micros())
                                {
                                    // Refresh this track's live figures now and then.
                                    if progress.received.fetch_add(1, Relaxed) % 64 == 0 {
                                        if let Some(s) =
                                            progress.live.lock().expect("live").get_mut(slot)
                                        {
                                            *s = Some(rx.progress());
                                        }
                                    }
                                }
                                if rx.is_finished() && until == deadline {
                                    until = tokio::time::Instant::now() + COMPLETION_GRACE;
                                }
                            }
                            Some(SubscriptionEvent::Done { .. }) | None => break,
                            Some(_) => {}
                        }
                    }
                    progress.finished.fetch_add(1, Relaxed);
                    sub.cancel();
                    (rx, true)
                }));
            }
        }
        sessions.push(session);
    }
    let ticker = bar.clone().map(|b| {
        let progress = progress.clone();
        tokio::spawn(async move {
            loop {
                b.set_position(progress.received.load(Relaxed));
                let line = live_line(&progress.live.lock().expect("live"));
                b.set_message(line);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    });
    let mut receivers = Vec::new();
    for t in tasks {
        let (rx, ok) = t.await?;
        if !ok {
            failed += 1;
        }
        receivers.push(rx);
    }
    if let Some(t) = ticker {
        t.abort();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for s in sessions {
        s.close(0, "bench done");
    }
    Ok((receivers, failed))
}

async fn subscribe_with_retry(
    session: &ClientSession,
    name: FullTrackName,
    wait: Duration,
) -> anyhow::Result<quichub_client::Subscription> {
    let until = Instant::now() + wait;
    loop {
        let opts = SubscribeOptions {
            rendezvous_ms: Some(wait.as_millis() as u64),
            ..Default::default()
        };
        match session.subscribe(name.clone(), opts).await {
            Ok(s) => return Ok(s),
            // Relays without rendezvous answer DOES_NOT_EXIST at once: retry.
            Err(e) if Instant::now() < until => {
                tracing::debug!("subscribe retry: {e:#}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Builds the report: one aggregate per track section and one over all.
pub fn report(
    title: String,
    profile: &Profile,
    receivers: &[TrackReceiver],
    per_track: bool,
) -> BenchReport {
    let mut all = Aggregate::new("all");
    let mut by_section: Vec<Aggregate> = profile
        .tracks
        .iter()
        .map(|t| Aggregate::new(t.section.clone()))
        .collect();
    for r in receivers {
        all.add(r);
        if let Some(i) = profile
            .tracks
            .iter()
            .position(|t| r.label().starts_with(&format!("{} ", t.section)))
        {
            by_section[i].add(r);
        }
    }
    let mut aggregates: Vec<_> = by_section.iter().map(|a| a.report()).collect();
    aggregates.push(all.report());
    BenchReport {
        title,
        tracks: if per_track {
            receivers.iter().map(|r| r.report()).collect()
        } else {
            Vec::new()
        },
        aggregates,
    }
}

/// Publisher and `n` subscribers in one process: the publisher announces
/// first, subscribers join during its start delay.
pub async fn run(
    cfg: &RunConfig,
    profile: &Profile,
    n: usize,
    per_track: bool,
) -> anyhow::Result<RunResult> {
    let (ready_tx, mut ready_rx) = watch::channel(false);
    let pub_cfg = cfg.clone();
    let pub_profile = profile.clone();
    let publisher =
        tokio::spawn(async move { publish(&pub_cfg, &pub_profile, "1", Some(ready_tx)).await });
    ready_rx
        .wait_for(|r| *r)
        .await
        .context("publisher failed before announcing")?;
    let (receivers, failed) = subscribe(cfg, profile, n, &|_| vec!["1".to_string()]).await?;
    let publish = publisher.await??;
    let report = report(
        format!("{} subscribers via {}", n, cfg.relay),
        profile,
        &receivers,
        per_track,
    );
    let delivered: u64 = report
        .aggregates
        .last()
        .map(|a| a.received_objects)
        .unwrap_or(0);
    let relay_us_per_object = publish
        .relay_cpu_s
        .map(|c| c * 1e6 / delivered.max(1) as f64);
    let relay_cpu_pct = publish
        .relay_cpu_s
        .map(|c| 100.0 * c / publish.data_phase_s.max(1e-9));
    Ok(RunResult {
        subscribers: n,
        failed_subscriptions: failed,
        report,
        publish,
        relay_us_per_object,
        relay_cpu_pct,
    })
}

/// Meeting mode (§4.3, §5.6): `meetings` × `size` clients; client k of
/// meeting m publishes every track with id `m*1000+k` and subscribes to every
/// other client's tracks of the same meeting, never its own.
pub async fn run_meeting(
    cfg: &RunConfig,
    profile: &Profile,
    meetings: usize,
    size: usize,
) -> anyhow::Result<RunResult> {
    let id = |m: usize, k: usize| format!("{}", m * 1000 + k);
    let mut publishers = Vec::new();
    let mut readies = Vec::new();
    for m in 0..meetings {
        for k in 0..size {
            let (tx, rx) = watch::channel(false);
            readies.push(rx);
            let (c, p, i) = (cfg.clone(), profile.clone(), id(m, k));
            publishers.push(tokio::spawn(
                async move { publish(&c, &p, &i, Some(tx)).await },
            ));
        }
    }
    for mut r in readies {
        r.wait_for(|v| *v)
            .await
            .context("a meeting publisher failed")?;
    }
    let ids = move |client: usize| {
        let (m, k) = (client / size, client % size);
        (0..size)
            .filter(|&o| o != k)
            .map(|o| id(m, o))
            .collect::<Vec<_>>()
    };
    let (receivers, failed) = subscribe(cfg, profile, meetings * size, &ids).await?;
    let mut publish = PublishSummary::default();
    for p in publishers {
        let s = p.await??;
        publish.sent.extend(s.sent);
        publish.data_phase_s = publish.data_phase_s.max(s.data_phase_s);
    }
    let report = report(
        format!("{meetings} meetings of {size} via {}", cfg.relay),
        profile,
        &receivers,
        false,
    );
    Ok(RunResult {
        subscribers: meetings * size,
        failed_subscriptions: failed,
        report,
        publish,
        relay_us_per_object: None,
        relay_cpu_pct: None,
    })
}

/// One step of a capacity search.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CapacityStep {
    /// Subscribers.
    pub subscribers: usize,
    /// Lost DATA objects over all subscribers.
    pub lost_objects: u64,
    /// Loss ratio.
    pub loss_ratio: f64,
    /// Failed subscriptions or tracks.
    pub failures: usize,
    /// Relay CPU in the DATA phase, in percent of one core (above 100 on
    /// several cores).
    pub relay_cpu_pct: Option<f64>,
    /// Relay CPU microseconds per delivered object.
    pub relay_us_per_object: Option<f64>,
    /// One-way latency p50 (ms).
    pub latency_p50_ms: f64,
    /// One-way latency p99 (ms).
    pub latency_p99_ms: f64,
    /// Whether this step was clean (no loss, no failure, CPU ≤ 95% of the
    /// relay's cores).
    pub clean: bool,
}

/// Ramps subscribers from `start` by `step` up to `max`, stopping after the
/// first step with a lost object, a failed subscription or relay CPU above
/// 95% of `relay_cpus` cores. Returns every step; the largest clean one is
/// the capacity.
pub async fn capacity(
    cfg: &RunConfig,
    profile: &Profile,
    (start, step, max): (usize, usize, usize),
    relay_cpus: usize,
    mut on_step: impl FnMut(&CapacityStep),
) -> anyhow::Result<Vec<CapacityStep>> {
    let cpu_limit = 95.0 * relay_cpus.max(1) as f64;
    let mut steps = Vec::new();
    let mut n = start.max(1);
    while n <= max {
        let r = run(cfg, profile, n, false).await?;
        let all = r
            .report
            .aggregates
            .last()
            .cloned()
            .context("no aggregate")?;
        let failures = r.failed_subscriptions + all.failed as usize + all.incomplete as usize;
        let s = CapacityStep {
            subscribers: n,
            lost_objects: all.lost_objects,
            loss_ratio: all.loss_ratio.unwrap_or(0.0),
            failures,
            relay_cpu_pct: r.relay_cpu_pct,
            relay_us_per_object: r.relay_us_per_object,
            latency_p50_ms: all.latency.p50_ms.unwrap_or(0.0),
            latency_p99_ms: all.latency.p99_ms.unwrap_or(0.0),
            clean: all.lost_objects == 0
                && failures == 0
                && r.relay_cpu_pct.is_none_or(|c| c <= cpu_limit),
        };
        on_step(&s);
        let clean = s.clean;
        steps.push(s);
        if !clean {
            break;
        }
        n += step.max(1);
        // Let the relay settle between steps.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(steps)
}
