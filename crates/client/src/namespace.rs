//! SUBSCRIBE_NAMESPACE, SUBSCRIBE_TRACKS and TRACK_STATUS from the client side.

use anyhow::bail;
use moqt::message::{Message, NamespaceRequest, RequestOk, RequestUpdate, Subscribe};
use moqt::{FullTrackName, Parameters, TrackNamespace};
use quichub_net::io::{write_message, MessageReader};
use quichub_net::SendStream;

use crate::session::ClientSession;
use crate::subscribe::Subscription;

/// An established SUBSCRIBE_NAMESPACE or SUBSCRIBE_TRACKS.
pub struct NamespaceSubscription {
    send: SendStream,
    reader: MessageReader,
    session: ClientSession,
}

impl NamespaceSubscription {
    /// The next NAMESPACE or NAMESPACE_DONE (or PUBLISH_BLOCKED); `None` when
    /// the stream ends.
    pub async fn next(&mut self) -> Option<Message> {
        self.reader.next().await.ok()
    }

    /// Moves the request to another prefix (REQUEST_UPDATE with
    /// TRACK_NAMESPACE_PREFIX, wider or narrower). The answer (REQUEST_OK,
    /// or REQUEST_ERROR, which ends the request) comes through
    /// [`Self::next`], before the announcements relative to the new prefix.
    pub async fn update_prefix(&mut self, prefix: TrackNamespace) -> anyhow::Result<()> {
        let m = Message::RequestUpdate(RequestUpdate {
            request_id: self.session.next_request_id(),
            params: Parameters {
                track_namespace_prefix: Some(prefix),
                ..Parameters::default()
            },
        });
        write_message(&mut self.send, &m).await
    }

    /// Cancels the subscription.
    pub fn cancel(mut self) {
        let _ = self.send.reset(moqt::error::reset::CANCELLED);
        self.reader.stop(moqt::error::reset::CANCELLED);
    }
}

impl ClientSession {
    async fn namespace_request(
        &self,
        tracks: bool,
        prefix: TrackNamespace,
        params: Parameters,
    ) -> anyhow::Result<NamespaceSubscription> {
        let (mut send, recv) = self.inner.session.open_bi().await?;
        let m = NamespaceRequest {
            request_id: self.next_request_id(),
            namespace: prefix,
            params,
        };
        let msg = if tracks {
            Message::SubscribeTracks(m)
        } else {
            Message::SubscribeNamespace(m)
        };
        write_message(&mut send, &msg).await?;
        let mut reader = MessageReader::new(recv, &[]);
        match reader.next().await? {
            Message::RequestOk(_) => Ok(NamespaceSubscription {
                send,
                reader,
                session: self.clone(),
            }),
            Message::RequestError(e) => bail!(
                "{} refused: {} {}",
                msg.name(),
                moqt::error::request_error::describe(e.code),
                String::from_utf8_lossy(&e.reason)
            ),
            other => bail!("unexpected {} in reply to {}", other.name(), msg.name()),
        }
    }

    /// SUBSCRIBE_NAMESPACE: namespaces under `prefix`, now and later.
    pub async fn subscribe_namespace(
        &self,
        prefix: TrackNamespace,
    ) -> anyhow::Result<NamespaceSubscription> {
        self.namespace_request(false, prefix, Parameters::default())
            .await
    }

    /// SUBSCRIBE_TRACKS: the relay PUBLISHes every track under `prefix` to us;
    /// take them with [`ClientSession::next_publish`].
    pub async fn subscribe_tracks(
        &self,
        prefix: TrackNamespace,
        forward: bool,
    ) -> anyhow::Result<NamespaceSubscription> {
        let params = Parameters {
            forward: (!forward).then_some(false),
            ..Default::default()
        };
        self.namespace_request(true, prefix, params).await
    }

    /// The next track the relay PUBLISHed to us (after SUBSCRIBE_TRACKS).
    pub async fn next_publish(&self) -> Option<(FullTrackName, Subscription)> {
        let mut rx = self.inner.publishes.lock().await;
        rx.recv().await
    }

    /// TRACK_STATUS: the REQUEST_OK (with LARGEST_OBJECT) or an error.
    pub async fn track_status(&self, track: FullTrackName) -> anyhow::Result<RequestOk> {
        let (mut send, recv) = self.inner.session.open_bi().await?;
        let msg = Message::TrackStatus(Subscribe {
            request_id: self.next_request_id(),
            track,
            params: Parameters::default(),
        });
        write_message(&mut send, &msg).await?;
        let mut reader = MessageReader::new(recv, &[]);
        match reader.next().await? {
            Message::RequestOk(ok) => Ok(ok),
            Message::RequestError(e) => bail!(
                "TRACK_STATUS refused: {} {}",
                moqt::error::request_error::describe(e.code),
                String::from_utf8_lossy(&e.reason)
            ),
            other => bail!("unexpected {} in reply to TRACK_STATUS", other.name()),
        }
    }
}
