//! quichub's relay against aiomoqt (PyPI), an independent implementation of
//! draft 14 in Python, through the relay's translating bridge
//! (`quichub_net::legacy`):
//!
//! - aiomoqt's interop client (the moq-interop-runner's six control-plane
//!   cases) over raw QUIC (ALPN `moq-00`) and WebTransport (subprotocol
//!   `moq-00`);
//! - aiomoqt's example publisher (draft 14, WebTransport) on subgroup streams
//!   and on datagrams, read by quichub's draft-18 subscriber.
//!
//! `scripts/install-aiomoqt.sh` installs aiomoqt; `scripts/test.sh` sets
//! `QUICHUB_AIOMOQT_PYTHON`, so a missing install fails the test there
//! instead of skipping it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quichub_net::tls::Identity;

const QUICHUB: &str = env!("CARGO_BIN_EXE_quichub");

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python() -> Option<PathBuf> {
    match std::env::var("QUICHUB_AIOMOQT_PYTHON") {
        Ok(p) => {
            let p = PathBuf::from(p);
            let ok = Command::new(&p)
                .args(["-c", "import aiomoqt"])
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "aiomoqt missing in {}: run scripts/install-aiomoqt.sh",
                p.display()
            );
            Some(p)
        }
        Err(_) => {
            eprintln!("SKIPPED: set QUICHUB_AIOMOQT_PYTHON (scripts/test.sh does) to run the aiomoqt interop test");
            None
        }
    }
}

/// A relay on a free port, with a fresh self-signed certificate.
fn start_quichub(dir: &Path) -> (Proc, u16) {
    start_quichub_logging(dir, Stdio::null())
}

/// [`start_quichub`], its log (stderr) to `log`.
fn start_quichub_logging(dir: &Path, log: Stdio) -> (Proc, u16) {
    std::fs::create_dir_all(dir).unwrap();
    let id = Identity::self_signed(&["localhost", "127.0.0.1"]).unwrap();
    id.write_pem(&dir.join("cert.pem"), &dir.join("key.pem"))
        .unwrap();
    let mut child = Command::new(QUICHUB)
        .args(["relay", "--bind", "127.0.0.1:0", "--metrics", "off"])
        .args(["--mqtt", "off", "--http", "off", "--cert"])
        .arg(dir.join("cert.pem"))
        .arg("--key")
        .arg(dir.join("key.pem"))
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), port)
}

fn aiomoqt_dir(py: &Path) -> PathBuf {
    let out = Command::new(py)
        .args([
            "-c",
            "import aiomoqt, os; print(os.path.dirname(aiomoqt.__file__))",
        ])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn aiomoqt_interop_client_passes_against_quichub_at_draft_14() {
    let Some(py) = python() else { return };
    let dir = std::env::temp_dir().join(format!("quichub-aiomoqt-{}", std::process::id()));
    let (_relay, port) = start_quichub(&dir);
    let client = aiomoqt_dir(&py).join("examples/moq_interop_client.py");
    for url in [
        format!("moqt://127.0.0.1:{port}"),
        format!("https://127.0.0.1:{port}/moq"),
    ] {
        let out = Command::new(&py)
            .arg(&client)
            .args(["-r", &url, "--tls-disable-verify"])
            .output()
            .unwrap();
        let tap = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        let ok = tap.lines().filter(|l| l.starts_with("ok ")).count();
        assert_eq!(ok, 6, "aiomoqt interop client over {url}:\n{tap}\n{err}");
        assert!(!tap.contains("not ok"), "{tap}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A script of this directory.
fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}

/// One aiomoqt publisher and one quichub subscriber: how many objects the
/// subscriber read within the time given.
fn publish_and_read(py: &Path, port: u16, datagrams: bool, track: &str) -> String {
    publish_and_read_with(py, &[], port, datagrams, track)
}

/// [`publish_and_read`], the publisher run through `wrapper` (a script of
/// this directory that runs the next one, or none).
fn publish_and_read_with(
    py: &Path,
    wrapper: &[&str],
    port: u16,
    datagrams: bool,
    track: &str,
) -> String {
    let mut publisher = Command::new(py);
    publisher
        .args(wrapper.iter().map(|w| script(w)))
        .arg(script("aiomoqt_pub.py"))
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--namespace", "live/aiomoqt", "--trackname", track])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if datagrams {
        publisher.arg("--datagram");
    }
    let _publisher = Proc(publisher.spawn().unwrap());
    // The publisher's PUBLISH_NAMESPACE may not be there yet: the subscriber
    // waits (RENDEZVOUS_TIMEOUT), and is retried within the budget.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(QUICHUB)
            .args(["sub", &format!("moqt://127.0.0.1:{port}/")])
            .args(["--namespace", "live/aiomoqt", "--track", track])
            .args(["--count", "30", "--duration", "10", "--stats"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if text.contains("received 30 objects") || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn aiomoqt_publisher_reaches_a_draft_18_subscriber() {
    let Some(py) = python() else { return };
    let dir = std::env::temp_dir().join(format!("quichub-aiomoqt-pub-{}", std::process::id()));
    let (_relay, port) = start_quichub(&dir);
    let streams = publish_and_read(&py, port, false, "streams");
    assert!(
        streams.contains("received 30 objects"),
        "subgroup streams: {streams}"
    );
    let datagrams = publish_and_read(&py, port, true, "datagrams");
    assert!(
        datagrams.contains("received 30 objects"),
        "datagrams: {datagrams}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A draft-14 client over WebTransport that offers no subprotocol (draft 14
/// negotiated its version in CLIENT_SETUP alone): aiomoqt with its
/// `wt-available-protocols` header stripped (`aiomoqt_no_subprotocol.py`).
/// The relay does not speak first, learns draft 14 from the CLIENT_SETUP and
/// bridges the session: the interop client's six cases pass, and the
/// example publisher's objects reach a draft-18 subscriber.
#[test]
fn aiomoqt_without_a_subprotocol_is_served_as_draft_14() {
    let Some(py) = python() else { return };
    let dir = std::env::temp_dir().join(format!("quichub-aiomoqt-bare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = std::fs::File::create(dir.join("relay.log")).unwrap();
    let (_relay, port) = start_quichub_logging(&dir, log.into());
    let client = aiomoqt_dir(&py).join("examples/moq_interop_client.py");
    let out = Command::new(&py)
        .arg(script("aiomoqt_no_subprotocol.py"))
        .arg(&client)
        .args([
            "-r",
            &format!("https://127.0.0.1:{port}/moq"),
            "--tls-disable-verify",
        ])
        .output()
        .unwrap();
    let tap = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    let ok = tap.lines().filter(|l| l.starts_with("ok ")).count();
    let log = || std::fs::read_to_string(dir.join("relay.log")).unwrap_or_default();
    assert_eq!(
        ok,
        6,
        "aiomoqt without a subprotocol:\n{tap}\n{err}\n{}",
        log()
    );
    assert!(!tap.contains("not ok"), "{tap}");
    let streams = publish_and_read_with(&py, &["aiomoqt_no_subprotocol.py"], port, false, "bare");
    assert!(
        streams.contains("received 30 objects"),
        "subgroup streams from a publisher without a subprotocol: {streams}"
    );
    // It was the path without a subprotocol (the header really went).
    assert!(log().contains("no subprotocol"), "{}", log());
    let _ = std::fs::remove_dir_all(&dir);
}
