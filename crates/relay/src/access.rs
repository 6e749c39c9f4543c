//! Authorisation hooks. The relay asks an [`Authorizer`] once per session, at
//! SETUP, for the session's [`SessionAccess`]; the session then asks that
//! object before each request it serves ([`Operation`]) and closes itself
//! when the access [expires](SessionAccess::expires).
//!
//! Credentials can also be revoked while a session is up (a reload of the
//! auth configuration): the session waits on [`SessionAccess::changes`] and
//! then asks [`SessionAccess::revalidate`] (an error closes the session) and
//! [`SessionAccess::still_allows`] for each of its open subscriptions (a
//! refusal ends that subscription with PUBLISH_DONE UNAUTHORIZED).
//!
//! The relay knows nothing of tokens or ACLs: an authorizer (the hub's, built
//! from the auth configuration) decides. Without one every session may do
//! everything ([`AllowAll`]), which is the relay's behaviour when no auth is
//! configured.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use moqt::session::SessionError;
use moqt::{FullTrackName, TrackNamespace};
use tokio::sync::watch;

use crate::core::Refusal;

/// What is known of a session when its SETUP arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectInfo {
    /// WebTransport: the CONNECT URL's path and query (`/moq?jwt=...`).
    /// Raw QUIC: the PATH setup option, if the client sent one (a PATH that is
    /// not UTF-8 counts as none).
    pub path: Option<String>,
    /// The peer's address.
    pub remote: SocketAddr,
    /// The AUTHORIZATION TOKEN setup option (the raw Token structure), if any.
    pub setup_token: Option<Bytes>,
}

/// A request a session asks to make, as the authorizer sees it: the message
/// kind, what it names and the AUTHORIZATION_TOKEN parameters it carried (raw
/// Token structures, in order; empty when none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation<'a> {
    /// PUBLISH_NAMESPACE: the session offers every track under `namespace`.
    PublishNamespace {
        /// The namespace published.
        namespace: &'a TrackNamespace,
        /// AUTHORIZATION_TOKEN values.
        tokens: &'a [Bytes],
    },
    /// PUBLISH: the session pushes one track.
    Publish {
        /// The track pushed.
        track: &'a FullTrackName,
        /// AUTHORIZATION_TOKEN values.
        tokens: &'a [Bytes],
    },
    /// SUBSCRIBE to one track.
    Subscribe {
        /// The track subscribed to.
        track: &'a FullTrackName,
        /// AUTHORIZATION_TOKEN values.
        tokens: &'a [Bytes],
    },
    /// SUBSCRIBE_NAMESPACE: announcements of namespaces under `prefix`.
    SubscribeNamespace {
        /// The namespace prefix.
        prefix: &'a TrackNamespace,
        /// AUTHORIZATION_TOKEN values.
        tokens: &'a [Bytes],
    },
    /// SUBSCRIBE_TRACKS: every track published under `prefix`, pushed to the
    /// session with PUBLISH.
    SubscribeTracks {
        /// The namespace prefix.
        prefix: &'a TrackNamespace,
        /// AUTHORIZATION_TOKEN values.
        tokens: &'a [Bytes],
    },
    /// FETCH: a standalone fetch's track, or for a joining fetch the track of
    /// the subscription it joins.
    Fetch {
        /// The track fetched from.
        track: &'a FullTrackName,
        /// AUTHORIZATION_TOKEN values.
        tokens: &'a [Bytes],
    },
    /// TRACK_STATUS of one track.
    TrackStatus {
        /// The track asked about.
        track: &'a FullTrackName,
        /// AUTHORIZATION_TOKEN values.
        tokens: &'a [Bytes],
    },
}

impl<'a> Operation<'a> {
    /// The namespace named: the track's namespace, or the namespace (prefix)
    /// of a namespace-level request.
    pub fn namespace(&self) -> &'a TrackNamespace {
        match *self {
            Operation::PublishNamespace { namespace, .. } => namespace,
            Operation::SubscribeNamespace { prefix, .. }
            | Operation::SubscribeTracks { prefix, .. } => prefix,
            Operation::Publish { track, .. }
            | Operation::Subscribe { track, .. }
            | Operation::Fetch { track, .. }
            | Operation::TrackStatus { track, .. } => &track.namespace,
        }
    }

    /// The track name for a track-level request; `None` for a namespace-level
    /// one (which covers every track under its namespace).
    pub fn track_name(&self) -> Option<&'a [u8]> {
        match *self {
            Operation::Publish { track, .. }
            | Operation::Subscribe { track, .. }
            | Operation::Fetch { track, .. }
            | Operation::TrackStatus { track, .. } => Some(&track.name[..]),
            _ => None,
        }
    }

    /// The request's AUTHORIZATION_TOKEN parameter values.
    pub fn tokens(&self) -> &'a [Bytes] {
        match *self {
            Operation::PublishNamespace { tokens, .. }
            | Operation::Publish { tokens, .. }
            | Operation::Subscribe { tokens, .. }
            | Operation::SubscribeNamespace { tokens, .. }
            | Operation::SubscribeTracks { tokens, .. }
            | Operation::Fetch { tokens, .. }
            | Operation::TrackStatus { tokens, .. } => tokens,
        }
    }

    /// Whether the request publishes (PUBLISH, PUBLISH_NAMESPACE); every other
    /// kind reads.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Operation::PublishNamespace { .. } | Operation::Publish { .. }
        )
    }
}

/// Why a request may not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// Refuse this request (REQUEST_ERROR); the session goes on.
    Request(Refusal),
    /// Close the session (e.g. a token alias registered twice).
    Session(SessionError),
}

impl From<Refusal> for Denied {
    fn from(r: Refusal) -> Self {
        Denied::Request(r)
    }
}

/// One session's permissions, made by an [`Authorizer`] at SETUP.
pub trait SessionAccess: Send + Sync {
    /// Allows `op` or refuses it; a refusal is answered with REQUEST_ERROR
    /// carrying the refusal's code (normally
    /// [`request_error::UNAUTHORIZED`](moqt::error::request_error::UNAUTHORIZED))
    /// and reason, and affects no other request.
    fn authorize(&self, op: &Operation<'_>) -> Result<(), Denied>;

    /// When the session's credentials stop being valid: the session is closed
    /// with EXPIRED_AUTH_TOKEN then. `None`: never. Asked once, at SETUP.
    fn expires(&self) -> Option<SystemTime> {
        None
    }

    /// Changes of what grants access (the auth configuration reloaded): the
    /// session then calls [`revalidate`](Self::revalidate) and
    /// [`still_allows`](Self::still_allows) at once, even while it is idle.
    /// `None` (the default): access never changes. Asked once, at SETUP; a
    /// change after [`Authorizer::connect`] and before this call must still
    /// show as a change of the receiver returned.
    fn changes(&self) -> Option<watch::Receiver<u64>> {
        None
    }

    /// After a [change](Self::changes): whether the session's own
    /// credentials still admit it. An error closes the session with it
    /// (normally UNAUTHORIZED).
    fn revalidate(&self) -> Result<(), SessionError> {
        Ok(())
    }

    /// After a [change](Self::changes) the session passed
    /// [`revalidate`](Self::revalidate): whether `op`, allowed earlier and
    /// still being served (an open subscription), is still allowed. Unlike
    /// [`authorize`](Self::authorize) this changes nothing (the request's
    /// token aliases were registered already) and counts nothing. `false`
    /// ends that request only.
    fn still_allows(&self, _op: &Operation<'_>) -> bool {
        true
    }

    /// When `op`, just allowed, stops being allowed by the credentials that
    /// allowed it: the expiry of the request's own token when only that
    /// token allowed it (the session's own expiry ends the whole session
    /// and is not repeated here). `None`: never. Asked when a subscription
    /// starts being served; it ends then.
    fn request_expires(&self, _op: &Operation<'_>) -> Option<SystemTime> {
        None
    }

    /// Whether the session proved to be another relay of this relay's
    /// cluster (the cluster token's identity): only such a session, and
    /// only when it also says it is a peer (`cluster=peer`), is shown and
    /// served the relays' own namespaces (`.quichub/...`,
    /// [`crate::cluster`]). Asked once, at SETUP. Default: no.
    fn cluster_member(&self) -> bool {
        false
    }
}

/// The access of a session the relay opened towards an origin relay: the
/// origin is a source. It may push tracks (PUBLISH, for the SUBSCRIBE_TRACKS
/// this relay sent it); every other request it makes is refused.
pub(crate) struct FromOrigin;

impl SessionAccess for FromOrigin {
    fn authorize(&self, op: &Operation<'_>) -> Result<(), Denied> {
        match op {
            Operation::Publish { .. } => Ok(()),
            _ => Err(Denied::Request(Refusal::new(
                moqt::error::request_error::UNAUTHORIZED,
                "an origin relay may not make requests of its follower",
            ))),
        }
    }
}

/// Decides, per session, what it may do.
pub trait Authorizer: Send + Sync {
    /// The access of a session whose SETUP just arrived, or the session error
    /// to close it with (for example UNAUTHORIZED, MALFORMED_AUTH_TOKEN or
    /// EXPIRED_AUTH_TOKEN).
    fn connect(&self, info: &ConnectInfo) -> Result<Arc<dyn SessionAccess>, SessionError>;

    /// The MAX_AUTH_TOKEN_CACHE_SIZE the relay advertises in its SETUP: the
    /// bytes of token aliases a session may register (0, the draft's
    /// default, forbids aliases).
    fn max_token_cache(&self) -> u64 {
        0
    }
}

/// Every session may do everything: the relay without auth.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl SessionAccess for AllowAll {
    fn authorize(&self, _op: &Operation<'_>) -> Result<(), Denied> {
        Ok(())
    }

    /// Without auth there is no identity to prove: a peer is whoever says
    /// so, and may read everything anyway.
    fn cluster_member(&self) -> bool {
        true
    }
}

impl Authorizer for AllowAll {
    fn connect(&self, _info: &ConnectInfo) -> Result<Arc<dyn SessionAccess>, SessionError> {
        Ok(Arc::new(AllowAll))
    }
}

#[cfg(test)]
mod origin_tests {
    use super::*;

    #[test]
    fn an_origin_may_not_make_requests() {
        let ns = moqt::TrackNamespace::from_path("live");
        let op = Operation::PublishNamespace {
            namespace: &ns,
            tokens: &[],
        };
        match FromOrigin.authorize(&op) {
            Err(Denied::Request(r)) => {
                assert_eq!(r.code, moqt::error::request_error::UNAUTHORIZED)
            }
            _ => panic!("allowed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_namespace_track_and_tokens() {
        let track = FullTrackName::new("live/demo", "video");
        let tokens = [Bytes::from_static(b"\x03\x00t")];
        let sub = Operation::Subscribe {
            track: &track,
            tokens: &tokens,
        };
        assert_eq!(sub.namespace(), &track.namespace);
        assert_eq!(sub.track_name(), Some(&b"video"[..]));
        assert_eq!(sub.tokens(), &tokens);
        assert!(!sub.is_write());

        let ns = TrackNamespace::from_path("live");
        let pn = Operation::PublishNamespace {
            namespace: &ns,
            tokens: &[],
        };
        assert_eq!(pn.namespace(), &ns);
        assert_eq!(pn.track_name(), None);
        assert!(pn.tokens().is_empty());
        assert!(pn.is_write());
        assert!(Operation::Publish {
            track: &track,
            tokens: &[]
        }
        .is_write());
        assert!(!Operation::SubscribeTracks {
            prefix: &ns,
            tokens: &[]
        }
        .is_write());
    }

    #[test]
    fn allow_all_allows_and_never_expires() {
        let info = ConnectInfo {
            path: None,
            remote: "127.0.0.1:1".parse().unwrap(),
            setup_token: None,
        };
        let access = AllowAll.connect(&info).unwrap();
        let ns = TrackNamespace::from_path("anything");
        assert!(access
            .authorize(&Operation::SubscribeNamespace {
                prefix: &ns,
                tokens: &[]
            })
            .is_ok());
        assert_eq!(access.expires(), None);
        assert!(access.changes().is_none());
        assert_eq!(access.revalidate(), Ok(()));
    }
}
