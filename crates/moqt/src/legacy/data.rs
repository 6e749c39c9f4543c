//! The data plane of drafts 14 and 16, translated to and from draft 18:
//! subgroup streams, fetch streams and datagrams.
//!
//! Sources: draft-ietf-moq-transport-14 §10 ("Data Streams and Datagrams"),
//! draft-ietf-moq-transport-16 §10 and draft-ietf-moq-transport-18 §11, read
//! beside moq-dev's `moq-net` 0.3.18, which speaks all three.
//!
//! The three drafts lay objects out alike; what differs, and what this module
//! rewrites, is:
//!
//! - every integer: QUIC varints (RFC 9000 §16) in drafts 14 and 16, `vi64` in
//!   draft 18. A draft-18 value of 2^62 or more has no legacy spelling and
//!   fails with [`TranscodeError::TooLarge`];
//! - header types: draft 14 always carries a priority byte, draft 16 may omit
//!   it, draft 18 adds FIRST_OBJECT (0x40) to SUBGROUP_HEADER;
//! - extension (draft 18: property) types: absolute in draft 14, delta-encoded
//!   in 16 and 18;
//! - Object Status 0x1 ("does not exist"), which only draft 14 has;
//! - fetch objects: explicit fields in draft 14, Serialization Flags with
//!   absolute IDs in draft 16, and with IDs as deltas in draft 18, where the
//!   Group ID moves in the fetch's group order.
//!
//! Payload bytes are never copied on streams: they leave as slices of the
//! input. Only headers are buffered, and at most [`MAX_HEADER`] bytes of them.
//!
//! Translation is lossy only where a draft lacks the concept. Each such place
//! says what it does and why, next to the code.

use bytes::{Buf, Bytes};
use thiserror::Error;

use super::varint::{fits, get_varint, put_varint};
use super::Draft;
use crate::coding::{get_u8, get_vi64, put_vi64};
use crate::data::{
    ObjectDatagram, SubgroupHeader, END_OF_NONEXISTENT_RANGE, END_OF_UNKNOWN_RANGE, FETCH_HEADER,
    MAX_PROPERTIES, PADDING_DATAGRAM, PADDING_STREAM,
};
use crate::error::DecodeError;

/// Most header bytes (a stream header, or one object's fields before its
/// payload, extensions included) kept while waiting for the rest.
pub const MAX_HEADER: usize = MAX_PROPERTIES + 256;

/// The publisher priority written where draft 14 needs one and draft 18 left it
/// to the subscription. Draft 18 (§12.4, DEFAULT PUBLISHER PRIORITY) inherits it
/// from the track's property 0x0E, which the data plane cannot see; 128 is that
/// property's default. Callers that know the track's value set it with
/// [`StreamTranscoder::set_default_priority`] or
/// [`transcode_datagram_with_priority`].
pub const DEFAULT_PRIORITY: u8 = 128;

/// Which encoding the input is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Legacy in, draft 18 out.
    ToModern,
    /// Draft 18 in, legacy out.
    ToLegacy,
}

/// Why bytes could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TranscodeError {
    /// The input breaks its own draft's wire format.
    #[error("malformed data: {0}")]
    Malformed(&'static str),
    /// A draft-18 value of 2^62 or more, which a QUIC varint cannot hold.
    #[error("value too large for a QUIC varint")]
    TooLarge,
    /// Well-formed, but the other draft cannot say it.
    #[error("not expressible in the target draft: {0}")]
    Unsupported(&'static str),
}

/// One side's wire encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    D14,
    D16,
    D18,
}

impl Wire {
    fn pair(draft: Draft, dir: Direction) -> (Wire, Wire) {
        let legacy = match draft {
            Draft::D14 => Wire::D14,
            Draft::D16 => Wire::D16,
        };
        match dir {
            Direction::ToModern => (legacy, Wire::D18),
            Direction::ToLegacy => (Wire::D18, legacy),
        }
    }

    fn get(self, buf: &mut &[u8]) -> Result<u64, Stop> {
        let v = match self {
            Wire::D18 => get_vi64(buf),
            Wire::D14 | Wire::D16 => get_varint(buf),
        };
        Ok(v?)
    }

    fn put(self, out: &mut Vec<u8>, v: u64) -> Result<(), TranscodeError> {
        match self {
            Wire::D18 => put_vi64(out, v),
            Wire::D14 | Wire::D16 if fits(v) => put_varint(out, v),
            Wire::D14 | Wire::D16 => return Err(TranscodeError::TooLarge),
        }
        Ok(())
    }

    /// Rejects an identifier the legacy peer could not hold even where only a
    /// delta of it goes on the wire.
    fn check_id(self, v: u64) -> Result<(), TranscodeError> {
        if self != Wire::D18 && !fits(v) {
            return Err(TranscodeError::TooLarge);
        }
        Ok(())
    }

    fn subgroup_type(self, t: u64) -> bool {
        // Each draft widened the 0b0XX1XXXX form by one bit.
        let limit = match self {
            Wire::D14 => 0x20,
            Wire::D16 => 0x40,
            Wire::D18 => 0x80,
        };
        t < limit && SubgroupHeader::valid_type(t as u8)
    }

    fn datagram_type(self, t: u64) -> bool {
        match self {
            Wire::D14 => t <= 0x07 || t == 0x20 || t == 0x21,
            Wire::D16 | Wire::D18 => ObjectDatagram::valid_type(t),
        }
    }
}

/// Why a parse stopped: more bytes needed, or a final error.
enum Stop {
    Short,
    Fail(TranscodeError),
}

impl From<DecodeError> for Stop {
    fn from(e: DecodeError) -> Self {
        match e {
            DecodeError::Short => Stop::Short,
            DecodeError::Invalid(m) => bad(m),
            DecodeError::TooLong => bad("length exceeds limit"),
            _ => bad("undecodable field"),
        }
    }
}

impl From<TranscodeError> for Stop {
    fn from(e: TranscodeError) -> Self {
        Stop::Fail(e)
    }
}

fn bad(m: &'static str) -> Stop {
    Stop::Fail(TranscodeError::Malformed(m))
}

fn unsupported(m: &'static str) -> Stop {
    Stop::Fail(TranscodeError::Unsupported(m))
}

/// Inside a block whose length is known, running out is malformation, not a
/// reason to wait.
fn whole<T>(r: Result<T, Stop>) -> Result<T, Stop> {
    match r {
        Err(Stop::Short) => Err(bad("truncated field inside a length-delimited block")),
        r => r,
    }
}

fn into_final<T>(r: Result<T, Stop>, short: &'static str) -> Result<T, TranscodeError> {
    match r {
        Ok(v) => Ok(v),
        Err(Stop::Short) => Err(TranscodeError::Malformed(short)),
        Err(Stop::Fail(e)) => Err(e),
    }
}

/// Object Status, across drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Normal,
    /// Draft 14 only (§10.2.1.1).
    DoesNotExist,
    EndOfGroup,
    EndOfTrack,
}

impl Status {
    fn read(w: Wire, code: u64) -> Result<Self, Stop> {
        match code {
            0 => Ok(Status::Normal),
            1 if w == Wire::D14 => Ok(Status::DoesNotExist),
            3 => Ok(Status::EndOfGroup),
            4 => Ok(Status::EndOfTrack),
            _ => Err(bad("object status")),
        }
    }

    /// Only called for statuses the target has; 0x3 and 0x4 kept their codes.
    fn code(self) -> u64 {
        match self {
            Status::Normal => 0,
            Status::DoesNotExist => 1,
            Status::EndOfGroup => 3,
            Status::EndOfTrack => 4,
        }
    }
}

/// Reads a length-prefixed extension (property) block and returns its content.
fn read_block<'a>(w: Wire, cur: &mut &'a [u8]) -> Result<&'a [u8], Stop> {
    let len = w.get(cur)?;
    if len > MAX_PROPERTIES as u64 {
        return Err(bad("extension block too long"));
    }
    let len = len as usize;
    if cur.len() < len {
        return Err(Stop::Short);
    }
    let (block, rest) = cur.split_at(len);
    *cur = rest;
    Ok(block)
}

/// A Key-Value-Pair value, borrowed from its block.
enum Kv<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

fn parse_kvps<'a>(from: Wire, mut cur: &'a [u8]) -> Result<Vec<(u64, Kv<'a>)>, Stop> {
    let mut pairs = Vec::new();
    let mut prev = 0u64;
    while !cur.is_empty() {
        let t = whole(from.get(&mut cur))?;
        let kind = match from {
            Wire::D14 => t,
            Wire::D16 | Wire::D18 => prev.checked_add(t).ok_or(bad("extension type overflow"))?,
        };
        prev = kind;
        let value = if kind % 2 == 0 {
            Kv::Int(whole(from.get(&mut cur))?)
        } else {
            let len = whole(from.get(&mut cur))?;
            if len > 0xffff || len > cur.len() as u64 {
                return Err(bad("extension value length"));
            }
            let (v, rest) = cur.split_at(len as usize);
            cur = rest;
            Kv::Bytes(v)
        };
        pairs.push((kind, value));
    }
    Ok(pairs)
}

/// Re-encodes the content of an extension block.
///
/// Draft 14 allows absolute types in any order; delta encoding needs them
/// ascending, so they are sorted, stably so that repeated types keep their
/// order. Values of odd types are opaque and copied as they are. That includes
/// Immutable Extensions (0xB): draft 18 forbids changing its serialization, so
/// its nested pairs keep the sender's integer encoding and type form.
fn transcode_kvps(block: &[u8], from: Wire, to: Wire) -> Result<Vec<u8>, Stop> {
    let mut pairs = parse_kvps(from, block)?;
    if from == Wire::D14 && to != Wire::D14 {
        pairs.sort_by_key(|(kind, _)| *kind);
    }
    let mut out = Vec::with_capacity(block.len() + 8);
    let mut prev = 0u64;
    for (kind, value) in pairs {
        let t = match to {
            Wire::D14 => kind,
            // Sorted above, or ascending by construction when read as deltas.
            Wire::D16 | Wire::D18 => kind.wrapping_sub(prev),
        };
        prev = kind;
        to.put(&mut out, t)?;
        match value {
            Kv::Int(v) => to.put(&mut out, v)?,
            Kv::Bytes(b) => {
                to.put(&mut out, b.len() as u64)?;
                out.extend_from_slice(b);
            }
        }
    }
    // Re-encoding can lengthen integers (an 8-byte varint can need a 9-byte
    // vi64); the receiver holds blocks to the same bound as the sender.
    if out.len() > MAX_PROPERTIES {
        return Err(unsupported("extension block too long once re-encoded"));
    }
    Ok(out)
}

/// Writes a block, length first.
fn put_block(to: Wire, out: &mut Vec<u8>, content: &[u8]) -> Result<(), Stop> {
    to.put(out, content.len() as u64)?;
    out.extend_from_slice(content);
    Ok(())
}

/// Draft 18 (§11.2.1.2) forbids properties on a status other than Normal.
/// Draft 14 allows them, and moq-net sends them on draft 16 too, so a legacy
/// status object loses them on the way in; a draft-18 one that has them is
/// malformed.
fn status_props(src: Wire, status: Status, props: Option<&[u8]>) -> Result<Option<&[u8]>, Stop> {
    match props {
        Some(p) if status != Status::Normal && !p.is_empty() => {
            if src == Wire::D18 {
                Err(bad("properties on a status object"))
            } else {
                Ok(None)
            }
        }
        p => Ok(p),
    }
}

/// Incremental translator of one unidirectional data stream (subgroup stream
/// or fetch stream), from its first byte.
#[derive(Debug)]
pub struct StreamTranscoder {
    src: Wire,
    dst: Wire,
    default_priority: u8,
    descending: bool,
    state: State,
    /// Header bytes of an incomplete parse.
    pending: Vec<u8>,
    /// Translated header bytes not yet handed out.
    scratch: Vec<u8>,
    /// Payload bytes of the current object still to pass through.
    payload_left: u64,
    request_id: Option<u64>,
    failed: Option<TranscodeError>,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Header,
    Subgroup(SubgroupState),
    Fetch(FetchState),
}

#[derive(Debug, Clone, Copy)]
struct SubgroupState {
    properties: bool,
    /// SUBGROUP_ID_MODE 0b01: the Subgroup ID is the first object's ID.
    first_object_mode: bool,
    /// Last Object ID read; the input's deltas refer to it.
    in_prev: Option<u64>,
    /// Last Object ID written; differs from `in_prev` after a dropped object.
    out_prev: Option<u64>,
}

/// The prior-object fields that fetch Serialization Flags refer to.
#[derive(Debug, Clone, Copy, Default)]
struct Prior {
    group: Option<u64>,
    object: Option<u64>,
    /// The last known Subgroup ID (objects sent as datagrams have none).
    subgroup: Option<u64>,
    priority: Option<u8>,
    /// The prior object was a datagram object, so its Subgroup ID is absent:
    /// the encoder does not refer to "the prior Subgroup ID" then, since
    /// readers disagree on what it means.
    datagram: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct FetchState {
    input: Prior,
    output: Prior,
}

/// One fetch entry, every field resolved.
enum Entry<'a> {
    Object {
        group: u64,
        /// `None` for an object published as a datagram.
        subgroup: Option<u64>,
        object: u64,
        priority: u8,
        props: Option<&'a [u8]>,
        len: u64,
        /// Only draft 14 carries a status on fetch streams.
        status: Status,
    },
    EndOfRange {
        unknown: bool,
        group: u64,
        object: u64,
    },
}

impl StreamTranscoder {
    /// A translator for a stream of `draft` in direction `dir`. Fetch streams
    /// default to ascending group order (see [`Self::set_descending`]).
    pub fn new(draft: Draft, dir: Direction) -> Self {
        let (src, dst) = Wire::pair(draft, dir);
        Self {
            src,
            dst,
            default_priority: DEFAULT_PRIORITY,
            descending: false,
            state: State::Header,
            pending: Vec::new(),
            scratch: Vec::new(),
            payload_left: 0,
            request_id: None,
            failed: None,
        }
    }

    /// Sets the group order of a fetch stream. Draft 18 writes Group IDs as
    /// deltas whose sign follows the fetch's group order, which the stream does
    /// not carry: the caller learns it from the FETCH (GROUP_ORDER parameter,
    /// Ascending when absent) or, in draft 14, from FETCH_OK's Group Order.
    /// Set it before the stream's second group arrives; ascending by default.
    pub fn set_descending(&mut self, descending: bool) {
        self.descending = descending;
    }

    /// True once the stream header has been read: the stream is known to be
    /// a subgroup or a fetch stream ([`Self::fetch_request_id`]), so a caller
    /// can [`Self::set_descending`] before any object is translated.
    pub fn header_done(&self) -> bool {
        !matches!(self.state, State::Header)
    }

    /// Sets the priority written into draft-14 headers whose draft-18 source
    /// left it to the subscription: the track's DEFAULT PUBLISHER PRIORITY
    /// (property 0x0E). [`DEFAULT_PRIORITY`] unless set.
    pub fn set_default_priority(&mut self, priority: u8) {
        self.default_priority = priority;
    }

    /// Feeds the next bytes read from the stream; appends translated output to
    /// `out` (payload bytes pass through as slices of `input`, no copy). Keeps
    /// partial headers buffered. After an error the stream is dead: every later
    /// call returns the same error.
    pub fn push(&mut self, input: Bytes, out: &mut Vec<Bytes>) -> Result<(), TranscodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.push_inner(input, out);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    /// The stream ended (FIN): error if it ended inside a header or payload,
    /// or before its stream header.
    pub fn finish(&self) -> Result<(), TranscodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.payload_left > 0 {
            return Err(TranscodeError::Malformed("stream ended inside a payload"));
        }
        if !self.pending.is_empty() {
            return Err(TranscodeError::Malformed("stream ended inside a header"));
        }
        if matches!(self.state, State::Header) {
            return Err(TranscodeError::Malformed("stream ended before its header"));
        }
        Ok(())
    }

    /// Request ID of a fetch stream once its header was seen (None for
    /// subgroup streams / not yet).
    pub fn fetch_request_id(&self) -> Option<u64> {
        self.request_id
    }

    fn push_inner(&mut self, mut input: Bytes, out: &mut Vec<Bytes>) -> Result<(), TranscodeError> {
        while !input.is_empty() {
            if self.payload_left > 0 {
                let n = usize::try_from(self.payload_left)
                    .map_or(input.len(), |left| left.min(input.len()));
                self.flush(out);
                out.push(input.split_to(n));
                self.payload_left -= n as u64;
                continue;
            }
            let used = if self.pending.is_empty() {
                self.parse_fresh(&input)?
            } else {
                self.parse_buffered(&input)?
            };
            input.advance(used.min(input.len()));
        }
        self.flush(out);
        Ok(())
    }

    fn flush(&mut self, out: &mut Vec<Bytes>) {
        if !self.scratch.is_empty() {
            out.push(Bytes::from(std::mem::take(&mut self.scratch)));
        }
    }

    /// Parses straight from the read, so nothing is copied unless the header
    /// is cut.
    fn parse_fresh(&mut self, input: &[u8]) -> Result<usize, TranscodeError> {
        match self.step(input) {
            Ok(n) if n > 0 => Ok(n),
            Ok(_) => Err(TranscodeError::Malformed("no progress")),
            Err(Stop::Short) => {
                if input.len() > MAX_HEADER {
                    return Err(TranscodeError::Malformed("header too long"));
                }
                self.pending.extend_from_slice(input);
                Ok(input.len())
            }
            Err(Stop::Fail(e)) => Err(e),
        }
    }

    /// Completes a cut header. A small prefix of the read is tried first, so a
    /// large read after a cut header is not copied whole.
    fn parse_buffered(&mut self, input: &[u8]) -> Result<usize, TranscodeError> {
        let old = self.pending.len();
        // `pending` never exceeds MAX_HEADER, so this takes at least one byte.
        let most = input.len().min(MAX_HEADER + 1 - old);
        let mut joined = std::mem::take(&mut self.pending);
        for take in [most.min(64), most] {
            joined.truncate(old);
            joined.extend_from_slice(&input[..take]);
            match self.step(&joined) {
                Ok(n) => {
                    // A parse that failed on `old` bytes needs more than them.
                    let used = n
                        .checked_sub(old)
                        .filter(|u| (1..=take).contains(u))
                        .ok_or(TranscodeError::Malformed("no progress"))?;
                    joined.clear();
                    self.pending = joined;
                    return Ok(used);
                }
                Err(Stop::Short) if take < most => continue,
                Err(Stop::Short) => {
                    if joined.len() > MAX_HEADER {
                        return Err(TranscodeError::Malformed("header too long"));
                    }
                    self.pending = joined;
                    return Ok(take);
                }
                Err(Stop::Fail(e)) => return Err(e),
            }
        }
        Err(TranscodeError::Malformed("no progress"))
    }

    /// Translates one header (stream header or object fields) from the front
    /// of `bytes`; returns how many bytes it took. On [`Stop::Short`] nothing
    /// changes, so the caller can retry with more.
    fn step(&mut self, bytes: &[u8]) -> Result<usize, Stop> {
        let mark = self.scratch.len();
        let mut cur = bytes;
        let r = match self.state {
            State::Header => self.stream_header(&mut cur),
            State::Subgroup(sg) => self.subgroup_object(sg, &mut cur).map(|(sg, len)| {
                self.state = State::Subgroup(sg);
                self.payload_left = len;
            }),
            State::Fetch(f) => self.fetch_entry(f, &mut cur).map(|(f, len)| {
                self.state = State::Fetch(f);
                self.payload_left = len;
            }),
        };
        match r {
            Ok(()) => Ok(bytes.len() - cur.len()),
            Err(e) => {
                self.scratch.truncate(mark);
                Err(e)
            }
        }
    }

    fn put(&mut self, v: u64) -> Result<(), Stop> {
        Ok(self.dst.put(&mut self.scratch, v)?)
    }

    fn stream_header(&mut self, cur: &mut &[u8]) -> Result<(), Stop> {
        let t = self.src.get(cur)?;
        if t == FETCH_HEADER {
            let id = self.src.get(cur)?;
            self.put(FETCH_HEADER)?;
            self.put(id)?;
            self.request_id = Some(id);
            self.state = State::Fetch(FetchState::default());
            return Ok(());
        }
        if self.src == Wire::D18 && t == PADDING_STREAM {
            return Err(unsupported("padding"));
        }
        if !self.src.subgroup_type(t) {
            return Err(bad("unknown data stream type"));
        }
        let t = t as u8;
        let alias = self.src.get(cur)?;
        let group = self.src.get(cur)?;
        let subgroup = match t & 0x06 {
            0x04 => Some(self.src.get(cur)?),
            _ => None,
        };
        let priority = match t & 0x20 {
            0 => Some(get_u8(cur)?),
            _ => None,
        };
        // Draft 14 has no DEFAULT_PRIORITY bit, so the inherited value is made
        // explicit.
        let priority = match self.dst {
            Wire::D14 => Some(priority.unwrap_or(self.default_priority)),
            Wire::D16 | Wire::D18 => priority,
        };
        // PROPERTIES, SUBGROUP_ID_MODE and END_OF_GROUP mean the same in every
        // draft. FIRST_OBJECT is dropped going to legacy (no such bit) and
        // never set coming from it: a legacy stream makes no such claim.
        let mut out_t = t & 0x1f;
        if priority.is_none() {
            out_t |= 0x20;
        }
        self.put(u64::from(out_t))?;
        self.put(alias)?;
        self.put(group)?;
        if let Some(s) = subgroup {
            self.put(s)?;
        }
        if let Some(p) = priority {
            self.scratch.push(p);
        }
        self.state = State::Subgroup(SubgroupState {
            properties: t & 0x01 != 0,
            first_object_mode: t & 0x06 == 0x02,
            in_prev: None,
            out_prev: None,
        });
        Ok(())
    }

    /// Object ID deltas mean the same in all three drafts (prior ID + delta +
    /// 1); they are recomputed only because a dropped object shifts the base.
    fn subgroup_object(
        &mut self,
        mut sg: SubgroupState,
        cur: &mut &[u8],
    ) -> Result<(SubgroupState, u64), Stop> {
        let (src, dst) = (self.src, self.dst);
        let delta = src.get(cur)?;
        let id = match sg.in_prev {
            None => Some(delta),
            Some(p) => p.checked_add(delta).and_then(|v| v.checked_add(1)),
        }
        .ok_or(bad("object ID overflow"))?;
        let props = match sg.properties {
            true => Some(read_block(src, cur)?),
            false => None,
        };
        let len = src.get(cur)?;
        let status = match len {
            0 => Status::read(src, src.get(cur)?)?,
            _ => Status::Normal,
        };
        sg.in_prev = Some(id);
        if status == Status::DoesNotExist {
            // Draft 18 has no such status and a gap in Object IDs already
            // claims nothing, so the object is left out. As the first object
            // under SUBGROUP_ID_MODE 0b01 it would also name the subgroup,
            // which dropping it would change.
            if sg.first_object_mode && sg.out_prev.is_none() {
                return Err(unsupported(
                    "'does not exist' as the object that names the subgroup",
                ));
            }
            return Ok((sg, 0));
        }
        let props = status_props(src, status, props)?;
        dst.check_id(id)?;
        let out_delta = match sg.out_prev {
            None => Some(id),
            Some(p) => p.checked_add(1).and_then(|next| id.checked_sub(next)),
        }
        .ok_or(bad("object IDs must increase"))?;
        self.put(out_delta)?;
        if sg.properties {
            let content = match props {
                Some(p) => transcode_kvps(p, src, dst)?,
                None => Vec::new(),
            };
            put_block(dst, &mut self.scratch, &content)?;
        }
        self.put(len)?;
        if len == 0 {
            self.put(status.code())?;
        }
        sg.out_prev = Some(id);
        Ok((sg, len))
    }

    fn fetch_entry(
        &mut self,
        mut f: FetchState,
        cur: &mut &[u8],
    ) -> Result<(FetchState, u64), Stop> {
        let entry = match self.src {
            Wire::D14 => read_d14_entry(cur)?,
            Wire::D16 | Wire::D18 => {
                read_flagged_entry(self.src, cur, &mut f.input, self.descending)?
            }
        };
        let len = match self.dst {
            Wire::D14 => write_d14_entry(self.src, &mut self.scratch, &entry)?,
            Wire::D16 => write_d16_entry(self.src, &mut self.scratch, &entry, &mut f.output)?,
            Wire::D18 => write_d18_entry(
                self.src,
                &mut self.scratch,
                &entry,
                &mut f.output,
                self.descending,
            )?,
        };
        Ok((f, len))
    }
}

/// Draft 14 §10.4.4: every field explicit, and a status after an empty payload.
fn read_d14_entry<'a>(cur: &mut &'a [u8]) -> Result<Entry<'a>, Stop> {
    let w = Wire::D14;
    let group = w.get(cur)?;
    let subgroup = w.get(cur)?;
    let object = w.get(cur)?;
    let priority = get_u8(cur)?;
    let props = read_block(w, cur)?;
    let len = w.get(cur)?;
    let status = match len {
        0 => Status::read(w, w.get(cur)?)?,
        _ => Status::Normal,
    };
    Ok(Entry::Object {
        group,
        // Draft 14 gives a datagram object its Object ID as Subgroup ID, which
        // cannot be told apart from a real subgroup, so it stays one.
        subgroup: Some(subgroup),
        object,
        priority,
        props: Some(props),
        len,
        status,
    })
}

/// Draft 16 §10.4.4 and draft 18 §11.4.4: Serialization Flags. They differ in
/// the Group and Object fields: absolute in 16; in 18 a Group ID Delta that
/// moves in the group order, and an Object ID Delta that is absolute only
/// when the group field is present.
fn read_flagged_entry<'a>(
    w: Wire,
    cur: &mut &'a [u8],
    prior: &mut Prior,
    descending: bool,
) -> Result<Entry<'a>, Stop> {
    let mut p = *prior;
    let flags = w.get(cur)?;
    if flags == END_OF_NONEXISTENT_RANGE || flags == END_OF_UNKNOWN_RANGE {
        let group = read_fetch_group(w, cur, &p, descending)?;
        // With the group field present the object field is absolute in both.
        let object = w.get(cur)?;
        // Draft 18 §11.4.4.2: an End of Range replaces the prior Group and
        // Object but not the prior Subgroup or Priority. Draft 16 is silent;
        // the same rule is assumed.
        p.group = Some(group);
        p.object = Some(object);
        *prior = p;
        return Ok(Entry::EndOfRange {
            unknown: flags == END_OF_UNKNOWN_RANGE,
            group,
            object,
        });
    }
    if flags >= 0x80 {
        return Err(bad("serialization flags"));
    }
    if p.group.is_none() && flags & 0x0c != 0x0c {
        return Err(bad("first fetch object must carry group and object"));
    }
    let group = match flags & 0x08 {
        0 => p.group.ok_or(bad("no prior group"))?,
        _ => read_fetch_group(w, cur, &p, descending)?,
    };
    let subgroup = match (flags & 0x40, flags & 0x03) {
        (0x40, _) => None,
        (_, 0) => Some(0),
        (_, 1) => Some(p.subgroup.ok_or(bad("no prior subgroup"))?),
        (_, 2) => Some(
            p.subgroup
                .and_then(|s| s.checked_add(1))
                .ok_or(bad("no prior subgroup"))?,
        ),
        _ => Some(w.get(cur)?),
    };
    let object = match flags & 0x04 {
        0 => p.object.and_then(|o| o.checked_add(1)),
        _ => {
            let v = w.get(cur)?;
            // Draft 16's text makes a present Object ID absolute even without
            // the group field; moq-net reads it as a delta there, but never
            // writes that combination, and neither does this module.
            if w == Wire::D16 || flags & 0x08 != 0 {
                Some(v)
            } else {
                p.object.and_then(|o| o.checked_add(v))
            }
        }
    }
    .ok_or(bad("object ID overflow or no prior object"))?;
    let priority = match flags & 0x10 {
        0 => p.priority.ok_or(bad("no prior priority"))?,
        _ => get_u8(cur)?,
    };
    let props = match flags & 0x20 {
        0 => None,
        _ => Some(read_block(w, cur)?),
    };
    let len = w.get(cur)?;
    p.group = Some(group);
    p.object = Some(object);
    if subgroup.is_some() {
        p.subgroup = subgroup;
    }
    p.datagram = subgroup.is_none();
    p.priority = Some(priority);
    *prior = p;
    Ok(Entry::Object {
        group,
        subgroup,
        object,
        priority,
        props,
        len,
        status: Status::Normal,
    })
}

fn read_fetch_group(w: Wire, cur: &mut &[u8], p: &Prior, descending: bool) -> Result<u64, Stop> {
    let v = w.get(cur)?;
    match (w, p.group) {
        (Wire::D18, Some(prev)) if descending => prev
            .checked_sub(v)
            .and_then(|g| g.checked_sub(1))
            .ok_or(bad("group ID underflow")),
        (Wire::D18, Some(prev)) => prev
            .checked_add(v)
            .and_then(|g| g.checked_add(1))
            .ok_or(bad("group ID overflow")),
        _ => Ok(v),
    }
}

fn write_d14_entry(src: Wire, out: &mut Vec<u8>, e: &Entry<'_>) -> Result<u64, Stop> {
    let w = Wire::D14;
    let Entry::Object {
        group,
        subgroup,
        object,
        priority,
        props,
        len,
        ..
    } = *e
    else {
        return match e {
            // Draft 14 §9.16.3: gaps in a fetch response already mean "does not
            // exist", so the marker is redundant there.
            Entry::EndOfRange { unknown: false, .. } => Ok(0),
            _ => Err(unsupported("End of Unknown Range on a draft-14 fetch")),
        };
    };
    w.put(out, group)?;
    // Draft 14 §10.4.4: a datagram object's Subgroup ID is its Object ID.
    w.put(out, subgroup.unwrap_or(object))?;
    w.put(out, object)?;
    out.push(priority);
    let content = match props {
        Some(p) => transcode_kvps(p, src, w)?,
        None => Vec::new(),
    };
    put_block(w, out, &content)?;
    w.put(out, len)?;
    if len == 0 {
        w.put(out, Status::Normal.code())?;
    }
    Ok(len)
}

/// The Subgroup bits of the Serialization Flags for `subgroup` after `p`.
fn subgroup_bits(subgroup: Option<u64>, p: &Prior) -> u64 {
    let prior = if p.datagram { None } else { p.subgroup };
    match subgroup {
        None => 0x40,
        Some(0) => 0x00,
        Some(s) if prior == Some(s) => 0x01,
        Some(s) if prior.and_then(|v| v.checked_add(1)) == Some(s) => 0x02,
        Some(_) => 0x03,
    }
}

/// Writes the Subgroup, Priority and Properties fields and the payload length
/// of a flagged fetch object, which 16 and 18 share; `flags` already holds the
/// Group and Object bits and `ids` the fields they announce.
#[allow(clippy::too_many_arguments)]
fn put_flagged_object(
    src: Wire,
    w: Wire,
    out: &mut Vec<u8>,
    mut flags: u64,
    ids: (Option<u64>, Option<u64>),
    subgroup: Option<u64>,
    priority: u8,
    props: Option<&[u8]>,
    len: u64,
    p: &mut Prior,
) -> Result<(), Stop> {
    flags |= subgroup_bits(subgroup, p);
    if p.priority != Some(priority) {
        flags |= 0x10;
    }
    let content = match props {
        Some(b) if !b.is_empty() => Some(transcode_kvps(b, src, w)?),
        _ => None,
    };
    if content.is_some() {
        flags |= 0x20;
    }
    w.put(out, flags)?;
    if let Some(g) = ids.0 {
        w.put(out, g)?;
    }
    if flags & 0x43 == 0x03 {
        w.put(out, subgroup.unwrap_or(0))?;
    }
    if let Some(o) = ids.1 {
        w.put(out, o)?;
    }
    if flags & 0x10 != 0 {
        out.push(priority);
    }
    if let Some(c) = &content {
        put_block(w, out, c)?;
    }
    w.put(out, len)?;
    if subgroup.is_some() {
        p.subgroup = subgroup;
    }
    p.datagram = subgroup.is_none();
    p.priority = Some(priority);
    Ok(())
}

fn write_d16_entry(
    src: Wire,
    out: &mut Vec<u8>,
    e: &Entry<'_>,
    p: &mut Prior,
) -> Result<u64, Stop> {
    let w = Wire::D16;
    match *e {
        Entry::EndOfRange {
            unknown,
            group,
            object,
        } => {
            let flag = match unknown {
                true => END_OF_UNKNOWN_RANGE,
                false => END_OF_NONEXISTENT_RANGE,
            };
            w.put(out, flag)?;
            w.put(out, group)?;
            w.put(out, object)?;
            // Draft 16 does not say which prior an object after an End of
            // Range refers to, so the next object spells everything out.
            *p = Prior::default();
            Ok(0)
        }
        Entry::Object {
            group,
            subgroup,
            object,
            priority,
            props,
            len,
            ..
        } => {
            // Omitted IDs are still IDs the peer computes.
            w.check_id(group)?;
            w.check_id(object)?;
            // The Object ID alone is never written: draft 16's text and
            // moq-net read it differently (absolute vs. delta) without the
            // Group ID, and agree with it.
            let next =
                p.group == Some(group) && p.object.and_then(|o| o.checked_add(1)) == Some(object);
            let (flags, ids) = match next {
                true => (0, (None, None)),
                false => (0x0c, (Some(group), Some(object))),
            };
            put_flagged_object(src, w, out, flags, ids, subgroup, priority, props, len, p)?;
            p.group = Some(group);
            p.object = Some(object);
            Ok(len)
        }
    }
}

/// The draft-18 Group ID Delta from the prior entry to `group`; `None` when
/// the move cannot be written (same group, or against the group order).
fn d18_group_delta(p: &Prior, group: u64, descending: bool) -> Option<u64> {
    match p.group {
        None => Some(group),
        Some(prev) if descending => prev.checked_sub(group)?.checked_sub(1),
        Some(prev) => group.checked_sub(prev)?.checked_sub(1),
    }
}

fn write_d18_entry(
    src: Wire,
    out: &mut Vec<u8>,
    e: &Entry<'_>,
    p: &mut Prior,
    descending: bool,
) -> Result<u64, Stop> {
    let w = Wire::D18;
    match *e {
        Entry::EndOfRange {
            unknown,
            group,
            object,
        } => {
            // Draft 18's End of Range always moves the group, so one inside
            // the prior entry's group has no spelling. For a non-existent
            // range nothing is lost by leaving it out: gaps in a fetch
            // response already mean "does not exist" (§10.12.3).
            let Some(delta) = d18_group_delta(p, group, descending) else {
                return match (unknown, p.group == Some(group)) {
                    (false, _) => Ok(0),
                    (true, true) => Err(unsupported(
                        "End of Unknown Range inside the prior entry's group",
                    )),
                    (true, false) => Err(bad("fetch groups against the group order")),
                };
            };
            let flag = match unknown {
                true => END_OF_UNKNOWN_RANGE,
                false => END_OF_NONEXISTENT_RANGE,
            };
            w.put(out, flag)?;
            w.put(out, delta)?;
            w.put(out, object)?;
            p.group = Some(group);
            p.object = Some(object);
            Ok(0)
        }
        Entry::Object {
            group,
            subgroup,
            object,
            priority,
            props,
            len,
            status,
        } => {
            // A draft-14 status object marks a missing or final location;
            // draft 18 fetch objects have no status and take gaps as "does
            // not exist", so the marker goes.
            if status != Status::Normal {
                return Ok(0);
            }
            let (flags, ids) = if p.group == Some(group) {
                let prev = p.object.ok_or(bad("no prior object"))?;
                match object.checked_sub(prev) {
                    Some(1) => (0, (None, None)),
                    Some(d) => (0x04, (None, Some(d))),
                    None => return Err(bad("object IDs go backwards in a fetch group")),
                }
            } else {
                let delta = d18_group_delta(p, group, descending)
                    .ok_or(bad("fetch groups against the group order"))?;
                (0x0c, (Some(delta), Some(object)))
            };
            put_flagged_object(src, w, out, flags, ids, subgroup, priority, props, len, p)?;
            p.group = Some(group);
            p.object = Some(object);
            Ok(len)
        }
    }
}

/// Translates one datagram (object datagram or status datagram), with
/// [`DEFAULT_PRIORITY`] written where draft 14 needs a priority that the
/// draft-18 datagram left to the subscription.
///
/// Besides malformed input, it fails with [`TranscodeError::Unsupported`] for
/// a draft-18 padding datagram and for a draft-14 status "does not exist"
/// (draft 18 has no such status); the caller drops those datagrams.
pub fn transcode_datagram(
    draft: Draft,
    dir: Direction,
    datagram: &[u8],
) -> Result<Bytes, TranscodeError> {
    transcode_datagram_with_priority(draft, dir, datagram, DEFAULT_PRIORITY)
}

/// Like [`transcode_datagram`], writing `default_priority` (the track's
/// DEFAULT PUBLISHER PRIORITY) where draft 14 needs one.
pub fn transcode_datagram_with_priority(
    draft: Draft,
    dir: Direction,
    datagram: &[u8],
    default_priority: u8,
) -> Result<Bytes, TranscodeError> {
    let (src, dst) = Wire::pair(draft, dir);
    let mut cur = datagram;
    let mut out = Vec::with_capacity(datagram.len() + 16);
    into_final(
        datagram_inner(src, dst, &mut cur, &mut out, default_priority),
        "truncated datagram",
    )?;
    Ok(Bytes::from(out))
}

fn datagram_inner(
    src: Wire,
    dst: Wire,
    cur: &mut &[u8],
    out: &mut Vec<u8>,
    default_priority: u8,
) -> Result<(), Stop> {
    let t = src.get(cur)?;
    if src == Wire::D18 && t == PADDING_DATAGRAM {
        return Err(unsupported("padding"));
    }
    if !src.datagram_type(t) {
        return Err(bad("unknown datagram type"));
    }
    let alias = src.get(cur)?;
    let group = src.get(cur)?;
    let object = match t & 0x04 {
        0 => src.get(cur)?,
        _ => 0,
    };
    let priority = match t & 0x08 {
        0 => Some(get_u8(cur)?),
        _ => None,
    };
    let props = match t & 0x01 {
        0 => None,
        _ => Some(read_block(src, cur)?).filter(|b| !b.is_empty()),
    };
    if t & 0x01 != 0 && props.is_none() {
        return Err(bad("empty datagram extensions"));
    }
    let status = match t & 0x20 {
        0 => None,
        _ => Some(Status::read(src, src.get(cur)?)?),
    };
    if status.is_some() && !cur.is_empty() {
        return Err(bad("bytes after datagram status"));
    }
    if status == Some(Status::DoesNotExist) {
        return Err(unsupported("object status 'does not exist'"));
    }
    let props = status_props(src, status.unwrap_or(Status::Normal), props)?;
    let content = match props {
        Some(p) => Some(transcode_kvps(p, src, dst)?),
        None => None,
    };
    let priority = match dst {
        Wire::D14 => Some(priority.unwrap_or(default_priority)),
        Wire::D16 | Wire::D18 => priority,
    };

    let mut out_t = t & 0x22;
    if content.is_some() {
        out_t |= 0x01;
    }
    // Draft 14 has ZERO_OBJECT_ID only on payload types (0x04-0x07).
    let zero_id = object == 0 && !(dst == Wire::D14 && status.is_some());
    if zero_id {
        out_t |= 0x04;
    }
    if priority.is_none() {
        out_t |= 0x08;
    }
    dst.put(out, out_t)?;
    dst.put(out, alias)?;
    dst.put(out, group)?;
    if !zero_id {
        dst.put(out, object)?;
    }
    if let Some(p) = priority {
        out.push(p);
    }
    if let Some(c) = &content {
        put_block(dst, out, c)?;
    }
    match status {
        Some(s) => dst.put(out, s.code())?,
        None => out.extend_from_slice(cur),
    }
    Ok(())
}

#[cfg(test)]
#[path = "data_tests.rs"]
mod tests;
