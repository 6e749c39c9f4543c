//! HTTP/3 framing (RFC 9114 §7) and message heads, without IO.
//!
//! Field sections use the static-table QPACK of `web-transport-proto`
//! (vendored, `vendor/PATCHES.md`): our SETTINGS leave the dynamic table at
//! its default capacity 0, so a conforming client never references it and a
//! reference is a decoding error.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use web_transport_quinn::proto::qpack::Headers;
use web_transport_quinn::proto::VarInt;

/// Frame types used here (RFC 9114 §7.2).
pub mod frame {
    /// DATA.
    pub const DATA: u64 = 0x00;
    /// HEADERS.
    pub const HEADERS: u64 = 0x01;
    /// CANCEL_PUSH (control stream only).
    pub const CANCEL_PUSH: u64 = 0x03;
    /// SETTINGS (control stream only).
    pub const SETTINGS: u64 = 0x04;
    /// PUSH_PROMISE (server to client only).
    pub const PUSH_PROMISE: u64 = 0x05;
    /// GOAWAY (control stream only).
    pub const GOAWAY: u64 = 0x07;
    /// MAX_PUSH_ID (control stream only).
    pub const MAX_PUSH_ID: u64 = 0x0d;
    /// WEBTRANSPORT_STREAM: a bidirectional WebTransport stream's header.
    pub const WEBTRANSPORT_STREAM: u64 = 0x41;
}

/// Unidirectional stream types (RFC 9114 §6.2, RFC 9204 §4.2).
pub mod stream {
    /// The peer's control stream.
    pub const CONTROL: u64 = 0x00;
    /// Server push (a client must not open one).
    pub const PUSH: u64 = 0x01;
    /// QPACK encoder stream.
    pub const QPACK_ENCODER: u64 = 0x02;
    /// QPACK decoder stream.
    pub const QPACK_DECODER: u64 = 0x03;
    /// A WebTransport unidirectional stream.
    pub const WEBTRANSPORT: u64 = 0x54;
}

/// HTTP/3 error codes (RFC 9114 §8.1) used to reset streams and close connections.
pub mod code {
    /// No error.
    pub const NO_ERROR: u32 = 0x100;
    /// Peer violated the protocol in a way no more specific code covers.
    pub const GENERAL_PROTOCOL_ERROR: u32 = 0x101;
    /// A stream type the receiver does not accept.
    pub const STREAM_CREATION_ERROR: u32 = 0x103;
    /// A critical stream (control) was closed.
    pub const CLOSED_CRITICAL_STREAM: u32 = 0x104;
    /// A frame not permitted in this state or on this stream.
    pub const FRAME_UNEXPECTED: u32 = 0x105;
    /// A frame that could not be decoded.
    pub const FRAME_ERROR: u32 = 0x106;
    /// The control stream did not begin with SETTINGS.
    pub const MISSING_SETTINGS: u32 = 0x10a;
    /// The peer asks for more than we are willing to give (sizes, counts).
    pub const EXCESSIVE_LOAD: u32 = 0x107;
    /// The request was refused before any processing.
    pub const REQUEST_REJECTED: u32 = 0x10b;
    /// The request or its response is cancelled.
    pub const REQUEST_CANCELLED: u32 = 0x10c;
    /// The client's stream ended before the request was complete.
    pub const REQUEST_INCOMPLETE: u32 = 0x10d;
    /// A malformed message (headers).
    pub const MESSAGE_ERROR: u32 = 0x10e;
    /// QPACK: a field section that cannot be decoded (RFC 9204 §6).
    pub const QPACK_DECOMPRESSION_FAILED: u32 = 0x200;
}

/// Largest field section (HEADERS payload) accepted, as advertised in our
/// SETTINGS_MAX_FIELD_SECTION_SIZE.
pub const MAX_FIELD_SECTION: u64 = 16 * 1024;

/// Largest payload of a frame that is neither DATA nor HEADERS that is
/// buffered (unknown frame types are skipped, but only this large).
pub const MAX_OTHER_FRAME: u64 = 64 * 1024;

/// Why bytes on a stream are not valid HTTP/3.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame larger than this receiver accepts for its type.
    #[error("frame type {typ:#x} of {len} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Frame type.
        typ: u64,
        /// Announced payload length.
        len: u64,
        /// What is accepted.
        limit: u64,
    },
    /// A frame type not allowed on a request stream.
    #[error("frame type {0:#x} is not allowed on a request stream")]
    Unexpected(u64),
    /// The field section cannot be decoded.
    #[error("field section: {0}")]
    Qpack(String),
    /// The request head is malformed (RFC 9114 §4.1.2).
    #[error("malformed request: {0}")]
    Message(&'static str),
}

impl FrameError {
    /// The HTTP/3 error code to reset the stream (or close the connection) with.
    pub fn code(&self) -> u32 {
        match self {
            FrameError::TooLarge { typ, .. } if *typ == frame::HEADERS => code::EXCESSIVE_LOAD,
            FrameError::TooLarge { .. } => code::EXCESSIVE_LOAD,
            FrameError::Unexpected(_) => code::FRAME_UNEXPECTED,
            FrameError::Qpack(_) => code::QPACK_DECOMPRESSION_FAILED,
            FrameError::Message(_) => code::MESSAGE_ERROR,
        }
    }
}

/// Whether `typ` is a reserved ("grease") frame or stream type, `0x1f * N + 0x21`.
pub fn is_reserved(typ: u64) -> bool {
    typ >= 0x21 && (typ - 0x21) % 0x1f == 0
}

/// Decodes a QUIC varint from the front of `buf`; `None` if incomplete.
pub fn decode_varint(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    let len = 1usize << (first >> 6);
    if buf.len() < len {
        return None;
    }
    let mut v = u64::from(first & 0x3f);
    for b in &buf[1..len] {
        v = (v << 8) | u64::from(*b);
    }
    Some((v, len))
}

/// Encodes `v` as a QUIC varint (values above 2^62 are a programming error).
pub fn encode_varint(v: u64, buf: &mut impl BufMut) {
    VarInt::from_u64(v)
        .expect("varint out of range")
        .encode(buf);
}

/// Takes the next complete frame off the front of `buf`.
///
/// `limit(typ)` is the largest payload accepted for a frame of that type; a
/// larger announced length fails *before* it is buffered. Returns `Ok(None)`
/// while the frame is incomplete (read more and call again).
pub fn next_frame(
    buf: &mut BytesMut,
    limit: impl Fn(u64) -> u64,
) -> Result<Option<(u64, Bytes)>, FrameError> {
    let Some((typ, n1)) = decode_varint(buf) else {
        return Ok(None);
    };
    let Some((len, n2)) = decode_varint(&buf[n1..]) else {
        return Ok(None);
    };
    let max = limit(typ);
    if len > max {
        return Err(FrameError::TooLarge {
            typ,
            len,
            limit: max,
        });
    }
    // `len <= limit`, which callers keep far below usize::MAX.
    let len = len as usize;
    if buf.len() < n1 + n2 + len {
        return Ok(None);
    }
    buf.advance(n1 + n2);
    Ok(Some((typ, buf.split_to(len).freeze())))
}

/// Frame limits on a request stream: HEADERS up to [`MAX_FIELD_SECTION`],
/// DATA up to `data`, anything else up to [`MAX_OTHER_FRAME`].
pub fn request_limits(data: u64) -> impl Fn(u64) -> u64 {
    move |typ| match typ {
        frame::HEADERS => MAX_FIELD_SECTION,
        frame::DATA => data,
        _ => MAX_OTHER_FRAME,
    }
}

/// What a frame on a request stream means to the reader after the HEADERS.
pub fn check_request_frame(typ: u64) -> Result<(), FrameError> {
    match typ {
        frame::CANCEL_PUSH
        | frame::SETTINGS
        | frame::PUSH_PROMISE
        | frame::GOAWAY
        | frame::MAX_PUSH_ID => Err(FrameError::Unexpected(typ)),
        // DATA, trailers (HEADERS), reserved and unknown types.
        _ => Ok(()),
    }
}

/// A decoded request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// `:method`.
    pub method: Method,
    /// `:path` (path and query).
    pub path: String,
    /// `:authority`, empty if absent.
    pub authority: String,
    /// `:protocol` of an extended CONNECT (RFC 9220), such as `webtransport`.
    pub protocol: Option<String>,
    /// Regular header fields.
    pub headers: HeaderMap,
}

impl RequestHead {
    /// Whether this is a WebTransport session request (extended CONNECT).
    pub fn is_webtransport(&self) -> bool {
        self.method == Method::CONNECT && self.protocol.as_deref() == Some("webtransport")
    }
}

/// Decodes a HEADERS payload into a request head (RFC 9114 §4.3.1).
pub fn decode_request_head(payload: &[u8]) -> Result<RequestHead, FrameError> {
    let mut buf = payload;
    let fields = Headers::decode(&mut buf).map_err(|e| FrameError::Qpack(e.to_string()))?;
    let get = |n: &str| fields.get(n).map(str::to_owned);
    let method = get(":method").ok_or(FrameError::Message("no :method"))?;
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| FrameError::Message("bad :method"))?;
    let protocol = get(":protocol");
    let authority = get(":authority").unwrap_or_default();
    let path = match (&method, get(":path")) {
        (_, Some(p)) if !p.is_empty() => p,
        // A plain CONNECT has no :path (and we refuse it later); any
        // other request needs one.
        (&Method::CONNECT, None) if protocol.is_none() => String::new(),
        _ => return Err(FrameError::Message("no :path")),
    };
    if method != Method::CONNECT || protocol.is_some() {
        match fields.get(":scheme") {
            Some("https") | Some("http") => {}
            _ => return Err(FrameError::Message("missing or unknown :scheme")),
        }
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &fields.fields {
        if let Some(pseudo) = name.strip_prefix(':') {
            if !matches!(
                pseudo,
                "method" | "scheme" | "authority" | "path" | "protocol"
            ) {
                return Err(FrameError::Message("unknown pseudo-header"));
            }
            continue;
        }
        // RFC 9114 §4.2: names are lowercase; connection-specific fields are malformed.
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(FrameError::Message("uppercase field name"));
        }
        if matches!(
            name.as_str(),
            "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
        ) {
            return Err(FrameError::Message("connection-specific field"));
        }
        let n = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| FrameError::Message("bad field name"))?;
        let v = HeaderValue::from_str(value).map_err(|_| FrameError::Message("bad field value"))?;
        headers.append(n, v);
    }
    Ok(RequestHead {
        method,
        path,
        authority,
        protocol,
        headers,
    })
}

/// Encodes a HEADERS frame carrying a response head.
///
/// Header names repeated in `headers` keep their last value (the static-table
/// QPACK in use keeps one value per name; none of our responses repeat one).
pub fn encode_response_head(
    status: StatusCode,
    headers: &HeaderMap,
    out: &mut BytesMut,
) -> Result<(), FrameError> {
    let mut fields = Headers::default();
    fields.set(":status", status.as_str());
    for (name, value) in headers {
        let value = value
            .to_str()
            .map_err(|_| FrameError::Message("non-ASCII response field"))?;
        fields.set(name.as_str(), value);
    }
    let mut section = BytesMut::new();
    fields
        .encode(&mut section)
        .map_err(|e| FrameError::Qpack(e.to_string()))?;
    encode_varint(frame::HEADERS, out);
    encode_varint(section.len() as u64, out);
    out.put_slice(&section);
    Ok(())
}

/// Encodes a request head (for clients and tests).
pub fn encode_request_head(
    method: &Method,
    authority: &str,
    path: &str,
    headers: &HeaderMap,
    out: &mut BytesMut,
) -> Result<(), FrameError> {
    let mut fields = Headers::default();
    fields.set(":method", method.as_str());
    fields.set(":scheme", "https");
    fields.set(":authority", authority);
    fields.set(":path", path);
    for (name, value) in headers {
        let value = value
            .to_str()
            .map_err(|_| FrameError::Message("non-ASCII request field"))?;
        fields.set(name.as_str(), value);
    }
    let mut section = BytesMut::new();
    fields
        .encode(&mut section)
        .map_err(|e| FrameError::Qpack(e.to_string()))?;
    encode_varint(frame::HEADERS, out);
    encode_varint(section.len() as u64, out);
    out.put_slice(&section);
    Ok(())
}

/// The header of a DATA frame of `len` bytes (the payload follows unchanged,
/// so it can be written from its own buffer without a copy).
pub fn data_header(len: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(9);
    encode_varint(frame::DATA, &mut b);
    encode_varint(len as u64, &mut b);
    b.freeze()
}

/// The body of the `h3_request` fuzz target (`crates/net/fuzz`), also run by
/// this module's proptests: bytes of a request stream, fed in two chunks
/// split where the first byte says, through [`next_frame`],
/// [`check_request_frame`] and [`decode_request_head`]. Besides "never
/// panics": `Ok(None)` consumes nothing, and every head that decodes
/// re-encodes and decodes to the same head.
#[doc(hidden)]
pub fn fuzz_request_stream(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let cut = usize::from(first).min(rest.len());
    let mut buf = BytesMut::new();
    for chunk in [&rest[..cut], &rest[cut..]] {
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match next_frame(&mut buf, request_limits(4096)) {
                Ok(None) => {
                    assert_eq!(buf.len(), before, "need-more consumed bytes");
                    break;
                }
                Err(e) => {
                    let _ = e.code();
                    return;
                }
                Ok(Some((typ, payload))) => {
                    if check_request_frame(typ).is_err() || typ != frame::HEADERS {
                        continue;
                    }
                    let Ok(head) = decode_request_head(&payload) else {
                        continue;
                    };
                    round_trip(&head);
                }
            }
        }
    }
}

fn round_trip(head: &RequestHead) {
    if head.path.is_empty() {
        return;
    }
    let mut fields = Headers::default();
    fields.set(":method", head.method.as_str());
    fields.set(":scheme", "https");
    fields.set(":authority", &head.authority);
    fields.set(":path", &head.path);
    if let Some(p) = &head.protocol {
        fields.set(":protocol", p);
    }
    for (n, v) in &head.headers {
        if let Ok(v) = v.to_str() {
            fields.set(n.as_str(), v);
        }
    }
    let mut section = BytesMut::new();
    if fields.encode(&mut section).is_err() {
        return;
    }
    let mut out = BytesMut::new();
    encode_varint(frame::HEADERS, &mut out);
    encode_varint(section.len() as u64, &mut out);
    out.put_slice(&section);
    let (typ, payload) = next_frame(&mut out, request_limits(0))
        .expect("our own frame parses")
        .expect("complete");
    assert_eq!(typ, frame::HEADERS);
    let again = decode_request_head(&payload).expect("our own head decodes");
    assert_eq!(again.method, head.method);
    assert_eq!(again.path, head.path);
    assert_eq!(again.authority, head.authority);
    assert_eq!(again.protocol, head.protocol);
    // One value per name survives (the static-table QPACK keeps the last).
    for (n, v) in &again.headers {
        assert!(head.headers.get_all(n).iter().any(|x| x == v), "{n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(typ: u64, payload: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        encode_varint(typ, &mut b);
        encode_varint(payload.len() as u64, &mut b);
        b.put_slice(payload);
        b
    }

    #[test]
    fn varints_match_rfc9000_examples() {
        // RFC 9000 §A.1.
        assert_eq!(
            decode_varint(&[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c]),
            Some((151_288_809_941_952_652, 8))
        );
        assert_eq!(
            decode_varint(&[0x9d, 0x7f, 0x3e, 0x7d]),
            Some((494_878_333, 4))
        );
        assert_eq!(decode_varint(&[0x7b, 0xbd]), Some((15_293, 2)));
        assert_eq!(decode_varint(&[0x25]), Some((37, 1)));
        assert_eq!(decode_varint(&[0x40]), None);
        assert_eq!(decode_varint(&[]), None);
    }

    #[test]
    fn frames_split_anywhere_need_more() {
        let whole = frame(frame::DATA, b"hello");
        for cut in 0..whole.len() {
            let mut b = BytesMut::from(&whole[..cut]);
            assert_eq!(next_frame(&mut b, |_| 100).unwrap(), None, "cut {cut}");
            assert_eq!(b.len(), cut, "nothing consumed");
        }
        let mut b = whole.clone();
        b.put_slice(&frame(0x21, b"x"));
        let (t, p) = next_frame(&mut b, |_| 100).unwrap().unwrap();
        assert_eq!((t, &p[..]), (frame::DATA, &b"hello"[..]));
        let (t, p) = next_frame(&mut b, |_| 100).unwrap().unwrap();
        assert!(is_reserved(t));
        assert_eq!(&p[..], b"x");
        assert!(b.is_empty());
    }

    #[test]
    fn oversized_frame_fails_before_its_payload_arrives() {
        let mut b = BytesMut::new();
        encode_varint(frame::DATA, &mut b);
        encode_varint(1 << 30, &mut b);
        let e = next_frame(&mut b, request_limits(1000)).unwrap_err();
        assert_eq!(
            e,
            FrameError::TooLarge {
                typ: frame::DATA,
                len: 1 << 30,
                limit: 1000
            }
        );
        assert_eq!(e.code(), code::EXCESSIVE_LOAD);
        let mut b = BytesMut::new();
        encode_varint(frame::HEADERS, &mut b);
        encode_varint(MAX_FIELD_SECTION + 1, &mut b);
        assert!(next_frame(&mut b, request_limits(1000)).is_err());
    }

    #[test]
    fn control_frames_are_unexpected_on_request_streams() {
        for t in [frame::SETTINGS, frame::GOAWAY, frame::PUSH_PROMISE] {
            assert_eq!(
                check_request_frame(t).unwrap_err().code(),
                code::FRAME_UNEXPECTED
            );
        }
        for t in [frame::DATA, frame::HEADERS, 0x21, 0x1234] {
            assert!(check_request_frame(t).is_ok());
        }
    }

    #[test]
    fn request_head_round_trip() {
        let mut h = HeaderMap::new();
        h.insert("x-history-length", HeaderValue::from_static("3"));
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        let mut out = BytesMut::new();
        encode_request_head(&Method::POST, "localhost:4443", "/v1/t/a%2Fb", &h, &mut out).unwrap();
        let (t, payload) = next_frame(&mut out, request_limits(0)).unwrap().unwrap();
        assert_eq!(t, frame::HEADERS);
        let head = decode_request_head(&payload).unwrap();
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.path, "/v1/t/a%2Fb");
        assert_eq!(head.authority, "localhost:4443");
        assert_eq!(head.headers["x-history-length"], "3");
        assert_eq!(head.headers["content-type"], "text/plain");
        assert!(!head.is_webtransport());
    }

    #[test]
    fn webtransport_connect_is_recognised() {
        let req = web_transport_quinn::proto::ConnectRequest::new(
            url::Url::parse("https://localhost/moq").unwrap(),
        );
        let mut out = BytesMut::new();
        req.encode(&mut out).unwrap();
        let (_, payload) = next_frame(&mut out, request_limits(0)).unwrap().unwrap();
        let head = decode_request_head(&payload).unwrap();
        assert!(head.is_webtransport());
        assert_eq!(head.path, "/moq");
    }

    fn section(fields: &[(&str, &str)]) -> Bytes {
        let mut h = Headers::default();
        for (n, v) in fields {
            h.set(n, v);
        }
        let mut b = BytesMut::new();
        h.encode(&mut b).unwrap();
        b.freeze()
    }

    #[test]
    fn malformed_heads_are_message_errors() {
        let cases: &[&[(&str, &str)]] = &[
            &[(":scheme", "https"), (":path", "/")],
            &[(":method", "GET"), (":scheme", "https")],
            &[(":method", "GET"), (":path", "/")],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                (":bogus", "x"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("connection", "close"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("Upper", "x"),
            ],
            &[(":method", "G E T"), (":scheme", "https"), (":path", "/")],
        ];
        for c in cases {
            let e = decode_request_head(&section(c)).unwrap_err();
            assert_eq!(e.code(), code::MESSAGE_ERROR, "{c:?}: {e}");
        }
        // A dynamic-table reference (we allow none): 0x80 = indexed, dynamic.
        let e = decode_request_head(&[0x00, 0x00, 0x80]).unwrap_err();
        assert_eq!(e.code(), code::QPACK_DECOMPRESSION_FAILED);
    }

    #[test]
    fn response_head_decodes_with_the_same_qpack() {
        let mut h = HeaderMap::new();
        h.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        let mut out = BytesMut::new();
        encode_response_head(StatusCode::OK, &h, &mut out).unwrap();
        let (t, payload) = next_frame(&mut out, |_| MAX_FIELD_SECTION)
            .unwrap()
            .unwrap();
        assert_eq!(t, frame::HEADERS);
        let mut p = &payload[..];
        let fields = Headers::decode(&mut p).unwrap();
        assert_eq!(fields.get(":status"), Some("200"));
        assert_eq!(fields.get("content-type"), Some("text/event-stream"));
        assert_eq!(&data_header(5)[..], &[0x00, 0x05]);
    }

    proptest::proptest! {
        #[test]
        fn random_request_streams_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            fuzz_request_stream(&data);
        }

        #[test]
        fn mutated_requests_never_panic(
            cut in 0u8..=255,
            flips in proptest::collection::vec((0usize..256, proptest::num::u8::ANY), 0..4),
        ) {
            let mut h = HeaderMap::new();
            h.insert("x-history-length", HeaderValue::from_static("10"));
            let mut b = BytesMut::new();
            encode_request_head(&Method::GET, "localhost", "/v1/t/a/b", &h, &mut b).unwrap();
            b.extend_from_slice(&data_header(3));
            b.extend_from_slice(b"abc");
            let mut data = vec![cut];
            data.extend_from_slice(&b);
            for (i, x) in flips {
                let n = data.len();
                data[1 + i % (n - 1)] ^= x;
            }
            fuzz_request_stream(&data);
        }
    }
}
