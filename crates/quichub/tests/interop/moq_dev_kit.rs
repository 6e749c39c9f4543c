//! What the tests against moq-dev's tools share: the tools' directory, a
//! directory with a certificate per test, quichub's relay with its metrics,
//! moq-relay on a free port, moq-clock and its output.
//!
//! `interop_moq_dev` keeps copies of some of these (it predates this module).

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quichub_net::tls::Identity;

pub(crate) const QUICHUB: &str = env!("CARGO_BIN_EXE_quichub");

/// A child process, killed when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The directory holding moq-dev's `tools`, or `None` (the test is
/// skipped) when `QUICHUB_MOQ_DEV_BIN` is unset; with it set (as
/// `scripts/test.sh` does) a missing tool fails the test.
pub(crate) fn moq_dev_tools(tools: &[&str]) -> Option<PathBuf> {
    match std::env::var("QUICHUB_MOQ_DEV_BIN") {
        Ok(dir) => {
            let dir = PathBuf::from(dir);
            for t in tools {
                assert!(
                    dir.join(t).exists(),
                    "{t} missing in {}: run scripts/install-moq-dev.sh --with-cli",
                    dir.display()
                );
            }
            Some(dir)
        }
        Err(_) => {
            eprintln!(
                "SKIPPED: set QUICHUB_MOQ_DEV_BIN (scripts/test.sh does) to run the tests with moq-dev's {}",
                tools.join(", ")
            );
            None
        }
    }
}

/// A directory of its own for each test, with a self-signed certificate for
/// 127.0.0.1 (`cert.pem`, `key.pem`), removed at the end unless the test
/// failed (its logs are then kept for a look).
pub(crate) struct Dir {
    path: PathBuf,
    /// The certificate's SHA-256 (hex), for `--connect-tls-fingerprint`.
    pub(crate) fingerprint: String,
}

impl Dir {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{prefix}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        let id = Identity::self_signed(&["localhost", "127.0.0.1"]).unwrap();
        id.write_pem(&path.join("cert.pem"), &path.join("key.pem"))
            .unwrap();
        Dir {
            path,
            fingerprint: id.fingerprint_hex(),
        }
    }

    pub(crate) fn path(&self, f: &str) -> PathBuf {
        self.path.join(f)
    }

    /// The directory itself.
    pub(crate) fn root(&self) -> &Path {
        &self.path
    }

    /// A new (truncated) log file in the directory.
    pub(crate) fn file(&self, f: &str) -> std::fs::File {
        std::fs::File::create(self.path(f)).unwrap()
    }

    pub(crate) fn log(&self, f: &str) -> String {
        std::fs::read_to_string(self.path(f)).unwrap_or_default()
    }

    /// The last lines of each log, for a failure's message.
    pub(crate) fn tails(&self, logs: &[&str]) -> String {
        logs.iter()
            .map(|f| {
                let text = self.log(f);
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(25)..];
                format!("--- {f}\n{}\n", tail.join("\n"))
            })
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a server `command(port)` on a loopback UDP port picked by binding
/// and releasing it: another process may take the port in between, and
/// then the server exits, so it is started again on another port. Returns
/// once the port is taken and the server still runs.
pub(crate) fn spawn_on_udp_port(command: impl Fn(u16) -> Command) -> (Proc, u16) {
    for _ in 0..5 {
        let port = free_udp_port();
        let mut p = Proc(command(port).spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if p.0.try_wait().unwrap().is_some() {
                break;
            }
            if UdpSocket::bind(("127.0.0.1", port)).is_err() {
                // Bound: by this server, unless it is about to exit.
                std::thread::sleep(Duration::from_millis(200));
                if p.0.try_wait().unwrap().is_none() {
                    return (p, port);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("no server came up on a free UDP port in 5 tries");
}

/// quichub's relay on a loopback port, with the directory's certificate, its
/// log in `relay.log` and its metrics served.
pub(crate) struct Relay {
    _proc: Proc,
    pub(crate) port: u16,
    metrics_at: String,
}

impl Relay {
    pub(crate) fn start(dir: &Dir) -> Self {
        Self::start_with(dir, &[])
    }

    /// [`Self::start`] with more `quichub relay` arguments.
    pub(crate) fn start_with(dir: &Dir, extra: &[&str]) -> Self {
        let mut child = Command::new(QUICHUB)
            .args(["relay", "--bind", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .args(extra)
            .args(["--mqtt", "off", "--http", "off", "--cert"])
            .arg(dir.path("cert.pem"))
            .arg("--key")
            .arg(dir.path("key.pem"))
            .stdout(Stdio::piped())
            .stderr(dir.file("relay.log"))
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut port, mut metrics) = (None, None);
        while port.is_none() || metrics.is_none() {
            let line = lines.next().expect("relay output ended").unwrap();
            if line.starts_with("quichub relay listening") {
                port = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("127.0.0.1:"))
                    .and_then(|p| p.parse().ok());
            } else if let Some(url) = line.strip_prefix("metrics http://") {
                metrics = url.strip_suffix("/metrics").map(str::to_string);
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Relay {
            _proc: Proc(child),
            port: port.unwrap(),
            metrics_at: metrics.unwrap(),
        }
    }

    /// The relay's URL: raw QUIC for `moqt`, WebTransport for `https`.
    pub(crate) fn url(&self, scheme: &str) -> String {
        url(scheme, self.port)
    }

    /// The relay's `/metrics` text.
    pub(crate) fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&self.metrics_at).unwrap();
        c.write_all(b"GET /metrics HTTP/1.0\r\nHost: relay\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).unwrap();
        body
    }

    /// Whether the relay process still runs.
    pub(crate) fn alive(&mut self) -> bool {
        self._proc.0.try_wait().unwrap().is_none()
    }
}

/// The URL of a server on loopback `port`: raw QUIC for `moqt`,
/// WebTransport for `https`.
pub(crate) fn url(scheme: &str, port: u16) -> String {
    match scheme {
        "moqt" => format!("moqt://127.0.0.1:{port}"),
        _ => format!("https://127.0.0.1:{port}/"),
    }
}

/// The value of the metric line `name` (with its labels), 0 when absent.
pub(crate) fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// Waits until `done` holds, at most `budget`; returns whether it held.
pub(crate) fn wait_until(budget: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < budget {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    done()
}

/// Runs `cmd` to its end, at most `limit` (then it is killed): its output,
/// or `None` when it ran out of time.
pub(crate) fn output_within(cmd: &mut Command, limit: Duration) -> Option<std::process::Output> {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Read both pipes while it runs (a full pipe would stall it), and kill
    // it at the deadline from here: `wait_with_output` itself has none.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    let killer = std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < limit {
            if d.load(std::sync::atomic::Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Still running: end it (by its own pid, which we started).
        let _ = Command::new("kill").arg(pid.to_string()).status();
        true
    });
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let killed = killer.join().unwrap();
    (!killed).then_some(out)
}

/// moq-clock at `url`, `broadcast` in `mode` (`publish`, `subscribe`),
/// trusting `dir`'s certificate, its log appended to `dir`/`log`; `version`
/// restricts what it offers (`--client-version`), `None` lets it offer
/// everything it speaks.
pub(crate) fn clock(
    bin: &Path,
    dir: &Path,
    url: &str,
    broadcast: &str,
    version: Option<&str>,
    mode: &str,
    log: &str,
) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(log))
        .unwrap();
    let mut c = Command::new(bin.join("moq-clock"));
    c.args(["--url", url, "--broadcast", broadcast])
        .arg("--tls-root")
        .arg(dir.join("cert.pem"))
        .args(["--log-level", "debug"])
        // No WebSocket fallback raced against WebTransport: quichub serves
        // no TCP on its UDP port.
        .env("MOQ_CLIENT_WEBSOCKET_ENABLED", "false")
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(v) = version {
        c.args(["--client-version", v]);
    }
    c.arg(mode);
    c
}

/// A moq-clock subscriber whose output is collected as it comes (read to
/// the end: a subscriber whose stdout closed would die of it), started again
/// when it exits: moq-clock races its own broadcast discovery and exits
/// with "not found" now and then (docs/interop-moq-dev.md).
pub(crate) struct ClockSubscriber {
    make: Box<dyn Fn() -> Command>,
    proc: Proc,
    out: Arc<Mutex<String>>,
    /// How often it exited (and was started again).
    pub(crate) exits: usize,
}

impl ClockSubscriber {
    pub(crate) fn start(make: impl Fn() -> Command + 'static) -> Self {
        let out = Arc::new(Mutex::new(String::new()));
        let proc = Self::spawn(&make, &out);
        Self {
            make: Box::new(make),
            proc,
            out,
            exits: 0,
        }
    }

    fn spawn(make: &dyn Fn() -> Command, out: &Arc<Mutex<String>>) -> Proc {
        let mut child = make().stdout(Stdio::piped()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let o = out.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut s = o.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        Proc(child)
    }

    /// What it printed so far.
    pub(crate) fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until `done` holds, at most `budget`, starting it again each
    /// time it exits; returns whether `done` held.
    pub(crate) fn until(&mut self, budget: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let started = Instant::now();
        while started.elapsed() < budget && !done(self) {
            if self.proc.0.try_wait().unwrap().is_some() {
                self.exits += 1;
                std::thread::sleep(Duration::from_millis(300));
                self.proc = Self::spawn(&*self.make, &self.out);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        done(self)
    }

    /// Waits until it printed `n` ticks, at most `budget`; returns its output.
    pub(crate) fn ticks(&mut self, n: usize, budget: Duration) -> String {
        self.until(budget, |s| ticks(&s.output()) >= n);
        self.output()
    }
}

/// Lines that are a date and time, `2026-11-22 13:35:51`: one per clock
/// object (moq-clock prints the group's `YYYY-MM-DD HH:MM:` and each
/// object's seconds).
pub(crate) fn ticks(out: &str) -> usize {
    out.lines().filter(|l| is_date_time(l)).count()
}

/// Whether `l` is `YYYY-MM-DD HH:MM:SS` with each field in its range.
fn is_date_time(l: &str) -> bool {
    let b = l.as_bytes();
    if b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b' '
        || b[13] != b':'
        || b[16] != b':'
    {
        return false;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = &l[r];
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(s)) = (
        num(0..4),
        num(5..7),
        num(8..10),
        num(11..13),
        num(14..16),
        num(17..19),
    ) else {
        return false;
    };
    y >= 2024 && (1..=12).contains(&mo) && (1..=31).contains(&d) && h < 24 && mi < 60 && s <= 60
}

#[test]
fn clock_lines_parse_as_dates() {
    assert_eq!(ticks("2026-11-22 13:35:51\n2026-11-22 13:35:52\n"), 2);
    for bad in [
        "2026-11-22 13:35:",
        "2026-13-22 13:35:51",
        "2026-11-22 25:35:51",
        "2026-11-22T13:35:51",
        "20x6-11-22 13:35:51",
        "2026-11-22 13:35:5+",
    ] {
        assert_eq!(ticks(bad), 0, "{bad}");
    }
}
