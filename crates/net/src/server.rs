//! The server endpoint: one UDP socket, ALPN `moqt-18` (raw QUIC), `h3`
//! (WebTransport) and `mqtt` (MQTT over QUIC, served by the gateway) side by
//! side.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::mux::Session;
use anyhow::Context;
use web_transport_quinn::proto::ConnectResponse;

use crate::quic_config::{Admission, QuicConfig};
use crate::tcp_limits::{ConnGuard, ConnLimiter};
use crate::tls::{provider, ClientCertConfig, Identity};
use crate::{AckFrequency, Transport};

/// ALPN of HTTP/3: WebTransport sessions and the plain HTTP/3 API.
pub const ALPN_H3: &[u8] = b"h3";

/// ALPN of MQTT over QUIC (EMQX's and the MQTT-over-QUIC drafts' choice).
pub const ALPN_MQTT: &[u8] = b"mqtt";

/// Resumable TLS sessions the server remembers (each is used at most once;
/// the oldest go first).
const SESSION_CACHE: usize = 4096;

/// A bound server endpoint: one quinn endpoint on the caller's runtime, or
/// with [`QuicConfig::endpoints`] above 1, several on one port, each on a
/// thread of its own ([`crate::shard`]).
pub struct Server {
    endpoints: Vec<quinn::Endpoint>,
    /// The shards' runtimes, index by index (empty: one endpoint on the
    /// runtime that bound it).
    threads: crate::shard::Threads,
    config: QuicConfig,
    handshakes: Arc<AtomicUsize>,
    stats: Arc<AdmissionStats>,
    /// Every connection must present a client certificate
    /// (`tls.require_certificate`).
    require_certificate: bool,
    per_ip: PerIp,
}

/// The caps per client address: validated handshakes in flight, and
/// connections open.
#[derive(Clone)]
struct PerIp {
    handshakes: Arc<ConnLimiter>,
    connections: Arc<ConnLimiter>,
}

impl PerIp {
    fn new(quic: &QuicConfig) -> Self {
        Self {
            handshakes: ConnLimiter::new("quic-handshakes", usize::MAX, quic.max_handshakes_per_ip),
            connections: ConnLimiter::new("quic", usize::MAX, quic.max_connections_per_ip),
        }
    }
}

/// What the endpoint did with connection attempts, for `/metrics`.
#[derive(Debug, Default)]
pub struct AdmissionStats {
    /// Attempts answered with a stateless Retry.
    pub retries: AtomicU64,
    /// Attempts refused because `max_handshakes` were in flight.
    pub refused: AtomicU64,
    /// Handshakes closed for taking longer than the handshake timeout.
    pub timeouts: AtomicU64,
    /// Connections closed for coming without the client certificate
    /// `require_certificate` asks for.
    pub no_certificate: AtomicU64,
    /// Validated attempts refused: `max_handshakes_per_ip` in flight from
    /// their address.
    pub refused_handshakes_per_ip: AtomicU64,
    /// Connections closed at once: `max_connections_per_ip` open from their
    /// address.
    pub refused_connections_per_ip: AtomicU64,
    handshakes: Arc<AtomicUsize>,
    endpoints: usize,
}

impl AdmissionStats {
    /// Handshakes in flight now.
    pub fn in_flight(&self) -> usize {
        self.handshakes.load(Relaxed)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        format!(
            "# HELP quichub_quic_handshakes Connection handshakes in flight.\n\
             # TYPE quichub_quic_handshakes gauge\n\
             quichub_quic_handshakes {}\n\
             # HELP quichub_quic_retries_total Connection attempts answered with a stateless Retry.\n\
             # TYPE quichub_quic_retries_total counter\n\
             quichub_quic_retries_total {}\n\
             # HELP quichub_quic_refused_total Connection attempts refused (max_handshakes in flight).\n\
             # TYPE quichub_quic_refused_total counter\n\
             quichub_quic_refused_total {}\n\
             # HELP quichub_quic_handshake_timeouts_total Handshakes closed for taking too long.\n\
             # TYPE quichub_quic_handshake_timeouts_total counter\n\
             quichub_quic_handshake_timeouts_total {}\n\
             # HELP quichub_quic_no_certificate_total Connections closed for presenting no client certificate (tls.require_certificate).\n\
             # TYPE quichub_quic_no_certificate_total counter\n\
             quichub_quic_no_certificate_total {}\n\
             # HELP quichub_quic_refused_per_ip_total Connection attempts refused by a cap per client address.\n\
             # TYPE quichub_quic_refused_per_ip_total counter\n\
             quichub_quic_refused_per_ip_total{{limit=\"handshakes\"}} {}\n\
             quichub_quic_refused_per_ip_total{{limit=\"connections\"}} {}\n\
             # HELP quichub_quic_endpoints QUIC endpoints (threads) serving the UDP port.\n\
             # TYPE quichub_quic_endpoints gauge\n\
             quichub_quic_endpoints {}\n",
            self.handshakes.load(Relaxed),
            self.retries.load(Relaxed),
            self.refused.load(Relaxed),
            self.timeouts.load(Relaxed),
            self.no_certificate.load(Relaxed),
            self.refused_handshakes_per_ip.load(Relaxed),
            self.refused_connections_per_ip.load(Relaxed),
            self.endpoints.max(1),
        )
    }
}

/// Accepts connection attempts on one endpoint of a [`Server`], applying
/// the server's admission limits ([`Server::acceptor`]).
#[derive(Clone)]
pub struct Acceptor {
    endpoint: quinn::Endpoint,
    config: QuicConfig,
    handshakes: Arc<AtomicUsize>,
    stats: Arc<AdmissionStats>,
    require_certificate: bool,
    per_ip: PerIp,
}

impl Acceptor {
    /// Waits for the next admitted connection attempt; `None` once the
    /// endpoint is closed. Attempts beyond the limits (counted over all
    /// the server's endpoints) are answered here: a stateless Retry once
    /// `retry_above_handshakes` are in flight (the client returns with a
    /// token proving its address; nothing is kept for one that does not),
    /// CONNECTION_REFUSED at `max_handshakes`.
    pub async fn accept(&self) -> Option<Pending> {
        loop {
            let incoming = self.endpoint.accept().await?;
            // A validated address is a real one: its share of handshakes
            // can be counted without letting spoofers use up a victim's.
            let per_ip = match incoming.remote_address_validated() {
                true => match self
                    .per_ip
                    .handshakes
                    .try_acquire(incoming.remote_address().ip())
                {
                    Ok(g) => Some(g),
                    Err(_) => {
                        self.stats.refused_handshakes_per_ip.fetch_add(1, Relaxed);
                        incoming.refuse();
                        continue;
                    }
                },
                false => None,
            };
            // Reserved by compare-and-swap: endpoints on other threads admit
            // at the same time, and `max_handshakes` holds for all of them.
            let validated = incoming.remote_address_validated();
            let mut in_flight = self.handshakes.load(Relaxed);
            let admission = loop {
                match self.config.admit(in_flight, validated) {
                    Admission::Accept => match self.handshakes.compare_exchange_weak(
                        in_flight,
                        in_flight + 1,
                        Relaxed,
                        Relaxed,
                    ) {
                        Ok(_) => break Admission::Accept,
                        Err(now) => in_flight = now,
                    },
                    other => break other,
                }
            };
            match admission {
                Admission::Accept => {
                    return Some(Pending {
                        incoming,
                        slot: HandshakeSlot(self.handshakes.clone(), per_ip),
                        timeout: self.config.handshake_timeout(),
                        stats: self.stats.clone(),
                        bridge: crate::websocket::session_config(&self.config),
                        require_certificate: self.require_certificate,
                        connections: self.per_ip.connections.clone(),
                    });
                }
                Admission::Retry => match incoming.retry() {
                    Ok(()) => {
                        self.stats.retries.fetch_add(1, Relaxed);
                    }
                    // A client that already answered a Retry and still finds
                    // us busy: refuse.
                    Err(e) => {
                        self.stats.refused.fetch_add(1, Relaxed);
                        e.into_incoming().refuse();
                    }
                },
                Admission::Refuse => {
                    self.stats.refused.fetch_add(1, Relaxed);
                    incoming.refuse();
                }
            }
        }
    }
}

/// One handshake in flight, counted against `max_handshakes` (and, for a
/// validated address, `max_handshakes_per_ip`) until dropped.
#[derive(Debug)]
pub struct HandshakeSlot(
    Arc<AtomicUsize>,
    // Held for its Drop: the address's place among its handshakes.
    #[allow(dead_code)] Option<ConnGuard>,
);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// An admitted connection attempt: the handshake has not started yet. Pass it
/// to [`establish_any`] (or `.await` it for a bare QUIC connection).
pub struct Pending {
    /// The attempt.
    pub incoming: quinn::Incoming,
    /// Its place among the handshakes in flight.
    pub slot: HandshakeSlot,
    /// Longest the handshake may take.
    pub timeout: Duration,
    stats: Arc<AdmissionStats>,
    /// The limits of a draft-14/16 session's bridge to the relay: the
    /// stream counts and windows a QUIC peer gets.
    bridge: qmux::Config,
    require_certificate: bool,
    connections: Arc<ConnLimiter>,
}

impl Pending {
    /// The peer's address.
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming.remote_address()
    }
}

impl IntoFuture for Pending {
    type Output = Result<quinn::Connection, quinn::ConnectionError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    /// Completes the QUIC handshake (no ALPN dispatch), within the timeout.
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Pending {
                incoming,
                slot,
                timeout,
                stats,
                ..
            } = self;
            let connecting = incoming.accept()?;
            let r = tokio::time::timeout(timeout, connecting).await;
            drop(slot);
            r.unwrap_or_else(|_| {
                stats.timeouts.fetch_add(1, Relaxed);
                Err(quinn::ConnectionError::TimedOut)
            })
        })
    }
}

/// A session that finished its handshake (QUIC, and HTTP/3 CONNECT for WebTransport).
pub struct Accepted {
    /// The MoQT-ready session.
    pub session: Session,
    /// Raw QUIC or WebTransport.
    pub transport: Transport,
    /// The CONNECT URL's path and query (`/moq?jwt=...`) for WebTransport (raw
    /// QUIC sends PATH in SETUP).
    pub path: Option<String>,
    /// Peer address.
    pub remote: SocketAddr,
    /// Plain HTTP/3 requests on the same connection (WebTransport only): for
    /// the HTTP API, or dropped.
    pub http: Option<Box<crate::h3::HttpConnection>>,
    /// The draft the peer speaks when it is not 18: `session` is then the
    /// draft-18 side of a translating bridge ([`crate::legacy`]).
    pub draft: Option<moqt::legacy::Draft>,
    /// Set when neither the ALPN nor a WebTransport subprotocol named the
    /// protocol (`moq-00`, which draft 14 and moq-lite-01/02 share, or no
    /// subprotocol at all): `session` is then the peer's, nobody has spoken
    /// yet, and [`crate::sniff::Undetermined::resolve`] learns the protocol
    /// from the peer's first stream.
    pub undetermined: Option<crate::sniff::Undetermined>,
    /// The moq-lite version the peer speaks: `session` is then the draft-18
    /// side of the lite bridge ([`crate::lite`]).
    pub lite: Option<moqt::lite::Version>,
}

impl Server {
    /// Binds `addr` with the given identity; peers acknowledge as QUIC does by
    /// default (see [`Server::bind_with`]).
    pub fn bind(addr: SocketAddr, identity: &Identity) -> anyhow::Result<Self> {
        Self::bind_with(addr, identity, None)
    }

    /// Binds `addr` with the given identity; `ack` is what peers are asked
    /// about acknowledgements (`None`: QUIC's default, every other packet).
    pub fn bind_with(
        addr: SocketAddr,
        identity: &Identity,
        ack: Option<AckFrequency>,
    ) -> anyhow::Result<Self> {
        Self::bind_config(addr, identity, ack, &QuicConfig::default())
    }

    /// Binds `addr` with the given identity, ACK frequency and QUIC limits.
    pub fn bind_config(
        addr: SocketAddr,
        identity: &Identity,
        ack: Option<AckFrequency>,
        quic: &QuicConfig,
    ) -> anyhow::Result<Self> {
        Self::bind_clients(addr, identity, ack, quic, &ClientCertConfig::default())
    }

    /// [`Server::bind_config`], asking clients for a certificate verified
    /// against `clients.cafile` when it is set. The certificate is optional
    /// in the TLS handshake, since one endpoint serves every ALPN; with
    /// `require_certificate`, [`establish_any`] closes a MoQT, WebTransport
    /// or HTTP/3 connection that presented none (UNAUTHORIZED, counted in
    /// `quichub_quic_no_certificate_total`), and the `mqtt` handler refuses
    /// such a CONNECT with Not authorized ([`crate::tls::PeerCert::of_quic`]).
    pub fn bind_clients(
        addr: SocketAddr,
        identity: &Identity,
        ack: Option<AckFrequency>,
        quic: &QuicConfig,
        clients: &ClientCertConfig,
    ) -> anyhow::Result<Self> {
        quic.validate()?;
        let mut tls = crate::tls::with_identity(
            rustls::ServerConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])?,
            identity,
            clients.verifier(false)?,
        )?;
        // moq-lite first, as moq-relay lists it: moq-dev's clients offer
        // lite and the IETF drafts, and get what they prefer
        // (`docs/moq-lite.md`; `--client-version` picks the draft).
        tls.alpn_protocols = moqt::lite::Version::ALPNS
            .iter()
            .map(|a| a.as_bytes().to_vec())
            .collect();
        tls.alpn_protocols.extend([
            moqt::ALPN.as_bytes().to_vec(),
            ALPN_H3.to_vec(),
            ALPN_MQTT.to_vec(),
            moqt::legacy::Draft::D16.alpn().as_bytes().to_vec(),
            moqt::legacy::Draft::D14.alpn().as_bytes().to_vec(),
        ]);
        // Session resumption with 0-RTT (docs/zero-rtt.md). quinn wants 0 or
        // u32::MAX here. Tickets are stateful and single-use: the server keeps
        // each session in this cache and `take`s it on resumption (rustls
        // accepts early data only without a stateless ticketer), so a replayed
        // ClientHello finds no session and its 0-RTT data is rejected.
        tls.max_early_data_size = u32::MAX;
        tls.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
        tls.send_tls13_tickets = 2;
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(Arc::new(crate::server_transport(quic, ack)));
        // quinn's own bound on attempts waiting for `accept` (default 65 536,
        // each buffering up to 10 MB of early packets): an attempt's first
        // flight is a few kB, and no more wait than may be in flight.
        // quinn's bounds are per endpoint: several share them.
        let shards = crate::shard::resolve(quic.endpoints);
        config.max_incoming((quic.max_handshakes / shards).max(1));
        config.incoming_buffer_size(64 << 10);
        config.incoming_buffer_size_total(((16 << 20) / shards as u64).max(64 << 10));
        let (endpoints, threads) = if shards == 1 {
            let socket = bind_udp(addr).with_context(|| format!("bind UDP {addr}"))?;
            let runtime = quinn::default_runtime().context("no async runtime")?;
            let endpoint = quinn::Endpoint::new(
                quinn::EndpointConfig::default(),
                Some(config),
                socket,
                runtime,
            )?;
            (vec![endpoint], Vec::new())
        } else {
            // Every shard shares the server config: one TLS session cache
            // (0-RTT resumes on any shard) and one Retry token key.
            let sockets = crate::shard::bind_group(addr, shards)?;
            let mut endpoints = Vec::with_capacity(shards);
            let mut threads = Vec::with_capacity(shards);
            for (i, socket) in sockets.into_iter().enumerate() {
                let config = config.clone();
                let (thread, endpoint) = crate::shard::spawn(i, move || {
                    let runtime = quinn::default_runtime().context("no async runtime")?;
                    Ok(quinn::Endpoint::new(
                        crate::shard::endpoint_config(i, shards),
                        Some(config),
                        socket,
                        runtime,
                    )?)
                })?;
                endpoints.push(endpoint);
                threads.push(thread);
            }
            (endpoints, threads)
        };
        let handshakes = Arc::new(AtomicUsize::new(0));
        Ok(Self {
            endpoints,
            threads: Arc::new(threads),
            config: quic.clone(),
            stats: Arc::new(AdmissionStats {
                handshakes: handshakes.clone(),
                endpoints: shards,
                ..Default::default()
            }),
            handshakes,
            require_certificate: clients.require_certificate,
            per_ip: PerIp::new(quic),
        })
    }

    /// What the endpoint did with connection attempts.
    pub fn stats(&self) -> Arc<AdmissionStats> {
        self.stats.clone()
    }

    /// The QUIC limits in force.
    pub fn quic_config(&self) -> &QuicConfig {
        &self.config
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoints[0].local_addr()
    }

    /// The first (with one shard, the only) endpoint.
    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoints[0]
    }

    /// How many endpoints serve the port.
    pub fn shards(&self) -> usize {
        self.endpoints.len()
    }

    /// The runtime shard `shard`'s tasks run on: its own thread's, or
    /// `None` for a single endpoint on the runtime that bound it. A
    /// connection accepted on a shard must be served there
    /// ([`Server::accept_on`]).
    pub fn shard_runtime(&self, shard: usize) -> Option<tokio::runtime::Handle> {
        self.threads.get(shard).map(|t| t.handle.clone())
    }

    /// Waits for the next admitted connection attempt on any endpoint (see
    /// [`Server::accept_on`]); `None` once they are all closed. With several
    /// endpoints, a connection accepted here is served on the caller's
    /// runtime rather than its endpoint's thread: correct, but without the
    /// point of several endpoints (the relay uses [`Server::accept_on`] on
    /// each shard's runtime).
    pub async fn accept(&self) -> Option<Pending> {
        if self.endpoints.len() == 1 {
            return self.accept_on(0).await;
        }
        let mut open: Vec<Acceptor> = (0..self.endpoints.len())
            .filter_map(|i| self.acceptor(i))
            .collect();
        while !open.is_empty() {
            let (got, i, _) =
                futures::future::select_all(open.iter().map(|a| Box::pin(a.accept()))).await;
            match got {
                Some(p) => return Some(p),
                None => {
                    open.remove(i);
                }
            }
        }
        None
    }

    /// Waits for the next admitted connection attempt on endpoint `shard`
    /// (see [`Acceptor::accept`]); `None` once it is closed. Call it on the
    /// shard's runtime ([`Server::shard_runtime`]).
    pub async fn accept_on(&self, shard: usize) -> Option<Pending> {
        self.acceptor(shard)?.accept().await
    }

    /// What accepts connections on endpoint `shard`, without holding the
    /// server: an accept loop that owns it ends when the server is dropped
    /// (its shard's thread stops), instead of keeping it alive.
    pub fn acceptor(&self, shard: usize) -> Option<Acceptor> {
        Some(Acceptor {
            endpoint: self.endpoints.get(shard)?.clone(),
            config: self.config.clone(),
            handshakes: self.handshakes.clone(),
            stats: self.stats.clone(),
            require_certificate: self.require_certificate,
            per_ip: self.per_ip.clone(),
        })
    }

    /// Stops accepting and closes every connection with `code`.
    pub fn close(&self, code: u32, reason: &[u8]) {
        for e in &self.endpoints {
            e.close(code.into(), reason);
        }
    }

    /// Waits until every endpoint's connections are gone (after [`Server::close`]).
    pub async fn wait_idle(&self) {
        for e in &self.endpoints {
            e.wait_idle().await;
        }
    }
}

/// Socket buffer size asked for (the kernel caps it at `net.core.rmem_max` /
/// `wmem_max`). A relay with many subscribers receives bursts of ACKs at every
/// fan-out; with the default ~200 kB buffer such a burst can overflow it and
/// take a publisher's datagram with it.
const SOCKET_BUFFER: usize = 8 << 20;

pub(crate) fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    bind_udp_with(addr, false)
}

/// [`bind_udp`], joining `addr`'s `SO_REUSEPORT` group when `reuse_port`.
pub(crate) fn bind_udp_with(
    addr: SocketAddr,
    reuse_port: bool,
) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    // Best effort: a smaller buffer still works, it only drops sooner.
    socket.set_recv_buffer_size(SOCKET_BUFFER).ok();
    socket.set_send_buffer_size(SOCKET_BUFFER).ok();
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Whether the TLS handshake of `conn` has completed: the client's Finished
/// was verified, so the client holds the keys and nothing it sent can be an
/// attacker's replay of 0-RTT data. Always true for connections that
/// [`establish_any`] hands over after the handshake (all but `mqtt` and
/// plain HTTP/3 on `h3`).
///
/// (rustls exports keying material only once the handshake is complete.)
pub fn handshake_complete(conn: &quinn::Connection) -> bool {
    conn.export_keying_material(&mut [0u8; 1], b"EXPORTER-quichub-handshake", b"")
        .is_ok()
}

/// What a finished handshake yields: a MoQT session, or a QUIC connection of
/// another protocol (`mqtt`) for its own handler.
pub enum Established {
    /// Raw QUIC `moqt-18` or WebTransport (boxed: a session is large).
    Moqt(Box<Accepted>),
    /// Plain HTTP/3 requests on ALPN `h3` (the connection's first request was
    /// not a WebTransport CONNECT), possibly before the handshake completed.
    Http3 {
        /// The HTTP/3 connection, first request pending.
        conn: Box<crate::h3::HttpConnection>,
        /// Peer address.
        remote: SocketAddr,
    },
    /// Any other ALPN the endpoint offers, with the bare connection.
    Other {
        /// The negotiated ALPN (for example [`ALPN_MQTT`]).
        alpn: Vec<u8>,
        /// The connection: handshake done, except for `mqtt`, which is handed
        /// over before it completes (0-RTT; see [`handshake_complete`]).
        conn: quinn::Connection,
        /// Peer address.
        remote: SocketAddr,
    },
}

/// Completes the handshake of one incoming MoQT connection (an `mqtt` one is
/// an error here: use [`establish_any`]). Run it in its own task so a slow
/// peer never delays others.
pub async fn establish(incoming: Pending) -> anyhow::Result<Accepted> {
    match establish_any(incoming).await? {
        Established::Moqt(a) => Ok(*a),
        Established::Other { alpn, conn, .. } => {
            conn.close(0u32.into(), b"unexpected ALPN");
            anyhow::bail!("unexpected ALPN {:?}", String::from_utf8_lossy(&alpn))
        }
        Established::Http3 { conn, .. } => {
            conn.conn().close(
                crate::h3::codec::code::REQUEST_REJECTED.into(),
                b"no HTTP API here",
            );
            anyhow::bail!("plain HTTP/3 request where only MoQT is served")
        }
    }
}

/// Completes the handshake of one incoming connection: MoQT ones up to the
/// session (WebTransport CONNECT included), others (`mqtt`) up to the QUIC
/// handshake. Run it in its own task so a slow peer never delays others.
///
/// `mqtt` and `h3` connections are handed over as soon as the server has
/// read the ClientHello, *before* the handshake completes (quinn's
/// server-side `into_0rtt`), so 0-RTT data of a resumed session is served at
/// once; the MQTT handler and the HTTP/3 API hold back what a replay must not
/// repeat until [`handshake_complete`] (see `docs/zero-rtt.md`). MoQT
/// sessions (raw QUIC, and WebTransport CONNECTs on `h3`) still wait for the
/// handshake.
pub async fn establish_any(pending: Pending) -> anyhow::Result<Established> {
    let Pending {
        incoming,
        slot,
        timeout,
        stats,
        bridge,
        require_certificate,
        connections,
    } = pending;
    // Counted from admission until the connection closes.
    let remote_ip = incoming.remote_address().ip();
    let count = |conn: &quinn::Connection, stats: &AdmissionStats| match connections
        .try_acquire(remote_ip)
    {
        Ok(guard) => {
            let conn = conn.clone();
            tokio::spawn(async move {
                conn.closed().await;
                drop(guard);
            });
            Ok(())
        }
        Err(_) => {
            stats.refused_connections_per_ip.fetch_add(1, Relaxed);
            // As the relay refuses a session over `max_sessions`.
            conn.close(
                moqt::SessionErrorCode::InternalError.code().into(),
                b"too many connections from this address",
            );
            Err(anyhow::anyhow!(
                "{remote_ip}: max_connections_per_ip open from this address"
            ))
        }
    };
    let remote = incoming.remote_address();
    let deadline = tokio::time::Instant::now() + timeout;
    let timed_out = |stats: &AdmissionStats| {
        stats.timeouts.fetch_add(1, Relaxed);
        anyhow::anyhow!(
            "{remote}: handshake not done within {} ms",
            timeout.as_millis()
        )
    };
    let mut connecting = incoming.accept().context("QUIC accept")?;
    // Known from the ClientHello, before the handshake completes.
    let alpn = match tokio::time::timeout_at(deadline, connecting.handshake_data()).await {
        Ok(h) => h
            .ok()
            .and_then(|h| h.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|h| h.protocol)
            .unwrap_or_default(),
        Err(_) => return Err(timed_out(&stats)),
    };
    // An HTTP/3 connection that must show a certificate is not served
    // before its handshake completes: 0-RTT requests come before the
    // client's certificate does.
    if alpn == ALPN_MQTT || (alpn == ALPN_H3 && !require_certificate) {
        match connecting.into_0rtt() {
            // On the server this always succeeds; the connection serves 0-RTT
            // data (and sends 0.5-RTT data) until the handshake completes.
            // The handshake slot and its deadline go with the connection.
            Ok((conn, done)) if alpn == ALPN_H3 => {
                count(&conn, &stats)?;
                let handshake = crate::h3::Handshake::from_0rtt(&conn, done);
                let watch = handshake.clone();
                spawn_handshake_watch(conn.clone(), slot, deadline, stats, async move {
                    watch.wait().await;
                });
                return h3_established(conn, handshake, remote, bridge).await;
            }
            Ok((conn, done)) => {
                count(&conn, &stats)?;
                spawn_handshake_watch(conn.clone(), slot, deadline, stats, async move {
                    let _ = done.await;
                });
                return Ok(Established::Other { alpn, conn, remote });
            }
            Err(c) => connecting = c,
        }
    }
    let conn = match tokio::time::timeout_at(deadline, connecting).await {
        Ok(c) => c.context("QUIC handshake")?,
        Err(_) => return Err(timed_out(&stats)),
    };
    drop(slot);
    count(&conn, &stats)?;
    if require_certificate && alpn != ALPN_MQTT && conn.peer_identity().is_none() {
        stats.no_certificate.fetch_add(1, Relaxed);
        let code = match alpn.as_slice() {
            ALPN_H3 => crate::h3::codec::code::REQUEST_REJECTED,
            _ => moqt::SessionErrorCode::Unauthorized.code(),
        };
        conn.close(code.into(), b"client certificate required");
        anyhow::bail!("{remote}: no client certificate (tls.require_certificate)");
    }
    if alpn == moqt::ALPN.as_bytes() {
        return Ok(Established::Moqt(Box::new(Accepted {
            session: web_transport_quinn::Session::raw(conn).into(),
            transport: Transport::Quic,
            path: None,
            remote,
            http: None,
            draft: None,
            undetermined: None,
            lite: None,
        })));
    }
    // Draft 14's ALPN, which moq-lite-01/02 share: CLIENT_SETUP decides.
    if alpn == moqt::legacy::Draft::D14.alpn().as_bytes() {
        return Ok(Established::Moqt(Box::new(Accepted {
            session: web_transport_quinn::Session::raw(conn).into(),
            transport: Transport::Quic,
            path: None,
            remote,
            http: None,
            draft: None,
            undetermined: Some(crate::sniff::Undetermined::moq_00(bridge)),
            lite: None,
        })));
    }
    match moqt::lite::Version::from_alpn(&alpn) {
        Some(moqt::lite::Negotiated::Version(version)) => {
            let peer = web_transport_quinn::Session::raw(conn).into();
            let start = crate::lite::Start {
                version,
                transport: Transport::Quic,
                url_path: None,
                session_stream: None,
            };
            return Ok(Established::Moqt(Box::new(Accepted {
                session: crate::lite::accept(peer, start, bridge).await?,
                transport: Transport::Quic,
                path: None,
                remote,
                http: None,
                draft: None,
                undetermined: None,
                lite: Some(version),
            })));
        }
        // `moql`: lite-01/02 (or draft 14), chosen in CLIENT_SETUP.
        Some(moqt::lite::Negotiated::Legacy) => {
            return Ok(Established::Moqt(Box::new(Accepted {
                session: web_transport_quinn::Session::raw(conn).into(),
                transport: Transport::Quic,
                path: None,
                remote,
                http: None,
                draft: None,
                undetermined: Some(crate::sniff::Undetermined::moq_00(bridge)),
                lite: None,
            })));
        }
        None => {}
    }
    if let Some(draft) = moqt::legacy::Draft::from_alpn(&alpn) {
        let peer = web_transport_quinn::Session::raw(conn).into();
        return Ok(Established::Moqt(Box::new(Accepted {
            session: crate::legacy::accept(peer, draft, bridge).await?,
            transport: Transport::Quic,
            path: None,
            remote,
            http: None,
            draft: Some(draft),
            undetermined: None,
            lite: None,
        })));
    }
    if alpn == ALPN_MQTT {
        return Ok(Established::Other { alpn, conn, remote });
    }
    anyhow::ensure!(
        alpn == ALPN_H3,
        "unexpected ALPN {:?}",
        String::from_utf8_lossy(&alpn)
    );
    h3_established(conn, crate::h3::Handshake::completed(), remote, bridge).await
}

/// Holds `slot` until `done` (the handshake of a connection handed over before
/// it completed) resolves, and closes the connection if that takes past
/// `deadline`.
fn spawn_handshake_watch(
    conn: quinn::Connection,
    slot: HandshakeSlot,
    deadline: tokio::time::Instant,
    stats: Arc<AdmissionStats>,
    done: impl Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(async move {
        let _slot = slot;
        if tokio::time::timeout_at(deadline, done).await.is_err() {
            stats.timeouts.fetch_add(1, Relaxed);
            conn.close(0u32.into(), b"handshake timeout");
        }
    });
}

/// The HTTP/3 handshake and first request of an `h3` connection: a
/// WebTransport session (MoQT) or plain HTTP/3 requests.
async fn h3_established(
    conn: quinn::Connection,
    handshake: crate::h3::Handshake,
    remote: SocketAddr,
    bridge: qmux::Config,
) -> anyhow::Result<Established> {
    let (request, http, forward) =
        match crate::h3::accept(conn, handshake).await.context("HTTP/3")? {
            crate::h3::Incoming::WebTransport {
                request,
                http,
                forward,
            } => (request, http, forward),
            crate::h3::Incoming::Http(http) => {
                return Ok(Established::Http3 {
                    conn: Box::new(http),
                    remote,
                })
            }
        };
    // Path and query: the query may carry credentials (`?jwt=`).
    let path = match request.url.query() {
        Some(q) => format!("{}?{q}", request.url.path()),
        None => request.url.path().to_string(),
    };
    let offered = request.protocols.clone();
    // A client that offers subprotocols gets the first of them served here,
    // in its own order (as moq-relay chooses: moq-dev's clients list
    // moq-lite first); one that offers none is a draft-18 client (an older
    // browser) or one that negotiates in CLIENT_SETUP (draft 14,
    // moq-lite-01/02), and its first stream says which.
    let Some(chosen) = choose_subprotocol(&offered) else {
        request.reject(http::StatusCode::BAD_REQUEST).await.ok();
        anyhow::bail!("WebTransport client offered {offered:?}, none served here");
    };
    let response = match chosen.protocol() {
        None => ConnectResponse::OK,
        Some(p) => ConnectResponse::OK.with_protocol(p),
    };
    let session = request
        .respond(response)
        .await
        .context("WebTransport respond")?;
    // Plain HTTP/3 requests on this connection reach `http`.
    session.forward_other_bi(forward);
    let (mut draft, mut undetermined, mut lite) = (None, None, None);
    let session = match chosen {
        Subprotocol::None => {
            undetermined = Some(crate::sniff::Undetermined::no_subprotocol(bridge));
            session.into()
        }
        // `moq-00` (draft 14's) and `moql` (moq-lite-01/02's): CLIENT_SETUP decides.
        Subprotocol::Moq00 | Subprotocol::Moql => {
            undetermined = Some(crate::sniff::Undetermined::moq_00(bridge));
            session.into()
        }
        Subprotocol::Draft18 => session.into(),
        Subprotocol::Legacy(d) => {
            draft = Some(d);
            crate::legacy::accept(session.into(), d, bridge).await?
        }
        Subprotocol::Lite(version) => {
            lite = Some(version);
            let start = crate::lite::Start {
                version,
                transport: Transport::WebTransport,
                url_path: Some(path.clone()),
                session_stream: None,
            };
            crate::lite::accept(session.into(), start, bridge).await?
        }
    };
    Ok(Established::Moqt(Box::new(Accepted {
        session,
        transport: Transport::WebTransport,
        path: Some(path),
        remote,
        draft,
        http: Some(http),
        undetermined,
        lite,
    })))
}

/// What a WebTransport client's subprotocols choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subprotocol {
    /// None offered: the first stream tells.
    None,
    /// `moqt-18`.
    Draft18,
    /// `moqt-16`, through the legacy bridge.
    Legacy(moqt::legacy::Draft),
    /// `moq-00`: draft 14 or moq-lite-01/02 by CLIENT_SETUP.
    Moq00,
    /// `moql`: moq-lite-01/02 (or draft 14) by CLIENT_SETUP.
    Moql,
    /// `moq-lite-0N`, through the lite bridge.
    Lite(moqt::lite::Version),
}

impl Subprotocol {
    /// The subprotocol to answer with.
    fn protocol(self) -> Option<&'static str> {
        match self {
            Subprotocol::None => None,
            Subprotocol::Draft18 => Some(moqt::ALPN),
            Subprotocol::Legacy(d) => Some(d.alpn()),
            Subprotocol::Moq00 => Some(moqt::legacy::Draft::D14.alpn()),
            Subprotocol::Moql => Some(moqt::lite::ALPN_LEGACY),
            Subprotocol::Lite(v) => Some(v.alpn()),
        }
    }
}

/// The first of a WebTransport client's subprotocols served here, in the
/// client's order; `None` when it offered some and none is served.
fn choose_subprotocol(offered: &[String]) -> Option<Subprotocol> {
    use moqt::legacy::Draft;
    if offered.is_empty() {
        return Some(Subprotocol::None);
    }
    offered.iter().find_map(|p| {
        let p = p.as_bytes();
        if p == moqt::ALPN.as_bytes() {
            return Some(Subprotocol::Draft18);
        }
        match moqt::lite::Version::from_alpn(p) {
            Some(moqt::lite::Negotiated::Version(v)) => return Some(Subprotocol::Lite(v)),
            Some(moqt::lite::Negotiated::Legacy) => return Some(Subprotocol::Moql),
            None => {}
        }
        match Draft::from_alpn(p) {
            Some(Draft::D14) => Some(Subprotocol::Moq00),
            Some(d) => Some(Subprotocol::Legacy(d)),
            None => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{choose_subprotocol, Subprotocol};
    use moqt::legacy::Draft;
    use moqt::lite::Version;

    fn offered(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_clients_first_served_subprotocol_wins() {
        // @moq/watch 0.4.6 (@moq/net 0.2.8).
        let watch = offered(&[
            "moq-lite-05",
            "moq-lite-04",
            "moq-lite-03",
            "moql",
            "moqt-19",
            "moqt-18",
        ]);
        assert_eq!(
            choose_subprotocol(&watch),
            Some(Subprotocol::Lite(Version::Lite05))
        );
        // A client that prefers the IETF draft gets it.
        let ietf = offered(&["moqt-18", "moq-lite-06"]);
        assert_eq!(choose_subprotocol(&ietf), Some(Subprotocol::Draft18));
        assert_eq!(
            choose_subprotocol(&offered(&["moqt-19", "moqt-16"])),
            Some(Subprotocol::Legacy(Draft::D16))
        );
        assert_eq!(
            choose_subprotocol(&offered(&["moq-00"])),
            Some(Subprotocol::Moq00)
        );
        assert_eq!(
            choose_subprotocol(&offered(&["moql"])),
            Some(Subprotocol::Moql)
        );
        assert_eq!(choose_subprotocol(&[]), Some(Subprotocol::None));
        // moq-net's unreleased lite-07 and @moq/net's lite-06 draft are not served.
        let unserved = offered(&["moq-lite-07-wip", "moq-lite-06-wip"]);
        assert_eq!(choose_subprotocol(&unserved), None);
        assert_eq!(
            Subprotocol::Lite(Version::Lite04).protocol(),
            Some("moq-lite-04")
        );
    }
}
