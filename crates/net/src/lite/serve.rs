//! The peer subscribes: its announce, subscribe and track streams become
//! draft-18 requests to the relay, and the relay's data streams and
//! datagrams become lite groups.

use std::sync::atomic::Ordering::Relaxed;

use bytes::{Bytes, BytesMut};
use moqt::data::{
    FetchEntry, FetchState, ObjectDatagram, ObjectStatus, StreamType, SubgroupHeader,
    SubgroupObject,
};
use moqt::error::{request_error, reset};
use moqt::lite::group::{encode_frame_header, Datagram, GroupHeader};
use moqt::lite::message::{
    Announce, AnnounceRequest, Subscribe, SubscribeResponse, Track, TrackInfo,
};
use moqt::message::{Fetch, FetchKind, NamespaceRequest, Subscribe as ModernSubscribe};
use moqt::{
    DecodeError, FullTrackName, GroupOrder, Location, Message, Parameters, SubscriptionFilter,
};

use super::*;

/// Bytes reserved at a time for frame headers (a header is at most 18).
pub(super) const HEADER_BLOCK: usize = 1024;

/// A lite group stream being written to the peer.
pub(super) struct GroupOut {
    stream: SendStream,
    /// Timestamp of the previous frame (lite-05+ deltas).
    prev_ts: u64,
    /// Where frame headers are encoded: split off one by one, so a block
    /// serves many frames rather than one allocation each.
    headers: BytesMut,
    /// The next frame's index (object ID) the stream expects.
    next: u64,
}

impl GroupOut {
    /// Opens a group stream of `served` to the peer and writes its header.
    async fn open(b: &Bridge, served: &Served, group: u64) -> Option<Self> {
        let v = b.version;
        if v.has_track_stream() && !served.started.swap(true, Relaxed) {
            if let Some(resp) = &served.response {
                let mut out = BytesMut::new();
                SubscribeResponse::Start { group }.encode(v, &mut out);
                let _ = resp.lock().await.write_all(&out).await;
            }
        }
        served.end.fetch_max(group.saturating_add(1), Relaxed);
        let mut stream = b.peer.open_uni().await.ok()?;
        let _ = stream.set_priority(moqt::priority::stream_priority(
            served.priority,
            DEFAULT_PUBLISHER_PRIORITY,
            group,
            GroupOrder::Descending,
        ));
        let mut out = BytesMut::new();
        GroupHeader {
            subscribe: served.id,
            sequence: group,
            frame_start: 0,
        }
        .encode(v, &mut out);
        stream.write_chunk(out.freeze()).await.ok()?;
        Some(Self {
            stream,
            prev_ts: 0,
            headers: BytesMut::new(),
            next: 0,
        })
    }

    /// Writes one frame (the payload without copying it).
    async fn frame(&mut self, b: &Bridge, payload: Bytes) -> Result<(), ()> {
        let ts = b.now_ms().max(self.prev_ts);
        let delta = (ts - self.prev_ts) as i64;
        self.prev_ts = ts;
        self.headers.reserve(HEADER_BLOCK);
        encode_frame_header(b.version, delta, payload.len(), &mut self.headers);
        let h = self.headers.split().freeze();
        self.stream.write_chunk(h).await.map_err(|_| ())?;
        if !payload.is_empty() {
            self.stream.write_chunk(payload).await.map_err(|_| ())?;
        }
        self.next += 1;
        Ok(())
    }
}

impl Bridge {
    /// ANNOUNCE_REQUEST: a SUBSCRIBE_NAMESPACE for the prefix; NAMESPACE
    /// and NAMESPACE_DONE come back as announcements.
    pub(super) async fn serve_announce(self: Arc<Self>, mut send: SendStream, mut r: Reader) {
        let v = self.version;
        let req = match r.read(|b| AnnounceRequest::decode(b, v)).await {
            Ok(Some(q)) => q,
            Ok(None) => return,
            Err(e) => {
                let _ = self
                    .fail
                    .send(Fail::protocol(format!("ANNOUNCE_REQUEST: {e}")))
                    .await;
                return;
            }
        };
        let Some(prefix) = self.namespace(&req.prefix) else {
            let _ = send.reset_mapped(code::NOT_FOUND);
            return;
        };
        let Ok((mut rs, rr)) = self.relay.open_bi().await else {
            return;
        };
        let m = Message::SubscribeNamespace(NamespaceRequest {
            request_id: self.request_id(),
            namespace: prefix.clone(),
            params: Parameters::default(),
        });
        if write_message(&mut rs, &m).await.is_err() {
            return;
        }
        let mut mr = MessageReader::new(rr, &[]);
        match mr.next().await {
            Ok(Message::RequestOk(_)) => {}
            Ok(Message::RequestError(e)) => {
                tracing::debug!(prefix = %req.prefix, code = e.code, "moq-lite announce request refused");
                let _ = send.reset_mapped(refusal_code(e.code));
                return;
            }
            _ => {
                let _ = send.reset_mapped(code::INTERNAL);
                return;
            }
        }
        let mut out = BytesMut::new();
        if v.has_session_stream() {
            Announce::Init {
                suffixes: Vec::new(),
            }
            .encode(v, &mut out);
        } else if v.has_track_stream() {
            Announce::Ok {
                hop: self.hop,
                active: 0,
            }
            .encode(v, &mut out);
        }
        if !out.is_empty() && send.write_all(&out).await.is_err() {
            let _ = rs.reset(reset::CANCELLED);
            return;
        }
        // lite-06 names an ended broadcast by the id its start took.
        let mut ids: HashMap<String, u64> = HashMap::new();
        let mut next_id = 0u64;
        // lite-03/04 chains end with the sender; 05+ receivers append it.
        let hops = match v {
            Version::Lite03 | Version::Lite04 => vec![self.hop],
            _ => Vec::new(),
        };
        loop {
            let msg = tokio::select! {
                m = mr.next() => m,
                // The subscriber sends nothing after its request: its FIN
                // (or anything else) ends the stream.
                x = r.read(|_| Err::<(), _>(DecodeError::Invalid("bytes after ANNOUNCE_REQUEST"))) => {
                    if let Err(e) = x {
                        tracing::debug!("moq-lite announce stream: {e}");
                    }
                    break;
                }
            };
            let (ns, active) = match msg {
                Ok(Message::Namespace(ns)) => (ns, true),
                Ok(Message::NamespaceDone(ns)) => (ns, false),
                _ => break,
            };
            let Some(suffix) = moqt::lite::path::from_namespace(&ns) else {
                continue;
            };
            // Never echo a broadcast to the session that published it (a
            // relay peered both ways would route it back to itself).
            let full = moqt::lite::path::join(&req.prefix, &suffix);
            if self.published.lock().expect("published").contains(&full) {
                continue;
            }
            let a = match (active, v.has_announce_ids()) {
                (true, ids_on) => {
                    if ids_on {
                        if ids.contains_key(&suffix) {
                            continue;
                        }
                        ids.insert(suffix.clone(), next_id);
                        next_id += 1;
                    }
                    Announce::Active {
                        suffix,
                        hops: hops.clone(),
                        cost: (0, COLD_COST_UNKNOWN),
                    }
                }
                (false, true) => match ids.remove(&suffix) {
                    Some(id) => Announce::End { id },
                    None => continue,
                },
                (false, false) => Announce::Ended { suffix },
            };
            out.clear();
            a.encode(v, &mut out);
            if send.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = rs.reset(reset::CANCELLED);
        let _ = send.finish();
    }

    /// TRACK (lite-05+): the track's properties, at once (`@moq/net` waits
    /// for them before it subscribes). A missing track fails its SUBSCRIBE.
    pub(super) async fn serve_track(self: Arc<Self>, mut send: SendStream, mut r: Reader) {
        let v = self.version;
        match r.read(|b| Track::decode(b, v)).await {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                let _ = self.fail.send(Fail::protocol(format!("TRACK: {e}"))).await;
                return;
            }
        }
        let mut out = BytesMut::new();
        TrackInfo {
            priority: DEFAULT_PUBLISHER_PRIORITY,
            max_age_ms: TRACK_MAX_AGE_MS,
            timescale: 1000,
        }
        .encode(v, &mut out);
        let _ = send.write_all(&out).await;
        let _ = send.finish();
    }

    /// SUBSCRIBE: a draft-18 SUBSCRIBE (and a joining FETCH for the current
    /// group), the relay's data as lite groups, PUBLISH_DONE as the end.
    pub(super) async fn serve_subscribe(self: Arc<Self>, mut send: SendStream, mut r: Reader) {
        let v = self.version;
        let sub = match r.read(|b| Subscribe::decode(b, v)).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                let _ = self
                    .fail
                    .send(Fail::protocol(format!("SUBSCRIBE: {e}")))
                    .await;
                return;
            }
        };
        if !self.served_ids.lock().expect("ids").insert(sub.id) {
            let _ = self
                .fail
                .send(Fail::protocol(format!("Subscribe ID {} reused", sub.id)))
                .await;
            return;
        }
        // The ID is free again once this subscription ends, however it ends.
        struct Release<'a>(&'a Mutex<std::collections::HashSet<u64>>, u64);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.lock().expect("ids").remove(&self.1);
            }
        }
        let _release = Release(&self.served_ids, sub.id);
        let Some(namespace) = self.namespace(&sub.broadcast) else {
            let _ = send.reset_mapped(code::NOT_FOUND);
            return;
        };
        let Ok((mut rs, rr)) = self.relay.open_bi().await else {
            return;
        };
        let request_id = self.request_id();
        let joining = sub.start_group.is_none();
        let filter = match (sub.start_group, sub.end_group) {
            (Some(s), Some(e)) => SubscriptionFilter::AbsoluteRange {
                start: Location {
                    group: s,
                    object: 0,
                },
                end_group_delta: e.saturating_sub(s),
            },
            (Some(s), None) => SubscriptionFilter::AbsoluteStart(Location {
                group: s,
                object: 0,
            }),
            (None, _) => SubscriptionFilter::LargestObject,
        };
        let params = Parameters {
            subscriber_priority: Some(255 - sub.priority),
            group_order: Some(GroupOrder::Descending),
            subscription_filter: Some(filter),
            ..Parameters::default()
        };
        let track = FullTrackName {
            namespace,
            name: Bytes::from(sub.track.clone().into_bytes()),
        };
        let m = Message::Subscribe(ModernSubscribe {
            request_id,
            track: track.clone(),
            params,
        });
        if write_message(&mut rs, &m).await.is_err() {
            return;
        }
        let mut mr = MessageReader::new(rr, &[]);
        let ok = match mr.next().await {
            Ok(Message::SubscribeOk(ok)) => ok,
            Ok(Message::RequestError(e)) => {
                tracing::debug!(broadcast = %sub.broadcast, track = %sub.track, code = e.code, "moq-lite subscribe refused");
                let _ = send.reset_mapped(refusal_code(e.code));
                return;
            }
            _ => {
                let _ = send.reset_mapped(code::INTERNAL);
                return;
            }
        };
        let largest = ok.params.largest_object;
        // The current group, from its first frame: a joining FETCH writes
        // what the relay holds of it, the live stream goes on from there.
        let join = match (joining, largest) {
            (true, Some(l)) => Some((l.group, Arc::new(tokio::sync::Mutex::new(None)))),
            _ => None,
        };
        let send = Arc::new(tokio::sync::Mutex::new(send));
        let served = Arc::new(Served {
            id: sub.id,
            priority: 255 - sub.priority,
            response: v.has_track_stream().then(|| send.clone()),
            started: std::sync::atomic::AtomicBool::new(false),
            end: AtomicU64::new(0),
            join: join.clone(),
        });
        if !v.has_track_stream() {
            let mut out = BytesMut::new();
            SubscribeResponse::Ok {
                priority: DEFAULT_PUBLISHER_PRIORITY,
            }
            .encode(v, &mut out);
            if send.lock().await.write_all(&out).await.is_err() {
                let _ = rs.reset(reset::CANCELLED);
                return;
            }
        }
        if let Some((group, slot)) = join {
            // Held until the fetched frames are written.
            let guard = slot.clone().lock_owned().await;
            let b = self.clone();
            let served2 = served.clone();
            self.spawn(async move { b.join_group(served2, request_id, group, guard).await });
        }
        self.served
            .lock()
            .expect("served")
            .insert(ok.track_alias, served.clone());
        self.served_added.notify_waiters();
        let mut done = None;
        loop {
            tokio::select! {
                m = mr.next() => match m {
                    Ok(Message::PublishDone(d)) => { done = Some(d.status); break; }
                    Ok(_) => {}
                    Err(_) => break,
                },
                u = r.read(|b| moqt::lite::message::SubscribeUpdate::decode(b, v)) => match u {
                    Ok(Some(u)) => {
                        // The new priority; the bounds stay as subscribed.
                        let m = Message::RequestUpdate(moqt::message::RequestUpdate {
                            request_id: self.request_id(),
                            params: Parameters {
                                subscriber_priority: Some(255 - u.priority),
                                ..Parameters::default()
                            },
                        });
                        let _ = write_message(&mut rs, &m).await;
                    }
                    // Unsubscribe.
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!("moq-lite subscribe stream: {e}");
                        break;
                    }
                },
            }
        }
        self.served.lock().expect("served").remove(&ok.track_alias);
        let mut send = send.lock().await;
        match done {
            Some(status) => {
                if v.has_track_stream() {
                    let mut out = BytesMut::new();
                    let end = served.end.load(Relaxed);
                    SubscribeResponse::End { group: end }.encode(v, &mut out);
                    let _ = send.write_all(&out).await;
                }
                if status == moqt::error::publish_done::TRACK_ENDED
                    || status == moqt::error::publish_done::SUBSCRIPTION_ENDED
                {
                    let _ = send.finish();
                } else {
                    let _ = send.reset_mapped(code::CANCEL);
                }
            }
            None => {
                let _ = rs.reset(reset::CANCELLED);
                let _ = send.finish();
            }
        }
    }

    /// The joining FETCH of a subscription: the current group's frames the
    /// relay holds, on the group's stream, which the live objects continue.
    async fn join_group(
        self: Arc<Self>,
        served: Arc<Served>,
        subscribe_request: u64,
        group: u64,
        mut slot: tokio::sync::OwnedMutexGuard<Option<GroupOut>>,
    ) {
        let Ok((mut rs, rr)) = self.relay.open_bi().await else {
            return;
        };
        let request_id = self.request_id();
        let (tx, rx) = oneshot::channel();
        self.fetches.lock().expect("fetches").insert(request_id, tx);
        let m = Message::Fetch(Fetch {
            request_id,
            kind: FetchKind::RelativeJoining {
                joining_request_id: subscribe_request,
                joining_start: 0,
            },
            params: Parameters::default(),
        });
        let mut mr = MessageReader::new(rr, &[]);
        let answered = match write_message(&mut rs, &m).await {
            Ok(()) => matches!(mr.next().await, Ok(Message::FetchOk(_))),
            Err(_) => false,
        };
        let data = match answered {
            true => tokio::time::timeout(ALIAS_WAIT, rx)
                .await
                .ok()
                .and_then(Result::ok),
            false => None,
        };
        self.fetches.lock().expect("fetches").remove(&request_id);
        let Some((mut recv, mut pending)) = data else {
            return;
        };
        // Opened at the group's first object: a relay that does not hold
        // the group's start (it joined mid-group itself) leaves the group
        // undelivered (see `starts_mid_group`).
        let mut out: Option<GroupOut> = None;
        let mut state = FetchState::new(false);
        'read: loop {
            let src = std::mem::take(&mut pending);
            let mut s = &src[..];
            loop {
                match state.decode(&mut s, &src, MAX_OBJECT) {
                    Ok(FetchEntry::Object(o)) if o.group == group => {
                        if o.object_id < out.as_ref().map_or(0, |g| g.next) {
                            continue;
                        }
                        if out.is_none() {
                            if o.object_id > 0 {
                                break 'read;
                            }
                            out = GroupOut::open(&self, &served, group).await;
                        }
                        let Some(g) = out.as_mut() else {
                            return;
                        };
                        if g.frame(&self, o.payload).await.is_err() {
                            return;
                        }
                        g.next = o.object_id + 1;
                    }
                    Ok(_) => {}
                    Err(DecodeError::Short) => break,
                    Err(_) => break 'read,
                }
            }
            let used = src.len() - s.len();
            pending = src.slice(used..);
            match recv.read_chunk(64 * 1024).await {
                Ok(Some(c)) if pending.is_empty() => pending = c,
                Ok(Some(c)) => {
                    let mut b = BytesMut::from(&pending[..]);
                    b.extend_from_slice(&c);
                    pending = b.freeze();
                }
                _ => break,
            }
        }
        *slot = out;
    }

    /// A data stream of the relay: a subgroup of one of the peer's
    /// subscriptions, or the data of a joining FETCH.
    pub(super) async fn on_relay_uni(self: Arc<Self>, mut recv: RecvStream) {
        let mut pending = BytesMut::new();
        let (ty, ty_len) = loop {
            match StreamType::peek(&pending) {
                Ok(t) => break t,
                Err(DecodeError::Short) => {}
                Err(_) => {
                    let _ = recv.stop(reset::CANCELLED);
                    return;
                }
            }
            match recv.read_chunk(64 * 1024).await {
                Ok(Some(c)) => pending.extend_from_slice(&c),
                _ => return,
            }
        };
        match ty {
            StreamType::Subgroup(t) => {
                let header = loop {
                    let mut s = &pending[ty_len..];
                    match SubgroupHeader::decode_after_type(t, &mut s) {
                        Ok(h) => {
                            let used = pending.len() - s.len();
                            let _ = pending.split_to(used);
                            break h;
                        }
                        Err(DecodeError::Short) => {}
                        Err(_) => {
                            let _ = recv.stop(reset::CANCELLED);
                            return;
                        }
                    }
                    match recv.read_chunk(64 * 1024).await {
                        Ok(Some(c)) => pending.extend_from_slice(&c),
                        _ => return,
                    }
                };
                self.pipe_subgroup(header, pending.freeze(), recv).await
            }
            StreamType::Fetch => {
                let request_id = loop {
                    let mut s = &pending[ty_len..];
                    match moqt::coding::get_vi64(&mut s) {
                        Ok(id) => {
                            let used = pending.len() - s.len();
                            let _ = pending.split_to(used);
                            break id;
                        }
                        Err(DecodeError::Short) => {}
                        Err(_) => return,
                    }
                    match recv.read_chunk(64 * 1024).await {
                        Ok(Some(c)) => pending.extend_from_slice(&c),
                        _ => return,
                    }
                };
                let waiter = self.fetches.lock().expect("fetches").remove(&request_id);
                match waiter {
                    Some(tx) => {
                        let _ = tx.send((recv, pending.freeze()));
                    }
                    None => {
                        let _ = recv.stop(reset::CANCELLED);
                    }
                }
            }
            _ => {
                let _ = recv.stop(reset::CANCELLED);
            }
        }
    }

    /// The subscription a Track Alias names, waiting a moment for its
    /// SUBSCRIBE_OK to be read (it travels on another stream).
    async fn served(&self, alias: u64) -> Option<Arc<Served>> {
        let deadline = tokio::time::Instant::now() + ALIAS_WAIT;
        loop {
            let added = self.served_added.notified();
            if let Some(s) = self.served.lock().expect("served").get(&alias) {
                return Some(s.clone());
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return None;
            }
        }
    }

    /// Copies a subgroup stream of the relay to a lite group stream.
    async fn pipe_subgroup(
        self: Arc<Self>,
        header: SubgroupHeader,
        mut pending: Bytes,
        mut recv: RecvStream,
    ) {
        let Some(served) = self.served(header.track_alias).await else {
            let _ = recv.stop(reset::CANCELLED);
            return;
        };
        let group = header.group;
        // The joined group goes on where its FETCH stopped; a later group
        // ends the joined one's stream if no live stream took it over.
        let mut out = None;
        if let Some((g, slot)) = &served.join {
            if *g == group {
                out = slot.lock().await.take();
            } else if group > *g {
                if let Some(mut o) = slot.lock().await.take() {
                    let _ = o.stream.finish();
                }
            }
        }
        // Otherwise the group stream opens at the first object it carries.
        let mut out: Option<GroupOut> = out;
        let subgroup_zero = matches!(
            header.subgroup,
            moqt::data::SubgroupId::Zero | moqt::data::SubgroupId::Explicit(0)
        );
        let mut prev = None;
        loop {
            let mut s = &pending[..];
            loop {
                match SubgroupObject::decode(
                    &mut s,
                    &pending,
                    prev,
                    header.has_properties,
                    MAX_OBJECT,
                ) {
                    Ok(o) => {
                        prev = Some(o.object_id);
                        // Frames have no IDs: what the FETCH already wrote is skipped.
                        if o.status != ObjectStatus::Normal
                            || o.object_id < out.as_ref().map_or(0, |g| g.next)
                        {
                            continue;
                        }
                        if out.is_none() {
                            if starts_mid_group(subgroup_zero, o.object_id) {
                                let _ = recv.stop(reset::CANCELLED);
                                return;
                            }
                            out = GroupOut::open(&self, &served, group).await;
                        }
                        let Some(g) = out.as_mut() else {
                            let _ = recv.stop(reset::CANCELLED);
                            return;
                        };
                        if g.frame(&self, o.payload).await.is_err() {
                            let _ = recv.stop(reset::CANCELLED);
                            return;
                        }
                        g.next = o.object_id + 1;
                    }
                    Err(DecodeError::Short) => break,
                    Err(_) => {
                        let _ = recv.stop(reset::CANCELLED);
                        if let Some(g) = out.as_mut() {
                            let _ = g.stream.reset_mapped(code::MALFORMED_TRACK);
                        }
                        return;
                    }
                }
            }
            let used = pending.len() - s.len();
            pending = pending.slice(used..);
            let chunk = match out.as_mut() {
                Some(g) => tokio::select! {
                    c = recv.read_chunk(64 * 1024) => c,
                    _ = g.stream.stopped() => {
                        let _ = recv.stop(reset::CANCELLED);
                        return;
                    }
                },
                None => recv.read_chunk(64 * 1024).await,
            };
            match chunk {
                Ok(Some(c)) if pending.is_empty() => pending = c,
                Ok(Some(c)) => {
                    let mut b = BytesMut::with_capacity(pending.len() + c.len());
                    b.extend_from_slice(&pending);
                    b.extend_from_slice(&c);
                    pending = b.freeze();
                }
                Ok(None) => {
                    if let Some(g) = out.as_mut() {
                        let _ = g.stream.finish();
                    }
                    return;
                }
                Err(_) => {
                    if let Some(g) = out.as_mut() {
                        let _ = g.stream.reset_mapped(code::CANCEL);
                    }
                    return;
                }
            }
        }
    }

    /// A datagram object of one of the peer's subscriptions: a lite datagram
    /// where the version and transport have them, else a one-frame group.
    pub(super) async fn on_relay_datagram(self: &Arc<Self>, d: Bytes) {
        let Ok(o) = ObjectDatagram::decode(&d) else {
            return;
        };
        if o.status.is_some() {
            return;
        }
        let served = self
            .served
            .lock()
            .expect("served")
            .get(&o.track_alias)
            .cloned();
        let Some(served) = served else {
            return;
        };
        if self.version.has_track_stream() && self.transport != Transport::WebSocket {
            let dg = Datagram {
                subscribe: served.id,
                sequence: o.group,
                timestamp: self.now_ms(),
                payload: o.payload,
            };
            let mut out = BytesMut::with_capacity(16 + dg.payload.len());
            dg.encode_header(&mut out);
            out.extend_from_slice(&dg.payload);
            let _ = self.peer.send_datagram(out.freeze());
            return;
        }
        let b = self.clone();
        self.spawn(async move {
            if let Some(mut out) = GroupOut::open(&b, &served, o.group).await {
                if out.frame(&b, o.payload).await.is_ok() {
                    let _ = out.stream.finish();
                }
            }
        });
    }
}

/// Whether a subgroup stream whose first object is `first_object` misses
/// the start of its group. A lite group has no object IDs: the peer takes
/// its first frame for the group's first (for media, the keyframe). Subgroup
/// 0 that does not begin with object 0 joined the group mid-way (a
/// subscription that began mid-group, when nothing fetched the group's
/// start): the group is not delivered, the next one is. Other subgroups
/// begin where they begin.
fn starts_mid_group(subgroup_zero: bool, first_object: u64) -> bool {
    subgroup_zero && first_object > 0
}

/// What a peer's refused request gets: the lite reset code closest to the
/// relay's REQUEST_ERROR.
fn refusal_code(request_error_code: u64) -> u32 {
    match request_error_code {
        request_error::DOES_NOT_EXIST => code::NOT_FOUND,
        request_error::GOING_AWAY => code::GOING_AWAY,
        _ => code::INTERNAL,
    }
}

/// TRACK_INFO's max age: what the relay's cache keeps, roughly (a lite
/// subscriber uses it only to skip stale groups).
const TRACK_MAX_AGE_MS: u64 = 5000;

#[cfg(test)]
mod tests {
    use super::starts_mid_group;

    #[test]
    fn a_group_is_delivered_from_its_first_object_only() {
        // Subgroup 0 from object 0: the group's start.
        assert!(!starts_mid_group(true, 0));
        // Subgroup 0 from object 13: joined mid-group, not delivered.
        assert!(starts_mid_group(true, 13));
        // Another subgroup begins where it begins.
        assert!(!starts_mid_group(false, 13));
    }
}
