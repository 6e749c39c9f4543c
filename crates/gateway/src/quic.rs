//! MQTT over QUIC (ALPN `mqtt`), compatible with EMQX's MQTT over QUIC.
//!
//! - **Single-stream mode**: the client opens one bidirectional stream and
//!   every packet travels on it, as on TCP.
//! - **Multi-stream mode**: the first bidirectional stream is the *control*
//!   stream (CONNECT/CONNACK, PINGREQ/PINGRESP, DISCONNECT, AUTH); closing it
//!   ends the connection. Further client-opened streams (*lanes*) carry
//!   PUBLISH, SUBSCRIBE and UNSUBSCRIBE, and the broker answers on the lane
//!   the request came in on: PUBACK/PUBREC/PUBCOMP on the lane of the
//!   PUBLISH/PUBREL, SUBACK/UNSUBACK on the lane of the request, and messages
//!   matching a subscription on the lane where that subscription was made
//!   (its retained messages included). Unidirectional client streams are
//!   read too; their answers go to the control stream.
//!
//! One MQTT session per QUIC connection, run by the same driver as TCP,
//! in the connection's task. This module is its transport: it cuts each
//! stream's bytes into whole packets and appends them to the session's
//! input in arrival order, and routes each packet of the session's output to
//! its lane by packet identifier or by the subscription its topic matches.
//! With one stream (single-stream mode) it only cuts packets.
//!
//! **0-RTT.** A client that resumes a TLS session can send its first packets
//! as 0-RTT data, and the endpoint hands `mqtt` connections over before the
//! handshake completes, so CONNECT and a first PUBLISH can reach the broker
//! half a round trip after the client started. 0-RTT data can be replayed by
//! an attacker (a replayed connection never completes its handshake, but
//! whatever ran before that ran once more), so the router gates it:
//! until the handshake completes it passes only packets that are harmless to
//! repeat, CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ and QoS 1 PUBLISH
//! (at-least-once already allows duplicates); the first other packet (QoS 0
//! or QoS 2 PUBLISH, whose at-most-once / exactly-once a replay would break,
//! acknowledgements, DISCONNECT, ...) and everything after it, from any lane,
//! wait for the handshake, so the session sees the client's order. A
//! connection that ends before its handshake completes ends as if it had
//! sent DISCONNECT: what was held is dropped and the Will is not published.
//! TLS tickets are single-use (see `quichub_net::server`), so a replay
//! against the same server gets no 0-RTT at all; the gate covers the rest.
//! The full policy is in `docs/zero-rtt.md`.
//!
//! Session cleanup: when the control stream or the connection ends, the
//! session's input ends, so the driver publishes the Will (if any), returns the
//! unacknowledged messages to the session and detaches it from the broker,
//! exactly as for a TCP connection that drops.
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quichub_mqtt::{decode, topic, Packet, Version, DEFAULT_MAX_PACKET_SIZE};
use tokio::sync::mpsc;

use quichub_net::tls::{ClientCertConfig, PeerCert};

use crate::broker::Broker;
use crate::driver::{self, Link, Progress};
use crate::metrics::Transport;
use crate::session::{ConnConfig, Peer};

/// A stream of the connection: 0 is the control stream.
type Lane = u64;
const CONTROL: Lane = 0;

/// QUIC application error code when the connection closes normally.
const CLOSE_OK: u32 = 0;

/// How often the transport looks whether the handshake has completed while
/// it holds 0-RTT packets back (quinn tells only the code that accepted the
/// connection when it does).
const HANDSHAKE_POLL: Duration = Duration::from_millis(1);

/// Where the TLS handshake of a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handshake {
    /// Still running: what arrives is 0-RTT data, possibly a replay.
    Pending,
    /// Completed: the client proved it holds the keys.
    Complete,
    /// The connection ended before completing it.
    Failed,
}

fn handshake_state(conn: &quinn::Connection) -> Handshake {
    // rustls exports keying material only once the client's Finished is verified.
    if conn
        .export_keying_material(&mut [0u8; 1], b"EXPORTER-quichub-handshake", b"")
        .is_ok()
    {
        Handshake::Complete
    } else if conn.close_reason().is_some() {
        Handshake::Failed
    } else {
        Handshake::Pending
    }
}

/// Serves one MQTT-over-QUIC connection until it ends.
pub async fn serve_quic(conn: quinn::Connection, broker: Arc<Broker>, cfg: Arc<ConnConfig>) {
    serve_quic_clients(conn, broker, cfg, Arc::new(ClientCertConfig::default())).await
}

/// [`serve_quic`] on an endpoint that asks for client certificates
/// (`quichub_net::server::Server::bind_clients` with the same `clients`):
/// the session starts once the handshake completed (no 0-RTT: the
/// certificate is known only then), and the verified certificate reaches the
/// connection as [`Peer::certificate`], judged by `clients`' policy (a
/// required certificate is enforced at CONNECT, since the endpoint's
/// handshake lets other protocols in without one).
pub async fn serve_quic_clients(
    conn: quinn::Connection,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    clients: Arc<ClientCertConfig>,
) {
    let remote = conn.remote_address();
    let peer = if clients.enabled() {
        let done = tokio::time::timeout(cfg.connect_timeout, async {
            loop {
                match handshake_state(&conn) {
                    Handshake::Pending => tokio::time::sleep(HANDSHAKE_POLL).await,
                    h => return h,
                }
            }
        })
        .await;
        if done != Ok(Handshake::Complete) {
            conn.close(CLOSE_OK.into(), b"handshake not completed");
            return;
        }
        Peer::with_certificate(Transport::Quic, PeerCert::of_quic(&conn), &clients)
    } else {
        Peer::on(Transport::Quic)
    };
    let control = match tokio::time::timeout(cfg.connect_timeout, conn.accept_bi()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%remote, "mqtt/quic: no control stream: {e}");
            return;
        }
        Err(_) => {
            conn.close(CLOSE_OK.into(), b"no stream opened");
            return;
        }
    };
    let max_in = cfg.max_packet_size as usize;
    let (frames_tx, frames_rx) = mpsc::channel::<Inbound>(64);
    let (lanes_tx, lanes_rx) = mpsc::unbounded_channel::<(Lane, quinn::SendStream)>();

    let (ctl_send, ctl_recv) = control;
    let mut readers = tokio::task::JoinSet::new();
    readers.spawn(read_lane(CONTROL, ctl_recv, frames_tx.clone(), max_in));
    let mut link = Streams::new(frames_rx, lanes_rx, || handshake_state(&conn));
    link.lanes.insert(CONTROL, ctl_send);

    let session = async {
        if let Err(e) = driver::serve(broker, cfg, peer, &mut link).await {
            tracing::debug!(%remote, "mqtt/quic: {e}");
        }
    };
    let accept = async {
        let mut next: Lane = 1;
        loop {
            tokio::select! {
                bi = conn.accept_bi() => match bi {
                    Ok((send, recv)) => {
                        let lane = next;
                        next += 1;
                        // Registered before any of its packets can be answered.
                        let _ = lanes_tx.send((lane, send));
                        readers.spawn(read_lane(lane, recv, frames_tx.clone(), max_in));
                    }
                    Err(_) => break,
                },
                uni = conn.accept_uni() => match uni {
                    Ok(recv) => {
                        let lane = next;
                        next += 1;
                        readers.spawn(read_lane(lane, recv, frames_tx.clone(), max_in));
                    }
                    Err(_) => break,
                },
            }
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        () = session => {}
        () = accept => {}
    }
    link.finish().await;
    conn.close(CLOSE_OK.into(), b"");
}

/// What a lane reader hands the router.
enum Inbound {
    /// One whole packet.
    Packet(Lane, Bytes),
    /// Bytes that are not a whole packet the session will take (too large or
    /// a malformed header): handed over as they are so the session refuses
    /// them with the right reason; the lane is not read further.
    Garbage(Lane, Bytes),
    /// The client finished or reset its side of the lane.
    Closed(Lane),
}

/// Where the session's answers go.
#[derive(Default)]
struct Routes {
    version: Option<Version>,
    /// Client packet identifiers in use (PUBLISH QoS 1/2, PUBREL, SUBSCRIBE,
    /// UNSUBSCRIBE) → the lane their answer goes to.
    client_ids: HashMap<u16, Lane>,
    /// Our QoS 1/2 PUBLISH packet identifiers → the lane their PUBREL goes to.
    server_ids: HashMap<u16, Lane>,
    /// Topic filters (share name removed) → the lane of their subscription,
    /// newest last.
    subs: Vec<(String, Lane)>,
    /// Lanes whose client side has ended.
    closed: HashSet<Lane>,
}

impl Routes {
    fn in_use(&self, lane: Lane) -> bool {
        lane == CONTROL
            || self.client_ids.values().any(|l| *l == lane)
            || self.server_ids.values().any(|l| *l == lane)
            || self.subs.iter().any(|(_, l)| *l == lane)
    }

    fn subscribe(&mut self, filter: &str, lane: Lane) {
        let f = match topic::parse_subscription(filter) {
            Ok((_, f)) => f,
            Err(_) => return,
        };
        self.subs.retain(|(g, _)| *g != f);
        self.subs.push((f, lane));
    }

    fn unsubscribe(&mut self, filter: &str) {
        if let Ok((_, f)) = topic::parse_subscription(filter) {
            self.subs.retain(|(g, _)| *g != f);
        }
    }

    /// Notes where the answer to a client packet goes.
    fn inbound(&mut self, lane: Lane, frame: &Bytes) {
        let Some((kind, body)) = split(frame) else {
            return;
        };
        match kind {
            // PUBLISH QoS 1/2: its PUBACK/PUBREC on this lane.
            3 => {
                if let Some((_, qos, Some(id))) = publish_head(frame[0], body) {
                    if qos > 0 {
                        self.client_ids.insert(id, lane);
                    }
                }
            }
            // PUBREL: its PUBCOMP on this lane.
            6 => {
                if let Some(id) = packet_id(body) {
                    self.client_ids.insert(id, lane);
                }
            }
            // PUBCOMP for one of ours: the identifier is free again.
            7 => {
                if let Some(id) = packet_id(body) {
                    self.server_ids.remove(&id);
                }
            }
            // PUBACK for one of ours.
            4 => {
                if let Some(id) = packet_id(body) {
                    self.server_ids.remove(&id);
                }
            }
            // SUBSCRIBE, UNSUBSCRIBE: decoded for their filters.
            8 | 10 => {
                let mut b = BytesMut::from(&frame[..]);
                match decode(&mut b, self.version, DEFAULT_MAX_PACKET_SIZE) {
                    Ok(Some(Packet::Subscribe(s))) => {
                        self.client_ids.insert(s.packet_id, lane);
                        for f in &s.filters {
                            self.subscribe(&f.filter, lane);
                        }
                    }
                    Ok(Some(Packet::Unsubscribe(u))) => {
                        self.client_ids.insert(u.packet_id, lane);
                        for f in &u.filters {
                            self.unsubscribe(f);
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The lane for one packet of the session's output.
    fn outbound(&mut self, frame: &Bytes) -> Lane {
        let Some((kind, body)) = split(frame) else {
            return CONTROL;
        };
        match kind {
            3 => {
                let Some((topic_name, qos, id)) = publish_head(frame[0], body) else {
                    return CONTROL;
                };
                let lane = self
                    .subs
                    .iter()
                    .rev()
                    .find(|(f, _)| topic::matches(f, topic_name))
                    .map_or(CONTROL, |(_, l)| *l);
                if let (true, Some(id)) = (qos > 0, id) {
                    self.server_ids.insert(id, lane);
                }
                lane
            }
            // PUBREL for one of ours: where its PUBLISH went.
            6 => packet_id(body)
                .and_then(|id| self.server_ids.get(&id).copied())
                .unwrap_or(CONTROL),
            // PUBACK, PUBREC, SUBACK, UNSUBACK: where the request came in.
            4 | 5 | 9 | 11 => packet_id(body)
                .and_then(|id| self.client_ids.get(&id).copied())
                .unwrap_or(CONTROL),
            // PUBCOMP ends the client's QoS 2 exchange.
            7 => packet_id(body)
                .and_then(|id| self.client_ids.remove(&id))
                .unwrap_or(CONTROL),
            _ => CONTROL,
        }
    }

    /// After an answer with this packet type went out: free its identifier.
    fn answered(&mut self, frame: &Bytes) {
        if let Some((4 | 9 | 11, body)) = split(frame) {
            if let Some(id) = packet_id(body) {
                self.client_ids.remove(&id);
            }
        }
    }
}

/// Reads one lane and hands its packets to the router, whole.
async fn read_lane(
    lane: Lane,
    mut recv: quinn::RecvStream,
    tx: mpsc::Sender<Inbound>,
    max_packet: usize,
) {
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        loop {
            match frame_len(&buf) {
                Ok(Some(n)) if n <= max_packet => {
                    if buf.len() < n {
                        break;
                    }
                    let p = buf.split_to(n).freeze();
                    if tx.send(Inbound::Packet(lane, p)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                // Too large, or a malformed header.
                Ok(Some(_)) | Err(()) => {
                    let _ = tx.send(Inbound::Garbage(lane, buf.split().freeze())).await;
                    let _ = tx.send(Inbound::Closed(lane)).await;
                    return;
                }
            }
        }
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
            Ok(None) | Err(_) => {
                let _ = tx.send(Inbound::Closed(lane)).await;
                return;
            }
        }
    }
}

/// The input side, without IO: notes each packet's routing facts, passes
/// it through the 0-RTT [`Gate`] and appends what the session may see to
/// its input, in order (packets of other lanes that arrive before the
/// CONNECT wait for it).
struct Inflow {
    routes: Routes,
    gate: Gate,
    /// Packets from other lanes that arrive before the CONNECT wait for it.
    early: Vec<Bytes>,
    /// Their total size, held under [`MAX_EARLY_BYTES`].
    early_bytes: usize,
    connected: bool,
    /// Lanes whose client side ended since the transport last looked.
    closed: Vec<Lane>,
}

/// Whether the session's input goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fed {
    More,
    /// The input ends (the control stream ended, or the handshake failed).
    End,
}

impl Inflow {
    fn new(handshake: Handshake) -> Self {
        Self {
            routes: Routes::default(),
            gate: Gate::new(handshake == Handshake::Complete),
            early: Vec::new(),
            early_bytes: 0,
            connected: false,
            closed: Vec::new(),
        }
    }

    /// Where the handshake stands now: what was held goes to the session
    /// once it completed; if it failed, the input ends.
    fn handshake(&mut self, h: Handshake, to_session: &mut BytesMut) -> Fed {
        if self.gate.open {
            return Fed::More;
        }
        match h {
            Handshake::Pending => Fed::More,
            Handshake::Complete => {
                for held in self.gate.release() {
                    if self.feed(held, to_session) == Fed::End {
                        return Fed::End;
                    }
                }
                Fed::More
            }
            // Never confirmed (a replay, or a client gone mid-handshake):
            // drop what was held, end without the Will.
            Handshake::Failed => {
                self.abandon(to_session);
                Fed::End
            }
        }
    }

    /// One item from a lane.
    fn item(&mut self, item: Inbound, to_session: &mut BytesMut) -> Fed {
        if let Inbound::Packet(lane, p) = &item {
            self.note(*lane, p);
        }
        match self.gate.admit(item) {
            Some(item) => self.feed(item, to_session),
            None => Fed::More,
        }
    }

    /// Notes a packet's routing facts as it arrives (before any gating, so
    /// a held request's answer still finds its lane).
    fn note(&mut self, lane: Lane, p: &Bytes) {
        let r = &mut self.routes;
        if r.version.is_none() && p.first().is_some_and(|b| b >> 4 == 1) {
            let mut b = BytesMut::from(&p[..]);
            if let Ok(Some(Packet::Connect(c))) = decode(&mut b, None, DEFAULT_MAX_PACKET_SIZE) {
                r.version = Some(c.version);
            }
        }
        r.inbound(lane, p);
    }

    /// Hands one item to the session.
    fn feed(&mut self, item: Inbound, to_session: &mut BytesMut) -> Fed {
        let (lane, bytes) = match item {
            Inbound::Packet(lane, p) => (lane, p),
            Inbound::Garbage(lane, b) => (lane, b),
            Inbound::Closed(CONTROL) => return Fed::End,
            Inbound::Closed(lane) => {
                self.routes.closed.insert(lane);
                self.closed.push(lane);
                return Fed::More;
            }
        };
        if !self.connected && lane != CONTROL {
            self.early_bytes += bytes.len();
            if self.early_bytes > MAX_EARLY_BYTES {
                tracing::debug!(
                    bytes = self.early_bytes,
                    "MQTT over QUIC: too much data before CONNECT; closing"
                );
                self.early = Vec::new();
                return Fed::End;
            }
            self.early.push(bytes);
            return Fed::More;
        }
        to_session.extend_from_slice(&bytes);
        if !self.connected {
            self.connected = true;
            for b in std::mem::take(&mut self.early) {
                to_session.extend_from_slice(&b);
            }
            self.early_bytes = 0;
        }
        Fed::More
    }

    /// Ends a connection whose handshake never completed: a DISCONNECT
    /// (normal disconnection, same bytes in 3.1.1 and 5) so the session does
    /// not publish the Will of what may be a replay.
    fn abandon(&mut self, to_session: &mut BytesMut) {
        if self.connected {
            to_session.extend_from_slice(&DISCONNECT);
        }
    }
}

/// The QUIC connection's streams as the session's transport.
struct Streams<H> {
    /// Whole packets from the lane readers.
    frames: mpsc::Receiver<Inbound>,
    /// Lanes the accept loop opened, to answer on.
    opened: mpsc::UnboundedReceiver<(Lane, quinn::SendStream)>,
    lanes: HashMap<Lane, quinn::SendStream>,
    inflow: Inflow,
    handshake: H,
    /// The session's input has ended.
    ended: bool,
    /// The packet being written: its lane, the packet, bytes written.
    writing: Option<(Lane, Bytes, usize)>,
}

/// What the input side waited for.
enum Got {
    Item(Inbound),
    /// Time to look at the handshake again.
    Tick,
    /// No lane reader is left.
    Gone,
}

impl<H: FnMut() -> Handshake> Streams<H> {
    fn new(
        frames: mpsc::Receiver<Inbound>,
        opened: mpsc::UnboundedReceiver<(Lane, quinn::SendStream)>,
        mut handshake: H,
    ) -> Self {
        let inflow = Inflow::new(handshake());
        Self {
            frames,
            opened,
            lanes: HashMap::new(),
            inflow,
            handshake,
            ended: false,
            writing: None,
        }
    }

    /// Takes the lanes the accept loop opened (before answering anything,
    /// so a lane opened before its packets were answered is known).
    fn take_opened(&mut self) {
        while let Ok((lane, s)) = self.opened.try_recv() {
            self.lanes.insert(lane, s);
        }
    }

    /// Finishes a lane whose client side ended, once nothing routes to it.
    fn finish_idle(&mut self, lane: Lane) {
        if lane != CONTROL && !self.inflow.routes.in_use(lane) {
            if let Some(mut s) = self.lanes.remove(&lane) {
                let _ = s.finish();
            }
        }
    }

    /// What arrived from the lanes, after the handshake check.
    /// False once the input has ended (and this call appended nothing).
    fn on_input(&mut self, got: Got, input: &mut BytesMut) -> bool {
        let before = input.len();
        let mut fed = Fed::More;
        if !self.inflow.gate.open {
            fed = self.inflow.handshake((self.handshake)(), input);
        }
        if fed == Fed::More {
            fed = match got {
                Got::Item(item) => self.inflow.item(item, input),
                Got::Tick => Fed::More,
                Got::Gone => Fed::End,
            };
        }
        self.take_opened();
        for lane in std::mem::take(&mut self.inflow.closed) {
            self.finish_idle(lane);
        }
        if fed == Fed::End {
            self.ended = true;
            // The end is reported by the next read, after these bytes.
            return input.len() > before;
        }
        true
    }

    /// A packet was written whole on `lane`.
    fn written(&mut self, lane: Lane, p: &Bytes) {
        self.inflow.routes.answered(p);
        if self.inflow.routes.closed.contains(&lane) {
            self.finish_idle(lane);
        }
    }

    /// Once the session has ended: finishes every lane and waits (briefly)
    /// for the client to have read the control stream to its end.
    async fn finish(&mut self) {
        self.take_opened();
        for s in self.lanes.values_mut() {
            let _ = s.finish();
        }
        if let Some(s) = self.lanes.get(&CONTROL) {
            let _ = tokio::time::timeout(Duration::from_secs(1), s.stopped()).await;
        }
    }
}

impl<H: FnMut() -> Handshake> Link for Streams<H> {
    async fn io(
        &mut self,
        input: &mut BytesMut,
        read: bool,
        output: &mut BytesMut,
        write: bool,
    ) -> std::io::Result<Progress> {
        if read && self.ended {
            return Ok(Progress::Read { more: false });
        }
        if write && self.writing.is_none() {
            // The session's output holds whole packets: take the first on,
            // routed to its lane.
            if let Some(n) = whole(output) {
                self.take_opened();
                let p = output.split_to(n).freeze();
                let lane = self.inflow.routes.outbound(&p);
                let lane = if self.lanes.contains_key(&lane) {
                    lane
                } else {
                    CONTROL
                };
                self.writing = Some((lane, p, 0));
                return Ok(Progress::Wrote);
            }
            // Never left over by the session; dropped rather than stuck.
            output.clear();
            if !read {
                return Ok(Progress::Wrote);
            }
        }
        let writing = self.writing.is_some();
        if !read && !writing {
            return Ok(Progress::Wrote);
        }
        let open = self.inflow.gate.open;
        let holding = self.inflow.gate.holding();
        let frames = &mut self.frames;
        let lanes = &mut self.lanes;
        let current = &self.writing;
        let next = async {
            if open {
                return frames.recv().await.map_or(Got::Gone, Got::Item);
            }
            tokio::select! {
                item = frames.recv() => item.map_or(Got::Gone, Got::Item),
                _ = tokio::time::sleep(HANDSHAKE_POLL), if holding => Got::Tick,
            }
        };
        let send = async {
            let Some((lane, p, off)) = current else {
                return std::future::pending().await;
            };
            match lanes.get_mut(lane) {
                Some(s) => s.write(&p[*off..]).await.map_err(|_| ()),
                None => Err(()),
            }
        };
        tokio::select! {
            got = next, if read => {
                let more = self.on_input(got, input);
                Ok(Progress::Read { more })
            }
            w = send, if writing => {
                let Some((lane, p, off)) = self.writing.as_mut() else {
                    return Ok(Progress::Wrote);
                };
                match w {
                    Ok(n) => {
                        *off += n;
                        if *off >= p.len() {
                            let (lane, p) = (*lane, p.clone());
                            self.writing = None;
                            self.written(lane, &p);
                        }
                    }
                    Err(()) if *lane != CONTROL => {
                        // The client stopped that lane: answer on the control stream.
                        self.lanes.remove(lane);
                        *lane = CONTROL;
                        *off = 0;
                    }
                    Err(()) => {
                        // The connection is gone: the session ends.
                        self.writing = None;
                        return Err(std::io::ErrorKind::BrokenPipe.into());
                    }
                }
                Ok(Progress::Wrote)
            }
        }
    }

    fn busy(&self) -> bool {
        self.writing.is_some()
    }
}

/// DISCONNECT, no reason code (0x00, normal disconnection), no properties.
const DISCONNECT: [u8; 2] = [0xe0, 0x00];

/// Bytes of other lanes' packets that may wait for the CONNECT, at most: a
/// client that streams packets on data lanes without ever connecting would
/// otherwise grow the buffer without bound (the CONNECT timeout alone bounds
/// the time, not the memory).
const MAX_EARLY_BYTES: usize = 256 * 1024;

/// The 0-RTT replay gate: until the handshake completes, only packets that
/// are harmless to run twice go through; the first other one and everything
/// after it (any lane) wait, in order, for the handshake.
struct Gate {
    /// The handshake completed: everything goes through.
    open: bool,
    held: VecDeque<Inbound>,
}

impl Gate {
    fn new(open: bool) -> Self {
        Self {
            open,
            held: VecDeque::new(),
        }
    }

    fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// The item when it may go to the session now; otherwise it is held.
    fn admit(&mut self, item: Inbound) -> Option<Inbound> {
        if self.open || (self.held.is_empty() && replay_safe(&item)) {
            Some(item)
        } else {
            self.held.push_back(item);
            None
        }
    }

    /// The handshake completed: what was held, in arrival order.
    fn release(&mut self) -> Vec<Inbound> {
        self.open = true;
        self.held.drain(..).collect()
    }
}

/// Whether running this item again, as a replay of 0-RTT data would, is
/// harmless: CONNECT (see `docs/zero-rtt.md` on takeover), SUBSCRIBE and
/// UNSUBSCRIBE (idempotent), PINGREQ, QoS 1 PUBLISH (at least once), and the
/// end of a lane other than the control stream (bookkeeping only).
fn replay_safe(item: &Inbound) -> bool {
    match item {
        Inbound::Packet(_, p) => match p.first().map(|b| (b >> 4, (b >> 1) & 3)) {
            Some((1 | 8 | 10 | 12, _)) => true,
            Some((3, qos)) => qos == 1,
            _ => false,
        },
        Inbound::Garbage(..) | Inbound::Closed(CONTROL) => false,
        Inbound::Closed(_) => true,
    }
}

/// The length of the packet at the start of `buf` (whole or not): `Ok(None)`
/// until its fixed header is complete, `Err` for a malformed Remaining Length.
fn frame_len(buf: &[u8]) -> Result<Option<usize>, ()> {
    let mut len: usize = 0;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some(1 + (i + 1) + len));
        }
    }
    Err(())
}

/// The length of the whole packet at the start of `buf`, if it is all there.
fn whole(buf: &[u8]) -> Option<usize> {
    frame_len(buf).ok().flatten().filter(|n| *n <= buf.len())
}

/// The packet type and the bytes after the fixed header of a whole packet.
fn split(frame: &[u8]) -> Option<(u8, &[u8])> {
    let kind = frame.first()? >> 4;
    let mut i = 1;
    while frame.get(i)? & 0x80 != 0 {
        i += 1;
    }
    Some((kind, frame.get(i + 1..)?))
}

/// The packet identifier at the start of an acknowledgement's body.
fn packet_id(body: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*body.first()?, *body.get(1)?]))
}

/// A PUBLISH's topic name, QoS and packet identifier.
fn publish_head(first: u8, body: &[u8]) -> Option<(&str, u8, Option<u16>)> {
    let qos = (first >> 1) & 3;
    let n = usize::from(u16::from_be_bytes([*body.first()?, *body.get(1)?]));
    let name = std::str::from_utf8(body.get(2..2 + n)?).ok()?;
    let id = if qos > 0 {
        Some(packet_id(body.get(2 + n..)?)?)
    } else {
        None
    };
    Some((name, qos, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_whole() {
        assert_eq!(frame_len(&[]), Ok(None));
        assert_eq!(frame_len(&[0xc0]), Ok(None));
        assert_eq!(frame_len(&[0xc0, 0x00]), Ok(Some(2)));
        assert_eq!(frame_len(&[0x30, 0x03, 0, 1]), Ok(Some(5)));
        assert_eq!(whole(&[0x30, 0x03, 0, 1]), None);
        assert_eq!(whole(&[0x30, 0x03, 0, 1, b'a', 0xc0]), Some(5));
        assert_eq!(frame_len(&[0x30, 0x80]), Ok(None));
        assert_eq!(frame_len(&[0x30, 0x80, 0x01]), Ok(Some(131)));
        assert_eq!(frame_len(&[0x30, 0xff, 0xff, 0xff, 0xff]), Err(()));
    }

    const CONNECT: &[u8] = &[
        0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 1, b'c',
    ];
    const SUB: &[u8] = &[0x82, 6, 0, 1, 0, 1, b'a', 1];
    const PUB0: &[u8] = &[0x30, 4, 0, 1, b'a', b'0'];
    const PUB1: &[u8] = &[0x32, 6, 0, 1, b'a', 0, 1, b'1'];
    const PUB2: &[u8] = &[0x34, 6, 0, 1, b'a', 0, 2, b'2'];
    const PING: &[u8] = &[0xc0, 0];

    fn pkt(lane: Lane, b: &'static [u8]) -> Inbound {
        Inbound::Packet(lane, Bytes::from_static(b))
    }

    fn bytes_of(items: Vec<Inbound>) -> Vec<Vec<u8>> {
        items
            .into_iter()
            .map(|i| match i {
                Inbound::Packet(_, p) | Inbound::Garbage(_, p) => p.to_vec(),
                Inbound::Closed(l) => vec![0xff, l as u8],
            })
            .collect()
    }

    #[test]
    fn zero_rtt_gate_passes_only_what_a_replay_may_repeat() {
        let mut g = Gate::new(false);
        for p in [CONNECT, SUB, PUB1, PING] {
            assert!(g.admit(pkt(CONTROL, p)).is_some(), "{p:?} passes");
        }
        assert!(g.admit(Inbound::Closed(2)).is_some());
        assert!(!g.holding());
        // QoS 0 waits for the handshake, and everything after it (order).
        assert!(g.admit(pkt(1, PUB0)).is_none());
        assert!(g.admit(pkt(CONTROL, PUB1)).is_none());
        assert!(g.admit(pkt(CONTROL, PING)).is_none());
        assert!(g.admit(Inbound::Closed(CONTROL)).is_none());
        assert!(g.holding());
        assert_eq!(
            bytes_of(g.release()),
            [PUB0.to_vec(), PUB1.to_vec(), PING.to_vec(), vec![0xff, 0]]
        );
        assert!(g.admit(pkt(CONTROL, PUB2)).is_some());
        assert!(g.admit(pkt(CONTROL, PUB0)).is_some());
        // QoS 2 and the end of the control stream are held too.
        let mut g = Gate::new(false);
        assert!(g.admit(pkt(CONTROL, PUB2)).is_none());
        let mut g = Gate::new(false);
        assert!(g.admit(Inbound::Closed(CONTROL)).is_none());
        // Once the handshake is known complete, nothing is held.
        let mut g = Gate::new(true);
        assert!(g.admit(pkt(CONTROL, PUB0)).is_some());
    }

    /// Feeds `items` to the input side as the transport does (the
    /// handshake looked at before each); what reached the session, and
    /// whether its input goes on.
    fn drive(inflow: &mut Inflow, h: Handshake, items: Vec<Inbound>) -> (Vec<u8>, Fed) {
        let mut to_session = BytesMut::new();
        let mut fed = inflow.handshake(h, &mut to_session);
        for item in items {
            if fed == Fed::End {
                break;
            }
            fed = inflow.handshake(h, &mut to_session);
            if fed == Fed::More {
                fed = inflow.item(item, &mut to_session);
            }
        }
        (to_session.to_vec(), fed)
    }

    #[test]
    fn zero_rtt_qos0_reaches_the_session_only_after_the_handshake() {
        let mut inflow = Inflow::new(Handshake::Pending);
        let items = [CONNECT, PUB1, PUB0, PUB1].map(|p| pkt(CONTROL, p));
        let (got, fed) = drive(&mut inflow, Handshake::Pending, items.into());
        // Before the handshake: CONNECT and the first QoS 1 only.
        assert_eq!(got, [CONNECT, PUB1].concat());
        assert_eq!(fed, Fed::More);
        let (got, _) = drive(&mut inflow, Handshake::Complete, Vec::new());
        assert_eq!(got, [PUB0, PUB1].concat());
        let items = vec![pkt(CONTROL, PUB2), Inbound::Closed(CONTROL)];
        let (got, fed) = drive(&mut inflow, Handshake::Complete, items);
        assert_eq!(got, PUB2);
        assert_eq!(fed, Fed::End);
    }

    #[test]
    fn zero_rtt_replay_never_runs_held_packets_nor_its_will() {
        let mut inflow = Inflow::new(Handshake::Pending);
        let items = [CONNECT, PUB0, PUB2].map(|p| pkt(CONTROL, p));
        let (got, _) = drive(&mut inflow, Handshake::Pending, items.into());
        assert_eq!(got, CONNECT);
        // The connection dies before the handshake completes (a replay).
        let (got, fed) = drive(&mut inflow, Handshake::Failed, Vec::new());
        assert_eq!(fed, Fed::End);
        assert_eq!(got, DISCONNECT);
    }

    #[test]
    fn a_completed_handshake_gates_nothing() {
        let mut inflow = Inflow::new(Handshake::Complete);
        let mut items: Vec<_> = [CONNECT, PUB0, PUB2].map(|p| pkt(CONTROL, p)).into();
        items.push(Inbound::Closed(CONTROL));
        let (got, fed) = drive(&mut inflow, Handshake::Complete, items);
        assert_eq!(fed, Fed::End);
        assert_eq!(got, [CONNECT, PUB0, PUB2].concat());
    }

    #[test]
    fn lanes_wait_for_the_connect_and_their_end_is_noted() {
        let mut inflow = Inflow::new(Handshake::Complete);
        let items = vec![pkt(1, PUB1), pkt(CONTROL, CONNECT), Inbound::Closed(1)];
        let (got, fed) = drive(&mut inflow, Handshake::Complete, items);
        assert_eq!(fed, Fed::More);
        assert_eq!(got, [CONNECT, PUB1].concat());
        assert_eq!(inflow.closed, [1]);
        assert!(inflow.routes.closed.contains(&1));
    }

    #[test]
    fn data_lanes_cannot_queue_without_bound_before_the_connect() {
        let mut inflow = Inflow::new(Handshake::Complete);
        let big = Bytes::from(vec![0u8; 64 * 1024]);
        let mut to_session = BytesMut::new();
        for _ in 0..MAX_EARLY_BYTES / big.len() {
            let fed = inflow.feed(Inbound::Packet(1, big.clone()), &mut to_session);
            assert_eq!(fed, Fed::More);
        }
        let fed = inflow.feed(Inbound::Packet(1, big), &mut to_session);
        assert_eq!(fed, Fed::End);
        assert!(to_session.is_empty());
        assert!(inflow.early.is_empty());
    }

    #[test]
    fn answers_follow_their_requests() {
        let mut r = Routes {
            version: Some(Version::V311),
            ..Routes::default()
        };
        // SUBSCRIBE id 1, "a/+" QoS 1, on lane 2.
        let sub = Bytes::from_static(&[0x82, 8, 0, 1, 0, 3, b'a', b'/', b'+', 1]);
        r.inbound(2, &sub);
        let suback = Bytes::from_static(&[0x90, 3, 0, 1, 1]);
        assert_eq!(r.outbound(&suback), 2);
        r.answered(&suback);
        assert!(r.client_ids.is_empty());
        // A delivery on "a/b" QoS 1 id 7 goes to lane 2, its PUBREL too.
        let publish = Bytes::from_static(&[0x32, 7, 0, 3, b'a', b'/', b'b', 0, 7]);
        assert_eq!(r.outbound(&publish), 2);
        let other = Bytes::from_static(&[0x30, 5, 0, 3, b'x', b'/', b'y']);
        assert_eq!(r.outbound(&other), CONTROL);
        // A client PUBLISH QoS 1 id 9 on lane 3: PUBACK on lane 3.
        let cpub = Bytes::from_static(&[0x32, 7, 0, 3, b'q', b'/', b'r', 0, 9]);
        r.inbound(3, &cpub);
        assert_eq!(r.outbound(&Bytes::from_static(&[0x40, 2, 0, 9])), 3);
        // PINGRESP on the control stream.
        assert_eq!(r.outbound(&Bytes::from_static(&[0xd0, 0])), CONTROL);
        assert!(r.in_use(2));
        assert!(r.in_use(3));
    }
}
