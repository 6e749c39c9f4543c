//! Sessions whose protocol neither the ALPN nor a WebTransport subprotocol
//! names: the peer's first stream tells ([`moqt::sniff`]).
//!
//! - ALPN or subprotocol `moq-00`: CLIENT_SETUP's versions choose draft 14
//!   or moq-lite-01/02, which negotiate the same way.
//! - WebTransport without a subprotocol: draft 14 (and moq-lite-01/02)
//!   clients negotiate in CLIENT_SETUP alone, so the server must not speak
//!   first (its draft-18 SETUP stream, type 0x2F00, tears a draft-14 client
//!   down). A unidirectional stream first is a draft-18 client's SETUP
//!   stream; a bidirectional one is either CLIENT_SETUP (0x20) or a
//!   draft-18 request.
//!
//! What was read to learn it is not lost: the stream and its bytes go to
//! whoever serves the session, which reads it from its first byte.
//!
//! Nothing here bounds the wait: the relay does, with its SETUP timeout.

use bytes::{Bytes, BytesMut};
use moqt::legacy::Draft;
use moqt::sniff::{choose, first_bidi, Chosen, FirstBidi, LiteVersion};
use moqt::SessionErrorCode;

use crate::mux::{RecvStream, SendStream, Session};

/// A stream the peer opened before its session's protocol was known, for
/// the session's server to handle first.
pub enum EarlyStream {
    /// A unidirectional stream (a draft-18 client's SETUP stream), unread.
    Uni(RecvStream),
    /// A bidirectional stream and the bytes already read from it.
    Bi {
        /// Its sending half.
        send: SendStream,
        /// Its receiving half, after `read`.
        recv: RecvStream,
        /// What was read of it.
        read: Bytes,
    },
}

/// What a session's first stream showed.
// One per session, moved once: boxing the session would save nothing.
#[allow(clippy::large_enum_variant)]
pub enum Resolved {
    /// Draft 18: `early` is the stream that showed it, for the session's
    /// server to handle first.
    Draft18 {
        /// The peer's first stream.
        early: EarlyStream,
    },
    /// Draft 14: the draft-18 side of a translating bridge
    /// ([`crate::legacy`]), which reads the peer's CLIENT_SETUP from its
    /// first byte.
    Legacy {
        /// The session to serve as draft 18.
        session: Session,
        /// The draft the peer speaks.
        draft: Draft,
    },
    /// moq-lite-01 or -02, negotiated in CLIENT_SETUP: the peer's control
    /// stream and the CLIENT_SETUP read from it.
    Lite {
        /// The version the CLIENT_SETUP chose.
        version: LiteVersion,
        /// The control stream's sending half.
        send: SendStream,
        /// Its receiving half, after `read`.
        recv: RecvStream,
        /// What was read of it: the whole CLIENT_SETUP, at least.
        read: Bytes,
        /// The limits of the bridge's in-memory session.
        limits: qmux::Config,
    },
}

/// Why a session's first stream led to no protocol served here: close it
/// with `code` and `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The session error code.
    pub code: SessionErrorCode,
    /// The reason phrase.
    pub reason: String,
    /// True when the peer offered no version served here (count it as a
    /// refused draft).
    pub version: bool,
}

impl Refused {
    fn protocol(reason: String) -> Self {
        Refused {
            code: SessionErrorCode::ProtocolViolation,
            reason,
            version: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// ALPN or subprotocol `moq-00`.
    Moq00,
    /// WebTransport without a subprotocol.
    NoSubprotocol,
}

/// A session whose protocol its first stream will show
/// ([`crate::server::Accepted::undetermined`]).
#[derive(Clone)]
pub struct Undetermined {
    how: How,
    /// The bridge's limits, should it be draft 14.
    limits: qmux::Config,
}

impl std::fmt::Debug for Undetermined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Undetermined").field(&self.how).finish()
    }
}

/// Most bytes read to classify a stream: a whole CLIENT_SETUP (its length
/// is 16 bits) and a chunk beyond it.
const MAX_READ: usize = 3 + 0xffff + 64 * 1024;

impl Undetermined {
    /// ALPN or subprotocol `moq-00`: draft 14 or moq-lite-01/02.
    pub fn moq_00(limits: qmux::Config) -> Self {
        Self {
            how: How::Moq00,
            limits,
        }
    }

    /// WebTransport without a subprotocol: draft 18, draft 14 or
    /// moq-lite-01/02.
    pub fn no_subprotocol(limits: qmux::Config) -> Self {
        Self {
            how: How::NoSubprotocol,
            limits,
        }
    }

    /// How the session came over `transport`, for logs.
    pub fn label(&self, transport: crate::Transport) -> &'static str {
        match (self.how, transport) {
            (How::NoSubprotocol, _) => "h3 (WebTransport, no subprotocol)",
            (How::Moq00, crate::Transport::WebTransport) => "h3 (WebTransport, moq-00)",
            (How::Moq00, _) => "moq-00",
        }
    }

    /// Waits for the peer's first stream (a bidirectional one only, for
    /// `moq-00`) and reads what it takes to know the protocol.
    pub async fn resolve(self, peer: &Session) -> Result<Resolved, Refused> {
        let closed =
            |e: crate::mux::Error| Refused::protocol(format!("before its first stream: {e}"));
        let (send, mut recv) = match self.how {
            How::Moq00 => peer.accept_bi().await.map_err(closed)?,
            How::NoSubprotocol => tokio::select! {
                // A draft-18 client opens its SETUP stream first; its
                // requests may overtake it, and are handled below.
                biased;
                uni = peer.accept_uni() => {
                    return Ok(Resolved::Draft18 { early: EarlyStream::Uni(uni.map_err(closed)?) });
                }
                bi = peer.accept_bi() => bi.map_err(closed)?,
            },
        };
        let mut buf = BytesMut::new();
        let first = loop {
            match first_bidi(&buf) {
                Ok(Some(f)) => break f,
                Ok(None) => {}
                Err(e) => {
                    return Err(Refused {
                        code: e.session_code(),
                        reason: format!("CLIENT_SETUP: {e}"),
                        version: false,
                    })
                }
            }
            // `first_bidi` asks for no more than one CLIENT_SETUP.
            debug_assert!(buf.len() <= MAX_READ);
            match recv.read_chunk(64 * 1024).await {
                Ok(Some(c)) => buf.extend_from_slice(&c),
                Ok(None) => {
                    return Err(Refused::protocol(
                        "first stream ended before its first message".into(),
                    ))
                }
                Err(e) => return Err(Refused::protocol(format!("first stream: {e}"))),
            }
        };
        let read = buf.freeze();
        let limits = self.limits.clone();
        let bridge = |send, recv, read| async move {
            crate::legacy::accept_with_control(
                peer.clone(),
                Draft::D14,
                self.limits,
                (send, recv, read),
            )
            .await
            .map(|session| Resolved::Legacy {
                session,
                draft: Draft::D14,
            })
            .map_err(|e| Refused {
                code: SessionErrorCode::InternalError,
                reason: format!("bridge: {e}"),
                version: false,
            })
        };
        match first {
            FirstBidi::Other if self.how == How::NoSubprotocol => Ok(Resolved::Draft18 {
                early: EarlyStream::Bi { send, recv, read },
            }),
            // `moq-00` must open with CLIENT_SETUP: the bridge says so.
            FirstBidi::Other => bridge(send, recv, read).await,
            FirstBidi::ClientSetup { versions } => match choose(&versions) {
                Chosen::Draft14 => bridge(send, recv, read).await,
                Chosen::Lite(version) => Ok(Resolved::Lite {
                    version,
                    send,
                    recv,
                    read,
                    limits,
                }),
                Chosen::Unsupported => {
                    let offered: Vec<String> = versions.iter().map(|v| format!("{v:#x}")).collect();
                    let offered = offered.join(", ");
                    Err(Refused {
                        code: SessionErrorCode::VersionNegotiationFailed,
                        reason: match self.how {
                            How::Moq00 => format!(
                                "no supported version in [{offered}] (serving draft 14 here)"
                            ),
                            How::NoSubprotocol => format!(
                                "no supported version in [{offered}]: this relay serves draft 14 \
                                 (0xff00000e) when negotiated in CLIENT_SETUP, and draft 18 \
                                 (WebTransport subprotocol moqt-18)"
                            ),
                        },
                        version: true,
                    })
                }
            },
        }
    }
}
