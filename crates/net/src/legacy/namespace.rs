//! Namespace subscriptions: draft 16's SUBSCRIBE_NAMESPACE streams, draft
//! 14's on the control stream, and the PUBLISH_NAMESPACE/NAMESPACE
//! translations between them.

use super::*;

impl Bridge {
    /// Client role, draft 14: the SUBSCRIBE_NAMESPACE of our client that
    /// `ns` falls under: its stream and prefix.
    pub(super) fn namespace_subscriber(
        &self,
        ns: &TrackNamespace,
    ) -> Option<(Arc<tokio::sync::Mutex<SendStream>>, TrackNamespace)> {
        let reqs = self.requests.lock().expect("requests");
        reqs.values().find_map(|r| {
            let prefix = r.namespace.as_ref()?;
            (r.wants_namespaces && ns.has_prefix(prefix))
                .then(|| Some((r.send.clone()?, prefix.clone())))
                .flatten()
        })
    }

    /// A draft-14 server's PUBLISH_NAMESPACE under our client's namespace
    /// subscription: NAMESPACE on that subscription's stream, and
    /// PUBLISH_NAMESPACE_OK for the server.
    pub(super) async fn namespace_from_publish_namespace(
        &self,
        id: u64,
        n: &moqt::message::NamespaceRequest,
        (send, prefix): (Arc<tokio::sync::Mutex<SendStream>>, TrackNamespace),
    ) -> Result<(), Fail> {
        let suffix = n.namespace.suffix_after(&prefix);
        let _ = write_message(&mut *send.lock().await, &Message::Namespace(suffix)).await;
        self.requests.lock().expect("requests").insert(
            id,
            Request {
                send: None,
                kind: RequestKind::PublishNamespace,
                by_peer: true,
                namespace: Some(n.namespace.clone()),
                wants_namespaces: false,
                updates: Arc::default(),
                pump: None,
                permit: None,
            },
        );
        let ok = reply(
            id,
            RequestKind::PublishNamespace,
            Message::RequestOk(Default::default()),
        );
        let _ = self.control.send(ok).await;
        Ok(())
    }

    /// Client role: our client's SUBSCRIBE_NAMESPACE or SUBSCRIBE_TRACKS to
    /// a legacy server: its own bidi stream in draft 16, the control stream
    /// in draft 14 (where the server answers with PUBLISH_NAMESPACEs, which
    /// reach our client as such).
    pub(super) async fn client_namespace_request(
        self: Arc<Self>,
        mut send: SendStream,
        mut reader: MessageReader,
        m: Message,
    ) -> Result<(), Fail> {
        let (mut request, options) = match m {
            Message::SubscribeTracks(n) => (n, SubscribeOptions::Publish),
            Message::SubscribeNamespace(n) => (n, SubscribeOptions::Namespace),
            _ => return Ok(()),
        };
        let refuse = |mut send: SendStream| async move {
            let e = Message::RequestError(RequestError {
                code: request_error::EXCESSIVE_LOAD,
                reason: Bytes::from_static(b"server's MAX_REQUEST_ID reached"),
                ..Default::default()
            });
            let _ = write_message(&mut send, &e).await;
            let _ = send.finish();
        };
        let prefix = request.namespace.clone();
        if self.draft == Draft::D14 {
            // On the control stream, numbered and registered in one step.
            let send = Arc::new(tokio::sync::Mutex::new(send));
            let sent = self
                .send_numbered(|id| {
                    request.request_id = id;
                    self.requests.lock().expect("requests").insert(
                        id,
                        Request {
                            send: Some(send.clone()),
                            kind: RequestKind::SubscribeNamespace,
                            by_peer: false,
                            namespace: Some(prefix.clone()),
                            wants_namespaces: options == SubscribeOptions::Namespace,
                            updates: Arc::default(),
                            pump: None,
                            permit: None,
                        },
                    );
                    Control::SubscribeNamespace { request, options }
                })
                .await;
            let Some(id) = sent else {
                if let Some(send) = Arc::into_inner(send) {
                    refuse(send.into_inner()).await;
                }
                return Ok(());
            };
            // Until our client ends it.
            while reader.next().await.is_ok() {}
            if self.take(id, false).is_some() {
                let _ = self
                    .control
                    .send(Control::UnsubscribeNamespace(prefix))
                    .await;
            }
            return Ok(());
        }
        // Draft 16: its own stream.
        let Some(id) = self.allocate_id() else {
            refuse(send).await;
            return Ok(());
        };
        request.request_id = id;
        let c = Control::SubscribeNamespace { request, options };
        let (mut peer_send, peer_recv) = self
            .peer
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let _ = peer_send.set_priority(i32::MAX);
        let b = c
            .to_bytes(self.draft)
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if peer_send.write_all(&b).await.is_err() {
            return Ok(());
        }
        let mut peer_reader = LegacyReader::new(peer_recv, self.draft);
        let forward = async {
            loop {
                let m = match peer_reader.next().await {
                    Ok(Control::Reply { msg, .. }) => msg,
                    Ok(Control::Namespace(ns)) => Message::Namespace(ns),
                    Ok(Control::NamespaceDone(ns)) => Message::NamespaceDone(ns),
                    Ok(_) => continue,
                    Err(_) => {
                        let _ = send.finish();
                        return;
                    }
                };
                if write_message(&mut send, &m).await.is_err() {
                    return;
                }
            }
        };
        let cancelled = async { while reader.next().await.is_ok() {} };
        tokio::select! {
            _ = forward => {}
            _ = cancelled => { let _ = peer_send.reset(reset::CANCELLED); }
        }
        Ok(())
    }

    /// Opens the draft-18 request for a namespace subscription: namespaces
    /// only, or (draft 16's option 0) tracks.
    pub(super) async fn open_namespace_request(
        self: &Arc<Self>,
        request: moqt::message::NamespaceRequest,
        options: SubscribeOptions,
    ) -> Result<Option<(SendStream, MessageReader)>, Fail> {
        // Drafts 14 and 16 ask for NAMESPACEs, PUBLISHes or both in one
        // request; draft 18 has a request for each. For both, the bridge
        // adds a SUBSCRIBE_TRACKS of its own, whose replies it drops (the
        // PUBLISHes it brings are requests of the relay's, forwarded).
        let id = request.request_id;
        let m = match options {
            SubscribeOptions::Publish => Message::SubscribeTracks(request.clone()),
            SubscribeOptions::Namespace | SubscribeOptions::Both => {
                Message::SubscribeNamespace(request.clone())
            }
        };
        let (mut send, recv) = self
            .relay
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        if write_message(&mut send, &m).await.is_err() {
            return Ok(None);
        }
        // The second request needs a Request ID of the bridge's (bounded
        // per session) and a request stream to spare; without either the
        // subscription gets the namespaces only.
        let private = {
            let mut p = self.private_id.lock().expect("private id");
            let v = *p;
            let left = v < PRIVATE_IDS + 2 * MAX_PRIVATE_IDS;
            if options == SubscribeOptions::Both && left {
                *p += 2;
            }
            (options == SubscribeOptions::Both && left).then_some(v)
        };
        if let (Some(private), Some(permit)) = (private, private.and_then(|_| self.stream_permit()))
        {
            let tracks = Message::SubscribeTracks(moqt::message::NamespaceRequest {
                request_id: private,
                ..request
            });
            if let Ok((mut s2, recv2)) = self.relay.open_bi().await {
                if write_message(&mut s2, &tracks).await.is_ok() {
                    self.companions
                        .lock()
                        .expect("companions")
                        .insert(id, (s2, permit));
                    self.spawn(async move {
                        let mut r = MessageReader::new(recv2, &[]);
                        while r.next().await.is_ok() {}
                    });
                }
            }
        }
        Ok(Some((send, MessageReader::new(recv, &[]))))
    }

    /// Ends the bridge's own SUBSCRIBE_TRACKS that goes with request `id`.
    pub(super) fn drop_companion(&self, id: u64) {
        let companion = self.companions.lock().expect("companions").remove(&id);
        if let Some((mut s, _permit)) = companion {
            let _ = s.reset(reset::CANCELLED);
        }
    }

    /// A SUBSCRIBE_NAMESPACE stream from a draft-16 peer.
    pub(super) async fn namespace_stream(
        self: Arc<Self>,
        mut peer_send: SendStream,
        peer_recv: RecvStream,
    ) -> Result<(), Fail> {
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        let first = match tokio::time::timeout(SETUP_TIMEOUT, reader.next()).await {
            Ok(Ok(m)) => m,
            _ => return Ok(()),
        };
        let Control::SubscribeNamespace { request, options } = first else {
            return Err(Fail::protocol(format!(
                "{} opening a bidi stream",
                first.name()
            )));
        };
        let id = request.request_id;
        let kind = RequestKind::SubscribeNamespace;
        self.reserve_peer_id(id, kind, Some(request.namespace.clone()))?;
        let _ = peer_send.set_priority(i32::MAX);
        let Some(permit) = self.stream_permit() else {
            self.remove(id);
            let e = reply(
                id,
                RequestKind::SubscribeNamespace,
                Message::RequestError(RequestError {
                    code: request_error::EXCESSIVE_LOAD,
                    reason: Bytes::from_static(b"too many requests open"),
                    ..Default::default()
                }),
            );
            if let Ok(b) = e.to_bytes(self.draft) {
                let _ = peer_send.write_all(&b).await;
            }
            let _ = peer_send.finish();
            return Ok(());
        };
        // Its stream to the relay lives in this task; the table keeps its
        // Request ID taken and its permit.
        if let Some(r) = self.requests.lock().expect("requests").get_mut(&id) {
            r.permit = Some(permit);
        }
        let Some((mut send, mut relay_reader)) =
            self.open_namespace_request(request, options).await?
        else {
            self.remove(id);
            return Ok(());
        };
        let draft = self.draft;
        let forward = async {
            loop {
                let c = match relay_reader.next().await {
                    Ok(m @ (Message::RequestOk(_) | Message::RequestError(_))) => {
                        reply(id, RequestKind::SubscribeNamespace, m)
                    }
                    Ok(Message::Namespace(ns)) => Control::Namespace(ns),
                    Ok(Message::NamespaceDone(ns)) => Control::NamespaceDone(ns),
                    Ok(_) => continue,
                    Err(ReadError::Finished) => {
                        let _ = peer_send.finish();
                        return;
                    }
                    Err(_) => {
                        let _ = peer_send.reset(reset::INTERNAL_ERROR);
                        return;
                    }
                };
                let Ok(b) = c.to_bytes(draft) else { continue };
                if peer_send.write_all(&b).await.is_err() {
                    return;
                }
            }
        };
        // The peer ends the subscription by closing or resetting its side.
        let cancelled = async {
            loop {
                match reader.next().await {
                    Ok(_) => continue,
                    Err(_) => return,
                }
            }
        };
        tokio::select! {
            _ = forward => {}
            _ = cancelled => { let _ = send.reset(reset::CANCELLED); }
        }
        self.remove(id);
        Ok(())
    }

    /// A draft-14 SUBSCRIBE_NAMESPACE (on the control stream): SUBSCRIBE_
    /// NAMESPACE_OK or _ERROR, then a PUBLISH_NAMESPACE (with the bridge's
    /// own Request ID) for each namespace, PUBLISH_NAMESPACE_DONE when it goes.
    pub(super) async fn namespace_subscription_14(
        self: Arc<Self>,
        id: u64,
        prefix: TrackNamespace,
        mut reader: MessageReader,
    ) {
        let mut published: HashMap<TrackNamespace, u64> = HashMap::new();
        while let Ok(m) = reader.next().await {
            let c = match m {
                m @ (Message::RequestOk(_) | Message::RequestError(_)) => {
                    reply(id, RequestKind::SubscribeNamespace, m)
                }
                Message::Namespace(suffix) => {
                    let ns = prefix.join(&suffix);
                    let sent = self
                        .send_numbered(|pid| {
                            self.requests.lock().expect("requests").insert(
                                pid,
                                Request {
                                    send: None,
                                    kind: RequestKind::PublishNamespace,
                                    by_peer: false,
                                    namespace: Some(ns.clone()),
                                    wants_namespaces: false,
                                    updates: Arc::default(),
                                    pump: None,
                                    permit: None,
                                },
                            );
                            Control::Request(Message::PublishNamespace(
                                moqt::message::NamespaceRequest {
                                    request_id: pid,
                                    namespace: ns.clone(),
                                    params: Default::default(),
                                },
                            ))
                        })
                        .await;
                    // No Request ID left (the peer's MAX_REQUEST_ID): this
                    // namespace is not announced to it.
                    if let Some(pid) = sent {
                        published.insert(ns, pid);
                    }
                    continue;
                }
                Message::NamespaceDone(suffix) => {
                    let ns = prefix.join(&suffix);
                    let Some(pid) = published.remove(&ns) else {
                        continue;
                    };
                    self.remove(pid);
                    Control::PublishNamespaceDone(NamespaceRef::Namespace(ns))
                }
                _ => continue,
            };
            if self.control.send(c).await.is_err() {
                break;
            }
        }
        for (ns, pid) in published {
            self.remove(pid);
            let _ = self
                .control
                .send(Control::PublishNamespaceDone(NamespaceRef::Namespace(ns)))
                .await;
        }
        self.remove(id);
    }

    /// The Request ID a draft-14 namespace reference names.
    pub(super) fn resolve(
        &self,
        target: &NamespaceRef,
        by_peer: bool,
        kind: RequestKind,
    ) -> Option<u64> {
        match target {
            NamespaceRef::Id(id) => Some(*id),
            NamespaceRef::Namespace(ns) => self
                .requests
                .lock()
                .expect("requests")
                .iter()
                .find(|(_, r)| {
                    r.by_peer == by_peer && r.kind == kind && r.namespace.as_ref() == Some(ns)
                })
                .map(|(id, _)| *id),
        }
    }
}
