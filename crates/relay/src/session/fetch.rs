//! FETCH, standalone and joining, answered from the track's cache.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::BytesMut;
use moqt::data::{FetchEntry, FetchObject, FetchState, ObjectStatus};
use moqt::error::{request_error, reset};
use moqt::message::{FetchKind, FetchOk, Message};
use moqt::session::SessionError;
use moqt::{Location, Parameters};
use quichub_net::io::write_message;
use web_transport_quinn::SendStream;

use super::{reply_error, RequestSlot, Result, SessionHandle};
use crate::core::Relay;

pub(super) async fn on_fetch(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    m: moqt::message::Fetch,
) -> Result<()> {
    let descending = m.params.group_order == Some(moqt::GroupOrder::Descending);
    let (entry, start, end) = match &m.kind {
        FetchKind::Standalone { track, start, end } => {
            if end < start && end.object != 0 || end.group < start.group {
                return Err(SessionError::protocol("FETCH end before start"));
            }
            let Some(entry) = relay.find_track(track) else {
                reply_error(
                    &mut send,
                    Some(slot),
                    request_error::DOES_NOT_EXIST,
                    "track not at this relay",
                )
                .await;
                return Ok(());
            };
            // End Location is exclusive (object + 1), object 0 meaning the whole group.
            let end_incl = if end.object == 0 {
                Location::new(end.group, u64::MAX)
            } else {
                Location::new(end.group, end.object - 1)
            };
            (entry, *start, end_incl)
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
    let objects = entry.track.cached_range(start, end, descending);
    let ok = Message::FetchOk(FetchOk {
        end_of_track: false,
        end_location: Location::new(end.group, end.object.saturating_add(1)),
        params: Parameters::default(),
        properties: entry.track.info().properties,
    });
    if write_message(&mut send, &ok).await.is_err() {
        return Ok(());
    }
    let mut data = match h.session.open_uni().await {
        Ok(s) => s,
        Err(_) => return Ok(()),
    };
    let mut buf = BytesMut::new();
    moqt::data::encode_fetch_header(&mut buf, m.request_id);
    let mut state = FetchState::new(descending);
    for o in objects.iter().filter(|o| o.status == ObjectStatus::Normal) {
        let entry = FetchEntry::Object(FetchObject {
            group: o.group,
            subgroup: o.subgroup,
            object_id: o.object_id,
            priority: o.priority,
            properties: o.properties.clone(),
            payload: o.payload.clone(),
        });
        // Cached objects come sorted, so every entry can follow the previous one.
        if state.try_encode_header(&mut buf, &entry).is_err() {
            let _ = data.reset(reset::INTERNAL_ERROR);
            return Ok(());
        }
        // The header goes first; the payload follows as its own shared chunk.
        if data.write_chunk(buf.split().freeze()).await.is_err() {
            return Ok(());
        }
        if !o.payload.is_empty() && data.write_chunk(o.payload.clone()).await.is_err() {
            return Ok(());
        }
        relay.metrics.objects_out.fetch_add(1, Relaxed);
        relay
            .metrics
            .bytes_out
            .fetch_add(o.payload.len() as u64, Relaxed);
    }
    if !buf.is_empty() {
        let _ = data.write_chunk(buf.split().freeze()).await;
    }
    let _ = data.finish();
    let _ = send.finish();
    Ok(())
}
