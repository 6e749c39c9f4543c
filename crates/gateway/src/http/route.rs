//! Request paths to routes.

use percent_encoding::percent_decode_str;
use quichub_mqtt::topic::valid_topic_name;

/// Prefix of the topic routes.
pub const TOPIC_PREFIX: &str = "/v1/t/";
/// The clock route.
pub const TIME_PATH: &str = "/v1/time";

/// Methods of `/v1/t/{topic}`, for `Allow`.
pub const TOPIC_METHODS: &str = "GET, HEAD, POST, PUT, DELETE";
/// Methods of `/v1/time`, for `Allow`.
pub const TIME_METHODS: &str = "GET, HEAD";

/// Where a request path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/v1/t/{topic}`, the topic percent-decoded and valid.
    Topic(String),
    /// `/v1/time`.
    Time,
    /// `/v1/t/...` whose topic is not a valid MQTT topic name (400), with why.
    BadTopic(&'static str),
    /// Anything else (404).
    NotFound,
}

/// Routes a request path (the URI's path, without the query).
///
/// The topic is everything after `/v1/t/`, percent-decoded: literal slashes
/// are topic level separators, and so is `%2F` (`/v1/t/a%2Fb` and
/// `/v1/t/a/b` are the same topic `a/b`). Every `%` must start an escape of
/// two hex digits (`%ZZ`, a lone `%` or `a%2` are refused, not taken
/// literally). It must decode to UTF-8 and be a valid MQTT topic name:
/// non-empty, at most 65535 bytes, no `+`, `#` or U+0000.
pub fn route(path: &str) -> Route {
    if path == TIME_PATH {
        return Route::Time;
    }
    let Some(raw) = path.strip_prefix(TOPIC_PREFIX) else {
        return Route::NotFound;
    };
    if !well_formed_escapes(raw) {
        return Route::BadTopic(
            "malformed percent-encoding in the topic (% must be followed by two hex digits)",
        );
    }
    let Ok(topic) = percent_decode_str(raw).decode_utf8() else {
        return Route::BadTopic("topic is not UTF-8");
    };
    if topic.is_empty() {
        return Route::BadTopic("empty topic");
    }
    if !valid_topic_name(&topic) {
        return Route::BadTopic(
            "not a valid MQTT topic name (no +, # or NUL; at most 65535 bytes)",
        );
    }
    Route::Topic(topic.into_owned())
}

/// Whether every `%` in `s` starts a `%XX` escape (RFC 3986 §2.1).
fn well_formed_escapes(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |j: usize| b.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_percent_decoded_and_keep_slashes() {
        assert_eq!(route("/v1/t/temp"), Route::Topic("temp".into()));
        assert_eq!(route("/v1/t/a/b/c"), Route::Topic("a/b/c".into()));
        assert_eq!(route("/v1/t/a%2Fb"), Route::Topic("a/b".into()));
        assert_eq!(route("/v1/t/a%2fb/c"), Route::Topic("a/b/c".into()));
        assert_eq!(route("/v1/t/d%C3%A9j%C3%A0"), Route::Topic("déjà".into()));
        assert_eq!(route("/v1/t/a%20b"), Route::Topic("a b".into()));
        assert_eq!(route("/v1/t//x/"), Route::Topic("/x/".into()));
        assert_eq!(route("/v1/t/$SYS/x"), Route::Topic("$SYS/x".into()));
        assert_eq!(route("/v1/t/100%25"), Route::Topic("100%".into()));
        assert_eq!(route("/v1/t/%41%62"), Route::Topic("Ab".into()));
    }

    #[test]
    fn invalid_topics_are_bad_requests() {
        for p in [
            "/v1/t/",
            "/v1/t/a/+/b",
            "/v1/t/a%2B",
            "/v1/t/a/%23",
            "/v1/t/a#",
            "/v1/t/nul%00",
            "/v1/t/%FF%FE",
        ] {
            assert!(matches!(route(p), Route::BadTopic(_)), "{p}");
        }
        let long = format!("/v1/t/{}", "x".repeat(65_536));
        assert!(matches!(route(&long), Route::BadTopic(_)));
        let max = format!("/v1/t/{}", "x".repeat(65_535));
        assert!(matches!(route(&max), Route::Topic(_)));
    }

    #[test]
    fn malformed_escapes_are_bad_requests() {
        for p in [
            "/v1/t/%ZZ",
            "/v1/t/%",
            "/v1/t/a%2",
            "/v1/t/100%",
            "/v1/t/a%G1",
            "/v1/t/a%%41",
            "/v1/t/%2",
            "/v1/t/a/%/b",
            "/v1/t/ok%20then%",
        ] {
            match route(p) {
                Route::BadTopic(why) => assert!(why.contains("percent-encoding"), "{p}: {why}"),
                r => panic!("{p}: {r:?}"),
            }
        }
    }

    #[test]
    fn other_paths() {
        assert_eq!(route("/v1/time"), Route::Time);
        assert_eq!(route("/v1/time/"), Route::NotFound);
        assert_eq!(route("/v1/t"), Route::NotFound);
        assert_eq!(route("/"), Route::NotFound);
        assert_eq!(route("/v2/t/a"), Route::NotFound);
        assert_eq!(route(""), Route::NotFound);
    }
}
