//! Errors of decoding and of the session state machine, with the draft's codes.

use thiserror::Error;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// More bytes are needed; not an error on a stream that is still open.
    #[error("truncated input")]
    Short,
    /// A length or count exceeds the draft's (or our configured) limit.
    #[error("length exceeds limit")]
    TooLong,
    /// Too many items (fields, parameters, properties).
    #[error("too many items")]
    TooMany,
    /// Unknown control message type.
    #[error("unknown message type {0:#x}")]
    UnknownMessage(u64),
    /// Unknown stream or datagram type.
    #[error("unknown stream or datagram type {0:#x}")]
    UnknownType(u64),
    /// Unknown message parameter (session error per §10.2).
    #[error("unknown message parameter {0:#x}")]
    UnknownParameter(u64),
    /// A control message's length field disagrees with its payload.
    #[error("message length mismatch")]
    LengthMismatch,
    /// A key-value pair whose value does not fit its type.
    #[error("key-value formatting error")]
    KeyValueFormat,
    /// Any other violation of the wire format.
    #[error("invalid: {0}")]
    Invalid(&'static str),
}

impl DecodeError {
    /// The session termination code this error maps to (§3.4).
    pub fn session_code(&self) -> SessionErrorCode {
        match self {
            DecodeError::KeyValueFormat => SessionErrorCode::KeyValueFormattingError,
            _ => SessionErrorCode::ProtocolViolation,
        }
    }
}

/// Session termination error codes (draft-18 §3.4, IANA table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum SessionErrorCode {
    NoError = 0x0,
    InternalError = 0x1,
    Unauthorized = 0x2,
    ProtocolViolation = 0x3,
    InvalidRequestId = 0x4,
    DuplicateTrackAlias = 0x5,
    KeyValueFormattingError = 0x6,
    InvalidPath = 0x8,
    MalformedPath = 0x9,
    GoawayTimeout = 0x10,
    ControlMessageTimeout = 0x11,
    DataStreamTimeout = 0x12,
    AuthTokenCacheOverflow = 0x13,
    DuplicateAuthTokenAlias = 0x14,
    VersionNegotiationFailed = 0x15,
    MalformedAuthToken = 0x16,
    UnknownAuthTokenAlias = 0x17,
    ExpiredAuthToken = 0x18,
    InvalidAuthority = 0x19,
    MalformedAuthority = 0x1A,
}

impl SessionErrorCode {
    /// Every code, for lookups by value.
    const ALL: [(SessionErrorCode, &'static str); 20] = [
        (Self::NoError, "NO_ERROR"),
        (Self::InternalError, "INTERNAL_ERROR"),
        (Self::Unauthorized, "UNAUTHORIZED"),
        (Self::ProtocolViolation, "PROTOCOL_VIOLATION"),
        (Self::InvalidRequestId, "INVALID_REQUEST_ID"),
        (Self::DuplicateTrackAlias, "DUPLICATE_TRACK_ALIAS"),
        (Self::KeyValueFormattingError, "KEY_VALUE_FORMATTING_ERROR"),
        (Self::InvalidPath, "INVALID_PATH"),
        (Self::MalformedPath, "MALFORMED_PATH"),
        (Self::GoawayTimeout, "GOAWAY_TIMEOUT"),
        (Self::ControlMessageTimeout, "CONTROL_MESSAGE_TIMEOUT"),
        (Self::DataStreamTimeout, "DATA_STREAM_TIMEOUT"),
        (Self::AuthTokenCacheOverflow, "AUTH_TOKEN_CACHE_OVERFLOW"),
        (Self::DuplicateAuthTokenAlias, "DUPLICATE_AUTH_TOKEN_ALIAS"),
        (Self::VersionNegotiationFailed, "VERSION_NEGOTIATION_FAILED"),
        (Self::MalformedAuthToken, "MALFORMED_AUTH_TOKEN"),
        (Self::UnknownAuthTokenAlias, "UNKNOWN_AUTH_TOKEN_ALIAS"),
        (Self::ExpiredAuthToken, "EXPIRED_AUTH_TOKEN"),
        (Self::InvalidAuthority, "INVALID_AUTHORITY"),
        (Self::MalformedAuthority, "MALFORMED_AUTHORITY"),
    ];

    /// Wire value.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The code with wire value `code`, if it is one of draft-18's.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(c, _)| c.code() == code)
            .map(|(c, _)| *c)
    }

    /// The draft's name, e.g. `EXPIRED_AUTH_TOKEN`.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(c, _)| *c == self)
            .map_or("UNKNOWN", |(_, n)| n)
    }
}

/// REQUEST_ERROR codes (draft-18 §10.6).
#[allow(missing_docs)]
pub mod request_error {
    pub const INTERNAL_ERROR: u64 = 0x0;
    pub const UNAUTHORIZED: u64 = 0x1;
    pub const TIMEOUT: u64 = 0x2;
    pub const NOT_SUPPORTED: u64 = 0x3;
    pub const MALFORMED_AUTH_TOKEN: u64 = 0x4;
    pub const EXPIRED_AUTH_TOKEN: u64 = 0x5;
    pub const GOING_AWAY: u64 = 0x6;
    pub const EXCESSIVE_LOAD: u64 = 0x9;
    pub const DOES_NOT_EXIST: u64 = 0x10;
    pub const INVALID_RANGE: u64 = 0x11;
    pub const MALFORMED_TRACK: u64 = 0x12;
    pub const DUPLICATE_SUBSCRIPTION: u64 = 0x19;
    pub const UNINTERESTED: u64 = 0x20;
    pub const PREFIX_OVERLAP: u64 = 0x30;
    pub const NAMESPACE_TOO_LARGE: u64 = 0x31;
    pub const INVALID_JOINING_REQUEST_ID: u64 = 0x32;
    pub const UNSUPPORTED_EXTENSION: u64 = 0x33;
    pub const REDIRECT: u64 = 0x34;

    /// The draft's name of a REQUEST_ERROR code, e.g. `UNAUTHORIZED`.
    pub fn name(code: u64) -> Option<&'static str> {
        Some(match code {
            INTERNAL_ERROR => "INTERNAL_ERROR",
            UNAUTHORIZED => "UNAUTHORIZED",
            TIMEOUT => "TIMEOUT",
            NOT_SUPPORTED => "NOT_SUPPORTED",
            MALFORMED_AUTH_TOKEN => "MALFORMED_AUTH_TOKEN",
            EXPIRED_AUTH_TOKEN => "EXPIRED_AUTH_TOKEN",
            GOING_AWAY => "GOING_AWAY",
            EXCESSIVE_LOAD => "EXCESSIVE_LOAD",
            DOES_NOT_EXIST => "DOES_NOT_EXIST",
            INVALID_RANGE => "INVALID_RANGE",
            MALFORMED_TRACK => "MALFORMED_TRACK",
            DUPLICATE_SUBSCRIPTION => "DUPLICATE_SUBSCRIPTION",
            UNINTERESTED => "UNINTERESTED",
            PREFIX_OVERLAP => "PREFIX_OVERLAP",
            NAMESPACE_TOO_LARGE => "NAMESPACE_TOO_LARGE",
            INVALID_JOINING_REQUEST_ID => "INVALID_JOINING_REQUEST_ID",
            UNSUPPORTED_EXTENSION => "UNSUPPORTED_EXTENSION",
            REDIRECT => "REDIRECT",
            _ => return None,
        })
    }

    /// `NAME (0xCODE)`, or the value alone for a code the draft does not name.
    pub fn describe(code: u64) -> String {
        match name(code) {
            Some(n) => format!("{n} ({code:#x})"),
            None => format!("code {code:#x}"),
        }
    }
}

/// PUBLISH_DONE status codes (draft-18 §10.11).
#[allow(missing_docs)]
pub mod publish_done {
    pub const INTERNAL_ERROR: u64 = 0x0;
    pub const UNAUTHORIZED: u64 = 0x1;
    pub const TRACK_ENDED: u64 = 0x2;
    pub const SUBSCRIPTION_ENDED: u64 = 0x3;
    pub const GOING_AWAY: u64 = 0x4;
    pub const TOO_FAR_BEHIND: u64 = 0x5;
    pub const EXPIRED: u64 = 0x6;
    pub const UPDATE_FAILED: u64 = 0x8;
    pub const EXCESSIVE_LOAD: u64 = 0x9;
    pub const MALFORMED_TRACK: u64 = 0x12;
}

/// Stream reset error codes (draft-18 §3.3.3).
#[allow(missing_docs)]
pub mod reset {
    pub const INTERNAL_ERROR: u32 = 0x0;
    pub const CANCELLED: u32 = 0x1;
    pub const DELIVERY_TIMEOUT: u32 = 0x2;
    pub const SESSION_CLOSED: u32 = 0x3;
    pub const GOING_AWAY: u32 = 0x4;
    pub const TOO_FAR_BEHIND: u32 = 0x5;
    pub const UNKNOWN_OBJECT_STATUS: u32 = 0x6;
    pub const EXPIRED_AUTH_TOKEN: u32 = 0x7;
    pub const EXCESSIVE_LOAD: u32 = 0x9;
    pub const MALFORMED_TRACK: u32 = 0x12;
}
