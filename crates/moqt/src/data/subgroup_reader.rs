//! Reading a subgroup stream as it arrives (sans-IO): its SUBGROUP_HEADER,
//! then its objects, each out as soon as it is whole. The relay's ingest and
//! the client's subscriptions share it, so both apply the same limits and
//! the same reassembly.
//!
//! Reads are queued, and joined (one copy) once the object's header says
//! all of it is in; an object that fits one read is not copied at all, and
//! a large one arriving in packet-sized reads is not re-parsed per read.

use bytes::Bytes;

use super::read_queue::ReadQueue;
use super::{SubgroupHeader, SubgroupId, SubgroupObject, MAX_PROPERTIES};
use crate::coding::{get_len, get_lp_bytes, get_vi64};
use crate::DecodeError;

/// Longest SUBGROUP_HEADER accepted (its fields are five varints at most).
pub const MAX_SUBGROUP_HEADER: usize = 64;

/// One object of a subgroup stream, with the stream's facts it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubgroupRead {
    /// The Subgroup ID (resolved from the header or the first object).
    pub subgroup: u64,
    /// The object.
    pub object: SubgroupObject,
}

/// The receiving side of one subgroup stream, after its stream type.
#[derive(Debug)]
pub struct SubgroupReader {
    ty: u8,
    header: Option<SubgroupHeader>,
    subgroup: Option<u64>,
    prev: Option<u64>,
    /// Bytes read and not yet decoded.
    buf: ReadQueue,
    /// Decode again once `buf` holds this (the whole object
    /// once its header is in).
    want: usize,
    /// `want` is the whole object (its length is known), not a guess.
    want_exact: bool,
    max_object: usize,
    finished: bool,
}

impl SubgroupReader {
    /// A reader for a stream of SUBGROUP_HEADER type `ty` (already read),
    /// refusing objects larger than `max_object`.
    pub fn new(ty: u8, max_object: usize) -> Self {
        Self {
            ty,
            header: None,
            subgroup: None,
            prev: None,
            buf: ReadQueue::default(),
            want: 0,
            want_exact: false,
            max_object,
            finished: false,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: Bytes) {
        self.buf.push(bytes);
    }

    /// The stream ended with a FIN.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// Whether the stream ended and every object was taken.
    pub fn is_done(&self) -> bool {
        self.finished && self.buf.len() == 0
    }

    /// The most bytes worth reading next: the rest of the object being
    /// gathered once its length is known, else a large read (an object
    /// header cut by a read boundary is not read byte by byte).
    pub fn read_hint(&self) -> usize {
        let have = self.buf.len();
        if self.want_exact && self.want > have {
            self.want - have
        } else {
            64 * 1024
        }
    }

    /// The header, once decoded ([`Self::read_header`]).
    pub fn header(&self) -> Option<&SubgroupHeader> {
        self.header.as_ref()
    }

    /// The Subgroup ID once known (from the header, or from the first
    /// object when the header says so).
    pub fn subgroup(&self) -> Option<u64> {
        self.subgroup
    }

    /// Decodes the SUBGROUP_HEADER once enough bytes are in; `Ok(None)`
    /// until then. An error for a malformed or overlong header, or a stream
    /// that ends inside it.
    pub fn read_header(&mut self) -> Result<Option<&SubgroupHeader>, DecodeError> {
        if self.header.is_none() {
            self.buf.join();
            let mut s = &self.buf.pending[..];
            match SubgroupHeader::decode_after_type(self.ty, &mut s) {
                Ok(h) => {
                    let used = self.buf.pending.len() - s.len();
                    self.buf.pending = self.buf.pending.slice(used..);
                    self.subgroup = match h.subgroup {
                        SubgroupId::Zero => Some(0),
                        SubgroupId::Explicit(v) => Some(v),
                        SubgroupId::FirstObject => None,
                    };
                    self.header = Some(h);
                }
                Err(DecodeError::Short) if self.buf.pending.len() > MAX_SUBGROUP_HEADER => {
                    return Err(DecodeError::TooLong)
                }
                Err(DecodeError::Short) if self.finished => {
                    return Err(DecodeError::Invalid("stream ended inside SUBGROUP_HEADER"))
                }
                Err(DecodeError::Short) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(self.header.as_ref())
    }

    /// The next whole object, or `None` until more bytes come (or at the
    /// end: see [`Self::is_done`]). An error for a malformed object, one
    /// over the size limit, or a stream that ends inside one.
    pub fn next_object(&mut self) -> Result<Option<SubgroupRead>, DecodeError> {
        let Some(props) = self.read_header()?.map(|h| h.has_properties) else {
            return Ok(None);
        };
        let have = self.buf.len();
        if have == 0 || (have < self.want && !self.finished) {
            return Ok(None);
        }
        self.buf.join();
        let n = match object_len(&self.buf.pending, props, self.max_object) {
            Ok(n) if self.buf.pending.len() >= n => n,
            Ok(n) if !self.finished => {
                self.want = n;
                self.want_exact = true;
                return Ok(None);
            }
            Err(DecodeError::Short) if !self.finished => {
                self.want = self.buf.pending.len() + 1;
                self.want_exact = false;
                return Ok(None);
            }
            Ok(_) | Err(DecodeError::Short) => {
                return Err(DecodeError::Invalid(
                    "subgroup stream ended inside an object",
                ))
            }
            Err(e) => return Err(e),
        };
        let frame = self.buf.pending.split_to(n);
        self.want = 0;
        self.want_exact = false;
        let mut s = &frame[..];
        let object = SubgroupObject::decode(&mut s, &frame, self.prev, props, self.max_object)?;
        self.prev = Some(object.object_id);
        let subgroup = *self.subgroup.get_or_insert(object.object_id);
        Ok(Some(SubgroupRead { subgroup, object }))
    }
}

/// Bytes one subgroup object occupies, from its header, without needing its
/// payload yet.
fn object_len(buf: &[u8], props: bool, max: usize) -> Result<usize, DecodeError> {
    let mut s = buf;
    get_vi64(&mut s)?;
    if props {
        get_lp_bytes(&mut s, MAX_PROPERTIES)?;
    }
    let len = get_len(&mut s, max)?;
    if len == 0 {
        get_vi64(&mut s)?;
    }
    Ok(buf.len() - s.len() + len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ObjectStatus;
    use bytes::BytesMut;

    fn header(subgroup: SubgroupId, props: bool) -> SubgroupHeader {
        SubgroupHeader {
            track_alias: 7,
            group: 3,
            subgroup,
            priority: Some(5),
            has_properties: props,
            end_of_group: false,
            first_object: false,
        }
    }

    fn object(id: u64, len: usize) -> SubgroupObject {
        SubgroupObject {
            object_id: id,
            properties: Bytes::new(),
            status: ObjectStatus::Normal,
            payload: Bytes::from(vec![id as u8; len]),
        }
    }

    /// The stream after its type: (type, rest).
    fn wire(h: &SubgroupHeader, objects: &[SubgroupObject]) -> (u8, Bytes) {
        let mut b = BytesMut::new();
        h.encode(&mut b);
        let mut s = &b[..];
        let ty = get_vi64(&mut s).unwrap() as u8;
        let mut rest = BytesMut::from(s);
        let mut prev = None;
        for o in objects {
            o.encode(&mut rest, prev, h.has_properties).unwrap();
            prev = Some(o.object_id);
        }
        (ty, rest.freeze())
    }

    fn read_all(
        r: &mut SubgroupReader,
        wire: &Bytes,
        chunk: usize,
    ) -> Result<Vec<SubgroupRead>, DecodeError> {
        let mut out = Vec::new();
        for c in wire.chunks(chunk) {
            r.push(Bytes::copy_from_slice(c));
            while let Some(o) = r.next_object()? {
                out.push(o);
            }
        }
        r.finish();
        while let Some(o) = r.next_object()? {
            out.push(o);
        }
        Ok(out)
    }

    #[test]
    fn objects_come_out_whole_however_the_stream_is_cut() {
        let objects = [
            object(0, 10),
            object(1, 100_000),
            object(4, 0),
            object(5, 3),
        ];
        for (mode, want_sg) in [
            (SubgroupId::Zero, 0),
            (SubgroupId::Explicit(9), 9),
            (SubgroupId::FirstObject, 0),
        ] {
            let h = header(mode, false);
            let (ty, rest) = wire(&h, &objects);
            for chunk in [1, 7, 1200, 1 << 20] {
                let mut r = SubgroupReader::new(ty, 1 << 20);
                let got = read_all(&mut r, &rest, chunk).unwrap();
                assert_eq!(r.header(), Some(&h));
                assert!(r.is_done());
                let ids: Vec<_> = got.iter().map(|o| o.object.object_id).collect();
                assert_eq!(ids, [0, 1, 4, 5]);
                assert!(got.iter().all(|o| o.subgroup == want_sg));
                assert_eq!(got[1].object.payload.len(), 100_000);
                assert_eq!(got[2].object.status, ObjectStatus::Normal);
            }
        }
    }

    #[test]
    fn a_large_object_is_joined_once_and_the_hint_asks_for_the_rest() {
        let h = header(SubgroupId::Zero, false);
        let (ty, rest) = wire(&h, &[object(0, 50_000)]);
        let mut r = SubgroupReader::new(ty, 1 << 20);
        r.push(rest.slice(..100));
        assert!(r.next_object().unwrap().is_none());
        // The object's header is in: the reader knows how much is left.
        assert_eq!(r.read_hint(), rest.len() - 100);
        // Cut inside an object's header, it asks for a large read, not one
        // byte at a time.
        let props = header(SubgroupId::Zero, true);
        let mut big = object(0, 10);
        big.properties = Bytes::from(vec![0u8; 2]);
        let (ty2, rest2) = wire(&props, &[big]);
        let mut r2 = SubgroupReader::new(ty2, 1 << 20);
        r2.push(rest2.slice(..1));
        assert!(r2.next_object().unwrap().is_none());
        assert_eq!(r2.read_hint(), 64 * 1024);
        r.push(rest.slice(100..));
        assert_eq!(
            r.next_object().unwrap().unwrap().object.payload.len(),
            50_000
        );
    }

    #[test]
    fn a_stream_cut_inside_the_header_or_an_object_is_an_error() {
        let h = header(SubgroupId::Explicit(1), true);
        let (ty, rest) = wire(&h, &[object(0, 20)]);
        // Inside the header.
        let mut r = SubgroupReader::new(ty, 1 << 20);
        r.push(rest.slice(..1));
        assert!(r.read_header().unwrap().is_none());
        r.finish();
        assert!(r.read_header().is_err());
        // Inside the object.
        let mut r = SubgroupReader::new(ty, 1 << 20);
        assert!(read_all(&mut r, &rest.slice(..rest.len() - 1), 4).is_err());
        // A FIN right after the header: a stream with no objects, done.
        let (ty, empty) = wire(&h, &[]);
        let mut r = SubgroupReader::new(ty, 1 << 20);
        assert!(read_all(&mut r, &empty, 3).unwrap().is_empty());
        assert!(r.is_done());
    }

    #[test]
    fn objects_over_the_limit_are_refused() {
        let h = header(SubgroupId::Zero, false);
        let (ty, rest) = wire(&h, &[object(0, 2000)]);
        let mut r = SubgroupReader::new(ty, 1000);
        r.push(rest);
        assert_eq!(r.next_object(), Err(DecodeError::TooLong));
    }

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
