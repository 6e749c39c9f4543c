//! How `quichub pub --profile stdin` cuts its input into objects, and how
//! `quichub sub` writes the payloads it receives.
//!
//! Input (`pub --framing`):
//! - `line` (default): one object per `\n`-terminated line, the `\n` not
//!   included; any bytes, not only UTF-8 (a `\r` before the `\n` is kept). A
//!   last line without `\n` is an object too.
//! - `length`: each object is a 4-byte big-endian unsigned length followed by
//!   that many bytes. A stream that ends inside a prefix or a payload is an
//!   error.
//! - `raw-chunks`: whatever one read of stdin returns, at most `--chunk-size`
//!   bytes, is an object (from a file: full chunks, the last one shorter).
//!   Concatenated on the other side the payloads give the input back byte for
//!   byte.
//!
//! Output (`sub --framing`):
//! - `raw` (default): payloads exactly as received, nothing added; with
//!   `raw-chunks` on the publisher this reproduces the input file.
//! - `line`: each payload followed by `\n` (the inverse of `pub --framing line`).
//! - `length`: each payload preceded by its 4-byte big-endian length (the
//!   inverse of `pub --framing length`).

use std::io::{self, BufRead, Read, Write};

/// Default `--chunk-size` of `raw-chunks`: 16 KiB.
pub const DEFAULT_CHUNK_SIZE: usize = 16 * 1024;

/// How stdin is cut into objects.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InFraming {
    /// One object per `\n`-terminated line, without the `\n`; any bytes.
    #[default]
    Line,
    /// Each object prefixed by its length, a big-endian u32.
    Length,
    /// Each read of stdin (at most `--chunk-size` bytes) is one object.
    #[value(name = "raw-chunks", alias = "raw")]
    RawChunks,
}

/// How received payloads are written to stdout.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutFraming {
    /// Payloads as received, nothing added.
    #[default]
    #[value(alias = "raw-chunks")]
    Raw,
    /// Each payload followed by `\n`.
    Line,
    /// Each payload preceded by its length, a big-endian u32.
    Length,
}

/// Reads the next object from `r`; `None` at a clean end of input.
pub fn read_object(
    r: &mut impl BufRead,
    framing: InFraming,
    chunk_size: usize,
) -> io::Result<Option<Vec<u8>>> {
    match framing {
        InFraming::Line => {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line)? == 0 {
                return Ok(None);
            }
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            Ok(Some(line))
        }
        InFraming::Length => {
            let mut prefix = [0u8; 4];
            let mut got = 0;
            while got < 4 {
                match r.read(&mut prefix[got..]) {
                    Ok(0) if got == 0 => return Ok(None),
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("input ends inside a length prefix ({got} of 4 bytes)"),
                        ))
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let len = u32::from_be_bytes(prefix) as u64;
            let mut payload = Vec::new();
            // `take` rather than a buffer of `len`: a bad prefix must not
            // allocate gigabytes before the input runs out.
            r.take(len).read_to_end(&mut payload)?;
            if (payload.len() as u64) < len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "input ends inside an object: {} of the {len} bytes its prefix announced",
                        payload.len()
                    ),
                ));
            }
            Ok(Some(payload))
        }
        InFraming::RawChunks => {
            let mut buf = vec![0u8; chunk_size.max(1)];
            loop {
                match r.read(&mut buf) {
                    Ok(0) => return Ok(None),
                    Ok(n) => {
                        buf.truncate(n);
                        return Ok(Some(buf));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// Writes one payload to `w` framed as `framing`.
pub fn write_object(w: &mut impl Write, framing: OutFraming, payload: &[u8]) -> io::Result<()> {
    match framing {
        OutFraming::Raw => w.write_all(payload),
        OutFraming::Line => {
            w.write_all(payload)?;
            w.write_all(b"\n")
        }
        OutFraming::Length => {
            let len = u32::try_from(payload.len()).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "payload longer than a u32 length prefix",
                )
            })?;
            w.write_all(&len.to_be_bytes())?;
            w.write_all(payload)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], framing: InFraming, chunk: usize) -> io::Result<Vec<Vec<u8>>> {
        let mut r = io::BufReader::with_capacity(7, input);
        let mut out = Vec::new();
        while let Some(o) = read_object(&mut r, framing, chunk)? {
            out.push(o);
        }
        Ok(out)
    }

    #[test]
    fn lines_are_bytes_not_text() {
        let input = b"alpha\n\xff\xfe\x00bin\r\n\nlast";
        let objs = all(input, InFraming::Line, 0).unwrap();
        assert_eq!(
            objs,
            vec![
                b"alpha".to_vec(),
                b"\xff\xfe\x00bin\r".to_vec(),
                Vec::new(),
                b"last".to_vec()
            ]
        );
        let mut out = Vec::new();
        for o in &objs {
            write_object(&mut out, OutFraming::Line, o).unwrap();
        }
        assert_eq!(out, b"alpha\n\xff\xfe\x00bin\r\n\nlast\n");
    }

    #[test]
    fn length_prefixed_round_trip() {
        let objs = vec![b"".to_vec(), vec![0u8, 10, 255], vec![7u8; 300]];
        let mut framed = Vec::new();
        for o in &objs {
            write_object(&mut framed, OutFraming::Length, o).unwrap();
        }
        assert_eq!(&framed[..4], &[0, 0, 0, 0]);
        assert_eq!(&framed[4..8], &[0, 0, 0, 3]);
        assert_eq!(&framed[11..15], &[0, 0, 1, 44]);
        assert_eq!(all(&framed, InFraming::Length, 0).unwrap(), objs);
    }

    #[test]
    fn truncated_length_framing_is_an_error() {
        let e = all(&[0, 0, 0], InFraming::Length, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = all(&[0, 0, 0, 5, 1, 2], InFraming::Length, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("2 of the 5"), "{e}");
        // A huge announced length does not allocate it up front.
        let e = all(&[0xff, 0xff, 0xff, 0xff, 1], InFraming::Length, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn raw_chunks_concatenate_to_the_input() {
        let input: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 256) as u8).collect();
        let mut r: &[u8] = &input;
        let mut objs = Vec::new();
        while let Some(o) = read_object(&mut r, InFraming::RawChunks, 4096).unwrap() {
            objs.push(o);
        }
        assert_eq!(
            objs.iter().map(Vec::len).collect::<Vec<_>>(),
            [4096, 4096, 1808]
        );
        let mut out = Vec::new();
        for o in &objs {
            write_object(&mut out, OutFraming::Raw, o).unwrap();
        }
        assert_eq!(out, input);
    }

    #[test]
    fn read_errors_are_reported() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        for f in [InFraming::Line, InFraming::Length, InFraming::RawChunks] {
            let mut r = io::BufReader::new(Failing);
            assert!(read_object(&mut r, f, 16).is_err(), "{f:?}");
        }
    }
}
