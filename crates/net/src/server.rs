//! The server endpoint: one UDP socket, ALPN `moqt-18` (raw QUIC), `h3`
//! (WebTransport) and `mqtt` (MQTT over QUIC, served by the gateway) side by
//! side.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use web_transport_quinn::proto::ConnectResponse;
use web_transport_quinn::Session;

use crate::tls::{provider, Identity};
use crate::{AckFrequency, Transport};

/// ALPN of HTTP/3: WebTransport sessions and the plain HTTP/3 API.
pub const ALPN_H3: &[u8] = b"h3";

/// ALPN of MQTT over QUIC (EMQX's and the MQTT-over-QUIC drafts' choice).
pub const ALPN_MQTT: &[u8] = b"mqtt";

/// Resumable TLS sessions the server remembers (each is used at most once;
/// the oldest go first).
const SESSION_CACHE: usize = 4096;

/// A bound server endpoint.
pub struct Server {
    endpoint: quinn::Endpoint,
}

/// A session that finished its handshake (QUIC, and HTTP/3 CONNECT for WebTransport).
pub struct Accepted {
    /// The MoQT-ready session.
    pub session: Session,
    /// Raw QUIC or WebTransport.
    pub transport: Transport,
    /// The CONNECT URL's path for WebTransport (raw QUIC sends PATH in SETUP).
    pub path: Option<String>,
    /// Peer address.
    pub remote: SocketAddr,
    /// Plain HTTP/3 requests on the same connection (WebTransport only): for
    /// the HTTP API, or dropped.
    pub http: Option<Box<crate::h3::HttpConnection>>,
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
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(identity.chain.clone(), identity.key.clone_key())
            .context("certificate and key do not match")?;
        tls.alpn_protocols = vec![
            moqt::ALPN.as_bytes().to_vec(),
            ALPN_H3.to_vec(),
            ALPN_MQTT.to_vec(),
        ];
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
        config.transport_config(Arc::new(crate::transport_config_with(ack)));
        let socket = bind_udp(addr).with_context(|| format!("bind UDP {addr}"))?;
        let runtime = quinn::default_runtime().context("no async runtime")?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(config),
            socket,
            runtime,
        )?;
        Ok(Self { endpoint })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// The underlying endpoint.
    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    /// Waits for the next connection attempt; `None` once the endpoint is closed.
    pub async fn accept(&self) -> Option<quinn::Incoming> {
        self.endpoint.accept().await
    }

    /// Stops accepting and closes every connection with `code`.
    pub fn close(&self, code: u32, reason: &[u8]) {
        self.endpoint.close(code.into(), reason);
    }
}

/// Socket buffer size asked for (the kernel caps it at `net.core.rmem_max` /
/// `wmem_max`). A relay with many subscribers receives bursts of ACKs at every
/// fan-out; with the default ~200 kB buffer such a burst can overflow it and
/// take a publisher's datagram with it.
const SOCKET_BUFFER: usize = 8 << 20;

pub(crate) fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
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
pub async fn establish(incoming: quinn::Incoming) -> anyhow::Result<Accepted> {
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
pub async fn establish_any(incoming: quinn::Incoming) -> anyhow::Result<Established> {
    let remote = incoming.remote_address();
    let mut connecting = incoming.accept().context("QUIC accept")?;
    // Known from the ClientHello, before the handshake completes.
    let alpn = connecting
        .handshake_data()
        .await
        .ok()
        .and_then(|h| h.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|h| h.protocol)
        .unwrap_or_default();
    if alpn == ALPN_MQTT || alpn == ALPN_H3 {
        match connecting.into_0rtt() {
            // On the server this always succeeds; the connection serves 0-RTT
            // data (and sends 0.5-RTT data) until the handshake completes.
            Ok((conn, done)) if alpn == ALPN_H3 => {
                let handshake = crate::h3::Handshake::from_0rtt(&conn, done);
                return h3_established(conn, handshake, remote).await;
            }
            Ok((conn, _done)) => return Ok(Established::Other { alpn, conn, remote }),
            Err(c) => connecting = c,
        }
    }
    let conn = connecting.await.context("QUIC handshake")?;
    if alpn == moqt::ALPN.as_bytes() {
        return Ok(Established::Moqt(Box::new(Accepted {
            session: Session::raw(conn),
            transport: Transport::Quic,
            path: None,
            remote,
            http: None,
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
    h3_established(conn, crate::h3::Handshake::completed(), remote).await
}

/// The HTTP/3 handshake and first request of an `h3` connection: a
/// WebTransport session (MoQT) or plain HTTP/3 requests.
async fn h3_established(
    conn: quinn::Connection,
    handshake: crate::h3::Handshake,
    remote: SocketAddr,
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
    let path = request.url.path().to_string();
    let offered = request.protocols.clone();
    // A client that offers subprotocols must offer ours; one that offers none
    // (older browsers) gets moqt-18 by the URL's say-so.
    if !offered.is_empty() && !offered.iter().any(|p| p == moqt::ALPN) {
        request.reject(http::StatusCode::BAD_REQUEST).await.ok();
        anyhow::bail!(
            "WebTransport client offered {offered:?}, not {}",
            moqt::ALPN
        );
    }
    let response = if offered.is_empty() {
        ConnectResponse::OK
    } else {
        ConnectResponse::OK.with_protocol(moqt::ALPN)
    };
    let session = request
        .respond(response)
        .await
        .context("WebTransport respond")?;
    // Plain HTTP/3 requests on this connection reach `http`.
    session.forward_other_bi(forward);
    Ok(Established::Moqt(Box::new(Accepted {
        session,
        transport: Transport::WebTransport,
        path: Some(path),
        remote,
        http: Some(http),
    })))
}
