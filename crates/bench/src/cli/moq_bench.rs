//! `quichub-bench pub|sub|run|capacity`: draft-evens-moq-bench against any
//! draft-18 relay.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::run::{self, CapacityStep, RunConfig, RunResult};
use crate::Profile;
use anyhow::Context;
use clap::{Args, Subcommand};
use quichub_client::TrackMode;

/// What every command of the draft takes.
#[derive(Args, Debug, Clone)]
pub(super) struct Common {
    /// Profile file (draft-evens-moq-bench / qperf INI), e.g. profiles/scenario1-audio.ini.
    profile: PathBuf,
    /// Relay URL (`moqt://` raw QUIC, `https://` WebTransport, `ws://` or
    /// `wss://` MoQT over WebSocket on the relay's HTTP port).
    #[arg(long, default_value = "moqt://127.0.0.1:4443/bench")]
    relay: String,
    /// `announce` (PUBLISH_NAMESPACE, serve SUBSCRIBE; works with any relay) or `push` (PUBLISH).
    #[arg(long, default_value = "announce")]
    publish_mode: String,
    /// Pin the relay certificate by SHA-256 (hex); without it any certificate
    /// is accepted, and a token (`?jwt=` in --relay) only with --insecure.
    #[arg(long)]
    fingerprint: Option<String>,
    /// Send a token even to a relay whose certificate is not checked.
    #[arg(long)]
    insecure: bool,
    /// MoQT draft to speak: 18 (native), 16 or 14 (through quichub's
    /// translating bridge; `moqt://` and `https://` only).
    #[arg(long, value_parser = super::flags::parse_draft, default_value = "18")]
    draft: super::flags::Draft,
    /// Seconds a subscriber waits for the publisher.
    #[arg(long, default_value_t = 10.0)]
    subscribe_wait: f64,
    /// Write the JSON report here; `-` writes it to stdout, and then nothing
    /// else goes there (the table goes to stderr).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the CSV reports here (`PATH` for aggregates, `PATH.tracks.csv` per track).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Interpolation id for `{}` in namespaces and names.
    #[arg(long, default_value = "1")]
    id: String,
    /// Seconds every track sends, start delay included: overrides the
    /// profile's `total_transmit_time` (e.g. 25 with the draft's profiles: 5 s
    /// of START, 20 s of DATA). Give `bench pub` and `bench sub` the same.
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Seconds of START before the first DATA, while subscribers join:
    /// overrides the profile's `start_delay`.
    #[arg(long, value_name = "SECS")]
    start_delay: Option<f64>,
}

/// The profile of `c`, with `--duration` and `--start-delay` applied.
fn load_profile(c: &Common) -> anyhow::Result<Profile> {
    let mut profile = Profile::load(&c.profile)?;
    let ms = |flag: &str, v: Option<f64>| -> anyhow::Result<Option<u64>> {
        v.map(|s| {
            anyhow::ensure!(
                (0.0..1e7).contains(&s),
                "{flag} must be a number of seconds, not {s}"
            );
            Ok((s * 1000.0).round() as u64)
        })
        .transpose()
    };
    profile
        .set_times(
            ms("--start-delay", c.start_delay)?,
            ms("--duration", c.duration)?,
        )
        .map_err(|e| anyhow::anyhow!("--duration/--start-delay: {e}"))?;
    Ok(profile)
}

/// Whether the JSON report goes to stdout (`--json -`).
fn json_to_stdout(c: &Common) -> bool {
    c.json.as_deref() == Some(std::path::Path::new("-"))
}

/// Where the human-readable lines go: stdout, or stderr when stdout carries
/// the JSON report.
fn human(c: &Common) -> Box<dyn Write> {
    super::flags::human_out(json_to_stdout(c))
}

/// Writes the JSON report to `--json`'s file or stdout.
fn write_json(c: &Common, json: &str) -> anyhow::Result<()> {
    match &c.json {
        Some(_) if json_to_stdout(c) => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{json}")?;
            out.flush()?;
        }
        Some(p) => std::fs::write(p, json).with_context(|| format!("write {}", p.display()))?,
        None => {}
    }
    Ok(())
}

/// Fails at once, before any connection, when `pid` is not a process whose
/// CPU time can be read (rather than after the run's start delay).
fn check_relay_pid(pid: u32) -> anyhow::Result<()> {
    run::process_cpu_seconds(pid)
        .map(|_| ())
        .with_context(|| format!("--relay-pid {pid}: no such process whose CPU time can be read"))
}

/// The capacity search's conclusion, saying when it stopped at `--max`
/// with every step clean (then the capacity is only a lower bound).
fn capacity_verdict(steps: &[CapacityStep], max: usize) -> String {
    let best = steps
        .iter()
        .filter(|s| s.clean)
        .map(|s| s.subscribers)
        .max();
    let all_clean = steps.last().is_some_and(|s| s.clean);
    match best {
        None => match steps.first() {
            Some(s) => format!(
                "capacity: no clean step (the first, {} subscribers, was not clean; lower --start)",
                s.subscribers
            ),
            None => format!("capacity: no step run (--start is above --max {max})"),
        },
        Some(b) if all_clean => format!(
            "capacity: at least {b} subscribers: stopped at --max {max} with every step clean, \
             not at the relay's capacity (raise --max)"
        ),
        Some(b) => format!("capacity: {b} subscribers (largest clean step)"),
    }
}

/// The draft's commands: `pub`, `sub`, `run`, `capacity`.
#[derive(Subcommand, Debug)]
pub(super) enum BenchCmd {
    /// Publish every track of the profile.
    Pub(Common),
    /// N subscriber sessions (each its own QUIC connection) for every track.
    Sub {
        #[command(flatten)]
        common: Common,
        /// Subscriber sessions.
        #[arg(short = 'n', long, default_value_t = 1)]
        subscribers: usize,
    },
    /// Publisher and subscribers in one process; reports Tables 2 and 3.
    Run {
        #[command(flatten)]
        common: Common,
        /// Subscriber sessions.
        #[arg(short = 'n', long, default_value_t = 10)]
        subscribers: usize,
        /// Relay PID, for relay CPU per delivered object.
        #[arg(long)]
        relay_pid: Option<u32>,
        /// Meeting mode (scenario 3): clients per meeting; `--subscribers` counts meetings.
        #[arg(long)]
        meeting_size: Option<usize>,
    },
    /// Ramp subscribers until loss, a failed subscription, or relay CPU > 95%
    /// of its cores.
    Capacity {
        #[command(flatten)]
        common: Common,
        /// Relay PID (CPU from /proc/PID/stat).
        #[arg(long)]
        relay_pid: u32,
        /// First step.
        #[arg(long, default_value_t = 100)]
        start: usize,
        /// Step size.
        #[arg(long, default_value_t = 100)]
        step: usize,
        /// Last step.
        #[arg(long, default_value_t = 5000)]
        max: usize,
        /// Pin the relay to CPU 0 (CPUs 0..N-1 with `--relay-cpus N`) and
        /// this process to the other CPUs.
        #[arg(long)]
        pin: bool,
        /// Cores the relay has: a step is clean up to 95% of N cores
        /// (start the relay with as many threads: `--threads N` or
        /// `relay --endpoints N`; scripts/bench-cores.sh does).
        #[arg(long, value_name = "N", default_value_t = 1)]
        relay_cpus: usize,
    },
}

fn config(c: &Common, relay_pid: Option<u32>) -> anyhow::Result<RunConfig> {
    let verify = quichub_client::verify_from(c.fingerprint.as_deref())?;
    quichub_client::refuse_unverified_token(&c.relay, &verify, c.insecure)?;
    Ok(RunConfig {
        relay: c.relay.clone(),
        verify,
        draft: c.draft.0,
        publish_mode: match c.publish_mode.as_str() {
            "announce" => TrackMode::Announce,
            "push" => TrackMode::Push,
            m => anyhow::bail!("--publish-mode must be announce or push, not {m}"),
        },
        subscribe_wait: Duration::from_secs_f64(c.subscribe_wait),
        progress: !c.quiet,
        relay_pid,
    })
}

fn write_outputs(
    c: &Common,
    r: &crate::BenchReport,
    extra: Option<&RunResult>,
) -> anyhow::Result<()> {
    let mut out = human(c);
    write!(out, "{}", r.summary_table())?;
    if let Some(x) = extra {
        if let (Some(us), Some(pct)) = (x.relay_us_per_object, x.relay_cpu_pct) {
            writeln!(
                out,
                "relay cpu {pct:.1}% of one core, {us:.2} us per delivered object"
            )?;
        }
        if x.failed_subscriptions > 0 {
            writeln!(out, "failed subscriptions: {}", x.failed_subscriptions)?;
        }
    }
    out.flush()?;
    if c.json.is_some() {
        let json = match extra {
            Some(x) => serde_json::to_string_pretty(x)?,
            None => r.to_json()?,
        };
        write_json(c, &json)?;
    }
    if let Some(p) = &c.csv {
        std::fs::write(p, r.aggregates_csv())?;
        let mut t = p.clone().into_os_string();
        t.push(".tracks.csv");
        std::fs::write(PathBuf::from(t), r.tracks_csv())?;
    }
    Ok(())
}

pub(super) async fn run(cmd: BenchCmd) -> anyhow::Result<u8> {
    match cmd {
        BenchCmd::Pub(c) => {
            let profile = load_profile(&c)?;
            let s = run::publish(&config(&c, None)?, &profile, &c.id, None).await?;
            let mut out = human(&c);
            for (section, n) in &s.sent {
                writeln!(out, "[{section}] sent {n} DATA objects")?;
            }
            Ok(0)
        }
        BenchCmd::Sub {
            common: c,
            subscribers,
        } => {
            let profile = load_profile(&c)?;
            let id = c.id.clone();
            let (receivers, failed) =
                run::subscribe(&config(&c, None)?, &profile, subscribers, &|_| {
                    vec![id.clone()]
                })
                .await?;
            let report = run::report(
                format!("{subscribers} subscribers via {}", c.relay),
                &profile,
                &receivers,
                subscribers <= 50,
            );
            write_outputs(&c, &report, None)?;
            Ok(if failed == 0 { 0 } else { 1 })
        }
        BenchCmd::Run {
            common: c,
            subscribers,
            relay_pid,
            meeting_size,
        } => {
            let profile = load_profile(&c)?;
            if let Some(pid) = relay_pid {
                check_relay_pid(pid)?;
            }
            let cfg = config(&c, relay_pid)?;
            let r = match meeting_size {
                Some(size) => run::run_meeting(&cfg, &profile, subscribers, size).await?,
                None => run::run(&cfg, &profile, subscribers, subscribers <= 50).await?,
            };
            write_outputs(&c, &r.report, Some(&r))?;
            let all = r.report.aggregates.last();
            let clean = r.failed_subscriptions == 0
                && all.is_some_and(|a| a.failed == 0 && a.incomplete == 0);
            Ok(if clean { 0 } else { 1 })
        }
        BenchCmd::Capacity {
            common: c,
            relay_pid,
            start,
            step,
            max,
            pin,
            relay_cpus,
        } => {
            let profile = load_profile(&c)?;
            check_relay_pid(relay_pid)?;
            anyhow::ensure!(relay_cpus >= 1, "--relay-cpus must be at least 1");
            let mut out = human(&c);
            if pin {
                let cpus = std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1);
                anyhow::ensure!(
                    cpus > relay_cpus,
                    "--pin needs more CPUs than --relay-cpus ({relay_cpus}): this machine has {cpus}"
                );
                run::pin_process(relay_pid, &(0..relay_cpus).collect::<Vec<_>>())?;
                run::pin_process(std::process::id(), &(relay_cpus..cpus).collect::<Vec<_>>())?;
                writeln!(
                    out,
                    "pinned relay (pid {relay_pid}) to CPUs 0-{} and the load generator to CPUs {}-{}",
                    relay_cpus - 1,
                    relay_cpus,
                    cpus - 1
                )?;
            }
            let cfg = RunConfig {
                progress: false,
                ..config(&c, Some(relay_pid))?
            };
            writeln!(
                out,
                "{:>11} {:>10} {:>9} {:>8} {:>9} {:>11} {:>9} {:>9} {:>6}",
                "subscribers",
                "lost",
                "loss %",
                "failures",
                "relay cpu",
                "us/object",
                "p50 ms",
                "p99 ms",
                "clean"
            )?;
            let steps = run::capacity(&cfg, &profile, (start, step, max), relay_cpus, |s| {
                let _ = writeln!(
                    out,
                    "{:>11} {:>10} {:>9.4} {:>8} {:>8.1}% {:>11.2} {:>9.2} {:>9.2} {:>6}",
                    s.subscribers,
                    s.lost_objects,
                    100.0 * s.loss_ratio,
                    s.failures,
                    s.relay_cpu_pct.unwrap_or(f64::NAN),
                    s.relay_us_per_object.unwrap_or(f64::NAN),
                    s.latency_p50_ms,
                    s.latency_p99_ms,
                    s.clean
                );
                let _ = out.flush();
            })
            .await?;
            writeln!(out, "{}", capacity_verdict(&steps, max))?;
            out.flush()?;
            write_json(&c, &serde_json::to_string_pretty(&steps)?)?;
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(subscribers: usize, clean: bool) -> CapacityStep {
        CapacityStep {
            subscribers,
            lost_objects: u64::from(!clean),
            loss_ratio: 0.0,
            failures: 0,
            relay_cpu_pct: None,
            relay_us_per_object: None,
            latency_p50_ms: 1.0,
            latency_p99_ms: 2.0,
            clean,
        }
    }

    #[test]
    fn capacity_says_when_it_stopped_at_max() {
        let v = capacity_verdict(&[step(100, true), step(200, true)], 200);
        assert!(v.contains("at least 200"), "{v}");
        assert!(v.contains("--max 200"), "{v}");
        let v = capacity_verdict(&[step(100, true), step(200, false)], 500);
        assert_eq!(v, "capacity: 100 subscribers (largest clean step)");
        assert!(!v.contains("--max"));
        let v = capacity_verdict(&[step(100, false)], 500);
        assert!(v.contains("no clean step"), "{v}");
        let v = capacity_verdict(&[], 50);
        assert!(v.contains("--start"), "{v}");
    }

    #[test]
    fn relay_pid_is_checked_up_front() {
        assert!(check_relay_pid(std::process::id()).is_ok());
        let e = check_relay_pid(u32::MAX).unwrap_err();
        assert!(format!("{e:#}").contains("--relay-pid"), "{e:#}");
    }

    #[test]
    fn duration_and_start_delay_override_the_profile() {
        #[derive(clap::Parser)]
        struct T {
            #[command(subcommand)]
            cmd: BenchCmd,
        }
        let profile = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../profiles/scenario1-audio.ini"
        );
        let parse = |extra: &[&str]| {
            let mut args = vec!["t", "run", profile];
            args.extend_from_slice(extra);
            match <T as clap::Parser>::try_parse_from(args).unwrap().cmd {
                BenchCmd::Run { common, .. } => common,
                _ => unreachable!(),
            }
        };
        let p = load_profile(&parse(&[])).unwrap();
        assert_eq!(p.tracks[0].total_transmit_time_ms, 35_000);
        let p = load_profile(&parse(&["--duration", "25"])).unwrap();
        assert_eq!(p.tracks[0].total_transmit_time_ms, 25_000);
        assert_eq!(p.tracks[0].start_delay_ms, 5_000);
        let p = load_profile(&parse(&["--duration", "1.5", "--start-delay", "0.5"])).unwrap();
        assert_eq!(p.tracks[0].transmit_time_ms(), 1_000);
        let e = load_profile(&parse(&["--duration", "3"])).unwrap_err();
        assert!(format!("{e:#}").contains("start delay"), "{e:#}");
        assert!(json_to_stdout(&parse(&["--json", "-"])));
        assert!(!json_to_stdout(&parse(&["--json", "out.json"])));
    }
}
