//! The imu experiment's per-run metrics, per sensor.

use serde::Serialize;

use super::run::{RawRun, SENSORS};
use crate::common::stats::Spread;

/// One sensor's metrics in one run.
#[derive(Debug, Clone, Serialize)]
pub struct SensorRun {
    /// Sensor name.
    pub sensor: String,
    /// Samples generated.
    pub sent: u64,
    /// Samples handed to the transport.
    pub written: u64,
    /// Distinct samples received by the deadline.
    pub received: u64,
    /// Duplicate arrivals (ignored in `received`).
    pub duplicates: u64,
    /// Received samples per one-second bin of arrival time since generation start.
    pub per_second: Vec<u64>,
    /// Received samples divided by the generation duration.
    pub rate: f64,
    /// Latency percentiles in milliseconds (`None` when nothing arrived).
    pub p50_ms: Option<f64>,
    /// 99th percentile latency in milliseconds.
    pub p99_ms: Option<f64>,
    /// Largest latency in milliseconds.
    pub max_ms: Option<f64>,
    /// Median latency (ms) of the received samples generated in each
    /// [`LATENCY_BIN_S`] bin of generation time; `None` where none arrived.
    pub latency_over_time_ms: Vec<Option<f64>>,
}

/// Width of the latency-over-time bins, seconds of generation time.
pub const LATENCY_BIN_S: f64 = 0.25;

/// Computes per-sensor metrics of a run; `bins` one-second bins.
pub fn sensor_metrics(raw: &RawRun, duration_s: f64, bins: usize) -> Vec<SensorRun> {
    (0..SENSORS.len())
        .map(|s| {
            let mut seen = std::collections::HashSet::new();
            let mut per_second = vec![0u64; bins.max(1)];
            let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
                .expect("valid bounds");
            let mut dups = 0;
            let nbins = (duration_s / LATENCY_BIN_S).ceil().max(1.0) as usize;
            let mut lat_bins: Vec<Vec<f64>> = vec![Vec::new(); nbins];
            for a in raw.arrivals.iter().filter(|a| a.sensor == s) {
                if !seen.insert(a.seq) {
                    dups += 1;
                    continue;
                }
                let bin = (a.recv_us.saturating_sub(raw.t0_us) / 1_000_000) as usize;
                let last = per_second.len() - 1;
                per_second[bin.min(last)] += 1;
                let _ = hist.record(a.recv_us.saturating_sub(a.sent_us).max(1));
                let gen_s = a.sent_us.saturating_sub(raw.t0_us) as f64 / 1e6;
                let lb = ((gen_s / LATENCY_BIN_S) as usize).min(nbins - 1);
                lat_bins[lb].push(a.recv_us.saturating_sub(a.sent_us) as f64 / 1000.0);
            }
            let received = seen.len() as u64;
            let q = |p: f64| (received > 0).then(|| hist.value_at_quantile(p) as f64 / 1000.0);
            SensorRun {
                sensor: SENSORS[s].to_string(),
                sent: raw.sent[s],
                written: raw.written[s],
                received,
                duplicates: dups,
                per_second,
                rate: received as f64 / duration_s.max(1e-9),
                p50_ms: q(0.5),
                p99_ms: q(0.99),
                max_ms: (received > 0).then(|| hist.max() as f64 / 1000.0),
                latency_over_time_ms: lat_bins
                    .iter()
                    .map(|v| Spread::of(v).map(|s| s.median))
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imu::run::{decode_sample, encode_sample, Arrival};

    #[test]
    fn sample_roundtrip_and_bins_add_up() {
        let p = encode_sample(1, 42, 64);
        assert_eq!(p.len(), 64);
        let (sensor, seq, sent) = decode_sample(&p).unwrap();
        assert_eq!((sensor, seq), (1, 42));
        let raw = RawRun {
            t0_us: sent,
            sent: [2, 1],
            written: [2, 1],
            arrivals: vec![
                Arrival {
                    sensor: 0,
                    seq: 0,
                    sent_us: sent,
                    recv_us: sent + 500,
                },
                Arrival {
                    sensor: 0,
                    seq: 1,
                    sent_us: sent,
                    recv_us: sent + 9_000_000,
                },
                Arrival {
                    sensor: 0,
                    seq: 1,
                    sent_us: sent,
                    recv_us: sent + 9_000_000,
                },
                Arrival {
                    sensor: 1,
                    seq: 0,
                    sent_us: sent,
                    recv_us: sent + 1_500_000,
                },
            ],
        };
        let m = sensor_metrics(&raw, 2.0, 3);
        assert_eq!(m[0].received, 2);
        assert_eq!(m[0].duplicates, 1);
        assert_eq!(
            m[0].per_second,
            vec![1, 0, 1],
            "late arrivals land in the last bin"
        );
        assert_eq!(m[1].per_second, vec![0, 1, 0]);
        assert_eq!(m[0].rate, 1.0);
        // Generation-time bins of 0.25 s over 2 s; all samples sent at t0.
        assert_eq!(m[0].latency_over_time_ms.len(), 8);
        assert_eq!(m[0].latency_over_time_ms[0], Some(4500.25));
        assert_eq!(m[0].latency_over_time_ms[1], None);
        assert!(decode_sample(&p[..10]).is_none());
    }
}
