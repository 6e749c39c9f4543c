//! Datagram fan-out across the endpoint shards (`relay --endpoints N`): a
//! track's subscribers are grouped by the shard (thread) their session runs
//! on. The publisher's thread sends to the subscribers of its own shard
//! itself and hands each object once to every other shard that has
//! subscribers of the track; that shard's worker sends it to them. So an
//! object crosses threads at most once per shard, not once per subscriber,
//! and each subscriber's connection is woken by the thread that drives it.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::object::Object;
use crate::sink::DatagramSink;

/// Objects a shard's worker may have waiting before hand-offs to it are
/// dropped (datagrams: dropping beats queueing behind an overloaded core).
const QUEUE: usize = 8192;

/// The subscribers of one track on one shard.
#[derive(Debug, Default)]
pub(crate) struct ShardSinks {
    sinks: Mutex<Vec<Arc<DatagramSink>>>,
    len: AtomicUsize,
}

impl ShardSinks {
    pub(crate) fn push(&self, sink: Arc<DatagramSink>) {
        let mut s = self.sinks.lock().expect("shard sinks");
        s.push(sink);
        self.len.store(s.len(), Relaxed);
    }

    pub(crate) fn remove(&self, sink: &Arc<DatagramSink>) {
        let mut s = self.sinks.lock().expect("shard sinks");
        s.retain(|x| !Arc::ptr_eq(x, sink));
        self.len.store(s.len(), Relaxed);
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Relaxed)
    }

    /// Offers `o` to every sink; returns how many took it.
    pub(crate) fn offer(&self, o: &Arc<Object>, now: Instant, metrics: &Metrics) -> u64 {
        let s = self.sinks.lock().expect("shard sinks");
        s.iter().filter(|x| x.offer(o, now, metrics)).count() as u64
    }
}

/// One object for one shard's subscribers of a track.
struct Handoff {
    sinks: Arc<ShardSinks>,
    object: Arc<Object>,
}

/// The shards' workers (none until [`Fanout::start`]).
#[derive(Debug, Default)]
pub struct Fanout {
    workers: OnceLock<Vec<mpsc::Sender<Handoff>>>,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").finish_non_exhaustive()
    }
}

impl Fanout {
    /// Starts a worker on each shard's runtime (shard `i` is `runtimes[i]`).
    /// Tracks created from now on group their subscribers by shard.
    pub(crate) fn start(&self, runtimes: &[tokio::runtime::Handle], metrics: Arc<Metrics>) {
        let workers = runtimes
            .iter()
            .map(|rt| {
                let (tx, rx) = mpsc::channel(QUEUE);
                rt.spawn(worker(rx, metrics.clone()));
                tx
            })
            .collect();
        let _ = self.workers.set(workers);
    }

    /// How many shards there are (0 before [`Fanout::start`]).
    pub(crate) fn shards(&self) -> usize {
        self.workers.get().map_or(0, Vec::len)
    }

    /// Hands `object` to shard `shard` for `sinks`; false when its queue is
    /// full or it is gone.
    pub(crate) fn hand_off(
        &self,
        shard: usize,
        sinks: &Arc<ShardSinks>,
        object: &Arc<Object>,
    ) -> bool {
        let Some(tx) = self.workers.get().and_then(|w| w.get(shard)) else {
            return false;
        };
        tx.try_send(Handoff {
            sinks: sinks.clone(),
            object: object.clone(),
        })
        .is_ok()
    }
}

async fn worker(mut rx: mpsc::Receiver<Handoff>, metrics: Arc<Metrics>) {
    let mut batch = Vec::with_capacity(64);
    while rx.recv_many(&mut batch, 64).await > 0 {
        let now = Instant::now();
        for h in batch.drain(..) {
            let sent = h.sinks.offer(&h.object, now, &metrics);
            metrics.objects_out.fetch_add(sent, Relaxed);
            metrics
                .bytes_out
                .fetch_add(sent * h.object.payload.len() as u64, Relaxed);
        }
    }
}
