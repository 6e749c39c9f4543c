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
//! one quichub sends), else with a backoff from 0.5 s to 10 s (at least 2 s
//! after a GOAWAY); while it is
//! down its namespaces are gone (subscribers get PUBLISH_DONE, new ones wait
//! for the rendezvous timeout). The origin may not make requests here (it is
//! a source, not a client), and its session does not count against
//! `max_sessions`.

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
                tracing::info!(%url, %remote, "connected to origin");
                relay.metrics.origin_sessions.fetch_add(1, Relaxed);
                let quic = c.session.clone();
                let accepted = Accepted {
                    session: c.session,
                    transport: c.transport,
                    path: Some(c.path.clone()),
                    remote,
                    http: None,
                    draft: None,
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
                        tracing::info!(url = %origin.url, "origin no longer followed");
                        return;
                    }
                };
                relay.metrics.origin_sessions.fetch_sub(1, Relaxed);
                tracing::warn!(url = %origin.url, "origin session ended: {}", end.reason);
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
                    tracing::info!(from = %url, %to, "origin moved its followers");
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
                tracing::warn!(%url, "cannot reach origin: {e:#}");
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
/// hold this relay's token).
fn label(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// Resolves once `stop` is `true`; never if its sender is gone first.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The URL a GOAWAY's New Session URI sends a follower to: a `moqt://` or
/// `https://` URL, keeping the configured URL's query (this relay's token)
/// when it has none of its own. `None` for anything else (logged).
fn redirected(uri: &str, configured: &Url) -> Option<Url> {
    let mut url = match Url::parse(uri) {
        Ok(u) if matches!(u.scheme(), "moqt" | "https") && u.host().is_some() => u,
        _ => {
            tracing::warn!(
                uri,
                "GOAWAY New Session URI ignored: not a moqt:// or https:// URL"
            );
            return None;
        }
    };
    if url.query().is_none() {
        url.set_query(configured.query());
    }
    Some(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goaway_uri_keeps_our_token() {
        let configured: Url = "moqt://a:4443/?jwt=T".parse().unwrap();
        let to = redirected("moqt://b:4443/", &configured).unwrap();
        assert_eq!(to.as_str(), "moqt://b:4443/?jwt=T");
        let own = redirected("https://b:4443/moq?jwt=U", &configured).unwrap();
        assert_eq!(own.query(), Some("jwt=U"));
        assert!(redirected("http://b/", &configured).is_none());
        assert!(redirected("not a url", &configured).is_none());
    }
}
