//! # quichub-lab
//!
//! Experiments that reproduce the seeds' studies: each writes
//! `OUT/EXPERIMENT/TIMESTAMP/` with the raw JSON, a Markdown report with
//! tables, and SVG plots, and prints its main table.
#![warn(missing_docs)]

pub mod imu;
pub mod report;
pub mod stats;
pub mod svg;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use quichub_netem::model::{LinkConfig, QueueLimit};
use quichub_netem::profile::Profile;

/// `quichub lab`: run an experiment.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Experiment to run.
    #[command(subcommand)]
    pub experiment: Experiment,
    /// CI mode: short runs (the whole experiment in under 2 minutes).
    #[arg(long, global = true)]
    pub quick: bool,
    /// Repetitions of every mode on every link (figures are median, min–max).
    #[arg(long, default_value_t = 3, global = true)]
    pub reps: u32,
    /// Results root: the run is written to OUT/EXPERIMENT/TIMESTAMP/.
    #[arg(long, default_value = "results", global = true)]
    pub out: PathBuf,
}

/// Experiments.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Experiment {
    /// Seed 000: IMU sensors over QUIC (one stream, per-sensor streams,
    /// weighted priority) and TCP, on a clean and a constrained link.
    Imu(ImuArgs),
}

/// Options of `lab imu`.
#[derive(clap::Args, Debug, Clone)]
pub struct ImuArgs {
    /// Samples per second per sensor.
    #[arg(long, default_value_t = 500)]
    pub rate_hz: u32,
    /// Bytes per sample (timestamp, sequence, sensor, 3 axes, padding; at least 29).
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Seconds of streaming per run (default 20, or 2 with --quick).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Uplink rate of the constrained link, kbit/s (below the offered load).
    #[arg(long, default_value_t = 400)]
    pub link_kbps: u64,
    /// Random loss of the constrained link in percent, both directions.
    #[arg(long, default_value_t = 2.0)]
    pub loss_pct: f64,
    /// One-way delay of both links' directions on the constrained link, ms.
    #[arg(long, default_value_t = 10)]
    pub delay_ms: u64,
    /// Weights of the weighted scheduler, ACCEL:GYRO.
    #[arg(long, default_value = "3:1")]
    pub weights: String,
}

/// Runs `quichub lab`; the exit code is 0 when every run succeeded.
pub fn main(args: LabArgs) -> anyhow::Result<i32> {
    match &args.experiment {
        Experiment::Imu(imu) => {
            let (dir, ok) = run_imu(&args, imu)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
    }
}

fn parse_weights(s: &str) -> anyhow::Result<[u32; 2]> {
    let (a, g) = s
        .split_once(':')
        .with_context(|| format!("bad --weights {s:?}: use ACCEL:GYRO, e.g. 3:1"))?;
    let w = [a.trim().parse()?, g.trim().parse()?];
    anyhow::ensure!(w[0] > 0 && w[1] > 0, "weights must be positive");
    Ok(w)
}

/// The two links of the imu experiment: clean, and constrained (uplink rate
/// below the offered load, random loss both ways).
pub fn imu_links(imu: &ImuArgs) -> anyhow::Result<Vec<Profile>> {
    let clean = Profile {
        name: "clean".into(),
        ..Profile::unimpaired()
    };
    let delay = Duration::from_millis(imu.delay_ms);
    let loss = imu.loss_pct / 100.0;
    let constrained = Profile {
        name: "constrained".into(),
        up: LinkConfig {
            delay,
            loss,
            rate_bps: Some(imu.link_kbps * 1000),
            queue: QueueLimit::Time(Duration::from_millis(100)),
            ..Default::default()
        },
        down: LinkConfig {
            delay,
            loss,
            ..Default::default()
        },
        source: "lab imu: offered load above the uplink rate, random loss".into(),
    };
    constrained.validate()?;
    Ok(vec![clean, constrained])
}

/// `OUT/EXPERIMENT/YYYYMMDDTHHMMSSZ[-N]/`, created.
pub fn result_dir(out: &Path, experiment: &str) -> anyhow::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil(secs.div_euclid(86400));
    let t = secs.rem_euclid(86400);
    let stamp = format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    );
    let base = out.join(experiment);
    for n in 0..1000 {
        let dir = if n == 0 {
            base.join(&stamp)
        } else {
            base.join(format!("{stamp}-{n}"))
        };
        if !dir.exists() {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            return Ok(dir);
        }
    }
    anyhow::bail!("too many result directories for {stamp}")
}

fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Runs the imu experiment; returns its directory and whether every run succeeded.
pub fn run_imu(args: &LabArgs, imu: &ImuArgs) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(why) = quichub_netem::privileges::missing() {
        anyhow::bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    let duration = imu.duration.unwrap_or(if args.quick { 2.0 } else { 20.0 });
    anyhow::ensure!(
        duration > 0.0 && duration <= 600.0,
        "--duration must be in (0, 600] s"
    );
    let cfg = imu::RunConfig {
        duration: Duration::from_secs_f64(duration),
        drain: Duration::from_millis(if args.quick { 800 } else { 2000 }),
        rate_hz: imu.rate_hz.clamp(1, 20_000),
        payload: imu.payload.clamp(29, 60_000),
        weights: parse_weights(&imu.weights)?,
    };
    let links = imu_links(imu)?;
    let dir = result_dir(&args.out, "imu")?;
    let bins = (cfg.duration + cfg.drain).as_secs_f64().ceil() as usize;
    let mut runs = Vec::new();
    for link in &links {
        eprintln!("link {}: {}", link.name, link.describe());
        let emu = quichub_netem::emulator::Emulator::start(
            quichub_netem::emulator::EmulatorConfig::new(link.clone()),
        )
        .with_context(|| format!("starting the emulator for {}", link.name))?;
        for rep in 0..args.reps {
            for mode in imu::Mode::ALL {
                let r = imu::run_once(&emu, mode, &cfg);
                let rec = match r {
                    Ok(raw) => report::RunRecord {
                        link: link.name.clone(),
                        mode: mode.label(),
                        rep,
                        error: None,
                        t0_us: raw.t0_us,
                        sensors: stats::sensor_metrics(&raw, duration, bins),
                    },
                    Err(e) => report::RunRecord {
                        link: link.name.clone(),
                        mode: mode.label(),
                        rep,
                        error: Some(format!("{e:#}")),
                        t0_us: 0,
                        sensors: Vec::new(),
                    },
                };
                eprintln!("  {}", rec.one_line());
                runs.push(rec);
            }
        }
        emu.shutdown();
    }
    let ok = runs.iter().all(|r| r.error.is_none());
    let out = report::Output::new(args, cfg, links, runs);
    out.write(&dir)?;
    println!("{}", out.main_table());
    Ok((dir, ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lab: LabArgs,
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(19_782), (2024, 2, 29));
    }

    #[test]
    fn args_parse_either_side_of_the_experiment() {
        let a = Cli::try_parse_from(["lab", "--quick", "imu", "--reps", "5"])
            .unwrap()
            .lab;
        assert!(a.quick);
        assert_eq!(a.reps, 5);
        assert_eq!(a.out, PathBuf::from("results"));
        let Experiment::Imu(i) = a.experiment;
        assert_eq!(parse_weights(&i.weights).unwrap(), [3, 1]);
        assert!(parse_weights("3").is_err());
        assert!(parse_weights("0:1").is_err());
        assert_eq!(imu_links(&i).unwrap().len(), 2);
    }
}
