//! What the experiment's run and its report share: the study's numbers,
//! the protocols and subscribers, the source video and the records of runs.

use std::collections::HashMap;

use anyhow::Context;

use serde::Serialize;

/// Frames per second of the source.
pub const FPS: u32 = 30;
/// Video bit rate of the source, bit/s (the paper's 8 Mbit/s).
pub const BITRATE: u64 = 8_000_000;
/// The relay's UDP port, nginx's RTMP and HTTP ports (server namespace).
pub const MOQ_PORT: u16 = 4443;
/// nginx RTMP port.
pub const RTMP_PORT: u16 = 1935;
/// nginx HTTP port.
pub const HTTP_PORT: u16 = 8088;
/// A wait for a frame longer than this counts as a stall.
pub const STALL_MS: f64 = 50.0;

/// One way of carrying the video.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Protocol {
    /// ffmpeg → quichub's publisher → quichub's relay → quichub's player
    /// (MoQT over QUIC; `quichub pub`, `relay` and `sub`'s libraries).
    Moq,
    /// ffmpeg → RTMP → nginx-rtmp → HLS over HTTP/1.1 (TCP), 1 s fragments,
    /// a 4 s playlist (low-latency tuning).
    HlsLow,
    /// The same with nginx-rtmp's default HLS settings (5 s fragments, a 30 s
    /// playlist).
    HlsDefault,
}

impl Protocol {
    /// Every protocol, in table order.
    pub const ALL: [Protocol; 3] = [Protocol::Moq, Protocol::HlsLow, Protocol::HlsDefault];

    /// Label in tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Moq => "moq",
            Protocol::HlsLow => "rtmp-hls-1s",
            Protocol::HlsDefault => "rtmp-hls-default",
        }
    }

    /// What the pipeline is.
    pub fn describe(self) -> &'static str {
        match self {
            Protocol::Moq => "ffmpeg-encoded fMP4 → `quichub pub --format hang --no-pace` → `quichub relay` → `quichub sub --output -` (MoQT draft over QUIC; one group per 1 s GOP, object delivery timeout 2 s)",
            Protocol::HlsLow => "`ffmpeg -c copy -f flv` → nginx 1.22 + nginx-rtmp (RTMP over TCP) → HLS, `hls_fragment 1s; hls_playlist_length 4s` → player over HTTP/1.1 keep-alive (TCP)",
            Protocol::HlsDefault => "as rtmp-hls-1s with nginx-rtmp's default HLS settings (`hls_fragment 5s`, `hls_playlist_length 30s`)",
        }
    }

    pub(super) fn app(self) -> &'static str {
        match self {
            Protocol::Moq => "",
            Protocol::HlsLow => "ll",
            Protocol::HlsDefault => "def",
        }
    }

    /// Parses a label.
    pub fn parse(s: &str) -> anyhow::Result<Protocol> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.label() == s.trim())
            .with_context(|| {
                format!("unknown protocol {s:?}: use moq, rtmp-hls-1s or rtmp-hls-default")
            })
    }
}

/// Where a subscriber sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Role {
    /// Server namespace, beside the relay / nginx: no impairment.
    Local,
    /// Client namespace, across the emulated link.
    Remote,
}

impl Role {
    /// Label.
    pub fn label(self) -> &'static str {
        match self {
            Role::Local => "local",
            Role::Remote => "remote",
        }
    }
}

/// The run's timing.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RunConfig {
    /// Seconds of video published.
    pub duration_s: f64,
    /// Seconds after the stream start when the subscribers join.
    pub join_s: f64,
}

/// The source video, split into what the publisher is fed.
pub struct Source {
    pub(super) data: Vec<u8>,
    pub(super) init: std::ops::Range<usize>,
    pub(super) chunks: Vec<std::ops::Range<usize>>,
    /// Per frame: (pts µs from the first frame, keyframe, bytes).
    pub frames: Vec<SrcFrame>,
    pub(super) by_hash: HashMap<u64, usize>,
    /// Mean video bit rate, bit/s.
    pub bitrate_bps: f64,
}

/// One frame of the source.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SrcFrame {
    /// Presentation time, µs after frame 0.
    pub pts_us: i64,
    /// Starts a GOP.
    pub keyframe: bool,
    /// Bytes of the coded frame.
    pub size: usize,
}

/// One subscriber's figures.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SubRecord {
    /// local or remote.
    pub role: &'static str,
    /// Join time, ms after the stream start (frame 0's encode time).
    pub join_ms: f64,
    /// Join → first decodable frame (a keyframe) held, ms.
    pub startup_ms: Option<f64>,
    /// First frame the subscriber got (source index).
    pub first_frame: Option<usize>,
    /// Frames from the first one it got to the end of the stream.
    pub frames_expected: usize,
    /// Distinct frames of that range it got.
    pub frames_delivered: usize,
    /// Frames of that range it never got (expected − delivered).
    pub frames_missing: usize,
    /// Frames it got twice or more (extra copies).
    pub duplicates: usize,
    /// Frames that matched no source frame.
    pub unknown: usize,
    /// Source bytes of the distinct frames delivered.
    pub video_bytes: u64,
    /// Glass-to-glass latency, encode time → frame held, ms: median.
    pub g2g_median_ms: Option<f64>,
    /// 95th percentile.
    pub g2g_p95_ms: Option<f64>,
    /// Largest.
    pub g2g_max_ms: Option<f64>,
    /// When it held its last frame, ms after the stream start.
    pub last_frame_ms: Option<f64>,
    /// Waits of more than [`STALL_MS`] for a frame after playback started.
    pub stalls: usize,
    /// Total time playback waited for frames, ms (every wait).
    pub stall_ms: f64,
    /// Bytes of the subscriber's flow on the emulated link, both directions,
    /// as sent into it (retransmissions and packets the link dropped
    /// included); remote only.
    pub wire_bytes: Option<u64>,
    /// wire_bytes / video_bytes.
    pub wire_per_video_byte: Option<f64>,
    /// Mean downlink throughput of the subscriber's flow (IP bytes sent into
    /// the link server → client and not dropped, timed as they reached the
    /// emulator), join → last frame held, Mbit/s; remote only.
    pub wire_mbps: Option<f64>,
    /// The same per second since the stream start, Mbit/s; remote only.
    pub wire_series: Vec<f64>,
    /// Source video bytes held per second since the stream start, Mbit/s.
    pub goodput_series: Vec<f64>,
    /// HLS: playlist loads and segments fetched.
    pub playlist_loads: usize,
    /// HLS: segments fetched.
    pub segments: usize,
    /// Why this subscriber failed.
    pub error: Option<String>,
}

/// One run: one protocol on one link, one repetition.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Link.
    pub link: String,
    /// Protocol label.
    pub protocol: &'static str,
    /// Repetition.
    pub rep: u32,
    /// Frames written into the publisher.
    pub frames_fed: usize,
    /// Latest a frame was written after its encode time, ms (pipe back-pressure).
    pub feed_late_max_ms: f64,
    /// Packets the capture could not record.
    pub capture_missed: u64,
    /// The subscribers.
    pub subs: Vec<SubRecord>,
    /// Why the run failed.
    pub error: Option<String>,
}

impl RunRecord {
    /// A progress line.
    pub fn one_line(&self) -> String {
        let mut s = format!("{} {:<16} rep {}", self.link, self.protocol, self.rep);
        if let Some(e) = &self.error {
            s.push_str(&format!(": FAILED: {e}"));
        }
        for sub in &self.subs {
            s.push_str(&format!(
                " | {} start {} ms, g2g {} ms, {}/{} frames, {} stalls{}{}",
                sub.role,
                sub.startup_ms.map_or("–".into(), |v| format!("{v:.0}")),
                sub.g2g_median_ms.map_or("–".into(), |v| format!("{v:.0}")),
                sub.frames_delivered,
                sub.frames_expected,
                sub.stalls,
                sub.wire_mbps
                    .map_or(String::new(), |v| format!(", {v:.2} Mbit/s")),
                sub.error
                    .as_ref()
                    .map_or(String::new(), |e| format!(", ERROR {e}")),
            ));
        }
        s
    }
}
