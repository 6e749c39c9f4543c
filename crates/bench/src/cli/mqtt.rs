//! `quichub-bench mqtt`: an MQTT load generator over TCP, for any broker
//! (ours, mosquitto, ...). N publishers and M subscribers, each its own TCP
//! connection, written on tokio and the `quichub_mqtt` codec.
//!
//! Every payload carries the publisher's id, a sequence number and the send
//! time (nanoseconds since an `Instant` shared by the whole process; the
//! publishers and subscribers run here, on one clock). Subscribers record
//! publish-to-deliver latency in an HDR histogram and count, per publisher,
//! lost and duplicated messages.
//!
//! Topology: publisher `i` publishes to `bench/{i % topics}`. By default every
//! subscriber subscribes to `bench/#`, so every message is delivered to every
//! subscriber (fan-out = subscribers: with 100 publishers and 100 subscribers
//! each message goes out 100 times). `--pairs` instead pairs subscriber `i`
//! with publisher `i` on its own topic (fan-out 1).
//!
//! Pacing: `--rate R` sends R messages per second per publisher. `--rate 0`
//! sends as fast as flow allows: each publisher keeps at most `--window`
//! messages in flight end to end (sent but not yet delivered to all of their
//! subscribers; the counts are shared in memory). A message that the broker
//! dropped would hold the window shut, so after `--window-timeout-ms`
//! without progress the publisher writes its outstanding messages off (the
//! loss is still counted by the subscribers). At QoS 1 a publisher also keeps
//! at most `--window` messages un-PUBACKed, in both modes, and subscribers
//! PUBACK every message.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use quichub_mqtt::{
    decode, encode, Ack, Connect, Disconnect, Packet, Properties, Publish, QoS, Subscribe,
    SubscribeFilter, SubscriptionOptions, Version, DEFAULT_MAX_PACKET_SIZE,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};

use crate::cpu::{cpu_ticks, ticks_per_sec};

/// Options.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchMqttArgs {
    /// Broker TCP address.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub broker: String,
    /// Publisher connections.
    #[arg(long, default_value_t = 100)]
    pub publishers: usize,
    /// Subscriber connections.
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    /// QoS of publishes and subscriptions: 0 or 1.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub qos: u8,
    /// Messages per second per publisher; 0 = as fast as the in-flight window allows.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Messages a publisher keeps in flight (end to end with `--rate 0`; un-PUBACKed at QoS 1).
    #[arg(long, default_value_t = 1)]
    pub window: usize,
    /// With `--rate 0`: write the outstanding messages off after this long without a delivery.
    #[arg(long, default_value_t = 1000)]
    pub window_timeout_ms: u64,
    /// Seconds of publishing.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Payload bytes (at least 20: sequence, publisher id, timestamp).
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Topics: publisher i publishes to `bench/{i % topics}`.
    #[arg(long, default_value_t = 100)]
    pub topics: usize,
    /// Subscriber i subscribes only to publisher i's topic (fan-out 1; needs
    /// publishers = subscribers = topics). Default: every subscriber
    /// subscribes to `bench/#` (fan-out = subscribers).
    #[arg(long)]
    pub pairs: bool,
    /// MQTT protocol version: 3 (3.1.1) or 5.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(3..=5))]
    pub mqtt_version: u8,
    /// Longest wait for in-flight messages after publishing stops, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub drain: f64,
    /// PID of the broker process: report its CPU use over the publishing period.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Label for the output (e.g. the broker's name).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Print the result as one JSON line on stdout; the human-readable lines
    /// then go to stderr, so stdout is JSON only.
    #[arg(long)]
    pub json: bool,
}

/// Bytes of the payload header: sequence (u64), publisher id (u32), send time (u64), little endian.
pub const HEADER_LEN: usize = 20;

/// Writes the payload header into the front of `buf` (at least [`HEADER_LEN`] bytes).
pub fn stamp(buf: &mut [u8], seq: u64, publisher: u32, sent_ns: u64) {
    buf[0..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..12].copy_from_slice(&publisher.to_le_bytes());
    buf[12..20].copy_from_slice(&sent_ns.to_le_bytes());
}

/// Reads `(seq, publisher, sent_ns)` from a payload.
pub fn unstamp(p: &[u8]) -> Option<(u64, u32, u64)> {
    let h = p.get(..HEADER_LEN)?;
    Some((
        u64::from_le_bytes(h[0..8].try_into().ok()?),
        u32::from_le_bytes(h[8..12].try_into().ok()?),
        u64::from_le_bytes(h[12..20].try_into().ok()?),
    ))
}

/// Loss and duplicate accounting of one publisher's sequence at one subscriber.
#[derive(Debug, Default, Clone)]
pub struct SeqTracker {
    /// Every sequence below this was received.
    next: u64,
    /// Received sequences above `next` (arrived after a gap).
    ahead: BTreeSet<u64>,
    /// Sequences received more than once.
    pub duplicates: u64,
}

impl SeqTracker {
    /// Records `seq`; returns false for a duplicate.
    pub fn record(&mut self, seq: u64) -> bool {
        if seq < self.next || (seq > self.next && !self.ahead.insert(seq)) {
            self.duplicates += 1;
            return false;
        }
        if seq == self.next {
            self.next += 1;
            while self.ahead.remove(&self.next) {
                self.next += 1;
            }
        }
        true
    }

    /// Distinct sequences received.
    pub fn distinct(&self) -> u64 {
        self.next + self.ahead.len() as u64
    }

    /// Messages of the `sent` (sequences `0..sent`) not received.
    pub fn lost(&self, sent: u64) -> u64 {
        sent.saturating_sub(self.distinct())
    }
}

/// Shared between publishers and subscribers.
struct Shared {
    /// The clock of the payload timestamps.
    epoch: Instant,
    /// Per publisher: messages sent.
    sent: Vec<AtomicU64>,
    /// Per publisher: deliveries (to any subscriber).
    delivered: Vec<AtomicU64>,
    /// Per publisher: woken when a delivery arrives while it waits.
    wake: Vec<Notify>,
    /// Per publisher: whether it waits on `wake`.
    waiting: Vec<AtomicBool>,
    /// Times a publisher wrote off its outstanding window (`--rate 0`).
    window_timeouts: AtomicU64,
    /// PUBACKs received by publishers.
    pubacks: AtomicU64,
    /// Set when publishers stop (subscribers stop counting in-window deliveries).
    stop: AtomicBool,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

struct SubResult {
    hist: hdrhistogram::Histogram<u64>,
    /// Deliveries that arrived while publishing.
    in_window: u64,
    total: u64,
    trackers: Vec<(usize, SeqTracker)>,
}

/// The result of a run.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub label: String,
    pub qos: u8,
    pub mqtt_version: u8,
    pub publishers: usize,
    pub subscribers: usize,
    pub fanout: usize,
    pub rate_per_publisher: f64,
    pub payload: usize,
    pub duration_s: f64,
    pub published: u64,
    pub publish_per_s: f64,
    pub pubacks: u64,
    pub expected_deliveries: u64,
    pub delivered: u64,
    pub delivered_per_s: f64,
    pub lost: u64,
    pub duplicates: u64,
    pub window_timeouts: u64,
    pub latency_us_p50: f64,
    pub latency_us_p90: f64,
    pub latency_us_p99: f64,
    pub latency_us_max: f64,
    pub broker_cpu_pct: Option<f64>,
    /// This load generator's CPU use over the publishing period.
    pub generator_cpu_pct: f64,
}

pub async fn run(a: BenchMqttArgs) -> anyhow::Result<()> {
    let r = bench(a.clone()).await?;
    let mut out = super::flags::human_out(a.json);
    writeln!(
        out,
        "{}qos {} mqtt {} pubs {} subs {} fanout {} payload {} B rate {}: published {} ({:.0}/s), delivered {} ({:.0}/s in window), expected {}, lost {}, dup {}",
        if r.label.is_empty() { String::new() } else { format!("[{}] ", r.label) },
        r.qos,
        r.mqtt_version,
        r.publishers,
        r.subscribers,
        r.fanout,
        r.payload,
        if r.rate_per_publisher > 0.0 { format!("{}/s/pub", r.rate_per_publisher) } else { format!("max (window {})", a.window) },
        r.published,
        r.publish_per_s,
        r.delivered,
        r.delivered_per_s,
        r.expected_deliveries,
        r.lost,
        r.duplicates,
    )?;
    writeln!(
        out,
        "latency publish->deliver p50 {:.0} us p90 {:.0} us p99 {:.0} us max {:.0} us{}, generator cpu {:.0}%{}",
        r.latency_us_p50,
        r.latency_us_p90,
        r.latency_us_p99,
        r.latency_us_max,
        match r.broker_cpu_pct {
            Some(c) => format!(", broker cpu {c:.0}%"),
            None => String::new(),
        },
        r.generator_cpu_pct,
        if r.window_timeouts > 0 {
            format!(", window timeouts {}", r.window_timeouts)
        } else {
            String::new()
        },
    )?;
    out.flush()?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(())
}

/// Runs the benchmark.
pub async fn bench(a: BenchMqttArgs) -> anyhow::Result<Report> {
    if a.payload < HEADER_LEN {
        bail!("--payload must be at least {HEADER_LEN}");
    }
    if a.publishers == 0 || a.subscribers == 0 || a.topics == 0 || a.window == 0 {
        bail!("--publishers, --subscribers, --topics and --window must be positive");
    }
    if a.pairs && (a.publishers != a.subscribers) {
        bail!("--pairs needs as many publishers as subscribers");
    }
    let version = if a.mqtt_version == 5 {
        Version::V5
    } else {
        Version::V311
    };
    let qos = if a.qos == 1 {
        QoS::AtLeastOnce
    } else {
        QoS::AtMostOnce
    };
    let topic_of = |i: usize| {
        if a.pairs {
            format!("bench/{i}")
        } else {
            format!("bench/{}", i % a.topics)
        }
    };
    let fanout = if a.pairs { 1 } else { a.subscribers };
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        sent: (0..a.publishers).map(|_| AtomicU64::new(0)).collect(),
        delivered: (0..a.publishers).map(|_| AtomicU64::new(0)).collect(),
        wake: (0..a.publishers).map(|_| Notify::new()).collect(),
        waiting: (0..a.publishers).map(|_| AtomicBool::new(false)).collect(),
        window_timeouts: AtomicU64::new(0),
        pubacks: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let run_id = std::process::id();

    // Subscribers: connect and subscribe, all before anyone publishes.
    let mut subs = Vec::with_capacity(a.subscribers);
    for i in 0..a.subscribers {
        let filter = if a.pairs {
            topic_of(i)
        } else {
            "bench/#".to_string()
        };
        subs.push(tokio::spawn(connect_subscriber(
            a.broker.clone(),
            format!("qhb-{run_id}-s{i}"),
            version,
            filter,
            qos,
        )));
    }
    let mut sub_conns = Vec::with_capacity(a.subscribers);
    for (i, s) in subs.into_iter().enumerate() {
        sub_conns.push(s.await?.with_context(|| format!("subscriber {i}"))?);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut sub_tasks = Vec::with_capacity(a.subscribers);
    for (i, (stream, buf)) in sub_conns.into_iter().enumerate() {
        let publishers: Vec<usize> = if a.pairs {
            vec![i]
        } else {
            (0..a.publishers).collect()
        };
        sub_tasks.push(tokio::spawn(subscriber(
            stream,
            buf,
            version,
            publishers,
            a.publishers,
            shared.clone(),
            stop_rx.clone(),
        )));
    }
    // Publishers: connect.
    let mut pubs = Vec::with_capacity(a.publishers);
    for i in 0..a.publishers {
        pubs.push(tokio::spawn(connect(
            a.broker.clone(),
            format!("qhb-{run_id}-p{i}"),
            version,
        )));
    }
    let mut pub_conns = Vec::with_capacity(a.publishers);
    for (i, p) in pubs.into_iter().enumerate() {
        pub_conns.push(p.await?.with_context(|| format!("publisher {i}"))?);
    }
    eprintln!(
        "{} subscribers and {} publishers connected; publishing for {:.1} s",
        a.subscribers, a.publishers, a.duration
    );

    let start = Instant::now();
    let stop_at = start + Duration::from_secs_f64(a.duration);
    let cpu0 = a.broker_pid.map(cpu_ticks).transpose()?;
    let self0 = cpu_ticks(std::process::id())?;
    let mut pub_tasks = Vec::with_capacity(a.publishers);
    for (i, (stream, buf)) in pub_conns.into_iter().enumerate() {
        let cfg = PubCfg {
            id: i,
            topic: topic_of(i),
            qos,
            version,
            rate: a.rate,
            window: a.window,
            window_timeout: Duration::from_millis(a.window_timeout_ms),
            payload: a.payload,
            fanout: fanout as u64,
            stop_at,
            // Spread the publishers' ticks over one period.
            phase: if a.rate > 0.0 {
                Duration::from_secs_f64(i as f64 / a.publishers as f64 / a.rate)
            } else {
                Duration::ZERO
            },
        };
        pub_tasks.push(tokio::spawn(publisher(stream, buf, cfg, shared.clone())));
    }
    let mut pub_streams = Vec::new();
    for (i, t) in pub_tasks.into_iter().enumerate() {
        match t.await? {
            Ok(s) => pub_streams.push(s),
            Err(e) => eprintln!("publisher {i}: {e:#}"),
        }
    }
    let elapsed = start.elapsed().max(Duration::from_secs_f64(a.duration));
    let cpu1 = a.broker_pid.map(cpu_ticks).transpose()?;
    let self1 = cpu_ticks(std::process::id())?;
    shared.stop.store(true, Relaxed);

    // Drain: until every delivery arrived, nothing arrived for 1.5 s, or --drain.
    let expected: u64 = shared.sent.iter().map(|s| s.load(Relaxed)).sum::<u64>() * fanout as u64;
    let drain_until = Instant::now() + Duration::from_secs_f64(a.drain);
    let mut last = u64::MAX;
    let mut last_change = Instant::now();
    while Instant::now() < drain_until {
        let got: u64 = shared.delivered.iter().map(|d| d.load(Relaxed)).sum();
        if got >= expected {
            break;
        }
        if got != last {
            last = got;
            last_change = Instant::now();
        } else if last_change.elapsed() > Duration::from_millis(1500) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_tx.send_replace(true);
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    let (mut in_window, mut total, mut lost, mut dups) = (0u64, 0u64, 0u64, 0u64);
    for (i, t) in sub_tasks.into_iter().enumerate() {
        match t.await? {
            Ok(r) => {
                hist.add(&r.hist)?;
                in_window += r.in_window;
                total += r.total;
                for (p, tr) in &r.trackers {
                    lost += tr.lost(shared.sent[*p].load(Relaxed));
                    dups += tr.duplicates;
                }
            }
            Err(e) => {
                eprintln!("subscriber {i}: {e:#}");
            }
        }
    }
    // Say goodbye politely (brokers log abrupt closes).
    let mut bye = BytesMut::new();
    encode(
        &Packet::Disconnect(Disconnect::default()),
        version,
        &mut bye,
    )?;
    for mut s in pub_streams {
        let _ = s.write_all(&bye).await;
    }

    let published: u64 = shared.sent.iter().map(|s| s.load(Relaxed)).sum();
    let secs = elapsed.as_secs_f64();
    let tps = ticks_per_sec() as f64;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(Report {
        label: a.label.clone(),
        qos: a.qos,
        mqtt_version: if version == Version::V5 { 5 } else { 3 },
        publishers: a.publishers,
        subscribers: a.subscribers,
        fanout,
        rate_per_publisher: a.rate,
        payload: a.payload,
        duration_s: secs,
        published,
        publish_per_s: published as f64 / secs,
        pubacks: shared.pubacks.load(Relaxed),
        expected_deliveries: expected,
        delivered: total,
        delivered_per_s: in_window as f64 / secs,
        lost,
        duplicates: dups,
        window_timeouts: shared.window_timeouts.load(Relaxed),
        latency_us_p50: us(0.5),
        latency_us_p90: us(0.9),
        latency_us_p99: us(0.99),
        latency_us_max: hist.max() as f64 / 1000.0,
        broker_cpu_pct: match (cpu0, cpu1) {
            (Some(c0), Some(c1)) => Some(100.0 * (c1 - c0) as f64 / tps / secs),
            _ => None,
        },
        generator_cpu_pct: 100.0 * (self1 - self0) as f64 / tps / secs,
    })
}

/// Opens a TCP connection and completes CONNECT/CONNACK. Returns the stream
/// and any bytes read past the CONNACK.
async fn connect(
    broker: String,
    client_id: String,
    version: Version,
) -> anyhow::Result<(TcpStream, BytesMut)> {
    let mut s = TcpStream::connect(&broker)
        .await
        .with_context(|| format!("connect {broker}"))?;
    s.set_nodelay(true)?;
    let mut out = BytesMut::new();
    encode(
        &Packet::Connect(Connect {
            version,
            client_id,
            clean_start: true,
            keep_alive: 60,
            username: None,
            password: None,
            will: None,
            properties: Properties::default(),
        }),
        version,
        &mut out,
    )?;
    s.write_all(&out).await?;
    let mut buf = BytesMut::with_capacity(4096);
    match tokio::time::timeout(
        Duration::from_secs(10),
        read_packet(&mut s, &mut buf, version),
    )
    .await
    .context("no CONNACK in 10 s")??
    {
        Packet::ConnAck(c) if c.code == 0 => Ok((s, buf)),
        Packet::ConnAck(c) => bail!("CONNACK refused: code {:#x}", c.code),
        p => bail!("expected CONNACK, got {}", p.name()),
    }
}

async fn connect_subscriber(
    broker: String,
    client_id: String,
    version: Version,
    filter: String,
    qos: QoS,
) -> anyhow::Result<(TcpStream, BytesMut)> {
    let (mut s, mut buf) = connect(broker, client_id, version).await?;
    let mut out = BytesMut::new();
    encode(
        &Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter,
                options: SubscriptionOptions {
                    qos,
                    ..SubscriptionOptions::default()
                },
            }],
            properties: Properties::default(),
        }),
        version,
        &mut out,
    )?;
    s.write_all(&out).await?;
    match tokio::time::timeout(
        Duration::from_secs(10),
        read_packet(&mut s, &mut buf, version),
    )
    .await
    .context("no SUBACK in 10 s")??
    {
        Packet::SubAck(a) if a.codes.first().is_some_and(|&c| c < 0x80) => Ok((s, buf)),
        Packet::SubAck(a) => bail!("SUBACK refused: {:?}", a.codes),
        p => bail!("expected SUBACK, got {}", p.name()),
    }
}

async fn read_packet(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    version: Version,
) -> anyhow::Result<Packet> {
    loop {
        if let Some(p) = decode(buf, Some(version), DEFAULT_MAX_PACKET_SIZE)? {
            return Ok(p);
        }
        buf.reserve(4096);
        if s.read_buf(buf).await? == 0 {
            bail!("connection closed by the broker");
        }
    }
}

struct PubCfg {
    id: usize,
    topic: String,
    qos: QoS,
    version: Version,
    rate: f64,
    window: usize,
    window_timeout: Duration,
    payload: usize,
    fanout: u64,
    stop_at: Instant,
    phase: Duration,
}

/// One publisher: returns the write half's stream when done (to send DISCONNECT).
async fn publisher(
    stream: TcpStream,
    mut rbuf: BytesMut,
    c: PubCfg,
    shared: Arc<Shared>,
) -> anyhow::Result<tokio::net::tcp::OwnedWriteHalf> {
    let (mut rd, mut wr) = stream.into_split();
    // QoS 1: permits = messages that may be un-PUBACKed.
    let acks = Arc::new(Semaphore::new(c.window));
    let reader = {
        let (acks, shared, version) = (acks.clone(), shared.clone(), c.version);
        tokio::spawn(async move {
            loop {
                while let Some(p) = decode(&mut rbuf, Some(version), DEFAULT_MAX_PACKET_SIZE)? {
                    if let Packet::PubAck(_) = p {
                        shared.pubacks.fetch_add(1, Relaxed);
                        acks.add_permits(1);
                    }
                }
                rbuf.reserve(4096);
                if rd.read_buf(&mut rbuf).await? == 0 {
                    return anyhow::Ok(());
                }
            }
        })
    };
    let topic: Arc<str> = c.topic.clone().into();
    let mut payload = vec![0u8; c.payload];
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut seq = 0u64;
    let sent = &shared.sent[c.id];
    let delivered = &shared.delivered[c.id];
    let mut written_off = 0u64;
    let window_deliveries = c.window as u64 * c.fanout;
    let mut interval = (c.rate > 0.0).then(|| {
        let mut iv = tokio::time::interval_at(
            tokio::time::Instant::now() + c.phase,
            Duration::from_secs_f64(1.0 / c.rate),
        );
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        iv
    });
    let stop_at = tokio::time::Instant::from_std(c.stop_at);
    'outer: loop {
        // Pace.
        if let Some(iv) = interval.as_mut() {
            tokio::select! {
                _ = iv.tick() => {}
                _ = tokio::time::sleep_until(stop_at) => break,
            }
        } else {
            // End-to-end window: wait until fewer than `window` messages are
            // undelivered (in deliveries: `window * fanout`).
            loop {
                let outstanding =
                    (seq * c.fanout).saturating_sub(delivered.load(Relaxed) + written_off);
                if outstanding < window_deliveries {
                    break;
                }
                shared.waiting[c.id].store(true, Relaxed);
                let notified = shared.wake[c.id].notified();
                // Re-check after registering interest.
                let outstanding =
                    (seq * c.fanout).saturating_sub(delivered.load(Relaxed) + written_off);
                if outstanding < window_deliveries {
                    shared.waiting[c.id].store(false, Relaxed);
                    break;
                }
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep(c.window_timeout) => {
                        shared.window_timeouts.fetch_add(1, Relaxed);
                        written_off += outstanding;
                    }
                    _ = tokio::time::sleep_until(stop_at) => {
                        shared.waiting[c.id].store(false, Relaxed);
                        break 'outer;
                    }
                }
                shared.waiting[c.id].store(false, Relaxed);
            }
        }
        if Instant::now() >= c.stop_at {
            break;
        }
        // Write as many as the windows allow now (one batch per syscall).
        loop {
            let packet_id = if c.qos == QoS::AtLeastOnce {
                match acks.clone().try_acquire_owned() {
                    Ok(p) => p.forget(),
                    Err(_) if out.is_empty() => {
                        tokio::select! {
                            p = acks.clone().acquire_owned() => p?.forget(),
                            _ = tokio::time::sleep_until(stop_at) => break 'outer,
                        }
                    }
                    Err(_) => break,
                }
                Some((seq % 65535) as u16 + 1)
            } else {
                None
            };
            stamp(&mut payload, seq, c.id as u32, shared.now_ns());
            encode(
                &Packet::Publish(Publish {
                    dup: false,
                    qos: c.qos,
                    retain: false,
                    topic: topic.to_string(),
                    packet_id,
                    properties: Properties::default(),
                    payload: Bytes::copy_from_slice(&payload),
                }),
                c.version,
                &mut out,
            )?;
            seq += 1;
            if interval.is_some() {
                break;
            }
            let outstanding =
                (seq * c.fanout).saturating_sub(delivered.load(Relaxed) + written_off);
            if outstanding >= window_deliveries || out.len() >= 32 * 1024 {
                break;
            }
        }
        sent.store(seq, Relaxed);
        wr.write_all(&out).await?;
        out.clear();
    }
    sent.store(seq, Relaxed);
    // Wait briefly for the last PUBACKs, then stop reading.
    if c.qos == QoS::AtLeastOnce {
        let _ =
            tokio::time::timeout(Duration::from_secs(2), acks.acquire_many(c.window as u32)).await;
    }
    reader.abort();
    Ok(wr)
}

/// One subscriber: reads until told to stop.
async fn subscriber(
    stream: TcpStream,
    mut buf: BytesMut,
    version: Version,
    publishers: Vec<usize>,
    n_publishers: usize,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<SubResult> {
    let (mut rd, mut wr) = stream.into_split();
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    // Index by publisher id; `None` for publishers this subscriber does not expect.
    let mut trackers: Vec<Option<SeqTracker>> = vec![None; n_publishers];
    for &p in &publishers {
        trackers[p] = Some(SeqTracker::default());
    }
    let (mut in_window, mut total) = (0u64, 0u64);
    let mut out = BytesMut::new();
    let mut ping = tokio::time::interval(Duration::from_secs(30));
    ping.tick().await;
    loop {
        loop {
            let p = match decode(&mut buf, Some(version), DEFAULT_MAX_PACKET_SIZE) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => return Err(e.into()),
            };
            let Packet::Publish(p) = p else { continue };
            if let Some(id) = p.packet_id {
                encode(&Packet::PubAck(Ack::new(id)), version, &mut out)?;
            }
            let Some((seq, pid, sent_ns)) = unstamp(&p.payload) else {
                continue;
            };
            let now = shared.now_ns();
            let _ = hist.record(now.saturating_sub(sent_ns).max(1));
            total += 1;
            if !shared.stop.load(Relaxed) {
                in_window += 1;
            }
            let pid = pid as usize;
            if let Some(Some(t)) = trackers.get_mut(pid) {
                t.record(seq);
            }
            if let Some(d) = shared.delivered.get(pid) {
                d.fetch_add(1, Relaxed);
                if shared.waiting[pid].load(Relaxed) {
                    shared.wake[pid].notify_one();
                }
            }
        }
        if !out.is_empty() {
            wr.write_all(&out).await?;
            out.clear();
        }
        buf.reserve(64 * 1024);
        tokio::select! {
            r = rd.read_buf(&mut buf) => {
                if r? == 0 {
                    bail!("connection closed by the broker");
                }
            }
            _ = ping.tick() => {
                encode(&Packet::PingReq, version, &mut out)?;
            }
            _ = stop.changed() => break,
        }
    }
    let mut bye = BytesMut::new();
    encode(
        &Packet::Disconnect(Disconnect::default()),
        version,
        &mut bye,
    )?;
    let _ = wr.write_all(&bye).await;
    Ok(SubResult {
        hist,
        in_window,
        total,
        trackers: trackers
            .into_iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|t| (i, t)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_roundtrip() {
        let mut p = vec![0xaau8; 64];
        stamp(&mut p, 0x0102_0304_0506_0708, 77, 123_456_789_012);
        assert_eq!(
            unstamp(&p),
            Some((0x0102_0304_0506_0708, 77, 123_456_789_012))
        );
        assert_eq!(p[HEADER_LEN..], [0xaa; 44]);
        assert_eq!(unstamp(&p[..HEADER_LEN - 1]), None);
    }

    #[test]
    fn tracker_in_order() {
        let mut t = SeqTracker::default();
        for s in 0..10 {
            assert!(t.record(s));
        }
        assert_eq!((t.distinct(), t.lost(10), t.duplicates), (10, 0, 0));
        // Messages sent but never received count as lost.
        assert_eq!(t.lost(12), 2);
    }

    #[test]
    fn tracker_gaps_reorder_and_duplicates() {
        let mut t = SeqTracker::default();
        for s in [0, 1, 3, 4, 2, 4, 1, 7, 7] {
            t.record(s);
        }
        // 0..=4 and 7 received; 5 and 6 missing; 4, 1 and 7 seen twice.
        assert_eq!(t.distinct(), 6);
        assert_eq!(t.lost(8), 2);
        assert_eq!(t.duplicates, 3);
        assert!(t.record(5));
        assert!(t.record(6));
        assert_eq!((t.distinct(), t.lost(8)), (8, 0));
        assert!(!t.record(6));
        assert_eq!(t.duplicates, 4);
    }
}
