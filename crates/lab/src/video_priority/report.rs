//! `lab video-priority`: from each run's arrival times to the figures
//! (frames on time per type, decodable frames per second, keyframe latency,
//! freeze time, per rate step and over time), and the results.json,
//! report.md and SVG plots.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use quichub_netem::profile::Profile;
use serde::Serialize;

use super::types::{Config, FrameInfo, Kind, RawRun};
use crate::common::stats::{show, spread_of, Spread};
use crate::common::studies::SENGUPTA_2025;
use crate::common::svg::{category_chart, line_chart, CatSeries, Series, COLORS};
use crate::common::Options;

/// Width of the time bins of the plots, s.
pub const BIN_S: f64 = 1.0;

/// Counts of one frame type (or all frames).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counts {
    /// Frames the publisher sent.
    pub sent: u64,
    /// Frames whose object arrived whole (at any time).
    pub received: u64,
    /// Frames that arrived before their play-out deadline.
    pub on_time: u64,
    /// On-time frames whose references were decodable (see the report).
    pub decodable: u64,
}

impl Counts {
    fn add(&mut self, received: bool, on_time: bool, decodable: bool) {
        self.sent += 1;
        self.received += u64::from(received);
        self.on_time += u64::from(on_time);
        self.decodable += u64::from(decodable);
    }

    /// Percentage of sent frames on time.
    pub fn on_time_pct(&self) -> f64 {
        if self.sent == 0 {
            f64::NAN
        } else {
            100.0 * self.on_time as f64 / self.sent as f64
        }
    }
}

/// Figures over one span of the run (one rate step, or all of it).
#[derive(Debug, Clone, Serialize)]
pub struct Span {
    /// Step index, or `None` for the whole run.
    pub step: Option<usize>,
    /// Link rate in this step, Mbit/s (`None` for the whole run).
    pub rate_mbps: Option<f64>,
    /// Start, s of media time.
    pub from_s: f64,
    /// End, s of media time.
    pub to_s: f64,
    /// I, P, B frames.
    pub by_type: [Counts; 3],
    /// All frames.
    pub all: Counts,
    /// Decodable frames per second of media time.
    pub decodable_fps: f64,
    /// Seconds the display showed a stale frame.
    pub freeze_s: f64,
    /// The longest single freeze (its part inside the span), s.
    pub longest_freeze_s: f64,
    /// Keyframe latency (arrival − publish) of the keyframes that arrived, ms: median.
    pub keyframe_latency_ms: Option<f64>,
    /// The same, largest.
    pub keyframe_latency_max_ms: Option<f64>,
    /// Keyframes sent that never arrived.
    pub keyframes_lost: u64,
}

/// One time bin of the run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Bin {
    /// Bin start, s of media time.
    pub t_s: f64,
    /// Decodable frames in the bin, per second.
    pub decodable_fps: f64,
    /// On-time frames per second by type (I, P, B).
    pub on_time_fps: [f64; 3],
    /// Freeze time inside the bin, s.
    pub freeze_s: f64,
}

/// One keyframe.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Keyframe {
    /// Its presentation time, s of media time.
    pub t_s: f64,
    /// Arrival − publish, ms; `None`: never arrived.
    pub latency_ms: Option<f64>,
}

/// One run of one delivery.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// `group` or `frame-type`.
    pub delivery: String,
    /// Repetition.
    pub rep: u32,
    /// Why the run failed.
    pub error: Option<String>,
    /// Rate steps' starts, s of media time (step 0 at 0).
    pub steps_s: Vec<f64>,
    /// Each step, then the whole run.
    pub spans: Vec<Span>,
    /// Time bins.
    pub bins: Vec<Bin>,
    /// Every keyframe.
    pub keyframes: Vec<Keyframe>,
    /// Freezes (gaps longer than 1.5 frame intervals).
    pub freezes: u64,
    /// Frames that arrived on a subgroup other than the delivery puts them on.
    pub wrong_subgroup: u64,
    /// Objects matching no frame.
    pub unmatched: u64,
    /// Objects of the first group that came by the joining FETCH.
    pub fetched: u64,
    /// Subgroup streams reset on the way (the relay's delivery timeout).
    pub resets: u64,
    /// Subgroup streams that ended cleanly.
    pub streams: u64,
    /// PUBLISH_DONE arrived.
    pub done: bool,
    /// Catalogs received (1 unless the publisher re-anchored its clock).
    pub catalogs: u32,
    /// Packets the down link's queue dropped.
    pub down_dropped: u64,
    /// Packets the down link delivered.
    pub down_delivered: u64,
}

impl RunRecord {
    /// A failed run.
    pub fn failed(delivery: &str, rep: u32, e: &anyhow::Error) -> Self {
        RunRecord {
            delivery: delivery.into(),
            rep,
            error: Some(format!("{e:#}")),
            steps_s: Vec::new(),
            spans: Vec::new(),
            bins: Vec::new(),
            keyframes: Vec::new(),
            freezes: 0,
            wrong_subgroup: 0,
            unmatched: 0,
            fetched: 0,
            resets: 0,
            streams: 0,
            done: false,
            catalogs: 0,
            down_dropped: 0,
            down_delivered: 0,
        }
    }

    /// A progress line.
    pub fn one_line(&self) -> String {
        if let Some(e) = &self.error {
            return format!("{:<10} rep {}: FAILED: {e}", self.delivery, self.rep);
        }
        let mut s = format!("{:<10} rep {}:", self.delivery, self.rep);
        for sp in &self.spans {
            let _ = write!(
                s,
                " [{}] on time I/P/B {:.0}/{:.0}/{:.0}% {:.1} fps freeze {:.1} s kf {} ms;",
                sp.rate_mbps.map_or("all".into(), |r| format!("{r} Mbit/s")),
                sp.by_type[0].on_time_pct(),
                sp.by_type[1].on_time_pct(),
                sp.by_type[2].on_time_pct(),
                sp.decodable_fps,
                sp.freeze_s,
                sp.keyframe_latency_ms
                    .map_or("–".into(), |v| format!("{v:.0}")),
            );
        }
        s
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    Spread::of(v).map(|s| s.median)
}

/// Overlap of [a0, a1) and [b0, b1).
fn overlap(a0: f64, a1: f64, b0: f64, b1: f64) -> f64 {
    (a1.min(b1) - a0.max(b0)).max(0.0)
}

/// Turns one run's arrivals into its figures.
///
/// Media time: a frame's presentation time on the publisher's clock, from
/// the end of the warm-up GOP (`t = PTS − PTS₀ − warm-up`); frames of the
/// warm-up count only as references. The rate steps are placed on it by the
/// wall time they happened. Publish time: catalog clock + DTS (the
/// publisher sends each frame when its DTS is due). Deadline: catalog clock
/// + PTS + play-out buffer.
pub fn analyse(
    delivery: &str,
    rep: u32,
    frames: &[FrameInfo],
    raw: &RawRun,
    cfg: &Config,
) -> RunRecord {
    let clock = raw.clock_unix_us as i64;
    let pts0 = frames.iter().map(|f| f.pts).min().unwrap_or(0);
    let warmup = cfg.warmup_s;
    // Media time: presentation time since the end of the warm-up GOP.
    let t_of = |f: &FrameInfo| (f.pts - pts0) as f64 / 1e6 - warmup;
    let counted = |f: &FrameInfo| t_of(f) >= -1e-9;
    let anchor = clock + pts0 + (warmup * 1e6) as i64; // unix µs of media time 0
    let interval = 1.0 / f64::from(cfg.fps);
    let end = frames.iter().map(t_of).fold(0.0, f64::max) + interval;
    let playout = cfg.playout_ms as i64 * 1000;
    // Step starts on media time.
    let mut steps_s: Vec<f64> = raw
        .steps_unix_us
        .iter()
        .map(|&u| ((u as i64 - anchor) as f64 / 1e6).max(0.0))
        .collect();
    if let Some(s) = steps_s.first_mut() {
        *s = 0.0;
    }
    let step_of = |t: f64| steps_s.iter().rposition(|&s| t >= s).unwrap_or(0);
    // Per frame: on time, decodable (decode order: references come first).
    let n = frames.len();
    let mut on_time = vec![false; n];
    let mut decodable = vec![false; n];
    for (i, f) in frames.iter().enumerate() {
        let deadline = clock + f.pts.max(0) + playout;
        on_time[i] = raw.arrivals[i].is_some_and(|a| (a as i64) <= deadline);
        decodable[i] = on_time[i] && f.refs.iter().all(|&r| decodable[r]);
    }
    // Freezes: decodable frames shown at their presentation times; a gap of
    // more than 1.5 intervals to the next shown frame (or to the end) is a
    // freeze of (gap − one interval), the time the stale frame stays up.
    let mut shown: Vec<f64> = (0..n)
        .filter(|&i| decodable[i] && counted(&frames[i]))
        .map(|i| t_of(&frames[i]))
        .collect();
    shown.sort_by(|a, b| a.total_cmp(b));
    let mut freeze_iv: Vec<(f64, f64)> = Vec::new();
    let mut prev = -interval;
    for &t in shown.iter().chain(std::iter::once(&end)) {
        if t - prev > 1.5 * interval + 1e-9 {
            freeze_iv.push((prev + interval, t));
        }
        prev = t;
    }
    let freeze_in =
        |a: f64, b: f64| -> f64 { freeze_iv.iter().map(|&(x, y)| overlap(x, y, a, b)).sum() };
    // Spans: each step, then the whole run.
    let mut bounds: Vec<(Option<usize>, f64, f64)> = steps_s
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            (
                Some(k),
                s,
                steps_s.get(k + 1).copied().unwrap_or(end).min(end),
            )
        })
        .collect();
    bounds.push((None, 0.0, end));
    let keyframes: Vec<Keyframe> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind == Kind::I && counted(f))
        .map(|(i, f)| Keyframe {
            t_s: t_of(f),
            latency_ms: raw.arrivals[i].map(|a| (a as i64 - (clock + f.dts)) as f64 / 1000.0),
        })
        .collect();
    let spans = bounds
        .iter()
        .map(|&(step, from, to)| {
            let mut by_type = [Counts::default(); 3];
            let mut all = Counts::default();
            let mut kf = Vec::new();
            let mut kf_lost = 0;
            for (i, f) in frames.iter().enumerate() {
                let t = t_of(f);
                if !counted(f) {
                    continue;
                }
                let inside = match step {
                    Some(k) => step_of(t) == k,
                    None => true,
                };
                if !inside {
                    continue;
                }
                let rec = raw.arrivals[i].is_some();
                by_type[f.kind.index()].add(rec, on_time[i], decodable[i]);
                all.add(rec, on_time[i], decodable[i]);
                if f.kind == Kind::I {
                    match raw.arrivals[i] {
                        Some(a) => kf.push((a as i64 - (clock + f.dts)) as f64 / 1000.0),
                        None => kf_lost += 1,
                    }
                }
            }
            let secs = (to - from).max(1e-6);
            Span {
                step,
                rate_mbps: step.map(|k| cfg.steps_bps[k] as f64 / 1e6),
                from_s: from,
                to_s: to,
                by_type,
                all,
                decodable_fps: all.decodable as f64 / secs,
                freeze_s: freeze_in(from, to),
                longest_freeze_s: freeze_iv
                    .iter()
                    .map(|&(x, y)| overlap(x, y, from, to))
                    .fold(0.0, f64::max),
                keyframe_latency_ms: median(&mut kf),
                keyframe_latency_max_ms: kf.iter().copied().reduce(f64::max),
                keyframes_lost: kf_lost,
            }
        })
        .collect();
    let nbins = (end / BIN_S).ceil() as usize;
    let mut bins: Vec<Bin> = (0..nbins)
        .map(|b| {
            let t = b as f64 * BIN_S;
            Bin {
                t_s: t,
                decodable_fps: 0.0,
                on_time_fps: [0.0; 3],
                freeze_s: freeze_in(t, t + BIN_S),
            }
        })
        .collect();
    for (i, f) in frames.iter().enumerate().filter(|(_, f)| counted(f)) {
        let b = ((t_of(f) / BIN_S) as usize).min(nbins.saturating_sub(1));
        if let Some(bin) = bins.get_mut(b) {
            if decodable[i] {
                bin.decodable_fps += 1.0 / BIN_S;
            }
            if on_time[i] {
                bin.on_time_fps[f.kind.index()] += 1.0 / BIN_S;
            }
        }
    }
    let wrong_subgroup = frames
        .iter()
        .zip(&raw.subgroups)
        .filter(|(f, sg)| {
            sg.is_some_and(|sg| {
                let want = if delivery.starts_with("group") {
                    0
                } else {
                    match (f.kind, f.reference) {
                        (Kind::I, _) => 0,
                        (_, true) => 1,
                        (_, false) => 2,
                    }
                };
                sg != want
            })
        })
        .count() as u64;
    RunRecord {
        delivery: delivery.into(),
        rep,
        error: None,
        steps_s,
        spans,
        bins,
        keyframes,
        freezes: freeze_iv.len() as u64,
        wrong_subgroup,
        unmatched: raw.unmatched,
        fetched: raw.fetched,
        resets: raw.resets,
        streams: raw.streams,
        done: raw.done,
        catalogs: raw.catalogs,
        down_dropped: raw.down_dropped,
        down_delivered: raw.down_delivered,
    }
}

/// Aggregate of one (delivery, span) over the repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    /// Delivery.
    pub delivery: String,
    /// Step index; `None`: the whole run.
    pub step: Option<usize>,
    /// Link rate, Mbit/s.
    pub rate_mbps: Option<f64>,
    /// Successful repetitions.
    pub ok: usize,
    /// On-time percentage of I, P, B frames.
    pub on_time_pct: [Option<Spread>; 3],
    /// Decodable percentage of all frames.
    pub decodable_pct: Option<Spread>,
    /// Decodable frames per second.
    pub decodable_fps: Option<Spread>,
    /// Freeze time, s.
    pub freeze_s: Option<Spread>,
    /// Longest freeze, s.
    pub longest_freeze_s: Option<Spread>,
    /// Median keyframe latency, ms.
    pub keyframe_latency_ms: Option<Spread>,
    /// Largest keyframe latency, ms.
    pub keyframe_latency_max_ms: Option<Spread>,
    /// Keyframes lost.
    pub keyframes_lost: Option<Spread>,
}

/// The video the runs used.
#[derive(Debug, Clone, Serialize)]
pub struct VideoInfo {
    /// Frames.
    pub frames: usize,
    /// Frames by type (I, P, B).
    pub frames_by_type: [usize; 3],
    /// Bytes by type.
    pub bytes_by_type: [usize; 3],
    /// Mean bitrate over the video, Mbit/s.
    pub mbps: f64,
    /// Seconds.
    pub seconds: f64,
    /// Where the stream departs from the assumed GOP structure (empty: none).
    pub structure_notes: Vec<String>,
}

impl VideoInfo {
    /// Summarises `frames`.
    pub fn of(frames: &[FrameInfo], fps: u32, notes: Vec<String>) -> Self {
        let mut n = [0; 3];
        let mut b = [0; 3];
        for f in frames {
            n[f.kind.index()] += 1;
            b[f.kind.index()] += f.bytes;
        }
        let seconds = frames.len() as f64 / f64::from(fps);
        VideoInfo {
            frames: frames.len(),
            frames_by_type: n,
            bytes_by_type: b,
            mbps: b.iter().sum::<usize>() as f64 * 8.0 / seconds / 1e6,
            seconds,
            structure_notes: notes,
        }
    }
}

/// Everything the run writes (results.json).
#[derive(Debug, Clone, Serialize)]
pub struct Output {
    /// Experiment name.
    pub experiment: &'static str,
    /// Quick mode.
    pub quick: bool,
    /// Repetitions.
    pub reps: u32,
    /// Configuration.
    pub config: Config,
    /// The starting link.
    pub link: Profile,
    /// The video.
    pub video: VideoInfo,
    /// Wall time of the whole experiment, s (encoding included).
    pub wall_s: f64,
    /// Aggregates.
    pub summary: Vec<SummaryRow>,
    /// Every run.
    pub runs: Vec<RunRecord>,
}

impl Output {
    /// Aggregates the runs.
    pub fn new(
        args: &Options,
        config: Config,
        link: Profile,
        video: VideoInfo,
        runs: Vec<RunRecord>,
        wall_s: f64,
    ) -> Self {
        let mut summary = Vec::new();
        for d in &config.deliveries {
            let ok: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| &r.delivery == d && r.error.is_none())
                .collect();
            for k in (0..config.steps_bps.len()).map(Some).chain([None]) {
                let spans: Vec<&Span> = ok
                    .iter()
                    .filter_map(|r| r.spans.iter().find(|s| s.step == k))
                    .collect();
                let sp = |f: &dyn Fn(&Span) -> Option<f64>| {
                    spread_of(spans.iter().filter_map(|s| f(s)).filter(|v| v.is_finite()))
                };
                summary.push(SummaryRow {
                    delivery: d.clone(),
                    step: k,
                    rate_mbps: k.map(|k| config.steps_bps[k] as f64 / 1e6),
                    ok: spans.len(),
                    on_time_pct: [0, 1, 2].map(|t| sp(&|s| Some(s.by_type[t].on_time_pct()))),
                    decodable_pct: sp(&|s| {
                        (s.all.sent > 0).then(|| 100.0 * s.all.decodable as f64 / s.all.sent as f64)
                    }),
                    decodable_fps: sp(&|s| Some(s.decodable_fps)),
                    freeze_s: sp(&|s| Some(s.freeze_s)),
                    longest_freeze_s: sp(&|s| Some(s.longest_freeze_s)),
                    keyframe_latency_ms: sp(&|s| s.keyframe_latency_ms),
                    keyframe_latency_max_ms: sp(&|s| s.keyframe_latency_max_ms),
                    keyframes_lost: sp(&|s| Some(s.keyframes_lost as f64)),
                });
            }
        }
        Output {
            experiment: "video-priority",
            quick: args.quick,
            reps: args.reps,
            link,
            video,
            wall_s,
            summary,
            runs,
            config,
        }
    }

    /// Streams reset per run of `delivery`.
    fn resets(&self, delivery: &str) -> Option<Spread> {
        spread_of(
            self.runs
                .iter()
                .filter(|r| r.delivery == delivery && r.error.is_none())
                .map(|r| r.resets as f64),
        )
    }

    fn row_label(&self, r: &SummaryRow) -> String {
        match r.rate_mbps {
            Some(m) => format!("{m} Mbit/s"),
            None => "whole run".into(),
        }
    }

    /// The main table (Markdown).
    pub fn main_table(&self) -> String {
        let mut s = String::from(
            "| delivery | link | ok/reps | I on time % | P on time % | B on time % | decodable % | decodable fps | freeze s | longest freeze s | keyframe latency ms (median) | keyframe latency ms (max) | keyframes lost |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.summary {
            let _ = writeln!(
                s,
                "| {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.delivery,
                self.row_label(r),
                r.ok,
                self.reps,
                show(&r.on_time_pct[0], 1),
                show(&r.on_time_pct[1], 1),
                show(&r.on_time_pct[2], 1),
                show(&r.decodable_pct, 1),
                show(&r.decodable_fps, 1),
                show(&r.freeze_s, 2),
                show(&r.longest_freeze_s, 2),
                show(&r.keyframe_latency_ms, 0),
                show(&r.keyframe_latency_max_ms, 0),
                show(&r.keyframes_lost, 0),
            );
        }
        s
    }

    fn steps_text(&self) -> String {
        let c = &self.config;
        c.steps_bps
            .iter()
            .enumerate()
            .map(|(k, b)| {
                format!(
                    "{} Mbit/s from {:.0} s",
                    *b as f64 / 1e6,
                    k as f64 * c.step_secs
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Median [min–max] over the successful runs of `delivery`, per bin.
    fn bin_series(
        &self,
        delivery: &str,
        label: &str,
        color: &str,
        dashed: bool,
        f: &dyn Fn(&Bin) -> f64,
    ) -> Series {
        let runs: Vec<&RunRecord> = self
            .runs
            .iter()
            .filter(|r| r.delivery == delivery && r.error.is_none())
            .collect();
        let nb = runs.iter().map(|r| r.bins.len()).max().unwrap_or(0);
        let mut points = Vec::new();
        let mut band = Vec::new();
        for b in 0..nb {
            if let Some(s) = spread_of(runs.iter().filter_map(|r| r.bins.get(b)).map(f)) {
                let t = b as f64 * BIN_S + BIN_S / 2.0;
                points.push((t, s.median));
                band.push((t, s.min, s.max));
            }
        }
        Series {
            label: label.into(),
            color: color.into(),
            dashed,
            points,
            band,
        }
    }

    fn plots(&self) -> Vec<(String, String, String)> {
        let c = &self.config;
        let reps = format!(
            "median of {} repetition(s), band min–max; link relay → subscriber: {}; {} ms one-way delay, {} ms queue; video {:.2} Mbit/s, {} fps, GOP {} frames; play-out buffer {} ms, delivery timeout {} ms.",
            self.reps,
            self.steps_text(),
            c.delay_ms,
            c.queue_ms,
            self.video.mbps,
            c.fps,
            c.gop,
            c.playout_ms,
            c.target_latency_ms
        );
        let color = |d: &str| match d {
            "group" => COLORS[1],
            "frame-type" => COLORS[0],
            "group-newest" => COLORS[4],
            _ => COLORS[3],
        };
        let mut out = Vec::new();
        let series: Vec<Series> = c
            .deliveries
            .iter()
            .map(|d| self.bin_series(d, d, color(d), false, &|b| b.decodable_fps))
            .collect();
        out.push((
            "decodable-fps.svg".to_string(),
            "Decodable frames per second".to_string(),
            line_chart(
                "Decodable frames per second at the subscriber",
                &format!(
                    "Frames that arrived before their play-out deadline and whose references were decodable, per 1 s of media time (the frame's presentation time on the publisher's clock). {reps}"
                ),
                "media time, s",
                "decodable frames/s",
                &series,
            ),
        ));
        for d in &c.deliveries {
            let series: Vec<Series> = Kind::ALL
                .iter()
                .enumerate()
                .map(|(k, kind)| {
                    self.bin_series(d, kind.label(), COLORS[2 + k], false, &|b| b.on_time_fps[k])
                })
                .collect();
            out.push((
                on_time_file(d),
                format!("On-time frames per second by type, {d}"),
                line_chart(
                    &format!("On-time frames per second by frame type, {d} delivery"),
                    &format!("Frames of each type that arrived whole before their play-out deadline, per 1 s of media time ({} I, {} P and {} B frames per s sent at full rate). {reps}",
                        f64::from(c.fps) / f64::from(c.gop),
                        self.video.frames_by_type[1] as f64 / self.video.seconds,
                        self.video.frames_by_type[2] as f64 / self.video.seconds),
                    "media time, s",
                    "on-time frames/s",
                    &series,
                ),
            ));
        }
        let series: Vec<Series> = c
            .deliveries
            .iter()
            .map(|d| {
                let mut s = self.bin_series(d, d, color(d), false, &|b| b.freeze_s);
                // Cumulative.
                let mut acc = 0.0;
                for p in &mut s.points {
                    acc += p.1;
                    p.1 = acc;
                }
                s.band.clear();
                s
            })
            .collect();
        out.push((
            "freeze.svg".to_string(),
            "Cumulative freeze time".to_string(),
            line_chart(
                "Cumulative freeze time",
                &format!("Time the display would show a stale frame (each gap between consecutive decodable frames longer than 1.5 frame intervals counts as the gap less one interval), summed over media time; the median run per bin, accumulated. {reps}"),
                "media time, s",
                "freeze time, s",
                &series,
            ),
        ));
        let series: Vec<Series> = c
            .deliveries
            .iter()
            .map(|d| {
                let runs: Vec<&RunRecord> = self
                    .runs
                    .iter()
                    .filter(|r| &r.delivery == d && r.error.is_none())
                    .collect();
                let nk = runs.iter().map(|r| r.keyframes.len()).max().unwrap_or(0);
                let mut points = Vec::new();
                let mut band = Vec::new();
                for k in 0..nk {
                    let t = runs
                        .iter()
                        .find_map(|r| r.keyframes.get(k))
                        .map_or(0.0, |x| x.t_s);
                    if let Some(s) = spread_of(
                        runs.iter()
                            .filter_map(|r| r.keyframes.get(k))
                            .filter_map(|x| x.latency_ms),
                    ) {
                        points.push((t, s.median));
                        band.push((t, s.min, s.max));
                    }
                }
                Series {
                    label: d.clone(),
                    color: color(d).into(),
                    dashed: false,
                    points,
                    band,
                }
            })
            .collect();
        out.push((
            "keyframe-latency.svg".to_string(),
            "Keyframe latency".to_string(),
            line_chart(
                "Keyframe latency",
                &format!("Each keyframe's arrival at the subscriber (whole object) less its publish time (catalog clock + DTS), by its presentation time; keyframes that never arrived are left out (see the tables). {reps}"),
                "media time, s",
                "keyframe latency, ms",
                &series,
            ),
        ));
        let mut cats = Vec::new();
        for (k, b) in c.steps_bps.iter().enumerate() {
            for kind in Kind::ALL {
                cats.push((
                    k,
                    kind,
                    format!("{} {} Mbit/s", kind.label(), *b as f64 / 1e6),
                ));
            }
        }
        let series: Vec<CatSeries> = c
            .deliveries
            .iter()
            .map(|d| CatSeries {
                label: d.clone(),
                color: color(d).into(),
                hollow: false,
                values: cats
                    .iter()
                    .map(|(k, kind, _)| {
                        self.summary
                            .iter()
                            .find(|r| &r.delivery == d && r.step == Some(*k))
                            .and_then(|r| r.on_time_pct[kind.index()])
                            .map(|s| (s.median, s.min, s.max))
                    })
                    .collect(),
            })
            .collect();
        out.push((
            "on-time-per-step.svg".to_string(),
            "Frames on time per type and rate step".to_string(),
            category_chart(
                "Frames on time per type and rate step",
                &format!("Share of each type's frames (by presentation time within the step) that arrived before their play-out deadline. {reps}"),
                "frame type, link rate",
                &cats.into_iter().map(|c| c.2).collect::<Vec<_>>(),
                "on time, %",
                &series,
            ),
        ));
        out
    }

    /// The study's own words beside what we measured.
    fn study_section(&self) -> String {
        let last = self.config.steps_bps.len() - 1;
        let get = |d: &str, k: Option<usize>| {
            self.summary.iter().find(|r| r.delivery == d && r.step == k)
        };
        let mut s = String::from("## The study's description beside ours\n\n");
        let _ = writeln!(
            s,
            "{} describes, after Curley et al., \"Prioritization in Media over QUIC Transport\", two strategies and measures neither; the table sets each sentence beside our figures (lowest link rate, step {}: {} Mbit/s; first step: {} Mbit/s).\n",
            SENGUPTA_2025.cite(),
            last,
            self.config.steps_bps[last] as f64 / 1e6,
            self.config.steps_bps[0] as f64 / 1e6
        );
        s.push_str("| the study | what we measured |\n|---|---|\n");
        let g_first = get("group", Some(0));
        let g_last = get("group", Some(last));
        let f_last = get("frame-type", Some(last));
        let kf =
            |r: Option<&SummaryRow>| r.map_or("–".into(), |r| show(&r.keyframe_latency_ms, 0));
        let _ = writeln!(
            s,
            "| \"Implicit Prioritization (FEFS): A single unidirectional QUIC stream is used to deliver the frames in the encoded order. This is also known as First Encode, First Send (FEFS). When there is not enough bandwidth to send the encoded media, a latency increase may occur.\" | `group` (one stream per GOP, frames in encode order): median keyframe latency {} ms at {} Mbit/s, {} ms at {} Mbit/s; keyframes lost there {}, streams reset per run {}. The relay applies the delivery timeout ({} ms) when its forwarder takes an object (`crates/relay/src/forward.rs`) and resets that object's subgroup stream, which in this delivery is the rest of the GOP; bytes already written to a QUIC stream are not withdrawn, so the time they wait in the relay's QUIC send buffer is not bounded by it. |",
            kf(g_first),
            self.config.steps_bps[0] as f64 / 1e6,
            kf(g_last),
            self.config.steps_bps[last] as f64 / 1e6,
            g_last.map_or("–".into(), |r| show(&r.keyframes_lost, 0)),
            show(&self.resets("group"), 0),
            self.config.target_latency_ms
        );
        let on = |r: Option<&SummaryRow>, t: usize| {
            r.map_or("–".into(), |r| show(&r.on_time_pct[t], 1))
        };
        let fps = |r: Option<&SummaryRow>| r.map_or("–".into(), |r| show(&r.decodable_fps, 1));
        let fr = |r: Option<&SummaryRow>| r.map_or("–".into(), |r| show(&r.freeze_s, 2));
        let _ = writeln!(
            s,
            "| \"Prioritization by Frame Type (FT): A separate unidirectional QUIC stream is created for each frame type (i.e., I, P and B) […] I and B-frames have the highest and lowest priority, respectively.\" | `frame-type` at {} Mbit/s: I / P / B on time {} / {} / {} % (group: {} / {} / {} %); decodable {} fps (group {}); freeze {} s (group {}) in that step. |",
            self.config.steps_bps[last] as f64 / 1e6,
            on(f_last, 0),
            on(f_last, 1),
            on(f_last, 2),
            on(g_last, 0),
            on(g_last, 1),
            on(g_last, 2),
            fps(f_last),
            fps(g_last),
            fr(f_last),
            fr(g_last),
        );
        s.push_str("\nWhat decides these figures, from the code (the `-newest` deliveries, where run, change only the group order and so test that part): the relay gives each stream to the subscriber a QUIC priority from the subscriber's priority, then the publisher's priority, then the group (the track's group order, ascending by default: older groups first; `stream_priority` in `crates/relay/src/forward.rs`). So in `group` delivery a GOP that fell behind keeps the link while the next GOP's stream, keyframe first, waits behind it; in `frame-type` delivery the keyframes' streams go first, but within one type the frames of a GOP still share one stream in encode order, so once the P or B stream of a GOP falls behind, every later P or B frame of that GOP waits behind it. The delivery timeout drops objects only before they are written to a QUIC stream.\n");
        s.push_str("\nThe study gives no figures for either strategy, so no \"differs from the paper\" comparison can be made; the sentences above are its whole description.\n\n");
        s
    }

    /// Writes results.json, report.md and the plots into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(self)?,
        )
        .context("writing results.json")?;
        let c = &self.config;
        let v = &self.video;
        let mut r = String::new();
        let _ = writeln!(
            r,
            "# lab video-priority: one stream in encode order vs one subgroup per frame type\n\nAfter {}.\n",
            SENGUPTA_2025.cite()
        );
        let _ = writeln!(
            r,
            "Repetitions: {}{}; wall time {:.0} s.\n",
            self.reps,
            if self.quick { " (quick mode)" } else { "" },
            self.wall_s
        );
        r.push_str("## Setup\n\n");
        let _ = writeln!(
            r,
            "- **Topology**: the relay (quichub's hub, in the lab process) and the publisher (`quichub pub --broadcast`'s library, `quichub_client::media`, in the lab process, hang format) in the link emulator's server namespace, talking over the namespace's own interface (no emulated link between them); the subscriber (the client library) in the client namespace. The relay sends video to the subscriber server → client, so the **rate steps are on the emulator's down direction (relay → subscriber)**: {}. Each step's rate holds from when the lab switched it (the publisher's start plus k × {} s); each direction also has {} ms one-way delay, the down direction a {} ms drop-tail queue at the current rate; the up direction (ACKs, control) is not rate-limited.",
            self.steps_text(),
            c.step_secs,
            c.delay_ms,
            c.queue_ms
        );
        let _ = writeln!(
            r,
            "- **Video**: {} frames, {:.1} s, {:.2} Mbit/s mean; I / P / B frames {} / {} / {}, {:.1} / {:.1} / {:.1} % of the bytes. Made by `ffmpeg {}` (x264: closed GOPs of {} frames, {} B frames between reference frames, B frames never referenced, one reference picture, no scene cuts).",
            v.frames,
            v.seconds,
            v.mbps,
            v.frames_by_type[0],
            v.frames_by_type[1],
            v.frames_by_type[2],
            pct(v.bytes_by_type[0], v),
            pct(v.bytes_by_type[1], v),
            pct(v.bytes_by_type[2], v),
            c.ffmpeg.join(" "),
            c.gop,
            c.bframes
        );
        let _ = writeln!(
            r,
            "- **Deliveries** (`quichub pub --delivery`): `group`: each GOP on one subgroup stream, frames in encode order (the study's FEFS, \"first encode, first send\"), priority 96. `frame-type`: subgroup 0 keyframes (priority 96), 1 other reference frames (here the P frames, 128), 2 frames nothing references (here the B frames, 160); lower is more important, the relay's streams to the subscriber carry these priorities. Both with `--target-latency-ms {}`: the relay drops (resets the stream of) an object older than that.{} Every run starts a fresh relay and publisher.",
            c.target_latency_ms,
            if c.deliveries.iter().any(|d| d.ends_with("-newest")) {
                " `group-newest` and `frame-type-newest`: the same publisher, the subscriber's SUBSCRIBE asking GROUP_ORDER descending, so that among streams of equal priority the relay sends the newer group's first (the default, the track's, is ascending)."
            } else {
                ""
            }
        );
        if !v.structure_notes.is_empty() {
            let _ = writeln!(
                r,
                "- **The stream departs from the assumed GOP structure** (dependencies below may be wrong there): {}",
                v.structure_notes.join("; ")
            );
        }
        r.push_str("\n## How each figure is measured\n\n");
        let _ = writeln!(
            r,
            "- **Clock**: publisher, relay and subscriber share the machine's clock. The publisher's catalog carries `clock`, the wall time of media time zero; the publisher sends each frame when its DTS is due, so its **publish time** is clock + DTS. A frame **arrives** when the subscriber holds its whole object (the client library's arrival time).\n\
             - **On time**: the frame arrived before its play-out deadline, clock + PTS + {} ms (the play-out buffer, `--playout-ms`).\n\
             - **Decodable**: on time, and every frame it references decodable. References are those of the encoder's fixed structure (checked against each frame's H.264 slice type and `nal_ref_idc`): an I frame needs none; a P frame the previous reference frame (I or P) of its GOP; a B frame the previous two reference frames in decode order (its past and future references in display order). A simplification: x264 with one reference picture uses exactly these, but the model does not read the slices' reference lists.\n\
             - **Decodable fps**: decodable frames per second of media time (presentation time since the end of the warm-up); the full rate is {} fps.\n\
             - **Freeze time**: the decodable frames are shown at their presentation times; a gap of more than 1.5 frame intervals ({:.1} ms) to the next shown frame (or to the end of the video) freezes the picture for the gap less one interval. Also counted: the longest single freeze, and the number of such gaps. (A steady 10 fps of I and P frames with every B frame missing counts as frozen two thirds of the time, in 67 ms pieces; the longest freeze tells such a picture from a stall.)\n\
             - **Keyframe latency**: arrival − publish time of each I frame that arrived (at any time, late ones too); keyframes that never arrived are counted as lost.\n\
             - **Warm-up**: the video starts with one GOP ({:.1} s) at the first step's rate that no figure counts (its frames serve only as references): the subscriber subscribes to the video track once the catalog arrives, and what the publisher sent before that comes by a joining FETCH. Media time 0 is the end of the warm-up.\n\
             - **Per step**: frames are assigned to a rate step by their presentation time on the publisher's clock (the step started at that time on the wall clock).\n\
             - Every figure is the median [min–max] over the repetitions of the per-run figure.",
            c.playout_ms,
            c.fps,
            1500.0 / f64::from(c.fps),
            c.warmup_s
        );
        r.push_str("\n## Results\n\n");
        r.push_str(&self.main_table());
        r.push('\n');
        r.push_str(&self.study_section());
        r.push_str("## Plots\n\n");
        for (file, alt, svg) in self.plots() {
            std::fs::write(dir.join(&file), svg).with_context(|| format!("writing {file}"))?;
            let _ = writeln!(r, "![{alt}]({file})\n");
        }
        r.push_str("## Runs\n\n| delivery | rep | frames received | on time | decodable | freezes | streams reset | wrong subgroup | queue drops (down) | error |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for run in &self.runs {
            let all = run.spans.iter().find(|s| s.step.is_none());
            let _ = writeln!(
                r,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.delivery,
                run.rep,
                all.map_or("–".into(), |s| format!(
                    "{}/{}",
                    s.all.received, s.all.sent
                )),
                all.map_or("–".into(), |s| s.all.on_time.to_string()),
                all.map_or("–".into(), |s| s.all.decodable.to_string()),
                run.freezes,
                run.resets,
                run.wrong_subgroup,
                run.down_dropped,
                run.error.as_deref().unwrap_or("")
            );
        }
        std::fs::write(dir.join("report.md"), r).context("writing report.md")?;
        Ok(())
    }
}

/// The file of the on-time-by-type plot of `delivery`.
pub fn on_time_file(delivery: &str) -> String {
    format!("on-time-by-type-{delivery}.svg")
}

fn pct(b: usize, v: &VideoInfo) -> f64 {
    100.0 * b as f64 / v.bytes_by_type.iter().sum::<usize>().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One closed GOP in decode order, I P B B P B B (30 fps: 33 333 µs a
    /// frame), its references as the loader would give them.
    fn gop() -> Vec<FrameInfo> {
        let f = |i: usize, pts_n: i64, kind: Kind, reference: bool, refs: Vec<usize>| FrameInfo {
            group: 0,
            object: i as u64,
            pts: pts_n * 33_333,
            dts: i as i64 * 33_333,
            bytes: 1000,
            kind,
            reference,
            refs,
        };
        vec![
            f(0, 0, Kind::I, true, vec![]),
            f(1, 3, Kind::P, true, vec![0]),
            f(2, 1, Kind::B, false, vec![0, 1]),
            f(3, 2, Kind::B, false, vec![0, 1]),
            f(4, 6, Kind::P, true, vec![1]),
            f(5, 4, Kind::B, false, vec![1, 4]),
            f(6, 5, Kind::B, false, vec![1, 4]),
        ]
    }

    fn cfg() -> Config {
        Config {
            steps_bps: vec![8_000_000, 2_000_000],
            step_secs: 0.1,
            warmup_s: 0.0,
            video_kbps: 5000,
            size: (64, 64),
            fps: 30,
            gop: 7,
            bframes: 2,
            playout_ms: 100,
            target_latency_ms: 100,
            delay_ms: 0,
            queue_ms: 100,
            deliveries: vec!["frame-type".into()],
            ffmpeg: Vec::new(),
        }
    }

    #[test]
    fn decodable_follows_references_and_counts_add_up() {
        let frames = gop();
        let clock = 1_000_000_000u64;
        // Everything 10 ms after publish, except: the first P frame late
        // (after its deadline), and B frame 6 never.
        let mut arrivals: Vec<Option<u64>> = frames
            .iter()
            .map(|f| Some(clock + f.dts as u64 + 10_000))
            .collect();
        arrivals[1] = Some(clock + frames[1].pts as u64 + 200_000);
        arrivals[6] = None;
        let raw = RawRun {
            clock_unix_us: clock,
            catalogs: 1,
            arrivals,
            subgroups: vec![
                Some(0),
                Some(1),
                Some(2),
                Some(2),
                Some(1),
                Some(2),
                Some(2),
            ],
            steps_unix_us: vec![clock, clock + 100_000],
            ..Default::default()
        };
        let r = analyse("frame-type", 0, &frames, &raw, &cfg());
        assert_eq!(r.wrong_subgroup, 0);
        let all = r.spans.last().unwrap();
        assert_eq!(all.step, None);
        // Only the I frame is decodable: P1 is late, and everything else
        // depends on it.
        assert_eq!(all.all.sent, 7);
        assert_eq!(all.all.received, 6);
        assert_eq!(all.all.on_time, 5);
        assert_eq!(all.all.decodable, 1);
        assert_eq!(all.by_type[0].decodable, 1);
        let steps: u64 = r.spans[..2].iter().map(|s| s.all.sent).sum();
        assert_eq!(steps, 7, "frames split between the steps");
        // Shown: the I frame at 0 only; the video ends one interval after
        // its last frame (PTS 6), so the gap is 7 intervals and the freeze
        // that less one interval.
        let dt = 0.033_333;
        assert!((all.freeze_s - 6.0 * dt).abs() < 1e-3, "{}", all.freeze_s);
        assert_eq!(r.freezes, 1);
        let binned: f64 = r.bins.iter().map(|b| b.freeze_s).sum();
        assert!((binned - all.freeze_s).abs() < 1e-9);
        assert_eq!(r.keyframes.len(), 1);
        assert!((r.keyframes[0].latency_ms.unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn every_frame_on_time_means_no_freeze() {
        let frames = gop();
        let clock = 5_000_000u64;
        let raw = RawRun {
            clock_unix_us: clock,
            catalogs: 1,
            arrivals: frames
                .iter()
                .map(|f| Some(clock + f.dts as u64 + 1_000))
                .collect(),
            subgroups: vec![Some(0); 7],
            steps_unix_us: vec![clock],
            ..Default::default()
        };
        let r = analyse("group", 0, &frames, &raw, &cfg());
        let all = r.spans.last().unwrap();
        assert_eq!(all.all.decodable, 7);
        assert_eq!(all.freeze_s, 0.0);
        assert_eq!(r.freezes, 0);
        assert_eq!(r.wrong_subgroup, 0);
    }
}
