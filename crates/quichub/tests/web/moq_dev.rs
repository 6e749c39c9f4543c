//! moq-dev's browser libraries against quichub, in headless Chromium
//! (`crates/moqt/INTEROP.md`, "@moq/watch" and "@moq/publish"):
//!
//! - `<moq-watch>` (npm `@moq/watch` 0.4.6, `@moq/net` 0.2.8) plays what
//!   ffmpeg feeds `quichub pub --broadcast`, over WebTransport and over
//!   WebSocket; it speaks moq-lite-05, served through the relay's lite bridge;
//! - `<moq-publish>` (npm `@moq/publish` 0.2.17, `@moq/net` 0.1.9) publishes
//!   Chromium's fake camera and microphone into quichub (moq-lite-04 over
//!   WebTransport, moq-lite-02 over WebSocket), and `quichub sub
//!   --broadcast` writes it to fragmented MP4 that ffprobe decodes;
//! - what `@moq/net` 0.2.8 itself gets wrong at draft 18, pinned byte for
//!   byte with its own codec.
//!
//! Both packages are pinned in `web/package.json`; without them (or node,
//! Chromium, ffmpeg) the tests print `SKIPPED: reason` and pass, unless
//! `QUICHUB_WEB_TESTS=1`. Screenshots and files go to
//! `$CARGO_TARGET_TMPDIR/e2e_web/moq-*`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::BytesMut;

use crate::e2e_web::{
    http_get, ingest_clip, node, out_dir, prerequisites, protocol_violations, spawn_relay_with,
    web_dir, Relay, Turn, BIN,
};

/// The prerequisites (`browser`: Chromium, ffmpeg, `web/node_modules`, and
/// a browser turn) and the npm packages `packages` (under
/// `web/node_modules/@moq/`): `None` (after printing why) when missing and
/// `QUICHUB_WEB_TESTS` is not `1`, a panic when it is.
fn moq_dev_prerequisites(browser: bool, packages: &[&str]) -> Option<Turn> {
    let turn = prerequisites(browser)?;
    let missing: Vec<_> = packages
        .iter()
        .filter(|p| !web_dir().join("node_modules/@moq").join(p).is_dir())
        .map(|p| format!("web/node_modules/@moq/{p}"))
        .collect();
    if missing.is_empty() {
        return Some(turn);
    }
    let why = format!("missing {} (run `npm ci` in web/)", missing.join(", "));
    if std::env::var("QUICHUB_WEB_TESTS").as_deref() == Ok("1") {
        panic!("QUICHUB_WEB_TESTS=1 but {why}");
    }
    println!("SKIPPED: {why}");
    None
}

/// A relay with metrics and its log, whose HTTP port lets pages of
/// `http://127.0.0.1:PAGE_PORT` open WebSockets to it (the test pages are
/// of another origin than the relay); returns it and the page port.
fn relay_for_pages(dir: &std::path::Path) -> (Relay, u16) {
    let page_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let config = dir.join("relay.toml");
    std::fs::write(
        &config,
        format!("[http]\nallowed_origins = [\"http://127.0.0.1:{page_port}\"]\n"),
    )
    .unwrap();
    let relay = spawn_relay_with(true, &["--config", config.to_str().unwrap()]);
    (relay, page_port)
}

/// The value of the sample `series` (name and labels, as written) in the
/// relay's `/metrics`, 0 when absent.
async fn metric(relay: &Relay, series: &str) -> u64 {
    let (_, _, body) = http_get(relay.metrics.clone().unwrap(), "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn relay_log(relay: &Relay) -> String {
    relay
        .log
        .as_ref()
        .map(|l| l.lock().unwrap().clone())
        .unwrap_or_default()
}

/// `<moq-watch>` over `mode` (`webtransport` or `websocket`) plays a
/// broadcast that ffmpeg → `quichub pub --broadcast` publishes: video frames
/// decoded and painted (the canvas changes), audio decoded, over moq-lite-05.
/// Who publishes the broadcast `<moq-watch>` plays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Publisher {
    /// `quichub pub --broadcast` (hang, legacy container), draft 18.
    Quichub,
    /// moq-dev's `moq import fmp4` (hang, CMAF container), moq-lite-06.
    MoqCli,
}

async fn moq_watch_plays(mode: &str) {
    moq_watch_plays_from(mode, Publisher::Quichub).await
}

async fn moq_watch_plays_from(mode: &str, from: Publisher) {
    let Some(_turn) = moq_dev_prerequisites(true, &["watch"]) else {
        return;
    };
    let moq_bin = match from {
        Publisher::Quichub => None,
        Publisher::MoqCli => {
            match std::env::var("QUICHUB_MOQ_DEV_BIN") {
                Ok(d) => {
                    let moq = std::path::PathBuf::from(d).join("moq");
                    assert!(
                        moq.exists(),
                        "{} missing: scripts/install-moq-dev.sh --with-cli",
                        moq.display()
                    );
                    Some(moq)
                }
                Err(_) => {
                    println!("SKIPPED: set QUICHUB_MOQ_DEV_BIN (scripts/test.sh does) for moq-dev's `moq`");
                    return;
                }
            }
        }
    };
    let tag = match from {
        Publisher::Quichub => mode.to_string(),
        Publisher::MoqCli => format!("{mode}-moq-cli"),
    };
    let dir = out_dir().join(format!("moq-watch-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (relay, page_port) = relay_for_pages(&dir);
    // Long enough to outlast the page on a loaded machine: `pub` ends with
    // its input.
    let input = ingest_clip(&dir, 60);
    let url = format!("moqt://127.0.0.1:{}/", relay.quic);
    let mut feeder = None;
    let mut publisher = match &moq_bin {
        None => Command::new(BIN)
            .args(["pub", &url, "--broadcast", "live/moq-watch", "--input"])
            .arg(&input)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
        Some(moq) => {
            // ffmpeg feeds `moq import fmp4` in real time, as an encoder would.
            let (_, _, fingerprint) = http_get(relay.http.clone(), "/certificate.sha256").await;
            let mut ffmpeg = Command::new("ffmpeg")
                .args(["-hide_banner", "-loglevel", "error", "-re", "-i"])
                .arg(&input)
                .args(["-c", "copy", "-f", "mp4", "-movflags"])
                .args(["cmaf+frag_keyframe+empty_moov+default_base_moof", "-"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let stdin = ffmpeg.stdout.take().unwrap();
            feeder = Some(ffmpeg);
            Command::new(moq)
                .args(["--connect", &url, "--connect-version", "moq-lite-06"])
                .args(["--connect-tls-fingerprint", fingerprint.trim()])
                .args(["--broadcast", "live/moq-watch", "import", "fmp4"])
                .stdin(stdin)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("moq-import.log")).unwrap())
                .spawn()
                .unwrap()
        }
    };
    let violations_before = protocol_violations(&relay).await;
    let args = [
        relay.http.clone(),
        relay.quic.to_string(),
        "live/moq-watch".to_string(),
        dir.to_str().unwrap().to_string(),
        page_port.to_string(),
        mode.to_string(),
    ];
    let (ok, r) = tokio::task::spawn_blocking(move || {
        node(
            "moq-watch.mjs",
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    })
    .await
    .unwrap();
    let _ = publisher.kill();
    let _ = publisher.wait();
    if let Some(mut f) = feeder {
        let _ = f.kill();
        let _ = f.wait();
    }
    println!("moq-watch: {}", serde_json::to_string_pretty(&r).unwrap());
    println!(
        "screenshot: {}",
        dir.join(format!("moq-watch-{mode}.png")).display()
    );
    let log = relay_log(&relay);
    assert!(
        ok,
        "<moq-watch> did not play over {mode}: {r}\nrelay log:\n{log}"
    );
    let (s, d) = (&r["state"], &r["decoded"]);
    // The version @moq/net 0.2.8 offers first, served by quichub.
    assert_eq!(s["version"], "moq-lite-05", "{r}");
    assert_eq!(s["connection"], "connected", "{r}");
    assert_eq!(s["catalog"], true, "{r}");
    assert!(s["videoFrames"].as_u64().unwrap() > 30, "{r}");
    assert!(d["video"].as_u64().unwrap() > 30, "no video decoded: {r}");
    assert!(d["audio"].as_u64().unwrap() > 20, "no audio decoded: {r}");
    assert_eq!(d["videoErrors"], 0, "{r}");
    assert_eq!(d["audioErrors"], 0, "{r}");
    assert_eq!(r["pixelsChanged"], true, "the canvas did not change: {r}");
    assert_eq!(r["webTransportInPage"], mode == "webtransport", "{r}");
    let lite05 = metric(
        &relay,
        r#"quichub_lite_sessions_total{version="moq-lite-05"}"#,
    )
    .await;
    assert!(lite05 >= 1, "no moq-lite-05 session counted:\n{log}");
    if mode == "websocket" {
        let logged = r["logs"].as_array().is_some_and(|l| {
            l.iter().any(|e| {
                e.as_str()
                    .is_some_and(|e| e.contains("connected via WebSocket"))
            })
        });
        assert!(logged, "@moq/watch did not say it used WebSocket: {r}");
        let accepted = metric(
            &relay,
            r#"quichub_websocket_sessions_total{upgrade="accepted"}"#,
        )
        .await;
        assert!(accepted >= 1, "no WebSocket session counted");
    }
    let violations = protocol_violations(&relay).await - violations_before;
    assert_eq!(violations, 0, "protocol violations:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_watch_plays_quichub_pub_over_webtransport() {
    moq_watch_plays("webtransport").await;
}

/// A broadcast moq-dev's own `moq` CLI publishes into quichub (moq-lite-06,
/// hang with the CMAF container) plays in `<moq-watch>` (moq-lite-05):
/// moq-dev's publisher and player with quichub in moq-relay's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_watch_plays_what_the_moq_cli_publishes_through_quichub() {
    moq_watch_plays_from("webtransport", Publisher::MoqCli).await;
}

/// In a page without WebTransport (as Safari), `@moq/net` falls back to
/// `@moq/qmux` and the relay's HTTP port takes `qmux-02.moq-lite-05`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_watch_plays_quichub_pub_over_websocket() {
    moq_watch_plays("websocket").await;
}

/// `<moq-publish>` over `mode` publishes the fake camera and microphone as
/// `live/moq-publish` (moq-lite `version`); `quichub sub --broadcast` writes
/// it to fragmented MP4 with H.264 and Opus frames ffprobe decodes; with
/// `player`, quichub's own player plays it too.
async fn moq_publish_is_written_by_quichub_sub(mode: &str, version: &str, player: bool) {
    let Some(_turn) = moq_dev_prerequisites(true, &["publish"]) else {
        return;
    };
    let dir = out_dir().join(format!("moq-publish-{mode}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (relay, page_port) = relay_for_pages(&dir);
    let name = "live/moq-publish";
    let mut page = Command::new("node")
        .arg(web_dir().join("test/moq-publish.mjs"))
        .args([
            &relay.http,
            &relay.quic.to_string(),
            name,
            dir.to_str().unwrap(),
            &page_port.to_string(),
            mode,
        ])
        .current_dir(web_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run node");
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = page.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Its first line: connected, with both renditions in its catalog (or
    // not, after its own 90 s); a loaded machine takes its time.
    let first = rx.recv_timeout(Duration::from_secs(240));
    let ready: serde_json::Value = first
        .as_deref()
        .ok()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    let output = dir.join("sub.mp4");
    let _ = std::fs::remove_file(&output);
    let sub = if ready["ready"] == true {
        let url = format!("moqt://127.0.0.1:{}/", relay.quic);
        let output = output.clone();
        let name = name.to_string();
        Some(
            tokio::task::spawn_blocking(move || {
                Command::new(BIN)
                    .args(["sub", &url, "--broadcast", &name, "--duration", "10"])
                    .arg("--output")
                    .arg(&output)
                    .output()
                    .expect("run quichub sub")
            })
            .await
            .unwrap(),
        )
    } else {
        None
    };
    // quichub's player, in a Chromium of its own, while the page publishes.
    let played = if player && ready["ready"] == true {
        let url = format!("http://{}/watch/{name}", relay.http);
        let shot = dir.join("player.png");
        Some(
            tokio::task::spawn_blocking(move || {
                node("player.mjs", &[&url, shot.to_str().unwrap()])
            })
            .await
            .unwrap(),
        )
    } else {
        None
    };
    // The end of its input stops the page; its last line says what it saw.
    drop(page.stdin.take());
    let mut last = first.unwrap_or_default();
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(120)) {
        last = l;
    }
    let _ = page.kill();
    let _ = page.wait();
    let report: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
    println!(
        "moq-publish: {}",
        serde_json::to_string_pretty(&report).unwrap()
    );
    let log = relay_log(&relay);
    assert_eq!(
        ready["ready"], true,
        "<moq-publish> did not get ready over {mode}: {report}\nrelay log:\n{log}"
    );
    assert_eq!(ready["version"], version, "{ready}");
    assert_eq!(
        report["webTransportInPage"],
        mode == "webtransport",
        "{report}"
    );
    let sub = sub.unwrap();
    let sub_err = String::from_utf8_lossy(&sub.stderr);
    println!("quichub sub: {sub_err}");
    assert!(
        sub.status.success(),
        "quichub sub failed: {sub_err}\nrelay log:\n{log}"
    );
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-show_entries"])
        .args(["stream=codec_type,codec_name,nb_read_frames", "-of", "json"])
        .arg(&output)
        .output()
        .expect("run ffprobe");
    assert!(
        probe.status.success(),
        "ffprobe: {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let streams: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    println!("ffprobe: {streams}");
    let frames = |codec: &str| -> u64 {
        streams["streams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["codec_name"] == codec)
            .and_then(|s| s["nb_read_frames"].as_str()?.parse().ok())
            .unwrap_or(0)
    };
    // Ten seconds of 20-30 fps video and 50 packets a second of audio; far
    // fewer still shows that every stage works.
    assert!(
        frames("h264") >= 30,
        "too few H.264 frames: {streams}\n{sub_err}"
    );
    assert!(
        frames("opus") >= 50,
        "too few Opus frames: {streams}\n{sub_err}"
    );
    if let Some((_, r)) = played {
        // Not player.mjs's own verdict: that wants a latency, which these
        // timestamps (the page's clock, not the wall clock) cannot show.
        println!("player: {}", serde_json::to_string_pretty(&r).unwrap());
        let p = &r["stats"];
        assert!(p["decodedFrames"].as_u64().unwrap_or(0) > 30, "{r}");
        assert!(p["decodedAudio"].as_u64().unwrap_or(0) > 20, "{r}");
        assert_eq!(p["decodeErrors"], 0, "{r}");
        assert_eq!(r["pixelsChanged"], true, "the canvas did not change: {r}");
    }
    let series = format!("quichub_lite_sessions_total{{version=\"{version}\"}}");
    assert!(
        metric(&relay, &series).await >= 1,
        "no {version} session counted"
    );
}

/// And quichub's own player plays the same broadcast (no latency shown:
/// `@moq/publish` stamps frames with the page's clock, not the wall clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_publish_over_webtransport_is_written_by_quichub_sub() {
    moq_publish_is_written_by_quichub_sub("webtransport", "moq-lite-04", true).await;
}

/// Over WebSocket `@moq/publish` 0.2.17 (its `@moq/qmux` 0.1.3) names no
/// application protocol (bare `qmux-01`): it offers moq-lite-02, moq-lite-01
/// and draft 14 in a CLIENT_SETUP, and the relay picks moq-lite-02.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_publish_over_websocket_is_written_by_quichub_sub() {
    moq_publish_is_written_by_quichub_sub("websocket", "moq-lite-02", false).await;
}

/// The SUBSCRIBE `@moq/net` 0.2.8 writes at draft 18 for `@moq/watch`'s
/// catalog (request 0, `live/demo`), type byte first: SUBSCRIBER_PRIORITY
/// 155 (`255 - 100`), a uint8, as the varint `80 9b` (quichub reads it:
/// INTEROP.md, "Deviations accepted").
const MOQ_NET_SUBSCRIBE: &str =
    "03 0024 00 02 04 6c697665 04 64656d6f 0c 636174616c6f672e6a736f6e \
                                 04 10 01 10 809b 01 01 02 01 02";

/// What `@moq/net` 0.2.8 (`@moq/watch` 0.4.6's session) gets wrong at draft
/// 18, pinned with its own codec (`web/test/moq-net-draft18.mjs`): the
/// uint8 parameters of its SUBSCRIBE written as varints, and a SUBSCRIBE_OK
/// with LARGEST_OBJECT, as quichub writes it for a track that has objects,
/// that it cannot read (it takes the Location, two bare varints, for
/// length-prefixed bytes). This is why `@moq/watch` plays from quichub only
/// over moq-lite. When moq-dev fixes either, this fails: update INTEROP.md.
#[test]
fn moq_net_at_draft_18_misreads_subscribe_ok_pinned() {
    let Some(_) = moq_dev_prerequisites(false, &["net", "hang"]) else {
        return;
    };
    let subscribe_ok = |largest: Option<moqt::Location>| {
        let m = moqt::Message::SubscribeOk(moqt::message::SubscribeOk {
            track_alias: 1,
            params: moqt::Parameters {
                largest_object: largest,
                ..Default::default()
            },
            properties: Vec::new(),
        });
        let mut b = BytesMut::new();
        m.encode(&mut b);
        // @moq/net's SubscribeOk.decode starts after the type (0x04).
        assert_eq!(b[0], 0x04);
        b[1..]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    let with_largest = subscribe_ok(Some(moqt::Location {
        group: 0,
        object: 0,
    }));
    assert_eq!(with_largest, "00050101090000");
    let (ok, r) = node("moq-net-draft18.mjs", &[&with_largest]);
    assert!(ok, "{r}");
    assert_eq!(r["subscribe"], MOQ_NET_SUBSCRIBE.replace(' ', ""), "{r}");
    assert_eq!(
        r["subscribeOkError"], "unexpected end of stream",
        "@moq/net reads LARGEST_OBJECT now: update INTEROP.md: {r}"
    );
    // Without LARGEST_OBJECT (a track with no object yet) it reads it.
    let (ok, r) = node("moq-net-draft18.mjs", &[&subscribe_ok(None)]);
    assert!(ok, "{r}");
    assert_eq!(r["subscribeOk"]["trackAlias"], "1", "{r}");
}
