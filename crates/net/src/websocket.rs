//! MoQT over WebSocket: QMux (draft-ietf-quic-qmux) framing over one
//! WebSocket, as moq-dev's relay, its `moq` CLI and its browser library
//! (`@moq/qmux`) speak it, for browsers without WebTransport (Safari) and
//! networks that block UDP.
//!
//! The WebSocket subprotocol names both layers: `qmux-01.moqt-18` is QMux
//! draft-01 framing carrying MoQT draft-18 (moq-dev pins draft-18 to
//! qmux-01); QMux drafts 02 and 00 are accepted too, and moq-lite
//! (`qmux-02.moq-lite-05`, ...) beside draft 18. A bare `qmux-0N` names no
//! application protocol: the first stream tells, as for WebTransport without
//! a subprotocol. A handshake that offers none of these is refused (a client
//! that upgraded with no common subprotocol would speak another framing). The URL's path and query play the role of
//! the WebTransport CONNECT's: the session's path, its token.
//!
//! The HTTP upgrade itself is the host's (hyper, on the HTTP port): this
//! module picks the subprotocol ([`select_subprotocol`]) and wraps the
//! upgraded byte stream ([`accept_upgraded`]); [`connect`] is the client.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use anyhow::Context;
use qmux::ws::tokio_tungstenite::{self, tungstenite};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::mux::Session;
use crate::QuicConfig;

/// The subprotocols a server accepts, preferred first.
pub const SUBPROTOCOLS: &[&str] = &["qmux-01.moqt-18", "qmux-02.moqt-18"];

/// Pings on an idle WebSocket this often; a peer silent for
/// [`KEEP_ALIVE_TIMEOUT`] is gone (WebSocket has no idle timeout of its
/// own: a crashed peer's TCP connection lingers for hours otherwise).
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// See [`KEEP_ALIVE_INTERVAL`].
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(15);

/// Largest WebSocket message accepted: one QMux record is one message, and
/// we take records of at most 16 382 bytes (qmux's default, what we
/// advertise); the margin is for the frame header.
const MAX_MESSAGE: usize = 20 << 10;

/// How long our writes to the socket may be stuck (the peer reads nothing)
/// before we stop reading what it sends: QMux answers some frames (pings)
/// with frames of its own, which would pile up in memory while nothing
/// leaves. Reading again as soon as a write gets through.
const READ_PAUSE_AFTER: Duration = Duration::from_millis(500);

/// How long our writes may be stuck before the session is closed.
pub const WRITE_STALL_LIMIT: Duration = KEEP_ALIVE_TIMEOUT;

/// How long a client's TCP connect, TLS and WebSocket handshakes may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a WebSocket session speaks, by its subprotocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsProtocol {
    /// `qmux-0N.moqt-18`.
    Draft18,
    /// `qmux-0N.moq-lite-0M`: through the lite bridge ([`crate::lite`]).
    Lite(moqt::lite::Version),
    /// `qmux-0N.moql`: moq-lite-01/02 (or draft 14), chosen in CLIENT_SETUP.
    Moql,
    /// A bare `qmux-0N` (no application protocol, as `@moq/publish` 0.2.17
    /// offers): the first stream tells, as for WebTransport without one.
    Unnamed,
}

/// Every subprotocol the server accepts: QMux drafts 02, 01 and 00, each
/// with moq-lite 06…03, `moql` and `moqt-18`, then the bare QMux versions.
fn server_subprotocols() -> &'static [(&'static str, WsProtocol)] {
    static ALL: std::sync::OnceLock<Vec<(&'static str, WsProtocol)>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let mut apps: Vec<(&str, WsProtocol)> = moqt::lite::Version::ALL
            .iter()
            .filter(|v| **v >= moqt::lite::Version::Lite03)
            .map(|v| (v.alpn(), WsProtocol::Lite(*v)))
            .collect();
        apps.push((moqt::lite::ALPN_LEGACY, WsProtocol::Moql));
        apps.push((moqt::ALPN, WsProtocol::Draft18));
        let mut all = Vec::new();
        for q in ["qmux-02", "qmux-01", "qmux-00"] {
            for (app, p) in &apps {
                let name: &'static str = Box::leak(format!("{q}.{app}").into_boxed_str());
                all.push((name, *p));
            }
        }
        for q in ["qmux-02", "qmux-01", "qmux-00"] {
            all.push((q, WsProtocol::Unnamed));
        }
        all
    })
}

/// The subprotocol to accept from a `Sec-WebSocket-Protocol` request header
/// (comma-separated, possibly repeated): the first the client offers that
/// is served here (moq-dev's clients list what they prefer first, and
/// moq-relay takes it), with what it speaks; `None` when none is.
pub fn select_subprotocol<'a>(
    offered: impl IntoIterator<Item = &'a str>,
) -> Option<(&'static str, WsProtocol)> {
    let served = server_subprotocols();
    offered
        .into_iter()
        .flat_map(|h| h.split(','))
        .map(str::trim)
        .find_map(|o| served.iter().find(|(s, _)| *s == o).copied())
}

/// The QMux limits for a session, from the relay's QUIC limits: the same
/// stream counts and flow-control windows a QUIC peer gets.
pub fn session_config(quic: &QuicConfig) -> qmux::Config {
    let mut c = qmux::Config::default();
    c.max_streams_bidi = quic.max_concurrent_bidi_streams.into();
    c.max_streams_uni = quic.max_concurrent_uni_streams.into();
    c.max_data = quic.receive_window;
    c.max_stream_data_bidi_local = quic.stream_receive_window.into();
    c.max_stream_data_bidi_remote = quic.stream_receive_window.into();
    c.max_stream_data_uni = quic.stream_receive_window.into();
    c.max_idle_timeout = quic.idle_timeout_ms;
    c
}

fn ws_config() -> tungstenite::protocol::WebSocketConfig {
    tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

/// Wraps the byte stream of an accepted upgrade (the 101 response sent with
/// `subprotocol`) as a server-side session. A peer that stops reading is
/// no longer read from after [`READ_PAUSE_AFTER`] and is closed after
/// [`WRITE_STALL_LIMIT`].
pub async fn accept_upgraded<T>(io: T, subprotocol: &str, config: qmux::Config) -> Session
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stall = Arc::new(Stall::default());
    let io = Guarded {
        io,
        stall: stall.clone(),
    };
    let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        io,
        tungstenite::protocol::Role::Server,
        Some(ws_config()),
    )
    .await;
    let session = qmux::ws::Upgraded::new(ws)
        .with_alpn(subprotocol)
        .with_keep_alive(qmux::ws::KeepAlive::new(
            KEEP_ALIVE_INTERVAL,
            KEEP_ALIVE_TIMEOUT,
        ))
        .with_session_config(config)
        .accept();
    tokio::spawn(watch_stall(stall, session.clone()));
    session.into()
}

/// Closes `session` once its writes have been stuck for
/// [`WRITE_STALL_LIMIT`]; ends with the session.
async fn watch_stall(stall: Arc<Stall>, session: qmux::Session) {
    use web_transport_trait::Session as _;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = session.closed() => return,
            _ = tick.tick() => {}
        }
        if stall.stuck_for() >= WRITE_STALL_LIMIT {
            tracing::debug!("WebSocket peer reads nothing: closing its session");
            session.close(0, "peer stopped reading");
            stall.wake_reader();
            return;
        }
    }
}

/// Since when our writes have been stuck (milliseconds since `start`, plus
/// one; 0: not stuck), and the reader paused meanwhile.
struct Stall {
    start: tokio::time::Instant,
    since: AtomicU64,
    reader: Mutex<Option<Waker>>,
}

impl Default for Stall {
    fn default() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            since: AtomicU64::new(0),
            reader: Mutex::new(None),
        }
    }
}

impl Stall {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    fn stuck_for(&self) -> Duration {
        match self.since.load(Ordering::Acquire) {
            0 => Duration::ZERO,
            t => Duration::from_millis(self.now_ms().saturating_sub(t)),
        }
    }

    fn pending(&self) {
        let _ = self
            .since
            .compare_exchange(0, self.now_ms(), Ordering::AcqRel, Ordering::Acquire);
    }

    fn progressed(&self) {
        if self.since.swap(0, Ordering::AcqRel) != 0 {
            self.wake_reader();
        }
    }

    fn wake_reader(&self) {
        if let Some(w) = self.reader.lock().expect("stall waker").take() {
            w.wake();
        }
    }
}

/// The socket under a server-side WebSocket, telling [`Stall`] how its
/// writes go, and holding reads while they are stuck.
struct Guarded<T> {
    io: T,
    stall: Arc<Stall>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.stall.stuck_for() >= READ_PAUSE_AFTER {
            *this.stall.reader.lock().expect("stall waker") = Some(cx.waker().clone());
            // Checked again: a write may have got through meanwhile.
            if this.stall.stuck_for() >= READ_PAUSE_AFTER {
                return Poll::Pending;
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        match r {
            Poll::Pending => this.stall.pending(),
            Poll::Ready(_) => this.stall.progressed(),
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        match r {
            Poll::Pending => this.stall.pending(),
            Poll::Ready(_) => this.stall.progressed(),
        }
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Connects to a `ws://` or `wss://` URL (TLS checked by `tls`), offering
/// [`SUBPROTOCOLS`]; `remote` is the address to dial.
pub async fn connect(
    url: &url::Url,
    remote: std::net::SocketAddr,
    server_name: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> anyhow::Result<Session> {
    tokio::time::timeout(CONNECT_TIMEOUT, dial(url, remote, server_name, tls))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "no WebSocket session with {url} within {} s",
                CONNECT_TIMEOUT.as_secs()
            )
        })?
}

async fn dial(
    url: &url::Url,
    remote: std::net::SocketAddr,
    server_name: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> anyhow::Result<Session> {
    use tungstenite::client::IntoClientRequest;
    let tcp = tokio::net::TcpStream::connect(remote)
        .await
        .with_context(|| format!("TCP connect to {remote} ({url})"))?;
    let _ = tcp.set_nodelay(true);
    let mut request = url.as_str().into_client_request()?;
    request.headers_mut().insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_str(&SUBPROTOCOLS.join(", "))?,
    );
    let (ws, response) = match tls {
        Some(tls) => {
            let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
                .context("TLS server name")?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .with_context(|| format!("TLS handshake with {remote}"))?;
            let (ws, r) =
                tokio_tungstenite::client_async_with_config(request, stream, Some(ws_config()))
                    .await
                    .context("WebSocket handshake")?;
            (Either::Tls(ws), r)
        }
        None => {
            let (ws, r) =
                tokio_tungstenite::client_async_with_config(request, tcp, Some(ws_config()))
                    .await
                    .context("WebSocket handshake")?;
            (Either::Plain(ws), r)
        }
    };
    let chosen = response
        .headers()
        .get(http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .filter(|p| SUBPROTOCOLS.contains(p))
        .map(str::to_string)
        .context("the server chose no MoQT subprotocol (qmux-01.moqt-18)")?;
    let keep_alive = qmux::ws::KeepAlive::new(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT);
    Ok(match ws {
        Either::Tls(ws) => qmux::ws::Upgraded::new(ws)
            .with_alpn(&chosen)
            .with_keep_alive(keep_alive)
            .connect(),
        Either::Plain(ws) => qmux::ws::Upgraded::new(ws)
            .with_alpn(&chosen)
            .with_keep_alive(keep_alive)
            .connect(),
    }
    .into())
}

enum Either<A, B> {
    Tls(A),
    Plain(B),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_offered_that_is_served() {
        assert_eq!(
            select_subprotocol(["qmux-02.moqt-18, qmux-01.moqt-18"]),
            Some(("qmux-02.moqt-18", WsProtocol::Draft18))
        );
        assert_eq!(
            select_subprotocol(["webtransport.moqt-18", "qmux-01.moqt-18"]),
            Some(("qmux-01.moqt-18", WsProtocol::Draft18))
        );
        // @moq/watch 0.4.6: lite-05 first.
        assert_eq!(
            select_subprotocol(["qmux-02.moq-lite-05, qmux-01.moq-lite-05, qmux-01.moqt-18"]),
            Some((
                "qmux-02.moq-lite-05",
                WsProtocol::Lite(moqt::lite::Version::Lite05)
            ))
        );
        // @moq/publish 0.2.17: no application protocol.
        assert_eq!(
            select_subprotocol(["qmux-01, qmux-00, webtransport"]),
            Some(("qmux-01", WsProtocol::Unnamed))
        );
        assert_eq!(
            select_subprotocol(["qmux-01.moql"]),
            Some(("qmux-01.moql", WsProtocol::Moql))
        );
        assert_eq!(
            select_subprotocol(["qmux-01.moq-lite-07-wip", "webtransport"]),
            None
        );
        assert_eq!(select_subprotocol([]), None);
    }

    /// A session pair over an in-memory socket: (server, client).
    async fn pair() -> (Session, Session) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = accept_upgraded(a, SUBPROTOCOLS[0], qmux::Config::default()).await;
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            b,
            tungstenite::protocol::Role::Client,
            None,
        )
        .await;
        let client = qmux::ws::Upgraded::new(ws)
            .with_alpn(SUBPROTOCOLS[0])
            .connect()
            .into();
        (server, client)
    }

    /// qmux 0.5.3 leaves a read waiting forever once its session is
    /// closed; ours end with the session.
    #[tokio::test]
    async fn a_pending_read_ends_when_the_session_closes() {
        let (server, client) = pair().await;
        let mut send = client.open_uni().await.unwrap();
        send.write_all(b"part of a stream").await.unwrap();
        let mut recv = server.accept_uni().await.unwrap();
        let first = recv.read_chunk(1024).await.unwrap().unwrap();
        assert_eq!(&first[..], b"part of a stream");
        let s = server.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.close(7, b"bye");
        });
        let r = tokio::time::timeout(Duration::from_secs(2), recv.read_chunk(1024)).await;
        assert!(matches!(r, Ok(Err(_))), "{r:?}");
        // The peer learns it is closed (its code and reason: e2e_websocket).
        tokio::time::timeout(Duration::from_secs(2), client.closed())
            .await
            .unwrap();
    }

    /// While our writes are stuck (the peer reads nothing), what the peer
    /// sends is not read; it is as soon as a write gets through.
    #[tokio::test]
    async fn reads_pause_while_writes_are_stuck() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut peer) = tokio::io::duplex(64);
        let stall = Arc::new(Stall::default());
        let mut ours = Guarded {
            io: a,
            stall: stall.clone(),
        };
        ours.write_all(&[0; 64]).await.unwrap();
        // The pipe is full: the next write waits.
        let w = tokio::time::timeout(Duration::from_millis(600), ours.write_all(b"more")).await;
        assert!(w.is_err());
        peer.write_all(b"ping").await.unwrap();
        assert!(stall.stuck_for() >= READ_PAUSE_AFTER);
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_millis(100), ours.read(&mut buf)).await;
        assert!(r.is_err(), "read while writes are stuck");
        // The peer reads: our write gets through, and so do our reads.
        let mut drain = [0u8; 64];
        peer.read_exact(&mut drain).await.unwrap();
        ours.write_all(b"more").await.unwrap();
        assert_eq!(stall.stuck_for(), Duration::ZERO);
        let n = ours.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"ping");
    }

    /// Data a receiver never reads (its stream dropped) gives its
    /// connection flow-control credit back (vendor/qmux patch): the peer can
    /// go on sending on other streams. Upstream qmux 0.5.3 returned credit only
    /// for bytes read, so this blocked once the window was used up.
    #[tokio::test]
    async fn unread_data_of_a_dropped_stream_frees_the_window() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut config = qmux::Config::default();
        config.max_data = 64 << 10;
        config.max_stream_data_uni = 64 << 10;
        let server = accept_upgraded(a, SUBPROTOCOLS[0], config).await;
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            b,
            tungstenite::protocol::Role::Client,
            None,
        )
        .await;
        let client: Session = qmux::ws::Upgraded::new(ws)
            .with_alpn(SUBPROTOCOLS[0])
            .connect()
            .into();
        // The receiver stops each stream as soon as it sees it (STOP_SENDING)
        // and drops it a little later: what arrives in between is never read.
        let s = server.clone();
        tokio::spawn(async move {
            while let Ok(mut recv) = s.accept_uni().await {
                recv.stop(0).unwrap();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    drop(recv);
                });
            }
        });
        for round in 0..6 {
            let mut send = client.open_uni().await.unwrap();
            let w =
                tokio::time::timeout(Duration::from_secs(3), send.write_all(&[7; 48 << 10])).await;
            assert!(
                matches!(w, Ok(Ok(()))),
                "round {round}: the window did not come back"
            );
        }
    }

    /// A finished stream reports no STOP_SENDING and no error.
    #[tokio::test]
    async fn stopped_after_finish_is_not_an_error() {
        let (server, client) = pair().await;
        let mut send = client.open_uni().await.unwrap();
        send.write_all(b"x").await.unwrap();
        send.finish().unwrap();
        let mut recv = server.accept_uni().await.unwrap();
        assert_eq!(recv.read_to_end(16).await.unwrap(), b"x");
        let r = tokio::time::timeout(Duration::from_secs(2), send.stopped()).await;
        assert!(matches!(r, Ok(Ok(None))), "{r:?}");
    }
}
