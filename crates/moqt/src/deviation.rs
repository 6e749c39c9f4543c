//! Departures from draft 18 by widely used peers that are accepted because
//! their intent is unambiguous (`crates/moqt/INTEROP.md`, "Deviations
//! accepted").
//!
//! The decoder reads them as the draft-18 message the peer meant and says
//! so ([`crate::Message::decode_noting`], [`crate::session::FrameReader`]),
//! so that the caller counts each one (`quichub_interop_deviations_total`);
//! [`Dialect`] names the peers whose SETUP shows that they cannot read part
//! of draft 18, so that the caller leaves that part out for them.

use crate::message::{setup_option, Setup};

/// One departure from draft 18 that is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deviation {
    /// SUBSCRIBE_NAMESPACE with draft 16's type 0x11 and its Subscribe
    /// Options field after the prefix (`moq-net` 0.1.3, in `moq-clock`
    /// 0.10.21). Draft 18 gives 0x11 no meaning: Options 1 (NAMESPACE) is
    /// read as SUBSCRIBE_NAMESPACE (0x50), 0 (PUBLISH) as SUBSCRIBE_TRACKS
    /// (0x51).
    SubscribeNamespace0x11,
    /// GROUP_ORDER (0x22) in SUBSCRIBE_OK (`moq-net` 0.1): the publisher's
    /// group order, which draft 18 moved to a Track Property. Ignored.
    SubscribeOkGroupOrder,
    /// The uint8 Message Parameters (FORWARD, SUBSCRIBER_PRIORITY,
    /// GROUP_ORDER) written as vi64s, as `@moq/net` 0.2.8 (in `@moq/watch`
    /// 0.4.6) writes every even-typed parameter: a value of 128 or more is
    /// then two bytes, 0x80 and the value. Read so only when the message
    /// does not decode as draft 18 and does, exactly, this way.
    Uint8ParametersAsVarints,
    /// Not the peer's input but our answer to it: SUBSCRIBE_OK (or the
    /// REQUEST_OK of a REQUEST_UPDATE) sent without LARGEST_OBJECT to a
    /// peer of [`Dialect::MoqNet01`], which fails the whole subscription on
    /// that parameter.
    LargestObjectWithheld,
    /// Our answer too: a peer of [`Dialect::MoqNet01`] subscribing with the
    /// Largest Object filter while a group is under way is served that
    /// group from its first object (from the cache), as moq-net's own
    /// publishers and relays serve it. It drops a subgroup stream that does
    /// not start at object 0, and moq-clock then exits.
    CurrentGroupFromStart,
    /// Our answer too: the Track Alias of a subscription of a peer of
    /// [`Dialect::MoqNet01`] is its Request ID (moq-net's publishers choose
    /// so). A data stream that overtakes SUBSCRIBE_OK is read under the
    /// Request ID its alias names, and dropped when that names nothing.
    TrackAliasIsRequestId,
}

impl Deviation {
    /// Every deviation, in the order of [`Deviation::index`].
    pub const ALL: [Deviation; 6] = [
        Deviation::SubscribeNamespace0x11,
        Deviation::SubscribeOkGroupOrder,
        Deviation::Uint8ParametersAsVarints,
        Deviation::LargestObjectWithheld,
        Deviation::CurrentGroupFromStart,
        Deviation::TrackAliasIsRequestId,
    ];

    /// A dense index, for counters.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The implementation known to send it (a metrics label).
    pub fn peer(self) -> &'static str {
        match self {
            Deviation::SubscribeNamespace0x11
            | Deviation::SubscribeOkGroupOrder
            | Deviation::LargestObjectWithheld
            | Deviation::CurrentGroupFromStart
            | Deviation::TrackAliasIsRequestId => "moq-net",
            Deviation::Uint8ParametersAsVarints => "@moq/net",
        }
    }

    /// What it is (a metrics label).
    pub fn kind(self) -> &'static str {
        match self {
            Deviation::SubscribeNamespace0x11 => "subscribe_namespace_0x11",
            Deviation::SubscribeOkGroupOrder => "subscribe_ok_group_order",
            Deviation::Uint8ParametersAsVarints => "uint8_parameters_as_varints",
            Deviation::LargestObjectWithheld => "largest_object_withheld",
            Deviation::CurrentGroupFromStart => "current_group_from_start",
            Deviation::TrackAliasIsRequestId => "track_alias_is_request_id",
        }
    }
}

/// The deviations one decode accepted (a small set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deviations(u8);

impl Deviations {
    /// No deviation.
    pub const NONE: Deviations = Deviations(0);

    /// Adds `d`.
    pub fn insert(&mut self, d: Deviation) {
        self.0 |= 1 << d.index();
    }

    /// Adds every deviation of `other`.
    pub fn extend(&mut self, other: Deviations) {
        self.0 |= other.0;
    }

    /// True when `d` is in the set.
    pub fn contains(self, d: Deviation) -> bool {
        self.0 & (1 << d.index()) != 0
    }

    /// True when the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The deviations in the set.
    pub fn iter(self) -> impl Iterator<Item = Deviation> {
        Deviation::ALL
            .into_iter()
            .filter(move |d| self.contains(*d))
    }
}

impl From<Deviation> for Deviations {
    fn from(d: Deviation) -> Self {
        let mut s = Deviations::NONE;
        s.insert(d);
        s
    }
}

/// What a peer's SETUP says about the draft-18 it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// Nothing known against it: draft 18 as written.
    #[default]
    Draft18,
    /// `moq-net` 0.1 (`moq-clock` 0.10.21 and the other tools built on
    /// it): its SETUP carries MOQT_IMPLEMENTATION `moq-lite-rs` and no
    /// other option (`moq-net` 0.3 adds its Solicit and Hidden
    /// extensions). It fails a subscription whose SUBSCRIBE_OK (or
    /// REQUEST_OK) carries LARGEST_OBJECT, and its session on a FETCH
    /// carrying FILL_TIMEOUT: it reads only the parameters it knows. It
    /// drops a subgroup stream that does not start at object 0, and one
    /// that overtakes its SUBSCRIBE_OK unless the alias is the Request ID.
    MoqNet01,
}

/// `moq-net`'s MOQT_IMPLEMENTATION value.
const MOQ_NET_IMPLEMENTATION: &[u8] = b"moq-lite-rs";

impl Dialect {
    /// The dialect a peer's SETUP shows.
    pub fn of(setup: &Setup) -> Self {
        let only_implementation = setup
            .options
            .iter()
            .all(|kv| kv.kind == setup_option::MOQT_IMPLEMENTATION);
        match setup.implementation() {
            Some(i) if only_implementation && i.as_ref() == MOQ_NET_IMPLEMENTATION => {
                Dialect::MoqNet01
            }
            _ => Dialect::Draft18,
        }
    }

    /// True when messages to this peer must not carry LARGEST_OBJECT.
    pub fn withholds_largest_object(self) -> bool {
        self == Dialect::MoqNet01
    }

    /// True when this peer reads only whole subgroups (from object 0), so
    /// a subscription that starts inside a group starts at its beginning.
    pub fn reads_whole_groups(self) -> bool {
        self == Dialect::MoqNet01
    }

    /// True when this peer's subscriptions must use their Request ID as
    /// Track Alias: it reads a data stream that overtakes SUBSCRIBE_OK only
    /// then.
    pub fn aliases_by_request_id(self) -> bool {
        self == Dialect::MoqNet01
    }

    /// True when this peer may be sent FILL_TIMEOUT in FETCH: `moq-net`
    /// 0.1 closes its session on any parameter it does not know, and
    /// FILL_TIMEOUT (new in draft 18) is one.
    pub fn reads_fill_timeout(self) -> bool {
        self != Dialect::MoqNet01
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coding::KeyValue;

    #[test]
    fn labels_are_distinct_and_indices_dense() {
        for (i, d) in Deviation::ALL.iter().enumerate() {
            assert_eq!(d.index(), i);
        }
        let kinds: std::collections::HashSet<_> = Deviation::ALL.iter().map(|d| d.kind()).collect();
        assert_eq!(kinds.len(), Deviation::ALL.len());
    }

    #[test]
    fn deviation_sets() {
        let mut s = Deviations::NONE;
        assert!(s.is_empty());
        s.insert(Deviation::SubscribeOkGroupOrder);
        s.extend(Deviation::SubscribeNamespace0x11.into());
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [
                Deviation::SubscribeNamespace0x11,
                Deviation::SubscribeOkGroupOrder
            ]
        );
        assert!(!s.contains(Deviation::Uint8ParametersAsVarints));
    }

    #[test]
    fn moq_net_0_1_is_known_by_its_setup() {
        let setup = |options: Vec<KeyValue>| Setup { options };
        let implementation = KeyValue::bytes(setup_option::MOQT_IMPLEMENTATION, "moq-lite-rs");
        // moq-net 0.1.3's draft-18 SETUP (`ietf::session::run_setup`).
        assert_eq!(
            Dialect::of(&setup(vec![implementation.clone()])),
            Dialect::MoqNet01
        );
        // moq-net 0.3.18 adds its Solicit (0x40b5a) and Hidden options.
        assert_eq!(
            Dialect::of(&setup(vec![implementation, KeyValue::int(0x40b5a, 1)])),
            Dialect::Draft18
        );
        assert_eq!(Dialect::of(&setup(vec![])), Dialect::Draft18);
        assert_eq!(
            Dialect::of(&setup(vec![KeyValue::bytes(
                setup_option::MOQT_IMPLEMENTATION,
                "quichub/0.1"
            )])),
            Dialect::Draft18
        );
        assert!(Dialect::MoqNet01.withholds_largest_object());
        assert!(!Dialect::Draft18.withholds_largest_object());
        assert!(!Dialect::MoqNet01.reads_fill_timeout());
        assert!(Dialect::MoqNet01.reads_whole_groups());
        assert!(!Dialect::Draft18.reads_whole_groups());
        assert!(Dialect::MoqNet01.aliases_by_request_id());
        assert!(!Dialect::Draft18.aliases_by_request_id());
        assert!(Dialect::Draft18.reads_fill_timeout());
    }
}
