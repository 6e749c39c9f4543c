//! The IO layer: two network namespaces, a TUN device in each, and one
//! forwarding thread per direction that runs the pure [`Link`] model.
//!
//! ```text
//!  client netns (10.201.0.1)          emulator process            server netns (10.201.0.2)
//!   app ─► qh0 (TUN) ──fd──► [thread up:   Link(up)  ] ──fd──► qh0 (TUN) ─► app
//!   app ◄─ qh0 (TUN) ◄─fd─── [thread down: Link(down)] ◄─fd─── qh0 (TUN) ◄─ app
//! ```
//!
//! Each TUN device is created by a short-lived thread that first moves itself
//! into a fresh network namespace; the emulator keeps the TUN descriptors and
//! a handle on each namespace, so the namespaces live exactly as long as the
//! [`Emulator`]. Every IP packet crosses the emulator, so TCP and UDP (QUIC)
//! see the same link.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ffi::OsStr;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{ConfigError, Link, LinkConfig, LinkStats, Verdict};
use crate::profile::{Direction, Profile};
use crate::sys::{self, IfaceConfig, SysError};

/// Client address inside the client namespace.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
/// Server address inside the server namespace.
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
/// Name of the TUN interface in both namespaces.
pub const IFACE: &str = "qh0";
/// MTU of the emulated link.
pub const MTU: u32 = 1500;

/// Most packets one direction holds at once; more are dropped and counted
/// as `overflow` (bounds memory whatever the configuration).
pub const MAX_HELD_PACKETS: usize = 200_000;
/// Most bytes one direction holds at once.
pub const MAX_HELD_BYTES: usize = 256 * 1024 * 1024;
/// Most packets one capture records (24 bytes each); later ones are counted
/// in [`Capture::missed`].
pub const MAX_CAPTURED: usize = 2_000_000;

/// One packet as an on-path observer at the emulator sees it: when, which
/// way, how big, and the cleartext transport header fields (what encryption
/// leaves visible). No payload is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PacketRecord {
    /// When it reached the emulator, microseconds since [`Emulator::epoch`].
    pub t_us: u64,
    /// Client → server (`true`) or server → client (`false`).
    pub up: bool,
    /// Length of the IP packet, headers included, bytes.
    pub len: u32,
    /// IP protocol number (6 TCP, 17 UDP), 0 when not IPv4.
    pub proto: u8,
    /// Source port (TCP and UDP; 0 otherwise).
    pub src_port: u16,
    /// Destination port (TCP and UDP; 0 otherwise).
    pub dst_port: u16,
    /// Whether the link model dropped it (loss or a full queue).
    pub dropped: bool,
}

impl PacketRecord {
    /// Reads the header fields of an IPv4 packet (no packet information
    /// prefix, as the TUN devices are opened); anything shorter or not IPv4
    /// gives protocol 0 and no ports.
    pub fn parse(t_us: u64, up: bool, packet: &[u8], dropped: bool) -> PacketRecord {
        let mut r = PacketRecord {
            t_us,
            up,
            len: packet.len() as u32,
            proto: 0,
            src_port: 0,
            dst_port: 0,
            dropped,
        };
        if packet.len() >= 20 && packet[0] >> 4 == 4 {
            r.proto = packet[9];
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            if matches!(r.proto, 6 | 17) && packet.len() >= ihl + 4 && ihl >= 20 {
                r.src_port = u16::from_be_bytes([packet[ihl], packet[ihl + 1]]);
                r.dst_port = u16::from_be_bytes([packet[ihl + 2], packet[ihl + 3]]);
            }
        }
        r
    }
}

/// What a capture recorded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Capture {
    /// Packets of both directions, in the order each direction saw them
    /// (sort by `t_us` for one timeline).
    pub packets: Vec<PacketRecord>,
    /// Packets not recorded because [`MAX_CAPTURED`] was reached.
    pub missed: u64,
}

/// Shared between the forwarders and [`Emulator::start_capture`].
#[derive(Default)]
struct CaptureState {
    on: AtomicBool,
    missed: AtomicU64,
    packets: Mutex<Vec<PacketRecord>>,
}

/// A configuration waiting for a forwarder to take it.
#[derive(Default)]
struct Pending {
    dirty: AtomicBool,
    cfg: Mutex<Option<LinkConfig>>,
}

/// Why the emulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// A system call failed; the message says what is missing.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The profile is invalid.
    #[error("invalid link configuration: {0}")]
    Config(#[from] crate::model::ConfigError),
    /// A thread could not be started.
    #[error("starting a thread: {0}")]
    Thread(io::Error),
}

/// How to build the emulated link.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// Link profile (both directions).
    pub profile: Profile,
    /// Seed of the random decisions (up uses `seed`, down `seed + 1`).
    pub seed: u64,
    /// Bind-mount the namespaces as `/run/netns/qh-cli-<id>` and
    /// `/run/netns/qh-srv-<id>` so `ip netns exec` can use them (needs root).
    pub named: bool,
}

impl EmulatorConfig {
    /// A configuration with seed 1 and anonymous namespaces.
    pub fn new(profile: Profile) -> Self {
        EmulatorConfig {
            profile,
            seed: 1,
            named: false,
        }
    }
}

/// One side's network namespace.
#[derive(Debug)]
pub struct Namespace {
    name: String,
    addr: Ipv4Addr,
    fd: OwnedFd,
    mounted: bool,
}

impl Namespace {
    /// Name (`qh-cli-<id>` or `qh-srv-<id>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This side's IPv4 address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Whether the namespace is visible under `/run/netns`.
    pub fn is_named(&self) -> bool {
        self.mounted
    }

    /// A path other processes can open to enter the namespace
    /// (`nsenter --net=PATH`): `/run/netns/<name>` when named, otherwise
    /// `/proc/<pid>/fd/<fd>` of this process.
    pub fn path(&self) -> PathBuf {
        if self.mounted {
            PathBuf::from("/run/netns").join(&self.name)
        } else {
            PathBuf::from(format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                self.fd.as_raw_fd()
            ))
        }
    }

    /// Raw descriptor of the namespace handle.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Moves the calling thread into this namespace (sockets it creates
    /// afterwards live there).
    pub fn enter(&self) -> Result<(), SysError> {
        sys::setns_net(self.fd.as_raw_fd())
    }

    /// Runs `f` on a new thread inside this namespace; the thread's result is
    /// an error if it could not enter the namespace.
    pub fn spawn<F, T>(&self, f: F) -> io::Result<JoinHandle<Result<T, SysError>>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let fd = self.fd.try_clone()?;
        std::thread::Builder::new()
            .name(format!("netns-{}", self.name))
            .spawn(move || {
                sys::setns_net(fd.as_raw_fd())?;
                drop(fd);
                Ok(f())
            })
    }

    /// A [`Command`] that runs `program` inside this namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let fd = self.fd.as_raw_fd();
        // SAFETY: the closure runs between fork and exec and only calls the
        // async-signal-safe setns(2) on a descriptor that stays open.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }
}

/// Counters of one direction, model and IO together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DirectionStats {
    /// What the link model decided.
    pub link: LinkStats,
    /// Packets written to the far TUN device.
    pub written: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Packets dropped because the direction already held
    /// [`MAX_HELD_PACKETS`] or [`MAX_HELD_BYTES`].
    pub overflow: u64,
    /// Mean lateness of timed releases, in microseconds (after compensation).
    pub mean_late_us: f64,
}

/// Counters of both directions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EmulatorStats {
    /// Client → server.
    pub up: DirectionStats,
    /// Server → client.
    pub down: DirectionStats,
}

static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// A running emulator. Dropping it stops forwarding, removes the TUN
/// devices and releases the namespaces.
pub struct Emulator {
    client: Namespace,
    server: Namespace,
    profile: Profile,
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
    stats: [Arc<Mutex<DirectionStats>>; 2],
    pending: [Arc<Pending>; 2],
    capture: Arc<CaptureState>,
    epoch: Instant,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("client", &self.client)
            .field("server", &self.server)
            .field("profile", &self.profile.name)
            .finish()
    }
}

/// Creates a namespace with a configured TUN device, from a helper thread.
fn make_side(addr: Ipv4Addr) -> Result<(OwnedFd, OwnedFd), SysError> {
    let handle = std::thread::Builder::new()
        .name("netem-setup".into())
        .spawn(move || -> Result<(OwnedFd, OwnedFd), SysError> {
            sys::unshare_net()?;
            let ns = sys::open_thread_netns()?;
            let tun = sys::open_tun(IFACE)?;
            sys::configure(&IfaceConfig {
                name: IFACE.into(),
                addr,
                prefix: 24,
                mtu: MTU,
                txqueuelen: 10_000,
            })?;
            Ok((ns, tun))
        })
        .map_err(|e| SysError {
            step: "starting the namespace setup thread".into(),
            source: e,
            hint: String::new(),
        })?;
    handle.join().unwrap_or_else(|_| {
        Err(SysError {
            step: "namespace setup thread".into(),
            source: io::Error::other("panicked"),
            hint: String::new(),
        })
    })
}

impl Emulator {
    /// Creates both namespaces and TUN devices and starts forwarding.
    pub fn start(cfg: EmulatorConfig) -> Result<Emulator, EmulatorError> {
        cfg.profile.validate()?;
        let up_link = Link::new(cfg.profile.up.clone(), cfg.seed)?;
        let down_link = Link::new(cfg.profile.down.clone(), cfg.seed.wrapping_add(1))?;
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let id = if n == 0 {
            format!("{}", std::process::id())
        } else {
            format!("{}-{n}", std::process::id())
        };
        let (cns, ctun) = make_side(CLIENT_ADDR)?;
        let (sns, stun) = make_side(SERVER_ADDR)?;
        let mut client = Namespace {
            name: format!("qh-cli-{id}"),
            addr: CLIENT_ADDR,
            fd: cns,
            mounted: false,
        };
        let mut server = Namespace {
            name: format!("qh-srv-{id}"),
            addr: SERVER_ADDR,
            fd: sns,
            mounted: false,
        };
        if cfg.named {
            for ns in [&mut client, &mut server] {
                sys::mount_named_netns(ns.fd.as_raw_fd(), &ns.name)?;
                ns.mounted = true;
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(sys::eventfd()?);
        let ctun = Arc::new(ctun);
        let stun = Arc::new(stun);
        let stats = [
            Arc::new(Mutex::new(DirectionStats::default())),
            Arc::new(Mutex::new(DirectionStats::default())),
        ];
        let epoch = Instant::now();
        let pending = [Arc::new(Pending::default()), Arc::new(Pending::default())];
        let capture = Arc::new(CaptureState::default());
        let mut emu = Emulator {
            client,
            server,
            profile: cfg.profile,
            stop: stop.clone(),
            wake: wake.clone(),
            threads: Vec::new(),
            stats: stats.clone(),
            pending: pending.clone(),
            capture: capture.clone(),
            epoch,
        };
        let dirs = [
            (
                "netem-up",
                ctun.clone(),
                stun.clone(),
                up_link,
                stats[0].clone(),
                pending[0].clone(),
                true,
            ),
            (
                "netem-down",
                stun,
                ctun,
                down_link,
                stats[1].clone(),
                pending[1].clone(),
                false,
            ),
        ];
        for (name, rx, tx, link, st, pending, up) in dirs {
            let f = Forwarder {
                rx,
                tx,
                link,
                stop: stop.clone(),
                wake: wake.clone(),
                stats: st,
                epoch,
                pending,
                capture: capture.clone(),
                up,
            };
            let h = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f.run())
                .map_err(EmulatorError::Thread)?;
            emu.threads.push(h);
        }
        Ok(emu)
    }

    /// The client side (address [`CLIENT_ADDR`]).
    pub fn client(&self) -> &Namespace {
        &self.client
    }

    /// The server side (address [`SERVER_ADDR`]).
    pub fn server(&self) -> &Namespace {
        &self.server
    }

    /// The profile in use.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Counters so far.
    pub fn stats(&self) -> EmulatorStats {
        let get = |m: &Arc<Mutex<DirectionStats>>| m.lock().map(|g| *g).unwrap_or_default();
        EmulatorStats {
            up: get(&self.stats[0]),
            down: get(&self.stats[1]),
        }
    }

    /// The instant packet times ([`PacketRecord::t_us`]) count from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Replaces one direction's link configuration from its next packet on
    /// (e.g. a rate step down mid-run); packets already queued keep their
    /// release times. [`Emulator::profile`] still names the starting one.
    pub fn set_link(&self, dir: Direction, cfg: LinkConfig) -> Result<(), ConfigError> {
        cfg.validate()?;
        let dirs: &[usize] = match dir {
            Direction::Up => &[0],
            Direction::Down => &[1],
            Direction::Both => &[0, 1],
        };
        for &i in dirs {
            let p = &self.pending[i];
            if let Ok(mut g) = p.cfg.lock() {
                *g = Some(cfg.clone());
            }
            p.dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Starts recording every packet's size, time and ports (both
    /// directions), discarding what an earlier capture left.
    pub fn start_capture(&self) {
        if let Ok(mut g) = self.capture.packets.lock() {
            g.clear();
        }
        self.capture.missed.store(0, Ordering::Relaxed);
        self.capture.on.store(true, Ordering::Release);
    }

    /// Stops recording and returns what was recorded.
    pub fn stop_capture(&self) -> Capture {
        self.capture.on.store(false, Ordering::Release);
        let packets = self
            .capture
            .packets
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default();
        Capture {
            packets,
            missed: self.capture.missed.swap(0, Ordering::Relaxed),
        }
    }

    /// Stops forwarding, removes everything and returns the final counters.
    pub fn shutdown(mut self) -> EmulatorStats {
        self.stop_threads();
        self.stats()
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        sys::eventfd_signal(self.wake.as_raw_fd());
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        for ns in [&mut self.client, &mut self.server] {
            if ns.mounted {
                if let Err(e) = sys::unmount_named_netns(&ns.name) {
                    tracing::warn!("netem: {e}");
                }
                ns.mounted = false;
            }
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// A packet waiting for its release time.
struct Held {
    at: Duration,
    seq: u64,
    data: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Forwarder {
    rx: Arc<OwnedFd>,
    tx: Arc<OwnedFd>,
    link: Link,
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    stats: Arc<Mutex<DirectionStats>>,
    epoch: Instant,
    pending: Arc<Pending>,
    capture: Arc<CaptureState>,
    up: bool,
}

/// Longest single wait, so a stop request is never missed for long.
const MAX_WAIT: Duration = Duration::from_millis(200);
/// Packets read per wake-up before releasing due ones again.
const READ_BATCH: usize = 64;

impl Forwarder {
    fn run(mut self) {
        sys::precise_timers();
        let mut heap: BinaryHeap<Reverse<Held>> = BinaryHeap::new();
        let mut held_bytes = 0usize;
        let mut seq = 0u64;
        let mut scratch = vec![0u8; 65536];
        let mut io = DirectionStats::default();
        // Timer-lateness compensation: an EWMA of how late timed wake-ups
        // are; packets are released that much before their time.
        let mut lead = Duration::ZERO;
        let (mut late_sum, mut late_n) = (0f64, 0u64);
        let rx = self.rx.as_raw_fd();
        let tx = self.tx.as_raw_fd();
        let wake = self.wake.as_raw_fd();
        let mut last_publish = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            // Release everything due.
            let now = self.epoch.elapsed();
            while let Some(Reverse(top)) = heap.peek() {
                if top.at > now + lead {
                    break;
                }
                let Some(Reverse(p)) = heap.pop() else { break };
                held_bytes -= p.data.len();
                late_sum += now.saturating_sub(p.at).as_secs_f64() * 1e6;
                late_n += 1;
                match sys::write_fd(tx, &p.data) {
                    Ok(_) => io.written += 1,
                    Err(_) => io.write_errors += 1,
                }
            }
            let deadline = heap.peek().map(|Reverse(t)| t.at.saturating_sub(lead));
            let timeout = deadline
                .map(|d| d.saturating_sub(self.epoch.elapsed()))
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT);
            let ready = match sys::poll_readable(&[rx, wake], timeout) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("netem: poll failed: {e}");
                    break;
                }
            };
            if ready[1] {
                continue; // stop requested; the loop condition sees it
            }
            if self.pending.dirty.swap(false, Ordering::AcqRel) {
                let cfg = self.pending.cfg.lock().ok().and_then(|mut g| g.take());
                if let Some(cfg) = cfg {
                    if let Err(e) = self.link.reconfigure(cfg) {
                        tracing::warn!("netem: reconfiguration refused: {e}");
                    }
                }
            }
            let capturing = self.capture.on.load(Ordering::Acquire);
            let mut captured = Vec::new();
            if ready[0] {
                for _ in 0..READ_BATCH {
                    let n = match sys::read_fd(rx, &mut scratch) {
                        Ok(Some(n)) if n > 0 => n,
                        Ok(_) => break,
                        Err(e) => {
                            tracing::debug!("netem: read failed: {e}");
                            break;
                        }
                    };
                    let arrival = self.epoch.elapsed();
                    let verdict = self.link.send(arrival, n);
                    if capturing {
                        captured.push(PacketRecord::parse(
                            arrival.as_micros() as u64,
                            self.up,
                            &scratch[..n],
                            matches!(verdict, Verdict::Dropped(_)),
                        ));
                    }
                    match verdict {
                        Verdict::Dropped(_) => {}
                        Verdict::Deliver { at, duplicate_at } => {
                            for t in std::iter::once(at).chain(duplicate_at) {
                                if heap.len() >= MAX_HELD_PACKETS || held_bytes + n > MAX_HELD_BYTES
                                {
                                    io.overflow += 1;
                                    continue;
                                }
                                held_bytes += n;
                                seq += 1;
                                heap.push(Reverse(Held {
                                    at: t,
                                    seq,
                                    data: scratch[..n].to_vec(),
                                }));
                            }
                        }
                    }
                }
                if !captured.is_empty() {
                    self.record(captured);
                }
            } else if let Some(d) = deadline {
                // Woke up by timeout: learn how late the timer fired.
                let late = self.epoch.elapsed().saturating_sub(d);
                let late = late.min(Duration::from_millis(1));
                lead = (lead * 7 + late) / 8;
            }
            if last_publish.elapsed() >= Duration::from_millis(20) {
                self.publish(&mut io, late_sum, late_n);
                last_publish = Instant::now();
            }
        }
        self.publish(&mut io, late_sum, late_n);
    }

    fn record(&self, captured: Vec<PacketRecord>) {
        if let Ok(mut g) = self.capture.packets.lock() {
            let room = MAX_CAPTURED.saturating_sub(g.len());
            let missed = captured.len().saturating_sub(room);
            g.extend(captured.into_iter().take(room));
            if missed > 0 {
                self.capture
                    .missed
                    .fetch_add(missed as u64, Ordering::Relaxed);
            }
        }
    }

    fn publish(&self, io: &mut DirectionStats, late_sum: f64, late_n: u64) {
        io.link = *self.link.stats();
        io.mean_late_us = if late_n > 0 {
            late_sum / late_n as f64
        } else {
            0.0
        };
        if let Ok(mut g) = self.stats.lock() {
            *g = *io;
        }
    }
}
