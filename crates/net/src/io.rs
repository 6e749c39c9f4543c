//! Framed control messages over QUIC streams, and reading stream prefixes.

use crate::mux::{RecvStream, SendStream};
use bytes::{Bytes, BytesMut};
use moqt::deviation::Deviation;
use moqt::session::FrameReader;
use moqt::{DecodeError, Message};

/// Why reading a message from a stream stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer sent bytes that do not decode (session error).
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
    /// The stream ended cleanly between messages.
    #[error("stream finished")]
    Finished,
    /// The stream ended in the middle of a message (session error).
    #[error("stream finished mid-message")]
    Truncated,
    /// Reset by the peer, or the session closed.
    #[error("stream: {0}")]
    Stream(String),
}

/// Told of each departure from draft 18 that a [`MessageReader`] accepted
/// ([`moqt::deviation`]), to count it.
pub type DeviationSink = std::sync::Arc<dyn Fn(Deviation) + Send + Sync>;

/// Reads framed control messages from one stream.
pub struct MessageReader {
    stream: RecvStream,
    frames: FrameReader,
    deviations: Option<DeviationSink>,
}

impl MessageReader {
    /// Wraps a receive stream. `prefix` is data already read from it.
    pub fn new(stream: RecvStream, prefix: &[u8]) -> Self {
        let mut frames = FrameReader::new();
        frames.push(prefix);
        Self {
            stream,
            frames,
            deviations: None,
        }
    }

    /// Tells `sink` of every deviation from draft 18 the messages read
    /// needed.
    pub fn with_deviations(mut self, sink: DeviationSink) -> Self {
        self.deviations = Some(sink);
        self
    }

    /// The next message.
    pub async fn next(&mut self) -> Result<Message, ReadError> {
        loop {
            if let Some(m) = self.frames.next()? {
                if let Some(sink) = &self.deviations {
                    for d in self.frames.take_deviations().iter() {
                        sink(d);
                    }
                }
                return Ok(m);
            }
            match self.stream.read_chunk(64 * 1024).await {
                Ok(Some(c)) => self.frames.push(&c),
                Ok(None) if self.frames.pending() == 0 => return Err(ReadError::Finished),
                Ok(None) => return Err(ReadError::Truncated),
                Err(e) => return Err(ReadError::Stream(e.to_string())),
            }
        }
    }

    /// Gives up reading (STOP_SENDING with `code`).
    pub fn stop(&mut self, code: u32) {
        let _ = self.stream.stop(code);
    }

    /// The inner stream.
    pub fn stream_mut(&mut self) -> &mut RecvStream {
        &mut self.stream
    }
}

/// Writes one message to a stream.
pub async fn write_message(stream: &mut SendStream, m: &Message) -> anyhow::Result<()> {
    let mut b = BytesMut::with_capacity(64);
    m.encode(&mut b);
    stream.write_all(&b).await?;
    Ok(())
}

/// Reads from `stream` until `parse` succeeds on the accumulated bytes, or the
/// limit is hit. Used to read stream-type prefixes and headers without knowing
/// their length. Returns the parsed value and the bytes after it.
pub async fn read_prefix<T>(
    stream: &mut RecvStream,
    max: usize,
    parse: impl FnMut(&mut &[u8]) -> Result<T, DecodeError>,
) -> Result<(T, Bytes), ReadError> {
    read_prefix_after(stream, &[], max, parse).await
}

/// Like [`read_prefix`], with `already` read from the stream before (what
/// followed its stream type, say).
pub async fn read_prefix_after<T>(
    stream: &mut RecvStream,
    already: &[u8],
    max: usize,
    mut parse: impl FnMut(&mut &[u8]) -> Result<T, DecodeError>,
) -> Result<(T, Bytes), ReadError> {
    let mut buf = BytesMut::from(already);
    loop {
        if !buf.is_empty() {
            let mut s = &buf[..];
            match parse(&mut s) {
                Ok(v) => {
                    let used = buf.len() - s.len();
                    let rest = buf.split_off(used).freeze();
                    return Ok((v, rest));
                }
                Err(DecodeError::Short) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if buf.len() > max {
            return Err(DecodeError::TooLong.into());
        }
        match stream.read_chunk(max).await {
            Ok(Some(c)) => buf.extend_from_slice(&c),
            Ok(None) if buf.is_empty() => return Err(ReadError::Finished),
            Ok(None) => return Err(ReadError::Truncated),
            Err(e) => return Err(ReadError::Stream(e.to_string())),
        }
    }
}

/// Datagrams whose Track Alias is not known yet. A datagram can overtake the
/// SUBSCRIBE_OK or PUBLISH that announces its alias (they travel on different
/// paths through the stack), so a receiver keeps a few for a short while
/// instead of dropping them. Bounded in count and age.
#[derive(Debug, Default)]
pub struct EarlyDatagrams {
    queue: std::collections::VecDeque<(std::time::Instant, u64, Bytes)>,
}

impl EarlyDatagrams {
    /// Most datagrams held.
    pub const MAX: usize = 256;
    /// Longest a datagram is held.
    pub const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(1);

    /// Holds a datagram for `alias`, dropping the oldest beyond the bounds.
    pub fn push(&mut self, alias: u64, d: Bytes) {
        let now = std::time::Instant::now();
        self.expire(now);
        if self.queue.len() >= Self::MAX {
            self.queue.pop_front();
        }
        self.queue.push_back((now, alias, d));
    }

    /// Takes the held datagrams for `alias`, oldest first.
    pub fn take(&mut self, alias: u64) -> Vec<Bytes> {
        self.expire(std::time::Instant::now());
        let mut out = Vec::new();
        self.queue.retain(|(_, a, d)| {
            if *a == alias {
                out.push(d.clone());
                false
            } else {
                true
            }
        });
        out
    }

    fn expire(&mut self, now: std::time::Instant) {
        while self
            .queue
            .front()
            .is_some_and(|(t, _, _)| now.duration_since(*t) > Self::MAX_AGE)
        {
            self.queue.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_datagrams_are_bounded_and_ordered() {
        let mut e = EarlyDatagrams::default();
        for i in 0..(EarlyDatagrams::MAX + 10) {
            e.push((i % 2) as u64, Bytes::from(i.to_string()));
        }
        let odd = e.take(1);
        assert_eq!(odd.len(), EarlyDatagrams::MAX / 2);
        assert_eq!(odd[0], Bytes::from("11"));
        assert!(e.take(1).is_empty());
        assert_eq!(e.take(0).len(), EarlyDatagrams::MAX / 2);
    }
}
