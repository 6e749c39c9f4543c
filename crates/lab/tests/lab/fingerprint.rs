//! `quichub-lab fingerprint --quick` end to end: structure of what it writes and
//! that its counts add up (every session observed on both hops, confusion
//! matrices summing to the sessions, padding only where a defence pads). No
//! accuracy or timing thresholds. Skips (and passes) where the link
//! emulator cannot run, or where ffmpeg is missing unless
//! QUICHUB_MEDIA_TESTS=1 says it must be there (then it fails).

use std::path::PathBuf;

use clap::Parser;
use quichub_lab::Experiment;

use crate::Cli;

#[test]
fn fingerprint_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    let ffmpeg = std::process::Command::new("ffmpeg")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ffmpeg {
        assert!(
            std::env::var("QUICHUB_MEDIA_TESTS").as_deref() != Ok("1"),
            "ffmpeg is missing but QUICHUB_MEDIA_TESTS=1 requires it"
        );
        println!("SKIPPED: ffmpeg not found (set QUICHUB_MEDIA_TESTS=1 to make this a failure)");
        return;
    }
    let out: PathBuf = std::env::temp_dir().join(format!("qh-lab-fp-{}", std::process::id()));
    let a = Cli::try_parse_from([
        "lab",
        "fingerprint",
        "--quick",
        "--reps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ])
    .expect("arguments parse")
    .lab;
    let Experiment::Fingerprint(f) = a.experiment.clone() else {
        panic!("parsed as fingerprint")
    };
    let (dir, ok) = quichub_lab::fingerprint::run(&a, &f).expect("experiment runs");
    assert!(
        dir.starts_with(out.join("fingerprint")),
        "{}",
        dir.display()
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| defence | hop | sessions |"),
        "main table"
    );
    assert!(report.contains("Streaming over QUIC: Applications in Media and IoT"));
    assert!(!report.to_lowercase().contains("seed"), "{report}");
    for svg in ["accuracy_overhead.svg", "accuracy.svg", "bitrate.svg"] {
        let s = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(s.starts_with("<svg") && s.contains("</svg>"), "{svg}");
    }

    let sessions = json["sessions"].as_array().unwrap();
    let failed: Vec<String> = sessions
        .iter()
        .filter(|r| !r["error"].is_null())
        .map(|r| format!("{} {}: {}", r["defence"], r["resolution"], r["error"]))
        .collect();
    assert!(failed.is_empty() && ok, "failed sessions: {failed:#?}");
    // 2 defences × 3 sessions × 4 resolutions.
    assert_eq!(sessions.len(), 2 * 3 * 4);
    for r in sessions {
        let sent = r["frames_sent"].as_u64().unwrap();
        let got = r["objects_received"].as_u64().unwrap();
        assert!(sent > 0 && got <= sent, "{r}");
        for hop in ["uplink", "downlink"] {
            let o = &r[hop];
            assert!(o["packets"].as_u64().unwrap() > 0, "{hop} {r}");
            assert!(o["bytes"].as_u64().unwrap() >= o["packets"].as_u64().unwrap() * 28);
        }
        let pad = r["padding_bytes"].as_u64().unwrap();
        if r["defence"] == "none" {
            assert_eq!(pad, 0);
        } else {
            assert!(pad > 0, "the rate defence pads: {r}");
            assert_eq!(r["padding_refused"].as_u64().unwrap(), 0, "{r}");
        }
    }
    let attacks = json["attacks"].as_array().unwrap();
    assert_eq!(attacks.len(), 2 * 2, "2 defences × 2 hops");
    for a in attacks {
        assert_eq!(a["samples"], 12);
        for s in a["scores"].as_array().unwrap() {
            let sum: u64 = s["confusion"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()))
                .sum();
            assert_eq!(sum, 12, "confusion matrix sums to the sessions");
            let acc = s["accuracy"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&acc));
        }
        assert_eq!(a["accuracy"].as_array().unwrap().len(), 3);
    }
    let costs = json["costs"].as_array().unwrap();
    assert_eq!(costs.len(), 2);
    assert_eq!(costs[0]["defence"], "none");
    assert!(costs[0]["wire_overhead_pct"].as_f64().unwrap().abs() < 1e-9);
    assert!(costs[1]["padding_pct"].as_f64().unwrap() > 0.0);
    std::fs::remove_dir_all(&out).ok();
}
