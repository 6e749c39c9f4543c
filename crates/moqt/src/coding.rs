//! Primitive encodings of draft-18 §1.4: the `vi64` variable-length integer,
//! length-prefixed byte strings, Locations and Key-Value-Pairs.
//!
//! Decoders work on a `&[u8]` cursor (`&mut &[u8]`) so they never copy and never
//! panic: every read checks the remaining length first and reports
//! [`DecodeError::Short`] when more bytes are needed, which the IO layer uses to
//! wait for more data rather than fail.

use bytes::{BufMut, Bytes};

use crate::error::DecodeError;

/// Largest value a `vi64` can hold (all 64 bits).
pub const VI64_MAX: u64 = u64::MAX;

/// Number of bytes [`put_vi64`] uses for `v` (the minimal encoding).
pub fn vi64_len(v: u64) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0x0fff_ffff => 4,
        0x1000_0000..=0x07_ffff_ffff => 5,
        0x08_0000_0000..=0x03ff_ffff_ffff => 6,
        0x0400_0000_0000..=0x01_ffff_ffff_ffff => 7,
        0x02_0000_0000_0000..=0x00ff_ffff_ffff_ffff => 8,
        _ => 9,
    }
}

/// Appends `v` as a minimal `vi64`: the count of leading one bits in the first
/// byte gives the number of bytes that follow (draft-18 §1.4.1).
pub fn put_vi64<B: BufMut + ?Sized>(buf: &mut B, v: u64) {
    let n = vi64_len(v);
    if n == 9 {
        buf.put_u8(0xff);
        buf.put_u64(v);
        return;
    }
    // Prefix: (n-1) one bits followed by a zero bit, then the value's high bits.
    let prefix: u8 = !(0xffu8 >> (n - 1));
    let be = v.to_be_bytes();
    let mut out = [0u8; 8];
    out[8 - n..].copy_from_slice(&be[8 - n..]);
    out[8 - n] |= prefix;
    buf.put_slice(&out[8 - n..]);
}

/// Reads one `vi64`, accepting non-minimal encodings as the draft requires.
pub fn get_vi64(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    let first = *buf.first().ok_or(DecodeError::Short)?;
    let n = first.leading_ones() as usize + 1;
    if buf.len() < n {
        return Err(DecodeError::Short);
    }
    let v = if n == 9 {
        u64::from_be_bytes(buf[1..9].try_into().expect("length checked"))
    } else {
        let mut v = (first & 0xffu8.checked_shr(n as u32).unwrap_or(0)) as u64;
        for b in &buf[1..n] {
            v = (v << 8) | *b as u64;
        }
        v
    };
    *buf = &buf[n..];
    Ok(v)
}

/// Reads a `vi64` that the caller will use as a length or count, bounded by `max`.
pub fn get_len(buf: &mut &[u8], max: usize) -> Result<usize, DecodeError> {
    let v = get_vi64(buf)?;
    if v > max as u64 {
        return Err(DecodeError::TooLong);
    }
    Ok(v as usize)
}

/// Reads one byte.
pub fn get_u8(buf: &mut &[u8]) -> Result<u8, DecodeError> {
    let b = *buf.first().ok_or(DecodeError::Short)?;
    *buf = &buf[1..];
    Ok(b)
}

/// Reads a big-endian u16.
pub fn get_u16(buf: &mut &[u8]) -> Result<u16, DecodeError> {
    if buf.len() < 2 {
        return Err(DecodeError::Short);
    }
    let v = u16::from_be_bytes([buf[0], buf[1]]);
    *buf = &buf[2..];
    Ok(v)
}

/// Takes exactly `n` bytes.
pub fn get_bytes<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], DecodeError> {
    if buf.len() < n {
        return Err(DecodeError::Short);
    }
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    Ok(head)
}

/// Reads a `vi64` length then that many bytes, at most `max`.
pub fn get_lp_bytes<'a>(buf: &mut &'a [u8], max: usize) -> Result<&'a [u8], DecodeError> {
    let n = get_len(buf, max)?;
    get_bytes(buf, n)
}

/// Writes a `vi64` length then the bytes.
pub fn put_lp_bytes<B: BufMut + ?Sized>(buf: &mut B, b: &[u8]) {
    put_vi64(buf, b.len() as u64);
    buf.put_slice(b);
}

/// A Location (draft-18 §1.4.2): a Group and an Object ID, ordered by group then object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Location {
    /// Group ID.
    pub group: u64,
    /// Object ID within the group.
    pub object: u64,
}

impl Location {
    /// Makes a Location.
    pub const fn new(group: u64, object: u64) -> Self {
        Self { group, object }
    }

    /// Encodes as two `vi64`s.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        put_vi64(buf, self.group);
        put_vi64(buf, self.object);
    }

    /// Decodes two `vi64`s.
    pub fn decode(buf: &mut &[u8]) -> Result<Self, DecodeError> {
        Ok(Self {
            group: get_vi64(buf)?,
            object: get_vi64(buf)?,
        })
    }
}

/// Value of a Key-Value-Pair: a `vi64` for even types, bytes for odd types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvValue {
    /// Even type: a single `vi64`.
    Int(u64),
    /// Odd type: a byte string of at most 65535 bytes.
    Bytes(Bytes),
}

/// One Key-Value-Pair (draft-18 §1.4.3) with its absolute type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// Absolute type (the wire carries deltas).
    pub kind: u64,
    /// Value, whose shape follows the parity of `kind`.
    pub value: KvValue,
}

impl KeyValue {
    /// An integer pair; `kind` must be even.
    pub fn int(kind: u64, v: u64) -> Self {
        debug_assert!(kind % 2 == 0);
        Self {
            kind,
            value: KvValue::Int(v),
        }
    }

    /// A byte-string pair; `kind` must be odd.
    pub fn bytes(kind: u64, v: impl Into<Bytes>) -> Self {
        debug_assert!(kind % 2 == 1);
        Self {
            kind,
            value: KvValue::Bytes(v.into()),
        }
    }
}

/// Maximum byte length of a Key-Value-Pair value.
pub const KV_MAX_VALUE: usize = 0xffff;

/// Encodes a sequence of pairs with delta-encoded types. Pairs must be sorted by
/// type (ascending); callers build them that way.
pub fn put_kvps<B: BufMut + ?Sized>(buf: &mut B, kvs: &[KeyValue]) {
    let mut prev = 0u64;
    for kv in kvs {
        put_vi64(buf, kv.kind.wrapping_sub(prev));
        prev = kv.kind;
        match &kv.value {
            KvValue::Int(v) => put_vi64(buf, *v),
            KvValue::Bytes(b) => put_lp_bytes(buf, b),
        }
    }
}

/// Decodes pairs until `buf` is empty. `src` is the owning buffer so byte values
/// are zero-copy slices of it.
pub fn get_kvps(buf: &mut &[u8], src: &Bytes) -> Result<Vec<KeyValue>, DecodeError> {
    let mut out = Vec::new();
    let mut prev = 0u64;
    while !buf.is_empty() {
        if out.len() >= MAX_KVPS {
            return Err(DecodeError::TooMany);
        }
        let delta = get_vi64(buf)?;
        let kind = prev
            .checked_add(delta)
            .ok_or(DecodeError::Invalid("key-value type overflow"))?;
        prev = kind;
        let value = if kind % 2 == 0 {
            KvValue::Int(get_vi64(buf)?)
        } else {
            let b = get_lp_bytes(buf, KV_MAX_VALUE)?;
            KvValue::Bytes(slice_of(src, b))
        };
        out.push(KeyValue { kind, value });
    }
    Ok(out)
}

/// Upper bound on pairs in one property block; a peer cannot make us allocate more.
pub const MAX_KVPS: usize = 256;

/// Number of bytes [`put_kvps`] writes.
pub fn kvps_len(kvs: &[KeyValue]) -> usize {
    let mut prev = 0u64;
    let mut n = 0;
    for kv in kvs {
        n += vi64_len(kv.kind.wrapping_sub(prev));
        prev = kv.kind;
        n += match &kv.value {
            KvValue::Int(v) => vi64_len(*v),
            KvValue::Bytes(b) => vi64_len(b.len() as u64) + b.len(),
        };
    }
    n
}

/// Returns `part` (a sub-slice of `src`) as a zero-copy `Bytes`, or copies when
/// `part` is not inside `src` (only in tests that decode from a plain slice).
pub fn slice_of(src: &Bytes, part: &[u8]) -> Bytes {
    let base = src.as_ptr() as usize;
    let p = part.as_ptr() as usize;
    if p >= base && p + part.len() <= base + src.len() {
        src.slice(p - base..p - base + part.len())
    } else {
        Bytes::copy_from_slice(part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(hex: &str) -> u64 {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let mut s = &bytes[..];
        let v = get_vi64(&mut s).unwrap();
        assert!(s.is_empty(), "{hex} left bytes");
        v
    }

    /// The draft's own table of example encodings (§1.4.1).
    #[test]
    fn spec_examples() {
        assert_eq!(dec("25"), 37);
        assert_eq!(dec("8025"), 37);
        assert_eq!(dec("bbbd"), 15_293);
        assert_eq!(dec("ed7f3e7d"), 226_442_877);
        assert_eq!(dec("faa1a0e403d8"), 2_893_212_287_960);
        assert_eq!(dec("fc8998abc66bc0"), 151_288_809_941_952);
        assert_eq!(dec("fefa318fa8e3ca11"), 70_423_237_261_249_041);
        assert_eq!(dec("ffffffffffffffffff"), 18_446_744_073_709_551_615);
    }

    #[test]
    fn minimal_encodings() {
        let mut b = Vec::new();
        put_vi64(&mut b, 15_293);
        assert_eq!(b, [0xbb, 0xbd]);
        b.clear();
        put_vi64(&mut b, 226_442_877);
        assert_eq!(b, [0xed, 0x7f, 0x3e, 0x7d]);
        b.clear();
        put_vi64(&mut b, u64::MAX);
        assert_eq!(b, [0xff; 9]);
    }

    #[test]
    fn short_input() {
        let mut s: &[u8] = &[0xbb];
        assert_eq!(get_vi64(&mut s), Err(DecodeError::Short));
        let mut s: &[u8] = &[];
        assert_eq!(get_vi64(&mut s), Err(DecodeError::Short));
    }

    proptest::proptest! {
        #[test]
        fn vi64_roundtrip(v: u64) {
            let mut b = Vec::new();
            put_vi64(&mut b, v);
            proptest::prop_assert_eq!(b.len(), vi64_len(v));
            let mut s = &b[..];
            proptest::prop_assert_eq!(get_vi64(&mut s).unwrap(), v);
            proptest::prop_assert!(s.is_empty());
        }

        #[test]
        fn vi64_never_panics(data: Vec<u8>) {
            let mut s = &data[..];
            let _ = get_vi64(&mut s);
        }
    }
}
