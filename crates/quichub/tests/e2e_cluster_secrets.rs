//! The cluster's secrets kept out of sight: no token reaches a log line
//! (at DEBUG and above, every crate), a metric label or `/v1/relay`, and a
//! GOAWAY that sends a follower to another host does not take its token
//! along. Two relays of a cluster on a real etcd (started here) with a
//! cluster token, and a third following one of them as an origin.

use quichub_testkit as common;

use std::sync::{Arc, Mutex, OnceLock};

use common::etcd::{etcd_binary, Etcd};
use common::{knows, test_config, until_async, TestRelay};
use moqt::TrackNamespace;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the tests of this file log, at DEBUG and above.
fn captured() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .init();
        logs
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `GET path` on `addr` over HTTP/1.1: the whole response.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

/// Two members with a cluster token, and a relay C following A as an
/// origin with a token of its own in the URL. A drains with GOAWAY to B:
/// C goes to B without its token. Nothing logged at DEBUG or above, and
/// neither C's `/metrics` nor its `/v1/relay`, shows either token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_reaches_the_logs_metrics_or_api() {
    let Some(bin) = etcd_binary() else { return };
    let logs = captured();
    const CLUSTER_TOKEN: &str = "cluster-token-4f1e9a";
    const ORIGIN_TOKEN: &str = "origin-token-77c2d0";
    let etcd = Etcd::start(bin).await;
    let member = || {
        let mut c = test_config();
        c.cluster.registry = etcd.url("logs");
        c.cluster.lease_ttl_s = 6;
        c.cluster.token = CLUSTER_TOKEN.into();
        c
    };
    let a = TestRelay::with_hub_config(member()).await;
    let b = TestRelay::with_hub_config(member()).await;
    until_async(15, || async { etcd.keys("/logs/nodes/").await.len() == 2 }).await;

    let mut c = test_config();
    c.cluster.origins = vec![quichub_hub::OriginSection {
        url: format!("moqt://127.0.0.1:{}/?jwt={ORIGIN_TOKEN}", a.addr.port()),
        fingerprint: Some(a.hub.fingerprint()),
        ..Default::default()
    }];
    c.http.address = "127.0.0.1:0".into();
    c.metrics.address = "127.0.0.1:0".into();
    let c = TestRelay::with_hub_config(c).await;

    let publisher = a.client("moqt").await;
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("live/logs"))
        .await
        .unwrap();
    knows(&b, "live/logs").await;
    knows(&c, "live/logs").await;
    let metrics = get(c.hub.metrics_addr().unwrap(), "/metrics").await;
    assert!(metrics.contains("quichub_origin_sessions 1"), "{metrics}");
    let api = get(c.hub.http_addr().unwrap(), "/v1/relay").await;
    assert!(api.starts_with("HTTP/1.1 200"), "{api}");

    // A drains: its GOAWAY sends C to B (another member), without C's token.
    a.hub.shutdown().await;
    let text = || String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    until_async(15, || {
        let moved = text().contains("origin moved its followers");
        async move { moved }
    })
    .await;

    let logged = text();
    for secret in [CLUSTER_TOKEN, ORIGIN_TOKEN] {
        assert!(!logged.contains(secret), "{secret} logged:\n{logged}");
        assert!(
            !metrics.contains(secret),
            "{secret} in /metrics:\n{metrics}"
        );
        assert!(!api.contains(secret), "{secret} in /v1/relay:\n{api}");
    }
    // The lines that quote these URLs were logged, redacted.
    for line in [
        "connected to origin",
        "cluster: following member",
        "peer GOAWAY",
    ] {
        assert!(logged.contains(line), "no {line:?} in:\n{logged}");
    }
    assert!(logged.contains("jwt=<redacted>"), "{logged}");
    assert!(
        logged.contains("its token stays behind"),
        "the redirect to another host kept the token:\n{logged}"
    );
}
