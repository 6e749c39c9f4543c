//! The IO half of HTTP/3: streams of one quinn connection in, requests and
//! WebTransport sessions out. Framing and heads are in [`super::codec`].

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;
use tokio::task::JoinSet;
use web_transport_quinn::proto::{ConnectRequest, Settings};
use web_transport_quinn::OtherBi;

use super::codec::{self, code, frame, stream, FrameError, RequestHead};

/// How long a peer may take to send a request's HEADERS after opening its
/// stream, or its control stream after a CONNECT.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request body may take to arrive (slow clients hold a task
/// and a stream each).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Unidirectional streams a peer may open besides WebTransport ones (control,
/// QPACK encoder and decoder, and a few unknown ones we discard).
const MAX_AUX_UNI: usize = 16;

/// Whether the TLS handshake of a connection handed over early has completed.
#[derive(Debug, Clone)]
pub struct Handshake(watch::Receiver<Option<bool>>);

impl Handshake {
    /// For a connection whose handshake is already complete.
    pub fn completed() -> Self {
        let (_tx, rx) = watch::channel(Some(true));
        Self(rx)
    }

    /// For a connection taken with quinn's server-side `into_0rtt`: resolves
    /// when its handshake completes (true) or fails (false).
    pub fn from_0rtt(conn: &quinn::Connection, accepted: quinn::ZeroRttAccepted) -> Self {
        let (tx, rx) = watch::channel(None);
        let conn = conn.clone();
        tokio::spawn(async move {
            // Resolves when the handshake ends; its value tells whether
            // 0-RTT data was accepted (false without any), not success.
            let _ = accepted.await;
            let ok = crate::server::handshake_complete(&conn);
            tx.send(Some(ok)).ok();
        });
        Self(rx)
    }

    /// True once the handshake has completed.
    pub fn is_complete(&self) -> bool {
        *self.0.borrow() == Some(true)
    }

    /// Waits for the handshake; false if the connection failed first (a
    /// replayed 0-RTT flight never completes).
    pub async fn wait(&self) -> bool {
        let mut rx = self.0.clone();
        let ok = match rx.wait_for(|v| v.is_some()).await {
            Ok(v) => *v == Some(true),
            Err(_) => false,
        };
        ok
    }
}

/// What a new `h3` connection turned out to be.
pub enum Incoming {
    /// A WebTransport CONNECT, handshake complete: accept or reject it.
    /// Plain requests on the same connection go to `http`, once the session
    /// is told where to forward them: call
    /// `session.forward_other_bi(forward)` on the accepted session.
    WebTransport {
        /// The CONNECT.
        request: web_transport_quinn::Request,
        /// The connection's plain HTTP/3 requests.
        http: Box<HttpConnection>,
        /// Hand to `Session::forward_other_bi`.
        forward: futures::channel::mpsc::UnboundedSender<OtherBi>,
    },
    /// Plain HTTP/3 requests (the first one included).
    Http(HttpConnection),
}

/// Why an `h3` connection could not be set up (it has been closed).
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The QUIC connection failed.
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// The peer broke HTTP/3 on a critical stream.
    #[error("HTTP/3: {0}")]
    Protocol(String),
    /// The peer sent nothing usable in time.
    #[error("HTTP/3: {0}")]
    Timeout(&'static str),
}

/// A request stream whose HEADERS have been read.
struct Head {
    head: RequestHead,
    /// The HEADERS frame as received (a CONNECT is re-decoded from it).
    frame: Bytes,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    early: bool,
}

/// Reads one QUIC varint from `recv` (exactly its bytes).
async fn read_varint(recv: &mut quinn::RecvStream) -> Result<u64, String> {
    let mut b = [0u8; 8];
    recv.read_exact(&mut b[..1])
        .await
        .map_err(|e| e.to_string())?;
    let n = 1usize << (b[0] >> 6);
    recv.read_exact(&mut b[1..n])
        .await
        .map_err(|e| e.to_string())?;
    Ok(codec::decode_varint(&b[..n]).expect("complete varint").0)
}

/// Reads the request's HEADERS frame, and nothing after it (a CONNECT's
/// stream goes on to carry capsules that web-transport-quinn reads).
async fn read_head(
    conn: quinn::Connection,
    send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    mut first_type: Option<u64>,
) -> Option<Head> {
    // Asked of TLS itself: the watch in `Handshake` lags by a task switch.
    let early = !crate::server::handshake_complete(&conn);
    let res = async {
        let mut skipped = 0u64;
        loop {
            let typ = match first_type.take() {
                Some(t) => t,
                None => read_varint(&mut recv).await.map_err(|_| {
                    (
                        code::REQUEST_INCOMPLETE,
                        "stream ended before HEADERS".into(),
                    )
                })?,
            };
            let len = read_varint(&mut recv).await.map_err(|_| {
                (
                    code::REQUEST_INCOMPLETE,
                    "stream ended before HEADERS".into(),
                )
            })?;
            if typ != frame::HEADERS {
                // DATA or a control frame before HEADERS is an error;
                // reserved and unknown frames are skipped without buffering
                // them, up to MAX_OTHER_FRAME bytes in all.
                if typ == frame::DATA || codec::check_request_frame(typ).is_err() {
                    return Err((
                        code::FRAME_UNEXPECTED,
                        format!("frame {typ:#x} before HEADERS"),
                    ));
                }
                skipped = skipped.saturating_add(len);
                if skipped > codec::MAX_OTHER_FRAME {
                    return Err((code::EXCESSIVE_LOAD, "too much before HEADERS".into()));
                }
                let mut left = len as usize;
                let mut sink = [0u8; 1024];
                while left > 0 {
                    let n = left.min(sink.len());
                    recv.read_exact(&mut sink[..n]).await.map_err(|_| {
                        (code::REQUEST_INCOMPLETE, "stream ended in a frame".into())
                    })?;
                    left -= n;
                }
                continue;
            }
            if len > codec::MAX_FIELD_SECTION {
                return Err((
                    code::EXCESSIVE_LOAD,
                    format!("field section of {len} bytes"),
                ));
            }
            let mut payload = vec![0u8; len as usize];
            recv.read_exact(&mut payload)
                .await
                .map_err(|_| (code::REQUEST_INCOMPLETE, "stream ended in HEADERS".into()))?;
            let head = codec::decode_request_head(&payload)
                .map_err(|e: FrameError| (e.code(), e.to_string()))?;
            let mut f = BytesMut::with_capacity(payload.len() + 16);
            codec::encode_varint(typ, &mut f);
            codec::encode_varint(len, &mut f);
            f.extend_from_slice(&payload);
            return Ok((head, f.freeze()));
        }
    };
    match tokio::time::timeout(HEAD_TIMEOUT, res).await {
        Ok(Ok((head, frame))) => Some(Head {
            head,
            frame,
            send,
            recv,
            early,
        }),
        Ok(Err((c, why))) => {
            tracing::debug!("HTTP/3 request refused: {why}");
            refuse(send, recv, c);
            None
        }
        Err(_) => {
            refuse(send, recv, code::REQUEST_INCOMPLETE);
            None
        }
    }
}

fn refuse(mut send: quinn::SendStream, mut recv: quinn::RecvStream, c: u32) {
    send.reset(c.into()).ok();
    recv.stop(c.into()).ok();
}

/// The peer's unidirectional streams outside WebTransport: its control stream
/// (SETTINGS), QPACK streams (kept open and drained: we allow no dynamic
/// table, so they carry nothing we need), and unknown types (stopped).
struct UniStreams {
    conn: quinn::Connection,
    classify: JoinSet<Option<(u64, quinn::RecvStream, Option<Settings>)>>,
    accepted: usize,
    control: Option<(quinn::RecvStream, Settings)>,
    held: Vec<quinn::RecvStream>,
}

impl UniStreams {
    fn new(conn: quinn::Connection) -> Self {
        Self {
            conn,
            classify: JoinSet::new(),
            accepted: 0,
            control: None,
            held: Vec::new(),
        }
    }

    /// Reads a new stream's type (and a control stream's SETTINGS).
    async fn classify(
        mut recv: quinn::RecvStream,
    ) -> Option<(u64, quinn::RecvStream, Option<Settings>)> {
        let typ = read_varint(&mut recv).await.ok()?;
        if typ != stream::CONTROL {
            return Some((typ, recv, None));
        }
        // SETTINGS must be the control stream's first frame (RFC 9114 §6.2.1).
        let ftyp = read_varint(&mut recv).await.ok()?;
        let len = read_varint(&mut recv).await.ok()?;
        if ftyp != frame::SETTINGS || len > codec::MAX_OTHER_FRAME {
            return Some((typ, recv, None));
        }
        let mut raw = BytesMut::new();
        codec::encode_varint(stream::CONTROL, &mut raw);
        codec::encode_varint(ftyp, &mut raw);
        codec::encode_varint(len, &mut raw);
        let mut payload = vec![0u8; len as usize];
        recv.read_exact(&mut payload).await.ok()?;
        raw.extend_from_slice(&payload);
        let settings = Settings::decode(&mut &raw[..]).ok();
        Some((typ, recv, settings))
    }

    /// One step: a new stream accepted or one classified. Cancel-safe (the
    /// classification runs in its own task).
    async fn step(&mut self) -> Result<(), AcceptError> {
        tokio::select! {
            r = self.conn.accept_uni() => {
                let recv = r?;
                self.accepted += 1;
                if self.accepted > MAX_AUX_UNI {
                    let mut recv = recv;
                    recv.stop(code::EXCESSIVE_LOAD.into()).ok();
                    return Ok(());
                }
                self.classify.spawn(Self::classify(recv));
            }
            Some(r) = self.classify.join_next() => {
                let Ok(Some((typ, mut recv, settings))) = r else { return Ok(()) };
                match typ {
                    stream::CONTROL => {
                        let Some(settings) = settings else {
                            return Err(AcceptError::Protocol("control stream without SETTINGS".into()));
                        };
                        if self.control.is_some() {
                            return Err(AcceptError::Protocol("second control stream".into()));
                        }
                        self.control = Some((recv, settings));
                    }
                    stream::QPACK_ENCODER | stream::QPACK_DECODER => self.held.push(recv),
                    _ => {
                        recv.stop(code::STREAM_CREATION_ERROR.into()).ok();
                    }
                }
            }
        }
        Ok(())
    }

    /// Keeps the streams open (closing a critical stream is a connection
    /// error for the peer) and drains them until the connection ends.
    fn hold_until_closed(mut self, accept_more: bool) {
        tokio::spawn(async move {
            let conn = self.conn.clone();
            let mut drains = JoinSet::new();
            let drain = |mut r: quinn::RecvStream| async move {
                let mut buf = [0u8; 1024];
                while let Ok(Some(_)) = r.read(&mut buf).await {}
            };
            if let Some((r, _)) = self.control.take() {
                drains.spawn(drain(r));
            }
            for r in self.held.drain(..) {
                drains.spawn(drain(r));
            }
            loop {
                if accept_more {
                    tokio::select! {
                        _ = conn.closed() => break,
                        r = self.step() => if let Err(e) = r {
                            // A second control stream, or one without
                            // SETTINGS: a connection error (RFC 9114 §6.2.1).
                            if let AcceptError::Protocol(why) = &e {
                                let c = if why.contains("SETTINGS") {
                                    code::MISSING_SETTINGS
                                } else {
                                    code::STREAM_CREATION_ERROR
                                };
                                conn.close(c.into(), why.as_bytes());
                            }
                            break;
                        },
                    }
                } else {
                    tokio::select! {
                        _ = conn.closed() => break,
                        Some(r) = self.classify.join_next() => {
                            if let Ok(Some((_, r, _))) = r {
                                drains.spawn(drain(r));
                            }
                        }
                    }
                }
                if let Some((r, _)) = self.control.take() {
                    drains.spawn(drain(r));
                }
                for r in self.held.drain(..) {
                    drains.spawn(drain(r));
                }
            }
        });
    }
}

/// New request streams: accepted, then their HEADERS read in a task each so
/// a slow stream delays no other.
struct RequestStreams {
    conn: quinn::Connection,
    heads: JoinSet<Option<Head>>,
    /// On a WebTransport connection the session accepts every stream and
    /// forwards the others (plain requests) here, frame type read.
    forwarded: Option<futures::channel::mpsc::UnboundedReceiver<OtherBi>>,
}

impl RequestStreams {
    async fn next(&mut self) -> Result<Head, quinn::ConnectionError> {
        use futures::StreamExt;
        loop {
            if let Some(rx) = self.forwarded.as_mut() {
                tokio::select! {
                    r = rx.next() => match r {
                        Some((typ, send, recv)) => {
                            self.heads.spawn(read_head(self.conn.clone(), send, recv, Some(typ)));
                        }
                        // The session is gone; what is being read still counts.
                        None => match self.heads.join_next().await {
                            Some(Ok(Some(head))) => return Ok(head),
                            Some(_) => {}
                            None => return Err(quinn::ConnectionError::LocallyClosed),
                        },
                    },
                    Some(r) = self.heads.join_next() => {
                        if let Ok(Some(head)) = r {
                            return Ok(head);
                        }
                    }
                }
                continue;
            }
            tokio::select! {
                r = self.conn.accept_bi() => {
                    let (send, recv) = r?;
                    self.heads.spawn(read_head(self.conn.clone(), send, recv, None));
                }
                Some(r) = self.heads.join_next() => {
                    if let Ok(Some(head)) = r {
                        return Ok(head);
                    }
                }
            }
        }
    }
}

/// Does the HTTP/3 handshake of a new `h3` connection and reads its first
/// request (see the module docs). On error the connection has been closed.
pub async fn accept(
    conn: quinn::Connection,
    handshake: Handshake,
) -> Result<Incoming, AcceptError> {
    let res = accept_inner(conn.clone(), handshake).await;
    if let Err(e) = &res {
        let c = match e {
            AcceptError::Timeout(_) => code::MISSING_SETTINGS,
            AcceptError::Protocol(why) if why.contains("SETTINGS") => code::MISSING_SETTINGS,
            AcceptError::Protocol(why) if why.contains("second control") => {
                code::STREAM_CREATION_ERROR
            }
            _ => code::GENERAL_PROTOCOL_ERROR,
        };
        conn.close(c.into(), e.to_string().as_bytes());
    }
    res
}

async fn accept_inner(
    conn: quinn::Connection,
    handshake: Handshake,
) -> Result<Incoming, AcceptError> {
    // Our control stream: SETTINGS with extended CONNECT, datagrams and
    // WebTransport on; QPACK dynamic table left at capacity 0.
    let mut control = conn.open_uni().await?;
    let mut settings = Settings::default();
    settings.enable_webtransport(1);
    let mut buf = BytesMut::new();
    settings.encode(&mut buf);
    control
        .write_all(&buf)
        .await
        .map_err(|e| AcceptError::Protocol(format!("control stream: {e}")))?;

    let mut uni = UniStreams::new(conn.clone());
    let mut requests = RequestStreams {
        conn: conn.clone(),
        heads: JoinSet::new(),
        forwarded: None,
    };
    let first = loop {
        tokio::select! {
            r = requests.next() => break r?,
            r = uni.step() => r?,
        }
    };

    if !first.head.is_webtransport() {
        // Uni streams go on being accepted (and drained) in the background.
        uni.hold_until_closed(true);
        return Ok(Incoming::Http(HttpConnection {
            conn,
            handshake,
            requests,
            first: Some(first),
            _control: Some(control),
        }));
    }

    // WebTransport: the client's SETTINGS must have arrived and allow it;
    // the session starts only after the handshake (no MoQT in 0-RTT).
    let found = tokio::time::timeout(HEAD_TIMEOUT, async {
        while uni.control.is_none() {
            uni.step().await?;
        }
        Ok::<_, AcceptError>(())
    })
    .await;
    match found {
        Ok(r) => r?,
        Err(_) => return Err(AcceptError::Timeout("no control stream after CONNECT")),
    }
    if !handshake.wait().await {
        return Err(AcceptError::Protocol("handshake did not complete".into()));
    }
    let (peer_control, peer_settings) = uni.control.take().expect("found above");
    let Head {
        frame, send, recv, ..
    } = first;
    if peer_settings.supports_webtransport() == 0 {
        refuse(send, recv, code::REQUEST_REJECTED);
        return Err(AcceptError::Protocol(
            "CONNECT without WebTransport in SETTINGS".into(),
        ));
    }
    let request = ConnectRequest::decode(&mut &frame[..])
        .map_err(|e| AcceptError::Protocol(format!("CONNECT: {e}")))?;
    // The QPACK streams must stay open; web-transport-quinn accepts the rest.
    uni.hold_until_closed(false);
    // Plain requests on this connection: those already being read, and
    // those the session will forward (see `Incoming::WebTransport`).
    let (forward, rx) = futures::channel::mpsc::unbounded();
    requests.forwarded = Some(rx);
    let http = HttpConnection {
        conn: conn.clone(),
        handshake,
        requests,
        first: None,
        _control: None,
    };
    Ok(Incoming::WebTransport {
        request: web_transport_quinn::Request::from_parts(
            conn,
            (control, peer_control),
            request,
            send,
            recv,
        ),
        http: Box::new(http),
        forward,
    })
}

/// An HTTP/3 connection serving plain requests.
pub struct HttpConnection {
    conn: quinn::Connection,
    handshake: Handshake,
    requests: RequestStreams,
    first: Option<Head>,
    // Closing our control stream is a connection error for the peer (on a
    // WebTransport connection the session holds it).
    _control: Option<quinn::SendStream>,
}

impl HttpConnection {
    /// The next request; `None` once the connection has ended.
    pub async fn next(&mut self) -> Option<Request> {
        let head = match self.first.take() {
            Some(h) => h,
            None => self.requests.next().await.ok()?,
        };
        Some(Request {
            head: head.head,
            early: head.early,
            send: head.send,
            recv: head.recv,
            buf: BytesMut::new(),
        })
    }

    /// The QUIC connection.
    pub fn conn(&self) -> &quinn::Connection {
        &self.conn
    }

    /// The TLS handshake's progress (requests may arrive in 0-RTT data).
    pub fn handshake(&self) -> &Handshake {
        &self.handshake
    }
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Larger than the limit given to [`Request::body`].
    #[error("request body over {0} bytes")]
    TooLarge(usize),
    /// Not valid HTTP/3 framing.
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// The stream was reset or ended mid-frame, or the connection failed.
    #[error("request stream: {0}")]
    Stream(String),
}

/// One HTTP/3 request: its head, then its body and the response stream.
pub struct Request {
    /// Method, path, authority and header fields.
    pub head: RequestHead,
    /// Whether its HEADERS arrived before the TLS handshake completed (0-RTT
    /// data, which an attacker could replay).
    pub early: bool,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    buf: BytesMut,
}

impl Request {
    /// Reads the whole body (DATA frames up to the end of the stream); fails
    /// with [`BodyError::TooLarge`] as soon as it would exceed `limit`, without
    /// reading the rest.
    pub async fn body(&mut self, limit: usize) -> Result<Bytes, BodyError> {
        match tokio::time::timeout(BODY_TIMEOUT, self.read_body(limit)).await {
            Ok(r) => r,
            Err(_) => Err(BodyError::Stream("request body timed out".into())),
        }
    }

    async fn read_body(&mut self, limit: usize) -> Result<Bytes, BodyError> {
        // The body is copied into one buffer: payloads split off the read
        // buffer would each pin a whole read chunk.
        let mut body = BytesMut::new();
        // Everything read, framing and skipped frames included, is bounded,
        // so a stream of empty or unknown frames cannot run on for free.
        let budget = limit as u64 + codec::MAX_OTHER_FRAME;
        let mut read = 0u64;
        loop {
            loop {
                let allowed = (limit - body.len()) as u64;
                let limits = |t| {
                    if t == frame::DATA {
                        allowed
                    } else {
                        codec::request_limits(0)(t)
                    }
                };
                match codec::next_frame(&mut self.buf, limits) {
                    Ok(Some((typ, payload))) => {
                        codec::check_request_frame(typ)?;
                        // Trailers, reserved and unknown frames carry nothing we use.
                        if typ == frame::DATA {
                            body.extend_from_slice(&payload);
                        }
                    }
                    Ok(None) => break,
                    Err(FrameError::TooLarge { typ, .. }) if typ == frame::DATA => {
                        return Err(BodyError::TooLarge(limit))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            match self.recv.read_chunk(64 * 1024, true).await {
                Ok(Some(chunk)) => {
                    read += chunk.bytes.len() as u64;
                    if read > budget {
                        return Err(BodyError::TooLarge(limit));
                    }
                    self.buf.extend_from_slice(&chunk.bytes);
                }
                Ok(None) if self.buf.is_empty() => break,
                Ok(None) => return Err(BodyError::Stream("ended inside a frame".into())),
                Err(e) => return Err(BodyError::Stream(e.to_string())),
            }
        }
        Ok(body.freeze())
    }

    /// Turns the request into its response stream. Whatever of the body was
    /// not read is refused (STOP_SENDING with H3_NO_ERROR, RFC 9114 §4.1).
    pub fn respond(mut self, body_read: bool) -> Responder {
        if !body_read {
            self.recv.stop(code::NO_ERROR.into()).ok();
        }
        Responder {
            send: self.send,
            _recv: self.recv,
        }
    }

    /// Resets the request's streams with an HTTP/3 error code.
    pub fn reset(self, c: u32) {
        refuse(self.send, self.recv, c);
    }
}

/// A response being written on a request stream.
pub struct Responder {
    send: quinn::SendStream,
    _recv: quinn::RecvStream,
}

impl Responder {
    /// Sends the response head.
    pub async fn head(&mut self, status: StatusCode, headers: &HeaderMap) -> Result<(), BodyError> {
        let mut b = BytesMut::new();
        codec::encode_response_head(status, headers, &mut b)?;
        self.send
            .write_all(&b)
            .await
            .map_err(|e| BodyError::Stream(e.to_string()))
    }

    /// Sends one DATA frame; the payload is written from its own buffer.
    pub async fn data(&mut self, payload: Bytes) -> Result<(), BodyError> {
        if payload.is_empty() {
            return Ok(());
        }
        let mut chunks = [codec::data_header(payload.len()), payload];
        self.send
            .write_all_chunks(&mut chunks)
            .await
            .map_err(|e| BodyError::Stream(e.to_string()))
    }

    /// Resolves when the client stops reading the response (STOP_SENDING,
    /// or the connection ends).
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let f = self.send.stopped();
        async move {
            f.await.ok();
        }
    }

    /// Ends the response.
    pub fn finish(mut self) {
        self.send.finish().ok();
    }

    /// Aborts the response with an HTTP/3 error code.
    pub fn reset(mut self, c: u32) {
        self.send.reset(c.into()).ok();
    }
}
