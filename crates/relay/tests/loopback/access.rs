//! The relay's authorisation hooks over real QUIC on loopback: a refused
//! request gets REQUEST_ERROR UNAUTHORIZED and nothing else changes, a refused
//! SETUP closes the session with the authorizer's code, an access that expires
//! closes its session with EXPIRED_AUTH_TOKEN, and the authorizer sees the
//! path, query and address a session came with.

use quichub_testkit::bare as common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use moqt::error::request_error;
use moqt::message::{Message, NamespaceRequest, RequestUpdate};
use moqt::session::SessionError;
use moqt::{FullTrackName, Parameters, SessionErrorCode, TrackNamespace};
use quichub_client::ClientSession;
use quichub_net::io::{write_message, MessageReader};
use quichub_relay::access::{Authorizer, ConnectInfo, Denied, Operation, SessionAccess};
use quichub_relay::core::Refusal;

use common::{close_code, error_code, namespace_request, within, TestRelay};

/// Refuses every request naming the `secret` namespace (or one under it) and
/// every session whose path contains `deny`; records what it was told at SETUP.
#[derive(Default)]
struct TestAuthorizer {
    /// How long a session's access lasts (`None`: for ever).
    lifetime: Option<Duration>,
    seen: Mutex<Vec<ConnectInfo>>,
}

struct TestAccess {
    expires: Option<SystemTime>,
}

impl SessionAccess for TestAccess {
    fn authorize(&self, op: &Operation<'_>) -> Result<(), Denied> {
        if op
            .namespace()
            .has_prefix(&TrackNamespace::from_path("secret"))
        {
            return Err(Refusal::new(request_error::UNAUTHORIZED, "not yours").into());
        }
        Ok(())
    }

    fn expires(&self) -> Option<SystemTime> {
        self.expires
    }
}

impl Authorizer for TestAuthorizer {
    fn connect(&self, info: &ConnectInfo) -> Result<Arc<dyn SessionAccess>, SessionError> {
        self.seen.lock().unwrap().push(info.clone());
        if info.path.as_deref().is_some_and(|p| p.contains("deny")) {
            return Err(SessionError {
                code: SessionErrorCode::Unauthorized,
                reason: "no entry".into(),
            });
        }
        Ok(Arc::new(TestAccess {
            expires: self.lifetime.map(|d| SystemTime::now() + d),
        }))
    }
}

struct Harness {
    relay: TestRelay,
    authorizer: Arc<TestAuthorizer>,
}

impl Harness {
    fn start(authorizer: TestAuthorizer) -> Self {
        let authorizer = Arc::new(authorizer);
        Self {
            relay: TestRelay::start(authorizer.clone()),
            authorizer,
        }
    }

    async fn client(&self, scheme: &str, path: &str) -> anyhow::Result<ClientSession> {
        self.relay.client(scheme, path).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_gets_unauthorized_and_nothing_else_changes() {
    let h = Harness::start(TestAuthorizer::default());
    within(async {
        let a = h.client("moqt", "/moq").await.unwrap();
        let b = h.client("https", "/moq").await.unwrap();

        // Refused: every kind of request naming the secret namespace.
        let r = namespace_request(&a, "secret/room", Message::PublishNamespace, vec![]).await;
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
        let r = namespace_request(&b, "secret", Message::SubscribeNamespace, vec![]).await;
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
        let r = namespace_request(&b, "secret", Message::SubscribeTracks, vec![]).await;
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
        let (r, ..) = b
            .subscribe_raw(FullTrackName::new("secret", "t"), Parameters::default())
            .await
            .unwrap();
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
        let e = b
            .track_status(FullTrackName::new("secret/x", "t"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not yours"), "{e}");

        // Allowed, on the same sessions, after the refusals: served as before.
        let _ns = a
            .publish_namespace(TrackNamespace::from_path("open"))
            .await
            .unwrap();
        let r = namespace_request(&b, "open", Message::SubscribeNamespace, vec![]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        // Namespaces match by field, not by bytes: `secretary` is open.
        let r = namespace_request(&b, "secretary", Message::SubscribeTracks, vec![]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        // Reaches its handler: nobody publishes this track.
        let (r, ..) = b
            .subscribe_raw(FullTrackName::new("nobody", "t"), Parameters::default())
            .await
            .unwrap();
        assert_eq!(error_code(&r), Some(request_error::DOES_NOT_EXIST), "{r:?}");

        // Moving a SUBSCRIBE_NAMESPACE onto a refused prefix ends it.
        let (mut send, recv) = b.session().open_bi().await.unwrap();
        // (A prefix of its own: `open` is held by the earlier request.)
        let m = Message::SubscribeNamespace(NamespaceRequest {
            request_id: b.next_request_id(),
            namespace: TrackNamespace::from_path("elsewhere"),
            params: Parameters::default(),
        });
        write_message(&mut send, &m).await.unwrap();
        let mut reader = MessageReader::new(recv, &[]);
        let r = reader.next().await.unwrap();
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        let update = Message::RequestUpdate(RequestUpdate {
            request_id: b.next_request_id(),
            params: Parameters {
                track_namespace_prefix: Some(TrackNamespace::from_path("secret")),
                ..Default::default()
            },
        });
        write_message(&mut send, &update).await.unwrap();
        let r = loop {
            match reader.next().await.unwrap() {
                // The open namespace `a` published may be announced first.
                Message::Namespace(_) => continue,
                other => break other,
            }
        };
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");

        // A third session is unaffected too.
        let c = h.client("moqt", "/moq").await.unwrap();
        let r = namespace_request(&c, "open", Message::SubscribeNamespace, vec![]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        assert!(a.session().close_reason().is_none());
        assert!(b.session().close_reason().is_none());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorizer_sees_path_query_and_address() {
    let h = Harness::start(TestAuthorizer::default());
    within(async {
        for (scheme, path) in [("https", "/moq?jwt=abc"), ("moqt", "/moq?jwt=def")] {
            let c = h.client(scheme, path).await.unwrap();
            // Answered only after the relay handled the SETUP.
            let r = namespace_request(&c, "open", Message::SubscribeNamespace, vec![]).await;
            assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        }
    })
    .await;
    let seen = h.authorizer.seen.lock().unwrap().clone();
    let paths: Vec<_> = seen.iter().map(|i| i.path.clone()).collect();
    assert_eq!(
        paths,
        [
            Some("/moq?jwt=abc".to_string()),
            Some("/moq?jwt=def".into())
        ]
    );
    assert!(seen
        .iter()
        .all(|i| i.remote.ip().is_loopback() && i.setup_token.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_setup_closes_the_session_with_the_authorizers_code() {
    let h = Harness::start(TestAuthorizer::default());
    within(async {
        for scheme in ["moqt", "https"] {
            // The relay's SETUP may reach the client before the refusal does,
            // so the connect itself may succeed or fail.
            if let Ok(c) = h.client(scheme, "/deny").await {
                let e = c.closed().await;
                assert_eq!(
                    close_code(&e),
                    Some(SessionErrorCode::Unauthorized.code().into()),
                    "{scheme}: {e}"
                );
            }
        }
        // Others still get in.
        let ok = h.client("moqt", "/moq").await.unwrap();
        let r = namespace_request(&ok, "open", Message::SubscribeNamespace, vec![]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
    })
    .await;
    assert_eq!(h.authorizer.seen.lock().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_access_closes_its_session() {
    let h = Harness::start(TestAuthorizer {
        lifetime: Some(Duration::from_millis(200)),
        ..Default::default()
    });
    within(async {
        for scheme in ["moqt", "https"] {
            let c = h.client(scheme, "/moq").await.unwrap();
            // Mid-session: a request is open when the access expires (its
            // reply is not awaited: the access may already have expired).
            let (mut send, _recv) = c.session().open_bi().await.unwrap();
            let m = Message::SubscribeNamespace(NamespaceRequest {
                request_id: c.next_request_id(),
                namespace: TrackNamespace::from_path("open"),
                params: Parameters::default(),
            });
            let _ = write_message(&mut send, &m).await;
            let e = c.closed().await;
            assert_eq!(
                close_code(&e),
                Some(SessionErrorCode::ExpiredAuthToken.code().into()),
                "{scheme}: {e}"
            );
        }
    })
    .await;
}
