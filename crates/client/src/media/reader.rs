//! A blocking reader (standard input, a pipe, a file) as an [`AsyncRead`].
//!
//! Not `tokio::io::stdin`: its read on the blocking pool cannot be
//! cancelled, so a runtime shutting down would wait for the next line of
//! input. Here the reading thread is detached, and a process ends whatever
//! it waits for.

use std::io::Read;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// Chunks read on a thread of their own; see [`read_on_thread`].
#[derive(Debug)]
pub struct ThreadReader {
    rx: mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    pos: usize,
}

/// Reads `src` on a thread of its own, up to 16 chunks of 64 KiB ahead of
/// the consumer. The thread ends at end of input, at an error, or once the
/// [`ThreadReader`] is dropped and its next read completes.
pub fn read_on_thread(mut src: impl Read + Send + 'static) -> ThreadReader {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || loop {
        let mut buf = vec![0u8; 64 * 1024];
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                buf.truncate(n);
                if tx.blocking_send(Ok(buf)).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                break;
            }
        }
    });
    ThreadReader {
        rx,
        chunk: Vec::new(),
        pos: 0,
    }
}

impl AsyncRead for ThreadReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.pos < this.chunk.len() {
                let n = buf.remaining().min(this.chunk.len() - this.pos);
                buf.put_slice(&this.chunk[this.pos..this.pos + n]);
                this.pos += n;
                return Poll::Ready(Ok(()));
            }
            match ready!(this.rx.poll_recv(cx)) {
                Some(Ok(chunk)) => {
                    this.chunk = chunk;
                    this.pos = 0;
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => return Poll::Ready(Ok(())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn reads_everything_then_ends() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut r = super::read_on_thread(std::io::Cursor::new(data.clone()));
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, data);
    }
}
