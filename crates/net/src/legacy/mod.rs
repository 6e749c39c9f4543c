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
//! The peer's Request IDs and track aliases pass through unchanged; the
//! relay's requests are renumbered into the peer's strict sequence.
//!
//! Modules: `setup` (SETUP in each role, the accept loops), `requests`
//! (requests and replies both ways), `namespace` (namespace
//! subscriptions), `pipe` (data streams).

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
use tokio::sync::mpsc;

use crate::bridge::Fail;
use crate::io::{write_message, MessageReader, ReadError};
use crate::mux::{RecvStream, SendStream, Session};
use pipe::{pipe, Pipe};

mod namespace;
mod pipe;
mod requests;
mod setup;

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
    start(peer, draft, Role::Server, limits, None).await
}

/// [`accept`], with the peer's control stream already accepted and `read`
/// already read from it (to learn the draft, [`crate::sniff`]): the bridge
/// reads CLIENT_SETUP from those bytes on.
pub async fn accept_with_control(
    peer: Session,
    draft: Draft,
    limits: qmux::Config,
    control: (SendStream, RecvStream, Bytes),
) -> anyhow::Result<Session> {
    start(peer, draft, Role::Server, limits, Some(control)).await
}

/// Starts translating `peer`, a server of `draft` this endpoint dialled, and
/// returns the draft-18 session for the client to use as if the server had
/// spoken draft 18 (`quichub pub --draft 14`, ...).
pub async fn connect(peer: Session, draft: Draft) -> anyhow::Result<Session> {
    let limits = crate::websocket::session_config(&crate::QuicConfig::default());
    start(peer, draft, Role::Client, limits, None).await
}

async fn start(
    peer: Session,
    draft: Draft,
    role: Role,
    limits: qmux::Config,
    control: Option<(SendStream, RecvStream, Bytes)>,
) -> anyhow::Result<Session> {
    let config = crate::bridge::config(limits);
    let max_requests = request_limit(&config);
    // The bridge takes the peer's part on the draft-18 side.
    let (bridge_side, other_side) =
        crate::bridge::memory_pair(config, role == Role::Server).await?;
    tokio::spawn(run(peer, bridge_side, draft, role, max_requests, control));
    Ok(other_side)
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
    /// Server role: the peer's control stream, when it was accepted (and
    /// partly read) before the bridge started ([`accept_with_control`]).
    first_control: Mutex<Option<(SendStream, RecvStream, Bytes)>>,
}

async fn run(
    peer: Session,
    relay: Session,
    draft: Draft,
    role: Role,
    max_requests: usize,
    control: Option<(SendStream, RecvStream, Bytes)>,
) {
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
        first_control: Mutex::new(control),
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
    crate::bridge::close_together(&peer, &relay, &mut fail_rx, "legacy").await;
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

    /// Forgets the updates of request `id` still waiting for the peer.
    fn forget_updates(&self, id: u64) {
        self.update_parent
            .lock()
            .expect("updates")
            .retain(|_, parent| *parent != id);
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

#[cfg(test)]
mod tests {
    use super::pipe::map_reset;
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
