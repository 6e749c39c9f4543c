//! Traffic shaping against resolution fingerprinting (`quichub pub
//! --shape-rate`, `--pad-objects`).
//!
//! QUIC encrypts payloads but not the sizes and times of packets, and a
//! video's bitrate and burst sizes give its resolution away (A. Sengupta,
//! "Streaming over QUIC: Applications in Media and IoT", 2025; `quichub-lab
//! fingerprint` measures it). Two defences, on the publisher's hop:
//!
//! - **Constant rate** ([`ShapeConfig::rate_bps`]): time is cut into ticks
//!   (20 ms by default); the media of a session may use as many full
//!   packets as `rate × tick` bytes hold ([`media_per_tick`]) (an object bigger than that is spread over
//!   the next ticks, which delays it; media arriving during a tick leaves at
//!   the start of the next), and at the start of every tick, together with
//!   that tick's media, MoQT PADDING datagrams (draft-ietf-moq-transport-18
//!   §Padding, type 0x132B3E29, all zero, discarded by the receiver) bring
//!   the connection's UDP bytes sent (QUIC's own count: headers, ACKs and
//!   control messages included, plus 28 bytes of IPv4 and UDP headers per
//!   packet) up to `rate × elapsed time`. On the wire the
//!   session then sends the same bytes in the same burst every tick
//!   whatever the video. Media that would wait longer than
//!   [`ShapeConfig::max_delay`] goes out at once instead (an *overrun*:
//!   counted, and visible to an observer).
//! - **Size buckets** ([`ShapeConfig::bucket_ratio`]): after each object,
//!   padding datagrams bring its bytes up to the next size of a geometric
//!   ladder (256 B × ratio^k), so exact object sizes are hidden (bitrate is
//!   not).
//!
//! With a constant rate, the connection should also pad every QUIC packet
//! to full size (`quichub_net::client::Client::pad_to_mtu`, as `quichub
//! pub --shape-rate` does): otherwise the part-filled packets where media
//! and padding end still tell ticks with media from ticks without.
//!
//! Padding is hop-by-hop in MoQT: a relay drops it, so this shapes the hop
//! from the publisher to its relay; a relay's hop to its subscribers would
//! need the same on the relay's side.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use quichub_net::{SendStream, Session};

/// What to shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeConfig {
    /// Constant rate in bit/s (media plus padding), or `None`.
    pub rate_bps: Option<u64>,
    /// Pad every object to the next size of a geometric ladder with this
    /// ratio (> 1), or `None`.
    pub bucket_ratio: Option<f64>,
    /// Length of a tick of the constant rate.
    pub tick: Duration,
    /// Longest media may wait for its share of the rate.
    pub max_delay: Duration,
}

impl Default for ShapeConfig {
    fn default() -> Self {
        Self {
            rate_bps: None,
            bucket_ratio: None,
            tick: Duration::from_millis(20),
            max_delay: Duration::from_millis(500),
        }
    }
}

impl ShapeConfig {
    /// Whether anything is shaped.
    pub fn active(&self) -> bool {
        self.rate_bps.is_some() || self.bucket_ratio.is_some()
    }

    /// Wire bytes (IP) of the constant rate per tick (at least 1); media may
    /// use [`media_per_tick`] of it.
    pub fn per_tick(&self) -> u64 {
        self.rate_bps.map_or(0, |r| {
            ((r as f64 / 8.0 * self.tick.as_secs_f64()).round() as u64).max(1)
        })
    }
}

/// The smallest size of the ladder `256 × ratio^k` that holds `n` bytes
/// (`n` itself when `ratio` is not above 1).
pub fn bucket(n: u64, ratio: f64) -> u64 {
    if ratio <= 1.0 || !ratio.is_finite() {
        return n;
    }
    let mut s = 256.0f64;
    while (s.ceil() as u64) < n {
        s *= ratio;
    }
    s.ceil() as u64
}

/// The constant-rate schedule, without I/O: which tick each byte of media
/// leaves in, and how much padding each closed tick owes.
#[derive(Debug, Clone)]
pub struct Meter {
    per_tick: u64,
    /// First tick not yet closed.
    base: u64,
    /// Media bytes reserved in ticks `base`, `base + 1`, ...
    used: VecDeque<u64>,
}

impl Meter {
    /// A schedule of `per_tick` bytes per tick.
    pub fn new(per_tick: u64) -> Self {
        Self {
            per_tick: per_tick.max(1),
            base: 0,
            used: VecDeque::new(),
        }
    }

    /// Reserves `n` bytes of media arriving in tick `now`: the earliest
    /// ticks from `now` on with room. Returns `(tick, bytes)` pieces in
    /// order; when the room runs out more than `max_ticks` ahead, the rest
    /// goes in tick `now` (an overrun, flagged by the `bool`).
    pub fn reserve(&mut self, now: u64, n: u64, max_ticks: u64) -> (Vec<(u64, u64)>, bool) {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut left = n;
        let mut t = now.max(self.base);
        while left > 0 {
            if t > now + max_ticks {
                let i = (now.max(self.base) - self.base) as usize;
                self.slot(i);
                self.used[i] += left;
                out.push((now.max(self.base), left));
                return (out, true);
            }
            let i = (t - self.base) as usize;
            self.slot(i);
            let room = self.per_tick.saturating_sub(self.used[i]);
            if room > 0 {
                let take = room.min(left);
                self.used[i] += take;
                left -= take;
                match out.last_mut() {
                    Some((lt, b)) if *lt == t => *b += take,
                    _ => out.push((t, take)),
                }
            }
            t += 1;
        }
        (out, false)
    }

    fn slot(&mut self, i: usize) {
        while self.used.len() <= i {
            self.used.push_back(0);
        }
    }

    /// Closes every tick before `until`; returns the room media left unused
    /// in them and the media bytes they hold.
    pub fn close(&mut self, until: u64) -> (u64, u64) {
        let (mut pad, mut media) = (0, 0);
        while self.base < until {
            let u = self.used.pop_front().unwrap_or(0);
            pad += self.per_tick.saturating_sub(u);
            media += u;
            self.base += 1;
        }
        (pad, media)
    }
}

/// IPv4 and UDP headers of a datagram: what an observer counts on top of
/// QUIC's UDP payload.
const IP_UDP_HEADERS: u64 = 28;

/// Bytes the connection has put on the wire: UDP payloads and their IP and
/// UDP headers.
fn wire_bytes(session: &Session) -> u64 {
    // The shaper paces QUIC only (a WebSocket session has no UDP to count).
    let Some(q) = session.quic() else { return 0 };
    let u = web_transport_quinn::quinn::Connection::stats(q).udp_tx;
    u.bytes + IP_UDP_HEADERS * u.datagrams
}

/// Media bytes a tick of `per_tick` wire bytes may carry: as many
/// full-size packets (`datagram` bytes of payload, about 60 more on the
/// wire) as fit, so media never needs more packets than the tick has, even
/// when every packet is padded to full size (`pad_to_mtu`); but at least
/// 90 % of the tick's payload share (at low rates a tick holds few packets,
/// and rounding down would starve the media; a tick that media overfills is
/// made up by less padding in the next ones); 95 % of the tick when the
/// datagram size is unknown.
pub fn media_per_tick(per_tick: u64, datagram: u64) -> u64 {
    if datagram == 0 {
        return per_tick * 95 / 100;
    }
    let whole = (per_tick / (datagram + 60)) * datagram;
    let share = per_tick * datagram / (datagram + 60) * 9 / 10;
    whole.max(share).max(1)
}

/// Counters of a [`Shaper`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShapeStats {
    /// Media bytes (object headers and payloads) sent through the shaper.
    pub media_bytes: u64,
    /// Padding bytes sent (datagram payloads, type included).
    pub padding_bytes: u64,
    /// Padding bytes that could not be sent (datagrams unsupported or refused).
    pub padding_refused: u64,
    /// Media pieces sent at once because they would have waited longer than
    /// the maximum delay.
    pub overruns: u64,
    /// Longest a media piece waited for its tick, µs.
    pub max_wait_us: u64,
}

/// Shapes the data of one session; see the module documentation. Shared by
/// the tracks it is set on ([`crate::LocalTrack::set_shaper`]).
pub struct Shaper {
    cfg: ShapeConfig,
    session: Session,
    epoch: tokio::time::Instant,
    meter: Mutex<Meter>,
    media: AtomicU64,
    padding: AtomicU64,
    refused: AtomicU64,
    overruns: AtomicU64,
    max_wait: AtomicU64,
    /// Media pieces waiting for their tick (constant rate): the ticker writes
    /// them and the tick's padding in one go, so QUIC packs both into the
    /// same packets (separate tasks would each get packets of their own, and
    /// the number of part-filled packets would show which ticks carry media).
    queue: Mutex<std::collections::BTreeMap<u64, Vec<Queued>>>,
    ticker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Shaper {
    /// Starts shaping `session`'s tracks (those it is set on) as `cfg`
    /// says; with a rate, a task pads every tick until [`Self::stop`] or
    /// the session ends. Needs a tokio runtime.
    pub fn start(session: &crate::ClientSession, cfg: ShapeConfig) -> Arc<Shaper> {
        let s = Arc::new(Shaper {
            cfg,
            session: session.session().clone(),
            epoch: tokio::time::Instant::now(),
            meter: Mutex::new(Meter::new(media_per_tick(
                cfg.per_tick(),
                session.session().max_datagram_size() as u64,
            ))),
            media: AtomicU64::new(0),
            padding: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            max_wait: AtomicU64::new(0),
            queue: Mutex::new(std::collections::BTreeMap::new()),
            ticker: Mutex::new(None),
        });
        if cfg.rate_bps.is_some() {
            let weak = Arc::downgrade(&s);
            let (epoch, tick) = (s.epoch, cfg.tick);
            let per_tick = cfg.per_tick();
            let udp0 = wire_bytes(&s.session);
            // The tick is closed (its padding worked out) a little before it
            // starts, so its media and padding leave together at its start.
            let lead = (tick / 5).min(Duration::from_millis(2));
            let task = tokio::spawn(async move {
                let mut k = 1u64;
                loop {
                    let start = epoch + tick * k as u32;
                    tokio::time::sleep_until(start - lead).await;
                    let Some(s) = weak.upgrade() else { break };
                    let sent = wire_bytes(&s.session).saturating_sub(udp0);
                    let (_, media) = s.meter.lock().expect("meter").close(k + 1);
                    // What the wire should have carried by the end of tick k;
                    // one tick's worth at most (a late wake-up does not burst).
                    let pad = ((k + 1) * per_tick)
                        .saturating_sub(sent + media)
                        .min(2 * per_tick);
                    tokio::time::sleep_until(start).await;
                    let due: Vec<Queued> = {
                        let mut q = s.queue.lock().expect("queue");
                        let later = q.split_off(&(k + 1));
                        std::mem::replace(&mut *q, later)
                            .into_values()
                            .flatten()
                            .collect()
                    };
                    for (stream, op) in due {
                        let mut st = stream.lock().await;
                        match op {
                            Some(b) => {
                                let _ = st.write_chunk(b).await;
                            }
                            None => {
                                let _ = st.finish();
                            }
                        }
                    }
                    if !s.pad(pad) {
                        break;
                    }
                    let now = s.tick_now();
                    k = (k + 1).max(now + 1);
                }
            });
            *s.ticker.lock().expect("ticker") = Some(task);
        }
        s
    }

    /// The configuration.
    pub fn config(&self) -> ShapeConfig {
        self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> ShapeStats {
        ShapeStats {
            media_bytes: self.media.load(Relaxed),
            padding_bytes: self.padding.load(Relaxed),
            padding_refused: self.refused.load(Relaxed),
            overruns: self.overruns.load(Relaxed),
            max_wait_us: self.max_wait.load(Relaxed),
        }
    }

    /// Waits until every queued media piece has been written (at most
    /// the maximum delay and a second more).
    pub async fn drain(&self) {
        let deadline = tokio::time::Instant::now() + self.cfg.max_delay + Duration::from_secs(1);
        while !self.queue.lock().expect("queue").is_empty()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(self.cfg.tick).await;
        }
    }

    /// Stops the padding task, and with it the constant rate: media still
    /// queued is not written (call [`Self::drain`] first).
    pub fn stop(&self) {
        if let Some(t) = self.ticker.lock().expect("ticker").take() {
            t.abort();
        }
    }

    fn tick_now(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() / self.cfg.tick.as_nanos().max(1)) as u64
    }

    /// Sends `n` bytes of padding as PADDING datagrams; `false` once the
    /// session is gone.
    fn pad(&self, n: u64) -> bool {
        let max = self.session.max_datagram_size() as u64;
        let ty = moqt::data::PADDING_DATAGRAM;
        let ty_len = moqt::coding::vi64_len(ty) as u64;
        if max <= ty_len {
            self.refused.fetch_add(n, Relaxed);
            return self.session.close_reason().is_none();
        }
        let mut left = n;
        while left > 0 {
            let size = left.clamp(ty_len, max);
            let mut b = BytesMut::with_capacity(size as usize);
            moqt::coding::put_vi64(&mut b, ty);
            b.put_bytes(0, (size - ty_len) as usize);
            match self.session.send_datagram(b.freeze()) {
                Ok(()) => {
                    self.padding.fetch_add(size, Relaxed);
                }
                Err(_) => {
                    self.refused.fetch_add(left, Relaxed);
                    return self.session.close_reason().is_none();
                }
            }
            left = left.saturating_sub(size);
        }
        true
    }

    /// A writer for `stream` whose data leaves at the constant rate: the
    /// writes are queued (in order) for a task that owns the stream, so a
    /// publisher hands over its next object at once and the meter can fill
    /// every tick (a writer that waited for each object to leave would
    /// leave part of a tick unused per object).
    pub(crate) fn writer(self: &Arc<Self>, mut stream: SendStream) -> ShapedStream {
        if self.cfg.rate_bps.is_some() {
            return ShapedStream {
                shaper: self.clone(),
                sink: StreamSink::Ticked {
                    stream: Arc::new(tokio::sync::Mutex::new(stream)),
                    last: AtomicU64::new(0),
                },
            };
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Op>();
        tokio::spawn(async move {
            while let Some(op) = rx.recv().await {
                match op {
                    Op::Write(at, b) => {
                        tokio::time::sleep_until(at).await;
                        if stream.write_chunk(b).await.is_err() {
                            break;
                        }
                    }
                    Op::Finish => {
                        let _ = stream.finish();
                        break;
                    }
                }
            }
        });
        ShapedStream {
            shaper: self.clone(),
            sink: StreamSink::Task(tx),
        }
    }

    /// Schedules `n` bytes of media: the tick (and its start) each piece
    /// leaves in (tick 0, now, without a rate).
    fn schedule(&self, n: u64) -> Vec<(u64, tokio::time::Instant, u64)> {
        self.media.fetch_add(n, Relaxed);
        if self.cfg.rate_bps.is_none() || n == 0 {
            return vec![(0, tokio::time::Instant::now(), n)];
        }
        let max_ticks = (self.cfg.max_delay.as_nanos() / self.cfg.tick.as_nanos().max(1)) as u64;
        let (pieces, overrun) = {
            let now = self.tick_now();
            self.meter.lock().expect("meter").reserve(now, n, max_ticks)
        };
        if overrun {
            self.overruns.fetch_add(1, Relaxed);
        }
        let now = tokio::time::Instant::now();
        pieces
            .into_iter()
            .map(|(t, len)| {
                let at = self.epoch + self.cfg.tick * t as u32;
                let waited = at.saturating_duration_since(now).as_micros() as u64;
                self.max_wait.fetch_max(waited, Relaxed);
                (t, at, len)
            })
            .collect()
    }

    /// Called after an object of `n` bytes (header and payload): pads it to
    /// its size bucket, if buckets are on.
    pub(crate) fn object_sent(&self, n: u64) {
        if let Some(r) = self.cfg.bucket_ratio {
            let pad = bucket(n, r) - n;
            if pad > 0 {
                // A padding datagram cannot be smaller than its type.
                let ty_len = moqt::coding::vi64_len(moqt::data::PADDING_DATAGRAM) as u64;
                self.pad(pad.max(ty_len));
            }
        }
    }
}

/// What the task owning a shaped stream does next.
enum Op {
    Write(tokio::time::Instant, Bytes),
    Finish,
}

/// A media piece (or, `None`, the end of its stream) queued for a tick.
type Queued = (Arc<tokio::sync::Mutex<SendStream>>, Option<Bytes>);

/// Where a shaped stream's pieces go.
enum StreamSink {
    /// Constant rate: the shaper's tick queue; `last` is the tick of the
    /// latest piece queued.
    Ticked {
        stream: Arc<tokio::sync::Mutex<SendStream>>,
        last: AtomicU64,
    },
    /// Size buckets only: a task that writes in order at once.
    Task(tokio::sync::mpsc::UnboundedSender<Op>),
}

/// A subgroup stream written through a [`Shaper`].
pub(crate) struct ShapedStream {
    shaper: Arc<Shaper>,
    sink: StreamSink,
}

impl ShapedStream {
    fn push(&self, tick: u64, at: tokio::time::Instant, b: Option<Bytes>) -> anyhow::Result<()> {
        match &self.sink {
            StreamSink::Ticked { stream, last } => {
                last.fetch_max(tick, Relaxed);
                self.shaper
                    .queue
                    .lock()
                    .expect("queue")
                    .entry(tick)
                    .or_default()
                    .push((stream.clone(), b));
                Ok(())
            }
            StreamSink::Task(tx) => {
                let op = match b {
                    Some(b) => Op::Write(at, b),
                    None => Op::Finish,
                };
                tx.send(op)
                    .map_err(|_| anyhow::anyhow!("the shaped stream is gone"))
            }
        }
    }

    /// Queues `parts` (one object's header and payload, say) as one piece of
    /// media; fails once the stream is gone.
    pub(crate) fn write(&self, parts: &[Bytes]) -> anyhow::Result<()> {
        let n: u64 = parts.iter().map(|b| b.len() as u64).sum();
        let mut parts = parts.iter().filter(|b| !b.is_empty()).cloned();
        let mut cur = parts.next();
        for (tick, at, mut len) in self.shaper.schedule(n) {
            while len > 0 {
                let Some(b) = cur.as_mut() else { break };
                let take = (len as usize).min(b.len());
                let piece = b.split_to(take);
                len -= take as u64;
                self.push(tick, at, Some(piece))?;
                if b.is_empty() {
                    cur = parts.next();
                }
            }
        }
        Ok(())
    }

    /// Called after an object of `n` bytes: pads it to its size bucket, if
    /// buckets are on.
    pub(crate) fn object_sent(&self, n: u64) {
        self.shaper.object_sent(n);
    }

    /// Ends the stream (FIN) after what is queued.
    pub(crate) fn finish(&self) {
        let tick = match &self.sink {
            // After the stream's last piece, in a tick not yet written.
            StreamSink::Ticked { last, .. } => {
                let open = self.shaper.meter.lock().expect("meter").base;
                last.load(Relaxed).max(open)
            }
            StreamSink::Task(_) => 0,
        };
        let _ = self.push(tick, tokio::time::Instant::now(), None);
    }
}

impl Drop for Shaper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Parses `--shape-rate`: kbit/s.
pub fn parse_kbps(s: &str) -> Result<u64, String> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("bad rate {s:?}: kbit/s, e.g. 6000"))?;
    if !(16..=10_000_000).contains(&v) {
        return Err(format!("rate {v} kbit/s out of [16, 10000000]"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_on_a_geometric_ladder() {
        assert_eq!(bucket(1, 2.0), 256);
        assert_eq!(bucket(256, 2.0), 256);
        assert_eq!(bucket(257, 2.0), 512);
        assert_eq!(bucket(5000, 2.0), 8192);
        assert_eq!(bucket(5000, 1.0), 5000);
        // Overhead is below the ratio.
        for n in [300u64, 1000, 7777, 123_456] {
            let b = bucket(n, 1.5);
            assert!(b >= n && (b as f64) < n as f64 * 1.5 + 1.0, "{n} -> {b}");
        }
    }

    #[test]
    fn a_keyframe_is_spread_over_ticks_and_idle_ticks_are_padded() {
        // 1000 bytes a tick; a 3500-byte keyframe in tick 0, then 200-byte
        // frames in ticks 3 and 4.
        let mut m = Meter::new(1000);
        let (p, over) = m.reserve(0, 3500, 100);
        assert!(!over);
        assert_eq!(p, [(0, 1000), (1, 1000), (2, 1000), (3, 500)]);
        let (p, _) = m.reserve(3, 200, 100);
        assert_eq!(p, [(3, 200)]);
        let (p, _) = m.reserve(4, 200, 100);
        assert_eq!(p, [(4, 200)]);
        // Every tick carries exactly 1000 bytes, media plus padding.
        assert_eq!(m.close(3), (0, 3000));
        assert_eq!(m.close(4), (300, 700));
        assert_eq!(m.close(6), (800 + 1000, 200));
        // Media arriving late reserves from its own tick on.
        let (p, _) = m.reserve(9, 1500, 100);
        assert_eq!(p, [(9, 1000), (10, 500)]);
        assert_eq!(m.close(11), (3 * 1000 + 500, 1500));
        // A closed tick takes no more media: it goes to the next one.
        let (p, _) = m.reserve(10, 100, 100);
        assert_eq!(p, [(11, 100)]);
    }

    #[test]
    fn too_long_a_wait_is_an_overrun_sent_at_once() {
        let mut m = Meter::new(100);
        let (p, over) = m.reserve(0, 1000, 3);
        assert!(over);
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 1000);
        assert_eq!(p.last(), Some(&(0, 600)));
        // The overrun tick owes no padding.
        assert_eq!(m.close(1), (0, 700));
    }

    #[test]
    fn config_and_rate_parsing() {
        let c = ShapeConfig {
            rate_bps: Some(8_000_000),
            ..Default::default()
        };
        assert!(c.active());
        assert_eq!(c.per_tick(), 20_000);
        // 20000 wire bytes: 13 packets of 1440 bytes of payload.
        assert_eq!(media_per_tick(20_000, 1440), 13 * 1440);
        // 2500 wire bytes hold one full packet, but media gets 90 % of its
        // share.
        assert_eq!(media_per_tick(2500, 1440), 2500 * 1440 / 1500 * 9 / 10);
        assert_eq!(media_per_tick(1000, 0), 950);
        assert!(!ShapeConfig::default().active());
        assert_eq!(parse_kbps("6000"), Ok(6000));
        assert!(parse_kbps("x").is_err() && parse_kbps("1").is_err());
    }
}
