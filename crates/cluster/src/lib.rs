//! # quichub-cluster
//!
//! Relays that act as one: a subscriber on any relay of the cluster gets a
//! broadcast published on any other, with one copy of each track between
//! two relays, and a relay that dies drops out by itself.
//!
//! - A **registry** ([`Registry`]) knows the live relays (*members*) and
//!   which relay holds each namespace. Two backends: [`etcd::EtcdRegistry`]
//!   (etcd v3: each relay's registration and claims hang on a lease with a
//!   TTL, so they vanish when the relay stops renewing it; claims are
//!   first-come by transaction; members are watched) and
//!   [`file::StaticRegistry`] (a fixed list of relays in a file, claims
//!   kept locally: no external service, for fixed deployments and tests).
//!   quichub does no consensus of its own.
//! - **Membership** ([`member::join`]) makes a relay one of the cluster: it
//!   registers the relay, claims each namespace a publisher announces on it
//!   before accepting it (a namespace held elsewhere is refused with
//!   REDIRECT to the relay that holds it), and follows every other member
//!   over MoQT itself (`quichub_relay::origin`, `cluster=peer`), being told
//!   only of what that member's own publishers hold
//!   (`quichub_relay::cluster`): a namespace reaches each relay in one hop
//!   from its holder, and subscribers of a relay cost the holder one
//!   upstream subscription per track.
//!
//! What the cluster does not share: MQTT persistent sessions and retained
//! messages stay on the relay the client uses.
#![warn(missing_docs)]

pub mod etcd;
pub mod file;
pub mod member;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use moqt::TrackNamespace;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// A boxed future, for the [`Registry`] methods called through `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One relay of the cluster, as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Unique name in the cluster (by default its URL).
    pub id: String,
    /// Where the other relays reach it: `moqt://host:port/` or
    /// `https://host:port/` (WebTransport).
    pub url: String,
    /// SHA-256 of its certificate (hex), which the others pin; `None` when
    /// its certificate is checked against the cluster's CA instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// The members the registry knows, by id (this relay among them once it
/// registered).
pub type Members = BTreeMap<String, Node>;

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This relay holds the namespace.
    Ours,
    /// Another relay does.
    HeldBy(Node),
}

/// A registry of relays and of the namespaces they hold.
pub trait Registry: Send + Sync + 'static {
    /// This relay, as it registers itself.
    fn me(&self) -> Node;

    /// This relay's certificate changed (renewed or reloaded): registers
    /// its new SHA-256, so the others pin the new one. Never blocks.
    fn update_fingerprint(&self, fingerprint: String);

    /// Registers this relay and keeps it registered (renewing, and
    /// registering again after the registry lost it) until [`leave`].
    /// Returns at once; failures are retried in the background.
    ///
    /// [`leave`]: Registry::leave
    fn start(&self);

    /// The live members, updated as they come and go.
    fn members(&self) -> watch::Receiver<Members>;

    /// Claims `ns` for this relay unless another live relay holds it.
    fn claim<'a>(&'a self, ns: &'a TrackNamespace) -> BoxFuture<'a, anyhow::Result<Claim>>;

    /// Gives `ns` up (no publisher here holds it any more); never blocks.
    fn release(&self, ns: &TrackNamespace);

    /// Unregisters this relay and gives up its claims (graceful stop).
    fn leave(&self) -> BoxFuture<'_, ()>;
}

/// A namespace as a registry key: each field percent-encoded (so `/` and
/// non-UTF-8 bytes stay unambiguous), joined with `/`.
pub fn namespace_key(ns: &TrackNamespace) -> String {
    const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    ns.fields()
        .iter()
        .map(|f| percent_encoding::percent_encode(f, KEEP).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_keys_are_unambiguous() {
        let a = TrackNamespace::from_path("live/a");
        assert_eq!(namespace_key(&a), "live/a");
        let slash = TrackNamespace(vec![bytes::Bytes::from_static(b"live/a")]);
        assert_eq!(namespace_key(&slash), "live%2Fa");
        let bin = TrackNamespace(vec![bytes::Bytes::from_static(&[0xff, b' '])]);
        assert_eq!(namespace_key(&bin), "%FF%20");
    }
}
