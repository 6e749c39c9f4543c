//! quichub's media publisher and player (`quichub_client::media`) as the
//! product's `quichub pub --broadcast` and `quichub sub --broadcast` run
//! them: one session, the broadcast, then a clean leave. The lab calls the
//! library rather than the product binary, which is built apart from it.

use std::future::Future;

use anyhow::Context;
use quichub_client::media::{self, MediaPublishOptions, MediaSubscribeOptions};
use quichub_client::{ClientSession, ConnectOptions, Verify};

/// The certificate check for a relay whose SHA-256 fingerprint (hex) is
/// `fingerprint`, or none.
pub fn verify(fingerprint: Option<&str>) -> anyhow::Result<Verify> {
    quichub_client::verify_from(fingerprint)
}

/// Publishes `input` (fMP4/CMAF or MPEG-TS, read on a thread of its own)
/// as `opts` says on the relay at `url`, until the input ends or `stop`
/// completes; progress and the summary on stderr, as `quichub pub` prints
/// them.
pub async fn publish(
    url: &str,
    verify: Verify,
    opts: &MediaPublishOptions,
    input: impl std::io::Read + Send + 'static,
    stop: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let session = connect(url, verify).await?;
    let input = media::read_on_thread(input);
    let result = media::publish(&session, opts, input, stop, |n| eprintln!("{n}"))
        .await
        .map(|summary| eprintln!("{summary}"));
    leave(&session, result).await
}

/// Plays the broadcast `opts` names from the relay at `url` into `output`
/// as fragmented MP4, until it ends or `stop` completes.
pub async fn subscribe(
    url: &str,
    verify: Verify,
    opts: &MediaSubscribeOptions,
    output: impl tokio::io::AsyncWrite + Unpin + Send,
    stop: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let session = connect(url, verify).await?;
    let result = match media::subscribe(&session, opts, output, stop, |n| eprintln!("{n}")).await {
        Ok(written) => {
            if let Some(w) = written {
                eprintln!("wrote -: {w}");
            }
            Ok(())
        }
        Err(e) => Err(e.error),
    };
    leave(&session, result).await
}

async fn connect(url: &str, verify: Verify) -> anyhow::Result<ClientSession> {
    let opts = ConnectOptions {
        verify,
        ..Default::default()
    };
    ClientSession::connect(url, opts)
        .await
        .with_context(|| format!("connecting to {url}"))
}

/// Tells the relay we leave (so it ends our tracks at once, not at its idle
/// timeout), then passes `result` on, with the relay's reason if it closed
/// the session first.
async fn leave(session: &ClientSession, result: anyhow::Result<()>) -> anyhow::Result<()> {
    let result = match (result, session.close_reason()) {
        (Err(e), Some((_, why))) => Err(e.context(format!("the relay closed the session: {why}"))),
        (Ok(()), Some((code, why))) if code != 0 => {
            Err(anyhow::anyhow!("the relay closed the session: {why}"))
        }
        (r, _) => r,
    };
    let (code, reason) = match &result {
        Ok(()) => (0, "done"),
        Err(_) => (1, "error"),
    };
    session.shutdown(code, reason).await;
    result
}
