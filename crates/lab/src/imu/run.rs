//! Experiment `imu` (Sengupta 2025, *Streaming over QUIC: Applications in
//! Media and IoT*): two IMU sensors (accelerometer, gyroscope)
//! stream timestamped samples to a receiver across an emulated link, over
//! QUIC/MoQT in three stream layouts and over TCP.
//!
//! Topology: the relay and the subscriber run in the emulator's server
//! namespace (the subscriber reaches the relay over that namespace's
//! loopback); the sensors (the publisher) run in the client namespace, so
//! only the sensor → relay direction crosses the emulated link. For TCP a
//! plain length-prefixed receiver replaces relay and subscriber.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use crate::common::rt::{runtime, step, STEP};
use bytes::{BufMut, Bytes, BytesMut};
use moqt::FullTrackName;
use quichub_client::synth::now_micros;
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode, Verify,
};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// Sensor names, in index order.
pub const SENSORS: [&str; 2] = ["accel", "gyro"];

/// Track namespace of the sensor tracks.
const NAMESPACE: &str = "imu";

/// How the two sensors reach the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// One MoQT track, one subgroup stream carrying both sensors.
    QuicSingle,
    /// One track and one long-lived subgroup stream per sensor, equal priority.
    QuicStreams,
    /// Per-sensor streams with different QUIC stream priorities, fed by a
    /// weighted (bytes-sent) scheduler in the publisher.
    QuicWeighted,
    /// One TCP connection, length-prefixed samples.
    Tcp,
}

impl Mode {
    /// Every mode, in report order.
    pub const ALL: [Mode; 4] = [
        Mode::QuicSingle,
        Mode::QuicStreams,
        Mode::QuicWeighted,
        Mode::Tcp,
    ];

    /// Short label.
    pub fn label(self) -> &'static str {
        match self {
            Mode::QuicSingle => "quic-single",
            Mode::QuicStreams => "quic-streams",
            Mode::QuicWeighted => "quic-weighted",
            Mode::Tcp => "tcp",
        }
    }

    fn tracks(self) -> Vec<(&'static str, u8)> {
        match self {
            Mode::QuicSingle => vec![("all", 128)],
            Mode::QuicStreams => vec![("accel", 128), ("gyro", 128)],
            // MoQT: a lower Publisher Priority value is more important; the
            // client maps it to QUIC stream priority 255 - p.
            Mode::QuicWeighted => vec![("accel", 32), ("gyro", 224)],
            Mode::Tcp => vec![],
        }
    }
}

/// Parameters of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// How long the sensors generate samples.
    pub duration: Duration,
    /// How long the receiver keeps listening after the sensors stop.
    pub drain: Duration,
    /// Samples per second per sensor.
    pub rate_hz: u32,
    /// Bytes per sample payload (at least 29).
    pub payload: usize,
    /// Scheduler weights (accel, gyro) for [`Mode::QuicWeighted`].
    pub weights: [u32; 2],
}

/// One received sample.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// Sensor index.
    pub sensor: usize,
    /// Sequence number within the sensor.
    pub seq: u64,
    /// Generation time, µs since the epoch.
    pub sent_us: u64,
    /// Arrival time at the subscriber, µs since the epoch.
    pub recv_us: u64,
}

/// What one run produced, before aggregation.
#[derive(Debug, Clone, Default)]
pub struct RawRun {
    /// Generation start, µs since the epoch.
    pub t0_us: u64,
    /// Samples generated per sensor.
    pub sent: [u64; 2],
    /// Samples handed to the transport per sensor.
    pub written: [u64; 2],
    /// Arrivals in order.
    pub arrivals: Vec<Arrival>,
}

const HEADER: usize = 8 + 8 + 1 + 12;

/// Encodes a sample: send time, sequence, sensor, three f32 axes, padding.
pub fn encode_sample(sensor: usize, seq: u64, size: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(size.max(HEADER));
    b.put_u64(now_micros());
    b.put_u64(seq);
    b.put_u8(sensor as u8);
    let t = seq as f32 * 0.01;
    for axis in 0..3 {
        b.put_f32((t + axis as f32).sin());
    }
    b.resize(size.max(HEADER), 0);
    b.freeze()
}

/// Decodes (sensor, seq, sent µs) from a sample.
pub fn decode_sample(p: &[u8]) -> Option<(usize, u64, u64)> {
    if p.len() < HEADER {
        return None;
    }
    let sent = u64::from_be_bytes(p[0..8].try_into().ok()?);
    let seq = u64::from_be_bytes(p[8..16].try_into().ok()?);
    let sensor = p[16] as usize;
    (sensor < SENSORS.len()).then_some((sensor, seq, sent))
}

struct ServerInfo {
    port: u16,
    fingerprint: Vec<u8>,
}

/// Channels between the two sides of one run.
struct Sync {
    /// Publisher → server: tracks are published (names).
    published: oneshot::Sender<()>,
    /// Server → publisher: subscriptions are in place.
    subscribed: oneshot::Receiver<()>,
    /// Publisher → server: generation start (µs).
    t0: oneshot::Sender<u64>,
}

struct ServerSync {
    published: oneshot::Receiver<()>,
    subscribed: oneshot::Sender<()>,
    t0: oneshot::Receiver<u64>,
}

/// Runs one mode once across `emu`.
pub fn run_once(
    emu: &quichub_netem::emulator::Emulator,
    mode: Mode,
    cfg: &RunConfig,
) -> anyhow::Result<RawRun> {
    let (info_tx, info_rx) = std::sync::mpsc::channel::<anyhow::Result<ServerInfo>>();
    let (pub_tx, pub_rx) = oneshot::channel();
    let (sub_tx, sub_rx) = oneshot::channel();
    let (t0_tx, t0_rx) = oneshot::channel();
    let server_sync = ServerSync {
        published: pub_rx,
        subscribed: sub_tx,
        t0: t0_rx,
    };
    let scfg = cfg.clone();
    let server = emu
        .server()
        .spawn(move || -> anyhow::Result<Vec<Arrival>> {
            let rt = runtime()?;
            rt.block_on(server_side(mode, scfg, info_tx, server_sync))
        })
        .context("starting the receiver thread")?;
    let info = match info_rx.recv_timeout(STEP) {
        Ok(Ok(i)) => i,
        Ok(Err(e)) => return Err(e.context("receiver setup")),
        Err(_) => {
            let r = server.join();
            bail!("receiver did not start: {r:?}");
        }
    };
    let sync = Sync {
        published: pub_tx,
        subscribed: sub_rx,
        t0: t0_tx,
    };
    let addr = SocketAddr::from((emu.server().addr(), info.port));
    let pcfg = cfg.clone();
    let publisher = emu
        .client()
        .spawn(move || -> anyhow::Result<(u64, [u64; 2], [u64; 2])> {
            let rt = runtime()?;
            rt.block_on(publisher_side(mode, pcfg, addr, info.fingerprint, sync))
        })
        .context("starting the sensor thread")?;
    let p = publisher
        .join()
        .map_err(|_| anyhow!("sensor thread panicked"))?
        .map_err(|e| anyhow!("sensor thread: {e}"))?;
    let s = server
        .join()
        .map_err(|_| anyhow!("receiver thread panicked"))?
        .map_err(|e| anyhow!("receiver thread: {e}"))?;
    let (t0_us, sent, written) = p.context("sensors")?;
    let arrivals = s.context("receiver")?;
    Ok(RawRun {
        t0_us,
        sent,
        written,
        arrivals,
    })
}

async fn server_side(
    mode: Mode,
    cfg: RunConfig,
    info: std::sync::mpsc::Sender<anyhow::Result<ServerInfo>>,
    sync: ServerSync,
) -> anyhow::Result<Vec<Arrival>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Arrival>();
    let mut tasks = Vec::new();
    let mut keep = Vec::new();
    if mode == Mode::Tcp {
        let listener = match tokio::net::TcpListener::bind(("0.0.0.0", 0)).await {
            Ok(l) => l,
            Err(e) => {
                let _ = info.send(Err(e.into()));
                bail!("bind failed");
            }
        };
        let port = listener.local_addr()?.port();
        let _ = info.send(Ok(ServerInfo {
            port,
            fingerprint: Vec::new(),
        }));
        let (mut conn, _) = step("accepting the TCP connection", listener.accept()).await?;
        let _ = sync.subscribed.send(());
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut len = [0u8; 4];
            loop {
                if conn.read_exact(&mut len).await.is_err() {
                    break;
                }
                let n = u32::from_be_bytes(len) as usize;
                if n > 1 << 20 {
                    break;
                }
                let mut body = vec![0u8; n];
                if conn.read_exact(&mut body).await.is_err() {
                    break;
                }
                let recv_us = now_micros();
                if let Some((sensor, seq, sent_us)) = decode_sample(&body) {
                    let _ = tx.send(Arrival {
                        sensor,
                        seq,
                        sent_us,
                        recv_us,
                    });
                }
            }
        }));
    } else {
        // What `quichub relay` runs (its MoQT side), on every interface of
        // the namespace.
        let mut config = quichub_hub::Config::default();
        config.quic.bind = "0.0.0.0:0".into();
        config.mqtt.tcp = "off".into();
        config.mqtt.tls = "off".into();
        config.http.address = "off".into();
        config.metrics.address = "off".into();
        config.store.data_dir = Some("off".into());
        config.auth.allow_anonymous = Some(true);
        let hub = match quichub_hub::Hub::start(config).await {
            Ok(h) => h,
            Err(e) => {
                let _ = info.send(Err(e));
                bail!("bind failed");
            }
        };
        let server = hub.server().clone();
        let port = hub.addr().port();
        let fingerprint = quichub_net::tls::unhex(&hub.fingerprint()).unwrap_or_default();
        let _ = info.send(Ok(ServerInfo {
            port,
            fingerprint: fingerprint.clone(),
        }));
        step("waiting for the sensors' tracks", sync.published).await?;
        let opts = ConnectOptions {
            verify: Verify::Fingerprints(vec![fingerprint]),
            bind: "127.0.0.1:0".parse()?,
            timeout: Duration::from_secs(5),
            endpoint: None,
            draft: None,
        };
        let session = step(
            "subscriber connecting to the relay",
            ClientSession::connect(&format!("moqt://127.0.0.1:{port}/imu"), opts),
        )
        .await?;
        for (name, _) in mode.tracks() {
            let mut sub = step(
                "subscribing",
                session.subscribe(
                    FullTrackName::new(NAMESPACE, name),
                    SubscribeOptions::default(),
                ),
            )
            .await?;
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(ev) = sub.next().await {
                    match ev {
                        SubscriptionEvent::Object(o) => {
                            let recv_us =
                                now_micros().saturating_sub(o.arrived.elapsed().as_micros() as u64);
                            if let Some((sensor, seq, sent_us)) = decode_sample(&o.payload) {
                                let _ = tx.send(Arrival {
                                    sensor,
                                    seq,
                                    sent_us,
                                    recv_us,
                                });
                            }
                        }
                        SubscriptionEvent::Done { .. } => break,
                        SubscriptionEvent::SubgroupEnd { .. } => {}
                    }
                }
            }));
        }
        keep.push(session);
        let _ = sync.subscribed.send(());
        keep_server(server, &mut tasks);
    }
    drop(tx);
    let t0 = step("waiting for the sensors to start", sync.t0).await?;
    let end_us = t0 + (cfg.duration + cfg.drain).as_micros() as u64;
    let left = Duration::from_micros(end_us.saturating_sub(now_micros()));
    let deadline = tokio::time::Instant::now() + left.min(cfg.duration + cfg.drain);
    let mut arrivals = Vec::new();
    loop {
        tokio::select! {
            a = rx.recv() => match a {
                Some(a) => arrivals.push(a),
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    // Samples that arrived by the deadline may still be queued in the channel.
    while let Ok(a) = rx.try_recv() {
        if a.recv_us <= end_us {
            arrivals.push(a);
        }
    }
    for t in tasks {
        t.abort();
    }
    for s in keep {
        s.close(0, "done");
    }
    Ok(arrivals)
}

fn keep_server(
    server: Arc<quichub_net::server::Server>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    // Closes the endpoint when the run's tasks are aborted.
    tasks.push(tokio::spawn(async move {
        let _s = server;
        std::future::pending::<()>().await;
    }));
}

type Sample = (usize, Bytes);

/// Generates `rate_hz × duration` samples per sensor into `out[sensor]`.
fn generators(
    cfg: &RunConfig,
    out: [mpsc::UnboundedSender<Sample>; 2],
) -> Vec<tokio::task::JoinHandle<u64>> {
    let n = (cfg.rate_hz as f64 * cfg.duration.as_secs_f64()).round() as u64;
    let period = Duration::from_secs_f64(1.0 / cfg.rate_hz.max(1) as f64);
    let size = cfg.payload;
    out.into_iter()
        .enumerate()
        .map(|(sensor, tx)| {
            tokio::spawn(async move {
                let mut iv = tokio::time::interval(period);
                iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut sent = 0;
                for seq in 0..n {
                    iv.tick().await;
                    if tx.send((sensor, encode_sample(sensor, seq, size))).is_err() {
                        break;
                    }
                    sent += 1;
                }
                sent
            })
        })
        .collect()
}

async fn publisher_side(
    mode: Mode,
    cfg: RunConfig,
    addr: SocketAddr,
    fingerprint: Vec<u8>,
    sync: Sync,
) -> anyhow::Result<(u64, [u64; 2], [u64; 2])> {
    let written = Arc::new([
        std::sync::atomic::AtomicU64::new(0),
        std::sync::atomic::AtomicU64::new(0),
    ]);
    let end = tokio::time::Instant::now() + STEP + cfg.duration + cfg.drain;
    let mut writers: Vec<tokio::task::JoinHandle<anyhow::Result<()>>> = Vec::new();
    let (a_tx, a_rx) = mpsc::unbounded_channel::<Sample>();
    let (g_tx, g_rx) = mpsc::unbounded_channel::<Sample>();
    let mut keep_session = None;

    if mode == Mode::Tcp {
        let mut conn = step("connecting over TCP", tokio::net::TcpStream::connect(addr)).await?;
        conn.set_nodelay(true)?;
        let _ = sync.published.send(());
        step("waiting for the receiver", sync.subscribed).await?;
        let w = written.clone();
        writers.push(tokio::spawn(async move {
            let mut rx = merge(a_rx, g_rx);
            while let Some((sensor, p)) = rx.recv().await {
                let mut b = BytesMut::with_capacity(4 + p.len());
                b.put_u32(p.len() as u32);
                b.extend_from_slice(&p);
                conn.write_all(&b).await?;
                w[sensor].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            conn.flush().await?;
            // Keep the connection open until the receiver's deadline.
            let mut sink = [0u8; 16];
            let _ = conn.read(&mut sink).await;
            Ok(())
        }));
    } else {
        let opts = ConnectOptions {
            verify: Verify::Fingerprints(vec![fingerprint]),
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            timeout: Duration::from_secs(5),
            endpoint: None,
            draft: None,
        };
        let session = step(
            "sensors connecting to the relay",
            ClientSession::connect(&format!("moqt://{addr}/imu"), opts),
        )
        .await?;
        let mut tracks = Vec::new();
        for (name, prio) in mode.tracks() {
            tracks.push(
                step(
                    "publishing a track",
                    session.create_track(
                        FullTrackName::new(NAMESPACE, name),
                        prio,
                        TrackMode::Push,
                    ),
                )
                .await?,
            );
        }
        let _ = sync.published.send(());
        step("waiting for the subscriber", sync.subscribed).await?;
        match mode {
            Mode::QuicSingle => {
                let track = tracks[0].clone();
                let w = written.clone();
                writers.push(tokio::spawn(async move {
                    let mut rx = merge(a_rx, g_rx);
                    let mut sg = track
                        .open_subgroup(0, 0)
                        .await?
                        .ok_or_else(|| anyhow!("track not forwarded"))?;
                    let mut id = 0;
                    while let Some((sensor, p)) = rx.recv().await {
                        sg.write(id, p).await?;
                        id += 1;
                        w[sensor].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    sg.finish();
                    Ok(())
                }));
            }
            Mode::QuicStreams => {
                for (i, rx) in [a_rx, g_rx].into_iter().enumerate() {
                    writers.push(stream_writer(tracks[i].clone(), rx, written.clone()));
                }
            }
            Mode::QuicWeighted => {
                let (sa_tx, sa_rx) = mpsc::channel::<Sample>(2);
                let (sg_tx, sg_rx) = mpsc::channel::<Sample>(2);
                writers.push(tokio::spawn(weighted_scheduler(
                    [a_rx, g_rx],
                    [sa_tx, sg_tx],
                    cfg.weights,
                    end,
                )));
                for (i, rx) in [sa_rx, sg_rx].into_iter().enumerate() {
                    writers.push(bounded_writer(tracks[i].clone(), rx, written.clone()));
                }
            }
            Mode::Tcp => unreachable!(),
        }
        keep_session = Some((session, tracks));
    }

    let t0 = now_micros();
    let _ = sync.t0.send(t0);
    let gens = generators(&cfg, [a_tx, g_tx]);
    let mut sent = [0u64; 2];
    for (i, g) in gens.into_iter().enumerate() {
        sent[i] = g.await?;
    }
    // Keep writing (and the connection open) until the receiver stops.
    let stop = tokio::time::Instant::now()
        + Duration::from_micros(
            (t0 + (cfg.duration + cfg.drain).as_micros() as u64).saturating_sub(now_micros()),
        );
    let stop = stop.min(end);
    let mut errors = Vec::new();
    for w in writers.iter_mut() {
        match tokio::time::timeout_at(stop, w).await {
            Ok(Ok(Err(e))) => errors.push(e.to_string()),
            Ok(Err(e)) => errors.push(e.to_string()),
            _ => {}
        }
    }
    tokio::time::sleep_until(stop).await;
    for w in writers {
        w.abort();
    }
    if let Some((s, _tracks)) = keep_session {
        s.close(0, "done");
    }
    if let Some(e) = errors.first() {
        bail!("writer failed: {e}");
    }
    let w = [
        written[0].load(std::sync::atomic::Ordering::Relaxed),
        written[1].load(std::sync::atomic::Ordering::Relaxed),
    ];
    Ok((t0, sent, w))
}

/// Both sensors' samples in generation order (one FIFO).
fn merge(
    mut a: mpsc::UnboundedReceiver<Sample>,
    mut g: mpsc::UnboundedReceiver<Sample>,
) -> mpsc::UnboundedReceiver<Sample> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut a_open, mut g_open) = (true, true);
        while a_open || g_open {
            tokio::select! {
                x = a.recv(), if a_open => match x { Some(s) => { let _ = tx.send(s); } None => a_open = false },
                x = g.recv(), if g_open => match x { Some(s) => { let _ = tx.send(s); } None => g_open = false },
            }
        }
    });
    rx
}

fn stream_writer(
    track: Arc<quichub_client::LocalTrack>,
    mut rx: mpsc::UnboundedReceiver<Sample>,
    w: Arc<[std::sync::atomic::AtomicU64; 2]>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let mut sg = track
            .open_subgroup(0, 0)
            .await?
            .ok_or_else(|| anyhow!("track not forwarded"))?;
        let mut id = 0;
        while let Some((sensor, p)) = rx.recv().await {
            sg.write(id, p).await?;
            id += 1;
            w[sensor].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        sg.finish();
        Ok(())
    })
}

fn bounded_writer(
    track: Arc<quichub_client::LocalTrack>,
    mut rx: mpsc::Receiver<Sample>,
    w: Arc<[std::sync::atomic::AtomicU64; 2]>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let mut sg = track
            .open_subgroup(0, 0)
            .await?
            .ok_or_else(|| anyhow!("track not forwarded"))?;
        let mut id = 0;
        while let Some((sensor, p)) = rx.recv().await {
            sg.write(id, p).await?;
            id += 1;
            w[sensor].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        sg.finish();
        Ok(())
    })
}

/// The paper's scheduler: at each decision point, among the sensors with a
/// sample waiting and room on their stream, send the one with the least
/// bytes sent per unit of weight. Per-sensor writers hold at most two
/// samples, so a stream that the transport holds back stops being picked
/// and the other keeps its share.
async fn weighted_scheduler(
    mut inputs: [mpsc::UnboundedReceiver<Sample>; 2],
    outputs: [mpsc::Sender<Sample>; 2],
    weights: [u32; 2],
    end: tokio::time::Instant,
) -> anyhow::Result<()> {
    let mut queues: [std::collections::VecDeque<Sample>; 2] = Default::default();
    let mut open = [true, true];
    let mut bytes = [0u64; 2];
    loop {
        for i in 0..2 {
            while open[i] {
                match inputs[i].try_recv() {
                    Ok(s) => queues[i].push_back(s),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => open[i] = false,
                }
            }
        }
        loop {
            let pick = (0..2)
                .filter(|&i| !queues[i].is_empty() && outputs[i].capacity() > 0)
                .min_by(|&x, &y| {
                    let fx = bytes[x] as f64 / weights[x].max(1) as f64;
                    let fy = bytes[y] as f64 / weights[y].max(1) as f64;
                    fx.total_cmp(&fy)
                });
            let Some(i) = pick else { break };
            let s = queues[i].pop_front().expect("non-empty");
            bytes[i] += s.1.len() as u64;
            if outputs[i].try_send(s).is_err() {
                bail!("scheduler output closed");
            }
        }
        if !open[0] && !open[1] && queues.iter().all(|q| q.is_empty()) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= end {
            return Ok(());
        }
        let [a, g] = &mut inputs;
        tokio::select! {
            x = a.recv(), if open[0] => match x { Some(s) => queues[0].push_back(s), None => open[0] = false },
            x = g.recv(), if open[1] => match x { Some(s) => queues[1].push_back(s), None => open[1] = false },
            _ = tokio::time::sleep(Duration::from_micros(500)) => {}
        }
    }
}
