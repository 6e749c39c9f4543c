//! `quichub pub --shape-rate` and `--pad-objects` end to end: a broadcast
//! shaped on its way to a real relay still reaches a subscriber frame for
//! frame, and the publisher reports the padding it sent (MoQT PADDING
//! datagrams, which the relay accepts and drops). What the shaping hides
//! from an observer is measured by `quichub-lab fingerprint`. Needs ffmpeg
//! (skipped without it, unless QUICHUB_MEDIA_TESTS=1 says it must exist).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_quichub");

fn have_ffmpeg() -> bool {
    let ok = Command::new("ffmpeg")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("QUICHUB_MEDIA_TESTS").as_deref() != Ok("1"),
            "QUICHUB_MEDIA_TESTS=1 but ffmpeg is not installed"
        );
        println!("SKIPPED: ffmpeg not installed");
    }
    ok
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The number in `... NAME N ...` of a log line, e.g. `padding 1234 bytes`.
fn number_before(log: &str, word: &str) -> Option<u64> {
    let w: Vec<&str> = log.split_whitespace().collect();
    w.windows(2)
        .find(|p| p[1].trim_matches(|c: char| !c.is_alphanumeric()) == word)
        .and_then(|p| p[0].parse().ok())
}

#[test]
fn shaped_broadcast_arrives_whole_and_reports_its_padding() {
    if !have_ffmpeg() {
        return;
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("quichub-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.mp4");
    let ok = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi"])
        .args(["-t", "3", "-i", "testsrc2=size=640x360:rate=30"])
        .args([
            "-c:v", "libx264", "-preset", "veryfast", "-g", "30", "-b:v", "800k",
        ])
        .args(["-pix_fmt", "yuv420p", "-f", "mp4", "-movflags"])
        .arg("cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame")
        .arg(&input)
        .status()
        .unwrap();
    assert!(ok.success(), "ffmpeg");
    let mut relay = Command::new(BIN)
        .args(["relay", "--bind", "127.0.0.1:0", "--metrics", "off"])
        .args(["--mqtt", "off", "--http", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn relay");
    let mut lines = BufReader::new(relay.stdout.take().unwrap()).lines();
    let first = lines.next().expect("relay printed nothing").unwrap();
    let addr = first
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    std::thread::spawn(move || for _ in lines {});
    let _relay = Killed(relay);
    let url = format!("moqt://{addr}/");
    let out = dir.join("out.mp4");
    let sub = Command::new(BIN)
        .args(["sub", &url, "--broadcast", "live/shaped", "--output"])
        .arg(&out)
        .args(["--duration", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sub");
    let p = Command::new(BIN)
        .args(["pub", &url, "--broadcast", "live/shaped", "--input"])
        .arg(&input)
        .args(["--shape-rate", "2000", "--pad-objects", "1.5"])
        .stdin(Stdio::null())
        .output()
        .expect("run pub");
    let log = String::from_utf8_lossy(&p.stderr).into_owned();
    assert!(p.status.success(), "{log}");
    let shaping = log
        .lines()
        .find(|l| l.starts_with("shaping:"))
        .unwrap_or_else(|| panic!("no shaping line in {log}"));
    let media = number_before(shaping, "media").expect("media bytes");
    let padding = number_before(shaping, "padding").expect("padding bytes");
    // 3 s of ~800 kbit/s shaped to 2000 kbit/s on the wire (QUIC also pads
    // every packet to full size, which this count leaves out).
    assert!(media > 100_000 && padding > media / 4, "{shaping}");
    assert!(!shaping.contains("refused"), "{shaping}");
    let s = sub.wait_with_output().unwrap();
    let slog = String::from_utf8_lossy(&s.stderr);
    assert!(s.status.success(), "{slog}");
    assert!(slog.contains("video 90 frames"), "{slog}");
    std::fs::remove_dir_all(&dir).ok();
}
