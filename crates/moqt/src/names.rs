//! Track Namespaces and Full Track Names (draft-18 §2.4.1).

use std::fmt;

use bytes::{BufMut, Bytes};

use crate::coding::{get_len, get_lp_bytes, put_lp_bytes, put_vi64, slice_of, vi64_len};
use crate::error::DecodeError;

/// Most fields a Track Namespace may have.
pub const MAX_NAMESPACE_FIELDS: usize = 32;
/// Most bytes in a Full Track Name (namespace fields plus name).
pub const MAX_FULL_NAME: usize = 4096;

/// An ordered tuple of 0 to 32 non-empty byte fields.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackNamespace(pub Vec<Bytes>);

impl TrackNamespace {
    /// Builds a namespace from string fields.
    pub fn from_strs<S: AsRef<str>>(fields: &[S]) -> Self {
        Self(
            fields
                .iter()
                .map(|s| Bytes::copy_from_slice(s.as_ref().as_bytes()))
                .collect(),
        )
    }

    /// Parses `a/b/c` into three fields (empty segments are skipped).
    pub fn from_path(path: &str) -> Self {
        Self(
            path.split('/')
                .filter(|s| !s.is_empty())
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .collect(),
        )
    }

    /// Fields.
    pub fn fields(&self) -> &[Bytes] {
        &self.0
    }

    /// Sum of field lengths.
    pub fn byte_len(&self) -> usize {
        self.0.iter().map(|f| f.len()).sum()
    }

    /// True when `self` starts with every field of `prefix`.
    pub fn has_prefix(&self, prefix: &TrackNamespace) -> bool {
        self.0.len() >= prefix.0.len() && self.0[..prefix.0.len()] == prefix.0[..]
    }

    /// The fields after `prefix` (caller checks [`Self::has_prefix`]).
    pub fn suffix_after(&self, prefix: &TrackNamespace) -> TrackNamespace {
        TrackNamespace(self.0[prefix.0.len().min(self.0.len())..].to_vec())
    }

    /// Concatenates `self` and `suffix`.
    pub fn join(&self, suffix: &TrackNamespace) -> TrackNamespace {
        let mut v = self.0.clone();
        v.extend(suffix.0.iter().cloned());
        TrackNamespace(v)
    }

    /// True when one is a prefix of the other (the PREFIX_OVERLAP test).
    pub fn overlaps(&self, other: &TrackNamespace) -> bool {
        self.has_prefix(other) || other.has_prefix(self)
    }

    /// Encoded size.
    pub fn encoded_len(&self) -> usize {
        vi64_len(self.0.len() as u64)
            + self
                .0
                .iter()
                .map(|f| vi64_len(f.len() as u64) + f.len())
                .sum::<usize>()
    }

    /// Encodes the field count and the fields.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        put_vi64(buf, self.0.len() as u64);
        for f in &self.0 {
            put_lp_bytes(buf, f);
        }
    }

    /// Decodes and validates: 0..=32 fields, none empty, at most 4096 bytes.
    pub fn decode(buf: &mut &[u8], src: &Bytes) -> Result<Self, DecodeError> {
        let n = get_len(buf, MAX_NAMESPACE_FIELDS)?;
        let mut fields = Vec::with_capacity(n);
        let mut total = 0;
        for _ in 0..n {
            let f = get_lp_bytes(buf, MAX_FULL_NAME)?;
            if f.is_empty() {
                return Err(DecodeError::Invalid("empty namespace field"));
            }
            total += f.len();
            if total > MAX_FULL_NAME {
                return Err(DecodeError::TooLong);
            }
            fields.push(slice_of(src, f));
        }
        Ok(Self(fields))
    }
}

/// Renders with the draft's recommended safe form (§1.5): `-` between fields,
/// bytes outside `[A-Za-z0-9_]` as `.xx`.
impl fmt::Display for TrackNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, field) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("-")?;
            }
            write_safe(f, field)?;
        }
        Ok(())
    }
}

impl fmt::Debug for TrackNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrackNamespace({self})")
    }
}

/// Writes bytes in the draft's filename-safe rendering.
pub fn write_safe(f: &mut impl fmt::Write, bytes: &[u8]) -> fmt::Result {
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b == b'_' {
            f.write_char(b as char)?;
        } else {
            write!(f, ".{b:02x}")?;
        }
    }
    Ok(())
}

/// A track's full name: namespace plus track name.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FullTrackName {
    /// Track Namespace.
    pub namespace: TrackNamespace,
    /// Track Name (may be empty).
    pub name: Bytes,
}

impl FullTrackName {
    /// Builds from a `/`-separated namespace and a name.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: TrackNamespace::from_path(namespace),
            name: Bytes::copy_from_slice(name.as_bytes()),
        }
    }

    /// Encodes namespace, then name with its length.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        self.namespace.encode(buf);
        put_lp_bytes(buf, &self.name);
    }

    /// Encoded size.
    pub fn encoded_len(&self) -> usize {
        self.namespace.encoded_len() + vi64_len(self.name.len() as u64) + self.name.len()
    }

    /// Decodes and checks the 4096-byte limit on the whole name.
    pub fn decode(buf: &mut &[u8], src: &Bytes) -> Result<Self, DecodeError> {
        let namespace = TrackNamespace::decode(buf, src)?;
        let name = get_lp_bytes(buf, MAX_FULL_NAME)?;
        if namespace.byte_len() + name.len() > MAX_FULL_NAME {
            return Err(DecodeError::TooLong);
        }
        Ok(Self {
            namespace,
            name: slice_of(src, name),
        })
    }
}

impl fmt::Display for FullTrackName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}--", self.namespace)?;
        write_safe(f, &self.name)
    }
}

impl fmt::Debug for FullTrackName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FullTrackName({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_rendering_example() {
        let t = FullTrackName {
            namespace: TrackNamespace::from_strs(&["example.net", "team2", "project_x"]),
            name: Bytes::from_static(b"report"),
        };
        assert_eq!(t.to_string(), "example.2enet-team2-project_x--report");
    }

    #[test]
    fn rejects_empty_field_and_too_many() {
        let src = Bytes::from_static(&[1, 0]);
        assert!(TrackNamespace::decode(&mut &src[..], &src).is_err());
        let mut b = Vec::new();
        put_vi64(&mut b, 33);
        for _ in 0..33 {
            put_lp_bytes(&mut b, b"a");
        }
        let src = Bytes::from(b);
        assert_eq!(
            TrackNamespace::decode(&mut &src[..], &src),
            Err(DecodeError::TooLong)
        );
    }

    #[test]
    fn prefix_logic() {
        let a = TrackNamespace::from_path("a/b/c");
        let p = TrackNamespace::from_path("a/b");
        assert!(a.has_prefix(&p));
        assert!(a.overlaps(&p) && p.overlaps(&a));
        assert_eq!(a.suffix_after(&p), TrackNamespace::from_path("c"));
        assert_eq!(p.join(&TrackNamespace::from_path("c")), a);
        assert!(!TrackNamespace::from_path("a/x").overlaps(&p));
    }
}
