//! TLS client certificates (mosquitto's `cafile`, `require_certificate`,
//! `use_identity_as_username`) on MQTT over TLS, driven by `mosquitto_pub`,
//! and on MQTT over QUIC, driven by a quinn client; the CA and every
//! certificate are made by the `openssl` command line in the test. With
//! `use_identity_as_username` the certificate's CN is the `acl_file` user.

use quichub_testkit as common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::pki::Pki;
use common::{mqtt_tools, within};
use quichub_gateway::Broker;
use quichub_net::server::{Server, ALPN_MQTT};
use quichub_net::tls::{ClientCertConfig, Identity};
use quichub_relay::endpoint::{AlpnHandler, AlpnHandlers};
use quichub_relay::{Config, Relay};
use web_transport_quinn::quinn;
use web_transport_quinn::quinn::rustls;

/// A CA, a server certificate for localhost, and client certificates it
/// signed (`client`, CN sensor-1; `nocn`, without a CN).
fn make_pki(name: &str) -> Pki {
    let pki = Pki::temp(name);
    pki.server()
        .leaf(
            "client",
            "/O=quichub/CN=sensor-1",
            "extendedKeyUsage=clientAuth\n",
        )
        .leaf("nocn", "/O=quichub", "extendedKeyUsage=clientAuth\n");
    pki
}

/// A broker on MQTT over TLS and MQTT over QUIC, both with `clients`.
struct Gateway {
    broker: Arc<Broker>,
    tls: SocketAddr,
    udp: SocketAddr,
    _server: Arc<Server>,
}

async fn gateway(pki: &Pki, clients: ClientCertConfig) -> Gateway {
    let identity =
        Identity::from_pem_files(&pki.path("server.pem"), &pki.path("server.key")).unwrap();
    let broker = Broker::new(quichub_gateway::BrokerConfig::default());
    let cfg = Arc::new(quichub_gateway::ConnConfig::default());
    let tls_config =
        quichub_net::tls::tcp_server_config_with_clients(&identity, &[b"mqtt"], &clients).unwrap();
    let clients = Arc::new(clients);
    let tls = quichub_gateway::listener::spawn_tls_clients(
        "127.0.0.1:0".parse().unwrap(),
        broker.clone(),
        cfg.clone(),
        tls_config,
        quichub_net::tcp_limits::TcpLimits::default().limiter("mqtt-tls", 1),
        clients.clone(),
    )
    .await
    .unwrap();
    let server = Arc::new(
        Server::bind_clients(
            "127.0.0.1:0".parse().unwrap(),
            &identity,
            None,
            &Default::default(),
            &clients,
        )
        .unwrap(),
    );
    let udp = server.local_addr().unwrap();
    let b = broker.clone();
    let handler: AlpnHandler = Arc::new(move |conn| {
        Box::pin(quichub_gateway::quic::serve_quic_clients(
            conn,
            b.clone(),
            cfg.clone(),
            clients.clone(),
        ))
    });
    let mut handlers = AlpnHandlers::new();
    handlers.insert(ALPN_MQTT.to_vec(), handler);
    tokio::spawn(quichub_relay::endpoint::accept_loop_with(
        Relay::new(Config::default()),
        server.clone(),
        handlers,
    ));
    Gateway {
        broker,
        tls,
        udp,
        _server: server,
    }
}

/// `mosquitto_pub` over TLS, retaining `message` on `topic`, with the
/// client certificate `cert` (`NAME` of `NAME.pem`/`NAME.key`) if any;
/// whether it succeeded.
async fn mosquitto_pub(pki: &Pki, gw: &Gateway, cert: Option<&str>, topic: &str) -> bool {
    let mut cmd = tokio::process::Command::new("mosquitto_pub");
    cmd.args(["-h", "localhost", "-p", &gw.tls.port().to_string()])
        .args(["--cafile", &pki.s("ca.pem"), "-q", "1", "-r"])
        .args(["-t", topic, "-m", "hello", "-u", "ignored", "-P", "ignored"]);
    if let Some(c) = cert {
        cmd.args(["--cert", &pki.s(&format!("{c}.pem"))])
            .args(["--key", &pki.s(&format!("{c}.key"))]);
    }
    let out = within(20, cmd.output()).await.unwrap();
    out.status.success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_over_tls_needs_a_certificate_from_the_ca() {
    if mqtt_tools().is_none() {
        return;
    }
    let pki = make_pki("tls");
    let gw = gateway(
        &pki,
        ClientCertConfig {
            cafile: Some(pki.path("ca.pem")),
            require_certificate: true,
            use_identity_as_username: true,
        },
    )
    .await;
    assert!(mosquitto_pub(&pki, &gw, Some("client"), "certs/a").await);
    assert_eq!(
        &gw.broker.retained("certs/a").expect("published").payload[..],
        b"hello"
    );
    // No certificate: the handshake fails.
    assert!(!mosquitto_pub(&pki, &gw, None, "certs/b").await);
    // A certificate without a CN has no identity to be the user name:
    // refused at CONNECT.
    assert!(!mosquitto_pub(&pki, &gw, Some("nocn"), "certs/c").await);
    assert!(gw.broker.retained("certs/b").is_none());
    assert!(gw.broker.retained("certs/c").is_none());
    let text = gw.broker.render_metrics();
    assert!(
        text.contains("quichub_mqtt_connections_total{transport=\"tls\"} 1\n"),
        "{text}"
    );
}

/// A QUIC client trusting the test CA, presenting `cert` if any.
fn quic_client(pki: &Pki, cert: Option<&str>, alpn: &[u8]) -> quinn::Endpoint {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.path("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots);
    let mut tls = match cert {
        Some(c) => {
            let chain = CertificateDer::pem_file_iter(pki.path(&format!("{c}.pem")))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(pki.path(&format!("{c}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![alpn.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    ep
}

/// Connects over QUIC, sends an MQTT 3.1.1 CONNECT and returns the CONNACK.
async fn quic_connack(pki: &Pki, gw: &Gateway, cert: Option<&str>) -> Vec<u8> {
    let ep = quic_client(pki, cert, ALPN_MQTT);
    let conn = within(10, ep.connect(gw.udp, "localhost").unwrap())
        .await
        .unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    // CONNECT, MQTT 3.1.1, clean session, client `q`.
    send.write_all(&[
        0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 1, b'q',
    ])
    .await
    .unwrap();
    let mut connack = vec![0; 4];
    within(10, recv.read_exact(&mut connack)).await.unwrap();
    connack
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_over_quic_refuses_a_client_without_a_certificate_at_connect() {
    if common::openssl().is_none() {
        return;
    }
    let pki = make_pki("quic");
    let gw = gateway(
        &pki,
        ClientCertConfig {
            cafile: Some(pki.path("ca.pem")),
            require_certificate: true,
            use_identity_as_username: true,
        },
    )
    .await;
    assert_eq!(
        quic_connack(&pki, &gw, Some("client")).await,
        [0x20, 2, 0, 0]
    );
    // The handshake lets it in (other protocols share the endpoint); the
    // MQTT session does not: Not authorized.
    assert_eq!(quic_connack(&pki, &gw, None).await, [0x20, 2, 0, 5]);
    // No CN: Bad user name or password.
    assert_eq!(quic_connack(&pki, &gw, Some("nocn")).await, [0x20, 2, 0, 4]);
    // require_certificate holds on every ALPN of the endpoint: a MoQT
    // (raw QUIC, any draft) or HTTP/3 (WebTransport, the HTTP API)
    // connection without a certificate is closed right after its
    // handshake, UNAUTHORIZED / H3_REQUEST_REJECTED; with one it stays.
    for (alpn, code) in [
        (moqt::ALPN.as_bytes(), 0x2u32),
        (b"moqt-16".as_slice(), 0x2),
        (b"h3".as_slice(), 0x10b),
    ] {
        let ep = quic_client(&pki, None, alpn);
        let conn = within(10, ep.connect(gw.udp, "localhost").unwrap()).await;
        let e = match conn {
            Ok(c) => within(10, c.closed()).await,
            Err(e) => e,
        };
        match &e {
            quinn::ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code, code.into(), "{e}");
                assert_eq!(&c.reason[..], b"client certificate required", "{e}");
            }
            other => panic!("{}: {other}", String::from_utf8_lossy(alpn)),
        }
        let ep = quic_client(&pki, Some("client"), alpn);
        let conn = within(10, ep.connect(gw.udp, "localhost").unwrap())
            .await
            .unwrap();
        let still =
            tokio::time::timeout(std::time::Duration::from_millis(300), conn.closed()).await;
        assert!(still.is_err(), "closed with a certificate: {still:?}");
    }
    assert_eq!(
        gw._server
            .stats()
            .no_certificate
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    let text = gw.broker.render_metrics();
    assert!(
        text.contains("quichub_mqtt_connections_total{transport=\"quic\"} 1\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_name_is_the_acl_user() {
    if mqtt_tools().is_none() {
        return;
    }
    let pki = make_pki("acl");
    let gw = gateway(
        &pki,
        ClientCertConfig {
            cafile: Some(pki.path("ca.pem")),
            require_certificate: true,
            use_identity_as_username: true,
        },
    )
    .await;
    // The client certificate's CN is `sensor-1`: its rules are that user's.
    std::fs::write(
        pki.path("acl"),
        "user sensor-1\ntopic write certs/sensor-1/#\n\nuser other\ntopic write certs/#\n",
    )
    .unwrap();
    let auth = quichub_auth::AuthConfig {
        acl_file: Some(pki.path("acl")),
        ..Default::default()
    };
    gw.broker.set_auth(quichub_auth::SharedAuth::new(
        quichub_auth::Auth::load(&auth).unwrap(),
    ));
    assert!(mosquitto_pub(&pki, &gw, Some("client"), "certs/sensor-1/t").await);
    assert!(gw.broker.retained("certs/sensor-1/t").is_some());
    // 3.1.1: acknowledged and dropped (as mosquitto does).
    assert!(mosquitto_pub(&pki, &gw, Some("client"), "certs/sensor-2/t").await);
    assert!(gw.broker.retained("certs/sensor-2/t").is_none());
    let m = &gw.broker.auth().metrics;
    assert_eq!(m.get("mqtt", true, "certificate"), 2);
    assert_eq!(m.get("mqtt", false, "not_authorized"), 1);
}

/// `tls.require_certificate` on the hub's HTTPS listener too: curl without
/// a client certificate fails the handshake, with one it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_needs_a_certificate_when_required() {
    if common::openssl().is_none() {
        return;
    }
    let pki = make_pki("https");
    let mut c = quichub_hub::Config::default();
    c.quic.bind = "127.0.0.1:0".into();
    c.mqtt.tcp = "off".into();
    c.mqtt.tls = "off".into();
    c.http.address = "off".into();
    c.http.tls = "127.0.0.1:0".into();
    c.metrics.address = "off".into();
    c.store.data_dir = Some("off".into());
    c.tls.cert = Some(pki.path("server.pem"));
    c.tls.key = Some(pki.path("server.key"));
    c.tls.client_ca = Some(pki.path("ca.pem"));
    c.tls.require_certificate = true;
    let hub = quichub_hub::Hub::start(c).await.unwrap();
    let url = format!(
        "https://localhost:{}/v1/time",
        hub.https_addr().unwrap().port()
    );
    let curl = |cert: Option<&str>| {
        let mut cmd = tokio::process::Command::new("curl");
        cmd.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["--cacert", &pki.s("ca.pem"), &url]);
        if let Some(c) = cert {
            cmd.args(["--cert", &pki.s(&format!("{c}.pem"))])
                .args(["--key", &pki.s(&format!("{c}.key"))]);
        }
        cmd.kill_on_drop(true);
        within(20, cmd.output())
    };
    let with = curl(Some("client")).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&with.stdout), "200", "{with:?}");
    let without = curl(None).await.unwrap();
    assert!(!without.status.success(), "{without:?}");
    assert_eq!(
        String::from_utf8_lossy(&without.stdout),
        "000",
        "{without:?}"
    );
}
