//! The MoQT side of the gateway, on the relay's routing core.
//!
//! - MQTT and HTTP messages become objects: the first message on a topic
//!   publishes its track (see [`crate::mapping`]) in the relay as if a MoQT
//!   publisher had sent PUBLISH, and each message is one group of one object
//!   (the subgroup ends right after it). MoQT subscribers SUBSCRIBE, FETCH or
//!   SUBSCRIBE_TRACKS (`mqtt`) as for any track; the relay's cache keeps the
//!   recent messages.
//! - Tracks that MoQT sessions PUBLISH under (`mqtt`, ...) are tapped: every
//!   object becomes a message on the mapped topic, QoS 1 for objects on
//!   streams (reliable) and QoS 0 for datagrams, never retained.
//!
//! A track idle for [`IDLE_TRACK`] with no subscriber is withdrawn.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use moqt::data::ObjectStatus;
use moqt::Location;
use quichub_mqtt::QoS;
use quichub_relay::core::TrackEntry;
use quichub_relay::object::{Object, TrackEvent};
use quichub_relay::sink::SinkFilter;
use quichub_relay::Relay;
use tokio::sync::{broadcast, mpsc};

use crate::broker::{Broker, Message, Source};
use crate::mapping;

/// A gateway track with no message and no subscriber for this long is withdrawn.
pub const IDLE_TRACK: Duration = Duration::from_secs(600);

/// After the relay refuses a topic's track (track limit, or a MoQT session
/// already publishes it), the gateway does not ask again for this long.
const REFUSAL_BACKOFF: Duration = Duration::from_secs(5);

/// Datagram objects waiting for the tap task of one track.
const TAP_QUEUE: usize = 1024;

enum Slot {
    Live {
        entry: Arc<TrackEntry>,
        next_group: u64,
        last_used: Instant,
    },
    Refused(Instant),
}

/// Joins a [`Broker`] and a [`Relay`].
pub struct Bridge {
    relay: Arc<Relay>,
    broker: Weak<Broker>,
    slots: Mutex<HashMap<Arc<str>, Slot>>,
    /// Ids of the tracks the gateway publishes (never tapped back).
    own: Mutex<HashSet<u64>>,
    /// Where messages also go in a cluster of relays ([`crate::cluster`]).
    cluster_tap: std::sync::OnceLock<crate::broker::Tap>,
}

impl Bridge {
    /// Connects `broker` to `relay` and starts the tap of MoQT-published
    /// tracks and the idle sweep; the broker's messages reach MoQT once
    /// [`Bridge::route`] is registered with [`Broker::set_route`]. Needs a
    /// tokio runtime.
    pub fn start(relay: Arc<Relay>, broker: &Arc<Broker>) -> Arc<Bridge> {
        let bridge = Arc::new(Bridge {
            relay,
            broker: Arc::downgrade(broker),
            slots: Mutex::default(),
            own: Mutex::default(),
            cluster_tap: Default::default(),
        });
        tokio::spawn(watch_tracks(bridge.clone()));
        let b = Arc::downgrade(&bridge);
        tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_secs(10));
            loop {
                t.tick().await;
                match b.upgrade() {
                    Some(b) => b.sweep(Instant::now()),
                    None => return,
                }
            }
        });
        bridge
    }

    /// The broker's route into MoQT (and the cluster link): each message
    /// becomes the next object of its topic's track. Echo is kept out here,
    /// both ways: a message that came from MoQT is not published back (its
    /// object is there already), and the gateway's own tracks are never
    /// tapped back into the broker (`own`, see `watch_tracks`).
    pub fn route(self: &Arc<Self>) -> crate::broker::Tap {
        let b = Arc::downgrade(self);
        Arc::new(move |m: &Arc<Message>| {
            if m.source == Source::Moqt {
                return;
            }
            if let Some(b) = b.upgrade() {
                b.publish(m);
                if let Some(c) = b.cluster_tap.get() {
                    c(m);
                }
            }
        })
    }

    /// Also hands every message the broker routes (not those from MoQT
    /// publishers) to `tap`: the cluster link. Set once.
    pub(crate) fn set_cluster_tap(&self, tap: crate::broker::Tap) {
        let _ = self.cluster_tap.set(tap);
    }

    /// Publishes `m` as the next group of its topic's track.
    fn publish(&self, m: &Arc<Message>) {
        let now = Instant::now();
        let (track, group) = {
            let mut slots = self.slots.lock().expect("bridge lock");
            match slots.get_mut(&m.topic) {
                Some(Slot::Live {
                    entry,
                    next_group,
                    last_used,
                }) if !entry.track.is_ended() => {
                    *last_used = now;
                    *next_group += 1;
                    (entry.track.clone(), *next_group - 1)
                }
                Some(Slot::Refused(at)) if now.duration_since(*at) < REFUSAL_BACKOFF => return,
                _ => {
                    let Some(name) = mapping::topic_to_track(&m.topic) else {
                        return;
                    };
                    let track = Arc::new(self.relay.new_track(name));
                    self.own.lock().expect("bridge own").insert(track.id);
                    match self.relay.publish_track(track.clone()) {
                        Ok(entry) => {
                            let first = SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .map_or(0, |d| d.as_millis() as u64);
                            slots.insert(
                                m.topic.clone(),
                                Slot::Live {
                                    entry,
                                    next_group: first + 1,
                                    last_used: now,
                                },
                            );
                            (track, first)
                        }
                        Err(r) => {
                            self.own.lock().expect("bridge own").remove(&track.id);
                            tracing::debug!(topic = %m.topic, "no MoQT track for topic: {}", r.reason);
                            slots.insert(m.topic.clone(), Slot::Refused(now));
                            return;
                        }
                    }
                }
            }
        };
        track.publish(Object {
            group,
            subgroup: Some(0),
            object_id: 0,
            priority: 128,
            properties: Bytes::new(),
            status: ObjectStatus::Normal,
            payload: m.payload.clone(),
            end_of_group: true,
            received: now,
            datagram: Default::default(),
        });
        track.subgroup_end(group, 0, true);
    }

    /// The payloads of the last `n` messages of `topic` still in the relay's
    /// cache, oldest first: what HTTP's `X-History-Length` replays. Reads
    /// the gateway's own track of the topic, or the MoQT-published one. The
    /// cache bounds it (per-track bytes and age, see the relay config), and
    /// so does the mapping: a topic with no track has no history.
    pub fn history(&self, topic: &str, n: usize) -> Vec<Bytes> {
        if n == 0 {
            return Vec::new();
        }
        let own = match self.slots.lock().expect("bridge lock").get(topic) {
            Some(Slot::Live { entry, .. }) => Some(entry.track.clone()),
            _ => None,
        };
        let track = match own {
            Some(t) => t,
            None => {
                let Some(name) = mapping::topic_to_track(topic) else {
                    return Vec::new();
                };
                match self.relay.find_track(&name) {
                    Some(e) => e.track.clone(),
                    None => return Vec::new(),
                }
            }
        };
        let objects = track.cached_range(
            Location::new(0, 0),
            Location::new(u64::MAX, u64::MAX),
            false,
        );
        let mut last: Vec<Bytes> = objects
            .iter()
            .rev()
            .filter(|o| o.status == ObjectStatus::Normal)
            .take(n)
            .map(|o| o.payload.clone())
            .collect();
        last.reverse();
        last
    }

    fn sweep(&self, now: Instant) {
        let mut gone = Vec::new();
        self.slots
            .lock()
            .expect("bridge lock")
            .retain(|_, s| match s {
                Slot::Live {
                    entry, last_used, ..
                } => {
                    let idle = now.duration_since(*last_used) > IDLE_TRACK
                        && entry.subscribers.load(Relaxed) == 0;
                    if idle || entry.track.is_ended() {
                        gone.push(entry.clone());
                        false
                    } else {
                        true
                    }
                }
                Slot::Refused(at) => now.duration_since(*at) < REFUSAL_BACKOFF,
            });
        for e in gone {
            self.own.lock().expect("bridge own").remove(&e.track.id);
            // PUBLISH_DONE status "Track Ended".
            self.relay.unpublish_track(&e, 0x2);
        }
    }
}

/// Follows every track published under `mqtt` and taps the foreign ones.
async fn watch_tracks(bridge: Arc<Bridge>) {
    let id = bridge.relay.next_id();
    let (existing, mut rx) = bridge.relay.subscribe_tracks(id, mapping::root());
    let weak = Arc::downgrade(&bridge);
    drop(bridge);
    let tap_one = |entry: Arc<TrackEntry>| {
        let Some(b) = weak.upgrade() else { return };
        if b.own.lock().expect("bridge own").contains(&entry.track.id) {
            return;
        }
        let Some(topic) = mapping::track_to_topic(&entry.track.name) else {
            return;
        };
        tokio::spawn(tap(b.broker.clone(), entry, topic));
    };
    for e in existing {
        tap_one(e);
    }
    while let Some(e) = rx.recv().await {
        tap_one(e);
    }
}

/// Turns one MoQT-published track's objects into MQTT messages.
async fn tap(broker: Weak<Broker>, entry: Arc<TrackEntry>, topic: String) {
    let (tx, mut datagrams) = mpsc::channel(TAP_QUEUE);
    let mut joined = entry.track.join_local(tx);
    joined.sink.sink().activate(
        SinkFilter {
            forward: true,
            start: Location::new(0, 0),
            end_group: None,
            object_timeout: None,
        },
        &Default::default(),
    );
    let topic: Arc<str> = topic.into();
    let emit = |o: &Object, qos: QoS| {
        if o.status != ObjectStatus::Normal {
            return false;
        }
        let Some(b) = broker.upgrade() else {
            return true;
        };
        b.publish(Message {
            topic: topic.clone(),
            payload: o.payload.clone(),
            qos,
            retain: false,
            properties: Default::default(),
            expires: None,
            source: Source::Moqt,
        });
        false
    };
    loop {
        tokio::select! {
            ev = joined.rx.recv() => match ev {
                Ok(TrackEvent::Object(o)) => {
                    if emit(&o, QoS::AtLeastOnce) {
                        return;
                    }
                }
                Ok(TrackEvent::SubgroupEnd { .. }) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(%topic, "bridge tap lagged by {n} objects");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            Some(o) = datagrams.recv() => {
                if emit(&o, QoS::AtMostOnce) {
                    return;
                }
            }
            _ = joined.ended.wait_for(|e| e.is_some()) => return,
        }
    }
}
