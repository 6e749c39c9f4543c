//! `Hub::reload` (SIGHUP): new certificate files are presented to new
//! connections, QUIC and TLS over TCP alike, while sessions already up keep
//! working; the `[auth]` section is re-read from the file.

use std::time::Duration;

use quichub_client::{ClientSession, ConnectOptions, Verify};
use quichub_hub::{Config, Hub};
use quichub_net::tls::Identity;

fn write_identity(dir: &std::path::Path) -> String {
    let id = Identity::self_signed(&["localhost"]).unwrap();
    id.write_pem(&dir.join("cert.pem"), &dir.join("key.pem"))
        .unwrap();
    id.fingerprint_hex()
}

fn opts(fingerprint: &str) -> ConnectOptions {
    ConnectOptions {
        verify: Verify::Fingerprints(vec![quichub_net::tls::unhex(fingerprint).unwrap()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        timeout: Duration::from_secs(5),
        endpoint: None,
        draft: None,
    }
}

/// The SHA-256 of the certificate the MQTT-over-TLS listener presents.
async fn tls_fingerprint(addr: std::net::SocketAddr) -> String {
    let tls = quichub_net::client::tcp_client_config(Verify::Insecure, &[b"mqtt"]).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let cert = &stream.get_ref().1.peer_certificates().unwrap()[0];
    quichub_net::tls::hex(&quichub_net::tls::sha256(cert))
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("step timed out")
}

#[tokio::test]
async fn reload_swaps_the_certificate_and_keeps_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let old = write_identity(dir.path());
    let file = dir.path().join("quichub.toml");
    let mut config = Config::default();
    config.quic.bind = "127.0.0.1:0".into();
    config.mqtt.tcp = "127.0.0.1:0".into();
    config.mqtt.tls = "127.0.0.1:0".into();
    config.http.address = "off".into();
    config.metrics.address = "off".into();
    config.store.data_dir = Some("off".into());
    config.tls.cert = Some(dir.path().join("cert.pem"));
    config.tls.key = Some(dir.path().join("key.pem"));
    config.auth.public = vec!["before".into()];
    std::fs::write(&file, config.to_toml()).unwrap();
    let config = Config::load(&file).unwrap();
    let hub = Hub::start(config).await.unwrap();
    assert_eq!(hub.fingerprint(), old);
    let url = format!("moqt://127.0.0.1:{}/t", hub.addr().port());
    let tls_addr = hub.mqtt_tls_addr().unwrap();
    assert_eq!(within(tls_fingerprint(tls_addr)).await, old);

    // A session up before the reload.
    let before = within(ClientSession::connect(&url, opts(&old)))
        .await
        .unwrap();
    let _a = within(before.publish_namespace(moqt::TrackNamespace::from_path("before/one")))
        .await
        .unwrap();

    // A broken pair refuses the whole reload (as it would refuse a start):
    // the old certificate stays, and so does the old [auth].
    std::fs::write(dir.path().join("key.pem"), "not a key").unwrap();
    let mut refused = Config::load(&file).unwrap();
    refused.auth.public = vec!["refused".into()];
    std::fs::write(&file, refused.to_toml()).unwrap();
    let e = format!("{:#}", hub.reload().unwrap_err());
    assert!(
        e.contains("fails startup's checks") && e.contains("tls.key"),
        "{e}"
    );
    assert_eq!(hub.fingerprint(), old);
    assert_eq!(hub.auth_config().read().unwrap().public, ["before"]);

    let new = write_identity(dir.path());
    assert_ne!(new, old);
    let mut changed = Config::load(&file).unwrap();
    changed.auth.public = vec!["after".into()];
    std::fs::write(&file, changed.to_toml()).unwrap();
    hub.reload().unwrap();
    assert_eq!(hub.fingerprint(), new);
    assert_eq!(hub.auth_config().read().unwrap().public, ["after"]);

    // New connections see the new certificate, over QUIC and TLS over TCP.
    let after = within(ClientSession::connect(&url, opts(&new)))
        .await
        .unwrap();
    assert!(
        within(ClientSession::connect(&url, opts(&old)))
            .await
            .is_err(),
        "a client pinning the old certificate is refused"
    );
    assert_eq!(within(tls_fingerprint(tls_addr)).await, new);
    let _b = within(after.publish_namespace(moqt::TrackNamespace::from_path("after/two")))
        .await
        .unwrap();

    // The session from before the reload still works, under the reloaded
    // rules: the revoked public prefix no longer authorises it, the new one does.
    let _c = within(before.publish_namespace(moqt::TrackNamespace::from_path("after/three")))
        .await
        .unwrap();
    let e = within(before.publish_namespace(moqt::TrackNamespace::from_path("before/four")))
        .await
        .err()
        .expect("a revoked prefix is refused");
    assert!(e.to_string().contains("not authorized"), "{e}");
    assert_eq!(hub.relay().session_count(), 2);
    hub.shutdown().await;
}

/// A configuration file that no longer parses leaves `[auth]` as it was.
#[tokio::test]
async fn a_broken_file_keeps_the_auth_in_effect() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quichub.toml");
    std::fs::write(
        &file,
        "[quic]\nbind = \"127.0.0.1:0\"\n[mqtt]\ntcp = \"off\"\n[http]\naddress = \"off\"\n\
         [metrics]\naddress = \"off\"\n[store]\ndata_dir = \"off\"\n[auth]\npublic = [\"x\"]\n",
    )
    .unwrap();
    let hub = Hub::start(Config::load(&file).unwrap()).await.unwrap();
    std::fs::write(&file, "[auth]\npublik = [\"y\"]\n").unwrap();
    let e = hub.reload().unwrap_err().to_string();
    assert!(e.contains("quichub.toml:2:1"), "{e}");
    assert_eq!(hub.auth_config().read().unwrap().public, ["x"]);
}
