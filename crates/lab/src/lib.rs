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

// One folder per experiment (its arguments and run in `mod.rs`, its
// parts private beside it); what several share in `common`.
mod common;
pub mod fingerprint;
pub mod h3_vs_mqtt;
pub mod imu;
pub mod live_video;
pub mod mar;
pub mod uplink;
pub mod video_priority;
pub mod zero_rtt;

use anyhow::Context;

pub use common::Options;

/// `quichub-lab`: run an experiment (or the link emulator).
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Experiment to run.
    #[command(subcommand)]
    pub experiment: Experiment,
    /// What every experiment takes.
    #[command(flatten)]
    pub options: Options,
}

/// The experiments take the options alone (which experiment was asked for
/// is the caller's business), so a parsed command line passes as they are.
impl std::ops::Deref for LabArgs {
    type Target = Options;

    fn deref(&self) -> &Options {
        &self.options
    }
}

/// Experiments.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Experiment {
    /// IMU sensors over QUIC (one stream, per-sensor streams, weighted
    /// priority) and TCP, on a clean and a constrained link; after A.
    /// Sengupta, "Streaming over QUIC: Applications in Media and IoT", 2025.
    Imu(imu::ImuArgs),
    /// Mobile augmented reality offloading (an image request at 30 Hz, a
    /// small reply) over UDP, TCP, RTP, MPEG-TS, QUIC streams and QUIC
    /// datagrams, on 5G, LTE, Wi-Fi and a lossy link; after J. Cao, X. Su,
    /// B. Finley, P. Zhou, P. Hui, "Evaluating Transport Protocols on 5G for
    /// Mobile Augmented Reality".
    Mar(mar::MarArgs),
    /// Time from client start to the first MQTT PUBLISH at the broker: TCP,
    /// TLS, QUIC cold, QUIC resumed and QUIC 0-RTT, and HTTP/3, on fixed-RTT
    /// links; extends the time-to-broker measurement of "A Pure HTTP/3
    /// Alternative to MQTT-over-QUIC in Resource-Constrained IoT" (the Drift
    /// paper) to 0-RTT, which that paper set aside.
    ZeroRtt(zero_rtt::ZeroRttArgs),
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

/// Runs `quichub-lab`; the exit code is 0 when every run succeeded.
pub fn main(args: LabArgs) -> anyhow::Result<i32> {
    match &args.experiment {
        Experiment::Netem(n) => quichub_netem::main(n.clone()),
        Experiment::Imu(imu) => {
            let (dir, ok) = imu::run(&args, imu)?;
            eprintln!("results in {}", dir.display());
            Ok(if ok { 0 } else { 1 })
        }
        Experiment::Mar(mar) => {
            let (dir, ok) = mar::run(&args, mar)?;
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

/// [`LabArgs`] as a command line of its own, for the tests' parsing.
#[cfg(test)]
#[derive(clap::Parser)]
pub(crate) struct TestCli {
    #[command(flatten)]
    pub(crate) lab: LabArgs,
}

#[cfg(test)]
mod tests {
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
}
