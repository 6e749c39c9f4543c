//! [`Auth`]: credentials in, [`Identity`] out; [`Identity`]: the
//! authorisation questions, one model for MoQT and MQTT.
//!
//! An identity's rights are the union of
//! - path prefixes: its JWT's `root`/`put` and `root`/`get`, and the
//!   configured `public` (read and write) and `public_read` prefixes, which
//!   every identity has;
//! - `acl_file` rules: its user's `topic` rules (the anonymous rules for an
//!   anonymous client; a JWT's `sub` is its user) and every `pattern`,
//!   matched against the MQTT topic a track carries;
//!
//! except that an `acl_file` `deny` rule that matches refuses whatever else
//! allows. A user authenticated by password or certificate while no
//! `acl_file` is configured may do everything (mosquitto's behaviour), as
//! may anyone in the open mode ([`AuthConfig::open`]: nothing at all
//! configured, which the exposure check allows only on loopback listeners
//! unless `allow_anonymous = true` says so). Outside the open mode a
//! credential that proves nothing (a user name without a password file
//! entry, a token without a key to check it) is worth no more than none:
//! the peer is anonymous (public prefixes, anonymous ACL rules) or refused.
//!
//! # JWT as an MQTT password
//! An MQTT client authenticates with a JWT by sending it as the password
//! with the user name [`JWT_USERNAME`] (`jwt`) or an empty/absent user name
//! (MQTT 5 allows a password without a user name). Any other user name is
//! looked up in the `password_file`, so a user called `jwt` there would be
//! shadowed only for passwords that look like a JWT.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

use crate::acl::{self, AclFile, Rule, Target, Verdict, Who};
use crate::jwt::{looks_like_jwt, Keys};
use crate::passwd::PasswordFile;
use crate::path::{topic_pieces, track_levels, track_pieces, Prefix};
use crate::{Access, AuthConfig, AuthError};

/// The MQTT user name that marks the password as a JWT.
pub const JWT_USERNAME: &str = "jwt";

/// How an identity was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// No credentials.
    Anonymous,
    /// A JWT (MoQT `?jwt=`/AUTHORIZATION TOKEN, HTTP bearer, MQTT password).
    Jwt,
    /// A `password_file` user.
    Password,
    /// A TLS client certificate's name.
    Certificate,
}

impl Method {
    /// A short label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Anonymous => "anonymous",
            Method::Jwt => "jwt",
            Method::Password => "password",
            Method::Certificate => "certificate",
        }
    }
}

/// Credential checking, built from an [`AuthConfig`] (files are read here).
/// Rebuild it to reload; identities already handed out keep their rights.
#[derive(Debug, Default)]
pub struct Auth {
    cfg: AuthConfig,
    keys: Keys,
    passwords: Option<PasswordFile>,
    acl: Option<AclFile>,
    public_put: Arc<[Prefix]>,
    public_get: Arc<[Prefix]>,
}

impl Auth {
    /// Reads the configured key, password and ACL files.
    pub fn load(cfg: &AuthConfig) -> Result<Auth, AuthError> {
        let keys = Keys::load(
            cfg.key.as_deref(),
            cfg.key_dir.as_deref(),
            cfg.jwks.as_deref(),
        )?
        .with_leeway(std::time::Duration::from_secs(cfg.leeway_s));
        let passwords = cfg
            .password_file
            .as_deref()
            .map(PasswordFile::load)
            .transpose()?;
        let acl = cfg.acl_file.as_deref().map(AclFile::load).transpose()?;
        let public: Vec<Prefix> = cfg.public.iter().map(|p| Prefix::join("", p)).collect();
        let public_get: Vec<Prefix> = public
            .iter()
            .cloned()
            .chain(cfg.public_read.iter().map(|p| Prefix::join("", p)))
            .collect();
        Ok(Auth {
            cfg: cfg.clone(),
            keys,
            passwords,
            acl,
            public_put: public.into(),
            public_get: public_get.into(),
        })
    }

    /// Whether any credential source (key(s), password file, ACL file) is
    /// configured.
    pub fn configured(&self) -> bool {
        self.cfg.configured()
    }

    /// The open mode: nothing configured, every peer may do everything
    /// ([`AuthConfig::open`]).
    pub fn open(&self) -> bool {
        self.cfg.open()
    }

    /// The configuration this was built from.
    pub fn config(&self) -> &AuthConfig {
        &self.cfg
    }

    /// A peer presenting a JWT (MoQT, HTTP), at time `now`.
    pub fn jwt(&self, token: &str, now: SystemTime) -> Result<Identity, AuthError> {
        self.jwt_for(token, None, now)
    }

    fn jwt_for(
        &self,
        token: &str,
        client_id: Option<&str>,
        now: SystemTime,
    ) -> Result<Identity, AuthError> {
        if self.keys.is_empty() {
            // No key to check it against: the token proves nothing, so it
            // grants what coming without one does (everything in the open
            // mode, the public prefixes otherwise), and a player URL that
            // keeps its `?jwt=` still works.
            return self.anonymous(client_id.unwrap_or(""));
        }
        let claims = self.keys.verify(token, now)?;
        let prefixes = |rel: &[String], patterns: &[String], public: &Arc<[Prefix]>| {
            rel.iter()
                .map(|p| Prefix::join(&claims.root, p))
                .chain(patterns.iter().map(|p| Prefix::pattern(&claims.root, p)))
                .chain(public.iter().cloned())
                .collect::<Arc<[Prefix]>>()
        };
        Ok(Identity {
            name: claims.sub.as_deref().map(Arc::from),
            client_id: client_id.map(Arc::from),
            method: Method::Jwt,
            expires: claims
                .expires()
                .map(|exp| exp.checked_add(self.keys.leeway()).unwrap_or(exp)),
            all: false,
            put: prefixes(&claims.put, &claims.publish, &self.public_put),
            get: prefixes(&claims.get, &claims.subscribe, &self.public_get),
            acl: self.acl.as_ref().map(|acl| AclRules {
                rules: match &claims.sub {
                    Some(u) => acl.user_rules(u),
                    None => Arc::from([]),
                },
                patterns: acl.patterns(),
            }),
        })
    }

    /// An MQTT CONNECT with user name and password (now = the system clock;
    /// see [`Auth::password_at`]).
    pub fn password(
        &self,
        user: &str,
        pass: &[u8],
        client_id: &str,
    ) -> Result<Identity, AuthError> {
        self.password_at(user, pass, client_id, SystemTime::now())
    }

    /// An MQTT CONNECT with user name and password at time `now` (which
    /// only matters when the password is a JWT: see the module docs).
    pub fn password_at(
        &self,
        user: &str,
        pass: &[u8],
        client_id: &str,
        now: SystemTime,
    ) -> Result<Identity, AuthError> {
        if (user.is_empty() || user == JWT_USERNAME)
            && looks_like_jwt(pass)
            && !self.keys.is_empty()
        {
            let token =
                std::str::from_utf8(pass).map_err(|_| AuthError::BadToken("not UTF-8".into()))?;
            return self.jwt_for(token, Some(client_id), now);
        }
        match &self.passwords {
            Some(file) if file.verify(user, pass) => {
                Ok(self.user(user, client_id, Method::Password))
            }
            Some(_) => Err(AuthError::BadCredentials),
            // The open mode: credentials are not checked (as before quichub
            // had auth), the name is kept for logs.
            None if self.open() => Ok(Identity {
                name: Some(user.into()),
                ..self.unrestricted(client_id)
            }),
            // No password file to check the name against: the name proves
            // nothing, so the client is anonymous (never the user it
            // claims to be: ACL `user` rules and `%u` do not apply) or, where
            // anonymous clients are refused, refused for its credentials.
            None => self
                .anonymous(client_id)
                .map_err(|_| AuthError::BadCredentials),
        }
    }

    /// A peer identified by its TLS client certificate's name
    /// (`use_identity_as_username`): that user's ACL rules apply.
    pub fn certificate(&self, name: &str, client_id: &str) -> Result<Identity, AuthError> {
        if name.is_empty() {
            return Err(AuthError::NotAuthorized);
        }
        Ok(self.user(name, client_id, Method::Certificate))
    }

    /// A peer without credentials: the public prefixes and the ACL file's
    /// anonymous rules, or everything in the open mode.
    /// `allow_anonymous = false` refuses; unset, an anonymous client is
    /// refused when auth is configured and grants anonymous clients nothing
    /// (no public prefix, no anonymous ACL rule).
    pub fn anonymous(&self, client_id: &str) -> Result<Identity, AuthError> {
        let has_public = !self.public_get.is_empty();
        let acl_anon = self
            .acl
            .as_ref()
            .is_some_and(|a| !a.anonymous_rules().is_empty());
        match self.cfg.allow_anonymous {
            Some(false) => return Err(AuthError::NoCredentials),
            None if self.configured() && !has_public && !acl_anon => {
                return Err(AuthError::NoCredentials)
            }
            _ => {}
        }
        if self.open() {
            return Ok(self.unrestricted(client_id));
        }
        Ok(Identity {
            name: None,
            client_id: Some(client_id.into()),
            method: Method::Anonymous,
            expires: None,
            all: false,
            put: self.public_put.clone(),
            get: self.public_get.clone(),
            acl: self.acl.as_ref().map(|acl| AclRules {
                rules: acl.anonymous_rules(),
                patterns: acl.patterns(),
            }),
        })
    }

    fn unrestricted(&self, client_id: &str) -> Identity {
        Identity {
            name: None,
            client_id: Some(client_id.into()),
            method: Method::Anonymous,
            expires: None,
            all: true,
            put: Arc::from([]),
            get: Arc::from([]),
            acl: None,
        }
    }

    fn user(&self, user: &str, client_id: &str, method: Method) -> Identity {
        Identity {
            name: Some(user.into()),
            client_id: Some(client_id.into()),
            method,
            expires: None,
            all: self.acl.is_none(),
            put: self.public_put.clone(),
            get: self.public_get.clone(),
            acl: self.acl.as_ref().map(|acl| AclRules {
                rules: acl.user_rules(user),
                patterns: acl.patterns(),
            }),
        }
    }
}

/// Whether the MoQT track or namespace carries MQTT `$SYS` topics, which
/// only the broker writes: whoever may publish under (`mqtt`) must not forge
/// its statistics through the gateway, over MoQT any more than over MQTT.
fn writes_sys(ns: &[Bytes], name: Option<&[u8]>) -> bool {
    let mut fields = ns.iter().map(|f| &f[..]).chain(name);
    fields.next() == Some(crate::path::MQTT_ROOT.as_bytes())
        && fields.next().is_some_and(|f| f.starts_with(b"$SYS"))
}

#[derive(Debug, Clone)]
struct AclRules {
    rules: Arc<[Rule]>,
    patterns: Arc<[Rule]>,
}

/// An authenticated (or anonymous) peer and what it may do. Cheap to clone;
/// the `may_*` checks allocate nothing.
#[derive(Debug, Clone)]
pub struct Identity {
    name: Option<Arc<str>>,
    client_id: Option<Arc<str>>,
    method: Method,
    expires: Option<SystemTime>,
    /// Everything allowed (nothing configured, or a user without ACL file).
    all: bool,
    put: Arc<[Prefix]>,
    get: Arc<[Prefix]>,
    acl: Option<AclRules>,
}

impl Identity {
    /// The user name (password/certificate user, or the JWT's `sub`).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The MQTT client id, when the peer is an MQTT client.
    pub fn client_id(&self) -> Option<&str> {
        self.client_id.as_deref()
    }

    /// How the identity was established.
    pub fn method(&self) -> Method {
        self.method
    }

    /// When the credentials expire (a JWT's `exp` plus the configured
    /// leeway): the session must end then.
    pub fn expires(&self) -> Option<SystemTime> {
        self.expires
    }

    /// Whether every check passes (nothing configured, or a password user
    /// while no ACL file is configured).
    pub fn unrestricted(&self) -> bool {
        self.all
    }

    fn who(&self) -> Who<'_> {
        Who {
            username: self.name.as_deref(),
            client_id: self.client_id.as_deref(),
        }
    }

    fn prefixes(&self, a: Access) -> &[Prefix] {
        match a {
            Access::Read => &self.get,
            Access::Write => &self.put,
        }
    }

    fn acl<'a, I>(&self, a: Access, target: Target, levels: I) -> Verdict
    where
        I: Iterator<Item = &'a str> + Clone,
    {
        match &self.acl {
            Some(r) => acl::check(&r.rules, &r.patterns, &self.who(), a, target, levels),
            None => Verdict::NoMatch,
        }
    }

    /// A MoQT track: namespace fields + track name. With `name = None`, the
    /// same as [`Identity::may_prefix`].
    pub fn may_track(&self, a: Access, ns: &[Bytes], name: Option<&[u8]>) -> bool {
        let Some(name) = name else {
            return self.may_prefix(a, ns);
        };
        if a == Access::Write && writes_sys(ns, Some(name)) {
            return false;
        }
        if self.all {
            return true;
        }
        if let Some(levels) = track_levels(ns, Some(name)) {
            match self.acl(a, Target::Topic, levels) {
                Verdict::Allow => return true,
                Verdict::Deny => return false,
                Verdict::NoMatch => {}
            }
        }
        self.prefixes(a)
            .iter()
            .any(|p| p.covers(track_pieces(ns, Some(name)), true))
    }

    /// Every track under the namespace prefix `ns` (PUBLISH_NAMESPACE,
    /// SUBSCRIBE_NAMESPACE, SUBSCRIBE_TRACKS). Strict: an ACL `deny` rule
    /// overlapping any topic under `ns` refuses the whole prefix.
    pub fn may_prefix(&self, a: Access, ns: &[Bytes]) -> bool {
        if a == Access::Write && writes_sys(ns, None) {
            return false;
        }
        if self.all {
            return true;
        }
        if let Some(levels) = track_levels(ns, None) {
            // Tracks under (mqtt, a, b) carry the topics `a/b/+/#`; under
            // (mqtt), every topic.
            let tail: &[&str] = if ns.len() == 1 { &["#"] } else { &["+", "#"] };
            match self.acl(a, Target::AllOf, levels.chain(tail.iter().copied())) {
                Verdict::Allow => return true,
                Verdict::Deny => return false,
                Verdict::NoMatch => {}
            }
        }
        self.prefixes(a)
            .iter()
            .any(|p| p.covers(track_pieces(ns, None), false))
    }

    /// An MQTT topic name (publish, delivery). Clients never publish to
    /// `$SYS/...` (as mosquitto).
    pub fn may_topic(&self, a: Access, topic: &str) -> bool {
        if a == Access::Write && topic.starts_with("$SYS") {
            return false;
        }
        if self.all {
            return true;
        }
        match self.acl(a, Target::Topic, topic.split('/')) {
            Verdict::Allow => return true,
            Verdict::Deny => return false,
            Verdict::NoMatch => {}
        }
        self.prefixes(a)
            .iter()
            .any(|p| p.covers(topic_pieces(topic.split('/')), true))
    }

    /// An MQTT topic filter (SUBSCRIBE), as mosquitto 2 checks it: allowed
    /// when a read rule or `get` prefix covers every topic it can match.
    pub fn may_filter(&self, filter: &str) -> bool {
        if self.all {
            return true;
        }
        match self.acl(Access::Read, Target::Filter, filter.split('/')) {
            Verdict::Allow => return true,
            Verdict::Deny => return false,
            Verdict::NoMatch => {}
        }
        // The levels before the first wildcard bound every matching topic
        // (`#` also matches its parent, which is that same path).
        let literal = || filter.split('/').take_while(|l| *l != "+" && *l != "#");
        self.get
            .iter()
            .any(|p| p.covers(topic_pieces(literal()), false))
    }
}

#[cfg(test)]
mod tests;
