//! One MoQT session at the relay. The relay is the publisher towards its
//! subscribers and the subscriber towards its publishers, so this module speaks
//! both roles: it answers requests the peer opens, and opens SUBSCRIBE (and
//! PUBLISH for SUBSCRIBE_TRACKS) towards the peer.
//!
//! This module holds the session's lifecycle (accept, SETUP, limits, GOAWAY,
//! expiry, revocation) and the request dispatch with its one authorisation point
//! ([`authorize`]); each concern has its own part:
//! - `ingest`: data from publishers (subgroup streams, datagrams, early datagrams);
//! - `upstream`: SUBSCRIBE and FETCH sent towards publishers (the [`Peer`] side core calls);
//! - `subscribe`: downstream SUBSCRIBE, REQUEST_UPDATE, delivery, TRACK_STATUS;
//! - `fetch`: FETCH, from the cache and from upstream;
//! - `namespace`: PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE, SUBSCRIBE_TRACKS;
//! - `publish`: PUBLISH from peers, and towards SUBSCRIBE_TRACKS subscribers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use moqt::deviation::{Deviation, Dialect};
use moqt::error::request_error;
use moqt::message::{setup_option, FetchKind, GoAway, Message, RequestError, Setup};
use moqt::session::{check_client_setup, make_setup, ControlState, RequestIds, Role, SessionError};
use moqt::{Location, SessionErrorCode, TrackNamespace};
use quichub_net::alias::AliasTable;
use quichub_net::io::{write_message, DeviationSink, MessageReader, ReadError};
use quichub_net::rate::TokenBucket;
use quichub_net::server::Accepted;
use quichub_net::sniff::EarlyStream;
use quichub_net::Transport;
use quichub_net::{RecvStream, SendStream, Session};
use tokio::sync::{watch, Notify};

use crate::access::{AllowAll, ConnectInfo, Denied, Operation, SessionAccess};
use crate::core::{BoxFuture, Peer, Refusal, Relay, TrackEntry};
use crate::track::Track;

mod fetch;
mod ingest;
mod namespace;
mod publish;
mod subscribe;
mod upstream;

use fetch::on_fetch;
use ingest::{on_datagram, on_uni};
use namespace::{on_publish_namespace, on_subscribe_namespace, on_subscribe_tracks};
use publish::on_publish;
use subscribe::{on_subscribe, on_track_status};

/// Our MOQT_IMPLEMENTATION string.
pub(crate) const IMPLEMENTATION: &str = concat!("quichub/", env!("CARGO_PKG_VERSION"));

/// A downstream subscription's facts needed by a Joining FETCH.
/// and by the revocation check.
struct SubInfo {
    entry: Arc<TrackEntry>,
    joining: Option<Location>,
    forward: bool,
    /// The AUTHORIZATION_TOKEN values it was authorised with (for a track
    /// pushed to a SUBSCRIBE_TRACKS subscriber: that request's).
    tokens: Vec<Bytes>,
    /// Signalled when a reload of the auth revoked the right to read the
    /// track: the subscription ends with PUBLISH_DONE UNAUTHORIZED.
    revoked: Arc<Notify>,
}

/// State shared by the tasks of one session.
pub(crate) struct SessionHandle {
    /// Relay-wide id.
    pub(crate) id: u64,
    /// The transport session.
    pub(crate) session: Session,
    /// Raw QUIC or WebTransport.
    pub(crate) transport: Transport,
    /// The peer's address.
    remote: SocketAddr,
    /// WebTransport: the CONNECT URL's path and query.
    path: Option<String>,
    /// What the session may do, set at SETUP by the relay's authorizer.
    access: OnceLock<Arc<dyn SessionAccess>>,
    request_ids: Mutex<RequestIds>,
    /// Track Aliases the peer chose for tracks it publishes to us, with
    /// the datagrams that came before their alias.
    aliases: AliasTable<Arc<Track>>,
    control: tokio::sync::Mutex<Option<SendStream>>,
    setup: watch::Sender<bool>,
    control_seen: AtomicBool,
    /// Holds a half-open slot of the relay until SETUP arrives.
    half_open: AtomicBool,
    /// Counted in `max_sessions` (SETUP arrived and was admitted).
    established: AtomicBool,
    open_requests: AtomicUsize,
    /// `max_requests_per_second` (None: no limit).
    request_rate: Mutex<Option<TokenBucket>>,
    subscriptions: Mutex<HashMap<u64, SubInfo>>,
    /// Tracks this session subscribes to (one subscription per track, §5.1).
    subscribed: Mutex<std::collections::HashSet<moqt::FullTrackName>>,
    ns_prefixes: Mutex<HashMap<u64, TrackNamespace>>,
    track_prefixes: Mutex<HashMap<u64, TrackNamespace>>,
    goaway_sent: AtomicBool,
    /// Server: a client connected to the relay. Client: the relay opened it
    /// towards another relay (its origin, [`serve_origin`]).
    role: Role,
    /// Client role: the SETUP options that name what we connect to (PATH and
    /// AUTHORITY on raw QUIC).
    setup_target: Option<(String, String)>,
    /// Client role: the origin sent GOAWAY.
    goaway_received: AtomicBool,
    /// Client role: the New Session URI of the origin's GOAWAY.
    goaway_uri: Mutex<Option<String>>,
    /// Server role: another relay of a registry cluster follows us on this
    /// session: its URL's query has `cluster=peer` and its credentials are
    /// the cluster's ([`SessionAccess::cluster_member`], [`crate::cluster`]).
    cluster_peer: AtomicBool,
    /// Our FETCHes to this peer waiting for their data stream, by Request ID.
    fetch_streams: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<(RecvStream, Bytes)>>>,
    /// Counts the departures from draft 18 accepted in the peer's messages
    /// (`quichub_interop_deviations_total`).
    deviations: DeviationSink,
    /// What the peer's SETUP says about the draft-18 it reads
    /// ([`Dialect::of`]); [`Dialect::Draft18`] until then.
    dialect: OnceLock<Dialect>,
}

/// Holds a track name in [`SessionHandle`]'s subscribed set until dropped.
struct Reservation<'a> {
    set: &'a Mutex<std::collections::HashSet<moqt::FullTrackName>>,
    name: moqt::FullTrackName,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.set.lock().expect("subscribed").remove(&self.name);
    }
}

/// Counts an open request for the request limit; released on drop, or as
/// soon as the request is refused (before the refusal is sent, so a peer that
/// reacts to it at once finds the slot free).
struct RequestSlot<'a> {
    counter: &'a AtomicUsize,
    released: AtomicBool,
}

impl RequestSlot<'_> {
    fn release(&self) {
        if !self.released.swap(true, Relaxed) {
            self.counter.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for RequestSlot<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

type Result<T, E = SessionError> = std::result::Result<T, E>;

fn read_err(e: ReadError) -> SessionError {
    match e {
        ReadError::Decode(d) => d.into(),
        ReadError::Truncated => SessionError::protocol("stream ended mid-message"),
        ReadError::Finished => SessionError::protocol("stream ended"),
        ReadError::Stream(s) => SessionError::protocol(s),
    }
}

impl SessionHandle {
    fn new(relay: &Relay, accepted: Accepted, role: Role) -> Self {
        let Accepted {
            session,
            transport,
            path,
            remote,
            ..
        } = accepted;
        let c = &relay.config;
        Self {
            id: relay.next_id(),
            session,
            transport,
            remote,
            path,
            access: OnceLock::new(),
            request_ids: Mutex::new(RequestIds::new(role)),
            aliases: AliasTable::default(),
            control: tokio::sync::Mutex::new(None),
            setup: watch::channel(false).0,
            control_seen: AtomicBool::new(false),
            half_open: AtomicBool::new(false),
            established: AtomicBool::new(false),
            open_requests: AtomicUsize::new(0),
            request_rate: Mutex::new(TokenBucket::new(
                c.max_requests_per_second,
                c.request_burst,
                Instant::now(),
            )),
            subscriptions: Mutex::default(),
            subscribed: Mutex::default(),
            ns_prefixes: Mutex::default(),
            track_prefixes: Mutex::default(),
            goaway_sent: AtomicBool::new(false),
            role,
            setup_target: None,
            goaway_received: AtomicBool::new(false),
            goaway_uri: Mutex::new(None),
            cluster_peer: AtomicBool::new(false),
            fetch_streams: Mutex::default(),
            deviations: {
                let metrics = relay.metrics.clone();
                Arc::new(move |d: Deviation| metrics.deviation(d))
            },
            dialect: OnceLock::new(),
        }
    }

    /// Reads the peer's messages from `stream` (after `prefix`, already
    /// read), counting the deviations from draft 18 they need.
    fn reader(&self, stream: RecvStream, prefix: &[u8]) -> MessageReader {
        MessageReader::new(stream, prefix).with_deviations(self.deviations.clone())
    }

    /// What the peer's SETUP said about the draft-18 it reads.
    fn dialect(&self) -> Dialect {
        self.dialect.get().copied().unwrap_or_default()
    }

    /// LARGEST_OBJECT for a message to the peer: `largest`, unless the
    /// peer cannot read it ([`Dialect::withholds_largest_object`]; counted).
    fn largest_for_peer(&self, largest: Option<Location>) -> Option<Location> {
        if largest.is_some() && self.dialect().withholds_largest_object() {
            (self.deviations)(Deviation::LargestObjectWithheld);
            return None;
        }
        largest
    }

    /// Closes the session with a session error.
    pub(crate) fn fail(&self, relay: &Relay, e: &SessionError) {
        if let Some(reason) = self.session.close_reason() {
            // The peer (or the endpoint) closed first: what failed was a read
            // on a connection already gone, not a violation by the peer.
            tracing::debug!(session = self.id, "session closed: {reason}");
            return;
        }
        if e.code == SessionErrorCode::ProtocolViolation {
            relay.metrics.protocol_violations.fetch_add(1, Relaxed);
        }
        tracing::info!(session = self.id, code = ?e.code, reason = %e.reason, "closing session");
        self.session.close(e.code.code(), e.reason.as_bytes());
    }

    /// What the session may do: [`AllowAll`] until SETUP set it (no request
    /// is served before SETUP).
    fn access(&self) -> &dyn SessionAccess {
        match self.access.get() {
            Some(a) => a.as_ref(),
            None => &AllowAll,
        }
    }

    /// After a change of the auth in force that left the session up: ends
    /// each open subscription whose track it may no longer read.
    fn revoke_subscriptions(&self) {
        let access = self.access();
        for info in self.subscriptions.lock().expect("subs").values() {
            let op = Operation::Subscribe {
                track: &info.entry.track.name,
                tokens: &info.tokens,
            };
            if !access.still_allows(&op) {
                info.revoked.notify_one();
            }
        }
    }

    /// What the authorizer is told about this session, from its SETUP.
    fn connect_info(&self, setup: &Setup) -> ConnectInfo {
        let path = match self.transport {
            Transport::WebTransport | Transport::WebSocket => self.path.clone(),
            // A PATH that is not UTF-8 names nothing an authorizer could match.
            Transport::Quic => setup
                .path()
                .and_then(|p| String::from_utf8(p.to_vec()).ok()),
        };
        ConnectInfo {
            path,
            remote: self.remote,
            setup_token: setup
                .bytes_option(setup_option::AUTHORIZATION_TOKEN)
                .cloned(),
        }
    }

    /// A reserved track only another relay of the cluster may read
    /// (`.quichub/...`, [`crate::cluster`]); the authorizer still decides.
    fn may_read_cluster_track(&self, track: &moqt::FullTrackName) -> bool {
        self.cluster_peer.load(Relaxed) && crate::cluster::is_cluster_namespace(&track.namespace)
    }

    /// Takes one of the session's requests per second, or says how long
    /// until it has one. Another relay of the cluster asks on behalf of
    /// all its own clients: it is not limited.
    fn admit_request(&self) -> Result<(), Duration> {
        if self.cluster_peer.load(Relaxed) {
            return Ok(());
        }
        match self.request_rate.lock().expect("rate").as_mut() {
            Some(b) => b.try_take(1, Instant::now()),
            None => Ok(()),
        }
    }

    /// A REQUEST_UPDATE counts as a request but waits for its turn rather
    /// than being refused: a refused update ends the request it updates
    /// (draft-18, REQUEST_UPDATE), which would punish a client for the
    /// rate of its other requests.
    async fn pace_update(&self, relay: &Relay) {
        if self.cluster_peer.load(Relaxed) {
            return;
        }
        let wait = match self.request_rate.lock().expect("rate").as_mut() {
            Some(b) => b.take(1, Instant::now()),
            None => return,
        };
        if !wait.is_zero() {
            relay.metrics.requests_delayed.fetch_add(1, Relaxed);
            tokio::time::sleep(wait).await;
        }
    }

    fn next_request_id(&self) -> u64 {
        self.request_ids.lock().expect("ids").next()
    }

    async fn wait_setup(&self) {
        let mut rx = self.setup.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Sends GOAWAY on our control stream (for shutdown).
    async fn goaway(&self, timeout_ms: u64, uri: &str) {
        if self.goaway_sent.swap(true, Relaxed) {
            return;
        }
        let floor = self.request_ids.lock().expect("ids").peer_floor();
        // Another relay of the cluster follows the registry, not us: it is
        // sent nowhere (a redirect would make it follow a member twice).
        let uri = if self.cluster_peer.load(Relaxed) {
            ""
        } else {
            uri
        };
        let msg = Message::GoAway(GoAway {
            new_session_uri: Bytes::copy_from_slice(uri.as_bytes()),
            timeout: timeout_ms,
            request_id: Some(floor),
        });
        // May wait while the peer's flow control holds the control stream;
        // shutdown sends every session's GOAWAY at once, within its drain.
        if let Some(s) = self.control.lock().await.as_mut() {
            let _ = write_message(s, &msg).await;
        }
    }
}

impl Peer for SessionHandle {
    fn id(&self) -> u64 {
        self.id
    }

    fn subscribe_upstream(
        self: Arc<Self>,
        relay: Arc<Relay>,
        entry: Arc<TrackEntry>,
    ) -> BoxFuture<Result<(), Refusal>> {
        Box::pin(async move { self.open_upstream(&relay, entry).await })
    }

    fn send_goaway(self: Arc<Self>, timeout_ms: u64, uri: String) -> BoxFuture<()> {
        Box::pin(async move { self.goaway(timeout_ms, &uri).await })
    }

    fn fetch_upstream(
        self: Arc<Self>,
        relay: Arc<Relay>,
        fetch: Arc<crate::upstream_fetch::UpstreamFetch>,
    ) -> BoxFuture<()> {
        Box::pin(async move { self.open_fetch(&relay, &fetch).await })
    }

    fn is_origin(&self) -> bool {
        self.role == Role::Client
    }
}

/// Serves one accepted session until it closes.
pub(crate) async fn serve(relay: Arc<Relay>, mut accepted: Accepted) {
    let session = accepted.session.clone();
    // A full relay says so before its SETUP, so the client's connect fails
    // (checked again when the client's SETUP arrives).
    if relay.sessions_full() {
        relay.metrics.sessions_refused_full.fetch_add(1, Relaxed);
        session.close(SessionErrorCode::InternalError.code(), b"too many sessions");
        return;
    }
    // Until SETUP the connection holds a half-open slot, not a session slot,
    // so connections that never speak cannot lock real sessions out.
    if !relay.try_half_open() {
        relay
            .metrics
            .sessions_refused_half_open
            .fetch_add(1, Relaxed);
        session.close(
            SessionErrorCode::InternalError.code(),
            b"too many sessions being set up",
        );
        return;
    }
    // The SETUP timeout runs from here, also while the peer's first stream
    // is awaited to learn what the session speaks.
    let setup_at =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.setup_timeout_ms);
    let early = match accepted.undetermined.take() {
        None => None,
        Some(u) => match resolve(&relay, &mut accepted, u, setup_at).await {
            Ok(early) => early,
            Err(()) => {
                relay.end_half_open();
                return;
            }
        },
    };
    let handle = Arc::new(SessionHandle::new(&relay, accepted, Role::Server));
    handle.half_open.store(true, Relaxed);

    let result = run(&relay, &handle, setup_at, early).await;
    if let Err(e) = result {
        handle.fail(&relay, &e);
    }
    if handle.half_open.swap(false, Relaxed) {
        relay.end_half_open();
    }
    relay.remove_session(handle.id);
    if handle.established.load(Relaxed) {
        relay.metrics.sessions.fetch_sub(1, Relaxed);
    }
}

/// Learns what a session speaks from the peer's first stream, where its
/// transport did not say (`quichub_net::sniff`), before the setup
/// deadline: `Ok` with that stream when it is draft 18 (to be served
/// first), `Ok(None)` with `accepted` turned into the bridge's draft-18 side
/// when it is draft 14; `Err` once the session is closed (timeout, no
/// version served, moq-lite).
async fn resolve(
    relay: &Relay,
    accepted: &mut Accepted,
    u: quichub_net::sniff::Undetermined,
    setup_at: tokio::time::Instant,
) -> std::result::Result<Option<EarlyStream>, ()> {
    use quichub_net::sniff::Resolved;
    let peer = accepted.session.clone();
    let remote = accepted.remote;
    let refuse = |code: SessionErrorCode, reason: String| {
        if code == SessionErrorCode::ProtocolViolation {
            relay.metrics.protocol_violations.fetch_add(1, Relaxed);
        }
        tracing::info!(%remote, ?code, %reason, "closing session");
        peer.close(code.code(), reason.as_bytes());
        Err(())
    };
    match tokio::time::timeout_at(setup_at, u.resolve(&peer)).await {
        Err(_) => {
            relay.metrics.setup_timeouts.fetch_add(1, Relaxed);
            refuse(
                SessionErrorCode::ControlMessageTimeout,
                format!(
                    "no stream within {} ms (nothing said which draft the session speaks)",
                    relay.config.setup_timeout_ms
                ),
            )
        }
        // The peer left: nothing to say to it.
        Ok(Err(_)) if peer.close_reason().is_some() => Err(()),
        Ok(Err(r)) => {
            if r.version {
                relay.metrics.sessions_refused_draft.fetch_add(1, Relaxed);
            }
            refuse(r.code, r.reason)
        }
        Ok(Ok(Resolved::Draft18 { early })) => Ok(Some(early)),
        Ok(Ok(Resolved::Legacy { session, draft })) => {
            tracing::debug!(%remote, draft = draft.number(), "draft from CLIENT_SETUP");
            let i = usize::from(draft == moqt::legacy::Draft::D16);
            relay.metrics.legacy_sessions[i].fetch_add(1, Relaxed);
            accepted.session = session;
            accepted.draft = Some(draft);
            Ok(None)
        }
        Ok(Ok(Resolved::Lite {
            version,
            send,
            recv,
            read,
            limits,
        })) => {
            let version = match version {
                moqt::sniff::LiteVersion::Lite01 => moqt::lite::Version::Lite01,
                moqt::sniff::LiteVersion::Lite02 => moqt::lite::Version::Lite02,
            };
            tracing::debug!(%remote, version = version.label(), "moq-lite from CLIENT_SETUP");
            relay.metrics.lite_sessions[usize::from(version.number() - 1)].fetch_add(1, Relaxed);
            let start = quichub_net::lite::Start {
                version,
                transport: accepted.transport,
                url_path: accepted.path.clone(),
                session_stream: Some((send, recv, read)),
            };
            match quichub_net::lite::accept(peer.clone(), start, limits).await {
                Ok(session) => {
                    accepted.session = session;
                    accepted.lite = Some(version);
                    Ok(None)
                }
                Err(e) => refuse(
                    SessionErrorCode::InternalError,
                    format!("moq-lite bridge: {e:#}"),
                ),
            }
        }
    }
}

/// Serves a session the relay opened towards another relay (its origin)
/// until it closes: SETUP both ways, then one SUBSCRIBE_NAMESPACE per prefix.
/// Each namespace the origin announces is registered as published by this
/// session, so the relay's subscribers of its tracks are served by one
/// upstream SUBSCRIBE per track on this session, as for any publisher.
/// Returns why it ended.
pub(crate) async fn serve_origin(
    relay: Arc<Relay>,
    accepted: Accepted,
    target: (String, String),
    prefixes: Vec<TrackNamespace>,
    held: Vec<TrackNamespace>,
    label: String,
) -> OriginEnd {
    let session = accepted.session.clone();
    let mut handle = SessionHandle::new(&relay, accepted, Role::Client);
    if handle.transport == Transport::Quic {
        handle.setup_target = Some(target);
    }
    // What the origin may ask of us: nothing (it is a source, not a client).
    let _ = handle.access.set(Arc::new(crate::access::FromOrigin));
    let handle = Arc::new(handle);
    relay.label_origin(handle.id, Some((label.into(), handle.clone())));
    let started = tokio::time::Instant::now();
    let namespaces = {
        let (relay, h) = (relay.clone(), handle.clone());
        tokio::spawn(async move {
            h.wait_setup().await;
            let peer: Arc<dyn Peer> = h.clone();
            for ns in held {
                if let Err(r) = relay.publish_namespace(ns, peer.clone()) {
                    tracing::warn!(session = h.id, "origin's namespace: {}", r.reason);
                }
            }
            let mut subs = tokio::task::JoinSet::new();
            for p in prefixes {
                subs.spawn(namespace::follow_origin_tracks(h.clone(), p.clone()));
                subs.spawn(namespace::follow_origin(relay.clone(), h.clone(), p));
            }
            while let Some(r) = subs.join_next().await {
                if let Ok(Some(e)) = r {
                    tracing::warn!(session = h.id, "origin namespaces: {e}");
                }
            }
        })
    };
    let setup_at =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.setup_timeout_ms);
    let result = run(&relay, &handle, setup_at, None).await;
    // Ended before the session's cleanup, so nothing it registers outlives it.
    namespaces.abort();
    let _ = namespaces.await;
    if let Err(e) = &result {
        handle.fail(&relay, e);
    }
    relay.remove_session(handle.id);
    relay.label_origin(handle.id, None);
    if handle.established.load(Relaxed) {
        relay.metrics.sessions.fetch_sub(1, Relaxed);
    }
    let reason = match (result, session.close_reason()) {
        (Err(e), _) => e.to_string(),
        (Ok(()), Some(r)) => r.to_string(),
        (Ok(()), None) => "session ended".into(),
    };
    let redirect = handle.goaway_uri.lock().expect("goaway uri").take();
    OriginEnd {
        reason,
        goaway: handle.goaway_received.load(Relaxed),
        redirect,
        lasted: started.elapsed(),
    }
}

/// How a session to an origin ended ([`serve_origin`]).
pub(crate) struct OriginEnd {
    /// Why, for the log.
    pub(crate) reason: String,
    /// The origin sent GOAWAY (it is draining).
    pub(crate) goaway: bool,
    /// Its New Session URI, if it gave one.
    pub(crate) redirect: Option<String>,
    /// How long it was up.
    pub(crate) lasted: Duration,
}

/// Admits a session whose SETUP arrived: leaves the half-open pool, takes a
/// session slot.
fn establish(relay: &Arc<Relay>, h: &Arc<SessionHandle>) -> Result<()> {
    if h.half_open.swap(false, Relaxed) {
        relay.end_half_open();
    }
    // Our own sessions to origin relays are not clients: they take no
    // client's place (`max_sessions`), and a shutdown ends them at once
    // rather than waiting for them to drain.
    if h.role == Role::Server && !relay.add_session(h.clone()) {
        relay.metrics.sessions_refused_full.fetch_add(1, Relaxed);
        return Err(SessionError {
            code: SessionErrorCode::InternalError,
            reason: "too many sessions".into(),
        });
    }
    h.established.store(true, Relaxed);
    relay.metrics.sessions.fetch_add(1, Relaxed);
    relay.metrics.sessions_total.fetch_add(1, Relaxed);
    Ok(())
}

/// Runs a session until it ends. `early` is a stream the peer opened that
/// was accepted before (to learn the draft), served first.
async fn run(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    setup_at: tokio::time::Instant,
    early: Option<EarlyStream>,
) -> Result<()> {
    // The peer's SETUP is due by `setup_at`, and so is our own SETUP on its
    // way: a peer that grants no stream to open (QUIC's initial MAX_STREAMS
    // of 0, or a QMux peer that never sends its transport parameters) or
    // never reads holds its half-open slot no longer than one that never
    // speaks.
    let setup_timeout = Duration::from_millis(relay.config.setup_timeout_ms);
    let too_slow = || {
        relay.metrics.setup_timeouts.fetch_add(1, Relaxed);
        SessionError {
            code: SessionErrorCode::ControlMessageTimeout,
            reason: format!(
                "no SETUP exchanged within {} ms (the peer granted no stream or read nothing)",
                setup_timeout.as_millis()
            ),
        }
    };
    // Our control stream: SETUP first; GOAWAY may follow later.
    let mut control = tokio::time::timeout_at(setup_at, h.session.open_uni())
        .await
        .map_err(|_| too_slow())?
        .map_err(|e| SessionError::protocol(e.to_string()))?;
    let mut setup = match &h.setup_target {
        Some((authority, path)) => make_setup(IMPLEMENTATION, Some(authority), Some(path)),
        None => make_setup(IMPLEMENTATION, None, None),
    };
    let cache = relay.authorizer().max_token_cache();
    if cache > 0 {
        setup.options.push(moqt::KeyValue::int(
            setup_option::MAX_AUTH_TOKEN_CACHE_SIZE,
            cache,
        ));
        // Key-Value-Pairs are delta-encoded: in ascending type order.
        setup.options.sort_by_key(|kv| kv.kind);
    }
    let setup = Message::Setup(setup);
    tokio::time::timeout_at(setup_at, write_message(&mut control, &setup))
        .await
        .map_err(|_| too_slow())?
        .map_err(|e| SessionError::protocol(e.to_string()))?;
    *h.control.lock().await = Some(control);

    let (fail_tx, mut fail_rx) = tokio::sync::mpsc::channel::<SessionError>(4);
    if let Some(early) = early {
        let (relay, h, fail) = (relay.clone(), h.clone(), fail_tx.clone());
        tokio::spawn(async move {
            let r = match early {
                EarlyStream::Uni(stream) => on_uni(&relay, &h, stream, Bytes::new()).await,
                EarlyStream::Bi { send, recv, read } => {
                    on_request(&relay, &h, send, recv, read).await
                }
            };
            if let Err(e) = r {
                let _ = fail.send(e).await;
            }
        });
    }
    let uni = {
        let (relay, h, fail) = (relay.clone(), h.clone(), fail_tx.clone());
        tokio::spawn(async move {
            while let Ok(stream) = h.session.accept_uni().await {
                let (relay, h, fail) = (relay.clone(), h.clone(), fail.clone());
                tokio::spawn(async move {
                    if let Err(e) = on_uni(&relay, &h, stream, Bytes::new()).await {
                        let _ = fail.send(e).await;
                    }
                });
            }
        })
    };
    let bi = {
        let (relay, h, fail) = (relay.clone(), h.clone(), fail_tx.clone());
        tokio::spawn(async move {
            while let Ok((send, recv)) = h.session.accept_bi().await {
                let (relay, h, fail) = (relay.clone(), h.clone(), fail.clone());
                tokio::spawn(async move {
                    if let Err(e) = on_request(&relay, &h, send, recv, Bytes::new()).await {
                        let _ = fail.send(e).await;
                    }
                });
            }
        })
    };
    let dgram = {
        let (relay, h, fail) = (relay.clone(), h.clone(), fail_tx.clone());
        tokio::spawn(async move {
            while let Ok(d) = h.session.read_datagram().await {
                if let Err(e) = on_datagram(&relay, &h, d) {
                    let _ = fail.send(e).await;
                    break;
                }
            }
        })
    };
    drop(fail_tx);
    let mut shutdown = relay.shutdown_signal();
    // A session set up while the relay already drains is told at once.
    if *shutdown.borrow() {
        shutdown.mark_changed();
    }
    let mut draining = false;
    let setup_deadline = tokio::time::sleep_until(setup_at);
    tokio::pin!(setup_deadline);
    let mut setup_pending = true;
    // The session's credentials expire: known once SETUP gave it its access.
    let expiry = async {
        h.wait_setup().await;
        match h.access().expires() {
            Some(at) => {
                let left = at.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::time::sleep(left).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expiry);
    // A reload of the auth reaches the session even while it is idle: its
    // credentials are checked again (an error closes it), then its open
    // subscriptions (see `revoke_subscriptions`).
    let revoked = async {
        h.wait_setup().await;
        let Some(mut changes) = h.access().changes() else {
            return std::future::pending().await;
        };
        loop {
            if changes.changed().await.is_err() {
                // The auth is gone (relay shutting down): nothing more to watch.
                return std::future::pending().await;
            }
            if let Err(e) = h.access().revalidate() {
                return e;
            }
            h.revoke_subscriptions();
        }
    };
    tokio::pin!(revoked);
    let outcome = loop {
        tokio::select! {
            e = fail_rx.recv() => if let Some(e) = e { break Err(e) },
            _ = &mut setup_deadline, if setup_pending => {
                if *h.setup.borrow() {
                    setup_pending = false;
                    continue;
                }
                relay.metrics.setup_timeouts.fetch_add(1, Relaxed);
                break Err(SessionError {
                    code: SessionErrorCode::ControlMessageTimeout,
                    reason: format!("no CLIENT_SETUP within {} ms", setup_timeout.as_millis()),
                });
            }
            () = &mut expiry => {
                relay.metrics.sessions_expired.fetch_add(1, Relaxed);
                break Err(SessionError {
                    code: SessionErrorCode::ExpiredAuthToken,
                    reason: "authorization expired".into(),
                });
            }
            e = &mut revoked => {
                relay.metrics.sessions_revoked.fetch_add(1, Relaxed);
                break Err(e);
            }
            _ = h.session.closed() => break Ok(()),
            r = shutdown.changed(), if !draining => {
                if r.is_err() || *shutdown.borrow() {
                    // Stop watching; the session ends when the peer leaves or the
                    // endpoint closes after the drain timeout.
                    draining = true;
                    if h.role == Role::Client {
                        // Our session to an origin: nothing to drain, leave.
                        h.session.close(SessionErrorCode::NoError.code(), b"relay shutting down");
                        break Ok(());
                    }
                    h.goaway(relay.config.goaway_timeout_ms, &relay.goaway_uri())
                        .await;
                }
            }
        }
    };
    uni.abort();
    bi.abort();
    dgram.abort();
    outcome
}

async fn on_control(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    mut reader: MessageReader,
) -> Result<()> {
    let mut state = ControlState::new();
    loop {
        let m = reader.next().await.map_err(|e| match e {
            ReadError::Finished | ReadError::Stream(_) => {
                SessionError::protocol("control stream closed")
            }
            e => read_err(e),
        })?;
        state.on_control_message(&m)?;
        if let Message::Setup(s) = &m {
            tracing::debug!(session = h.id, implementation = ?s.implementation(), "SETUP");
            let dialect = Dialect::of(s);
            if dialect != Dialect::Draft18 {
                tracing::debug!(session = h.id, ?dialect, "peer's draft-18 dialect");
            }
            let _ = h.dialect.set(dialect);
            if h.role == Role::Server {
                // AUTHORITY and PATH come from the URL on WebTransport and
                // WebSocket; only raw QUIC carries them in SETUP.
                check_client_setup(s, h.transport != Transport::Quic)?;
                // Before the session takes a slot: a refused one never counts.
                let info = h.connect_info(s);
                let access = relay.authorizer().connect(&info)?;
                // `cluster=peer` is only a claim: the relays' own
                // namespaces go to a session that proved it is a member.
                let peer = info
                    .path
                    .as_deref()
                    .is_some_and(crate::cluster::is_peer_path);
                if peer && access.cluster_member() {
                    h.cluster_peer.store(true, Relaxed);
                } else if peer {
                    tracing::warn!(
                        session = h.id,
                        remote = %h.remote,
                        "cluster=peer without the cluster's credentials: served as a client"
                    );
                }
                let _ = h.access.set(access);
            }
            // Client role: the origin relay's SETUP. It asks nothing of us;
            // what it may do here is what the relay allows any peer it
            // chose to connect to (all of it).
            establish(relay, h)?;
            h.setup.send_replace(true);
        }
        if let Message::GoAway(g) = &m {
            if h.role == Role::Server && !g.new_session_uri.is_empty() {
                return Err(SessionError::protocol("client GOAWAY with a URI"));
            }
            tracing::info!(
                session = h.id,
                uri = %crate::origin::Redacted(&String::from_utf8_lossy(&g.new_session_uri)),
                "peer GOAWAY"
            );
            if h.role == Role::Client {
                h.goaway_received.store(true, Relaxed);
                if !g.new_session_uri.is_empty() {
                    *h.goaway_uri.lock().expect("goaway uri") =
                        Some(String::from_utf8_lossy(&g.new_session_uri).into_owned());
                }
                // An origin draining: leave at once, so it can stop, and
                // come back through the follower's reconnect loop, to the
                // New Session URI when there is one. Subscribers here get
                // PUBLISH_DONE.
                return Err(SessionError {
                    code: SessionErrorCode::NoError,
                    reason: "origin going away".into(),
                });
            }
        }
    }
}

async fn reply_error(
    send: &mut SendStream,
    slot: Option<&RequestSlot<'_>>,
    code: u64,
    reason: &str,
) {
    if let Some(slot) = slot {
        slot.release();
    }
    let m = Message::RequestError(RequestError {
        code,
        retry_interval: 0,
        reason: Bytes::copy_from_slice(reason.as_bytes()),
        redirect: None,
    });
    let _ = write_message(send, &m).await;
    let _ = send.finish();
}

fn reserved_namespace(ns: &TrackNamespace) -> bool {
    ns.fields()
        .first()
        .is_some_and(|f| f.first() == Some(&b'.'))
}

/// A bidirectional stream: one request from the peer. `read` is what was
/// already read from it.
async fn on_request(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    recv: RecvStream,
    read: Bytes,
) -> Result<()> {
    let mut reader = h.reader(recv, &read);
    let first = match reader.next().await {
        Ok(m) => m,
        Err(ReadError::Finished) | Err(ReadError::Stream(_)) => return Ok(()),
        // Drafts up to 16 open the session with CLIENT_SETUP (0x20; 0x40 up
        // to draft 10) on a bidirectional control stream: a peer of another
        // draft, told so rather than handed a bare "unknown message".
        Err(ReadError::Decode(moqt::DecodeError::UnknownMessage(ty @ (0x20 | 0x40)))) => {
            relay.metrics.sessions_refused_draft.fetch_add(1, Relaxed);
            return Err(SessionError {
                code: SessionErrorCode::VersionNegotiationFailed,
                reason: format!(
                    "CLIENT_SETUP ({ty:#x}) of an older MoQT draft: this relay speaks \
                     draft-18 only (ALPN or subprotocol moqt-18)"
                ),
            });
        }
        Err(e) => return Err(read_err(e)),
    };
    if !first.opens_request_stream() {
        return Err(SessionError::protocol(format!(
            "{} cannot open a request stream",
            first.name()
        )));
    }
    h.wait_setup().await;
    if let Some(id) = first.request_id() {
        h.request_ids.lock().expect("ids").accept_peer(id)?;
    }
    if let Err(wait) = h.admit_request() {
        relay.metrics.requests_refused_rate.fetch_add(1, Relaxed);
        let m = Message::RequestError(RequestError {
            code: request_error::EXCESSIVE_LOAD,
            // When a request would be admitted, in milliseconds plus one
            // (0 would say never).
            retry_interval: wait.as_nanos().div_ceil(1_000_000) as u64 + 1,
            reason: Bytes::from_static(b"too many requests per second"),
            redirect: None,
        });
        let _ = write_message(&mut send, &m).await;
        let _ = send.finish();
        return Ok(());
    }
    if h.open_requests.fetch_add(1, Relaxed) >= relay.config.max_requests_per_session {
        h.open_requests.fetch_sub(1, Relaxed);
        reply_error(
            &mut send,
            None,
            request_error::EXCESSIVE_LOAD,
            "too many open requests",
        )
        .await;
        return Ok(());
    }
    let slot = RequestSlot {
        counter: &h.open_requests,
        released: AtomicBool::new(false),
    };
    if h.goaway_sent.load(Relaxed) {
        reply_error(
            &mut send,
            Some(&slot),
            request_error::GOING_AWAY,
            "relay is going away",
        )
        .await;
        return Ok(());
    }
    match authorize(h, &first) {
        Ok(()) => {}
        Err(Denied::Request(r)) => {
            relay.metrics.requests_unauthorized.fetch_add(1, Relaxed);
            reply_error(&mut send, Some(&slot), r.code, &r.reason).await;
            return Ok(());
        }
        Err(Denied::Session(e)) => return Err(e),
    }
    if hides_track(h, &first) {
        reply_error(
            &mut send,
            Some(&slot),
            request_error::DOES_NOT_EXIST,
            "reserved namespace",
        )
        .await;
        return Ok(());
    }
    match first {
        Message::Subscribe(m) => on_subscribe(relay, &slot, h, send, reader, m).await,
        Message::TrackStatus(m) => on_track_status(relay, h, &slot, send, m).await,
        Message::Fetch(m) => on_fetch(relay, &slot, h, send, m).await,
        Message::PublishNamespace(m) => {
            on_publish_namespace(relay, &slot, h, send, reader, m).await
        }
        Message::SubscribeNamespace(m) => {
            on_subscribe_namespace(relay, &slot, h, send, reader, m).await
        }
        Message::SubscribeTracks(m) => on_subscribe_tracks(relay, &slot, h, send, reader, m).await,
        Message::Publish(m) => on_publish(relay, &slot, h, send, reader, m).await,
        _ => unreachable!("opens_request_stream checked"),
    }
}

/// The authorisation point: every request the peer opens passes here, after
/// the request limits and before its handler, and is refused with the
/// session access's [`Refusal`] (REQUEST_ERROR) if it may not be made.
/// Whether `m` reads a track of a reserved namespace (`.quichub/...`) that
/// this session may not see: SUBSCRIBE, TRACK_STATUS and a standalone FETCH
/// (a joining one reads a track already subscribed to) are answered as if
/// it did not exist.
fn hides_track(h: &SessionHandle, m: &Message) -> bool {
    let track = match m {
        Message::Subscribe(m) | Message::TrackStatus(m) => &m.track,
        Message::Fetch(f) => match &f.kind {
            FetchKind::Standalone { track, .. } => track,
            _ => return false,
        },
        _ => return false,
    };
    reserved_namespace(&track.namespace) && !h.may_read_cluster_track(track)
}

fn authorize(h: &SessionHandle, m: &Message) -> Result<(), Denied> {
    let joined;
    let op = match m {
        Message::PublishNamespace(m) => Operation::PublishNamespace {
            namespace: &m.namespace,
            tokens: &m.params.authorization_tokens,
        },
        Message::Publish(m) => Operation::Publish {
            track: &m.track,
            tokens: &m.params.authorization_tokens,
        },
        Message::Subscribe(m) => Operation::Subscribe {
            track: &m.track,
            tokens: &m.params.authorization_tokens,
        },
        Message::SubscribeNamespace(m) => Operation::SubscribeNamespace {
            prefix: &m.namespace,
            tokens: &m.params.authorization_tokens,
        },
        Message::SubscribeTracks(m) => Operation::SubscribeTracks {
            prefix: &m.namespace,
            tokens: &m.params.authorization_tokens,
        },
        Message::TrackStatus(m) => Operation::TrackStatus {
            track: &m.track,
            tokens: &m.params.authorization_tokens,
        },
        Message::Fetch(f) => {
            let track = match &f.kind {
                FetchKind::Standalone { track, .. } => track,
                FetchKind::RelativeJoining {
                    joining_request_id, ..
                }
                | FetchKind::AbsoluteJoining {
                    joining_request_id, ..
                } => {
                    joined = h
                        .subscriptions
                        .lock()
                        .expect("subs")
                        .get(joining_request_id)
                        .map(|s| s.entry.track.name.clone());
                    match &joined {
                        Some(t) => t,
                        // Joins nothing, so reads nothing: the handler
                        // answers INVALID_JOINING_REQUEST_ID.
                        None => return Ok(()),
                    }
                }
            };
            Operation::Fetch {
                track,
                tokens: &f.params.authorization_tokens,
            }
        }
        _ => return Ok(()),
    };
    h.access().authorize(&op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_starting_with_a_dot_are_reserved() {
        let ns = TrackNamespace::from_path;
        assert!(reserved_namespace(&ns(".well-known/x")));
        assert!(reserved_namespace(&ns(".")));
        assert!(!reserved_namespace(&ns("live/.hidden")));
        assert!(!reserved_namespace(&ns("live")));
        assert!(!reserved_namespace(&TrackNamespace::default()));
    }

    #[test]
    fn read_errors_become_protocol_violations_or_decode_errors() {
        for e in [ReadError::Truncated, ReadError::Finished] {
            assert_eq!(read_err(e).code, SessionErrorCode::ProtocolViolation);
        }
        let e = read_err(ReadError::Decode(moqt::DecodeError::Short));
        assert_eq!(e, SessionError::from(moqt::DecodeError::Short));
    }
}
