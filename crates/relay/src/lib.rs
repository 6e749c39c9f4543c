//! # quichub-relay
//!
//! The routing core of quichub. Publishers announce namespaces or publish
//! tracks; subscribers subscribe; the relay keeps one upstream subscription per
//! track however many subscribers there are, stores each object once
//! (`bytes::Bytes`) and fans it out to every subscriber without copying the
//! payload. A bounded broadcast ring per track decouples subscribers: one that
//! cannot keep up loses old objects (and, past a limit, its subscription with
//! TOO_FAR_BEHIND); it never slows the publisher or the others.
//!
//! Modules:
//! - [`access`]: the authorisation hooks (who may do what, per session and request).
//! - [`config`]: limits and defaults.
//! - [`object`]: objects and track events as they flow through the relay.
//! - [`track`]: per-track state: fan-out ring, cache of recent groups, largest location.
//! - [`core`]: the registry of namespaces, tracks and namespace subscriptions.
//! - `session` (private): one MoQT session (either role) speaking to the core,
//!   split by concern: ingest, upstream, subscribe, fetch, namespace, publish.
//! - `forward` (private): delivery of one subscription's objects to one session.
//! - [`origin`]: relay to relay: following another relay's namespaces over MoQT.
//! - [`cluster`]: what a cluster registry does for the relay (namespace claims, peers).
//! - [`sink`]: direct fan-out of datagram objects.
//! - [`fanout`]: fan-out across endpoint shards, at most one hand-off per object per shard.
//! - [`metrics`]: counters and their Prometheus rendering.
#![warn(missing_docs)]

pub mod access;
pub mod cluster;
pub mod config;
pub mod core;
pub mod endpoint;
mod fanout;
mod forward;
pub mod metrics;
pub mod object;
pub mod origin;
mod session;
pub mod sink;
pub mod tokens;
pub mod track;
mod upstream_fetch;

pub use crate::config::Config;
pub use crate::core::Relay;
