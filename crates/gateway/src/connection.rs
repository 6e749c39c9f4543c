//! One MQTT connection over any byte stream (TCP, TLS, a QUIC stream): the
//! CONNECT handshake, the QoS 1/2 flows in both directions, topic aliases,
//! keep alive, receive maximum, maximum packet size and the Will Message.
//!
//! One task per connection, one `select!` over reading the socket, writing
//! the socket, deliveries from the broker, a takeover signal and the keep
//! alive deadline. Reads and writes are both cancel-safe branches, so a client
//! that publishes while not reading never deadlocks the broker; past
//! [`MAX_WRITE_BUFFER`] unsent bytes the connection stops reading (the client
//! is throttled by TCP) and stops taking deliveries (its queue in the broker
//! fills and drops, counted). A client over its publish rate or bandwidth
//! ([`ConnConfig::publish_rate`], ...) is throttled the same way: its next
//! PUBLISH stays unread until its tokens are back (as EMQX does), so nothing
//! is lost and every transport's own flow control holds the client back.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, BytesMut};
use quichub_mqtt::reason;
use quichub_mqtt::topic;
use quichub_mqtt::{
    decode, encode, encoded_len, Ack, ConnAck, Connect, DecodeError, Disconnect, Packet,
    Properties, Publish, QoS, SubAck, Subscribe, UnsubAck, Unsubscribe, Version,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

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
            // would throttle `quichub bench-mqtt` publishers at saturation.
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
    fn new(cfg: &ConnConfig) -> Self {
        let now = std::time::Instant::now();
        Self {
            messages: TokenBucket::new(cfg.publish_rate, cfg.publish_burst, now),
            bytes: TokenBucket::new(cfg.publish_bytes_rate, cfg.publish_bytes_burst, now),
        }
    }

    /// How long until the next PUBLISH may be read, and the limit it waits
    /// for; `None`: now.
    fn wait(&self, now: std::time::Instant) -> Option<(Duration, ThrottleReason)> {
        let w = |b: &Option<TokenBucket>| b.as_ref().map_or(Duration::ZERO, |b| b.wait(now));
        let (m, b) = (w(&self.messages), w(&self.bytes));
        match (m.is_zero(), b.is_zero()) {
            (true, true) => None,
            _ if m >= b => Some((m, ThrottleReason::Messages)),
            _ => Some((b, ThrottleReason::Bytes)),
        }
    }

    /// A PUBLISH of `len` bytes was read.
    fn take(&mut self, len: usize, now: std::time::Instant) {
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

/// A connection after its CONNECT.
struct Conn {
    version: Version,
    client: Arc<str>,
    conn_id: u64,
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
}

/// Serves one MQTT connection over TCP until it ends.
pub async fn serve<R, W>(
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    rd: R,
    wr: W,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    serve_peer(broker, cfg, Peer::default(), rd, wr).await
}

/// Serves one MQTT connection of `peer` until it ends.
pub async fn serve_peer<R, W>(
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    peer: Peer,
    rd: R,
    wr: W,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rd = Metered::new(rd, &broker.metrics.bytes_received);
    let mut wr = Metered::new(wr, &broker.metrics.bytes_sent);
    let mut inbuf = BytesMut::with_capacity(4096);
    let max_in = cfg.max_packet_size as usize;
    // CONNECT.
    let connect = tokio::time::timeout(cfg.connect_timeout, async {
        loop {
            match decode(&mut inbuf, None, max_in) {
                Ok(Some(Packet::Connect(c))) => return Ok(c),
                Ok(Some(_)) => return Err(ConnError::Protocol("first packet is not CONNECT")),
                Ok(None) => {}
                Err(DecodeError::UnsupportedProtocolVersion(_)) => {
                    // Answer in 3.1.1, which every client version can read.
                    let mut b = BytesMut::new();
                    let ack = Packet::ConnAck(ConnAck {
                        code: reason::V311_UNACCEPTABLE_PROTOCOL_VERSION,
                        ..ConnAck::default()
                    });
                    let _ = encode(&ack, Version::V311, &mut b);
                    let _ = wr.write_all(&b).await;
                    return Err(ConnError::Refused(reason::UNSUPPORTED_PROTOCOL_VERSION));
                }
                Err(e) => return Err(e.into()),
            }
            if rd.read_buf(&mut inbuf).await? == 0 {
                return Err(ConnError::Protocol("closed before CONNECT"));
            }
        }
    })
    .await
    .map_err(|_| ConnError::Timeout)??;

    let version = connect.version;
    let (conn, tx_kick, mut kick, mut rx, keep_alive) =
        match accept(&broker, &cfg, &peer, connect, &mut wr).await? {
            Some(x) => x,
            None => return Ok(()),
        };
    drop(tx_kick);
    let _open = broker.metrics.connection_opened(peer.transport);
    let mut conn = conn;
    let result = run(
        &broker, &cfg, &mut conn, &mut inbuf, &mut rd, &mut wr, &mut rx, &mut kick, keep_alive,
    )
    .await;
    // Unacked QoS 1/2 deliveries go back to the session for the next connection.
    let mut unacked: Vec<Delivery> = Vec::new();
    let mut ids: Vec<u16> = conn.inflight.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        // Sent again on the session's next connection with the same Packet
        // Identifier (§4.4): PUBLISH with DUP, or only the PUBREL.
        match conn.inflight.remove(&id) {
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
    unacked.extend(conn.pending.drain(..).filter(|d| d.qos != QoS::AtMostOnce));
    rx.close();
    while let Ok(d) = rx.try_recv() {
        if d.qos != QoS::AtMostOnce {
            unacked.push(d);
        }
    }
    let will = match &result {
        Ok(Ending::Normal) => None,
        _ => conn.will.take(),
    };
    // The Will is checked as a publish when it is about to be published (as
    // mosquitto does), with the rights in force now; a client whose
    // credentials expired or were revoked leaves none.
    let now = SystemTime::now();
    let will = will.filter(|(m, _)| {
        conn.auth.expires().is_none_or(|e| e > now)
            && conn.auth.refresh(now).is_ok()
            && conn.auth.may_publish(&m.topic)
    });
    if let Err(e) = &result {
        tracing::debug!(client = %conn.client, version = ?version, "mqtt connection ended: {e}");
        // MQTT 5 clients learn why (§4.13.2); a 3.1.1 connection just closes.
        if version == Version::V5 {
            if let Some(code) = disconnect_code(e) {
                conn.out.clear();
                let _ = encode(
                    &Packet::Disconnect(Disconnect {
                        code,
                        properties: Properties::default(),
                    }),
                    Version::V5,
                    &mut conn.out,
                );
                let _ = tokio::time::timeout(Duration::from_secs(1), wr.write_all(&conn.out)).await;
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), wr.shutdown()).await;
    broker.disconnect(
        &conn.client,
        conn.conn_id,
        unacked,
        will,
        conn.expiry_override,
    );
    result.map(|_| ())
}

fn disconnect_code(e: &ConnError) -> Option<u8> {
    match e {
        ConnError::Io(_) => None,
        ConnError::Decode(d) => Some(d.reason_code()),
        ConnError::Protocol(_) => Some(reason::PROTOCOL_ERROR),
        ConnError::Timeout => Some(reason::KEEP_ALIVE_TIMEOUT),
        ConnError::Refused(c) => Some(*c),
    }
}

/// The CONNECT checks and CONNACK. `None` when refused (CONNACK sent).
#[allow(clippy::type_complexity)]
async fn accept<W: AsyncWrite + Unpin>(
    broker: &Arc<Broker>,
    cfg: &ConnConfig,
    peer: &Peer,
    c: Connect,
    wr: &mut W,
) -> Result<
    Option<(
        Conn,
        mpsc::Sender<u8>,
        mpsc::Receiver<u8>,
        mpsc::Receiver<Delivery>,
        Option<Duration>,
    )>,
    ConnError,
> {
    let v = c.version;
    let refuse = |code: u8| {
        let code = if v == Version::V311 {
            reason::connack_v311(code)
        } else {
            code
        };
        Packet::ConnAck(ConnAck {
            code,
            ..ConnAck::default()
        })
    };
    let mut out = BytesMut::new();
    let conn_id = broker.next_conn_id();
    let mut props = Properties::default();
    // Client Identifier: a 3.1.1 client with a persistent session must bring
    // one; otherwise the broker makes one up (and tells a 5.0 client).
    let client_id: Arc<str> = if c.client_id.is_empty() {
        if v == Version::V311 && !c.clean_start {
            let _ = encode(&refuse(reason::CLIENT_IDENTIFIER_NOT_VALID), v, &mut out);
            wr.write_all(&out).await?;
            return Ok(None);
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
            let _ = encode(&refuse(code), v, &mut out);
            wr.write_all(&out).await?;
            return Ok(None);
        }
    };
    if c.properties.authentication_method.is_some() {
        let _ = encode(&refuse(reason::BAD_AUTHENTICATION_METHOD), v, &mut out);
        wr.write_all(&out).await?;
        return Ok(None);
    }
    // Before the session is touched: an unauthenticated client must not
    // take over (or learn about) anyone's session.
    let user = credentials.username.clone();
    let from_certificate = credentials.from_certificate;
    let auth = match ConnAuth::connect(
        broker.auth(),
        credentials,
        client_id.clone(),
        SystemTime::now(),
    ) {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(
                client = %client_id,
                transport = peer.transport.label(),
                user = user.as_deref().unwrap_or(""),
                "mqtt: refused: {e}"
            );
            let _ = encode(&refuse(access::connack_code(&e)), v, &mut out);
            wr.write_all(&out).await?;
            return Ok(None);
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
                let _ = encode(&refuse(reason::TOPIC_NAME_INVALID), v, &mut out);
                wr.write_all(&out).await?;
                return Ok(None);
            }
            let delay = Duration::from_secs(w.properties.will_delay_interval.unwrap_or(0).into());
            let m = Message::new(
                &w.topic,
                w.payload.clone(),
                w.qos,
                w.retain,
                Source::Will(client_id.clone()),
            )
            .with_properties(&w.properties, Instant::now());
            Some((m, delay))
        }
        None => None,
    };
    let (tx, rx) = mpsc::channel(broker.config.max_queued.max(1));
    let (kick_tx, kick_rx) = mpsc::channel(1);
    let outbox = Outbox {
        tx,
        conn: conn_id,
        kick: kick_tx.clone(),
    };
    let connected = match broker.connect(&client_id, c.clean_start, expiry, outbox) {
        Ok(x) => x,
        Err(code) => {
            let _ = encode(&refuse(code), v, &mut out);
            wr.write_all(&out).await?;
            return Ok(None);
        }
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
    encode(&ack, v, &mut out).map_err(|_| ConnError::Protocol("CONNACK encoding"))?;
    let keep_alive =
        (c.keep_alive > 0).then(|| Duration::from_millis(u64::from(c.keep_alive) * 1500));
    let conn = Conn {
        version: v,
        client: client_id,
        conn_id,
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
    };
    Ok(Some((conn, kick_tx, kick_rx, rx, keep_alive)))
}

enum Ending {
    /// DISCONNECT: the Will Message is discarded.
    Normal,
    /// DISCONNECT with reason 0x04: the Will Message is published.
    WithWill,
}

#[allow(clippy::too_many_arguments)]
async fn run<R, W>(
    broker: &Arc<Broker>,
    cfg: &ConnConfig,
    conn: &mut Conn,
    inbuf: &mut BytesMut,
    rd: &mut R,
    wr: &mut W,
    rx: &mut mpsc::Receiver<Delivery>,
    kick: &mut mpsc::Receiver<u8>,
    keep_alive: Option<Duration>,
) -> Result<Ending, ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let max_in = cfg.max_packet_size as usize;
    let mut deadline = keep_alive.map(|k| tokio::time::Instant::now() + k);
    let mut eof = false;
    let mut limits = PublishLimits::new(cfg);
    // While set, a PUBLISH waits unread (in `inbuf` or the socket) for the
    // client's tokens.
    let mut throttled: Option<tokio::time::Instant> = None;
    // Reloads wake the loop, so an idle client whose credentials a reload
    // revoked is disconnected at once (reloads before this are caught by
    // the first `refresh`, which compares generations).
    let mut auth_changes = conn.auth.changes();
    // Packets that arrived with the CONNECT.
    loop {
        // A reload since the last turn: the rights of the credentials now.
        if let Err(e) = conn.auth.refresh(SystemTime::now()) {
            tracing::debug!(client = %conn.client, "mqtt: credentials no longer accepted: {e}");
            return Err(ConnError::Refused(access::disconnect_code(&e)));
        }
        while throttled.is_none() {
            // Packets are read in order: one held back holds back those
            // behind it too, so only the client's own flow stalls.
            let publish = inbuf.first().is_some_and(|b| b >> 4 == PUBLISH);
            let now = std::time::Instant::now();
            if publish {
                if let Some((wait, why)) = limits.wait(now) {
                    broker.metrics.count_throttled(why);
                    throttled = Some(tokio::time::Instant::now() + wait);
                    break;
                }
            }
            let before = inbuf.len();
            let Some(p) = decode(inbuf, Some(conn.version), max_in)? else {
                break;
            };
            if matches!(p, Packet::Publish(_)) {
                limits.take(before - inbuf.len(), now);
            }
            if let Some(k) = keep_alive {
                deadline = Some(tokio::time::Instant::now() + k);
            }
            if let Some(end) = handle(broker, cfg, conn, p)? {
                if let Some((rx, _)) = conn.durable.as_mut() {
                    let last = conn.acks.back().map_or(0, |(t, _)| *t);
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|v| *v >= last))
                            .await;
                }
                conn.flush_acks()?;
                conn.flush_pending(broker);
                let _ = tokio::time::timeout(Duration::from_secs(1), wr.write_all(&conn.out)).await;
                return Ok(end);
            }
        }
        // What a throttled client sent before it closed is still served.
        if eof && throttled.is_none() {
            return Err(ConnError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        conn.flush_acks()?;
        conn.flush_pending(broker);
        let waiting_durable = !conn.acks.is_empty();
        let mut durable = conn.durable.as_ref().map(|(rx, _)| rx.clone());
        let synced = async {
            match durable.as_mut() {
                Some(rx) if waiting_durable => {
                    let _ = rx.changed().await;
                }
                _ => std::future::pending().await,
            }
        };
        // A publisher whose acknowledgements wait on the disk is not read
        // further until they drain (bounds `acks` and the store's queue).
        let can_read = conn.out.len() < MAX_WRITE_BUFFER
            && conn.acks.len() < cfg.receive_maximum as usize
            && throttled.is_none();
        let can_take = conn.out.len() < MAX_WRITE_BUFFER / 4 && conn.pending.len() < MAX_BATCH;
        // A throttled client is not idle: its keep alive waits too.
        let sleep = async {
            match (deadline, throttled) {
                (Some(d), None) => tokio::time::sleep_until(d).await,
                _ => std::future::pending().await,
            }
        };
        let unthrottled = async {
            match throttled {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        // The credentials' end (a JWT's `exp`).
        let expiry = conn.auth.expires().map(|e| {
            e.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        });
        let expired = async {
            match expiry {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let reloaded = async {
            if auth_changes.changed().await.is_err() {
                // The auth is gone: nothing will change any more.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            // The loop's top refreshes the credentials.
            () = reloaded => {}
            n = rd.read_buf(inbuf), if can_read => {
                if n? == 0 {
                    eof = true;
                }
            }
            n = wr.write(&conn.out), if !conn.out.is_empty() => {
                let n = n?;
                if n == 0 {
                    return Err(ConnError::Io(std::io::ErrorKind::WriteZero.into()));
                }
                conn.out.advance(n);
            }
            d = rx.recv(), if can_take => {
                if let Some(d) = d {
                    conn.pending.push_back(d);
                    // Take what else is queued now, so one write carries it all
                    // (one syscall per burst, not per message).
                    while conn.pending.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(d) => conn.pending.push_back(d),
                            Err(_) => break,
                        }
                    }
                }
            }
            code = kick.recv() => {
                return Err(ConnError::Refused(code.unwrap_or(reason::SESSION_TAKEN_OVER)));
            }
            _ = synced => {}
            () = unthrottled => {
                throttled = None;
                if let Some(k) = keep_alive {
                    deadline = Some(tokio::time::Instant::now() + k);
                }
            }
            _ = sleep => return Err(ConnError::Timeout),
            _ = expired => {
                tracing::debug!(client = %conn.client, "mqtt: credentials expired");
                broker
                    .auth()
                    .metrics
                    .failure(access::PROTOCOL, &quichub_auth::AuthError::Expired);
                return Err(ConnError::Refused(reason::MAXIMUM_CONNECT_TIME));
            }
        }
    }
}

/// Handles one packet from the client; `Some` ends the connection cleanly.
fn handle(
    broker: &Arc<Broker>,
    cfg: &ConnConfig,
    conn: &mut Conn,
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
    broker: &Arc<Broker>,
    cfg: &ConnConfig,
    conn: &mut Conn,
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

fn on_subscribe(broker: &Arc<Broker>, conn: &mut Conn, s: Subscribe) {
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

fn on_unsubscribe(broker: &Arc<Broker>, conn: &mut Conn, u: Unsubscribe) {
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

impl Conn {
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

/// A reader or writer that counts its bytes into a metric (one relaxed
/// `fetch_add` per read or write call, not per byte or packet).
struct Metered<'a, T> {
    inner: T,
    bytes: &'a std::sync::atomic::AtomicU64,
}

impl<'a, T> Metered<'a, T> {
    fn new(inner: T, bytes: &'a std::sync::atomic::AtomicU64) -> Self {
        Self { inner, bytes }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<'_, T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        if n > 0 {
            self.bytes
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<'_, T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            self.bytes
                .fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Fsync, Recovery, Store};
    use crate::BrokerConfig;
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// MQTT 3.1.1 CONNECT, Clean Session, client `c`.
    const CONNECT: &[u8] = &[
        0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 1, b'c',
    ];
    /// QoS 1 PUBLISH on `a`, packet id 1.
    const PUB1: &[u8] = &[0x32, 6, 0, 1, b'a', 0, 1, b'1'];

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

    #[tokio::test]
    async fn connections_messages_and_bytes_are_counted() {
        let broker = Broker::new(BrokerConfig::default());
        let (mut client, server) = tokio::io::duplex(4096);
        let (rd, wr) = tokio::io::split(server);
        let b = broker.clone();
        let task = tokio::spawn(serve_peer(
            b,
            Arc::new(ConnConfig::default()),
            Peer::on(Transport::Quic),
            rd,
            wr,
        ));
        client.write_all(CONNECT).await.unwrap();
        let mut connack = [0; 4];
        client.read_exact(&mut connack).await.unwrap();
        assert_eq!(connack, [0x20, 2, 0, 0]);
        assert_eq!(
            broker.metrics.connections[Transport::Quic as usize].load(Relaxed),
            1
        );
        // SUBSCRIBE `a` QoS 1, then a QoS 1 PUBLISH on it comes back.
        client
            .write_all(&[0x82, 6, 0, 1, 0, 1, b'a', 1])
            .await
            .unwrap();
        let mut suback = [0; 5];
        client.read_exact(&mut suback).await.unwrap();
        assert_eq!(suback, [0x90, 3, 0, 1, 1]);
        client.write_all(PUB1).await.unwrap();
        // PUBACK (4 bytes) and the PUBLISH (8) in any order.
        let mut back = [0; 12];
        client.read_exact(&mut back).await.unwrap();
        let m = &broker.metrics;
        assert_eq!(m.received_by_qos[1].load(Relaxed), 1);
        assert_eq!(m.sent_by_qos[1].load(Relaxed), 1);
        assert_eq!(
            m.bytes_received.load(Relaxed),
            (CONNECT.len() + 8 + PUB1.len()) as u64
        );
        assert_eq!(m.bytes_sent.load(Relaxed), 4 + 5 + 12);
        // DISCONNECT: the connection is no longer counted.
        client.write_all(&[0xe0, 0]).await.unwrap();
        task.await.unwrap().unwrap();
        assert_eq!(m.connected(), 0);
        assert_eq!(m.connections_accepted(), 1);
    }

    /// Writes `p` and reads the next packet the broker sends.
    async fn exchange(
        client: &mut tokio::io::DuplexStream,
        buf: &mut BytesMut,
        v: Version,
        p: Option<Packet>,
    ) -> Packet {
        if let Some(p) = p {
            let mut out = BytesMut::new();
            encode(&p, v, &mut out).unwrap();
            client.write_all(&out).await.unwrap();
        }
        loop {
            if let Some(p) = decode(buf, Some(v), 1 << 20).unwrap() {
                return p;
            }
            let n = tokio::time::timeout(Duration::from_secs(5), client.read_buf(buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed");
        }
    }

    fn connect(v: Version, user: &str, pass: &str, will: Option<&str>) -> Packet {
        Packet::Connect(Connect {
            version: v,
            client_id: "c1".into(),
            clean_start: true,
            keep_alive: 0,
            username: Some(user.into()),
            password: Some(bytes::Bytes::copy_from_slice(pass.as_bytes())),
            will: will.map(|t| quichub_mqtt::Will {
                topic: t.into(),
                payload: bytes::Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: Properties::default(),
            }),
            properties: Properties::default(),
        })
    }

    fn publish(topic: &str, qos: QoS, id: u16) -> Packet {
        Packet::Publish(Publish {
            qos,
            topic: topic.into(),
            packet_id: (qos != QoS::AtMostOnce).then_some(id),
            payload: bytes::Bytes::from_static(b"x"),
            ..Publish::default()
        })
    }

    #[tokio::test]
    async fn auth_reason_codes_on_the_wire() {
        let (_d, cfg, _key) = crate::access::tests::setup("wire");
        let broker = Broker::new(BrokerConfig::default());
        broker.set_auth(quichub_auth::SharedAuth::new(
            quichub_auth::Auth::load(&cfg).unwrap(),
        ));
        let start = || {
            let (client, server) = tokio::io::duplex(1 << 16);
            let (rd, wr) = tokio::io::split(server);
            let task = tokio::spawn(serve(
                broker.clone(),
                Arc::new(ConnConfig::default()),
                rd,
                wr,
            ));
            (client, task)
        };
        let code = |p: Packet| match p {
            Packet::ConnAck(a) => a.code,
            Packet::PubAck(a) | Packet::PubRec(a) => a.code,
            p => panic!("unexpected {}", p.name()),
        };
        // Wrong password: 0x86 / 4.
        for (v, want) in [(Version::V5, 0x86), (Version::V311, 4)] {
            let (mut c, _t) = start();
            let mut buf = BytesMut::new();
            let p = exchange(&mut c, &mut buf, v, Some(connect(v, "alice", "x", None))).await;
            assert_eq!(code(p), want);
        }
        // alice: sensors/# but not sensors/secret; her Will on `other` is
        // accepted at CONNECT and dropped when it would be published.
        let v = Version::V5;
        let (mut c, task) = start();
        let mut buf = BytesMut::new();
        let hello = connect(v, "alice", "s3cret", Some("other/will"));
        assert_eq!(code(exchange(&mut c, &mut buf, v, Some(hello)).await), 0);
        let sub = Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: ["sensors/#", "#", "$share/g/sensors/+"]
                .into_iter()
                .map(|f| quichub_mqtt::SubscribeFilter {
                    filter: f.into(),
                    options: quichub_mqtt::SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        ..Default::default()
                    },
                })
                .collect(),
            properties: Properties::default(),
        });
        match exchange(&mut c, &mut buf, v, Some(sub)).await {
            Packet::SubAck(s) => assert_eq!(s.codes, [1, 0x87, 1]),
            p => panic!("unexpected {}", p.name()),
        }
        let refused = [
            publish("other/x", QoS::AtLeastOnce, 2),
            publish("other/y", QoS::ExactlyOnce, 3),
            publish("$SYS/x", QoS::AtLeastOnce, 4),
        ];
        for p in refused {
            assert_eq!(code(exchange(&mut c, &mut buf, v, Some(p)).await), 0x87);
        }
        // QoS 0 is dropped silently; the next QoS 1 is the first answer.
        let p0 = publish("other/z", QoS::AtMostOnce, 0);
        let mut out = BytesMut::new();
        encode(&p0, v, &mut out).unwrap();
        c.write_all(&out).await.unwrap();
        // A message on sensors/secret from elsewhere (an HTTP POST) matches
        // her `sensors/#` but she may not read it: not delivered.
        broker.publish(Message::new(
            "sensors/secret",
            bytes::Bytes::from_static(b"s"),
            QoS::AtLeastOnce,
            false,
            Source::Http,
        ));
        let ok = publish("sensors/a", QoS::AtLeastOnce, 5);
        let mut got = Vec::new();
        got.push(exchange(&mut c, &mut buf, v, Some(ok)).await);
        got.push(exchange(&mut c, &mut buf, v, None).await);
        let topics: Vec<String> = got
            .iter()
            .filter_map(|p| match p {
                Packet::Publish(p) => Some(p.topic.clone()),
                _ => None,
            })
            .collect();
        // Its own message (once: the session's overlapping subscriptions
        // make one delivery), not the one on sensors/secret before it.
        assert_eq!(topics, ["sensors/a"], "{got:?}");
        assert!(got
            .iter()
            .any(|p| matches!(p, Packet::PubAck(a) if a.packet_id == 5 && a.code == 0)));
        assert_eq!(broker.metrics.dropped(DropReason::NotAuthorized), 1);
        // Gone without DISCONNECT: the Will on `other/will` is not hers to
        // publish.
        drop(c);
        let _ = task.await;
        assert!(broker.retained("other/will").is_none());
        let m = &broker.auth().metrics;
        assert_eq!(m.get("mqtt", false, "bad_credentials"), 2);
        assert_eq!(m.get("mqtt", true, "password"), 1);
        // #, other/x, other/y, $SYS/x, other/z, the will.
        assert_eq!(m.get("mqtt", false, "not_authorized"), 6);
    }

    #[tokio::test]
    async fn a_failing_store_refuses_only_publishes_it_must_persist() {
        let dir = std::env::temp_dir().join(format!("quichub-conn-failing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (store, rec) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
        let broker = Broker::with_store(BrokerConfig::default(), store.clone(), rec);
        store.fail_next_writes(u32::MAX);
        store.append(crate::store::Record::Unretain { topic: "x".into() });
        let mut synced = store.synced();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !store.failed() {
                synced.changed().await.unwrap();
            }
        })
        .await
        .unwrap();
        let (mut client, server) = tokio::io::duplex(4096);
        let (rd, wr) = tokio::io::split(server);
        tokio::spawn(serve(broker, Arc::new(ConnConfig::default()), rd, wr));
        client.write_all(CONNECT).await.unwrap();
        let mut connack = [0; 4];
        client.read_exact(&mut connack).await.unwrap();
        assert_eq!(connack, [0x20, 2, 0, 0]);
        // Nobody persistent subscribes to `a`: nothing to write, so the
        // failing store does not matter.
        client.write_all(PUB1).await.unwrap();
        let mut puback = [0; 4];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut puback))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(puback, [0x40, 2, 0, 1]);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
