//! Incremental fragmented-MP4 (CMAF) demuxing: an init segment (`ftyp` +
//! `moov`) and `moof` + `mdat` fragments in, [`Event`]s out.
//!
//! mp4-atom decodes each box; this module adds what a live pipe needs: boxes
//! are taken whole as they complete (never more than [`Limits::max_box`]
//! buffered, checked against the box header before its body is read), and
//! the samples of a fragment are cut out of the `mdat` without copying.
//! A plain (non-fragmented) MP4 cannot be read from a pipe, since its sample
//! tables come after its media; it is refused with the `ffmpeg` command that
//! fragments it.

use std::collections::{HashMap, VecDeque};

use bytes::{Buf, Bytes, BytesMut};
use mp4_atom::{Atom, DecodeMaybe, FourCC, Header, Moof, Moov, Trex, TrunSamples};

use crate::codec::{is_disposable, track_from_sample_entry};
use crate::{to_micros, Demuxer, Error, Event, Frame, Limits, TrackInfo};

/// `sample_is_non_sync_sample` (ISO/IEC 14496-12 §8.8.3.1).
const NON_SYNC: u32 = 0x0001_0000;
/// `sample_is_depended_on` = 2: no other sample references this one.
const NOT_DEPENDED_ON_MASK: u32 = 0x00c0_0000;
const NOT_DEPENDED_ON: u32 = 0x0080_0000;

/// The command that turns a file into what this demuxer reads.
pub const FRAGMENT_HINT: &str = "fragment it first, e.g. `ffmpeg -i in.mp4 -c copy -f mp4 -movflags cmaf+frag_keyframe+empty_moov+default_base_moof -`";

/// Boxes an MP4 may start with.
const TOP_LEVEL: [&[u8; 4]; 6] = [b"ftyp", b"styp", b"moov", b"free", b"skip", b"sidx"];

#[derive(Debug)]
struct TrackState {
    info: TrackInfo,
    trex: Trex,
    /// Presentation offset of the first edit (media units), subtracted from
    /// every composition time so the first frame presents at the edit's start.
    edit_offset: i64,
    /// Decode time of the next sample when a fragment has no `tfdt`.
    next_dts: u64,
}

/// The demuxer. See the module documentation.
#[derive(Debug)]
pub struct Fmp4Demuxer {
    limits: Limits,
    buf: BytesMut,
    /// Stream offset of `buf[0]`, for `base_data_offset`s.
    pos: u64,
    tracks: HashMap<u32, TrackState>,
    /// The last `moof` and the stream offset it started at, waiting for its `mdat`.
    moof: Option<(Moof, u64)>,
    out: VecDeque<Event>,
    ended: bool,
    /// Tracks in the `moov` that were skipped (unsupported codecs), by ID:
    /// their samples are dropped without error.
    skipped: Vec<u32>,
    /// Bytes of garbage or skipped boxes, for the caller's counters.
    skipped_bytes: u64,
}

impl Default for Fmp4Demuxer {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl Fmp4Demuxer {
    /// A demuxer with the given limits.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            buf: BytesMut::new(),
            pos: 0,
            tracks: HashMap::new(),
            moof: None,
            out: VecDeque::new(),
            ended: false,
            skipped: Vec::new(),
            skipped_bytes: 0,
        }
    }

    /// The tracks of the last init segment.
    pub fn tracks(&self) -> Vec<TrackInfo> {
        let mut v: Vec<_> = self.tracks.values().map(|t| t.info.clone()).collect();
        v.sort_by_key(|t| t.id);
        v
    }

    /// Bytes of boxes skipped because they carry nothing to play (`free`,
    /// `sidx`, `emsg`, tracks of unsupported codecs).
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped_bytes
    }

    /// Takes the next complete box off the buffer: (kind, whole box bytes,
    /// header length), or `None` until more input arrives.
    fn take_box(&mut self) -> Result<Option<(FourCC, Bytes, usize)>, Error> {
        let mut peek = &self.buf[..];
        let before = peek.len();
        let header = match Header::decode_maybe(&mut peek) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(None),
            Err(e) => return Err(Error::malformed("box header", e)),
        };
        let header_len = before - peek.len();
        if self.pos == 0 && !TOP_LEVEL.contains(&header.kind.as_ref()) {
            // Judge the format by its first box name before trusting a size.
            return Err(Error::WrongFormat {
                expected: "fragmented MP4",
                detail: format!(
                    "starts with {:02x?} (an MP4 starts with an ftyp, styp or moov box)",
                    &self.buf[..8]
                ),
            });
        }
        let Some(size) = header.size else {
            return Err(Error::malformed(
                "box header",
                format!(
                    "{} extends to the end of the file; {FRAGMENT_HINT}",
                    header.kind
                ),
            ));
        };
        let total = size as u64 + header_len as u64;
        if total > self.limits.max_box {
            return Err(Error::TooLarge {
                what: format!("{} box", header.kind),
                size: total,
                limit: self.limits.max_box,
            });
        }
        if (self.buf.len() as u64) < total {
            // Reserve up front so a large mdat arriving in pieces is not
            // copied once per doubling.
            self.buf.reserve(total as usize - self.buf.len());
            return Ok(None);
        }
        let whole = self.buf.split_to(total as usize).freeze();
        self.pos += total;
        Ok(Some((header.kind, whole, header_len)))
    }

    fn on_moov(&mut self, body: Bytes) -> Result<(), Error> {
        let moov =
            Moov::decode_body(&mut body.as_ref()).map_err(|e| Error::malformed("moov", e))?;
        if moov.trak.len() > self.limits.max_tracks {
            return Err(Error::TooLarge {
                what: "track count".into(),
                size: moov.trak.len() as u64,
                limit: self.limits.max_tracks as u64,
            });
        }
        let mut tracks = HashMap::new();
        let mut skipped = Vec::new();
        let mut unsupported = Vec::new();
        for trak in &moov.trak {
            let id = trak.tkhd.track_id;
            let timescale = trak.mdia.mdhd.timescale;
            if timescale == 0 {
                return Err(Error::malformed(
                    "mdhd",
                    format!("track {id} has timescale 0"),
                ));
            }
            let Some(entry) = trak.mdia.minf.stbl.stsd.codecs.first() else {
                skipped.push(id);
                continue;
            };
            let info = match track_from_sample_entry(id, timescale, entry) {
                Ok(i) => i,
                Err(Error::UnsupportedCodec(c)) => {
                    unsupported.push(c);
                    skipped.push(id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let trex = moov
                .mvex
                .as_ref()
                .and_then(|m| m.trex.iter().find(|t| t.track_id == id).cloned())
                .unwrap_or(Trex {
                    track_id: id,
                    default_sample_description_index: 1,
                    ..Default::default()
                });
            let edit_offset = trak
                .edts
                .as_ref()
                .and_then(|e| e.elst.as_ref())
                .and_then(|l| l.entries.iter().find_map(|e| e.media_time))
                .map_or(0, |t| t.min(i64::MAX as u64) as i64);
            tracks.insert(
                id,
                TrackState {
                    info,
                    trex,
                    edit_offset,
                    next_dts: 0,
                },
            );
        }
        if tracks.is_empty() {
            return Err(Error::UnsupportedCodec(if unsupported.is_empty() {
                "none: the init segment has no tracks".into()
            } else {
                unsupported.join(", ")
            }));
        }
        self.tracks = tracks;
        self.skipped = skipped;
        self.out.push_back(Event::Tracks(self.tracks()));
        Ok(())
    }

    /// Cuts the samples of the pending `moof` out of an `mdat` starting at
    /// stream offset `mdat_start` whose payload is `body` (at `body_start`).
    fn on_mdat(&mut self, body: Bytes, body_start: u64) -> Result<(), Error> {
        let Some((moof, moof_start)) = self.moof.take() else {
            // An mdat with no moof: a plain MP4's media, or stray data.
            if self.tracks.is_empty() {
                return Err(Error::malformed(
                    "mp4",
                    format!(
                        "media data before the movie header: not a fragmented MP4; {FRAGMENT_HINT}"
                    ),
                ));
            }
            self.skipped_bytes += body.len() as u64;
            return Ok(());
        };
        let body_end = body_start + body.len() as u64;
        for traf in &moof.traf {
            let id = traf.tfhd.track_id;
            if self.skipped.contains(&id) {
                continue;
            }
            let Some(track) = self.tracks.get_mut(&id) else {
                return Err(Error::malformed(
                    "moof",
                    format!("fragment of unknown track {id}"),
                ));
            };
            let base = match traf.tfhd.base_data_offset {
                Some(b) => b,
                None => moof_start,
            };
            let mut dts = traf
                .tfdt
                .as_ref()
                .map_or(track.next_dts, |t| t.base_media_decode_time);
            let default_duration = traf
                .tfhd
                .default_sample_duration
                .unwrap_or(track.trex.default_sample_duration);
            let default_size = traf
                .tfhd
                .default_sample_size
                .unwrap_or(track.trex.default_sample_size);
            let default_flags = traf
                .tfhd
                .default_sample_flags
                .unwrap_or(track.trex.default_sample_flags);
            // Without a data offset, a run starts where the previous ended
            // (or at the mdat's payload for the first).
            let mut offset = body_start;
            for trun in &traf.trun {
                if let Some(d) = trun.data_offset {
                    offset = base.checked_add_signed(d.into()).ok_or_else(|| {
                        Error::malformed("trun", "data offset before the stream start")
                    })?;
                }
                let entries: Vec<(u32, u32, u32, i64)> = match &trun.samples {
                    TrunSamples::Inherited { count, first_flags } => {
                        if u64::from(*count) * u64::from(default_size.max(1)) > body.len() as u64 {
                            return Err(Error::malformed(
                                "trun",
                                "more samples than the mdat holds",
                            ));
                        }
                        (0..*count)
                            .map(|i| {
                                let f = if i == 0 {
                                    first_flags.unwrap_or(default_flags)
                                } else {
                                    default_flags
                                };
                                (default_duration, default_size, f, 0)
                            })
                            .collect()
                    }
                    TrunSamples::Explicit(v) => v
                        .iter()
                        .map(|e| {
                            (
                                e.duration.unwrap_or(default_duration),
                                e.size.unwrap_or(default_size),
                                e.flags.unwrap_or(default_flags),
                                e.cts.unwrap_or(0),
                            )
                        })
                        .collect(),
                };
                // A first-sample flag override only exists in the Inherited
                // form's model; mp4-atom folds it into the first explicit entry.
                for (duration, size, flags, cts) in entries {
                    let end = offset.saturating_add(u64::from(size));
                    if offset < body_start || end > body_end {
                        return Err(Error::malformed(
                            "trun",
                            format!(
                                "sample of track {id} at bytes {offset}..{end} outside the mdat"
                            ),
                        ));
                    }
                    let from = (offset - body_start) as usize;
                    let data = body.slice(from..from + size as usize);
                    let ts = track.info.timescale;
                    // Peer-chosen times: saturate rather than overflow.
                    let dts_signed = i64::try_from(dts).unwrap_or(i64::MAX);
                    let pts = dts_signed
                        .saturating_add(cts)
                        .saturating_sub(track.edit_offset);
                    let keyframe = match track.info.kind {
                        crate::TrackKind::Audio => true,
                        crate::TrackKind::Video => flags & NON_SYNC == 0,
                    };
                    self.out.push_back(Event::Frame(Frame {
                        track: id,
                        pts: to_micros(pts, ts),
                        dts: to_micros(dts_signed.saturating_sub(track.edit_offset), ts),
                        duration: to_micros(duration.into(), ts).clamp(0, u32::MAX.into()) as u32,
                        keyframe,
                        // ffmpeg leaves sample_is_depended_on unset in
                        // fragments; the NAL headers say it for sure.
                        disposable: flags & NOT_DEPENDED_ON_MASK == NOT_DEPENDED_ON
                            || is_disposable(&track.info.codec, &data, track.info.nal_length_size),
                        data,
                    }));
                    dts = dts.saturating_add(u64::from(duration));
                    offset = end;
                }
            }
            track.next_dts = dts;
        }
        Ok(())
    }
}

impl Demuxer for Fmp4Demuxer {
    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    fn next(&mut self) -> Result<Option<Event>, Error> {
        loop {
            if let Some(e) = self.out.pop_front() {
                return Ok(Some(e));
            }
            let start = self.pos;
            let Some((kind, whole, header_len)) = self.take_box()? else {
                if self.ended && !self.buf.is_empty() {
                    let n = self.buf.len();
                    self.buf.clear();
                    return Err(Error::malformed(
                        "mp4",
                        format!("input ends inside a box ({n} bytes left over)"),
                    ));
                }
                return Ok(None);
            };
            let body = whole.slice(header_len..);
            match kind.as_ref() {
                b"moov" => self.on_moov(body)?,
                b"moof" => {
                    if self.tracks.is_empty() {
                        return Err(Error::NoInit("a movie fragment"));
                    }
                    let moof = Moof::decode_body(&mut body.as_ref())
                        .map_err(|e| Error::malformed("moof", e))?;
                    self.moof = Some((moof, start));
                }
                b"mdat" => self.on_mdat(body, start + header_len as u64)?,
                b"ftyp" | b"styp" | b"free" | b"skip" | b"sidx" | b"prft" | b"emsg" | b"udta"
                | b"mfra" | b"uuid" | b"meta" => self.skipped_bytes += whole.len() as u64,
                other => {
                    // A box this format does not have at the top level: the
                    // input is probably not MP4 at all.
                    if start == 0 {
                        return Err(Error::WrongFormat {
                            expected: "fragmented MP4",
                            detail: format!("first box is {:?}", String::from_utf8_lossy(other)),
                        });
                    }
                    self.skipped_bytes += whole.len() as u64;
                }
            }
        }
    }

    fn end(&mut self) {
        self.ended = true;
    }
}

/// Demuxes a whole buffer (tests, small files): every event, or the first error.
pub fn demux_all(data: &[u8]) -> Result<Vec<Event>, Error> {
    let mut d = Fmp4Demuxer::default();
    d.push(data);
    d.end();
    let mut v = Vec::new();
    while let Some(e) = d.next()? {
        v.push(e);
    }
    Ok(v)
}

/// Reads the first box header of `data`: (kind, total size), for sniffing.
pub fn peek_box(data: &[u8]) -> Option<([u8; 4], u64)> {
    let mut b = data;
    if b.remaining() < 8 {
        return None;
    }
    let size = b.get_u32();
    let mut kind = [0; 4];
    b.copy_to_slice(&mut kind);
    let total = match size {
        1 if b.remaining() >= 8 => b.get_u64(),
        1 => return None,
        s => u64::from(s),
    };
    Some((kind, total))
}
