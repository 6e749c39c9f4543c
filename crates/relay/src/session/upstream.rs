//! SUBSCRIBE and FETCH sent towards publishers: the relay's one upstream
//! subscription per track, on behalf of all its downstream subscribers, and
//! its upstream FETCHes for objects it does not hold.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use moqt::data::FetchDecoder;
use moqt::error::{publish_done, request_error, reset};
use moqt::message::{Fetch, FetchKind, Message, RequestUpdate, Subscribe};
use moqt::session::SessionError;
use moqt::{GroupOrder, Parameters, SessionErrorCode};
use quichub_net::io::{write_message, MessageReader};
use tokio::sync::oneshot;

use super::{Role, SessionHandle};
use crate::core::{Refusal, Relay, TrackEntry};
use crate::track::{Track, TrackInfo};
use crate::upstream_fetch::{Outcome, UpstreamFetch};

impl SessionHandle {
    /// Subscribes upstream to `entry`'s track on this (publisher's) session.
    /// Returns once SUBSCRIBE_OK arrives; a task then watches for PUBLISH_DONE
    /// and for the relay cancelling the subscription.
    pub(super) async fn open_upstream(
        self: &Arc<Self>,
        relay: &Arc<Relay>,
        entry: Arc<TrackEntry>,
    ) -> Result<(), Refusal> {
        let internal = |e: String| Refusal::new(request_error::INTERNAL_ERROR, e);
        let (mut send, recv) = self
            .session
            .open_bi()
            .await
            .map_err(|e| internal(e.to_string()))?;
        let request_id = self.next_request_id();
        let new_group = entry.track.take_new_group_for_subscribe();
        let msg = Message::Subscribe(Subscribe {
            request_id,
            track: entry.track.name.clone(),
            params: Parameters {
                new_group_request: new_group,
                ..Parameters::default()
            },
        });
        write_message(&mut send, &msg)
            .await
            .map_err(|e| internal(e.to_string()))?;
        let mut reader = self.reader(recv, &[]);
        let timeout = Duration::from_millis(relay.config.upstream_timeout_ms);
        let first = tokio::time::timeout(timeout, reader.next())
            .await
            .map_err(|_| Refusal::new(request_error::TIMEOUT, "upstream did not answer"))?;
        let ok = match first {
            Ok(Message::SubscribeOk(ok)) if !crate::track::properties_fit(&ok.properties) => {
                let _ = send.reset(reset::INTERNAL_ERROR);
                reader.stop(reset::INTERNAL_ERROR);
                return Err(Refusal::new(
                    request_error::NOT_SUPPORTED,
                    "track properties too large",
                ));
            }
            Ok(Message::SubscribeOk(ok)) => ok,
            Ok(Message::RequestError(e)) => {
                return Err(Refusal::new(e.code, String::from_utf8_lossy(&e.reason)));
            }
            Ok(other) => {
                self.fail(
                    relay,
                    &SessionError::protocol(format!("{} in reply to SUBSCRIBE", other.name())),
                );
                return Err(internal("upstream protocol violation".into()));
            }
            Err(e) => return Err(internal(format!("upstream: {e}"))),
        };
        let track = entry.track.clone();
        let Ok(early) = self
            .aliases
            .insert(ok.track_alias, track.clone(), |t| !t.is_ended())
        else {
            {
                self.fail(
                    relay,
                    &SessionError {
                        code: SessionErrorCode::DuplicateTrackAlias,
                        reason: "track alias in use".into(),
                    },
                );
                return Err(internal("duplicate track alias upstream".into()));
            }
        };
        self.deliver_early(relay, early);
        track.set_publisher_session(self.id);
        track.set_info(
            TrackInfo::from_properties(ok.properties),
            ok.params.largest_object,
        );
        if let Some(v) = new_group {
            track.new_group_sent_upstream(v);
        }
        // Subscribed before the track is ready, so no request is missed.
        let mut new_groups = track.new_group_requests();
        entry.ready.send_replace(Some(Ok(())));
        let me = self.clone();
        let relay = relay.clone();
        tokio::spawn(async move {
            let (status, streams) = loop {
                tokio::select! {
                    m = reader.next() => match m {
                        Ok(Message::PublishDone(d)) => break (d.status, Some(d.stream_count)),
                        Ok(Message::GoAway(_)) => break (publish_done::GOING_AWAY, None),
                        // The answers to our REQUEST_UPDATEs (NEW_GROUP_REQUEST).
                        Ok(Message::RequestOk(_)) | Ok(Message::RequestError(_)) => {}
                        _ => break (publish_done::TRACK_ENDED, None),
                    },
                    _ = entry.cancel.notified() => {
                        let _ = send.reset(reset::CANCELLED);
                        reader.stop(reset::CANCELLED);
                        break (publish_done::TRACK_ENDED, None);
                    }
                    _ = me.session.closed() => break (publish_done::TRACK_ENDED, None),
                    Ok(()) = new_groups.changed() => {
                        let value = *new_groups.borrow_and_update();
                        let update = Message::RequestUpdate(RequestUpdate {
                            request_id: me.next_request_id(),
                            params: Parameters {
                                new_group_request: value,
                                ..Parameters::default()
                            },
                        });
                        if write_message(&mut send, &update).await.is_err() {
                            break (publish_done::TRACK_ENDED, None);
                        }
                    }
                }
            };
            if let Some(n) = streams {
                settle(&relay, &entry.track, n).await;
            }
            me.aliases
                .remove_if(ok.track_alias, |t| Arc::ptr_eq(t, &entry.track));
            // Our session to another relay died or was closed (that relay
            // left the cluster): the track goes on from whichever relay
            // holds its namespace now, if one does in time; its subscribers
            // see a gap, not an end.
            let lost = me.role == Role::Client && me.session.close_reason().is_some();
            if lost && relay.reattach(&entry, me.id).await {
                return;
            }
            relay.drop_entry(&entry);
            entry.track.end(status);
        });
        Ok(())
    }
}

/// Takes a FETCH's Request ID out of the session's waiting list when the
/// FETCH is over, whether or not its stream came.
struct AwaitingStream<'a> {
    h: &'a SessionHandle,
    request_id: u64,
}

impl Drop for AwaitingStream<'_> {
    fn drop(&mut self) {
        self.h
            .fetch_streams
            .lock()
            .expect("fetch streams")
            .remove(&self.request_id);
    }
}

impl SessionHandle {
    /// Sends `fetch`'s FETCH on this session and feeds the response into it
    /// until the response ends; then [`UpstreamFetch::finish`]es it.
    pub(super) async fn open_fetch(
        self: &Arc<Self>,
        relay: &Arc<Relay>,
        fetch: &Arc<UpstreamFetch>,
    ) {
        let outcome = self.run_fetch(relay, fetch).await;
        fetch.finish(outcome);
    }

    async fn run_fetch(
        self: &Arc<Self>,
        relay: &Arc<Relay>,
        fetch: &Arc<UpstreamFetch>,
    ) -> Outcome {
        let refused = |code, e: String| Outcome::Refused(Refusal::new(code, e));
        let timeout = Duration::from_millis(relay.config.upstream_timeout_ms);
        // A peer that grants no stream does not hold the FETCH forever.
        let (mut send, recv) = match tokio::time::timeout(timeout, self.session.open_bi()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return refused(request_error::INTERNAL_ERROR, e.to_string()),
            Err(_) => return refused(request_error::TIMEOUT, "no stream for the FETCH".into()),
        };
        let request_id = self.next_request_id();
        let (tx, rx) = oneshot::channel();
        self.fetch_streams
            .lock()
            .expect("fetch streams")
            .insert(request_id, tx);
        let _awaiting = AwaitingStream {
            h: self,
            request_id,
        };
        let key = &fetch.key;
        let msg = Message::Fetch(Fetch {
            request_id,
            kind: FetchKind::Standalone {
                track: key.track.clone(),
                start: key.start,
                end: key.end,
            },
            params: Parameters {
                group_order: key.descending.then_some(GroupOrder::Descending),
                // An upstream relay that must fetch further answers within
                // half our wait, with what it could not get marked unknown,
                // rather than after it. moq-net 0.1 (never a relay) fails
                // its whole session on a parameter it does not know.
                fill_timeout: self
                    .dialect()
                    .reads_fill_timeout()
                    .then_some(relay.config.upstream_timeout_ms / 2),
                ..Parameters::default()
            },
        });
        match tokio::time::timeout(timeout, write_message(&mut send, &msg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return refused(request_error::INTERNAL_ERROR, e.to_string()),
            Err(_) => return refused(request_error::TIMEOUT, "FETCH not sent".into()),
        }
        let mut reader = self.reader(recv, &[]);
        let cancel = |send: &mut quichub_net::SendStream, reader: &mut MessageReader| {
            let _ = send.reset(reset::CANCELLED);
            reader.stop(reset::CANCELLED);
        };
        match tokio::time::timeout(timeout, reader.next()).await {
            Err(_) => {
                cancel(&mut send, &mut reader);
                return refused(request_error::TIMEOUT, "upstream did not answer".into());
            }
            Ok(Ok(Message::FetchOk(ok))) if !crate::track::properties_fit(&ok.properties) => {
                cancel(&mut send, &mut reader);
                return refused(
                    request_error::NOT_SUPPORTED,
                    "track properties too large".into(),
                );
            }
            Ok(Ok(Message::FetchOk(ok))) => fetch.accept(ok),
            Ok(Ok(Message::RequestError(e))) => {
                return refused(e.code, String::from_utf8_lossy(&e.reason).into_owned());
            }
            Ok(Ok(other)) => {
                self.fail(
                    relay,
                    &SessionError::protocol(format!("{} in reply to FETCH", other.name())),
                );
                return refused(
                    request_error::INTERNAL_ERROR,
                    "upstream protocol violation".into(),
                );
            }
            Ok(Err(e)) => return refused(request_error::INTERNAL_ERROR, format!("upstream: {e}")),
        }
        let (mut stream, first) = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(s)) => s,
            _ => {
                cancel(&mut send, &mut reader);
                return Outcome::Broken("upstream opened no FETCH stream".into());
            }
        };
        let mut decoder = FetchDecoder::new(key.descending, relay.config.max_object_size);
        decoder.push(first);
        loop {
            loop {
                match decoder.next_entry() {
                    Ok(Some(e)) => {
                        if !fetch.push(e) {
                            let _ = stream.stop(reset::EXCESSIVE_LOAD);
                            cancel(&mut send, &mut reader);
                            return Outcome::Broken("response passes the cache limits".into());
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let reason = format!("upstream FETCH stream: {e}");
                        self.fail(relay, &SessionError::from(e));
                        return Outcome::Broken(reason);
                    }
                }
            }
            if decoder.is_done() {
                let _ = send.finish();
                return Outcome::Complete;
            }
            if fetch.unread() {
                // Every downstream FETCH that wanted it is over.
                let _ = stream.stop(reset::CANCELLED);
                cancel(&mut send, &mut reader);
                return Outcome::Broken("no FETCH reads it any more".into());
            }
            match tokio::time::timeout(timeout, stream.read_chunk(64 * 1024)).await {
                Ok(Ok(Some(c))) => decoder.push(c),
                Ok(Ok(None)) => decoder.finish(),
                Ok(Err(e)) => return Outcome::Broken(format!("upstream FETCH stream: {e}")),
                Err(_) => {
                    let _ = stream.stop(reset::CANCELLED);
                    cancel(&mut send, &mut reader);
                    return Outcome::Broken("upstream FETCH stream stalled".into());
                }
            }
        }
    }
}

/// How long PUBLISH_DONE waits for the data streams its Stream Count
/// announces: objects still in flight when it overtakes them are delivered,
/// and a publisher that counts wrong delays the end by this much at most.
const PUBLISH_DONE_GRACE: Duration = Duration::from_secs(2);

/// Waits until the upstream's data streams named by PUBLISH_DONE's Stream
/// Count have arrived and been read, or [`PUBLISH_DONE_GRACE`] passed.
pub(super) async fn settle(relay: &Relay, track: &Track, stream_count: u64) {
    if !track
        .upstream_settled(stream_count, PUBLISH_DONE_GRACE)
        .await
    {
        relay
            .metrics
            .publish_done_streams_missing
            .fetch_add(1, Relaxed);
    }
}
