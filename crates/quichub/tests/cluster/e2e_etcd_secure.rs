//! The cluster registry secured: relays reach a real etcd (started here)
//! over TLS with client certificates and a user and password; those with
//! wrong credentials are refused at startup with an error that names the
//! setting.

use quichub_testkit as common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::etcd::{etcd_binary, Etcd, EtcdTlsFiles};
use common::pki::Pki;
use common::{knows, test_config, until_async, within, TestRelay};
use moqt::TrackNamespace;

/// A CA, etcd's certificate for 127.0.0.1, and a client certificate.
fn pki(dir: &Path) -> EtcdTlsFiles {
    Pki::ca_in(dir)
        .leaf(
            "etcd",
            "/CN=etcd",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .leaf(
            "client",
            "/CN=quichub-relay",
            "extendedKeyUsage=clientAuth\n",
        );
    EtcdTlsFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join("etcd.pem"),
        key: dir.join("etcd.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    }
}

/// Every key under `prefix` (the harness authenticates as root).
async fn keys(etcd: &Etcd, prefix: &str) -> Vec<String> {
    etcd.keys(prefix).await
}

/// A relay registered over TLS with a client certificate as `relay` with
/// the right password; with a wrong password, or without its certificate,
/// it does not start, and says which setting is wrong; a relay of another
/// prefix than its role allows is refused too. The two that start find
/// each other and share a namespace, and keep working after etcd restarts
/// (which forgets their authentication: they authenticate again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_use_an_etcd_with_tls_client_certificates_and_a_password() {
    let Some(bin) = etcd_binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let files = pki(dir.path());
    let mut etcd = Etcd::start_tls(bin, files.clone()).await;
    etcd.enable_auth("root-secret", "relay", "relay-secret", "/sec/")
        .await;
    let right = dir.path().join("relay.password");
    std::fs::write(&right, "relay-secret\n").unwrap();
    let wrong = dir.path().join("wrong.password");
    std::fs::write(&wrong, "guess\n").unwrap();

    let config = |prefix: &str, password: &PathBuf, cert: bool| {
        let mut c = test_config();
        c.cluster.registry = format!("etcds://127.0.0.1:{}/{prefix}", etcd.client_port);
        c.cluster.lease_ttl_s = 6;
        c.cluster.etcd_ca = Some(files.ca.clone());
        if cert {
            c.cluster.etcd_cert = Some(files.client_cert.clone());
            c.cluster.etcd_key = Some(files.client_key.clone());
        }
        c.cluster.etcd_user = "relay".into();
        c.cluster.etcd_password_file = Some(password.clone());
        c
    };

    let a = TestRelay::with_hub_config(config("sec", &right, true)).await;
    let b = TestRelay::with_hub_config(config("sec", &right, true)).await;
    until_async(15, || async { keys(&etcd, "/sec/nodes/").await.len() == 2 }).await;
    let publisher = a.client("moqt").await;
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("live/secure"))
        .await
        .unwrap();
    knows(&b, "live/secure").await;
    assert_eq!(
        keys(&etcd, "/sec/namespaces/").await,
        ["/sec/namespaces/live/secure"]
    );

    let refused = |c: quichub_hub::Config| async move {
        match quichub_hub::Hub::start(c).await {
            Ok(_) => panic!("started"),
            Err(e) => format!("{e:#}"),
        }
    };
    let e = refused(config("sec", &wrong, true)).await;
    assert!(
        e.contains("user or password") && e.contains("etcd_password_file"),
        "{e}"
    );
    assert!(!e.contains("guess"), "{e}");
    let e = refused(config("sec", &right, false)).await;
    assert!(e.contains("TLS with etcd failed"), "{e}");
    let e = refused(config("other", &right, true)).await;
    assert!(e.contains("may not use the cluster's key prefix"), "{e}");
    let mut no_ca = config("sec", &right, true);
    no_ca.cluster.etcd_ca = None;
    let e = refused(no_ca).await;
    assert!(e.contains("TLS with etcd failed"), "{e}");

    // etcd forgets every authentication when it restarts: the relays
    // authenticate again, and a new namespace is claimed.
    etcd.restart().await;
    let publisher_b = b.client("moqt").await;
    let _after = within(20, async {
        loop {
            match publisher_b
                .publish_namespace(TrackNamespace::from_path("live/after"))
                .await
            {
                Ok(ns) => break ns,
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    })
    .await;
    until_async(15, || async {
        keys(&etcd, "/sec/namespaces/").await.len() == 2
    })
    .await;
    knows(&a, "live/after").await;
}
