//! Rate limits: a token bucket per client (an MQTT connection, a MoQT
//! session) and a map of them per client address (HTTP).
//!
//! The bucket is kept in its GCRA form, one instant instead of a level and a
//! refill time: `full_at`, when the bucket would be full again had nothing
//! more been taken. Taking `n` tokens moves it `n` intervals later; the
//! bucket holds them while `full_at` stays within `burst` intervals of now.
//! Integer nanoseconds throughout, so no drift from rounding and no panic on
//! a large debt.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A rate with a burst: `per_second` tokens come back each second, and at
/// most `burst` are held.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Nanoseconds for one token to come back.
    interval: u64,
    /// Nanoseconds for a whole burst to come back.
    span: u64,
    /// `full_at`, in nanoseconds since `base`.
    full_at: u64,
    base: Instant,
}

impl TokenBucket {
    /// A bucket of `per_second` tokens a second holding at most `burst`
    /// (`0`: one second's worth), full at `now`. `None` when `per_second`
    /// is 0: no limit.
    pub fn new(per_second: u64, burst: u64, now: Instant) -> Option<Self> {
        if per_second == 0 {
            return None;
        }
        let burst = if burst == 0 { per_second } else { burst };
        // Above a billion a second a token takes under a nanosecond: such a
        // rate is no limit at all.
        let interval = (1_000_000_000 / per_second).max(1);
        Some(Self {
            interval,
            span: interval.saturating_mul(burst),
            full_at: 0,
            base: now,
        })
    }

    fn at(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// `full_at` once `n` more tokens are taken at `now`.
    fn after(&self, n: u64, now: u64) -> u64 {
        self.full_at
            .max(now)
            .saturating_add(n.saturating_mul(self.interval))
    }

    /// How long until a bucket full at `full_at` is within its burst again:
    /// zero when it is at `now`.
    fn short(&self, full_at: u64, now: u64) -> Duration {
        Duration::from_nanos(full_at.saturating_sub(now).saturating_sub(self.span))
    }

    /// Takes `n` tokens if the bucket holds them; otherwise takes nothing
    /// and says how long until it will.
    pub fn try_take(&mut self, n: u64, now: Instant) -> Result<(), Duration> {
        let now = self.at(now);
        let next = self.after(n, now);
        match self.short(next, now) {
            Duration::ZERO => {
                self.full_at = next;
                Ok(())
            }
            wait => Err(wait),
        }
    }

    /// Takes `n` tokens whether or not the bucket holds them (a debt later
    /// takes repay), and says how long until it would have held them: the
    /// wait that keeps the taker to the rate.
    pub fn take(&mut self, n: u64, now: Instant) -> Duration {
        let now = self.at(now);
        self.full_at = self.after(n, now);
        self.short(self.full_at, now)
    }

    /// How long until the bucket holds a token (zero: it does now).
    pub fn wait(&self, now: Instant) -> Duration {
        let now = self.at(now);
        self.short(self.after(1, now), now)
    }

    /// Whether the bucket is full at `now` (a key whose bucket is full can
    /// be forgotten: a new one would be the same).
    fn is_full(&self, now: Instant) -> bool {
        self.full_at <= self.at(now)
    }
}

/// A [`TokenBucket`] per client address: IPv4-mapped IPv6 as IPv4, other
/// IPv6 by its /64 (as [`crate::tcp_limits`] counts connections). Buckets
/// that are full again are forgotten, so the map holds only the addresses
/// active within about one burst's time.
#[derive(Debug)]
pub struct AddressBuckets {
    per_second: u64,
    burst: u64,
    state: Mutex<Buckets>,
}

#[derive(Debug, Default)]
struct Buckets {
    by_ip: HashMap<IpAddr, TokenBucket>,
    /// The map's size past which full buckets are swept out: twice what
    /// the last sweep left, so sweeping costs O(1) per insertion.
    sweep_at: usize,
}

/// The fewest entries worth a sweep.
const MIN_SWEEP: usize = 1024;

impl AddressBuckets {
    /// `per_second` tokens a second per address, at most `burst` held
    /// (`0`: one second's worth); `per_second` 0: no limit.
    pub fn new(per_second: u64, burst: u64) -> Self {
        Self {
            per_second,
            burst,
            state: Mutex::new(Buckets {
                by_ip: HashMap::new(),
                sweep_at: MIN_SWEEP,
            }),
        }
    }

    /// Whether there is a limit at all.
    pub fn is_limited(&self) -> bool {
        self.per_second != 0
    }

    /// Takes a token from `ip`'s bucket, or says how long until it holds one.
    pub fn try_take(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        if self.per_second == 0 {
            return Ok(());
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.by_ip.len() >= s.sweep_at {
            s.by_ip.retain(|_, b| !b.is_full(now));
            s.sweep_at = (s.by_ip.len() * 2).max(MIN_SWEEP);
        }
        let (per_second, burst) = (self.per_second, self.burst);
        s.by_ip
            .entry(crate::tcp_limits::ip_key(ip))
            .or_insert_with(|| TokenBucket::new(per_second, burst, now).expect("a rate"))
            .try_take(1, now)
    }

    /// Addresses with a bucket now (for tests).
    pub fn tracked(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_ip
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn zero_is_no_limit() {
        assert!(TokenBucket::new(0, 10, Instant::now()).is_none());
        let a = AddressBuckets::new(0, 1);
        let ip = "192.0.2.1".parse().unwrap();
        for _ in 0..10_000 {
            a.try_take(ip, Instant::now()).unwrap();
        }
        assert!(!a.is_limited());
        assert_eq!(a.tracked(), 0);
    }

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(5, 5, t0).unwrap();
        for _ in 0..5 {
            b.try_take(1, t0).unwrap();
        }
        assert_eq!(b.try_take(1, t0), Err(200 * MS));
        assert_eq!(b.wait(t0), 200 * MS);
        // A refusal takes nothing: the same wait, less the time gone.
        assert_eq!(b.try_take(1, t0 + 50 * MS), Err(150 * MS));
        b.try_take(1, t0 + 200 * MS).unwrap();
        assert_eq!(b.try_take(1, t0 + 300 * MS), Err(100 * MS));
        // A second idle refills the whole burst, not more.
        let t1 = t0 + 2_000 * MS;
        assert_eq!(b.wait(t1), Duration::ZERO);
        for _ in 0..5 {
            b.try_take(1, t1).unwrap();
        }
        assert!(b.try_take(1, t1).is_err());
    }

    #[test]
    fn a_burst_of_zero_is_one_seconds_worth() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3, 0, t0).unwrap();
        for _ in 0..3 {
            b.try_take(1, t0).unwrap();
        }
        assert!(b.try_take(1, t0).is_err());
    }

    #[test]
    fn take_goes_into_debt_and_says_how_long_to_repay() {
        let t0 = Instant::now();
        // 1000 bytes a second, 100 at once: a 600-byte message passes
        // (it was waited for) and the next waits 0.5 s more.
        let mut b = TokenBucket::new(1000, 100, t0).unwrap();
        assert_eq!(b.wait(t0), Duration::ZERO);
        assert_eq!(b.take(600, t0), 500 * MS);
        assert_eq!(b.wait(t0), 501 * MS);
        assert_eq!(b.wait(t0 + 501 * MS), Duration::ZERO);
        // Reservations queue: each waits its turn.
        let mut r = TokenBucket::new(10, 1, t0).unwrap();
        assert_eq!(r.take(1, t0), Duration::ZERO);
        assert_eq!(r.take(1, t0), 100 * MS);
        assert_eq!(r.take(1, t0), 200 * MS);
        assert_eq!(r.try_take(1, t0 + 100 * MS), Err(200 * MS));
    }

    #[test]
    fn huge_debts_and_rates_neither_overflow_nor_panic() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1, 1, t0).unwrap();
        let w = b.take(u64::MAX, t0);
        assert!(w > Duration::from_secs(1 << 30), "{w:?}");
        assert!(b.try_take(1, t0 + Duration::from_secs(3600)).is_err());
        let mut fast = TokenBucket::new(u64::MAX, 0, t0).unwrap();
        for _ in 0..1000 {
            fast.try_take(1, t0).unwrap();
        }
    }

    #[test]
    fn per_address_with_ipv6_by_its_64() {
        let t0 = Instant::now();
        let a = AddressBuckets::new(1, 2);
        let v4 = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        a.try_take(v4, t0).unwrap();
        a.try_take(mapped, t0).unwrap();
        assert_eq!(a.try_take(v4, t0), Err(Duration::from_secs(1)));
        let (x, y): (IpAddr, IpAddr) = (
            "2001:db8:1:2::1".parse().unwrap(),
            "2001:db8:1:2:ffff::9".parse().unwrap(),
        );
        a.try_take(x, t0).unwrap();
        a.try_take(y, t0).unwrap();
        assert!(a.try_take(x, t0).is_err());
        // Another /64 and another IPv4 address have buckets of their own.
        a.try_take("2001:db8:1:3::1".parse().unwrap(), t0).unwrap();
        a.try_take("192.0.2.2".parse().unwrap(), t0).unwrap();
        assert_eq!(a.tracked(), 4);
    }

    #[test]
    fn full_buckets_are_forgotten() {
        let t0 = Instant::now();
        let a = AddressBuckets::new(1000, 1);
        for i in 0..MIN_SWEEP as u32 {
            a.try_take(IpAddr::from(i.to_be_bytes()), t0).unwrap();
        }
        assert_eq!(a.tracked(), MIN_SWEEP);
        // A millisecond later every bucket is full again: the next new
        // address sweeps them out.
        a.try_take("192.0.2.1".parse().unwrap(), t0 + MS).unwrap();
        assert_eq!(a.tracked(), 1);
        // One still in debt is kept.
        let b = AddressBuckets::new(1, 1);
        let ip = "192.0.2.7".parse().unwrap();
        b.try_take(ip, t0).unwrap();
        for i in 0..MIN_SWEEP as u32 {
            b.try_take(IpAddr::from(((i + 1) << 8).to_be_bytes()), t0 + MS)
                .unwrap();
        }
        assert!(b.try_take(ip, t0 + 2 * MS).is_err());
    }
}
