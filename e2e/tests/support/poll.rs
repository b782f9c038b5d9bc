//! Waiting for the cluster by polling: a positive property within a
//! deadline, a negative one throughout a window.

use std::future::Future;
use std::time::Duration;

/// Polls `f` until it holds; fails after `deadline`.
pub async fn eventually(what: &str, deadline: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + deadline;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < end,
            "not within {deadline:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts `f` holds on every poll for the whole window (a negative
/// property needs a window; it is longer than the positive 1 s bound).
pub async fn throughout(what: &str, window: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        assert!(f().await, "violated: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `cond` every 50 ms until it returns `Some`, at most `deadline`.
pub async fn eventually_some<T, F, Fut>(what: &str, deadline: Duration, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + deadline;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
    }
}
