//! # quichub-client
//!
//! An async MoQT (draft-18) client session: connect by URL, publish tracks
//! (announced with PUBLISH_NAMESPACE and served on SUBSCRIBE, or pushed with
//! PUBLISH), subscribe, fetch. Used by `quichub pub`, `quichub sub`, the demo,
//! the interop client and the benchmarks. The wire format is [`moqt`]'s; this
//! crate only moves bytes.
//!
//! [`media`] publishes and plays real media broadcasts (fMP4/MPEG-TS in,
//! fMP4 out) over such a session, with `quichub-media`'s packaging.
#![warn(missing_docs)]

pub mod media;
mod namespace;
mod publish;
mod session;
pub mod shape;
mod subscribe;
pub mod synth;
mod token;

pub use namespace::NamespaceSubscription;
pub use publish::{LocalTrack, SubgroupWriter, TrackMode};
pub use session::{ClientSession, ConnectOptions, NamespaceHandle};
pub use shape::{ShapeConfig, ShapeStats, Shaper};
pub use subscribe::{
    FetchResult, ReceivedObject, SubscribeOptions, Subscription, SubscriptionEvent, DONE_GRACE,
};

pub use quichub_net::tls::Verify;
pub use token::{refuse_unverified_token, verify_from, with_jwt};
