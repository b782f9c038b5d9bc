//! Waiting for a condition by polling it, with one time limit for all.

use std::future::Future;
use std::time::Duration;

/// The longest any wait of the scenarios may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// Polls `cond` every 50 ms until it holds; panics with `what` at `WAIT`.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
