//! Real media between quichub and moq-dev's media CLI: `moq` from moq-cli
//! 0.14.10 (crates.io; hang 0.21.19, moq-mux 0.10.19, moq-net 0.3.18), dialing
//! quichub's relay as a draft-18 client (`--connect-version moq-transport-18`),
//! over raw QUIC (`moqt://`, ALPN `moqt-18`) and WebTransport (`https://`):
//!
//! ```text
//! ffmpeg -re … -f mp4 - | moq import fmp4 ──moqt-18──► quichub relay ─┬─► quichub sub --output out.mp4
//!                                                                     └─moqt-18──► moq export fmp4 > out.mp4
//! quichub pub --format hang|hang-cmaf [--mode announce] ──► quichub relay ──moqt-18──► moq export fmp4
//! ```
//!
//! The same cases over moq-lite-06 (`--connect-version moq-lite-06`,
//! through quichub's lite bridge) are in `interop_moq_lite`, which calls
//! [`moq_publishes`] and [`moq_subscribes`] with that version.
//!
//! What works and what does not (MSF, ffmpeg's `frag_every_frame`) is in
//! `crates/moqt/INTEROP.md`.
//!
//! ffprobe counts the frames of each output and `ffmpeg -f framemd5` checks
//! that every picture decodes to the same bytes as the input's.
//! `scripts/install-moq-dev.sh --with-cli` installs `moq`; `scripts/test.sh`
//! sets `QUICHUB_MOQ_DEV_BIN`, so a missing tool (or ffmpeg) fails the test
//! there instead of skipping it.

use quichub_testkit as common;

use common::media::{count_frames, picture_md5s, run};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quichub_net::tls::Identity;

const QUICHUB: &str = env!("CARGO_BIN_EXE_quichub");
const CMAF: &str = "cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame";
/// What moq-mux asks for: `frag_every_frame` makes ffmpeg repeat an audio
/// fragment's decode time when it interleaves audio and video, which moq's
/// importer refuses ("fragment decode time … does not advance"); a 1 µs
/// `-frag_duration` cuts as finely with correct times.
const CMAF_PIPE: &str = "cmaf+separate_moof+delay_moov+skip_trailer";
/// Frames of video in the input: 4 s at 30 fps.
const FRAMES: usize = 120;
/// The IETF draft, as moq-dev's `--connect-version` names it.
const DRAFT_18: &str = "moq-transport-18";

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The directory holding `moq`, or `None` (skip) when the tools are not
/// installed and the test script did not ask for them.
pub(crate) fn tools() -> Option<PathBuf> {
    let have_ffmpeg = Command::new("ffmpeg")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    match std::env::var("QUICHUB_MOQ_DEV_BIN") {
        Ok(dir) => {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join("moq").exists(),
                "moq missing in {}: run scripts/install-moq-dev.sh --with-cli",
                dir.display()
            );
            assert!(have_ffmpeg, "ffmpeg is not installed");
            Some(dir)
        }
        Err(_) => {
            eprintln!("SKIPPED: set QUICHUB_MOQ_DEV_BIN (scripts/test.sh does) to run the moq-cli media interop test");
            None
        }
    }
}

/// A directory of its own for each test, removed at the end.
/// The directory and the SHA-256 of its certificate (hex).
struct Dir(PathBuf, String);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("quichub-moqcli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        let id = Identity::self_signed(&["localhost", "127.0.0.1"]).unwrap();
        id.write_pem(&p.join("cert.pem"), &p.join("key.pem"))
            .unwrap();
        Dir(p, id.fingerprint_hex())
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
    fn log(&self, f: &str) -> String {
        std::fs::read_to_string(self.path(f)).unwrap_or_default()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// ffmpeg's test pattern and a sine, H.264 (GOP 30, B frames) and AAC, as
/// CMAF with one fragment per frame.
fn h264_aac(path: &Path, secs: u32) {
    let t = secs.to_string();
    run(
        "ffmpeg",
        &[
            "-hide_banner",
            "-loglevel",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=640x360:rate=30",
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:sample_rate=48000",
            "-t",
            &t,
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-g",
            "30",
            "-bf",
            "2",
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-f",
            "mp4",
            "-movflags",
            CMAF,
            path.to_str().unwrap(),
        ],
    );
}

/// Starts quichub's relay with the directory's certificate; its port.
fn relay(dir: &Dir) -> (Proc, u16) {
    relay_with(dir, &[])
}

/// [`relay`] with more arguments (e.g. `--config`).
fn relay_with(dir: &Dir, extra: &[&str]) -> (Proc, u16) {
    let mut child = Command::new(QUICHUB)
        .args([
            "relay",
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--mqtt",
            "off",
            "--http",
            "off",
            "--cert",
        ])
        .arg(dir.path("cert.pem"))
        .arg("--key")
        .arg(dir.path("key.pem"))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path("relay.log")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), port)
}

fn url(scheme: &str, port: u16) -> String {
    match scheme {
        "moqt" => format!("moqt://127.0.0.1:{port}"),
        _ => format!("https://127.0.0.1:{port}/"),
    }
}

/// `moq` dialing quichub at `version` (`moq-transport-18`, `moq-lite-06`),
/// trusting the relay's certificate, for `broadcast`.
fn moq(bin: &Path, dir: &Dir, url: &str, version: &str, broadcast: &str) -> Command {
    let mut c = Command::new(bin.join("moq"));
    c.args([
        "--connect",
        url,
        "--connect-version",
        version,
        "--broadcast",
        broadcast,
        // Pinned by hash: `--connect-tls-root` works too, but moq-tokio's
        // watcher then logs "reloaded TLS root certificates" in a busy loop
        // (90 MB of log in 4 s).
        "--connect-tls-fingerprint",
        &dir.1,
    ])
    .env("RUST_LOG", "info");
    c
}

/// Waits for `child` up to `limit`, then kills it; whether it exited by itself.
fn wait_for(child: &mut Child, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// Every picture of the input, decoded identically from the output.
fn assert_same_pictures(input: &Path, output: &Path, what: &str) {
    let counted = count_frames(output);
    assert!(
        counted.contains(&("h264".into(), FRAMES)),
        "{what}: {counted:?}"
    );
    let (a, b) = (picture_md5s(input), picture_md5s(output));
    assert_eq!(a.len(), FRAMES);
    assert!(
        a == b,
        "{what}: decoded pictures differ ({} vs {})",
        a.len(),
        b.len()
    );
}

/// The md5 of every audio packet as stored (not decoded: the input's
/// `frag_every_frame` audio fragments repeat decode times, so ffmpeg decodes
/// fewer frames from the input than it holds), in file order.
fn audio_packet_md5s(path: &Path) -> Vec<String> {
    let out = run(
        "ffmpeg",
        &[
            "-loglevel",
            "error",
            "-i",
            path.to_str().unwrap(),
            "-map",
            "0:a",
            "-c",
            "copy",
            "-f",
            "framemd5",
            "-",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit(',').next().map(|s| s.trim().to_string()))
        .collect()
}

/// Every AAC frame of the input, byte for byte and in order, in the output.
fn assert_same_audio(input: &Path, output: &Path, what: &str) {
    let (a, b) = (audio_packet_md5s(input), audio_packet_md5s(output));
    assert!(
        a.len() > 150,
        "{what}: {} audio packets in the input",
        a.len()
    );
    assert!(
        a == b,
        "{what}: audio packets differ ({} vs {})",
        a.len(),
        b.len()
    );
}

/// ffmpeg → `moq import fmp4` → quichub relay → `quichub sub --output`, and
/// at the same time → `moq export fmp4` (quichub as the relay between two
/// moq-dev clients); both `moq`s speak `version`, `quichub sub` draft 18.
pub(crate) fn moq_publishes(bin: &Path, scheme: &str, version: &str) {
    let dir = Dir::new(&format!("import-{scheme}-{version}"));
    let input = dir.path("in.mp4");
    h264_aac(&input, FRAMES as u32 / 30);
    let (_relay, port) = relay(&dir);
    let broadcast = format!("live/moq-{scheme}.hang");
    let out = dir.path("out.mp4");
    let sub = Command::new(QUICHUB)
        .args(["sub", &format!("moqt://127.0.0.1:{port}/")])
        .args(["--broadcast", &broadcast, "--duration", "60", "--output"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let moq_out = dir.path("moq-out.mp4");
    let mut export = Proc(
        moq(bin, &dir, &url(scheme, port), version, &broadcast)
            .args(["export", "fmp4"])
            .stdout(std::fs::File::create(&moq_out).unwrap())
            .stderr(std::fs::File::create(dir.path("moq-export.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    // `-re` feeds moq in real time, as a live encoder would; `-c copy`
    // keeps the pictures bit for bit.
    let mut ffmpeg = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-re", "-i"])
        .arg(&input)
        .args([
            "-c",
            "copy",
            "-f",
            "mp4",
            "-movflags",
            CMAF_PIPE,
            "-frag_duration",
            "1",
            "-",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut publisher = Proc(
        moq(bin, &dir, &url(scheme, port), version, &broadcast)
            .args(["import", "fmp4"])
            .stdin(ffmpeg.stdout.take().unwrap())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path("moq.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let published = wait_for(&mut publisher.0, Duration::from_secs(40));
    let _ = ffmpeg.wait();
    let sub = sub.wait_with_output().unwrap();
    let exported = wait_for(&mut export.0, Duration::from_secs(10));
    let sub_log = String::from_utf8_lossy(&sub.stderr);
    let logs = format!(
        "--- moq import\n{}\n--- moq export\n{}\n--- quichub sub\n{sub_log}\n--- relay\n{}",
        dir.log("moq.log"),
        dir.log("moq-export.log"),
        dir.log("relay.log")
    );
    assert!(published, "moq import did not end with its input\n{logs}");
    assert!(
        exported,
        "moq export did not end with the broadcast\n{logs}"
    );
    assert!(sub.status.success(), "quichub sub failed\n{logs}");
    // moq-mux publishes both catalogs (hang `catalog.json`, MSF `catalog`,
    // cmaf packaging); quichub sub takes whichever the relay answers first.
    assert!(
        sub_log.contains("catalog: hang") || sub_log.contains("catalog: MSF"),
        "{logs}"
    );
    // moq-mux names the renditions `0.m4s` (video) and `1.m4s` (audio).
    assert!(
        sub_log.contains(&format!("0.m4s {FRAMES} frames")),
        "{logs}"
    );
    let what = format!("moq import over {scheme} ({version})");
    assert_same_pictures(&input, &out, &what);
    assert_same_audio(&input, &out, &what);
    let what = format!("moq import → quichub → moq export over {scheme} ({version})");
    assert_same_pictures(&input, &moq_out, &what);
    assert_same_audio(&input, &moq_out, &what);
}

/// `quichub pub --format FORMAT --mode MODE` → quichub relay → `moq export
/// fmp4` speaking `version`.
///
/// moq-net finds broadcasts with SUBSCRIBE_NAMESPACE and joins a track at
/// the start of its current group (SUBSCRIBE Next Object plus a joining
/// FETCH). `push`: `moq` is there first and must get every frame.
/// `announce`: objects flow only while the relay subscribes, and `moq` comes
/// 1.3 s late: it must get the catalog (written again for it) and play the
/// rest from a keyframe on.
pub(crate) fn moq_subscribes(bin: &Path, scheme: &str, version: &str, format: &str, mode: &str) {
    let dir = Dir::new(&format!("export-{scheme}-{version}-{format}-{mode}"));
    let input = dir.path("in.mp4");
    h264_aac(&input, FRAMES as u32 / 30);
    let (_relay, port) = relay(&dir);
    let broadcast = format!("live/quichub-{format}-{mode}.hang");
    let out = dir.path("out.mp4");
    let export = || {
        Proc(
            moq(bin, &dir, &url(scheme, port), version, &broadcast)
                .args(["export", "fmp4"])
                .stdout(std::fs::File::create(&out).unwrap())
                .stderr(std::fs::File::create(dir.path("moq.log")).unwrap())
                .spawn()
                .unwrap(),
        )
    };
    let publish = || {
        Command::new(QUICHUB)
            .args(["pub", &format!("moqt://127.0.0.1:{port}/")])
            .args(["--mode", mode, "--broadcast", &broadcast])
            .args(["--format", format, "--input"])
            .arg(&input)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let late = mode == "announce";
    let (mut subscriber, p) = if late {
        let p = publish();
        std::thread::sleep(Duration::from_millis(1300));
        (export(), p)
    } else {
        let s = export();
        std::thread::sleep(Duration::from_secs(1));
        (s, publish())
    };
    let p = p.wait_with_output().unwrap();
    let ended = wait_for(&mut subscriber.0, Duration::from_secs(10));
    let logs = format!(
        "--- quichub pub\n{}\n--- moq\n{}\n--- relay\n{}",
        String::from_utf8_lossy(&p.stderr),
        dir.log("moq.log"),
        dir.log("relay.log")
    );
    assert!(p.status.success(), "{logs}");
    assert!(ended, "moq export did not end with the broadcast\n{logs}");
    let what = format!("moq export of {format} ({mode}) over {scheme} ({version})");
    if late {
        let (a, b) = (picture_md5s(&input), picture_md5s(&out));
        assert!(
            (30..FRAMES).contains(&b.len()),
            "{what}: {} frames\n{logs}",
            b.len()
        );
        assert!(
            b[..] == a[a.len() - b.len()..],
            "{what}: decoded pictures differ"
        );
    } else {
        assert_same_pictures(&input, &out, &what);
        assert_same_audio(&input, &out, &what);
    }
}

/// Tokens from moq-dev's own tool: a key made by `moq auth generate` is
/// quichub's `[auth] key`, `moq auth sign` makes the tokens (newer
/// `publish`/`subscribe` patterns), `moq import` publishes with `?jwt=` over
/// WebTransport and `quichub sub` plays it with its own `?jwt=` over raw
/// QUIC; without a token, or outside its grant, quichub refuses.
fn moq_tokens(bin: &Path) {
    let dir = Dir::new("tokens");
    let input = dir.path("in.mp4");
    h264_aac(&input, 2);
    let moq_auth = |args: &[&str]| -> String {
        let out = Command::new(bin.join("moq"))
            .arg("auth")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "moq auth {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let key = dir.path("moq.jwk");
    moq_auth(&["generate", "--out", key.to_str().unwrap()]);
    let k = key.to_str().unwrap();
    let put = moq_auth(&["sign", "--key", k, "--root", "live", "--publish", "cams/**"]);
    let get = moq_auth(&[
        "sign",
        "--key",
        k,
        "--root",
        "live",
        "--subscribe",
        "cams/a.hang",
    ]);
    let config = dir.path("relay.toml");
    std::fs::write(&config, format!("[auth]\nkey = {:?}\n", key)).unwrap();
    let (_relay, port) = relay_with(&dir, &["--config", config.to_str().unwrap()]);
    let sub = |token: &str, broadcast: &str, out: &Path| {
        Command::new(QUICHUB)
            .args(["sub", &format!("moqt://127.0.0.1:{port}/?jwt={token}")])
            .args(["--fingerprint", &dir.1])
            .args(["--broadcast", broadcast, "--duration", "30", "--output"])
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let out = dir.path("out.mp4");
    let allowed = sub(&get, "live/cams/a.hang", &out);
    // Outside the subscriber's grant, and without any token: refused.
    let other = sub(&get, "live/cams/b.hang", &dir.path("b.mp4"));
    let anonymous = sub("", "live/cams/a.hang", &dir.path("anon.mp4"));
    std::thread::sleep(Duration::from_secs(1));
    let mut ffmpeg = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-re", "-i"])
        .arg(&input)
        .args([
            "-c",
            "copy",
            "-f",
            "mp4",
            "-movflags",
            CMAF_PIPE,
            "-frag_duration",
            "1",
            "-",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("https://127.0.0.1:{port}/?jwt={put}");
    let mut publisher = Proc(
        moq(bin, &dir, &url, DRAFT_18, "live/cams/a.hang")
            .args(["import", "fmp4"])
            .stdin(ffmpeg.stdout.take().unwrap())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path("moq.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let published = wait_for(&mut publisher.0, Duration::from_secs(30));
    let _ = ffmpeg.wait();
    let allowed = allowed.wait_with_output().unwrap();
    let logs = |extra: &str| {
        format!(
            "--- moq import\n{}\n--- quichub sub\n{extra}\n--- relay\n{}",
            dir.log("moq.log"),
            dir.log("relay.log")
        )
    };
    let sub_log = String::from_utf8_lossy(&allowed.stderr).to_string();
    assert!(published, "moq import did not end\n{}", logs(&sub_log));
    assert!(
        allowed.status.success(),
        "quichub sub failed\n{}",
        logs(&sub_log)
    );
    // The sub asks for the broadcast before it exists: it gets every frame.
    let frames = count_frames(&out);
    assert!(
        frames.iter().any(|(c, n)| c == "h264" && *n == 60),
        "{frames:?}\n{}",
        logs(&sub_log)
    );
    for (what, child) in [("outside its grant", other), ("without a token", anonymous)] {
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "a subscriber {what} was served\n{err}");
        assert!(err.contains("not authorized"), "{what}: {err}");
    }
}

/// The tests of this file take turns: each runs real-time ffmpeg, moq, a
/// relay and subscribers, and two such pipelines at once on a 2-core
/// machine starved one another (a lost first GOP at a joining subscriber, a
/// lost last audio packet at `moq export`).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn moq_cli_imports_fmp4_into_quichub_and_quichub_sub_plays_it() {
    let Some(bin) = tools() else { return };
    let _turn = one_at_a_time();
    for scheme in ["moqt", "https"] {
        // `moq import` announces and the relay subscribes upstream only when
        // a subscriber asks; when that lands mid-group, the start of that
        // group is lost: the relay cannot FETCH upstream yet (the MoQT
        // breadth issue). Now and then (3 of ~10 full runs on 2 cores) a
        // subscriber then misses the first GOP or the last audio packet.
        // One more try, with every assertion, rather than a red suite.
        if std::panic::catch_unwind(|| moq_publishes(&bin, scheme, DRAFT_18)).is_err() {
            eprintln!("moq import over {scheme}: failed once (see above); once more");
            moq_publishes(&bin, scheme, DRAFT_18);
        }
    }
    // With tokens from moq-dev's `moq auth`: the same `moq import`, so the
    // same race (seen once in a full run under load: 59 of 60 frames).
    if std::panic::catch_unwind(|| moq_tokens(&bin)).is_err() {
        eprintln!("moq import with tokens: failed once (see above); once more");
        moq_tokens(&bin);
    }
}

#[test]
fn quichub_pub_hang_plays_through_moq_cli_export() {
    let Some(bin) = tools() else { return };
    let _turn = one_at_a_time();
    moq_subscribes(&bin, "moqt", DRAFT_18, "hang", "push");
    moq_subscribes(&bin, "https", DRAFT_18, "hang-cmaf", "push");
    moq_subscribes(&bin, "moqt", DRAFT_18, "hang", "announce");
}
