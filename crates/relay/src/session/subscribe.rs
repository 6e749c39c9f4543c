//! Downstream SUBSCRIBE (with its REQUEST_UPDATEs), the delivery of a track
//! to a subscriber that SUBSCRIBE and PUBLISH towards SUBSCRIBE_TRACKS
//! subscribers share, and TRACK_STATUS.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use moqt::deviation::Deviation;
use moqt::error::{request_error, reset};
use moqt::message::{Message, PublishDone, RequestOk, Subscribe, SubscribeOk};
use moqt::session::SessionError;
use moqt::{Location, Parameters, SubscriptionFilter};
use quichub_net::io::{write_message, MessageReader, ReadError};
use quichub_net::SendStream;
use tokio::sync::{watch, Notify};

use super::{reply_error, RequestSlot, Reservation, Result, SessionHandle, SubInfo};
use crate::access::Operation;
use crate::core::{Relay, TrackEntry};
use crate::forward::{Forwarder, Settings};
use crate::object::Object;
use crate::track::{Track, TrackInfo};

fn settings_from(params: &Parameters, info: &TrackInfo, largest: Option<Location>) -> Settings {
    let filter = params.subscription_filter;
    Settings {
        subscriber_priority: params.subscriber_priority.unwrap_or(128),
        group_order: params.group_order.unwrap_or(info.group_order),
        start: filter.map(|f| f.start(largest)).unwrap_or_default(),
        end_group: filter.and_then(|f| f.end_group()),
        forward: params.forward.unwrap_or(true),
        object_timeout: params
            .object_delivery_timeout
            .or_else(|| track_prop(info, 0x02))
            .map(Duration::from_millis),
        subgroup_timeout: params
            .subgroup_delivery_timeout
            .or_else(|| track_prop(info, 0x06))
            .map(Duration::from_millis),
    }
}

/// For a peer that reads only whole subgroups (moq-net 0.1, whose
/// subscriber drops a subgroup stream that does not start at object 0, and
/// then moq-clock exits), subscribing with the Largest Object filter while
/// a group is under way: that group's cached objects from its first, to be
/// sent before the track's own events (counted). Empty otherwise, or when
/// the cache no longer holds the group's first object. The track must have
/// been joined already ([`Forwarder::replaying`]).
fn whole_group_start(
    h: &SessionHandle,
    track: &Track,
    subscribe: bool,
    params: &Parameters,
    largest: Option<Location>,
) -> Vec<Arc<Object>> {
    let Some(l) = largest else {
        return Vec::new();
    };
    if !subscribe
        || !h.dialect().reads_whole_groups()
        || params.subscription_filter != Some(SubscriptionFilter::LargestObject)
        || !params.forward.unwrap_or(true)
    {
        return Vec::new();
    }
    let head = track.cached_range(Location::new(l.group, 0), l, false);
    if head.first().is_some_and(|o| o.object_id == 0) {
        (h.deviations)(Deviation::CurrentGroupFromStart);
        head
    } else {
        Vec::new()
    }
}

fn track_prop(info: &TrackInfo, kind: u64) -> Option<u64> {
    info.properties.iter().find_map(|kv| match kv.value {
        moqt::KvValue::Int(v) if kv.kind == kind && v > 0 => Some(v),
        _ => None,
    })
}

fn apply_update(s: &mut Settings, p: &Parameters, largest: Option<Location>) {
    if let Some(v) = p.subscriber_priority {
        s.subscriber_priority = v;
    }
    if let Some(v) = p.forward {
        s.forward = v;
    }
    if let Some(f) = p.subscription_filter {
        s.start = f.start(largest);
        s.end_group = f.end_group();
    }
    if let Some(v) = p.object_delivery_timeout {
        s.object_timeout = Some(Duration::from_millis(v));
    }
    if let Some(v) = p.subgroup_delivery_timeout {
        s.subgroup_timeout = Some(Duration::from_millis(v));
    }
}

pub(super) async fn on_subscribe(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: Subscribe,
) -> Result<()> {
    // Reserve the track name for this session at once, so a second SUBSCRIBE
    // that races the first (before its SUBSCRIBE_OK) is still a duplicate.
    let reserved = h
        .subscribed
        .lock()
        .expect("subscribed")
        .insert(m.track.clone());
    let _reservation = reserved.then(|| Reservation {
        set: &h.subscribed,
        name: m.track.clone(),
    });
    if !reserved {
        reply_error(
            &mut send,
            Some(slot),
            request_error::DUPLICATE_SUBSCRIPTION,
            "already subscribed",
        )
        .await;
        return Ok(());
    }
    let rendezvous = Duration::from_millis(
        m.params
            .rendezvous_timeout
            .unwrap_or(0)
            .min(relay.config.max_rendezvous_ms),
    );
    let entry = tokio::select! {
        r = relay.acquire_track(&m.track, rendezvous, &h.session, m.params.new_group_request) => r,
        // The subscriber gave up (stream reset) while we waited.
        _ = reader.next() => return Ok(()),
    };
    let (entry, joined) = match entry {
        Ok(e) => e,
        Err(r) => {
            reply_error(&mut send, Some(slot), r.code, &r.reason).await;
            return Ok(());
        }
    };
    let result = serve_subscription(
        relay,
        h,
        &mut send,
        Some(&mut reader),
        &entry,
        m.request_id,
        &m.params,
        &m.params.authorization_tokens,
        Some(joined),
    )
    .await;
    relay.release_track(&entry);
    result
}

/// Delivers a track to the peer: replies SUBSCRIBE_OK (for a SUBSCRIBE) or
/// expects PUBLISH_OK already handled (for our PUBLISH), runs the forwarder,
/// applies REQUEST_UPDATEs, and ends with PUBLISH_DONE (UNAUTHORIZED when a
/// reload of the auth revoked the right to read the track, which `tokens`,
/// the request's AUTHORIZATION_TOKEN values, are checked again for).
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve_subscription(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    send: &mut SendStream,
    mut reader: Option<&mut MessageReader>,
    entry: &Arc<TrackEntry>,
    request_id: u64,
    params: &Parameters,
    tokens: &[Bytes],
    joined: Option<crate::track::Joined>,
) -> Result<()> {
    let track = entry.track.clone();
    let joined = joined.unwrap_or_else(|| track.join(&h.session));
    // A SUBSCRIBE's filter is relative to the freshest Largest Location (the
    // upstream's LARGEST_OBJECT may have arrived after we joined; objects
    // already queued below it are filtered out). A pushed track's
    // (PUBLISH_OK, no reader here) is relative to the Largest Location its
    // PUBLISH told the subscriber: objects that arrived while PUBLISH_OK was
    // on its way are queued for it and are after what it was told, so they
    // are delivered (a slow subscriber lost them otherwise).
    let largest = match reader {
        Some(_) => track.largest(),
        None => joined.largest,
    };
    let mut settings = settings_from(params, &joined.info, largest);
    let replay = whole_group_start(h, &track, reader.is_some(), params, largest);
    if let Some(first) = replay.first() {
        settings.start = first.location();
    }
    if let (Some(end), Some(l)) = (settings.end_group, largest) {
        if end < l.group {
            reply_error(
                send,
                None,
                request_error::INVALID_RANGE,
                "end group already published",
            )
            .await;
            return Ok(());
        }
    }
    // Registered before SUBSCRIBE_OK goes out: a joining FETCH the peer sends
    // the moment it reads the OK must find the subscription.
    let revoked = Arc::new(Notify::new());
    h.subscriptions.lock().expect("subs").insert(
        request_id,
        SubInfo {
            entry: entry.clone(),
            joining: if settings.forward { largest } else { None },
            forward: settings.forward,
            tokens: tokens.to_vec(),
            revoked: revoked.clone(),
        },
    );
    // A SUBSCRIBE (which comes with a reader for its updates) is answered here;
    // for our own PUBLISH the PUBLISH_OK was the answer.
    // moq-net 0.1 reads a data stream that overtakes SUBSCRIBE_OK under the
    // Request ID its alias names (counted).
    let alias = if h.dialect().aliases_by_request_id() && reader.is_some() {
        (h.deviations)(Deviation::TrackAliasIsRequestId);
        request_id
    } else {
        track.id
    };
    if reader.is_some() {
        let ok = Message::SubscribeOk(SubscribeOk {
            track_alias: alias,
            params: Parameters {
                largest_object: h.largest_for_peer(largest),
                ..Default::default()
            },
            properties: joined.info.properties.clone(),
        });
        if write_message(send, &ok).await.is_err() {
            h.subscriptions.lock().expect("subs").remove(&request_id);
            return Ok(());
        }
    }
    relay.metrics.subscriptions.fetch_add(1, Relaxed);
    let (settings_tx, settings_rx) = watch::channel(settings);
    let forwarder = Forwarder::new(
        h.session.clone(),
        track.clone(),
        settings_rx,
        relay.metrics.clone(),
        relay.config.clone(),
    )
    .revocable(revoked)
    .expiring(h.access().request_expires(&Operation::Subscribe {
        track: &track.name,
        tokens,
    }))
    .replaying(replay)
    .with_alias(alias);
    let mut run = Box::pin(forwarder.run(joined));
    let done = loop {
        let next = async {
            match reader.as_deref_mut() {
                Some(r) => r.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            d = &mut run => break Some(d),

            m = next => match m {
                Ok(Message::RequestUpdate(u)) => {
                    // Delivery waits with it: only a client updating
                    // faster than its rate waits long.
                    h.pace_update(relay).await;
                    if let Err(e) = h.request_ids.lock().expect("ids").accept_peer(u.request_id) {
                        cleanup(relay, h, request_id);
                        return Err(e);
                    }
                    let largest = track.largest();
                    if let Some(v) = u.params.new_group_request {
                        track.request_new_group(v, true);
                    }
                    settings_tx.send_modify(|s| apply_update(s, &u.params, largest));
                    if let Some(info) = h.subscriptions.lock().expect("subs").get_mut(&request_id) {
                        if let Some(f) = u.params.forward {
                            if f && !info.forward {
                                info.joining = largest;
                            }
                            info.forward = f;
                        }
                    }
                    let ok = Message::RequestOk(RequestOk {
                        params: Parameters { largest_object: h.largest_for_peer(largest), ..Default::default() },
                        properties: Vec::new(),
                    });
                    let _ = write_message(send, &ok).await;
                }
                Ok(other) => {
                    cleanup(relay, h, request_id);
                    return Err(SessionError::protocol(format!("{} on a subscription stream", other.name())));
                }
                // FIN, STOP_SENDING or reset from the subscriber: unsubscribe.
                Err(ReadError::Decode(e)) => {
                    cleanup(relay, h, request_id);
                    return Err(e.into());
                }
                Err(_) => break None,
            }
        }
    };
    cleanup(relay, h, request_id);
    match done {
        Some(d) => {
            let m = Message::PublishDone(PublishDone {
                status: d.status,
                stream_count: d.stream_count,
                reason: Bytes::new(),
            });
            let _ = write_message(send, &m).await;
            let _ = send.finish();
        }
        None => {
            drop(run);
            let _ = send.reset(reset::CANCELLED);
        }
    }
    Ok(())
}

fn cleanup(relay: &Relay, h: &SessionHandle, request_id: u64) {
    if h.subscriptions
        .lock()
        .expect("subs")
        .remove(&request_id)
        .is_some()
    {
        relay.metrics.subscriptions.fetch_sub(1, Relaxed);
    }
}

pub(super) async fn on_track_status(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    slot: &RequestSlot<'_>,
    mut send: SendStream,
    m: Subscribe,
) -> Result<()> {
    let (entry, acquired) = match relay.find_track(&m.track) {
        Some(e) => (e, false),
        None => match relay
            .acquire_track(&m.track, Duration::ZERO, &h.session, None)
            .await
        {
            Ok((e, _)) => (e, true),
            Err(r) => {
                reply_error(&mut send, Some(slot), r.code, &r.reason).await;
                return Ok(());
            }
        },
    };
    let ok = Message::RequestOk(RequestOk {
        params: Parameters {
            largest_object: entry.track.largest(),
            ..Default::default()
        },
        properties: entry.track.info().properties,
    });
    let _ = write_message(&mut send, &ok).await;
    let _ = send.finish();
    if acquired {
        relay.release_track(&entry);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use moqt::params::SubscriptionFilter;
    use moqt::{GroupOrder, KeyValue, KvValue};

    use super::*;

    fn int(kind: u64, v: u64) -> KeyValue {
        KeyValue {
            kind,
            value: KvValue::Int(v),
        }
    }

    #[test]
    fn settings_default_to_the_tracks_and_the_drafts() {
        let info = TrackInfo::default();
        let s = settings_from(&Parameters::default(), &info, Some(Location::new(4, 2)));
        assert_eq!(s.subscriber_priority, 128);
        assert_eq!(s.group_order, GroupOrder::Ascending);
        assert_eq!(s.start, Location::default());
        assert_eq!(s.end_group, None);
        assert!(s.forward);
        assert_eq!(s.object_timeout, None);
        assert_eq!(s.subgroup_timeout, None);
    }

    #[test]
    fn settings_take_the_request_then_the_track_properties() {
        // Track: descending, object timeout 500 ms, subgroup timeout 0 (none).
        let info = TrackInfo::from_properties(vec![int(0x22, 2), int(0x02, 500), int(0x06, 0)]);
        let params = Parameters {
            subscriber_priority: Some(7),
            forward: Some(false),
            subscription_filter: Some(SubscriptionFilter::NextGroupStart),
            subgroup_delivery_timeout: Some(900),
            ..Default::default()
        };
        let s = settings_from(&params, &info, Some(Location::new(4, 2)));
        assert_eq!(s.subscriber_priority, 7);
        assert_eq!(s.group_order, GroupOrder::Descending);
        assert_eq!(s.start, Location::new(5, 0));
        assert!(!s.forward);
        assert_eq!(s.object_timeout, Some(Duration::from_millis(500)));
        assert_eq!(s.subgroup_timeout, Some(Duration::from_millis(900)));
        assert_eq!(track_prop(&info, 0x06), None);

        let ranged = Parameters {
            subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
                start: Location::new(2, 1),
                end_group_delta: 3,
            }),
            group_order: Some(GroupOrder::Ascending),
            ..Default::default()
        };
        let s = settings_from(&ranged, &info, None);
        assert_eq!((s.start, s.end_group), (Location::new(2, 1), Some(5)));
        assert_eq!(s.group_order, GroupOrder::Ascending);
    }

    #[test]
    fn an_update_changes_only_what_it_names() {
        let info = TrackInfo::default();
        let mut s = settings_from(&Parameters::default(), &info, None);
        apply_update(
            &mut s,
            &Parameters {
                forward: Some(false),
                object_delivery_timeout: Some(50),
                ..Default::default()
            },
            None,
        );
        assert!(!s.forward);
        assert_eq!(s.object_timeout, Some(Duration::from_millis(50)));
        assert_eq!(s.subscriber_priority, 128);
        apply_update(
            &mut s,
            &Parameters {
                subscriber_priority: Some(1),
                subgroup_delivery_timeout: Some(60),
                subscription_filter: Some(SubscriptionFilter::LargestObject),
                ..Default::default()
            },
            Some(Location::new(9, 3)),
        );
        assert_eq!(s.subscriber_priority, 1);
        assert_eq!(s.start, Location::new(9, 4));
        assert_eq!(s.end_group, None);
        assert_eq!(s.subgroup_timeout, Some(Duration::from_millis(60)));
        assert!(!s.forward, "unchanged");
    }
}
