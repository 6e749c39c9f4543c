//! A moq-lite subscriber for `quichub-bench fanout --lite`: the load of
//! moq-dev's clients (`@moq/watch`, `moq export`), to measure what the
//! relay's lite bridge costs per delivered object beside draft 18.
//!
//! Raw QUIC with the version's ALPN; lite-05+ exchange SETUP streams; one
//! SUBSCRIBE; every frame of every group stream, and every lite datagram,
//! is one delivered object.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use moqt::lite::group::{Datagram, GroupReader};
use moqt::lite::message::{Setup, Subscribe};
use moqt::lite::{stream, Version};
use quichub_client::synth;
use quichub_net::client::{Client, Dialed};
use web_transport_quinn::quinn;

/// The version a `--lite` value names (`moq-lite-05`, or `5`).
pub fn parse_version(s: &str) -> anyhow::Result<Version> {
    Version::ALL
        .iter()
        .copied()
        .find(|v| v.label() == s || v.number().to_string() == s.trim_start_matches('0'))
        .filter(|v| *v >= Version::Lite03)
        .ok_or_else(|| anyhow::anyhow!("--lite takes moq-lite-03 to moq-lite-06, not {s}"))
}

/// What the subscribers share: the measurement window and its totals.
pub struct Tally {
    /// Objects are counted only while this is set.
    pub measuring: Arc<AtomicBool>,
    /// Objects received while measuring.
    pub received: Arc<AtomicU64>,
    /// One-way latency (µs) of stamped payloads.
    pub hist: Arc<Mutex<hdrhistogram::Histogram<u64>>>,
}

impl Tally {
    fn object(&self, payload: &Bytes, local: &Mutex<hdrhistogram::Histogram<u64>>) {
        if !self.measuring.load(Relaxed) {
            return;
        }
        self.received.fetch_add(1, Relaxed);
        if let Some((sent, _)) = synth::stamp(payload) {
            let _ = local
                .lock()
                .expect("hist")
                .record(synth::now_micros().saturating_sub(sent).max(1));
        }
    }
}

/// Connects one lite subscriber of `broadcast`/`track` and counts what it
/// receives until the connection closes; returns the connection (to close).
pub async fn subscribe(
    client: &Client,
    remote: SocketAddr,
    version: Version,
    broadcast: &str,
    track: &str,
    tally: Arc<Tally>,
) -> anyhow::Result<quinn::Connection> {
    let conn = match client
        .dial(remote, "localhost", version.alpn().as_bytes(), false)
        .await?
    {
        Dialed::Full(c) => c,
        Dialed::Early { conn, .. } => conn,
    };
    if version.has_setup_stream() {
        let mut s = conn.open_uni().await?;
        let mut out = BytesMut::new();
        moqt::legacy::varint::put_varint(&mut out, stream::SETUP);
        Setup::default().encode(&mut out);
        s.write_all(&out).await?;
        let _ = s.finish();
    }
    let (mut send, recv) = conn.open_bi().await?;
    let mut out = BytesMut::new();
    moqt::legacy::varint::put_varint(&mut out, stream::SUBSCRIBE);
    Subscribe {
        id: 0,
        broadcast: broadcast.to_string(),
        track: track.to_string(),
        priority: 128,
        max_age_ms: Some(0),
        start_group: None,
        end_group: None,
        start_frame: 0,
        end_frame: None,
    }
    .encode(version, &mut out);
    send.write_all(&out).await?;
    let local = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));
    let c = conn.clone();
    tokio::spawn(async move {
        // Held open: finishing it would unsubscribe.
        let (_send, _recv) = (send, recv);
        loop {
            tokio::select! {
                uni = c.accept_uni() => {
                    let Ok(mut s) = uni else { break };
                    let (tally, local) = (tally.clone(), local.clone());
                    tokio::spawn(async move {
                        let mut reader: Option<GroupReader> = None;
                        let mut frames = Vec::new();
                        while let Ok(Some(chunk)) = s.read_chunk(64 * 1024, true).await {
                            let mut bytes = chunk.bytes;
                            let r = match reader.as_mut() {
                                Some(r) => r,
                                None => {
                                    // The stream type: a group, or the relay's SETUP.
                                    if bytes.first() != Some(&(stream::GROUP as u8)) {
                                        return;
                                    }
                                    let _ = bytes.split_to(1);
                                    reader.insert(GroupReader::new(version, 4 << 20))
                                }
                            };
                            if r.push(bytes, &mut frames).is_err() {
                                return;
                            }
                            for f in frames.drain(..) {
                                tally.object(&f.payload, &local);
                            }
                        }
                    });
                }
                d = c.read_datagram() => {
                    let Ok(d) = d else { break };
                    if let Ok(dg) = Datagram::decode(&d) {
                        tally.object(&dg.payload, &local);
                    }
                }
            }
        }
        let h = local.lock().expect("hist").clone();
        tally.hist.lock().expect("hist").add(&h).ok();
    });
    Ok(conn)
}
