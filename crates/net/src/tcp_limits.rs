//! Limits shared by every TCP listener of the process (MQTT, MQTT over TLS,
//! the HTTP API, metrics): they all draw on the same file descriptors, so
//! each gets a connection cap that is a share of them ([`TcpLimits`],
//! [`raise_nofile_limit`]), a cap per client address ([`ConnLimiter`]), and
//! an accept loop that survives running out of descriptors without a log
//! line per attempt ([`Acceptor`]).
//!
//! A connection over a cap is closed as soon as it is accepted: its
//! descriptor is held for microseconds, never for the connection's life.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};

/// The `[tcp]` section of the relay's config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpLimits {
    /// Connections open at once on each client listener (MQTT, MQTT over
    /// TLS, HTTP). `0` (the default): an equal share of the descriptors left
    /// after [`reserved_fds`](Self::reserved_fds). A larger value than that
    /// share is lowered to it, so no listener can starve the others.
    pub max_connections: usize,
    /// Connections open at once from one client address on each listener
    /// (IPv6: one /64 counts as one address); `0`: no cap per address.
    pub max_connections_per_ip: usize,
    /// Descriptors kept out of the listeners' shares: QUIC sockets, the
    /// broker's store, the metrics listener, logs (at most half of the
    /// process's limit).
    pub reserved_fds: usize,
    /// HTTP (API and metrics): time from a connection's start, or from the
    /// first byte of a later request, to a complete request head. Bounds
    /// clients that send nothing, send headers slowly, or (HTTP/2) never
    /// finish the handshake. This and the other timeouts: `0` turns it off.
    pub http_header_timeout_ms: u64,
    /// HTTP API: time a keep-alive connection may sit with no request in
    /// flight between requests (HTTP/1.1 and HTTP/2) before it is closed.
    pub http_idle_timeout_ms: u64,
    /// HTTP API: time from a request head to the end of its body (at most
    /// the API's body limit); a slower body is answered 408.
    pub http_body_timeout_ms: u64,
}

impl Default for TcpLimits {
    fn default() -> Self {
        Self {
            max_connections: 0,
            max_connections_per_ip: 1024,
            reserved_fds: 1024,
            http_header_timeout_ms: 10_000,
            http_idle_timeout_ms: 60_000,
            http_body_timeout_ms: 60_000,
        }
    }
}

/// Connections at once on the metrics listener (inside the reserve).
pub const METRICS_MAX_CONNECTIONS: usize = 64;

impl TcpLimits {
    /// The connection cap of each of `listeners` client listeners when the
    /// process may hold `nofile` descriptors.
    pub fn listener_cap(&self, nofile: u64, listeners: usize) -> usize {
        let nofile = nofile.min(1 << 30) as usize;
        let reserve = self.reserved_fds.min(nofile / 2);
        let share = ((nofile - reserve) / listeners.max(1)).max(1);
        match self.max_connections {
            0 => share,
            n => n.min(share),
        }
    }

    /// A limiter for one client listener out of `listeners`, at the
    /// process's current descriptor limit.
    pub fn limiter(&self, name: &'static str, listeners: usize) -> Arc<ConnLimiter> {
        ConnLimiter::new(
            name,
            self.listener_cap(nofile_limit(), listeners),
            self.max_connections_per_ip,
        )
    }

    /// The metrics listener's limiter ([`METRICS_MAX_CONNECTIONS`]).
    pub fn metrics_limiter(&self) -> Arc<ConnLimiter> {
        ConnLimiter::new(
            "metrics",
            METRICS_MAX_CONNECTIONS,
            self.max_connections_per_ip,
        )
    }

    /// [`http_header_timeout_ms`](Self::http_header_timeout_ms).
    pub fn http_header_timeout(&self) -> Duration {
        timeout(self.http_header_timeout_ms)
    }

    /// [`http_body_timeout_ms`](Self::http_body_timeout_ms).
    pub fn http_body_timeout(&self) -> Duration {
        timeout(self.http_body_timeout_ms)
    }

    /// [`http_idle_timeout_ms`](Self::http_idle_timeout_ms).
    pub fn http_idle_timeout(&self) -> Duration {
        timeout(self.http_idle_timeout_ms)
    }
}

/// A timeout in milliseconds; `0` turns it off (a year).
fn timeout(ms: u64) -> Duration {
    match ms {
        0 => Duration::from_secs(365 * 24 * 3600),
        ms => Duration::from_millis(ms),
    }
}

/// The soft RLIMIT_NOFILE (descriptors this process may hold).
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    r.rlim_cur
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (or as near as the
/// kernel allows) and returns the soft limit then in effect.
pub fn raise_nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return nofile_limit();
    }
    // An unlimited hard limit cannot be the soft one on Linux (fs.nr_open
    // caps it): try it, then 2^20.
    for want in [r.rlim_max, 1 << 20] {
        if want <= r.rlim_cur {
            break;
        }
        let next = libc::rlimit {
            rlim_cur: want,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &next) } == 0 {
            break;
        }
    }
    nofile_limit()
}

/// At most one log line a second for a repeated event, with how many there
/// were since the last line (the count of a burst's tail waits for the next
/// event).
#[derive(Debug, Default)]
pub struct Throttle {
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    /// Counts an event; `Some(n)` when it is time to log (the `n` events
    /// since the last line, this one included).
    pub fn hit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 += 1;
        match s.0 {
            Some(t) if now.duration_since(t) < Duration::from_secs(1) => None,
            _ => {
                let n = s.1;
                *s = (Some(now), 0);
                Some(n)
            }
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The listener has its cap of connections open.
    Listener,
    /// The client's address has its cap of connections open.
    Address,
}

/// Counts the connections open on one listener, in all and per client
/// address, and refuses those over a cap.
#[derive(Debug)]
pub struct ConnLimiter {
    name: &'static str,
    max: usize,
    per_ip: usize,
    state: Mutex<Counts>,
    refused: Throttle,
}

#[derive(Debug, Default)]
struct Counts {
    open: usize,
    by_ip: HashMap<IpAddr, usize>,
}

/// The address a client is counted under: IPv4-mapped IPv6 as IPv4, other
/// IPv6 by its /64 (one host usually holds a whole /64).
pub(crate) fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

impl ConnLimiter {
    /// A limiter named `name` (for logs): at most `max` connections at
    /// once, and `per_ip` from one address (`0`: no cap per address).
    pub fn new(name: &'static str, max: usize, per_ip: usize) -> Arc<Self> {
        Arc::new(Self {
            name,
            max,
            per_ip,
            state: Mutex::new(Counts::default()),
            refused: Throttle::default(),
        })
    }

    /// The listener's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The cap on connections at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Connections open now from `ip` (its /64 for IPv6).
    pub fn open_from(&self, ip: IpAddr) -> usize {
        self.lock().by_ip.get(&ip_key(ip)).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `ip`, counted until the guard is dropped.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Result<ConnGuard, Refused> {
        let key = ip_key(ip);
        let mut c = self.lock();
        if c.open >= self.max {
            return Err(Refused::Listener);
        }
        let n = c.by_ip.entry(key).or_insert(0);
        if self.per_ip != 0 && *n >= self.per_ip {
            return Err(Refused::Address);
        }
        *n += 1;
        c.open += 1;
        Ok(ConnGuard {
            limiter: self.clone(),
            key,
        })
    }
}

/// One admitted connection; dropping it (when its task ends) frees its place.
#[derive(Debug)]
pub struct ConnGuard {
    limiter: Arc<ConnLimiter>,
    key: IpAddr,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut c = self.limiter.lock();
        c.open -= 1;
        if let Some(n) = c.by_ip.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                c.by_ip.remove(&self.key);
            }
        }
    }
}

/// A listener whose connections pass a [`ConnLimiter`]: the accept loop of
/// every TCP listener of the process.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    limiter: Arc<ConnLimiter>,
    errors: Throttle,
}

/// First and longest pause after a failed accept that may repeat at once
/// (out of descriptors or memory).
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

impl Acceptor {
    /// Accepts on `listener` within `limiter`'s caps.
    pub fn new(listener: TcpListener, limiter: Arc<ConnLimiter>) -> Self {
        Self {
            listener,
            limiter,
            errors: Throttle::default(),
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<ConnLimiter> {
        &self.limiter
    }

    /// The next admitted connection. Connections over a cap are closed at
    /// once; accept errors are logged at most once a second (with a count),
    /// and when they mean the process is out of descriptors or memory the
    /// loop backs off (10 ms doubling to 500 ms) instead of spinning.
    pub async fn accept(&self) -> (TcpStream, SocketAddr, ConnGuard) {
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => match self.limiter.try_acquire(peer.ip()) {
                    Ok(guard) => return (stream, peer, guard),
                    Err(why) => {
                        drop(stream);
                        if let Some(n) = self.limiter.refused.hit() {
                            let cap = match why {
                                Refused::Listener => {
                                    format!("the listener's cap of {}", self.limiter.max)
                                }
                                Refused::Address => format!(
                                    "the cap of {} per address ({} last)",
                                    self.limiter.per_ip,
                                    peer.ip()
                                ),
                            };
                            tracing::warn!(
                                "{}: closed {n} connection(s) over {cap} since the last such warning",
                                self.limiter.name
                            );
                        }
                    }
                },
                Err(e) => {
                    if let Some(n) = self.errors.hit() {
                        tracing::warn!(
                            "{} accept: {e} ({n} failed accept(s) since the last such warning)",
                            self.limiter.name
                        );
                    }
                    if exhausted(&e) {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    } else {
                        tokio::task::yield_now().await;
                    }
                }
            }
        }
    }
}

/// Whether an accept error means the process or system is out of
/// descriptors or memory (so retrying at once would fail again).
fn exhausted(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn caps_per_listener_and_per_address_and_guards_free_them() {
        let l = ConnLimiter::new("t", 3, 2);
        let a1 = l.try_acquire(ip("10.0.0.1")).unwrap();
        let a2 = l.try_acquire(ip("10.0.0.1")).unwrap();
        assert_eq!(l.try_acquire(ip("10.0.0.1")).unwrap_err(), Refused::Address);
        let b1 = l.try_acquire(ip("10.0.0.2")).unwrap();
        assert_eq!(l.open(), 3);
        assert_eq!(
            l.try_acquire(ip("10.0.0.3")).unwrap_err(),
            Refused::Listener
        );
        drop(a1);
        assert_eq!((l.open(), l.open_from(ip("10.0.0.1"))), (2, 1));
        let a3 = l.try_acquire(ip("10.0.0.1")).unwrap();
        drop((a2, a3, b1));
        assert_eq!(l.open(), 0);
        assert!(l.lock().by_ip.is_empty(), "no entry left per address");
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let l = ConnLimiter::new("t", 100, 2);
        let _g1 = l.try_acquire(ip("2001:db8:1:2::1")).unwrap();
        let _g2 = l.try_acquire(ip("2001:db8:1:2:ffff::9")).unwrap();
        assert_eq!(
            l.try_acquire(ip("2001:db8:1:2:abcd::1")).unwrap_err(),
            Refused::Address,
            "same /64"
        );
        let _g3 = l.try_acquire(ip("2001:db8:1:3::1")).unwrap();
        let _g4 = l.try_acquire(ip("192.0.2.7")).unwrap();
        let _g5 = l.try_acquire(ip("::ffff:192.0.2.7")).unwrap();
        assert_eq!(
            l.try_acquire(ip("192.0.2.7")).unwrap_err(),
            Refused::Address
        );
    }

    #[test]
    fn per_address_cap_zero_means_none() {
        let l = ConnLimiter::new("t", 5, 0);
        let g: Vec<_> = (0..5).map(|_| l.try_acquire(ip("::1")).unwrap()).collect();
        assert_eq!(l.try_acquire(ip("::1")).unwrap_err(), Refused::Listener);
        drop(g);
    }

    #[test]
    fn listener_caps_share_the_descriptors() {
        let d = TcpLimits::default();
        // 3 listeners on 20 000 descriptors, 1024 reserved.
        assert_eq!(d.listener_cap(20_000, 3), (20_000 - 1024) / 3);
        // A small limit keeps at most half in reserve.
        assert_eq!(d.listener_cap(1024, 2), 256);
        assert_eq!(d.listener_cap(0, 3), 1);
        let fixed = TcpLimits {
            max_connections: 500,
            ..d.clone()
        };
        assert_eq!(fixed.listener_cap(1 << 20, 3), 500);
        assert_eq!(fixed.listener_cap(1024, 2), 256, "lowered to the share");
        assert_eq!(d.listener_cap(u64::MAX, 1), (1 << 30) - 1024);
    }

    #[test]
    fn raising_the_limit_never_lowers_it() {
        let before = nofile_limit();
        assert!(raise_nofile_limit() >= before);
    }

    #[test]
    fn throttle_logs_once_a_second_with_a_count() {
        let t = Throttle::default();
        assert_eq!(t.hit(), Some(1));
        for _ in 0..99 {
            assert_eq!(t.hit(), None);
        }
        t.state.lock().unwrap().0 = Some(Instant::now() - Duration::from_secs(2));
        assert_eq!(t.hit(), Some(100));
    }

    #[test]
    fn config_defaults_and_unknown_keys() {
        let d: TcpLimits = serde_json::from_str("{}").unwrap();
        assert_eq!(d, TcpLimits::default());
        let c: TcpLimits = serde_json::from_str(r#"{"http_header_timeout_ms": 300}"#).unwrap();
        assert_eq!(c.http_header_timeout(), Duration::from_millis(300));
        assert_eq!(c.http_idle_timeout_ms, 60_000);
        assert!(serde_json::from_str::<TcpLimits>(r#"{"max_conns": 1}"#).is_err());
        let off: TcpLimits = serde_json::from_str(r#"{"http_idle_timeout_ms": 0}"#).unwrap();
        assert!(
            off.http_idle_timeout() > Duration::from_secs(1 << 24),
            "0 is off"
        );
    }

    #[tokio::test]
    async fn acceptor_closes_connections_over_the_cap_at_once() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acc = Arc::new(Acceptor::new(listener, ConnLimiter::new("t", 10, 1)));
        let a = acc.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let admitted = a.accept().await;
                tx.send(admitted).unwrap();
            }
        });
        let _first = TcpStream::connect(addr).await.unwrap();
        let held = rx.recv().await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), second.read(&mut b))
            .await
            .expect("closed at once")
            .unwrap_or(0);
        assert_eq!(n, 0, "the second connection from the address is closed");
        drop(held);
        let _third = TcpStream::connect(addr).await.unwrap();
        let (_, _, _g) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(acc.limiter().open(), 1);
    }
}
