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

use crate::rt::{runtime, step, STEP};
use crate::stats::Spread;
use crate::svg::{category_chart, line_chart, CatSeries, Series, COLORS};
use crate::LabArgs;

/// Width of a goodput bin.
pub const BIN: Duration = Duration::from_millis(100);
/// Bytes handed to the transport per write.
const CHUNK: usize = 64 * 1024;

/// Options of `lab uplink`.
#[derive(clap::Args, Debug, Clone)]
pub struct UplinkArgs {
    /// Links, comma-separated netem profile names (default
    /// 5g,lte,wifi,satellite,lossy-1, or lte,lossy-1 with --quick).
    #[arg(long)]
    pub links: Option<String>,
    /// Seconds of sending per run (default 10, or 2 with --quick).
    #[arg(long)]
    pub duration: Option<f64>,
}

/// One transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Mode {
    /// The kernel's TCP (its default controller, named in the report).
    Tcp,
    /// quinn with this controller.
    Quic(CongestionControl),
}

impl Mode {
    /// Table label.
    pub fn label(self) -> String {
        match self {
            Mode::Tcp => "tcp".into(),
            Mode::Quic(cc) => format!("quic-{cc}"),
        }
    }

    /// TCP and QUIC with `ccs`.
    pub fn all(ccs: &[CongestionControl]) -> Vec<Mode> {
        std::iter::once(Mode::Tcp)
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
pub fn links(args: &LabArgs, u: &UplinkArgs) -> anyhow::Result<Vec<Profile>> {
    let names = u.links.clone().unwrap_or_else(|| {
        if args.quick {
            "lte,lossy-1"
        } else {
            "5g,lte,wifi,satellite,lossy-1"
        }
        .into()
    });
    let links = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| Profile::named(n).map_err(anyhow::Error::from))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!links.is_empty(), "no links");
    Ok(links)
}

/// The controllers compared: `--cc` alone when given, else all three.
pub fn controllers(args: &LabArgs) -> Vec<CongestionControl> {
    match args.cc {
        Some(cc) => vec![cc],
        None => CongestionControl::ALL.to_vec(),
    }
}

/// Runs the experiment; returns its directory and whether every run succeeded.
pub fn run(args: &LabArgs, u: &UplinkArgs) -> anyhow::Result<(PathBuf, bool)> {
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
    let modes = Mode::all(&controllers(args));
    let dir = crate::result_dir(&args.out, "uplink")?;
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
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<()> {
            runtime()?.block_on(async move {
                tokio::time::timeout(hard, serve(mode, sbins, epoch, info_tx))
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
    let duration = cfg.duration;
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
) -> anyhow::Result<()> {
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let mut buf = vec![0u8; CHUNK];
    match mode {
        Mode::Tcp => {
            let l = match tokio::net::TcpListener::bind(any).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = info.send(Err(e.into()));
                    bail!("bind");
                }
            };
            let _ = info.send(Ok((l.local_addr()?.port(), Vec::new())));
            let (mut s, _) = step("accepting the TCP connection", l.accept()).await?;
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok(());
                }
                count(&bins, epoch, n);
            }
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
            while let Ok(Some(n)) = rx.read(&mut buf).await {
                count(&bins, epoch, n);
            }
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
        Mode::Tcp => {
            let mut s = step("TCP connect", tokio::net::TcpStream::connect(addr)).await?;
            let cc = tcp_congestion(&s);
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
            let _ = s.shutdown().await;
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
    /// The kernel's TCP controller as the runs saw it.
    pub tcp_cc: Option<String>,
    /// Per (link, mode).
    pub summaries: Vec<Summary>,
    /// Every run.
    pub runs: Vec<RunRecord>,
}

impl Output {
    /// Summarises `runs`.
    pub fn new(
        args: &LabArgs,
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
        let tcp_cc = runs.iter().find_map(|r| r.tcp_cc.clone());
        Output {
            quick: args.quick,
            reps: args.reps,
            config,
            links,
            modes: modes.iter().map(|m| m.label()).collect(),
            tcp_cc,
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
                crate::stats::show(&x.goodput_mbps, 2),
                crate::stats::show(&x.goodput_late_mbps, 2),
                crate::stats::show(&x.utilisation_pct, 1),
                crate::stats::show(&x.wire_per_byte, 3),
                crate::stats::show(&x.queue_drops, 0),
                crate::stats::show(&x.rtt_ms, 1),
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
        md += "# QUIC and TCP on rate-limited uplinks (`quichub lab uplink`)\n\n";
        md += &format!(
            "One bulk transfer per run, client → server across the emulated link, {:.1} s per run, {} repetitions, a fresh emulator per run. \
             TCP is the kernel's ({}); QUIC is quinn with each controller. \
             Goodput: application bytes the server read in the sending window, over its length; `2nd half`: the last half only (after slow start). \
             Utilisation: goodput over the link's uplink rate (which counts IP bytes, so 100 % is out of reach: headers take 3–5 %). \
             Wire B/B: IP bytes on the link (both directions) per application byte read. RTT: median of the sender's smoothed RTT sampled every 100 ms (quinn's estimate; TCP_INFO). \
             Figures: median [min–max].\n\n",
            self.config.duration.as_secs_f64(),
            self.reps,
            self.tcp_cc.as_deref().unwrap_or("unknown controller"),
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
