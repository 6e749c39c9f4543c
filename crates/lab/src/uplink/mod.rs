//! `lab uplink`: how much of a rate-limited uplink one bulk transfer gets over
//! TCP (the kernel's, CUBIC) and over QUIC (quinn, with each of its
//! congestion controllers), on every link profile.
//!
//! Why it exists: in `lab mar` (J. Cao, X. Su, B. Finley, P. Zhou, P. Hui,
//! "Evaluating Transport Protocols on 5G for Mobile Augmented Reality"), QUIC
//! delivered about 1.1 Mbit/s of whole requests on the LTE profile's
//! 8.63 Mbit/s uplink where TCP delivered 8.2. A bulk transfer separates the
//! transport (controller, pacing, initial window, queue overshoot) from how an
//! application spreads its data over streams.
//!
//! One run: the client (emulator client namespace) opens one connection to
//! the server (server namespace), then writes as fast as the transport takes
//! data for `duration`; the server counts the bytes its application reads per
//! 100 ms bin. Both are threads of this process, so one clock times both
//! ends. Goodput is application bytes read in `[start, start + duration]`,
//! whole run and second half (after slow start); utilisation is goodput over
//! the link's rate; wire bytes per goodput byte come from the emulator's
//! counters (both directions, so ACKs count); the sender's smoothed RTT is
//! sampled every 100 ms (quinn's estimate; TCP_INFO for TCP) and its median
//! shows the queue a transport keeps.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use quichub_net::CongestionControl;
use quichub_netem::emulator::{DirectionStats, Emulator, EmulatorConfig};
use quichub_netem::profile::Profile;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::rt::{runtime, step, STEP};
use crate::common::stats::Spread;
use crate::common::svg::{category_chart, line_chart, CatSeries, Series, COLORS};
use crate::common::Options;
use crate::common::{kernel_controllers, kernel_name};

/// Width of a goodput bin.
pub const BIN: Duration = Duration::from_millis(100);
/// Bytes handed to the transport per write.
const CHUNK: usize = 64 * 1024;

/// Options of `lab uplink`.
#[derive(clap::Args, Debug, Clone)]
pub struct UplinkArgs {
    /// Links, comma-separated netem profile names, or NAME-lossN for a
    /// profile with N % random loss added each way (default
    /// 5g,lte,wifi,satellite,5g-loss1, or lte,lte-loss1 with --quick).
    #[arg(long)]
    pub links: Option<String>,
    /// Seconds of sending per run (default 10, or 2 with --quick).
    #[arg(long)]
    pub duration: Option<f64>,
}

/// One transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Mode {
    /// The kernel's TCP with this controller (`reno` for newreno).
    Tcp(CongestionControl),
    /// quinn with this controller.
    Quic(CongestionControl),
}

impl Mode {
    /// Table label.
    pub fn label(self) -> String {
        match self {
            Mode::Tcp(cc) => format!("tcp-{cc}"),
            Mode::Quic(cc) => format!("quic-{cc}"),
        }
    }

    /// TCP and QUIC with each of `ccs`, TCP first.
    pub fn all(ccs: &[CongestionControl]) -> Vec<Mode> {
        ccs.iter()
            .map(|&c| Mode::Tcp(c))
            .chain(ccs.iter().map(|&c| Mode::Quic(c)))
            .collect()
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Link profile.
    pub link: String,
    /// Transport label.
    pub mode: String,
    /// Repetition.
    pub rep: u32,
    /// Why the run failed.
    pub error: Option<String>,
    /// Application bytes read by the server per [`BIN`] from the start.
    pub bins: Vec<u64>,
    /// Goodput over the whole run, Mbit/s.
    pub goodput_mbps: f64,
    /// Goodput over the second half of the run, Mbit/s.
    pub goodput_late_mbps: f64,
    /// Goodput over the link's uplink rate (IP bytes), percent.
    pub utilisation_pct: f64,
    /// Bytes on the wire (both directions, IP) per application byte read.
    pub wire_per_byte: f64,
    /// Packets the uplink dropped at its queue.
    pub queue_drops: u64,
    /// Packets lost at random on the uplink.
    pub random_losses: u64,
    /// Median of the sender's smoothed RTT samples, ms.
    pub rtt_ms: f64,
    /// The kernel's TCP controller (TCP runs only).
    pub tcp_cc: Option<String>,
}

/// The experiment's settings.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// Sending time per run.
    pub duration: Duration,
}

/// The links of `lab uplink`.
pub fn links(args: &Options, u: &UplinkArgs) -> anyhow::Result<Vec<Profile>> {
    let names = u.links.clone().unwrap_or_else(|| {
        if args.quick {
            "lte,lte-loss1"
        } else {
            "5g,lte,wifi,satellite,5g-loss1"
        }
        .into()
    });
    let links = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(link)
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!links.is_empty(), "no links");
    Ok(links)
}

/// A named profile, or `NAME-lossN`: NAME with N % random loss each way
/// (`lossy-N` alone has no rate limit, so it says nothing about uplinks).
pub fn link(name: &str) -> anyhow::Result<Profile> {
    if let Ok(p) = Profile::named(name) {
        return Ok(p);
    }
    let (base, pct) = name
        .rsplit_once("-loss")
        .with_context(|| format!("unknown link {name:?}: a netem profile name or NAME-lossN"))?;
    let pct: f64 = pct
        .parse()
        .with_context(|| format!("bad loss in {name:?}: NAME-lossN with N in percent"))?;
    anyhow::ensure!(
        pct > 0.0 && pct <= 50.0,
        "loss {pct} % out of (0, 50] in {name:?}"
    );
    let mut p = Profile::named(base)?;
    p.up.loss = pct / 100.0;
    p.down.loss = pct / 100.0;
    p.source = format!("the {base} profile with {pct}% independent random loss each way");
    p.name = name.to_string();
    p.validate()?;
    Ok(p)
}

/// The controllers compared: `--cc` alone when given, else all three.
pub fn controllers(args: &Options) -> Vec<CongestionControl> {
    match args.cc {
        Some(cc) => vec![cc],
        None => CongestionControl::ALL.to_vec(),
    }
}

/// Runs the experiment; returns its directory and whether every run succeeded.
pub fn run(args: &Options, u: &UplinkArgs) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(why) = quichub_netem::privileges::missing() {
        bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    let duration = u.duration.unwrap_or(if args.quick { 2.0 } else { 10.0 });
    anyhow::ensure!(
        (0.5..=600.0).contains(&duration),
        "--duration must be in [0.5, 600] s"
    );
    let cfg = RunConfig {
        duration: Duration::from_secs_f64(duration),
    };
    let links = links(args, u)?;
    // TCP runs only with the controllers this kernel has (bbr is a module
    // that not every kernel loads); the report lists what was left out.
    let (available, _) = kernel_controllers();
    let modes: Vec<Mode> = Mode::all(&controllers(args))
        .into_iter()
        .filter(|m| match m {
            Mode::Tcp(cc) => available.iter().any(|a| a == kernel_name(*cc)),
            Mode::Quic(_) => true,
        })
        .collect();
    let dir = crate::common::result_dir(&args.out, "uplink")?;
    let mut runs = Vec::new();
    for link in &links {
        eprintln!("link {}: {}", link.name, link.describe());
        for rep in 0..args.reps {
            for &mode in &modes {
                // A fresh emulator per run: no queue or counters carried over.
                let emu = Emulator::start(EmulatorConfig {
                    seed: 1 + u64::from(rep),
                    ..EmulatorConfig::new(link.clone())
                })
                .with_context(|| format!("starting the emulator for {}", link.name))?;
                let rec = run_once(&emu, link, mode, rep, &cfg);
                emu.shutdown();
                eprintln!("  {}", one_line(&rec));
                runs.push(rec);
            }
        }
    }
    let ok = runs.iter().all(|r| r.error.is_none());
    let out = Output::new(args, cfg, links, modes, runs);
    out.write(&dir)?;
    println!("{}", out.main_table());
    Ok((dir, ok))
}

fn one_line(r: &RunRecord) -> String {
    match &r.error {
        Some(e) => format!("{} {} rep {}: FAILED: {e}", r.link, r.mode, r.rep),
        None => format!(
            "{} {} rep {}: {:.2} Mbit/s ({:.2} late, {:.0} %), wire ×{:.3}, {} queue drops, RTT {:.1} ms",
            r.link,
            r.mode,
            r.rep,
            r.goodput_mbps,
            r.goodput_late_mbps,
            r.utilisation_pct,
            r.wire_per_byte,
            r.queue_drops,
            r.rtt_ms
        ),
    }
}

struct Raw {
    /// Server read log: bytes per bin counted from `epoch`.
    bins_from_epoch: Vec<u64>,
    /// When the client started writing, since `epoch`.
    start: Duration,
    rtts_ms: Vec<f64>,
    tcp_cc: Option<String>,
}

/// One transfer of `mode` across `emu`.
pub fn run_once(
    emu: &Emulator,
    link: &Profile,
    mode: Mode,
    rep: u32,
    cfg: &RunConfig,
) -> RunRecord {
    let before = emu.stats();
    let r = transfer(emu, mode, cfg);
    let after = emu.stats();
    let mut rec = RunRecord {
        link: link.name.clone(),
        mode: mode.label(),
        rep,
        error: None,
        bins: Vec::new(),
        goodput_mbps: 0.0,
        goodput_late_mbps: 0.0,
        utilisation_pct: 0.0,
        wire_per_byte: 0.0,
        queue_drops: after.up.link.dropped_queue - before.up.link.dropped_queue,
        random_losses: after.up.link.lost_random - before.up.link.lost_random,
        rtt_ms: 0.0,
        tcp_cc: None,
    };
    let raw = match r {
        Ok(raw) => raw,
        Err(e) => {
            rec.error = Some(format!("{e:#}"));
            return rec;
        }
    };
    let first = (raw.start.as_nanos() / BIN.as_nanos()) as usize;
    let n = (cfg.duration.as_nanos() / BIN.as_nanos()) as usize;
    rec.bins = (first..first + n)
        .map(|i| raw.bins_from_epoch.get(i).copied().unwrap_or(0))
        .collect();
    let total: u64 = rec.bins.iter().sum();
    let late: u64 = rec.bins[n / 2..].iter().sum();
    let secs = cfg.duration.as_secs_f64();
    rec.goodput_mbps = total as f64 * 8.0 / secs / 1e6;
    rec.goodput_late_mbps = late as f64 * 8.0 / (secs - (n / 2) as f64 * BIN.as_secs_f64()) / 1e6;
    if let Some(rate) = link.up.rate_bps {
        rec.utilisation_pct = rec.goodput_mbps * 1e6 / rate as f64 * 100.0;
    }
    let wire = |s: &DirectionStats| s.link.bytes;
    let wire_bytes = wire(&after.up) - wire(&before.up) + wire(&after.down) - wire(&before.down);
    let read_total: u64 = raw.bins_from_epoch.iter().sum();
    if read_total > 0 {
        rec.wire_per_byte = wire_bytes as f64 / read_total as f64;
    }
    rec.rtt_ms = Spread::of(&raw.rtts_ms).map(|s| s.median).unwrap_or(0.0);
    rec.tcp_cc = raw.tcp_cc;
    rec
}

type Bins = Arc<Mutex<Vec<u64>>>;

fn count(bins: &Bins, epoch: Instant, n: usize) {
    let i = (epoch.elapsed().as_nanos() / BIN.as_nanos()) as usize;
    if let Ok(mut b) = bins.lock() {
        // Bounded: the run lasts at most 600 s + setup (6,000 bins).
        if i < 20_000 {
            if b.len() <= i {
                b.resize(i + 1, 0);
            }
            b[i] += n as u64;
        }
    }
}

fn transfer(emu: &Emulator, mode: Mode, cfg: &RunConfig) -> anyhow::Result<Raw> {
    let epoch = Instant::now();
    let bins: Bins = Arc::default();
    let (info_tx, info_rx) = std::sync::mpsc::channel::<anyhow::Result<(u16, Vec<u8>)>>();
    let sbins = bins.clone();
    let hard = cfg.duration + STEP * 2;
    let duration = cfg.duration;
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<()> {
            runtime()?.block_on(async move {
                tokio::time::timeout(hard, serve(mode, sbins, epoch, info_tx, duration))
                    .await
                    .unwrap_or(Ok(()))
            })
        })
        .context("starting the server thread")?;
    let (port, fingerprint) = match info_rx.recv_timeout(STEP) {
        Ok(Ok(i)) => i,
        Ok(Err(e)) => return Err(e.context("server setup")),
        Err(_) => bail!("server did not start"),
    };
    let addr = SocketAddr::from((emu.server().addr(), port));
    let client = emu
        .client()
        .spawn(
            move || -> anyhow::Result<(Duration, Vec<f64>, Option<String>)> {
                runtime()?.block_on(send(mode, addr, fingerprint, epoch, duration))
            },
        )
        .context("starting the client thread")?;
    let c = client
        .join()
        .map_err(|_| anyhow!("client thread panicked"))?
        .map_err(|e| anyhow!("client thread: {e}"))?;
    let s = server
        .join()
        .map_err(|_| anyhow!("server thread panicked"))?
        .map_err(|e| anyhow!("server thread: {e}"))?;
    let (start, rtts_ms, tcp_cc) = c.context("client")?;
    s.context("server")?;
    let bins_from_epoch = bins.lock().map(|b| b.clone()).unwrap_or_default();
    Ok(Raw {
        bins_from_epoch,
        start,
        rtts_ms,
        tcp_cc,
    })
}

async fn serve(
    mode: Mode,
    bins: Bins,
    epoch: Instant,
    info: std::sync::mpsc::Sender<anyhow::Result<(u16, Vec<u8>)>>,
    length: Duration,
) -> anyhow::Result<()> {
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let mut buf = vec![0u8; CHUNK];
    match mode {
        Mode::Tcp(_) => {
            let l = match tokio::net::TcpListener::bind(any).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = info.send(Err(e.into()));
                    bail!("bind");
                }
            };
            let _ = info.send(Ok((l.local_addr()?.port(), Vec::new())));
            let (mut s, _) = step("accepting the TCP connection", l.accept()).await?;
            // The client resets the connection when its time is up: an
            // error ends the count as the end of the stream does.
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                count(&bins, epoch, n);
            }
            Ok(())
        }
        Mode::Quic(cc) => {
            let id = quichub_net::tls::Identity::self_signed(&["localhost"])?;
            let quic = quichub_net::QuicConfig {
                congestion_control: cc,
                ..Default::default()
            };
            let server = match quichub_net::server::Server::bind_config(any, &id, None, &quic) {
                Ok(s) => s,
                Err(e) => {
                    let _ = info.send(Err(e));
                    bail!("bind");
                }
            };
            let _ = info.send(Ok((server.local_addr()?.port(), id.fingerprint().to_vec())));
            let pending = step("accepting the QUIC connection", async {
                server.accept().await.context("endpoint closed")
            })
            .await?;
            let conn = match quichub_net::server::establish_any(pending).await? {
                quichub_net::server::Established::Other { conn, .. } => conn,
                _ => bail!("unexpected ALPN"),
            };
            let mut rx = step("accepting the stream", conn.accept_uni()).await?;
            // The client resets the stream and closes the connection when
            // its time is up (waiting for its send buffer to drain would
            // stretch the run): either ends the count.
            // The client's RESET_STREAM and CONNECTION_CLOSE can be lost at a
            // full drop-tail queue; reading stops a second after the run's
            // end whatever happens.
            let _ = tokio::time::timeout(length + Duration::from_secs(1), async {
                while let Ok(Some(n)) = rx.read(&mut buf).await {
                    count(&bins, epoch, n);
                }
            })
            .await;
            Ok(())
        }
    }
}

/// The client: connect, then write for `duration`; returns when writing
/// started (since `epoch`), the RTT samples and TCP's controller.
async fn send(
    mode: Mode,
    addr: SocketAddr,
    fingerprint: Vec<u8>,
    epoch: Instant,
    duration: Duration,
) -> anyhow::Result<(Duration, Vec<f64>, Option<String>)> {
    let chunk = Bytes::from(vec![0x5a; CHUNK]);
    let mut rtts = Vec::new();
    let mut next_sample = Instant::now();
    match mode {
        Mode::Tcp(want) => {
            let sock = tokio::net::TcpSocket::new_v4()?;
            set_tcp_congestion(&sock, kernel_name(want))?;
            let mut s = step("TCP connect", sock.connect(addr)).await?;
            let cc = tcp_congestion(&s);
            anyhow::ensure!(
                cc.as_deref() == Some(kernel_name(want)),
                "asked the kernel for TCP {}, got {cc:?}",
                kernel_name(want)
            );
            let start = epoch.elapsed();
            let end = tokio::time::Instant::now() + duration;
            loop {
                match tokio::time::timeout_at(end, s.write_all(&chunk)).await {
                    Ok(r) => r?,
                    Err(_) => break,
                }
                if Instant::now() >= next_sample {
                    if let Some(rtt) = tcp_rtt_ms(&s) {
                        rtts.push(rtt);
                    }
                    next_sample += BIN;
                }
            }
            // Reset rather than close: a close would first drain the send
            // buffer (megabytes, seconds on a slow uplink) into the link.
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            drop(s);
            Ok((start, rtts, cc))
        }
        Mode::Quic(cc) => {
            let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
            let mut client = quichub_net::client::Client::new(
                any,
                quichub_net::tls::Verify::Fingerprints(vec![fingerprint]),
            )?;
            client.set_congestion_control(cc);
            let conn = step(
                "QUIC handshake",
                client.dial(addr, "localhost", quichub_net::server::ALPN_MQTT, false),
            )
            .await?
            .connection()
            .clone();
            let mut tx = conn.open_uni().await?;
            let start = epoch.elapsed();
            let end = tokio::time::Instant::now() + duration;
            loop {
                match tokio::time::timeout_at(end, tx.write_chunk(chunk.clone())).await {
                    Ok(r) => r?,
                    Err(_) => break,
                }
                if Instant::now() >= next_sample {
                    rtts.push(conn.rtt().as_secs_f64() * 1e3);
                    next_sample += BIN;
                }
            }
            let _ = tx.reset(0u32.into());
            conn.close(0u32.into(), b"done");
            // Let the CONNECTION_CLOSE leave before the endpoint goes.
            let _ = tokio::time::timeout(STEP, client.wait_idle()).await;
            Ok((start, rtts, None))
        }
    }
}

fn tcp_info(s: &tokio::net::TcpStream) -> Option<libc::tcp_info> {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        (rc == 0).then_some(info)
    }
}

fn tcp_rtt_ms(s: &tokio::net::TcpStream) -> Option<f64> {
    tcp_info(s).map(|i| f64::from(i.tcpi_rtt) / 1e3)
}

fn set_tcp_congestion(s: &tokio::net::TcpSocket, name: &str) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt reads `len` bytes from `name`.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!("TCP_CONGESTION {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn tcp_congestion(s: &tokio::net::TcpStream) -> Option<String> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 32];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `buf`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (rc == 0).then(|| {
        let b = &buf[..len as usize];
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    })
}

/// Summary of one (link, mode) over its repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Link.
    pub link: String,
    /// Transport.
    pub mode: String,
    /// Successful repetitions.
    pub ok: usize,
    /// Repetitions.
    pub reps: usize,
    /// Goodput, whole run, Mbit/s.
    pub goodput_mbps: Option<Spread>,
    /// Goodput, second half, Mbit/s.
    pub goodput_late_mbps: Option<Spread>,
    /// Utilisation of the uplink rate, percent.
    pub utilisation_pct: Option<Spread>,
    /// Wire bytes per application byte.
    pub wire_per_byte: Option<Spread>,
    /// Queue drops per run.
    pub queue_drops: Option<Spread>,
    /// Median sender RTT, ms.
    pub rtt_ms: Option<Spread>,
}

/// Everything a run writes.
#[derive(Debug, Serialize)]
pub struct Output {
    /// The command line's settings.
    pub quick: bool,
    /// Repetitions.
    pub reps: u32,
    /// Run settings.
    pub config: RunConfig,
    /// Links (profiles with sources).
    pub links: Vec<Profile>,
    /// Transports.
    pub modes: Vec<String>,
    /// The controllers the kernel offers TCP.
    pub kernel_available: Vec<String>,
    /// The kernel's default TCP controller (what other experiments' TCP uses).
    pub kernel_default: Option<String>,
    /// Per (link, mode).
    pub summaries: Vec<Summary>,
    /// Every run.
    pub runs: Vec<RunRecord>,
}

impl Output {
    /// Summarises `runs`.
    pub fn new(
        args: &Options,
        config: RunConfig,
        links: Vec<Profile>,
        modes: Vec<Mode>,
        runs: Vec<RunRecord>,
    ) -> Output {
        let mut summaries = Vec::new();
        for l in &links {
            for m in &modes {
                let label = m.label();
                let all: Vec<&RunRecord> = runs
                    .iter()
                    .filter(|r| r.link == l.name && r.mode == label)
                    .collect();
                let rs: Vec<&RunRecord> =
                    all.iter().copied().filter(|r| r.error.is_none()).collect();
                let sp = |f: &dyn Fn(&RunRecord) -> f64| {
                    Spread::of(&rs.iter().map(|r| f(r)).collect::<Vec<_>>())
                };
                summaries.push(Summary {
                    link: l.name.clone(),
                    mode: label,
                    ok: rs.len(),
                    reps: all.len(),
                    goodput_mbps: sp(&|r| r.goodput_mbps),
                    goodput_late_mbps: sp(&|r| r.goodput_late_mbps),
                    utilisation_pct: sp(&|r| r.utilisation_pct),
                    wire_per_byte: sp(&|r| r.wire_per_byte),
                    queue_drops: sp(&|r| r.queue_drops as f64),
                    rtt_ms: sp(&|r| r.rtt_ms),
                });
            }
        }
        let (kernel_available, kernel_default) = kernel_controllers();
        Output {
            quick: args.quick,
            reps: args.reps,
            config,
            links,
            modes: modes.iter().map(|m| m.label()).collect(),
            kernel_available,
            kernel_default,
            summaries,
            runs,
        }
    }

    /// The main table (Markdown).
    pub fn main_table(&self) -> String {
        let mut s = String::from(
            "| link | uplink Mbit/s | transport | ok/reps | goodput Mbit/s | 2nd half Mbit/s | utilisation % | wire B/B | queue drops | RTT ms |\n|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for x in &self.summaries {
            let rate = self
                .links
                .iter()
                .find(|l| l.name == x.link)
                .and_then(|l| l.up.rate_bps)
                .map(|r| format!("{:.2}", r as f64 / 1e6))
                .unwrap_or_else(|| "–".into());
            s += &format!(
                "| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} |\n",
                x.link,
                rate,
                x.mode,
                x.ok,
                x.reps,
                crate::common::stats::show(&x.goodput_mbps, 2),
                crate::common::stats::show(&x.goodput_late_mbps, 2),
                crate::common::stats::show(&x.utilisation_pct, 1),
                crate::common::stats::show(&x.wire_per_byte, 3),
                crate::common::stats::show(&x.queue_drops, 0),
                crate::common::stats::show(&x.rtt_ms, 1),
            );
        }
        s
    }

    /// Writes results.json, report.md and the plots into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(self)?,
        )?;
        let mut plots = Vec::new();
        let cats: Vec<String> = self.links.iter().map(|l| l.name.clone()).collect();
        let series: Vec<CatSeries> = self
            .modes
            .iter()
            .enumerate()
            .map(|(i, m)| CatSeries {
                label: m.clone(),
                color: COLORS[i % COLORS.len()].into(),
                hollow: false,
                values: self
                    .links
                    .iter()
                    .map(|l| {
                        self.summaries
                            .iter()
                            .find(|x| x.link == l.name && &x.mode == m)
                            .and_then(|x| x.utilisation_pct.as_ref())
                            .map(|s| (s.median, s.min, s.max))
                    })
                    .collect(),
            })
            .collect();
        std::fs::write(
            dir.join("utilisation.svg"),
            category_chart(
                "Uplink utilisation by one bulk transfer",
                &format!(
                    "application bytes read by the server / link rate; median and min–max of {} runs of {:.0} s",
                    self.reps,
                    self.config.duration.as_secs_f64()
                ),
                "link",
                &cats,
                "utilisation (%)",
                &series,
            ),
        )?;
        plots.push("utilisation.svg".to_string());
        for l in &self.links {
            let series: Vec<Series> = self
                .modes
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let r = self
                        .runs
                        .iter()
                        .find(|r| r.link == l.name && &r.mode == m && r.error.is_none())?;
                    Some(Series {
                        label: m.clone(),
                        color: COLORS[i % COLORS.len()].into(),
                        dashed: false,
                        points: r
                            .bins
                            .iter()
                            .enumerate()
                            .map(|(k, &b)| {
                                (
                                    (k + 1) as f64 * BIN.as_secs_f64(),
                                    b as f64 * 8.0 / BIN.as_secs_f64() / 1e6,
                                )
                            })
                            .collect(),
                        band: Vec::new(),
                    })
                })
                .collect();
            if series.is_empty() {
                continue;
            }
            let name = format!("goodput-{}.svg", l.name);
            std::fs::write(
                dir.join(&name),
                line_chart(
                    &format!("Goodput over time on {}", l.name),
                    &format!(
                        "application bytes read per 100 ms, first repetition; uplink {}",
                        l.up.rate_bps
                            .map(|r| format!("{:.2} Mbit/s", r as f64 / 1e6))
                            .unwrap_or_else(|| "unlimited".into())
                    ),
                    "time since the first write (s)",
                    "goodput (Mbit/s)",
                    &series,
                ),
            )?;
            plots.push(name);
        }
        let mut md = String::new();
        md += "# QUIC and TCP on rate-limited uplinks (`quichub-lab uplink`)\n\n";
        md += &format!(
            "One bulk transfer per run, client → server across the emulated link, {:.1} s per run, {} repetitions, a fresh emulator per run. \
             TCP is the kernel's with each controller set on its socket (TCP_CONGESTION; this kernel offers {}, its default is {}); QUIC is quinn with each controller. \
             Goodput: application bytes the server read in the sending window, over its length; `2nd half`: the last half only (after slow start). \
             Utilisation: goodput over the link's uplink rate (which counts IP bytes, so 100 % is out of reach: headers take 3–5 %). \
             Wire B/B: IP bytes on the link (both directions) per application byte read. RTT: median of the sender's smoothed RTT sampled every 100 ms (quinn's estimate; TCP_INFO). \
             Figures: median [min–max].\n\n",
            self.config.duration.as_secs_f64(),
            self.reps,
            self.kernel_available.join(", "),
            self.kernel_default.as_deref().unwrap_or("unknown"),
        );
        md += &self.main_table();
        md += "\n## Links\n\n";
        for l in &self.links {
            md += &format!("- `{}`: {} ({})\n", l.name, l.describe(), l.source);
        }
        md += "\n## Plots\n\n";
        for p in &plots {
            md += &format!("![{p}]({p})\n");
        }
        std::fs::write(dir.join("report.md"), md)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_with_added_loss() {
        let p = link("5g-loss1").unwrap();
        assert_eq!(p.name, "5g-loss1");
        assert_eq!(p.up.loss, 0.01);
        assert_eq!(p.down.loss, 0.01);
        assert_eq!(p.up.rate_bps, Profile::five_g().up.rate_bps);
        assert_eq!(link("lte").unwrap().name, "lte");
        assert!(link("lossy-2").is_ok(), "named profiles win");
        for bad in ["5g-lossx", "5g-loss0", "5g-loss70", "mars-loss1", "mars"] {
            assert!(link(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes_and_labels() {
        let m = Mode::all(&CongestionControl::ALL);
        let labels: Vec<String> = m.iter().map(|m| m.label()).collect();
        assert_eq!(
            labels,
            [
                "tcp-cubic",
                "tcp-newreno",
                "tcp-bbr",
                "quic-cubic",
                "quic-newreno",
                "quic-bbr"
            ]
        );
    }
}
