//! `quichub-lab mar`: mobile augmented reality offloading (an image
//! request at 30 Hz, a small reply) over UDP, TCP, RTP, MPEG-TS, QUIC
//! streams and QUIC datagrams; after J. Cao, X. Su, B. Finley, P. Zhou, P.
//! Hui, "Evaluating Transport Protocols on 5G for Mobile Augmented
//! Reality". `run` carries one protocol over one link, `report` writes the
//! results.

mod report;
mod run;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use quichub_netem::profile::Profile;

pub use run::QuicOrder;

use crate::common::Options;

/// Options of `quichub-lab mar`.
#[derive(clap::Args, Debug, Clone)]
pub struct MarArgs {
    /// Seconds of requests per (protocol, resolution) run (default 1.5, or 0.7 with --quick).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds after the last request during which replies still count
    /// (default 0.75, or 0.5 with --quick); a run ends earlier once every
    /// request is answered.
    #[arg(long)]
    pub drain: Option<f64>,
    /// Links, comma-separated netem profile names; `LOSSY` below is added
    /// unless `--links` is given (default 5g,lte,wifi, or 5g with --quick).
    #[arg(long)]
    pub links: Option<String>,
    /// Random loss of the lossy link (the 5G profile with this loss each
    /// way), percent; 0 leaves the lossy link out.
    #[arg(long, default_value_t = 1.0)]
    pub loss_pct: f64,
    /// Resolutions WxH, comma-separated (default: the nine of Table 1 of
    /// Cao et al., or 1152x648,128x72 with --quick).
    #[arg(long)]
    pub resolutions: Option<String>,
    /// Order of the concurrent request streams of `quic-stream`.
    #[arg(long, value_enum, default_value_t = QuicOrder::OldestFirst)]
    pub quic_order: QuicOrder,
}

/// The links of the mar experiment: the named profiles, then the 5G profile
/// with `--loss-pct` random loss each way (named `5g-lossN`).
pub fn links(args: &Options, mar: &MarArgs) -> anyhow::Result<Vec<Profile>> {
    let names = mar
        .links
        .clone()
        .unwrap_or_else(|| if args.quick { "5g" } else { "5g,lte,wifi" }.into());
    let mut links = Vec::new();
    for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        links.push(Profile::named(n)?);
    }
    if mar.loss_pct > 0.0 && mar.links.is_none() {
        anyhow::ensure!(mar.loss_pct <= 100.0, "--loss-pct must be in [0, 100]");
        let mut p = Profile::five_g();
        p.name = format!("5g-loss{}", mar.loss_pct);
        p.up.loss = mar.loss_pct / 100.0;
        p.down.loss = mar.loss_pct / 100.0;
        p.source = format!(
            "the 5g profile with {}% independent random loss each way (lab mar's lossy link)",
            mar.loss_pct
        );
        p.validate()?;
        links.push(p);
    }
    anyhow::ensure!(!links.is_empty(), "no links");
    Ok(links)
}

/// The resolutions of the mar experiment.
pub fn resolutions(args: &Options, mar: &MarArgs) -> anyhow::Result<Vec<(u32, u32)>> {
    match &mar.resolutions {
        None if args.quick => Ok(vec![(1152, 648), (128, 72)]),
        None => Ok(run::RESOLUTIONS.to_vec()),
        Some(s) => s
            .split(',')
            .map(|r| {
                let (w, h) = r
                    .trim()
                    .split_once(['x', 'X'])
                    .with_context(|| format!("bad resolution {r:?}: use WxH, e.g. 640x360"))?;
                let (w, h): (u32, u32) = (w.parse()?, h.parse()?);
                anyhow::ensure!(
                    w > 0 && h > 0 && w * h <= 4000 * 4000,
                    "bad resolution {r:?}"
                );
                Ok((w, h))
            })
            .collect(),
    }
}

/// Runs the mar experiment; returns its directory and whether every run succeeded.
pub fn run(args: &Options, mar: &MarArgs) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(why) = quichub_netem::privileges::missing() {
        anyhow::bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    let duration = mar.duration.unwrap_or(if args.quick { 0.7 } else { 1.5 });
    let drain = mar.drain.unwrap_or(if args.quick { 0.5 } else { 0.75 });
    anyhow::ensure!(
        duration > 0.0 && duration <= 600.0 && (0.0..=60.0).contains(&drain),
        "--duration must be in (0, 600] s and --drain in [0, 60] s"
    );
    let cfg = run::RunConfig {
        duration: Duration::from_secs_f64(duration),
        drain: Duration::from_secs_f64(drain),
        rate_hz: run::REQUEST_HZ,
        reply_size: run::REPLY_SIZE,
        udp_payload: run::UDP_PAYLOAD,
        cc: args.cc.unwrap_or_default(),
        quic_order: mar.quic_order,
    };
    let links = links(args, mar)?;
    let resolutions = resolutions(args, mar)?;
    let dir = crate::common::result_dir(&args.out, "mar")?;
    let mut runs = Vec::new();
    let total = links.len() * args.reps as usize * run::Protocol::ALL.len() * resolutions.len();
    for link in &links {
        eprintln!("link {}: {}", link.name, link.describe());
        let emu = quichub_netem::emulator::Emulator::start(
            quichub_netem::emulator::EmulatorConfig::new(link.clone()),
        )
        .with_context(|| format!("starting the emulator for {}", link.name))?;
        for rep in 0..args.reps {
            for proto in run::Protocol::ALL {
                for &(w, h) in &resolutions {
                    let size = run::image_size(w, h);
                    let r = run::run_once(&emu, proto, size, &cfg);
                    let rec = report::RunRecord::new(&link.name, proto, (w, h), size, rep, &cfg, r);
                    eprintln!("  [{}/{total}] {}", runs.len() + 1, rec.one_line());
                    runs.push(rec);
                }
            }
        }
        emu.shutdown();
    }
    let ok = runs.iter().all(|r| r.error.is_none());
    let out = report::Output::new(args, cfg, links, resolutions, runs);
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
    fn mar_args_links_and_resolutions() {
        let a = Cli::try_parse_from(["lab", "mar"]).unwrap().lab;
        let Experiment::Mar(m) = &a.experiment else {
            panic!("mar")
        };
        let names: Vec<String> = links(&a, m).unwrap().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["5g", "lte", "wifi", "5g-loss1"]);
        assert_eq!(resolutions(&a, m).unwrap().len(), 9);
        let q = Cli::try_parse_from(["lab", "mar", "--quick", "--resolutions", "640x360, 128X72"])
            .unwrap()
            .lab;
        let Experiment::Mar(m) = &q.experiment else {
            panic!("mar")
        };
        assert_eq!(links(&q, m).unwrap().len(), 2);
        assert_eq!(resolutions(&q, m).unwrap(), [(640, 360), (128, 72)]);
        let bad = Cli::try_parse_from(["lab", "mar", "--resolutions", "640"])
            .unwrap()
            .lab;
        let Experiment::Mar(m) = &bad.experiment else {
            panic!("mar")
        };
        assert!(resolutions(&bad, m).is_err());
    }
}
