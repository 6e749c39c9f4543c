//! Bodies of the fuzz targets in `crates/mqtt/fuzz/`.
//!
//! They live here, behind the `fuzz` feature (and `cfg(test)`), so that the same
//! logic runs under libFuzzer (`cargo +nightly fuzz run <target>`) and under the
//! proptests of stable `cargo test`. Each function checks, by panicking, that:
//!
//! - the decoder never panics, and leaves the buffer untouched when it needs
//!   more bytes or rejects a fixed header;
//! - every proper prefix of an accepted packet decodes to `Ok(None)`, and a
//!   maximum packet size one byte short rejects it from the fixed header;
//! - whatever it accepts re-encodes (to [`encoded_len`] bytes, never more than
//!   the input), and the re-encoding decodes to the same value.

use bytes::BytesMut;

use crate::packet::{decode, encode, encoded_len, Packet, Version, DEFAULT_MAX_PACKET_SIZE};
use crate::topic::{matches, valid_topic_filter, valid_topic_name, Filter, TopicTree};
use crate::DecodeError;

/// Longest packet whose every prefix is re-decoded (quadratic cost).
const PREFIX_CHECK_LIMIT: usize = 1024;

/// Decodes `data` as a packet stream three times: before CONNECT (switching
/// to the CONNECT's version once one is accepted), as MQTT 3.1.1 and as MQTT 5.
pub fn fuzz_decode(data: &[u8]) {
    for version in [None, Some(Version::V311), Some(Version::V5)] {
        fuzz_stream(data, version);
    }
}

fn fuzz_stream(data: &[u8], mut version: Option<Version>) {
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        match decode(&mut buf, version, DEFAULT_MAX_PACKET_SIZE) {
            Ok(None) => {
                assert_eq!(buf, before, "Ok(None) consumed bytes");
                return;
            }
            Err(e) => {
                let _ = e.reason_code();
                return;
            }
            Ok(Some(p)) => {
                let used = before.len() - buf.len();
                check_packet(&before[..used], &p, version);
                if let (None, Packet::Connect(c)) = (version, &p) {
                    version = Some(c.version);
                }
            }
        }
    }
}

fn check_packet(raw: &[u8], p: &Packet, version: Option<Version>) {
    let used = raw.len();
    assert!(used >= 2, "a packet is at least two bytes");
    if used <= PREFIX_CHECK_LIMIT {
        for cut in 0..used {
            let mut part = BytesMut::from(&raw[..cut]);
            assert_eq!(
                decode(&mut part, version, DEFAULT_MAX_PACKET_SIZE),
                Ok(None)
            );
            assert_eq!(part.len(), cut, "Ok(None) consumed bytes");
        }
    }
    let mut whole = BytesMut::from(raw);
    match decode(&mut whole, version, used - 1) {
        Err(DecodeError::PacketTooLarge { size, max }) => {
            assert_eq!((size, max), (used, used - 1));
            assert_eq!(whole.len(), used, "size rejection consumed bytes");
        }
        other => panic!(
            "packet of {used} bytes with a limit of {}: {other:?}",
            used - 1
        ),
    }

    let v = match (p, version) {
        (Packet::Connect(c), _) => c.version,
        (_, Some(v)) => v,
        (_, None) => panic!("non-CONNECT {p:?} accepted before CONNECT"),
    };
    let mut enc = BytesMut::new();
    encode(p, v, &mut enc).expect("accepted packet re-encodes");
    assert_eq!(encoded_len(p, v), Ok(enc.len()));
    assert!(enc.len() <= used, "re-encoding of {p:?} grew");
    let mut again = enc.clone();
    let q = decode(&mut again, version, DEFAULT_MAX_PACKET_SIZE)
        .expect("re-encoded packet decodes")
        .expect("re-encoded packet is whole");
    assert!(again.is_empty(), "re-encoding has trailing bytes");
    assert_eq!(&q, p);
    let _ = (p.name(), p.packet_type());
}

/// Topic logic: `data` as lines; the last is a topic name, the others
/// subscription filters. Checks that validation and parsing never panic and
/// that [`TopicTree`] agrees with [`matches`].
pub fn fuzz_topic(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines: Vec<&str> = text.split('\n').collect();
    let topic = lines.pop().unwrap_or_default();
    let mut tree = TopicTree::new();
    let mut filters = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let parsed = Filter::parse(line);
        assert_eq!(parsed.is_ok(), crate::parse_subscription(line).is_ok());
        if let Ok(f) = parsed {
            assert!(valid_topic_filter(f.filter()));
            tree.insert(f.filter(), i, ());
            filters.push((i, f.filter()));
        }
    }
    assert_eq!(tree.len(), filters.len());
    let _ = valid_topic_filter(topic);
    if !valid_topic_name(topic) {
        return;
    }
    let mut got: Vec<usize> = tree.matches(topic).into_iter().map(|(k, _)| *k).collect();
    got.sort_unstable();
    let want: Vec<usize> = filters
        .iter()
        .filter(|(_, f)| matches(f, topic))
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(got, want, "tree and matches disagree on {topic:?}");
    for (i, f) in &filters {
        assert_eq!(tree.remove(f, i), Some(()));
    }
    assert!(tree.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn interesting_byte() -> impl Strategy<Value = u8> {
        prop_oneof![
            any::<u8>(),
            Just(0x10),
            Just(0x30),
            Just(0x32),
            Just(0x82),
            Just(0x00),
            Just(0x04),
            Just(0x05),
            Just(b'M'),
            Just(b'Q'),
            Just(b'T'),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn decode_random_bytes(data in proptest::collection::vec(interesting_byte(), 0..96)) {
            fuzz_decode(&data);
        }

        #[test]
        fn topic_random_lines(data in "([ab$+#/]{0,6}\n){0,5}[ab$/]{0,6}") {
            fuzz_topic(data.as_bytes());
        }
    }
}
