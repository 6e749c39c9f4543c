//! FETCH, standalone and joining: from the track's cache, and from upstream
//! for what the cache does not hold (draft-18 §9.16).
//!
//! A track's cache is complete from some group on ([`Track::complete_from`]):
//! groups before it were published before the relay subscribed, or left the
//! cache. A FETCH reaching below that group asks the track's upstream for
//! that part (one upstream FETCH for equal requests, [`crate::upstream_fetch`])
//! and serves the rest from the cache. What the upstream cannot give within
//! the fill timeout (FILL_TIMEOUT, at most `upstream_timeout_ms`) is reported
//! as an End of Unknown Range, and what is cached still follows.
//!
//! The draft says a failed upstream FETCH gives the downstream FETCH a
//! REQUEST_ERROR (§9.16). For a track the relay holds, an upstream that
//! refuses (a publisher that does not serve FETCH) is treated like one that
//! does not answer in time instead: the subscriber gets what the relay has,
//! with the rest marked unknown, rather than nothing. A FETCH for a track
//! the relay does not hold goes upstream whole, and its refusal is passed on.
//!
//! [`Track::complete_from`]: crate::track::Track::complete_from

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use moqt::data::{FetchEntry, FetchObject, FetchState, ObjectStatus};
use moqt::error::{request_error, reset};
use moqt::message::{FetchKind, FetchOk, Message};
use moqt::session::SessionError;
use moqt::{Location, Parameters};
use quichub_net::io::write_message;
use quichub_net::SendStream;
use tokio::time::Instant;

use super::{reply_error, RequestSlot, Result, SessionHandle};
use crate::core::{Relay, TrackEntry};
use crate::object::Object;
use crate::upstream_fetch::{last_of, wire_end, FetchKey, Next, Outcome, UpstreamFetch};

/// The Object ID an End of Range names for "up to the end of the group"
/// (the largest a vi64 holds; [`wire_end`] turns it into "whole group").
const LAST_OBJECT: u64 = u64::MAX;

/// The location just before `l`, if any.
fn before(l: Location) -> Option<Location> {
    if l.object > 0 {
        Some(Location::new(l.group, l.object - 1))
    } else if l.group > 0 {
        Some(Location::new(l.group - 1, LAST_OBJECT))
    } else {
        None
    }
}

/// How long this FETCH may wait for upstream: FILL_TIMEOUT, at most the
/// relay's upstream timeout (which is also the default).
fn fill_budget(relay: &Relay, params: &Parameters) -> Duration {
    let max = relay.config.upstream_timeout_ms;
    Duration::from_millis(params.fill_timeout.map_or(max, |t| t.min(max)))
}

pub(super) async fn on_fetch(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    m: moqt::message::Fetch,
) -> Result<()> {
    let descending = m.params.group_order == Some(moqt::GroupOrder::Descending);
    let budget = fill_budget(relay, &m.params);
    let (entry, start, end) = match &m.kind {
        FetchKind::Standalone { track, start, end } => {
            if end < start && end.object != 0 || end.group < start.group {
                return Err(SessionError::protocol("FETCH end before start"));
            }
            let Some(entry) = relay.find_track(track) else {
                let key = FetchKey {
                    track: track.clone(),
                    start: *start,
                    end: *end,
                    descending,
                };
                return forward(relay, slot, h, send, m.request_id, key).await;
            };
            (entry, *start, last_of(*end))
        }
        FetchKind::RelativeJoining {
            joining_request_id,
            joining_start,
        }
        | FetchKind::AbsoluteJoining {
            joining_request_id,
            joining_start,
        } => {
            let info = {
                let subs = h.subscriptions.lock().expect("subs");
                subs.get(joining_request_id)
                    .map(|s| (s.entry.clone(), s.joining, s.forward))
            };
            let Some((entry, joining, forward)) = info else {
                reply_error(
                    &mut send,
                    Some(slot),
                    request_error::INVALID_JOINING_REQUEST_ID,
                    "no such subscription",
                )
                .await;
                return Ok(());
            };
            let Some(j) = joining.filter(|_| forward) else {
                reply_error(
                    &mut send,
                    Some(slot),
                    request_error::INVALID_RANGE,
                    "nothing published before the subscription",
                )
                .await;
                return Ok(());
            };
            let start_group = match m.kind {
                FetchKind::RelativeJoining { .. } => j.group.saturating_sub(*joining_start),
                _ => *joining_start,
            };
            (entry, Location::new(start_group, 0), j)
        }
    };
    let Some(largest) = entry.track.largest() else {
        reply_error(
            &mut send,
            Some(slot),
            request_error::INVALID_RANGE,
            "no objects published",
        )
        .await;
        return Ok(());
    };
    if start > largest || end < start {
        reply_error(
            &mut send,
            Some(slot),
            request_error::INVALID_RANGE,
            "range starts after the largest object",
        )
        .await;
        return Ok(());
    }
    let end = end.min(largest);
    let deadline = Instant::now() + budget;
    // The part below the complete cache, if the FETCH reaches there.
    let split = Location::new(entry.track.complete_from(), 0);
    let low_last = if start < split {
        before(split).map(|b| b.min(end))
    } else {
        None
    };
    // The cached part is taken now, before any wait for upstream, so what
    // leaves the cache meanwhile is still served.
    let high_start = start.max(split);
    let high = if end >= high_start {
        entry.track.cached_range(high_start, end, descending)
    } else {
        Vec::new()
    };
    let upstream = match low_last {
        Some(last) if !budget.is_zero() && !entry.track.fetch_refused_lately() => {
            upstream_part(relay, h, &entry, start, last, descending, deadline).await
        }
        _ => None,
    };
    let ok = Message::FetchOk(FetchOk {
        end_of_track: false,
        end_location: wire_end(end),
        params: Parameters::default(),
        properties: entry.track.info().properties,
    });
    if write_message(&mut send, &ok).await.is_err() {
        return Ok(());
    }
    let Some(mut out) = Response::open(relay, h, m.request_id, descending).await else {
        return Ok(());
    };
    let low = Low {
        entry: &entry,
        upstream: upstream.as_deref(),
        start,
        last: low_last,
        descending,
        deadline,
    };
    let done = if descending {
        match out.cached(&high).await {
            Ok(()) => out.low(low).await,
            e => e,
        }
    } else {
        match out.low(low).await {
            Ok(()) => out.cached(&high).await,
            e => e,
        }
    };
    if done.is_ok() {
        out.finish().await;
    }
    let _ = send.finish();
    Ok(())
}

/// Starts (or joins) the upstream FETCH for `[start, last]` of `entry`'s
/// track and waits, until `deadline`, for its FETCH_OK. `None`: no upstream,
/// a refusal, or no answer in time.
async fn upstream_part(
    relay: &Arc<Relay>,
    h: &SessionHandle,
    entry: &TrackEntry,
    start: Location,
    last: Location,
    descending: bool,
    deadline: Instant,
) -> Option<Arc<UpstreamFetch>> {
    let source = relay.fetch_source(&entry.track.name, Some(entry), h.id)?;
    let key = FetchKey {
        track: entry.track.name.clone(),
        start,
        end: wire_end(last),
        descending,
    };
    let fetch = relay.fetch_upstream(key, source);
    match tokio::time::timeout_at(deadline, fetch.ok()).await {
        Ok(Ok(_)) => Some(fetch),
        // A publisher that does not serve FETCH, or did not answer within
        // the relay's own upstream timeout: the next FETCHes of the track do
        // not wait for it again for a while. (This FETCH's own deadline
        // passing says nothing about the upstream.)
        Ok(Err(_)) => {
            entry.track.note_fetch_refused();
            None
        }
        Err(_) => None,
    }
}

/// A FETCH for a track the relay does not hold: asked upstream whole, from
/// the publisher of its namespace, and passed on as it arrives.
async fn forward(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    request_id: u64,
    key: FetchKey,
) -> Result<()> {
    let Some(source) = relay.fetch_source(&key.track, None, h.id) else {
        reply_error(
            &mut send,
            Some(slot),
            request_error::DOES_NOT_EXIST,
            "track not at this relay",
        )
        .await;
        return Ok(());
    };
    let fetch = relay.fetch_upstream(key, source);
    let timeout = Duration::from_millis(relay.config.upstream_timeout_ms);
    let ok = match tokio::time::timeout(timeout, fetch.ok()).await {
        Ok(Ok(ok)) => ok,
        Ok(Err(r)) => {
            reply_error(&mut send, Some(slot), r.code, &r.reason).await;
            return Ok(());
        }
        Err(_) => {
            reply_error(
                &mut send,
                Some(slot),
                request_error::TIMEOUT,
                "upstream did not answer",
            )
            .await;
            return Ok(());
        }
    };
    let ok = Message::FetchOk(FetchOk {
        params: Parameters::default(),
        ..ok
    });
    if write_message(&mut send, &ok).await.is_err() {
        return Ok(());
    }
    let Some(mut out) = Response::open(relay, h, request_id, fetch.key.descending).await else {
        return Ok(());
    };
    let mut i = 0;
    loop {
        match fetch.next(i).await {
            Next::Entry(e) => {
                if out.entry(&e).await.is_err() {
                    return Ok(());
                }
                i += 1;
            }
            Next::End(Outcome::Complete) => break,
            Next::End(_) => {
                // FETCH_OK is out; all that is left to say is that the
                // response is incomplete.
                out.reset(reset::INTERNAL_ERROR);
                return Ok(());
            }
        }
    }
    out.finish().await;
    let _ = send.finish();
    Ok(())
}

/// The part of a FETCH below the track's complete cache.
struct Low<'a> {
    entry: &'a TrackEntry,
    /// Its upstream FETCH, answered.
    upstream: Option<&'a UpstreamFetch>,
    start: Location,
    /// Its last location; `None`: the FETCH has no such part.
    last: Option<Location>,
    descending: bool,
    deadline: Instant,
}

/// The stream being written was reset or stopped: the FETCH is over.
struct Gone;

/// A FETCH response stream being written.
struct Response {
    relay: Arc<Relay>,
    data: quichub_net::SendStream,
    buf: BytesMut,
    state: FetchState,
}

impl Response {
    /// Opens the data stream and queues its FETCH_HEADER.
    async fn open(
        relay: &Arc<Relay>,
        h: &SessionHandle,
        request_id: u64,
        descending: bool,
    ) -> Option<Self> {
        let data = h.session.open_uni().await.ok()?;
        let mut buf = BytesMut::new();
        moqt::data::encode_fetch_header(&mut buf, request_id);
        Some(Self {
            relay: relay.clone(),
            data,
            buf,
            state: FetchState::new(descending),
        })
    }

    fn reset(&mut self, code: u32) {
        let _ = self.data.reset(code);
    }

    /// Writes an object or passes on a marker. An object that cannot follow
    /// the previous entry resets the stream; an End of Range that cannot
    /// (one in the group of the previous entry: the encoding always moves
    /// to another group) is left out.
    async fn entry(&mut self, e: &FetchEntry) -> std::result::Result<(), Gone> {
        if self.state.try_encode_header(&mut self.buf, e).is_err() {
            if let FetchEntry::Object(_) = e {
                self.reset(reset::INTERNAL_ERROR);
                return Err(Gone);
            }
            return Ok(());
        }
        if matches!(e, FetchEntry::EndOfUnknownRange(_)) {
            self.relay
                .metrics
                .fetch_unknown_ranges
                .fetch_add(1, Relaxed);
        }
        let FetchEntry::Object(o) = e else {
            return Ok(());
        };
        // The header goes first; the payload follows as its own shared chunk.
        let header = self.buf.split().freeze();
        self.write(header).await?;
        if !o.payload.is_empty() {
            self.write(o.payload.clone()).await?;
        }
        self.relay.metrics.objects_out.fetch_add(1, Relaxed);
        self.relay
            .metrics
            .bytes_out
            .fetch_add(o.payload.len() as u64, Relaxed);
        Ok(())
    }

    /// The part below the complete cache: from upstream, or what the cache
    /// has of it.
    async fn low(&mut self, p: Low<'_>) -> std::result::Result<(), Gone> {
        let Some(last) = p.last else {
            return Ok(());
        };
        match p.upstream {
            Some(f) => {
                self.relay_upstream(f, p.start, last, p.descending, p.deadline)
                    .await
            }
            None => {
                let cached = p.entry.track.cached_range(p.start, last, p.descending);
                self.cached_with_gaps(&cached, p.start, last, p.descending)
                    .await
            }
        }
    }

    /// Writes a chunk; a subscriber that does not read for `write_stall_ms`
    /// loses the FETCH (it would otherwise pin what the response holds).
    async fn write(&mut self, chunk: bytes::Bytes) -> std::result::Result<(), Gone> {
        let stall = Duration::from_millis(self.relay.config.write_stall_ms);
        match tokio::time::timeout(stall, self.data.write_chunk(chunk)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Gone),
            Err(_) => {
                self.reset(reset::TOO_FAR_BEHIND);
                Err(Gone)
            }
        }
    }

    /// Objects from the cache, in order.
    async fn cached(&mut self, objects: &[Arc<Object>]) -> std::result::Result<(), Gone> {
        for o in objects.iter().filter(|o| o.status == ObjectStatus::Normal) {
            self.entry(&fetch_object(o)).await?;
        }
        Ok(())
    }

    /// The part `[start, last]` the cache does not hold whole, without an
    /// upstream: what is cached there, with the rest marked unknown.
    async fn cached_with_gaps(
        &mut self,
        objects: &[Arc<Object>],
        start: Location,
        last: Location,
        descending: bool,
    ) -> std::result::Result<(), Gone> {
        if descending {
            self.cached(objects).await?;
            if objects.last().map(|o| o.location()) != Some(start) {
                self.entry(&FetchEntry::EndOfUnknownRange(start)).await?;
            }
        } else {
            let first = objects.first().map(|o| o.location());
            if first != Some(start) {
                let to = first.and_then(before).unwrap_or(last);
                self.entry(&FetchEntry::EndOfUnknownRange(to)).await?;
            }
            self.cached(objects).await?;
        }
        Ok(())
    }

    /// The upstream's response for `[start, last]`, until `deadline`; the
    /// rest, if it ends early or late, is marked unknown.
    async fn relay_upstream(
        &mut self,
        fetch: &UpstreamFetch,
        start: Location,
        last: Location,
        descending: bool,
        deadline: Instant,
    ) -> std::result::Result<(), Gone> {
        let mut i = 0;
        loop {
            let next = tokio::time::timeout_at(deadline, fetch.next(i)).await;
            match next {
                Ok(Next::Entry(e)) => {
                    i += 1;
                    let inside = match &e {
                        FetchEntry::Object(o) => {
                            let l = Location::new(o.group, o.object_id);
                            l >= start && l <= last
                        }
                        FetchEntry::EndOfNonExistentRange(l) | FetchEntry::EndOfUnknownRange(l) => {
                            *l >= start && *l <= last
                        }
                    };
                    if inside {
                        self.entry(&e).await?;
                    }
                }
                Ok(Next::End(Outcome::Complete)) => return Ok(()),
                Ok(Next::End(_)) | Err(_) => {
                    let to = if descending { start } else { last };
                    return self.entry(&FetchEntry::EndOfUnknownRange(to)).await;
                }
            }
        }
    }

    async fn finish(mut self) {
        if !self.buf.is_empty() {
            let _ = self.data.write_chunk(self.buf.split().freeze()).await;
        }
        let _ = self.data.finish();
    }
}

fn fetch_object(o: &Object) -> FetchEntry {
    FetchEntry::Object(FetchObject {
        group: o.group,
        subgroup: o.subgroup,
        object_id: o.object_id,
        priority: o.priority,
        properties: o.properties.clone(),
        payload: o.payload.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_location_before_another() {
        assert_eq!(before(Location::new(3, 2)), Some(Location::new(3, 1)));
        assert_eq!(
            before(Location::new(3, 0)),
            Some(Location::new(2, LAST_OBJECT))
        );
        assert_eq!(before(Location::new(0, 0)), None);
    }

    #[test]
    fn fill_timeout_is_capped_by_the_relays_upstream_timeout() {
        let relay = Relay::new(crate::config::Config {
            upstream_timeout_ms: 1000,
            ..Default::default()
        });
        let p = |t| Parameters {
            fill_timeout: t,
            ..Parameters::default()
        };
        assert_eq!(fill_budget(&relay, &p(None)), Duration::from_secs(1));
        assert_eq!(fill_budget(&relay, &p(Some(0))), Duration::ZERO);
        assert_eq!(
            fill_budget(&relay, &p(Some(250))),
            Duration::from_millis(250)
        );
        assert_eq!(
            fill_budget(&relay, &p(Some(60_000))),
            Duration::from_secs(1)
        );
    }
}
