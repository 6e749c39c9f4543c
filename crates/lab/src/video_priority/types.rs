//! What the experiment's run and its report share: the run's
//! configuration, the video's frames and what one run recorded.

use std::time::Duration;

use quichub_netem::model::{LinkConfig, QueueLimit};
use quichub_netem::profile::Profile;
use serde::Serialize;

/// Everything one run is configured with.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Link rates, bit/s, one per step.
    pub steps_bps: Vec<u64>,
    /// Seconds per step.
    pub step_secs: f64,
    /// Seconds of video before the first step, left out of every figure:
    /// one GOP at the first step's rate, during which the subscriber joins
    /// (its first frames come by a joining FETCH after the catalog).
    pub warmup_s: f64,
    /// Encoder target, kbit/s.
    pub video_kbps: u64,
    /// Width, height.
    pub size: (u32, u32),
    /// Frames per second.
    pub fps: u32,
    /// GOP length, frames.
    pub gop: u32,
    /// B frames between references.
    pub bframes: u32,
    /// Play-out buffer, ms.
    pub playout_ms: u64,
    /// Publisher target latency (OBJECT_DELIVERY_TIMEOUT), ms.
    pub target_latency_ms: u64,
    /// One-way delay, ms.
    pub delay_ms: u64,
    /// Queue, ms.
    pub queue_ms: u64,
    /// Deliveries compared (`group`, `frame-type`).
    pub deliveries: Vec<String>,
    /// The encoder's command line.
    pub ffmpeg: Vec<String>,
}

impl Config {
    /// Seconds of video: the warm-up GOP, then the rate steps.
    pub fn duration(&self) -> f64 {
        self.warmup_s + self.steps_bps.len() as f64 * self.step_secs
    }

    /// The down link (relay → subscriber) of step `k`.
    pub fn down_link(&self, k: usize) -> LinkConfig {
        LinkConfig {
            delay: Duration::from_millis(self.delay_ms),
            rate_bps: Some(self.steps_bps[k.min(self.steps_bps.len() - 1)]),
            queue: QueueLimit::Time(Duration::from_millis(self.queue_ms)),
            ..Default::default()
        }
    }

    /// The emulator's starting profile: step 0 down, delay only up.
    pub fn profile(&self) -> Profile {
        Profile {
            name: "video-priority".into(),
            up: LinkConfig {
                delay: Duration::from_millis(self.delay_ms),
                ..Default::default()
            },
            down: self.down_link(0),
            source: format!(
                "lab video-priority: relay → subscriber rate stepping {} Mbit/s every {} s, \
                 {} ms drop-tail queue, {} ms one-way delay each way",
                self.steps_bps
                    .iter()
                    .map(|b| format!("{}", *b as f64 / 1e6))
                    .collect::<Vec<_>>()
                    .join(" → "),
                self.step_secs,
                self.queue_ms,
                self.delay_ms
            ),
        }
    }
}

/// H.264 picture type of a frame (from its first slice's `slice_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Kind {
    /// Intra (the GOP's keyframe).
    I,
    /// Predicted from earlier reference frames.
    P,
    /// Bi-predicted.
    B,
}

impl Kind {
    /// All, in table order.
    pub const ALL: [Kind; 3] = [Kind::I, Kind::P, Kind::B];

    /// Label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::I => "I",
            Kind::P => "P",
            Kind::B => "B",
        }
    }

    /// Index in [`Kind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One frame of the file, in decode order.
#[derive(Debug, Clone, Serialize)]
pub struct FrameInfo {
    /// Group (GOP) the publisher puts it in: one per keyframe.
    pub group: u64,
    /// Object ID within the group (decode order).
    pub object: u64,
    /// Presentation time, µs.
    pub pts: i64,
    /// Decode time, µs.
    pub dts: i64,
    /// Bytes of the codec frame.
    pub bytes: usize,
    /// Picture type.
    pub kind: Kind,
    /// `nal_ref_idc` ≠ 0: other frames may reference it.
    pub reference: bool,
    /// The frames (indices, decode order) it needs decoded first, in the
    /// fixed GOP structure the encoder was told to make (one reference
    /// picture, no B pyramid, closed GOPs): a P frame the previous reference
    /// frame of its GOP, a B frame the previous two (its past and future
    /// reference in display order), an I frame none.
    pub refs: Vec<usize>,
}

/// What one run recorded, before analysis.
#[derive(Debug, Clone, Default)]
pub struct RawRun {
    /// Unix µs of media time zero (the first catalog's clock).
    pub clock_unix_us: u64,
    /// Catalog objects received (more than one: the publisher re-anchored).
    pub catalogs: u32,
    /// Per frame (decode order): Unix µs its object arrived whole.
    pub arrivals: Vec<Option<u64>>,
    /// Per frame: the subgroup it arrived on.
    pub subgroups: Vec<Option<u64>>,
    /// Objects that matched no frame of the file (by group, object, PTS).
    pub unmatched: u64,
    /// Objects of the first group that came by the joining FETCH (sent
    /// before the subscription reached the relay).
    pub fetched: u64,
    /// Subgroup streams reset (not ended cleanly) on the way.
    pub resets: u64,
    /// Subgroup streams that ended cleanly.
    pub streams: u64,
    /// PUBLISH_DONE arrived.
    pub done: bool,
    /// Unix µs of each rate step's start (step 0: the publisher's start
    /// plus the warm-up; its rate held from the start).
    pub steps_unix_us: Vec<u64>,
    /// The emulator's down-direction counters over the run: packets the
    /// link model dropped (queue overflow), and delivered.
    pub down_dropped: u64,
    /// Down-direction packets delivered.
    pub down_delivered: u64,
}
