//! `quichub-bench`: the benchmark programs' command line. They measure a
//! relay or broker that runs elsewhere (any draft-18 MoQT relay, any MQTT
//! broker), so they live apart from the product binary, which they never
//! need.

mod conn;
mod fanout;
mod flags;
mod lite_sub;
mod media;
mod moq_bench;
mod mqtt;

use clap::{Parser, Subcommand};

/// The command line of `quichub-bench`.
#[derive(Parser)]
#[command(
    name = "quichub-bench",
    version,
    propagate_version = true,
    about = "Benchmarks of MoQT relays and MQTT brokers (quichub's or any other)"
)]
pub struct Cli {
    /// Runtime worker threads (default: the CPUs this process may run on;
    /// 1 runs everything on one thread).
    #[arg(long, global = true, env = "QUICHUB_THREADS")]
    threads: Option<usize>,
    /// Log lines on stderr: `text` (colours only on a terminal) or `json`
    /// (one object per line). Levels: `RUST_LOG` (default: info for quichub,
    /// warn for libraries).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "QUICHUB_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// draft-evens-moq-bench: profiles, START/DATA/COMPLETION, Tables 2 and 3, capacity search.
    #[command(flatten)]
    MoqBench(moq_bench::BenchCmd),
    /// Relay fan-out benchmark: one publisher, N subscribers, relay CPU per object.
    Fanout(fanout::BenchFanoutArgs),
    /// Benchmark a relay with one real video broadcast (an fMP4 or MPEG-TS
    /// file, looped in real time) to N subscribers: relay CPU per delivered
    /// Mbit, egress per core, latency.
    Media(media::BenchMediaArgs),
    /// MQTT load generator: N publishers, M subscribers over TCP; msgs/s, latency, loss.
    Mqtt(mqtt::BenchMqttArgs),
    /// What connections cost a running relay: memory per idle connection, and
    /// under a flood of handshakes that never complete.
    Conn(conn::BenchConnArgs),
}

/// Format of the log lines on stderr.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Log levels when `RUST_LOG` is not set: info for this project's crates,
/// warn for its dependencies.
const DEFAULT_LOG_FILTER: &str = "warn,web_transport_quinn=error,quichub=info,\
quichub_relay=info,quichub_net=info,quichub_client=info,quichub_gateway=info,quichub_mqtt=info,\
quichub_bench=info,quichub_netem=info,quichub_lab=info,quichub_hub=info,quichub_auth=info,moqt=info";

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

impl Cli {
    /// Runs the command (logging set up, a runtime of `--threads`) and
    /// returns the process's exit code: 1 for an error, printed on stderr.
    pub fn run(self) -> std::process::ExitCode {
        // Killed quietly when the reader of stdout goes away (`... | head`),
        // as `cat` is: these commands serve nothing and run no children.
        // SAFETY: no other thread runs yet; SIG_DFL is a valid disposition.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
        init_logging(self.log_format);
        let rt = match self.threads {
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
            match self.command {
                Command::MoqBench(c) => moq_bench::run(c).await,
                Command::Fanout(a) => fanout::run(a).await.map(|_| 0),
                Command::Media(a) => media::run(a).await.map(|_| 0),
                Command::Mqtt(a) => mqtt::run(a).await.map(|_| 0),
                Command::Conn(a) => conn::run(a).await.map(|_| 0),
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
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `--version` works on every subcommand, not only on `quichub-bench`.
    #[test]
    fn every_subcommand_has_version() {
        let mut cli = Cli::command();
        cli.build();
        let names: Vec<String> = cli
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .filter(|name| name != "help")
            .collect();
        assert_eq!(
            names,
            ["pub", "sub", "run", "capacity", "fanout", "media", "mqtt", "conn"]
        );
        for name in names {
            let err = Cli::try_parse_from(["quichub-bench", &name, "--version"])
                .err()
                .unwrap_or_else(|| panic!("`quichub-bench {name} --version` parsed as a command"));
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::DisplayVersion,
                "quichub-bench {name} --version: {err}"
            );
            assert!(
                err.to_string().contains(env!("CARGO_PKG_VERSION")),
                "quichub-bench {name} --version: {err}"
            );
        }
    }
}
