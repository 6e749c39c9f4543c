//! Data from publishers: the unidirectional streams the peer opens (its
//! control stream, subgroup streams) and its datagrams, including datagrams
//! that arrive before the alias naming their track is known.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use moqt::coding::get_vi64;
use moqt::data::{ObjectDatagram, ObjectStatus, StreamType, SubgroupRead, SubgroupReader};
use moqt::error::reset;
use moqt::session::SessionError;
use moqt::DecodeError;
use quichub_net::io::{read_prefix_after, ReadError};
use quichub_net::RecvStream;

use super::{on_control, read_err, Result, SessionHandle};
use crate::core::Relay;
use crate::object::Object;

/// How long a subgroup stream waits for the SUBSCRIBE_OK or PUBLISH that
/// names its Track Alias.
const ALIAS_WAIT: Duration = Duration::from_secs(2);

impl SessionHandle {
    /// Delivers datagrams that arrived before their alias was known (what
    /// [`AliasTable::insert`] handed back).
    ///
    /// [`AliasTable::insert`]: quichub_net::alias::AliasTable::insert
    pub(super) fn deliver_early(&self, relay: &Arc<Relay>, held: Vec<Bytes>) {
        for d in held {
            let _ = on_datagram(relay, self, d);
        }
    }
}

/// A unidirectional stream: the peer's control stream, a subgroup, a fetch
/// response or padding. `read` is what was already read from it.
pub(super) async fn on_uni(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    mut stream: RecvStream,
    read: Bytes,
) -> Result<()> {
    // Before SETUP the setup timeout bounds the wait; after it, this does.
    let header_timeout = Duration::from_millis(relay.config.stream_header_timeout_ms);
    let typed = async {
        h.wait_setup().await;
        tokio::time::sleep(header_timeout).await
    };
    let (ty, rest) = tokio::select! {
        biased;
        r = read_prefix_after(&mut stream, &read, 16, get_vi64) => match r {
            Ok(v) => v,
            Err(ReadError::Finished) => return Ok(()),
            Err(e) => return Err(read_err(e)),
        },
        _ = typed => {
            relay.metrics.stream_header_timeouts.fetch_add(1, Relaxed);
            let _ = stream.stop(reset::CANCELLED);
            return Ok(());
        }
    };
    match StreamType::from_code(ty)? {
        StreamType::Control => {
            if h.control_seen.swap(true, Relaxed) {
                return Err(SessionError::protocol(
                    "second control stream (second SETUP)",
                ));
            }
            // The type we just read is the SETUP message's own type: re-prefix it.
            let mut prefix = BytesMut::new();
            moqt::coding::put_vi64(&mut prefix, ty);
            prefix.extend_from_slice(&rest);
            on_control(relay, h, h.reader(stream, &prefix)).await
        }
        StreamType::Subgroup(t) => {
            h.wait_setup().await;
            on_subgroup(relay, h, t, stream, rest).await
        }
        StreamType::Fetch => {
            h.wait_setup().await;
            on_fetch_stream(relay, h, stream, rest).await
        }
        StreamType::Padding => {
            let _ = stream.stop(reset::CANCELLED);
            Ok(())
        }
    }
}

/// The response stream of a FETCH the relay sent upstream: handed to the
/// task waiting for it ([`SessionHandle::open_fetch`]) once its Request ID
/// is read. A stream no FETCH of ours waits for is stopped.
async fn on_fetch_stream(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    mut stream: RecvStream,
    rest: Bytes,
) -> Result<()> {
    let timeout = Duration::from_millis(relay.config.stream_header_timeout_ms);
    let read = read_prefix_after(&mut stream, &rest, 16, get_vi64);
    let (id, rest) = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(v)) => v,
        Ok(Err(ReadError::Decode(e))) => return Err(e.into()),
        Ok(Err(_)) => return Ok(()),
        Err(_) => {
            relay.metrics.stream_header_timeouts.fetch_add(1, Relaxed);
            let _ = stream.stop(reset::CANCELLED);
            return Ok(());
        }
    };
    let waiter = h.fetch_streams.lock().expect("fetch streams").remove(&id);
    match waiter {
        Some(tx) => {
            let _ = tx.send((stream, rest));
        }
        None => {
            let _ = stream.stop(reset::CANCELLED);
        }
    }
    Ok(())
}

async fn on_subgroup(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    t: u8,
    mut stream: RecvStream,
    first: Bytes,
) -> Result<()> {
    let mut reader = SubgroupReader::new(t, relay.config.max_object_size);
    reader.push(first);
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.stream_header_timeout_ms);
    let header = loop {
        if let Some(hd) = reader.read_header()? {
            break hd.clone();
        }
        match tokio::time::timeout_at(deadline, stream.read_chunk(4096)).await {
            Ok(Ok(Some(c))) => reader.push(c),
            Ok(Ok(None)) => reader.finish(),
            Ok(Err(_)) => return Ok(()),
            Err(_) => {
                relay.metrics.stream_header_timeouts.fetch_add(1, Relaxed);
                let _ = stream.stop(reset::CANCELLED);
                return Ok(());
            }
        }
    };
    // The alias may be announced by a SUBSCRIBE_OK still in flight: wait briefly.
    let deadline = tokio::time::Instant::now() + ALIAS_WAIT;
    let Some(track) = h.aliases.wait(header.track_alias, deadline).await else {
        let _ = stream.stop(reset::CANCELLED);
        return Ok(());
    };
    // Open until this handler returns, however it returns: PUBLISH_DONE
    // waits for the streams it counts.
    let _counted = track.upstream_stream();
    let priority = header
        .priority
        .unwrap_or_else(|| track.info().default_priority);
    loop {
        match reader.next_object() {
            Ok(Some(SubgroupRead { subgroup, object })) => {
                track.publish(Object {
                    group: header.group,
                    subgroup: Some(subgroup),
                    object_id: object.object_id,
                    priority,
                    properties: object.properties,
                    status: object.status,
                    payload: object.payload,
                    end_of_group: false,
                    received: Instant::now(),
                    datagram: Default::default(),
                });
                continue;
            }
            Ok(None) if reader.is_done() => {
                if let Some(sg) = reader.subgroup() {
                    track.subgroup_end(header.group, sg, true);
                }
                return Ok(());
            }
            Ok(None) => {}
            Err(DecodeError::TooLong) => {
                return Err(SessionError::protocol(
                    "object larger than the relay's limit",
                ))
            }
            Err(e) => return Err(e.into()),
        }
        match stream.read_chunk(reader.read_hint()).await {
            Ok(Some(c)) => reader.push(c),
            Ok(None) => reader.finish(),
            Err(_) => {
                // Reset by the publisher: the subgroup ends without its FIN.
                if let Some(sg) = reader.subgroup() {
                    track.subgroup_end(header.group, sg, false);
                }
                return Ok(());
            }
        }
    }
}

pub(super) fn on_datagram(relay: &Arc<Relay>, h: &SessionHandle, d: Bytes) -> Result<()> {
    let mut s = &d[..];
    let t = get_vi64(&mut s)?;
    if t == moqt::data::PADDING_DATAGRAM {
        return Ok(());
    }
    let dg = ObjectDatagram::decode(&d)?;
    if dg.payload.len() > relay.config.max_object_size {
        return Err(SessionError::protocol("datagram object too large"));
    }
    // The PUBLISH or SUBSCRIBE_OK naming this alias may still be in flight
    // on its own stream: then the datagram is held until it is known.
    let Some(track) = h.aliases.route_datagram(dg.track_alias, d) else {
        return Ok(());
    };
    let priority = dg.priority.unwrap_or_else(|| track.info().default_priority);
    track.publish(Object {
        group: dg.group,
        subgroup: None,
        object_id: dg.object_id,
        priority,
        properties: dg.properties,
        status: dg.status.unwrap_or(ObjectStatus::Normal),
        payload: dg.payload,
        end_of_group: dg.end_of_group,
        received: Instant::now(),
        datagram: Default::default(),
    });
    Ok(())
}
