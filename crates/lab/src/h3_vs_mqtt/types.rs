//! What the experiment's run, its own publishers (`client`) and its
//! report share: the arguments, the protocols and clients, and the records
//! of runs.

use std::path::PathBuf;

use serde::Serialize;

/// Options of `quichub-lab h3-vs-mqtt`.
#[derive(clap::Args, Debug, Clone)]
pub struct H3VsMqttArgs {
    /// Link: a netem profile name (default nb-iot, the paper's Table IV;
    /// with --quick the nb-iot rates with a 100 ms RTT).
    #[arg(long)]
    pub link: Option<String>,
    /// Override the link's round-trip time, ms.
    #[arg(long)]
    pub rtt_ms: Option<u64>,
    /// Publishes per connection, comma-separated (0 = connect and close:
    /// the connection's own cost). Default 0,1,10,100 (0,1,10 with --quick).
    #[arg(long)]
    pub counts: Option<String>,
    /// Payload bytes per publish (the paper's smallest message, 1 KB).
    #[arg(long, default_value_t = 1024)]
    pub payload: usize,
    /// Only these clients (labels, comma-separated, e.g. http3-quichub,mqtt-tcp-mosquitto).
    #[arg(long)]
    pub clients: Option<String>,
    /// Internal: run quichub's own publisher for this protocol (the
    /// experiment runs it as a child process).
    #[arg(long, value_enum, hide = true)]
    pub client: Option<Protocol>,
    /// Internal (--client): the broker's address.
    #[arg(long, hide = true)]
    pub server: Option<String>,
    /// Internal (--client): messages to publish.
    #[arg(long, hide = true, default_value_t = 1)]
    pub count: u64,
    /// Internal (--client): topic.
    #[arg(long, hide = true)]
    pub topic: Option<String>,
    /// Internal (--client): the broker certificate's SHA-256 (hex).
    #[arg(long, hide = true)]
    pub fingerprint: Option<String>,
}

/// A way to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// HTTP/3 `POST /v1/t/{topic}`.
    Http3,
    /// MQTT over QUIC, every packet on one stream.
    MqttQuicSingle,
    /// MQTT over QUIC, a control stream plus one stream per PUBLISH.
    MqttQuicMulti,
    /// MQTT over TCP.
    MqttTcp,
    /// MQTT over TLS 1.3 over TCP.
    MqttTls,
    /// MoQT: objects of one track, pushed with PUBLISH.
    Moqt,
}

impl Protocol {
    /// Label in tables.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Http3 => "http3",
            Protocol::MqttQuicSingle => "mqtt-quic-single",
            Protocol::MqttQuicMulti => "mqtt-quic-multi",
            Protocol::MqttTcp => "mqtt-tcp",
            Protocol::MqttTls => "mqtt-tls",
            Protocol::Moqt => "moqt",
        }
    }
}

/// One publisher implementation of one protocol.
#[derive(Debug, Clone, Serialize)]
pub struct ClientInfo {
    /// `protocol-implementation`, e.g. `http3-aioquic`.
    pub label: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Implementation.
    pub implementation: &'static str,
    /// How it publishes, in words.
    pub how: String,
    /// Whether it can connect and close without publishing (N = 0).
    pub zero: bool,
    /// The most publishes per connection it is run with, and why (a client
    /// that waits for each acknowledgement before the next publish takes
    /// an RTT per message).
    pub max_n: Option<(u64, &'static str)>,
    #[serde(skip)]
    pub(super) kind: Kind,
}

/// How a client is run.
#[derive(Debug, Clone)]
pub(super) enum Kind {
    Own(PathBuf),
    OwnMoqt(PathBuf),
    Aioquic(PathBuf),
    Mqttv5 { bin: PathBuf, per_publish: bool },
    Probe(PathBuf),
    Mosquitto { tls: bool },
}

impl ClientInfo {
    /// Whether this client is run with `n` publishes per connection.
    pub fn runs(&self, n: u64) -> bool {
        (n > 0 || self.zero) && self.max_n.is_none_or(|(m, _)| n <= m)
    }
}

/// A client left out, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Client label.
    pub label: String,
    /// Why.
    pub reason: String,
}

/// One connection of one client publishing `n` messages.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Client label.
    pub client: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Publishes on the connection.
    pub n: u64,
    /// Repetition.
    pub rep: u32,
    /// Why the run failed (non-zero exit, timeout, missing messages).
    pub error: Option<String>,
    /// Messages of this run the broker routed: N, or more where the client
    /// sent a QoS 1 PUBLISH again (DUP) before its PUBACK came (the bytes
    /// include the copies).
    pub delivered: u64,
    /// Child start → first message routed by the broker, ms.
    pub first_at_broker_ms: Option<f64>,
    /// Child start → exit, ms.
    pub wall_ms: f64,
    /// User + system CPU time of the child (and its waited-for children), ms.
    pub cpu_ms: f64,
    /// User CPU, ms.
    pub user_ms: f64,
    /// System CPU, ms.
    pub sys_ms: f64,
    /// Peak resident set size of the child, KiB (`ru_maxrss`).
    pub max_rss_kib: u64,
    /// IP bytes client → broker on the wire.
    pub bytes_up: u64,
    /// IP bytes broker → client.
    pub bytes_down: u64,
    /// Packets client → broker.
    pub packets_up: u64,
    /// Packets broker → client.
    pub packets_down: u64,
    /// Packets the link dropped (counted in the figures above: they were sent).
    pub dropped: u64,
    /// The client's ports (UDP or TCP) the run used.
    pub ports: Vec<u16>,
    #[serde(skip)]
    pub(super) window: (u64, u64),
}

impl RunRecord {
    /// Bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.bytes_up + self.bytes_down
    }
    /// Packets both ways.
    pub fn packets(&self) -> u64 {
        self.packets_up + self.packets_down
    }

    /// A progress line.
    pub fn one_line(&self) -> String {
        let mut s = format!(
            "{:<26} n={:<3} rep {}: {} B / {} pkts on the wire, {}/{} at the broker, CPU {:.0} ms, RSS {} KiB, {:.1} s",
            self.client,
            self.n,
            self.rep,
            self.bytes(),
            self.packets(),
            self.delivered,
            self.n,
            self.cpu_ms,
            self.max_rss_kib,
            self.wall_ms / 1000.0
        );
        if let Some(e) = &self.error {
            s.push_str(&format!(" FAILED: {e}"));
        }
        s
    }
}

/// Counts of the whole capture, to check that the runs add up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CaptureTotals {
    /// Packets captured (TCP and UDP).
    pub packets: u64,
    /// Their IP bytes.
    pub bytes: u64,
    /// Packets attributed to a run.
    pub attributed_packets: u64,
    /// Bytes attributed to a run.
    pub attributed_bytes: u64,
    /// Packets not recorded (capture full).
    pub missed: u64,
    /// Packets the emulator forwarded or dropped, both directions (its counters).
    pub emulator_packets: u64,
}

/// Everything one link's runs produced.
pub struct LinkRuns {
    /// The runs.
    pub runs: Vec<RunRecord>,
    /// Capture totals.
    pub totals: CaptureTotals,
}
