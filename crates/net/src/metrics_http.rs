//! A minimal HTTP/1.1 server for `GET /metrics` (Prometheus text format) and
//! the probes of orchestrators: `/healthz` (the process serves: 200) and
//! `/readyz` (200 while it takes new sessions, 503 with the reason while it
//! drains). Hand-written because it answers three fixed routes; a web
//! framework would be most of the binary's dependency tree for ten lines of
//! protocol.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::tcp_limits::{Acceptor, TcpLimits};

/// Whether the server takes new work: `None` when ready, else why not.
pub type Readiness = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Serves `render()` at `/metrics` until the task is dropped, within the
/// default [`TcpLimits`], always ready.
pub async fn serve(
    listener: TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> std::io::Result<()> {
    let limits = TcpLimits::default();
    let acceptor = Acceptor::new(listener, limits.metrics_limiter());
    serve_with(
        acceptor,
        render,
        Arc::new(|| None),
        limits.http_header_timeout(),
    )
    .await
}

/// Serves `render()` at `/metrics` and `ready()` at `/readyz` on `acceptor`
/// until the task is dropped; a client has `header_timeout` to send its
/// request head.
pub async fn serve_with(
    acceptor: Acceptor,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    ready: Readiness,
    header_timeout: Duration,
) -> std::io::Result<()> {
    loop {
        let (mut sock, _, guard) = acceptor.accept().await;
        let render = render.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let mut buf = [0u8; 2048];
            let mut n = 0;
            // Read until the end of the request head (bounded in size and
            // in time as a whole, so a slow sender cannot hold it).
            let head = async {
                while n < buf.len() {
                    match sock.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return false,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                true
            };
            if !matches!(tokio::time::timeout(header_timeout, head).await, Ok(true)) {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match path {
                "/metrics" => ("200 OK", render()),
                "/healthz" => ("200 OK", "ok\n".to_string()),
                "/readyz" => match ready() {
                    None => ("200 OK", "ready\n".to_string()),
                    Some(why) => ("503 Service Unavailable", format!("{why}\n")),
                },
                _ => ("404 Not Found", "not found\n".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(header_timeout, sock.write_all(resp.as_bytes())).await;
        });
    }
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
