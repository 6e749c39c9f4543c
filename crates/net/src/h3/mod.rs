//! HTTP/3 on ALPN `h3`: WebTransport sessions *and* plain HTTP/3 requests on
//! the relay's UDP port.
//!
//! [`accept`] does the HTTP/3 handshake (SETTINGS both ways, with WebTransport
//! and extended CONNECT enabled) and reads the connection's first request:
//!
//! - a WebTransport CONNECT (`:protocol = webtransport`) makes the connection
//!   a WebTransport one: it is handed to web-transport-quinn as a
//!   [`web_transport_quinn::Request`] (through the vendored
//!   `Request::from_parts`, see `vendor/PATCHES.md`), once the TLS handshake
//!   has completed;
//! - any other request makes it an HTTP connection ([`HttpConnection`]) whose
//!   requests ([`Request`]) the caller answers (quichub's HTTP pub/sub API).
//!
//! The first request decides: web-transport-quinn owns every stream of a
//! connection once a session starts, and forwards the plain requests it
//! finds (`Session::forward_other_bi`, a vendored patch) to the
//! [`HttpConnection`] that comes with [`Incoming::WebTransport`]. A CONNECT
//! on an HTTP connection is answered 400 by the API (browsers open a
//! dedicated connection for WebTransport anyway).
//!
//! 0-RTT: connections are handed over before the TLS handshake completes
//! ([`Handshake`]); requests read from 0-RTT data say so ([`Request::early`])
//! and the caller decides what may run before the handshake completes
//! (`docs/zero-rtt.md`). WebTransport sessions always wait for it.

pub mod client;
pub mod codec;
mod conn;

pub use conn::{
    accept, AcceptError, BodyError, Handshake, HttpConnection, Incoming, Request, Responder,
};
