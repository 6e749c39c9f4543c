//! Client connections by URL: `moqt://host:port/path` for raw QUIC,
//! `https://host:port/path` for WebTransport, `ws://` and `wss://` for MoQT
//! over a WebSocket ([`crate::websocket`]).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::mux::Session;
use anyhow::Context;
use url::Url;
use web_transport_quinn::proto::ConnectRequest;

use crate::tls::{provider, Verifier, Verify};
use crate::Transport;

/// A connected MoQT transport session.
pub struct Connected {
    /// The session.
    pub session: Session,
    /// Which way it went.
    pub transport: Transport,
    /// The URL's authority (for the AUTHORITY setup option on raw QUIC).
    pub authority: String,
    /// The URL's path and query (for the PATH setup option on raw QUIC).
    pub path: String,
    /// The server's address.
    pub remote: SocketAddr,
}

/// A client endpoint that can open many connections (one UDP socket).
#[derive(Clone)]
pub struct Client {
    endpoint: quinn::Endpoint,
    verify: Verify,
    /// The TLS configuration of [`Client::dial`], built once: rustls resumes
    /// a session only with the very certificate verifier and client
    /// credentials (the same `Arc`s) that made it. Its ticket store is shared
    /// by every dial of this client (and its clones).
    dial_tls: Arc<rustls::ClientConfig>,
    congestion: crate::CongestionControl,
    /// Pad every QUIC packet carrying application data to the path's
    /// maximum size ([`Client::pad_to_mtu`]).
    pad_to_mtu: bool,
}

/// Session tickets a client keeps (per server name; each is used once).
const TICKETS: usize = 256;

/// A QUIC connection from [`Client::dial`].
pub enum Dialed {
    /// Resumed with 0-RTT: usable at once, what is sent now goes as early
    /// data. `accepted` resolves when the handshake completes: true when the
    /// server took the early data; false when it refused it, in which case
    /// streams opened before fail with `ZeroRttRejected` and what they
    /// carried must be sent again.
    Early {
        /// The connection (handshake still running).
        conn: quinn::Connection,
        /// Resolves at the end of the handshake: whether 0-RTT was accepted.
        accepted: quinn::ZeroRttAccepted,
    },
    /// A full handshake (no ticket for this server, or 0-RTT not asked for),
    /// completed.
    Full(quinn::Connection),
}

impl Dialed {
    /// The connection, whichever way it went.
    pub fn connection(&self) -> &quinn::Connection {
        match self {
            Dialed::Early { conn, .. } | Dialed::Full(conn) => conn,
        }
    }
}

/// A TLS client configuration for TCP (MQTT over TLS) that checks the
/// server as `verify` says and offers `alpn` (empty: no ALPN).
pub fn tcp_client_config(
    verify: Verify,
    alpn: &[&[u8]],
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Verifier::new(verify))
        .with_no_client_auth();
    tls.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(tls))
}

impl Client {
    /// Binds an ephemeral UDP socket on the loopback or any address.
    pub fn new(bind: SocketAddr, verify: Verify) -> anyhow::Result<Self> {
        let socket = crate::server::bind_udp(bind).context("bind client UDP socket")?;
        let runtime = quinn::default_runtime().context("no async runtime")?;
        let endpoint =
            quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, runtime)?;
        let mut dial_tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Verifier::new(verify.clone()))
            .with_no_client_auth();
        dial_tls.resumption = rustls::client::Resumption::store(Arc::new(
            rustls::client::ClientSessionMemoryCache::new(TICKETS),
        ));
        Ok(Self {
            endpoint,
            verify,
            dial_tls: Arc::new(dial_tls),
            congestion: crate::CongestionControl::default(),
            pad_to_mtu: false,
        })
    }

    /// The quinn endpoint (for example to `rebind` it to a new socket, as a
    /// client behind a NAT that changed its port).
    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    /// Uses `cc` as the congestion controller of the connections made from
    /// now on.
    pub fn set_congestion_control(&mut self, cc: crate::CongestionControl) {
        self.congestion = cc;
    }

    /// Pads every QUIC packet carrying application data of the connections
    /// made from now on to the path's maximum UDP payload (quinn's
    /// `pad_to_mtu`): an observer then sees full-size packets only, whatever
    /// the stream writes and datagrams (traffic shaping,
    /// `quichub pub --shape-rate`).
    pub fn pad_to_mtu(mut self, on: bool) -> Self {
        self.pad_to_mtu = on;
        self
    }

    /// Connects to `remote` with `alpn` (any protocol: `mqtt`, ...). Every
    /// dial of this client shares one ticket store, so a second connection
    /// to the same `server_name` resumes the TLS session; with `early`, it
    /// also sends 0-RTT data ([`Dialed::Early`]: returned before the
    /// handshake completes). Without a ticket, or without `early`, the
    /// handshake completes first ([`Dialed::Full`]).
    ///
    /// 0-RTT data can be replayed by an attacker: send in it only what the
    /// server may see twice (see `docs/zero-rtt.md`).
    pub async fn dial(
        &self,
        remote: SocketAddr,
        server_name: &str,
        alpn: &[u8],
        early: bool,
    ) -> anyhow::Result<Dialed> {
        let mut tls = (*self.dial_tls).clone();
        tls.alpn_protocols = vec![alpn.to_vec()];
        tls.enable_early_data = early;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = crate::transport_config_with(self.congestion);
        transport.pad_to_mtu(self.pad_to_mtu);
        config.transport_config(Arc::new(transport));
        let connecting = self.endpoint.connect_with(config, remote, server_name)?;
        let connecting = if early {
            match connecting.into_0rtt() {
                Ok((conn, accepted)) => return Ok(Dialed::Early { conn, accepted }),
                Err(c) => c,
            }
        } else {
            connecting
        };
        let conn = connecting
            .await
            .with_context(|| format!("QUIC connect to {remote}"))?;
        Ok(Dialed::Full(conn))
    }

    fn config(&self, alpn: &[u8]) -> anyhow::Result<quinn::ClientConfig> {
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Verifier::new(self.verify.clone()))
            .with_no_client_auth();
        tls.alpn_protocols = vec![alpn.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = crate::transport_config_with(self.congestion);
        transport.pad_to_mtu(self.pad_to_mtu);
        config.transport_config(Arc::new(transport));
        Ok(config)
    }

    /// Connects to a `moqt://`, `https://`, `ws://` or `wss://` URL.
    pub async fn connect(&self, url: &Url) -> anyhow::Result<Connected> {
        self.connect_draft(url, None).await
    }

    /// Like [`Client::connect`], speaking `draft` (14 or 16) to the server
    /// when given: ALPN or subprotocol `moq-00`/`moqt-16`, and a
    /// [`crate::legacy`] bridge so the session returned speaks draft 18.
    pub async fn connect_draft(
        &self,
        url: &Url,
        draft: Option<moqt::legacy::Draft>,
    ) -> anyhow::Result<Connected> {
        let alpn = draft.map_or(moqt::ALPN, |d| d.alpn());
        if draft.is_some() && !matches!(url.scheme(), "moqt" | "https") {
            anyhow::bail!("drafts before 18 run over moqt:// and https:// only");
        }
        let bridge = |s: Session| async move {
            match draft {
                Some(d) => crate::legacy::connect(s, d).await,
                None => Ok(s),
            }
        };
        let host = url.host_str().context("URL has no host")?.to_string();
        let port = url.port_or_known_default().unwrap_or(443);
        let to = |remote: SocketAddr| match url.port() {
            Some(_) => format!("QUIC connect to {remote} ({url})"),
            None => format!(
                "QUIC connect to {remote} ({url} names no port, so 443; \
                 `quichub relay` listens on 4443 unless told otherwise)"
            ),
        };
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
            .await
            .with_context(|| format!("resolve {host}"))?
            .collect();
        let local_v4 = self.endpoint.local_addr().map_or(true, |a| a.is_ipv4());
        let remote =
            pick_remote(&addrs, local_v4).with_context(|| format!("no address for {host}"))?;
        let ip = host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[');
        let server_name = match (&self.verify, ip) {
            // A CA-signed certificate is checked for the address itself.
            (crate::tls::Verify::Roots(_), true) => host.trim_matches(['[', ']']).to_string(),
            // Pinned or unchecked: the name only goes into the ClientHello.
            (_, true) => "localhost".to_string(),
            (_, false) => host.clone(),
        };
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let mut path = url.path().to_string();
        if let Some(q) = url.query() {
            path.push('?');
            path.push_str(q);
        }
        match url.scheme() {
            "moqt" => {
                let conn = self
                    .endpoint
                    .connect_with(self.config(alpn.as_bytes())?, remote, &server_name)?
                    .await
                    .with_context(|| to(remote))?;
                Ok(Connected {
                    session: bridge(web_transport_quinn::Session::raw(conn).into()).await?,
                    transport: Transport::Quic,
                    authority,
                    path,
                    remote,
                })
            }
            "https" => {
                let conn = self
                    .endpoint
                    .connect_with(self.config(b"h3")?, remote, &server_name)?
                    .await
                    .with_context(|| to(remote))?;
                let request = ConnectRequest::new(url.clone()).with_protocol(alpn);
                let session = web_transport_quinn::Session::connect(conn, request)
                    .await
                    .context("WebTransport CONNECT")?;
                Ok(Connected {
                    session: bridge(session.into()).await?,
                    transport: Transport::WebTransport,
                    authority,
                    path,
                    remote,
                })
            }
            "ws" | "wss" => {
                let tls = match url.scheme() {
                    "wss" => Some(crate::client::tcp_client_config(
                        self.verify.clone(),
                        &[b"http/1.1"],
                    )?),
                    _ => None,
                };
                let session = crate::websocket::connect(url, remote, &server_name, tls).await?;
                Ok(Connected {
                    session,
                    transport: Transport::WebSocket,
                    authority,
                    path,
                    remote,
                })
            }
            other => anyhow::bail!(
                "unsupported URL scheme {other:?} (use moqt://, https://, ws:// or wss://)"
            ),
        }
    }

    /// Closes the endpoint.
    pub fn close(&self) {
        self.endpoint.close(0u32.into(), b"");
    }

    /// Waits until every connection of this endpoint has closed and its
    /// CONNECTION_CLOSE has gone out.
    pub async fn wait_idle(&self) {
        self.endpoint.wait_idle().await
    }
}

/// The address to dial among those a name resolves to: the first of the
/// endpoint's family (an IPv4 socket cannot reach `::1`, which `localhost`
/// often resolves to first), else the first.
fn pick_remote(addrs: &[SocketAddr], local_is_ipv4: bool) -> Option<SocketAddr> {
    addrs
        .iter()
        .find(|a| a.is_ipv4() == local_is_ipv4)
        .or(addrs.first())
        .copied()
}

#[cfg(test)]
mod pick_remote_tests {
    use super::*;

    #[test]
    fn dials_the_endpoints_family_first() {
        let v6: SocketAddr = "[::1]:4443".parse().unwrap();
        let v4: SocketAddr = "127.0.0.1:4443".parse().unwrap();
        assert_eq!(pick_remote(&[v6, v4], true), Some(v4));
        assert_eq!(pick_remote(&[v4, v6], false), Some(v6));
        assert_eq!(pick_remote(&[v6], true), Some(v6));
        assert_eq!(pick_remote(&[], true), None);
    }
}
