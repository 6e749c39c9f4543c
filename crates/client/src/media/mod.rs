//! Real media over MoQT: [`publish`] a broadcast read from an fMP4/CMAF or
//! MPEG-TS byte stream, [`subscribe`] to one and write fragmented MP4.
//!
//! Publishing: the input is demuxed by `quichub-media` and published as a
//! hang broadcast (a `catalog.json` track) or an MSF one (a `catalog`
//! track, LOC or CMAF packaging), with one track per rendition, one group
//! per GOP. Subscribing: whichever catalog track the broadcast has is read,
//! the renditions subscribed, and fragmented MP4 written (for `ffplay -` or
//! a file). This module only moves bytes and keeps time; what goes where is
//! decided by `quichub_media::broadcast` and `quichub_media::playback`.
//!
//! Both take any byte stream, report progress through a callback (the
//! [`Note`]s `quichub pub` and `quichub sub` print), stop gracefully when
//! the `stop` future completes, and can be cancelled by dropping them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use quichub_media::playback::CatalogChange;
use quichub_media::TrackInfo;

use crate::{ShapeConfig, ShapeStats, TrackMode};

mod publish;
mod reader;
mod subscribe;

pub use publish::publish;
pub use quichub_media::broadcast::{Delivery, Format, InputFormat};
pub use reader::{read_on_thread, ThreadReader};
pub use subscribe::subscribe;

/// What [`publish`] publishes, and how.
#[derive(Clone, Debug)]
pub struct MediaPublishOptions {
    /// The broadcast's name: the track namespace, `/`-separated.
    pub broadcast: String,
    /// Packaging of the broadcast.
    pub format: Format,
    /// Container of the input.
    pub input_format: InputFormat,
    /// How the tracks reach the relay.
    pub mode: TrackMode,
    /// Send frames when their timestamps say, so a file plays as if live;
    /// `false` sends them as fast as the input arrives.
    pub pace: bool,
    /// How each GOP is spread over streams.
    pub delivery: Delivery,
    /// Objects older than this (ms) are not worth delivering (the tracks'
    /// OBJECT_DELIVERY_TIMEOUT); 0 for none.
    pub target_latency_ms: u64,
    /// Constant-rate shaping and object padding (inactive by default).
    pub shape: ShapeConfig,
}

impl MediaPublishOptions {
    /// A hang broadcast named `broadcast`, pushed, paced, one stream per
    /// GOP, 2 s target latency, unshaped: `quichub pub --broadcast`'s
    /// defaults.
    pub fn new(broadcast: impl Into<String>) -> Self {
        Self {
            broadcast: broadcast.into(),
            format: Format::Hang,
            input_format: InputFormat::Auto,
            mode: TrackMode::Push,
            pace: true,
            delivery: Delivery::Group,
            target_latency_ms: 2000,
            shape: ShapeConfig::default(),
        }
    }
}

/// What [`subscribe`] plays.
#[derive(Clone, Debug, Default)]
pub struct MediaSubscribeOptions {
    /// The broadcast's name (catalog and renditions).
    pub broadcast: String,
    /// Video rendition to take (default: the first in the catalog; `none`
    /// for audio only).
    pub video: Option<String>,
    /// Audio rendition to take (default: the first; `none` for video only).
    pub audio: Option<String>,
    /// Wait up to this many ms for a publisher that is not there yet
    /// (RENDEZVOUS_TIMEOUT); 0 fails at once.
    pub rendezvous_ms: u64,
    /// Stop after writing this many frames.
    pub count: Option<u64>,
}

impl MediaSubscribeOptions {
    /// The first video and audio renditions of `broadcast`, waiting up to
    /// 10 s for its publisher: `quichub sub --broadcast`'s defaults.
    pub fn new(broadcast: impl Into<String>) -> Self {
        Self {
            broadcast: broadcast.into(),
            rendezvous_ms: 10_000,
            ..Self::default()
        }
    }
}

/// Progress of [`publish`] and [`subscribe`], as the CLI prints it
/// (`Display`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Note {
    /// Publishing: a track was created for a rendition of the input.
    Track {
        /// The track's name.
        name: String,
        /// The input track.
        info: TrackInfo,
    },
    /// Subscribing: the broadcast's catalog arrived; MSF or hang.
    Catalog {
        /// Whether it is MSF's (else hang's).
        msf: bool,
    },
    /// Subscribing: a rendition was chosen and is subscribed.
    Rendition {
        /// The track's name.
        name: String,
        /// The output track.
        info: TrackInfo,
    },
    /// Subscribing: a catalog update arrived during playback.
    CatalogUpdate(CatalogChange),
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Track { name, info } => {
                write!(f, "track {name}: {} ({})", info.codec, info.describe())
            }
            Note::Catalog { msf: true } => f.write_str("catalog: MSF (draft-ietf-moq-msf-01)"),
            Note::Catalog { msf: false } => f.write_str("catalog: hang"),
            Note::Rendition { name, info } => {
                write!(f, "rendition {name}: {} ({})", info.codec, info.describe())
            }
            Note::CatalogUpdate(CatalogChange::Ignored(e)) => {
                write!(f, "catalog update ignored: {e}")
            }
            Note::CatalogUpdate(CatalogChange::Complete) => {
                f.write_str("catalog: broadcast complete")
            }
            Note::CatalogUpdate(CatalogChange::Tracks(t)) => {
                write!(f, "catalog update: tracks {t:?}")
            }
            Note::CatalogUpdate(CatalogChange::None) => f.write_str("catalog update"),
        }
    }
}

/// One published track at the end of [`publish`].
#[derive(Clone, Debug, PartialEq)]
pub struct PublishedTrack {
    /// The track's name.
    pub name: String,
    /// Its codec string.
    pub codec: String,
    /// Frames published.
    pub frames: u64,
}

/// What [`publish`] did. `Display` gives `quichub pub`'s closing lines.
#[derive(Clone, Debug)]
pub struct PublishSummary {
    /// The broadcast's name.
    pub broadcast: String,
    /// Its tracks.
    pub tracks: Vec<PublishedTrack>,
    /// Frames nobody could decode: before the first keyframe, or audio
    /// before the first video group.
    pub dropped_before_keyframe: u64,
    /// What shaping sent, when it was on.
    pub shaping: Option<ShapeStats>,
}

impl fmt::Display for PublishSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dropped_before_keyframe > 0 {
            writeln!(
                f,
                "dropped {} frames before the first keyframe",
                self.dropped_before_keyframe
            )?;
        }
        if let Some(st) = &self.shaping {
            writeln!(
                f,
                "shaping: {} media bytes, {} padding bytes ({:.1}% overhead), {} overruns{}",
                st.media_bytes,
                st.padding_bytes,
                100.0 * st.padding_bytes as f64 / st.media_bytes.max(1) as f64,
                st.overruns,
                if st.padding_refused > 0 {
                    format!(
                        ", {} padding bytes refused (datagrams off?)",
                        st.padding_refused
                    )
                } else {
                    String::new()
                }
            )?;
        }
        let sent: Vec<_> = self
            .tracks
            .iter()
            .map(|t| format!("{} {} frames", t.codec, t.frames))
            .collect();
        write!(f, "published {}: {}", self.broadcast, sent.join(", "))
    }
}

/// One played rendition in a [`SubscribeSummary`].
#[derive(Clone, Debug, PartialEq)]
pub struct PlayedRendition {
    /// The track's name.
    pub name: String,
    /// Frames written.
    pub frames: u64,
    /// Objects that came after their place in the output was given up.
    pub late: u64,
}

/// What [`subscribe`] wrote. `Display` gives the list `quichub sub` prints
/// after `wrote OUTPUT: `.
#[derive(Clone, Debug, PartialEq)]
pub struct SubscribeSummary {
    /// The renditions played.
    pub renditions: Vec<PlayedRendition>,
}

impl fmt::Display for SubscribeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<_> = self
            .renditions
            .iter()
            .map(|r| match r.late {
                0 => format!("{} {} frames", r.name, r.frames),
                l => format!("{} {} frames ({l} arrived too late)", r.name, r.frames),
            })
            .collect();
        f.write_str(&list.join(", "))
    }
}

/// Why [`subscribe`] failed, with what it had written by then (if
/// playback had started).
#[derive(Debug)]
pub struct SubscribeError {
    /// What was written before the failure.
    pub written: Option<SubscribeSummary>,
    /// The failure.
    pub error: anyhow::Error,
}

impl fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            write!(f, "{:#}", self.error)
        } else {
            write!(f, "{}", self.error)
        }
    }
}

impl std::error::Error for SubscribeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl From<anyhow::Error> for SubscribeError {
    fn from(error: anyhow::Error) -> Self {
        Self {
            written: None,
            error,
        }
    }
}

/// The caller's stop signal: a future polled without being consumed, and
/// asked "has it fired?" between frames.
struct Stop<F> {
    fut: Pin<Box<F>>,
    fired: bool,
}

impl<F: Future<Output = ()>> Stop<F> {
    fn new(fut: F) -> Self {
        Self {
            fut: Box::pin(fut),
            fired: false,
        }
    }

    /// Completes when the signal fires (at once if it has).
    async fn wait(&mut self) {
        if !self.fired {
            self.fut.as_mut().await;
            self.fired = true;
        }
    }

    /// Whether the signal has fired.
    fn fired(&mut self) -> bool {
        if !self.fired {
            let mut cx = Context::from_waker(Waker::noop());
            self.fired = matches!(self.fut.as_mut().poll(&mut cx), Poll::Ready(()));
        }
        self.fired
    }
}

/// Milliseconds since the Unix epoch (MSF's `generatedAt`).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Microseconds since the Unix epoch.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
