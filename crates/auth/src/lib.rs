//! # quichub-auth
//!
//! Who a peer is and what it may do, for every protocol quichub speaks.
//! Sans-IO: files are read when an [`Auth`] is built (and rebuilt on reload),
//! never on a request's path; time is passed in.
#![warn(missing_docs)]

pub mod config;

pub use config::AuthConfig;
