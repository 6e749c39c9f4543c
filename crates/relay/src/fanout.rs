//! Fan-out across the endpoint shards (`relay --endpoints N`): a track's
//! subscribers are grouped by the shard (thread) their session runs on, and
//! an object crosses threads at most once per shard that has subscribers of
//! the track, not once per subscriber; each subscriber is woken by the thread
//! that drives its connection.
//!
//! - Datagrams: the publisher's thread sends to the subscribers of its own
//!   shard itself and hands the object to every other shard's worker, which
//!   sends it to that shard's subscribers ([`ShardSinks`]).
//! - Subgroup streams: objects stay in the track's one ring; subscribers on a
//!   shard wait on that shard's [`ShardWake`] instead of on the ring, and
//!   the publisher hands the shard's worker one wake-up (coalesced while one
//!   is pending), which wakes them on their own thread. Nothing can be lost
//!   on the way: the data never leaves the ring, and a wake-up that finds
//!   the worker's queue full is delivered by the publisher's thread itself.

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

/// The stream subscribers of one track on one shard: what they wait on.
#[derive(Debug, Default)]
pub(crate) struct ShardWake {
    notify: tokio::sync::Notify,
    /// A wake-up is queued for the shard's worker (later events ride on it).
    pending: std::sync::atomic::AtomicBool,
    receivers: AtomicUsize,
}

impl ShardWake {
    /// Counts a subscriber until the returned guard is dropped.
    pub(crate) fn join(self: &Arc<Self>) -> ShardWait {
        self.receivers.fetch_add(1, Relaxed);
        ShardWait(self.clone())
    }

    pub(crate) fn receivers(&self) -> usize {
        self.receivers.load(Relaxed)
    }

    /// Wakes the shard's subscribers now (call on the shard's thread, or as
    /// the fallback when the worker cannot take a wake-up).
    pub(crate) fn wake(&self) {
        self.notify.notify_waiters();
    }
}

/// A subscriber's place among a shard's stream subscribers of a track.
#[derive(Debug)]
pub struct ShardWait(Arc<ShardWake>);

impl Drop for ShardWait {
    fn drop(&mut self) {
        self.0.receivers.fetch_sub(1, Relaxed);
    }
}

impl ShardWait {
    /// The next event of `rx`, waiting for this shard's wake-ups instead of
    /// the ring's (cancel-safe, like `Receiver::recv`).
    pub async fn recv(
        &self,
        rx: &mut tokio::sync::broadcast::Receiver<crate::object::TrackEvent>,
    ) -> Result<crate::object::TrackEvent, tokio::sync::broadcast::error::RecvError> {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        loop {
            // Registered before looking, so a wake-up between the look and
            // the wait is not missed.
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match rx.try_recv() {
                Ok(ev) => return Ok(ev),
                Err(TryRecvError::Empty) => notified.await,
                Err(TryRecvError::Lagged(n)) => return Err(RecvError::Lagged(n)),
                Err(TryRecvError::Closed) => return Err(RecvError::Closed),
            }
        }
    }
}

/// Work for a shard's worker.
enum Handoff {
    /// A datagram object for the shard's subscribers of a track.
    Datagram {
        sinks: Arc<ShardSinks>,
        object: Arc<Object>,
    },
    /// New events in a track's ring for the shard's stream subscribers.
    Wake(Arc<ShardWake>),
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
        tx.try_send(Handoff::Datagram {
            sinks: sinks.clone(),
            object: object.clone(),
        })
        .is_ok()
    }

    /// Makes shard `shard`'s worker wake `wake`'s subscribers, unless a
    /// wake-up is already pending there; returns whether it handed one off.
    /// When the worker cannot take it, wakes them from this thread.
    pub(crate) fn wake(&self, shard: usize, wake: &Arc<ShardWake>) -> bool {
        if wake.pending.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return false;
        }
        let sent = self
            .workers
            .get()
            .and_then(|w| w.get(shard))
            .is_some_and(|tx| tx.try_send(Handoff::Wake(wake.clone())).is_ok());
        if !sent {
            wake.pending
                .store(false, std::sync::atomic::Ordering::Release);
            wake.wake();
        }
        sent
    }
}

async fn worker(mut rx: mpsc::Receiver<Handoff>, metrics: Arc<Metrics>) {
    let mut batch = Vec::with_capacity(64);
    while rx.recv_many(&mut batch, 64).await > 0 {
        let now = Instant::now();
        for h in batch.drain(..) {
            match h {
                Handoff::Datagram { sinks, object } => {
                    let sent = sinks.offer(&object, now, &metrics);
                    metrics.objects_out.fetch_add(sent, Relaxed);
                    metrics
                        .bytes_out
                        .fetch_add(sent * object.payload.len() as u64, Relaxed);
                }
                Handoff::Wake(w) => {
                    // Cleared first: an event sent after this queues a new
                    // wake-up; one sent before is seen by the woken.
                    w.pending.store(false, std::sync::atomic::Ordering::Release);
                    w.wake();
                }
            }
        }
    }
}
