//! Broadcast paths, and how they map onto MoQT Track Namespaces.
//!
//! A path is `/`-separated, normalised as moq-net does (no leading or
//! trailing `/`, no empty segments), at most 32 segments. Prefixes match
//! whole segments (`a/b` is a prefix of `a/b/c`, not of `a/bc`). The MoQT
//! namespace of a path is its segments, with moq-net 0.3.18's escaping
//! (`\/` for a `/` inside a field, `\\` for a backslash), so a broadcast
//! keeps one name across moq-relay, quichub and every draft.

use bytes::Bytes;

use crate::TrackNamespace;

/// Most segments in a path (moq-net's limit).
pub const MAX_SEGMENTS: usize = 32;

/// Normalises a path as moq-net's `Path::new` does: trims leading and
/// trailing `/`, collapses runs of `/` (so no segment is empty).
pub fn normalize(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    if !trimmed.contains("//") {
        return trimmed.to_owned();
    }
    let mut out = String::with_capacity(trimmed.len());
    for seg in trimmed.split('/').filter(|s| !s.is_empty()) {
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(seg);
    }
    out
}

/// How many segments a normalised path has (0 for ""). Like moq-net, an
/// escaped `\/` counts as a separator here: the limit is on the wire form.
pub fn segments(path: &str) -> usize {
    if path.is_empty() {
        0
    } else {
        path.bytes().filter(|&b| b == b'/').count() + 1
    }
}

/// `root` and `rel` joined (both normalised).
pub fn join(root: &str, rel: &str) -> String {
    let root = normalize(root);
    let rel = normalize(rel);
    match (root.is_empty(), rel.is_empty()) {
        (true, _) => rel,
        (_, true) => root,
        _ => format!("{root}/{rel}"),
    }
}

/// The part of `path` below `prefix` ("" when equal), if `prefix` is a
/// whole-segment prefix of it (`a/b` is a prefix of `a/b/c`, not of `a/bc`).
/// Both are taken as normalised; the prefix's outer `/` are ignored.
pub fn strip_prefix<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        return Some(path);
    }
    let rest = path.strip_prefix(prefix)?;
    if rest.is_empty() {
        Some(rest)
    } else {
        rest.strip_prefix('/')
    }
}

/// The MoQT namespace of a path (normalised first): one field per segment,
/// `\/` and `\\` unescaped to `/` and `\` inside a field, a `\` before any
/// other character kept (moq-net 0.3.18's `to_tuple`). `None` past
/// [`MAX_SEGMENTS`] fields.
pub fn to_namespace(path: &str) -> Option<TrackNamespace> {
    let path = normalize(path);
    if path.is_empty() {
        return Some(TrackNamespace(Vec::new()));
    }
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '/' => {
                fields.push(Bytes::from(std::mem::take(&mut field)));
                if fields.len() >= MAX_SEGMENTS {
                    return None;
                }
            }
            '\\' => match chars.next() {
                Some(n @ ('/' | '\\')) => field.push(n),
                Some(n) => {
                    field.push('\\');
                    field.push(n);
                }
                None => field.push('\\'),
            },
            _ => field.push(c),
        }
    }
    fields.push(Bytes::from(field));
    Some(TrackNamespace(fields))
}

/// The path of a MoQT namespace: fields joined by `/`, a `/` or `\` inside a
/// field escaped with `\` (moq-net 0.3.18's `from_tuple`). `None` if a field
/// is not UTF-8, or if the namespace has no lite path that maps back to it
/// (an empty field, a field ending in `/`, which normalisation would lose,
/// more than [`MAX_SEGMENTS`] fields): such a namespace cannot be named
/// over lite.
pub fn from_namespace(ns: &TrackNamespace) -> Option<String> {
    let mut path = String::with_capacity(ns.byte_len() + ns.fields().len());
    for (i, f) in ns.fields().iter().enumerate() {
        let f = std::str::from_utf8(f).ok()?;
        if i > 0 {
            path.push('/');
        }
        for c in f.chars() {
            if matches!(c, '/' | '\\') {
                path.push('\\');
            }
            path.push(c);
        }
    }
    // A path that normalisation changes or that does not split back into the
    // same fields would name another namespace on the wire.
    if normalize(&path) != path || to_namespace(&path).as_ref() != Some(ns) {
        return None;
    }
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation() {
        for (input, want) in [
            ("", ""),
            ("/", ""),
            ("///", ""),
            ("a", "a"),
            ("/a/", "a"),
            ("a//b", "a/b"),
            ("//a///b//c//", "a/b/c"),
            ("a/b/c", "a/b/c"),
        ] {
            assert_eq!(normalize(input), want, "{input:?}");
        }
        assert_eq!(segments(""), 0);
        assert_eq!(segments("a"), 1);
        assert_eq!(segments("a/b/c"), 3);
    }

    #[test]
    fn joining() {
        assert_eq!(join("", "a/b"), "a/b");
        assert_eq!(join("/anon/", ""), "anon");
        assert_eq!(join("anon", "/bbb/"), "anon/bbb");
        assert_eq!(join("a//b", "c"), "a/b/c");
    }

    #[test]
    fn prefixes_match_whole_segments() {
        assert_eq!(strip_prefix("a/b/c", "a/b"), Some("c"));
        assert_eq!(strip_prefix("a/b", "a/b"), Some(""));
        assert_eq!(strip_prefix("a/bc", "a/b"), None);
        assert_eq!(strip_prefix("a/b", "a/b/c"), None);
        assert_eq!(strip_prefix("a/b", ""), Some("a/b"));
        assert_eq!(strip_prefix("a/b", "/a/"), Some("b"));
        assert_eq!(strip_prefix("ab", "a"), None);
    }

    fn ns(fields: &[&str]) -> TrackNamespace {
        TrackNamespace::from_strs(fields)
    }

    #[test]
    fn namespaces() {
        assert_eq!(to_namespace(""), Some(ns(&[])));
        assert_eq!(to_namespace("a/b/c"), Some(ns(&["a", "b", "c"])));
        assert_eq!(to_namespace("/a//b/"), Some(ns(&["a", "b"])));
        assert_eq!(from_namespace(&ns(&[])), Some(String::new()));
        assert_eq!(from_namespace(&ns(&["a", "b"])), Some("a/b".into()));
        // moq-net's escaping: `\/` and `\\` inside a field.
        assert_eq!(to_namespace(r"a\/b/c"), Some(ns(&["a/b", "c"])));
        assert_eq!(from_namespace(&ns(&["a/b", "c"])), Some(r"a\/b/c".into()));
        assert_eq!(
            to_namespace(r"foo\\bar\/baz/qux"),
            Some(ns(&[r"foo\bar/baz", "qux"]))
        );
        assert_eq!(
            from_namespace(&ns(&[r"foo\bar/baz", "qux"])),
            Some(r"foo\\bar\/baz/qux".into())
        );
        // A lone backslash before another character is kept.
        assert_eq!(to_namespace(r"a\b"), Some(ns(&[r"a\b"])));
        for fields in [
            &["a/b", "c"][..],
            &[r"x\y", "/lead"],
            &["room", "video feed", "ü"],
        ] {
            let n = ns(fields);
            let p = from_namespace(&n).unwrap();
            assert_eq!(normalize(&p), p);
            assert_eq!(to_namespace(&p), Some(n), "{p}");
        }
    }

    #[test]
    fn namespaces_without_a_path() {
        // An empty field, a trailing `/` in a field (normalisation would
        // drop it), a field that is not UTF-8.
        assert_eq!(from_namespace(&ns(&["a", "", "b"])), None);
        assert_eq!(from_namespace(&ns(&[""])), None);
        assert_eq!(from_namespace(&ns(&["bar/"])), None);
        assert_eq!(
            from_namespace(&TrackNamespace(vec![Bytes::from_static(&[0xff])])),
            None
        );
        // 32 fields are fine, 33 are not.
        let p32 = ["x"; 32].join("/");
        let p33 = ["x"; 33].join("/");
        assert_eq!(to_namespace(&p32).map(|n| n.fields().len()), Some(32));
        assert_eq!(to_namespace(&p33), None);
        assert_eq!(from_namespace(&ns(&["x"; 33])), None);
    }
}
