//! The bridge's SETUP exchange in each role, and the tasks that accept
//! the streams and datagrams of both sessions.

use super::*;

impl Bridge {
    pub(super) async fn serve(
        self: Arc<Self>,
        control_rx: mpsc::Receiver<Control>,
    ) -> Result<(), Fail> {
        // The peer's control stream and its CLIENT_SETUP, within one deadline.
        let deadline = tokio::time::Instant::now() + SETUP_TIMEOUT;
        let first = self.first_control.lock().expect("first control").take();
        let (mut peer_send, peer_recv, read) = match first {
            Some(c) => c,
            None => {
                let (send, recv) = tokio::time::timeout_at(deadline, self.peer.accept_bi())
                    .await
                    .map_err(|_| Fail {
                        code: SessionErrorCode::ControlMessageTimeout.code(),
                        reason: "no control stream".into(),
                    })?
                    .map_err(|e| Fail::protocol(e.to_string()))?;
                (send, recv, Bytes::new())
            }
        };
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        // From the stream's first byte: what was read to learn the draft.
        reader.frames.push(&read);
        let first = tokio::time::timeout_at(deadline, reader.next())
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no CLIENT_SETUP".into(),
            })??;
        let Control::ClientSetup { versions, options } = first else {
            return Err(Fail::protocol(format!(
                "{} before CLIENT_SETUP",
                first.name()
            )));
        };
        // Draft 14 negotiates in CLIENT_SETUP; the ALPN already chose 16.
        if self.draft == Draft::D14 && !versions.contains(&VERSION_D14) {
            return Err(Fail {
                code: SessionErrorCode::VersionNegotiationFailed.code(),
                reason: format!("no supported version in {versions:x?} (serving draft 14 here)"),
            });
        }
        let mut setup = Setup::default();
        for kv in options {
            if kv.kind == SETUP_MAX_REQUEST_ID {
                if let KvValue::Int(v) = kv.value {
                    *self.peer_max_request_id.lock().expect("max") = v;
                }
            } else {
                setup.options.push(kv);
            }
        }
        setup.options.sort_by_key(|kv| kv.kind);
        let mut relay_control = self
            .relay
            .open_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        write_message(&mut relay_control, &Message::Setup(setup))
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;

        // The relay's control stream: its SETUP, then GOAWAY.
        let relay_uni = self
            .relay
            .accept_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut relay_reader = MessageReader::new(relay_uni, &[]);
        let Ok(Message::Setup(relay_setup)) = relay_reader.next().await else {
            return Err(Fail::protocol("relay sent no SETUP"));
        };
        let mut options = vec![KeyValue::int(SETUP_MAX_REQUEST_ID, GRANTED_REQUEST_IDS)];
        options.extend(relay_setup.options.into_iter().filter(|kv| {
            kv.kind == setup_option::MAX_AUTH_TOKEN_CACHE_SIZE
                || kv.kind == setup_option::MOQT_IMPLEMENTATION
        }));
        // Control messages go before data when the peer's link is behind.
        let _ = peer_send.set_priority(i32::MAX);
        let server_setup = Control::ServerSetup {
            version: (self.draft == Draft::D14).then_some(VERSION_D14),
            options,
        };
        self.spawn(write_control(
            self.draft,
            peer_send,
            Some(server_setup),
            control_rx,
        ));
        {
            let b = self.clone();
            self.spawn(async move {
                while let Ok(m) = relay_reader.next().await {
                    if let Message::GoAway(g) = m {
                        let _ = b.control.send(Control::GoAway(g.new_session_uri)).await;
                    }
                }
            });
        }
        self.spawn_streams();
        // The peer's control stream, for the session's life. A failure is
        // reported from here, while `relay_control` is still open: were it
        // dropped first (by returning), the relay could close the session
        // for its own reason ("control stream closed") before the bridge
        // closes it with the peer's fault, and the peer would get that code.
        loop {
            let step = match reader.next().await {
                Ok(m) => self.on_peer_control(m).await,
                Err(f) => Err(f),
            };
            if let Err(f) = step {
                let _ = self.fail.send(f).await;
                // The bridge closes both sessions, then ends this task.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Client role: our client's SETUP becomes CLIENT_SETUP, the server's
    /// SERVER_SETUP our client's SETUP.
    pub(super) async fn serve_client(
        self: Arc<Self>,
        control_rx: mpsc::Receiver<Control>,
    ) -> Result<(), Fail> {
        // A server that grants no stream or never answers: the client hears
        // of it as a closed session, not a hang.
        let mut reader = tokio::time::timeout(SETUP_TIMEOUT, self.clone().setup_client(control_rx))
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no SERVER_SETUP exchanged".into(),
            })??;
        self.spawn_streams();
        loop {
            let m = reader.next().await?;
            self.on_peer_control(m).await?;
        }
    }

    /// The client role's SETUP exchange; returns the server's control stream.
    pub(super) async fn setup_client(
        self: Arc<Self>,
        control_rx: mpsc::Receiver<Control>,
    ) -> Result<LegacyReader, Fail> {
        let uni = self
            .relay
            .accept_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut modern_reader = MessageReader::new(uni, &[]);
        let Ok(Message::Setup(setup)) = modern_reader.next().await else {
            return Err(Fail::protocol("client sent no SETUP"));
        };
        let (mut peer_send, peer_recv) = self
            .peer
            .open_bi()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let _ = peer_send.set_priority(i32::MAX);
        let mut options = vec![KeyValue::int(SETUP_MAX_REQUEST_ID, GRANTED_REQUEST_IDS)];
        options.extend(setup.options);
        options.sort_by_key(|kv| kv.kind);
        let client_setup = Control::ClientSetup {
            versions: match self.draft {
                Draft::D14 => vec![VERSION_D14],
                Draft::D16 => Vec::new(),
            },
            options,
        };
        let b = client_setup
            .to_bytes(self.draft)
            .map_err(|e| Fail::protocol(e.to_string()))?;
        peer_send
            .write_all(&b)
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        let mut reader = LegacyReader::new(peer_recv, self.draft);
        let first = tokio::time::timeout(SETUP_TIMEOUT, reader.next())
            .await
            .map_err(|_| Fail {
                code: SessionErrorCode::ControlMessageTimeout.code(),
                reason: "no SERVER_SETUP".into(),
            })??;
        let Control::ServerSetup { version, options } = first else {
            return Err(Fail::protocol(format!(
                "{} before SERVER_SETUP",
                first.name()
            )));
        };
        if self.draft == Draft::D14 && version != Some(VERSION_D14) {
            return Err(Fail {
                code: SessionErrorCode::VersionNegotiationFailed.code(),
                reason: format!("server chose version {version:x?}"),
            });
        }
        let mut setup = Setup::default();
        for kv in options {
            if kv.kind == SETUP_MAX_REQUEST_ID {
                if let KvValue::Int(v) = kv.value {
                    *self.peer_max_request_id.lock().expect("max") = v;
                }
            } else {
                setup.options.push(kv);
            }
        }
        setup.options.sort_by_key(|kv| kv.kind);
        let mut control = self
            .relay
            .open_uni()
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        write_message(&mut control, &Message::Setup(setup))
            .await
            .map_err(|e| Fail::protocol(e.to_string()))?;
        *self.modern_control.lock().await = Some(control);
        self.spawn(write_control(self.draft, peer_send, None, control_rx));
        // Our client's GOAWAY (no URI) has nothing to say to a server.
        self.spawn(async move { while modern_reader.next().await.is_ok() {} });
        Ok(reader)
    }

    /// Carries every unidirectional (data) stream `from` opens to a stream
    /// of `to`, re-encoded in direction `dir`.
    fn carry_uni_streams(self: &Arc<Self>, from: Session, to: Session, dir: Direction) {
        let b = self.clone();
        self.spawn(async move {
            while let Ok(s) = from.accept_uni().await {
                let to = to.clone();
                let p = Pipe {
                    draft: b.draft,
                    dir,
                    fetches: b.fetches.clone(),
                    fail: b.fail.clone(),
                };
                b.spawn(async move {
                    if let Ok(out) = to.open_uni().await {
                        pipe(s, out, StreamTranscoder::new(p.draft, dir), p).await;
                    }
                });
            }
        });
    }

    pub(super) fn spawn_streams(self: &Arc<Self>) {
        self.carry_uni_streams(self.peer.clone(), self.relay.clone(), Direction::ToModern);
        self.carry_uni_streams(self.relay.clone(), self.peer.clone(), Direction::ToLegacy);
        let b = self.clone();
        self.spawn(async move {
            while let Ok(d) = b.peer.read_datagram().await {
                match transcode_datagram(b.draft, Direction::ToModern, &d) {
                    Ok(d) => {
                        let _ = b.relay.send_datagram(d);
                    }
                    // Draft 14's "does not exist" datagram has no draft-18 form.
                    Err(TranscodeError::Unsupported(_)) => {}
                    Err(e) => {
                        let _ = b.fail.send(Fail::protocol(format!("datagram: {e}"))).await;
                        return;
                    }
                }
            }
        });
        let b = self.clone();
        self.spawn(async move {
            while let Ok(d) = b.relay.read_datagram().await {
                if let Ok(d) = transcode_datagram(b.draft, Direction::ToLegacy, &d) {
                    let _ = b.peer.send_datagram(d);
                }
            }
        });
        // The peer's other bidi streams: draft 16's SUBSCRIBE_NAMESPACE.
        let b = self.clone();
        self.spawn(async move {
            while let Ok((send, recv)) = b.peer.accept_bi().await {
                let b2 = b.clone();
                b.spawn(async move {
                    let b = b2;
                    if let Err(f) = b.clone().namespace_stream(send, recv).await {
                        let _ = b.fail.send(f).await;
                    }
                });
            }
        });
        // The relay's requests.
        let b = self.clone();
        self.spawn(async move {
            while let Ok((send, recv)) = b.relay.accept_bi().await {
                let b2 = b.clone();
                b.spawn(async move {
                    let b = b2;
                    if let Err(f) = b.clone().relay_request(send, recv).await {
                        let _ = b.fail.send(f).await;
                    }
                });
            }
        });
    }
}
