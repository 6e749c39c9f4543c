//! Topic tests: validation, matching (with the §4.7 examples), `$share`
//! parsing and [`TopicTree`] against brute-force [`matches`].

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

#[test]
fn topic_names() {
    for ok in ["a", "a/b", "/", "a//b", "$SYS/x", "é/ü", " "] {
        assert!(valid_topic_name(ok), "{ok:?}");
    }
    for bad in ["", "a/+", "#", "a/b#", "a\0b"] {
        assert!(!valid_topic_name(bad), "{bad:?}");
    }
    assert!(valid_topic_name(&"a".repeat(MAX_TOPIC_LEN)));
    assert!(!valid_topic_name(&"a".repeat(MAX_TOPIC_LEN + 1)));
}

#[test]
fn topic_filters() {
    for ok in [
        "#",
        "+",
        "a/#",
        "a/+/b",
        "+/+",
        "/+",
        "+/",
        "sport/tennis/#",
        "a//#",
        "$SYS/#",
        "a",
    ] {
        assert!(valid_topic_filter(ok), "{ok:?}");
    }
    for bad in ["", "a#", "a/#/b", "#/a", "a+", "a/b+/c", "++", "##", "a\0"] {
        assert!(!valid_topic_filter(bad), "{bad:?}");
    }
}

#[test]
fn matching_spec_examples() {
    let yes = [
        ("sport/tennis/player1/#", "sport/tennis/player1"),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking"),
        (
            "sport/tennis/player1/#",
            "sport/tennis/player1/score/wimbledon",
        ),
        ("sport/#", "sport"),
        ("#", "a/b/c"),
        ("sport/tennis/+", "sport/tennis/player1"),
        ("sport/+", "sport/"),
        ("+/+", "/finance"),
        ("/+", "/finance"),
        ("+", "a"),
        ("a/+/c", "a//c"),
        ("$SYS/#", "$SYS/broker"),
        ("$SYS/monitor/+", "$SYS/monitor/Clients"),
        ("a/b", "a/b"),
    ];
    for (f, t) in yes {
        assert!(matches(f, t), "{f} should match {t}");
    }
    let no = [
        ("sport/tennis/+", "sport/tennis/player1/ranking"),
        ("sport/+", "sport"),
        ("+", "/finance"),
        ("#", "$SYS/broker"),
        ("+/monitor/Clients", "$SYS/monitor/Clients"),
        ("a/b", "a/b/c"),
        ("a/b/c", "a/b"),
        ("A", "a"),
        ("a/+", "a"),
    ];
    for (f, t) in no {
        assert!(!matches(f, t), "{f} should not match {t}");
    }
}

#[test]
fn shared_subscriptions() {
    assert_eq!(
        Filter::parse("$share/g/a/+"),
        Ok(Filter::Shared(SharedFilter {
            group: "g",
            filter: "a/+"
        }))
    );
    assert_eq!(
        parse_subscription("$share/consumer1/sport/#"),
        Ok((Some("consumer1".into()), "sport/#".into()))
    );
    assert_eq!(parse_subscription("a/#"), Ok((None, "a/#".into())));
    // `$share` alone and lookalikes are ordinary filters.
    assert_eq!(parse_subscription("$share"), Ok((None, "$share".into())));
    assert_eq!(
        parse_subscription("$shared/x"),
        Ok((None, "$shared/x".into()))
    );
    for (bad, e) in [
        ("$share/", TopicError::InvalidShare),
        ("$share/g", TopicError::InvalidShare),
        ("$share//a", TopicError::InvalidShare),
        ("$share/g+/a", TopicError::InvalidShare),
        ("$share/#/a", TopicError::InvalidShare),
        ("$share/g/", TopicError::InvalidFilter),
        ("$share/g/a/#/b", TopicError::InvalidFilter),
        ("a/#/b", TopicError::InvalidFilter),
        ("", TopicError::InvalidFilter),
    ] {
        assert_eq!(Filter::parse(bad), Err(e.clone()), "{bad:?}");
        assert_eq!(e.reason_code(), crate::reason::TOPIC_FILTER_INVALID);
    }
    let f = Filter::parse("$share/g/a/+").unwrap();
    assert_eq!(
        (f.group(), f.filter(), f.has_wildcard()),
        (Some("g"), "a/+", true)
    );
    assert!(!Filter::parse("a/b").unwrap().has_wildcard());
}

fn keys(tree: &TopicTree<&'static str, u32>, topic: &str) -> Vec<(&'static str, u32)> {
    let mut v: Vec<_> = tree
        .matches(topic)
        .into_iter()
        .map(|(k, v)| (*k, *v))
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn tree_basics() {
    let mut t = TopicTree::new();
    assert!(t.is_empty());
    assert_eq!(t.insert("a/b", "c1", 1), None);
    assert_eq!(t.insert("a/+", "c1", 2), None);
    assert_eq!(t.insert("a/#", "c2", 3), None);
    assert_eq!(t.insert("#", "c3", 4), None);
    assert_eq!(t.insert("+/b", "c4", 5), None);
    assert_eq!(t.insert("$SYS/#", "c5", 6), None);
    assert_eq!(t.insert("a/b", "c1", 7), Some(1));
    assert_eq!(t.len(), 6);

    assert_eq!(
        keys(&t, "a/b"),
        [("c1", 2), ("c1", 7), ("c2", 3), ("c3", 4), ("c4", 5)]
    );
    assert_eq!(keys(&t, "a"), [("c2", 3), ("c3", 4)]);
    assert_eq!(keys(&t, "a/c/d"), [("c2", 3), ("c3", 4)]);
    assert_eq!(keys(&t, "$SYS/x"), [("c5", 6)]);
    assert_eq!(keys(&t, "$SYS"), [("c5", 6)]);
    assert_eq!(keys(&t, "x/b"), [("c3", 4), ("c4", 5)]);

    assert_eq!(t.get("a/+", &"c1"), Some(&2));
    *t.get_mut("a/+", &"c1").unwrap() = 9;
    assert_eq!(t.get("a/+", &"c1"), Some(&9));
    assert_eq!(t.get("a/+", &"c2"), None);
    assert_eq!(t.get("z", &"c2"), None);

    assert_eq!(t.remove("a/+", &"c2"), None);
    assert_eq!(t.remove("nope/x", &"c1"), None);
    assert_eq!(t.remove("a/+", &"c1"), Some(9));
    assert_eq!(t.remove("a/+", &"c1"), None);
    assert_eq!(t.len(), 5);
    for (f, k) in [
        ("a/b", "c1"),
        ("a/#", "c2"),
        ("#", "c3"),
        ("+/b", "c4"),
        ("$SYS/#", "c5"),
    ] {
        assert!(t.remove(f, &k).is_some());
    }
    assert!(t.is_empty());
    assert!(t.has_no_nodes(), "emptied branches are pruned");
}

#[test]
fn tree_dollar_topics() {
    let mut t = TopicTree::new();
    t.insert("+/x", "plus", 0);
    t.insert("#", "hash", 0);
    t.insert("$a/+", "dollar", 0);
    assert_eq!(keys(&t, "$a/x"), [("dollar", 0)]);
    assert_eq!(keys(&t, "b/x"), [("hash", 0), ("plus", 0)]);
}

fn level() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("a"), Just("b"), Just(""), Just("$c")]
}

fn filter() -> impl Strategy<Value = String> {
    let lvl = prop_oneof![3 => level(), 1 => Just("+")];
    (proptest::collection::vec(lvl, 1..4), any::<bool>())
        .prop_map(|(mut levels, hash)| {
            if hash {
                levels.push("#");
            }
            levels.join("/")
        })
        .prop_filter("valid filter", |f| valid_topic_filter(f))
}

fn topic() -> impl Strategy<Value = String> {
    proptest::collection::vec(level(), 1..5)
        .prop_map(|l| l.join("/"))
        .prop_filter("valid topic", |t| valid_topic_name(t))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn tree_agrees_with_brute_force(
        filters in proptest::collection::vec((filter(), 0u8..4), 0..24),
        topics in proptest::collection::vec(topic(), 1..8),
        removals in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut tree = TopicTree::new();
        let mut entries = BTreeSet::new();
        for (f, k) in &filters {
            prop_assert!(valid_topic_filter(f), "{f}");
            tree.insert(f, *k, f.clone());
            entries.insert((f.clone(), *k));
        }
        for i in removals {
            if entries.is_empty() {
                break;
            }
            let (f, k) = entries.iter().nth(i.index(entries.len())).cloned().unwrap();
            prop_assert_eq!(tree.remove(&f, &k), Some(f.clone()));
            entries.remove(&(f, k));
        }
        prop_assert_eq!(tree.len(), entries.len());
        for t in &topics {
            let mut got: Vec<(String, u8)> =
                tree.matches(t).into_iter().map(|(k, f)| (f.clone(), *k)).collect();
            got.sort();
            let want: Vec<(String, u8)> =
                entries.iter().filter(|(f, _)| matches(f, t)).cloned().collect();
            prop_assert_eq!(got, want, "topic {}", t);
        }
    }
}
