use super::*;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn claims() -> Claims {
    Claims {
        root: "demo".into(),
        put: vec!["bbb".into()],
        get: vec!["".into()],
        exp: Some(1_800_000_600),
        iat: Some(1_800_000_000),
        ..Claims::default()
    }
}

fn key(v: &serde_json::Value) -> Key {
    Key::from_jwk(v).unwrap()
}

#[test]
fn generated_keys_sign_and_verify_for_every_algorithm() {
    for alg in [
        Algorithm::HS256,
        Algorithm::HS384,
        Algorithm::HS512,
        Algorithm::ES256,
        Algorithm::ES384,
        Algorithm::EdDSA,
    ] {
        let g = generate(alg, Some("k1")).unwrap();
        let private = key(&g.private);
        assert_eq!(private.kid(), Some("k1"));
        assert_eq!(private.algorithms(), [alg]);
        let token = private.sign(&claims(), None).unwrap();
        assert_eq!(private.verify(&token, now()).unwrap(), claims(), "{alg:?}");
        if let Some(public) = &g.public {
            let public = key(public);
            assert!(!public.can_sign());
            assert_eq!(public.verify(&token, now()).unwrap(), claims(), "{alg:?}");
            assert!(public.sign(&claims(), None).is_err());
        }
        // The moq-token file encoding (base64url of the JSON) loads too.
        let file = URL_SAFE_NO_PAD.encode(g.private.to_string());
        let k = Key::parse(file.as_bytes()).unwrap();
        assert_eq!(k.verify(&token, now()).unwrap(), claims());
    }
}

#[test]
fn rejections_have_distinct_reasons() {
    let a = key(&generate(Algorithm::HS256, None).unwrap().private);
    let b = key(&generate(Algorithm::HS256, None).unwrap().private);
    let token = a.sign(&claims(), None).unwrap();
    assert!(matches!(
        b.verify(&token, now()),
        Err(AuthError::BadSignature)
    ));

    // Tampered payload.
    let mut parts: Vec<&str> = token.split('.').collect();
    let forged = URL_SAFE_NO_PAD.encode(br#"{"root":"","put":""}"#);
    parts[1] = &forged;
    assert!(matches!(
        a.verify(&parts.join("."), now()),
        Err(AuthError::BadSignature)
    ));

    // Expired (exp == now counts as expired), not yet valid.
    let late = now() + Duration::from_secs(600);
    assert!(matches!(a.verify(&token, late), Err(AuthError::Expired)));
    let nbf = Claims {
        nbf: Some(1_800_000_100),
        ..claims()
    };
    let t = a.sign(&nbf, None).unwrap();
    assert!(matches!(a.verify(&t, now()), Err(AuthError::Expired)));

    // Wrong algorithm: an HS384 token for an HS256 key; an ES256 key.
    let hs = key(&serde_json::json!({"kty": "oct", "alg": "HS384", "k": b64(&[7; 48])}));
    let t384 = hs.sign(&claims(), None).unwrap();
    let hs256 = key(&serde_json::json!({"kty": "oct", "alg": "HS256", "k": b64(&[7; 48])}));
    assert!(matches!(
        hs256.verify(&t384, now()),
        Err(AuthError::WrongAlgorithm)
    ));
    let es = key(&generate(Algorithm::ES256, None).unwrap().public.unwrap());
    assert!(matches!(
        es.verify(&token, now()),
        Err(AuthError::WrongAlgorithm)
    ));

    // alg none.
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(br#"{"root":"","put":""}"#)
    );
    assert!(matches!(
        a.verify(&none, now()),
        Err(AuthError::WrongAlgorithm)
    ));

    // Malformed.
    // Validly signed claims of the wrong shape.
    let t = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &serde_json::json!({"put": 5}),
        a.encoding.as_ref().unwrap(),
    )
    .unwrap();
    assert!(matches!(a.verify(&t, now()), Err(AuthError::BadToken(_))));
    // A mangled payload fails the signature check first.
    assert!(matches!(
        a.verify("eyJhbGciOiJIUzI1NiJ9.!!!.x", now()),
        Err(AuthError::BadSignature)
    ));
    for bad in ["", "abc", "a.b.c", ".."] {
        let e = a.verify(bad, now()).unwrap_err();
        assert_eq!(e.reason(), "malformed", "{bad:?}: {e}");
    }

    // Useless token (no put, get or sub), as moq-token.
    let t = a.sign(&Claims::default(), None).unwrap();
    assert!(matches!(a.verify(&t, now()), Err(AuthError::BadToken(_))));
    let t = a
        .sign(
            &Claims {
                sub: Some("alice".into()),
                ..Claims::default()
            },
            None,
        )
        .unwrap();
    assert!(a.verify(&t, now()).is_ok());
}

#[test]
fn claims_accept_string_or_array_and_keep_sub() {
    let c: Claims = serde_json::from_str(
        r#"{"root":"r","put":"a","get":["b","c"],"cluster":true,"sub":"u","exp":5}"#,
    )
    .unwrap();
    assert_eq!(c.put, ["a"]);
    assert_eq!(c.get, ["b", "c"]);
    assert!(c.cluster);
    assert_eq!(c.sub.as_deref(), Some("u"));
    // An empty get is "everything under root", an absent one nothing.
    let c: Claims = serde_json::from_str(r#"{"get":""}"#).unwrap();
    assert_eq!(c.get, [""]);
    assert!(c.put.is_empty());
    let s = serde_json::to_string(&Claims {
        root: "r".into(),
        put: vec!["p".into()],
        ..Claims::default()
    })
    .unwrap();
    assert_eq!(s, r#"{"root":"r","put":["p"]}"#);
}

#[test]
fn key_files_in_every_format() {
    // moq-token's legacy JWK without kty, with padded base64url.
    let k = Key::parse(br#"{"alg":"HS256","key_ops":["sign","verify"],"k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}"#).unwrap();
    assert_eq!(k.algorithms(), [Algorithm::HS256]);
    // Raw secret, trailing newline dropped: signs with any HS algorithm.
    let raw = Key::from_secret(b"0123456789abcdef0123456789abcdef\n").unwrap();
    let t = raw.sign(&claims(), Some(Algorithm::HS512)).unwrap();
    assert!(raw.verify(&t, now()).is_ok());
    // Same secret as the JWK above.
    let t = k.sign(&claims(), None).unwrap();
    assert!(raw.verify(&t, now()).is_ok());
    // Too short.
    assert!(Key::from_secret(b"short").is_err());
    // The same bytes, undeclared, are no key at all.
    assert!(Key::parse(b"0123456789abcdef0123456789abcdef\n").is_err());
    // key_ops without verify.
    let sign_only =
        key(&serde_json::json!({"kty":"oct","alg":"HS256","k":b64(&[1;32]),"key_ops":["sign"]}));
    let t = sign_only.sign(&claims(), None).unwrap();
    assert!(sign_only.verify(&t, now()).is_err());
    // alg that does not fit the key type.
    assert!(
        Key::from_jwk(&serde_json::json!({"kty":"oct","alg":"ES256","k":b64(&[1;32])})).is_err()
    );
    // EC private key that does not match its public key.
    let a = generate(Algorithm::ES256, None).unwrap().private;
    let b = generate(Algorithm::ES256, None).unwrap().private;
    let mut mixed = a.clone();
    mixed["d"] = b["d"].clone();
    assert!(Key::from_jwk(&mixed).is_err());
}

fn openssl(args: &[&str]) -> Option<()> {
    let st = std::process::Command::new("openssl")
        .args(args)
        .output()
        .ok()?;
    st.status.success().then_some(())
}

/// PEM keys made by openssl: signing with the private file, verifying with
/// the public one (skipped without openssl).
#[test]
fn openssl_pem_keys() {
    let dir = std::env::temp_dir().join(format!("quichub-auth-pem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: &[(&[&str], Algorithm)] = &[
        (
            &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            Algorithm::ES256,
        ),
        (
            &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
            Algorithm::ES384,
        ),
        (&["-algorithm", "ED25519"], Algorithm::EdDSA),
        (
            &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            Algorithm::RS256,
        ),
    ];
    for (i, (args, alg)) in cases.iter().enumerate() {
        let private = dir.join(format!("k{i}.pem"));
        let public = dir.join(format!("k{i}.pub.pem"));
        let (p, q) = (private.to_str().unwrap(), public.to_str().unwrap());
        let mut gen = vec!["genpkey", "-out", p];
        gen.extend_from_slice(args);
        if openssl(&gen).is_none() {
            eprintln!("openssl not usable: skipped");
            return;
        }
        openssl(&["pkey", "-in", p, "-pubout", "-out", q]).unwrap();
        let sk = Key::from_file(&private).unwrap();
        let pk = Key::from_file(&public).unwrap();
        assert!(sk.algorithms().contains(alg), "{alg:?}");
        assert!(pk.algorithms().contains(alg), "{alg:?}");
        let t = sk.sign(&claims(), Some(*alg)).unwrap();
        assert_eq!(pk.verify(&t, now()).unwrap(), claims(), "{alg:?}");
        assert_eq!(sk.verify(&t, now()).unwrap(), claims(), "{alg:?}");
        if *alg == Algorithm::RS256 {
            let t = sk.sign(&claims(), Some(Algorithm::PS384)).unwrap();
            assert!(pk.verify(&t, now()).is_ok());
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn key_sets_by_kid() {
    let dir = std::env::temp_dir().join(format!("quichub-auth-keys-{}", std::process::id()));
    let kd = dir.join("keys");
    std::fs::create_dir_all(&kd).unwrap();
    let a = generate(Algorithm::HS256, Some("a")).unwrap();
    let b = generate(Algorithm::EdDSA, Some("b")).unwrap();
    let c = generate(Algorithm::ES256, Some("c")).unwrap();
    let d = generate(Algorithm::HS256, None).unwrap();
    std::fs::write(kd.join("a.jwk"), a.private.to_string()).unwrap();
    std::fs::write(
        kd.join("b"),
        URL_SAFE_NO_PAD.encode(b.public.as_ref().unwrap().to_string()),
    )
    .unwrap();
    std::fs::write(kd.join(".hidden"), "ignored").unwrap();
    let jwks = dir.join("jwks.json");
    std::fs::write(
        &jwks,
        serde_json::json!({"keys": [c.public.as_ref().unwrap()]}).to_string(),
    )
    .unwrap();
    let single = dir.join("single.jwk");
    std::fs::write(&single, d.private.to_string()).unwrap();

    let keys = Keys::load(Some(&single), Some(&kd), Some(&jwks)).unwrap();
    let sign = |v: &serde_json::Value| key(v).sign(&claims(), None).unwrap();
    assert!(keys.verify(&sign(&a.private), now()).is_ok());
    assert!(keys.verify(&sign(&b.private), now()).is_ok());
    assert!(keys.verify(&sign(&c.private), now()).is_ok());
    // No kid: the single key.
    assert!(keys.verify(&sign(&d.private), now()).is_ok());
    // Unknown kid.
    let mut e = generate(Algorithm::HS256, Some("zzz")).unwrap().private;
    assert!(matches!(
        keys.verify(&sign(&e), now()),
        Err(AuthError::UnknownKid)
    ));
    // A known kid with another key's signature.
    e["kid"] = "a".into();
    assert!(matches!(
        keys.verify(&sign(&e), now()),
        Err(AuthError::BadSignature)
    ));
    // Without a single key, a token without kid matches nothing.
    let keys = Keys::load(None, Some(&kd), None).unwrap();
    assert!(matches!(
        keys.verify(&sign(&d.private), now()),
        Err(AuthError::UnknownKid)
    ));
    // No keys at all.
    assert!(matches!(
        Keys::default().verify(&sign(&d.private), now()),
        Err(AuthError::NoKeys)
    ));

    // A file whose kid is not its name.
    std::fs::write(kd.join("x.jwk"), a.private.to_string()).unwrap();
    assert!(Keys::load(None, Some(&kd), None).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn jwt_shape() {
    assert!(looks_like_jwt(b"eyJh.eyJy.c2ln"));
    assert!(!looks_like_jwt(b"eyJh.eyJy."));
    assert!(!looks_like_jwt(b"password"));
    assert!(!looks_like_jwt(b"a.b.c.d"));
    assert!(!looks_like_jwt(b"a b.c.d"));
}

/// A token whose HMAC is computed by openssl, not jsonwebtoken (skipped
/// without openssl).
#[test]
fn hs256_token_signed_by_openssl() {
    let secret = [0x5a_u8; 32];
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(br#"{"root":"demo","get":"","exp":1800000600}"#)
    );
    let mut child = match std::process::Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-mac",
            "HMAC",
            "-macopt",
            &format!("hexkey:{hex}"),
            "-binary",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(_) => {
            eprintln!("openssl not installed: skipped");
            return;
        }
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&out.stdout));
    let k = key(&serde_json::json!({"kty": "oct", "alg": "HS256", "k": b64(&secret)}));
    let c = k.verify(&token, now()).unwrap();
    assert_eq!(c.root, "demo");
    assert_eq!(c.get, [""]);
}

/// A damaged key file is an error, never a raw HMAC secret made of its text
/// (a public key's text is public: anyone could sign HS256 tokens with it).
#[test]
fn damaged_key_files_are_refused_not_taken_as_secrets() {
    let g = generate(Algorithm::ES256, Some("k")).unwrap();
    let public = g.public.unwrap();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&public).unwrap());
    assert!(Key::parse(b64.as_bytes()).is_ok());
    for cut in [b64.len() - 1, b64.len() - 7, b64.len() / 2] {
        let e = Key::parse(&b64.as_bytes()[..cut]).err();
        assert!(e.is_some_and(|e| e.contains("JWK")), "cut at {cut}");
    }
    let json = serde_json::to_string(&public).unwrap();
    assert!(Key::parse(&json.as_bytes()[..json.len() - 3]).is_err());
    assert!(Key::parse(b"-----BEGIN PUBLIC KEY-----\nAAAA\n").is_err());
}

/// A scratch directory, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("quichub-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The error `Key::from_file` gives for `path`, which must name the file.
fn refused(path: &Path) -> String {
    let e = Key::from_file(path).expect_err("refused").to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
    e
}

/// Public files that used to become HMAC secrets (anyone who could read
/// them could sign HS256 tokens) are refused, each with what it looks like.
#[test]
fn files_of_unknown_format_are_refused_not_taken_as_secrets() {
    let dir = Scratch::new("unknown-format");
    let ssh = dir.write(
        "id_ed25519.pub",
        b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@example\n",
    );
    assert!(refused(&ssh).contains("OpenSSH"));

    let rng = ring::rand::SystemRandom::new();
    let der =
        signature::EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
    let der_file = dir.write("key.der", der.as_ref());
    assert!(refused(&der_file).contains("DER"));

    let body = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    );
    // The block alone is a key; openssl pkcs12's output around it is not.
    assert!(Key::parse(pem.as_bytes()).is_ok());
    let bagged = dir.write(
        "bag.pem",
        format!(
            "Bag Attributes\n    localKeyID: 01 00 00 00 \nKey Attributes: <No Attributes>\n{pem}"
        )
        .as_bytes(),
    );
    assert!(refused(&bagged).contains("Bag Attributes"));

    let long_text = dir.write("key", b"0123456789abcdef0123456789abcdef0123456789\n");
    assert!(refused(&long_text).contains(".secret"));
    assert!(refused(&dir.write("empty", b"")).contains("empty"));
}

/// A raw secret is read only from a file named `*.secret`: 32 bytes work
/// (with the HS algorithms, also as a `key_dir` entry named by `kid`), 16
/// are refused, and a key file given that name is refused.
#[test]
fn declared_secret_files() {
    let dir = Scratch::new("declared-secret");
    let secret = [0x42_u8; 32];
    let path = dir.write("hs.secret", &secret);
    let k = Key::from_file(&path).unwrap();
    assert_eq!(k.algorithms(), HS);
    assert!(k.kid().is_none());
    let t = k.sign(&claims(), None).unwrap();
    let jwk = key(&serde_json::json!({"kty": "oct", "k": b64(&secret)}));
    assert_eq!(jwk.verify(&t, now()).unwrap(), claims());
    assert_eq!(
        Key::from_file(&path).unwrap().verify(&t, now()).unwrap(),
        claims()
    );

    let e = refused(&dir.write("short.secret", &[0x42; 16]));
    assert!(e.contains("16 bytes"), "{e}");

    let public = generate(Algorithm::ES256, None).unwrap().public.unwrap();
    let e = refused(&dir.write("es.secret", public.to_string().as_bytes()));
    assert!(e.contains("not an HMAC secret"), "{e}");
    let e = refused(&dir.write(
        "ssh.secret",
        b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n",
    ));
    assert!(e.contains("not an HMAC secret"), "{e}");

    let kd = dir.0.join("keys");
    std::fs::create_dir(&kd).unwrap();
    std::fs::write(kd.join("k1.secret"), secret).unwrap();
    let keys = Keys::load(None, Some(&kd), None).unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".into());
    let t = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(&secret)).unwrap();
    assert_eq!(keys.verify(&t, now()).unwrap(), claims());
}

/// `Keys::with_leeway` accepts a token that long after its `exp` and
/// before its `nbf`, not longer; `Key::verify` and `Keys` without it have
/// none.
#[test]
fn leeway_on_exp_and_nbf() {
    let dir = Scratch::new("leeway");
    let g = generate(Algorithm::HS256, None).unwrap();
    let path = dir.write("k.jwk", g.private.to_string().as_bytes());
    let k = key(&g.private);
    let exp = claims().exp.unwrap();
    let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
    let t = k.sign(&claims(), None).unwrap();
    let strict = Keys::load(Some(&path), None, None).unwrap();
    assert_eq!(strict.leeway(), Duration::ZERO);
    let lenient = Keys::load(Some(&path), None, None)
        .unwrap()
        .with_leeway(Duration::from_secs(60));
    assert_eq!(lenient.leeway(), Duration::from_secs(60));
    assert!(matches!(
        strict.verify(&t, at(exp)),
        Err(AuthError::Expired)
    ));
    assert!(matches!(
        k.verify(&t, at(exp + 30)),
        Err(AuthError::Expired)
    ));
    assert!(lenient.verify(&t, at(exp)).is_ok());
    assert!(lenient.verify(&t, at(exp + 59)).is_ok());
    assert!(matches!(
        lenient.verify(&t, at(exp + 60)),
        Err(AuthError::Expired)
    ));

    let nbf = 1_800_000_100;
    let t = k
        .sign(
            &Claims {
                nbf: Some(nbf),
                ..claims()
            },
            None,
        )
        .unwrap();
    assert!(matches!(
        strict.verify(&t, at(nbf - 1)),
        Err(AuthError::Expired)
    ));
    assert!(lenient.verify(&t, at(nbf - 60)).is_ok());
    assert!(matches!(
        lenient.verify(&t, at(nbf - 61)),
        Err(AuthError::Expired)
    ));
    assert_eq!(DEFAULT_LEEWAY, Duration::from_secs(60));
}

/// An `exp` beyond what the clock can hold is no expiry, not a panic.
#[test]
fn an_exp_far_beyond_the_clock_never_expires() {
    let c = Claims {
        exp: Some(u64::MAX),
        ..claims()
    };
    assert_eq!(c.expires(), None);
    let k = key(&generate(Algorithm::HS256, None).unwrap().private);
    let t = k.sign(&c, None).unwrap();
    assert!(k.verify(&t, now()).is_ok());
}
