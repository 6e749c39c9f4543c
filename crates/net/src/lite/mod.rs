//! Serving a moq-lite peer to the draft-18 relay: a translating bridge.
//!
//! moq-dev's clients (`moq-clock`, the `moq` CLI, `moq-relay`, `@moq/watch`,
//! `@moq/publish`) prefer moq-lite (`moqt::lite`). The relay's core speaks
//! draft 18 only, so [`accept`] stands in for the lite peer as the legacy
//! bridge does for drafts 14 and 16: it opens an in-memory QMux session to
//! the relay and translates between that draft-18 session and the peer's
//! lite session.
//!
//! The mapping (`docs/drafts.md`, "moq-lite"):
//! - a lite broadcast path (below the session's root, the URL path of a
//!   WebTransport or WebSocket session) is a Track Namespace, split on `/`;
//!   a lite track is the track of that name;
//! - the peer's ANNOUNCE_REQUEST becomes a SUBSCRIBE_NAMESPACE, whose
//!   NAMESPACE / NAMESPACE_DONE come back as active / ended announcements;
//! - the bridge asks the peer what it publishes (its own ANNOUNCE_REQUEST
//!   for everything) and turns each active broadcast into a
//!   PUBLISH_NAMESPACE, so the relay subscribes upstream as to any publisher;
//! - a lite SUBSCRIBE becomes a SUBSCRIBE (subscriber priority `255 - p`:
//!   lite's are higher-first), plus a joining FETCH for the current group so
//!   the peer gets it from its first frame, as moq-relay serves it;
//! - a group (one lite stream) is a group of one subgroup; frame `n` is
//!   object `n`; a datagram object is a one-frame group (a lite datagram on
//!   lite-05+ over QUIC and WebTransport, a group stream elsewhere);
//! - lite-05+ frame timestamps are the bridge's milliseconds (TRACK_INFO
//!   timescale 1000): MoQT objects carry none, and hang's own timestamp
//!   stays in the payload.
//!
//! Modules: `reader` (lite messages from a stream), `serve` (the peer
//! subscribes: announcements, subscriptions, tracks, data to the peer),
//! `pull` (the peer publishes: its broadcasts and groups into the relay).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moqt::lite::message::{param, Setup as LiteSetup};
use moqt::lite::{stream, Version};
use moqt::message::Setup;
use moqt::{Message, SessionErrorCode};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::bridge::Fail;
use crate::io::{write_message, MessageReader};
use crate::mux::{RecvStream, SendStream, Session};
use crate::Transport;
use reader::Reader;

mod pull;
mod reader;
mod serve;

/// How long the peer may take to send its SETUP (lite-05+).
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a data stream of the relay waits for the SUBSCRIBE_OK that
/// names its Track Alias (the two travel on different streams).
const ALIAS_WAIT: Duration = Duration::from_secs(5);

/// Subscriptions and announce streams a peer may hold at once through the
/// bridge (beyond, its requests are refused, not queued).
const MAX_REQUESTS: usize = 4096;

/// Largest frame the bridge carries: the relay's default `max_object_size`
/// (a frame split over several reads is buffered whole, so this bounds the
/// memory a stream can hold, as the relay's own limit does for draft 18).
const MAX_OBJECT: usize = 4 * 1024 * 1024;

/// The publisher priority the bridge states (TRACK_INFO, SUBSCRIBE_OK):
/// moq-net's default; lite's priorities are higher-first.
const DEFAULT_PUBLISHER_PRIORITY: u8 = 127;

/// lite-06 route cost "cold" when unknown (moq-net's saturated value).
const COLD_COST_UNKNOWN: u64 = (1 << 62) - 1;

/// lite stream reset codes (moq-net 0.3.18's `src/error.rs`), sent to the
/// peer with `reset_mapped` / `stop_mapped`: in HTTP/3's range on raw QUIC
/// too, where moq-dev's QUIC libraries read them.
mod code {
    /// Routine cancel (unsubscribe).
    pub const CANCEL: u32 = 0x1;
    /// Going away.
    pub const GOING_AWAY: u32 = 0x4;
    /// Malformed track.
    pub const MALFORMED_TRACK: u32 = 0x12;
    /// Not found.
    pub const NOT_FOUND: u32 = 0x33;
    /// Internal.
    pub const INTERNAL: u32 = 0x0;
}

/// How a lite session starts.
pub struct Start {
    /// The version the ALPN, the subprotocol or the legacy CLIENT_SETUP chose.
    pub version: Version,
    /// How the peer reached us (datagrams need QUIC or WebTransport; a raw
    /// QUIC session's PATH comes from the lite SETUP).
    pub transport: Transport,
    /// The URL path (and query) of a WebTransport or WebSocket session: the
    /// session's root is its path; `None` on raw QUIC.
    pub url_path: Option<String>,
    /// lite-01/02: the legacy setup stream and what was read of it (its
    /// CLIENT_SETUP, at least); it stays open as the session stream.
    pub session_stream: Option<(SendStream, RecvStream, bytes::Bytes)>,
}

/// Starts translating `peer`, a lite client, and returns the draft-18
/// session to hand to the relay. The bridge runs until either side closes.
pub async fn accept(peer: Session, start: Start, limits: qmux::Config) -> anyhow::Result<Session> {
    let (bridge_side, relay_side) =
        crate::bridge::memory_pair(crate::bridge::config(limits), true).await?;
    tokio::spawn(run(peer, bridge_side, start));
    Ok(relay_side)
}

/// A subscription of the peer's that the bridge serves (by the relay's
/// Track Alias).
struct Served {
    /// The peer's Subscribe ID.
    id: u64,
    /// Its priority, MoQT's scale (lower first).
    priority: u8,
    /// lite-05+: the subscribe stream, for SUBSCRIBE_START before the first group.
    response: Option<Arc<tokio::sync::Mutex<SendStream>>>,
    /// SUBSCRIBE_START sent (lite-05+).
    started: std::sync::atomic::AtomicBool,
    /// The largest group sequence sent, plus one (SUBSCRIBE_END's value).
    end: AtomicU64,
    /// The group joined mid-way: the joining FETCH writes its first
    /// frames, then the live stream of that group continues it.
    join: Option<(u64, Arc<tokio::sync::Mutex<Option<serve::GroupOut>>>)>,
}

/// A subscription the bridge made to the peer for the relay (by lite
/// Subscribe ID).
struct Pulled {
    /// The Track Alias the bridge gave it towards the relay.
    alias: u64,
    /// Publisher priority towards the relay (MoQT's scale).
    priority: u8,
    /// Group streams opened towards the relay (PUBLISH_DONE's count).
    streams: Arc<AtomicU64>,
}

struct Bridge {
    version: Version,
    transport: Transport,
    /// The session's root path ("" on raw QUIC without a SETUP path).
    root: Mutex<String>,
    peer: Session,
    relay: Session,
    /// Our Hop ID (lite-05+ SETUP and ANNOUNCE_OK; never 0, below 2^53).
    hop: u64,
    /// Draft-18 Request IDs of the bridge's requests (client parity).
    next_request: AtomicU64,
    /// The peer's subscriptions, by the relay's Track Alias.
    served: Mutex<HashMap<u64, Arc<Served>>>,
    /// Woken when `served` gains an entry.
    served_added: Notify,
    /// The peer's Subscribe IDs of open subscriptions (an ID may not be
    /// reused while its subscription is open).
    served_ids: Mutex<std::collections::HashSet<u64>>,
    /// FETCH data streams awaited, by the bridge's Request ID.
    fetches: Mutex<HashMap<u64, oneshot::Sender<(RecvStream, bytes::Bytes)>>>,
    /// Paths the peer publishes (below the root): never announced back to it.
    published: Mutex<std::collections::HashSet<String>>,
    /// The bridge's subscriptions to the peer, by Subscribe ID.
    pulled: Mutex<HashMap<u64, Pulled>>,
    next_subscribe: AtomicU64,
    next_alias: AtomicU64,
    /// Requests the peer has open through the bridge.
    requests: Arc<tokio::sync::Semaphore>,
    /// Frame timestamps (lite-05+) count from here, in milliseconds.
    epoch: Instant,
    fail: mpsc::Sender<Fail>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

async fn run(peer: Session, relay: Session, start: Start) {
    let (fail_tx, mut fail_rx) = mpsc::channel::<Fail>(4);
    let (shutdown, _) = tokio::sync::watch::channel(false);
    let root = start
        .url_path
        .as_deref()
        .map(|p| moqt::lite::path::normalize(p.split('?').next().unwrap_or("")))
        .unwrap_or_default();
    let b = Arc::new(Bridge {
        version: start.version,
        transport: start.transport,
        root: Mutex::new(root),
        peer: peer.clone(),
        relay: relay.clone(),
        hop: hop_id(),
        next_request: AtomicU64::new(0),
        served: Mutex::default(),
        served_added: Notify::new(),
        served_ids: Mutex::default(),
        fetches: Mutex::default(),
        published: Mutex::default(),
        pulled: Mutex::default(),
        next_subscribe: AtomicU64::new(0),
        next_alias: AtomicU64::new(1),
        requests: Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS)),
        epoch: Instant::now(),
        fail: fail_tx,
        shutdown,
    });
    {
        let b2 = b.clone();
        b.spawn(async move {
            if let Err(f) = b2.clone().setup(start.session_stream).await {
                let _ = b2.fail.send(f).await;
            }
        });
    }
    crate::bridge::close_together(&peer, &relay, &mut fail_rx, b.version.label()).await;
    b.shutdown.send_replace(true);
    drop(b);
    // The relay side stays open a moment so its CONNECTION_CLOSE gets out.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A random non-zero Hop ID below 2^53 (`@moq/net` decodes it as a JS number).
fn hop_id() -> u64 {
    use std::hash::BuildHasher;
    // RandomState is seeded from the OS: Hop IDs only need to differ
    // between relays (and bridges) on one route.
    let r = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    (r & ((1 << 53) - 1)).max(1)
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

    fn request_id(&self) -> u64 {
        self.next_request.fetch_add(2, Relaxed)
    }

    fn root(&self) -> String {
        self.root.lock().expect("root").clone()
    }

    /// The Track Namespace of a broadcast path of the peer's.
    fn namespace(&self, broadcast: &str) -> Option<moqt::TrackNamespace> {
        moqt::lite::path::to_namespace(&moqt::lite::path::join(&self.root(), broadcast))
    }

    /// The peer's path of a namespace, if it lies under the session's root.
    fn broadcast(&self, ns: &moqt::TrackNamespace) -> Option<String> {
        let full = moqt::lite::path::from_namespace(ns)?;
        let root = self.root();
        moqt::lite::path::strip_prefix(&full, &root).map(str::to_string)
    }

    /// Milliseconds since the bridge started (lite-05+ frame timestamps).
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Both SETUP exchanges, then every loop of the bridge.
    async fn setup(
        self: Arc<Self>,
        session_stream: Option<(SendStream, RecvStream, bytes::Bytes)>,
    ) -> Result<(), Fail> {
        let v = self.version;
        // lite-01/02: SERVER_SETUP on the client's stream, which then stays
        // open as the session stream: its end ends the session.
        if let Some((mut send, recv, read)) = session_stream {
            let mut r = Reader::with_prefix(recv, &read);
            // The CLIENT_SETUP that chose the version.
            r.read(moqt::lite::message::LegacyClientSetup::decode)
                .await
                .map_err(|e| Fail::protocol(format!("CLIENT_SETUP: {e}")))?
                .ok_or_else(|| Fail::protocol("no CLIENT_SETUP"))?;
            let mut out = bytes::BytesMut::new();
            moqt::lite::message::encode_legacy_server_setup(v, &mut out);
            send.write_all(&out)
                .await
                .map_err(|e| Fail::protocol(e.to_string()))?;
            let b = self.clone();
            self.spawn(async move {
                let _send = send;
                loop {
                    match r.read(moqt::lite::message::SessionUpdate::decode).await {
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => {
                            let _ = b
                                .fail
                                .send(Fail {
                                    code: 0,
                                    reason: "session stream closed".into(),
                                })
                                .await;
                            return;
                        }
                    }
                }
            });
        }
        // lite-05+: our SETUP at once (moq-net serves nothing before it),
        // then the peer's.
        let mut path = None;
        if v.has_setup_stream() {
            let mut s = self
                .peer
                .open_uni()
                .await
                .map_err(|e| Fail::protocol(e.to_string()))?;
            let mut out = bytes::BytesMut::new();
            moqt::legacy::varint::put_varint(&mut out, stream::SETUP);
            LiteSetup::default()
                .with_int(param::HOP, self.hop)
                .encode(&mut out);
            let _ = s.write_all(&out).await;
            let _ = s.finish();
            let recv = tokio::time::timeout(SETUP_TIMEOUT, self.peer.accept_uni())
                .await
                .map_err(|_| Fail {
                    code: SessionErrorCode::ControlMessageTimeout.code(),
                    reason: "no SETUP".into(),
                })?
                .map_err(|e| Fail::protocol(e.to_string()))?;
            let mut r = Reader::new(recv);
            let ty = r
                .read(moqt::legacy::varint::get_varint)
                .await
                .map_err(|e| Fail::protocol(format!("SETUP stream: {e}")))?;
            if ty != Some(stream::SETUP) {
                return Err(Fail::protocol(
                    "the first unidirectional stream is not SETUP",
                ));
            }
            let setup = tokio::time::timeout(SETUP_TIMEOUT, r.read(LiteSetup::decode))
                .await
                .map_err(|_| Fail {
                    code: SessionErrorCode::ControlMessageTimeout.code(),
                    reason: "no SETUP".into(),
                })?
                .map_err(|e| Fail::protocol(format!("SETUP: {e}")))?
                .ok_or_else(|| Fail::protocol("SETUP stream ended"))?;
            // A raw QUIC session names its path (and credentials) here.
            if self.transport == Transport::Quic {
                if let Some(p) = setup.path() {
                    *self.root.lock().expect("root") =
                        moqt::lite::path::normalize(p.split('?').next().unwrap_or(""));
                    path = Some(p.to_string());
                }
            }
        }
        // The relay's side: our SETUP (with the raw QUIC PATH, which carries
        // `?jwt=`), its SETUP, then GOAWAY on its control stream.
        let mut relay_control = self
            .relay
            .open_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let setup = moqt::session::make_setup("quichub moq-lite bridge", None, path.as_deref());
        write_message(&mut relay_control, &Message::Setup(setup))
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let relay_uni = self
            .relay
            .accept_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut relay_reader = MessageReader::new(relay_uni, &[]);
        let Ok(Message::Setup(Setup { .. })) = relay_reader.next().await else {
            return Err(Fail::protocol("relay sent no SETUP"));
        };
        {
            let b = self.clone();
            self.spawn(async move {
                let _control = relay_control;
                while let Ok(m) = relay_reader.next().await {
                    if let Message::GoAway(g) = m {
                        b.goaway(String::from_utf8_lossy(&g.new_session_uri).into_owned())
                            .await;
                    }
                }
            });
        }
        self.spawn_loops();
        Ok(())
    }

    /// GOAWAY to the peer (lite-04+; older versions only see the close).
    async fn goaway(&self, uri: String) {
        if !self.version.has_goaway() {
            return;
        }
        let Ok((mut send, _recv)) = self.peer.open_bi().await else {
            return;
        };
        let mut out = bytes::BytesMut::new();
        moqt::legacy::varint::put_varint(&mut out, stream::GOAWAY);
        moqt::lite::message::GoAway { uri }.encode(self.version, &mut out);
        let _ = send.write_all(&out).await;
        let _ = send.finish();
    }

    fn spawn_loops(self: &Arc<Self>) {
        // The peer's requests.
        let b = self.clone();
        self.spawn(async move {
            while let Ok((send, recv)) = b.peer.accept_bi().await {
                let b2 = b.clone();
                b.spawn(async move { b2.on_peer_bi(send, recv).await });
            }
        });
        // The peer's group streams (what it publishes).
        let b = self.clone();
        self.spawn(async move {
            while let Ok(recv) = b.peer.accept_uni().await {
                let b2 = b.clone();
                b.spawn(async move { b2.on_peer_uni(recv).await });
            }
        });
        // The relay's requests (it subscribes to what the peer publishes).
        let b = self.clone();
        self.spawn(async move {
            while let Ok((send, recv)) = b.relay.accept_bi().await {
                let b2 = b.clone();
                b.spawn(async move { b2.on_relay_bi(send, recv).await });
            }
        });
        // The relay's data streams (what the peer subscribed to).
        let b = self.clone();
        self.spawn(async move {
            while let Ok(recv) = b.relay.accept_uni().await {
                let b2 = b.clone();
                b.spawn(async move { b2.on_relay_uni(recv).await });
            }
        });
        // Datagrams both ways.
        let b = self.clone();
        self.spawn(async move {
            while let Ok(d) = b.relay.read_datagram().await {
                b.on_relay_datagram(d).await;
            }
        });
        if self.version.has_track_stream() && self.transport != Transport::WebSocket {
            let b = self.clone();
            self.spawn(async move {
                while let Ok(d) = b.peer.read_datagram().await {
                    b.on_peer_datagram(d);
                }
            });
        }
        // What the peer publishes: ask it for everything under its root.
        let b = self.clone();
        self.spawn(async move { b.pull_announcements().await });
    }

    /// A bidi stream the peer opened: its type says which request.
    async fn on_peer_bi(self: Arc<Self>, mut send: SendStream, recv: RecvStream) {
        let mut r = Reader::new(recv);
        let ty = match r.read(moqt::legacy::varint::get_varint).await {
            Ok(Some(t)) => t,
            _ => return,
        };
        let Ok(permit) = self.requests.clone().try_acquire_owned() else {
            let _ = send.reset_mapped(code::INTERNAL);
            r.stop(code::INTERNAL);
            return;
        };
        match ty {
            stream::ANNOUNCE => self.serve_announce(send, r).await,
            stream::SUBSCRIBE => self.serve_subscribe(send, r).await,
            stream::TRACK if self.version.has_track_stream() => self.serve_track(send, r).await,
            stream::GOAWAY if self.version.has_goaway() => {
                // The client leaves: nothing to do until it closes.
                let _ = r
                    .read(|b| moqt::lite::message::GoAway::decode(b, self.version))
                    .await;
            }
            // No estimates to report: the probe stream stays open and
            // silent (moq-net 0.1.3 takes a reset code it does not know
            // for an error) until the peer ends it.
            stream::PROBE => {
                drop(permit);
                let v = self.version;
                while let Ok(Some(_)) = r.read(|b| moqt::lite::message::Probe::decode(b, v)).await {
                }
                drop(send);
                return;
            }
            // FETCH and unknown types: refused, the session goes on.
            _ => {
                let _ = send.reset_mapped(code::NOT_FOUND);
                r.stop(code::NOT_FOUND);
            }
        }
        drop(permit);
    }

    /// A uni stream the peer opened: a group of a subscription the bridge made.
    async fn on_peer_uni(self: Arc<Self>, recv: RecvStream) {
        let mut r = Reader::new(recv);
        match r.read(moqt::legacy::varint::get_varint).await {
            Ok(Some(stream::GROUP)) => self.pull_group(r).await,
            Ok(Some(stream::SETUP)) if self.version.has_setup_stream() => {
                let _ = self
                    .fail
                    .send(Fail::protocol("a second SETUP stream"))
                    .await;
            }
            Ok(Some(_)) => r.stop(code::NOT_FOUND),
            _ => {}
        }
    }
}
