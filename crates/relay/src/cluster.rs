//! What the relay asks of a cluster of relays (the `quichub-cluster` crate
//! runs the registry; the relay names no backend).
//!
//! - **Claims**: a namespace a publisher here announces with
//!   PUBLISH_NAMESPACE is claimed cluster-wide before it is accepted; the
//!   first relay to claim it holds it, and a publisher of the same namespace
//!   at another relay is refused (REQUEST_ERROR) until the holder lets go
//!   (its last publisher left, or the relay died and its registration
//!   expired). Sessions to other relays claim nothing.
//! - **Peers**: relays of a cluster follow each other over MoQT
//!   ([`crate::origin`]) with `cluster=peer` in their URL's query. Such a
//!   follower is told only of namespaces published *here*, never of those
//!   this relay learnt from another relay: every relay hears of a namespace
//!   from the one relay that holds it, so announcements cannot go round the
//!   mesh (loop prevention) and each track crosses one hop.

use moqt::message::RequestError;
use moqt::TrackNamespace;

use crate::core::BoxFuture;

/// A registry's namespace claims, as the relay uses them.
pub trait Claims: Send + Sync {
    /// Claims `ns` for this relay; `Err` is the REQUEST_ERROR the publisher
    /// gets (REDIRECT to the relay that holds it, or a retry later when the
    /// registry is unreachable).
    fn claim(&self, ns: &TrackNamespace) -> BoxFuture<Result<(), RequestError>>;

    /// Lets `ns` go: no publisher here holds it any more. Must not block.
    fn release(&self, ns: &TrackNamespace);
}

/// The track of a cluster member's MQTT messages, in the namespace
/// [`mqtt_namespace`]: each message published on the member (by MQTT or
/// HTTP clients) is one object, an MQTT 5 PUBLISH packet
/// (`quichub-gateway`'s `cluster` module). A reserved namespace (it starts
/// with `.`): no client may publish it, and only a session the relay's
/// authorizer lets read `.quichub` may subscribe to it.
pub const MQTT_TRACK: &str = "messages";

/// `.quichub/mqtt/<node id>`: where member `node_id` publishes
/// [`MQTT_TRACK`].
pub fn mqtt_namespace(node_id: &str) -> TrackNamespace {
    TrackNamespace::from_strs(&[".quichub", "mqtt", node_id])
}

/// `ns` is one of the relays' own (`.quichub/...`).
pub fn is_cluster_namespace(ns: &TrackNamespace) -> bool {
    ns.fields().first().is_some_and(|f| f == ".quichub")
}

/// The query a cluster peer adds to the URL it follows a relay at.
pub const PEER_QUERY: &str = "cluster=peer";

/// `path` (a CONNECT path or SETUP PATH, with its query) is a cluster peer's.
pub fn is_peer_path(path: &str) -> bool {
    path.split_once('?')
        .is_some_and(|(_, q)| q.split('&').any(|kv| kv == PEER_QUERY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_names_itself_in_the_query() {
        assert!(is_peer_path("/?cluster=peer"));
        assert!(is_peer_path("/moq?jwt=abc&cluster=peer"));
        assert!(!is_peer_path("/cluster=peer"));
        assert!(!is_peer_path("/?cluster=peers"));
        assert!(!is_peer_path("/?jwt=cluster=peer"));
    }
}
