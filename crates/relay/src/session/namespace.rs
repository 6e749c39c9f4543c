//! Namespace-level requests: PUBLISH_NAMESPACE from publishers,
//! SUBSCRIBE_NAMESPACE and SUBSCRIBE_TRACKS from subscribers.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use moqt::error::{request_error, reset};
use moqt::message::{Message, NamespaceRequest, RequestOk};
use moqt::session::SessionError;
use moqt::TrackNamespace;
use quichub_net::io::{write_message, MessageReader, ReadError};
use quichub_net::SendStream;

use super::publish::spawn_publish_downstream;
use super::{reply_error, reserved_namespace, RequestSlot, Result, Role, SessionHandle};
use crate::access::{Denied, Operation};
use crate::core::{NamespaceEvent, Relay};

pub(super) async fn on_publish_namespace(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: NamespaceRequest,
) -> Result<()> {
    if reserved_namespace(&m.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::UNAUTHORIZED,
            "reserved namespace",
        )
        .await;
        return Ok(());
    }
    // In a registry cluster the first relay to claim a namespace holds it
    // (a publisher here of a namespace published at another relay is
    // refused); our own sessions to other relays claim nothing.
    let claims = (h.role == Role::Server).then(|| relay.claims()).flatten();
    if let Some(c) = &claims {
        if let Err(e) = c.claim(&m.namespace).await {
            slot.release();
            let _ = write_message(&mut send, &Message::RequestError(e)).await;
            let _ = send.finish();
            return Ok(());
        }
    }
    let grant = match relay.publish_namespace(m.namespace.clone(), h.clone()) {
        Ok(g) => g,
        Err(r) => {
            reply_error(&mut send, Some(slot), r.code, &r.reason).await;
            return Ok(());
        }
    };
    let ok = Message::RequestOk(RequestOk::default());
    let _ = write_message(&mut send, &ok).await;
    // The namespace stays published until the publisher cancels the stream.
    let result = loop {
        match reader.next().await {
            Ok(Message::RequestUpdate(u)) => {
                h.pace_update(relay).await;
                if let Err(e) = ack_update(h, &mut send, &u).await {
                    break Err(e);
                }
            }
            Ok(other) => {
                break Err(SessionError::protocol(format!(
                    "{} on PUBLISH_NAMESPACE stream",
                    other.name()
                )))
            }
            Err(ReadError::Decode(e)) => break Err(e.into()),
            Err(_) => break Ok(()),
        }
    };
    // Released only when no other session here took it over meanwhile.
    if relay.unpublish_namespace(&m.namespace, h.id, Some(grant)) {
        if let Some(c) = &claims {
            c.release(&m.namespace);
        }
    }
    let _ = send.finish();
    result
}

/// A REQUEST_UPDATE on a namespace-level request: its Request ID is checked
/// and it is acknowledged (the relay keeps no per-request state to change).
async fn ack_update(
    h: &SessionHandle,
    send: &mut SendStream,
    u: &moqt::message::RequestUpdate,
) -> Result<()> {
    h.request_ids
        .lock()
        .expect("ids")
        .accept_peer(u.request_id)?;
    let _ = write_message(send, &Message::RequestOk(RequestOk::default())).await;
    Ok(())
}

fn overlap_check(
    map: &Mutex<HashMap<u64, TrackNamespace>>,
    id: u64,
    prefix: &TrackNamespace,
) -> bool {
    let mut m = map.lock().expect("prefixes");
    if m.values().any(|p| p.overlaps(prefix)) {
        return false;
    }
    m.insert(id, prefix.clone());
    true
}

/// Moves request `id`'s prefix to `prefix` unless it would overlap another
/// request's of the same type in the session (draft-18, "Updating Namespace Subscriptions").
fn overlap_update(
    map: &Mutex<HashMap<u64, TrackNamespace>>,
    id: u64,
    prefix: &TrackNamespace,
) -> bool {
    let mut m = map.lock().expect("prefixes");
    if m.iter().any(|(k, p)| *k != id && p.overlaps(prefix)) {
        return false;
    }
    m.insert(id, prefix.clone());
    true
}

/// What a REQUEST_UPDATE's new TRACK_NAMESPACE_PREFIX leads to.
enum PrefixUpdate {
    /// None asked for; the update was acknowledged.
    Same,
    /// Acknowledged: follow this prefix from now on.
    Moved(TrackNamespace),
    /// Refused with REQUEST_ERROR, which ends the request.
    Refused,
}

/// Checks and acknowledges a REQUEST_UPDATE on a SUBSCRIBE_NAMESPACE or
/// SUBSCRIBE_TRACKS (`tracks`): a new prefix is a new request for what it
/// names, so it is authorised like one and must not overlap the session's other
/// requests of the type (`prefixes`); a refusal ends the request (it
/// announced the old prefix only).
async fn update_prefix(
    h: &SessionHandle,
    send: &mut SendStream,
    u: moqt::message::RequestUpdate,
    prefixes: &Mutex<HashMap<u64, TrackNamespace>>,
    request_id: u64,
    tracks: bool,
) -> Result<PrefixUpdate> {
    let Some(p) = u.params.track_namespace_prefix.clone() else {
        ack_update(h, send, &u).await?;
        return Ok(PrefixUpdate::Same);
    };
    let tokens = &u.params.authorization_tokens;
    let op = if tracks {
        Operation::SubscribeTracks { prefix: &p, tokens }
    } else {
        Operation::SubscribeNamespace { prefix: &p, tokens }
    };
    match h.access().authorize(&op) {
        Ok(()) => {}
        Err(Denied::Request(r)) => {
            h.request_ids
                .lock()
                .expect("ids")
                .accept_peer(u.request_id)?;
            reply_error(send, None, r.code, &r.reason).await;
            return Ok(PrefixUpdate::Refused);
        }
        Err(Denied::Session(e)) => return Err(e),
    }
    if !overlap_update(prefixes, request_id, &p) {
        h.request_ids
            .lock()
            .expect("ids")
            .accept_peer(u.request_id)?;
        reply_error(
            send,
            None,
            request_error::PREFIX_OVERLAP,
            "prefix overlaps another request of the session",
        )
        .await;
        return Ok(PrefixUpdate::Refused);
    }
    ack_update(h, send, &u).await?;
    Ok(PrefixUpdate::Moved(p))
}

pub(super) async fn on_subscribe_namespace(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: NamespaceRequest,
) -> Result<()> {
    if !overlap_check(&h.ns_prefixes, m.request_id, &m.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::PREFIX_OVERLAP,
            "prefix overlaps an existing SUBSCRIBE_NAMESPACE",
        )
        .await;
        return Ok(());
    }
    let id = relay.next_id();
    let (existing, mut rx) = relay.subscribe_namespace(id, m.namespace.clone());
    let mut prefix = m.namespace.clone();
    let result = async {
        let _ = write_message(&mut send, &Message::RequestOk(RequestOk::default())).await;
        let mut active: std::collections::HashSet<TrackNamespace> = Default::default();
        // A relay of our registry cluster hears only of what is published
        // here: what we learnt from the others it learns from them, so no
        // announcement goes round the mesh.
        let local_only = h.cluster_peer.load(Relaxed);
        // The relays' own namespaces (`.quichub/...`) are announced only to
        // another relay of the cluster, and only when it asks for them.
        let member = h.cluster_peer.load(Relaxed);
        let mut hide_reserved = !(member && reserved_namespace(&prefix));
        for ns in existing {
            if (local_only && relay.namespace_is_learnt(&ns))
                || (hide_reserved && reserved_namespace(&ns))
            {
                continue;
            }
            let suffix = ns.suffix_after(&prefix);
            if write_message(&mut send, &Message::Namespace(suffix)).await.is_err() {
                return Ok(());
            }
            active.insert(ns);
        }
        loop {
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else {
                        // The relay dropped us for falling behind.
                        let _ = send.reset(reset::EXCESSIVE_LOAD);
                        return Ok(());
                    };
                    let msg = match ev {
                        NamespaceEvent::Added(ns) if local_only && relay.namespace_is_learnt(&ns) => {
                            // Taken over by a session to another relay: withdrawn.
                            if !active.remove(&ns) {
                                continue;
                            }
                            Message::NamespaceDone(ns.suffix_after(&prefix))
                        }
                        NamespaceEvent::Added(ns) if hide_reserved && reserved_namespace(&ns) => continue,
                        NamespaceEvent::Added(ns) if ns.has_prefix(&prefix) && active.insert(ns.clone()) => Message::Namespace(ns.suffix_after(&prefix)),
                        NamespaceEvent::Removed(ns) if active.remove(&ns) => Message::NamespaceDone(ns.suffix_after(&prefix)),
                        _ => continue,
                    };
                    if write_message(&mut send, &msg).await.is_err() {
                        return Ok(());
                    }
                }
                msg = reader.next() => match msg {
                    Ok(Message::RequestUpdate(u)) => {
                        h.pace_update(relay).await;
                        match update_prefix(h, &mut send, u, &h.ns_prefixes, m.request_id, false).await? {
                            PrefixUpdate::Same => {}
                            PrefixUpdate::Refused => return Ok(()),
                            PrefixUpdate::Moved(p) => {
                                // Follow the new prefix: what it holds that was not
                                // announced is, what left it meanwhile is done, and
                                // what is outside it is no longer this request's
                                // (it cannot be named relative to the new prefix).
                                prefix = p;
                                hide_reserved = !(member && reserved_namespace(&prefix));
                                let (now, events) = relay.subscribe_namespace(id, prefix.clone());
                                rx = events;
                                let now: std::collections::HashSet<TrackNamespace> = now
                                    .into_iter()
                                    .filter(|ns| {
                                        let learnt = local_only && relay.namespace_is_learnt(ns);
                                        !(learnt || hide_reserved && reserved_namespace(ns))
                                    })
                                    .collect();
                                let mut msgs = Vec::new();
                                active.retain(|ns| {
                                    let keep = now.contains(ns);
                                    if !keep && ns.has_prefix(&prefix) {
                                        msgs.push(Message::NamespaceDone(ns.suffix_after(&prefix)));
                                    }
                                    keep
                                });
                                let mut added: Vec<_> = now.into_iter().filter(|ns| !active.contains(ns)).collect();
                                added.sort();
                                for ns in added {
                                    msgs.push(Message::Namespace(ns.suffix_after(&prefix)));
                                    active.insert(ns);
                                }
                                for msg in msgs {
                                    if write_message(&mut send, &msg).await.is_err() {
                                        return Ok(());
                                    }
                                }
                            }
                        }
                    }
                    Ok(other) => return Err(SessionError::protocol(format!("{} on SUBSCRIBE_NAMESPACE stream", other.name()))),
                    Err(ReadError::Decode(e)) => return Err(e.into()),
                    Err(_) => return Ok(()),
                }
            }
        }
    }
    .await;
    relay.unsubscribe_namespace(id);
    h.ns_prefixes
        .lock()
        .expect("prefixes")
        .remove(&m.request_id);
    let _ = send.finish();
    result
}

pub(super) async fn on_subscribe_tracks(
    relay: &Arc<Relay>,
    slot: &RequestSlot<'_>,
    h: &Arc<SessionHandle>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: NamespaceRequest,
) -> Result<()> {
    if !overlap_check(&h.track_prefixes, m.request_id, &m.namespace) {
        reply_error(
            &mut send,
            Some(slot),
            request_error::PREFIX_OVERLAP,
            "prefix overlaps an existing SUBSCRIBE_TRACKS",
        )
        .await;
        return Ok(());
    }
    let forward = m.params.forward.unwrap_or(true);
    let tokens: Arc<[bytes::Bytes]> = m.params.authorization_tokens.clone().into();
    let id = relay.next_id();
    let (existing, mut rx) = relay.subscribe_tracks(id, m.namespace.clone());
    let _ = write_message(&mut send, &Message::RequestOk(RequestOk::default())).await;
    // A relay of our cluster is pushed only what a publisher of ours
    // pushed here: not what we learnt from another relay (it gets that from
    // there), nor the MQTT gateway's tracks (they reach it as MQTT
    // messages, `quichub-gateway`'s cluster link).
    let local_only = h.cluster_peer.load(Relaxed);
    // The relays' own tracks (`.quichub/...`) are pushed to no one: a
    // member subscribes to them by name.
    let wanted = |e: &Arc<crate::core::TrackEntry>| {
        !reserved_namespace(&e.track.name.namespace)
            && (!local_only || relay.track_is_pushed_here(e))
    };
    // The track entries pushed for this request, so a prefix moved back
    // and forth pushes none twice (a track published again is a new entry,
    // and is pushed). Weak: an ended entry is not kept, and its address is
    // not reused while it is listed.
    let mut pushed: Vec<std::sync::Weak<crate::core::TrackEntry>> = Vec::new();
    let mut push = |e: Arc<crate::core::TrackEntry>| {
        if !wanted(&e)
            || pushed
                .iter()
                .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&e)))
        {
            return;
        }
        pushed.retain(|w| w.strong_count() > 0);
        pushed.push(Arc::downgrade(&e));
        spawn_publish_downstream(relay, h, e, forward, tokens.clone());
    };
    for e in existing {
        push(e);
    }
    let result = loop {
        tokio::select! {
            e = rx.recv() => match e {
                Some(e) => push(e),
                None => {
                    // The relay dropped us for falling behind.
                    let _ = send.reset(reset::EXCESSIVE_LOAD);
                    break Ok(());
                }
            },
            msg = reader.next() => match msg {
                Ok(Message::RequestUpdate(u)) => {
                    h.pace_update(relay).await;
                    match update_prefix(h, &mut send, u, &h.track_prefixes, m.request_id, true).await? {
                        PrefixUpdate::Same => {}
                        PrefixUpdate::Refused => break Ok(()),
                        PrefixUpdate::Moved(p) => {
                            // What came under the old prefix before the move
                            // is still pushed; then what the new one adds
                            // (draft-18, "Updating Namespace Subscriptions").
                            while let Ok(e) = rx.try_recv() {
                                push(e);
                            }
                            let (now, events) = relay.subscribe_tracks(id, p);
                            rx = events;
                            for e in now {
                                push(e);
                            }
                        }
                    }
                }
                Ok(other) => break Err(SessionError::protocol(format!("{} on SUBSCRIBE_TRACKS stream", other.name()))),
                Err(ReadError::Decode(e)) => break Err(e.into()),
                Err(_) => break Ok(()),
            }
        }
    };
    relay.unsubscribe_tracks(id);
    h.track_prefixes
        .lock()
        .expect("prefixes")
        .remove(&m.request_id);
    let _ = send.finish();
    result
}

/// Client role towards an origin relay: SUBSCRIBE_TRACKS for `prefix`, so
/// the origin pushes (PUBLISH) the tracks its publishers pushed there; each
/// is registered here as published by this session ([`super::publish`]).
/// Returns why it stopped (the stream stays open while the session lasts).
pub(super) async fn follow_origin_tracks(
    h: Arc<SessionHandle>,
    prefix: TrackNamespace,
) -> Option<String> {
    let (mut send, recv) = match h.session.open_bi().await {
        Ok(s) => s,
        Err(e) => return Some(e.to_string()),
    };
    let request = Message::SubscribeTracks(NamespaceRequest {
        request_id: h.next_request_id(),
        namespace: prefix.clone(),
        params: Default::default(),
    });
    if let Err(e) = write_message(&mut send, &request).await {
        return Some(e.to_string());
    }
    let mut reader = h.reader(recv, &[]);
    match reader.next().await {
        Ok(Message::RequestOk(_)) => {}
        // An origin that does not push tracks: namespaces still work.
        Ok(Message::RequestError(e)) => {
            tracing::info!(session = h.id, %prefix, "origin refused SUBSCRIBE_TRACKS: {}", String::from_utf8_lossy(&e.reason));
            return None;
        }
        Ok(other) => return Some(format!("{} in reply to SUBSCRIBE_TRACKS", other.name())),
        Err(e) => return Some(format!("{e:?}")),
    }
    loop {
        match reader.next().await {
            Ok(Message::RequestUpdate(_)) => {}
            Ok(other) => return Some(format!("{} on a SUBSCRIBE_TRACKS stream", other.name())),
            Err(_) => return None,
        }
    }
}

/// Client role towards an origin relay: SUBSCRIBE_NAMESPACE for `prefix`,
/// then every namespace the origin announces under it is registered as
/// published by this session, and withdrawn with NAMESPACE_DONE (all of them
/// when the session ends, by the relay's session cleanup).
pub(super) async fn follow_origin(
    relay: Arc<Relay>,
    h: Arc<SessionHandle>,
    prefix: TrackNamespace,
) -> Option<String> {
    let (mut send, recv) = match h.session.open_bi().await {
        Ok(s) => s,
        Err(e) => return Some(e.to_string()),
    };
    let request = Message::SubscribeNamespace(NamespaceRequest {
        request_id: h.next_request_id(),
        namespace: prefix.clone(),
        params: Default::default(),
    });
    if let Err(e) = write_message(&mut send, &request).await {
        return Some(e.to_string());
    }
    let mut reader = h.reader(recv, &[]);
    match reader.next().await {
        Ok(Message::RequestOk(_)) => {}
        Ok(Message::RequestError(e)) => {
            return Some(format!(
                "SUBSCRIBE_NAMESPACE {prefix} refused: {} (0x{:x})",
                String::from_utf8_lossy(&e.reason),
                e.code
            ))
        }
        Ok(other) => return Some(format!("{} in reply to SUBSCRIBE_NAMESPACE", other.name())),
        Err(e) => return Some(format!("{e:?}")),
    }
    tracing::info!(session = h.id, %prefix, "following the origin's namespaces");
    let peer: Arc<dyn crate::core::Peer> = h.clone();
    // What the origin may make us hold: as many namespaces as tracks.
    let mut followed = std::collections::HashSet::new();
    loop {
        match reader.next().await {
            Ok(Message::Namespace(suffix)) => {
                let ns = prefix.join(&suffix);
                // A publisher here keeps its namespace: the origin's copy
                // would come back through this relay (a loop) or hijack it.
                if relay.namespace_owner(&ns).is_some_and(|id| id != h.id) {
                    tracing::warn!(session = h.id, %ns, "namespace from the origin already published here: ignored");
                    continue;
                }
                if !followed.contains(&ns) && followed.len() >= relay.config.max_tracks {
                    return Some(format!(
                        "more than {} namespaces under {prefix}",
                        relay.config.max_tracks
                    ));
                }
                tracing::info!(session = h.id, %ns, "namespace at the origin");
                followed.insert(ns.clone());
                if let Err(r) = relay.publish_namespace(ns, peer.clone()) {
                    tracing::warn!(session = h.id, "namespace from the origin: {}", r.reason);
                }
            }
            Ok(Message::NamespaceDone(suffix)) => {
                let ns = prefix.join(&suffix);
                followed.remove(&ns);
                relay.unpublish_namespace(&ns, h.id, None);
            }
            Ok(other) => return Some(format!("{} on a SUBSCRIBE_NAMESPACE stream", other.name())),
            Err(e) => return Some(format!("SUBSCRIBE_NAMESPACE stream: {e:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_check_refuses_prefixes_of_each_other_and_keeps_the_rest() {
        let map = Mutex::new(HashMap::new());
        let ns = TrackNamespace::from_path;
        assert!(overlap_check(&map, 1, &ns("live/a")));
        // A prefix of one already held, one under it, and the same one.
        assert!(!overlap_check(&map, 2, &ns("live")));
        assert!(!overlap_check(&map, 3, &ns("live/a/b")));
        assert!(!overlap_check(&map, 4, &ns("live/a")));
        // Siblings do not overlap.
        assert!(overlap_check(&map, 5, &ns("live/b")));
        let held = map.lock().unwrap();
        assert_eq!(held.len(), 2);
        assert!(held.contains_key(&1) && held.contains_key(&5));
    }
}
