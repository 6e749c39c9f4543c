//! MPEG-TS demuxing (ISO/IEC 13818-1): PAT, PMT and PES into [`Frame`]s.
//!
//! To be written: see [`TsDemuxer`].

use crate::{Demuxer, Error, Event, Limits};

/// An incremental MPEG-TS demuxer (H.264, H.265, AAC in ADTS, Opus).
#[derive(Debug, Default)]
pub struct TsDemuxer {
    limits: Limits,
}

impl TsDemuxer {
    /// A demuxer with the given limits.
    pub fn new(limits: Limits) -> Self {
        Self { limits }
    }
}

impl Demuxer for TsDemuxer {
    fn push(&mut self, _data: &[u8]) {}
    fn next(&mut self) -> Result<Option<Event>, Error> {
        let _ = self.limits;
        Err(Error::UnsupportedCodec("MPEG-TS (not yet)".into()))
    }
    fn end(&mut self) {}
}
