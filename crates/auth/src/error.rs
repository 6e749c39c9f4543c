//! Why authentication or authorisation failed.

use std::path::PathBuf;

/// An authentication failure (a peer's credentials) or a configuration
/// error (a key, password or ACL file that cannot be used).
///
/// [`AuthError::reason`] gives a short, fixed label per variant, for metrics
/// (`auth_failures_total{reason=...}`) and logs; the `Display` text may carry
/// detail for operators but never secrets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The token is not a well-formed JWT, or its claims are not moq-token
    /// claims.
    #[error("malformed token: {0}")]
    BadToken(String),
    /// The token's `exp` has passed (or its `nbf` has not come yet).
    #[error("token expired")]
    Expired,
    /// The token names a `kid` no configured key has, or has no `kid` while
    /// several keys are configured.
    #[error("no key for the token's kid")]
    UnknownKid,
    /// The token's `alg` is not the one its key is for (or is `none`).
    #[error("token algorithm does not match its key")]
    WrongAlgorithm,
    /// The token's signature does not verify with its key.
    #[error("bad token signature")]
    BadSignature,
    /// A token was presented but no JWT keys are configured.
    #[error("tokens are not accepted: no JWT key configured")]
    NoKeys,
    /// Unknown user or wrong password (deliberately not told apart).
    #[error("bad user name or password")]
    BadCredentials,
    /// Authenticated, but not allowed (e.g. a certificate name that is not a
    /// known user).
    #[error("not authorised")]
    NotAuthorized,
    /// No credentials, and anonymous clients are not accepted.
    #[error("credentials required")]
    NoCredentials,
    /// A configured file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A configured file is not valid (key, password or ACL file), with the
    /// line where that is known (1-based).
    #[error("{}{}: {msg}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Config {
        /// The file.
        path: PathBuf,
        /// The offending line, 1-based, when the format is line-based.
        line: Option<usize>,
        /// What is wrong.
        msg: String,
    },
    /// A key cannot be used for what was asked (e.g. signing with a public
    /// key, or an algorithm quichub cannot generate keys for).
    #[error("key: {0}")]
    Key(String),
}

impl AuthError {
    /// A short label for metrics, one per variant: `malformed`, `expired`,
    /// `unknown_kid`, `wrong_algorithm`, `bad_signature`, `no_keys`,
    /// `bad_credentials`, `not_authorized`, `no_credentials`, `io`, `config`,
    /// `key`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::BadToken(_) => "malformed",
            AuthError::Expired => "expired",
            AuthError::UnknownKid => "unknown_kid",
            AuthError::WrongAlgorithm => "wrong_algorithm",
            AuthError::BadSignature => "bad_signature",
            AuthError::NoKeys => "no_keys",
            AuthError::BadCredentials => "bad_credentials",
            AuthError::NotAuthorized => "not_authorized",
            AuthError::NoCredentials => "no_credentials",
            AuthError::Io { .. } => "io",
            AuthError::Config { .. } => "config",
            AuthError::Key(_) => "key",
        }
    }

    pub(crate) fn config(
        path: &std::path::Path,
        line: Option<usize>,
        msg: impl Into<String>,
    ) -> Self {
        AuthError::Config {
            path: path.to_path_buf(),
            line,
            msg: msg.into(),
        }
    }
}

/// Reads a configured file, naming it in the error.
pub(crate) fn read(path: &std::path::Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    })
}
