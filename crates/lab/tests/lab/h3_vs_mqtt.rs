//! `quichub-lab h3-vs-mqtt --quick` end to end, through the binary (its own
//! publishers are child processes of it): the structure of what it writes
//! and that its counts add up (every message at the broker, every run's
//! packets from the capture, more bytes with more publishes); no timing
//! thresholds. Skips (and passes) where the link emulator cannot run. A
//! missing third-party client is skipped by the experiment with a printed
//! reason, unless `QUICHUB_MQTT_PYTHON` is set (scripts/test.sh installs the
//! tools): then the experiment, and this test, fail.

use std::process::Command;

#[test]
fn h3_vs_mqtt_quick_structure() {
    let _serial = crate::serial();
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    let out = std::env::temp_dir().join(format!("qh-lab-hvm-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_quichub-lab"))
        .args(["h3-vs-mqtt", "--quick", "--reps", "2", "--counts", "0,5"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("quichub-lab runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    let stdout = String::from_utf8_lossy(&run.stdout);
    for l in stderr.lines().filter(|l| l.starts_with("SKIPPED")) {
        println!("{l}");
    }
    assert!(
        run.status.success(),
        "lab h3-vs-mqtt failed:\n{stdout}\n{stderr}"
    );
    let dir = std::fs::read_dir(out.join("h3-vs-mqtt"))
        .expect("results directory")
        .next()
        .expect("one run")
        .unwrap()
        .path();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for svg in ["bytes.svg", "packets.svg", "device.svg", "paper.svg"] {
        let s = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(s.starts_with("<svg") && s.contains("</svg>"), "{svg}");
        assert!(report.contains(&format!("]({svg})")), "{svg} in the report");
    }
    assert!(
        report.contains("## The paper's figures beside ours"),
        "{report}"
    );
    assert!(report.contains("A Pure HTTP/3 Alternative to MQTT-over-QUIC"));
    assert!(!report.to_lowercase().contains("seed"));
    assert!(
        stdout.contains("| client | connection alone"),
        "main table printed"
    );

    let clients = json["clients"].as_array().unwrap();
    let skipped = json["skipped"].as_array().unwrap();
    let labels: Vec<&str> = clients
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    // quichub's own clients always run.
    for own in [
        "http3-quichub",
        "mqtt-quic-single-quichub",
        "mqtt-quic-multi-quichub",
        "mqtt-tcp-quichub",
        "mqtt-tls-quichub",
        "moqt-quichub",
    ] {
        assert!(labels.contains(&own), "{own} in {labels:?}");
    }
    if std::env::var_os("QUICHUB_MQTT_PYTHON").is_some() {
        assert_eq!(
            skipped.len(),
            1,
            "only the third-party MoQT client is skipped: {skipped:?}"
        );
        for third in [
            "http3-aioquic",
            "mqtt-quic-single-mqttv5",
            "mqtt-quic-multi-flowsdk",
            "mqtt-tcp-mosquitto",
            "mqtt-tls-mosquitto",
        ] {
            assert!(labels.contains(&third), "{third} in {labels:?}");
        }
    }

    let runs = json["runs"].as_array().unwrap();
    let mut expected = 0;
    for c in clients {
        let label = c["label"].as_str().unwrap();
        let zero = c["zero"].as_bool().unwrap();
        for n in [0u64, 5] {
            if n == 0 && !zero {
                continue;
            }
            let of: Vec<&serde_json::Value> = runs
                .iter()
                .filter(|r| r["client"] == label && r["n"].as_u64() == Some(n))
                .collect();
            assert_eq!(of.len(), 2, "{label} n={n}: one run per repetition");
            expected += 2;
            for r in &of {
                assert!(r["error"].is_null(), "{label} n={n}: {}", r["error"]);
                // More where a QoS 1 client sent a PUBLISH again before its PUBACK came.
                assert!(
                    r["delivered"].as_u64().unwrap() >= n,
                    "{label}: all at the broker"
                );
                assert!(r["packets_up"].as_u64().unwrap() > 0, "{label}: packets up");
                assert!(
                    r["packets_down"].as_u64().unwrap() > 0,
                    "{label}: packets down"
                );
                assert!(r["cpu_ms"].as_f64().unwrap() >= 0.0);
                assert!(r["max_rss_kib"].as_u64().unwrap() > 0, "{label}: RSS");
            }
        }
        // Five 1 KiB messages cost more than the bare connection, on every repetition.
        for rep in 0..2 {
            let bytes = |n: u64| {
                runs.iter()
                    .find(|r| r["client"] == label && r["n"].as_u64() == Some(n) && r["rep"] == rep)
                    .map(|r| r["bytes_up"].as_u64().unwrap() + r["bytes_down"].as_u64().unwrap())
            };
            if let (Some(b0), Some(b5)) = (bytes(0), bytes(5)) {
                assert!(b5 > b0 + 5 * 1024, "{label} rep {rep}: {b5} vs {b0}");
            }
        }
    }
    assert_eq!(runs.len(), expected, "no other runs");
    // The runs add up to what the capture gave them.
    let sum = |k: &str| runs.iter().map(|r| r[k].as_u64().unwrap()).sum::<u64>();
    let cap = &json["capture"];
    assert_eq!(cap["missed"].as_u64(), Some(0));
    assert_eq!(
        sum("packets_up") + sum("packets_down"),
        cap["attributed_packets"].as_u64().unwrap()
    );
    assert_eq!(
        sum("bytes_up") + sum("bytes_down"),
        cap["attributed_bytes"].as_u64().unwrap()
    );
    assert!(cap["attributed_packets"].as_u64() <= cap["packets"].as_u64());
    // One network row per (client, count), one per-client row per client.
    let rows = json["network"].as_array().unwrap();
    assert_eq!(rows.len() * 2, expected);
    assert_eq!(json["per_client"].as_array().unwrap().len(), clients.len());
    let _ = std::fs::remove_dir_all(&out);
}
