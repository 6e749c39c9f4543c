//! The HTTP API over TCP: HTTP/1.1 and cleartext HTTP/2 with prior
//! knowledge (RFC 9113 §3.3) on one port, told apart by the connection
//! preface (hyper-util's auto server). For clients without HTTP/3.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
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
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::api::{error, Api, ApiBody};

/// A response body for hyper: complete (with its length) or streamed.
#[derive(Debug)]
pub struct HttpBody {
    full: Option<Bytes>,
    stream: Option<mpsc::Receiver<Bytes>>,
}

impl From<ApiBody> for HttpBody {
    fn from(b: ApiBody) -> Self {
        match b {
            ApiBody::Full(b) => HttpBody {
                full: Some(b),
                stream: None,
            },
            ApiBody::Stream(rx) => HttpBody {
                full: None,
                stream: Some(rx),
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

/// Reads the request body (at most [`Api::max_body`] bytes) and hands the
/// request to the core.
pub async fn handle(api: Arc<Api>, req: Request<Incoming>) -> Response<HttpBody> {
    let (parts, mut body) = req.into_parts();
    let max = api.max_body();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut buf = BytesMut::new();
    let mut over = declared.is_some_and(|n| n > max as u64);
    while !over {
        match body.frame().await {
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

/// Serves the API on `listener` until the task is dropped: one task per
/// connection, HTTP/1.1 or HTTP/2 by preface.
pub async fn serve_tcp(listener: TcpListener, api: Arc<Api>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("http accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let api = api.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(handle(api, req).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, "http: {e}");
            }
        });
    }
}

/// Binds `addr` and serves the API on it in a background task; returns the
/// bound address.
pub async fn spawn_tcp(addr: SocketAddr, api: Arc<Api>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve_tcp(listener, api));
    Ok(local)
}
