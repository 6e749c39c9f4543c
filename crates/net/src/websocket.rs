//! MoQT over WebSocket: QMux (draft-ietf-quic-qmux) framing over one
//! WebSocket, as moq-dev's relay, its `moq` CLI and its browser library
//! (`@moq/qmux`) speak it, for browsers without WebTransport (Safari) and
//! networks that block UDP.
//!
//! The WebSocket subprotocol names both layers: `qmux-01.moqt-18` is QMux
//! draft-01 framing carrying MoQT draft-18 (moq-dev pins draft-18 to
//! qmux-01); `qmux-02.moqt-18` is accepted too. A handshake that offers
//! neither is refused (a client that upgraded with no common subprotocol
//! would speak another framing). The URL's path and query play the role of
//! the WebTransport CONNECT's: the session's path, its token.
//!
//! The HTTP upgrade itself is the host's (hyper, on the HTTP port): this
//! module picks the subprotocol ([`select_subprotocol`]) and wraps the
//! upgraded byte stream ([`accept_upgraded`]); [`connect`] is the client.

use std::time::Duration;

use anyhow::Context;
use qmux::ws::tokio_tungstenite::{self, tungstenite};
use tokio::io::{AsyncRead, AsyncWrite};

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
/// records are at most 16 KiB by default; the margin is for peers that
/// negotiate larger ones.
const MAX_MESSAGE: usize = 1 << 20;

/// The subprotocol to accept from a `Sec-WebSocket-Protocol` request header
/// (comma-separated, possibly repeated): ours, in our order of preference,
/// among those offered; `None` when none is.
pub fn select_subprotocol<'a>(offered: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let offered: Vec<&str> = offered
        .into_iter()
        .flat_map(|h| h.split(','))
        .map(str::trim)
        .collect();
    SUBPROTOCOLS.iter().copied().find(|s| offered.contains(s))
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
/// `subprotocol`) as a server-side session.
pub async fn accept_upgraded<T>(io: T, subprotocol: &str, config: qmux::Config) -> Session
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        io,
        tungstenite::protocol::Role::Server,
        Some(ws_config()),
    )
    .await;
    qmux::ws::Upgraded::new(ws)
        .with_alpn(subprotocol)
        .with_keep_alive(qmux::ws::KeepAlive::new(
            KEEP_ALIVE_INTERVAL,
            KEEP_ALIVE_TIMEOUT,
        ))
        .with_session_config(config)
        .accept()
        .into()
}

/// Connects to a `ws://` or `wss://` URL (TLS checked by `tls`), offering
/// [`SUBPROTOCOLS`]; `remote` is the address to dial.
pub async fn connect(
    url: &url::Url,
    remote: std::net::SocketAddr,
    server_name: &str,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
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
    fn picks_ours_in_our_order_among_those_offered() {
        assert_eq!(
            select_subprotocol(["qmux-02.moqt-18, qmux-01.moqt-18"]),
            Some("qmux-01.moqt-18")
        );
        assert_eq!(
            select_subprotocol(["webtransport", "qmux-02.moqt-18"]),
            Some("qmux-02.moqt-18")
        );
        assert_eq!(select_subprotocol(["qmux-01.moq-lite-04", "qmux-01"]), None);
        assert_eq!(select_subprotocol([]), None);
    }
}
