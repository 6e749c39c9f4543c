//! Wire primitives: a bounds-checked reader over a packet body and the
//! writers shared by encoding and size computation.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};

/// Largest value of a Variable Byte Integer (four bytes).
pub const MAX_VARINT: u32 = 268_435_455;

/// Reads fields from a packet body. Every read is bounds-checked; binary
/// fields are slices of the body (no copy).
#[derive(Debug)]
pub(crate) struct Reader {
    buf: Bytes,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        if self.buf.is_empty() {
            return Err(DecodeError::UnexpectedEof);
        }
        Ok(self.buf.get_u8())
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        if self.buf.len() < 2 {
            return Err(DecodeError::UnexpectedEof);
        }
        Ok(self.buf.get_u16())
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        if self.buf.len() < 4 {
            return Err(DecodeError::UnexpectedEof);
        }
        Ok(self.buf.get_u32())
    }

    /// A Variable Byte Integer of at most four bytes.
    pub(crate) fn varint(&mut self) -> Result<u32, DecodeError> {
        match parse_varint(&self.buf)? {
            Some((value, len)) => {
                self.buf.advance(len);
                Ok(value)
            }
            None => Err(DecodeError::UnexpectedEof),
        }
    }

    /// The next `n` bytes, sliced.
    pub(crate) fn take(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::UnexpectedEof);
        }
        Ok(self.buf.split_to(n))
    }

    /// Binary Data: two-byte length then bytes.
    pub(crate) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    /// UTF-8 Encoded String: valid UTF-8 without U+0000.
    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        let raw = self.binary()?;
        let s = std::str::from_utf8(&raw).map_err(|_| DecodeError::InvalidUtf8)?;
        if s.contains('\0') {
            return Err(DecodeError::NullCharacter);
        }
        Ok(s.to_owned())
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    /// Fails if bytes are left.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }
}

/// Parses a Variable Byte Integer at the start of `buf`: `Ok(None)` if `buf`
/// ends before its last byte, an error if it runs past four bytes.
pub(crate) fn parse_varint(buf: &[u8]) -> Result<Option<(u32, usize)>, DecodeError> {
    let mut value: u32 = 0;
    for (i, &b) in buf.iter().take(4).enumerate() {
        value |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if buf.len() >= 4 {
        Err(DecodeError::MalformedVarInt)
    } else {
        Ok(None)
    }
}

/// Number of bytes of the Variable Byte Integer encoding of `v`.
pub(crate) fn varint_len(v: usize) -> usize {
    match v {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Where encoded bytes go: a buffer, or a counter when only the size is
/// wanted (so that size computation and encoding share one code path).
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);

    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }

    fn u16(&mut self, v: u16) {
        self.put(&v.to_be_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.put(&v.to_be_bytes());
    }

    fn varint(&mut self, v: u32) -> Result<(), EncodeError> {
        if v > MAX_VARINT {
            return Err(EncodeError::InvalidVarInt(v));
        }
        let mut v = v;
        loop {
            let mut b = (v & 0x7f) as u8;
            v >>= 7;
            if v > 0 {
                b |= 0x80;
            }
            self.u8(b);
            if v == 0 {
                return Ok(());
            }
        }
    }

    fn binary(&mut self, b: &[u8]) -> Result<(), EncodeError> {
        let n = u16::try_from(b.len()).map_err(|_| EncodeError::FieldTooLong(b.len()))?;
        self.u16(n);
        self.put(b);
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<(), EncodeError> {
        self.binary(s.as_bytes())
    }
}

impl Sink for BytesMut {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A [`Sink`] that only counts.
#[derive(Debug, Default)]
pub(crate) struct Counter(pub(crate) usize);

impl Sink for Counter {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        for (v, enc) in [
            (0u32, vec![0x00]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (16_383, vec![0xff, 0x7f]),
            (16_384, vec![0x80, 0x80, 0x01]),
            (2_097_151, vec![0xff, 0xff, 0x7f]),
            (2_097_152, vec![0x80, 0x80, 0x80, 0x01]),
            (MAX_VARINT, vec![0xff, 0xff, 0xff, 0x7f]),
        ] {
            let mut out = BytesMut::new();
            out.varint(v).unwrap();
            assert_eq!(&out[..], &enc[..]);
            assert_eq!(varint_len(v as usize), enc.len());
            assert_eq!(parse_varint(&enc).unwrap(), Some((v, enc.len())));
            assert_eq!(parse_varint(&enc[..enc.len() - 1]).unwrap(), None);
        }
        assert_eq!(
            parse_varint(&[0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(DecodeError::MalformedVarInt)
        );
        assert_eq!(
            parse_varint(&[0x80, 0x80, 0x80, 0x80]),
            Err(DecodeError::MalformedVarInt)
        );
        assert!(BytesMut::new().varint(MAX_VARINT + 1).is_err());
    }

    #[test]
    fn strings() {
        let mut r = Reader::new(Bytes::from_static(&[0, 2, b'h', b'i', 0, 1, 0]));
        assert_eq!(r.string().unwrap(), "hi");
        assert_eq!(r.string(), Err(DecodeError::NullCharacter));
        let mut r = Reader::new(Bytes::from_static(&[0, 2, 0xc3, 0x28]));
        assert_eq!(r.string(), Err(DecodeError::InvalidUtf8));
        let mut r = Reader::new(Bytes::from_static(&[0, 3, b'a']));
        assert_eq!(r.string(), Err(DecodeError::UnexpectedEof));
        // U+FEFF is a valid character and must not be stripped.
        let mut r = Reader::new(Bytes::from_static(&[0, 3, 0xef, 0xbb, 0xbf]));
        assert_eq!(r.string().unwrap(), "\u{feff}");
    }
}
