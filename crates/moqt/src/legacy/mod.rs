//! Drafts 14 and 16 beside 18: the wire formats of the drafts before the
//! session restructuring of draft 17, translated to and from the draft-18
//! model of this crate (see `docs/drafts.md` for every difference).
//!
//! The relay's core speaks draft 18 only. A session of an older draft goes
//! through a translating transport (`quichub_net::legacy`) that uses these
//! codecs: [`control`] for the control stream, [`data`] for subgroup and fetch
//! streams and datagrams. Both are pure: bytes in, bytes out.

pub mod control;
pub mod data;
pub mod varint;

/// A draft older than 18 that this crate translates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Draft {
    /// draft-ietf-moq-transport-14: ALPN `moq-00`, version in CLIENT_SETUP.
    D14,
    /// draft-ietf-moq-transport-16: ALPN and subprotocol `moqt-16`.
    D16,
}

impl Draft {
    /// The raw-QUIC ALPN (and WebTransport subprotocol) of this draft.
    pub fn alpn(self) -> &'static str {
        match self {
            Draft::D14 => "moq-00",
            Draft::D16 => "moqt-16",
        }
    }

    /// The draft a raw-QUIC ALPN or WebTransport subprotocol names, if it is
    /// one this crate translates.
    pub fn from_alpn(alpn: &[u8]) -> Option<Self> {
        match alpn {
            b"moq-00" => Some(Draft::D14),
            b"moqt-16" => Some(Draft::D16),
            _ => None,
        }
    }

    /// The draft number, for logs and metrics labels.
    pub fn number(self) -> u32 {
        match self {
            Draft::D14 => 14,
            Draft::D16 => 16,
        }
    }
}

/// Draft 14's version number in CLIENT_SETUP / SERVER_SETUP.
pub const VERSION_D14: u64 = 0xff00_000e;
