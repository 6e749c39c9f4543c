//! QUIC variable-length integers (RFC 9000 §16), the integer encoding of
//! drafts before 17. Draft 18's `vi64` agrees with them only below 64.

use bytes::BufMut;

use crate::error::DecodeError;

/// Largest value a QUIC varint holds (2^62 − 1).
pub const VARINT_MAX: u64 = (1 << 62) - 1;

/// Bytes [`put_varint`] writes for `v`.
pub fn varint_len(v: u64) -> usize {
    match v {
        0..=63 => 1,
        64..=16_383 => 2,
        16_384..=1_073_741_823 => 4,
        _ => 8,
    }
}

/// Appends `v`. Values above [`VARINT_MAX`] cannot be written; callers check
/// with [`fits`] first (a draft-18 peer can send up to 2^64 − 1).
pub fn put_varint<B: BufMut + ?Sized>(buf: &mut B, v: u64) {
    debug_assert!(v <= VARINT_MAX);
    match varint_len(v) {
        1 => buf.put_u8(v as u8),
        2 => buf.put_u16(0x4000 | v as u16),
        4 => buf.put_u32(0x8000_0000 | v as u32),
        _ => buf.put_u64(0xc000_0000_0000_0000 | (v & VARINT_MAX)),
    }
}

/// True when `v` can be written as a QUIC varint.
pub fn fits(v: u64) -> bool {
    v <= VARINT_MAX
}

/// Reads one varint; [`DecodeError::Short`] (input untouched) when incomplete.
pub fn get_varint(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    let first = *buf.first().ok_or(DecodeError::Short)?;
    let len = 1usize << (first >> 6);
    if buf.len() < len {
        return Err(DecodeError::Short);
    }
    let mut v = u64::from(first & 0x3f);
    for b in &buf[1..len] {
        v = (v << 8) | u64::from(*b);
    }
    *buf = &buf[len..];
    Ok(v)
}

/// Reads a varint length-prefixed byte string of at most `max` bytes.
pub fn get_lp<'a>(buf: &mut &'a [u8], max: usize) -> Result<&'a [u8], DecodeError> {
    let mut cur = *buf;
    let n = get_varint(&mut cur)?;
    if n > max as u64 {
        return Err(DecodeError::TooLong);
    }
    let n = n as usize;
    if cur.len() < n {
        return Err(DecodeError::Short);
    }
    let (v, rest) = cur.split_at(n);
    *buf = rest;
    Ok(v)
}

/// Appends a varint length-prefixed byte string.
pub fn put_lp<B: BufMut + ?Sized>(buf: &mut B, b: &[u8]) {
    put_varint(buf, b.len() as u64);
    buf.put_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc9000_examples() {
        // RFC 9000 §A.1's sample encodings.
        for (bytes, v) in [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c][..],
                151_288_809_941_952_652u64,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d][..], 494_878_333),
            (&[0x7b, 0xbd][..], 15_293),
            (&[0x25][..], 37),
        ] {
            let mut s = bytes;
            assert_eq!(get_varint(&mut s).unwrap(), v);
            assert!(s.is_empty());
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out, bytes);
        }
        let mut s = &[0x40u8][..];
        assert_eq!(get_varint(&mut s), Err(DecodeError::Short));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn bounds() {
        for v in [
            0,
            63,
            64,
            16_383,
            16_384,
            1_073_741_823,
            1_073_741_824,
            VARINT_MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v));
            assert_eq!(get_varint(&mut &out[..]).unwrap(), v);
        }
        assert!(!fits(VARINT_MAX + 1));
    }
}
