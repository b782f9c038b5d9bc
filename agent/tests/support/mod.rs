//! The harness of the agent's end-to-end scenarios (the `e2e_*` test
//! files): the real `nodegate-agent` binary against a fresh emulated API
//! server with the real webhook and the shipped RBAC — or, when
//! `NODEGATE_E2E_KUBECONFIG` names a kubeconfig, a real cluster with nodegate
//! installed (`nodegate_e2e::cluster::Cluster`). The same tests and
//! assertions run in both: every name a test makes is unique to it on a real
//! cluster, and what it asserts about the node set (snapshots, prunes) is
//! about its own nodes, so other nodes and parallel tests never disturb it.
//! On a real cluster the scenarios share the node set: run them one at a
//! time (`--test-threads=1`).
// Each scenario file compiles this module for itself and uses only part
// of it.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod nodes;
pub mod process;
pub mod pruning;
pub mod pruning_agent;
pub mod roster;
pub mod wait;
