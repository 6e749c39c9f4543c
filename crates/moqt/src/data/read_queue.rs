//! The bytes a stream reader has received and not yet decoded, shared by
//! [`super::FetchDecoder`] and [`super::SubgroupReader`]: reads are queued
//! as they come and joined (one copy) only when the decoder is ready to look
//! at them; a single read onto nothing is not copied at all.

use bytes::{Bytes, BytesMut};

#[derive(Debug, Default)]
pub(crate) struct ReadQueue {
    /// Joined bytes, not yet decoded.
    pub(crate) pending: Bytes,
    /// Reads not yet joined to `pending`.
    reads: Vec<Bytes>,
    /// Bytes in `reads`.
    queued: usize,
}

impl ReadQueue {
    /// Queues a read.
    pub(crate) fn push(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.queued += bytes.len();
            self.reads.push(bytes);
        }
    }

    /// Bytes held, joined or not.
    pub(crate) fn len(&self) -> usize {
        self.pending.len() + self.queued
    }

    /// Joins the queued reads onto `pending`.
    pub(crate) fn join(&mut self) {
        if self.reads.is_empty() {
            return;
        }
        if self.pending.is_empty() && self.reads.len() == 1 {
            self.pending = self.reads.pop().unwrap_or_default();
        } else {
            let mut b = BytesMut::with_capacity(self.len());
            b.extend_from_slice(&self.pending);
            for r in self.reads.drain(..) {
                b.extend_from_slice(&r);
            }
            self.pending = b.freeze();
        }
        self.queued = 0;
    }
}
