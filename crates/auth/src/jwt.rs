//! JWT bearer tokens compatible with moq-dev's `moq-token` / `moq-relay`.
//!
//! # Claims
//! `root` (string), `put` and `get` (a string or an array of strings),
//! `cluster` (bool), `exp`, `iat` (Unix seconds), as moq-token; `sub` (the
//! user, whose `acl_file` rules the token also gets) and `nbf` are read too.
//! A permission prefix is `root` joined with each `put`/`get` entry by `/`,
//! normalised and matched on path boundaries (see [`crate::path`]): `put:
//! "bbb"` under `root: "demo"` allows (demo, bbb) and (demo, bbb, x), not
//! (demo, bbbx); an empty entry means everything under `root`.
//!
//! Newer moq-token (moq-cli 0.14) also writes `publish` and `subscribe`
//! patterns when a grant is not a whole subtree: `x/**` is the subtree `x`
//! (what legacy `put: "x"` means), `x` the broadcast `x` and its tracks only,
//! `*` any one segment, `**` everything; these are honoured the same way
//! (checked against tokens and keys made by `moq auth` in the tests).
//! `quichub token sign` writes `put`/`get`, which every moq-token reads.
//!
//! # Keys
//! A key file is any of:
//! - a JWK as `moq-token generate` writes it: JSON, or that JSON in base64url
//!   (older moq-token files), `kty` defaulting to `oct` and `key_ops` to sign
//!   and verify as moq-token does; `oct` (HS256/384/512), `EC` (P-256 ES256,
//!   P-384 ES384), `OKP` (Ed25519, EdDSA) and `RSA` (RS*/PS*, verify only);
//! - a PEM public key (`PUBLIC KEY`, `RSA PUBLIC KEY`) or PKCS#8/PKCS#1
//!   private key (`PRIVATE KEY`, `RSA PRIVATE KEY`, as `openssl genpkey`
//!   writes them), the file starting with its `-----BEGIN` line;
//! - a raw HMAC secret, only in a file whose name ends in `.secret` (the
//!   file's bytes, a trailing newline dropped, at least 32 of them), for
//!   sharing one secret with JWT libraries that take raw bytes.
//!
//! Anything else is refused, naming what it looks like (an OpenSSH key, DER,
//! text before a PEM block). A file of unknown format used to become an HMAC
//! secret, and since a key file is often public (an `ssh-ed25519 AAAA…`
//! line, a certificate bundle), whoever could read it could then sign HS256
//! tokens: a secret has to be declared, by its JWK's `kty: oct` (what
//! moq-token and `quichub token generate-key` write) or by its file name.
//!
//! Keys come from one key file (used for tokens without `kid`, and for its
//! own `kid` if it has one), a directory of key files named `KID` or
//! `KID.ext`, and a JWKS file (`{"keys": [...]}`), keys chosen by `kid`. A
//! token's `alg` must be its key's: a JWK's `alg`, or for a key without one
//! (PEM, raw secret, a JWKS entry without `alg`) any algorithm of the key's
//! type (HS* for secrets, RS*/PS* for RSA, the curve's for EC/OKP).
//!
//! # Deviations from moq-token, on purpose
//! - HMAC secrets shorter than 32 bytes are refused (moq-token ≥ 0.7 does
//!   the same for JWKs; here `.secret` files too).
//! - A token with neither `put` nor `get` is refused as moq-token does,
//!   unless it has a `sub` (its rights then come from the ACL file).
//! - `exp` (and `nbf`) are checked against the caller's clock with the
//!   leeway [`Keys`] is given (`auth.leeway_s`, by default
//!   [`DEFAULT_LEEWAY`], jsonwebtoken's default that moq-token uses);
//!   [`Key::verify`] alone has none.
//! - `cluster` is read and kept but grants nothing (moq-dev deprecated it).
//! - The connection URL's path is not a root: quichub namespaces are
//!   absolute, so `root` only prefixes `put`/`get`.
//!
//! Signature verification and signing are `jsonwebtoken`'s; the JWK
//! fields are read with serde here because `jsonwebtoken` 9's `Jwk` has no
//! private-key members and none of moq-token's defaults. Keys are generated
//! with `ring`; the fixed PKCS#8 layouts `ring` itself uses for EC keys are
//! the only DER written here (see [`ec_pkcs8`]).

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
pub use jsonwebtoken::Algorithm;
use jsonwebtoken::{DecodingKey, EncodingKey, Header, Validation};
use ring::rand::SecureRandom;
use ring::signature::{self, KeyPair};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::AuthError;

/// Shortest accepted HMAC secret, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

/// The extension that declares a key file a raw HMAC secret.
pub const SECRET_EXTENSION: &str = "secret";

/// The clock leeway on `exp` and `nbf` unless configured otherwise: 60 s,
/// jsonwebtoken's default and so moq-token's and moq-relay's, so a token
/// one of them accepts is not refused here for a clock a few seconds off.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

/// The claims of a moq-token JWT (plus `sub` and `nbf`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Prefix of every `put`/`get` path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub root: String,
    /// Paths (under `root`) the bearer may publish.
    #[serde(
        default,
        deserialize_with = "string_or_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub put: Vec<String>,
    /// Paths (under `root`) the bearer may subscribe to.
    #[serde(
        default,
        deserialize_with = "string_or_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub get: Vec<String>,
    /// Patterns (under `root`) the bearer may publish, as newer moq-token
    /// writes them: `x/**` a subtree, `x` the broadcast `x` only, `*` any
    /// one segment.
    #[serde(
        default,
        deserialize_with = "string_or_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub publish: Vec<String>,
    /// Patterns (under `root`) the bearer may subscribe to (as `publish`).
    #[serde(
        default,
        deserialize_with = "string_or_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subscribe: Vec<String>,
    /// moq-dev's (deprecated) cluster-node flag: kept, grants nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster: bool,
    /// The user the token stands for (its `acl_file` rules apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    /// Expiry, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    /// Issue time, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    /// Not valid before, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
}

fn string_or_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

impl Claims {
    /// The expiry as a time (`None` also for an `exp` too far ahead for
    /// the system's clock to hold, which is as good as never).
    pub fn expires(&self) -> Option<SystemTime> {
        self.exp
            .and_then(|s| UNIX_EPOCH.checked_add(Duration::from_secs(s)))
    }

    fn validate(&self, now: SystemTime, leeway: Duration) -> Result<(), AuthError> {
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let leeway = leeway.as_secs();
        if self
            .exp
            .is_some_and(|exp| exp.saturating_add(leeway) <= now)
            || self.nbf.is_some_and(|nbf| nbf > now.saturating_add(leeway))
        {
            return Err(AuthError::Expired);
        }
        if self.put.is_empty()
            && self.get.is_empty()
            && self.publish.is_empty()
            && self.subscribe.is_empty()
            && self.sub.is_none()
        {
            return Err(AuthError::BadToken("no put, get or sub claim".into()));
        }
        Ok(())
    }
}

/// A signing and/or verification key.
pub struct Key {
    kid: Option<String>,
    algs: Vec<Algorithm>,
    decoding: Option<DecodingKey>,
    encoding: Option<EncodingKey>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("algs", &self.algs)
            .field("verify", &self.decoding.is_some())
            .field("sign", &self.encoding.is_some())
            .finish()
    }
}

const HS: &[Algorithm] = &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
const RSA: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// Fields of a JWK (RFC 7517/7518/8037) that quichub reads.
#[derive(Deserialize)]
struct RawJwk {
    kty: Option<String>,
    alg: Option<String>,
    kid: Option<String>,
    key_ops: Option<Vec<String>>,
    crv: Option<String>,
    k: Option<String>,
    x: Option<String>,
    y: Option<String>,
    d: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

fn b64url(s: &Option<String>, what: &str) -> Result<Vec<u8>, String> {
    let s = s
        .as_deref()
        .ok_or_else(|| format!("JWK without `{what}`"))?;
    URL_SAFE_NO_PAD
        .decode(s)
        .or_else(|_| URL_SAFE.decode(s))
        .map_err(|e| format!("JWK `{what}`: {e}"))
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn jwt_err(e: jsonwebtoken::errors::Error) -> String {
    e.to_string()
}

impl Key {
    /// Reads a key file: a JWK (JSON or base64url), a PEM key, or, when
    /// the file's name ends in `.secret`, a raw HMAC secret. Errors name
    /// the file.
    pub fn from_file(path: &Path) -> Result<Key, AuthError> {
        let bytes = crate::error::read(path)?;
        let declared_secret = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case(SECRET_EXTENSION));
        let key = if declared_secret {
            Key::from_secret(&bytes)
        } else {
            Key::parse(&bytes)
        };
        key.map_err(|m| AuthError::config(path, None, m))
    }

    /// Parses the contents of a key file: a JWK (JSON, or moq-token's
    /// base64url of it) or a PEM key. Anything else is an error, never an
    /// HMAC secret (see the module's documentation); a raw secret is
    /// [`Key::from_secret`].
    pub fn parse(bytes: &[u8]) -> Result<Key, String> {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Err(unknown_format(bytes));
        };
        let t = text.trim();
        if t.starts_with("-----BEGIN") {
            return Key::from_pem(t.as_bytes());
        }
        if t.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(t).map_err(|e| format!("JWK: {e}"))?;
            return Key::from_jwk(&v);
        }
        // moq-token's base64url JWK (`eyJ` is `{"`).
        if t.starts_with("eyJ") {
            let json = URL_SAFE_NO_PAD
                .decode(t)
                .map_err(|e| format!("base64url JWK: {e}"))?;
            let v: serde_json::Value =
                serde_json::from_slice(&json).map_err(|e| format!("base64url JWK: {e}"))?;
            return Key::from_jwk(&v);
        }
        Err(unknown_format(bytes))
    }

    /// A raw HMAC secret (HS256/384/512): `secret`'s bytes, one trailing
    /// newline dropped, at least [`MIN_SECRET_LEN`] of them. What is
    /// plainly a key file (JWK, PEM, OpenSSH) is refused: a public key
    /// taken for a secret would let anyone sign tokens.
    pub fn from_secret(secret: &[u8]) -> Result<Key, String> {
        let secret = secret
            .strip_suffix(b"\r\n")
            .or_else(|| secret.strip_suffix(b"\n"))
            .unwrap_or(secret);
        if Key::parse(secret).is_ok() || looks_like_key_text(secret) {
            return Err(
                "a key file (JWK, PEM or OpenSSH), not an HMAC secret: name it without .secret"
                    .into(),
            );
        }
        Key::secret(secret, None, HS.to_vec())
    }

    fn secret(secret: &[u8], kid: Option<String>, algs: Vec<Algorithm>) -> Result<Key, String> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(format!(
                "HMAC secret of {} bytes; at least {MIN_SECRET_LEN} needed",
                secret.len()
            ));
        }
        Ok(Key {
            kid,
            algs,
            decoding: Some(DecodingKey::from_secret(secret)),
            encoding: Some(EncodingKey::from_secret(secret)),
        })
    }

    /// Builds a key from a parsed JWK.
    pub fn from_jwk(v: &serde_json::Value) -> Result<Key, String> {
        let jwk: RawJwk = serde_json::from_value(v.clone()).map_err(|e| format!("JWK: {e}"))?;
        let alg = match &jwk.alg {
            Some(a) => {
                Some(Algorithm::from_str(a).map_err(|_| format!("JWK alg {a:?} unsupported"))?)
            }
            None => None,
        };
        let (verify, sign) = match &jwk.key_ops {
            None => (true, true),
            Some(ops) => (
                ops.iter().any(|o| o == "verify"),
                ops.iter().any(|o| o == "sign"),
            ),
        };
        let family = |allowed: &[Algorithm]| -> Result<Vec<Algorithm>, String> {
            match alg {
                Some(a) if allowed.contains(&a) => Ok(vec![a]),
                Some(a) => Err(format!("JWK alg {a:?} does not fit its key type")),
                None => Ok(allowed.to_vec()),
            }
        };
        let mut key = match jwk.kty.as_deref().unwrap_or("oct") {
            "oct" => Key::secret(&b64url(&jwk.k, "k")?, None, family(HS)?)?,
            "EC" => {
                let (a, len, ring_alg) = match jwk.crv.as_deref() {
                    Some("P-256") => (
                        Algorithm::ES256,
                        32,
                        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                    ),
                    Some("P-384") => (
                        Algorithm::ES384,
                        48,
                        &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
                    ),
                    c => return Err(format!("EC curve {c:?} unsupported (P-256, P-384)")),
                };
                let (x, y) = (b64url(&jwk.x, "x")?, b64url(&jwk.y, "y")?);
                if x.len() != len || y.len() != len {
                    return Err("EC coordinates of the wrong length".into());
                }
                let mut point = vec![4];
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                let encoding = match &jwk.d {
                    Some(_) => {
                        let d = b64url(&jwk.d, "d")?;
                        let der = ec_pkcs8(a, &d, &point)?;
                        signature::EcdsaKeyPair::from_pkcs8(
                            ring_alg,
                            &der,
                            &ring::rand::SystemRandom::new(),
                        )
                        .map_err(|e| format!("EC private key does not fit its public key: {e}"))?;
                        Some(EncodingKey::from_ec_der(&der))
                    }
                    None => None,
                };
                Key {
                    kid: None,
                    algs: family(&[a])?,
                    decoding: Some(DecodingKey::from_ec_der(&point)),
                    encoding,
                }
            }
            "OKP" => {
                if jwk.crv.as_deref() != Some("Ed25519") {
                    return Err(format!("OKP curve {:?} unsupported (Ed25519)", jwk.crv));
                }
                let x = b64url(&jwk.x, "x")?;
                let encoding = match &jwk.d {
                    Some(_) => {
                        let d = b64url(&jwk.d, "d")?;
                        signature::Ed25519KeyPair::from_seed_and_public_key(&d, &x).map_err(
                            |e| format!("Ed25519 private key does not fit its public key: {e}"),
                        )?;
                        Some(EncodingKey::from_ed_der(&ed25519_pkcs8(&d)))
                    }
                    None => None,
                };
                Key {
                    kid: None,
                    algs: family(&[Algorithm::EdDSA])?,
                    decoding: Some(DecodingKey::from_ed_der(&x)),
                    encoding,
                }
            }
            "RSA" => {
                let (n, e) = (b64url(&jwk.n, "n")?, b64url(&jwk.e, "e")?);
                Key {
                    kid: None,
                    algs: family(RSA)?,
                    decoding: Some(DecodingKey::from_rsa_raw_components(&n, &e)),
                    // Signing with an RSA JWK would need PKCS#1 DER built from
                    // its big integers: use a PEM private key instead.
                    encoding: None,
                }
            }
            other => return Err(format!("JWK kty {other:?} unsupported")),
        };
        key.kid = jwk.kid;
        if !verify {
            key.decoding = None;
        }
        if !sign {
            key.encoding = None;
        }
        Ok(key)
    }

    /// Builds a key from a PEM public or private key.
    pub fn from_pem(pem: &[u8]) -> Result<Key, String> {
        let text = std::str::from_utf8(pem).map_err(|_| "PEM not UTF-8".to_string())?;
        let label = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("-----BEGIN "))
            .and_then(|l| l.strip_suffix("-----"))
            .unwrap_or_default();
        let der = pem_der(text)?;
        let has = |oid: &[u8]| der.windows(oid.len()).any(|w| w == oid);
        let rng = ring::rand::SystemRandom::new();
        match label {
            "PUBLIC KEY" | "RSA PUBLIC KEY" => {
                let (algs, decoding) = if label == "RSA PUBLIC KEY" || has(OID_RSA) {
                    (RSA.to_vec(), DecodingKey::from_rsa_pem(pem))
                } else if has(OID_ED25519) {
                    (vec![Algorithm::EdDSA], DecodingKey::from_ed_pem(pem))
                } else if has(OID_P256) {
                    (vec![Algorithm::ES256], DecodingKey::from_ec_pem(pem))
                } else if has(OID_P384) {
                    (vec![Algorithm::ES384], DecodingKey::from_ec_pem(pem))
                } else {
                    return Err("PEM public key of an unsupported type".into());
                };
                Ok(Key {
                    kid: None,
                    algs,
                    decoding: Some(decoding.map_err(jwt_err)?),
                    encoding: None,
                })
            }
            "PRIVATE KEY" | "RSA PRIVATE KEY" => {
                if let Ok(kp) = signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der) {
                    return Ok(Key {
                        kid: None,
                        algs: vec![Algorithm::EdDSA],
                        decoding: Some(DecodingKey::from_ed_der(kp.public_key().as_ref())),
                        encoding: Some(EncodingKey::from_ed_pem(pem).map_err(jwt_err)?),
                    });
                }
                for (alg, ring_alg) in [
                    (
                        Algorithm::ES256,
                        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                    ),
                    (
                        Algorithm::ES384,
                        &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
                    ),
                ] {
                    if let Ok(kp) = signature::EcdsaKeyPair::from_pkcs8(ring_alg, &der, &rng) {
                        return Ok(Key {
                            kid: None,
                            algs: vec![alg],
                            decoding: Some(DecodingKey::from_ec_der(kp.public_key().as_ref())),
                            encoding: Some(EncodingKey::from_ec_der(&der)),
                        });
                    }
                }
                let kp = signature::RsaKeyPair::from_pkcs8(&der)
                    .or_else(|_| signature::RsaKeyPair::from_der(&der))
                    .map_err(|e| format!("PEM private key of an unsupported type: {e}"))?;
                Ok(Key {
                    kid: None,
                    algs: RSA.to_vec(),
                    decoding: Some(DecodingKey::from_rsa_der(kp.public().as_ref())),
                    encoding: Some(EncodingKey::from_rsa_pem(pem).map_err(jwt_err)?),
                })
            }
            other => Err(format!(
                "PEM {other:?} is not a key (PUBLIC KEY, PRIVATE KEY)"
            )),
        }
    }

    /// The key's id.
    pub fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// The algorithms tokens signed with this key may use.
    pub fn algorithms(&self) -> &[Algorithm] {
        &self.algs
    }

    /// Whether the key holds private material (and may sign).
    pub fn can_sign(&self) -> bool {
        self.encoding.is_some()
    }

    /// Signs `claims`, with `alg` or the key's first algorithm; the header
    /// carries the key's `kid`.
    pub fn sign(&self, claims: &Claims, alg: Option<Algorithm>) -> Result<String, AuthError> {
        let enc = self.encoding.as_ref().ok_or_else(|| {
            AuthError::Key("this key cannot sign (no private part, or key_ops)".into())
        })?;
        let alg = alg.unwrap_or(self.algs[0]);
        if !self.algs.contains(&alg) {
            return Err(AuthError::WrongAlgorithm);
        }
        let mut header = Header::new(alg);
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, claims, enc).map_err(|e| AuthError::Key(e.to_string()))
    }

    /// Verifies `token` with this key (whatever its `kid`) at time `now`,
    /// without leeway on `exp` and `nbf`.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Claims, AuthError> {
        let header = header(token)?;
        self.verify_with(token, header.alg, now, Duration::ZERO)
    }

    fn verify_with(
        &self,
        token: &str,
        alg: Algorithm,
        now: SystemTime,
        leeway: Duration,
    ) -> Result<Claims, AuthError> {
        if !self.algs.contains(&alg) {
            return Err(AuthError::WrongAlgorithm);
        }
        let dec = self.decoding.as_ref().ok_or(AuthError::UnknownKid)?;
        let mut v = Validation::new(alg);
        v.required_spec_claims.clear();
        v.validate_exp = false;
        v.validate_nbf = false;
        v.validate_aud = false;
        let data = jsonwebtoken::decode::<Claims>(token, dec, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::InvalidSignature | K::InvalidEcdsaKey | K::InvalidRsaKey(_) | K::Crypto(_) => {
                    AuthError::BadSignature
                }
                K::InvalidAlgorithm | K::InvalidAlgorithmName => AuthError::WrongAlgorithm,
                _ => AuthError::BadToken(e.to_string()),
            }
        })?;
        data.claims.validate(now, leeway)?;
        Ok(data.claims)
    }
}

/// The token's header; an `alg` jsonwebtoken does not know (`none`
/// included) is a wrong algorithm rather than a malformed token.
fn header(token: &str) -> Result<Header, AuthError> {
    jsonwebtoken::decode_header(token).map_err(|e| {
        let alg = token
            .split('.')
            .next()
            .and_then(|h| URL_SAFE_NO_PAD.decode(h).ok())
            .and_then(|h| serde_json::from_slice::<serde_json::Value>(&h).ok())
            .is_some_and(|h| h.get("alg").is_some_and(|a| a.is_string()));
        if alg && token.split('.').count() == 3 {
            AuthError::WrongAlgorithm
        } else {
            AuthError::BadToken(e.to_string())
        }
    })
}

const OID_RSA: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
];
const OID_ED25519: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];

fn pem_der(text: &str) -> Result<Vec<u8>, String> {
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|l| l.trim().chars())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| format!("PEM: {e}"))
}

/// The PKCS#8 document of an EC private key `d` with public point `point`,
/// in the fixed layout `ring` writes and reads (RFC 5915 inside RFC 5208,
/// named curve, public key included): a prefix, `d`, a middle, the point.
fn ec_pkcs8(alg: Algorithm, d: &[u8], point: &[u8]) -> Result<Vec<u8>, String> {
    let (prefix, middle, dlen, plen): (&[u8], &[u8], usize, usize) = match alg {
        Algorithm::ES256 => (EC_P256_PREFIX, EC_P256_MIDDLE, 32, 65),
        Algorithm::ES384 => (EC_P384_PREFIX, EC_P384_MIDDLE, 48, 97),
        _ => return Err("not an EC algorithm".into()),
    };
    if d.len() != dlen || point.len() != plen {
        return Err("EC private key of the wrong length".into());
    }
    Ok([prefix, d, middle, point].concat())
}

/// `d` and the public point of a PKCS#8 document in `ring`'s EC layout.
fn ec_pkcs8_parts(alg: Algorithm, der: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let (prefix, middle, dlen): (&[u8], &[u8], usize) = match alg {
        Algorithm::ES256 => (EC_P256_PREFIX, EC_P256_MIDDLE, 32),
        Algorithm::ES384 => (EC_P384_PREFIX, EC_P384_MIDDLE, 48),
        _ => return Err("not an EC algorithm".into()),
    };
    let rest = der.strip_prefix(prefix).ok_or("unexpected PKCS#8 layout")?;
    let (d, rest) = rest.split_at_checked(dlen).ok_or("short PKCS#8")?;
    let point = rest
        .strip_prefix(middle)
        .ok_or("unexpected PKCS#8 layout")?;
    Ok((d.to_vec(), point.to_vec()))
}

const EC_P256_PREFIX: &[u8] = &[
    0x30, 0x81, 0x87, 0x02, 0x01, 0x00, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02,
    0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x04, 0x6d, 0x30, 0x6b, 0x02,
    0x01, 0x01, 0x04, 0x20,
];
const EC_P256_MIDDLE: &[u8] = &[0xa1, 0x44, 0x03, 0x42, 0x00];
const EC_P384_PREFIX: &[u8] = &[
    0x30, 0x81, 0xb6, 0x02, 0x01, 0x00, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02,
    0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22, 0x04, 0x81, 0x9e, 0x30, 0x81, 0x9b, 0x02, 0x01,
    0x01, 0x04, 0x30,
];
const EC_P384_MIDDLE: &[u8] = &[0xa1, 0x64, 0x03, 0x62, 0x00];

/// PKCS#8 v1 (RFC 8410) of an Ed25519 seed.
fn ed25519_pkcs8(seed: &[u8]) -> Vec<u8> {
    const PREFIX: &[u8] = &[
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    [PREFIX, seed].concat()
}

/// A freshly generated key as JWKs, in moq-token's layout.
#[derive(Debug, Clone)]
pub struct GeneratedKey {
    /// The private (or, for HMAC, secret) JWK: `key_ops` sign and verify.
    pub private: serde_json::Value,
    /// The public JWK (`key_ops` verify) for asymmetric algorithms.
    pub public: Option<serde_json::Value>,
}

/// Generates a key for `alg` (HS*, ES256, ES384, EdDSA; RSA keys are made
/// with e.g. `openssl genpkey` and used as PEM).
pub fn generate(alg: Algorithm, kid: Option<&str>) -> Result<GeneratedKey, AuthError> {
    let rng = ring::rand::SystemRandom::new();
    let fail = |e: ring::error::Unspecified| AuthError::Key(format!("key generation failed: {e}"));
    let alg_name = format!("{alg:?}");
    let with_common = |mut v: serde_json::Value, ops: &[&str]| {
        v["alg"] = alg_name.clone().into();
        v["key_ops"] = serde_json::json!(ops);
        if let Some(k) = kid {
            v["kid"] = k.into();
        }
        v
    };
    let (private, public) = match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            let len = match alg {
                Algorithm::HS256 => 32,
                Algorithm::HS384 => 48,
                _ => 64,
            };
            let mut k = vec![0u8; len];
            rng.fill(&mut k).map_err(fail)?;
            (serde_json::json!({"kty": "oct", "k": b64(&k)}), None)
        }
        Algorithm::ES256 | Algorithm::ES384 => {
            let (ring_alg, crv) = if alg == Algorithm::ES256 {
                (&signature::ECDSA_P256_SHA256_FIXED_SIGNING, "P-256")
            } else {
                (&signature::ECDSA_P384_SHA384_FIXED_SIGNING, "P-384")
            };
            let doc = signature::EcdsaKeyPair::generate_pkcs8(ring_alg, &rng).map_err(fail)?;
            let (d, point) = ec_pkcs8_parts(alg, doc.as_ref()).map_err(AuthError::Key)?;
            let half = (point.len() - 1) / 2;
            let (x, y) = (b64(&point[1..1 + half]), b64(&point[1 + half..]));
            (
                serde_json::json!({"kty": "EC", "crv": crv, "x": x, "y": y, "d": b64(&d)}),
                Some(serde_json::json!({"kty": "EC", "crv": crv, "x": x, "y": y})),
            )
        }
        Algorithm::EdDSA => {
            let mut seed = [0u8; 32];
            rng.fill(&mut seed).map_err(fail)?;
            let kp = signature::Ed25519KeyPair::from_seed_unchecked(&seed)
                .map_err(|e| AuthError::Key(format!("key generation failed: {e}")))?;
            let x = b64(kp.public_key().as_ref());
            (
                serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": x, "d": b64(&seed)}),
                Some(serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": x})),
            )
        }
        other => {
            return Err(AuthError::Key(format!(
            "cannot generate {other:?} keys: make one with `openssl genpkey` and use the PEM file"
        )))
        }
    };
    Ok(GeneratedKey {
        private: with_common(private, &["sign", "verify"]),
        public: public.map(|p| with_common(p, &["verify"])),
    })
}

/// All configured verification keys, and the clock leeway they verify
/// tokens with (none unless [`Keys::with_leeway`]).
#[derive(Debug, Default)]
pub struct Keys {
    default: Option<Arc<Key>>,
    by_kid: HashMap<String, Arc<Key>>,
    leeway: Duration,
}

impl Keys {
    /// Loads the single key file, the key directory and the JWKS file, each
    /// optional.
    pub fn load(
        key: Option<&Path>,
        key_dir: Option<&Path>,
        jwks: Option<&Path>,
    ) -> Result<Keys, AuthError> {
        let mut keys = Keys::default();
        if let Some(path) = key {
            let k = Arc::new(Key::from_file(path)?);
            if let Some(kid) = k.kid.clone() {
                keys.insert(path, kid, k.clone())?;
            }
            keys.default = Some(k);
        }
        if let Some(dir) = key_dir {
            let entries = std::fs::read_dir(dir).map_err(|source| AuthError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for path in paths {
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                if name.starts_with('.') || !path.is_file() {
                    continue;
                }
                let kid = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default()
                    .to_string();
                let mut k = Key::from_file(&path)?;
                if k.kid.as_ref().is_some_and(|inner| *inner != kid) {
                    return Err(AuthError::config(
                        &path,
                        None,
                        format!("the key's kid {:?} is not its file name's {kid:?}", k.kid),
                    ));
                }
                k.kid = Some(kid.clone());
                keys.insert(&path, kid, Arc::new(k))?;
            }
        }
        if let Some(path) = jwks {
            let bytes = crate::error::read(path)?;
            #[derive(Deserialize)]
            struct Set {
                keys: Vec<serde_json::Value>,
            }
            let set: Set = serde_json::from_slice(&bytes)
                .map_err(|e| AuthError::config(path, None, format!("JWKS: {e}")))?;
            let single = set.keys.len() == 1;
            for (i, v) in set.keys.iter().enumerate() {
                let k = Key::from_jwk(v)
                    .map_err(|m| AuthError::config(path, None, format!("key {i}: {m}")))?;
                match k.kid.clone() {
                    Some(kid) => keys.insert(path, kid, Arc::new(k))?,
                    None if single && keys.default.is_none() => keys.default = Some(Arc::new(k)),
                    None => {
                        return Err(AuthError::config(path, None, format!("key {i} has no kid")))
                    }
                }
            }
        }
        Ok(keys)
    }

    fn insert(&mut self, path: &Path, kid: String, key: Arc<Key>) -> Result<(), AuthError> {
        if self.by_kid.insert(kid.clone(), key).is_some() {
            return Err(AuthError::config(
                path,
                None,
                format!("kid {kid:?} defined twice"),
            ));
        }
        Ok(())
    }

    /// These keys, accepting a token until `leeway` after its `exp` and
    /// from `leeway` before its `nbf`: the issuer's clock and ours
    /// disagree by a few seconds more often than not.
    pub fn with_leeway(self, leeway: Duration) -> Keys {
        Keys { leeway, ..self }
    }

    /// The leeway on `exp` and `nbf` (a session's end is its token's `exp`
    /// plus this).
    pub fn leeway(&self) -> Duration {
        self.leeway
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.by_kid.is_empty()
    }

    /// Verifies `token` at time `now`: its key is found by `kid` (the
    /// single key without one), its `alg` must be the key's, its signature
    /// must verify, `exp`/`nbf` must hold (give or take the leeway).
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Claims, AuthError> {
        if self.is_empty() {
            return Err(AuthError::NoKeys);
        }
        let header = header(token)?;
        let key = match &header.kid {
            Some(kid) => self.by_kid.get(kid),
            None => self.default.as_ref().or_else(|| match self.by_kid.len() {
                1 => self.by_kid.values().next(),
                _ => None,
            }),
        }
        .ok_or(AuthError::UnknownKid)?;
        key.verify_with(token, header.alg, now, self.leeway)
    }
}

/// Why `bytes` is not a key file quichub reads, with what it looks like
/// and how to make it one.
fn unknown_format(bytes: &[u8]) -> String {
    const HINT: &str = "key files are a JWK (`quichub token generate-key`, `moq-token generate`) \
         or a PEM key starting with its -----BEGIN line; a raw HMAC secret must be declared: \
         a JWK {\"kty\":\"oct\",\"k\":\"BASE64URL\"} or a file named *.secret";
    let text = std::str::from_utf8(bytes).ok().map(str::trim_start);
    let what = match text {
        None if bytes.first() == Some(&0x30) => {
            "binary DER (convert it: `openssl pkey -inform DER -in FILE` for a private key, \
             add `-pubin` for a public one)"
                .to_string()
        }
        None => "binary data".to_string(),
        Some(t) if is_openssh(t) => {
            "an OpenSSH key (convert a public one: `ssh-keygen -e -m PKCS8 -f FILE`)".to_string()
        }
        Some(t) if t.contains("-----BEGIN") => {
            let first = t.lines().next().unwrap_or_default();
            let first: String = first.chars().take(40).collect();
            format!(
                "text before its PEM block (first line {first:?}, e.g. openssl pkcs12's \
                 Bag Attributes): keep only the -----BEGIN ... -----END lines"
            )
        }
        Some("") => "an empty file".to_string(),
        Some(_) => "not a JWK or PEM".to_string(),
    };
    format!("unrecognised key file: {what}; {HINT}")
}

/// Whether `t` starts like an OpenSSH public key line.
fn is_openssh(t: &str) -> bool {
    ["ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-"]
        .iter()
        .any(|p| t.starts_with(p))
}

/// Whether `secret`, as text, holds a PEM block or an OpenSSH key.
fn looks_like_key_text(secret: &[u8]) -> bool {
    std::str::from_utf8(secret)
        .is_ok_and(|t| t.contains("-----BEGIN") || is_openssh(t.trim_start()))
}

/// Whether `s` looks like a compact JWS (three base64url parts); used to
/// tell a token from a password.
pub fn looks_like_jwt(s: &[u8]) -> bool {
    let mut parts = 0;
    for part in s.split(|b| *b == b'.') {
        parts += 1;
        if part.is_empty()
            || !part
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return false;
        }
    }
    parts == 3
}

#[cfg(test)]
mod tests;
