//! Per-node agent: readiness gate, shutdown re-taint and stale-node pruning.
//!
//! - [`gate`] runs the [`probe`]s and, through [`taint`], removes the
//!   nodegate taint from its own Node once the network agent is ready.
//! - [`prune`] watches all Nodes as slim [`record`]s, persists them as a
//!   [`snapshot`] and dispatches deletions (live or missed while down) to
//!   [`handler`]s.
//! - [`admin`] serves health and [`metrics`]; [`agent::run`] wires it up.

pub mod admin;
pub mod agent;
pub mod config;
pub mod gate;
pub mod handler;
pub mod metrics;
pub mod probe;
mod process;
pub mod prune;
pub mod record;
pub mod snapshot;
pub mod taint;

pub use agent::{run, run_with_client, run_with_handlers};
pub use config::Args;

/// Resolves once the stop flag is set (or its sender is gone). Returns `()`
/// so no watch guard is held across an await in `select!`.
pub(crate) async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
