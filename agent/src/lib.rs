//! Per-node agent: readiness gate, shutdown re-taint and stale-node pruning.
//!
//! - [`gate`] runs the [`probe`]s and, through [`taint`], removes the
//!   nodegate taint from its own Node once the network agent is ready.
//! - [`prune`] (only with a deletion handler) follows the node roster, or
//!   every Node with `--prune-source=nodes`, as slim [`record`]s, persists
//!   them as a [`snapshot`] and dispatches deletions (live or missed while
//!   down) to [`handler`]s.
//! - the shared admin port serves health and [`metrics`]; [`agent::run`]
//!   wires it up.

pub mod agent;
pub mod config;
pub mod confirm;
pub mod gate;
pub mod handler;
pub mod metrics;
pub mod probe;
mod process;
pub mod prune;
/// The slim Node record, shared with the roster publisher.
pub use nodegate_roster::record;
pub mod snapshot;
pub mod taint;

pub use agent::{run, run_with_client, run_with_handlers};
pub use config::Args;

pub(crate) use nodegate_shared::signal::stopped;
