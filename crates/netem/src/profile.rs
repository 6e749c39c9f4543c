//! Named link profiles and per-direction overrides.
//!
//! Directions are named from the client's side: **up** is client → server
//! (the device's uplink), **down** is server → client.
//!
//! Every number below says where it comes from. "The Drift paper" is *A Pure
//! HTTP/3 Alternative to MQTT-over-QUIC in Resource-Constrained IoT* and
//! "Cao et al." is J. Cao, X. Su, B. Finley, P. Zhou, P. Hui, *Evaluating
//! Transport Protocols on 5G for Mobile Augmented Reality*.
//!
//! Conventions shared by all profiles:
//! - the RTT is split evenly: each direction gets `delay = RTT / 2`, as
//!   the Drift paper §V does with NetEm ("half the RTT value" on each side);
//! - Cao et al. report *jitter* as the mean variation of the client→server
//!   delay (§4, "Jitter in 5G vs LTE & WiFi", the mid-point of the reported
//!   range is used). The emulator draws each packet's delay uniformly from
//!   `delay ± h`; for that distribution the mean absolute difference between
//!   two packets' delays is `2h/3`, so `h = 1.5 × jitter`. It is applied in
//!   both directions, in order (no reordering: cellular and Wi-Fi link layers
//!   deliver in sequence);
//! - queues are drop-tail and hold `max(RTT, 50 ms)` worth of bytes at the
//!   direction's rate: the bandwidth–delay-product rule of thumb
//!   (Villamizar & Song, "High performance TCP in ANSNET", CCR 1994), which
//!   lets one TCP flow keep the link busy, with a 50 ms floor so short-RTT
//!   links still absorb bursts. This is the emulator's choice, not a
//!   measurement.

use std::time::Duration;

use serde::Serialize;

use crate::model::{ConfigError, GilbertElliott, LinkConfig, QueueLimit};
use crate::units::{self, format_duration, format_rate, ParseError};

/// A two-direction link description.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// Name (`nb-iot`, `lossy-5`, `custom`, ...).
    pub name: String,
    /// Client → server direction.
    pub up: LinkConfig,
    /// Server → client direction.
    pub down: LinkConfig,
    /// Where the numbers come from.
    pub source: String,
}

/// Which direction(s) an override applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client → server.
    Up,
    /// Server → client.
    Down,
    /// Both directions.
    Both,
}

/// A profile name or override that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// No such profile.
    #[error("unknown profile {0:?}; known profiles: {known}", known = PROFILE_NAMES.join(", "))]
    Unknown(String),
    /// `lossy-N` with a bad N.
    #[error(
        "bad loss in {0:?}: use lossy-N with N a percentage in (0, 100], e.g. lossy-1 or lossy-0.5"
    )]
    BadLossy(String),
    /// An override key that does not exist.
    #[error("unknown link parameter {0:?}; use delay, rtt, jitter, reorder, loss, gilbert, rate, queue, duplicate")]
    UnknownKey(String),
    /// A value that does not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A Gilbert–Elliott specification that does not parse.
    #[error("bad Gilbert-Elliott parameters {0:?}: use P,R[,LOSS_BAD[,LOSS_GOOD]] in percent, e.g. 1,25 or 1%,25%,100%,0%")]
    BadGilbert(String),
    /// A value outside its domain.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Names accepted by [`Profile::named`] (`lossy-N` stands for any N).
pub const PROFILE_NAMES: &[&str] = &["nb-iot", "5g", "lte", "wifi", "satellite", "lossy-N"];

const QUEUE_FLOOR: Duration = Duration::from_millis(50);

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v / 1e3)
}

/// One direction with the shared conventions: `delay = rtt / 2`,
/// jitter half-width `1.5 × jitter`, queue `max(rtt, 50 ms)`.
fn direction(rtt: Duration, mean_jitter: Duration, rate_bps: u64) -> LinkConfig {
    LinkConfig {
        delay: rtt / 2,
        jitter: mean_jitter.mul_f64(1.5),
        rate_bps: Some(rate_bps),
        queue: QueueLimit::Time(rtt.max(QUEUE_FLOOR)),
        ..Default::default()
    }
}

impl Profile {
    /// A link that forwards every packet at once, unchanged.
    pub fn unimpaired() -> Profile {
        Profile {
            name: "none".into(),
            up: LinkConfig::default(),
            down: LinkConfig::default(),
            source: "no impairment".into(),
        }
    }

    /// NB-IoT: uplink 159 kbit/s, downlink 127 kbit/s, RTT 2 s.
    ///
    /// Source: the Drift paper, Table IV (NB-IoT second-generation parameters,
    /// after Zayas & Merino, ICC Workshops 2017), split per direction as in its
    /// §V. Its §VI-A2 also applies uniform random loss "within the
    /// typical bounds for NB-IoT" without giving a number, so no loss is set
    /// here (add `--loss`).
    pub fn nb_iot() -> Profile {
        let rtt = Duration::from_secs(2);
        Profile {
            name: "nb-iot".into(),
            up: direction(rtt, Duration::ZERO, 159_000),
            down: direction(rtt, Duration::ZERO, 127_000),
            source: "the Drift paper (\"A Pure HTTP/3 Alternative to MQTT-over-QUIC in Resource-Constrained IoT\") Table IV (uplink 159 kbit/s, downlink 127 kbit/s, RTT 2 s), split as in its §V; no loss figure given (§VI-A2)".into(),
        }
    }

    /// 5G: RTT 16.16 ms, jitter 3.96 ms, downlink 100 Mbit/s, uplink 50 Mbit/s.
    ///
    /// RTT: Cao et al. §4 "RTT in 5G vs LTE & WiFi", QUIC's median on 5G
    /// (16.16 ms). Jitter: Cao et al. §4 "Jitter in 5G vs LTE & WiFi",
    /// 3.11–4.81 ms on 5G (mid-point 3.96 ms). Rates: the IMT-2020
    /// user-experienced data rate, 100 Mbit/s down and 50 Mbit/s up (Report
    /// ITU-R M.2410-0, 2017, §4.4; Cao et al. give no link capacity). Loss: none;
    /// the 5G QoS class for best-effort traffic targets a packet error rate of
    /// 10⁻⁶ (3GPP TS 23.501 Table 5.7.4-1, 5QI 9).
    pub fn five_g() -> Profile {
        let rtt = ms(16.16);
        let jitter = ms(3.96);
        Profile {
            name: "5g".into(),
            up: direction(rtt, jitter, 50_000_000),
            down: direction(rtt, jitter, 100_000_000),
            source: "RTT 16.16 ms (QUIC median) and jitter 3.11-4.81 ms: Cao et al., \"Evaluating Transport Protocols on 5G for Mobile Augmented Reality\" §4; rates 100/50 Mbit/s: ITU-R M.2410-0 §4.4 user-experienced data rate; loss 0 (5QI 9 PER 1e-6, 3GPP TS 23.501 Table 5.7.4-1)".into(),
        }
    }

    /// LTE: RTT 28.49 ms, jitter 1.53 ms, downlink 16.9 Mbit/s, uplink 8.6 Mbit/s.
    ///
    /// RTT: Cao et al. §4, QUIC's median on LTE (28.49 ms). Jitter: Cao et
    /// al. §4, 0.58–2.48 ms on LTE (mid-point 1.53 ms). Downlink: global average
    /// 4G download speed, OpenSignal *The State of LTE* (February 2018),
    /// 16.9 Mbit/s. Uplink: mean mobile upload speed in Ookla's Speedtest data
    /// for the USA, Q1–Q2 2018, 8.63 Mbit/s (the same period; OpenSignal's
    /// report gives no upload figure). Loss: none; the LTE best-effort bearer
    /// (QCI 9) targets a packet error loss rate of 10⁻⁶ (3GPP TS 23.203
    /// Table 6.1.7).
    pub fn lte() -> Profile {
        let rtt = ms(28.49);
        let jitter = ms(1.53);
        Profile {
            name: "lte".into(),
            up: direction(rtt, jitter, 8_630_000),
            down: direction(rtt, jitter, 16_900_000),
            source: "RTT 28.49 ms (QUIC median) and jitter 0.58-2.48 ms: Cao et al., \"Evaluating Transport Protocols on 5G for Mobile Augmented Reality\" §4; downlink 16.9 Mbit/s: OpenSignal State of LTE Feb 2018 global 4G average; uplink 8.63 Mbit/s: Ookla Speedtest US mobile mean upload Q1-Q2 2018; loss 0 (QCI 9 PELR 1e-6, 3GPP TS 23.203 Table 6.1.7)".into(),
        }
    }

    /// Wi-Fi: RTT 1.88 ms, jitter 0.575 ms, 200 Mbit/s each way.
    ///
    /// RTT: Cao et al. §4, QUIC's median on WiFi (1.88 ms). Jitter: Cao et
    /// al. §4, 0.33–0.82 ms on WiFi (mid-point 0.575 ms). Rate: Cao et al. §3.1 use
    /// a 5 GHz 802.11ac hotspot one metre from the phone; 200 Mbit/s is the
    /// throughput achieved in practice by a 2×2 MIMO 802.11ac client at close
    /// range (M. Sauter, *From GSM to LTE-Advanced Pro and 5G*, 3rd ed.,
    /// Wiley 2017, Table 6.7), the same in both directions of the shared
    /// channel. Loss: none (802.11 retransmits at the MAC layer; Cao et al.
    /// report no loss).
    pub fn wifi() -> Profile {
        let rtt = ms(1.88);
        let jitter = ms(0.575);
        Profile {
            name: "wifi".into(),
            up: direction(rtt, jitter, 200_000_000),
            down: direction(rtt, jitter, 200_000_000),
            source: "RTT 1.88 ms (QUIC median) and jitter 0.33-0.82 ms: Cao et al., \"Evaluating Transport Protocols on 5G for Mobile Augmented Reality\" §4; 200 Mbit/s: 2x2 802.11ac at close range (its §3.1 setup), Sauter, From GSM to LTE-Advanced Pro and 5G, 3rd ed., Table 6.7; loss 0".into(),
        }
    }

    /// Geostationary satellite: RTT 600 ms, downlink 25 Mbit/s, uplink 5 Mbit/s.
    ///
    /// RTT: a path with one GEO hop "will generally see RTT measurements of
    /// around 600ms" (G. Huston, *Testing LEO and GEO satellite services in
    /// Australia*, APNIC blog, May 2022; 477 ms of it is propagation).
    /// Rates: the top plan of NBN's Sky Muster GEO service, 25 Mbit/s down and
    /// 5 Mbit/s up (NBN Co, 2015-2016). Loss: none (DVB-S2 links are run
    /// quasi-error-free, packet error rate about 10⁻⁷, ETSI EN 302 307).
    pub fn satellite() -> Profile {
        let rtt = ms(600.0);
        Profile {
            name: "satellite".into(),
            up: direction(rtt, Duration::ZERO, 5_000_000),
            down: direction(rtt, Duration::ZERO, 25_000_000),
            source: "RTT 600 ms: G. Huston, APNIC blog 2022 (GEO hop); 25/5 Mbit/s: NBN Sky Muster plan; loss 0 (DVB-S2 quasi-error-free, ETSI EN 302 307)".into(),
        }
    }

    /// `lossy-N`: N % independent random loss in each direction, nothing else.
    pub fn lossy(percent: f64) -> Result<Profile, ProfileError> {
        if !(percent > 0.0 && percent <= 100.0) {
            return Err(ProfileError::BadLossy(format!("lossy-{percent}")));
        }
        let link = LinkConfig {
            loss: percent / 100.0,
            ..Default::default()
        };
        Ok(Profile {
            name: format!("lossy-{percent}"),
            up: link.clone(),
            down: link,
            source: format!("{percent}% independent random loss each way, no delay or rate limit"),
        })
    }

    /// Looks a profile up by name (case-insensitive): `nb-iot`, `5g`, `lte`,
    /// `wifi`, `satellite`, `lossy-N`, or `none`.
    pub fn named(name: &str) -> Result<Profile, ProfileError> {
        let n = name.trim().to_ascii_lowercase();
        match n.as_str() {
            "nb-iot" | "nbiot" => Ok(Self::nb_iot()),
            "5g" => Ok(Self::five_g()),
            "lte" | "4g" => Ok(Self::lte()),
            "wifi" | "wi-fi" => Ok(Self::wifi()),
            "satellite" | "geo" => Ok(Self::satellite()),
            "none" => Ok(Self::unimpaired()),
            _ => {
                if let Some(p) = n.strip_prefix("lossy-") {
                    let v: f64 = p
                        .trim_end_matches('%')
                        .parse()
                        .map_err(|_| ProfileError::BadLossy(name.to_string()))?;
                    Self::lossy(v)
                } else {
                    Err(ProfileError::Unknown(name.to_string()))
                }
            }
        }
    }

    /// Every named profile, with `lossy-1` standing for the `lossy-N` family.
    pub fn all_named() -> Vec<Profile> {
        vec![
            Self::nb_iot(),
            Self::five_g(),
            Self::lte(),
            Self::wifi(),
            Self::satellite(),
            Self::lossy(1.0).unwrap_or_else(|_| Self::unimpaired()),
        ]
    }

    /// Round-trip time of the configured delays (without serialisation).
    pub fn rtt(&self) -> Duration {
        self.up.delay + self.down.delay
    }

    /// Checks both directions.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.up.validate()?;
        self.down.validate()
    }

    fn each(&mut self, dir: Direction, mut f: impl FnMut(&mut LinkConfig)) {
        if matches!(dir, Direction::Up | Direction::Both) {
            f(&mut self.up);
        }
        if matches!(dir, Direction::Down | Direction::Both) {
            f(&mut self.down);
        }
    }

    /// Sets one parameter from text, e.g. `("rate", "10mbit")`.
    ///
    /// Keys: `delay` (one-way), `rtt` (sets each direction's delay to half of
    /// it when applied to both), `jitter` (half-width), `reorder` (`on`/`off`),
    /// `loss` (percent), `gilbert` (`P,R[,LOSS_BAD[,LOSS_GOOD]]` in percent, or
    /// `off`), `rate` (or `unlimited`), `queue` (bytes or time), `duplicate`
    /// (percent).
    pub fn set(&mut self, dir: Direction, key: &str, value: &str) -> Result<(), ProfileError> {
        let key = key.trim().to_ascii_lowercase();
        match key.as_str() {
            "delay" => {
                let d = units::parse_duration(value)?;
                self.each(dir, |l| l.delay = d);
            }
            "rtt" => {
                let d = units::parse_duration(value)?;
                let one_way = if dir == Direction::Both { d / 2 } else { d };
                self.each(dir, |l| l.delay = one_way);
            }
            "jitter" => {
                let d = units::parse_duration(value)?;
                self.each(dir, |l| l.jitter = d);
            }
            "reorder" => {
                let on = parse_bool(value).ok_or_else(|| {
                    ProfileError::Parse(ParseError {
                        what: "reorder switch",
                        input: value.to_string(),
                        hint: "on or off",
                    })
                })?;
                self.each(dir, |l| l.reorder = on);
            }
            "loss" => {
                let p = units::parse_percent(value)?;
                self.each(dir, |l| l.loss = p);
            }
            "gilbert" | "ge" | "burst" => {
                let ge = parse_gilbert(value)?;
                self.each(dir, |l| l.gilbert = ge);
            }
            "rate" => {
                let v = value.trim().to_ascii_lowercase();
                let rate = if v == "unlimited" || v == "none" {
                    None
                } else {
                    Some(units::parse_rate(value)?)
                };
                self.each(dir, |l| l.rate_bps = rate);
            }
            "queue" | "limit" => {
                let q = units::parse_queue(value)?;
                self.each(dir, |l| l.queue = q);
            }
            "duplicate" | "dup" => {
                let p = units::parse_percent(value)?;
                self.each(dir, |l| l.duplicate = p);
            }
            _ => return Err(ProfileError::UnknownKey(key)),
        }
        if self.name != "custom" && !self.name.ends_with('+') {
            self.name.push('+');
        }
        self.validate()?;
        Ok(())
    }

    /// Applies a comma-separated list of `key=value` pairs, e.g.
    /// `"delay=10ms,loss=1%"`. A Gilbert–Elliott value keeps its commas when
    /// written with `:` or `/` separators (`gilbert=1:25`).
    pub fn set_spec(&mut self, dir: Direction, spec: &str) -> Result<(), ProfileError> {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| ProfileError::UnknownKey(item.to_string()))?;
            let v = if matches!(k.trim(), "gilbert" | "ge" | "burst") {
                v.replace([':', '/'], ",")
            } else {
                v.to_string()
            };
            self.set(dir, k, &v)?;
        }
        Ok(())
    }

    /// A multi-line human description of both directions.
    pub fn describe(&self) -> String {
        format!(
            "profile {}\n  up   (client -> server): {}\n  down (server -> client): {}\n  source: {}",
            self.name,
            describe_link(&self.up),
            describe_link(&self.down),
            self.source
        )
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Some(true),
        "off" | "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// Parses `P,R[,LOSS_BAD[,LOSS_GOOD]]` (percentages) or `off`.
pub fn parse_gilbert(value: &str) -> Result<Option<GilbertElliott>, ProfileError> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let parts: Vec<&str> = v.split(',').map(str::trim).collect();
    if !(2..=4).contains(&parts.len()) {
        return Err(ProfileError::BadGilbert(value.to_string()));
    }
    let mut nums = Vec::with_capacity(4);
    for p in &parts {
        nums.push(
            units::parse_percent(p).map_err(|_| ProfileError::BadGilbert(value.to_string()))?,
        );
    }
    Ok(Some(GilbertElliott {
        p: nums[0],
        r: nums[1],
        loss_bad: nums.get(2).copied().unwrap_or(1.0),
        loss_good: nums.get(3).copied().unwrap_or(0.0),
    }))
}

/// One line describing a link direction.
pub fn describe_link(l: &LinkConfig) -> String {
    let mut parts = vec![format!("delay {}", format_duration(l.delay))];
    if !l.jitter.is_zero() {
        parts.push(format!(
            "jitter ±{}{}",
            format_duration(l.jitter),
            if l.reorder { " (reordering)" } else { "" }
        ));
    }
    match l.rate_bps {
        Some(r) => parts.push(format!("rate {}", format_rate(r))),
        None => parts.push("rate unlimited".into()),
    }
    if l.rate_bps.is_some() {
        parts.push(match l.queue {
            QueueLimit::Unlimited => "queue unlimited".into(),
            QueueLimit::Bytes(b) => format!("queue {b} B"),
            QueueLimit::Time(t) => format!("queue {}", format_duration(t)),
        });
    }
    if l.loss > 0.0 {
        parts.push(format!("loss {}%", l.loss * 100.0));
    }
    if let Some(g) = l.gilbert {
        parts.push(format!(
            "burst loss p={}% r={}% (mean {:.2}%, mean burst {:.1} pkts)",
            g.p * 100.0,
            g.r * 100.0,
            g.mean_loss() * 100.0,
            g.mean_bad_run()
        ));
    }
    if l.duplicate > 0.0 {
        parts.push(format!("duplicate {}%", l.duplicate * 100.0));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nb_iot_matches_the_drift_papers_table_iv() {
        let p = Profile::named("nb-iot").unwrap();
        assert_eq!(p.up.rate_bps, Some(159_000));
        assert_eq!(p.down.rate_bps, Some(127_000));
        assert_eq!(p.rtt(), Duration::from_secs(2));
        assert_eq!(p.up.loss, 0.0);
    }

    #[test]
    fn cao_et_al_rtts_and_jitter() {
        for (name, rtt_ms, jitter_ms) in [
            ("5g", 16.16, 3.96),
            ("lte", 28.49, 1.53),
            ("wifi", 1.88, 0.575),
        ] {
            let p = Profile::named(name).unwrap();
            assert!(
                (p.rtt().as_secs_f64() * 1e3 - rtt_ms).abs() < 1e-6,
                "{name}"
            );
            // Mean |ΔD| of U(±h) is 2h/3 = the paper's jitter.
            let h = p.up.jitter.as_secs_f64() * 1e3;
            assert!((2.0 * h / 3.0 - jitter_ms).abs() < 1e-6, "{name}");
            assert!(p.up.jitter <= p.up.delay, "{name}: delay could go negative");
            assert!(!p.up.reorder);
        }
    }

    #[test]
    fn sources_cite_studies_by_title_not_seed_number() {
        for p in Profile::all_named() {
            assert!(
                !p.source.to_lowercase().contains("seed"),
                "{}: {}",
                p.name,
                p.source
            );
        }
        for name in ["5g", "lte", "wifi"] {
            let s = Profile::named(name).unwrap().source;
            assert!(
                s.contains("Cao et al., \"Evaluating Transport Protocols on 5G"),
                "{s}"
            );
        }
        let s = Profile::named("nb-iot").unwrap().source;
        assert!(
            s.contains("A Pure HTTP/3 Alternative to MQTT-over-QUIC"),
            "{s}"
        );
    }

    #[test]
    fn all_named_profiles_validate() {
        for p in Profile::all_named() {
            p.validate().unwrap();
            assert!(!p.source.is_empty());
            assert!(!p.describe().is_empty());
        }
    }

    #[test]
    fn lossy_family() {
        let p = Profile::named("lossy-5").unwrap();
        assert_eq!(p.up.loss, 0.05);
        assert_eq!(p.down.loss, 0.05);
        assert_eq!(p.up.rate_bps, None);
        assert!(Profile::named("lossy-0.5").is_ok());
        for bad in ["lossy-0", "lossy-101", "lossy-x", "lossy-", "lossy--1"] {
            assert!(Profile::named(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            Profile::named("dialup"),
            Err(ProfileError::Unknown(_))
        ));
    }

    #[test]
    fn overrides() {
        let mut p = Profile::named("lte").unwrap();
        p.set(Direction::Both, "rtt", "100ms").unwrap();
        assert_eq!(p.rtt(), Duration::from_millis(100));
        p.set(Direction::Up, "rate", "1mbit").unwrap();
        assert_eq!(p.up.rate_bps, Some(1_000_000));
        assert_eq!(p.down.rate_bps, Some(16_900_000));
        p.set_spec(
            Direction::Down,
            "loss=2%,duplicate=1,gilbert=1:25,queue=64kb,reorder=on",
        )
        .unwrap();
        assert_eq!(p.down.loss, 0.02);
        assert_eq!(p.down.duplicate, 0.01);
        assert_eq!(p.down.gilbert, Some(GilbertElliott::simple(0.01, 0.25)));
        assert_eq!(p.down.queue, QueueLimit::Bytes(64_000));
        assert!(p.down.reorder);
        assert_eq!(p.up.loss, 0.0);
        assert_eq!(p.name, "lte+");
        assert!(p.set(Direction::Both, "colour", "blue").is_err());
        assert!(p.set(Direction::Both, "loss", "200").is_err());
        assert!(p.set_spec(Direction::Both, "delay").is_err());
        assert!(p.set(Direction::Both, "gilbert", "1").is_err());
        p.set(Direction::Both, "gilbert", "off").unwrap();
        assert_eq!(p.down.gilbert, None);
        p.set(Direction::Both, "rate", "unlimited").unwrap();
        assert_eq!(p.up.rate_bps, None);
    }
}
