//! MPEG-TS demuxing (ISO/IEC 13818-1): PAT, PMT and PES into [`Frame`]s.
//!
//! Hand-written rather than built on a crate: `mpeg2ts-reader` (maintained,
//! 0.18) is push-based but drives the caller through a callback framework
//! (`DemuxContext`, `packet_filter_switch!`, per-stream consumer objects)
//! that would have to be wrapped in exactly the queueing this module needs
//! anyway, and it stops at PES payload chunks; `mpeg2ts` reads from an
//! `io::Read`, which is not sans-IO. The transport layer is the small part
//! here (sync, PSI sections, PES reassembly: a few hundred lines); most of
//! the work is making the output match what the fMP4 demuxer gives (Annex B
//! to length-prefixed NAL units, parameter sets moved into `avcC`/`hvcC`,
//! ADTS headers stripped), which no TS crate does.
//!
//! What comes out:
//! - [`Event::Tracks`] once every supported stream of the first program has
//!   shown its decoder configuration (SPS/PPS, plus VPS for H.265; the first
//!   ADTS header; the first Opus packet), again when a configuration changes
//!   or the PMT does.
//! - [`Event::Frame`]s, one per access unit (video PES, ADTS frame, Opus
//!   packet), in microseconds, with 33-bit timestamp wrap-around undone.
//!   Each track's last frame is held back until the next one gives its
//!   duration (or until [`Demuxer::end`]).
//!
//! Damage is counted in [`TsStats`] and skipped where recovery is obvious:
//! garbage before or between packets (resync on 0x47), packets with the
//! transport error flag, continuity-counter gaps (the PES in progress is
//! dropped, and video waits for the next keyframe), sections with a bad CRC.

use std::collections::VecDeque;

use bytes::Bytes;
use mp4_atom::{Atom, Avcc, AvccExt, HvcCArray, Hvcc};

use crate::codec::{
    aac_codec_string, aac_config, avc_codec_string, hevc_codec_string, opus_head, AAC_SAMPLE_RATES,
};
use crate::{to_micros, Demuxer, Error, Event, Frame, Limits, TrackInfo};

const PACKET: usize = 188;
const SYNC: u8 = 0x47;
/// Bytes scanned without finding three sync bytes 188 apart before the input
/// is declared not MPEG-TS: generous for a capture that starts mid-packet or
/// behind a few junk bytes, small enough that an MP4 fed by mistake fails
/// quickly.
const SYNC_SEARCH: u64 = 64 * 1024;
/// Consumed input kept in the buffer before it is compacted.
const COMPACT: usize = 64 * 1024;
/// 2^33: PTS/DTS are 33-bit counters of a 90 kHz clock.
const WRAP: i64 = 1 << 33;
/// How long (in decode time of the frames waiting) the first `Tracks` waits
/// for a PMT stream that carries nothing before giving up on that stream; a
/// PMT may list an audio PID that an encoder never fills.
const GIVE_UP_US: i64 = 20_000_000;

/// Counters of what the demuxer skipped or repaired, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsStats {
    /// 188-byte packets parsed.
    pub packets: u64,
    /// Bytes skipped while looking for the sync byte.
    pub garbage_bytes: u64,
    /// Packets dropped: transport error flag, reserved adaptation field
    /// control, impossible adaptation field length, scrambled.
    pub damaged_packets: u64,
    /// Continuity-counter gaps (lost packets) on elementary streams.
    pub continuity_errors: u64,
    /// PSI sections dropped for a bad CRC or a malformed layout.
    pub bad_sections: u64,
    /// PES packets dropped (malformed header, loss inside them).
    pub dropped_pes: u64,
    /// Frames dropped: video before its first keyframe (or the next one after
    /// a loss), or before its parameter sets; unparsable audio.
    pub dropped_frames: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Codec {
    H264,
    H265,
    Aac,
    Opus { channels: u8 },
}

impl Codec {
    fn is_video(self) -> bool {
        matches!(self, Codec::H264 | Codec::H265)
    }
}

/// One elementary stream of the PMT that this demuxer understands.
#[derive(Debug)]
struct Stream {
    pid: u16,
    stream_type: u8,
    codec: Codec,
    /// Last continuity counter of a packet with payload.
    cc: Option<u8>,
    /// The PES being reassembled; `collecting` is false until a PES start
    /// (after joining mid-PES, or after a loss).
    pes: Vec<u8>,
    collecting: bool,
    /// Parameter sets of the current configuration (video).
    vps: Vec<Vec<u8>>,
    sps: Vec<Vec<u8>>,
    pps: Vec<Vec<u8>>,
    /// A keyframe has been output since the start or the last loss (video).
    seen_key: bool,
    /// ADTS bytes of a frame that continues in the next PES (audio).
    audio_buf: Vec<u8>,
    /// Where the next audio frame starts: a PES's 90 kHz PTS and the
    /// samples since it. Counting samples from the last PTS, rather than
    /// adding rounded frame durations, keeps 44.1 kHz from drifting.
    audio_next: Option<(i64, u64)>,
    info: Option<TrackInfo>,
    /// Given up on (never configured); ignored from then on.
    dropped: bool,
    /// The last frame, waiting for the next one's dts to know its duration.
    held: Option<Frame>,
    last_dts: Option<i64>,
}

impl Stream {
    fn new(pid: u16, stream_type: u8, codec: Codec) -> Self {
        Self {
            pid,
            stream_type,
            codec,
            cc: None,
            pes: Vec::new(),
            collecting: false,
            vps: Vec::new(),
            sps: Vec::new(),
            pps: Vec::new(),
            seen_key: false,
            audio_buf: Vec::new(),
            audio_next: None,
            info: None,
            dropped: false,
            held: None,
            last_dts: None,
        }
    }

    /// Forgets the PES in progress after lost or damaged input: its bytes
    /// cannot be trusted, and video frames that reference it cannot decode.
    fn lose(&mut self) {
        self.pes.clear();
        self.collecting = false;
        self.audio_buf.clear();
        self.audio_next = None;
        if self.codec.is_video() {
            self.seen_key = false;
        }
    }
}

/// A PSI section being reassembled from packet payloads.
#[derive(Debug, Default)]
struct Section {
    buf: Vec<u8>,
    active: bool,
}

impl Section {
    /// Adds one packet's payload; returns the sections it completed.
    fn push(&mut self, pusi: bool, payload: &[u8]) -> Vec<Vec<u8>> {
        let mut done = Vec::new();
        let mut rest = payload;
        if pusi {
            let Some((&ptr, tail)) = payload.split_first() else {
                return done;
            };
            let ptr = usize::from(ptr).min(tail.len());
            if self.active {
                self.buf.extend_from_slice(&tail[..ptr]);
                self.take(&mut done);
            }
            self.buf.clear();
            self.active = true;
            rest = &tail[ptr..];
        } else if !self.active {
            return done;
        }
        // A section is at most 4096 bytes; more means a lost start.
        if self.buf.len() + rest.len() > 4096 + PACKET {
            self.buf.clear();
            self.active = false;
            return done;
        }
        self.buf.extend_from_slice(rest);
        self.take(&mut done);
        done
    }

    fn take(&mut self, done: &mut Vec<Vec<u8>>) {
        loop {
            // 0xFF is stuffing after the last section in a packet.
            if self.buf.first().is_none_or(|&b| b == 0xFF) {
                if !self.buf.is_empty() {
                    self.buf.clear();
                    self.active = false;
                }
                return;
            }
            if self.buf.len() < 3 {
                return;
            }
            let len = 3 + (usize::from(self.buf[1] & 0x0F) << 8 | usize::from(self.buf[2]));
            if self.buf.len() < len {
                return;
            }
            done.push(self.buf.drain(..len).collect());
        }
    }
}

/// CRC-32/MPEG-2 (ISO/IEC 13818-1 Annex A): a whole section, CRC included,
/// gives 0. Bitwise because sections are rare and small.
fn crc32_mpeg2(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A section's table id and the bytes between its 8-byte long header and
/// its CRC, or `None` when it is damaged, not yet applicable
/// (`current_next_indicator` 0) or of the wrong table.
fn section_body(s: &[u8], table_id: u8) -> Option<&[u8]> {
    if s.len() < 12 || s[0] != table_id || s[1] & 0x80 == 0 || crc32_mpeg2(s) != 0 {
        return None;
    }
    if s[5] & 0x01 == 0 {
        return None;
    }
    Some(&s[8..s.len() - 4])
}

/// An incremental MPEG-TS demuxer (H.264, H.265, AAC in ADTS, Opus).
///
/// Feed it with [`Demuxer::push`], drain it with [`Demuxer::next`]. Besides
/// the pushed bytes that `next` has not parsed yet (less than a packet once
/// drained), it buffers one PES per stream (bounded by [`Limits::max_box`]),
/// one held-back frame per track and, before the first [`Event::Tracks`],
/// the frames of streams that are already configured (bounded the same way).
/// After an error other than [`Error::WrongFormat`] it can be fed on: the
/// offending PES or PMT is dropped.
#[derive(Debug, Default)]
pub struct TsDemuxer {
    limits: Limits,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
    finished: bool,
    synced: bool,
    ever_synced: bool,
    /// Input seen in total, for the "never synced" verdict.
    seen: u64,
    events: VecDeque<Event>,
    /// Errors found while producing events, returned after the events that
    /// precede them.
    errors: VecDeque<Error>,
    wrong_format: Option<Error>,
    pat: Section,
    pmt: Section,
    pmt_pid: Option<u16>,
    /// The PMT's stream list as last seen, to tell a new PMT from a repeat.
    pmt_streams: Vec<(u16, u8, Option<Codec>)>,
    pmt_seen: bool,
    streams: Vec<Stream>,
    tracks_emitted: bool,
    /// Frames of configured streams waiting for the first `Tracks`.
    waiting: VecDeque<Frame>,
    waiting_bytes: u64,
    /// Last unwrapped 90 kHz decode time, the reference that tells a 33-bit
    /// wrap from a small step back (B-frame PTS, interleaved streams).
    clock: Option<i64>,
    stats: TsStats,
}

impl TsDemuxer {
    /// A demuxer with the given limits.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// What was skipped or repaired so far.
    pub fn stats(&self) -> &TsStats {
        &self.stats
    }

    /// Parses packets until an event or error is ready or input runs out.
    fn step(&mut self) -> Result<bool, Error> {
        let avail = self.buf.len() - self.pos;
        if avail < PACKET {
            if self.ended && !self.finished {
                self.finish(avail);
                return Ok(true);
            }
            return Ok(false);
        }
        if self.buf[self.pos] != SYNC || !self.synced {
            return self.resync();
        }
        let mut p = [0u8; PACKET];
        p.copy_from_slice(&self.buf[self.pos..self.pos + PACKET]);
        self.pos += PACKET;
        self.compact();
        self.packet(&p)?;
        Ok(true)
    }

    /// Finds the next position where three packets' sync bytes line up (or
    /// as many as the input holds, at its end).
    fn resync(&mut self) -> Result<bool, Error> {
        if self.synced {
            // Lost sync between packets: a corrupt or cut packet.
            self.synced = false;
            self.stats.damaged_packets += 1;
        }
        let mut i = self.pos;
        while i < self.buf.len() {
            if self.buf[i] == SYNC {
                let mut ok = true;
                let mut complete = true;
                for k in 1..3 {
                    match self.buf.get(i + k * PACKET) {
                        Some(&b) => ok &= b == SYNC,
                        None => complete = false,
                    }
                }
                if ok && !complete && !self.ended {
                    // Could be sync; wait for the bytes that would confirm it.
                    break;
                }
                if ok && (complete || self.buf.len() - i >= PACKET) {
                    self.skip_garbage(i - self.pos)?;
                    self.synced = true;
                    self.ever_synced = true;
                    return Ok(true);
                }
            }
            i += 1;
        }
        // Everything before the candidate (or the whole buffer, when no
        // position can still turn out to be sync) is garbage.
        self.skip_garbage(i - self.pos)?;
        Ok(self.ended)
    }

    fn skip_garbage(&mut self, n: usize) -> Result<(), Error> {
        self.pos += n;
        self.stats.garbage_bytes += n as u64;
        self.compact();
        if !self.ever_synced && self.stats.garbage_bytes >= SYNC_SEARCH {
            let e = self.not_ts();
            self.wrong_format = Some(e.clone());
            return Err(e);
        }
        Ok(())
    }

    fn not_ts(&self) -> Error {
        Error::WrongFormat {
            expected: "MPEG-TS",
            detail: format!(
                "no 0x47 sync byte repeating every 188 bytes in the first {} bytes",
                self.stats.garbage_bytes
            ),
        }
    }

    fn compact(&mut self) {
        if self.pos >= COMPACT || (self.pos > 0 && self.pos == self.buf.len()) {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    fn packet(&mut self, p: &[u8; PACKET]) -> Result<(), Error> {
        self.stats.packets += 1;
        let pid = u16::from(p[1] & 0x1F) << 8 | u16::from(p[2]);
        let si = self.streams.iter().position(|s| s.pid == pid);
        let damaged = |me: &mut Self| {
            me.stats.damaged_packets += 1;
            if let Some(si) = si {
                me.streams[si].lose();
                me.streams[si].cc = None;
            }
            Ok(())
        };
        if p[1] & 0x80 != 0 {
            // Its PID may be the damaged part, so no stream is blamed; if it
            // was one of ours, the continuity counter of the next packet
            // tells.
            self.stats.damaged_packets += 1;
            return Ok(());
        }
        if pid == 0x1FFF {
            return Ok(());
        }
        let pusi = p[1] & 0x40 != 0;
        let scrambled = p[3] & 0xC0 != 0;
        let afc = (p[3] >> 4) & 0x03;
        let cc = p[3] & 0x0F;
        if afc == 0 {
            return damaged(self);
        }
        let mut start = 4;
        let mut discontinuity = false;
        if afc & 0x02 != 0 {
            let len = usize::from(p[4]);
            let max = if afc == 0x02 { 183 } else { 182 };
            if len > max {
                return damaged(self);
            }
            discontinuity = len > 0 && p[5] & 0x80 != 0;
            start = 5 + len;
        }
        let has_payload = afc & 0x01 != 0;
        let payload: &[u8] = if has_payload { &p[start..] } else { &[] };
        if scrambled && has_payload {
            return damaged(self);
        }
        if pid == 0 {
            for s in self.pat.push(pusi, payload) {
                self.on_pat(&s);
            }
            return Ok(());
        }
        if Some(pid) == self.pmt_pid {
            for s in self.pmt.push(pusi, payload) {
                self.on_pmt(&s)?;
            }
            return Ok(());
        }
        let Some(si) = si else { return Ok(()) };
        if !has_payload || self.streams[si].dropped {
            return Ok(());
        }
        if let Some(last) = self.streams[si].cc {
            if !discontinuity {
                if cc == last {
                    // ISO/IEC 13818-1 allows one duplicate of a packet.
                    return Ok(());
                }
                if cc != (last + 1) & 0x0F {
                    self.stats.continuity_errors += 1;
                    if self.streams[si].collecting {
                        self.stats.dropped_pes += 1;
                    }
                    self.streams[si].lose();
                }
            }
        }
        self.streams[si].cc = Some(cc);
        self.pes_payload(si, pusi, payload)
    }

    fn on_pat(&mut self, s: &[u8]) {
        let Some(body) = section_body(s, 0x00) else {
            self.stats.bad_sections += 1;
            return;
        };
        // The first real program; program 0 points at the network PID.
        let pmt = body
            .chunks_exact(4)
            .find(|e| u16::from_be_bytes([e[0], e[1]]) != 0)
            .map(|e| u16::from(e[2] & 0x1F) << 8 | u16::from(e[3]));
        if pmt.is_some() && pmt != self.pmt_pid {
            self.pmt_pid = pmt;
            self.pmt = Section::default();
        }
    }

    fn on_pmt(&mut self, s: &[u8]) -> Result<(), Error> {
        let Some(body) = section_body(s, 0x02) else {
            self.stats.bad_sections += 1;
            return Ok(());
        };
        if body.len() < 4 {
            self.stats.bad_sections += 1;
            return Ok(());
        }
        let info_len = usize::from(body[2] & 0x0F) << 8 | usize::from(body[3]);
        let Some(mut es) = body.get(4 + info_len..) else {
            self.stats.bad_sections += 1;
            return Ok(());
        };
        let mut list = Vec::new();
        while es.len() >= 5 {
            let stream_type = es[0];
            let pid = u16::from(es[1] & 0x1F) << 8 | u16::from(es[2]);
            let len = usize::from(es[3] & 0x0F) << 8 | usize::from(es[4]);
            let Some(desc) = es.get(5..5 + len) else {
                self.stats.bad_sections += 1;
                return Ok(());
            };
            list.push((pid, stream_type, codec_of(stream_type, desc)));
            es = &es[5 + len..];
        }
        if self.pmt_seen && list == self.pmt_streams {
            return Ok(());
        }
        self.pmt_seen = true;
        self.pmt_streams = list.clone();
        let supported: Vec<_> = list
            .iter()
            .filter_map(|&(pid, t, c)| c.map(|c| (pid, t, c)))
            .collect();
        if supported.is_empty() {
            let found: Vec<String> = list
                .iter()
                .map(|(pid, t, _)| format!("{t:#04x} on PID {pid}"))
                .collect();
            return Err(Error::UnsupportedCodec(format!(
                "MPEG-TS program with no supported stream (found: {}; supported: \
                 0x1b H.264, 0x24 H.265, 0x0f AAC in ADTS, 0x06 with an 'Opus' registration)",
                if found.is_empty() {
                    "none".to_string()
                } else {
                    found.join(", ")
                }
            )));
        }
        if supported.len() > self.limits.max_tracks {
            return Err(Error::malformed(
                "PMT",
                format!(
                    "{} supported streams, more than the limit of {} tracks",
                    supported.len(),
                    self.limits.max_tracks
                ),
            ));
        }
        // Streams that stay keep their state (a PMT version bump for an
        // unrelated change must not cost a keyframe); the others go, with
        // their last frame.
        let mut old = std::mem::take(&mut self.streams);
        for (pid, t, c) in supported {
            let s = match old
                .iter()
                .position(|s| s.pid == pid && s.stream_type == t && s.codec == c)
            {
                Some(i) => old.swap_remove(i),
                None => Stream::new(pid, t, c),
            };
            self.streams.push(s);
        }
        for f in old.iter_mut().filter_map(|s| s.held.take()) {
            self.out(f)?;
        }
        self.tracks_emitted = false;
        self.check_ready();
        Ok(())
    }

    fn pes_payload(&mut self, si: usize, pusi: bool, payload: &[u8]) -> Result<(), Error> {
        let limit = self.limits.max_box;
        if pusi {
            let s = &mut self.streams[si];
            if s.collecting && !s.pes.is_empty() {
                let pes = std::mem::take(&mut s.pes);
                self.on_pes(si, pes)?;
            }
            let s = &mut self.streams[si];
            s.pes.clear();
            s.collecting = true;
        }
        let s = &mut self.streams[si];
        if !s.collecting {
            // Joined mid-PES: wait for the next start.
            return Ok(());
        }
        let size = (s.pes.len() + payload.len()) as u64;
        let declared = declared_len(&s.pes).map_or(0, |l| l as u64);
        if size > limit || declared > limit {
            let pid = s.pid;
            s.lose();
            self.stats.dropped_pes += 1;
            return Err(Error::TooLarge {
                what: format!("PES on PID {pid}"),
                size: size.max(declared),
                limit,
            });
        }
        s.pes.extend_from_slice(payload);
        if let Some(len) = declared_len(&s.pes) {
            if s.pes.len() >= len {
                // A PES with a length is complete without waiting for the
                // next start, which saves a packet interval of latency.
                let mut pes = std::mem::take(&mut s.pes);
                s.collecting = false;
                pes.truncate(len);
                return self.on_pes(si, pes);
            }
        }
        Ok(())
    }

    /// A complete PES packet of stream `si`.
    fn on_pes(&mut self, si: usize, pes: Vec<u8>) -> Result<(), Error> {
        let Some((pts, dts, start)) = parse_pes_header(&pes) else {
            self.stats.dropped_pes += 1;
            self.streams[si].lose();
            return Ok(());
        };
        let dts = dts.or(pts);
        let (pts, dts) = match (pts, dts) {
            (Some(p), Some(d)) => {
                let d = self.unwrap(d);
                // PTS follows DTS closely; unwrap it against DTS, not the clock.
                (Some(d + wrap_diff(p, d)), Some(d))
            }
            _ => (None, None),
        };
        let payload = &pes[start..];
        let us = |t: Option<i64>| t.map(|t| to_micros(t, 90_000));
        match self.streams[si].codec {
            Codec::H264 | Codec::H265 => self.video_au(si, us(pts), us(dts), payload),
            // Audio keeps 90 kHz so frame times are exact sums of samples.
            Codec::Aac => self.adts(si, pts, payload),
            Codec::Opus { .. } => self.opus(si, pts, payload),
        }
    }

    /// Undoes the 33-bit wrap of a 90 kHz timestamp: picks the value
    /// congruent modulo 2^33 that is nearest the last one seen.
    fn unwrap(&mut self, t: u64) -> i64 {
        let t = t as i64;
        let v = match self.clock {
            None => t,
            Some(c) => c + wrap_diff(t, c),
        };
        self.clock = Some(v);
        v
    }

    fn video_au(
        &mut self,
        si: usize,
        pts: Option<i64>,
        dts: Option<i64>,
        payload: &[u8],
    ) -> Result<(), Error> {
        let h265 = self.streams[si].codec == Codec::H265;
        let (mut vps, mut sps, mut pps) = (Vec::new(), Vec::new(), Vec::new());
        let mut data = Vec::with_capacity(payload.len() + 16);
        let mut key = false;
        for nal in annexb_nals(payload) {
            let Some(&b0) = nal.first() else { continue };
            if h265 {
                match (b0 >> 1) & 0x3F {
                    32 => vps.push(nal.to_vec()),
                    33 => sps.push(nal.to_vec()),
                    34 => pps.push(nal.to_vec()),
                    35 => {}
                    t => {
                        key |= (16..=23).contains(&t);
                        push_nal(&mut data, nal);
                    }
                }
            } else {
                match b0 & 0x1F {
                    7 => sps.push(nal.to_vec()),
                    8 => pps.push(nal.to_vec()),
                    9 => {}
                    t => {
                        key |= t == 5;
                        push_nal(&mut data, nal);
                    }
                }
            }
        }
        if !(vps.is_empty() && sps.is_empty() && pps.is_empty()) {
            let s = &self.streams[si];
            let vps = if vps.is_empty() { s.vps.clone() } else { vps };
            let sps = if sps.is_empty() { s.sps.clone() } else { sps };
            let pps = if pps.is_empty() { s.pps.clone() } else { pps };
            let complete = !sps.is_empty() && !pps.is_empty() && (!h265 || !vps.is_empty());
            if complete && (vps != s.vps || sps != s.sps || pps != s.pps) {
                let info = if h265 {
                    hevc_track(u32::from(s.pid), &vps, &sps, &pps)?
                } else {
                    avc_track(u32::from(s.pid), &sps, &pps)?
                };
                let s = &mut self.streams[si];
                (s.vps, s.sps, s.pps) = (vps, sps, pps);
                self.set_info(si, info, dts)?;
            }
        }
        if data.is_empty() {
            return Ok(());
        }
        let s = &mut self.streams[si];
        let (Some(pts), Some(dts)) = (pts, dts) else {
            // A PES without timestamps continues the access unit before it.
            match &mut s.held {
                Some(h) if s.seen_key => {
                    let mut v = h.data.to_vec();
                    v.extend_from_slice(&data);
                    h.data = v.into();
                }
                _ => self.stats.dropped_frames += 1,
            }
            return Ok(());
        };
        if s.info.is_none() || !(s.seen_key || key) {
            self.stats.dropped_frames += 1;
            return Ok(());
        }
        s.seen_key = true;
        let disposable = s
            .info
            .as_ref()
            .is_some_and(|i| crate::codec::is_disposable(&i.codec, &data, 4));
        let f = Frame {
            track: u32::from(s.pid),
            pts,
            dts,
            duration: 0,
            keyframe: key,
            disposable,
            data: data.into(),
        };
        self.emit(si, f)
    }

    fn adts(&mut self, si: usize, pts: Option<i64>, payload: &[u8]) -> Result<(), Error> {
        let s = &mut self.streams[si];
        let mut buf = std::mem::take(&mut s.audio_buf);
        // A frame carried over from the previous PES started before this
        // PES's PTS, so it keeps the extrapolated time; the PTS belongs to the
        // first frame that starts here.
        let carried = buf.len();
        buf.extend_from_slice(payload);
        let mut at = 0;
        let mut pts_pending = pts;
        while buf.len() - at >= 7 {
            let h = &buf[at..];
            if h[0] != 0xFF || h[1] & 0xF6 != 0xF0 {
                // Lost ADTS sync: skip to the next syncword.
                at += 1;
                continue;
            }
            let len =
                usize::from(h[3] & 0x03) << 11 | usize::from(h[4]) << 3 | usize::from(h[5] >> 5);
            let hdr = if h[1] & 0x01 == 0 { 9 } else { 7 };
            if len < hdr {
                at += 1;
                continue;
            }
            if buf.len() - at < len {
                break;
            }
            let object_type = (h[2] >> 6) + 1;
            let rate = AAC_SAMPLE_RATES
                .get(usize::from((h[2] >> 2) & 0x0F))
                .copied();
            let channels = (h[2] & 0x01) << 2 | h[3] >> 6;
            let blocks = h[6] & 0x03;
            let frame = &buf[at + hdr..at + len];
            let started_here = at >= carried;
            at += len;
            let (Some(rate), true, 0) = (rate, channels != 0, blocks) else {
                // A PCE channel layout or several raw blocks per ADTS frame:
                // not something an AudioSpecificConfig of two bytes (or one
                // frame per sample) can carry.
                self.stats.dropped_frames += 1;
                continue;
            };
            let s = &self.streams[si];
            let pid = u32::from(s.pid);
            let want = (object_type, rate, channels);
            let have = s.info.as_ref().map(|i| {
                (
                    i.description
                        .as_ref()
                        .and_then(|d| d.first())
                        .map_or(0, |b| b >> 3),
                    i.sample_rate,
                    i.channels as u8,
                )
            });
            if have != Some(want) {
                let asc = aac_config(object_type, rate, channels)?;
                let mut info =
                    TrackInfo::audio(pid, &aac_codec_string(&asc)?, rate, channels.into());
                info.description = Some(asc);
                let t = self.streams[si].audio_next.map(|c| audio_time(c, rate));
                let t = t.or(pts_pending.map(|p| audio_time((p, 0), rate)));
                self.set_info(si, info, t)?;
            }
            let clock = match pts_pending.take() {
                Some(p) if started_here => Some((p, 0)),
                p => {
                    pts_pending = p;
                    self.streams[si].audio_next
                }
            };
            let Some(clock) = clock else {
                self.stats.dropped_frames += 1;
                continue;
            };
            let t = audio_time(clock, rate);
            self.streams[si].audio_next = Some((clock.0, clock.1 + 1024));
            let f = Frame {
                track: pid,
                pts: t,
                dts: t,
                duration: 0,
                keyframe: true,
                disposable: false,
                data: Bytes::copy_from_slice(frame),
            };
            self.emit(si, f)?;
        }
        buf.drain(..at);
        let s = &mut self.streams[si];
        if pts_pending.is_some() && !buf.is_empty() {
            // The PES's first frame starts here and continues in the next PES.
            s.audio_next = pts_pending.map(|p| (p, 0));
        }
        s.audio_buf = buf;
        Ok(())
    }

    fn opus(&mut self, si: usize, pts: Option<i64>, mut p: &[u8]) -> Result<(), Error> {
        let mut clock = pts.map(|p| (p, 0)).or(self.streams[si].audio_next);
        while p.len() >= 2 {
            // The opus_control_header of the Opus-in-MPEG-TS mapping (as
            // ffmpeg and GStreamer write it): 11-bit prefix 0x3ff, then trim
            // and extension flags, then the packet size.
            if p[0] != 0x7F || p[1] & 0xE0 != 0xE0 {
                self.stats.dropped_frames += 1;
                return Ok(());
            }
            let (start_trim, end_trim, ext) =
                (p[1] & 0x10 != 0, p[1] & 0x08 != 0, p[1] & 0x04 != 0);
            let mut i = 2;
            let mut size = 0usize;
            loop {
                let Some(&b) = p.get(i) else {
                    self.stats.dropped_frames += 1;
                    return Ok(());
                };
                i += 1;
                size += usize::from(b);
                if b != 0xFF {
                    break;
                }
            }
            let mut pre_skip = 0u16;
            if start_trim {
                pre_skip = p
                    .get(i..i + 2)
                    .map_or(0, |b| u16::from_be_bytes([b[0] & 0x1F, b[1]]));
                i += 2;
            }
            if end_trim {
                i += 2;
            }
            if ext {
                i += 1 + usize::from(p.get(i).copied().unwrap_or(0));
            }
            let Some(packet) = p.get(i..i + size) else {
                self.stats.dropped_frames += 1;
                return Ok(());
            };
            p = &p[i + size..];
            let s = &self.streams[si];
            let pid = u32::from(s.pid);
            if s.info.is_none() {
                let Codec::Opus { channels } = s.codec else {
                    return Ok(());
                };
                let mut info = TrackInfo::audio(pid, "opus", 48_000, channels.into());
                info.description = Some(opus_head(&mp4_atom::Dops {
                    output_channel_count: channels,
                    pre_skip,
                    input_sample_rate: 48_000,
                    output_gain: 0,
                    channel_mapping: None,
                }));
                self.set_info(si, info, clock.map(|c| audio_time(c, 48_000)))?;
            }
            let Some(c) = clock else {
                self.stats.dropped_frames += 1;
                continue;
            };
            let now = audio_time(c, 48_000);
            let next = (c.0, c.1 + u64::from(opus_samples(packet)));
            clock = Some(next);
            self.streams[si].audio_next = Some(next);
            let f = Frame {
                track: pid,
                pts: now,
                dts: now,
                duration: 0,
                keyframe: true,
                disposable: false,
                data: Bytes::copy_from_slice(packet),
            };
            self.emit(si, f)?;
        }
        Ok(())
    }

    /// Records a stream's (new) configuration. `dts` is the decode time of
    /// the frame that brings it, which ends the frame held before it.
    fn set_info(&mut self, si: usize, info: TrackInfo, dts: Option<i64>) -> Result<(), Error> {
        let s = &mut self.streams[si];
        if s.info.as_ref() == Some(&info) {
            return Ok(());
        }
        if let Some(mut f) = s.held.take() {
            f.duration = duration(f.dts, dts);
            self.out(f)?;
        }
        self.streams[si].info = Some(info);
        if self.tracks_emitted {
            let t = self.track_list();
            self.events.push_back(Event::Tracks(t));
        } else {
            self.check_ready();
        }
        Ok(())
    }

    fn track_list(&self) -> Vec<TrackInfo> {
        self.streams
            .iter()
            .filter(|s| !s.dropped)
            .filter_map(|s| s.info.clone())
            .collect()
    }

    /// Emits the first `Tracks` once every stream is configured, then the
    /// frames that waited for it.
    fn check_ready(&mut self) {
        if self.tracks_emitted
            || self.streams.is_empty()
            || self.streams.iter().any(|s| !s.dropped && s.info.is_none())
        {
            return;
        }
        let t = self.track_list();
        if t.is_empty() {
            return;
        }
        self.events.push_back(Event::Tracks(t));
        self.tracks_emitted = true;
        self.events.extend(self.waiting.drain(..).map(Event::Frame));
        self.waiting_bytes = 0;
    }

    /// A new frame of stream `si`: it gives the held frame its duration and
    /// takes its place.
    fn emit(&mut self, si: usize, mut f: Frame) -> Result<(), Error> {
        let s = &mut self.streams[si];
        // Timestamps jump back only on a broken or restarted encoder (a wrap
        // is already undone); clamping keeps each track's decode order
        // monotonic for the muxers downstream.
        if let Some(last) = s.last_dts {
            if f.dts < last {
                f.pts += last - f.dts;
                f.dts = last;
            }
        }
        s.last_dts = Some(f.dts);
        if let Some(mut h) = s.held.replace(f) {
            h.duration = duration(h.dts, s.held.as_ref().map(|f| f.dts));
            self.out(h)?;
        }
        Ok(())
    }

    fn out(&mut self, f: Frame) -> Result<(), Error> {
        if self.tracks_emitted {
            self.events.push_back(Event::Frame(f));
            return Ok(());
        }
        self.waiting_bytes += f.data.len() as u64;
        let first = self.waiting.front().map_or(f.dts, |w| w.dts);
        let span = f.dts - first;
        self.waiting.push_back(f);
        if span > GIVE_UP_US {
            for s in &mut self.streams {
                if s.info.is_none() {
                    s.dropped = true;
                }
            }
            self.check_ready();
        } else if self.waiting_bytes > self.limits.max_box {
            let missing: Vec<String> = self
                .streams
                .iter()
                .filter(|s| s.info.is_none())
                .map(|s| s.pid.to_string())
                .collect();
            let size = self.waiting_bytes;
            self.waiting.clear();
            self.waiting_bytes = 0;
            return Err(Error::TooLarge {
                what: format!(
                    "frames held waiting for the decoder configuration of PID {}",
                    missing.join(", ")
                ),
                size,
                limit: self.limits.max_box,
            });
        }
        Ok(())
    }

    /// End of input: completes what can be completed, then reports what
    /// could not.
    fn finish(&mut self, tail: usize) {
        self.finished = true;
        self.pos = self.buf.len();
        if !self.ever_synced {
            if self.seen > 0 {
                self.wrong_format = Some(self.not_ts());
            }
            return;
        }
        let mut errors = Vec::new();
        if tail > 0 {
            self.stats.damaged_packets += 1;
            errors.push(Error::malformed(
                "TS packet",
                format!("input ends {tail} bytes into a 188-byte packet"),
            ));
        }
        for si in 0..self.streams.len() {
            let s = &mut self.streams[si];
            if !s.collecting || s.pes.is_empty() {
                continue;
            }
            let pes = std::mem::take(&mut s.pes);
            s.collecting = false;
            if declared_len(&pes).is_some_and(|l| pes.len() < l) {
                self.stats.dropped_pes += 1;
                errors.push(Error::malformed(
                    "PES",
                    format!(
                        "PID {} ends after {} of its {} bytes",
                        s.pid,
                        pes.len(),
                        declared_len(&pes).unwrap_or(0)
                    ),
                ));
                continue;
            }
            // A video PES without a length ends where the input does.
            if let Err(e) = self.on_pes(si, pes) {
                errors.push(e);
            }
        }
        for s in &mut self.streams {
            if !s.audio_buf.is_empty() {
                self.stats.dropped_frames += 1;
                errors.push(Error::malformed(
                    "ADTS",
                    format!("PID {} ends inside a frame", s.pid),
                ));
                s.audio_buf.clear();
            }
        }
        if !self.tracks_emitted {
            for s in &mut self.streams {
                if s.info.is_none() {
                    s.dropped = true;
                }
            }
            self.check_ready();
        }
        let mut held: Vec<Frame> = self
            .streams
            .iter_mut()
            .filter_map(|s| s.held.take())
            .collect();
        held.sort_by_key(|f| f.dts);
        for f in held {
            if let Err(e) = self.out(f) {
                errors.push(e);
            }
        }
        if !self.tracks_emitted {
            errors.push(if self.pmt_pid.is_none() {
                Error::malformed("MPEG-TS", "no PAT found")
            } else if !self.pmt_seen {
                Error::malformed("MPEG-TS", "no PMT found")
            } else {
                Error::malformed(
                    "MPEG-TS",
                    "no stream carried a decoder configuration (SPS/PPS, ADTS header, Opus packet)",
                )
            });
        }
        self.errors.extend(errors);
    }
}

impl Demuxer for TsDemuxer {
    fn push(&mut self, data: &[u8]) {
        if self.ended || self.wrong_format.is_some() {
            return;
        }
        self.seen += data.len() as u64;
        self.buf.extend_from_slice(data);
    }

    fn next(&mut self) -> Result<Option<Event>, Error> {
        loop {
            if let Some(e) = &self.wrong_format {
                return Err(e.clone());
            }
            if let Some(ev) = self.events.pop_front() {
                return Ok(Some(ev));
            }
            if let Some(e) = self.errors.pop_front() {
                return Err(e);
            }
            if !self.step()? {
                return Ok(None);
            }
        }
    }

    fn end(&mut self) {
        self.ended = true;
    }
}

/// The stream type (and, for private data, registration) to a codec.
fn codec_of(stream_type: u8, mut desc: &[u8]) -> Option<Codec> {
    match stream_type {
        0x1B => return Some(Codec::H264),
        0x24 => return Some(Codec::H265),
        0x0F => return Some(Codec::Aac),
        0x06 => {}
        _ => return None,
    }
    let mut opus = false;
    let mut channels = 2;
    while desc.len() >= 2 {
        let (tag, len) = (desc[0], usize::from(desc[1]));
        let Some(body) = desc.get(2..2 + len) else {
            break;
        };
        match tag {
            // registration_descriptor with format_identifier 'Opus'.
            0x05 if body.starts_with(b"Opus") => opus = true,
            // extension_descriptor, opus_audio_descriptor: channel_config_code
            // 1 and 2 are mono and stereo (mapping family 0).
            0x7F if body.first() == Some(&0x80) => {
                channels = body.get(1).copied().unwrap_or(2);
            }
            _ => {}
        }
        desc = &desc[2 + len..];
    }
    // Multichannel layouts need a mapping table this demuxer does not build.
    (opus && matches!(channels, 1 | 2)).then_some(Codec::Opus { channels })
}

/// The total size a PES header declares (`PES_packet_length` + 6), `None`
/// when it is 0 (unbounded, allowed for video) or not yet readable.
fn declared_len(pes: &[u8]) -> Option<usize> {
    let l = usize::from(u16::from_be_bytes([*pes.get(4)?, *pes.get(5)?]));
    (l > 0).then_some(l + 6)
}

/// PTS, DTS and the payload offset of a PES packet.
fn parse_pes_header(pes: &[u8]) -> Option<(Option<u64>, Option<u64>, usize)> {
    if pes.len() < 6 || pes[..3] != [0, 0, 1] {
        return None;
    }
    // stream_ids without the optional header: program_stream_map, padding,
    // private_stream_2, ECM, EMM, directory, DSMCC, H.222.1 type E.
    if matches!(
        pes[3],
        0xBC | 0xBE | 0xBF | 0xF0 | 0xF1 | 0xF2 | 0xF8 | 0xFF
    ) {
        return Some((None, None, 6));
    }
    if pes.len() < 9 || pes[6] & 0xC0 != 0x80 {
        return None;
    }
    let flags = pes[7] >> 6;
    let hlen = usize::from(pes[8]);
    let start = 9 + hlen;
    if start > pes.len() {
        return None;
    }
    let ts = |b: &[u8]| {
        (u64::from(b[0] >> 1) & 0x07) << 30
            | u64::from(b[1]) << 22
            | u64::from(b[2] >> 1) << 15
            | u64::from(b[3]) << 7
            | u64::from(b[4] >> 1)
    };
    let pts = (flags & 0x02 != 0 && hlen >= 5).then(|| ts(&pes[9..14]));
    let dts = (flags == 0x03 && hlen >= 10).then(|| ts(&pes[14..19]));
    Some((pts, dts, start))
}

/// `t - reference` modulo 2^33, in [-2^32, 2^32).
fn wrap_diff(t: impl Into<i128>, reference: i64) -> i64 {
    let d = (t.into() - i128::from(reference)).rem_euclid(i128::from(WRAP));
    let d = d as i64;
    if d >= WRAP / 2 {
        d - WRAP
    } else {
        d
    }
}

/// `samples` at `rate` Hz after `base` (90 kHz), in µs, rounded as
/// [`to_micros`] rounds: the µs of the exact time, not a sum of rounded
/// parts.
fn audio_time((base, samples): (i64, u64), rate: u32) -> i64 {
    let rate = i128::from(rate.max(1));
    let num = (i128::from(base) * rate + i128::from(samples) * 90_000) * 1_000_000;
    crate::div_round(num, 90_000 * rate).clamp(i64::MIN.into(), i64::MAX.into()) as i64
}

fn duration(dts: i64, next: Option<i64>) -> u32 {
    next.map_or(0, |n| (n - dts).clamp(0, i64::from(u32::MAX)) as u32)
}

/// NAL units of an Annex B byte stream, without start codes or the zero
/// bytes that pad them.
pub(crate) fn annexb_nals(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = None;
    let mut i = 0;
    while i + 2 < data.len() {
        if data[i + 2] > 1 {
            i += 3;
        } else if data[i] == 0 && data[i + 1] == 0 && data[i + 2] == 1 {
            if let Some(s) = start {
                out.push(trim_zeros(&data[s..i]));
            }
            i += 3;
            start = Some(i);
        } else {
            i += 1;
        }
    }
    if let Some(s) = start {
        out.push(trim_zeros(&data[s..]));
    }
    out.retain(|n| !n.is_empty());
    out
}

fn trim_zeros(nal: &[u8]) -> &[u8] {
    let end = nal.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &nal[..end]
}

fn push_nal(out: &mut Vec<u8>, nal: &[u8]) {
    out.extend_from_slice(&(nal.len() as u32).to_be_bytes());
    out.extend_from_slice(nal);
}

/// Samples (at 48 kHz) in an Opus packet, from its TOC byte (RFC 6716 §3.1).
fn opus_samples(p: &[u8]) -> u32 {
    let Some(&toc) = p.first() else { return 0 };
    let config = toc >> 3;
    // Frame size in units of 2.5 ms (120 samples).
    let units = match config {
        0..=11 => [4, 8, 16, 24][usize::from(config & 3)],
        12..=15 => [4, 8][usize::from(config & 1)],
        _ => [1, 2, 4, 8][usize::from(config & 3)],
    };
    let frames = match toc & 3 {
        0 => 1,
        1 | 2 => 2,
        _ => u32::from(p.get(1).map_or(0, |b| b & 0x3F)),
    };
    units * 120 * frames
}

/// A bit reader over an RBSP (emulation prevention bytes removed).
struct Bits {
    data: Vec<u8>,
    pos: usize,
}

impl Bits {
    fn new(nal_payload: &[u8]) -> Self {
        let mut data = Vec::with_capacity(nal_payload.len());
        let mut zeros = 0;
        for &b in nal_payload {
            if zeros >= 2 && b == 3 {
                zeros = 0;
                continue;
            }
            zeros = if b == 0 { zeros + 1 } else { 0 };
            data.push(b);
        }
        Self { data, pos: 0 }
    }

    fn bit(&mut self) -> Option<u32> {
        let b = self.data.get(self.pos / 8)?;
        let v = (b >> (7 - self.pos % 8)) & 1;
        self.pos += 1;
        Some(u32::from(v))
    }

    fn bits(&mut self, n: u32) -> Option<u32> {
        let mut v = 0;
        for _ in 0..n {
            v = v << 1 | self.bit()?;
        }
        Some(v)
    }

    fn skip(&mut self, n: usize) -> Option<()> {
        self.pos += n;
        (self.pos <= self.data.len() * 8).then_some(())
    }

    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        Some(((1u64 << zeros) - 1 + u64::from(self.bits(zeros)?)) as u32)
    }

    fn se(&mut self) -> Option<i32> {
        let k = self.ue()?;
        let v = k.div_ceil(2) as i32;
        Some(if k % 2 == 1 { v } else { -v })
    }
}

/// What the rest of the pipeline needs from an H.264 SPS.
struct AvcSps {
    width: u32,
    height: u32,
    chroma_format: u8,
    bit_depth_luma: u8,
    bit_depth_chroma: u8,
}

/// Parses an H.264 SPS NAL unit (ITU-T H.264 7.3.2.1.1) as far as the
/// cropped picture size.
fn parse_avc_sps(nal: &[u8]) -> Option<AvcSps> {
    let mut r = Bits::new(nal.get(1..)?);
    let profile = r.bits(8)?;
    r.skip(16)?;
    r.ue()?;
    let (mut chroma, mut depth_l, mut depth_c) = (1, 8, 8);
    if matches!(
        profile,
        100 | 110 | 122 | 244 | 44 | 83 | 86 | 118 | 128 | 138 | 139 | 134 | 135
    ) {
        chroma = r.ue()?;
        if chroma == 3 {
            r.skip(1)?;
        }
        depth_l = r.ue()? + 8;
        depth_c = r.ue()? + 8;
        r.skip(1)?;
        if r.bit()? == 1 {
            for i in 0..if chroma == 3 { 12 } else { 8 } {
                if r.bit()? == 1 {
                    let n = if i < 6 { 16 } else { 64 };
                    let (mut last, mut next) = (8i32, 8i32);
                    for _ in 0..n {
                        if next != 0 {
                            next = (i64::from(last) + i64::from(r.se()?)).rem_euclid(256) as i32;
                        }
                        if next != 0 {
                            last = next;
                        }
                    }
                }
            }
        }
    }
    r.ue()?;
    match r.ue()? {
        0 => {
            r.ue()?;
        }
        1 => {
            r.skip(1)?;
            r.se()?;
            r.se()?;
            for _ in 0..r.ue()?.min(255) {
                r.se()?;
            }
        }
        _ => {}
    }
    r.ue()?;
    r.skip(1)?;
    let w_mbs = r.ue()?.checked_add(1)?;
    let h_units = r.ue()?.checked_add(1)?;
    let frame_mbs_only = r.bit()?;
    if frame_mbs_only == 0 {
        r.skip(1)?;
    }
    r.skip(1)?;
    let mut width = w_mbs.checked_mul(16)?;
    let mut height = h_units.checked_mul(16)?.checked_mul(2 - frame_mbs_only)?;
    if r.bit()? == 1 {
        let (l, rt, t, b) = (r.ue()?, r.ue()?, r.ue()?, r.ue()?);
        let (cx, cy) = match chroma {
            1 => (2, 2),
            2 => (2, 1),
            _ => (1, 1),
        };
        let cy = cy * (2 - frame_mbs_only);
        width = width.checked_sub(l.checked_add(rt)?.checked_mul(cx)?)?;
        height = height.checked_sub(t.checked_add(b)?.checked_mul(cy)?)?;
    }
    Some(AvcSps {
        width,
        height,
        chroma_format: chroma.min(3) as u8,
        bit_depth_luma: depth_l.min(14) as u8,
        bit_depth_chroma: depth_c.min(14) as u8,
    })
}

pub(crate) fn avc_track(pid: u32, sps: &[Vec<u8>], pps: &[Vec<u8>]) -> Result<TrackInfo, Error> {
    let first = &sps[0];
    let parsed =
        parse_avc_sps(first).ok_or_else(|| Error::malformed("SPS", "H.264 SPS does not parse"))?;
    let profile = first.get(1).copied().unwrap_or(0);
    // ISO/IEC 14496-15 5.3.3.1.2: the high profiles carry chroma format and
    // bit depths after the parameter sets.
    let ext = matches!(profile, 100 | 110 | 122 | 244).then(|| AvccExt {
        chroma_format: parsed.chroma_format,
        bit_depth_luma: parsed.bit_depth_luma,
        bit_depth_chroma: parsed.bit_depth_chroma,
        sequence_parameter_sets_ext: Vec::new(),
    });
    let avcc = Avcc {
        configuration_version: 1,
        avc_profile_indication: profile,
        profile_compatibility: first.get(2).copied().unwrap_or(0),
        avc_level_indication: first.get(3).copied().unwrap_or(0),
        length_size: 4,
        sequence_parameter_sets: sps.to_vec(),
        picture_parameter_sets: pps.to_vec(),
        ext,
    };
    let mut t = TrackInfo::video(pid, &avc_codec_string(&avcc), parsed.width, parsed.height);
    t.description = Some(encode(&avcc)?);
    Ok(t)
}

/// What an `hvcC` needs from an H.265 SPS (ITU-T H.265 7.3.2.2).
pub(crate) fn hevc_track(
    pid: u32,
    vps: &[Vec<u8>],
    sps: &[Vec<u8>],
    pps: &[Vec<u8>],
) -> Result<TrackInfo, Error> {
    let bad = || Error::malformed("SPS", "H.265 SPS does not parse");
    let mut r = Bits::new(sps[0].get(2..).ok_or_else(bad)?);
    let mut h = Hvcc::new();
    let parse = |r: &mut Bits, h: &mut Hvcc| -> Option<(u32, u32)> {
        r.skip(4)?;
        let sub_layers = r.bits(3)?;
        h.temporal_id_nested = r.bit()? == 1;
        h.num_temporal_layers = (sub_layers + 1) as u8;
        // profile_tier_level's general part is byte-aligned: 12 bytes.
        let b0 = r.bits(8)?;
        h.general_profile_space = (b0 >> 6) as u8;
        h.general_tier_flag = b0 & 0x20 != 0;
        h.general_profile_idc = (b0 & 0x1F) as u8;
        for b in &mut h.general_profile_compatibility_flags {
            *b = r.bits(8)? as u8;
        }
        for b in &mut h.general_constraint_indicator_flags {
            *b = r.bits(8)? as u8;
        }
        h.general_level_idc = r.bits(8)? as u8;
        let mut present = Vec::new();
        for _ in 0..sub_layers {
            present.push((r.bit()?, r.bit()?));
        }
        if sub_layers > 0 {
            r.skip(2 * (8 - sub_layers as usize))?;
        }
        for (profile, level) in present {
            r.skip(88 * profile as usize + 8 * level as usize)?;
        }
        r.ue()?;
        let chroma = r.ue()?;
        if chroma == 3 {
            r.skip(1)?;
        }
        h.chroma_format_idc = chroma.min(3) as u8;
        let mut width = r.ue()?;
        let mut height = r.ue()?;
        if r.bit()? == 1 {
            let (l, rt, t, b) = (r.ue()?, r.ue()?, r.ue()?, r.ue()?);
            let (cx, cy) = match chroma {
                1 => (2, 2),
                2 => (2, 1),
                _ => (1, 1),
            };
            width = width.checked_sub(l.checked_add(rt)?.checked_mul(cx)?)?;
            height = height.checked_sub(t.checked_add(b)?.checked_mul(cy)?)?;
        }
        h.bit_depth_luma_minus8 = r.ue()?.min(7) as u8;
        h.bit_depth_chroma_minus8 = r.ue()?.min(7) as u8;
        Some((width, height))
    };
    let (width, height) = parse(&mut r, &mut h).ok_or_else(bad)?;
    h.length_size_minus_one = 3;
    // Complete arrays: `hvc1` promises no parameter sets in the frames,
    // which holds because they are taken out.
    h.arrays = [(32, vps), (33, sps), (34, pps)]
        .into_iter()
        .map(|(t, n)| HvcCArray {
            completeness: true,
            nal_unit_type: t,
            nalus: n.to_vec(),
        })
        .collect();
    let mut t = TrackInfo::video(pid, &hevc_codec_string("hvc1", &h), width, height);
    t.description = Some(encode(&h)?);
    Ok(t)
}

fn encode<A: Atom>(a: &A) -> Result<Bytes, Error> {
    let mut b = bytes::BytesMut::new();
    a.encode_body(&mut b)
        .map_err(|e| Error::malformed("decoder configuration", e))?;
    Ok(b.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// x264's SPS and PPS for 320x240, High profile, level 1.3 (the SPS
    /// holds an emulation prevention byte).
    const SPS: &str = "6764000dacd94141fb0110000003001000000303c0f1429960";
    const PPS: &str = "68ebe3cb22c0";
    const PMT_PID: u16 = 0x1000;
    const V: u16 = 0x100;
    const A: u16 = 0x101;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// One packet; `af` is the adaptation field after its length byte, and
    /// the rest of the packet is stuffed so that `payload` fills it.
    fn pkt(pid: u16, pusi: bool, cc: u8, af: Option<&[u8]>, payload: &[u8]) -> Vec<u8> {
        assert!(payload.len() <= 184);
        let mut p = vec![
            SYNC,
            u8::from(pusi) << 6 | (pid >> 8) as u8,
            pid as u8,
            cc & 0x0F,
        ];
        let room = 184 - payload.len();
        if af.is_some() || room > 0 {
            let af = af.unwrap_or(&[]);
            let af_len = room - 1;
            assert!(af.len() <= af_len || (af_len == 0 && af.is_empty()));
            p[3] |= if payload.is_empty() { 0x20 } else { 0x30 };
            p.push(af_len as u8);
            if af_len > 0 {
                if af.is_empty() {
                    p.push(0);
                } else {
                    p.extend_from_slice(af);
                }
            }
            p.resize(4 + room, 0xFF);
        } else {
            p[3] |= 0x10;
        }
        p.extend_from_slice(payload);
        assert_eq!(p.len(), PACKET);
        p
    }

    fn section(table_id: u8, ext: u16, body: &[u8]) -> Vec<u8> {
        let len = 5 + body.len() + 4;
        let mut s = vec![table_id, 0xB0 | (len >> 8) as u8, len as u8];
        s.extend_from_slice(&ext.to_be_bytes());
        s.extend_from_slice(&[0xC1, 0, 0]);
        s.extend_from_slice(body);
        let crc = crc32_mpeg2(&s);
        s.extend_from_slice(&crc.to_be_bytes());
        s
    }

    fn psi(pid: u16, sec: &[u8]) -> Vec<u8> {
        let mut payload = vec![0];
        payload.extend_from_slice(sec);
        pkt(pid, true, 0, None, &payload)
    }

    fn pat() -> Vec<u8> {
        let mut body = vec![0, 0, 0xE0, 0x10]; // program 0: network PID
        body.extend_from_slice(&[0, 1, 0xE0 | (PMT_PID >> 8) as u8, PMT_PID as u8]);
        psi(0, &section(0, 1, &body))
    }

    fn pmt(streams: &[(u8, u16, &[u8])]) -> Vec<u8> {
        let mut body = vec![0xE0 | (V >> 8) as u8, V as u8, 0xF0, 0];
        for (t, pid, desc) in streams {
            body.extend_from_slice(&[*t, 0xE0 | (pid >> 8) as u8, *pid as u8, 0xF0]);
            body.push(desc.len() as u8);
            body.extend_from_slice(desc);
        }
        psi(PMT_PID, &section(2, 1, &body))
    }

    fn ts5(prefix: u8, t: u64) -> [u8; 5] {
        [
            prefix << 4 | ((t >> 30) as u8 & 7) << 1 | 1,
            (t >> 22) as u8,
            ((t >> 15) as u8 & 0x7F) << 1 | 1,
            (t >> 7) as u8,
            (t as u8 & 0x7F) << 1 | 1,
        ]
    }

    fn pes(stream_id: u8, pts: u64, dts: Option<u64>, payload: &[u8], bounded: bool) -> Vec<u8> {
        let hlen = if dts.is_some() { 10 } else { 5 };
        let len = if bounded { 3 + hlen + payload.len() } else { 0 };
        let mut v = vec![0, 0, 1, stream_id, (len >> 8) as u8, len as u8, 0x80];
        v.push(if dts.is_some() { 0xC0 } else { 0x80 });
        v.push(hlen as u8);
        v.extend_from_slice(&ts5(if dts.is_some() { 3 } else { 2 }, pts));
        if let Some(d) = dts {
            v.extend_from_slice(&ts5(1, d));
        }
        v.extend_from_slice(payload);
        v
    }

    /// Splits a PES into packets with running continuity counters.
    #[derive(Default)]
    struct Mux {
        cc: std::collections::HashMap<u16, u8>,
    }

    impl Mux {
        fn packets(&mut self, pid: u16, data: &[u8]) -> Vec<Vec<u8>> {
            data.chunks(184)
                .enumerate()
                .map(|(i, c)| {
                    let cc = self.cc.entry(pid).or_insert(0);
                    let p = pkt(pid, i == 0, *cc, None, c);
                    *cc = (*cc + 1) & 0x0F;
                    p
                })
                .collect()
        }

        fn ts(&mut self, pid: u16, data: &[u8]) -> Vec<u8> {
            self.packets(pid, data).concat()
        }
    }

    fn au(key: bool, params: bool, size: usize) -> Vec<u8> {
        let mut v = vec![0, 0, 0, 1, 0x09, 0xF0];
        if params {
            v.extend_from_slice(&[0, 0, 0, 1]);
            v.extend_from_slice(&hex(SPS));
            v.extend_from_slice(&[0, 0, 1]);
            v.extend_from_slice(&hex(PPS));
        }
        v.extend_from_slice(&[0, 0, 1, if key { 0x65 } else { 0x41 }]);
        v.extend((0..size).map(|i| (i % 200 + 2) as u8));
        v
    }

    fn video(m: &mut Mux, key: bool, params: bool, pts: u64, size: usize) -> Vec<u8> {
        m.ts(
            V,
            &pes(0xE0, pts + 3000, Some(pts), &au(key, params, size), false),
        )
    }

    fn adts(n: usize, payload: usize) -> Vec<u8> {
        let len = 7 + payload;
        let mut v = Vec::new();
        for i in 0..n {
            // AAC-LC (profile 1), 48 kHz (index 3), stereo.
            v.extend_from_slice(&[
                0xFF,
                0xF1,
                1 << 6 | 3 << 2,
                2 << 6 | (len >> 11) as u8,
                (len >> 3) as u8,
                ((len & 7) as u8) << 5 | 0x1F,
                0xFC,
            ]);
            v.extend(std::iter::repeat_n(i as u8, payload));
        }
        v
    }

    fn head(streams: &[(u8, u16, &[u8])]) -> Vec<u8> {
        [pat(), pmt(streams)].concat()
    }

    fn av() -> Vec<u8> {
        head(&[(0x1B, V, &[]), (0x0F, A, &[])])
    }

    /// Everything the input gives, errors included, after `end`.
    fn run_with(limits: Limits, input: &[u8]) -> (Vec<Result<Event, Error>>, TsStats) {
        let mut d = TsDemuxer::new(limits);
        let mut out = Vec::new();
        for chunk in input.chunks(100) {
            d.push(chunk);
            drain(&mut d, &mut out);
            if matches!(out.last(), Some(Err(Error::WrongFormat { .. }))) {
                return (out, *d.stats());
            }
        }
        d.end();
        drain(&mut d, &mut out);
        (out, *d.stats())
    }

    fn drain(d: &mut TsDemuxer, out: &mut Vec<Result<Event, Error>>) {
        for _ in 0..10_000 {
            match d.next() {
                Ok(Some(e)) => out.push(Ok(e)),
                Ok(None) => return,
                Err(e) => {
                    let fatal = matches!(e, Error::WrongFormat { .. });
                    out.push(Err(e));
                    if fatal {
                        return;
                    }
                }
            }
        }
        panic!("next() never returned None");
    }

    fn run(input: &[u8]) -> (Vec<Result<Event, Error>>, TsStats) {
        run_with(Limits::default(), input)
    }

    fn frames(out: &[Result<Event, Error>], track: u16) -> Vec<Frame> {
        out.iter()
            .filter_map(|e| match e {
                Ok(Event::Frame(f)) if f.track == u32::from(track) => Some(f.clone()),
                _ => None,
            })
            .collect()
    }

    fn tracks(out: &[Result<Event, Error>]) -> Vec<Vec<TrackInfo>> {
        out.iter()
            .filter_map(|e| match e {
                Ok(Event::Tracks(t)) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    fn errors(out: &[Result<Event, Error>]) -> Vec<Error> {
        out.iter().filter_map(|e| e.clone().err()).collect()
    }

    /// A clean stream: PAT, PMT, three video frames, six AAC frames.
    fn basic() -> Vec<u8> {
        let mut m = Mux::default();
        let mut s = av();
        s.extend(video(&mut m, true, true, 90_000, 500));
        s.extend(m.ts(A, &pes(0xC0, 90_000, None, &adts(3, 20), true)));
        s.extend(video(&mut m, false, false, 93_000, 300));
        s.extend(m.ts(A, &pes(0xC0, 95_760, None, &adts(3, 20), true)));
        s.extend(video(&mut m, false, false, 96_000, 300));
        s
    }

    #[test]
    fn h264_and_aac_come_out_as_fmp4_would_give_them() {
        let (out, stats) = run(&basic());
        assert!(errors(&out).is_empty(), "{:?}", errors(&out));
        assert!(matches!(out[0], Ok(Event::Tracks(_))));
        let t = tracks(&out);
        assert_eq!(t.len(), 1);
        let (v, a) = (&t[0][0], &t[0][1]);
        assert_eq!((v.id, v.codec.as_str()), (256, "avc1.64000d"));
        assert_eq!((v.width, v.height, v.timescale), (320, 240, 90_000));
        let avcc = Avcc::decode_body(&mut v.description.clone().unwrap().as_ref()).unwrap();
        assert_eq!(avcc.sequence_parameter_sets, vec![hex(SPS)]);
        assert_eq!(avcc.picture_parameter_sets, vec![hex(PPS)]);
        assert_eq!((a.id, a.codec.as_str()), (257, "mp4a.40.2"));
        assert_eq!((a.sample_rate, a.channels), (48_000, 2));
        assert_eq!(a.description.as_deref(), Some(&[0x11, 0x90][..]));

        let vf = frames(&out, V);
        assert_eq!(vf.len(), 3);
        assert_eq!(
            vf.iter().map(|f| (f.dts, f.pts)).collect::<Vec<_>>(),
            [
                (1_000_000, 1_033_333),
                (1_033_333, 1_066_667),
                (1_066_667, 1_100_000)
            ]
        );
        assert_eq!(
            vf.iter().map(|f| f.duration).collect::<Vec<_>>(),
            [33_333, 33_334, 0]
        );
        assert_eq!(
            vf.iter().map(|f| f.keyframe).collect::<Vec<_>>(),
            [true, false, false]
        );
        // AUD, SPS and PPS are gone; the slice is length-prefixed.
        assert_eq!(&vf[0].data[..5], &[0, 0, 0x01, 0xF5, 0x65]);
        assert_eq!(vf[0].data.len(), 4 + 1 + 500);

        let af = frames(&out, A);
        assert_eq!(af.len(), 6);
        assert_eq!(af[1].pts - af[0].pts, 21_333);
        assert_eq!(af[3].pts, 1_064_000);
        assert_eq!(af[5].pts, 1_106_667);
        assert_eq!(&af[2].data[..], &[2; 20][..]);
        assert!(af[..5].iter().all(|f| f.duration > 0) && af[5].duration == 0);
        assert_eq!(stats.dropped_frames, 0);
        assert_eq!(stats.garbage_bytes, 0);
    }

    #[test]
    fn frames_before_the_first_keyframe_are_dropped() {
        let mut m = Mux::default();
        let mut s = head(&[(0x1B, V, &[])]);
        s.extend(video(&mut m, false, false, 90_000, 10));
        s.extend(video(&mut m, false, true, 93_000, 10));
        s.extend(video(&mut m, true, true, 96_000, 10));
        s.extend(video(&mut m, false, false, 99_000, 10));
        let (out, stats) = run(&s);
        let f = frames(&out, V);
        assert_eq!(f.len(), 2);
        assert!(f[0].keyframe);
        assert_eq!(stats.dropped_frames, 2);
    }

    #[test]
    fn pes_spans_packets_around_adaptation_only_packets() {
        let mut m = Mux::default();
        let mut s = head(&[(0x1B, V, &[])]);
        let mut ps = m.packets(V, &pes(0xE0, 9000, None, &au(true, true, 1000), false));
        // A PCR-only packet (adaptation field, no payload) keeps the counter.
        let cc = (ps[2][3] & 0x0F).wrapping_sub(1) & 0x0F;
        let pcr = pkt(V, false, cc, Some(&[0x10, 0, 0, 0, 0, 0, 0]), &[]);
        ps.insert(2, pcr);
        s.extend(ps.concat());
        s.extend(video(&mut m, false, false, 12_000, 10));
        let (out, stats) = run(&s);
        assert!(errors(&out).is_empty(), "{:?}", errors(&out));
        let f = frames(&out, V);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].data.len(), 4 + 1 + 1000);
        assert_eq!(f[0].data[4 + 1 + 999], (999 % 200 + 2) as u8);
        assert_eq!(stats.continuity_errors, 0);
    }

    #[test]
    fn a_continuity_gap_drops_video_until_the_next_keyframe() {
        let mut m = Mux::default();
        let mut s = head(&[(0x1B, V, &[])]);
        s.extend(video(&mut m, true, true, 0, 10));
        let mut lossy = m.packets(V, &pes(0xE0, 3000, None, &au(false, false, 400), false));
        lossy.remove(1);
        s.extend(lossy.concat());
        s.extend(video(&mut m, false, false, 6000, 10));
        // A repeated packet is legal once and ignored.
        let dup = m.packets(V, &pes(0xE0, 9000, None, &au(true, true, 10), false));
        s.extend(dup.concat());
        s.extend(dup.concat());
        s.extend(video(&mut m, false, false, 12_000, 10));
        let (out, stats) = run(&s);
        let f = frames(&out, V);
        assert_eq!(
            f.iter().map(|f| (f.dts, f.keyframe)).collect::<Vec<_>>(),
            [(0, true), (100_000, true), (133_333, false)]
        );
        assert_eq!(stats.continuity_errors, 1);
        assert_eq!(stats.dropped_pes, 1);
        assert!(stats.dropped_frames >= 1);
    }

    #[test]
    fn timestamps_stay_monotonic_across_the_33_bit_wrap() {
        let mut m = Mux::default();
        let mut s = av();
        let start = (1u64 << 33) - 6000;
        for i in 0..5u64 {
            let t = (start + i * 3000) & ((1 << 33) - 1);
            s.extend(video(&mut m, i == 0, i == 0, t, 10));
            s.extend(m.ts(A, &pes(0xC0, t, None, &adts(1, 4), true)));
        }
        let (out, _) = run(&s);
        assert!(errors(&out).is_empty(), "{:?}", errors(&out));
        let base = to_micros(start as i64, 90_000);
        for track in [V, A] {
            let f = frames(&out, track);
            assert_eq!(f.len(), 5);
            for (i, f) in f.iter().enumerate() {
                let want = to_micros(start as i64 + i as i64 * 3000, 90_000);
                assert_eq!(f.dts, want, "track {track} frame {i}");
                assert!(f.dts >= base);
            }
        }
        // PTS (dts + 3000) of the frame just before the wrap lands after it.
        assert_eq!(frames(&out, V)[1].pts, to_micros(1 << 33, 90_000));
    }

    #[test]
    fn garbage_before_and_between_packets_is_skipped() {
        let clean = run(&basic()).0;
        // Junk with false sync bytes in it.
        let mut junk: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        junk[10] = SYNC;
        junk[500] = SYNC;
        let mut s = junk.clone();
        let b = basic();
        s.extend_from_slice(&b[..PACKET * 3]);
        s.extend_from_slice(&[1, 2, 3, SYNC, 5]);
        s.extend_from_slice(&b[PACKET * 3..]);
        let (out, stats) = run(&s);
        assert_eq!(out, clean);
        assert_eq!(stats.garbage_bytes, 1005);
        assert_eq!(stats.damaged_packets, 1);
    }

    #[test]
    fn input_that_never_syncs_is_the_wrong_format() {
        let (out, _) = run(&vec![0u8; 100 * 1024]);
        assert!(matches!(
            out.last(),
            Some(Err(Error::WrongFormat {
                expected: "MPEG-TS",
                ..
            }))
        ));
        assert_eq!(out.len(), 1);
        // Short inputs are judged at the end.
        let (out, _) = run(b"\0\0\0\x20ftypisom");
        assert!(matches!(out[..], [Err(Error::WrongFormat { .. })]));
        // Nothing at all is not an error.
        assert!(run(&[]).0.is_empty());
    }

    #[test]
    fn a_truncated_tail_gives_every_frame_then_an_error() {
        let mut s = basic();
        let mut m = Mux::default();
        m.cc.insert(A, 2);
        let more = m.ts(A, &pes(0xC0, 101_520, None, &adts(1, 300), true));
        s.extend_from_slice(&more[..PACKET + 50]);
        let (out, stats) = run(&s);
        assert_eq!(frames(&out, V).len(), 3);
        assert_eq!(frames(&out, A).len(), 6);
        let errs = errors(&out);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].to_string().contains("ends 50 bytes into"));
        assert!(errs[1].to_string().contains("PID 257 ends after"));
        assert!(matches!(out.last(), Some(Err(_))));
        assert_eq!(stats.dropped_pes, 1);
    }

    #[test]
    fn an_oversized_pes_is_refused_and_the_stream_goes_on() {
        let mut m = Mux::default();
        let mut s = head(&[(0x1B, V, &[])]);
        s.extend(video(&mut m, true, true, 0, 100));
        s.extend(video(&mut m, true, true, 3000, 5000));
        s.extend(video(&mut m, true, true, 6000, 100));
        s.extend(video(&mut m, false, false, 9000, 100));
        let limits = Limits {
            max_box: 2000,
            ..Limits::default()
        };
        let (out, _) = run_with(limits, &s);
        let errs = errors(&out);
        assert!(
            matches!(&errs[..], [Error::TooLarge { what, limit: 2000, .. }] if what == "PES on PID 256"),
            "{errs:?}"
        );
        let f = frames(&out, V);
        assert_eq!(
            f.iter().map(|f| f.dts).collect::<Vec<_>>(),
            [0, 66_667, 100_000]
        );
    }

    #[test]
    fn a_program_without_supported_streams_names_its_stream_types() {
        let (out, _) = run(&head(&[(0x02, V, &[]), (0x03, A, &[])]));
        let errs = errors(&out);
        let Some(Error::UnsupportedCodec(msg)) = errs.first() else {
            panic!("{errs:?}");
        };
        assert!(msg.contains("0x02 on PID 256") && msg.contains("0x03 on PID 257"));
        // Unknown streams beside a supported one are ignored.
        let mut m = Mux::default();
        let mut s = head(&[(0x86, 0x300, &[]), (0x1B, V, &[])]);
        s.extend(video(&mut m, true, true, 0, 10));
        s.extend(m.ts(0x300, &[0xFC; 20]));
        let (out, _) = run(&s);
        assert!(errors(&out).is_empty());
        assert_eq!(tracks(&out)[0].len(), 1);
    }

    #[test]
    fn more_streams_than_the_track_limit_is_an_error() {
        let limits = Limits {
            max_tracks: 1,
            ..Limits::default()
        };
        let (out, _) = run_with(limits, &av());
        assert!(errors(&out)[0].to_string().contains("limit of 1 tracks"));
    }

    #[test]
    fn a_new_sps_brings_new_tracks_before_its_frame() {
        let mut m = Mux::default();
        let mut s = head(&[(0x1B, V, &[])]);
        s.extend(video(&mut m, true, true, 0, 10));
        s.extend(video(&mut m, false, false, 3000, 10));
        // Same stream, level 3.1 instead of 1.3.
        let mut sps = hex(SPS);
        sps[3] = 0x1F;
        let mut a = vec![0, 0, 1];
        a.extend_from_slice(&sps);
        a.extend_from_slice(&[0, 0, 1]);
        a.extend_from_slice(&hex(PPS));
        a.extend_from_slice(&[0, 0, 1, 0x65, 1, 2, 3]);
        s.extend(m.ts(V, &pes(0xE0, 6000, None, &a, false)));
        let (out, _) = run(&s);
        let kinds: Vec<String> = out
            .iter()
            .map(|e| match e {
                Ok(Event::Tracks(t)) => t[0].codec.clone(),
                Ok(Event::Frame(f)) => f.dts.to_string(),
                Err(e) => e.to_string(),
            })
            .collect();
        assert_eq!(kinds, ["avc1.64000d", "0", "33333", "avc1.64001f", "66667"]);
    }

    #[test]
    fn damaged_packets_and_bad_sections_are_skipped() {
        let mut s = pat();
        let mut bad_pmt = pmt(&[(0x1B, V, &[])]);
        bad_pmt[187] ^= 0xFF; // breaks the CRC
        s.extend(bad_pmt);
        s.extend(pmt(&[(0x1B, V, &[])]));
        let mut m = Mux::default();
        s.extend(video(&mut m, true, true, 0, 10));
        let mut tei = video(&mut m, false, false, 3000, 10);
        tei[1] |= 0x80;
        s.extend(tei);
        s.extend(video(&mut m, true, true, 6000, 10));
        let (out, stats) = run(&s);
        assert!(errors(&out).is_empty(), "{:?}", errors(&out));
        assert_eq!(stats.bad_sections, 1);
        assert_eq!(stats.damaged_packets, 1);
        // The first frame's PES (no length) was still open when the gap
        // showed, so it went too.
        assert_eq!(
            frames(&out, V).iter().map(|f| f.dts).collect::<Vec<_>>(),
            [66_667]
        );
        assert_eq!(stats.continuity_errors, 1);
    }

    #[test]
    fn a_pmt_stream_that_never_carries_data_is_left_out() {
        let mut m = Mux::default();
        let mut s = av();
        for i in 0..3 {
            s.extend(video(&mut m, i == 0, i == 0, i * 3000, 10));
        }
        let (out, _) = run(&s);
        assert!(errors(&out).is_empty(), "{:?}", errors(&out));
        let t = tracks(&out);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].len(), 1);
        assert_eq!(frames(&out, V).len(), 3);
        // Live: after GIVE_UP_US of frames, without waiting for the end.
        let mut d = TsDemuxer::default();
        let mut s = av();
        for i in 0..700 {
            s.extend(video(&mut m, i == 0, i == 0, i * 3000, 10));
        }
        d.push(&s);
        assert!(matches!(d.next(), Ok(Some(Event::Tracks(t))) if t.len() == 1));
    }

    #[test]
    fn a_new_pmt_brings_new_tracks() {
        let mut m = Mux::default();
        let mut s = head(&[(0x1B, V, &[])]);
        s.extend(video(&mut m, true, true, 0, 10));
        s.extend(video(&mut m, false, false, 3000, 10));
        s.extend(pmt(&[(0x1B, V, &[]), (0x0F, A, &[])]));
        s.extend(m.ts(A, &pes(0xC0, 6000, None, &adts(1, 4), true)));
        s.extend(video(&mut m, false, false, 6000, 10));
        let (out, _) = run(&s);
        assert!(errors(&out).is_empty(), "{:?}", errors(&out));
        let t = tracks(&out);
        assert_eq!(t.iter().map(Vec::len).collect::<Vec<_>>(), [1, 2]);
        // The video stream kept its state: no keyframe needed after the PMT.
        assert_eq!(frames(&out, V).len(), 3);
        assert_eq!(frames(&out, A).len(), 1);
    }

    #[test]
    fn opus_with_its_registration_descriptor() {
        // registration 'Opus' and opus_audio_descriptor (stereo).
        let desc = [0x05, 4, b'O', b'p', b'u', b's', 0x7F, 2, 0x80, 2];
        let mut s = head(&[(0x06, A, &desc)]);
        let mut m = Mux::default();
        for i in 0..3u64 {
            // Control header with start_trim on the first packet; TOC config
            // 31 code 0: one 20 ms CELT frame.
            let mut p = vec![0x7F, if i == 0 { 0xF0 } else { 0xE0 }, 5];
            if i == 0 {
                p.extend_from_slice(&312u16.to_be_bytes());
            }
            p.extend_from_slice(&[0xFC, 1, 2, 3, 4]);
            s.extend(m.ts(A, &pes(0xC0, 9000 + i * 1800, None, &p, true)));
        }
        let (out, _) = run(&s);
        assert!(errors(&out).is_empty(), "{:?}", errors(&out));
        let t = &tracks(&out)[0][0];
        assert_eq!((t.codec.as_str(), t.channels), ("opus", 2));
        let d = crate::codec::dops_from_head(t.description.as_ref().unwrap()).unwrap();
        assert_eq!(d.pre_skip, 312);
        let f = frames(&out, A);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].duration, 20_000);
        assert_eq!(&f[2].data[..], &[0xFC, 1, 2, 3, 4]);
    }

    #[test]
    fn sps_sizes() {
        let s = parse_avc_sps(&hex(SPS)).unwrap();
        assert_eq!((s.width, s.height, s.chroma_format), (320, 240, 1));
        assert!(parse_avc_sps(&[0x67]).is_none());
        assert!(parse_avc_sps(&[0x67, 0x64, 0, 0x0d, 0]).is_none());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4000)) {
            let _ = run(&data);
        }

        #[test]
        fn parameter_set_parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse_avc_sps(&data);
            let _ = avc_track(1, std::slice::from_ref(&data), std::slice::from_ref(&data));
            let one = std::slice::from_ref(&data);
            let _ = hevc_track(1, one, one, one);
        }

        #[test]
        fn arbitrary_packets_on_known_pids_never_panic(
            packets in proptest::collection::vec(
                (0usize..5, proptest::collection::vec(any::<u8>(), 185)),
                1..30,
            ),
        ) {
            // Synced packets reach the PSI, PES, NAL, ADTS and Opus parsers,
            // where random bytes alone would stop at the sync search.
            let desc = [0x05, 4, b'O', b'p', b'u', b's'];
            let mut s = head(&[(0x1B, V, &[]), (0x0F, A, &[]), (0x06, 0x102, &desc)]);
            for (k, body) in packets {
                let pid = [0, PMT_PID, V, A, 0x102][k];
                s.extend_from_slice(&[SYNC, body[0] & 0xE0 | (pid >> 8) as u8, pid as u8]);
                s.extend_from_slice(&body[1..]);
            }
            let _ = run(&s);
        }

        #[test]
        fn a_damaged_stream_never_panics(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..40),
            cut in any::<usize>(),
        ) {
            let mut s = basic();
            for (at, v) in flips {
                let i = at % s.len();
                s[i] = v;
            }
            s.truncate(cut % (s.len() + 1));
            let _ = run(&s);
        }
    }
}
