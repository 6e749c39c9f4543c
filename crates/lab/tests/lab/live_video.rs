//! `quichub-lab live-video --quick` end to end with the real binary, a real
//! nginx + nginx-rtmp and ffmpeg: the structure of what it writes and that
//! its counts add up (no timing thresholds). Skips (and passes) where the
//! link emulator cannot run (no root, no TUN, no network namespaces), or
//! where ffmpeg / nginx / libnginx-mod-rtmp are missing, unless
//! `QUICHUB_MEDIA_TESTS=1` (set by the test script), where missing tools fail.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_quichub-lab");

#[test]
fn live_video_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    if let Some(why) = quichub_lab::live_video::missing_tools() {
        if std::env::var("QUICHUB_MEDIA_TESTS").as_deref() == Ok("1") {
            panic!("QUICHUB_MEDIA_TESTS=1 but {why}");
        }
        println!("SKIPPED: {why}");
        return;
    }
    let out: PathBuf =
        std::env::temp_dir().join(format!("qh-lab-live-video-{}", std::process::id()));
    let run = Command::new(BIN)
        .args(["live-video", "--quick", "--reps", "1", "--out"])
        .arg(&out)
        .output()
        .expect("run quichub-lab live-video");
    let stderr = String::from_utf8_lossy(&run.stderr);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "lab failed:\n{stderr}\n{stdout}");
    let base = out.join("live-video");
    let dir = std::fs::read_dir(&base)
        .expect("result directory")
        .next()
        .expect("one run")
        .unwrap()
        .path();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| link | protocol | subscriber |"),
        "main table"
    );
    assert!(report.contains("Estupiñan-Cuesta"), "cites the study");
    assert!(report.contains("8.16 Mbit/s"), "the paper's figures");
    for f in [
        "g2g.svg",
        "startup.svg",
        "throughput-clean.svg",
        "throughput-lossy-1.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join(f)).unwrap_or_else(|_| panic!("{f}"));
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{f}");
    }

    let frames = json["source_frames"].as_u64().unwrap() as usize;
    assert!(frames >= 200, "8 s at 30 fps: {frames}");
    let mbps = json["source_mbps"].as_f64().unwrap();
    assert!((4.0..16.0).contains(&mbps), "an 8 Mbit/s source: {mbps}");
    let runs = json["runs"].as_array().unwrap();
    // 2 links × 2 protocols × 1 repetition.
    assert_eq!(runs.len(), 4, "{runs:#?}");
    let mut seen = std::collections::HashSet::new();
    for r in runs {
        assert!(r["error"].is_null(), "run failed: {r}");
        seen.insert((
            r["link"].as_str().unwrap().to_string(),
            r["protocol"].as_str().unwrap().to_string(),
        ));
        assert_eq!(
            r["frames_fed"].as_u64().unwrap() as usize,
            frames,
            "every frame fed"
        );
        let subs = r["subs"].as_array().unwrap();
        assert_eq!(subs.len(), 2);
        let roles: Vec<&str> = subs.iter().map(|s| s["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["local", "remote"]);
        for s in subs {
            assert!(s["error"].is_null(), "subscriber failed: {s}");
            let exp = s["frames_expected"].as_u64().unwrap();
            let del = s["frames_delivered"].as_u64().unwrap();
            let miss = s["frames_missing"].as_u64().unwrap();
            assert!(del > 0, "frames delivered: {s}");
            assert_eq!(del + miss, exp, "counts add up: {s}");
            let first = s["first_frame"].as_u64().unwrap() as usize;
            assert_eq!(exp as usize, frames - first);
            assert_eq!(s["unknown"], 0, "every frame is a source frame: {s}");
            let start = s["startup_ms"].as_f64().expect("a keyframe arrived");
            assert!(start > 0.0);
            let (med, p95, max) = (
                s["g2g_median_ms"].as_f64().unwrap(),
                s["g2g_p95_ms"].as_f64().unwrap(),
                s["g2g_max_ms"].as_f64().unwrap(),
            );
            assert!(0.0 < med && med <= p95 && p95 <= max, "{s}");
            let goodput: f64 = s["goodput_series"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .sum();
            let bytes = s["video_bytes"].as_f64().unwrap();
            assert!(
                (goodput - bytes * 8.0 / 1e6).abs() < 1e-6 * (1.0 + goodput),
                "goodput series sums to the video delivered: {goodput} vs {bytes}"
            );
            if s["role"] == "remote" {
                let wire = s["wire_bytes"].as_f64().unwrap();
                assert!(
                    wire > bytes,
                    "headers on top of the video: {wire} vs {bytes}"
                );
                let per = s["wire_per_video_byte"].as_f64().unwrap();
                assert!((per - wire / bytes).abs() < 1e-9);
                assert!(s["wire_mbps"].as_f64().unwrap() > 0.0);
                assert!(!s["wire_series"].as_array().unwrap().is_empty());
            } else {
                assert!(
                    s["wire_bytes"].is_null(),
                    "the local subscriber is off the link"
                );
            }
            if r["protocol"] != "moq" {
                assert!(s["segments"].as_u64().unwrap() > 0, "{s}");
                assert!(s["playlist_loads"].as_u64().unwrap() > 0, "{s}");
            }
        }
    }
    assert_eq!(seen.len(), 4, "every (link, protocol) once: {seen:?}");
    let summary = json["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 8, "2 links × 2 protocols × 2 subscribers");
    for row in summary {
        assert_eq!(row["ok"], 1, "{row}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
