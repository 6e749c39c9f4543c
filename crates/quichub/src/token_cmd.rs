//! `quichub token`: make keys, issue and check JWTs (as moq-dev's
//! `moq-token` CLI does, with files it can read). The work is
//! `quichub_auth::jwt`'s; this module parses arguments and writes files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use base64::Engine;
use quichub_auth::jwt::{self, Algorithm, Claims, Key, Keys};

/// `quichub token`.
#[derive(clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Generate a key as a JWK file (and, for ES256/ES384/EdDSA, its public JWK).
    GenerateKey(GenerateArgs),
    /// Sign a token with a key file; prints the token.
    Sign(SignArgs),
    /// Verify a token; prints its claims as JSON.
    Verify(VerifyArgs),
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// HS256, HS384, HS512, ES256, ES384 or EdDSA (RSA: use `openssl genpkey`
    /// and the PEM file).
    #[arg(long, default_value = "HS256")]
    algorithm: String,
    /// The private (or secret) key file to write.
    #[arg(long)]
    out: PathBuf,
    /// Where the public JWK goes (asymmetric algorithms); default: `--out`
    /// with `.pub` before its extension.
    #[arg(long)]
    public: Option<PathBuf>,
    /// Key id, written into the JWK and every token it signs.
    #[arg(long)]
    kid: Option<String>,
    /// Write the JSON base64url-encoded, as older moq-token versions expect.
    #[arg(long)]
    base64: bool,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct SignArgs {
    /// Key file: JWK (JSON or base64url), PEM private key, or a raw secret
    /// in a file named `*.secret`.
    #[arg(long)]
    key: PathBuf,
    /// Root path joined before every --put/--get path.
    #[arg(long, default_value = "")]
    root: String,
    /// Path (under --root) the bearer may publish; repeatable; '' = all of root.
    #[arg(long)]
    put: Vec<String>,
    /// Path (under --root) the bearer may subscribe to; repeatable; '' = all of root.
    #[arg(long)]
    get: Vec<String>,
    /// The user the token stands for (its acl_file rules apply).
    #[arg(long)]
    sub: Option<String>,
    /// Lifetime: e.g. 90s, 30m, 1h, 7d (seconds without a unit).
    #[arg(long, default_value = DEFAULT_LIFETIME, conflicts_with = "no_expiry")]
    expires: String,
    /// A token without `exp`, valid until its key is revoked (a leaked one
    /// cannot be made to expire).
    #[arg(long)]
    no_expiry: bool,
    /// Algorithm, for keys that allow several (PEM RSA keys, raw secrets).
    #[arg(long)]
    algorithm: Option<String>,
}

#[derive(clap::Args)]
struct VerifyArgs {
    /// Key file for tokens without kid (and for its own kid).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Directory of key files named by kid.
    #[arg(long)]
    key_dir: Option<PathBuf>,
    /// JWKS file.
    #[arg(long)]
    jwks: Option<PathBuf>,
    /// The token.
    token: String,
}

/// A signed token's lifetime unless `--expires` or `--no-expiry` says
/// otherwise: a token that was copied somewhere it should not be stops
/// working within a day.
const DEFAULT_LIFETIME: &str = "24h";

/// Runs `quichub token ...`; the exit code.
pub fn run(a: TokenArgs) -> anyhow::Result<i32> {
    match a.command {
        TokenCommand::GenerateKey(g) => generate(g),
        TokenCommand::Sign(s) => sign(s),
        TokenCommand::Verify(v) => verify(v),
    }
}

fn algorithm(s: &str) -> anyhow::Result<Algorithm> {
    Algorithm::from_str(s).map_err(|_| anyhow::anyhow!("unknown algorithm {s:?}"))
}

fn generate(g: GenerateArgs) -> anyhow::Result<i32> {
    let key = jwt::generate(algorithm(&g.algorithm)?, g.kid.as_deref())?;
    let encode = |v: &serde_json::Value| {
        let json = v.to_string();
        if g.base64 {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
        } else {
            json + "\n"
        }
    };
    write_file(&g.out, &encode(&key.private), true, g.force)?;
    eprintln!("wrote {}", g.out.display());
    if let Some(public) = &key.public {
        let path = g.public.clone().unwrap_or_else(|| public_path(&g.out));
        write_file(&path, &encode(public), false, g.force)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(0)
}

/// `key.jwk` → `key.pub.jwk`; `key` → `key.pub`.
fn public_path(out: &Path) -> PathBuf {
    match (out.file_stem(), out.extension()) {
        (Some(stem), Some(ext)) => out.with_file_name(format!(
            "{}.pub.{}",
            stem.to_string_lossy(),
            ext.to_string_lossy()
        )),
        _ => PathBuf::from(format!("{}.pub", out.display())),
    }
}

/// Writes `contents` with mode 0600 when `private` (0644 otherwise, less
/// the umask); refuses to overwrite unless `force`.
fn write_file(path: &Path, contents: &str, private: bool, force: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if private { 0o600 } else { 0o644 };
    if !force {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .with_context(|| format!("{} (use --force to overwrite)", path.display()))?;
        return f
            .write_all(contents.as_bytes())
            .with_context(|| path.display().to_string());
    }
    // Overwriting: `mode` applies only to files that open creates, so an
    // existing 0644 file would keep its mode and show the new secret to
    // everyone. A new file, renamed over the old one, has the mode asked
    // for and leaves the old contents whole if writing fails.
    let name = path
        .file_name()
        .map_or_else(|| std::ffi::OsString::from("key"), |n| n.to_os_string());
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(&name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| path.display().to_string())
}

/// `90s`, `30m`, `1h`, `7d`, or plain seconds.
fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().with_context(|| format!("bad duration {s:?}"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => bail!("bad duration unit in {s:?} (s, m, h, d)"),
    };
    Ok(Duration::from_secs(n.saturating_mul(mult)))
}

fn sign(s: SignArgs) -> anyhow::Result<i32> {
    let key = Key::from_file(&s.key)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let alg = s.algorithm.as_deref().map(algorithm).transpose()?;
    let claims = sign_claims(s, now)?;
    println!("{}", key.sign(&claims, alg)?);
    Ok(0)
}

/// The claims `quichub token sign` puts in a token made at `now` (Unix
/// seconds).
fn sign_claims(s: SignArgs, now: u64) -> anyhow::Result<Claims> {
    let exp = match s.no_expiry {
        true => None,
        false => Some(now.saturating_add(parse_duration(&s.expires)?.as_secs())),
    };
    if s.put.is_empty() && s.get.is_empty() && s.sub.is_none() {
        bail!("a token needs --put, --get or --sub");
    }
    Ok(Claims {
        root: s.root,
        put: s.put,
        get: s.get,
        sub: s.sub,
        exp,
        iat: Some(now),
        ..Claims::default()
    })
}

fn verify(v: VerifyArgs) -> anyhow::Result<i32> {
    if v.key.is_none() && v.key_dir.is_none() && v.jwks.is_none() {
        bail!("give --key, --key-dir or --jwks");
    }
    // The relay's default leeway: a token this accepts, the relay does.
    let keys = Keys::load(v.key.as_deref(), v.key_dir.as_deref(), v.jwks.as_deref())?
        .with_leeway(jwt::DEFAULT_LEEWAY);
    match keys.verify(v.token.trim(), SystemTime::now()) {
        Ok(claims) => {
            println!("{}", serde_json::to_string_pretty(&claims)?);
            Ok(0)
        }
        Err(e) => {
            eprintln!("invalid token ({}): {e}", e.reason());
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("30m").unwrap().as_secs(), 1800);
        assert_eq!(parse_duration("1h").unwrap().as_secs(), 3600);
        assert_eq!(parse_duration("7d").unwrap().as_secs(), 604800);
        assert!(parse_duration("1y").is_err());
        assert!(parse_duration("h").is_err());
    }

    /// `quichub token ARGS`, parsed.
    fn parse(args: &[&str]) -> Result<TokenArgs, clap::Error> {
        use clap::{FromArgMatches, Parser};
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            token: TokenArgs,
        }
        let m = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(std::iter::once("token").chain(args.iter().copied()))?;
        Cli::from_arg_matches(&m).map(|c| c.token)
    }

    fn sign_args(args: &[&str]) -> Result<SignArgs, clap::Error> {
        let mut all = vec!["sign", "--key", "k.jwk"];
        all.extend_from_slice(args);
        match parse(&all)?.command {
            TokenCommand::Sign(s) => Ok(s),
            _ => unreachable!("parsed a sign command"),
        }
    }

    /// A token expires in 24 h unless told otherwise; `--no-expiry` makes
    /// one without `exp`, and does not go with `--expires`.
    #[test]
    fn tokens_expire_by_default() {
        let now = 1_800_000_000;
        let c = sign_claims(sign_args(&["--get", ""]).unwrap(), now).unwrap();
        assert_eq!(c.exp, Some(now + 86_400));
        assert_eq!(c.iat, Some(now));
        let c = sign_claims(sign_args(&["--get", "", "--expires", "1h"]).unwrap(), now).unwrap();
        assert_eq!(c.exp, Some(now + 3600));
        let c = sign_claims(sign_args(&["--get", "", "--no-expiry"]).unwrap(), now).unwrap();
        assert_eq!(c.exp, None);
        assert!(sign_args(&["--get", "", "--no-expiry", "--expires", "1h"]).is_err());
        assert!(sign_claims(sign_args(&["--expires", "1h"]).unwrap(), now).is_err());
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Private keys are written 0600, also over an existing 0644 file with
    /// `--force` (which used to keep the old file's mode); without it an
    /// existing file is left alone.
    #[test]
    fn private_keys_are_owner_only_even_over_an_existing_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("quichub-token-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let new = dir.join("new.jwk");
        write_file(&new, "secret\n", true, false).unwrap();
        assert_eq!(mode(&new), 0o600);
        assert!(write_file(&new, "other\n", true, false).is_err());
        assert_eq!(std::fs::read_to_string(&new).unwrap(), "secret\n");

        let old = dir.join("old.jwk");
        std::fs::write(&old, "public\n").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_file(&old, "secret\n", true, true).unwrap();
        assert_eq!(mode(&old), 0o600);
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "secret\n");
        // Only the key is left in the directory: no temporary file.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");

        // generate-key --force over a world-readable key file.
        let hs = dir.join("hs.jwk");
        std::fs::write(&hs, "old\n").unwrap();
        std::fs::set_permissions(&hs, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = hs.to_str().unwrap();
        match parse(&["generate-key", "--out", out, "--force"])
            .unwrap()
            .command
        {
            TokenCommand::GenerateKey(g) => assert_eq!(generate(g).unwrap(), 0),
            _ => unreachable!("parsed generate-key"),
        }
        assert_eq!(mode(&hs), 0o600);
        assert!(Key::from_file(&hs).unwrap().can_sign());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn public_key_names() {
        assert_eq!(
            public_path(Path::new("a/key.jwk")),
            Path::new("a/key.pub.jwk")
        );
        assert_eq!(public_path(Path::new("key")), Path::new("key.pub"));
    }
}
