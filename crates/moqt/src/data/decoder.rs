//! Reading a fetch stream as it arrives (sans-IO): the client's FETCH
//! responses and the relay's upstream FETCHes share it.

use bytes::Bytes;

use super::read_queue::ReadQueue;
use super::{FetchEntry, FetchObject, FetchState};
use crate::DecodeError;

/// The receiving side of a fetch stream (after its FETCH_HEADER): bytes in,
/// entries out as soon as each is whole. At most one object (and one read) is buffered.
///
/// Reads are queued, and joined (one copy) once the object's header says
/// all of it is in; an object that fits one read is not copied at all.
#[derive(Debug)]
pub struct FetchDecoder {
    /// Bytes read and not yet decoded (joined once `want` is reached).
    buf: ReadQueue,
    /// After a short read, wait until `pending` holds this many bytes before
    /// decoding again: the whole object once its header is in, so a large
    /// object arriving in packet-sized reads is not re-parsed per read.
    want: usize,
    state: FetchState,
    max_object: usize,
    finished: bool,
}

impl FetchDecoder {
    /// A decoder for a response in the given group order, refusing objects
    /// larger than `max_object`.
    pub fn new(descending: bool, max_object: usize) -> Self {
        Self {
            buf: ReadQueue::default(),
            want: 0,
            state: FetchState::new(descending),
            max_object,
            finished: false,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: Bytes) {
        self.buf.push(bytes);
    }

    /// The stream ended.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// Whether the stream ended and every object was taken.
    pub fn is_done(&self) -> bool {
        self.finished && self.buf.len() == 0
    }

    /// The next whole entry (object or end-of-range marker), or `None`
    /// until more bytes come. An error for a malformed response or one that
    /// ends inside an entry.
    pub fn next_entry(&mut self) -> Result<Option<FetchEntry>, DecodeError> {
        let have = self.buf.len();
        if have == 0 || (have < self.want && !self.finished) {
            return Ok(None);
        }
        self.buf.join();
        let src = self.buf.pending.clone();
        let mut s = &src[..];
        match self.state.decode(&mut s, &src, self.max_object) {
            Ok(e) => {
                self.buf.pending = src.slice(src.len() - s.len()..);
                self.want = 0;
                Ok(Some(e))
            }
            Err(DecodeError::Short) if !self.finished => {
                self.want = self
                    .state
                    .needed(&src, &src, self.max_object)
                    .unwrap_or(src.len() + 1);
                Ok(None)
            }
            Err(DecodeError::Short) => {
                Err(DecodeError::Invalid("fetch stream ended inside an object"))
            }
            Err(e) => Err(e),
        }
    }

    /// The next whole object, skipping end-of-range markers (the caller sees
    /// the gaps in the locations), or `None` until more bytes come.
    pub fn next_object(&mut self) -> Result<Option<FetchObject>, DecodeError> {
        while let Some(e) = self.next_entry()? {
            if let FetchEntry::Object(o) = e {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn object(group: u64, id: u64, len: usize) -> FetchObject {
        FetchObject {
            group,
            subgroup: Some(0),
            object_id: id,
            priority: 128,
            properties: Bytes::new(),
            payload: Bytes::from(vec![id as u8; len]),
        }
    }

    fn encoded(objects: &[FetchObject]) -> Bytes {
        let mut st = FetchState::new(false);
        let mut b = BytesMut::new();
        for o in objects {
            st.encode(&mut b, &FetchEntry::Object(o.clone()));
        }
        b.freeze()
    }

    #[test]
    fn objects_come_out_as_soon_as_they_are_whole() {
        let objs = [object(5, 0, 3000), object(5, 1, 100_000), object(5, 2, 10)];
        let wire = encoded(&objs);
        let first_len = encoded(&objs[..1]).len();
        let mut d = FetchDecoder::new(false, 1 << 20);
        // The first object and a few bytes of the second: the first is out.
        d.push(wire.slice(..first_len + 5));
        let o = d
            .next_object()
            .unwrap()
            .expect("first object before the rest");
        assert_eq!((o.object_id, o.payload.len()), (0, 3000));
        assert!(d.next_object().unwrap().is_none());
        // The rest in small reads.
        let mut got = vec![o];
        for chunk in wire[first_len + 5..].chunks(1000) {
            d.push(Bytes::copy_from_slice(chunk));
            while let Some(o) = d.next_object().unwrap() {
                got.push(o);
            }
        }
        d.finish();
        assert!(d.next_object().unwrap().is_none());
        assert!(d.is_done());
        assert_eq!(got, objs);
    }

    #[test]
    fn a_response_that_ends_inside_an_object_is_an_error() {
        let wire = encoded(&[object(1, 0, 50)]);
        let mut d = FetchDecoder::new(false, 1 << 20);
        d.push(wire.slice(..wire.len() - 1));
        assert!(d.next_object().unwrap().is_none());
        d.finish();
        assert!(d.next_object().is_err());
        // Oversized objects are refused.
        let mut d = FetchDecoder::new(false, 10);
        d.push(wire);
        assert!(d.next_object().is_err());
    }
}
