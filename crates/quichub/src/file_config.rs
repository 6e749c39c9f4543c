//! The relay's `--config` TOML file: the relay core's limits as top-level keys
//! (as before sections existed, so older files keep working) and one section
//! per subsystem (`[quic]`, `[tcp]`, `[mqtt]`, `[store]`, ...). Unknown keys are
//! refused in every part.

use anyhow::Context;
use quichub_net::tcp_limits::TcpLimits;
use quichub_relay::Config;
use serde::de::DeserializeOwned;

/// Everything `--config` can set. Serialises to the file's layout (the
/// sample `contrib/relay.toml` is checked against it).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FileConfig {
    /// Top-level keys: the relay core's limits.
    #[serde(flatten)]
    pub relay: Config,
    /// `[quic]`: the QUIC transport's limits and connection admission.
    pub quic: quichub_net::QuicConfig,
    /// `[mqtt]`: the broker's limits.
    pub mqtt: quichub_gateway::BrokerConfig,
    /// `[tcp]`: the TCP listeners' connection caps and HTTP timeouts.
    pub tcp: TcpLimits,
    /// `[tls]`: client certificates on MQTT over TLS and over QUIC.
    pub tls: quichub_net::tls::ClientCertConfig,
}

impl FileConfig {
    /// Parses a config file's text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut table: toml::Table = text.parse()?;
        let quic = section(&mut table, "quic")?;
        let mqtt = section(&mut table, "mqtt")?;
        // Each section is taken out by name (`section(&mut table, "name")?`)
        // before the rest is read as the relay's flat keys (serde's `flatten`
        // cannot refuse unknown keys).
        let tcp = section(&mut table, "tcp")?;
        let tls: quichub_net::tls::ClientCertConfig = section(&mut table, "tls")?;
        tls.validate().context("[tls]")?;
        let relay = toml::Value::Table(table)
            .try_into()
            .context("top-level keys")?;
        Ok(FileConfig {
            relay,
            quic,
            mqtt,
            tcp,
            tls,
        })
    }

    /// Reads and parses `path`.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parse {}", path.display()))
    }
}

/// Removes section `name` from `table` and deserialises it (its defaults when absent).
fn section<T: DeserializeOwned + Default>(
    table: &mut toml::Table,
    name: &str,
) -> anyhow::Result<T> {
    match table.remove(name) {
        Some(v) => v.try_into().with_context(|| format!("[{name}]")),
        None => Ok(T::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_relay_keys_still_parse() {
        let c = FileConfig::parse("max_sessions = 7\n").unwrap();
        assert_eq!(c.relay.max_sessions, 7);
    }

    #[test]
    fn quic_section() {
        let c = FileConfig::parse("max_sessions = 7\n[quic]\nmax_handshakes = 3\n").unwrap();
        assert_eq!(c.relay.max_sessions, 7);
        assert_eq!(c.quic.max_handshakes, 3);
        assert!(FileConfig::parse("[quic]\nbogus = 1\n").is_err());
        let c = FileConfig::parse("[mqtt]\nmax_queued = 5\n").unwrap();
        assert_eq!(c.mqtt.max_queued, 5);
        assert!(FileConfig::parse("[mqtt]\nbogus = 1\n").is_err());
    }

    /// The sample shipped for packagers and admins.
    const SAMPLE: &str = include_str!("../../../contrib/relay.toml");

    #[test]
    fn sample_config_is_the_defaults() {
        let sample = FileConfig::parse(SAMPLE).expect("contrib/relay.toml parses");
        assert_eq!(
            sample,
            FileConfig::default(),
            "contrib/relay.toml must show every key at its default"
        );
    }

    /// Every key `--config` accepts (the defaults serialised, sections
    /// included) is in the sample, and nothing else.
    #[test]
    fn sample_config_names_every_key() {
        fn keys(prefix: &str, t: &toml::Table, out: &mut Vec<String>) {
            for (k, v) in t {
                match v {
                    toml::Value::Table(section) => keys(&format!("{prefix}{k}."), section, out),
                    _ => out.push(format!("{prefix}{k}")),
                }
            }
        }
        let (mut want, mut have) = (Vec::new(), Vec::new());
        keys(
            "",
            &toml::Table::try_from(FileConfig::default()).unwrap(),
            &mut want,
        );
        keys("", &SAMPLE.parse().unwrap(), &mut have);
        let missing: Vec<_> = want.iter().filter(|k| !have.contains(k)).collect();
        let extra: Vec<_> = have.iter().filter(|k| !want.contains(k)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "contrib/relay.toml: missing {missing:?}, unknown {extra:?}"
        );
        assert!(want.len() > 30, "{want:?}");
        assert!(
            want.contains(&"quic.max_handshakes".to_string()),
            "{want:?}"
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(FileConfig::parse("no_such_key = 1\n").is_err());
        assert!(FileConfig::parse("[no_such_section]\nx = 1\n").is_err());
        assert!(FileConfig::parse("[tcp]\nmax_conections = 1\n").is_err());
    }

    #[test]
    fn tcp_section() {
        let c = FileConfig::parse(
            "max_sessions = 7\n[tcp]\nmax_connections_per_ip = 3\nhttp_header_timeout_ms = 300\n",
        )
        .unwrap();
        assert_eq!(c.relay.max_sessions, 7);
        assert_eq!(c.tcp.max_connections_per_ip, 3);
        assert_eq!(c.tcp.http_header_timeout_ms, 300);
        assert_eq!(
            c.tcp.http_idle_timeout_ms,
            TcpLimits::default().http_idle_timeout_ms
        );
        assert_eq!(FileConfig::parse("").unwrap().tcp, TcpLimits::default());
    }
}
