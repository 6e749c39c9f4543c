//! The link model, sans-IO: packets go in with a timestamp, release times and
//! drops come out.
//!
//! A [`Link`] is one direction of an emulated link. For every packet handed to
//! [`Link::send`] it decides, in this order (the order of Linux `netem`):
//!
//! 1. **loss**: independent random loss with probability [`LinkConfig::loss`],
//!    and/or Gilbert–Elliott burst loss ([`GilbertElliott`]);
//! 2. **duplication**: with probability [`LinkConfig::duplicate`] a second copy
//!    follows the original through the rest of the link;
//! 3. **rate and queue**: with a rate limit the link serialises one packet at a
//!    time (`len * 8 / rate` seconds each, i.e. a token bucket one packet
//!    deep); packets wait in a drop-tail FIFO bounded in bytes or in time
//!    ([`QueueLimit`]); a packet that does not fit is dropped;
//! 4. **delay and jitter**: after serialisation the packet propagates for
//!    `delay + U(-jitter, +jitter)` (never below zero). Without
//!    [`LinkConfig::reorder`] a packet is never released before the one ahead
//!    of it (FIFO, like a real link layer delivering in order); with it, a
//!    packet with a short delay overtakes one with a long delay.
//!
//! Time is a [`Duration`] since an arbitrary epoch chosen by the caller, so
//! the model is deterministic: the same configuration, seed and arrivals give
//! the same verdicts.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

use crate::rng::Rng;

/// Bound of the drop-tail queue in front of the rate limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum QueueLimit {
    /// No bound (the IO layer still caps the packets it holds).
    Unlimited,
    /// At most this many bytes queued, counting the packet being serialised.
    Bytes(u64),
    /// At most this long between a packet's arrival and the end of its
    /// serialisation (queueing delay plus its own transmission time).
    Time(Duration),
}

/// Gilbert–Elliott two-state burst-loss model, evaluated once per packet.
///
/// In the *good* state a packet is lost with probability `loss_good`, in the
/// *bad* state with `loss_bad`; before each packet the chain moves good→bad
/// with probability `p` and bad→good with probability `r`. With
/// `loss_good = 0` and `loss_bad = 1` (the simple Gilbert model) the mean
/// burst length is `1 / r` and the mean loss `p / (p + r)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GilbertElliott {
    /// Probability of moving from the good to the bad state.
    pub p: f64,
    /// Probability of moving from the bad to the good state.
    pub r: f64,
    /// Loss probability in the bad state (netem's `1-h`).
    pub loss_bad: f64,
    /// Loss probability in the good state (netem's `1-k`).
    pub loss_good: f64,
}

impl GilbertElliott {
    /// The simple Gilbert model: every packet in the bad state is lost, none
    /// in the good state.
    pub fn simple(p: f64, r: f64) -> Self {
        GilbertElliott {
            p,
            r,
            loss_bad: 1.0,
            loss_good: 0.0,
        }
    }

    /// Long-run fraction of packets lost.
    pub fn mean_loss(&self) -> f64 {
        if self.p + self.r <= 0.0 {
            return self.loss_good;
        }
        let bad = self.p / (self.p + self.r);
        bad * self.loss_bad + (1.0 - bad) * self.loss_good
    }

    /// Mean number of consecutive packets spent in the bad state (`1 / r`),
    /// which is the mean loss-burst length of the simple Gilbert model.
    pub fn mean_bad_run(&self) -> f64 {
        if self.r <= 0.0 {
            f64::INFINITY
        } else {
            1.0 / self.r
        }
    }
}

/// Configuration of one direction of a link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkConfig {
    /// Fixed one-way propagation delay.
    pub delay: Duration,
    /// Half-width of the uniform delay variation: each packet's delay is drawn
    /// from `[delay - jitter, delay + jitter]` (clamped at zero).
    pub jitter: Duration,
    /// Whether jitter may reorder packets (otherwise releases stay FIFO).
    pub reorder: bool,
    /// Probability of independent random loss, in `[0, 1]`.
    pub loss: f64,
    /// Optional Gilbert–Elliott burst loss, applied in addition to `loss`.
    pub gilbert: Option<GilbertElliott>,
    /// Rate limit in bits per second of IP packets; `None` is unlimited.
    pub rate_bps: Option<u64>,
    /// Drop-tail queue bound in front of the rate limiter (ignored without a
    /// rate limit).
    pub queue: QueueLimit,
    /// Probability that a packet is duplicated, in `[0, 1]`.
    pub duplicate: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            reorder: false,
            loss: 0.0,
            gilbert: None,
            rate_bps: None,
            queue: QueueLimit::Unlimited,
            duplicate: 0.0,
        }
    }
}

/// Longest delay or jitter a link accepts (one hour): anything longer is
/// certainly a typo and would only hold memory.
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// A configuration value outside its domain.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A probability outside `[0, 1]` or not a number.
    #[error("{what} must be a probability between 0 and 1 (0% and 100%), got {value}")]
    Probability {
        /// Which parameter.
        what: &'static str,
        /// The offending value.
        value: f64,
    },
    /// A rate of zero bits per second.
    #[error("a rate limit must be above 0 bit/s")]
    ZeroRate,
    /// A queue bound of zero.
    #[error("a queue limit must be above zero")]
    ZeroQueue,
    /// A delay or jitter above [`MAX_DELAY`].
    #[error("{what} {value:?} is longer than the maximum of {MAX_DELAY:?}")]
    TooLong {
        /// Which parameter.
        what: &'static str,
        /// The offending value.
        value: Duration,
    },
}

fn check_prob(what: &'static str, value: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::Probability { what, value })
    }
}

impl LinkConfig {
    /// Checks every parameter's domain.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_prob("loss", self.loss)?;
        check_prob("duplicate", self.duplicate)?;
        if let Some(ge) = &self.gilbert {
            check_prob("Gilbert-Elliott p", ge.p)?;
            check_prob("Gilbert-Elliott r", ge.r)?;
            check_prob("Gilbert-Elliott loss in bad state", ge.loss_bad)?;
            check_prob("Gilbert-Elliott loss in good state", ge.loss_good)?;
        }
        if self.rate_bps == Some(0) {
            return Err(ConfigError::ZeroRate);
        }
        match self.queue {
            QueueLimit::Bytes(0) => return Err(ConfigError::ZeroQueue),
            QueueLimit::Time(t) if t.is_zero() => return Err(ConfigError::ZeroQueue),
            _ => {}
        }
        if self.delay > MAX_DELAY {
            return Err(ConfigError::TooLong {
                what: "delay",
                value: self.delay,
            });
        }
        if self.jitter > MAX_DELAY {
            return Err(ConfigError::TooLong {
                what: "jitter",
                value: self.jitter,
            });
        }
        Ok(())
    }

    /// Long-run fraction of packets lost by the loss stages (random and
    /// burst), ignoring queue overflow.
    pub fn mean_loss(&self) -> f64 {
        let burst = self.gilbert.map(|g| g.mean_loss()).unwrap_or(0.0);
        1.0 - (1.0 - self.loss) * (1.0 - burst)
    }

    /// Time to serialise `len` bytes at the rate limit (zero without one).
    pub fn transmission_time(&self, len: usize) -> Duration {
        match self.rate_bps {
            Some(rate) if rate > 0 => {
                let nanos = (len as u128) * 8 * 1_000_000_000 / rate as u128;
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            }
            _ => Duration::ZERO,
        }
    }
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum DropReason {
    /// Independent random loss.
    RandomLoss,
    /// Gilbert–Elliott burst loss.
    BurstLoss,
    /// The drop-tail queue was full.
    QueueFull,
}

/// What happens to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The packet never leaves the link.
    Dropped(DropReason),
    /// The packet leaves the link at `at`; a duplicate, if any, at
    /// `duplicate_at`.
    Deliver {
        /// Release time of the packet.
        at: Duration,
        /// Release time of its duplicate, when one was made and fitted in the
        /// queue.
        duplicate_at: Option<Duration>,
    },
}

/// Counters of one link direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Packets offered to the link.
    pub packets: u64,
    /// Bytes offered to the link.
    pub bytes: u64,
    /// Packets lost by random loss.
    pub lost_random: u64,
    /// Packets lost by Gilbert–Elliott burst loss.
    pub lost_burst: u64,
    /// Packets (originals or duplicates) dropped because the queue was full.
    pub dropped_queue: u64,
    /// Duplicates made.
    pub duplicated: u64,
    /// Packets (originals and duplicates) given a release time.
    pub delivered: u64,
    /// Bytes given a release time.
    pub delivered_bytes: u64,
}

/// One direction of an emulated link: a pure state machine.
#[derive(Debug, Clone)]
pub struct Link {
    cfg: LinkConfig,
    rng: Rng,
    ge_bad: bool,
    /// When the serialiser finishes the last accepted packet.
    link_free: Duration,
    /// Packets accepted and not yet fully serialised: (finish time, length).
    backlog: VecDeque<(Duration, u64)>,
    backlog_bytes: u64,
    last_release: Duration,
    last_now: Duration,
    stats: LinkStats,
}

impl Link {
    /// Creates a link direction; `seed` drives every random decision.
    pub fn new(cfg: LinkConfig, seed: u64) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Link {
            cfg,
            rng: Rng::new(seed),
            ge_bad: false,
            link_free: Duration::ZERO,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            last_release: Duration::ZERO,
            last_now: Duration::ZERO,
            stats: LinkStats::default(),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// Replaces the configuration from now on (a rate step, a loss burst):
    /// packets already accepted keep their release times, the queue keeps
    /// its backlog, and the random sequence goes on where it was, so a
    /// seeded run stays repeatable.
    pub fn reconfigure(&mut self, cfg: LinkConfig) -> Result<(), ConfigError> {
        cfg.validate()?;
        self.cfg = cfg;
        Ok(())
    }

    /// Bytes waiting in (or being serialised from) the queue at `now`.
    pub fn backlog_bytes(&mut self, now: Duration) -> u64 {
        self.purge(now);
        self.backlog_bytes
    }

    fn purge(&mut self, now: Duration) {
        while let Some(&(finish, len)) = self.backlog.front() {
            if finish <= now {
                self.backlog.pop_front();
                self.backlog_bytes = self.backlog_bytes.saturating_sub(len);
            } else {
                break;
            }
        }
    }

    fn lost(&mut self) -> Option<DropReason> {
        if let Some(ge) = self.cfg.gilbert {
            let switch = if self.ge_bad { ge.r } else { ge.p };
            if self.rng.chance(switch) {
                self.ge_bad = !self.ge_bad;
            }
            let p = if self.ge_bad {
                ge.loss_bad
            } else {
                ge.loss_good
            };
            if self.rng.chance(p) {
                return Some(DropReason::BurstLoss);
            }
        }
        if self.rng.chance(self.cfg.loss) {
            return Some(DropReason::RandomLoss);
        }
        None
    }

    /// Runs one copy through queue, serialiser, delay and jitter.
    fn transmit(&mut self, now: Duration, len: u64) -> Option<Duration> {
        let finish = if self.cfg.rate_bps.is_some() {
            self.purge(now);
            let tx = self.cfg.transmission_time(len as usize);
            let wait = self.link_free.saturating_sub(now);
            let fits = self.backlog.is_empty()
                || match self.cfg.queue {
                    QueueLimit::Unlimited => true,
                    QueueLimit::Bytes(limit) => self.backlog_bytes.saturating_add(len) <= limit,
                    QueueLimit::Time(limit) => wait.saturating_add(tx) <= limit,
                };
            if !fits {
                self.stats.dropped_queue += 1;
                return None;
            }
            let finish = now.max(self.link_free).saturating_add(tx);
            self.link_free = finish;
            self.backlog.push_back((finish, len));
            self.backlog_bytes = self.backlog_bytes.saturating_add(len);
            finish
        } else {
            now
        };
        let mut delay = self.cfg.delay;
        if !self.cfg.jitter.is_zero() {
            let offset = self.cfg.jitter.as_secs_f64() * self.rng.symmetric();
            let d = (self.cfg.delay.as_secs_f64() + offset).max(0.0);
            delay = Duration::from_secs_f64(d);
        }
        let mut at = finish.saturating_add(delay);
        if !self.cfg.reorder {
            at = at.max(self.last_release);
            self.last_release = at;
        }
        self.stats.delivered += 1;
        self.stats.delivered_bytes = self.stats.delivered_bytes.saturating_add(len);
        Some(at)
    }

    /// Offers a packet of `len` bytes arriving at `now` and returns its fate.
    ///
    /// `now` should not go backwards; if it does, the latest time seen is used.
    pub fn send(&mut self, now: Duration, len: usize) -> Verdict {
        let now = now.max(self.last_now);
        self.last_now = now;
        let len = len as u64;
        self.stats.packets += 1;
        self.stats.bytes = self.stats.bytes.saturating_add(len);
        if let Some(reason) = self.lost() {
            match reason {
                DropReason::RandomLoss => self.stats.lost_random += 1,
                _ => self.stats.lost_burst += 1,
            }
            return Verdict::Dropped(reason);
        }
        let dup = self.rng.chance(self.cfg.duplicate);
        let Some(at) = self.transmit(now, len) else {
            return Verdict::Dropped(DropReason::QueueFull);
        };
        let duplicate_at = if dup {
            self.stats.duplicated += 1;
            self.transmit(now, len)
        } else {
            None
        };
        Verdict::Deliver { at, duplicate_at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn release(v: Verdict) -> Duration {
        match v {
            Verdict::Deliver { at, .. } => at,
            Verdict::Dropped(r) => panic!("unexpected drop {r:?}"),
        }
    }

    /// |observed - expected| within `k` binomial standard deviations.
    fn within_binomial(count: u64, n: u64, p: f64, k: f64) -> bool {
        let expected = n as f64 * p;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        (count as f64 - expected).abs() <= k * sd
    }

    #[test]
    fn unimpaired_link_releases_immediately() {
        let mut link = Link::new(LinkConfig::default(), 1).unwrap();
        for i in 0..100 {
            let now = ms(i);
            assert_eq!(
                link.send(now, 1200),
                Verdict::Deliver {
                    at: now,
                    duplicate_at: None
                }
            );
        }
        assert_eq!(link.stats().delivered, 100);
    }

    #[test]
    fn reconfigured_rate_applies_from_then_on() {
        // 8 Mbit/s: 1000 B take 1 ms; then 1 Mbit/s: 8 ms.
        let fast = LinkConfig {
            rate_bps: Some(8_000_000),
            ..Default::default()
        };
        let mut link = Link::new(fast.clone(), 1).unwrap();
        assert_eq!(release(link.send(ms(0), 1000)), ms(1));
        link.reconfigure(LinkConfig {
            rate_bps: Some(1_000_000),
            ..fast
        })
        .unwrap();
        // Queued behind nothing (the first finished at 1 ms).
        assert_eq!(release(link.send(ms(10), 1000)), ms(18));
        assert_eq!(link.stats().delivered, 2);
        assert!(link
            .reconfigure(LinkConfig {
                loss: 2.0,
                ..Default::default()
            })
            .is_err());
        assert_eq!(link.config().rate_bps, Some(1_000_000), "kept on error");
    }

    #[test]
    fn fixed_delay() {
        let cfg = LinkConfig {
            delay: ms(40),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        for i in 0..100 {
            assert_eq!(release(link.send(ms(i), 100)), ms(i + 40));
        }
    }

    #[test]
    fn jitter_stays_in_bounds_and_covers_them() {
        let cfg = LinkConfig {
            delay: ms(20),
            jitter: ms(5),
            reorder: true,
            ..Default::default()
        };
        let mut link = Link::new(cfg, 42).unwrap();
        let n = 20_000u64;
        let (mut lo, mut hi, mut sum) = (f64::MAX, f64::MIN, 0.0);
        let mut abs_diff_sum = 0.0;
        let mut prev: Option<f64> = None;
        for i in 0..n {
            let now = ms(i * 100);
            let d = (release(link.send(now, 100)) - now).as_secs_f64() * 1e3;
            assert!((15.0..=25.0).contains(&d), "delay {d} ms out of 20±5 ms");
            lo = lo.min(d);
            hi = hi.max(d);
            sum += d;
            if let Some(p) = prev {
                abs_diff_sum += (d - p).abs();
            }
            prev = Some(d);
        }
        let mean = sum / n as f64;
        // Uniform on ±5 ms: sd 2.89 ms, standard error 0.02 ms.
        assert!((mean - 20.0).abs() < 0.1, "mean delay {mean}");
        assert!(lo < 15.1 && hi > 24.9, "range {lo}..{hi}");
        // Mean |D(i) - D(i-1)| of U(-a, a) is 2a/3.
        let mean_abs_diff = abs_diff_sum / (n - 1) as f64;
        assert!(
            (mean_abs_diff - 10.0 / 3.0).abs() < 0.1,
            "mean variation {mean_abs_diff}"
        );
    }

    #[test]
    fn jitter_reorders_only_when_allowed() {
        for reorder in [false, true] {
            let cfg = LinkConfig {
                delay: ms(20),
                jitter: ms(10),
                reorder,
                ..Default::default()
            };
            let mut link = Link::new(cfg, 7).unwrap();
            let mut releases = Vec::new();
            for i in 0..1000 {
                releases.push(release(link.send(ms(i), 100)));
            }
            let inversions = releases.windows(2).filter(|w| w[1] < w[0]).count();
            if reorder {
                assert!(inversions > 100, "only {inversions} reorderings");
            } else {
                assert_eq!(inversions, 0);
                // Every release is still within delay + jitter of its arrival.
                for (i, r) in releases.iter().enumerate() {
                    assert!(*r <= ms(i as u64 + 30) && *r >= ms(i as u64 + 10));
                }
            }
        }
    }

    #[test]
    fn random_loss_rate_within_binomial_bound() {
        for p in [0.01, 0.05, 0.2] {
            let cfg = LinkConfig {
                loss: p,
                ..Default::default()
            };
            let mut link = Link::new(cfg, 1234).unwrap();
            let n = 100_000;
            let mut lost = 0;
            for i in 0..n {
                if let Verdict::Dropped(DropReason::RandomLoss) = link.send(ms(i), 100) {
                    lost += 1;
                }
            }
            assert!(within_binomial(lost, n, p, 4.0), "p={p}: {lost}/{n}");
            assert_eq!(link.stats().lost_random, lost);
        }
    }

    #[test]
    fn gilbert_elliott_mean_burst_length_and_loss() {
        let ge = GilbertElliott::simple(0.01, 0.25);
        let cfg = LinkConfig {
            gilbert: Some(ge),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 99).unwrap();
        let n = 400_000u64;
        let (mut lost, mut bursts, mut run) = (0u64, 0u64, 0u64);
        for i in 0..n {
            let dropped = matches!(
                link.send(Duration::from_micros(i), 100),
                Verdict::Dropped(DropReason::BurstLoss)
            );
            if dropped {
                lost += 1;
                run += 1;
            } else if run > 0 {
                bursts += 1;
                run = 0;
            }
        }
        let mean_burst = lost as f64 / bursts as f64;
        assert!(
            (mean_burst - ge.mean_bad_run()).abs() < 0.2,
            "mean burst {mean_burst}, expected {}",
            ge.mean_bad_run()
        );
        let loss = lost as f64 / n as f64;
        // p/(p+r) = 3.85%; correlated losses widen the spread, allow 10%.
        assert!(
            (loss - ge.mean_loss()).abs() < 0.1 * ge.mean_loss(),
            "loss {loss}, expected {}",
            ge.mean_loss()
        );
    }

    #[test]
    fn rate_limit_serialises_at_the_configured_rate() {
        // 8 Mbit/s: a 1000-byte packet takes exactly 1 ms.
        let cfg = LinkConfig {
            rate_bps: Some(8_000_000),
            delay: ms(10),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        let releases: Vec<Duration> = (0..1000)
            .map(|_| release(link.send(Duration::ZERO, 1000)))
            .collect();
        for (i, r) in releases.iter().enumerate() {
            assert_eq!(*r, ms(i as u64 + 1 + 10));
        }
        // Below the rate there is no queueing: only serialisation and delay.
        let mut link = Link::new(
            LinkConfig {
                rate_bps: Some(8_000_000),
                ..Default::default()
            },
            1,
        )
        .unwrap();
        for i in 0..100 {
            assert_eq!(release(link.send(ms(2 * i), 1000)), ms(2 * i + 1));
        }
    }

    #[test]
    fn token_bucket_long_run_rate() {
        // Offered load of 1.5x the rate for 10 s with a large queue: the
        // output rate equals the configured rate.
        let rate = 2_000_000u64;
        let cfg = LinkConfig {
            rate_bps: Some(rate),
            queue: QueueLimit::Time(ms(100)),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 5).unwrap();
        let pkt = 1250usize; // 5 ms at 2 Mbit/s
        let mut out = Vec::new();
        let mut t = Duration::ZERO;
        while t < Duration::from_secs(10) {
            if let Verdict::Deliver { at, .. } = link.send(t, pkt) {
                out.push(at);
            }
            t += Duration::from_micros(3333);
        }
        let first = out[0];
        let last = *out.last().unwrap();
        let bits = (out.len() - 1) as f64 * pkt as f64 * 8.0;
        let measured = bits / (last - first).as_secs_f64();
        assert!(
            (measured - rate as f64).abs() / (rate as f64) < 0.001,
            "measured {measured}"
        );
        assert!(link.stats().dropped_queue > 0);
    }

    #[test]
    fn byte_queue_drops_tail() {
        let cfg = LinkConfig {
            rate_bps: Some(8_000_000),
            queue: QueueLimit::Bytes(10_000),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        let verdicts: Vec<Verdict> = (0..100).map(|_| link.send(Duration::ZERO, 1000)).collect();
        let accepted = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Deliver { .. }))
            .count();
        assert_eq!(accepted, 10);
        assert!(verdicts[10..]
            .iter()
            .all(|v| *v == Verdict::Dropped(DropReason::QueueFull)));
        assert_eq!(link.stats().dropped_queue, 90);
        // After 3 ms three packets have left: three more fit.
        assert_eq!(link.backlog_bytes(ms(3)), 7_000);
        for _ in 0..3 {
            assert!(matches!(link.send(ms(3), 1000), Verdict::Deliver { .. }));
        }
        assert_eq!(
            link.send(ms(3), 1000),
            Verdict::Dropped(DropReason::QueueFull)
        );
    }

    #[test]
    fn time_queue_drops_tail() {
        // 1 ms per packet, 5 ms of queue: five packets fit.
        let cfg = LinkConfig {
            rate_bps: Some(8_000_000),
            queue: QueueLimit::Time(ms(5)),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        let accepted = (0..20)
            .filter(|_| matches!(link.send(Duration::ZERO, 1000), Verdict::Deliver { .. }))
            .count();
        assert_eq!(accepted, 5);
    }

    #[test]
    fn oversized_packet_still_passes_an_empty_queue() {
        let cfg = LinkConfig {
            rate_bps: Some(8_000_000),
            queue: QueueLimit::Bytes(500),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        assert!(matches!(
            link.send(Duration::ZERO, 1500),
            Verdict::Deliver { .. }
        ));
        assert_eq!(
            link.send(Duration::ZERO, 100),
            Verdict::Dropped(DropReason::QueueFull)
        );
    }

    #[test]
    fn duplication_rate_within_binomial_bound() {
        let p = 0.1;
        let cfg = LinkConfig {
            duplicate: p,
            delay: ms(5),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 11).unwrap();
        let n = 50_000u64;
        let mut dups = 0;
        for i in 0..n {
            match link.send(ms(i), 100) {
                Verdict::Deliver {
                    at,
                    duplicate_at: Some(d),
                } => {
                    assert_eq!(at, ms(i + 5));
                    assert_eq!(d, ms(i + 5));
                    dups += 1;
                }
                Verdict::Deliver { .. } => {}
                v => panic!("unexpected {v:?}"),
            }
        }
        assert!(within_binomial(dups, n, p, 4.0), "{dups}/{n}");
        assert_eq!(link.stats().delivered, n + dups);
    }

    #[test]
    fn duplicates_use_link_capacity() {
        let cfg = LinkConfig {
            duplicate: 1.0,
            rate_bps: Some(8_000_000),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        assert_eq!(
            link.send(Duration::ZERO, 1000),
            Verdict::Deliver {
                at: ms(1),
                duplicate_at: Some(ms(2))
            }
        );
    }

    #[test]
    fn same_seed_same_verdicts() {
        let cfg = LinkConfig {
            delay: ms(10),
            jitter: ms(3),
            loss: 0.1,
            gilbert: Some(GilbertElliott::simple(0.05, 0.3)),
            duplicate: 0.05,
            rate_bps: Some(1_000_000),
            queue: QueueLimit::Bytes(20_000),
            reorder: true,
        };
        let run = |seed| {
            let mut l = Link::new(cfg.clone(), seed).unwrap();
            (0..2000)
                .map(|i| l.send(Duration::from_micros(i * 700), 900))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn time_going_backwards_is_tolerated() {
        let cfg = LinkConfig {
            rate_bps: Some(1_000_000),
            delay: ms(1),
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        let a = release(link.send(ms(100), 125));
        let b = release(link.send(ms(50), 125));
        assert!(b >= a);
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let bad = [
            LinkConfig {
                loss: 1.5,
                ..Default::default()
            },
            LinkConfig {
                loss: f64::NAN,
                ..Default::default()
            },
            LinkConfig {
                duplicate: -0.1,
                ..Default::default()
            },
            LinkConfig {
                rate_bps: Some(0),
                ..Default::default()
            },
            LinkConfig {
                rate_bps: Some(1),
                queue: QueueLimit::Bytes(0),
                ..Default::default()
            },
            LinkConfig {
                delay: Duration::from_secs(7200),
                ..Default::default()
            },
            LinkConfig {
                gilbert: Some(GilbertElliott::simple(2.0, 0.1)),
                ..Default::default()
            },
        ];
        for cfg in bad {
            assert!(Link::new(cfg.clone(), 1).is_err(), "{cfg:?} accepted");
        }
    }

    #[test]
    fn extreme_values_do_not_panic() {
        let cfg = LinkConfig {
            rate_bps: Some(1),
            delay: MAX_DELAY,
            jitter: MAX_DELAY,
            ..Default::default()
        };
        let mut link = Link::new(cfg, 1).unwrap();
        for i in 0..10 {
            let _ = link.send(Duration::from_secs(i), usize::MAX / 16);
            let _ = link.send(Duration::MAX / 2, 0);
        }
        let mut link = Link::new(
            LinkConfig {
                rate_bps: Some(u64::MAX),
                ..Default::default()
            },
            1,
        )
        .unwrap();
        let _ = link.send(Duration::ZERO, 65535);
    }
}
