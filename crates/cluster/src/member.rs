//! A relay as a member of the cluster: registered, claiming what its
//! publishers announce, and following every other member.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use moqt::error::request_error;
use moqt::message::{Redirect, RequestError};
use moqt::TrackNamespace;
use quichub_net::tls::Verify;
use quichub_relay::origin::{Origin, Redacted};
use quichub_relay::Relay;
use tokio::sync::watch;
use url::Url;

use crate::{Claim, Members, Node, Registry};

/// How this relay reaches the other members.
#[derive(Clone, Default)]
pub struct PeerOptions {
    /// A token for the other relays (`?jwt=` on their URLs), when they
    /// require one. Presented only at the URLs members registered (and
    /// at no host a GOAWAY names instead): whoever may write to the
    /// registry can therefore collect it, so the registry must be trusted.
    pub token: Option<String>,
    /// How to check a member's certificate when its registration carries
    /// no fingerprint (a CA file); such members are not followed without.
    pub verify: Option<Verify>,
    /// The retry interval a publisher is given when its namespace is held
    /// elsewhere: about when that claim could expire (the lease TTL).
    pub retry_ms: u64,
}

/// Counters for `/metrics`.
#[derive(Default)]
struct Counters {
    members: AtomicU64,
    followed: AtomicU64,
    claims: AtomicU64,
    refused_held: AtomicU64,
    registry_errors: AtomicU64,
}

/// A relay's membership of the cluster ([`join`]).
pub struct Membership {
    registry: Arc<dyn Registry>,
    counters: Arc<Counters>,
}

impl Membership {
    /// The registry.
    pub fn registry(&self) -> &Arc<dyn Registry> {
        &self.registry
    }

    /// Leaves the cluster: unregisters, giving up every claim at once
    /// (rather than when the lease expires).
    pub async fn leave(&self) {
        self.registry.leave().await;
    }

    /// The cluster's lines of `/metrics` (the upstream tracks per member
    /// are the relay's: `quichub_relay::metrics::render_upstreams`).
    pub fn render_metrics(&self) -> String {
        let c = &self.counters;
        let mut s = String::new();
        let mut g = |name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(s, "# HELP quichub_cluster_{name} {help}");
            let _ = writeln!(s, "# TYPE quichub_cluster_{name} {kind}");
            let _ = writeln!(s, "quichub_cluster_{name} {v}");
        };
        g(
            "members",
            "Live relays in the registry, this one included.",
            "gauge",
            c.members.load(Relaxed),
        );
        g(
            "followed",
            "Other members this relay follows.",
            "gauge",
            c.followed.load(Relaxed),
        );
        g(
            "claims_total",
            "Namespaces claimed for publishers here.",
            "counter",
            c.claims.load(Relaxed),
        );
        g(
            "claims_refused_total",
            "Publishers refused (REDIRECT) because another relay holds the namespace.",
            "counter",
            c.refused_held.load(Relaxed),
        );
        g(
            "registry_errors_total",
            "Claims that failed because the registry did not answer.",
            "counter",
            c.registry_errors.load(Relaxed),
        );
        s
    }
}

/// Makes `relay` a member of the cluster of `registry`: registers it,
/// claims namespaces for its publishers, and follows every other member
/// (each over its own client endpoint) until the relay shuts down or the
/// member leaves. Needs a tokio runtime; call before sessions arrive.
pub fn join(relay: Arc<Relay>, registry: Arc<dyn Registry>, options: PeerOptions) -> Membership {
    let counters = Arc::new(Counters::default());
    relay.set_claims(Arc::new(RelayClaims {
        registry: registry.clone(),
        counters: counters.clone(),
        retry_ms: options.retry_ms,
    }));
    registry.start();
    tokio::spawn(follow_members(
        relay.clone(),
        registry.clone(),
        options,
        counters.clone(),
    ));
    Membership { registry, counters }
}

/// Keeps one follower per other live member.
async fn follow_members(
    relay: Arc<Relay>,
    registry: Arc<dyn Registry>,
    options: PeerOptions,
    counters: Arc<Counters>,
) {
    let mut members = registry.members();
    let mut shutdown = relay.shutdown_signal();
    let me = registry.me().id;
    let mut followed: HashMap<String, (Node, watch::Sender<bool>)> = HashMap::new();
    loop {
        let now: Members = members.borrow_and_update().clone();
        counters.members.store(now.len() as u64, Relaxed);
        // Gone, or registered again differently (a new address or
        // certificate): stop following (its namespaces are withdrawn).
        followed.retain(|id, (node, stop)| {
            let keep = now.get(id) == Some(node);
            if !keep {
                tracing::info!(member = %id, "cluster: member left");
                stop.send_replace(true);
            }
            keep
        });
        for (id, node) in &now {
            if *id == me || followed.contains_key(id) {
                continue;
            }
            match follower(node, &options) {
                Ok((client, origin)) => {
                    tracing::info!(
                        member = %id,
                        url = %Redacted(&node.url),
                        "cluster: following member"
                    );
                    let (stop, rx) = watch::channel(false);
                    tokio::spawn(quichub_relay::origin::follow_until(
                        relay.clone(),
                        client,
                        origin,
                        rx,
                    ));
                    followed.insert(id.clone(), (node.clone(), stop));
                }
                Err(e) => tracing::error!(
                    member = %id,
                    "cluster: cannot follow member: {}",
                    Redacted(&format!("{e:#}"))
                ),
            }
        }
        counters.followed.store(followed.len() as u64, Relaxed);
        tokio::select! {
            r = members.changed() => if r.is_err() { break },
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    for (_, (_, stop)) in followed {
        stop.send_replace(true);
    }
}

/// The client endpoint and origin to follow `node` with.
fn follower(
    node: &Node,
    options: &PeerOptions,
) -> anyhow::Result<(quichub_net::client::Client, Origin)> {
    let url = peer_url(&node.url, options.token.as_deref())?;
    let verify = match (&node.fingerprint, &options.verify) {
        (Some(f), _) => Verify::Fingerprints(vec![quichub_net::tls::unhex(f)
            .filter(|f| f.len() == 32)
            .ok_or_else(|| anyhow::anyhow!("fingerprint {f:?}: 64 hex digits"))?]),
        (None, Some(v)) => v.clone(),
        (None, None) => anyhow::bail!(
            "registered without a certificate fingerprint and no [cluster] ca to check it with"
        ),
    };
    let bind = if url.host_str().is_some_and(|h| h.starts_with('[')) {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    let client = quichub_net::client::Client::new(bind.parse()?, verify)?;
    Ok((
        client,
        Origin {
            url,
            prefixes: vec![TrackNamespace::default()],
            held: vec![quichub_relay::cluster::mqtt_namespace(&node.id)],
        },
    ))
}

/// The URL to follow a member at: its registered URL with `cluster=peer`
/// and this relay's token as the query (the registered query replaced).
fn peer_url(registered: &str, token: Option<&str>) -> anyhow::Result<Url> {
    let mut url: Url = registered
        .parse()
        .with_context(|| format!("{}", Redacted(registered)))?;
    anyhow::ensure!(
        matches!(url.scheme(), "moqt" | "https"),
        "{}: moqt:// or https://",
        Redacted(registered)
    );
    url.set_query(None);
    if let Some(t) = token {
        url.query_pairs_mut().append_pair("jwt", t);
    }
    let query = match url.query() {
        Some(q) => format!("{q}&{}", quichub_relay::cluster::PEER_QUERY),
        None => quichub_relay::cluster::PEER_QUERY.to_string(),
    };
    url.set_query(Some(&query));
    Ok(url)
}

/// The registry's claims as the relay asks for them.
struct RelayClaims {
    registry: Arc<dyn Registry>,
    counters: Arc<Counters>,
    retry_ms: u64,
}

impl quichub_relay::cluster::Claims for RelayClaims {
    fn claim(
        &self,
        ns: &TrackNamespace,
    ) -> quichub_relay::core::BoxFuture<Result<(), RequestError>> {
        let (registry, counters, ns) = (self.registry.clone(), self.counters.clone(), ns.clone());
        let retry_ms = self.retry_ms;
        Box::pin(async move {
            match registry.claim(&ns).await {
                Ok(Claim::Ours) => {
                    counters.claims.fetch_add(1, Relaxed);
                    Ok(())
                }
                Ok(Claim::HeldBy(node)) => {
                    counters.refused_held.fetch_add(1, Relaxed);
                    tracing::info!(%ns, holder = %node.id, "cluster: namespace held by another relay: REDIRECT");
                    Err(RequestError {
                        code: request_error::REDIRECT,
                        retry_interval: retry_ms + 1,
                        reason: Bytes::from(format!("{ns} is published at {}", node.url)),
                        redirect: Some(Redirect {
                            connect_uri: Bytes::from(node.url),
                            track: Default::default(),
                        }),
                    })
                }
                Err(e) => {
                    counters.registry_errors.fetch_add(1, Relaxed);
                    tracing::warn!(%ns, "cluster: cannot claim: {e:#}");
                    Err(RequestError {
                        code: request_error::INTERNAL_ERROR,
                        retry_interval: 1001,
                        reason: Bytes::from_static(b"cluster registry unavailable"),
                        redirect: None,
                    })
                }
            }
        })
    }

    fn release(&self, ns: &TrackNamespace) {
        self.registry.release(ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_url_carries_the_token_and_nothing_registered() {
        let u = peer_url("moqt://a:4443/moq?jwt=theirs&x=1", Some("T.o k")).unwrap();
        assert_eq!(u.as_str(), "moqt://a:4443/moq?jwt=T.o+k&cluster=peer");
        assert_eq!(
            quichub_relay::tokens::query_jwt(&format!("{}?{}", u.path(), u.query().unwrap())),
            Some("T.o k".into())
        );
        let u = peer_url("https://b/", None).unwrap();
        assert_eq!(u.as_str(), "https://b/?cluster=peer");
        let e = peer_url("http://c/?jwt=SECRET9", None).unwrap_err();
        assert!(!e.to_string().contains("SECRET9"), "{e}");
    }
}
