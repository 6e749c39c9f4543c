//! `quichub-lab netem`: a user-space, packet-level link emulator.
//!
//! Two network namespaces (client side and server side) are joined through
//! TUN devices owned by the emulator process, which forwards every IP packet
//! after applying, per direction, delay, jitter (with or without reordering),
//! random loss, Gilbert–Elliott burst loss, a rate limit with a bounded
//! drop-tail queue, and duplication. Being packet level, TCP and UDP (QUIC)
//! see the same link; it is not a proxy.
//!
//! The crate has a pure part and a thin IO part:
//! - [`model`]: the sans-IO [`model::Link`] state machine (packets in with a
//!   timestamp, release times or drops out, seeded randomness);
//! - [`profile`]: named profiles (`nb-iot`, `5g`, `lte`, `wifi`, `satellite`,
//!   `lossy-N`) with their sources, and overrides from flags;
//! - [`units`]: parsing of durations, rates, sizes and percentages;
//! - [`emulator`] (Linux): namespaces, TUN devices and forwarding threads;
//! - [`privileges`] (Linux): what is needed and what is missing;
//! - [`cli`]: [`NetemArgs`] and [`main`], wired into the `quichub-lab` binary.

#![warn(missing_docs)]

pub mod model;
pub mod profile;
pub mod rng;
pub mod units;

#[cfg(target_os = "linux")]
pub mod emulator;
#[cfg(target_os = "linux")]
pub mod privileges;
#[cfg(target_os = "linux")]
pub mod sys;

pub mod cli;

pub use cli::{main, NetemArgs};
pub use model::{GilbertElliott, Link, LinkConfig, QueueLimit, Verdict};
pub use profile::Profile;
