//! Requests and their replies: the peer's control messages, the peer's
//! requests to the relay and the relay's to the peer.

use super::*;

impl Bridge {
    pub(super) async fn on_peer_control(self: &Arc<Self>, m: Control) -> Result<(), Fail> {
        match m {
            Control::Request(m) => self.peer_request(m).await,
            Control::SubscribeNamespace { request, .. } if self.draft == Draft::D14 => {
                // Draft 14's SUBSCRIBE_NAMESPACE travels on the control
                // stream and is answered with PUBLISH_NAMESPACEs.
                let (id, prefix) = (request.request_id, request.namespace.clone());
                let kind = RequestKind::SubscribeNamespace;
                self.reserve_peer_id(id, kind, Some(prefix.clone()))?;
                let Some(permit) = self.permit_or_refuse(id, kind).await else {
                    self.remove(id);
                    return Ok(());
                };
                let Some((send, reader)) = self
                    .open_namespace_request(request, SubscribeOptions::Both)
                    .await?
                else {
                    self.remove(id);
                    return Ok(());
                };
                self.requests.lock().expect("requests").insert(
                    id,
                    Request {
                        send: Some(Arc::new(tokio::sync::Mutex::new(send))),
                        kind: RequestKind::SubscribeNamespace,
                        by_peer: true,
                        namespace: Some(prefix.clone()),
                        wants_namespaces: false,
                        updates: Arc::default(),
                        pump: None,
                        permit: Some(permit),
                    },
                );
                let b = self.clone();
                self.spawn(async move { b.namespace_subscription_14(id, prefix, reader).await });
                Ok(())
            }
            Control::Reply {
                request_id, msg, ..
            } => {
                self.on_peer_reply(request_id, msg).await;
                Ok(())
            }
            Control::Update {
                request_id,
                existing,
                params,
            } => {
                self.accept_peer_id(request_id)?;
                // The peer's own requests, and the relay's PUBLISHes to it
                // (a subscription the peer holds).
                let found = {
                    let reqs = self.requests.lock().expect("requests");
                    reqs.get(&existing)
                        .filter(|r| r.by_peer || r.kind == RequestKind::Publish)
                        .and_then(|r| Some((r.send.clone()?, r.updates.clone())))
                };
                let Some((send, updates)) = found else {
                    if self.draft != Draft::D14 {
                        let e = Message::RequestError(RequestError {
                            code: request_error::DOES_NOT_EXIST,
                            reason: Bytes::from_static(b"no such request"),
                            ..Default::default()
                        });
                        let _ = self
                            .control
                            .send(reply(request_id, RequestKind::Update, e))
                            .await;
                    }
                    return Ok(());
                };
                updates.lock().expect("updates").push_back(request_id);
                let u = Message::RequestUpdate(RequestUpdate { request_id, params });
                let _ = write_message(&mut *send.lock().await, &u).await;
                Ok(())
            }
            Control::Unsubscribe(id) | Control::FetchCancel(id) => {
                // The peer's SUBSCRIBE or FETCH, or a PUBLISH of the relay's
                // it no longer wants: draft 18 cancels both with a reset.
                let r = self.take(id, true).or_else(|| {
                    let publish = self
                        .requests
                        .lock()
                        .expect("requests")
                        .get(&id)
                        .is_some_and(|r| r.kind == RequestKind::Publish);
                    publish.then(|| self.take(id, false)).flatten()
                });
                if let Some(send) = r.and_then(|r| r.send) {
                    let _ = send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::PublishNamespaceDone(target) => {
                let id = self.resolve(&target, true, RequestKind::PublishNamespace);
                let Some(r) = id.and_then(|id| self.take(id, true)) else {
                    return Ok(());
                };
                match (r.send, r.namespace) {
                    (Some(send), _) => {
                        let _ = send.lock().await.finish();
                    }
                    // One the bridge turned into a NAMESPACE (client role).
                    (None, Some(ns)) => {
                        if let Some((send, prefix)) = self.namespace_subscriber(&ns) {
                            let done = Message::NamespaceDone(ns.suffix_after(&prefix));
                            let _ = write_message(&mut *send.lock().await, &done).await;
                        }
                    }
                    (None, None) => {}
                }
                Ok(())
            }
            Control::UnsubscribeNamespace(prefix) => {
                let target = NamespaceRef::Namespace(prefix);
                let id = self.resolve(&target, true, RequestKind::SubscribeNamespace);
                if let Some(send) = id.and_then(|id| self.take(id, true)).and_then(|r| r.send) {
                    let _ = send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::PublishNamespaceCancel { target, .. } => {
                // The peer refuses a namespace the relay published to it.
                let id = self.resolve(&target, false, RequestKind::PublishNamespace);
                if let Some(send) = id.and_then(|id| self.take(id, false)).and_then(|r| r.send) {
                    let _ = send.lock().await.reset(reset::CANCELLED);
                }
                Ok(())
            }
            Control::MaxRequestId(v) => {
                let mut max = self.peer_max_request_id.lock().expect("max");
                if v < *max {
                    return Err(Fail::protocol("MAX_REQUEST_ID decreased"));
                }
                *max = v;
                Ok(())
            }
            Control::RequestsBlocked(_) => Ok(()),
            // A client's GOAWAY carries no URI and asks nothing of the relay;
            // a server's goes to our client.
            Control::GoAway(uri) => {
                if let Some(c) = self.modern_control.lock().await.as_mut() {
                    let g = Message::GoAway(moqt::message::GoAway {
                        new_session_uri: uri,
                        timeout: 0,
                        request_id: None,
                    });
                    let _ = write_message(c, &g).await;
                }
                Ok(())
            }
            other => Err(Fail::protocol(format!(
                "{} on the control stream",
                other.name()
            ))),
        }
    }

    /// A reply from the peer to a request the relay (or the bridge) sent.
    pub(super) async fn on_peer_reply(self: &Arc<Self>, id: u64, msg: Message) {
        let parent = self.update_parent.lock().expect("updates").remove(&id);
        let target = parent.unwrap_or(id);
        let found = {
            let reqs = self.requests.lock().expect("requests");
            reqs.get(&target)
                .map(|r| (r.send.clone(), r.by_peer, r.kind))
        };
        match found {
            // PUBLISH_DONE ends the peer's own PUBLISH.
            Some((Some(send), true, RequestKind::Publish))
                if parent.is_none() && matches!(msg, Message::PublishDone(_)) =>
            {
                let mut send = send.lock().await;
                let _ = write_message(&mut send, &msg).await;
                let _ = send.finish();
                drop(send);
                self.take(id, true);
            }
            // The peer's answer to the relay's update of the peer's PUBLISH.
            Some((Some(send), true, _)) if parent.is_some() => {
                let _ = write_message(&mut *send.lock().await, &msg).await;
            }
            // Any other reply belongs to a request the relay (or the bridge)
            // sent.
            Some((_, true, _)) | None => {}
            // The bridge's own PUBLISH_NAMESPACE: nothing waits for a reply.
            Some((None, false, _)) => {
                if matches!(msg, Message::RequestError(_)) && parent.is_none() {
                    self.remove(id);
                }
            }
            Some((Some(send), false, kind)) => {
                let ends = parent.is_none()
                    && matches!(msg, Message::PublishDone(_) | Message::RequestError(_));
                if ends && kind == RequestKind::Fetch {
                    // No data stream will come.
                    self.fetches.lock().expect("fetches").remove(&id);
                }
                let mut send = send.lock().await;
                let _ = write_message(&mut send, &msg).await;
                if ends {
                    let _ = send.finish();
                    drop(send);
                    self.remove(id);
                }
            }
        }
    }

    /// A request from the peer: a draft-18 request stream to the relay.
    pub(super) async fn peer_request(self: &Arc<Self>, m: Message) -> Result<(), Fail> {
        let (Some(id), Some(kind)) = (m.request_id(), RequestKind::of(&m)) else {
            return Err(Fail::protocol(format!("{} is not a request", m.name())));
        };
        let namespace = match &m {
            Message::PublishNamespace(n) => Some(n.namespace.clone()),
            _ => None,
        };
        self.reserve_peer_id(id, kind, namespace.clone())?;
        if let (Role::Client, Draft::D14, Message::PublishNamespace(n)) =
            (self.role, self.draft, &m)
        {
            if let Some(send) = self.namespace_subscriber(&n.namespace) {
                return self.namespace_from_publish_namespace(id, n, send).await;
            }
        }
        let Some(permit) = self.permit_or_refuse(id, kind).await else {
            self.remove(id);
            return Ok(());
        };
        // Noted before the FETCH goes out: its data stream may come first.
        if let Message::Fetch(f) = &m {
            self.note_fetch(id, f.params.group_order, None);
        }
        let (mut send, recv) = self
            .relay
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if write_message(&mut send, &m).await.is_err() {
            self.fetches.lock().expect("fetches").remove(&id);
            self.remove(id);
            return Ok(());
        }
        self.track_peer_request(id, kind, namespace, send, recv, permit);
        Ok(())
    }

    /// Registers a request the peer opened and starts carrying the relay's
    /// replies to it back.
    pub(super) fn track_peer_request(
        self: &Arc<Self>,
        id: u64,
        kind: RequestKind,
        namespace: Option<TrackNamespace>,
        send: SendStream,
        recv: RecvStream,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let updates: Arc<Mutex<VecDeque<u64>>> = Arc::default();
        // In the table before the pump starts, which may remove it at once.
        self.requests.lock().expect("requests").insert(
            id,
            Request {
                send: Some(Arc::new(tokio::sync::Mutex::new(send))),
                kind,
                by_peer: true,
                namespace,
                wants_namespaces: false,
                updates: updates.clone(),
                pump: None,
                permit: Some(permit),
            },
        );
        let b = self.clone();
        let mut stop = self.shutdown.subscribe();
        let pump = tokio::spawn(async move {
            tokio::select! {
                () = b.replies(id, kind, recv, updates) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
        if let Some(r) = self.requests.lock().expect("requests").get_mut(&id) {
            r.pump = Some(pump.abort_handle());
        }
    }

    /// The relay's replies to the peer's request `id`, until the stream ends.
    pub(super) async fn replies(
        self: Arc<Self>,
        id: u64,
        kind: RequestKind,
        recv: RecvStream,
        updates: Arc<Mutex<VecDeque<u64>>>,
    ) {
        let mut reader = MessageReader::new(recv, &[]);
        let mut answered = false;
        let mut done = false;
        loop {
            match reader.next().await {
                Ok(m) => {
                    let (to, kind) = match &m {
                        // After the first reply, a REQUEST_OK or REQUEST_ERROR
                        // answers the oldest update.
                        Message::RequestOk(_) | Message::RequestError(_) if answered => {
                            match updates.lock().expect("updates").pop_front() {
                                Some(u) => (u, RequestKind::Update),
                                None => continue,
                            }
                        }
                        _ => (id, kind),
                    };
                    match m {
                        Message::PublishOk(_)
                        | Message::SubscribeOk(_)
                        | Message::RequestOk(_)
                        | Message::RequestError(_)
                        | Message::FetchOk(_)
                        | Message::PublishDone(_) => {}
                        // The relay, subscriber of the peer's PUBLISH,
                        // updates it (NEW_GROUP_REQUEST, FORWARD).
                        Message::RequestUpdate(u) => {
                            self.relay_update(id, u.params, self.lookup(id, true)).await;
                            continue;
                        }
                        // Nothing else has a place on a legacy control stream.
                        _ => continue,
                    }
                    if kind == RequestKind::Fetch && matches!(m, Message::RequestError(_)) {
                        // No data stream will come.
                        self.fetches.lock().expect("fetches").remove(&id);
                    }
                    answered = true;
                    // Draft 14 does not answer SUBSCRIBE_UPDATE.
                    if kind == RequestKind::Update && self.draft == Draft::D14 {
                        continue;
                    }
                    done |= matches!(m, Message::PublishDone(_));
                    let c = reply(to, kind, m);
                    if !self.encodable(&c) {
                        // A draft-18 value the old draft cannot carry (from
                        // another publisher): the peer is told, and the
                        // request ends, rather than the peer waiting.
                        tracing::debug!(
                            draft = self.draft.number(),
                            message = c.name(),
                            "not translatable"
                        );
                        let e = Message::RequestError(RequestError {
                            code: request_error::INTERNAL_ERROR,
                            reason: Bytes::from_static(b"reply not representable in this draft"),
                            ..Default::default()
                        });
                        let _ = self.control.send(reply(to, kind, e)).await;
                        if let Some(send) = self.lookup(id, true) {
                            let _ = send.lock().await.reset(reset::CANCELLED);
                        }
                        break;
                    }
                    if self.control.send(c).await.is_err() {
                        return;
                    }
                }
                Err(ReadError::Finished) => break,
                Err(_) => {
                    // Reset by the relay without a final message.
                    if answered && !done {
                        if let Some(c) = self.ended_by_relay(id, kind) {
                            let _ = self.control.send(c).await;
                        }
                        done = true;
                    }
                    break;
                }
            }
        }
        if kind == RequestKind::PublishNamespace && answered && !done {
            // The relay ended a namespace the peer still publishes.
            if let Some(c) = self.ended_by_relay(id, kind) {
                let _ = self.control.send(c).await;
            }
        }
        self.remove(id);
    }

    /// The relay's REQUEST_UPDATE of request `id` (its own, or a PUBLISH of
    /// the peer's it subscribes to), arriving on `send`'s stream:
    /// SUBSCRIBE_UPDATE or REQUEST_UPDATE to the peer. Draft 16 answers it
    /// under the update's own Request ID, routed back to this request's
    /// stream; draft 14 does not, so the bridge answers on `send`.
    pub(super) async fn relay_update(
        &self,
        id: u64,
        params: moqt::Parameters,
        send: Option<Arc<tokio::sync::Mutex<SendStream>>>,
    ) {
        let uid = self
            .send_numbered(|uid| {
                if self.draft == Draft::D16 {
                    self.expect_update_reply(uid, id);
                }
                Control::Update {
                    request_id: uid,
                    existing: id,
                    params,
                }
            })
            .await;
        let answer = match (uid, self.draft) {
            (Some(_), Draft::D16) => None,
            (Some(_), Draft::D14) => Some(Message::RequestOk(Default::default())),
            (None, _) => Some(Message::RequestError(RequestError {
                code: request_error::EXCESSIVE_LOAD,
                reason: Bytes::from_static(b"peer's MAX_REQUEST_ID reached"),
                ..Default::default()
            })),
        };
        if let (Some(a), Some(send)) = (answer, send) {
            let _ = write_message(&mut *send.lock().await, &a).await;
        }
    }

    /// What tells the peer the relay ended its request `id` without a reply
    /// that says so.
    pub(super) fn ended_by_relay(&self, id: u64, kind: RequestKind) -> Option<Control> {
        match kind {
            RequestKind::Subscribe => {
                Some(reply(id, kind, Message::PublishDone(Default::default())))
            }
            // The relay, subscriber of the peer's PUBLISH, cancelled it.
            RequestKind::Publish => Some(Control::Unsubscribe(id)),
            RequestKind::PublishNamespace => {
                let target = match self.draft {
                    Draft::D16 => NamespaceRef::Id(id),
                    Draft::D14 => NamespaceRef::Namespace(
                        self.requests
                            .lock()
                            .expect("requests")
                            .get(&id)?
                            .namespace
                            .clone()?,
                    ),
                };
                Some(Control::PublishNamespaceCancel {
                    target,
                    code: request_error::INTERNAL_ERROR,
                    reason: Bytes::new(),
                })
            }
            _ => None,
        }
    }

    /// A request the relay opens towards the peer.
    pub(super) async fn relay_request(
        self: Arc<Self>,
        mut send: SendStream,
        recv: RecvStream,
    ) -> Result<(), Fail> {
        let mut reader = MessageReader::new(recv, &[]);
        let Ok(mut m) = reader.next().await else {
            return Ok(());
        };
        let refuse = |code, reason: &'static [u8]| {
            Message::RequestError(RequestError {
                code,
                reason: Bytes::from_static(reason),
                ..Default::default()
            })
        };
        let kind = match RequestKind::of(&m) {
            Some(RequestKind::SubscribeNamespace) if self.role == Role::Client => {
                return self.client_namespace_request(send, reader, m).await;
            }
            Some(RequestKind::SubscribeNamespace) | Some(RequestKind::Update) | None => {
                // SUBSCRIBE_NAMESPACE and SUBSCRIBE_TRACKS towards a client:
                // the relay does not send them; refuse rather than guess.
                let e = refuse(request_error::NOT_SUPPORTED, b"not available in this draft");
                let _ = write_message(&mut send, &e).await;
                let _ = send.finish();
                return Ok(());
            }
            Some(k) => k,
        };
        let relay_id = m.request_id().unwrap_or_default();
        let namespace = match &m {
            Message::PublishNamespace(n) => Some(n.namespace.clone()),
            _ => None,
        };
        let order = match &m {
            Message::Fetch(f) => Some(f.params.group_order),
            _ => None,
        };
        // A request the peer's draft cannot carry is refused to the relay
        // here, rather than left waiting for a reply that cannot come.
        set_request_id(&mut m, 0);
        if !self.encodable(&Control::Request(m.clone())) {
            let e = refuse(
                request_error::NOT_SUPPORTED,
                b"not representable in this draft",
            );
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
            return Ok(());
        }
        let updates: Arc<Mutex<VecDeque<u64>>> = Arc::default();
        let send = Arc::new(tokio::sync::Mutex::new(send));
        // The ID is taken, the request registered and sent in one step, so
        // IDs reach the peer in sequence and a fast reply finds its entry.
        let sent = self
            .send_numbered(|id| {
                set_request_id(&mut m, id);
                if let Some(order) = order {
                    self.note_fetch(id, order, Some(relay_id));
                }
                self.requests.lock().expect("requests").insert(
                    id,
                    Request {
                        send: Some(send.clone()),
                        kind,
                        by_peer: false,
                        namespace: namespace.clone(),
                        wants_namespaces: false,
                        updates: updates.clone(),
                        pump: None,
                        permit: None,
                    },
                );
                Control::Request(m)
            })
            .await;
        let Some(id) = sent else {
            let max = *self.peer_max_request_id.lock().expect("max");
            let _ = self.control.send(Control::RequestsBlocked(max)).await;
            let e = refuse(
                request_error::EXCESSIVE_LOAD,
                b"peer's MAX_REQUEST_ID reached",
            );
            let mut send = send.lock().await;
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
            return Ok(());
        };
        // Later messages on the stream, and its end.
        loop {
            match reader.next().await {
                Ok(Message::RequestUpdate(u)) => {
                    self.relay_update(id, u.params, Some(send.clone())).await;
                }
                // PUBLISH_DONE ends the relay's PUBLISH.
                Ok(m @ Message::PublishDone(_)) => {
                    let _ = self.control.send(reply(id, kind, m)).await;
                    self.remove(id);
                    return Ok(());
                }
                // The relay's answer to the peer's update of this PUBLISH.
                Ok(m @ (Message::RequestOk(_) | Message::RequestError(_)))
                    if kind == RequestKind::Publish =>
                {
                    let Some(uid) = updates.lock().expect("updates").pop_front() else {
                        continue;
                    };
                    if self.draft != Draft::D14 {
                        let _ = self.control.send(reply(uid, RequestKind::Update, m)).await;
                    }
                }
                Ok(other) => {
                    return Err(Fail::protocol(format!(
                        "relay sent {} on a request stream",
                        other.name()
                    )))
                }
                Err(_) => break,
            }
        }
        // The relay closed its side: it cancels the request (a reply from the
        // peer that already ended it removed the entry first).
        if self.take(id, false).is_some() {
            let c = match kind {
                RequestKind::Subscribe => Some(Control::Unsubscribe(id)),
                RequestKind::Fetch => Some(Control::FetchCancel(id)),
                RequestKind::PublishNamespace => Some(Control::PublishNamespaceDone(
                    match (self.draft, namespace) {
                        (Draft::D14, Some(ns)) => NamespaceRef::Namespace(ns),
                        _ => NamespaceRef::Id(id),
                    },
                )),
                RequestKind::Publish => {
                    Some(reply(id, kind, Message::PublishDone(Default::default())))
                }
                _ => None,
            };
            if let Some(c) = c {
                let _ = self.control.send(c).await;
            }
        }
        Ok(())
    }
}
