//! `quichub pub --broadcast` and `quichub sub --broadcast`: real media.
//!
//! Publishing: fMP4/CMAF or MPEG-TS (a file or stdin) is demuxed by
//! `quichub-media` and published as a hang broadcast (a `catalog.json`
//! track) or an MSF one (a `catalog` track, LOC or CMAF packaging), with
//! one track per rendition, one group per GOP. Subscribing: whichever
//! catalog track the broadcast has is read, the renditions subscribed, and
//! fragmented MP4 written for `ffplay -` or a file. This module only moves
//! bytes and keeps time; the packaging is the media crate's.

use quichub_media::{hang, msf};

mod publish;
mod reorder;
mod subscribe;

pub use publish::publish;
pub use subscribe::subscribe;

/// Media packaging on the wire.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// moq-dev's hang: catalog.json + one timestamped frame per object.
    Hang,
    /// hang with CMAF fragments as objects (init segments in the catalog).
    HangCmaf,
    /// IETF MSF (draft-ietf-moq-msf-01): a `catalog` track, LOC packaging
    /// (draft-ietf-moq-loc-04): one codec frame per object, timestamp,
    /// frame marking and decoder config as object properties.
    Msf,
    /// IETF CMSF (draft-ietf-moq-cmsf-01): the MSF catalog with `cmaf`
    /// packaging, one CMAF chunk per object, init segments in the catalog.
    Cmsf,
}

impl Format {
    fn is_msf(self) -> bool {
        matches!(self, Format::Msf | Format::Cmsf)
    }

    fn catalog_track(self) -> &'static str {
        if self.is_msf() {
            msf::CATALOG_TRACK
        } else {
            hang::CATALOG_TRACK
        }
    }
}

/// Container of the input.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InputFormat {
    /// Judge by the first bytes.
    #[default]
    Auto,
    /// Fragmented MP4 / CMAF.
    Fmp4,
    /// MPEG transport stream.
    Ts,
}

/// How frames of a GOP are spread over subgroups (streams).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Delivery {
    /// One subgroup (one stream) per group: frames arrive in order.
    #[default]
    Group,
    /// Subgroup 0 keyframes, 1 other reference frames, 2 frames nothing
    /// references, each at a lower priority, so a congested link drops the
    /// disposable frames first (Sengupta 2025's per-frame-type delivery).
    FrameType,
}

/// `pub` options for real media (with `--broadcast`).
#[derive(clap::Args, Debug, Clone)]
pub struct MediaPubArgs {
    /// Publish a media broadcast under this name (the track namespace,
    /// `/`-separated), read from `--input`, instead of a synthetic profile.
    #[arg(long)]
    pub broadcast: Option<String>,
    /// Packaging of the broadcast.
    #[arg(long, value_enum, default_value_t = Format::Hang)]
    pub format: Format,
    /// Media input: a file, or `-` for standard input (e.g. `ffmpeg … -f mp4
    /// -movflags cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame -`).
    #[arg(long, default_value = "-")]
    pub input: String,
    /// Container of the input.
    #[arg(long, value_enum, default_value_t = InputFormat::Auto)]
    pub input_format: InputFormat,
    /// Send as fast as the input arrives instead of in real time (by default
    /// frames leave when their timestamps say, so a file plays as if live).
    #[arg(long)]
    pub no_pace: bool,
    /// How each GOP is spread over streams.
    #[arg(long, value_enum, default_value_t = Delivery::Group)]
    pub delivery: Delivery,
    /// Target latency in ms: objects older than this are not worth
    /// delivering (the tracks' OBJECT_DELIVERY_TIMEOUT); 0 for none.
    #[arg(long, default_value_t = 2000)]
    pub target_latency_ms: u64,
    /// Constant-rate shaping against resolution fingerprinting, kbit/s: the
    /// media goes out at most this fast (bursts such as keyframes spread
    /// over 20 ms ticks), every tick's unused share is sent as MoQT PADDING
    /// datagrams and every QUIC packet is padded to full size, so the hop to
    /// the relay carries the same full-size packets every tick whatever the
    /// video. Pick it above the broadcast's peak rate over about a second;
    /// 0 is off.
    #[arg(long, default_value_t = 0, value_parser = parse_shape_rate)]
    pub shape_rate: u64,
    /// Pad every object (with PADDING datagrams after it) to the next size
    /// of the ladder 256 B × RATIO^k, e.g. 1.5: hides exact frame sizes,
    /// not the bitrate.
    #[arg(long)]
    pub pad_objects: Option<f64>,
    /// Longest a frame may wait for its share of `--shape-rate`, ms; beyond
    /// it, it goes out at once (counted and reported as an overrun).
    #[arg(long, default_value_t = 500)]
    pub shape_max_delay_ms: u64,
}

fn parse_shape_rate(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    quichub_client::shape::parse_kbps(s)
}

impl MediaPubArgs {
    /// The shaping `--shape-rate`, `--pad-objects` and
    /// `--shape-max-delay-ms` ask for.
    pub fn shape_config(&self) -> anyhow::Result<quichub_client::ShapeConfig> {
        if let Some(r) = self.pad_objects {
            anyhow::ensure!(
                r.is_finite() && r > 1.0 && r <= 16.0,
                "--pad-objects must be in (1, 16], e.g. 1.5"
            );
        }
        Ok(quichub_client::ShapeConfig {
            rate_bps: (self.shape_rate > 0).then_some(self.shape_rate * 1000),
            bucket_ratio: self.pad_objects,
            max_delay: std::time::Duration::from_millis(self.shape_max_delay_ms.clamp(10, 60_000)),
            ..Default::default()
        })
    }
}

/// `sub` options for real media (with `--broadcast`).
#[derive(clap::Args, Debug, Clone)]
pub struct MediaSubArgs {
    /// Subscribe to this media broadcast (catalog and renditions).
    #[arg(long)]
    pub broadcast: Option<String>,
    /// Where the fragmented MP4 goes: a file, or `-` for standard output
    /// (`| ffplay -`).
    #[arg(long, default_value = "-")]
    pub output: String,
    /// Video rendition to take (default: the first in the catalog; `none` for audio only).
    #[arg(long)]
    pub video: Option<String>,
    /// Audio rendition to take (default: the first; `none` for video only).
    #[arg(long)]
    pub audio: Option<String>,
}
