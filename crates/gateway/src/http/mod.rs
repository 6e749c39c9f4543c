//! The HTTP pub/sub API (the Drift routes of *A Pure HTTP/3 Alternative to
//! MQTT-over-QUIC in Resource-Constrained IoT*, Table III), on the same
//! broker as MQTT and the same tracks as MoQT.
//!
//! | route                 | method   | does                                                    |
//! |-----------------------|----------|---------------------------------------------------------|
//! | `/v1/t/{topic}`       | `PUT`    | creates the topic: 201, or 200 when it exists           |
//! | `/v1/t/{topic}`       | `HEAD`   | 200 when the topic exists, else 404                     |
//! | `/v1/t/{topic}`       | `DELETE` | removes it and ends its subscribers' streams: 204 / 404 |
//! | `/v1/t/{topic}`       | `POST`   | publishes the body as one message: 204 once accepted   |
//! | `/v1/t/{topic}`       | `GET`    | subscribes: a `text/event-stream` (Server-Sent Events)  |
//! | `/v1/time`            | `GET`    | the server's clock, `{"unix_ms": N}`                    |
//!
//! The API is split in two:
//!
//! - [`api`]: the transport-independent core. [`Api::handle`] maps an
//!   `http::Request<Bytes>` (the whole request body) to an
//!   `http::Response<`[`ApiBody`]`>`, whose body is either complete or a
//!   stream of chunks (Server-Sent Events, see [`sse`]). It knows the topic
//!   registry, the limits and the broker, nothing of sockets.
//! - [`tcp`]: HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on one TCP
//!   port with hyper.
//! - [`h3`]: HTTP/3 on the relay's UDP port (ALPN `h3`, beside WebTransport;
//!   `quichub_net::h3` does the framing), with 0-RTT.
//!
//! - [`web`]: the dashboard (`/`) and the player (`/watch/{broadcast}`)
//!   pages, when [`Api::serve_web`] enables them.
//! - [`websocket`]: MoQT sessions over a WebSocket upgrade on the same
//!   port, when [`Api::serve_websocket`] enables them.
//! - [`origin`]: which web pages may use all of the above (`Origin`,
//!   `Host` and CORS), on every transport.
//! - [`rate`]: publishes per client address.
//!
//! The wire contract (routes, status codes, headers, framing) is documented
//! in `docs/http-api.md`.

pub mod api;
pub mod auth;
pub mod h3;
pub mod origin;
pub mod rate;
pub mod route;
pub mod sse;
pub mod tcp;
pub mod web;
pub mod websocket;

pub use api::{Api, ApiBody, ApiConfig};
