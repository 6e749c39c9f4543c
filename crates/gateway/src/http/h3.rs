//! The HTTP API over HTTP/3 (ALPN `h3` on the relay's UDP port, beside
//! WebTransport): each request stream is read to its end (at most
//! [`Api::max_body`] bytes), handed to the core, and the response written
//! back as HEADERS and DATA frames; Server-Sent Events go out one DATA frame
//! per chunk as the core produces them.
//!
//! 0-RTT (`docs/zero-rtt.md`): requests that arrived in early data run at
//! once when running them twice is harmless or at worst duplicates a message
//! (GET, HEAD, PUT, POST); any other method (DELETE) waits until the
//! handshake completes, and is dropped if it never does.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request as HttpRequest, StatusCode};
use quichub_net::h3::codec::code;
use quichub_net::h3::{BodyError, Handshake, HttpConnection, Request, Responder};

use super::api::{error, Api, ApiBody};
use super::origin::Listener;

/// Whether a request may run before the handshake completes: a replay of it
/// can at most repeat a read, re-create a topic, or publish a message twice
/// (the at-least-once guarantee an MQTT QoS 1 publish has too).
pub fn early_ok(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::PUT | Method::POST
    )
}

/// Serves one HTTP/3 connection that came in on `listener` (the relay's
/// UDP port, whose pages' origins the caller adds with
/// [`super::origin::OriginPolicy::add_listener`]) until it ends: a task per
/// request.
pub async fn serve_h3(api: Arc<Api>, mut conn: Box<HttpConnection>, listener: Listener) {
    let handshake = conn.handshake().clone();
    let peer = super::rate::ClientAddr(conn.conn().remote_address());
    while let Some(req) = conn.next().await {
        tokio::spawn(handle(api.clone(), req, handshake.clone(), listener, peer));
    }
}

/// Answers one request.
async fn handle(
    api: Arc<Api>,
    mut req: Request,
    handshake: Handshake,
    listener: Listener,
    peer: super::rate::ClientAddr,
) {
    if req.early {
        if early_ok(&req.head.method) {
            api.metrics.early.fetch_add(1, Relaxed);
        } else {
            api.metrics.early_held.fetch_add(1, Relaxed);
            if !handshake.wait().await {
                // A replay (or a client gone mid-handshake): run nothing.
                req.reset(code::REQUEST_REJECTED);
                return;
            }
        }
    }
    if req.head.method == Method::CONNECT {
        let msg = if req.head.is_webtransport() {
            "WebTransport needs a connection of its own: send CONNECT as its first request"
        } else {
            "CONNECT is not supported"
        };
        let resp = error(StatusCode::BAD_REQUEST, msg);
        write(req.respond(false), &Method::CONNECT, resp).await;
        return;
    }
    let max = api.max_body();
    let declared = req
        .head
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = if declared.is_some_and(|n| n > max as u64) {
        Err(BodyError::TooLarge(max))
    } else {
        req.body(max).await
    };
    let body = match body {
        Ok(b) => b,
        Err(BodyError::TooLarge(_)) => {
            let method = req.head.method.clone();
            write(req.respond(false), &method, api.payload_too_large()).await;
            return;
        }
        Err(BodyError::Frame(e)) => {
            tracing::debug!("HTTP/3 request body: {e}");
            req.reset(e.code());
            return;
        }
        Err(BodyError::Stream(e)) => {
            tracing::debug!("HTTP/3 request body: {e}");
            req.reset(code::REQUEST_INCOMPLETE);
            return;
        }
    };
    let mut builder = HttpRequest::builder()
        .method(req.head.method.clone())
        .uri(req.head.path.as_str())
        .extension(listener)
        .extension(peer);
    if let Some(h) = builder.headers_mut() {
        *h = std::mem::take(&mut req.head.headers);
        // `:authority` is what the Host check reads (RFC 9114 §4.3.1: it
        // wins over a Host field).
        if let Ok(a) = HeaderValue::from_str(&req.head.authority) {
            if !a.is_empty() {
                h.insert(HOST, a);
            }
        }
    }
    let method = req.head.method.clone();
    let resp = match builder.body(body) {
        Ok(r) => api.handle(r).await,
        Err(_) => error(StatusCode::BAD_REQUEST, "malformed :path"),
    };
    write(req.respond(true), &method, resp).await;
}

/// Writes a response: HEADERS, then the body as DATA frames (none for HEAD).
async fn write(mut out: Responder, method: &Method, resp: http::Response<ApiBody>) {
    let (mut parts, body) = resp.into_parts();
    if let ApiBody::Full(b) = &body {
        if !parts.headers.contains_key(CONTENT_LENGTH) && *method != Method::HEAD {
            parts
                .headers
                .insert(CONTENT_LENGTH, HeaderValue::from(b.len() as u64));
        }
    }
    if parts.status == StatusCode::NO_CONTENT || parts.status == StatusCode::NOT_MODIFIED {
        parts.headers.remove(CONTENT_LENGTH);
        parts.headers.remove(CONTENT_TYPE);
    }
    if out.head(parts.status, &parts.headers).await.is_err() {
        return;
    }
    match body {
        ApiBody::Full(b) => {
            if *method != Method::HEAD && out.data(b).await.is_err() {
                return;
            }
        }
        ApiBody::Stream(mut rx) => {
            let stopped = out.stopped();
            tokio::pin!(stopped);
            loop {
                let chunk: Option<Bytes> = tokio::select! {
                    c = rx.recv() => c,
                    _ = &mut stopped => return,
                };
                match chunk {
                    // The core ended the stream (DELETE, or the server stopping).
                    None => break,
                    Some(c) => {
                        if out.data(c).await.is_err() {
                            // Client gone: dropping `rx` frees the subscription.
                            return;
                        }
                    }
                }
            }
        }
    }
    out.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_safe_methods_only_run_early() {
        for m in [Method::GET, Method::HEAD, Method::PUT, Method::POST] {
            assert!(early_ok(&m), "{m}");
        }
        for m in [
            Method::DELETE,
            Method::PATCH,
            Method::CONNECT,
            Method::OPTIONS,
        ] {
            assert!(!early_ok(&m), "{m}");
        }
    }
}
