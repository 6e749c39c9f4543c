//! The HTTP pub/sub API end to end with curl over HTTP/1.1 and HTTP/2 (prior
//! knowledge, cleartext), and across protocols with mosquitto's MQTT clients.

use quichub_testkit as common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{curl_http2, mqtt_tools, within, TestGateway, TestHttp};
use quichub_gateway::http::{sse, ApiConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdout, Command};

const VERSIONS: [&str; 2] = ["--http1.1", "--http2-prior-knowledge"];

/// One curl exchange, from `curl -i`.
#[derive(Debug)]
struct Reply {
    version: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn parse_reply(out: &[u8]) -> Reply {
    let mut rest = out;
    loop {
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(out)));
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let body = &rest[end + 4..];
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap();
        let mut parts = status_line.split_whitespace();
        let version = parts.next().unwrap().to_string();
        let status: u16 = parts.next().unwrap().parse().unwrap();
        if status == 100 {
            rest = body;
            continue;
        }
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        return Reply {
            version,
            status,
            headers,
            body: body.to_vec(),
        };
    }
}

/// Runs `curl -s -i VERSION ARGS...`, with `body` as `--data-binary` (POST).
async fn curl(version: &str, args: &[&str], body: Option<&[u8]>) -> Reply {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "-S",
        "-i",
        "-H",
        "Expect:",
        "--max-time",
        "10",
        version,
    ])
    .args(args)
    .stdin(if body.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    if body.is_some() {
        cmd.args(["--data-binary", "@-"]);
    }
    let mut child = cmd.spawn().expect("curl");
    if let Some(b) = body {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b).await.unwrap();
        drop(stdin);
    }
    let out = within(15, child.wait_with_output()).await.unwrap();
    assert!(
        out.status.success(),
        "curl {version} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_reply(&out.stdout)
}

async fn put(version: &str, h: &TestHttp, path: &str) -> u16 {
    curl(version, &["-X", "PUT", &h.url(path)], None)
        .await
        .status
}

async fn post(version: &str, h: &TestHttp, path: &str, body: &[u8], args: &[&str]) -> Reply {
    let url = h.url(path);
    let mut a = args.to_vec();
    a.push(&url);
    curl(version, &a, Some(body)).await
}

/// A streaming `curl -N` GET, read as Server-Sent Events.
struct Stream {
    child: Child,
    stdout: ChildStdout,
    buf: Vec<u8>,
}

type Event = (String, String, Option<String>);

impl Stream {
    /// Starts the GET and waits for the opening comment: from then on the
    /// subscription is live in the broker.
    async fn open(version: &str, h: &TestHttp, path: &str, args: &[&str]) -> Stream {
        let mut child = Command::new("curl")
            .args(["-s", "-S", "-N", version])
            .args(args)
            .arg(h.url(path))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("curl");
        let stdout = child.stdout.take().unwrap();
        let mut s = Stream {
            child,
            stdout,
            buf: Vec::new(),
        };
        within(10, async {
            while !s.buf.starts_with(b": subscribed\n\n") {
                assert!(s.read().await, "stream ended before it opened");
            }
        })
        .await;
        s
    }

    /// Reads a chunk; false at the end of the stream.
    async fn read(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        let n = self.stdout.read(&mut chunk).await.unwrap();
        self.buf.extend_from_slice(&chunk[..n]);
        n > 0
    }

    fn parsed(&self) -> Vec<Event> {
        sse::parse(&String::from_utf8_lossy(&self.buf))
    }

    /// The first `n` events (waiting for them).
    async fn events(&mut self, n: usize) -> Vec<Event> {
        within(10, async {
            while self.parsed().len() < n {
                assert!(self.read().await, "stream ended: {:?}", self.parsed());
            }
        })
        .await;
        self.parsed()
    }

    /// Every event until curl exits (the server ended the response).
    async fn until_end(mut self) -> Vec<Event> {
        within(10, async { while self.read().await {} }).await;
        let status = within(10, self.child.wait()).await.unwrap();
        assert!(status.success(), "curl exited with {status}");
        self.parsed()
    }
}

fn payloads(events: &[Event]) -> Vec<Vec<u8>> {
    events
        .iter()
        .filter_map(|(e, d, _)| sse::payload_of(e, d))
        .collect()
}

async fn gateway(config: ApiConfig) -> Option<(TestGateway, TestHttp)> {
    curl_http2()?;
    let gw = TestGateway::start().await;
    let h = gw.http(config).await;
    Some((gw, h))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_over_http1_and_http2() {
    let Some((_gw, h)) = gateway(ApiConfig::default()).await else {
        return;
    };
    for (v, expect) in VERSIONS.iter().zip(["HTTP/1.1", "HTTP/2"]) {
        let topic = format!("/v1/t/routes/{}", expect.replace('/', "_"));
        let r = curl(v, &["-I", &h.url(&topic)], None).await;
        assert_eq!((r.version.as_str(), r.status), (expect, 404));
        let r = curl(v, &["-X", "PUT", &h.url(&topic)], None).await;
        assert_eq!((r.version.as_str(), r.status), (expect, 201));
        assert_eq!(put(v, &h, &topic).await, 200, "PUT is idempotent");
        // The same topic with an encoded slash.
        let encoded = topic.replacen("routes/", "routes%2F", 1);
        assert_eq!(curl(v, &["-I", &h.url(&encoded)], None).await.status, 200);
        let r = post(v, &h, &topic, b"hello", &[]).await;
        assert_eq!(r.status, 204, "{}", r.text());
        assert_eq!(r.header("x-matched-subscribers"), Some("0"));
        let r = curl(v, &[&h.url("/v1/time")], None).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        let text = r.text();
        let ms: u64 = text
            .strip_prefix("{\"unix_ms\":")
            .and_then(|t| t.strip_suffix('}'))
            .unwrap_or_else(|| panic!("{text}"))
            .parse()
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(ms.abs_diff(now) < 60_000, "{ms} vs {now}");
        let r = curl(v, &["-X", "DELETE", &h.url(&encoded)], None).await;
        assert_eq!(r.status, 204);
        assert_eq!(curl(v, &["-I", &h.url(&topic)], None).await.status, 404);
        let r = curl(v, &["-X", "DELETE", &h.url(&topic)], None).await;
        assert_eq!(r.status, 404);
        assert_eq!(post(v, &h, &topic, b"x", &[]).await.status, 404);
    }
    assert_eq!(h.api.topics(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_404_405_400_413() {
    let Some((_gw, h)) = gateway(ApiConfig {
        max_body: 1024,
        ..ApiConfig::default()
    })
    .await
    else {
        return;
    };
    for v in VERSIONS {
        let r = curl(v, &[&h.url("/nope")], None).await;
        assert_eq!(r.status, 404);
        assert!(r.text().contains("\"error\""), "{}", r.text());
        let r = curl(v, &[&h.url("/v1/t/never/created")], None).await;
        assert_eq!(r.status, 404, "GET of an unknown topic");
        let r = curl(v, &["-X", "PATCH", &h.url("/v1/t/x")], None).await;
        assert_eq!(r.status, 405);
        assert_eq!(r.header("allow"), Some("GET, HEAD, POST, PUT, DELETE"));
        let r = post(v, &h, "/v1/time", b"", &[]).await;
        assert_eq!(r.status, 405);
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        for bad in [
            "/v1/t/a/+/b",
            "/v1/t/a%2B",
            "/v1/t/%23",
            "/v1/t/nul%00",
            "/v1/t/%FF",
        ] {
            let r = curl(v, &["-X", "PUT", &h.url(bad)], None).await;
            assert_eq!(r.status, 400, "{bad}: {}", r.text());
        }
        // Malformed percent-escapes are refused, not taken as literal topics.
        let topics = h.api.topics();
        for bad in ["/v1/t/%ZZ", "/v1/t/%", "/v1/t/a%2", "/v1/t/x/%G0/y"] {
            let r = curl(v, &["-X", "PUT", &h.url(bad)], None).await;
            assert_eq!(r.status, 400, "{bad}: {}", r.text());
            assert!(r.text().contains("percent-encoding"), "{bad}: {}", r.text());
        }
        assert_eq!(
            h.api.topics(),
            topics,
            "no topic was created from a bad path"
        );
        assert!(matches!(put(v, &h, "/v1/t/limits").await, 200 | 201));
        let r = post(v, &h, "/v1/t/limits", &[7u8; 1025], &[]).await;
        assert_eq!(r.status, 413, "{}", r.text());
        let r = post(v, &h, "/v1/t/limits", &[7u8; 1024], &[]).await;
        assert_eq!(r.status, 204);
        let r = post(v, &h, "/v1/t/limits", b"x", &["-H", "X-Retain: maybe"]).await;
        assert_eq!(r.status, 400);
        let url = h.url("/v1/t/limits");
        for n in ["1001", "-1", "lots"] {
            let header = format!("X-History-Length: {n}");
            let r = curl(v, &["-H", &header, &url], None).await;
            assert_eq!(r.status, 400, "{header}");
        }
    }
    // Without a Content-Length (chunked), the limit holds while reading.
    let r = post(
        "--http1.1",
        &h,
        "/v1/t/limits",
        &[7u8; 3000],
        &["-H", "Transfer-Encoding: chunked"],
    )
    .await;
    assert_eq!(r.status, 413, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_streams_text_multiline_and_binary_events() {
    let Some((_gw, h)) = gateway(ApiConfig::default()).await else {
        return;
    };
    let messages: [&[u8]; 4] = [b"plain", b"two\nlines\n", b"\xff\x00bin\r\n", b""];
    for v in VERSIONS {
        let path = "/v1/t/stream/me";
        assert!(matches!(put(v, &h, path).await, 200 | 201));
        let mut s = Stream::open(v, &h, path, &["-D", "/dev/stderr"]).await;
        for m in messages {
            assert_eq!(post(v, &h, path, m, &[]).await.status, 204);
        }
        let events = s.events(messages.len()).await;
        assert_eq!(payloads(&events), messages.map(|m| m.to_vec()).to_vec());
        let kinds: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(kinds, ["message", "message", "message-base64", "message"]);
        let ids: Vec<&str> = events.iter().map(|e| e.2.as_deref().unwrap()).collect();
        assert_eq!(ids, ["1", "2", "3", "4"]);
        let text = String::from_utf8_lossy(&s.buf).into_owned();
        assert!(
            text.contains("data: two\ndata: lines\ndata: \n\n"),
            "{text}"
        );
        // The response headers (curl -D).
        s.child.start_kill().unwrap();
        let out = within(10, s.child.wait_with_output()).await.unwrap();
        let head = String::from_utf8_lossy(&out.stderr).to_ascii_lowercase();
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        assert!(head.contains("cache-control: no-cache"), "{head}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_post_reaches_mosquitto_sub_exactly() {
    if mqtt_tools().is_none() {
        return;
    }
    let Some((gw, h)) = gateway(ApiConfig::default()).await else {
        return;
    };
    let port = gw.mqtt.port().to_string();
    let sub = |id: &'static str, args: &'static [&'static str]| {
        let port = port.clone();
        async move {
            let child = Command::new("mosquitto_sub")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-i",
                    id,
                    "-V",
                    "5",
                    "-q",
                    "1",
                ])
                .args(["-t", "cross/h2m", "-C", "1"])
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("mosquitto_sub");
            child
        }
    };
    for (i, v) in VERSIONS.iter().enumerate() {
        assert!(matches!(put(v, &h, "/v1/t/cross%2Fh2m").await, 200 | 201));
        let (a, b) = if i == 0 {
            ("raw0", "fmt0")
        } else {
            ("raw1", "fmt1")
        };
        let raw = sub(a, &["-N"]).await;
        until("mosquitto_sub subscribed", || {
            gw.broker.client_subscriptions(a) == 1
        })
        .await;
        let payload: Vec<u8> = (0..=255u8).chain(*b"\nend").collect();
        let r = post(v, &h, "/v1/t/cross/h2m", &payload, &[]).await;
        assert_eq!(r.status, 204);
        assert_eq!(r.header("x-matched-subscribers"), Some("1"));
        let out = within(10, raw.wait_with_output()).await.unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, payload, "exact bytes");
        // As text, to read the QoS and the Content Type.
        let fmt = sub(b, &["-F", "%q %C %p"]).await;
        until("mosquitto_sub subscribed", || {
            gw.broker.client_subscriptions(b) == 1
        })
        .await;
        let ct = ["-H", "Content-Type: text/plain"];
        let r = post(v, &h, "/v1/t/cross/h2m", b"hi", &ct).await;
        assert_eq!(r.status, 204);
        let out = within(10, fmt.wait_with_output()).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            "1 text/plain hi"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_pub_reaches_http_stream() {
    if mqtt_tools().is_none() {
        return;
    }
    let Some((gw, h)) = gateway(ApiConfig::default()).await else {
        return;
    };
    let port = gw.mqtt.port().to_string();
    for v in VERSIONS {
        assert!(matches!(put(v, &h, "/v1/t/cross/m2h").await, 200 | 201));
        let mut s = Stream::open(v, &h, "/v1/t/cross%2Fm2h", &[]).await;
        for (qos, m) in [
            ("0", "hello from mqtt"),
            ("1", "multi\nline"),
            ("2", "ünïcödé"),
        ] {
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
        let got = payloads(&s.events(3).await);
        assert_eq!(
            got,
            [
                &b"hello from mqtt"[..],
                b"multi\nline",
                "ünïcödé".as_bytes()
            ]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_ends_streaming_gets() {
    let Some((gw, h)) = gateway(ApiConfig::default()).await else {
        return;
    };
    assert_eq!(put("--http1.1", &h, "/v1/t/doomed").await, 201);
    let mut one = Stream::open("--http1.1", &h, "/v1/t/doomed", &[]).await;
    let two = Stream::open("--http2-prior-knowledge", &h, "/v1/t/doomed", &[]).await;
    assert_eq!(h.api.subscribers(), 2);
    assert_eq!(
        post("--http1.1", &h, "/v1/t/doomed", b"last", &[])
            .await
            .status,
        204
    );
    one.events(1).await;
    let r = curl(
        "--http2-prior-knowledge",
        &["-X", "DELETE", &h.url("/v1/t/doomed")],
        None,
    )
    .await;
    assert_eq!(r.status, 204);
    for s in [one, two] {
        let events = s.until_end().await;
        let last = events.last().unwrap();
        assert_eq!(last.0, "deleted");
        assert_eq!(last.1, "{\"topic\":\"doomed\"}");
        assert_eq!(payloads(&events), [b"last".to_vec()]);
    }
    until("streams released", || {
        h.api.subscribers() == 0 && gw.broker.sessions() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_length_replays_then_goes_live() {
    let Some((_gw, h)) = gateway(ApiConfig::default()).await else {
        return;
    };
    for v in VERSIONS {
        let path = format!("/v1/t/hist/{}", &v[2..]);
        assert_eq!(put(v, &h, &path).await, 201);
        for i in 1..=5 {
            let m = format!("m{i}");
            assert_eq!(post(v, &h, &path, m.as_bytes(), &[]).await.status, 204);
        }
        let mut s = Stream::open(v, &h, &path, &["-H", "X-History-Length: 3"]).await;
        let events = s.events(3).await;
        assert_eq!(
            payloads(&events),
            [b"m3".to_vec(), b"m4".to_vec(), b"m5".to_vec()]
        );
        assert_eq!(post(v, &h, &path, b"m6", &[]).await.status, 204);
        let events = s.events(4).await;
        assert_eq!(payloads(&events[3..]), [b"m6".to_vec()]);
        assert_eq!(events[3].2.as_deref(), Some("4"));
        // More than there is: everything cached, once.
        let mut all = Stream::open(v, &h, &path, &["-H", "X-History-Length: 100"]).await;
        let events = all.events(6).await;
        let want: Vec<Vec<u8>> = (1..=6).map(|i| format!("m{i}").into_bytes()).collect();
        assert_eq!(payloads(&events), want);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(all.events(6).await.len(), 6, "no duplicates");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_gone_ends_the_subscription() {
    let Some((gw, h)) = gateway(ApiConfig {
        keepalive: Duration::from_millis(100),
        ..ApiConfig::default()
    })
    .await
    else {
        return;
    };
    assert_eq!(put("--http1.1", &h, "/v1/t/leaving").await, 201);
    for v in VERSIONS {
        let mut s = Stream::open(v, &h, "/v1/t/leaving", &[]).await;
        assert_eq!(h.api.subscribers(), 1);
        assert_eq!(gw.broker.subscriptions(), 1);
        // Keep-alive comments flow on an idle stream.
        within(10, async {
            while !String::from_utf8_lossy(&s.buf).contains(": keep-alive") {
                assert!(s.read().await);
            }
        })
        .await;
        s.child.kill().await.unwrap();
        until("subscription ended", || {
            h.api.subscribers() == 0 && gw.broker.sessions() == 0
        })
        .await;
    }
}

/// `quichub relay --http ADDR` serves the API and says where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_binary_serves_http() {
    if curl_http2().is_none() {
        return;
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_quichub"))
        .args([
            "relay",
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--mqtt",
            "off",
        ])
        .args(["--http", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("relay output").unwrap();
        if let Some(rest) = line.strip_prefix("http tcp ") {
            assert!(rest.ends_with("(HTTP/1.1, HTTP/2 cleartext)"), "{line}");
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let r = curl(
        "--http2-prior-knowledge",
        &[&format!("http://{addr}/v1/time")],
        None,
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with("{\"unix_ms\":"));
}

// --- TCP limits: timeouts and connection caps, driven by hand as an
// attacker would (raw sockets, no HTTP client).

use quichub_net::tcp_limits::TcpLimits;
use tokio::net::TcpStream;

async fn limited(limits: TcpLimits) -> (TestGateway, TestHttp) {
    let gw = TestGateway::start().await;
    let h = gw.http_with(ApiConfig::default(), limits).await;
    (gw, h)
}

/// Reads until the server closes `s` (EOF or reset); how long that took.
async fn closed_within(s: &mut TcpStream, secs: u64) -> Duration {
    let t = std::time::Instant::now();
    let mut b = [0u8; 4096];
    within(secs, async {
        while let Ok(n) = s.read(&mut b).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    t.elapsed()
}

/// One HTTP/1.1 response from `s`: status and body (by Content-Length).
/// Connects to `addr` and asserts a GET of /v1/time is served; returns the
/// kept-alive connection.
async fn served(addr: impl tokio::net::ToSocketAddrs) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(GET_TIME).await.unwrap();
    assert_eq!(response(&mut s).await.0, 200);
    s
}

async fn response(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    within(10, async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + len {
                    let status = head[9..12].parse().unwrap();
                    return (status, buf[end + 4..end + 4 + len].to_vec());
                }
            }
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0, "closed before a whole response");
            buf.extend_from_slice(&b[..n]);
        }
    })
    .await
}

/// Reads from `s` into `got` until it holds `want`.
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, want: &[u8]) {
    let mut b = [0u8; 4096];
    within(10, async {
        while !got.windows(want.len()).any(|w| w == want) {
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0, "stream closed");
            got.extend_from_slice(&b[..n]);
        }
    })
    .await
}

const GET_TIME: &[u8] = b"GET /v1/time HTTP/1.1\r\nHost: localhost\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_slow_and_half_handshaken_connections_are_closed_at_the_header_timeout() {
    let (_gw, h) = limited(TcpLimits {
        http_header_timeout_ms: 300,
        ..TcpLimits::default()
    })
    .await;
    // Sends nothing at all (hyper-util's auto builder would wait forever for
    // the bytes that tell HTTP/1.1 from HTTP/2).
    let mut idle = TcpStream::connect(h.addr).await.unwrap();
    let took = closed_within(&mut idle, 10).await;
    assert!(
        took >= Duration::from_millis(250),
        "closed by the timeout: {took:?}"
    );
    // A request head one header line every 50 ms: never done, never idle
    // for long.
    let mut slow = TcpStream::connect(h.addr).await.unwrap();
    slow.write_all(b"GET /v1/time HTTP/1.1\r\n").await.unwrap();
    let (mut rd, mut wr) = slow.into_split();
    let dribble = tokio::spawn(async move {
        while wr.write_all(b"X-Slow: 1\r\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    within(10, async {
        let mut b = [0u8; 64];
        while matches!(rd.read(&mut b).await, Ok(n) if n > 0) {}
    })
    .await;
    dribble.abort();
    // HTTP/2: part of the preface; the whole preface and no SETTINGS; a
    // finished handshake and no request.
    let settings: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    for opening in [
        &b"PRI * HTTP/2.0\r\n"[..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        &[&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], settings].concat(),
    ] {
        let mut s = TcpStream::connect(h.addr).await.unwrap();
        s.write_all(opening).await.unwrap();
        closed_within(&mut s, 10).await;
    }
    until("every descriptor released", || h.limiter.open() == 0).await;
    // The listener still serves.
    served(h.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_lasts_per_request_and_ends_at_the_idle_timeout() {
    let (_gw, h) = limited(TcpLimits {
        http_header_timeout_ms: 300,
        http_idle_timeout_ms: 800,
        ..TcpLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    // Well past the header timeout in all, each request on time.
    for _ in 0..6 {
        s.write_all(GET_TIME).await.unwrap();
        assert_eq!(response(&mut s).await.0, 200);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let took = closed_within(&mut s, 10).await;
    assert!(
        took >= Duration::from_millis(500),
        "idle timeout, not header: {took:?}"
    );
    // After a request, a slow next head is cut at the header timeout.
    let mut s = served(h.addr).await;
    s.write_all(b"GET /v1/time HTTP/1.1\r\n").await.unwrap();
    let took = closed_within(&mut s, 10).await;
    assert!(took < Duration::from_millis(5000), "{took:?}");
}

/// HTTP/2 (h2c, prior knowledge) by hand: a request is answered, then the
/// connection, with no stream open, is closed at the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connection_ends_at_the_idle_timeout() {
    let (_gw, h) = limited(TcpLimits {
        http_header_timeout_ms: 300,
        http_idle_timeout_ms: 800,
        ..TcpLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS
                                                         // HEADERS, END_STREAM | END_HEADERS, stream 1: GET http /v1/time (HPACK
                                                         // static :method GET, :scheme http, :path literal).
    let block = [&[0x82, 0x86, 0x04, 0x08][..], b"/v1/time"].concat();
    out.extend_from_slice(&[0, 0, block.len() as u8, 1, 5, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    s.write_all(&out).await.unwrap();
    // Frames until a DATA frame of stream 1 with END_STREAM.
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    within(10, async {
        loop {
            let mut at = 0;
            while buf.len() >= at + 9 {
                let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]) as usize;
                let (typ, flags) = (buf[at + 3], buf[at + 4]);
                if typ == 0 && flags & 1 == 1 {
                    return;
                }
                at += 9 + len;
            }
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0, "closed before the response");
            buf.extend_from_slice(&b[..n]);
        }
    })
    .await;
    let took = closed_within(&mut s, 10).await;
    assert!(
        took >= Duration::from_millis(500),
        "idle timeout, not header: {took:?}"
    );
    until("released", || h.limiter.open() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_body_is_408_at_the_body_timeout() {
    let (_gw, h) = limited(TcpLimits {
        http_body_timeout_ms: 300,
        ..TcpLimits::default()
    })
    .await;
    let mut c = TcpStream::connect(h.addr).await.unwrap();
    c.write_all(b"PUT /v1/t/slow HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut c).await.0, 201);
    let s = TcpStream::connect(h.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(b"POST /v1/t/slow HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n")
        .await
        .unwrap();
    // One byte every 50 ms: never stalls long, never finishes in time.
    let dribble = tokio::spawn(async move {
        while wr.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut got = Vec::new();
    within(10, async {
        let mut b = [0u8; 1024];
        while let Ok(n) = rd.read(&mut b).await {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&b[..n]);
        }
    })
    .await;
    dribble.abort();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_get_outlives_the_timeouts() {
    let (_gw, h) = limited(TcpLimits {
        http_header_timeout_ms: 200,
        http_idle_timeout_ms: 200,
        ..TcpLimits::default()
    })
    .await;
    let mut c = TcpStream::connect(h.addr).await.unwrap();
    c.write_all(b"PUT /v1/t/live HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut c).await.0, 201);
    let mut stream = TcpStream::connect(h.addr).await.unwrap();
    stream
        .write_all(b"GET /v1/t/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    read_until(&mut stream, &mut got, b": subscribed").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut p = TcpStream::connect(h.addr).await.unwrap();
    p.write_all(b"POST /v1/t/live HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    assert_eq!(response(&mut p).await.0, 204);
    read_until(&mut stream, &mut got, b"hello").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_address_cap_closes_the_extra_connection_at_once() {
    let (_gw, h) = limited(TcpLimits {
        max_connections_per_ip: 3,
        http_header_timeout_ms: 30_000,
        ..TcpLimits::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(h.addr).await.unwrap());
    }
    until("three admitted", || h.limiter.open() == 3).await;
    let mut extra = TcpStream::connect(h.addr).await.unwrap();
    // Closed long before the 30 s header timeout.
    closed_within(&mut extra, 5).await;
    assert_eq!(h.limiter.open(), 3);
    drop(held.pop());
    until("one freed", || h.limiter.open() == 2).await;
    served(h.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_accepts_while_http_is_at_its_cap() {
    let (gw, h) = limited(TcpLimits {
        max_connections: 2,
        max_connections_per_ip: 0,
        http_header_timeout_ms: 30_000,
        ..TcpLimits::default()
    })
    .await;
    let _held = [
        TcpStream::connect(h.addr).await.unwrap(),
        TcpStream::connect(h.addr).await.unwrap(),
    ];
    until("two admitted", || h.limiter.open() == 2).await;
    let mut extra = TcpStream::connect(h.addr).await.unwrap();
    closed_within(&mut extra, 5).await;
    let _mqtt =
        common::mqtt::Raw::connect(&gw, quichub_mqtt::Version::V311, "while-http-full").await;
}

/// MQTT 3.1.1 CONNECT, client id `x`, and the CONNACK it gets.
const MQTT_CONNECT: &[u8] = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x";

/// `quichub relay` on 256 descriptors, flooded with 300 idle HTTP
/// connections: the HTTP listener holds only its share, MQTT and metrics
/// still accept, and HTTP serves again once the idle ones time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_binary_keeps_its_other_listeners_when_http_is_flooded() {
    let dir = std::env::temp_dir().join(format!("quichub-tcp-flood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("relay.toml");
    std::fs::write(
        &cfg,
        "[tcp]\nmax_connections_per_ip = 0\nhttp_header_timeout_ms = 1500\n",
    )
    .unwrap();
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec '{}' relay --bind 127.0.0.1:0 --metrics 127.0.0.1:0 \
             --mqtt 127.0.0.1:0 --mqtt-tls off --data-dir off --http 127.0.0.1:0 --config '{}'",
            env!("CARGO_BIN_EXE_quichub"),
            cfg.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let child = Kill(child);
    let (mut mqtt, mut http, mut metrics) = (None, None, None);
    while metrics.is_none() {
        let line = lines.next().expect("relay output").unwrap();
        let first = |rest: &str| rest.split_whitespace().next().unwrap().to_string();
        if let Some(rest) = line.strip_prefix("mqtt tcp ") {
            mqtt = Some(first(rest));
        } else if let Some(rest) = line.strip_prefix("http tcp ") {
            http = Some(first(rest));
        } else if let Some(rest) = line.strip_prefix("metrics http://") {
            metrics = Some(rest.trim_end_matches("/metrics").to_string());
        }
    }
    let (mqtt, http, metrics) = (mqtt.unwrap(), http.unwrap(), metrics.unwrap());
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", child.0.id()))
            .unwrap()
            .count()
    };
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(TcpStream::connect(&http).await.unwrap());
    }
    // Each connection was accepted and then held or closed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = fds();
    assert!(held < 200, "{held} descriptors held");
    let mut m = TcpStream::connect(&mqtt).await.unwrap();
    m.write_all(MQTT_CONNECT).await.unwrap();
    let mut ack = [0u8; 4];
    within(10, m.read_exact(&mut ack)).await.unwrap();
    assert_eq!(
        ack,
        [0x20, 0x02, 0x00, 0x00],
        "CONNACK while HTTP is flooded"
    );
    let mut s = TcpStream::connect(&metrics).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        response(&mut s).await.0,
        200,
        "metrics while HTTP is flooded"
    );
    // The held ones end at the header timeout; HTTP serves again.
    for s in &mut flood {
        closed_within(s, 10).await;
    }
    drop(flood);
    served(&http).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `quichub relay` on 64 descriptors with no reserve, flooded on both MQTT
/// and HTTP until accept fails with EMFILE: failed accepts back off and are
/// logged a few times, not once per attempt, and the relay serves again
/// once the flood goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_binary_out_of_descriptors_backs_off_and_logs_little() {
    let dir = std::env::temp_dir().join(format!("quichub-tcp-emfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("relay.toml");
    std::fs::write(
        &cfg,
        "[tcp]\nmax_connections_per_ip = 0\nreserved_fds = 0\nhttp_header_timeout_ms = 60000\n",
    )
    .unwrap();
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 64 && exec '{}' relay --bind 127.0.0.1:0 --metrics off \
             --mqtt 127.0.0.1:0 --mqtt-tls off --data-dir off --http 127.0.0.1:0 --config '{}'",
            env!("CARGO_BIN_EXE_quichub"),
            cfg.display()
        ))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let _child = Kill(child);
    // Listener lines come on stdout, logs on stderr.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let (log_tx, logs) = std::sync::mpsc::channel::<String>();
    for (out, tx) in [
        (Box::new(stdout) as Box<dyn std::io::Read + Send>, tx),
        (Box::new(stderr), log_tx),
    ] {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let (mut mqtt, mut http) = (None, None);
    while mqtt.is_none() || http.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("relay output");
        let first = |rest: &str| rest.split_whitespace().next().unwrap().to_string();
        if let Some(rest) = line.strip_prefix("mqtt tcp ") {
            mqtt = Some(first(rest));
        } else if let Some(rest) = line.strip_prefix("http tcp ") {
            http = Some(first(rest));
        }
    }
    let (mqtt, http) = (mqtt.unwrap(), http.unwrap());
    // 32 per listener on 64 descriptors: together past the limit.
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(TcpStream::connect(&mqtt).await.unwrap());
        flood.push(TcpStream::connect(&http).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let all: Vec<String> = logs.try_iter().collect();
    let logged: Vec<&String> = all.iter().filter(|l| l.contains("accept")).collect();
    assert!(
        logged.iter().any(|l| l.contains("Too many open files")),
        "the relay ran out: {all:?}"
    );
    assert!(logged.len() <= 10, "{} lines: {logged:?}", logged.len());
    drop(flood);
    let mut s = within(10, async {
        loop {
            let mut s = TcpStream::connect(&http).await.unwrap();
            if s.write_all(GET_TIME).await.is_ok() {
                let mut b = [0u8; 12];
                if s.read_exact(&mut b).await.is_ok() && &b == b"HTTP/1.1 200" {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let _ = s.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
