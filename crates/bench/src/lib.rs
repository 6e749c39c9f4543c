//! # quichub-bench
//!
//! quichub's benchmarks, and the `quichub-bench` binary's command line
//! ([`Cli`]). Most of it is the relay benchmark of draft-evens-moq-bench-00
//! (Media over QUIC Relay Benchmark Methodology), whose pure parts have no
//! sockets, no async runtime and no clocks (times are passed in):
//!
//! - [`profile`]: config profiles in the draft's (and qperf's) INI format,
//!   namespace/name interpolation, the publishing schedule.
//! - [`message`]: START, DATA and COMPLETION (§5.4), with the publisher's
//!   send time inside DATA's `data`.
//! - [`metrics`]: the per-track receive state machine (§5.2) and Tables 2
//!   and 3 (§5.5), one-way latency, aggregation over many tracks.
//! - [`report`]: human table, JSON and CSV renderers.
//! - [`run`]: the network side: publisher and subscriber roles, the
//!   capacity search.
//!
//! The other benchmarks (`fanout`, `media`, `mqtt`, `conn`) are whole
//! programs behind [`Cli`].
//!
//! It benchmarks any MoQT relay: nothing here knows which relay is measured.
#![warn(missing_docs)]

mod cli;
mod cpu;
pub mod message;
pub mod metrics;
pub mod profile;
pub mod report;
pub mod run;

pub use cli::Cli;
pub use message::{BenchMessage, Completion, Data, MessageError, Start};
pub use metrics::{
    Aggregate, AggregateReport, LatencySummary, Outcome, TrackProgress, TrackReceiver, TrackReport,
    TrackState,
};
pub use profile::{Delivery, ObjectSlot, Profile, ProfileError, ProfileErrorKind, TrackProfile};
pub use report::BenchReport;
