//! The registry: which session publishes which namespace, which tracks exist,
//! who subscribed to namespaces. Guarded by one `std::sync::Mutex` that is never
//! held across an `.await`; per-track hot-path state lives in [`Track`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use moqt::error::request_error;
use moqt::{FullTrackName, TrackNamespace};
use quichub_net::Session;
use tokio::sync::{mpsc, watch, Notify};

use crate::access::{AllowAll, Authorizer};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::track::{Joined, Track, TrackStats};
use crate::upstream_fetch::{FetchKey, UpstreamFetch};

/// A read-only picture of the relay at one moment, for dashboards
/// ([`Relay::snapshot`]).
#[derive(Debug, Clone, Default)]
pub struct RelaySnapshot {
    /// Namespaces published with PUBLISH_NAMESPACE, sorted.
    pub namespaces: Vec<NamespaceSnapshot>,
    /// Tracks at the relay (subscribed upstream or pushed with PUBLISH), sorted by name.
    pub tracks: Vec<TrackSnapshot>,
    /// Established sessions.
    pub sessions: usize,
}

/// One published namespace.
#[derive(Debug, Clone)]
pub struct NamespaceSnapshot {
    /// The namespace.
    pub namespace: TrackNamespace,
    /// The publishing session's relay-wide id.
    pub session: u64,
}

/// One track.
#[derive(Debug, Clone)]
pub struct TrackSnapshot {
    /// Full name.
    pub name: FullTrackName,
    /// Relay-wide id (also the Track Alias used downstream).
    pub id: u64,
    /// How it gets its objects.
    pub origin: Origin,
    /// Downstream subscriptions holding it.
    pub subscribers: usize,
    /// Objects and bytes received.
    pub stats: TrackStats,
    /// Whether the upstream ended.
    pub ended: bool,
}

/// A boxed future, for the session and [`crate::cluster::Claims`] methods
/// called through `dyn`.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the registry needs of a session: its id, and for a session that
/// published a namespace, a way to subscribe upstream. Implemented by the
/// session module, so the registry names no session type (and the session
/// module stays the only one that speaks MoQT on the wire).
pub(crate) trait Peer: Send + Sync {
    /// The session's relay-wide id.
    fn id(&self) -> u64;

    /// Subscribes upstream to `entry`'s track on this (publisher's) session;
    /// resolves once the publisher accepted (SUBSCRIBE_OK) or refused.
    fn subscribe_upstream(
        self: Arc<Self>,
        relay: Arc<Relay>,
        entry: Arc<TrackEntry>,
    ) -> BoxFuture<Result<(), Refusal>>;

    /// Sends GOAWAY on the session's control stream (shutdown), with `uri`
    /// as its New Session URI (empty: none).
    fn send_goaway(self: Arc<Self>, timeout_ms: u64, uri: String) -> BoxFuture<()>;

    /// Sends `fetch`'s FETCH upstream on this session and feeds its response
    /// into it; resolves once the response is over ([`UpstreamFetch::finish`]
    /// was called).
    fn fetch_upstream(
        self: Arc<Self>,
        relay: Arc<Relay>,
        fetch: Arc<UpstreamFetch>,
    ) -> BoxFuture<()>;

    /// The session is ours to another relay (what it publishes here was
    /// learnt from there, [`crate::origin`]).
    fn is_origin(&self) -> bool {
        false
    }
}

/// A request failure to report with REQUEST_ERROR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// REQUEST_ERROR code.
    pub code: u64,
    /// Reason phrase.
    pub reason: String,
}

impl Refusal {
    /// Builds a refusal.
    pub fn new(code: u64, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
        }
    }
}

/// How a track gets its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The relay subscribed upstream on behalf of its subscribers; dropped when
    /// the last subscriber leaves.
    Subscribed,
    /// The publisher pushed it with PUBLISH; lives as long as the publisher.
    Published,
}

/// A track slot in the registry.
#[derive(Debug)]
pub struct TrackEntry {
    /// The track.
    pub track: Arc<Track>,
    /// How it is fed.
    pub origin: Origin,
    /// `None` while the upstream subscription is pending.
    pub(crate) ready: watch::Sender<Option<Result<(), Refusal>>>,
    /// Downstream subscriptions holding the track.
    pub subscribers: AtomicUsize,
    /// Wakes the upstream task to cancel the upstream subscription.
    pub(crate) cancel: Notify,
}

/// Namespace and track announcements queued per SUBSCRIBE_NAMESPACE or
/// SUBSCRIBE_TRACKS before the subscriber is dropped for not keeping up.
pub(crate) const EVENT_QUEUE: usize = 1024;

/// Namespace announcements sent to SUBSCRIBE_NAMESPACE subscribers.
#[derive(Debug, Clone)]
pub(crate) enum NamespaceEvent {
    /// A namespace became available.
    Added(TrackNamespace),
    /// A namespace was withdrawn.
    Removed(TrackNamespace),
}

struct NsSub {
    prefix: TrackNamespace,
    tx: mpsc::Sender<NamespaceEvent>,
}

struct TrackSub {
    prefix: TrackNamespace,
    tx: mpsc::Sender<Arc<TrackEntry>>,
}

#[derive(Default)]
struct State {
    namespaces: HashMap<TrackNamespace, Arc<dyn Peer>>,
    /// Which PUBLISH_NAMESPACE holds each namespace: a session that ends a
    /// namespace and publishes it again has two streams for it for a
    /// moment, and the old one's end must not withdraw the new one.
    ns_grants: HashMap<TrackNamespace, u64>,
    next_ns_grant: u64,
    tracks: HashMap<FullTrackName, Arc<TrackEntry>>,
    ns_subs: HashMap<u64, NsSub>,
    track_subs: HashMap<u64, TrackSub>,
    sessions: HashMap<u64, Arc<dyn Peer>>,
    /// Our sessions to other relays, by session id: the relay's URL, and
    /// the session (not in `sessions`, which holds clients).
    origins: HashMap<u64, (Arc<str>, Arc<dyn Peer>)>,
    /// Upstream FETCHes under way, shared by equal downstream requests
    /// (weak: one nobody reads any more stops, [`UpstreamFetch::unread`]).
    fetches: HashMap<FetchKey, std::sync::Weak<UpstreamFetch>>,
}

/// The relay's shared state.
pub struct Relay {
    /// Limits.
    pub config: Arc<Config>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    state: Mutex<State>,
    ids: AtomicU64,
    changed: Notify,
    shutdown: watch::Sender<bool>,
    authorizer: RwLock<Arc<dyn Authorizer>>,
    fanout: Arc<crate::fanout::Fanout>,
    claims: std::sync::OnceLock<Arc<dyn crate::cluster::Claims>>,
    /// The New Session URI of the GOAWAY a shutdown sends, when not the
    /// configured one ([`Relay::goaway_uri`]).
    goaway_uri: Mutex<Option<String>>,
}

impl Relay {
    /// A new, empty relay that lets every session do everything.
    pub fn new(config: Config) -> Arc<Self> {
        Self::with_authorizer(config, Arc::new(AllowAll))
    }

    /// A new, empty relay whose sessions get their permissions from `authorizer`.
    pub fn with_authorizer(config: Config, authorizer: Arc<dyn Authorizer>) -> Arc<Self> {
        Arc::new(Self {
            config: Arc::new(config),
            metrics: Arc::default(),
            state: Mutex::default(),
            ids: AtomicU64::new(1),
            changed: Notify::new(),
            shutdown: watch::channel(false).0,
            authorizer: RwLock::new(authorizer),
            fanout: Arc::default(),
            claims: Default::default(),
            goaway_uri: Mutex::new(None),
        })
    }

    /// A new track with a fresh relay-wide id, ready for this relay's
    /// fan-out (grouped by endpoint shard once [`Relay::start_shards`] ran).
    pub fn new_track(&self, name: FullTrackName) -> Track {
        Track::new(
            name,
            self.next_id(),
            self.config.clone(),
            self.metrics.clone(),
        )
        .with_fanout(self.fanout.clone())
    }

    /// Starts the datagram fan-out workers of the endpoint shards
    /// (`runtimes[i]` runs shard `i`); tracks created afterwards hand each
    /// object once to every other shard with subscribers. Once per relay.
    pub fn start_shards(&self, runtimes: &[tokio::runtime::Handle]) {
        if runtimes.len() > 1 && self.fanout.shards() == 0 {
            self.fanout.start(runtimes, self.metrics.clone());
        }
    }

    /// Replaces the authorizer (for example after the auth configuration was
    /// reloaded). Sessions set up from now on use it; established sessions
    /// keep the access they were given at SETUP.
    pub fn set_authorizer(&self, authorizer: Arc<dyn Authorizer>) {
        *self.authorizer.write().expect("authorizer lock") = authorizer;
    }

    /// The authorizer sessions set up now use.
    pub(crate) fn authorizer(&self) -> Arc<dyn Authorizer> {
        self.authorizer.read().expect("authorizer lock").clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("relay state lock")
    }

    /// A fresh relay-wide id (sessions, tracks, namespace subscriptions).
    pub fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Relaxed)
    }

    /// Registers a session; `false` when the session limit is reached.
    pub(crate) fn add_session(&self, s: Arc<dyn Peer>) -> bool {
        let mut st = self.lock();
        if st.sessions.len() >= self.config.max_sessions {
            return false;
        }
        st.sessions.insert(s.id(), s);
        true
    }

    /// Whether `max_sessions` sessions are open.
    pub(crate) fn sessions_full(&self) -> bool {
        self.lock().sessions.len() >= self.config.max_sessions
    }

    /// Takes a half-open slot (a connection that has not sent SETUP yet);
    /// `false` when `max_half_open_sessions` are already waiting.
    pub(crate) fn try_half_open(&self) -> bool {
        let n = self.metrics.sessions_half_open.fetch_add(1, Relaxed);
        if n >= self.config.max_half_open_sessions as i64 {
            self.metrics.sessions_half_open.fetch_sub(1, Relaxed);
            return false;
        }
        true
    }

    /// Gives back a slot taken by [`Relay::try_half_open`].
    pub(crate) fn end_half_open(&self) {
        self.metrics.sessions_half_open.fetch_sub(1, Relaxed);
    }

    /// Forgets a session and everything it published.
    pub(crate) fn remove_session(&self, id: u64) {
        let (withdrawn, ended, held): (Vec<TrackNamespace>, Vec<Arc<TrackEntry>>, bool) = {
            let mut st = self.lock();
            st.sessions.remove(&id);
            let mut held = false;
            let ns: Vec<_> = st
                .namespaces
                .iter()
                .filter(|(_, s)| s.id() == id)
                .map(|(n, s)| {
                    held = !s.is_origin();
                    n.clone()
                })
                .collect();
            for n in &ns {
                st.namespaces.remove(n);
            }
            // Tracks fed by our session to another relay are its upstream
            // tasks' to end or move ([`Relay::reattach`]).
            let origin =
                st.sessions.get(&id).is_some_and(|s| s.is_origin()) || st.origins.contains_key(&id);
            let tracks: Vec<_> = st
                .tracks
                .values()
                .filter(|e| e.track.publisher_session() == Some(id))
                .filter(|e| !(origin && e.origin == Origin::Subscribed))
                .cloned()
                .collect();
            for e in &tracks {
                st.tracks.remove(&e.track.name);
            }
            (ns, tracks, held)
        };
        // A publisher's namespaces are free again cluster-wide.
        let claims = held.then(|| self.claims()).flatten();
        for n in withdrawn {
            if let Some(c) = &claims {
                c.release(&n);
            }
            self.notify_namespace(NamespaceEvent::Removed(n));
        }
        for e in ended {
            e.track.end(moqt::error::publish_done::TRACK_ENDED);
            e.track.clear_cache();
            self.metrics.tracks.fetch_sub(1, Relaxed);
        }
    }

    /// Sessions, for GOAWAY on shutdown.
    pub(crate) fn sessions(&self) -> Vec<Arc<dyn Peer>> {
        self.lock().sessions.values().cloned().collect()
    }

    /// How many sessions are established (SETUP done, not yet closed).
    pub fn session_count(&self) -> usize {
        self.lock().sessions.len()
    }

    /// The New Session URI sessions are sent in GOAWAY: the one set with
    /// [`Relay::set_goaway_uri`], else `goaway_uri` of the configuration.
    pub fn goaway_uri(&self) -> String {
        self.goaway_uri
            .lock()
            .expect("goaway uri")
            .clone()
            .unwrap_or_else(|| self.config.goaway_uri.clone())
    }

    /// Sets the New Session URI of GOAWAY (e.g. another relay of the
    /// cluster, chosen at shutdown).
    pub fn set_goaway_uri(&self, uri: String) {
        *self.goaway_uri.lock().expect("goaway uri") = Some(uri);
    }

    /// Signals shutdown to every session task.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Whether shutdown began (no new sessions are welcome).
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// A receiver that flips to `true` on shutdown.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// PUBLISH_NAMESPACE: `session` serves tracks under `ns`. Returns the
    /// grant that [`Relay::unpublish_namespace`] names.
    pub(crate) fn publish_namespace(
        &self,
        ns: TrackNamespace,
        session: Arc<dyn Peer>,
    ) -> Result<u64, Refusal> {
        let stale = {
            let mut st = self.lock();
            let mut stale = Vec::new();
            if let Some(existing) = st.namespaces.get(&ns) {
                let old = existing.id();
                if old != session.id() {
                    // Latest publisher wins: a reconnecting publisher replaces its stale session.
                    tracing::info!(%ns, "namespace re-published by another session");
                    // Tracks subscribed at an old publisher's session
                    // (perhaps a dead one not yet timed out) must not catch
                    // new subscribers: they end, and new subscriptions go to
                    // the new one. (Tracks from another relay move by
                    // themselves when that session ends: `reattach`.)
                    let from_publisher = !existing.is_origin();
                    stale = st
                        .tracks
                        .values()
                        .filter(|e| {
                            from_publisher
                                && e.origin == Origin::Subscribed
                                && e.track.publisher_session() == Some(old)
                                && e.track.name.namespace.has_prefix(&ns)
                        })
                        .cloned()
                        .collect();
                    for e in &stale {
                        st.tracks.remove(&e.track.name);
                    }
                }
            }
            st.namespaces.insert(ns.clone(), session);
            st.next_ns_grant += 1;
            let grant = st.next_ns_grant;
            st.ns_grants.insert(ns.clone(), grant);
            (stale, grant)
        };
        let (stale, grant) = stale;
        for e in stale {
            e.cancel.notify_one();
            e.track.end(moqt::error::publish_done::TRACK_ENDED);
            e.track.clear_cache();
            self.metrics.tracks.fetch_sub(1, Relaxed);
        }
        self.notify_namespace(NamespaceEvent::Added(ns));
        self.changed.notify_waiters();
        Ok(grant)
    }

    /// Names session `id` (ours to another relay) by that relay's URL, for
    /// [`Relay::upstream_by_origin`]; `None` forgets it.
    pub(crate) fn label_origin(&self, id: u64, url: Option<(Arc<str>, Arc<dyn Peer>)>) {
        let mut st = self.lock();
        match url {
            Some(u) => st.origins.insert(id, u),
            None => st.origins.remove(&id),
        };
    }

    /// Each relay this one has a session to, with how many tracks it
    /// subscribes to there (one upstream subscription per track, however
    /// many subscribers here), sorted.
    pub fn upstream_by_origin(&self) -> Vec<(Arc<str>, usize)> {
        let st = self.lock();
        let mut by: std::collections::BTreeMap<Arc<str>, usize> =
            st.origins.values().map(|(u, _)| (u.clone(), 0)).collect();
        for e in st.tracks.values() {
            if e.origin == Origin::Published || e.track.is_ended() {
                continue;
            }
            let from = e
                .track
                .publisher_session()
                .and_then(|id| st.origins.get(&id));
            if let Some((u, _)) = from {
                *by.entry(u.clone()).or_default() += 1;
            }
        }
        by.into_iter().collect()
    }

    /// The session a FETCH for `name` goes to: the one feeding its track
    /// here (`entry`), or for a track not held here the publisher of its
    /// namespace (longest prefix), as for SUBSCRIBE (draft-18 §8.3.2).
    /// Never `asker` itself.
    pub(crate) fn fetch_source(
        &self,
        name: &FullTrackName,
        entry: Option<&TrackEntry>,
        asker: u64,
    ) -> Option<Arc<dyn Peer>> {
        let st = self.lock();
        let peer = match entry {
            // A track made in-process (the MQTT gateway) has no upstream.
            Some(e) => {
                let id = e.track.publisher_session()?;
                (st.sessions.get(&id).cloned()).or_else(|| st.origins.get(&id).map(|o| o.1.clone()))
            }
            None => Self::namespace_publisher(&st, &name.namespace),
        };
        peer.filter(|p| p.id() != asker)
    }

    /// The session publishing the longest prefix of `ns`.
    fn namespace_publisher(st: &State, ns: &TrackNamespace) -> Option<Arc<dyn Peer>> {
        st.namespaces
            .iter()
            .filter(|(n, _)| ns.has_prefix(n))
            .max_by_key(|(n, _)| n.fields().len())
            .map(|(_, s)| s.clone())
    }

    /// The upstream FETCH for `key` on `source`: the one under way if an
    /// equal request started it, else a new one.
    pub(crate) fn fetch_upstream(
        self: &Arc<Self>,
        key: FetchKey,
        source: Arc<dyn Peer>,
    ) -> Arc<UpstreamFetch> {
        let fetch = {
            let mut st = self.lock();
            if let Some(f) = st.fetches.get(&key).and_then(|f| f.upgrade()) {
                self.metrics.fetch_upstream_shared.fetch_add(1, Relaxed);
                return f;
            }
            let f = Arc::new(UpstreamFetch::new(
                key.clone(),
                self.config.clone(),
                self.metrics.clone(),
            ));
            st.fetches.insert(key, Arc::downgrade(&f));
            f
        };
        self.metrics.fetch_upstream.fetch_add(1, Relaxed);
        let relay = self.clone();
        // The task keeps one strong reference only (the one it feeds), so
        // the fetch is unread once every downstream FETCH dropped theirs.
        let (key, mine) = (fetch.key.clone(), Arc::downgrade(&fetch));
        let f = fetch.clone();
        tokio::spawn(async move {
            source.fetch_upstream(relay.clone(), f).await;
            let mut st = relay.lock();
            if st.fetches.get(&key).is_some_and(|g| g.ptr_eq(&mine)) {
                st.fetches.remove(&key);
            }
        });
        fetch
    }

    /// The session that publishes exactly `ns`, if any.
    pub(crate) fn namespace_owner(&self, ns: &TrackNamespace) -> Option<u64> {
        self.lock().namespaces.get(ns).map(|s| s.id())
    }

    /// `e` was pushed (PUBLISH) by a client session of this relay: not by
    /// our session to another relay, nor made in-process (the MQTT gateway).
    pub(crate) fn track_is_pushed_here(&self, e: &TrackEntry) -> bool {
        let Some(id) = e.track.publisher_session() else {
            return false;
        };
        let st = self.lock();
        !st.origins.contains_key(&id) && st.sessions.contains_key(&id)
    }

    /// `ns` is published here by our session to another relay (learnt, not
    /// held by a publisher of ours).
    pub(crate) fn namespace_is_learnt(&self, ns: &TrackNamespace) -> bool {
        self.lock()
            .namespaces
            .get(ns)
            .is_some_and(|s| s.is_origin())
    }

    /// Makes this relay one of a cluster: namespaces its publishers announce
    /// are claimed cluster-wide first ([`crate::cluster`]). Set once, before
    /// sessions arrive; `false` if already set.
    pub fn set_claims(&self, claims: Arc<dyn crate::cluster::Claims>) -> bool {
        self.claims.set(claims).is_ok()
    }

    /// The cluster's claims, if this relay is in one.
    pub(crate) fn claims(&self) -> Option<Arc<dyn crate::cluster::Claims>> {
        self.claims.get().cloned()
    }

    /// Withdraws a namespace if `session` still owns it, through `grant`
    /// when given (the PUBLISH_NAMESPACE that published it, not a later one
    /// of the same session); `true` if it did.
    pub(crate) fn unpublish_namespace(
        &self,
        ns: &TrackNamespace,
        session_id: u64,
        grant: Option<u64>,
    ) -> bool {
        let removed = {
            let mut st = self.lock();
            let current = grant.is_none_or(|g| st.ns_grants.get(ns) == Some(&g));
            match st.namespaces.get(ns) {
                Some(s) if s.id() == session_id && current => {
                    st.namespaces.remove(ns);
                    st.ns_grants.remove(ns);
                    true
                }
                _ => false,
            }
        };
        if removed {
            self.notify_namespace(NamespaceEvent::Removed(ns.clone()));
        }
        removed
    }

    fn notify_namespace(&self, ev: NamespaceEvent) {
        let mut st = self.lock();
        let ns = match &ev {
            NamespaceEvent::Added(n) | NamespaceEvent::Removed(n) => n,
        };
        // A subscriber that does not read its stream falls behind: it is
        // dropped (its stream is reset) rather than queued for without bound.
        st.ns_subs
            .retain(|_, sub| !ns.has_prefix(&sub.prefix) || sub.tx.try_send(ev.clone()).is_ok());
    }

    /// SUBSCRIBE_NAMESPACE: registers interest; returns the namespaces already
    /// published under `prefix` and a channel of later changes.
    pub(crate) fn subscribe_namespace(
        &self,
        id: u64,
        prefix: TrackNamespace,
    ) -> (Vec<TrackNamespace>, mpsc::Receiver<NamespaceEvent>) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut st = self.lock();
        let mut existing: Vec<_> = st
            .namespaces
            .keys()
            .filter(|n| n.has_prefix(&prefix))
            .cloned()
            .collect();
        existing.sort();
        st.ns_subs.insert(id, NsSub { prefix, tx });
        (existing, rx)
    }

    /// Ends a namespace subscription.
    pub(crate) fn unsubscribe_namespace(&self, id: u64) {
        self.lock().ns_subs.remove(&id);
    }

    /// SUBSCRIBE_TRACKS: existing published tracks under `prefix` and later ones.
    pub fn subscribe_tracks(
        &self,
        id: u64,
        prefix: TrackNamespace,
    ) -> (Vec<Arc<TrackEntry>>, mpsc::Receiver<Arc<TrackEntry>>) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut st = self.lock();
        let existing = st
            .tracks
            .values()
            .filter(|e| e.track.name.namespace.has_prefix(&prefix) && e.origin == Origin::Published)
            .cloned()
            .collect();
        st.track_subs.insert(id, TrackSub { prefix, tx });
        (existing, rx)
    }

    /// Ends a SUBSCRIBE_TRACKS.
    pub(crate) fn unsubscribe_tracks(&self, id: u64) {
        self.lock().track_subs.remove(&id);
    }

    /// PUBLISH: registers a track pushed by `session`. Refused if the name is
    /// already published by another live session.
    pub fn publish_track(&self, track: Arc<Track>) -> Result<Arc<TrackEntry>, Refusal> {
        let entry = Arc::new(TrackEntry {
            track: track.clone(),
            origin: Origin::Published,
            ready: watch::channel(Some(Ok(()))).0,
            subscribers: AtomicUsize::new(0),
            cancel: Notify::new(),
        });
        {
            let mut st = self.lock();
            if st.tracks.len() >= self.config.max_tracks {
                return Err(Refusal::new(request_error::EXCESSIVE_LOAD, "track limit"));
            }
            if let Some(old) = st.tracks.get(&track.name) {
                if !old.track.is_ended() && old.origin == Origin::Published {
                    return Err(Refusal::new(
                        request_error::DUPLICATE_SUBSCRIPTION,
                        "track already published",
                    ));
                }
                old.cancel.notify_one();
            }
            st.tracks.insert(track.name.clone(), entry.clone());
            st.track_subs.retain(|_, sub| {
                !track.name.namespace.has_prefix(&sub.prefix)
                    || sub.tx.try_send(entry.clone()).is_ok()
            });
        }
        self.metrics.tracks.fetch_add(1, Relaxed);
        self.changed.notify_waiters();
        Ok(entry)
    }

    /// Ends a published track (PUBLISH_DONE from its publisher, or its stream closed).
    pub fn unpublish_track(&self, entry: &Arc<TrackEntry>, status: u64) {
        let removed = {
            let mut st = self.lock();
            match st.tracks.get(&entry.track.name) {
                Some(e) if Arc::ptr_eq(e, entry) => {
                    st.tracks.remove(&entry.track.name);
                    true
                }
                _ => false,
            }
        };
        entry.track.end(status);
        if removed {
            entry.track.clear_cache();
            self.metrics.tracks.fetch_sub(1, Relaxed);
        }
    }

    /// Finds or creates a track for a downstream subscriber, subscribing upstream
    /// once per track. Waits up to `rendezvous` for a publisher to appear.
    ///
    /// The subscriber joins the track's fan-out before the upstream answers, so
    /// the first objects after SUBSCRIBE_OK cannot slip past it.
    ///
    /// `new_group`: the subscriber's NEW_GROUP_REQUEST, carried by the
    /// upstream SUBSCRIBE when this one creates the track, else passed on
    /// by REQUEST_UPDATE ([`Track::request_new_group`]).
    pub(crate) async fn acquire_track(
        self: &Arc<Self>,
        name: &FullTrackName,
        rendezvous: Duration,
        session: &Session,
        new_group: Option<u64>,
    ) -> Result<(Arc<TrackEntry>, Joined), Refusal> {
        let (entry, joined) = self
            .acquire_with(name, rendezvous, new_group, |t| t.join(session))
            .await?;
        if let Some(v) = new_group {
            entry.track.request_new_group(v, true);
        }
        Ok((entry, joined))
    }

    /// Finds or creates a track for an in-process consumer, subscribing
    /// upstream once per track and waiting up to `rendezvous` for a
    /// publisher, as for a subscriber's SUBSCRIBE (datagram objects on `tx`,
    /// as [`Track::join_local`]); give it back with [`Relay::release_local`].
    pub async fn acquire_local(
        self: &Arc<Self>,
        name: &FullTrackName,
        rendezvous: Duration,
        tx: mpsc::Sender<Arc<crate::object::Object>>,
    ) -> Result<(Arc<TrackEntry>, Joined), Refusal> {
        self.acquire_with(name, rendezvous, None, |t| t.join_local(tx.clone()))
            .await
    }

    /// An in-process consumer from [`Relay::acquire_local`] is done.
    pub fn release_local(&self, entry: &Arc<TrackEntry>) {
        self.release_track(entry);
    }

    async fn acquire_with(
        self: &Arc<Self>,
        name: &FullTrackName,
        rendezvous: Duration,
        new_group: Option<u64>,
        join: impl Fn(&Arc<Track>) -> Joined,
    ) -> Result<(Arc<TrackEntry>, Joined), Refusal> {
        let deadline = tokio::time::Instant::now() + rendezvous;
        loop {
            // Register for wake-ups before looking, so a publish in between is not missed.
            let changed = self.changed.notified();
            match self.try_acquire(name, new_group) {
                Ok(Some(entry)) => {
                    let joined = join(&entry.track);
                    let mut ready = entry.ready.subscribe();
                    let outcome = ready
                        .wait_for(|r| r.is_some())
                        .await
                        .map(|r| r.clone().expect("is_some"))
                        .unwrap_or_else(|_| {
                            Err(Refusal::new(request_error::INTERNAL_ERROR, "upstream gone"))
                        });
                    match outcome {
                        Ok(()) => {
                            entry.subscribers.fetch_add(1, Relaxed);
                            return Ok((entry, joined));
                        }
                        // A subscriber waiting for a publisher keeps waiting
                        // when the namespace's publisher does not have the
                        // track yet (it announced the namespace before
                        // setting the track up) or pushed it meanwhile.
                        Err(r)
                            if !rendezvous.is_zero()
                                && tokio::time::Instant::now() < deadline
                                && (r.code == request_error::DOES_NOT_EXIST
                                    || self.is_published(name)) =>
                        {
                            self.metrics.rendezvous_retries.fetch_add(1, Relaxed);
                        }
                        Err(r) => return Err(r),
                    }
                }
                Ok(None) => {}
                Err(r) => return Err(r),
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(if rendezvous.is_zero() {
                    Refusal::new(request_error::DOES_NOT_EXIST, "no publisher for this track")
                } else {
                    Refusal::new(
                        request_error::TIMEOUT,
                        "no publisher within the rendezvous timeout",
                    )
                });
            }
        }
    }

    /// Whether `name` is a track pushed by a publisher (PUBLISH) right now.
    fn is_published(&self, name: &FullTrackName) -> bool {
        self.lock()
            .tracks
            .get(name)
            .is_some_and(|e| e.origin == Origin::Published && !e.track.is_ended())
    }

    /// One attempt: the existing entry, or a new pending one whose upstream
    /// subscription is started; `None` when nobody publishes the namespace.
    fn try_acquire(
        self: &Arc<Self>,
        name: &FullTrackName,
        new_group: Option<u64>,
    ) -> Result<Option<Arc<TrackEntry>>, Refusal> {
        let (entry, publisher) = {
            let mut st = self.lock();
            if let Some(e) = st.tracks.get(name) {
                if !e.track.is_ended() {
                    return Ok(Some(e.clone()));
                }
            }
            let Some(publisher) = Self::namespace_publisher(&st, &name.namespace) else {
                return Ok(None);
            };
            if st.tracks.len() >= self.config.max_tracks {
                return Err(Refusal::new(request_error::EXCESSIVE_LOAD, "track limit"));
            }
            let track = Arc::new(self.new_track(name.clone()));
            if let Some(v) = new_group {
                // Before the upstream SUBSCRIBE is sent, which carries it.
                track.request_new_group(v, false);
            }
            let entry = Arc::new(TrackEntry {
                track,
                origin: Origin::Subscribed,
                ready: watch::channel(None).0,
                subscribers: AtomicUsize::new(0),
                cancel: Notify::new(),
            });
            st.tracks.insert(name.clone(), entry.clone());
            (entry, publisher)
        };
        self.metrics.tracks.fetch_add(1, Relaxed);
        let relay = self.clone();
        let e = entry.clone();
        tokio::spawn(async move {
            let outcome = publisher.subscribe_upstream(relay.clone(), e.clone()).await;
            if let Err(r) = outcome {
                relay.drop_entry(&e);
                e.ready.send_replace(Some(Err(r)));
            }
        });
        Ok(Some(entry))
    }

    /// `entry`'s upstream session (`old`, ours to another relay) is gone:
    /// subscribes again on the session that publishes its namespace now,
    /// waiting for one up to the rendezvous timeout (`max_rendezvous_ms`),
    /// as long as the track has subscribers. `false`: it ends.
    pub(crate) async fn reattach(self: &Arc<Self>, entry: &Arc<TrackEntry>, old: u64) -> bool {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.max_rendezvous_ms);
        entry.track.expect_groups_from_largest();
        loop {
            let changed = self.changed.notified();
            if entry.subscribers.load(Relaxed) == 0 || *self.shutdown.borrow() {
                return false;
            }
            let publisher = {
                let st = self.lock();
                match st.tracks.get(&entry.track.name) {
                    Some(e) if Arc::ptr_eq(e, entry) => {}
                    _ => return false,
                }
                Self::namespace_publisher(&st, &entry.track.name.namespace)
                    .filter(|s| s.id() != old)
            };
            if let Some(p) = publisher {
                let name = entry.track.name.clone();
                return match p.subscribe_upstream(self.clone(), entry.clone()).await {
                    Ok(()) => {
                        self.metrics.upstream_reattached.fetch_add(1, Relaxed);
                        tracing::info!(track = %name, "upstream moved to another relay; subscribers kept");
                        true
                    }
                    Err(r) => {
                        tracing::info!(track = %name, "upstream gone, and refused elsewhere: {}", r.reason);
                        false
                    }
                };
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }

    /// A downstream subscriber is done with a track; the last one out of a
    /// relay-subscribed track cancels the upstream subscription.
    pub(crate) fn release_track(&self, entry: &Arc<TrackEntry>) {
        if entry.subscribers.fetch_sub(1, Relaxed) == 1 && entry.origin == Origin::Subscribed {
            let removed = {
                let mut st = self.lock();
                // Re-check under the lock: a new subscriber may have arrived.
                if entry.subscribers.load(Relaxed) == 0 {
                    match st.tracks.get(&entry.track.name) {
                        Some(e) if Arc::ptr_eq(e, entry) => {
                            st.tracks.remove(&entry.track.name);
                            true
                        }
                        _ => false,
                    }
                } else {
                    false
                }
            };
            if removed {
                entry.cancel.notify_one();
                entry.track.clear_cache();
                self.metrics.tracks.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Removes an entry whose upstream failed or ended.
    pub(crate) fn drop_entry(&self, entry: &Arc<TrackEntry>) {
        let removed = {
            let mut st = self.lock();
            match st.tracks.get(&entry.track.name) {
                Some(e) if Arc::ptr_eq(e, entry) => {
                    st.tracks.remove(&entry.track.name);
                    true
                }
                _ => false,
            }
        };
        if removed {
            entry.track.clear_cache();
            self.metrics.tracks.fetch_sub(1, Relaxed);
        }
    }

    /// Namespaces, tracks and their counters at this moment. Takes the
    /// registry lock once, then each track's lock in turn (never both).
    pub fn snapshot(&self) -> RelaySnapshot {
        let (mut namespaces, entries, sessions) = {
            let st = self.lock();
            let ns: Vec<NamespaceSnapshot> = st
                .namespaces
                .iter()
                .map(|(n, s)| NamespaceSnapshot {
                    namespace: n.clone(),
                    session: s.id(),
                })
                .collect();
            let entries: Vec<Arc<TrackEntry>> = st.tracks.values().cloned().collect();
            (ns, entries, st.sessions.len())
        };
        namespaces.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        let mut tracks: Vec<TrackSnapshot> = entries
            .iter()
            .map(|e| TrackSnapshot {
                name: e.track.name.clone(),
                id: e.track.id,
                origin: e.origin,
                subscribers: e.subscribers.load(Relaxed),
                stats: e.track.stats(),
                ended: e.track.is_ended(),
            })
            .collect();
        tracks.sort_by(|a, b| {
            (&a.name.namespace, &a.name.name).cmp(&(&b.name.namespace, &b.name.name))
        });
        RelaySnapshot {
            namespaces,
            tracks,
            sessions,
        }
    }

    /// A live track by name, without subscribing upstream (for FETCH and TRACK_STATUS).
    pub fn find_track(&self, name: &FullTrackName) -> Option<Arc<TrackEntry>> {
        let st = self.lock();
        st.tracks
            .get(name)
            .filter(|e| matches!(*e.ready.borrow(), Some(Ok(()))))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session whose upstream FETCHes stay unanswered until told.
    struct SlowPeer {
        answer: tokio::sync::Semaphore,
    }

    impl Peer for SlowPeer {
        fn id(&self) -> u64 {
            77
        }
        fn subscribe_upstream(
            self: Arc<Self>,
            _: Arc<Relay>,
            _: Arc<TrackEntry>,
        ) -> BoxFuture<Result<(), Refusal>> {
            Box::pin(async { Err(Refusal::new(0, "no")) })
        }
        fn send_goaway(self: Arc<Self>, _: u64, _: String) -> BoxFuture<()> {
            Box::pin(async {})
        }
        fn fetch_upstream(
            self: Arc<Self>,
            _: Arc<Relay>,
            fetch: Arc<UpstreamFetch>,
        ) -> BoxFuture<()> {
            Box::pin(async move {
                let _ = self.answer.acquire().await;
                fetch.finish(crate::upstream_fetch::Outcome::Complete);
            })
        }
    }

    /// A session that ends a namespace and publishes it again: the first
    /// PUBLISH_NAMESPACE's end, handled after the second, leaves it published.
    #[test]
    fn an_old_publish_namespace_does_not_withdraw_a_new_one() {
        let relay = Relay::new(Config::default());
        let peer = Arc::new(SlowPeer {
            answer: tokio::sync::Semaphore::new(0),
        });
        let ns = TrackNamespace::from_path("live/room");
        let first = relay.publish_namespace(ns.clone(), peer.clone()).unwrap();
        let second = relay.publish_namespace(ns.clone(), peer.clone()).unwrap();
        assert_ne!(first, second);
        assert!(!relay.unpublish_namespace(&ns, 77, Some(first)));
        assert!(relay.lock().namespaces.contains_key(&ns));
        assert!(relay.unpublish_namespace(&ns, 77, Some(second)));
        assert!(!relay.lock().namespaces.contains_key(&ns));
    }

    #[tokio::test]
    async fn equal_fetches_share_one_upstream_fetch_while_it_is_under_way() {
        let relay = Relay::new(Config::default());
        let peer = Arc::new(SlowPeer {
            answer: tokio::sync::Semaphore::new(0),
        });
        let key = |start| FetchKey {
            track: FullTrackName::new("a", "b"),
            start: moqt::Location::new(start, 0),
            end: moqt::Location::new(9, 0),
            descending: false,
        };
        let first = relay.fetch_upstream(key(0), peer.clone());
        let second = relay.fetch_upstream(key(0), peer.clone());
        assert!(Arc::ptr_eq(&first, &second));
        let other = relay.fetch_upstream(key(1), peer.clone());
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(relay.metrics.fetch_upstream.load(Relaxed), 2);
        assert_eq!(relay.metrics.fetch_upstream_shared.load(Relaxed), 1);
        // Once over, the next equal request is a FETCH of its own.
        peer.answer.add_permits(2);
        while relay.lock().fetches.contains_key(&key(0)) {
            tokio::task::yield_now().await;
        }
        let third = relay.fetch_upstream(key(0), peer.clone());
        assert!(!Arc::ptr_eq(&first, &third));
        assert_eq!(relay.metrics.fetch_upstream.load(Relaxed), 3);
    }

    #[tokio::test]
    async fn snapshot_lists_tracks_sorted_with_counters() {
        let relay = Relay::new(Config::default());
        for name in ["video", "audio"] {
            let t = Arc::new(Track::new(
                FullTrackName::new("live/demo", name),
                relay.next_id(),
                relay.config.clone(),
                relay.metrics.clone(),
            ));
            relay.publish_track(t).unwrap();
        }
        let s = relay.snapshot();
        let names: Vec<_> = s.tracks.iter().map(|t| t.name.name.clone()).collect();
        assert_eq!(names, ["audio", "video"]);
        assert!(s.tracks.iter().all(|t| t.origin == Origin::Published
            && t.subscribers == 0
            && t.stats.objects == 0
            && !t.ended));
        assert!(s.namespaces.is_empty());
    }
}
