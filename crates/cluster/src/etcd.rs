//! The registry on etcd (v3 API, the `etcd-client` crate).
//!
//! Keys, under a prefix (`/quichub/` by default):
//! - `nodes/<id>`: each live relay ([`Node`] as JSON), on the relay's lease;
//! - `namespaces/<namespace>`: the relay that holds it (its [`Node`]), on
//!   the holder's lease.
//!
//! A relay renews its lease every third of the TTL. When it dies the lease
//! expires and etcd deletes its keys: the other relays see it leave (watch)
//! and its namespaces become free. A claim is one transaction (create the
//! key only if it does not exist), so two relays never both hold a
//! namespace. When etcd is unreachable nothing established stops: members
//! are kept as last seen, renewals and the watch are retried every second,
//! and only new claims fail (the publisher is told to retry). When the lease
//! was lost meanwhile (etcd was gone longer than the TTL and lost it), the
//! relay registers again and claims again what its publishers hold.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use moqt::TrackNamespace;
use tokio::sync::watch;

use crate::{namespace_key, BoxFuture, Claim, Members, Node, Registry};

/// How long a request to etcd may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The wait before retrying after etcd failed.
const RETRY: Duration = Duration::from_secs(1);

/// Where and how to register in etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client URLs of the etcd cluster (`http://host:port`).
    pub endpoints: Vec<String>,
    /// Key prefix shared by the relays of one cluster (ends with `/`).
    pub prefix: String,
    /// Lease TTL: how long after its last renewal a dead relay is dropped.
    pub ttl: Duration,
}

impl EtcdOptions {
    /// Parses `etcd://host:port[,host:port...][/prefix]` (the prefix
    /// defaults to `/quichub/`).
    pub fn from_url(url: &str, ttl: Duration) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("etcd://")
            .with_context(|| format!("{url:?}: an etcd://host:port[/prefix] URL"))?;
        let (hosts, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        anyhow::ensure!(!endpoints.is_empty(), "{url:?}: no etcd host");
        let path = path.trim_matches('/');
        let prefix = if path.is_empty() {
            "/quichub/".to_string()
        } else {
            format!("/{path}/")
        };
        anyhow::ensure!(
            ttl >= Duration::from_secs(2),
            "cluster lease TTL of {ttl:?}: at least 2 s"
        );
        Ok(Self {
            endpoints,
            prefix,
            ttl,
        })
    }
}

/// A [`Registry`] on etcd.
pub struct EtcdRegistry {
    /// This relay as registered (its fingerprint changes with its
    /// certificate).
    me: Arc<RwLock<Node>>,
    /// A claim's value: this relay without its fingerprint, so claims stay
    /// the same across certificate changes (compared on release).
    me_json: String,
    options: EtcdOptions,
    client: Client,
    /// The lease this relay's keys hang on (0: none yet).
    lease: Arc<AtomicI64>,
    /// Namespace keys this relay holds, with the revision of its last
    /// write of each (claimed again on a new lease; released only if
    /// unchanged since, so a release never deletes a newer claim).
    claimed: Arc<Mutex<BTreeMap<String, i64>>>,
    members: watch::Sender<Members>,
    stop: watch::Sender<bool>,
}

impl EtcdRegistry {
    /// A registry for `me` on the etcd cluster of `options` (connections
    /// are made lazily: etcd need not be up yet).
    pub async fn new(me: Node, options: EtcdOptions) -> anyhow::Result<Self> {
        let connect = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), REQUEST_TIMEOUT);
        let client = Client::connect(&options.endpoints, Some(connect))
            .await
            .with_context(|| format!("etcd at {:?}", options.endpoints))?;
        Ok(Self {
            me_json: serde_json::to_string(&Node {
                fingerprint: None,
                ..me.clone()
            })?,
            me: Arc::new(RwLock::new(me)),
            options,
            client,
            lease: Arc::default(),
            claimed: Arc::default(),
            members: watch::channel(Members::new()).0,
            stop: watch::channel(false).0,
        })
    }

    fn node_key(&self, id: &str) -> String {
        node_key(&self.options.prefix, id)
    }

    fn namespace_key(&self, ns: &TrackNamespace) -> String {
        format!("{}namespaces/{}", self.options.prefix, namespace_key(ns))
    }

    /// Claims `key` on `lease`: created if absent, renewed if ours.
    async fn claim_key(
        client: &mut Client,
        key: &str,
        me: &Node,
        me_json: &str,
        lease: i64,
    ) -> anyhow::Result<(Claim, i64)> {
        let put = || TxnOp::put(key, me_json, Some(PutOptions::new().with_lease(lease)));
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(vec![put()])
            .or_else(vec![TxnOp::get(key, None)]);
        let r = client.txn(txn).await.context("etcd claim")?;
        let revision = |r: &etcd_client::TxnResponse| r.header().map_or(0, |h| h.revision());
        if r.succeeded() {
            return Ok((Claim::Ours, revision(&r)));
        }
        let holder = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        let Some(holder) = holder else {
            // Deleted between the compare and the get: try once more later.
            anyhow::bail!("claim raced with its release");
        };
        let node: Node = serde_json::from_slice(&holder).context("a claim's holder in etcd")?;
        if node.id != me.id {
            return Ok((Claim::HeldBy(node), 0));
        }
        // Ours from an earlier lease: moved onto the current one, unless
        // it changed hands meanwhile.
        let txn = Txn::new()
            .when(vec![Compare::value(key, CompareOp::Equal, holder)])
            .and_then(vec![put()]);
        let r = client.txn(txn).await.context("etcd claim")?;
        anyhow::ensure!(r.succeeded(), "claim changed hands");
        Ok((Claim::Ours, revision(&r)))
    }
}

fn node_key(prefix: &str, id: &str) -> String {
    format!(
        "{prefix}nodes/{}",
        percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
    )
}

impl Registry for EtcdRegistry {
    fn me(&self) -> Node {
        self.me.read().expect("me").clone()
    }

    fn update_fingerprint(&self, fingerprint: String) {
        let me = {
            let mut me = self.me.write().expect("me");
            if me.fingerprint.as_ref() == Some(&fingerprint) {
                return;
            }
            me.fingerprint = Some(fingerprint);
            me.clone()
        };
        let lease = self.lease.load(Relaxed);
        if lease == 0 {
            // Not registered now: the next registration carries it.
            return;
        }
        let (mut client, key) = (self.client.clone(), self.node_key(&me.id));
        tokio::spawn(async move {
            let Ok(json) = serde_json::to_string(&me) else {
                return;
            };
            let put = client
                .put(key, json, Some(PutOptions::new().with_lease(lease)))
                .await;
            match put {
                Ok(_) => tracing::info!("etcd: new certificate fingerprint registered"),
                Err(e) => tracing::warn!("etcd: registering the new certificate fingerprint: {e} (done at the next registration)"),
            }
        });
    }

    fn start(&self) {
        let id = self.me().id;
        tokio::spawn(keep_registered(
            self.client.clone(),
            self.node_key(&id),
            self.me.clone(),
            self.me_json.clone(),
            self.options.ttl,
            self.lease.clone(),
            self.claimed.clone(),
            self.stop.subscribe(),
        ));
        tokio::spawn(watch_members(
            self.client.clone(),
            format!("{}nodes/", self.options.prefix),
            self.members.clone(),
            self.stop.subscribe(),
        ));
    }

    fn members(&self) -> watch::Receiver<Members> {
        self.members.subscribe()
    }

    fn claim<'a>(&'a self, ns: &'a TrackNamespace) -> BoxFuture<'a, anyhow::Result<Claim>> {
        Box::pin(async move {
            // Just started, or registering again: wait for it a little
            // rather than refuse the publisher at once.
            let since = tokio::time::Instant::now();
            let lease = loop {
                let lease = self.lease.load(Relaxed);
                if lease != 0 {
                    break lease;
                }
                anyhow::ensure!(
                    since.elapsed() < REQUEST_TIMEOUT,
                    "not registered in etcd (unreachable?)"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let key = self.namespace_key(ns);
            let mut client = self.client.clone();
            let me = self.me();
            let (claim, rev) =
                Self::claim_key(&mut client, &key, &me, &self.me_json, lease).await?;
            if claim == Claim::Ours {
                self.claimed.lock().expect("claimed").insert(key, rev);
            }
            Ok(claim)
        })
    }

    fn release(&self, ns: &TrackNamespace) {
        let key = self.namespace_key(ns);
        let Some(rev) = self.claimed.lock().expect("claimed").remove(&key) else {
            return;
        };
        let mut client = self.client.clone();
        tokio::spawn(async move {
            // Only if unchanged since our write: it may have expired and
            // been claimed by another relay, or claimed again here.
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    rev,
                )])
                .and_then(vec![TxnOp::delete(key.as_str(), None)]);
            if let Err(e) = client.txn(txn).await {
                tracing::warn!(%key, "etcd: releasing a namespace: {e} (it expires with the lease)");
            }
        });
    }

    fn leave(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.stop.send_replace(true);
            let lease = self.lease.swap(0, Relaxed);
            if lease != 0 {
                // Revoking deletes every key on the lease: the node and its claims.
                if let Err(e) = self.client.clone().lease_revoke(lease).await {
                    tracing::warn!("etcd: leaving the cluster: {e} (the lease expires instead)");
                }
            }
        })
    }
}

/// Registers the relay on a lease and renews it; after a lost lease,
/// registers again and claims again what it held.
#[allow(clippy::too_many_arguments)]
async fn keep_registered(
    mut client: Client,
    key: String,
    me: Arc<RwLock<Node>>,
    me_json: String,
    ttl: Duration,
    lease: Arc<AtomicI64>,
    claimed: Arc<Mutex<BTreeMap<String, i64>>>,
    mut stop: watch::Receiver<bool>,
) {
    let renew = ttl / 3;
    let mut was_down = false;
    while !*stop.borrow() {
        let node = me.read().expect("me").clone();
        let registered = async {
            let record = serde_json::to_string(&node)?;
            let id = client
                .lease_grant(ttl.as_secs() as i64, None)
                .await
                .context("lease")?
                .id();
            client
                .put(key.as_str(), record, Some(PutOptions::new().with_lease(id)))
                .await
                .context("registration")?;
            anyhow::Ok(id)
        }
        .await;
        let id = match registered {
            Ok(id) => id,
            Err(e) => {
                if !was_down {
                    tracing::warn!("etcd: cannot register: {e:#} (retrying every second)");
                    was_down = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        tracing::info!(node = %node.id, lease = id, "etcd: registered");
        was_down = false;
        lease.store(id, Relaxed);
        // Claims made on an earlier lease move to this one.
        let keys: Vec<String> = claimed.lock().expect("claimed").keys().cloned().collect();
        for k in keys {
            match EtcdRegistry::claim_key(&mut client, &k, &node, &me_json, id).await {
                Ok((Claim::Ours, rev)) => {
                    if let Some(r) = claimed.lock().expect("claimed").get_mut(&k) {
                        *r = rev;
                    }
                }
                Ok((Claim::HeldBy(n), _)) => {
                    tracing::warn!(key = %k, holder = %n.id, "etcd: a namespace published here was claimed by another relay while this one was away");
                    claimed.lock().expect("claimed").remove(&k);
                }
                Err(e) => tracing::warn!(key = %k, "etcd: claiming again: {e:#}"),
            }
        }
        // Renewals until the lease is gone.
        let mut keeper = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(renew) => {}
                _ = stop.changed() => return,
            }
            if keeper.is_none() {
                keeper = client.lease_keep_alive(id).await.ok();
            }
            let Some((k, s)) = keeper.as_mut() else {
                if !was_down {
                    tracing::warn!(
                        "etcd: unreachable; established flows go on (renewing every {renew:?})"
                    );
                    was_down = true;
                }
                continue;
            };
            let ttl_left = tokio::time::timeout(REQUEST_TIMEOUT, async {
                k.keep_alive().await?;
                s.message().await.map(|m| m.map(|m| m.ttl()))
            })
            .await;
            match ttl_left.unwrap_or(Ok(None)) {
                Ok(Some(t)) if t > 0 => {
                    if was_down {
                        tracing::info!("etcd: reachable again, lease renewed");
                        was_down = false;
                    }
                }
                Ok(Some(_)) => {
                    tracing::warn!(lease = id, "etcd: the lease expired; registering again");
                    break;
                }
                Ok(None) | Err(_) => {
                    keeper = None;
                    if !was_down {
                        tracing::warn!(
                            "etcd: unreachable; established flows go on (renewing every {renew:?})"
                        );
                        was_down = true;
                    }
                }
            }
        }
        lease.store(0, Relaxed);
    }
}

/// Lists the members, then follows their changes; lists again after any
/// failure. Members are kept as last seen while etcd is unreachable.
async fn watch_members(
    mut client: Client,
    prefix: String,
    members: watch::Sender<Members>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let r = async {
            let list = client
                .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
                .await?;
            let rev = list.header().map_or(0, |h| h.revision());
            let mut now = Members::new();
            for kv in list.kvs() {
                if let Ok(n) = serde_json::from_slice::<Node>(kv.value()) {
                    now.insert(n.id.clone(), n);
                }
            }
            members.send_if_modified(|m| {
                let changed = *m != now;
                *m = now;
                changed
            });
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(rev + 1);
            let (_watcher, mut stream) = client.watch(prefix.as_str(), Some(opts)).await?;
            while let Some(resp) = stream.message().await? {
                if resp.canceled() {
                    break;
                }
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    match ev.event_type() {
                        EventType::Put => {
                            if let Ok(n) = serde_json::from_slice::<Node>(kv.value()) {
                                members.send_modify(|m| {
                                    m.insert(n.id.clone(), n);
                                });
                            }
                        }
                        EventType::Delete => {
                            let id = kv
                                .key_str()
                                .ok()
                                .and_then(|k| k.strip_prefix(prefix.as_str()))
                                .and_then(|k| {
                                    percent_encoding::percent_decode_str(k).decode_utf8().ok()
                                })
                                .map(|k| k.into_owned());
                            if let Some(id) = id {
                                members.send_if_modified(|m| m.remove(&id).is_some());
                            }
                        }
                    }
                }
            }
            anyhow::Ok(())
        };
        tokio::select! {
            r = r => {
                if let Err(e) = r {
                    tracing::debug!("etcd: member watch: {e}");
                }
            }
            _ = stop.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls() {
        let ttl = Duration::from_secs(10);
        let o = EtcdOptions::from_url("etcd://127.0.0.1:2379", ttl).unwrap();
        assert_eq!(o.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(o.prefix, "/quichub/");
        let o = EtcdOptions::from_url("etcd://a:1,b:2/prod/eu/", ttl).unwrap();
        assert_eq!(o.endpoints, ["http://a:1", "http://b:2"]);
        assert_eq!(o.prefix, "/prod/eu/");
        assert!(EtcdOptions::from_url("http://a:1", ttl).is_err());
        assert!(EtcdOptions::from_url("etcd:///x", ttl).is_err());
        assert!(EtcdOptions::from_url("etcd://a:1", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn node_keys_are_one_segment() {
        assert_eq!(
            node_key("/q/", "moqt://a:4443/"),
            "/q/nodes/moqt%3A%2F%2Fa%3A4443%2F"
        );
    }
}
