//! `quichub relay` and `quichub config`: flags → [`Config`] →
//! [`Hub::start`]. The wiring lives in `quichub-hub`.

use std::io::Write;
use std::path::PathBuf;

use quichub_hub::{Config, Hub};

/// Relay options. Each sets one configuration key (docs/configuration.md)
/// and wins over `--config`'s file; a flag not given leaves the file's
/// value, or the default shown.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RelayArgs {
    /// UDP address for QUIC (raw `moqt-18` and WebTransport `h3`): `IP:PORT`
    /// or `HOST:PORT` (a name binds its first IPv4 address, else its first:
    /// the one quichub's clients dial). Default 127.0.0.1:4443. Key `quic.bind`.
    #[arg(long, value_parser = addr_arg)]
    pub bind: Option<String>,
    /// PEM certificate chain (default: a self-signed ECDSA P-256 certificate
    /// made at start). Re-read on SIGHUP. Key `tls.cert`.
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key. Key `tls.key`.
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
    /// Prometheus metrics address (`off` to disable). Default 127.0.0.1:9090.
    /// Key `metrics.address`.
    #[arg(long)]
    pub metrics: Option<String>,
    /// TOML configuration file (docs/configuration.md; `contrib/relay.toml`
    /// shows every key).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// TCP address of the MQTT 3.1.1/5 broker (`off` turns the broker off:
    /// no MQTT over TCP, TLS or QUIC, and no broker state on disk). Default
    /// 127.0.0.1:1883. Key `mqtt.tcp`.
    #[arg(long)]
    pub mqtt: Option<String>,
    /// TCP address of MQTT over TLS, with the relay's certificate (`off` to
    /// disable). Default 127.0.0.1:8883. Key `mqtt.tls`.
    #[arg(long)]
    pub mqtt_tls: Option<String>,
    /// Directory of the broker's durable state (retained messages, persistent
    /// sessions and their queued messages) and, without `--cert/--key`, of the
    /// self-signed certificate (`tls/cert.pem`, `tls/cert.sha256`: kept across
    /// restarts, renewed 3 days before it expires); `off` keeps both in memory
    /// only.
    /// Default: `$XDG_STATE_HOME/quichub`, else `~/.local/state/quichub`.
    /// Not opened with `--mqtt off`. Key `store.data_dir`.
    #[arg(long)]
    pub data_dir: Option<String>,
    /// When the broker's log reaches the disk before a QoS 1/2 publish is
    /// acknowledged: `always` (the default; fdatasync, group commit: survives
    /// power loss) or `never` (written to the OS: survives a crash of the
    /// process). Key `store.fsync`.
    #[arg(long, value_parser = ["always", "never"])]
    pub fsync: Option<String>,
    /// What to do when the broker's log is corrupt (an incomplete last
    /// record, the trace of a crash, is always dropped): `salvage` (the
    /// default) skips the damaged bytes, logging each range, keeps the file
    /// aside as `broker.log.corrupt-<time>` and starts; `strict` refuses to
    /// start. Key `store.recovery`.
    #[arg(long, value_parser = ["strict", "salvage"])]
    pub store_recovery: Option<String>,
    /// TCP address of the HTTP pub/sub API over HTTP/1.1 and cleartext
    /// HTTP/2 (`off` to disable); see docs/http-api.md. Default
    /// 127.0.0.1:8080. Key `http.address`.
    #[arg(long)]
    pub http: Option<String>,
    /// TCP address of the same over TLS with the relay's certificate
    /// (HTTPS and HTTP/2; the pages, and `wss://` for MoQT over WebSocket),
    /// `off` (the default) to disable. Key `http.tls`.
    #[arg(long)]
    pub https: Option<String>,
    /// The same HTTP API over HTTP/3 on the relay's UDP port (ALPN `h3`,
    /// beside WebTransport, with 0-RTT): `on` (the default) or `off`. Key
    /// `quic.http3`.
    #[arg(long, value_parser = ["on", "off"])]
    pub http3: Option<String>,
    /// What QUIC peers are asked about acknowledgements (the ACK frequency
    /// extension): `PACKETS,MILLISECONDS` (acknowledge after more than PACKETS
    /// packets or after MILLISECONDS, and at once on a gap), or `off` for
    /// QUIC's default of every other packet. Fewer ACKs from subscribers cost
    /// the relay less CPU per object; a longer delay slows the detection of a
    /// lost last packet on streams. Peers without the extension ignore it.
    /// Default 9,100. Key `quic.ack_frequency`.
    #[arg(long)]
    pub ack_frequency: Option<String>,
    /// QUIC endpoints serving the UDP port, each on a thread of its own
    /// (sockets of one `SO_REUSEPORT` group; packets reach a connection's
    /// endpoint by its connection ID, so migration keeps working). Default
    /// 0: one per CPU this process may run on; 1 runs the one endpoint on
    /// the `--threads` runtime. Key `quic.endpoints`.
    #[arg(long, value_name = "N")]
    pub endpoints: Option<usize>,
    /// JWT verification key for tokens without a `kid` (and for its own
    /// `kid`): a JWK file as `quichub token generate-key` writes it, a PEM
    /// public key, or a raw HMAC secret in a file named `*.secret`
    /// (docs/auth.md). Re-read on SIGHUP. Key `auth.key`.
    #[arg(long, value_name = "FILE")]
    pub auth_key: Option<PathBuf>,
    /// Directory of JWT verification keys, one file per `kid` (the file name
    /// without extension). Key `auth.key_dir`.
    #[arg(long, value_name = "DIR")]
    pub auth_key_dir: Option<PathBuf>,
    /// JWKS file (`{"keys": [...]}`), keys chosen by `kid`. Key `auth.jwks`.
    #[arg(long, value_name = "FILE")]
    pub jwks: Option<PathBuf>,
    /// Namespace/topic prefix anyone may publish and subscribe to without
    /// credentials (path boundaries: `anon` covers `anon/x`, not `anonx`);
    /// repeatable. Replaces the file's list. Key `auth.public`.
    #[arg(long, value_name = "PREFIX")]
    pub public: Vec<String>,
    /// mosquitto `password_file` (`mosquitto_passwd` output). Key
    /// `auth.password_file`.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// mosquitto `acl_file`. Key `auth.acl_file`.
    #[arg(long, value_name = "FILE")]
    pub acl_file: Option<PathBuf>,
    /// Accept clients without credentials (`--allow-anonymous` or
    /// `--allow-anonymous true`; `false` refuses them even on loopback).
    /// Unset: only on loopback listeners while no authentication is
    /// configured; a non-loopback listener without authentication then
    /// refuses to start. Key `auth.allow_anonymous`.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub allow_anonymous: Option<bool>,
    /// Makes this relay one of a cluster whose registry is
    /// `etcd://host:port[,host:port…][/prefix]` (etcd v3) or `file:PATH` (a
    /// fixed list of relays): subscribers here get what is published on any
    /// relay of the cluster (docs/cluster.md). Key
    /// `cluster.registry`.
    #[arg(long, value_name = "URL")]
    pub cluster: Option<String>,
    /// Where the other relays of the cluster reach this one
    /// (`moqt://host:port/`). Default: `moqt://` and `--bind`, when that is a
    /// specific address. Key `cluster.node_url`.
    #[arg(long, value_name = "URL")]
    pub node_url: Option<String>,
}

/// `--bind`: checked (and a name resolved) when parsed; kept as given.
fn addr_arg(v: &str) -> Result<String, String> {
    quichub_hub::resolve_addr(v).map(|_| v.to_string())
}

impl RelayArgs {
    /// The effective configuration: `--config`'s file (or the defaults),
    /// then every flag given.
    pub fn config(&self) -> anyhow::Result<Config> {
        let mut c = match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        self.apply(&mut c);
        Ok(c)
    }

    /// Sets the key of every flag given.
    pub(crate) fn apply(&self, c: &mut Config) {
        fn set<T: Clone>(flag: &Option<T>, key: &mut T) {
            if let Some(v) = flag {
                *key = v.clone();
            }
        }
        set(&self.bind, &mut c.quic.bind);
        set(&self.ack_frequency, &mut c.quic.ack_frequency);
        set(&self.endpoints, &mut c.quic.limits.endpoints);
        if let Some(h) = &self.http3 {
            c.quic.http3 = h == "on";
        }
        set(&self.mqtt, &mut c.mqtt.tcp);
        set(&self.mqtt_tls, &mut c.mqtt.tls);
        set(&self.http, &mut c.http.address);
        set(&self.https, &mut c.http.tls);
        set(&self.metrics, &mut c.metrics.address);
        set(&self.cluster, &mut c.cluster.registry);
        set(&self.node_url, &mut c.cluster.node_url);
        if self.cert.is_some() {
            c.tls.cert = self.cert.clone();
            c.tls.key = self.key.clone();
        }
        if self.data_dir.is_some() {
            c.store.data_dir = self.data_dir.clone();
        }
        if let Some(f) = &self.fsync {
            c.store.fsync = match f.as_str() {
                "never" => quichub_hub::FsyncPolicy::Never,
                _ => quichub_hub::FsyncPolicy::Always,
            };
        }
        let auth = &mut c.auth;
        for (flag, key) in [
            (&self.auth_key, &mut auth.key),
            (&self.auth_key_dir, &mut auth.key_dir),
            (&self.jwks, &mut auth.jwks),
            (&self.password_file, &mut auth.password_file),
            (&self.acl_file, &mut auth.acl_file),
        ] {
            if flag.is_some() {
                key.clone_from(flag);
            }
        }
        if !self.public.is_empty() {
            auth.public.clone_from(&self.public);
        }
        if self.allow_anonymous.is_some() {
            auth.allow_anonymous = self.allow_anonymous;
        }
        if let Some(r) = &self.store_recovery {
            c.store.recovery = match r.as_str() {
                "strict" => quichub_hub::RecoveryPolicy::Strict,
                _ => quichub_hub::RecoveryPolicy::Salvage,
            };
        }
    }
}

/// Prints where the hub listens.
fn print_listening(hub: &Hub, out: &mut dyn Write) -> std::io::Result<()> {
    let addr = hub.addr();
    writeln!(
        out,
        "quichub relay listening on udp {addr} (raw QUIC moqt-18, WebTransport h3)"
    )?;
    let shards = hub.server().shards();
    if shards > 1 {
        writeln!(
            out,
            "quic endpoints {shards} on udp {addr} (a thread each; --endpoints)"
        )?;
    }
    writeln!(out, "certificate sha256 {}", hub.fingerprint())?;
    if let Some(s) = hub.self_signed() {
        writeln!(
            out,
            "certificate {} (self-signed, {}; renewed after {})",
            s.path.display(),
            if s.reused {
                "kept from an earlier run"
            } else {
                "made now"
            },
            s.renew_after.date()
        )?;
    }
    if let Some(m) = hub.mqtt_addr() {
        writeln!(out, "mqtt tcp {m} (MQTT 3.1.1 and 5.0)")?;
    }
    if let Some(m) = hub.mqtt_tls_addr() {
        writeln!(out, "mqtt tls {m}")?;
    }
    if hub.mqtt_quic() {
        writeln!(out, "mqtt quic udp {addr} (ALPN mqtt)")?;
    }
    if let Some(h) = hub.http_addr() {
        writeln!(out, "http tcp {h} (HTTP/1.1, HTTP/2 cleartext)")?;
        writeln!(
            out,
            "web dashboard http://{h}/ player http://{h}/watch/BROADCAST"
        )?;
        if hub.config().http.websocket {
            writeln!(out, "moqt over websocket ws://{h}/ (qmux-01.moqt-18)")?;
        }
    }
    if let Some(h) = hub.https_addr() {
        writeln!(out, "https tcp {h} (HTTP/1.1, HTTP/2 over TLS)")?;
        if hub.config().http.websocket {
            writeln!(out, "moqt over websocket wss://{h}/ (qmux-01.moqt-18)")?;
        }
    }
    if hub.http3() {
        writeln!(out, "http3 udp {addr} (ALPN h3, beside WebTransport)")?;
    }
    if let Some(m) = hub.metrics_addr() {
        writeln!(out, "metrics http://{m}/metrics")?;
    }
    out.flush()
}

/// Runs until SIGTERM or Ctrl-C, then drains with GOAWAY; SIGHUP reloads.
pub async fn run(args: RelayArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let hub = Hub::start(args.config()?).await?;
    print_listening(&hub, &mut std::io::stdout().lock())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            // Flags keep winning over the file re-read.
            _ = hup.recv() => match hub.reload_with(&|c| args.apply(c)) {
                Ok(()) => tracing::info!("reloaded (SIGHUP)"),
                Err(e) => tracing::error!("reload (SIGHUP): {e:#}"),
            },
        }
    }
    eprintln!(
        "shutting down: GOAWAY sent to {} sessions",
        hub.relay().session_count()
    );
    hub.shutdown().await;
    Ok(())
}

/// `quichub config`.
#[derive(clap::Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(clap::Subcommand, Debug)]
enum ConfigCommand {
    /// Validate a configuration file: exit 1 with the error (file:line:column).
    Check {
        /// The TOML file.
        file: PathBuf,
    },
    /// Print the effective configuration as TOML: `--config`'s file (or the
    /// defaults) with the relay flags given applied over it.
    Print(Box<RelayArgs>),
}

/// Runs `quichub config`.
pub fn config(a: ConfigArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    match a.command {
        ConfigCommand::Check { file } => {
            Config::load(&file)?.validate()?;
            writeln!(out, "{}: ok", file.display())?;
        }
        ConfigCommand::Print(r) => {
            let c = r.config()?;
            c.validate()?;
            write!(out, "{}", c.to_toml())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        relay: RelayArgs,
    }

    fn parse(args: &[&str]) -> Result<RelayArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("quichub").chain(args.iter().copied())).map(|c| c.relay)
    }

    #[test]
    fn bind_accepts_host_names() {
        let r = parse(&["--bind", "localhost:4443"]).unwrap();
        assert_eq!(r.bind.as_deref(), Some("localhost:4443"));
        assert!(parse(&["--bind", "localhost"]).is_err());
    }

    #[test]
    fn store_recovery_flag() {
        let recovery = |args: &[&str]| parse(args).map(|r| r.config().unwrap().store.recovery);
        assert_eq!(recovery(&[]).unwrap(), quichub_hub::RecoveryPolicy::Salvage);
        assert_eq!(
            recovery(&["--store-recovery", "strict"]).unwrap(),
            quichub_hub::RecoveryPolicy::Strict
        );
        assert!(recovery(&["--store-recovery", "lenient"]).is_err());
    }

    /// Flags given win over the file; flags not given leave it alone.
    #[test]
    fn flags_given_override_the_file() {
        let dir = std::env::temp_dir().join(format!("quichub-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("relay.toml");
        std::fs::write(
            &file,
            "[quic]\nbind = \"127.0.0.1:5000\"\nhttp3 = false\n[mqtt]\ntcp = \"off\"\n\
             [metrics]\naddress = \"127.0.0.1:9999\"\n[relay]\nmax_sessions = 5\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let c = parse(&["--config", f]).unwrap().config().unwrap();
        assert_eq!(c.quic.bind, "127.0.0.1:5000");
        assert!(!c.quic.http3);
        assert_eq!(c.mqtt.tcp, "off");
        let c = parse(&[
            "--config",
            f,
            "--bind",
            "127.0.0.1:6000",
            "--http3",
            "on",
            "--fsync",
            "never",
            "--data-dir",
            "off",
        ])
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(c.quic.bind, "127.0.0.1:6000");
        assert!(c.quic.http3);
        assert_eq!(c.mqtt.tcp, "off", "not given: the file's");
        assert_eq!(c.metrics.address, "127.0.0.1:9999");
        assert_eq!(c.relay.max_sessions, 5);
        assert_eq!(c.store.fsync, quichub_hub::FsyncPolicy::Never);
        assert_eq!(c.store.dir(), None);
        assert_eq!(c.source.as_deref(), Some(file.as_path()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every relay flag sets a key: with all of them given, the effective
    /// configuration differs from the defaults in as many keys.
    #[test]
    fn every_flag_maps_to_a_key() {
        let flags = [
            ("--bind", "127.0.0.1:1"),
            ("--metrics", "off"),
            ("--mqtt", "127.0.0.1:2"),
            ("--mqtt-tls", "off"),
            ("--data-dir", "off"),
            ("--fsync", "never"),
            ("--store-recovery", "strict"),
            ("--http", "off"),
            ("--https", "127.0.0.1:3"),
            ("--http3", "off"),
            ("--ack-frequency", "off"),
            ("--endpoints", "3"),
            ("--cert", "/c.pem"),
            ("--key", "/k.pem"),
            ("--auth-key", "/a.jwk"),
            ("--auth-key-dir", "/keys"),
            ("--jwks", "/jwks.json"),
            ("--public", "anon"),
            ("--password-file", "/passwd"),
            ("--acl-file", "/acl"),
            ("--allow-anonymous", "false"),
            ("--cluster", "etcd://127.0.0.1:2379"),
            ("--node-url", "moqt://10.0.0.1:4443/"),
        ];
        let mut args = Vec::new();
        for (f, v) in flags {
            args.extend([f, v]);
        }
        let c = parse(&args).unwrap().config().unwrap();
        let (a, d) = (
            toml::Table::try_from(&c).unwrap(),
            toml::Table::try_from(Config::default()).unwrap(),
        );
        let mut changed = 0;
        for (section, v) in &a {
            let (s, ds) = (v.as_table().unwrap(), d[section].as_table().unwrap());
            changed += s.iter().filter(|(k, v)| ds.get(*k) != Some(v)).count();
        }
        // `--config` names the file rather than setting a key.
        let relay_flags = {
            use clap::CommandFactory;
            Cli::command()
                .get_arguments()
                .filter(|a| a.get_long().is_some_and(|l| l != "config"))
                .count()
        };
        assert_eq!(relay_flags, flags.len());
        assert_eq!(changed, flags.len(), "{}", c.to_toml());
    }

    /// The auth flags: `--public` repeats and replaces the file's list,
    /// `--allow-anonymous` alone means true.
    #[test]
    fn auth_flags() {
        let auth = |args: &[&str]| parse(args).unwrap().config().unwrap().auth;
        assert_eq!(auth(&[]).allow_anonymous, None);
        assert_eq!(auth(&["--allow-anonymous"]).allow_anonymous, Some(true));
        assert_eq!(
            auth(&["--allow-anonymous", "false"]).allow_anonymous,
            Some(false)
        );
        let a = auth(&[
            "--public",
            "anon",
            "--public",
            "demo/open",
            "--auth-key",
            "k.jwk",
        ]);
        assert_eq!(a.public, ["anon", "demo/open"]);
        assert_eq!(a.key.as_deref(), Some(std::path::Path::new("k.jwk")));
        assert!(a.configured());
        // `--bind 0.0.0.0` needs authentication or `--allow-anonymous`.
        let e = parse(&["--bind", "0.0.0.0:0"])
            .unwrap()
            .config()
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("allow_anonymous"), "{e}");
        for extra in [&["--allow-anonymous"][..], &["--auth-key", "k.jwk"]] {
            let mut args = vec!["--bind", "0.0.0.0:0"];
            args.extend_from_slice(extra);
            parse(&args).unwrap().config().unwrap().validate().unwrap();
        }
    }

    #[test]
    fn config_check_and_print() {
        let dir = std::env::temp_dir().join(format!("quichub-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.toml");
        std::fs::write(
            &bad,
            "[relay]\nmax_sessions = 1\n[quic]\nmax_handshake = 2\n",
        )
        .unwrap();
        #[derive(clap::Parser)]
        struct C {
            #[command(flatten)]
            config: ConfigArgs,
        }
        let run = |args: &[&str]| {
            let a = C::try_parse_from(std::iter::once("config").chain(args.iter().copied()))
                .unwrap()
                .config;
            let mut out = Vec::new();
            config(a, &mut out).map(|_| String::from_utf8(out).unwrap())
        };
        let e = run(&["check", bad.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "{}:4:1: unknown key `max_handshake` in [quic]",
                bad.display()
            )
        );
        let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/relay.toml");
        assert!(run(&["check", sample]).unwrap().ends_with(": ok\n"));
        let printed = run(&["print", "--config", sample, "--mqtt", "off"]).unwrap();
        let c = Config::parse(&printed, "printed").unwrap();
        assert_eq!(c.mqtt.tcp, "off");
        assert_eq!(c.relay, quichub_relay::Config::default());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
