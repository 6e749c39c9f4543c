//! A handshake flood, as an attacker sends one: real QUIC Initial packets
//! (each a fresh connection with its own ClientHello) from a client that never
//! reads the server's replies, so no handshake ever completes. This is what a
//! spoofed-source flood looks like to a server. Used by the hardening tests
//! and `quichub-bench conn --flood`; aim it only at servers you run.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use crate::tls::{provider, Verifier, Verify};

/// A UDP socket that sends but never receives.
#[derive(Debug)]
struct Deaf(Arc<dyn AsyncUdpSocket>);

impl AsyncUdpSocket for Deaf {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.0.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> std::io::Result<()> {
        self.0.try_send(transmit)
    }

    fn poll_recv(
        &self,
        _cx: &mut Context,
        _bufs: &mut [std::io::IoSliceMut<'_>],
        _meta: &mut [RecvMeta],
    ) -> Poll<std::io::Result<usize>> {
        // Never ready, never woken: replies are left in the kernel's buffer.
        Poll::Pending
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// A client endpoint whose handshakes never complete.
pub struct Flooder {
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    target: SocketAddr,
    pending: Vec<quinn::Connecting>,
}

impl Flooder {
    /// A flooder of `target`, offering `alpn`, from an OS-assigned loopback or
    /// wildcard port (of the same family as `target`).
    pub fn new(target: SocketAddr, alpn: &[u8]) -> anyhow::Result<Self> {
        let bind: SocketAddr = if target.is_ipv6() {
            "[::]:0".parse()?
        } else {
            "0.0.0.0:0".parse()?
        };
        let runtime = quinn::default_runtime().context("no async runtime")?;
        let socket = runtime.wrap_udp_socket(std::net::UdpSocket::bind(bind)?)?;
        let endpoint = quinn::Endpoint::new_with_abstract_socket(
            quinn::EndpointConfig::default(),
            None,
            Arc::new(Deaf(socket)),
            runtime,
        )?;
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Verifier::new(Verify::Insecure))
            .with_no_client_auth();
        tls.alpn_protocols = vec![alpn.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
        Ok(Self {
            endpoint,
            config: quinn::ClientConfig::new(Arc::new(crypto)),
            target,
            pending: Vec::new(),
        })
    }

    /// Starts one more handshake (its Initial packet goes out at once). The
    /// attempt is kept so the client does not abandon it.
    pub fn send_one(&mut self) -> anyhow::Result<()> {
        let c = self
            .endpoint
            .connect_with(self.config.clone(), self.target, "localhost")?;
        self.pending.push(c);
        Ok(())
    }

    /// Sends `rate` attempts per second for `duration`; returns how many were sent.
    pub async fn run(&mut self, rate: u32, duration: Duration) -> anyhow::Result<u64> {
        anyhow::ensure!(rate > 0, "rate must be positive");
        let start = Instant::now();
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while start.elapsed() < duration {
            tick.tick().await;
            let due = (start.elapsed().as_secs_f64() * f64::from(rate)) as u64;
            while sent < due {
                self.send_one()?;
                sent += 1;
            }
        }
        Ok(sent)
    }
}
