//! A stand-in of cilium-operator's node-taint controller
//! (`operator/watchers/node_taint.go` and `node_taint_cell.go` in
//! cilium/cilium): it removes the agent-not-ready taint (every taint with
//! the key) from a node once a Cilium pod there is Ready, sets the
//! `NetworkUnavailable=False/CiliumIsUp` condition, and — with
//! `set-cilium-node-taints` — adds `key:NoSchedule` to a node whose Cilium
//! pod is scheduled but not Ready. It acts on informer caches, stale ones
//! included, guarding its taint writes with a JSON patch `test`, as
//! upstream does; so tests can run nodegate next to it.
//!
//! What it leaves out, none of which touches Node taints: leader election
//! (it runs as one replica; the operator's standby replicas write nothing),
//! the operator's other controllers (CiliumNode and IPAM, the restart of
//! pods "not managed by Cilium", identity and endpoint garbage collection),
//! its metrics, and the in-cluster mount of its ConfigMap (it reads the
//! ConfigMap through the API once at start, with its own ServiceAccount's
//! token, from outside the cluster).
//!
//! `config` parses the `cilium-config` ConfigMap, `source` reads it,
//! `decide` is the pure decision, `queue` the node work queue, `run` the
//! watches and workers;
//! the binary is `cilium-operator-standin`.

pub mod config;
pub mod decide;
pub mod queue;
pub mod run;
pub mod source;

pub use config::OperatorConfig;
pub use run::{Controller, Counts, Options, WriteRecord};
