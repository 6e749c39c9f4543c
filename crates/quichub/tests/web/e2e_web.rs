//! The web pages `quichub relay` serves, driven in headless Chromium
//! (Debian's, through playwright-core from `web/node_modules`): the player
//! decodes a live hang broadcast (H.264 or VP8 video, Opus audio, made by
//! ffmpeg) over WebTransport and shows its latency; the dashboard lists the
//! tracks and plots the IMU track of `quichub pub --profile imu`. Also runs
//! the JS MoQT codec's unit tests (`node --test`).
//!
//! Without node, `web/node_modules`, Chromium or ffmpeg the tests print
//! `SKIPPED: reason` and pass, unless `QUICHUB_WEB_TESTS=1` (set by
//! `scripts/test.sh`, which installs them), which makes them fail.
//! Screenshots go to `$CARGO_TARGET_TMPDIR/e2e_web/`.

use crate::media;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use quichub_client::{ClientSession, ConnectOptions};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_quichub");

pub(crate) fn web_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web")
}

pub(crate) fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e_web");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn chromium() -> PathBuf {
    std::env::var_os("QUICHUB_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

/// `None` (after printing why) when something the tests need is missing
/// and `QUICHUB_WEB_TESTS` is not `1`; a panic when it is.
/// Browser tests take turns: several Chromium instances with live
/// publishers at once on a 2-core machine crashed a renderer ("Target
/// crashed") now and then.
static ONE_BROWSER_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A browser test's turn (held until the test ends); nothing for others.
pub(crate) struct Turn(#[allow(dead_code)] Option<std::sync::MutexGuard<'static, ()>>);

pub(crate) fn prerequisites(need_browser: bool) -> Option<Turn> {
    let mut missing = Vec::new();
    if Command::new("node").arg("--version").output().is_err() {
        missing.push("node".to_string());
    }
    if need_browser {
        if !web_dir().join("node_modules/playwright-core").is_dir() {
            missing.push("web/node_modules (run `npm ci` in web/)".to_string());
        }
        if !chromium().exists() {
            missing.push(format!(
                "{} (apt-get install chromium)",
                chromium().display()
            ));
        }
        if Command::new("ffmpeg").arg("-version").output().is_err() {
            missing.push("ffmpeg (apt-get install ffmpeg)".to_string());
        }
    }
    if missing.is_empty() {
        return Some(Turn(need_browser.then(|| {
            ONE_BROWSER_AT_A_TIME
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        })));
    }
    let why = format!("missing {}", missing.join(", "));
    if std::env::var("QUICHUB_WEB_TESTS").as_deref() == Ok("1") {
        panic!("QUICHUB_WEB_TESTS=1 but {why}");
    }
    println!("SKIPPED: {why}");
    None
}

pub(crate) struct Relay {
    child: Child,
    pub(crate) quic: u16,
    pub(crate) http: String,
    /// `host:port` of `/metrics` (only from [`start_relay_observed`]).
    pub(crate) metrics: Option<String>,
    /// The HTTPS port's address, when started with `--https`.
    https: Option<String>,
    /// The relay's log (stderr; only from [`start_relay_observed`]).
    pub(crate) log: Option<std::sync::Arc<std::sync::Mutex<String>>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_relay() -> Relay {
    spawn_relay(false)
}

/// A relay with its metrics on and its log (stderr) collected.
fn start_relay_observed() -> Relay {
    spawn_relay(true)
}

fn spawn_relay(observed: bool) -> Relay {
    spawn_relay_with(observed, &[])
}

/// A relay with `extra` arguments (e.g. `--config FILE`).
pub(crate) fn spawn_relay_with(observed: bool, extra: &[&str]) -> Relay {
    let mut child = Command::new(BIN)
        .arg("relay")
        .args(extra)
        .args([
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            if observed { "127.0.0.1:0" } else { "off" },
            "--mqtt",
            "off",
            "--http",
            "127.0.0.1:0",
            "--data-dir",
            "off",
        ])
        .stdout(Stdio::piped())
        .stderr(if observed {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .spawn()
        .expect("spawn relay");
    let log = observed.then(|| {
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (stderr, sink) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        log
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port_of = |line: &str| -> String {
        line.split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string()
    };
    let (mut quic, mut http, mut metrics, mut https) = (None, None, None, None);
    let want_https = extra.contains(&"--https");
    while quic.is_none()
        || http.is_none()
        || (observed && metrics.is_none())
        || (want_https && https.is_none())
    {
        let line = lines.next().expect("relay output ended").unwrap();
        if line.starts_with("quichub relay listening") {
            quic = Some(port_of(&line).rsplit(':').next().unwrap().parse().unwrap());
        } else if line.starts_with("https tcp") {
            https = Some(port_of(&line));
        } else if line.starts_with("http tcp") {
            http = Some(port_of(&line));
        } else if let Some(url) = line.strip_prefix("metrics http://") {
            metrics = url.strip_suffix("/metrics").map(str::to_string);
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Relay {
        child,
        quic: quic.unwrap(),
        http: http.unwrap(),
        https,
        metrics,
        log,
    }
}

/// Runs `node web/test/SCRIPT ARGS` and returns its last stdout line as
/// JSON, with whether it exited 0.
pub(crate) fn node(script: &str, args: &[&str]) -> (bool, serde_json::Value) {
    let out = Command::new("node")
        .arg(web_dir().join("test").join(script))
        .args(args)
        .current_dir(web_dir())
        .stderr(Stdio::inherit())
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let v =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{script}: not JSON ({e}): {stdout}"));
    (out.status.success(), v)
}

async fn publisher(relay: &Relay) -> ClientSession {
    ClientSession::connect(
        &format!("moqt://127.0.0.1:{}/", relay.quic),
        ConnectOptions::default(),
    )
    .await
    .expect("connect publisher")
}

/// A plain HTTP/1.1 GET: (status, lowercased head, body).
pub(crate) async fn http_get(addr: String, path: &str) -> (u16, String, String) {
    http_request(&addr, "GET", path, "").await
}

/// One HTTP/1.1 request on its own connection: (status, lowercased head, body).
async fn http_request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_lowercase(), body.to_string())
}

/// The JS MoQT codec against crates/moqt's byte vectors.
#[test]
fn js_codec_unit_tests() {
    let Some(_turn) = prerequisites(false) else {
        return;
    };
    let out = Command::new("node")
        .args(["--test", "test/unit/"])
        .current_dir(web_dir())
        .output()
        .expect("node --test");
    assert!(
        out.status.success(),
        "node --test failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn player_decodes_a_live_broadcast() {
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let relay = start_relay();
    let home = format!("http://{}/", relay.http);
    // The codec this Chromium decodes: H.264 first, else VP8.
    let (ok, codecs) = node("codecs.mjs", &[&home]);
    assert!(ok, "codec probe failed: {codecs}");
    assert_eq!(codecs["webtransport"], true, "no WebTransport: {codecs}");
    let dir = out_dir();
    let video = if codecs["video"]["avc1.42c01e"] == true {
        media::h264(&dir)
    } else if codecs["video"]["vp8"] == true {
        media::vp8(&dir)
    } else {
        panic!("this Chromium decodes neither H.264 nor VP8: {codecs}");
    };
    let audio = (codecs["audio"]["opus"] == true).then(|| media::opus(&dir));
    let with_audio = audio.is_some();
    let session = publisher(&relay).await;
    let tasks = media::publish(&session, "live/web-test", video, audio, false).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let shot = dir.join("player.png");
    let url = format!("{home}watch/live/web-test");
    let (ok, r) =
        tokio::task::spawn_blocking(move || node("player.mjs", &[&url, shot.to_str().unwrap()]))
            .await
            .unwrap();
    for t in tasks {
        t.abort();
    }
    println!("player: {}", serde_json::to_string_pretty(&r).unwrap());
    println!("screenshot: {}", dir.join("player.png").display());
    let s = &r["stats"];
    assert!(ok, "the player did not play: {r}");
    assert!(s["decodedFrames"].as_u64().unwrap() > 30, "{s}");
    assert_eq!(r["pixelsChanged"], true, "the canvas did not change: {r}");
    let latency = r["latencyMs"].as_i64().expect("latency shown in ms");
    // Shown and measured against the right clock (a wrong one is off by
    // hours or years); how small it is belongs to the benchmarks, not here:
    // a loaded machine delays the page by more than a second at times.
    assert!((0..10_000).contains(&latency), "latency {latency} ms: {r}");
    assert_eq!(r["broadcastText"], "live/web-test");
    if with_audio {
        assert!(
            s["decodedAudio"].as_u64().unwrap() > 20,
            "no audio decoded: {s}"
        );
    }
    assert!(dir.join("player.png").exists());
    assert_eq!(
        r["hostileSafe"], true,
        "a hostile name reached the DOM: {r}"
    );
}

/// In a page without WebTransport (as in Safari), the player falls back to
/// MoQT over a WebSocket to the page's own origin (the relay's HTTP port,
/// QMux with subprotocol `qmux-01.moqt-18`) and plays the same broadcast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn player_plays_over_websocket_without_webtransport() {
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let relay = start_relay_observed();
    let home = format!("http://{}/", relay.http);
    let (ok, codecs) = node("codecs.mjs", &[&home]);
    assert!(ok, "codec probe failed: {codecs}");
    let dir = out_dir();
    let video = if codecs["video"]["avc1.42c01e"] == true {
        media::h264(&dir)
    } else {
        media::vp8(&dir)
    };
    let audio = (codecs["audio"]["opus"] == true).then(|| media::opus(&dir));
    let with_audio = audio.is_some();
    let session = publisher(&relay).await;
    let tasks = media::publish(&session, "live/web-ws", video, audio, false).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let shot = dir.join("player-websocket.png");
    let url = format!("{home}watch/live/web-ws");
    let (ok, r) = tokio::task::spawn_blocking(move || {
        node(
            "player.mjs",
            &[&url, shot.to_str().unwrap(), "no-webtransport"],
        )
    })
    .await
    .unwrap();
    for t in tasks {
        t.abort();
    }
    let metrics = http_get(relay.metrics.clone().unwrap(), "/metrics").await.2;
    println!("player: {}", serde_json::to_string_pretty(&r).unwrap());
    let s = &r["stats"];
    assert_eq!(r["webTransportInPage"], false, "{r}");
    assert!(ok, "the player did not play over WebSocket: {r}");
    assert_eq!(s["transport"], "WebSocket", "{s}");
    assert!(s["decodedFrames"].as_u64().unwrap() > 30, "{s}");
    assert_eq!(r["pixelsChanged"], true, "the canvas did not change: {r}");
    let latency = r["latencyMs"].as_i64().expect("latency shown in ms");
    // Shown and measured against the right clock (a wrong one is off by
    // hours or years); how small it is belongs to the benchmarks, not here:
    // a loaded machine delays the page by more than a second at times.
    assert!((0..10_000).contains(&latency), "latency {latency} ms: {r}");
    if with_audio {
        assert!(
            s["decodedAudio"].as_u64().unwrap() > 20,
            "no audio decoded: {s}"
        );
    }
    assert!(
        metrics.contains("quichub_websocket_sessions_total{upgrade=\"accepted\"} 1"),
        "{metrics}"
    );
}

/// A page served over HTTPS (`--https`, the relay's certificate; this
/// browser is told to accept it, as it would a CA-signed one) plays over
/// `wss://` to its own origin when the browser has no WebTransport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn player_plays_over_wss_from_an_https_page() {
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let relay = spawn_relay_with(true, &["--https", "127.0.0.1:0"]);
    let (ok, codecs) = node("codecs.mjs", &[&format!("http://{}/", relay.http)]);
    assert!(ok, "codec probe failed: {codecs}");
    let dir = out_dir();
    let video = if codecs["video"]["avc1.42c01e"] == true {
        media::h264(&dir)
    } else {
        media::vp8(&dir)
    };
    let session = publisher(&relay).await;
    let tasks = media::publish(&session, "live/web-wss", video, None, false).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let shot = dir.join("player-wss.png");
    let url = format!(
        "https://{}/watch/live/web-wss",
        relay.https.clone().unwrap()
    );
    let (ok, r) = tokio::task::spawn_blocking(move || {
        node(
            "player.mjs",
            &[&url, shot.to_str().unwrap(), "no-webtransport"],
        )
    })
    .await
    .unwrap();
    for t in tasks {
        t.abort();
    }
    println!("player: {}", serde_json::to_string_pretty(&r).unwrap());
    let s = &r["stats"];
    assert!(ok, "the player did not play over wss: {r}");
    assert_eq!(s["transport"], "WebSocket", "{s}");
    assert!(s["decodedFrames"].as_u64().unwrap() > 30, "{s}");
}

/// A relay with auth on (`[auth] key`): the player given `?jwt=` passes
/// the token to `/v1/relay` and to the WebTransport session and plays; with
/// no token the relay refuses it and the page says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn player_plays_with_a_token_and_is_refused_without() {
    use quichub_auth::jwt::{Claims, Key};
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let dir = out_dir().join(format!("auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = b"0123456789abcdef0123456789abcdef-e2e-web-auth";
    std::fs::write(dir.join("hs256.secret"), secret).unwrap();
    let config = dir.join("relay.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nkey = {:?}\n",
            dir.join("hs256.secret").to_str().unwrap()
        ),
    )
    .unwrap();
    let relay = spawn_relay_with(false, &["--config", config.to_str().unwrap()]);
    let key = Key::from_secret(secret).unwrap();
    // Comma-separated grants; "" grants nothing.
    let token = |put: &str, get: &str| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = Claims {
            put: put.split_terminator(',').map(str::to_string).collect(),
            get: get.split_terminator(',').map(str::to_string).collect(),
            exp: Some(now + 600),
            ..Claims::default()
        };
        key.sign(&claims, None).unwrap()
    };
    let home = format!("http://{}/", relay.http);
    let (ok, codecs) = node("codecs.mjs", &[&home]);
    assert!(ok, "codec probe failed: {codecs}");
    let video = if codecs["video"]["avc1.42c01e"] == true {
        media::h264(&out_dir())
    } else {
        media::vp8(&out_dir())
    };
    let session = ClientSession::connect(
        &format!(
            "moqt://127.0.0.1:{}/?jwt={}",
            relay.quic,
            token("live/auth-test", "")
        ),
        ConnectOptions::default(),
    )
    .await
    .expect("connect publisher");
    let tasks = media::publish(&session, "live/auth-test", video, None, false).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Without a token: /v1/relay answers 401 and the player shows it.
    let (status, head, _) = http_get(relay.http.clone(), "/v1/relay").await;
    assert_eq!(status, 401);
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    let url = format!("{home}watch/live/auth-test");
    let (ok, r) = tokio::task::spawn_blocking(move || node("refused.mjs", &[&url]))
        .await
        .unwrap();
    assert!(ok, "the player did not fail: {r}");
    assert!(
        r["error"].as_str().unwrap().contains("401"),
        "the page does not say why: {r}"
    );

    // With a token that may read the broadcast: it plays.
    let shot = out_dir().join("player-auth.png");
    let url = format!(
        "{home}watch/live/auth-test?jwt={}",
        token("", "live/auth-test")
    );
    let (ok, r) =
        tokio::task::spawn_blocking(move || node("player.mjs", &[&url, shot.to_str().unwrap()]))
            .await
            .unwrap();
    for t in tasks {
        t.abort();
    }
    assert!(ok, "the player with a token did not play: {r}");
    assert!(r["stats"]["decodedFrames"].as_u64().unwrap() > 30, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same with the "cmaf" container (fragmented MP4 from ffmpeg, one
/// moof+mdat per frame, the init segment in the catalog), each group on two
/// subgroup streams (keyframe, then the rest) that the player reorders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn player_decodes_a_cmaf_broadcast() {
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let relay = start_relay();
    let home = format!("http://{}/", relay.http);
    let dir = out_dir().join("cmaf");
    std::fs::create_dir_all(&dir).unwrap();
    let session = publisher(&relay).await;
    let tasks = media::publish(&session, "live/cmaf", media::h264_cmaf(&dir), None, true).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let shot = dir.join("player-cmaf.png");
    let url = format!("{home}watch/live/cmaf");
    let (ok, r) =
        tokio::task::spawn_blocking(move || node("player.mjs", &[&url, shot.to_str().unwrap()]))
            .await
            .unwrap();
    for t in tasks {
        t.abort();
    }
    println!(
        "player (cmaf): {}",
        serde_json::to_string_pretty(&r).unwrap()
    );
    assert!(ok, "the player did not play the cmaf broadcast: {r}");
    assert!(r["stats"]["decodedFrames"].as_u64().unwrap() > 30, "{r}");
    assert_eq!(r["stats"]["decodeErrors"], 0, "{r}");
}

/// What a user feeds `quichub pub --broadcast`: `secs` seconds of H.264
/// baseline and Opus from ffmpeg, in fragmented MP4 (one fragment a frame),
/// written to `dir/in.mp4`.
pub(crate) fn ingest_clip(dir: &Path, secs: u32) -> PathBuf {
    let input = dir.join("in.mp4");
    let ok = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc2=size=640x360:rate=30"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args(["-t", &secs.to_string()])
        .args(["-c:v", "libx264", "-profile:v", "baseline", "-g", "30"])
        .args([
            "-pix_fmt", "yuv420p", "-c:a", "libopus", "-b:a", "64k", "-f", "mp4",
        ])
        .args([
            "-movflags",
            "cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame",
        ])
        .arg(&input)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ffmpeg failed");
    input
}

/// The ingest path a user runs: ffmpeg writes fragmented MP4 (H.264
/// baseline and Opus) into `quichub pub --broadcast`, which stamps the
/// catalog's clock; the built-in player plays it and shows the latency from
/// the publisher's clock to the frame on screen, under a second here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn player_plays_what_quichub_pub_ingests_from_ffmpeg() {
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let relay = start_relay();
    let home = format!("http://{}/", relay.http);
    let dir = out_dir().join("ingest");
    std::fs::create_dir_all(&dir).unwrap();
    let input = ingest_clip(&dir, 12);
    let url = format!("moqt://127.0.0.1:{}/", relay.quic);
    let mut publisher = Command::new(BIN)
        .args(["pub", &url, "--broadcast", "live/ingest", "--input"])
        .arg(&input)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shot = dir.join("player-ingest.png");
    let page = format!("{home}watch/live/ingest");
    let (ok, r) =
        tokio::task::spawn_blocking(move || node("player.mjs", &[&page, shot.to_str().unwrap()]))
            .await
            .unwrap();
    let _ = publisher.kill();
    let _ = publisher.wait();
    println!(
        "player (quichub pub): {}",
        serde_json::to_string_pretty(&r).unwrap()
    );
    assert!(ok, "the player did not play what quichub pub sent: {r}");
    assert!(r["stats"]["decodedFrames"].as_u64().unwrap() > 30, "{r}");
    assert!(r["stats"]["decodedAudio"].as_u64().unwrap() > 20, "{r}");
    assert_eq!(r["stats"]["decodeErrors"], 0, "{r}");
    let latency = r["latencyMs"].as_i64().expect("latency shown in ms");
    // Shown and measured against the right clock (a wrong one is off by
    // hours or years); how small it is belongs to the benchmarks, not here:
    // a loaded machine delays the page by more than a second at times.
    assert!((0..10_000).contains(&latency), "latency {latency} ms: {r}");
}

/// `quichub_protocol_violations_total` from the relay's `/metrics`.
pub(crate) async fn protocol_violations(relay: &Relay) -> u64 {
    let (_, _, body) = http_get(relay.metrics.clone().unwrap(), "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix("quichub_protocol_violations_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no quichub_protocol_violations_total in {body}"))
}

/// The committed bundle (`web/dist`, embedded in the binary) is what
/// `npm run build` makes from `web/src` and `web/pages` with the locked
/// packages: rebuilt into a temporary directory and compared byte for byte.
#[test]
fn committed_bundle_is_up_to_date() {
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let fresh = out_dir().join("dist");
    let _ = std::fs::remove_dir_all(&fresh);
    let out = Command::new("node")
        .arg("build.mjs")
        .arg(&fresh)
        .current_dir(web_dir())
        .output()
        .expect("node build.mjs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let committed = web_dir().join("dist");
    assert_eq!(names(&committed), names(&fresh));
    for n in names(&fresh) {
        assert!(
            std::fs::read(committed.join(&n)).unwrap() == std::fs::read(fresh.join(&n)).unwrap(),
            "web/dist/{n} is stale: run `npm ci && npm run build` in web/ and commit web/dist"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_lists_tracks_and_plots_the_imu() {
    let Some(_turn) = prerequisites(true) else {
        return;
    };
    let relay = start_relay();
    let home = format!("http://{}/", relay.http);
    let url = format!("moqt://127.0.0.1:{}/", relay.quic);
    let mut publishers: Vec<Child> = ["imu", "video"]
        .iter()
        .map(|p| {
            Command::new(BIN)
                .args([
                    "pub",
                    &url,
                    "--namespace",
                    "sensors/bench",
                    "--profile",
                    p,
                    "--duration",
                    "60",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn quichub pub")
        })
        .collect();
    // An MQTT sensor, published through the HTTP API: JSON readings at 50 Hz
    // on the topic sensors/room1/temp, the track (mqtt, sensors, room1) temp.
    let http = relay.http.clone();
    let (status, _, _) = http_request(&http, "PUT", "/v1/t/sensors/room1/temp", "").await;
    assert_eq!(status, 201);
    let sensor = tokio::spawn(async move {
        for i in 0u64.. {
            let v = 20.0 + (i as f64 * 0.05).sin();
            let body = format!("{{\"temp\": {v:.3}, \"unit\": \"C\"}}");
            http_request(&http, "POST", "/v1/t/sensors/room1/temp", &body).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let shot = out_dir().join("dashboard.png");
    let (ok, r) = tokio::task::spawn_blocking(move || {
        node(
            "dashboard.mjs",
            &[
                &home,
                shot.to_str().unwrap(),
                "sensors/bench/video",
                "+mqtt/sensors/room1/temp",
                "+sensors/bench/imu",
            ],
        )
    })
    .await
    .unwrap();
    sensor.abort();
    for p in &mut publishers {
        let _ = p.kill();
        let _ = p.wait();
    }
    println!("dashboard: {}", serde_json::to_string_pretty(&r).unwrap());
    println!("screenshot: {}", out_dir().join("dashboard.png").display());
    assert!(ok, "dashboard: {r}");
    let imu = &r["plots"]["sensors/bench/imu"];
    assert!(imu["points"].as_u64().unwrap() >= 50, "{r}");
    assert_eq!(
        imu["series"],
        serde_json::json!(["ax", "ay", "az", "gx", "gy", "gz"])
    );
    let temp = &r["plots"]["mqtt/sensors/room1/temp"];
    assert_eq!(temp["series"], serde_json::json!(["temp"]), "{r}");
    let rows = r["rows"].to_string();
    assert!(rows.contains("imu") && rows.contains("video"), "{rows}");
    let broadcasts = r["broadcasts"].to_string();
    assert!(
        broadcasts.contains("sensors/bench") && broadcasts.contains("mqtt/sensors/room1"),
        "{broadcasts}"
    );
}

/// The pages over plain HTTP: routes, headers, and hostile broadcast names
/// that must not reach the HTML.
#[tokio::test]
async fn pages_are_served_and_names_are_not_reflected() {
    let relay = start_relay();
    let http = relay.http.clone();
    let get = |path: &'static str| http_get(http.clone(), path);
    let (status, head, body) = get("/").await;
    assert_eq!(status, 200);
    assert!(head.contains("content-security-policy"), "{head}");
    assert!(body.contains("/assets/dashboard.js"));
    let (status, _, cert) = get("/certificate.sha256").await;
    assert_eq!(status, 200);
    assert_eq!(cert.trim().len(), 64, "{cert}");
    let (_, _, plain) = get("/watch/live/demo").await;
    for hostile in [
        "/watch/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "/watch/a%22%3E%3Cimg%20src=x%20onerror=alert(1)%3E",
    ] {
        let (status, _, body) = get(hostile).await;
        assert_eq!(status, 200);
        assert_eq!(body, plain, "{hostile} changed the page");
    }
    let (status, _, json) = get("/v1/relay").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["quic_port"], relay.quic);
    assert_eq!(v["certificate_sha256"].as_str().unwrap(), cert.trim());
    let (status, _, _) = get("/assets/nope.js").await;
    assert_eq!(status, 404);
}
