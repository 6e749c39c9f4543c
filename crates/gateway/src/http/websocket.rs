//! MoQT over WebSocket on the HTTP port: an HTTP/1.1 upgrade on any path
//! (the path and query are the session's, as a WebTransport CONNECT's) with
//! subprotocol `qmux-01.moqt-18` (or another QMux version, moq-lite, or a
//! bare `qmux-0N`: `quichub_net::websocket::select_subprotocol`) becomes a relay
//! session, the same as one over QUIC (see `quichub_net::websocket` for the
//! framing). It is what browsers without WebTransport, and clients behind
//! networks that block UDP, use; moq-dev's clients fall back to it the same
//! way.
//!
//! What the upgrade checks is RFC 6455's handshake and the subprotocol
//! (the page's `Origin` and the `Host` were screened before, see
//! [`super::origin`]); who may do what is the relay's to decide, as for
//! every session (the token in `?jwt=` or in SETUP). The TCP connection
//! keeps its slot of the HTTP listener's connection limit for as long as
//! the session lasts.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{
    HeaderValue, CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_PROTOCOL, UPGRADE,
};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use quichub_net::websocket::{accept_upgraded, select_subprotocol};
use quichub_relay::Relay;

use super::api::{error, ApiBody};

/// Whether `req` asks for a WebSocket (`Upgrade: websocket`).
pub fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
}

/// Where upgraded sessions go.
pub struct WebSocketMoqt {
    relay: Arc<Relay>,
    config: qmux::Config,
}

impl std::fmt::Debug for WebSocketMoqt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSocketMoqt").finish_non_exhaustive()
    }
}

impl WebSocketMoqt {
    /// Sessions for `relay`, with the QMux limits (streams, windows) of
    /// `quic` as a QUIC peer gets them.
    pub fn new(relay: Arc<Relay>, quic: &quichub_net::QuicConfig) -> Self {
        Self {
            relay,
            config: quichub_net::websocket::session_config(quic),
        }
    }

    /// `r`, the answer to an upgrade refused before it got here (its
    /// `Origin` or `Host`), counted as a refused upgrade.
    pub fn refused(&self, r: Response<ApiBody>) -> Response<ApiBody> {
        self.relay
            .metrics
            .websocket_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        r
    }

    /// Answers an upgrade request: 101 and the session served in a task of
    /// its own (holding `keep`, the connection's slot, until it ends), or
    /// the reason it is refused.
    pub fn upgrade(
        &self,
        req: Request<Incoming>,
        remote: SocketAddr,
        keep: Box<dyn std::any::Any + Send + Sync>,
    ) -> Response<ApiBody> {
        let refuse = |status, why: &str| {
            self.relay
                .metrics
                .websocket_refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            error(status, why)
        };
        if req.method() != Method::GET || req.version() != Version::HTTP_11 {
            return refuse(
                StatusCode::BAD_REQUEST,
                "a WebSocket upgrade is an HTTP/1.1 GET",
            );
        }
        let h = req.headers();
        let connection_upgrade = h
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
        let version_13 = h
            .get("sec-websocket-version")
            .is_some_and(|v| v.as_bytes() == b"13");
        let Some(key) = h.get("sec-websocket-key").filter(|k| k.len() == 24) else {
            return refuse(StatusCode::BAD_REQUEST, "no Sec-WebSocket-Key");
        };
        if !connection_upgrade || !version_13 {
            let mut r = refuse(
                StatusCode::BAD_REQUEST,
                "WebSocket needs Connection: Upgrade and Sec-WebSocket-Version: 13",
            );
            r.headers_mut()
                .insert("sec-websocket-version", HeaderValue::from_static("13"));
            return r;
        }
        let offered = h
            .get_all(SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok());
        let Some((subprotocol, protocol)) = select_subprotocol(offered) else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "no MoQT subprotocol offered: Sec-WebSocket-Protocol qmux-01.moqt-18 \
                 (or qmux-02.moq-lite-06, ...)",
            );
        };
        if self.relay.is_shutting_down() {
            return refuse(StatusCode::SERVICE_UNAVAILABLE, "relay shutting down");
        }
        let accept = qmux::ws::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let path = req
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
        let (relay, config) = (self.relay.clone(), self.config.clone());
        tokio::spawn(async move {
            let _keep = keep;
            let upgraded = match hyper::upgrade::on(req).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(%remote, "WebSocket upgrade: {e}");
                    return;
                }
            };
            let session =
                accept_upgraded(TokioIo::new(upgraded), subprotocol, config.clone()).await;
            quichub_relay::endpoint::serve_websocket(
                relay, session, path, remote, protocol, config,
            )
            .await;
        });
        let mut r = Response::new(ApiBody::empty());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = r.headers_mut();
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(
            SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_str(&accept).expect("base64 is a header value"),
        );
        headers.insert(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(subprotocol),
        );
        r
    }
}
