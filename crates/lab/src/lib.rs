//! # quichub-lab
//!
//! Experiments that reproduce published studies of QUIC (A. Sengupta,
//! "Streaming over QUIC: Applications in Media and IoT", 2025; J. Cao, X. Su,
//! B. Finley, P. Zhou, P. Hui, "Evaluating Transport Protocols on 5G for
//! Mobile Augmented Reality") or extend one ("A Pure HTTP/3 Alternative to
//! MQTT-over-QUIC in Resource-Constrained IoT", the Drift paper): each writes
//! `OUT/EXPERIMENT/TIMESTAMP/` with the raw JSON, a Markdown report with
//! tables, and SVG plots, and prints its main table.
#![warn(missing_docs)]

pub mod differs;
pub mod fingerprint;
pub mod fingerprint_classify;
pub mod h3_vs_mqtt;
pub mod h3_vs_mqtt_client;
pub mod h3_vs_mqtt_report;
pub mod imu;
pub mod live_video;
pub mod mar;
pub mod mar_report;
mod moq_media;
pub mod report;
pub mod rt;
pub mod stats;
pub mod studies;
pub mod svg;
pub mod uplink;
pub mod video_priority;
pub mod video_priority_report;
pub mod zero_rtt;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use quichub_netem::model::{LinkConfig, QueueLimit};
use quichub_netem::profile::Profile;

/// `quichub-lab`: run an experiment (or the link emulator).
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
    /// QUIC congestion controller of `lab mar` (both ends): cubic, newreno
    /// or bbr (default: the relay's, cubic); `lab uplink` compares all three
    /// unless this is given. Other experiments use the default.
    #[arg(long, global = true)]
    pub cc: Option<quichub_net::CongestionControl>,
}

/// Experiments.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Experiment {
    /// IMU sensors over QUIC (one stream, per-sensor streams, weighted
    /// priority) and TCP, on a clean and a constrained link; after A.
    /// Sengupta, "Streaming over QUIC: Applications in Media and IoT", 2025.
    Imu(ImuArgs),
    /// Mobile augmented reality offloading (an image request at 30 Hz, a
    /// small reply) over UDP, TCP, RTP, MPEG-TS, QUIC streams and QUIC
    /// datagrams, on 5G, LTE, Wi-Fi and a lossy link; after J. Cao, X. Su,
    /// B. Finley, P. Zhou, P. Hui, "Evaluating Transport Protocols on 5G for
    /// Mobile Augmented Reality".
    Mar(MarArgs),
    /// Time from client start to the first MQTT PUBLISH at the broker: TCP,
    /// TLS, QUIC cold, QUIC resumed and QUIC 0-RTT, and HTTP/3, on fixed-RTT
    /// links; extends the time-to-broker measurement of "A Pure HTTP/3
    /// Alternative to MQTT-over-QUIC in Resource-Constrained IoT" (the Drift
    /// paper) to 0-RTT, which that paper set aside.
    ZeroRtt(ZeroRttArgs),
    /// One bulk transfer over the uplink of every link profile: the kernel's
    /// TCP against QUIC (quinn) with each congestion controller (cubic,
    /// newreno, bbr): goodput, utilisation, wire overhead, queue drops, RTT.
    Uplink(uplink::UplinkArgs),
    /// Real H.264 video (I, P, B frames) published in encode order on one
    /// stream per GOP and on one subgroup per frame type (I highest, B
    /// lowest) across a link whose rate steps below the video's bitrate;
    /// frames on time per type, decodable frames per second, keyframe
    /// latency, freeze time; after A. Sengupta, "Streaming over QUIC:
    /// Applications in Media and IoT", 2025.
    VideoPriority(video_priority::VideoPriorityArgs),
    /// The same live 720p 8 Mbit/s H.264 video through quichub's MoQ relay
    /// and through RTMP ingest + HLS delivery (nginx-rtmp) over TCP, on a
    /// clean and emulated links, to a local and a remote subscriber:
    /// throughput, glass-to-glass latency, startup, stalls, bytes on the
    /// wire; after E. P. Estupiñan-Cuesta, J. C. Martínez, W. A.
    /// Roldán-Pineda, "Evaluation of Throughput in Live Video Streaming: TCP
    /// vs. QUIC as a Proof of Concept", 2025.
    LiveVideo(live_video::LiveVideoArgs),
    /// Network overhead (bytes and packets per publish, handshake included
    /// and excluded) and device overhead (client CPU and peak memory) of
    /// HTTP/3, MQTT over QUIC (single- and multi-stream), MQTT over TCP and
    /// TLS, and MoQT publishers, quichub's own and third-party, on NB-IoT;
    /// completes "A Pure HTTP/3 Alternative to MQTT-over-QUIC in
    /// Resource-Constrained IoT" (the Drift paper).
    H3VsMqtt(h3_vs_mqtt::H3VsMqttArgs),
    /// Video resolution inferred from encrypted QUIC packet sizes and times
    /// (bitrate and burst-size thresholds, k-NN), and what constant-rate
    /// shaping or size-bucket padding (`quichub pub --shape-rate`,
    /// `--pad-objects`) costs to defeat it; after A. Sengupta, "Streaming
    /// over QUIC: Applications in Media and IoT", 2025.
    Fingerprint(fingerprint::FingerprintArgs),
    /// Packet-level link emulator between two network namespaces (needs root or a user namespace).
    Netem(quichub_netem::NetemArgs),
}

/// Options of `lab zero-rtt`.
#[derive(clap::Args, Debug, Clone)]
pub struct ZeroRttArgs {
    /// Round-trip times of the links, ms, comma-separated (default 50,200,
    /// or 50 with --quick).
    #[arg(long)]
    pub rtts: Option<String>,
}

/// The RTTs (ms) of the zero-rtt experiment's links.
pub fn zero_rtt_rtts(args: &LabArgs, z: &ZeroRttArgs) -> anyhow::Result<Vec<u64>> {
    let s = z
        .rtts
        .clone()
        .unwrap_or_else(|| if args.quick { "50" } else { "50,200" }.into());
    let rtts = s
        .split(',')
        .map(|r| {
            let v: u64 = r
                .trim()
                .parse()
                .with_context(|| format!("bad RTT {r:?}: use ms, e.g. 50"))?;
            anyhow::ensure!((2..=5000).contains(&v), "RTT {v} ms out of [2, 5000]");
            Ok(v)
        })
        .collect::<anyhow::Result<Vec<u64>>>()?;
    anyhow::ensure!(!rtts.is_empty(), "no RTTs");
    Ok(rtts)
}

/// Options of `lab mar`.
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
    #[arg(long, value_enum, default_value_t = mar::QuicOrder::OldestFirst)]
    pub quic_order: mar::QuicOrder,
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

/// Runs `quichub-lab`; the exit code is 0 when every run succeeded.
pub fn main(args: LabArgs) -> anyhow::Result<i32> {
    match &args.experiment {
        Experiment::Netem(n) => quichub_netem::main(n.clone()),
        Experiment::Imu(imu) => {
            let (dir, ok) = run_imu(&args, imu)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
        Experiment::Mar(mar) => {
            let (dir, ok) = run_mar(&args, mar)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
        Experiment::ZeroRtt(z) => {
            let (dir, ok) = zero_rtt::run(&args, z)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
        Experiment::Uplink(u) => {
            let (dir, ok) = uplink::run(&args, u)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
        Experiment::VideoPriority(v) => {
            let (dir, ok) = video_priority::run(&args, v)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
        Experiment::LiveVideo(lv) if lv.moq.is_some() => live_video::moq_client(lv),
        Experiment::LiveVideo(lv) => {
            // The MoQ publisher and players are this binary again (`--moq`).
            let exe = std::env::current_exe().context("the quichub-lab binary's path")?;
            let (dir, ok) = live_video::run(&args, lv, &exe)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
        // quichub's own publishers are this binary again (`--client`): the
        // experiment measures each publisher's process.
        Experiment::H3VsMqtt(h) => h3_vs_mqtt::main(&args, h, &std::env::current_exe()?),
        Experiment::Fingerprint(f) => {
            let (dir, ok) = fingerprint::run(&args, f)?;
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

/// The links of the mar experiment: the named profiles, then the 5G profile
/// with `--loss-pct` random loss each way (named `5g-lossN`).
pub fn mar_links(args: &LabArgs, mar: &MarArgs) -> anyhow::Result<Vec<Profile>> {
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
pub fn mar_resolutions(args: &LabArgs, mar: &MarArgs) -> anyhow::Result<Vec<(u32, u32)>> {
    match &mar.resolutions {
        None if args.quick => Ok(vec![(1152, 648), (128, 72)]),
        None => Ok(mar::RESOLUTIONS.to_vec()),
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
pub fn run_mar(args: &LabArgs, mar: &MarArgs) -> anyhow::Result<(PathBuf, bool)> {
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
    let cfg = mar::RunConfig {
        duration: Duration::from_secs_f64(duration),
        drain: Duration::from_secs_f64(drain),
        rate_hz: mar::REQUEST_HZ,
        reply_size: mar::REPLY_SIZE,
        udp_payload: mar::UDP_PAYLOAD,
        cc: args.cc.unwrap_or_default(),
        quic_order: mar.quic_order,
    };
    let links = mar_links(args, mar)?;
    let resolutions = mar_resolutions(args, mar)?;
    let dir = result_dir(&args.out, "mar")?;
    let mut runs = Vec::new();
    let total = links.len() * args.reps as usize * mar::Protocol::ALL.len() * resolutions.len();
    for link in &links {
        eprintln!("link {}: {}", link.name, link.describe());
        let emu = quichub_netem::emulator::Emulator::start(
            quichub_netem::emulator::EmulatorConfig::new(link.clone()),
        )
        .with_context(|| format!("starting the emulator for {}", link.name))?;
        for rep in 0..args.reps {
            for proto in mar::Protocol::ALL {
                for &(w, h) in &resolutions {
                    let size = mar::image_size(w, h);
                    let r = mar::run_once(&emu, proto, size, &cfg);
                    let rec =
                        mar_report::RunRecord::new(&link.name, proto, (w, h), size, rep, &cfg, r);
                    eprintln!("  [{}/{total}] {}", runs.len() + 1, rec.one_line());
                    runs.push(rec);
                }
            }
        }
        emu.shutdown();
    }
    let ok = runs.iter().all(|r| r.error.is_none());
    let out = mar_report::Output::new(args, cfg, links, resolutions, runs);
    out.write(&dir)?;
    println!("{}", out.main_table());
    Ok((dir, ok))
}

/// [`LabArgs`] as a command line of its own, for the tests' parsing.
#[cfg(test)]
#[derive(clap::Parser)]
pub(crate) struct TestCli {
    #[command(flatten)]
    pub(crate) lab: LabArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use super::TestCli as Cli;

    #[test]
    fn help_cites_studies_by_title_and_authors() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let mut help = cmd.render_long_help().to_string();
        for sub in [
            "imu",
            "mar",
            "zero-rtt",
            "uplink",
            "video-priority",
            "live-video",
            "h3-vs-mqtt",
            "fingerprint",
        ] {
            let c = cmd.find_subcommand_mut(sub).expect(sub);
            help.push_str(&c.render_long_help().to_string());
        }
        assert!(!help.to_lowercase().contains("seed"), "{help}");
        for needle in [
            "A. Sengupta",
            "Streaming over QUIC: Applications in Media and IoT",
            "J. Cao, X. Su, B. Finley, P. Zhou, P. Hui",
            "Evaluating Transport Protocols on 5G for Mobile Augmented Reality",
            "Drift paper",
            "E. P. Estupiñan-Cuesta, J. C. Martínez, W. A. Roldán-Pineda",
        ] {
            // Long help wraps lines; compare with whitespace collapsed.
            let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(flat.contains(needle), "{needle} in {help}");
        }
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
        let Experiment::Imu(i) = a.experiment else {
            panic!("imu")
        };
        assert_eq!(parse_weights(&i.weights).unwrap(), [3, 1]);
        assert!(parse_weights("3").is_err());
        assert!(parse_weights("0:1").is_err());
        assert_eq!(imu_links(&i).unwrap().len(), 2);
    }

    #[test]
    fn mar_args_links_and_resolutions() {
        let a = Cli::try_parse_from(["lab", "mar"]).unwrap().lab;
        let Experiment::Mar(m) = &a.experiment else {
            panic!("mar")
        };
        let names: Vec<String> = mar_links(&a, m)
            .unwrap()
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["5g", "lte", "wifi", "5g-loss1"]);
        assert_eq!(mar_resolutions(&a, m).unwrap().len(), 9);
        let q = Cli::try_parse_from(["lab", "mar", "--quick", "--resolutions", "640x360, 128X72"])
            .unwrap()
            .lab;
        let Experiment::Mar(m) = &q.experiment else {
            panic!("mar")
        };
        assert_eq!(mar_links(&q, m).unwrap().len(), 2);
        assert_eq!(mar_resolutions(&q, m).unwrap(), [(640, 360), (128, 72)]);
        let bad = Cli::try_parse_from(["lab", "mar", "--resolutions", "640"])
            .unwrap()
            .lab;
        let Experiment::Mar(m) = &bad.experiment else {
            panic!("mar")
        };
        assert!(mar_resolutions(&bad, m).is_err());
    }
}
