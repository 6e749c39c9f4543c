//! `quichub-lab imu`: IMU sensors over QUIC (one stream, per-sensor
//! streams, weighted priority) and TCP, on a clean and a constrained link;
//! after A. Sengupta, "Streaming over QUIC: Applications in Media and IoT",
//! 2025. `run` streams one mode over one link, `metrics` turns a run into
//! per-sensor figures, `report` writes the results.

mod metrics;
mod report;
mod run;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use quichub_netem::model::{LinkConfig, QueueLimit};
use quichub_netem::profile::Profile;

use crate::common::Options;

/// Options of `quichub-lab imu`.
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
pub fn links(imu: &ImuArgs) -> anyhow::Result<Vec<Profile>> {
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

/// Runs the imu experiment; returns its directory and whether every run succeeded.
pub fn run(args: &Options, imu: &ImuArgs) -> anyhow::Result<(PathBuf, bool)> {
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
    let cfg = run::RunConfig {
        duration: Duration::from_secs_f64(duration),
        drain: Duration::from_millis(if args.quick { 800 } else { 2000 }),
        rate_hz: imu.rate_hz.clamp(1, 20_000),
        payload: imu.payload.clamp(29, 60_000),
        weights: parse_weights(&imu.weights)?,
    };
    let links = links(imu)?;
    let dir = crate::common::result_dir(&args.out, "imu")?;
    let bins = (cfg.duration + cfg.drain).as_secs_f64().ceil() as usize;
    let mut runs = Vec::new();
    for link in &links {
        eprintln!("link {}: {}", link.name, link.describe());
        let emu = quichub_netem::emulator::Emulator::start(
            quichub_netem::emulator::EmulatorConfig::new(link.clone()),
        )
        .with_context(|| format!("starting the emulator for {}", link.name))?;
        for rep in 0..args.reps {
            for mode in run::Mode::ALL {
                let r = run::run_once(&emu, mode, &cfg);
                let rec = match r {
                    Ok(raw) => report::RunRecord {
                        link: link.name.clone(),
                        mode: mode.label(),
                        rep,
                        error: None,
                        t0_us: raw.t0_us,
                        sensors: metrics::sensor_metrics(&raw, duration, bins),
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
    use crate::Experiment;
    use crate::TestCli as Cli;
    use clap::Parser;

    #[test]
    fn args_parse_either_side_of_the_experiment() {
        let a = Cli::try_parse_from(["lab", "--quick", "imu", "--reps", "5"])
            .unwrap()
            .lab;
        assert!(a.quick);
        assert_eq!(a.reps, 5);
        assert_eq!(a.out, PathBuf::from("results"));
        let Experiment::Imu(i) = a.experiment else {
            panic!("imu")
        };
        assert_eq!(parse_weights(&i.weights).unwrap(), [3, 1]);
        assert!(parse_weights("3").is_err());
        assert!(parse_weights("0:1").is_err());
        assert_eq!(links(&i).unwrap().len(), 2);
    }
}
