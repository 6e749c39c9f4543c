//! The HTTP pub/sub API over HTTP/3 (ALPN `h3` on the relay's UDP port,
//! beside WebTransport), driven by aioquic's HTTP/3 stack (PyPI) through
//! `crates/testkit/py/h3_client.py`, and across protocols with mosquitto's clients.

use quichub_testkit as common;

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use common::{h3_body, h3_python, mqtt_tools, within, H3Client, TestGateway};
use quichub_gateway::http::{sse, Api, ApiConfig};
use quichub_net::h3::codec::{self, code, frame};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::process::Command;

async fn gateway(config: ApiConfig) -> Option<(TestGateway, Arc<Api>, std::path::PathBuf)> {
    let py = h3_python()?;
    let (gw, api) = TestGateway::with_http3(config).await;
    Some((gw, api, py))
}

/// Runs `requests` one after another on one aioquic connection.
async fn run(py: &std::path::Path, gw: &TestGateway, requests: Value, args: &[&str]) -> Value {
    H3Client::start(
        py,
        gw.relay.addr.port(),
        json!({ "requests": requests }),
        args,
    )
    .await
    .result()
    .await
}

fn status(v: &Value, i: usize) -> u64 {
    v["responses"][i]["status"].as_u64().unwrap_or(0)
}

fn events(r: &Value) -> Vec<(String, String, Option<String>)> {
    sse::parse(&String::from_utf8_lossy(&h3_body(r)))
}

fn payloads(r: &Value) -> Vec<Vec<u8>> {
    events(r)
        .iter()
        .filter_map(|(e, d, _)| sse::payload_of(e, d))
        .collect()
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    within(10, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(f(), "{what}");
}

/// A QUIC client that trusts any certificate (keep it alive as long as its
/// connections).
/// A request with no headers and no body, as most of these tests send.
async fn bare(
    h3: &quichub_net::h3::client::Client,
    method: http::Method,
    path: &str,
) -> anyhow::Result<quichub_net::h3::client::Response> {
    h3.request(
        &method,
        "localhost",
        path,
        &http::HeaderMap::new(),
        Bytes::new(),
        1024,
    )
    .await
}

fn quic_client() -> quichub_net::client::Client {
    quichub_net::client::Client::new(
        "127.0.0.1:0".parse().unwrap(),
        quichub_client::Verify::Insecure,
    )
    .unwrap()
}

/// A full-handshake `h3` connection to `addr`.
async fn h3_conn(
    c: &quichub_net::client::Client,
    addr: std::net::SocketAddr,
) -> web_transport_quinn::quinn::Connection {
    within(10, c.dial(addr, "localhost", b"h3", false))
        .await
        .unwrap()
        .connection()
        .clone()
}

/// A WebTransport session on `conn` with MoQT SETUP done both ways, and our
/// control stream (its end would end the session).
async fn moqt_over_webtransport(
    conn: &web_transport_quinn::quinn::Connection,
    port: u16,
) -> (
    web_transport_quinn::Session,
    web_transport_quinn::SendStream,
) {
    use moqt::message::Message;
    let url = url::Url::parse(&format!("https://localhost:{port}/test")).unwrap();
    let session = within(
        10,
        web_transport_quinn::Session::connect(
            conn.clone(),
            web_transport_quinn::proto::ConnectRequest::new(url),
        ),
    )
    .await
    .unwrap();
    let mut control = session.open_uni().await.unwrap();
    let setup = moqt::session::make_setup("e2e-http3", None, None);
    control
        .write_all(&Message::Setup(setup).to_bytes())
        .await
        .unwrap();
    // The relay's SETUP comes back on its own control stream.
    let mut theirs = within(10, session.accept_uni()).await.unwrap();
    let mut buf = [0u8; 16];
    let n = within(10, theirs.read(&mut buf)).await.unwrap();
    assert!(n.is_some_and(|n| n > 0), "the relay answered SETUP");
    (session, control)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_error_over_http3() {
    let Some((gw, api, py)) = gateway(ApiConfig {
        max_body: 1024,
        ..ApiConfig::default()
    })
    .await
    else {
        return;
    };
    let big = base64_of(&[7u8; 1025]);
    let max = base64_of(&[7u8; 1024]);
    let v = run(
        &py,
        &gw,
        json!([
            {"method": "HEAD", "path": "/v1/t/routes/a"},
            {"method": "PUT", "path": "/v1/t/routes/a"},
            {"method": "PUT", "path": "/v1/t/routes/a"},
            {"method": "HEAD", "path": "/v1/t/routes%2Fa"},
            {"method": "POST", "path": "/v1/t/routes/a", "body": "hello"},
            {"method": "GET", "path": "/v1/time"},
            {"method": "DELETE", "path": "/v1/t/routes%2Fa"},
            {"method": "HEAD", "path": "/v1/t/routes/a"},
            {"method": "DELETE", "path": "/v1/t/routes/a"},
            {"method": "POST", "path": "/v1/t/routes/a", "body": "x"},
            {"method": "GET", "path": "/nope"},
            {"method": "PATCH", "path": "/v1/t/x"},
            {"method": "POST", "path": "/v1/time", "body": "x"},
            {"method": "PUT", "path": "/v1/t/a/+/b"},
            {"method": "PUT", "path": "/v1/t/limits"},
            {"method": "POST", "path": "/v1/t/limits", "body_b64": big},
            {"method": "POST", "path": "/v1/t/limits", "body_b64": max},
            {"method": "GET", "path": "/v1/t/limits", "headers": {"x-history-length": "lots"}},
            // A WebTransport CONNECT on a connection that began with plain requests.
            {"method": "CONNECT", "path": "/moq", "headers": {":protocol": "webtransport"}},
            // ...does not disturb it.
            {"method": "GET", "path": "/v1/time"},
        ]),
        &[],
    )
    .await;
    let want = [
        404, 201, 200, 200, 204, 200, 204, 404, 404, 404, 404, 405, 405, 400, 201, 413, 204, 400,
        400, 200,
    ];
    let got: Vec<u64> = (0..want.len()).map(|i| status(&v, i)).collect();
    assert_eq!(got, want, "{v:#}");
    let r = &v["responses"];
    assert_eq!(r[4]["headers"]["x-matched-subscribers"], "0");
    assert_eq!(r[5]["headers"]["content-type"], "application/json");
    let time = String::from_utf8(h3_body(&r[5])).unwrap();
    assert!(time.starts_with("{\"unix_ms\":"), "{time}");
    assert_eq!(r[11]["headers"]["allow"], "GET, HEAD, POST, PUT, DELETE");
    assert!(String::from_utf8_lossy(&h3_body(&r[10])).contains("\"error\""));
    assert!(String::from_utf8_lossy(&h3_body(&r[18])).contains("WebTransport"));
    assert!(h3_body(&r[3]).is_empty(), "HEAD has no body");
    assert_eq!(api.topics(), 1, "only limits is left");
}

fn base64_of(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_replays_history_goes_live_and_ends_on_delete() {
    let Some((gw, api, py)) = gateway(ApiConfig::default()).await else {
        return;
    };
    let v = run(
        &py,
        &gw,
        json!([
            {"method": "PUT", "path": "/v1/t/hist"},
            {"method": "POST", "path": "/v1/t/hist", "body": "m1"},
            {"method": "POST", "path": "/v1/t/hist", "body": "multi\nline"},
            {"method": "POST", "path": "/v1/t/hist", "body_b64": base64_of(&[0, 1, 2, 255])},
        ]),
        &[],
    )
    .await;
    assert_eq!(
        (0..4).map(|i| status(&v, i)).collect::<Vec<_>>(),
        [201, 204, 204, 204]
    );
    let mut stream = H3Client::start(
        &py,
        gw.relay.addr.port(),
        json!({"requests": [{"method": "GET", "path": "/v1/t/hist",
            "headers": {"x-history-length": "2"}, "stream": {"timeout": 20}}]}),
        &[],
    )
    .await;
    stream.ready(0).await;
    until("subscribed", || api.subscribers() == 1).await;
    let v = run(
        &py,
        &gw,
        json!([
            {"method": "POST", "path": "/v1/t/hist", "body": "live"},
            {"method": "DELETE", "path": "/v1/t/hist"},
        ]),
        &[],
    )
    .await;
    assert_eq!(status(&v, 0), 204);
    assert_eq!(v["responses"][0]["headers"]["x-matched-subscribers"], "1");
    assert_eq!(status(&v, 1), 204);
    let v = stream.result().await;
    let r = &v["responses"][0];
    assert_eq!(r["status"], 200);
    assert_eq!(r["headers"]["content-type"], "text/event-stream");
    assert_eq!(r["ended"], true, "DELETE ends the response: {r}");
    assert_eq!(
        payloads(r),
        [
            b"multi\nline".to_vec(),
            vec![0, 1, 2, 255],
            b"live".to_vec()
        ]
    );
    assert_eq!(events(r).last().unwrap().0, "deleted");
    until("released", || api.subscribers() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_stopping_a_stream_frees_its_subscription() {
    let Some((gw, api, py)) = gateway(ApiConfig::default()).await else {
        return;
    };
    run(
        &py,
        &gw,
        json!([{"method": "PUT", "path": "/v1/t/leaving"}]),
        &[],
    )
    .await;
    // Two streams on one connection: the first is cancelled after 3 s
    // (STOP_SENDING), the second stays until 12 s.
    let mut c = H3Client::start(
        &py,
        gw.relay.addr.port(),
        json!({"parallel": true, "requests": [
            {"method": "GET", "path": "/v1/t/leaving", "stream": {"timeout": 3}},
            {"method": "GET", "path": "/v1/t/leaving", "stream": {"timeout": 12}},
        ]}),
        &[],
    )
    .await;
    c.ready(0).await;
    until("two subscribers", || api.subscribers() == 2).await;
    until("the stopped stream's subscription ended", || {
        api.subscribers() == 1
    })
    .await;
    let v = c.result().await;
    assert_eq!(v["responses"][1]["status"], 200);
    until("all ended", || {
        api.subscribers() == 0 && gw.broker.sessions() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_and_mqtt_reach_each_other() {
    if mqtt_tools().is_none() {
        return;
    }
    let Some((gw, api, py)) = gateway(ApiConfig::default()).await else {
        return;
    };
    let port = gw.mqtt.port().to_string();
    // HTTP/3 POST -> mosquitto_sub, byte for byte.
    run(
        &py,
        &gw,
        json!([{"method": "PUT", "path": "/v1/t/cross/h2m"}]),
        &[],
    )
    .await;
    let sub = Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-i",
            "h3sub",
            "-V",
            "5",
            "-q",
            "1",
        ])
        .args(["-t", "cross/h2m", "-C", "1", "-N"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("mosquitto_sub");
    until("mosquitto_sub subscribed", || {
        gw.broker.client_subscriptions("h3sub") == 1
    })
    .await;
    let payload: Vec<u8> = (0..=255u8).chain(*b"\nend").collect();
    let v = run(
        &py,
        &gw,
        json!([{"method": "POST", "path": "/v1/t/cross/h2m", "body_b64": base64_of(&payload)}]),
        &[],
    )
    .await;
    assert_eq!(status(&v, 0), 204);
    assert_eq!(v["responses"][0]["headers"]["x-matched-subscribers"], "1");
    let out = within(10, sub.wait_with_output()).await.unwrap();
    assert_eq!(out.stdout, payload, "exact bytes");

    // mosquitto_pub (QoS 0, 1, 2) -> HTTP/3 GET stream.
    run(
        &py,
        &gw,
        json!([{"method": "PUT", "path": "/v1/t/cross/m2h"}]),
        &[],
    )
    .await;
    let mut stream = H3Client::start(
        &py,
        gw.relay.addr.port(),
        json!({"requests": [{"method": "GET", "path": "/v1/t/cross%2Fm2h",
            "stream": {"timeout": 20, "until_bytes": 400}}]}),
        &[],
    )
    .await;
    stream.ready(0).await;
    until("subscribed", || api.subscribers() == 1).await;
    let msgs = [
        ("0", "hello from mqtt"),
        ("1", "multi\nline"),
        ("2", "ünïcödé"),
    ];
    for (qos, m) in msgs {
        let out = Command::new("mosquitto_pub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-t",
                "cross/m2h",
                "-q",
                qos,
                "-m",
                m,
            ])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Then a marker large enough to end the read.
    let v = run(
        &py,
        &gw,
        json!([{"method": "POST", "path": "/v1/t/cross/m2h", "body": "z".repeat(400)}]),
        &[],
    )
    .await;
    assert_eq!(status(&v, 0), 204);
    let v = stream.result().await;
    let got = payloads(&v["responses"][0]);
    assert_eq!(
        got[..3],
        [
            b"hello from mqtt".to_vec(),
            b"multi\nline".to_vec(),
            "ünïcödé".as_bytes().to_vec()
        ]
    );
}

/// A resumed connection sends its requests as 0-RTT data: the POST runs at
/// once (before the handshake completes), the DELETE is held until the
/// handshake completes; both succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_rtt_publish_over_http3() {
    use std::sync::atomic::Ordering::Relaxed;
    let Some((gw, api, py)) = gateway(ApiConfig::default()).await else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("quichub-h3-0rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ticket = dir.join("ticket");
    let t = ticket.to_str().unwrap();
    let v = run(
        &py,
        &gw,
        json!([{"method": "PUT", "path": "/v1/t/early"}, {"method": "PUT", "path": "/v1/t/gone"}]),
        &["--ticket", t],
    )
    .await;
    assert_eq!(
        v["early_data_accepted"], false,
        "first connection: no ticket yet"
    );
    assert!(ticket.exists(), "the server sent a session ticket");
    // Both requests in the first flight. On a loaded machine the handshake
    // can complete before a request's stream is read: that request is then
    // not early data at all and runs at once. Tried again (each connection
    // leaves a fresh ticket) until both arrive as 0-RTT.
    let mut attempts = 0;
    let v = loop {
        attempts += 1;
        let (early, held) = (
            api.metrics.early.load(Relaxed),
            api.metrics.early_held.load(Relaxed),
        );
        let v = H3Client::start(
            &py,
            gw.relay.addr.port(),
            json!({"parallel": true, "requests": [
                {"method": "POST", "path": "/v1/t/early", "body": "sent in 0-RTT"},
                {"method": "DELETE", "path": "/v1/t/gone"},
            ]}),
            &["--ticket", t, "--zero-rtt"],
        )
        .await
        .result()
        .await;
        assert_eq!(v["early_data_accepted"], true, "{v:#}");
        let ran_early = api.metrics.early.load(Relaxed) > early;
        let held_back = api.metrics.early_held.load(Relaxed) > held;
        if ran_early && held_back {
            break v;
        }
        assert!(
            attempts < 5,
            "in {attempts} tries the POST never ran before the handshake completed \
             with the DELETE held until it did (last: POST early {ran_early}, DELETE held {held_back})"
        );
        // The DELETE ran: the topic is made again for the next try.
        run(
            &py,
            &gw,
            json!([{"method": "PUT", "path": "/v1/t/gone"}]),
            &[],
        )
        .await;
    };
    assert_eq!(status(&v, 0), 204);
    assert_eq!(
        status(&v, 1),
        204,
        "DELETE runs once the handshake completes"
    );
    let v = run(
        &py,
        &gw,
        json!([
            {"method": "GET", "path": "/v1/t/early", "headers": {"x-history-length": "1"},
             "stream": {"timeout": 5, "until_bytes": 40}},
            {"method": "HEAD", "path": "/v1/t/gone"},
        ]),
        &[],
    )
    .await;
    assert_eq!(payloads(&v["responses"][0]), [b"sent in 0-RTT".to_vec()]);
    assert_eq!(status(&v, 1), 404);
    std::fs::remove_dir_all(&dir).ok();
}

/// Bad HTTP/3 on one request stream resets that stream with the right code;
/// the connection and its other requests go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_reset_only_their_stream() {
    let (gw, _api) = TestGateway::with_http3(ApiConfig {
        max_body: 1024,
        ..ApiConfig::default()
    })
    .await;
    let c = quic_client();
    let conn = h3_conn(&c, gw.relay.addr).await;
    let h3 = quichub_net::h3::client::Client::new(conn.clone())
        .await
        .unwrap();
    let get_time = || bare(&h3, http::Method::GET, "/v1/time");
    assert_eq!(get_time().await.unwrap().status, 200);
    let raw = |typ: u64, len: u64, payload: &'static [u8]| {
        let conn = conn.clone();
        async move {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            let mut b = bytes::BytesMut::new();
            codec::encode_varint(typ, &mut b);
            codec::encode_varint(len, &mut b);
            b.extend_from_slice(payload);
            send.write_all(&b).await.unwrap();
            send.finish().ok();
            let e = within(10, recv.read_to_end(1024)).await.unwrap_err();
            match e {
                web_transport_quinn::quinn::ReadToEndError::Read(
                    web_transport_quinn::quinn::ReadError::Reset(c),
                ) => c.into_inner(),
                e => panic!("expected a reset, got {e}"),
            }
        }
    };
    // DATA before HEADERS.
    assert_eq!(
        raw(frame::DATA, 3, b"abc").await,
        code::FRAME_UNEXPECTED as u64
    );
    // A dynamic-table reference in the field section (we allow no table).
    assert_eq!(
        raw(frame::HEADERS, 3, &[0x00, 0x00, 0x80]).await,
        code::QPACK_DECOMPRESSION_FAILED as u64
    );
    // A field section over the advertised 16 KiB.
    assert_eq!(
        raw(frame::HEADERS, 1 << 20, b"").await,
        code::EXCESSIVE_LOAD as u64
    );
    // SETTINGS belongs on the control stream.
    assert_eq!(
        raw(frame::SETTINGS, 0, b"").await,
        code::FRAME_UNEXPECTED as u64
    );
    // No :path.
    let mut section = bytes::BytesMut::new();
    let mut fields = web_transport_quinn::proto::qpack::Headers::default();
    fields.set(":method", "GET");
    fields.set(":scheme", "https");
    fields.encode(&mut section).unwrap();
    let section: &'static [u8] = Box::leak(section.to_vec().into_boxed_slice());
    assert_eq!(
        raw(frame::HEADERS, section.len() as u64, section).await,
        code::MESSAGE_ERROR as u64
    );
    // Empty DATA frames count against the body limit too (each would
    // otherwise cost the server memory for nothing): 413.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut b = bytes::BytesMut::new();
    codec::encode_request_head(
        &http::Method::POST,
        "localhost",
        "/v1/t/flood",
        &http::HeaderMap::new(),
        &mut b,
    )
    .unwrap();
    for _ in 0..40_000 {
        b.extend_from_slice(&[0x00, 0x00]);
    }
    let _ = send.write_all(&b).await;
    let _ = send.finish();
    let mut resp = bytes::BytesMut::new();
    let mut chunk = [0u8; 4096];
    while let Ok(Some(n)) = within(10, recv.read(&mut chunk)).await {
        resp.extend_from_slice(&chunk[..n]);
    }
    let (typ, head) = codec::next_frame(&mut resp, |_| 1 << 20).unwrap().unwrap();
    assert_eq!(typ, frame::HEADERS);
    let fields = web_transport_quinn::proto::qpack::Headers::decode(&mut &head[..]).unwrap();
    assert_eq!(fields.get(":status"), Some("413"));
    // The connection still serves.
    assert_eq!(get_time().await.unwrap().status, 200);
    assert!(conn.close_reason().is_none());
}

/// Malformed percent-escapes in a topic are 400 over HTTP/3 too (the
/// route code is shared with HTTP/1.1 and HTTP/2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_percent_escapes_are_400_over_http3() {
    let (gw, api) = TestGateway::with_http3(ApiConfig::default()).await;
    let c = quic_client();
    let conn = h3_conn(&c, gw.relay.addr).await;
    let h3 = quichub_net::h3::client::Client::new(conn.clone())
        .await
        .unwrap();
    for path in ["/v1/t/%ZZ", "/v1/t/%", "/v1/t/a%2"] {
        let r = bare(&h3, http::Method::PUT, path).await.unwrap();
        assert_eq!(r.status, 400, "{path}");
    }
    assert_eq!(
        bare(&h3, http::Method::PUT, "/v1/t/a%25")
            .await
            .unwrap()
            .status,
        201
    );
    assert_eq!(api.topics(), 1);
}

/// `quichub relay` serves HTTP/3 on its UDP port by default and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_binary_serves_http3() {
    use std::io::BufRead;
    /// Kills the relay however the test ends.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(
        std::process::Command::new(env!("CARGO_BIN_EXE_quichub"))
            .args(["relay", "--bind", "127.0.0.1:0", "--metrics", "off"])
            .args(["--mqtt", "off", "--http", "off", "--data-dir", "off"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let addr: std::net::SocketAddr = loop {
        let line = lines.next().expect("relay output").unwrap();
        if let Some(rest) = line.strip_prefix("http3 udp ") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let c = quic_client();
    let h3 = quichub_net::h3::client::Client::new(h3_conn(&c, addr).await)
        .await
        .unwrap();
    let r = bare(&h3, http::Method::PUT, "/v1/t/bin").await;
    drop(child);
    assert_eq!(r.unwrap().status, 201);
}

/// An endpoint without the HTTP API (`--http3 off`, or a bare relay) closes
/// plain HTTP/3 connections with H3_REQUEST_REJECTED; WebTransport on the
/// same ALPN is unaffected (the other end-to-end tests use it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http3_without_the_api_is_rejected() {
    let relay = common::TestRelay::start().await;
    let c = quic_client();
    let conn = h3_conn(&c, relay.addr).await;
    let h3 = quichub_net::h3::client::Client::new(conn.clone())
        .await
        .unwrap();
    let r = within(10, bare(&h3, http::Method::GET, "/v1/time")).await;
    assert!(r.is_err(), "{r:?}");
    match within(10, conn.closed()).await {
        web_transport_quinn::quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code.into_inner(), code::REQUEST_REJECTED as u64)
        }
        e => panic!("expected an application close, got {e}"),
    }
    // WebTransport still works on the same endpoint.
    let _ = relay.client("https").await;
}

/// WebTransport on `h3` connections taken before the handshake (for 0-RTT):
/// a MoQT session starts on a resumed connection that sent 0-RTT data, as on
/// a fresh one (the server holds the CONNECT until the handshake completes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webtransport_on_a_resumed_0rtt_connection() {
    let relay = common::TestRelay::start().await;
    let c = quic_client();
    for early in [false, true] {
        let dialed = within(10, c.dial(relay.addr, "localhost", b"h3", early))
            .await
            .unwrap();
        assert_eq!(
            matches!(dialed, quichub_net::client::Dialed::Early { .. }),
            early,
            "the second connection resumes with 0-RTT"
        );
        let conn = dialed.connection().clone();
        let (session, _control) = moqt_over_webtransport(&conn, relay.addr.port()).await;
        assert!(
            session.close_reason().is_none(),
            "{:?}",
            session.close_reason()
        );
        // (The session ticket for the next round came with the handshake,
        // before the relay's SETUP.)
        assert!(quichub_net::server::handshake_complete(&conn));
        session.close(0, b"done");
    }
}

/// Plain HTTP/3 requests on a connection whose first request opened a
/// WebTransport session are answered too (the session forwards them to the
/// HTTP API), and the MoQT session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_beside_a_webtransport_session() {
    let (gw, _api) = TestGateway::with_http3(ApiConfig::default()).await;
    let c = quic_client();
    let conn = h3_conn(&c, gw.relay.addr).await;
    let (session, _control) = moqt_over_webtransport(&conn, gw.relay.addr.port()).await;
    // Plain requests on the same connection (the session's control stream
    // is ours already).
    assert!(conn.close_reason().is_none(), "{:?}", conn.close_reason());
    let h3 = quichub_net::h3::client::Client::without_control(conn.clone());
    let r = within(10, bare(&h3, http::Method::GET, "/v1/time"))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {:?} / {:?}",
                conn.close_reason(),
                session.close_reason()
            )
        });
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).starts_with("{\"unix_ms\":"));
    let r = within(10, bare(&h3, http::Method::PUT, "/v1/t/beside/wt"))
        .await
        .unwrap();
    assert_eq!(r.status, 201);
    // The MoQT session is still up (the relay counts it once our SETUP,
    // sent before the requests but on a stream of its own, is read).
    assert!(session.close_reason().is_none());
    within(10, async {
        while gw.relay.relay.session_count() != 1 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
}
