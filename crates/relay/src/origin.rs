//! Relay to relay: this relay follows another relay (its *origin*) over
//! MoQT itself. It connects as a client, sends SUBSCRIBE_NAMESPACE for the
//! configured prefixes, and registers every namespace the origin announces
//! as published by that session. A subscriber here of a track in one of
//! them is then served as from any publisher: one upstream SUBSCRIBE per
//! track on the origin session, however many subscribers this relay has, so
//! the origin sends one copy of each object per track to this relay.
//!
//! Relays that follow each other form a tree (origin → region → edge): a
//! relay announces what it learnt from its origin to its own followers like
//! any other namespace. The configuration must not make a cycle (a relay
//! following one of its followers): the latest announcement of a namespace
//! wins, so a cycle would route a namespace in a circle.
//!
//! The session is re-established after a failure or a GOAWAY: at once to a
//! GOAWAY's New Session URI (another relay; `[relay] goaway_uri` sets the
//! one quichub sends; this relay's `?jwt=` goes along only when that URI
//! names the same host and port), else with a backoff from 0.5 s to 10 s
//! (at least 2 s after a GOAWAY); while it is down its namespaces are gone
//! (subscribers get PUBLISH_DONE, new ones wait for the rendezvous
//! timeout). The origin may not make requests here (it is
//! a source, not a client), and its session does not count against
//! `max_sessions`.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use moqt::TrackNamespace;
use quichub_net::client::Client;
use quichub_net::server::Accepted;
use tokio::sync::watch;
use url::Url;

use crate::core::Relay;

/// One origin to follow.
#[derive(Debug, Clone)]
pub struct Origin {
    /// `moqt://host:port/path` or `https://host:port/path` (WebTransport); a
    /// `?jwt=` query authenticates this relay at the origin.
    pub url: Url,
    /// Namespace prefixes to follow (one SUBSCRIBE_NAMESPACE each; the empty
    /// prefix is every namespace).
    pub prefixes: Vec<TrackNamespace>,
    /// Namespaces the origin serves without announcing them (a cluster
    /// member's own tracks, e.g. its MQTT messages): registered as published
    /// by the session while it is up.
    pub held: Vec<TrackNamespace>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A session up this long counts as having worked (the backoff starts over).
const STABLE: Duration = Duration::from_secs(10);
/// The wait after an origin's GOAWAY (its drain; quichub's default is 2 s).
const AFTER_GOAWAY: Duration = Duration::from_secs(2);

/// Follows `origin` with connections from `client` until the relay shuts
/// down.
pub async fn follow(relay: Arc<Relay>, client: Client, origin: Origin) {
    let (_never, stop) = watch::channel(false);
    follow_until(relay, client, origin, stop).await
}

/// Like [`follow`], until `stop` turns `true` as well (a cluster member
/// left): the session is closed and its namespaces are withdrawn before
/// this returns.
pub async fn follow_until(
    relay: Arc<Relay>,
    client: Client,
    origin: Origin,
    mut stop: watch::Receiver<bool>,
) {
    let mut shutdown = relay.shutdown_signal();
    let mut backoff = BACKOFF_MIN;
    // Where a GOAWAY sent us: tried once, then the configured URL again.
    let mut redirect: Option<Url> = None;
    loop {
        if *shutdown.borrow() || *stop.borrow() {
            return;
        }
        let url = redirect.take().unwrap_or_else(|| origin.url.clone());
        let connected = tokio::select! {
            c = client.connect(&url) => c,
            _ = stopped(&mut stop) => return,
        };
        match connected {
            Ok(c) => {
                let remote = c.remote;
                tracing::info!(url = %Redacted(url.as_str()), %remote, "connected to origin");
                relay.metrics.origin_sessions.fetch_add(1, Relaxed);
                let quic = c.session.clone();
                let accepted = Accepted {
                    session: c.session,
                    transport: c.transport,
                    path: Some(c.path.clone()),
                    remote,
                    http: None,
                    draft: None,
                    undetermined: None,
                    lite: None,
                };
                let serve = crate::session::serve_origin(
                    relay.clone(),
                    accepted,
                    (c.authority, c.path),
                    origin.prefixes.clone(),
                    origin.held.clone(),
                    label(&url),
                );
                tokio::pin!(serve);
                let end = tokio::select! {
                    end = &mut serve => end,
                    _ = stopped(&mut stop) => {
                        // Closed, then served to its end: the session's
                        // cleanup withdraws what it published here.
                        quic.close(0, b"no longer followed");
                        serve.await;
                        relay.metrics.origin_sessions.fetch_sub(1, Relaxed);
                        tracing::info!(url = %Redacted(origin.url.as_str()), "origin no longer followed");
                        return;
                    }
                };
                relay.metrics.origin_sessions.fetch_sub(1, Relaxed);
                tracing::warn!(
                    url = %Redacted(origin.url.as_str()),
                    "origin session ended: {}",
                    Redacted(&end.reason)
                );
                // A session that was up a while starts the backoff over; one
                // refused or cut at once (a full or misconfigured origin)
                // keeps growing it, so it is not retried twice a second.
                if end.lasted >= STABLE {
                    backoff = BACKOFF_MIN;
                }
                // Sent elsewhere (GOAWAY's New Session URI): go at once.
                if let Some(to) = end
                    .redirect
                    .as_deref()
                    .and_then(|u| redirected(u, &origin.url))
                {
                    tracing::info!(
                        from = %Redacted(url.as_str()),
                        to = %Redacted(to.as_str()),
                        "origin moved its followers"
                    );
                    redirect = Some(to);
                    continue;
                }
                // A draining origin still accepts until it stops: give it
                // time to go rather than being told GOAWAY again at once.
                if end.goaway {
                    backoff = backoff.max(AFTER_GOAWAY);
                }
            }
            Err(e) => {
                // The error may quote the URL (quichub_net's connect does).
                tracing::warn!(
                    url = %Redacted(url.as_str()),
                    "cannot reach origin: {}",
                    Redacted(&format!("{e:#}"))
                );
            }
        }
        relay.metrics.origin_reconnects.fetch_add(1, Relaxed);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
            _ = stopped(&mut stop) => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// How `/metrics` names an origin: its URL without the query (which may
/// hold this relay's token) or a user's password.
fn label(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    let _ = u.set_password(None);
    u.to_string()
}

/// Resolves once `stop` is `true`; never if its sender is gone first.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The URL a GOAWAY's New Session URI sends a follower to: a `moqt://` or
/// `https://` URL. Without a query of its own it takes the configured
/// URL's, less this relay's token when the URI names another host or port:
/// whoever runs the origin may name any host, and the token was given for
/// this origin only. `None` for anything else (logged).
fn redirected(uri: &str, configured: &Url) -> Option<Url> {
    let mut url = match Url::parse(uri) {
        Ok(u) if matches!(u.scheme(), "moqt" | "https") && u.host().is_some() => u,
        _ => {
            tracing::warn!(
                uri = %Redacted(uri),
                "GOAWAY New Session URI ignored: not a moqt:// or https:// URL"
            );
            return None;
        }
    };
    if url.query().is_none() {
        if same_endpoint(&url, configured) {
            url.set_query(configured.query());
        } else {
            let kept: Vec<&str> = configured
                .query()
                .unwrap_or("")
                .split('&')
                .filter(|kv| !kv.is_empty() && !is_secret_param(kv))
                .collect();
            if kept.len() < configured.query().map_or(0, |q| q.split('&').count()) {
                tracing::info!(
                    to = %Redacted(url.as_str()),
                    "GOAWAY sends this relay to another host: its token stays behind"
                );
            }
            url.set_query((!kept.is_empty()).then(|| kept.join("&")).as_deref());
        }
    }
    Some(url)
}

/// Same host and UDP port (a URL without a port means 443, as the client
/// dials it).
fn same_endpoint(a: &Url, b: &Url) -> bool {
    a.host() == b.host() && a.port().unwrap_or(443) == b.port().unwrap_or(443)
}

/// Query parameters that carry credentials.
const SECRET_PARAMS: &[&str] = &["jwt"];

/// `kv` (one `key=value` of a query) carries a credential.
fn is_secret_param(kv: &str) -> bool {
    let key = kv.split_once('=').map_or(kv, |(k, _)| k);
    SECRET_PARAMS.iter().any(|s| key.eq_ignore_ascii_case(s))
}

/// `text` with every credential in it replaced by `<redacted>`: the value
/// of a `jwt` query parameter (after `?` or `&`) and the password of a
/// URL's `user:password@`. `text` may be a URL or a message quoting URLs
/// (an error from a connect). Whatever reaches a log line, a metric label
/// or an API response goes through this: tokens in logs outlive the
/// tokens' purpose and reach whoever reads the logs.
pub fn redact(text: &str) -> Cow<'_, str> {
    let secret_at = |i: usize| {
        (text.as_bytes()[i] == b'?' || text.as_bytes()[i] == b'&')
            && SECRET_PARAMS.iter().any(|p| {
                text.get(i + 1..i + 2 + p.len())
                    .is_some_and(|s| s[..p.len()].eq_ignore_ascii_case(p) && s.ends_with('='))
            })
    };
    let password_at = |i: usize| -> Option<(usize, usize)> {
        // `://user:password@host`: the authority ends at the first of `/?#`
        // or a space; the password is between its first `:` and last `@`.
        let rest = text.get(i..)?.strip_prefix("://")?;
        let end = rest
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(rest.len());
        let at = rest[..end].rfind('@')?;
        let colon = rest[..at].find(':')?;
        Some((i + 3 + colon + 1, i + 3 + at))
    };
    let ends_value = |c: char| {
        matches!(c, '&' | '#' | '"' | '\'' | ')' | '>' | ']' | '`' | ',') || c.is_whitespace()
    };
    let mut out = String::new();
    let (mut copied, mut i) = (0, 0);
    while i < text.len() {
        if secret_at(i) {
            let start = i + 1 + text[i + 1..].find('=').expect("a secret's =") + 1;
            let end = text[start..]
                .find(ends_value)
                .map_or(text.len(), |n| start + n);
            out.push_str(&text[copied..start]);
            out.push_str("<redacted>");
            (copied, i) = (end, end);
        } else if let Some((start, end)) = password_at(i) {
            out.push_str(&text[copied..start]);
            out.push_str("<redacted>");
            (copied, i) = (end, end);
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Shows a URL, or a message quoting URLs, [`redact`]ed: for `%` in
/// `tracing` fields and `{}` in formats.
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goaway_uri_keeps_our_token_only_for_the_same_host_and_port() {
        let configured: Url = "moqt://a:4443/?jwt=T&cluster=peer".parse().unwrap();
        let same = redirected("moqt://a:4443/other", &configured).unwrap();
        assert_eq!(same.as_str(), "moqt://a:4443/other?jwt=T&cluster=peer");
        let wt = redirected("https://a:4443/", &configured).unwrap();
        assert_eq!(wt.query(), Some("jwt=T&cluster=peer"));
        // Another host or port: the token stays behind, the rest goes.
        let other = redirected("moqt://b:4443/", &configured).unwrap();
        assert_eq!(other.as_str(), "moqt://b:4443/?cluster=peer");
        let port = redirected("moqt://a:4444/", &configured).unwrap();
        assert_eq!(port.query(), Some("cluster=peer"));
        let bare: Url = "moqt://a:4443/?JWT=T".parse().unwrap();
        assert_eq!(redirected("moqt://b/", &bare).unwrap().query(), None);
        let default_port: Url = "https://a/?jwt=T".parse().unwrap();
        let explicit = redirected("https://a:443/x", &default_port).unwrap();
        assert_eq!(explicit.query(), Some("jwt=T"));
        // The origin's own query is the origin's to give.
        let own = redirected("https://b:4443/moq?jwt=U", &configured).unwrap();
        assert_eq!(own.query(), Some("jwt=U"));
        assert!(redirected("http://b/", &configured).is_none());
        assert!(redirected("not a url", &configured).is_none());
    }

    #[test]
    fn tokens_and_passwords_are_redacted() {
        assert_eq!(
            redact("moqt://a:4443/?jwt=eyJ.x-y_z.sig&cluster=peer"),
            "moqt://a:4443/?jwt=<redacted>&cluster=peer"
        );
        assert_eq!(
            redact("moqt://a/?cluster=peer&JWT=abc%2Edef#frag"),
            "moqt://a/?cluster=peer&JWT=<redacted>#frag"
        );
        // In a message quoting the URL.
        assert_eq!(
            redact("QUIC connect to 1.2.3.4:4443 (moqt://a:4443/?jwt=T): timed out"),
            "QUIC connect to 1.2.3.4:4443 (moqt://a:4443/?jwt=<redacted>): timed out"
        );
        assert_eq!(
            redact("https://user:pw@a:4443/x and moqt://b/?jwt="),
            "https://user:<redacted>@a:4443/x and moqt://b/?jwt=<redacted>"
        );
        assert_eq!(redact("moqt://a/?jwtx=1&xjwt=2"), "moqt://a/?jwtx=1&xjwt=2");
        assert!(matches!(redact("moqt://user@a/p"), Cow::Borrowed(_)));
        assert_eq!(redact("é?jwt=é"), "é?jwt=<redacted>");
        assert_eq!(
            Redacted("wss://a/?jwt=T").to_string(),
            "wss://a/?jwt=<redacted>"
        );
    }

    #[test]
    fn metric_labels_hold_no_credentials() {
        let u: Url = "https://user:pw@a:4443/moq?jwt=T".parse().unwrap();
        assert_eq!(label(&u), "https://user@a:4443/moq");
    }
}
