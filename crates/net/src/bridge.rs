//! What the translating bridges ([`crate::legacy`] for drafts 14 and 16,
//! [`crate::lite`] for moq-lite) share: the in-memory QMux session each one
//! opens to the relay, and how the two sessions end together.

use tokio::sync::mpsc;

use crate::mux::Session;

/// Why a bridge closes both sessions.
pub(crate) struct Fail {
    pub(crate) code: u32,
    pub(crate) reason: String,
}

impl Fail {
    pub(crate) fn protocol(reason: impl Into<String>) -> Self {
        Fail {
            code: moqt::SessionErrorCode::ProtocolViolation.code(),
            reason: reason.into(),
        }
    }
}

/// The in-memory QMux limits: `limits` (the stream counts and windows a
/// QUIC peer of the relay gets, as for WebSocket sessions) without the idle
/// timeout, which the peer's own session enforces.
pub(crate) fn config(limits: qmux::Config) -> qmux::Config {
    let mut c = limits;
    c.max_idle_timeout = 0;
    c
}

/// An in-memory QMux session pair over `config`: the bridge's end and the
/// other (the relay's, or our client's). `bridge_dials`: the bridge stands
/// for a client (its peer is a client of the relay).
pub(crate) async fn memory_pair(
    config: qmux::Config,
    bridge_dials: bool,
) -> anyhow::Result<(Session, Session)> {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let ta = qmux::transport::Stream::new(a, config.version, config.max_record_size);
    let tb = qmux::transport::Stream::new(b, config.version, config.max_record_size);
    Ok(if bridge_dials {
        let (c, s) = tokio::try_join!(
            qmux::Session::connect(ta, config.clone()),
            qmux::Session::accept(tb, config)
        )?;
        (c.into(), s.into())
    } else {
        let (s, c) = tokio::try_join!(
            qmux::Session::accept(ta, config.clone()),
            qmux::Session::connect(tb, config)
        )?;
        (s.into(), c.into())
    })
}

/// Waits until either session closes (the other is closed with the same
/// code) or the bridge fails (both are closed with its code, unless a
/// session closed meanwhile: a read that failed because a session just
/// closed is that close, not a violation, and its code is passed on).
pub(crate) async fn close_together(
    peer: &Session,
    relay: &Session,
    fail: &mut mpsc::Receiver<Fail>,
    what: &str,
) {
    let outcome = tokio::select! {
        f = fail.recv() => f,
        e = peer.closed() => {
            let (code, reason) = e.application_close().unwrap_or((0, e.to_string()));
            relay.close(code, reason.as_bytes());
            None
        }
        e = relay.closed() => {
            let (code, reason) = e.application_close().unwrap_or((0, e.to_string()));
            peer.close(code, reason.as_bytes());
            None
        }
    };
    if let Some(f) = outcome {
        let (code, reason) = match (peer.close_reason(), relay.close_reason()) {
            (Some(e), _) | (None, Some(e)) => e.application_close().unwrap_or((0, e.to_string())),
            (None, None) => (f.code, f.reason),
        };
        tracing::debug!(code, %reason, "closing {what} session");
        peer.close(code, reason.as_bytes());
        relay.close(code, reason.as_bytes());
    }
}
