//! The registry as a file: a fixed list of relays, for deployments without
//! etcd and for tests.
//!
//! ```toml
//! [[node]]
//! id = "eu-1"                      # optional: the URL by default
//! url = "moqt://10.0.0.1:4443/"
//! fingerprint = "5f2c…"            # optional: else the cluster's CA
//! ```
//!
//! Every relay of the list is a member for as long as this relay runs
//! (nothing detects a dead one: following it is retried with a backoff,
//! as for `[cluster] origins`). Claims are kept in this relay only, so
//! two relays can both accept a publisher of the same namespace; a
//! subscriber then gets the one its relay announced last. Use etcd where
//! that matters.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;
use moqt::TrackNamespace;
use serde::Deserialize;
use tokio::sync::watch;

use crate::{namespace_key, BoxFuture, Claim, Members, Node, Registry};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    node: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: Option<String>,
    url: String,
    fingerprint: Option<String>,
}

/// A [`Registry`] read from a file once.
pub struct StaticRegistry {
    me: Node,
    members: watch::Sender<Members>,
    claimed: Mutex<BTreeSet<String>>,
}

impl StaticRegistry {
    /// The relays listed in `path`, and `me` (listed there or not).
    pub fn load(path: &Path, me: Node) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        Self::parse(&text, me).with_context(|| format!("cluster file {}", path.display()))
    }

    /// Like [`StaticRegistry::load`], from the file's text.
    pub fn parse(text: &str, me: Node) -> anyhow::Result<Self> {
        let file: File = toml::from_str(text)?;
        let mut members = Members::new();
        for e in file.node {
            let url: url::Url = e
                .url
                .parse()
                .with_context(|| format!("node url {:?}", e.url))?;
            anyhow::ensure!(
                matches!(url.scheme(), "moqt" | "https"),
                "node url {:?}: moqt:// or https://",
                e.url
            );
            let n = Node {
                id: e.id.unwrap_or_else(|| e.url.clone()),
                url: e.url,
                fingerprint: e.fingerprint,
            };
            anyhow::ensure!(
                members.insert(n.id.clone(), n.clone()).is_none(),
                "node {:?} listed twice",
                n.id
            );
        }
        members.insert(me.id.clone(), me.clone());
        Ok(Self {
            me,
            members: watch::channel(members).0,
            claimed: Mutex::default(),
        })
    }
}

impl Registry for StaticRegistry {
    fn me(&self) -> Node {
        self.me.clone()
    }

    /// The others read the file, not this relay's registration: nothing to do.
    fn update_fingerprint(&self, _fingerprint: String) {}

    fn start(&self) {}

    fn members(&self) -> watch::Receiver<Members> {
        self.members.subscribe()
    }

    fn claim<'a>(&'a self, ns: &'a TrackNamespace) -> BoxFuture<'a, anyhow::Result<Claim>> {
        self.claimed
            .lock()
            .expect("claimed")
            .insert(namespace_key(ns));
        Box::pin(async { Ok(Claim::Ours) })
    }

    fn release(&self, ns: &TrackNamespace) {
        self.claimed
            .lock()
            .expect("claimed")
            .remove(&namespace_key(ns));
    }

    fn leave(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Node {
        Node {
            id: "moqt://127.0.0.1:1/".into(),
            url: "moqt://127.0.0.1:1/".into(),
            fingerprint: None,
        }
    }

    #[test]
    fn a_file_lists_the_members() {
        let r = StaticRegistry::parse(
            "[[node]]\nurl = \"moqt://10.0.0.1:4443/\"\n[[node]]\nid = \"b\"\nurl = \"https://b:443/\"\nfingerprint = \"ab\"\n",
            me(),
        )
        .unwrap();
        let m = r.members().borrow().clone();
        assert_eq!(m.len(), 3);
        assert_eq!(m["b"].fingerprint.as_deref(), Some("ab"));
        assert!(m.contains_key("moqt://10.0.0.1:4443/"));
        assert!(StaticRegistry::parse("[[node]]\nurl = \"http://a/\"\n", me()).is_err());
        assert!(StaticRegistry::parse("[[node]]\nurl = \"moqt://a/\"\nport = 1\n", me()).is_err());
        assert!(StaticRegistry::parse(
            "[[node]]\nurl = \"moqt://a/\"\n[[node]]\nurl = \"moqt://a/\"\n",
            me()
        )
        .is_err());
    }
}
