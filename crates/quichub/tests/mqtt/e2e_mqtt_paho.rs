//! The MQTT broker end to end with a third-party client: each test starts a
//! gateway and runs one check of `tests/mqtt/paho_checks.py` (Eclipse Paho,
//! paho-mqtt 2.x) against it: QoS, retained messages, wills, persistent
//! sessions, shared subscriptions, wildcards, MQTT 5 properties, topic
//! aliases, No Local, Receive Maximum and 3.1.1 client identifiers.
//!
//! Skipped (with a message) when the tools of `scripts/install-mqtt-tools.sh`
//! are missing and `QUICHUB_MQTT_PYTHON` is unset.

use quichub_testkit as common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{mqtt_tools, TestGateway};

/// Longest a check may run.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mqtt/paho_checks.py")
}

/// Runs `paho_checks.py HOST PORT check` against a fresh gateway and fails
/// the test, with the script's output, unless it exits 0.
async fn run_check(check: &str) {
    let Some(python) = mqtt_tools() else {
        eprintln!("SKIPPED paho check {check}: paho-mqtt not installed");
        return;
    };
    let gw = TestGateway::start().await;
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg("-u")
        .arg(script())
        .arg(gw.mqtt.ip().to_string())
        .arg(gw.mqtt.port().to_string())
        .arg(check)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("start python");
    let out = match tokio::time::timeout(CHECK_TIMEOUT, child.wait_with_output()).await {
        Ok(out) => out.expect("python output"),
        Err(_) => panic!("paho check {check} ran past {CHECK_TIMEOUT:?}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "paho check {check} failed ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status
    );
    println!("{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_qos_matrix() {
    run_check("qos_matrix").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_retained() {
    run_check("retained").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_will() {
    run_check("will").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_persistent_session() {
    run_check("persistent_session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_shared() {
    run_check("shared").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_wildcards() {
    run_check("wildcards").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_properties() {
    run_check("properties").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_topic_alias() {
    run_check("topic_alias").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_no_local() {
    run_check("no_local").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_receive_maximum() {
    run_check("receive_maximum").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v311_basics() {
    run_check("v311_basics").await;
}
