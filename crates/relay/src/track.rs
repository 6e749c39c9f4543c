//! Per-track state: the fan-out ring, the cache of recent groups, the largest
//! Location, and what the publisher told us about the track.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use moqt::{FullTrackName, GroupOrder, KeyValue, Location};
use tokio::sync::{broadcast, mpsc, watch};

use crate::config::Config;
use crate::fanout::{Fanout, ShardSinks, ShardWait, ShardWake};
use crate::metrics::Metrics;
use crate::object::{Object, TrackEvent};
use crate::sink::{DatagramSink, SinkTarget};
use quichub_net::Session;

/// What a track's fan-out ring carries (objects are shared, never copied).
pub type Event = TrackEvent;

/// Cached objects of one group.
#[derive(Debug)]
struct CachedGroup {
    id: u64,
    objects: Vec<Arc<Object>>,
    bytes: usize,
    first_received: Instant,
}

/// Most bytes of Track Properties the relay accepts for a track. It forwards
/// them in SUBSCRIBE_OK, PUBLISH and TRACK_STATUS_OK beside names and
/// parameters, and every control message must fit in 65535 bytes.
pub const MAX_TRACK_PROPERTIES: usize = 16 * 1024;

/// Whether a set of Track Properties fits [`MAX_TRACK_PROPERTIES`].
pub(crate) fn properties_fit(properties: &[KeyValue]) -> bool {
    moqt::coding::kvps_len(properties) <= MAX_TRACK_PROPERTIES
}

/// How long a track's FETCHes stop asking an upstream that refused one (or
/// did not answer in time): they get the cache at once meanwhile.
pub const FETCH_REFUSAL_MEMORY: std::time::Duration = std::time::Duration::from_secs(30);

/// The DYNAMIC_GROUPS Track Property: 1 when the publisher starts a new
/// group on NEW_GROUP_REQUEST.
pub const DYNAMIC_GROUPS: u64 = 0x30;

/// Publisher-side facts about a track.
#[derive(Debug, Clone)]
pub struct TrackInfo {
    /// DEFAULT_PUBLISHER_PRIORITY.
    pub default_priority: u8,
    /// DEFAULT_PUBLISHER_GROUP_ORDER.
    pub group_order: GroupOrder,
    /// Track Properties to forward unchanged.
    pub properties: Vec<KeyValue>,
}

impl Default for TrackInfo {
    fn default() -> Self {
        Self {
            default_priority: 128,
            group_order: GroupOrder::Ascending,
            properties: Vec::new(),
        }
    }
}

impl TrackInfo {
    /// Reads the relay-relevant Track Properties.
    pub(crate) fn from_properties(properties: Vec<KeyValue>) -> Self {
        let mut info = TrackInfo::default();
        for kv in &properties {
            if let moqt::KvValue::Int(v) = kv.value {
                match kv.kind {
                    0x0E if v <= 255 => info.default_priority = v as u8,
                    0x22 if v == 2 => info.group_order = GroupOrder::Descending,
                    _ => {}
                }
            }
        }
        info.properties = properties;
        info
    }
}

#[derive(Debug, Default)]
struct Inner {
    largest: Option<Location>,
    sinks: Vec<Arc<DatagramSink>>,
    cache: VecDeque<CachedGroup>,
    cache_bytes: usize,
    info: TrackInfo,
    rate: RateMeter,
    /// The first group the relay saw whole from its start (`None`: from
    /// group 0): earlier objects, and groups evicted from the cache, are
    /// unknown here and a FETCH asks upstream for them
    /// ([`Track::complete_from`]).
    complete_from: Option<u64>,
    /// Whether `complete_from` was set from the upstream's Largest Object.
    complete_from_set: bool,
    /// The last NEW_GROUP_REQUEST sent upstream and the largest group when
    /// it was: outstanding until the largest group grows past that.
    new_group_sent: Option<(u64, Option<u64>)>,
    /// A NEW_GROUP_REQUEST for the upstream SUBSCRIBE not sent yet.
    new_group_pending: Option<u64>,
}

/// Counts a track's objects and bytes per whole second, for
/// [`Track::stats`]: the counts of the last complete second.
#[derive(Debug, Default)]
struct RateMeter {
    /// The second (since the track's first object) being counted, plus one
    /// (0: nothing counted yet).
    second: u64,
    objects: u64,
    bytes: u64,
    /// Counts of the second before `second` (zero when it had none).
    last_objects: u64,
    last_bytes: u64,
    /// Totals since the track was created.
    total_objects: u64,
    total_bytes: u64,
}

impl RateMeter {
    /// Rolls the buckets forward to `second` (1-based).
    fn roll(&mut self, second: u64) {
        if second != self.second {
            if second == self.second + 1 {
                self.last_objects = self.objects;
                self.last_bytes = self.bytes;
            } else {
                self.last_objects = 0;
                self.last_bytes = 0;
            }
            self.objects = 0;
            self.bytes = 0;
            self.second = second;
        }
    }

    fn add(&mut self, second: u64, bytes: u64) {
        self.roll(second);
        self.objects += 1;
        self.bytes += bytes;
        self.total_objects += 1;
        self.total_bytes += bytes;
    }
}

/// What a track did lately, for dashboards ([`Track::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrackStats {
    /// Objects received in the last complete second.
    pub objects_per_sec: u64,
    /// Payload bytes received in the last complete second.
    pub bytes_per_sec: u64,
    /// Objects received since the track was created.
    pub objects: u64,
    /// Payload bytes received since the track was created.
    pub bytes: u64,
    /// Largest Location seen.
    pub largest: Option<Location>,
}

/// Keeps a subscriber's [`DatagramSink`] registered with its track.
#[derive(Debug)]
pub struct SinkGuard {
    track: Arc<Track>,
    sink: Arc<DatagramSink>,
}

impl SinkGuard {
    /// The sink.
    pub fn sink(&self) -> &DatagramSink {
        &self.sink
    }
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        self.track.remove_sink(&self.sink);
    }
}

/// Why a track's upstream ended, for PUBLISH_DONE downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// PUBLISH_DONE status code.
    pub status: u64,
}

/// One track at the relay.
#[derive(Debug)]
pub struct Track {
    /// Full name.
    pub name: FullTrackName,
    /// Relay-wide unique id, also the Track Alias used downstream.
    pub id: u64,
    tx: broadcast::Sender<TrackEvent>,
    inner: Mutex<Inner>,
    ended: watch::Sender<Option<Ended>>,
    publisher: AtomicU64,
    /// Until when a FETCH does not ask this track's upstream (it refused
    /// or did not answer lately).
    fetch_refused_until: Mutex<Option<Instant>>,
    /// NEW_GROUP_REQUEST values for the upstream subscription to send
    /// ([`Track::request_new_group`]).
    new_group: watch::Sender<Option<u64>>,
    /// After its upstream moved to another relay: objects of groups below
    /// this (plus one; 0: none) mean the new publisher numbers groups anew.
    group_floor: AtomicU64,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    /// When the track was created: the origin of its rate meter's seconds.
    created: Instant,
    /// Upstream data streams: (opened, finished). PUBLISH_DONE's Stream
    /// Count is checked against these before the track ends, so streams
    /// still in flight when it arrives are not cut off.
    streams: watch::Sender<(u64, u64)>,
    /// With several endpoint shards: the datagram subscribers of each shard
    /// (empty otherwise; see [`crate::fanout`]).
    shard_sinks: Vec<Arc<ShardSinks>>,
    /// With several endpoint shards: what each shard's stream subscribers
    /// wait on.
    shard_wakes: Vec<Arc<ShardWake>>,
    fanout: Option<Arc<Fanout>>,
}

/// Counts one upstream data stream of a track as open until dropped.
pub struct UpstreamStream {
    streams: watch::Sender<(u64, u64)>,
}

impl Drop for UpstreamStream {
    fn drop(&mut self) {
        self.streams.send_modify(|(_, finished)| *finished += 1);
    }
}

/// A subscriber's view of a track at the moment it joined.
pub struct Joined {
    /// The subscriber's datagram path (removed from the track when dropped).
    pub sink: SinkGuard,
    /// Events from now on.
    pub rx: broadcast::Receiver<TrackEvent>,
    /// On an endpoint shard: wait for events with this (woken by the
    /// shard's own thread) rather than with `rx.recv()`.
    pub wait: Option<ShardWait>,
    /// Largest Location when it joined (the Joining Location).
    pub largest: Option<Location>,
    /// Track facts.
    pub info: TrackInfo,
    /// Resolves when the upstream ends.
    pub ended: watch::Receiver<Option<Ended>>,
}

impl Track {
    /// Creates a track.
    pub fn new(name: FullTrackName, id: u64, config: Arc<Config>, metrics: Arc<Metrics>) -> Self {
        let (tx, _) = broadcast::channel(config.fanout_buffer.max(16));
        let (ended, _) = watch::channel(None);
        Self {
            name,
            id,
            tx,
            inner: Mutex::new(Inner::default()),
            ended,
            publisher: AtomicU64::new(0),
            new_group: watch::channel(None).0,
            fetch_refused_until: Mutex::new(None),
            group_floor: AtomicU64::new(0),
            config,
            metrics,
            created: Instant::now(),
            streams: watch::channel((0, 0)).0,
            shard_sinks: Vec::new(),
            shard_wakes: Vec::new(),
            fanout: None,
        }
    }

    /// Groups the track's datagram subscribers by endpoint shard and hands
    /// objects to other shards through `fanout` (a no-op before the fan-out
    /// was started).
    pub(crate) fn with_fanout(mut self, fanout: Arc<Fanout>) -> Self {
        let shards = fanout.shards();
        if shards > 1 {
            self.shard_sinks = (0..shards).map(|_| Arc::default()).collect();
            self.shard_wakes = (0..shards).map(|_| Arc::default()).collect();
            self.fanout = Some(fanout);
        }
        self
    }

    /// Counts an upstream subgroup stream as open until the returned guard
    /// is dropped.
    pub(crate) fn upstream_stream(&self) -> UpstreamStream {
        self.streams.send_modify(|(opened, _)| *opened += 1);
        UpstreamStream {
            streams: self.streams.clone(),
        }
    }

    /// Waits, at most `grace`, until the upstream has opened `stream_count`
    /// data streams (PUBLISH_DONE's Stream Count) and every one it opened
    /// has been read to its end. Returns whether they all came.
    pub(crate) async fn upstream_settled(
        &self,
        stream_count: u64,
        grace: std::time::Duration,
    ) -> bool {
        let mut rx = self.streams.subscribe();
        let settled =
            rx.wait_for(|&(opened, finished)| opened >= stream_count && finished >= opened);
        // Bound to a local: the future borrows `rx`, which must outlive it.
        let done = matches!(tokio::time::timeout(grace, settled).await, Ok(Ok(_)));
        done
    }

    /// Objects and bytes received: totals, and the counts of the last
    /// complete second (zero when no object came in that second).
    pub fn stats(&self) -> TrackStats {
        let second = self.created.elapsed().as_secs() + 1;
        let mut g = self.inner.lock().expect("track lock");
        g.rate.roll(second);
        TrackStats {
            objects_per_sec: g.rate.last_objects,
            bytes_per_sec: g.rate.last_bytes,
            objects: g.rate.total_objects,
            bytes: g.rate.total_bytes,
            largest: g.largest,
        }
    }

    /// Sets what the publisher said about the track (SUBSCRIBE_OK or PUBLISH).
    pub(crate) fn set_info(&self, info: TrackInfo, largest: Option<Location>) {
        let mut g = self.inner.lock().expect("track lock");
        g.info = info;
        // The first upstream's Largest Object: the objects of its group after
        // it come here (the group is partial), earlier ones do not. An
        // upstream that replaces a lost one leaves what fell between them
        // unknown; that gap is not tracked.
        if !g.complete_from_set {
            g.complete_from_set = true;
            let from = largest.map(|l| l.group.saturating_add(1));
            g.complete_from = g.complete_from.max(from);
        }
        if largest > g.largest {
            g.largest = largest;
        }
    }

    /// Its upstream moves to another relay: groups below the largest so far
    /// end the track rather than go out (see [`Track::publish`]).
    pub(crate) fn expect_groups_from_largest(&self) {
        if let Some(l) = self.largest() {
            self.group_floor.store(l.group + 1, Relaxed);
        }
    }

    /// A subscriber sent NEW_GROUP_REQUEST `value` (the largest group it
    /// knows plus one; 0: none). Passes it upstream (draft-18, "NEW GROUP REQUEST Parameter") when
    /// it asks for a group after the largest, the track supports dynamic
    /// groups (`established`: known from its properties; before the
    /// upstream answered, the SUBSCRIBE carries it regardless), and no
    /// request with a value as large is outstanding. `true`: passed.
    pub(crate) fn request_new_group(&self, value: u64, established: bool) -> bool {
        let mut g = self.inner.lock().expect("track lock");
        let largest = g.largest.map(|l| l.group);
        if value != 0 && largest.is_some_and(|l| value <= l) {
            return false;
        }
        let dynamic = g
            .info
            .properties
            .iter()
            .any(|kv| kv.kind == DYNAMIC_GROUPS && kv.value == moqt::KvValue::Int(1));
        if established && !dynamic {
            return false;
        }
        if let Some((sent, at)) = g.new_group_sent {
            let outstanding = largest <= at;
            if outstanding && sent >= value {
                return false;
            }
        }
        g.new_group_sent = Some((value, largest));
        if established {
            self.new_group.send_replace(Some(value));
        } else {
            g.new_group_pending = Some(value);
        }
        true
    }

    /// The upstream refused a FETCH, or did not answer it in time.
    pub(crate) fn note_fetch_refused(&self) {
        *self.fetch_refused_until.lock().expect("refused") =
            Some(Instant::now() + FETCH_REFUSAL_MEMORY);
    }

    /// Whether the upstream refused a FETCH lately ([`FETCH_REFUSAL_MEMORY`]).
    pub(crate) fn fetch_refused_lately(&self) -> bool {
        self.fetch_refused_until
            .lock()
            .expect("refused")
            .is_some_and(|t| Instant::now() < t)
    }

    /// The NEW_GROUP_REQUEST the upstream SUBSCRIBE is to carry, if any.
    pub(crate) fn take_new_group_for_subscribe(&self) -> Option<u64> {
        self.inner
            .lock()
            .expect("track lock")
            .new_group_pending
            .take()
    }

    /// The upstream answered the SUBSCRIBE that carried NEW_GROUP_REQUEST
    /// `value`: it is outstanding until the group grows past the largest
    /// the answer gave.
    pub(crate) fn new_group_sent_upstream(&self, value: u64) {
        let mut g = self.inner.lock().expect("track lock");
        g.new_group_sent = Some((value, g.largest.map(|l| l.group)));
    }

    /// The NEW_GROUP_REQUEST values to send upstream by REQUEST_UPDATE, as
    /// they come.
    pub(crate) fn new_group_requests(&self) -> watch::Receiver<Option<u64>> {
        self.new_group.subscribe()
    }

    /// Records which session feeds the track.
    pub(crate) fn set_publisher_session(&self, id: u64) {
        self.publisher.store(id, Relaxed);
    }

    /// The session feeding the track, once known.
    pub(crate) fn publisher_session(&self) -> Option<u64> {
        match self.publisher.load(Relaxed) {
            0 => None,
            id => Some(id),
        }
    }

    /// Track facts.
    pub(crate) fn info(&self) -> TrackInfo {
        self.inner.lock().expect("track lock").info.clone()
    }

    /// Largest Location seen.
    pub fn largest(&self) -> Option<Location> {
        self.inner.lock().expect("track lock").largest
    }

    /// Joins the fan-out for `session`: the receiver, the datagram sink and the
    /// largest Location are taken under one lock so no object falls between them.
    pub fn join(self: &Arc<Self>, session: &Session) -> Joined {
        self.join_target(SinkTarget::Session {
            session: session.clone(),
            alias: self.id,
        })
    }

    /// Joins the fan-out for an in-process consumer: datagram objects arrive on
    /// `tx` (dropped when it is full), stream objects on the returned receiver.
    pub fn join_local(self: &Arc<Self>, tx: mpsc::Sender<Arc<Object>>) -> Joined {
        self.join_target(SinkTarget::Local(tx))
    }

    fn join_target(self: &Arc<Self>, target: SinkTarget) -> Joined {
        let mut g = self.inner.lock().expect("track lock");
        let sink = Arc::new(DatagramSink::with_target(target));
        // A session's sink joins its shard's group (sent by that shard's
        // thread); an in-process consumer's joins the publisher's loop.
        let shard = match sink.is_session() {
            true => quichub_net::shard::current().filter(|k| *k < self.shard_sinks.len()),
            false => None,
        };
        match shard {
            Some(k) => self.shard_sinks[k].push(sink.clone()),
            None => g.sinks.push(sink.clone()),
        }
        let wait = shard.map(|k| self.shard_wakes[k].join());
        Joined {
            sink: SinkGuard {
                track: self.clone(),
                sink,
            },
            rx: self.tx.subscribe(),
            wait,
            largest: g.largest,
            info: g.info.clone(),
            ended: self.ended.subscribe(),
        }
    }

    /// Number of live receivers.
    pub fn receivers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// Accepts an object from upstream: caches it and fans it out.
    pub fn publish(&self, object: Object) {
        // Groups from a new upstream that go back below what subscribers
        // already had would be filtered out downstream: the track ends
        // (PUBLISH_DONE) and subscribers subscribe again.
        let floor = self.group_floor.load(Relaxed);
        if floor != 0 && object.group + 1 < floor {
            if !self.is_ended() {
                tracing::info!(track = %self.name, group = object.group, "new upstream numbers groups below the old one's: track ended");
                self.end(moqt::error::publish_done::TRACK_ENDED);
            }
            return;
        }
        self.metrics.objects_in.fetch_add(1, Relaxed);
        self.metrics
            .bytes_in
            .fetch_add(object.payload.len() as u64, Relaxed);
        let object = Arc::new(object);
        let mut g = self.inner.lock().expect("track lock");
        let loc = object.location();
        let second = object
            .received
            .saturating_duration_since(self.created)
            .as_secs()
            + 1;
        g.rate.add(second, object.payload.len() as u64);
        if g.largest.is_none_or(|l| loc > l) {
            g.largest = Some(loc);
        }
        self.cache_insert(&mut g, object.clone());
        // Sent under the lock so `join` sees a consistent (largest, receiver) pair.
        if object.subgroup.is_none() {
            let bytes = object.payload.len() as u64;
            let now = Instant::now();
            let mut sent = g
                .sinks
                .iter()
                .filter(|s| s.offer(&object, now, &self.metrics))
                .count() as u64;
            if let Some(fanout) = &self.fanout {
                let here = quichub_net::shard::current();
                for (k, group) in self.shard_sinks.iter().enumerate() {
                    if group.len() == 0 {
                        continue;
                    }
                    if here == Some(k) {
                        sent += group.offer(&object, now, &self.metrics);
                    } else if fanout.hand_off(k, group, &object) {
                        self.metrics.shard_handoffs.fetch_add(1, Relaxed);
                    } else {
                        self.metrics
                            .drops_datagram
                            .fetch_add(group.len() as u64, Relaxed);
                    }
                }
            }
            self.metrics.objects_out.fetch_add(sent, Relaxed);
            self.metrics.bytes_out.fetch_add(sent * bytes, Relaxed);
        } else {
            let _ = self.tx.send(TrackEvent::Object(object));
            self.wake_shards();
        }
    }

    /// Tells the stream subscribers on every shard that the ring has new
    /// events: directly on this thread's shard, through the worker (once
    /// per pending wake-up) on the others.
    fn wake_shards(&self) {
        let Some(fanout) = &self.fanout else {
            return;
        };
        let here = quichub_net::shard::current();
        for (k, w) in self.shard_wakes.iter().enumerate() {
            if w.receivers() == 0 {
                continue;
            }
            if here == Some(k) {
                w.wake();
            } else if fanout.wake(k, w) {
                self.metrics.shard_wakeups.fetch_add(1, Relaxed);
            }
        }
    }

    fn remove_sink(&self, sink: &Arc<DatagramSink>) {
        self.inner
            .lock()
            .expect("track lock")
            .sinks
            .retain(|s| !Arc::ptr_eq(s, sink));
        for group in &self.shard_sinks {
            group.remove(sink);
        }
    }

    /// Forwards the end of an upstream subgroup stream.
    pub fn subgroup_end(&self, group: u64, subgroup: u64, fin: bool) {
        let _g = self.inner.lock().expect("track lock");
        let _ = self.tx.send(TrackEvent::SubgroupEnd {
            group,
            subgroup,
            fin,
        });
        self.wake_shards();
    }

    /// Marks the upstream as ended; subscribers send PUBLISH_DONE.
    pub fn end(&self, status: u64) {
        self.ended.send_replace(Some(Ended { status }));
    }

    /// Whether the upstream ended.
    pub fn is_ended(&self) -> bool {
        self.ended.borrow().is_some()
    }

    fn cache_insert(&self, g: &mut Inner, object: Arc<Object>) {
        let size = object.cache_size();
        let now = object.received;
        let group = object.group;
        // Objects almost always belong to the newest group or start a newer
        // one: decide from the back before searching (a track of one-object
        // groups, as the MQTT bridge makes, would otherwise scan its whole
        // cache on every object).
        let newest = g.cache.back().map(|c| c.id);
        let existing = match newest {
            Some(id) if id == group => g.cache.back_mut(),
            Some(id) if id < group => None,
            None => None,
            Some(_) => g.cache.iter_mut().rev().find(|c| c.id == group),
        };
        match existing {
            Some(c) => {
                c.objects.push(object);
                c.bytes += size;
            }
            None => {
                // Keep groups ordered by id; a late old group goes in its place.
                let pos = g
                    .cache
                    .iter()
                    .rposition(|c| c.id < group)
                    .map_or(0, |p| p + 1);
                g.cache.insert(
                    pos,
                    CachedGroup {
                        id: group,
                        objects: vec![object],
                        bytes: size,
                        first_received: now,
                    },
                );
            }
        }
        g.cache_bytes += size;
        self.metrics.cache_bytes.fetch_add(size as i64, Relaxed);
        let max_age = self.config.cache_max_age();
        while g.cache.len() > 1 {
            let front = &g.cache[0];
            let too_big = g.cache_bytes > self.config.cache_bytes_per_track
                || self.metrics.cache_bytes.load(Relaxed) > self.config.cache_bytes_total as i64;
            let too_old = now.saturating_duration_since(front.first_received) > max_age;
            if !(too_big || too_old) {
                break;
            }
            let gone = g.cache.pop_front().expect("len > 1");
            g.complete_from = g.complete_from.max(Some(gone.id.saturating_add(1)));
            g.cache_bytes -= gone.bytes;
            self.metrics
                .cache_bytes
                .fetch_sub(gone.bytes as i64, Relaxed);
        }
    }

    /// The first group from which the cache holds everything the relay
    /// received (0 when it holds the whole track): groups below it were
    /// before the relay subscribed, or left the cache (evicted, or older than
    /// `cache_max_age_ms`).
    pub fn complete_from(&self) -> u64 {
        let g = self.inner.lock().expect("track lock");
        let now = Instant::now();
        let max_age = self.config.cache_max_age();
        let stale = g
            .cache
            .iter()
            .take_while(|c| now.saturating_duration_since(c.first_received) > max_age)
            .last()
            .map(|c| c.id.saturating_add(1));
        g.complete_from.max(stale).unwrap_or(0)
    }

    /// Cached objects with `start <= location <= end`, in FETCH order (groups
    /// ascending or descending, objects ascending within a group).
    pub fn cached_range(
        &self,
        start: Location,
        end: Location,
        descending: bool,
    ) -> Vec<Arc<Object>> {
        let g = self.inner.lock().expect("track lock");
        let max_age = self.config.cache_max_age();
        let now = Instant::now();
        let mut groups: Vec<Vec<Arc<Object>>> = g
            .cache
            .iter()
            .filter(|c| c.id >= start.group && c.id <= end.group)
            .map(|c| {
                let mut v: Vec<Arc<Object>> = c
                    .objects
                    .iter()
                    .filter(|o| {
                        let l = o.location();
                        l >= start
                            && l <= end
                            && now.saturating_duration_since(o.received) <= max_age
                    })
                    .cloned()
                    .collect();
                v.sort_by_key(|o| o.object_id);
                v.dedup_by_key(|o| o.object_id);
                v
            })
            .collect();
        if descending {
            groups.reverse();
        }
        groups.into_iter().flatten().collect()
    }

    /// Drops the cache (when the track is removed).
    pub(crate) fn clear_cache(&self) {
        let mut g = self.inner.lock().expect("track lock");
        self.metrics
            .cache_bytes
            .fetch_sub(g.cache_bytes as i64, Relaxed);
        g.cache.clear();
        g.cache_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_upstream_numbering_groups_anew_ends_the_track() {
        let t = Track::new(
            FullTrackName::new("a", "b"),
            1,
            Arc::new(Config::default()),
            Arc::new(Metrics::default()),
        );
        let obj = |group| Object {
            group,
            subgroup: Some(0),
            object_id: 0,
            priority: 128,
            properties: Bytes::new(),
            status: moqt::data::ObjectStatus::Normal,
            payload: Bytes::from_static(b"x"),
            end_of_group: false,
            received: Instant::now(),
            datagram: Default::default(),
        };
        t.publish(obj(7));
        t.expect_groups_from_largest();
        // The same group and later ones go on.
        t.publish(obj(7));
        t.publish(obj(8));
        assert!(!t.is_ended());
        assert_eq!(t.largest().map(|l| l.group), Some(8));
        // Below: ended, not published.
        t.publish(obj(0));
        assert!(t.is_ended());
        assert_eq!(t.largest().map(|l| l.group), Some(8));
    }

    use bytes::Bytes;
    use moqt::data::{ObjectDatagram, ObjectStatus};

    fn obj(group: u64, id: u64, len: usize) -> Object {
        Object {
            group,
            subgroup: Some(0),
            object_id: id,
            priority: 0,
            properties: Bytes::new(),
            status: ObjectStatus::Normal,
            payload: Bytes::from(vec![0u8; len]),
            end_of_group: false,
            received: Instant::now(),
            datagram: Default::default(),
        }
    }

    /// Objects are counted per whole second since the track was created;
    /// `stats` reports the last complete second (zero after a silent one).
    #[test]
    fn stats_count_the_last_complete_second() {
        let t = track(Config::default());
        let at = |secs_ms: u64, id: u64| {
            let mut o = obj(0, id, 10);
            o.received = t.created + std::time::Duration::from_millis(secs_ms);
            o
        };
        for i in 0..5 {
            t.publish(at(100 + i, i));
        }
        let mut g = t.inner.lock().unwrap();
        // Still in the first second: nothing complete yet.
        g.rate.roll(1);
        assert_eq!((g.rate.last_objects, g.rate.total_objects), (0, 5));
        // The second second: the first one (5 objects, 50 bytes) is complete.
        g.rate.roll(2);
        assert_eq!((g.rate.last_objects, g.rate.last_bytes), (5, 50));
        // A silent second in between: zero.
        g.rate.roll(4);
        assert_eq!(g.rate.last_objects, 0);
        drop(g);
        let s = t.stats();
        assert_eq!((s.objects, s.bytes), (5, 50));
        assert_eq!(s.largest, Some(Location::new(0, 4)));
    }

    fn track(cfg: Config) -> Track {
        Track::new(
            FullTrackName::new("a", "b"),
            1,
            Arc::new(cfg),
            Arc::default(),
        )
    }

    #[test]
    fn cache_serves_ranges_in_order() {
        let t = track(Config::default());
        for g in 0..3 {
            for o in 0..4 {
                t.publish(obj(g, o, 10));
            }
        }
        let v = t.cached_range(Location::new(1, 2), Location::new(2, 1), false);
        let locs: Vec<_> = v.iter().map(|o| (o.group, o.object_id)).collect();
        assert_eq!(locs, [(1, 2), (1, 3), (2, 0), (2, 1)]);
        let v = t.cached_range(Location::new(0, 0), Location::new(2, 0), true);
        assert_eq!(v[0].group, 2);
        assert_eq!(t.largest(), Some(Location::new(2, 3)));
    }

    #[test]
    fn late_objects_join_their_group_and_late_groups_their_place() {
        let t = track(Config::default());
        t.publish(obj(5, 0, 10));
        t.publish(obj(7, 0, 10));
        t.publish(obj(5, 1, 10)); // an older group, not the newest
        t.publish(obj(6, 0, 10)); // a late group between two cached ones
        t.publish(obj(7, 1, 10)); // the newest again
        let v = t.cached_range(Location::new(0, 0), Location::new(9, 9), false);
        let locs: Vec<_> = v.iter().map(|o| (o.group, o.object_id)).collect();
        assert_eq!(locs, [(5, 0), (5, 1), (6, 0), (7, 0), (7, 1)]);
        let groups: Vec<_> = t.inner.lock().unwrap().cache.iter().map(|c| c.id).collect();
        assert_eq!(groups, [5, 6, 7]);
    }

    #[test]
    fn cache_is_bounded_in_bytes() {
        let t = track(Config {
            cache_bytes_per_track: 1000,
            ..Config::default()
        });
        for g in 0..100 {
            t.publish(obj(g, 0, 200));
        }
        let inner = t.inner.lock().unwrap();
        assert!(inner.cache_bytes <= 1000 + 248, "{}", inner.cache_bytes);
        assert_eq!(inner.cache.back().unwrap().id, 99);
    }

    #[test]
    fn joiners_see_every_later_object() {
        let t = track(Config::default());
        t.publish(obj(0, 0, 1));
        let mut rx = t.tx.subscribe();
        assert_eq!(t.largest(), Some(Location::new(0, 0)));
        t.publish(obj(0, 1, 1));
        match rx.try_recv().unwrap() {
            TrackEvent::Object(o) => assert_eq!(o.object_id, 1),
            _ => panic!(),
        }
    }

    #[test]
    fn framed_datagram_is_encoded_once_for_one_header() {
        let s = obj(3, 0, 5);
        let plain = s.datagram(7);
        let a = s.framed_datagram(7, &[0x00]).unwrap();
        assert_eq!((a[0], &a[1..]), (0x00, &plain[..]));
        let b = s.framed_datagram(7, &[0x00]).unwrap();
        assert_eq!(a.as_ptr(), b.as_ptr(), "shared, not encoded again");
        // Another header (another CONNECT stream ID) falls back to the session.
        assert!(s.framed_datagram(7, &[0x01]).is_none());
        assert!(s.framed_datagram(7, &[0x40, 0x00]).is_none());
    }

    #[test]
    fn shared_datagram_encoding_roundtrips() {
        let s = obj(3, 0, 5);
        let b = s.datagram(7);
        let d = ObjectDatagram::decode(&b).unwrap();
        assert_eq!(
            (d.track_alias, d.group, d.object_id, d.payload.len()),
            (7, 3, 0, 5)
        );
    }
}
