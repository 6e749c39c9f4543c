//! `quichub`: the one binary. Subcommands: `relay`, `config`, `pub`, `sub`, `demo`,
//! `interop-client`, `token`, `completions`. Logic lives in the crates; this
//! file parses arguments. The benchmarks are `quichub-bench` (crates/bench).

mod demo;
mod framing;
mod interop;
#[cfg(test)]
mod packaging;
mod pubsub;
mod relay_cmd;
mod token_cmd;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "quichub",
    version,
    propagate_version = true,
    about = "MoQT relay and toolkit for media and IoT over QUIC"
)]
struct Cli {
    /// Runtime worker threads (default: the CPUs this process may run on;
    /// 1 runs everything on one thread, best for a relay pinned to one core).
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

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the MoQT relay (raw QUIC and WebTransport on one UDP port; MoQT over
    /// WebSocket on the HTTP port).
    Relay(relay_cmd::RelayArgs),
    /// Check a configuration file, or print the effective configuration.
    Config(relay_cmd::ConfigArgs),
    /// Publish a synthetic track (audio, video, imu) or stdin.
    Pub(pubsub::PubArgs),
    /// Subscribe to a track: payloads to stdout, or live stats.
    Sub(pubsub::SubArgs),
    /// An embedded relay, a publisher of audio, video and IMU tracks, and subscribers.
    Demo(demo::DemoArgs),
    /// The moq-interop-runner test client (TAP 14 output).
    InteropClient(interop::InteropArgs),
    /// Make JWT keys, sign and verify tokens (moq-token compatible).
    Token(token_cmd::TokenArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    ///
    /// E.g. `quichub completions bash > /usr/share/bash-completion/completions/quichub`.
    Completions(CompletionsArgs),
}

/// `quichub completions`.
#[derive(clap::Args)]
struct CompletionsArgs {
    /// The shell the script is for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Writes the completion script for `shell` to `out`.
fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut Cli::command(), "quichub", out);
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
quichub_hub=info,quichub_auth=info,moqt=info";

fn init_logging(format: LogFormat, command: &Command) {
    use std::io::IsTerminal;
    // The demo's relay is embedded: its connection lines would bury the
    // command's own output.
    let default = match command {
        Command::Demo(_) => format!("{DEFAULT_LOG_FILTER},quichub_relay=warn"),
        _ => DEFAULT_LOG_FILTER.to_string(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// Whether a subcommand gets the default SIGPIPE action: killed quietly when
/// the reader of its stdout goes away (`quichub sub ... | head`), as `cat`
/// is. The relay (a server: TCP listeners, files) and the commands that run
/// child processes keep Rust's default (SIGPIPE ignored, EPIPE an error).
/// The demo's embedded relay speaks QUIC only (UDP: no SIGPIPE).
fn quiet_on_closed_stdout(c: &Command) -> bool {
    !matches!(c, Command::Relay(_))
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if quiet_on_closed_stdout(&cli.command) {
        // SAFETY: no other thread runs yet; SIG_DFL is a valid disposition.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    init_logging(cli.log_format, &cli.command);
    let command = match cli.command {
        Command::Completions(a) => {
            completions(a.shell, &mut std::io::stdout());
            return std::process::ExitCode::SUCCESS;
        }
        Command::Token(a) => return exit(token_cmd::run(a)),
        Command::Config(a) => return exit(relay_cmd::config(a, &mut std::io::stdout()).map(|_| 0)),
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
            Command::Completions(_) | Command::Config(_) | Command::Token(_) => {
                unreachable!("handled above")
            }
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

/// `--draft`: the MoQT draft to speak to the relay. 18 is native; 14 and 16
/// go through the translating bridge (`quichub_net::legacy`).
pub(crate) fn parse_draft(s: &str) -> Result<Draft, String> {
    match s.trim_start_matches("draft-") {
        "18" => Ok(Draft(None)),
        "16" => Ok(Draft(Some(moqt::legacy::Draft::D16))),
        "14" => Ok(Draft(Some(moqt::legacy::Draft::D14))),
        other => Err(format!("draft {other} is not served (14, 16 or 18)")),
    }
}

/// A parsed `--draft` (`None`: draft 18).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Draft(pub Option<moqt::legacy::Draft>);

// One rule for every command that sends a token, the benchmarks' too.
pub(crate) use quichub_client::{refuse_unverified_token, verify_from, with_jwt};

/// The documentation's `quichub` command lines, as a user would paste them
/// (found by `quichub_testkit::docs`), parse with the real parser.
#[cfg(test)]
mod doc_commands {
    use super::*;
    use quichub_testkit::docs;

    #[test]
    fn every_documented_command_parses() {
        let commands = docs::documented_commands("quichub");
        let mut bad = Vec::new();
        for (page, cmd) in &commands {
            if let Err(e) = Cli::try_parse_from(cmd) {
                // --help and --version "fail" by printing.
                if !matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) {
                    bad.push(format!("{}: {}\n{e}", page.display(), cmd.join(" ")));
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n\n"));
        // The search still reaches the pages: the README's tour and docs/
        // (its subfolders too: `quichub_testkit::docs`'s own tests).
        let root = docs::workspace_root();
        let on = |page: &str| {
            let page = root.join(page);
            commands
                .iter()
                .filter(|(p, _)| p.starts_with(&page))
                .count()
        };
        assert!(
            on("README.md") >= 8,
            "only {} in README.md",
            on("README.md")
        );
        assert!(on("docs") > 30, "only {} commands under docs/", on("docs"));
        assert!(
            commands.len() > 50,
            "found only {} commands",
            commands.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pub` and `sub` with `--jwt` and no `--fingerprint` stop before
    /// connecting, naming both ways out.
    #[tokio::test]
    async fn pub_and_sub_refuse_a_token_for_an_unchecked_relay() {
        // Nothing listens there: getting past the check would time out or
        // fail to connect, with another message.
        let url = "moqt://127.0.0.1:9/";
        let cli = |args: &[&str]| {
            let mut all = vec!["quichub"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).unwrap()
        };
        for args in [
            &["pub", url, "--jwt", "a.b.c", "--count", "1"][..],
            &["sub", url, "--jwt", "a.b.c", "--count", "1"][..],
            &["sub", "moqt://127.0.0.1:9/?jwt=a.b.c", "--count", "1"][..],
        ] {
            let e = match cli(args).command {
                Command::Pub(a) => pubsub::run_pub(a).await,
                Command::Sub(a) => pubsub::run_sub(a).await,
                _ => unreachable!("pub or sub"),
            }
            .unwrap_err();
            assert!(
                e.to_string().contains("not sending the token"),
                "{args:?}: {e}"
            );
        }
    }

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `--version` works on every subcommand, not only on `quichub`.
    #[test]
    fn every_subcommand_has_version() {
        let mut cli = Cli::command();
        cli.build();
        let names: Vec<String> = cli
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .filter(|name| name != "help")
            .collect();
        assert!(names.len() >= 8, "{names:?}");
        for name in names {
            let err = Cli::try_parse_from(["quichub", &name, "--version"])
                .err()
                .unwrap_or_else(|| panic!("`quichub {name} --version` parsed as a command"));
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::DisplayVersion,
                "quichub {name} --version: {err}"
            );
            assert!(
                err.to_string().contains(env!("CARGO_PKG_VERSION")),
                "quichub {name} --version: {err}"
            );
        }
    }

    #[test]
    fn completions_for_every_shell() {
        use clap::ValueEnum;
        for shell in clap_complete::Shell::value_variants() {
            let mut script = Vec::new();
            completions(*shell, &mut script);
            let script = String::from_utf8(script).unwrap();
            for word in ["quichub", "relay", "interop-client", "ack-frequency"] {
                assert!(script.contains(word), "{shell}: no {word:?} in\n{script}");
            }
        }
        let args = Cli::try_parse_from(["quichub", "completions", "zsh"]).unwrap();
        assert!(matches!(
            args.command,
            Command::Completions(CompletionsArgs {
                shell: clap_complete::Shell::Zsh
            })
        ));
        assert!(Cli::try_parse_from(["quichub", "completions", "tcsh"]).is_err());
    }
}
