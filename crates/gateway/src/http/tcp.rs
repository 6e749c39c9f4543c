//! The HTTP API over TCP: HTTP/1.1 and cleartext HTTP/2 with prior
//! knowledge (RFC 9113 §3.3) on one port, told apart by the connection
//! preface (hyper-util's auto server), and the same over TLS (HTTPS, ALPN
//! `h2` and `http/1.1`; [`spawn_tls_with`]). For clients without HTTP/3,
//! and for WebSocket upgrades ([`super::websocket`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use quichub_net::tcp_limits::{Acceptor, ConnLimiter, TcpLimits};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

use super::api::{error, Api, ApiBody};
use super::origin::Listener;

/// A response body for hyper: complete (with its length) or streamed.
#[derive(Debug)]
pub struct HttpBody {
    full: Option<Bytes>,
    stream: Option<mpsc::Receiver<Bytes>>,
    /// The request counts as in flight until its response body is done.
    in_flight: Option<InFlight>,
}

impl From<ApiBody> for HttpBody {
    fn from(b: ApiBody) -> Self {
        match b {
            ApiBody::Full(b) => HttpBody {
                full: Some(b),
                stream: None,
                in_flight: None,
            },
            ApiBody::Stream(rx) => HttpBody {
                full: None,
                stream: Some(rx),
                in_flight: None,
            },
        }
    }
}

impl Body for HttpBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(b) = this.full.take() {
            return Poll::Ready((!b.is_empty()).then(|| Ok(Frame::data(b))));
        }
        match &mut this.stream {
            Some(rx) => rx.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_none() && self.full.as_ref().is_none_or(|b| b.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.full, &self.stream) {
            (_, Some(_)) => SizeHint::default(),
            (Some(b), None) => SizeHint::with_exact(b.len() as u64),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

/// Past the limit, up to this many more bytes of a request body are read
/// and discarded before answering 413, so that clients which only read the
/// answer once they sent the whole body (curl over HTTP/2) see the 413
/// rather than a reset stream. Larger bodies are cut off.
const DRAIN_MAX: u64 = 8 * 1024 * 1024;
/// Longest time spent discarding such a body.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads the request body (at most [`Api::max_body`] bytes, all of it
/// within `body_timeout`, else 408) and hands the request to the core.
pub async fn handle(
    api: Arc<Api>,
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Response<HttpBody> {
    let (parts, mut body) = req.into_parts();
    let max = api.max_body();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut buf = BytesMut::new();
    let mut over = declared.is_some_and(|n| n > max as u64);
    let deadline = tokio::time::Instant::now() + body_timeout;
    while !over {
        let Ok(frame) = tokio::time::timeout_at(deadline, body.frame()).await else {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                &format!("request body not complete within {body_timeout:?}"),
            )
            .map(HttpBody::from);
        };
        match frame {
            None => break,
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    if buf.len() + d.len() > max {
                        over = true;
                    } else {
                        buf.extend_from_slice(&d);
                    }
                }
            }
            Some(Err(e)) => {
                return error(StatusCode::BAD_REQUEST, &format!("request body: {e}"))
                    .map(HttpBody::from)
            }
        }
    }
    if over {
        if declared.is_none_or(|n| n <= max as u64 + DRAIN_MAX) {
            let drain = async {
                let mut left = DRAIN_MAX;
                while let Some(Ok(f)) = body.frame().await {
                    let n = f.data_ref().map_or(0, |d| d.len() as u64);
                    if n > left {
                        break;
                    }
                    left -= n;
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
        }
        return api.payload_too_large().map(HttpBody::from);
    }
    api.handle(Request::from_parts(parts, buf.freeze()))
        .await
        .map(HttpBody::from)
}

/// The listener `acceptor` is, its pages' origins added to `api`'s own.
fn listener_of(api: &Api, acceptor: &Acceptor, secure: bool) -> Listener {
    match acceptor.local_addr() {
        Ok(addr) => {
            api.origins().add_listener(secure, addr);
            Listener::new(secure, addr)
        }
        // Unknown, so taken as loopback: Host is checked rather than not.
        Err(_) => Listener {
            secure,
            loopback: true,
        },
    }
}

/// Serves the API on `acceptor` until the task is dropped: one task per
/// connection, HTTP/1.1 or HTTP/2 by preface, each bounded by `limits`'
/// HTTP timeouts (see [`serve_conn`]).
pub async fn serve_tcp(acceptor: Acceptor, api: Arc<Api>, limits: TcpLimits) {
    let listener = listener_of(&api, &acceptor, false);
    let timeouts = Timeouts {
        header: limits.http_header_timeout(),
        idle: limits.http_idle_timeout(),
        body: limits.http_body_timeout(),
    };
    loop {
        let (stream, peer, guard) = acceptor.accept().await;
        let _ = stream.set_nodelay(true);
        let api = api.clone();
        tokio::spawn(async move {
            // A WebSocket upgrade's session keeps the slot after this
            // returns (it holds a clone).
            let guard = Arc::new(guard);
            serve_conn(stream, peer, listener, api, timeouts, guard).await;
        });
    }
}

/// [`serve_tcp`] over TLS: each connection's handshake must end within the
/// header timeout (a client that stalls it holds a slot no longer than one
/// that stalls its request head).
pub async fn serve_tls(
    acceptor: Acceptor,
    api: Arc<Api>,
    limits: TcpLimits,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
) {
    let listener = listener_of(&api, &acceptor, true);
    let timeouts = Timeouts {
        header: limits.http_header_timeout(),
        idle: limits.http_idle_timeout(),
        body: limits.http_body_timeout(),
    };
    let tls = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (stream, peer, guard) = acceptor.accept().await;
        let _ = stream.set_nodelay(true);
        let (api, tls) = (api.clone(), tls.clone());
        tokio::spawn(async move {
            let guard = Arc::new(guard);
            let stream = match tokio::time::timeout(timeouts.header, tls.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "https: TLS handshake: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "https: TLS handshake timed out");
                    return;
                }
            };
            serve_conn(stream, peer, listener, api, timeouts, guard).await;
        });
    }
}

/// The HTTP timeouts of one connection.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Duration,
    idle: Duration,
    body: Duration,
}

/// After a timeout, how long a connection may take to close gracefully
/// (HTTP/2 GOAWAY) before it is dropped, unless a request is in flight.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What a connection is doing, for its timeouts: requests in flight (from
/// a complete request head until the response body is sent or dropped),
/// when it last went idle, and when bytes first came in since.
#[derive(Debug)]
struct Activity {
    start: tokio::time::Instant,
    in_flight: AtomicUsize,
    /// Whether a request head ever completed.
    served: AtomicBool,
    /// Milliseconds from `start` to when the last request ended.
    idle_since: AtomicU64,
    /// Milliseconds from `start` (plus one; 0: none) to the first byte read
    /// while no request was in flight.
    pending_since: AtomicU64,
    /// Wakes the watcher when the deadline may have moved.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            pending_since: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn bytes_in(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.pending_since.load(Ordering::Acquire) == 0
        {
            self.pending_since
                .store(self.now_ms() + 1, Ordering::Release);
            self.changed.notify_one();
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// When the connection is to be closed if nothing changes (`None`
    /// while a request is in flight): `header` after its start until a
    /// first request head, then `idle` after the last response, or
    /// `header` after the first byte of the next request.
    fn deadline(&self, t: Timeouts) -> Option<tokio::time::Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64, d: Duration| self.start + Duration::from_millis(ms) + d;
        if !self.served.load(Ordering::Acquire) {
            return Some(at(0, t.header));
        }
        Some(match self.pending_since.load(Ordering::Acquire) {
            0 => at(self.idle_since.load(Ordering::Acquire), t.idle),
            p => at(p - 1, t.header),
        })
    }
}

/// One request in flight; travels with its response body.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        if a.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            a.idle_since.store(a.now_ms(), Ordering::Release);
            a.pending_since.store(0, Ordering::Release);
            a.changed.notify_one();
        }
    }
}

/// The socket, telling [`Activity`] when bytes come in.
struct Tracked<S> {
    stream: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.bytes_in();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Serves one connection. hyper-util's auto builder reads up to 24 bytes
/// to tell HTTP/2 from HTTP/1.1 with no time limit, and HTTP/2 has no
/// header timeout of its own, so the bounds are kept here, the same for
/// both versions: a client that sends nothing, sends its request head
/// slowly, or never completes the HTTP/2 handshake is closed `header`
/// after the connection's start (or after the first byte of a later
/// request); a keep-alive connection with no request in flight is closed
/// `idle` after its last response; a request body must arrive within
/// `body` (else 408). HTTP/2 also pings a peer every `idle`
/// while streams are open and closes the connection when a ping is not
/// answered within `header`.
async fn serve_conn<S, G>(
    stream: S,
    peer: SocketAddr,
    listener: Listener,
    api: Arc<Api>,
    t: Timeouts,
    guard: Arc<G>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    G: Send + Sync + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        stream,
        activity: activity.clone(),
    });
    let a = activity.clone();
    let service = service_fn(move |mut req: Request<Incoming>| {
        let (api, a, guard) = (api.clone(), a.clone(), guard.clone());
        async move {
            if super::websocket::is_upgrade(&req) {
                if let Some(ws) = api.websocket() {
                    // WebSocket has no CORS: this is the only check a
                    // page's upgrade meets before it is a session.
                    let screened =
                        api.screen(listener, req.method(), req.uri(), req.headers(), true);
                    let resp = match screened {
                        Ok(_) => ws.upgrade(req, peer, Box::new(guard)),
                        Err(why) => ws.refused(super::api::refusal(why)),
                    };
                    return Ok::<_, Infallible>(resp.map(HttpBody::from));
                }
            }
            req.extensions_mut().insert(listener);
            req.extensions_mut().insert(super::rate::ClientAddr(peer));
            let in_flight = a.begin();
            let resp = handle(api, req, t.body).await;
            Ok::<_, Infallible>(resp.map(|mut b| {
                b.in_flight = Some(in_flight);
                b
            }))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(t.idle)
        .keep_alive_timeout(t.header);
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    loop {
        let deadline = activity.deadline(t);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, "http: {e}");
                }
                return;
            }
            _ = activity.changed.notified() => {}
            _ = sleep_until_some(deadline) => {
                if activity
                    .deadline(t)
                    .is_some_and(|d| d <= tokio::time::Instant::now())
                {
                    tracing::debug!(%peer, "http: closed after a header or idle timeout");
                    conn.as_mut().graceful_shutdown();
                    let ended = tokio::time::timeout(CLOSE_GRACE, conn.as_mut()).await;
                    // A request that began at the deadline is served to its end.
                    if ended.is_err() && activity.in_flight.load(Ordering::Acquire) > 0 {
                        let _ = conn.as_mut().await;
                    }
                    return;
                }
            }
        }
    }
}

async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Binds `addr` and serves the API over TLS (`tls`: the relay's
/// certificate, ALPN `h2` and `http/1.1`) on it in a background task,
/// within `limits` and `limiter`; returns the bound address.
pub async fn spawn_tls_with(
    addr: SocketAddr,
    api: Arc<Api>,
    limits: TcpLimits,
    limiter: Arc<ConnLimiter>,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve_tls(
        Acceptor::new(listener, limiter),
        api,
        limits,
        tls,
    ));
    Ok(local)
}

/// Binds `addr` and serves the API on it in a background task, within the
/// default [`TcpLimits`]; returns the bound address.
pub async fn spawn_tcp(addr: SocketAddr, api: Arc<Api>) -> std::io::Result<SocketAddr> {
    let limits = TcpLimits::default();
    let limiter = limits.limiter("http", 1);
    spawn_tcp_with(addr, api, limits, limiter).await
}

/// Binds `addr` and serves the API on it in a background task, within
/// `limits` (its HTTP timeouts) and `limiter` (its connection caps);
/// returns the bound address.
pub async fn spawn_tcp_with(
    addr: SocketAddr,
    api: Arc<Api>,
    limits: TcpLimits,
    limiter: Arc<ConnLimiter>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve_tcp(Acceptor::new(listener, limiter), api, limits));
    Ok(local)
}
