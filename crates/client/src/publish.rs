//! Publishing: tracks we serve, written as datagrams or subgroup streams.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use anyhow::bail;
use bytes::{Bytes, BytesMut};
use moqt::data::{ObjectDatagram, ObjectStatus, SubgroupHeader, SubgroupId, SubgroupObject};
use moqt::message::{Message, Publish, PublishDone};
use moqt::{FullTrackName, KeyValue, Location, Parameters};
use quichub_net::io::{write_message, MessageReader};
use quichub_net::{SendStream, Session};

use crate::session::{ClientSession, Inner};
use crate::shape::{ShapedStream, Shaper};

/// How a track reaches the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackMode {
    /// Served when the relay SUBSCRIBEs (after PUBLISH_NAMESPACE).
    Announce,
    /// Pushed with PUBLISH right away.
    Push,
}

/// A track this client publishes.
pub struct LocalTrack {
    /// Full name.
    pub name: FullTrackName,
    /// The Track Alias we use for it.
    pub alias: u64,
    /// Publisher Priority for its objects.
    pub priority: u8,
    /// Sent with PUBLISH ([`TrackMode::Push`]): a SUBSCRIBE for it is
    /// refused, as its data streams already carry the PUBLISH's alias.
    pub(crate) pushed: bool,
    session: Session,
    forward: AtomicBool,
    subscriptions: AtomicU64,
    largest: Mutex<Option<Location>>,
    properties: Vec<KeyValue>,
    /// A pushed track's PUBLISH stream (its updates are read by a task of
    /// their own, [`read_publish_updates`]).
    publish_stream: Arc<tokio::sync::Mutex<Option<SendStream>>>,
    /// Set by [`LocalTrack::finish`] to its Stream Count: the relay's
    /// SUBSCRIBEs (announce mode) are then answered with PUBLISH_DONE.
    pub(crate) done: tokio::sync::watch::Sender<Option<u64>>,
    /// Shapes the subgroup streams opened from now on ([`Self::set_shaper`]).
    shaper: Mutex<Option<Arc<Shaper>>>,
    /// NEW_GROUP_REQUESTs received ([`Self::new_group_requests`]).
    new_groups: tokio::sync::watch::Sender<u64>,
}

impl LocalTrack {
    /// Sends this track's subgroup streams opened from now on through
    /// `shaper` (constant rate and/or size buckets, [`crate::shape`]).
    /// Datagram objects are not shaped.
    pub fn set_shaper(&self, shaper: Arc<Shaper>) {
        *self.shaper.lock().expect("shaper") = Some(shaper);
    }

    fn shaper(&self) -> Option<Arc<Shaper>> {
        self.shaper.lock().expect("shaper").clone()
    }

    /// How many NEW_GROUP_REQUESTs subscribers sent (in SUBSCRIBE,
    /// REQUEST_UPDATE or PUBLISH_OK), changing with each. A publisher that
    /// declares the DYNAMIC_GROUPS Track Property (0x30 = 1, with
    /// [`ClientSession::create_track_with`]) starts a new group when it
    /// changes; quichub's relays pass the requests on only for such tracks.
    ///
    /// [`ClientSession::create_track_with`]: crate::ClientSession::create_track_with
    pub fn new_group_requests(&self) -> tokio::sync::watch::Receiver<u64> {
        self.new_groups.subscribe()
    }

    /// Counts a NEW_GROUP_REQUEST.
    pub(crate) fn note_new_group_request(&self) {
        self.new_groups.send_modify(|n| *n += 1);
    }

    /// Whether objects are currently being forwarded to a subscriber.
    pub fn is_forwarding(&self) -> bool {
        self.forward.load(Relaxed)
    }

    /// SUBSCRIBEs this track has answered (a relay sends one however many
    /// subscribers it has).
    pub fn subscriptions_served(&self) -> u64 {
        self.subscriptions.load(Relaxed)
    }

    pub(crate) fn note_subscription(&self) {
        self.subscriptions.fetch_add(1, Relaxed);
    }

    pub(crate) fn set_forward(&self, f: bool) {
        self.forward.store(f, Relaxed);
    }

    /// Largest Location written.
    pub fn largest(&self) -> Option<Location> {
        *self.largest.lock().expect("largest")
    }

    pub(crate) fn properties(&self) -> Vec<KeyValue> {
        self.properties.clone()
    }

    fn note(&self, loc: Location) {
        let mut l = self.largest.lock().expect("largest");
        if l.is_none_or(|x| loc > x) {
            *l = Some(loc);
        }
    }

    /// Sends one object as a datagram. Returns `false` when nobody subscribes
    /// (the object is dropped, as a live source would) or the datagram was refused.
    pub fn send_datagram(&self, group: u64, object_id: u64, payload: Bytes) -> bool {
        self.send_datagram_with_properties(group, object_id, Bytes::new(), payload)
    }

    /// Like [`Self::send_datagram`], with object properties: `properties`
    /// is a Key-Value-Pair block as `moqt::coding::put_kvps` writes it
    /// (e.g. LOC's timestamp), sent as is.
    pub fn send_datagram_with_properties(
        &self,
        group: u64,
        object_id: u64,
        properties: Bytes,
        payload: Bytes,
    ) -> bool {
        self.note(Location::new(group, object_id));
        if !self.is_forwarding() {
            return false;
        }
        let d = ObjectDatagram {
            track_alias: self.alias,
            group,
            object_id,
            priority: Some(self.priority),
            properties,
            end_of_group: false,
            status: None,
            payload,
        };
        let mut b = BytesMut::with_capacity(16 + d.properties.len() + d.payload.len());
        d.encode(&mut b);
        self.session.send_datagram(b.freeze()).is_ok()
    }

    /// Opens a subgroup stream. Returns `None` when nobody subscribes.
    pub async fn open_subgroup(
        &self,
        group: u64,
        subgroup: u64,
    ) -> anyhow::Result<Option<SubgroupWriter<'_>>> {
        self.open_subgroup_with(group, subgroup, self.priority)
            .await
    }

    /// Opens a subgroup stream whose objects carry Publisher Priority
    /// `priority` (lower is more important), e.g. keyframes above the frames
    /// that depend on them. Returns `None` when nobody subscribes.
    pub async fn open_subgroup_with(
        &self,
        group: u64,
        subgroup: u64,
        priority: u8,
    ) -> anyhow::Result<Option<SubgroupWriter<'_>>> {
        open(TrackRef::Borrowed(self), group, subgroup, priority, false).await
    }

    /// Like [`Self::open_subgroup_with`], for objects that carry properties
    /// ([`SubgroupWriter::write_with_properties`]): the subgroup header's
    /// PROPERTIES bit is set, so every object on the stream has a property
    /// block (one byte when empty). Returns `None` when nobody subscribes.
    pub async fn open_subgroup_with_properties(
        &self,
        group: u64,
        subgroup: u64,
        priority: u8,
    ) -> anyhow::Result<Option<SubgroupWriter<'_>>> {
        open(TrackRef::Borrowed(self), group, subgroup, priority, true).await
    }

    /// Like [`Self::open_subgroup_with`], for a writer that holds the track
    /// itself, so it can be kept beside the track (one writer per open
    /// subgroup of a long-lived publisher).
    pub async fn open_subgroup_owned(
        self: &Arc<Self>,
        group: u64,
        subgroup: u64,
        priority: u8,
    ) -> anyhow::Result<Option<SubgroupWriter<'static>>> {
        open(
            TrackRef::Owned(self.clone()),
            group,
            subgroup,
            priority,
            false,
        )
        .await
    }

    /// [`Self::open_subgroup_owned`] with the PROPERTIES bit, as
    /// [`Self::open_subgroup_with_properties`].
    pub async fn open_subgroup_owned_with_properties(
        self: &Arc<Self>,
        group: u64,
        subgroup: u64,
        priority: u8,
    ) -> anyhow::Result<Option<SubgroupWriter<'static>>> {
        open(
            TrackRef::Owned(self.clone()),
            group,
            subgroup,
            priority,
            true,
        )
        .await
    }

    /// Ends the track with PUBLISH_DONE (TRACK_ENDED) carrying
    /// `stream_count`, the data streams opened for it: on the PUBLISH stream
    /// of a pushed track, and on the request stream of every SUBSCRIBE being
    /// served (announce mode).
    pub async fn finish(&self, stream_count: u64) -> anyhow::Result<()> {
        self.done.send_replace(Some(stream_count));
        if let Some(send) = self.publish_stream.lock().await.as_mut() {
            let m = Message::PublishDone(PublishDone {
                status: moqt::error::publish_done::TRACK_ENDED,
                stream_count,
                reason: Bytes::new(),
            });
            write_message(send, &m).await?;
            let _ = send.finish();
        }
        Ok(())
    }
}

/// The track a [`SubgroupWriter`] writes for: borrowed, or held.
enum TrackRef<'a> {
    Borrowed(&'a LocalTrack),
    Owned(Arc<LocalTrack>),
}

impl std::ops::Deref for TrackRef<'_> {
    type Target = LocalTrack;
    fn deref(&self) -> &LocalTrack {
        match self {
            TrackRef::Borrowed(t) => t,
            TrackRef::Owned(t) => t,
        }
    }
}

/// The quinn priority of a subgroup stream this client sends: publisher
/// priority first, then group order. Tracks are published without a
/// GROUP_ORDER parameter, so ascending (§7.2): on an uplink slower than the
/// track, the oldest open group finishes first instead of every open group
/// advancing round-robin (see `moqt::priority`). The subscriber-priority
/// term is the same for every stream of the session.
fn send_order(priority: u8, group: u64) -> i32 {
    moqt::priority::stream_priority(128, priority, group, moqt::GroupOrder::Ascending)
}

async fn open(
    track: TrackRef<'_>,
    group: u64,
    subgroup: u64,
    priority: u8,
    properties: bool,
) -> anyhow::Result<Option<SubgroupWriter<'_>>> {
    if !track.is_forwarding() {
        return Ok(None);
    }
    let mut stream = track.session.open_uni().await?;
    let _ = stream.set_priority(send_order(priority, group));
    let mut b = BytesMut::new();
    SubgroupHeader {
        track_alias: track.alias,
        group,
        subgroup: if subgroup == 0 {
            SubgroupId::Zero
        } else {
            SubgroupId::Explicit(subgroup)
        },
        priority: Some(priority),
        has_properties: properties,
        end_of_group: false,
        first_object: true,
    }
    .encode(&mut b);
    let sink = match track.shaper() {
        Some(s) => {
            let w = s.writer(stream);
            w.write(&[b.freeze()])?;
            Sink::Shaped(w)
        }
        None => {
            stream.write_all(&b).await?;
            Sink::Direct(stream)
        }
    };
    Ok(Some(SubgroupWriter {
        sink,
        properties,
        prev: None,
        group,
        track,
    }))
}

/// Where a subgroup's bytes go: its stream, or a shaper's queue for it.
enum Sink {
    Direct(SendStream),
    Shaped(ShapedStream),
}

/// Writes the objects of one subgroup, in increasing Object ID order.
pub struct SubgroupWriter<'a> {
    sink: Sink,
    /// Whether the header's PROPERTIES bit is set (every object then
    /// carries a property block).
    properties: bool,
    prev: Option<u64>,
    group: u64,
    track: TrackRef<'a>,
}

impl SubgroupWriter<'_> {
    /// Writes one object.
    pub async fn write(&mut self, object_id: u64, payload: Bytes) -> anyhow::Result<()> {
        self.write_status(object_id, payload, ObjectStatus::Normal)
            .await
    }

    /// Writes one object with properties: `properties` is a Key-Value-Pair
    /// block as `moqt::coding::put_kvps` writes it (e.g. LOC's timestamp),
    /// sent as is. The writer must come from an `open_subgroup_*
    /// _with_properties` call unless `properties` is empty.
    pub async fn write_with_properties(
        &mut self,
        object_id: u64,
        properties: Bytes,
        payload: Bytes,
    ) -> anyhow::Result<()> {
        self.write_object(object_id, properties, payload, ObjectStatus::Normal)
            .await
    }

    /// Writes an object with a status (payload must be empty unless Normal).
    pub async fn write_status(
        &mut self,
        object_id: u64,
        payload: Bytes,
        status: ObjectStatus,
    ) -> anyhow::Result<()> {
        self.write_object(object_id, Bytes::new(), payload, status)
            .await
    }

    async fn write_object(
        &mut self,
        object_id: u64,
        properties: Bytes,
        payload: Bytes,
        status: ObjectStatus,
    ) -> anyhow::Result<()> {
        if !properties.is_empty() && !self.properties {
            anyhow::bail!("object properties on a subgroup opened without them");
        }
        let o = SubgroupObject {
            object_id,
            properties,
            status,
            payload: Bytes::new(),
        };
        let mut b = BytesMut::with_capacity(16 + o.properties.len());
        o.encode_header_with_len(&mut b, self.prev, self.properties, payload.len())?;
        match &mut self.sink {
            Sink::Shaped(s) => {
                let n = (b.len() + payload.len()) as u64;
                s.write(&[b.freeze(), payload])?;
                s.object_sent(n);
            }
            Sink::Direct(stream) => {
                stream.write_chunk(b.freeze()).await?;
                if !payload.is_empty() {
                    stream.write_chunk(payload).await?;
                }
            }
        }
        self.prev = Some(object_id);
        self.track.note(Location::new(self.group, object_id));
        Ok(())
    }

    /// Ends the subgroup with FIN (a shaped one after its queued data).
    pub fn finish(mut self) {
        match &mut self.sink {
            Sink::Direct(stream) => {
                let _ = stream.finish();
            }
            Sink::Shaped(s) => s.finish(),
        }
    }

    /// Ends the subgroup and waits, at most `limit`, until the peer has
    /// acknowledged all of it (or stopped the stream); true when it did. A
    /// publisher about to close its session calls this first: closing drops
    /// whatever is still unacknowledged, which on a slow uplink can be
    /// seconds of objects.
    /// A shaped subgroup ([`crate::shape`]) is finished without waiting: its
    /// bytes leave on the shaper's schedule (false).
    pub async fn finish_and_wait(mut self, limit: std::time::Duration) -> bool {
        match &mut self.sink {
            Sink::Direct(stream) => {
                let _ = stream.finish();
                matches!(
                    tokio::time::timeout(limit, stream.stopped()).await,
                    Ok(Ok(_))
                )
            }
            Sink::Shaped(_) => {
                self.finish();
                false
            }
        }
    }
}

impl ClientSession {
    /// Registers a track. In [`TrackMode::Push`] it is sent with PUBLISH now
    /// and this waits for PUBLISH_OK; in [`TrackMode::Announce`] it is served
    /// when the relay subscribes (its namespace must be published).
    pub async fn create_track(
        &self,
        name: FullTrackName,
        priority: u8,
        mode: TrackMode,
    ) -> anyhow::Result<Arc<LocalTrack>> {
        self.create_track_with(name, priority, mode, Vec::new())
            .await
    }

    /// Like [`Self::create_track`], with extra Track Properties (e.g.
    /// OBJECT_DELIVERY_TIMEOUT); DEFAULT_PUBLISHER_PRIORITY is always set.
    pub async fn create_track_with(
        &self,
        name: FullTrackName,
        priority: u8,
        mode: TrackMode,
        mut properties: Vec<KeyValue>,
    ) -> anyhow::Result<Arc<LocalTrack>> {
        properties.push(KeyValue::int(0x0E, priority as u64));
        properties.sort_by_key(|kv| kv.kind);
        let inner: &Arc<Inner> = &self.inner;
        let alias = inner.next_alias.fetch_add(1, Relaxed);
        let track = Arc::new(LocalTrack {
            name: name.clone(),
            alias,
            priority,
            pushed: mode == TrackMode::Push,
            session: inner.session.clone(),
            forward: AtomicBool::new(false),
            subscriptions: AtomicU64::new(0),
            largest: Mutex::new(None),
            properties,
            publish_stream: Arc::default(),
            done: tokio::sync::watch::channel(None).0,
            shaper: Mutex::new(None),
            new_groups: tokio::sync::watch::channel(0).0,
        });
        inner
            .tracks
            .lock()
            .expect("tracks")
            .insert(name.clone(), track.clone());
        if mode == TrackMode::Push {
            let (mut send, recv) = inner.session.open_bi().await?;
            let msg = Message::Publish(Publish {
                request_id: self.next_request_id(),
                track: name,
                track_alias: alias,
                params: Parameters::default(),
                properties: track.properties(),
            });
            write_message(&mut send, &msg).await?;
            let mut reader = MessageReader::new(recv, &[]);
            match reader.next().await? {
                Message::PublishOk(ok) | Message::RequestOk(ok) => {
                    track.set_forward(ok.params.forward.unwrap_or(true));
                    if ok.params.new_group_request.is_some() {
                        track.note_new_group_request();
                    }
                }
                Message::RequestError(e) => {
                    bail!(
                        "PUBLISH refused: {} {}",
                        moqt::error::request_error::describe(e.code),
                        String::from_utf8_lossy(&e.reason)
                    )
                }
                other => bail!("unexpected {} in reply to PUBLISH", other.name()),
            }
            *track.publish_stream.lock().await = Some(send);
            tokio::spawn(read_publish_updates(Arc::downgrade(&track), reader));
        }
        Ok(track)
    }
}

/// Applies the REQUEST_UPDATEs a relay sends on a pushed track's PUBLISH
/// stream (FORWARD, NEW_GROUP_REQUEST) and answers each with REQUEST_OK,
/// until the stream or the track ends.
async fn read_publish_updates(track: std::sync::Weak<LocalTrack>, mut reader: MessageReader) {
    while let Ok(m) = reader.next().await {
        let Message::RequestUpdate(u) = m else {
            continue;
        };
        let Some(track) = track.upgrade() else {
            return;
        };
        if let Some(f) = u.params.forward {
            track.set_forward(f);
        }
        if u.params.new_group_request.is_some() {
            track.note_new_group_request();
        }
        let stream = track.publish_stream.clone();
        drop(track);
        let mut guard = stream.lock().await;
        if let Some(send) = guard.as_mut() {
            let ok = Message::RequestOk(moqt::message::RequestOk::default());
            if write_message(send, &ok).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod send_order_tests {
    use super::send_order;

    #[test]
    fn older_groups_first_within_a_priority() {
        assert!(send_order(128, 7) > send_order(128, 8));
        // Publisher priority dominates group order: keyframes of a newer
        // group (priority 0) go before disposable frames of an older one.
        assert!(send_order(0, 9) > send_order(2, 8));
    }
}
