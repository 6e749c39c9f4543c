//! `quichub-lab imu --quick` end to end: structure and consistency of what it writes,
//! never timing thresholds. Skips (and passes) where the link emulator
//! cannot run (no root, no TUN, no network namespaces).

use std::path::PathBuf;

use clap::Parser;
use quichub_lab::{Experiment, LabArgs};

use crate::Cli;

fn args(out: &std::path::Path) -> LabArgs {
    Cli::try_parse_from([
        "lab",
        "imu",
        "--quick",
        "--reps",
        "3",
        "--out",
        out.to_str().unwrap(),
    ])
    .expect("arguments parse")
    .lab
}

#[test]
fn imu_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    let out: PathBuf = std::env::temp_dir().join(format!("qh-lab-imu-{}", std::process::id()));
    let a = args(&out);
    let Experiment::Imu(imu) = a.experiment.clone() else {
        panic!("parsed as imu")
    };
    let (dir, ok) = quichub_lab::imu::run(&a, &imu).expect("experiment runs");
    assert!(dir.starts_with(out.join("imu")), "{}", dir.display());

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| link | mode | sensor |"),
        "main table in report"
    );
    let svgs = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "svg")
        })
        .count();
    assert!(svgs >= 1, "at least one plot");
    for link in ["clean", "constrained"] {
        assert!(
            dir.join(format!("latency-time-{link}.svg")).exists(),
            "latency-over-time plot for {link}"
        );
    }

    let runs = json["runs"].as_array().unwrap();
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r["error"].is_null())
        .map(|r| {
            format!(
                "{} {} rep {}: {}",
                r["link"], r["mode"], r["rep"], r["error"]
            )
        })
        .collect();
    assert!(failed.is_empty() && ok, "failed runs: {failed:#?}");
    let links = ["clean", "constrained"];
    let modes = ["quic-single", "quic-streams", "quic-weighted", "tcp"];
    assert_eq!(runs.len(), links.len() * modes.len() * 3);
    for link in links {
        for mode in modes {
            let these: Vec<_> = runs
                .iter()
                .filter(|r| r["link"] == link && r["mode"] == mode)
                .collect();
            assert_eq!(these.len(), 3, "{link} {mode}: 3 repetitions");
            for r in these {
                let sensors = r["sensors"].as_array().unwrap();
                assert_eq!(sensors.len(), 2, "{link} {mode}: both sensors");
                for s in sensors {
                    let sent = s["sent"].as_u64().unwrap();
                    let written = s["written"].as_u64().unwrap();
                    let received = s["received"].as_u64().unwrap();
                    let bins: u64 = s["per_second"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap())
                        .sum();
                    assert!(sent > 0, "{link} {mode} {}: generated samples", s["sensor"]);
                    assert!(written <= sent, "{link} {mode}: written ≤ sent");
                    assert!(received <= written, "{link} {mode}: received ≤ written");
                    assert!(
                        received > 0,
                        "{link} {mode} {}: something arrived",
                        s["sensor"]
                    );
                    assert_eq!(bins, received, "{link} {mode}: per-second bins add up");
                    if link == "clean" {
                        assert!(!s["p50_ms"].is_null() && !s["p99_ms"].is_null());
                    }
                }
            }
        }
    }
    let summary = json["summary"].as_array().unwrap();
    assert_eq!(summary.len(), links.len() * modes.len() * 2);
    for row in summary {
        assert_eq!(row["reps"], 3, "{row}");
    }
    // QH_LAB_KEEP=1 keeps the results for a look.
    if std::env::var_os("QH_LAB_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&out);
    } else {
        println!("kept {}", dir.display());
    }
}
