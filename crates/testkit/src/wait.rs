//! Deadlines and polls, so a hung step fails a test instead of blocking CI.

use std::time::Duration;

/// Waits (at most `secs`) until `cond` holds.
pub async fn until_async<F: std::future::Future<Output = bool>>(
    secs: u64,
    mut cond: impl FnMut() -> F,
) {
    within(secs, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Runs `f` with a deadline so a hung test fails instead of blocking CI.
pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test step timed out")
}

/// Waits (at most 5 s) until `track` forwards: a subscription reached its
/// publisher, so what it writes now goes out.
pub async fn until_forwarding(track: &quichub_client::LocalTrack) {
    within(5, async {
        while !track.is_forwarding() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}
