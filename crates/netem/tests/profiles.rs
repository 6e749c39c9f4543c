//! End-to-end check of every named profile through real namespaces and TUN
//! devices: a UDP echo probe measures RTT and loss, a TCP bulk transfer in
//! each direction measures the rate, and each must match the profile (rate
//! within 5 %, RTT within 5 % or 0.25 ms, loss within a binomial bound).
//!
//! Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN) and /dev/net/tun; without them
//! it prints `SKIPPED: <reason>` and passes. Every loop is bounded in time and
//! bytes; the whole test takes about two minutes on two cores.
//!
//! Set `QUICHUB_NETEM_TEST_PROFILES=5g,lte` to run a subset, and
//! `QUICHUB_NETEM_REQUIRE=1` to fail rather than skip without privileges.

#![cfg(target_os = "linux")]

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use quichub_netem::emulator::{Emulator, EmulatorConfig, CLIENT_ADDR, MTU, SERVER_ADDR};
use quichub_netem::profile::Direction;
use quichub_netem::{privileges, Profile};
use quichub_netem::{LinkConfig, QueueLimit};

/// Serialises the tests of this file: they measure time and share 2 cores.
static SERIAL: Mutex<()> = Mutex::new(());

const PROBE_PAYLOAD: usize = 64;
/// IPv4 + UDP headers.
const UDP_OVERHEAD: usize = 28;
/// IPv4 + TCP headers with the timestamp option (what Linux's MSS excludes).
const TCP_OVERHEAD: u32 = 52;

/// Prints `SKIPPED: <reason>` (straight to stderr, so it shows even when
/// the test harness captures output) when this process cannot create
/// namespaces and TUN devices. With `QUICHUB_NETEM_REQUIRE=1` a missing
/// privilege fails the test instead.
fn skipped() -> bool {
    let Some(reason) = privileges::missing() else {
        return false;
    };
    let msg = format!("SKIPPED: {}", privileges::explain(&reason));
    if std::env::var_os("QUICHUB_NETEM_REQUIRE").is_some_and(|v| v == "1") {
        panic!("QUICHUB_NETEM_REQUIRE=1 but {msg}");
    }
    let _ = writeln!(std::io::stderr(), "{msg}");
    true
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Default)]
struct Echo {
    sent: u32,
    received: u32,
    rtts_ms: Vec<f64>,
}

impl Echo {
    fn loss(&self) -> f64 {
        1.0 - self.received as f64 / self.sent.max(1) as f64
    }

    /// Median RTT: robust to scheduling hiccups (which only ever add time)
    /// and equal to the mean for the symmetric jitter the emulator draws.
    fn median(&self) -> f64 {
        let mut v = self.rtts_ms.clone();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }

    fn mean(&self) -> f64 {
        self.rtts_ms.iter().sum::<f64>() / self.rtts_ms.len().max(1) as f64
    }
}

/// Sends `n` probes `spacing` apart from the client to an echo server in the
/// server namespace and waits `linger` for the last replies.
fn udp_echo(emu: &Emulator, n: u32, spacing: Duration, linger: Duration) -> Echo {
    let deadline = Instant::now() + spacing * n + linger + Duration::from_secs(10);
    let (ready_tx, ready_rx) = mpsc::channel();
    let finished = Arc::new(AtomicBool::new(false));
    let server_finished = finished.clone();
    let server = emu
        .server()
        .spawn(move || {
            let sock = UdpSocket::bind((SERVER_ADDR, 0)).expect("bind echo server");
            sock.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            ready_tx.send(sock.local_addr().unwrap()).unwrap();
            let mut buf = [0u8; 2048];
            while Instant::now() < deadline && !server_finished.load(Ordering::Relaxed) {
                if let Ok((len, from)) = sock.recv_from(&mut buf) {
                    let _ = sock.send_to(&buf[..len], from);
                }
            }
        })
        .expect("spawn echo server");
    let addr: SocketAddr = ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("echo server ready");
    let client = emu
        .client()
        .spawn(move || {
            let sock = UdpSocket::bind((CLIENT_ADDR, 0)).expect("bind echo client");
            sock.connect(addr).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let rx = sock.try_clone().unwrap();
            let epoch = Instant::now();
            let done = Arc::new(AtomicBool::new(false));
            let done2 = done.clone();
            let receiver = std::thread::spawn(move || {
                let mut seen = HashSet::new();
                let mut rtts = Vec::new();
                let mut buf = [0u8; 2048];
                while !done2.load(Ordering::Relaxed) && Instant::now() < deadline {
                    if let Ok(len) = rx.recv(&mut buf) {
                        if len < 12 {
                            continue;
                        }
                        let now = epoch.elapsed().as_nanos() as u64;
                        let seq = u32::from_be_bytes(buf[0..4].try_into().unwrap());
                        let sent = u64::from_be_bytes(buf[4..12].try_into().unwrap());
                        if seen.insert(seq) {
                            rtts.push(now.saturating_sub(sent) as f64 / 1e6);
                        }
                    }
                }
                rtts
            });
            let mut payload = [0u8; PROBE_PAYLOAD];
            for i in 0..n {
                let due = spacing * i;
                let now = epoch.elapsed();
                if due > now {
                    std::thread::sleep(due - now);
                }
                payload[0..4].copy_from_slice(&i.to_be_bytes());
                let t = epoch.elapsed().as_nanos() as u64;
                payload[4..12].copy_from_slice(&t.to_be_bytes());
                let _ = sock.send(&payload);
            }
            std::thread::sleep(linger);
            done.store(true, Ordering::Relaxed);
            let rtts = receiver.join().unwrap();
            Echo {
                sent: n,
                received: rtts.len() as u32,
                rtts_ms: rtts,
            }
        })
        .expect("spawn echo client");
    let echo = client.join().unwrap().expect("enter client namespace");
    finished.store(true, Ordering::Relaxed);
    server.join().unwrap().expect("enter server namespace");
    echo
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Dir {
    Up,
    Down,
}

#[derive(Debug)]
struct Bulk {
    /// (seconds since the first byte, bytes received so far)
    timeline: Vec<(f64, u64)>,
    mss: u32,
}

impl Bulk {
    fn total(&self) -> u64 {
        self.timeline.last().map(|s| s.1).unwrap_or(0)
    }

    /// IP-level rate (bits/s) from `warmup` after the first byte until 95 %
    /// of the bytes had arrived: the part of the transfer where the
    /// bottleneck queue is busy.
    fn rate_bps(&self, warmup: f64) -> f64 {
        let total = self.total();
        let end_bytes = total * 95 / 100;
        let Some(start) = self.timeline.iter().find(|s| s.0 >= warmup) else {
            return f64::NAN;
        };
        let Some(end) = self.timeline.iter().find(|s| s.1 >= end_bytes) else {
            return f64::NAN;
        };
        if end.0 <= start.0 {
            return f64::NAN;
        }
        let payload = (end.1 - start.1) as f64;
        let wire = payload * f64::from(self.mss + TCP_OVERHEAD) / f64::from(self.mss);
        wire * 8.0 / (end.0 - start.0)
    }
}

fn tcp_mss(s: &TcpStream) -> u32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid pointers to an int and its length.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 && v > 0 {
        v as u32
    } else {
        MTU - TCP_OVERHEAD
    }
}

fn setsockopt_raw(s: &TcpStream, level: libc::c_int, name: libc::c_int, val: &[u8]) -> bool {
    // SAFETY: valid pointer and length for the option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            val.as_ptr().cast(),
            val.len() as libc::socklen_t,
        ) == 0
    }
}

fn setsockopt_int(s: &TcpStream, level: libc::c_int, name: libc::c_int, v: i32) -> bool {
    setsockopt_raw(s, level, name, &v.to_ne_bytes())
}

/// Receiver side of a bulk transfer (default buffers: receive-window
/// autotuning follows the sender).
fn receive(mut s: TcpStream, deadline: Instant) -> Bulk {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    let mut first: Option<Instant> = None;
    let mut timeline = Vec::new();
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let now = Instant::now();
                let f = *first.get_or_insert(now);
                total += n as u64;
                timeline.push(((now - f).as_secs_f64(), total));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let mss = tcp_mss(&s);
    Bulk { timeline, mss }
}

/// Bytes written to `s` and not yet acknowledged (SIOCOUTQ).
fn unacked(s: &TcpStream) -> u64 {
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (= TIOCOUTQ) writes one int.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ as _, &mut v) };
    if rc == 0 && v >= 0 {
        v as u64
    } else {
        0
    }
}

/// Sender side of a bulk transfer. It keeps at most `window` bytes
/// unacknowledged: enough to keep the link busy, not enough to overflow its
/// queue, so the transfer measures the link rather than TCP's loss recovery
/// (what `iperf -w` does when measuring a path's capacity). Reno, because
/// CUBIC's HyStart leaves slow start early on long-delay paths and then
/// needs tens of seconds to fill a satellite link.
fn send(mut s: TcpStream, send_for: Duration, max_bytes: u64, window: u32) {
    s.set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    setsockopt_raw(&s, libc::IPPROTO_TCP, libc::TCP_CONGESTION, b"reno");
    setsockopt_int(&s, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 16 << 20);
    let chunk = vec![0x5au8; 64 * 1024];
    let start = Instant::now();
    let mut sent = 0u64;
    let window = u64::from(window);
    while start.elapsed() < send_for && sent < max_bytes {
        let room = window.saturating_sub(unacked(&s));
        if room < 1448 {
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        let n = room.min(chunk.len() as u64).min(max_bytes - sent) as usize;
        match s.write(&chunk[..n]) {
            Ok(n) => sent += n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = s.shutdown(Shutdown::Write);
}

/// Bulk TCP transfer in direction `dir` for `send_for`, bounded by
/// `max_bytes`; the receiver gives up `drain` after the sender stops.
fn tcp_bulk(
    emu: &Emulator,
    dir: Dir,
    send_for: Duration,
    max_bytes: u64,
    drain: Duration,
    window: u32,
) -> Bulk {
    let deadline = Instant::now() + send_for + drain + Duration::from_secs(1);
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = emu
        .server()
        .spawn(move || {
            let l = TcpListener::bind((SERVER_ADDR, 0)).expect("bind tcp server");
            ready_tx.send(l.local_addr().unwrap()).unwrap();
            l.set_nonblocking(true).unwrap();
            let s = loop {
                match l.accept() {
                    Ok((s, _)) => break Some(s),
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => break None,
                }
            };
            let s = s?;
            s.set_nonblocking(false).unwrap();
            match dir {
                Dir::Up => Some(receive(s, deadline)),
                Dir::Down => {
                    send(s, send_for, max_bytes, window);
                    None
                }
            }
        })
        .expect("spawn tcp server");
    let addr: SocketAddr = ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("tcp server ready");
    let client = emu
        .client()
        .spawn(move || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
            match dir {
                Dir::Up => {
                    send(s, send_for, max_bytes, window);
                    None
                }
                Dir::Down => Some(receive(s, deadline)),
            }
        })
        .expect("spawn tcp client");
    let c = client.join().unwrap().expect("enter client namespace");
    let s = server.join().unwrap().expect("enter server namespace");
    c.or(s).expect("a receiver result")
}

/// How one profile is exercised.
struct Plan {
    probes: u32,
    spacing: Duration,
    /// TCP sender run time per direction; `None` skips the bulk transfer.
    send_for: Option<Duration>,
    /// Start of the rate measurement after the first byte (slow start).
    warmup: f64,
}

fn plan_for(p: &Profile) -> Plan {
    let jitter = p.up.jitter.max(p.down.jitter);
    // Probes further apart than the jitter range, so in-order release never
    // couples two probes (unless the profile reorders, then it does not
    // matter).
    let spacing = Duration::from_millis(2).max(jitter * 2 + Duration::from_micros(500));
    let unlimited = p.up.rate_bps.is_none() && p.down.rate_bps.is_none();
    let lossy = p.up.mean_loss() > 0.0 || p.down.mean_loss() > 0.0;
    let (probes, spacing) = if p.rtt() > Duration::from_millis(500) {
        (30, Duration::from_millis(50))
    } else if lossy {
        (3000, Duration::from_micros(500))
    } else if p.name == "wifi" {
        (1500, spacing)
    } else {
        (300, spacing)
    };
    let (send_for, warmup) = match p.name.as_str() {
        "nb-iot" => (Some(Duration::from_secs(8)), 4.2),
        "satellite" => (Some(Duration::from_secs(8)), 4.5),
        // Loss-only profiles: TCP's goodput is reported, not checked; the
        // Gilbert-Elliott check is about loss only.
        "burst" => (None, 0.0),
        _ if unlimited && lossy => (Some(Duration::from_secs(1)), 0.2),
        _ if lossy => (None, 0.0),
        _ => (Some(Duration::from_secs(3)), 1.0),
    };
    Plan {
        probes,
        spacing,
        send_for,
        warmup,
    }
}

/// Most bytes a bulk sender keeps unacknowledged over `link` (data
/// direction) on a path whose round trip under load is `rtt_eff`: the
/// bandwidth-delay product plus half the queue.
fn window_for(link: &LinkConfig, rtt_eff: Duration) -> u32 {
    let Some(rate) = link.rate_bps else {
        return 1 << 20;
    };
    let bdp = rate as f64 / 8.0 * rtt_eff.as_secs_f64();
    let queue = match link.queue {
        QueueLimit::Bytes(b) => b as f64,
        QueueLimit::Time(t) => rate as f64 / 8.0 * t.as_secs_f64(),
        QueueLimit::Unlimited => bdp,
    };
    (bdp + queue / 2.0).clamp(4.0 * 1448.0, 8.0 * 1024.0 * 1024.0) as u32
}

/// Standard deviation factor for a count of losses from a Gilbert-Elliott
/// chain: correlated losses spread more than independent ones (index of
/// dispersion (1 + λ) / (1 - λ), λ = 1 - p - r).
fn dispersion(l: &LinkConfig) -> f64 {
    match l.gilbert {
        Some(g) => {
            let lambda = (1.0 - g.p - g.r).clamp(-0.99, 0.99);
            ((1.0 + lambda) / (1.0 - lambda)).max(1.0)
        }
        None => 1.0,
    }
}

/// Whether `lost` of `n` round trips is within 4 standard deviations of the
/// expected `p` (and at most one loss when none is expected); returns the
/// bound as a fraction too.
fn loss_ok(lost: u32, n: u32, p: f64, dispersion: f64) -> (bool, f64) {
    let sd = (n as f64 * p * (1.0 - p) * dispersion).sqrt();
    let bound = (4.0 * sd).max(1.0);
    (
        (lost as f64 - n as f64 * p).abs() <= bound,
        bound / n as f64,
    )
}

/// `true` when a relative error is a number no larger than 5 %.
fn within_5pct(err: f64) -> bool {
    err.abs() <= 0.05
}

/// Absolute slack on an RTT: a user-space emulator on a loaded 2-core
/// machine wakes up to ~0.1 ms late each way, which is over 5 % of the
/// ~2 ms `wifi` RTT; 5 % holds for every RTT above 5 ms.
const RTT_SLACK_MS: f64 = 0.25;

/// One row of the report.
#[derive(Debug, Default)]
struct Row {
    name: String,
    rtt_cfg_ms: f64,
    rtt_ms: f64,
    loss_cfg: f64,
    loss: f64,
    loss_bound: f64,
    up_cfg: Option<u64>,
    up: f64,
    down_cfg: Option<u64>,
    down: f64,
}

fn check_profile(p: &Profile, baseline_ms: f64, failures: &mut Vec<String>) -> Row {
    let plan = plan_for(p);
    let mut emu_cfg = EmulatorConfig::new(p.clone());
    emu_cfg.seed = 1;
    let emu = Emulator::start(emu_cfg).expect("start emulator");
    let name = p.name.clone();
    let mut row = Row {
        name: name.clone(),
        up_cfg: p.up.rate_bps,
        down_cfg: p.down.rate_bps,
        up: f64::NAN,
        down: f64::NAN,
        ..Default::default()
    };

    // RTT and loss: a UDP echo probe.
    let size = PROBE_PAYLOAD + UDP_OVERHEAD;
    let ser_ms =
        (p.up.transmission_time(size) + p.down.transmission_time(size)).as_secs_f64() * 1e3;
    let linger = Duration::from_secs_f64(p.rtt().as_secs_f64() * 2.0 + 0.3);
    let echo = udp_echo(&emu, plan.probes, plan.spacing, linger);
    row.rtt_cfg_ms = p.rtt().as_secs_f64() * 1e3 + ser_ms;
    row.rtt_ms = echo.median() - baseline_ms;
    row.loss_cfg = 1.0 - (1.0 - p.up.mean_loss()) * (1.0 - p.down.mean_loss());
    row.loss = echo.loss();
    let lost = echo.sent - echo.received;
    let disp = dispersion(&p.up).max(dispersion(&p.down));
    let (loss_fine, bound) = loss_ok(lost, echo.sent, row.loss_cfg, disp);
    row.loss_bound = bound;
    let rtt_err = (row.rtt_ms - row.rtt_cfg_ms) / row.rtt_cfg_ms;
    println!(
        "{name:10} RTT configured {:9.3} ms, measured {:9.3} ms (median, {}; mean {:.3}) | round-trip loss configured {:.3} %, measured {:.3} % (bound ±{:.3} %, n={})",
        row.rtt_cfg_ms,
        row.rtt_ms,
        if row.rtt_cfg_ms > 0.0 { format!("{:+.2} %", rtt_err * 100.0) } else { "n/a".into() },
        echo.mean() - baseline_ms,
        row.loss_cfg * 100.0,
        row.loss * 100.0,
        bound * 100.0,
        echo.sent
    );
    if row.rtt_cfg_ms > 0.0
        && !within_5pct(rtt_err)
        && (row.rtt_ms - row.rtt_cfg_ms).abs() > RTT_SLACK_MS
    {
        failures.push(format!(
            "{name}: RTT {:.3} ms vs {:.3} ms",
            row.rtt_ms, row.rtt_cfg_ms
        ));
    }
    if !loss_fine {
        failures.push(format!(
            "{name}: loss {lost}/{} vs expected {:.3} %",
            echo.sent,
            row.loss_cfg * 100.0
        ));
    }

    // Rate: a TCP bulk transfer in each direction.
    if let Some(send_for) = plan.send_for {
        // Under load, in-order release with jitter holds packets up to the
        // top of their jitter range.
        let rtt_eff = p.rtt() + p.up.jitter + p.down.jitter;
        for (dir, link) in [(Dir::Up, &p.up), (Dir::Down, &p.down)] {
            let max_bytes = link
                .rate_bps
                .map(|r| (r as f64 / 8.0 * send_for.as_secs_f64()) as u64)
                .unwrap_or(64 << 20);
            let drain = Duration::from_secs_f64(
                p.rtt().as_secs_f64() * 3.0 + if link.rate_bps.is_some() { 2.0 } else { 1.0 },
            );
            let bulk = tcp_bulk(
                &emu,
                dir,
                send_for,
                max_bytes,
                drain,
                window_for(link, rtt_eff),
            );
            let rate = bulk.rate_bps(plan.warmup);
            match dir {
                Dir::Up => row.up = rate,
                Dir::Down => row.down = rate,
            }
            match link.rate_bps {
                Some(cfg) => {
                    let err = (rate - cfg as f64) / cfg as f64;
                    println!(
                        "{name:10} {dir:?} rate configured {cfg:10} bit/s, TCP measured {rate:12.0} bit/s ({:+.2} %), {} bytes",
                        err * 100.0,
                        bulk.total()
                    );
                    if !within_5pct(err) {
                        failures.push(format!("{name}: {dir:?} rate {rate:.0} vs {cfg}"));
                    }
                }
                None => println!(
                    "{name:10} {dir:?} rate unlimited, TCP measured {rate:12.0} bit/s, {} bytes",
                    bulk.total()
                ),
            }
        }
    }
    let stats = emu.shutdown();
    println!(
        "{name:10} emulator: up {} pkts, {} lost, {} duplicated, {} queue drops, {} overflow; down {} pkts, {} lost, {} duplicated, {} queue drops, {} overflow",
        stats.up.link.packets,
        stats.up.link.lost_random + stats.up.link.lost_burst,
        stats.up.link.duplicated,
        stats.up.link.dropped_queue,
        stats.up.overflow,
        stats.down.link.packets,
        stats.down.link.lost_random + stats.down.link.lost_burst,
        stats.down.link.duplicated,
        stats.down.link.dropped_queue,
        stats.down.overflow,
    );
    row
}

fn fmt_rate(r: Option<u64>) -> String {
    r.map(|v| format!("{:.3}", v as f64 / 1e6))
        .unwrap_or_else(|| "-".into())
}

/// Custom values, given the way the command line gives them.
fn custom_profiles() -> Vec<Profile> {
    let mut mixed = Profile::named("none").unwrap();
    mixed
        .set_spec(
            Direction::Both,
            "rtt=40ms,jitter=2ms,reorder=on,rate=20mbit,queue=100kb,duplicate=1%",
        )
        .unwrap();
    mixed.name = "custom".into();
    let mut burst = Profile::named("none").unwrap();
    burst.set(Direction::Both, "gilbert", "2,30").unwrap();
    burst.name = "burst".into();
    vec![mixed, burst]
}

#[test]
fn profiles_match_their_configuration() {
    if skipped() {
        return;
    }
    let _g = lock();
    let selected: Option<Vec<String>> = std::env::var("QUICHUB_NETEM_TEST_PROFILES")
        .ok()
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    let mut profiles = vec![
        Profile::nb_iot(),
        Profile::five_g(),
        Profile::lte(),
        Profile::wifi(),
        Profile::satellite(),
        Profile::named("lossy-1").unwrap(),
        Profile::named("lossy-5").unwrap(),
    ];
    profiles.extend(custom_profiles());
    if let Some(sel) = &selected {
        profiles.retain(|p| sel.iter().any(|s| s == &p.name));
    }

    // The host's own path (two TUN crossings, the kernel stacks, thread
    // wake-ups) measured through an unimpaired link, with probes as far
    // apart as most profiles' (idle CPUs wake up slower), subtracted from
    // RTTs.
    let base = Emulator::start(EmulatorConfig::new(Profile::unimpaired())).expect("start emulator");
    let echo = udp_echo(
        &base,
        500,
        Duration::from_millis(2),
        Duration::from_millis(300),
    );
    let baseline_ms = echo.median();
    println!(
        "baseline   RTT through an unimpaired link: {baseline_ms:.3} ms (median of {} probes)",
        echo.received
    );
    drop(base);

    let mut failures = Vec::new();
    let mut rows = Vec::new();
    let started = Instant::now();
    for p in &profiles {
        let t = Instant::now();
        rows.push(check_profile(p, baseline_ms, &mut failures));
        println!("{:10} took {:.1} s", p.name, t.elapsed().as_secs_f64());
    }
    println!(
        "all profiles took {:.1} s\n",
        started.elapsed().as_secs_f64()
    );
    println!("| profile | RTT cfg (ms) | RTT meas (ms) | loss cfg (%) | loss meas (%) | up cfg (Mbit/s) | up meas | down cfg (Mbit/s) | down meas |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.3} | {:.3} | {:.2} | {:.2} (±{:.2}) | {} | {:.3} | {} | {:.3} |",
            r.name,
            r.rtt_cfg_ms,
            r.rtt_ms,
            r.loss_cfg * 100.0,
            r.loss * 100.0,
            r.loss_bound * 100.0,
            fmt_rate(r.up_cfg),
            r.up / 1e6,
            fmt_rate(r.down_cfg),
            r.down / 1e6
        );
    }
    assert!(
        failures.is_empty(),
        "profiles off their configuration:\n{}",
        failures.join("\n")
    );
}

/// `quichub-lab netem run`: the command's exit code comes back, it runs in the
/// client namespace, the `--server` command runs in the server namespace and
/// is stopped afterwards, and nothing is left behind.
#[test]
fn run_command_reports_exit_code_and_cleans_up() {
    if skipped() {
        return;
    }
    let _g = lock();
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: quichub_netem::NetemArgs,
    }
    use clap::Parser;
    let dir = std::env::temp_dir().join(format!("qh-netem-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("server.pid");
    let server = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    // The client checks it sees the TUN interface and reaches the server
    // side (the emulator answers nothing itself: the ping goes through the
    // link), then exits with 7.
    let client = "grep -q qh0 /proc/net/dev && test \"$QUICHUB_NETEM_SERVER_ADDR\" = 10.201.0.2 && exit 7; exit 1";
    let cli = Cli::try_parse_from([
        "netem",
        "run",
        "--profile",
        "lte",
        "--loss",
        "0",
        "--server",
        &server,
        "--server-startup",
        "300ms",
        "--",
        "sh",
        "-c",
        client,
    ])
    .unwrap();
    let started = Instant::now();
    let code = quichub_netem::main(cli.args).expect("netem run");
    assert_eq!(code, 7, "exit code of the command");
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("the server command ran")
        .trim()
        .parse()
        .unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true),
        "server command {pid} still running"
    );
    let me = std::process::id().to_string();
    let leftovers: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with("qh-") && n.contains(&me))
                .collect()
        })
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");

    // A command killed by a signal: 128 + the signal, and still cleaned up.
    let cli = Cli::try_parse_from(["netem", "run", "--", "sh", "-c", "kill -SEGV $$"]).unwrap();
    assert_eq!(quichub_netem::main(cli.args).expect("netem run"), 128 + 11);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The capture sees what crosses the link (sizes, ports, direction, drops)
/// and nothing after it stops; `set_link` changes the rate mid-run.
#[test]
fn capture_and_rate_step() {
    if skipped() {
        return;
    }
    let _g = lock();
    let profile = Profile {
        name: "step".into(),
        ..Profile::unimpaired()
    };
    let emu = Emulator::start(EmulatorConfig::new(profile)).expect("emulator");
    let (tx, rx) = mpsc::channel();
    let server = emu
        .server()
        .spawn(move || {
            let sock = UdpSocket::bind((SERVER_ADDR, 0)).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            tx.send(sock.local_addr().unwrap()).unwrap();
            let mut buf = [0u8; 2048];
            let mut got = 0u32;
            while sock.recv(&mut buf).is_ok() {
                got += 1;
            }
            got
        })
        .unwrap();
    let addr = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let send = |n: usize, size: usize| {
        emu.client()
            .spawn(move || {
                let sock = UdpSocket::bind((CLIENT_ADDR, 0)).unwrap();
                for _ in 0..n {
                    sock.send_to(&vec![7u8; size], addr).unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                }
                sock.local_addr().unwrap().port()
            })
            .unwrap()
            .join()
            .unwrap()
            .unwrap()
    };
    send(5, 100); // not captured
    emu.start_capture();
    let port = send(20, 1000);
    std::thread::sleep(Duration::from_millis(50));
    let cap = emu.stop_capture();
    send(5, 100); // not captured either
    let ours: Vec<_> = cap
        .packets
        .iter()
        .filter(|p| p.proto == 17 && p.src_port == port)
        .collect();
    assert_eq!(ours.len(), 20, "{:?}", cap.packets);
    assert!(ours
        .iter()
        .all(|p| p.up && p.len == 1028 && p.dst_port == addr.port() && !p.dropped));
    assert!(ours.windows(2).all(|w| w[0].t_us <= w[1].t_us));
    assert_eq!(cap.missed, 0);

    // A 100 kbit/s uplink with a 50 ms queue: 20 packets of 1028 B sent in
    // 40 ms (3.4 Mbit/s) cannot all fit; some are dropped at the queue.
    emu.set_link(
        Direction::Up,
        LinkConfig {
            rate_bps: Some(100_000),
            queue: QueueLimit::Time(Duration::from_millis(50)),
            ..Default::default()
        },
    )
    .unwrap();
    emu.start_capture();
    send(20, 1000);
    let cap = emu.stop_capture();
    let dropped = cap.packets.iter().filter(|p| p.dropped).count();
    assert!(dropped >= 10, "queue drops after the step: {dropped}");
    assert!(emu
        .set_link(
            Direction::Both,
            LinkConfig {
                loss: 7.0,
                ..Default::default()
            }
        )
        .is_err());
    drop(emu);
    let got = server.join().unwrap().unwrap();
    assert!((30..=45).contains(&got), "received {got}");
}
