//! A minimal HTTP/3 client: one request per bidirectional stream, whole
//! responses. For the lab's 0-RTT measurements and tests; browsers, curl and
//! aioquic are the real clients.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method};
use web_transport_quinn::proto::qpack::Headers;
use web_transport_quinn::proto::Settings;

use super::codec::{self, frame};

/// A response read to its end.
#[derive(Debug, Clone)]
pub struct Response {
    /// `:status`.
    pub status: u16,
    /// Header fields (one value per name).
    pub headers: HashMap<String, String>,
    /// The body (all DATA frames).
    pub body: Bytes,
}

/// An HTTP/3 client on a QUIC connection with ALPN `h3`.
pub struct Client {
    conn: quinn::Connection,
    _control: Option<quinn::SendStream>,
}

impl Client {
    /// Opens our control stream (SETTINGS) on `conn`. Works before the
    /// handshake completes: on a 0-RTT connection, requests go as early data.
    pub async fn new(conn: quinn::Connection) -> anyhow::Result<Self> {
        let mut control = conn.open_uni().await?;
        let mut buf = BytesMut::new();
        Settings::default().encode(&mut buf);
        control.write_all(&buf).await?;
        Ok(Self {
            conn,
            _control: Some(control),
        })
    }

    /// For a connection that already has our control stream (a
    /// WebTransport client session on it): requests only.
    pub fn without_control(conn: quinn::Connection) -> Self {
        Self {
            conn,
            _control: None,
        }
    }

    /// Sends one request (HEADERS, and the body as one DATA frame unless
    /// empty) and reads the response, at most `max_body` bytes of body.
    pub async fn request(
        &self,
        method: &Method,
        authority: &str,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
        max_body: usize,
    ) -> anyhow::Result<Response> {
        let (mut send, mut recv) = self.conn.open_bi().await?;
        let mut head = BytesMut::new();
        codec::encode_request_head(method, authority, path, headers, &mut head)?;
        let mut chunks = vec![head.freeze()];
        if !body.is_empty() {
            chunks.push(codec::data_header(body.len()));
            chunks.push(body);
        }
        send.write_all_chunks(&mut chunks).await?;
        send.finish()?;
        let mut buf = BytesMut::new();
        let mut status = None;
        let mut fields = HashMap::new();
        let mut out = BytesMut::new();
        loop {
            while let Some((typ, payload)) =
                codec::next_frame(&mut buf, codec::request_limits(max_body as u64))?
            {
                match typ {
                    frame::HEADERS if status.is_none() => {
                        let h = Headers::decode(&mut &payload[..])
                            .map_err(|e| anyhow::anyhow!("response head: {e}"))?;
                        status = h.get(":status").and_then(|s| s.parse::<u16>().ok());
                        anyhow::ensure!(status.is_some(), "response without :status");
                        fields = h
                            .fields
                            .into_iter()
                            .filter(|(k, _)| !k.starts_with(':'))
                            .collect();
                    }
                    frame::DATA => {
                        anyhow::ensure!(out.len() + payload.len() <= max_body, "body too large");
                        out.extend_from_slice(&payload);
                    }
                    _ => {}
                }
            }
            match recv.read_chunk(64 * 1024, true).await? {
                Some(c) => buf.extend_from_slice(&c.bytes),
                None => break,
            }
        }
        anyhow::ensure!(buf.is_empty(), "response ended inside a frame");
        Ok(Response {
            status: status.ok_or_else(|| anyhow::anyhow!("no response head"))?,
            headers: fields,
            body: out.freeze(),
        })
    }
}
