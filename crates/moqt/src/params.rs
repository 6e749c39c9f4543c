//! Message Parameters (draft-18 §10.2) and Subscription Filters (§5.1.2).
//!
//! Parameters are a count followed by delta-typed values whose encoding depends
//! on the type. Because unknown parameters cannot be skipped, every type must be
//! known; each message declares which types it accepts ([`Allowed`]).

use bytes::{BufMut, Bytes};

use crate::coding::*;
use crate::error::DecodeError;
use crate::names::TrackNamespace;

/// Parameter type codes.
#[allow(missing_docs)]
pub mod kind {
    pub const OBJECT_DELIVERY_TIMEOUT: u64 = 0x02;
    pub const AUTHORIZATION_TOKEN: u64 = 0x03;
    pub const RENDEZVOUS_TIMEOUT: u64 = 0x04;
    pub const SUBGROUP_DELIVERY_TIMEOUT: u64 = 0x06;
    pub const EXPIRES: u64 = 0x08;
    pub const LARGEST_OBJECT: u64 = 0x09;
    pub const FILL_TIMEOUT: u64 = 0x0A;
    pub const FORWARD: u64 = 0x10;
    pub const SUBSCRIBER_PRIORITY: u64 = 0x20;
    pub const SUBSCRIPTION_FILTER: u64 = 0x21;
    pub const GROUP_ORDER: u64 = 0x22;
    pub const NEW_GROUP_REQUEST: u64 = 0x32;
    pub const TRACK_NAMESPACE_PREFIX: u64 = 0x34;
}

/// Most parameters accepted in one message.
pub const MAX_PARAMS: usize = 64;
/// Most bytes in one authorization token.
pub const MAX_TOKEN: usize = 4096;

/// Group order (§10.2.9): ascending or descending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupOrder {
    /// Lower group IDs first.
    #[default]
    Ascending = 1,
    /// Higher group IDs first.
    Descending = 2,
}

impl GroupOrder {
    fn from_u8(v: u8) -> Result<Self, DecodeError> {
        match v {
            1 => Ok(Self::Ascending),
            2 => Ok(Self::Descending),
            _ => Err(DecodeError::Invalid("group order")),
        }
    }
}

/// Subscription filter (§5.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionFilter {
    /// Start at the beginning of the next group (0x1).
    NextGroupStart,
    /// Start after the Largest Object (0x2).
    LargestObject,
    /// Start at an explicit Location, open ended (0x3).
    AbsoluteStart(Location),
    /// Start at a Location and end at `start.group + end_group_delta` (0x4).
    AbsoluteRange {
        /// First Location.
        start: Location,
        /// Last group, as a delta from `start.group`.
        end_group_delta: u64,
    },
}

impl SubscriptionFilter {
    /// Encodes the filter body (without the parameter's length prefix).
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        match self {
            Self::NextGroupStart => put_vi64(buf, 1),
            Self::LargestObject => put_vi64(buf, 2),
            Self::AbsoluteStart(l) => {
                put_vi64(buf, 3);
                l.encode(buf);
            }
            Self::AbsoluteRange {
                start,
                end_group_delta,
            } => {
                put_vi64(buf, 4);
                start.encode(buf);
                put_vi64(buf, *end_group_delta);
            }
        }
    }

    /// Decodes a filter body.
    pub fn decode(buf: &mut &[u8]) -> Result<Self, DecodeError> {
        Ok(match get_vi64(buf)? {
            1 => Self::NextGroupStart,
            2 => Self::LargestObject,
            3 => Self::AbsoluteStart(Location::decode(buf)?),
            4 => {
                let start = Location::decode(buf)?;
                let end_group_delta = get_vi64(buf)?;
                if start.group.checked_add(end_group_delta).is_none() {
                    return Err(DecodeError::Invalid("end group overflow"));
                }
                Self::AbsoluteRange {
                    start,
                    end_group_delta,
                }
            }
            _ => return Err(DecodeError::Invalid("filter type")),
        })
    }

    /// The last group that passes, if the filter has one.
    pub fn end_group(&self) -> Option<u64> {
        match self {
            Self::AbsoluteRange {
                start,
                end_group_delta,
            } => Some(start.group.saturating_add(*end_group_delta)),
            _ => None,
        }
    }

    /// Resolves the Start Location given the publisher's Largest Object.
    pub fn start(&self, largest: Option<Location>) -> Location {
        match (self, largest) {
            (Self::NextGroupStart, Some(l)) => Location::new(l.group.saturating_add(1), 0),
            (Self::LargestObject, Some(l)) => Location::new(l.group, l.object.saturating_add(1)),
            (Self::NextGroupStart | Self::LargestObject, None) => Location::default(),
            (Self::AbsoluteStart(s), _) => *s,
            (Self::AbsoluteRange { start, .. }, _) => *start,
        }
    }
}

/// All Message Parameters of draft-18; absent ones are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parameters {
    /// OBJECT_DELIVERY_TIMEOUT (ms).
    pub object_delivery_timeout: Option<u64>,
    /// AUTHORIZATION_TOKEN values, raw Token structures (may repeat).
    pub authorization_tokens: Vec<Bytes>,
    /// RENDEZVOUS_TIMEOUT (ms).
    pub rendezvous_timeout: Option<u64>,
    /// SUBGROUP_DELIVERY_TIMEOUT (ms).
    pub subgroup_delivery_timeout: Option<u64>,
    /// EXPIRES (ms).
    pub expires: Option<u64>,
    /// LARGEST_OBJECT.
    pub largest_object: Option<Location>,
    /// FILL_TIMEOUT (ms).
    pub fill_timeout: Option<u64>,
    /// FORWARD (0 or 1).
    pub forward: Option<bool>,
    /// SUBSCRIBER_PRIORITY.
    pub subscriber_priority: Option<u8>,
    /// SUBSCRIPTION_FILTER.
    pub subscription_filter: Option<SubscriptionFilter>,
    /// GROUP_ORDER.
    pub group_order: Option<GroupOrder>,
    /// NEW_GROUP_REQUEST.
    pub new_group_request: Option<u64>,
    /// TRACK_NAMESPACE_PREFIX.
    pub track_namespace_prefix: Option<TrackNamespace>,
}

/// Which parameter types a message accepts, as a bit set over [`kind`] codes.
#[derive(Debug, Clone, Copy)]
pub struct Allowed(u128);

impl Allowed {
    /// Builds a set from type codes (all below 128).
    pub const fn of(kinds: &[u64]) -> Self {
        let mut m = 0u128;
        let mut i = 0;
        while i < kinds.len() {
            m |= 1u128 << kinds[i];
            i += 1;
        }
        Self(m)
    }

    /// True when parameter type `k` is in the set.
    pub fn contains(&self, k: u64) -> bool {
        k < 128 && self.0 & (1u128 << k) != 0
    }
}

impl Parameters {
    /// Number of present parameters.
    pub fn count(&self) -> usize {
        [
            self.object_delivery_timeout.is_some(),
            self.rendezvous_timeout.is_some(),
            self.subgroup_delivery_timeout.is_some(),
            self.expires.is_some(),
            self.largest_object.is_some(),
            self.fill_timeout.is_some(),
            self.forward.is_some(),
            self.subscriber_priority.is_some(),
            self.subscription_filter.is_some(),
            self.group_order.is_some(),
            self.new_group_request.is_some(),
            self.track_namespace_prefix.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count()
            + self.authorization_tokens.len()
    }

    /// Encodes the count and the parameters in ascending type order.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        put_vi64(buf, self.count() as u64);
        let mut prev = 0u64;
        let mut ty = |buf: &mut B, k: u64| {
            put_vi64(buf, k - prev);
            prev = k;
        };
        if let Some(v) = self.object_delivery_timeout {
            ty(buf, kind::OBJECT_DELIVERY_TIMEOUT);
            put_vi64(buf, v);
        }
        for t in &self.authorization_tokens {
            ty(buf, kind::AUTHORIZATION_TOKEN);
            put_lp_bytes(buf, t);
        }
        if let Some(v) = self.rendezvous_timeout {
            ty(buf, kind::RENDEZVOUS_TIMEOUT);
            put_vi64(buf, v);
        }
        if let Some(v) = self.subgroup_delivery_timeout {
            ty(buf, kind::SUBGROUP_DELIVERY_TIMEOUT);
            put_vi64(buf, v);
        }
        if let Some(v) = self.expires {
            ty(buf, kind::EXPIRES);
            put_vi64(buf, v);
        }
        if let Some(v) = self.largest_object {
            ty(buf, kind::LARGEST_OBJECT);
            v.encode(buf);
        }
        if let Some(v) = self.fill_timeout {
            ty(buf, kind::FILL_TIMEOUT);
            put_vi64(buf, v);
        }
        if let Some(v) = self.forward {
            ty(buf, kind::FORWARD);
            buf.put_u8(v as u8);
        }
        if let Some(v) = self.subscriber_priority {
            ty(buf, kind::SUBSCRIBER_PRIORITY);
            buf.put_u8(v);
        }
        if let Some(v) = &self.subscription_filter {
            ty(buf, kind::SUBSCRIPTION_FILTER);
            let mut body = Vec::with_capacity(24);
            v.encode(&mut body);
            put_lp_bytes(buf, &body);
        }
        if let Some(v) = self.group_order {
            ty(buf, kind::GROUP_ORDER);
            buf.put_u8(v as u8);
        }
        if let Some(v) = self.new_group_request {
            ty(buf, kind::NEW_GROUP_REQUEST);
            put_vi64(buf, v);
        }
        if let Some(v) = &self.track_namespace_prefix {
            ty(buf, kind::TRACK_NAMESPACE_PREFIX);
            v.encode(buf);
        }
    }

    /// Drops the parameters `allowed` does not list (for values translated
    /// from another draft, where a message may carry parameters draft 18
    /// does not allow in it).
    pub fn retain(&mut self, allowed: Allowed) {
        let keep = |k: u64| allowed.contains(k);
        if !keep(kind::OBJECT_DELIVERY_TIMEOUT) {
            self.object_delivery_timeout = None;
        }
        if !keep(kind::AUTHORIZATION_TOKEN) {
            self.authorization_tokens.clear();
        }
        if !keep(kind::RENDEZVOUS_TIMEOUT) {
            self.rendezvous_timeout = None;
        }
        if !keep(kind::SUBGROUP_DELIVERY_TIMEOUT) {
            self.subgroup_delivery_timeout = None;
        }
        if !keep(kind::EXPIRES) {
            self.expires = None;
        }
        if !keep(kind::LARGEST_OBJECT) {
            self.largest_object = None;
        }
        if !keep(kind::FILL_TIMEOUT) {
            self.fill_timeout = None;
        }
        if !keep(kind::FORWARD) {
            self.forward = None;
        }
        if !keep(kind::SUBSCRIBER_PRIORITY) {
            self.subscriber_priority = None;
        }
        if !keep(kind::SUBSCRIPTION_FILTER) {
            self.subscription_filter = None;
        }
        if !keep(kind::GROUP_ORDER) {
            self.group_order = None;
        }
        if !keep(kind::NEW_GROUP_REQUEST) {
            self.new_group_request = None;
        }
        if !keep(kind::TRACK_NAMESPACE_PREFIX) {
            self.track_namespace_prefix = None;
        }
    }

    /// Decodes a parameter block, rejecting unknown, disallowed and duplicate types.
    pub fn decode(buf: &mut &[u8], src: &Bytes, allowed: Allowed) -> Result<Self, DecodeError> {
        Self::decode_as(buf, src, allowed, ParamEncoding::Draft18)
    }

    /// [`Parameters::decode`], reading the values as `encoding` says.
    pub fn decode_as(
        buf: &mut &[u8],
        src: &Bytes,
        allowed: Allowed,
        encoding: ParamEncoding,
    ) -> Result<Self, DecodeError> {
        let kvp = encoding == ParamEncoding::Uint8AsVarint;
        let n = get_len(buf, MAX_PARAMS)?;
        let mut p = Parameters::default();
        let mut prev = 0u64;
        let mut seen = 0u128;
        for i in 0..n {
            let delta = get_vi64(buf)?;
            let k = prev
                .checked_add(delta)
                .ok_or(DecodeError::Invalid("parameter type overflow"))?;
            if i > 0 && delta == 0 && k != kind::AUTHORIZATION_TOKEN {
                return Err(DecodeError::Invalid("duplicate parameter"));
            }
            prev = k;
            if !allowed.contains(k) {
                return Err(if k < 128 && Allowed::of(ALL_KINDS).contains(k) {
                    DecodeError::Invalid("parameter not allowed in this message")
                } else {
                    DecodeError::UnknownParameter(k)
                });
            }
            if k < 128 && k != kind::AUTHORIZATION_TOKEN && seen & (1 << k) != 0 {
                return Err(DecodeError::Invalid("duplicate parameter"));
            }
            seen |= 1u128 << k;
            match k {
                kind::OBJECT_DELIVERY_TIMEOUT => p.object_delivery_timeout = Some(get_vi64(buf)?),
                kind::AUTHORIZATION_TOKEN => {
                    let t = get_lp_bytes(buf, MAX_TOKEN)?;
                    p.authorization_tokens.push(slice_of(src, t));
                }
                kind::RENDEZVOUS_TIMEOUT => p.rendezvous_timeout = Some(get_vi64(buf)?),
                kind::SUBGROUP_DELIVERY_TIMEOUT => {
                    p.subgroup_delivery_timeout = Some(get_vi64(buf)?)
                }
                kind::EXPIRES => p.expires = Some(get_vi64(buf)?),
                kind::LARGEST_OBJECT => p.largest_object = Some(Location::decode(buf)?),
                kind::FILL_TIMEOUT => p.fill_timeout = Some(get_vi64(buf)?),
                kind::FORWARD => {
                    let v = if kvp {
                        get_vi64(buf)?
                    } else {
                        get_u8(buf)?.into()
                    };
                    p.forward = Some(match v {
                        0 => false,
                        1 => true,
                        _ => return Err(DecodeError::Invalid("forward")),
                    })
                }
                kind::SUBSCRIBER_PRIORITY if kvp => {
                    p.subscriber_priority = Some(
                        u8::try_from(get_vi64(buf)?)
                            .map_err(|_| DecodeError::Invalid("subscriber priority"))?,
                    )
                }
                kind::SUBSCRIBER_PRIORITY => p.subscriber_priority = Some(get_u8(buf)?),
                kind::SUBSCRIPTION_FILTER => {
                    let mut body = get_lp_bytes(buf, 64)?;
                    let f = SubscriptionFilter::decode(&mut body)?;
                    if !body.is_empty() {
                        return Err(DecodeError::Invalid("trailing bytes in filter"));
                    }
                    p.subscription_filter = Some(f);
                }
                kind::GROUP_ORDER if kvp => {
                    let v = u8::try_from(get_vi64(buf)?)
                        .map_err(|_| DecodeError::Invalid("group order"))?;
                    p.group_order = Some(GroupOrder::from_u8(v)?)
                }
                kind::GROUP_ORDER => p.group_order = Some(GroupOrder::from_u8(get_u8(buf)?)?),
                kind::NEW_GROUP_REQUEST => p.new_group_request = Some(get_vi64(buf)?),
                kind::TRACK_NAMESPACE_PREFIX => {
                    p.track_namespace_prefix = Some(TrackNamespace::decode(buf, src)?)
                }
                other => return Err(DecodeError::UnknownParameter(other)),
            }
        }
        Ok(p)
    }
}

/// How a peer wrote the values of its Message Parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParamEncoding {
    /// Draft 18: each type has its own encoding (uint8, vi64, Location,
    /// length-prefixed bytes, tuple).
    #[default]
    Draft18,
    /// Draft 18, except that the uint8 parameters (FORWARD,
    /// SUBSCRIBER_PRIORITY, GROUP_ORDER) are vi64s, as `@moq/net` 0.2.8
    /// writes every even-typed parameter. Only for decoding a message that
    /// fails as draft 18
    /// ([`crate::deviation::Deviation::Uint8ParametersAsVarints`]).
    Uint8AsVarint,
}

const ALL_KINDS: &[u64] = &[
    kind::OBJECT_DELIVERY_TIMEOUT,
    kind::AUTHORIZATION_TOKEN,
    kind::RENDEZVOUS_TIMEOUT,
    kind::SUBGROUP_DELIVERY_TIMEOUT,
    kind::EXPIRES,
    kind::LARGEST_OBJECT,
    kind::FILL_TIMEOUT,
    kind::FORWARD,
    kind::SUBSCRIBER_PRIORITY,
    kind::SUBSCRIPTION_FILTER,
    kind::GROUP_ORDER,
    kind::NEW_GROUP_REQUEST,
    kind::TRACK_NAMESPACE_PREFIX,
];

/// Parameter sets each message accepts (from each parameter's "MAY appear in").
#[allow(missing_docs)]
pub mod allowed {
    use super::kind::*;
    use super::Allowed;

    pub const SUBSCRIBE: Allowed = Allowed::of(&[
        OBJECT_DELIVERY_TIMEOUT,
        AUTHORIZATION_TOKEN,
        RENDEZVOUS_TIMEOUT,
        SUBGROUP_DELIVERY_TIMEOUT,
        FORWARD,
        SUBSCRIBER_PRIORITY,
        SUBSCRIPTION_FILTER,
        GROUP_ORDER,
        NEW_GROUP_REQUEST,
    ]);
    pub const SUBSCRIBE_OK: Allowed = Allowed::of(&[EXPIRES, LARGEST_OBJECT]);
    pub const PUBLISH: Allowed =
        Allowed::of(&[AUTHORIZATION_TOKEN, EXPIRES, LARGEST_OBJECT, FORWARD]);
    /// PUBLISH_OK (type 0x1E): the parameters whose definition lists PUBLISH_OK.
    pub const PUBLISH_OK: Allowed = Allowed::of(&[
        OBJECT_DELIVERY_TIMEOUT,
        SUBGROUP_DELIVERY_TIMEOUT,
        EXPIRES,
        FORWARD,
        SUBSCRIBER_PRIORITY,
        SUBSCRIPTION_FILTER,
        GROUP_ORDER,
        NEW_GROUP_REQUEST,
    ]);
    /// REQUEST_OK (type 0x7) carries the union of PUBLISH_OK, REQUEST_UPDATE_OK and
    /// TRACK_STATUS_OK, since the codec cannot tell which request it answers.
    pub const REQUEST_OK: Allowed = Allowed::of(&[
        OBJECT_DELIVERY_TIMEOUT,
        SUBGROUP_DELIVERY_TIMEOUT,
        EXPIRES,
        LARGEST_OBJECT,
        FORWARD,
        SUBSCRIBER_PRIORITY,
        SUBSCRIPTION_FILTER,
        GROUP_ORDER,
        NEW_GROUP_REQUEST,
    ]);
    /// REQUEST_UPDATE. EXPIRES is not here: its definition lists REQUEST_UPDATE_OK
    /// (a REQUEST_OK), not REQUEST_UPDATE.
    pub const REQUEST_UPDATE: Allowed = Allowed::of(&[
        OBJECT_DELIVERY_TIMEOUT,
        AUTHORIZATION_TOKEN,
        SUBGROUP_DELIVERY_TIMEOUT,
        FORWARD,
        SUBSCRIBER_PRIORITY,
        SUBSCRIPTION_FILTER,
        NEW_GROUP_REQUEST,
        TRACK_NAMESPACE_PREFIX,
    ]);
    pub const FETCH: Allowed = Allowed::of(&[
        AUTHORIZATION_TOKEN,
        FILL_TIMEOUT,
        SUBSCRIBER_PRIORITY,
        GROUP_ORDER,
    ]);
    pub const FETCH_OK: Allowed = Allowed::of(&[]);
    pub const TRACK_STATUS: Allowed = Allowed::of(&[AUTHORIZATION_TOKEN, RENDEZVOUS_TIMEOUT]);
    pub const PUBLISH_NAMESPACE: Allowed = Allowed::of(&[AUTHORIZATION_TOKEN]);
    pub const SUBSCRIBE_NAMESPACE: Allowed = Allowed::of(&[AUTHORIZATION_TOKEN]);
    pub const SUBSCRIBE_TRACKS: Allowed = Allowed::of(&[AUTHORIZATION_TOKEN, FORWARD]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_all() {
        let p = Parameters {
            object_delivery_timeout: Some(100),
            authorization_tokens: vec![Bytes::from_static(b"\x03\x00tok")],
            subgroup_delivery_timeout: Some(2000),
            forward: Some(false),
            subscriber_priority: Some(7),
            subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
                start: Location::new(5, 1),
                end_group_delta: 3,
            }),
            group_order: Some(GroupOrder::Descending),
            new_group_request: Some(0),
            rendezvous_timeout: Some(500),
            ..Default::default()
        };
        let mut b = Vec::new();
        p.encode(&mut b);
        let src = Bytes::from(b);
        let mut s = &src[..];
        assert_eq!(
            Parameters::decode(&mut s, &src, allowed::SUBSCRIBE).unwrap(),
            p
        );
        assert!(s.is_empty());
    }

    #[test]
    fn rejects_unknown_and_disallowed() {
        // One parameter, type 0x0C (unknown).
        let src = Bytes::from_static(&[1, 0x0c, 0]);
        assert_eq!(
            Parameters::decode(&mut &src[..], &src, allowed::SUBSCRIBE),
            Err(DecodeError::UnknownParameter(0x0c))
        );
        // FILL_TIMEOUT is known but not allowed in SUBSCRIBE.
        let src = Bytes::from_static(&[1, 0x0a, 5]);
        assert!(matches!(
            Parameters::decode(&mut &src[..], &src, allowed::SUBSCRIBE),
            Err(DecodeError::Invalid(_))
        ));
        // FORWARD=2 is out of range.
        let src = Bytes::from_static(&[1, 0x10, 2]);
        assert!(Parameters::decode(&mut &src[..], &src, allowed::SUBSCRIBE).is_err());
    }

    #[test]
    fn filter_start() {
        let l = Some(Location::new(4, 9));
        assert_eq!(
            SubscriptionFilter::NextGroupStart.start(l),
            Location::new(5, 0)
        );
        assert_eq!(
            SubscriptionFilter::LargestObject.start(l),
            Location::new(4, 10)
        );
        assert_eq!(
            SubscriptionFilter::LargestObject.start(None),
            Location::new(0, 0)
        );
    }
}
