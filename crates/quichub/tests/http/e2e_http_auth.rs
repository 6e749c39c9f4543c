//! The HTTP API with auth on (`[auth] key` = an HS256 secret): every topic
//! route with no token, a bad one, an expired one, one without the right
//! `put`/`get` and a good one, with curl over HTTP/1.1 and HTTP/2 and with
//! aioquic over HTTP/3; `?jwt=` on an event stream; `/v1/relay` filtered by
//! the token. Tokens come from PyJWT (an independent implementation) and
//! from quichub-auth's own signer.

use quichub_testkit as common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use common::{curl_http2, h3_python, test_config, within, H3Client, TestRelay};
use moqt::{FullTrackName, TrackNamespace};
use quichub_auth::jwt::{Claims, Key};
use quichub_client::TrackMode;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-e2e-http-auth";

/// A hub with auth on: HTTP/1.1 and HTTP/2 on a TCP port, HTTP/3 on the
/// relay's UDP port.
struct Hub {
    relay: TestRelay,
    http: std::net::SocketAddr,
    key: Key,
    python: PathBuf,
    dir: PathBuf,
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The test venv's python with PyJWT and aioquic, or `None` (skipped) when
/// it or curl is missing and `QUICHUB_MQTT_PYTHON` is unset.
fn tools() -> Option<PathBuf> {
    curl_http2()?;
    let py = h3_python()?;
    let ok = std::process::Command::new(&py)
        .args(["-c", "import jwt"])
        .status()
        .is_ok_and(|s| s.success());
    match (ok, std::env::var_os("QUICHUB_MQTT_PYTHON").is_some()) {
        (true, _) => Some(py),
        (false, true) => panic!("PyJWT is missing: run scripts/install-mqtt-tools.sh"),
        (false, false) => {
            eprintln!("SKIPPED: PyJWT not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

impl Hub {
    async fn start(name: &str) -> Option<Hub> {
        let python = tools()?;
        let dir = std::env::temp_dir().join(format!(
            "quichub-e2e-http-auth-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("hs256.secret"), SECRET).unwrap();
        let mut c = test_config();
        c.http.address = "127.0.0.1:0".into();
        c.quic.http3 = true;
        c.auth.key = Some(dir.join("hs256.secret"));
        // Expired tokens are refused, and streams end, at `exp`.
        c.auth.leeway_s = 0;
        let relay = TestRelay::with_hub_config(c).await;
        let http = relay.hub.http_addr().unwrap();
        Some(Hub {
            relay,
            http,
            key: Key::from_secret(SECRET).unwrap(),
            python,
            dir,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// A token signed by quichub-auth, valid for `ttl` seconds.
    fn token(&self, root: &str, put: &[&str], get: &[&str], ttl: u64) -> String {
        let now = unix_now();
        let claims = Claims {
            root: root.into(),
            put: put.iter().map(|s| s.to_string()).collect(),
            get: get.iter().map(|s| s.to_string()).collect(),
            iat: Some(now),
            exp: Some(now + ttl),
            ..Claims::default()
        };
        self.key.sign(&claims, None).unwrap()
    }

    /// A token signed by PyJWT (HS256) with `claims`, with `secret`.
    fn pyjwt(&self, claims: Value, secret: &[u8]) -> String {
        let key = self.dir.join(format!("pyjwt-{}", unix_now_nanos()));
        std::fs::write(&key, secret).unwrap();
        let out = std::process::Command::new(&self.python)
            .args([
                "-c",
                "import jwt, json, sys\n\
                 print(jwt.encode(json.loads(sys.argv[1]), open(sys.argv[2], 'rb').read(), algorithm='HS256'))",
            ])
            .arg(claims.to_string())
            .arg(&key)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn unix_now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// One answer: status, `WWW-Authenticate`, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    challenge: Option<String>,
    body: String,
}

/// `curl -i VERSION -X METHOD [-H Authorization: Bearer TOKEN] URL`.
async fn curl(version: &str, method: &str, url: &str, bearer: Option<&str>) -> Answer {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-S", "-i", "--max-time", "10", version]);
    match method {
        "HEAD" => cmd.arg("-I"),
        m => cmd.args(["-X", m]),
    };
    if let Some(t) = bearer {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = within(
        15,
        cmd.arg(url)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "curl {version} {method} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let challenge = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
        .map(|(_, v)| v.trim().to_string());
    Answer {
        status,
        challenge,
        body: body.to_string(),
    }
}

/// The tokens of the matrix, for topics under `zone/`.
struct Tokens {
    bad: String,
    expired: String,
    read_only: String,
    write_only: String,
    good: String,
}

impl Tokens {
    fn new(hub: &Hub) -> Self {
        let now = unix_now();
        Tokens {
            // Signed with another secret.
            bad: hub.pyjwt(
                json!({"root": "mqtt", "put": "zone", "get": "zone", "exp": now + 600}),
                b"another secret, long enough for HS256 use",
            ),
            expired: hub.pyjwt(
                json!({"root": "mqtt", "put": "zone", "get": "zone", "exp": now - 60}),
                SECRET,
            ),
            read_only: hub.pyjwt(
                json!({"root": "mqtt", "get": ["zone"], "exp": now + 600}),
                SECRET,
            ),
            write_only: hub.token("mqtt", &["zone"], &[], 600),
            good: hub.pyjwt(
                json!({"root": "mqtt", "put": "zone", "get": "zone", "exp": now + 600}),
                SECRET,
            ),
        }
    }
}

/// Every topic request of the matrix: (method, path, token, status,
/// challenge prefix). `GET` with a good token is a stream: see
/// [`event_stream_with_query_token`].
fn matrix<'a>(
    t: &'a Tokens,
    topic: &str,
) -> Vec<(&'static str, String, Option<&'a str>, u16, &'static str)> {
    let path = format!("/v1/t/zone/{topic}");
    let invalid = "Bearer error=\"invalid_token\"";
    let scope = "Bearer error=\"insufficient_scope\"";
    let mut m = Vec::new();
    for method in ["PUT", "HEAD", "POST", "GET", "DELETE"] {
        m.push((method, path.clone(), None, 401, "Bearer"));
        m.push((method, path.clone(), Some(&t.bad[..]), 401, invalid));
        m.push((method, path.clone(), Some(&t.expired[..]), 401, invalid));
        let wrong = match method {
            "GET" | "HEAD" => &t.write_only,
            _ => &t.read_only,
        };
        m.push((method, path.clone(), Some(&wrong[..]), 403, scope));
    }
    // Then the good token, in an order where each succeeds.
    m.push(("PUT", path.clone(), Some(&t.good[..]), 201, ""));
    m.push(("HEAD", path.clone(), Some(&t.good[..]), 200, ""));
    m.push(("POST", path.clone(), Some(&t.good[..]), 204, ""));
    m.push(("DELETE", path.clone(), Some(&t.good[..]), 204, ""));
    // Outside the grant (a path-boundary neighbour): 403.
    m.push(("PUT", "/v1/t/zonex/1".into(), Some(&t.good[..]), 403, scope));
    m
}

fn check(
    transport: &str,
    i: usize,
    req: &(&str, String, Option<&str>, u16, &str),
    status: u16,
    challenge: Option<&str>,
) {
    let (method, path, token, want, prefix) = req;
    let who = match token {
        None => "no token",
        Some(_) => "token",
    };
    assert_eq!(status, *want, "{transport} #{i} {method} {path} with {who}");
    if !prefix.is_empty() {
        let c = challenge.unwrap_or_else(|| panic!("{transport} #{i}: no WWW-Authenticate"));
        if *prefix == "Bearer" {
            assert_eq!(c, "Bearer", "{transport} #{i}");
        } else {
            assert!(c.starts_with(prefix), "{transport} #{i}: {c}");
            assert!(c.contains("error_description=\""), "{transport} #{i}: {c}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_over_http1_and_http2() {
    let Some(hub) = Hub::start("curl").await else {
        return;
    };
    let tokens = Tokens::new(&hub);
    for (n, version) in ["--http1.1", "--http2-prior-knowledge"].iter().enumerate() {
        for (i, req) in matrix(&tokens, &format!("h{n}")).iter().enumerate() {
            let (method, path, token, ..) = req;
            let a = curl(version, method, &hub.url(path), *token).await;
            check(version, i, req, a.status, a.challenge.as_deref());
        }
        // Public: the clock, the pages, the certificate hash.
        for path in [
            "/v1/time",
            "/",
            "/watch/live/demo",
            "/certificate.sha256",
            "/assets/player.js",
        ] {
            let a = curl(version, "GET", &hub.url(path), None).await;
            assert_eq!(a.status, 200, "{version} {path}");
        }
        // A scheme other than Bearer: 400 invalid_request.
        let out = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                version,
                "-u",
                "user:pass",
            ])
            .arg(hub.url("/v1/t/zone/x"))
            .output()
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "400");
    }
    let m = &hub.relay.hub.auth().metrics;
    assert!(m.get("http", false, "expired") >= 10);
    assert!(m.get("http", false, "bad_signature") >= 10);
    assert!(m.get("http", false, "not_authorized") >= 10);
    assert!(m.get("http", true, "jwt") >= 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_over_http3() {
    let Some(hub) = Hub::start("h3").await else {
        return;
    };
    let tokens = Tokens::new(&hub);
    let reqs = matrix(&tokens, "h3");
    let specs: Vec<Value> = reqs
        .iter()
        .map(|(method, path, token, ..)| {
            let mut r = json!({"method": method, "path": path});
            if let Some(t) = token {
                r["headers"] = json!({"authorization": format!("Bearer {t}")});
            }
            r
        })
        .collect();
    let v = H3Client::start(
        &hub.python,
        hub.relay.addr.port(),
        json!({ "requests": specs }),
        &[],
    )
    .await
    .result()
    .await;
    for (i, req) in reqs.iter().enumerate() {
        let r = &v["responses"][i];
        let status = r["status"].as_u64().unwrap_or(0) as u16;
        check(
            "h3",
            i,
            req,
            status,
            r["headers"]["www-authenticate"].as_str(),
        );
    }
    // A stream over HTTP/3 with the token in the query.
    let path = format!("/v1/t/zone/h3s?jwt={}", tokens.read_only);
    let put = curl(
        "--http1.1",
        "PUT",
        &hub.url("/v1/t/zone/h3s"),
        Some(&tokens.good),
    )
    .await;
    assert_eq!(put.status, 201);
    let v = H3Client::start(
        &hub.python,
        hub.relay.addr.port(),
        json!({"requests": [{"method": "GET", "path": path, "stream": {"until_bytes": 14, "timeout": 10}}]}),
        &[],
    )
    .await
    .result()
    .await;
    assert_eq!(v["responses"][0]["status"], 200);
    assert_eq!(common::h3_body(&v["responses"][0]), b": subscribed\n\n");
}

/// A `curl -N` event stream; its output so far.
struct Stream {
    child: tokio::process::Child,
    out: tokio::process::ChildStdout,
    buf: Vec<u8>,
}

impl Stream {
    async fn open(version: &str, url: &str) -> Stream {
        let mut child = Command::new("curl")
            .args(["-s", "-S", "-N", version, url])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut s = Stream {
            child,
            out,
            buf: Vec::new(),
        };
        s.until(b": subscribed\n\n").await;
        s
    }

    async fn until(&mut self, what: &[u8]) {
        within(15, async {
            while !self.buf.windows(what.len()).any(|w| w == what) {
                let mut chunk = [0u8; 4096];
                let n = self.out.read(&mut chunk).await.unwrap();
                assert!(
                    n > 0,
                    "stream ended: {}",
                    String::from_utf8_lossy(&self.buf)
                );
                self.buf.extend_from_slice(&chunk[..n]);
            }
        })
        .await
    }

    /// Reads to the end; curl's exit status.
    async fn end(mut self) -> std::process::ExitStatus {
        within(15, async {
            let mut rest = Vec::new();
            self.out.read_to_end(&mut rest).await.unwrap();
            self.buf.extend_from_slice(&rest);
        })
        .await;
        within(10, self.child.wait()).await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_with_query_token() {
    let Some(hub) = Hub::start("sse").await else {
        return;
    };
    let tokens = Tokens::new(&hub);
    for version in ["--http1.1", "--http2-prior-knowledge"] {
        let topic = hub.url("/v1/t/zone/sse");
        assert_eq!(
            curl(version, "PUT", &topic, Some(&tokens.good))
                .await
                .status,
            201
        );
        // EventSource cannot set headers: the token rides in the query.
        let mut s = Stream::open(version, &format!("{topic}?jwt={}", tokens.read_only)).await;
        let post = curl(version, "POST", &topic, Some(&tokens.write_only)).await;
        assert_eq!(post.status, 204);
        s.until(b"event: message\ndata: \n\n").await;
        drop(s);
        for (q, want) in [
            (format!("?jwt={}", tokens.expired), 401),
            (format!("?jwt={}", tokens.bad), 401),
            (format!("?jwt={}", tokens.write_only), 403),
            ("?jwt=".to_string(), 401),
        ] {
            let a = curl(version, "GET", &format!("{topic}{q}"), None).await;
            assert_eq!(a.status, want, "{version} {q}");
            assert!(a.body.contains("\"error\""), "{}", a.body);
        }
        // A token that expires ends the stream at its `exp`.
        let short = hub.token("mqtt", &[], &["zone"], 2);
        let s = Stream::open(version, &format!("{topic}?jwt={short}")).await;
        let mut s = s;
        s.until(b": token expired\n\n").await;
        assert!(s.end().await.success());
        assert_eq!(
            curl(version, "DELETE", &topic, Some(&tokens.good))
                .await
                .status,
            204
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_json_shows_what_the_token_may_read() {
    let Some(hub) = Hub::start("relay").await else {
        return;
    };
    // A MoQT publisher (token in the WebTransport/QUIC URL) on two namespaces.
    let all = hub.token("", &["live", "secret"], &[], 600);
    let url = format!("moqt://127.0.0.1:{}/?jwt={all}", hub.relay.addr.port());
    let publisher = quichub_client::ClientSession::connect(&url, hub.relay.opts())
        .await
        .unwrap();
    let mut namespaces = Vec::new();
    let mut tracks = Vec::new();
    for ns in ["live/a", "secret/b"] {
        namespaces.push(
            publisher
                .publish_namespace(TrackNamespace::from_path(ns))
                .await
                .unwrap(),
        );
        let track = publisher
            .create_track(FullTrackName::new(ns, "video"), 1, TrackMode::Push)
            .await
            .unwrap();
        tracks.push(track);
    }
    let names = |body: &str| -> (Vec<String>, Vec<String>) {
        let v: Value = serde_json::from_str(body).unwrap();
        let join = |x: &Value| {
            x["namespace"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap())
                .collect::<Vec<_>>()
                .join("/")
        };
        (
            v["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .map(join)
                .collect(),
            v["tracks"].as_array().unwrap().iter().map(join).collect(),
        )
    };
    let live = hub.pyjwt(json!({"get": "live", "exp": unix_now() + 600}), SECRET);
    let both = hub.token("", &[], &["live", "secret"], 600);
    for version in ["--http1.1", "--http2-prior-knowledge"] {
        let url = hub.url("/v1/relay");
        let a = curl(version, "GET", &url, None).await;
        assert_eq!(a.status, 401);
        assert_eq!(a.challenge.as_deref(), Some("Bearer"));
        let a = curl(version, "GET", &url, Some("x.y.z")).await;
        assert_eq!(a.status, 401);
        let a = curl(version, "GET", &url, Some(&live)).await;
        assert_eq!(a.status, 200);
        assert_eq!(
            names(&a.body),
            (vec!["live/a".into()], vec!["live/a".into()])
        );
        let a = curl(version, "GET", &format!("{url}?jwt={both}"), None).await;
        assert_eq!(a.status, 200);
        let (mut ns, mut tracks) = names(&a.body);
        ns.sort();
        tracks.sort();
        assert_eq!(ns, ["live/a", "secret/b"]);
        assert_eq!(tracks, ["live/a", "secret/b"]);
    }
    drop((namespaces, tracks));
}
