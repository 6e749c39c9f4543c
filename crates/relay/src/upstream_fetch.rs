//! FETCH for objects the relay does not hold (draft-18 §9.16: "a relay ...
//! issues upstream FETCHes to retrieve them"): one upstream FETCH per track
//! and range, however many downstream FETCHes ask for that range while it
//! is under way.
//!
//! The response is kept as it arrives, so a downstream FETCH that joins late
//! replays it from its first entry. What it keeps is bounded per response by
//! `cache_bytes_per_track` and for all of them by `cache_bytes_total` (a
//! budget of its own, apart from the track caches, so neither evicts the
//! other): a response that would pass them is cut there and reported as
//! failed. It ends as soon as no downstream FETCH reads it any more
//! ([`UpstreamFetch::unread`]). This module is the shared state only;
//! sending the FETCH and reading its stream is the session's
//! ([`crate::core::Peer::fetch_upstream`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use moqt::data::FetchEntry;
use moqt::message::FetchOk;
use moqt::{FullTrackName, Location};
use tokio::sync::watch;

use crate::config::Config;
use crate::core::Refusal;
use crate::metrics::Metrics;

/// What an upstream FETCH asks for: requests with equal keys share one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FetchKey {
    /// The track.
    pub track: FullTrackName,
    /// Start Location (inclusive).
    pub start: Location,
    /// End Location as FETCH encodes it: the last object plus one, object 0
    /// meaning the whole group.
    pub end: Location,
    /// Descending group order.
    pub descending: bool,
}

/// How an upstream FETCH ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The response stream ended with a FIN: every object is in.
    Complete,
    /// REQUEST_ERROR, or no answer in time, before FETCH_OK.
    Refused(Refusal),
    /// After FETCH_OK: the stream was reset, stalled, malformed, or passed
    /// the memory limit. The entries kept so far are good.
    Broken(String),
}

/// What a reader finds at an index of the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The entry at that index.
    Entry(FetchEntry),
    /// No entry there, and there never will be.
    End(Outcome),
}

#[derive(Debug, Default)]
struct State {
    ok: Option<FetchOk>,
    entries: Vec<FetchEntry>,
    bytes: usize,
    outcome: Option<Outcome>,
}

/// One upstream FETCH and its response so far.
#[derive(Debug)]
pub struct UpstreamFetch {
    /// What it asks for.
    pub key: FetchKey,
    state: Mutex<State>,
    /// Bumped on every change, for readers to wait on.
    version: watch::Sender<u64>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
}

impl UpstreamFetch {
    /// A FETCH not yet answered.
    pub(crate) fn new(key: FetchKey, config: Arc<Config>, metrics: Arc<Metrics>) -> Self {
        Self {
            key,
            state: Mutex::default(),
            version: watch::channel(0).0,
            config,
            metrics,
        }
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        {
            let mut st = self.state.lock().expect("fetch state");
            if st.outcome.is_some() {
                return;
            }
            f(&mut st);
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// The upstream answered FETCH_OK.
    pub(crate) fn accept(&self, ok: FetchOk) {
        self.change(|st| st.ok = Some(ok));
    }

    /// An entry of the response arrived. `false`: it would pass the cache
    /// limits; the fetch is over ([`Outcome::Broken`]) and the caller stops
    /// reading.
    pub(crate) fn push(&self, entry: FetchEntry) -> bool {
        let size = match &entry {
            FetchEntry::Object(o) => o.payload.len() + o.properties.len() + 64,
            _ => 32,
        };
        let mut fits = false;
        self.change(|st| {
            let total = self.metrics.fetch_upstream_bytes.load(Relaxed).max(0) as usize;
            if st.bytes + size > self.config.cache_bytes_per_track
                || total + size > self.config.cache_bytes_total
            {
                st.outcome = Some(Outcome::Broken(
                    "upstream FETCH response passes the cache limits".into(),
                ));
                self.metrics.fetch_upstream_failed.fetch_add(1, Relaxed);
                return;
            }
            st.bytes += size;
            self.metrics
                .fetch_upstream_bytes
                .fetch_add(size as i64, Relaxed);
            st.entries.push(entry);
            fits = true;
        });
        fits
    }

    /// The upstream FETCH is over.
    pub(crate) fn finish(&self, outcome: Outcome) {
        self.change(|st| {
            // Refused after FETCH_OK cannot be: whatever broke, broke the stream.
            let outcome = match outcome {
                Outcome::Refused(r) if st.ok.is_some() => Outcome::Broken(r.reason),
                o => o,
            };
            if outcome != Outcome::Complete {
                self.metrics.fetch_upstream_failed.fetch_add(1, Relaxed);
            }
            st.outcome = Some(outcome);
        });
    }

    /// Nobody but the task feeding it holds it: every downstream FETCH
    /// that wanted it is over, so the upstream FETCH can stop.
    pub fn unread(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1
    }

    /// How it ended, once it has.
    #[cfg(test)]
    pub fn outcome(&self) -> Option<Outcome> {
        self.state.lock().expect("fetch state").outcome.clone()
    }

    /// FETCH_OK once the upstream sent it, or the refusal.
    pub async fn ok(&self) -> Result<FetchOk, Refusal> {
        let mut rx = self.version.subscribe();
        loop {
            {
                let st = self.state.lock().expect("fetch state");
                if let Some(ok) = &st.ok {
                    return Ok(ok.clone());
                }
                match &st.outcome {
                    Some(Outcome::Refused(r)) => return Err(r.clone()),
                    Some(Outcome::Broken(e)) => {
                        return Err(Refusal::new(
                            moqt::error::request_error::INTERNAL_ERROR,
                            e.clone(),
                        ))
                    }
                    Some(Outcome::Complete) | None => {}
                }
            }
            if rx.changed().await.is_err() {
                return Err(Refusal::new(
                    moqt::error::request_error::INTERNAL_ERROR,
                    "upstream FETCH gone",
                ));
            }
        }
    }

    /// The entry at `index`, waiting for it to arrive.
    pub async fn next(&self, index: usize) -> Next {
        let mut rx = self.version.subscribe();
        loop {
            {
                let st = self.state.lock().expect("fetch state");
                if let Some(e) = st.entries.get(index) {
                    return Next::Entry(e.clone());
                }
                if let Some(o) = &st.outcome {
                    return Next::End(o.clone());
                }
            }
            if rx.changed().await.is_err() {
                return Next::End(Outcome::Broken("upstream FETCH gone".into()));
            }
        }
    }
}

impl Drop for UpstreamFetch {
    fn drop(&mut self) {
        let bytes = self.state.lock().map(|s| s.bytes).unwrap_or(0);
        self.metrics
            .fetch_upstream_bytes
            .fetch_sub(bytes as i64, Relaxed);
    }
}

/// The FETCH encoding of an inclusive end (`u64::MAX` object: the whole
/// group).
pub fn wire_end(last: Location) -> Location {
    if last.object == u64::MAX {
        Location::new(last.group, 0)
    } else {
        Location::new(last.group, last.object + 1)
    }
}

/// The inclusive end of a FETCH End Location (object 0: the whole group,
/// as `u64::MAX`).
pub fn last_of(end: Location) -> Location {
    if end.object == 0 {
        Location::new(end.group, u64::MAX)
    } else {
        Location::new(end.group, end.object - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use moqt::data::FetchObject;
    use moqt::Parameters;

    fn fetch(config: Config) -> (UpstreamFetch, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        let key = FetchKey {
            track: FullTrackName::new("a", "b"),
            start: Location::new(0, 0),
            end: Location::new(3, 0),
            descending: false,
        };
        (
            UpstreamFetch::new(key, Arc::new(config), metrics.clone()),
            metrics,
        )
    }

    fn object(group: u64, len: usize) -> FetchEntry {
        FetchEntry::Object(FetchObject {
            group,
            subgroup: Some(0),
            object_id: 0,
            priority: 128,
            properties: Bytes::new(),
            payload: Bytes::from(vec![7; len]),
        })
    }

    fn ok() -> FetchOk {
        FetchOk {
            end_of_track: false,
            end_location: Location::new(3, 0),
            params: Parameters::default(),
            properties: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_late_reader_replays_the_response_from_its_start() {
        let (f, metrics) = fetch(Config::default());
        f.accept(ok());
        assert!(f.push(object(0, 10)));
        assert!(f.push(object(1, 10)));
        assert!(metrics.fetch_upstream_bytes.load(Relaxed) > 20);
        let waiting = f.next(2);
        let (next, ()) = tokio::join!(waiting, async {
            tokio::task::yield_now().await;
            f.push(object(2, 10));
            f.finish(Outcome::Complete);
        });
        assert_eq!(next, Next::Entry(object(2, 10)));
        // A reader that comes now still finds every entry, then the end.
        assert_eq!(f.ok().await.unwrap(), ok());
        for (i, g) in [0, 1, 2].into_iter().enumerate() {
            assert_eq!(f.next(i).await, Next::Entry(object(g, 10)));
        }
        assert_eq!(f.next(3).await, Next::End(Outcome::Complete));
        drop(f);
        assert_eq!(metrics.fetch_upstream_bytes.load(Relaxed), 0);
    }

    #[tokio::test]
    async fn a_refusal_reaches_readers_waiting_for_fetch_ok() {
        let (f, _) = fetch(Config::default());
        let refusal = Refusal::new(moqt::error::request_error::NOT_SUPPORTED, "no");
        let (r, ()) = tokio::join!(f.ok(), async {
            tokio::task::yield_now().await;
            f.finish(Outcome::Refused(refusal.clone()));
        });
        assert_eq!(r, Err(refusal.clone()));
        assert_eq!(f.next(0).await, Next::End(Outcome::Refused(refusal)));
    }

    #[tokio::test]
    async fn a_response_past_the_cache_limit_is_cut_and_nothing_more_is_taken() {
        let (f, _) = fetch(Config {
            cache_bytes_per_track: 1000,
            ..Config::default()
        });
        f.accept(ok());
        assert!(f.push(object(0, 600)));
        assert!(!f.push(object(1, 600)));
        assert!(matches!(f.next(1).await, Next::End(Outcome::Broken(_))));
        // Nothing changes once it is over.
        assert!(!f.push(object(2, 1)));
        assert!(matches!(f.next(1).await, Next::End(Outcome::Broken(_))));
        f.finish(Outcome::Complete);
        assert!(matches!(f.outcome(), Some(Outcome::Broken(_))));
    }

    #[test]
    fn a_fetch_only_its_feeder_holds_is_unread() {
        let (f, _) = fetch(Config::default());
        let f = Arc::new(f);
        let reader = f.clone();
        assert!(!f.unread());
        drop(reader);
        assert!(f.unread());
    }

    #[test]
    fn end_locations_convert_both_ways() {
        for last in [
            Location::new(4, u64::MAX),
            Location::new(4, 0),
            Location::new(4, 9),
        ] {
            assert_eq!(last_of(wire_end(last)), last);
        }
        assert_eq!(wire_end(Location::new(4, u64::MAX)), Location::new(4, 0));
        assert_eq!(wire_end(Location::new(4, 2)), Location::new(4, 3));
    }
}
