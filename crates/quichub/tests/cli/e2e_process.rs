//! Tests that run the real `quichub` binary: the interop client against the
//! relay over both ways in, and GOAWAY on SIGTERM.

use quichub_testkit as common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::within;
use quichub_client::{ClientSession, ConnectOptions};

const BIN: &str = env!("CARGO_BIN_EXE_quichub");

struct RelayProcess {
    child: Child,
    port: u16,
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_relay() -> RelayProcess {
    start_relay_with(&[])
}

fn start_relay_with(extra: &[&str]) -> RelayProcess {
    let mut child = Command::new(BIN)
        .args([
            "relay",
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--mqtt",
            "off",
            "--http",
            "off",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn relay");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("relay printed nothing").unwrap();
    let addr = first
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    let port = addr.rsplit(':').next().unwrap().parse().unwrap();
    // Keep draining stdout so the relay never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    RelayProcess { child, port }
}

fn interop(url: &str) -> (bool, String) {
    interop_draft(url, "18")
}

fn interop_draft(url: &str, draft: &str) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["interop-client", "--relay", url, "--tls-disable-verify"])
        .args(["--draft", draft])
        .output()
        .expect("run interop-client");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn interop_client_passes_every_case_over_quic_and_webtransport() {
    let relay = start_relay();
    for scheme in ["moqt", "https"] {
        let url = format!("{scheme}://127.0.0.1:{}/interop", relay.port);
        let (ok, tap) = interop(&url);
        assert!(ok, "interop-client failed over {scheme}:\n{tap}");
        assert!(tap.starts_with("TAP version 14"), "{tap}");
        assert!(tap.contains("1..15"), "{tap}");
        assert_eq!(
            tap.lines().filter(|l| l.starts_with("ok ")).count(),
            15,
            "{tap}"
        );
        assert!(!tap.contains("not ok"), "{tap}");
    }
}

/// The same 15 cases at drafts 14 and 16: the client's bridge speaks the
/// old draft to the relay's, over raw QUIC (`moq-00`, `moqt-16`) and
/// WebTransport (the same as subprotocols). Every request, reply, cancel,
/// data stream, datagram and fetch stream crosses both translations.
#[test]
fn interop_client_passes_every_case_at_drafts_14_and_16() {
    let relay = start_relay();
    for draft in ["14", "16"] {
        for scheme in ["moqt", "https"] {
            let url = format!("{scheme}://127.0.0.1:{}/interop", relay.port);
            let (ok, tap) = interop_draft(&url, draft);
            assert!(
                ok,
                "interop-client failed at draft {draft} over {scheme}:\n{tap}"
            );
            assert_eq!(
                tap.lines().filter(|l| l.starts_with("ok ")).count(),
                15,
                "{tap}"
            );
        }
    }
}

/// The same 15 cases over MoQT over WebSocket (QMux) on the relay's HTTP
/// port, the URL the relay prints.
#[test]
fn interop_client_passes_every_case_over_websocket() {
    let mut child = Command::new(BIN)
        .args(["relay", "--bind", "127.0.0.1:0", "--metrics", "off"])
        .args([
            "--mqtt",
            "off",
            "--http",
            "127.0.0.1:0",
            "--data-dir",
            "off",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn relay");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("relay output ended").unwrap();
        if let Some(rest) = line.strip_prefix("moqt over websocket ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let relay = RelayProcess { child, port: 0 };
    let (ok, tap) = interop(&format!("{url}interop"));
    drop(relay);
    assert!(ok, "interop-client failed over WebSocket ({url}):\n{tap}");
    assert_eq!(
        tap.lines().filter(|l| l.starts_with("ok ")).count(),
        15,
        "{tap}"
    );
}

#[test]
fn interop_client_lists_and_rejects_unknown_tests() {
    let out = Command::new(BIN)
        .args(["interop-client", "--list"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert_eq!(list.lines().count(), 15);
    assert!(list.contains("subscribe-before-announce"));
    let out = Command::new(BIN)
        .args([
            "interop-client",
            "--tls-disable-verify",
            "-t",
            "no-such-test",
            "-r",
            "moqt://127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_sends_goaway_before_exit() {
    let mut relay = start_relay();
    let url = format!("moqt://127.0.0.1:{}/x", relay.port);
    let session = ClientSession::connect(&url, ConnectOptions::default())
        .await
        .unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &relay.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let goaway = within(5, session.goaway()).await.expect("GOAWAY");
    assert!(goaway.new_session_uri.is_empty());
    assert!(
        goaway.request_id.is_some(),
        "GOAWAY on the control stream carries a Request ID"
    );
    // The relay then exits by itself (the client leaves; the drain ends).
    session.close(0, "bye");
    let exit = within(10, async {
        loop {
            if let Some(s) = relay.child.try_wait().unwrap() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(exit.success(), "relay exit status {exit:?}");
}

/// `quichub sub` on `url`, track `cli/NAME`, with `extra` flags; stdout piped.
fn spawn_sub(url: &str, track: &str, extra: &[&str]) -> Child {
    Command::new(BIN)
        .args(["sub", url, "--namespace", "cli", "--track", track])
        .args(["--rendezvous-ms", "10000"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `quichub pub --profile stdin` on `url`, track `cli/NAME`, with `extra` flags.
fn pub_stdin(url: &str, track: &str, mode: &str, extra: &[&str], stdin: Stdio) -> Child {
    Command::new(BIN)
        .args(["pub", url, "--namespace", "cli", "--track", track])
        .args(["--profile", "stdin", "--mode", mode])
        .args(extra)
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` at most `secs` seconds.
fn wait_within(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("process still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `quichub pub --profile stdin` to `quichub sub --framing line`: lines in
/// (any bytes, not only UTF-8), the same lines out.
#[test]
fn cli_pub_stdin_to_sub_stdout() {
    use std::io::Write;
    let relay = start_relay();
    let url = format!("moqt://127.0.0.1:{}/cli", relay.port);
    let sub = spawn_sub(&url, "lines", &["--count", "3", "--framing", "line"]);
    std::thread::sleep(Duration::from_millis(300));
    let mut publisher = pub_stdin(&url, "lines", "announce", &[], Stdio::piped());
    publisher
        .stdin
        .take()
        .unwrap()
        .write_all(b"alpha\n\xff\xfebeta\ngamma\n")
        .unwrap();
    let out = sub.wait_with_output().unwrap();
    let status = wait_within(&mut publisher, 10);
    assert!(out.status.success());
    assert_eq!(out.stdout, b"alpha\n\xff\xfebeta\ngamma\n");
    assert!(status.success(), "pub exit {status:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut publisher.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("published 3 objects"), "{err}");
}

/// A binary file through `pub --framing raw-chunks` and `sub` (raw output by
/// default) arrives byte for byte.
#[test]
fn cli_binary_stdin_round_trips_byte_exact() {
    let relay = start_relay();
    let url = format!("moqt://127.0.0.1:{}/cli", relay.port);
    let dir = std::env::temp_dir().join(format!("quichub-binary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("in.bin");
    // 300 kB, every byte value, newlines and invalid UTF-8 included.
    let mut x = 0x2545_f491_u32;
    let data: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(&file, &data).unwrap();
    // From a file every read fills a chunk: ceil(300000 / 16384) = 19 objects.
    let sub = spawn_sub(&url, "bin", &["--count", "19"]);
    std::thread::sleep(Duration::from_millis(300));
    let stdin = Stdio::from(std::fs::File::open(&file).unwrap());
    let mut publisher = pub_stdin(&url, "bin", "announce", &["--framing", "raw-chunks"], stdin);
    let out = sub.wait_with_output().unwrap();
    let status = wait_within(&mut publisher, 10);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout == data, "payloads differ from the input");
    assert!(status.success(), "pub exit {status:?}");
}

/// A read error or truncated input on stdin is an error exit, not success.
#[test]
fn cli_pub_stdin_errors_exit_nonzero() {
    use std::io::Write;
    let relay = start_relay();
    let url = format!("moqt://127.0.0.1:{}/cli", relay.port);
    // A directory as stdin: read(2) fails with EISDIR.
    let dir = Stdio::from(std::fs::File::open(std::env::temp_dir()).unwrap());
    let mut p = pub_stdin(&url, "dir", "push", &["--framing", "raw-chunks"], dir);
    let status = wait_within(&mut p, 10);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("read stdin"), "{err}");
    // A length prefix announcing more bytes than follow.
    let mut p = pub_stdin(
        &url,
        "len",
        "push",
        &["--framing", "length"],
        Stdio::piped(),
    );
    let mut stdin = p.stdin.take().unwrap();
    stdin
        .write_all(&[0, 0, 0, 2, b'o', b'k', 0, 0, 0, 9, 1])
        .unwrap();
    drop(stdin);
    let status = wait_within(&mut p, 10);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("1 of the 9 bytes"), "{err}");
}

/// `--config`: every documented key is accepted, an unknown key is refused
/// with its name.
#[test]
fn relay_config_file() {
    let dir = std::env::temp_dir().join(format!("quichub-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "[relay]\nmax_sessions = 10\nmax_requests_per_session = 5\nmax_tracks = 7\nmax_object_size = 1000\n\
         cache_bytes_per_track = 100000\ncache_bytes_total = 1000000\ncache_max_age_ms = 1000\n\
         fanout_buffer = 64\nmax_lag_objects = 100\nwrite_stall_ms = 500\nmax_rendezvous_ms = 100\n\
         goaway_timeout_ms = 100\nupstream_timeout_ms = 1000\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args([
            "relay",
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--mqtt",
            "off",
            "--http",
            "off",
            "--config",
        ])
        .arg(&good)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("listening on udp"), "{first}");
    let _ = child.kill();
    let _ = child.wait();

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[relay]\nmax_sesions = 10\n").unwrap();
    let out = Command::new(BIN)
        .args([
            "relay",
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--mqtt",
            "off",
            "--http",
            "off",
            "--config",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_sesions"), "{err}");
    assert!(err.contains("bad.toml:2:1:"), "file:line:column: {err}");
    // `quichub config check` says the same, and exits 1.
    let out = Command::new(BIN)
        .args(["config", "check"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:2:1: unknown field `max_sesions`"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["config", "check"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // `quichub config print`: the file with the flags given over it.
    let out = Command::new(BIN)
        .args(["config", "print", "--mqtt", "off", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        printed.contains("[relay]\nmax_sessions = 10\n"),
        "{printed}"
    );
    assert!(printed.contains("tcp = \"off\""), "{printed}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// ACK_FREQUENCY frames a raw QUIC client receives from `relay` once the
/// handshake is done (the server sends its request with its first 1-RTT data).
fn ack_frequency_frames_from(relay: &RelayProcess) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = quichub_net::client::Client::new(
            "127.0.0.1:0".parse().unwrap(),
            quichub_net::tls::Verify::Insecure,
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", relay.port).parse().unwrap();
        let dialed = client
            .dial(addr, "localhost", moqt::ALPN.as_bytes(), false)
            .await
            .unwrap();
        let conn = dialed.connection();
        // HANDSHAKE_DONE and the request travel together; wait for the first,
        // then a little longer for the second, should they be split.
        within(5, async {
            while conn.stats().frame_rx.handshake_done == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        while conn.stats().frame_rx.ack_frequency == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        conn.stats().frame_rx.ack_frequency
    })
}

#[test]
fn relay_asks_peers_for_fewer_acks_unless_told_not_to() {
    let relay = start_relay();
    assert!(
        ack_frequency_frames_from(&relay) >= 1,
        "default --ack-frequency sends ACK_FREQUENCY"
    );
    let relay = start_relay_with(&["--ack-frequency", "off"]);
    assert_eq!(ack_frequency_frames_from(&relay), 0);
    let status = Command::new(BIN)
        .args(["relay", "--ack-frequency", "9,0", "--bind", "127.0.0.1:0"])
        .output()
        .expect("run relay");
    assert!(!status.status.success(), "a zero delay is refused");
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(err.contains("--ack-frequency"), "{err}");
}

/// A relay whose stderr (its log) comes back line by line.
fn start_relay_logged(
    extra: &[&str],
    env: &[(&str, &str)],
) -> (RelayProcess, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args(["relay", "--bind", "127.0.0.1:0", "--metrics", "off"])
        .args(["--mqtt", "off", "--http", "off"])
        .args(extra)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relay");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("relay printed nothing").unwrap();
    let port = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .parse()
        .unwrap();
    std::thread::spawn(move || for _ in lines {});
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (RelayProcess { child, port }, rx)
}

/// Connects to the relay and leaves with reason `bye`.
fn visit(relay: &RelayProcess) {
    let url = format!("moqt://127.0.0.1:{}/log", relay.port);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = ClientSession::connect(&url, ConnectOptions::default())
            .await
            .unwrap();
        s.close(0, "bye");
        tokio::time::sleep(Duration::from_millis(50)).await;
    })
}

/// The first log line containing `needle`, within 5 s.
fn log_line(rx: &std::sync::mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return l,
            Ok(_) => {}
            Err(_) => panic!("no log line with {needle:?}"),
        }
    }
}

/// By default the relay logs connections at info (peer, ALPN, reason), with
/// no colour codes when stderr is not a terminal.
#[test]
fn relay_logs_connections_by_default_without_colour() {
    let (relay, rx) = start_relay_logged(&[], &[]);
    visit(&relay);
    let peer = "remote=127.0.0.1:";
    let accepted = log_line(&rx, "connection accepted");
    assert!(accepted.contains("INFO"), "{accepted}");
    assert!(accepted.contains(peer), "{accepted}");
    assert!(accepted.contains("moqt-18"), "{accepted}");
    let closed = log_line(&rx, "connection closed");
    assert!(closed.contains(peer), "{closed}");
    assert!(closed.contains("bye"), "the peer's reason: {closed}");
    for l in [&accepted, &closed] {
        assert!(!l.contains('\u{1b}'), "ANSI escape in {l:?}");
    }
}

/// `--log-format json`: one JSON object per line; `RUST_LOG` still applies.
#[test]
fn relay_logs_json_lines() {
    let (relay, rx) = start_relay_logged(
        &["--log-format", "json"],
        &[("RUST_LOG", "quichub_relay=info")],
    );
    visit(&relay);
    let line = log_line(&rx, "connection accepted");
    let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
    assert_eq!(v["level"], "INFO", "{line}");
    assert_eq!(v["fields"]["message"], "connection accepted", "{line}");
    assert_eq!(v["fields"]["alpn"], "moqt-18", "{line}");
    assert!(v["fields"]["remote"].as_str().is_some(), "{line}");
}

/// `quichub ... | head`: a reader that went away ends the command quietly
/// (SIGPIPE, as `cat` does), never with a panic.
#[test]
fn closed_stdout_is_not_a_panic() {
    quiet_into_closed_pipe(&["interop-client", "--list"]);
}

/// Runs `quichub ARGS` with its stdout closed before it writes, and asserts
/// it ends quietly: no panic, success or death by SIGPIPE (as `cat` does).
fn quiet_into_closed_pipe(args: &[&str]) {
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the child has started writing.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{args:?} {:?}: {err}",
        out.status
    );
}

/// `sub | head`: the subscriber stops quietly once its reader leaves.
#[test]
fn sub_into_closed_pipe_exits_quietly() {
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    let relay = start_relay();
    let url = format!("moqt://127.0.0.1:{}/cli", relay.port);
    let mut sub = Command::new(BIN)
        .args(["sub", &url, "--namespace", "cli", "--track", "head"])
        .args(["--rendezvous-ms", "10000", "--framing", "line"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut stdout = BufReader::new(sub.stdout.take().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let mut publisher = pub_stdin(&url, "head", "announce", &[], Stdio::piped());
    let mut stdin = publisher.stdin.take().unwrap();
    stdin.write_all(b"one\n").unwrap();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "one\n");
    drop(stdout); // `head -1` leaves
    stdin.write_all(b"two\nthree\nfour\n").unwrap();
    let status = wait_within(&mut sub, 10);
    drop(stdin);
    let _ = wait_within(&mut publisher, 10);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut sub.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "{status:?}: {err}"
    );
}

/// `relay --bind localhost:0` and a client dialling `moqt://localhost:PORT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_names_for_bind_and_url() {
    let mut child = Command::new(BIN)
        .args(["relay", "--bind", "localhost:0", "--metrics", "off"])
        .args(["--mqtt", "off", "--http", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("relay printed nothing").unwrap();
    let port: u16 = first
        .split_whitespace()
        .find_map(|w| w.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .port();
    std::thread::spawn(move || for _ in lines {});
    let _relay = RelayProcess { child, port };
    let url = format!("moqt://localhost:{port}/names");
    let session = within(5, ClientSession::connect(&url, ConnectOptions::default()))
        .await
        .expect("connect by name");
    session.close(0, "bye");
}

/// The demo's embedded relay does not log each connection by default (its
/// lines would bury the demo's), and `demo | head` ends quietly.
#[test]
fn demo_is_not_buried_in_relay_logs() {
    let out = Command::new(BIN)
        .args(["demo", "--duration", "1"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("connection accepted"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("quichub demo"));
    quiet_into_closed_pipe(&["demo", "--duration", "1"]);
}

/// `demo --websocket`: the same demo with every client over MoQT over
/// WebSocket (the embedded relay's HTTP port); nothing lost.
#[test]
fn demo_over_websocket() {
    let out = Command::new(BIN)
        .args(["demo", "--duration", "1", "--websocket"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("(ws)"), "{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("audio ") || l.starts_with("video ") || l.starts_with("imu "))
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    for r in rows {
        let loss = r.split_whitespace().nth(4).unwrap();
        assert_eq!(loss, "0.00", "{stdout}");
    }
}

/// `--version` answers on subcommands too (and starts nothing).
#[test]
fn version_on_subcommands() {
    // `quichub-bench --version`: crates/bench/tests.
    for sub in ["relay", "pub", "sub"] {
        let out = Command::new(BIN).args([sub, "--version"]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{sub}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.trim(),
            format!("quichub-{sub} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

/// `quichub completions SHELL` prints a completion script.
#[test]
fn completions_script() {
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("_quichub()"), "{stdout}");
    assert!(stdout.contains("relay"), "{stdout}");
    assert!(stdout.contains("complete -F _quichub"), "{stdout}");
    let out = Command::new(BIN)
        .args(["completions", "nosuchshell"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
