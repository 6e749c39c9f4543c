//! SUBSCRIBE sent towards publishers: the relay's one upstream subscription
//! per track, on behalf of all its downstream subscribers.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use moqt::error::{publish_done, request_error, reset};
use moqt::message::{Message, Subscribe};
use moqt::session::SessionError;
use moqt::{Parameters, SessionErrorCode};
use quichub_net::io::{write_message, MessageReader};

use super::{Role, SessionHandle};
use crate::core::{Refusal, Relay, TrackEntry};
use crate::track::{Track, TrackInfo};

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
        let msg = Message::Subscribe(Subscribe {
            request_id,
            track: entry.track.name.clone(),
            params: Parameters::default(),
        });
        write_message(&mut send, &msg)
            .await
            .map_err(|e| internal(e.to_string()))?;
        let mut reader = MessageReader::new(recv, &[]);
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
        {
            let mut aliases = self.aliases.lock().expect("aliases");
            if aliases.get(&ok.track_alias).is_some_and(|t| !t.is_ended()) {
                drop(aliases);
                self.fail(
                    relay,
                    &SessionError {
                        code: SessionErrorCode::DuplicateTrackAlias,
                        reason: "track alias in use".into(),
                    },
                );
                return Err(internal("duplicate track alias upstream".into()));
            }
            aliases.insert(ok.track_alias, track.clone());
        }
        self.alias_added.notify_waiters();
        self.replay_early(relay, ok.track_alias);
        track.set_publisher_session(self.id);
        track.set_info(
            TrackInfo::from_properties(ok.properties),
            ok.params.largest_object,
        );
        entry.ready.send_replace(Some(Ok(())));
        let me = self.clone();
        let relay = relay.clone();
        tokio::spawn(async move {
            let (status, streams) = tokio::select! {
                m = reader.next() => match m {
                    Ok(Message::PublishDone(d)) => (d.status, Some(d.stream_count)),
                    Ok(Message::GoAway(_)) => (publish_done::GOING_AWAY, None),
                    _ => (publish_done::TRACK_ENDED, None),
                },
                _ = entry.cancel.notified() => {
                    let _ = send.reset(reset::CANCELLED);
                    reader.stop(reset::CANCELLED);
                    (publish_done::TRACK_ENDED, None)
                }
                _ = me.session.closed() => (publish_done::TRACK_ENDED, None),
            };
            if let Some(n) = streams {
                settle(&relay, &entry.track, n).await;
            }
            me.aliases.lock().expect("aliases").remove(&ok.track_alias);
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
