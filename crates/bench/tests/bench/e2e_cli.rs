//! The real `quichub-bench` binary against a relay (or broker) started in
//! this process: JSON alone on stdout, checks before the run, `--version`.
//! The relay's CPU is this process's (`--relay-pid` is our own PID).

use std::process::{Command, Output};
use std::time::Duration;

use quichub_testkit::{TestGateway, TestRelay};

const BIN: &str = env!("CARGO_BIN_EXE_quichub-bench");

/// Runs `cmd` to the end off the runtime, which keeps serving the relay.
async fn output(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// Whether `stdout` is exactly one JSON value (and nothing else).
fn json_only(stdout: &[u8]) -> serde_json::Value {
    serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(stdout)))
}

/// `run --json -`: stdout is the JSON report and nothing else;
/// `--duration` and `--start-delay` shorten the profile without editing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_run_json_to_stdout_is_json_only() {
    let relay = TestRelay::start().await;
    let profile = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/scenario1-audio.ini"
    );
    let started = std::time::Instant::now();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", profile, "-n", "2", "--json", "-"])
        .args(["--duration", "1.2", "--start-delay", "0.4"])
        .arg("--relay")
        .arg(format!("moqt://127.0.0.1:{}/bench", relay.addr.port()))
        .arg("--relay-pid")
        .arg(std::process::id().to_string());
    let out = output(cmd).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["subscribers"], 2, "{v}");
    // 0.8 s of DATA every 20 ms.
    let sent = v["publish"]["sent"][0][1].as_u64();
    assert_eq!(sent, Some(40), "{v}");
    assert!(
        stderr.contains("relay cpu"),
        "the table went to stderr: {stderr}"
    );
}

/// `run --relay-pid` of no process fails before the run, not after it.
#[test]
fn bench_run_checks_relay_pid_first() {
    let profile = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/scenario1-audio.ini"
    );
    let started = std::time::Instant::now();
    let out = Command::new(BIN)
        .args(["run", profile, "-n", "1", "--quiet"])
        .args([
            "--relay",
            "moqt://127.0.0.1:9/none",
            "--relay-pid",
            "4294967295",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--relay-pid 4294967295"), "{err}");
}

/// `fanout --json`: JSON alone on stdout, the summary on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_fanout_json_is_json_only() {
    let relay = TestRelay::start().await;
    let mut cmd = Command::new(BIN);
    cmd.args(["fanout", "--subscribers", "2"])
        .args(["--duration", "0.5", "--json"])
        .arg("--relay")
        .arg(format!("moqt://127.0.0.1:{}/bench", relay.addr.port()));
    let out = output(cmd).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v = json_only(&out.stdout);
    assert_eq!(v["subscribers"], 2, "{v}");
    assert!(stderr.contains("latency one-way"), "{stderr}");
}

/// `mqtt --json`: JSON alone on stdout, the summary on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_mqtt_json_is_json_only() {
    let gw = TestGateway::start().await;
    let broker = gw.mqtt.to_string();
    let mut cmd = Command::new(BIN);
    cmd.args(["mqtt", "--broker", &broker, "--publishers", "1"])
        .args(["--subscribers", "1", "--topics", "1", "--rate", "20"])
        .args(["--duration", "0.3", "--drain", "0.3", "--json"]);
    let out = output(cmd).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v = json_only(&out.stdout);
    assert_eq!(v["publishers"], 1, "{v}");
    assert!(stderr.contains("latency publish->deliver"), "{stderr}");
}

/// `--version` answers (and starts nothing); it was `quichub bench
/// --version`, which printed the same line.
#[test]
fn version() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        format!("quichub-bench {}", env!("CARGO_PKG_VERSION"))
    );
}
