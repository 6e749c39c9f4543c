//! `quichub-lab live-video`: the same live 720p 8 Mbit/s H.264 video through
//! quichub's MoQ relay and through a real RTMP ingest + HLS delivery server
//! (Debian's nginx with `libnginx-mod-rtmp`), after E. P. Estupiñan-Cuesta,
//! J. C. Martínez, W. A. Roldán-Pineda, "Evaluation of Throughput in Live
//! Video Streaming: TCP vs. QUIC as a Proof of Concept", Visión Investigadora
//! 19(1), 2025.
//!
//! Topology (the emulator has two namespaces): the publisher, the relay (or
//! nginx) and the "local" subscriber sit in the server namespace, joined by
//! its loopback (the paper's client "local in the cloud"); the "remote"
//! subscriber sits in the client namespace, across the emulated link. The
//! publishing side never crosses the link, so each run's link carries only
//! the remote subscriber's traffic, which the emulator's capture counts.
//!
//! - MoQ: this process → quichub's publisher (`quichub pub --no-pace`'s
//!   library, in a child process: `quichub-lab live-video --moq pub`) →
//!   quichub's relay (the hub, on a thread of this process) → two players
//!   (`quichub sub --output -`'s, `--moq sub` children) whose fMP4 output
//!   this process reads.
//! - RTMP + HLS: this process → `ffmpeg -c copy -f flv rtmp://…` → nginx
//!   (RTMP ingest, HLS packaging) → two players in this process fetching the
//!   playlist and segments over HTTP/1.1 keep-alive as RFC 8216 §6.3 says.
//!
//! One clock: this process is the encoder. The video is encoded once by
//! ffmpeg (x264, 8 Mbit/s CBR, 1 s GOP, no B frames) to fragmented MP4, one
//! fragment per frame, and written into the publisher's standard input in
//! real time: frame `i` is released at `T0 + pts_i`, its *encode time*.
//! Arrival is when this process holds the whole frame: read from `sub`'s
//! output (MoQ) or, for HLS, when the segment holding it is complete.
//! Frames are recognised by a hash of their slice NAL units, which both
//! paths carry unchanged.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use quichub_media::{Demuxer, Event, Limits};
use quichub_netem::emulator::{Emulator, EmulatorConfig, PacketRecord};
use quichub_netem::profile::Profile;

use crate::common::Options;

pub use types::{
    Protocol, Role, RunConfig, RunRecord, Source, SrcFrame, SubRecord, BITRATE, FPS, HTTP_PORT,
    MOQ_PORT, RTMP_PORT, STALL_MS,
};

/// Options of `lab live-video`.
#[derive(clap::Args, Debug, Clone)]
pub struct LiveVideoArgs {
    /// Links, comma-separated: `clean` (no impairment) or netem profile names
    /// (default clean,lte,5g,wifi,lossy-1,satellite; clean,lossy-1 with --quick).
    #[arg(long)]
    pub links: Option<String>,
    /// Protocols, comma-separated: moq, rtmp-hls-1s, rtmp-hls-default
    /// (default all three; moq,rtmp-hls-1s with --quick).
    #[arg(long)]
    pub protocols: Option<String>,
    /// Seconds of video published per run (default 30, or 8 with --quick).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds after the stream starts when the subscribers join (default 8,
    /// or 2 with --quick).
    #[arg(long)]
    pub join: Option<f64>,
    /// Internal: run quichub's MoQ publisher (`pub`: fMP4 from stdin) or
    /// player (`sub`: fragmented MP4 to stdout, `--duration` seconds) of one
    /// run; the experiment runs them as processes of their own, as it runs
    /// the RTMP publisher and the HLS players.
    #[arg(long, value_enum, hide = true)]
    pub moq: Option<MoqClient>,
    /// Internal (--moq): the relay's URL.
    #[arg(long, hide = true)]
    pub url: Option<String>,
    /// Internal (--moq): the broadcast.
    #[arg(long, hide = true)]
    pub broadcast: Option<String>,
    /// Internal (--moq): the relay certificate's SHA-256 (hex).
    #[arg(long, hide = true)]
    pub fingerprint: Option<String>,
}

/// quichub's MoQ clients of a run (`--moq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MoqClient {
    /// The publisher: `quichub pub URL --broadcast B --input - --no-pace`.
    Pub,
    /// The player: `quichub sub URL --broadcast B --output - --audio none`.
    Sub,
}

/// Runs the MoQ client `lv.moq` names (a child process of the experiment);
/// the exit code is 0 when it succeeded.
pub fn moq_client(lv: &LiveVideoArgs) -> anyhow::Result<i32> {
    let role = lv.moq.context("no --moq")?;
    let url = lv.url.clone().context("--moq needs --url")?;
    let broadcast = lv.broadcast.clone().context("--moq needs --broadcast")?;
    let verify = crate::common::moq_media::verify(lv.fingerprint.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match role {
            MoqClient::Pub => {
                let mut opts = quichub_client::media::MediaPublishOptions::new(broadcast);
                opts.pace = false;
                crate::common::moq_media::publish(
                    &url,
                    verify,
                    &opts,
                    std::io::stdin(),
                    std::future::pending(),
                )
                .await
            }
            MoqClient::Sub => {
                let opts = quichub_client::media::MediaSubscribeOptions {
                    broadcast,
                    audio: Some("none".into()),
                    rendezvous_ms: 10_000,
                    ..Default::default()
                };
                let limit = std::time::Duration::from_secs_f64(lv.duration.unwrap_or(86_400.0));
                crate::common::moq_media::subscribe(
                    &url,
                    verify,
                    &opts,
                    tokio::io::stdout(),
                    tokio::time::sleep(limit),
                )
                .await
            }
        }
    })?;
    Ok(0)
}

/// Hash of the slice NAL units (types 1–5) of an AVCC frame.
pub fn slice_hash(data: &[u8], len_size: usize) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut p = 0;
    let ls = len_size.clamp(1, 4);
    while p + ls <= data.len() {
        let n = data[p..p + ls]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | b as usize);
        p += ls;
        let end = (p + n).min(data.len());
        let nal = &data[p..end];
        if let Some(&b) = nal.first() {
            if (1..=5).contains(&(b & 0x1f)) {
                nal.hash(&mut h);
            }
        }
        p = end;
    }
    h.finish()
}

impl Source {
    /// Encodes `secs` seconds of 720p30 H.264 at 8 Mbit/s with ffmpeg into `path`
    /// and splits it.
    pub fn make(path: &Path, secs: f64) -> anyhow::Result<Source> {
        let out = Command::new("ffmpeg")
            .args([
                "-hide_banner",
                "-loglevel",
                "error",
                "-y",
                "-f",
                "lavfi",
                "-i",
            ])
            .arg(format!("testsrc2=size=1280x720:rate={FPS}"))
            .args(["-t", &format!("{secs:.3}")])
            .args([
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                "-tune",
                "zerolatency",
                "-bf",
                "0",
                "-b:v",
                "8M",
                "-minrate",
                "8M",
                "-maxrate",
                "8M",
                "-bufsize",
                "4M",
                "-x264-params",
                "nal-hrd=cbr",
                "-g",
                &FPS.to_string(),
                "-pix_fmt",
                "yuv420p",
                "-f",
                "mp4",
                "-movflags",
                "cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame",
            ])
            .arg(path)
            .stdin(Stdio::null())
            .output()
            .context("running ffmpeg to make the source video (scripts/install-media-tools.sh)")?;
        anyhow::ensure!(
            out.status.success(),
            "ffmpeg failed making the source: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Source::split(std::fs::read(path)?)
    }

    /// Splits fragmented MP4 (one fragment per frame) into the init segment and
    /// one chunk per frame, and indexes the frames.
    pub fn split(data: Vec<u8>) -> anyhow::Result<Source> {
        let mut boxes = Vec::new();
        let mut p = 0usize;
        while p < data.len() {
            let (kind, size) = quichub_media::fmp4::peek_box(&data[p..])
                .with_context(|| format!("truncated box at byte {p}"))?;
            anyhow::ensure!(size >= 8, "bad box size at byte {p}");
            boxes.push((kind, p..p + size as usize));
            p += size as usize;
        }
        let first_moof = boxes
            .iter()
            .position(|(k, _)| k == b"moof")
            .context("no moof: not fragmented MP4")?;
        let init = 0..boxes[first_moof].1.start;
        let mut chunks: Vec<std::ops::Range<usize>> = Vec::new();
        for (k, r) in &boxes[first_moof..] {
            if k == b"moof" {
                chunks.push(r.clone());
            } else if let Some(last) = chunks.last_mut() {
                last.end = r.end;
            }
        }
        let events = quichub_media::fmp4::demux_all(&data)?;
        let mut len_size = 4;
        let mut frames = Vec::new();
        let mut by_hash = HashMap::new();
        let mut base = None;
        for e in events {
            match e {
                Event::Tracks(t) => {
                    if let Some(v) = t.first() {
                        len_size = v.nal_length_size as usize;
                    }
                }
                Event::Frame(f) => {
                    let b = *base.get_or_insert(f.pts);
                    let i = frames.len();
                    by_hash.insert(slice_hash(&f.data, len_size), i);
                    frames.push(SrcFrame {
                        pts_us: f.pts - b,
                        keyframe: f.keyframe,
                        size: f.data.len(),
                    });
                }
            }
        }
        anyhow::ensure!(
            frames.len() == chunks.len() && !frames.is_empty(),
            "{} frames in {} fragments: the source must have one fragment per frame",
            frames.len(),
            chunks.len()
        );
        anyhow::ensure!(
            by_hash.len() == frames.len(),
            "two frames of the source have the same slices"
        );
        let span = frames.last().map_or(1, |f| f.pts_us) as f64 / 1e6 + 1.0 / FPS as f64;
        let bytes: usize = frames.iter().map(|f| f.size).sum();
        Ok(Source {
            data,
            init,
            chunks,
            frames,
            by_hash,
            bitrate_bps: bytes as f64 * 8.0 / span,
        })
    }

    fn due(&self, i: usize) -> Duration {
        Duration::from_micros(self.frames[i].pts_us.max(0) as u64)
    }
}

/// Per subscriber: what arrived, when.
struct Arrival {
    t: Instant,
    hash: u64,
}

/// The links of the experiment.
pub fn links(args: &Options, lv: &LiveVideoArgs) -> anyhow::Result<Vec<Profile>> {
    let names = lv.links.clone().unwrap_or_else(|| {
        if args.quick {
            "clean,lossy-1"
        } else {
            "clean,lte,5g,wifi,lossy-1,satellite"
        }
        .into()
    });
    let mut v = Vec::new();
    for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if n == "clean" {
            v.push(Profile {
                name: "clean".into(),
                source: "no impairment (the emulator's own forwarding only)".into(),
                ..Profile::unimpaired()
            });
        } else {
            v.push(Profile::named(n)?);
        }
    }
    anyhow::ensure!(!v.is_empty(), "no links");
    Ok(v)
}

/// The protocols of the experiment.
pub fn protocols(args: &Options, lv: &LiveVideoArgs) -> anyhow::Result<Vec<Protocol>> {
    match &lv.protocols {
        None if args.quick => Ok(vec![Protocol::Moq, Protocol::HlsLow]),
        None => Ok(Protocol::ALL.to_vec()),
        Some(s) => s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Protocol::parse)
            .collect(),
    }
}

/// The run's timing from the arguments.
pub fn run_config(args: &Options, lv: &LiveVideoArgs) -> anyhow::Result<RunConfig> {
    let duration_s = lv.duration.unwrap_or(if args.quick { 8.0 } else { 30.0 });
    let join_s = lv.join.unwrap_or(if args.quick { 2.0 } else { 8.0 });
    anyhow::ensure!(
        (2.0..=600.0).contains(&duration_s),
        "--duration must be in [2, 600] s"
    );
    anyhow::ensure!(
        join_s >= 0.0 && join_s < duration_s - 1.0,
        "--join must be at least 1 s before the end of the stream"
    );
    Ok(RunConfig { duration_s, join_s })
}

/// What the experiment needs besides root: ffmpeg, nginx and its RTMP module.
pub fn missing_tools() -> Option<String> {
    let mut miss = Vec::new();
    if Command::new("ffmpeg")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        miss.push("ffmpeg");
    }
    if !Path::new(NGINX).exists() {
        miss.push("nginx (/usr/sbin/nginx)");
    }
    if !Path::new(RTMP_MODULE).exists() {
        miss.push("libnginx-mod-rtmp (ngx_rtmp_module.so)");
    }
    if miss.is_empty() {
        None
    } else {
        Some(format!(
            "{} missing: run scripts/install-media-tools.sh",
            miss.join(", ")
        ))
    }
}

const NGINX: &str = "/usr/sbin/nginx";
const RTMP_MODULE: &str = "/usr/lib/nginx/modules/ngx_rtmp_module.so";

/// nginx's configuration: RTMP ingest with two HLS applications (`ll`,
/// low-latency tuned; `def`, the module's defaults) and HTTP serving them.
pub fn nginx_conf(dir: &Path, addr: Ipv4Addr) -> String {
    let d = dir.display();
    format!(
        r#"load_module {RTMP_MODULE};
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
rtmp {{
  server {{
    listen {addr}:{RTMP_PORT};
    chunk_size 4096;
    application ll {{
      live on;
      wait_key on;
      hls on;
      hls_path {d}/hls-ll;
      hls_fragment 1s;
      hls_playlist_length 4s;
    }}
    application def {{
      live on;
      hls on;
      hls_path {d}/hls-def;
    }}
  }}
}}
http {{
  access_log off;
  client_body_temp_path {d}/tmp-body;
  proxy_temp_path {d}/tmp-proxy;
  fastcgi_temp_path {d}/tmp-fastcgi;
  uwsgi_temp_path {d}/tmp-uwsgi;
  scgi_temp_path {d}/tmp-scgi;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  server {{
    listen {addr}:{HTTP_PORT};
    location /ll/ {{
      alias {d}/hls-ll/;
      types {{ application/vnd.apple.mpegurl m3u8; video/mp2t ts; }}
      add_header Cache-Control no-cache;
    }}
    location /def/ {{
      alias {d}/hls-def/;
      types {{ application/vnd.apple.mpegurl m3u8; video/mp2t ts; }}
      add_header Cache-Control no-cache;
    }}
  }}
}}
"#
    )
}

/// A child process killed (by its own handle) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The servers of one link: nginx and the relay, in the server namespace.
struct Servers {
    _nginx: Proc,
    _relay: Relay,
    fingerprint: String,
    dir: PathBuf,
}

/// quichub's relay as `quichub relay --bind ADDR:MOQ_PORT --metrics off
/// --mqtt off --mqtt-tls off --http off --data-dir off --allow-anonymous
/// true` runs it (the hub, on a runtime with a worker per CPU), on a thread
/// of the server namespace. It runs in this process: nothing of the relay's
/// own is measured, only what crosses the link. Stopped when dropped.
struct Relay {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread:
        Option<std::thread::JoinHandle<Result<anyhow::Result<()>, quichub_netem::sys::SysError>>>,
}

impl Relay {
    /// Starts the relay on `addr`:[`MOQ_PORT`]; returns it and its
    /// certificate's SHA-256.
    fn start(emu: &Emulator, addr: Ipv4Addr) -> anyhow::Result<(Relay, String)> {
        let (fp_tx, fp_rx) = std::sync::mpsc::channel::<anyhow::Result<String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = emu
            .server()
            .spawn(move || -> anyhow::Result<()> {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let mut config = quichub_hub::Config::default();
                    config.quic.bind = format!("{addr}:{MOQ_PORT}");
                    config.mqtt.tcp = "off".into();
                    config.mqtt.tls = "off".into();
                    config.http.address = "off".into();
                    config.metrics.address = "off".into();
                    config.store.data_dir = Some("off".into());
                    config.auth.allow_anonymous = Some(true);
                    match quichub_hub::Hub::start(config).await {
                        Ok(hub) => {
                            let _ = fp_tx.send(Ok(hub.fingerprint()));
                            let _ = stop_rx.await;
                            hub.server().close(0, b"done");
                            Ok(())
                        }
                        Err(e) => {
                            let _ = fp_tx.send(Err(anyhow::anyhow!("{e:#}")));
                            bail!("relay setup failed")
                        }
                    }
                })
            })
            .context("starting the relay thread")?;
        let relay = Relay {
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        let fingerprint = match fp_rx.recv_timeout(Duration::from_secs(15)) {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(e.context("starting quichub's relay")),
            Err(_) => bail!("quichub's relay did not start"),
        };
        Ok((relay, fingerprint))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start_servers(emu: &Emulator, dir: &Path) -> anyhow::Result<Servers> {
    let addr = emu.server().addr();
    std::fs::create_dir_all(dir)?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir, addr))?;
    let nginx = Proc(
        emu.server()
            .command(NGINX)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nginx")?,
    );
    let (relay, fingerprint) = Relay::start(emu, addr)?;
    // nginx: wait until its HTTP port answers (from the server namespace).
    let ready = emu
        .server()
        .spawn(move || {
            let a = SocketAddr::from((addr, HTTP_PORT));
            let r = SocketAddr::from((addr, RTMP_PORT));
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok()
                    && TcpStream::connect_timeout(&r, Duration::from_millis(200)).is_ok()
                {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            false
        })?
        .join()
        .map_err(|_| anyhow::anyhow!("nginx probe panicked"))??;
    if !ready {
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        bail!("nginx did not open its ports: {log}");
    }
    Ok(Servers {
        _nginx: nginx,
        _relay: relay,
        fingerprint,
        dir: dir.to_path_buf(),
    })
}

/// Runs the experiment: `quichub` is the binary to run the MoQ publisher
/// and players with (`quichub-lab`, `--moq`). Returns the result directory
/// and whether every run succeeded.
pub fn run(args: &Options, lv: &LiveVideoArgs, quichub: &Path) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(why) = quichub_netem::privileges::missing() {
        bail!(
            "the link emulator cannot run: {}",
            quichub_netem::privileges::explain(&why)
        );
    }
    if let Some(why) = missing_tools() {
        bail!("{why}");
    }
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    let cfg = run_config(args, lv)?;
    let links = links(args, lv)?;
    let protos = protocols(args, lv)?;
    anyhow::ensure!(!protos.is_empty(), "no protocols");
    let dir = crate::common::result_dir(&args.out, "live-video")?;
    let tmp = std::env::temp_dir().join(format!("quichub-live-video-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let result = (|| -> anyhow::Result<(report::Output, bool)> {
        eprintln!(
            "encoding {:.0} s of 720p30 H.264 at 8 Mbit/s",
            cfg.duration_s
        );
        let src = Arc::new(Source::make(&tmp.join("source.mp4"), cfg.duration_s)?);
        eprintln!(
            "source: {} frames, {:.2} Mbit/s",
            src.frames.len(),
            src.bitrate_bps / 1e6
        );
        let mut runs = Vec::new();
        let total = links.len() * protos.len() * args.reps as usize;
        let mut n = 0;
        for (li, link) in links.iter().enumerate() {
            eprintln!("link {}: {}", link.name, link.describe());
            let emu = Emulator::start(EmulatorConfig::new(link.clone()))
                .with_context(|| format!("starting the emulator for {}", link.name))?;
            let servers = start_servers(&emu, &tmp.join(format!("srv{li}")))?;
            for rep in 0..args.reps {
                for &p in &protos {
                    n += 1;
                    let name = format!("r{n}");
                    let rec = match run_once(&emu, &servers, quichub, &src, p, &cfg, &name) {
                        Ok(mut r) => {
                            r.link = link.name.clone();
                            r.rep = rep;
                            r
                        }
                        Err(e) => RunRecord {
                            link: link.name.clone(),
                            protocol: p.label(),
                            rep,
                            frames_fed: 0,
                            feed_late_max_ms: 0.0,
                            capture_missed: 0,
                            subs: Vec::new(),
                            error: Some(format!("{e:#}")),
                        },
                    };
                    eprintln!("  [{n}/{total}] {}", rec.one_line());
                    runs.push(rec);
                }
            }
            drop(servers);
            emu.shutdown();
        }
        let ok = runs
            .iter()
            .all(|r| r.error.is_none() && r.subs.iter().all(|s| s.error.is_none()));
        let out = report::Output::new(args, cfg, links.clone(), &protos, &src, runs);
        Ok((out, ok))
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    let (out, ok) = result?;
    out.write(&dir)?;
    println!("{}", out.main_table());
    Ok((dir, ok))
}

/// Sleeps until `t` (returns at once when it has passed).
fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn run_once(
    emu: &Emulator,
    servers: &Servers,
    quichub: &Path,
    src: &Arc<Source>,
    proto: Protocol,
    cfg: &RunConfig,
    name: &str,
) -> anyhow::Result<RunRecord> {
    let addr = emu.server().addr();
    let moq_url = format!("moqt://{addr}:{MOQ_PORT}/");
    let broadcast = format!("live/{name}");
    // The publisher.
    let mut publisher = match proto {
        Protocol::Moq => emu
            .server()
            .command(quichub)
            .args(["live-video", "--moq", "pub", "--url", &moq_url])
            .args(["--broadcast", &broadcast])
            .args(["--fingerprint", &servers.fingerprint])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting quichub's MoQ publisher")?,
        Protocol::HlsLow | Protocol::HlsDefault => emu
            .server()
            .command("ffmpeg")
            .args(["-hide_banner", "-loglevel", "error", "-nostdin"])
            // Low-latency input: probe no more than the init segment says
            // (`-fflags nobuffer` would also cut latency, but discards the
            // frames read while probing: the stream's first GOP).
            .args(["-probesize", "32", "-analyzeduration", "0"])
            .args(["-f", "mp4", "-i", "pipe:0", "-c", "copy", "-f", "flv"])
            .arg(format!("rtmp://{addr}:{RTMP_PORT}/{}/{name}", proto.app()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting ffmpeg (RTMP publisher)")?,
    };
    let pub_err = publisher.stderr.take().context("publisher stderr")?;
    let pub_log = Arc::new(Mutex::new(String::new()));
    {
        let log = pub_log.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(pub_err)
                .take(64 * 1024)
                .read_to_string(&mut s);
            if let Ok(mut l) = log.lock() {
                *l = s;
            }
        });
    }
    let mut publisher = Proc(publisher);
    let stdin = publisher.0.stdin.take().context("publisher stdin")?;

    emu.start_capture();
    let t0 = Instant::now() + Duration::from_millis(300);
    let feeder = {
        let src = src.clone();
        std::thread::spawn(move || feed(stdin, &src, t0))
    };
    let join_at = t0 + Duration::from_secs_f64(cfg.join_s);
    let end = t0 + Duration::from_secs_f64(cfg.duration_s);
    let drain = match proto {
        Protocol::Moq => Duration::from_secs(3),
        Protocol::HlsLow => Duration::from_secs(5),
        Protocol::HlsDefault => Duration::from_secs(14),
    };
    let deadline = end + drain;
    sleep_until(join_at);
    let last_hash = {
        let last = src.frames.len() - 1;
        *src.by_hash
            .iter()
            .find(|(_, &i)| i == last)
            .map(|(h, _)| h)
            .unwrap()
    };
    let mut handles = Vec::new();
    for role in [Role::Local, Role::Remote] {
        let ns = match role {
            Role::Local => emu.server(),
            Role::Remote => emu.client(),
        };
        let h: std::thread::JoinHandle<Result<SubOut, String>> = match proto {
            Protocol::Moq => {
                let join = Instant::now();
                let child = ns
                    .command(quichub)
                    .args(["live-video", "--moq", "sub", "--url", &moq_url])
                    .args(["--broadcast", &broadcast])
                    .args(["--fingerprint", &servers.fingerprint])
                    .args([
                        "--duration",
                        &format!("{}", (deadline - join).as_secs() + 2),
                    ])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting quichub's MoQ player")?;
                std::thread::spawn(move || moq_reader(Proc(child), join, deadline, last_hash))
            }
            Protocol::HlsLow | Protocol::HlsDefault => {
                let path = format!("/{}/{name}.m3u8", proto.app());
                let server = SocketAddr::from((addr, HTTP_PORT));
                let h = ns.spawn(move || hls_player(server, &path, deadline, last_hash))?;
                std::thread::spawn(move || match h.join() {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => Err(format!("entering the namespace: {e}")),
                    Err(_) => Err("player panicked".into()),
                })
            }
        };
        handles.push((role, h));
    }
    let (fed, late) = feeder
        .join()
        .map_err(|_| anyhow::anyhow!("feeder panicked"))?;
    let mut subs_out = Vec::new();
    for (role, h) in handles {
        let r = h
            .join()
            .unwrap_or_else(|_| Err("subscriber thread panicked".into()));
        subs_out.push((role, r));
    }
    // Let the publisher end on its own (end of input), then stop it.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Ok(Some(_)) = publisher.0.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(publisher);
    let cap = emu.stop_capture();
    let epoch = emu.epoch();
    let t0_us = t0.saturating_duration_since(epoch).as_micros() as i64;
    let flow = |p: &PacketRecord| match proto {
        Protocol::Moq => p.proto == 17 && (p.src_port == MOQ_PORT || p.dst_port == MOQ_PORT),
        _ => p.proto == 6 && (p.src_port == HTTP_PORT || p.dst_port == HTTP_PORT),
    };
    let pkts: Vec<&PacketRecord> = cap.packets.iter().filter(|p| flow(p)).collect();
    let mut subs = Vec::new();
    for (role, r) in subs_out {
        let mut s = match r {
            Ok(out) => analyse(src, t0, &out, cfg),
            Err(e) => SubRecord {
                error: Some(e),
                ..Default::default()
            },
        };
        s.role = role.label();
        if role == Role::Remote && s.error.is_none() {
            wire(&mut s, &pkts, t0_us, cfg);
        }
        subs.push(s);
    }
    let mut error = None;
    if let Err(e) = &fed {
        let log = pub_log.lock().map(|l| l.clone()).unwrap_or_default();
        error = Some(format!("feeding the publisher: {e}; its log: {log}"));
    }
    let _ = &servers.dir;
    Ok(RunRecord {
        link: String::new(),
        protocol: proto.label(),
        rep: 0,
        frames_fed: fed.as_ref().copied().unwrap_or(0),
        feed_late_max_ms: late,
        capture_missed: cap.missed,
        subs,
        error,
    })
}

/// Writes the source into the publisher, frame `i` at `t0 + pts_i`.
/// Returns the frames written and the latest a write finished after its due
/// time, ms.
fn feed(
    mut w: std::process::ChildStdin,
    src: &Source,
    t0: Instant,
) -> (Result<usize, String>, f64) {
    let mut late: f64 = 0.0;
    sleep_until(t0);
    if let Err(e) = w.write_all(&src.data[src.init.clone()]) {
        return (Err(e.to_string()), late);
    }
    for (i, ch) in src.chunks.iter().enumerate() {
        let due = t0 + src.due(i);
        sleep_until(due);
        if let Err(e) = w.write_all(&src.data[ch.clone()]) {
            return (Err(format!("frame {i}: {e}")), late);
        }
        late = late.max(Instant::now().saturating_duration_since(due).as_secs_f64() * 1e3);
    }
    drop(w);
    (Ok(src.chunks.len()), late)
}

/// What a subscriber took in.
struct SubOut {
    join: Instant,
    arrivals: Vec<Arrival>,
    playlist_loads: usize,
    segments: usize,
}

/// Reads `quichub sub`'s fMP4 output, noting when each frame is complete.
fn moq_reader(
    mut child: Proc,
    join: Instant,
    deadline: Instant,
    last: u64,
) -> Result<SubOut, String> {
    let mut out = child.0.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut demux = quichub_media::fmp4::Fmp4Demuxer::new(Limits::default());
    let mut len_size = 4;
    let mut arrivals = Vec::new();
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let (t, bytes) = match rx.recv_timeout(deadline - now) {
            Ok(v) => v,
            Err(_) => break,
        };
        demux.push(&bytes);
        let mut done = false;
        loop {
            match demux.next() {
                Ok(Some(Event::Tracks(tr))) => {
                    if let Some(v) = tr.first() {
                        len_size = v.nal_length_size as usize;
                    }
                }
                Ok(Some(Event::Frame(f))) => {
                    let hash = slice_hash(&f.data, len_size);
                    done |= hash == last;
                    arrivals.push(Arrival { t, hash });
                }
                Ok(None) => break,
                Err(e) => return Err(format!("sub output: {e}")),
            }
        }
        if done {
            break;
        }
    }
    drop(child);
    Ok(SubOut {
        join,
        arrivals,
        playlist_loads: 0,
        segments: 0,
    })
}

/// A minimal HTTP/1.1 keep-alive client, as a player's.
struct Http {
    addr: SocketAddr,
    conn: Option<BufReader<TcpStream>>,
}

impl Http {
    fn get(&mut self, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
        for attempt in 0..2 {
            if self.conn.is_none() {
                let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                s.set_nodelay(true)?;
                self.conn = Some(BufReader::with_capacity(256 * 1024, s));
            }
            match self.try_get(path) {
                Ok(r) => return Ok(r),
                Err(e) if attempt == 1 => return Err(e),
                Err(_) => self.conn = None,
            }
        }
        unreachable!()
    }

    fn try_get(&mut self, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
        use std::io::{Error, ErrorKind};
        let host = self.addr;
        let c = self.conn.as_mut().expect("connected");
        c.get_mut().write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: quichub-lab-player\r\n\r\n"
            )
            .as_bytes(),
        )?;
        let mut line = String::new();
        c.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                Error::new(ErrorKind::InvalidData, format!("bad status line {line:?}"))
            })?;
        let mut len = None;
        let mut close = false;
        loop {
            line.clear();
            if c.read_line(&mut line)? == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "headers cut"));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                let k = k.trim().to_ascii_lowercase();
                if k == "content-length" {
                    len = v.trim().parse::<usize>().ok();
                } else if k == "connection" && v.trim().eq_ignore_ascii_case("close") {
                    close = true;
                } else if k == "transfer-encoding" {
                    return Err(Error::new(
                        ErrorKind::InvalidData,
                        "chunked replies unsupported",
                    ));
                }
            }
        }
        let len = len.ok_or_else(|| Error::new(ErrorKind::InvalidData, "no content-length"))?;
        let mut body = vec![0u8; len];
        c.read_exact(&mut body)?;
        if close {
            self.conn = None;
        }
        Ok((status, body))
    }
}

/// A media playlist: target duration, media sequence, segments.
#[derive(Debug, Default, PartialEq)]
pub struct Playlist {
    /// EXT-X-TARGETDURATION, s.
    pub target: f64,
    /// EXT-X-MEDIA-SEQUENCE.
    pub seq: u64,
    /// (duration s, URI) per segment.
    pub segs: Vec<(f64, String)>,
}

/// Parses an HLS media playlist.
pub fn parse_playlist(text: &str) -> Option<Playlist> {
    let mut p = Playlist::default();
    let mut lines = text.lines().map(str::trim);
    if lines.next()? != "#EXTM3U" {
        return None;
    }
    let mut dur = None;
    for l in lines {
        if let Some(v) = l.strip_prefix("#EXT-X-TARGETDURATION:") {
            p.target = v.trim().parse().ok()?;
        } else if let Some(v) = l.strip_prefix("#EXT-X-MEDIA-SEQUENCE:") {
            p.seq = v.trim().parse().ok()?;
        } else if let Some(v) = l.strip_prefix("#EXTINF:") {
            dur = v.split(',').next().and_then(|d| d.trim().parse().ok());
        } else if !l.is_empty() && !l.starts_with('#') {
            p.segs.push((dur.take().unwrap_or(p.target), l.to_string()));
        }
    }
    (p.target > 0.0).then_some(p)
}

/// The first segment a player plays: the latest that starts at least three
/// target durations before the end of the playlist (RFC 8216 §6.3.3), or
/// the first.
pub fn start_index(p: &Playlist) -> usize {
    let mut sum = 0.0;
    for (i, (d, _)) in p.segs.iter().enumerate().rev() {
        sum += d;
        if sum >= 3.0 * p.target - 1e-9 {
            return i;
        }
    }
    0
}

/// Plays an HLS stream as a live player does: loads the playlist, starts
/// three target durations from its end, fetches each new segment whole, and
/// reloads the playlist one target duration after the last load began (half
/// a target duration when it had not changed) (RFC 8216 §6.3.4).
fn hls_player(
    server: SocketAddr,
    path: &str,
    deadline: Instant,
    last: u64,
) -> Result<SubOut, String> {
    let join = Instant::now();
    let mut http = Http {
        addr: server,
        conn: None,
    };
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let mut next: Option<u64> = None;
    let mut arrivals = Vec::new();
    let (mut loads, mut segments) = (0, 0);
    'play: while Instant::now() < deadline {
        let load = Instant::now();
        let (status, body) = match http.get(path) {
            Ok(r) => r,
            Err(e) => return Err(format!("playlist: {e}")),
        };
        loads += 1;
        let pl = if status == 200 {
            parse_playlist(&String::from_utf8_lossy(&body))
        } else {
            None
        };
        let Some(pl) = pl else {
            // Not published yet (404) or empty: retry shortly.
            sleep_until((Instant::now() + Duration::from_millis(250)).min(deadline));
            continue;
        };
        let first = *next.get_or_insert(pl.seq + start_index(&pl) as u64);
        let mut got = false;
        for (k, (_, uri)) in pl.segs.iter().enumerate() {
            let s = pl.seq + k as u64;
            if s < first.max(next.unwrap_or(0)) {
                continue;
            }
            let seg_path = format!("{dir}{uri}");
            let (st, data) = http
                .get(&seg_path)
                .map_err(|e| format!("segment {uri}: {e}"))?;
            let t = Instant::now();
            next = Some(s + 1);
            if st != 200 {
                continue; // removed before we got to it: its frames are missing
            }
            got = true;
            segments += 1;
            let mut d = quichub_media::ts::TsDemuxer::new(Limits::default());
            d.push(&data);
            d.end();
            let mut len_size = 4;
            loop {
                match d.next() {
                    Ok(Some(Event::Tracks(tr))) => {
                        if let Some(v) = tr.iter().find(|v| v.nal_length_size > 0) {
                            len_size = v.nal_length_size as usize;
                        }
                    }
                    Ok(Some(Event::Frame(f))) => {
                        let hash = slice_hash(&f.data, len_size);
                        arrivals.push(Arrival { t, hash });
                        if hash == last {
                            break 'play;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => continue,
                }
            }
        }
        let wait = Duration::from_secs_f64(if got { pl.target } else { pl.target / 2.0 });
        sleep_until((load + wait).min(deadline));
    }
    Ok(SubOut {
        join,
        arrivals,
        playlist_loads: loads,
        segments,
    })
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let k = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[k.min(sorted.len() - 1)])
}

fn bins(cfg: &RunConfig) -> usize {
    (cfg.duration_s + 16.0).ceil() as usize
}

/// A subscriber's figures from its arrivals.
fn analyse(src: &Source, t0: Instant, out: &SubOut, cfg: &RunConfig) -> SubRecord {
    let ms = |t: Instant| -> f64 {
        if t >= t0 {
            (t - t0).as_secs_f64() * 1e3
        } else {
            -((t0 - t).as_secs_f64() * 1e3)
        }
    };
    let mut seen: HashSet<usize> = HashSet::new();
    let mut got: Vec<(usize, f64)> = Vec::new();
    let (mut dup, mut unknown) = (0, 0);
    for a in &out.arrivals {
        match src.by_hash.get(&a.hash) {
            None => unknown += 1,
            Some(&i) => {
                if seen.insert(i) {
                    got.push((i, ms(a.t)));
                } else {
                    dup += 1;
                }
            }
        }
    }
    let mut s = SubRecord {
        join_ms: ms(out.join),
        duplicates: dup,
        unknown,
        playlist_loads: out.playlist_loads,
        segments: out.segments,
        ..Default::default()
    };
    let n = src.frames.len();
    let Some(first) = got.iter().map(|g| g.0).min() else {
        s.goodput_series = vec![0.0; bins(cfg)];
        return s;
    };
    s.first_frame = Some(first);
    s.frames_expected = n - first;
    s.frames_delivered = got.len();
    s.frames_missing = s.frames_expected - s.frames_delivered;
    s.video_bytes = got.iter().map(|g| src.frames[g.0].size as u64).sum();
    let due = |i: usize| src.frames[i].pts_us as f64 / 1e3;
    let mut g2g: Vec<f64> = got.iter().map(|&(i, t)| t - due(i)).collect();
    g2g.sort_by(f64::total_cmp);
    s.g2g_median_ms = percentile(&g2g, 0.5);
    s.g2g_p95_ms = percentile(&g2g, 0.95);
    s.g2g_max_ms = g2g.last().copied();
    s.last_frame_ms = got.iter().map(|g| g.1).max_by(f64::total_cmp);
    // Playback: starts at the first keyframe held, then real time; a frame
    // not there at its time pauses playback until it is.
    let mut by_idx = got.clone();
    by_idx.sort_by_key(|g| g.0);
    let first_key = got
        .iter()
        .filter(|g| src.frames[g.0].keyframe)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .copied();
    if let Some((k, tk)) = first_key {
        s.startup_ms = Some(tk - s.join_ms);
        let mut stalled = 0.0;
        for &(i, t) in by_idx.iter().filter(|g| g.0 > k) {
            let play = tk + (due(i) - due(k)) + stalled;
            if t > play {
                let wait = t - play;
                stalled += wait;
                if wait > STALL_MS {
                    s.stalls += 1;
                }
            }
        }
        s.stall_ms = stalled;
    }
    let mut series = vec![0.0; bins(cfg)];
    for &(i, t) in &got {
        let b = (t / 1e3).floor().max(0.0) as usize;
        if b < series.len() {
            series[b] += src.frames[i].size as f64 * 8.0 / 1e6;
        }
    }
    s.goodput_series = series;
    s
}

/// The remote subscriber's flow on the link, from the emulator's capture.
fn wire(s: &mut SubRecord, pkts: &[&PacketRecord], t0_us: i64, cfg: &RunConfig) {
    let total: u64 = pkts.iter().map(|p| p.len as u64).sum();
    s.wire_bytes = Some(total);
    if s.video_bytes > 0 {
        s.wire_per_video_byte = Some(total as f64 / s.video_bytes as f64);
    }
    let mut series = vec![0.0; bins(cfg)];
    let (from, to) = (s.join_ms, s.last_frame_ms.unwrap_or(s.join_ms));
    let mut in_window = 0u64;
    for p in pkts.iter().filter(|p| !p.up && !p.dropped) {
        let t_ms = (p.t_us as i64 - t0_us) as f64 / 1e3;
        let b = (t_ms / 1e3).floor();
        if b >= 0.0 && (b as usize) < series.len() {
            series[b as usize] += p.len as f64 * 8.0 / 1e6;
        }
        if t_ms >= from && t_ms <= to {
            in_window += p.len as u64;
        }
    }
    s.wire_series = series;
    if to > from {
        s.wire_mbps = Some(in_window as f64 * 8.0 / ((to - from) / 1e3) / 1e6);
    }
}

mod report;
mod types;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn playlists_parse_and_players_start_three_targets_back() {
        let text = "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-MEDIA-SEQUENCE:6\n#EXT-X-TARGETDURATION:1\n\
                    #EXTINF:1.000,\ns1-6.ts\n#EXTINF:1.000,\ns1-7.ts\n#EXTINF:1.000,\ns1-8.ts\n#EXTINF:0.967,\ns1-9.ts\n";
        let p = parse_playlist(text).unwrap();
        assert_eq!(p.seq, 6);
        assert_eq!(p.target, 1.0);
        assert_eq!(p.segs.len(), 4);
        assert_eq!(p.segs[3], (0.967, "s1-9.ts".to_string()));
        // 0.967 + 1 + 1 < 3: the first segment.
        assert_eq!(start_index(&p), 0);
        let five = parse_playlist(
            "#EXTM3U\n#EXT-X-TARGETDURATION:5\n#EXTINF:5,\na.ts\n#EXTINF:5,\nb.ts\n#EXTINF:5,\nc.ts\n#EXTINF:5,\nd.ts\n",
        )
        .unwrap();
        assert_eq!(start_index(&five), 1);
        assert!(parse_playlist("not a playlist").is_none());
    }

    #[test]
    fn slice_hash_ignores_parameter_sets_and_delimiters() {
        let nal = |t: u8, body: &[u8]| {
            let mut v = ((body.len() + 1) as u32).to_be_bytes().to_vec();
            v.push(t);
            v.extend_from_slice(body);
            v
        };
        let idr = nal(0x65, b"slice");
        let mut with_sps = nal(0x09, b"\xf0");
        with_sps.extend(nal(0x67, b"sps"));
        with_sps.extend(nal(0x68, b"pps"));
        with_sps.extend(&idr);
        assert_eq!(slice_hash(&idr, 4), slice_hash(&with_sps, 4));
        assert_ne!(slice_hash(&idr, 4), slice_hash(&nal(0x65, b"other"), 4));
    }

    #[test]
    fn nginx_conf_names_both_applications() {
        let c = nginx_conf(Path::new("/tmp/x"), Ipv4Addr::new(10, 201, 0, 2));
        assert!(c.contains("listen 10.201.0.2:1935;"));
        assert!(c.contains("hls_fragment 1s;"));
        assert!(c.contains("application def"));
        assert!(c.contains("alias /tmp/x/hls-ll/;"));
    }
}
