//! # quichub-auth
//!
//! Who a peer is and what it may do, for every protocol quichub speaks.
//! Sans-IO: files are read when an [`Auth`] is built (and rebuilt on reload),
//! never on a request's path; time is passed in.
//!
//! - [`jwt`]: moq-token compatible JWTs (keys, verification, signing).
//! - [`passwd`]: mosquitto `password_file`.
//! - [`acl`]: mosquitto `acl_file`.
//! - [`Auth`] turns credentials into an [`Identity`], whose `may_*` methods
//!   answer every authorisation question with one model for MoQT namespaces
//!   and MQTT topics (an MQTT topic `a/b/c` is the MoQT track
//!   ((`mqtt`, `a`, `b`), `c`), see [`path`]).
#![warn(missing_docs)]

pub mod acl;
mod auth;
pub mod config;
mod error;
pub mod jwt;
pub mod passwd;
pub mod path;
mod shared;

pub use auth::{Auth, Identity, Method, JWT_USERNAME};
pub use config::AuthConfig;
pub use error::AuthError;
pub use shared::{AuthMetrics, SharedAuth};

/// What a request does with a track or topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Receive: SUBSCRIBE, FETCH, TRACK_STATUS, SUBSCRIBE_NAMESPACE,
    /// SUBSCRIBE_TRACKS, MQTT SUBSCRIBE and delivery, HTTP GET.
    Read,
    /// Send: PUBLISH, PUBLISH_NAMESPACE, MQTT PUBLISH, HTTP POST.
    Write,
}
