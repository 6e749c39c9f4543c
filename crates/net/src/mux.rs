//! One session API over the two ways a MoQT peer reaches us: QUIC (raw
//! `moqt-18` or WebTransport, through `web-transport-quinn`) and QMux over a
//! WebSocket (draft-ietf-quic-qmux, through moq-dev's `qmux` crate), the
//! fallback of browsers without WebTransport (Safari) and of networks that
//! block UDP.
//!
//! The types are enums rather than a trait: the relay keeps one concrete
//! session type in its tables, and the hot path pays one branch, not a
//! boxed future or a virtual call, per write. The method names and shapes
//! follow `web-transport-quinn`, which everything above was written against.

use bytes::Bytes;
use futures::FutureExt;
use web_transport_trait::{RecvStream as _, SendStream as _, Session as _, Stats as _};

/// Why a session or stream operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The QUIC (or WebTransport) session ended.
    #[error(transparent)]
    Session(#[from] web_transport_quinn::SessionError),
    /// A write on a QUIC stream failed.
    #[error(transparent)]
    Write(#[from] web_transport_quinn::WriteError),
    /// A read on a QUIC stream failed.
    #[error(transparent)]
    Read(#[from] web_transport_quinn::ReadError),
    /// The stream was already finished or reset.
    #[error("stream closed")]
    ClosedStream,
    /// A QMux session or stream failed.
    #[error(transparent)]
    Qmux(#[from] qmux::Error),
    /// [`RecvStream::read_to_end`] read more than its limit.
    #[error("stream longer than {0} bytes")]
    TooLong(usize),
}

impl Error {
    /// The application error code and reason of a session the peer closed
    /// (CLOSE_WEBTRANSPORT_SESSION, QUIC APPLICATION_CLOSE, QMux
    /// APPLICATION_CLOSE); `None` when it ended otherwise.
    pub fn application_close(&self) -> Option<(u32, String)> {
        use web_transport_quinn::{quinn::ConnectionError, SessionError, WebTransportError};
        match self {
            Error::Session(SessionError::WebTransportError(WebTransportError::Closed(
                code,
                reason,
            ))) => Some((*code, reason.clone())),
            Error::Session(SessionError::ConnectionError(ConnectionError::ApplicationClosed(
                c,
            ))) => Some((
                u32::try_from(c.error_code.into_inner()).ok()?,
                String::from_utf8_lossy(&c.reason).into_owned(),
            )),
            Error::Qmux(qmux::Error::ConnectionClosed { code, reason }) => {
                Some((u32::try_from(code.into_inner()).ok()?, reason.clone()))
            }
            _ => None,
        }
    }
}

impl From<quinn::ClosedStream> for Error {
    fn from(_: quinn::ClosedStream) -> Self {
        Error::ClosedStream
    }
}

impl From<web_transport_quinn::ClosedStream> for Error {
    fn from(_: web_transport_quinn::ClosedStream) -> Self {
        Error::ClosedStream
    }
}

/// A MoQT-ready session: QUIC or QMux over WebSocket.
// QUIC is the common case and already this large without the enum; boxing
// it would add a pointer chase to every stream and datagram the relay sends.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Session {
    /// Raw QUIC or WebTransport over HTTP/3.
    Quic(web_transport_quinn::Session),
    /// QMux over a WebSocket.
    Qmux(qmux::Session),
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Session::Quic(_) => f.write_str("Session::Quic"),
            Session::Qmux(_) => f.write_str("Session::Qmux"),
        }
    }
}

impl From<web_transport_quinn::Session> for Session {
    fn from(s: web_transport_quinn::Session) -> Self {
        Session::Quic(s)
    }
}

impl From<qmux::Session> for Session {
    fn from(s: qmux::Session) -> Self {
        Session::Qmux(s)
    }
}

impl Session {
    /// Opens a unidirectional stream.
    pub async fn open_uni(&self) -> Result<SendStream, Error> {
        Ok(match self {
            Session::Quic(s) => SendStream::Quic(s.open_uni().await?),
            Session::Qmux(s) => SendStream::Qmux(QmuxStream::boxed(s.open_uni().await?, s)),
        })
    }

    /// Opens a bidirectional stream.
    pub async fn open_bi(&self) -> Result<(SendStream, RecvStream), Error> {
        Ok(match self {
            Session::Quic(s) => {
                let (a, b) = s.open_bi().await?;
                (SendStream::Quic(a), RecvStream::Quic(b))
            }
            Session::Qmux(s) => {
                let (a, b) = s.open_bi().await?;
                (
                    SendStream::Qmux(QmuxStream::boxed(a, s)),
                    RecvStream::Qmux(QmuxStream::boxed(b, s)),
                )
            }
        })
    }

    /// The next unidirectional stream the peer opens.
    pub async fn accept_uni(&self) -> Result<RecvStream, Error> {
        Ok(match self {
            Session::Quic(s) => RecvStream::Quic(s.accept_uni().await?),
            Session::Qmux(s) => RecvStream::Qmux(QmuxStream::boxed(s.accept_uni().await?, s)),
        })
    }

    /// The next bidirectional stream the peer opens.
    pub async fn accept_bi(&self) -> Result<(SendStream, RecvStream), Error> {
        Ok(match self {
            Session::Quic(s) => {
                let (a, b) = s.accept_bi().await?;
                (SendStream::Quic(a), RecvStream::Quic(b))
            }
            Session::Qmux(s) => {
                let (a, b) = s.accept_bi().await?;
                (
                    SendStream::Qmux(QmuxStream::boxed(a, s)),
                    RecvStream::Qmux(QmuxStream::boxed(b, s)),
                )
            }
        })
    }

    /// The next datagram.
    pub async fn read_datagram(&self) -> Result<Bytes, Error> {
        Ok(match self {
            Session::Quic(s) => s.read_datagram().await?,
            Session::Qmux(s) => s.recv_datagram().await?,
        })
    }

    /// Sends a datagram (dropped, not queued, when the transport is behind).
    pub fn send_datagram(&self, data: Bytes) -> Result<(), Error> {
        match self {
            Session::Quic(s) => Ok(s.send_datagram(data)?),
            Session::Qmux(s) => Ok(s.send_datagram(data)?),
        }
    }

    /// What [`Session::send_datagram_prefixed`] expects in front of the
    /// payload: WebTransport's Quarter Stream ID, or nothing.
    pub fn datagram_header(&self) -> &[u8] {
        match self {
            Session::Quic(s) => s.datagram_header(),
            Session::Qmux(_) => &[],
        }
    }

    /// Sends a datagram that already starts with [`Session::datagram_header`]
    /// (saves a copy per subscriber on the fan-out path).
    pub fn send_datagram_prefixed(&self, framed: Bytes) -> Result<(), Error> {
        match self {
            Session::Quic(s) => Ok(s.send_datagram_prefixed(framed)?),
            Session::Qmux(s) => Ok(s.send_datagram(framed)?),
        }
    }

    /// Largest datagram payload the peer accepts now (0: none).
    pub fn max_datagram_size(&self) -> usize {
        match self {
            Session::Quic(s) => s.max_datagram_size(),
            Session::Qmux(s) => s.max_datagram_size(),
        }
    }

    /// Closes the session with an application error code and reason.
    pub fn close(&self, code: u32, reason: &[u8]) {
        match self {
            Session::Quic(s) => s.close(code, reason),
            Session::Qmux(s) => s.close(code, &String::from_utf8_lossy(reason)),
        }
    }

    /// Waits until the session is closed, by either side; returns why.
    pub async fn closed(&self) -> Error {
        match self {
            Session::Quic(s) => s.closed().await.into(),
            Session::Qmux(s) => s.closed().await.into(),
        }
    }

    /// Why the session closed, if it has.
    pub fn close_reason(&self) -> Option<Error> {
        match self {
            Session::Quic(s) => s.close_reason().map(Into::into),
            Session::Qmux(s) => s.closed().now_or_never().map(Into::into),
        }
    }

    /// The smoothed round-trip time, where the transport measures one.
    pub fn rtt(&self) -> Option<std::time::Duration> {
        match self {
            Session::Quic(s) => Some(s.rtt()),
            Session::Qmux(s) => s.stats().rtt(),
        }
    }

    /// The QUIC session under this one, for what only QUIC has (statistics,
    /// the connection itself).
    pub fn quic(&self) -> Option<&web_transport_quinn::Session> {
        match self {
            Session::Quic(s) => Some(s),
            Session::Qmux(_) => None,
        }
    }
}

/// The sending half of a stream.
pub enum SendStream {
    /// On QUIC.
    Quic(web_transport_quinn::SendStream),
    /// On QMux, with its session: qmux 0.5.3 leaves a stream's pending
    /// operations waiting forever once the session is gone, so each one
    /// here also ends when the session does.
    Qmux(Box<QmuxStream<qmux::SendStream>>),
}

/// A QMux stream and its session (boxed in the enums: QUIC's streams, the
/// common case, stay small).
pub struct QmuxStream<S> {
    s: S,
    session: qmux::Session,
}

impl<S> QmuxStream<S> {
    fn boxed(s: S, session: &qmux::Session) -> Box<Self> {
        Box::new(Self {
            s,
            session: session.clone(),
        })
    }
}

/// Runs `op` on a QMux stream until it ends or `session` closes.
async fn or_closed<T>(
    session: &qmux::Session,
    op: impl std::future::Future<Output = Result<T, qmux::Error>>,
) -> Result<T, Error> {
    tokio::select! {
        biased;
        r = op => Ok(r?),
        e = session.closed() => Err(e.into()),
    }
}

impl SendStream {
    /// Writes some of `buf`; returns how much.
    pub async fn write(&mut self, buf: &[u8]) -> Result<usize, Error> {
        match self {
            SendStream::Quic(s) => Ok(s.write(buf).await?),
            SendStream::Qmux(q) => or_closed(&q.session, q.s.write(buf)).await,
        }
    }

    /// Writes all of `buf`.
    pub async fn write_all(&mut self, buf: &[u8]) -> Result<(), Error> {
        match self {
            SendStream::Quic(s) => Ok(s.write_all(buf).await?),
            SendStream::Qmux(q) => or_closed(&q.session, q.s.write_all(buf)).await,
        }
    }

    /// Writes all of `buf` without copying it (QUIC keeps the `Bytes`).
    pub async fn write_chunk(&mut self, buf: Bytes) -> Result<(), Error> {
        match self {
            SendStream::Quic(s) => Ok(s.write_chunk(buf).await?),
            SendStream::Qmux(q) => {
                let mut buf = buf;
                or_closed(&q.session, q.s.write_all_buf(&mut buf)).await
            }
        }
    }

    /// Ends the stream after what was written (FIN).
    pub fn finish(&mut self) -> Result<(), Error> {
        match self {
            SendStream::Quic(s) => Ok(s.finish()?),
            SendStream::Qmux(q) => Ok(q.s.finish()?),
        }
    }

    /// Abandons the stream (RESET_STREAM with `code`).
    pub fn reset(&mut self, code: u32) -> Result<(), Error> {
        match self {
            SendStream::Quic(s) => Ok(s.reset(code)?),
            SendStream::Qmux(q) => {
                q.s.reset(code);
                Ok(())
            }
        }
    }

    /// [`Self::reset`] with the code in HTTP/3's range on raw QUIC too, as
    /// moq-dev's QUIC libraries read it there (the moq-lite bridge's peers);
    /// QMux codes go as they are.
    pub fn reset_mapped(&mut self, code: u32) -> Result<(), Error> {
        match self {
            SendStream::Quic(s) => Ok(s.reset_mapped(code)?),
            SendStream::Qmux(_) => self.reset(code),
        }
    }

    /// Sets the send order: higher is sent first. QMux has 256 levels, not
    /// 2^32: see [`qmux_order`].
    pub fn set_priority(&mut self, order: i32) -> Result<(), Error> {
        match self {
            SendStream::Quic(s) => Ok(s.set_priority(order)?),
            SendStream::Qmux(q) => {
                q.s.set_priority(qmux_order(order));
                Ok(())
            }
        }
    }

    /// Waits until the peer stops the stream (STOP_SENDING: `Some(code)`) or
    /// it is done (`None`).
    pub async fn stopped(&mut self) -> Result<Option<u32>, Error> {
        match self {
            SendStream::Quic(s) => Ok(s.stopped().await?),
            SendStream::Qmux(q) => match or_closed(&q.session, q.s.closed()).await {
                // qmux reports a stream whose FIN went out as `Closed`.
                Ok(()) | Err(Error::Qmux(qmux::Error::Closed)) => Ok(None),
                Err(Error::Qmux(qmux::Error::StreamStop(code))) => {
                    Ok(Some(u32::try_from(code.into_inner()).unwrap_or(u32::MAX)))
                }
                Err(e) => Err(e),
            },
        }
    }
}

/// QMux's `u8` send order (higher first) from a
/// [`moqt::priority::stream_priority`] order: the top 5 bits of the
/// subscriber priority, then the top 3 of the publisher priority (both
/// inverted there, so higher is more urgent here too). The group order, the
/// low bits, has no room: within one level QMux shares the link between
/// streams. Negative orders (not from that layout) are the lowest level.
fn qmux_order(order: i32) -> u8 {
    if order < 0 {
        return 0;
    }
    let subscriber = (order >> 23) & 0xff;
    let publisher = (order >> 15) & 0xff;
    ((subscriber >> 3) << 3 | (publisher >> 5)) as u8
}

/// The receiving half of a stream.
pub enum RecvStream {
    /// On QUIC.
    Quic(web_transport_quinn::RecvStream),
    /// On QMux, with its session (see [`SendStream::Qmux`]).
    Qmux(Box<QmuxStream<qmux::RecvStream>>),
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        // qmux 0.5.3 gives back connection flow-control credit only for
        // bytes read: what arrived but was never read would shrink the
        // peer's window for good. Read out (and so give back) what is
        // already here; nothing waits.
        if let RecvStream::Qmux(q) = self {
            for _ in 0..1024 {
                match q.s.read_chunk(usize::MAX).now_or_never() {
                    Some(Ok(Some(_))) => {}
                    _ => break,
                }
            }
        }
    }
}

impl RecvStream {
    /// Reads into `buf`; `None` at the end of the stream.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        match self {
            RecvStream::Quic(s) => Ok(s.read(buf).await?),
            RecvStream::Qmux(q) => or_closed(&q.session, q.s.read(buf)).await,
        }
    }

    /// Reads the next chunk, at most `max` bytes, in order, without copying;
    /// `None` at the end of the stream.
    pub async fn read_chunk(&mut self, max: usize) -> Result<Option<Bytes>, Error> {
        match self {
            RecvStream::Quic(s) => Ok(s.read_chunk(max, true).await?.map(|c| c.bytes)),
            RecvStream::Qmux(q) => or_closed(&q.session, q.s.read_chunk(max)).await,
        }
    }

    /// Reads the rest of the stream, at most `limit` bytes.
    pub async fn read_to_end(&mut self, limit: usize) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        while let Some(c) = self.read_chunk(64 * 1024).await? {
            if out.len() + c.len() > limit {
                return Err(Error::TooLong(limit));
            }
            out.extend_from_slice(&c);
        }
        Ok(out)
    }

    /// Asks the peer to stop sending (STOP_SENDING with `code`).
    pub fn stop(&mut self, code: u32) -> Result<(), Error> {
        match self {
            RecvStream::Quic(s) => Ok(s.stop(code)?),
            RecvStream::Qmux(q) => {
                q.s.stop(code);
                Ok(())
            }
        }
    }

    /// [`Self::stop`] with the code in HTTP/3's range on raw QUIC too (see
    /// [`SendStream::reset_mapped`]).
    pub fn stop_mapped(&mut self, code: u32) -> Result<(), Error> {
        match self {
            RecvStream::Quic(s) => Ok(s.stop_mapped(code)?),
            RecvStream::Qmux(_) => self.stop(code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::qmux_order;

    #[test]
    fn qmux_order_keeps_subscriber_then_publisher_priority() {
        use moqt::priority::stream_priority;
        use moqt::GroupOrder::Ascending;
        let q = |sub, publ| qmux_order(stream_priority(sub, publ, 5, Ascending));
        assert_eq!(q(0, 0), 255);
        assert_eq!(q(255, 255), 0);
        // Subscriber priority first (lower value: more urgent), ...
        assert!(q(0, 255) > q(8, 0));
        assert!(q(100, 128) > q(200, 128));
        // ... then the publisher's, as the client's streams use it.
        assert!(q(128, 0) > q(128, 64));
        assert!(q(128, 64) > q(128, 255));
        assert_eq!(qmux_order(-5), 0);
    }
}
