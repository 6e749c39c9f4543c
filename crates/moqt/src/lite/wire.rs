//! The field encodings every lite message shares: QUIC varints (lite-01…06
//! use RFC 9000's, not draft 18's `vi64`), raw `u8`s, strings, `opt` (+1)
//! integers, zigzag deltas and size-prefixed bodies.
//!
//! The getters advance the slice they are given even when they fail; the
//! public decoders call them on a copy of their input and store it back only
//! on success, which is what keeps a failed decode from moving the caller's
//! cursor.

use bytes::BufMut;

use super::path::{self, MAX_SEGMENTS};
use super::DecodeError;
use crate::legacy::varint::{get_lp, get_varint, put_varint, VARINT_MAX};

/// Reads a QUIC varint.
pub(crate) fn get_vi(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    get_varint(buf)
}

/// Writes a QUIC varint; values above 2^62 − 1 (which a QUIC varint cannot
/// hold, and which no lite peer can have sent) are written as 2^62 − 1
/// rather than panicking.
pub(crate) fn put_vi<B: BufMut + ?Sized>(out: &mut B, v: u64) {
    put_varint(out, v.min(VARINT_MAX));
}

/// Reads one raw byte (priority, status, ordered).
pub(crate) fn get_u8(buf: &mut &[u8]) -> Result<u8, DecodeError> {
    let (&b, rest) = buf.split_first().ok_or(DecodeError::Short)?;
    *buf = rest;
    Ok(b)
}

/// Reads `opt(i)`: 0 is absent, n is n − 1.
pub(crate) fn get_opt(buf: &mut &[u8]) -> Result<Option<u64>, DecodeError> {
    Ok(get_vi(buf)?.checked_sub(1))
}

/// Writes `opt(i)` (saturating like [`put_vi`]).
pub(crate) fn put_opt<B: BufMut + ?Sized>(out: &mut B, v: Option<u64>) {
    put_vi(out, v.map_or(0, |v| v.saturating_add(1)));
}

/// Reads a string: varint byte length, UTF-8 bytes (at most `max`).
pub(crate) fn get_str(buf: &mut &[u8], max: usize) -> Result<String, DecodeError> {
    let b = get_lp(buf, max)?;
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| DecodeError::Invalid("string is not UTF-8"))
}

/// Writes a string.
pub(crate) fn put_str<B: BufMut + ?Sized>(out: &mut B, s: &str) {
    put_vi(out, s.len() as u64);
    out.put_slice(s.as_bytes());
}

/// Reads a broadcast path (prefix, suffix): a string, normalised as
/// moq-net's `Path::new` does, at most [`MAX_SEGMENTS`] segments.
pub(crate) fn get_path(buf: &mut &[u8]) -> Result<String, DecodeError> {
    let p = path::normalize(&get_str(buf, usize::MAX)?);
    if path::segments(&p) > MAX_SEGMENTS {
        return Err(DecodeError::TooMany);
    }
    Ok(p)
}

/// Zigzag: small negative and positive deltas both become small unsigned values.
pub(crate) fn zigzag(s: i64) -> u64 {
    ((s << 1) ^ (s >> 63)) as u64
}

/// The inverse of [`zigzag`].
pub(crate) fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// Reads a size-prefixed body: `Length (i)` then that many bytes. A length
/// above `max` is [`DecodeError::TooLong`] as soon as it is read (before the
/// body arrives); an incomplete body is [`DecodeError::Short`].
pub(crate) fn get_body<'a>(buf: &mut &'a [u8], max: usize) -> Result<&'a [u8], DecodeError> {
    get_lp(buf, max)
}

/// Decodes the fields of a complete body with `f`: the body is all there, so
/// running out of it is [`DecodeError::LengthMismatch`] (never `Short`, which
/// would make the IO layer wait for bytes that cannot change the outcome),
/// and so are bytes left over.
pub(crate) fn within<T>(
    body: &[u8],
    f: impl FnOnce(&mut &[u8]) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let mut b = body;
    let v = f(&mut b).map_err(|e| match e {
        DecodeError::Short => DecodeError::LengthMismatch,
        e => e,
    })?;
    if !b.is_empty() {
        return Err(DecodeError::LengthMismatch);
    }
    Ok(v)
}

/// Reads a size-prefixed message (length at most `max`) and decodes its body
/// with `f`, advancing `buf` only on success.
pub(crate) fn get_msg<T>(
    buf: &mut &[u8],
    max: usize,
    f: impl FnOnce(&mut &[u8]) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let mut cur = *buf;
    let body = get_body(&mut cur, max)?;
    let v = within(body, f)?;
    *buf = cur;
    Ok(v)
}

/// Writes a size-prefixed message whose body `f` writes. Control messages
/// are small, so the scratch buffer costs little.
pub(crate) fn put_msg<B: BufMut + ?Sized>(out: &mut B, f: impl FnOnce(&mut Vec<u8>)) {
    let mut body = Vec::new();
    f(&mut body);
    put_vi(out, body.len() as u64);
    out.put_slice(&body);
}

/// Reads a hop list: `count (i)` then that many Hop IDs, at most `max`
/// entries; a non-zero id may not repeat (moq-net's `Hops::push`).
pub(crate) fn get_hops(buf: &mut &[u8], max: usize) -> Result<Vec<u64>, DecodeError> {
    let n = get_vi(buf)?;
    if n > max as u64 {
        return Err(DecodeError::TooMany);
    }
    let mut hops = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let h = get_vi(buf)?;
        if h != 0 && hops.contains(&h) {
            return Err(DecodeError::Invalid("repeated hop id"));
        }
        hops.push(h);
    }
    Ok(hops)
}

/// Writes a hop list.
pub(crate) fn put_hops<B: BufMut + ?Sized>(out: &mut B, hops: &[u64]) {
    put_vi(out, hops.len() as u64);
    for &h in hops {
        put_vi(out, h);
    }
}

/// Helpers the lite test modules share.
#[cfg(test)]
pub(crate) mod test_util {
    use bytes::BytesMut;
    use std::fmt::Debug;

    use super::DecodeError;

    /// Bytes from a hex string with any spacing (`"01 0a ff"`).
    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        assert_eq!(digits.len() % 2, 0, "odd hex string {s:?}");
        digits
            .chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
            .collect()
    }

    /// Checks a test vector: `enc` of `sent` writes exactly `bytes`; `dec` of
    /// `bytes` gives `got` and consumes them all (with a trailing byte left
    /// alone); every truncation is `Short` and leaves the input untouched.
    pub(crate) fn check_asym<T: PartialEq + Debug>(
        bytes: &str,
        sent: &T,
        got: &T,
        enc: impl Fn(&T, &mut BytesMut),
        dec: impl Fn(&mut &[u8]) -> Result<T, DecodeError>,
    ) {
        let b = hex(bytes);
        let mut out = BytesMut::new();
        enc(sent, &mut out);
        assert_eq!(hex_of(&out), hex_of(&b), "encoding of {sent:?}");

        let mut more = b.clone();
        more.push(0xee);
        let mut s = &more[..];
        assert_eq!(dec(&mut s).as_ref(), Ok(got), "decoding {bytes}");
        assert_eq!(s, &[0xee], "decoding {bytes} left the wrong rest");

        for n in 0..b.len() {
            let mut s = &b[..n];
            assert_eq!(dec(&mut s), Err(DecodeError::Short), "{bytes} cut at {n}");
            assert_eq!(s.len(), n, "{bytes} cut at {n} moved the cursor");
        }
    }

    /// [`check_asym`] where the value round-trips.
    pub(crate) fn check<T: PartialEq + Debug>(
        bytes: &str,
        value: &T,
        enc: impl Fn(&T, &mut BytesMut),
        dec: impl Fn(&mut &[u8]) -> Result<T, DecodeError>,
    ) {
        check_asym(bytes, value, value, enc, dec)
    }

    /// Lower-case hex with spaces, for readable failures.
    pub(crate) fn hex_of(b: &[u8]) -> String {
        b.iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_values() {
        for (s, u) in [
            (0i64, 0u64),
            (-1, 1),
            (1, 2),
            (-2, 3),
            (1000, 2000),
            (33, 66),
        ] {
            assert_eq!(zigzag(s), u);
            assert_eq!(unzigzag(u), s);
        }
        assert_eq!(unzigzag(u64::MAX), i64::MIN);
        assert_eq!(unzigzag(u64::MAX - 1), i64::MAX);
    }

    #[test]
    fn opt_and_saturation() {
        let mut out = Vec::new();
        put_opt(&mut out, None);
        put_opt(&mut out, Some(7));
        put_vi(&mut out, u64::MAX);
        let mut s = &out[..];
        assert_eq!(get_opt(&mut s), Ok(None));
        assert_eq!(get_opt(&mut s), Ok(Some(7)));
        assert_eq!(get_vi(&mut s), Ok(VARINT_MAX));
        assert!(s.is_empty());
    }

    #[test]
    fn strings() {
        let mut s = &[2u8, 0xff, 0xfe][..];
        assert!(matches!(get_str(&mut s, 10), Err(DecodeError::Invalid(_))));
        let mut s = &[3u8, b'a', b'b'][..];
        assert_eq!(get_str(&mut s, 10), Err(DecodeError::Short));
        let mut s = &[3u8, b'a', b'b', b'c'][..];
        assert_eq!(get_str(&mut s, 2), Err(DecodeError::TooLong));
    }

    #[test]
    fn bodies() {
        // A body that ends inside a field, and one with a byte left over.
        let mut s = &[1u8, 0x40][..];
        assert_eq!(
            get_msg(&mut s, 10, get_vi),
            Err(DecodeError::LengthMismatch)
        );
        assert_eq!(s.len(), 2);
        let mut s = &[2u8, 1, 2][..];
        assert_eq!(
            get_msg(&mut s, 10, get_vi),
            Err(DecodeError::LengthMismatch)
        );
        let mut s = &[2u8, 1][..];
        assert_eq!(get_msg(&mut s, 10, get_vi), Err(DecodeError::Short));
        let mut s = &[0x40u8, 11][..];
        assert_eq!(get_msg(&mut s, 10, get_vi), Err(DecodeError::TooLong));
        let mut s = &[1u8, 5, 9][..];
        assert_eq!(get_msg(&mut s, 10, get_vi), Ok(5));
        assert_eq!(s, &[9]);
    }

    #[test]
    fn hops() {
        let mut s = &[3u8, 7, 0, 0][..];
        assert_eq!(get_hops(&mut s, 32), Ok(vec![7, 0, 0]));
        let mut s = &[2u8, 7, 7][..];
        assert!(matches!(get_hops(&mut s, 32), Err(DecodeError::Invalid(_))));
        let mut s = &[33u8][..];
        assert_eq!(get_hops(&mut s, 32), Err(DecodeError::TooMany));
    }
}
