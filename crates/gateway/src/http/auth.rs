//! Who an HTTP request comes from: the JWT of `Authorization: Bearer` or of
//! the `?jwt=` query parameter (for `EventSource`, which cannot set
//! headers), verified once per request, and the RFC 6750 answers when it is
//! missing, invalid or not enough. A response that lasts (an SSE stream)
//! checks its request again on every reload of the auth ([`Recheck`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use http::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use http::request::Parts;
use http::{Response, StatusCode};
use percent_encoding::percent_decode_str;
use quichub_auth::{Access, AuthError, Identity, Method, SharedAuth};
use tokio::sync::watch;

use super::api::{error, ApiBody};

/// The protocol label of HTTP in the auth metrics.
pub const PROTOCOL: &str = "http";
/// The query parameter that carries a token.
pub const QUERY_PARAM: &str = "jwt";

/// The credentials of a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Credentials<'a> {
    /// None given.
    None,
    /// A bearer token (header or query), percent-decoded.
    Token(Cow<'a, str>),
    /// Something unusable: another `Authorization` scheme, or a query token
    /// that is not UTF-8 once decoded (400, `invalid_request`).
    Malformed(&'static str),
}

/// The credentials of `parts`: the `Authorization: Bearer` header if there
/// is one, else the first `jwt` query parameter.
pub fn credentials(parts: &Parts) -> Credentials<'_> {
    if let Some(v) = parts.headers.get(AUTHORIZATION) {
        let Some(token) = v.to_str().ok().and_then(bearer) else {
            return Credentials::Malformed("the Authorization scheme must be Bearer");
        };
        return Credentials::Token(Cow::Borrowed(token));
    }
    let Some(query) = parts.uri.query() else {
        return Credentials::None;
    };
    let Some(raw) = query
        .split('&')
        .find_map(|kv| kv.strip_prefix(QUERY_PARAM)?.strip_prefix('='))
    else {
        return Credentials::None;
    };
    match percent_decode_str(raw).decode_utf8() {
        Ok(t) if !t.is_empty() => Credentials::Token(t),
        Ok(_) => Credentials::None,
        Err(_) => Credentials::Malformed("the jwt query parameter is not UTF-8"),
    }
}

/// The token of an `Authorization` header value of scheme `Bearer` (the
/// scheme is case-insensitive, RFC 7235 §2.1).
fn bearer(v: &str) -> Option<&str> {
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Why a request is refused; [`Refusal::response`] is the answer.
#[derive(Debug)]
pub enum Refusal {
    /// Credentials that are not a bearer token: 400 `invalid_request`.
    Malformed(&'static str),
    /// No credentials where they are needed: 401, `WWW-Authenticate: Bearer`.
    NoCredentials,
    /// A token that did not authenticate: 401 `invalid_token`.
    InvalidToken(AuthError),
    /// Authenticated, but not allowed: 403 `insufficient_scope`.
    Forbidden,
}

impl Refusal {
    /// The answer to send.
    pub fn response(&self) -> Response<ApiBody> {
        match self {
            Refusal::Malformed(why) => challenge(StatusCode::BAD_REQUEST, "invalid_request", why),
            Refusal::NoCredentials => {
                let mut r = error(StatusCode::UNAUTHORIZED, "credentials required");
                r.headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                r
            }
            Refusal::InvalidToken(e) => {
                challenge(StatusCode::UNAUTHORIZED, "invalid_token", &e.to_string())
            }
            Refusal::Forbidden => challenge(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                "the token does not grant this",
            ),
        }
    }
}

/// Authenticates the request of `parts` with the auth in force: its token's
/// identity, or the anonymous one when it has none. Counts the outcome.
pub fn authenticate(auth: &SharedAuth, parts: &Parts) -> Result<Identity, Refusal> {
    let current = auth.get();
    let result = match credentials(parts) {
        Credentials::Malformed(why) => {
            auth.metrics.failure_reason(PROTOCOL, "malformed");
            return Err(Refusal::Malformed(why));
        }
        Credentials::Token(t) => current.jwt(&t, SystemTime::now()),
        Credentials::None => current.anonymous(""),
    };
    match result {
        Ok(id) => {
            auth.metrics.success(PROTOCOL, id.method());
            Ok(id)
        }
        Err(e) => {
            auth.metrics.failure(PROTOCOL, &e);
            Err(match e {
                AuthError::NoCredentials => Refusal::NoCredentials,
                e => Refusal::InvalidToken(e),
            })
        }
    }
}

/// A request's credentials, kept to check it again when the auth in force
/// changes: a long-lived response (an SSE stream) ends when a reload revokes
/// its token's key, or the public prefixes an anonymous request relied on.
pub struct Recheck {
    auth: Arc<SharedAuth>,
    token: Option<String>,
    changes: watch::Receiver<u64>,
}

impl Recheck {
    /// Keeps the credentials of `parts`. Made before the request is
    /// authenticated, so a reload from then on shows in [`Self::changed`].
    pub fn new(auth: Arc<SharedAuth>, parts: &Parts) -> Self {
        let changes = auth.subscribe();
        let token = match credentials(parts) {
            Credentials::Token(t) => Some(t.into_owned()),
            // Malformed credentials are refused before anything lasts.
            Credentials::None | Credentials::Malformed(_) => None,
        };
        Self {
            auth,
            token,
            changes,
        }
    }

    /// Resolves at the next reload of the auth; never once the auth is gone.
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether the credentials still authenticate, under the auth in force,
    /// and grant `access` to the MQTT `topic`. Counts a refusal.
    pub fn allows(&self, access: Access, topic: &str) -> bool {
        let auth = self.auth.get();
        let id = match &self.token {
            Some(t) => auth.jwt(t, SystemTime::now()),
            None => auth.anonymous(""),
        };
        match id {
            Ok(id) if id.may_topic(access, topic) => true,
            Ok(_) => {
                self.auth.metrics.failure_reason(PROTOCOL, "not_authorized");
                false
            }
            Err(e) => {
                self.auth.metrics.failure(PROTOCOL, &e);
                false
            }
        }
    }
}

/// The refusal of a request that `id` may not make: no credentials for an
/// anonymous client (a token may help), else forbidden. Counts it.
pub fn forbidden(auth: &SharedAuth, id: &Identity) -> Refusal {
    auth.metrics.failure_reason(PROTOCOL, "not_authorized");
    if id.method() == Method::Anonymous {
        Refusal::NoCredentials
    } else {
        Refusal::Forbidden
    }
}

/// An error answer with `WWW-Authenticate: Bearer error=..,
/// error_description=..` (RFC 6750 §3).
fn challenge(status: StatusCode, code: &'static str, description: &str) -> Response<ApiBody> {
    // error_description allows %x20-21 / %x23-5B / %x5D-7E: no quote, no
    // backslash, printable ASCII only.
    let desc: String = description
        .chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            c if (' '..='~').contains(&c) => c,
            _ => '?',
        })
        .collect();
    let value = format!("Bearer error=\"{code}\", error_description=\"{desc}\"");
    let mut r = error(status, description);
    if let Ok(v) = HeaderValue::from_str(&value) {
        r.headers_mut().insert(WWW_AUTHENTICATE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, authorization: Option<&str>) -> Parts {
        let mut b = http::Request::builder().uri(uri);
        if let Some(a) = authorization {
            b = b.header(AUTHORIZATION, a);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn token(p: &Parts) -> Option<String> {
        match credentials(p) {
            Credentials::Token(t) => Some(t.into_owned()),
            Credentials::None => None,
            Credentials::Malformed(why) => panic!("{why}"),
        }
    }

    #[test]
    fn header_then_query() {
        assert_eq!(token(&parts("/v1/t/a", Some("Bearer abc"))).unwrap(), "abc");
        assert_eq!(
            token(&parts("/v1/t/a", Some("bearer  abc "))).unwrap(),
            "abc"
        );
        assert_eq!(
            token(&parts("/v1/t/a?jwt=q", Some("Bearer h"))).unwrap(),
            "h"
        );
        assert_eq!(
            token(&parts("/v1/t/a?x=1&jwt=a.b.c&y", None)).unwrap(),
            "a.b.c"
        );
        assert_eq!(token(&parts("/v1/t/a?jwt=a%2Eb", None)).unwrap(), "a.b");
        assert_eq!(token(&parts("/v1/t/a?jwtx=1&xjwt=2", None)), None);
        assert_eq!(token(&parts("/v1/t/a?jwt=", None)), None);
        assert_eq!(token(&parts("/v1/t/a", None)), None);
        assert!(matches!(
            credentials(&parts("/", Some("Basic dXNlcjpwYXNz"))),
            Credentials::Malformed(_)
        ));
        assert!(matches!(
            credentials(&parts("/", Some("Bearer"))),
            Credentials::Malformed(_)
        ));
        assert!(matches!(
            credentials(&parts("/?jwt=%FF", None)),
            Credentials::Malformed(_)
        ));
    }

    #[test]
    fn challenges_are_valid_header_values() {
        let r =
            Refusal::InvalidToken(AuthError::BadToken("a \"quoted\"\\ value\n".into())).response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers()[WWW_AUTHENTICATE],
            "Bearer error=\"invalid_token\", error_description=\"malformed token: a 'quoted'' value?\""
        );
        let r = Refusal::NoCredentials.response();
        assert_eq!(r.headers()[WWW_AUTHENTICATE], "Bearer");
    }
}
