//! The `$SYS/broker/...` topics, as mosquitto publishes them: the broker's
//! counters and state every [`BrokerConfig::sys_interval`] seconds, as
//! retained QoS 0 messages, each only when its value changed (the uptime
//! always does). Subscribers see them only through a filter that starts with
//! `$SYS` (a leading `#` or `+` does not match a `$` topic, MQTT §4.7.2).
//!
//! Sans-IO: [`Sys::update`] turns a [`Snapshot`] taken at `now` into the
//! messages to publish; [`crate::Broker::tick`] takes the snapshot and
//! publishes them.
//!
//! The `load/.../1min`, `5min` and `15min` values are mosquitto's: the rate
//! per minute over the last interval, smoothed by an exponential moving
//! average with a time constant of 1, 5 and 15 minutes (as Unix load
//! averages), printed with two decimals.
//!
//! [`BrokerConfig::sys_interval`]: crate::BrokerConfig::sys_interval

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The prefix of every topic.
pub const PREFIX: &str = "$SYS/broker/";

/// What the broker looks like at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Sessions with a connection attached.
    pub connected: u64,
    /// Sessions, connected or kept for a reconnect.
    pub sessions: u64,
    /// Most connections open at once since start.
    pub maximum: u64,
    /// Messages published into the broker since start.
    pub received: u64,
    /// PUBLISH packets sent to clients since start.
    pub sent: u64,
    /// Deliveries dropped since start.
    pub dropped: u64,
    /// Messages held: retained, and queued for offline sessions.
    pub stored: u64,
    /// Retained messages.
    pub retained: u64,
    /// Subscriptions over all sessions.
    pub subscriptions: u64,
    /// Bytes read from MQTT connections since start.
    pub bytes_received: u64,
    /// Bytes written to MQTT connections since start.
    pub bytes_sent: u64,
    /// Connections accepted since start.
    pub connections: u64,
}

/// The counters with `load/...` averages: (topic under `load/`, value).
fn rated(s: &Snapshot) -> [(&'static str, u64); 5] {
    [
        ("messages/received", s.received),
        ("messages/sent", s.sent),
        ("bytes/received", s.bytes_received),
        ("bytes/sent", s.bytes_sent),
        ("connections", s.connections),
    ]
}

/// Averaging windows, minutes.
const WINDOWS: [(&str, f64); 3] = [("1min", 1.0), ("5min", 5.0), ("15min", 15.0)];

/// The publisher's state.
#[derive(Debug)]
pub struct Sys {
    started: Instant,
    /// When the topics were last published, and the counters then.
    last: Option<(Instant, Snapshot)>,
    /// Moving averages, per rated counter and window.
    loads: [[f64; 3]; 5],
    /// Last value published per topic.
    published: HashMap<String, String>,
}

impl Sys {
    /// A publisher for a broker that started at `started`.
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            last: None,
            loads: [[0.0; 3]; 5],
            published: HashMap::new(),
        }
    }

    /// Whether the topics are due at `now`, publishing every `interval`
    /// (zero: never).
    pub fn due(&self, now: Instant, interval: Duration) -> bool {
        !interval.is_zero()
            && self
                .last
                .is_none_or(|(t, _)| now.saturating_duration_since(t) >= interval)
    }

    /// The (topic, payload) pairs to publish at `now`: every topic whose
    /// value changed since it was last published (all of them the first
    /// time).
    pub fn update(&mut self, now: Instant, s: &Snapshot) -> Vec<(String, String)> {
        let mut values: Vec<(String, String)> = vec![
            (
                "version".into(),
                format!("quichub version {}", env!("CARGO_PKG_VERSION")),
            ),
            (
                "uptime".into(),
                format!(
                    "{} seconds",
                    now.saturating_duration_since(self.started).as_secs()
                ),
            ),
            ("clients/connected".into(), s.connected.to_string()),
            (
                "clients/disconnected".into(),
                s.sessions.saturating_sub(s.connected).to_string(),
            ),
            ("clients/total".into(), s.sessions.to_string()),
            ("clients/maximum".into(), s.maximum.to_string()),
            ("messages/received".into(), s.received.to_string()),
            ("messages/sent".into(), s.sent.to_string()),
            ("messages/stored".into(), s.stored.to_string()),
            ("publish/messages/dropped".into(), s.dropped.to_string()),
            ("retained messages/count".into(), s.retained.to_string()),
            ("subscriptions/count".into(), s.subscriptions.to_string()),
            ("bytes/received".into(), s.bytes_received.to_string()),
            ("bytes/sent".into(), s.bytes_sent.to_string()),
        ];
        if let Some((t, prev)) = self.last {
            let secs = now.saturating_duration_since(t).as_secs_f64();
            if secs > 0.0 {
                for (i, ((name, v), (_, was))) in rated(s).into_iter().zip(rated(&prev)).enumerate()
                {
                    let per_minute = v.saturating_sub(was) as f64 * 60.0 / secs;
                    for (j, (window, minutes)) in WINDOWS.into_iter().enumerate() {
                        let e = (-secs / (60.0 * minutes)).exp();
                        let load = &mut self.loads[i][j];
                        *load = per_minute + e * (*load - per_minute);
                        values.push((format!("load/{name}/{window}"), format!("{load:.2}")));
                    }
                }
            }
        } else {
            for (name, _) in rated(s) {
                for (window, _) in WINDOWS {
                    values.push((format!("load/{name}/{window}"), "0.00".into()));
                }
            }
        }
        self.last = Some((now, *s));
        values
            .into_iter()
            .filter_map(|(topic, v)| {
                let topic = format!("{PREFIX}{topic}");
                if self.published.get(&topic) == Some(&v) {
                    return None;
                }
                self.published.insert(topic.clone(), v.clone());
                Some((topic, v))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(m: &'a [(String, String)], topic: &str) -> Option<&'a str> {
        m.iter()
            .find(|(t, _)| t == &format!("{PREFIX}{topic}"))
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn publishes_everything_first_then_what_changed() {
        let t0 = Instant::now();
        let mut sys = Sys::new(t0);
        let ten = Duration::from_secs(10);
        assert!(sys.due(t0, ten));
        assert!(!sys.due(t0, Duration::ZERO));
        let s = Snapshot {
            connected: 2,
            sessions: 3,
            maximum: 2,
            retained: 1,
            ..Snapshot::default()
        };
        let m = sys.update(t0, &s);
        assert_eq!(
            get(&m, "version"),
            Some(&*format!("quichub version {}", env!("CARGO_PKG_VERSION")))
        );
        assert_eq!(get(&m, "uptime"), Some("0 seconds"));
        assert_eq!(get(&m, "clients/connected"), Some("2"));
        assert_eq!(get(&m, "clients/disconnected"), Some("1"));
        assert_eq!(get(&m, "clients/total"), Some("3"));
        assert_eq!(get(&m, "retained messages/count"), Some("1"));
        assert_eq!(get(&m, "load/messages/received/15min"), Some("0.00"));
        assert!(!sys.due(t0 + ten / 2, ten));
        assert!(sys.due(t0 + ten, ten));
        // Nothing changed but the uptime.
        let m = sys.update(t0 + ten, &s);
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(get(&m, "uptime"), Some("10 seconds"));
    }

    #[test]
    fn loads_are_mosquittos_moving_averages() {
        let t0 = Instant::now();
        let mut sys = Sys::new(t0);
        sys.update(t0, &Snapshot::default());
        // 60 messages in 60 s: 60 per minute. The 1 minute average moves
        // (1 - e^-1) of the way there, the 5 minute one (1 - e^-0.2).
        let s = Snapshot {
            received: 60,
            ..Snapshot::default()
        };
        let m = sys.update(t0 + Duration::from_secs(60), &s);
        assert_eq!(get(&m, "load/messages/received/1min"), Some("37.93"));
        assert_eq!(get(&m, "load/messages/received/5min"), Some("10.88"));
        assert_eq!(get(&m, "load/messages/received/15min"), Some("3.87"));
        assert_eq!(get(&m, "load/messages/sent/1min"), None, "unchanged");
        // Quiet for a minute: it decays by e^-1.
        let m = sys.update(t0 + Duration::from_secs(120), &s);
        assert_eq!(get(&m, "load/messages/received/1min"), Some("13.95"));
    }
}
