//! MQTT across a cluster of relays.
//!
//! Each relay publishes every message its MQTT and HTTP clients publish on
//! one track of its own, `.quichub/mqtt/<node id>` / `messages`
//! (`quichub_relay::cluster::mqtt_namespace`), one object per message: the
//! message as an MQTT 5 PUBLISH packet (topic, QoS, RETAIN, properties and
//! the expiry left), so no new format is made up. Every other member
//! subscribes to that track over its MoQT session to the relay (one
//! upstream subscription per relay pair, however many MQTT subscribers),
//! and hands each message to its own broker as [`Source::Cluster`]: its
//! MQTT, HTTP and MoQT subscribers get it like a local message, a retained
//! one is retained there too, and it is never sent on to the cluster again
//! (no loops, one hop).
//!
//! What this is not: a shared session store. Persistent sessions and their
//! queues stay on the relay the client uses; a retained message reaches
//! the relays that are members when it is published (one that joins later
//! does not get the older ones). Between relays the messages travel on
//! MoQT streams: reliable while the session lasts, and lost if a relay
//! dies with messages in flight (QoS is end to end per relay, not across
//! the cluster). Messages that MoQT publishers put under `mqtt` stay on
//! their relay.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use moqt::data::ObjectStatus;
use moqt::{FullTrackName, Location};
use quichub_mqtt::packet::{Packet, Publish, Version};
use quichub_mqtt::QoS;
use quichub_relay::object::{Object, TrackEvent};
use quichub_relay::sink::SinkFilter;
use quichub_relay::track::Track;
use quichub_relay::Relay;
use tokio::sync::{broadcast, mpsc, watch};

use crate::broker::{Broker, Message, Source};

/// How long a member's track is waited for (its session may be coming up).
const RENDEZVOUS: Duration = Duration::from_secs(5);
/// The wait before subscribing again to a member whose track ended.
const RETRY: Duration = Duration::from_secs(1);
/// Largest message accepted from another relay (a peer controls it).
const MAX_PACKET: usize = 1 << 20;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ClusterMetrics {
    /// Messages sent to the other relays (on this relay's track).
    pub sent: AtomicU64,
    /// Messages received from other relays.
    pub received: AtomicU64,
    /// Objects from other relays that were not a valid PUBLISH.
    pub malformed: AtomicU64,
}

/// The link of one relay's broker to the cluster ([`start`]).
pub struct Link {
    track: Arc<Track>,
    next_group: Mutex<u64>,
    /// Counters.
    pub metrics: Arc<ClusterMetrics>,
}

impl Link {
    /// The link's lines of `/metrics`.
    pub fn render_metrics(&self) -> String {
        let m = &self.metrics;
        format!(
            "# HELP quichub_cluster_mqtt_messages_total MQTT messages sent to and received from the other relays.\n\
             # TYPE quichub_cluster_mqtt_messages_total counter\n\
             quichub_cluster_mqtt_messages_total{{direction=\"sent\"}} {}\n\
             quichub_cluster_mqtt_messages_total{{direction=\"received\"}} {}\n\
             # HELP quichub_cluster_mqtt_malformed_total Objects from other relays that were not one MQTT 5 PUBLISH.\n\
             # TYPE quichub_cluster_mqtt_malformed_total counter\n\
             quichub_cluster_mqtt_malformed_total {}\n",
            m.sent.load(Relaxed),
            m.received.load(Relaxed),
            m.malformed.load(Relaxed),
        )
    }

    /// Sends `m` to the other relays, unless it came from one.
    fn send(&self, m: &Message) {
        if matches!(m.source, Source::Cluster | Source::Store | Source::Sys) {
            return;
        }
        let now = Instant::now();
        if m.expired(now) {
            return;
        }
        let mut properties = m.properties.clone();
        properties.message_expiry_interval = m
            .expires
            .map(|e| e.saturating_duration_since(now).as_secs().max(1) as u32);
        let packet = Packet::Publish(Publish {
            dup: false,
            qos: m.qos,
            retain: m.retain,
            topic: m.topic.to_string(),
            packet_id: (m.qos != QoS::AtMostOnce).then_some(1),
            properties,
            payload: m.payload.clone(),
        });
        let mut buf = BytesMut::new();
        if let Err(e) = quichub_mqtt::packet::encode(&packet, Version::V5, &mut buf) {
            tracing::warn!(topic = %m.topic, "cluster: message not sent on: {e}");
            return;
        }
        let group = {
            let mut g = self.next_group.lock().expect("cluster group");
            *g += 1;
            *g - 1
        };
        self.track.publish(Object {
            group,
            subgroup: Some(0),
            object_id: 0,
            priority: 128,
            properties: Bytes::new(),
            status: ObjectStatus::Normal,
            payload: buf.freeze(),
            end_of_group: true,
            received: now,
            datagram: Default::default(),
        });
        self.track.subgroup_end(group, 0, true);
        self.metrics.sent.fetch_add(1, Relaxed);
    }
}

/// Links `broker` (on `relay`, member `me` of a cluster) to the other
/// members: publishes its clients' messages on this relay's cluster track,
/// and brings in those of every member in `others` (their ids) while it is
/// one. Needs a tokio runtime.
pub fn start(
    relay: Arc<Relay>,
    broker: &Arc<Broker>,
    bridge: &crate::bridge::Bridge,
    me: &str,
    mut others: watch::Receiver<BTreeSet<String>>,
) -> Result<Arc<Link>, quichub_relay::core::Refusal> {
    let name = FullTrackName {
        namespace: quichub_relay::cluster::mqtt_namespace(me),
        name: quichub_relay::cluster::MQTT_TRACK.into(),
    };
    let track = Arc::new(relay.new_track(name));
    relay.publish_track(track.clone())?;
    // Groups go on from the clock, so a relay restarted soon after does not
    // reuse the group numbers its peers' caches still hold.
    let first = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let link = Arc::new(Link {
        track,
        next_group: Mutex::new(first),
        metrics: Arc::default(),
    });
    let weak = Arc::downgrade(&link);
    bridge.set_cluster_tap(Arc::new(move |m: &Arc<Message>| {
        if let Some(l) = weak.upgrade() {
            l.send(m);
        }
    }));
    let (broker, metrics) = (Arc::downgrade(broker), link.metrics.clone());
    tokio::spawn(async move {
        let mut links: HashMap<String, watch::Sender<bool>> = HashMap::new();
        loop {
            let now = others.borrow_and_update().clone();
            links.retain(|id, stop| {
                let keep = now.contains(id);
                if !keep {
                    stop.send_replace(true);
                }
                keep
            });
            for id in now {
                if links.contains_key(&id) {
                    continue;
                }
                let (stop, rx) = watch::channel(false);
                tokio::spawn(receive(
                    relay.clone(),
                    broker.clone(),
                    metrics.clone(),
                    id.clone(),
                    rx,
                ));
                links.insert(id, stop);
            }
            if others.changed().await.is_err() {
                break;
            }
        }
        for (_, stop) in links {
            stop.send_replace(true);
        }
    });
    Ok(link)
}

/// Brings member `id`'s messages into the broker until `stop`.
async fn receive(
    relay: Arc<Relay>,
    broker: Weak<Broker>,
    metrics: Arc<ClusterMetrics>,
    id: String,
    mut stop: watch::Receiver<bool>,
) {
    let name = FullTrackName {
        namespace: quichub_relay::cluster::mqtt_namespace(&id),
        name: quichub_relay::cluster::MQTT_TRACK.into(),
    };
    while !*stop.borrow() {
        // Stream objects only: datagrams are not used on this track.
        let (tx, _datagrams) = mpsc::channel(1);
        let acquired = tokio::select! {
            a = relay.acquire_local(&name, RENDEZVOUS, tx) => a,
            _ = stop.changed() => return,
        };
        let (entry, mut joined) = match acquired {
            Ok(a) => a,
            Err(r) => {
                tracing::debug!(member = %id, "cluster: MQTT track not there yet: {}", r.reason);
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        joined.sink.sink().activate(
            SinkFilter {
                forward: true,
                start: Location::new(0, 0),
                end_group: None,
                object_timeout: None,
            },
            &Default::default(),
        );
        tracing::info!(member = %id, "cluster: receiving the member's MQTT messages");
        loop {
            tokio::select! {
                ev = joined.rx.recv() => match ev {
                    Ok(TrackEvent::Object(o)) => {
                        let Some(b) = broker.upgrade() else { return };
                        match decode(&o.payload) {
                            Some(m) => {
                                metrics.received.fetch_add(1, Relaxed);
                                b.publish(m);
                            }
                            None => {
                                metrics.malformed.fetch_add(1, Relaxed);
                            }
                        }
                    }
                    Ok(TrackEvent::SubgroupEnd { .. }) => {}
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(member = %id, "cluster: {n} MQTT messages from the member lost (this relay fell behind)");
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = joined.ended.wait_for(|e| e.is_some()) => break,
                _ = stop.changed() => break,
            }
        }
        drop(joined);
        relay.release_local(&entry);
        if !*stop.borrow() {
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// A message from another relay's object: an MQTT 5 PUBLISH, alone.
fn decode(payload: &Bytes) -> Option<Message> {
    let mut buf = BytesMut::from(&payload[..]);
    match quichub_mqtt::packet::decode(&mut buf, Some(Version::V5), MAX_PACKET) {
        Ok(Some(Packet::Publish(p))) if buf.is_empty() && !p.topic.is_empty() => {
            let now = Instant::now();
            Some(
                Message::new(&p.topic, p.payload, p.qos, p.retain, Source::Cluster)
                    .with_properties(&p.properties, now),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let relay = Relay::new(quichub_relay::Config::default());
        let track = Arc::new(relay.new_track(FullTrackName::new("x", "y")));
        let link = Link {
            track: track.clone(),
            next_group: Mutex::new(0),
            metrics: Arc::default(),
        };
        let (tx, _d) = mpsc::channel(1);
        let mut joined = track.join_local(tx);
        let mut m = Message::new(
            "a/b",
            Bytes::from_static(b"hi"),
            QoS::AtLeastOnce,
            true,
            Source::Http,
        );
        m.properties.content_type = Some("text/plain".into());
        m.expires = Some(Instant::now() + Duration::from_secs(60));
        link.send(&m);
        // From the cluster: never sent on.
        link.send(&Message::new(
            "a/b",
            Bytes::new(),
            QoS::AtMostOnce,
            false,
            Source::Cluster,
        ));
        assert_eq!(link.metrics.sent.load(Relaxed), 1);
        let Ok(TrackEvent::Object(o)) = joined.rx.try_recv() else {
            panic!("no object")
        };
        let got = decode(&o.payload).expect("a PUBLISH");
        assert_eq!(&*got.topic, "a/b");
        assert_eq!(got.payload, "hi");
        assert_eq!((got.qos, got.retain), (QoS::AtLeastOnce, true));
        assert_eq!(got.source, Source::Cluster);
        assert_eq!(got.properties.content_type.as_deref(), Some("text/plain"));
        assert!(got.expires.is_some());
        assert!(decode(&Bytes::from_static(b"\x30\x05\x00")).is_none());
        let mut two = o.payload.to_vec();
        two.extend_from_slice(&o.payload);
        assert!(decode(&Bytes::from(two)).is_none(), "one packet per object");
    }
}
