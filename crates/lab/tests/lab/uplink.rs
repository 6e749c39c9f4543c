//! `quichub-lab uplink --quick` end to end: every (link, transport) ran and moved
//! data, the per-bin counts add up to the goodput, the wire carried at least
//! the application's bytes, and the report has its table and plots. No
//! timing or rate thresholds (those are the experiment's figures, not pass
//! criteria). Skips (and passes) where the link emulator cannot run.

use std::path::PathBuf;

use clap::Parser;
use quichub_lab::Experiment;

use crate::Cli;

#[test]
fn uplink_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    let out: PathBuf = std::env::temp_dir().join(format!("qh-lab-uplink-{}", std::process::id()));
    let extra: Vec<String> = std::env::var("QUICHUB_UPLINK_ARGS")
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let mut argv = vec![
        "lab".to_string(),
        "uplink".into(),
        "--quick".into(),
        "--reps".into(),
        "1".into(),
        "--out".into(),
        out.to_str().unwrap().into(),
    ];
    argv.extend(extra);
    let a = Cli::try_parse_from(argv).expect("arguments parse").lab;
    let Experiment::Uplink(u) = a.experiment.clone() else {
        panic!("parsed as uplink")
    };
    let links = quichub_lab::uplink::links(&a, &u).unwrap();
    let (dir, ok) = quichub_lab::uplink::run(&a, &u).expect("experiment runs");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let runs = json["runs"].as_array().unwrap();
    let modes = json["modes"].as_array().unwrap();
    assert_eq!(runs.len(), links.len() * modes.len());
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        let bins: u64 = r["bins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum();
        assert!(bins > 0, "no data moved: {r}");
        let secs = json["config"]["duration"]["secs"].as_f64().unwrap()
            + json["config"]["duration"]["nanos"].as_f64().unwrap() / 1e9;
        let mbps = bins as f64 * 8.0 / secs / 1e6;
        assert!(
            (mbps - r["goodput_mbps"].as_f64().unwrap()).abs() < 1e-6,
            "{r}"
        );
        assert!(r["wire_per_byte"].as_f64().unwrap() >= 1.0, "{r}");
    }
    assert!(ok);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| link | uplink Mbit/s | transport |"),
        "{report}"
    );
    assert!(dir.join("utilisation.svg").exists());
    let _ = std::fs::remove_dir_all(&out);
}
