//! Which protocol a session speaks when its transport did not say: the
//! first bytes of the peer's first bidirectional stream.
//!
//! Draft 14 negotiated its version in CLIENT_SETUP alone (ALPN and
//! WebTransport subprotocol `moq-00`, or no subprotocol at all over
//! WebTransport), and so did moq-lite-01 and -02, in the same message and
//! with the same framing: type 0x20, a 16-bit length, then the offered
//! versions as QUIC varints (`moq-net` 0.1.3, `setup.rs`, `Client::encode`
//! with the draft-14 encoding, and `version.rs` for the codes). A draft-18
//! client's first bidirectional stream is a request instead (its first
//! stream of all is the unidirectional SETUP stream, type 0x2F00), and draft
//! 18 gives type 0x20 no meaning ("RESERVED (CLIENT_SETUP in <= 16)"), so
//! the first byte tells them apart.

use crate::coding::get_u16;
use crate::error::DecodeError;
use crate::legacy::varint::get_varint;
use crate::legacy::VERSION_D14;

/// CLIENT_SETUP's type in drafts up to 16 (and moq-lite-01/02).
pub const CLIENT_SETUP: u8 = 0x20;

/// moq-lite-01's version code in CLIENT_SETUP.
pub const VERSION_LITE_01: u64 = 0xff0d_ad01;
/// moq-lite-02's version code in CLIENT_SETUP.
pub const VERSION_LITE_02: u64 = 0xff0d_ad02;

/// Most versions a CLIENT_SETUP may list.
const MAX_VERSIONS: u64 = 64;

/// A moq-lite version negotiated in CLIENT_SETUP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiteVersion {
    /// moq-lite-01 (0xff0dad01).
    Lite01,
    /// moq-lite-02 (0xff0dad02).
    Lite02,
}

impl LiteVersion {
    /// Its name, as moq-dev writes it (`moq-lite-02`).
    pub fn name(self) -> &'static str {
        match self {
            LiteVersion::Lite01 => "moq-lite-01",
            LiteVersion::Lite02 => "moq-lite-02",
        }
    }

    /// Its version code in CLIENT_SETUP.
    pub fn code(self) -> u64 {
        match self {
            LiteVersion::Lite01 => VERSION_LITE_01,
            LiteVersion::Lite02 => VERSION_LITE_02,
        }
    }
}

/// What the first bytes of a peer's first bidirectional stream are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstBidi {
    /// A whole CLIENT_SETUP (0x20), with the versions it offers.
    ClientSetup {
        /// The offered versions, in the client's order.
        versions: Vec<u64>,
    },
    /// Anything else: a draft-18 request, or bytes for the session to
    /// refuse (CLIENT_SETUP of drafts up to 10 is 0x40).
    Other,
}

/// Classifies the first bytes of a peer's first bidirectional stream:
/// `Ok(None)` until there are enough (one byte, or a whole CLIENT_SETUP).
pub fn first_bidi(buf: &[u8]) -> Result<Option<FirstBidi>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != CLIENT_SETUP {
        return Ok(Some(FirstBidi::Other));
    }
    let mut s = &buf[1..];
    let len = match get_u16(&mut s) {
        Ok(l) => l as usize,
        Err(DecodeError::Short) => return Ok(None),
        Err(e) => return Err(e),
    };
    if s.len() < len {
        return Ok(None);
    }
    let mut payload = &s[..len];
    // Inside a whole frame, running out of bytes means the length lied.
    let short = |e| match e {
        DecodeError::Short => DecodeError::LengthMismatch,
        e => e,
    };
    let n = get_varint(&mut payload).map_err(short)?;
    if n > MAX_VERSIONS {
        return Err(DecodeError::TooMany);
    }
    let versions = (0..n)
        .map(|_| get_varint(&mut payload).map_err(short))
        .collect::<Result<_, _>>()?;
    Ok(Some(FirstBidi::ClientSetup { versions }))
}

/// What a CLIENT_SETUP's versions lead to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chosen {
    /// Draft 14 (0xff00000e), through the translating bridge.
    Draft14,
    /// moq-lite-01 or -02.
    Lite(LiteVersion),
    /// Nothing served here.
    Unsupported,
}

/// Chooses among the versions a CLIENT_SETUP offers: the first served
/// here, in the client's order, as moq-relay does (`moq-net` clients list
/// moq-lite-02 and -01 first, then draft 14, and get moq-lite-02).
pub fn choose(versions: &[u64]) -> Chosen {
    versions
        .iter()
        .find_map(|v| match *v {
            VERSION_D14 => Some(Chosen::Draft14),
            VERSION_LITE_02 => Some(Chosen::Lite(LiteVersion::Lite02)),
            VERSION_LITE_01 => Some(Chosen::Lite(LiteVersion::Lite01)),
            _ => None,
        })
        .unwrap_or(Chosen::Unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coding::put_vi64;
    use crate::legacy::control::Control;
    use crate::legacy::Draft;
    use crate::message::{Message, Setup, Subscribe};

    fn client_setup(versions: Vec<u64>) -> Vec<u8> {
        let options = vec![crate::KeyValue::bytes(7, "moq-lite-rs")];
        Control::ClientSetup { versions, options }
            .to_bytes(Draft::D14)
            .unwrap()
            .to_vec()
    }

    #[test]
    fn a_draft_14_client_setup_is_read_whole() {
        let b = client_setup(vec![VERSION_LITE_02, VERSION_LITE_01, VERSION_D14]);
        // Every strict prefix asks for more.
        for n in 0..b.len() {
            assert_eq!(first_bidi(&b[..n]), Ok(None), "{n} bytes");
        }
        let got = first_bidi(&b).unwrap().unwrap();
        assert_eq!(
            got,
            FirstBidi::ClientSetup {
                versions: vec![VERSION_LITE_02, VERSION_LITE_01, VERSION_D14]
            }
        );
        // What follows the frame is not its business.
        let mut more = b.clone();
        more.extend_from_slice(&[0x03, 0x00]);
        assert_eq!(first_bidi(&more).unwrap().unwrap(), got);
    }

    /// moq-net 0.1.3's CLIENT_SETUP on ALPN `moql` or a WebTransport
    /// session without a subprotocol (its `Client::connect`): type 0x20, a
    /// 16-bit length, three versions, MAX_REQUEST_ID and IMPLEMENTATION.
    #[test]
    fn moq_net_client_setup_bytes() {
        let b = [
            &[0x20, 0x00, 0x30, 0x03][..],
            &[0xc0, 0, 0, 0, 0xff, 0x0d, 0xad, 0x02],
            &[0xc0, 0, 0, 0, 0xff, 0x0d, 0xad, 0x01],
            &[0xc0, 0, 0, 0, 0xff, 0x00, 0x00, 0x0e],
            // Two parameters: MAX_REQUEST_ID (2) = 2^32 - 1, IMPLEMENTATION (7).
            &[0x02, 0x02, 0xc0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
            &[0x07, 0x0b],
            b"moq-lite-rs",
        ]
        .concat();
        assert_eq!(b.len(), 3 + 0x30);
        let Some(FirstBidi::ClientSetup { versions }) = first_bidi(&b).unwrap() else {
            panic!()
        };
        assert_eq!(versions, [VERSION_LITE_02, VERSION_LITE_01, VERSION_D14]);
        assert_eq!(choose(&versions), Chosen::Lite(LiteVersion::Lite02));
        assert_eq!(
            choose(&[0xff00_0010, VERSION_D14, VERSION_LITE_02]),
            Chosen::Draft14
        );
        assert_eq!(choose(&[0xff00_0010]), Chosen::Unsupported);
    }

    #[test]
    fn draft_18_streams_are_other() {
        // A SUBSCRIBE opening a request stream.
        let m = Message::Subscribe(Subscribe::default()).to_bytes();
        assert_eq!(first_bidi(&m[..1]), Ok(Some(FirstBidi::Other)));
        // SETUP's type (0x2F00) is never on a bidirectional stream, but it
        // is not CLIENT_SETUP either.
        let s = Message::Setup(Setup::default()).to_bytes();
        assert_eq!(first_bidi(&s), Ok(Some(FirstBidi::Other)));
        // CLIENT_SETUP of drafts up to 10.
        let mut old = Vec::new();
        put_vi64(&mut old, 0x40);
        assert_eq!(first_bidi(&old), Ok(Some(FirstBidi::Other)));
    }

    #[test]
    fn malformed_client_setups() {
        // The version list runs past the length.
        assert_eq!(
            first_bidi(&[0x20, 0x00, 0x02, 0x02, 0x01]),
            Err(DecodeError::LengthMismatch)
        );
        // Too many versions.
        assert_eq!(
            first_bidi(&[0x20, 0x00, 0x02, 0x40, 0x41]),
            Err(DecodeError::TooMany)
        );
        // An empty list is a CLIENT_SETUP that offers nothing.
        assert_eq!(
            first_bidi(&[0x20, 0x00, 0x01, 0x00]),
            Ok(Some(FirstBidi::ClientSetup { versions: vec![] }))
        );
    }

    #[test]
    fn choice_of_version() {
        assert_eq!(choose(&[VERSION_D14]), Chosen::Draft14);
        // The client's order decides.
        assert_eq!(
            choose(&[VERSION_LITE_02, VERSION_LITE_01, VERSION_D14]),
            Chosen::Lite(LiteVersion::Lite02)
        );
        assert_eq!(
            choose(&[0xff00_000c, VERSION_D14, VERSION_LITE_02]),
            Chosen::Draft14
        );
        assert_eq!(
            choose(&[VERSION_LITE_01, VERSION_LITE_02]),
            Chosen::Lite(LiteVersion::Lite01)
        );
        assert_eq!(
            choose(&[VERSION_LITE_01]),
            Chosen::Lite(LiteVersion::Lite01)
        );
        assert_eq!(choose(&[0xff00_000c]), Chosen::Unsupported);
        assert_eq!(choose(&[]), Chosen::Unsupported);
        assert_eq!(LiteVersion::Lite02.name(), "moq-lite-02");
        assert_eq!(LiteVersion::Lite01.code(), 0xff0d_ad01);
    }
}
