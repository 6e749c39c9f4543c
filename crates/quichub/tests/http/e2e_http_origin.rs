//! Which web pages may use the HTTP port (`[http] allowed_origins` and
//! `allowed_hosts`), through the real listeners: a foreign page's POST,
//! CORS preflight and WebSocket upgrade are refused (403) over HTTP/1.1,
//! HTTP/2, HTTPS and HTTP/3, while the same without `Origin` (curl, native
//! clients) or from the relay's own pages works; a DNS-rebinding name on the
//! loopback listener is answered 421; a configured origin gets CORS; and
//! `/metrics` counts the refusals.

use quichub_testkit as common;

use std::net::SocketAddr;
use std::process::Stdio;

use common::{curl_http2, h3_python, test_config, within, H3Client, TestRelay};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

const FOREIGN: &str = "https://evil.example";

/// A relay with HTTP, HTTPS, HTTP/3 and metrics on loopback, and these
/// `[http]` lists.
async fn relay(origins: &[&str], hosts: &[&str]) -> TestRelay {
    let mut c = test_config();
    c.http.address = "127.0.0.1:0".into();
    c.http.tls = "127.0.0.1:0".into();
    c.quic.http3 = true;
    c.metrics.address = "127.0.0.1:0".into();
    c.http.allowed_origins = origins.iter().map(|s| s.to_string()).collect();
    c.http.allowed_hosts = hosts.iter().map(|s| s.to_string()).collect();
    TestRelay::with_hub_config(c).await
}

/// One exchange, from `curl -i`.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// Lowercased names.
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `curl -s -i -k ARGS`: the last response of its output. A transfer cut
/// by `--max-time` (an event stream) still gives what came.
async fn curl(args: &[&str]) -> Reply {
    let out = within(
        20,
        Command::new("curl")
            .args(["-s", "-i", "-k", "--max-time", "10"])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("curl {args:?}: no answer: {text}"));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("curl {args:?}: {text}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A `POST` of `body` to `url` over `version`, with `extra` headers.
async fn post(version: &str, url: &str, body: &str, extra: &[&str]) -> Reply {
    let mut args = vec![version, "-X", "POST", "--data-binary", body];
    for h in extra {
        args.extend(["-H", h]);
    }
    args.push(url);
    curl(&args).await
}

/// A WebSocket upgrade to MoQT on `addr` with these `Host` and `Origin`:
/// the answer's status line.
async fn upgrade(addr: SocketAddr, host: &str, origin: Option<&str>) -> String {
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    let req = format!(
        "GET /moq HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: qmux-01.moqt-18\r\n{origin}\r\n"
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = within(5, s.read(&mut buf)).await.unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().unwrap_or("").to_string()
}

/// The relay's `/metrics` text.
async fn metrics(relay: &TestRelay) -> String {
    let addr = relay.hub.metrics_addr().unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    within(5, s.read_to_string(&mut out)).await.unwrap();
    out
}

fn published(relay: &TestRelay) -> u64 {
    relay
        .hub
        .http_api()
        .metrics
        .published
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_pages_are_refused_on_every_transport() {
    if curl_http2().is_none() {
        return;
    }
    let relay = relay(&[], &[]).await;
    let http = relay.hub.http_addr().unwrap();
    let https = relay.hub.https_addr().unwrap();
    let url = |path: &str| format!("http://{http}{path}");
    let foreign = format!("Origin: {FOREIGN}");
    let put = curl(&["-X", "PUT", &url("/v1/t/o/x")]).await;
    assert_eq!(put.status, 201);
    for v in ["--http1.1", "--http2-prior-knowledge"] {
        // A foreign page's POST: refused, nothing published.
        let before = published(&relay);
        let r = post(v, &url("/v1/t/o/x"), "forged", &[&foreign, "X-Retain: 1"]).await;
        assert_eq!(r.status, 403, "{v}: {r:?}");
        assert!(r.body.contains("allowed_origins"), "{v}: {r:?}");
        assert_eq!(r.header("access-control-allow-origin"), None, "{v}");
        assert_eq!(published(&relay), before, "{v}");
        assert!(relay.hub.broker().retained("o/x").is_none(), "{v}");
        // PUT and DELETE too.
        for m in ["PUT", "DELETE"] {
            let r = curl(&[v, "-X", m, "-H", &foreign, &url("/v1/t/o/x")]).await;
            assert_eq!(r.status, 403, "{v} {m}");
        }
        // Its CORS preflight gets no Access-Control-Allow-Origin.
        let r = curl(&[
            v,
            "-X",
            "OPTIONS",
            "-H",
            &foreign,
            "-H",
            "Access-Control-Request-Method: POST",
            &url("/v1/t/o/x"),
        ])
        .await;
        assert_eq!(r.status, 403, "{v}: {r:?}");
        assert_eq!(r.header("access-control-allow-origin"), None, "{v}");
        // No Origin (curl, native clients): accepted.
        let r = post(v, &url("/v1/t/o/x"), "native", &[]).await;
        assert_eq!(r.status, 204, "{v}: {r:?}");
        // The relay's own pages, by any of its loopback names.
        for own in [
            format!("http://127.0.0.1:{}", http.port()),
            format!("http://localhost:{}", http.port()),
            format!("https://127.0.0.1:{}", https.port()),
        ] {
            let origin = format!("Origin: {own}");
            let r = post(v, &url("/v1/t/o/x"), "own", &[&origin]).await;
            assert_eq!(r.status, 204, "{v} {own}: {r:?}");
            assert_eq!(r.header("access-control-allow-origin"), Some(own.as_str()));
        }
    }
    // HTTPS: the same.
    let surl = format!("https://{https}/v1/t/o/x");
    let r = post("--http2", &surl, "forged", &[&foreign]).await;
    assert_eq!(r.status, 403, "{r:?}");
    let own = format!("Origin: https://localhost:{}", https.port());
    assert_eq!(post("--http2", &surl, "own", &[&own]).await.status, 204);
    assert_eq!(post("--http1.1", &surl, "native", &[]).await.status, 204);

    // The WebSocket upgrade (no CORS protects it).
    let host = format!("127.0.0.1:{}", http.port());
    let line = upgrade(http, &host, Some(FOREIGN)).await;
    assert!(line.starts_with("HTTP/1.1 403"), "{line}");
    let own = format!("http://127.0.0.1:{}", http.port());
    let line = upgrade(http, &host, Some(&own)).await;
    assert!(line.starts_with("HTTP/1.1 101"), "{line}");
    let line = upgrade(http, &host, None).await;
    assert!(line.starts_with("HTTP/1.1 101"), "{line}");

    // HTTP/3 on the relay's UDP port.
    let mut refused_h3 = 0;
    if let Some(py) = h3_python() {
        let own = format!("https://localhost:{}", relay.addr.port());
        let reqs = json!({"requests": [
            {"method": "POST", "path": "/v1/t/o/x", "body": "forged", "headers": {"origin": FOREIGN}},
            {"method": "POST", "path": "/v1/t/o/x", "body": "own", "headers": {"origin": own}},
            {"method": "POST", "path": "/v1/t/o/x", "body": "native"},
            {"method": "GET", "path": "/v1/time", "authority": format!("evil.example:{}", relay.addr.port())},
        ]});
        let v = H3Client::start(&py, relay.addr.port(), reqs, &[])
            .await
            .result()
            .await;
        let status = |i: usize| v["responses"][i]["status"].as_u64().unwrap();
        assert_eq!(
            [status(0), status(1), status(2), status(3)],
            [403, 204, 204, 421],
            "{v}"
        );
        assert_eq!(
            v["responses"][1]["headers"]["access-control-allow-origin"],
            own
        );
        refused_h3 = 1;
    }

    // Origin: 2 versions × (POST, PUT, DELETE, preflight), HTTPS, the
    // upgrade, HTTP/3.
    let text = metrics(&relay).await;
    let want = format!(
        "quichub_http_refused_total{{reason=\"origin\"}} {}\n",
        2 * 4 + 1 + 1 + refused_h3
    );
    assert!(text.contains(&want), "{want} in {text}");
    let want = format!("quichub_http_refused_total{{reason=\"host\"}} {refused_h3}\n");
    assert!(text.contains(&want), "{want} in {text}");
    assert!(
        text.contains("quichub_websocket_sessions_total{upgrade=\"refused\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_rebinding_names_are_misdirected_on_loopback() {
    if curl_http2().is_none() {
        return;
    }
    let relay = relay(&[], &["relay.test"]).await;
    let http = relay.hub.http_addr().unwrap();
    let port = http.port();
    let evil = format!("Host: evil.example:{port}");
    for v in ["--http1.1", "--http2-prior-knowledge"] {
        for path in ["/v1/time", "/", "/v1/relay", "/v1/t/anything"] {
            let r = curl(&[v, "-H", &evil, &format!("http://{http}{path}")]).await;
            assert_eq!(r.status, 421, "{v} {path}: {r:?}");
            assert!(r.body.contains("allowed_hosts"), "{r:?}");
        }
        // The page of the rebound name is same-origin with it, and still
        // refused: the name comes first.
        let origin = format!("Origin: http://evil.example:{port}");
        let r = post(v, &format!("http://{http}/v1/t/x"), "x", &[&evil, &origin]).await;
        assert_eq!(r.status, 421, "{v}: {r:?}");
        // Its names: loopback addresses, localhost, allowed_hosts.
        for host in [
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("relay.test:{port}"),
        ] {
            let h = format!("Host: {host}");
            let r = curl(&[v, "-H", &h, &format!("http://{http}/v1/time")]).await;
            assert_eq!(r.status, 200, "{v} {host}: {r:?}");
        }
        // A page served under an allowed name may use the API.
        let put = curl(&[v, "-X", "PUT", &format!("http://{http}/v1/t/named")]).await;
        assert!(matches!(put.status, 200 | 201));
        let r = post(
            v,
            &format!("http://{http}/v1/t/named"),
            "x",
            &[
                &format!("Host: relay.test:{port}"),
                &format!("Origin: http://relay.test:{port}"),
            ],
        )
        .await;
        assert_eq!(r.status, 204, "{v}: {r:?}");
    }
    let line = upgrade(http, &format!("evil.example:{port}"), None).await;
    assert!(line.starts_with("HTTP/1.1 421"), "{line}");
    let text = metrics(&relay).await;
    assert!(
        text.contains("quichub_http_refused_total{reason=\"host\"} 11\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_origin_gets_cors() {
    if curl_http2().is_none() {
        return;
    }
    let app = "https://app.example";
    let relay = relay(&[app], &[]).await;
    let http = relay.hub.http_addr().unwrap();
    let url = format!("http://{http}/v1/t/app/feed");
    let origin = format!("Origin: {app}");
    let foreign = format!("Origin: {FOREIGN}");
    assert_eq!(curl(&["-X", "PUT", &url]).await.status, 201);
    for v in ["--http1.1", "--http2-prior-knowledge"] {
        // Preflight: the methods and headers the API takes.
        let r = curl(&[
            v,
            "-X",
            "OPTIONS",
            "-H",
            &origin,
            "-H",
            "Access-Control-Request-Method: DELETE",
            "-H",
            "Access-Control-Request-Headers: authorization, x-retain",
            &url,
        ])
        .await;
        assert_eq!(r.status, 204, "{v}: {r:?}");
        assert_eq!(r.header("access-control-allow-origin"), Some(app));
        let methods = r.header("access-control-allow-methods").unwrap();
        assert!(
            methods.contains("DELETE") && methods.contains("POST"),
            "{methods}"
        );
        let headers = r.header("access-control-allow-headers").unwrap();
        assert!(headers.contains("authorization") && headers.contains("x-retain"));
        // The request itself.
        let r = post(v, &url, "from the app", &[&origin]).await;
        assert_eq!(r.status, 204, "{v}: {r:?}");
        assert_eq!(r.header("access-control-allow-origin"), Some(app));
        assert!(r
            .header("access-control-expose-headers")
            .is_some_and(|h| h.contains("x-matched-subscribers")));
        // An event stream (EventSource) from the app can be read.
        let r = curl(&[v, "-N", "--max-time", "1", "-H", &origin, &url]).await;
        assert_eq!(r.status, 200, "{v}: {r:?}");
        assert_eq!(r.header("access-control-allow-origin"), Some(app));
        assert!(r.body.starts_with(": subscribed"), "{r:?}");
        // Another site still cannot.
        let r = post(v, &url, "forged", &[&foreign]).await;
        assert_eq!(r.status, 403, "{v}: {r:?}");
        let r = curl(&[v, "-H", &foreign, &format!("http://{http}/v1/time")]).await;
        assert_eq!(r.status, 200, "a GET is served");
        assert_eq!(r.header("access-control-allow-origin"), None, "unreadable");
    }
    let host = format!("127.0.0.1:{}", http.port());
    let line = upgrade(http, &host, Some(app)).await;
    assert!(line.starts_with("HTTP/1.1 101"), "{line}");
    let line = upgrade(http, &host, Some(FOREIGN)).await;
    assert!(line.starts_with("HTTP/1.1 403"), "{line}");
}
