//! The `[auth]` section of quichub's configuration.

use std::path::PathBuf;

/// What authenticates peers and what anonymous peers may do. The default
/// configures nothing: see [`AuthConfig::configured`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// JWT verification key for tokens without a `kid` (a JWK JSON file, a
    /// PEM public key, or a raw HMAC secret in a file named `*.secret`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// Directory of JWT verification keys, one file per `kid` (the file name
    /// without extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_dir: Option<PathBuf>,
    /// JWKS file (`{"keys": [...]}`), keys chosen by `kid`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks: Option<PathBuf>,
    /// Namespace/topic path prefixes anyone may publish and subscribe to
    /// without credentials (moq-relay's `public`), e.g. `"anon"`.
    pub public: Vec<String>,
    /// Path prefixes anyone may subscribe to (not publish) without credentials.
    pub public_read: Vec<String>,
    /// mosquitto `password_file` (`mosquitto_passwd` output, used unchanged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// mosquitto `acl_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acl_file: Option<PathBuf>,
    /// Whether clients without credentials are accepted. Unset: only on
    /// loopback listeners while nothing else is configured (mosquitto 2's
    /// safe default). `true` with nothing else configured is the open mode
    /// ([`AuthConfig::open`]): no authentication at all, on every listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_anonymous: Option<bool>,
    /// Bytes of MoQT token aliases one session may register
    /// (MAX_AUTH_TOKEN_CACHE_SIZE, 16 per token plus its length); 0 forbids
    /// aliases.
    pub max_token_cache: u64,
    /// Seconds a JWT is still accepted after its `exp` (and before its
    /// `nbf`), for issuers whose clock is not ours; a session it admitted
    /// ends that long after `exp` too. 0: none.
    pub leeway_s: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            key: None,
            key_dir: None,
            jwks: None,
            public: Vec::new(),
            public_read: Vec::new(),
            password_file: None,
            acl_file: None,
            allow_anonymous: None,
            max_token_cache: 16 * 1024,
            leeway_s: crate::jwt::DEFAULT_LEEWAY.as_secs(),
        }
    }
}

impl AuthConfig {
    /// The open mode, the only one in which a peer without valid
    /// credentials may do everything: nothing configured at all (no
    /// credential source, no public prefix) and anonymous clients not
    /// refused. It is what a loopback relay runs with by default;
    /// [`crate::Auth`] then checks no credentials (a user name is kept for
    /// logs only). Anything configured, even only `public` prefixes, ends
    /// it: from then on a peer's rights come from what it proved.
    pub fn open(&self) -> bool {
        !self.configured()
            && self.public.is_empty()
            && self.public_read.is_empty()
            && self.allow_anonymous != Some(false)
    }

    /// Whether any credential source (keys, password file, ACL file) is set.
    pub fn configured(&self) -> bool {
        self.key.is_some()
            || self.key_dir.is_some()
            || self.jwks.is_some()
            || self.password_file.is_some()
            || self.acl_file.is_some()
    }
}
