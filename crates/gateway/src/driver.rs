//! Runs one [`Session`] over a transport: one task per connection, one
//! `select!` over reading, writing, deliveries from the broker, a takeover
//! signal, the store's durability, auth reloads and the session's deadlines.
//!
//! Reads and writes are both cancel-safe branches, so a client that
//! publishes while not reading never deadlocks the broker; past
//! [`MAX_WRITE_BUFFER`](crate::session::MAX_WRITE_BUFFER) unsent bytes the
//! connection stops reading (the client is throttled by its transport's flow
//! control) and stops taking deliveries (its queue in the broker fills and
//! drops, counted). A client over its publish rate or bandwidth
//! ([`ConnConfig::publish_rate`], ...) is throttled the same way: its next
//! PUBLISH stays unread until its tokens are back (as EMQX does), so nothing
//! is lost.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::BytesMut;
use quichub_mqtt::reason;
use tokio::sync::mpsc;

use crate::broker::{Broker, Delivery, Outbox};
use crate::session::{self, Accept, ConnConfig, ConnError, Ending, Hello, Peer, Session};

/// Deliveries taken from the broker at once, to write them together (one
/// write per burst, not per message).
const MAX_BATCH: usize = 64;

/// What [`Link::io`] did.
pub(crate) enum Progress {
    /// Read input; `more` is false once the input has ended (what was
    /// appended still counts).
    Read {
        /// The input goes on.
        more: bool,
    },
    /// Wrote output, or took it on.
    Wrote,
}

/// A transport as the driver sees it: bytes in, whole packets out.
pub(crate) trait Link {
    /// Waits until the client's next input is appended to `input` (if
    /// `read`), or some of `output` (whole encoded packets) is written or
    /// taken on, and taken away from it (if `write`; at least one of the two
    /// is asked). Cancel-safe.
    async fn io(
        &mut self,
        input: &mut BytesMut,
        read: bool,
        output: &mut BytesMut,
        write: bool,
    ) -> std::io::Result<Progress>;

    /// Whether the link holds output it took on but has not written yet.
    fn busy(&self) -> bool {
        false
    }

    /// Closes the sending side once the session's last words are out.
    async fn shutdown(&mut self) {}
}

/// Serves one MQTT connection of `peer` over `link` until it ends.
pub(crate) async fn serve<L: Link>(
    broker: Arc<Broker>,
    cfg: Arc<ConnConfig>,
    peer: Peer,
    link: &mut L,
) -> Result<(), ConnError> {
    let mut io = Metered {
        link,
        received: &broker.metrics.bytes_received,
        sent: &broker.metrics.bytes_sent,
    };
    let mut inbuf = BytesMut::with_capacity(4096);
    let connect = tokio::time::timeout(cfg.connect_timeout, async {
        loop {
            match session::expect_connect(&mut inbuf, &cfg) {
                Hello::Connect(c) => return Ok(c),
                Hello::More => {}
                Hello::Refuse { mut reply, error } => {
                    let _ = io.write_all(&mut reply).await;
                    return Err(error);
                }
            }
            if !io.read(&mut inbuf).await? {
                return Err(ConnError::Protocol("closed before CONNECT"));
            }
        }
    })
    .await
    .map_err(|_| ConnError::Timeout)??;

    let (tx, mut rx) = mpsc::channel(broker.config.max_queued.max(1));
    let (kick_tx, mut kick) = mpsc::channel(1);
    let outbox = Outbox {
        tx,
        conn: broker.next_conn_id(),
        kick: kick_tx,
    };
    let accepted = session::accept(
        &broker,
        &cfg,
        &peer,
        *connect,
        outbox,
        inbuf,
        Instant::now(),
        SystemTime::now(),
    )?;
    let mut s = match accepted {
        Accept::Connected(s) => s,
        Accept::Refused(mut reply) => {
            io.write_all(&mut reply).await?;
            return Ok(());
        }
    };
    let _open = broker.metrics.connection_opened(peer.transport);
    let result = run(&broker, &mut s, &mut io, &mut rx, &mut kick).await;
    rx.close();
    let mut left = Vec::new();
    while let Ok(d) = rx.try_recv() {
        left.push(d);
    }
    let departure = s.end(&result, left, SystemTime::now());
    if !s.output().is_empty() || io.link.busy() {
        let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(s.output())).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), io.link.shutdown()).await;
    departure.leave(&broker);
    result.map(|_| ())
}

async fn run<L: Link>(
    broker: &Broker,
    s: &mut Session,
    io: &mut Metered<'_, L>,
    rx: &mut mpsc::Receiver<Delivery>,
    kick: &mut mpsc::Receiver<u8>,
) -> Result<Ending, ConnError> {
    let mut eof = false;
    // Reloads wake the loop, so an idle client whose credentials a reload
    // revoked is disconnected at once (reloads before this are caught by
    // the first refresh, which compares generations).
    let mut auth_changes = s.auth_changes();
    loop {
        s.refresh_auth(SystemTime::now())?;
        if let Some(end) = s.handle_input(broker, Instant::now())? {
            if let Some(mut rx) = s.durable_watch() {
                let last = s.last_ticket();
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|v| *v >= last)).await;
            }
            s.flush(broker)?;
            let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(s.output())).await;
            return Ok(end);
        }
        // What a throttled client sent before it closed is still served.
        if eof && !s.throttled() {
            return Err(ConnError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        s.flush(broker)?;
        let waiting_durable = s.waiting_durable();
        let mut durable = s.durable_watch();
        let synced = async {
            match durable.as_mut() {
                Some(rx) if waiting_durable => {
                    let _ = rx.changed().await;
                }
                _ => std::future::pending().await,
            }
        };
        let can_read = s.can_read();
        let can_take = s.can_take();
        let writing = !s.output().is_empty() || io.link.busy();
        let timeout = s.timeout();
        let timer = async {
            match timeout {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        let expiry = s.auth_expires().map(|e| {
            e.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        });
        let expired = async {
            match expiry {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let reloaded = async {
            if auth_changes.changed().await.is_err() {
                // The auth is gone: nothing will change any more.
                std::future::pending::<()>().await;
            }
        };
        let (input, output) = s.buffers();
        tokio::select! {
            // The loop's top refreshes the credentials.
            () = reloaded => {}
            p = io.io(input, can_read, output, writing), if can_read || writing => {
                if let Progress::Read { more: false } = p? {
                    eof = true;
                }
            }
            d = rx.recv(), if can_take => {
                if let Some(d) = d {
                    s.deliver(d);
                    // Take what else is queued now, so one write carries it all.
                    for _ in 1..MAX_BATCH {
                        match rx.try_recv() {
                            Ok(d) => s.deliver(d),
                            Err(_) => break,
                        }
                    }
                }
            }
            code = kick.recv() => {
                return Err(ConnError::Refused(code.unwrap_or(reason::SESSION_TAKEN_OVER)));
            }
            _ = synced => {}
            () = timer => s.handle_timeout(Instant::now())?,
            _ = expired => return Err(s.credentials_expired(broker)),
        }
    }
}

/// A link that counts its bytes into the broker's metrics (one relaxed
/// `fetch_add` per read or write call, not per byte or packet).
struct Metered<'a, L> {
    link: &'a mut L,
    received: &'a AtomicU64,
    sent: &'a AtomicU64,
}

impl<L: Link> Metered<'_, L> {
    async fn io(
        &mut self,
        input: &mut BytesMut,
        read: bool,
        output: &mut BytesMut,
        write: bool,
    ) -> std::io::Result<Progress> {
        let (i, o) = (input.len(), output.len());
        let r = self.link.io(input, read, output, write).await;
        let n = input.len().saturating_sub(i);
        if n > 0 {
            self.received.fetch_add(n as u64, Relaxed);
        }
        let n = o.saturating_sub(output.len());
        if n > 0 {
            self.sent.fetch_add(n as u64, Relaxed);
        }
        r
    }

    /// Reads more input; false once it has ended.
    async fn read(&mut self, input: &mut BytesMut) -> std::io::Result<bool> {
        let mut none = BytesMut::new();
        match self.io(input, true, &mut none, false).await? {
            Progress::Read { more } => Ok(more),
            Progress::Wrote => Ok(true),
        }
    }

    /// Writes all of `output`.
    async fn write_all(&mut self, output: &mut BytesMut) -> std::io::Result<()> {
        let mut none = BytesMut::new();
        while !output.is_empty() || self.link.busy() {
            self.io(&mut none, false, output, true).await?;
        }
        Ok(())
    }
}
