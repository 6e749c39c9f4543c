//! `quichub pub --profile stdin` across a slow emulated uplink: everything
//! read from stdin reaches a subscriber, although the input ends long before
//! the link has carried it (the publisher used to close its session 200 ms
//! after its input ended, dropping what was still queued). The relay and
//! the subscriber run in the emulator's server namespace, the publisher in
//! its client namespace. Skips (and passes) where the link emulator cannot
//! run (no root, no TUN, no network namespaces).

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use quichub_netem::emulator::{Emulator, EmulatorConfig};
use quichub_netem::{LinkConfig, Profile, QueueLimit};

const BIN: &str = env!("CARGO_BIN_EXE_quichub");

#[test]
fn stdin_publisher_on_a_slow_uplink_delivers_everything() {
    if let Some(why) = quichub_netem::privileges::missing() {
        println!("SKIPPED: {why}");
        return;
    }
    // 200 kbit/s up with a queue long enough to hold the whole input:
    // 40 lines of 1000 bytes take about 1.7 s to cross.
    let profile = Profile {
        name: "slow-uplink".into(),
        up: LinkConfig {
            delay: Duration::from_millis(10),
            rate_bps: Some(200_000),
            queue: QueueLimit::Time(Duration::from_secs(5)),
            ..Default::default()
        },
        down: LinkConfig {
            delay: Duration::from_millis(10),
            ..Default::default()
        },
        source: "test: a slow uplink".into(),
    };
    let emu = Emulator::start(EmulatorConfig::new(profile)).expect("emulator");
    let server = emu.server().addr();
    let data = std::env::temp_dir().join(format!("qh-slow-uplink-{}", std::process::id()));
    let mut relay = emu
        .server()
        .command(BIN)
        .args(["relay", "--bind", &format!("{server}:4443")])
        .args(["--allow-anonymous", "--data-dir"])
        .arg(&data)
        .args(["--mqtt", "off", "--http", "off", "--metrics", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("relay starts");
    let mut lines = BufReader::new(relay.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match lines.next() {
            Some(Ok(l)) if l.contains("listening") => break,
            Some(Ok(_)) => {}
            _ => panic!("relay did not start"),
        }
    }
    let url = format!("moqt://{server}:4443/slow");
    let sub = emu
        .server()
        .command(BIN)
        .args(["sub", &url, "--namespace", "slow", "--track", "t"])
        .args([
            "--rendezvous-ms",
            "10000",
            "--framing",
            "line",
            "--count",
            "40",
        ])
        .args(["--duration", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut publisher = emu
        .client()
        .command(BIN)
        .args(["pub", &url, "--namespace", "slow", "--track", "t"])
        .args(["--profile", "stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        let mut stdin = publisher.stdin.take().unwrap();
        for i in 0..40 {
            writeln!(stdin, "{i:04}{}", "x".repeat(995)).unwrap();
        }
    }
    let status = publisher.wait().unwrap();
    let out = sub.wait_with_output().unwrap();
    let _ = relay.kill();
    let _ = relay.wait();
    let _ = std::fs::remove_dir_all(&data);
    assert!(status.success(), "publisher exit {status:?}");
    let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l[..4].to_string())
        .collect();
    let want: Vec<String> = (0..40).map(|i| format!("{i:04}")).collect();
    assert_eq!(got, want, "every line, in order");
}
