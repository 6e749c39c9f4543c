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
use moqt::legacy::control::{
    Control, LegacyFrameReader, NamespaceRef, RequestKind, SubscribeOptions, SETUP_MAX_REQUEST_ID,
};
use moqt::legacy::data::{
    transcode_datagram, Direction, StreamTranscoder, TranscodeError, DEFAULT_PRIORITY,
};
use moqt::legacy::{Draft, VERSION_D14};
use moqt::message::{setup_option, RequestError, RequestUpdate, Setup};
use moqt::{KeyValue, KvValue, Message, SessionErrorCode, TrackNamespace};

/// FETCH_HEADER's stream type (all drafts).
const FETCH_HEADER: u64 = 0x05;
use tokio::sync::mpsc;

use crate::io::{write_message, MessageReader, ReadError};
use crate::mux::{RecvStream, SendStream, Session};

/// MAX_REQUEST_ID the bridge grants the peer: the relay enforces its own
/// request limits on the draft-18 side, so the legacy one is not a second
/// limit (moq-dev grants the same).
const GRANTED_REQUEST_IDS: u64 = u32::MAX as u64;

/// Updates of the relay's requests waiting for the peer's reply, at most
/// (moq-net answers none at drafts 14 to 16: the oldest are forgotten).
const MAX_PENDING_UPDATES: usize = 1024;

/// Updates of one request waiting for the peer's reply, at most.
const MAX_PENDING_UPDATES_PER_REQUEST: usize = 16;

/// The first of the Request IDs the bridge uses towards the relay for
/// requests of its own (above any the peer may use: the MAX_REQUEST_ID
/// granted keeps them below 2^32).
const PRIVATE_IDS: u64 = 1 << 32;

/// How many of those a session may use: the relay keeps each one (they do
/// not join the peer's run of IDs), so past this a namespace subscription
/// that asks for both namespaces and tracks gets the namespaces only.
const MAX_PRIVATE_IDS: u64 = 1024;

/// FETCHes whose data stream has not been seen yet, at most; past it, a
/// fetch stream is read in ascending order under the Request ID it carries.
const MAX_PENDING_FETCHES: usize = 4096;

/// How long the peer may take to open its control stream and send
/// CLIENT_SETUP; the relay's own SETUP timeout runs too, on its side.
const SETUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The in-memory QMux session's limits: `limits` (the stream counts and
/// windows a QUIC peer of the relay gets, as for WebSocket sessions) without
/// the idle timeout, which the peer's own session enforces.
fn bridge_config(limits: qmux::Config) -> qmux::Config {
    let mut c = limits;
    c.max_idle_timeout = 0;
    c
}

/// Most requests a peer may have open through the bridge at once: the
/// relay's draft-18 side grants that many request streams (its QUIC limit),
/// and a legacy peer's requests all share its one control stream, so the
/// bridge answers EXCESSIVE_LOAD beyond it rather than waiting for credit
/// while the UNSUBSCRIBEs that would free it queue behind.
fn request_limit(c: &qmux::Config) -> usize {
    c.max_streams_bidi.clamp(1, 1 << 16) as usize
}

/// Which end of the legacy session the bridge stands in for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The peer is a legacy client; the draft-18 side is the relay.
    Server,
    /// The peer is a legacy server (a relay); the draft-18 side is our client.
    Client,
}

/// Starts translating `peer`, a client of `draft`, and returns the draft-18
/// session to hand to the relay as if the peer had spoken draft 18. The
/// bridge runs until either side closes.
pub async fn accept(peer: Session, draft: Draft, limits: qmux::Config) -> anyhow::Result<Session> {
    start(peer, draft, Role::Server, limits).await
}

/// Starts translating `peer`, a server of `draft` this endpoint dialled, and
/// returns the draft-18 session for the client to use as if the server had
/// spoken draft 18 (`quichub pub --draft 14`, ...).
pub async fn connect(peer: Session, draft: Draft) -> anyhow::Result<Session> {
    let limits = crate::websocket::session_config(&crate::QuicConfig::default());
    start(peer, draft, Role::Client, limits).await
}

async fn start(
    peer: Session,
    draft: Draft,
    role: Role,
    limits: qmux::Config,
) -> anyhow::Result<Session> {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let config = bridge_config(limits);
    let max_requests = request_limit(&config);
    let ta = qmux::transport::Stream::new(a, config.version, config.max_record_size);
    let tb = qmux::transport::Stream::new(b, config.version, config.max_record_size);
    // The bridge takes the peer's part on the draft-18 side.
    let (bridge_side, other_side) = match role {
        Role::Server => {
            let (c, s) = tokio::try_join!(
                qmux::Session::connect(ta, config.clone()),
                qmux::Session::accept(tb, config)
            )?;
            (c, s)
        }
        Role::Client => {
            let (s, c) = tokio::try_join!(
                qmux::Session::accept(ta, config.clone()),
                qmux::Session::connect(tb, config)
            )?;
            (s, c)
        }
    };
    tokio::spawn(run(peer, bridge_side.into(), draft, role, max_requests));
    Ok(other_side.into())
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

/// A request in flight, keyed by its Request ID on the peer's side.
struct Request {
    /// The draft-18 stream's send half (ours to write on); `None` for the
    /// PUBLISH_NAMESPACEs the bridge itself sends a draft-14 peer.
    send: Option<Arc<tokio::sync::Mutex<SendStream>>>,
    kind: RequestKind,
    /// Who opened it: the peer, or the relay (or the bridge).
    by_peer: bool,
    /// The namespace of a PUBLISH_NAMESPACE or SUBSCRIBE_NAMESPACE (draft 14
    /// names them rather than numbering them).
    namespace: Option<TrackNamespace>,
    /// Client role, draft 14: our client's SUBSCRIBE_NAMESPACE (not
    /// SUBSCRIBE_TRACKS), which the server answers with PUBLISH_NAMESPACEs
    /// that the bridge turns into NAMESPACE messages.
    wants_namespaces: bool,
    /// Updates awaiting REQUEST_OK, oldest first (draft 18 answers an update
    /// on the request's stream, draft 16 with the update's own Request ID).
    updates: Arc<Mutex<VecDeque<u64>>>,
    /// Reads the draft-18 stream; aborted when the peer cancels.
    pump: Option<tokio::task::AbortHandle>,
    /// The bridge's share of the relay's request streams, held while a
    /// stream the bridge opened to the relay is open.
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A FETCH whose data stream passes through: its group order, and the
/// relay's Request ID when the stream carries the bridge's.
#[derive(Clone, Copy)]
struct FetchInfo {
    descending: bool,
    relay_id: Option<u64>,
}

struct Bridge {
    draft: Draft,
    role: Role,
    peer: Session,
    relay: Session,
    /// Messages for the peer's control stream.
    control: mpsc::Sender<Control>,
    requests: Mutex<HashMap<u64, Request>>,
    /// The bridge's Request IDs towards the peer: the relay's are renumbered,
    /// so the peer sees the strict sequence drafts 14 and 16 require even
    /// where the bridge sends requests of its own.
    next_id: Mutex<u64>,
    /// Request IDs the bridge uses for requests of its own towards the relay
    /// (the second half of a namespace subscription that asks for both
    /// namespaces and tracks): above any the peer may use, which the
    /// MAX_REQUEST_ID granted keeps below 2^32.
    private_id: Mutex<u64>,
    /// Those requests' streams, by the peer's request they belong to.
    companions: Mutex<HashMap<u64, (SendStream, tokio::sync::OwnedSemaphorePermit)>>,
    /// Request streams the bridge may have open to the relay (the relay's
    /// bidi stream limit): a permit per stream, so the control loop never
    /// waits for stream credit behind the UNSUBSCRIBEs that would free it.
    streams: Arc<tokio::sync::Semaphore>,
    /// Held from taking one of the bridge's Request IDs to queueing the
    /// message that carries it, so they reach the peer in sequence.
    send_order: tokio::sync::Mutex<()>,
    /// The peer's Request ID of an update the relay sent, to its request's.
    update_parent: Mutex<HashMap<u64, u64>>,
    /// The peer's MAX_REQUEST_ID for the bridge's requests.
    peer_max_request_id: Mutex<u64>,
    /// Our control stream on the draft-18 side (client role: GOAWAY goes
    /// there).
    modern_control: tokio::sync::Mutex<Option<SendStream>>,
    /// FETCHes in flight, by the Request ID their data stream carries.
    fetches: Arc<Mutex<HashMap<u64, FetchInfo>>>,
    fail: mpsc::Sender<Fail>,
    /// Set when the bridge ends: every task it spawned stops.
    shutdown: tokio::sync::watch::Sender<bool>,
}

async fn run(peer: Session, relay: Session, draft: Draft, role: Role, max_requests: usize) {
    let (fail_tx, mut fail_rx) = mpsc::channel::<Fail>(4);
    let (shutdown, _) = tokio::sync::watch::channel(false);
    let (control_tx, control_rx) = mpsc::channel::<Control>(256);
    let b = Arc::new(Bridge {
        draft,
        role,
        peer: peer.clone(),
        relay: relay.clone(),
        control: control_tx,
        requests: Mutex::new(HashMap::new()),
        // The bridge numbers its requests as the side it stands for.
        next_id: Mutex::new(match role {
            Role::Server => 1,
            Role::Client => 0,
        }),
        // The parity of the side the bridge stands for towards the relay.
        private_id: Mutex::new(PRIVATE_IDS | u64::from(role == Role::Client)),
        companions: Mutex::new(HashMap::new()),
        update_parent: Mutex::new(HashMap::new()),
        peer_max_request_id: Mutex::new(0),
        modern_control: tokio::sync::Mutex::new(None),
        fetches: Arc::default(),
        fail: fail_tx,
        shutdown,
        streams: Arc::new(tokio::sync::Semaphore::new(max_requests)),
        send_order: tokio::sync::Mutex::new(()),
    });
    {
        let b2 = b.clone();
        b.spawn(async move {
            let b = b2;
            let r = match b.role {
                Role::Server => b.clone().serve(control_rx).await,
                Role::Client => b.clone().serve_client(control_rx).await,
            };
            if let Err(f) = r {
                let _ = b.fail.send(f).await;
            }
        });
    }
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
    // Every task of the bridge ends with it (they hold the bridge, its
    // streams and both sessions).
    b.shutdown.send_replace(true);
    drop(b);
    // The relay side stays open a moment so its CONNECTION_CLOSE gets out.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

fn reply(request_id: u64, to: RequestKind, msg: Message) -> Control {
    Control::Reply {
        request_id,
        to,
        msg,
    }
}

impl Bridge {
    /// Spawns a task that ends, at the latest, with the bridge.
    fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut stop = self.shutdown.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = fut => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }

    /// Checks the Request ID of a new request (or update) of the peer's: its
    /// parity, below the MAX_REQUEST_ID granted, and not in use. Drafts 14
    /// and 16 also want them in sequence, which is not checked here: a
    /// draft-16 SUBSCRIBE_NAMESPACE travels on its own stream and may
    /// overtake the control stream. (The relay refuses duplicates too.)
    fn accept_peer_id(&self, id: u64) -> Result<(), Fail> {
        if !self.peers_id(id)
            || id >= GRANTED_REQUEST_IDS
            || self.requests.lock().expect("requests").contains_key(&id)
        {
            return Err(Fail {
                code: SessionErrorCode::InvalidRequestId.code(),
                reason: format!("request ID {id} is not the peer's, beyond the maximum or in use"),
            });
        }
        Ok(())
    }

    /// Checks a new request's ID as [`Self::accept_peer_id`] does and takes
    /// it, under one lock (a draft-16 SUBSCRIBE_NAMESPACE stream races the
    /// control stream): the entry is a placeholder until the request's
    /// stream to the relay is open.
    fn reserve_peer_id(
        &self,
        id: u64,
        kind: RequestKind,
        namespace: Option<TrackNamespace>,
    ) -> Result<(), Fail> {
        let mut reqs = self.requests.lock().expect("requests");
        if !self.peers_id(id) || id >= GRANTED_REQUEST_IDS || reqs.contains_key(&id) {
            return Err(Fail {
                code: SessionErrorCode::InvalidRequestId.code(),
                reason: format!("request ID {id} is not the peer's, beyond the maximum or in use"),
            });
        }
        reqs.insert(
            id,
            Request {
                send: None,
                kind,
                by_peer: true,
                namespace,
                wants_namespaces: false,
                updates: Arc::default(),
                pump: None,
                permit: None,
            },
        );
        Ok(())
    }

    /// One of the relay's request streams, if the bridge has one to spare.
    fn stream_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.streams.clone().try_acquire_owned().ok()
    }

    /// A request stream to the relay for the peer's request `id`, or
    /// EXCESSIVE_LOAD to the peer when the bridge has as many open as the
    /// relay allows.
    async fn permit_or_refuse(
        &self,
        id: u64,
        kind: RequestKind,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Some(p) = self.stream_permit() {
            return Some(p);
        }
        let e = Message::RequestError(RequestError {
            code: request_error::EXCESSIVE_LOAD,
            reason: Bytes::from_static(b"too many requests open"),
            ..Default::default()
        });
        let _ = self.control.send(reply(id, kind, e)).await;
        None
    }

    /// Takes the bridge's next Request ID towards the peer and queues the
    /// message `make` builds with it, in one step (so IDs reach the peer in
    /// sequence); `None` when the peer's MAX_REQUEST_ID allows no more.
    async fn send_numbered(&self, make: impl FnOnce(u64) -> Control) -> Option<u64> {
        let _order = self.send_order.lock().await;
        let id = self.allocate_id()?;
        self.control.send(make(id)).await.ok()?;
        Some(id)
    }

    /// True when `c` can be written in the peer's draft.
    fn encodable(&self, c: &Control) -> bool {
        c.to_bytes(self.draft).is_ok()
    }

    /// Notes that the peer's reply to update `uid` goes to request `parent`,
    /// forgetting the oldest waiting when there are too many.
    fn expect_update_reply(&self, uid: u64, parent: u64) {
        let mut map = self.update_parent.lock().expect("updates");
        let mine = map.values().filter(|p| **p == parent).count();
        let oldest = if mine >= MAX_PENDING_UPDATES_PER_REQUEST {
            map.iter()
                .filter(|(_, p)| **p == parent)
                .map(|(k, _)| *k)
                .min()
        } else if map.len() >= MAX_PENDING_UPDATES {
            map.keys().min().copied()
        } else {
            None
        };
        if let Some(k) = oldest {
            map.remove(&k);
        }
        map.insert(uid, parent);
    }

    async fn serve(self: Arc<Self>, control_rx: mpsc::Receiver<Control>) -> Result<(), Fail> {
        // The peer's control stream and its CLIENT_SETUP, within one deadline.
        let deadline = tokio::time::Instant::now() + SETUP_TIMEOUT;
        let (mut peer_send, peer_recv) = tokio::time::timeout_at(deadline, self.peer.accept_bi())
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no control stream".into(),
            })?
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        let first = tokio::time::timeout_at(deadline, reader.next())
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no CLIENT_SETUP".into(),
            })??;
        let Control::ClientSetup { versions, options } = first else {
            return Err(Fail::protocol(format!(
                "{} before CLIENT_SETUP",
                first.name()
            )));
        };
        // Draft 14 negotiates in CLIENT_SETUP; the ALPN already chose 16.
        if self.draft == Draft::D14 && !versions.contains(&VERSION_D14) {
            return Err(Fail {
                code: SessionErrorCode::VersionNegotiationFailed.code(),
                reason: format!("no supported version in {versions:x?} (serving draft 14 here)"),
            });
        }
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
        // Control messages go before data when the peer's link is behind.
        let _ = peer_send.set_priority(i32::MAX);
        let server_setup = Control::ServerSetup {
            version: (self.draft == Draft::D14).then_some(VERSION_D14),
            options,
        };
        self.spawn(write_control(
            self.draft,
            peer_send,
            Some(server_setup),
            control_rx,
        ));
        {
            let b = self.clone();
            self.spawn(async move {
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

    /// Client role: our client's SETUP becomes CLIENT_SETUP, the server's
    /// SERVER_SETUP our client's SETUP.
    async fn serve_client(
        self: Arc<Self>,
        control_rx: mpsc::Receiver<Control>,
    ) -> Result<(), Fail> {
        // A server that grants no stream or never answers: the client hears
        // of it as a closed session, not a hang.
        let mut reader = tokio::time::timeout(SETUP_TIMEOUT, self.clone().setup_client(control_rx))
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no SERVER_SETUP exchanged".into(),
            })??;
        self.spawn_streams();
        loop {
            let m = reader.next().await?;
            self.on_peer_control(m).await?;
        }
    }

    /// The client role's SETUP exchange; returns the server's control stream.
    async fn setup_client(
        self: Arc<Self>,
        control_rx: mpsc::Receiver<Control>,
    ) -> Result<LegacyReader, Fail> {
        let uni = self
            .relay
            .accept_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut modern_reader = MessageReader::new(uni, &[]);
        let Ok(Message::Setup(setup)) = modern_reader.next().await else {
            return Err(Fail::protocol("client sent no SETUP"));
        };
        let (mut peer_send, peer_recv) = self
            .peer
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let _ = peer_send.set_priority(i32::MAX);
        let mut options = vec![KeyValue::int(SETUP_MAX_REQUEST_ID, GRANTED_REQUEST_IDS)];
        options.extend(setup.options);
        options.sort_by_key(|kv| kv.kind);
        let client_setup = Control::ClientSetup {
            versions: match self.draft {
                Draft::D14 => vec![VERSION_D14],
                Draft::D16 => Vec::new(),
            },
            options,
        };
        let b = client_setup
            .to_bytes(self.draft)
            .map_err(|e| Fail::protocol(e.to_string()))?;
        peer_send
            .write_all(&b)
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        let first = tokio::time::timeout(SETUP_TIMEOUT, reader.next())
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no SERVER_SETUP".into(),
            })??;
        let Control::ServerSetup { version, options } = first else {
            return Err(Fail::protocol(format!(
                "{} before SERVER_SETUP",
                first.name()
            )));
        };
        if self.draft == Draft::D14 && version != Some(VERSION_D14) {
            return Err(Fail {
                code: SessionErrorCode::VersionNegotiationFailed.code(),
                reason: format!("server chose version {version:x?}"),
            });
        }
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
        let mut control = self
            .relay
            .open_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        write_message(&mut control, &Message::Setup(setup))
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        *self.modern_control.lock().await = Some(control);
        self.spawn(write_control(self.draft, peer_send, None, control_rx));
        // Our client's GOAWAY (no URI) has nothing to say to a server.
        self.spawn(async move { while modern_reader.next().await.is_ok() {} });
        Ok(reader)
    }

    fn spawn_streams(self: &Arc<Self>) {
        let b = self.clone();
        self.spawn(async move {
            while let Ok(s) = b.peer.accept_uni().await {
                let (relay, draft, fetches) = (b.relay.clone(), b.draft, b.fetches.clone());
                let fail = b.fail.clone();
                b.spawn(async move {
                    if let Ok(out) = relay.open_uni().await {
                        let dir = Direction::ToModern;
                        let t = StreamTranscoder::new(draft, dir);
                        pipe(
                            s,
                            out,
                            t,
                            Pipe {
                                draft,
                                dir,
                                fetches,
                                fail,
                            },
                        )
                        .await;
                    }
                });
            }
        });
        let b = self.clone();
        self.spawn(async move {
            while let Ok(s) = b.relay.accept_uni().await {
                let (peer, draft, fetches) = (b.peer.clone(), b.draft, b.fetches.clone());
                let fail = b.fail.clone();
                b.spawn(async move {
                    if let Ok(out) = peer.open_uni().await {
                        let dir = Direction::ToLegacy;
                        let t = StreamTranscoder::new(draft, dir);
                        pipe(
                            s,
                            out,
                            t,
                            Pipe {
                                draft,
                                dir,
                                fetches,
                                fail,
                            },
                        )
                        .await;
                    }
                });
            }
        });
        let b = self.clone();
        self.spawn(async move {
            while let Ok(d) = b.peer.read_datagram().await {
                match transcode_datagram(b.draft, Direction::ToModern, &d) {
                    Ok(d) => {
                        let _ = b.relay.send_datagram(d);
                    }
                    // Draft 14's "does not exist" datagram has no draft-18 form.
                    Err(TranscodeError::Unsupported(_)) => {}
                    Err(e) => {
                        let _ = b.fail.send(Fail::protocol(format!("datagram: {e}"))).await;
                        return;
                    }
                }
            }
        });
        let b = self.clone();
        self.spawn(async move {
            while let Ok(d) = b.relay.read_datagram().await {
                if let Ok(d) = transcode_datagram(b.draft, Direction::ToLegacy, &d) {
                    let _ = b.peer.send_datagram(d);
                }
            }
        });
        // The peer's other bidi streams: draft 16's SUBSCRIBE_NAMESPACE.
        let b = self.clone();
        self.spawn(async move {
            while let Ok((send, recv)) = b.peer.accept_bi().await {
                let b2 = b.clone();
                b.spawn(async move {
                    let b = b2;
                    if let Err(f) = b.clone().namespace_stream(send, recv).await {
                        let _ = b.fail.send(f).await;
                    }
                });
            }
        });
        // The relay's requests.
        let b = self.clone();
        self.spawn(async move {
            while let Ok((send, recv)) = b.relay.accept_bi().await {
                let b2 = b.clone();
                b.spawn(async move {
                    let b = b2;
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
            Control::SubscribeNamespace { request, .. } if self.draft == Draft::D14 => {
                // Draft 14's SUBSCRIBE_NAMESPACE travels on the control
                // stream and is answered with PUBLISH_NAMESPACEs.
                let (id, prefix) = (request.request_id, request.namespace.clone());
                let kind = RequestKind::SubscribeNamespace;
                self.reserve_peer_id(id, kind, Some(prefix.clone()))?;
                let Some(permit) = self.permit_or_refuse(id, kind).await else {
                    self.remove(id);
                    return Ok(());
                };
                let Some((send, reader)) = self
                    .open_namespace_request(request, SubscribeOptions::Both)
                    .await?
                else {
                    self.remove(id);
                    return Ok(());
                };
                self.requests.lock().expect("requests").insert(
                    id,
                    Request {
                        send: Some(Arc::new(tokio::sync::Mutex::new(send))),
                        kind: RequestKind::SubscribeNamespace,
                        by_peer: true,
                        namespace: Some(prefix.clone()),
                        wants_namespaces: false,
                        updates: Arc::default(),
                        pump: None,
                        permit: Some(permit),
                    },
                );
                let b = self.clone();
                self.spawn(async move { b.namespace_subscription_14(id, prefix, reader).await });
                Ok(())
            }
            Control::Reply {
                request_id, msg, ..
            } => {
                self.on_peer_reply(request_id, msg).await;
                Ok(())
            }
            Control::Update {
                request_id,
                existing,
                params,
            } => {
                self.accept_peer_id(request_id)?;
                // The peer's own requests, and the relay's PUBLISHes to it
                // (a subscription the peer holds).
                let found = {
                    let reqs = self.requests.lock().expect("requests");
                    reqs.get(&existing)
                        .filter(|r| r.by_peer || r.kind == RequestKind::Publish)
                        .and_then(|r| Some((r.send.clone()?, r.updates.clone())))
                };
                let Some((send, updates)) = found else {
                    if self.draft != Draft::D14 {
                        let e = Message::RequestError(RequestError {
                            code: request_error::DOES_NOT_EXIST,
                            reason: Bytes::from_static(b"no such request"),
                            ..Default::default()
                        });
                        let _ = self
                            .control
                            .send(reply(request_id, RequestKind::Update, e))
                            .await;
                    }
                    return Ok(());
                };
                updates.lock().expect("updates").push_back(request_id);
                let u = Message::RequestUpdate(RequestUpdate { request_id, params });
                let _ = write_message(&mut *send.lock().await, &u).await;
                Ok(())
            }
            Control::Unsubscribe(id) | Control::FetchCancel(id) => {
                // The peer's SUBSCRIBE or FETCH, or a PUBLISH of the relay's
                // it no longer wants: draft 18 cancels both with a reset.
                let r = self.take(id, true).or_else(|| {
                    let publish = self
                        .requests
                        .lock()
                        .expect("requests")
                        .get(&id)
                        .is_some_and(|r| r.kind == RequestKind::Publish);
                    publish.then(|| self.take(id, false)).flatten()
                });
                if let Some(send) = r.and_then(|r| r.send) {
                    let _ = send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::PublishNamespaceDone(target) => {
                let id = self.resolve(&target, true, RequestKind::PublishNamespace);
                let Some(r) = id.and_then(|id| self.take(id, true)) else {
                    return Ok(());
                };
                match (r.send, r.namespace) {
                    (Some(send), _) => {
                        let _ = send.lock().await.finish();
                    }
                    // One the bridge turned into a NAMESPACE (client role).
                    (None, Some(ns)) => {
                        if let Some((send, prefix)) = self.namespace_subscriber(&ns) {
                            let done = Message::NamespaceDone(ns.suffix_after(&prefix));
                            let _ = write_message(&mut *send.lock().await, &done).await;
                        }
                    }
                    (None, None) => {}
                }
                Ok(())
            }
            Control::UnsubscribeNamespace(prefix) => {
                let target = NamespaceRef::Namespace(prefix);
                let id = self.resolve(&target, true, RequestKind::SubscribeNamespace);
                if let Some(send) = id.and_then(|id| self.take(id, true)).and_then(|r| r.send) {
                    let _ = send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::PublishNamespaceCancel { target, .. } => {
                // The peer refuses a namespace the relay published to it.
                let id = self.resolve(&target, false, RequestKind::PublishNamespace);
                if let Some(send) = id.and_then(|id| self.take(id, false)).and_then(|r| r.send) {
                    let _ = send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::MaxRequestId(v) => {
                let mut max = self.peer_max_request_id.lock().expect("max");
                if v < *max {
                    return Err(Fail::protocol("MAX_REQUEST_ID decreased"));
                }
                *max = v;
                Ok(())
            }
            Control::RequestsBlocked(_) => Ok(()),
            // A client's GOAWAY carries no URI and asks nothing of the relay;
            // a server's goes to our client.
            Control::GoAway(uri) => {
                if let Some(c) = self.modern_control.lock().await.as_mut() {
                    let g = Message::GoAway(moqt::message::GoAway {
                        new_session_uri: uri,
                        timeout: 0,
                        request_id: None,
                    });
                    let _ = write_message(c, &g).await;
                }
                Ok(())
            }
            other => Err(Fail::protocol(format!(
                "{} on the control stream",
                other.name()
            ))),
        }
    }

    /// A reply from the peer to a request the relay (or the bridge) sent.
    async fn on_peer_reply(self: &Arc<Self>, id: u64, msg: Message) {
        let parent = self.update_parent.lock().expect("updates").remove(&id);
        let target = parent.unwrap_or(id);
        let found = {
            let reqs = self.requests.lock().expect("requests");
            reqs.get(&target)
                .map(|r| (r.send.clone(), r.by_peer, r.kind))
        };
        match found {
            // PUBLISH_DONE ends the peer's own PUBLISH.
            Some((Some(send), true, RequestKind::Publish))
                if parent.is_none() && matches!(msg, Message::PublishDone(_)) =>
            {
                let mut send = send.lock().await;
                let _ = write_message(&mut send, &msg).await;
                let _ = send.finish();
                drop(send);
                self.take(id, true);
            }
            // The peer's answer to the relay's update of the peer's PUBLISH.
            Some((Some(send), true, _)) if parent.is_some() => {
                let _ = write_message(&mut *send.lock().await, &msg).await;
            }
            // Any other reply belongs to a request the relay (or the bridge)
            // sent.
            Some((_, true, _)) | None => {}
            // The bridge's own PUBLISH_NAMESPACE: nothing waits for a reply.
            Some((None, false, _)) => {
                if matches!(msg, Message::RequestError(_)) && parent.is_none() {
                    self.remove(id);
                }
            }
            Some((Some(send), false, kind)) => {
                let ends = parent.is_none()
                    && matches!(msg, Message::PublishDone(_) | Message::RequestError(_));
                if ends && kind == RequestKind::Fetch {
                    // No data stream will come.
                    self.fetches.lock().expect("fetches").remove(&id);
                }
                let mut send = send.lock().await;
                let _ = write_message(&mut send, &msg).await;
                if ends {
                    let _ = send.finish();
                    drop(send);
                    self.remove(id);
                }
            }
        }
    }

    /// A request from the peer: a draft-18 request stream to the relay.
    async fn peer_request(self: &Arc<Self>, m: Message) -> Result<(), Fail> {
        let (Some(id), Some(kind)) = (m.request_id(), RequestKind::of(&m)) else {
            return Err(Fail::protocol(format!("{} is not a request", m.name())));
        };
        let namespace = match &m {
            Message::PublishNamespace(n) => Some(n.namespace.clone()),
            _ => None,
        };
        self.reserve_peer_id(id, kind, namespace.clone())?;
        if let (Role::Client, Draft::D14, Message::PublishNamespace(n)) =
            (self.role, self.draft, &m)
        {
            if let Some(send) = self.namespace_subscriber(&n.namespace) {
                return self.namespace_from_publish_namespace(id, n, send).await;
            }
        }
        let Some(permit) = self.permit_or_refuse(id, kind).await else {
            self.remove(id);
            return Ok(());
        };
        // Noted before the FETCH goes out: its data stream may come first.
        if let Message::Fetch(f) = &m {
            self.note_fetch(id, f.params.group_order, None);
        }
        let (mut send, recv) = self
            .relay
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if write_message(&mut send, &m).await.is_err() {
            self.fetches.lock().expect("fetches").remove(&id);
            self.remove(id);
            return Ok(());
        }
        self.track_peer_request(id, kind, namespace, send, recv, permit);
        Ok(())
    }

    /// Client role, draft 14: the SUBSCRIBE_NAMESPACE of our client that
    /// `ns` falls under: its stream and prefix.
    fn namespace_subscriber(
        &self,
        ns: &TrackNamespace,
    ) -> Option<(Arc<tokio::sync::Mutex<SendStream>>, TrackNamespace)> {
        let reqs = self.requests.lock().expect("requests");
        reqs.values().find_map(|r| {
            let prefix = r.namespace.as_ref()?;
            (r.wants_namespaces && ns.has_prefix(prefix))
                .then(|| Some((r.send.clone()?, prefix.clone())))
                .flatten()
        })
    }

    /// A draft-14 server's PUBLISH_NAMESPACE under our client's namespace
    /// subscription: NAMESPACE on that subscription's stream, and
    /// PUBLISH_NAMESPACE_OK for the server.
    async fn namespace_from_publish_namespace(
        &self,
        id: u64,
        n: &moqt::message::NamespaceRequest,
        (send, prefix): (Arc<tokio::sync::Mutex<SendStream>>, TrackNamespace),
    ) -> Result<(), Fail> {
        let suffix = n.namespace.suffix_after(&prefix);
        let _ = write_message(&mut *send.lock().await, &Message::Namespace(suffix)).await;
        self.requests.lock().expect("requests").insert(
            id,
            Request {
                send: None,
                kind: RequestKind::PublishNamespace,
                by_peer: true,
                namespace: Some(n.namespace.clone()),
                wants_namespaces: false,
                updates: Arc::default(),
                pump: None,
                permit: None,
            },
        );
        let ok = reply(
            id,
            RequestKind::PublishNamespace,
            Message::RequestOk(Default::default()),
        );
        let _ = self.control.send(ok).await;
        Ok(())
    }

    /// Registers a request the peer opened and starts carrying the relay's
    /// replies to it back.
    fn track_peer_request(
        self: &Arc<Self>,
        id: u64,
        kind: RequestKind,
        namespace: Option<TrackNamespace>,
        send: SendStream,
        recv: RecvStream,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let updates: Arc<Mutex<VecDeque<u64>>> = Arc::default();
        // In the table before the pump starts, which may remove it at once.
        self.requests.lock().expect("requests").insert(
            id,
            Request {
                send: Some(Arc::new(tokio::sync::Mutex::new(send))),
                kind,
                by_peer: true,
                namespace,
                wants_namespaces: false,
                updates: updates.clone(),
                pump: None,
                permit: Some(permit),
            },
        );
        let b = self.clone();
        let mut stop = self.shutdown.subscribe();
        let pump = tokio::spawn(async move {
            tokio::select! {
                () = b.replies(id, kind, recv, updates) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
        if let Some(r) = self.requests.lock().expect("requests").get_mut(&id) {
            r.pump = Some(pump.abort_handle());
        }
    }

    /// The relay's replies to the peer's request `id`, until the stream ends.
    async fn replies(
        self: Arc<Self>,
        id: u64,
        kind: RequestKind,
        recv: RecvStream,
        updates: Arc<Mutex<VecDeque<u64>>>,
    ) {
        let mut reader = MessageReader::new(recv, &[]);
        let mut answered = false;
        let mut done = false;
        loop {
            match reader.next().await {
                Ok(m) => {
                    let (to, kind) = match &m {
                        // After the first reply, a REQUEST_OK or REQUEST_ERROR
                        // answers the oldest update.
                        Message::RequestOk(_) | Message::RequestError(_) if answered => {
                            match updates.lock().expect("updates").pop_front() {
                                Some(u) => (u, RequestKind::Update),
                                None => continue,
                            }
                        }
                        _ => (id, kind),
                    };
                    match m {
                        Message::PublishOk(_)
                        | Message::SubscribeOk(_)
                        | Message::RequestOk(_)
                        | Message::RequestError(_)
                        | Message::FetchOk(_)
                        | Message::PublishDone(_) => {}
                        // The relay, subscriber of the peer's PUBLISH,
                        // updates it (NEW_GROUP_REQUEST, FORWARD).
                        Message::RequestUpdate(u) => {
                            self.relay_updates_peer_request(id, u.params).await;
                            continue;
                        }
                        // Nothing else has a place on a legacy control stream.
                        _ => continue,
                    }
                    if kind == RequestKind::Fetch && matches!(m, Message::RequestError(_)) {
                        // No data stream will come.
                        self.fetches.lock().expect("fetches").remove(&id);
                    }
                    answered = true;
                    // Draft 14 does not answer SUBSCRIBE_UPDATE.
                    if kind == RequestKind::Update && self.draft == Draft::D14 {
                        continue;
                    }
                    done |= matches!(m, Message::PublishDone(_));
                    let c = reply(to, kind, m);
                    if !self.encodable(&c) {
                        // A draft-18 value the old draft cannot carry (from
                        // another publisher): the peer is told, and the
                        // request ends, rather than the peer waiting.
                        tracing::debug!(
                            draft = self.draft.number(),
                            message = c.name(),
                            "not translatable"
                        );
                        let e = Message::RequestError(RequestError {
                            code: request_error::INTERNAL_ERROR,
                            reason: Bytes::from_static(b"reply not representable in this draft"),
                            ..Default::default()
                        });
                        let _ = self.control.send(reply(to, kind, e)).await;
                        if let Some(send) = self.lookup(id, true) {
                            let _ = send.lock().await.reset(reset::CANCELLED);
                        }
                        break;
                    }
                    if self.control.send(c).await.is_err() {
                        return;
                    }
                }
                Err(ReadError::Finished) => break,
                Err(_) => {
                    // Reset by the relay without a final message.
                    if answered && !done {
                        if let Some(c) = self.ended_by_relay(id, kind) {
                            let _ = self.control.send(c).await;
                        }
                        done = true;
                    }
                    break;
                }
            }
        }
        if kind == RequestKind::PublishNamespace && answered && !done {
            // The relay ended a namespace the peer still publishes.
            if let Some(c) = self.ended_by_relay(id, kind) {
                let _ = self.control.send(c).await;
            }
        }
        self.remove(id);
    }

    /// The relay's REQUEST_UPDATE of the peer's request `id` (a PUBLISH it
    /// subscribes to): SUBSCRIBE_UPDATE or REQUEST_UPDATE to the peer. Draft
    /// 16 answers it under the update's own Request ID, routed back to this
    /// request's stream; draft 14 does not, so the bridge answers.
    async fn relay_updates_peer_request(&self, id: u64, params: moqt::Parameters) {
        let uid = self
            .send_numbered(|uid| {
                if self.draft == Draft::D16 {
                    self.expect_update_reply(uid, id);
                }
                Control::Update {
                    request_id: uid,
                    existing: id,
                    params,
                }
            })
            .await;
        let answer = match (uid, self.draft) {
            (Some(_), Draft::D16) => None,
            (Some(_), Draft::D14) => Some(Message::RequestOk(Default::default())),
            (None, _) => Some(Message::RequestError(RequestError {
                code: request_error::EXCESSIVE_LOAD,
                reason: Bytes::from_static(b"peer's MAX_REQUEST_ID reached"),
                ..Default::default()
            })),
        };
        if let (Some(a), Some(send)) = (answer, self.lookup(id, true)) {
            let _ = write_message(&mut *send.lock().await, &a).await;
        }
    }

    /// What tells the peer the relay ended its request `id` without a reply
    /// that says so.
    fn ended_by_relay(&self, id: u64, kind: RequestKind) -> Option<Control> {
        match kind {
            RequestKind::Subscribe => {
                Some(reply(id, kind, Message::PublishDone(Default::default())))
            }
            // The relay, subscriber of the peer's PUBLISH, cancelled it.
            RequestKind::Publish => Some(Control::Unsubscribe(id)),
            RequestKind::PublishNamespace => {
                let target = match self.draft {
                    Draft::D16 => NamespaceRef::Id(id),
                    Draft::D14 => NamespaceRef::Namespace(
                        self.requests
                            .lock()
                            .expect("requests")
                            .get(&id)?
                            .namespace
                            .clone()?,
                    ),
                };
                Some(Control::PublishNamespaceCancel {
                    target,
                    code: request_error::INTERNAL_ERROR,
                    reason: Bytes::new(),
                })
            }
            _ => None,
        }
    }

    /// True for a Request ID of the peer's parity (a client's are even).
    fn peers_id(&self, id: u64) -> bool {
        match self.role {
            Role::Server => id % 2 == 0,
            Role::Client => id % 2 == 1,
        }
    }

    /// The next Request ID the bridge uses towards the peer, if the peer's
    /// MAX_REQUEST_ID allows it.
    fn allocate_id(&self) -> Option<u64> {
        let max = *self.peer_max_request_id.lock().expect("max");
        let mut next = self.next_id.lock().expect("next id");
        if *next >= max {
            return None;
        }
        let id = *next;
        *next += 2;
        Some(id)
    }

    /// A request the relay opens towards the peer.
    async fn relay_request(
        self: Arc<Self>,
        mut send: SendStream,
        recv: RecvStream,
    ) -> Result<(), Fail> {
        let mut reader = MessageReader::new(recv, &[]);
        let Ok(mut m) = reader.next().await else {
            return Ok(());
        };
        let refuse = |code, reason: &'static [u8]| {
            Message::RequestError(RequestError {
                code,
                reason: Bytes::from_static(reason),
                ..Default::default()
            })
        };
        let kind = match RequestKind::of(&m) {
            Some(RequestKind::SubscribeNamespace) if self.role == Role::Client => {
                return self.client_namespace_request(send, reader, m).await;
            }
            Some(RequestKind::SubscribeNamespace) | Some(RequestKind::Update) | None => {
                // SUBSCRIBE_NAMESPACE and SUBSCRIBE_TRACKS towards a client:
                // the relay does not send them; refuse rather than guess.
                let e = refuse(request_error::NOT_SUPPORTED, b"not available in this draft");
                let _ = write_message(&mut send, &e).await;
                let _ = send.finish();
                return Ok(());
            }
            Some(k) => k,
        };
        let relay_id = m.request_id().unwrap_or_default();
        let namespace = match &m {
            Message::PublishNamespace(n) => Some(n.namespace.clone()),
            _ => None,
        };
        let order = match &m {
            Message::Fetch(f) => Some(f.params.group_order),
            _ => None,
        };
        // A request the peer's draft cannot carry is refused to the relay
        // here, rather than left waiting for a reply that cannot come.
        set_request_id(&mut m, 0);
        if !self.encodable(&Control::Request(m.clone())) {
            let e = refuse(
                request_error::NOT_SUPPORTED,
                b"not representable in this draft",
            );
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
            return Ok(());
        }
        let updates: Arc<Mutex<VecDeque<u64>>> = Arc::default();
        let send = Arc::new(tokio::sync::Mutex::new(send));
        // The ID is taken, the request registered and sent in one step, so
        // IDs reach the peer in sequence and a fast reply finds its entry.
        let sent = self
            .send_numbered(|id| {
                set_request_id(&mut m, id);
                if let Some(order) = order {
                    self.note_fetch(id, order, Some(relay_id));
                }
                self.requests.lock().expect("requests").insert(
                    id,
                    Request {
                        send: Some(send.clone()),
                        kind,
                        by_peer: false,
                        namespace: namespace.clone(),
                        wants_namespaces: false,
                        updates: updates.clone(),
                        pump: None,
                        permit: None,
                    },
                );
                Control::Request(m)
            })
            .await;
        let Some(id) = sent else {
            let max = *self.peer_max_request_id.lock().expect("max");
            let _ = self.control.send(Control::RequestsBlocked(max)).await;
            let e = refuse(
                request_error::EXCESSIVE_LOAD,
                b"peer's MAX_REQUEST_ID reached",
            );
            let mut send = send.lock().await;
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
            return Ok(());
        };
        // Later messages on the stream, and its end.
        loop {
            match reader.next().await {
                Ok(Message::RequestUpdate(u)) => {
                    let uid = self
                        .send_numbered(|uid| {
                            if self.draft == Draft::D16 {
                                self.expect_update_reply(uid, id);
                            }
                            Control::Update {
                                request_id: uid,
                                existing: id,
                                params: u.params,
                            }
                        })
                        .await;
                    // Draft 14 does not answer: the bridge does.
                    let answer = match (uid, self.draft) {
                        (Some(_), Draft::D16) => None,
                        (Some(_), Draft::D14) => Some(Message::RequestOk(Default::default())),
                        (None, _) => Some(Message::RequestError(RequestError {
                            code: request_error::EXCESSIVE_LOAD,
                            reason: Bytes::from_static(b"peer's MAX_REQUEST_ID reached"),
                            ..Default::default()
                        })),
                    };
                    if let Some(a) = answer {
                        let _ = write_message(&mut *send.lock().await, &a).await;
                    }
                }
                // PUBLISH_DONE ends the relay's PUBLISH.
                Ok(m @ Message::PublishDone(_)) => {
                    let _ = self.control.send(reply(id, kind, m)).await;
                    self.remove(id);
                    return Ok(());
                }
                // The relay's answer to the peer's update of this PUBLISH.
                Ok(m @ (Message::RequestOk(_) | Message::RequestError(_)))
                    if kind == RequestKind::Publish =>
                {
                    let Some(uid) = updates.lock().expect("updates").pop_front() else {
                        continue;
                    };
                    if self.draft != Draft::D14 {
                        let _ = self.control.send(reply(uid, RequestKind::Update, m)).await;
                    }
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
                RequestKind::Subscribe => Some(Control::Unsubscribe(id)),
                RequestKind::Fetch => Some(Control::FetchCancel(id)),
                RequestKind::PublishNamespace => Some(Control::PublishNamespaceDone(
                    match (self.draft, namespace) {
                        (Draft::D14, Some(ns)) => NamespaceRef::Namespace(ns),
                        _ => NamespaceRef::Id(id),
                    },
                )),
                RequestKind::Publish => {
                    Some(reply(id, kind, Message::PublishDone(Default::default())))
                }
                _ => None,
            };
            if let Some(c) = c {
                let _ = self.control.send(c).await;
            }
        }
        Ok(())
    }

    /// Client role: our client's SUBSCRIBE_NAMESPACE or SUBSCRIBE_TRACKS to
    /// a legacy server: its own bidi stream in draft 16, the control stream
    /// in draft 14 (where the server answers with PUBLISH_NAMESPACEs, which
    /// reach our client as such).
    async fn client_namespace_request(
        self: Arc<Self>,
        mut send: SendStream,
        mut reader: MessageReader,
        m: Message,
    ) -> Result<(), Fail> {
        let (mut request, options) = match m {
            Message::SubscribeTracks(n) => (n, SubscribeOptions::Publish),
            Message::SubscribeNamespace(n) => (n, SubscribeOptions::Namespace),
            _ => return Ok(()),
        };
        let refuse = |mut send: SendStream| async move {
            let e = Message::RequestError(RequestError {
                code: request_error::EXCESSIVE_LOAD,
                reason: Bytes::from_static(b"server's MAX_REQUEST_ID reached"),
                ..Default::default()
            });
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
        };
        let prefix = request.namespace.clone();
        if self.draft == Draft::D14 {
            // On the control stream, numbered and registered in one step.
            let send = Arc::new(tokio::sync::Mutex::new(send));
            let sent = self
                .send_numbered(|id| {
                    request.request_id = id;
                    self.requests.lock().expect("requests").insert(
                        id,
                        Request {
                            send: Some(send.clone()),
                            kind: RequestKind::SubscribeNamespace,
                            by_peer: false,
                            namespace: Some(prefix.clone()),
                            wants_namespaces: options == SubscribeOptions::Namespace,
                            updates: Arc::default(),
                            pump: None,
                            permit: None,
                        },
                    );
                    Control::SubscribeNamespace { request, options }
                })
                .await;
            let Some(id) = sent else {
                if let Some(send) = Arc::into_inner(send) {
                    refuse(send.into_inner()).await;
                }
                return Ok(());
            };
            // Until our client ends it.
            while reader.next().await.is_ok() {}
            if self.take(id, false).is_some() {
                let _ = self
                    .control
                    .send(Control::UnsubscribeNamespace(prefix))
                    .await;
            }
            return Ok(());
        }
        // Draft 16: its own stream.
        let Some(id) = self.allocate_id() else {
            refuse(send).await;
            return Ok(());
        };
        request.request_id = id;
        let c = Control::SubscribeNamespace { request, options };
        let (mut peer_send, peer_recv) = self
            .peer
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let _ = peer_send.set_priority(i32::MAX);
        let b = c
            .to_bytes(self.draft)
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if peer_send.write_all(&b).await.is_err() {
            return Ok(());
        }
        let mut peer_reader = LegacyReader::new(peer_recv, self.draft);
        let forward = async {
            loop {
                let m = match peer_reader.next().await {
                    Ok(Control::Reply { msg, .. }) => msg,
                    Ok(Control::Namespace(ns)) => Message::Namespace(ns),
                    Ok(Control::NamespaceDone(ns)) => Message::NamespaceDone(ns),
                    Ok(_) => continue,
                    Err(_) => {
                        let _ = send.finish();
                        return;
                    }
                };
                if write_message(&mut send, &m).await.is_err() {
                    return;
                }
            }
        };
        let cancelled = async { while reader.next().await.is_ok() {} };
        tokio::select! {
            _ = forward => {}
            _ = cancelled => { let _ = peer_send.reset(reset::CANCELLED); }
        }
        Ok(())
    }

    /// Opens the draft-18 request for a namespace subscription: namespaces
    /// only, or (draft 16's option 0) tracks.
    async fn open_namespace_request(
        self: &Arc<Self>,
        request: moqt::message::NamespaceRequest,
        options: SubscribeOptions,
    ) -> Result<Option<(SendStream, MessageReader)>, Fail> {
        // Drafts 14 and 16 ask for NAMESPACEs, PUBLISHes or both in one
        // request; draft 18 has a request for each. For both, the bridge
        // adds a SUBSCRIBE_TRACKS of its own, whose replies it drops (the
        // PUBLISHes it brings are requests of the relay's, forwarded).
        let id = request.request_id;
        let m = match options {
            SubscribeOptions::Publish => Message::SubscribeTracks(request.clone()),
            SubscribeOptions::Namespace | SubscribeOptions::Both => {
                Message::SubscribeNamespace(request.clone())
            }
        };
        let (mut send, recv) = self
            .relay
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if write_message(&mut send, &m).await.is_err() {
            return Ok(None);
        }
        // The second request needs a Request ID of the bridge's (bounded
        // per session) and a request stream to spare; without either the
        // subscription gets the namespaces only.
        let private = {
            let mut p = self.private_id.lock().expect("private id");
            let v = *p;
            let left = v < PRIVATE_IDS + 2 * MAX_PRIVATE_IDS;
            if options == SubscribeOptions::Both && left {
                *p += 2;
            }
            (options == SubscribeOptions::Both && left).then_some(v)
        };
        if let (Some(private), Some(permit)) = (private, private.and_then(|_| self.stream_permit()))
        {
            let tracks = Message::SubscribeTracks(moqt::message::NamespaceRequest {
                request_id: private,
                ..request
            });
            if let Ok((mut s2, recv2)) = self.relay.open_bi().await {
                if write_message(&mut s2, &tracks).await.is_ok() {
                    self.companions
                        .lock()
                        .expect("companions")
                        .insert(id, (s2, permit));
                    self.spawn(async move {
                        let mut r = MessageReader::new(recv2, &[]);
                        while r.next().await.is_ok() {}
                    });
                }
            }
        }
        Ok(Some((send, MessageReader::new(recv, &[]))))
    }

    /// Forgets the updates of request `id` still waiting for the peer.
    fn forget_updates(&self, id: u64) {
        self.update_parent
            .lock()
            .expect("updates")
            .retain(|_, parent| *parent != id);
    }

    /// Ends the bridge's own SUBSCRIBE_TRACKS that goes with request `id`.
    fn drop_companion(&self, id: u64) {
        let companion = self.companions.lock().expect("companions").remove(&id);
        if let Some((mut s, _permit)) = companion {
            let _ = s.reset(reset::CANCELLED);
        }
    }

    /// A SUBSCRIBE_NAMESPACE stream from a draft-16 peer.
    async fn namespace_stream(
        self: Arc<Self>,
        mut peer_send: SendStream,
        peer_recv: RecvStream,
    ) -> Result<(), Fail> {
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        let first = match tokio::time::timeout(SETUP_TIMEOUT, reader.next()).await {
            Ok(Ok(m)) => m,
            _ => return Ok(()),
        };
        let Control::SubscribeNamespace { request, options } = first else {
            return Err(Fail::protocol(format!(
                "{} opening a bidi stream",
                first.name()
            )));
        };
        let id = request.request_id;
        let kind = RequestKind::SubscribeNamespace;
        self.reserve_peer_id(id, kind, Some(request.namespace.clone()))?;
        let _ = peer_send.set_priority(i32::MAX);
        let Some(permit) = self.stream_permit() else {
            self.remove(id);
            let e = reply(
                id,
                RequestKind::SubscribeNamespace,
                Message::RequestError(RequestError {
                    code: request_error::EXCESSIVE_LOAD,
                    reason: Bytes::from_static(b"too many requests open"),
                    ..Default::default()
                }),
            );
            if let Ok(b) = e.to_bytes(self.draft) {
                let _ = peer_send.write_all(&b).await;
            }
            let _ = peer_send.finish();
            return Ok(());
        };
        // Its stream to the relay lives in this task; the table keeps its
        // Request ID taken and its permit.
        if let Some(r) = self.requests.lock().expect("requests").get_mut(&id) {
            r.permit = Some(permit);
        }
        let Some((mut send, mut relay_reader)) =
            self.open_namespace_request(request, options).await?
        else {
            self.remove(id);
            return Ok(());
        };
        let draft = self.draft;
        let forward = async {
            loop {
                let c = match relay_reader.next().await {
                    Ok(m @ (Message::RequestOk(_) | Message::RequestError(_))) => {
                        reply(id, RequestKind::SubscribeNamespace, m)
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
        self.remove(id);
        Ok(())
    }

    /// A draft-14 SUBSCRIBE_NAMESPACE (on the control stream): SUBSCRIBE_
    /// NAMESPACE_OK or _ERROR, then a PUBLISH_NAMESPACE (with the bridge's
    /// own Request ID) for each namespace, PUBLISH_NAMESPACE_DONE when it goes.
    async fn namespace_subscription_14(
        self: Arc<Self>,
        id: u64,
        prefix: TrackNamespace,
        mut reader: MessageReader,
    ) {
        let mut published: HashMap<TrackNamespace, u64> = HashMap::new();
        while let Ok(m) = reader.next().await {
            let c = match m {
                m @ (Message::RequestOk(_) | Message::RequestError(_)) => {
                    reply(id, RequestKind::SubscribeNamespace, m)
                }
                Message::Namespace(suffix) => {
                    let ns = prefix.join(&suffix);
                    let sent = self
                        .send_numbered(|pid| {
                            self.requests.lock().expect("requests").insert(
                                pid,
                                Request {
                                    send: None,
                                    kind: RequestKind::PublishNamespace,
                                    by_peer: false,
                                    namespace: Some(ns.clone()),
                                    wants_namespaces: false,
                                    updates: Arc::default(),
                                    pump: None,
                                    permit: None,
                                },
                            );
                            Control::Request(Message::PublishNamespace(
                                moqt::message::NamespaceRequest {
                                    request_id: pid,
                                    namespace: ns.clone(),
                                    params: Default::default(),
                                },
                            ))
                        })
                        .await;
                    // No Request ID left (the peer's MAX_REQUEST_ID): this
                    // namespace is not announced to it.
                    if let Some(pid) = sent {
                        published.insert(ns, pid);
                    }
                    continue;
                }
                Message::NamespaceDone(suffix) => {
                    let ns = prefix.join(&suffix);
                    let Some(pid) = published.remove(&ns) else {
                        continue;
                    };
                    self.remove(pid);
                    Control::PublishNamespaceDone(NamespaceRef::Namespace(ns))
                }
                _ => continue,
            };
            if self.control.send(c).await.is_err() {
                break;
            }
        }
        for (ns, pid) in published {
            self.remove(pid);
            let _ = self
                .control
                .send(Control::PublishNamespaceDone(NamespaceRef::Namespace(ns)))
                .await;
        }
        self.remove(id);
    }

    /// The Request ID a draft-14 namespace reference names.
    fn resolve(&self, target: &NamespaceRef, by_peer: bool, kind: RequestKind) -> Option<u64> {
        match target {
            NamespaceRef::Id(id) => Some(*id),
            NamespaceRef::Namespace(ns) => self
                .requests
                .lock()
                .expect("requests")
                .iter()
                .find(|(_, r)| {
                    r.by_peer == by_peer && r.kind == kind && r.namespace.as_ref() == Some(ns)
                })
                .map(|(id, _)| *id),
        }
    }

    fn lookup(&self, id: u64, by_peer: bool) -> Option<Arc<tokio::sync::Mutex<SendStream>>> {
        let reqs = self.requests.lock().expect("requests");
        reqs.get(&id)
            .filter(|r| r.by_peer == by_peer)
            .and_then(|r| r.send.clone())
    }

    /// Removes request `id` if `by_peer` opened it, stopping its reply pump.
    fn take(&self, id: u64, by_peer: bool) -> Option<Request> {
        let r = {
            let mut reqs = self.requests.lock().expect("requests");
            match reqs.get(&id) {
                Some(r) if r.by_peer == by_peer => reqs.remove(&id)?,
                _ => return None,
            }
        };
        self.fetches.lock().expect("fetches").remove(&id);
        self.drop_companion(id);
        self.forget_updates(id);
        if let Some(p) = &r.pump {
            p.abort();
        }
        Some(r)
    }

    /// Forgets request `id`. Its fetch data stream, if any, may still be on
    /// its way: `pipe` takes that entry when it reads the stream's header.
    fn remove(&self, id: u64) {
        self.drop_companion(id);
        self.forget_updates(id);
        self.requests.lock().expect("requests").remove(&id);
    }

    /// Notes a FETCH for its data stream: `id` is the Request ID the stream
    /// will carry, `relay_id` the relay's when the bridge renumbered it.
    fn note_fetch(&self, id: u64, order: Option<moqt::GroupOrder>, relay_id: Option<u64>) {
        let info = FetchInfo {
            descending: order == Some(moqt::GroupOrder::Descending),
            relay_id,
        };
        let mut fetches = self.fetches.lock().expect("fetches");
        if fetches.len() < MAX_PENDING_FETCHES {
            fetches.insert(id, info);
        }
    }
}

/// Rewrites the Request ID of a request message.
fn set_request_id(m: &mut Message, id: u64) {
    match m {
        Message::Subscribe(s) | Message::TrackStatus(s) => s.request_id = id,
        Message::Publish(p) => p.request_id = id,
        Message::Fetch(f) => f.request_id = id,
        Message::PublishNamespace(n)
        | Message::SubscribeNamespace(n)
        | Message::SubscribeTracks(n) => n.request_id = id,
        Message::RequestUpdate(u) => u.request_id = id,
        _ => {}
    }
}

/// Writes SERVER_SETUP, then whatever the bridge sends the peer on its
/// control stream.
async fn write_control(
    draft: Draft,
    mut send: SendStream,
    first: Option<Control>,
    mut rx: mpsc::Receiver<Control>,
) {
    let mut next = first;
    while let Some(c) = match next.take() {
        Some(c) => Some(c),
        None => rx.recv().await,
    } {
        let mut buf = BytesMut::with_capacity(64);
        if let Err(e) = c.encode(draft, &mut buf) {
            // A draft-18 value the old draft cannot carry (an integer of
            // 2^62 or more, say, from a draft-18 publisher): this message is
            // lost, not the session.
            tracing::debug!(
                draft = draft.number(),
                message = c.name(),
                "not translated: {e}"
            );
            continue;
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

/// What a data stream's copy needs besides its two ends.
struct Pipe {
    draft: Draft,
    dir: Direction,
    /// FETCHes in flight: the group order of each, and the relay's Request
    /// ID where the bridge renumbered it (draft 18's fetch streams encode
    /// Group IDs relative to the order).
    fetches: Arc<Mutex<HashMap<u64, FetchInfo>>>,
    fail: mpsc::Sender<Fail>,
}

impl Pipe {
    /// A stream that does not translate. The peer's garbage is a protocol
    /// violation (the draft closes the session on a malformed data stream);
    /// what only has no form in the other draft (draft 14's "does not
    /// exist" status as a subgroup's first object, a value of 2^62 or more)
    /// loses that stream.
    async fn failed(&self, e: TranscodeError, from: &mut RecvStream, to: &mut SendStream) {
        let code = match (&e, self.dir) {
            (TranscodeError::Unsupported(_), _) | (_, Direction::ToLegacy) => reset::INTERNAL_ERROR,
            (_, Direction::ToModern) => {
                let _ = self
                    .fail
                    .send(Fail::protocol(format!("data stream: {e}")))
                    .await;
                reset::MALFORMED_TRACK
            }
        };
        let _ = from.stop(code);
        let _ = to.reset(map_reset(self.draft, self.dir, code));
    }
}

/// Copies one data stream across, re-encoding it; resets and STOP_SENDING
/// travel with it.
async fn pipe(mut from: RecvStream, mut to: SendStream, mut t: StreamTranscoder, p: Pipe) {
    let mut out = Vec::new();
    // The draft-18 stream header, kept to give the stream towards a legacy
    // peer the publisher's priority (the relay's own scheduling of it stays
    // on the in-memory session).
    let mut header = Vec::new();
    loop {
        let chunk = tokio::select! {
            r = from.read_chunk(64 * 1024) => r,
            s = to.stopped() => {
                let code = s.ok().flatten().unwrap_or(reset::CANCELLED);
                // STOP_SENDING goes the other way: back to the source's draft.
                let back = match p.dir {
                    Direction::ToModern => Direction::ToLegacy,
                    Direction::ToLegacy => Direction::ToModern,
                };
                let _ = from.stop(map_reset(p.draft, back, code));
                return;
            }
        };
        match chunk {
            Ok(Some(mut c)) => {
                // The header a byte at a time (a few bytes), so a fetch
                // stream's group order is set before its first object.
                while !t.header_done() && !c.is_empty() {
                    let b = c.split_to(1);
                    if p.dir == Direction::ToLegacy {
                        header.push(b[0]);
                    }
                    if let Err(e) = t.push(b, &mut out) {
                        return p.failed(e, &mut from, &mut to).await;
                    }
                    if t.header_done() && t.fetch_request_id().is_none() && !header.is_empty() {
                        if let Ok(h) = moqt::data::SubgroupHeader::decode(&mut &header[..]) {
                            // Subscriber priority and group order are the
                            // subscription's, which the bridge does not
                            // track by alias: the defaults.
                            let _ = to.set_priority(moqt::priority::stream_priority(
                                DEFAULT_PRIORITY,
                                h.priority.unwrap_or(DEFAULT_PRIORITY),
                                h.group,
                                moqt::GroupOrder::Ascending,
                            ));
                        }
                    }
                    if let (true, Some(id)) = (t.header_done(), t.fetch_request_id()) {
                        let info = p.fetches.lock().expect("fetches").remove(&id);
                        if let Some(info) = info {
                            t.set_descending(info.descending);
                            // The peer answers the bridge's Request ID; the
                            // relay waits for its own.
                            if let Some(relay_id) = info.relay_id {
                                out.clear();
                                let mut h = BytesMut::with_capacity(10);
                                moqt::coding::put_vi64(&mut h, FETCH_HEADER);
                                moqt::coding::put_vi64(&mut h, relay_id);
                                out.push(h.freeze());
                            }
                        }
                    }
                }
                if let Err(e) = t.push(c, &mut out) {
                    return p.failed(e, &mut from, &mut to).await;
                }
                for piece in out.drain(..) {
                    if to.write_chunk(piece).await.is_err() {
                        let _ = from.stop(reset::CANCELLED);
                        return;
                    }
                }
            }
            Ok(None) => {
                match t.finish() {
                    Ok(()) => {
                        let _ = to.finish();
                    }
                    Err(e) => p.failed(e, &mut from, &mut to).await,
                }
                return;
            }
            Err(e) => {
                let code = reset_code(&e).unwrap_or(reset::INTERNAL_ERROR);
                let _ = to.reset(map_reset(p.draft, p.dir, code));
                return;
            }
        }
    }
}

/// A RESET_STREAM or STOP_SENDING code, from the draft of one side to the
/// other's: draft 16 has UNKNOWN_OBJECT_STATUS at 0x4, where draft 18 put
/// GOING_AWAY (and moved UNKNOWN_OBJECT_STATUS to 0x6); draft 14 stops at
/// 0x3. Codes a side does not define become INTERNAL_ERROR.
fn map_reset(draft: Draft, dir: Direction, code: u32) -> u32 {
    const D16_UNKNOWN_OBJECT_STATUS: u32 = 0x4;
    match (dir, draft, code) {
        (_, _, c @ 0x0..=0x3) => c,
        (Direction::ToModern, Draft::D16, D16_UNKNOWN_OBJECT_STATUS) => {
            reset::UNKNOWN_OBJECT_STATUS
        }
        (Direction::ToModern, Draft::D16, reset::MALFORMED_TRACK) => reset::MALFORMED_TRACK,
        (Direction::ToLegacy, _, reset::GOING_AWAY) => reset::SESSION_CLOSED,
        (Direction::ToLegacy, Draft::D16, reset::UNKNOWN_OBJECT_STATUS) => {
            D16_UNKNOWN_OBJECT_STATUS
        }
        (Direction::ToLegacy, Draft::D16, reset::MALFORMED_TRACK) => reset::MALFORMED_TRACK,
        _ => reset::INTERNAL_ERROR,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_codes_follow_each_draft() {
        use Direction::*;
        // Shared codes pass.
        for c in 0..=3 {
            assert_eq!(map_reset(Draft::D16, ToLegacy, c), c);
            assert_eq!(map_reset(Draft::D14, ToModern, c), c);
        }
        // UNKNOWN_OBJECT_STATUS moved from 0x4 to 0x6; 0x4 became GOING_AWAY.
        assert_eq!(
            map_reset(Draft::D16, ToModern, 0x4),
            reset::UNKNOWN_OBJECT_STATUS
        );
        assert_eq!(
            map_reset(Draft::D16, ToLegacy, reset::UNKNOWN_OBJECT_STATUS),
            0x4
        );
        assert_eq!(
            map_reset(Draft::D16, ToLegacy, reset::GOING_AWAY),
            reset::SESSION_CLOSED
        );
        assert_eq!(
            map_reset(Draft::D16, ToLegacy, reset::MALFORMED_TRACK),
            0x12
        );
        // Draft 14 knows only 0 to 3.
        assert_eq!(map_reset(Draft::D14, ToLegacy, reset::MALFORMED_TRACK), 0);
        assert_eq!(map_reset(Draft::D14, ToModern, 0x4), 0);
        assert_eq!(map_reset(Draft::D16, ToLegacy, reset::EXCESSIVE_LOAD), 0);
    }
}
