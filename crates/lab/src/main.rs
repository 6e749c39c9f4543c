//! `quichub-lab`: the studies' experiments and the link emulator, apart from
//! the product binary so that `cargo run --release -- demo` does not build
//! them. Logic lives in the library; this file parses arguments.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "quichub-lab",
    version,
    propagate_version = true,
    about = "Experiments that reproduce published QUIC studies (A. Sengupta, \"Streaming over QUIC: Applications in Media and IoT\"; J. Cao et al., \"Evaluating Transport Protocols on 5G for Mobile Augmented Reality\"), with reports and plots; and the link emulator they run on."
)]
struct Cli {
    /// Log lines on stderr: `text` (colours only on a terminal) or `json`
    /// (one object per line). Levels: `RUST_LOG` (default: info for quichub,
    /// warn for libraries).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "QUICHUB_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(flatten)]
    lab: quichub_lab::LabArgs,
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
/// warn for its dependencies; the embedded relays' connection lines would
/// bury the experiments' own output.
const DEFAULT_LOG_FILTER: &str = "warn,web_transport_quinn=error,quichub=info,\
quichub_relay=warn,quichub_net=info,quichub_client=info,quichub_gateway=info,quichub_mqtt=info,\
quichub_netem=info,quichub_lab=info,quichub_hub=info,quichub_auth=info,moqt=info";

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

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // The experiments and the emulator run their own threads and runtimes
    // (network namespaces are per thread).
    match quichub_lab::main(cli.lab) {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// Every `quichub-lab …` line of the docs parses with this binary's
    /// arguments, as the product's test does for `quichub …` lines.
    #[test]
    fn every_documented_command_parses() {
        let commands = quichub_testkit::docs::documented_commands("quichub-lab");
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
        // The lab's pages and the emulator's are still searched.
        let root = quichub_testkit::docs::workspace_root();
        let on = |page: &str| {
            let page = root.join(page);
            commands
                .iter()
                .filter(|(p, _)| p.starts_with(&page))
                .count()
        };
        assert!(
            on("docs/lab") > 20,
            "only {} under docs/lab",
            on("docs/lab")
        );
        assert!(
            on("crates/netem") > 5,
            "only {} in crates/netem",
            on("crates/netem")
        );
    }

    #[test]
    fn lab_help_cites_the_studies_not_seed_numbers() {
        let mut cmd = Cli::command();
        let top = cmd.render_help().to_string();
        let long = cmd.render_long_help().to_string();
        for help in [&top, &long] {
            assert!(!help.to_lowercase().contains("seed"), "{help}");
            let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(flat.contains("A. Sengupta"), "{help}");
            assert!(flat.contains("Mobile Augmented Reality"), "{help}");
        }
    }
}
