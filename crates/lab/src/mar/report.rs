//! Results of the mar experiment: raw JSON, Markdown report, SVG plots.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use quichub_netem::profile::Profile;
use serde::Serialize;

use super::run::{image_size, interarrival_jitter, size_exponent, Protocol, RawRun, RunConfig};
use crate::common::one_line;
use crate::common::stats::{show, spread_of, Spread};
use crate::common::studies::CAO_MAR;
use crate::common::svg::{line_chart, Series, COLORS};
use crate::common::Options;

/// One run: one protocol, one resolution, one link, one repetition.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Link profile name.
    pub link: String,
    /// Protocol label.
    pub protocol: &'static str,
    /// `WxH`.
    pub resolution: String,
    /// Request size, bytes.
    pub size: usize,
    /// Repetition index.
    pub rep: u32,
    /// Why the run failed.
    pub error: Option<String>,
    /// Start of the request schedule, µs since the epoch.
    pub t0_us: u64,
    /// Requests sent.
    pub sent: u64,
    /// Requests answered by the deadline (end of the drain).
    pub answered: u64,
    /// `sent − answered`: a fragment, the request or its reply lost, or the
    /// reply later than the deadline.
    pub lost: u64,
    /// Requests that arrived whole at the server.
    pub server_received: u64,
    /// Median RTT of answered requests, ms.
    pub rtt_p50_ms: Option<f64>,
    /// 99th percentile RTT, ms.
    pub rtt_p99_ms: Option<f64>,
    /// RFC 3550 interarrival jitter of the requests at the server, ms.
    pub jitter_ms: Option<f64>,
    /// Request bytes delivered whole to the server, Mbit/s, per second of
    /// max(sending period, first request → last delivery).
    pub throughput_mbps: f64,
    /// RTT of request `i` (sent at `i / 30` s), ms; `null` when unanswered.
    pub rtt_ms: Vec<Option<f64>>,
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[i])
}

impl RunRecord {
    /// Computes the metrics of one run (or records its failure).
    pub fn new(
        link: &str,
        proto: Protocol,
        (w, h): (u32, u32),
        size: usize,
        rep: u32,
        cfg: &RunConfig,
        raw: anyhow::Result<RawRun>,
    ) -> Self {
        let mut r = RunRecord {
            link: link.to_string(),
            protocol: proto.label(),
            resolution: format!("{w}x{h}"),
            size,
            rep,
            error: None,
            t0_us: 0,
            sent: 0,
            answered: 0,
            lost: 0,
            server_received: 0,
            rtt_p50_ms: None,
            rtt_p99_ms: None,
            jitter_ms: None,
            throughput_mbps: 0.0,
            rtt_ms: Vec::new(),
        };
        let raw = match raw {
            Ok(raw) => raw,
            Err(e) => {
                r.error = Some(format!("{e:#}"));
                return r;
            }
        };
        r.t0_us = raw.t0_us;
        r.sent = raw.sent as u64;
        r.rtt_ms = (0..raw.sent)
            .map(|id| {
                raw.reply_us
                    .get(id as usize)
                    .copied()
                    .flatten()
                    .map(|at| at.saturating_sub(raw.sent_us(id, cfg.rate_hz)) as f64 / 1000.0)
            })
            .collect();
        r.answered = r.rtt_ms.iter().flatten().count() as u64;
        r.lost = r.sent - r.answered;
        r.server_received = raw.server.len() as u64;
        let mut rtts: Vec<f64> = r.rtt_ms.iter().flatten().copied().collect();
        rtts.sort_by(f64::total_cmp);
        r.rtt_p50_ms = Spread::of(&rtts).map(|s| s.median);
        r.rtt_p99_ms = quantile(&rtts, 0.99);
        let pairs: Vec<(u64, u64)> = raw.server.iter().map(|a| (a.sent_us, a.recv_us)).collect();
        r.jitter_ms = interarrival_jitter(&pairs).map(|j| j / 1000.0);
        let bytes: usize = raw.server.iter().map(|a| a.bytes).sum();
        // Over the sending period, or until the last delivery when the link
        // was still draining a backlog after the last request.
        let last = raw.server.iter().map(|a| a.recv_us).max().unwrap_or(0);
        let span = (last.saturating_sub(raw.t0_us) as f64 / 1e6).max(cfg.duration.as_secs_f64());
        r.throughput_mbps = bytes as f64 * 8.0 / span.max(1e-9) / 1e6;
        r
    }

    /// A progress line.
    pub fn one_line(&self) -> String {
        let mut s = format!(
            "{} {:<11} {:>9} rep {}: ",
            self.link, self.protocol, self.resolution, self.rep
        );
        if let Some(e) = &self.error {
            let _ = write!(s, "FAILED: {e}");
            return s;
        }
        let f = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or("–".into());
        let _ = write!(
            s,
            "answered {}/{} (server {}), RTT p50 {} ms p99 {} ms, jitter {} ms, {:.2} Mbit/s",
            self.answered,
            self.sent,
            self.server_received,
            f(self.rtt_p50_ms),
            f(self.rtt_p99_ms),
            self.jitter_ms
                .map(|v| format!("{v:.2}"))
                .unwrap_or("–".into()),
            self.throughput_mbps
        );
        s
    }
}

/// Aggregate of one (link, protocol, resolution) over repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    /// Link.
    pub link: String,
    /// Protocol.
    pub protocol: &'static str,
    /// `WxH`.
    pub resolution: String,
    /// Request size, bytes.
    pub size: usize,
    /// Successful repetitions.
    pub reps: usize,
    /// Requests sent.
    pub sent: Option<Spread>,
    /// Requests answered.
    pub answered: Option<Spread>,
    /// Lost (unanswered) requests, percent of sent.
    pub lost_pct: Option<Spread>,
    /// Per-run median RTT, ms.
    pub rtt_p50_ms: Option<Spread>,
    /// Per-run 99th percentile RTT, ms.
    pub rtt_p99_ms: Option<Spread>,
    /// Per-run jitter, ms.
    pub jitter_ms: Option<Spread>,
    /// Per-run throughput, Mbit/s.
    pub throughput_mbps: Option<Spread>,
}

/// Aggregate of one (link, protocol) over resolutions, then repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct MainRow {
    /// Link.
    pub link: String,
    /// Protocol.
    pub protocol: &'static str,
    /// Repetitions in which every resolution ran.
    pub reps: usize,
    /// Requests sent over all resolutions.
    pub sent: Option<Spread>,
    /// Requests answered over all resolutions.
    pub answered: Option<Spread>,
    /// Lost percent over all resolutions.
    pub lost_pct: Option<Spread>,
    /// Median over resolutions of the per-run median RTT, ms.
    pub rtt_ms: Option<Spread>,
    /// Median RTT at the largest resolution, ms.
    pub rtt_largest_ms: Option<Spread>,
    /// Median RTT at the smallest resolution, ms.
    pub rtt_smallest_ms: Option<Spread>,
    /// Median over resolutions of the jitter, ms.
    pub jitter_ms: Option<Spread>,
    /// Throughput at the largest resolution, Mbit/s.
    pub throughput_largest_mbps: Option<Spread>,
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
    /// Size-law exponent (`size ∝ pixels^b`).
    pub size_exponent: f64,
    /// Resolutions and request sizes (bytes).
    pub resolutions: Vec<(String, usize)>,
    /// Link profiles.
    pub links: Vec<Profile>,
    /// Per (link, protocol): the main table.
    pub main: Vec<MainRow>,
    /// Per (link, protocol, resolution).
    pub summary: Vec<SummaryRow>,
    /// Every run.
    pub runs: Vec<RunRecord>,
    /// The kernel's default TCP congestion controller (what `tcp` used).
    pub tcp_congestion_control: Option<String>,
}

impl Output {
    /// Aggregates the runs.
    pub fn new(
        args: &Options,
        config: RunConfig,
        links: Vec<Profile>,
        resolutions: Vec<(u32, u32)>,
        runs: Vec<RunRecord>,
    ) -> Self {
        let res: Vec<(String, usize)> = resolutions
            .iter()
            .map(|&(w, h)| (format!("{w}x{h}"), image_size(w, h)))
            .collect();
        let mut summary = Vec::new();
        let mut main = Vec::new();
        for link in &links {
            for proto in Protocol::ALL {
                let ok = |r: &&RunRecord| {
                    r.link == link.name && r.protocol == proto.label() && r.error.is_none()
                };
                for (name, size) in &res {
                    let rs: Vec<&RunRecord> = runs
                        .iter()
                        .filter(ok)
                        .filter(|r| &r.resolution == name)
                        .collect();
                    summary.push(SummaryRow {
                        link: link.name.clone(),
                        protocol: proto.label(),
                        resolution: name.clone(),
                        size: *size,
                        reps: rs.len(),
                        sent: spread_of(rs.iter().map(|r| r.sent as f64)),
                        answered: spread_of(rs.iter().map(|r| r.answered as f64)),
                        lost_pct: spread_of(
                            rs.iter()
                                .map(|r| 100.0 * r.lost as f64 / r.sent.max(1) as f64),
                        ),
                        rtt_p50_ms: spread_of(rs.iter().filter_map(|r| r.rtt_p50_ms)),
                        rtt_p99_ms: spread_of(rs.iter().filter_map(|r| r.rtt_p99_ms)),
                        jitter_ms: spread_of(rs.iter().filter_map(|r| r.jitter_ms)),
                        throughput_mbps: spread_of(rs.iter().map(|r| r.throughput_mbps)),
                    });
                }
                // Per repetition over resolutions, then spread over repetitions.
                let reps: Vec<Vec<&RunRecord>> = (0..args.reps)
                    .map(|rep| runs.iter().filter(ok).filter(|r| r.rep == rep).collect())
                    .filter(|v: &Vec<&RunRecord>| v.len() == res.len())
                    .collect();
                let med = |v: Vec<f64>| Spread::of(&v).map(|s| s.median);
                fn at<'a>(rs: &[&'a RunRecord], name: &str) -> Option<&'a RunRecord> {
                    rs.iter().find(|r| r.resolution == name).copied()
                }
                let largest = res.first().map(|r| r.0.clone()).unwrap_or_default();
                let smallest = res.last().map(|r| r.0.clone()).unwrap_or_default();
                main.push(MainRow {
                    link: link.name.clone(),
                    protocol: proto.label(),
                    reps: reps.len(),
                    sent: spread_of(
                        reps.iter()
                            .map(|rs| rs.iter().map(|r| r.sent).sum::<u64>() as f64),
                    ),
                    answered: spread_of(
                        reps.iter()
                            .map(|rs| rs.iter().map(|r| r.answered).sum::<u64>() as f64),
                    ),
                    lost_pct: spread_of(reps.iter().map(|rs| {
                        let s: u64 = rs.iter().map(|r| r.sent).sum();
                        let l: u64 = rs.iter().map(|r| r.lost).sum();
                        100.0 * l as f64 / s.max(1) as f64
                    })),
                    rtt_ms: spread_of(
                        reps.iter()
                            .filter_map(|rs| med(rs.iter().filter_map(|r| r.rtt_p50_ms).collect())),
                    ),
                    rtt_largest_ms: spread_of(
                        reps.iter()
                            .filter_map(|rs| at(rs, &largest).and_then(|r| r.rtt_p50_ms)),
                    ),
                    rtt_smallest_ms: spread_of(
                        reps.iter()
                            .filter_map(|rs| at(rs, &smallest).and_then(|r| r.rtt_p50_ms)),
                    ),
                    jitter_ms: spread_of(
                        reps.iter()
                            .filter_map(|rs| med(rs.iter().filter_map(|r| r.jitter_ms).collect())),
                    ),
                    throughput_largest_mbps: spread_of(
                        reps.iter()
                            .filter_map(|rs| at(rs, &largest).map(|r| r.throughput_mbps)),
                    ),
                });
            }
        }
        Output {
            experiment: "mar",
            study: CAO_MAR.cite(),
            quick: args.quick,
            reps: args.reps,
            config,
            size_exponent: size_exponent(),
            resolutions: res,
            links,
            main,
            summary,
            runs,
            tcp_congestion_control: crate::common::kernel_controllers().1,
        }
    }

    fn how(&self) -> String {
        format!(
            "{} requests/s for {} s per run (replies count until {} s after the last), {} repetitions",
            self.config.rate_hz,
            self.config.duration.as_secs_f64(),
            self.config.drain.as_secs_f64(),
            self.reps
        )
    }

    fn largest(&self) -> &str {
        self.resolutions.first().map(|r| r.0.as_str()).unwrap_or("")
    }

    fn smallest(&self) -> &str {
        self.resolutions.last().map(|r| r.0.as_str()).unwrap_or("")
    }

    /// The main table (Markdown), median [min–max] over repetitions.
    pub fn main_table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "mar: {}; {} resolutions — median [min–max] over repetitions",
            self.how(),
            self.resolutions.len()
        );
        let _ = writeln!(
            o,
            "| link | protocol | reps | sent | answered | lost % | RTT ms (median over resolutions) | RTT ms {} | RTT ms {} | jitter ms | Mbit/s {} |",
            self.largest(),
            self.smallest(),
            self.largest()
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.main {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.link,
                r.protocol,
                r.reps,
                show(&r.sent, 0),
                show(&r.answered, 0),
                show(&r.lost_pct, 1),
                show(&r.rtt_ms, 2),
                show(&r.rtt_largest_ms, 2),
                show(&r.rtt_smallest_ms, 2),
                show(&r.jitter_ms, 2),
                show(&r.throughput_largest_mbps, 2)
            );
        }
        o
    }

    /// Which resolutions exceed each link's uplink, and how a request's
    /// burst compares with the uplink queue.
    fn overload_note(&self) -> String {
        let mut o = String::from(
            "Offered load against the uplink: a UDP-based sender (udp, rtp, mpeg-ts) writes a request as one \
             burst of datagrams, so a request larger than the uplink's drop-tail queue loses its tail and \
             is never whole at the server, whatever the average rate; TCP and QUIC pace to their congestion \
             window and queue in the sender instead (their RTT grows), and quic-dgram loses datagrams in \
             quinn's send buffer.\n\n",
        );
        for l in &self.links {
            let Some(rate) = l.up.rate_bps else {
                continue;
            };
            let queue = match l.up.queue {
                quichub_netem::model::QueueLimit::Bytes(b) => Some(b as f64),
                quichub_netem::model::QueueLimit::Time(d) => {
                    Some(rate as f64 * d.as_secs_f64() / 8.0)
                }
                quichub_netem::model::QueueLimit::Unlimited => None,
            };
            let over: Vec<&str> = self
                .resolutions
                .iter()
                .filter(|(_, size)| *size as f64 * 8.0 * self.config.rate_hz > rate as f64)
                .map(|(n, _)| n.as_str())
                .collect();
            let burst: Vec<&str> = self
                .resolutions
                .iter()
                .filter(|(_, size)| queue.is_some_and(|q| *size as f64 > q))
                .map(|(n, _)| n.as_str())
                .collect();
            let _ = writeln!(
                o,
                "- `{}`: uplink {:.2} Mbit/s, queue {}; offered load above the uplink rate at: {}; request larger than the queue at: {}.",
                l.name,
                rate as f64 / 1e6,
                queue.map(|q| format!("{:.1} kB", q / 1000.0)).unwrap_or("unbounded".into()),
                if over.is_empty() { "none".into() } else { over.join(", ") },
                if burst.is_empty() { "none".into() } else { burst.join(", ") },
            );
        }
        o
    }

    fn rows(&self, link: &str, proto: Protocol) -> Vec<&SummaryRow> {
        self.summary
            .iter()
            .filter(|r| r.link == link && r.protocol == proto.label())
            .collect()
    }

    fn matrix(
        &self,
        link: &Profile,
        metric: fn(&SummaryRow) -> Option<Spread>,
        prec: usize,
    ) -> String {
        let mut o = String::new();
        let _ = write!(o, "| resolution | kB |");
        for p in Protocol::ALL {
            let _ = write!(o, " {} |", p.label());
        }
        let _ = writeln!(o);
        let _ = writeln!(o, "|---|---|{}", "---|".repeat(Protocol::ALL.len()));
        for (name, size) in &self.resolutions {
            let _ = write!(o, "| {name} | {:.1} |", *size as f64 / 1000.0);
            for p in Protocol::ALL {
                let r = self.summary.iter().find(|r| {
                    r.link == link.name && r.protocol == p.label() && &r.resolution == name
                });
                let _ = write!(o, " {} |", show(&r.and_then(metric), prec));
            }
            let _ = writeln!(o);
        }
        o
    }

    fn by_size_chart(
        &self,
        link: &Profile,
        what: &str,
        unit: &str,
        metric: fn(&SummaryRow) -> Option<Spread>,
    ) -> String {
        let series: Vec<Series> = Protocol::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let rows = self.rows(&link.name, *p);
                let pts = |r: &&SummaryRow| metric(r).map(|s| (r.size as f64 / 1000.0, s));
                Series {
                    label: p.label().to_string(),
                    color: COLORS[i % COLORS.len()].to_string(),
                    dashed: i >= COLORS.len(),
                    points: rows
                        .iter()
                        .filter_map(pts)
                        .map(|(x, s)| (x, s.median))
                        .collect(),
                    band: rows
                        .iter()
                        .filter_map(pts)
                        .map(|(x, s)| (x, s.min, s.max))
                        .collect(),
                }
            })
            .collect();
        line_chart(
            &format!("MAR {what} by request size — link {}", link.name),
            &format!(
                "link: {}\n{}; median line, min–max band over repetitions",
                one_line(link),
                self.how()
            ),
            "request (image) size, kB",
            &format!("{what}, {unit}"),
            &series,
        )
    }

    fn time_chart(&self, link: &Profile, resolution: &str) -> String {
        let n = self.config.requests() as usize;
        let series: Vec<Series> = Protocol::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let rs: Vec<&RunRecord> = self
                    .runs
                    .iter()
                    .filter(|r| {
                        r.link == link.name
                            && r.protocol == p.label()
                            && r.resolution == resolution
                            && r.error.is_none()
                    })
                    .collect();
                let per_id: Vec<(f64, Spread)> = (0..n)
                    .filter_map(|id| {
                        let t = id as f64 / self.config.rate_hz;
                        spread_of(
                            rs.iter()
                                .filter_map(|r| r.rtt_ms.get(id).copied().flatten()),
                        )
                        .map(|s| (t, s))
                    })
                    .collect();
                Series {
                    label: p.label().to_string(),
                    color: COLORS[i % COLORS.len()].to_string(),
                    dashed: false,
                    points: per_id.iter().map(|(t, s)| (*t, s.median)).collect(),
                    band: per_id.iter().map(|(t, s)| (*t, s.min, s.max)).collect(),
                }
            })
            .collect();
        line_chart(
            &format!("MAR RTT per request over time — link {}, {resolution}", link.name),
            &format!(
                "link: {}\n{}; per request: median line, min–max band over repetitions (unanswered requests left out)",
                one_line(link),
                self.how()
            ),
            "request send time, s since the first request",
            "RTT, ms",
            &series,
        )
    }

    /// Writes results.json, report.md and the SVGs into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let w = |name: &str, body: String| {
            std::fs::write(dir.join(name), body).with_context(|| format!("writing {name}"))
        };
        w("results.json", serde_json::to_string_pretty(self)?)?;
        for link in &self.links {
            let l = &link.name;
            w(
                &format!("rtt-{l}.svg"),
                self.by_size_chart(link, "median RTT", "ms", |r| r.rtt_p50_ms),
            )?;
            w(
                &format!("jitter-{l}.svg"),
                self.by_size_chart(link, "jitter", "ms", |r| r.jitter_ms),
            )?;
            w(
                &format!("throughput-{l}.svg"),
                self.by_size_chart(link, "throughput", "Mbit/s", |r| r.throughput_mbps),
            )?;
            w(
                &format!("lost-{l}.svg"),
                self.by_size_chart(link, "lost requests", "%", |r| r.lost_pct),
            )?;
            let mut res = vec![self.largest().to_string()];
            if self.smallest() != self.largest() {
                res.push(self.smallest().to_string());
            }
            for r in res {
                w(&format!("rtt-time-{l}-{r}.svg"), self.time_chart(link, &r))?;
            }
        }
        w("report.md", self.markdown())?;
        Ok(())
    }

    fn markdown(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# lab mar — MAR offloading over six transports\n");
        let _ = writeln!(
            o,
            "Reproduces the measurements of {}: RTT, jitter and throughput of an image request at 30 Hz.\n",
            self.study
        );
        let _ = writeln!(
            o,
            "A client (emulator client namespace) sends one grayscale image request at {} Hz for {} s per run; \
             the server (server namespace) answers each whole request with a {} B result. Requests and \
             replies both cross the emulated link. Every figure is the median over {} repetitions with \
             [min–max]; each (link, protocol, resolution) is its own run on a fresh connection.{}\n",
            self.config.rate_hz,
            self.config.duration.as_secs_f64(),
            self.config.reply_size,
            self.reps,
            if self.quick { " **Quick (CI) mode: short runs, fewer links and resolutions.**" } else { "" }
        );
        let _ = writeln!(o, "## Request sizes\n");
        let _ = writeln!(
            o,
            "The paper gives two sizes: 151.2 kB at 1152×648 and 4.5 kB at 128×72 (§4, compressed grayscale; \
             raw 8-bit grayscale would be 746.5 kB and 9.2 kB). Scaling 151.2 kB by pixel count would give \
             1.87 kB at 128×72, not 4.5 kB, so the other sizes are a log-log (power-law) interpolation \
             through the two given points: size = 151.2 kB × (pixels / (1152·648))^b with \
             b = ln(151.2/4.5) / ln(81) = {:.4}. kB = 1000 bytes.\n",
            self.size_exponent
        );
        let _ = writeln!(
            o,
            "| resolution | request kB | offered load Mbit/s at {} Hz |",
            self.config.rate_hz
        );
        let _ = writeln!(o, "|---|---|---|");
        for (name, size) in &self.resolutions {
            let _ = writeln!(
                o,
                "| {name} | {:.1} | {:.2} |",
                *size as f64 / 1000.0,
                *size as f64 * 8.0 * self.config.rate_hz / 1e6
            );
        }
        let _ = writeln!(o, "\n## Protocols\n");
        for (p, d) in [
            ("udp", format!("UDP datagrams of at most {} B, each with an 8-byte header (request id, fragment index, fragment count); a request counts lost when any fragment is missing. Reply: one datagram.", self.config.udp_payload)),
            ("tcp", format!("one TCP connection (TCP_NODELAY, the kernel's default congestion controller: {}), 4-byte length prefix per request and reply; the client queues requests to a writer, so a request waits while earlier ones are sent.", self.tcp_congestion_control.as_deref().unwrap_or("unknown"))),
            ("rtp", format!("RFC 3550 packets over UDP, at most {} B: V=2, PT 96, sequence number, 90 kHz timestamp (3000 per request), SSRC, marker on the last packet of a request. Reply: one RTP packet.", self.config.udp_payload)),
            ("mpeg-ts", "the request in a PES packet (stream_id 0xBD, PTS) in 188-byte TS packets (sync 0x47, PID 0x100, payload_unit_start on the first, continuity counter, adaptation-field stuffing on the last), 7 TS packets (1316 B) per UDP datagram; a continuity-counter gap drops the request. Reply: one TS packet on PID 0x101.".into()),
            ("quic-stream", format!("QUIC (quinn, via quichub-net's endpoints, {} congestion control), one bidirectional stream per request; the reply on the same stream. {}", self.config.cc, match self.config.quic_order {
                super::run::QuicOrder::OldestFirst => "Waiting requests are sent oldest first (each stream's priority falls with its request id), as TCP's byte stream sends them (`--quic-order oldest-first`, the default).",
                super::run::QuicOrder::RoundRobin => "Waiting requests share the link round-robin (quinn's default for streams of equal priority; `--quic-order round-robin`).",
            })),
            ("quic-dgram", "QUIC DATAGRAM frames, fragmented as `udp` within the connection's maximum datagram size; the reply as one datagram. quinn drops the oldest queued datagram when its 1 MiB send buffer is full.".into()),
        ] {
            let _ = writeln!(o, "- `{p}`: {d}");
        }
        let _ = writeln!(o, "\n## Metrics\n");
        let _ = writeln!(
            o,
            "- **RTT**: reply arrival at the client − the request's scheduled send time (the 30 Hz capture instant), \
             as the paper (\"the time between client sending a request and receiving a reply\"); it includes \
             queueing in the sender. Per run: the median over answered requests.\n\
             - **lost %**: requests without a reply by the deadline ({} s after the last request): a lost \
             fragment, request or reply, or a reply too late. `sent = answered + lost` in every run.\n\
             - **jitter**: RFC 3550 §6.4.1 interarrival jitter of the requests at the server (client → server, as \
             the paper: \"variation in packet delay from client to server\"), J += (|D| − J)/16 over whole requests \
             in arrival order, D from scheduled send and arrival times (one clock: both namespaces are on one host); \
             the value at the end of the run.\n\
             - **throughput**: request bytes delivered whole to the server (client → server), Mbit/s, divided by \
             the sending period or, when a backlog was still draining after the last request, by the time from \
             the first request to the last delivery.\n",
            self.config.drain.as_secs_f64()
        );
        let _ = writeln!(o, "## Links\n");
        for l in &self.links {
            let _ = writeln!(o, "- `{}`: {} ({})", l.name, one_line(l), l.source);
        }
        let _ = writeln!(o, "\n## Main table\n");
        let _ = writeln!(
            o,
            "Per (link, protocol), over all resolutions of a repetition, then median [min–max] over repetitions. \
             `RTT ms` is the median of the per-resolution median RTTs (the paper reports the median over its \
             resolutions); the next columns are the extremes.\n"
        );
        let _ = writeln!(o, "{}", self.main_table());
        let _ = writeln!(o, "{}", self.overload_note());
        let _ = writeln!(o, "## Per resolution\n");
        for link in &self.links {
            let l = &link.name;
            let _ = writeln!(o, "### link `{l}` ({})\n", one_line(link));
            let _ = writeln!(
                o,
                "Median RTT, ms:\n\n{}",
                self.matrix(link, |r| r.rtt_p50_ms, 2)
            );
            let _ = writeln!(
                o,
                "Jitter (RFC 3550, client → server), ms:\n\n{}",
                self.matrix(link, |r| r.jitter_ms, 2)
            );
            let _ = writeln!(
                o,
                "Throughput client → server, Mbit/s:\n\n{}",
                self.matrix(link, |r| r.throughput_mbps, 2)
            );
            let _ = writeln!(
                o,
                "Lost requests, %:\n\n{}",
                self.matrix(link, |r| r.lost_pct, 1)
            );
            let _ = writeln!(
                o,
                "![rtt {l}](rtt-{l}.svg) ![jitter {l}](jitter-{l}.svg) ![throughput {l}](throughput-{l}.svg) ![lost {l}](lost-{l}.svg)\n"
            );
            let _ = writeln!(o, "RTT of each request over time:\n");
            let _ = write!(
                o,
                "![rtt over time {l} {0}](rtt-time-{l}-{0}.svg)",
                self.largest()
            );
            if self.smallest() != self.largest() {
                let _ = write!(
                    o,
                    " ![rtt over time {l} {0}](rtt-time-{l}-{0}.svg)",
                    self.smallest()
                );
            }
            let _ = writeln!(o, "\n");
        }
        let _ = writeln!(o, "## Beside the paper\n");
        let _ = writeln!(
            o,
            "The paper measured a real 5G testbed (3.5 GHz, 60 MHz), an LTE picocell and an 802.11ac hotspot, \
             Python clients (sockets, pyrtp, ffmpeg-python, aioquic), 10 minutes per protocol and resolution, \
             with a passive probe (Qosium). Our links are emulated from its own RTT and jitter figures (see \
             the link sources), so equal RTTs on the smallest requests mostly confirm the emulation; the \
             paper's RTT hardly grows with size (≈3 % from largest to smallest on 5G), which at 151.2 kB means \
             its RTT is not a whole-request time or its link was far faster than the emulated one (151.2 kB \
             take {:.1} ms at the 5g profile's 50 Mbit/s uplink).\n",
            151_200.0 * 8.0 / 50e6 * 1e3
        );
        let _ = writeln!(
            o,
            "| link | protocol | paper median RTT ms | ours: RTT ms (median over resolutions) | ours: RTT ms {} | paper jitter range ms | ours: jitter range over protocols ms |",
            self.smallest()
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|");
        for (link, proto, rtt, pm, jit) in PAPER_RTT.iter() {
            let rtt = format!("{rtt:.2} ± {pm:.2}");
            let Some(l) = self.links.iter().find(|l| l.name == *link) else {
                continue;
            };
            let rows: Vec<&MainRow> = self
                .main
                .iter()
                .filter(|r| r.link == l.name && (*proto == "all protocols" || r.protocol == *proto))
                .collect();
            let ours = |f: fn(&MainRow) -> Option<Spread>| -> String {
                if *proto == "all protocols" {
                    spread_of(rows.iter().filter_map(|r| f(r).map(|s| s.median)))
                        .map(|s| format!("{:.2} (median of protocols)", s.median))
                        .unwrap_or("–".into())
                } else {
                    show(&rows.first().and_then(|r| f(r)), 2)
                }
            };
            let jr = if jit.is_empty() {
                String::new()
            } else {
                let js: Vec<f64> = self
                    .main
                    .iter()
                    .filter(|r| r.link == l.name)
                    .filter_map(|r| r.jitter_ms.map(|s| s.median))
                    .collect();
                match (
                    js.iter().copied().reduce(f64::min),
                    js.iter().copied().reduce(f64::max),
                ) {
                    (Some(a), Some(b)) => format!("{a:.2}–{b:.2}"),
                    _ => "–".into(),
                }
            };
            let _ = writeln!(
                o,
                "| {link} | {proto} | {rtt} | {} | {} | {jit} | {jr} |",
                ours(|r| r.rtt_ms),
                ours(|r| r.rtt_smallest_ms)
            );
        }
        let _ = writeln!(
            o,
            "\nThe paper's Table 2 (5G, main location) beside ours on `5g`:\n\n| protocol | resolution | paper RTT ms | ours RTT ms |\n|---|---|---|---|"
        );
        for (proto, res, v) in PAPER_TABLE2 {
            let ours = self
                .summary
                .iter()
                .find(|r| r.link == "5g" && r.protocol == proto && r.resolution == res);
            let _ = writeln!(
                o,
                "| {proto} | {res} | {v} | {} |",
                show(&ours.and_then(|r| r.rtt_p50_ms), 2)
            );
        }
        let _ = writeln!(
            o,
            "\nThe paper on throughput: QUIC 17.5 % above UDP on 5G, 17.9 % on LTE, 57.4 % on Wi-Fi; RTP and UDP \
             within 0.003 Mbit/s of each other. Ours (throughput at {}, median):\n",
            self.largest()
        );
        let _ = writeln!(
            o,
            "| link | udp | rtp | quic-stream | quic-stream vs udp |\n|---|---|---|---|---|"
        );
        for l in &self.links {
            let t = |p: &str| {
                self.main
                    .iter()
                    .find(|r| r.link == l.name && r.protocol == p)
                    .and_then(|r| r.throughput_largest_mbps)
                    .map(|s| s.median)
            };
            let (u, r, q) = (t("udp"), t("rtp"), t("quic-stream"));
            let f = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or("–".into());
            let rel = match (u, q) {
                (Some(u), Some(q)) if u > 0.0 => format!("{:+.1} %", 100.0 * (q - u) / u),
                _ => "–".into(),
            };
            let _ = writeln!(o, "| {} | {} | {} | {} | {rel} |", l.name, f(u), f(r), f(q));
        }
        let _ = writeln!(o);
        o.push_str(&crate::common::differs::section(&self.differences()));
        let failed: Vec<&RunRecord> = self.runs.iter().filter(|r| r.error.is_some()).collect();
        let _ = writeln!(o, "## Failed runs\n");
        if failed.is_empty() {
            let _ = writeln!(o, "None.");
        }
        for r in failed {
            let _ = writeln!(
                o,
                "- {} {} {} rep {}: {}",
                r.link,
                r.protocol,
                r.resolution,
                r.rep,
                r.error.as_deref().unwrap_or("")
            );
        }
        o
    }
}

/// The paper's median RTTs (§4): link, protocol, median ms, ± ms, jitter
/// range ms ("" where it gives none).
pub const PAPER_RTT: [(&str, &str, f64, f64, &str); 5] = [
    ("5g", "all protocols", 15.56, 0.51, "3.11–4.81"),
    ("5g", "tcp", 15.09, 0.26, ""),
    ("5g", "quic-stream", 16.16, 0.24, ""),
    ("lte", "quic-stream", 28.49, 0.32, "0.58–2.48"),
    ("wifi", "quic-stream", 1.88, 0.44, "0.33–0.82"),
];

/// The paper's Table 2 (5G, main location): protocol, resolution, RTT ms.
pub const PAPER_TABLE2: [(&str, &str, f64); 4] = [
    ("quic-stream", "1152x648", 16.37),
    ("quic-stream", "128x72", 15.79),
    ("tcp", "1152x648", 15.27),
    ("tcp", "128x72", 14.73),
];

/// The paper's throughput of QUIC above UDP, percent, per link (§4).
pub const PAPER_QUIC_OVER_UDP_PCT: [(&str, f64); 3] = [("5g", 17.5), ("lte", 17.9), ("wifi", 57.4)];

impl Output {
    /// Offered load of a resolution, bit/s.
    fn offered_bps(&self, resolution: &str) -> Option<f64> {
        self.resolutions
            .iter()
            .find(|r| r.0 == resolution)
            .map(|r| r.1 as f64 * 8.0 * self.config.rate_hz)
    }

    /// Resolutions whose offered load is above `link`'s uplink rate.
    fn overloaded(&self, link: &Profile) -> Vec<&str> {
        let Some(rate) = link.up.rate_bps else {
            return Vec::new();
        };
        self.resolutions
            .iter()
            .filter(|(n, _)| self.offered_bps(n).is_some_and(|o| o > rate as f64))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    fn summary_row(&self, link: &str, proto: &str, res: &str) -> Option<&SummaryRow> {
        self.summary
            .iter()
            .find(|r| r.link == link && r.protocol == proto && r.resolution == res)
    }

    /// Every figure the paper also gives, with what explains a difference.
    pub fn differences(&self) -> Vec<crate::common::differs::Cell> {
        use crate::common::differs::{Cell, Rule, RATIO};
        let mut cells = Vec::new();
        let smallest = self.smallest().to_string();
        // RTT: explained by request size when our smallest request's RTT is
        // close to the paper's figure, by overload when the link is overloaded.
        let rtt_why = |link: &Profile, paper: f64, ours_small: Option<f64>| -> Option<String> {
            let over = self.overloaded(link);
            if !over.is_empty() {
                return Some(format!(
                    "On `{}` the offered load is above the {:.2} Mbit/s uplink at {}: requests queue in the sender, \
                     so the RTT grows without bound over a run.",
                    link.name,
                    link.up.rate_bps.unwrap_or(0) as f64 / 1e6,
                    over.join(", ")
                ));
            }
            let small = ours_small?;
            (small / paper <= RATIO && paper / small <= RATIO).then(|| {
                format!(
                    "Our RTT includes sending the whole request at the emulated uplink rate (151.2 kB take {:.1} ms \
                     at 50 Mbit/s) and queueing behind earlier requests; at the smallest request ({smallest}) ours is \
                     within ×{RATIO} of the paper's figure. The paper's RTT hardly grows with request size, so it \
                     is not a whole-request time or its link was far faster than the emulated one.",
                    151_200.0 * 8.0 / 50e6 * 1e3
                )
            })
        };
        for (link, proto, paper, _, _) in PAPER_RTT {
            let Some(l) = self.links.iter().find(|l| l.name == link) else {
                continue;
            };
            let rows: Vec<&MainRow> = self
                .main
                .iter()
                .filter(|r| r.link == link && (proto == "all protocols" || r.protocol == proto))
                .collect();
            let med = |f: fn(&MainRow) -> Option<Spread>| {
                spread_of(rows.iter().filter_map(|r| f(r).map(|s| s.median))).map(|s| s.median)
            };
            let Some(ours) = med(|r| r.rtt_ms) else {
                continue;
            };
            cells.push(Cell {
                what: format!("`{link}`, {proto}: median RTT over resolutions"),
                paper,
                ours,
                unit: "ms",
                rule: Rule::Ratio,
                explanation: rtt_why(l, paper, med(|r| r.rtt_smallest_ms)),
                hint: None,
            });
        }
        if let Some(l) = self.links.iter().find(|l| l.name == "5g") {
            for (proto, res, paper) in PAPER_TABLE2 {
                let Some(ours) = self
                    .summary_row("5g", proto, res)
                    .and_then(|r| r.rtt_p50_ms)
                else {
                    continue;
                };
                let small = self
                    .summary_row("5g", proto, &smallest)
                    .and_then(|r| r.rtt_p50_ms)
                    .map(|s| s.median);
                cells.push(Cell {
                    what: format!("`5g`, {proto}, {res}: median RTT (Table 2)"),
                    paper,
                    ours: ours.median,
                    unit: "ms",
                    rule: Rule::Ratio,
                    explanation: rtt_why(l, paper, small),
                    hint: None,
                });
            }
        }
        let largest = self.largest().to_string();
        for (link, paper) in PAPER_QUIC_OVER_UDP_PCT {
            let t = |p: &str| {
                self.main
                    .iter()
                    .find(|r| r.link == link && r.protocol == p)
                    .and_then(|r| r.throughput_largest_mbps)
                    .map(|s| s.median)
            };
            let (Some(u), Some(q)) = (t("udp"), t("quic-stream")) else {
                continue;
            };
            if u <= 0.0 {
                continue;
            }
            let offered = self.offered_bps(&largest).unwrap_or(f64::INFINITY) / 1e6;
            let both_carry = u >= 0.95 * offered && q >= 0.95 * offered;
            cells.push(Cell {
                what: format!("`{link}`: quic-stream throughput above udp at {largest}"),
                paper,
                ours: 100.0 * (q - u) / u,
                unit: "%",
                rule: Rule::Points,
                explanation: both_carry.then(|| {
                    format!(
                        "Both of ours carry the whole offered load ({offered:.2} Mbit/s at {largest}), so they cannot \
                         differ; the paper does not say why its QUIC carried more than its UDP."
                    )
                }),
                hint: None,
            });
        }
        // Lost requests of the reliable transports: the paper reports none.
        for l in &self.links {
            let over = self.overloaded(l);
            for proto in ["tcp", "quic-stream"] {
                for (res, _) in &self.resolutions {
                    let Some(ours) = self
                        .summary_row(&l.name, proto, res)
                        .and_then(|r| r.lost_pct)
                    else {
                        continue;
                    };
                    let mut explanation = if over.contains(&res.as_str()) {
                        Some(format!(
                            "At {res} the offered load ({:.2} Mbit/s) is above the `{}` uplink's {:.2} Mbit/s: \
                             requests queue in the sender and miss the deadline ({} s after the last request).",
                            self.offered_bps(res).unwrap_or(0.0) / 1e6,
                            l.name,
                            l.up.rate_bps.unwrap_or(0) as f64 / 1e6,
                            self.config.drain.as_secs_f64()
                        ))
                    } else {
                        None
                    };
                    let mut what = format!(
                        "`{}`, {proto}, {res}: lost requests (paper: none reported)",
                        l.name
                    );
                    let mut hint = None;
                    if explanation.is_none() && proto == "quic-stream" {
                        if let Some(tcp) = self
                            .summary_row(&l.name, "tcp", res)
                            .and_then(|r| r.lost_pct)
                        {
                            what.push_str(&format!("; tcp here: {:.1} %", tcp.median));
                        }
                        if l.up.loss > 0.0 || l.down.loss > 0.0 {
                            let tcp_cc =
                                self.tcp_congestion_control.as_deref().unwrap_or("unknown");
                            let quic_cc = self.config.cc.name();
                            let same = tcp_cc == crate::common::kernel_name(self.config.cc);
                            if !same && self.config.quic_order == super::run::QuicOrder::OldestFirst
                            {
                                explanation = Some(format!(
                                    "The two transports ran different congestion controllers: quic-stream quinn's \
                                     {quic_cc}, tcp the kernel's default, {tcp_cc}. A loss-based controller cuts its \
                                     window at every random loss and sustains less than the offered load on this link, \
                                     so requests queue and miss the deadline ({} s after the last request){}. \
                                     `quichub-lab uplink` runs both transports with each controller on the same links \
                                     (docs/lab/uplink.md): with the same controller they sustain the same goodput.",
                                    self.config.drain.as_secs_f64(),
                                    if tcp_cc == "bbr" {
                                        "; BBR, model-based, does not take random loss for congestion"
                                    } else {
                                        ""
                                    }
                                ));
                            } else {
                                hint = Some(format!(
                                    "Not yet established why quic-stream misses the deadline ({} s after the last \
                                     request) on a lossy link where tcp does not. Candidates, untested: quinn's \
                                     {quic_cc} recovering from random loss more slowly than the kernel's {tcp_cc}; {}.",
                                    self.config.drain.as_secs_f64(),
                                    match self.config.quic_order {
                                        super::run::QuicOrder::RoundRobin => "requests sent round-robin \
                                            (`--quic-order round-robin`), so once they queue every one is partly \
                                            sent and few complete by the deadline",
                                        super::run::QuicOrder::OldestFirst => "none other known",
                                    }
                                ));
                            }
                        }
                    }
                    cells.push(Cell {
                        what,
                        paper: 0.0,
                        ours: ours.median,
                        unit: "%",
                        rule: Rule::Points,
                        explanation,
                        hint,
                    });
                }
            }
        }
        cells
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use crate::TestCli as Cli;

    /// A run with these figures (45 requests).
    fn rec(link: &str, p: Protocol, res: (u32, u32), lost: u64, rtt: f64, mbps: f64) -> RunRecord {
        let sent = 45;
        RunRecord {
            link: link.into(),
            protocol: p.label(),
            resolution: format!("{}x{}", res.0, res.1),
            size: image_size(res.0, res.1),
            rep: 0,
            error: None,
            t0_us: 0,
            sent,
            answered: sent - lost,
            lost,
            server_received: sent - lost,
            rtt_p50_ms: Some(rtt),
            rtt_p99_ms: Some(rtt),
            jitter_ms: Some(1.0),
            throughput_mbps: mbps,
            rtt_ms: Vec::new(),
        }
    }

    /// Quick links (5g, 5g-loss1) and resolutions (1152x648, 128x72);
    /// `f(link, protocol, resolution)` gives (lost of 45, RTT ms, Mbit/s).
    fn output(f: impl Fn(&str, Protocol, (u32, u32)) -> (u64, f64, f64)) -> Output {
        let args = Cli::try_parse_from(["lab", "--quick", "--reps", "1", "mar"])
            .unwrap()
            .lab;
        let crate::Experiment::Mar(m) = &args.experiment else {
            panic!("mar")
        };
        let links = crate::mar::links(&args, m).unwrap();
        let res = crate::mar::resolutions(&args, m).unwrap();
        let cfg = RunConfig {
            duration: std::time::Duration::from_millis(1500),
            drain: std::time::Duration::from_millis(750),
            rate_hz: crate::mar::run::REQUEST_HZ,
            reply_size: crate::mar::run::REPLY_SIZE,
            udp_payload: crate::mar::run::UDP_PAYLOAD,
            cc: Default::default(),
            quic_order: Default::default(),
        };
        let mut runs = Vec::new();
        for l in &links {
            for p in Protocol::ALL {
                for &r in &res {
                    let (lost, rtt, mbps) = f(&l.name, p, r);
                    runs.push(rec(&l.name, p, r, lost, rtt, mbps));
                }
            }
        }
        Output::new(&args, cfg, links, res, runs)
    }

    #[test]
    fn report_cites_the_paper_not_a_seed_number() {
        let o = output(|_, _, _| (0, 16.0, 36.0));
        let md = o.markdown();
        assert!(md.contains(&CAO_MAR.cite()), "{md}");
        assert!(!md.to_lowercase().contains("seed"), "{md}");
        let json = serde_json::to_value(&o).unwrap();
        assert!(json.get("seed").is_none());
        assert_eq!(json["study"], CAO_MAR.cite());
    }

    /// Figures like the paper's: no section.
    #[test]
    fn no_section_when_figures_agree() {
        let md = output(|_, _, _| (0, 16.0, 36.0)).markdown();
        assert!(!md.contains("Differs from the paper"), "{md}");
    }

    /// Figures like the 20261122 run: RTT ×3 at 1152x648 (size), QUIC losing
    /// 40 of 45 large requests on the lossy link while TCP loses none.
    #[test]
    fn section_lists_sharp_differences_with_their_explanation() {
        let mut o = output(|link, p, (w, _)| {
            let large = w == 1152;
            let rtt = if large { 50.0 } else { 24.0 };
            if link == "5g-loss1" && p == Protocol::QuicStream && large {
                (40, 280.0, 4.2)
            } else {
                (0, rtt, if large { 36.0 } else { 1.0 })
            }
        });
        // Both transports with the same controller: QUIC's loss is unexplained.
        o.tcp_congestion_control = Some("cubic".into());
        let md = o.markdown();
        let at = md.find("## Differs from the paper").expect("section");
        let s = &md[at..md.find("## Failed runs").unwrap()];
        // Table 2 cell, explained by request size.
        let row = s
            .lines()
            .find(|l| l.starts_with("| `5g`, quic-stream, 1152x648: median RTT (Table 2)"))
            .unwrap_or_else(|| panic!("Table 2 cell in {s}"));
        assert!(row.contains("| 16.37 ms | 50.00 ms | note "), "{row}");
        assert!(
            s.contains("Our RTT includes sending the whole request"),
            "{s}"
        );
        // 128x72 agrees (24 vs 15.79: within ×2): not listed.
        assert!(!s.contains("quic-stream, 128x72: median RTT"), "{s}");
        // QUIC's loss on the lossy link: both figures, not yet understood.
        let row = s
            .lines()
            .find(|l| l.starts_with("| `5g-loss1`, quic-stream, 1152x648: lost requests"))
            .unwrap_or_else(|| panic!("loss cell in {s}"));
        assert!(row.contains("tcp here: 0.0 %"), "{row}");
        assert!(
            row.contains("| 0.00 % | 88.89 % | not yet understood (note "),
            "{row}"
        );
        assert!(
            s.contains("Not yet established why quic-stream misses the deadline"),
            "{s}"
        );
        // TCP lost nothing: not listed.
        assert!(!s.contains("tcp, 1152x648: lost"), "{s}");

        // TCP with BBR, QUIC with cubic: explained by the controllers.
        o.tcp_congestion_control = Some("bbr".into());
        let md = o.markdown();
        let s = &md[md.find("## Differs from the paper").unwrap()..];
        assert!(
            s.contains("ran different congestion controllers") && s.contains("BBR, model-based"),
            "{s}"
        );
        assert!(!s.contains("Not yet established why quic-stream"), "{s}");
    }

    #[test]
    fn overload_explains_loss_and_rtt() {
        let mut o = output(|_, p, (w, _)| {
            if p == Protocol::Tcp && w == 1152 {
                (30, 900.0, 8.0)
            } else {
                (0, 16.0, 36.0)
            }
        });
        // An uplink below the 1152x648 offered load (36.3 Mbit/s).
        o.links[0].up.rate_bps = Some(20_000_000);
        let cells = o.differences();
        let c = cells
            .iter()
            .find(|c| c.what.starts_with("`5g`, tcp, 1152x648: lost requests"))
            .unwrap();
        assert!(c.differs());
        let e = c.explanation.as_deref().unwrap();
        assert!(e.contains("above the `5g` uplink's 20.00 Mbit/s"), "{e}");
    }
}
