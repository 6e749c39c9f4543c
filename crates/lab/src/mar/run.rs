//! Experiment `mar` (Cao et al., *Evaluating Transport Protocols
//! on 5G for Mobile Augmented Reality*): a client sends one grayscale image
//! (an object-recognition request) at 30 Hz and the server answers each with
//! a small result, over six transports.
//!
//! Topology: the server runs in the emulator's server namespace, the client
//! in the client namespace, so requests (client → server, "up") and replies
//! (server → client, "down") both cross the emulated link.
//!
//! Every request and reply is a *message*: a 16-byte header (request id,
//! scheduled send time in µs since the epoch, message length) followed by
//! filler up to the message's size. The transports carry messages as:
//!
//! - `udp`: fragments of at most [`UDP_PAYLOAD`] bytes, each with an 8-byte
//!   header (request id, fragment index, fragment count); a request is lost
//!   when any fragment is missing.
//! - `tcp`: one connection, TCP_NODELAY, 4-byte length prefix per message.
//! - `rtp`: RFC 3550 packets over UDP (V=2, PT 96, sequence number, 90 kHz
//!   timestamp, SSRC; marker bit on the last packet of a frame), at most
//!   [`UDP_PAYLOAD`] bytes per datagram.
//! - `mpeg-ts`: the message in a PES packet (private_stream_1, with PTS)
//!   carried in 188-byte TS packets (payload_unit_start on the first,
//!   continuity counter, adaptation-field stuffing on the last), 7 TS packets
//!   per UDP datagram.
//! - `quic-stream`: one bidirectional QUIC stream per request.
//! - `quic-dgram`: QUIC DATAGRAM frames, fragmented as `udp` within the
//!   connection's maximum datagram size.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::{BufMut, Bytes, BytesMut};
use quichub_client::synth::now_micros;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};

use crate::common::rt::{runtime, step, STEP};

/// Cao et al. Table 1: the nine image resolutions (16:9, multiples of 8).
pub const RESOLUTIONS: [(u32, u32); 9] = [
    (1152, 648),
    (1024, 576),
    (896, 504),
    (768, 432),
    (640, 360),
    (512, 288),
    (384, 216),
    (256, 144),
    (128, 72),
];

/// Cao et al. §4: 1152×648 "with file size 151.2kB".
pub const PAPER_LARGE_BYTES: f64 = 151_200.0;
/// Cao et al. §4: "128 × 72 at 4.5 kB".
pub const PAPER_SMALL_BYTES: f64 = 4_500.0;

/// Cao et al. Table 1: requests per second.
pub const REQUEST_HZ: f64 = 30.0;

/// Size of the server's reply (the recognition result).
pub const REPLY_SIZE: usize = 64;

/// Largest UDP payload of the `udp`, `rtp` datagrams (fits a 1280-byte IPv6 MTU).
pub const UDP_PAYLOAD: usize = 1200;

fn pixels(w: u32, h: u32) -> f64 {
    w as f64 * h as f64
}

/// Exponent `b` of the power law `size = a · pixels^b` through the paper's
/// two given sizes (log-log interpolation): about 0.80.
pub fn size_exponent() -> f64 {
    (PAPER_LARGE_BYTES / PAPER_SMALL_BYTES).ln() / (pixels(1152, 648) / pixels(128, 72)).ln()
}

/// Request size in bytes for a resolution: the paper's sizes at 1152×648 and
/// 128×72, a log-log (power-law) interpolation through them elsewhere.
pub fn image_size(w: u32, h: u32) -> usize {
    let r = pixels(w, h) / pixels(1152, 648);
    (PAPER_LARGE_BYTES * r.powf(size_exponent())).round() as usize
}

/// The transports compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Protocol {
    /// Plain UDP, fragmented.
    Udp,
    /// TCP, one connection.
    Tcp,
    /// RTP over UDP.
    Rtp,
    /// MPEG-TS over UDP.
    MpegTs,
    /// QUIC, one bidirectional stream per request.
    QuicStream,
    /// QUIC datagrams.
    QuicDgram,
}

impl Protocol {
    /// Every protocol, in report order.
    pub const ALL: [Protocol; 6] = [
        Protocol::Udp,
        Protocol::Tcp,
        Protocol::Rtp,
        Protocol::MpegTs,
        Protocol::QuicStream,
        Protocol::QuicDgram,
    ];

    /// Short label.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Udp => "udp",
            Protocol::Tcp => "tcp",
            Protocol::Rtp => "rtp",
            Protocol::MpegTs => "mpeg-ts",
            Protocol::QuicStream => "quic-stream",
            Protocol::QuicDgram => "quic-dgram",
        }
    }
}

// ---------------------------------------------------------------- messages

/// Bytes of a message header: id u32, scheduled send time u64 (µs), length u32.
pub const MSG_HEADER: usize = 16;

/// A message of `size` bytes (at least [`MSG_HEADER`]).
pub fn encode_message(id: u32, sent_us: u64, size: usize) -> Bytes {
    let size = size.max(MSG_HEADER);
    let mut b = BytesMut::with_capacity(size);
    b.put_u32(id);
    b.put_u64(sent_us);
    b.put_u32(size as u32);
    // Filler: a byte pattern (its entropy is irrelevant, nothing compresses it).
    b.extend((MSG_HEADER..size).map(|i| (i as u8).wrapping_mul(31) ^ id as u8));
    b.freeze()
}

/// (id, scheduled send time µs, length) of a whole message.
pub fn decode_message(p: &[u8]) -> Option<(u32, u64, usize)> {
    if p.len() < MSG_HEADER {
        return None;
    }
    let id = u32::from_be_bytes(p[0..4].try_into().ok()?);
    let sent = u64::from_be_bytes(p[4..12].try_into().ok()?);
    let len = u32::from_be_bytes(p[12..16].try_into().ok()?) as usize;
    (len >= MSG_HEADER).then_some((id, sent, len))
}

// ------------------------------------------------------ UDP fragmentation

/// Bytes of a fragment header: id u32, index u16, count u16.
pub const FRAG_HEADER: usize = 8;

/// Splits `msg` into datagrams of at most `max_datagram` bytes, each with a
/// fragment header.
pub fn fragment(id: u32, msg: &[u8], max_datagram: usize) -> Vec<Bytes> {
    let chunk = max_datagram.saturating_sub(FRAG_HEADER).max(1);
    let count = msg.len().div_ceil(chunk).max(1);
    assert!(count <= u16::MAX as usize, "message too large to fragment");
    (0..count)
        .map(|i| {
            let part = &msg[i * chunk..((i + 1) * chunk).min(msg.len())];
            let mut b = BytesMut::with_capacity(FRAG_HEADER + part.len());
            b.put_u32(id);
            b.put_u16(i as u16);
            b.put_u16(count as u16);
            b.extend_from_slice(part);
            b.freeze()
        })
        .collect()
}

/// (id, index, count, chunk) of a fragment.
pub fn parse_fragment(d: &[u8]) -> Option<(u32, u16, u16, &[u8])> {
    if d.len() < FRAG_HEADER {
        return None;
    }
    let id = u32::from_be_bytes(d[0..4].try_into().ok()?);
    let idx = u16::from_be_bytes(d[4..6].try_into().ok()?);
    let count = u16::from_be_bytes(d[6..8].try_into().ok()?);
    (count > 0 && idx < count).then_some((id, idx, count, &d[FRAG_HEADER..]))
}

/// Reassembles messages from parts keyed by (message key, part order key);
/// parts are put in order of their order key taken modulo 2¹⁶ (fragment
/// index, or RTP sequence number across its wrap). A message is complete
/// when `count` distinct parts arrived; duplicates and parts of messages
/// already completed are ignored.
#[derive(Debug, Default)]
pub struct Reassembler {
    partial: HashMap<u32, (u16, Vec<(u16, Bytes)>)>,
    done: HashSet<u32>,
}

impl Reassembler {
    /// Adds a part; returns the message when it is complete.
    pub fn push(&mut self, key: u32, order: u16, count: u16, part: &[u8]) -> Option<Vec<u8>> {
        if count == 0 || self.done.contains(&key) {
            return None;
        }
        let (want, parts) = self
            .partial
            .entry(key)
            .or_insert_with(|| (count, Vec::new()));
        if parts.iter().any(|(o, _)| *o == order) {
            return None;
        }
        parts.push((order, Bytes::copy_from_slice(part)));
        if parts.len() < *want as usize {
            return None;
        }
        let (_, mut parts) = self.partial.remove(&key)?;
        self.done.insert(key);
        let base = parts[0].0;
        parts.sort_by_key(|(o, _)| o.wrapping_sub(base) as i16);
        Some(parts.iter().flat_map(|(_, b)| b.iter().copied()).collect())
    }

    /// Messages with some but not all parts.
    #[cfg(test)]
    pub fn incomplete(&self) -> usize {
        self.partial.len()
    }
}

// -------------------------------------------------------------------- RTP

/// Bytes of an RTP fixed header without CSRCs (RFC 3550 §5.1).
pub const RTP_HEADER: usize = 12;
/// Dynamic payload type used for the requests.
pub const RTP_PT: u8 = 96;
/// RTP clock rate (video, RFC 3551).
pub const RTP_CLOCK: u32 = 90_000;

/// RTP timestamp of request `id` sent at 30 Hz: 3000 ticks apart.
pub fn rtp_timestamp(id: u32) -> u32 {
    id.wrapping_mul((RTP_CLOCK as f64 / REQUEST_HZ) as u32)
}

/// An RTP fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpHeader {
    /// Marker bit: last packet of a frame.
    pub marker: bool,
    /// Payload type.
    pub pt: u8,
    /// Sequence number.
    pub seq: u16,
    /// Timestamp (90 kHz).
    pub timestamp: u32,
    /// Synchronisation source.
    pub ssrc: u32,
}

/// Splits frames into RTP packets of one SSRC.
#[derive(Debug)]
pub struct RtpPacketizer {
    ssrc: u32,
    seq: u16,
}

impl RtpPacketizer {
    /// A packetizer starting at sequence number `seq`.
    pub fn new(ssrc: u32, seq: u16) -> Self {
        RtpPacketizer { ssrc, seq }
    }

    /// Packets of one frame, each at most `max_datagram` bytes.
    pub fn packetize(&mut self, frame: &[u8], timestamp: u32, max_datagram: usize) -> Vec<Bytes> {
        let chunk = max_datagram.saturating_sub(RTP_HEADER).max(1);
        let n = frame.len().div_ceil(chunk).max(1);
        (0..n)
            .map(|i| {
                let part = &frame[i * chunk..((i + 1) * chunk).min(frame.len())];
                let mut b = BytesMut::with_capacity(RTP_HEADER + part.len());
                b.put_u8(0x80); // V=2, P=0, X=0, CC=0
                b.put_u8(if i + 1 == n { 0x80 } else { 0 } | RTP_PT);
                b.put_u16(self.seq);
                b.put_u32(timestamp);
                b.put_u32(self.ssrc);
                b.extend_from_slice(part);
                self.seq = self.seq.wrapping_add(1);
                b.freeze()
            })
            .collect()
    }
}

/// Parses an RTP packet (version 2; CSRCs, extension and padding honoured).
pub fn parse_rtp(d: &[u8]) -> Option<(RtpHeader, &[u8])> {
    if d.len() < RTP_HEADER || d[0] >> 6 != 2 {
        return None;
    }
    let cc = (d[0] & 0x0f) as usize;
    let mut off = RTP_HEADER + 4 * cc;
    if d[0] & 0x10 != 0 {
        let ext = d.get(off + 2..off + 4)?;
        off += 4 + 4 * u16::from_be_bytes([ext[0], ext[1]]) as usize;
    }
    let mut end = d.len();
    if d[0] & 0x20 != 0 {
        end = end.checked_sub(*d.last()? as usize)?;
    }
    let payload = d.get(off..end)?;
    Some((
        RtpHeader {
            marker: d[1] & 0x80 != 0,
            pt: d[1] & 0x7f,
            seq: u16::from_be_bytes([d[2], d[3]]),
            timestamp: u32::from_be_bytes([d[4], d[5], d[6], d[7]]),
            ssrc: u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
        },
        payload,
    ))
}

/// RTP packets per frame of `size` bytes in `max_datagram`-byte datagrams.
pub fn rtp_packets(size: usize, max_datagram: usize) -> u16 {
    size.div_ceil(max_datagram - RTP_HEADER).max(1) as u16
}

// ---------------------------------------------------------------- MPEG-TS

/// Bytes of a TS packet.
pub const TS_PACKET: usize = 188;
/// TS packets per UDP datagram (1316 bytes, as IPTV and ffmpeg send them).
pub const TS_PER_DATAGRAM: usize = 7;
/// Bytes of the PES header used (with a PTS).
pub const PES_HEADER: usize = 14;
/// PID of the requests.
pub const PID_REQUEST: u16 = 0x100;
/// PID of the replies.
pub const PID_REPLY: u16 = 0x101;

/// Wraps `msg` in a PES packet (stream_id 0xBD private_stream_1) with `pts`
/// (90 kHz); PES_packet_length is 0 when the packet exceeds 65535 bytes.
pub fn pes_wrap(msg: &[u8], pts: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(PES_HEADER + msg.len());
    v.extend_from_slice(&[0, 0, 1, 0xBD]);
    let len = 3 + 5 + msg.len();
    v.extend_from_slice(&(if len <= 0xffff { len as u16 } else { 0 }).to_be_bytes());
    v.extend_from_slice(&[0x80, 0x80, 5]); // '10' marker; PTS only; 5 header bytes
    v.push(0x21 | (((pts >> 30) & 7) as u8) << 1);
    v.extend_from_slice(&(((((pts >> 15) & 0x7fff) as u16) << 1) | 1).to_be_bytes());
    v.extend_from_slice(&((((pts & 0x7fff) as u16) << 1) | 1).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

/// Splits PES packets into TS packets of one PID.
#[derive(Debug)]
pub struct TsPacketizer {
    pid: u16,
    cc: u8,
}

impl TsPacketizer {
    /// A packetizer for `pid`.
    pub fn new(pid: u16) -> Self {
        TsPacketizer { pid, cc: 0 }
    }

    /// TS packets of one PES packet: payload_unit_start on the first, the
    /// last filled up with adaptation-field stuffing.
    pub fn packetize(&mut self, pes: &[u8]) -> Vec<[u8; TS_PACKET]> {
        let mut out = Vec::with_capacity(pes.len().div_ceil(184));
        let mut rest = pes;
        let mut first = true;
        while first || !rest.is_empty() {
            let mut p = [0xffu8; TS_PACKET];
            p[0] = 0x47;
            p[1] = if first { 0x40 } else { 0 } | ((self.pid >> 8) as u8 & 0x1f);
            p[2] = self.pid as u8;
            let n = rest.len().min(184);
            if n < 184 {
                let af = 183 - n;
                p[3] = 0x30 | self.cc;
                p[4] = af as u8;
                if af > 0 {
                    p[5] = 0; // no flags; the rest of the field is 0xFF stuffing
                }
                p[TS_PACKET - n..].copy_from_slice(&rest[..n]);
            } else {
                p[3] = 0x10 | self.cc;
                p[4..].copy_from_slice(&rest[..184]);
            }
            self.cc = (self.cc + 1) & 0x0f;
            rest = &rest[n..];
            first = false;
            out.push(p);
        }
        out
    }
}

/// Groups TS packets [`TS_PER_DATAGRAM`] to a datagram.
pub fn ts_datagrams(packets: &[[u8; TS_PACKET]]) -> Vec<Bytes> {
    packets
        .chunks(TS_PER_DATAGRAM)
        .map(|c| Bytes::from(c.concat()))
        .collect()
}

/// Reassembles messages from the TS packets of one PID: a unit starts at
/// payload_unit_start and is dropped at a continuity-counter gap.
#[derive(Debug)]
pub struct TsDepacketizer {
    pid: u16,
    cc: Option<u8>,
    cur: Option<Vec<u8>>,
    /// Continuity-counter gaps seen (lost TS packets).
    pub discontinuities: u64,
}

impl TsDepacketizer {
    /// A depacketizer for `pid`.
    pub fn new(pid: u16) -> Self {
        TsDepacketizer {
            pid,
            cc: None,
            cur: None,
            discontinuities: 0,
        }
    }

    /// Adds one TS packet; returns a message (the PES payload) when complete.
    pub fn push(&mut self, pkt: &[u8]) -> Option<Vec<u8>> {
        if pkt.len() != TS_PACKET || pkt[0] != 0x47 {
            return None;
        }
        let pusi = pkt[1] & 0x40 != 0;
        let pid = (((pkt[1] & 0x1f) as u16) << 8) | pkt[2] as u16;
        let afc = (pkt[3] >> 4) & 3;
        let cc = pkt[3] & 0x0f;
        if pid != self.pid || afc & 1 == 0 {
            return None;
        }
        if let Some(prev) = self.cc {
            if cc != (prev + 1) & 0x0f {
                self.discontinuities += 1;
                self.cur = None;
            }
        }
        self.cc = Some(cc);
        let off = if afc & 2 != 0 { 5 + pkt[4] as usize } else { 4 };
        let payload = pkt.get(off..)?;
        if pusi {
            self.cur = Some(Vec::new());
        }
        let cur = self.cur.as_mut()?;
        cur.extend_from_slice(payload);
        if cur.len() < PES_HEADER + MSG_HEADER {
            return None;
        }
        if cur[0..4] != [0, 0, 1, 0xBD] {
            self.cur = None;
            return None;
        }
        let hdr = 9 + cur[8] as usize;
        let Some((_, _, len)) = decode_message(cur.get(hdr..)?) else {
            self.cur = None;
            return None;
        };
        if cur.len() < hdr + len {
            return None;
        }
        let cur = self.cur.take()?;
        Some(cur[hdr..hdr + len].to_vec())
    }
}

// ----------------------------------------------------------------- jitter

/// RFC 3550 §6.4.1 interarrival jitter, in the unit of the inputs: over
/// (send time, arrival time) pairs in arrival order, `J += (|D| − J) / 16`
/// with `D = (Rj − Ri) − (Sj − Si)` for consecutive arrivals. `None` with
/// fewer than two arrivals.
pub fn interarrival_jitter(pairs: &[(u64, u64)]) -> Option<f64> {
    if pairs.len() < 2 {
        return None;
    }
    let mut j = 0.0f64;
    for w in pairs.windows(2) {
        let d = (w[1].1 as f64 - w[0].1 as f64) - (w[1].0 as f64 - w[0].0 as f64);
        j += (d.abs() - j) / 16.0;
    }
    Some(j)
}

// ------------------------------------------------------------------- runs

/// Parameters shared by every run of the experiment.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// How long the client sends requests.
    pub duration: Duration,
    /// How long after the last request replies still count.
    pub drain: Duration,
    /// Requests per second.
    pub rate_hz: f64,
    /// Reply size, bytes.
    pub reply_size: usize,
    /// Largest UDP payload of `udp` and `rtp` datagrams.
    pub udp_payload: usize,
    /// QUIC congestion controller (both ends).
    pub cc: quichub_net::CongestionControl,
    /// Order in which `quic-stream` sends its concurrent request streams.
    pub quic_order: QuicOrder,
}

/// How `quic-stream` schedules requests that wait for the link at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum QuicOrder {
    /// Oldest request first (each stream's priority falls with its request
    /// id), as TCP's one byte stream delivers them: a request completes
    /// before the next one starts taking the link.
    #[default]
    OldestFirst,
    /// quinn's default for streams of equal priority: round-robin, so
    /// every waiting request advances together and, on a link slower than
    /// the offered load, few complete before they are stale.
    RoundRobin,
}

impl RunConfig {
    /// Requests per run.
    pub fn requests(&self) -> u32 {
        (self.rate_hz * self.duration.as_secs_f64())
            .round()
            .max(1.0) as u32
    }
}

/// A request as the server saw it complete.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServerArrival {
    /// Request id.
    pub id: u32,
    /// Scheduled send time at the client, µs since the epoch.
    pub sent_us: u64,
    /// Time the whole request was at the server, µs since the epoch.
    pub recv_us: u64,
    /// Request bytes (the image).
    pub bytes: usize,
}

/// What one run produced, before aggregation.
#[derive(Debug, Clone, Default)]
pub struct RawRun {
    /// Start of the request schedule, µs since the epoch.
    pub t0_us: u64,
    /// Requests generated.
    pub sent: u32,
    /// Reply arrival time per request id (`None`: no reply by the deadline).
    pub reply_us: Vec<Option<u64>>,
    /// Requests complete at the server, in arrival order.
    pub server: Vec<ServerArrival>,
}

impl RawRun {
    /// Scheduled send time of request `id`.
    pub fn sent_us(&self, id: u32, rate_hz: f64) -> u64 {
        self.t0_us + (id as f64 * 1e6 / rate_hz).round() as u64
    }
}

fn udp_socket(addr: SocketAddr) -> anyhow::Result<UdpSocket> {
    use socket2::{Domain, Protocol as P, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(P::UDP))?;
    // Best effort (capped by net.core.[rw]mem_max): a 151 kB request is a
    // burst of 127 datagrams.
    s.set_recv_buffer_size(4 << 20).ok();
    s.set_send_buffer_size(4 << 20).ok();
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(UdpSocket::from_std(s.into())?)
}

type Arrivals = Arc<Mutex<Vec<ServerArrival>>>;

fn record(arrivals: &Arrivals, msg: &[u8]) -> Option<(u32, u64)> {
    let recv_us = now_micros();
    let (id, sent_us, len) = decode_message(msg)?;
    if msg.len() != len {
        return None;
    }
    arrivals.lock().expect("not poisoned").push(ServerArrival {
        id,
        sent_us,
        recv_us,
        bytes: len,
    });
    Some((id, sent_us))
}

/// Runs one protocol once with requests of `size` bytes across `emu`.
pub fn run_once(
    emu: &quichub_netem::emulator::Emulator,
    proto: Protocol,
    size: usize,
    cfg: &RunConfig,
) -> anyhow::Result<RawRun> {
    let (info_tx, info_rx) = std::sync::mpsc::channel::<anyhow::Result<(u16, Vec<u8>)>>();
    let (t0_tx, t0_rx) = oneshot::channel::<u64>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let scfg = cfg.clone();
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<Vec<ServerArrival>> {
            runtime()?.block_on(server_side(proto, size, scfg, info_tx, t0_rx, stop_rx))
        })
        .context("starting the server thread")?;
    let (port, fingerprint) = match info_rx.recv_timeout(STEP) {
        Ok(Ok(i)) => i,
        Ok(Err(e)) => return Err(e.context("server setup")),
        Err(_) => {
            let r = server.join();
            bail!("server did not start: {r:?}");
        }
    };
    let addr = SocketAddr::from((emu.server().addr(), port));
    let ccfg = cfg.clone();
    let client = emu
        .client()
        .spawn(move || -> anyhow::Result<(u64, u32, Vec<Option<u64>>)> {
            runtime()?.block_on(client_side(
                proto,
                size,
                ccfg,
                addr,
                fingerprint,
                t0_tx,
                stop_tx,
            ))
        })
        .context("starting the client thread")?;
    let c = client
        .join()
        .map_err(|_| anyhow!("client thread panicked"))?
        .map_err(|e| anyhow!("client thread: {e}"))?;
    let s = server
        .join()
        .map_err(|_| anyhow!("server thread panicked"))?
        .map_err(|e| anyhow!("server thread: {e}"))?;
    let (t0_us, sent, reply_us) = c.context("client")?;
    let server = s.context("server")?;
    Ok(RawRun {
        t0_us,
        sent,
        reply_us,
        server,
    })
}

async fn server_side(
    proto: Protocol,
    size: usize,
    cfg: RunConfig,
    info: std::sync::mpsc::Sender<anyhow::Result<(u16, Vec<u8>)>>,
    t0: oneshot::Receiver<u64>,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<Vec<ServerArrival>> {
    let arrivals: Arrivals = Arc::default();
    let any: SocketAddr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let bound: anyhow::Result<(u16, Vec<u8>, tokio::task::JoinHandle<anyhow::Result<()>>)> =
        async {
            Ok(match proto {
                Protocol::Udp | Protocol::Rtp | Protocol::MpegTs => {
                    let sock = udp_socket(any)?;
                    let port = sock.local_addr()?.port();
                    let task = tokio::spawn(serve_datagrams(
                        proto,
                        sock,
                        size,
                        cfg.clone(),
                        arrivals.clone(),
                    ));
                    (port, Vec::new(), task)
                }
                Protocol::Tcp => {
                    let l = tokio::net::TcpListener::bind(any).await?;
                    let port = l.local_addr()?.port();
                    let task = tokio::spawn(serve_tcp(l, arrivals.clone()));
                    (port, Vec::new(), task)
                }
                Protocol::QuicStream | Protocol::QuicDgram => {
                    let id = quichub_net::tls::Identity::self_signed(&["localhost"])?;
                    let quic = quichub_net::QuicConfig {
                        congestion_control: cfg.cc,
                        ..Default::default()
                    };
                    let server = quichub_net::server::Server::bind_config(any, &id, None, &quic)?;
                    let port = server.local_addr()?.port();
                    let task = tokio::spawn(serve_quic(proto, server, arrivals.clone()));
                    (port, id.fingerprint().to_vec(), task)
                }
            })
        }
        .await;
    let task = match bound {
        Ok((port, fp, task)) => {
            let _ = info.send(Ok((port, fp)));
            task
        }
        Err(e) => {
            let _ = info.send(Err(e));
            bail!("server setup failed");
        }
    };
    let t0 = step("waiting for the client to start", t0).await?;
    let hard = Duration::from_micros(
        (t0 + (cfg.duration + cfg.drain + STEP).as_micros() as u64).saturating_sub(now_micros()),
    );
    tokio::select! {
        _ = stop => {}
        _ = tokio::time::sleep(hard) => {}
        r = task => {
            // The server's task only ends early on an error.
            if let Ok(Err(e)) = r {
                bail!("server: {e:#}");
            }
        }
    }
    let a = std::mem::take(&mut *arrivals.lock().expect("not poisoned"));
    Ok(a)
}

/// Request-side depacketizer and reply packetizer of the UDP-based protocols.
struct UdpCodec {
    proto: Protocol,
    max: usize,
    reasm: Reassembler,
    ts_in: TsDepacketizer,
    rtp_out: RtpPacketizer,
    ts_out: TsPacketizer,
    rtp_expect: u16,
}

impl UdpCodec {
    fn new(proto: Protocol, max: usize, incoming_size: usize, incoming_pid: u16) -> Self {
        let out_pid = if incoming_pid == PID_REQUEST {
            PID_REPLY
        } else {
            PID_REQUEST
        };
        UdpCodec {
            proto,
            max,
            reasm: Reassembler::default(),
            ts_in: TsDepacketizer::new(incoming_pid),
            rtp_out: RtpPacketizer::new(0x4d41_5200 | out_pid as u32, 0xfff0),
            ts_out: TsPacketizer::new(out_pid),
            rtp_expect: rtp_packets(incoming_size, max),
        }
    }

    fn decode(&mut self, d: &[u8], out: &mut Vec<Vec<u8>>) {
        match self.proto {
            Protocol::Udp | Protocol::QuicDgram => {
                if let Some((id, idx, count, chunk)) = parse_fragment(d) {
                    out.extend(self.reasm.push(id, idx, count, chunk));
                }
            }
            Protocol::Rtp => {
                if let Some((h, payload)) = parse_rtp(d) {
                    if h.pt == RTP_PT {
                        out.extend(
                            self.reasm
                                .push(h.timestamp, h.seq, self.rtp_expect, payload),
                        );
                    }
                }
            }
            Protocol::MpegTs => {
                for p in d.chunks(TS_PACKET) {
                    out.extend(self.ts_in.push(p));
                }
            }
            Protocol::Tcp | Protocol::QuicStream => {}
        }
    }

    fn encode(&mut self, id: u32, msg: &[u8]) -> Vec<Bytes> {
        match self.proto {
            Protocol::Rtp => self.rtp_out.packetize(msg, rtp_timestamp(id), self.max),
            Protocol::MpegTs => {
                let pts = rtp_timestamp(id) as u64;
                ts_datagrams(&self.ts_out.packetize(&pes_wrap(msg, pts)))
            }
            _ => fragment(id, msg, self.max),
        }
    }
}

async fn serve_datagrams(
    proto: Protocol,
    sock: UdpSocket,
    size: usize,
    cfg: RunConfig,
    arrivals: Arrivals,
) -> anyhow::Result<()> {
    let mut codec = UdpCodec::new(proto, cfg.udp_payload, size, PID_REQUEST);
    let mut buf = vec![0u8; 65536];
    let mut done = Vec::new();
    loop {
        let (n, from) = sock.recv_from(&mut buf).await?;
        codec.decode(&buf[..n], &mut done);
        for m in done.drain(..) {
            if let Some((id, sent_us)) = record(&arrivals, &m) {
                let reply = encode_message(id, sent_us, cfg.reply_size);
                for d in codec.encode(id, &reply) {
                    sock.send_to(&d, from).await?;
                }
            }
        }
    }
}

async fn serve_tcp(l: tokio::net::TcpListener, arrivals: Arrivals) -> anyhow::Result<()> {
    let (mut conn, _) = l.accept().await?;
    conn.set_nodelay(true)?;
    let mut len = [0u8; 4];
    loop {
        if conn.read_exact(&mut len).await.is_err() {
            return Ok(());
        }
        let n = u32::from_be_bytes(len) as usize;
        anyhow::ensure!(n <= 16 << 20, "request of {n} bytes");
        let mut body = vec![0u8; n];
        if conn.read_exact(&mut body).await.is_err() {
            return Ok(());
        }
        if let Some((id, sent_us)) = record(&arrivals, &body) {
            let reply = encode_message(id, sent_us, REPLY_SIZE);
            let mut b = BytesMut::with_capacity(4 + reply.len());
            b.put_u32(reply.len() as u32);
            b.extend_from_slice(&reply);
            conn.write_all(&b).await?;
        }
    }
}

async fn serve_quic(
    proto: Protocol,
    server: quichub_net::server::Server,
    arrivals: Arrivals,
) -> anyhow::Result<()> {
    let incoming = server.accept().await.context("endpoint closed")?;
    let session = quichub_net::server::establish(incoming).await?.session;
    if proto == Protocol::QuicDgram {
        let mut codec = UdpCodec::new(proto, session.max_datagram_size(), 0, PID_REQUEST);
        let mut done = Vec::new();
        loop {
            let d = session.read_datagram().await?;
            codec.decode(&d, &mut done);
            for m in done.drain(..) {
                if let Some((id, sent_us)) = record(&arrivals, &m) {
                    let reply = encode_message(id, sent_us, REPLY_SIZE);
                    codec.max = session.max_datagram_size();
                    for d in codec.encode(id, &reply) {
                        session.send_datagram(d)?;
                    }
                }
            }
        }
    }
    loop {
        let (mut send, mut recv) = session.accept_bi().await?;
        let arrivals = arrivals.clone();
        tokio::spawn(async move {
            let Ok(body) = recv.read_to_end(16 << 20).await else {
                return;
            };
            if let Some((id, sent_us)) = record(&arrivals, &body) {
                let reply = encode_message(id, sent_us, REPLY_SIZE);
                if send.write_all(&reply).await.is_ok() {
                    let _ = send.finish();
                }
            }
        });
    }
}

/// The client's way of sending a request.
enum Sender {
    Udp(Arc<UdpSocket>, UdpCodec),
    Tcp(mpsc::UnboundedSender<Bytes>),
    QuicStream(
        quichub_net::Session,
        mpsc::UnboundedSender<(u32, u64)>,
        QuicOrder,
    ),
    QuicDgram(quichub_net::Session, UdpCodec),
}

impl Sender {
    async fn send(&mut self, id: u32, msg: Bytes) -> anyhow::Result<()> {
        match self {
            Sender::Udp(sock, codec) => {
                for d in codec.encode(id, &msg) {
                    sock.send(&d).await?;
                }
            }
            Sender::Tcp(tx) => tx.send(msg).map_err(|_| anyhow!("TCP writer stopped"))?,
            Sender::QuicStream(session, replies, order) => {
                let session = session.clone();
                let replies = replies.clone();
                let order = *order;
                tokio::spawn(async move {
                    let r: anyhow::Result<()> = async {
                        let (mut s, mut r) = session.open_bi().await?;
                        if order == QuicOrder::OldestFirst {
                            // Higher goes first; ids are below 2^31.
                            s.set_priority(-(id.min(i32::MAX as u32) as i32))?;
                        }
                        s.write_all(&msg).await?;
                        s.finish()?;
                        let reply = r.read_to_end(4096).await?;
                        let at = now_micros();
                        if let Some((id, _, _)) = decode_message(&reply) {
                            let _ = replies.send((id, at));
                        }
                        Ok(())
                    }
                    .await;
                    if let Err(e) = r {
                        tracing::debug!("request {id}: {e:#}");
                    }
                });
            }
            Sender::QuicDgram(session, codec) => {
                codec.max = session.max_datagram_size();
                anyhow::ensure!(codec.max > FRAG_HEADER, "peer does not take datagrams");
                for d in codec.encode(id, &msg) {
                    // Drops the oldest queued datagram when the send buffer is full.
                    session.send_datagram(d)?;
                }
            }
        }
        Ok(())
    }
}

async fn client_side(
    proto: Protocol,
    size: usize,
    cfg: RunConfig,
    addr: SocketAddr,
    fingerprint: Vec<u8>,
    t0_tx: oneshot::Sender<u64>,
    stop: oneshot::Sender<()>,
) -> anyhow::Result<(u64, u32, Vec<Option<u64>>)> {
    let (rep_tx, mut rep_rx) = mpsc::unbounded_channel::<(u32, u64)>();
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let mut keep = None;
    let mut sender = match proto {
        Protocol::Udp | Protocol::Rtp | Protocol::MpegTs => {
            let sock = Arc::new(udp_socket(any)?);
            sock.connect(addr).await?;
            let r = sock.clone();
            let tx = rep_tx.clone();
            let mut codec = UdpCodec::new(proto, cfg.udp_payload, cfg.reply_size, PID_REPLY);
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut done = Vec::new();
                while let Ok(n) = r.recv(&mut buf).await {
                    let at = now_micros();
                    codec.decode(&buf[..n], &mut done);
                    for m in done.drain(..) {
                        if let Some((id, _, _)) = decode_message(&m) {
                            let _ = tx.send((id, at));
                        }
                    }
                }
            }));
            Sender::Udp(sock, UdpCodec::new(proto, cfg.udp_payload, 0, PID_REPLY))
        }
        Protocol::Tcp => {
            let conn = step("connecting over TCP", tokio::net::TcpStream::connect(addr)).await?;
            conn.set_nodelay(true)?;
            let (mut rd, mut wr) = conn.into_split();
            let tx = rep_tx.clone();
            tasks.push(tokio::spawn(async move {
                let mut len = [0u8; 4];
                while rd.read_exact(&mut len).await.is_ok() {
                    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                    if rd.read_exact(&mut body).await.is_err() {
                        break;
                    }
                    let at = now_micros();
                    if let Some((id, _, _)) = decode_message(&body) {
                        let _ = tx.send((id, at));
                    }
                }
            }));
            let (wtx, mut wrx) = mpsc::unbounded_channel::<Bytes>();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = wrx.recv().await {
                    let mut b = BytesMut::with_capacity(4 + m.len());
                    b.put_u32(m.len() as u32);
                    b.extend_from_slice(&m);
                    if wr.write_all(&b).await.is_err() {
                        break;
                    }
                }
            }));
            Sender::Tcp(wtx)
        }
        Protocol::QuicStream | Protocol::QuicDgram => {
            let mut client = quichub_net::client::Client::new(
                any,
                quichub_net::tls::Verify::Fingerprints(vec![fingerprint]),
            )?;
            client.set_congestion_control(cfg.cc);
            let url = url::Url::parse(&format!("moqt://{addr}/mar"))?;
            let session = step("QUIC handshake", client.connect(&url)).await?.session;
            keep = Some(client);
            if proto == Protocol::QuicStream {
                Sender::QuicStream(session, rep_tx.clone(), cfg.quic_order)
            } else {
                let s = session.clone();
                let tx = rep_tx.clone();
                let mut codec =
                    UdpCodec::new(proto, s.max_datagram_size(), cfg.reply_size, PID_REPLY);
                tasks.push(tokio::spawn(async move {
                    let mut done = Vec::new();
                    while let Ok(d) = s.read_datagram().await {
                        let at = now_micros();
                        codec.decode(&d, &mut done);
                        for m in done.drain(..) {
                            if let Some((id, _, _)) = decode_message(&m) {
                                let _ = tx.send((id, at));
                            }
                        }
                    }
                }));
                Sender::QuicDgram(session, UdpCodec::new(proto, 1200, 0, PID_REPLY))
            }
        }
    };
    drop(rep_tx);

    let n = cfg.requests();
    let period_us = 1e6 / cfg.rate_hz;
    let base = tokio::time::Instant::now();
    let t0 = now_micros();
    let _ = t0_tx.send(t0);
    let deadline = base + cfg.duration + cfg.drain;
    let deadline_us = t0 + (cfg.duration + cfg.drain).as_micros() as u64;
    let mut replies: Vec<Option<u64>> = vec![None; n as usize];

    let generate = async {
        for id in 0..n {
            let off = Duration::from_micros((id as f64 * period_us).round() as u64);
            tokio::time::sleep_until(base + off).await;
            let msg = encode_message(id, t0 + off.as_micros() as u64, size);
            sender.send(id, msg).await?;
        }
        anyhow::Ok(())
    };
    let collect = async {
        let mut got = 0;
        loop {
            tokio::select! {
                r = rep_rx.recv() => match r {
                    Some((id, at)) => {
                        if let Some(slot) = replies.get_mut(id as usize) {
                            if slot.is_none() && at <= deadline_us {
                                *slot = Some(at);
                                got += 1;
                                if got == n {
                                    break;
                                }
                            }
                        }
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    };
    let (g, ()) = tokio::join!(generate, collect);
    while let Ok((id, at)) = rep_rx.try_recv() {
        if let Some(slot) = replies.get_mut(id as usize) {
            if slot.is_none() && at <= deadline_us {
                *slot = Some(at);
            }
        }
    }
    let _ = stop.send(());
    for t in tasks {
        t.abort();
    }
    match &sender {
        Sender::QuicStream(s, _, _) | Sender::QuicDgram(s, _) => s.close(0, b"done"),
        _ => {}
    }
    drop(sender);
    if let Some(c) = keep {
        c.close();
    }
    g.context("sending requests")?;
    Ok((t0, n, replies))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_interpolate_the_papers_two_points() {
        assert_eq!(image_size(1152, 648), 151_200);
        assert_eq!(image_size(128, 72), 4_500);
        let sizes: Vec<usize> = RESOLUTIONS.iter().map(|&(w, h)| image_size(w, h)).collect();
        assert!(sizes.windows(2).all(|w| w[0] > w[1]), "{sizes:?}");
        assert!((size_exponent() - 0.7998).abs() < 1e-3);
    }

    #[test]
    fn message_roundtrip() {
        let m = encode_message(7, 123_456, 1000);
        assert_eq!(m.len(), 1000);
        assert_eq!(decode_message(&m), Some((7, 123_456, 1000)));
        assert!(decode_message(&m[..10]).is_none());
        assert_eq!(encode_message(1, 2, 3).len(), MSG_HEADER);
    }

    #[test]
    fn udp_fragments_reassemble_and_a_lost_fragment_loses_the_request() {
        let m = encode_message(9, 1, 5000);
        let f = fragment(9, &m, UDP_PAYLOAD);
        assert_eq!(f.len(), 5000usize.div_ceil(UDP_PAYLOAD - FRAG_HEADER));
        assert!(f.iter().all(|d| d.len() <= UDP_PAYLOAD));
        assert_eq!(&f[1][..8], &[0, 0, 0, 9, 0, 1, 0, 5]);
        // Out of order, with a duplicate.
        let mut r = Reassembler::default();
        let mut out = None;
        for i in [4, 0, 3, 3, 1, 2] {
            let (id, idx, n, c) = parse_fragment(&f[i]).unwrap();
            if let Some(x) = r.push(id, idx, n, c) {
                out = Some(x);
            }
        }
        assert_eq!(out.as_deref(), Some(&m[..]));
        assert_eq!(r.incomplete(), 0);
        // A late duplicate after completion is ignored.
        let (id, idx, n, c) = parse_fragment(&f[0]).unwrap();
        assert!(r.push(id, idx, n, c).is_none());
        // Fragment 2 of message 10 lost: never completes.
        let m2 = encode_message(10, 1, 5000);
        let f2 = fragment(10, &m2, UDP_PAYLOAD);
        for (i, d) in f2.iter().enumerate() {
            if i != 2 {
                let (id, idx, n, c) = parse_fragment(d).unwrap();
                assert!(r.push(id, idx, n, c).is_none());
            }
        }
        assert_eq!(r.incomplete(), 1);
        assert!(
            parse_fragment(&[0, 0, 0, 1, 0, 3, 0, 3]).is_none(),
            "index ≥ count"
        );
    }

    #[test]
    fn rtp_header_bytes() {
        let mut p = RtpPacketizer::new(0xdead_beef, 0xfffe);
        let frame = encode_message(1, 5, 2500);
        let pk = p.packetize(&frame, rtp_timestamp(1), UDP_PAYLOAD);
        assert_eq!(pk.len(), 3);
        assert_eq!(pk.len() as u16, rtp_packets(2500, UDP_PAYLOAD));
        assert_eq!(
            &pk[0][..12],
            &[0x80, 96, 0xff, 0xfe, 0, 0, 0x0b, 0xb8, 0xde, 0xad, 0xbe, 0xef]
        );
        assert_eq!(pk[1][1], 96, "no marker mid-frame");
        assert_eq!(&pk[1][2..4], &[0xff, 0xff]);
        assert_eq!(pk[2][1], 0x80 | 96, "marker on the last packet");
        assert_eq!(&pk[2][2..4], &[0, 0], "sequence wraps");
        assert!(pk.iter().all(|d| d.len() <= UDP_PAYLOAD));
        let (h, payload) = parse_rtp(&pk[2]).unwrap();
        assert_eq!(
            h,
            RtpHeader {
                marker: true,
                pt: 96,
                seq: 0,
                timestamp: 3000,
                ssrc: 0xdead_beef
            }
        );
        assert_eq!(payload.len(), 2500 - 2 * (UDP_PAYLOAD - RTP_HEADER));
        // Reassembly across the sequence wrap, out of order.
        let mut r = Reassembler::default();
        let mut out = None;
        for i in [2, 0, 1] {
            let (h, pl) = parse_rtp(&pk[i]).unwrap();
            out = out.or(r.push(h.timestamp, h.seq, 3, pl));
        }
        assert_eq!(out.as_deref(), Some(&frame[..]));
        assert!(parse_rtp(&[0x40; 12]).is_none(), "version 1");
    }

    #[test]
    fn ts_packet_bytes_and_reassembly() {
        let msg = encode_message(3, 77, 1000);
        let pes = pes_wrap(&msg, 0x1_2345_6789 & 0x1_ffff_ffff);
        assert_eq!(&pes[..9], &[0, 0, 1, 0xbd, 0x03, 0xf0, 0x80, 0x80, 5]);
        assert_eq!(pes.len(), PES_HEADER + 1000);
        let mut p = TsPacketizer::new(PID_REQUEST);
        let pk = p.packetize(&pes);
        assert_eq!(pk.len(), 1014usize.div_ceil(184));
        assert_eq!(
            &pk[0][..4],
            &[0x47, 0x41, 0x00, 0x10],
            "sync, PUSI, PID 0x100, cc 0"
        );
        assert_eq!(&pk[1][..4], &[0x47, 0x01, 0x00, 0x11]);
        let last = pk.last().unwrap();
        let tail = 1014 - 5 * 184;
        assert_eq!(last[3], 0x30 | 5, "adaptation field + payload, cc 5");
        assert_eq!(last[4] as usize, 183 - tail);
        assert_eq!(last[5], 0);
        assert!(last[6..188 - tail].iter().all(|&b| b == 0xff), "stuffing");
        let d = ts_datagrams(&pk);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].len(), 6 * TS_PACKET);
        let mut r = TsDepacketizer::new(PID_REQUEST);
        let out: Vec<Vec<u8>> = d[0].chunks(TS_PACKET).filter_map(|c| r.push(c)).collect();
        assert_eq!(out, vec![msg.to_vec()]);
        // A large message: datagrams of 7 packets; one lost datagram loses it.
        let big = encode_message(4, 77, 20_000);
        let pk = p.packetize(&pes_wrap(&big, 0));
        assert_eq!(pk[0][3] & 0x0f, 6, "continuity counter carries on");
        let d = ts_datagrams(&pk);
        assert!(d[..d.len() - 1].iter().all(|x| x.len() == 1316));
        let mut r2 = TsDepacketizer::new(PID_REQUEST);
        let got: Vec<_> = d
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .flat_map(|(_, x)| {
                x.chunks(TS_PACKET)
                    .filter_map(|c| r2.push(c))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(got.is_empty());
        assert_eq!(r2.discontinuities, 1);
        // The next message after the loss is whole again.
        let again = encode_message(5, 1, 3000);
        let got: Vec<_> = ts_datagrams(&p.packetize(&pes_wrap(&again, 0)))
            .iter()
            .flat_map(|x| {
                x.chunks(TS_PACKET)
                    .filter_map(|c| r2.push(c))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(got, vec![again.to_vec()]);
        // Exactly 183 bytes left: a zero-length adaptation field.
        let mut p = TsPacketizer::new(PID_REPLY);
        let pk = p.packetize(&[7u8; 183]);
        assert_eq!((pk[0][3], pk[0][4], pk[0][5]), (0x30, 0, 7));
    }

    #[test]
    fn jitter_follows_rfc3550() {
        // Constant transit time: no jitter.
        let flat: Vec<(u64, u64)> = (0..50).map(|i| (i * 33_333, i * 33_333 + 5000)).collect();
        assert_eq!(interarrival_jitter(&flat), Some(0.0));
        assert_eq!(interarrival_jitter(&flat[..1]), None);
        // Transit alternating 5 and 7 ms: |D| = 2 ms each step, J → 2 ms.
        let alt: Vec<(u64, u64)> = (0..400)
            .map(|i| {
                (
                    i * 33_333,
                    i * 33_333 + if i % 2 == 0 { 5000 } else { 7000 },
                )
            })
            .collect();
        let j = interarrival_jitter(&alt).unwrap();
        assert!((j - 2000.0).abs() < 1.0, "{j}");
        // One step: J = |D| / 16.
        let one = [(0, 1000), (10_000, 12_600)];
        assert_eq!(interarrival_jitter(&one), Some(100.0));
    }
}
