//! The AUTHORIZATION TOKEN structure and the per-session token cache
//! (draft-18 §9.2.1.1 and the MAX_AUTH_TOKEN_CACHE_SIZE setup option).
//!
//! A token either travels by value (USE_VALUE) or is registered once under a
//! session-specific alias (REGISTER) and then referred to (USE_ALIAS) until
//! retired (DELETE). [`TokenCache`] applies those rules to the raw parameter
//! values of one message and hands back the token values that authorise it;
//! what a value means (a JWT, a CAT, ...) is the embedder's business.

use std::collections::HashMap;

use bytes::Bytes;

use crate::coding::{get_vi64, put_vi64};
use crate::error::request_error;
use crate::SessionErrorCode;

/// Alias Type code points.
#[allow(missing_docs)]
pub mod alias_type {
    pub const DELETE: u64 = 0x0;
    pub const REGISTER: u64 = 0x1;
    pub const USE_ALIAS: u64 = 0x2;
    pub const USE_VALUE: u64 = 0x3;
}

/// What a cache entry costs against MAX_AUTH_TOKEN_CACHE_SIZE beyond its value.
pub const ENTRY_OVERHEAD: u64 = 16;

/// Most AUTHORIZATION TOKEN values one message may carry. The draft sets no
/// bound, but a 64 KiB control message fits thousands of tiny ones, each
/// costing a signature check and the uniqueness check a comparison with
/// every other; real clients send one or two.
pub const MAX_TOKENS_PER_MESSAGE: usize = 16;

/// One decoded Token structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// Retire an alias.
    Delete {
        /// The alias.
        alias: u64,
    },
    /// Bind an alias to a type and value, and use it.
    Register {
        /// The alias.
        alias: u64,
        /// Token Type.
        kind: u64,
        /// Token Value.
        value: Bytes,
    },
    /// Use the type and value registered under an alias.
    UseAlias {
        /// The alias.
        alias: u64,
    },
    /// Use a type and value given here.
    UseValue {
        /// Token Type.
        kind: u64,
        /// Token Value.
        value: Bytes,
    },
}

impl Token {
    /// Decodes one parameter value. `None`: not a Token structure (unknown
    /// Alias Type, truncated fields), which closes the session with
    /// KEY_VALUE_FORMATTING_ERROR.
    pub fn decode(raw: &Bytes) -> Option<Token> {
        let mut b: &[u8] = raw;
        let ty = get_vi64(&mut b).ok()?;
        let token = match ty {
            alias_type::DELETE | alias_type::USE_ALIAS => {
                let alias = get_vi64(&mut b).ok()?;
                if !b.is_empty() {
                    return None;
                }
                if ty == alias_type::DELETE {
                    Token::Delete { alias }
                } else {
                    Token::UseAlias { alias }
                }
            }
            alias_type::REGISTER => {
                let alias = get_vi64(&mut b).ok()?;
                let kind = get_vi64(&mut b).ok()?;
                let value = raw.slice(raw.len() - b.len()..);
                Token::Register { alias, kind, value }
            }
            alias_type::USE_VALUE => {
                let kind = get_vi64(&mut b).ok()?;
                let value = raw.slice(raw.len() - b.len()..);
                Token::UseValue { kind, value }
            }
            _ => return None,
        };
        Some(token)
    }

    /// Encodes the structure (the parameter's value).
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::new();
        match self {
            Token::Delete { alias } => {
                put_vi64(&mut out, alias_type::DELETE);
                put_vi64(&mut out, *alias);
            }
            Token::Register { alias, kind, value } => {
                put_vi64(&mut out, alias_type::REGISTER);
                put_vi64(&mut out, *alias);
                put_vi64(&mut out, *kind);
                out.extend_from_slice(value);
            }
            Token::UseAlias { alias } => {
                put_vi64(&mut out, alias_type::USE_ALIAS);
                put_vi64(&mut out, *alias);
            }
            Token::UseValue { kind, value } => {
                put_vi64(&mut out, alias_type::USE_VALUE);
                put_vi64(&mut out, *kind);
                out.extend_from_slice(value);
            }
        }
        Bytes::from(out)
    }
}

/// Why the tokens of a message could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// Close the session with this code.
    Session(SessionErrorCode, String),
    /// Refuse this request with this REQUEST_ERROR code.
    Request(u64, String),
}

/// A resolved token: its type and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenValue {
    /// Token Type (0: negotiated out of band).
    pub kind: u64,
    /// Token Value.
    pub value: Bytes,
}

/// The aliases one peer registered in one session, bounded by the
/// MAX_AUTH_TOKEN_CACHE_SIZE we advertised.
#[derive(Debug, Default)]
pub struct TokenCache {
    max_size: u64,
    used: u64,
    entries: HashMap<u64, TokenValue>,
}

impl TokenCache {
    /// A cache holding at most `max_size` bytes (16 per entry plus its value;
    /// 0 forbids aliases, the draft's default).
    pub fn new(max_size: u64) -> Self {
        Self {
            max_size,
            ..Self::default()
        }
    }

    /// Bytes currently charged against the limit.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The token registered under `alias`, if any; changes nothing (for
    /// checking a request again, after its REGISTERs were applied).
    pub fn get(&self, alias: u64) -> Option<&TokenValue> {
        self.entries.get(&alias)
    }

    /// Resolves the AUTHORIZATION TOKEN values of one message: applies its
    /// REGISTERs and DELETEs and returns the tokens that authorise it, in
    /// order. `setup`: the values come from CLIENT_SETUP, where DELETE and
    /// USE_ALIAS are protocol violations and a REGISTER over the limit is
    /// used by value instead of failing.
    pub fn resolve(&mut self, raw: &[Bytes], setup: bool) -> Result<Vec<TokenValue>, TokenError> {
        if raw.len() > MAX_TOKENS_PER_MESSAGE {
            return Err(TokenError::Request(
                request_error::MALFORMED_AUTH_TOKEN,
                format!(
                    "{} AUTHORIZATION TOKEN values, at most {MAX_TOKENS_PER_MESSAGE}",
                    raw.len()
                ),
            ));
        }
        let mut out = Vec::with_capacity(raw.len());
        // Decode everything first: a malformed structure anywhere closes the
        // session before any alias changes.
        let mut tokens = Vec::with_capacity(raw.len());
        for r in raw {
            tokens.push(Token::decode(r).ok_or_else(|| {
                TokenError::Session(
                    SessionErrorCode::KeyValueFormattingError,
                    "malformed AUTHORIZATION TOKEN".into(),
                )
            })?);
        }
        for t in tokens {
            match t {
                Token::Delete { alias } | Token::UseAlias { alias } if setup => {
                    let _ = alias;
                    return Err(TokenError::Session(
                        SessionErrorCode::ProtocolViolation,
                        "DELETE or USE_ALIAS token in SETUP".into(),
                    ));
                }
                Token::Delete { alias } => {
                    let Some(e) = self.entries.remove(&alias) else {
                        return Err(TokenError::Session(
                            SessionErrorCode::UnknownAuthTokenAlias,
                            format!("DELETE of unknown token alias {alias}"),
                        ));
                    };
                    self.used -= ENTRY_OVERHEAD + e.value.len() as u64;
                }
                Token::UseAlias { alias } => match self.entries.get(&alias) {
                    Some(v) => out.push(v.clone()),
                    None => {
                        return Err(TokenError::Session(
                            SessionErrorCode::UnknownAuthTokenAlias,
                            format!("unknown token alias {alias}"),
                        ))
                    }
                },
                Token::Register { alias, kind, value } => {
                    let cost = ENTRY_OVERHEAD + value.len() as u64;
                    let v = TokenValue { kind, value };
                    if self.used + cost > self.max_size {
                        if setup {
                            out.push(v);
                            continue;
                        }
                        return Err(TokenError::Session(
                            SessionErrorCode::AuthTokenCacheOverflow,
                            format!(
                                "token cache overflow: {} + {cost} bytes over {}",
                                self.used, self.max_size
                            ),
                        ));
                    }
                    if self.entries.contains_key(&alias) {
                        return Err(TokenError::Session(
                            SessionErrorCode::DuplicateAuthTokenAlias,
                            format!("token alias {alias} registered twice"),
                        ));
                    }
                    self.used += cost;
                    self.entries.insert(alias, v.clone());
                    out.push(v);
                }
                Token::UseValue { kind, value } => out.push(TokenValue { kind, value }),
            }
        }
        // "MAY be repeated as long as the combination of Token Type and Token
        // Value are unique after resolving any aliases."
        for (i, a) in out.iter().enumerate() {
            if out[..i].contains(a) {
                return Err(TokenError::Request(
                    request_error::MALFORMED_AUTH_TOKEN,
                    "the same token twice in one message".into(),
                ));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(alias: u64, v: &'static [u8]) -> Bytes {
        Token::Register {
            alias,
            kind: 0,
            value: Bytes::from_static(v),
        }
        .encode()
    }

    #[test]
    fn structures_round_trip() {
        for t in [
            Token::Delete { alias: 7 },
            Token::UseAlias { alias: 1 << 40 },
            Token::Register {
                alias: 3,
                kind: 0,
                value: Bytes::from_static(b"eyJ"),
            },
            Token::UseValue {
                kind: 9,
                value: Bytes::new(),
            },
        ] {
            assert_eq!(Token::decode(&t.encode()), Some(t));
        }
        for bad in [&b""[..], b"\x04\x00", b"\x00", b"\x00\x01\x02", b"\x01\x01"] {
            assert_eq!(Token::decode(&Bytes::from_static(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn register_use_delete() {
        let mut c = TokenCache::new(100);
        let v = c.resolve(&[reg(1, b"abc")], false).unwrap();
        assert_eq!(v[0].value, &b"abc"[..]);
        assert_eq!(c.used(), 19);
        let v = c
            .resolve(&[Token::UseAlias { alias: 1 }.encode()], false)
            .unwrap();
        assert_eq!(v[0].value, &b"abc"[..]);
        // Registering a live alias again closes the session.
        assert!(matches!(
            c.resolve(&[reg(1, b"x")], false),
            Err(TokenError::Session(
                SessionErrorCode::DuplicateAuthTokenAlias,
                _
            ))
        ));
        c.resolve(&[Token::Delete { alias: 1 }.encode()], false)
            .unwrap();
        assert_eq!(c.used(), 0);
        assert!(matches!(
            c.resolve(&[Token::UseAlias { alias: 1 }.encode()], false),
            Err(TokenError::Session(
                SessionErrorCode::UnknownAuthTokenAlias,
                _
            ))
        ));
        // Re-registering after DELETE is allowed.
        c.resolve(&[reg(1, b"abc")], false).unwrap();
    }

    #[test]
    fn the_limit_is_enforced_except_in_setup() {
        let mut c = TokenCache::new(0);
        assert!(matches!(
            c.resolve(&[reg(1, b"abc")], false),
            Err(TokenError::Session(
                SessionErrorCode::AuthTokenCacheOverflow,
                _
            ))
        ));
        // In SETUP, an over-limit REGISTER is used by value.
        let v = c.resolve(&[reg(1, b"abc")], true).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(c.used(), 0);
        assert!(matches!(
            c.resolve(&[Token::UseAlias { alias: 1 }.encode()], true),
            Err(TokenError::Session(SessionErrorCode::ProtocolViolation, _))
        ));
    }

    #[test]
    fn too_many_tokens_in_one_message_are_refused() {
        let mut c = TokenCache::new(1 << 20);
        let many: Vec<Bytes> = (0..=MAX_TOKENS_PER_MESSAGE)
            .map(|i| {
                Token::UseValue {
                    kind: 0,
                    value: Bytes::from(vec![b'a'; i + 1]),
                }
                .encode()
            })
            .collect();
        assert!(matches!(
            c.resolve(&many, false),
            Err(TokenError::Request(request_error::MALFORMED_AUTH_TOKEN, _))
        ));
        assert_eq!(
            c.resolve(&many[..MAX_TOKENS_PER_MESSAGE], false)
                .unwrap()
                .len(),
            MAX_TOKENS_PER_MESSAGE
        );
    }

    #[test]
    fn malformed_and_duplicates() {
        let mut c = TokenCache::new(1000);
        assert!(matches!(
            c.resolve(&[Bytes::from_static(b"\x09")], false),
            Err(TokenError::Session(
                SessionErrorCode::KeyValueFormattingError,
                _
            ))
        ));
        let same = Token::UseValue {
            kind: 0,
            value: Bytes::from_static(b"t"),
        }
        .encode();
        assert!(matches!(
            c.resolve(&[same.clone(), same], false),
            Err(TokenError::Request(request_error::MALFORMED_AUTH_TOKEN, _))
        ));
    }
}
