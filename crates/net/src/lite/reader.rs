//! Lite messages read from a stream: bytes are gathered until a decoder
//! has what it needs (decoders say `Short` and consume nothing until then).

use bytes::{Buf, Bytes, BytesMut};
use moqt::DecodeError;

use crate::mux::RecvStream;

/// Most bytes buffered for one message (lite control messages are small;
/// [`moqt::lite::message::MAX_MESSAGE_SIZE`] bounds each body).
const MAX_BUFFERED: usize = moqt::lite::message::MAX_MESSAGE_SIZE + 16;

/// Why a read stopped.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    /// The bytes do not decode.
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
    /// The stream ended inside a message.
    #[error("stream finished mid-message")]
    Truncated,
    /// Reset, or the session closed.
    #[error("stream: {0}")]
    Stream(String),
}

pub(super) struct Reader {
    recv: RecvStream,
    buf: BytesMut,
    fin: bool,
}

impl Reader {
    pub(super) fn new(recv: RecvStream) -> Self {
        Self::with_prefix(recv, &[])
    }

    /// A reader of a stream of which `prefix` was read already.
    pub(super) fn with_prefix(recv: RecvStream, prefix: &[u8]) -> Self {
        Self {
            recv,
            buf: BytesMut::from(prefix),
            fin: false,
        }
    }

    /// The next value `decode` makes of the stream; `None` when the stream
    /// ended cleanly between values.
    pub(super) async fn read<T>(
        &mut self,
        mut decode: impl FnMut(&mut &[u8]) -> Result<T, DecodeError>,
    ) -> Result<Option<T>, ReadError> {
        loop {
            if !self.buf.is_empty() {
                let mut s = &self.buf[..];
                match decode(&mut s) {
                    Ok(v) => {
                        let used = self.buf.len() - s.len();
                        self.buf.advance(used);
                        return Ok(Some(v));
                    }
                    Err(DecodeError::Short) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if self.fin {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => Err(ReadError::Truncated),
                };
            }
            if self.buf.len() > MAX_BUFFERED {
                return Err(DecodeError::TooLong.into());
            }
            match self.recv.read_chunk(64 * 1024).await {
                Ok(Some(c)) => self.buf.extend_from_slice(&c),
                Ok(None) => self.fin = true,
                Err(e) => return Err(ReadError::Stream(e.to_string())),
            }
        }
    }

    /// The bytes read but not decoded, and the stream (for data streams,
    /// which are read chunk by chunk from here on).
    pub(super) fn into_parts(self) -> (Bytes, RecvStream) {
        (self.buf.freeze(), self.recv)
    }

    /// STOP_SENDING (the code mapped as moq-dev reads it: [`crate::mux::RecvStream::stop_mapped`]).
    pub(super) fn stop(&mut self, code: u32) {
        let _ = self.recv.stop_mapped(code);
    }
}
