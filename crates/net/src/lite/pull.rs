//! The peer publishes: the bridge asks it for its broadcasts (lite
//! announcements are pulled), publishes each to the relay as a namespace,
//! and turns the relay's SUBSCRIBEs into lite subscriptions whose groups
//! become subgroup streams.

use std::sync::atomic::Ordering::Relaxed;

use bytes::{Bytes, BytesMut};
use moqt::data::{ObjectDatagram, ObjectStatus, SubgroupHeader, SubgroupId, SubgroupObject};
use moqt::error::{publish_done, request_error, reset};
use moqt::lite::group::{Datagram, GroupReader};
use moqt::lite::message::{Announce, AnnounceRequest, Subscribe, SubscribeResponse};
use moqt::message::{
    NamespaceRequest, PublishDone, RequestError, RequestOk, Subscribe as ModernSubscribe,
    SubscribeOk,
};
use moqt::{Message, Parameters};

use super::*;

impl Bridge {
    /// Asks the peer for every broadcast under its root and publishes each
    /// to the relay for as long as the peer announces it.
    pub(super) async fn pull_announcements(self: Arc<Self>) {
        let v = self.version;
        let Ok((mut send, recv)) = self.peer.open_bi().await else {
            return;
        };
        let mut out = BytesMut::new();
        moqt::legacy::varint::put_varint(&mut out, stream::ANNOUNCE);
        AnnounceRequest {
            prefix: String::new(),
            exclude_hop: 0,
        }
        .encode(v, &mut out);
        if send.write_all(&out).await.is_err() {
            return;
        }
        let mut r = Reader::new(recv);
        // Each broadcast's PUBLISH_NAMESPACE stream: finishing it is
        // PUBLISH_NAMESPACE_DONE.
        let mut active: HashMap<String, SendStream> = HashMap::new();
        let mut ids: HashMap<u64, String> = HashMap::new();
        let mut next_id = 0u64;
        let mut first = true;
        loop {
            let msg = r.read(|b| Announce::decode(b, v, first)).await;
            first = false;
            let (add, gone) = match msg {
                Ok(Some(Announce::Init { suffixes })) => (suffixes, Vec::new()),
                Ok(Some(Announce::Active { suffix, .. })) => {
                    if v.has_announce_ids() {
                        ids.insert(next_id, suffix.clone());
                        next_id += 1;
                    }
                    (vec![suffix], Vec::new())
                }
                Ok(Some(Announce::Ended { suffix })) => (Vec::new(), vec![suffix]),
                Ok(Some(Announce::End { id })) => match ids.remove(&id) {
                    Some(s) => (Vec::new(), vec![s]),
                    None => {
                        let _ = self
                            .fail
                            .send(Fail::protocol(format!("ANNOUNCE_END of unknown id {id}")))
                            .await;
                        break;
                    }
                },
                Ok(Some(_)) => continue,
                // The peer's origin is gone: every broadcast with it.
                Ok(None) => break,
                Err(e) => {
                    let _ = self
                        .fail
                        .send(Fail::protocol(format!("announcements: {e}")))
                        .await;
                    break;
                }
            };
            for suffix in gone {
                if let Some(mut s) = active.remove(&suffix) {
                    let _ = s.finish();
                }
                self.published.lock().expect("published").remove(&suffix);
            }
            for suffix in add {
                if active.contains_key(&suffix) {
                    // lite-05's restart: the route changed, the broadcast did not.
                    continue;
                }
                if let Some(s) = self.publish_namespace(&suffix).await {
                    self.published
                        .lock()
                        .expect("published")
                        .insert(suffix.clone());
                    active.insert(suffix, s);
                }
            }
        }
        for (suffix, mut s) in active {
            let _ = s.finish();
            self.published.lock().expect("published").remove(&suffix);
        }
    }

    /// PUBLISH_NAMESPACE for one of the peer's broadcasts; its stream, to
    /// finish when the broadcast ends.
    async fn publish_namespace(self: &Arc<Self>, suffix: &str) -> Option<SendStream> {
        let namespace = self.namespace(suffix)?;
        let (mut rs, rr) = self.relay.open_bi().await.ok()?;
        let m = Message::PublishNamespace(NamespaceRequest {
            request_id: self.request_id(),
            namespace,
            params: Parameters::default(),
        });
        write_message(&mut rs, &m).await.ok()?;
        let suffix = suffix.to_string();
        self.spawn(async move {
            let mut mr = MessageReader::new(rr, &[]);
            if let Ok(Message::RequestError(e)) = mr.next().await {
                tracing::info!(broadcast = %suffix, code = e.code, reason = %String::from_utf8_lossy(&e.reason), "moq-lite broadcast refused by the relay");
            }
            // Drained to the end (replies to nothing else come here).
            while mr.next().await.is_ok() {}
        });
        Some(rs)
    }

    /// A request of the relay's: SUBSCRIBE to a track of the peer's
    /// broadcasts; anything else is refused.
    pub(super) async fn on_relay_bi(self: Arc<Self>, mut send: SendStream, recv: RecvStream) {
        let mut mr = MessageReader::new(recv, &[]);
        match mr.next().await {
            Ok(Message::Subscribe(s)) => self.pull_subscribe(send, mr, s).await,
            Ok(_) => {
                let e = RequestError {
                    code: request_error::NOT_SUPPORTED,
                    reason: Bytes::from_static(b"not served by the moq-lite bridge"),
                    ..RequestError::default()
                };
                let _ = write_message(&mut send, &Message::RequestError(e)).await;
                let _ = send.finish();
            }
            Err(_) => {}
        }
    }

    /// The relay subscribes to a track of the peer's: a lite SUBSCRIBE, its
    /// groups as subgroup streams, its end as PUBLISH_DONE.
    async fn pull_subscribe(
        self: Arc<Self>,
        mut send: SendStream,
        mut mr: MessageReader,
        s: ModernSubscribe,
    ) {
        let v = self.version;
        let refuse = |code: u64, why: &'static str| RequestError {
            code,
            reason: Bytes::from_static(why.as_bytes()),
            ..RequestError::default()
        };
        let broadcast = self.broadcast(&s.track.namespace);
        let track = String::from_utf8(s.track.name.to_vec()).ok();
        let (Some(broadcast), Some(track)) = (broadcast, track) else {
            let e = refuse(request_error::DOES_NOT_EXIST, "no such moq-lite broadcast");
            let _ = write_message(&mut send, &Message::RequestError(e)).await;
            let _ = send.finish();
            return;
        };
        let Ok((mut ps, pr)) = self.peer.open_bi().await else {
            return;
        };
        let id = self.next_subscribe.fetch_add(1, Relaxed);
        let alias = self.next_alias.fetch_add(1, Relaxed);
        // Known before the SUBSCRIBE leaves: the peer may send a group
        // before (or with) its SUBSCRIBE_OK, on a stream of its own that can
        // be read first, and a group of an unknown subscription is dropped.
        // The relay holds a stream of an alias it does not know yet for a
        // while (the SUBSCRIBE_OK naming it follows).
        let streams = Arc::new(AtomicU64::new(0));
        self.pulled.lock().expect("pulled").insert(
            id,
            Pulled {
                alias,
                priority: 255 - DEFAULT_PUBLISHER_PRIORITY,
                streams: streams.clone(),
            },
        );
        let mut out = BytesMut::new();
        moqt::legacy::varint::put_varint(&mut out, stream::SUBSCRIBE);
        Subscribe {
            id,
            broadcast,
            track,
            priority: 255 - s.params.subscriber_priority.unwrap_or(128),
            max_age_ms: None,
            start_group: None,
            end_group: None,
            start_frame: 0,
            end_frame: None,
        }
        .encode(v, &mut out);
        if ps.write_all(&out).await.is_err() {
            self.pulled.lock().expect("pulled").remove(&id);
            return;
        }
        let mut pr = Reader::new(pr);
        // lite-01…04 answer SUBSCRIBE_OK first (or reset); 05+ accept
        // implicitly, so the relay hears OK at once and the end later.
        if !v.has_track_stream() {
            match pr.read(|b| SubscribeResponse::decode(b, v)).await {
                Ok(Some(SubscribeResponse::Ok { .. })) => {}
                _ => {
                    self.pulled.lock().expect("pulled").remove(&id);
                    let e = refuse(
                        request_error::DOES_NOT_EXIST,
                        "the moq-lite publisher refused",
                    );
                    let _ = write_message(&mut send, &Message::RequestError(e)).await;
                    let _ = send.finish();
                    return;
                }
            }
        }
        let ok = Message::SubscribeOk(SubscribeOk {
            track_alias: alias,
            params: Parameters::default(),
            properties: Vec::new(),
        });
        let mut status = None;
        if write_message(&mut send, &ok).await.is_ok() {
            loop {
                tokio::select! {
                    r = pr.read(|b| SubscribeResponse::decode(b, v)) => match r {
                        Ok(Some(_)) => {}
                        Ok(None) => { status = Some(publish_done::TRACK_ENDED); break; }
                        Err(_) => { status = Some(publish_done::INTERNAL_ERROR); break; }
                    },
                    m = mr.next() => match m {
                        Ok(Message::RequestUpdate(_)) => {
                            let _ = write_message(&mut send, &Message::RequestOk(RequestOk::default())).await;
                        }
                        Ok(_) => {}
                        // Unsubscribed.
                        Err(_) => break,
                    },
                }
            }
        }
        self.pulled.lock().expect("pulled").remove(&id);
        match status {
            Some(status) => {
                let done = Message::PublishDone(PublishDone {
                    status,
                    stream_count: streams.load(Relaxed),
                    reason: Bytes::new(),
                });
                let _ = write_message(&mut send, &done).await;
                let _ = send.finish();
            }
            None => {
                let _ = ps.finish();
                let _ = send.finish();
            }
        }
    }

    /// A group stream of the peer's: the same group as a subgroup stream to
    /// the relay, frame `n` as object `frame_start + n`.
    pub(super) async fn pull_group(self: Arc<Self>, r: Reader) {
        let v = self.version;
        let (first, mut recv) = r.into_parts();
        let mut reader = GroupReader::new(v, MAX_OBJECT);
        let mut frames = Vec::new();
        let mut to: Option<(SendStream, u64)> = None;
        let mut prev: Option<u64> = None;
        // Object headers, split off one by one (see `serve::HEADER_BLOCK`).
        let mut headers = BytesMut::new();
        let mut chunk = Some(first);
        loop {
            if let Some(c) = chunk.take() {
                if let Err(e) = reader.push(c, &mut frames) {
                    tracing::debug!("moq-lite group stream: {e}");
                    let _ = recv.stop_mapped(code::MALFORMED_TRACK);
                    if let Some((mut s, _)) = to {
                        let _ = s.reset(reset::MALFORMED_TRACK);
                    }
                    return;
                }
            }
            if to.is_none() {
                if let Some(h) = reader.header() {
                    let pulled = self
                        .pulled
                        .lock()
                        .expect("pulled")
                        .get(&h.subscribe)
                        .map(|p| (p.alias, p.priority, p.streams.clone()));
                    let Some((alias, priority, streams)) = pulled else {
                        let _ = recv.stop_mapped(code::CANCEL);
                        return;
                    };
                    let Ok(mut s) = self.relay.open_uni().await else {
                        return;
                    };
                    streams.fetch_add(1, Relaxed);
                    let mut out = BytesMut::new();
                    SubgroupHeader {
                        track_alias: alias,
                        group: h.sequence,
                        subgroup: SubgroupId::Zero,
                        priority: Some(priority),
                        has_properties: false,
                        // One lite group is one subgroup: it holds the largest object.
                        end_of_group: true,
                        first_object: h.frame_start == 0,
                    }
                    .encode(&mut out);
                    if s.write_chunk(out.freeze()).await.is_err() {
                        let _ = recv.stop_mapped(code::CANCEL);
                        return;
                    }
                    to = Some((s, h.frame_start));
                }
            }
            if let Some((s, next_id)) = to.as_mut() {
                for f in frames.drain(..) {
                    let o = SubgroupObject {
                        object_id: *next_id,
                        properties: Bytes::new(),
                        status: ObjectStatus::Normal,
                        payload: Bytes::new(),
                    };
                    headers.reserve(super::serve::HEADER_BLOCK);
                    if o.encode_header_with_len(&mut headers, prev, false, f.payload.len())
                        .is_err()
                    {
                        return;
                    }
                    prev = Some(*next_id);
                    *next_id += 1;
                    let h = headers.split().freeze();
                    let wrote = match f.payload.is_empty() {
                        true => s.write_chunk(h).await,
                        false => match s.write_chunk(h).await {
                            Ok(()) => s.write_chunk(f.payload).await,
                            Err(e) => Err(e),
                        },
                    };
                    if wrote.is_err() {
                        let _ = recv.stop_mapped(code::CANCEL);
                        return;
                    }
                }
            }
            let next = match to.as_mut() {
                Some((s, _)) => tokio::select! {
                    c = recv.read_chunk(64 * 1024) => c,
                    _ = s.stopped() => {
                        let _ = recv.stop_mapped(code::CANCEL);
                        return;
                    }
                },
                None => recv.read_chunk(64 * 1024).await,
            };
            match next {
                Ok(Some(c)) => chunk = Some(c),
                Ok(None) => {
                    match (reader.finish(), to.as_mut()) {
                        (Ok(()), Some((s, _))) => {
                            let _ = s.finish();
                        }
                        (Err(_), Some((s, _))) => {
                            let _ = s.reset(reset::MALFORMED_TRACK);
                        }
                        _ => {}
                    }
                    return;
                }
                Err(_) => {
                    if let Some((s, _)) = to.as_mut() {
                        let _ = s.reset(reset::CANCELLED);
                    }
                    return;
                }
            }
        }
    }

    /// A lite datagram of the peer's (lite-05+): one object of its own group.
    pub(super) fn on_peer_datagram(&self, d: Bytes) {
        let Ok(dg) = Datagram::decode(&d) else {
            return;
        };
        let Some((alias, priority)) = self
            .pulled
            .lock()
            .expect("pulled")
            .get(&dg.subscribe)
            .map(|p| (p.alias, p.priority))
        else {
            return;
        };
        let o = ObjectDatagram {
            track_alias: alias,
            group: dg.sequence,
            object_id: 0,
            priority: Some(priority),
            properties: Bytes::new(),
            end_of_group: true,
            status: None,
            payload: dg.payload,
        };
        let mut out = BytesMut::with_capacity(16 + o.payload.len());
        o.encode(&mut out);
        let _ = self.relay.send_datagram(out.freeze());
    }
}
