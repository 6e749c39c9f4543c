//! `[auth] leeway_s` through `Auth`: a token is accepted that long after
//! its `exp` (and before its `nbf`), the identity it gives expires then, and
//! `leeway_s = 0` turns it off.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quichub_auth::jwt::{generate, Algorithm, Claims, Key, DEFAULT_LEEWAY};
use quichub_auth::{Auth, AuthConfig, AuthError};

const EXP: u64 = 1_800_000_000;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// An `Auth` with one HS256 key and `leeway_s`, and that key.
fn auth(name: &str, leeway_s: Option<u64>) -> (Auth, Key) {
    let dir = std::env::temp_dir().join(format!("quichub-leeway-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let g = generate(Algorithm::HS256, None).unwrap();
    let path = dir.join("key.jwk");
    std::fs::write(&path, g.private.to_string()).unwrap();
    let mut cfg = AuthConfig {
        key: Some(path),
        ..AuthConfig::default()
    };
    if let Some(l) = leeway_s {
        cfg.leeway_s = l;
    }
    let auth = Auth::load(&cfg).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    (auth, Key::from_jwk(&g.private).unwrap())
}

fn token(key: &Key, exp: Option<u64>, nbf: Option<u64>) -> String {
    let c = Claims {
        get: vec!["".into()],
        exp,
        nbf,
        ..Claims::default()
    };
    key.sign(&c, None).unwrap()
}

#[test]
fn default_leeway_is_sixty_seconds_and_can_be_set() {
    assert_eq!(AuthConfig::default().leeway_s, 60);
    assert_eq!(DEFAULT_LEEWAY.as_secs(), 60);
    // serde, as the `[auth]` section is read (JSON here: same keys).
    let cfg: AuthConfig = serde_json::from_str(r#"{"leeway_s": 5}"#).unwrap();
    assert_eq!(cfg.leeway_s, 5);
    let cfg: AuthConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(cfg.leeway_s, 60);
}

#[test]
fn a_token_is_accepted_within_the_leeway_and_its_session_ends_after_it() {
    let (lenient, key) = auth("default", None);
    let t = token(&key, Some(EXP), None);
    let id = lenient.jwt(&t, at(EXP + 30)).unwrap();
    assert_eq!(id.expires(), Some(at(EXP + 60)));
    assert!(matches!(
        lenient.jwt(&t, at(EXP + 60)),
        Err(AuthError::Expired)
    ));
    // An issuer whose clock runs ahead: `nbf` a little in the future.
    let early = token(&key, Some(EXP + 3600), Some(EXP + 20));
    assert!(lenient.jwt(&early, at(EXP)).is_ok());
    let too_early = token(&key, Some(EXP + 3600), Some(EXP + 61));
    assert!(matches!(
        lenient.jwt(&too_early, at(EXP)),
        Err(AuthError::Expired)
    ));

    let (strict, key) = auth("zero", Some(0));
    let t = token(&key, Some(EXP), None);
    assert!(matches!(strict.jwt(&t, at(EXP)), Err(AuthError::Expired)));
    let id = strict.jwt(&t, at(EXP - 1)).unwrap();
    assert_eq!(id.expires(), Some(at(EXP)));
    let early = token(&key, Some(EXP + 3600), Some(EXP + 1));
    assert!(matches!(
        strict.jwt(&early, at(EXP)),
        Err(AuthError::Expired)
    ));
    // A token without `exp` never expires, leeway or not.
    assert_eq!(
        strict
            .jwt(&token(&key, None, None), at(EXP))
            .unwrap()
            .expires(),
        None
    );
}
