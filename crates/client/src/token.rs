//! A token in a connection URL (`?jwt=`, moq-dev's convention), and where it
//! may be sent: shared by every command line that connects with `--jwt`
//! (`quichub pub`/`sub`, the benchmarks), so the rule is written once.

use crate::Verify;

/// A verifier from a `--fingerprint` option: the relay certificate's
/// SHA-256 in hex, or `None` for no check.
pub fn verify_from(fingerprint: Option<&str>) -> anyhow::Result<Verify> {
    Ok(match fingerprint {
        Some(f) => Verify::Fingerprints(vec![quichub_net::tls::unhex(f)
            .filter(|b| b.len() == 32)
            .ok_or_else(|| anyhow::anyhow!("--fingerprint must be 64 hex digits"))?]),
        None => Verify::Insecure,
    })
}

/// Refuses to send a token (`?jwt=` in `url`, where `--jwt` puts it) to a
/// relay whose certificate `verify` does not check, or over cleartext
/// `ws://`, unless `insecure`: whoever answers in the relay's place (a
/// spoofed address, a captive network) would get the token and could use
/// it until it expires. Without a token nothing is at stake beyond the
/// data, and an unchecked connection stays allowed as before.
pub fn refuse_unverified_token(url: &str, verify: &Verify, insecure: bool) -> anyhow::Result<()> {
    // A URL that does not parse fails at connect, with its own message.
    let Ok(u) = url::Url::parse(url) else {
        return Ok(());
    };
    let token = u.query_pairs().any(|(k, v)| k == "jwt" && !v.is_empty());
    if insecure || !token {
        return Ok(());
    }
    if u.scheme() == "ws" {
        anyhow::bail!(
            "not sending the token over ws://, which is not encrypted: use wss:// with \
             --fingerprint, or give --insecure to send it anyway"
        );
    }
    if matches!(verify, Verify::Insecure) {
        anyhow::bail!(
            "not sending the token to a relay whose certificate is not checked: give \
             --fingerprint SHA256 (the relay prints it at start as `certificate sha256 ...` \
             and keeps it in its data directory's tls/cert.sha256), or --insecure to send \
             it anyway"
        );
    }
    Ok(())
}

/// `url` with `jwt` added as its `?jwt=` query parameter (moq-dev's
/// convention; the relay reads it from the PATH setup option on raw QUIC and
/// from the CONNECT URL on WebTransport). A URL that already has a `jwt`
/// parameter and a `--jwt` too is refused rather than guessed.
pub fn with_jwt(url: &str, jwt: Option<&str>) -> anyhow::Result<String> {
    let Some(jwt) = jwt.map(str::trim).filter(|j| !j.is_empty()) else {
        return Ok(url.to_string());
    };
    let mut u = url::Url::parse(url).map_err(|e| anyhow::anyhow!("bad URL {url:?}: {e}"))?;
    if u.query_pairs().any(|(k, _)| k == "jwt") {
        anyhow::bail!("{url} already has a jwt parameter; give the token once (--jwt or ?jwt=)");
    }
    u.query_pairs_mut().append_pair("jwt", jwt);
    Ok(u.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_goes_into_the_query() {
        assert_eq!(
            with_jwt("moqt://h:1/x", Some("a.b.c")).unwrap(),
            "moqt://h:1/x?jwt=a.b.c"
        );
        // A token read from a file keeps no newline; odd bytes are escaped.
        assert_eq!(
            with_jwt("https://h:1/x?y=1", Some("a.b-_c\n")).unwrap(),
            "https://h:1/x?y=1&jwt=a.b-_c"
        );
        assert_eq!(
            with_jwt("moqt://h:1/", Some("a+b&c")).unwrap(),
            "moqt://h:1/?jwt=a%2Bb%26c"
        );
        assert_eq!(with_jwt("moqt://h:1/x", None).unwrap(), "moqt://h:1/x");
        assert!(with_jwt("moqt://h:1/x?jwt=a", Some("b")).is_err());
    }

    /// A token goes only to a relay whose certificate is pinned, unless
    /// `--insecure` says otherwise; without a token nothing changes.
    #[test]
    fn tokens_go_only_to_verified_relays() {
        let pinned = verify_from(Some(&"ab".repeat(32))).unwrap();
        let unchecked = verify_from(None).unwrap();
        assert!(matches!(unchecked, Verify::Insecure));
        for url in ["moqt://h:1/?jwt=a.b.c", "https://h:1/x?y=1&jwt=a.b.c"] {
            let e = refuse_unverified_token(url, &unchecked, false).unwrap_err();
            assert!(e.to_string().contains("--fingerprint"), "{e}");
            assert!(e.to_string().contains("--insecure"), "{e}");
            refuse_unverified_token(url, &unchecked, true).unwrap();
            refuse_unverified_token(url, &pinned, false).unwrap();
        }
        // Cleartext: pinning has nothing to pin.
        let e = refuse_unverified_token("ws://h:1/?jwt=a.b.c", &pinned, false).unwrap_err();
        assert!(e.to_string().contains("ws://"), "{e}");
        refuse_unverified_token("ws://h:1/?jwt=a.b.c", &pinned, true).unwrap();
        refuse_unverified_token("wss://h:1/?jwt=a.b.c", &pinned, false).unwrap();
        // No token, or an empty one: nothing to protect.
        for url in ["moqt://h:1/x", "moqt://h:1/?jwt=", "ws://h:1/", "not a url"] {
            refuse_unverified_token(url, &unchecked, false).unwrap();
        }
    }
}
