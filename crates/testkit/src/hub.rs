//! Hubs on loopback: what `quichub relay` starts ([`Hub::start`]) on
//! OS-assigned ports with no state on disk, with handles on its relay,
//! broker and HTTP API, and raw sessions for hand-made bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quichub_client::{ClientSession, ConnectOptions, Verify};
use quichub_hub::Hub;
use quichub_net::server::Server;
use quichub_relay::{Config, Relay};

use crate::until_async;

/// What `quichub relay` starts ([`Hub::start`]), on OS-assigned loopback
/// ports, with no state on disk and the listeners a test does not ask for off.
pub fn test_config() -> quichub_hub::Config {
    let mut c = quichub_hub::Config::default();
    c.quic.bind = "127.0.0.1:0".into();
    c.quic.http3 = false;
    c.mqtt.tcp = "off".into();
    c.mqtt.tls = "off".into();
    c.http.address = "off".into();
    c.metrics.address = "off".into();
    c.store.data_dir = Some("off".into());
    c
}

pub struct TestRelay {
    pub addr: SocketAddr,
    pub relay: Arc<Relay>,
    pub server: Arc<Server>,
    pub fingerprint: Vec<u8>,
    pub hub: Arc<Hub>,
}

impl TestRelay {
    pub async fn start() -> Self {
        Self::with_config(Config::default()).await
    }

    pub async fn with_config(config: Config) -> Self {
        Self::with_quic(config, quichub_net::QuicConfig::default()).await
    }

    /// A relay with these relay and QUIC limits.
    pub async fn with_quic(config: Config, quic: quichub_net::QuicConfig) -> Self {
        let mut c = test_config();
        c.relay = config;
        c.quic.limits = quic;
        Self::with_hub_config(c).await
    }

    /// A hub started with `config` (see [`test_config`]).
    pub async fn with_hub_config(config: quichub_hub::Config) -> Self {
        let hub = Hub::start(config).await.unwrap();
        Self {
            addr: hub.addr(),
            relay: hub.relay().clone(),
            server: hub.server().clone(),
            fingerprint: quichub_net::tls::unhex(&hub.fingerprint()).unwrap(),
            hub: Arc::new(hub),
        }
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}/test", self.addr.port())
    }

    pub fn opts(&self) -> ConnectOptions {
        ConnectOptions {
            verify: Verify::Fingerprints(vec![self.fingerprint.clone()]),
            bind: "127.0.0.1:0".parse().unwrap(),
            timeout: Duration::from_secs(5),
            endpoint: None,
            draft: None,
        }
    }

    pub async fn client(&self, scheme: &str) -> ClientSession {
        ClientSession::connect(&self.url(scheme), self.opts())
            .await
            .unwrap()
    }

    /// A raw QUIC session with ALPN `alpn` (`moqt-16`, `moq-00`) and nothing
    /// on it: hand-made bytes of an older draft reach the relay's bridge.
    pub async fn raw_alpn(&self, alpn: &str) -> quichub_net::Session {
        let c = quichub_net::client::Client::new("127.0.0.1:0".parse().unwrap(), Verify::Insecure)
            .unwrap();
        let dialed = c
            .dial(self.addr, "localhost", alpn.as_bytes(), false)
            .await
            .unwrap();
        let conn = dialed.connection().clone();
        std::mem::forget(c);
        web_transport_quinn::Session::raw(conn).into()
    }

    /// A raw WebTransport session whose CONNECT offers `protocols` as
    /// subprotocols (none: a draft-14 client, which negotiates in
    /// CLIENT_SETUP, or an older browser), with nothing on it.
    pub async fn raw_webtransport(&self, protocols: &[&str]) -> quichub_net::Session {
        let c = quichub_net::client::Client::new("127.0.0.1:0".parse().unwrap(), Verify::Insecure)
            .unwrap();
        let dialed = c.dial(self.addr, "localhost", b"h3", false).await.unwrap();
        let conn = dialed.connection().clone();
        std::mem::forget(c);
        let url = url::Url::parse(&self.url("https")).unwrap();
        let request = web_transport_quinn::proto::ConnectRequest::new(url)
            .with_protocols(protocols.iter().map(|p| p.to_string()));
        web_transport_quinn::Session::connect(conn, request)
            .await
            .unwrap()
            .into()
    }

    /// A raw transport session with no MoQT on it, for hand-made bytes.
    pub async fn raw(&self, scheme: &str) -> quichub_net::Session {
        let c = quichub_net::client::Client::new("127.0.0.1:0".parse().unwrap(), Verify::Insecure)
            .unwrap();
        let url = url::Url::parse(&self.url(scheme)).unwrap();
        let s = c.connect(&url).await.unwrap().session;
        // Keep the endpoint alive as long as the session (leaked on purpose in tests).
        std::mem::forget(c);
        s
    }
}

/// A relay with the MQTT broker bridged onto it, MQTT on an OS-assigned TCP port
/// (and over QUIC on the relay's port).
pub struct TestGateway {
    pub relay: TestRelay,
    pub broker: Arc<quichub_gateway::Broker>,
    pub bridge: Arc<quichub_gateway::bridge::Bridge>,
    pub mqtt: SocketAddr,
}

impl TestGateway {
    pub async fn start() -> Self {
        Self::with(
            quichub_gateway::BrokerConfig::default(),
            quichub_gateway::ConnConfig::default(),
        )
        .await
    }

    pub async fn with(
        broker: quichub_gateway::BrokerConfig,
        conn: quichub_gateway::ConnConfig,
    ) -> Self {
        let mut c = test_config();
        c.mqtt.broker = broker;
        c.mqtt.set_conn_config(&conn);
        Self::with_hub_config(c).await
    }

    /// A gateway whose relay endpoint also serves the HTTP API over HTTP/3
    /// (ALPN `h3`, beside WebTransport).
    pub async fn with_http3(
        config: quichub_gateway::http::ApiConfig,
    ) -> (Self, Arc<quichub_gateway::http::Api>) {
        let mut c = test_config();
        c.quic.http3 = true;
        c.http.set_api_config(&config);
        let gw = Self::with_hub_config(c).await;
        let api = gw.relay.hub.http_api().clone();
        (gw, api)
    }

    /// A hub started with `config` and the broker on (MQTT over TCP on an
    /// OS-assigned port unless `config` says otherwise).
    pub async fn with_hub_config(mut config: quichub_hub::Config) -> Self {
        if config.mqtt.tcp == "off" {
            config.mqtt.tcp = "127.0.0.1:0".into();
        }
        let relay = TestRelay::with_hub_config(config).await;
        let hub = relay.hub.clone();
        Self {
            broker: hub.broker().clone(),
            bridge: hub.bridge().clone(),
            mqtt: hub.mqtt_addr().unwrap(),
            relay,
        }
    }
}

/// A hand-driven subscriber: a raw session that sends SETUP and one
/// SUBSCRIBE, and never reads a data stream. Returns the session, its control
/// stream and the request stream (keep them alive as long as needed).
pub struct RawSubscriber {
    pub session: quichub_net::Session,
    pub control: quichub_net::SendStream,
    pub send: quichub_net::SendStream,
    pub recv: quichub_net::RecvStream,
}

impl TestRelay {
    pub async fn raw_subscriber(&self, track: moqt::FullTrackName) -> RawSubscriber {
        use moqt::message::{Message, Subscribe};
        let session = self.raw("moqt").await;
        let mut control = session.open_uni().await.unwrap();
        let setup = moqt::session::make_setup("raw", Some("127.0.0.1"), Some("/"));
        control
            .write_all(&Message::Setup(setup).to_bytes())
            .await
            .unwrap();
        let (mut send, recv) = session.open_bi().await.unwrap();
        let sub = Message::Subscribe(Subscribe {
            request_id: 0,
            track,
            params: moqt::Parameters::default(),
        });
        send.write_all(&sub.to_bytes()).await.unwrap();
        RawSubscriber {
            session,
            control,
            send,
            recv,
        }
    }
}

/// Waits (at most 15 s) until `relay` knows namespace `ns`.
pub async fn knows(relay: &TestRelay, ns: &str) {
    let ns = moqt::TrackNamespace::from_path(ns);
    until_async(15, || {
        let known = relay
            .relay
            .snapshot()
            .namespaces
            .iter()
            .any(|n| n.namespace == ns);
        async move { known }
    })
    .await;
}

/// The HTTP pub/sub API of a [`TestGateway`], HTTP/1.1 and HTTP/2 on an
/// OS-assigned loopback TCP port.
pub struct TestHttp {
    pub api: Arc<quichub_gateway::http::Api>,
    pub addr: SocketAddr,
    pub limiter: Arc<quichub_net::tcp_limits::ConnLimiter>,
}

impl TestHttp {
    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl TestGateway {
    /// Starts the HTTP API on this gateway's broker and bridge.
    pub async fn http(&self, config: quichub_gateway::http::ApiConfig) -> TestHttp {
        self.http_with(config, quichub_net::tcp_limits::TcpLimits::default())
            .await
    }

    /// Starts the HTTP API within `limits` (one listener's share).
    pub async fn http_with(
        &self,
        config: quichub_gateway::http::ApiConfig,
        limits: quichub_net::tcp_limits::TcpLimits,
    ) -> TestHttp {
        let api =
            quichub_gateway::http::Api::new(self.broker.clone(), Some(self.bridge.clone()), config);
        let limiter = limits.limiter("http", 1);
        let addr = quichub_gateway::http::tcp::spawn_tcp_with(
            "127.0.0.1:0".parse().unwrap(),
            api.clone(),
            limits,
            limiter.clone(),
        )
        .await
        .unwrap();
        TestHttp { api, addr, limiter }
    }
}
