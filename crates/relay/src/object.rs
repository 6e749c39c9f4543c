//! Objects as they flow through the relay: stored once, shared by reference.

use std::sync::OnceLock;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use moqt::data::{ObjectDatagram, ObjectStatus};
use moqt::Location;

/// One object, immutable once received. Subscribers share it through `Arc`.
#[derive(Debug, Clone)]
pub struct Object {
    /// Group ID.
    pub group: u64,
    /// Subgroup ID, or `None` when the object travels as a datagram.
    pub subgroup: Option<u64>,
    /// Object ID.
    pub object_id: u64,
    /// Publisher Priority (resolved from the header or the track default).
    pub priority: u8,
    /// Raw Object Properties, forwarded unchanged.
    pub properties: Bytes,
    /// Status (Normal, EndOfGroup, EndOfTrack).
    pub status: ObjectStatus,
    /// Payload; a slice of the buffer it arrived in.
    pub payload: Bytes,
    /// Datagram END_OF_GROUP flag.
    pub end_of_group: bool,
    /// When the relay received its first byte (for delivery timeouts and cache age).
    pub received: Instant,
    /// The OBJECT_DATAGRAM encoding, made on first use and shared by every
    /// subscriber: the relay uses the same Track Alias (the track's id) in every
    /// downstream session, so the bytes are identical.
    pub datagram: DatagramCache,
}

/// An object's datagram encodings, each made once, on first use.
#[derive(Debug, Clone, Default)]
pub struct DatagramCache {
    plain: OnceLock<Bytes>,
    /// The encoding behind a WebTransport session's datagram header, with
    /// the header's length: made for the first header asked for, which every
    /// session whose CONNECT stream has the same ID shares (in practice all of
    /// them: browsers open the CONNECT as the connection's first stream).
    framed: OnceLock<(usize, Bytes)>,
}

impl Object {
    /// The object's Location.
    pub fn location(&self) -> Location {
        Location::new(self.group, self.object_id)
    }

    /// The OBJECT_DATAGRAM bytes for `alias`, encoded once.
    pub fn datagram(&self, alias: u64) -> Bytes {
        self.datagram
            .plain
            .get_or_init(|| {
                let d = ObjectDatagram {
                    track_alias: alias,
                    group: self.group,
                    object_id: self.object_id,
                    priority: Some(self.priority),
                    properties: self.properties.clone(),
                    end_of_group: self.end_of_group && self.status == ObjectStatus::Normal,
                    status: (self.status != ObjectStatus::Normal).then_some(self.status),
                    payload: self.payload.clone(),
                };
                let mut b =
                    BytesMut::with_capacity(16 + self.payload.len() + self.properties.len());
                d.encode(&mut b);
                b.freeze()
            })
            .clone()
    }

    /// `header` followed by the OBJECT_DATAGRAM bytes for `alias`, encoded
    /// once; `None` when the encoding was made for another header, and the
    /// session must put its header in front itself.
    pub fn framed_datagram(&self, alias: u64, header: &[u8]) -> Option<Bytes> {
        let (len, framed) = self.datagram.framed.get_or_init(|| {
            let d = self.datagram(alias);
            let mut b = BytesMut::with_capacity(header.len() + d.len());
            b.extend_from_slice(header);
            b.extend_from_slice(&d);
            (header.len(), b.freeze())
        });
        (framed[..*len] == *header).then(|| framed.clone())
    }

    /// Bytes the cache accounts for this object.
    pub fn cache_size(&self) -> usize {
        self.payload.len() + self.properties.len() + 48
    }
}

/// What a track's fan-out ring carries.
#[derive(Debug, Clone)]
pub enum TrackEvent {
    /// A new object.
    Object(std::sync::Arc<Object>),
    /// The upstream subgroup stream ended: `fin` true for a clean FIN, false for a reset.
    SubgroupEnd {
        /// Group ID.
        group: u64,
        /// Subgroup ID.
        subgroup: u64,
        /// Clean end.
        fin: bool,
    },
}
