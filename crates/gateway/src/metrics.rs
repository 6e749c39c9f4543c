//! The broker's counters, for `/metrics` (Prometheus text format) and the
//! `$SYS` topics ([`crate::sys`]).
//!
//! Everything a message or a connection touches is a relaxed atomic: the hot
//! path pays one `fetch_add` per event and never a lock. Gauges that describe
//! the broker's state (sessions, subscriptions, retained and queued messages)
//! are not kept here but counted from that state when rendered
//! ([`crate::Broker::render_metrics`]), so they can never drift.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use quichub_mqtt::QoS;

/// Why a delivery was dropped: the `reason` label of
/// `quichub_mqtt_messages_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The session's queue, or its connection's delivery channel, held
    /// [`BrokerConfig::max_queued`](crate::BrokerConfig::max_queued) messages.
    QueueFull,
    /// The Message Expiry Interval ran out before the message was sent.
    Expired,
    /// A QoS 0 delivery was pending on a connection that closed (QoS 0 is
    /// not kept for an offline session).
    Disconnected,
    /// The subscriber's identity may not read the message's topic (an ACL
    /// checked per delivery: a wildcard subscription, a rule changed by a
    /// reload).
    NotAuthorized,
}

impl DropReason {
    /// Every reason, in the order of [`BrokerMetrics::dropped_by`].
    pub const ALL: [DropReason; 4] = [
        DropReason::QueueFull,
        DropReason::Expired,
        DropReason::Disconnected,
        DropReason::NotAuthorized,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::Expired => "expired",
            DropReason::Disconnected => "disconnected",
            DropReason::NotAuthorized => "not_authorized",
        }
    }
}

/// Which limit held a client's PUBLISH back: the `limit` label of
/// `quichub_mqtt_throttled_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleReason {
    /// `publish_rate`: PUBLISH packets per second.
    Messages,
    /// `publish_bytes_rate`: bytes of PUBLISH packets per second.
    Bytes,
}

impl ThrottleReason {
    /// Every reason, in the order of [`BrokerMetrics::throttled`].
    pub const ALL: [ThrottleReason; 2] = [ThrottleReason::Messages, ThrottleReason::Bytes];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            ThrottleReason::Messages => "messages",
            ThrottleReason::Bytes => "bytes",
        }
    }
}

/// What an MQTT connection runs over: the `transport` label of the
/// connection metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Plain TCP.
    #[default]
    Tcp,
    /// TLS over TCP.
    Tls,
    /// QUIC (ALPN `mqtt`).
    Quic,
}

impl Transport {
    /// Every transport, in the order of the per-transport arrays.
    pub const ALL: [Transport; 3] = [Transport::Tcp, Transport::Tls, Transport::Quic];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Quic => "quic",
        }
    }
}

/// Counters, for `/metrics`, `$SYS` and the benchmark.
#[derive(Debug, Default)]
pub struct BrokerMetrics {
    /// Messages published into the broker (by MQTT, HTTP, MoQT, wills;
    /// not the broker's own `$SYS` messages).
    pub published: AtomicU64,
    /// Deliveries handed to connections.
    pub delivered: AtomicU64,
    /// Deliveries dropped, for any reason.
    pub dropped: AtomicU64,
    /// Deliveries dropped by reason, indexed as [`DropReason::ALL`].
    pub dropped_by: [AtomicU64; 4],
    /// Deliveries queued for offline sessions.
    pub queued_offline: AtomicU64,
    /// Messages published into the broker, by their QoS (0, 1, 2).
    pub received_by_qos: [AtomicU64; 3],
    /// PUBLISH packets written to MQTT clients, by their QoS.
    pub sent_by_qos: [AtomicU64; 3],
    /// Bytes read from MQTT connections.
    pub bytes_received: AtomicU64,
    /// Bytes written to MQTT connections.
    pub bytes_sent: AtomicU64,
    /// MQTT connections open now (CONNECT accepted), indexed as
    /// [`Transport::ALL`].
    pub connections: [AtomicU64; 3],
    /// MQTT connections accepted since start, indexed as [`Transport::ALL`].
    pub connections_total: [AtomicU64; 3],
    /// Most MQTT connections open at once since start.
    pub connections_max: AtomicU64,
    /// Times a connection stopped reading its client's PUBLISHes until
    /// its tokens were back, indexed as [`ThrottleReason::ALL`].
    pub throttled: [AtomicU64; 2],
}

/// Counts one open MQTT connection while it lives (see
/// [`BrokerMetrics::connection_opened`]).
#[derive(Debug)]
pub struct ConnectionGuard<'a> {
    metrics: &'a BrokerMetrics,
    transport: Transport,
}

impl Drop for ConnectionGuard<'_> {
    fn drop(&mut self) {
        self.metrics.connections[self.transport as usize].fetch_sub(1, Relaxed);
    }
}

fn qos_index(q: QoS) -> usize {
    match q {
        QoS::AtMostOnce => 0,
        QoS::AtLeastOnce => 1,
        QoS::ExactlyOnce => 2,
    }
}

fn sum(a: &[AtomicU64]) -> u64 {
    a.iter().map(|x| x.load(Relaxed)).sum()
}

impl BrokerMetrics {
    pub(crate) fn count_drop(&self, reason: DropReason) {
        self.dropped.fetch_add(1, Relaxed);
        self.dropped_by[reason as usize].fetch_add(1, Relaxed);
    }

    /// A connection stopped reading for `reason`.
    pub(crate) fn count_throttled(&self, reason: ThrottleReason) {
        self.throttled[reason as usize].fetch_add(1, Relaxed);
    }

    /// Times connections stopped reading for `reason`.
    pub fn throttled(&self, reason: ThrottleReason) -> u64 {
        self.throttled[reason as usize].load(Relaxed)
    }

    /// Deliveries dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped_by[reason as usize].load(Relaxed)
    }

    /// A message entered the broker.
    pub(crate) fn count_received(&self, qos: QoS) {
        self.received_by_qos[qos_index(qos)].fetch_add(1, Relaxed);
    }

    /// A PUBLISH of `qos` was written to an MQTT client.
    pub(crate) fn count_sent(&self, qos: QoS) {
        self.sent_by_qos[qos_index(qos)].fetch_add(1, Relaxed);
    }

    /// Messages received, all QoS.
    pub fn received(&self) -> u64 {
        sum(&self.received_by_qos)
    }

    /// PUBLISH packets sent, all QoS.
    pub fn sent(&self) -> u64 {
        sum(&self.sent_by_qos)
    }

    /// MQTT connections open now, all transports.
    pub fn connected(&self) -> u64 {
        sum(&self.connections)
    }

    /// MQTT connections accepted since start, all transports.
    pub fn connections_accepted(&self) -> u64 {
        sum(&self.connections_total)
    }

    /// Counts a connection whose CONNECT was accepted, until the guard drops.
    pub fn connection_opened(&self, transport: Transport) -> ConnectionGuard<'_> {
        let i = transport as usize;
        self.connections_total[i].fetch_add(1, Relaxed);
        self.connections[i].fetch_add(1, Relaxed);
        // Sums the gauges (not exact under a race, as any sampled maximum).
        self.connections_max.fetch_max(self.connected(), Relaxed);
        ConnectionGuard {
            metrics: self,
            transport,
        }
    }

    /// The counters in Prometheus text format, to append to the relay's
    /// `/metrics` (without the state gauges: see
    /// [`crate::Broker::render_metrics`]).
    pub fn render(&self) -> String {
        let mut s = String::new();
        family(
            &mut s,
            "quichub_mqtt_messages_dropped_total",
            "counter",
            "MQTT deliveries dropped, by reason.",
        );
        for r in DropReason::ALL {
            sample(
                &mut s,
                "quichub_mqtt_messages_dropped_total",
                &[("reason", r.label())],
                self.dropped(r),
            );
        }
        family(
            &mut s,
            "quichub_mqtt_throttled_total",
            "counter",
            "Times an MQTT connection stopped reading its client's PUBLISHes until the client was back within its publish_rate (messages) or publish_bytes_rate (bytes).",
        );
        for r in ThrottleReason::ALL {
            sample(
                &mut s,
                "quichub_mqtt_throttled_total",
                &[("limit", r.label())],
                self.throttled(r),
            );
        }
        for (name, help, by) in [
            (
                "quichub_mqtt_messages_received_total",
                "Messages published into the broker (MQTT, HTTP, MoQT, wills), by QoS.",
                &self.received_by_qos,
            ),
            (
                "quichub_mqtt_messages_sent_total",
                "PUBLISH packets written to MQTT clients, by QoS.",
                &self.sent_by_qos,
            ),
        ] {
            family(&mut s, name, "counter", help);
            for (q, v) in ["0", "1", "2"].into_iter().zip(by) {
                sample(&mut s, name, &[("qos", q)], v.load(Relaxed));
            }
        }
        for (name, kind, help, v) in [
            (
                "quichub_mqtt_messages_queued_total",
                "counter",
                "Deliveries queued for offline sessions.",
                &self.queued_offline,
            ),
            (
                "quichub_mqtt_bytes_received_total",
                "counter",
                "Bytes read from MQTT connections.",
                &self.bytes_received,
            ),
            (
                "quichub_mqtt_bytes_sent_total",
                "counter",
                "Bytes written to MQTT connections.",
                &self.bytes_sent,
            ),
            (
                "quichub_mqtt_connections_max",
                "gauge",
                "Most MQTT connections open at once since start.",
                &self.connections_max,
            ),
        ] {
            family(&mut s, name, kind, help);
            sample(&mut s, name, &[], v.load(Relaxed));
        }
        for (name, kind, help, by) in [
            (
                "quichub_mqtt_connections",
                "gauge",
                "MQTT connections open now (CONNECT accepted), by transport.",
                &self.connections,
            ),
            (
                "quichub_mqtt_connections_total",
                "counter",
                "MQTT connections accepted since start, by transport.",
                &self.connections_total,
            ),
        ] {
            family(&mut s, name, kind, help);
            for (t, v) in Transport::ALL.into_iter().zip(by) {
                sample(&mut s, name, &[("transport", t.label())], v.load(Relaxed));
            }
        }
        s
    }
}

/// `# HELP` and `# TYPE` of a metric family.
pub(crate) fn family(s: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample line. Label values here are fixed identifiers (no escaping
/// needed), never client input.
pub(crate) fn sample(
    s: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    v: impl std::fmt::Display,
) {
    s.push_str(name);
    if !labels.is_empty() {
        s.push('{');
        for (i, (k, val)) in labels.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(s, "{k}=\"{val}\"");
        }
        s.push('}');
    }
    let _ = writeln!(s, " {v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }

    #[test]
    fn connections_are_counted_per_transport_while_open() {
        let m = BrokerMetrics::default();
        let a = m.connection_opened(Transport::Tcp);
        let b = m.connection_opened(Transport::Quic);
        let c = m.connection_opened(Transport::Quic);
        assert_eq!(m.connected(), 3);
        drop((a, b));
        assert_eq!(m.connected(), 1);
        let _d = m.connection_opened(Transport::Tls);
        drop(c);
        let t = m.render();
        has(&t, "# TYPE quichub_mqtt_connections gauge");
        has(&t, "quichub_mqtt_connections{transport=\"tcp\"} 0");
        has(&t, "quichub_mqtt_connections{transport=\"tls\"} 1");
        has(&t, "quichub_mqtt_connections{transport=\"quic\"} 0");
        has(&t, "# TYPE quichub_mqtt_connections_total counter");
        has(&t, "quichub_mqtt_connections_total{transport=\"quic\"} 2");
        has(&t, "quichub_mqtt_connections_max 3");
        assert_eq!(m.connections_accepted(), 4);
    }

    #[test]
    fn messages_are_counted_by_qos() {
        let m = BrokerMetrics::default();
        m.count_received(QoS::AtMostOnce);
        m.count_received(QoS::ExactlyOnce);
        m.count_received(QoS::ExactlyOnce);
        m.count_sent(QoS::AtLeastOnce);
        let t = m.render();
        has(&t, "# HELP quichub_mqtt_messages_received_total Messages published into the broker (MQTT, HTTP, MoQT, wills), by QoS.");
        has(&t, "quichub_mqtt_messages_received_total{qos=\"0\"} 1");
        has(&t, "quichub_mqtt_messages_received_total{qos=\"2\"} 2");
        has(&t, "quichub_mqtt_messages_sent_total{qos=\"1\"} 1");
        has(&t, "quichub_mqtt_messages_sent_total{qos=\"0\"} 0");
        assert_eq!((m.received(), m.sent()), (3, 1));
    }
}
