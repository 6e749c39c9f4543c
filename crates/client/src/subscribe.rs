//! Subscribing and fetching: objects arrive on subgroup streams and datagrams
//! and are routed by Track Alias to the subscription's channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use moqt::data::{
    FetchDecoder, FetchObject, ObjectDatagram, ObjectStatus, SubgroupRead, SubgroupReader,
};
use moqt::message::{Fetch, FetchKind, FetchOk, Message, Publish, RequestOk, RequestUpdate};
use moqt::{FullTrackName, GroupOrder, Location, Parameters, SubscriptionFilter};
use quichub_net::io::{write_message, MessageReader};
use quichub_net::{RecvStream, SendStream};
use tokio::sync::{mpsc, oneshot};

use crate::session::{ClientSession, Inner};

/// An object as received.
#[derive(Debug, Clone)]
pub struct ReceivedObject {
    /// Group ID.
    pub group: u64,
    /// Subgroup ID; `None` for a datagram.
    pub subgroup: Option<u64>,
    /// Object ID.
    pub object_id: u64,
    /// Publisher Priority.
    pub priority: Option<u8>,
    /// Status.
    pub status: ObjectStatus,
    /// Payload.
    pub payload: Bytes,
    /// The object's properties (draft-18 "object extension headers"), the
    /// raw Key-Value-Pair block as the publisher wrote it; empty if none.
    /// `moqt::coding::get_kvps` reads it.
    pub properties: Bytes,
    /// When it arrived.
    pub arrived: Instant,
}

/// What a subscription yields.
#[derive(Debug, Clone)]
pub enum SubscriptionEvent {
    /// An object.
    Object(ReceivedObject),
    /// A subgroup stream ended: `fin` for a clean end, false for a reset.
    SubgroupEnd {
        /// Group.
        group: u64,
        /// Subgroup.
        subgroup: u64,
        /// Clean.
        fin: bool,
    },
    /// PUBLISH_DONE with its status and stream count.
    Done {
        /// Status code.
        status: u64,
        /// Streams opened by the publisher.
        stream_count: u64,
    },
}

/// SUBSCRIBE options.
#[derive(Debug, Clone, Default)]
pub struct SubscribeOptions {
    /// Filter (absent: unfiltered).
    pub filter: Option<SubscriptionFilter>,
    /// SUBSCRIBER_PRIORITY.
    pub priority: Option<u8>,
    /// FORWARD.
    pub forward: Option<bool>,
    /// RENDEZVOUS_TIMEOUT in ms.
    pub rendezvous_ms: Option<u64>,
    /// GROUP_ORDER.
    pub group_order: Option<GroupOrder>,
    /// OBJECT_DELIVERY_TIMEOUT in ms.
    pub object_timeout_ms: Option<u64>,
    /// NEW_GROUP_REQUEST: the largest group known plus one (0: none), to
    /// ask the publisher to start a new group (tracks with DYNAMIC_GROUPS).
    pub new_group_request: Option<u64>,
}

/// An established subscription.
pub struct Subscription {
    /// The Request ID (for Joining FETCH).
    pub request_id: u64,
    /// Track Alias.
    pub alias: u64,
    /// LARGEST_OBJECT from SUBSCRIBE_OK.
    pub largest: Option<Location>,
    rx: mpsc::UnboundedReceiver<SubscriptionEvent>,
    send: SendStream,
    reader: Option<MessageReader>,
    session: ClientSession,
    /// PUBLISH_DONE's status and Stream Count, and until when to wait for
    /// the streams it counts.
    pending_done: Option<(u64, u64, tokio::time::Instant)>,
    /// Subgroup streams of this subscription that have ended.
    streams_ended: u64,
}

/// How long a subscriber waits, after PUBLISH_DONE, for the data streams it
/// counts (as the relay does upstream).
pub const DONE_GRACE: Duration = Duration::from_secs(2);

impl Subscription {
    /// The next event; `None` once the subscription is over and drained.
    ///
    /// PUBLISH_DONE travels on the request stream and can overtake the data
    /// streams it counts: once it has come, events keep flowing until as
    /// many subgroup streams as its Stream Count have ended (or
    /// [`DONE_GRACE`] has passed), and only then is it reported.
    pub async fn next(&mut self) -> Option<SubscriptionEvent> {
        loop {
            if let Some((status, stream_count, deadline)) = self.pending_done {
                let ev = if self.streams_ended < stream_count {
                    tokio::time::timeout_at(deadline, self.rx.recv())
                        .await
                        .ok()
                        .flatten()
                } else {
                    self.rx.try_recv().ok()
                };
                if let Some(ev) = ev {
                    return Some(self.count(ev));
                }
                self.pending_done = None;
                return Some(SubscriptionEvent::Done {
                    status,
                    stream_count,
                });
            }
            // The request stream is gone and so is the session (closed by
            // the relay, e.g. for an expired token, or lost): nothing can
            // come beyond what is queued, so end rather than wait forever.
            if self.reader.is_none() && self.session.inner.session.close_reason().is_some() {
                return self.rx.try_recv().ok().map(|ev| self.count(ev));
            }
            let control = async {
                match self.reader.as_mut() {
                    Some(r) => r.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                ev = self.rx.recv() => return ev.map(|ev| self.count(ev)),
                m = control => match m {
                    Ok(Message::PublishDone(d)) => {
                        self.reader = None;
                        let deadline = tokio::time::Instant::now() + DONE_GRACE;
                        self.pending_done = Some((d.status, d.stream_count, deadline));
                    }
                    Ok(_) => {}
                    Err(_) => self.reader = None,
                }
            }
        }
    }

    /// Counts the subgroup streams that ended, for PUBLISH_DONE's Stream Count.
    fn count(&mut self, ev: SubscriptionEvent) -> SubscriptionEvent {
        if let SubscriptionEvent::SubgroupEnd { .. } = ev {
            self.streams_ended += 1;
        }
        ev
    }

    /// Sends REQUEST_UPDATE with new parameters and waits for the answer.
    pub async fn update(&mut self, params: Parameters) -> anyhow::Result<()> {
        let id = self.session.next_request_id();
        write_message(
            &mut self.send,
            &Message::RequestUpdate(RequestUpdate {
                request_id: id,
                params,
            }),
        )
        .await?;
        Ok(())
    }

    /// Unsubscribes (STOP_SENDING / reset on the request stream).
    pub fn cancel(mut self) {
        let _ = self.send.reset(moqt::error::reset::CANCELLED);
        if let Some(r) = self.reader.as_mut() {
            r.stop(moqt::error::reset::CANCELLED);
        }
        self.session.inner.aliases.remove(self.alias);
    }
}

/// A FETCH's answer and its objects.
#[derive(Debug)]
pub struct FetchResult {
    /// FETCH_OK.
    pub ok: FetchOk,
    /// Objects in stream order.
    pub objects: Vec<FetchObject>,
}

impl ClientSession {
    /// Subscribes to a track.
    pub async fn subscribe(
        &self,
        track: FullTrackName,
        opts: SubscribeOptions,
    ) -> anyhow::Result<Subscription> {
        let params = Parameters {
            subscription_filter: opts.filter,
            subscriber_priority: opts.priority,
            forward: opts.forward,
            rendezvous_timeout: opts.rendezvous_ms,
            group_order: opts.group_order,
            object_delivery_timeout: opts.object_timeout_ms,
            new_group_request: opts.new_group_request,
            ..Default::default()
        };
        // Register the channel before the reply so no early object is lost: the
        // alias is only known from SUBSCRIBE_OK, so objects that race ahead of
        // it wait in the stream handler (see `on_subgroup`).
        let (reply, send, reader, request_id) = self.subscribe_raw(track, params).await?;
        match reply {
            Message::SubscribeOk(ok) => {
                let (tx, rx) = mpsc::unbounded_channel();
                register_alias(&self.inner, ok.track_alias, tx);
                Ok(Subscription {
                    request_id,
                    alias: ok.track_alias,
                    largest: ok.params.largest_object,
                    rx,
                    send,
                    reader: Some(reader),
                    session: self.clone(),
                    pending_done: None,
                    streams_ended: 0,
                })
            }
            Message::RequestError(e) => bail!(
                "SUBSCRIBE refused: {} {}",
                moqt::error::request_error::describe(e.code),
                String::from_utf8_lossy(&e.reason)
            ),
            other => bail!("unexpected {} in reply to SUBSCRIBE", other.name()),
        }
    }

    /// Sends a FETCH and returns its objects as they arrive.
    pub async fn fetch_stream(
        &self,
        kind: FetchKind,
        params: Parameters,
    ) -> anyhow::Result<FetchStream> {
        let (mut send, recv) = self.inner.session.open_bi().await?;
        let request_id = self.next_request_id();
        let (tx, rx) = oneshot::channel();
        self.inner
            .fetches
            .lock()
            .expect("fetches")
            .insert(request_id, tx);
        let descending = params.group_order == Some(GroupOrder::Descending);
        write_message(
            &mut send,
            &Message::Fetch(Fetch {
                request_id,
                kind,
                params,
            }),
        )
        .await?;
        let mut reader = MessageReader::new(recv, &[]);
        let ok = match reader.next().await? {
            Message::FetchOk(ok) => ok,
            Message::RequestError(e) => {
                self.inner
                    .fetches
                    .lock()
                    .expect("fetches")
                    .remove(&request_id);
                bail!(
                    "FETCH refused: {} {}",
                    moqt::error::request_error::describe(e.code),
                    String::from_utf8_lossy(&e.reason)
                )
            }
            other => bail!("unexpected {} in reply to FETCH", other.name()),
        };
        let (stream, first) = tokio::time::timeout(Duration::from_secs(5), rx).await??;
        let mut decoder = FetchDecoder::new(descending, self.inner.max_object);
        decoder.push(first);
        Ok(FetchStream {
            ok,
            _request: (send, reader),
            stream,
            decoder,
        })
    }

    /// Sends a FETCH and collects every object of its response (see
    /// [`ClientSession::fetch_stream`] to take them as they arrive).
    pub async fn fetch(&self, kind: FetchKind, params: Parameters) -> anyhow::Result<FetchResult> {
        let mut stream = self.fetch_stream(kind, params).await?;
        let mut objects = Vec::new();
        while let Some(o) = stream.next().await? {
            objects.push(o);
        }
        Ok(FetchResult {
            ok: stream.ok,
            objects,
        })
    }
}

/// The objects of a FETCH response as they arrive
/// ([`ClientSession::fetch_stream`]): a joining subscriber can play the
/// first group's keyframe while the rest of the group is still on the way.
pub struct FetchStream {
    /// FETCH_OK.
    pub ok: FetchOk,
    /// The request stream, open while the response is read (as before
    /// streaming: closing it early could read as a cancellation).
    _request: (SendStream, MessageReader),
    stream: RecvStream,
    decoder: FetchDecoder,
}

impl FetchStream {
    /// The next object in stream order; `None` at the end of the response.
    /// End-of-range markers are skipped: the caller sees the gaps in the
    /// object locations.
    pub async fn next(&mut self) -> anyhow::Result<Option<FetchObject>> {
        loop {
            let next = self.decoder.next_object();
            if let Some(o) = next.map_err(|e| anyhow::anyhow!("fetch stream: {e}"))? {
                return Ok(Some(o));
            }
            if self.decoder.is_done() {
                return Ok(None);
            }
            match self.stream.read_chunk(64 * 1024).await {
                Ok(Some(c)) => self.decoder.push(c),
                Ok(None) => self.decoder.finish(),
                Err(e) => bail!("fetch stream: {e}"),
            }
        }
    }
}

/// Registers a subscription's channel under its alias and delivers datagrams
/// that overtook the message naming the alias.
pub(crate) fn register_alias(
    inner: &Arc<Inner>,
    alias: u64,
    tx: mpsc::UnboundedSender<SubscriptionEvent>,
) {
    // A new subscription may reuse the alias of one that ended.
    let held = inner
        .aliases
        .insert(alias, tx, |_| false)
        .unwrap_or_default();
    for d in held {
        on_datagram(inner, d);
    }
}

pub(crate) fn on_datagram(inner: &Arc<Inner>, d: Bytes) {
    let Ok(dg) = ObjectDatagram::decode(&d) else {
        return;
    };
    // Held until its alias is known, if the message naming it is behind.
    let Some(tx) = inner.aliases.route_datagram(dg.track_alias, d) else {
        return;
    };
    let _ = tx.send(SubscriptionEvent::Object(ReceivedObject {
        group: dg.group,
        subgroup: None,
        object_id: dg.object_id,
        priority: dg.priority,
        status: dg.status.unwrap_or(ObjectStatus::Normal),
        payload: dg.payload,
        properties: dg.properties,
        arrived: Instant::now(),
    }));
}

pub(crate) async fn on_subgroup(
    inner: &Arc<Inner>,
    t: u8,
    mut stream: RecvStream,
    first: Bytes,
) -> anyhow::Result<()> {
    let mut reader = SubgroupReader::new(t, inner.max_object);
    reader.push(first);
    let header = loop {
        if let Some(h) = reader.read_header()? {
            break h.clone();
        }
        match stream.read_chunk(4096).await {
            Ok(Some(c)) => reader.push(c),
            Ok(None) => reader.finish(),
            Err(_) => return Ok(()),
        }
    };
    // The SUBSCRIBE_OK carrying this alias may still be in flight.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let Some(tx) = inner.aliases.wait(header.track_alias, deadline).await else {
        let _ = stream.stop(moqt::error::reset::CANCELLED);
        return Ok(());
    };
    loop {
        while let Some(SubgroupRead { subgroup, object }) = reader.next_object()? {
            let _ = tx.send(SubscriptionEvent::Object(ReceivedObject {
                group: header.group,
                subgroup: Some(subgroup),
                object_id: object.object_id,
                priority: header.priority,
                status: object.status,
                payload: object.payload,
                properties: object.properties,
                arrived: Instant::now(),
            }));
        }
        if reader.is_done() {
            let _ = tx.send(SubscriptionEvent::SubgroupEnd {
                group: header.group,
                subgroup: reader.subgroup().unwrap_or(0),
                fin: true,
            });
            return Ok(());
        }
        match stream.read_chunk(reader.read_hint()).await {
            Ok(Some(c)) => reader.push(c),
            Ok(None) => reader.finish(),
            Err(_) => {
                let _ = tx.send(SubscriptionEvent::SubgroupEnd {
                    group: header.group,
                    subgroup: reader.subgroup().unwrap_or(0),
                    fin: false,
                });
                return Ok(());
            }
        }
    }
}

/// A PUBLISH from the relay (after SUBSCRIBE_TRACKS): answered with
/// PUBLISH_OK and handed to the application as a [`Subscription`].
pub(crate) fn on_publish(
    inner: &Arc<Inner>,
    mut send: SendStream,
    reader: MessageReader,
    p: Publish,
) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    register_alias(inner, p.track_alias, tx);
    let inner2 = inner.clone();
    tokio::spawn(async move {
        if write_message(&mut send, &Message::PublishOk(RequestOk::default()))
            .await
            .is_err()
        {
            return;
        }
        let sub = Subscription {
            request_id: p.request_id,
            alias: p.track_alias,
            largest: p.params.largest_object,
            rx,
            send,
            reader: Some(reader),
            session: ClientSession::from_inner(inner2.clone()),
            pending_done: None,
            streams_ended: 0,
        };
        let _ = inner2.publishes_tx.send((p.track, sub));
    });
    Ok(())
}
