//! Serving a draft-16 peer to a draft-18 relay: a translating bridge.
//!
//! Drafts before 17 run every request over one control stream, name replies
//! by Request ID and encode integers as QUIC varints; draft 18 gives each
//! request its own bidi stream and uses `vi64`. Rather than teach the relay
//! both, [`accept`] stands in for the legacy peer: it opens an in-memory QMux
//! session to the relay (the same transport a WebSocket client gets) and
//! translates, message by message and stream by stream, between that
//! draft-18 session and the peer's real QUIC or WebTransport session. This is
//! the design of moq-dev's `ControlStreamAdapter` (docs/drafts.md).
//!
//! What the bridge does:
//! - the peer's CLIENT_SETUP becomes the relay's SETUP (MAX_REQUEST_ID is
//!   the bridge's to answer), and the relay's SETUP a SERVER_SETUP;
//! - a request on the peer's control stream opens a request stream to the
//!   relay; the relay's replies on it go back with the Request ID; UNSUBSCRIBE
//!   and FETCH_CANCEL reset it, PUBLISH_NAMESPACE_DONE finishes it; the
//!   relay's own requests (SUBSCRIBE upstream, PUBLISH to a subscriber) go the
//!   other way;
//! - a SUBSCRIBE_NAMESPACE stream (draft 16 gives it its own bidi stream)
//!   maps onto a draft-18 SUBSCRIBE_NAMESPACE or SUBSCRIBE_TRACKS stream;
//! - data streams and datagrams are re-encoded by [`moqt::legacy::data`];
//! - either session closing closes the other with the same code.
//!
//! Request IDs and track aliases pass through unchanged: both drafts number
//! requests the same way (client even, server odd, +2 per request).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use moqt::error::{request_error, reset};
use moqt::legacy::control::{Control, LegacyFrameReader, SubscribeOptions, SETUP_MAX_REQUEST_ID};
use moqt::legacy::data::{transcode_datagram, Direction, StreamTranscoder};
use moqt::legacy::Draft;
use moqt::message::{setup_option, RequestError, Setup};
use moqt::{KeyValue, KvValue, Message, SessionErrorCode};
use tokio::sync::mpsc;

use crate::io::{write_message, MessageReader, ReadError};
use crate::mux::{RecvStream, SendStream, Session};

/// MAX_REQUEST_ID the bridge grants the peer: the relay enforces its own
/// request limits on the draft-18 side, so the legacy one is not a second
/// limit (moq-dev grants the same).
const GRANTED_REQUEST_IDS: u64 = u32::MAX as u64;

/// How long the peer may take to open its control stream and send
/// CLIENT_SETUP; the relay's own SETUP timeout runs too, on its side.
const SETUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The in-memory QMux session's limits. The peer's QUIC limits bound what it
/// can open; these only need to not be the tighter ones.
fn bridge_config() -> qmux::Config {
    let mut c = qmux::Config::default();
    c.max_streams_bidi = 10_000;
    c.max_streams_uni = 10_000;
    c.max_data = 16 << 20;
    c.max_stream_data_bidi_local = 1 << 20;
    c.max_stream_data_bidi_remote = 1 << 20;
    c.max_stream_data_uni = 1 << 20;
    c.max_idle_timeout = 0;
    c
}

/// Starts translating `peer`, a session of `draft`, and returns the draft-18
/// session to hand to the relay as if the peer had spoken draft 18. The
/// bridge runs until either side closes.
pub async fn accept(peer: Session, draft: Draft) -> anyhow::Result<Session> {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let config = bridge_config();
    let ta = qmux::transport::Stream::new(a, config.version, config.max_record_size);
    let tb = qmux::transport::Stream::new(b, config.version, config.max_record_size);
    let (ours, relays) = tokio::try_join!(
        qmux::Session::connect(ta, config.clone()),
        qmux::Session::accept(tb, config)
    )?;
    let ours: Session = ours.into();
    tokio::spawn(run(peer, ours, draft));
    Ok(relays.into())
}

/// Why the bridge closes the sessions.
struct Fail {
    code: u32,
    reason: String,
}

impl Fail {
    fn protocol(reason: impl Into<String>) -> Self {
        Fail {
            code: SessionErrorCode::ProtocolViolation.code(),
            reason: reason.into(),
        }
    }
}

/// A request in flight, by Request ID.
struct Request {
    /// The draft-18 stream's send half (ours to write on).
    send: Arc<tokio::sync::Mutex<SendStream>>,
    /// Who opened it.
    by_peer: bool,
    /// Updates awaiting REQUEST_OK, oldest first (draft 18 answers an update
    /// on the request's stream, draft 16 with the update's own Request ID).
    updates: Arc<Mutex<VecDeque<u64>>>,
    /// Reads the draft-18 stream; aborted when the peer cancels.
    pump: Option<tokio::task::AbortHandle>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Subscribe,
    Fetch,
    TrackStatus,
    Publish,
    PublishNamespace,
}

impl Kind {
    fn of(m: &Message) -> Option<Kind> {
        Some(match m {
            Message::Subscribe(_) => Kind::Subscribe,
            Message::Fetch(_) => Kind::Fetch,
            Message::TrackStatus(_) => Kind::TrackStatus,
            Message::Publish(_) => Kind::Publish,
            Message::PublishNamespace(_) => Kind::PublishNamespace,
            _ => return None,
        })
    }
}

struct Bridge {
    draft: Draft,
    peer: Session,
    relay: Session,
    /// Messages for the peer's control stream.
    control: mpsc::Sender<Control>,
    requests: Mutex<HashMap<u64, Request>>,
    /// The peer's MAX_REQUEST_ID for the relay's requests.
    peer_max_request_id: Mutex<u64>,
    fail: mpsc::Sender<Fail>,
}

async fn run(peer: Session, relay: Session, draft: Draft) {
    let (fail_tx, mut fail_rx) = mpsc::channel::<Fail>(4);
    let (control_tx, control_rx) = mpsc::channel::<Control>(256);
    let b = Arc::new(Bridge {
        draft,
        peer: peer.clone(),
        relay: relay.clone(),
        control: control_tx,
        requests: Mutex::new(HashMap::new()),
        peer_max_request_id: Mutex::new(0),
        fail: fail_tx,
    });
    let setup = {
        let b = b.clone();
        tokio::spawn(async move {
            if let Err(f) = b.clone().serve(control_rx).await {
                let _ = b.fail.send(f).await;
            }
        })
    };
    let outcome = tokio::select! {
        f = fail_rx.recv() => f,
        e = peer.closed() => {
            let (code, reason) = e.application_close().unwrap_or((0, e.to_string()));
            relay.close(code, reason.as_bytes());
            None
        }
        e = relay.closed() => {
            let (code, reason) = e.application_close().unwrap_or((0, e.to_string()));
            peer.close(code, reason.as_bytes());
            None
        }
    };
    if let Some(f) = outcome {
        // A read that failed because a session just closed is that close,
        // not a violation: pass its code on.
        let (code, reason) = match (peer.close_reason(), relay.close_reason()) {
            (Some(e), _) | (None, Some(e)) => e.application_close().unwrap_or((0, e.to_string())),
            (None, None) => (f.code, f.reason),
        };
        tracing::debug!(draft = draft.number(), code, %reason, "closing legacy session");
        peer.close(code, reason.as_bytes());
        relay.close(code, reason.as_bytes());
    }
    setup.abort();
    // The relay side stays open a moment so its CONNECTION_CLOSE gets out.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

impl Bridge {
    async fn serve(self: Arc<Self>, control_rx: mpsc::Receiver<Control>) -> Result<(), Fail> {
        // The peer's control stream and its CLIENT_SETUP.
        let (peer_send, peer_recv) = tokio::time::timeout(SETUP_TIMEOUT, self.peer.accept_bi())
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no control stream".into(),
            })?
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        let first = tokio::time::timeout(SETUP_TIMEOUT, reader.next())
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no CLIENT_SETUP".into(),
            })??;
        let Control::ClientSetup { options, .. } = first else {
            return Err(Fail::protocol(format!(
                "{} before CLIENT_SETUP",
                first.name()
            )));
        };
        let mut setup = Setup::default();
        for kv in options {
            if kv.kind == SETUP_MAX_REQUEST_ID {
                if let KvValue::Int(v) = kv.value {
                    *self.peer_max_request_id.lock().expect("max") = v;
                }
            } else {
                setup.options.push(kv);
            }
        }
        setup.options.sort_by_key(|kv| kv.kind);
        let mut relay_control = self
            .relay
            .open_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        write_message(&mut relay_control, &Message::Setup(setup))
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;

        // The relay's control stream: its SETUP, then GOAWAY.
        let relay_uni = self
            .relay
            .accept_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut relay_reader = MessageReader::new(relay_uni, &[]);
        let Ok(Message::Setup(relay_setup)) = relay_reader.next().await else {
            return Err(Fail::protocol("relay sent no SETUP"));
        };
        let mut options = vec![KeyValue::int(SETUP_MAX_REQUEST_ID, GRANTED_REQUEST_IDS)];
        options.extend(relay_setup.options.into_iter().filter(|kv| {
            kv.kind == setup_option::MAX_AUTH_TOKEN_CACHE_SIZE
                || kv.kind == setup_option::MOQT_IMPLEMENTATION
        }));
        let server_setup = Control::ServerSetup {
            version: None,
            options,
        };
        tokio::spawn(write_control(
            self.clone(),
            peer_send,
            server_setup,
            control_rx,
        ));
        {
            let b = self.clone();
            tokio::spawn(async move {
                while let Ok(m) = relay_reader.next().await {
                    if let Message::GoAway(g) = m {
                        let _ = b.control.send(Control::GoAway(g.new_session_uri)).await;
                    }
                }
            });
        }
        self.spawn_streams();
        // The peer's control stream, for the session's life.
        loop {
            let m = reader.next().await?;
            self.on_peer_control(m).await?;
        }
    }

    fn spawn_streams(self: &Arc<Self>) {
        let b = self.clone();
        tokio::spawn(async move {
            while let Ok(s) = b.peer.accept_uni().await {
                let relay = b.relay.clone();
                let draft = b.draft;
                tokio::spawn(async move {
                    if let Ok(out) = relay.open_uni().await {
                        pipe(s, out, StreamTranscoder::new(draft, Direction::ToModern)).await;
                    }
                });
            }
        });
        let b = self.clone();
        tokio::spawn(async move {
            while let Ok(s) = b.relay.accept_uni().await {
                let peer = b.peer.clone();
                let draft = b.draft;
                tokio::spawn(async move {
                    if let Ok(out) = peer.open_uni().await {
                        pipe(s, out, StreamTranscoder::new(draft, Direction::ToLegacy)).await;
                    }
                });
            }
        });
        let b = self.clone();
        tokio::spawn(async move {
            while let Ok(d) = b.peer.read_datagram().await {
                match transcode_datagram(b.draft, Direction::ToModern, &d) {
                    Ok(d) => {
                        let _ = b.relay.send_datagram(d);
                    }
                    Err(e) => {
                        let _ = b.fail.send(Fail::protocol(format!("datagram: {e}"))).await;
                        return;
                    }
                }
            }
        });
        let b = self.clone();
        tokio::spawn(async move {
            while let Ok(d) = b.relay.read_datagram().await {
                if let Ok(d) = transcode_datagram(b.draft, Direction::ToLegacy, &d) {
                    let _ = b.peer.send_datagram(d);
                }
            }
        });
        // The peer's other bidi streams: SUBSCRIBE_NAMESPACE.
        let b = self.clone();
        tokio::spawn(async move {
            while let Ok((send, recv)) = b.peer.accept_bi().await {
                let b = b.clone();
                tokio::spawn(async move {
                    if let Err(f) = b.clone().namespace_stream(send, recv).await {
                        let _ = b.fail.send(f).await;
                    }
                });
            }
        });
        // The relay's requests.
        let b = self.clone();
        tokio::spawn(async move {
            while let Ok((send, recv)) = b.relay.accept_bi().await {
                let b = b.clone();
                tokio::spawn(async move {
                    if let Err(f) = b.clone().relay_request(send, recv).await {
                        let _ = b.fail.send(f).await;
                    }
                });
            }
        });
    }

    async fn on_peer_control(self: &Arc<Self>, m: Control) -> Result<(), Fail> {
        match m {
            Control::Request(m) => self.peer_request(m).await,
            Control::Reply(id, m) => {
                let Some(send) = self.lookup(id, false) else {
                    // A reply racing the relay's cancel: nothing waits for it.
                    return Ok(());
                };
                let ends = matches!(m, Message::PublishDone(_) | Message::RequestError(_));
                let mut send = send.lock().await;
                let _ = write_message(&mut send, &m).await;
                if ends {
                    let _ = send.finish();
                    drop(send);
                    self.remove(id);
                }
                Ok(())
            }
            Control::Update {
                request_id,
                existing,
                params,
            } => {
                let found = {
                    let reqs = self.requests.lock().expect("requests");
                    reqs.get(&existing)
                        .filter(|r| r.by_peer)
                        .map(|r| (r.send.clone(), r.updates.clone()))
                };
                let Some((send, updates)) = found else {
                    let _ = self
                        .control
                        .send(Control::Reply(
                            request_id,
                            Message::RequestError(RequestError {
                                code: request_error::DOES_NOT_EXIST,
                                reason: Bytes::from_static(b"no such request"),
                                ..Default::default()
                            }),
                        ))
                        .await;
                    return Ok(());
                };
                updates.lock().expect("updates").push_back(request_id);
                let u = Message::RequestUpdate(moqt::message::RequestUpdate { request_id, params });
                let _ = write_message(&mut *send.lock().await, &u).await;
                Ok(())
            }
            Control::Unsubscribe(id) | Control::FetchCancel(id) => {
                if let Some(r) = self.take(id, true) {
                    let _ = r.send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::PublishNamespaceDone(id) => {
                if let Some(r) = self.take(id, true) {
                    let _ = r.send.lock().await.finish();
                }
                Ok(())
            }
            Control::PublishNamespaceCancel { request_id, .. } => {
                // The peer refuses a namespace the relay published to it.
                if let Some(r) = self.take(request_id, false) {
                    let _ = r.send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::MaxRequestId(v) => {
                let mut max = self.peer_max_request_id.lock().expect("max");
                if v < *max {
                    return Err(Fail {
                        code: SessionErrorCode::ProtocolViolation.code(),
                        reason: "MAX_REQUEST_ID decreased".into(),
                    });
                }
                *max = v;
                Ok(())
            }
            Control::RequestsBlocked(_) => Ok(()),
            // A client's GOAWAY carries no URI and asks nothing of the relay.
            Control::GoAway(_) => Ok(()),
            other => Err(Fail::protocol(format!(
                "{} on the control stream",
                other.name()
            ))),
        }
    }

    /// A request from the peer: a draft-18 request stream to the relay.
    async fn peer_request(self: &Arc<Self>, m: Message) -> Result<(), Fail> {
        let (Some(id), Some(kind)) = (m.request_id(), Kind::of(&m)) else {
            return Err(Fail::protocol(format!("{} is not a request", m.name())));
        };
        if self.requests.lock().expect("requests").contains_key(&id) {
            return Err(Fail {
                code: SessionErrorCode::InvalidRequestId.code(),
                reason: format!("request ID {id} in use"),
            });
        }
        let (mut send, recv) = self
            .relay
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if write_message(&mut send, &m).await.is_err() {
            return Ok(());
        }
        let send = Arc::new(tokio::sync::Mutex::new(send));
        let updates = Arc::new(Mutex::new(VecDeque::new()));
        let pump = {
            let (b, updates) = (self.clone(), updates.clone());
            tokio::spawn(async move { b.replies(id, kind, recv, updates).await })
        };
        self.requests.lock().expect("requests").insert(
            id,
            Request {
                send,
                by_peer: true,
                updates,
                pump: Some(pump.abort_handle()),
            },
        );
        Ok(())
    }

    /// The relay's replies to the peer's request `id`, until the stream ends.
    async fn replies(
        self: Arc<Self>,
        id: u64,
        kind: Kind,
        recv: RecvStream,
        updates: Arc<Mutex<VecDeque<u64>>>,
    ) {
        let mut reader = MessageReader::new(recv, &[]);
        let mut answered = false;
        let mut done = false;
        loop {
            match reader.next().await {
                Ok(m) => {
                    let to = match &m {
                        // After the first reply, a REQUEST_OK or REQUEST_ERROR
                        // answers the oldest update.
                        Message::RequestOk(_) | Message::RequestError(_) if answered => {
                            match updates.lock().expect("updates").pop_front() {
                                Some(u) => u,
                                None => continue,
                            }
                        }
                        _ => id,
                    };
                    answered = true;
                    done |= matches!(m, Message::PublishDone(_));
                    let m = match m {
                        Message::PublishOk(_)
                        | Message::SubscribeOk(_)
                        | Message::RequestOk(_)
                        | Message::RequestError(_)
                        | Message::FetchOk(_)
                        | Message::PublishDone(_) => m,
                        // Nothing else has a place on a draft-16 control stream.
                        _ => continue,
                    };
                    if self.control.send(Control::Reply(to, m)).await.is_err() {
                        return;
                    }
                }
                Err(ReadError::Finished) => break,
                Err(_) => {
                    // Reset by the relay without a final message.
                    if answered && !done {
                        let last = match kind {
                            Kind::Subscribe | Kind::Publish => {
                                Some(Control::Reply(id, Message::PublishDone(Default::default())))
                            }
                            Kind::PublishNamespace => Some(Control::PublishNamespaceCancel {
                                request_id: id,
                                code: request_error::INTERNAL_ERROR,
                                reason: Bytes::new(),
                            }),
                            _ => None,
                        };
                        if let Some(c) = last {
                            let _ = self.control.send(c).await;
                        }
                    }
                    break;
                }
            }
        }
        if kind == Kind::PublishNamespace && !done {
            // The relay ended a namespace the peer still publishes.
            if self.lookup(id, true).is_some() {
                let _ = self
                    .control
                    .send(Control::PublishNamespaceCancel {
                        request_id: id,
                        code: request_error::INTERNAL_ERROR,
                        reason: Bytes::new(),
                    })
                    .await;
            }
        }
        self.remove(id);
    }

    /// A request the relay opens towards the peer.
    async fn relay_request(
        self: Arc<Self>,
        mut send: SendStream,
        recv: RecvStream,
    ) -> Result<(), Fail> {
        let mut reader = MessageReader::new(recv, &[]);
        let Ok(m) = reader.next().await else {
            return Ok(());
        };
        let (Some(id), Some(kind)) = (m.request_id(), Kind::of(&m)) else {
            // SUBSCRIBE_NAMESPACE and SUBSCRIBE_TRACKS towards a client: the
            // relay does not send them; refuse rather than guess.
            let e = Message::RequestError(RequestError {
                code: request_error::NOT_SUPPORTED,
                reason: Bytes::from_static(b"not available in this draft"),
                ..Default::default()
            });
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
            return Ok(());
        };
        let max = *self.peer_max_request_id.lock().expect("max");
        if id >= max {
            let _ = self.control.send(Control::RequestsBlocked(max)).await;
            let e = Message::RequestError(RequestError {
                code: request_error::EXCESSIVE_LOAD,
                reason: Bytes::from_static(b"peer's MAX_REQUEST_ID reached"),
                ..Default::default()
            });
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
            return Ok(());
        }
        self.requests.lock().expect("requests").insert(
            id,
            Request {
                send: Arc::new(tokio::sync::Mutex::new(send)),
                by_peer: false,
                updates: Arc::new(Mutex::new(VecDeque::new())),
                pump: None,
            },
        );
        if self.control.send(Control::Request(m)).await.is_err() {
            return Ok(());
        }
        // Later messages on the stream, and its end.
        loop {
            match reader.next().await {
                Ok(Message::RequestUpdate(u)) => {
                    let c = Control::Update {
                        request_id: u.request_id,
                        existing: id,
                        params: u.params,
                    };
                    let _ = self.control.send(c).await;
                }
                // PUBLISH_DONE ends the relay's PUBLISH.
                Ok(m @ Message::PublishDone(_)) => {
                    let _ = self.control.send(Control::Reply(id, m)).await;
                    self.remove(id);
                    return Ok(());
                }
                Ok(other) => {
                    return Err(Fail::protocol(format!(
                        "relay sent {} on a request stream",
                        other.name()
                    )))
                }
                Err(_) => break,
            }
        }
        // The relay closed its side: it cancels the request (a reply from the
        // peer that already ended it removed the entry first).
        if self.take(id, false).is_some() {
            let c = match kind {
                Kind::Subscribe => Some(Control::Unsubscribe(id)),
                Kind::Fetch => Some(Control::FetchCancel(id)),
                Kind::PublishNamespace => Some(Control::PublishNamespaceDone(id)),
                Kind::Publish => Some(Control::Reply(id, Message::PublishDone(Default::default()))),
                Kind::TrackStatus => None,
            };
            if let Some(c) = c {
                let _ = self.control.send(c).await;
            }
        }
        Ok(())
    }

    /// A SUBSCRIBE_NAMESPACE stream from the peer.
    async fn namespace_stream(
        self: Arc<Self>,
        mut peer_send: SendStream,
        peer_recv: RecvStream,
    ) -> Result<(), Fail> {
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        let first = match reader.next().await {
            Ok(m) => m,
            Err(_) => return Ok(()),
        };
        let Control::SubscribeNamespace { request, options } = first else {
            return Err(Fail::protocol(format!(
                "{} opening a bidi stream",
                first.name()
            )));
        };
        let id = request.request_id;
        // Draft 16 asks for NAMESPACEs, PUBLISHes or both in one request;
        // draft 18 has a request for each. "Both" gets the namespaces (what
        // moq-dev's subscriber reads); the relay's PUBLISHes need a second
        // Request ID the peer did not allocate.
        let m = match options {
            SubscribeOptions::Publish => Message::SubscribeTracks(request),
            SubscribeOptions::Namespace | SubscribeOptions::Both => {
                Message::SubscribeNamespace(request)
            }
        };
        let (mut send, recv) = self
            .relay
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if write_message(&mut send, &m).await.is_err() {
            return Ok(());
        }
        let mut relay_reader = MessageReader::new(recv, &[]);
        let draft = self.draft;
        let forward = async {
            loop {
                let c = match relay_reader.next().await {
                    Ok(m @ (Message::RequestOk(_) | Message::RequestError(_))) => {
                        Control::Reply(id, m)
                    }
                    Ok(Message::Namespace(ns)) => Control::Namespace(ns),
                    Ok(Message::NamespaceDone(ns)) => Control::NamespaceDone(ns),
                    Ok(_) => continue,
                    Err(ReadError::Finished) => {
                        let _ = peer_send.finish();
                        return;
                    }
                    Err(_) => {
                        let _ = peer_send.reset(reset::INTERNAL_ERROR);
                        return;
                    }
                };
                let Ok(b) = c.to_bytes(draft) else { continue };
                if peer_send.write_all(&b).await.is_err() {
                    return;
                }
            }
        };
        // The peer ends the subscription by closing or resetting its side.
        let cancelled = async {
            loop {
                match reader.next().await {
                    Ok(_) => continue,
                    Err(_) => return,
                }
            }
        };
        tokio::select! {
            _ = forward => {}
            _ = cancelled => { let _ = send.reset(reset::CANCELLED); }
        }
        Ok(())
    }

    fn lookup(&self, id: u64, by_peer: bool) -> Option<Arc<tokio::sync::Mutex<SendStream>>> {
        let reqs = self.requests.lock().expect("requests");
        reqs.get(&id)
            .filter(|r| r.by_peer == by_peer)
            .map(|r| r.send.clone())
    }

    /// Removes request `id` if `by_peer` opened it, stopping its reply pump.
    fn take(&self, id: u64, by_peer: bool) -> Option<Request> {
        let mut reqs = self.requests.lock().expect("requests");
        if reqs.get(&id).is_some_and(|r| r.by_peer == by_peer) {
            let r = reqs.remove(&id)?;
            if let Some(p) = &r.pump {
                p.abort();
            }
            Some(r)
        } else {
            None
        }
    }

    fn remove(&self, id: u64) {
        self.requests.lock().expect("requests").remove(&id);
    }
}

/// Writes SERVER_SETUP, then whatever the bridge sends the peer on its
/// control stream.
async fn write_control(
    b: Arc<Bridge>,
    mut send: SendStream,
    first: Control,
    mut rx: mpsc::Receiver<Control>,
) {
    let mut next = Some(first);
    while let Some(c) = match next.take() {
        Some(c) => Some(c),
        None => rx.recv().await,
    } {
        let mut buf = BytesMut::with_capacity(64);
        if let Err(e) = c.encode(b.draft, &mut buf) {
            // A draft-18 value a varint cannot hold: the relay's own IDs and
            // sizes never get there, so this is a peer's doing upstream.
            let _ = b
                .fail
                .send(Fail {
                    code: SessionErrorCode::InternalError.code(),
                    reason: format!("{}: {e}", c.name()),
                })
                .await;
            return;
        }
        if send.write_all(&buf).await.is_err() {
            return;
        }
    }
}

/// Control messages of a legacy draft from one stream.
struct LegacyReader {
    stream: RecvStream,
    frames: LegacyFrameReader,
}

impl LegacyReader {
    fn new(stream: RecvStream, draft: Draft) -> Self {
        Self {
            stream,
            frames: LegacyFrameReader::new(draft),
        }
    }

    async fn next(&mut self) -> Result<Control, Fail> {
        loop {
            match self.frames.next() {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(e) => {
                    return Err(Fail {
                        code: e.session_code().code(),
                        reason: format!("control message: {e}"),
                    })
                }
            }
            match self.stream.read_chunk(64 * 1024).await {
                Ok(Some(c)) => self.frames.push(&c),
                Ok(None) => return Err(Fail::protocol("control stream closed")),
                Err(e) => return Err(Fail::protocol(format!("control stream: {e}"))),
            }
        }
    }
}

/// Copies one data stream across, re-encoding it; resets and STOP_SENDING
/// travel with it.
async fn pipe(mut from: RecvStream, mut to: SendStream, mut t: StreamTranscoder) {
    let mut out = Vec::new();
    loop {
        let chunk = tokio::select! {
            r = from.read_chunk(64 * 1024) => r,
            s = to.stopped() => {
                let code = s.ok().flatten().unwrap_or(reset::CANCELLED);
                let _ = from.stop(code);
                return;
            }
        };
        match chunk {
            Ok(Some(c)) => {
                if t.push(c, &mut out).is_err() {
                    let _ = from.stop(reset::MALFORMED_TRACK);
                    let _ = to.reset(reset::MALFORMED_TRACK);
                    return;
                }
                for piece in out.drain(..) {
                    if to.write_chunk(piece).await.is_err() {
                        let _ = from.stop(reset::CANCELLED);
                        return;
                    }
                }
            }
            Ok(None) => {
                if t.finish().is_err() {
                    let _ = to.reset(reset::MALFORMED_TRACK);
                } else {
                    let _ = to.finish();
                }
                return;
            }
            Err(e) => {
                let _ = to.reset(reset_code(&e).unwrap_or(reset::INTERNAL_ERROR));
                return;
            }
        }
    }
}

/// The RESET_STREAM code behind a read error, if the peer reset the stream.
fn reset_code(e: &crate::mux::Error) -> Option<u32> {
    match e {
        crate::mux::Error::Read(web_transport_quinn::ReadError::Reset(c)) => Some(*c),
        crate::mux::Error::Qmux(qmux::Error::StreamReset(c)) => u32::try_from(c.into_inner()).ok(),
        _ => None,
    }
}
