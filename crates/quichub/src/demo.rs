//! `quichub demo`: an embedded relay on loopback, one publisher of an audio
//! datagram track, a video stream track and an IMU track, and N subscribers.
//! Prints a live table each second and a summary at the end.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::synth::{self, Profile};
use quichub_client::{
    ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent, TrackMode,
};

/// Demo options.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Seconds to publish.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Number of subscriber sessions.
    #[arg(long, default_value_t = 3)]
    pub subscribers: usize,
    /// Use WebTransport (https://) instead of raw QUIC (moqt://) for clients.
    #[arg(long, conflicts_with = "websocket")]
    pub webtransport: bool,
    /// Use MoQT over WebSocket (ws://, the relay's HTTP port) for clients.
    #[arg(long)]
    pub websocket: bool,
}

#[derive(Default)]
struct Stats {
    received: u64,
    lost: u64,
    hist: Option<hdrhistogram::Histogram<u64>>,
}

pub async fn run(a: DemoArgs) -> anyhow::Result<()> {
    let mut config = quichub_hub::Config::default();
    config.quic.bind = "127.0.0.1:0".into();
    config.quic.http3 = false;
    config.metrics.address = "off".into();
    config.mqtt.tcp = "off".into();
    config.mqtt.tls = "off".into();
    config.http.address = if a.websocket { "127.0.0.1:0" } else { "off" }.into();
    let hub = quichub_hub::Hub::start(config).await?;
    let (addr, fingerprint) = (hub.addr(), hub.fingerprint());
    let (scheme, url) = match (a.webtransport, hub.http_addr()) {
        (true, _) => ("https", format!("https://127.0.0.1:{}/demo", addr.port())),
        (false, Some(http)) => ("ws", format!("ws://{http}/demo")),
        (false, None) => ("moqt", format!("moqt://127.0.0.1:{}/demo", addr.port())),
    };
    println!(
        "quichub demo: relay on udp {} ({}), certificate sha256 {}",
        match hub.http_addr() {
            Some(http) => format!("{addr}, tcp {http}"),
            None => addr.to_string(),
        },
        scheme,
        fingerprint
    );
    let verify = quichub_client::Verify::Fingerprints(vec![
        quichub_net::tls::unhex(&fingerprint).expect("hex")
    ]);
    let opts = ConnectOptions {
        verify,
        ..Default::default()
    };

    let profiles = [Profile::audio(), Profile::video(), Profile::imu()];
    let ns = TrackNamespace::from_path("quichub/demo");
    let publisher = ClientSession::connect(&url, opts.clone()).await?;
    let mut tracks = Vec::new();
    for p in &profiles {
        let name = FullTrackName {
            namespace: ns.clone(),
            name: Bytes::from_static(p.name.as_bytes()),
        };
        tracks.push(
            publisher
                .create_track(name, p.priority, TrackMode::Push)
                .await?,
        );
    }

    // stats[subscriber][track]
    let stats: Arc<Vec<Vec<Mutex<Stats>>>> = Arc::new(
        (0..a.subscribers)
            .map(|_| {
                profiles
                    .iter()
                    .map(|_| Mutex::new(Stats::default()))
                    .collect()
            })
            .collect(),
    );
    let mut subs = Vec::new();
    for s in 0..a.subscribers {
        let session = ClientSession::connect(&url, opts.clone()).await?;
        for (t, p) in profiles.iter().enumerate() {
            let name = FullTrackName {
                namespace: ns.clone(),
                name: Bytes::from_static(p.name.as_bytes()),
            };
            let mut sub = session.subscribe(name, SubscribeOptions::default()).await?;
            let stats = stats.clone();
            subs.push(tokio::spawn(async move {
                let mut last = None::<u64>;
                while let Some(ev) = sub.next().await {
                    let SubscriptionEvent::Object(o) = ev else {
                        if matches!(ev, SubscriptionEvent::Done { .. }) {
                            break;
                        }
                        continue;
                    };
                    let Some((sent, seq)) = synth::stamp(&o.payload) else {
                        continue;
                    };
                    let mut st = stats[s][t].lock().expect("stats");
                    st.received += 1;
                    if let Some(l) = last {
                        st.lost += seq.saturating_sub(l + 1);
                    }
                    last = Some(seq);
                    st.hist
                        .get_or_insert_with(|| hdrhistogram::Histogram::new(3).expect("hist"))
                        .record(synth::now_micros().saturating_sub(sent).max(1))
                        .ok();
                }
            }));
        }
        std::mem::forget(session);
    }

    let until = tokio::time::Instant::now() + Duration::from_secs_f64(a.duration);
    let mut pubs = Vec::new();
    for (t, p) in profiles.iter().enumerate() {
        let track = tracks[t].clone();
        let p = p.clone();
        pubs.push(tokio::spawn(async move {
            synth::run(&track, &p, None, until).await
        }));
    }

    // Live table.
    let started = tokio::time::Instant::now();
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut line = format!("{:>5.1}s", started.elapsed().as_secs_f64());
        for (t, p) in profiles.iter().enumerate() {
            let (mut n, mut p50) = (0u64, 0f64);
            for s in 0..a.subscribers {
                let st = stats[s][t].lock().expect("stats");
                n += st.received;
                if let Some(h) = &st.hist {
                    p50 = p50.max(h.value_at_quantile(0.5) as f64 / 1000.0);
                }
            }
            line.push_str(&format!(
                "  {:<5} {:>7} objs p50 {:>6.2} ms",
                p.name, n, p50
            ));
        }
        println!("{line}");
        std::io::stdout().flush()?;
    }
    let mut sent = Vec::new();
    for h in pubs {
        sent.push(h.await??);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    println!();
    println!(
        "{:<6} {:<9} {:>8} {:>14} {:>8} {:>10} {:>10}",
        "track", "delivery", "sent", "received/sub", "loss %", "p50 ms", "p99 ms"
    );
    for (t, p) in profiles.iter().enumerate() {
        let mut total = 0u64;
        let mut merged = hdrhistogram::Histogram::<u64>::new(3)?;
        for s in 0..a.subscribers {
            let st = stats[s][t].lock().expect("stats");
            total += st.received;
            if let Some(h) = &st.hist {
                merged.add(h)?;
            }
        }
        let per_sub = total as f64 / a.subscribers.max(1) as f64;
        let loss = if sent[t] > 0 {
            100.0 * (1.0 - per_sub / sent[t] as f64)
        } else {
            0.0
        };
        println!(
            "{:<6} {:<9} {:>8} {:>14.1} {:>8.2} {:>10.2} {:>10.2}",
            p.name,
            match p.delivery {
                synth::Delivery::Datagram => "datagram",
                synth::Delivery::Stream => "stream",
            },
            sent[t],
            per_sub,
            loss.max(0.0),
            merged.value_at_quantile(0.5) as f64 / 1000.0,
            merged.value_at_quantile(0.99) as f64 / 1000.0,
        );
    }
    let m = &hub.relay().metrics;
    println!(
        "relay: {} objects in, {} objects out, {} dropped (lagged), {} sessions",
        m.objects_in.load(std::sync::atomic::Ordering::Relaxed),
        m.objects_out.load(std::sync::atomic::Ordering::Relaxed),
        m.drops_lagged.load(std::sync::atomic::Ordering::Relaxed),
        m.sessions_total.load(std::sync::atomic::Ordering::Relaxed),
    );
    for s in subs {
        s.abort();
    }
    publisher.close(0, "demo done");
    Ok(())
}
