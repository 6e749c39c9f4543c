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
    /// Key file: JWK (JSON or base64url), PEM private key, or raw secret.
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
    #[arg(long)]
    expires: Option<String>,
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

/// Writes `contents`, owner-only when `private`; refuses to overwrite
/// unless `force`.
fn write_file(path: &Path, contents: &str, private: bool, force: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(if private { 0o600 } else { 0o644 });
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("{} (use --force to overwrite)", path.display()))?;
    f.write_all(contents.as_bytes())
        .with_context(|| path.display().to_string())?;
    Ok(())
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
    let exp = match &s.expires {
        Some(e) => Some(now.saturating_add(parse_duration(e)?.as_secs())),
        None => None,
    };
    if s.put.is_empty() && s.get.is_empty() && s.sub.is_none() {
        bail!("a token needs --put, --get or --sub");
    }
    let claims = Claims {
        root: s.root,
        put: s.put,
        get: s.get,
        sub: s.sub,
        exp,
        iat: Some(now),
        ..Claims::default()
    };
    let alg = s.algorithm.as_deref().map(algorithm).transpose()?;
    println!("{}", key.sign(&claims, alg)?);
    Ok(0)
}

fn verify(v: VerifyArgs) -> anyhow::Result<i32> {
    if v.key.is_none() && v.key_dir.is_none() && v.jwks.is_none() {
        bail!("give --key, --key-dir or --jwks");
    }
    let keys = Keys::load(v.key.as_deref(), v.key_dir.as_deref(), v.jwks.as_deref())?;
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

    #[test]
    fn public_key_names() {
        assert_eq!(
            public_path(Path::new("a/key.jwk")),
            Path::new("a/key.pub.jwk")
        );
        assert_eq!(public_path(Path::new("key")), Path::new("key.pub"));
    }
}
