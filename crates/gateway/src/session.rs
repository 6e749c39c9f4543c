//! One MQTT connection's protocol state, without IO: the CONNECT decision,
//! the QoS 1/2 flows in both directions, topic aliases, keep alive, receive
//! maximum, maximum packet size, the publish rate limits and the Will
//! Message.
//!
//! Bytes from the client go into the session's input ([`Session::buffers`]), deliveries from the
//! broker into [`Session::deliver`]; [`Session::handle_input`] decodes and
//! answers what it may, [`Session::flush`] moves acknowledgements and
//! deliveries into its output, and deadlines are values
//! ([`Session::timeout`], [`Session::handle_timeout`]). The transports
//! (`connection` for TCP/TLS, `quic` for QUIC streams) only move bytes and
//! wait; `driver` runs one session over any of them.
//!
//! The session calls the broker directly (subscribe, publish, acknowledge):
//! those are synchronous in-memory calls whose answers (granted QoS,
//! retained messages, matching subscribers) shape the very packet the
//! session sends back, so turning them into commands would only add a round
//! trip through the caller.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::BytesMut;
use quichub_mqtt::reason;
use quichub_mqtt::topic;
use quichub_mqtt::{
    decode, encode, encoded_len, Ack, ConnAck, Connect, DecodeError, Disconnect, Packet,
    Properties, Publish, QoS, SubAck, Subscribe, UnsubAck, Unsubscribe, Version,
};

use quichub_net::rate::TokenBucket;
use quichub_net::tls::{ClientCertConfig, PeerCert};

use crate::access::{self, ConnAuth};
use crate::broker::{Broker, Delivery, Message, Outbox, Source, SubOptions};
use crate::metrics::{DropReason, ThrottleReason, Transport};
use crate::store::Durability;

/// Unsent bytes past which the connection stops reading and taking deliveries.
pub const MAX_WRITE_BUFFER: usize = 256 * 1024;

/// Deliveries taken from the broker at once, to write them together.
const MAX_BATCH: usize = 64;

/// Per-connection limits the broker announces in CONNACK.
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// Largest packet accepted from clients (Maximum Packet Size).
    pub max_packet_size: u32,
    /// QoS 2 publishes a client may have unreleased (Receive Maximum).
    pub receive_maximum: u16,
    /// Topic aliases a client may use (Topic Alias Maximum).
    pub topic_alias_maximum: u16,
    /// Time allowed between the connection and its CONNECT.
    pub connect_timeout: Duration,
    /// PUBLISH packets a client may send per second, after a burst of
    /// `publish_burst`; 0: no limit.
    pub publish_rate: u64,
    /// PUBLISH packets a client may send at once (0: one second's worth).
    pub publish_burst: u64,
    /// Bytes of PUBLISH packets a client may send per second, after a burst
    /// of `publish_bytes_burst`; 0: no limit.
    pub publish_bytes_rate: u64,
    /// Bytes of PUBLISH packets a client may send at once (0: one second's
    /// worth). A packet larger than what is left passes, and the next waits
    /// until the debt is repaid.
    pub publish_bytes_burst: u64,
}

impl Default for ConnConfig {
    fn default() -> Self {
        Self {
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            topic_alias_maximum: 64,
            connect_timeout: Duration::from_secs(10),
            // No limit, as EMQX and mosquitto: any rate that bounded abuse
            // would throttle `quichub-bench mqtt` publishers at saturation.
            publish_rate: 0,
            publish_burst: 0,
            publish_bytes_rate: 0,
            publish_bytes_burst: 0,
        }
    }
}

/// A connection's publish rate and bandwidth ([`ConnConfig::publish_rate`],
/// [`ConnConfig::publish_bytes_rate`]).
struct PublishLimits {
    messages: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
}

impl PublishLimits {
    fn new(cfg: &ConnConfig, now: Instant) -> Self {
        Self {
            messages: TokenBucket::new(cfg.publish_rate, cfg.publish_burst, now),
            bytes: TokenBucket::new(cfg.publish_bytes_rate, cfg.publish_bytes_burst, now),
        }
    }

    /// How long until the next PUBLISH may be read, and the limit it waits
    /// for; `None`: now.
    fn wait(&self, now: Instant) -> Option<(Duration, ThrottleReason)> {
        let w = |b: &Option<TokenBucket>| b.as_ref().map_or(Duration::ZERO, |b| b.wait(now));
        let (m, b) = (w(&self.messages), w(&self.bytes));
        match (m.is_zero(), b.is_zero()) {
            (true, true) => None,
            _ if m >= b => Some((m, ThrottleReason::Messages)),
            _ => Some((b, ThrottleReason::Bytes)),
        }
    }

    /// A PUBLISH of `len` bytes was read.
    fn take(&mut self, len: usize, now: Instant) {
        if let Some(b) = &mut self.messages {
            b.take(1, now);
        }
        if let Some(b) = &mut self.bytes {
            b.take(len as u64, now);
        }
    }
}

/// MQTT's PUBLISH packet type, in the high nibble of a packet's first byte.
const PUBLISH: u8 = 3;

/// What the transport knows about an MQTT client: the transport (for the
/// metrics) and its verified TLS client certificate with the listener's
/// policy on certificates (mosquitto's `require_certificate` and
/// `use_identity_as_username`).
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// What the connection runs over.
    pub transport: Transport,
    /// The client certificate the TLS layer verified, if any.
    pub certificate: Option<PeerCert>,
    /// Refuse a client without a verified certificate (Not authorized).
    /// MQTT over TLS enforces it in the handshake already; MQTT over QUIC
    /// only here, since its handshake must let other protocols in without one.
    pub require_certificate: bool,
    /// The certificate's subject CN is the user name; the CONNECT's user
    /// name and password are ignored.
    pub use_identity_as_username: bool,
}

impl Peer {
    /// A peer on `transport` without a certificate policy.
    pub fn on(transport: Transport) -> Self {
        Self {
            transport,
            ..Self::default()
        }
    }

    /// A peer on `transport` whose `certificate` is judged by `policy`.
    pub fn with_certificate(
        transport: Transport,
        certificate: Option<PeerCert>,
        policy: &ClientCertConfig,
    ) -> Self {
        Self {
            transport,
            certificate,
            require_certificate: policy.require_certificate,
            use_identity_as_username: policy.use_identity_as_username,
        }
    }
}

/// Who a client says (or its certificate proves) it is, after the
/// transport's certificate policy: what authentication checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The user name: the certificate's subject CN with
    /// `use_identity_as_username`, else the CONNECT's.
    pub username: Option<String>,
    /// The CONNECT's password (never with `use_identity_as_username`).
    pub password: Option<bytes::Bytes>,
    /// The user name is a verified certificate's CN: no password is needed.
    pub from_certificate: bool,
}

/// Applies the peer's certificate policy to a CONNECT's user name and
/// password, as mosquitto does. Err is the CONNACK reason code.
pub fn credentials(
    peer: &Peer,
    username: Option<&str>,
    password: Option<&bytes::Bytes>,
) -> Result<Credentials, u8> {
    if peer.require_certificate && peer.certificate.is_none() {
        return Err(reason::NOT_AUTHORIZED);
    }
    if peer.use_identity_as_username {
        let cn = peer
            .certificate
            .as_ref()
            .and_then(|c| c.subject_cn.clone())
            .ok_or(reason::BAD_USERNAME_OR_PASSWORD)?;
        return Ok(Credentials {
            username: Some(cn),
            password: None,
            from_certificate: true,
        });
    }
    Ok(Credentials {
        username: username.map(str::to_owned),
        password: password.cloned(),
        from_certificate: false,
    })
}

/// Why a connection ended, for logs.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Transport error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Malformed input.
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
    /// The client broke a protocol rule.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// No CONNECT in time, or keep alive expired.
    #[error("timeout")]
    Timeout,
    /// CONNECT refused.
    #[error("connect refused with code {0:#x}")]
    Refused(u8),
}

enum Flight {
    /// QoS 1 sent, or QoS 2 sent and waiting for PUBREC.
    Sent(Delivery),
    /// QoS 2 PUBREL sent, waiting for PUBCOMP.
    Released(Delivery),
}

/// A session after its CONNECT.
pub(crate) struct Session {
    cfg: Arc<ConnConfig>,
    version: Version,
    client: Arc<str>,
    conn_id: u64,
    /// Bytes from the client not yet decoded.
    inbuf: BytesMut,
    /// Encoded packets for the client, whole, in order.
    out: BytesMut,
    /// Deliveries taken from the broker but not yet written (receive maximum).
    pending: VecDeque<Delivery>,
    /// Our QoS 1/2 publishes not yet completed, by packet id.
    inflight: HashMap<u16, Flight>,
    /// Client's Receive Maximum.
    send_quota: usize,
    /// Client's Maximum Packet Size.
    client_max_packet: usize,
    next_id: u16,
    /// Client QoS 2 packet ids awaiting PUBREL.
    awaiting_rel: crate::broker::AwaitingRel,
    /// The session's outgoing packet ids in use (this connection's and any
    /// other's of the session).
    out_ids: crate::broker::OutIds,
    aliases: HashMap<u16, String>,
    will: Option<(Message, Duration)>,
    /// Session Expiry Interval as connected (0 forbids raising it at DISCONNECT).
    connected_expiry: u32,
    /// PUBACK/PUBREC in PUBLISH order, each after its store ticket is durable.
    acks: VecDeque<(u64, Packet)>,
    /// The store's durable ticket (none without a store).
    durable: Option<(tokio::sync::watch::Receiver<u64>, Arc<crate::store::Store>)>,
    expiry_override: Option<Option<Duration>>,
    /// Who the client is and what it may do.
    auth: ConnAuth,
    /// 1.5 times the client's Keep Alive (none: 0).
    keep_alive: Option<Duration>,
    /// When the connection ends unless a packet arrives.
    deadline: Option<Instant>,
    limits: PublishLimits,
    /// While set, a PUBLISH waits undecoded (in the input or the transport)
    /// for the client's tokens; a throttled client is not idle, so its
    /// keep alive waits too.
    throttled: Option<Instant>,
}

/// What to do with the bytes before a CONNECT ([`expect_connect`]).
#[derive(Debug)]
pub(crate) enum Hello {
    /// More bytes are needed.
    More,
    /// The CONNECT, decoded.
    Connect(Box<Connect>),
    /// The connection ends: send `reply` (may be empty), then end with `error`.
    Refuse { reply: BytesMut, error: ConnError },
}

/// Decodes the CONNECT at the start of `inbuf`, if all there.
pub(crate) fn expect_connect(inbuf: &mut BytesMut, cfg: &ConnConfig) -> Hello {
    match decode(inbuf, None, cfg.max_packet_size as usize) {
        Ok(Some(Packet::Connect(c))) => Hello::Connect(Box::new(c)),
        Ok(Some(_)) => Hello::Refuse {
            reply: BytesMut::new(),
            error: ConnError::Protocol("first packet is not CONNECT"),
        },
        Ok(None) => Hello::More,
        Err(DecodeError::UnsupportedProtocolVersion(_)) => {
            // Answer in 3.1.1, which every client version can read.
            let mut reply = BytesMut::new();
            let ack = Packet::ConnAck(ConnAck {
                code: reason::V311_UNACCEPTABLE_PROTOCOL_VERSION,
                ..ConnAck::default()
            });
            let _ = encode(&ack, Version::V311, &mut reply);
            Hello::Refuse {
                reply,
                error: ConnError::Refused(reason::UNSUPPORTED_PROTOCOL_VERSION),
            }
        }
        Err(e) => Hello::Refuse {
            reply: BytesMut::new(),
            error: e.into(),
        },
    }
}

/// What [`accept`] decided.
pub(crate) enum Accept {
    /// Connected: the CONNACK is the session's first output.
    Connected(Box<Session>),
    /// Refused: send this CONNACK and close.
    Refused(BytesMut),
}

/// How a session ended cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// DISCONNECT: the Will Message is discarded.
    Normal,
    /// DISCONNECT with reason 0x04: the Will Message is published.
    WithWill,
}

/// The CONNECT checks, in order: client identifier, the peer's certificate
/// policy, authentication, session expiry, the Will's topic, then the
/// broker's session (`outbox` is the connection's end of the deliveries and
/// of the takeover signal, attached to the session). `inbuf` holds what
/// followed the CONNECT.
#[allow(clippy::too_many_arguments)]
pub(crate) fn accept(
    broker: &Broker,
    cfg: &Arc<ConnConfig>,
    peer: &Peer,
    c: Connect,
    outbox: Outbox,
    inbuf: BytesMut,
    now: Instant,
    wall: SystemTime,
) -> Result<Accept, ConnError> {
    let v = c.version;
    let refuse = |code: u8| {
        let code = if v == Version::V311 {
            reason::connack_v311(code)
        } else {
            code
        };
        let mut out = BytesMut::new();
        let _ = encode(
            &Packet::ConnAck(ConnAck {
                code,
                ..ConnAck::default()
            }),
            v,
            &mut out,
        );
        Ok(Accept::Refused(out))
    };
    let conn_id = outbox.conn;
    let mut props = Properties::default();
    // Client Identifier: a 3.1.1 client with a persistent session must bring
    // one; otherwise the broker makes one up (and tells a 5.0 client).
    let client_id: Arc<str> = if c.client_id.is_empty() {
        if v == Version::V311 && !c.clean_start {
            return refuse(reason::CLIENT_IDENTIFIER_NOT_VALID);
        }
        let id = format!("quichub-{conn_id}-{:x}", std::process::id());
        if v == Version::V5 {
            props.assigned_client_identifier = Some(id.clone());
        }
        id.into()
    } else {
        c.client_id.as_str().into()
    };
    let credentials = match credentials(peer, c.username.as_deref(), c.password.as_ref()) {
        Ok(x) => x,
        Err(code) => {
            tracing::debug!(client = %client_id, transport = peer.transport.label(), "mqtt: refused by the client certificate policy ({code:#x})");
            // No certificate where one is required: no credentials; one
            // without a name to use: bad credentials.
            let why = match code {
                reason::NOT_AUTHORIZED => quichub_auth::AuthError::NoCredentials,
                _ => quichub_auth::AuthError::BadCredentials,
            };
            broker.auth().metrics.failure(access::PROTOCOL, &why);
            return refuse(code);
        }
    };
    if c.properties.authentication_method.is_some() {
        return refuse(reason::BAD_AUTHENTICATION_METHOD);
    }
    // Before the session is touched: an unauthenticated client must not
    // take over (or learn about) anyone's session.
    let user = credentials.username.clone();
    let from_certificate = credentials.from_certificate;
    let auth = match ConnAuth::connect(broker.auth(), credentials, client_id.clone(), wall) {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(
                client = %client_id,
                transport = peer.transport.label(),
                user = user.as_deref().unwrap_or(""),
                "mqtt: refused: {e}"
            );
            return refuse(access::connack_code(&e));
        }
    };
    // Session Expiry: 3.1.1 Clean Session 1 ends with the connection, 0 is
    // kept (up to the broker's maximum); 5.0 says it in seconds.
    let requested = match v {
        Version::V311 => {
            if c.clean_start {
                0
            } else {
                u32::MAX
            }
        }
        Version::V5 => c.properties.session_expiry_interval.unwrap_or(0),
    };
    let granted = requested.min(broker.config.max_session_expiry);
    if v == Version::V5 && granted != requested {
        props.session_expiry_interval = Some(granted);
    }
    let expiry = Some(Duration::from_secs(granted.into()));
    let will = match c.will {
        Some(w) => {
            if !topic::valid_topic_name(&w.topic) {
                return refuse(reason::TOPIC_NAME_INVALID);
            }
            let delay = Duration::from_secs(w.properties.will_delay_interval.unwrap_or(0).into());
            let m = Message::new(
                &w.topic,
                w.payload.clone(),
                w.qos,
                w.retain,
                Source::Will(client_id.clone()),
            )
            .with_properties(&w.properties, now);
            Some((m, delay))
        }
        None => None,
    };
    let connected = match broker.connect(&client_id, c.clean_start, expiry, outbox) {
        Ok(x) => x,
        Err(code) => return refuse(code),
    };
    if v == Version::V5 {
        props.receive_maximum = Some(cfg.receive_maximum);
        props.topic_alias_maximum = Some(cfg.topic_alias_maximum);
        props.maximum_packet_size = Some(cfg.max_packet_size);
        props.retain_available = Some(true);
        props.wildcard_subscription_available = Some(true);
        props.subscription_identifier_available = Some(true);
        props.shared_subscription_available = Some(true);
    }
    tracing::debug!(
        client = %client_id,
        transport = peer.transport.label(),
        user = user.as_deref().unwrap_or(""),
        certificate = from_certificate,
        method = auth.identity().method().as_str(),
        "mqtt connected"
    );
    let ack = Packet::ConnAck(ConnAck {
        session_present: connected.session_present,
        code: reason::SUCCESS,
        properties: props,
    });
    let mut out = BytesMut::new();
    encode(&ack, v, &mut out).map_err(|_| ConnError::Protocol("CONNACK encoding"))?;
    let keep_alive =
        (c.keep_alive > 0).then(|| Duration::from_millis(u64::from(c.keep_alive) * 1500));
    Ok(Accept::Connected(Box::new(Session {
        cfg: cfg.clone(),
        version: v,
        client: client_id,
        conn_id,
        inbuf,
        out,
        pending: connected.backlog.into(),
        inflight: HashMap::new(),
        send_quota: c.properties.receive_maximum.unwrap_or(u16::MAX).max(1) as usize,
        client_max_packet: c
            .properties
            .maximum_packet_size
            .map_or(usize::MAX, |m| m as usize),
        next_id: 1,
        awaiting_rel: connected.awaiting_rel.clone(),
        out_ids: connected.out_ids.clone(),
        aliases: HashMap::new(),
        will,
        connected_expiry: granted,
        acks: VecDeque::new(),
        durable: broker.durable(),
        expiry_override: None,
        auth,
        keep_alive,
        deadline: keep_alive.map(|k| now + k),
        limits: PublishLimits::new(cfg, now),
        throttled: None,
    })))
}

/// What a session leaves behind when its connection ends, for
/// [`Departure::leave`].
pub(crate) struct Departure {
    client: Arc<str>,
    conn_id: u64,
    unacked: Vec<Delivery>,
    will: Option<(Message, Duration)>,
    expiry_override: Option<Option<Duration>>,
}

impl Departure {
    /// Detaches the session from the broker: the unacknowledged deliveries
    /// go back to it, the Will is published (now or after its delay).
    pub(crate) fn leave(self, broker: &Broker) {
        broker.disconnect(
            &self.client,
            self.conn_id,
            self.unacked,
            self.will,
            self.expiry_override,
        );
    }
}

impl Session {
    /// The client's bytes not decoded yet; transports append to it.
    #[cfg(test)]
    pub(crate) fn input(&mut self) -> &mut BytesMut {
        &mut self.inbuf
    }

    /// Encoded packets for the client, whole and in order; transports take
    /// from the front what they wrote.
    pub(crate) fn output(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// The client's bytes not decoded yet (transports append to them) and
    /// the encoded packets for it (transports take what they wrote).
    pub(crate) fn buffers(&mut self) -> (&mut BytesMut, &mut BytesMut) {
        (&mut self.inbuf, &mut self.out)
    }

    /// The client's identifier.
    #[cfg(test)]
    pub(crate) fn client(&self) -> &Arc<str> {
        &self.client
    }

    /// The protocol version the client connected with.
    #[cfg(test)]
    pub(crate) fn version(&self) -> Version {
        self.version
    }

    /// Whether the transport may read more input: not while the client is
    /// throttled, its output piles up, or its acknowledgements wait on the
    /// disk (bounds the output and the store's queue).
    pub(crate) fn can_read(&self) -> bool {
        self.out.len() < MAX_WRITE_BUFFER
            && self.acks.len() < self.cfg.receive_maximum as usize
            && self.throttled.is_none()
    }

    /// Whether the session takes more deliveries from the broker now.
    pub(crate) fn can_take(&self) -> bool {
        self.out.len() < MAX_WRITE_BUFFER / 4 && self.pending.len() < MAX_BATCH
    }

    /// A delivery from the broker, written by the next [`Session::flush`].
    pub(crate) fn deliver(&mut self, d: Delivery) {
        self.pending.push_back(d);
    }

    /// Whether the session is throttled (a PUBLISH waits for tokens).
    pub(crate) fn throttled(&self) -> bool {
        self.throttled.is_some()
    }

    /// When [`Session::handle_timeout`] is due: the end of the throttle, or
    /// (unthrottled) the keep alive deadline.
    pub(crate) fn timeout(&self) -> Option<Instant> {
        match (self.throttled, self.deadline) {
            (Some(t), _) => Some(t),
            (None, d) => d,
        }
    }

    /// The time of [`Session::timeout`] came: the throttled client is read
    /// again (its keep alive starts over), or the keep alive expired.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Result<(), ConnError> {
        if let Some(t) = self.throttled {
            if now >= t {
                self.throttled = None;
                self.deadline = self.keep_alive.map(|k| now + k);
            }
            return Ok(());
        }
        match self.deadline {
            Some(d) if now >= d => Err(ConnError::Timeout),
            _ => Ok(()),
        }
    }

    /// A reload since the last call: the rights of the credentials now.
    pub(crate) fn refresh_auth(&mut self, wall: SystemTime) -> Result<(), ConnError> {
        self.auth.refresh(wall).map_err(|e| {
            tracing::debug!(client = %self.client, "mqtt: credentials no longer accepted: {e}");
            ConnError::Refused(access::disconnect_code(&e))
        })
    }

    /// Wakes on auth reloads, so an idle client whose credentials a reload
    /// revoked is disconnected at once.
    pub(crate) fn auth_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.auth.changes()
    }

    /// When the credentials end (a JWT's `exp`).
    pub(crate) fn auth_expires(&self) -> Option<SystemTime> {
        self.auth.expires()
    }

    /// The credentials expired: the connection ends with this error.
    pub(crate) fn credentials_expired(&self, broker: &Broker) -> ConnError {
        tracing::debug!(client = %self.client, "mqtt: credentials expired");
        broker
            .auth()
            .metrics
            .failure(access::PROTOCOL, &quichub_auth::AuthError::Expired);
        ConnError::Refused(reason::MAXIMUM_CONNECT_TIME)
    }

    /// The store's durable ticket, while acknowledgements wait on it (none
    /// without a store).
    pub(crate) fn durable_watch(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.durable.as_ref().map(|(rx, _)| rx.clone())
    }

    /// Whether acknowledgements wait for the store.
    pub(crate) fn waiting_durable(&self) -> bool {
        !self.acks.is_empty()
    }

    /// The store ticket the last queued acknowledgement waits for.
    pub(crate) fn last_ticket(&self) -> u64 {
        self.acks.back().map_or(0, |(t, _)| *t)
    }

    /// Decodes and handles the client's packets in its input, in
    /// order, until it holds no whole packet or a PUBLISH must wait for the
    /// client's rate limits. `Some` when the client ended the connection.
    pub(crate) fn handle_input(
        &mut self,
        broker: &Broker,
        now: Instant,
    ) -> Result<Option<Ending>, ConnError> {
        let max_in = self.cfg.max_packet_size as usize;
        while self.throttled.is_none() {
            // Packets are read in order: one held back holds back those
            // behind it too, so only the client's own flow stalls.
            let publish = self.inbuf.first().is_some_and(|b| b >> 4 == PUBLISH);
            if publish {
                if let Some((wait, why)) = self.limits.wait(now) {
                    broker.metrics.count_throttled(why);
                    self.throttled = Some(now + wait);
                    break;
                }
            }
            let before = self.inbuf.len();
            let Some(p) = decode(&mut self.inbuf, Some(self.version), max_in)? else {
                break;
            };
            if matches!(p, Packet::Publish(_)) {
                self.limits.take(before - self.inbuf.len(), now);
            }
            if let Some(k) = self.keep_alive {
                self.deadline = Some(now + k);
            }
            let cfg = self.cfg.clone();
            if let Some(end) = handle(broker, &cfg, self, p)? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Moves the acknowledgements whose records are durable and the
    /// deliveries the client's Receive Maximum allows into the output.
    pub(crate) fn flush(&mut self, broker: &Broker) -> Result<(), ConnError> {
        self.flush_acks()?;
        self.flush_pending(broker);
        Ok(())
    }

    /// The connection ended with `result`; `left` are the deliveries still
    /// queued for it. The output is what remains to send: a DISCONNECT
    /// telling a MQTT 5 client why it ended in error, else nothing. What the
    /// session leaves behind is returned for [`Departure::leave`].
    pub(crate) fn end(
        &mut self,
        result: &Result<Ending, ConnError>,
        left: Vec<Delivery>,
        wall: SystemTime,
    ) -> Departure {
        // Unacked QoS 1/2 deliveries go back to the session for the next connection.
        let mut unacked: Vec<Delivery> = Vec::new();
        let mut ids: Vec<u16> = self.inflight.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            // Sent again on the session's next connection with the same Packet
            // Identifier (§4.4): PUBLISH with DUP, or only the PUBREL.
            match self.inflight.remove(&id) {
                Some(Flight::Sent(mut d)) => {
                    d.dup = true;
                    d.packet_id = Some(id);
                    unacked.push(d);
                }
                Some(Flight::Released(mut d)) => {
                    d.released = true;
                    d.packet_id = Some(id);
                    unacked.push(d);
                }
                None => {}
            }
        }
        unacked.extend(self.pending.drain(..).filter(|d| d.qos != QoS::AtMostOnce));
        unacked.extend(left.into_iter().filter(|d| d.qos != QoS::AtMostOnce));
        let will = match result {
            Ok(Ending::Normal) => None,
            _ => self.will.take(),
        };
        // The Will is checked as a publish when it is about to be published (as
        // mosquitto does), with the rights in force now; a client whose
        // credentials expired or were revoked leaves none.
        let will = will.filter(|(m, _)| {
            self.auth.expires().is_none_or(|e| e > wall)
                && self.auth.refresh(wall).is_ok()
                && self.auth.may_publish(&m.topic)
        });
        // Whatever the session had not written is not sent any more.
        self.out.clear();
        if let Err(e) = result {
            tracing::debug!(client = %self.client, version = ?self.version, "mqtt connection ended: {e}");
            // MQTT 5 clients learn why (§4.13.2); a 3.1.1 connection just closes.
            if self.version == Version::V5 {
                if let Some(code) = disconnect_code(e) {
                    let _ = encode(
                        &Packet::Disconnect(Disconnect {
                            code,
                            properties: Properties::default(),
                        }),
                        Version::V5,
                        &mut self.out,
                    );
                }
            }
        }
        Departure {
            client: self.client.clone(),
            conn_id: self.conn_id,
            unacked,
            will,
            expiry_override: self.expiry_override,
        }
    }
}

/// The DISCONNECT reason code a MQTT 5 client is told an error with (none:
/// the transport failed).
pub(crate) fn disconnect_code(e: &ConnError) -> Option<u8> {
    match e {
        ConnError::Io(_) => None,
        ConnError::Decode(d) => Some(d.reason_code()),
        ConnError::Protocol(_) => Some(reason::PROTOCOL_ERROR),
        ConnError::Timeout => Some(reason::KEEP_ALIVE_TIMEOUT),
        ConnError::Refused(c) => Some(*c),
    }
}

/// Handles one packet from the client; `Some` ends the connection cleanly.
fn handle(
    broker: &Broker,
    cfg: &ConnConfig,
    conn: &mut Session,
    p: Packet,
) -> Result<Option<Ending>, ConnError> {
    let v = conn.version;
    match p {
        Packet::Publish(p) => on_publish(broker, cfg, conn, p)?,
        Packet::PubAck(a) => {
            if matches!(conn.inflight.get(&a.packet_id), Some(Flight::Sent(d)) if d.qos == QoS::AtLeastOnce)
            {
                if let Some(Flight::Sent(d)) = conn.inflight.remove(&a.packet_id) {
                    conn.release_id(a.packet_id);
                    conn.done(broker, d.seq);
                }
            }
        }
        Packet::PubRec(a) => {
            let known = matches!(conn.inflight.get(&a.packet_id), Some(Flight::Sent(d)) if d.qos == QoS::ExactlyOnce);
            let code = if known {
                if reason::is_error(a.code) {
                    // The client refused it: it is not redelivered.
                    if let Some(Flight::Sent(d)) = conn.inflight.remove(&a.packet_id) {
                        conn.release_id(a.packet_id);
                        conn.done(broker, d.seq);
                    }
                    return Ok(None);
                }
                if let Some(Flight::Sent(d)) = conn.inflight.remove(&a.packet_id) {
                    if let Some(seq) = d.seq {
                        broker.inflight(&conn.client, seq, a.packet_id, true);
                    }
                    conn.inflight.insert(a.packet_id, Flight::Released(d));
                }
                reason::SUCCESS
            } else {
                reason::PACKET_IDENTIFIER_NOT_FOUND
            };
            conn.send(&Packet::PubRel(ack(a.packet_id, code)));
        }
        Packet::PubComp(a) => {
            if let Some(Flight::Released(_)) = conn.inflight.get(&a.packet_id) {
                if let Some(Flight::Released(d)) = conn.inflight.remove(&a.packet_id) {
                    conn.release_id(a.packet_id);
                    conn.done(broker, d.seq);
                }
            }
        }
        Packet::PubRel(a) => {
            let released = conn.rel().remove(&a.packet_id);
            let code = if released {
                reason::SUCCESS
            } else {
                reason::PACKET_IDENTIFIER_NOT_FOUND
            };
            conn.send(&Packet::PubComp(ack(a.packet_id, code)));
        }
        Packet::Subscribe(s) => on_subscribe(broker, conn, s),
        Packet::Unsubscribe(u) => on_unsubscribe(broker, conn, u),
        Packet::PingReq => conn.send(&Packet::PingResp),
        Packet::Disconnect(d) => {
            if let Some(e) = d.properties.session_expiry_interval {
                if conn.connected_expiry == 0 && e != 0 {
                    return Err(ConnError::Protocol(
                        "session expiry raised from 0 at DISCONNECT",
                    ));
                }
                let e = e.min(broker.config.max_session_expiry);
                conn.expiry_override = Some(Some(Duration::from_secs(e.into())));
            }
            return Ok(Some(if d.code == reason::DISCONNECT_WITH_WILL {
                Ending::WithWill
            } else {
                Ending::Normal
            }));
        }
        Packet::Connect(_) => return Err(ConnError::Protocol("second CONNECT")),
        Packet::Auth(_) if v == Version::V5 => {
            return Err(ConnError::Protocol("AUTH without an authentication method"))
        }
        _ => return Err(ConnError::Protocol("packet not sent by clients")),
    }
    Ok(None)
}

fn ack(packet_id: u16, code: u8) -> Ack {
    Ack {
        packet_id,
        code,
        properties: Properties::default(),
    }
}

fn on_publish(
    broker: &Broker,
    cfg: &ConnConfig,
    conn: &mut Session,
    mut p: Publish,
) -> Result<(), ConnError> {
    if let Some(alias) = p.properties.topic_alias {
        if alias == 0 || alias > cfg.topic_alias_maximum {
            return Err(ConnError::Refused(reason::TOPIC_ALIAS_INVALID));
        }
        if p.topic.is_empty() {
            match conn.aliases.get(&alias) {
                Some(t) => p.topic = t.clone(),
                None => return Err(ConnError::Protocol("unknown topic alias")),
            }
        } else {
            conn.aliases.insert(alias, p.topic.clone());
        }
    }
    if !p.properties.subscription_identifiers.is_empty() {
        return Err(ConnError::Protocol(
            "Subscription Identifier in a client PUBLISH",
        ));
    }
    if !topic::valid_topic_name(&p.topic) {
        return Err(ConnError::Refused(reason::TOPIC_NAME_INVALID));
    }
    let id = p.packet_id.unwrap_or(0);
    if p.qos == QoS::ExactlyOnce {
        if conn.rel().contains(&id) {
            // A retransmission of a message already routed: acknowledge only.
            conn.ack_after(0, Packet::PubRec(ack(id, reason::SUCCESS)));
            return Ok(());
        }
        if conn.rel().len() >= cfg.receive_maximum as usize {
            return Err(ConnError::Refused(reason::RECEIVE_MAXIMUM_EXCEEDED));
        }
    }
    let utf8_bad = p.properties.payload_format_indicator == Some(1)
        && std::str::from_utf8(&p.payload).is_err();
    let mut ticket = 0;
    let code = if !conn.auth.may_publish(&p.topic) {
        // Not routed. QoS 0: dropped silently; QoS 1/2: Not authorized
        // (3.1.1: acknowledged all the same, as mosquitto does).
        tracing::debug!(client = %conn.client, topic = %p.topic, "mqtt: publish not authorized");
        access::refused_publish_code(conn.version)
    } else if utf8_bad {
        reason::PAYLOAD_FORMAT_INVALID
    } else {
        let m = Message::new(
            &p.topic,
            p.payload,
            p.qos,
            p.retain,
            Source::Mqtt(conn.client.clone()),
        )
        .with_properties(&p.properties, Instant::now());
        let (matched, t) = broker.publish_durable(m);
        ticket = t;
        if matched == 0 {
            reason::NO_MATCHING_SUBSCRIBERS
        } else {
            reason::SUCCESS
        }
    };
    // The acknowledgement waits until what the publish persisted is durable.
    match p.qos {
        QoS::AtMostOnce => {}
        QoS::AtLeastOnce => conn.ack_after(ticket, Packet::PubAck(ack(id, code))),
        QoS::ExactlyOnce => {
            if !reason::is_error(code) {
                conn.rel().insert(id);
            }
            conn.ack_after(ticket, Packet::PubRec(ack(id, code)));
        }
    }
    Ok(())
}

fn on_subscribe(broker: &Broker, conn: &mut Session, s: Subscribe) {
    let id = s.properties.subscription_identifiers.first().copied();
    let mut codes = Vec::with_capacity(s.filters.len());
    let mut retained = Vec::new();
    // Retained messages wait in `pending` until the client takes them: a
    // client that subscribes again and again without reading would grow it
    // without end. Past two full sets of retained messages, further filters
    // are refused (Quota exceeded; 3.1.1: failure) until it catches up.
    let cap = broker.config.max_retained.saturating_mul(2).max(10_000);
    for f in &s.filters {
        if conn.pending.len() + retained.len() > cap {
            codes.push(reason::QUOTA_EXCEEDED);
            continue;
        }
        if !conn.auth.may_subscribe(&f.filter) {
            tracing::debug!(client = %conn.client, filter = %f.filter, "mqtt: subscription not authorized");
            codes.push(access::REFUSED_SUBSCRIBE_CODE);
            continue;
        }
        let opts = SubOptions {
            options: f.options,
            id,
        };
        match broker.subscribe(&conn.client, &f.filter, opts) {
            Ok((qos, r)) => {
                codes.push(qos.as_u8());
                retained.extend(r);
            }
            Err(code) => codes.push(code),
        }
    }
    conn.send(&Packet::SubAck(SubAck {
        packet_id: s.packet_id,
        codes,
        properties: Properties::default(),
    }));
    // Retained messages follow the SUBACK (§3.8.4).
    conn.pending.extend(retained);
}

fn on_unsubscribe(broker: &Broker, conn: &mut Session, u: Unsubscribe) {
    let codes = u
        .filters
        .iter()
        .map(|f| {
            if broker.unsubscribe(&conn.client, f) {
                reason::SUCCESS
            } else {
                reason::NO_SUBSCRIPTION_EXISTED
            }
        })
        .collect();
    conn.send(&Packet::UnsubAck(UnsubAck {
        packet_id: u.packet_id,
        codes: if conn.version == Version::V5 {
            codes
        } else {
            Vec::new()
        },
        properties: Properties::default(),
    }));
}

impl Session {
    fn rel(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<u16>> {
        self.awaiting_rel.lock().expect("awaiting_rel lock")
    }

    /// Queues an acknowledgement to send once `ticket` is durable, after every
    /// acknowledgement queued before it (§4.6: in PUBLISH order).
    fn ack_after(&mut self, ticket: u64, p: Packet) {
        self.acks.push_back((ticket, p));
    }

    /// Sends the acknowledgements whose records are durable.
    fn flush_acks(&mut self) -> Result<(), ConnError> {
        let Some((rx, store)) = &mut self.durable else {
            while let Some((_, p)) = self.acks.pop_front() {
                self.send(&p);
            }
            return Ok(());
        };
        // Marks the value seen, so the loop's `changed()` waits for the next
        // write instead of returning at once; read before `durability`.
        let synced = *rx.borrow_and_update();
        let store = store.clone();
        while let Some((t, _)) = self.acks.front() {
            match store.durability(*t, synced) {
                Durability::Durable => {
                    if let Some((_, p)) = self.acks.pop_front() {
                        self.send(&p);
                    }
                }
                Durability::Pending => break,
                // Only a publish that needed a durable record is refused
                // while the store fails; the store retries and recovers.
                Durability::Failed => {
                    return Err(ConnError::Refused(reason::IMPLEMENTATION_SPECIFIC_ERROR))
                }
            }
        }
        Ok(())
    }

    /// A persisted delivery left the session (acknowledged or dropped).
    fn done(&self, broker: &Broker, seq: Option<u64>) {
        if let Some(seq) = seq {
            broker.ack(&self.client, seq);
        }
    }

    fn send(&mut self, p: &Packet) {
        if let Err(e) = encode(p, self.version, &mut self.out) {
            tracing::warn!("mqtt encode {}: {e}", p.name());
        }
    }

    /// A Packet Identifier no delivery of the session holds. The session
    /// never has 65 535 in use (its queue and Receive Maximum are far
    /// smaller), so the search ends.
    fn next_packet_id(&mut self) -> u16 {
        let mut used = self.out_ids.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..u16::MAX {
            let id = self.next_id;
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            if !self.inflight.contains_key(&id) && used.insert(id) {
                return id;
            }
        }
        // Unreachable by the bound above; should the session's set ever fill
        // up, reuse one only the other connections know (never loop forever).
        // (Fewer than Receive Maximum ≤ 65 535 are in `inflight` here, so
        // a free one exists.)
        used.clear();
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            if !self.inflight.contains_key(&id) {
                used.insert(id);
                return id;
            }
        }
    }

    /// A delivery's flow is over: its identifier is free again.
    fn release_id(&self, id: u16) {
        self.out_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Writes pending deliveries while the client's Receive Maximum allows.
    fn flush_pending(&mut self, broker: &Broker) {
        let now = Instant::now();
        while self.out.len() < MAX_WRITE_BUFFER {
            let Some(d) = self.pending.front() else {
                return;
            };
            if d.qos != QoS::AtMostOnce && self.inflight.len() >= self.send_quota {
                return;
            }
            let Some(mut d) = self.pending.pop_front() else {
                return;
            };
            // Its old Packet Identifier, unless a message of this connection
            // took it meanwhile (a takeover's leftovers arrive late).
            let old_id = d
                .packet_id
                .take()
                .filter(|id| !self.inflight.contains_key(id));
            if d.released {
                if let Some(id) = old_id {
                    // The client has the message: it only waits for PUBREL.
                    self.send(&Packet::PubRel(ack(id, reason::SUCCESS)));
                    self.inflight.insert(id, Flight::Released(d));
                    continue;
                }
                // Its identifier is gone: the PUBLISH goes again (the best
                // we can do; the client may see it twice).
                d.released = false;
            }
            // Read rights per delivery (retained messages included): a
            // wildcard subscription may match topics the client may not
            // read, and a reload may have changed the rules.
            if !self.auth.may_deliver(&d.message.topic) {
                if let Some(id) = old_id {
                    self.release_id(id);
                }
                broker.metrics.count_drop(DropReason::NotAuthorized);
                self.done(broker, d.seq);
                continue;
            }
            // Expired messages are dropped, unless sent already: delivery
            // has begun (§3.3.2.3.3).
            if old_id.is_none() && d.message.expired(now) {
                self.done(broker, d.seq);
                continue;
            }
            let m = &d.message;
            let mut properties = Properties::default();
            if self.version == Version::V5 {
                properties = m.properties.clone();
                properties.message_expiry_interval = m
                    .expires
                    .map(|e| e.saturating_duration_since(now).as_secs().max(1) as u32);
                properties.subscription_identifiers = d.subscription_ids.clone();
            }
            let packet_id =
                (d.qos != QoS::AtMostOnce).then(|| old_id.unwrap_or_else(|| self.next_packet_id()));
            let p = Packet::Publish(Publish {
                dup: d.dup && d.qos != QoS::AtMostOnce,
                qos: d.qos,
                retain: d.retain,
                topic: m.topic.to_string(),
                packet_id,
                properties,
                payload: m.payload.clone(),
            });
            match encoded_len(&p, self.version) {
                Ok(n) if n <= self.client_max_packet => {}
                // Too large for this client: discarded as if delivered (§3.1.2.25).
                _ => {
                    if let Some(id) = packet_id {
                        self.release_id(id);
                    }
                    self.done(broker, d.seq);
                    continue;
                }
            }
            self.send(&p);
            broker.metrics.count_sent(d.qos);
            if let Some(id) = packet_id {
                if let (QoS::ExactlyOnce, Some(seq), None) = (d.qos, d.seq, old_id) {
                    broker.inflight(&self.client, seq, id, false);
                }
                self.inflight.insert(id, Flight::Sent(d));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BrokerConfig;
    use quichub_mqtt::{SubscribeFilter, SubscriptionOptions, Will};
    use tokio::sync::mpsc;

    /// A client and its session exchanging packets in memory, driven step
    /// by step as quinn-proto's `Pair` drives two endpoints: nothing happens
    /// unless the test says so, and time is a value the test moves.
    struct Pair {
        broker: Arc<Broker>,
        session: Box<Session>,
        deliveries: mpsc::Receiver<Delivery>,
        kick: mpsc::Receiver<u8>,
        now: Instant,
    }

    const T0: Duration = Duration::from_secs(1000);

    fn hello(v: Version, client: &str) -> Connect {
        Connect {
            version: v,
            client_id: client.into(),
            clean_start: true,
            keep_alive: 0,
            username: None,
            password: None,
            will: None,
            properties: Properties::default(),
        }
    }

    /// Connects `c` to `broker`: the pair and the CONNACK.
    fn connect(broker: &Arc<Broker>, cfg: ConnConfig, c: Connect) -> (Pair, ConnAck) {
        let (tx, deliveries) = mpsc::channel(16);
        let (kick_tx, kick) = mpsc::channel(1);
        let outbox = Outbox {
            tx,
            conn: broker.next_conn_id(),
            kick: kick_tx,
        };
        let now = Instant::now() + T0;
        let accepted = accept(
            broker,
            &Arc::new(cfg),
            &Peer::default(),
            c,
            outbox,
            BytesMut::new(),
            now,
            SystemTime::now(),
        );
        let Ok(Accept::Connected(session)) = accepted else {
            panic!("refused");
        };
        let mut pair = Pair {
            broker: broker.clone(),
            session,
            deliveries,
            kick,
            now,
        };
        match pair.recv().as_slice() {
            [Packet::ConnAck(a)] => {
                let a = a.clone();
                (pair, a)
            }
            p => panic!("not a CONNACK: {p:?}"),
        }
    }

    impl Pair {
        /// The client sends `p`; the session handles it and what the broker
        /// delivered meanwhile.
        fn send(&mut self, p: Packet) -> Result<Option<Ending>, ConnError> {
            encode(&p, self.session.version(), self.session.input()).unwrap();
            self.step()
        }

        /// One turn of the session, as the driver takes it.
        fn step(&mut self) -> Result<Option<Ending>, ConnError> {
            let end = self.session.handle_input(&self.broker, self.now)?;
            while let Ok(d) = self.deliveries.try_recv() {
                self.session.deliver(d);
            }
            self.session.flush(&self.broker)?;
            Ok(end)
        }

        /// What the session sent the client since the last call.
        fn recv(&mut self) -> Vec<Packet> {
            let v = self.session.version();
            let out = self.session.output();
            std::iter::from_fn(|| decode(out, Some(v), usize::MAX).unwrap()).collect()
        }
    }

    fn subscribe(id: u16, filter: &str, qos: QoS) -> Packet {
        Packet::Subscribe(Subscribe {
            packet_id: id,
            filters: vec![SubscribeFilter {
                filter: filter.into(),
                options: SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            }],
            properties: Properties::default(),
        })
    }

    fn publish(topic: &str, qos: QoS, id: u16) -> Publish {
        Publish {
            qos,
            topic: topic.into(),
            packet_id: (qos != QoS::AtMostOnce).then_some(id),
            payload: bytes::Bytes::from_static(b"x"),
            ..Publish::default()
        }
    }

    fn topics(packets: &[Packet]) -> Vec<&str> {
        packets
            .iter()
            .filter_map(|p| match p {
                Packet::Publish(p) => Some(p.topic.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn keep_alive_is_a_deadline_each_packet_moves() {
        let broker = Broker::new(BrokerConfig::default());
        let c = Connect {
            keep_alive: 10,
            ..hello(Version::V311, "k")
        };
        let (mut a, ack) = connect(&broker, ConnConfig::default(), c);
        assert_eq!(ack.code, reason::SUCCESS);
        let t0 = a.now;
        // One and a half times the Keep Alive (§3.1.2.10).
        assert_eq!(a.session.timeout(), Some(t0 + Duration::from_secs(15)));
        a.now = t0 + Duration::from_secs(10);
        a.send(Packet::PingReq).unwrap();
        assert!(matches!(a.recv().as_slice(), [Packet::PingResp]));
        assert_eq!(a.session.timeout(), Some(t0 + Duration::from_secs(25)));
        assert!(a
            .session
            .handle_timeout(t0 + Duration::from_secs(24))
            .is_ok());
        let e = a.session.handle_timeout(t0 + Duration::from_secs(25));
        assert!(matches!(e, Err(ConnError::Timeout)));
        assert_eq!(
            disconnect_code(&e.unwrap_err()),
            Some(reason::KEEP_ALIVE_TIMEOUT)
        );
    }

    #[test]
    fn qos2_from_the_client_is_routed_once() {
        let broker = Broker::new(BrokerConfig::default());
        let (mut sub, _) = connect(&broker, ConnConfig::default(), hello(Version::V5, "s"));
        sub.send(subscribe(1, "t", QoS::ExactlyOnce)).unwrap();
        assert!(matches!(sub.recv().as_slice(), [Packet::SubAck(_)]));
        let (mut p, _) = connect(&broker, ConnConfig::default(), hello(Version::V5, "p"));
        let q2 = publish("t", QoS::ExactlyOnce, 7);
        p.send(Packet::Publish(q2.clone())).unwrap();
        // Retransmitted before PUBREL: acknowledged again, not routed again.
        p.send(Packet::Publish(Publish { dup: true, ..q2 }))
            .unwrap();
        let recs: Vec<_> = p.recv();
        assert_eq!(recs.len(), 2);
        for r in &recs {
            assert!(matches!(r, Packet::PubRec(a) if a.packet_id == 7 && a.code == 0));
        }
        p.send(Packet::PubRel(ack(7, 0))).unwrap();
        assert!(matches!(p.recv().as_slice(), [Packet::PubComp(a)] if a.code == 0));
        p.send(Packet::PubRel(ack(7, 0))).unwrap();
        assert!(matches!(
            p.recv().as_slice(),
            [Packet::PubComp(a)] if a.code == reason::PACKET_IDENTIFIER_NOT_FOUND
        ));
        sub.step().unwrap();
        let got = sub.recv();
        assert_eq!(topics(&got), ["t"]);
        // Its flow: PUBREC from the client, PUBREL from us, PUBCOMP ends it.
        let Packet::Publish(d) = &got[0] else {
            unreachable!()
        };
        let id = d.packet_id.unwrap();
        sub.send(Packet::PubRec(ack(id, 0))).unwrap();
        assert!(matches!(sub.recv().as_slice(), [Packet::PubRel(a)] if a.packet_id == id));
        sub.send(Packet::PubComp(ack(id, 0))).unwrap();
        assert!(sub.session.inflight.is_empty());
    }

    #[test]
    fn the_clients_receive_maximum_bounds_what_is_in_flight() {
        let broker = Broker::new(BrokerConfig::default());
        let mut c = hello(Version::V5, "s");
        c.properties.receive_maximum = Some(2);
        let (mut sub, _) = connect(&broker, ConnConfig::default(), c);
        sub.send(subscribe(1, "t/+", QoS::AtLeastOnce)).unwrap();
        sub.recv();
        for t in ["t/1", "t/2", "t/3"] {
            let m = Message::new(t, "x".into(), QoS::AtLeastOnce, false, Source::Http);
            broker.publish(m);
        }
        sub.step().unwrap();
        let got = sub.recv();
        assert_eq!(topics(&got), ["t/1", "t/2"]);
        let Packet::Publish(first) = &got[0] else {
            unreachable!()
        };
        sub.send(Packet::PubAck(ack(first.packet_id.unwrap(), 0)))
            .unwrap();
        assert_eq!(topics(&sub.recv()), ["t/3"]);
    }

    #[test]
    fn topic_aliases_stand_for_their_topic() {
        let broker = Broker::new(BrokerConfig::default());
        let (mut sub, _) = connect(&broker, ConnConfig::default(), hello(Version::V5, "s"));
        sub.send(subscribe(1, "a", QoS::AtMostOnce)).unwrap();
        sub.recv();
        let (mut p, _) = connect(&broker, ConnConfig::default(), hello(Version::V5, "p"));
        let mut first = publish("a", QoS::AtMostOnce, 0);
        first.properties.topic_alias = Some(1);
        p.send(Packet::Publish(first.clone())).unwrap();
        let again = Publish {
            topic: String::new(),
            ..first.clone()
        };
        p.send(Packet::Publish(again.clone())).unwrap();
        sub.step().unwrap();
        assert_eq!(topics(&sub.recv()), ["a", "a"]);
        // Above the maximum: Topic Alias invalid (0 the decoder refuses);
        // unknown: a protocol error.
        let mut over = first.clone();
        over.properties.topic_alias = Some(ConnConfig::default().topic_alias_maximum + 1);
        let e = p.send(Packet::Publish(over)).unwrap_err();
        assert_eq!(disconnect_code(&e), Some(reason::TOPIC_ALIAS_INVALID));
        let (mut q, _) = connect(&broker, ConnConfig::default(), hello(Version::V5, "q"));
        let e = q.send(Packet::Publish(again)).unwrap_err();
        assert!(matches!(e, ConnError::Protocol("unknown topic alias")));
    }

    #[test]
    fn malformed_input_ends_with_its_reason_code() {
        let broker = Broker::new(BrokerConfig::default());
        let (mut a, _) = connect(&broker, ConnConfig::default(), hello(Version::V5, "a"));
        // Packet type 0 is reserved.
        a.session.input().extend_from_slice(&[0x00, 0x00]);
        let e = a.step().unwrap_err();
        assert!(matches!(e, ConnError::Decode(_)));
        assert_eq!(disconnect_code(&e), Some(reason::MALFORMED_PACKET));
        // The client is told why; nothing else it was owed goes out.
        let _ = a.session.end(&Err(e), Vec::new(), SystemTime::now());
        assert!(matches!(
            a.recv().as_slice(),
            [Packet::Disconnect(d)] if d.code == reason::MALFORMED_PACKET
        ));
        let (mut b, _) = connect(&broker, ConnConfig::default(), hello(Version::V5, "b"));
        let e = b
            .send(Packet::Connect(hello(Version::V5, "b")))
            .unwrap_err();
        assert_eq!(disconnect_code(&e), Some(reason::PROTOCOL_ERROR));
    }

    #[test]
    fn a_takeover_is_signalled_and_the_will_follows_an_abnormal_end() {
        let broker = Broker::new(BrokerConfig::default());
        let mut c = hello(Version::V5, "c");
        c.will = Some(Will {
            topic: "w".into(),
            payload: "gone".into(),
            qos: QoS::AtMostOnce,
            retain: true,
            properties: Properties::default(),
        });
        let (mut old, _) = connect(&broker, ConnConfig::default(), c.clone());
        let (_new, ack) = connect(&broker, ConnConfig::default(), hello(Version::V5, "c"));
        assert!(!ack.session_present);
        let code = old.kick.try_recv().unwrap();
        assert_eq!(code, reason::SESSION_TAKEN_OVER);
        let end = Err(ConnError::Refused(code));
        old.session
            .end(&end, Vec::new(), SystemTime::now())
            .leave(&broker);
        assert!(matches!(
            old.recv().as_slice(),
            [Packet::Disconnect(d)] if d.code == reason::SESSION_TAKEN_OVER
        ));
        assert!(broker.retained("w").is_some());
        // A DISCONNECT discards it.
        c.will.as_mut().unwrap().topic = "w2".into();
        let (mut d, _) = connect(&broker, ConnConfig::default(), c);
        let end = d.send(Packet::Disconnect(Disconnect::default()));
        assert!(matches!(end, Ok(Some(Ending::Normal))));
        d.session
            .end(&Ok(Ending::Normal), Vec::new(), SystemTime::now())
            .leave(&broker);
        assert!(broker.retained("w2").is_none());
    }

    #[test]
    fn a_client_over_its_rate_waits_until_its_tokens_are_back() {
        let broker = Broker::new(BrokerConfig::default());
        let cfg = ConnConfig {
            publish_rate: 1,
            publish_burst: 1,
            ..ConnConfig::default()
        };
        let (mut p, _) = connect(&broker, cfg, hello(Version::V311, "p"));
        let t0 = p.now;
        let v = p.session.version();
        for _ in 0..2 {
            let m = Packet::Publish(publish("t", QoS::AtLeastOnce, 1));
            encode(&m, v, p.session.input()).unwrap();
        }
        p.step().unwrap();
        assert_eq!(p.recv().len(), 1);
        assert!(p.session.throttled());
        assert!(!p.session.can_read());
        assert_eq!(p.session.timeout(), Some(t0 + Duration::from_secs(1)));
        p.session
            .handle_timeout(t0 + Duration::from_secs(1))
            .unwrap();
        assert!(!p.session.throttled());
        p.now = t0 + Duration::from_secs(1);
        p.step().unwrap();
        assert_eq!(p.recv().len(), 1);
        assert_eq!(p.session.client().as_ref(), "p");
    }

    #[test]
    fn certificate_policy_as_mosquitto() {
        let pw = Some(bytes::Bytes::from_static(b"pw"));
        let cert = |cn: Option<&str>| {
            Some(PeerCert {
                subject_cn: cn.map(str::to_owned),
            })
        };
        let peer = |certificate, require, identity| Peer {
            transport: Transport::Tls,
            certificate,
            require_certificate: require,
            use_identity_as_username: identity,
        };
        // No policy: the CONNECT's credentials.
        let c = credentials(&Peer::default(), Some("u"), pw.as_ref()).unwrap();
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password, pw);
        assert!(!c.from_certificate);
        // Required: none is Not authorized; one is enough, the password stays.
        let no = credentials(&peer(None, true, false), Some("u"), pw.as_ref());
        assert_eq!(no, Err(reason::NOT_AUTHORIZED));
        let c = credentials(
            &peer(cert(Some("dev")), true, false),
            Some("u"),
            pw.as_ref(),
        );
        assert_eq!(c.unwrap().username.as_deref(), Some("u"));
        // Identity as user name: the CN, with no password; without a
        // certificate or a CN, Bad user name or password.
        let c = credentials(&peer(cert(Some("dev")), true, true), Some("u"), pw.as_ref());
        assert_eq!(
            c.unwrap(),
            Credentials {
                username: Some("dev".into()),
                password: None,
                from_certificate: true,
            }
        );
        let bad = Err(reason::BAD_USERNAME_OR_PASSWORD);
        assert_eq!(credentials(&peer(None, false, true), Some("u"), None), bad);
        assert_eq!(
            credentials(&peer(cert(None), false, true), Some("u"), None),
            bad
        );
    }
}
