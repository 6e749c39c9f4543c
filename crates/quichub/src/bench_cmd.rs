//! `quichub bench`: draft-evens-moq-bench against any draft-18 relay.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use quichub_bench::run::{self, RunConfig, RunResult};
use quichub_bench::Profile;
use quichub_client::TrackMode;

/// Benchmark options.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// Profile file (draft-evens-moq-bench / qperf INI), e.g. profiles/scenario1-audio.ini.
    profile: PathBuf,
    /// Relay URL (`moqt://` raw QUIC or `https://` WebTransport).
    #[arg(long, default_value = "moqt://127.0.0.1:4443/bench")]
    relay: String,
    /// `announce` (PUBLISH_NAMESPACE, serve SUBSCRIBE; works with any relay) or `push` (PUBLISH).
    #[arg(long, default_value = "announce")]
    publish_mode: String,
    /// Pin the relay certificate by SHA-256 (hex); default accepts any certificate.
    #[arg(long)]
    fingerprint: Option<String>,
    /// Seconds a subscriber waits for the publisher.
    #[arg(long, default_value_t = 10.0)]
    subscribe_wait: f64,
    /// Write the JSON report here.
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
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
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
    /// Ramp subscribers until loss, a failed subscription, or relay CPU > 95%.
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
        /// Pin the relay to CPU 0 and this process to the other CPUs.
        #[arg(long)]
        pin: bool,
    },
}

fn config(c: &Common, relay_pid: Option<u32>) -> anyhow::Result<RunConfig> {
    Ok(RunConfig {
        relay: c.relay.clone(),
        verify: crate::verify_from(c.fingerprint.as_deref())?,
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
    r: &quichub_bench::BenchReport,
    extra: Option<&RunResult>,
) -> anyhow::Result<()> {
    print!("{}", r.summary_table());
    if let Some(x) = extra {
        if let (Some(us), Some(pct)) = (x.relay_us_per_object, x.relay_cpu_pct) {
            println!("relay cpu {pct:.1}% of one core, {us:.2} us per delivered object");
        }
        if x.failed_subscriptions > 0 {
            println!("failed subscriptions: {}", x.failed_subscriptions);
        }
    }
    if let Some(p) = &c.json {
        let json = match extra {
            Some(x) => serde_json::to_string_pretty(x)?,
            None => r.to_json()?,
        };
        std::fs::write(p, json).with_context(|| format!("write {}", p.display()))?;
    }
    if let Some(p) = &c.csv {
        std::fs::write(p, r.aggregates_csv())?;
        let mut t = p.clone().into_os_string();
        t.push(".tracks.csv");
        std::fs::write(PathBuf::from(t), r.tracks_csv())?;
    }
    Ok(())
}

pub async fn run(a: BenchArgs) -> anyhow::Result<u8> {
    match a.cmd {
        BenchCmd::Pub(c) => {
            let profile = Profile::load(&c.profile)?;
            let s = run::publish(&config(&c, None)?, &profile, &c.id, None).await?;
            for (section, n) in &s.sent {
                println!("[{section}] sent {n} DATA objects");
            }
            Ok(0)
        }
        BenchCmd::Sub {
            common: c,
            subscribers,
        } => {
            let profile = Profile::load(&c.profile)?;
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
            let profile = Profile::load(&c.profile)?;
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
        } => {
            let profile = Profile::load(&c.profile)?;
            if pin {
                let cpus = std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1);
                anyhow::ensure!(cpus >= 2, "--pin needs at least 2 CPUs");
                run::pin_process(relay_pid, &[0])?;
                let others: Vec<usize> = (1..cpus).collect();
                run::pin_process(std::process::id(), &others)?;
                println!(
                    "pinned relay (pid {relay_pid}) to CPU 0 and the load generator to CPUs 1-{}",
                    cpus - 1
                );
            }
            let cfg = RunConfig {
                progress: false,
                ..config(&c, Some(relay_pid))?
            };
            println!(
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
            );
            let steps = run::capacity(&cfg, &profile, start, step, max, |s| {
                println!(
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
            })
            .await?;
            let best = steps
                .iter()
                .filter(|s| s.clean)
                .map(|s| s.subscribers)
                .max();
            match best {
                Some(b) => println!("capacity: {b} subscribers (largest clean step)"),
                None => println!("capacity: no clean step"),
            }
            if let Some(p) = &c.json {
                std::fs::write(p, serde_json::to_string_pretty(&steps)?)?;
            }
            Ok(0)
        }
    }
}
