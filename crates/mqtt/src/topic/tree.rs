//! A subscription trie keyed by topic filter levels.

use std::collections::HashMap;
use std::hash::Hash;

/// Subscriptions indexed by topic filter, for finding those that match a topic
/// name by walking its levels rather than scanning every filter.
///
/// Each entry is a (filter, key) pair with a value; a key (say a client id, or
/// a (client id, share group) pair) may subscribe to many filters, and one
/// publication may match several of its filters: [`TopicTree::matches`]
/// reports each matching entry, leaving the per-client merging (§3.3.4) to
/// the caller. Filters should be valid ([`super::valid_topic_filter`]) and
/// without any `$share/` prefix; topics should be valid topic names.
#[derive(Debug, Clone)]
pub struct TopicTree<K, V> {
    root: Node<K, V>,
    len: usize,
}

#[derive(Debug, Clone)]
struct Node<K, V> {
    children: HashMap<String, Node<K, V>>,
    subs: HashMap<K, V>,
}

impl<K, V> Default for Node<K, V> {
    fn default() -> Self {
        Node {
            children: HashMap::new(),
            subs: HashMap::new(),
        }
    }
}

impl<K, V> Node<K, V> {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.subs.is_empty()
    }
}

impl<K, V> Default for TopicTree<K, V> {
    fn default() -> Self {
        TopicTree {
            root: Node::default(),
            len: 0,
        }
    }
}

impl<K: Eq + Hash, V> TopicTree<K, V> {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of (filter, key) entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tree has no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds or replaces the entry (filter, key); returns the replaced value.
    pub fn insert(&mut self, filter: &str, key: K, value: V) -> Option<V> {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.children.entry(level.to_owned()).or_default();
        }
        let old = node.subs.insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The value of the entry (filter, key).
    pub fn get(&self, filter: &str, key: &K) -> Option<&V> {
        let mut node = &self.root;
        for level in filter.split('/') {
            node = node.children.get(level)?;
        }
        node.subs.get(key)
    }

    /// The value of the entry (filter, key), mutably.
    pub fn get_mut(&mut self, filter: &str, key: &K) -> Option<&mut V> {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.children.get_mut(level)?;
        }
        node.subs.get_mut(key)
    }

    /// Removes the entry (filter, key), pruning emptied branches; returns its
    /// value.
    pub fn remove(&mut self, filter: &str, key: &K) -> Option<V> {
        let levels: Vec<&str> = filter.split('/').collect();
        let old = remove_in(&mut self.root, &levels, key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Calls `f` for every entry whose filter matches `topic`.
    pub fn for_each_match<'s, F: FnMut(&'s K, &'s V)>(&'s self, topic: &str, mut f: F) {
        let levels: Vec<&str> = topic.split('/').collect();
        let dollar = topic.starts_with('$');
        walk(&self.root, &levels, dollar, &mut f);
    }

    /// Every entry whose filter matches `topic`, as (key, value) pairs. A key
    /// appears once per matching filter.
    pub fn matches(&self, topic: &str) -> Vec<(&K, &V)> {
        let mut out = Vec::new();
        self.for_each_match(topic, |k, v| out.push((k, v)));
        out
    }

    /// Whether the tree holds no node at all (emptied branches are pruned).
    #[cfg(test)]
    pub(crate) fn has_no_nodes(&self) -> bool {
        self.root.is_empty()
    }
}

fn remove_in<K: Eq + Hash, V>(node: &mut Node<K, V>, levels: &[&str], key: &K) -> Option<V> {
    let Some((level, rest)) = levels.split_first() else {
        return node.subs.remove(key);
    };
    let child = node.children.get_mut(*level)?;
    let old = remove_in(child, rest, key);
    if child.is_empty() {
        node.children.remove(*level);
    }
    old
}

/// Visits the subscriptions under `node` matching the remaining `levels`.
/// `at_dollar_root` is true at the root for a `$` topic, where wildcards do
/// not match.
fn walk<'s, K, V, F: FnMut(&'s K, &'s V)>(
    node: &'s Node<K, V>,
    levels: &[&str],
    at_dollar_root: bool,
    f: &mut F,
) {
    if !at_dollar_root {
        // `#` matches the remaining levels, including none (`a/#` matches `a`).
        if let Some(hash) = node.children.get("#") {
            hash.subs.iter().for_each(|(k, v)| f(k, v));
        }
    }
    let Some((level, rest)) = levels.split_first() else {
        node.subs.iter().for_each(|(k, v)| f(k, v));
        return;
    };
    if *level != "+" && *level != "#" {
        if let Some(child) = node.children.get(*level) {
            walk(child, rest, false, f);
        }
    }
    if !at_dollar_root {
        if let Some(plus) = node.children.get("+") {
            walk(plus, rest, false, f);
        }
    }
}
