//! Helpers shared by the experiments: a small tokio runtime per side of a
//! run, and bounded waits for setup steps.

use std::time::Duration;

use anyhow::{bail, Context};

/// A one-worker multi-thread runtime (each side of a run has its own, in
/// its own network namespace).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// Longest a setup step (connect, accept, subscribe) may take.
pub const STEP: Duration = Duration::from_secs(10);

/// Runs one setup step with the [`STEP`] timeout, naming it in the error.
pub async fn step<T, E: Into<anyhow::Error>>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(STEP, f).await {
        Ok(r) => r.map_err(Into::into).with_context(|| what.to_string()),
        Err(_) => bail!("timed out: {what}"),
    }
}
