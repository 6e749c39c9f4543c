//! Session setup and the tasks that route incoming streams and datagrams.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use moqt::coding::get_vi64;
use moqt::data::StreamType;
use moqt::message::{GoAway, Message, NamespaceRequest, RequestOk, Setup, Subscribe, SubscribeOk};
use moqt::session::{make_setup, ControlState, RequestIds, Role};
use moqt::{DecodeError, FullTrackName, Parameters, TrackNamespace};
use quichub_net::client::Client;
use quichub_net::io::{read_prefix, read_prefix_after, write_message, MessageReader, ReadError};
use quichub_net::tls::Verify;
use quichub_net::Transport;
use quichub_net::{RecvStream, SendStream, Session};
use tokio::sync::{mpsc, oneshot, watch};
use url::Url;

use crate::publish::LocalTrack;
use crate::subscribe::{self, SubscriptionEvent};

/// How to connect.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Certificate check.
    pub verify: Verify,
    /// Local UDP address to bind.
    pub bind: SocketAddr,
    /// How long to wait for the handshake and the server's SETUP.
    pub timeout: Duration,
    /// A client endpoint (one UDP socket) to share among many sessions, as a
    /// load generator does; `None` binds a new one at `bind`.
    pub endpoint: Option<Client>,
    /// Speak an older draft to the server (`moqt://` and `https://` only):
    /// the session goes through the translating bridge of
    /// [`quichub_net::legacy`], so everything here stays draft 18.
    pub draft: Option<moqt::legacy::Draft>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            verify: Verify::Insecure,
            bind: "0.0.0.0:0".parse().expect("valid"),
            timeout: Duration::from_secs(5),
            endpoint: None,
            draft: None,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) session: Session,
    pub(crate) ids: Mutex<RequestIds>,
    /// Our control stream: held open for the session's life (closing it is a
    /// protocol violation).
    #[allow(dead_code)]
    pub(crate) control: tokio::sync::Mutex<SendStream>,
    pub(crate) peer_setup: watch::Sender<Option<Setup>>,
    pub(crate) goaway: watch::Sender<Option<GoAway>>,
    /// Subscriptions by the Track Alias the publisher gave us.
    pub(crate) aliases: quichub_net::alias::AliasTable<mpsc::UnboundedSender<SubscriptionEvent>>,
    /// Pending FETCHes by Request ID, waiting for their data stream.
    pub(crate) fetches: Mutex<HashMap<u64, oneshot::Sender<(RecvStream, Bytes)>>>,
    /// Tracks we publish, by name.
    pub(crate) tracks: Mutex<HashMap<FullTrackName, Arc<LocalTrack>>>,
    pub(crate) next_alias: AtomicU64,
    /// Tracks the relay PUBLISHed to us, waiting for the application.
    pub(crate) publishes_tx: mpsc::UnboundedSender<(FullTrackName, crate::Subscription)>,
    pub(crate) publishes:
        tokio::sync::Mutex<mpsc::UnboundedReceiver<(FullTrackName, crate::Subscription)>>,
    pub(crate) transport: Transport,
    pub(crate) max_object: usize,
    pub(crate) endpoint: Client,
    pub(crate) own_endpoint: bool,
}

/// A MoQT session from the client side.
#[derive(Clone)]
pub struct ClientSession {
    pub(crate) inner: Arc<Inner>,
}

impl ClientSession {
    /// Connects to `url` (`moqt://` raw QUIC, `https://` WebTransport) and
    /// completes the SETUP exchange.
    pub async fn connect(url: &str, opts: ConnectOptions) -> anyhow::Result<Self> {
        let url = Url::parse(url).with_context(|| format!("bad URL {url:?}"))?;
        let endpoint = match &opts.endpoint {
            Some(e) => e.clone(),
            None => Client::new(opts.bind, opts.verify.clone())?,
        };
        let connected =
            tokio::time::timeout(opts.timeout, endpoint.connect_draft(&url, opts.draft))
                .await
                .with_context(|| {
                    let port = match url.port() {
                        Some(p) => p.to_string(),
                        None => "443: the URL names no port; `quichub relay` listens on 4443 \
                             unless told otherwise"
                            .to_string(),
                    };
                    format!(
                        "no answer from {url} within {} s (is a relay running there? port {port})",
                        opts.timeout.as_secs_f64()
                    )
                })??;
        let session = connected.session.clone();
        let mut control = session.open_uni().await.context("open control stream")?;
        let setup = if connected.transport == Transport::Quic {
            make_setup(
                IMPLEMENTATION,
                Some(&connected.authority),
                Some(&connected.path),
            )
        } else {
            make_setup(IMPLEMENTATION, None, None)
        };
        write_message(&mut control, &Message::Setup(setup)).await?;
        let (publishes_tx, publishes) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            session,
            ids: Mutex::new(RequestIds::new(Role::Client)),
            control: tokio::sync::Mutex::new(control),
            peer_setup: watch::channel(None).0,
            goaway: watch::channel(None).0,
            aliases: Default::default(),
            fetches: Mutex::default(),
            tracks: Mutex::default(),
            next_alias: AtomicU64::new(1),
            publishes_tx,
            publishes: tokio::sync::Mutex::new(publishes),
            transport: connected.transport,
            max_object: 16 * 1024 * 1024,
            endpoint,
            own_endpoint: opts.endpoint.is_none(),
        });
        spawn_routers(&inner);
        let mut rx = inner.peer_setup.subscribe();
        // A server that refuses us (full, or our SETUP was bad) closes the
        // session: say why at once rather than at the timeout.
        tokio::select! {
            biased;
            r = tokio::time::timeout(opts.timeout, rx.wait_for(|s| s.is_some())) => {
                r.context("no SETUP from the server")?
                    .context("session closed before SETUP")?;
            }
            e = inner.session.closed() => match describe_close(&e) {
                Some((_, why)) => bail!("the server closed the session: {why}"),
                None => bail!("the server closed the session: {e}"),
            },
        }
        Ok(Self { inner })
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// The transport session.
    pub fn session(&self) -> &Session {
        &self.inner.session
    }

    /// Raw QUIC or WebTransport.
    pub fn transport(&self) -> Transport {
        self.inner.transport
    }

    /// The server's SETUP.
    pub fn peer_setup(&self) -> Option<Setup> {
        self.inner.peer_setup.borrow().clone()
    }

    /// Resolves when the server sends GOAWAY.
    pub async fn goaway(&self) -> Option<GoAway> {
        let mut rx = self.inner.goaway.subscribe();
        rx.wait_for(|g| g.is_some())
            .await
            .ok()
            .and_then(|g| g.clone())
    }

    /// Allocates the next Request ID.
    pub fn next_request_id(&self) -> u64 {
        self.inner.ids.lock().expect("ids").next()
    }

    /// Announces a namespace; it stays published while the handle lives.
    pub async fn publish_namespace(
        &self,
        namespace: TrackNamespace,
    ) -> anyhow::Result<NamespaceHandle> {
        let (mut send, recv) = self.inner.session.open_bi().await?;
        let request_id = self.next_request_id();
        let msg = Message::PublishNamespace(NamespaceRequest {
            request_id,
            namespace: namespace.clone(),
            params: Parameters::default(),
        });
        write_message(&mut send, &msg).await?;
        let mut reader = MessageReader::new(recv, &[]);
        match reader.next().await {
            Ok(Message::RequestOk(_)) => Ok(NamespaceHandle {
                send,
                reader,
                namespace,
            }),
            Ok(Message::RequestError(e)) => bail!(
                "PUBLISH_NAMESPACE refused: {} {}",
                moqt::error::request_error::describe(e.code),
                String::from_utf8_lossy(&e.reason)
            ),
            Ok(other) => bail!("unexpected {} in reply to PUBLISH_NAMESPACE", other.name()),
            Err(e) => bail!("PUBLISH_NAMESPACE: {e}"),
        }
    }

    /// Closes the session.
    pub fn close(&self, code: u32, reason: &str) {
        self.inner.session.close(code, reason.as_bytes());
        if self.inner.own_endpoint {
            self.inner.endpoint.close();
        }
    }

    /// Closes the session and waits (at most a second) until the close has
    /// gone out, so the relay forgets the session, and the namespaces and
    /// tracks it published, at once instead of at its idle timeout. Call it
    /// before a process exits: a bare [`ClientSession::close`] queues the
    /// CONNECTION_CLOSE, and an exiting process may never send it.
    pub async fn shutdown(&self, code: u32, reason: &str) {
        self.inner.session.close(code, reason.as_bytes());
        if self.inner.own_endpoint {
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(1),
                self.inner.endpoint.wait_idle(),
            )
            .await;
            self.inner.endpoint.close();
        }
    }

    /// Resolves when the session is closed, with the reason.
    pub async fn closed(&self) -> quichub_net::mux::Error {
        self.inner.session.closed().await
    }

    /// Why the relay closed this session, if it has: the MoQT session error
    /// code and a description with its name and the relay's reason, e.g.
    /// `EXPIRED_AUTH_TOKEN (0x18): authorization expired`. `None` while
    /// open, or when it ended otherwise (closed here, timed out).
    pub fn close_reason(&self) -> Option<(u32, String)> {
        describe_close(&self.inner.session.close_reason()?)
    }
}

/// The MoQT session error code of a close by the peer, and a description
/// with the code's name and the peer's reason.
fn describe_close(e: &quichub_net::mux::Error) -> Option<(u32, String)> {
    let (code, reason) = e.application_close()?;
    let name = moqt::SessionErrorCode::from_code(code).map_or("code", |c| c.name());
    Some((code, format!("{name} ({code:#x}): {reason}")))
}

/// A published namespace; dropping or [`NamespaceHandle::withdraw`] cancels it.
pub struct NamespaceHandle {
    send: SendStream,
    reader: MessageReader,
    /// The namespace.
    pub namespace: TrackNamespace,
}

impl NamespaceHandle {
    /// Withdraws the namespace by cancelling the request stream (§3.3.2).
    pub fn withdraw(mut self) {
        let _ = self.send.reset(moqt::error::reset::CANCELLED);
        self.reader.stop(moqt::error::reset::CANCELLED);
    }
}

/// Our MOQT_IMPLEMENTATION string.
pub const IMPLEMENTATION: &str = concat!("quichub-client/", env!("CARGO_PKG_VERSION"));

fn spawn_routers(inner: &Arc<Inner>) {
    let i = inner.clone();
    tokio::spawn(async move {
        while let Ok(stream) = i.session.accept_uni().await {
            let i = i.clone();
            tokio::spawn(async move {
                if let Err(e) = on_uni(&i, stream).await {
                    tracing::warn!("closing session: {e}");
                    i.session.close(
                        moqt::SessionErrorCode::ProtocolViolation.code(),
                        e.to_string().as_bytes(),
                    );
                }
            });
        }
    });
    let i = inner.clone();
    tokio::spawn(async move {
        while let Ok((send, recv)) = i.session.accept_bi().await {
            let i = i.clone();
            tokio::spawn(async move {
                if let Err(e) = on_bi(&i, send, recv).await {
                    tracing::warn!("request stream: {e}");
                }
            });
        }
    });
    let i = inner.clone();
    tokio::spawn(async move {
        while let Ok(d) = i.session.read_datagram().await {
            subscribe::on_datagram(&i, d);
        }
    });
}

async fn on_uni(inner: &Arc<Inner>, mut stream: RecvStream) -> anyhow::Result<()> {
    let (ty, rest) = match read_prefix(&mut stream, 16, get_vi64).await {
        Ok(v) => v,
        Err(ReadError::Finished) | Err(ReadError::Stream(_)) => return Ok(()),
        Err(e) => bail!("{e}"),
    };
    match StreamType::from_code(ty).map_err(|e: DecodeError| anyhow::anyhow!(e))? {
        StreamType::Control => {
            let mut prefix = BytesMut::new();
            moqt::coding::put_vi64(&mut prefix, ty);
            prefix.extend_from_slice(&rest);
            let mut reader = MessageReader::new(stream, &prefix);
            let mut state = ControlState::new();
            loop {
                let m = match reader.next().await {
                    Ok(m) => m,
                    Err(ReadError::Decode(e)) => bail!("control stream: {e}"),
                    Err(_) => return Ok(()),
                };
                state.on_control_message(&m)?;
                match m {
                    Message::Setup(s) => {
                        inner.peer_setup.send_replace(Some(s));
                    }
                    Message::GoAway(g) => {
                        inner.goaway.send_replace(Some(g));
                    }
                    _ => {}
                }
            }
        }
        StreamType::Subgroup(t) => subscribe::on_subgroup(inner, t, stream, rest).await,
        StreamType::Fetch => {
            let (id, rest) = match read_prefix_after(&mut stream, &rest, 16, get_vi64).await {
                Ok(v) => v,
                Err(ReadError::Decode(e)) => bail!("{e}"),
                Err(_) => return Ok(()),
            };
            let waiter = inner.fetches.lock().expect("fetches").remove(&id);
            match waiter {
                Some(tx) => {
                    let _ = tx.send((stream, rest));
                }
                None => {
                    let _ = stream.stop(moqt::error::reset::CANCELLED);
                }
            }
            Ok(())
        }
        StreamType::Padding => Ok(()),
    }
}

/// A request the relay opened towards us: a SUBSCRIBE for a track we publish
/// (after PUBLISH_NAMESPACE), a TRACK_STATUS, or a PUBLISH (after SUBSCRIBE_TRACKS).
async fn on_bi(inner: &Arc<Inner>, mut send: SendStream, recv: RecvStream) -> anyhow::Result<()> {
    let mut reader = MessageReader::new(recv, &[]);
    let first = reader.next().await?;
    match first {
        Message::Subscribe(m) => serve_subscribe(inner, send, reader, m).await,
        Message::TrackStatus(m) => {
            let track = inner.tracks.lock().expect("tracks").get(&m.track).cloned();
            match track {
                Some(t) => {
                    let ok = Message::RequestOk(RequestOk {
                        params: Parameters {
                            largest_object: t.largest(),
                            ..Default::default()
                        },
                        properties: Vec::new(),
                    });
                    write_message(&mut send, &ok).await?;
                }
                None => {
                    refuse(
                        &mut send,
                        moqt::error::request_error::DOES_NOT_EXIST,
                        "unknown track",
                    )
                    .await
                }
            }
            let _ = send.finish();
            Ok(())
        }
        Message::Publish(p) => subscribe::on_publish(inner, send, reader, p),
        other => {
            refuse(
                &mut send,
                moqt::error::request_error::NOT_SUPPORTED,
                other.name(),
            )
            .await;
            Ok(())
        }
    }
}

pub(crate) async fn refuse(send: &mut SendStream, code: u64, reason: &str) {
    let m = Message::RequestError(moqt::message::RequestError {
        code,
        retry_interval: 0,
        reason: Bytes::copy_from_slice(reason.as_bytes()),
        redirect: None,
    });
    let _ = write_message(send, &m).await;
    let _ = send.finish();
}

async fn serve_subscribe(
    inner: &Arc<Inner>,
    mut send: SendStream,
    mut reader: MessageReader,
    m: Subscribe,
) -> anyhow::Result<()> {
    let track = inner.tracks.lock().expect("tracks").get(&m.track).cloned();
    let Some(track) = track else {
        refuse(
            &mut send,
            moqt::error::request_error::DOES_NOT_EXIST,
            "unknown track",
        )
        .await;
        return Ok(());
    };
    if track.pushed {
        // A relay that subscribed while our PUBLISH was on its way (a
        // subscriber was waiting for the namespace): answering with the
        // PUBLISH's alias would give one track two subscriptions on one
        // alias (DUPLICATE_TRACK_ALIAS). The relay takes the PUBLISH.
        refuse(
            &mut send,
            moqt::error::request_error::DOES_NOT_EXIST,
            "track is pushed with PUBLISH",
        )
        .await;
        return Ok(());
    }
    track.note_subscription();
    let ok = Message::SubscribeOk(SubscribeOk {
        track_alias: track.alias,
        params: Parameters {
            largest_object: track.largest(),
            ..Default::default()
        },
        properties: track.properties(),
    });
    write_message(&mut send, &ok).await?;
    track.set_forward(m.params.forward.unwrap_or(true));
    if m.params.new_group_request.is_some() {
        track.note_new_group_request();
    }
    let mut done = track.done.subscribe();
    // Until the subscriber cancels or the track ends: apply updates.
    loop {
        let ended = async {
            done.wait_for(Option::is_some)
                .await
                .map_or(0, |d| d.unwrap_or(0))
        };
        let next = tokio::select! {
            m = reader.next() => m,
            stream_count = ended => {
                let m = Message::PublishDone(moqt::message::PublishDone {
                    status: moqt::error::publish_done::TRACK_ENDED,
                    stream_count,
                    reason: Bytes::new(),
                });
                write_message(&mut send, &m).await?;
                break;
            }
        };
        match next {
            Ok(Message::RequestUpdate(u)) => {
                if let Some(f) = u.params.forward {
                    track.set_forward(f);
                }
                if u.params.new_group_request.is_some() {
                    track.note_new_group_request();
                }
                let ok = Message::RequestOk(RequestOk {
                    params: Parameters {
                        largest_object: track.largest(),
                        ..Default::default()
                    },
                    properties: Vec::new(),
                });
                write_message(&mut send, &ok).await?;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    track.set_forward(false);
    let _ = send.finish();
    Ok(())
}

impl ClientSession {
    /// Sends a SUBSCRIBE with explicit parameters and returns the raw first reply.
    pub async fn subscribe_raw(
        &self,
        track: FullTrackName,
        params: Parameters,
    ) -> anyhow::Result<(Message, SendStream, MessageReader, u64)> {
        let (mut send, recv) = self.inner.session.open_bi().await?;
        let request_id = self.next_request_id();
        let msg = Message::Subscribe(Subscribe {
            request_id,
            track,
            params,
        });
        write_message(&mut send, &msg).await?;
        let mut reader = MessageReader::new(recv, &[]);
        let reply = reader.next().await?;
        Ok((reply, send, reader, request_id))
    }
}
