//! `quichub-lab zero-rtt --quick` end to end: structure of what it writes (every
//! mode produced a result, 0-RTT accepted in the 0-RTT mode), plus the one
//! ordering the experiment exists to show, 0-RTT arriving before a full
//! handshake could, with a generous margin (no tight timing thresholds).
//! Skips (and passes) where the link emulator cannot run (no root, no TUN,
//! no network namespaces).

use std::path::PathBuf;

use clap::Parser;
use quichub_lab::Experiment;

use crate::Cli;

const MODES: [&str; 8] = [
    "mqtt-tcp",
    "mqtt-tls",
    "mqtt-quic-cold",
    "mqtt-quic-resumed",
    "mqtt-quic-0rtt",
    "http3-cold",
    "http3-resumed",
    "http3-0rtt",
];

#[test]
fn zero_rtt_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    let out: PathBuf = std::env::temp_dir().join(format!("qh-lab-zrtt-{}", std::process::id()));
    let a = Cli::try_parse_from([
        "lab",
        "zero-rtt",
        "--quick",
        "--reps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ])
    .expect("arguments parse")
    .lab;
    let Experiment::ZeroRtt(z) = a.experiment.clone() else {
        panic!("parsed as zero-rtt")
    };
    assert_eq!(quichub_lab::zero_rtt::rtts(&a, &z).unwrap(), [50]);
    let (dir, ok) = quichub_lab::zero_rtt::run(&a, &z).expect("experiment runs");
    assert!(dir.starts_with(out.join("zero-rtt")), "{}", dir.display());

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("| RTT | mode | ok/reps |"), "main table");

    let runs = json["runs"].as_array().unwrap();
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r["error"].is_null())
        .map(|r| format!("{} rep {}: {}", r["mode"], r["rep"], r["error"]))
        .collect();
    assert!(failed.is_empty() && ok, "failed runs: {failed:#?}");
    assert_eq!(runs.len(), MODES.len() * 2);
    for r in runs {
        assert!(r["publish_ms"].as_f64().unwrap() > 0.0);
        if r["mode"] == "mqtt-quic-0rtt" || r["mode"] == "http3-0rtt" {
            assert_eq!(r["zero_rtt"], true, "0-RTT accepted");
        }
    }
    let summary = json["summary"].as_array().unwrap();
    let median = |mode: &str| {
        summary
            .iter()
            .find(|s| s["mode"] == mode)
            .unwrap_or_else(|| panic!("{mode} in the summary"))["publish_rtts"]["median"]
            .as_f64()
            .unwrap()
    };
    for m in MODES {
        assert!(median(m) > 0.0, "{m}");
    }
    // 0-RTT: the PUBLISH arrives before any full handshake could have
    // delivered it (one round trip at least).
    assert!(
        median("mqtt-quic-0rtt") < 1.0 && median("mqtt-quic-cold") > 1.0,
        "0-RTT {} RTT, cold {} RTT",
        median("mqtt-quic-0rtt"),
        median("mqtt-quic-cold")
    );
    assert!(
        median("http3-0rtt") < 1.0 && median("http3-cold") > 1.0,
        "HTTP/3 0-RTT {} RTT, cold {} RTT",
        median("http3-0rtt"),
        median("http3-cold")
    );
    std::fs::remove_dir_all(&out).ok();
}
