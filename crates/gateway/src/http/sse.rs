//! Server-Sent Events framing of the subscription stream (WHATWG HTML,
//! "Server-sent events"), readable by `EventSource`, `curl -N` and any SSE
//! library.
//!
//! One message is one event, its payload exact:
//!
//! - A payload that is UTF-8 without a carriage return (U+000D) is an
//!   `event: message`; it is split at each line feed into `data:` lines,
//!   which an SSE parser joins back with line feeds, so the text is
//!   reproduced byte for byte (also an empty payload and a trailing line
//!   feed).
//! - Any other payload (not UTF-8, or holding a CR, which SSE parsers treat
//!   as a line end) is an `event: message-base64` whose single `data:` line
//!   is the payload in standard base64 with padding (RFC 4648 §4).
//!
//! Every event has an `id:`, the message's sequence number in this stream,
//! from 1 (replayed history included). Lines starting with `:` are comments
//! (the opening `: subscribed`, keep-alives), ignored by SSE parsers. The
//! last event of a topic deleted by `DELETE` is `event: deleted`.

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};

/// Event type of a text message.
pub const TEXT_EVENT: &str = "message";
/// Event type of a base64-encoded message.
pub const BASE64_EVENT: &str = "message-base64";
/// Event type sent when the topic is deleted, right before the stream ends.
pub const DELETED_EVENT: &str = "deleted";

/// Whether `payload` goes as text (UTF-8 without CR).
pub fn is_text(payload: &[u8]) -> bool {
    !payload.contains(&b'\r') && std::str::from_utf8(payload).is_ok()
}

/// One message as an event with sequence number `id`.
pub fn message(id: u64, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(payload.len() + payload.len() / 3 + 48);
    out.put_slice(b"id: ");
    out.put_slice(id.to_string().as_bytes());
    if is_text(payload) {
        out.put_slice(b"\nevent: message\n");
        for line in payload.split(|b| *b == b'\n') {
            out.put_slice(b"data: ");
            out.put_slice(line);
            out.put_u8(b'\n');
        }
    } else {
        out.put_slice(b"\nevent: message-base64\ndata: ");
        out.put_slice(
            base64::engine::general_purpose::STANDARD
                .encode(payload)
                .as_bytes(),
        );
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
    out.freeze()
}

/// An event with no id: `event: {event}` and `data: {data}` (one line).
pub fn event(event: &str, data: &str) -> Bytes {
    debug_assert!(!event.contains(['\r', '\n']) && !data.contains(['\r', '\n']));
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// A comment line (ignored by SSE parsers), e.g. a keep-alive.
pub fn comment(text: &str) -> Bytes {
    debug_assert!(!text.contains(['\r', '\n']));
    Bytes::from(format!(": {text}\n\n"))
}

/// A minimal SSE parser (what `EventSource` does), for tests: the
/// `(event, data, id)` of every complete event in `stream`.
pub fn parse(stream: &str) -> Vec<(String, String, Option<String>)> {
    let mut events = Vec::new();
    let (mut event, mut data, mut id) = (String::new(), String::new(), None);
    let mut has_data = false;
    // SSE line ends: CRLF, LF or CR.
    let normalized = stream.replace("\r\n", "\n").replace('\r', "\n");
    for line in normalized.split('\n') {
        if line.is_empty() {
            if has_data {
                let mut d = std::mem::take(&mut data);
                d.pop();
                let e = if event.is_empty() {
                    "message".to_string()
                } else {
                    std::mem::take(&mut event)
                };
                events.push((e, d, id.clone()));
            }
            event.clear();
            data.clear();
            has_data = false;
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => event = value.to_string(),
            "data" => {
                data.push_str(value);
                data.push('\n');
                has_data = true;
            }
            "id" => id = Some(value.to_string()),
            _ => {}
        }
    }
    events
}

/// The payload an event carries, decoding `message-base64`.
pub fn payload_of(event: &str, data: &str) -> Option<Vec<u8>> {
    match event {
        TEXT_EVENT => Some(data.as_bytes().to_vec()),
        BASE64_EVENT => base64::engine::general_purpose::STANDARD.decode(data).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(payload: &[u8]) -> (String, Vec<u8>) {
        let framed = message(7, payload);
        let text = std::str::from_utf8(&framed).expect("SSE is UTF-8");
        let events = parse(text);
        assert_eq!(events.len(), 1, "{text:?}");
        let (e, d, id) = &events[0];
        assert_eq!(id.as_deref(), Some("7"));
        (e.clone(), payload_of(e, d).unwrap())
    }

    #[test]
    fn text_is_one_data_line() {
        assert_eq!(
            &message(1, b"hello")[..],
            b"id: 1\nevent: message\ndata: hello\n\n"
        );
        assert_eq!(round_trip(b"hello"), ("message".into(), b"hello".to_vec()));
        assert_eq!(round_trip(b" lead"), ("message".into(), b" lead".to_vec()));
        assert_eq!(round_trip(b"a: b"), ("message".into(), b"a: b".to_vec()));
        assert_eq!(round_trip("déjà".as_bytes()).1, "déjà".as_bytes());
    }

    #[test]
    fn multiline_text_splits_into_data_lines() {
        assert_eq!(
            &message(2, b"a\nb\n")[..],
            b"id: 2\nevent: message\ndata: a\ndata: b\ndata: \n\n"
        );
        for p in [
            &b"a\nb"[..],
            b"a\n",
            b"\n",
            b"\n\n",
            b"",
            b"x\n\ny",
            b": not a comment",
        ] {
            assert_eq!(round_trip(p), ("message".into(), p.to_vec()), "{p:?}");
        }
    }

    #[test]
    fn binary_and_cr_go_base64() {
        assert_eq!(
            &message(3, &[0xff, 0x00, 0x10])[..],
            b"id: 3\nevent: message-base64\ndata: /wAQ\n\n"
        );
        for p in [&[0xffu8, 0xfe][..], b"a\r\nb", b"\r", &[0, 1, 2, 3, 200]] {
            assert_eq!(
                round_trip(p),
                ("message-base64".into(), p.to_vec()),
                "{p:?}"
            );
        }
        assert!(!is_text(b"\r"));
        assert!(is_text(b"\0 NUL is fine"));
    }

    #[test]
    fn comments_and_named_events() {
        assert_eq!(&comment("keep-alive")[..], b": keep-alive\n\n");
        assert_eq!(
            &event("deleted", "a/b")[..],
            b"event: deleted\ndata: a/b\n\n"
        );
        let mut s = String::from_utf8(comment("subscribed").to_vec()).unwrap();
        s.push_str(std::str::from_utf8(&message(1, b"x")).unwrap());
        s.push_str(std::str::from_utf8(&event("deleted", "t")).unwrap());
        let ev = parse(&s);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[1].0, "deleted");
        assert_eq!(ev[1].1, "t");
    }
}
