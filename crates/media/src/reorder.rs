//! Objects back in (Group, Object ID) order across subgroup streams.
//!
//! Hand-written: the order to restore is MoQT's (groups, objects, and the
//! end of each group's subgroup streams), which no general reordering crate
//! knows. Sans-IO: the caller says what time it is.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Puts objects back in (Group, Object ID) order. They arrive on one
/// stream per subgroup, and QUIC orders nothing across streams: the first
/// objects of group N+1 can overtake the last of group N, and frame-type
/// subgroups interleave. A gap is waited for until the streams of its group
/// have all ended, or for [`REORDER_WAIT`], then skipped.
#[derive(Debug)]
pub struct Reorder<T> {
    /// The position expected next: (group, object).
    next: Option<(u64, u64)>,
    held: BTreeMap<(u64, u64), T>,
    /// Bytes in `held`.
    held_bytes: usize,
    /// Subgroup streams of each group still open.
    open: HashMap<u64, HashSet<u64>>,
    /// Groups all of whose streams have ended.
    ended: HashSet<u64>,
    /// Since when the head of `held` waits on a gap.
    stuck_since: Option<Instant>,
    /// Objects that came after their place was given up.
    late: u64,
}

impl<T> Default for Reorder<T> {
    fn default() -> Self {
        Self {
            next: None,
            held: BTreeMap::new(),
            held_bytes: 0,
            open: HashMap::new(),
            ended: HashSet::new(),
            stuck_since: None,
            late: 0,
        }
    }
}

/// How long a gap is waited for.
pub const REORDER_WAIT: Duration = Duration::from_millis(500);
/// Most objects held behind a gap.
const MAX_HELD: usize = 256;
/// Most bytes held behind a gap: a publisher's objects can be large.
const MAX_HELD_BYTES: usize = 64 << 20;

/// What [`Reorder`] holds: something with a size in bytes.
pub trait Held {
    /// Its size in bytes, counted against the bytes held behind a gap.
    fn size(&self) -> usize;
}

impl Held for Bytes {
    fn size(&self) -> usize {
        Bytes::len(self)
    }
}

impl<T: Held> Reorder<T> {
    /// Takes an object (`subgroup` `None` for one fetched from the cache)
    /// and returns the payloads now in order, each with whether it starts
    /// its group.
    pub fn object(
        &mut self,
        group: u64,
        subgroup: Option<u64>,
        object: u64,
        payload: T,
        now: Instant,
    ) -> Vec<(bool, T)> {
        if self.next.is_some_and(|n| (group, object) < n) {
            self.late += 1;
            return Vec::new();
        }
        if let Some(sg) = subgroup {
            self.open.entry(group).or_default().insert(sg);
        }
        self.held_bytes += payload.size();
        if let Some(old) = self.held.insert((group, object), payload) {
            self.held_bytes -= old.size();
        }
        self.release(false, now)
    }

    /// A subgroup stream ended.
    pub fn subgroup_end(&mut self, group: u64, subgroup: u64, now: Instant) -> Vec<(bool, T)> {
        if let Some(open) = self.open.get_mut(&group) {
            open.remove(&subgroup);
            if open.is_empty() {
                self.open.remove(&group);
                self.ended.insert(group);
            }
        }
        self.release(false, now)
    }

    /// Releases what is in order, and what waited on a gap for
    /// [`REORDER_WAIT`]; with `flush`, everything.
    pub fn release(&mut self, flush: bool, now: Instant) -> Vec<(bool, T)> {
        let mut out = Vec::new();
        while let Some((&(g, o), _)) = self.held.first_key_value() {
            let in_order = match self.next {
                None => true,
                Some((ng, no)) => {
                    (g, o) == (ng, no) || (g > ng && o == 0 && self.ended.contains(&ng))
                }
            };
            let give_up = flush
                || self.held.len() > MAX_HELD
                || self.held_bytes > MAX_HELD_BYTES
                || self
                    .stuck_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= REORDER_WAIT);
            if !in_order && !give_up {
                self.stuck_since.get_or_insert(now);
                break;
            }
            self.stuck_since = None;
            if let Some(p) = self.held.remove(&(g, o)) {
                self.held_bytes -= p.size();
                out.push((o == 0, p));
            }
            if let Some((ng, _)) = self.next {
                if g > ng {
                    // Groups left behind are done with, whatever their streams say.
                    self.ended.retain(|&e| e >= g);
                    self.open.retain(|&k, _| k >= g);
                }
            }
            self.next = Some((g, o + 1));
        }
        out
    }

    /// Objects that came after their place was given up.
    pub fn late(&self) -> u64 {
        self.late
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    fn p(v: Vec<(bool, Bytes)>) -> Vec<Bytes> {
        v.into_iter().map(|(_, p)| p).collect()
    }

    #[test]
    fn reorder_waits_for_the_previous_group_to_end() {
        let mut r = Reorder::default();
        let now = Instant::now();
        assert_eq!(p(r.object(0, Some(0), 0, b("0.0"), now)), vec![b("0.0")]);
        // Group 1 overtakes the end of group 0: held.
        assert!(r.object(1, Some(0), 0, b("1.0"), now).is_empty());
        assert_eq!(p(r.object(0, Some(0), 1, b("0.1"), now)), vec![b("0.1")]);
        // Group 0's stream ends: group 1 may go.
        assert_eq!(p(r.subgroup_end(0, 0, now)), vec![b("1.0")]);
        // Frame-type subgroups: object 2 (subgroup 2) before 1 (subgroup 1).
        assert!(r.object(1, Some(2), 2, b("1.2"), now).is_empty());
        assert_eq!(
            p(r.object(1, Some(1), 1, b("1.1"), now)),
            vec![b("1.1"), b("1.2")]
        );
        // Late objects of a group already passed are dropped and counted.
        assert!(r.object(0, Some(0), 2, b("late"), now).is_empty());
        assert_eq!(r.late(), 1);
        // A gap never filled is given up at the flush.
        assert!(r.object(1, Some(0), 4, b("1.4"), now).is_empty());
        assert_eq!(p(r.release(true, now)), vec![b("1.4")]);
    }

    #[test]
    fn a_gap_is_given_up_after_the_wait() {
        let mut r = Reorder::default();
        let t0 = Instant::now();
        assert_eq!(p(r.object(0, Some(0), 0, b("0.0"), t0)), vec![b("0.0")]);
        // Object 1 is missing; 2 waits for it.
        assert!(r.object(0, Some(0), 2, b("0.2"), t0).is_empty());
        let almost = t0 + REORDER_WAIT - Duration::from_millis(1);
        assert!(r.release(false, almost).is_empty());
        assert_eq!(p(r.release(false, t0 + REORDER_WAIT)), vec![b("0.2")]);
        // The skipped object, arriving now, is late.
        assert!(r
            .object(0, Some(0), 1, b("0.1"), t0 + REORDER_WAIT)
            .is_empty());
        assert_eq!(r.late(), 1);
    }

    #[test]
    fn a_full_buffer_releases_without_waiting() {
        let mut r = Reorder::default();
        let now = Instant::now();
        assert_eq!(r.object(0, None, 0, b("x"), now).len(), 1);
        let mut out = Vec::new();
        for o in 2..=(MAX_HELD as u64 + 2) {
            out.extend(r.object(0, None, o, b("y"), now));
        }
        assert!(!out.is_empty(), "more than MAX_HELD objects are not held");
    }
}
