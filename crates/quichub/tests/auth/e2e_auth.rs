//! MoQT authentication through the real binary: `quichub relay --config`
//! with keys made by `quichub token generate-key`, tokens signed by
//! `quichub token sign` and by PyJWT (an independent implementation), and
//! `quichub pub`/`sub` with `--jwt`: what a token allows works, what it does
//! not is refused with UNAUTHORIZED, a wrong signature, algorithm or `kid`
//! refuses the session, anonymous clients work on `public` prefixes, and an
//! expiring token closes a session that is receiving. Clients pin the
//! relay's certificate (`--fingerprint`), without which they do not send a
//! token.
//!
//! The PyJWT halves are skipped (with a message) when the venv of
//! `scripts/install-mqtt-tools.sh` is missing and `QUICHUB_MQTT_PYTHON` is
//! unset; with it set they must run.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_quichub");

/// A directory of its own for each test, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("quichub-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `quichub ARGS`, with a bound on how long it may take.
fn quichub(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    output_within(child, 30, &args.join(" "))
}

/// Waits for `child` at most `secs` seconds and collects its output.
fn output_within(mut child: Child, secs: u64, what: &str) -> Output {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "`quichub {what}` still running after {secs} s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `quichub token generate-key --algorithm ALG --out DIR/NAME [extra]`.
fn generate_key(dir: &Dir, name: &str, alg: &str, extra: &[&str]) -> PathBuf {
    let out = dir.path(name);
    let mut args = vec![
        "token",
        "generate-key",
        "--algorithm",
        alg,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = quichub(&args);
    assert!(o.status.success(), "generate-key: {}", stderr(&o));
    out
}

/// `quichub token sign --key KEY ARGS`: the token.
fn sign(key: &Path, args: &[&str]) -> String {
    let mut all = vec!["token", "sign", "--key", key.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = quichub(&all);
    assert!(o.status.success(), "token sign: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// The test venv's Python with PyJWT and `cryptography` (ES256), as
/// `scripts/install-mqtt-tools.sh` makes it.
fn pyjwt() -> Option<PathBuf> {
    let required = std::env::var_os("QUICHUB_MQTT_PYTHON").map(PathBuf::from);
    let python = required.clone().or_else(|| {
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/quichub/tools/py/bin/python"))
    })?;
    let ok = Command::new(&python)
        .args(["-c", "import jwt, cryptography"])
        .status()
        .is_ok_and(|s| s.success());
    match (ok, required) {
        (true, _) => Some(python),
        (false, Some(p)) => panic!(
            "QUICHUB_MQTT_PYTHON={} is set but PyJWT or cryptography is missing: run scripts/install-mqtt-tools.sh",
            p.display()
        ),
        (false, None) => {
            eprintln!("SKIPPED PyJWT tokens: PyJWT not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

/// Signs `claims` (JSON; `exp` is made relative: seconds from now) with
/// the JWK file `key` using PyJWT, with `kid` in the header if given.
const PYJWT_SIGN: &str = r#"
import json, sys, time, jwt
jwk = json.load(open(sys.argv[1]))
claims = json.loads(sys.argv[2])
claims["iat"] = int(time.time())
if "exp" in claims:
    claims["exp"] = int(time.time()) + claims["exp"]
headers = {"kid": sys.argv[3]} if len(sys.argv) > 3 else None
print(jwt.encode(claims, jwt.PyJWK(jwk).key, algorithm=jwk["alg"], headers=headers))
"#;

/// Verifies a token with PyJWT and the public JWK file; prints its `root`.
const PYJWT_VERIFY: &str = r#"
import json, sys, jwt
jwk = json.load(open(sys.argv[1]))
print(jwt.decode(sys.argv[2], jwt.PyJWK(jwk).key, algorithms=[jwk["alg"]])["root"])
"#;

fn python(py: &Path, script: &str, args: &[&str]) -> String {
    let o = Command::new(py)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "python: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// A `quichub relay --config FILE` process on loopback ports.
struct Relay {
    child: Child,
    url: String,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Relay {
    /// Starts the relay with `auth` as its `[auth]` section.
    fn start(dir: &Dir, auth: &str) -> Relay {
        let config = dir.path("relay.toml");
        std::fs::write(
            &config,
            format!(
                "[quic]\nbind = \"127.0.0.1:0\"\nhttp3 = false\n[mqtt]\ntcp = \"off\"\n\
                 [http]\naddress = \"off\"\n[metrics]\naddress = \"off\"\n\
                 [store]\ndata_dir = \"off\"\n[auth]\n{auth}\n"
            ),
        )
        .unwrap();
        let mut child = Command::new(BIN)
            .args(["relay", "--config", config.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn relay");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("relay printed nothing").unwrap();
        let addr = first
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .to_string();
        let fingerprint = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("certificate sha256 ").map(str::to_string))
            .expect("the relay prints its certificate's hash");
        FINGERPRINTS
            .lock()
            .unwrap()
            .push((addr.clone(), fingerprint));
        std::thread::spawn(move || for _ in lines {});
        Relay {
            child,
            url: format!("moqt://{addr}/"),
        }
    }

    /// The relay's URL over WebTransport.
    fn https(&self) -> String {
        self.url.replace("moqt://", "https://")
    }
}

/// The certificate hashes of the relays started, by address.
static FINGERPRINTS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// `--fingerprint HASH` of the relay `url` points at, which pub and sub
/// need to send a token.
fn pin(url: &str) -> [String; 2] {
    let hash = FINGERPRINTS
        .lock()
        .unwrap()
        .iter()
        .find(|(addr, _)| url.contains(&format!("://{addr}/")))
        .map(|(_, hash)| hash.clone())
        .unwrap_or_else(|| panic!("no relay started at {url}"));
    ["--fingerprint".into(), hash]
}

/// `quichub sub URL --namespace NS --track lines --framing line --count N`,
/// waiting for a publisher; with `--jwt` when `jwt` is given.
fn spawn_sub(url: &str, ns: &str, count: u32, jwt: Option<&str>) -> Child {
    let mut c = Command::new(BIN);
    c.args(["sub", url, "--namespace", ns, "--track", "lines"])
        .args(pin(url))
        .args(["--framing", "line", "--count", &count.to_string()])
        .args(["--rendezvous-ms", "10000", "--duration", "20"]);
    if let Some(j) = jwt {
        c.args(["--jwt", j]);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `quichub pub URL --namespace NS --track lines --profile stdin --mode
/// announce` with `lines` on its stdin: it sends them once a subscriber is
/// there (or fails at once when refused).
fn publish_lines(url: &str, ns: &str, lines: &str, jwt: Option<&str>) -> Child {
    let mut c = Command::new(BIN);
    c.args(["pub", url, "--namespace", ns, "--track", "lines"])
        .args(pin(url))
        .args(["--profile", "stdin", "--mode", "announce"]);
    if let Some(j) = jwt {
        c.env("QUICHUB_JWT", j);
    }
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    child
}

/// A publisher with `put` and a subscriber with `get` exchange two lines
/// through the relay at `url`.
fn exchange(url: &str, ns: &str, put: Option<&str>, get: Option<&str>) {
    let sub = spawn_sub(url, ns, 2, get);
    std::thread::sleep(Duration::from_millis(300));
    let publisher = publish_lines(url, ns, "one\ntwo\n", put);
    let p = output_within(publisher, 30, "pub");
    let s = output_within(sub, 30, "sub");
    assert!(p.status.success(), "pub on {url} {ns}: {}", stderr(&p));
    assert!(s.status.success(), "sub on {url} {ns}: {}", stderr(&s));
    assert_eq!(String::from_utf8_lossy(&s.stdout), "one\ntwo\n");
}

/// `quichub pub` on `ns` with `jwt` fails, naming `code` (e.g. UNAUTHORIZED).
fn pub_refused(url: &str, ns: &str, jwt: Option<&str>, code: &str) {
    let p = output_within(publish_lines(url, ns, "x\n", jwt), 30, "pub");
    let e = stderr(&p);
    assert!(!p.status.success(), "pub on {ns} was allowed: {e}");
    assert!(e.contains(code), "pub on {ns}: no {code} in: {e}");
}

/// `quichub sub` on `ns` with `jwt` fails, naming `code`.
fn sub_refused(url: &str, ns: &str, jwt: Option<&str>, code: &str) {
    let s = output_within(spawn_sub(url, ns, 1, jwt), 30, "sub");
    let e = stderr(&s);
    assert!(!s.status.success(), "sub on {ns} was allowed: {e}");
    assert!(e.contains(code), "sub on {ns}: no {code} in: {e}");
}

/// HS256: tokens from `quichub token sign` and from PyJWT publish and
/// subscribe what their claims allow, over raw QUIC and WebTransport, and
/// nothing else; `quichub token verify` prints the claims.
#[test]
fn hs256_tokens_allow_their_claims_and_nothing_else() {
    let dir = Dir::new("hs256");
    let key = generate_key(&dir, "hs.jwk", "HS256", &[]);
    let relay = Relay::start(&dir, &format!("key = {:?}", key.to_str().unwrap()));
    let put = sign(&key, &["--root", "demo", "--put", "", "--expires", "1h"]);
    let get = sign(&key, &["--root", "demo", "--get", "x", "--expires", "1h"]);
    exchange(&relay.url, "demo/x", Some(&put), Some(&get));
    exchange(&relay.https(), "demo/x/deeper", Some(&put), Some(&get));
    // Path boundaries: `get: x` under `demo` is not `demo/xy`.
    sub_refused(&relay.url, "demo/xy", Some(&get), "UNAUTHORIZED (0x1)");
    // The subscriber's token does not publish; another root does not either.
    pub_refused(&relay.url, "demo/x", Some(&get), "UNAUTHORIZED (0x1)");
    let other = sign(&key, &["--root", "other", "--put", "", "--get", ""]);
    pub_refused(&relay.url, "demo/x", Some(&other), "UNAUTHORIZED (0x1)");
    sub_refused(&relay.https(), "demo/x", Some(&other), "UNAUTHORIZED (0x1)");
    // No token, and no public prefix: nothing.
    pub_refused(&relay.url, "demo/x", None, "UNAUTHORIZED (0x1)");
    // A token signed with another secret refuses the session.
    let stranger = generate_key(&dir, "stranger.jwk", "HS256", &[]);
    let forged = sign(&stranger, &["--root", "demo", "--put", ""]);
    pub_refused(&relay.url, "demo/x", Some(&forged), "UNAUTHORIZED (0x2)");
    pub_refused(
        &relay.https(),
        "demo/x",
        Some("not-a-jwt"),
        "UNAUTHORIZED (0x2)",
    );

    let o = quichub(&["token", "verify", "--key", key.to_str().unwrap(), &put]);
    assert!(o.status.success(), "{}", stderr(&o));
    let claims: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(claims["root"], "demo");
    assert_eq!(claims["put"], serde_json::json!([""]));
    assert!(claims["exp"].as_u64().is_some(), "{claims}");
    let o = quichub(&["token", "verify", "--key", key.to_str().unwrap(), &forged]);
    assert!(!o.status.success());

    let Some(py) = pyjwt() else { return };
    let key_s = key.to_str().unwrap();
    let py_put = python(
        &py,
        PYJWT_SIGN,
        &[key_s, r#"{"root": "demo", "put": "x", "exp": 3600}"#],
    );
    let py_get = python(
        &py,
        PYJWT_SIGN,
        &[key_s, r#"{"root": "demo", "get": [""]}"#],
    );
    exchange(&relay.url, "demo/x", Some(&py_put), Some(&py_get));
    pub_refused(&relay.url, "demo/y", Some(&py_put), "UNAUTHORIZED (0x1)");
    // quichub verifies PyJWT's token, and PyJWT quichub's.
    let o = quichub(&["token", "verify", "--key", key_s, &py_put]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(python(&py, PYJWT_VERIFY, &[key_s, &put]), "demo");
}

/// ES256: the relay holds only the public key; tokens signed with the
/// private key by quichub and by PyJWT work; an HS256 token (even one whose
/// secret is the public key's JSON) and an ES256 token of another key pair
/// are refused.
#[test]
fn es256_key_pair_and_wrong_algorithm() {
    let dir = Dir::new("es256");
    let private = generate_key(&dir, "es.jwk", "ES256", &[]);
    let public = dir.path("es.pub.jwk");
    let relay = Relay::start(&dir, &format!("key = {:?}", public.to_str().unwrap()));
    let token = sign(&private, &["--root", "demo", "--put", "", "--get", ""]);
    exchange(&relay.url, "demo/x", Some(&token), Some(&token));

    let hs = generate_key(&dir, "hs.jwk", "HS256", &[]);
    let wrong_alg = sign(&hs, &["--root", "demo", "--put", ""]);
    pub_refused(&relay.url, "demo/x", Some(&wrong_alg), "UNAUTHORIZED (0x2)");
    let other = generate_key(&dir, "other.jwk", "ES256", &[]);
    let wrong_key = sign(&other, &["--root", "demo", "--put", ""]);
    pub_refused(&relay.url, "demo/x", Some(&wrong_key), "UNAUTHORIZED (0x2)");
    let o = quichub(&["token", "verify", "--key", public.to_str().unwrap(), &token]);
    assert!(o.status.success(), "{}", stderr(&o));

    let Some(py) = pyjwt() else { return };
    let p = private.to_str().unwrap();
    let py_token = python(
        &py,
        PYJWT_SIGN,
        &[
            p,
            r#"{"root": "demo", "put": [""], "get": [""], "exp": 600}"#,
        ],
    );
    exchange(&relay.https(), "demo/py", Some(&py_token), Some(&py_token));
    // An HS256 token whose "secret" is the public key file: the classic
    // algorithm confusion, refused because the key is an EC key.
    let public_json = std::fs::read_to_string(&public).unwrap();
    let confused = python(
        &py,
        "import jwt, sys; print(jwt.encode({'root': 'demo', 'put': ''}, sys.argv[1].encode(), algorithm='HS256'))",
        &[&public_json],
    );
    pub_refused(&relay.url, "demo/x", Some(&confused), "UNAUTHORIZED (0x2)");
    assert_eq!(
        python(&py, PYJWT_VERIFY, &[public.to_str().unwrap(), &token]),
        "demo"
    );
}

/// `key_dir` with two keys named by `kid`: each signs tokens the relay
/// accepts; a `kid` it does not have is refused.
#[test]
fn key_dir_chooses_by_kid() {
    let dir = Dir::new("kid");
    let keys = dir.path("keys");
    std::fs::create_dir(&keys).unwrap();
    let a = generate_key(&dir, "keys/a.jwk", "HS256", &["--kid", "a"]);
    let b = generate_key(
        &dir,
        "keys/b.jwk",
        "ES256",
        &[
            "--kid",
            "b",
            "--public",
            dir.path("b.pub.jwk").to_str().unwrap(),
        ],
    );
    // The directory holds the verification keys: move b's private key out.
    let b_private = dir.path("b.jwk");
    std::fs::rename(&b, &b_private).unwrap();
    std::fs::rename(dir.path("b.pub.jwk"), keys.join("b.jwk")).unwrap();
    let c = generate_key(&dir, "c.jwk", "HS256", &["--kid", "c"]);
    let relay = Relay::start(&dir, &format!("key_dir = {:?}", keys.to_str().unwrap()));
    let by_a = sign(&a, &["--root", "demo", "--put", ""]);
    let by_b = sign(&b_private, &["--root", "demo", "--get", ""]);
    exchange(&relay.url, "demo/kid", Some(&by_a), Some(&by_b));
    let by_c = sign(&c, &["--root", "demo", "--put", ""]);
    pub_refused(&relay.url, "demo/kid", Some(&by_c), "UNAUTHORIZED (0x2)");
    let o = quichub(&[
        "token",
        "verify",
        "--key-dir",
        keys.to_str().unwrap(),
        &by_c,
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("kid"), "{}", stderr(&o));

    let Some(py) = pyjwt() else { return };
    let py_b = python(
        &py,
        PYJWT_SIGN,
        &[
            b_private.to_str().unwrap(),
            r#"{"root": "demo", "put": ""}"#,
            "b",
        ],
    );
    exchange(&relay.url, "demo/kid2", Some(&py_b), Some(&by_b));
    // b's key under a's kid: a's key is HMAC, so it is refused.
    let py_b_as_a = python(
        &py,
        PYJWT_SIGN,
        &[
            b_private.to_str().unwrap(),
            r#"{"root": "demo", "put": ""}"#,
            "a",
        ],
    );
    pub_refused(
        &relay.url,
        "demo/kid",
        Some(&py_b_as_a),
        "UNAUTHORIZED (0x2)",
    );
}

/// With keys configured and `public = ["anon"]`, clients without a token
/// publish and subscribe under `anon` (over both ways in), and nowhere
/// else.
#[test]
fn anonymous_clients_on_a_public_prefix() {
    let dir = Dir::new("public");
    let key = generate_key(&dir, "hs.jwk", "HS256", &[]);
    let relay = Relay::start(
        &dir,
        &format!("key = {:?}\npublic = [\"anon\"]", key.to_str().unwrap()),
    );
    exchange(&relay.url, "anon/x", None, None);
    exchange(&relay.https(), "anon", None, None);
    pub_refused(&relay.url, "anonx", None, "UNAUTHORIZED (0x1)");
    sub_refused(&relay.url, "demo/x", None, "UNAUTHORIZED (0x1)");
}

/// A subscriber whose token expires while it receives is closed with
/// EXPIRED_AUTH_TOKEN; the publisher, with a token of its own, goes on.
#[test]
fn an_expiring_token_closes_the_session_mid_stream() {
    let dir = Dir::new("expiry");
    let key = generate_key(&dir, "hs.jwk", "HS256", &[]);
    // No clock leeway: the session ends at `exp`, not a minute later.
    let relay = Relay::start(
        &dir,
        &format!("key = {:?}\nleeway_s = 0", key.to_str().unwrap()),
    );
    let put = sign(&key, &["--root", "demo", "--put", "", "--expires", "1h"]);
    let publisher = Command::new(BIN)
        .args([
            "pub",
            &relay.url,
            "--namespace",
            "demo/live",
            "--profile",
            "audio",
        ])
        .args(pin(&relay.url))
        .args(["--duration", "60", "--jwt", &put])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut publisher = KillOnDrop(publisher);
    let short = sign(&key, &["--root", "demo", "--get", "", "--expires", "3s"]);
    let sub = Command::new(BIN)
        .args([
            "sub",
            &relay.url,
            "--namespace",
            "demo/live",
            "--track",
            "audio",
        ])
        .args(pin(&relay.url))
        .args(["--stats", "--duration", "60", "--jwt", &short])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let s = output_within(sub, 30, "sub");
    let e = stderr(&s);
    assert!(!s.status.success(), "{e}");
    assert!(e.contains("EXPIRED_AUTH_TOKEN (0x18)"), "{e}");
    let received: u64 = e
        .split("received ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {e}"));
    assert!(received > 0, "nothing arrived before the expiry: {e}");
    assert!(
        publisher.0.try_wait().unwrap().is_none(),
        "the publisher must go on"
    );
    let _ = publisher.0.kill();
}

/// Without `--fingerprint` a client does not send its token (`--jwt` or
/// `?jwt=`) and says how to, before connecting; with `--insecure` it does.
#[test]
fn a_token_goes_only_to_a_pinned_relay_unless_insecure() {
    let dir = Dir::new("pinned");
    let key = generate_key(&dir, "hs.jwk", "HS256", &[]);
    let relay = Relay::start(&dir, &format!("key = {:?}", key.to_str().unwrap()));
    let token = sign(&key, &["--root", "demo", "--put", "", "--get", ""]);
    let in_url = format!("{}?jwt={token}", relay.url);
    let refused: [&[&str]; 2] = [
        &["pub", &relay.url, "--jwt", &token, "--count", "1"],
        &["sub", &in_url, "--count", "1", "--duration", "5"],
    ];
    for args in refused {
        let o = quichub(args);
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?}: {e}");
        assert!(
            e.contains("not sending the token")
                && e.contains("--fingerprint")
                && e.contains("--insecure"),
            "{args:?}: {e}"
        );
    }
    let sub = spawn_sub(&relay.url, "demo/insecure", 1, Some(&token));
    std::thread::sleep(Duration::from_millis(300));
    let mut publisher = Command::new(BIN)
        .args([
            "pub",
            &relay.url,
            "--namespace",
            "demo/insecure",
            "--track",
            "lines",
        ])
        .args(["--profile", "stdin", "--mode", "announce", "--insecure"])
        .args(["--jwt", &token])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    publisher
        .stdin
        .take()
        .unwrap()
        .write_all(b"unpinned\n")
        .unwrap();
    let p = output_within(publisher, 30, "pub --insecure");
    let s = output_within(sub, 30, "sub");
    assert!(p.status.success(), "pub --insecure: {}", stderr(&p));
    assert_eq!(String::from_utf8_lossy(&s.stdout), "unpinned\n");
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// mosquitto 2's safe default: a non-loopback listener without
/// authentication refuses to start, naming `allow_anonymous`; with
/// `--allow-anonymous` it starts.
#[test]
fn a_non_loopback_relay_needs_auth_or_allow_anonymous() {
    let base = [
        "relay",
        "--bind",
        "0.0.0.0:0",
        "--metrics",
        "off",
        "--mqtt",
        "off",
        "--http",
        "off",
        "--data-dir",
        "off",
    ];
    let o = quichub(&base);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("allow_anonymous") && e.contains("quic.bind"),
        "{e}"
    );

    let dir = Dir::new("exposed");
    let key = generate_key(&dir, "hs.jwk", "HS256", &[]);
    for extra in [
        &["--allow-anonymous"][..],
        &["--auth-key", key.to_str().unwrap()],
    ] {
        let mut child = Command::new(BIN)
            .args(base)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let first = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .next()
            .expect("relay printed nothing")
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            first.contains("listening on udp 0.0.0.0:"),
            "{extra:?}: {first}"
        );
    }
}

/// Real media with tokens: `quichub pub --broadcast demo/x` with a token
/// that may publish under `demo` and `quichub sub --broadcast demo/x` with
/// one that may subscribe (in the URL, `?jwt=`): every video frame arrives.
/// Skipped without ffmpeg, unless `QUICHUB_MEDIA_TESTS=1`.
#[test]
fn a_broadcast_with_tokens() {
    let have = Command::new("ffmpeg")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("QUICHUB_MEDIA_TESTS").as_deref() != Ok("1"),
            "QUICHUB_MEDIA_TESTS=1 but ffmpeg is not installed"
        );
        eprintln!("SKIPPED: ffmpeg not installed");
        return;
    }
    let dir = Dir::new("media");
    let input = dir.path("in.mp4");
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args([
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=320x180:rate=30",
            "-t",
            "2",
        ])
        .args([
            "-c:v", "libx264", "-preset", "veryfast", "-g", "30", "-pix_fmt", "yuv420p",
        ])
        .args([
            "-f",
            "mp4",
            "-movflags",
            "cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame",
        ])
        .arg(&input)
        .output()
        .unwrap();
    assert!(o.status.success(), "ffmpeg: {}", stderr(&o));
    let key = generate_key(&dir, "hs.jwk", "HS256", &[]);
    let relay = Relay::start(&dir, &format!("key = {:?}", key.to_str().unwrap()));
    let put = sign(&key, &["--root", "demo", "--put", "", "--expires", "10m"]);
    let get = sign(&key, &["--root", "demo", "--get", "x", "--expires", "10m"]);
    let out = dir.path("out.mp4");
    let sub = Command::new(BIN)
        .args([
            "sub",
            &format!("{}?jwt={get}", relay.url),
            "--broadcast",
            "demo/x",
        ])
        .args(pin(&relay.url))
        .args(["--output", out.to_str().unwrap(), "--duration", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let [flag, hash] = pin(&relay.url);
    let p = quichub(&[
        "pub",
        &relay.url,
        "--broadcast",
        "demo/x",
        "--input",
        input.to_str().unwrap(),
        "--jwt",
        &put,
        &flag,
        &hash,
    ]);
    assert!(p.status.success(), "pub: {}", stderr(&p));
    let s = output_within(sub, 60, "sub --broadcast");
    let log = stderr(&s);
    assert!(s.status.success(), "sub: {log}");
    assert!(log.contains("video 60 frames"), "{log}");
    // The subscriber's token does not publish.
    let p = quichub(&[
        "pub",
        &relay.url,
        "--broadcast",
        "demo/x",
        "--input",
        input.to_str().unwrap(),
        "--jwt",
        &get,
        &flag,
        &hash,
    ]);
    assert!(!p.status.success());
    assert!(stderr(&p).contains("UNAUTHORIZED (0x1)"), "{}", stderr(&p));
}
