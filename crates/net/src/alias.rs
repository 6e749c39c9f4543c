//! The Track Aliases a peer's data names, shared by the relay's ingest and
//! the client's subscriptions: data can overtake the control message that
//! announces its alias (SUBSCRIBE_OK, PUBLISH), since streams, datagrams
//! and the request stream travel independently.
//!
//! - A datagram whose alias is unknown is held ([`EarlyDatagrams`], bounded
//!   in count and age) and handed back when the alias is registered. The
//!   lookup and the hold happen under one lock with the registration, so a
//!   datagram is either routed or held, never lost in between.
//! - A subgroup stream whose alias is unknown waits for it, a bounded time
//!   ([`AliasTable::wait`]).

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::io::EarlyDatagrams;

#[derive(Debug)]
struct Inner<T> {
    map: HashMap<u64, T>,
    early: EarlyDatagrams,
}

/// Track Alias → the receiver's per-track state (`T`), with the datagrams
/// that came before their alias.
#[derive(Debug)]
pub struct AliasTable<T> {
    inner: Mutex<Inner<T>>,
    added: Notify,
}

impl<T> Default for AliasTable<T> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                early: EarlyDatagrams::default(),
            }),
            added: Notify::new(),
        }
    }
}

/// An alias already names a track that may not be replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AliasInUse;

impl<T: Clone> AliasTable<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        self.inner.lock().expect("alias table")
    }

    /// What `alias` names now.
    pub fn get(&self, alias: u64) -> Option<T> {
        self.lock().map.get(&alias).cloned()
    }

    /// Registers `alias` unless it names something `in_use` says may not be
    /// replaced. Returns the datagrams that arrived for it before, oldest
    /// first, for the caller to deliver; datagrams arriving from now on
    /// find the alias.
    pub fn insert(
        &self,
        alias: u64,
        value: T,
        in_use: impl FnOnce(&T) -> bool,
    ) -> Result<Vec<Bytes>, AliasInUse> {
        let held = {
            let mut g = self.lock();
            if g.map.get(&alias).is_some_and(in_use) {
                return Err(AliasInUse);
            }
            g.map.insert(alias, value);
            g.early.take(alias)
        };
        self.added.notify_waiters();
        Ok(held)
    }

    /// Forgets `alias`.
    pub fn remove(&self, alias: u64) -> Option<T> {
        self.lock().map.remove(&alias)
    }

    /// Forgets `alias` if it still names what `mine` recognises (not a
    /// track registered under it since).
    pub fn remove_if(&self, alias: u64, mine: impl FnOnce(&T) -> bool) -> Option<T> {
        let mut g = self.lock();
        if g.map.get(&alias).is_some_and(mine) {
            g.map.remove(&alias)
        } else {
            None
        }
    }

    /// Where a datagram for `alias` goes; `None`: its alias is not known
    /// yet and the datagram is held until it is (or it ages out).
    pub fn route_datagram(&self, alias: u64, datagram: Bytes) -> Option<T> {
        let mut g = self.lock();
        match g.map.get(&alias) {
            Some(v) => Some(v.clone()),
            None => {
                g.early.push(alias, datagram);
                None
            }
        }
    }

    /// What `alias` names, waiting until `deadline` for it to be registered.
    pub async fn wait(&self, alias: u64, deadline: tokio::time::Instant) -> Option<T> {
        loop {
            // Registered for the wake-up before looking, so an insert in
            // between is not missed.
            let added = self.added.notified();
            if let Some(v) = self.get(alias) {
                return Some(v);
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_datagram_before_its_alias_is_handed_back_when_the_alias_comes() {
        let t = AliasTable::<&str>::default();
        assert_eq!(t.route_datagram(5, Bytes::from("early-1")), None);
        assert_eq!(t.route_datagram(5, Bytes::from("early-2")), None);
        assert_eq!(t.route_datagram(6, Bytes::from("other")), None);
        let held = t.insert(5, "track", |_| true).unwrap();
        assert_eq!(held, [Bytes::from("early-1"), Bytes::from("early-2")]);
        // Routed directly from now on.
        assert_eq!(t.route_datagram(5, Bytes::from("late")), Some("track"));
        // The other alias's datagram is still held for it.
        assert_eq!(t.insert(6, "t6", |_| true).unwrap(), [Bytes::from("other")]);
    }

    #[test]
    fn an_alias_in_use_is_refused_unless_its_track_may_be_replaced() {
        let t = AliasTable::<(&str, bool)>::default();
        t.insert(1, ("a", false), |_| true).unwrap();
        let ended = |v: &(&str, bool)| !v.1;
        assert_eq!(t.insert(1, ("b", false), ended), Err(AliasInUse));
        t.remove(1);
        t.insert(1, ("b", true), ended).unwrap();
        // "b" ended: its alias may be reused.
        t.insert(1, ("c", false), ended).unwrap();
        assert_eq!(t.get(1), Some(("c", false)));
    }

    #[tokio::test]
    async fn a_stream_before_its_alias_waits_for_it_a_bounded_time() {
        let t = Arc::new(AliasTable::<u32>::default());
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                t.wait(9, deadline).await
            })
        };
        tokio::task::yield_now().await;
        t.insert(9, 42, |_| true).unwrap();
        assert_eq!(waiter.await.unwrap(), Some(42));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(t.wait(10, deadline).await, None);
    }
}
