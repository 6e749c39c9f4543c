//! Control messages of draft-18 §10: one enum, one codec.
//!
//! Every message is framed as `Type (vi64) | Length (16) | Payload`. [`Message::encode`]
//! writes the frame; [`Message::decode`] reads one frame from a buffer and
//! returns [`DecodeError::Short`] until the whole frame is present, so the IO
//! layer can accumulate stream bytes and retry.

use bytes::{BufMut, Bytes, BytesMut};

use crate::coding::*;
use crate::deviation::{Deviation, Deviations};
use crate::error::DecodeError;
use crate::names::{FullTrackName, TrackNamespace};
use crate::params::{allowed, Allowed, ParamEncoding, Parameters};

/// Message type codes (§10, table of messages).
#[allow(missing_docs)]
pub mod ty {
    pub const SETUP: u64 = 0x2F00;
    pub const GOAWAY: u64 = 0x10;
    pub const SUBSCRIBE: u64 = 0x3;
    pub const SUBSCRIBE_OK: u64 = 0x4;
    pub const PUBLISH: u64 = 0x1D;
    pub const PUBLISH_OK: u64 = 0x1E;
    pub const PUBLISH_DONE: u64 = 0xB;
    pub const FETCH: u64 = 0x16;
    pub const FETCH_OK: u64 = 0x18;
    pub const TRACK_STATUS: u64 = 0xD;
    pub const PUBLISH_NAMESPACE: u64 = 0x6;
    pub const SUBSCRIBE_NAMESPACE: u64 = 0x50;
    pub const SUBSCRIBE_TRACKS: u64 = 0x51;
    pub const NAMESPACE: u64 = 0x8;
    pub const NAMESPACE_DONE: u64 = 0xE;
    pub const PUBLISH_BLOCKED: u64 = 0xF;
    pub const REQUEST_UPDATE: u64 = 0x2;
    pub const REQUEST_OK: u64 = 0x7;
    pub const REQUEST_ERROR: u64 = 0x5;
    /// Drafts 16 and 17's SUBSCRIBE_NAMESPACE, with Subscribe Options: no
    /// message of draft 18, read as SUBSCRIBE_NAMESPACE or SUBSCRIBE_TRACKS
    /// ([`crate::deviation::Deviation::SubscribeNamespace0x11`]).
    pub const SUBSCRIBE_NAMESPACE_0X11: u64 = 0x11;
}

/// Setup Option types (§10.3.1).
#[allow(missing_docs)]
pub mod setup_option {
    pub const PATH: u64 = 0x01;
    pub const AUTHORIZATION_TOKEN: u64 = 0x03;
    pub const MAX_AUTH_TOKEN_CACHE_SIZE: u64 = 0x04;
    pub const AUTHORITY: u64 = 0x05;
    pub const MOQT_IMPLEMENTATION: u64 = 0x07;
}

/// Largest control message payload (the Length field is 16 bits).
pub const MAX_MESSAGE: usize = 0xffff;
/// Reason phrases are at most 1024 bytes.
pub const MAX_REASON: usize = 1024;
/// GOAWAY's New Session URI is at most 8192 bytes.
pub const MAX_URI: usize = 8192;

/// SETUP (§10.3): each side's first message on its control stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Setup {
    /// Setup Options as Key-Value-Pairs; unknown ones are kept and ignored.
    pub options: Vec<KeyValue>,
}

impl Setup {
    /// The first byte-string option of `kind`, if any.
    pub fn bytes_option(&self, kind: u64) -> Option<&Bytes> {
        self.options.iter().find_map(|kv| match &kv.value {
            KvValue::Bytes(b) if kv.kind == kind => Some(b),
            _ => None,
        })
    }

    /// The PATH option.
    pub fn path(&self) -> Option<&Bytes> {
        self.bytes_option(setup_option::PATH)
    }

    /// The AUTHORITY option.
    pub fn authority(&self) -> Option<&Bytes> {
        self.bytes_option(setup_option::AUTHORITY)
    }

    /// The MOQT_IMPLEMENTATION option.
    pub fn implementation(&self) -> Option<&Bytes> {
        self.bytes_option(setup_option::MOQT_IMPLEMENTATION)
    }
}

/// GOAWAY (§10.4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GoAway {
    /// Where to reconnect; empty means the current URI.
    pub new_session_uri: Bytes,
    /// Milliseconds the sender waits before closing.
    pub timeout: u64,
    /// Smallest peer Request ID not processed; present only on the control stream.
    pub request_id: Option<u64>,
}

/// SUBSCRIBE (§10.7) and TRACK_STATUS (§10.14), which share a format.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscribe {
    /// Request ID.
    pub request_id: u64,
    /// Track.
    pub track: FullTrackName,
    /// Parameters.
    pub params: Parameters,
}

/// SUBSCRIBE_OK (§10.8).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscribeOk {
    /// Track Alias used on data streams and datagrams.
    pub track_alias: u64,
    /// Parameters.
    pub params: Parameters,
    /// Track Properties.
    pub properties: Vec<KeyValue>,
}

/// PUBLISH (§10.10).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Publish {
    /// Request ID.
    pub request_id: u64,
    /// Track.
    pub track: FullTrackName,
    /// Track Alias.
    pub track_alias: u64,
    /// Parameters.
    pub params: Parameters,
    /// Track Properties.
    pub properties: Vec<KeyValue>,
}

/// REQUEST_OK (§10.5), also the body of PUBLISH_OK.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestOk {
    /// Parameters.
    pub params: Parameters,
    /// Track Properties (only in TRACK_STATUS_OK).
    pub properties: Vec<KeyValue>,
}

/// Redirect structure of REQUEST_ERROR (§10.6.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Redirect {
    /// URI to connect to; empty means the current session's.
    pub connect_uri: Bytes,
    /// Track to request instead (both empty means unchanged).
    pub track: FullTrackName,
}

/// REQUEST_ERROR (§10.6).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestError {
    /// Error code (see [`crate::error::request_error`]).
    pub code: u64,
    /// Minimum retry delay in ms plus one; 0 means do not retry.
    pub retry_interval: u64,
    /// Reason phrase.
    pub reason: Bytes,
    /// Present only when `code` is REDIRECT.
    pub redirect: Option<Redirect>,
}

/// PUBLISH_DONE (§10.11).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishDone {
    /// Status code (see [`crate::error::publish_done`]).
    pub status: u64,
    /// Number of data streams opened for the subscription.
    pub stream_count: u64,
    /// Reason phrase.
    pub reason: Bytes,
}

/// The three kinds of FETCH (§10.12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchKind {
    /// Standalone (0x1): an explicit track and range; `end` is the last Object plus one
    /// (object 0 meaning the whole group).
    Standalone {
        /// Track.
        track: FullTrackName,
        /// First Location.
        start: Location,
        /// End Location (exclusive object, 0 = whole group).
        end: Location,
    },
    /// Relative joining (0x2): start `joining_start` groups before the joining location.
    RelativeJoining {
        /// Request ID of the subscription to join.
        joining_request_id: u64,
        /// Groups back from the Joining Location.
        joining_start: u64,
    },
    /// Absolute joining (0x3): start at group `joining_start`.
    AbsoluteJoining {
        /// Request ID of the subscription to join.
        joining_request_id: u64,
        /// First group.
        joining_start: u64,
    },
}

impl Default for FetchKind {
    fn default() -> Self {
        Self::Standalone {
            track: FullTrackName::default(),
            start: Location::default(),
            end: Location::default(),
        }
    }
}

/// FETCH (§10.12).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fetch {
    /// Request ID.
    pub request_id: u64,
    /// Standalone or joining.
    pub kind: FetchKind,
    /// Parameters.
    pub params: Parameters,
}

/// FETCH_OK (§10.13).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FetchOk {
    /// All objects of the track have been published and `end_location` is the last.
    pub end_of_track: bool,
    /// End of the range served (last object plus one, or object 0 for whole group).
    pub end_location: Location,
    /// Parameters.
    pub params: Parameters,
    /// Track Properties.
    pub properties: Vec<KeyValue>,
}

/// PUBLISH_NAMESPACE (§10.15), SUBSCRIBE_NAMESPACE (§10.18) and
/// SUBSCRIBE_TRACKS (§10.19) share this shape.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceRequest {
    /// Request ID.
    pub request_id: u64,
    /// Namespace (or prefix).
    pub namespace: TrackNamespace,
    /// Parameters.
    pub params: Parameters,
}

/// PUBLISH_BLOCKED (§10.20).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishBlocked {
    /// Namespace suffix after the SUBSCRIBE_TRACKS prefix.
    pub suffix: TrackNamespace,
    /// Track Name.
    pub name: Bytes,
}

/// REQUEST_UPDATE (§10.9).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestUpdate {
    /// Request ID (a new one, consumed by the update).
    pub request_id: u64,
    /// Parameters to change.
    pub params: Parameters,
}

/// Any draft-18 control message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Message {
    Setup(Setup),
    GoAway(GoAway),
    Subscribe(Subscribe),
    SubscribeOk(SubscribeOk),
    Publish(Publish),
    /// PUBLISH_OK (0x1E): REQUEST_OK's layout; `properties` is never sent and must
    /// be empty on receipt.
    PublishOk(RequestOk),
    PublishDone(PublishDone),
    Fetch(Fetch),
    FetchOk(FetchOk),
    TrackStatus(Subscribe),
    PublishNamespace(NamespaceRequest),
    SubscribeNamespace(NamespaceRequest),
    SubscribeTracks(NamespaceRequest),
    Namespace(TrackNamespace),
    NamespaceDone(TrackNamespace),
    PublishBlocked(PublishBlocked),
    RequestUpdate(RequestUpdate),
    RequestOk(RequestOk),
    RequestError(RequestError),
}

/// Parameters allowed in TRACK_STATUS (§10.14: SUBSCRIBE's, minus delivery ones).
const TRACK_STATUS_ALLOWED: Allowed = allowed::TRACK_STATUS;

/// What SUBSCRIBE_OK is read with: its own set, and GROUP_ORDER, which is
/// then dropped ([`Deviation::SubscribeOkGroupOrder`]).
const SUBSCRIBE_OK_READ: Allowed = Allowed::of(&[
    crate::params::kind::EXPIRES,
    crate::params::kind::LARGEST_OBJECT,
    crate::params::kind::GROUP_ORDER,
]);

impl Message {
    /// The message type code.
    pub fn type_id(&self) -> u64 {
        use Message::*;
        match self {
            Setup(_) => ty::SETUP,
            GoAway(_) => ty::GOAWAY,
            Subscribe(_) => ty::SUBSCRIBE,
            SubscribeOk(_) => ty::SUBSCRIBE_OK,
            Publish(_) => ty::PUBLISH,
            PublishOk(_) => ty::PUBLISH_OK,
            PublishDone(_) => ty::PUBLISH_DONE,
            Fetch(_) => ty::FETCH,
            FetchOk(_) => ty::FETCH_OK,
            TrackStatus(_) => ty::TRACK_STATUS,
            PublishNamespace(_) => ty::PUBLISH_NAMESPACE,
            SubscribeNamespace(_) => ty::SUBSCRIBE_NAMESPACE,
            SubscribeTracks(_) => ty::SUBSCRIBE_TRACKS,
            Namespace(_) => ty::NAMESPACE,
            NamespaceDone(_) => ty::NAMESPACE_DONE,
            PublishBlocked(_) => ty::PUBLISH_BLOCKED,
            RequestUpdate(_) => ty::REQUEST_UPDATE,
            RequestOk(_) => ty::REQUEST_OK,
            RequestError(_) => ty::REQUEST_ERROR,
        }
    }

    /// The spec's name of the message, for logs and test reports.
    pub fn name(&self) -> &'static str {
        use Message::*;
        match self {
            Setup(_) => "SETUP",
            GoAway(_) => "GOAWAY",
            Subscribe(_) => "SUBSCRIBE",
            SubscribeOk(_) => "SUBSCRIBE_OK",
            Publish(_) => "PUBLISH",
            PublishOk(_) => "PUBLISH_OK",
            PublishDone(_) => "PUBLISH_DONE",
            Fetch(_) => "FETCH",
            FetchOk(_) => "FETCH_OK",
            TrackStatus(_) => "TRACK_STATUS",
            PublishNamespace(_) => "PUBLISH_NAMESPACE",
            SubscribeNamespace(_) => "SUBSCRIBE_NAMESPACE",
            SubscribeTracks(_) => "SUBSCRIBE_TRACKS",
            Namespace(_) => "NAMESPACE",
            NamespaceDone(_) => "NAMESPACE_DONE",
            PublishBlocked(_) => "PUBLISH_BLOCKED",
            RequestUpdate(_) => "REQUEST_UPDATE",
            RequestOk(_) => "REQUEST_OK",
            RequestError(_) => "REQUEST_ERROR",
        }
    }

    /// The Request ID carried by a request message.
    pub fn request_id(&self) -> Option<u64> {
        use Message::*;
        match self {
            Subscribe(m) | TrackStatus(m) => Some(m.request_id),
            Publish(m) => Some(m.request_id),
            Fetch(m) => Some(m.request_id),
            PublishNamespace(m) | SubscribeNamespace(m) | SubscribeTracks(m) => Some(m.request_id),
            RequestUpdate(m) => Some(m.request_id),
            _ => None,
        }
    }

    /// True for the seven message types that may open a request stream (§3.3).
    pub fn opens_request_stream(&self) -> bool {
        use Message::*;
        matches!(
            self,
            TrackStatus(_)
                | Subscribe(_)
                | Publish(_)
                | Fetch(_)
                | PublishNamespace(_)
                | SubscribeNamespace(_)
                | SubscribeTracks(_)
        )
    }

    /// Appends the framed message (type, 16-bit length, payload).
    ///
    /// # Panics
    /// If the payload exceeds 65535 bytes, which only a local caller can cause
    /// (names and parameters are bounded far below that).
    pub fn encode(&self, out: &mut BytesMut) {
        put_vi64(out, self.type_id());
        let len_at = out.len();
        out.put_u16(0);
        let start = out.len();
        self.encode_payload(out);
        let len = out.len() - start;
        assert!(len <= MAX_MESSAGE, "control message too large");
        out[len_at..len_at + 2].copy_from_slice(&(len as u16).to_be_bytes());
    }

    /// Encodes into a fresh buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64);
        self.encode(&mut b);
        b.freeze()
    }

    fn encode_payload(&self, b: &mut BytesMut) {
        use Message::*;
        match self {
            Setup(m) => put_kvps(b, &m.options),
            GoAway(m) => {
                put_lp_bytes(b, &m.new_session_uri);
                put_vi64(b, m.timeout);
                if let Some(id) = m.request_id {
                    put_vi64(b, id);
                }
            }
            Subscribe(m) | TrackStatus(m) => {
                put_vi64(b, m.request_id);
                m.track.encode(b);
                m.params.encode(b);
            }
            SubscribeOk(m) => {
                put_vi64(b, m.track_alias);
                m.params.encode(b);
                put_kvps(b, &m.properties);
            }
            Publish(m) => {
                put_vi64(b, m.request_id);
                m.track.encode(b);
                put_vi64(b, m.track_alias);
                m.params.encode(b);
                put_kvps(b, &m.properties);
            }
            // PUBLISH_OK's Track Properties are always empty on the wire (§10.5).
            PublishOk(m) => m.params.encode(b),
            RequestOk(m) => {
                m.params.encode(b);
                put_kvps(b, &m.properties);
            }
            PublishDone(m) => {
                put_vi64(b, m.status);
                put_vi64(b, m.stream_count);
                put_lp_bytes(b, &m.reason);
            }
            Fetch(m) => {
                put_vi64(b, m.request_id);
                match &m.kind {
                    FetchKind::Standalone { track, start, end } => {
                        put_vi64(b, 1);
                        track.encode(b);
                        start.encode(b);
                        end.encode(b);
                    }
                    FetchKind::RelativeJoining {
                        joining_request_id,
                        joining_start,
                    } => {
                        put_vi64(b, 2);
                        put_vi64(b, *joining_request_id);
                        put_vi64(b, *joining_start);
                    }
                    FetchKind::AbsoluteJoining {
                        joining_request_id,
                        joining_start,
                    } => {
                        put_vi64(b, 3);
                        put_vi64(b, *joining_request_id);
                        put_vi64(b, *joining_start);
                    }
                }
                m.params.encode(b);
            }
            FetchOk(m) => {
                b.put_u8(m.end_of_track as u8);
                m.end_location.encode(b);
                m.params.encode(b);
                put_kvps(b, &m.properties);
            }
            PublishNamespace(m) | SubscribeNamespace(m) | SubscribeTracks(m) => {
                put_vi64(b, m.request_id);
                m.namespace.encode(b);
                m.params.encode(b);
            }
            Namespace(ns) | NamespaceDone(ns) => ns.encode(b),
            PublishBlocked(m) => {
                m.suffix.encode(b);
                put_lp_bytes(b, &m.name);
            }
            RequestUpdate(m) => {
                put_vi64(b, m.request_id);
                m.params.encode(b);
            }
            RequestError(m) => {
                put_vi64(b, m.code);
                put_vi64(b, m.retry_interval);
                put_lp_bytes(b, &m.reason);
                if let Some(r) = &m.redirect {
                    put_lp_bytes(b, &r.connect_uri);
                    r.track.encode(b);
                }
            }
        }
    }

    /// Decodes one framed message from the front of `buf`, advancing it.
    ///
    /// `src` must be the `Bytes` that `buf` borrows from, so byte fields are
    /// zero-copy. Returns [`DecodeError::Short`] (leaving `buf` untouched) until a
    /// whole frame is available. The deviations of widely used peers that
    /// [`crate::deviation`] lists are accepted ([`Message::decode_noting`]
    /// says which).
    pub fn decode(buf: &mut &[u8], src: &Bytes) -> Result<Self, DecodeError> {
        Self::decode_noting(buf, src).map(|(m, _)| m)
    }

    /// [`Message::decode`], also returning the deviations from draft 18 it
    /// accepted.
    ///
    /// A frame is decoded as draft 18 first; only one that fails is decoded
    /// again with its uint8 parameters read as vi64s
    /// ([`ParamEncoding::Uint8AsVarint`]), and taken if it then decodes
    /// exactly (a conforming message never reaches that second reading).
    pub fn decode_noting(buf: &mut &[u8], src: &Bytes) -> Result<(Self, Deviations), DecodeError> {
        let mut cur = *buf;
        let t = get_vi64(&mut cur)?;
        let len = get_u16(&mut cur)? as usize;
        if cur.len() < len {
            return Err(DecodeError::Short);
        }
        let (p, rest) = cur.split_at(len);
        let decoded = match Self::decode_frame(t, p, src, ParamEncoding::Draft18) {
            Ok(d) => d,
            Err(e @ DecodeError::UnknownMessage(_)) => return Err(e),
            Err(e) => match Self::decode_frame(t, p, src, ParamEncoding::Uint8AsVarint) {
                Ok((m, mut d)) => {
                    d.insert(Deviation::Uint8ParametersAsVarints);
                    (m, d)
                }
                // The draft-18 reading's error is the one to report.
                Err(_) => return Err(e),
            },
        };
        *buf = rest;
        Ok(decoded)
    }

    /// Decodes the payload `p` of a frame of type `t`, all of it.
    fn decode_frame(
        t: u64,
        mut p: &[u8],
        src: &Bytes,
        encoding: ParamEncoding,
    ) -> Result<(Self, Deviations), DecodeError> {
        let mut noted = Deviations::NONE;
        let msg =
            Self::decode_payload(t, &mut p, src, encoding, &mut noted).map_err(|e| match e {
                // Inside a complete frame, running out of bytes means the length lied.
                DecodeError::Short => DecodeError::LengthMismatch,
                e => e,
            })?;
        if !p.is_empty() {
            return Err(DecodeError::LengthMismatch);
        }
        Ok((msg, noted))
    }

    /// Decodes from an owned buffer holding exactly one or more frames.
    pub fn decode_bytes(src: &Bytes) -> Result<(Self, usize), DecodeError> {
        let mut s = &src[..];
        let m = Self::decode(&mut s, src)?;
        Ok((m, src.len() - s.len()))
    }

    fn decode_payload(
        t: u64,
        p: &mut &[u8],
        src: &Bytes,
        encoding: ParamEncoding,
        noted: &mut Deviations,
    ) -> Result<Self, DecodeError> {
        let read_params =
            |p: &mut &[u8], allowed: Allowed| Parameters::decode_as(p, src, allowed, encoding);
        Ok(match t {
            ty::SETUP => {
                let options = get_kvps(p, src).map_err(kv_error)?;
                Message::Setup(Setup { options })
            }
            ty::GOAWAY => {
                let uri = get_lp_bytes(p, MAX_URI)?;
                let timeout = get_vi64(p)?;
                let request_id = if p.is_empty() {
                    None
                } else {
                    Some(get_vi64(p)?)
                };
                Message::GoAway(GoAway {
                    new_session_uri: slice_of(src, uri),
                    timeout,
                    request_id,
                })
            }
            ty::SUBSCRIBE | ty::TRACK_STATUS => {
                let request_id = get_vi64(p)?;
                let track = FullTrackName::decode(p, src)?;
                let allowed = if t == ty::SUBSCRIBE {
                    allowed::SUBSCRIBE
                } else {
                    TRACK_STATUS_ALLOWED
                };
                let params = read_params(p, allowed)?;
                let m = Subscribe {
                    request_id,
                    track,
                    params,
                };
                if t == ty::SUBSCRIBE {
                    Message::Subscribe(m)
                } else {
                    Message::TrackStatus(m)
                }
            }
            ty::SUBSCRIBE_OK => {
                let track_alias = get_vi64(p)?;
                // GROUP_ORDER is read (moq-net 0.1 sends it) and dropped.
                let mut params = read_params(p, SUBSCRIBE_OK_READ)?;
                if params.group_order.take().is_some() {
                    noted.insert(Deviation::SubscribeOkGroupOrder);
                }
                let properties = get_kvps(p, src).map_err(kv_error)?;
                Message::SubscribeOk(SubscribeOk {
                    track_alias,
                    params,
                    properties,
                })
            }
            ty::PUBLISH => {
                let request_id = get_vi64(p)?;
                let track = FullTrackName::decode(p, src)?;
                let track_alias = get_vi64(p)?;
                let params = read_params(p, allowed::PUBLISH)?;
                let properties = get_kvps(p, src).map_err(kv_error)?;
                Message::Publish(Publish {
                    request_id,
                    track,
                    track_alias,
                    params,
                    properties,
                })
            }
            ty::PUBLISH_OK => {
                // PUBLISH_OK has the REQUEST_OK layout; its Track Properties MUST be
                // empty (§10.5), and only parameters that list PUBLISH_OK may appear.
                let params = read_params(p, allowed::PUBLISH_OK)?;
                if !p.is_empty() {
                    return Err(DecodeError::Invalid("track properties in PUBLISH_OK"));
                }
                Message::PublishOk(RequestOk {
                    params,
                    properties: Vec::new(),
                })
            }
            ty::REQUEST_OK => {
                let params = read_params(p, allowed::REQUEST_OK)?;
                let properties = get_kvps(p, src).map_err(kv_error)?;
                Message::RequestOk(RequestOk { params, properties })
            }
            ty::PUBLISH_DONE => {
                let status = get_vi64(p)?;
                let stream_count = get_vi64(p)?;
                let reason = get_lp_bytes(p, MAX_REASON)?;
                Message::PublishDone(PublishDone {
                    status,
                    stream_count,
                    reason: slice_of(src, reason),
                })
            }
            ty::FETCH => {
                let request_id = get_vi64(p)?;
                let kind = match get_vi64(p)? {
                    1 => {
                        let track = FullTrackName::decode(p, src)?;
                        let start = Location::decode(p)?;
                        let end = Location::decode(p)?;
                        FetchKind::Standalone { track, start, end }
                    }
                    2 => FetchKind::RelativeJoining {
                        joining_request_id: get_vi64(p)?,
                        joining_start: get_vi64(p)?,
                    },
                    3 => FetchKind::AbsoluteJoining {
                        joining_request_id: get_vi64(p)?,
                        joining_start: get_vi64(p)?,
                    },
                    _ => return Err(DecodeError::Invalid("fetch type")),
                };
                let params = read_params(p, allowed::FETCH)?;
                Message::Fetch(Fetch {
                    request_id,
                    kind,
                    params,
                })
            }
            ty::FETCH_OK => {
                let end_of_track = match get_u8(p)? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("end of track")),
                };
                let end_location = Location::decode(p)?;
                let params = read_params(p, allowed::FETCH_OK)?;
                let properties = get_kvps(p, src).map_err(kv_error)?;
                Message::FetchOk(FetchOk {
                    end_of_track,
                    end_location,
                    params,
                    properties,
                })
            }
            ty::PUBLISH_NAMESPACE | ty::SUBSCRIBE_NAMESPACE | ty::SUBSCRIBE_TRACKS => {
                let request_id = get_vi64(p)?;
                let namespace = TrackNamespace::decode(p, src)?;
                let allowed = match t {
                    ty::PUBLISH_NAMESPACE => allowed::PUBLISH_NAMESPACE,
                    ty::SUBSCRIBE_NAMESPACE => allowed::SUBSCRIBE_NAMESPACE,
                    _ => allowed::SUBSCRIBE_TRACKS,
                };
                let params = read_params(p, allowed)?;
                let m = NamespaceRequest {
                    request_id,
                    namespace,
                    params,
                };
                match t {
                    ty::PUBLISH_NAMESPACE => Message::PublishNamespace(m),
                    ty::SUBSCRIBE_NAMESPACE => Message::SubscribeNamespace(m),
                    _ => Message::SubscribeTracks(m),
                }
            }
            ty::SUBSCRIBE_NAMESPACE_0X11 => {
                // Draft 16's layout, as moq-net 0.1 writes it at draft 18:
                // Request ID, prefix, Subscribe Options, parameters.
                let request_id = get_vi64(p)?;
                let namespace = TrackNamespace::decode(p, src)?;
                let namespaces = match get_vi64(p)? {
                    0 => false,
                    1 => true,
                    // Both (2) would be two draft-18 requests on one stream.
                    _ => return Err(DecodeError::Invalid("subscribe options")),
                };
                let allowed = if namespaces {
                    allowed::SUBSCRIBE_NAMESPACE
                } else {
                    allowed::SUBSCRIBE_TRACKS
                };
                let m = NamespaceRequest {
                    request_id,
                    namespace,
                    params: read_params(p, allowed)?,
                };
                noted.insert(Deviation::SubscribeNamespace0x11);
                if namespaces {
                    Message::SubscribeNamespace(m)
                } else {
                    Message::SubscribeTracks(m)
                }
            }
            ty::NAMESPACE => Message::Namespace(TrackNamespace::decode(p, src)?),
            ty::NAMESPACE_DONE => Message::NamespaceDone(TrackNamespace::decode(p, src)?),
            ty::PUBLISH_BLOCKED => {
                let suffix = TrackNamespace::decode(p, src)?;
                let name = get_lp_bytes(p, crate::names::MAX_FULL_NAME)?;
                Message::PublishBlocked(PublishBlocked {
                    suffix,
                    name: slice_of(src, name),
                })
            }
            ty::REQUEST_UPDATE => {
                let request_id = get_vi64(p)?;
                let params = read_params(p, allowed::REQUEST_UPDATE)?;
                Message::RequestUpdate(RequestUpdate { request_id, params })
            }
            ty::REQUEST_ERROR => {
                let code = get_vi64(p)?;
                let retry_interval = get_vi64(p)?;
                let reason = slice_of(src, get_lp_bytes(p, MAX_REASON)?);
                let redirect = if code == crate::error::request_error::REDIRECT {
                    let uri = get_lp_bytes(p, MAX_URI)?;
                    let track = FullTrackName::decode(p, src)?;
                    Some(Redirect {
                        connect_uri: slice_of(src, uri),
                        track,
                    })
                } else {
                    None
                };
                Message::RequestError(RequestError {
                    code,
                    retry_interval,
                    reason,
                    redirect,
                })
            }
            other => return Err(DecodeError::UnknownMessage(other)),
        })
    }
}

/// Properties and setup options are Key-Value-Pairs; a pair whose value runs past
/// the end of the message is a KEY_VALUE_FORMATTING_ERROR rather than a plain
/// protocol violation. A byte value longer than 65535 stays [`DecodeError::TooLong`]
/// (PROTOCOL_VIOLATION), as §1.4.3 requires.
fn kv_error(e: DecodeError) -> DecodeError {
    match e {
        DecodeError::Short => DecodeError::KeyValueFormat,
        e => e,
    }
}

#[cfg(test)]
mod tests;
