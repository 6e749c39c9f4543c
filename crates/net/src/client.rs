//! Client connections by URL: `moqt://host:port/path` for raw QUIC,
//! `https://host:port/path` for WebTransport.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use url::Url;
use web_transport_quinn::proto::ConnectRequest;
use web_transport_quinn::Session;

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
}

/// A client endpoint that can open many connections (one UDP socket).
#[derive(Clone)]
pub struct Client {
    endpoint: quinn::Endpoint,
    verify: Verify,
}

impl Client {
    /// Binds an ephemeral UDP socket on the loopback or any address.
    pub fn new(bind: SocketAddr, verify: Verify) -> anyhow::Result<Self> {
        let socket = crate::server::bind_udp(bind).context("bind client UDP socket")?;
        let runtime = quinn::default_runtime().context("no async runtime")?;
        let endpoint =
            quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, runtime)?;
        Ok(Self { endpoint, verify })
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
        config.transport_config(Arc::new(crate::transport_config()));
        Ok(config)
    }

    /// Connects to a `moqt://` or `https://` URL.
    pub async fn connect(&self, url: &Url) -> anyhow::Result<Connected> {
        let host = url.host_str().context("URL has no host")?.to_string();
        let port = url.port().unwrap_or(443);
        let remote = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
            .await
            .with_context(|| format!("resolve {host}"))?
            .next()
            .with_context(|| format!("no address for {host}"))?;
        let server_name = if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
            "localhost".to_string()
        } else {
            host.clone()
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
                    .connect_with(self.config(moqt::ALPN.as_bytes())?, remote, &server_name)?
                    .await
                    .with_context(|| format!("QUIC connect to {remote}"))?;
                Ok(Connected {
                    session: Session::raw(conn),
                    transport: Transport::Quic,
                    authority,
                    path,
                })
            }
            "https" => {
                let conn = self
                    .endpoint
                    .connect_with(self.config(b"h3")?, remote, &server_name)?
                    .await
                    .with_context(|| format!("QUIC connect to {remote}"))?;
                let request = ConnectRequest::new(url.clone()).with_protocol(moqt::ALPN);
                let session = Session::connect(conn, request)
                    .await
                    .context("WebTransport CONNECT")?;
                Ok(Connected {
                    session,
                    transport: Transport::WebTransport,
                    authority,
                    path,
                })
            }
            other => anyhow::bail!("unsupported URL scheme {other:?} (use moqt:// or https://)"),
        }
    }

    /// Closes the endpoint.
    pub fn close(&self) {
        self.endpoint.close(0u32.into(), b"");
    }
}
