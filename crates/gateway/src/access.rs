//! Authentication and authorisation of one MQTT connection, sans IO: the
//! CONNECT's credentials become a [`quichub_auth::Identity`] (and a CONNACK
//! reason code when they do not), and the identity answers for each
//! PUBLISH, SUBSCRIBE, delivery and the Will Message.
//!
//! The connection keeps its identity and the [`SharedAuth::generation`] it
//! was derived in; after a reload (SIGHUP: new password, ACL or key files)
//! [`ConnAuth::refresh`] derives it again from the stored credentials, so
//! revoked users and changed rules reach clients already connected.

use std::sync::Arc;
use std::time::SystemTime;

use quichub_auth::{Access, Auth, AuthError, Identity, SharedAuth};
use quichub_mqtt::{reason, topic, Version};

use crate::session::Credentials;

/// The `protocol` label of the auth metrics.
pub const PROTOCOL: &str = "mqtt";

/// The CONNACK reason code (MQTT 5; [`reason::connack_v311`] maps it for
/// 3.1.1) for credentials that did not authenticate: a wrong user name,
/// password or token is Bad User Name or Password (0x86; 3.1.1: 4), a
/// client that may not connect at all (anonymous clients refused, a
/// certificate name refused) is Not Authorized (0x87; 3.1.1: 5).
pub fn connack_code(e: &AuthError) -> u8 {
    match e {
        AuthError::NotAuthorized | AuthError::NoCredentials => reason::NOT_AUTHORIZED,
        _ => reason::BAD_USERNAME_OR_PASSWORD,
    }
}

/// The DISCONNECT reason code (MQTT 5) for a connection whose credentials
/// stopped authenticating: an expired JWT is Maximum connect time (0xA0,
/// "the maximum connection time authorized for this connection has been
/// exceeded"), anything else (a user removed or a password changed by a
/// reload) Not Authorized (0x87).
pub fn disconnect_code(e: &AuthError) -> u8 {
    match e {
        AuthError::Expired => reason::MAXIMUM_CONNECT_TIME,
        _ => reason::NOT_AUTHORIZED,
    }
}

/// The PUBACK/PUBREC reason code of a PUBLISH the identity may not make:
/// Not Authorized for MQTT 5. MQTT 3.1.1 acknowledgements carry no code:
/// the publish is acknowledged and dropped, as mosquitto does, so the
/// client cannot tell (and does not retry forever).
pub fn refused_publish_code(v: Version) -> u8 {
    match v {
        Version::V5 => reason::NOT_AUTHORIZED,
        Version::V311 => reason::SUCCESS,
    }
}

/// The SUBACK code of a filter the identity may not subscribe to: Not
/// Authorized (0x87); the encoder writes it as 0x80 (Failure) for 3.1.1.
pub const REFUSED_SUBSCRIBE_CODE: u8 = reason::NOT_AUTHORIZED;

/// Authenticates a CONNECT: a certificate's name (with
/// `use_identity_as_username`), a user name and password (or a JWT as the
/// password, with the user name `jwt` or none), or no credentials.
pub fn authenticate(
    auth: &Auth,
    c: &Credentials,
    client_id: &str,
    now: SystemTime,
) -> Result<Identity, AuthError> {
    if c.from_certificate {
        return auth.certificate(c.username.as_deref().unwrap_or(""), client_id);
    }
    match (c.username.as_deref(), c.password.as_deref()) {
        (None, None) => auth.anonymous(client_id),
        // A user name without a password is checked as an empty password
        // (refused by any password file); a password without a user name
        // (MQTT 5) can only be a JWT.
        (user, pass) => {
            auth.password_at(user.unwrap_or(""), pass.unwrap_or_default(), client_id, now)
        }
    }
}

/// One connection's identity, kept current across reloads.
#[derive(Debug)]
pub struct ConnAuth {
    shared: Arc<SharedAuth>,
    credentials: Credentials,
    client_id: Arc<str>,
    generation: u64,
    identity: Identity,
}

impl ConnAuth {
    /// Authenticates a CONNECT with the auth in force, counting the outcome.
    pub fn connect(
        shared: Arc<SharedAuth>,
        credentials: Credentials,
        client_id: Arc<str>,
        now: SystemTime,
    ) -> Result<Self, AuthError> {
        // Read the generation first: a reload in between is then seen by
        // the next refresh.
        let generation = shared.generation();
        match authenticate(&shared.get(), &credentials, &client_id, now) {
            Ok(identity) => {
                shared.metrics.success(PROTOCOL, identity.method());
                Ok(Self {
                    shared,
                    credentials,
                    client_id,
                    generation,
                    identity,
                })
            }
            Err(e) => {
                shared.metrics.failure(PROTOCOL, &e);
                Err(e)
            }
        }
    }

    /// Derives the identity again if the auth in force changed since (one
    /// atomic load otherwise). Err: the credentials no longer authenticate
    /// (the connection must end, see [`disconnect_code`]).
    pub fn refresh(&mut self, now: SystemTime) -> Result<(), AuthError> {
        let generation = self.shared.generation();
        if generation == self.generation {
            return Ok(());
        }
        let auth = self.shared.get();
        match authenticate(&auth, &self.credentials, &self.client_id, now) {
            Ok(identity) => {
                self.identity = identity;
                self.generation = generation;
                Ok(())
            }
            Err(e) => {
                self.shared.metrics.failure(PROTOCOL, &e);
                Err(e)
            }
        }
    }

    /// Notifications of reloads of the auth: a connection waits on them to
    /// [`refresh`](Self::refresh) at once, even while its client is idle,
    /// so revoked credentials end it without waiting for its next packet.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.subscribe()
    }

    /// The identity in force.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// When the credentials expire (a JWT's `exp`).
    pub fn expires(&self) -> Option<SystemTime> {
        self.identity.expires()
    }

    /// Whether the client may PUBLISH to `topic` (also asked of its Will
    /// Message when it is about to be published). Counts a refusal.
    pub fn may_publish(&self, topic: &str) -> bool {
        let ok = self.identity.may_topic(Access::Write, topic);
        if !ok {
            self.refused();
        }
        ok
    }

    /// Whether the client may SUBSCRIBE to `full_filter` (a shared
    /// subscription `$share/GROUP/F` is judged by `F`, as mosquitto does).
    /// An invalid filter passes: the broker refuses it with its own code.
    /// Counts a refusal.
    pub fn may_subscribe(&self, full_filter: &str) -> bool {
        if self.identity.unrestricted() {
            return true;
        }
        let ok = match topic::parse_subscription(full_filter) {
            Ok((_, filter)) => self.identity.may_filter(&filter),
            Err(_) => true,
        };
        if !ok {
            self.refused();
        }
        ok
    }

    /// Whether a message on `topic` may be delivered to the client (the read
    /// check mosquitto makes per delivery: a wildcard subscription may match
    /// topics a rule does not allow). Free for an unrestricted identity.
    #[inline]
    pub fn may_deliver(&self, topic: &str) -> bool {
        self.identity.unrestricted() || self.identity.may_topic(Access::Read, topic)
    }

    fn refused(&self) {
        self.shared
            .metrics
            .failure_reason(PROTOCOL, AuthError::NotAuthorized.reason());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;
    use quichub_auth::jwt::{generate, Algorithm, Claims, Key};
    use quichub_auth::AuthConfig;
    use std::path::PathBuf;
    use std::time::{Duration, UNIX_EPOCH};

    /// `alice` with the password `s3cret` (made by mosquitto_passwd).
    const PASSWD: &str = "alice:$7$101$8aiMLZg0sQaLcxss$BSmGVBrcLcOx5POja/gA8si6UUPIzxlogfo6QdP9pFHvrwROhbrbnrr0nTxIWuuYWwdmVk/yvtSD9H5adSAKzA==\n";
    const ACL: &str = "\
topic read public/#
user alice
topic readwrite sensors/#
topic deny sensors/secret
user dev
topic write devices/#
";

    pub(crate) struct Dir(pub(crate) PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    /// A password file, an ACL file and an HMAC key; the key to sign with.
    pub(crate) fn setup(name: &str) -> (Dir, AuthConfig, Key) {
        let dir =
            std::env::temp_dir().join(format!("quichub-access-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let g = generate(Algorithm::HS256, None).unwrap();
        std::fs::write(dir.join("key.jwk"), g.private.to_string()).unwrap();
        std::fs::write(dir.join("passwd"), PASSWD).unwrap();
        std::fs::write(dir.join("acl"), ACL).unwrap();
        let cfg = AuthConfig {
            key: Some(dir.join("key.jwk")),
            password_file: Some(dir.join("passwd")),
            acl_file: Some(dir.join("acl")),
            // Tokens expire at their `exp` here, as the tests count.
            leeway_s: 0,
            ..AuthConfig::default()
        };
        (Dir(dir), cfg, Key::from_jwk(&g.private).unwrap())
    }

    fn creds(user: Option<&str>, pass: Option<&str>) -> Credentials {
        Credentials {
            username: user.map(str::to_owned),
            password: pass.map(|p| Bytes::copy_from_slice(p.as_bytes())),
            from_certificate: false,
        }
    }

    fn connack(shared: &Arc<SharedAuth>, c: Credentials, v: Version) -> u8 {
        match ConnAuth::connect(shared.clone(), c, "c1".into(), now()) {
            Ok(_) => reason::SUCCESS,
            Err(e) if v == Version::V311 => reason::connack_v311(connack_code(&e)),
            Err(e) => connack_code(&e),
        }
    }

    #[test]
    fn connack_codes() {
        let (_d, cfg, key) = setup("connack");
        let shared = SharedAuth::new(Auth::load(&cfg).unwrap());
        let ok = creds(Some("alice"), Some("s3cret"));
        let wrong = creds(Some("alice"), Some("nope"));
        let unknown = creds(Some("mallory"), Some("s3cret"));
        let no_pass = creds(Some("alice"), None);
        for (v, bad) in [(Version::V5, 0x86), (Version::V311, 4)] {
            assert_eq!(connack(&shared, ok.clone(), v), 0);
            assert_eq!(connack(&shared, wrong.clone(), v), bad);
            assert_eq!(connack(&shared, unknown.clone(), v), bad);
            assert_eq!(connack(&shared, no_pass.clone(), v), bad);
            // The ACL file has rules for anonymous clients (`topic read
            // public/#`), so they may connect, unless allow_anonymous = false.
            assert_eq!(connack(&shared, creds(None, None), v), 0);
        }
        let strict = SharedAuth::new(
            Auth::load(&AuthConfig {
                allow_anonymous: Some(false),
                ..cfg.clone()
            })
            .unwrap(),
        );
        assert_eq!(connack(&strict, creds(None, None), Version::V5), 0x87);
        assert_eq!(connack(&strict, creds(None, None), Version::V311), 5);
        // A JWT as the password, with the user name `jwt` or none; a bad
        // or expired one is a bad password.
        let t = key
            .sign(
                &Claims {
                    put: vec!["mqtt/sensors".into()],
                    exp: Some(1_800_000_060),
                    ..Claims::default()
                },
                None,
            )
            .unwrap();
        assert_eq!(
            connack(&shared, creds(Some("jwt"), Some(&t)), Version::V5),
            0
        );
        assert_eq!(connack(&shared, creds(None, Some(&t)), Version::V5), 0);
        let a = ConnAuth::connect(shared.clone(), creds(None, Some(&t)), "c".into(), now());
        assert_eq!(
            a.unwrap().expires(),
            Some(UNIX_EPOCH + Duration::from_secs(1_800_000_060))
        );
        let forged = format!("{}x", &t[..t.len() - 1]);
        assert_eq!(
            connack(&shared, creds(Some("jwt"), Some(&forged)), Version::V5),
            0x86
        );
        let late = ConnAuth::connect(
            shared.clone(),
            creds(None, Some(&t)),
            "c".into(),
            now() + Duration::from_secs(61),
        );
        assert!(matches!(late, Err(AuthError::Expired)));
        // A certificate name is a user of the ACL file.
        let cert = Credentials {
            username: Some("dev".into()),
            password: None,
            from_certificate: true,
        };
        let dev = ConnAuth::connect(shared.clone(), cert, "c".into(), now()).unwrap();
        assert!(dev.may_publish("devices/x"));
        assert!(!dev.may_publish("sensors/x"));
        // Counted once per CONNECT, by method and reason.
        let m = &shared.metrics;
        assert_eq!(m.get(PROTOCOL, true, "password"), 2);
        assert_eq!(m.get(PROTOCOL, false, "bad_credentials"), 6);
        assert_eq!(m.get(PROTOCOL, true, "certificate"), 1);
        assert_eq!(strict.metrics.get(PROTOCOL, false, "no_credentials"), 2);
    }

    #[test]
    fn publish_subscribe_and_delivery_codes() {
        let (_d, cfg, _key) = setup("acks");
        let shared = SharedAuth::new(Auth::load(&cfg).unwrap());
        let alice = ConnAuth::connect(
            shared.clone(),
            creds(Some("alice"), Some("s3cret")),
            "c".into(),
            now(),
        )
        .unwrap();
        assert!(alice.may_publish("sensors/a"));
        assert!(!alice.may_publish("sensors/secret"));
        assert!(!alice.may_publish("other"));
        assert!(!alice.may_publish("$SYS/broker/uptime"));
        assert_eq!(refused_publish_code(Version::V5), 0x87);
        assert_eq!(refused_publish_code(Version::V311), 0);
        assert!(alice.may_subscribe("sensors/+"));
        assert!(alice.may_subscribe("$share/g/sensors/#"));
        assert!(!alice.may_subscribe("#"));
        assert!(!alice.may_subscribe("$share/g/#"));
        assert_eq!(REFUSED_SUBSCRIBE_CODE, 0x87);
        // 3.1.1 SUBACK: written as Failure (0x80).
        let mut b = bytes::BytesMut::new();
        let suback = quichub_mqtt::Packet::SubAck(quichub_mqtt::SubAck {
            packet_id: 1,
            codes: vec![1, REFUSED_SUBSCRIBE_CODE],
            properties: Default::default(),
        });
        quichub_mqtt::encode(&suback, Version::V311, &mut b).unwrap();
        assert_eq!(&b[..], [0x90, 4, 0, 1, 1, 0x80]);
        assert!(alice.may_deliver("sensors/a"));
        assert!(!alice.may_deliver("sensors/secret"));
        // Rules before any `user` line are the anonymous clients' only.
        assert!(!alice.may_deliver("public/x"));
        assert_eq!(
            shared.metrics.get(PROTOCOL, false, "not_authorized"),
            5,
            "refused publishes and subscriptions are counted, deliveries are not"
        );
        assert_eq!(disconnect_code(&AuthError::Expired), 0xA0);
        assert_eq!(disconnect_code(&AuthError::BadCredentials), 0x87);
    }

    #[test]
    fn a_reload_reaches_connected_clients() {
        let (d, cfg, _key) = setup("reload");
        let shared = SharedAuth::new(Auth::load(&cfg).unwrap());
        let mut alice = ConnAuth::connect(
            shared.clone(),
            creds(Some("alice"), Some("s3cret")),
            "c".into(),
            now(),
        )
        .unwrap();
        assert!(alice.may_publish("sensors/a"));
        // New rules: alice may only read.
        std::fs::write(d.0.join("acl"), "user alice\ntopic read sensors/#\n").unwrap();
        shared.reload(&cfg).unwrap();
        alice.refresh(now()).unwrap();
        assert!(!alice.may_publish("sensors/a"));
        assert!(alice.may_deliver("sensors/a"));
        // Her user removed: the connection must end.
        std::fs::write(d.0.join("passwd"), "").unwrap();
        shared.reload(&cfg).unwrap();
        let e = alice.refresh(now()).unwrap_err();
        assert_eq!(disconnect_code(&e), 0x87);
    }
}
