//! `quichub-bench conn`: what connections cost a running relay, read from its
//! `/proc/PID/status` (VmRSS, VmHWM). Two loads:
//!
//! - `--connections N`: N idle connections (MoQT sessions with SETUP done for
//!   `moqt-18`; bare QUIC connections for `h3` and `mqtt`), held for
//!   `--hold` seconds; prints the relay's resident memory per connection.
//! - `--flood RATE`: RATE connection attempts per second for `--duration`
//!   seconds that never complete their handshake (see
//!   `quichub_net::flood`); prints the relay's peak resident memory.
//!
//! Aim it only at a relay you run.

use std::time::{Duration, Instant};

use anyhow::Context;
use quichub_client::{ClientSession, ConnectOptions, Verify};
use quichub_net::client::{Client, Dialed};

/// Options.
#[derive(clap::Args, Debug)]
pub struct BenchConnArgs {
    /// Relay URL (`moqt://host:port/path`).
    #[arg(long, default_value = "moqt://127.0.0.1:4443/bench")]
    pub relay: String,
    /// PID of the relay process (its memory is read from /proc).
    #[arg(long)]
    pub relay_pid: u32,
    /// ALPN of the idle connections: moqt-18, h3 or mqtt.
    #[arg(long, default_value = "moqt-18")]
    pub alpn: String,
    /// Idle connections to open (0 with `--flood`).
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// Seconds to hold the idle connections before measuring.
    #[arg(long, default_value_t = 3.0)]
    pub hold: f64,
    /// Handshake attempts per second (a flood of Initials that never complete).
    #[arg(long)]
    pub flood: Option<u32>,
    /// Seconds of flooding.
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// Send a token (`?jwt=` in --relay) although the relay's certificate
    /// is not checked.
    #[arg(long)]
    pub insecure: bool,
}

/// (VmRSS, VmHWM) of `pid`, in kB.
fn memory_kb(pid: u32) -> anyhow::Result<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status (is --relay-pid right?)"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Runs the benchmark.
pub async fn run(a: BenchConnArgs) -> anyhow::Result<()> {
    let url = url::Url::parse(&a.relay).with_context(|| format!("bad URL {:?}", a.relay))?;
    quichub_client::refuse_unverified_token(&a.relay, &Verify::Insecure, a.insecure)?;
    let host = url.host_str().context("URL has no host")?;
    let port = url.port().context("URL needs a port")?;
    let remote = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .with_context(|| format!("cannot resolve {host}"))?;
    let (rss0, _) = memory_kb(a.relay_pid)?;
    println!("relay RSS before: {rss0} kB");
    if let Some(rate) = a.flood {
        let mut flood = quichub_net::flood::Flooder::new(remote, a.alpn.as_bytes())?;
        let duration = Duration::from_secs_f64(a.duration);
        let start = Instant::now();
        let sampler = {
            let pid = a.relay_pid;
            tokio::spawn(async move {
                let mut peak = 0;
                while start.elapsed() < duration + Duration::from_secs(2) {
                    if let Ok((rss, _)) = memory_kb(pid) {
                        peak = peak.max(rss);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                peak
            })
        };
        let sent = flood.run(rate, duration).await?;
        let peak = sampler.await?;
        let (rss1, _) = memory_kb(a.relay_pid)?;
        println!(
            "flood: {sent} handshake attempts in {:.1} s ({rate}/s, ALPN {})",
            a.duration, a.alpn
        );
        println!(
            "relay RSS peak {peak} kB (+{} kB), after {rss1} kB",
            peak.saturating_sub(rss0)
        );
        return Ok(());
    }
    let endpoint = Client::new(
        if remote.is_ipv6() {
            "[::]:0".parse()?
        } else {
            "0.0.0.0:0".parse()?
        },
        Verify::Insecure,
    )?;
    let mut sessions = Vec::with_capacity(a.connections);
    let mut conns = Vec::with_capacity(a.connections);
    for i in 0..a.connections {
        if a.alpn == moqt::ALPN {
            let opts = ConnectOptions {
                verify: Verify::Insecure,
                endpoint: Some(endpoint.clone()),
                timeout: Duration::from_secs(10),
                ..Default::default()
            };
            let s = ClientSession::connect(a.relay.as_str(), opts)
                .await
                .with_context(|| format!("session {i}"))?;
            sessions.push(s);
        } else {
            match endpoint
                .dial(remote, host, a.alpn.as_bytes(), false)
                .await
                .with_context(|| format!("connection {i}"))?
            {
                Dialed::Full(c) => conns.push(c),
                Dialed::Early { conn, .. } => conns.push(conn),
            }
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(a.hold)).await;
    let (rss1, _) = memory_kb(a.relay_pid)?;
    let n = a.connections.max(1) as f64;
    println!(
        "{} idle connections (ALPN {}): relay RSS {rss1} kB, {:.1} kB per connection",
        a.connections,
        a.alpn,
        rss1.saturating_sub(rss0) as f64 / n
    );
    for s in &sessions {
        s.close(0, "done");
    }
    for c in &conns {
        c.close(0u32.into(), b"done");
    }
    endpoint.wait_idle().await;
    Ok(())
}
