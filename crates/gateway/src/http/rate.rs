//! The rate of publishes (`POST /v1/t/{topic}`) per client address
//! ([`super::ApiConfig::publish_rate`]): beyond it 429 Too Many Requests
//! with `Retry-After`, before the request is authenticated, so a flood costs
//! no token verification either.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use http::header::{HeaderValue, RETRY_AFTER};
use http::{Extensions, Response, StatusCode};
use quichub_net::rate::AddressBuckets;

use super::api::{error, ApiBody};

/// The address a request came from: each transport puts it in the
/// request's extensions. A request without one (made in-process) is not
/// limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// Publishes per second per client address (IPv6: per /64), and those
/// refused.
#[derive(Debug)]
pub struct PublishRate {
    buckets: AddressBuckets,
    refused: AtomicU64,
}

impl PublishRate {
    /// `per_second` publishes a second per address after a burst of `burst`
    /// (0: one second's worth); `per_second` 0: no limit.
    pub fn new(per_second: u64, burst: u64) -> Self {
        Self {
            buckets: AddressBuckets::new(per_second, burst),
            refused: AtomicU64::new(0),
        }
    }

    /// Admits a publish from the [`ClientAddr`] in `extensions`, or counts
    /// it refused and says how long until one would be admitted (answer
    /// [`too_many`]).
    pub fn check(&self, extensions: &Extensions) -> Result<(), Duration> {
        let Some(ClientAddr(addr)) = extensions.get::<ClientAddr>() else {
            return Ok(());
        };
        self.buckets
            .try_take(addr.ip(), Instant::now())
            .inspect_err(|_| {
                self.refused.fetch_add(1, Relaxed);
            })
    }

    /// Publishes refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// The Prometheus text of the refusals.
    pub fn render(&self) -> String {
        format!(
            "# HELP quichub_http_rate_limited_total HTTP publishes (POST) refused with 429 because their client address was over [http] publish_rate.\n\
             # TYPE quichub_http_rate_limited_total counter\n\
             quichub_http_rate_limited_total {}\n",
            self.refused()
        )
    }
}

/// 429 to a publish refused by [`PublishRate::check`], with the whole
/// seconds until one would pass in `Retry-After` (RFC 9110 §10.2.3), rounded
/// up so a client that waits that long is admitted.
pub fn too_many(wait: Duration) -> Response<ApiBody> {
    let mut r = error(
        StatusCode::TOO_MANY_REQUESTS,
        "too many publishes from this address: [http] publish_rate",
    );
    let secs = wait.as_nanos().div_ceil(1_000_000_000).max(1) as u64;
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_the_burst_429_with_retry_after_per_address() {
        let rate = PublishRate::new(1, 2);
        let from = |a: &str| {
            let mut e = Extensions::new();
            e.insert(ClientAddr(a.parse().unwrap()));
            e
        };
        let a = from("192.0.2.1:5000");
        rate.check(&a).unwrap();
        // Another port of the same address shares its bucket.
        rate.check(&from("192.0.2.1:5001")).unwrap();
        let r = too_many(rate.check(&a).unwrap_err());
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert_eq!(
            too_many(Duration::from_millis(1500)).headers()[RETRY_AFTER],
            "2"
        );
        rate.check(&from("192.0.2.2:5000")).unwrap();
        // In-process requests carry no address.
        for _ in 0..10 {
            rate.check(&Extensions::new()).unwrap();
        }
        assert_eq!(rate.refused(), 1);
        assert!(rate
            .render()
            .contains("quichub_http_rate_limited_total 1\n"));
    }
}
