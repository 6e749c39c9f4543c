//! Topic names and filters (§4.7): validation, matching, shared
//! subscriptions (§4.8.2) and [`TopicTree`], a subscription trie.

use thiserror::Error;

use crate::reason;

mod tree;

pub use tree::TopicTree;

/// Longest topic name or filter: a UTF-8 string's length field is 16 bits.
pub const MAX_TOPIC_LEN: usize = 65_535;

/// Prefix of a shared subscription filter.
pub const SHARE_PREFIX: &str = "$share/";

/// Whether `topic` is a valid Topic Name: non-empty, at most 65535 bytes, no
/// wildcard (`+`, `#`) and no U+0000.
pub fn valid_topic_name(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= MAX_TOPIC_LEN && !topic.contains(['+', '#', '\0'])
}

/// Whether `filter` is a valid Topic Filter: non-empty, at most 65535 bytes,
/// no U+0000, `+` only as a whole level, `#` only as the whole last level.
pub fn valid_topic_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.len() > MAX_TOPIC_LEN || filter.contains('\0') {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        match level {
            "+" => {}
            "#" if last => {}
            l if l.contains(['+', '#']) => return false,
            _ => {}
        }
    }
    true
}

/// Whether the (valid) filter `filter` matches the (valid) topic name `topic`.
///
/// `+` matches exactly one level, `#` any number of levels including the
/// parent (`a/#` matches `a`), and a topic starting with `$` is not matched by
/// a filter starting with a wildcard (§4.7.2).
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (None, None) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(tl)) if fl == tl => {}
            _ => return false,
        }
    }
}

/// Why a subscription's topic filter is unacceptable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TopicError {
    /// The topic filter is not valid.
    #[error("invalid topic filter")]
    InvalidFilter,
    /// A `$share/` filter whose share name is empty or contains a wildcard,
    /// or which has no filter part.
    #[error("invalid shared subscription")]
    InvalidShare,
}

impl TopicError {
    /// The SUBACK reason code to answer with (Topic Filter invalid).
    pub fn reason_code(&self) -> u8 {
        reason::TOPIC_FILTER_INVALID
    }
}

/// A shared subscription, `$share/{group}/{filter}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SharedFilter<'a> {
    /// The share name: non-empty, without `/`, `+` or `#`.
    pub group: &'a str,
    /// The topic filter proper.
    pub filter: &'a str,
}

/// A parsed subscription filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter<'a> {
    /// An ordinary topic filter.
    Plain(&'a str),
    /// A shared subscription.
    Shared(SharedFilter<'a>),
}

impl<'a> Filter<'a> {
    /// Parses and validates a SUBSCRIBE or UNSUBSCRIBE topic filter.
    pub fn parse(s: &'a str) -> Result<Filter<'a>, TopicError> {
        let Some(rest) = s.strip_prefix(SHARE_PREFIX) else {
            return if valid_topic_filter(s) {
                Ok(Filter::Plain(s))
            } else {
                Err(TopicError::InvalidFilter)
            };
        };
        let (group, filter) = rest.split_once('/').ok_or(TopicError::InvalidShare)?;
        if group.is_empty() || group.contains(['+', '#']) {
            return Err(TopicError::InvalidShare);
        }
        if !valid_topic_filter(filter) {
            return Err(TopicError::InvalidFilter);
        }
        Ok(Filter::Shared(SharedFilter { group, filter }))
    }

    /// The topic filter used for matching (without any `$share/` prefix).
    pub fn filter(&self) -> &'a str {
        match self {
            Filter::Plain(f) => f,
            Filter::Shared(s) => s.filter,
        }
    }

    /// The share name, for a shared subscription.
    pub fn group(&self) -> Option<&'a str> {
        match self {
            Filter::Plain(_) => None,
            Filter::Shared(s) => Some(s.group),
        }
    }

    /// Whether the filter has a `+` or `#` wildcard.
    pub fn has_wildcard(&self) -> bool {
        self.filter().split('/').any(|l| l == "+" || l == "#")
    }
}

/// Parses a subscription filter into its share name (for `$share/...`) and
/// its topic filter.
pub fn parse_subscription(s: &str) -> Result<(Option<String>, String), TopicError> {
    let f = Filter::parse(s)?;
    Ok((f.group().map(str::to_owned), f.filter().to_owned()))
}

#[cfg(test)]
mod tests;
