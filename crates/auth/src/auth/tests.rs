use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::jwt::{generate, Algorithm, Claims, Key};

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn ns(fields: &[&str]) -> Vec<Bytes> {
    fields
        .iter()
        .map(|f| Bytes::copy_from_slice(f.as_bytes()))
        .collect()
}

struct Fixture {
    dir: PathBuf,
    key: Key,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

const ACL: &str = "\
topic read anon/#
user alice
topic readwrite sensors/#
topic deny sensors/secret
user carol
topic read sensors/+/temp
pattern write devices/%c/#
";

const PASSWD: &str = "alice:$7$101$8aiMLZg0sQaLcxss$BSmGVBrcLcOx5POja/gA8si6UUPIzxlogfo6QdP9pFHvrwROhbrbnrr0nTxIWuuYWwdmVk/yvtSD9H5adSAKzA==\n";

fn fixture(name: &str, with_acl: bool, f: impl FnOnce(&mut AuthConfig)) -> (Fixture, Auth) {
    let dir = std::env::temp_dir().join(format!("quichub-auth-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let g = generate(Algorithm::HS256, None).unwrap();
    std::fs::write(dir.join("key.jwk"), g.private.to_string()).unwrap();
    std::fs::write(dir.join("passwd"), PASSWD).unwrap();
    std::fs::write(dir.join("acl"), ACL).unwrap();
    let mut cfg = AuthConfig {
        key: Some(dir.join("key.jwk")),
        password_file: Some(dir.join("passwd")),
        acl_file: with_acl.then(|| dir.join("acl")),
        ..AuthConfig::default()
    };
    f(&mut cfg);
    let auth = Auth::load(&cfg).unwrap();
    let key = Key::from_jwk(&g.private).unwrap();
    (Fixture { dir, key }, auth)
}

fn token(key: &Key, c: Claims) -> String {
    key.sign(&c, None).unwrap()
}

#[test]
fn nothing_configured_allows_everything() {
    let auth = Auth::load(&AuthConfig::default()).unwrap();
    assert!(!auth.configured());
    let id = auth.anonymous("c").unwrap();
    assert!(id.unrestricted());
    assert!(id.may_track(Access::Write, &ns(&["any"]), Some(b"thing")));
    assert!(id.may_filter("#"));
    let id = auth.password("u", b"whatever", "c").unwrap();
    assert_eq!(id.name(), Some("u"));
    assert!(id.may_topic(Access::Write, "x/y"));
    assert!(!id.may_topic(Access::Write, "$SYS/broker/load"));
    let strict = Auth::load(&AuthConfig {
        allow_anonymous: Some(false),
        ..AuthConfig::default()
    })
    .unwrap();
    assert!(matches!(
        strict.anonymous("c"),
        Err(AuthError::NoCredentials)
    ));
}

#[test]
fn jwt_prefixes_on_path_boundaries_for_moqt_and_mqtt() {
    let (fx, auth) = fixture("jwt", false, |_| {});
    let t = token(
        &fx.key,
        Claims {
            root: "demo".into(),
            put: vec!["bbb".into()],
            get: vec!["".into()],
            exp: Some(1_800_000_600),
            ..Claims::default()
        },
    );
    let id = auth.jwt(&t, now()).unwrap();
    assert_eq!(id.method(), Method::Jwt);
    // The session ends when the token would be refused: `exp` plus the leeway.
    assert_eq!(
        id.expires(),
        Some(UNIX_EPOCH + Duration::from_secs(1_800_000_600) + crate::jwt::DEFAULT_LEEWAY)
    );
    assert!(id.may_prefix(Access::Write, &ns(&["demo", "bbb"])));
    assert!(id.may_prefix(Access::Write, &ns(&["demo", "bbb", "x"])));
    assert!(id.may_track(Access::Write, &ns(&["demo"]), Some(b"bbb")));
    assert!(!id.may_prefix(Access::Write, &ns(&["demo", "bbbx"])));
    assert!(!id.may_prefix(Access::Write, &ns(&["demo"])));
    assert!(id.may_prefix(Access::Read, &ns(&["demo"])));
    assert!(!id.may_prefix(Access::Read, &ns(&["other"])));
    assert!(!id.may_topic(Access::Read, "demo/bbb"));
    assert!(matches!(
        auth.jwt(
            &t,
            now() + Duration::from_secs(601) + crate::jwt::DEFAULT_LEEWAY
        ),
        Err(AuthError::Expired)
    ));

    // A `put` prefix mqtt/sensors lets an MQTT client publish sensors/#.
    let t = token(
        &fx.key,
        Claims {
            put: vec!["mqtt/sensors".into()],
            get: vec!["mqtt/sensors/+".into(), "mqtt/a//b".into()],
            ..Claims::default()
        },
    );
    let id = auth
        .password_at(JWT_USERNAME, t.as_bytes(), "c1", now())
        .unwrap();
    assert_eq!(id.client_id(), Some("c1"));
    assert!(id.may_topic(Access::Write, "sensors/room1/temp"));
    assert!(id.may_topic(Access::Write, "sensors"));
    assert!(!id.may_topic(Access::Write, "sensorsx/a"));
    assert!(!id.may_topic(Access::Read, "sensors/a"));
    assert!(id.may_track(Access::Write, &ns(&["mqtt", "sensors"]), Some(b"temp")));
    assert!(!id.may_track(Access::Write, &ns(&["mqtt"]), Some(b"other")));
    // '+' in a claim is literal, not a wildcard.
    assert!(!id.may_filter("sensors/+/#"));
    assert!(!id.may_filter("sensors/x"));
    // "a//b" normalises to a/b.
    assert!(id.may_filter("a/b/#"));
    // An empty user name works as well; a password file user does not.
    assert!(auth.password_at("", t.as_bytes(), "c1", now()).is_ok());
    assert!(matches!(
        auth.password_at("bob", t.as_bytes(), "c1", now()),
        Err(AuthError::BadCredentials)
    ));
    // A wrongly signed JWT as password is a JWT failure.
    let other = Key::from_jwk(&generate(Algorithm::HS256, None).unwrap().private).unwrap();
    let bad = token(
        &other,
        Claims {
            get: vec!["".into()],
            ..Claims::default()
        },
    );
    assert!(matches!(
        auth.password_at("jwt", bad.as_bytes(), "c", now()),
        Err(AuthError::BadSignature)
    ));
}

#[test]
fn jwt_filters_need_a_covering_get_prefix() {
    let (fx, auth) = fixture("filters", false, |_| {});
    let t = token(
        &fx.key,
        Claims {
            get: vec!["mqtt/sensors".into()],
            ..Claims::default()
        },
    );
    let id = auth.jwt(&t, now()).unwrap();
    for f in ["sensors", "sensors/#", "sensors/+", "sensors/a/+/b"] {
        assert!(id.may_filter(f), "{f}");
    }
    for f in ["#", "+/x", "sensorsx", "+"] {
        assert!(!id.may_filter(f), "{f}");
    }
    // Empty levels map to \0 fields both ways.
    let t = token(
        &fx.key,
        Claims {
            get: vec!["mqtt/a/\0".into()],
            ..Claims::default()
        },
    );
    let id = auth.jwt(&t, now()).unwrap();
    assert!(id.may_topic(Access::Read, "a//b"));
    assert!(id.may_track(Access::Read, &ns(&["mqtt", "a", "\0"]), Some(b"b")));
}

#[test]
fn passwords_and_acl_rules_across_protocols() {
    let (fx, auth) = fixture("acl", true, |_| {});
    assert!(matches!(
        auth.password("alice", b"wrong", "c"),
        Err(AuthError::BadCredentials)
    ));
    assert!(matches!(
        auth.password("nobody", b"s3cret", "c"),
        Err(AuthError::BadCredentials)
    ));
    let alice = auth.password("alice", b"s3cret", "dev1").unwrap();
    assert_eq!(alice.method(), Method::Password);
    assert!(!alice.unrestricted());
    assert!(alice.may_topic(Access::Write, "sensors/room1/temp"));
    assert!(!alice.may_topic(Access::Write, "sensors/secret"));
    assert!(!alice.may_topic(Access::Write, "other"));
    assert!(alice.may_filter("sensors/#"));
    assert!(!alice.may_filter("#"));
    // The same rules for MoQT tracks under (mqtt, sensors, ...).
    assert!(alice.may_track(
        Access::Write,
        &ns(&["mqtt", "sensors", "room1"]),
        Some(b"temp")
    ));
    assert!(alice.may_track(Access::Write, &ns(&["mqtt"]), Some(b"sensors")));
    assert!(!alice.may_track(Access::Write, &ns(&["mqtt", "sensors"]), Some(b"secret")));
    assert!(!alice.may_track(Access::Write, &ns(&["media", "sensors"]), Some(b"x")));
    assert!(alice.may_prefix(Access::Write, &ns(&["mqtt", "sensors", "room1"])));
    // (mqtt, sensors) holds sensors/secret, which is denied.
    assert!(!alice.may_prefix(Access::Read, &ns(&["mqtt", "sensors"])));
    // Patterns: %c is the MQTT client id.
    assert!(alice.may_topic(Access::Write, "devices/dev1/x"));
    assert!(!alice.may_topic(Access::Write, "devices/dev2/x"));

    // A JWT whose sub is alice gets alice's rules (and no client id).
    let t = token(
        &fx.key,
        Claims {
            sub: Some("alice".into()),
            ..Claims::default()
        },
    );
    let id = auth.jwt(&t, now()).unwrap();
    assert_eq!(id.name(), Some("alice"));
    assert!(id.may_track(Access::Write, &ns(&["mqtt", "sensors"]), Some(b"x")));
    assert!(!id.may_track(Access::Write, &ns(&["mqtt", "other"]), Some(b"x")));
    assert!(!id.may_topic(Access::Write, "devices/dev1/x"));
    // A deny rule wins over a JWT grant.
    let t = token(
        &fx.key,
        Claims {
            sub: Some("alice".into()),
            put: vec!["mqtt".into()],
            ..Claims::default()
        },
    );
    let id = auth.jwt(&t, now()).unwrap();
    assert!(id.may_topic(Access::Write, "anything"));
    assert!(!id.may_topic(Access::Write, "sensors/secret"));

    // Certificates use the name as the user.
    let carol = auth.certificate("carol", "c").unwrap();
    assert!(carol.may_filter("sensors/+/temp"));
    assert!(!carol.may_filter("sensors/#"));
    assert!(!carol.may_topic(Access::Write, "sensors/a/temp"));
}

#[test]
fn anonymous_clients() {
    // ACL anonymous rules + public prefixes.
    let (_fx, auth) = fixture("anon", true, |c| {
        c.public = vec!["open".into()];
        c.public_read = vec!["news".into()];
    });
    let id = auth.anonymous("c").unwrap();
    assert_eq!(id.method(), Method::Anonymous);
    assert!(id.may_topic(Access::Read, "anon/x"));
    assert!(!id.may_topic(Access::Write, "anon/x"));
    assert!(id.may_prefix(Access::Write, &ns(&["open", "room"])));
    assert!(id.may_prefix(Access::Read, &ns(&["news"])));
    assert!(!id.may_prefix(Access::Write, &ns(&["news"])));
    assert!(!id.may_prefix(Access::Read, &ns(&["newsx"])));
    assert!(id.may_topic(Access::Write, "devices/c/state"));

    // Configured without anything for anonymous clients: refused.
    let (_fx, auth) = fixture("anon2", false, |_| {});
    assert!(matches!(auth.anonymous("c"), Err(AuthError::NoCredentials)));
    // Unless explicitly allowed (and then they may do nothing).
    let (_fx, auth) = fixture("anon3", false, |c| c.allow_anonymous = Some(true));
    let id = auth.anonymous("c").unwrap();
    assert!(!id.may_topic(Access::Read, "x"));
    // Or explicitly refused despite public prefixes.
    let (_fx, auth) = fixture("anon4", false, |c| {
        c.public = vec!["".into()];
        c.allow_anonymous = Some(false);
    });
    assert!(auth.anonymous("c").is_err());
}

#[test]
fn password_users_without_acl_file_may_do_everything() {
    let (_fx, auth) = fixture("noacl", false, |_| {});
    let id = auth.password("alice", b"s3cret", "c").unwrap();
    assert!(id.unrestricted());
    assert!(id.may_filter("#"));
}

#[test]
fn reasons_are_labels() {
    let (fx, auth) = fixture("reasons", false, |_| {});
    let e = auth.jwt("garbage", now()).unwrap_err();
    assert_eq!(e.reason(), "malformed");
    let t = token(
        &fx.key,
        Claims {
            get: vec!["".into()],
            exp: Some(1),
            ..Claims::default()
        },
    );
    assert_eq!(auth.jwt(&t, now()).unwrap_err().reason(), "expired");
    let e = Auth::load(&AuthConfig {
        acl_file: Some(fx.dir.join("missing")),
        ..AuthConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.reason(), "io");
    std::fs::write(fx.dir.join("bad.acl"), "user a\ntopic nope x\n").unwrap();
    let e = Auth::load(&AuthConfig {
        acl_file: Some(fx.dir.join("bad.acl")),
        ..AuthConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.reason(), "config");
    assert!(
        e.to_string()
            .ends_with("bad.acl:2: unknown access \"nope\" (read, write, readwrite, deny)"),
        "{e}"
    );
}

/// Keys and tokens made by moq-dev's own tool (`moq auth generate` and
/// `moq auth sign` of moq-cli 0.14.10): its base64url JWK files, its newer
/// `publish`/`subscribe` patterns and its legacy `put`/`get`.
#[test]
fn tokens_made_by_moq_cli() {
    const HS_KEY: &str = "eyJhbGciOiJIUzI1NiIsImtleV9vcHMiOlsic2lnbiIsInZlcmlmeSJdLCJrdHkiOiJvY3QiLCJrIjoiajhhdHFVRGxCTFVnMFZnanl2cS01TXZoV2gwQWlvYlFHZl9sdXB3TFFBRSIsImtpZCI6Im1vcS1ocyJ9";
    // {"root":"demo","publish":["alice/**","cam"],"subscribe":["**"]}
    const HS_TOKEN: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiIsImtpZCI6Im1vcS1ocyJ9.eyJyb290IjoiZGVtbyIsInB1Ymxpc2giOlsiYWxpY2UvKioiLCJjYW0iXSwic3Vic2NyaWJlIjpbIioqIl19.AfSpHAVw1LiPWB9lVI7dS5OVvkD3Yy2VucMxX7hu8mQ";
    const ES_PUBLIC: &str = "eyJhbGciOiJFUzI1NiIsImtleV9vcHMiOlsidmVyaWZ5Il0sImt0eSI6IkVDIiwiY3J2IjoiUC0yNTYiLCJ4IjoiSlRJdUNvQ2pEV0hSSE5hRHkyMlpCWl95LUFwM0hMVXMtTWNOLVU1X29RYyIsInkiOiJxTXNsTVNidVJiRzVMaFJkaHpLMXhYOTZZM3NhQnFiWmc5dDNXQ2tTQzZFIiwia2lkIjoibW9xLWVzIn0";
    // {"root":"live","get":["game"]}
    const ES_TOKEN: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJFUzI1NiIsImtpZCI6Im1vcS1lcyJ9.eyJyb290IjoibGl2ZSIsImdldCI6WyJnYW1lIl19.pYwiyj8BvZoEuGiGgbn19htNuAGaEcrmjaF2qLp9aRxmQmoxjRccTFoo8uLMmXm9fEyl6Zon1ne5JCE5S7qXcA";
    const ED_PUBLIC: &str = "eyJhbGciOiJFZERTQSIsImtleV9vcHMiOlsidmVyaWZ5Il0sImt0eSI6Ik9LUCIsImNydiI6IkVkMjU1MTkiLCJ4IjoiZVZtMW1IYzRRVmFsRGh1UHRQUXlzeHQ5VmdqUGNRbGFKQTJqcWpQN292QSIsImtpZCI6Im1vcS1lZCJ9";
    // {"put":["x"]}
    const ED_TOKEN: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJFZERTQSIsImtpZCI6Im1vcS1lZCJ9.eyJwdXQiOlsieCJdfQ.jLvFMPPItXdkNj5EbMXVBGmciiaG7qeiBh6h592Nty0XXcH15oDyhacoO809lGDa9StFmdd6mfZK8SNtTZAzDg";

    let dir = std::env::temp_dir().join(format!("quichub-auth-moq-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, key) in [
        ("moq-hs.jwk", HS_KEY),
        ("moq-es.jwk", ES_PUBLIC),
        ("moq-ed.jwk", ED_PUBLIC),
    ] {
        std::fs::write(dir.join(name), key).unwrap();
    }
    let auth = Auth::load(&AuthConfig {
        key_dir: Some(dir.clone()),
        ..AuthConfig::default()
    })
    .unwrap();
    std::fs::remove_dir_all(&dir).ok();

    let hs = auth.jwt(HS_TOKEN, now()).unwrap();
    assert!(hs.may_track(
        Access::Write,
        &ns(&["demo", "alice", "cam1"]),
        Some(b"video")
    ));
    assert!(hs.may_prefix(Access::Write, &ns(&["demo", "alice"])));
    // `cam`: that broadcast and its tracks, nothing below it.
    assert!(hs.may_track(Access::Write, &ns(&["demo", "cam"]), Some(b"video")));
    assert!(hs.may_prefix(Access::Write, &ns(&["demo", "cam"])));
    assert!(!hs.may_track(Access::Write, &ns(&["demo", "cam", "x"]), Some(b"video")));
    assert!(!hs.may_prefix(Access::Write, &ns(&["demo", "bob"])));
    assert!(!hs.may_prefix(Access::Write, &ns(&["demo"])));
    // `**` under the root: every read under demo, nothing outside.
    assert!(hs.may_prefix(Access::Read, &ns(&["demo"])));
    assert!(!hs.may_prefix(Access::Read, &ns(&["other"])));

    let es = auth.jwt(ES_TOKEN, now()).unwrap();
    assert!(es.may_prefix(Access::Read, &ns(&["live", "game"])));
    assert!(es.may_track(Access::Read, &ns(&["live", "game", "a"]), Some(b"v")));
    assert!(!es.may_prefix(Access::Read, &ns(&["live"])));
    assert!(!es.may_track(Access::Write, &ns(&["live", "game"]), Some(b"v")));

    let ed = auth.jwt(ED_TOKEN, now()).unwrap();
    assert!(ed.may_prefix(Access::Write, &ns(&["x", "y"])));
    assert!(!ed.may_prefix(Access::Read, &ns(&["x"])));

    // A token made with one moq-cli key does not pass with another's kid.
    let (h, rest) = HS_TOKEN.split_once('.').unwrap();
    let _ = h;
    let forged = format!("{}.{rest}", ES_TOKEN.split_once('.').unwrap().0);
    assert!(auth.jwt(&forged, now()).is_err());
}

/// Every credential kind against every auth configuration, through the one
/// model every listener uses (MQTT CONNECT: [`Auth::password_at`],
/// [`Auth::certificate`], [`Auth::anonymous`]; MoQT and HTTP: [`Auth::jwt`],
/// [`Auth::anonymous`]). Each cell is what the identity may do with the
/// MQTT topics `anon/x` (read, write) and `secret/door` (read, write), as
/// `RW` letters or `-`, or the refusal. The listeners' own tests
/// (`e2e_auth_matrix`) check that each listener reaches these answers.
#[test]
fn credential_matrix() {
    let dir = std::env::temp_dir().join(format!("quichub-auth-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let g = generate(Algorithm::HS256, None).unwrap();
    std::fs::write(dir.join("key.jwk"), g.private.to_string()).unwrap();
    let key = Key::from_jwk(&g.private).unwrap();
    std::fs::write(dir.join("passwd"), PASSWD).unwrap();
    // anonymous clients read anon/#; alice reads and writes secret/#.
    std::fs::write(
        dir.join("acl"),
        "topic read anon/#\nuser alice\ntopic readwrite secret/#\n",
    )
    .unwrap();
    let good = token(
        &key,
        Claims {
            sub: Some("alice".into()),
            put: vec!["mqtt/secret".into()],
            get: vec!["mqtt/secret".into()],
            exp: Some(1_800_000_600),
            ..Claims::default()
        },
    );
    let expired = token(
        &key,
        Claims {
            put: vec!["".into()],
            get: vec!["".into()],
            exp: Some(1_700_000_000),
            ..Claims::default()
        },
    );
    let other = generate(Algorithm::HS256, None).unwrap();
    let forged = token(
        &Key::from_jwk(&other.private).unwrap(),
        Claims {
            put: vec!["".into()],
            get: vec!["".into()],
            exp: Some(1_800_000_600),
            ..Claims::default()
        },
    );
    let rights = |r: Result<Identity, AuthError>| match r {
        Err(e) => format!("refused:{}", e.reason()),
        Ok(id) => [
            (Access::Read, "anon/x"),
            (Access::Write, "anon/x"),
            (Access::Read, "secret/door"),
            (Access::Write, "secret/door"),
        ]
        .iter()
        .map(|&(a, t)| match (id.may_topic(a, t), a) {
            (false, _) => '-',
            (true, Access::Read) => 'R',
            (true, Access::Write) => 'W',
        })
        .collect(),
    };
    type Configure = fn(&mut AuthConfig, &std::path::Path);
    let configs: [(&str, Configure); 7] = [
        ("nothing", |_, _| {}),
        ("public", |c, _| c.public = vec!["mqtt/anon".into()]),
        ("public_read", |c, _| {
            c.public_read = vec!["mqtt/anon".into()]
        }),
        ("password_file", |c, d| {
            c.password_file = Some(d.join("passwd"))
        }),
        ("keys", |c, d| c.key = Some(d.join("key.jwk"))),
        ("acl", |c, d| c.acl_file = Some(d.join("acl"))),
        ("not_anonymous", |c, _| c.allow_anonymous = Some(false)),
    ];
    // Columns: none, user name only, bad password, good password, bad JWT,
    // expired JWT, good JWT (as an MQTT password), good JWT (MoQT/HTTP),
    // client certificate (use_identity_as_username, CN alice).
    let want: [(&str, [&str; 9]); 7] = [
        ("nothing", ["RWRW"; 9]),
        (
            "public",
            [
                "RW--", "RW--", "RW--", "RW--", "RW--", "RW--", "RW--", "RW--", "RWRW",
            ],
        ),
        (
            "public_read",
            [
                "R---", "R---", "R---", "R---", "R---", "R---", "R---", "R---", "RWRW",
            ],
        ),
        (
            "password_file",
            [
                "refused:no_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "RWRW",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:no_credentials",
                "RWRW",
            ],
        ),
        (
            "keys",
            [
                "refused:no_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:bad_signature",
                "refused:expired",
                "--RW",
                "--RW",
                "RWRW",
            ],
        ),
        (
            "acl",
            [
                "R---", "R---", "R---", "R---", "R---", "R---", "R---", "R---", "--RW",
            ],
        ),
        (
            "not_anonymous",
            [
                "refused:no_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:bad_credentials",
                "refused:no_credentials",
                "RWRW",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for ((name, configure), (want_name, want)) in configs.iter().zip(want) {
        assert_eq!(*name, want_name);
        let mut cfg = AuthConfig::default();
        configure(&mut cfg, &dir);
        let auth = Auth::load(&cfg).unwrap();
        let got = [
            rights(auth.anonymous("c1")),
            rights(auth.password_at("mallory", b"", "c1", now())),
            rights(auth.password_at("alice", b"wrong", "c1", now())),
            rights(auth.password_at("alice", b"s3cret", "c1", now())),
            rights(auth.password_at(JWT_USERNAME, forged.as_bytes(), "c1", now())),
            rights(auth.password_at(JWT_USERNAME, expired.as_bytes(), "c1", now())),
            rights(auth.password_at(JWT_USERNAME, good.as_bytes(), "c1", now())),
            rights(auth.jwt(&good, now())),
            rights(auth.certificate("alice", "c1")),
        ];
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            if g != w {
                failures.push(format!("{name} column {i}: got {g}, want {w}"));
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// MQTT clients never write `$SYS`; MoQT publishers under (`mqtt`) must not
/// either, whatever they may do otherwise.
#[test]
fn no_one_writes_sys_over_moqt() {
    let open = Auth::load(&AuthConfig::default()).unwrap();
    let id = open.anonymous("c").unwrap();
    assert!(id.unrestricted());
    assert!(!id.may_track(
        Access::Write,
        &ns(&["mqtt", "$SYS", "broker"]),
        Some(b"load")
    ));
    assert!(!id.may_track(Access::Write, &ns(&["mqtt"]), Some(b"$SYS")));
    assert!(!id.may_prefix(Access::Write, &ns(&["mqtt", "$SYS"])));
    assert!(!id.may_topic(Access::Write, "$SYS/broker/load"));
    // Reading them, and writing anything else, is as before.
    assert!(id.may_track(
        Access::Read,
        &ns(&["mqtt", "$SYS", "broker"]),
        Some(b"load")
    ));
    assert!(id.may_track(Access::Write, &ns(&["mqtt", "sensors"]), Some(b"t")));
    assert!(id.may_track(Access::Write, &ns(&["other", "$SYS"]), Some(b"t")));
    let (fx, auth) = fixture("sys", false, |_| {});
    let t = token(
        &fx.key,
        Claims {
            put: vec!["mqtt".into()],
            exp: Some(1_800_000_600),
            ..Claims::default()
        },
    );
    let id = auth.jwt(&t, now()).unwrap();
    assert!(id.may_track(Access::Write, &ns(&["mqtt", "a"]), Some(b"b")));
    assert!(!id.may_track(Access::Write, &ns(&["mqtt", "$SYS"]), Some(b"b")));
    assert!(!id.may_prefix(Access::Write, &ns(&["mqtt", "$SYS", "x"])));
}
