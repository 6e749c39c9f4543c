//! mosquitto's `password_file`, as `mosquitto_passwd` writes it, used
//! unchanged.
//!
//! One `user:hash` per line (the user name ends at the first `:`), with
//! - `$7$ITERATIONS$SALT$HASH`: PBKDF2-HMAC-SHA512 (mosquitto 2's default),
//!   salt and 64-byte hash in standard base64;
//! - `$6$SALT$HASH`: SHA-512 of the password followed by the salt (mosquitto
//!   1.x, `mosquitto_passwd -H sha512`).
//!
//! Blank lines and lines starting with `#` are skipped. A line with any other
//! hash (plain text included) is an error naming the line: mosquitto 2
//! refuses such files too, and a broker that silently dropped a user would
//! be harder to debug.
//!
//! The parsing is hand-written (a line split and a base64 decode: no crate
//! reads this format); the cryptography is `ring`'s (`pbkdf2::verify` is
//! constant-time) and the `$6$` comparison uses `subtle`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::Path;

use base64::Engine;
use ring::{digest, pbkdf2};
use subtle::ConstantTimeEq;

use crate::error::AuthError;

/// The largest iteration count accepted from a file: a typo there must not
/// turn every CONNECT into seconds of CPU.
const MAX_ITERATIONS: u32 = 10_000_000;

#[derive(Clone)]
enum Hash {
    Pbkdf2 {
        iterations: NonZeroU32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    Sha512 {
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
}

/// A parsed password file.
#[derive(Clone, Default)]
pub struct PasswordFile {
    users: HashMap<String, Hash>,
}

impl std::fmt::Debug for PasswordFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordFile")
            .field("users", &self.users.len())
            .finish()
    }
}

impl PasswordFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<PasswordFile, AuthError> {
        let bytes = crate::error::read(path)?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| AuthError::config(path, None, format!("not UTF-8: {e}")))?;
        PasswordFile::parse(text).map_err(|(line, msg)| AuthError::config(path, Some(line), msg))
    }

    /// Parses the text of a password file; errors carry the 1-based line.
    pub fn parse(text: &str) -> Result<PasswordFile, (usize, String)> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim_end_matches(['\r', '\n']);
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                return Err((n, "expected user:hash".into()));
            };
            if user.is_empty() {
                return Err((n, "empty user name".into()));
            }
            let hash = parse_hash(hash).map_err(|m| (n, format!("user {user:?}: {m}")))?;
            users.insert(user.to_string(), hash);
        }
        Ok(PasswordFile { users })
    }

    /// Whether `user` is in the file.
    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether the file names no user.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether `pass` is `user`'s password. An unknown user costs the same
    /// PBKDF2 work as a known one, so timing does not tell them apart.
    pub fn verify(&self, user: &str, pass: &[u8]) -> bool {
        match self.users.get(user) {
            Some(Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            }) => pbkdf2::verify(pbkdf2::PBKDF2_HMAC_SHA512, *iterations, salt, pass, hash).is_ok(),
            Some(Hash::Sha512 { salt, hash }) => {
                let mut ctx = digest::Context::new(&digest::SHA512);
                ctx.update(pass);
                ctx.update(salt);
                bool::from(ctx.finish().as_ref().ct_eq(hash))
            }
            None => {
                let mut out = [0u8; 64];
                pbkdf2::derive(
                    pbkdf2::PBKDF2_HMAC_SHA512,
                    NonZeroU32::new(101).unwrap_or(NonZeroU32::MIN),
                    b"quichub-unknown-user",
                    pass,
                    &mut out,
                );
                false
            }
        }
    }
}

fn b64(s: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("bad base64 {what}: {e}"))
}

fn parse_hash(s: &str) -> Result<Hash, String> {
    let parts: Vec<&str> = s.split('$').collect();
    match parts.as_slice() {
        ["", "7", iterations, salt, hash] => {
            let iterations: u32 = iterations
                .parse()
                .map_err(|_| format!("bad iteration count {iterations:?}"))?;
            if iterations > MAX_ITERATIONS {
                return Err(format!("iteration count {iterations} over {MAX_ITERATIONS}"));
            }
            let iterations = NonZeroU32::new(iterations).ok_or("iteration count 0")?;
            let hash = b64(hash, "hash")?;
            if hash.len() != 64 {
                return Err(format!("PBKDF2-SHA512 hash of {} bytes, not 64", hash.len()));
            }
            Ok(Hash::Pbkdf2 {
                iterations,
                salt: b64(salt, "salt")?,
                hash,
            })
        }
        ["", "6", salt, hash] => {
            let hash = b64(hash, "hash")?;
            if hash.len() != 64 {
                return Err(format!("SHA512 hash of {} bytes, not 64", hash.len()));
            }
            Ok(Hash::Sha512 {
                salt: b64(salt, "salt")?,
                hash,
            })
        }
        _ => Err("not a mosquitto_passwd hash ($7$ or $6$); run `mosquitto_passwd -U` on plain-text files".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made with mosquitto_passwd 2 (`-b`, `-H sha512` for carol, `-I 1000`
    /// for dave); the last line has no newline, as it wrote it.
    pub(crate) const FIXTURE: &str = "\
alice:$7$101$8aiMLZg0sQaLcxss$BSmGVBrcLcOx5POja/gA8si6UUPIzxlogfo6QdP9pFHvrwROhbrbnrr0nTxIWuuYWwdmVk/yvtSD9H5adSAKzA==
bob:$7$101$vVzaS47RdXSxoezT$VRXcncZqCKsC7OFEJS9Ngvc5ltZG4IukUSw2e/Mmg41vinYSSCEfMycFE1UqExiiwCl6RTVERQ3ylVJlUw5gBg==
carol:$6$mbylTam+TE4lr5U2$Ou/sB8xYKvFHsL8pbsKSv+tBRLoF6YjSEdtrpA5zRFLyqJ7Yqgo4tpKYweN8W8GxwPEuJcj7/FZvkqwc6lDKPQ==
dave:$7$1000$XDU+ufDEI7xGAmPg$HXBrUWQmJY+hTHUNEyfgMoZFT9QZhSdGCxYwJOQjPRAa1VeItuQkXYoqgj+Q5sA24swGH8f7o8cb0syqZxxb+w==";

    #[test]
    fn mosquitto_passwd_fixtures_verify() {
        let f = PasswordFile::parse(FIXTURE).unwrap();
        assert_eq!(f.len(), 4);
        assert!(f.verify("alice", b"s3cret"));
        assert!(!f.verify("alice", b"s3cret "));
        assert!(!f.verify("alice", b""));
        assert!(f.verify("bob", "p@ss:word é".as_bytes()));
        assert!(f.verify("carol", b"legacy"));
        assert!(!f.verify("carol", b"Legacy"));
        assert!(f.verify("dave", b"thousand"));
        assert!(!f.verify("eve", b"s3cret"));
        // One user's password is not another's.
        assert!(!f.verify("bob", b"s3cret"));
    }

    #[test]
    fn bad_lines_are_errors_with_line_numbers() {
        assert_eq!(
            PasswordFile::parse("# c\n\nalice:plain\n").unwrap_err().0,
            3
        );
        assert_eq!(PasswordFile::parse("nocolon\n").unwrap_err().0, 1);
        assert_eq!(PasswordFile::parse("a:$7$0$AAAA$AAAA\n").unwrap_err().0, 1);
        assert_eq!(
            PasswordFile::parse("a:$7$101$AAAA$AAAA\n").unwrap_err().0,
            1
        );
        assert_eq!(PasswordFile::parse("a:$7$101$!!$AAAA\n").unwrap_err().0, 1);
        assert_eq!(
            PasswordFile::parse("a:$7$99999999999$AA$AA\n")
                .unwrap_err()
                .0,
            1
        );
        assert!(PasswordFile::parse("\r\n# only comments\n")
            .unwrap()
            .is_empty());
    }

    /// Runs the real mosquitto_passwd when it is installed.
    #[test]
    fn files_written_by_mosquitto_passwd_now() {
        let dir = std::env::temp_dir().join(format!("quichub-auth-passwd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        let run = |args: &[&str]| {
            std::process::Command::new("mosquitto_passwd")
                .args(args)
                .status()
        };
        let Ok(st) = run(&["-c", "-b", file.to_str().unwrap(), "u1", "pässwörd"]) else {
            eprintln!("mosquitto_passwd not installed: skipped");
            return;
        };
        assert!(st.success());
        assert!(
            run(&["-H", "sha512", "-b", file.to_str().unwrap(), "u2", "old"])
                .unwrap()
                .success()
        );
        let f = PasswordFile::load(&file).unwrap();
        assert!(f.verify("u1", "pässwörd".as_bytes()));
        assert!(!f.verify("u1", b"password"));
        assert!(f.verify("u2", b"old"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
