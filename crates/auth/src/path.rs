//! Paths: moq-token's path prefixes, MQTT topic levels, and the MQTT topic ⇄
//! MoQT track mapping seen as paths.
//!
//! One path model serves both protocols. A MoQT track ((f1, f2, ...), name)
//! is the path `f1/f2/.../name`; an MQTT topic `a/b/c` is the track
//! ((`mqtt`, `a`, `b`), `c`) of `quichub-gateway`'s `mapping` module, so its
//! path is `mqtt/a/b/c`, an empty level being the one-byte field `\0`
//! (MoQT fields are non-empty). The few lines of that mapping needed here are
//! repeated rather than imported, because `quichub-auth` must not depend on
//! the gateway (the gateway depends on it); the mapping tests there and the
//! tests here pin the same table.
//!
//! Everything here works on iterators over borrowed pieces, so a check
//! allocates nothing.

use bytes::Bytes;

/// First namespace field of every track that carries an MQTT topic.
pub const MQTT_ROOT: &str = "mqtt";

/// The field standing for an empty topic level.
pub(crate) const EMPTY_LEVEL: &[u8] = b"\0";

/// A moq-token grant, normalised as moq-token does: leading, trailing and
/// repeated `/` dropped, so `/demo//bbb/` is `demo/bbb`.
///
/// Two forms, as moq-token reads them:
/// - a subtree (the legacy `put`/`get` entries, and `publish`/`subscribe`
///   patterns ending in `/**`): matched on segment boundaries, `demo/bbb`
///   covers `demo/bbb` and `demo/bbb/x`, not `demo/bbbx`; the empty prefix
///   (or `**`) covers everything;
/// - an exact broadcast path (a `publish`/`subscribe` pattern without
///   `**`): the namespace itself and the tracks in it, not the namespaces
///   below it.
///
/// In both, a `*` segment matches any one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prefix {
    segs: Box<[Box<[u8]>]>,
    subtree: bool,
}

impl Prefix {
    /// `root` joined with `rel` (moq-token's implicit `/`), normalised: a
    /// subtree grant (legacy `put`/`get`, `public`).
    pub(crate) fn join(root: &str, rel: &str) -> Prefix {
        Prefix {
            segs: root
                .split('/')
                .chain(rel.split('/'))
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().into())
                .collect(),
            subtree: true,
        }
    }

    /// `root` joined with a `publish`/`subscribe` pattern: a subtree when it
    /// ends in `**`, else an exact path. (A `**` elsewhere is kept as a
    /// literal segment, which matches nothing real: fail closed.)
    pub(crate) fn pattern(root: &str, pattern: &str) -> Prefix {
        let mut p = Prefix::join(root, pattern);
        p.subtree = p.segs.last().is_some_and(|s| &s[..] == b"**");
        if p.subtree {
            let mut segs = p.segs.into_vec();
            segs.pop();
            p.segs = segs.into_boxed_slice();
        }
        p
    }

    /// Whether this grant covers the path made of `pieces` (already split on
    /// `/`, empty pieces dropped). `named`: the last piece is a track name
    /// (or an MQTT topic's last level), which an exact grant of its
    /// namespace covers; otherwise `pieces` is a namespace prefix standing
    /// for everything below it.
    pub(crate) fn covers<'a>(
        &self,
        mut pieces: impl Iterator<Item = &'a [u8]>,
        named: bool,
    ) -> bool {
        for seg in self.segs.iter() {
            match pieces.next() {
                Some(p) if &seg[..] == b"*" || &seg[..] == p => {}
                _ => return false,
            }
        }
        if self.subtree {
            return true;
        }
        match pieces.next() {
            None => true,
            Some(_) => named && pieces.next().is_none(),
        }
    }

    /// The normalised prefix as text.
    #[cfg(test)]
    pub(crate) fn to_text(&self) -> String {
        self.segs
            .iter()
            .map(|s| String::from_utf8_lossy(s))
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// The path pieces of a MoQT namespace (+ optional name): the fields joined
/// with `/` and split again, so a field holding `/` matches as moq-relay's
/// string paths would.
pub(crate) fn track_pieces<'a>(
    ns: &'a [Bytes],
    name: Option<&'a [u8]>,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    ns.iter()
        .map(|f| &f[..])
        .chain(name)
        .flat_map(|f| f.split(|b| *b == b'/'))
        .filter(|p| !p.is_empty())
}

/// The path pieces of an MQTT topic (or of the literal levels of a filter):
/// `mqtt`, then each level, an empty level being `\0`.
pub(crate) fn topic_pieces<'a>(
    levels: impl Iterator<Item = &'a str> + 'a,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    std::iter::once(MQTT_ROOT.as_bytes()).chain(levels.map(|l| {
        if l.is_empty() {
            EMPTY_LEVEL
        } else {
            l.as_bytes()
        }
    }))
}

/// The levels of the MQTT topic a MoQT track carries, or `None` when the
/// track is not under `mqtt` or a field is not a valid topic level (the
/// inverse of the gateway mapping, without building the string).
/// With `name = None`, the levels of the namespace below `mqtt`.
pub(crate) fn track_levels<'a>(
    ns: &'a [Bytes],
    name: Option<&'a [u8]>,
) -> Option<impl Iterator<Item = &'a str> + Clone + 'a> {
    let (root, rest) = ns.split_first()?;
    if &root[..] != MQTT_ROOT.as_bytes() {
        return None;
    }
    let fields = rest.iter().map(|f| &f[..]).chain(name);
    for f in fields.clone() {
        if f != EMPTY_LEVEL {
            let s = std::str::from_utf8(f).ok()?;
            if s.contains(['/', '+', '#', '\0']) {
                return None;
            }
        }
    }
    // Validated above: every field is UTF-8 or the empty-level marker.
    Some(fields.map(|f| {
        if f == EMPTY_LEVEL {
            ""
        } else {
            std::str::from_utf8(f).unwrap_or_default()
        }
    }))
}

/// Whether `filter` is a valid MQTT topic filter: `#` only as the whole last
/// level, `+` only as a whole level, not empty.
pub(crate) fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.contains('\0') {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(l) = levels.next() {
        match l {
            "#" => return levels.peek().is_none(),
            "+" => {}
            l if l.contains(['+', '#']) => return false,
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(fields: &[&str]) -> Vec<Bytes> {
        fields
            .iter()
            .map(|f| Bytes::copy_from_slice(f.as_bytes()))
            .collect()
    }

    #[test]
    fn patterns_as_newer_moq_token_writes_them() {
        // `x/**`: a subtree.
        let p = Prefix::pattern("demo", "bbb/**");
        assert!(p.covers(track_pieces(&ns(&["demo", "bbb", "x"]), None), false));
        assert!(p.covers(track_pieces(&ns(&["demo", "bbb"]), Some(b"v")), true));
        assert!(!p.covers(track_pieces(&ns(&["demo", "bbbx"]), None), false));
        // `x`: the broadcast x and its tracks, not the namespaces below it.
        let p = Prefix::pattern("demo", "ccc");
        assert!(p.covers(track_pieces(&ns(&["demo", "ccc"]), None), false));
        assert!(p.covers(track_pieces(&ns(&["demo", "ccc"]), Some(b"video")), true));
        assert!(!p.covers(track_pieces(&ns(&["demo", "ccc", "x"]), Some(b"v")), true));
        assert!(!p.covers(track_pieces(&ns(&["demo"]), None), false));
        // `*`: one segment.
        let p = Prefix::pattern("", "rooms/*/cam");
        assert!(p.covers(track_pieces(&ns(&["rooms", "a", "cam"]), Some(b"v")), true));
        assert!(!p.covers(
            track_pieces(&ns(&["rooms", "a", "b", "cam"]), Some(b"v")),
            true
        ));
        // `**` alone: everything; `**` inside: a literal that matches nothing real.
        assert!(Prefix::pattern("", "**").covers(track_pieces(&ns(&["x", "y"]), None), false));
        assert!(
            !Prefix::pattern("", "a/**/b").covers(track_pieces(&ns(&["a", "x", "b"]), None), false)
        );
    }

    #[test]
    fn prefixes_normalise_and_match_on_boundaries() {
        let p = Prefix::join("/demo/", "bbb/");
        assert_eq!(p.to_text(), "demo/bbb");
        assert!(p.covers(track_pieces(&ns(&["demo", "bbb"]), None), false));
        assert!(p.covers(track_pieces(&ns(&["demo", "bbb", "x"]), None), false));
        assert!(p.covers(track_pieces(&ns(&["demo"]), Some(b"bbb")), true));
        assert!(!p.covers(track_pieces(&ns(&["demo", "bbbx"]), None), false));
        assert!(!p.covers(track_pieces(&ns(&["demo"]), None), false));
        // A field holding '/' matches as the joined string does.
        assert!(p.covers(track_pieces(&ns(&["demo/bbb"]), Some(b"v")), true));
        assert!(Prefix::join("", "").covers(track_pieces(&ns(&["x"]), None), false));
        assert_eq!(Prefix::join("demo", "").to_text(), "demo");
        assert_eq!(Prefix::join("", "a//b").to_text(), "a/b");
    }

    #[test]
    fn topics_map_like_the_gateway_table() {
        let p: Vec<&[u8]> = topic_pieces("sensors/room1/temp".split('/')).collect();
        assert_eq!(p, [&b"mqtt"[..], b"sensors", b"room1", b"temp"]);
        let p: Vec<&[u8]> = topic_pieces("a//b".split('/')).collect();
        assert_eq!(p, [&b"mqtt"[..], b"a", b"\0", b"b"]);

        let fields = ns(&["mqtt", "a", "\0"]);
        let levels: Vec<&str> = track_levels(&fields, Some(b"b")).unwrap().collect();
        assert_eq!(levels.join("/"), "a//b");
        let fields = ns(&["mqtt"]);
        let levels: Vec<&str> = track_levels(&fields, Some(b"temp")).unwrap().collect();
        assert_eq!(levels, ["temp"]);
        assert!(track_levels(&ns(&["media", "a"]), Some(b"b")).is_none());
        assert!(track_levels(&ns(&["mqtt", "a+"]), Some(b"b")).is_none());
        assert!(track_levels(&ns(&["mqtt"]), Some(b"a/b")).is_none());
        assert!(track_levels(
            &[Bytes::from_static(b"mqtt"), Bytes::from_static(b"\xff")],
            None
        )
        .is_none());
    }

    #[test]
    fn filter_validity() {
        for f in ["#", "a/#", "+", "a/+/b", "/", "a//b", "$SYS/#"] {
            assert!(valid_filter(f), "{f}");
        }
        for f in ["", "a/#/b", "a#", "a/b+", "#/a"] {
            assert!(!valid_filter(f), "{f}");
        }
    }
}
