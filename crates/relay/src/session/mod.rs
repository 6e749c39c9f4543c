//! One MoQT session at the relay. The relay is the publisher towards its
//! subscribers and the subscriber towards its publishers, so this module speaks
//! both roles: it answers requests the peer opens, and opens SUBSCRIBE (and
//! PUBLISH for SUBSCRIBE_TRACKS) towards the peer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use moqt::coding::{get_len, get_lp_bytes, get_vi64};
use moqt::data::{
    FetchEntry, FetchObject, FetchState, ObjectDatagram, ObjectStatus, StreamType, SubgroupHeader,
    SubgroupId, SubgroupObject,
};
use moqt::error::{publish_done, request_error, reset};
use moqt::message::{
    FetchKind, FetchOk, GoAway, Message, NamespaceRequest, Publish, PublishDone, RequestError,
    RequestOk, Subscribe, SubscribeOk,
};
use moqt::session::{check_client_setup, make_setup, ControlState, RequestIds, Role, SessionError};
use moqt::{DecodeError, Location, Parameters, SessionErrorCode, TrackNamespace};
use quichub_net::io::{read_prefix, write_message, EarlyDatagrams, MessageReader, ReadError};
use quichub_net::server::Accepted;
use quichub_net::Transport;
use tokio::sync::{watch, Notify};
use web_transport_quinn::{RecvStream, SendStream, Session};

use crate::core::{NamespaceEvent, Refusal, Relay, TrackEntry};
use crate::forward::{Forwarder, Settings};
use crate::object::Object;
use crate::track::{Track, TrackInfo};

/// Our MOQT_IMPLEMENTATION string.
pub const IMPLEMENTATION: &str = concat!("quichub/", env!("CARGO_PKG_VERSION"));

/// A downstream subscription's facts needed by a Joining FETCH.
struct SubInfo {
    entry: Arc<TrackEntry>,
    joining: Option<Location>,
    forward: bool,
}

/// State shared by the tasks of one session.
pub struct SessionHandle {
    /// Relay-wide id.
    pub id: u64,
    /// The transport session.
    pub session: Session,
    /// Raw QUIC or WebTransport.
    pub transport: Transport,
    request_ids: Mutex<RequestIds>,
    /// Track Aliases the peer chose for tracks it publishes to us.
    aliases: Mutex<HashMap<u64, Arc<Track>>>,
    alias_added: Notify,
    early_datagrams: Mutex<EarlyDatagrams>,
    control: tokio::sync::Mutex<Option<SendStream>>,
    setup: watch::Sender<bool>,
    control_seen: AtomicBool,
    /// Holds a half-open slot of the relay until SETUP arrives.
    half_open: AtomicBool,
    /// Counted in `max_sessions` (SETUP arrived and was admitted).
    established: AtomicBool,
    open_requests: AtomicUsize,
    subscriptions: Mutex<HashMap<u64, SubInfo>>,
    /// Tracks this session subscribes to (one subscription per track, §5.1).
    subscribed: Mutex<std::collections::HashSet<moqt::FullTrackName>>,
    ns_prefixes: Mutex<HashMap<u64, TrackNamespace>>,
    track_prefixes: Mutex<HashMap<u64, TrackNamespace>>,
    goaway_sent: AtomicBool,
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
    fn new(id: u64, session: Session, transport: Transport) -> Self {
        Self {
            id,
            session,
            transport,
            request_ids: Mutex::new(RequestIds::new(Role::Server)),
            aliases: Mutex::default(),
            alias_added: Notify::new(),
            early_datagrams: Mutex::default(),
            control: tokio::sync::Mutex::new(None),
            setup: watch::channel(false).0,
            control_seen: AtomicBool::new(false),
            half_open: AtomicBool::new(false),
            established: AtomicBool::new(false),
            open_requests: AtomicUsize::new(0),
            subscriptions: Mutex::default(),
            subscribed: Mutex::default(),
            ns_prefixes: Mutex::default(),
            track_prefixes: Mutex::default(),
            goaway_sent: AtomicBool::new(false),
        }
    }

    /// Delivers datagrams that arrived before their alias was known.
    fn replay_early(&self, relay: &Arc<Relay>, alias: u64) {
        let held = self.early_datagrams.lock().expect("early").take(alias);
        for d in held {
            let _ = on_datagram(relay, self, d);
        }
    }

    /// Closes the session with a session error.
    pub fn fail(&self, relay: &Relay, e: &SessionError) {
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

    fn next_request_id(&self) -> u64 {
        self.request_ids.lock().expect("ids").next()
    }

    async fn wait_setup(&self) {
        let mut rx = self.setup.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Sends GOAWAY on our control stream (for shutdown).
    pub async fn send_goaway(&self, timeout_ms: u64) {
        if self.goaway_sent.swap(true, Relaxed) {
            return;
        }
        let floor = self.request_ids.lock().expect("ids").peer_floor();
        let msg = Message::GoAway(GoAway {
            new_session_uri: Bytes::new(),
            timeout: timeout_ms,
            request_id: Some(floor),
        });
        if let Some(s) = self.control.lock().await.as_mut() {
            let _ = write_message(s, &msg).await;
        }
    }

    /// Subscribes upstream to `entry`'s track on this (publisher's) session.
    /// Returns once SUBSCRIBE_OK arrives; a task then watches for PUBLISH_DONE
    /// and for the relay cancelling the subscription.
    pub async fn subscribe_upstream(
        self: &Arc<Self>,
        relay: &Arc<Relay>,
        entry: Arc<TrackEntry>,
    ) -> Result<(), Refusal> {
        let internal = |e: String| Refusal::new(request_error::INTERNAL_ERROR, e);
        let (mut send, recv) = self
            .session
            .open_bi()
            .await
            .map_err(|e| internal(e.to_string()))?;
        let request_id = self.next_request_id();
        let msg = Message::Subscribe(Subscribe {
            request_id,
            track: entry.track.name.clone(),
            params: Parameters::default(),
        });
        write_message(&mut send, &msg)
            .await
            .map_err(|e| internal(e.to_string()))?;
        let mut reader = MessageReader::new(recv, &[]);
        let timeout = Duration::from_millis(relay.config.upstream_timeout_ms);
        let first = tokio::time::timeout(timeout, reader.next())
            .await
            .map_err(|_| Refusal::new(request_error::TIMEOUT, "upstream did not answer"))?;
        let ok = match first {
            Ok(Message::SubscribeOk(ok)) if !crate::track::properties_fit(&ok.properties) => {
                let _ = send.reset(reset::INTERNAL_ERROR);
                reader.stop(reset::INTERNAL_ERROR);
                return Err(Refusal::new(
                    request_error::NOT_SUPPORTED,
                    "track properties too large",
                ));
            }
            Ok(Message::SubscribeOk(ok)) => ok,
            Ok(Message::RequestError(e)) => {
                return Err(Refusal::new(e.code, String::from_utf8_lossy(&e.reason)));
            }
            Ok(other) => {
                self.fail(
                    relay,
                    &SessionError::protocol(format!("{} in reply to SUBSCRIBE", other.name())),
                );
                return Err(internal("upstream protocol violation".into()));
            }
            Err(e) => return Err(internal(format!("upstream: {e}"))),
        };
        let track = entry.track.clone();
        {
            let mut aliases = self.aliases.lock().expect("aliases");
            if aliases.get(&ok.track_alias).is_some_and(|t| !t.is_ended()) {
                drop(aliases);
                self.fail(
                    relay,
                    &SessionError {
                        code: SessionErrorCode::DuplicateTrackAlias,
                        reason: "track alias in use".into(),
                    },
                );
                return Err(internal("duplicate track alias upstream".into()));
            }
            aliases.insert(ok.track_alias, track.clone());
        }
        self.alias_added.notify_waiters();
        self.replay_early(relay, ok.track_alias);
        track.set_publisher_session(self.id);
        track.set_info(
            TrackInfo::from_properties(ok.properties),
            ok.params.largest_object,
        );
        entry.ready.send_replace(Some(Ok(())));
        let me = self.clone();
        let relay = relay.clone();
        tokio::spawn(async move {
            let (status, streams) = tokio::select! {
                m = reader.next() => match m {
                    Ok(Message::PublishDone(d)) => (d.status, Some(d.stream_count)),
                    Ok(Message::GoAway(_)) => (publish_done::GOING_AWAY, None),
                    _ => (publish_done::TRACK_ENDED, None),
                },
                _ = entry.cancel.notified() => {
                    let _ = send.reset(reset::CANCELLED);
                    reader.stop(reset::CANCELLED);
                    (publish_done::TRACK_ENDED, None)
                }
                _ = me.session.closed() => (publish_done::TRACK_ENDED, None),
            };
            if let Some(n) = streams {
                settle(&relay, &entry.track, n).await;
            }
            me.aliases.lock().expect("aliases").remove(&ok.track_alias);
            relay.drop_entry(&entry);
            entry.track.end(status);
        });
        Ok(())
    }
}

/// How long PUBLISH_DONE waits for the data streams its Stream Count
/// announces: objects still in flight when it overtakes them are delivered,
/// and a publisher that counts wrong delays the end by this much at most.
const PUBLISH_DONE_GRACE: Duration = Duration::from_secs(2);

/// Waits until the upstream's data streams named by PUBLISH_DONE's Stream
/// Count have arrived and been read, or [`PUBLISH_DONE_GRACE`] passed.
async fn settle(relay: &Relay, track: &Track, stream_count: u64) {
    if !track
        .upstream_settled(stream_count, PUBLISH_DONE_GRACE)
        .await
    {
        relay
            .metrics
            .publish_done_streams_missing
            .fetch_add(1, Relaxed);
    }
}

/// Serves one accepted session until it closes.
pub async fn serve(relay: Arc<Relay>, accepted: Accepted) {
    let Accepted {
        session, transport, ..
    } = accepted;
    let handle = Arc::new(SessionHandle::new(
        relay.next_id(),
        session.clone(),
        transport,
    ));
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
    handle.half_open.store(true, Relaxed);

    let result = run(&relay, &handle).await;
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

/// Admits a session whose SETUP arrived: leaves the half-open pool, takes a
/// session slot.
fn establish(relay: &Arc<Relay>, h: &Arc<SessionHandle>) -> Result<()> {
    if h.half_open.swap(false, Relaxed) {
        relay.end_half_open();
    }
    if !relay.add_session(h.clone()) {
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

async fn run(relay: &Arc<Relay>, h: &Arc<SessionHandle>) -> Result<()> {
    // Our control stream: SETUP first; GOAWAY may follow later.
    let mut control = h
        .session
        .open_uni()
        .await
        .map_err(|e| SessionError::protocol(e.to_string()))?;
    let setup = Message::Setup(make_setup(IMPLEMENTATION, None, None));
    write_message(&mut control, &setup)
        .await
        .map_err(|e| SessionError::protocol(e.to_string()))?;
    *h.control.lock().await = Some(control);

    let (fail_tx, mut fail_rx) = tokio::sync::mpsc::channel::<SessionError>(4);
    let uni = {
        let (relay, h, fail) = (relay.clone(), h.clone(), fail_tx.clone());
        tokio::spawn(async move {
            while let Ok(stream) = h.session.accept_uni().await {
                let (relay, h, fail) = (relay.clone(), h.clone(), fail.clone());
                tokio::spawn(async move {
                    if let Err(e) = on_uni(&relay, &h, stream).await {
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
                    if let Err(e) = on_request(&relay, &h, send, recv).await {
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
    let setup_timeout = Duration::from_millis(relay.config.setup_timeout_ms);
    let setup_deadline = tokio::time::sleep(setup_timeout);
    tokio::pin!(setup_deadline);
    let mut setup_pending = true;
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
            _ = h.session.closed() => break Ok(()),
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() {
                    h.send_goaway(relay.config.goaway_timeout_ms).await;
                    // Stop watching; the session ends when the peer leaves or the
                    // endpoint closes after the drain timeout.
                    shutdown = watch::channel(false).1;
                }
            }
        }
    };
    uni.abort();
    bi.abort();
    dgram.abort();
    outcome
}

/// A unidirectional stream: the peer's control stream, a subgroup, a fetch
/// response or padding.
async fn on_uni(relay: &Arc<Relay>, h: &Arc<SessionHandle>, mut stream: RecvStream) -> Result<()> {
    // Before SETUP the setup timeout bounds the wait; after it, this does.
    let header_timeout = Duration::from_millis(relay.config.stream_header_timeout_ms);
    let typed = async {
        h.wait_setup().await;
        tokio::time::sleep(header_timeout).await
    };
    let (ty, rest) = tokio::select! {
        biased;
        r = read_prefix(&mut stream, 16, get_vi64) => match r {
            Ok(v) => v,
            Err(ReadError::Finished) => return Ok(()),
            Err(e) => return Err(read_err(e)),
        },
        _ = typed => {
            relay.metrics.stream_header_timeouts.fetch_add(1, Relaxed);
            let _ = stream.stop(reset::CANCELLED);
            return Ok(());
        }
    };
    match StreamType::from_code(ty)? {
        StreamType::Control => {
            if h.control_seen.swap(true, Relaxed) {
                return Err(SessionError::protocol(
                    "second control stream (second SETUP)",
                ));
            }
            // The type we just read is the SETUP message's own type: re-prefix it.
            let mut prefix = BytesMut::new();
            moqt::coding::put_vi64(&mut prefix, ty);
            prefix.extend_from_slice(&rest);
            on_control(relay, h, MessageReader::new(stream, &prefix)).await
        }
        StreamType::Subgroup(t) => {
            h.wait_setup().await;
            on_subgroup(relay, h, t, stream, rest).await
        }
        StreamType::Fetch => {
            // The relay issues no upstream FETCH, so no fetch stream is expected.
            let _ = stream.stop(reset::CANCELLED);
            Ok(())
        }
        StreamType::Padding => {
            let _ = stream.stop(reset::CANCELLED);
            Ok(())
        }
    }
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
            check_client_setup(s, h.transport == Transport::WebTransport)?;
            tracing::debug!(session = h.id, implementation = ?s.implementation(), "SETUP");
            establish(relay, h)?;
            h.setup.send_replace(true);
        }
        if let Message::GoAway(g) = &m {
            if !g.new_session_uri.is_empty() {
                return Err(SessionError::protocol("client GOAWAY with a URI"));
            }
            tracing::debug!(session = h.id, "peer GOAWAY");
        }
    }
}

/// Bytes one subgroup object occupies, from its header, without needing its
/// payload yet (so a large payload is gathered in one buffer, not re-copied).
fn object_len(buf: &[u8], props: bool, max: usize) -> std::result::Result<usize, DecodeError> {
    let mut s = buf;
    get_vi64(&mut s)?;
    if props {
        get_lp_bytes(&mut s, moqt::data::MAX_PROPERTIES)?;
    }
    let len = get_len(&mut s, max)?;
    if len == 0 {
        get_vi64(&mut s)?;
    }
    Ok(buf.len() - s.len() + len)
}

async fn on_subgroup(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    t: u8,
    mut stream: RecvStream,
    mut buf: Bytes,
) -> Result<()> {
    let mut acc = BytesMut::new();
    acc.extend_from_slice(&buf);
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.stream_header_timeout_ms);
    let (header, rest) = {
        loop {
            let mut s = &acc[..];
            match SubgroupHeader::decode_after_type(t, &mut s) {
                Ok(hd) => {
                    let used = acc.len() - s.len();
                    break (hd, acc.split_off(used).freeze());
                }
                Err(DecodeError::Short) if acc.len() < 64 => {}
                Err(e) => return Err(e.into()),
            }
            let chunk = match tokio::time::timeout_at(deadline, stream.read_chunk(4096, true)).await
            {
                Ok(c) => c,
                Err(_) => {
                    relay.metrics.stream_header_timeouts.fetch_add(1, Relaxed);
                    let _ = stream.stop(reset::CANCELLED);
                    return Ok(());
                }
            };
            match chunk {
                Ok(Some(c)) => acc.extend_from_slice(&c.bytes),
                Ok(None) => {
                    return Err(SessionError::protocol(
                        "stream ended inside SUBGROUP_HEADER",
                    ))
                }
                Err(_) => return Ok(()),
            }
        }
    };
    buf = rest;
    // The alias may be announced by a SUBSCRIBE_OK still in flight: wait briefly.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let track = loop {
        let wait = h.alias_added.notified();
        if let Some(t) = h
            .aliases
            .lock()
            .expect("aliases")
            .get(&header.track_alias)
            .cloned()
        {
            break Some(t);
        }
        if tokio::time::timeout_at(deadline, wait).await.is_err() {
            break None;
        }
    };
    let Some(track) = track else {
        let _ = stream.stop(reset::CANCELLED);
        return Ok(());
    };
    // Open until this handler returns, however it returns: PUBLISH_DONE
    // waits for the streams it counts.
    let _counted = track.upstream_stream();
    let default_priority = track.info().default_priority;
    let priority = header.priority.unwrap_or(default_priority);
    let max = relay.config.max_object_size;
    let mut prev: Option<u64> = None;
    let mut subgroup_id: Option<u64> = match header.subgroup {
        SubgroupId::Zero => Some(0),
        SubgroupId::Explicit(v) => Some(v),
        SubgroupId::FirstObject => None,
    };
    loop {
        // Gather one whole object into `buf`.
        let need = loop {
            match object_len(&buf, header.has_properties, max) {
                Ok(n) if buf.len() >= n => break Some(n),
                Ok(n) => {
                    // Header known: gather exactly the rest in one buffer.
                    let mut m = BytesMut::with_capacity(n);
                    m.extend_from_slice(&buf);
                    while m.len() < n {
                        match stream.read_chunk(n - m.len(), true).await {
                            Ok(Some(c)) => m.extend_from_slice(&c.bytes),
                            Ok(None) => {
                                return Err(SessionError::protocol(
                                    "subgroup stream ended mid-object",
                                ))
                            }
                            Err(_) => {
                                if let Some(sg) = subgroup_id {
                                    track.subgroup_end(header.group, sg, false);
                                }
                                return Ok(());
                            }
                        }
                    }
                    buf = m.freeze();
                }
                Err(DecodeError::Short) => match stream.read_chunk(64 * 1024, true).await {
                    Ok(Some(c)) => {
                        buf = if buf.is_empty() {
                            c.bytes
                        } else {
                            let mut m = BytesMut::with_capacity(buf.len() + c.bytes.len());
                            m.extend_from_slice(&buf);
                            m.extend_from_slice(&c.bytes);
                            m.freeze()
                        }
                    }
                    Ok(None) if buf.is_empty() => break None,
                    Ok(None) => {
                        return Err(SessionError::protocol("subgroup stream ended mid-object"))
                    }
                    Err(_) => {
                        if let Some(sg) = subgroup_id {
                            track.subgroup_end(header.group, sg, false);
                        }
                        return Ok(());
                    }
                },
                Err(DecodeError::TooLong) => {
                    return Err(SessionError::protocol(
                        "object larger than the relay's limit",
                    ))
                }
                Err(e) => return Err(e.into()),
            }
        };
        let Some(n) = need else {
            if let Some(sg) = subgroup_id {
                track.subgroup_end(header.group, sg, true);
            }
            return Ok(());
        };
        let frame = buf.split_to(n);
        let mut s = &frame[..];
        let obj = SubgroupObject::decode(&mut s, &frame, prev, header.has_properties, max)?;
        prev = Some(obj.object_id);
        let sg = *subgroup_id.get_or_insert(obj.object_id);
        track.publish(Object {
            group: header.group,
            subgroup: Some(sg),
            object_id: obj.object_id,
            priority,
            properties: obj.properties,
            status: obj.status,
            payload: obj.payload,
            end_of_group: false,
            received: Instant::now(),
            datagram: Default::default(),
        });
    }
}

fn on_datagram(relay: &Arc<Relay>, h: &SessionHandle, d: Bytes) -> Result<()> {
    let mut s = &d[..];
    let t = get_vi64(&mut s)?;
    if t == moqt::data::PADDING_DATAGRAM {
        return Ok(());
    }
    let dg = ObjectDatagram::decode(&d)?;
    if dg.payload.len() > relay.config.max_object_size {
        return Err(SessionError::protocol("datagram object too large"));
    }
    let track = {
        let aliases = h.aliases.lock().expect("aliases");
        match aliases.get(&dg.track_alias) {
            Some(t) => t.clone(),
            None => {
                // The PUBLISH or SUBSCRIBE_OK naming this alias may still be in
                // flight on its own stream: hold the datagram (bounded in count
                // and age) until the alias is known. Pushed under the aliases
                // lock, so an alias added meanwhile replays it (`replay_early`
                // runs after the insert).
                h.early_datagrams
                    .lock()
                    .expect("early")
                    .push(dg.track_alias, d);
                return Ok(());
            }
        }
    };
    let priority = dg.priority.unwrap_or_else(|| track.info().default_priority);
    track.publish(Object {
        group: dg.group,
        subgroup: None,
        object_id: dg.object_id,
        priority,
        properties: dg.properties,
        status: dg.status.unwrap_or(ObjectStatus::Normal),
        payload: dg.payload,
        end_of_group: dg.end_of_group,
        received: Instant::now(),
        datagram: Default::default(),
    });
    Ok(())
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

/// A bidirectional stream: one request from the peer.
async fn on_request(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    recv: RecvStream,
) -> Result<()> {
    let mut reader = MessageReader::new(recv, &[]);
    let first = match reader.next().await {
        Ok(m) => m,
        Err(ReadError::Finished) | Err(ReadError::Stream(_)) => return Ok(()),
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

fn settings_from(params: &Parameters, info: &TrackInfo, largest: Option<Location>) -> Settings {
    let filter = params.subscription_filter;
    Settings {
        subscriber_priority: params.subscriber_priority.unwrap_or(128),
        group_order: params.group_order.unwrap_or(info.group_order),
        start: filter.map(|f| f.start(largest)).unwrap_or_default(),
        end_group: filter.and_then(|f| f.end_group()),
        forward: params.forward.unwrap_or(true),
        object_timeout: params
            .object_delivery_timeout
            .or_else(|| track_prop(info, 0x02))
            .map(Duration::from_millis),
        subgroup_timeout: params
            .subgroup_delivery_timeout
            .or_else(|| track_prop(info, 0x06))
            .map(Duration::from_millis),
    }
}

fn track_prop(info: &TrackInfo, kind: u64) -> Option<u64> {
    info.properties.iter().find_map(|kv| match kv.value {
        moqt::KvValue::Int(v) if kv.kind == kind && v > 0 => Some(v),
        _ => None,
    })
}

fn apply_update(s: &mut Settings, p: &Parameters, largest: Option<Location>) {
    if let Some(v) = p.subscriber_priority {
        s.subscriber_priority = v;
    }
    if let Some(v) = p.forward {
        s.forward = v;
    }
    if let Some(f) = p.subscription_filter {
        s.start = f.start(largest);
        s.end_group = f.end_group();
    }
    if let Some(v) = p.object_delivery_timeout {
        s.object_timeout = Some(Duration::from_millis(v));
    }
    if let Some(v) = p.subgroup_delivery_timeout {
        s.subgroup_timeout = Some(Duration::from_millis(v));
    }
}

async fn on_subscribe(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: Subscribe,
) -> Result<()> {
    if reserved_namespace(&m.track.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::DOES_NOT_EXIST,
            "reserved namespace",
        )
        .await;
        return Ok(());
    }
    // Reserve the track name for this session at once, so a second SUBSCRIBE
    // that races the first (before its SUBSCRIBE_OK) is still a duplicate.
    let reserved = h
        .subscribed
        .lock()
        .expect("subscribed")
        .insert(m.track.clone());
    let _reservation = reserved.then(|| Reservation {
        set: &h.subscribed,
        name: m.track.clone(),
    });
    if !reserved {
        reply_error(
            &mut send,
            Some(slot),
            request_error::DUPLICATE_SUBSCRIPTION,
            "already subscribed",
        )
        .await;
        return Ok(());
    }
    let rendezvous = Duration::from_millis(
        m.params
            .rendezvous_timeout
            .unwrap_or(0)
            .min(relay.config.max_rendezvous_ms),
    );
    let entry = tokio::select! {
        r = relay.acquire_track(&m.track, rendezvous, &h.session) => r,
        // The subscriber gave up (stream reset) while we waited.
        _ = reader.next() => return Ok(()),
    };
    let (entry, joined) = match entry {
        Ok(e) => e,
        Err(r) => {
            reply_error(&mut send, Some(slot), r.code, &r.reason).await;
            return Ok(());
        }
    };
    let result = serve_subscription(
        relay,
        h,
        &mut send,
        Some(&mut reader),
        &entry,
        m.request_id,
        &m.params,
        Some(joined),
    )
    .await;
    relay.release_track(&entry);
    result
}

/// Delivers a track to the peer: replies SUBSCRIBE_OK (for a SUBSCRIBE) or
/// expects PUBLISH_OK already handled (for our PUBLISH), runs the forwarder,
/// applies REQUEST_UPDATEs, and ends with PUBLISH_DONE.
#[allow(clippy::too_many_arguments)]
async fn serve_subscription(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    send: &mut SendStream,
    mut reader: Option<&mut MessageReader>,
    entry: &Arc<TrackEntry>,
    request_id: u64,
    params: &Parameters,
    joined: Option<crate::track::Joined>,
) -> Result<()> {
    let track = entry.track.clone();
    let joined = joined.unwrap_or_else(|| track.join(&h.session));
    // The upstream's LARGEST_OBJECT may have arrived after we joined: use the
    // freshest value; objects already queued below it are filtered out.
    let largest = track.largest();
    let settings = settings_from(params, &joined.info, largest);
    if let (Some(end), Some(l)) = (settings.end_group, largest) {
        if end < l.group {
            reply_error(
                send,
                None,
                request_error::INVALID_RANGE,
                "end group already published",
            )
            .await;
            return Ok(());
        }
    }
    // Registered before SUBSCRIBE_OK goes out: a joining FETCH the peer sends
    // the moment it reads the OK must find the subscription.
    h.subscriptions.lock().expect("subs").insert(
        request_id,
        SubInfo {
            entry: entry.clone(),
            joining: if settings.forward { largest } else { None },
            forward: settings.forward,
        },
    );
    // A SUBSCRIBE (which comes with a reader for its updates) is answered here;
    // for our own PUBLISH the PUBLISH_OK was the answer.
    if reader.is_some() {
        let ok = Message::SubscribeOk(SubscribeOk {
            track_alias: track.id,
            params: Parameters {
                largest_object: largest,
                ..Default::default()
            },
            properties: joined.info.properties.clone(),
        });
        if write_message(send, &ok).await.is_err() {
            h.subscriptions.lock().expect("subs").remove(&request_id);
            return Ok(());
        }
    }
    relay.metrics.subscriptions.fetch_add(1, Relaxed);
    let (settings_tx, settings_rx) = watch::channel(settings);
    let forwarder = Forwarder::new(
        h.session.clone(),
        track.clone(),
        settings_rx,
        relay.metrics.clone(),
        relay.config.clone(),
    );
    let mut run = Box::pin(forwarder.run(joined));
    let done = loop {
        let next = async {
            match reader.as_deref_mut() {
                Some(r) => r.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            d = &mut run => break Some(d),
            m = next => match m {
                Ok(Message::RequestUpdate(u)) => {
                    if let Err(e) = h.request_ids.lock().expect("ids").accept_peer(u.request_id) {
                        cleanup(relay, h, request_id);
                        return Err(e);
                    }
                    let largest = track.largest();
                    settings_tx.send_modify(|s| apply_update(s, &u.params, largest));
                    if let Some(info) = h.subscriptions.lock().expect("subs").get_mut(&request_id) {
                        if let Some(f) = u.params.forward {
                            if f && !info.forward {
                                info.joining = largest;
                            }
                            info.forward = f;
                        }
                    }
                    let ok = Message::RequestOk(RequestOk {
                        params: Parameters { largest_object: largest, ..Default::default() },
                        properties: Vec::new(),
                    });
                    let _ = write_message(send, &ok).await;
                }
                Ok(other) => {
                    cleanup(relay, h, request_id);
                    return Err(SessionError::protocol(format!("{} on a subscription stream", other.name())));
                }
                // FIN, STOP_SENDING or reset from the subscriber: unsubscribe.
                Err(ReadError::Decode(e)) => {
                    cleanup(relay, h, request_id);
                    return Err(e.into());
                }
                Err(_) => break None,
            }
        }
    };
    cleanup(relay, h, request_id);
    match done {
        Some(d) => {
            let m = Message::PublishDone(PublishDone {
                status: d.status,
                stream_count: d.stream_count,
                reason: Bytes::new(),
            });
            let _ = write_message(send, &m).await;
            let _ = send.finish();
        }
        None => {
            drop(run);
            let _ = send.reset(reset::CANCELLED);
        }
    }
    Ok(())
}

fn cleanup(relay: &Relay, h: &SessionHandle, request_id: u64) {
    if h.subscriptions
        .lock()
        .expect("subs")
        .remove(&request_id)
        .is_some()
    {
        relay.metrics.subscriptions.fetch_sub(1, Relaxed);
    }
}

async fn on_track_status(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    slot: &RequestSlot<'_>,
    mut send: SendStream,
    m: Subscribe,
) -> Result<()> {
    if reserved_namespace(&m.track.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::DOES_NOT_EXIST,
            "reserved namespace",
        )
        .await;
        return Ok(());
    }
    let (entry, acquired) = match relay.find_track(&m.track) {
        Some(e) => (e, false),
        None => match relay
            .acquire_track(&m.track, Duration::ZERO, &h.session)
            .await
        {
            Ok((e, _)) => (e, true),
            Err(r) => {
                reply_error(&mut send, Some(slot), r.code, &r.reason).await;
                return Ok(());
            }
        },
    };
    let ok = Message::RequestOk(RequestOk {
        params: Parameters {
            largest_object: entry.track.largest(),
            ..Default::default()
        },
        properties: entry.track.info().properties,
    });
    let _ = write_message(&mut send, &ok).await;
    let _ = send.finish();
    if acquired {
        relay.release_track(&entry);
    }
    Ok(())
}

async fn on_fetch(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    m: moqt::message::Fetch,
) -> Result<()> {
    let descending = m.params.group_order == Some(moqt::GroupOrder::Descending);
    let (entry, start, end) = match &m.kind {
        FetchKind::Standalone { track, start, end } => {
            if end < start && end.object != 0 || end.group < start.group {
                return Err(SessionError::protocol("FETCH end before start"));
            }
            let Some(entry) = relay.find_track(track) else {
                reply_error(
                    &mut send,
                    Some(slot),
                    request_error::DOES_NOT_EXIST,
                    "track not at this relay",
                )
                .await;
                return Ok(());
            };
            // End Location is exclusive (object + 1), object 0 meaning the whole group.
            let end_incl = if end.object == 0 {
                Location::new(end.group, u64::MAX)
            } else {
                Location::new(end.group, end.object - 1)
            };
            (entry, *start, end_incl)
        }
        FetchKind::RelativeJoining {
            joining_request_id,
            joining_start,
        }
        | FetchKind::AbsoluteJoining {
            joining_request_id,
            joining_start,
        } => {
            let info = {
                let subs = h.subscriptions.lock().expect("subs");
                subs.get(joining_request_id)
                    .map(|s| (s.entry.clone(), s.joining, s.forward))
            };
            let Some((entry, joining, forward)) = info else {
                reply_error(
                    &mut send,
                    Some(slot),
                    request_error::INVALID_JOINING_REQUEST_ID,
                    "no such subscription",
                )
                .await;
                return Ok(());
            };
            let Some(j) = joining.filter(|_| forward) else {
                reply_error(
                    &mut send,
                    Some(slot),
                    request_error::INVALID_RANGE,
                    "nothing published before the subscription",
                )
                .await;
                return Ok(());
            };
            let start_group = match m.kind {
                FetchKind::RelativeJoining { .. } => j.group.saturating_sub(*joining_start),
                _ => *joining_start,
            };
            (entry, Location::new(start_group, 0), j)
        }
    };
    let Some(largest) = entry.track.largest() else {
        reply_error(
            &mut send,
            Some(slot),
            request_error::INVALID_RANGE,
            "no objects published",
        )
        .await;
        return Ok(());
    };
    if start > largest || end < start {
        reply_error(
            &mut send,
            Some(slot),
            request_error::INVALID_RANGE,
            "range starts after the largest object",
        )
        .await;
        return Ok(());
    }
    let end = end.min(largest);
    let objects = entry.track.cached_range(start, end, descending);
    let ok = Message::FetchOk(FetchOk {
        end_of_track: false,
        end_location: Location::new(end.group, end.object.saturating_add(1)),
        params: Parameters::default(),
        properties: entry.track.info().properties,
    });
    if write_message(&mut send, &ok).await.is_err() {
        return Ok(());
    }
    let mut data = match h.session.open_uni().await {
        Ok(s) => s,
        Err(_) => return Ok(()),
    };
    let mut buf = BytesMut::new();
    moqt::data::encode_fetch_header(&mut buf, m.request_id);
    let mut state = FetchState::new(descending);
    for o in objects.iter().filter(|o| o.status == ObjectStatus::Normal) {
        let entry = FetchEntry::Object(FetchObject {
            group: o.group,
            subgroup: o.subgroup,
            object_id: o.object_id,
            priority: o.priority,
            properties: o.properties.clone(),
            payload: o.payload.clone(),
        });
        // Cached objects come sorted, so every entry can follow the previous one.
        if state.try_encode_header(&mut buf, &entry).is_err() {
            let _ = data.reset(reset::INTERNAL_ERROR);
            return Ok(());
        }
        // The header goes first; the payload follows as its own shared chunk.
        if data.write_chunk(buf.split().freeze()).await.is_err() {
            return Ok(());
        }
        if !o.payload.is_empty() && data.write_chunk(o.payload.clone()).await.is_err() {
            return Ok(());
        }
        relay.metrics.objects_out.fetch_add(1, Relaxed);
        relay
            .metrics
            .bytes_out
            .fetch_add(o.payload.len() as u64, Relaxed);
    }
    if !buf.is_empty() {
        let _ = data.write_chunk(buf.split().freeze()).await;
    }
    let _ = data.finish();
    let _ = send.finish();
    Ok(())
}

async fn on_publish_namespace(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: NamespaceRequest,
) -> Result<()> {
    if reserved_namespace(&m.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::UNAUTHORIZED,
            "reserved namespace",
        )
        .await;
        return Ok(());
    }
    if let Err(r) = relay.publish_namespace(m.namespace.clone(), h.clone()) {
        reply_error(&mut send, Some(slot), r.code, &r.reason).await;
        return Ok(());
    }
    let ok = Message::RequestOk(RequestOk::default());
    let _ = write_message(&mut send, &ok).await;
    // The namespace stays published until the publisher cancels the stream.
    let result = loop {
        match reader.next().await {
            Ok(Message::RequestUpdate(u)) => {
                if let Err(e) = ack_update(h, &mut send, &u).await {
                    break Err(e);
                }
            }
            Ok(other) => {
                break Err(SessionError::protocol(format!(
                    "{} on PUBLISH_NAMESPACE stream",
                    other.name()
                )))
            }
            Err(ReadError::Decode(e)) => break Err(e.into()),
            Err(_) => break Ok(()),
        }
    };
    relay.unpublish_namespace(&m.namespace, h.id);
    let _ = send.finish();
    result
}

/// A REQUEST_UPDATE on a namespace-level request: its Request ID is checked
/// and it is acknowledged (the relay keeps no per-request state to change).
async fn ack_update(
    h: &SessionHandle,
    send: &mut SendStream,
    u: &moqt::message::RequestUpdate,
) -> Result<()> {
    h.request_ids
        .lock()
        .expect("ids")
        .accept_peer(u.request_id)?;
    let _ = write_message(send, &Message::RequestOk(RequestOk::default())).await;
    Ok(())
}

fn overlap_check(
    map: &Mutex<HashMap<u64, TrackNamespace>>,
    id: u64,
    prefix: &TrackNamespace,
) -> bool {
    let mut m = map.lock().expect("prefixes");
    if m.values().any(|p| p.overlaps(prefix)) {
        return false;
    }
    m.insert(id, prefix.clone());
    true
}

async fn on_subscribe_namespace(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: NamespaceRequest,
) -> Result<()> {
    if !overlap_check(&h.ns_prefixes, m.request_id, &m.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::PREFIX_OVERLAP,
            "prefix overlaps an existing SUBSCRIBE_NAMESPACE",
        )
        .await;
        return Ok(());
    }
    let id = relay.next_id();
    let (existing, mut rx) = relay.subscribe_namespace(id, m.namespace.clone());
    let mut prefix = m.namespace.clone();
    let result = async {
        let _ = write_message(&mut send, &Message::RequestOk(RequestOk::default())).await;
        let mut active: std::collections::HashSet<TrackNamespace> = Default::default();
        for ns in existing {
            let suffix = ns.suffix_after(&prefix);
            if write_message(&mut send, &Message::Namespace(suffix)).await.is_err() {
                return Ok(());
            }
            active.insert(ns);
        }
        loop {
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else {
                        // The relay dropped us for falling behind.
                        let _ = send.reset(reset::EXCESSIVE_LOAD);
                        return Ok(());
                    };
                    let msg = match ev {
                        NamespaceEvent::Added(ns) if ns.has_prefix(&prefix) && active.insert(ns.clone()) => Message::Namespace(ns.suffix_after(&prefix)),
                        NamespaceEvent::Removed(ns) if active.remove(&ns) => Message::NamespaceDone(ns.suffix_after(&prefix)),
                        _ => continue,
                    };
                    if write_message(&mut send, &msg).await.is_err() {
                        return Ok(());
                    }
                }
                msg = reader.next() => match msg {
                    Ok(Message::RequestUpdate(u)) => {
                        ack_update(h, &mut send, &u).await?;
                        if let Some(p) = u.params.track_namespace_prefix {
                            prefix = p;
                        }
                    }
                    Ok(other) => return Err(SessionError::protocol(format!("{} on SUBSCRIBE_NAMESPACE stream", other.name()))),
                    Err(ReadError::Decode(e)) => return Err(e.into()),
                    Err(_) => return Ok(()),
                }
            }
        }
    }
    .await;
    relay.unsubscribe_namespace(id);
    h.ns_prefixes
        .lock()
        .expect("prefixes")
        .remove(&m.request_id);
    let _ = send.finish();
    result
}

async fn on_subscribe_tracks(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: NamespaceRequest,
) -> Result<()> {
    if !overlap_check(&h.track_prefixes, m.request_id, &m.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::PREFIX_OVERLAP,
            "prefix overlaps an existing SUBSCRIBE_TRACKS",
        )
        .await;
        return Ok(());
    }
    let forward = m.params.forward.unwrap_or(true);
    let id = relay.next_id();
    let (existing, mut rx) = relay.subscribe_tracks(id, m.namespace.clone());
    let _ = write_message(&mut send, &Message::RequestOk(RequestOk::default())).await;
    for e in existing {
        spawn_publish_downstream(relay, h, e, forward);
    }
    let result = loop {
        tokio::select! {
            e = rx.recv() => match e {
                Some(e) => spawn_publish_downstream(relay, h, e, forward),
                None => {
                    // The relay dropped us for falling behind.
                    let _ = send.reset(reset::EXCESSIVE_LOAD);
                    break Ok(());
                }
            },
            msg = reader.next() => match msg {
                Ok(Message::RequestUpdate(u)) => ack_update(h, &mut send, &u).await?,
                Ok(other) => break Err(SessionError::protocol(format!("{} on SUBSCRIBE_TRACKS stream", other.name()))),
                Err(ReadError::Decode(e)) => break Err(e.into()),
                Err(_) => break Ok(()),
            }
        }
    };
    relay.unsubscribe_tracks(id);
    h.track_prefixes
        .lock()
        .expect("prefixes")
        .remove(&m.request_id);
    let _ = send.finish();
    result
}

/// Sends PUBLISH for a track to a SUBSCRIBE_TRACKS subscriber and, once it
/// accepts, delivers the track like a subscription.
fn spawn_publish_downstream(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    entry: Arc<TrackEntry>,
    forward: bool,
) {
    let (relay, h) = (relay.clone(), h.clone());
    tokio::spawn(async move {
        entry.subscribers.fetch_add(1, Relaxed);
        let outcome = async {
            let (mut send, recv) = h.session.open_bi().await.ok()?;
            let joined = entry.track.join(&h.session);
            let request_id = h.next_request_id();
            let publish = Message::Publish(Publish {
                request_id,
                track: entry.track.name.clone(),
                track_alias: entry.track.id,
                params: Parameters {
                    largest_object: joined.largest,
                    forward: (!forward).then_some(false),
                    ..Default::default()
                },
                properties: joined.info.properties.clone(),
            });
            write_message(&mut send, &publish).await.ok()?;
            let mut reader = MessageReader::new(recv, &[]);
            let params = match reader.next().await {
                Ok(Message::PublishOk(ok)) | Ok(Message::RequestOk(ok)) => ok.params,
                _ => return None,
            };
            let _ = serve_subscription(
                &relay,
                &h,
                &mut send,
                None,
                &entry,
                request_id,
                &params,
                Some(joined),
            )
            .await;
            Some(())
        }
        .await;
        let _ = outcome;
        relay.release_track(&entry);
    });
}

async fn on_publish(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: Publish,
) -> Result<()> {
    if reserved_namespace(&m.track.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::UNAUTHORIZED,
            "reserved namespace",
        )
        .await;
        return Ok(());
    }
    if !crate::track::properties_fit(&m.properties) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::NOT_SUPPORTED,
            "track properties too large",
        )
        .await;
        return Ok(());
    }
    let track = Arc::new(Track::new(
        m.track.clone(),
        relay.next_id(),
        relay.config.clone(),
        relay.metrics.clone(),
    ));
    track.set_publisher_session(h.id);
    track.set_info(
        TrackInfo::from_properties(m.properties.clone()),
        m.params.largest_object,
    );
    {
        let mut aliases = h.aliases.lock().expect("aliases");
        if aliases.get(&m.track_alias).is_some_and(|t| !t.is_ended()) {
            return Err(SessionError {
                code: SessionErrorCode::DuplicateTrackAlias,
                reason: "track alias in use".into(),
            });
        }
        aliases.insert(m.track_alias, track.clone());
    }
    h.alias_added.notify_waiters();
    h.replay_early(relay, m.track_alias);
    let entry = match relay.publish_track(track) {
        Ok(e) => e,
        Err(r) => {
            h.aliases.lock().expect("aliases").remove(&m.track_alias);
            reply_error(&mut send, Some(slot), r.code, &r.reason).await;
            return Ok(());
        }
    };
    let ok = Message::PublishOk(RequestOk::default());
    let _ = write_message(&mut send, &ok).await;
    let (status, result) = loop {
        match reader.next().await {
            Ok(Message::PublishDone(d)) => {
                settle(relay, &entry.track, d.stream_count).await;
                break (d.status, Ok(()));
            }
            Ok(Message::RequestOk(_)) => continue,
            Ok(other) => {
                break (
                    publish_done::INTERNAL_ERROR,
                    Err(SessionError::protocol(format!(
                        "{} on PUBLISH stream",
                        other.name()
                    ))),
                )
            }
            Err(ReadError::Decode(e)) => break (publish_done::INTERNAL_ERROR, Err(e.into())),
            Err(_) => break (publish_done::TRACK_ENDED, Ok(())),
        }
    };
    relay.unpublish_track(&entry, status);
    h.aliases.lock().expect("aliases").remove(&m.track_alias);
    let _ = send.finish();
    result
}
