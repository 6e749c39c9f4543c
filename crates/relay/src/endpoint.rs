//! Runs the relay on a bound endpoint: accept, handshake each connection in
//! its own task, serve the session; drain with GOAWAY on shutdown. QUIC
//! connections of other ALPNs (`mqtt`) go to handlers the binary supplies, so
//! this crate knows nothing of the protocols behind them.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use quichub_net::h3::HttpConnection;
use quichub_net::server::{establish_any, Accepted, Acceptor, Established, Server};
use web_transport_quinn::quinn;

use crate::core::Relay;
use crate::session;

/// Serves one QUIC connection of a non-MoQT ALPN until it ends.
pub type AlpnHandler =
    Arc<dyn Fn(quinn::Connection) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Handlers by ALPN (for example `b"mqtt"`), for [`accept_loop_with`].
pub type AlpnHandlers = HashMap<Vec<u8>, AlpnHandler>;

/// QUIC application close code for a connection whose ALPN has no handler
/// (the endpoint offers `mqtt` even when no broker runs).
pub const NO_HANDLER: u32 = 0x1;

/// Accepts connections until the endpoint closes (MoQT only: a connection of
/// any other ALPN is closed).
pub async fn accept_loop(relay: Arc<Relay>, server: Arc<Server>) {
    accept_loop_with(relay, server, AlpnHandlers::new()).await
}

/// Serves one plain HTTP/3 connection (ALPN `h3`, first request not a
/// WebTransport CONNECT) until it ends.
pub type Http3Handler =
    Arc<dyn Fn(Box<HttpConnection>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Accepts connections until the endpoint closes; MoQT ones become relay
/// sessions, others go to the handler for their ALPN. Plain HTTP/3
/// connections are refused (see [`serve_endpoint`]).
pub async fn accept_loop_with(relay: Arc<Relay>, server: Arc<Server>, handlers: AlpnHandlers) {
    serve_endpoint(relay, server, handlers, None).await
}

/// Accepts connections until the endpoint closes: MoQT sessions (raw QUIC and
/// WebTransport) go to the relay, plain HTTP/3 connections to `http3` (closed
/// with H3_REQUEST_REJECTED when there is none), other ALPNs to `handlers`.
pub async fn serve_endpoint(
    relay: Arc<Relay>,
    server: Arc<Server>,
    handlers: AlpnHandlers,
    http3: Option<Http3Handler>,
) {
    let handlers = Arc::new(handlers);
    if server.shards() == 1 && server.shard_runtime(0).is_none() {
        let Some(acceptor) = server.acceptor(0) else {
            return;
        };
        return serve_shard(relay, acceptor, handlers, http3).await;
    }
    // One accept loop per endpoint, on the endpoint's own thread: the
    // sessions it accepts (and every task they spawn) run there too.
    let runtimes: Vec<_> = (0..server.shards())
        .filter_map(|shard| server.shard_runtime(shard))
        .collect();
    relay.start_shards(&runtimes);
    // The server (and with it the shards' threads) lives until every loop
    // ended: until the endpoints are closed, or this task is dropped.
    let loops: Vec<_> = (0..server.shards())
        .filter_map(|shard| {
            let rt = server.shard_runtime(shard)?;
            let acceptor = server.acceptor(shard)?;
            Some(rt.spawn(serve_shard(
                relay.clone(),
                acceptor,
                handlers.clone(),
                http3.clone(),
            )))
        })
        .collect();
    for l in loops {
        let _ = l.await;
    }
    drop(server);
}

/// The accept loop of one endpoint, run on its runtime.
async fn serve_shard(
    relay: Arc<Relay>,
    acceptor: Acceptor,
    handlers: Arc<AlpnHandlers>,
    http3: Option<Http3Handler>,
) {
    while let Some(incoming) = acceptor.accept().await {
        let relay = relay.clone();
        let handlers = handlers.clone();
        let http3 = http3.clone();
        tokio::spawn(async move {
            match establish_any(incoming).await {
                Ok(Established::Moqt(mut accepted)) => {
                    let (remote, quic) = (accepted.remote, accepted.session.clone());
                    let alpn = match (accepted.transport, accepted.draft) {
                        (quichub_net::Transport::Quic, _) if accepted.lite.is_some() => {
                            accepted.lite.map_or("", |v| v.label())
                        }
                        (_, _) if accepted.lite.is_some() => "h3 (WebTransport, moq-lite)",
                        // The first stream says which (`session::serve`).
                        (t, _) if accepted.undetermined.is_some() => {
                            accepted.undetermined.as_ref().map_or("", |u| u.label(t))
                        }
                        (quichub_net::Transport::Quic, None) => moqt::ALPN,
                        (quichub_net::Transport::Quic, Some(d)) => d.alpn(),
                        (quichub_net::Transport::WebTransport, None) => "h3 (WebTransport)",
                        (quichub_net::Transport::WebTransport, Some(d)) => match d {
                            moqt::legacy::Draft::D16 => "h3 (WebTransport, moqt-16)",
                            moqt::legacy::Draft::D14 => "h3 (WebTransport, moq-00)",
                        },
                        (quichub_net::Transport::WebSocket, _) => "WebSocket",
                    };
                    log_accepted(remote, alpn);
                    if let Some(v) = accepted.lite {
                        relay.metrics.lite_sessions[usize::from(v.number() - 1)]
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if let Some(d) = accepted.draft {
                        let i = usize::from(d == moqt::legacy::Draft::D16);
                        relay.metrics.legacy_sessions[i]
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    // Plain HTTP/3 requests beside a WebTransport session.
                    if let (Some(http), Some(h)) = (accepted.http.take(), http3.as_ref()) {
                        tokio::spawn(h(http));
                    }
                    session::serve(relay, *accepted).await;
                    log_closed(remote, alpn, quic.close_reason().map(|e| e.to_string()));
                }
                Ok(Established::Http3 { conn, remote }) => match http3 {
                    Some(h) => {
                        let quic = conn.conn().clone();
                        log_accepted(remote, "h3");
                        h(conn).await;
                        log_closed(remote, "h3", quic.close_reason().map(|e| e.to_string()));
                    }
                    None => {
                        tracing::debug!(%remote, "plain HTTP/3 request, no HTTP API");
                        conn.conn().close(
                            quichub_net::h3::codec::code::REQUEST_REJECTED.into(),
                            b"no HTTP API here",
                        );
                    }
                },
                Ok(Established::Other { alpn, conn, remote }) => match handlers.get(&alpn) {
                    Some(h) => {
                        let (name, quic) = (String::from_utf8_lossy(&alpn), conn.clone());
                        log_accepted(remote, &name);
                        h(conn).await;
                        log_closed(remote, &name, quic.close_reason().map(|e| e.to_string()));
                    }
                    None => {
                        tracing::debug!(
                            %remote,
                            "no handler for ALPN {:?}",
                            String::from_utf8_lossy(&alpn)
                        );
                        conn.close(NO_HANDLER.into(), b"protocol not served");
                    }
                },
                Err(e) => tracing::debug!("handshake failed: {e:#}"),
            }
        });
    }
}

/// Serves a MoQT session that reached the relay over a WebSocket (QMux
/// framing, [`quichub_net::websocket`]; the HTTP port did the upgrade),
/// until it closes. `path` is the request's path and query, as a
/// WebTransport CONNECT's.
/// `protocol` is what its subprotocol named; `limits` bound a bridge's
/// in-memory session (those of the WebSocket session itself).
pub async fn serve_websocket(
    relay: Arc<Relay>,
    session: quichub_net::Session,
    path: String,
    remote: SocketAddr,
    protocol: quichub_net::websocket::WsProtocol,
    limits: qmux::Config,
) {
    use quichub_net::websocket::WsProtocol;
    log_accepted(remote, "WebSocket");
    relay
        .metrics
        .websocket_sessions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let s = session.clone();
    // The endpoint's close after the drain ends QUIC sessions; a WebSocket
    // one is closed here at the same time.
    let drain = {
        let (relay, s) = (relay.clone(), session.clone());
        tokio::spawn(async move {
            let mut shutdown = relay.shutdown_signal();
            tokio::select! {
                _ = s.closed() => return,
                _ = shutdown.wait_for(|on| *on) => {}
            }
            let drain = Duration::from_millis(relay.config.goaway_timeout_ms);
            tokio::select! {
                _ = s.closed() => {}
                _ = tokio::time::sleep(drain) => s.close(0, b"relay shutting down"),
            }
        })
    };
    let (mut undetermined, mut lite) = (None, None);
    let served = match protocol {
        WsProtocol::Draft18 => Ok(session.clone()),
        WsProtocol::Unnamed => {
            undetermined = Some(quichub_net::sniff::Undetermined::no_subprotocol(limits));
            Ok(session.clone())
        }
        WsProtocol::Moql => {
            undetermined = Some(quichub_net::sniff::Undetermined::moq_00(limits));
            Ok(session.clone())
        }
        WsProtocol::Lite(version) => {
            lite = Some(version);
            relay.metrics.lite_sessions[usize::from(version.number() - 1)]
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let start = quichub_net::lite::Start {
                version,
                transport: quichub_net::Transport::WebSocket,
                url_path: Some(path.clone()),
                session_stream: None,
            };
            quichub_net::lite::accept(session.clone(), start, limits).await
        }
    };
    match served {
        Ok(served) => {
            session::serve(
                relay,
                Accepted {
                    session: served,
                    transport: quichub_net::Transport::WebSocket,
                    path: Some(path),
                    remote,
                    http: None,
                    draft: None,
                    undetermined,
                    lite,
                },
            )
            .await
        }
        Err(e) => tracing::debug!(%remote, "moq-lite bridge: {e:#}"),
    }
    drain.abort();
    let reason = s.close_reason().map(|e| e.to_string());
    // Ends the QMux session and its TCP connection, whatever ended the MoQT
    // one (a close already made, with its code and reason, stands).
    if reason.is_none() {
        s.close(0, b"");
    }
    log_closed(remote, "WebSocket", reason);
    // Held a moment, as QUIC holds a closed connection while it drains:
    // dropping the last handle tears QMux down at once, before its writer
    // has sent the close (code and reason) to the peer.
    tokio::spawn(async move {
        tokio::time::sleep(WEBSOCKET_CLOSE_LINGER).await;
        drop(s);
    });
}

/// How long a closed WebSocket session is kept for its close to go out.
const WEBSOCKET_CLOSE_LINGER: Duration = Duration::from_millis(500);

/// Logs a connection the endpoint accepted (info): peer and ALPN.
fn log_accepted(remote: SocketAddr, alpn: &str) {
    tracing::info!(%remote, alpn, "connection accepted");
}

/// Logs the end of a connection (info): peer, ALPN and why it closed
/// (`None`: its handler returned while the connection was still open).
fn log_closed(remote: SocketAddr, alpn: &str, reason: Option<String>) {
    let reason = reason.as_deref().unwrap_or("session ended");
    tracing::info!(%remote, alpn, reason, "connection closed");
}

/// Graceful shutdown: GOAWAY to every session, wait for them to leave (at most
/// the GOAWAY timeout), then close the endpoint.
/// The GOAWAY's New Session URI is [`Relay::goaway_uri`].
pub async fn shutdown(relay: &Arc<Relay>, server: &Server) {
    let uri = relay.goaway_uri();
    relay.begin_shutdown();
    // All at once: a session whose peer reads nothing (its control stream
    // blocked by flow control) must not hold up the GOAWAY of the others.
    let deadline_ms = relay.config.goaway_timeout_ms;
    let sends = relay
        .sessions()
        .into_iter()
        .map(|s| s.send_goaway(deadline_ms, uri.clone()));
    let _ = tokio::time::timeout(
        Duration::from_millis(deadline_ms),
        futures::future::join_all(sends),
    )
    .await;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.goaway_timeout_ms);
    while tokio::time::Instant::now() < deadline && relay.session_count() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.close(0, b"relay shutting down");
    server.wait_idle().await;
}
