//! START, DATA and COMPLETION (draft-evens-moq-bench-00 §5.4).
//!
//! Each message is the whole payload of one MoQT object. Fields are
//! fixed-width, big-endian (network order), with no padding:
//!
//! ```text
//! START      (17 bytes)  type=0x01 u8 | objects_per_group u32 | first_object_size u32
//!                        | remaining_object_size u32 | interval u32
//! DATA       (25 + n)    type=0x02 u8 | group_number u64 | object_number u64
//!                        | milliseconds_since_first_object u32 | data_length u32 | data [n]
//! COMPLETION (21 bytes)  type=0x03 u8 | objects_sent u64 | groups_sent u64 | total_duration u32
//! ```
//!
//! # START's interval is in microseconds
//!
//! The draft gives START's `interval` as a `uint32` and the profile's
//! `time_interval` as "floating point ms" (33.33 for 30 fps video) without
//! saying how one becomes the other. quichub carries it in **whole
//! microseconds, rounded to nearest** (33.33 ms → 33330). Rounding to whole
//! milliseconds would send 33 and make the subscriber's expected schedule
//! drift by 0.33 ms per object — 300 ms after 900 objects, 30 s of 30 fps —
//! which would swamp the receive and publisher variances START exists to
//! measure. A `u32` of microseconds still covers intervals up to 71 minutes.
//! A peer that reads the field as milliseconds is off by a factor of 1000,
//! which its results make obvious.
//!
//! # Send time inside DATA's `data`
//!
//! For one-way latency the first 8 bytes of DATA's `data` carry the
//! publisher's send time in microseconds since the Unix epoch (big-endian
//! `u64`); the rest is zero padding. This is inside `data`, so the wire
//! format of §5.4 is unchanged and any §5.4 reader still parses the message;
//! subscribers on the same clock (one host, or synchronised clocks) subtract
//! it from their arrival time.
//!
//! # Object sizes
//!
//! A profile's `first_object_size` / `object_size` is the size of the whole
//! MoQT object payload, i.e. of the encoded DATA message, header included, so
//! the bytes on the wire match the profile's bit rate. The smallest DATA that
//! carries a send time is [`MIN_DATA_OBJECT_SIZE`] (25-byte header + 8): a
//! smaller configured size is raised to it ([`effective_object_size`]), so
//! every DATA can be timed; expected bit rates use the raised size too.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// START's type byte.
pub const START_TYPE: u8 = 0x01;
/// DATA's type byte.
pub const DATA_TYPE: u8 = 0x02;
/// COMPLETION's type byte.
pub const COMPLETION_TYPE: u8 = 0x03;
/// Encoded size of START.
pub const START_LEN: usize = 17;
/// Encoded size of DATA without its `data`.
pub const DATA_HEADER_LEN: usize = 25;
/// Encoded size of COMPLETION.
pub const COMPLETION_LEN: usize = 21;
/// Bytes of the send time at the start of DATA's `data`.
pub const SEND_TIME_LEN: usize = 8;
/// Smallest DATA object that carries a send time: 33 bytes.
pub const MIN_DATA_OBJECT_SIZE: u32 = (DATA_HEADER_LEN + SEND_TIME_LEN) as u32;

/// START (§5.4.1): the track's parameters, repeated during the start delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    /// Objects in each group (>= 1).
    pub objects_per_group: u32,
    /// Size of each group's first object, as configured.
    pub first_object_size: u32,
    /// Size of the other objects, as configured.
    pub remaining_object_size: u32,
    /// Interval between objects, in microseconds (see module docs).
    pub interval_us: u32,
}

/// DATA (§5.4.2): one benchmark object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// Group of the object, from 0.
    pub group_number: u64,
    /// Object within the group, from 0.
    pub object_number: u64,
    /// Milliseconds from the first DATA's send to this one's, as the
    /// publisher measured it.
    pub ms_since_first_object: u32,
    /// The payload; a zero-copy slice of the decoded buffer. Starts with the
    /// send time when at least [`SEND_TIME_LEN`] long. Encoding writes at
    /// most `u32::MAX` bytes of it.
    pub data: Bytes,
}

/// COMPLETION (§5.4.3): the publisher's totals, after its last DATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// DATA objects sent.
    pub objects_sent: u64,
    /// Groups those objects were in.
    pub groups_sent: u64,
    /// Milliseconds from the first DATA sent to the last.
    pub total_duration_ms: u32,
}

/// One benchmark message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BenchMessage {
    /// START.
    Start(Start),
    /// DATA.
    Data(Data),
    /// COMPLETION.
    Completion(Completion),
}

/// Why a payload is not a benchmark message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The payload is empty.
    #[error("empty payload")]
    Empty,
    /// The first byte is not 0x01, 0x02 or 0x03.
    #[error("unknown message type 0x{0:02x}")]
    UnknownType(u8),
    /// Shorter than the message's fixed fields.
    #[error("{kind} truncated: {got} bytes, need {need}")]
    Truncated {
        /// START, DATA or COMPLETION.
        kind: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// Bytes after a START or COMPLETION.
    #[error("{kind} has {extra} trailing bytes")]
    TrailingBytes {
        /// START or COMPLETION.
        kind: &'static str,
        /// How many.
        extra: usize,
    },
    /// DATA's `data_length` differs from the bytes that follow the header.
    #[error("DATA data_length {declared} but {actual} bytes follow")]
    DataLengthMismatch {
        /// `data_length`.
        declared: u32,
        /// Bytes after the header.
        actual: usize,
    },
}

impl BenchMessage {
    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        match self {
            BenchMessage::Start(_) => START_LEN,
            BenchMessage::Data(d) => DATA_HEADER_LEN + data_len(d),
            BenchMessage::Completion(_) => COMPLETION_LEN,
        }
    }

    /// Writes the message.
    pub fn encode(&self, buf: &mut impl BufMut) {
        match self {
            BenchMessage::Start(s) => {
                buf.put_u8(START_TYPE);
                buf.put_u32(s.objects_per_group);
                buf.put_u32(s.first_object_size);
                buf.put_u32(s.remaining_object_size);
                buf.put_u32(s.interval_us);
            }
            BenchMessage::Data(d) => {
                let n = data_len(d);
                buf.put_u8(DATA_TYPE);
                buf.put_u64(d.group_number);
                buf.put_u64(d.object_number);
                buf.put_u32(d.ms_since_first_object);
                buf.put_u32(n as u32);
                buf.put_slice(&d.data[..n]);
            }
            BenchMessage::Completion(c) => {
                buf.put_u8(COMPLETION_TYPE);
                buf.put_u64(c.objects_sent);
                buf.put_u64(c.groups_sent);
                buf.put_u32(c.total_duration_ms);
            }
        }
    }

    /// The message as one buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.encoded_len());
        self.encode(&mut b);
        b.freeze()
    }

    /// Parses one whole object payload. DATA's `data` is a slice of `payload`
    /// (no copy).
    pub fn decode(payload: &Bytes) -> Result<BenchMessage, MessageError> {
        let Some(&ty) = payload.first() else {
            return Err(MessageError::Empty);
        };
        let mut b = &payload[1..];
        match ty {
            START_TYPE => {
                fixed("START", payload.len(), START_LEN)?;
                Ok(BenchMessage::Start(Start {
                    objects_per_group: b.get_u32(),
                    first_object_size: b.get_u32(),
                    remaining_object_size: b.get_u32(),
                    interval_us: b.get_u32(),
                }))
            }
            DATA_TYPE => {
                if payload.len() < DATA_HEADER_LEN {
                    return Err(MessageError::Truncated {
                        kind: "DATA",
                        need: DATA_HEADER_LEN,
                        got: payload.len(),
                    });
                }
                let group_number = b.get_u64();
                let object_number = b.get_u64();
                let ms_since_first_object = b.get_u32();
                let declared = b.get_u32();
                let actual = payload.len() - DATA_HEADER_LEN;
                if usize::try_from(declared).ok() != Some(actual) {
                    return Err(MessageError::DataLengthMismatch { declared, actual });
                }
                Ok(BenchMessage::Data(Data {
                    group_number,
                    object_number,
                    ms_since_first_object,
                    data: payload.slice(DATA_HEADER_LEN..),
                }))
            }
            COMPLETION_TYPE => {
                fixed("COMPLETION", payload.len(), COMPLETION_LEN)?;
                Ok(BenchMessage::Completion(Completion {
                    objects_sent: b.get_u64(),
                    groups_sent: b.get_u64(),
                    total_duration_ms: b.get_u32(),
                }))
            }
            other => Err(MessageError::UnknownType(other)),
        }
    }
}

/// Bytes of `data` that encoding writes.
fn data_len(d: &Data) -> usize {
    d.data.len().min(u32::MAX as usize)
}

/// Checks a fixed-size message's length.
fn fixed(kind: &'static str, got: usize, need: usize) -> Result<(), MessageError> {
    if got < need {
        Err(MessageError::Truncated { kind, need, got })
    } else if got > need {
        Err(MessageError::TrailingBytes {
            kind,
            extra: got - need,
        })
    } else {
        Ok(())
    }
}

impl Data {
    /// A DATA whose encoding is `effective_object_size(object_size)` bytes:
    /// `data` is the send time (µs since the Unix epoch, big-endian) followed
    /// by zeros.
    pub fn timed(
        group_number: u64,
        object_number: u64,
        ms_since_first_object: u32,
        send_time_us: u64,
        object_size: u32,
    ) -> Data {
        let n = effective_object_size(object_size) as usize - DATA_HEADER_LEN;
        let mut data = BytesMut::with_capacity(n);
        data.put_u64(send_time_us);
        data.put_bytes(0, n - SEND_TIME_LEN);
        Data {
            group_number,
            object_number,
            ms_since_first_object,
            data: data.freeze(),
        }
    }

    /// The publisher's send time (µs since the Unix epoch), when `data`
    /// is long enough to hold one.
    pub fn send_time_us(&self) -> Option<u64> {
        let mut b = self.data.get(..SEND_TIME_LEN)?;
        Some(b.get_u64())
    }
}

/// The encoded DATA object of total size `effective_object_size(object_size)`
/// with the send time in `data` (see [`Data::timed`]), in one allocation.
pub fn data_object(
    group_number: u64,
    object_number: u64,
    ms_since_first_object: u32,
    send_time_us: u64,
    object_size: u32,
) -> Bytes {
    let total = effective_object_size(object_size) as usize;
    let n = total - DATA_HEADER_LEN;
    let mut b = BytesMut::with_capacity(total);
    b.put_u8(DATA_TYPE);
    b.put_u64(group_number);
    b.put_u64(object_number);
    b.put_u32(ms_since_first_object);
    b.put_u32(n as u32);
    b.put_u64(send_time_us);
    b.put_bytes(0, n - SEND_TIME_LEN);
    b.freeze()
}

/// The object size actually sent for a configured size: at least
/// [`MIN_DATA_OBJECT_SIZE`].
pub fn effective_object_size(configured: u32) -> u32 {
    configured.max(MIN_DATA_OBJECT_SIZE)
}

/// DATA's `milliseconds_since_first_object` for a send at `send_time_us`
/// when the first DATA was sent at `first_send_time_us`: whole milliseconds,
/// rounded down, 0 if earlier, saturating at `u32::MAX`.
pub fn ms_since_first_object(first_send_time_us: u64, send_time_us: u64) -> u32 {
    let ms = send_time_us.saturating_sub(first_send_time_us) / 1000;
    u32::try_from(ms).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: &BenchMessage) {
        let b = m.to_bytes();
        assert_eq!(b.len(), m.encoded_len());
        assert_eq!(&BenchMessage::decode(&b).unwrap(), m);
    }

    #[test]
    fn start_bytes() {
        let m = BenchMessage::Start(Start {
            objects_per_group: 150,
            first_object_size: 21333,
            remaining_object_size: 2666,
            interval_us: 33330,
        });
        let wire: &[u8] = &[
            0x01, // type
            0x00, 0x00, 0x00, 0x96, // objects_per_group 150
            0x00, 0x00, 0x53, 0x55, // first_object_size 21333
            0x00, 0x00, 0x0a, 0x6a, // remaining_object_size 2666
            0x00, 0x00, 0x82, 0x32, // interval 33330 us
        ];
        assert_eq!(&m.to_bytes()[..], wire);
        assert_eq!(BenchMessage::decode(&Bytes::from_static(wire)).unwrap(), m);
        roundtrip(&m);
    }

    #[test]
    fn data_bytes() {
        let wire: &[u8] = &[
            0x02, // type
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, // group 258
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // object 7
            0x00, 0x01, 0x00, 0x00, // ms since first 65536
            0x00, 0x00, 0x00, 0x03, // data_length 3
            0xaa, 0xbb, 0xcc, // data
        ];
        let payload = Bytes::from_static(wire);
        let BenchMessage::Data(d) = BenchMessage::decode(&payload).unwrap() else {
            panic!("not DATA");
        };
        assert_eq!(
            (d.group_number, d.object_number, d.ms_since_first_object),
            (258, 7, 65536)
        );
        assert_eq!(&d.data[..], &[0xaa, 0xbb, 0xcc]);
        // Zero-copy: data points into the payload.
        assert_eq!(d.data.as_ptr(), payload[25..].as_ptr());
        assert_eq!(d.send_time_us(), None);
        assert_eq!(&BenchMessage::Data(d.clone()).to_bytes()[..], wire);
        roundtrip(&BenchMessage::Data(d));
        // Empty data.
        roundtrip(&BenchMessage::Data(Data {
            group_number: u64::MAX,
            object_number: 0,
            ms_since_first_object: u32::MAX,
            data: Bytes::new(),
        }));
    }

    #[test]
    fn completion_bytes() {
        let m = BenchMessage::Completion(Completion {
            objects_sent: 1500,
            groups_sent: 10,
            total_duration_ms: 29980,
        });
        let wire: &[u8] = &[
            0x03, // type
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0xdc, // objects_sent 1500
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, // groups_sent 10
            0x00, 0x00, 0x75, 0x1c, // total_duration 29980
        ];
        assert_eq!(&m.to_bytes()[..], wire);
        assert_eq!(BenchMessage::decode(&Bytes::from_static(wire)).unwrap(), m);
        roundtrip(&m);
    }

    #[test]
    fn timed_data_object() {
        let t = 1_700_000_000_123_456u64;
        let b = data_object(3, 4, 60, t, 120);
        assert_eq!(b.len(), 120);
        assert_eq!(&b[..1], &[0x02]);
        assert_eq!(&b[21..25], &95u32.to_be_bytes());
        assert_eq!(&b[25..33], &t.to_be_bytes());
        assert!(b[33..].iter().all(|&x| x == 0));
        let BenchMessage::Data(d) = BenchMessage::decode(&b).unwrap() else {
            panic!("not DATA");
        };
        assert_eq!(d.send_time_us(), Some(t));
        assert_eq!(
            (d.group_number, d.object_number, d.ms_since_first_object),
            (3, 4, 60)
        );
        assert_eq!(
            BenchMessage::Data(Data::timed(3, 4, 60, t, 120)).to_bytes(),
            b
        );
        // Sizes below header + send time are raised to 33 bytes.
        for size in [0, 1, 25, 32, 33] {
            let b = data_object(0, 0, 0, t, size);
            assert_eq!(b.len(), 33, "size {size}");
            let BenchMessage::Data(d) = BenchMessage::decode(&b).unwrap() else {
                panic!("not DATA");
            };
            assert_eq!(d.send_time_us(), Some(t));
        }
        assert_eq!(data_object(0, 0, 0, t, 34).len(), 34);
        assert_eq!(effective_object_size(21333), 21333);
    }

    #[test]
    fn ms_since_first() {
        assert_eq!(ms_since_first_object(1_000_000, 1_033_999), 33);
        assert_eq!(ms_since_first_object(1_000_000, 999_000), 0);
        assert_eq!(ms_since_first_object(0, u64::MAX), u32::MAX);
    }

    #[test]
    fn malformed() {
        let d = |v: &[u8]| BenchMessage::decode(&Bytes::copy_from_slice(v));
        assert_eq!(d(&[]), Err(MessageError::Empty));
        assert_eq!(d(&[0x00]), Err(MessageError::UnknownType(0)));
        assert_eq!(d(&[0x04, 1, 2]), Err(MessageError::UnknownType(4)));
        assert_eq!(
            d(&[0x01, 0, 0, 0]),
            Err(MessageError::Truncated {
                kind: "START",
                need: 17,
                got: 4
            })
        );
        assert_eq!(
            d(&[1; 18]),
            Err(MessageError::TrailingBytes {
                kind: "START",
                extra: 1
            })
        );
        assert_eq!(
            d(&[0x02; 24]),
            Err(MessageError::Truncated {
                kind: "DATA",
                need: 25,
                got: 24
            })
        );
        assert_eq!(
            d(&[0x03; 20]),
            Err(MessageError::Truncated {
                kind: "COMPLETION",
                need: 21,
                got: 20
            })
        );
        assert_eq!(
            d(&[0x03; 22]),
            Err(MessageError::TrailingBytes {
                kind: "COMPLETION",
                extra: 1
            })
        );
        // data_length larger, smaller and huge.
        let mut v = BenchMessage::Data(Data {
            group_number: 1,
            object_number: 2,
            ms_since_first_object: 3,
            data: Bytes::from_static(b"abcd"),
        })
        .to_bytes()
        .to_vec();
        v[24] = 5;
        assert_eq!(
            d(&v),
            Err(MessageError::DataLengthMismatch {
                declared: 5,
                actual: 4
            })
        );
        v[24] = 3;
        assert_eq!(
            d(&v),
            Err(MessageError::DataLengthMismatch {
                declared: 3,
                actual: 4
            })
        );
        v[21..25].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            d(&v),
            Err(MessageError::DataLengthMismatch { .. })
        ));
        assert_eq!(
            MessageError::DataLengthMismatch {
                declared: 5,
                actual: 4
            }
            .to_string(),
            "DATA data_length 5 but 4 bytes follow"
        );
    }

    #[test]
    fn every_prefix_and_byte_flip_is_handled() {
        let msgs = [
            BenchMessage::Start(Start {
                objects_per_group: 1,
                first_object_size: 2,
                remaining_object_size: 3,
                interval_us: 4,
            }),
            BenchMessage::Data(Data::timed(1, 2, 3, 4, 40)),
            BenchMessage::Completion(Completion {
                objects_sent: 1,
                groups_sent: 2,
                total_duration_ms: 3,
            }),
        ];
        for m in &msgs {
            let b = m.to_bytes();
            for n in 0..b.len() {
                assert!(BenchMessage::decode(&b.slice(..n)).is_err());
            }
            for i in 0..b.len() {
                let mut v = b.to_vec();
                v[i] ^= 0xff;
                let _ = BenchMessage::decode(&Bytes::from(v));
            }
        }
    }
}
