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

/// What checking a password of an unknown user costs: the file's typical
/// entry, so that timing does not tell which names are users.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Dummy {
    /// PBKDF2-SHA512 with this many iterations.
    Pbkdf2(NonZeroU32),
    /// One SHA-512 of the password and a salt of this length.
    Sha512(usize),
}

/// mosquitto_passwd 2's iteration count, for a file without `$7$` entries
/// to take its typical cost from (an empty file: nobody to tell apart).
const MOSQUITTO_ITERATIONS: NonZeroU32 = match NonZeroU32::new(101) {
    Some(n) => n,
    None => NonZeroU32::MIN,
};

impl Default for Dummy {
    fn default() -> Self {
        Dummy::Pbkdf2(MOSQUITTO_ITERATIONS)
    }
}

impl Dummy {
    /// The typical entry of `users`: the kind most of them are (`$7$` when
    /// as many are `$6$`), at the median iteration count of the `$7$`
    /// ones, or the median salt length of the `$6$` ones. Known users of
    /// another kind or count still differ from it; what this hides is the
    /// difference between a name that is in the file and one that is not.
    fn typical(users: &HashMap<String, Hash>) -> Dummy {
        let mut iterations = Vec::new();
        let mut salts = Vec::new();
        for h in users.values() {
            match h {
                Hash::Pbkdf2 { iterations: i, .. } => iterations.push(*i),
                Hash::Sha512 { salt, .. } => salts.push(salt.len()),
            }
        }
        if salts.len() > iterations.len() {
            salts.sort_unstable();
            return Dummy::Sha512(salts[salts.len() / 2]);
        }
        iterations.sort_unstable();
        iterations
            .get(iterations.len() / 2)
            .copied()
            .map_or_else(Dummy::default, Dummy::Pbkdf2)
    }
}

/// A parsed password file.
#[derive(Clone, Default)]
pub struct PasswordFile {
    users: HashMap<String, Hash>,
    dummy: Dummy,
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
        let dummy = Dummy::typical(&users);
        Ok(PasswordFile { users, dummy })
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

    /// Whether `pass` is `user`'s password. An unknown user costs what the
    /// file's typical entry costs (see `Dummy::typical`), so timing does
    /// not tell a user from a name that is not one.
    pub fn verify(&self, user: &str, pass: &[u8]) -> bool {
        match self.users.get(user) {
            Some(Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            }) => pbkdf2::verify(pbkdf2::PBKDF2_HMAC_SHA512, *iterations, salt, pass, hash).is_ok(),
            Some(Hash::Sha512 { salt, hash }) => sha512_matches(pass, salt, hash),
            None => {
                // The same work as a user's check, whose result is dropped.
                const SALT: [u8; 64] = [0x5a; 64];
                const HASH: [u8; 64] = [0; 64];
                match self.dummy {
                    Dummy::Pbkdf2(iterations) => {
                        let _ = pbkdf2::verify(
                            pbkdf2::PBKDF2_HMAC_SHA512,
                            iterations,
                            &SALT[..16],
                            pass,
                            &HASH,
                        );
                    }
                    Dummy::Sha512(salt_len) => {
                        let salt = &SALT[..salt_len.min(SALT.len())];
                        let _ = sha512_matches(pass, salt, &HASH);
                    }
                }
                false
            }
        }
    }

    #[cfg(test)]
    fn dummy(&self) -> &Dummy {
        &self.dummy
    }
}

/// Whether SHA-512(`pass` ‖ `salt`) is `hash`, compared in constant time.
fn sha512_matches(pass: &[u8], salt: &[u8], hash: &[u8]) -> bool {
    let mut ctx = digest::Context::new(&digest::SHA512);
    ctx.update(pass);
    ctx.update(salt);
    bool::from(ctx.finish().as_ref().ct_eq(hash))
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

    /// `$7$` line of `user` with `iterations` (salt and hash are not
    /// checked here, only their shape).
    fn pbkdf2_line(user: &str, iterations: u32) -> String {
        format!(
            "{user}:$7${iterations}$AAAAAAAAAAAAAAAAAAAAAA==${}\n",
            "A".repeat(86) + "=="
        )
    }

    /// `$6$` line of `user` with a salt of `salt_len` bytes.
    fn sha512_line(user: &str, salt_len: usize) -> String {
        let salt = base64::engine::general_purpose::STANDARD.encode(vec![7u8; salt_len]);
        format!("{user}:$6${salt}${}\n", "A".repeat(86) + "==")
    }

    /// An unknown user costs what the file's typical entry costs: the
    /// median iteration count of its `$7$` entries, a SHA-512 with the
    /// median salt length where most entries are `$6$`.
    #[test]
    fn unknown_users_cost_the_typical_entry() {
        let it = |n: u32| Dummy::Pbkdf2(NonZeroU32::new(n).unwrap());
        // The mosquitto_passwd fixture: 101, 101, 1000 and one $6$.
        assert_eq!(PasswordFile::parse(FIXTURE).unwrap().dummy(), &it(101));
        let file = |lines: &[String]| PasswordFile::parse(&lines.concat()).unwrap();
        let many: Vec<String> = (0..5)
            .map(|i| pbkdf2_line(&format!("u{i}"), 20_000))
            .chain([pbkdf2_line("old", 101), pbkdf2_line("older", 101)])
            .collect();
        assert_eq!(file(&many).dummy(), &it(20_000));
        let mixed = [
            pbkdf2_line("a", 1000),
            pbkdf2_line("b", 5000),
            pbkdf2_line("c", 3000),
        ];
        assert_eq!(file(&mixed).dummy(), &it(3000));
        let sha = [
            sha512_line("a", 12),
            sha512_line("b", 12),
            sha512_line("c", 16),
        ];
        assert_eq!(file(&sha).dummy(), &Dummy::Sha512(12));
        // As many $7$ as $6$: the slower kind.
        let half = [sha512_line("a", 12), pbkdf2_line("b", 2000)];
        assert_eq!(file(&half).dummy(), &it(2000));
        assert_eq!(file(&[]).dummy(), &it(101));
        // The dummy check itself refuses whatever is given.
        for f in [file(&many), file(&sha), file(&[])] {
            assert!(!f.verify("nobody", b""));
            assert!(!f.verify("nobody", b"s3cret"));
        }
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
