//! `lab live-video`'s results: the summary per (link, protocol, subscriber),
//! the paper's figures beside ours, the Markdown report and the plots.

use std::fmt::Write;
use std::path::Path;

use quichub_netem::profile::Profile;
use serde::Serialize;

use super::types::{
    Protocol, RunConfig, RunRecord, Source, SubRecord, HTTP_PORT, MOQ_PORT, STALL_MS,
};
use crate::common::differs::{self, Cell, Rule};
use crate::common::stats::{show, spread_of, Spread};
use crate::common::studies::ESTUPINAN_2025;
use crate::common::svg::{category_chart, line_chart, CatSeries, Series, COLORS};
use crate::common::Options;

/// The paper's throughput figures (abstract), Mbit/s.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PaperFigures {
    /// Publishing, RTMP + HLS over TCP.
    pub publish_rtmp_hls_mbps: f64,
    /// Publishing, MoQ.
    pub publish_moq_mbps: f64,
    /// Subscribing, RTMP + HLS over TCP.
    pub subscribe_rtmp_hls_mbps: f64,
    /// Subscribing, MoQ.
    pub subscribe_moq_mbps: f64,
}

/// The figures of Estupiñan-Cuesta et al. 2025 (abstract): channel use while
/// publishing and subscribing to a 720p 8 Mbit/s video.
pub const PAPER: PaperFigures = PaperFigures {
    publish_rtmp_hls_mbps: 8.16,
    publish_moq_mbps: 0.6,
    subscribe_rtmp_hls_mbps: 1.04,
    subscribe_moq_mbps: 0.3,
};

/// Aggregate of one (link, protocol, subscriber) over the repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    /// Link.
    pub link: String,
    /// Protocol label.
    pub protocol: &'static str,
    /// local or remote.
    pub role: &'static str,
    /// Repetitions that produced figures.
    pub ok: usize,
    /// Repetitions run.
    pub reps: usize,
    /// Join → first decodable frame, ms.
    pub startup_ms: Option<Spread>,
    /// Per-run median glass-to-glass latency, ms.
    pub g2g_median_ms: Option<Spread>,
    /// Per-run 95th percentile, ms.
    pub g2g_p95_ms: Option<Spread>,
    /// Stalls per run.
    pub stalls: Option<Spread>,
    /// Stalled time per run, ms.
    pub stall_ms: Option<Spread>,
    /// Frames delivered of those expected, %.
    pub delivered_pct: Option<Spread>,
    /// Remote: mean downlink throughput of the flow, Mbit/s.
    pub wire_mbps: Option<Spread>,
    /// Remote: bytes on the wire per source video byte delivered.
    pub wire_per_video_byte: Option<Spread>,
}

/// Everything a run writes (results.json).
#[derive(Debug, Clone, Serialize)]
pub struct Output {
    /// Experiment name.
    pub experiment: &'static str,
    /// The study.
    pub study: String,
    /// Quick mode.
    pub quick: bool,
    /// Repetitions.
    pub reps: u32,
    /// Timing.
    pub config: RunConfig,
    /// Source frames.
    pub source_frames: usize,
    /// Source video bit rate, Mbit/s.
    pub source_mbps: f64,
    /// Links.
    pub links: Vec<Profile>,
    /// Protocols: (label, description).
    pub protocols: Vec<(&'static str, &'static str)>,
    /// The paper's figures.
    pub paper: PaperFigures,
    /// Aggregates.
    pub summary: Vec<SummaryRow>,
    /// Every run.
    pub runs: Vec<RunRecord>,
}

impl Output {
    /// Summarises the runs.
    pub fn new(
        args: &Options,
        config: RunConfig,
        links: Vec<Profile>,
        protos: &[Protocol],
        src: &Source,
        runs: Vec<RunRecord>,
    ) -> Output {
        let mut summary = Vec::new();
        for l in &links {
            for p in protos {
                for role in ["local", "remote"] {
                    let rs: Vec<&RunRecord> = runs
                        .iter()
                        .filter(|r| r.link == l.name && r.protocol == p.label())
                        .collect();
                    let subs: Vec<&SubRecord> = rs
                        .iter()
                        .filter(|r| r.error.is_none())
                        .flat_map(|r| r.subs.iter())
                        .filter(|s| s.role == role && s.error.is_none() && s.frames_delivered > 0)
                        .collect();
                    let sp = |f: &dyn Fn(&SubRecord) -> Option<f64>| {
                        spread_of(subs.iter().filter_map(|s| f(s)))
                    };
                    summary.push(SummaryRow {
                        link: l.name.clone(),
                        protocol: p.label(),
                        role,
                        ok: subs.len(),
                        reps: rs.len(),
                        startup_ms: sp(&|s| s.startup_ms),
                        g2g_median_ms: sp(&|s| s.g2g_median_ms),
                        g2g_p95_ms: sp(&|s| s.g2g_p95_ms),
                        stalls: sp(&|s| Some(s.stalls as f64)),
                        stall_ms: sp(&|s| Some(s.stall_ms)),
                        delivered_pct: sp(&|s| {
                            (s.frames_expected > 0).then(|| {
                                100.0 * s.frames_delivered as f64 / s.frames_expected as f64
                            })
                        }),
                        wire_mbps: sp(&|s| s.wire_mbps),
                        wire_per_video_byte: sp(&|s| s.wire_per_video_byte),
                    });
                }
            }
        }
        Output {
            experiment: "live-video",
            study: ESTUPINAN_2025.cite(),
            quick: args.quick,
            reps: args.reps,
            config,
            source_frames: src.frames.len(),
            source_mbps: src.bitrate_bps / 1e6,
            links,
            protocols: protos.iter().map(|p| (p.label(), p.describe())).collect(),
            paper: PAPER,
            summary,
            runs,
        }
    }

    /// The main table (Markdown).
    pub fn main_table(&self) -> String {
        let mut o = String::from(
            "| link | protocol | subscriber | ok/reps | startup ms | glass-to-glass ms (median) | glass-to-glass ms (p95) | stalls | stalled ms | frames delivered % | downlink Mbit/s | wire bytes per video byte |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.summary {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.link,
                r.protocol,
                r.role,
                r.ok,
                r.reps,
                show(&r.startup_ms, 0),
                show(&r.g2g_median_ms, 0),
                show(&r.g2g_p95_ms, 0),
                show(&r.stalls, 0),
                show(&r.stall_ms, 0),
                show(&r.delivered_pct, 1),
                show(&r.wire_mbps, 2),
                show(&r.wire_per_video_byte, 3),
            );
        }
        o
    }

    fn row(&self, link: &str, proto: &str, role: &str) -> Option<&SummaryRow> {
        self.summary
            .iter()
            .find(|r| r.link == link && r.protocol == proto && r.role == role)
    }

    /// Our figures beside the paper's, on the first link (clean by default).
    fn paper_cells(&self) -> Vec<Cell> {
        let Some(link) = self.links.first().map(|l| l.name.clone()) else {
            return Vec::new();
        };
        let mut cells = Vec::new();
        let delivered = |p: &str| {
            self.row(&link, p, "remote")
                .and_then(|r| r.delivered_pct)
                .map_or("–".into(), |s| format!("{:.1}", s.median))
        };
        for (proto, paper_pub, paper_sub) in [
            (
                "rtmp-hls-1s",
                PAPER.publish_rtmp_hls_mbps,
                PAPER.subscribe_rtmp_hls_mbps,
            ),
            ("moq", PAPER.publish_moq_mbps, PAPER.subscribe_moq_mbps),
        ] {
            let Some(r) = self.row(&link, proto, "remote") else {
                continue;
            };
            cells.push(Cell {
                what: format!("{link}, {proto}, publishing (video bit rate fed to the publisher)"),
                paper: paper_pub,
                ours: self.source_mbps,
                unit: "Mbit/s",
                rule: Rule::Ratio,
                explanation: (paper_pub * 2.0 < self.source_mbps).then(|| format!(
                    "our publisher carries the whole {:.2} Mbit/s video (the remote subscriber got {}% of the frames from its join on), as any publisher of an 8 Mbit/s video must; a publishing rate of {paper_pub} Mbit/s cannot carry it. The paper's abstract does not say what its figure averages over (capture length, idle time) or whether its MoQ encoder (its references include a browser-based one) kept to 8 Mbit/s; which of these explains it is not established",
                    self.source_mbps,
                    delivered(proto)
                )),
                hint: None,
            });
            if let Some(w) = r.wire_mbps {
                cells.push(Cell {
                    what: format!("{link}, {proto}, subscribing (remote subscriber's downlink)"),
                    paper: paper_sub,
                    ours: w.median,
                    unit: "Mbit/s",
                    rule: Rule::Ratio,
                    explanation: Some(format!(
                        "ours is the mean downlink rate of the remote subscriber's flow from its join to its last frame, with the whole video delivered ({}% of the frames): it cannot be below the video's {:.2} Mbit/s for long. The paper's subscribing figures (1.04 and 0.3 Mbit/s) are below the video's own rate, so they average over something else (e.g. capture periods with no video flowing) or a video that was not delivered whole; the abstract does not say which",
                        delivered(proto),
                        self.source_mbps
                    )),
                    hint: None,
                });
            }
        }
        cells
    }

    /// The report (Markdown).
    pub fn report(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# Live video: MoQ vs RTMP ingest + HLS delivery\n");
        let _ = writeln!(
            o,
            "After {}. The same live 720p 30 fps H.264 video ({} frames, {:.2} Mbit/s, 1 s GOP, no B frames; x264 CBR 8 Mbit/s made by ffmpeg) through each protocol; {} repetition(s) per link and protocol; {:.0} s of video per run, subscribers joining {:.0} s after the stream start. Figures are median [min–max] over the repetitions.{}\n",
            ESTUPINAN_2025.cite(),
            self.source_frames,
            self.source_mbps,
            self.reps,
            self.config.duration_s,
            self.config.join_s,
            if self.quick { " **Quick (CI) run: too short for conclusions.**" } else { "" }
        );
        let _ = writeln!(o, "## Setup\n");
        let _ = writeln!(
            o,
            "Topology: the link emulator's two network namespaces. The publisher, the server (quichub's relay, or nginx with nginx-rtmp) and the **local** subscriber run in the server namespace, over its loopback (the paper's subscriber \"local in the cloud\"); the **remote** subscriber runs in the client namespace, across the emulated link. Publishing never crosses the link, so the link carries only the remote subscriber's flow.\n"
        );
        for (l, d) in &self.protocols {
            let _ = writeln!(o, "- `{l}`: {d}");
        }
        let _ = writeln!(o, "\nLinks:\n");
        for l in &self.links {
            let _ = writeln!(o, "- `{}`: {} ({})", l.name, l.describe(), l.source);
        }
        let _ = writeln!(
            o,
            "\nHow each figure is measured (one monotonic clock, this process's):\n\n\
             - **Encode time** of frame *i*: `T0 + pts_i`, the moment this process writes the frame into the publisher's standard input (ffmpeg for RTMP, `quichub pub --no-pace` for MoQ), paced in real time from the pre-encoded fragmented MP4 (one fragment per frame).\n\
             - **Glass-to-glass latency**: encode time → the frame held whole by the subscriber: for MoQ, read from `quichub sub`'s fMP4 output; for HLS, when the segment holding it has been downloaded completely. Frames are recognised by a hash of their slice NAL units (both paths carry them unchanged).\n\
             - **Startup**: the subscriber's join (MoQ: `quichub sub` started; HLS: the player's first playlist request) → its first keyframe held.\n\
             - **Stalls**: playback starts at the first keyframe held and runs in real time; a frame not held by its playout time pauses playback until it is. A pause longer than {STALL_MS} ms is a stall; *stalled ms* sums every pause. Frames never delivered are skipped, not waited for.\n\
             - **Frames delivered %**: distinct frames held, of those from the first one held to the end of the stream.\n\
             - **HLS player**: loads the playlist, starts at the latest segment at least three target durations before its end (RFC 8216 §6.3.3), fetches each new segment over one HTTP/1.1 keep-alive connection, and reloads the playlist one target duration after the last load began, or half of one when it had not changed (§6.3.4).\n\
             - **Downlink Mbit/s** (remote only): the emulator's capture, IP bytes of the subscriber's flow (UDP port {mp} for MoQ, TCP port {hp} for HLS) sent server → client into the link and not dropped by it, timed as they reached the emulator (an observer at the sending end of the link, as the paper's captures were), from the join to the last frame held: the paper's throughput (channel use) metric. Per-second figures can exceed the link's rate while its queue fills.\n\
             - **Wire bytes per video byte** (remote only): every IP byte of the flow sent into the link in both directions (headers, retransmissions, ACKs, playlists, packets the link then dropped) over the source bytes of the frames delivered.\n",
            mp = MOQ_PORT,
            hp = HTTP_PORT
        );
        let late = self
            .runs
            .iter()
            .map(|r| r.feed_late_max_ms)
            .fold(0.0, f64::max);
        let _ = writeln!(
            o,
            "The feeder wrote every frame at most {late:.1} ms after its encode time (largest over all runs: pipe back-pressure and scheduling on this machine).\n"
        );
        let _ = writeln!(o, "## Results\n");
        o.push_str(&self.main_table());
        let _ = writeln!(o);
        for l in &self.links {
            let _ = writeln!(o, "![throughput on {0}](throughput-{0}.svg)", l.name);
        }
        let _ = writeln!(o, "![glass-to-glass](g2g.svg)\n![startup](startup.svg)\n");
        let _ = writeln!(o, "## The paper's figures beside ours\n");
        let _ = writeln!(
            o,
            "{} report channel use (Wireshark / tcpdump captures) while publishing and subscribing to a 720p 8 Mbit/s video over a cloud path, with proof-of-concept Go servers: publishing {} Mbit/s for RTMP + HLS over TCP and {} Mbit/s for MoQ; subscribing {} and {} Mbit/s. Ours, on the `{}` link:\n",
            ESTUPINAN_2025.short,
            PAPER.publish_rtmp_hls_mbps,
            PAPER.publish_moq_mbps,
            PAPER.subscribe_rtmp_hls_mbps,
            PAPER.subscribe_moq_mbps,
            self.links.first().map_or("", |l| l.name.as_str())
        );
        let cells = self.paper_cells();
        let _ = writeln!(o, "| figure | paper | ours |\n|---|---|---|");
        for c in &cells {
            let _ = writeln!(
                o,
                "| {} | {} {u} | {:.2} {u} |",
                c.what,
                c.paper,
                c.ours,
                u = c.unit
            );
        }
        let _ = writeln!(o);
        o.push_str(&differs::section(&cells));
        o.push_str(&self.findings());
        o
    }

    /// Plain statements drawn from the summary: which protocol had the
    /// lower latency and overhead on each link.
    fn findings(&self) -> String {
        let mut o = String::from("## What the run shows\n\n");
        for l in &self.links {
            let get = |p: &str| self.row(&l.name, p, "remote");
            let (Some(m), Some(h)) = (get("moq"), get("rtmp-hls-1s")) else {
                continue;
            };
            let (Some(mg), Some(hg)) = (m.g2g_median_ms, h.g2g_median_ms) else {
                continue;
            };
            let _ = write!(
                o,
                "- `{}`, remote: glass-to-glass {:.0} ms (MoQ) vs {:.0} ms (HLS, 1 s fragments)",
                l.name, mg.median, hg.median
            );
            if let (Some(mw), Some(hw)) = (m.wire_per_video_byte, h.wire_per_video_byte) {
                let _ = write!(
                    o,
                    "; {:.3} vs {:.3} wire bytes per video byte",
                    mw.median, hw.median
                );
            }
            if let (Some(ms), Some(hs)) = (m.stalls, h.stalls) {
                let _ = write!(o, "; stalls {:.0} vs {:.0}", ms.median, hs.median);
            }
            if let (Some(md), Some(hd)) = (m.delivered_pct, h.delivered_pct) {
                let _ = write!(
                    o,
                    "; frames delivered {:.1}% vs {:.1}%",
                    md.median, hd.median
                );
            }
            let _ = writeln!(o, ".");
        }
        o.push('\n');
        o
    }

    /// Writes results.json, report.md and the plots.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(self)?,
        )?;
        std::fs::write(dir.join("report.md"), self.report())?;
        for (name, svg) in self.plots() {
            std::fs::write(dir.join(name), svg)?;
        }
        Ok(())
    }

    /// The SVG plots: (file name, SVG).
    pub fn plots(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        let protos: Vec<&'static str> = self.protocols.iter().map(|p| p.0).collect();
        // The x axis ends a second after the last second with traffic.
        let last_bin = self
            .runs
            .iter()
            .flat_map(|r| r.subs.iter())
            .filter_map(|s| s.wire_series.iter().rposition(|&v| v > 0.0))
            .max()
            .unwrap_or(0)
            + 2;
        for l in &self.links {
            let mut series = Vec::new();
            for (k, p) in protos.iter().enumerate() {
                let subs: Vec<&SubRecord> = self
                    .runs
                    .iter()
                    .filter(|r| r.link == l.name && r.protocol == *p)
                    .flat_map(|r| r.subs.iter())
                    .filter(|s| s.role == "remote" && !s.wire_series.is_empty())
                    .collect();
                if subs.is_empty() {
                    continue;
                }
                let n = subs
                    .iter()
                    .map(|s| s.wire_series.len())
                    .min()
                    .unwrap_or(0)
                    .min(last_bin);
                let mut points = Vec::new();
                let mut band = Vec::new();
                for b in 0..n {
                    let vals: Vec<f64> = subs.iter().map(|s| s.wire_series[b]).collect();
                    if let Some(s) = Spread::of(&vals) {
                        let x = b as f64 + 0.5;
                        points.push((x, s.median));
                        band.push((x, s.min, s.max));
                    }
                }
                series.push(Series {
                    label: format!("{p} (remote)"),
                    color: COLORS[k % COLORS.len()].into(),
                    dashed: false,
                    points,
                    band,
                });
            }
            series.push(Series {
                label: format!("video bit rate ({:.2} Mbit/s)", self.source_mbps),
                color: "#7f7f7f".into(),
                dashed: true,
                points: vec![
                    (0.0, self.source_mbps),
                    (self.config.duration_s, self.source_mbps),
                ],
                band: Vec::new(),
            });
            v.push((
                format!("throughput-{}.svg", l.name),
                line_chart(
                    &format!("Throughput delivered to the remote subscriber, {}", l.name),
                    &format!(
                        "IP bytes of the subscriber's flow sent server → client into the emulated link and not dropped, by the second they reached it (its queue may delay them further), since the stream start (subscribers join at {:.0} s); median over {} repetition(s), band min–max. {}",
                        self.config.join_s,
                        self.reps,
                        l.describe()
                    ),
                    "seconds since the stream start",
                    "Mbit/s",
                    &series,
                ),
            ));
        }
        let cats: Vec<String> = self.links.iter().map(|l| l.name.clone()).collect();
        let cat = |metric: &dyn Fn(&SummaryRow) -> Option<Spread>| {
            let mut s = Vec::new();
            for (k, p) in protos.iter().enumerate() {
                for role in ["remote", "local"] {
                    s.push(CatSeries {
                        label: format!("{p} {role}"),
                        color: COLORS[k % COLORS.len()].into(),
                        hollow: role == "local",
                        values: self
                            .links
                            .iter()
                            .map(|l| {
                                self.row(&l.name, p, role)
                                    .and_then(metric)
                                    .map(|s| (s.median, s.min, s.max))
                            })
                            .collect(),
                    });
                }
            }
            s
        };
        let g2g = cat(&|r: &SummaryRow| r.g2g_median_ms);
        v.push((
            "g2g.svg".into(),
            category_chart(
                "Glass-to-glass latency by link",
                &format!(
                    "Encode time (frame written into the publisher at T0 + pts) → frame held by the subscriber (HLS: its segment downloaded); per-run median, then median [min–max] over {} repetition(s); hollow: local subscriber",
                    self.reps
                ),
                "link",
                &cats,
                "ms",
                &g2g,
            ),
        ));
        let st = cat(&|r: &SummaryRow| r.startup_ms);
        v.push((
            "startup.svg".into(),
            category_chart(
                "Startup time by link",
                &format!(
                    "Join (sub started / first playlist request) → first keyframe held; median [min–max] over {} repetition(s); hollow: local subscriber",
                    self.reps
                ),
                "link",
                &cats,
                "ms",
                &st,
            ),
        ));
        v
    }
}
