//! Durable broker state: an append-only log of records in one file, replayed
//! at start, compacted when it grows.
//!
//! What survives a restart (kill -9 included): retained messages, persistent
//! sessions (Session Expiry Interval > 0, or 3.1.1 Clean Session 0) with
//! their subscriptions, and the QoS 1/2 messages queued for them, whether the
//! session was offline or had them in flight.
//!
//! **fsync policy.** One writer thread takes every record appended since its
//! last write, writes them with one `write`, and (with [`Fsync::Always`], the
//! default) one `fdatasync`: group commit. The broker acknowledges a QoS 1/2
//! PUBLISH (PUBACK/PUBREC) only once the records it caused are durable, so an
//! acknowledged message survives power loss with `Always` and a process crash
//! with `Never` (written to the OS, not synced). A message nobody persistent
//! subscribes to, and QoS 0, cost no disk write.
//!
//! Record framing: `len: u32 BE`, `crc32: u32 BE` of the body, body. Replay
//! stops at the first torn or corrupt record (the tail of a crash) and the
//! log is rewritten from what was valid.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use quichub_mqtt::{Packet, Publish, QoS, SubscriptionOptions, Version};
use tokio::sync::watch;

use crate::broker::{Message, Source, SubOptions};

/// When the log is synced to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// `fdatasync` before acknowledging (survives power loss).
    Always,
    /// Written to the OS before acknowledging, never synced explicitly
    /// (survives a process crash, not power loss).
    Never,
}

/// One change to durable state.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A persistent session exists (or changed expiry); `u32::MAX` never expires.
    Session {
        /// Client Identifier.
        client: Arc<str>,
        /// Session Expiry Interval, seconds.
        expiry: u32,
    },
    /// The session ended.
    SessionGone {
        /// Client Identifier.
        client: Arc<str>,
    },
    /// A subscription of a persistent session.
    Sub {
        /// Client Identifier.
        client: Arc<str>,
        /// Full filter (with `$share/...`).
        filter: String,
        /// Options.
        options: SubOptions,
    },
    /// A subscription ended.
    Unsub {
        /// Client Identifier.
        client: Arc<str>,
        /// Full filter.
        filter: String,
    },
    /// A message body, referenced by `Queue` and `Retain` records.
    Msg {
        /// Message sequence number.
        seq: u64,
        /// Message expiry as Unix milliseconds (0 = none).
        expires: u64,
        /// The message as an MQTT 5 PUBLISH packet.
        publish: Bytes,
    },
    /// A message queued (or in flight) for a persistent session.
    Queue {
        /// Client Identifier.
        client: Arc<str>,
        /// Message sequence number.
        seq: u64,
        /// Delivery QoS.
        qos: QoS,
        /// Retain flag of the delivery.
        retain: bool,
        /// Subscription Identifiers.
        ids: Vec<u32>,
    },
    /// A queued message was acknowledged or dropped.
    Done {
        /// Client Identifier.
        client: Arc<str>,
        /// Message sequence number.
        seq: u64,
    },
    /// The retained message of a topic.
    Retain {
        /// Topic.
        topic: Arc<str>,
        /// Message sequence number.
        seq: u64,
    },
    /// The retained message of a topic was cleared.
    Unretain {
        /// Topic.
        topic: Arc<str>,
    },
    /// A queued QoS 2 delivery was sent with `packet_id` (and, once
    /// `released`, acknowledged with PUBREC), so that after a restart it is
    /// sent again with the same identifier, or only its PUBREL (§4.4).
    Inflight {
        /// Client Identifier.
        client: Arc<str>,
        /// Message sequence number.
        seq: u64,
        /// Packet Identifier it was sent with.
        packet_id: u16,
        /// PUBREC received: only PUBREL is due.
        released: bool,
    },
}

/// A queued delivery as recovered.
#[derive(Debug, Clone)]
pub struct QueuedRecord {
    /// Message sequence number.
    pub seq: u64,
    /// The message.
    pub message: Arc<Message>,
    /// Delivery QoS.
    pub qos: QoS,
    /// Retain flag.
    pub retain: bool,
    /// Subscription Identifiers.
    pub ids: Vec<u32>,
    /// Packet Identifier of a QoS 2 delivery sent before the restart.
    pub packet_id: Option<u16>,
    /// Acknowledged with PUBREC before the restart: only PUBREL is due.
    pub released: bool,
}

/// A persistent session as recovered.
#[derive(Debug, Clone, Default)]
pub struct SessionRecord {
    /// Session Expiry Interval, seconds.
    pub expiry: u32,
    /// Subscriptions.
    pub subscriptions: BTreeMap<String, SubOptions>,
    /// Queued messages, oldest first.
    pub queue: Vec<QueuedRecord>,
}

/// What the log held.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Sessions by Client Identifier.
    pub sessions: HashMap<Arc<str>, SessionRecord>,
    /// Retained messages with their sequence numbers.
    pub retained: Vec<(u64, Arc<Message>)>,
    /// Records replayed.
    pub records: u64,
    /// Bytes of a torn tail discarded.
    pub discarded: u64,
}

/// Live state as the log describes it; the writer thread keeps it to compact.
#[derive(Default)]
struct Live {
    sessions: HashMap<Arc<str>, LiveSession>,
    msgs: HashMap<u64, (Record, usize)>,
    retained: HashMap<Arc<str>, u64>,
}

#[derive(Default)]
struct LiveSession {
    expiry: u32,
    subs: BTreeMap<String, SubOptions>,
    queue: BTreeMap<u64, Record>,
    /// Packet Identifier and PUBREC state of queued QoS 2 deliveries in flight.
    inflight: BTreeMap<u64, (u16, bool)>,
}

impl Live {
    fn release(&mut self, seq: u64) {
        if let Some((_, refs)) = self.msgs.get_mut(&seq) {
            *refs = refs.saturating_sub(1);
            if *refs == 0 {
                self.msgs.remove(&seq);
            }
        }
    }

    fn apply(&mut self, r: &Record) {
        match r {
            Record::Session { client, expiry } => {
                self.sessions.entry(client.clone()).or_default().expiry = *expiry;
            }
            Record::SessionGone { client } => {
                if let Some(s) = self.sessions.remove(client) {
                    for seq in s.queue.keys() {
                        self.release(*seq);
                    }
                }
            }
            Record::Sub {
                client,
                filter,
                options,
            } => {
                if let Some(s) = self.sessions.get_mut(client) {
                    s.subs.insert(filter.clone(), *options);
                }
            }
            Record::Unsub { client, filter } => {
                if let Some(s) = self.sessions.get_mut(client) {
                    s.subs.remove(filter);
                }
            }
            Record::Msg { seq, .. } => {
                // Held by its first reference; unreferenced bodies are dropped
                // at the next compaction.
                self.msgs.entry(*seq).or_insert((r.clone(), 0));
            }
            Record::Queue { client, seq, .. } => {
                let Some(s) = self.sessions.get_mut(client) else {
                    return;
                };
                if !self.msgs.contains_key(seq) {
                    return;
                }
                if s.queue.insert(*seq, r.clone()).is_none() {
                    if let Some((_, refs)) = self.msgs.get_mut(seq) {
                        *refs += 1;
                    }
                }
            }
            Record::Done { client, seq } => {
                let removed = self
                    .sessions
                    .get_mut(client)
                    .and_then(|s| {
                        s.inflight.remove(seq);
                        s.queue.remove(seq)
                    })
                    .is_some();
                if removed {
                    self.release(*seq);
                }
            }
            Record::Retain { topic, seq } => {
                if !self.msgs.contains_key(seq) {
                    return;
                }
                if let Some((_, refs)) = self.msgs.get_mut(seq) {
                    *refs += 1;
                }
                if let Some(old) = self.retained.insert(topic.clone(), *seq) {
                    self.release(old);
                }
            }
            Record::Unretain { topic } => {
                if let Some(old) = self.retained.remove(topic) {
                    self.release(old);
                }
            }
            Record::Inflight {
                client,
                seq,
                packet_id,
                released,
            } => {
                if let Some(s) = self.sessions.get_mut(client) {
                    if s.queue.contains_key(seq) {
                        s.inflight.insert(*seq, (*packet_id, *released));
                    }
                }
            }
        }
    }

    /// The records that rebuild this state, bodies first.
    fn snapshot(&self) -> Vec<Record> {
        let mut out: Vec<Record> = Vec::new();
        // A body nothing references (a crash between it and its reference)
        // is dropped here.
        let mut seqs: Vec<&u64> = self
            .msgs
            .iter()
            .filter(|(_, (_, refs))| *refs > 0)
            .map(|(s, _)| s)
            .collect();
        seqs.sort_unstable();
        for s in seqs {
            out.push(self.msgs[s].0.clone());
        }
        for (client, s) in &self.sessions {
            out.push(Record::Session {
                client: client.clone(),
                expiry: s.expiry,
            });
            for (filter, options) in &s.subs {
                out.push(Record::Sub {
                    client: client.clone(),
                    filter: filter.clone(),
                    options: *options,
                });
            }
            out.extend(s.queue.values().cloned());
            for (seq, (packet_id, released)) in &s.inflight {
                out.push(Record::Inflight {
                    client: client.clone(),
                    seq: *seq,
                    packet_id: *packet_id,
                    released: *released,
                });
            }
        }
        for (topic, seq) in &self.retained {
            out.push(Record::Retain {
                topic: topic.clone(),
                seq: *seq,
            });
        }
        out
    }

    fn message(&self, seq: u64, now: Instant, unix_now: u64) -> Option<Arc<Message>> {
        let (
            Record::Msg {
                expires, publish, ..
            },
            _,
        ) = self.msgs.get(&seq)?
        else {
            return None;
        };
        decode_message(publish, *expires, now, unix_now).map(Arc::new)
    }

    /// The message even if expired (a PUBREL for it is still due).
    fn message_any(&self, seq: u64) -> Option<Arc<Message>> {
        let (Record::Msg { publish, .. }, _) = self.msgs.get(&seq)? else {
            return None;
        };
        decode_message(publish, 0, Instant::now(), 0).map(Arc::new)
    }
}

/// Records appended together, with the ticket of the append.
type Batch = (u64, Vec<Record>);

/// The durable log.
pub struct Store {
    tx: Mutex<(u64, mpsc::Sender<Batch>)>,
    synced: watch::Receiver<u64>,
    failed: Arc<AtomicBool>,
    seq: AtomicU64,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Log size that triggers compaction when it is also 4× the live state.
const COMPACT_MIN: u64 = 16 << 20;

impl Store {
    /// Opens (or creates) the log in `dir`, replays it, and rewrites it
    /// compacted. Fails if another process holds the directory.
    pub fn open(dir: &Path, fsync: Fsync) -> std::io::Result<(Arc<Store>, Recovered)> {
        std::fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } != 0
        {
            return Err(std::io::Error::other(format!(
                "{} is in use by another quichub process (use another --data-dir)",
                dir.display()
            )));
        }
        let path = dir.join("broker.log");
        let mut live = Live::default();
        let (records, discarded, max_seq) = replay(&path, &mut live)?;
        let now = Instant::now();
        let unix_now = unix_ms();
        let mut recovered = Recovered {
            records,
            discarded,
            ..Recovered::default()
        };
        for (client, s) in &live.sessions {
            let queue = s
                .queue
                .values()
                .filter_map(|r| match r {
                    Record::Queue {
                        seq,
                        qos,
                        retain,
                        ids,
                        ..
                    } => Some(QueuedRecord {
                        seq: *seq,
                        // A message sent already is being delivered: it is
                        // sent again (or its PUBREL) even past its expiry
                        // (§3.3.2.3.3).
                        message: if s.inflight.contains_key(seq) {
                            live.message_any(*seq)?
                        } else {
                            live.message(*seq, now, unix_now)?
                        },
                        qos: *qos,
                        retain: *retain,
                        ids: ids.clone(),
                        packet_id: s.inflight.get(seq).map(|(id, _)| *id),
                        released: s.inflight.get(seq).is_some_and(|(_, r)| *r),
                    }),
                    _ => None,
                })
                .collect();
            recovered.sessions.insert(
                client.clone(),
                SessionRecord {
                    expiry: s.expiry,
                    subscriptions: s.subs.clone(),
                    queue,
                },
            );
        }
        for seq in live.retained.values() {
            if let Some(m) = live.message(*seq, now, unix_now) {
                recovered.retained.push((*seq, m));
            }
        }
        let file = rewrite(&path, &live)?;
        let (stx, synced) = watch::channel(0u64);
        let (tx, rx) = mpsc::channel();
        let failed = Arc::new(AtomicBool::new(false));
        let f2 = failed.clone();
        let p2 = path.clone();
        std::thread::Builder::new()
            .name("quichub-store".into())
            .spawn(move || writer(file, p2, live, rx, stx, fsync, f2, lock))?;
        let store = Arc::new(Store {
            tx: Mutex::new((0, tx)),
            synced,
            failed,
            seq: AtomicU64::new(max_seq + 1),
            path,
        });
        Ok((store, recovered))
    }

    /// Appends a record; returns its ticket (durable once [`Self::synced`] reaches it).
    pub fn append(&self, r: Record) -> u64 {
        self.append_all(vec![r])
    }

    /// Appends records that belong together (a message body and the records
    /// that reference it): the writer never splits them across a write or a
    /// compaction. Returns the ticket of the last.
    pub fn append_all(&self, records: Vec<Record>) -> u64 {
        let mut g = self.tx.lock().expect("store lock");
        g.0 += 1;
        let ticket = g.0;
        let _ = g.1.send((ticket, records));
        ticket
    }

    /// The body of `m` as a record under a new sequence number, for
    /// [`Self::append_all`] with the records that reference it.
    pub fn message_record(&self, m: &Message) -> (u64, Record) {
        let seq = self.next_seq();
        let r = Record::Msg {
            seq,
            expires: m.expires.map_or(0, |e| {
                let left = e.saturating_duration_since(Instant::now()).as_millis() as u64;
                unix_ms() + left.max(1)
            }),
            publish: encode_message(m),
        };
        (seq, r)
    }

    /// A new message sequence number.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Relaxed)
    }

    /// Appends the body of `m` under a new sequence number.
    pub fn put_message(&self, m: &Message) -> u64 {
        let (seq, r) = self.message_record(m);
        self.append(r);
        seq
    }

    /// The highest durable ticket, watched.
    pub fn synced(&self) -> watch::Receiver<u64> {
        self.synced.clone()
    }

    /// Whether a write failed (nothing is durable after that).
    pub fn failed(&self) -> bool {
        self.failed.load(SeqCst)
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[allow(clippy::too_many_arguments)]
fn writer(
    mut file: File,
    path: PathBuf,
    mut live: Live,
    rx: mpsc::Receiver<Batch>,
    synced: watch::Sender<u64>,
    fsync: Fsync,
    failed: Arc<AtomicBool>,
    _lock: File,
) {
    let mut size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut snapshot_size = size;
    let mut buf = BytesMut::new();
    while let Ok(first) = rx.recv() {
        let mut last = first.0;
        let mut batch = first.1;
        while batch.len() < 4096 {
            let Ok((t, rs)) = rx.try_recv() else { break };
            last = t;
            batch.extend(rs);
        }
        buf.clear();
        for r in &batch {
            frame(r, &mut buf);
            live.apply(r);
        }
        let ok = !failed.load(SeqCst)
            && file.write_all(&buf).is_ok()
            && (fsync == Fsync::Never || file.sync_data().is_ok());
        if !ok && !failed.swap(true, SeqCst) {
            tracing::error!(
                "broker store {}: write failed; QoS 1/2 publishes are refused from now on",
                path.display()
            );
        }
        size += buf.len() as u64;
        synced.send_replace(last);
        if ok && size > COMPACT_MIN && size > 4 * snapshot_size {
            match rewrite(&path, &live) {
                Ok(f) => {
                    file = f;
                    size = file.metadata().map(|m| m.len()).unwrap_or(0);
                    snapshot_size = size;
                }
                Err(e) => tracing::warn!("broker store compaction: {e}"),
            }
        }
    }
}

/// Writes the live state to a new file and renames it over the log.
fn rewrite(path: &Path, live: &Live) -> std::io::Result<File> {
    let tmp = path.with_extension("log.new");
    let mut f = File::create(&tmp)?;
    let mut buf = BytesMut::new();
    for r in live.snapshot() {
        frame(&r, &mut buf);
    }
    f.write_all(&buf)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    OpenOptions::new().append(true).open(path)
}

/// Replays the log into `live`: (records, bytes discarded, largest message seq).
fn replay(path: &Path, live: &mut Live) -> std::io::Result<(u64, u64, u64)> {
    let mut data = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut data)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut s = &data[..];
    let (mut n, mut max_seq) = (0, 0);
    while s.len() >= 8 {
        let len = u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize;
        let crc = u32::from_be_bytes([s[4], s[5], s[6], s[7]]);
        let Some(body) = s.get(8..8 + len) else { break };
        if crc32(body) != crc {
            break;
        }
        let Some(r) = parse(body) else { break };
        if let Record::Msg { seq, .. } = &r {
            max_seq = max_seq.max(*seq);
        }
        live.apply(&r);
        n += 1;
        s = &s[8 + len..];
    }
    Ok((n, s.len() as u64, max_seq))
}

fn frame(r: &Record, out: &mut BytesMut) {
    let start = out.len();
    out.put_u64(0);
    encode(r, out);
    let body_len = out.len() - start - 8;
    let crc = crc32(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_be_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
}

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u32(s.len() as u32);
    out.put_slice(s.as_bytes());
}

fn get_str(s: &mut &[u8]) -> Option<String> {
    let b = get_bytes(s)?;
    String::from_utf8(b.to_vec()).ok()
}

fn get_bytes<'a>(s: &mut &'a [u8]) -> Option<&'a [u8]> {
    if s.len() < 4 {
        return None;
    }
    let n = s.get_u32() as usize;
    if s.len() < n {
        return None;
    }
    let (b, rest) = s.split_at(n);
    *s = rest;
    Some(b)
}

fn get_u64(s: &mut &[u8]) -> Option<u64> {
    (s.len() >= 8).then(|| s.get_u64())
}

fn get_u32(s: &mut &[u8]) -> Option<u32> {
    (s.len() >= 4).then(|| s.get_u32())
}

fn get_u16(s: &mut &[u8]) -> Option<u16> {
    (s.len() >= 2).then(|| s.get_u16())
}

fn get_u8(s: &mut &[u8]) -> Option<u8> {
    (!s.is_empty()).then(|| s.get_u8())
}

fn encode(r: &Record, out: &mut BytesMut) {
    match r {
        Record::Session { client, expiry } => {
            out.put_u8(1);
            put_str(out, client);
            out.put_u32(*expiry);
        }
        Record::SessionGone { client } => {
            out.put_u8(2);
            put_str(out, client);
        }
        Record::Sub {
            client,
            filter,
            options,
        } => {
            out.put_u8(3);
            put_str(out, client);
            put_str(out, filter);
            let o = options.options;
            out.put_u8(o.qos.as_u8());
            out.put_u8(
                u8::from(o.no_local)
                    | u8::from(o.retain_as_published) << 1
                    | o.retain_handling << 2,
            );
            out.put_u32(options.id.unwrap_or(0));
        }
        Record::Unsub { client, filter } => {
            out.put_u8(4);
            put_str(out, client);
            put_str(out, filter);
        }
        Record::Msg {
            seq,
            expires,
            publish,
        } => {
            out.put_u8(5);
            out.put_u64(*seq);
            out.put_u64(*expires);
            out.put_u32(publish.len() as u32);
            out.put_slice(publish);
        }
        Record::Queue {
            client,
            seq,
            qos,
            retain,
            ids,
        } => {
            out.put_u8(6);
            put_str(out, client);
            out.put_u64(*seq);
            out.put_u8(qos.as_u8() | u8::from(*retain) << 2);
            out.put_u32(ids.len() as u32);
            for i in ids {
                out.put_u32(*i);
            }
        }
        Record::Done { client, seq } => {
            out.put_u8(7);
            put_str(out, client);
            out.put_u64(*seq);
        }
        Record::Retain { topic, seq } => {
            out.put_u8(8);
            put_str(out, topic);
            out.put_u64(*seq);
        }
        Record::Unretain { topic } => {
            out.put_u8(9);
            put_str(out, topic);
        }
        Record::Inflight {
            client,
            seq,
            packet_id,
            released,
        } => {
            out.put_u8(10);
            put_str(out, client);
            out.put_u64(*seq);
            out.put_u16(*packet_id);
            out.put_u8(u8::from(*released));
        }
    }
}

fn parse(mut s: &[u8]) -> Option<Record> {
    let s = &mut s;
    let r = match get_u8(s)? {
        1 => Record::Session {
            client: get_str(s)?.into(),
            expiry: get_u32(s)?,
        },
        2 => Record::SessionGone {
            client: get_str(s)?.into(),
        },
        3 => {
            let client = get_str(s)?.into();
            let filter = get_str(s)?;
            let qos = QoS::from_u8(get_u8(s)?)?;
            let flags = get_u8(s)?;
            let id = get_u32(s)?;
            Record::Sub {
                client,
                filter,
                options: SubOptions {
                    options: SubscriptionOptions {
                        qos,
                        no_local: flags & 1 != 0,
                        retain_as_published: flags & 2 != 0,
                        retain_handling: (flags >> 2) & 3,
                    },
                    id: (id != 0).then_some(id),
                },
            }
        }
        4 => Record::Unsub {
            client: get_str(s)?.into(),
            filter: get_str(s)?,
        },
        5 => Record::Msg {
            seq: get_u64(s)?,
            expires: get_u64(s)?,
            publish: Bytes::copy_from_slice(get_bytes(s)?),
        },
        6 => {
            let client = get_str(s)?.into();
            let seq = get_u64(s)?;
            let b = get_u8(s)?;
            let n = get_u32(s)? as usize;
            if s.len() < n.checked_mul(4)? {
                return None;
            }
            let ids = (0..n).map(|_| s.get_u32()).collect();
            Record::Queue {
                client,
                seq,
                qos: QoS::from_u8(b & 3)?,
                retain: b & 4 != 0,
                ids,
            }
        }
        7 => Record::Done {
            client: get_str(s)?.into(),
            seq: get_u64(s)?,
        },
        8 => Record::Retain {
            topic: get_str(s)?.into(),
            seq: get_u64(s)?,
        },
        9 => Record::Unretain {
            topic: get_str(s)?.into(),
        },
        10 => Record::Inflight {
            client: get_str(s)?.into(),
            seq: get_u64(s)?,
            packet_id: get_u16(s)?,
            released: match get_u8(s)? {
                0 => false,
                1 => true,
                _ => return None,
            },
        },
        _ => return None,
    };
    s.is_empty().then_some(r)
}

/// A message as an MQTT 5 PUBLISH (topic, QoS, retain, forwarded properties, payload).
fn encode_message(m: &Message) -> Bytes {
    let p = Packet::Publish(Publish {
        dup: false,
        qos: m.qos,
        retain: m.retain,
        topic: m.topic.to_string(),
        packet_id: (m.qos != QoS::AtMostOnce).then_some(1),
        properties: m.properties.clone(),
        payload: m.payload.clone(),
    });
    let mut b = BytesMut::new();
    let _ = quichub_mqtt::encode(&p, Version::V5, &mut b);
    b.freeze()
}

fn decode_message(publish: &Bytes, expires: u64, now: Instant, unix_now: u64) -> Option<Message> {
    let mut b = BytesMut::from(&publish[..]);
    let Ok(Some(Packet::Publish(p))) = quichub_mqtt::decode(&mut b, Some(Version::V5), usize::MAX)
    else {
        return None;
    };
    let expires = match expires {
        0 => None,
        e if e <= unix_now => return None,
        e => Some(now + std::time::Duration::from_millis(e - unix_now)),
    };
    Some(Message {
        topic: p.topic.into(),
        payload: p.payload,
        qos: p.qos,
        retain: p.retain,
        properties: p.properties,
        expires,
        source: Source::Store,
    })
}

/// CRC-32 (IEEE), for torn-write detection.
fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    !data.iter().fold(!0u32, |c, &b| {
        table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("quichub-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn msg(topic: &str, payload: &'static [u8]) -> Message {
        Message::new(
            topic,
            Bytes::from_static(payload),
            QoS::AtLeastOnce,
            false,
            Source::Http,
        )
    }

    async fn wait(store: &Store, ticket: u64) {
        let mut s = store.synced();
        s.wait_for(|v| *v >= ticket).await.unwrap();
    }

    #[test]
    fn crc32_known_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn every_record_round_trips() {
        let c: Arc<str> = "c".into();
        let recs = [
            Record::Session {
                client: c.clone(),
                expiry: 7,
            },
            Record::SessionGone { client: c.clone() },
            Record::Sub {
                client: c.clone(),
                filter: "$share/g/a/#".into(),
                options: SubOptions {
                    options: SubscriptionOptions {
                        qos: QoS::ExactlyOnce,
                        no_local: true,
                        retain_as_published: true,
                        retain_handling: 2,
                    },
                    id: Some(9),
                },
            },
            Record::Unsub {
                client: c.clone(),
                filter: "a".into(),
            },
            Record::Msg {
                seq: 3,
                expires: 5,
                publish: Bytes::from_static(b"xyz"),
            },
            Record::Queue {
                client: c.clone(),
                seq: 3,
                qos: QoS::AtLeastOnce,
                retain: true,
                ids: vec![1, 2],
            },
            Record::Done {
                client: c.clone(),
                seq: 3,
            },
            Record::Retain {
                topic: "t".into(),
                seq: 3,
            },
            Record::Unretain { topic: "t".into() },
            Record::Inflight {
                client: c.clone(),
                seq: 3,
                packet_id: 0xbeef,
                released: true,
            },
        ];
        for r in recs {
            let mut b = BytesMut::new();
            encode(&r, &mut b);
            assert_eq!(parse(&b), Some(r.clone()));
            // Truncated bodies never parse (nor panic).
            for cut in 0..b.len() {
                assert_eq!(parse(&b[..cut]), None, "{r:?} cut at {cut}");
            }
        }
    }

    #[tokio::test]
    async fn state_survives_reopen_and_torn_tail_is_dropped() {
        let dir = tmpdir("reopen");
        {
            let (store, rec) = Store::open(&dir, Fsync::Always).unwrap();
            assert!(rec.sessions.is_empty());
            let c: Arc<str> = "dev1".into();
            store.append(Record::Session {
                client: c.clone(),
                expiry: 3600,
            });
            store.append(Record::Sub {
                client: c.clone(),
                filter: "a/#".into(),
                options: SubOptions {
                    options: SubscriptionOptions::default(),
                    id: None,
                },
            });
            for (i, p) in [&b"one"[..], b"two", b"three"].into_iter().enumerate() {
                let seq = store.put_message(&msg("a/b", p));
                let t = store.append(Record::Queue {
                    client: c.clone(),
                    seq,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    ids: vec![],
                });
                if i == 0 {
                    store.append(Record::Done {
                        client: c.clone(),
                        seq,
                    });
                }
                wait(&store, t).await;
            }
            let seq = store.put_message(&msg("r", b"kept"));
            let t = store.append(Record::Retain {
                topic: "r".into(),
                seq,
            });
            wait(&store, t).await;
        }
        // Give the writer thread a moment to release the lock.
        std::thread::sleep(std::time::Duration::from_millis(100));
        // A torn record at the tail (a crash mid-write) is ignored.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("broker.log"))
            .unwrap();
        f.write_all(&[0, 0, 0, 50, 1, 2, 3, 4, 9]).unwrap();
        drop(f);
        let (_store, rec) = Store::open(&dir, Fsync::Always).unwrap();
        assert_eq!(rec.discarded, 9);
        let s = &rec.sessions["dev1"];
        assert_eq!(s.expiry, 3600);
        assert!(s.subscriptions.contains_key("a/#"));
        let payloads: Vec<_> = s.queue.iter().map(|q| q.message.payload.clone()).collect();
        assert_eq!(
            payloads,
            [Bytes::from_static(b"two"), Bytes::from_static(b"three")]
        );
        assert_eq!(rec.retained.len(), 1);
        assert_eq!(rec.retained[0].1.payload, Bytes::from_static(b"kept"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn second_process_on_the_same_dir_is_refused() {
        let dir = tmpdir("lock");
        let (_a, _) = Store::open(&dir, Fsync::Never).unwrap();
        let e = Store::open(&dir, Fsync::Never).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
