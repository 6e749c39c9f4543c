//! Accept loops: MQTT over TCP.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

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
