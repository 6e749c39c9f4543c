//! `quichub`: the one binary. Subcommands: `relay`, `pub`, `sub`, `demo`,
//! `interop-client`. Logic lives in the crates; this file parses arguments.

mod bench_cmd;
mod demo;
mod fanout_bench;
mod file_config;
mod framing;
mod interop;
mod mqtt_bench;
mod pubsub;
mod relay_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "quichub",
    version,
    about = "MoQT relay and toolkit for media and IoT over QUIC"
)]
struct Cli {
    /// Runtime worker threads (default: the CPUs this process may run on;
    /// 1 runs everything on one thread, best for a relay pinned to one core).
    #[arg(long, global = true, env = "QUICHUB_THREADS")]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the MoQT relay (raw QUIC and WebTransport on one UDP port).
    Relay(relay_cmd::RelayArgs),
    /// Publish a synthetic track (audio, video, imu) or stdin.
    Pub(pubsub::PubArgs),
    /// Subscribe to a track: payloads to stdout, or live stats.
    Sub(pubsub::SubArgs),
    /// An embedded relay, a publisher of audio, video and IMU tracks, and subscribers.
    Demo(demo::DemoArgs),
    /// The moq-interop-runner test client (TAP 14 output).
    InteropClient(interop::InteropArgs),
    /// draft-evens-moq-bench: profiles, START/DATA/COMPLETION, Tables 2 and 3, capacity search.
    Bench(bench_cmd::BenchArgs),
    /// Packet-level link emulator between two network namespaces (needs root or a user namespace).
    Netem(quichub_netem::NetemArgs),
    /// Experiments that reproduce the seeds' studies, with reports and plots.
    Lab(quichub_lab::LabArgs),
    /// Relay fan-out benchmark: one publisher, N subscribers, relay CPU per object.
    BenchFanout(fanout_bench::BenchFanoutArgs),
    /// MQTT load generator: N publishers, M subscribers over TCP; msgs/s, latency, loss.
    BenchMqtt(mqtt_bench::BenchMqttArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,web_transport_quinn=error")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    // The emulator and the lab run their own threads and runtimes (network
    // namespaces are per thread), outside ours.
    let command = match cli.command {
        Command::Netem(a) => return exit(quichub_netem::main(a)),
        Command::Lab(a) => return exit(quichub_lab::main(a)),
        other => other,
    };
    let rt = match cli.threads {
        Some(1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n.max(1))
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    }
    .expect("tokio runtime");
    let result = rt.block_on(async move {
        match command {
            Command::Relay(a) => relay_cmd::run(a).await.map(|_| 0),
            Command::Pub(a) => pubsub::run_pub(a).await.map(|_| 0),
            Command::Sub(a) => pubsub::run_sub(a).await.map(|_| 0),
            Command::Demo(a) => demo::run(a).await.map(|_| 0),
            Command::InteropClient(a) => interop::run(a).await,
            Command::Bench(a) => bench_cmd::run(a).await,
            Command::BenchFanout(a) => fanout_bench::run(a).await.map(|_| 0),
            Command::BenchMqtt(a) => mqtt_bench::run(a).await.map(|_| 0),
            Command::Netem(_) | Command::Lab(_) => unreachable!("handled above"),
        }
    });
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Exit code of a blocking subcommand.
fn exit(r: anyhow::Result<i32>) -> std::process::ExitCode {
    match r {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Parses a hex SHA-256 fingerprint option into a verifier.
pub(crate) fn verify_from(fingerprint: Option<&str>) -> anyhow::Result<quichub_client::Verify> {
    Ok(match fingerprint {
        Some(f) => quichub_client::Verify::Fingerprints(vec![quichub_net::tls::unhex(f)
            .filter(|b| b.len() == 32)
            .ok_or_else(|| anyhow::anyhow!("--fingerprint must be 64 hex digits"))?]),
        None => quichub_client::Verify::Insecure,
    })
}
