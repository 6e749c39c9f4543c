//! Rendering results: a human table, JSON and CSV.
//!
//! [`BenchReport`] holds per-track reports and aggregates; the runner decides
//! which to include (with thousands of subscribers, usually only the
//! aggregates in the table and every track in the CSV).

use std::fmt::Write as _;

use serde::Serialize;

use crate::metrics::{AggregateReport, TrackReport};

/// The results of a benchmark run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BenchReport {
    /// What was run (e.g. profile and relay), shown above the table.
    pub title: String,
    /// One entry per subscribed track.
    pub tracks: Vec<TrackReport>,
    /// Totals, e.g. one per profile track and one over all.
    pub aggregates: Vec<AggregateReport>,
}

/// Column header of [`BenchReport::tracks_csv`].
pub const TRACK_CSV_HEADER: &str = "label,state,failure,objects_sent,groups_sent,\
received_objects,received_groups,lost_objects,loss_ratio,missing_objects,total_duration_ms,\
actual_duration_ms,average_receive_variance_ms,max_receive_variance_ms,\
average_publisher_variance_ms,max_publisher_variance_ms,average_delta_ms,max_delta_ms,\
average_bits_per_second,expected_bits_per_second,received_bytes,duplicate_objects,\
reordered_objects,stale_objects,data_after_completion,starts_received,starts_after_data,\
malformed_messages,ignored_messages,latency_samples,latency_p50_ms,latency_p90_ms,\
latency_p99_ms,latency_max_ms,latency_mean_ms,clock_skew_samples";

/// Column header of [`BenchReport::aggregates_csv`].
pub const AGGREGATE_CSV_HEADER: &str = "label,tracks,completed,failed,incomplete,\
objects_sent,received_objects,received_groups,lost_objects,loss_ratio,worst_loss_ratio,\
worst_loss_track,received_bytes,duplicate_objects,reordered_objects,stale_objects,\
malformed_messages,mean_receive_variance_ms,max_receive_variance_ms,\
mean_publisher_variance_ms,max_publisher_variance_ms,mean_delta_ms,max_delta_ms,\
total_bits_per_second,mean_bits_per_second,min_bits_per_second,expected_bits_per_second,\
latency_samples,latency_p50_ms,latency_p90_ms,latency_p99_ms,latency_max_ms,\
latency_mean_ms,clock_skew_samples,failures";

impl BenchReport {
    /// Pretty-printed JSON of the whole report.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// CSV of the tracks: [`TRACK_CSV_HEADER`], then one row per track.
    /// Empty cells are values not known (e.g. loss before COMPLETION).
    pub fn tracks_csv(&self) -> String {
        let mut out = String::from(TRACK_CSV_HEADER);
        out.push('\n');
        for t in &self.tracks {
            let l = &t.latency;
            let row = [
                csv_text(&t.label),
                t.state.as_str().to_string(),
                csv_text(t.failure.as_deref().unwrap_or("")),
                opt(t.objects_sent),
                opt(t.groups_sent),
                t.received_objects.to_string(),
                t.received_groups.to_string(),
                opt(t.lost_objects),
                opt(t.loss_ratio),
                t.missing_objects.to_string(),
                opt(t.total_duration_ms),
                t.actual_duration_ms.to_string(),
                t.average_receive_variance_ms.to_string(),
                t.max_receive_variance_ms.to_string(),
                t.average_publisher_variance_ms.to_string(),
                t.max_publisher_variance_ms.to_string(),
                t.average_delta_ms.to_string(),
                t.max_delta_ms.to_string(),
                t.average_bits_per_second.to_string(),
                opt(t.expected_bits_per_second),
                t.received_bytes.to_string(),
                t.duplicate_objects.to_string(),
                t.reordered_objects.to_string(),
                t.stale_objects.to_string(),
                t.data_after_completion.to_string(),
                t.starts_received.to_string(),
                t.starts_after_data.to_string(),
                t.malformed_messages.to_string(),
                t.ignored_messages.to_string(),
                l.samples.to_string(),
                opt(l.p50_ms),
                opt(l.p90_ms),
                opt(l.p99_ms),
                opt(l.max_ms),
                opt(l.mean_ms),
                l.clock_skew_samples.to_string(),
            ];
            out.push_str(&row.join(","));
            out.push('\n');
        }
        out
    }

    /// CSV of the aggregates: [`AGGREGATE_CSV_HEADER`], then one row each;
    /// `failures` is joined with `; `.
    pub fn aggregates_csv(&self) -> String {
        let mut out = String::from(AGGREGATE_CSV_HEADER);
        out.push('\n');
        for a in &self.aggregates {
            let l = &a.latency;
            let row = [
                csv_text(&a.label),
                a.tracks.to_string(),
                a.completed.to_string(),
                a.failed.to_string(),
                a.incomplete.to_string(),
                a.objects_sent.to_string(),
                a.received_objects.to_string(),
                a.received_groups.to_string(),
                a.lost_objects.to_string(),
                opt(a.loss_ratio),
                opt(a.worst_loss_ratio),
                csv_text(a.worst_loss_track.as_deref().unwrap_or("")),
                a.received_bytes.to_string(),
                a.duplicate_objects.to_string(),
                a.reordered_objects.to_string(),
                a.stale_objects.to_string(),
                a.malformed_messages.to_string(),
                a.mean_receive_variance_ms.to_string(),
                a.max_receive_variance_ms.to_string(),
                a.mean_publisher_variance_ms.to_string(),
                a.max_publisher_variance_ms.to_string(),
                a.mean_delta_ms.to_string(),
                a.max_delta_ms.to_string(),
                a.total_bits_per_second.to_string(),
                a.mean_bits_per_second.to_string(),
                opt(a.min_bits_per_second),
                a.expected_bits_per_second.to_string(),
                l.samples.to_string(),
                opt(l.p50_ms),
                opt(l.p90_ms),
                opt(l.p99_ms),
                opt(l.max_ms),
                opt(l.mean_ms),
                l.clock_skew_samples.to_string(),
                csv_text(&a.failures.join("; ")),
            ];
            out.push_str(&row.join(","));
            out.push('\n');
        }
        out
    }

    /// A fixed-width text table: the title, the aggregates, then the tracks
    /// (each part only if present), and failure reasons. Durations in ms,
    /// rates in kbit/s, `-` where a value is not known.
    pub fn summary_table(&self) -> String {
        let mut out = String::new();
        if !self.title.is_empty() {
            out.push_str(&self.title);
            out.push('\n');
        }
        if !self.aggregates.is_empty() {
            let header = [
                "aggregate",
                "tracks",
                "done",
                "failed",
                "incompl",
                "sent",
                "recv",
                "lost",
                "loss%",
                "worst%",
                "rxvar avg",
                "rxvar max",
                "pubvar avg",
                "max delta",
                "kbps",
                "exp kbps",
                "lat p50",
                "lat p90",
                "lat p99",
                "lat max",
            ];
            let rows = self.aggregates.iter().map(|a| {
                let l = &a.latency;
                vec![
                    a.label.clone(),
                    a.tracks.to_string(),
                    a.completed.to_string(),
                    a.failed.to_string(),
                    a.incomplete.to_string(),
                    a.objects_sent.to_string(),
                    a.received_objects.to_string(),
                    a.lost_objects.to_string(),
                    percent(a.loss_ratio),
                    percent(a.worst_loss_ratio),
                    fixed(a.mean_receive_variance_ms),
                    fixed(a.max_receive_variance_ms),
                    fixed(a.mean_publisher_variance_ms),
                    fixed(a.max_delta_ms),
                    fixed(a.total_bits_per_second / 1000.0),
                    fixed(a.expected_bits_per_second / 1000.0),
                    fixed_opt(l.p50_ms),
                    fixed_opt(l.p90_ms),
                    fixed_opt(l.p99_ms),
                    fixed_opt(l.max_ms),
                ]
            });
            render(&mut out, &header, rows.collect());
        }
        if !self.tracks.is_empty() {
            if !self.aggregates.is_empty() {
                out.push('\n');
            }
            let header = [
                "track",
                "state",
                "sent",
                "recv",
                "lost",
                "loss%",
                "dup",
                "avg delta",
                "max delta",
                "rxvar avg",
                "rxvar max",
                "pubvar avg",
                "kbps",
                "exp kbps",
                "lat p50",
                "lat p99",
                "lat max",
            ];
            let rows = self.tracks.iter().map(|t| {
                let l = &t.latency;
                vec![
                    t.label.clone(),
                    t.state.as_str().to_string(),
                    t.objects_sent.map_or("-".into(), |v| v.to_string()),
                    t.received_objects.to_string(),
                    t.lost_objects.map_or("-".into(), |v| v.to_string()),
                    percent(t.loss_ratio),
                    t.duplicate_objects.to_string(),
                    fixed(t.average_delta_ms),
                    fixed(t.max_delta_ms),
                    fixed(t.average_receive_variance_ms),
                    fixed(t.max_receive_variance_ms),
                    fixed(t.average_publisher_variance_ms),
                    fixed(t.average_bits_per_second / 1000.0),
                    fixed_opt(t.expected_bits_per_second.map(|b| b / 1000.0)),
                    fixed_opt(l.p50_ms),
                    fixed_opt(l.p99_ms),
                    fixed_opt(l.max_ms),
                ]
            });
            render(&mut out, &header, rows.collect());
        }
        let failures: Vec<String> = self
            .tracks
            .iter()
            .filter_map(|t| t.failure.as_ref().map(|f| format!("{}: {f}", t.label)))
            .chain(
                self.aggregates
                    .iter()
                    .flat_map(|a| a.failures.iter().cloned()),
            )
            .collect();
        if !failures.is_empty() {
            out.push_str("\nfailures:\n");
            let mut seen = std::collections::HashSet::new();
            for f in failures {
                if seen.insert(f.clone()) {
                    let _ = writeln!(out, "  {f}");
                }
            }
        }
        out
    }
}

/// Writes a table: first column left-aligned, others right-aligned.
fn render(out: &mut String, header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(s, "{cell:<w$}");
            } else {
                let _ = write!(s, "  {cell:>w$}");
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(out, &mut header.iter().copied());
    let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
    out.push_str(&"-".repeat(total));
    out.push('\n');
    for row in &rows {
        line(out, &mut row.iter().map(String::as_str));
    }
}

fn fixed(v: f64) -> String {
    format!("{v:.2}")
}

fn fixed_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), fixed)
}

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |r| format!("{:.2}", r * 100.0))
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

/// A CSV cell: quoted when it holds a comma, quote, or line break.
fn csv_text(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{data_object, BenchMessage, Completion, Start};
    use crate::metrics::{Aggregate, TrackReceiver};

    const T0: u64 = 1_700_000_000_000_000;

    fn sample() -> BenchReport {
        let mut done = TrackReceiver::new("sub 1 / 360p Video, \"hd\"");
        done.on_message(
            &BenchMessage::Start(Start {
                objects_per_group: 1,
                first_object_size: 100,
                remaining_object_size: 100,
                interval_us: 10_000,
            }),
            T0,
        );
        for k in 0..4u64 {
            let p = data_object(k, 0, (k * 10) as u32, T0 + k * 10_000, 100);
            done.on_payload(&p, T0 + k * 10_000 + 2_000).unwrap();
        }
        done.on_message(
            &BenchMessage::Completion(Completion {
                objects_sent: 5,
                groups_sent: 5,
                total_duration_ms: 40,
            }),
            T0 + 60_000,
        );
        let mut failed = TrackReceiver::new("sub 2 / audio");
        failed
            .on_payload(&data_object(0, 0, 0, T0, 100), T0)
            .unwrap();
        let mut agg = Aggregate::new("all");
        agg.add(&done);
        agg.add(&failed);
        BenchReport {
            title: "scenario 2 against quichub".into(),
            tracks: vec![done.report(), failed.report()],
            aggregates: vec![agg.report()],
        }
    }

    #[test]
    fn json_round_trips_through_serde_json() {
        let r = sample();
        let json = r.to_json().unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["tracks"][0]["state"], "completed");
        assert_eq!(v["tracks"][0]["lost_objects"], 1);
        assert_eq!(v["tracks"][0]["latency"]["max_ms"], 2.0);
        assert_eq!(v["tracks"][1]["state"], "failed");
        assert_eq!(v["tracks"][1]["failure"], "DATA received before START");
        assert_eq!(v["tracks"][1]["lost_objects"], serde_json::Value::Null);
        assert_eq!(v["aggregates"][0]["failed"], 1);
        assert_eq!(v["aggregates"][0]["loss_ratio"], 0.2);
    }

    #[test]
    fn csv_has_header_and_one_row_per_entry() {
        let r = sample();
        let csv = r.tracks_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], TRACK_CSV_HEADER);
        let columns = TRACK_CSV_HEADER.split(',').count();
        // The quoted label holds a comma and doubled quotes.
        assert!(
            lines[1].starts_with("\"sub 1 / 360p Video, \"\"hd\"\"\",completed,,5,5,4,4,1,0.2,")
        );
        assert_eq!(split_csv(lines[1]).len(), columns);
        assert_eq!(split_csv(lines[2]).len(), columns);
        assert!(lines[2].starts_with("sub 2 / audio,failed,DATA received before START,,,0,"));

        let csv = r.aggregates_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], AGGREGATE_CSV_HEADER);
        assert_eq!(
            split_csv(lines[1]).len(),
            AGGREGATE_CSV_HEADER.split(',').count()
        );
        assert!(lines[1].starts_with("all,2,1,1,0,5,4,4,1,0.2,0.2,"));
    }

    /// Splits a CSV line, honouring quotes.
    fn split_csv(line: &str) -> Vec<String> {
        let mut cells = vec![String::new()];
        let mut quoted = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' if quoted && chars.peek() == Some(&'"') => {
                    chars.next();
                    cells.last_mut().unwrap().push('"');
                }
                '"' => quoted = !quoted,
                ',' if !quoted => cells.push(String::new()),
                c => cells.last_mut().unwrap().push(c),
            }
        }
        cells
    }

    #[test]
    fn summary_table_lists_aggregates_tracks_and_failures() {
        let table = sample().summary_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "scenario 2 against quichub");
        assert!(lines[1].starts_with("aggregate"));
        assert!(lines[2].starts_with("---"));
        assert!(lines[3].starts_with("all "));
        assert!(lines[3].contains("20.00"), "{}", lines[3]);
        assert!(table.contains("sub 1 / 360p Video"));
        assert!(table.contains("failures:\n  sub 2 / audio: DATA received before START\n"));
        // The failure is listed once though both the track and the aggregate hold it.
        assert_eq!(table.matches("DATA received before START").count(), 1);
        // Columns line up: every row of a table is as wide as or narrower than its rule.
        let rule = lines[2].len();
        assert!(lines[1].len() <= rule && lines[3].len() <= rule);
    }

    #[test]
    fn empty_report_renders() {
        let r = BenchReport::default();
        assert_eq!(r.summary_table(), "");
        assert_eq!(r.tracks_csv(), format!("{TRACK_CSV_HEADER}\n"));
        assert!(r.to_json().unwrap().contains("\"tracks\": []"));
    }
}
