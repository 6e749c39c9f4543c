//! `quichub-lab mar --quick` end to end: structure and consistency of what it writes
//! (every protocol on every link produced results, counts add up), never
//! timing thresholds. Skips (and passes) where the link emulator cannot run
//! (no root, no TUN, no network namespaces).

use std::path::PathBuf;

use clap::Parser;
use quichub_lab::Experiment;

use crate::Cli;

const PROTOCOLS: [&str; 6] = ["udp", "tcp", "rtp", "mpeg-ts", "quic-stream", "quic-dgram"];

#[test]
fn mar_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    let out: PathBuf = std::env::temp_dir().join(format!("qh-lab-mar-{}", std::process::id()));
    let a = Cli::try_parse_from([
        "lab",
        "mar",
        "--quick",
        "--reps",
        "3",
        "--out",
        out.to_str().unwrap(),
    ])
    .expect("arguments parse")
    .lab;
    let Experiment::Mar(mar) = a.experiment.clone() else {
        panic!("parsed as mar")
    };
    let links: Vec<String> = quichub_lab::mar::links(&a, &mar)
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    let resolutions = quichub_lab::mar::resolutions(&a, &mar).unwrap();
    assert!(links.len() >= 2, "a clean and a lossy link: {links:?}");
    let (dir, ok) = quichub_lab::mar::run(&a, &mar).expect("experiment runs");
    assert!(dir.starts_with(out.join("mar")), "{}", dir.display());

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("| link | protocol | reps |"), "main table");
    assert!(report.contains("## Beside the paper"), "paper comparison");
    for l in &links {
        for f in ["rtt", "jitter", "throughput", "lost"] {
            assert!(dir.join(format!("{f}-{l}.svg")).exists(), "{f}-{l}.svg");
        }
        assert!(
            dir.join(format!("rtt-time-{l}-1152x648.svg")).exists(),
            "latency-over-time plot for {l}"
        );
    }

    let runs = json["runs"].as_array().unwrap();
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r["error"].is_null())
        .map(|r| {
            format!(
                "{} {} {} rep {}: {}",
                r["link"], r["protocol"], r["resolution"], r["rep"], r["error"]
            )
        })
        .collect();
    assert!(failed.is_empty() && ok, "failed runs: {failed:#?}");
    assert_eq!(
        runs.len(),
        links.len() * PROTOCOLS.len() * resolutions.len() * 3
    );
    for link in &links {
        for proto in PROTOCOLS {
            let these: Vec<_> = runs
                .iter()
                .filter(|r| r["link"] == link.as_str() && r["protocol"] == proto)
                .collect();
            assert_eq!(
                these.len(),
                resolutions.len() * 3,
                "{link} {proto}: every resolution, 3 repetitions"
            );
            let mut answered_total = 0;
            for r in these {
                let sent = r["sent"].as_u64().unwrap();
                let answered = r["answered"].as_u64().unwrap();
                let lost = r["lost"].as_u64().unwrap();
                let server = r["server_received"].as_u64().unwrap();
                let rtts = r["rtt_ms"].as_array().unwrap();
                assert!(sent > 0, "{link} {proto}: requests sent");
                assert_eq!(
                    sent,
                    answered + lost,
                    "{link} {proto}: sent = answered + lost"
                );
                assert_eq!(
                    rtts.len() as u64,
                    sent,
                    "{link} {proto}: one RTT slot per request"
                );
                assert_eq!(
                    rtts.iter().filter(|v| !v.is_null()).count() as u64,
                    answered,
                    "{link} {proto}: answered = RTTs measured"
                );
                assert!(
                    answered <= server && server <= sent,
                    "{link} {proto}: answered ≤ received by the server ≤ sent ({answered}, {server}, {sent})"
                );
                assert_eq!(r["rtt_p50_ms"].is_null(), answered == 0);
                answered_total += answered;
            }
            assert!(answered_total > 0, "{link} {proto}: some request answered");
        }
    }
    let summary = json["summary"].as_array().unwrap();
    assert_eq!(
        summary.len(),
        links.len() * PROTOCOLS.len() * resolutions.len()
    );
    for row in summary {
        assert_eq!(row["reps"], 3, "{row}");
    }
    let main = json["main"].as_array().unwrap();
    assert_eq!(main.len(), links.len() * PROTOCOLS.len());
    for row in main {
        assert_eq!(row["reps"], 3, "{row}");
    }
    // QH_LAB_KEEP=1 keeps the results for a look.
    if std::env::var_os("QH_LAB_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&out);
    } else {
        println!("kept {}", dir.display());
    }
}
