//! Direct fan-out of datagram objects. A datagram never blocks (QUIC drops the
//! oldest when a connection's datagram buffer is full), so the relay sends it
//! to every subscriber from the publisher's task, one loop over the track's
//! sinks, instead of waking one task per subscriber per object. The bytes are
//! encoded once per object and shared by all sinks.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moqt::Location;
use quichub_net::Session;
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::object::Object;

/// The part of a subscription that decides whether a datagram is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkFilter {
    /// Forward State.
    pub forward: bool,
    /// First Location that passes.
    pub start: Location,
    /// Last group that passes.
    pub end_group: Option<u64>,
    /// OBJECT_DELIVERY_TIMEOUT.
    pub object_timeout: Option<Duration>,
}

/// Until the subscription is answered, datagrams wait (bounded) so none falls
/// between joining the track and knowing the filter.
const MAX_QUEUED: usize = 64;

#[derive(Debug)]
enum State {
    Pending(Vec<Arc<Object>>),
    Active(SinkFilter),
}

/// Where a sink's datagram objects go.
// Nearly every sink is a session; boxing it would add a pointer chase per
// datagram on the fan-out hot path to save bytes on the rare local sink.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum SinkTarget {
    /// A downstream MoQT session, as OBJECT_DATAGRAMs with this Track Alias.
    Session {
        /// The session.
        session: Session,
        /// Track Alias.
        alias: u64,
    },
    /// An in-process consumer (the MQTT/HTTP gateway). The channel is bounded
    /// and never awaited: a full channel drops the object, as a full QUIC
    /// datagram queue would.
    Local(mpsc::Sender<Arc<Object>>),
}

/// One subscriber's datagram path.
#[derive(Debug)]
pub struct DatagramSink {
    target: SinkTarget,
    state: Mutex<State>,
}

impl DatagramSink {
    /// A sink for `session`, sending with Track Alias `alias`, not yet active.
    pub fn new(session: Session, alias: u64) -> Self {
        Self::with_target(SinkTarget::Session { session, alias })
    }

    /// A sink delivering to `target`, not yet active.
    pub fn with_target(target: SinkTarget) -> Self {
        Self {
            target,
            state: Mutex::new(State::Pending(Vec::new())),
        }
    }

    /// Whether it sends to a MoQT session (not an in-process consumer).
    pub fn is_session(&self) -> bool {
        matches!(self.target, SinkTarget::Session { .. })
    }

    /// Applies a filter; the first call also sends what was queued.
    pub fn activate(&self, filter: SinkFilter, metrics: &Metrics) {
        let queued = {
            let mut st = self.state.lock().expect("sink");
            match std::mem::replace(&mut *st, State::Active(filter)) {
                State::Pending(q) => q,
                State::Active(_) => Vec::new(),
            }
        };
        let now = Instant::now();
        for o in queued {
            self.offer(&o, now, metrics);
        }
    }

    /// Sends `o` if it passes; returns whether it was handed to the transport.
    /// `now` is taken once per fan-out by the caller: reading the clock per
    /// subscriber was a measurable share of the fan-out loop.
    pub fn offer(&self, o: &Arc<Object>, now: Instant, metrics: &Metrics) -> bool {
        let filter = {
            let mut st = self.state.lock().expect("sink");
            match &mut *st {
                State::Pending(q) => {
                    if q.len() < MAX_QUEUED {
                        q.push(o.clone());
                    }
                    return false;
                }
                State::Active(f) => *f,
            }
        };
        if !filter.forward
            || o.location() < filter.start
            || filter.end_group.is_some_and(|e| o.group > e)
        {
            return false;
        }
        if filter
            .object_timeout
            .is_some_and(|t| now.saturating_duration_since(o.received) > t)
        {
            metrics.drops_timeout.fetch_add(1, Relaxed);
            return false;
        }
        let sent = match &self.target {
            SinkTarget::Session { session, alias } => {
                // A WebTransport session's header goes in front of the shared
                // encoding once per object, not once per subscriber.
                let header = session.datagram_header();
                let framed = if header.is_empty() {
                    None
                } else {
                    o.framed_datagram(*alias, header)
                };
                match framed {
                    Some(framed) => session.send_datagram_prefixed(framed),
                    None => session.send_datagram(o.datagram(*alias)),
                }
                .is_ok()
            }
            SinkTarget::Local(tx) => tx.try_send(o.clone()).is_ok(),
        };
        if sent {
            true
        } else {
            metrics.drops_datagram.fetch_add(1, Relaxed);
            false
        }
    }
}
