//! Results of the imu experiment: raw JSON, Markdown report, SVG plots.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use quichub_netem::profile::Profile;
use serde::Serialize;

use super::metrics::{SensorRun, LATENCY_BIN_S};
use super::run::{Mode, RunConfig, SENSORS};
use crate::common::one_line;
use crate::common::stats::{show, spread_of, Spread};
use crate::common::studies::SENGUPTA_2025;
use crate::common::svg::{category_chart, line_chart, CatSeries, Series, COLORS};
use crate::common::Options;

/// One run of one mode on one link.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Link profile name.
    pub link: String,
    /// Mode label.
    pub mode: &'static str,
    /// Repetition index.
    pub rep: u32,
    /// Why the run failed.
    pub error: Option<String>,
    /// Generation start, µs since the epoch.
    pub t0_us: u64,
    /// Per-sensor metrics.
    pub sensors: Vec<SensorRun>,
}

impl RunRecord {
    /// A progress line.
    pub fn one_line(&self) -> String {
        let mut s = format!("{} {:<13} rep {}: ", self.link, self.mode, self.rep);
        if let Some(e) = &self.error {
            let _ = write!(s, "FAILED: {e}");
        }
        for x in &self.sensors {
            let _ = write!(
                s,
                "{} {}/{} p50 {} ms p99 {} ms; ",
                x.sensor,
                x.received,
                x.sent,
                x.p50_ms.map(|v| format!("{v:.1}")).unwrap_or("–".into()),
                x.p99_ms.map(|v| format!("{v:.1}")).unwrap_or("–".into()),
            );
        }
        s
    }
}

/// Aggregate of one (link, mode, sensor) over repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    /// Link.
    pub link: String,
    /// Mode.
    pub mode: &'static str,
    /// Sensor.
    pub sensor: String,
    /// Successful repetitions.
    pub reps: usize,
    /// Samples generated.
    pub sent: Option<Spread>,
    /// Samples received.
    pub received: Option<Spread>,
    /// Received / generated, percent.
    pub delivered_pct: Option<Spread>,
    /// Received messages per second.
    pub rate: Option<Spread>,
    /// Latency p50, ms.
    pub p50_ms: Option<Spread>,
    /// Latency p99, ms.
    pub p99_ms: Option<Spread>,
    /// Per-second bins: median, min, max over repetitions.
    pub per_second: Vec<Spread>,
    /// Median latency per bin of generation time (ms), spread over repetitions.
    pub latency_over_time_ms: Vec<Option<Spread>>,
}

/// Everything the experiment writes to `results.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Output {
    /// Experiment name.
    pub experiment: &'static str,
    /// The study reproduced (citation).
    pub study: String,
    /// Quick (CI) mode.
    pub quick: bool,
    /// Repetitions requested.
    pub reps: u32,
    /// Run parameters.
    pub config: RunConfig,
    /// Link profiles.
    pub links: Vec<Profile>,
    /// Every run.
    pub runs: Vec<RunRecord>,
    /// Aggregates.
    pub summary: Vec<SummaryRow>,
}

impl Output {
    /// Aggregates the runs.
    pub fn new(
        args: &Options,
        config: RunConfig,
        links: Vec<Profile>,
        runs: Vec<RunRecord>,
    ) -> Self {
        let mut summary = Vec::new();
        for link in &links {
            for mode in Mode::ALL {
                for sensor in SENSORS {
                    let rs: Vec<&SensorRun> = runs
                        .iter()
                        .filter(|r| {
                            r.link == link.name && r.mode == mode.label() && r.error.is_none()
                        })
                        .flat_map(|r| r.sensors.iter().filter(|s| s.sensor == sensor))
                        .collect();
                    let bins = rs.iter().map(|s| s.per_second.len()).max().unwrap_or(0);
                    let per_second = (0..bins)
                        .filter_map(|i| {
                            spread_of(
                                rs.iter()
                                    .map(|s| s.per_second.get(i).copied().unwrap_or(0) as f64),
                            )
                        })
                        .collect();
                    summary.push(SummaryRow {
                        link: link.name.clone(),
                        mode: mode.label(),
                        sensor: sensor.to_string(),
                        reps: rs.len(),
                        sent: spread_of(rs.iter().map(|s| s.sent as f64)),
                        received: spread_of(rs.iter().map(|s| s.received as f64)),
                        delivered_pct: spread_of(
                            rs.iter()
                                .map(|s| 100.0 * s.received as f64 / s.sent.max(1) as f64),
                        ),
                        rate: spread_of(rs.iter().map(|s| s.rate)),
                        p50_ms: spread_of(rs.iter().filter_map(|s| s.p50_ms)),
                        p99_ms: spread_of(rs.iter().filter_map(|s| s.p99_ms)),
                        per_second,
                        latency_over_time_ms: (0..rs
                            .iter()
                            .map(|s| s.latency_over_time_ms.len())
                            .max()
                            .unwrap_or(0))
                            .map(|i| {
                                spread_of(rs.iter().filter_map(|s| {
                                    s.latency_over_time_ms.get(i).copied().flatten()
                                }))
                            })
                            .collect(),
                    });
                }
            }
        }
        Output {
            experiment: "imu",
            study: SENGUPTA_2025.cite(),
            quick: args.quick,
            reps: args.reps,
            config,
            links,
            runs,
            summary,
        }
    }

    fn how(&self) -> String {
        format!(
            "{} s per run (+{} s drain), {} repetitions, {} Hz × {} B per sensor",
            self.config.duration.as_secs_f64(),
            self.config.drain.as_secs_f64(),
            self.reps,
            self.config.rate_hz,
            self.config.payload
        )
    }

    /// The main table (Markdown), median [min–max] over repetitions.
    pub fn main_table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "imu: {} — median [min–max]", self.how());
        let _ = writeln!(
            o,
            "| link | mode | sensor | reps | sent | received | delivered % | msgs/s | p50 ms | p99 ms |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.summary {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.link,
                r.mode,
                r.sensor,
                r.reps,
                show(&r.sent, 0),
                show(&r.received, 0),
                show(&r.delivered_pct, 1),
                show(&r.rate, 1),
                show(&r.p50_ms, 1),
                show(&r.p99_ms, 1)
            );
        }
        o
    }

    fn rate_chart(&self, link: &Profile) -> String {
        let mut series = Vec::new();
        for (mi, mode) in Mode::ALL.iter().enumerate() {
            for (si, sensor) in SENSORS.iter().enumerate() {
                let Some(r) = self
                    .summary
                    .iter()
                    .find(|r| r.link == link.name && r.mode == mode.label() && r.sensor == *sensor)
                else {
                    continue;
                };
                series.push(Series {
                    label: format!("{} {}", mode.label(), sensor),
                    color: COLORS[mi % COLORS.len()].to_string(),
                    dashed: si == 1,
                    points: r
                        .per_second
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (i as f64 + 0.5, s.median))
                        .collect(),
                    band: r
                        .per_second
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (i as f64 + 0.5, s.min, s.max))
                        .collect(),
                });
            }
        }
        line_chart(
            &format!("IMU messages per second per sensor — link {}", link.name),
            &format!(
                "link: {}\n{}; median line, min–max band",
                one_line(link),
                self.how()
            ),
            "seconds since the sensors started (1 s bins of arrival time)",
            "messages/s",
            &series,
        )
    }

    fn latency_time_chart(&self, link: &Profile) -> String {
        let mut series = Vec::new();
        for (mi, mode) in Mode::ALL.iter().enumerate() {
            for (si, sensor) in SENSORS.iter().enumerate() {
                let Some(r) = self
                    .summary
                    .iter()
                    .find(|r| r.link == link.name && r.mode == mode.label() && r.sensor == *sensor)
                else {
                    continue;
                };
                let pts: Vec<(f64, Spread)> = r
                    .latency_over_time_ms
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| s.map(|s| ((i as f64 + 0.5) * LATENCY_BIN_S, s)))
                    .collect();
                series.push(Series {
                    label: format!("{} {}", mode.label(), sensor),
                    color: COLORS[mi % COLORS.len()].to_string(),
                    dashed: si == 1,
                    points: pts.iter().map(|(x, s)| (*x, s.median)).collect(),
                    band: pts.iter().map(|(x, s)| (*x, s.min, s.max)).collect(),
                });
            }
        }
        line_chart(
            &format!("IMU latency over time — link {}", link.name),
            &format!(
                "link: {}\n{}; median latency of the samples generated in each {LATENCY_BIN_S} s bin: median line, min–max band over repetitions",
                one_line(link),
                self.how()
            ),
            "sample generation time, s since the sensors started",
            "one-way latency, ms",
            &series,
        )
    }

    fn latency_chart(&self) -> String {
        // Modes are categories: one band per mode, a marker per (link, sensor).
        let mut series = Vec::new();
        for link in &self.links {
            for sensor in SENSORS {
                let values = Mode::ALL
                    .iter()
                    .map(|m| {
                        self.summary
                            .iter()
                            .find(|r| {
                                r.link == link.name && r.mode == m.label() && r.sensor == sensor
                            })
                            .and_then(|r| r.p99_ms)
                            .map(|s| (s.median, s.min, s.max))
                    })
                    .collect();
                series.push(CatSeries {
                    label: format!("{} {} p99", link.name, sensor),
                    color: COLORS[series.len() % COLORS.len()].to_string(),
                    hollow: sensor == "gyro",
                    values,
                });
            }
        }
        let modes: Vec<String> = Mode::ALL.iter().map(|m| m.label().to_string()).collect();
        category_chart(
            "IMU latency p99 per sensor and mode",
            &format!(
                "{}\n{}; marker: median, whisker: min–max over repetitions",
                self.link_names(),
                self.how()
            ),
            "mode",
            &modes,
            "p99 latency, ms",
            &series,
        )
    }

    fn link_names(&self) -> String {
        self.links
            .iter()
            .map(|l| format!("{} = {}", l.name, one_line(l)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Writes results.json, report.md and the SVGs into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let w = |name: &str, body: String| {
            std::fs::write(dir.join(name), body).with_context(|| format!("writing {name}"))
        };
        w("results.json", serde_json::to_string_pretty(self)?)?;
        for link in &self.links {
            w(&format!("rate-{}.svg", link.name), self.rate_chart(link))?;
            w(
                &format!("latency-time-{}.svg", link.name),
                self.latency_time_chart(link),
            )?;
        }
        w("latency-p99.svg", self.latency_chart())?;
        w("paper-tables-3-6.svg", paper_chart())?;
        w("report.md", self.markdown())?;
        Ok(())
    }

    fn markdown(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# lab imu — IMU data streaming over QUIC\n");
        let _ = writeln!(
            o,
            "Reproduces the IMU sensor experiment of {} (its Tables 3–7).\n",
            self.study
        );
        let _ = writeln!(
            o,
            "Two sensors (accel, gyro) each generate {} samples/s of {} B (send timestamp, sequence, sensor, 3 axes) for {} s; \
             the receiver counts arrivals per sensor in 1 s bins of arrival time and measures one-way latency \
             (same clock). Publisher in the emulator's client namespace; MoQT relay and subscriber in the server \
             namespace (subscriber on the relay's loopback), so only the sensors → relay direction crosses the link. \
             Every figure is the median over {} repetitions with [min–max].{}\n",
            self.config.rate_hz,
            self.config.payload,
            self.config.duration.as_secs_f64(),
            self.reps,
            if self.quick { " **Quick (CI) mode: short runs.**" } else { "" }
        );
        let _ = writeln!(o, "Modes:\n");
        let _ = writeln!(o, "- `quic-single`: one MoQT track, one subgroup stream for both sensors (sensor tagged in the payload).");
        let _ = writeln!(o, "- `quic-streams`: one track and one long-lived subgroup stream per sensor, equal priority.");
        let _ = writeln!(
            o,
            "- `quic-weighted`: per-sensor streams, accel at Publisher Priority 32 and gyro at 224 (QUIC stream priorities), \
             fed by the paper's bytes-sent weighted scheduler with weights accel:gyro = {}:{}.",
            self.config.weights[0], self.config.weights[1]
        );
        let _ = writeln!(
            o,
            "- `tcp`: one TCP connection (TCP_NODELAY), 4-byte length prefix per sample.\n"
        );
        let _ = writeln!(o, "Links:\n");
        for l in &self.links {
            let _ = writeln!(o, "- `{}`: {} ({})", l.name, one_line(l), l.source);
        }
        let offered = 2.0 * self.config.rate_hz as f64 * self.config.payload as f64 * 8.0 / 1000.0;
        let _ = writeln!(
            o,
            "\nOffered application load: {offered:.0} kbit/s (both sensors, payload only).\n"
        );
        let _ = writeln!(o, "## Main table\n");
        let _ = writeln!(
            o,
            "`msgs/s` = distinct samples received by the receiver's deadline (end of the drain) divided by the generation time; \
             `delivered %` = received / generated; latency = arrival − generation time of each received sample \
             (queueing in the publisher included).\n"
        );
        let _ = writeln!(o, "{}", self.main_table());
        let _ = writeln!(
            o,
            "## Messages per second over time (the paper's Tables 3–6 metric)\n"
        );
        for link in &self.links {
            let _ = writeln!(
                o,
                "### link `{}` ({})\n\nReceived messages in each 1 s bin, median [min–max]; the last bin(s) cover the drain after the sensors stop.\n",
                link.name,
                one_line(link)
            );
            let rows: Vec<&SummaryRow> = self
                .summary
                .iter()
                .filter(|r| r.link == link.name)
                .collect();
            let _ = write!(o, "| second |");
            for r in &rows {
                let _ = write!(o, " {} {} |", r.mode, r.sensor);
            }
            let _ = writeln!(o);
            let _ = writeln!(o, "|---|{}", "---|".repeat(rows.len()));
            let bins = rows.iter().map(|r| r.per_second.len()).max().unwrap_or(0);
            for b in 0..bins {
                let _ = write!(o, "| {}–{} |", b, b + 1);
                for r in &rows {
                    let _ = write!(o, " {} |", show(&r.per_second.get(b).copied(), 0));
                }
                let _ = writeln!(o);
            }
            let _ = writeln!(o, "\n![rate {}](rate-{}.svg)\n", link.name, link.name);
            let _ = writeln!(
                o,
                "![latency over time {}](latency-time-{}.svg)\n",
                link.name, link.name
            );
        }
        let _ = writeln!(o, "![latency](latency-p99.svg)\n");
        let _ = writeln!(o, "## Beside the paper (Table 7)\n");
        let _ = writeln!(
            o,
            "The paper streamed from a device to an Azure VM over the Internet (Python aioquic / sockets), 45 s per mode, \
             one run each, and reports the cumulative average rate. Its sender's rate is not stated, so its numbers are \
             the throughput of that stack; ours are delivered rates of sensors at a fixed {} Hz, so on a clean link every \
             mode should deliver the generated rate and the differences show up on the constrained link.\n",
            self.config.rate_hz
        );
        let _ = write!(o, "| session type | paper accel | paper gyro |");
        for l in &self.links {
            let _ = write!(o, " ours accel ({0}) | ours gyro ({0}) |", l.name);
        }
        let _ = writeln!(o);
        let _ = writeln!(o, "|---|---|---|{}", "---|---|".repeat(self.links.len()));
        for (i, (name, a, g)) in PAPER_TABLE7.iter().enumerate() {
            let mode = Mode::ALL[i].label();
            let _ = write!(o, "| {name} (`{mode}`) | {a:.2} | {g:.2} |");
            for l in &self.links {
                for s in SENSORS {
                    let r = self
                        .summary
                        .iter()
                        .find(|r| r.link == l.name && r.mode == mode && r.sensor == s);
                    let _ = write!(
                        o,
                        " {} |",
                        r.map(|r| show(&r.rate, 1)).unwrap_or("–".into())
                    );
                }
            }
            let _ = writeln!(o);
        }
        let _ = writeln!(
            o,
            "\n![{} Tables 3–6](paper-tables-3-6.svg)\n",
            SENGUPTA_2025.short
        );
        let failed: Vec<&RunRecord> = self.runs.iter().filter(|r| r.error.is_some()).collect();
        let _ = writeln!(o, "## Failed runs\n");
        if failed.is_empty() {
            let _ = writeln!(o, "None.");
        }
        for r in failed {
            let _ = writeln!(
                o,
                "- {} {} rep {}: {}",
                r.link,
                r.mode,
                r.rep,
                r.error.as_deref().unwrap_or("")
            );
        }
        o
    }
}

/// Sengupta 2025, Table 7: session type, accel, gyro msgs/s.
pub const PAPER_TABLE7: [(&str, f64, f64); 4] = [
    ("QUIC - Single Stream", 240.73, 240.73),
    ("QUIC - No Priority", 364.72, 364.72),
    ("QUIC - Prioritized", 395.54, 395.53),
    ("TCP", 340.50, 340.46),
];

/// Sengupta 2025, Tables 3–6: (time s, accel msgs/s) per mode (gyro is within 0.3).
pub const PAPER_SERIES: [(&str, [(f64, f64); 9]); 4] = [
    (
        "QUIC single stream (Table 3)",
        [
            (5.00, 250.33),
            (10.00, 260.60),
            (15.01, 252.44),
            (20.01, 247.26),
            (25.01, 243.88),
            (30.01, 243.65),
            (35.02, 241.24),
            (40.02, 239.78),
            (45.02, 240.73),
        ],
    ),
    (
        "QUIC no priority (Table 4)",
        [
            (5.00, 390.77),
            (10.00, 367.54),
            (15.00, 365.55),
            (20.01, 360.39),
            (25.01, 363.26),
            (30.01, 364.26),
            (35.01, 366.65),
            (40.02, 366.69),
            (45.02, 364.72),
        ],
    ),
    (
        "QUIC prioritized (Table 5)",
        [
            (5.00, 324.34),
            (10.00, 370.77),
            (15.00, 375.83),
            (20.00, 377.16),
            (25.00, 371.48),
            (30.01, 378.12),
            (35.01, 385.95),
            (40.01, 392.88),
            (45.01, 395.54),
        ],
    ),
    (
        "TCP (Table 6)",
        [
            (6.0, 172.37),
            (11.0, 201.25),
            (16.0, 166.99),
            (21.0, 254.08),
            (26.0, 307.84),
            (31.1, 344.17),
            (36.1, 370.26),
            (41.1, 351.42),
            (46.1, 340.50),
        ],
    ),
];

fn paper_chart() -> String {
    let series: Vec<Series> = PAPER_SERIES
        .iter()
        .enumerate()
        .map(|(i, (name, pts))| Series {
            label: name.to_string(),
            color: COLORS[i % COLORS.len()].to_string(),
            dashed: false,
            points: pts.to_vec(),
            band: Vec::new(),
        })
        .collect();
    line_chart(
        &format!(
            "{}, Tables 3–6: accelerometer msgs/s over time (cumulative average)",
            SENGUPTA_2025.short
        ),
        &format!(
            "{}\nas published: device → Azure West US over the Internet, aioquic/TCP sockets, 45 s, 1 run per mode (no spread given)",
            SENGUPTA_2025.cite()
        ),
        "seconds",
        "messages/s",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use crate::TestCli as Cli;

    fn output() -> Output {
        let args = Cli::try_parse_from(["lab", "imu"]).unwrap().lab;
        let crate::Experiment::Imu(imu) = &args.experiment else {
            panic!("imu")
        };
        let cfg = RunConfig {
            duration: std::time::Duration::from_secs(2),
            drain: std::time::Duration::from_secs(1),
            rate_hz: 500,
            payload: 64,
            weights: [3, 1],
        };
        let links = crate::imu::links(imu).unwrap();
        Output::new(&args, cfg, links, Vec::new())
    }

    #[test]
    fn report_cites_the_paper_not_a_seed_number() {
        let o = output();
        let md = o.markdown();
        assert!(!md.to_lowercase().contains("seed"), "{md}");
        assert!(md.contains(&SENGUPTA_2025.cite()), "{md}");
        assert!(md.contains("](paper-tables-3-6.svg)"), "{md}");
        let chart = paper_chart();
        assert!(!chart.to_lowercase().contains("seed"), "{chart}");
        assert!(chart.contains("A. Sengupta"), "{chart}");
        let json = serde_json::to_value(&o).unwrap();
        assert!(json.get("seed").is_none());
        assert_eq!(json["study"], SENGUPTA_2025.cite());
    }

    #[test]
    fn latency_chart_draws_modes_as_categories() {
        let svg = output().latency_chart();
        for m in Mode::ALL {
            let label = format!(">{}</text>", m.label());
            assert_eq!(svg.matches(&label).count(), 1, "{label} in {svg}");
        }
        assert!(
            !svg.contains("=quic-single"),
            "no numeric stand-ins for modes"
        );
    }
}
