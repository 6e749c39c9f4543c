//! mosquitto's `acl_file`, parsed once and evaluated per request.
//!
//! Format (mosquitto 2, `man mosquitto.conf`, "acl_file"):
//!
//! ```text
//! # comment
//! topic read $SYS/#          # before any `user` line: anonymous clients
//! user alice
//! topic readwrite sensors/#  # alice's rules until the next `user` line
//! topic deny sensors/secret
//! pattern write devices/%c/# # every client, %c = client id, %u = user name
//! ```
//!
//! - `topic [read|write|readwrite|deny] TOPIC`; no access word means
//!   `readwrite`. The topic is the rest of the line, spaces included.
//! - `pattern [..] PATTERN` applies to every client; a level that is exactly
//!   `%c` or `%u` matches the client id or user name (a client without one
//!   never matches it), as mosquitto 2's `mosquitto_topic_matches_sub_with_pattern`.
//! - A client's rules are its user's `topic` lines (the lines before the
//!   first `user` line for anonymous clients) followed by every `pattern`.
//!   `deny` rules are checked first and win; then any rule granting the
//!   access allows; nothing matching denies.
//! - A topic starting with `$` only matches rules starting with `$`.
//! - Subscriptions are checked as mosquitto 2's `mosquitto_sub_matches_acl`:
//!   a filter is allowed when a `read` rule covers every topic it can match
//!   (`sensors/+` is covered by `sensors/#`, `sensors/#` is not covered by
//!   `sensors/+`), and refused when a `deny` rule covers it; deliveries are
//!   checked per topic as well, which is where a narrower `deny` applies.
//!
//! Where quichub is stricter than mosquitto 1.x: an unknown keyword, an
//! unknown access word, a `user` line without a name or an invalid topic
//! filter is an error naming the line, not a silently ignored line.
//!
//! Hand-written because no maintained crate parses mosquitto's ACL format or
//! implements its matching rules; MQTT topic matching itself is a few lines
//! and must run without allocating.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::AuthError;
use crate::path::valid_filter;
use crate::Access;

/// One level of a rule's topic filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Level {
    Literal(Box<str>),
    /// `+`
    Plus,
    /// `#` (always last)
    Hash,
    /// `%c` in a `pattern` rule.
    ClientId,
    /// `%u` in a `pattern` rule.
    Username,
}

/// What a rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuleAccess {
    Read,
    Write,
    ReadWrite,
    Deny,
}

impl RuleAccess {
    fn grants(self, a: Access) -> bool {
        matches!(
            (self, a),
            (RuleAccess::ReadWrite, _)
                | (RuleAccess::Read, Access::Read)
                | (RuleAccess::Write, Access::Write)
        )
    }
}

/// One `topic` or `pattern` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) access: RuleAccess,
    pub(crate) levels: Box<[Level]>,
    /// The rule's text starts with `$` (only those match `$` topics).
    dollar: bool,
}

/// Who the substitutions of `pattern` rules stand for.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Who<'a> {
    pub(crate) username: Option<&'a str>,
    pub(crate) client_id: Option<&'a str>,
}

/// The result of checking one request against a client's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allow,
    Deny,
    /// No rule says anything (denied by the ACL, but other grants such as
    /// JWT claims may still allow).
    NoMatch,
}

/// A parsed `acl_file`.
#[derive(Debug, Clone, Default)]
pub struct AclFile {
    anonymous: Arc<[Rule]>,
    users: HashMap<String, Arc<[Rule]>>,
    patterns: Arc<[Rule]>,
}

impl AclFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<AclFile, AuthError> {
        let bytes = crate::error::read(path)?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| AuthError::config(path, None, format!("not UTF-8: {e}")))?;
        AclFile::parse(text).map_err(|(line, msg)| AuthError::config(path, Some(line), msg))
    }

    /// Parses the text of an ACL file; errors carry the 1-based line.
    pub fn parse(text: &str) -> Result<AclFile, (usize, String)> {
        let mut anonymous = Vec::new();
        let mut users: HashMap<String, Vec<Rule>> = HashMap::new();
        let mut patterns = Vec::new();
        let mut user: Option<String> = None;
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (word, rest) = split_word(line);
            match word {
                "user" => {
                    if rest.is_empty() {
                        return Err((n, "`user` without a name".into()));
                    }
                    users.entry(rest.to_string()).or_default();
                    user = Some(rest.to_string());
                }
                "topic" | "pattern" => {
                    let rule = parse_rule(rest, word == "pattern").map_err(|m| (n, m))?;
                    if word == "pattern" {
                        patterns.push(rule);
                    } else if let Some(u) = &user {
                        users.entry(u.clone()).or_default().push(rule);
                    } else {
                        anonymous.push(rule);
                    }
                }
                other => return Err((n, format!("unknown keyword {other:?}"))),
            }
        }
        Ok(AclFile {
            anonymous: anonymous.into(),
            users: users.into_iter().map(|(k, v)| (k, v.into())).collect(),
            patterns: patterns.into(),
        })
    }

    /// The `topic` rules for anonymous clients (before the first `user` line).
    pub(crate) fn anonymous_rules(&self) -> Arc<[Rule]> {
        self.anonymous.clone()
    }

    /// `user`'s `topic` rules (empty when the file does not name the user).
    pub(crate) fn user_rules(&self, user: &str) -> Arc<[Rule]> {
        self.users
            .get(user)
            .cloned()
            .unwrap_or_else(|| Arc::from([]))
    }

    /// The `pattern` rules, which apply to every client.
    pub(crate) fn patterns(&self) -> Arc<[Rule]> {
        self.patterns.clone()
    }
}

fn split_word(s: &str) -> (&str, &str) {
    match s.split_once([' ', '\t']) {
        Some((w, rest)) => (w, rest.trim_start()),
        None => (s, ""),
    }
}

fn parse_rule(rest: &str, pattern: bool) -> Result<Rule, String> {
    let (first, after) = split_word(rest);
    // As mosquitto: a single word is the topic, with readwrite access.
    let (access, topic) = if after.is_empty() {
        (RuleAccess::ReadWrite, first)
    } else {
        let access = match first {
            "read" => RuleAccess::Read,
            "write" => RuleAccess::Write,
            "readwrite" => RuleAccess::ReadWrite,
            "deny" => RuleAccess::Deny,
            other => {
                return Err(format!(
                    "unknown access {other:?} (read, write, readwrite, deny)"
                ))
            }
        };
        (access, after)
    };
    if topic.is_empty() {
        return Err("missing topic".into());
    }
    if !valid_filter(topic) {
        return Err(format!("invalid topic filter {topic:?}"));
    }
    let levels = topic
        .split('/')
        .map(|l| match l {
            "+" => Level::Plus,
            "#" => Level::Hash,
            "%c" if pattern => Level::ClientId,
            "%u" if pattern => Level::Username,
            l => Level::Literal(l.into()),
        })
        .collect();
    Ok(Rule {
        access,
        levels,
        dollar: topic.starts_with('$'),
    })
}

impl Level {
    /// Whether this (non-wildcard) level equals `s` for this client.
    fn equals(&self, s: &str, who: &Who) -> bool {
        match self {
            Level::Literal(l) => &**l == s,
            // An empty id or name (an anonymous MoQT or HTTP client has
            // client id "") substitutes nothing: `devices/%c/out` must not
            // grant `devices//out` to every such client.
            Level::ClientId => who.client_id.is_some_and(|c| !c.is_empty() && c == s),
            Level::Username => who.username.is_some_and(|u| !u.is_empty() && u == s),
            Level::Plus | Level::Hash => false,
        }
    }
}

impl Rule {
    /// mosquitto's `topic_matches_sub(rule, topic)` on topic levels.
    pub(crate) fn matches_topic<'a>(
        &self,
        mut topic: impl Iterator<Item = &'a str>,
        dollar: bool,
        who: &Who,
    ) -> bool {
        if dollar && !self.dollar {
            return false;
        }
        for level in self.levels.iter() {
            match level {
                Level::Hash => return true,
                Level::Plus => {
                    if topic.next().is_none() {
                        return false;
                    }
                }
                l => match topic.next() {
                    Some(t) if l.equals(t, who) => {}
                    _ => return false,
                },
            }
        }
        topic.next().is_none()
    }

    /// mosquitto's `sub_matches_acl(rule, filter)`: whether the rule covers
    /// every topic the filter can match.
    pub(crate) fn covers_filter<'a>(
        &self,
        mut filter: impl Iterator<Item = &'a str>,
        dollar: bool,
        who: &Who,
    ) -> bool {
        if dollar && !self.dollar {
            return false;
        }
        for level in self.levels.iter() {
            match level {
                Level::Hash => return true,
                Level::Plus => match filter.next() {
                    Some("#") | None => return false,
                    Some(_) => {}
                },
                l => match filter.next() {
                    Some("+") | Some("#") | None => return false,
                    Some(f) if l.equals(f, who) => {}
                    Some(_) => return false,
                },
            }
        }
        filter.next().is_none()
    }

    /// Whether some topic matches both the rule and the filter.
    pub(crate) fn intersects_filter<'a>(
        &self,
        mut filter: impl Iterator<Item = &'a str>,
        who: &Who,
    ) -> bool {
        let mut rule = self.levels.iter();
        loop {
            match (rule.next(), filter.next()) {
                (Some(Level::Hash), _) | (_, Some("#")) => return true,
                (None, None) => return true,
                (None, Some(_)) | (Some(_), None) => return false,
                (Some(Level::Plus), Some(_)) | (Some(_), Some("+")) => {}
                (Some(l), Some(f)) => {
                    if !l.equals(f, who) {
                        return false;
                    }
                }
            }
        }
    }
}

/// How a request names what it touches.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    /// A topic name (publish, delivery).
    Topic,
    /// A subscription filter, checked as mosquitto does (deny only when a
    /// deny rule covers the whole filter).
    Filter,
    /// Every topic a filter can match (a MoQT namespace prefix): a deny rule
    /// that overlaps any of them refuses.
    AllOf,
}

/// Checks a request against `rules` then `patterns` (deny first).
/// `levels` is re-created per rule, so it must be cheap to clone.
pub(crate) fn check<'a, I>(
    rules: &[Rule],
    patterns: &[Rule],
    who: &Who,
    access: Access,
    target: Target,
    levels: I,
) -> Verdict
where
    I: Iterator<Item = &'a str> + Clone,
{
    let dollar = levels.clone().next().is_some_and(|l| l.starts_with('$'));
    let hit = |r: &Rule, deny: bool| match target {
        Target::Topic => r.matches_topic(levels.clone(), dollar, who),
        Target::Filter => r.covers_filter(levels.clone(), dollar, who),
        Target::AllOf if deny => r.intersects_filter(levels.clone(), who),
        Target::AllOf => r.covers_filter(levels.clone(), dollar, who),
    };
    let all = || rules.iter().chain(patterns.iter());
    if all().any(|r| r.access == RuleAccess::Deny && hit(r, true)) {
        return Verdict::Deny;
    }
    if all().any(|r| r.access.grants(access) && hit(r, false)) {
        return Verdict::Allow;
    }
    Verdict::NoMatch
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# anonymous
topic read public/#
topic deny public/secret

user alice
topic readwrite sensors/#
topic deny sensors/secret
topic write  cmd/with space
topic $SYS/broker/#

user bob
topic read sensors/+/temp

pattern write devices/%c/out
pattern read users/%u/#
pattern read mixed/x%u/#
";

    fn verdict(
        acl: &AclFile,
        user: Option<&str>,
        client: &str,
        a: Access,
        t: Target,
        topic: &str,
    ) -> Verdict {
        let rules = match user {
            Some(u) => acl.user_rules(u),
            None => acl.anonymous_rules(),
        };
        let who = Who {
            username: user,
            client_id: Some(client),
        };
        check(&rules, &acl.patterns(), &who, a, t, topic.split('/'))
    }

    fn ok(acl: &AclFile, user: Option<&str>, a: Access, t: Target, topic: &str) -> bool {
        verdict(acl, user, "c1", a, t, topic) == Verdict::Allow
    }

    #[test]
    fn users_anonymous_and_deny() {
        let acl = AclFile::parse(FILE).unwrap();
        use Access::*;
        use Target::*;
        assert!(ok(&acl, None, Read, Topic, "public/news"));
        assert!(!ok(&acl, None, Write, Topic, "public/news"));
        assert_eq!(
            verdict(&acl, None, "c1", Read, Topic, "public/secret"),
            Verdict::Deny
        );
        assert!(!ok(&acl, None, Read, Topic, "sensors/a"));

        assert!(ok(&acl, Some("alice"), Write, Topic, "sensors/a/temp"));
        assert!(ok(&acl, Some("alice"), Read, Topic, "sensors"));
        assert_eq!(
            verdict(&acl, Some("alice"), "c1", Write, Topic, "sensors/secret"),
            Verdict::Deny
        );
        assert!(ok(&acl, Some("alice"), Write, Topic, "cmd/with space"));
        assert!(!ok(&acl, Some("alice"), Read, Topic, "cmd/with space"));
        // A user's own rules replace the anonymous ones.
        assert!(!ok(&acl, Some("alice"), Read, Topic, "public/news"));
        assert!(ok(&acl, Some("bob"), Read, Topic, "sensors/room1/temp"));
        assert!(!ok(&acl, Some("bob"), Read, Topic, "sensors/room1/hum"));
        assert!(!ok(&acl, Some("bob"), Write, Topic, "sensors/room1/temp"));
        assert!(!ok(&acl, Some("carol"), Read, Topic, "sensors/x"));
    }

    #[test]
    fn patterns_substitute_whole_levels() {
        let acl = AclFile::parse(FILE).unwrap();
        use Access::*;
        use Target::*;
        assert!(ok(&acl, Some("carol"), Write, Topic, "devices/c1/out"));
        assert!(!ok(&acl, Some("carol"), Write, Topic, "devices/c2/out"));
        assert!(ok(&acl, None, Write, Topic, "devices/c1/out"));
        assert!(ok(&acl, Some("carol"), Read, Topic, "users/carol/inbox"));
        assert!(!ok(&acl, Some("carol"), Read, Topic, "users/dave/inbox"));
        // No user name: a %u level matches nothing.
        assert!(!ok(&acl, None, Read, Topic, "users/%u/inbox"));
        assert!(!ok(&acl, None, Read, Topic, "users//inbox"));
        // An empty client id or user name matches no level (an anonymous
        // MoQT/HTTP client's id is "").
        let empty = |user| Who {
            username: user,
            client_id: Some(""),
        };
        for (who, topic) in [
            (empty(None), "devices//out"),
            (empty(Some("")), "users//inbox"),
        ] {
            let v = check(&[], &acl.patterns(), &who, Write, Topic, topic.split('/'));
            assert_eq!(v, Verdict::NoMatch, "{topic}");
            let v = check(&[], &acl.patterns(), &who, Read, Topic, topic.split('/'));
            assert_eq!(v, Verdict::NoMatch, "{topic}");
        }
        // %u inside a level is literal, as in mosquitto 2.
        assert!(ok(&acl, Some("carol"), Read, Topic, "mixed/x%u/a"));
        assert!(!ok(&acl, Some("carol"), Read, Topic, "mixed/xcarol/a"));
        // A client id with '/' cannot reach another level.
        let who = Who {
            username: None,
            client_id: Some("c1/out"),
        };
        let v = check(
            &[],
            &acl.patterns(),
            &who,
            Write,
            Topic,
            "devices/c1/out/out".split('/'),
        );
        assert_eq!(v, Verdict::NoMatch);
    }

    #[test]
    fn filters_as_mosquitto_sub_matches_acl() {
        let acl = AclFile::parse(FILE).unwrap();
        use Access::*;
        use Target::*;
        for f in [
            "sensors/#",
            "sensors/+",
            "sensors/+/temp",
            "sensors",
            "sensors/a/#",
        ] {
            assert!(ok(&acl, Some("alice"), Read, Filter, f), "{f}");
        }
        // A narrower deny does not refuse the subscription (delivery does).
        assert!(ok(&acl, Some("alice"), Read, Filter, "sensors/#"));
        assert_eq!(
            verdict(&acl, Some("alice"), "c1", Read, Filter, "sensors/secret"),
            Verdict::Deny
        );
        assert!(ok(&acl, Some("bob"), Read, Filter, "sensors/+/temp"));
        assert!(ok(&acl, Some("bob"), Read, Filter, "sensors/x/temp"));
        assert!(!ok(&acl, Some("bob"), Read, Filter, "sensors/#"));
        assert!(!ok(&acl, Some("bob"), Read, Filter, "sensors/+/#"));
        assert!(!ok(&acl, Some("bob"), Read, Filter, "#"));
        assert!(!ok(&acl, Some("bob"), Read, Filter, "+/+/temp"));
        // For every topic under a prefix, an overlapping deny refuses.
        assert!(!ok(&acl, Some("alice"), Read, AllOf, "sensors/#"));
        assert!(ok(&acl, Some("alice"), Read, AllOf, "sensors/a/#"));
    }

    #[test]
    fn dollar_topics_need_dollar_rules() {
        let acl =
            AclFile::parse("topic read #\ntopic read +/x\nuser a\ntopic read $SYS/#\n").unwrap();
        use Access::*;
        use Target::*;
        assert!(ok(&acl, None, Read, Topic, "foo/bar"));
        assert!(!ok(&acl, None, Read, Topic, "$SYS/x"));
        assert!(!ok(&acl, None, Read, Filter, "$SYS/#"));
        assert!(ok(&acl, Some("a"), Read, Topic, "$SYS/broker/load"));
        assert!(ok(&acl, Some("a"), Read, Filter, "$SYS/broker/#"));
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            AclFile::parse("user a\ntopic sideways x\n").unwrap_err().0,
            2
        );
        assert_eq!(AclFile::parse("\n\nuser\n").unwrap_err().0, 3);
        assert_eq!(AclFile::parse("topic read a/#/b\n").unwrap_err().0, 1);
        assert_eq!(AclFile::parse("# c\nfoo bar\n").unwrap_err().0, 2);
        // As mosquitto: one word after `topic` is the topic, readwrite.
        let acl = AclFile::parse("topic read\n").unwrap();
        assert!(ok(&acl, None, Access::Write, Target::Topic, "read"));
    }

    #[test]
    fn intersection() {
        let r = |t: &str| parse_rule(t, false).unwrap();
        let who = Who::default();
        assert!(r("deny a/b").intersects_filter("a/#".split('/'), &who));
        assert!(r("deny a/#").intersects_filter("a".split('/'), &who));
        assert!(r("deny a").intersects_filter("a/#".split('/'), &who));
        assert!(r("deny +/b").intersects_filter("a/+".split('/'), &who));
        assert!(!r("deny a/b").intersects_filter("a/c/#".split('/'), &who));
        assert!(!r("deny a/b/c").intersects_filter("a/+".split('/'), &who));
    }
}
