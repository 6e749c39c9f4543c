//! `lab h3-vs-mqtt`: aggregates, tables, the paper's figures beside ours,
//! plots (results.json, report.md, *.svg).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use quichub_netem::profile::Profile;
use serde::Serialize;

use super::types::{CaptureTotals, ClientInfo, LinkRuns, Protocol, RunRecord, Skipped};
use crate::common::differs::{Cell, Rule};
use crate::common::stats::{show, Spread};
use crate::common::studies::DRIFT;
use crate::common::svg::{category_chart, CatSeries, COLORS};
use crate::common::Options;

/// The paper's figures (Section VI).
pub mod paper {
    /// HTTP/3 bytes on the wire over MQTT over QUIC's, per transaction
    /// (handshake included): "the average increase of bytes transmitted was
    /// found as 3.23%".
    pub const BYTES_RATIO: f64 = 1.0323;
    /// Packets: "on average, 11% more".
    pub const PACKETS_RATIO: f64 = 1.11;
    /// Memory: "H3 used approximately 10 times the memory as MQTT-over-QUIC"
    /// (heap bytes allocated, Go pprof, 10 KB messages).
    pub const MEMORY_RATIO: f64 = 10.0;
    /// Time to the first data frame: MQTT over QUIC "required one additional
    /// RTT" (its CONNECT waits for CONNACK).
    pub const EXTRA_RTTS: f64 = 1.0;
}

/// One (client, publishes per connection).
#[derive(Debug, Clone, Serialize)]
pub struct NetRow {
    /// Client label.
    pub client: String,
    /// Publishes on the connection.
    pub n: u64,
    /// Successful runs.
    pub ok: usize,
    /// Runs.
    pub runs: usize,
    /// IP bytes both ways.
    pub bytes: Option<Spread>,
    /// Packets both ways.
    pub packets: Option<Spread>,
    /// Bytes per publish, the connection's cost included (bytes / N).
    pub bytes_per_publish: Option<Spread>,
    /// Bytes per publish, the connection's cost excluded ((bytes − baseline) / N).
    pub bytes_per_publish_excl: Option<Spread>,
    /// Packets per publish, connection included.
    pub packets_per_publish: Option<Spread>,
    /// Packets per publish, connection excluded.
    pub packets_per_publish_excl: Option<Spread>,
    /// Client CPU time, ms.
    pub cpu_ms: Option<Spread>,
    /// Peak RSS, KiB.
    pub max_rss_kib: Option<Spread>,
    /// Client start → first message at the broker, ms.
    pub first_at_broker_ms: Option<Spread>,
}

/// A client's connection cost (what N = 0 costs) and per-publish device figures.
#[derive(Debug, Clone, Serialize)]
pub struct ClientRow {
    /// Client label.
    pub client: String,
    /// Protocol.
    pub protocol: Protocol,
    /// `measured` (a connection that publishes nothing) or `extrapolated`
    /// (the client cannot connect without publishing: the line through its
    /// smallest and largest N, taken at N = 0).
    pub baseline: &'static str,
    /// Bytes of the connection alone (median).
    pub connection_bytes: Option<f64>,
    /// Packets of the connection alone (median).
    pub connection_packets: Option<f64>,
    /// CPU of a run without publishes (median), ms.
    pub connection_cpu_ms: Option<f64>,
    /// Largest N.
    pub n_max: u64,
    /// (CPU at N max − baseline CPU) / N max, per repetition, ms.
    pub cpu_ms_per_publish: Option<Spread>,
    /// Peak RSS at the baseline's N (0, or the smallest), KiB.
    pub rss_kib_base: Option<Spread>,
    /// Peak RSS at N max, KiB.
    pub rss_kib_max: Option<Spread>,
    /// Client start → first message at the broker, N = 1, in link RTTs.
    pub first_at_broker_rtts: Option<Spread>,
}

/// Everything a run writes (results.json).
#[derive(Debug, Clone, Serialize)]
pub struct Output {
    /// Experiment name.
    pub experiment: &'static str,
    /// Quick mode.
    pub quick: bool,
    /// Repetitions.
    pub reps: u32,
    /// The link.
    pub link: Profile,
    /// Publishes per connection.
    pub counts: Vec<u64>,
    /// Payload bytes per publish.
    pub payload: usize,
    /// Wall time of the runs, s.
    pub wall_s: f64,
    /// The clients run.
    pub clients: Vec<ClientInfo>,
    /// The clients left out.
    pub skipped: Vec<Skipped>,
    /// Capture totals (runs add up to `attributed_*`).
    pub capture: CaptureTotals,
    /// Per (client, N).
    pub network: Vec<NetRow>,
    /// Per client.
    pub per_client: Vec<ClientRow>,
    /// Every run.
    pub runs: Vec<RunRecord>,
}

fn med(v: &[f64]) -> Option<f64> {
    Spread::of(v).map(|s| s.median)
}

impl Output {
    /// Aggregates.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        args: &Options,
        link: Profile,
        counts: Vec<u64>,
        payload: usize,
        clients: Vec<ClientInfo>,
        skipped: Vec<Skipped>,
        r: LinkRuns,
        wall_s: f64,
    ) -> Self {
        let runs = r.runs;
        let rtt_ms = link.rtt().as_secs_f64() * 1000.0;
        let ok = |c: &str, n: u64| -> Vec<&RunRecord> {
            runs.iter()
                .filter(|r| r.client == c && r.n == n && r.error.is_none())
                .collect()
        };
        let positive: Vec<u64> = counts.iter().copied().filter(|&n| n > 0).collect();
        let n_max = positive.last().copied().unwrap_or(1);
        let n_min = positive.first().copied().unwrap_or(1);
        let mut network = Vec::new();
        let mut per_client = Vec::new();
        for c in &clients {
            // This client's largest N.
            let n_max = positive
                .iter()
                .copied()
                .filter(|&n| c.runs(n))
                .max()
                .unwrap_or(n_max);
            // The connection alone: measured at N = 0, or extrapolated.
            let base = |f: &dyn Fn(&RunRecord) -> f64| -> Option<f64> {
                if c.zero && counts.contains(&0) {
                    med(&ok(&c.label, 0).iter().map(|r| f(r)).collect::<Vec<_>>())
                } else if n_max > n_min {
                    let lo = med(&ok(&c.label, n_min).iter().map(|r| f(r)).collect::<Vec<_>>())?;
                    let hi = med(&ok(&c.label, n_max).iter().map(|r| f(r)).collect::<Vec<_>>())?;
                    Some(lo - n_min as f64 * (hi - lo) / (n_max - n_min) as f64)
                } else {
                    None
                }
            };
            let measured = c.zero && counts.contains(&0);
            let b_bytes = base(&|r| r.bytes() as f64);
            let b_pkts = base(&|r| r.packets() as f64);
            let b_cpu = base(&|r| r.cpu_ms);
            for &n in &counts {
                if !c.runs(n) {
                    continue;
                }
                let all = runs
                    .iter()
                    .filter(|r| r.client == c.label && r.n == n)
                    .count();
                let v = ok(&c.label, n);
                let per = |f: &dyn Fn(&RunRecord) -> f64| -> Option<Spread> {
                    (n > 0)
                        .then(|| Spread::of(&v.iter().map(|r| f(r) / n as f64).collect::<Vec<_>>()))
                        .flatten()
                };
                let excl = |f: &dyn Fn(&RunRecord) -> f64, b: Option<f64>| -> Option<Spread> {
                    let b = b?;
                    (n > 0)
                        .then(|| {
                            Spread::of(&v.iter().map(|r| (f(r) - b) / n as f64).collect::<Vec<_>>())
                        })
                        .flatten()
                };
                let sp = |f: &dyn Fn(&RunRecord) -> f64| {
                    Spread::of(&v.iter().map(|r| f(r)).collect::<Vec<_>>())
                };
                network.push(NetRow {
                    client: c.label.clone(),
                    n,
                    ok: v.len(),
                    runs: all,
                    bytes: sp(&|r| r.bytes() as f64),
                    packets: sp(&|r| r.packets() as f64),
                    bytes_per_publish: per(&|r| r.bytes() as f64),
                    bytes_per_publish_excl: excl(&|r| r.bytes() as f64, b_bytes),
                    packets_per_publish: per(&|r| r.packets() as f64),
                    packets_per_publish_excl: excl(&|r| r.packets() as f64, b_pkts),
                    cpu_ms: sp(&|r| r.cpu_ms),
                    max_rss_kib: sp(&|r| r.max_rss_kib as f64),
                    first_at_broker_ms: Spread::of(
                        &v.iter()
                            .filter_map(|r| r.first_at_broker_ms)
                            .collect::<Vec<_>>(),
                    ),
                });
            }
            let at_max = ok(&c.label, n_max);
            let base_n = if measured { 0 } else { n_min };
            let rss = |n: u64| {
                Spread::of(
                    &ok(&c.label, n)
                        .iter()
                        .map(|r| r.max_rss_kib as f64)
                        .collect::<Vec<_>>(),
                )
            };
            per_client.push(ClientRow {
                client: c.label.clone(),
                protocol: c.protocol,
                baseline: if measured { "measured" } else { "extrapolated" },
                connection_bytes: b_bytes,
                connection_packets: b_pkts,
                connection_cpu_ms: b_cpu,
                n_max,
                cpu_ms_per_publish: b_cpu.and_then(|b| {
                    Spread::of(
                        &at_max
                            .iter()
                            .map(|r| (r.cpu_ms - b) / n_max as f64)
                            .collect::<Vec<_>>(),
                    )
                }),
                rss_kib_base: rss(base_n),
                rss_kib_max: rss(n_max),
                first_at_broker_rtts: Spread::of(
                    &ok(&c.label, n_min)
                        .iter()
                        .filter_map(|r| r.first_at_broker_ms)
                        .map(|ms| ms / rtt_ms)
                        .collect::<Vec<_>>(),
                ),
            });
        }
        Self {
            experiment: "h3-vs-mqtt",
            quick: args.quick,
            reps: args.reps,
            link,
            counts,
            payload,
            wall_s,
            clients,
            skipped,
            capture: r.totals,
            network,
            per_client,
            runs,
        }
    }

    fn net(&self, c: &str, n: u64) -> Option<&NetRow> {
        self.network.iter().find(|r| r.client == c && r.n == n)
    }

    fn client(&self, c: &str) -> Option<&ClientRow> {
        self.per_client.iter().find(|r| r.client == c)
    }

    fn n_max(&self) -> u64 {
        self.counts.last().copied().unwrap_or(1)
    }

    fn n_min(&self) -> u64 {
        self.counts.iter().copied().find(|&n| n > 0).unwrap_or(1)
    }

    /// The main table: per client, the connection's cost and per-publish
    /// network and device overhead (Markdown).
    pub fn main_table(&self) -> String {
        let (lo, hi) = (self.n_min(), self.n_max());
        let mut o = format!(
            "| client | connection alone: bytes / packets | bytes per publish, N={lo} (handshake incl.) | N={hi} incl. | N={hi} excl. | packets per publish, N={hi} excl. | CPU ms per publish | CPU ms, connection alone | peak RSS MiB, largest N | first message at broker, RTTs |\n\
             |---|---|---|---|---|---|---|---|---|---|\n"
        );
        for c in &self.per_client {
            let lo_row = self.net(&c.client, lo);
            let hi_row = self.net(&c.client, hi);
            let f = |v: Option<f64>, p: usize| v.map_or("–".into(), |v| format!("{v:.p$}"));
            let _ = writeln!(
                o,
                "| {}{}{} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.client,
                if c.baseline == "extrapolated" {
                    " ¹"
                } else {
                    ""
                },
                if c.n_max < hi { " ²" } else { "" },
                f(c.connection_bytes, 0),
                f(c.connection_packets, 1),
                lo_row.map_or("–".into(), |r| show(&r.bytes_per_publish, 0)),
                hi_row.map_or("–".into(), |r| show(&r.bytes_per_publish, 0)),
                hi_row.map_or("–".into(), |r| show(&r.bytes_per_publish_excl, 0)),
                hi_row.map_or("–".into(), |r| show(&r.packets_per_publish_excl, 2)),
                show(&c.cpu_ms_per_publish, 3),
                f(c.connection_cpu_ms, 1),
                c.rss_kib_max.map_or("–".into(), |s| format!(
                    "{:.1} [{:.1}–{:.1}]",
                    s.median / 1024.0,
                    s.min / 1024.0,
                    s.max / 1024.0
                )),
                show(&c.first_at_broker_rtts, 2),
            );
        }
        let mut notes = String::new();
        if self.per_client.iter().any(|c| c.baseline == "extrapolated") {
            notes.push_str(
                "¹ cannot connect without publishing: its connection alone is extrapolated (the line through its smallest and largest N, at N = 0).\n",
            );
        }
        for c in &self.clients {
            if let Some((m, why)) = c.max_n.filter(|(m, _)| *m < hi) {
                let _ = writeln!(
                    notes,
                    "² `{}` run up to N = {m} (its CPU per publish and largest-N figures are at N = {m}): {why}.",
                    c.label
                );
            }
        }
        if !notes.is_empty() {
            o.push('\n');
            o.push_str(&notes);
        }
        o
    }

    /// Every (client, N) (Markdown).
    fn full_table(&self) -> String {
        let mut o = String::from(
            "| client | N | ok/runs | bytes on the wire | packets | bytes/publish incl. | bytes/publish excl. | packets/publish incl. | packets/publish excl. | CPU ms | peak RSS KiB | first at broker, ms |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.network {
            let _ = writeln!(
                o,
                "| {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.client,
                r.n,
                r.ok,
                r.runs,
                show(&r.bytes, 0),
                show(&r.packets, 0),
                show(&r.bytes_per_publish, 0),
                show(&r.bytes_per_publish_excl, 0),
                show(&r.packets_per_publish, 2),
                show(&r.packets_per_publish_excl, 2),
                show(&r.cpu_ms, 1),
                show(&r.max_rss_kib, 0),
                show(&r.first_at_broker_ms, 0),
            );
        }
        o
    }

    /// HTTP/3 over MQTT over QUIC (single-stream): the paper's ratios, ours
    /// for a pair of clients.
    fn ratios(&self, h3: &str, mq: &str) -> Option<Ratios> {
        let n = self.n_min();
        let (a, b) = (self.net(h3, n)?, self.net(mq, n)?);
        let r =
            |x: &Option<Spread>, y: &Option<Spread>| Some(x.as_ref()?.median / y.as_ref()?.median);
        let (ca, cb) = (self.client(h3)?, self.client(mq)?);
        Some(Ratios {
            bytes: r(&a.bytes, &b.bytes),
            packets: r(&a.packets, &b.packets),
            memory: r(&a.max_rss_kib, &b.max_rss_kib),
            cpu: r(&a.cpu_ms, &b.cpu_ms),
            extra_rtts: match (&cb.first_at_broker_rtts, &ca.first_at_broker_rtts) {
                (Some(m), Some(h)) => Some(m.median - h.median),
                _ => None,
            },
            h3_base_rss_kib: ca.rss_kib_base.map(|s| s.median),
            mq_base_rss_kib: cb.rss_kib_base.map(|s| s.median),
        })
    }

    /// Pairs of clients compared as the paper compares its two.
    fn pairs(&self) -> Vec<(&'static str, &'static str, &'static str)> {
        [
            (
                "quichub's clients",
                "http3-quichub",
                "mqtt-quic-single-quichub",
            ),
            (
                "third-party clients",
                "http3-aioquic",
                "mqtt-quic-single-mqttv5",
            ),
        ]
        .into_iter()
        .filter(|(_, a, b)| self.client(a).is_some() && self.client(b).is_some())
        .collect()
    }

    fn paper_table(&self) -> (String, Vec<Cell>) {
        let n = self.n_min();
        if self.pairs().is_empty() {
            return (
                "No pair of an HTTP/3 and an MQTT-over-QUIC single-stream client ran (see `--clients`): \
                 nothing to compare with the paper.\n"
                    .into(),
                Vec::new(),
            );
        }
        let mut o = format!(
            "HTTP/3 against MQTT over QUIC (single-stream), one connection publishing {n} message(s) of {} bytes, \
             handshake included, as the paper measures a transaction (ratios of medians):\n\n\
             | figure | paper | {} |\n|---|---|{}\n",
            self.payload,
            self.pairs().iter().map(|p| format!("ours, {}", p.0)).collect::<Vec<_>>().join(" | "),
            "---|".repeat(self.pairs().len())
        );
        let mut cells = Vec::new();
        let rows: [(&str, f64, &str); 5] = [
            ("bytes on the wire, HTTP/3 ÷ MQTT over QUIC", paper::BYTES_RATIO, "×"),
            ("packets on the wire, HTTP/3 ÷ MQTT over QUIC", paper::PACKETS_RATIO, "×"),
            ("client memory, HTTP/3 ÷ MQTT over QUIC (paper: heap bytes allocated; ours: peak RSS)", paper::MEMORY_RATIO, "×"),
            ("client CPU time, HTTP/3 ÷ MQTT over QUIC (paper: CPU %, \"much higher\" for HTTP/3)", f64::NAN, "×"),
            ("first message at the broker, MQTT over QUIC − HTTP/3", paper::EXTRA_RTTS, "RTT"),
        ];
        for (i, (what, p, unit)) in rows.iter().enumerate() {
            let mut line = format!(
                "| {what} | {} |",
                if p.is_nan() {
                    "higher (no figure)".into()
                } else {
                    format!("{p} {unit}")
                }
            );
            for (name, h3, mq) in self.pairs() {
                let Some(r) = self.ratios(h3, mq) else {
                    line.push_str(" – |");
                    continue;
                };
                let ours = [r.bytes, r.packets, r.memory, r.cpu, r.extra_rtts][i];
                let _ = write!(
                    line,
                    " {} |",
                    ours.map_or("–".into(), |v| format!("{v:.2} {unit}"))
                );
                let Some(ours) = ours else { continue };
                if p.is_nan() {
                    continue;
                }
                let (explanation, hint) = explain(i, name, &r, self);
                cells.push(Cell {
                    what: format!("{what} ({name})"),
                    paper: *p,
                    ours,
                    unit: if *unit == "×" { "×" } else { "RTT" },
                    rule: Rule::Ratio,
                    explanation,
                    hint,
                });
            }
            o.push_str(&line);
            o.push('\n');
        }
        (o, cells)
    }

    fn markdown(&self) -> String {
        let mut o = String::from(
            "# lab h3-vs-mqtt — network and device overhead of HTTP/3, MQTT (over QUIC, TCP, TLS) and MoQT publishers\n\n",
        );
        let _ = writeln!(
            o,
            "Completes the comparison of {} (HTTP/3 pub/sub against MQTT over QUIC on NB-IoT: time to the broker, \
             network overhead, device overhead) with MQTT over QUIC in both of its stream modes, MQTT over TCP and \
             over TLS, and MoQT, each with quichub's own client and third-party clients. `lab zero-rtt` covers \
             0-RTT, which the paper set aside.{}\n",
            DRIFT.cite(),
            if self.quick { " **Quick (CI) mode.**" } else { "" }
        );
        let _ = writeln!(
            o,
            "## How it was measured\n\n\
             - Link: `{}`: {} ({}). Broker: quichub's gateway (`quichub relay`'s MQTT over TCP, TLS and QUIC, HTTP/3 \
             API and MoQT on one UDP port), in the emulator's server namespace; TLS 1.3 with one self-signed P-256 \
             certificate for every protocol.\n\
             - Each run: one client process, started in the client namespace, opens one connection, publishes N \
             messages of {} bytes (N in {:?}; 0 = connect and close) to its own topic and closes. MQTT at QoS 1 (the \
             broker acknowledges each message, as HTTP answers each POST); MoQT objects have no per-object \
             acknowledgement. {} repetitions, clients interleaved; figures are median [min–max].\n\
             - **Network overhead**: the emulator's capture of every IP packet both ways (IP header included, \
             dropped ones included), given to the run whose client port sent or received it, closing handshakes \
             after the process exited included. *Handshake included* = bytes ÷ N; *handshake excluded* = \
             (bytes − the connection alone) ÷ N, where *the connection alone* is the median of the same client's \
             N = 0 runs (connect, MQTT CONNECT/CONNACK or HTTP/3 SETTINGS, close).\n\
             - **Device overhead**: the client process's user + system CPU time and peak RSS (`ru_maxrss`), from \
             `wait4`; CPU per publish = (CPU at N = {} − the median CPU at N = 0) ÷ {}. Startup (a Python \
             interpreter for aioquic) is in the connection's figure, not the per-publish one.\n\
             - **Time to the broker**: client process start → the broker routing its first message (one clock: \
             broker and clients on one host), N = {}, in link RTTs; includes the process's own startup.\n\
             - Capture: {} TCP/UDP packets, {} given to runs ({} bytes of {}), {} not recorded; the emulator \
             counted {} packets. Runs took {:.0} s.\n",
            self.link.name,
            crate::common::one_line(&self.link),
            self.link.source,
            self.payload,
            self.counts,
            self.reps,
            self.n_max(),
            self.n_max(),
            self.n_min(),
            self.capture.packets,
            self.capture.attributed_packets,
            self.capture.attributed_bytes,
            self.capture.bytes,
            self.capture.missed,
            self.capture.emulator_packets,
            self.wall_s,
        );
        o.push_str("Clients:\n\n");
        for c in &self.clients {
            let _ = writeln!(o, "- `{}`: {}.", c.label, c.how);
            if let Some((m, why)) = c.max_n {
                let _ = writeln!(o, "  At most N = {m}: {why}.");
            }
        }
        for s in &self.skipped {
            let _ = writeln!(o, "- `{}`: **not run**: {}.", s.label, s.reason);
        }
        o.push_str("\n## Results\n\n");
        o.push_str(&self.main_table());
        o.push_str("\n![bytes per publish](bytes.svg)\n\n![packets per publish](packets.svg)\n\n![device overhead](device.svg)\n\n");
        o.push_str("## The paper's figures beside ours\n\n");
        let (t, cells) = self.paper_table();
        o.push_str(&t);
        o.push_str("\n![HTTP/3 over MQTT over QUIC: the paper and ours](paper.svg)\n\n");
        o.push_str(&crate::common::differs::section(&cells));
        o.push_str("## Every client and N\n\n");
        o.push_str(&self.full_table());
        let failed: Vec<&RunRecord> = self.runs.iter().filter(|r| r.error.is_some()).collect();
        if !failed.is_empty() {
            o.push_str("\n## Failed runs\n\n");
            for r in failed {
                let _ = writeln!(o, "- {}", r.one_line());
            }
        }
        o
    }

    fn bytes_chart(&self) -> String {
        let mut a = self.per_n_series(|r| r.bytes_per_publish, false);
        a.extend(self.per_n_series(|r| r.bytes_per_publish_excl, true));
        self.chart(
            "Bytes on the wire per publish",
            "bytes per publish (IP, both directions)",
            a,
        )
    }

    fn packets_chart(&self) -> String {
        let mut a = self.per_n_series(|r| r.packets_per_publish, false);
        a.extend(self.per_n_series(|r| r.packets_per_publish_excl, true));
        self.chart(
            "Packets on the wire per publish",
            "packets per publish (both directions)",
            a,
        )
    }

    fn per_n_series(&self, pick: impl Fn(&NetRow) -> Option<Spread>, excl: bool) -> Vec<CatSeries> {
        self.counts
            .iter()
            .filter(|&&n| n > 0)
            .enumerate()
            .map(|(i, &n)| CatSeries {
                label: format!(
                    "N = {n}, handshake {}",
                    if excl {
                        "excluded (hollow)"
                    } else {
                        "included"
                    }
                ),
                color: COLORS[i % COLORS.len()].to_string(),
                hollow: excl,
                values: self
                    .per_client
                    .iter()
                    .map(|c| {
                        self.net(&c.client, n)
                            .and_then(&pick)
                            .map(|s| (s.median, s.min, s.max))
                    })
                    .collect(),
            })
            .collect()
    }

    fn chart(&self, title: &str, ylabel: &str, series: Vec<CatSeries>) -> String {
        let cats: Vec<String> = self.per_client.iter().map(|c| c.client.clone()).collect();
        category_chart(
            title,
            &format!(
                "{} link; IP packets both ways from the emulator's capture, {}-byte messages, MQTT QoS 1; N publishes on one \
                 connection; {} repetitions\nmarker: median, whisker: min–max; excluded = (total − the client's N = 0 connection) ÷ N",
                self.link.name, self.payload, self.reps
            ),
            "client",
            &cats,
            ylabel,
            &series,
        )
    }

    fn device_chart(&self) -> String {
        let cats: Vec<String> = self.per_client.iter().map(|c| c.client.clone()).collect();
        let series = vec![
            CatSeries {
                label: "CPU ms per publish".into(),
                color: COLORS[0].to_string(),
                hollow: false,
                values: self
                    .per_client
                    .iter()
                    .map(|c| c.cpu_ms_per_publish.map(|s| (s.median, s.min, s.max)))
                    .collect(),
            },
            CatSeries {
                label: "CPU ms, connection alone (N = 0)".into(),
                color: COLORS[1].to_string(),
                hollow: true,
                values: self
                    .per_client
                    .iter()
                    .map(|c| c.connection_cpu_ms.map(|v| (v, v, v)))
                    .collect(),
            },
            CatSeries {
                label: format!("peak RSS MiB, N = {}", self.n_max()),
                color: COLORS[2].to_string(),
                hollow: false,
                values: self
                    .per_client
                    .iter()
                    .map(|c| {
                        c.rss_kib_max
                            .map(|s| (s.median / 1024.0, s.min / 1024.0, s.max / 1024.0))
                    })
                    .collect(),
            },
        ];
        category_chart(
            "Client device overhead",
            &format!(
                "{} link; the client process's user+system CPU and peak RSS from wait4; CPU per publish = (CPU at N = {} − median CPU at N = 0) ÷ {}; {} repetitions\n\
                 marker: median, whisker: min–max",
                self.link.name,
                self.n_max(),
                self.n_max(),
                self.reps
            ),
            "client",
            &cats,
            "ms (CPU) / MiB (RSS)",
            &series,
        )
    }

    fn paper_chart(&self) -> String {
        let cats: Vec<String> = [
            "bytes ratio",
            "packets ratio",
            "memory ratio",
            "CPU ratio",
            "extra RTTs to broker",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut series: Vec<CatSeries> = self
            .pairs()
            .iter()
            .enumerate()
            .map(|(i, (name, h3, mq))| {
                let r = self.ratios(h3, mq);
                let v = |x: Option<f64>| x.map(|v| (v, v, v));
                CatSeries {
                    label: format!("ours, {name}"),
                    color: COLORS[i % COLORS.len()].to_string(),
                    hollow: false,
                    values: match r {
                        Some(r) => vec![
                            v(r.bytes),
                            v(r.packets),
                            v(r.memory),
                            v(r.cpu),
                            v(r.extra_rtts),
                        ],
                        None => vec![None; 5],
                    },
                }
            })
            .collect();
        series.push(CatSeries {
            label: format!("{} (hollow)", DRIFT.short),
            color: "black".into(),
            hollow: true,
            values: vec![
                Some((paper::BYTES_RATIO, paper::BYTES_RATIO, paper::BYTES_RATIO)),
                Some((
                    paper::PACKETS_RATIO,
                    paper::PACKETS_RATIO,
                    paper::PACKETS_RATIO,
                )),
                Some((
                    paper::MEMORY_RATIO,
                    paper::MEMORY_RATIO,
                    paper::MEMORY_RATIO,
                )),
                None,
                Some((paper::EXTRA_RTTS, paper::EXTRA_RTTS, paper::EXTRA_RTTS)),
            ],
        });
        category_chart(
            "HTTP/3 against MQTT over QUIC (single-stream): the paper and ours",
            &format!(
                "{} link; one connection, {} message(s) of {} bytes, handshake included; ratios of medians (HTTP/3 ÷ MQTT), \
                 extra RTTs = MQTT − HTTP/3 time to the broker\nours: peak RSS and CPU time from wait4; the paper: Go heap bytes allocated",
                self.link.name,
                self.n_min(),
                self.payload
            ),
            "figure",
            &cats,
            "ratio (×) or round trips",
            &series,
        )
    }

    /// Writes results.json, report.md and the plots into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let w = |name: &str, body: String| {
            std::fs::write(dir.join(name), body).with_context(|| format!("writing {name}"))
        };
        w("results.json", serde_json::to_string_pretty(self)?)?;
        w("bytes.svg", self.bytes_chart())?;
        w("packets.svg", self.packets_chart())?;
        w("device.svg", self.device_chart())?;
        w("paper.svg", self.paper_chart())?;
        w("report.md", self.markdown())?;
        Ok(())
    }
}

/// Ours for one pair of clients.
struct Ratios {
    bytes: Option<f64>,
    packets: Option<f64>,
    memory: Option<f64>,
    cpu: Option<f64>,
    extra_rtts: Option<f64>,
    h3_base_rss_kib: Option<f64>,
    mq_base_rss_kib: Option<f64>,
}

/// What explains a differing cell (figure `i` of the paper table).
fn explain(i: usize, pair: &str, r: &Ratios, o: &Output) -> (Option<String>, Option<String>) {
    match i {
        2 if pair.starts_with("quichub") => (
            Some(
                "The paper counts Go heap bytes allocated and traces H3's excess to x509 certificate parsing in its \
                 H3 stack's TLS configuration; quichub's two clients are one binary with one TLS stack (rustls) and one \
                 certificate check (a pinned SHA-256), so that cost is the same for both, and peak RSS is the whole \
                 process's memory, mostly the binary's and runtime's."
                    .into(),
            ),
            None,
        ),
        2 => (
            Some(format!(
                "Different runtimes: aioquic runs in a Python interpreter (peak RSS {} KiB without publishing), mqttv5 is \
                 a Rust binary ({} KiB); the ratio measures the interpreter, not HTTP/3.",
                r.h3_base_rss_kib.map_or("–".into(), |v| format!("{v:.0}")),
                r.mq_base_rss_kib.map_or("–".into(), |v| format!("{v:.0}")),
            )),
            None,
        ),
        4 => {
            let waits = o
                .per_client
                .iter()
                .filter_map(|c| c.first_at_broker_rtts.map(|s| format!("{} {:.2}", c.client, s.median)))
                .collect::<Vec<_>>()
                .join(", ");
            (
                Some(format!(
                    "The paper's MQTT client waits for CONNACK before publishing (its CONNECT carried authentication); \
                     quichub's single-stream, TCP and TLS MQTT clients send PUBLISH right behind CONNECT \
                     (MQTT allows it without an Authentication Method), so they need no extra round trip (its \
                     multi-stream client waits for CONNACK before it opens a data stream). Clients that wait show it: time to the broker in RTTs \
                     per client: {waits}."
                )),
                None,
            )
        }
        _ => (
            None,
            Some(
                "untested: the handshake's share (certificates, retransmitted Initials on the 2 s RTT) against \
                 the paper's 1-10 KB messages"
                    .into(),
            ),
        ),
    }
}
