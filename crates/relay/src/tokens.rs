//! The relay's [`Authorizer`] over `quichub-auth`: who a session is comes
//! from a JWT in the URL query (`?jwt=`, moq-dev's convention, for raw QUIC
//! and WebTransport alike) or in CLIENT_SETUP's AUTHORIZATION TOKEN option;
//! each request may add tokens of its own (the AUTHORIZATION TOKEN parameter,
//! by value or by registered alias).
//!
//! A session without credentials is admitted with what anonymous clients may
//! do (the `public` prefixes, or nothing), so that a client authorising each
//! request with its own token still can; a request nothing allows is refused
//! with REQUEST_ERROR UNAUTHORIZED, and only that request. A token that is
//! present but invalid refuses the session at SETUP.
//!
//! A reload of the auth configuration reaches sessions already up at once:
//! one whose token no longer verifies (its key removed), or that was
//! admitted anonymously with public prefixes that are now gone, is closed
//! with UNAUTHORIZED; one that still authenticates keeps going, and each of
//! its open subscriptions whose track it may no longer read (by its identity
//! or by the subscription's own tokens) ends with PUBLISH_DONE UNAUTHORIZED.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use moqt::error::request_error;
use moqt::session::SessionError;
use moqt::token::{Token, TokenCache, TokenError};
use moqt::SessionErrorCode;
use quichub_auth::{Access, AuthError, Identity, SharedAuth};
use tokio::sync::watch;

use crate::access::{Authorizer, ConnectInfo, Denied, Operation, SessionAccess};
use crate::core::Refusal;

/// Label of MoQT outcomes in [`quichub_auth::AuthMetrics`].
const PROTOCOL: &str = "moqt";

/// Authorises sessions and requests with the [`quichub_auth::Auth`] in force.
pub struct TokenAuthorizer {
    auth: Arc<SharedAuth>,
    max_cache: u64,
    /// The token this relay presents to the other relays of its cluster
    /// (`cluster.token`): who presents it, or another token of its `sub`,
    /// is a member ([`SessionAccess::cluster_member`]).
    cluster_token: Option<String>,
}

impl TokenAuthorizer {
    /// Checks against `auth`; sessions may register up to `max_cache` bytes
    /// of token aliases (advertised as MAX_AUTH_TOKEN_CACHE_SIZE).
    pub fn new(auth: Arc<SharedAuth>, max_cache: u64) -> Arc<Self> {
        Self::for_cluster(auth, max_cache, "")
    }

    /// [`TokenAuthorizer::new`] for a relay of a cluster whose members
    /// present `cluster_token` (empty: none; then, outside the open mode,
    /// no session is a member).
    pub fn for_cluster(auth: Arc<SharedAuth>, max_cache: u64, cluster_token: &str) -> Arc<Self> {
        Arc::new(Self {
            auth,
            max_cache,
            cluster_token: (!cluster_token.is_empty()).then(|| cluster_token.to_string()),
        })
    }

    /// Whether a session that authenticated with `token` as `id` is a
    /// cluster member: it presented the cluster token itself, or a token
    /// (verified) with the cluster token's `sub`. In the open mode anyone
    /// is, as anyone may read everything there.
    fn member(
        &self,
        auth: &quichub_auth::Auth,
        token: Option<&str>,
        id: Option<&Identity>,
    ) -> bool {
        if auth.open() {
            return true;
        }
        let (Some(own), Some(token), Some(id)) = (&self.cluster_token, token, id) else {
            return false;
        };
        if id.method() != quichub_auth::Method::Jwt {
            return false;
        }
        if constant_time_eq(own.as_bytes(), token.as_bytes()) {
            return true;
        }
        let own_name = auth.jwt(own, SystemTime::now()).ok();
        let own_name = own_name.as_ref().and_then(|i| i.name());
        own_name.is_some() && own_name == id.name()
    }
}

/// Token comparison that takes as long wherever the first difference is
/// (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `jwt` parameter of a path's query, percent-decoded; an empty one
/// (`?jwt=`) is no token.
pub fn query_jwt(path: &str) -> Option<String> {
    let (_, query) = path.split_once('?')?;
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "jwt")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

fn session_error(e: TokenError) -> SessionError {
    match e {
        TokenError::Session(code, reason) => SessionError { code, reason },
        // Only per-request failures are request errors; at SETUP the
        // session is what the token was for.
        TokenError::Request(_, reason) => SessionError {
            code: SessionErrorCode::MalformedAuthToken,
            reason,
        },
    }
}

impl Authorizer for TokenAuthorizer {
    fn connect(&self, info: &ConnectInfo) -> Result<Arc<dyn SessionAccess>, SessionError> {
        // Before reading the auth: a reload from here on shows as a change.
        let changes = self.auth.subscribe();
        let generation = self.auth.generation();
        let auth = self.auth.get();
        let mut cache = TokenCache::new(self.max_cache);
        let mut token = info.path.as_deref().and_then(query_jwt);
        if let Some(raw) = &info.setup_token {
            let values = cache
                .resolve(std::slice::from_ref(raw), true)
                .map_err(session_error)?;
            if token.is_none() {
                if let Some(v) = values.first() {
                    token =
                        Some(
                            String::from_utf8(v.value.to_vec()).map_err(|_| SessionError {
                                code: SessionErrorCode::MalformedAuthToken,
                                reason: "AUTHORIZATION TOKEN is not UTF-8".into(),
                            })?,
                        );
                }
            }
        }
        let identity = match &token {
            Some(t) => match auth.jwt(t, SystemTime::now()) {
                Ok(id) => {
                    self.auth.metrics.success(PROTOCOL, id.method());
                    Some(id)
                }
                Err(e) => {
                    self.auth.metrics.failure(PROTOCOL, &e);
                    let code = match e {
                        AuthError::Expired => SessionErrorCode::ExpiredAuthToken,
                        _ => SessionErrorCode::Unauthorized,
                    };
                    return Err(SessionError {
                        code,
                        reason: format!("token refused: {e}"),
                    });
                }
            },
            None => match auth.anonymous("") {
                Ok(id) => {
                    self.auth.metrics.success(PROTOCOL, id.method());
                    Some(id)
                }
                // Requests may still bring their own tokens.
                Err(_) => None,
            },
        };
        Ok(Arc::new(TokenAccess {
            member: self.member(&auth, token.as_deref(), identity.as_ref()),
            auth: self.auth.clone(),
            changes,
            admitted: identity.is_some(),
            token,
            identity: Mutex::new((generation, identity)),
            cache: Mutex::new(cache),
        }))
    }

    fn max_token_cache(&self) -> u64 {
        self.max_cache
    }
}

/// One session's identity and registered token aliases.
struct TokenAccess {
    auth: Arc<SharedAuth>,
    /// A relay of the cluster ([`TokenAuthorizer::member`]).
    member: bool,
    /// Reloads since SETUP.
    changes: watch::Receiver<u64>,
    /// The session had an identity at SETUP (a token, or anonymous access to
    /// public prefixes): losing it closes the session. A session admitted
    /// without one lives on its requests' tokens, so a reload cannot take
    /// anything from it.
    admitted: bool,
    /// The session's token, to derive its identity again after a reload.
    token: Option<String>,
    /// The identity, and the [`SharedAuth::generation`] it was derived in.
    identity: Mutex<(u64, Option<Identity>)>,
    cache: Mutex<TokenCache>,
}

impl TokenAccess {
    /// The session's identity under the auth in force now: derived again
    /// when a reload happened since (a revoked key or public prefix then
    /// stops authorising this session's requests).
    fn identity(&self) -> Option<Identity> {
        let generation = self.auth.generation();
        let mut held = self.identity.lock().expect("identity");
        if held.0 != generation {
            *held = (generation, self.derive().ok());
        }
        held.1.clone()
    }

    /// The session's identity under the auth in force, derived now.
    fn derive(&self) -> Result<Identity, AuthError> {
        let auth = self.auth.get();
        match &self.token {
            Some(t) => auth.jwt(t, SystemTime::now()),
            None => auth.anonymous(""),
        }
    }

    /// The values of a request's raw AUTHORIZATION TOKEN structures, without
    /// applying them: an alias resolves to what is registered under it now.
    fn token_values(&self, raw: &[bytes::Bytes]) -> Vec<bytes::Bytes> {
        let cache = self.cache.lock().expect("token cache");
        raw.iter()
            .filter_map(Token::decode)
            .filter_map(|t| match t {
                Token::Register { value, .. } | Token::UseValue { value, .. } => Some(value),
                Token::UseAlias { alias } => cache.get(alias).map(|v| v.value.clone()),
                Token::Delete { .. } => None,
            })
            .collect()
    }
}

/// The request's namespace (and track) as a token path, `demo/bbb/video`:
/// what a grant is written against.
fn path(op: &Operation<'_>) -> String {
    op.namespace()
        .fields()
        .iter()
        .map(|f| &f[..])
        .chain(op.track_name())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join("/")
}

fn allows(id: &Identity, op: &Operation<'_>) -> bool {
    let access = if op.is_write() {
        Access::Write
    } else {
        Access::Read
    };
    let ns = op.namespace().fields();
    match op.track_name() {
        Some(name) => id.may_track(access, ns, Some(name)),
        None => id.may_prefix(access, ns),
    }
}

impl SessionAccess for TokenAccess {
    fn authorize(&self, op: &Operation<'_>) -> Result<(), Denied> {
        let mut refusal = None;
        if !op.tokens().is_empty() {
            // Aliases are registered even when the request is then refused
            // (draft-18 §9.2.1.1), so resolve before deciding.
            let values = self
                .cache
                .lock()
                .expect("token cache")
                .resolve(op.tokens(), false)
                .map_err(|e| match e {
                    TokenError::Session(code, reason) => {
                        Denied::Session(SessionError { code, reason })
                    }
                    TokenError::Request(code, reason) => {
                        Denied::Request(Refusal::new(code, reason))
                    }
                })?;
            let auth = self.auth.get();
            let now = SystemTime::now();
            for v in values {
                let Ok(t) = std::str::from_utf8(&v.value) else {
                    refusal = Some(Refusal::new(
                        request_error::MALFORMED_AUTH_TOKEN,
                        "token is not UTF-8",
                    ));
                    continue;
                };
                match auth.jwt(t, now) {
                    Ok(id) if allows(&id, op) => {
                        self.auth.metrics.success(PROTOCOL, id.method());
                        return Ok(());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.auth.metrics.failure(PROTOCOL, &e);
                        let code = match e {
                            AuthError::Expired => request_error::EXPIRED_AUTH_TOKEN,
                            AuthError::BadToken(_) => request_error::MALFORMED_AUTH_TOKEN,
                            _ => request_error::UNAUTHORIZED,
                        };
                        refusal = Some(Refusal::new(code, format!("token refused: {e}")));
                    }
                }
            }
        }
        if self.identity().is_some_and(|id| allows(&id, op)) {
            return Ok(());
        }
        self.auth
            .metrics
            .failure_reason(PROTOCOL, AuthError::NotAuthorized.reason());
        Err(refusal
            .unwrap_or_else(|| {
                Refusal::new(
                    request_error::UNAUTHORIZED,
                    format!(
                        "not authorized to {} {}",
                        if op.is_write() {
                            "publish"
                        } else {
                            "subscribe to"
                        },
                        path(op)
                    ),
                )
            })
            .into())
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.clone())
    }

    fn revalidate(&self) -> Result<(), SessionError> {
        let generation = self.auth.generation();
        let derived = self.derive();
        let refusal = match &derived {
            Err(e) if self.admitted => {
                self.auth.metrics.failure(PROTOCOL, e);
                let code = match e {
                    AuthError::Expired => SessionErrorCode::ExpiredAuthToken,
                    _ => SessionErrorCode::Unauthorized,
                };
                Some(SessionError {
                    code,
                    reason: format!("credentials revoked: {e}"),
                })
            }
            _ => None,
        };
        *self.identity.lock().expect("identity") = (generation, derived.ok());
        refusal.map_or(Ok(()), Err)
    }

    fn still_allows(&self, op: &Operation<'_>) -> bool {
        if self.identity().is_some_and(|id| allows(&id, op)) {
            return true;
        }
        let auth = self.auth.get();
        let now = SystemTime::now();
        self.token_values(op.tokens()).iter().any(|v| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|t| auth.jwt(t, now).ok())
                .is_some_and(|id| allows(&id, op))
        })
    }

    fn cluster_member(&self) -> bool {
        self.member
    }

    fn request_expires(&self, op: &Operation<'_>) -> Option<SystemTime> {
        if self.identity().is_some_and(|id| allows(&id, op)) {
            return None;
        }
        // The latest expiry among the request's tokens that allow it (one
        // without `exp` never expires).
        let auth = self.auth.get();
        let now = SystemTime::now();
        let mut latest: Option<Option<SystemTime>> = None;
        for v in self.token_values(op.tokens()) {
            let Some(id) = std::str::from_utf8(&v)
                .ok()
                .and_then(|t| auth.jwt(t, now).ok())
                .filter(|id| allows(id, op))
            else {
                continue;
            };
            latest = Some(match (latest, id.expires()) {
                (Some(None), _) | (_, None) => None,
                (Some(Some(a)), Some(b)) => Some(a.max(b)),
                (None, Some(b)) => Some(b),
            });
        }
        latest.flatten()
    }

    fn expires(&self) -> Option<SystemTime> {
        self.identity
            .lock()
            .expect("identity")
            .1
            .as_ref()
            .and_then(|id| id.expires())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_from_the_query() {
        assert_eq!(
            query_jwt("/moq?jwt=abc.def.ghi"),
            Some("abc.def.ghi".into())
        );
        assert_eq!(query_jwt("/?x=1&jwt=a%2Eb"), Some("a.b".into()));
        assert_eq!(query_jwt("/moq"), None);
        assert_eq!(query_jwt("/moq?jwtx=1"), None);
        assert_eq!(query_jwt("/moq?jwt="), None);
    }
}
