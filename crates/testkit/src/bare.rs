//! The routing core alone on loopback (no hub, no broker), for the relay's
//! own tests: a relay on an ephemeral port with an authorizer, clients
//! pinned to its certificate, raw namespace requests and the codes of
//! replies and closes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use moqt::message::{Message, NamespaceRequest};
use moqt::{Parameters, TrackNamespace};
use quichub_client::{ClientSession, ConnectOptions, Verify};
use quichub_net::io::{write_message, MessageReader};
use quichub_net::server::Server;
use quichub_net::tls::Identity;
use quichub_relay::access::Authorizer;
use quichub_relay::{Config, Relay};

/// A relay serving on 127.0.0.1 with `authorizer`.
pub struct TestRelay {
    /// The bound UDP address.
    pub addr: std::net::SocketAddr,
    /// The relay behind it.
    pub relay: Arc<quichub_relay::Relay>,
    fingerprint: Vec<u8>,
}

impl TestRelay {
    /// Binds and starts accepting.
    pub fn start(authorizer: Arc<dyn Authorizer>) -> Self {
        let id = Identity::self_signed(&["localhost"]).unwrap();
        let server = Arc::new(Server::bind("127.0.0.1:0".parse().unwrap(), &id).unwrap());
        let relay = Relay::with_authorizer(Config::default(), authorizer);
        let addr = server.local_addr().unwrap();
        tokio::spawn(quichub_relay::endpoint::accept_loop(relay.clone(), server));
        Self {
            addr,
            relay,
            fingerprint: id.fingerprint().to_vec(),
        }
    }

    /// A session over `scheme` (`moqt` or `https`) to `path` (with its query).
    pub async fn client(&self, scheme: &str, path: &str) -> anyhow::Result<ClientSession> {
        let opts = ConnectOptions {
            verify: Verify::Fingerprints(vec![self.fingerprint.clone()]),
            bind: "127.0.0.1:0".parse().unwrap(),
            timeout: Duration::from_secs(5),
            endpoint: None,
            draft: None,
        };
        let url = format!("{scheme}://127.0.0.1:{}{path}", self.addr.port());
        ClientSession::connect(&url, opts).await
    }
}

/// `f`, or a panic after 15 s.
pub async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), f)
        .await
        .expect("test step timed out")
}

/// The first reply to a namespace-level request (`make`) on `ns` carrying
/// `tokens`. The request stays open for the rest of the test (a
/// SUBSCRIBE_NAMESPACE lasts as long as its stream).
pub async fn namespace_request(
    c: &ClientSession,
    ns: &str,
    make: fn(NamespaceRequest) -> Message,
    tokens: Vec<Bytes>,
) -> Message {
    let (mut send, recv) = c.session().open_bi().await.unwrap();
    let m = make(NamespaceRequest {
        request_id: c.next_request_id(),
        namespace: TrackNamespace::from_path(ns),
        params: Parameters {
            authorization_tokens: tokens,
            ..Default::default()
        },
    });
    write_message(&mut send, &m).await.unwrap();
    let reply = MessageReader::new(recv, &[]).next().await.unwrap();
    std::mem::forget(send);
    reply
}

/// A REQUEST_ERROR's code.
pub fn error_code(m: &Message) -> Option<u64> {
    match m {
        Message::RequestError(e) => Some(e.code),
        _ => None,
    }
}

pub use crate::close_code;
