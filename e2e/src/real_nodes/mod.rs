//! The real-node suite's harness (`e2e/tests/real_nodes.rs` and its
//! scenario files): the cluster `e2e/real-nodes/cluster` brought up, as a
//! library the scenarios import.
//!
//! From the bottom up (each imports only those above it):
//! - [`objects`]: what a Node or Pod says (gated, boot ID, ready);
//! - [`lines`]: the API server's per-line counters of nodegate's webhook;
//! - [`harness`]: the cluster's state directory, its script, `kubectl` in a
//!   fresh work directory, figures, polling with a deadline;
//! - [`record`]: what the watches saw ([`crate::observe`] keeping whole
//!   objects), by resourceVersion;
//! - [`audit`]: who wrote a Node, from the API server's audit log;
//! - [`live`]: reads and waits on the live cluster;
//! - [`admission`]: admission as a client sees it (canary creates beside
//!   the per-line counters, over a window);
//! - [`scenario`]: [`scenario::Ctx`], what every scenario after the install
//!   shares, and the steps several take ([`scenario::crash_to_new_boot`]).
//!
//! A test-support library: it panics with the step's name where a test
//! would fail.

pub mod admission;
pub mod audit;
pub mod harness;
pub mod lines;
pub mod live;
pub mod objects;
pub mod record;
pub mod scenario;
