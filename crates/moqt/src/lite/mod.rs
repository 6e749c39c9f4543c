//! moq-lite (draft-lcurley-moq-lite-01 … -06), the protocol of moq-dev's
//! clients (`moq-clock`, the `moq` CLI, `moq-relay`, `@moq/watch`,
//! `@moq/publish`), as those clients put it on the wire: moq-dev's `moq-net`
//! 0.3.18 and `@moq/net` 0.2.8 / 0.1.9 are authoritative where the draft
//! text differs (`docs/drafts.md`, `crates/moqt/INTEROP.md`).
//!
//! Written here rather than taken from `moq-net`: its `lite` and `coding`
//! modules are private (only its async session API is public, and serving
//! lite subscribers through it would fan out with moq-net's cost, not the
//! relay's), and the relay needs every version at once, pure, without
//! sockets. The relay's core stays draft 18; `quichub_net::lite` bridges a
//! lite session to it with these codecs.
//!
//! Sans-IO: bytes in, values out. Every decoder takes `&mut &[u8]`, advances
//! it only on success and answers [`DecodeError::Short`] when more bytes are
//! needed (a stream still open), so the IO layer can retry with more.
//!
//! Modules: [`message`] (control messages, every version), [`group`] (group
//! streams, frames and datagrams), [`path`] (broadcast paths and their
//! MoQT namespaces).

pub mod group;
pub mod message;
pub mod path;
mod wire;

pub use crate::DecodeError;

/// A moq-lite wire version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    /// lite-01: legacy CLIENT_SETUP (`moql` or no protocol), SUBSCRIBE_OK with a priority.
    Lite01,
    /// lite-02: as lite-01, SUBSCRIBE_OK empty.
    Lite02,
    /// lite-03: chosen by ALPN; typed subscribe responses, hop counts.
    Lite03,
    /// lite-04: hop lists, exclude hop, GOAWAY.
    Lite04,
    /// lite-05: SETUP stream, TRACK stream, frame timestamps, datagrams, ANNOUNCE_OK.
    Lite05,
    /// lite-06 (moq-net 0.3.18's): announce ids, route cost, frame bounds.
    Lite06,
}

/// ALPN / subprotocol of lite-01 and lite-02 (the version is then chosen in
/// the legacy CLIENT_SETUP, as with no protocol at all).
pub const ALPN_LEGACY: &str = "moql";

/// Stream types (the first varint of every stream).
pub mod stream {
    /// Bidi, lite-01/02: the legacy CLIENT_SETUP's type byte, first stream of the client.
    pub const SESSION_COMPAT: u64 = 0x20;
    /// Bidi: ANNOUNCE_REQUEST and the announcements that answer it.
    pub const ANNOUNCE: u64 = 0x1;
    /// Bidi: SUBSCRIBE, its updates and responses.
    pub const SUBSCRIBE: u64 = 0x2;
    /// Bidi: FETCH of one group (lite-05+ in practice).
    pub const FETCH: u64 = 0x3;
    /// Bidi: PROBE.
    pub const PROBE: u64 = 0x4;
    /// Bidi: GOAWAY (lite-04+).
    pub const GOAWAY: u64 = 0x5;
    /// Bidi: TRACK and TRACK_INFO (lite-05+).
    pub const TRACK: u64 = 0x6;
    /// Uni: a group's frames.
    pub const GROUP: u64 = 0x0;
    /// Uni: SETUP (lite-05+), once per endpoint.
    pub const SETUP: u64 = 0x1;
}

/// What a raw-QUIC ALPN or WebTransport / QMux subprotocol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negotiated {
    /// This version (lite-03 and later).
    Version(Version),
    /// `moql`: lite-01/02 (or draft 14) chosen by the legacy CLIENT_SETUP.
    Legacy,
}

impl Version {
    /// Every version, newest first (the server's order of preference).
    pub const ALL: [Version; 6] = [
        Version::Lite06,
        Version::Lite05,
        Version::Lite04,
        Version::Lite03,
        Version::Lite02,
        Version::Lite01,
    ];

    /// The ALPNs the relay offers for lite, newest first (`moql` last).
    pub const ALPNS: [&'static str; 5] = [
        "moq-lite-06",
        "moq-lite-05",
        "moq-lite-04",
        "moq-lite-03",
        ALPN_LEGACY,
    ];

    /// The ALPN / subprotocol that selects this version (`moql` for 01/02).
    pub fn alpn(self) -> &'static str {
        match self {
            Version::Lite01 | Version::Lite02 => ALPN_LEGACY,
            Version::Lite03 => "moq-lite-03",
            Version::Lite04 => "moq-lite-04",
            Version::Lite05 => "moq-lite-05",
            Version::Lite06 => "moq-lite-06",
        }
    }

    /// What an ALPN or subprotocol names, if it is a lite one.
    pub fn from_alpn(alpn: &[u8]) -> Option<Negotiated> {
        Some(match alpn {
            b"moql" => Negotiated::Legacy,
            b"moq-lite-03" => Negotiated::Version(Version::Lite03),
            b"moq-lite-04" => Negotiated::Version(Version::Lite04),
            b"moq-lite-05" => Negotiated::Version(Version::Lite05),
            b"moq-lite-06" => Negotiated::Version(Version::Lite06),
            _ => return None,
        })
    }

    /// The version code of a legacy CLIENT_SETUP / SERVER_SETUP (`0xff0dad0N`).
    pub fn setup_code(self) -> u64 {
        0xff0d_ad00 + u64::from(self.number())
    }

    /// The version a legacy CLIENT_SETUP code names, if it is lite-01 or
    /// lite-02 (the only ones negotiated that way).
    pub fn from_setup_code(code: u64) -> Option<Self> {
        match code {
            0xff0d_ad01 => Some(Version::Lite01),
            0xff0d_ad02 => Some(Version::Lite02),
            _ => None,
        }
    }

    /// 1 to 6, for logs and metrics labels.
    pub fn number(self) -> u8 {
        match self {
            Version::Lite01 => 1,
            Version::Lite02 => 2,
            Version::Lite03 => 3,
            Version::Lite04 => 4,
            Version::Lite05 => 5,
            Version::Lite06 => 6,
        }
    }

    /// `moq-lite-0N`, for logs and metrics labels.
    pub fn label(self) -> &'static str {
        match self {
            Version::Lite01 => "moq-lite-01",
            Version::Lite02 => "moq-lite-02",
            Version::Lite03 => "moq-lite-03",
            Version::Lite04 => "moq-lite-04",
            Version::Lite05 => "moq-lite-05",
            Version::Lite06 => "moq-lite-06",
        }
    }

    /// lite-01/02: the legacy CLIENT_SETUP stream stays open as the session stream.
    pub fn has_session_stream(self) -> bool {
        self <= Version::Lite02
    }

    /// lite-05+: each endpoint opens one SETUP uni stream.
    pub fn has_setup_stream(self) -> bool {
        self >= Version::Lite05
    }

    /// lite-05+: frames carry a timestamp; TRACK streams; datagrams; ANNOUNCE_OK;
    /// SUBSCRIBE_START/END in place of SUBSCRIBE_OK.
    pub fn has_track_stream(self) -> bool {
        self >= Version::Lite05
    }

    /// lite-04+: GOAWAY streams.
    pub fn has_goaway(self) -> bool {
        self >= Version::Lite04
    }

    /// lite-06: typed announcements with ids, route cost, frame bounds.
    pub fn has_announce_ids(self) -> bool {
        self >= Version::Lite06
    }
}
