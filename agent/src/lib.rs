//! Per-node agent: readiness gate, shutdown re-taint and stale-node pruning.
//!
//! Each job is a pure state machine (event in, actions out) with a thin
//! loop doing its I/O:
//!
//! - the readiness gate: [`gate`] decides from [`readiness`] (the probe
//!   thresholds), [`node_patch`] (what to write on the own Node) and
//!   [`autoscaler`] (an autoscaler's mark on a node it did not wait for);
//!   [`gate_loop`] runs the [`probe`]s and sends the writes through
//!   [`node_writer`]; both read one [`taint_set`]. On SIGTERM [`removal`]
//!   tells a removal of nodegate from a stop, from the reads
//!   [`removal_check`] makes: a stop re-taints the node, a removal opens it.
//! - pruning (only with a deletion handler): [`prune`] keeps the live set of
//!   the roster's [`nodegate_roster::record`]s and has each [`deletion`]
//!   confirmed ([`confirm`]); [`prune_loop`] follows the node roster (or
//!   every Node with `--prune-source=nodes`), persists the [`snapshot`] and
//!   runs the [`handler`]s.
//! - the shared admin port serves health and [`metrics`]; [`agent::run`]
//!   wires it up.
//!
//! Modules import one way: the pure ones (`taint_set`, `deletion`,
//! `readiness`, `removal`, `node_patch`, `autoscaler`, `confirm`, `gate`, `prune`)
//! never use the loops, and no module imports through this root.

pub mod agent;
pub mod autoscaler;
pub mod config;
pub mod confirm;
pub mod deletion;
pub mod gate;
pub mod gate_loop;
pub mod handler;
pub mod metrics;
pub mod node_patch;
pub mod node_writer;
pub mod probe;
mod process;
pub mod prune;
pub mod prune_loop;
pub mod readiness;
pub mod removal;
pub mod removal_check;
pub mod snapshot;
pub mod taint_set;
pub mod watch;

/// The node record, shared with the roster publisher. The agent imports it
/// from `nodegate_roster`; this path stays for the crates that embed the
/// agent (sim, e2e, bench) until they do too.
pub use nodegate_roster::record;

pub use agent::{run, run_with_client, run_with_handlers};
pub use config::Args;
