//! The [`Auth`] in force, swapped whole on reload (SIGHUP), and the counters
//! of authentication outcomes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use crate::{Auth, AuthConfig, AuthError, Method};

/// The [`Auth`] every listener consults. Sessions read it when they
/// authenticate and on each request, so a reload (new keys, password or ACL
/// files) applies to new requests at once without dropping anyone; sessions
/// that wait idle watch [`SharedAuth::subscribe`] and check their
/// credentials again at once, so a reload that revokes them ends them.
#[derive(Debug)]
pub struct SharedAuth {
    current: RwLock<Arc<Auth>>,
    generation: AtomicU64,
    /// The generation, sent on every [`SharedAuth::set`].
    changes: watch::Sender<u64>,
    /// Outcomes of authentication, by protocol and reason.
    pub metrics: AuthMetrics,
}

impl SharedAuth {
    /// Holds `auth`.
    pub fn new(auth: Auth) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(auth)),
            generation: AtomicU64::new(0),
            changes: watch::Sender::new(0),
            metrics: AuthMetrics::default(),
        })
    }

    /// Nothing configured: everyone may do everything (loopback listeners).
    pub fn open() -> Arc<Self> {
        Self::new(Auth::load(&AuthConfig::default()).expect("the empty auth config loads"))
    }

    /// The [`Auth`] in force now.
    pub fn get(&self) -> Arc<Auth> {
        self.current.read().expect("auth lock").clone()
    }

    /// Replaces the [`Auth`] in force and tells the [subscribers](Self::subscribe).
    pub fn set(&self, auth: Auth) {
        let generation = {
            let mut current = self.current.write().expect("auth lock");
            *current = Arc::new(auth);
            // Bumped under the lock: whoever reads the new generation also
            // finds the new Auth.
            self.generation.fetch_add(1, Relaxed) + 1
        };
        self.changes.send_replace(generation);
    }

    /// Notifications of [`set`](Self::set): the receiver's value is the
    /// [`generation`](Self::generation), and `changed()` resolves after each
    /// replacement. Connections that sit idle (an MQTT client, an open MoQT
    /// subscription, an SSE stream) wait on it to check their credentials
    /// again without waiting for their next request. Needs no runtime.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Counts replacements: a session that derived its identity from an
    /// older generation derives it again (a reload may revoke keys, users,
    /// rules or public prefixes, and must reach sessions already up).
    pub fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    /// Loads `cfg` and puts it in force; on error the old one stays.
    pub fn reload(&self, cfg: &AuthConfig) -> Result<(), AuthError> {
        self.set(Auth::load(cfg)?);
        Ok(())
    }
}

/// Counters of authentication outcomes, labelled by protocol (`moqt`,
/// `mqtt`, `http`), result and method or reason, for `/metrics`.
#[derive(Debug, Default)]
pub struct AuthMetrics {
    // Few distinct label sets ever occur (protocols × methods/reasons), and
    // authentication happens per connection or request, not per object: a
    // small locked list is simpler than a fixed array and cheap enough.
    counts: Mutex<Vec<(Label, Arc<AtomicU64>)>>,
}

/// (protocol, success, method or reason).
type Label = (&'static str, bool, &'static str);

impl AuthMetrics {
    fn counter(&self, key: Label) -> Arc<AtomicU64> {
        let mut c = self.counts.lock().expect("auth metrics");
        if let Some((_, n)) = c.iter().find(|(k, _)| *k == key) {
            return n.clone();
        }
        let n = Arc::new(AtomicU64::new(0));
        c.push((key, n.clone()));
        n
    }

    /// Counts a success by `method` on `protocol`.
    pub fn success(&self, protocol: &'static str, method: Method) {
        self.counter((protocol, true, method.as_str()))
            .fetch_add(1, Relaxed);
    }

    /// Counts a failure on `protocol`.
    pub fn failure(&self, protocol: &'static str, e: &AuthError) {
        self.failure_reason(protocol, e.reason());
    }

    /// Counts a failure on `protocol` for `reason` (e.g. `not_authorized`
    /// for a refused request).
    pub fn failure_reason(&self, protocol: &'static str, reason: &'static str) {
        self.counter((protocol, false, reason))
            .fetch_add(1, Relaxed);
    }

    /// The count for one label set (tests).
    pub fn get(&self, protocol: &str, ok: bool, label: &str) -> u64 {
        let c = self.counts.lock().expect("auth metrics");
        c.iter()
            .find(|((p, o, l), _)| *p == protocol && *o == ok && *l == label)
            .map_or(0, |(_, n)| n.load(Relaxed))
    }

    /// Prometheus text.
    pub fn render(&self) -> String {
        let mut s = String::from(
            "# HELP quichub_auth_successes_total Authentications that succeeded, by protocol and method.\n\
             # TYPE quichub_auth_successes_total counter\n",
        );
        let c = self.counts.lock().expect("auth metrics");
        for ((p, _, l), n) in c.iter().filter(|((_, ok, _), _)| *ok) {
            s += &format!(
                "quichub_auth_successes_total{{protocol=\"{p}\",method=\"{l}\"}} {}\n",
                n.load(Relaxed)
            );
        }
        s += "# HELP quichub_auth_failures_total Authentications and authorisations refused, by protocol and reason.\n\
              # TYPE quichub_auth_failures_total counter\n";
        for ((p, _, l), n) in c.iter().filter(|((_, ok, _), _)| !*ok) {
            s += &format!(
                "quichub_auth_failures_total{{protocol=\"{p}\",reason=\"{l}\"}} {}\n",
                n.load(Relaxed)
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_by_label() {
        let m = AuthMetrics::default();
        m.success("moqt", Method::Jwt);
        m.success("moqt", Method::Jwt);
        m.failure("mqtt", &AuthError::BadCredentials);
        assert_eq!(m.get("moqt", true, "jwt"), 2);
        let text = m.render();
        assert!(
            text.contains("quichub_auth_successes_total{protocol=\"moqt\",method=\"jwt\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "quichub_auth_failures_total{protocol=\"mqtt\",reason=\"bad_credentials\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn set_notifies_subscribers_with_the_generation() {
        let s = SharedAuth::open();
        let mut rx = s.subscribe();
        assert_eq!(*rx.borrow_and_update(), 0);
        assert!(!rx.has_changed().unwrap());
        s.set(Auth::load(&AuthConfig::default()).unwrap());
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 1);
        assert_eq!(s.generation(), 1);
        // A failed reload changes nothing, so tells no one.
        let bad = AuthConfig {
            password_file: Some("/nonexistent/quichub/passwd".into()),
            ..AuthConfig::default()
        };
        assert!(s.reload(&bad).is_err());
        assert!(!rx.has_changed().unwrap());
    }

    #[test]
    fn reload_keeps_the_old_auth_on_error() {
        let s = SharedAuth::open();
        assert!(!s.get().configured());
        let bad = AuthConfig {
            password_file: Some("/nonexistent/quichub/passwd".into()),
            ..AuthConfig::default()
        };
        assert!(s.reload(&bad).is_err());
        assert!(!s.get().configured());
    }
}
