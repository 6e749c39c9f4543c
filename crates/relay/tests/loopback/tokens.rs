//! The relay with quichub-auth's JWTs over real QUIC on loopback: tokens in
//! the URL query and in AUTHORIZATION TOKEN parameters (by value and by
//! alias), anonymous public prefixes, refused and expiring tokens, and reloads
//! that revoke credentials or grants of sessions already up.

use quichub_testkit::bare as common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use moqt::error::request_error;
use moqt::message::{Message, NamespaceRequest};
use moqt::token::Token;
use moqt::{FullTrackName, Parameters, SessionErrorCode, TrackNamespace};
use quichub_auth::jwt::{Claims, Key};
use quichub_auth::{Auth, AuthConfig, SharedAuth};
use quichub_client::ClientSession;
use quichub_net::io::write_message;
use quichub_relay::tokens::TokenAuthorizer;

use common::{close_code, error_code, namespace_request, within, TestRelay};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test-secret";

struct Harness {
    relay: TestRelay,
    key: Key,
    auth: Arc<SharedAuth>,
    _dir: TempDir,
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Harness {
    fn start(public: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "quichub-relay-tokens-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let key_file = dir.join("hs256.secret");
        std::fs::write(&key_file, SECRET).unwrap();
        let cfg = AuthConfig {
            key: Some(key_file),
            public: public.iter().map(|s| s.to_string()).collect(),
            // Tokens here expire when the tests say, not a minute later.
            leeway_s: 0,
            ..AuthConfig::default()
        };
        let auth = SharedAuth::new(Auth::load(&cfg).unwrap());
        let relay = TestRelay::start(TokenAuthorizer::for_cluster(
            auth.clone(),
            4096,
            &cluster_token(&Key::from_secret(SECRET).unwrap()),
        ));
        Self {
            relay,
            key: Key::from_secret(SECRET).unwrap(),
            auth,
            _dir: TempDir(dir),
        }
    }

    fn token(&self, root: &str, put: &[&str], get: &[&str], ttl: Duration) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let claims = Claims {
            root: root.into(),
            put: put.iter().map(|s| s.to_string()).collect(),
            get: get.iter().map(|s| s.to_string()).collect(),
            iat: Some(now.as_secs()),
            exp: Some((now + ttl).as_secs()),
            ..Claims::default()
        };
        self.key.sign(&claims, None).unwrap()
    }

    async fn client(&self, scheme: &str, path: &str) -> anyhow::Result<ClientSession> {
        self.relay.client(scheme, path).await
    }
}

/// A token of `sub` that reads and writes everything for an hour.
fn broad_token(key: &Key, sub: &str) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let claims = Claims {
        sub: Some(sub.into()),
        put: vec!["".into()],
        get: vec!["".into()],
        exp: Some(now.as_secs() + 3600),
        ..Claims::default()
    };
    key.sign(&claims, None).unwrap()
}

/// The token the harness's relay knows as its cluster's (`cluster.token`).
fn cluster_token(key: &Key) -> String {
    broad_token(key, "cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_token_grants_its_paths_and_nothing_else() {
    let h = Harness::start(&[]);
    let t = h.token("demo", &["alice"], &[""], Duration::from_secs(600));
    within(async {
        for scheme in ["moqt", "https"] {
            let c = h.client(scheme, &format!("/?jwt={t}")).await.unwrap();
            let ok = namespace_request(&c, "demo/alice", Message::PublishNamespace, vec![]).await;
            assert!(matches!(ok, Message::RequestOk(_)), "{scheme}: {ok:?}");
            // Path boundaries: `alicex` is not under `alice`.
            for ns in ["demo/bob", "demo/alicex", "other"] {
                let r = namespace_request(&c, ns, Message::PublishNamespace, vec![]).await;
                assert_eq!(
                    error_code(&r),
                    Some(request_error::UNAUTHORIZED),
                    "{ns}: {r:?}"
                );
            }
            // `get: ""` reads everything under the root, and only there.
            let r = namespace_request(&c, "demo", Message::SubscribeNamespace, vec![]).await;
            assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
            let (r, ..) = c
                .subscribe_raw(FullTrackName::new("demo/bob", "v"), Parameters::default())
                .await
                .unwrap();
            assert_eq!(error_code(&r), Some(request_error::DOES_NOT_EXIST), "{r:?}");
            let (r, ..) = c
                .subscribe_raw(FullTrackName::new("other", "v"), Parameters::default())
                .await
                .unwrap();
            assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
            let r = namespace_request(&c, "", Message::SubscribeTracks, vec![]).await;
            assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
            assert!(c.session().close_reason().is_none());
        }
    })
    .await;
    assert!(h.auth.metrics.get("moqt", true, "jwt") >= 2);
    assert!(h.auth.metrics.get("moqt", false, "not_authorized") >= 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_sessions_get_the_public_prefixes() {
    let h = Harness::start(&["anon"]);
    within(async {
        let c = h.client("moqt", "/").await.unwrap();
        let r = namespace_request(&c, "anon/cam", Message::PublishNamespace, vec![]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        let r = namespace_request(&c, "anon", Message::SubscribeNamespace, vec![]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        let r = namespace_request(&c, "demo", Message::SubscribeNamespace, vec![]).await;
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_tokens_by_value_and_by_alias() {
    let h = Harness::start(&[]);
    let t = Bytes::from(h.token("demo", &["bob"], &[], Duration::from_secs(600)));
    within(async {
        // No session token: nothing allowed until a request brings one.
        let c = h.client("moqt", "/").await.unwrap();
        let r = namespace_request(&c, "demo/bob", Message::PublishNamespace, vec![]).await;
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
        let by_value = Token::UseValue {
            kind: 0,
            value: t.clone(),
        }
        .encode();
        let r = namespace_request(&c, "demo/bob", Message::PublishNamespace, vec![by_value]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        // REGISTER then USE_ALIAS on a later request.
        let register = Token::Register {
            alias: 7,
            kind: 0,
            value: t.clone(),
        }
        .encode();
        let r =
            namespace_request(&c, "demo/bob/a", Message::PublishNamespace, vec![register]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        let alias = Token::UseAlias { alias: 7 }.encode();
        let r = namespace_request(
            &c,
            "demo/bob/b",
            Message::PublishNamespace,
            vec![alias.clone()],
        )
        .await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        // The token still grants only its paths.
        let r = namespace_request(&c, "demo/eve", Message::PublishNamespace, vec![alias]).await;
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
        // A garbage token value is MALFORMED_AUTH_TOKEN for that request only.
        let junk = Token::UseValue {
            kind: 0,
            value: Bytes::from_static(b"not-a-jwt"),
        }
        .encode();
        let r = namespace_request(&c, "demo/bob/c", Message::PublishNamespace, vec![junk]).await;
        assert_eq!(
            error_code(&r),
            Some(request_error::MALFORMED_AUTH_TOKEN),
            "{r:?}"
        );
        assert!(c.session().close_reason().is_none());

        // An unknown alias closes the session (UNKNOWN_AUTH_TOKEN_ALIAS).
        let unknown = Token::UseAlias { alias: 99 }.encode();
        let (mut send, _recv) = c.session().open_bi().await.unwrap();
        let m = Message::PublishNamespace(NamespaceRequest {
            request_id: c.next_request_id(),
            namespace: TrackNamespace::from_path("demo/bob/d"),
            params: Parameters {
                authorization_tokens: vec![unknown],
                ..Default::default()
            },
        });
        write_message(&mut send, &m).await.unwrap();
        let e = c.closed().await;
        assert_eq!(
            close_code(&e),
            Some(SessionErrorCode::UnknownAuthTokenAlias.code().into()),
            "{e}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tokens_close_the_session_at_setup() {
    let h = Harness::start(&["anon"]);
    let other = Key::from_secret(b"another-secret-another-secret-another-secret").unwrap();
    let forged = other
        .sign(
            &Claims {
                root: "demo".into(),
                put: vec![String::new()],
                ..Claims::default()
            },
            None,
        )
        .unwrap();
    within(async {
        for (scheme, t) in [("moqt", &forged), ("https", &forged)] {
            if let Ok(c) = h.client(scheme, &format!("/?jwt={t}")).await {
                let e = c.closed().await;
                assert_eq!(
                    close_code(&e),
                    Some(SessionErrorCode::Unauthorized.code().into()),
                    "{scheme}: {e}"
                );
            }
        }
    })
    .await;
    assert!(h.auth.metrics.get("moqt", false, "bad_signature") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_expiring_mid_session_closes_it() {
    let h = Harness::start(&[]);
    // `exp` has one-second resolution: between 1 and 2 s from now.
    let t = h.token("demo", &[""], &[""], Duration::from_secs(2));
    within(async {
        let c = h.client("moqt", &format!("/?jwt={t}")).await.unwrap();
        let r = namespace_request(&c, "demo/x", Message::PublishNamespace, vec![]).await;
        assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        let e = c.closed().await;
        assert_eq!(
            close_code(&e),
            Some(SessionErrorCode::ExpiredAuthToken.code().into()),
            "{e}"
        );
    })
    .await;
}

/// The auth config of a harness with `key` and `public` prefixes, written to
/// its directory.
fn reload(h: &Harness, key: &[u8], public: &[&str]) {
    let key_file = h._dir.0.join("reloaded.secret");
    std::fs::write(&key_file, key).unwrap();
    let cfg = AuthConfig {
        key: Some(key_file),
        public: public.iter().map(|s| s.to_string()).collect(),
        leeway_s: 0,
        ..AuthConfig::default()
    };
    h.auth.reload(&cfg).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_revoking_the_credentials_closes_idle_sessions() {
    let h = Harness::start(&["anon"]);
    let t = h.token("demo", &[""], &[""], Duration::from_secs(600));
    within(async {
        let by_token = h.client("moqt", &format!("/?jwt={t}")).await.unwrap();
        let anonymous = h.client("https", "/").await.unwrap();
        for c in [&by_token, &anonymous] {
            let r = namespace_request(c, "anon", Message::SubscribeNamespace, vec![]).await;
            assert!(matches!(r, Message::RequestOk(_)), "{r:?}");
        }
        // Both sessions now idle. The key changes and the public prefix goes.
        reload(&h, b"another-secret-another-secret-another-secret", &[]);
        for c in [&by_token, &anonymous] {
            let e = c.closed().await;
            assert_eq!(
                close_code(&e),
                Some(SessionErrorCode::Unauthorized.code().into()),
                "{e}"
            );
        }
    })
    .await;
    assert!(h.auth.metrics.get("moqt", false, "bad_signature") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_ends_only_the_subscriptions_it_no_longer_allows() {
    use moqt::error::publish_done;
    use quichub_client::{SubscribeOptions, SubscriptionEvent, TrackMode};

    let h = Harness::start(&["anon", "open"]);
    within(async {
        let publisher = h.client("moqt", "/").await.unwrap();
        let subscriber = h.client("moqt", "/").await.unwrap();
        let revoked_name = FullTrackName::new("anon", "v");
        let kept_name = FullTrackName::new("open", "v");
        let _revoked = publisher
            .create_track(revoked_name.clone(), 1, TrackMode::Push)
            .await
            .unwrap();
        let kept = publisher
            .create_track(kept_name.clone(), 1, TrackMode::Push)
            .await
            .unwrap();
        let mut revoked_sub = subscriber
            .subscribe(revoked_name, SubscribeOptions::default())
            .await
            .unwrap();
        let mut kept_sub = subscriber
            .subscribe(kept_name, SubscribeOptions::default())
            .await
            .unwrap();

        // Anonymous clients keep `open`, lose `anon`: the session stays.
        reload(&h, SECRET, &["open"]);
        let ev = revoked_sub.next().await;
        assert!(
            matches!(
                ev,
                Some(SubscriptionEvent::Done {
                    status: publish_done::UNAUTHORIZED,
                    ..
                })
            ),
            "{ev:?}"
        );
        // The other subscription still delivers.
        let mut w = kept.open_subgroup(0, 0).await.unwrap().expect("subscribed");
        w.write(0, Bytes::from_static(b"still here")).await.unwrap();
        let ev = kept_sub.next().await;
        match ev {
            Some(SubscriptionEvent::Object(o)) => assert_eq!(&o.payload[..], b"still here"),
            other => panic!("{other:?}"),
        }
        assert!(subscriber.session().close_reason().is_none());
        // A new subscription to the revoked track is refused.
        let (r, ..) = subscriber
            .subscribe_raw(FullTrackName::new("anon", "v"), Parameters::default())
            .await
            .unwrap();
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
    })
    .await;
}

/// A subscription admitted only by a token of its own (the session has no
/// right to the track) ends when that token expires: PUBLISH_DONE
/// UNAUTHORIZED, the session staying up for its other requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_ends_when_the_token_that_admitted_it_expires() {
    use moqt::error::publish_done;
    use quichub_client::TrackMode;

    let h = Harness::start(&[]);
    let put = h.token("demo", &[""], &[], Duration::from_secs(600));
    within(async {
        let publisher = h.client("moqt", &format!("/?jwt={put}")).await.unwrap();
        let name = FullTrackName::new("demo/live", "v");
        let _track = publisher
            .create_track(name.clone(), 1, TrackMode::Push)
            .await
            .unwrap();
        let subscriber = h.client("moqt", "/").await.unwrap();
        // Without a token of its own the subscription is refused.
        let (r, ..) = subscriber
            .subscribe_raw(name.clone(), Parameters::default())
            .await
            .unwrap();
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
        // JWT times are whole seconds: this one expires within 1 to 2 s.
        let short = Bytes::from(h.token("demo", &[], &[""], Duration::from_secs(2)));
        let tokens = vec![Token::UseValue {
            kind: 0,
            value: short,
        }
        .encode()];
        let params = Parameters {
            authorization_tokens: tokens,
            ..Default::default()
        };
        let (r, _send, mut reader, _) = subscriber.subscribe_raw(name, params).await.unwrap();
        assert!(matches!(r, Message::SubscribeOk(_)), "{r:?}");
        let done = reader.next().await.unwrap();
        match done {
            Message::PublishDone(d) => {
                assert_eq!(d.status, publish_done::UNAUTHORIZED, "{d:?}")
            }
            other => panic!("{other:?}"),
        }
        assert!(subscriber.session().close_reason().is_none());
        assert!(publisher.session().close_reason().is_none());
        // The session still makes other requests.
        let r = namespace_request(&subscriber, "demo", Message::SubscribeNamespace, vec![]).await;
        assert_eq!(error_code(&r), Some(request_error::UNAUTHORIZED), "{r:?}");
    })
    .await;
}

/// The relays' own namespace (`.quichub/...`, the cluster's MQTT messages)
/// is announced, pushed and served only to a session that proved it is a
/// member (the cluster token, or a token of its `sub`) and says it is a
/// peer: not to a client whose token reads everything, with or without
/// `cluster=peer` in its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_namespace_is_served_only_to_members() {
    use quichub_client::TrackMode;
    use quichub_relay::cluster::{mqtt_namespace, MQTT_TRACK};

    let h = Harness::start(&[]);
    let reserved = FullTrackName {
        namespace: mqtt_namespace("n1"),
        name: MQTT_TRACK.into(),
    };
    let track = std::sync::Arc::new(h.relay.relay.new_track(reserved.clone()));
    h.relay.relay.publish_track(track).unwrap();
    let eve = broad_token(&h.key, "eve");
    let member = broad_token(&h.key, "cluster");
    within(async {
        let publisher = h.client("moqt", &format!("/?jwt={eve}")).await.unwrap();
        for (i, path) in [
            format!("/?jwt={eve}&cluster=peer"),
            format!("/?jwt={eve}"),
            format!("/?jwt={member}"),
        ]
        .iter()
        .enumerate()
        {
            let c = h.client("moqt", path).await.unwrap();
            let (r, ..) = c
                .subscribe_raw(reserved.clone(), Parameters::default())
                .await
                .unwrap();
            assert_eq!(
                error_code(&r),
                Some(request_error::DOES_NOT_EXIST),
                "{path}: {r:?}"
            );
            let fetch = c
                .fetch(
                    moqt::message::FetchKind::Standalone {
                        track: reserved.clone(),
                        start: moqt::Location::new(0, 0),
                        end: moqt::Location::new(10, 0),
                    },
                    Parameters::default(),
                )
                .await;
            let e = match fetch {
                Ok(_) => panic!("{path}: FETCH served"),
                Err(e) => format!("{e:#}"),
            };
            assert!(e.contains("DOES_NOT_EXIST"), "{path}: {e}");
            // Asked for by name, the namespace is not announced either: the
            // first NAMESPACE is one published after the request.
            let mut all = c
                .subscribe_namespace(TrackNamespace::default())
                .await
                .unwrap();
            // (Its own session: prefixes of one session must not overlap.)
            let c2 = h.client("moqt", path).await.unwrap();
            let mut own = c2
                .subscribe_namespace(TrackNamespace::from_path(".quichub"))
                .await
                .unwrap();
            let pushed = c
                .subscribe_tracks(TrackNamespace::default(), false)
                .await
                .unwrap();
            let probe = format!("probe/{i}");
            let _ns = publisher
                .publish_namespace(TrackNamespace::from_path(&probe))
                .await
                .unwrap();
            let _t = publisher
                .create_track(FullTrackName::new(&probe, "t"), 1, TrackMode::Push)
                .await
                .unwrap();
            loop {
                match all.next().await {
                    Some(Message::Namespace(ns)) => {
                        assert_ne!(ns.fields()[0], ".quichub", "{path}");
                        if ns == TrackNamespace::from_path(&probe) {
                            break;
                        }
                    }
                    other => panic!("{path}: {other:?}"),
                }
            }
            // Pushed tracks until the probe (an earlier probe may come
            // first): none of the relays' own.
            loop {
                let (name, _) = c.next_publish().await.unwrap();
                assert_ne!(name.namespace.fields()[0], ".quichub", "{path}");
                if name == FullTrackName::new(&probe, "t") {
                    break;
                }
            }
            drop(pushed);
            let none = tokio::time::timeout(Duration::from_millis(200), own.next()).await;
            assert!(none.is_err(), "{path}: {none:?}");
            own.cancel();
            all.cancel();
        }
        // The cluster's identity, as a peer: served.
        let peer = h
            .client("moqt", &format!("/?jwt={member}&cluster=peer"))
            .await
            .unwrap();
        let (r, ..) = peer
            .subscribe_raw(reserved.clone(), Parameters::default())
            .await
            .unwrap();
        assert!(matches!(r, Message::SubscribeOk(_)), "{r:?}");
    })
    .await;
}
