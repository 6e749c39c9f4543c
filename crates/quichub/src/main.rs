//! `quichub`: the one binary. Subcommands: `relay`, `config`, `pub`, `sub`, `demo`,
//! `interop-client`, the benchmarks, `token`, `completions`. Logic
//! lives in the crates; this file parses arguments.

mod bench_cmd;
mod conn_bench;
mod demo;
mod fanout_bench;
mod framing;
mod interop;
mod media_bench;
mod mqtt_bench;
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
    /// draft-evens-moq-bench: profiles, START/DATA/COMPLETION, Tables 2 and 3, capacity search.
    Bench(bench_cmd::BenchArgs),
    /// Relay fan-out benchmark: one publisher, N subscribers, relay CPU per object.
    BenchFanout(fanout_bench::BenchFanoutArgs),
    /// Benchmark a relay with one real video broadcast (an fMP4 or MPEG-TS
    /// file, looped in real time) to N subscribers: relay CPU per delivered
    /// Mbit, egress per core, latency.
    BenchMedia(media_bench::BenchMediaArgs),
    /// MQTT load generator: N publishers, M subscribers over TCP; msgs/s, latency, loss.
    BenchMqtt(mqtt_bench::BenchMqttArgs),
    /// What connections cost a running relay: memory per idle connection, and
    /// under a flood of handshakes that never complete.
    BenchConn(conn_bench::BenchConnArgs),
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
quichub_bench=info,quichub_hub=info,quichub_auth=info,moqt=info";

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
            Command::Bench(a) => bench_cmd::run(a).await,
            Command::BenchFanout(a) => fanout_bench::run(a).await.map(|_| 0),
            Command::BenchMedia(a) => media_bench::run(a).await.map(|_| 0),
            Command::BenchMqtt(a) => mqtt_bench::run(a).await.map(|_| 0),
            Command::BenchConn(a) => conn_bench::run(a).await.map(|_| 0),
            Command::Completions(_)
            | Command::Config(_)
            | Command::Token(_) => {
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

/// Where a command's human-readable report goes: stdout, or stderr when
/// stdout carries its JSON (`--json`), which must then be alone there.
pub(crate) fn human_out(json_on_stdout: bool) -> Box<dyn std::io::Write> {
    if json_on_stdout {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
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

/// Parses a hex SHA-256 fingerprint option into a verifier.
pub(crate) fn verify_from(fingerprint: Option<&str>) -> anyhow::Result<quichub_client::Verify> {
    Ok(match fingerprint {
        Some(f) => quichub_client::Verify::Fingerprints(vec![quichub_net::tls::unhex(f)
            .filter(|b| b.len() == 32)
            .ok_or_else(|| anyhow::anyhow!("--fingerprint must be 64 hex digits"))?]),
        None => quichub_client::Verify::Insecure,
    })
}

/// Refuses to send a token (`?jwt=` in `url`, where `--jwt` puts it) to a
/// relay whose certificate `verify` does not check, or over cleartext
/// `ws://`, unless `insecure`: whoever answers in the relay's place (a
/// spoofed address, a captive network) would get the token and could use
/// it until it expires. Without a token nothing is at stake beyond the
/// data, and an unchecked connection stays allowed as before.
pub(crate) fn refuse_unverified_token(
    url: &str,
    verify: &quichub_client::Verify,
    insecure: bool,
) -> anyhow::Result<()> {
    // A URL that does not parse fails at connect, with its own message.
    let Ok(u) = url::Url::parse(url) else {
        return Ok(());
    };
    let token = u.query_pairs().any(|(k, v)| k == "jwt" && !v.is_empty());
    if insecure || !token {
        return Ok(());
    }
    if u.scheme() == "ws" {
        anyhow::bail!(
            "not sending the token over ws://, which is not encrypted: use wss:// with \
             --fingerprint, or give --insecure to send it anyway"
        );
    }
    if matches!(verify, quichub_client::Verify::Insecure) {
        anyhow::bail!(
            "not sending the token to a relay whose certificate is not checked: give \
             --fingerprint SHA256 (the relay prints it at start as `certificate sha256 ...` \
             and keeps it in its data directory's tls/cert.sha256), or --insecure to send \
             it anyway"
        );
    }
    Ok(())
}

/// `url` with `jwt` added as its `?jwt=` query parameter (moq-dev's
/// convention; the relay reads it from the PATH setup option on raw QUIC and
/// from the CONNECT URL on WebTransport). A URL that already has a `jwt`
/// parameter and a `--jwt` too is refused rather than guessed.
pub(crate) fn with_jwt(url: &str, jwt: Option<&str>) -> anyhow::Result<String> {
    let Some(jwt) = jwt.map(str::trim).filter(|j| !j.is_empty()) else {
        return Ok(url.to_string());
    };
    let mut u = url::Url::parse(url).map_err(|e| anyhow::anyhow!("bad URL {url:?}: {e}"))?;
    if u.query_pairs().any(|(k, _)| k == "jwt") {
        anyhow::bail!("{url} already has a jwt parameter; give the token once (--jwt or ?jwt=)");
    }
    u.query_pairs_mut().append_pair("jwt", jwt);
    Ok(u.to_string())
}

/// The documentation's `quichub` command lines, as a user would paste them.
#[cfg(test)]
mod doc_commands {
    use super::*;

    /// Placeholders the docs use, with a value of the right shape.
    const PLACEHOLDERS: &[(&str, &str)] = &[
        ("$(pidof quichub)", "1"),
        ("$P", "1"),
        ("PID", "1"),
        ("PROFILE", "profiles/scenario1-audio.ini"),
        ("URL", "moqt://127.0.0.1:4443/"),
    ];

    /// Splits a shell line into words (single and double quotes, no escapes
    /// beyond what the docs use).
    fn words(line: &str) -> Vec<String> {
        let (mut out, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None, false);
        for c in line.chars() {
            match (quote, c) {
                // A comment runs to the end of the line.
                (None, '#') if !any => break,
                (None, '\'' | '"') => {
                    quote = Some(c);
                    any = true;
                }
                (Some(q), c) if c == q => quote = None,
                (None, c) if c.is_whitespace() => {
                    if any {
                        out.push(std::mem::take(&mut cur));
                        any = false;
                    }
                }
                (_, c) => {
                    cur.push(c);
                    any = true;
                }
            }
        }
        if any {
            out.push(cur);
        }
        out
    }

    /// Every `quichub` invocation in the ```sh blocks of `text`: continuation
    /// lines joined, comments, redirections and pipelines cut off, commands
    /// given as an argument (`--server '…'`) included.
    fn commands(text: &str) -> Vec<Vec<String>> {
        let mut lines = Vec::new();
        let mut in_sh = false;
        let mut acc = String::new();
        for l in text.lines() {
            if l.trim_start().starts_with("```") {
                in_sh = !in_sh && l.trim() == "```sh";
                continue;
            }
            if !in_sh {
                continue;
            }
            if let Some(body) = l.trim_end().strip_suffix('\\') {
                acc.push_str(body);
                acc.push(' ');
                continue;
            }
            acc.push_str(l);
            lines.push(std::mem::take(&mut acc));
        }
        let mut out = Vec::new();
        for line in lines {
            let mut line = line.replace("cargo run --release -- ", "quichub ");
            for (k, v) in PLACEHOLDERS {
                line = line.replace(k, v);
            }
            for part in line.split([';', '|', '&']) {
                let part = part.split(['<', '>']).next().unwrap_or("").trim();
                let w = words(part);
                if w.first().map(String::as_str) != Some("quichub") {
                    continue;
                }
                // `--server 'quichub relay …'` and `-- quichub …` are commands too.
                for (i, x) in w.iter().enumerate() {
                    if x.starts_with("quichub ") {
                        out.push(words(x));
                    }
                    if x == "--" && w.get(i + 1).map(String::as_str) == Some("quichub") {
                        out.push(w[i + 1..].to_vec());
                    }
                }
                out.push(w);
            }
        }
        out
    }

    #[test]
    fn splitting() {
        assert_eq!(
            commands("```sh\nquichub a 'b c' # note\nquichub x \\\n  y | jq .\n```\nquichub no\n"),
            vec![vec!["quichub", "a", "b c"], vec!["quichub", "x", "y"]]
        );
    }

    #[test]
    fn every_documented_command_parses() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let mut files = vec![format!("{root}/README.md")];
        for dir in ["docs", "crates/netem", "crates/moqt", "contrib"] {
            let Ok(rd) = std::fs::read_dir(format!("{root}/{dir}")) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "md") {
                    files.push(p.display().to_string());
                }
            }
        }
        let mut seen = 0;
        let mut bad = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            for cmd in commands(&text) {
                seen += 1;
                if let Err(e) = Cli::try_parse_from(&cmd) {
                    // --help and --version "fail" by printing.
                    if !matches!(
                        e.kind(),
                        clap::error::ErrorKind::DisplayHelp
                            | clap::error::ErrorKind::DisplayVersion
                    ) {
                        bad.push(format!("{f}: {}\n{e}", cmd.join(" ")));
                    }
                }
            }
        }
        assert!(seen > 30, "found only {seen} commands");
        assert!(bad.is_empty(), "{}", bad.join("\n\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_goes_into_the_query() {
        assert_eq!(
            with_jwt("moqt://h:1/x", Some("a.b.c")).unwrap(),
            "moqt://h:1/x?jwt=a.b.c"
        );
        // A token read from a file keeps no newline; odd bytes are escaped.
        assert_eq!(
            with_jwt("https://h:1/x?y=1", Some("a.b-_c\n")).unwrap(),
            "https://h:1/x?y=1&jwt=a.b-_c"
        );
        assert_eq!(
            with_jwt("moqt://h:1/", Some("a+b&c")).unwrap(),
            "moqt://h:1/?jwt=a%2Bb%26c"
        );
        assert_eq!(with_jwt("moqt://h:1/x", None).unwrap(), "moqt://h:1/x");
        assert!(with_jwt("moqt://h:1/x?jwt=a", Some("b")).is_err());
    }

    /// A token goes only to a relay whose certificate is pinned, unless
    /// `--insecure` says otherwise; without a token nothing changes.
    #[test]
    fn tokens_go_only_to_verified_relays() {
        use quichub_client::Verify;
        let pinned = verify_from(Some(&"ab".repeat(32))).unwrap();
        let unchecked = verify_from(None).unwrap();
        assert!(matches!(unchecked, Verify::Insecure));
        for url in ["moqt://h:1/?jwt=a.b.c", "https://h:1/x?y=1&jwt=a.b.c"] {
            let e = refuse_unverified_token(url, &unchecked, false).unwrap_err();
            assert!(e.to_string().contains("--fingerprint"), "{e}");
            assert!(e.to_string().contains("--insecure"), "{e}");
            refuse_unverified_token(url, &unchecked, true).unwrap();
            refuse_unverified_token(url, &pinned, false).unwrap();
        }
        // Cleartext: pinning has nothing to pin.
        let e = refuse_unverified_token("ws://h:1/?jwt=a.b.c", &pinned, false).unwrap_err();
        assert!(e.to_string().contains("ws://"), "{e}");
        refuse_unverified_token("ws://h:1/?jwt=a.b.c", &pinned, true).unwrap();
        refuse_unverified_token("wss://h:1/?jwt=a.b.c", &pinned, false).unwrap();
        // No token, or an empty one: nothing to protect.
        for url in ["moqt://h:1/x", "moqt://h:1/?jwt=", "ws://h:1/", "not a url"] {
            refuse_unverified_token(url, &unchecked, false).unwrap();
        }
    }

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
        assert!(names.len() >= 11, "{names:?}");
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
            for word in ["quichub", "relay", "bench-conn", "ack-frequency"] {
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
