//! Delivery of one subscription's objects to one session: subgroups on QUIC
//! streams, datagram objects as QUIC datagrams, in the spec's priority order,
//! with delivery timeouts, and without ever blocking the publisher or the
//! other subscribers (the fan-out ring drops for a subscriber that lags).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use moqt::data::{ObjectStatus, SubgroupHeader, SubgroupId, SubgroupObject};
use moqt::error::{publish_done, reset};
use moqt::{GroupOrder, Location};
use quichub_net::{SendStream, Session};
use tokio::sync::{broadcast, watch, Notify};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::object::{Object, TrackEvent};
use crate::sink::SinkFilter;
use crate::track::{Joined, Track};

/// What the subscriber asked for; updated by REQUEST_UPDATE.
#[derive(Debug, Clone)]
pub struct Settings {
    /// SUBSCRIBER_PRIORITY (lower is more urgent).
    pub subscriber_priority: u8,
    /// Group order for scheduling.
    pub group_order: GroupOrder,
    /// First Location that passes.
    pub start: Location,
    /// Last group that passes, if any.
    pub end_group: Option<u64>,
    /// Forward State.
    pub forward: bool,
    /// OBJECT_DELIVERY_TIMEOUT.
    pub object_timeout: Option<Duration>,
    /// SUBGROUP_DELIVERY_TIMEOUT.
    pub subgroup_timeout: Option<Duration>,
}

/// How a subscription ended, for PUBLISH_DONE.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    /// PUBLISH_DONE status.
    pub status: u64,
    /// Data streams opened.
    pub stream_count: u64,
}

struct OpenSubgroup {
    stream: SendStream,
    prev: Option<u64>,
    opened: Instant,
}

pub use moqt::priority::stream_priority;

/// Forwards `joined` to `session` until the track ends, the filter's end is
/// reached, the subscriber falls too far behind, or the session closes.
pub struct Forwarder {
    session: Session,
    settings: watch::Receiver<Settings>,
    metrics: Arc<Metrics>,
    config: Arc<Config>,
    streams: HashMap<(u64, u64), OpenSubgroup>,
    /// Subgroups we reset (gap or timeout): later objects of them are dropped,
    /// as the next object can no longer be proven to be the next in the subgroup.
    broken: Vec<(u64, u64)>,
    /// Subgroups given up because writes stalled: later objects of them are
    /// skipped and count towards the subscriber's lag.
    stalled: Vec<(u64, u64)>,
    stream_count: u64,
    lagged: u64,
    header: BytesMut,
    /// Signalled when the subscriber lost the right to read the track.
    revoked: Option<Arc<Notify>>,
    /// When the token that admitted the subscription expires.
    expires: Option<std::time::SystemTime>,
    /// Objects to send before the track's own events ([`Self::replaying`]).
    replay: Vec<Arc<Object>>,
    /// The last of them: the track's objects up to it in its group came
    /// with them, and are skipped.
    replayed_to: Option<Location>,
    /// The Track Alias written in subgroup headers (the track's id, unless
    /// [`Self::with_alias`]).
    alias: u64,
}

impl Forwarder {
    /// Prepares a forwarder.
    pub fn new(
        session: Session,
        track: Arc<Track>,
        settings: watch::Receiver<Settings>,
        metrics: Arc<Metrics>,
        config: Arc<Config>,
    ) -> Self {
        let alias = track.id;
        Self {
            session,
            settings,
            metrics,
            config,
            streams: HashMap::new(),
            broken: Vec::new(),
            stalled: Vec::new(),
            stream_count: 0,
            lagged: 0,
            header: BytesMut::with_capacity(64),
            revoked: None,
            expires: None,
            replay: Vec::new(),
            replayed_to: None,
            alias,
        }
    }

    /// Writes `alias` as the Track Alias of this subscription's streams,
    /// for a subscriber told so in its SUBSCRIBE_OK (one of
    /// `moqt::deviation::Dialect::aliases_by_request_id`; datagrams keep
    /// the track's id, shared by every subscriber).
    pub fn with_alias(mut self, alias: u64) -> Self {
        self.alias = alias;
        self
    }

    /// Sends `objects` (of the track's cache, in order) first, and skips
    /// the track's events up to the last of them: a subscriber that reads
    /// only whole groups gets the group under way from its start
    /// (`moqt::deviation::Deviation::CurrentGroupFromStart`). The track
    /// must have been joined before `objects` were taken from its cache, so
    /// that nothing falls between them.
    pub fn replaying(mut self, objects: Vec<Arc<Object>>) -> Self {
        self.replayed_to = objects.last().map(|o| o.location());
        self.replay = objects;
        self
    }

    /// True for an object of the track that [`Self::replaying`] already
    /// sent.
    fn replayed(&self, o: &Object) -> bool {
        self.replayed_to
            .is_some_and(|l| o.group == l.group && o.object_id <= l.object)
    }

    /// Ends the subscription with PUBLISH_DONE UNAUTHORIZED at `expires`,
    /// its open data streams reset with EXPIRED_AUTH_TOKEN: the
    /// subscription was admitted by a token of its own (not the session's,
    /// whose expiry ends the whole session) that is no longer valid then.
    /// (Draft 18 has no PUBLISH_DONE code for an expired token;
    /// UNAUTHORIZED is "no longer authorized to subscribe".)
    pub fn expiring(mut self, expires: Option<std::time::SystemTime>) -> Self {
        self.expires = expires;
        self
    }

    /// Ends the subscription with PUBLISH_DONE UNAUTHORIZED, its open data
    /// streams reset, when `revoked` is signalled (a reload of the auth took
    /// the right to read the track).
    pub fn revocable(mut self, revoked: Arc<Notify>) -> Self {
        self.revoked = Some(revoked);
        self
    }

    /// Runs until done; returns the PUBLISH_DONE to send.
    pub async fn run(mut self, joined: Joined) -> Done {
        let Joined {
            mut rx,
            wait,
            mut ended,
            sink,
            ..
        } = joined;
        // Datagram objects reach the subscriber through its sink, straight from
        // the publisher's task; this task handles subgroup streams.
        sink.sink().activate(self.sink_filter(), &self.metrics);
        let revoked = self.revoked.clone();
        let revoked = async {
            match &revoked {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(revoked);
        let expires = self.expires;
        let expiry = async move {
            match expires {
                Some(at) => {
                    let left = at
                        .duration_since(std::time::SystemTime::now())
                        .unwrap_or_default();
                    tokio::time::sleep(left).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        let mut first = None;
        for o in std::mem::take(&mut self.replay) {
            if let Some(status) = self.on_object(&o).await {
                first = Some(status);
                break;
            }
        }
        let status = match first {
            Some(status) => status,
            None => loop {
                tokio::select! {
                    biased;
                    ev = async {
                        match &wait {
                            Some(w) => w.recv(&mut rx).await,
                            None => rx.recv().await,
                        }
                    } => match ev {
                        Ok(TrackEvent::Object(o)) if self.replayed(&o) => {}
                        Ok(TrackEvent::Object(o)) => {
                            if let Some(status) = self.on_object(&o).await {
                                break status;
                            }
                        }
                        Ok(TrackEvent::SubgroupEnd { group, subgroup, fin }) => {
                            self.end_subgroup(group, subgroup, fin);
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            self.metrics.drops_lagged.fetch_add(n, Relaxed);
                            self.lagged += n;
                            // A gap: no open stream can be continued safely, and
                            // the rest of those subgroups counts as lost too.
                            let keys: Vec<_> = self.streams.keys().copied().collect();
                            for k in keys {
                                self.reset_one(k, reset::TOO_FAR_BEHIND);
                                self.broken.retain(|b| *b != k);
                                self.stalled.push(k);
                            }
                            if self.lagged > self.config.max_lag_objects {
                                break publish_done::TOO_FAR_BEHIND;
                            }
                        }
                        Err(broadcast::error::RecvError::Closed) => break publish_done::TRACK_ENDED,
                    },
                    r = ended.changed() => {
                        if r.is_err() || ended.borrow().is_some() {
                            // Deliver what is already queued, then end.
                            let status = ended.borrow().map(|e| e.status).unwrap_or(publish_done::TRACK_ENDED);
                            while let Ok(ev) = rx.try_recv() {
                                match ev {
                                    TrackEvent::Object(o) if self.replayed(&o) => {}
                                    TrackEvent::Object(o) => { self.on_object(&o).await; }
                                    TrackEvent::SubgroupEnd { group, subgroup, fin } => self.end_subgroup(group, subgroup, fin),
                                }
                            }
                            break status;
                        }
                    }
                    r = self.settings.changed() => {
                        if r.is_err() {
                            break publish_done::SUBSCRIPTION_ENDED;
                        }
                        sink.sink().activate(self.sink_filter(), &self.metrics);
                        if !self.settings.borrow().forward {
                            self.reset_all(reset::CANCELLED);
                        }
                    }
                    _ = self.session.closed() => break publish_done::GOING_AWAY,
                    () = &mut revoked => {
                        // Nothing more of the track may reach the subscriber,
                        // not even what is already queued on open streams.
                        self.reset_all(reset::CANCELLED);
                        break publish_done::UNAUTHORIZED;
                    }
                    () = &mut expiry => {
                        self.metrics.subscriptions_expired.fetch_add(1, Relaxed);
                        self.reset_all(reset::EXPIRED_AUTH_TOKEN);
                        break publish_done::UNAUTHORIZED;
                    }
                }
            },
        };
        self.finish_all();
        Done {
            status,
            stream_count: self.stream_count,
        }
    }

    fn sink_filter(&self) -> SinkFilter {
        let s = self.settings.borrow();
        SinkFilter {
            forward: s.forward,
            start: s.start,
            end_group: s.end_group,
            object_timeout: s.object_timeout,
        }
    }

    /// Handles one object; `Some(status)` ends the subscription.
    async fn on_object(&mut self, o: &Arc<Object>) -> Option<u64> {
        let s = self.settings.borrow().clone();
        if let Some(end) = s.end_group {
            if o.group > end {
                return Some(publish_done::SUBSCRIPTION_ENDED);
            }
        }
        if o.location() < s.start || !s.forward {
            return None;
        }
        if let Some(t) = s.object_timeout {
            if o.received.elapsed() > t {
                self.metrics.drops_timeout.fetch_add(1, Relaxed);
                if let Some(sg) = o.subgroup {
                    self.reset_one((o.group, sg), reset::DELIVERY_TIMEOUT);
                }
                return None;
            }
        }
        // Datagram objects go through the subscriber's sink, not the ring.
        if let Some(sg) = o.subgroup {
            if self.send_subgroup_object(o, sg, &s).await {
                return Some(publish_done::TOO_FAR_BEHIND);
            }
        }
        let last_of_group = o.group == s.end_group.unwrap_or(u64::MAX)
            && matches!(
                o.status,
                ObjectStatus::EndOfGroup | ObjectStatus::EndOfTrack
            );
        last_of_group.then_some(publish_done::SUBSCRIPTION_ENDED)
    }

    /// Writes one subgroup object; `true` when the subscriber has now lost
    /// more than `max_lag_objects` and must be ended with TOO_FAR_BEHIND.
    async fn send_subgroup_object(&mut self, o: &Object, sg: u64, s: &Settings) -> bool {
        let key = (o.group, sg);
        if self.stalled.contains(&key) {
            // Skipped because the subscriber stopped reading this subgroup.
            self.metrics.drops_lagged.fetch_add(1, Relaxed);
            self.lagged += 1;
            return self.lagged > self.config.max_lag_objects;
        }
        if self.broken.contains(&key) {
            self.metrics.drops_lagged.fetch_add(1, Relaxed);
            return false;
        }
        if let (Some(t), Some(open)) = (s.subgroup_timeout, self.streams.get(&key)) {
            if open.opened.elapsed() > t {
                self.metrics.drops_timeout.fetch_add(1, Relaxed);
                self.reset_one(key, reset::DELIVERY_TIMEOUT);
                return false;
            }
        }
        if !self.streams.contains_key(&key) {
            let Ok(mut stream) = self.session.open_uni().await else {
                return false;
            };
            let _ = stream.set_priority(stream_priority(
                s.subscriber_priority,
                o.priority,
                o.group,
                s.group_order,
            ));
            self.header.clear();
            SubgroupHeader {
                track_alias: self.alias,
                group: o.group,
                subgroup: if sg == 0 {
                    SubgroupId::Zero
                } else {
                    SubgroupId::Explicit(sg)
                },
                priority: Some(o.priority),
                has_properties: true,
                end_of_group: false,
                first_object: false,
            }
            .encode(&mut self.header);
            self.stream_count += 1;
            self.streams.insert(
                key,
                OpenSubgroup {
                    stream,
                    prev: None,
                    opened: Instant::now(),
                },
            );
            // Cap open streams: the oldest group's streams are finished.
            if self.streams.len() > 64 {
                if let Some(oldest) = self.streams.keys().min().copied() {
                    if oldest != key {
                        self.end_subgroup(oldest.0, oldest.1, true);
                    }
                }
            }
        }
        let open = self.streams.get_mut(&key).expect("inserted");
        let obj = SubgroupObject {
            object_id: o.object_id,
            properties: o.properties.clone(),
            status: o.status,
            payload: bytes::Bytes::new(),
        };
        // The header and object fields go in one write; the payload follows as
        // its own chunk so its bytes are shared, not copied, per subscriber.
        if obj
            .encode_header_with_len(&mut self.header, open.prev, true, o.payload.len())
            .is_err()
        {
            // Not the next object of this subgroup: the stream cannot continue.
            self.reset_one(key, reset::INTERNAL_ERROR);
            return false;
        }
        let head = self.header.split().freeze();
        let stall = Duration::from_millis(self.config.write_stall_ms);
        let write = async {
            open.stream.write_chunk(head).await.is_ok()
                && (o.payload.is_empty()
                    || open.stream.write_chunk(o.payload.clone()).await.is_ok())
        };
        match tokio::time::timeout(stall, write).await {
            Ok(true) => {}
            Ok(false) => {
                // STOP_SENDING from the subscriber, or the session is gone.
                self.streams.remove(&key);
                self.broken.push(key);
                return false;
            }
            Err(_) => {
                // The subscriber is not reading: give up this subgroup so the
                // forwarder goes back to the ring; what it skips counts as lag.
                self.metrics.drops_lagged.fetch_add(1, Relaxed);
                self.reset_one(key, reset::TOO_FAR_BEHIND);
                self.stalled.push(key);
                if self.stalled.len() > 256 {
                    self.stalled.remove(0);
                }
                self.lagged += 1;
                return self.lagged > self.config.max_lag_objects;
            }
        }
        let open = self.streams.get_mut(&key).expect("still open");
        open.prev = Some(o.object_id);
        self.metrics.objects_out.fetch_add(1, Relaxed);
        self.metrics
            .bytes_out
            .fetch_add(o.payload.len() as u64, Relaxed);
        if matches!(
            o.status,
            ObjectStatus::EndOfGroup | ObjectStatus::EndOfTrack
        ) {
            self.end_subgroup(o.group, sg, true);
        }
        false
    }

    fn end_subgroup(&mut self, group: u64, subgroup: u64, fin: bool) {
        if let Some(mut open) = self.streams.remove(&(group, subgroup)) {
            if fin {
                let _ = open.stream.finish();
            } else {
                let _ = open.stream.reset(reset::CANCELLED);
                self.metrics.streams_reset.fetch_add(1, Relaxed);
            }
        }
        self.broken.retain(|k| *k != (group, subgroup));
    }

    fn reset_one(&mut self, key: (u64, u64), code: u32) {
        if let Some(mut open) = self.streams.remove(&key) {
            let _ = open.stream.reset(code);
            self.metrics.streams_reset.fetch_add(1, Relaxed);
        }
        if !self.broken.contains(&key) {
            self.broken.push(key);
            if self.broken.len() > 256 {
                self.broken.remove(0);
            }
        }
    }

    fn reset_all(&mut self, code: u32) {
        let keys: Vec<_> = self.streams.keys().copied().collect();
        for k in keys {
            self.reset_one(k, code);
        }
    }

    fn finish_all(&mut self) {
        for (_, mut open) in self.streams.drain() {
            let _ = open.stream.finish();
        }
    }
}
