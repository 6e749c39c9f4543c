//! `quichub-lab video-priority --quick` end to end, through the real binary
//! (its `pub --broadcast` is the publisher): the structure of what it
//! writes and that its counts add up (per step to the whole run, per bin to
//! the whole run, decodable ≤ on time ≤ received ≤ sent), every frame on
//! the subgroup its delivery puts it on. No timing thresholds.
//!
//! Skips (and passes) without root or where the link emulator cannot run,
//! and without ffmpeg, unless `QUICHUB_MEDIA_TESTS=1`, where a missing
//! ffmpeg fails.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[test]
fn video_priority_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    if let Some(why) = quichub_lab::video_priority::ffmpeg_missing() {
        if std::env::var("QUICHUB_MEDIA_TESTS").is_ok_and(|v| v == "1") {
            panic!("QUICHUB_MEDIA_TESTS=1 but {why}");
        }
        println!("SKIPPED: {why}");
        return;
    }
    let out: PathBuf = std::env::temp_dir().join(format!("qh-lab-vp-test-{}", std::process::id()));
    let reps = 2;
    let o = Command::new(env!("CARGO_BIN_EXE_quichub-lab"))
        .args(["video-priority", "--quick", "--reps", "2", "--out"])
        .arg(&out)
        .output()
        .expect("quichub-lab runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "lab failed: {stderr}");
    let base = out.join("video-priority");
    let dir = std::fs::read_dir(&base)
        .expect("result directory")
        .next()
        .expect("one run")
        .unwrap()
        .path();
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| delivery | link | ok/reps |"),
        "main table"
    );
    assert!(report.contains("Streaming over QUIC: Applications in Media and IoT"));
    assert!(
        report.contains("First Encode, First Send"),
        "the study's words"
    );
    for svg in [
        "decodable-fps.svg",
        "on-time-by-type-group.svg",
        "on-time-by-type-frame-type.svg",
        "freeze.svg",
        "keyframe-latency.svg",
        "on-time-per-step.svg",
    ] {
        let s = std::fs::read_to_string(dir.join(svg)).unwrap_or_else(|_| panic!("{svg}"));
        assert!(s.starts_with("<svg") && s.contains("</svg>"), "{svg}");
    }

    let steps = json["config"]["steps_bps"].as_array().unwrap().len();
    let gop = json["config"]["gop"].as_u64().unwrap();
    let frames = json["video"]["frames"].as_u64().unwrap();
    let by_type: Vec<u64> = json["video"]["frames_by_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(by_type.iter().sum::<u64>(), frames);
    assert!(
        by_type.iter().all(|&n| n > 0),
        "I, P and B frames: {by_type:?}"
    );
    assert!(
        json["video"]["structure_notes"]
            .as_array()
            .unwrap()
            .is_empty(),
        "the encoder made the assumed GOP structure: {}",
        json["video"]["structure_notes"]
    );
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * reps);
    let counted = frames - gop; // the warm-up GOP is left out
    for r in runs {
        let name = format!("{} rep {}", r["delivery"], r["rep"]);
        assert!(r["error"].is_null(), "{name}: {}", r["error"]);
        assert_eq!(r["done"], true, "{name}: PUBLISH_DONE");
        assert_eq!(r["wrong_subgroup"], 0, "{name}");
        assert_eq!(r["unmatched"], 0, "{name}");
        assert_eq!(r["catalogs"], 1, "{name}");
        let spans = r["spans"].as_array().unwrap();
        assert_eq!(spans.len(), steps + 1, "{name}");
        let whole = spans.last().unwrap();
        assert!(whole["step"].is_null());
        let field = |s: &Value, t: usize, k: &str| s["by_type"][t][k].as_u64().unwrap();
        let all = |s: &Value, k: &str| s["all"][k].as_u64().unwrap();
        assert_eq!(all(whole, "sent"), counted, "{name}");
        for k in ["sent", "received", "on_time", "decodable"] {
            let per_step: u64 = spans[..steps].iter().map(|s| all(s, k)).sum();
            assert_eq!(per_step, all(whole, k), "{name} {k}: steps add up");
            for s in spans {
                assert_eq!(
                    (0..3).map(|t| field(s, t, k)).sum::<u64>(),
                    all(s, k),
                    "{name} {k}: types add up"
                );
            }
        }
        for s in spans {
            for t in 0..3 {
                assert!(field(s, t, "decodable") <= field(s, t, "on_time"), "{name}");
                assert!(field(s, t, "on_time") <= field(s, t, "received"), "{name}");
                assert!(field(s, t, "received") <= field(s, t, "sent"), "{name}");
            }
            // An I frame needs nothing else.
            assert_eq!(field(s, 0, "decodable"), field(s, 0, "on_time"), "{name}");
            let span_s = s["to_s"].as_f64().unwrap() - s["from_s"].as_f64().unwrap();
            assert!(s["freeze_s"].as_f64().unwrap() <= span_s + 1e-6, "{name}");
        }
        let kf = r["keyframes"].as_array().unwrap();
        assert_eq!(
            kf.len() as u64,
            field(whole, 0, "sent"),
            "{name}: keyframes"
        );
        let kf_lost = kf.iter().filter(|k| k["latency_ms"].is_null()).count() as u64;
        assert_eq!(kf_lost, whole["keyframes_lost"].as_u64().unwrap(), "{name}");
        let bins = r["bins"].as_array().unwrap();
        let dec: f64 = bins
            .iter()
            .map(|b| b["decodable_fps"].as_f64().unwrap())
            .sum();
        assert!(
            (dec - all(whole, "decodable") as f64).abs() < 1e-6,
            "{name}: bins add up"
        );
        let on: f64 = bins
            .iter()
            .flat_map(|b| {
                b["on_time_fps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
            })
            .sum();
        assert!(
            (on - all(whole, "on_time") as f64).abs() < 1e-6,
            "{name}: bins add up"
        );
        let fr: f64 = bins.iter().map(|b| b["freeze_s"].as_f64().unwrap()).sum();
        assert!(
            (fr - whole["freeze_s"].as_f64().unwrap()).abs() < 1e-6,
            "{name}: freeze adds up"
        );
    }
    let summary = json["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2 * (steps + 1));
    for s in summary {
        assert_eq!(s["ok"].as_u64().unwrap(), reps as u64);
    }
    std::fs::remove_dir_all(&out).ok();
}
