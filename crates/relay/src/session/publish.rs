//! PUBLISH from peers (tracks pushed to the relay) and PUBLISH from the relay
//! towards SUBSCRIBE_TRACKS subscribers.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use moqt::error::{publish_done, request_error};
use moqt::message::{Message, Publish, RequestOk};
use moqt::session::SessionError;
use moqt::{Parameters, SessionErrorCode};
use quichub_net::io::{write_message, MessageReader, ReadError};
use quichub_net::SendStream;

use super::subscribe::serve_subscription;
use super::upstream::settle;
use super::{reply_error, reserved_namespace, RequestSlot, Result, SessionHandle};
use crate::access::Operation;
use crate::core::{Relay, TrackEntry};
use crate::track::TrackInfo;

/// Sends PUBLISH for a track to a SUBSCRIBE_TRACKS subscriber and, once it
/// accepts, delivers the track like a subscription. `tokens`: the
/// SUBSCRIBE_TRACKS request's AUTHORIZATION_TOKEN values; the track is not
/// pushed if they and the session no longer allow reading it (a reload of
/// the auth since the request was authorised).
pub(super) fn spawn_publish_downstream(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    entry: Arc<TrackEntry>,
    forward: bool,
    tokens: Arc<[Bytes]>,
) {
    let allowed = h.access().still_allows(&Operation::Subscribe {
        track: &entry.track.name,
        tokens: &tokens,
    });
    if !allowed {
        return;
    }
    let (relay, h) = (relay.clone(), h.clone());
    tokio::spawn(async move {
        entry.subscribers.fetch_add(1, Relaxed);
        let outcome = async {
            let (mut send, recv) = h.session.open_bi().await.ok()?;
            let joined = entry.track.join(&h.session);
            let request_id = h.next_request_id();
            let publish = Message::Publish(Publish {
                request_id,
                track: entry.track.name.clone(),
                track_alias: entry.track.id,
                params: Parameters {
                    largest_object: joined.largest,
                    forward: (!forward).then_some(false),
                    ..Default::default()
                },
                properties: joined.info.properties.clone(),
            });
            write_message(&mut send, &publish).await.ok()?;
            let mut reader = h.reader(recv, &[]);
            let params = match reader.next().await {
                Ok(Message::PublishOk(ok)) | Ok(Message::RequestOk(ok)) => ok.params,
                _ => return None,
            };
            let _ = serve_subscription(
                &relay,
                &h,
                &mut send,
                None,
                &entry,
                request_id,
                &params,
                &tokens,
                Some(joined),
            )
            .await;
            Some(())
        }
        .await;
        let _ = outcome;
        relay.release_track(&entry);
    });
}

pub(super) async fn on_publish(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: Publish,
) -> Result<()> {
    if reserved_namespace(&m.track.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::UNAUTHORIZED,
            "reserved namespace",
        )
        .await;
        return Ok(());
    }
    if !crate::track::properties_fit(&m.properties) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::NOT_SUPPORTED,
            "track properties too large",
        )
        .await;
        return Ok(());
    }
    let track = Arc::new(relay.new_track(m.track.clone()));
    track.set_publisher_session(h.id);
    track.set_info(
        TrackInfo::from_properties(m.properties.clone()),
        m.params.largest_object,
    );
    let Ok(early) = h
        .aliases
        .insert(m.track_alias, track.clone(), |t| !t.is_ended())
    else {
        return Err(SessionError {
            code: SessionErrorCode::DuplicateTrackAlias,
            reason: "track alias in use".into(),
        });
    };
    h.deliver_early(relay, early);
    let mine = track.clone();
    let forget = move |t: &Arc<crate::track::Track>| Arc::ptr_eq(t, &mine);
    let entry = match relay.publish_track(track) {
        Ok(e) => e,
        Err(r) => {
            h.aliases.remove_if(m.track_alias, forget);
            reply_error(&mut send, Some(slot), r.code, &r.reason).await;
            return Ok(());
        }
    };
    // NEW_GROUP_REQUESTs of this track's subscribers go to its publisher by
    // REQUEST_UPDATE on this stream ([`Track::request_new_group`]).
    let mut new_groups = entry.track.new_group_requests();
    let ok = Message::PublishOk(RequestOk::default());
    let _ = write_message(&mut send, &ok).await;
    let (status, result) = loop {
        let next = tokio::select! {
            m = reader.next() => m,
            Ok(()) = new_groups.changed() => {
                let update = Message::RequestUpdate(moqt::message::RequestUpdate {
                    request_id: h.next_request_id(),
                    params: Parameters {
                        new_group_request: *new_groups.borrow_and_update(),
                        ..Default::default()
                    },
                });
                let _ = write_message(&mut send, &update).await;
                continue;
            }
        };
        match next {
            Ok(Message::PublishDone(d)) => {
                settle(relay, &entry.track, d.stream_count).await;
                break (d.status, Ok(()));
            }
            // Answers to PUBLISH_OK's and our REQUEST_UPDATEs' parameters.
            Ok(Message::RequestOk(_)) | Ok(Message::RequestError(_)) => continue,
            Ok(other) => {
                break (
                    publish_done::INTERNAL_ERROR,
                    Err(SessionError::protocol(format!(
                        "{} on PUBLISH stream",
                        other.name()
                    ))),
                )
            }
            Err(ReadError::Decode(e)) => break (publish_done::INTERNAL_ERROR, Err(e.into())),
            Err(_) => break (publish_done::TRACK_ENDED, Ok(())),
        }
    };
    relay.unpublish_track(&entry, status);
    h.aliases.remove_if(m.track_alias, forget);
    let _ = send.finish();
    result
}
