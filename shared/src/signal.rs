//! Stopping on SIGTERM or Ctrl-C, for every nodegate binary.

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
///
/// The handlers are installed when this is called, not when the future is
/// first polled: a SIGTERM that arrives right after startup must start a
/// drain, not kill the process. Call it inside a Tokio runtime.
#[cfg(unix)]
pub fn shutdown() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (term, int) => {
                tracing::warn!(
                    term = term.is_ok(),
                    int = int.is_ok(),
                    "cannot install signal handlers; falling back to Ctrl-C only"
                );
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub fn shutdown() -> impl Future<Output = ()> + Send + 'static {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use nix::sys::signal::{Signal, raise};

    use super::*;

    /// A SIGTERM between the call and the first poll is kept, not left to
    /// the default action (which would kill this test process).
    #[tokio::test]
    async fn handlers_are_installed_by_the_call() {
        let stop = shutdown();
        raise(Signal::SIGTERM).unwrap();
        tokio::time::timeout(Duration::from_secs(10), stop)
            .await
            .expect("the SIGTERM sent before polling resolves the future");
    }
}

/// Resolves once a stop flag is set (or its sender is gone). Returns `()`,
/// so no watch guard is held across an await inside `select!`.
pub async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
