//! Accept loops: MQTT over TCP and over TLS.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::broker::Broker;
use crate::connection::{serve, ConnConfig};

/// Serves MQTT on `listener` until the task is dropped: one task per connection.
pub async fn serve_tcp(listener: TcpListener, broker: Arc<Broker>, cfg: Arc<ConnConfig>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!("mqtt accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (broker, cfg) = (broker.clone(), cfg.clone());
        tokio::spawn(async move {
            let (rd, wr) = stream.into_split();
            if let Err(e) = serve(broker, cfg, rd, wr).await {
                tracing::debug!(%peer, "mqtt: {e}");
            }
        });
    }
}

/// Binds `addr` and serves MQTT on it in a background task; returns the bound address.
pub async fn spawn_tcp(
    addr: SocketAddr,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve_tcp(listener, broker, cfg));
    Ok(local)
}

/// Binds `addr` and serves MQTT over TLS on it (the TLS handshake of each
/// connection in its own task, bounded by the CONNECT timeout); returns the
/// bound address.
pub async fn spawn_tls(
    addr: SocketAddr,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let acceptor = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("mqtt tls accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (broker, cfg, acceptor) = (broker.clone(), cfg.clone(), acceptor.clone());
            tokio::spawn(async move {
                let stream = match tokio::time::timeout(
                    cfg.connect_timeout,
                    acceptor.accept(stream),
                )
                .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, "mqtt tls handshake: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "mqtt tls handshake timed out");
                        return;
                    }
                };
                let (rd, wr) = tokio::io::split(stream);
                if let Err(e) = serve(broker, cfg, rd, wr).await {
                    tracing::debug!(%peer, "mqtt tls: {e}");
                }
            });
        }
    });
    Ok(local)
}
