//! The MQTT routing state: sessions, subscriptions, shared subscriptions,
//! retained messages, offline queues and wills. Every protocol's publishes
//! enter through [`Broker::publish`]; subscribers of every protocol receive
//! [`Delivery`]s on a bounded channel that is never awaited under the lock.
//!
//! The state sits behind one `std::sync::Mutex`, held only for map updates and
//! non-blocking channel sends, never across an `.await`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quichub_mqtt::reason;
use quichub_mqtt::topic::{self, TopicTree};
use quichub_mqtt::{Properties, QoS, SubscriptionOptions};
use tokio::sync::{mpsc, watch};

pub use crate::metrics::{BrokerMetrics, DropReason, Transport};
use crate::store::{Record, Recovered, Store};
use crate::sys::{Snapshot, Sys};

/// Limits on what clients control. Deserialisable (every field optional,
/// unknown ones refused) for a config file section.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Most sessions (connected or kept for a reconnect).
    pub max_sessions: usize,
    /// Most subscriptions per session.
    pub max_subscriptions: usize,
    /// Most messages queued per session: delivered but not yet written to a
    /// connected client, or QoS 1/2 messages kept for an offline one. Beyond
    /// it messages for that session are dropped, counted
    /// ([`DropReason::QueueFull`]) and logged once per burst.
    pub max_queued: usize,
    /// Most retained messages.
    pub max_retained: usize,
    /// Longest Session Expiry Interval granted, seconds.
    pub max_session_expiry: u32,
    /// Seconds between updates of the `$SYS/broker/...` topics (mosquitto's
    /// `sys_interval`); 0 publishes none.
    pub sys_interval: u32,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            max_sessions: 100_000,
            max_subscriptions: 1_000,
            max_queued: 1_000,
            max_retained: 100_000,
            max_session_expiry: 7 * 24 * 3600,
            sys_interval: 10,
        }
    }
}

/// Where a message came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An MQTT client, by Client Identifier (for No Local).
    Mqtt(Arc<str>),
    /// An HTTP POST.
    Http,
    /// A MoQT publisher's object (not published back into MoQT).
    Moqt,
    /// A Will Message of this client.
    Will(Arc<str>),
    /// Recovered from the durable store after a restart.
    Store,
    /// The broker's own `$SYS` topics: neither persisted nor bridged to
    /// MoQT, and not counted as received.
    Sys,
    /// Another relay of the cluster (not sent back to the cluster,
    /// [`crate::cluster`]).
    Cluster,
}

/// One application message, shared by every delivery.
#[derive(Debug, Clone)]
pub struct Message {
    /// Topic name.
    pub topic: Arc<str>,
    /// Payload, never copied.
    pub payload: Bytes,
    /// QoS it was published with.
    pub qos: QoS,
    /// RETAIN flag it was published with.
    pub retain: bool,
    /// Properties forwarded to MQTT 5 subscribers (Payload Format Indicator,
    /// Content Type, Response Topic, Correlation Data, User Properties).
    pub properties: Properties,
    /// When the Message Expiry Interval runs out.
    pub expires: Option<Instant>,
    /// Publisher.
    pub source: Source,
}

impl Message {
    /// A message with no properties.
    pub fn new(topic: &str, payload: Bytes, qos: QoS, retain: bool, source: Source) -> Self {
        Self {
            topic: topic.into(),
            payload,
            qos,
            retain,
            properties: Properties::default(),
            expires: None,
            source,
        }
    }

    /// Keeps only the properties a broker forwards, and turns the Message
    /// Expiry Interval into a deadline.
    pub fn with_properties(mut self, p: &Properties, now: Instant) -> Self {
        self.expires = p
            .message_expiry_interval
            .map(|s| now + Duration::from_secs(s.into()));
        self.properties = Properties {
            payload_format_indicator: p.payload_format_indicator,
            content_type: p.content_type.clone(),
            response_topic: p.response_topic.clone(),
            correlation_data: p.correlation_data.clone(),
            user_properties: p.user_properties.clone(),
            ..Properties::default()
        };
        self
    }

    /// Whether the message expired at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|e| now >= e)
    }
}

/// One message on its way to one subscriber.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message.
    pub message: Arc<Message>,
    /// QoS of this delivery: the lower of the publish and the subscription.
    pub qos: QoS,
    /// RETAIN flag to send.
    pub retain: bool,
    /// Subscription Identifiers of the matching subscriptions.
    pub subscription_ids: Vec<u32>,
    /// Sent before and not acknowledged: the DUP flag is set.
    pub dup: bool,
    /// Sequence number in the durable store, when the delivery is persisted
    /// (QoS 1/2 to a persistent session): acknowledge it with [`Broker::ack`].
    pub seq: Option<u64>,
    /// The Packet Identifier it was sent with on an earlier connection of
    /// the session: sent again with the same one (§4.4), so the client can
    /// recognise a QoS 2 message it already has.
    pub packet_id: Option<u16>,
    /// QoS 2 acknowledged with PUBREC: only the PUBREL is due, never the
    /// PUBLISH again.
    pub released: bool,
}

/// Options of one subscription as the broker keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubOptions {
    /// What the client asked for.
    pub options: SubscriptionOptions,
    /// Subscription Identifier.
    pub id: Option<u32>,
}

/// A live connection's end of the delivery channel.
#[derive(Debug, Clone)]
pub struct Outbox {
    /// Deliveries for the connection.
    pub tx: mpsc::Sender<Delivery>,
    /// Connection id (sessions outlive connections).
    pub conn: u64,
    /// Tells the connection to close (session taken over): the reason code.
    pub kick: mpsc::Sender<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SubKey {
    Client(Arc<str>),
    Shared(Arc<str>),
}

#[derive(Debug, Clone)]
enum SubValue {
    Client(SubOptions),
    Shared(Arc<SharedGroup>),
}

#[derive(Debug)]
struct SharedGroup {
    members: Vec<(Arc<str>, SubOptions)>,
    next: AtomicUsize,
}

#[derive(Debug)]
struct Session {
    outbox: Option<Outbox>,
    /// Full filters as subscribed (including `$share/...`).
    subscriptions: HashMap<String, SubOptions>,
    /// `None`: never expires.
    expiry: Option<Duration>,
    disconnected: Option<Instant>,
    /// QoS 1/2 messages kept while offline, oldest first.
    queue: VecDeque<Delivery>,
    /// The attached connection resumed the session (Clean Start 0), so a
    /// connection it took over hands its in-flight messages on and its
    /// delayed Will Message is not sent (§3.1.3.2.2).
    resumed: bool,
    /// Packet identifiers of the client's QoS 2 PUBLISHes routed and not yet
    /// released (PUBREL): session state (§4.3.3), shared with the attached
    /// connection, so a DUP retransmission after a reconnect or a takeover is
    /// acknowledged, not routed again.
    awaiting_rel: AwaitingRel,
    /// Packet Identifiers of our QoS 1/2 PUBLISHes to the client that are
    /// not complete, on any connection of the session (a taken-over one
    /// included) or carried by queued deliveries: a fresh identifier must
    /// not be one of them (§2.2.1), or the client would take a new message
    /// for one it already has.
    out_ids: OutIds,
    /// Warnings about dropped messages.
    drops: DropLog,
}

/// See [`Session`]'s `out_ids`.
pub type OutIds = Arc<Mutex<std::collections::HashSet<u16>>>;

/// See [`Session`]'s `awaiting_rel`.
pub type AwaitingRel = Arc<Mutex<std::collections::HashSet<u16>>>;

impl Session {
    /// Whether the session outlives its connection (and is in the store).
    fn persistent(&self) -> bool {
        self.expiry != Some(Duration::ZERO)
    }
}

fn expiry_secs(e: Option<Duration>) -> u32 {
    e.map_or(u32::MAX, |d| d.as_secs().min(u64::from(u32::MAX)) as u32)
}

#[derive(Debug)]
struct PendingWill {
    client: Arc<str>,
    conn: u64,
    due: Instant,
    message: Message,
}

#[derive(Default)]
struct State {
    sessions: HashMap<Arc<str>, Session>,
    tree: TopicTree<SubKey, SubValue>,
    retained: HashMap<Arc<str>, Arc<Message>>,
    /// The broker's own retained `$SYS` messages, apart so they never take
    /// room under [`BrokerConfig::max_retained`].
    sys_retained: HashMap<Arc<str>, Arc<Message>>,
    wills: Vec<PendingWill>,
}

/// How often a session whose queue stays full is warned about again.
const DROP_LOG_EVERY: Duration = Duration::from_secs(30);

/// Rate limit of the warnings about a session's dropped messages: one at
/// the first drop of a burst, then at most one per [`DROP_LOG_EVERY`] with
/// the count, and one when the queue drained.
#[derive(Debug, Default)]
struct DropLog {
    /// Drops not reported yet.
    unreported: u64,
    /// When the burst was last reported; `None` between bursts.
    reported: Option<Instant>,
}

impl DropLog {
    /// Counts a drop at `now`; the number of drops to report when a warning
    /// is due.
    fn dropped(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        match self.reported {
            Some(t) if now.saturating_duration_since(t) < DROP_LOG_EVERY => None,
            _ => {
                self.reported = Some(now);
                Some(std::mem::take(&mut self.unreported))
            }
        }
    }

    /// The queue drained: the burst is over. The drops not reported yet,
    /// if any.
    fn drained(&mut self) -> Option<u64> {
        self.reported.take()?;
        let n = std::mem::take(&mut self.unreported);
        (n > 0).then_some(n)
    }

    fn in_burst(&self) -> bool {
        self.reported.is_some()
    }
}

/// What [`Broker::connect`] decided.
#[derive(Debug)]
pub struct Connected {
    /// An earlier session was resumed.
    pub session_present: bool,
    /// Messages kept for the session while it was offline, to send first.
    pub backlog: Vec<Delivery>,
    /// The session's QoS 2 packet identifiers awaiting PUBREL.
    pub awaiting_rel: AwaitingRel,
    /// The session's outgoing Packet Identifiers in use.
    pub out_ids: OutIds,
}

/// Why a SUBSCRIBE filter was refused: its reason code.
pub type SubscribeResult = Result<(QoS, Vec<Delivery>), u8>;

/// A hook that sees routed messages (see [`Broker::set_route`]).
pub type Tap = Arc<dyn Fn(&Arc<Message>) + Send + Sync>;

/// The broker.
pub struct Broker {
    /// Limits.
    pub config: BrokerConfig,
    /// Counters.
    pub metrics: BrokerMetrics,
    state: Mutex<State>,
    conn_ids: AtomicU64,
    store: Option<Arc<Store>>,
    /// The way out to other networks, see [`Broker::set_route`].
    route: Mutex<Option<Tap>>,
    /// The `$SYS` topics' publisher.
    sys: Mutex<Sys>,
    /// Who clients are and what they may do (open to all until
    /// [`Broker::set_auth`]).
    auth: Mutex<Arc<quichub_auth::SharedAuth>>,
}

impl Broker {
    /// A new broker.
    pub fn new(config: BrokerConfig) -> Arc<Self> {
        Self::build(config, None)
    }

    fn build(config: BrokerConfig, store: Option<Arc<Store>>) -> Arc<Self> {
        Arc::new(Self {
            config,
            metrics: BrokerMetrics::default(),
            state: Mutex::default(),
            conn_ids: AtomicU64::new(1),
            store,
            route: Mutex::new(None),
            sys: Mutex::new(Sys::new(Instant::now())),
            auth: Mutex::new(quichub_auth::SharedAuth::open()),
        })
    }

    /// Authenticates and authorises clients with `auth` from now on.
    pub fn set_auth(&self, auth: Arc<quichub_auth::SharedAuth>) {
        *self.auth.lock().expect("auth lock") = auth;
    }

    /// The authentication in force (a connection takes it once, at CONNECT).
    pub fn auth(&self) -> Arc<quichub_auth::SharedAuth> {
        self.auth.lock().expect("auth lock").clone()
    }

    /// A broker whose durable state lives in `store`, starting from what the
    /// store recovered: persistent sessions (offline, their expiry counting
    /// from now) with subscriptions and queued messages, and retained messages.
    pub fn with_store(config: BrokerConfig, store: Arc<Store>, recovered: Recovered) -> Arc<Self> {
        let broker = Self::build(config, Some(store));
        {
            let mut st = broker.lock();
            let now = Instant::now();
            for (client, rec) in recovered.sessions {
                let expiry =
                    (rec.expiry != u32::MAX).then(|| Duration::from_secs(rec.expiry.into()));
                let queue = rec
                    .queue
                    .into_iter()
                    .map(|q| Delivery {
                        message: q.message,
                        qos: q.qos,
                        retain: q.retain,
                        subscription_ids: q.ids,
                        dup: true,
                        seq: Some(q.seq),
                        packet_id: q.packet_id,
                        released: q.released,
                    })
                    .collect::<VecDeque<Delivery>>();
                let out_ids: OutIds = Arc::new(Mutex::new(
                    queue.iter().filter_map(|d| d.packet_id).collect(),
                ));
                st.sessions.insert(
                    client.clone(),
                    Session {
                        outbox: None,
                        subscriptions: HashMap::new(),
                        expiry,
                        disconnected: Some(now),
                        queue,
                        resumed: false,
                        awaiting_rel: AwaitingRel::default(),
                        out_ids,
                        drops: DropLog::default(),
                    },
                );
                for (filter, opts) in rec.subscriptions {
                    if let Some(s) = st.sessions.get_mut(&client) {
                        s.subscriptions.insert(filter.clone(), opts);
                    }
                    Self::tree_insert(&mut st, &client, &filter, opts);
                }
            }
            for (_, m) in recovered.retained {
                st.retained.insert(m.topic.clone(), m);
            }
        }
        broker
    }

    /// The durable store's synced ticket, when there is a store: an
    /// acknowledgement that depends on ticket `t` waits until it reaches `t`.
    pub fn durable(&self) -> Option<(watch::Receiver<u64>, Arc<Store>)> {
        self.store.as_ref().map(|s| (s.synced(), s.clone()))
    }

    /// A persisted delivery was acknowledged by the client (or dropped).
    pub fn ack(&self, client: &Arc<str>, seq: u64) {
        if let Some(store) = &self.store {
            store.append(Record::Done {
                client: client.clone(),
                seq,
            });
        }
    }

    /// Records that the persisted QoS 2 delivery `seq` of `client` went out
    /// with `packet_id` (and, once `released`, was PUBREC'd), so a restart
    /// sends it again the same way.
    pub fn inflight(&self, client: &Arc<str>, seq: u64, packet_id: u16, released: bool) {
        if let Some(store) = &self.store {
            store.append(Record::Inflight {
                client: client.clone(),
                seq,
                packet_id,
                released,
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("broker lock")
    }

    /// Registers the broker's way out to other networks: called with every
    /// routed message but the broker's own `$SYS` ones, whatever its source,
    /// after its MQTT subscribers got it. Whoever assembles the server
    /// registers it (the hub: the MoQT bridge's
    /// [`Bridge::route`](crate::bridge::Bridge::route)); the route keeps its
    /// own echoes out. Replaces the route registered before.
    pub fn set_route(&self, f: Tap) {
        *self.route.lock().expect("route lock") = Some(f);
    }

    /// Replaces the route with `f`, called with the messages the MoQT bridge
    /// would take (those that did not come from MoQT): for measurements that
    /// observe the broker without the bridge.
    pub fn set_tap(&self, f: Tap) {
        self.set_route(Arc::new(move |m: &Arc<Message>| {
            if m.source != Source::Moqt {
                f(m);
            }
        }));
    }

    /// A fresh connection id.
    pub fn next_conn_id(&self) -> u64 {
        self.conn_ids.fetch_add(1, Relaxed)
    }

    /// Number of sessions.
    pub fn sessions(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Number of subscriptions of `client`'s session (0 without a session).
    pub fn client_subscriptions(&self, client: &str) -> usize {
        self.lock()
            .sessions
            .get(client)
            .map_or(0, |s| s.subscriptions.len())
    }

    /// Number of subscriptions over all sessions.
    pub fn subscriptions(&self) -> usize {
        self.lock()
            .sessions
            .values()
            .map(|s| s.subscriptions.len())
            .sum()
    }

    /// Attaches a connection to the session of `client`, creating or resuming
    /// it. A connection already attached is told to close (session taken
    /// over). `expiry` is the Session Expiry Interval (`None` = never).
    /// Err is a CONNACK reason code.
    pub fn connect(
        &self,
        client: &Arc<str>,
        clean_start: bool,
        expiry: Option<Duration>,
        outbox: Outbox,
    ) -> Result<Connected, u8> {
        let mut st = self.lock();
        // A will waiting on its delay is cancelled when the session comes back.
        st.wills.retain(|w| &w.client != client);
        let exists = st.sessions.contains_key(client);
        if !exists && st.sessions.len() >= self.config.max_sessions {
            return Err(reason::SERVER_BUSY);
        }
        // A connection still attached is told to close (session taken over),
        // also when Clean Start discards its session.
        if let Some(old) = st.sessions.get_mut(client).and_then(|s| s.outbox.take()) {
            let _ = old.kick.try_send(reason::SESSION_TAKEN_OVER);
        }
        if exists && clean_start {
            self.remove_session_locked(&mut st, client);
        }
        if let Some(store) = &self.store {
            if expiry != Some(Duration::ZERO) {
                store.append(Record::Session {
                    client: client.clone(),
                    expiry: expiry_secs(expiry),
                });
            } else if exists && !clean_start {
                store.append(Record::SessionGone {
                    client: client.clone(),
                });
            }
        }
        let session = st
            .sessions
            .entry(client.clone())
            .or_insert_with(|| Session {
                outbox: None,
                subscriptions: HashMap::new(),
                expiry,
                disconnected: None,
                queue: VecDeque::new(),
                resumed: false,
                awaiting_rel: AwaitingRel::default(),
                out_ids: OutIds::default(),
                drops: DropLog::default(),
            });
        let present = exists && !clean_start;
        session.resumed = present;
        session.outbox = Some(outbox);
        session.expiry = expiry;
        session.disconnected = None;
        let now = Instant::now();
        let mut backlog = Vec::with_capacity(session.queue.len());
        for d in session.queue.drain(..) {
            // An expired message is dropped unless it was sent already: its
            // delivery has begun, and the client may wait for a PUBREL
            // (§3.3.2.3.3).
            if d.packet_id.is_none() && d.message.expired(now) {
                self.metrics.count_drop(DropReason::Expired);
                if let (Some(store), Some(seq)) = (&self.store, d.seq) {
                    store.append(Record::Done {
                        client: client.clone(),
                        seq,
                    });
                }
            } else {
                backlog.push(d);
            }
        }
        if let Some(n) = session.drops.drained() {
            drained_warning(client, n);
        }
        Ok(Connected {
            session_present: present,
            backlog,
            awaiting_rel: session.awaiting_rel.clone(),
            out_ids: session.out_ids.clone(),
        })
    }

    /// Detaches connection `conn` from its session. `unacked` are deliveries
    /// written but not acknowledged (kept for the next connection when the
    /// session persists), `will` is published now or after its delay, and
    /// `expiry` overrides the session expiry (from DISCONNECT).
    pub fn disconnect(
        &self,
        client: &Arc<str>,
        conn: u64,
        unacked: Vec<Delivery>,
        will: Option<(Message, Duration)>,
        expiry: Option<Option<Duration>>,
    ) {
        let mut fire = None;
        {
            let mut st = self.lock();
            let Some(session) = st.sessions.get_mut(client) else {
                return;
            };
            if session.outbox.as_ref().map(|o| o.conn) != Some(conn) {
                // Taken over: the new connection owns the session now; what
                // this one had in flight is redelivered to it. Its will goes
                // out unless delayed and the session continues (§3.1.2.5);
                // with Clean Start the session ended.
                if session.resumed {
                    // Queued, not sent: the new connection's channel may be
                    // full, and a persisted delivery must not vanish. Sent
                    // with the next message for the session or reconnect.
                    let max = self.config.max_queued;
                    for d in unacked {
                        if d.qos != QoS::AtMostOnce && session.queue.len() < max {
                            session.queue.push_back(d);
                        } else {
                            self.dropped(client, session, &d);
                        }
                    }
                    if let Some(o) = &session.outbox {
                        while let Some(d) = session.queue.pop_front() {
                            match o.tx.try_send(d) {
                                Ok(()) => {}
                                Err(e) => {
                                    session.queue.push_front(e.into_inner());
                                    break;
                                }
                            }
                        }
                    }
                }
                if let Some((m, delay)) = will {
                    if delay.is_zero() || !session.resumed {
                        fire = Some(m);
                    }
                }
            } else {
                session.outbox = None;
                let was_persistent = session.persistent();
                if let Some(e) = expiry {
                    session.expiry = e;
                    if let (Some(store), true) = (&self.store, session.persistent()) {
                        store.append(Record::Session {
                            client: client.clone(),
                            expiry: expiry_secs(e),
                        });
                    }
                }
                let ends_now = session.expiry == Some(Duration::ZERO);
                if ends_now {
                    // DISCONNECT with Session Expiry 0 ends a persistent session:
                    // the store must forget it too.
                    if let (Some(store), true) = (&self.store, was_persistent) {
                        store.append(Record::SessionGone {
                            client: client.clone(),
                        });
                    }
                    self.remove_session_locked(&mut st, client);
                } else {
                    session.disconnected = Some(Instant::now());
                    let max = self.config.max_queued;
                    for d in unacked.into_iter().rev() {
                        if d.qos != QoS::AtMostOnce && session.queue.len() < max {
                            session.queue.push_front(d);
                        } else {
                            self.dropped(client, session, &d);
                        }
                    }
                }
                if let Some((m, delay)) = will {
                    let delay = match st.sessions.get(client).map(|s| s.expiry) {
                        // The will goes out at the latest when the session ends.
                        Some(Some(e)) => delay.min(e),
                        Some(None) => delay,
                        None => Duration::ZERO,
                    };
                    if delay.is_zero() {
                        fire = Some(m);
                    } else {
                        st.wills.push(PendingWill {
                            client: client.clone(),
                            conn,
                            due: Instant::now() + delay,
                            message: m,
                        });
                    }
                }
            }
        }
        if let Some(m) = fire {
            self.publish(m);
        }
    }

    /// Ends expired sessions and publishes wills whose delay ran out. Called
    /// about once a second by the gateway's timer task.
    pub fn tick(&self, now: Instant) {
        let due: Vec<Message> = {
            let mut st = self.lock();
            let mut due = Vec::new();
            st.wills.retain(|w| {
                if w.due <= now {
                    let _ = w.conn;
                    due.push(w.message.clone());
                    false
                } else {
                    true
                }
            });
            let expired: Vec<Arc<str>> = st
                .sessions
                .iter()
                .filter(|(_, s)| {
                    s.outbox.is_none()
                        && matches!((s.disconnected, s.expiry), (Some(d), Some(e)) if now >= d + e)
                })
                .map(|(c, _)| c.clone())
                .collect();
            for c in expired {
                self.remove_session_locked(&mut st, &c);
            }
            due
        };
        for m in due {
            self.publish(m);
        }
        self.publish_sys(now);
    }

    /// Publishes the `$SYS/broker/...` topics that changed, when
    /// [`BrokerConfig::sys_interval`] has passed since the last time.
    fn publish_sys(&self, now: Instant) {
        let interval = Duration::from_secs(self.config.sys_interval.into());
        if !self.sys.lock().expect("sys lock").due(now, interval) {
            return;
        }
        let snapshot = self.snapshot();
        let messages = self.sys.lock().expect("sys lock").update(now, &snapshot);
        for (topic, value) in messages {
            self.publish(Message::new(
                &topic,
                Bytes::from(value),
                QoS::AtMostOnce,
                true,
                Source::Sys,
            ));
        }
    }

    /// The broker's state and counters now.
    pub fn snapshot(&self) -> Snapshot {
        let m = &self.metrics;
        let mut s = Snapshot {
            maximum: m.connections_max.load(Relaxed),
            received: m.received(),
            sent: m.sent(),
            dropped: m.dropped.load(Relaxed),
            bytes_received: m.bytes_received.load(Relaxed),
            bytes_sent: m.bytes_sent.load(Relaxed),
            connections: m.connections_accepted(),
            ..Snapshot::default()
        };
        let st = self.lock();
        let mut queued = 0;
        for session in st.sessions.values() {
            s.connected += u64::from(session.outbox.is_some());
            s.subscriptions += session.subscriptions.len() as u64;
            queued += session.queue.len() as u64;
        }
        s.sessions = st.sessions.len() as u64;
        s.retained = st.retained.len() as u64;
        s.stored = s.retained + queued;
        s
    }

    /// `/metrics`: the counters ([`BrokerMetrics::render`]), the state
    /// gauges (sessions, subscriptions, retained and queued messages; counted
    /// from the state under its lock, once per scrape) and the store's.
    pub fn render_metrics(&self) -> String {
        use crate::metrics::{family, sample};
        let mut out = self.metrics.render();
        let s = self.snapshot();
        for (name, help, v) in [
            (
                "quichub_mqtt_sessions",
                "MQTT sessions, connected or kept for a reconnect.",
                s.sessions,
            ),
            (
                "quichub_mqtt_sessions_connected",
                "MQTT sessions with a connection attached.",
                s.connected,
            ),
            (
                "quichub_mqtt_subscriptions",
                "MQTT subscriptions over all sessions.",
                s.subscriptions,
            ),
            (
                "quichub_mqtt_retained_messages",
                "Retained messages.",
                s.retained,
            ),
            (
                "quichub_mqtt_queued_messages",
                "Messages queued for offline sessions now.",
                s.stored - s.retained,
            ),
        ] {
            family(&mut out, name, "gauge", help);
            sample(&mut out, name, &[], v);
        }
        if let Some(store) = &self.store {
            out.push_str(&store.stats().render());
        }
        out
    }

    /// A delivery of `session` given up on a disconnection (QoS 0, or no
    /// room in the queue): counted, the store forgets it and its Packet
    /// Identifier is free again.
    fn dropped(&self, client: &Arc<str>, session: &mut Session, d: &Delivery) {
        if d.qos == QoS::AtMostOnce {
            self.metrics.count_drop(DropReason::Disconnected);
        } else {
            self.queue_full(client, session, Instant::now());
        }
        if let (Some(store), Some(seq)) = (&self.store, d.seq) {
            store.append(Record::Done {
                client: client.clone(),
                seq,
            });
        }
        if let Some(id) = d.packet_id {
            session
                .out_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
    }

    /// Counts a drop for a full queue, and warns once per burst.
    fn queue_full(&self, client: &Arc<str>, session: &mut Session, now: Instant) {
        self.metrics.count_drop(DropReason::QueueFull);
        if let Some(n) = session.drops.dropped(now) {
            tracing::warn!(
                "mqtt session {client}: queue full ({} messages): {n} messages dropped (next warning when it drains or in {}s)",
                self.config.max_queued,
                DROP_LOG_EVERY.as_secs()
            );
        }
    }

    fn remove_session_locked(&self, st: &mut State, client: &Arc<str>) {
        if let Some(s) = st.sessions.remove(client) {
            if let (Some(store), true) = (&self.store, s.persistent()) {
                store.append(Record::SessionGone {
                    client: client.clone(),
                });
            }
            for filter in s.subscriptions.keys() {
                Self::tree_remove(st, client, filter);
            }
        }
    }

    /// Adds or replaces a subscription of `client`. Returns the granted QoS
    /// and the retained messages to send, or the SUBACK reason code.
    pub fn subscribe(
        &self,
        client: &Arc<str>,
        full_filter: &str,
        opts: SubOptions,
    ) -> SubscribeResult {
        let (share, filter) =
            topic::parse_subscription(full_filter).map_err(|_| reason::TOPIC_FILTER_INVALID)?;
        if share.is_some() && opts.options.no_local {
            return Err(reason::PROTOCOL_ERROR);
        }
        let mut st = self.lock();
        let session = st
            .sessions
            .get_mut(client)
            .ok_or(reason::UNSPECIFIED_ERROR)?;
        let existed = session.subscriptions.contains_key(full_filter);
        if !existed && session.subscriptions.len() >= self.config.max_subscriptions {
            return Err(reason::QUOTA_EXCEEDED);
        }
        session.subscriptions.insert(full_filter.to_string(), opts);
        if let (Some(store), true) = (&self.store, session.persistent()) {
            store.append(Record::Sub {
                client: client.clone(),
                filter: full_filter.to_string(),
                options: opts,
            });
        }
        Self::tree_insert(&mut st, client, full_filter, opts);
        // Retained messages: not for shared subscriptions (§4.8.2), and per
        // Retain Handling.
        let send_retained = share.is_none()
            && match opts.options.retain_handling {
                0 => true,
                1 => !existed,
                _ => false,
            };
        let now = Instant::now();
        let retained = if send_retained {
            // Only a filter starting with `$SYS` can match a `$SYS` topic.
            let sys = filter.starts_with("$SYS").then_some(&st.sys_retained);
            st.retained
                .values()
                .chain(sys.into_iter().flat_map(|m| m.values()))
                .filter(|m| topic::matches(&filter, &m.topic) && !m.expired(now))
                .map(|m| Delivery {
                    message: m.clone(),
                    qos: m.qos.min(opts.options.qos),
                    retain: true,
                    subscription_ids: opts.id.into_iter().collect(),
                    dup: false,
                    seq: None,
                    packet_id: None,
                    released: false,
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok((opts.options.qos, retained))
    }

    fn tree_insert(st: &mut State, client: &Arc<str>, full_filter: &str, opts: SubOptions) {
        let Ok((share, filter)) = topic::parse_subscription(full_filter) else {
            return;
        };
        match &share {
            None => {
                st.tree.insert(
                    &filter,
                    SubKey::Client(client.clone()),
                    SubValue::Client(opts),
                );
            }
            Some(group) => {
                let key = SubKey::Shared(group.as_str().into());
                let mut members: Vec<(Arc<str>, SubOptions)> = match st.tree.get(&filter, &key) {
                    Some(SubValue::Shared(g)) => g.members.clone(),
                    _ => Vec::new(),
                };
                members.retain(|(c, _)| c != client);
                members.push((client.clone(), opts));
                st.tree.insert(
                    &filter,
                    key,
                    SubValue::Shared(Arc::new(SharedGroup {
                        members,
                        next: AtomicUsize::new(0),
                    })),
                );
            }
        }
    }

    /// Removes a subscription; whether it existed.
    pub fn unsubscribe(&self, client: &Arc<str>, full_filter: &str) -> bool {
        let mut st = self.lock();
        let Some(session) = st.sessions.get_mut(client) else {
            return false;
        };
        if session.subscriptions.remove(full_filter).is_none() {
            return false;
        }
        if let (Some(store), true) = (&self.store, session.persistent()) {
            store.append(Record::Unsub {
                client: client.clone(),
                filter: full_filter.to_string(),
            });
        }
        Self::tree_remove(&mut st, client, full_filter);
        true
    }

    fn tree_remove(st: &mut State, client: &Arc<str>, full_filter: &str) {
        let Ok((share, filter)) = topic::parse_subscription(full_filter) else {
            return;
        };
        match share {
            None => {
                st.tree.remove(&filter, &SubKey::Client(client.clone()));
            }
            Some(group) => {
                let key = SubKey::Shared(group.as_str().into());
                let members: Vec<(Arc<str>, SubOptions)> = match st.tree.get(&filter, &key) {
                    Some(SubValue::Shared(g)) => g
                        .members
                        .iter()
                        .filter(|(c, _)| c != client)
                        .cloned()
                        .collect(),
                    _ => return,
                };
                if members.is_empty() {
                    st.tree.remove(&filter, &key);
                } else {
                    st.tree.insert(
                        &filter,
                        key,
                        SubValue::Shared(Arc::new(SharedGroup {
                            members,
                            next: AtomicUsize::new(0),
                        })),
                    );
                }
            }
        }
    }

    /// Routes a message to every matching subscriber, updates the retained
    /// store, and hands it to the MoQT bridge. Returns how many subscribers
    /// it matched.
    pub fn publish(&self, message: Message) -> usize {
        self.publish_durable(message).0
    }

    /// [`Self::publish`], also returning the store ticket that must be durable
    /// before the publish is acknowledged (0 when nothing was persisted).
    pub fn publish_durable(&self, message: Message) -> (usize, u64) {
        let sys = message.source == Source::Sys;
        if !sys {
            self.metrics.published.fetch_add(1, Relaxed);
            self.metrics.count_received(message.qos);
        }
        let message = Arc::new(message);
        let now = Instant::now();
        let mut p = Persist {
            // `$SYS` messages are QoS 0 and describe this run only (as
            // mosquitto's, never persisted).
            store: self.store.as_deref().filter(|_| !sys),
            seq: None,
            records: Vec::new(),
            sends: Vec::new(),
        };
        let (matched, ticket) = {
            let mut st = self.lock();
            if sys {
                st.sys_retained
                    .insert(message.topic.clone(), message.clone());
            } else if message.retain {
                if message.payload.is_empty() {
                    if st.retained.remove(&message.topic).is_some() && p.store.is_some() {
                        p.records.push(Record::Unretain {
                            topic: message.topic.clone(),
                        });
                    }
                } else if st.retained.len() < self.config.max_retained
                    || st.retained.contains_key(&message.topic)
                {
                    st.retained.insert(message.topic.clone(), message.clone());
                    if p.store.is_some() {
                        let seq = p.seq(&message);
                        p.records.push(Record::Retain {
                            topic: message.topic.clone(),
                            seq,
                        });
                    }
                }
            }
            // (client, options) of every match; a client matched by several
            // subscriptions gets one delivery at the highest QoS with every
            // Subscription Identifier (§3.3.4).
            let mut targets: Vec<(Arc<str>, SubOptions)> = Vec::new();
            for (key, value) in st.tree.matches(&message.topic) {
                match (key, value) {
                    (SubKey::Client(c), SubValue::Client(o)) => targets.push((c.clone(), *o)),
                    (_, SubValue::Shared(g)) => {
                        if let Some(m) = pick_member(&st.sessions, g) {
                            targets.push(m);
                        }
                    }
                    _ => {}
                }
            }
            // Grouped by client (order within a client does not matter, so
            // the unstable sort: no allocation).
            targets.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            let mut matched = 0;
            let mut i = 0;
            while i < targets.len() {
                let client = targets[i].0.clone();
                let mut qos = QoS::AtMostOnce;
                let mut ids = Vec::new();
                let mut retain_as_published = false;
                let mut skip = true;
                while i < targets.len() && targets[i].0 == client {
                    let o = targets[i].1;
                    i += 1;
                    if o.options.no_local && message.source == Source::Mqtt(client.clone()) {
                        continue;
                    }
                    skip = false;
                    qos = qos.max(o.options.qos);
                    retain_as_published |= o.options.retain_as_published;
                    ids.extend(o.id);
                }
                if skip {
                    continue;
                }
                matched += 1;
                let d = Delivery {
                    message: message.clone(),
                    qos: qos.min(message.qos),
                    retain: retain_as_published && message.retain,
                    subscription_ids: ids,
                    dup: false,
                    seq: None,
                    packet_id: None,
                    released: false,
                };
                if let Some(s) = st.sessions.get_mut(&client) {
                    self.deliver(&client, s, d, now, &mut p);
                }
            }
            (matched, p.commit())
        };
        if !sys {
            let route = self.route.lock().expect("route lock").clone();
            if let Some(route) = route {
                route(&message);
            }
        }
        (matched, ticket)
    }

    fn deliver(
        &self,
        client: &Arc<str>,
        s: &mut Session,
        mut d: Delivery,
        now: Instant,
        p: &mut Persist<'_>,
    ) {
        let persist = p.store.is_some() && d.qos != QoS::AtMostOnce && s.persistent();
        if let Some(o) = &s.outbox {
            // An empty channel ends a burst of drops.
            if s.drops.in_burst() && o.tx.capacity() == o.tx.max_capacity() {
                if let Some(n) = s.drops.drained() {
                    drained_warning(client, n);
                }
            }
        }
        let reason = match &s.outbox {
            Some(o) if !persist => match o.tx.try_send(d) {
                Ok(()) => {
                    self.metrics.delivered.fetch_add(1, Relaxed);
                    None
                }
                Err(e) => Some(send_error_reason(&e)),
            },
            Some(o) => match o.tx.clone().try_reserve_owned() {
                // Logged, then handed over once the publish's records are
                // appended (see `Persist::commit`), so its acknowledgement
                // (logged by the connection) can never precede it.
                Ok(permit) => {
                    let seq = p.seq(&d.message);
                    p.records.push(Record::Queue {
                        client: client.clone(),
                        seq,
                        qos: d.qos,
                        retain: d.retain,
                        ids: d.subscription_ids.clone(),
                    });
                    d.seq = Some(seq);
                    p.sends.push((permit, d));
                    self.metrics.delivered.fetch_add(1, Relaxed);
                    None
                }
                Err(e) => Some(send_error_reason(&e)),
            },
            None => {
                // QoS 0 is not kept for an offline session: by design, not
                // a drop.
                if d.qos == QoS::AtMostOnce {
                    return;
                }
                if d.message.expired(now) {
                    self.metrics.count_drop(DropReason::Expired);
                    return;
                }
                if s.queue.len() >= self.config.max_queued {
                    self.queue_full(client, s, now);
                    return;
                }
                if persist {
                    let seq = p.seq(&d.message);
                    p.records.push(Record::Queue {
                        client: client.clone(),
                        seq,
                        qos: d.qos,
                        retain: d.retain,
                        ids: d.subscription_ids.clone(),
                    });
                    d.seq = Some(seq);
                }
                self.metrics.queued_offline.fetch_add(1, Relaxed);
                s.queue.push_back(d);
                None
            }
        };
        match reason {
            Some(DropReason::QueueFull) => self.queue_full(client, s, now),
            Some(r) => self.metrics.count_drop(r),
            None => {}
        }
    }

    /// Retained message of `topic`, if any.
    pub fn retained(&self, topic: &str) -> Option<Arc<Message>> {
        let st = self.lock();
        st.retained
            .get(topic)
            .or_else(|| st.sys_retained.get(topic))
            .cloned()
    }
}

/// Persistence of one publish: the message body is written at most once,
/// on first need.
struct Persist<'a> {
    store: Option<&'a Store>,
    seq: Option<u64>,
    /// The body and every record referencing it, appended together.
    records: Vec<Record>,
    /// Deliveries to connected persistent sessions, sent after the records.
    sends: Vec<(mpsc::OwnedPermit<Delivery>, Delivery)>,
}

impl Persist<'_> {
    fn seq(&mut self, m: &Message) -> u64 {
        match (self.seq, self.store) {
            (Some(s), _) => s,
            (None, Some(store)) => {
                let (s, r) = store.message_record(m);
                self.records.push(r);
                self.seq = Some(s);
                s
            }
            (None, None) => 0,
        }
    }

    /// Appends the records as one unit (never split by a write or a
    /// compaction), then hands over the deliveries; returns the ticket.
    fn commit(&mut self) -> u64 {
        let ticket = match self.store {
            Some(store) if !self.records.is_empty() => {
                store.append_all(std::mem::take(&mut self.records))
            }
            _ => 0,
        };
        for (permit, d) in self.sends.drain(..) {
            permit.send(d);
        }
        ticket
    }
}

/// Why a delivery could not go into a connection's channel.
fn send_error_reason<T>(e: &mpsc::error::TrySendError<T>) -> DropReason {
    match e {
        mpsc::error::TrySendError::Full(_) => DropReason::QueueFull,
        // The connection is closing; its session will be offline.
        mpsc::error::TrySendError::Closed(_) => DropReason::Disconnected,
    }
}

/// The end of a burst of drops for `client`'s session.
fn drained_warning(client: &str, n: u64) {
    tracing::warn!("mqtt session {client}: queue drained; {n} more messages had been dropped");
}

/// Round robin over a shared group, preferring connected members; a group of
/// only offline members queues on the next one (their sessions persist).
fn pick_member(
    sessions: &HashMap<Arc<str>, Session>,
    g: &SharedGroup,
) -> Option<(Arc<str>, SubOptions)> {
    let n = g.members.len();
    if n == 0 {
        return None;
    }
    let start = g.next.fetch_add(1, Relaxed);
    let online = (0..n)
        .map(|k| &g.members[(start + k) % n])
        .find(|(c, _)| sessions.get(c).is_some_and(|s| s.outbox.is_some()));
    online.or_else(|| g.members.get(start % n)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(conn: u64, cap: usize) -> (Outbox, mpsc::Receiver<Delivery>) {
        let (tx, rx) = mpsc::channel(cap);
        let (kick, _) = mpsc::channel(1);
        (Outbox { tx, conn, kick }, rx)
    }

    fn qos1(topic: &str) -> Message {
        Message::new(
            topic,
            Bytes::from_static(b"x"),
            QoS::AtLeastOnce,
            false,
            Source::Http,
        )
    }

    #[test]
    fn dropped_deliveries_are_counted_by_reason() {
        let broker = Broker::new(BrokerConfig {
            max_queued: 2,
            ..BrokerConfig::default()
        });
        let c: Arc<str> = "c".into();
        let (o, _rx) = outbox(1, 2);
        let hour = Some(Duration::from_secs(3600));
        broker.connect(&c, true, hour, o).unwrap();
        let options = SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            ..SubscriptionOptions::default()
        };
        broker
            .subscribe(&c, "a", SubOptions { options, id: None })
            .unwrap();
        broker.disconnect(&c, 1, Vec::new(), None, None);
        // Offline: two fit in the queue, three are dropped.
        for _ in 0..5 {
            broker.publish(qos1("a"));
        }
        assert_eq!(broker.metrics.dropped(DropReason::QueueFull), 3);
        assert!(broker.lock().sessions[&c].drops.in_burst());
        let mut m = qos1("a");
        m.expires = Some(Instant::now());
        broker.publish(m);
        assert_eq!(broker.metrics.dropped(DropReason::Expired), 1);
        // Back online: the queue drained (the burst ends); the channel
        // holds two, the third is dropped.
        let (o, mut rx) = outbox(2, 2);
        let backlog = broker.connect(&c, false, hour, o).unwrap().backlog;
        assert_eq!(backlog.len(), 2);
        assert!(!broker.lock().sessions[&c].drops.in_burst());
        for _ in 0..3 {
            broker.publish(qos1("a"));
        }
        assert_eq!(broker.metrics.dropped(DropReason::QueueFull), 4);
        assert!(broker.lock().sessions[&c].drops.in_burst());
        // The connection took them: an empty channel ends the burst.
        while rx.try_recv().is_ok() {}
        broker.publish(qos1("a"));
        assert!(!broker.lock().sessions[&c].drops.in_burst());
        // QoS 0 pending on a connection that closes.
        let mut d = rx.try_recv().unwrap();
        d.qos = QoS::AtMostOnce;
        broker.disconnect(&c, 2, vec![d], None, None);
        assert_eq!(broker.metrics.dropped(DropReason::Disconnected), 1);
        assert_eq!(broker.metrics.dropped.load(Relaxed), 6);
        let text = broker.metrics.render();
        for line in [
            "# TYPE quichub_mqtt_messages_dropped_total counter",
            "quichub_mqtt_messages_dropped_total{reason=\"queue_full\"} 4",
            "quichub_mqtt_messages_dropped_total{reason=\"expired\"} 1",
            "quichub_mqtt_messages_dropped_total{reason=\"disconnected\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn drop_warnings_come_once_per_burst() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut l = DropLog::default();
        assert_eq!(l.drained(), None);
        // The first drop warns, the next ones are counted...
        assert_eq!(l.dropped(t0), Some(1));
        for i in 1..100 {
            assert_eq!(l.dropped(t0 + ms(i)), None);
        }
        // ... until the interval passed: a warning with the count.
        assert_eq!(l.dropped(t0 + DROP_LOG_EVERY), Some(100));
        assert_eq!(l.dropped(t0 + DROP_LOG_EVERY + ms(1)), None);
        // The queue drained: what was not reported yet, and the burst ends.
        assert_eq!(l.drained(), Some(1));
        assert_eq!(l.drained(), None);
        assert!(!l.in_burst());
        // A new burst warns at once.
        assert_eq!(l.dropped(t0 + DROP_LOG_EVERY + ms(2)), Some(1));
        assert!(l.in_burst());
        assert_eq!(l.drained(), None);
    }

    fn sub(broker: &Broker, c: &Arc<str>, filter: &str) -> Vec<Delivery> {
        broker
            .subscribe(
                c,
                filter,
                SubOptions {
                    options: SubscriptionOptions::default(),
                    id: None,
                },
            )
            .unwrap()
            .1
    }

    #[test]
    fn the_route_sees_every_source_and_a_tap_what_the_bridge_takes() {
        let broker = Broker::new(BrokerConfig::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        broker.set_route(Arc::new(move |m: &Arc<Message>| {
            s.lock().unwrap().push(m.source.clone());
        }));
        let msg = |source| Message::new("a", Bytes::new(), QoS::AtMostOnce, false, source);
        broker.publish(msg(Source::Moqt));
        broker.publish(msg(Source::Http));
        // The route decides about echo (the bridge drops what came from MoQT).
        assert_eq!(*seen.lock().unwrap(), [Source::Moqt, Source::Http]);
        let tapped = Arc::new(AtomicU64::new(0));
        let t = tapped.clone();
        broker.set_tap(Arc::new(move |_| {
            t.fetch_add(1, Relaxed);
        }));
        broker.publish(msg(Source::Moqt));
        broker.publish(msg(Source::Http));
        assert_eq!(tapped.load(Relaxed), 1);
        assert_eq!(seen.lock().unwrap().len(), 2, "replaced");
    }

    #[test]
    fn sys_topics_go_only_to_explicit_sys_subscribers_every_interval() {
        let broker = Broker::new(BrokerConfig::default());
        let tapped = Arc::new(AtomicU64::new(0));
        let t = tapped.clone();
        broker.set_tap(Arc::new(move |_| {
            t.fetch_add(1, Relaxed);
        }));
        let (all, sys): (Arc<str>, Arc<str>) = ("all".into(), "sys".into());
        let (o, mut all_rx) = outbox(1, 100);
        broker.connect(&all, true, None, o).unwrap();
        let (o, mut sys_rx) = outbox(2, 100);
        broker.connect(&sys, true, None, o).unwrap();
        sub(&broker, &all, "#");
        sub(&broker, &all, "+/broker/#");
        sub(&broker, &sys, "$SYS/broker/clients/+");
        let t0 = Instant::now();
        broker.tick(t0);
        let got: Vec<(String, String)> = std::iter::from_fn(|| sys_rx.try_recv().ok())
            .map(|d| {
                assert_eq!(d.message.qos, QoS::AtMostOnce);
                assert!(d.message.retain);
                (
                    d.message.topic.to_string(),
                    String::from_utf8(d.message.payload.to_vec()).unwrap(),
                )
            })
            .collect();
        assert!(
            got.contains(&("$SYS/broker/clients/connected".into(), "2".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("$SYS/broker/clients/total".into(), "2".into())),
            "{got:?}"
        );
        assert!(all_rx.try_recv().is_err(), "`#` and `+` never match `$SYS`");
        assert_eq!(tapped.load(Relaxed), 0, "not bridged to MoQT");
        assert_eq!(broker.metrics.received(), 0, "not counted as received");
        // Retained: a later subscriber gets the current values at once.
        let late = sub(&broker, &all, "$SYS/broker/subscriptions/count");
        assert_eq!(&late[0].message.payload[..], b"3");
        // Not again before the interval; then only what changed.
        broker.tick(t0 + Duration::from_secs(9));
        assert!(sys_rx.try_recv().is_err());
        broker.disconnect(&all, 1, Vec::new(), None, None);
        broker.tick(t0 + Duration::from_secs(10));
        let got: Vec<(String, Bytes)> = std::iter::from_fn(|| sys_rx.try_recv().ok())
            .map(|d| (d.message.topic.to_string(), d.message.payload.clone()))
            .collect();
        // Total and maximum did not change.
        assert_eq!(
            got,
            [
                ("$SYS/broker/clients/connected".into(), Bytes::from("1")),
                ("$SYS/broker/clients/disconnected".into(), Bytes::from("1")),
            ]
        );
    }

    #[test]
    fn sys_interval_zero_publishes_nothing() {
        let broker = Broker::new(BrokerConfig {
            sys_interval: 0,
            ..BrokerConfig::default()
        });
        broker.tick(Instant::now());
        assert!(broker.retained("$SYS/broker/uptime").is_none());
    }

    #[test]
    fn sys_messages_are_not_persisted() {
        use crate::store::{Fsync, Recovery};
        let dir = std::env::temp_dir().join(format!("quichub-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let (store, rec) = Store::open(&dir, Fsync::Always, Recovery::Strict).unwrap();
            let broker = Broker::with_store(BrokerConfig::default(), store.clone(), rec);
            broker.tick(Instant::now());
            assert!(broker.retained("$SYS/broker/uptime").is_some());
            let mut m = qos1("kept");
            m.retain = true;
            let (_, ticket) = broker.publish_durable(m);
            let mut synced = store.synced();
            wait_synced(&mut synced, ticket);
            let text = broker.render_metrics();
            for line in [
                // `kept`: `$SYS` messages take no room under max_retained.
                "quichub_mqtt_retained_messages 1",
                "# TYPE quichub_mqtt_store_fsync_seconds summary",
                "# TYPE quichub_mqtt_store_bytes gauge",
            ] {
                assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
            }
            assert!(store.stats().fsyncs.load(Relaxed) >= 1);
            assert!(store.stats().bytes.load(Relaxed) > 0);
        }
        // The writer thread holds the directory's lock until it has seen
        // the store dropped.
        let deadline = Instant::now() + Duration::from_secs(10);
        let rec = loop {
            match Store::open(&dir, Fsync::Always, Recovery::Strict) {
                Ok((_, rec)) => break rec,
                Err(e) if Instant::now() < deadline && e.to_string().contains("in use") => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("{e}"),
            }
        };
        let topics: Vec<_> = rec
            .retained
            .iter()
            .map(|(_, m)| m.topic.to_string())
            .collect();
        assert_eq!(topics, ["kept"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Waits (blocking) until the store's synced ticket reaches `ticket`.
    fn wait_synced(rx: &mut watch::Receiver<u64>, ticket: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while *rx.borrow() < ticket {
            assert!(Instant::now() < deadline, "store never synced");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn config_deserialises_with_defaults_and_refuses_unknown_keys() {
        let c: BrokerConfig = serde_json::from_str(r#"{"max_queued": 5}"#).unwrap();
        assert_eq!(c.max_queued, 5);
        assert_eq!(c.max_sessions, BrokerConfig::default().max_sessions);
        assert!(serde_json::from_str::<BrokerConfig>(r#"{"max_queue": 5}"#).is_err());
    }
}
