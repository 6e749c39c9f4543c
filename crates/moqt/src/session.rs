//! Pure session rules: Request ID allocation and checking (§10.1), the control
//! stream's SETUP-first discipline (§3.3), and a frame accumulator that turns
//! stream chunks into messages.

use std::collections::BTreeSet;

use bytes::{Bytes, BytesMut};

use crate::coding::{get_u16, get_vi64, KeyValue};
use crate::error::{DecodeError, SessionErrorCode};
use crate::message::{setup_option, Message, Setup};

/// Which end of the connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Opened the QUIC connection; uses even Request IDs.
    Client,
    /// Accepted it; uses odd Request IDs.
    Server,
}

/// A session-fatal error with the code to close with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {reason}")]
pub struct SessionError {
    /// Termination code.
    pub code: SessionErrorCode,
    /// Human-readable reason (sent as the close reason).
    pub reason: String,
}

impl SessionError {
    /// A PROTOCOL_VIOLATION with a reason.
    pub fn protocol(reason: impl Into<String>) -> Self {
        Self {
            code: SessionErrorCode::ProtocolViolation,
            reason: reason.into(),
        }
    }
}

impl From<DecodeError> for SessionError {
    fn from(e: DecodeError) -> Self {
        Self {
            code: e.session_code(),
            reason: e.to_string(),
        }
    }
}

/// Request ID bookkeeping for one session.
#[derive(Debug, Clone)]
pub struct RequestIds {
    next_local: u64,
    peer_parity: u64,
    /// Peer IDs below this have all been seen.
    peer_floor: u64,
    /// Peer IDs at or above the floor that have been seen.
    peer_seen: BTreeSet<u64>,
}

impl RequestIds {
    /// Starts the counters for `role`.
    pub fn new(role: Role) -> Self {
        let (local, peer) = match role {
            Role::Client => (0, 1),
            Role::Server => (1, 0),
        };
        Self {
            next_local: local,
            peer_parity: peer,
            peer_floor: peer,
            peer_seen: BTreeSet::new(),
        }
    }

    /// Allocates our next Request ID.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        let id = self.next_local;
        self.next_local += 2;
        id
    }

    /// Checks a peer's Request ID: right parity and never seen (INVALID_REQUEST_ID).
    pub fn accept_peer(&mut self, id: u64) -> Result<(), SessionError> {
        let bad = |why: &str| SessionError {
            code: SessionErrorCode::InvalidRequestId,
            reason: format!("request id {id}: {why}"),
        };
        if id % 2 != self.peer_parity {
            return Err(bad("wrong parity"));
        }
        if id < self.peer_floor || !self.peer_seen.insert(id) {
            return Err(bad("duplicate"));
        }
        // Slide the floor over the contiguous prefix so the set stays small.
        while self.peer_seen.remove(&self.peer_floor) {
            self.peer_floor += 2;
        }
        if self.peer_seen.len() > 4096 {
            // A peer that skips IDs forever cannot make us keep unbounded state:
            // treat everything below the smallest outstanding gap as seen.
            let min = *self.peer_seen.iter().next().expect("non-empty");
            self.peer_floor = min;
            while self.peer_seen.remove(&self.peer_floor) {
                self.peer_floor += 2;
            }
        }
        Ok(())
    }

    /// The smallest peer Request ID not yet processed, for GOAWAY.
    pub fn peer_floor(&self) -> u64 {
        self.peer_floor
    }
}

/// Accumulates bytes of a control or request stream and yields whole messages.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: BytesMut,
    /// Deviations accepted since [`FrameReader::take_deviations`].
    noted: crate::deviation::Deviations,
}

impl FrameReader {
    /// Empty reader.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes buffered but not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Decodes the next whole message, `Ok(None)` if more bytes are needed.
    ///
    /// Once a whole frame is buffered it is split off without copying and decoded,
    /// so byte fields of the message share the frame's allocation. After an error
    /// the session must be closed; the reader's contents are then unspecified.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Message>, DecodeError> {
        // Type and Length tell whether the whole frame is here.
        let mut s = &self.buf[..];
        let (Ok(_), Ok(len)) = (get_vi64(&mut s), get_u16(&mut s)) else {
            return Ok(None);
        };
        if s.len() < len as usize {
            return Ok(None);
        }
        let total = self.buf.len() - s.len() + len as usize;
        let frame = self.buf.split_to(total).freeze();
        let mut s = &frame[..];
        let (m, noted) = Message::decode_noting(&mut s, &frame)?;
        debug_assert!(s.is_empty());
        self.noted.extend(noted);
        Ok(Some(m))
    }

    /// The deviations from draft 18 accepted in the messages returned since
    /// the last call ([`crate::deviation`]), for the caller to count.
    pub fn take_deviations(&mut self) -> crate::deviation::Deviations {
        std::mem::take(&mut self.noted)
    }
}

/// Enforces that the peer's control stream starts with exactly one SETUP.
#[derive(Debug, Default)]
pub struct ControlState {
    peer_setup: Option<Setup>,
    goaway_received: bool,
}

impl ControlState {
    /// Fresh state.
    pub fn new() -> Self {
        Self::default()
    }

    /// The peer's SETUP, once received.
    pub fn peer_setup(&self) -> Option<&Setup> {
        self.peer_setup.as_ref()
    }

    /// Whether the peer sent GOAWAY.
    pub fn goaway_received(&self) -> bool {
        self.goaway_received
    }

    /// Checks a message received on the peer's control stream.
    pub fn on_control_message(&mut self, m: &Message) -> Result<(), SessionError> {
        match (m, &self.peer_setup) {
            (Message::Setup(s), None) => {
                self.peer_setup = Some(s.clone());
                Ok(())
            }
            (Message::Setup(_), Some(_)) => Err(SessionError::protocol("second SETUP")),
            (_, None) => Err(SessionError::protocol(format!("{} before SETUP", m.name()))),
            (Message::GoAway(_), Some(_)) if self.goaway_received => {
                Err(SessionError::protocol("second GOAWAY"))
            }
            (Message::GoAway(_), Some(_)) => {
                self.goaway_received = true;
                Ok(())
            }
            (other, Some(_)) => Err(SessionError::protocol(format!(
                "{} is not allowed on the control stream",
                other.name()
            ))),
        }
    }
}

/// Validates a client's SETUP at a server (§10.3.1): AUTHORITY and PATH only
/// over raw QUIC, and only values this server serves.
pub fn check_client_setup(setup: &Setup, webtransport: bool) -> Result<(), SessionError> {
    for kv in &setup.options {
        let (bad_code, malformed) = match kv.kind {
            setup_option::AUTHORITY => (
                SessionErrorCode::InvalidAuthority,
                SessionErrorCode::MalformedAuthority,
            ),
            setup_option::PATH => (
                SessionErrorCode::InvalidPath,
                SessionErrorCode::MalformedPath,
            ),
            _ => continue,
        };
        if webtransport {
            return Err(SessionError {
                code: bad_code,
                reason: "AUTHORITY/PATH over WebTransport".into(),
            });
        }
        let ok = match &kv.value {
            crate::KvValue::Bytes(b) => std::str::from_utf8(b)
                .map(|s| s.chars().all(|c| c.is_ascii_graphic()))
                .unwrap_or(false),
            crate::KvValue::Int(_) => false,
        };
        if !ok {
            return Err(SessionError {
                code: malformed,
                reason: "malformed AUTHORITY/PATH".into(),
            });
        }
    }
    Ok(())
}

/// Builds the SETUP we send: our implementation name, plus AUTHORITY and
/// PATH when we are a raw-QUIC client.
pub fn make_setup(implementation: &str, authority: Option<&str>, path: Option<&str>) -> Setup {
    let mut options = Vec::new();
    if let Some(p) = path {
        options.push(KeyValue::bytes(
            setup_option::PATH,
            Bytes::copy_from_slice(p.as_bytes()),
        ));
    }
    if let Some(a) = authority {
        options.push(KeyValue::bytes(
            setup_option::AUTHORITY,
            Bytes::copy_from_slice(a.as_bytes()),
        ));
    }
    options.push(KeyValue::bytes(
        setup_option::MOQT_IMPLEMENTATION,
        Bytes::copy_from_slice(implementation.as_bytes()),
    ));
    Setup { options }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::GoAway;

    #[test]
    fn request_ids() {
        let mut c = RequestIds::new(Role::Client);
        assert_eq!((c.next(), c.next()), (0, 2));
        let mut s = RequestIds::new(Role::Server);
        assert_eq!(s.next(), 1);
        s.accept_peer(0).unwrap();
        s.accept_peer(4).unwrap();
        s.accept_peer(2).unwrap();
        assert_eq!(s.peer_floor(), 6);
        assert_eq!(
            s.accept_peer(2).unwrap_err().code,
            SessionErrorCode::InvalidRequestId
        );
        assert_eq!(
            s.accept_peer(7).unwrap_err().code,
            SessionErrorCode::InvalidRequestId
        );
    }

    #[test]
    fn control_stream_discipline() {
        let mut st = ControlState::new();
        let ga = Message::GoAway(GoAway::default());
        assert!(st.on_control_message(&ga).is_err());
        let setup = Message::Setup(make_setup("x", None, None));
        st.on_control_message(&setup).unwrap();
        assert_eq!(
            st.on_control_message(&setup).unwrap_err().code,
            SessionErrorCode::ProtocolViolation
        );
        st.on_control_message(&ga).unwrap();
        assert!(st.on_control_message(&ga).is_err());
    }

    #[test]
    fn frame_reader_handles_split_frames() {
        let m = Message::Setup(make_setup("quichub", Some("h:1"), Some("/x")));
        let bytes = m.to_bytes();
        let mut r = FrameReader::new();
        for b in bytes.iter() {
            assert_eq!(r.next().unwrap(), None);
            r.push(&[*b]);
        }
        assert_eq!(r.next().unwrap(), Some(m));
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn setup_options_rules() {
        let s = make_setup("x", Some("localhost:4443"), Some("/moq"));
        check_client_setup(&s, false).unwrap();
        assert_eq!(
            check_client_setup(&s, true).unwrap_err().code,
            SessionErrorCode::InvalidPath
        );
    }
}
