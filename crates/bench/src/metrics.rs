//! Receive-side metrics of one subscriber's track (draft-evens-moq-bench-00
//! §5.2, §5.5) and their aggregation over many tracks and subscribers.
//!
//! [`TrackReceiver`] is fed every decoded message of one subscribed track
//! with its arrival time, in **microseconds since the Unix epoch** (the clock
//! the publisher puts in DATA, so that one-way latency is arrival minus send
//! time). It keeps no clock of its own and its memory is bounded: a few
//! counters, two 1024-entry bitmaps and one latency histogram (2560 `u64`
//! counters, 20 KiB).
//!
//! # State machine (§5.2)
//!
//! `WaitingStart` → START → `Started` → first DATA → `Running` → COMPLETION →
//! `Completed`. DATA or COMPLETION in `WaitingStart` fails the track
//! (`Failed`, with a reason) and everything after is ignored. Repeated STARTs
//! are ignored (the first one's parameters are kept); a START after the first
//! DATA, which §5.2 forbids the publisher to send, is ignored and counted.
//! The test begins at the first DATA received: arrival times are measured
//! from it. DATA arriving after COMPLETION (a datagram overtaken by it) still
//! counts and is noted in `data_after_completion`.
//!
//! # Definitions
//!
//! A DATA's index is `k = group_number * objects_per_group + object_number`
//! (objects_per_group from START); an `object_number >= objects_per_group`
//! fails the track. With `I` = START's interval:
//!
//! - **received objects / groups**: distinct DATA indexes / group numbers.
//!   A DATA seen again within the last 1024 indexes is a duplicate; one more
//!   than 1024 behind the newest is *stale* (assumed lost). Neither counts.
//! - **receive delta**: time between consecutive counted DATA arrivals; its
//!   average and maximum.
//! - **publisher variance**: `|milliseconds_since_first_object − ⌊k·I⌋ms|`,
//!   in whole ms, so a publisher exactly on schedule scores 0 despite DATA's
//!   millisecond resolution.
//! - **receive variance**: `|(arrival − first arrival) − (k − k_first)·I|`,
//!   where `k_first` is the index of the first DATA received.
//! - **average bits per second**: bits of every counted DATA but the first,
//!   over the time from the first arrival to the last (N objects span N−1
//!   intervals); 0 until two have arrived. Object bytes are the whole MoQT
//!   object payload (the encoded DATA message).
//! - **lost objects**: COMPLETION's `objects_sent` minus received objects;
//!   **missing objects**, available before COMPLETION, counts the gaps below
//!   the highest index received.
//! - **actual duration**: first DATA arrival to last; **total duration**:
//!   COMPLETION's `total_duration`.
//! - **expected bits per second**: from START, see
//!   [`crate::profile::expected_bits_per_second`].
//! - **latency**: arrival − the send time in DATA's first 8 bytes, in an HDR
//!   histogram with 2 significant digits (1 %) up to 60 s; larger values are
//!   clamped to 60 s. The maximum is also kept exactly. A negative latency
//!   (clocks not synchronised) counts as 0 and in `clock_skew_samples`.

use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::message::{BenchMessage, Completion, Data, MessageError, Start};
use crate::profile::expected_bits_per_second;

/// Highest latency the histograms track, in microseconds (60 s).
pub const LATENCY_MAX_US: u64 = 60_000_000;
/// Significant digits of the latency histograms.
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 2;
/// How far behind the newest index (or group) duplicates are detected.
pub const REORDER_WINDOW: u64 = 1024;
/// Most failure reasons an [`Aggregate`] keeps.
pub const MAX_FAILURES_KEPT: usize = 16;

fn new_histogram() -> Histogram<u64> {
    // Constant, valid bounds: cannot fail.
    Histogram::new_with_bounds(1, LATENCY_MAX_US, LATENCY_SIGNIFICANT_DIGITS)
        .expect("valid histogram bounds")
}

/// Where a track is in §5.2's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrackState {
    /// Subscribed, no START yet.
    WaitingStart,
    /// START received, no DATA yet.
    Started,
    /// DATA flowing.
    Running,
    /// COMPLETION received.
    Completed,
    /// A protocol violation ended the test of this track.
    Failed,
}

impl TrackState {
    /// The snake_case name used in reports.
    pub fn as_str(&self) -> &'static str {
        match self {
            TrackState::WaitingStart => "waiting_start",
            TrackState::Started => "started",
            TrackState::Running => "running",
            TrackState::Completed => "completed",
            TrackState::Failed => "failed",
        }
    }
}

/// What a message did to the track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// START accepted: the track is now `Started`.
    Started,
    /// A START after the first: ignored.
    StartIgnored,
    /// DATA counted.
    Counted,
    /// DATA already received: not counted.
    Duplicate,
    /// DATA more than [`REORDER_WINDOW`] behind the newest: not counted.
    Stale,
    /// COMPLETION accepted: the track is now `Completed`.
    Completed,
    /// The message failed the track, for this reason.
    Failed(String),
    /// The track had already failed, or this was a second COMPLETION.
    Ignored,
}

/// Which of the last [`REORDER_WINDOW`] numbers were seen.
#[derive(Debug, Clone)]
struct SeenWindow {
    highest: Option<u64>,
    bits: [u64; (REORDER_WINDOW / 64) as usize],
}

/// Result of [`SeenWindow::insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    New { reordered: bool },
    Duplicate,
    Stale,
}

impl SeenWindow {
    fn new() -> Self {
        Self {
            highest: None,
            bits: [0; (REORDER_WINDOW / 64) as usize],
        }
    }

    fn slot(n: u64) -> (usize, u64) {
        let i = n % REORDER_WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    fn insert(&mut self, n: u64) -> Seen {
        let (word, bit) = Self::slot(n);
        match self.highest {
            Some(h) if n <= h => {
                if h - n >= REORDER_WINDOW {
                    Seen::Stale
                } else if self.bits[word] & bit != 0 {
                    Seen::Duplicate
                } else {
                    self.bits[word] |= bit;
                    Seen::New { reordered: true }
                }
            }
            _ => {
                let from = self.highest.map_or(0, |h| h + 1);
                if n - from >= REORDER_WINDOW || self.highest.is_none() {
                    self.bits = [0; (REORDER_WINDOW / 64) as usize];
                } else {
                    for m in from..n {
                        let (w, b) = Self::slot(m);
                        self.bits[w] &= !b;
                    }
                }
                self.highest = Some(n);
                self.bits[word] |= bit;
                Seen::New { reordered: false }
            }
        }
    }
}

/// Latency percentiles of a track or an aggregate, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencySummary {
    /// DATA objects that carried a send time.
    pub samples: u64,
    /// Median; `None` without samples.
    pub p50_ms: Option<f64>,
    /// 90th percentile.
    pub p90_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// Exact maximum.
    pub max_ms: Option<f64>,
    /// Mean (from the histogram).
    pub mean_ms: Option<f64>,
    /// Samples whose arrival preceded their send time (recorded as 0).
    pub clock_skew_samples: u64,
}

impl LatencySummary {
    fn from_histogram(h: &Histogram<u64>, max_us: u64, clock_skew_samples: u64) -> Self {
        let samples = h.len();
        let q = |quantile: f64| (samples > 0).then(|| us_to_ms(h.value_at_quantile(quantile)));
        LatencySummary {
            samples,
            p50_ms: q(0.50),
            p90_ms: q(0.90),
            p99_ms: q(0.99),
            max_ms: (samples > 0).then(|| us_to_ms(max_us)),
            mean_ms: (samples > 0).then(|| h.mean() / 1000.0),
            clock_skew_samples,
        }
    }
}

fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Table 2: a track's metrics while it runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrackProgress {
    /// The track's label.
    pub label: String,
    /// Where the track is.
    pub state: TrackState,
    /// Received objects.
    pub received_objects: u64,
    /// Received groups.
    pub received_groups: u64,
    /// Last receive delta (ms).
    pub receive_delta_ms: f64,
    /// Average receive delta (ms).
    pub average_delta_ms: f64,
    /// Maximum receive delta (ms).
    pub max_delta_ms: f64,
    /// Publisher variance of the last DATA (ms).
    pub publisher_variance_ms: f64,
    /// Receive variance of the last DATA (ms).
    pub receive_variance_ms: f64,
    /// Average bits per second received.
    pub average_bits_per_second: f64,
    /// Gaps below the highest index received.
    pub missing_objects: u64,
}

/// Table 3 and more: a track's results, available at any time (fields that
/// need COMPLETION are `None` before it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrackReport {
    /// The track's label (e.g. `sub 12 / 360p Video`).
    pub label: String,
    /// Where the track is.
    pub state: TrackState,
    /// Why the track failed.
    pub failure: Option<String>,
    /// Objects sent, from COMPLETION.
    pub objects_sent: Option<u64>,
    /// Groups sent, from COMPLETION.
    pub groups_sent: Option<u64>,
    /// Objects received.
    pub received_objects: u64,
    /// Groups received.
    pub received_groups: u64,
    /// Objects sent minus received, from COMPLETION.
    pub lost_objects: Option<u64>,
    /// Lost over sent.
    pub loss_ratio: Option<f64>,
    /// Gaps below the highest index received.
    pub missing_objects: u64,
    /// Publisher's total duration (ms), from COMPLETION.
    pub total_duration_ms: Option<u32>,
    /// First DATA arrival to last (ms).
    pub actual_duration_ms: f64,
    /// Average receive variance (ms).
    pub average_receive_variance_ms: f64,
    /// Maximum receive variance (ms).
    pub max_receive_variance_ms: f64,
    /// Average publisher variance (ms).
    pub average_publisher_variance_ms: f64,
    /// Maximum publisher variance (ms).
    pub max_publisher_variance_ms: f64,
    /// Average receive delta (ms).
    pub average_delta_ms: f64,
    /// Maximum receive delta (ms).
    pub max_delta_ms: f64,
    /// Average bits per second received.
    pub average_bits_per_second: f64,
    /// Expected bits per second, from START.
    pub expected_bits_per_second: Option<f64>,
    /// Bytes of counted DATA objects.
    pub received_bytes: u64,
    /// DATA received more than once (not counted).
    pub duplicate_objects: u64,
    /// DATA that arrived after a higher index.
    pub reordered_objects: u64,
    /// DATA too far behind to check for duplicates (not counted).
    pub stale_objects: u64,
    /// DATA that arrived after COMPLETION (counted).
    pub data_after_completion: u64,
    /// STARTs received.
    pub starts_received: u64,
    /// STARTs received after the first DATA.
    pub starts_after_data: u64,
    /// Payloads that did not decode.
    pub malformed_messages: u64,
    /// Messages ignored after failure, and repeated COMPLETIONs.
    pub ignored_messages: u64,
    /// One-way latency.
    pub latency: LatencySummary,
}

/// The receive state of one subscriber's track.
#[derive(Debug, Clone)]
pub struct TrackReceiver {
    label: String,
    state: TrackState,
    failure: Option<String>,
    start: Option<Start>,
    completion: Option<Completion>,
    starts_received: u64,
    starts_after_data: u64,
    ignored_messages: u64,
    malformed_messages: u64,

    objects: SeenWindow,
    groups: SeenWindow,
    received_objects: u64,
    received_groups: u64,
    received_bytes: u64,
    first_object_bytes: u64,
    duplicate_objects: u64,
    reordered_objects: u64,
    stale_objects: u64,
    data_after_completion: u64,

    first_arrival_us: u64,
    first_index: u64,
    last_arrival_us: u64,
    last_delta_us: u64,
    delta_sum_us: u64,
    delta_count: u64,
    max_delta_us: u64,

    last_publisher_variance_ms: u64,
    publisher_variance_sum_ms: u64,
    max_publisher_variance_ms: u64,
    last_receive_variance_us: u64,
    receive_variance_sum_us: u128,
    max_receive_variance_us: u64,

    latency: Histogram<u64>,
    max_latency_us: u64,
    clock_skew_samples: u64,
}

impl TrackReceiver {
    /// A track waiting for START; `label` names it in reports.
    pub fn new(label: impl Into<String>) -> Self {
        TrackReceiver {
            label: label.into(),
            state: TrackState::WaitingStart,
            failure: None,
            start: None,
            completion: None,
            starts_received: 0,
            starts_after_data: 0,
            ignored_messages: 0,
            malformed_messages: 0,
            objects: SeenWindow::new(),
            groups: SeenWindow::new(),
            received_objects: 0,
            received_groups: 0,
            received_bytes: 0,
            first_object_bytes: 0,
            duplicate_objects: 0,
            reordered_objects: 0,
            stale_objects: 0,
            data_after_completion: 0,
            first_arrival_us: 0,
            first_index: 0,
            last_arrival_us: 0,
            last_delta_us: 0,
            delta_sum_us: 0,
            delta_count: 0,
            max_delta_us: 0,
            last_publisher_variance_ms: 0,
            publisher_variance_sum_ms: 0,
            max_publisher_variance_ms: 0,
            last_receive_variance_us: 0,
            receive_variance_sum_us: 0,
            max_receive_variance_us: 0,
            latency: new_histogram(),
            max_latency_us: 0,
            clock_skew_samples: 0,
        }
    }

    /// The label given to [`TrackReceiver::new`].
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Where the track is.
    pub fn state(&self) -> TrackState {
        self.state
    }

    /// Why the track failed, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The first START received.
    pub fn start(&self) -> Option<&Start> {
        self.start.as_ref()
    }

    /// Whether the track is over (completed or failed).
    pub fn is_finished(&self) -> bool {
        matches!(self.state, TrackState::Completed | TrackState::Failed)
    }

    /// Decodes an object payload and feeds it; a payload that does not decode
    /// is counted in `malformed_messages` and returned as the error.
    pub fn on_payload(
        &mut self,
        payload: &Bytes,
        arrival_us: u64,
    ) -> Result<Outcome, MessageError> {
        match BenchMessage::decode(payload) {
            Ok(m) => Ok(self.on_message(&m, arrival_us)),
            Err(e) => {
                self.malformed_messages += 1;
                Err(e)
            }
        }
    }

    /// Feeds one message that arrived at `arrival_us` (µs since the Unix
    /// epoch).
    pub fn on_message(&mut self, msg: &BenchMessage, arrival_us: u64) -> Outcome {
        if self.state == TrackState::Failed {
            self.ignored_messages += 1;
            return Outcome::Ignored;
        }
        match msg {
            BenchMessage::Start(s) => self.on_start(s),
            BenchMessage::Data(d) => self.on_data(d, arrival_us),
            BenchMessage::Completion(c) => self.on_completion(c),
        }
    }

    fn fail(&mut self, reason: String) -> Outcome {
        self.state = TrackState::Failed;
        self.failure = Some(reason.clone());
        Outcome::Failed(reason)
    }

    fn on_start(&mut self, s: &Start) -> Outcome {
        self.starts_received += 1;
        match self.state {
            TrackState::WaitingStart => {
                if s.objects_per_group == 0 {
                    return self.fail("START with objects_per_group 0".into());
                }
                if s.interval_us == 0 {
                    return self.fail("START with interval 0".into());
                }
                self.start = Some(*s);
                self.state = TrackState::Started;
                Outcome::Started
            }
            TrackState::Started => Outcome::StartIgnored,
            _ => {
                self.starts_after_data += 1;
                Outcome::StartIgnored
            }
        }
    }

    fn on_completion(&mut self, c: &Completion) -> Outcome {
        match self.state {
            TrackState::WaitingStart => self.fail("COMPLETION received before START".into()),
            TrackState::Started | TrackState::Running => {
                self.completion = Some(*c);
                self.state = TrackState::Completed;
                Outcome::Completed
            }
            TrackState::Completed | TrackState::Failed => {
                self.ignored_messages += 1;
                Outcome::Ignored
            }
        }
    }

    fn on_data(&mut self, d: &Data, arrival_us: u64) -> Outcome {
        let Some(start) = self.start else {
            return self.fail("DATA received before START".into());
        };
        let opg = u64::from(start.objects_per_group);
        if d.object_number >= opg {
            return self.fail(format!(
                "DATA object_number {} >= objects_per_group {} of START",
                d.object_number, opg
            ));
        }
        let Some(index) = d
            .group_number
            .checked_mul(opg)
            .and_then(|n| n.checked_add(d.object_number))
        else {
            return self.fail(format!("DATA group_number {} too large", d.group_number));
        };
        match self.objects.insert(index) {
            Seen::Duplicate => {
                self.duplicate_objects += 1;
                return Outcome::Duplicate;
            }
            Seen::Stale => {
                self.stale_objects += 1;
                return Outcome::Stale;
            }
            Seen::New { reordered } => {
                if reordered {
                    self.reordered_objects += 1;
                }
            }
        }
        if matches!(self.groups.insert(d.group_number), Seen::New { .. }) {
            self.received_groups += 1;
        }
        let bytes = (crate::message::DATA_HEADER_LEN + d.data.len()) as u64;
        let interval_us = u64::from(start.interval_us);

        if self.state == TrackState::Completed {
            self.data_after_completion += 1;
        }
        if self.received_objects == 0 {
            // The test begins on the first DATA received (§5.2).
            if self.state == TrackState::Started {
                self.state = TrackState::Running;
            }
            self.first_arrival_us = arrival_us;
            self.first_index = index;
            self.first_object_bytes = bytes;
        } else {
            let delta = arrival_us.saturating_sub(self.last_arrival_us);
            self.last_delta_us = delta;
            self.delta_sum_us += delta;
            self.delta_count += 1;
            self.max_delta_us = self.max_delta_us.max(delta);
        }
        self.last_arrival_us = arrival_us;
        self.received_objects += 1;
        self.received_bytes += bytes;

        // Publisher variance, in whole ms against the floored schedule.
        let expected_ms = u128::from(index) * u128::from(interval_us) / 1000;
        let pv = u128::from(d.ms_since_first_object).abs_diff(expected_ms);
        let pv = u64::try_from(pv).unwrap_or(u64::MAX);
        self.last_publisher_variance_ms = pv;
        self.publisher_variance_sum_ms = self.publisher_variance_sum_ms.saturating_add(pv);
        self.max_publisher_variance_ms = self.max_publisher_variance_ms.max(pv);

        // Receive variance, in µs.
        let elapsed = i128::from(arrival_us) - i128::from(self.first_arrival_us);
        let expected = (i128::from(index) - i128::from(self.first_index)) * i128::from(interval_us);
        let rv = u64::try_from(elapsed.abs_diff(expected)).unwrap_or(u64::MAX);
        self.last_receive_variance_us = rv;
        self.receive_variance_sum_us += u128::from(rv);
        self.max_receive_variance_us = self.max_receive_variance_us.max(rv);

        if let Some(sent) = d.send_time_us() {
            let latency = match arrival_us.checked_sub(sent) {
                Some(l) => l,
                None => {
                    self.clock_skew_samples += 1;
                    0
                }
            };
            self.latency.saturating_record(latency);
            self.max_latency_us = self.max_latency_us.max(latency);
        }
        Outcome::Counted
    }

    fn actual_duration_us(&self) -> u64 {
        if self.received_objects == 0 {
            0
        } else {
            self.last_arrival_us.saturating_sub(self.first_arrival_us)
        }
    }

    fn average_bps(&self) -> f64 {
        let span = self.actual_duration_us();
        if self.received_objects < 2 || span == 0 {
            return 0.0;
        }
        let bits = (self.received_bytes - self.first_object_bytes) as f64 * 8.0;
        bits * 1_000_000.0 / span as f64
    }

    fn average_delta_ms(&self) -> f64 {
        if self.delta_count == 0 {
            0.0
        } else {
            self.delta_sum_us as f64 / self.delta_count as f64 / 1000.0
        }
    }

    fn missing_objects(&self) -> u64 {
        self.objects
            .highest
            .map_or(0, |h| (h + 1).saturating_sub(self.received_objects))
    }

    /// Table 2, now.
    pub fn progress(&self) -> TrackProgress {
        TrackProgress {
            label: self.label.clone(),
            state: self.state,
            received_objects: self.received_objects,
            received_groups: self.received_groups,
            receive_delta_ms: us_to_ms(self.last_delta_us),
            average_delta_ms: self.average_delta_ms(),
            max_delta_ms: us_to_ms(self.max_delta_us),
            publisher_variance_ms: self.last_publisher_variance_ms as f64,
            receive_variance_ms: us_to_ms(self.last_receive_variance_us),
            average_bits_per_second: self.average_bps(),
            missing_objects: self.missing_objects(),
        }
    }

    /// Table 3 and the rest, now.
    pub fn report(&self) -> TrackReport {
        let n = self.received_objects;
        let avg = |sum: f64| if n == 0 { 0.0 } else { sum / n as f64 };
        let lost = self.completion.map(|c| c.objects_sent.saturating_sub(n));
        TrackReport {
            label: self.label.clone(),
            state: self.state,
            failure: self.failure.clone(),
            objects_sent: self.completion.map(|c| c.objects_sent),
            groups_sent: self.completion.map(|c| c.groups_sent),
            received_objects: n,
            received_groups: self.received_groups,
            lost_objects: lost,
            loss_ratio: self.completion.and_then(|c| {
                (c.objects_sent > 0).then(|| lost.unwrap_or(0) as f64 / c.objects_sent as f64)
            }),
            missing_objects: self.missing_objects(),
            total_duration_ms: self.completion.map(|c| c.total_duration_ms),
            actual_duration_ms: us_to_ms(self.actual_duration_us()),
            average_receive_variance_ms: avg(self.receive_variance_sum_us as f64) / 1000.0,
            max_receive_variance_ms: us_to_ms(self.max_receive_variance_us),
            average_publisher_variance_ms: avg(self.publisher_variance_sum_ms as f64),
            max_publisher_variance_ms: self.max_publisher_variance_ms as f64,
            average_delta_ms: self.average_delta_ms(),
            max_delta_ms: us_to_ms(self.max_delta_us),
            average_bits_per_second: self.average_bps(),
            expected_bits_per_second: self.start.map(|s| {
                expected_bits_per_second(
                    s.first_object_size,
                    s.remaining_object_size,
                    u64::from(s.objects_per_group),
                    s.interval_us,
                )
            }),
            received_bytes: self.received_bytes,
            duplicate_objects: self.duplicate_objects,
            reordered_objects: self.reordered_objects,
            stale_objects: self.stale_objects,
            data_after_completion: self.data_after_completion,
            starts_received: self.starts_received,
            starts_after_data: self.starts_after_data,
            malformed_messages: self.malformed_messages,
            ignored_messages: self.ignored_messages,
            latency: LatencySummary::from_histogram(
                &self.latency,
                self.max_latency_us,
                self.clock_skew_samples,
            ),
        }
    }
}

/// Totals over many tracks (e.g. every subscriber of one profile track).
#[derive(Debug, Clone)]
pub struct Aggregate {
    label: String,
    tracks: u64,
    completed: u64,
    failed: u64,
    with_data: u64,
    objects_sent: u64,
    received_objects: u64,
    received_groups: u64,
    lost_objects: u64,
    received_bytes: u64,
    duplicate_objects: u64,
    reordered_objects: u64,
    stale_objects: u64,
    malformed_messages: u64,
    worst_loss: Option<(f64, String)>,
    sum_avg_receive_variance_ms: f64,
    max_receive_variance_ms: f64,
    sum_avg_publisher_variance_ms: f64,
    max_publisher_variance_ms: f64,
    sum_avg_delta_ms: f64,
    max_delta_ms: f64,
    sum_bps: f64,
    min_bps: Option<f64>,
    sum_expected_bps: f64,
    latency: Histogram<u64>,
    max_latency_us: u64,
    clock_skew_samples: u64,
    failures: Vec<String>,
}

/// An [`Aggregate`]'s results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AggregateReport {
    /// The aggregate's label (e.g. `360p Video`, `all`).
    pub label: String,
    /// Tracks added.
    pub tracks: u64,
    /// Of which completed.
    pub completed: u64,
    /// Of which failed.
    pub failed: u64,
    /// Of which neither (no COMPLETION yet, e.g. it was lost).
    pub incomplete: u64,
    /// Sum of objects sent over completed tracks.
    pub objects_sent: u64,
    /// Sum of objects received over all tracks.
    pub received_objects: u64,
    /// Sum of groups received.
    pub received_groups: u64,
    /// Sum of lost objects over completed tracks.
    pub lost_objects: u64,
    /// `lost_objects / objects_sent`.
    pub loss_ratio: Option<f64>,
    /// The highest loss ratio of a completed track.
    pub worst_loss_ratio: Option<f64>,
    /// The track with that loss ratio.
    pub worst_loss_track: Option<String>,
    /// Sum of bytes received.
    pub received_bytes: u64,
    /// Sum of duplicates.
    pub duplicate_objects: u64,
    /// Sum of reordered objects.
    pub reordered_objects: u64,
    /// Sum of stale objects.
    pub stale_objects: u64,
    /// Sum of malformed payloads.
    pub malformed_messages: u64,
    /// Mean over tracks with data of their average receive variance (ms).
    pub mean_receive_variance_ms: f64,
    /// Largest receive variance of any track (ms).
    pub max_receive_variance_ms: f64,
    /// Mean over tracks with data of their average publisher variance (ms).
    pub mean_publisher_variance_ms: f64,
    /// Largest publisher variance of any track (ms).
    pub max_publisher_variance_ms: f64,
    /// Mean over tracks with data of their average receive delta (ms).
    pub mean_delta_ms: f64,
    /// Largest receive delta of any track (ms).
    pub max_delta_ms: f64,
    /// Sum of the tracks' average bits per second.
    pub total_bits_per_second: f64,
    /// Mean over tracks with data of their average bits per second.
    pub mean_bits_per_second: f64,
    /// Lowest average bits per second of a track with data.
    pub min_bits_per_second: Option<f64>,
    /// Sum of the tracks' expected bits per second.
    pub expected_bits_per_second: f64,
    /// Latency over every DATA of every track.
    pub latency: LatencySummary,
    /// `label: reason` of the first failed tracks (at most 16).
    pub failures: Vec<String>,
}

impl Aggregate {
    /// An empty aggregate.
    pub fn new(label: impl Into<String>) -> Self {
        Aggregate {
            label: label.into(),
            tracks: 0,
            completed: 0,
            failed: 0,
            with_data: 0,
            objects_sent: 0,
            received_objects: 0,
            received_groups: 0,
            lost_objects: 0,
            received_bytes: 0,
            duplicate_objects: 0,
            reordered_objects: 0,
            stale_objects: 0,
            malformed_messages: 0,
            worst_loss: None,
            sum_avg_receive_variance_ms: 0.0,
            max_receive_variance_ms: 0.0,
            sum_avg_publisher_variance_ms: 0.0,
            max_publisher_variance_ms: 0.0,
            sum_avg_delta_ms: 0.0,
            max_delta_ms: 0.0,
            sum_bps: 0.0,
            min_bps: None,
            sum_expected_bps: 0.0,
            latency: new_histogram(),
            max_latency_us: 0,
            clock_skew_samples: 0,
            failures: Vec::new(),
        }
    }

    /// Adds one track's results.
    pub fn add(&mut self, track: &TrackReceiver) {
        let r = track.report();
        self.tracks += 1;
        match r.state {
            TrackState::Completed => self.completed += 1,
            TrackState::Failed => {
                self.failed += 1;
                if self.failures.len() < MAX_FAILURES_KEPT {
                    self.failures.push(format!(
                        "{}: {}",
                        r.label,
                        r.failure.as_deref().unwrap_or("failed")
                    ));
                }
            }
            _ => {}
        }
        if r.state == TrackState::Completed {
            self.objects_sent += r.objects_sent.unwrap_or(0);
            self.lost_objects += r.lost_objects.unwrap_or(0);
            if let Some(ratio) = r.loss_ratio {
                if self.worst_loss.as_ref().is_none_or(|(w, _)| ratio > *w) {
                    self.worst_loss = Some((ratio, r.label.clone()));
                }
            }
        }
        self.received_objects += r.received_objects;
        self.received_groups += r.received_groups;
        self.received_bytes += r.received_bytes;
        self.duplicate_objects += r.duplicate_objects;
        self.reordered_objects += r.reordered_objects;
        self.stale_objects += r.stale_objects;
        self.malformed_messages += r.malformed_messages;
        if r.received_objects > 0 {
            self.with_data += 1;
            self.sum_avg_receive_variance_ms += r.average_receive_variance_ms;
            self.sum_avg_publisher_variance_ms += r.average_publisher_variance_ms;
            self.sum_avg_delta_ms += r.average_delta_ms;
            self.sum_bps += r.average_bits_per_second;
            self.min_bps = Some(self.min_bps.map_or(r.average_bits_per_second, |m| {
                m.min(r.average_bits_per_second)
            }));
        }
        self.max_receive_variance_ms = self.max_receive_variance_ms.max(r.max_receive_variance_ms);
        self.max_publisher_variance_ms = self
            .max_publisher_variance_ms
            .max(r.max_publisher_variance_ms);
        self.max_delta_ms = self.max_delta_ms.max(r.max_delta_ms);
        self.sum_expected_bps += r.expected_bits_per_second.unwrap_or(0.0);
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency.add(&track.latency);
        self.max_latency_us = self.max_latency_us.max(track.max_latency_us);
        self.clock_skew_samples += track.clock_skew_samples;
    }

    /// Adds everything `other` holds (e.g. to combine per-task aggregates);
    /// `self` keeps its label.
    pub fn merge(&mut self, other: &Aggregate) {
        self.tracks += other.tracks;
        self.completed += other.completed;
        self.failed += other.failed;
        self.with_data += other.with_data;
        self.objects_sent += other.objects_sent;
        self.received_objects += other.received_objects;
        self.received_groups += other.received_groups;
        self.lost_objects += other.lost_objects;
        self.received_bytes += other.received_bytes;
        self.duplicate_objects += other.duplicate_objects;
        self.reordered_objects += other.reordered_objects;
        self.stale_objects += other.stale_objects;
        self.malformed_messages += other.malformed_messages;
        if let Some((ratio, label)) = &other.worst_loss {
            if self.worst_loss.as_ref().is_none_or(|(w, _)| ratio > w) {
                self.worst_loss = Some((*ratio, label.clone()));
            }
        }
        self.sum_avg_receive_variance_ms += other.sum_avg_receive_variance_ms;
        self.max_receive_variance_ms = self
            .max_receive_variance_ms
            .max(other.max_receive_variance_ms);
        self.sum_avg_publisher_variance_ms += other.sum_avg_publisher_variance_ms;
        self.max_publisher_variance_ms = self
            .max_publisher_variance_ms
            .max(other.max_publisher_variance_ms);
        self.sum_avg_delta_ms += other.sum_avg_delta_ms;
        self.max_delta_ms = self.max_delta_ms.max(other.max_delta_ms);
        self.sum_bps += other.sum_bps;
        self.min_bps = match (self.min_bps, other.min_bps) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.sum_expected_bps += other.sum_expected_bps;
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency.add(&other.latency);
        self.max_latency_us = self.max_latency_us.max(other.max_latency_us);
        self.clock_skew_samples += other.clock_skew_samples;
        let room = MAX_FAILURES_KEPT.saturating_sub(self.failures.len());
        self.failures
            .extend(other.failures.iter().take(room).cloned());
    }

    /// The results so far.
    pub fn report(&self) -> AggregateReport {
        let mean = |sum: f64| {
            if self.with_data == 0 {
                0.0
            } else {
                sum / self.with_data as f64
            }
        };
        AggregateReport {
            label: self.label.clone(),
            tracks: self.tracks,
            completed: self.completed,
            failed: self.failed,
            incomplete: self.tracks - self.completed - self.failed,
            objects_sent: self.objects_sent,
            received_objects: self.received_objects,
            received_groups: self.received_groups,
            lost_objects: self.lost_objects,
            loss_ratio: (self.objects_sent > 0)
                .then(|| self.lost_objects as f64 / self.objects_sent as f64),
            worst_loss_ratio: self.worst_loss.as_ref().map(|(r, _)| *r),
            worst_loss_track: self.worst_loss.as_ref().map(|(_, l)| l.clone()),
            received_bytes: self.received_bytes,
            duplicate_objects: self.duplicate_objects,
            reordered_objects: self.reordered_objects,
            stale_objects: self.stale_objects,
            malformed_messages: self.malformed_messages,
            mean_receive_variance_ms: mean(self.sum_avg_receive_variance_ms),
            max_receive_variance_ms: self.max_receive_variance_ms,
            mean_publisher_variance_ms: mean(self.sum_avg_publisher_variance_ms),
            max_publisher_variance_ms: self.max_publisher_variance_ms,
            mean_delta_ms: mean(self.sum_avg_delta_ms),
            max_delta_ms: self.max_delta_ms,
            total_bits_per_second: self.sum_bps,
            mean_bits_per_second: mean(self.sum_bps),
            min_bits_per_second: self.min_bps,
            expected_bits_per_second: self.sum_expected_bps,
            latency: LatencySummary::from_histogram(
                &self.latency,
                self.max_latency_us,
                self.clock_skew_samples,
            ),
            failures: self.failures.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{data_object, DATA_HEADER_LEN};

    const T0: u64 = 1_700_000_000_000_000;

    /// Equal up to float rounding (1e-12 relative).
    fn assert_close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * a.abs().max(b.abs()), "{a} != {b}");
    }

    fn start(opg: u32, size: u32, interval_us: u32) -> BenchMessage {
        BenchMessage::Start(Start {
            objects_per_group: opg,
            first_object_size: size,
            remaining_object_size: size,
            interval_us,
        })
    }

    fn data(group: u64, object: u64, ms: u32, sent_us: u64, size: u32) -> BenchMessage {
        BenchMessage::decode(&data_object(group, object, ms, sent_us, size)).unwrap()
    }

    fn completion(objects: u64, groups: u64, ms: u32) -> BenchMessage {
        BenchMessage::Completion(Completion {
            objects_sent: objects,
            groups_sent: groups,
            total_duration_ms: ms,
        })
    }

    /// Audio, 20 ms, 120-byte objects, one per group; 10 sent, 3 and 7 lost;
    /// each arrives exactly on schedule, 5 ms after it was sent.
    fn lossy_audio() -> TrackReceiver {
        let mut t = TrackReceiver::new("audio");
        assert_eq!(
            t.on_message(&start(1, 120, 20_000), T0 - 500_000),
            Outcome::Started
        );
        assert_eq!(
            t.on_message(&start(1, 120, 20_000), T0 - 400_000),
            Outcome::StartIgnored
        );
        assert_eq!(t.state(), TrackState::Started);
        for k in 0..10u64 {
            if k == 3 || k == 7 {
                continue;
            }
            let sent = T0 + k * 20_000;
            let m = data(k, 0, (k * 20) as u32, sent, 120);
            assert_eq!(t.on_message(&m, sent + 5_000), Outcome::Counted);
            assert_eq!(t.state(), TrackState::Running);
        }
        let p = t.progress();
        assert_eq!(
            (p.received_objects, p.received_groups, p.missing_objects),
            (8, 8, 2)
        );
        assert_eq!(p.receive_delta_ms, 20.0);
        assert_eq!(
            t.on_message(&completion(10, 10, 180), T0 + 300_000),
            Outcome::Completed
        );
        t
    }

    #[test]
    fn known_loss() {
        let t = lossy_audio();
        let r = t.report();
        assert_eq!(r.state, TrackState::Completed);
        assert_eq!((r.objects_sent, r.groups_sent), (Some(10), Some(10)));
        assert_eq!((r.received_objects, r.received_groups), (8, 8));
        assert_eq!(r.lost_objects, Some(2));
        assert_eq!(r.loss_ratio, Some(0.2));
        assert_eq!(r.total_duration_ms, Some(180));
        // First arrival k=0, last k=9: 180 ms.
        assert_eq!(r.actual_duration_ms, 180.0);
        // Deltas: 20, 40 (3 lost), 20, 20, 40 (7 lost), 20, 20 ms.
        assert_eq!(r.max_delta_ms, 40.0);
        assert_close(r.average_delta_ms, 180.0 / 7.0);
        assert_eq!(r.average_receive_variance_ms, 0.0);
        assert_eq!(r.average_publisher_variance_ms, 0.0);
        // 7 objects of 120 bytes after the first, over 0.18 s.
        assert_close(r.average_bits_per_second, 7.0 * 120.0 * 8.0 / 0.18);
        assert_eq!(r.expected_bits_per_second, Some(48_000.0));
        assert_eq!(r.received_bytes, 8 * 120);
        assert_eq!(r.starts_received, 2);
        assert_eq!(r.latency.samples, 8);
        assert_eq!(r.latency.max_ms, Some(5.0));
        let p50 = r.latency.p50_ms.unwrap();
        assert!((p50 - 5.0).abs() <= 0.05, "{p50}");
    }

    #[test]
    fn lossless_audio_matches_expected_rate() {
        let mut t = TrackReceiver::new("audio");
        t.on_message(&start(1, 120, 20_000), T0);
        for k in 0..1500u64 {
            let sent = T0 + k * 20_000;
            t.on_message(&data(k, 0, (k * 20) as u32, sent, 120), sent + 1_000);
        }
        t.on_message(&completion(1500, 1500, 29_980), T0 + 31_000_000);
        let r = t.report();
        assert_eq!(r.lost_objects, Some(0));
        assert_eq!(r.average_bits_per_second, 48_000.0);
        assert_eq!(r.expected_bits_per_second, Some(48_000.0));
        assert_eq!(r.actual_duration_ms, 29_980.0);
        assert_eq!(r.average_delta_ms, 20.0);
    }

    #[test]
    fn known_jitter() {
        let mut t = TrackReceiver::new("jitter");
        t.on_message(&start(1, 100, 20_000), T0);
        // (k, ms_since_first_object, arrival offset µs)
        let seq = [
            (0u64, 0u32, 0u64),
            (1, 20, 25_000),
            (2, 41, 38_000),
            (3, 60, 60_000),
        ];
        for (k, ms, at) in seq {
            let sent = T0 + u64::from(ms) * 1000;
            t.on_message(&data(k, 0, ms, sent, 100), T0 + 10_000 + at);
        }
        let p = t.progress();
        assert_eq!(p.receive_variance_ms, 0.0);
        assert_eq!(p.publisher_variance_ms, 0.0);
        assert_eq!(p.receive_delta_ms, 22.0);
        let r = t.report();
        // Receive variances 0, 5, 2, 0 ms; publisher 0, 0, 1, 0 ms.
        assert_eq!(r.average_receive_variance_ms, 1.75);
        assert_eq!(r.max_receive_variance_ms, 5.0);
        assert_eq!(r.average_publisher_variance_ms, 0.25);
        assert_eq!(r.max_publisher_variance_ms, 1.0);
        // Deltas 25, 13, 22.
        assert_eq!(r.average_delta_ms, 20.0);
        assert_eq!(r.max_delta_ms, 25.0);
        assert_eq!(r.actual_duration_ms, 60.0);
        // Not completed yet.
        assert_eq!(r.state, TrackState::Running);
        assert_eq!(
            (r.lost_objects, r.loss_ratio, r.objects_sent),
            (None, None, None)
        );
        assert_eq!(r.missing_objects, 0);
    }

    #[test]
    fn fractional_interval_and_groups() {
        // 33.33 ms video, 3 objects per group, first object larger.
        let mut t = TrackReceiver::new("video");
        t.on_message(
            &BenchMessage::Start(Start {
                objects_per_group: 3,
                first_object_size: 1000,
                remaining_object_size: 100,
                interval_us: 33_330,
            }),
            T0,
        );
        for k in 0..7u64 {
            let due = k * 33_330;
            let (g, o) = (k / 3, k % 3);
            let size = if o == 0 { 1000 } else { 100 };
            // Publisher exactly on time: ms field is the floor of the due time.
            let ms = (due / 1000) as u32;
            t.on_message(&data(g, o, ms, T0 + due, size), T0 + due + 2_000);
        }
        t.on_message(&completion(7, 3, 199), T0 + 300_000);
        let r = t.report();
        assert_eq!((r.received_objects, r.received_groups), (7, 3));
        assert_eq!(r.max_publisher_variance_ms, 0.0);
        assert_eq!(r.max_receive_variance_ms, 0.0);
        assert_eq!(r.actual_duration_ms, 199.98);
        assert_eq!(r.received_bytes, 3 * 1000 + 4 * 100);
        let expected = (1000.0 + 2.0 * 100.0) / 3.0 * 8.0 * 1e6 / 33_330.0;
        assert_eq!(r.expected_bits_per_second, Some(expected));
    }

    #[test]
    fn first_data_lost_sets_the_origin() {
        let mut t = TrackReceiver::new("late");
        t.on_message(&start(1, 50, 10_000), T0);
        // 0 and 1 lost; 2 arrives first, 3 is 3 ms late.
        t.on_message(&data(2, 0, 20, T0 + 20_000, 50), T0 + 21_000);
        t.on_message(&data(3, 0, 30, T0 + 30_000, 50), T0 + 34_000);
        let r = t.report();
        assert_eq!(r.max_receive_variance_ms, 3.0);
        assert_eq!(r.missing_objects, 2);
        assert_close(r.average_bits_per_second, 50.0 * 8.0 / 0.013);
    }

    #[test]
    fn data_before_start_fails() {
        let mut t = TrackReceiver::new("x");
        let out = t.on_message(&data(0, 0, 0, T0, 100), T0);
        assert_eq!(out, Outcome::Failed("DATA received before START".into()));
        assert_eq!(t.state(), TrackState::Failed);
        assert!(t.is_finished());
        // Everything after is ignored, START included.
        assert_eq!(t.on_message(&start(1, 100, 20_000), T0), Outcome::Ignored);
        assert_eq!(t.on_message(&data(1, 0, 20, T0, 100), T0), Outcome::Ignored);
        let r = t.report();
        assert_eq!(r.failure.as_deref(), Some("DATA received before START"));
        assert_eq!((r.received_objects, r.ignored_messages), (0, 2));

        let mut t = TrackReceiver::new("y");
        assert!(matches!(
            t.on_message(&completion(1, 1, 0), T0),
            Outcome::Failed(_)
        ));
        assert_eq!(t.failure(), Some("COMPLETION received before START"));
    }

    #[test]
    fn bad_start_and_bad_data_fail() {
        let mut t = TrackReceiver::new("x");
        assert!(matches!(
            t.on_message(&start(0, 1, 1), T0),
            Outcome::Failed(_)
        ));
        let mut t = TrackReceiver::new("x");
        assert!(matches!(
            t.on_message(&start(1, 1, 0), T0),
            Outcome::Failed(_)
        ));
        let mut t = TrackReceiver::new("x");
        t.on_message(&start(3, 100, 1000), T0);
        assert!(matches!(
            t.on_message(&data(0, 3, 0, T0, 100), T0),
            Outcome::Failed(_)
        ));
        let mut t = TrackReceiver::new("x");
        t.on_message(&start(3, 100, 1000), T0);
        assert!(matches!(
            t.on_message(&data(u64::MAX, 0, 0, T0, 100), T0),
            Outcome::Failed(_)
        ));
    }

    #[test]
    fn start_after_data_and_repeated_completion_are_ignored() {
        let mut t = lossy_audio();
        assert_eq!(t.on_message(&start(2, 1, 1), T0), Outcome::StartIgnored);
        assert_eq!(t.on_message(&completion(1, 1, 1), T0), Outcome::Ignored);
        assert_eq!(t.start().unwrap().objects_per_group, 1);
        let r = t.report();
        assert_eq!((r.starts_after_data, r.ignored_messages), (1, 1));
        assert_eq!(r.objects_sent, Some(10));
        // A late datagram (7) after COMPLETION still counts.
        let sent = T0 + 7 * 20_000;
        assert_eq!(
            t.on_message(&data(7, 0, 140, sent, 120), T0 + 400_000),
            Outcome::Counted
        );
        let r = t.report();
        assert_eq!(
            (r.received_objects, r.lost_objects, r.data_after_completion),
            (9, Some(1), 1)
        );
        assert_eq!(r.reordered_objects, 1);
    }

    #[test]
    fn duplicates_reordering_and_stale() {
        let mut t = TrackReceiver::new("dup");
        t.on_message(&start(1, 40, 1000), T0);
        let m0 = data(0, 0, 0, T0, 40);
        assert_eq!(t.on_message(&m0, T0 + 100), Outcome::Counted);
        assert_eq!(t.on_message(&m0, T0 + 200), Outcome::Duplicate);
        assert_eq!(
            t.on_message(&data(2, 0, 2, T0 + 2000, 40), T0 + 2100),
            Outcome::Counted
        );
        assert_eq!(
            t.on_message(&data(1, 0, 1, T0 + 1000, 40), T0 + 2200),
            Outcome::Counted
        );
        assert_eq!(
            t.on_message(&data(1, 0, 1, T0 + 1000, 40), T0 + 2300),
            Outcome::Duplicate
        );
        // Jump far ahead; then 3 is more than 1024 behind.
        assert_eq!(
            t.on_message(&data(2000, 0, 0, T0, 40), T0 + 3000),
            Outcome::Counted
        );
        assert_eq!(
            t.on_message(&data(3, 0, 3, T0, 40), T0 + 3100),
            Outcome::Stale
        );
        // 1000 is within the window and new; after it, a duplicate of it.
        assert_eq!(
            t.on_message(&data(1000, 0, 0, T0, 40), T0 + 3200),
            Outcome::Counted
        );
        assert_eq!(
            t.on_message(&data(1000, 0, 0, T0, 40), T0 + 3300),
            Outcome::Duplicate
        );
        let r = t.report();
        assert_eq!(
            (
                r.received_objects,
                r.received_groups,
                r.duplicate_objects,
                r.stale_objects
            ),
            (5, 5, 3, 1)
        );
        assert_eq!(r.reordered_objects, 2);
        assert_eq!(r.received_bytes, 5 * 40);
        // Duplicates do not move the delta: 2000, 100, 800, 200 µs.
        assert_eq!(r.max_delta_ms, 2.0);
        assert_eq!(r.missing_objects, 2001 - 5);
    }

    #[test]
    fn seen_window_clears_on_advance() {
        let mut w = SeenWindow::new();
        assert_eq!(w.insert(5), Seen::New { reordered: false });
        // 5 + 1024 shares 5's slot: the advance clears it.
        assert_eq!(w.insert(5 + REORDER_WINDOW), Seen::New { reordered: false });
        assert_eq!(w.insert(5), Seen::Stale);
        assert_eq!(w.insert(6 + REORDER_WINDOW), Seen::New { reordered: false });
        assert_eq!(w.insert(6), Seen::Stale);
        assert_eq!(w.insert(7), Seen::New { reordered: true });
        assert_eq!(w.insert(REORDER_WINDOW + 4), Seen::New { reordered: true });
        assert_eq!(w.insert(REORDER_WINDOW + 4), Seen::Duplicate);
    }

    #[test]
    fn latency_clock_skew_short_data_and_malformed() {
        let mut t = TrackReceiver::new("skew");
        t.on_message(&start(1, 40, 1000), T0);
        // Arrives "before" it was sent.
        t.on_message(&data(0, 0, 0, T0 + 5_000, 40), T0);
        // DATA without room for a send time: counted, no latency sample.
        let short = BenchMessage::Data(Data {
            group_number: 1,
            object_number: 0,
            ms_since_first_object: 1,
            data: Bytes::from_static(b"abc"),
        });
        assert_eq!(t.on_message(&short, T0 + 1000), Outcome::Counted);
        // Latency above 60 s is clamped in the histogram, exact in max.
        t.on_message(&data(2, 0, 2, T0, 40), T0 + 2000 + 90_000_000);
        assert!(t.on_payload(&Bytes::from_static(&[9, 9]), T0).is_err());
        assert_eq!(
            t.on_payload(&data_object(3, 0, 3, T0, 40), T0 + 3000),
            Ok(Outcome::Counted)
        );
        let r = t.report();
        assert_eq!(r.received_objects, 4);
        assert_eq!(
            r.received_bytes,
            40 + (DATA_HEADER_LEN as u64 + 3) + 40 + 40
        );
        assert_eq!(r.latency.samples, 3);
        assert_eq!(r.latency.clock_skew_samples, 1);
        assert_eq!(r.latency.max_ms, Some(90_002.0));
        assert!(r.latency.p99_ms.unwrap() <= 60_000.0 * 1.01);
        assert_eq!(r.malformed_messages, 1);
    }

    #[test]
    fn empty_track_reports() {
        let t = TrackReceiver::new("empty");
        let r = t.report();
        assert_eq!(r.state, TrackState::WaitingStart);
        assert_eq!(r.latency.p50_ms, None);
        assert_eq!(r.average_bits_per_second, 0.0);
        assert_eq!(r.expected_bits_per_second, None);
        // COMPLETION right after START: everything lost.
        let mut t = TrackReceiver::new("none");
        t.on_message(&start(1, 120, 20_000), T0);
        t.on_message(&completion(5, 5, 80), T0);
        let r = t.report();
        assert_eq!((r.lost_objects, r.loss_ratio), (Some(5), Some(1.0)));
    }

    #[test]
    fn aggregation() {
        let mut agg = Aggregate::new("audio");
        let a = lossy_audio();
        let mut b = TrackReceiver::new("audio 2");
        b.on_message(&start(1, 120, 20_000), T0);
        for k in 0..10u64 {
            let sent = T0 + k * 20_000;
            // 2 ms late from object 5 on, latency 1 ms + that.
            let late = if k >= 5 { 2_000 } else { 0 };
            b.on_message(&data(k, 0, (k * 20) as u32, sent, 120), sent + 1_000 + late);
        }
        b.on_message(&completion(10, 10, 180), T0 + 300_000);
        let mut failed = TrackReceiver::new("broken");
        failed.on_message(&data(0, 0, 0, T0, 120), T0);
        let mut running = TrackReceiver::new("running");
        running.on_message(&start(1, 120, 20_000), T0);
        for t in [&a, &b, &failed, &running] {
            agg.add(t);
        }
        let r = agg.report();
        assert_eq!(
            (r.tracks, r.completed, r.failed, r.incomplete),
            (4, 2, 1, 1)
        );
        assert_eq!(
            (r.objects_sent, r.received_objects, r.lost_objects),
            (20, 18, 2)
        );
        assert_eq!(r.loss_ratio, Some(0.1));
        assert_eq!(r.worst_loss_ratio, Some(0.2));
        assert_eq!(r.worst_loss_track.as_deref(), Some("audio"));
        assert_eq!(r.received_groups, 18);
        assert_eq!(r.received_bytes, 18 * 120);
        // b: receive variances 0,0,0,0,0,2,2,2,2,2 ms → average 1; a: 0.
        assert_eq!(r.mean_receive_variance_ms, 0.5);
        assert_eq!(r.max_receive_variance_ms, 2.0);
        assert_eq!(r.max_delta_ms, 40.0);
        assert_eq!(r.expected_bits_per_second, 3.0 * 48_000.0);
        let bps_b = 9.0 * 120.0 * 8.0 / 0.182;
        let bps_a = 7.0 * 120.0 * 8.0 / 0.18;
        assert_close(r.total_bits_per_second, bps_a + bps_b);
        assert_close(r.min_bits_per_second.unwrap(), bps_b.min(bps_a));
        assert_close(r.mean_bits_per_second, (bps_a + bps_b) / 2.0);
        assert_eq!(
            r.failures,
            vec!["broken: DATA received before START".to_string()]
        );
        // Merged latency: a 8 × 5 ms, b 5 × 1 ms + 5 × 3 ms.
        assert_eq!(r.latency.samples, 18);
        assert_eq!(r.latency.max_ms, Some(5.0));
        let p50 = r.latency.p50_ms.unwrap();
        assert!((p50 - 3.0).abs() <= 0.03, "{p50}");
        let mean = r.latency.mean_ms.unwrap();
        assert!((mean - (40.0 + 5.0 + 15.0) / 18.0).abs() < 0.05, "{mean}");
    }

    #[test]
    fn merging_aggregates_equals_adding_every_track() {
        let a = lossy_audio();
        let mut b = TrackReceiver::new("b");
        b.on_message(&start(1, 120, 20_000), T0);
        for k in 0..5u64 {
            let sent = T0 + k * 20_000;
            b.on_message(
                &data(k, 0, (k * 20) as u32, sent, 120),
                sent + 3_000 + k * 100,
            );
        }
        let mut c = TrackReceiver::new("c");
        c.on_message(&completion(1, 1, 1), T0);

        let mut all = Aggregate::new("all");
        for t in [&a, &b, &c] {
            all.add(t);
        }
        let mut left = Aggregate::new("all");
        left.add(&a);
        let mut right = Aggregate::new("right");
        right.add(&b);
        right.add(&c);
        left.merge(&right);
        assert_eq!(left.report(), all.report());
        // Merging an empty aggregate changes nothing.
        left.merge(&Aggregate::new("empty"));
        assert_eq!(left.report(), all.report());
    }

    #[test]
    fn failures_kept_are_bounded() {
        let mut agg = Aggregate::new("many");
        for i in 0..40 {
            let mut t = TrackReceiver::new(format!("t{i}"));
            t.on_message(&completion(1, 1, 1), T0);
            agg.add(&t);
        }
        let r = agg.report();
        assert_eq!(r.failed, 40);
        assert_eq!(r.failures.len(), MAX_FAILURES_KEPT);
    }

    #[test]
    fn histogram_bounds_are_valid() {
        let h = new_histogram();
        assert!(h.high() >= LATENCY_MAX_US);
        // Bounded memory: at most 4096 u64 counters (32 KiB) per track.
        assert!(h.distinct_values() <= 4096);
    }
}
