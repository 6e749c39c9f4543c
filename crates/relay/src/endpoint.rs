//! Runs the relay on a bound endpoint: accept, handshake each connection in
//! its own task, serve the session; drain with GOAWAY on shutdown.

use std::sync::Arc;
use std::time::Duration;

use quichub_net::server::{establish, Server};

use crate::core::Relay;
use crate::session;

/// Accepts connections until the endpoint closes.
pub async fn accept_loop(relay: Arc<Relay>, server: Arc<Server>) {
    while let Some(incoming) = server.accept().await {
        let relay = relay.clone();
        tokio::spawn(async move {
            match establish(incoming).await {
                Ok(accepted) => session::serve(relay, accepted).await,
                Err(e) => tracing::debug!("handshake failed: {e:#}"),
            }
        });
    }
}

/// Graceful shutdown: GOAWAY to every session, wait for them to leave (at most
/// the GOAWAY timeout), then close the endpoint.
pub async fn shutdown(relay: &Arc<Relay>, server: &Server) {
    relay.begin_shutdown();
    for s in relay.sessions() {
        s.send_goaway(relay.config.goaway_timeout_ms).await;
    }
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.goaway_timeout_ms);
    while tokio::time::Instant::now() < deadline && !relay.sessions().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.close(0, b"relay shutting down");
    server.endpoint().wait_idle().await;
}
