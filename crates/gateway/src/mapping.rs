//! The topic model shared by MQTT, the HTTP API and MoQT.
//!
//! An MQTT (or HTTP) topic maps to one MoQT track, reversibly:
//!
//! | MQTT topic            | Track Namespace                  | Track Name |
//! |-----------------------|----------------------------------|------------|
//! | `sensors/room1/temp`  | (`mqtt`, `sensors`, `room1`)     | `temp`     |
//! | `temp`                | (`mqtt`)                         | `temp`     |
//! | `a//b`                | (`mqtt`, `a`, `\0`)              | `b`        |
//!
//! - Every topic lives under the root field [`ROOT`], so MoQT clients find all
//!   of them with one SUBSCRIBE_TRACKS or SUBSCRIBE_NAMESPACE for (`mqtt`), and
//!   MQTT wildcards (`#`) never reach media tracks that did not opt in.
//! - The last level is the Track Name; the levels before it are namespace
//!   fields. MoQT forbids empty namespace fields, MQTT allows empty levels, and
//!   MQTT topics never contain U+0000, so an empty level is the one-byte field
//!   `\0`.
//! - A topic with more levels than a namespace holds (31 after the root) or a
//!   name over 4096 bytes has no track: it still reaches MQTT and HTTP
//!   subscribers, but not MoQT ones.
//!
//! Messages map to objects one to one, with the payload bytes untouched: each
//! message is its own group (Group ID = the track's message sequence, Object
//! ID 0, Subgroup 0). A group is MoQT's unit of independent decodability and
//! of joining: MQTT messages are independent of each other, so a MoQT subscriber
//! that joins with Latest Group gets the last message (as MQTT's retained
//! message would), FETCH of the last N groups is the last N messages (the HTTP
//! API's `X-History-Length`), and one slow or lost message never blocks the
//! next on a shared stream. The sequence of a new track starts at the Unix time
//! in milliseconds, so Group IDs keep growing across gateway restarts for
//! topics publishing under 1000 messages per second on average.

use bytes::Bytes;
use moqt::names::{MAX_FULL_NAME, MAX_NAMESPACE_FIELDS};
use moqt::{FullTrackName, TrackNamespace};

/// First namespace field of every track that carries MQTT/HTTP topics.
pub const ROOT: &str = "mqtt";

/// Stands for an empty topic level in a namespace field (MoQT fields are non-empty).
const EMPTY_LEVEL: &[u8] = b"\0";

/// The root namespace (`mqtt`).
pub fn root() -> TrackNamespace {
    TrackNamespace(vec![Bytes::from_static(ROOT.as_bytes())])
}

/// The track carrying `topic`, or `None` when the topic does not fit a
/// Full Track Name. `topic` must be a valid topic name (no wildcards).
pub fn topic_to_track(topic: &str) -> Option<FullTrackName> {
    let mut levels: Vec<&str> = topic.split('/').collect();
    let name = levels.pop()?;
    if levels.len() + 1 > MAX_NAMESPACE_FIELDS {
        return None;
    }
    let mut fields = Vec::with_capacity(levels.len() + 1);
    fields.push(Bytes::from_static(ROOT.as_bytes()));
    for l in levels {
        fields.push(if l.is_empty() {
            Bytes::from_static(EMPTY_LEVEL)
        } else {
            Bytes::copy_from_slice(l.as_bytes())
        });
    }
    let namespace = TrackNamespace(fields);
    if namespace.byte_len() + name.len() > MAX_FULL_NAME {
        return None;
    }
    Some(FullTrackName {
        namespace,
        name: Bytes::copy_from_slice(name.as_bytes()),
    })
}

/// The topic a track carries, or `None` when the track is not under [`ROOT`]
/// or its fields are not valid topic levels (not UTF-8, or holding `/`, `+`,
/// `#` or U+0000).
pub fn track_to_topic(track: &FullTrackName) -> Option<String> {
    let fields = track.namespace.fields();
    if fields.first().map(|f| &f[..]) != Some(ROOT.as_bytes()) {
        return None;
    }
    let mut topic = String::new();
    for f in &fields[1..] {
        if &f[..] != EMPTY_LEVEL {
            topic.push_str(level(f)?);
        }
        topic.push('/');
    }
    topic.push_str(level(&track.name)?);
    if topic.is_empty() || topic.len() > u16::MAX as usize {
        return None;
    }
    Some(topic)
}

fn level(b: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(b).ok()?;
    (!s.contains(['/', '+', '#', '\0'])).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_the_module_docs() {
        let t = topic_to_track("sensors/room1/temp").unwrap();
        assert_eq!(
            t.namespace,
            TrackNamespace::from_strs(&["mqtt", "sensors", "room1"])
        );
        assert_eq!(&t.name[..], b"temp");
        let t = topic_to_track("temp").unwrap();
        assert_eq!(t.namespace, root());
        let t = topic_to_track("a//b").unwrap();
        assert_eq!(t.namespace, TrackNamespace::from_strs(&["mqtt", "a", "\0"]));
    }

    #[test]
    fn round_trips_including_empty_levels() {
        for topic in [
            "a",
            "a/b",
            "/",
            "/a",
            "a/",
            "a//b",
            "//",
            "$SYS/x",
            "dé/jà/vu",
            "a b/c",
        ] {
            let track = topic_to_track(topic).unwrap();
            assert_eq!(track_to_topic(&track).as_deref(), Some(topic), "{topic:?}");
        }
    }

    #[test]
    fn too_deep_or_too_long_has_no_track() {
        let deep = vec!["x"; 32].join("/");
        assert!(topic_to_track(&deep).is_some());
        let deeper = vec!["x"; 33].join("/");
        assert!(topic_to_track(&deeper).is_none());
        assert!(topic_to_track(&"y".repeat(5000)).is_none());
    }

    #[test]
    fn foreign_tracks_have_no_topic() {
        assert_eq!(
            track_to_topic(&FullTrackName::new("live/video", "hd")),
            None
        );
        let slash = FullTrackName {
            namespace: TrackNamespace::from_strs(&["mqtt", "a/b"]),
            name: Bytes::from_static(b"c"),
        };
        assert_eq!(track_to_topic(&slash), None);
        let wild = FullTrackName {
            namespace: root(),
            name: Bytes::from_static(b"#"),
        };
        assert_eq!(track_to_topic(&wild), None);
        let bad_utf8 = FullTrackName {
            namespace: root(),
            name: Bytes::from_static(b"\xff"),
        };
        assert_eq!(track_to_topic(&bad_utf8), None);
    }
}
