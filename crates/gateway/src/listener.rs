//! Accept loops: MQTT over TCP and over TLS, within the process's TCP
//! limits ([`quichub_net::tcp_limits`]).

use std::net::SocketAddr;
use std::sync::Arc;

use quichub_net::tcp_limits::{Acceptor, ConnLimiter, TcpLimits};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use quichub_net::tls::{ClientCertConfig, PeerCert};

use crate::broker::Broker;
use crate::connection::{serve, serve_peer, ConnConfig, Peer};
use crate::metrics::Transport;

/// Serves MQTT on `acceptor` until the task is dropped: one task per
/// connection (the CONNECT timeout bounds clients that send nothing).
pub async fn serve_tcp(acceptor: Acceptor, broker: Arc<Broker>, cfg: Arc<ConnConfig>) {
    loop {
        let (stream, peer, guard) = acceptor.accept().await;
        let _ = stream.set_nodelay(true);
        let (broker, cfg) = (broker.clone(), cfg.clone());
        tokio::spawn(async move {
            let _guard = guard;
            let (rd, wr) = stream.into_split();
            if let Err(e) = serve(broker, cfg, rd, wr).await {
                tracing::debug!(%peer, "mqtt: {e}");
            }
        });
    }
}

/// Binds `addr` and serves MQTT on it in a background task, within the
/// default [`TcpLimits`]; returns the bound address.
pub async fn spawn_tcp(
    addr: SocketAddr,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
) -> std::io::Result<SocketAddr> {
    spawn_tcp_with(addr, broker, cfg, TcpLimits::default().limiter("mqtt", 1)).await
}

/// Binds `addr` and serves MQTT on it in a background task, within
/// `limiter`'s caps; returns the bound address.
pub async fn spawn_tcp_with(
    addr: SocketAddr,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    limiter: Arc<ConnLimiter>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve_tcp(Acceptor::new(listener, limiter), broker, cfg));
    Ok(local)
}

/// Binds `addr` and serves MQTT over TLS on it, within the default
/// [`TcpLimits`]; returns the bound address.
pub async fn spawn_tls(
    addr: SocketAddr,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
) -> std::io::Result<SocketAddr> {
    let limiter = TcpLimits::default().limiter("mqtt-tls", 1);
    spawn_tls_with(addr, broker, cfg, tls, limiter).await
}

/// Binds `addr` and serves MQTT over TLS on it within `limiter`'s caps (the
/// TLS handshake of each connection in its own task, bounded by the CONNECT
/// timeout); returns the bound address.
pub async fn spawn_tls_with(
    addr: SocketAddr,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    limiter: Arc<ConnLimiter>,
) -> std::io::Result<SocketAddr> {
    let clients = Arc::new(ClientCertConfig::default());
    spawn_tls_clients(addr, broker, cfg, tls, limiter, clients).await
}

/// [`spawn_tls_with`], each connection judged by the client certificate
/// policy `clients` (build `tls` with the same one:
/// [`quichub_net::tls::tcp_server_config_with_clients`]); the verified
/// certificate's subject CN reaches the connection as
/// [`Peer::certificate`].
pub async fn spawn_tls_clients(
    addr: SocketAddr,
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    limiter: Arc<ConnLimiter>,
    clients: Arc<ClientCertConfig>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let acceptor = Acceptor::new(listener, limiter);
    let tls = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let (stream, peer, guard) = acceptor.accept().await;
            let _ = stream.set_nodelay(true);
            let (broker, cfg, tls) = (broker.clone(), cfg.clone(), tls.clone());
            let clients = clients.clone();
            tokio::spawn(async move {
                let _guard = guard;
                let stream =
                    match tokio::time::timeout(cfg.connect_timeout, tls.accept(stream)).await {
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
                let certificate = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(PeerCert::from_chain);
                let who = Peer::with_certificate(Transport::Tls, certificate, &clients);
                let (rd, wr) = tokio::io::split(stream);
                if let Err(e) = serve_peer(broker, cfg, who, rd, wr).await {
                    tracing::debug!(%peer, "mqtt tls: {e}");
                }
            });
        }
    });
    Ok(local)
}
