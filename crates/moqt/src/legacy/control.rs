//! The control messages of drafts 14 and 16, decoded into and encoded from
//! the draft-18 message model ([`crate::message`]).
//!
//! Before draft 17 every request and its replies shared one bidirectional
//! control stream, so each reply names the request it answers; draft 18 puts
//! each request on its own stream and drops those Request IDs. [`Control`]
//! carries the legacy framing around the draft-18 values: a request is a
//! draft-18 [`Message`], a reply is the draft-18 reply plus the Request ID it
//! answers, and the messages draft 18 replaced with stream operations
//! (UNSUBSCRIBE, FETCH_CANCEL, PUBLISH_NAMESPACE_DONE, ...) are variants of
//! their own.
//!
//! Draft 14 differs from 16 in most request layouts (fields where 16 has
//! parameters, an OK and an ERROR type per request, namespaces named rather
//! than numbered): a reply carries the [`RequestKind`] it answers so the
//! encoder can pick draft 14's type. See `docs/drafts.md`.
//!
//! Integers are QUIC varints ([`super::varint`]); a draft-18 value that does
//! not fit one (≥ 2^62) cannot be sent and is an [`EncodeError`].

use bytes::{BufMut, Bytes, BytesMut};

use super::varint::{fits, get_lp, get_varint, put_lp, put_varint};
use super::Draft;
use crate::coding::{get_u16, get_u8, slice_of, KeyValue, KvValue, Location, KV_MAX_VALUE};
use crate::error::{publish_done, request_error, DecodeError};
use crate::message::{
    Fetch, FetchKind, FetchOk, NamespaceRequest, Publish, PublishDone, RequestError, RequestOk,
    Subscribe, SubscribeOk, MAX_MESSAGE, MAX_REASON, MAX_URI,
};
use crate::names::{FullTrackName, TrackNamespace, MAX_FULL_NAME, MAX_NAMESPACE_FIELDS};
use crate::params::{kind, GroupOrder, Parameters, SubscriptionFilter, MAX_PARAMS, MAX_TOKEN};
use crate::Message;

/// Message types of draft 16 (§9 of that draft).
#[allow(missing_docs)]
pub mod ty {
    pub const CLIENT_SETUP: u64 = 0x20;
    pub const SERVER_SETUP: u64 = 0x21;
    pub const GOAWAY: u64 = 0x10;
    pub const MAX_REQUEST_ID: u64 = 0x15;
    pub const REQUESTS_BLOCKED: u64 = 0x1A;
    pub const REQUEST_OK: u64 = 0x7;
    pub const REQUEST_ERROR: u64 = 0x5;
    pub const SUBSCRIBE: u64 = 0x3;
    pub const SUBSCRIBE_OK: u64 = 0x4;
    pub const REQUEST_UPDATE: u64 = 0x2;
    pub const UNSUBSCRIBE: u64 = 0xA;
    pub const PUBLISH: u64 = 0x1D;
    pub const PUBLISH_OK: u64 = 0x1E;
    pub const PUBLISH_DONE: u64 = 0xB;
    pub const FETCH: u64 = 0x16;
    pub const FETCH_OK: u64 = 0x18;
    pub const FETCH_CANCEL: u64 = 0x17;
    pub const TRACK_STATUS: u64 = 0xD;
    pub const PUBLISH_NAMESPACE: u64 = 0x6;
    pub const NAMESPACE: u64 = 0x8;
    pub const PUBLISH_NAMESPACE_DONE: u64 = 0x9;
    pub const NAMESPACE_DONE: u64 = 0xE;
    pub const PUBLISH_NAMESPACE_CANCEL: u64 = 0xC;
    pub const SUBSCRIBE_NAMESPACE: u64 = 0x11;
}

/// Setup parameter MAX_REQUEST_ID (drafts 14 and 16 only).
pub const SETUP_MAX_REQUEST_ID: u64 = 0x02;

/// SUBSCRIBE_NAMESPACE's Subscribe Options (draft 16): what the subscriber
/// wants for matching tracks and namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscribeOptions {
    /// PUBLISH messages only (0x00): draft 18's SUBSCRIBE_TRACKS.
    Publish,
    /// NAMESPACE messages only (0x01): draft 18's SUBSCRIBE_NAMESPACE.
    Namespace,
    /// Both (0x02).
    Both,
}

/// The kind of request a reply answers. Draft 14 has a reply type per kind
/// (SUBSCRIBE_ERROR, FETCH_ERROR, PUBLISH_NAMESPACE_OK, ...); draft 16 has
/// REQUEST_OK and REQUEST_ERROR for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// SUBSCRIBE.
    Subscribe,
    /// FETCH.
    Fetch,
    /// TRACK_STATUS.
    TrackStatus,
    /// PUBLISH.
    Publish,
    /// PUBLISH_NAMESPACE.
    PublishNamespace,
    /// SUBSCRIBE_NAMESPACE.
    SubscribeNamespace,
    /// REQUEST_UPDATE (SUBSCRIBE_UPDATE in draft 14, which gets no reply).
    Update,
    /// Not known (a draft-16 REQUEST_OK or REQUEST_ERROR names no kind).
    Unknown,
}

impl RequestKind {
    /// The kind of a draft-18 request message.
    pub fn of(m: &Message) -> Option<Self> {
        Some(match m {
            Message::Subscribe(_) => Self::Subscribe,
            Message::Fetch(_) => Self::Fetch,
            Message::TrackStatus(_) => Self::TrackStatus,
            Message::Publish(_) => Self::Publish,
            Message::PublishNamespace(_) => Self::PublishNamespace,
            Message::SubscribeNamespace(_) | Message::SubscribeTracks(_) => {
                Self::SubscribeNamespace
            }
            Message::RequestUpdate(_) => Self::Update,
            _ => return None,
        })
    }
}

/// How PUBLISH_NAMESPACE_DONE and _CANCEL name their namespace: by Request ID
/// (draft 16) or by the namespace itself (draft 14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceRef {
    /// The PUBLISH_NAMESPACE's Request ID.
    Id(u64),
    /// The namespace.
    Namespace(TrackNamespace),
}

/// One control message of a legacy draft, in draft-18 terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// CLIENT_SETUP (0x20). `versions` is empty in draft 16.
    ClientSetup {
        /// Offered versions (draft 14 only).
        versions: Vec<u64>,
        /// Setup parameters, kinds absolute.
        options: Vec<KeyValue>,
    },
    /// SERVER_SETUP (0x21).
    ServerSetup {
        /// Selected version (draft 14 only).
        version: Option<u64>,
        /// Setup parameters, kinds absolute.
        options: Vec<KeyValue>,
    },
    /// GOAWAY with its New Session URI.
    GoAway(Bytes),
    /// MAX_REQUEST_ID: the peer may use Request IDs below this.
    MaxRequestId(u64),
    /// REQUESTS_BLOCKED: the peer wants more Request IDs than allowed.
    RequestsBlocked(u64),
    /// A request that opens a draft-18 request stream: SUBSCRIBE,
    /// TRACK_STATUS, PUBLISH, FETCH or PUBLISH_NAMESPACE (its Request ID is
    /// inside).
    Request(Message),
    /// SUBSCRIBE_NAMESPACE, which in draft 16 opens its own bidi stream.
    SubscribeNamespace {
        /// Request ID, prefix and parameters.
        request: NamespaceRequest,
        /// What the subscriber wants.
        options: SubscribeOptions,
    },
    /// A reply to a request: SubscribeOk, PublishOk, RequestOk, RequestError,
    /// FetchOk or PublishDone.
    Reply {
        /// The request it answers.
        request_id: u64,
        /// That request's kind (needed to write draft 14).
        to: RequestKind,
        /// The reply.
        msg: Message,
    },
    /// REQUEST_UPDATE: `request_id` (new) updates `existing`.
    Update {
        /// The update's own Request ID.
        request_id: u64,
        /// The request it changes.
        existing: u64,
        /// Changed parameters.
        params: Parameters,
    },
    /// UNSUBSCRIBE.
    Unsubscribe(u64),
    /// FETCH_CANCEL.
    FetchCancel(u64),
    /// PUBLISH_NAMESPACE_DONE.
    PublishNamespaceDone(NamespaceRef),
    /// UNSUBSCRIBE_NAMESPACE (draft 14): ends a SUBSCRIBE_NAMESPACE by prefix.
    UnsubscribeNamespace(TrackNamespace),
    /// PUBLISH_NAMESPACE_CANCEL.
    PublishNamespaceCancel {
        /// The PUBLISH_NAMESPACE it cancels.
        target: NamespaceRef,
        /// Error code.
        code: u64,
        /// Reason phrase.
        reason: Bytes,
    },
    /// NAMESPACE (suffix), on a SUBSCRIBE_NAMESPACE stream.
    Namespace(TrackNamespace),
    /// NAMESPACE_DONE (suffix), on a SUBSCRIBE_NAMESPACE stream.
    NamespaceDone(TrackNamespace),
}

/// Why a draft-18 value cannot be written in a legacy draft.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// An integer ≥ 2^62.
    #[error("value does not fit a QUIC varint")]
    TooLarge,
    /// No legacy form for this message (e.g. PUBLISH_BLOCKED).
    #[error("{0} has no form in this draft")]
    Unsupported(&'static str),
    /// The message would exceed 65535 bytes.
    #[error("control message too large")]
    TooLong,
}

impl Control {
    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Control::ClientSetup { .. } => "CLIENT_SETUP",
            Control::ServerSetup { .. } => "SERVER_SETUP",
            Control::GoAway(_) => "GOAWAY",
            Control::MaxRequestId(_) => "MAX_REQUEST_ID",
            Control::RequestsBlocked(_) => "REQUESTS_BLOCKED",
            Control::Request(m) | Control::Reply { msg: m, .. } => m.name(),
            Control::SubscribeNamespace { .. } => "SUBSCRIBE_NAMESPACE",
            Control::Update { .. } => "REQUEST_UPDATE",
            Control::Unsubscribe(_) => "UNSUBSCRIBE",
            Control::FetchCancel(_) => "FETCH_CANCEL",
            Control::PublishNamespaceDone(_) => "PUBLISH_NAMESPACE_DONE",
            Control::UnsubscribeNamespace(_) => "UNSUBSCRIBE_NAMESPACE",
            Control::PublishNamespaceCancel { .. } => "PUBLISH_NAMESPACE_CANCEL",
            Control::Namespace(_) => "NAMESPACE",
            Control::NamespaceDone(_) => "NAMESPACE_DONE",
        }
    }

    /// Appends the framed message (type, 16-bit length, payload).
    pub fn encode(&self, draft: Draft, out: &mut BytesMut) -> Result<(), EncodeError> {
        let mut p = Vec::with_capacity(64);
        let t = match draft {
            Draft::D16 => self.encode_payload(&mut W(&mut p))?,
            Draft::D14 => self.encode_payload_14(&mut W(&mut p))?,
        };
        if p.len() > MAX_MESSAGE {
            return Err(EncodeError::TooLong);
        }
        put_varint(out, t);
        out.put_u16(p.len() as u16);
        out.put_slice(&p);
        Ok(())
    }

    /// Encodes into a fresh buffer.
    pub fn to_bytes(&self, draft: Draft) -> Result<Bytes, EncodeError> {
        let mut b = BytesMut::with_capacity(64);
        self.encode(draft, &mut b)?;
        Ok(b.freeze())
    }

    fn encode_payload(&self, w: &mut W) -> Result<u64, EncodeError> {
        Ok(match self {
            Control::ClientSetup { options, .. } => {
                put_setup_options(w, options)?;
                ty::CLIENT_SETUP
            }
            Control::ServerSetup { options, .. } => {
                put_setup_options(w, options)?;
                ty::SERVER_SETUP
            }
            Control::GoAway(uri) => {
                w.lp(uri);
                ty::GOAWAY
            }
            Control::MaxRequestId(v) => {
                w.int(*v)?;
                ty::MAX_REQUEST_ID
            }
            Control::RequestsBlocked(v) => {
                w.int(*v)?;
                ty::REQUESTS_BLOCKED
            }
            Control::Request(m) => encode_request(w, m)?,
            Control::SubscribeNamespace { request, options } => {
                w.int(request.request_id)?;
                put_namespace(w, &request.namespace)?;
                w.int(match options {
                    SubscribeOptions::Publish => 0,
                    SubscribeOptions::Namespace => 1,
                    SubscribeOptions::Both => 2,
                })?;
                put_params(w, &request.params)?;
                ty::SUBSCRIBE_NAMESPACE
            }
            Control::Reply {
                request_id, msg, ..
            } => {
                w.int(*request_id)?;
                encode_reply(w, msg)?
            }
            Control::Update {
                request_id,
                existing,
                params,
            } => {
                w.int(*request_id)?;
                w.int(*existing)?;
                put_params(w, params)?;
                ty::REQUEST_UPDATE
            }
            Control::Unsubscribe(id) => {
                w.int(*id)?;
                ty::UNSUBSCRIBE
            }
            Control::FetchCancel(id) => {
                w.int(*id)?;
                ty::FETCH_CANCEL
            }
            Control::PublishNamespaceDone(NamespaceRef::Id(id)) => {
                w.int(*id)?;
                ty::PUBLISH_NAMESPACE_DONE
            }
            Control::PublishNamespaceCancel {
                target: NamespaceRef::Id(id),
                code,
                reason,
            } => {
                w.int(*id)?;
                w.int(*code)?;
                w.lp(reason);
                ty::PUBLISH_NAMESPACE_CANCEL
            }
            Control::PublishNamespaceDone(NamespaceRef::Namespace(_))
            | Control::PublishNamespaceCancel { .. }
            | Control::UnsubscribeNamespace(_) => {
                return Err(EncodeError::Unsupported("namespace by name in draft 16"))
            }
            Control::Namespace(ns) => {
                put_namespace(w, ns)?;
                ty::NAMESPACE
            }
            Control::NamespaceDone(ns) => {
                put_namespace(w, ns)?;
                ty::NAMESPACE_DONE
            }
        })
    }

    /// Decodes one framed message from the front of `buf`, advancing it;
    /// [`DecodeError::Short`] (input untouched) until the frame is complete.
    /// `src` is the `Bytes` that `buf` borrows from.
    pub fn decode(draft: Draft, buf: &mut &[u8], src: &Bytes) -> Result<Self, DecodeError> {
        let mut cur = *buf;
        let t = get_varint(&mut cur)?;
        let len = get_u16(&mut cur)? as usize;
        if cur.len() < len {
            return Err(DecodeError::Short);
        }
        let (mut p, rest) = cur.split_at(len);
        let m = match draft {
            Draft::D16 => decode_payload(t, &mut p, src),
            Draft::D14 => decode_payload_14(t, &mut p, src),
        }
        .map_err(|e| match e {
            DecodeError::Short => DecodeError::LengthMismatch,
            e => e,
        })?;
        if !p.is_empty() {
            return Err(DecodeError::LengthMismatch);
        }
        *buf = rest;
        Ok(m.sanitized())
    }

    /// Drops parameters the legacy draft allows in a message and draft 18
    /// does not (draft 16 takes FORWARD in SUBSCRIBE_NAMESPACE, say): the
    /// translated message must pass a draft-18 peer's checks.
    fn sanitized(mut self) -> Self {
        use crate::params::allowed;
        let msg = match &mut self {
            Control::Request(m) | Control::Reply { msg: m, .. } => m,
            Control::SubscribeNamespace { request, options } => {
                request.params.retain(match options {
                    SubscribeOptions::Publish => allowed::SUBSCRIBE_TRACKS,
                    _ => allowed::SUBSCRIBE_NAMESPACE,
                });
                return self;
            }
            Control::Update { params, .. } => {
                params.retain(allowed::REQUEST_UPDATE);
                return self;
            }
            _ => return self,
        };
        match msg {
            Message::Subscribe(m) => m.params.retain(allowed::SUBSCRIBE),
            Message::TrackStatus(m) => m.params.retain(allowed::TRACK_STATUS),
            Message::Publish(m) => m.params.retain(allowed::PUBLISH),
            Message::Fetch(m) => m.params.retain(allowed::FETCH),
            Message::PublishNamespace(m) => m.params.retain(allowed::PUBLISH_NAMESPACE),
            Message::SubscribeOk(m) => m.params.retain(allowed::SUBSCRIBE_OK),
            Message::PublishOk(m) => m.params.retain(allowed::PUBLISH_OK),
            Message::RequestOk(m) => m.params.retain(allowed::REQUEST_OK),
            Message::FetchOk(m) => m.params.retain(allowed::FETCH_OK),
            _ => {}
        }
        self
    }
}

/// A payload writer that refuses integers a varint cannot hold.
struct W<'a>(&'a mut Vec<u8>);

impl W<'_> {
    fn int(&mut self, v: u64) -> Result<(), EncodeError> {
        if !fits(v) {
            return Err(EncodeError::TooLarge);
        }
        put_varint(self.0, v);
        Ok(())
    }

    fn lp(&mut self, b: &[u8]) {
        put_lp(self.0, b);
    }

    fn loc(&mut self, l: Location) -> Result<(), EncodeError> {
        self.int(l.group)?;
        self.int(l.object)
    }
}

fn put_namespace(w: &mut W, ns: &TrackNamespace) -> Result<(), EncodeError> {
    w.int(ns.0.len() as u64)?;
    for f in &ns.0 {
        w.lp(f);
    }
    Ok(())
}

fn put_track(w: &mut W, t: &FullTrackName) -> Result<(), EncodeError> {
    put_namespace(w, &t.namespace)?;
    w.lp(&t.name);
    Ok(())
}

/// Draft 16 §1.4.2: Key-Value-Pairs with delta-encoded types after a count.
fn put_kvps_counted(w: &mut W, kvs: &[KeyValue]) -> Result<(), EncodeError> {
    w.int(kvs.len() as u64)?;
    put_kvps_bare(w, kvs)
}

fn put_kvps_bare(w: &mut W, kvs: &[KeyValue]) -> Result<(), EncodeError> {
    let mut sorted: Vec<&KeyValue> = kvs.iter().collect();
    sorted.sort_by_key(|kv| kv.kind);
    let mut prev = 0;
    for kv in sorted {
        w.int(kv.kind - prev)?;
        prev = kv.kind;
        match &kv.value {
            KvValue::Int(v) => w.int(*v)?,
            KvValue::Bytes(b) => w.lp(b),
        }
    }
    Ok(())
}

fn put_setup_options(w: &mut W, options: &[KeyValue]) -> Result<(), EncodeError> {
    put_kvps_counted(w, options)
}

/// Draft-16 Message Parameters: a count, then delta-encoded types, with
/// integer values as varints (draft 18 writes FORWARD, SUBSCRIBER_PRIORITY
/// and GROUP_ORDER as single bytes) and LARGEST_OBJECT length-prefixed.
/// Parameters draft 16 does not define are left out rather than sent (a
/// draft-16 peer closes the session on an unknown one).
fn put_params(w: &mut W, p: &Parameters) -> Result<(), EncodeError> {
    let mut kvs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut int = |k: u64, v: u64| -> Result<(), EncodeError> {
        if !fits(v) {
            return Err(EncodeError::TooLarge);
        }
        let mut b = Vec::with_capacity(8);
        put_varint(&mut b, v);
        kvs.push((k, b));
        Ok(())
    };
    if let Some(v) = p.object_delivery_timeout {
        int(kind::OBJECT_DELIVERY_TIMEOUT, v)?;
    }
    if let Some(v) = p.expires {
        int(kind::EXPIRES, v)?;
    }
    if let Some(v) = p.forward {
        int(kind::FORWARD, v as u64)?;
    }
    if let Some(v) = p.subscriber_priority {
        int(kind::SUBSCRIBER_PRIORITY, v as u64)?;
    }
    if let Some(v) = p.group_order {
        int(kind::GROUP_ORDER, v as u64)?;
    }
    if let Some(v) = p.new_group_request {
        int(kind::NEW_GROUP_REQUEST, v)?;
    }
    let lp = |b: &[u8]| {
        let mut out = Vec::with_capacity(b.len() + 2);
        put_lp(&mut out, b);
        out
    };
    for t in &p.authorization_tokens {
        kvs.push((kind::AUTHORIZATION_TOKEN, lp(t)));
    }
    if let Some(l) = p.largest_object {
        let mut body = Vec::new();
        W(&mut body).loc(l)?;
        kvs.push((kind::LARGEST_OBJECT, lp(&body)));
    }
    if let Some(f) = &p.subscription_filter {
        let mut body = Vec::new();
        put_filter(&mut W(&mut body), f)?;
        kvs.push((kind::SUBSCRIPTION_FILTER, lp(&body)));
    }
    kvs.sort_by_key(|(k, _)| *k);
    w.int(kvs.len() as u64)?;
    let mut prev = 0;
    for (k, v) in kvs {
        w.int(k - prev)?;
        prev = k;
        w.0.extend_from_slice(&v);
    }
    Ok(())
}

/// Draft 16's filter has an absolute End Group; draft 18's a delta (#1470).
fn put_filter(w: &mut W, f: &SubscriptionFilter) -> Result<(), EncodeError> {
    match f {
        SubscriptionFilter::NextGroupStart => w.int(1),
        SubscriptionFilter::LargestObject => w.int(2),
        SubscriptionFilter::AbsoluteStart(l) => {
            w.int(3)?;
            w.loc(*l)
        }
        SubscriptionFilter::AbsoluteRange { start, .. } => {
            w.int(4)?;
            w.loc(*start)?;
            w.int(f.end_group().unwrap_or(start.group))
        }
    }
}

fn encode_request(w: &mut W, m: &Message) -> Result<u64, EncodeError> {
    Ok(match m {
        Message::Subscribe(s) | Message::TrackStatus(s) => {
            w.int(s.request_id)?;
            put_track(w, &s.track)?;
            put_params(w, &s.params)?;
            if matches!(m, Message::Subscribe(_)) {
                ty::SUBSCRIBE
            } else {
                ty::TRACK_STATUS
            }
        }
        Message::Publish(p) => {
            w.int(p.request_id)?;
            put_track(w, &p.track)?;
            w.int(p.track_alias)?;
            put_params(w, &p.params)?;
            // Track Extensions: older moq-dev builds reject trailing bytes
            // here, and nothing a draft-16 peer reads depends on them.
            ty::PUBLISH
        }
        Message::Fetch(f) => {
            w.int(f.request_id)?;
            put_fetch_kind(w, &f.kind)?;
            put_params(w, &f.params)?;
            ty::FETCH
        }
        Message::PublishNamespace(n) => {
            w.int(n.request_id)?;
            put_namespace(w, &n.namespace)?;
            put_params(w, &n.params)?;
            ty::PUBLISH_NAMESPACE
        }
        other => return Err(EncodeError::Unsupported(other.name())),
    })
}

fn put_fetch_kind(w: &mut W, kind: &FetchKind) -> Result<(), EncodeError> {
    match kind {
        FetchKind::Standalone { track, start, end } => {
            w.int(1)?;
            put_track(w, track)?;
            w.loc(*start)?;
            w.loc(*end)?;
        }
        FetchKind::RelativeJoining {
            joining_request_id,
            joining_start,
        } => {
            w.int(2)?;
            w.int(*joining_request_id)?;
            w.int(*joining_start)?;
        }
        FetchKind::AbsoluteJoining {
            joining_request_id,
            joining_start,
        } => {
            w.int(3)?;
            w.int(*joining_request_id)?;
            w.int(*joining_start)?;
        }
    }
    Ok(())
}

fn encode_reply(w: &mut W, m: &Message) -> Result<u64, EncodeError> {
    Ok(match m {
        Message::SubscribeOk(ok) => {
            w.int(ok.track_alias)?;
            put_params(w, &ok.params)?;
            ty::SUBSCRIBE_OK
        }
        Message::PublishOk(ok) => {
            put_params(w, &ok.params)?;
            ty::PUBLISH_OK
        }
        Message::RequestOk(ok) => {
            put_params(w, &ok.params)?;
            ty::REQUEST_OK
        }
        Message::RequestError(e) => {
            // Draft 16 has no REDIRECT: the URI goes in the reason so an
            // operator can still see where the relay pointed.
            let (code, reason) = match &e.redirect {
                Some(r) if e.code == request_error::REDIRECT => {
                    let mut s = b"redirect to ".to_vec();
                    s.extend_from_slice(&r.connect_uri);
                    s.truncate(MAX_REASON);
                    (request_error::INTERNAL_ERROR, Bytes::from(s))
                }
                _ => (request_error_to_16(e.code), e.reason.clone()),
            };
            w.int(code)?;
            w.int(e.retry_interval)?;
            w.lp(&reason);
            ty::REQUEST_ERROR
        }
        Message::FetchOk(ok) => {
            w.0.push(ok.end_of_track as u8);
            // The same rules set End Location in drafts 14 to 18 (the last
            // Object plus one); draft 16's description calls it "the largest
            // object covered" but computes it that way too.
            w.loc(ok.end_location)?;
            put_params(w, &ok.params)?;
            ty::FETCH_OK
        }
        Message::PublishDone(d) => {
            w.int(publish_done_swap(d.status))?;
            w.int(d.stream_count)?;
            w.lp(&d.reason);
            ty::PUBLISH_DONE
        }
        other => return Err(EncodeError::Unsupported(other.name())),
    })
}

/// Draft 18 added codes draft 16 lacks; they become the nearest one a
/// draft-16 peer knows.
fn request_error_to_16(code: u64) -> u64 {
    match code {
        request_error::GOING_AWAY | request_error::EXCESSIVE_LOAD => request_error::TIMEOUT,
        request_error::NAMESPACE_TOO_LARGE | request_error::UNSUPPORTED_EXTENSION => {
            request_error::NOT_SUPPORTED
        }
        c => c,
    }
}

/// EXPIRED and TOO_FAR_BEHIND traded codes between drafts 16 and 18; the
/// mapping is its own inverse.
fn publish_done_swap(status: u64) -> u64 {
    match status {
        publish_done::TOO_FAR_BEHIND => publish_done::EXPIRED,
        publish_done::EXPIRED => publish_done::TOO_FAR_BEHIND,
        s => s,
    }
}

fn get_namespace(p: &mut &[u8], src: &Bytes, min: usize) -> Result<TrackNamespace, DecodeError> {
    let n = get_varint(p)?;
    if n > MAX_NAMESPACE_FIELDS as u64 || (n as usize) < min {
        return Err(DecodeError::Invalid("namespace field count"));
    }
    let mut fields = Vec::with_capacity(n as usize);
    let mut total = 0;
    for _ in 0..n {
        let f = get_lp(p, MAX_FULL_NAME)?;
        if f.is_empty() {
            return Err(DecodeError::Invalid("empty namespace field"));
        }
        total += f.len();
        if total > MAX_FULL_NAME {
            return Err(DecodeError::TooLong);
        }
        fields.push(slice_of(src, f));
    }
    Ok(TrackNamespace(fields))
}

fn get_track(p: &mut &[u8], src: &Bytes) -> Result<FullTrackName, DecodeError> {
    let namespace = get_namespace(p, src, 1)?;
    let name = get_lp(p, MAX_FULL_NAME)?;
    if namespace.byte_len() + name.len() > MAX_FULL_NAME {
        return Err(DecodeError::TooLong);
    }
    Ok(FullTrackName {
        namespace,
        name: slice_of(src, name),
    })
}

fn get_loc(p: &mut &[u8]) -> Result<Location, DecodeError> {
    Ok(Location::new(get_varint(p)?, get_varint(p)?))
}

fn get_kvps_n(p: &mut &[u8], src: &Bytes, n: u64) -> Result<Vec<KeyValue>, DecodeError> {
    if n > crate::coding::MAX_KVPS as u64 {
        return Err(DecodeError::TooMany);
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut prev = 0u64;
    for _ in 0..n {
        let kind = prev
            .checked_add(get_varint(p)?)
            .ok_or(DecodeError::Invalid("key-value type overflow"))?;
        prev = kind;
        let value = if kind % 2 == 0 {
            KvValue::Int(get_varint(p)?)
        } else {
            KvValue::Bytes(slice_of(src, get_lp(p, KV_MAX_VALUE)?))
        };
        out.push(KeyValue { kind, value });
    }
    Ok(out)
}

fn get_setup_options(p: &mut &[u8], src: &Bytes) -> Result<Vec<KeyValue>, DecodeError> {
    let n = get_varint(p)?;
    get_kvps_n(p, src, n).map_err(|e| match e {
        DecodeError::Short => DecodeError::KeyValueFormat,
        e => e,
    })
}

/// Track Extensions end the message; they are read (so the length checks
/// hold) and dropped, as moq-dev does: draft 18's Track Properties are not
/// the same registry.
fn skip_extensions(p: &mut &[u8]) -> Result<(), DecodeError> {
    let mut prev = 0u64;
    let mut n = 0;
    while !p.is_empty() {
        n += 1;
        if n > crate::coding::MAX_KVPS {
            return Err(DecodeError::TooMany);
        }
        let kind = prev
            .checked_add(get_varint(p)?)
            .ok_or(DecodeError::Invalid("extension type overflow"))?;
        prev = kind;
        if kind % 2 == 0 {
            get_varint(p)?;
        } else {
            get_lp(p, KV_MAX_VALUE)?;
        }
    }
    Ok(())
}

fn int_param<T>(
    v: u64,
    max: u64,
    what: &'static str,
    f: impl Fn(u64) -> T,
) -> Result<T, DecodeError> {
    if v > max {
        return Err(DecodeError::Invalid(what));
    }
    Ok(f(v))
}

/// Draft-16 Message Parameters, into draft 18's typed set. Unknown types
/// are a protocol violation in draft 16 (§9.2), as in 18.
fn get_params(p: &mut &[u8], src: &Bytes) -> Result<Parameters, DecodeError> {
    let n = get_varint(p)?;
    if n > MAX_PARAMS as u64 {
        return Err(DecodeError::TooMany);
    }
    let mut out = Parameters::default();
    let mut prev = 0u64;
    for i in 0..n {
        let delta = get_varint(p)?;
        let k = prev
            .checked_add(delta)
            .ok_or(DecodeError::Invalid("parameter type overflow"))?;
        if i > 0 && delta == 0 && k != kind::AUTHORIZATION_TOKEN {
            return Err(DecodeError::Invalid("duplicate parameter"));
        }
        prev = k;
        match k {
            kind::OBJECT_DELIVERY_TIMEOUT => {
                let v = get_varint(p)?;
                if v == 0 {
                    return Err(DecodeError::Invalid("delivery timeout 0"));
                }
                out.object_delivery_timeout = Some(v);
            }
            kind::AUTHORIZATION_TOKEN => {
                if out.authorization_tokens.len() >= 16 {
                    return Err(DecodeError::TooMany);
                }
                let t = get_lp(p, MAX_TOKEN)?;
                out.authorization_tokens.push(slice_of(src, t));
            }
            kind::EXPIRES => out.expires = Some(get_varint(p)?),
            kind::LARGEST_OBJECT => {
                let mut body = get_lp(p, 16)?;
                let l = get_loc(&mut body)?;
                if !body.is_empty() {
                    return Err(DecodeError::Invalid("trailing bytes in location"));
                }
                out.largest_object = Some(l);
            }
            kind::FORWARD => {
                out.forward = Some(int_param(get_varint(p)?, 1, "forward", |v| v == 1)?)
            }
            kind::SUBSCRIBER_PRIORITY => {
                out.subscriber_priority =
                    Some(int_param(get_varint(p)?, 255, "priority", |v| v as u8)?)
            }
            kind::GROUP_ORDER => {
                out.group_order = Some(match get_varint(p)? {
                    1 => GroupOrder::Ascending,
                    2 => GroupOrder::Descending,
                    _ => return Err(DecodeError::Invalid("group order")),
                })
            }
            kind::SUBSCRIPTION_FILTER => {
                let mut body = get_lp(p, 64)?;
                let f = get_filter(&mut body)?;
                if !body.is_empty() {
                    return Err(DecodeError::Invalid("trailing bytes in filter"));
                }
                out.subscription_filter = Some(f);
            }
            kind::NEW_GROUP_REQUEST => out.new_group_request = Some(get_varint(p)?),
            other => return Err(DecodeError::UnknownParameter(other)),
        }
    }
    Ok(out)
}

fn get_filter(p: &mut &[u8]) -> Result<SubscriptionFilter, DecodeError> {
    Ok(match get_varint(p)? {
        1 => SubscriptionFilter::NextGroupStart,
        2 => SubscriptionFilter::LargestObject,
        3 => SubscriptionFilter::AbsoluteStart(get_loc(p)?),
        4 => {
            let start = get_loc(p)?;
            let end = get_varint(p)?;
            let end_group_delta = end
                .checked_sub(start.group)
                .ok_or(DecodeError::Invalid("end group before start"))?;
            SubscriptionFilter::AbsoluteRange {
                start,
                end_group_delta,
            }
        }
        _ => return Err(DecodeError::Invalid("filter type")),
    })
}

fn get_reason(p: &mut &[u8], src: &Bytes) -> Result<Bytes, DecodeError> {
    Ok(slice_of(src, get_lp(p, MAX_REASON)?))
}

fn decode_payload(t: u64, p: &mut &[u8], src: &Bytes) -> Result<Control, DecodeError> {
    Ok(match t {
        ty::CLIENT_SETUP => Control::ClientSetup {
            versions: Vec::new(),
            options: get_setup_options(p, src)?,
        },
        ty::SERVER_SETUP => Control::ServerSetup {
            version: None,
            options: get_setup_options(p, src)?,
        },
        ty::GOAWAY => Control::GoAway(slice_of(src, get_lp(p, MAX_URI)?)),
        ty::MAX_REQUEST_ID => Control::MaxRequestId(get_varint(p)?),
        ty::REQUESTS_BLOCKED => Control::RequestsBlocked(get_varint(p)?),
        ty::SUBSCRIBE | ty::TRACK_STATUS => {
            let s = Subscribe {
                request_id: get_varint(p)?,
                track: get_track(p, src)?,
                params: get_params(p, src)?,
            };
            Control::Request(if t == ty::SUBSCRIBE {
                Message::Subscribe(s)
            } else {
                Message::TrackStatus(s)
            })
        }
        ty::PUBLISH => {
            let request_id = get_varint(p)?;
            let track = get_track(p, src)?;
            let track_alias = get_varint(p)?;
            let params = get_params(p, src)?;
            skip_extensions(p)?;
            Control::Request(Message::Publish(Publish {
                request_id,
                track,
                track_alias,
                params,
                properties: Vec::new(),
            }))
        }
        ty::FETCH => {
            let request_id = get_varint(p)?;
            let kind = match get_varint(p)? {
                1 => {
                    let track = get_track(p, src)?;
                    let start = get_loc(p)?;
                    let end = get_loc(p)?;
                    FetchKind::Standalone { track, start, end }
                }
                2 => FetchKind::RelativeJoining {
                    joining_request_id: get_varint(p)?,
                    joining_start: get_varint(p)?,
                },
                3 => FetchKind::AbsoluteJoining {
                    joining_request_id: get_varint(p)?,
                    joining_start: get_varint(p)?,
                },
                _ => return Err(DecodeError::Invalid("fetch type")),
            };
            let params = get_params(p, src)?;
            Control::Request(Message::Fetch(Fetch {
                request_id,
                kind,
                params,
            }))
        }
        ty::PUBLISH_NAMESPACE => Control::Request(Message::PublishNamespace(NamespaceRequest {
            request_id: get_varint(p)?,
            namespace: get_namespace(p, src, 1)?,
            params: get_params(p, src)?,
        })),
        ty::SUBSCRIBE_NAMESPACE => {
            let request_id = get_varint(p)?;
            let namespace = get_namespace(p, src, 0)?;
            let options = match get_varint(p)? {
                0 => SubscribeOptions::Publish,
                1 => SubscribeOptions::Namespace,
                2 => SubscribeOptions::Both,
                _ => return Err(DecodeError::Invalid("subscribe options")),
            };
            let params = get_params(p, src)?;
            Control::SubscribeNamespace {
                request: NamespaceRequest {
                    request_id,
                    namespace,
                    params,
                },
                options,
            }
        }
        ty::SUBSCRIBE_OK => {
            let id = get_varint(p)?;
            let track_alias = get_varint(p)?;
            let params = get_params(p, src)?;
            skip_extensions(p)?;
            Control::Reply {
                request_id: id,
                to: RequestKind::Subscribe,
                msg: Message::SubscribeOk(SubscribeOk {
                    track_alias,
                    params,
                    properties: Vec::new(),
                }),
            }
        }
        ty::PUBLISH_OK => {
            let id = get_varint(p)?;
            let params = get_params(p, src)?;
            Control::Reply {
                request_id: id,
                to: RequestKind::Publish,
                msg: Message::PublishOk(RequestOk {
                    params,
                    properties: Vec::new(),
                }),
            }
        }
        ty::REQUEST_OK => {
            let id = get_varint(p)?;
            let params = get_params(p, src)?;
            Control::Reply {
                request_id: id,
                to: RequestKind::Unknown,
                msg: Message::RequestOk(RequestOk {
                    params,
                    properties: Vec::new(),
                }),
            }
        }
        ty::REQUEST_ERROR => {
            let id = get_varint(p)?;
            let code = get_varint(p)?;
            let retry_interval = get_varint(p)?;
            let reason = get_reason(p, src)?;
            Control::Reply {
                request_id: id,
                to: RequestKind::Unknown,
                msg: Message::RequestError(RequestError {
                    // 0x34 is REDIRECT in 18 and unassigned in 16: without the
                    // Redirect structure it must not be read as one.
                    code: if code == request_error::REDIRECT {
                        request_error::INTERNAL_ERROR
                    } else {
                        code
                    },
                    retry_interval,
                    reason,
                    redirect: None,
                }),
            }
        }
        ty::FETCH_OK => {
            let id = get_varint(p)?;
            let end_of_track = match get_u8(p)? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::Invalid("end of track")),
            };
            let last = get_loc(p)?;
            let params = get_params(p, src)?;
            skip_extensions(p)?;
            Control::Reply {
                request_id: id,
                to: RequestKind::Fetch,
                msg: Message::FetchOk(FetchOk {
                    end_of_track,
                    end_location: last,
                    params,
                    properties: Vec::new(),
                }),
            }
        }
        ty::PUBLISH_DONE => {
            let id = get_varint(p)?;
            let status = publish_done_swap(get_varint(p)?);
            let stream_count = get_varint(p)?;
            let reason = get_reason(p, src)?;
            Control::Reply {
                request_id: id,
                to: RequestKind::Unknown,
                msg: Message::PublishDone(PublishDone {
                    status,
                    stream_count,
                    reason,
                }),
            }
        }
        ty::REQUEST_UPDATE => Control::Update {
            request_id: get_varint(p)?,
            existing: get_varint(p)?,
            params: get_params(p, src)?,
        },
        ty::UNSUBSCRIBE => Control::Unsubscribe(get_varint(p)?),
        ty::FETCH_CANCEL => Control::FetchCancel(get_varint(p)?),
        ty::PUBLISH_NAMESPACE_DONE => {
            Control::PublishNamespaceDone(NamespaceRef::Id(get_varint(p)?))
        }
        ty::PUBLISH_NAMESPACE_CANCEL => Control::PublishNamespaceCancel {
            target: NamespaceRef::Id(get_varint(p)?),
            code: get_varint(p)?,
            reason: get_reason(p, src)?,
        },
        // A suffix is empty when the namespace is the prefix itself.
        ty::NAMESPACE => Control::Namespace(get_namespace(p, src, 0)?),
        ty::NAMESPACE_DONE => Control::NamespaceDone(get_namespace(p, src, 0)?),
        other => return Err(DecodeError::UnknownMessage(other)),
    })
}

/// Message types of draft 14 that draft 16 renumbered or dropped.
#[allow(missing_docs)]
pub mod ty14 {
    pub const SUBSCRIBE_UPDATE: u64 = 0x2;
    pub const SUBSCRIBE_ERROR: u64 = 0x5;
    pub const PUBLISH_NAMESPACE_OK: u64 = 0x7;
    pub const PUBLISH_NAMESPACE_ERROR: u64 = 0x8;
    pub const TRACK_STATUS_OK: u64 = 0xE;
    pub const TRACK_STATUS_ERROR: u64 = 0xF;
    pub const SUBSCRIBE_NAMESPACE_OK: u64 = 0x12;
    pub const SUBSCRIBE_NAMESPACE_ERROR: u64 = 0x13;
    pub const UNSUBSCRIBE_NAMESPACE: u64 = 0x14;
    pub const FETCH_ERROR: u64 = 0x19;
    pub const PUBLISH_ERROR: u64 = 0x1F;
}

impl Control {
    fn encode_payload_14(&self, w: &mut W) -> Result<u64, EncodeError> {
        Ok(match self {
            Control::ClientSetup { versions, options } => {
                w.int(versions.len() as u64)?;
                for v in versions {
                    w.int(*v)?;
                }
                put_kvps_14(w, options)?;
                ty::CLIENT_SETUP
            }
            Control::ServerSetup { version, options } => {
                w.int(version.unwrap_or(super::VERSION_D14))?;
                put_kvps_14(w, options)?;
                ty::SERVER_SETUP
            }
            Control::Request(m) => encode_request_14(w, m)?,
            Control::SubscribeNamespace { request, .. } => {
                w.int(request.request_id)?;
                put_namespace(w, &request.namespace)?;
                put_params_14(w, &request.params)?;
                ty::SUBSCRIBE_NAMESPACE
            }
            Control::Reply {
                request_id,
                to,
                msg,
            } => {
                w.int(*request_id)?;
                encode_reply_14(w, *to, msg)?
            }
            Control::Update {
                request_id,
                existing,
                params,
            } => {
                // SUBSCRIBE_UPDATE: the window as fields; End Group plus one,
                // 0 for open-ended.
                w.int(*request_id)?;
                w.int(*existing)?;
                let f = params.subscription_filter;
                let start = f.map(|f| f.start(None)).unwrap_or_default();
                w.loc(start)?;
                match f.and_then(|f| f.end_group()) {
                    Some(g) => w.int(g.checked_add(1).ok_or(EncodeError::TooLarge)?)?,
                    None => w.int(0)?,
                }
                w.0.push(params.subscriber_priority.unwrap_or(128));
                w.0.push(params.forward.unwrap_or(true) as u8);
                put_params_14(w, params)?;
                ty14::SUBSCRIBE_UPDATE
            }
            Control::PublishNamespaceDone(NamespaceRef::Namespace(ns)) => {
                put_namespace(w, ns)?;
                ty::PUBLISH_NAMESPACE_DONE
            }
            Control::PublishNamespaceCancel {
                target: NamespaceRef::Namespace(ns),
                code,
                reason,
            } => {
                put_namespace(w, ns)?;
                w.int(*code)?;
                w.lp(reason);
                ty::PUBLISH_NAMESPACE_CANCEL
            }
            Control::UnsubscribeNamespace(prefix) => {
                put_namespace(w, prefix)?;
                ty14::UNSUBSCRIBE_NAMESPACE
            }
            Control::PublishNamespaceDone(NamespaceRef::Id(_))
            | Control::PublishNamespaceCancel { .. } => {
                return Err(EncodeError::Unsupported(
                    "namespace by Request ID in draft 14",
                ))
            }
            Control::Namespace(_) | Control::NamespaceDone(_) => {
                return Err(EncodeError::Unsupported("NAMESPACE in draft 14"))
            }
            // The rest is laid out as in draft 16.
            other => other.encode_payload(w)?,
        })
    }
}

/// Draft 14's Key-Value-Pairs: a count, then absolute types.
fn put_kvps_14(w: &mut W, kvs: &[KeyValue]) -> Result<(), EncodeError> {
    w.int(kvs.len() as u64)?;
    for kv in kvs {
        w.int(kv.kind)?;
        match &kv.value {
            KvValue::Int(v) => w.int(*v)?,
            KvValue::Bytes(b) => w.lp(b),
        }
    }
    Ok(())
}

/// Draft 14's Message Parameters: only DELIVERY_TIMEOUT and
/// AUTHORIZATION_TOKEN have a draft-18 counterpart; the rest are fields.
fn put_params_14(w: &mut W, p: &Parameters) -> Result<(), EncodeError> {
    let mut kvs = Vec::new();
    if let Some(v) = p.object_delivery_timeout {
        kvs.push(KeyValue::int(kind::OBJECT_DELIVERY_TIMEOUT, v));
    }
    for t in &p.authorization_tokens {
        kvs.push(KeyValue::bytes(kind::AUTHORIZATION_TOKEN, t.clone()));
    }
    put_kvps_14(w, &kvs)
}

fn put_filter_fields_14(w: &mut W, f: Option<&SubscriptionFilter>) -> Result<(), EncodeError> {
    // Draft 14 has no "unfiltered": an absent filter is LargestObject, what
    // draft 18 gives a subscription without SUBSCRIPTION_FILTER.
    put_filter(w, f.unwrap_or(&SubscriptionFilter::LargestObject))
}

fn put_group_order_14(w: &mut W, g: Option<GroupOrder>) {
    w.0.push(g.map(|g| g as u8).unwrap_or(0));
}

fn encode_request_14(w: &mut W, m: &Message) -> Result<u64, EncodeError> {
    Ok(match m {
        Message::Subscribe(s) | Message::TrackStatus(s) => {
            w.int(s.request_id)?;
            put_track(w, &s.track)?;
            w.0.push(s.params.subscriber_priority.unwrap_or(128));
            put_group_order_14(w, s.params.group_order);
            w.0.push(s.params.forward.unwrap_or(true) as u8);
            put_filter_fields_14(w, s.params.subscription_filter.as_ref())?;
            put_params_14(w, &s.params)?;
            if matches!(m, Message::Subscribe(_)) {
                ty::SUBSCRIBE
            } else {
                ty::TRACK_STATUS
            }
        }
        Message::Publish(p) => {
            w.int(p.request_id)?;
            put_track(w, &p.track)?;
            w.int(p.track_alias)?;
            // A publisher states its order; draft 14 has no "unknown" here.
            w.0.push(p.params.group_order.unwrap_or(GroupOrder::Ascending) as u8);
            put_largest_14(w, p.params.largest_object)?;
            w.0.push(p.params.forward.unwrap_or(true) as u8);
            put_params_14(w, &p.params)?;
            ty::PUBLISH
        }
        Message::Fetch(f) => {
            w.int(f.request_id)?;
            w.0.push(f.params.subscriber_priority.unwrap_or(128));
            // Absent means ascending in draft 18 (and the relay reads the
            // fetch stream that way); 0 would let the publisher choose.
            w.0.push(f.params.group_order.unwrap_or(GroupOrder::Ascending) as u8);
            put_fetch_kind(w, &f.kind)?;
            put_params_14(w, &f.params)?;
            ty::FETCH
        }
        Message::PublishNamespace(n) => {
            w.int(n.request_id)?;
            put_namespace(w, &n.namespace)?;
            put_params_14(w, &n.params)?;
            ty::PUBLISH_NAMESPACE
        }
        other => return Err(EncodeError::Unsupported(other.name())),
    })
}

fn put_largest_14(w: &mut W, l: Option<Location>) -> Result<(), EncodeError> {
    match l {
        Some(l) => {
            w.0.push(1);
            w.loc(l)
        }
        None => {
            w.0.push(0);
            Ok(())
        }
    }
}

fn encode_reply_14(w: &mut W, to: RequestKind, m: &Message) -> Result<u64, EncodeError> {
    Ok(match (to, m) {
        (_, Message::SubscribeOk(ok)) => {
            w.int(ok.track_alias)?;
            put_subscribe_ok_tail_14(w, &ok.params)?;
            ty::SUBSCRIBE_OK
        }
        (RequestKind::TrackStatus, Message::RequestOk(ok)) => {
            // TRACK_STATUS_OK: SUBSCRIBE_OK's layout with alias 0.
            w.int(0)?;
            put_subscribe_ok_tail_14(w, &ok.params)?;
            ty14::TRACK_STATUS_OK
        }
        (RequestKind::PublishNamespace, Message::RequestOk(_)) => ty14::PUBLISH_NAMESPACE_OK,
        (RequestKind::SubscribeNamespace, Message::RequestOk(_)) => ty14::SUBSCRIBE_NAMESPACE_OK,
        (_, Message::RequestOk(_)) => {
            return Err(EncodeError::Unsupported(
                "REQUEST_OK for this request in draft 14",
            ))
        }
        (_, Message::PublishOk(ok)) => {
            let p = &ok.params;
            w.0.push(p.forward.unwrap_or(true) as u8);
            w.0.push(p.subscriber_priority.unwrap_or(128));
            put_group_order_14(w, p.group_order);
            put_filter_fields_14(w, p.subscription_filter.as_ref())?;
            put_params_14(w, p)?;
            ty::PUBLISH_OK
        }
        (_, Message::FetchOk(ok)) => {
            w.0.push(ok.params.group_order.unwrap_or(GroupOrder::Ascending) as u8);
            w.0.push(ok.end_of_track as u8);
            w.loc(ok.end_location)?;
            put_params_14(w, &ok.params)?;
            ty::FETCH_OK
        }
        (to, Message::RequestError(e)) => {
            let code = match &e.redirect {
                Some(_) => request_error::INTERNAL_ERROR,
                None => request_error_to_14(e.code),
            };
            let mut reason = e.reason.clone();
            if let Some(r) = &e.redirect {
                let mut s = b"redirect to ".to_vec();
                s.extend_from_slice(&r.connect_uri);
                s.truncate(MAX_REASON);
                reason = Bytes::from(s);
            }
            w.int(code)?;
            w.lp(&reason);
            match to {
                RequestKind::Subscribe | RequestKind::Unknown | RequestKind::Update => {
                    ty14::SUBSCRIBE_ERROR
                }
                RequestKind::Fetch => ty14::FETCH_ERROR,
                RequestKind::TrackStatus => ty14::TRACK_STATUS_ERROR,
                RequestKind::Publish => ty14::PUBLISH_ERROR,
                RequestKind::PublishNamespace => ty14::PUBLISH_NAMESPACE_ERROR,
                RequestKind::SubscribeNamespace => ty14::SUBSCRIBE_NAMESPACE_ERROR,
            }
        }
        (_, Message::PublishDone(d)) => {
            let status = match d.status {
                publish_done::MALFORMED_TRACK => 0x7,
                s => publish_done_swap(s),
            };
            w.int(status)?;
            w.int(d.stream_count)?;
            w.lp(&d.reason);
            ty::PUBLISH_DONE
        }
        (_, other) => return Err(EncodeError::Unsupported(other.name())),
    })
}

/// SUBSCRIBE_OK after the alias: Expires, Group Order, Content Exists,
/// [Largest], parameters.
fn put_subscribe_ok_tail_14(w: &mut W, p: &Parameters) -> Result<(), EncodeError> {
    w.int(p.expires.unwrap_or(0))?;
    // Draft 14 requires 1 or 2 here; draft 18 keeps the publisher's order
    // in Track Properties, which are not translated.
    w.0.push(p.group_order.unwrap_or(GroupOrder::Ascending) as u8);
    put_largest_14(w, p.largest_object)?;
    put_params_14(w, p)
}

/// Draft 14's SUBSCRIBE_ERROR codes differ from 16 and 18 for four errors.
fn request_error_to_14(code: u64) -> u64 {
    match code {
        request_error::DOES_NOT_EXIST => 0x4,
        request_error::INVALID_RANGE => 0x5,
        request_error::MALFORMED_AUTH_TOKEN => 0x10,
        request_error::EXPIRED_AUTH_TOKEN => 0x12,
        c @ 0x0..=0x3 => c,
        // Codes draft 14 lacks.
        _ => request_error::INTERNAL_ERROR,
    }
}

fn request_error_from_14(code: u64) -> u64 {
    match code {
        0x4 => request_error::DOES_NOT_EXIST,
        0x5 => request_error::INVALID_RANGE,
        0x10 => request_error::MALFORMED_AUTH_TOKEN,
        0x12 => request_error::EXPIRED_AUTH_TOKEN,
        c @ 0x0..=0x3 => c,
        _ => request_error::INTERNAL_ERROR,
    }
}

fn get_kvps_14(p: &mut &[u8], src: &Bytes) -> Result<Vec<KeyValue>, DecodeError> {
    let n = get_varint(p)?;
    if n > crate::coding::MAX_KVPS as u64 {
        return Err(DecodeError::TooMany);
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let kind = get_varint(p)?;
        let value = if kind % 2 == 0 {
            KvValue::Int(get_varint(p)?)
        } else {
            KvValue::Bytes(slice_of(src, get_lp(p, KV_MAX_VALUE)?))
        };
        out.push(KeyValue { kind, value });
    }
    Ok(out)
}

/// Draft-14 Message Parameters; unknown ones are ignored (draft 14 §8.2).
fn get_params_14(p: &mut &[u8], src: &Bytes) -> Result<Parameters, DecodeError> {
    let mut out = Parameters::default();
    for kv in get_kvps_14(p, src)? {
        match (kv.kind, kv.value) {
            (kind::OBJECT_DELIVERY_TIMEOUT, KvValue::Int(v)) if v > 0 => {
                out.object_delivery_timeout = Some(v)
            }
            (kind::AUTHORIZATION_TOKEN, KvValue::Bytes(t)) if t.len() <= MAX_TOKEN => {
                if out.authorization_tokens.len() >= 16 {
                    return Err(DecodeError::TooMany);
                }
                out.authorization_tokens.push(t)
            }
            _ => {}
        }
    }
    Ok(out)
}

fn get_u8_bool(p: &mut &[u8], what: &'static str) -> Result<bool, DecodeError> {
    match get_u8(p)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError::Invalid(what)),
    }
}

/// A Group Order field: 0 (the publisher's) is allowed only in requests.
fn get_group_order_14(p: &mut &[u8], zero_ok: bool) -> Result<Option<GroupOrder>, DecodeError> {
    match get_u8(p)? {
        0 if zero_ok => Ok(None),
        1 => Ok(Some(GroupOrder::Ascending)),
        2 => Ok(Some(GroupOrder::Descending)),
        _ => Err(DecodeError::Invalid("group order")),
    }
}

fn get_largest_14(p: &mut &[u8]) -> Result<Option<Location>, DecodeError> {
    Ok(if get_u8_bool(p, "content exists")? {
        Some(get_loc(p)?)
    } else {
        None
    })
}

fn get_reply_error_14(p: &mut &[u8], src: &Bytes, to: RequestKind) -> Result<Control, DecodeError> {
    let request_id = get_varint(p)?;
    let code = request_error_from_14(get_varint(p)?);
    let reason = get_reason(p, src)?;
    Ok(Control::Reply {
        request_id,
        to,
        msg: Message::RequestError(RequestError {
            code,
            retry_interval: 0,
            reason,
            redirect: None,
        }),
    })
}

fn get_subscribe_ok_tail_14(p: &mut &[u8], src: &Bytes) -> Result<Parameters, DecodeError> {
    let expires = get_varint(p)?;
    get_group_order_14(p, false)?;
    let largest = get_largest_14(p)?;
    let mut params = get_params_14(p, src)?;
    params.expires = (expires > 0).then_some(expires);
    params.largest_object = largest;
    Ok(params)
}

fn decode_payload_14(t: u64, p: &mut &[u8], src: &Bytes) -> Result<Control, DecodeError> {
    Ok(match t {
        ty::CLIENT_SETUP => {
            let n = get_varint(p)?;
            if n > 64 {
                return Err(DecodeError::TooMany);
            }
            let versions = (0..n).map(|_| get_varint(p)).collect::<Result<_, _>>()?;
            let options = get_kvps_14(p, src).map_err(|e| match e {
                DecodeError::Short => DecodeError::KeyValueFormat,
                e => e,
            })?;
            Control::ClientSetup { versions, options }
        }
        ty::SERVER_SETUP => {
            let version = Some(get_varint(p)?);
            let options = get_kvps_14(p, src).map_err(|e| match e {
                DecodeError::Short => DecodeError::KeyValueFormat,
                e => e,
            })?;
            Control::ServerSetup { version, options }
        }
        ty::SUBSCRIBE | ty::TRACK_STATUS => {
            let request_id = get_varint(p)?;
            let track = get_track(p, src)?;
            let priority = get_u8(p)?;
            let group_order = get_group_order_14(p, true)?;
            let forward = get_u8_bool(p, "forward")?;
            let filter = get_filter(p)?;
            let mut params = get_params_14(p, src)?;
            let s = if t == ty::SUBSCRIBE {
                params.subscriber_priority = Some(priority);
                params.group_order = group_order;
                params.forward = Some(forward);
                params.subscription_filter = Some(filter);
                Message::Subscribe(Subscribe {
                    request_id,
                    track,
                    params,
                })
            } else {
                // TRACK_STATUS takes none of the delivery fields in 18.
                params.object_delivery_timeout = None;
                Message::TrackStatus(Subscribe {
                    request_id,
                    track,
                    params,
                })
            };
            Control::Request(s)
        }
        ty::SUBSCRIBE_OK | ty14::TRACK_STATUS_OK => {
            let request_id = get_varint(p)?;
            let track_alias = get_varint(p)?;
            let params = get_subscribe_ok_tail_14(p, src)?;
            if t == ty::SUBSCRIBE_OK {
                Control::Reply {
                    request_id,
                    to: RequestKind::Subscribe,
                    msg: Message::SubscribeOk(SubscribeOk {
                        track_alias,
                        params,
                        properties: Vec::new(),
                    }),
                }
            } else {
                Control::Reply {
                    request_id,
                    to: RequestKind::TrackStatus,
                    msg: Message::RequestOk(RequestOk {
                        params: Parameters {
                            largest_object: params.largest_object,
                            expires: params.expires,
                            ..Default::default()
                        },
                        properties: Vec::new(),
                    }),
                }
            }
        }
        ty14::SUBSCRIBE_ERROR => get_reply_error_14(p, src, RequestKind::Subscribe)?,
        ty14::FETCH_ERROR => get_reply_error_14(p, src, RequestKind::Fetch)?,
        ty14::TRACK_STATUS_ERROR => get_reply_error_14(p, src, RequestKind::TrackStatus)?,
        ty14::PUBLISH_ERROR => get_reply_error_14(p, src, RequestKind::Publish)?,
        ty14::PUBLISH_NAMESPACE_ERROR => get_reply_error_14(p, src, RequestKind::PublishNamespace)?,
        ty14::SUBSCRIBE_NAMESPACE_ERROR => {
            get_reply_error_14(p, src, RequestKind::SubscribeNamespace)?
        }
        ty14::PUBLISH_NAMESPACE_OK | ty14::SUBSCRIBE_NAMESPACE_OK => Control::Reply {
            request_id: get_varint(p)?,
            to: if t == ty14::PUBLISH_NAMESPACE_OK {
                RequestKind::PublishNamespace
            } else {
                RequestKind::SubscribeNamespace
            },
            msg: Message::RequestOk(RequestOk::default()),
        },
        ty14::SUBSCRIBE_UPDATE => {
            let request_id = get_varint(p)?;
            let existing = get_varint(p)?;
            let start = get_loc(p)?;
            let end = get_varint(p)?;
            let priority = get_u8(p)?;
            let forward = get_u8_bool(p, "forward")?;
            let mut params = get_params_14(p, src)?;
            params.subscriber_priority = Some(priority);
            params.forward = Some(forward);
            params.subscription_filter = Some(match end {
                0 => SubscriptionFilter::AbsoluteStart(start),
                e => SubscriptionFilter::AbsoluteRange {
                    start,
                    end_group_delta: (e - 1)
                        .checked_sub(start.group)
                        .ok_or(DecodeError::Invalid("end group before start"))?,
                },
            });
            Control::Update {
                request_id,
                existing,
                params,
            }
        }
        ty::PUBLISH => {
            let request_id = get_varint(p)?;
            let track = get_track(p, src)?;
            let track_alias = get_varint(p)?;
            get_group_order_14(p, false)?;
            let largest = get_largest_14(p)?;
            let forward = get_u8_bool(p, "forward")?;
            let mut params = get_params_14(p, src)?;
            params.object_delivery_timeout = None;
            params.largest_object = largest;
            params.forward = Some(forward);
            Control::Request(Message::Publish(Publish {
                request_id,
                track,
                track_alias,
                params,
                properties: Vec::new(),
            }))
        }
        ty::PUBLISH_OK => {
            let request_id = get_varint(p)?;
            let forward = get_u8_bool(p, "forward")?;
            let priority = get_u8(p)?;
            let group_order = get_group_order_14(p, true)?;
            let filter = get_filter(p)?;
            let mut params = get_params_14(p, src)?;
            params.authorization_tokens.clear();
            params.forward = Some(forward);
            params.subscriber_priority = Some(priority);
            params.group_order = group_order;
            params.subscription_filter = Some(filter);
            Control::Reply {
                request_id,
                to: RequestKind::Publish,
                msg: Message::PublishOk(RequestOk {
                    params,
                    properties: Vec::new(),
                }),
            }
        }
        ty::FETCH => {
            let request_id = get_varint(p)?;
            let priority = get_u8(p)?;
            let group_order = get_group_order_14(p, true)?;
            let kind = match get_varint(p)? {
                1 => {
                    let track = get_track(p, src)?;
                    let start = get_loc(p)?;
                    let end = get_loc(p)?;
                    FetchKind::Standalone { track, start, end }
                }
                2 => FetchKind::RelativeJoining {
                    joining_request_id: get_varint(p)?,
                    joining_start: get_varint(p)?,
                },
                3 => FetchKind::AbsoluteJoining {
                    joining_request_id: get_varint(p)?,
                    joining_start: get_varint(p)?,
                },
                _ => return Err(DecodeError::Invalid("fetch type")),
            };
            let mut params = get_params_14(p, src)?;
            params.object_delivery_timeout = None;
            params.subscriber_priority = Some(priority);
            params.group_order = group_order;
            Control::Request(Message::Fetch(Fetch {
                request_id,
                kind,
                params,
            }))
        }
        ty::FETCH_OK => {
            let request_id = get_varint(p)?;
            let group_order = get_group_order_14(p, false)?;
            let end_of_track = get_u8_bool(p, "end of track")?;
            let end_location = get_loc(p)?;
            get_params_14(p, src)?;
            // The order was the FETCH's (the bridge sends one): nothing to keep.
            let _ = group_order;
            Control::Reply {
                request_id,
                to: RequestKind::Fetch,
                msg: Message::FetchOk(FetchOk {
                    end_of_track,
                    end_location,
                    params: Parameters::default(),
                    properties: Vec::new(),
                }),
            }
        }
        ty::PUBLISH_DONE => {
            let request_id = get_varint(p)?;
            let status = match get_varint(p)? {
                0x7 => publish_done::MALFORMED_TRACK,
                s => publish_done_swap(s),
            };
            let stream_count = get_varint(p)?;
            let reason = get_reason(p, src)?;
            Control::Reply {
                request_id,
                to: RequestKind::Unknown,
                msg: Message::PublishDone(PublishDone {
                    status,
                    stream_count,
                    reason,
                }),
            }
        }
        ty::PUBLISH_NAMESPACE => Control::Request(Message::PublishNamespace(NamespaceRequest {
            request_id: get_varint(p)?,
            namespace: get_namespace(p, src, 1)?,
            params: get_params_14(p, src)?,
        })),
        ty::PUBLISH_NAMESPACE_DONE => {
            Control::PublishNamespaceDone(NamespaceRef::Namespace(get_namespace(p, src, 1)?))
        }
        ty::PUBLISH_NAMESPACE_CANCEL => Control::PublishNamespaceCancel {
            target: NamespaceRef::Namespace(get_namespace(p, src, 1)?),
            code: get_varint(p)?,
            reason: get_reason(p, src)?,
        },
        // Draft 14 says 1 to 32 prefix fields; moq-dev's moq-net sends an
        // empty prefix (everything), which draft 16 made legal: accepted.
        ty::SUBSCRIBE_NAMESPACE => Control::SubscribeNamespace {
            request: NamespaceRequest {
                request_id: get_varint(p)?,
                namespace: get_namespace(p, src, 0)?,
                params: get_params_14(p, src)?,
            },
            // Draft 14's answers both: PUBLISH_NAMESPACEs and PUBLISHes.
            options: SubscribeOptions::Both,
        },
        ty14::UNSUBSCRIBE_NAMESPACE => Control::UnsubscribeNamespace(get_namespace(p, src, 0)?),
        // Laid out as in draft 16.
        ty::GOAWAY
        | ty::MAX_REQUEST_ID
        | ty::REQUESTS_BLOCKED
        | ty::UNSUBSCRIBE
        | ty::FETCH_CANCEL => decode_payload(t, p, src)?,
        other => return Err(DecodeError::UnknownMessage(other)),
    })
}

/// Reads legacy control messages from a byte stream, like
/// [`crate::session::FrameReader`] does for draft 18.
#[derive(Debug)]
pub struct LegacyFrameReader {
    draft: Draft,
    buf: BytesMut,
}

impl LegacyFrameReader {
    /// A reader for `draft`.
    pub fn new(draft: Draft) -> Self {
        Self {
            draft,
            buf: BytesMut::new(),
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes buffered but not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete message, `None` until one is buffered. Only a
    /// whole frame is split off and decoded (its fields are slices of it),
    /// so a stream of small or trickled messages costs linear time.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Control>, DecodeError> {
        let mut cur = &self.buf[..];
        let header = match get_varint(&mut cur).and_then(|_| get_u16(&mut cur)) {
            Ok(len) => self.buf.len() - cur.len() + len as usize,
            Err(DecodeError::Short) => return Ok(None),
            Err(e) => return Err(e),
        };
        if self.buf.len() < header {
            return Ok(None);
        }
        let frame = self.buf.split_to(header).freeze();
        let mut s = &frame[..];
        Control::decode(self.draft, &mut s, &frame).map(Some)
    }
}

#[cfg(test)]
mod tests;
