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
//! **Write failures** (a full disk): the records stay in the writer's live
//! state, nothing after the failure counts as durable ([`Store::durability`]),
//! and the writer retries with backoff by rewriting the whole log from that
//! state; once a retry succeeds everything appended meanwhile is durable and
//! appends resume. Only publishes that need a durable record are refused in
//! between.
//!
//! **Format.** A header, `QHBLOG` and the format version (u16 BE), then
//! records: `len: u32 BE`, `crc32: u32 BE` of the body, body. A file without
//! the header is format 0 (earlier releases; the same records): it is read
//! and rewritten with the header. Files are created 0600, the directory 0700.
//!
//! **Replay** reads the file record by record through a window, so memory is
//! bounded by the largest record, not by the file. An incomplete last record
//! is what a crash mid-write leaves: dropped with a warning. Anything else
//! that does not check (CRC, a body that does not decode, garbage) is
//! corruption. With [`Recovery::Salvage`] (the default) replay skips it and
//! resynchronises on the next valid record, logs every skipped range at
//! ERROR, and keeps the damaged file as `broker.log.corrupt-<unix seconds>`
//! before the log is rewritten; with [`Recovery::Strict`] the store refuses
//! to open, naming the file and the offset.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// What [`Store::open`] does with a log that is corrupt (damage other than
/// an incomplete last record, which a crash leaves and is always dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Recovery {
    /// Refuse to open, naming the file and the offset of the damage; the
    /// file is left as it is.
    Strict,
    /// Skip the damaged ranges (each logged at ERROR), keep the damaged file
    /// aside as `broker.log.corrupt-<unix seconds>`, and go on with every
    /// record that checks.
    #[default]
    Salvage,
}

/// The store's counters, for `/metrics`: updated by the writer thread,
/// read without a lock.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Size of the log file, bytes.
    pub bytes: AtomicU64,
    /// Group commits synced to disk (`fdatasync`, with [`Fsync::Always`]).
    pub fsyncs: AtomicU64,
    /// Time spent in them, nanoseconds.
    pub fsync_nanos: AtomicU64,
    /// The longest one, nanoseconds.
    pub fsync_max_nanos: AtomicU64,
}

impl StoreStats {
    fn fsynced(&self, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.fsyncs.fetch_add(1, Relaxed);
        self.fsync_nanos.fetch_add(ns, Relaxed);
        self.fsync_max_nanos.fetch_max(ns, Relaxed);
    }

    /// The counters in Prometheus text format: the log size, and the fsync
    /// latency as a summary (count and sum) with its maximum.
    pub fn render(&self) -> String {
        use crate::metrics::{family, sample};
        let secs = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e9;
        let mut s = String::new();
        family(
            &mut s,
            "quichub_mqtt_store_bytes",
            "gauge",
            "Size of the broker's log file.",
        );
        sample(
            &mut s,
            "quichub_mqtt_store_bytes",
            &[],
            self.bytes.load(Relaxed),
        );
        family(
            &mut s,
            "quichub_mqtt_store_fsync_seconds",
            "summary",
            "Time of the broker log's group-commit fdatasync.",
        );
        let name = "quichub_mqtt_store_fsync_seconds";
        sample(&mut s, &format!("{name}_sum"), &[], secs(&self.fsync_nanos));
        sample(
            &mut s,
            &format!("{name}_count"),
            &[],
            self.fsyncs.load(Relaxed),
        );
        family(
            &mut s,
            "quichub_mqtt_store_fsync_seconds_max",
            "gauge",
            "Longest fdatasync of the broker's log since start.",
        );
        sample(
            &mut s,
            "quichub_mqtt_store_fsync_seconds_max",
            &[],
            secs(&self.fsync_max_nanos),
        );
        s
    }
}

impl std::str::FromStr for Recovery {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strict" => Ok(Recovery::Strict),
            "salvage" => Ok(Recovery::Salvage),
            _ => Err(format!(
                "recovery mode must be strict or salvage, not {s:?}"
            )),
        }
    }
}

/// A byte range of the log that replay skipped as corrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Offset of the first byte skipped, from the start of the file.
    pub offset: u64,
    /// Bytes skipped.
    pub len: u64,
    /// Records lost, when the framing of the skipped bytes tells (a record
    /// whose body was damaged); `None` when it does not (garbage).
    pub records: Option<u64>,
}

/// Where an append's ticket stands (see [`Store::durability`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// On disk (or nothing had to be written).
    Durable,
    /// Not written yet.
    Pending,
    /// Writes are failing: not durable now, maybe later.
    Failed,
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
    /// Bytes of a torn tail (an incomplete last record) discarded.
    pub discarded: u64,
    /// Format version of the file read (0: header-less, before versions).
    pub version: u16,
    /// Ranges skipped as corrupt.
    pub damage: Vec<Damage>,
    /// Where the damaged file was kept, when there was damage.
    pub kept_aside: Option<PathBuf>,
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
    /// Write attempts still to fail: a test hook standing in for a full disk.
    #[cfg_attr(not(test), allow(dead_code))]
    faults: Arc<AtomicU32>,
    seq: AtomicU64,
    path: PathBuf,
    stats: Arc<StoreStats>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Log size that triggers compaction when it is also 4× the live state.
const COMPACT_MIN: u64 = 16 << 20;

/// First bytes of a log with a header (format 1 on).
const MAGIC: [u8; 6] = *b"QHBLOG";
/// Format written: the header (`MAGIC`, this as u16 BE), then records.
const VERSION: u16 = 1;
/// Bytes of the header.
const HEADER_LEN: usize = MAGIC.len() + 2;
/// Largest record body replay accepts: an MQTT packet can be 256 MiB, plus
/// the record's own fields. Bounds what one bad length can make replay read.
const MAX_RECORD: usize = (256 << 20) + (64 << 10);
/// Read-ahead of replay.
const READ_CHUNK: usize = 256 << 10;
/// First and longest wait before a failed write is retried.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl Store {
    /// Opens (or creates, 0700) the log in `dir`, replays it, and rewrites
    /// it compacted. Fails if another process holds the directory, if the
    /// log has an unknown format version, or (with [`Recovery::Strict`]) if
    /// it is corrupt.
    pub fn open(
        dir: &Path,
        fsync: Fsync,
        recovery: Recovery,
    ) -> std::io::Result<(Arc<Store>, Recovered)> {
        // Broker state holds other clients' messages: no one else reads it.
        // An existing directory keeps its mode (it may be shared on purpose).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
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
        let replayed = match File::open(&path) {
            Ok(f) => replay(BufReader::new(f), &path, recovery, &mut live)?,
            Err(e) if e.kind() == ErrorKind::NotFound => Replayed {
                version: VERSION,
                ..Replayed::default()
            },
            Err(e) => return Err(e),
        };
        // Kept before the rewrite below replaces the file: the evidence of
        // what went wrong, and what an operator may still extract by hand.
        let kept_aside = if replayed.damage.is_empty() {
            None
        } else {
            let aside = keep_aside(&path)?;
            tracing::error!(
                "broker store {}: {} corrupt ranges skipped ({} bytes); the damaged log is kept as {}",
                path.display(),
                replayed.damage.len(),
                replayed.damage.iter().map(|d| d.len).sum::<u64>(),
                aside.display()
            );
            Some(aside)
        };
        let max_seq = replayed.max_seq;
        let now = Instant::now();
        let unix_now = unix_ms();
        let mut recovered = Recovered {
            records: replayed.records,
            discarded: replayed.torn,
            version: replayed.version,
            damage: replayed.damage,
            kept_aside,
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
        let faults = Arc::new(AtomicU32::new(0));
        let stats = Arc::new(StoreStats::default());
        let w = Writer {
            file,
            path: path.clone(),
            live,
            synced: stx,
            fsync,
            failed: failed.clone(),
            faults: faults.clone(),
            stats: stats.clone(),
            _lock: lock,
        };
        std::thread::Builder::new()
            .name("quichub-store".into())
            .spawn(move || w.run(rx))?;
        let store = Arc::new(Store {
            tx: Mutex::new((0, tx)),
            synced,
            failed,
            faults,
            seq: AtomicU64::new(max_seq + 1),
            path,
            stats,
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

    /// Whether writes are failing now (nothing appended since the failure
    /// is durable until a retry succeeds).
    pub fn failed(&self) -> bool {
        self.failed.load(SeqCst)
    }

    /// Where `ticket` stands, `synced` being the value last read from
    /// [`Self::synced`] (read it before calling: the writer marks a failure
    /// before it wakes the watchers). Ticket 0 (nothing written) is durable.
    pub fn durability(&self, ticket: u64, synced: u64) -> Durability {
        if ticket <= synced {
            Durability::Durable
        } else if self.failed() {
            Durability::Failed
        } else {
            Durability::Pending
        }
    }

    /// Makes the next `n` write attempts (appends or retries) fail.
    #[cfg(test)]
    pub(crate) fn fail_next_writes(&self, n: u32) {
        self.faults.store(n, SeqCst);
    }

    /// The store's counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
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

/// The writer thread's state.
struct Writer {
    file: File,
    path: PathBuf,
    live: Live,
    synced: watch::Sender<u64>,
    fsync: Fsync,
    failed: Arc<AtomicBool>,
    faults: Arc<AtomicU32>,
    stats: Arc<StoreStats>,
    /// Held for the flock until the thread ends.
    _lock: File,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Batch>) {
        let mut size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut snapshot_size = size;
        self.stats.bytes.store(size, Relaxed);
        let mut buf = BytesMut::new();
        let mut last = 0;
        // Set while writes fail: (next attempt, backoff). The file may then
        // end in a partial record, and a failed fsync may have dropped data
        // the kernel no longer holds as dirty, so appending again would not
        // do: the retry rewrites the whole log from `live` (new file, rename).
        let mut retry: Option<(Instant, Duration)> = None;
        loop {
            let first = match retry {
                None => match rx.recv() {
                    Ok(b) => Some(b),
                    Err(_) => break,
                },
                Some((at, _)) => {
                    match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                        Ok(b) => Some(b),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            buf.clear();
            if let Some((t, mut batch)) = first {
                last = t;
                while batch.len() < 4096 {
                    let Ok((t, rs)) = rx.try_recv() else { break };
                    last = t;
                    batch.extend(rs);
                }
                for r in &batch {
                    if retry.is_none() {
                        frame(r, &mut buf);
                    }
                    self.live.apply(r);
                }
            }
            if let Some((at, backoff)) = retry {
                if Instant::now() < at {
                    continue;
                }
                match self
                    .attempt()
                    .and_then(|()| rewrite(&self.path, &self.live))
                {
                    Ok(f) => {
                        self.file = f;
                        size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
                        snapshot_size = size;
                        self.stats.bytes.store(size, Relaxed);
                        retry = None;
                        tracing::warn!(
                            "broker store {}: writes work again; everything appended meanwhile is durable",
                            self.path.display()
                        );
                        // Cleared first: a watcher woken by the new value
                        // must not see the failure still set.
                        self.failed.store(false, SeqCst);
                        self.synced.send_replace(last);
                    }
                    Err(e) => {
                        let backoff = (backoff * 2).min(RETRY_MAX);
                        tracing::debug!("broker store {}: retry failed: {e}", self.path.display());
                        retry = Some((Instant::now() + backoff, backoff));
                    }
                }
                continue;
            }
            let res = self
                .attempt()
                .and_then(|()| self.file.write_all(&buf))
                .and_then(|()| match self.fsync {
                    Fsync::Always => {
                        let t = Instant::now();
                        let r = self.file.sync_data();
                        self.stats.fsynced(t.elapsed());
                        r
                    }
                    Fsync::Never => Ok(()),
                });
            if let Err(e) = res {
                tracing::error!(
                    "broker store {}: write failed ({e}); publishes that need a durable record are refused until a retry succeeds",
                    self.path.display()
                );
                self.failed.store(true, SeqCst);
                // Wakes the watchers (the value is unchanged) so that they
                // see the failure instead of waiting for this ticket.
                self.synced.send_modify(|_| {});
                retry = Some((Instant::now() + RETRY_MIN, RETRY_MIN));
                continue;
            }
            size += buf.len() as u64;
            self.synced.send_replace(last);
            if size > COMPACT_MIN && size > 4 * snapshot_size {
                match rewrite(&self.path, &self.live) {
                    Ok(f) => {
                        self.file = f;
                        size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
                        snapshot_size = size;
                    }
                    Err(e) => tracing::warn!("broker store compaction: {e}"),
                }
            }
            self.stats.bytes.store(size, Relaxed);
        }
        // The broker is gone with writes still failing: one last try, so
        // what it appended meanwhile is not lost if space came back.
        if retry.is_some() {
            if let Err(e) = self
                .attempt()
                .and_then(|()| rewrite(&self.path, &self.live))
            {
                tracing::error!(
                    "broker store {}: closed with writes failing ({e}): the last changes are lost",
                    self.path.display()
                );
            }
        }
    }

    /// Fails while the test hook says so.
    fn attempt(&self) -> std::io::Result<()> {
        match self
            .faults
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        {
            Ok(_) => Err(std::io::Error::other("injected write failure")),
            Err(_) => Ok(()),
        }
    }
}

/// Writes the live state to a new file (0600, with the header) and renames
/// it over the log.
fn rewrite(path: &Path, live: &Live) -> std::io::Result<File> {
    let tmp = path.with_extension("log.new");
    let written = (|| {
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        w.write_all(&header())?;
        let mut buf = BytesMut::new();
        for r in live.snapshot() {
            buf.clear();
            frame(&r, &mut buf);
            w.write_all(&buf)?;
        }
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()
    })();
    if let Err(e) = written {
        // A partial copy would hold on to the space a full disk lacks.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    OpenOptions::new().append(true).open(path)
}

fn header() -> [u8; HEADER_LEN] {
    let mut h = [0; HEADER_LEN];
    h[..MAGIC.len()].copy_from_slice(&MAGIC);
    h[MAGIC.len()..].copy_from_slice(&VERSION.to_be_bytes());
    h
}

/// Keeps the damaged log as `<name>.corrupt-<unix seconds>` beside it: a
/// hard link (instant, no space: the rewrite then replaces the name, not the
/// data), else a copy.
fn keep_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = unix_ms() / 1000;
    let name = path
        .file_name()
        .map_or_else(|| "broker.log".into(), |n| n.to_string_lossy());
    for i in 0..1000 {
        let aside = path.with_file_name(match i {
            0 => format!("{name}.corrupt-{secs}"),
            _ => format!("{name}.corrupt-{secs}-{i}"),
        });
        match std::fs::hard_link(path, &aside) {
            Ok(()) => {
                // Releases before 0600 files made the log 0644, and this copy
                // is kept indefinitely (the link shares the mode with the
                // log, which the rewrite replaces anyway).
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o600));
                return Ok(aside);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(_) => {}
        }
        let mut to = match OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&aside)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let copied = std::io::copy(&mut File::open(path)?, &mut to).and_then(|_| to.sync_all());
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&aside);
            return Err(e);
        }
        return Ok(aside);
    }
    Err(std::io::Error::other(format!(
        "{}: no free name to keep the damaged log aside",
        path.display()
    )))
}

/// What replay found.
#[derive(Debug, Default)]
struct Replayed {
    records: u64,
    /// Bytes of an incomplete last record.
    torn: u64,
    damage: Vec<Damage>,
    max_seq: u64,
    version: u16,
    /// Largest read window, for the test that replay streams.
    peak: usize,
}

/// Replays the log read from `r` into `live`.
fn replay<R: Read>(
    r: R,
    path: &Path,
    recovery: Recovery,
    live: &mut Live,
) -> std::io::Result<Replayed> {
    let mut s = Scanner::new(r);
    let mut out = Replayed::default();
    if s.fill(HEADER_LEN)? && s.window().starts_with(&MAGIC) {
        let w = s.window();
        let v = u16::from_be_bytes([w[MAGIC.len()], w[MAGIC.len() + 1]]);
        if v != VERSION {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!(
                    "{}: log format version {v} is unknown (this quichub reads 0 to {VERSION}): written by a newer quichub? The file is left as it is",
                    path.display()
                ),
            ));
        }
        out.version = v;
        s.advance(HEADER_LEN);
    }
    // Else format 0, header-less: records from the first byte (a length that
    // spells the magic would be a 1.3 GB record, which never existed).
    while s.fill(1)? {
        if let Some((r, n)) = s.record_at(0)? {
            if let Record::Msg { seq, .. } = &r {
                out.max_seq = out.max_seq.max(*seq);
            }
            live.apply(&r);
            out.records += 1;
            s.advance(n);
            continue;
        }
        let (d, torn) = s.resync()?;
        if torn {
            tracing::warn!(
                "broker store {}: dropped an incomplete last record ({} bytes at offset {}): a write cut short by a crash",
                path.display(),
                d.len,
                d.offset
            );
            out.torn = d.len;
            break;
        }
        let end = d.offset + d.len;
        if recovery == Recovery::Strict {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!(
                    "{}: corrupt data at byte offset {} ({} bytes, up to {}); refused in strict recovery mode (salvage skips it and keeps the file aside)",
                    path.display(),
                    d.offset,
                    d.len,
                    if s.fill(1)? { format!("the next valid record at {end}") } else { "the end of the file".into() },
                ),
            ));
        }
        tracing::error!(
            "broker store {}: skipped corrupt bytes {}..{end} ({} bytes, {} records lost)",
            path.display(),
            d.offset,
            d.len,
            d.records
                .map_or_else(|| "an unknown number of".into(), |n| n.to_string())
        );
        out.damage.push(d);
    }
    out.peak = s.peak;
    Ok(out)
}

/// Reads a log through a window over the reader: memory is bounded by the
/// largest record (plus read-ahead), not by the file.
struct Scanner<R> {
    r: R,
    buf: Vec<u8>,
    /// The window is `buf[start..]`.
    start: usize,
    /// File offset of the window's first byte.
    pos: u64,
    eof: bool,
    /// Largest `buf` held.
    peak: usize,
}

impl<R: Read> Scanner<R> {
    fn new(r: R) -> Self {
        Self {
            r,
            buf: Vec::new(),
            start: 0,
            pos: 0,
            eof: false,
            peak: 0,
        }
    }

    fn window(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn advance(&mut self, n: usize) {
        let n = n.min(self.buf.len() - self.start);
        self.start += n;
        self.pos += n as u64;
    }

    /// Makes at least `n` bytes available in the window; false when the
    /// file ends before.
    fn fill(&mut self, n: usize) -> std::io::Result<bool> {
        while self.buf.len() - self.start < n {
            if self.eof {
                return Ok(false);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let have = self.buf.len();
            self.buf.resize(have + (n - have).max(READ_CHUNK), 0);
            let got = loop {
                match self.r.read(&mut self.buf[have..]) {
                    Ok(k) => break k,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.buf.truncate(have);
                        return Err(e);
                    }
                }
            };
            self.buf.truncate(have + got);
            self.eof = got == 0;
            self.peak = self.peak.max(self.buf.len());
        }
        Ok(true)
    }

    /// The body length in a record header at window offset `at`, if it is
    /// one a record can have.
    fn header_len(&mut self, at: usize) -> std::io::Result<Option<usize>> {
        if !self.fill(at + 8)? {
            return Ok(None);
        }
        let w = &self.window()[at..];
        let len = u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as usize;
        Ok((1..=MAX_RECORD).contains(&len).then_some(len))
    }

    /// The record at window offset `at` and its framed length, if there is
    /// a valid one: plausible length, matching CRC, and a body that decodes
    /// (which guards the resynchronisation against a CRC matching by chance).
    fn record_at(&mut self, at: usize) -> std::io::Result<Option<(Record, usize)>> {
        let Some(len) = self.header_len(at)? else {
            return Ok(None);
        };
        // The body's first fields rule out nearly every false start before
        // its length (up to `MAX_RECORD`) is read.
        let head = len.min(MSG_HEAD);
        if !self.fill(at + 8 + head)? || !prefix_ok(len, &self.window()[at + 8..at + 8 + head]) {
            return Ok(None);
        }
        if !self.fill(at + 8 + len)? {
            return Ok(None);
        }
        let w = &self.window()[at..at + 8 + len];
        let crc = u32::from_be_bytes([w[4], w[5], w[6], w[7]]);
        let body = &w[8..];
        if crc32fast::hash(body) != crc {
            return Ok(None);
        }
        Ok(parse(body).map(|r| (r, 8 + len)))
    }

    /// Called at a record that does not check: skips to the next valid
    /// record (left at the window's start) or the end of the file, and
    /// returns the range skipped and whether it is a torn tail.
    fn resync(&mut self) -> std::io::Result<(Damage, bool)> {
        let offset = self.pos;
        let first = self.header_len(0)?;
        // Where the bad record says it ends, first: usually only its body
        // was hit (a flipped bit, a bad sector), and this never mistakes
        // bytes inside its payload for records.
        if let Some(l) = first {
            if self.record_at(8 + l)?.is_some() {
                self.advance(8 + l);
                let d = Damage {
                    offset,
                    len: (8 + l) as u64,
                    records: Some(1),
                };
                return Ok((d, false));
            }
        }
        // The chain of lengths from the bad record: when it lands where the
        // next valid record is, the number of records lost is known.
        let mut chain = first.map(|l| (8 + l) as u64);
        let mut lost = 1;
        let mut zeros = true;
        loop {
            zeros &= self.window().first() == Some(&0);
            self.advance(1);
            let here = self.pos - offset;
            if !self.fill(1)? {
                // An incomplete last record, or the zeros a crash can leave
                // past the data, is what a crash mid-write leaves.
                let torn = here < 8 || first.is_some_and(|l| (8 + l) as u64 > here) || zeros;
                let records = if torn {
                    first.map(|_| 1)
                } else {
                    (chain == Some(here)).then_some(lost)
                };
                let d = Damage {
                    offset,
                    len: here,
                    records,
                };
                return Ok((d, torn));
            }
            if self.record_at(0)?.is_some() {
                let d = Damage {
                    offset,
                    len: here,
                    records: (chain == Some(here)).then_some(lost),
                };
                return Ok((d, false));
            }
            if chain == Some(here) {
                lost += 1;
                chain = self.header_len(0)?.map(|l| here + (8 + l) as u64);
            }
        }
    }
}

/// Bytes of a `Msg` body before its PUBLISH: tag, seq, expiry, length.
const MSG_HEAD: usize = 21;

/// Longest string in a record: client identifiers, topics and filters are
/// MQTT strings (the HTTP API and the MoQT bridge keep to that too).
const MAX_STR: usize = u16::MAX as usize;

/// Whether a body of `len` bytes starting with `head` (its first
/// `min(len, MSG_HEAD)` bytes) can be a record: a known tag and lengths that
/// add up. This rules out nearly every false start of a resynchronisation
/// before its body (up to [`MAX_RECORD`]) is read and checksummed.
fn prefix_ok(len: usize, head: &[u8]) -> bool {
    let u32_at = |i: usize| {
        head.get(i..i + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let Some(&tag) = head.first() else {
        return false;
    };
    if tag == 5 {
        // Tag, seq, expiry, then the PUBLISH's length: the rest of the body.
        return len >= MSG_HEAD && u32_at(17) == Some(len - MSG_HEAD);
    }
    // Every other record starts with a string after its tag.
    let Some(n) = u32_at(1).filter(|n| *n <= MAX_STR) else {
        return false;
    };
    let s = 5 + n;
    match tag {
        1 => len == s + 4,
        2 | 9 => len == s,
        7 | 8 => len == s + 8,
        10 => len == s + 11,
        // A second string, then options (3) or nothing (4).
        3 => (s + 10..=s + 10 + MAX_STR).contains(&len),
        4 => (s + 4..=s + 4 + MAX_STR).contains(&len),
        // seq, flags, then a list of u32.
        6 => len >= s + 13 && (len - s - 13) % 4 == 0,
        _ => false,
    }
}

fn frame(r: &Record, out: &mut BytesMut) {
    let start = out.len();
    out.put_u64(0);
    encode(r, out);
    let body_len = out.len() - start - 8;
    let crc = crc32fast::hash(&out[start + 8..]);
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
            assert!(prefix_ok(b.len(), &b[..b.len().min(MSG_HEAD)]), "{r:?}");
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
            let (store, rec) = Store::open(&dir, Fsync::Always, Recovery::Salvage).unwrap();
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
        let (_store, rec) = Store::open(&dir, Fsync::Always, Recovery::Salvage).unwrap();
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
        let (_a, _) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
        let e = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A log under construction, with the offset of every record.
    #[derive(Default)]
    struct Log {
        bytes: Vec<u8>,
        offsets: Vec<usize>,
    }

    impl Log {
        fn with_header() -> Self {
            Log {
                bytes: header().to_vec(),
                offsets: Vec::new(),
            }
        }

        fn push(&mut self, r: &Record) {
            let mut b = BytesMut::new();
            frame(r, &mut b);
            self.offsets.push(self.bytes.len());
            self.bytes.extend_from_slice(&b);
        }

        /// A retained message on `t/{i}`: two records.
        fn retained(&mut self, i: u64) {
            let topic = format!("t/{i}");
            self.push(&Record::Msg {
                seq: i + 1,
                expires: 0,
                publish: encode_message(&msg(&topic, b"payload")),
            });
            self.push(&Record::Retain {
                topic: topic.into(),
                seq: i + 1,
            });
        }

        fn write(&self, dir: &Path) {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("broker.log"), &self.bytes).unwrap();
        }
    }

    fn topics(rec: &Recovered) -> Vec<String> {
        let mut t: Vec<String> = rec
            .retained
            .iter()
            .map(|(_, m)| m.topic.to_string())
            .collect();
        t.sort();
        t
    }

    fn corrupt_files(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".corrupt-"))
            .collect()
    }

    #[tokio::test]
    async fn torn_tail_is_dropped_without_keeping_the_file() {
        for recovery in [Recovery::Salvage, Recovery::Strict] {
            let dir = tmpdir(&format!("torn-{recovery:?}"));
            let mut log = Log::with_header();
            for i in 0..3 {
                log.retained(i);
            }
            // The last record (t/2's Retain) lost its last 5 bytes.
            let last = log.offsets[5];
            let cut = log.bytes.len() - 5;
            log.bytes.truncate(cut);
            log.write(&dir);
            let (_s, rec) = Store::open(&dir, Fsync::Never, recovery).unwrap();
            assert_eq!(topics(&rec), ["t/0", "t/1"]);
            assert_eq!(rec.discarded, (cut - last) as u64);
            assert!(rec.damage.is_empty(), "{:?}", rec.damage);
            assert_eq!(rec.kept_aside, None);
            assert!(corrupt_files(&dir).is_empty());
            drop(_s);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[tokio::test]
    async fn garbage_in_the_middle_is_skipped_logged_and_kept_aside() {
        let dir = tmpdir("garbage");
        let mut log = Log::with_header();
        log.retained(0);
        log.retained(1);
        let at = log.bytes.len();
        log.bytes
            .extend_from_slice(b"this is no record, and neither is this");
        log.retained(2);
        log.retained(3);
        log.write(&dir);
        set_mode(&dir.join("broker.log"), 0o644);
        {
            let (_s, rec) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
            assert_eq!(topics(&rec), ["t/0", "t/1", "t/2", "t/3"]);
            assert_eq!(
                rec.damage,
                [Damage {
                    offset: at as u64,
                    len: 38,
                    records: None
                }]
            );
            let aside = rec.kept_aside.clone().unwrap();
            assert_eq!(corrupt_files(&dir), std::slice::from_ref(&aside));
            assert_eq!(std::fs::read(&aside).unwrap(), log.bytes);
            assert_eq!(mode(&aside), 0o600);
            // The log itself was rewritten clean.
            assert!(std::fs::read(dir.join("broker.log"))
                .unwrap()
                .starts_with(&MAGIC));
        }
        std::thread::sleep(Duration::from_millis(100));
        let (_s, rec) = Store::open(&dir, Fsync::Never, Recovery::Strict).unwrap();
        assert_eq!(topics(&rec), ["t/0", "t/1", "t/2", "t/3"]);
        assert!(rec.damage.is_empty());
        drop(_s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_bad_middle_record_loses_only_itself() {
        let mut log = Log::with_header();
        for i in 0..3 {
            log.retained(i);
        }
        // t/1's Retain: its CRC, then its length (the framing is lost).
        let (at, end) = (log.offsets[3], log.offsets[4]);
        for (name, byte, records) in [("crc", at + 5, Some(1)), ("len", at + 1, None)] {
            let dir = tmpdir(&format!("bad-{name}"));
            let mut bytes = log.bytes.clone();
            bytes[byte] ^= 0x40;
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("broker.log"), &bytes).unwrap();
            let (_s, rec) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
            assert_eq!(topics(&rec), ["t/0", "t/2"], "{name}");
            let d = Damage {
                offset: at as u64,
                len: (end - at) as u64,
                records,
            };
            assert_eq!(rec.damage, [d], "{name}");
            assert!(rec.kept_aside.is_some());
            drop(_s);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[tokio::test]
    async fn a_bad_last_record_is_corruption_not_a_torn_tail() {
        let dir = tmpdir("bad-last");
        let mut log = Log::with_header();
        log.retained(0);
        log.retained(1);
        let at = log.offsets[3];
        let n = log.bytes.len();
        log.bytes[n - 1] ^= 1;
        log.write(&dir);
        let (_s, rec) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
        assert_eq!(topics(&rec), ["t/0"]);
        assert_eq!(rec.discarded, 0);
        let d = Damage {
            offset: at as u64,
            len: (n - at) as u64,
            records: Some(1),
        };
        assert_eq!(rec.damage, [d]);
        drop(_s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn strict_refuses_corruption_naming_file_and_offset() {
        let dir = tmpdir("strict");
        let mut log = Log::with_header();
        log.retained(0);
        let at = log.bytes.len();
        log.bytes
            .extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
        log.retained(1);
        log.write(&dir);
        let e = Store::open(&dir, Fsync::Never, Recovery::Strict).unwrap_err();
        let text = e.to_string();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(text.contains("broker.log"), "{text}");
        assert!(text.contains(&format!("offset {at}")), "{text}");
        assert!(text.contains("strict"), "{text}");
        // Left as it was.
        assert_eq!(std::fs::read(dir.join("broker.log")).unwrap(), log.bytes);
        assert!(corrupt_files(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_version_is_refused() {
        let dir = tmpdir("version");
        let mut log = Log::default();
        log.bytes.extend_from_slice(&MAGIC);
        log.bytes.extend_from_slice(&2u16.to_be_bytes());
        log.retained(0);
        log.write(&dir);
        for recovery in [Recovery::Salvage, Recovery::Strict] {
            let e = Store::open(&dir, Fsync::Never, recovery).unwrap_err();
            assert!(e.to_string().contains("version 2"), "{e}");
            assert!(e.to_string().contains("broker.log"), "{e}");
            assert_eq!(std::fs::read(dir.join("broker.log")).unwrap(), log.bytes);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn legacy_headerless_log_is_read_and_rewritten_with_a_header() {
        let dir = tmpdir("legacy");
        let mut log = Log::default();
        log.retained(0);
        log.retained(1);
        log.write(&dir);
        set_mode(&dir.join("broker.log"), 0o644);
        {
            let (_s, rec) = Store::open(&dir, Fsync::Never, Recovery::Strict).unwrap();
            assert_eq!(mode(&dir.join("broker.log")), 0o600);
            assert_eq!(rec.version, 0);
            assert_eq!(topics(&rec), ["t/0", "t/1"]);
            assert!(rec.damage.is_empty());
            assert!(std::fs::read(dir.join("broker.log"))
                .unwrap()
                .starts_with(&header()));
        }
        std::thread::sleep(Duration::from_millis(100));
        let (_s, rec) = Store::open(&dir, Fsync::Never, Recovery::Strict).unwrap();
        assert_eq!(rec.version, VERSION);
        assert_eq!(topics(&rec), ["t/0", "t/1"]);
        drop(_s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn set_mode(p: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[tokio::test]
    async fn files_are_private() {
        let top = tmpdir("perm");
        let dir = top.join("a/b");
        let (_s, _) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
        assert_eq!(mode(&top), 0o700);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("broker.log")), 0o600);
        assert_eq!(mode(&dir.join("lock")), 0o600);
        drop(_s);
        let _ = std::fs::remove_dir_all(&top);
    }

    /// Hands out at most 1000 bytes per read.
    struct Trickle<R>(R);

    impl<R: Read> Read for Trickle<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(1000);
            self.0.read(&mut buf[..n])
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any damage to a log (bytes overwritten anywhere, a cut anywhere)
        /// is salvaged without panicking, keeps every record before the first
        /// damaged byte, and is reported unless it is a clean torn tail.
        #[test]
        fn any_damage_is_salvaged(
            records in 1u64..40,
            hits in proptest::collection::vec((0.0f64..1.0, proptest::collection::vec(proptest::prelude::any::<u8>(), 1..24)), 0..4),
            cut in proptest::option::of(0.0f64..1.0),
        ) {
            let mut log = Log::with_header();
            for i in 0..records {
                log.retained(i);
            }
            let body = log.bytes.len() - HEADER_LEN;
            let end = log.bytes.len();
            let mut first_damage = log.bytes.len();
            for (at, bytes) in &hits {
                let at = HEADER_LEN + ((*at * body as f64) as usize).min(body - 1);
                let end = (at + bytes.len()).min(log.bytes.len());
                if log.bytes[at..end] != bytes[..end - at] {
                    first_damage = first_damage.min(at);
                }
                log.bytes[at..end].copy_from_slice(&bytes[..end - at]);
            }
            if let Some(c) = cut {
                let at = HEADER_LEN + (c * body as f64) as usize;
                first_damage = first_damage.min(at);
                log.bytes.truncate(at);
            }
            let mut live = Live::default();
            let r = replay(
                std::io::Cursor::new(&log.bytes),
                Path::new("broker.log"),
                Recovery::Salvage,
                &mut live,
            )
            .unwrap();
            // Records wholly before the first damaged byte all come back.
            let intact = log
                .offsets
                .iter()
                .zip(log.offsets.iter().skip(1).chain(std::iter::once(&end)))
                .filter(|(_, &next)| next <= first_damage)
                .count() as u64;
            proptest::prop_assert!(r.records >= intact, "{} < {intact}", r.records);
        }
    }

    #[test]
    fn replay_streams_through_a_bounded_window() {
        let mut log = Log::with_header();
        for i in 0..20_000 {
            log.retained(i % 100);
        }
        // Damage far from the start, across read boundaries.
        let at = log.offsets[30_001] + 3;
        log.bytes[at..at + 50].fill(0xa5);
        let mut live = Live::default();
        let r = replay(
            Trickle(std::io::Cursor::new(&log.bytes)),
            Path::new("broker.log"),
            Recovery::Salvage,
            &mut live,
        )
        .unwrap();
        assert_eq!(r.records, 40_000 - 2);
        assert_eq!(r.damage.len(), 1);
        assert_eq!(live.retained.len(), 100);
        assert!(r.peak <= READ_CHUNK + 1000, "{}", r.peak);
        assert!(
            log.bytes.len() > 4 * r.peak,
            "{} {}",
            log.bytes.len(),
            r.peak
        );
    }

    #[test]
    fn resync_through_random_garbage_reads_ahead_only_a_window() {
        let mut log = Log::with_header();
        log.retained(0);
        // Random bytes: plenty of lengths a record could have.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..(4 << 20) / 8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            log.bytes.extend_from_slice(&x.to_le_bytes());
        }
        log.retained(1);
        let mut live = Live::default();
        let r = replay(
            std::io::Cursor::new(&log.bytes),
            Path::new("broker.log"),
            Recovery::Salvage,
            &mut live,
        )
        .unwrap();
        assert_eq!(r.records, 4);
        assert_eq!(r.damage.len(), 1);
        assert_eq!(r.damage[0].len, 4 << 20);
        // No false start made it read (and checksum) megabytes ahead.
        assert!(r.peak <= 2 * READ_CHUNK, "{}", r.peak);
    }

    #[tokio::test]
    async fn failed_writes_refuse_durable_tickets_until_a_retry_succeeds() {
        let dir = tmpdir("enospc");
        let c: Arc<str> = "dev".into();
        {
            let (store, _) = Store::open(&dir, Fsync::Always, Recovery::Salvage).unwrap();
            let mut synced = store.synced();
            // The write and the first retry fail; the second retry works.
            store.fail_next_writes(2);
            let t = store.append(Record::Session {
                client: c.clone(),
                expiry: 60,
            });
            tokio::time::timeout(Duration::from_secs(5), async {
                while !store.failed() {
                    synced.changed().await.unwrap();
                }
            })
            .await
            .unwrap();
            let seen = *synced.borrow_and_update();
            assert_eq!(store.durability(t, seen), Durability::Failed);
            // What needed no record is not refused.
            assert_eq!(store.durability(0, seen), Durability::Durable);
            tokio::time::timeout(Duration::from_secs(10), synced.wait_for(|v| *v >= t))
                .await
                .unwrap()
                .unwrap();
            assert!(!store.failed());
            assert_eq!(store.durability(t, *synced.borrow()), Durability::Durable);
            let t2 = store.append(Record::Sub {
                client: c.clone(),
                filter: "a".into(),
                options: SubOptions {
                    options: SubscriptionOptions::default(),
                    id: None,
                },
            });
            wait(&store, t2).await;
            assert!(!store.failed());
        }
        std::thread::sleep(Duration::from_millis(100));
        let (_s, rec) = Store::open(&dir, Fsync::Always, Recovery::Salvage).unwrap();
        // The record appended while writes failed was written by the retry.
        assert_eq!(rec.sessions[&c].expiry, 60);
        assert!(rec.sessions[&c].subscriptions.contains_key("a"));
        drop(_s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn recovery_parses() {
        assert_eq!("strict".parse(), Ok(Recovery::Strict));
        assert_eq!("salvage".parse(), Ok(Recovery::Salvage));
        assert!("lenient".parse::<Recovery>().is_err());
        assert_eq!(Recovery::default(), Recovery::Salvage);
    }
}
