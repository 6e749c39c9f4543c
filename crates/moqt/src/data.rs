//! Data streams and datagrams (draft-18 §11): SUBGROUP_HEADER and its objects,
//! OBJECT_DATAGRAM, FETCH_HEADER and fetch objects, and padding.
//!
//! Object payloads are never copied on decode: they are `Bytes` slices of the
//! buffer the caller passes in, so a relay stores and forwards them as they came.

use bytes::{BufMut, Bytes};

use crate::coding::*;
use crate::error::DecodeError;

/// Unidirectional stream type of a FETCH_HEADER.
pub const FETCH_HEADER: u64 = 0x05;
/// Unidirectional stream type of a padding stream.
pub const PADDING_STREAM: u64 = 0x132B_3E28;
/// Datagram type of a padding datagram.
pub const PADDING_DATAGRAM: u64 = 0x132B_3E29;
/// Upper bound on one object's payload we accept (configurable above this layer).
pub const MAX_OBJECT_PAYLOAD: usize = 16 * 1024 * 1024;
/// Upper bound on an object's property block.
pub const MAX_PROPERTIES: usize = 0xffff;

/// Object Status (§11.2.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ObjectStatus {
    /// A normal object (payload may be empty).
    #[default]
    Normal,
    /// No objects with this or a larger Object ID exist in the group.
    EndOfGroup,
    /// No objects at this or a larger Location exist in the track.
    EndOfTrack,
}

impl ObjectStatus {
    /// Wire value.
    pub fn code(self) -> u64 {
        match self {
            Self::Normal => 0,
            Self::EndOfGroup => 3,
            Self::EndOfTrack => 4,
        }
    }

    /// Parses a wire value; others are protocol violations.
    pub fn from_code(v: u64) -> Result<Self, DecodeError> {
        match v {
            0 => Ok(Self::Normal),
            3 => Ok(Self::EndOfGroup),
            4 => Ok(Self::EndOfTrack),
            _ => Err(DecodeError::Invalid("object status")),
        }
    }
}

/// What a unidirectional stream carries, from its first `vi64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamType {
    /// SUBGROUP_HEADER with the given type byte.
    Subgroup(u8),
    /// FETCH_HEADER.
    Fetch,
    /// The peer's control stream (SETUP).
    Control,
    /// Padding.
    Padding,
}

impl StreamType {
    /// Reads the stream type at the front of `buf` without consuming it; returns the
    /// type and how many bytes it occupies.
    ///
    /// For [`StreamType::Control`] the stream type *is* the SETUP message's Type
    /// field (0x2F00 is written once, §3.3 and §10.3), so the caller must hand the
    /// stream to a [`crate::session::FrameReader`] from its first byte, type
    /// included. For the other types the caller skips the returned length.
    pub fn peek(buf: &[u8]) -> Result<(Self, usize), DecodeError> {
        let mut s = buf;
        let v = get_vi64(&mut s)?;
        Ok((Self::from_code(v)?, buf.len() - s.len()))
    }

    /// Classifies a stream type value; unknown values close the session.
    pub fn from_code(v: u64) -> Result<Self, DecodeError> {
        match v {
            FETCH_HEADER => Ok(Self::Fetch),
            crate::message::ty::SETUP => Ok(Self::Control),
            PADDING_STREAM => Ok(Self::Padding),
            v if v < 0x80 && SubgroupHeader::valid_type(v as u8) => Ok(Self::Subgroup(v as u8)),
            v => Err(DecodeError::UnknownType(v)),
        }
    }
}

/// SUBGROUP_HEADER (§11.4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubgroupHeader {
    /// Track Alias.
    pub track_alias: u64,
    /// Group ID.
    pub group: u64,
    /// How the subgroup ID is carried, and its value when known.
    pub subgroup: SubgroupId,
    /// Publisher Priority; `None` inherits the subscription's default.
    pub priority: Option<u8>,
    /// Every object carries a property block.
    pub has_properties: bool,
    /// This subgroup holds the group's largest object.
    pub end_of_group: bool,
    /// The first object on the stream is the subgroup's first.
    pub first_object: bool,
}

/// The SUBGROUP_ID_MODE of a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubgroupId {
    /// Absent; the subgroup ID is 0.
    Zero,
    /// Absent; the subgroup ID is the first object's ID.
    FirstObject,
    /// Present with this value.
    Explicit(u64),
}

impl SubgroupHeader {
    /// True for the valid SUBGROUP_HEADER types: form 0b0XX1XXXX, mode != 0b11.
    pub fn valid_type(t: u8) -> bool {
        t & 0x90 == 0x10 && (t & 0x06) != 0x06
    }

    /// The type byte this header encodes as.
    pub fn type_byte(&self) -> u8 {
        let mut t = 0x10u8;
        if self.has_properties {
            t |= 0x01;
        }
        t |= match self.subgroup {
            SubgroupId::Zero => 0,
            SubgroupId::FirstObject => 0x02,
            SubgroupId::Explicit(_) => 0x04,
        };
        if self.end_of_group {
            t |= 0x08;
        }
        if self.priority.is_none() {
            t |= 0x20;
        }
        if self.first_object {
            t |= 0x40;
        }
        t
    }

    /// Encodes the header (type included).
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        put_vi64(buf, self.type_byte() as u64);
        put_vi64(buf, self.track_alias);
        put_vi64(buf, self.group);
        if let SubgroupId::Explicit(id) = self.subgroup {
            put_vi64(buf, id);
        }
        if let Some(p) = self.priority {
            buf.put_u8(p);
        }
    }

    /// Decodes the rest of a header whose type byte `t` was already read. On error
    /// `buf` is left untouched.
    pub fn decode_after_type(t: u8, buf: &mut &[u8]) -> Result<Self, DecodeError> {
        let mut cur = *buf;
        let h = Self::decode_fields(t, &mut cur)?;
        *buf = cur;
        Ok(h)
    }

    fn decode_fields(t: u8, buf: &mut &[u8]) -> Result<Self, DecodeError> {
        if !Self::valid_type(t) {
            return Err(DecodeError::UnknownType(t as u64));
        }
        let track_alias = get_vi64(buf)?;
        let group = get_vi64(buf)?;
        let subgroup = match (t & 0x06) >> 1 {
            0 => SubgroupId::Zero,
            1 => SubgroupId::FirstObject,
            _ => SubgroupId::Explicit(get_vi64(buf)?),
        };
        let priority = if t & 0x20 == 0 {
            Some(get_u8(buf)?)
        } else {
            None
        };
        Ok(Self {
            track_alias,
            group,
            subgroup,
            priority,
            has_properties: t & 0x01 != 0,
            end_of_group: t & 0x08 != 0,
            first_object: t & 0x40 != 0,
        })
    }

    /// Decodes a header including its type. On error `buf` is left untouched.
    pub fn decode(buf: &mut &[u8]) -> Result<Self, DecodeError> {
        let mut cur = *buf;
        let t = get_vi64(&mut cur)?;
        if t >= 0x80 {
            return Err(DecodeError::UnknownType(t));
        }
        let h = Self::decode_fields(t as u8, &mut cur)?;
        *buf = cur;
        Ok(h)
    }
}

/// One object as carried on a subgroup stream, with its ID resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubgroupObject {
    /// Absolute Object ID.
    pub object_id: u64,
    /// Raw property block (Key-Value-Pairs), kept as bytes for forwarding.
    pub properties: Bytes,
    /// Object status.
    pub status: ObjectStatus,
    /// Payload (empty unless status is Normal).
    pub payload: Bytes,
}

impl SubgroupObject {
    /// Encodes the object fields given the previous Object ID on the stream
    /// (`None` for the first object). Returns `Err`, writing nothing, if IDs do not
    /// increase, if a status other than Normal comes with a payload or properties,
    /// or if the object has properties but the header lacks the PROPERTIES bit.
    pub fn encode<B: BufMut + ?Sized>(
        &self,
        buf: &mut B,
        prev: Option<u64>,
        with_properties: bool,
    ) -> Result<(), DecodeError> {
        self.encode_header(buf, prev, with_properties)?;
        buf.put_slice(&self.payload);
        Ok(())
    }

    /// Encodes everything but the payload, so the IO layer can write the payload
    /// `Bytes` without copying it.
    pub fn encode_header<B: BufMut + ?Sized>(
        &self,
        buf: &mut B,
        prev: Option<u64>,
        with_properties: bool,
    ) -> Result<(), DecodeError> {
        self.encode_header_with_len(buf, prev, with_properties, self.payload.len())
    }

    /// Like [`Self::encode_header`] for a payload of `payload_len` bytes held
    /// elsewhere (`self.payload` is ignored).
    pub fn encode_header_with_len<B: BufMut + ?Sized>(
        &self,
        buf: &mut B,
        prev: Option<u64>,
        with_properties: bool,
        payload_len: usize,
    ) -> Result<(), DecodeError> {
        let delta = match prev {
            None => self.object_id,
            Some(p) => p
                .checked_add(1)
                .and_then(|next| self.object_id.checked_sub(next))
                .ok_or(DecodeError::Invalid(
                    "object IDs must increase in a subgroup",
                ))?,
        };
        if self.status != ObjectStatus::Normal {
            if payload_len != 0 {
                return Err(DecodeError::Invalid("payload on a status object"));
            }
            if !self.properties.is_empty() {
                return Err(DecodeError::Invalid("properties on a status object"));
            }
        }
        if !with_properties && !self.properties.is_empty() {
            return Err(DecodeError::Invalid(
                "object properties on a subgroup without the PROPERTIES bit",
            ));
        }
        put_vi64(buf, delta);
        if with_properties {
            put_lp_bytes(buf, &self.properties);
        }
        put_vi64(buf, payload_len as u64);
        if payload_len == 0 {
            put_vi64(buf, self.status.code());
        }
        Ok(())
    }

    /// Decodes one object from `buf`, zero-copy from `src`, given the previous
    /// Object ID on the stream. On error `buf` is left untouched.
    pub fn decode(
        buf: &mut &[u8],
        src: &Bytes,
        prev: Option<u64>,
        with_properties: bool,
        max_payload: usize,
    ) -> Result<Self, DecodeError> {
        let mut cur = *buf;
        let o = Self::decode_inner(&mut cur, src, prev, with_properties, max_payload)?;
        *buf = cur;
        Ok(o)
    }

    fn decode_inner(
        buf: &mut &[u8],
        src: &Bytes,
        prev: Option<u64>,
        with_properties: bool,
        max_payload: usize,
    ) -> Result<Self, DecodeError> {
        let delta = get_vi64(buf)?;
        let object_id = match prev {
            None => delta,
            Some(p) => p
                .checked_add(delta)
                .and_then(|v| v.checked_add(1))
                .ok_or(DecodeError::Invalid("object ID overflow"))?,
        };
        let properties = if with_properties {
            slice_of(src, get_lp_bytes(buf, MAX_PROPERTIES)?)
        } else {
            Bytes::new()
        };
        let len = get_len(buf, max_payload)?;
        let (status, payload) = if len == 0 {
            let status = ObjectStatus::from_code(get_vi64(buf)?)?;
            if status != ObjectStatus::Normal && !properties.is_empty() {
                return Err(DecodeError::Invalid("properties on a status object"));
            }
            (status, Bytes::new())
        } else {
            (ObjectStatus::Normal, slice_of(src, get_bytes(buf, len)?))
        };
        Ok(Self {
            object_id,
            properties,
            status,
            payload,
        })
    }
}

/// OBJECT_DATAGRAM (§11.3.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectDatagram {
    /// Track Alias.
    pub track_alias: u64,
    /// Group ID.
    pub group: u64,
    /// Object ID.
    pub object_id: u64,
    /// Publisher Priority; `None` inherits the subscription's default.
    pub priority: Option<u8>,
    /// Raw property block (empty = none).
    pub properties: Bytes,
    /// The group ends with this object.
    pub end_of_group: bool,
    /// `Some` when the datagram carries a status instead of a payload.
    pub status: Option<ObjectStatus>,
    /// Payload.
    pub payload: Bytes,
}

impl ObjectDatagram {
    /// True for valid datagram types: 0b00X0XXXX without STATUS|END_OF_GROUP.
    pub fn valid_type(t: u64) -> bool {
        t < 0x30 && t & 0x10 == 0 && !(t & 0x20 != 0 && t & 0x02 != 0)
    }

    /// How the object goes on the wire: the Object Status field (if the STATUS bit
    /// is set), whether the END_OF_GROUP bit is set, and whether properties are
    /// written.
    ///
    /// STATUS and END_OF_GROUP cannot be combined (types 0x22/0x23/... are
    /// invalid), so a Normal status that ends the group is sent in the payload form
    /// with an empty payload (the same object), and END_OF_GROUP is dropped from an
    /// EndOfGroup or EndOfTrack status, which already says no later object exists.
    /// Properties are never written for a status other than Normal (§11.2.1.2);
    /// [`Self::validate`] reports that inconsistency.
    fn wire_form(&self) -> (Option<ObjectStatus>, bool, bool) {
        match self.status {
            None => (None, self.end_of_group, !self.properties.is_empty()),
            Some(ObjectStatus::Normal) if self.end_of_group => {
                (None, true, !self.properties.is_empty())
            }
            Some(ObjectStatus::Normal) => (
                Some(ObjectStatus::Normal),
                false,
                !self.properties.is_empty(),
            ),
            Some(s) => (Some(s), false, false),
        }
    }

    /// Checks that the datagram encodes exactly as described: no properties on a
    /// status other than Normal, and no payload alongside a status.
    pub fn validate(&self) -> Result<(), DecodeError> {
        match self.status {
            Some(s) if s != ObjectStatus::Normal && !self.properties.is_empty() => {
                Err(DecodeError::Invalid("properties on a status object"))
            }
            Some(_) if !self.payload.is_empty() => {
                Err(DecodeError::Invalid("payload on a status datagram"))
            }
            _ => Ok(()),
        }
    }

    /// The type this datagram encodes as (always a valid OBJECT_DATAGRAM type).
    pub fn type_code(&self) -> u64 {
        let (status, end_of_group, properties) = self.wire_form();
        let mut t = 0u64;
        if properties {
            t |= 0x01;
        }
        if end_of_group {
            t |= 0x02;
        }
        if self.object_id == 0 {
            t |= 0x04;
        }
        if self.priority.is_none() {
            t |= 0x08;
        }
        if status.is_some() {
            t |= 0x20;
        }
        t
    }

    /// Encodes everything but the payload.
    pub fn encode_header<B: BufMut + ?Sized>(&self, buf: &mut B) {
        let (status, _, _) = self.wire_form();
        let t = self.type_code();
        put_vi64(buf, t);
        put_vi64(buf, self.track_alias);
        put_vi64(buf, self.group);
        if t & 0x04 == 0 {
            put_vi64(buf, self.object_id);
        }
        if let Some(p) = self.priority {
            buf.put_u8(p);
        }
        if t & 0x01 != 0 {
            put_lp_bytes(buf, &self.properties);
        }
        if let Some(s) = status {
            put_vi64(buf, s.code());
        }
    }

    /// Encodes the whole datagram. A payload is only written when `status` is
    /// `None`.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        self.encode_header(buf);
        if self.status.is_none() {
            buf.put_slice(&self.payload);
        }
    }

    /// Decodes a whole datagram; the payload is a zero-copy slice of `src`.
    pub fn decode(src: &Bytes) -> Result<Self, DecodeError> {
        let mut buf = &src[..];
        let t = get_vi64(&mut buf)?;
        if !Self::valid_type(t) {
            return Err(DecodeError::UnknownType(t));
        }
        let track_alias = get_vi64(&mut buf)?;
        let group = get_vi64(&mut buf)?;
        let object_id = if t & 0x04 != 0 {
            0
        } else {
            get_vi64(&mut buf)?
        };
        let priority = if t & 0x08 != 0 {
            None
        } else {
            Some(get_u8(&mut buf)?)
        };
        let properties = if t & 0x01 != 0 {
            let p = get_lp_bytes(&mut buf, MAX_PROPERTIES)?;
            if p.is_empty() {
                return Err(DecodeError::Invalid("empty datagram properties"));
            }
            slice_of(src, p)
        } else {
            Bytes::new()
        };
        let (status, payload) = if t & 0x20 != 0 {
            let s = ObjectStatus::from_code(get_vi64(&mut buf)?)?;
            if s != ObjectStatus::Normal && !properties.is_empty() {
                return Err(DecodeError::Invalid("properties on a status object"));
            }
            if !buf.is_empty() {
                return Err(DecodeError::Invalid("payload after datagram status"));
            }
            (Some(s), Bytes::new())
        } else {
            (None, slice_of(src, buf))
        };
        Ok(Self {
            track_alias,
            group,
            object_id,
            priority,
            properties,
            end_of_group: t & 0x02 != 0,
            status,
            payload,
        })
    }
}

/// Serialization Flags special values of a fetch stream (§11.4.4).
pub const END_OF_NONEXISTENT_RANGE: u64 = 0x8C;
/// End of Unknown Range.
pub const END_OF_UNKNOWN_RANGE: u64 = 0x10C;

/// One entry on a FETCH stream, with every field resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchEntry {
    /// An object.
    Object(FetchObject),
    /// Objects between the previous entry and this Location do not exist.
    EndOfNonExistentRange(Location),
    /// Objects between the previous entry and this Location are unknown.
    EndOfUnknownRange(Location),
}

/// An object on a FETCH stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchObject {
    /// Group ID.
    pub group: u64,
    /// Subgroup ID; `None` for objects sent as datagrams.
    pub subgroup: Option<u64>,
    /// Object ID.
    pub object_id: u64,
    /// Publisher Priority.
    pub priority: u8,
    /// Raw property block.
    pub properties: Bytes,
    /// Payload.
    pub payload: Bytes,
}

/// Encoder/decoder state of a FETCH stream: the fields of the prior object
/// that the Serialization Flags refer to.
#[derive(Debug, Clone, Default)]
pub struct FetchState {
    descending: bool,
    prev_group: Option<u64>,
    prev_object: Option<u64>,
    prev_subgroup: Option<u64>,
    prev_priority: Option<u8>,
    /// The previous object was sent as a datagram (no Subgroup ID).
    prev_was_datagram: bool,
}

impl FetchState {
    /// New state for a response in the given group order.
    pub fn new(descending: bool) -> Self {
        Self {
            descending,
            ..Default::default()
        }
    }

    /// Encodes an entry, choosing the most compact flags.
    ///
    /// # Panics
    /// If the entry cannot follow the previous one on this stream (see
    /// [`Self::try_encode`]). Entries produced by [`Self::decode`] are always
    /// encodable in the same order, so a relay forwarding a fetch never panics.
    pub fn encode<B: BufMut + ?Sized>(&mut self, buf: &mut B, e: &FetchEntry) {
        if let Err(err) = self.try_encode(buf, e) {
            panic!("unencodable fetch entry {e:?}: {err}");
        }
    }

    /// Encodes an entry, choosing the most compact flags, or returns an error and
    /// writes nothing when the entry cannot be expressed after the previous one:
    /// a group that goes against the stream's group order, an Object ID below the
    /// previous one in the same group, or an End of Range in the same group as the
    /// previous entry (its Group ID field is always a delta that moves to another
    /// group, §11.4.4).
    pub fn try_encode<B: BufMut + ?Sized>(
        &mut self,
        buf: &mut B,
        e: &FetchEntry,
    ) -> Result<(), DecodeError> {
        self.try_encode_header(buf, e)?;
        if let FetchEntry::Object(o) = e {
            buf.put_slice(&o.payload);
        }
        Ok(())
    }

    /// Like [`Self::try_encode`] but stops after the Object Payload Length, so the
    /// IO layer can write the payload `Bytes` without copying it.
    pub fn try_encode_header<B: BufMut + ?Sized>(
        &mut self,
        buf: &mut B,
        e: &FetchEntry,
    ) -> Result<(), DecodeError> {
        match e {
            FetchEntry::EndOfNonExistentRange(l) | FetchEntry::EndOfUnknownRange(l) => {
                let flag = if matches!(e, FetchEntry::EndOfNonExistentRange(_)) {
                    END_OF_NONEXISTENT_RANGE
                } else {
                    END_OF_UNKNOWN_RANGE
                };
                // The flags include 0x08 and 0x04, so the group is a delta and the
                // object ID is absolute.
                let group_delta = self.group_delta(l.group)?;
                put_vi64(buf, flag);
                put_vi64(buf, group_delta);
                put_vi64(buf, l.object);
                self.prev_group = Some(l.group);
                self.prev_object = Some(l.object);
            }
            FetchEntry::Object(o) => {
                let mut flags = 0u64;
                let group_same = self.prev_group == Some(o.group);
                let group_delta = if group_same {
                    None
                } else {
                    flags |= 0x08;
                    Some(self.group_delta(o.group)?)
                };
                let object_delta = match (group_same, self.prev_object) {
                    (true, Some(p)) if p.checked_add(1) == Some(o.object_id) => None,
                    (true, Some(p)) => Some(o.object_id.checked_sub(p).ok_or(
                        DecodeError::Invalid("object IDs must not decrease within a group"),
                    )?),
                    _ => Some(o.object_id),
                };
                if object_delta.is_some() {
                    flags |= 0x04;
                }
                // The prior Subgroup ID is only referenced when the prior object had
                // one: after an object sent as a datagram the reference is ambiguous.
                let prior = if self.prev_was_datagram {
                    None
                } else {
                    self.prev_subgroup
                };
                match o.subgroup {
                    None => flags |= 0x40,
                    Some(0) => {}
                    Some(s) if prior == Some(s) => flags |= 0x01,
                    Some(s) if prior.and_then(|p| p.checked_add(1)) == Some(s) => flags |= 0x02,
                    Some(_) => flags |= 0x03,
                }
                if self.prev_priority != Some(o.priority) {
                    flags |= 0x10;
                }
                if !o.properties.is_empty() {
                    flags |= 0x20;
                }
                put_vi64(buf, flags);
                if let Some(d) = group_delta {
                    put_vi64(buf, d);
                }
                if flags & 0x40 == 0 && flags & 0x03 == 0x03 {
                    put_vi64(buf, o.subgroup.unwrap_or(0));
                }
                if let Some(d) = object_delta {
                    put_vi64(buf, d);
                }
                if flags & 0x10 != 0 {
                    buf.put_u8(o.priority);
                }
                if flags & 0x20 != 0 {
                    put_lp_bytes(buf, &o.properties);
                }
                put_vi64(buf, o.payload.len() as u64);
                self.prev_group = Some(o.group);
                self.prev_object = Some(o.object_id);
                if o.subgroup.is_some() {
                    self.prev_subgroup = o.subgroup;
                }
                self.prev_was_datagram = o.subgroup.is_none();
                self.prev_priority = Some(o.priority);
            }
        }
        Ok(())
    }

    /// The Group ID Delta that moves from the previous entry's group to `group`.
    fn group_delta(&self, group: u64) -> Result<u64, DecodeError> {
        match self.prev_group {
            None => Ok(group),
            Some(p) if self.descending => p
                .checked_sub(group)
                .and_then(|d| d.checked_sub(1))
                .ok_or(DecodeError::Invalid(
                    "groups must decrease in a descending fetch",
                )),
            Some(p) => {
                group
                    .checked_sub(p)
                    .and_then(|d| d.checked_sub(1))
                    .ok_or(DecodeError::Invalid(
                        "groups must increase in an ascending fetch",
                    ))
            }
        }
    }

    /// Decodes one entry, zero-copy from `src`. On any error (including
    /// [`DecodeError::Short`]) neither `buf` nor the state changes, so the caller
    /// can retry with more bytes.
    pub fn decode(
        &mut self,
        buf: &mut &[u8],
        src: &Bytes,
        max_payload: usize,
    ) -> Result<FetchEntry, DecodeError> {
        let mut cur = *buf;
        let e = self.decode_inner(&mut cur, src, max_payload, None)?;
        *buf = cur;
        Ok(e)
    }

    /// After [`Self::decode`] said [`DecodeError::Short`]: how many bytes the
    /// entry at the start of `buf` needs in all, once its header is whole
    /// (`None` while the header itself is cut). A reader that buffers a
    /// large object can wait for exactly that many instead of retrying on
    /// every read.
    pub fn needed(&self, buf: &[u8], src: &Bytes, max_payload: usize) -> Option<usize> {
        let mut st = self.clone();
        let mut cur = buf;
        let mut len = None;
        let _ = st.decode_inner(&mut cur, src, max_payload, Some(&mut len));
        len.map(|l| (buf.len() - cur.len()).saturating_add(l))
    }

    /// Decodes one entry; with `payload_len`, stops after the Object Payload
    /// Length, stores it there and returns [`DecodeError::Short`].
    fn decode_inner(
        &mut self,
        buf: &mut &[u8],
        src: &Bytes,
        max_payload: usize,
        payload_len: Option<&mut Option<usize>>,
    ) -> Result<FetchEntry, DecodeError> {
        let flags = get_vi64(buf)?;
        if flags == END_OF_NONEXISTENT_RANGE || flags == END_OF_UNKNOWN_RANGE {
            let group = self.read_group(buf)?;
            let object = get_vi64(buf)?;
            self.prev_group = Some(group);
            self.prev_object = Some(object);
            let l = Location::new(group, object);
            return Ok(if flags == END_OF_NONEXISTENT_RANGE {
                FetchEntry::EndOfNonExistentRange(l)
            } else {
                FetchEntry::EndOfUnknownRange(l)
            });
        }
        if flags >= 0x80 {
            return Err(DecodeError::Invalid("serialization flags"));
        }
        let first = self.prev_group.is_none();
        if first && (flags & 0x08 == 0 || flags & 0x04 == 0) {
            return Err(DecodeError::Invalid(
                "first fetch object must carry group and object",
            ));
        }
        let group = if flags & 0x08 != 0 {
            self.read_group(buf)?
        } else {
            self.prev_group
                .ok_or(DecodeError::Invalid("no prior group"))?
        };
        let subgroup = if flags & 0x40 != 0 {
            None
        } else {
            Some(match flags & 0x03 {
                0 => 0,
                1 => self
                    .prev_subgroup
                    .ok_or(DecodeError::Invalid("no prior subgroup"))?,
                2 => self
                    .prev_subgroup
                    .ok_or(DecodeError::Invalid("no prior subgroup"))?
                    .checked_add(1)
                    .ok_or(DecodeError::Invalid("subgroup overflow"))?,
                _ => get_vi64(buf)?,
            })
        };
        let object_id = if flags & 0x04 != 0 {
            let d = get_vi64(buf)?;
            if flags & 0x08 != 0 {
                d
            } else {
                self.resolve_object(group, Some(d))?
            }
        } else {
            self.resolve_object(group, None)?
        };
        let priority = if flags & 0x10 != 0 {
            get_u8(buf)?
        } else {
            self.prev_priority
                .ok_or(DecodeError::Invalid("no prior priority"))?
        };
        let properties = if flags & 0x20 != 0 {
            slice_of(src, get_lp_bytes(buf, MAX_PROPERTIES)?)
        } else {
            Bytes::new()
        };
        let len = get_len(buf, max_payload)?;
        if let Some(out) = payload_len {
            *out = Some(len);
            return Err(DecodeError::Short);
        }
        let payload = slice_of(src, get_bytes(buf, len)?);
        self.prev_group = Some(group);
        self.prev_object = Some(object_id);
        if subgroup.is_some() {
            self.prev_subgroup = subgroup;
        }
        self.prev_was_datagram = subgroup.is_none();
        self.prev_priority = Some(priority);
        Ok(FetchEntry::Object(FetchObject {
            group,
            subgroup,
            object_id,
            priority,
            properties,
            payload,
        }))
    }

    fn read_group(&self, buf: &mut &[u8]) -> Result<u64, DecodeError> {
        let d = get_vi64(buf)?;
        match self.prev_group {
            None => Ok(d),
            Some(p) if self.descending => p
                .checked_sub(d)
                .and_then(|v| v.checked_sub(1))
                .ok_or(DecodeError::Invalid("group ID underflow")),
            Some(p) => p
                .checked_add(d)
                .and_then(|v| v.checked_add(1))
                .ok_or(DecodeError::Invalid("group ID overflow")),
        }
    }

    fn resolve_object(&self, group: u64, delta: Option<u64>) -> Result<u64, DecodeError> {
        match (self.prev_group, self.prev_object, delta) {
            (Some(g), Some(o), Some(d)) if g == group => o.checked_add(d),
            (_, _, Some(d)) => Some(d),
            (_, Some(o), None) => o.checked_add(1),
            (_, None, None) => None,
        }
        .ok_or(DecodeError::Invalid("object ID overflow"))
    }
}

/// Encodes a FETCH_HEADER.
pub fn encode_fetch_header<B: BufMut + ?Sized>(buf: &mut B, request_id: u64) {
    put_vi64(buf, FETCH_HEADER);
    put_vi64(buf, request_id);
}

mod decoder;
mod read_queue;
mod subgroup_reader;
pub use decoder::FetchDecoder;
pub use subgroup_reader::{SubgroupRead, SubgroupReader, MAX_SUBGROUP_HEADER};

#[cfg(test)]
mod tests;
