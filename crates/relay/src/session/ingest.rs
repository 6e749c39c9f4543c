//! Data from publishers: the unidirectional streams the peer opens (its
//! control stream, subgroup streams) and its datagrams, including datagrams
//! that arrive before the alias naming their track is known.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use moqt::coding::{get_len, get_lp_bytes, get_vi64};
use moqt::data::{
    ObjectDatagram, ObjectStatus, StreamType, SubgroupHeader, SubgroupId, SubgroupObject,
};
use moqt::error::reset;
use moqt::session::SessionError;
use moqt::DecodeError;
use quichub_net::io::{read_prefix, MessageReader, ReadError};
use web_transport_quinn::RecvStream;

use super::{on_control, read_err, Result, SessionHandle};
use crate::core::Relay;
use crate::object::Object;

impl SessionHandle {
    /// Delivers datagrams that arrived before their alias was known.
    pub(super) fn replay_early(&self, relay: &Arc<Relay>, alias: u64) {
        let held = self.early_datagrams.lock().expect("early").take(alias);
        for d in held {
            let _ = on_datagram(relay, self, d);
        }
    }
}

/// A unidirectional stream: the peer's control stream, a subgroup, a fetch
/// response or padding.
pub(super) async fn on_uni(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    mut stream: RecvStream,
) -> Result<()> {
    // Before SETUP the setup timeout bounds the wait; after it, this does.
    let header_timeout = Duration::from_millis(relay.config.stream_header_timeout_ms);
    let typed = async {
        h.wait_setup().await;
        tokio::time::sleep(header_timeout).await
    };
    let (ty, rest) = tokio::select! {
        biased;
        r = read_prefix(&mut stream, 16, get_vi64) => match r {
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
            on_control(relay, h, MessageReader::new(stream, &prefix)).await
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
    let mut buf = BytesMut::from(&rest[..]);
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.stream_header_timeout_ms);
    let id = loop {
        let mut s = &buf[..];
        match get_vi64(&mut s) {
            Ok(id) => {
                let used = buf.len() - s.len();
                let _ = buf.split_to(used);
                break id;
            }
            Err(DecodeError::Short) => {
                match tokio::time::timeout_at(deadline, stream.read_chunk(64, true)).await {
                    Ok(Ok(Some(c))) => buf.extend_from_slice(&c.bytes),
                    Ok(Ok(None)) | Ok(Err(_)) => return Ok(()),
                    Err(_) => {
                        relay.metrics.stream_header_timeouts.fetch_add(1, Relaxed);
                        let _ = stream.stop(reset::CANCELLED);
                        return Ok(());
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    let waiter = h.fetch_streams.lock().expect("fetch streams").remove(&id);
    match waiter {
        Some(tx) => {
            let _ = tx.send((stream, buf.freeze()));
        }
        None => {
            let _ = stream.stop(reset::CANCELLED);
        }
    }
    Ok(())
}

/// Bytes one subgroup object occupies, from its header, without needing its
/// payload yet (so a large payload is gathered in one buffer, not re-copied).
fn object_len(buf: &[u8], props: bool, max: usize) -> std::result::Result<usize, DecodeError> {
    let mut s = buf;
    get_vi64(&mut s)?;
    if props {
        get_lp_bytes(&mut s, moqt::data::MAX_PROPERTIES)?;
    }
    let len = get_len(&mut s, max)?;
    if len == 0 {
        get_vi64(&mut s)?;
    }
    Ok(buf.len() - s.len() + len)
}

async fn on_subgroup(
    relay: &Arc<Relay>,
    h: &Arc<SessionHandle>,
    t: u8,
    mut stream: RecvStream,
    mut buf: Bytes,
) -> Result<()> {
    let mut acc = BytesMut::new();
    acc.extend_from_slice(&buf);
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(relay.config.stream_header_timeout_ms);
    let (header, rest) = {
        loop {
            let mut s = &acc[..];
            match SubgroupHeader::decode_after_type(t, &mut s) {
                Ok(hd) => {
                    let used = acc.len() - s.len();
                    break (hd, acc.split_off(used).freeze());
                }
                Err(DecodeError::Short) if acc.len() < 64 => {}
                Err(e) => return Err(e.into()),
            }
            let chunk = match tokio::time::timeout_at(deadline, stream.read_chunk(4096, true)).await
            {
                Ok(c) => c,
                Err(_) => {
                    relay.metrics.stream_header_timeouts.fetch_add(1, Relaxed);
                    let _ = stream.stop(reset::CANCELLED);
                    return Ok(());
                }
            };
            match chunk {
                Ok(Some(c)) => acc.extend_from_slice(&c.bytes),
                Ok(None) => {
                    return Err(SessionError::protocol(
                        "stream ended inside SUBGROUP_HEADER",
                    ))
                }
                Err(_) => return Ok(()),
            }
        }
    };
    buf = rest;
    // The alias may be announced by a SUBSCRIBE_OK still in flight: wait briefly.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let track = loop {
        let wait = h.alias_added.notified();
        if let Some(t) = h
            .aliases
            .lock()
            .expect("aliases")
            .get(&header.track_alias)
            .cloned()
        {
            break Some(t);
        }
        if tokio::time::timeout_at(deadline, wait).await.is_err() {
            break None;
        }
    };
    let Some(track) = track else {
        let _ = stream.stop(reset::CANCELLED);
        return Ok(());
    };
    // Open until this handler returns, however it returns: PUBLISH_DONE
    // waits for the streams it counts.
    let _counted = track.upstream_stream();
    let default_priority = track.info().default_priority;
    let priority = header.priority.unwrap_or(default_priority);
    let max = relay.config.max_object_size;
    let mut prev: Option<u64> = None;
    let mut subgroup_id: Option<u64> = match header.subgroup {
        SubgroupId::Zero => Some(0),
        SubgroupId::Explicit(v) => Some(v),
        SubgroupId::FirstObject => None,
    };
    loop {
        // Gather one whole object into `buf`.
        let need = loop {
            match object_len(&buf, header.has_properties, max) {
                Ok(n) if buf.len() >= n => break Some(n),
                Ok(n) => {
                    // Header known: gather exactly the rest in one buffer.
                    let mut m = BytesMut::with_capacity(n);
                    m.extend_from_slice(&buf);
                    while m.len() < n {
                        match stream.read_chunk(n - m.len(), true).await {
                            Ok(Some(c)) => m.extend_from_slice(&c.bytes),
                            Ok(None) => {
                                return Err(SessionError::protocol(
                                    "subgroup stream ended mid-object",
                                ))
                            }
                            Err(_) => {
                                if let Some(sg) = subgroup_id {
                                    track.subgroup_end(header.group, sg, false);
                                }
                                return Ok(());
                            }
                        }
                    }
                    buf = m.freeze();
                }
                Err(DecodeError::Short) => match stream.read_chunk(64 * 1024, true).await {
                    Ok(Some(c)) => {
                        buf = if buf.is_empty() {
                            c.bytes
                        } else {
                            let mut m = BytesMut::with_capacity(buf.len() + c.bytes.len());
                            m.extend_from_slice(&buf);
                            m.extend_from_slice(&c.bytes);
                            m.freeze()
                        }
                    }
                    Ok(None) if buf.is_empty() => break None,
                    Ok(None) => {
                        return Err(SessionError::protocol("subgroup stream ended mid-object"))
                    }
                    Err(_) => {
                        if let Some(sg) = subgroup_id {
                            track.subgroup_end(header.group, sg, false);
                        }
                        return Ok(());
                    }
                },
                Err(DecodeError::TooLong) => {
                    return Err(SessionError::protocol(
                        "object larger than the relay's limit",
                    ))
                }
                Err(e) => return Err(e.into()),
            }
        };
        let Some(n) = need else {
            if let Some(sg) = subgroup_id {
                track.subgroup_end(header.group, sg, true);
            }
            return Ok(());
        };
        let frame = buf.split_to(n);
        let mut s = &frame[..];
        let obj = SubgroupObject::decode(&mut s, &frame, prev, header.has_properties, max)?;
        prev = Some(obj.object_id);
        let sg = *subgroup_id.get_or_insert(obj.object_id);
        track.publish(Object {
            group: header.group,
            subgroup: Some(sg),
            object_id: obj.object_id,
            priority,
            properties: obj.properties,
            status: obj.status,
            payload: obj.payload,
            end_of_group: false,
            received: Instant::now(),
            datagram: Default::default(),
        });
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
    let track = {
        let aliases = h.aliases.lock().expect("aliases");
        match aliases.get(&dg.track_alias) {
            Some(t) => t.clone(),
            None => {
                // The PUBLISH or SUBSCRIBE_OK naming this alias may still be in
                // flight on its own stream: hold the datagram (bounded in count
                // and age) until the alias is known. Pushed under the aliases
                // lock, so an alias added meanwhile replays it (`replay_early`
                // runs after the insert).
                h.early_datagrams
                    .lock()
                    .expect("early")
                    .push(dg.track_alias, d);
                return Ok(());
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_len_counts_header_and_payload_before_the_payload_arrives() {
        // Object ID delta 0, payload length 3, payload.
        assert_eq!(object_len(b"\x00\x03abc", false, 100).unwrap(), 5);
        assert_eq!(object_len(b"\x00\x03a", false, 100).unwrap(), 5);
        // With an (empty) properties field.
        assert_eq!(object_len(b"\x00\x00\x02xy", true, 100).unwrap(), 5);
        // An empty payload carries an Object Status instead.
        assert_eq!(object_len(b"\x00\x00\x03", false, 100).unwrap(), 3);
    }

    #[test]
    fn object_len_needs_the_whole_header_and_keeps_the_size_limit() {
        assert!(matches!(
            object_len(b"", false, 100),
            Err(DecodeError::Short)
        ));
        assert!(matches!(
            object_len(b"\x00", false, 100),
            Err(DecodeError::Short)
        ));
        // Status missing after a zero length.
        assert!(matches!(
            object_len(b"\x00\x00", false, 100),
            Err(DecodeError::Short)
        ));
        assert!(matches!(
            object_len(b"\x00\x0b", false, 10),
            Err(DecodeError::TooLong)
        ));
    }
}
