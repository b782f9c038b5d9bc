//! `nodegate-sim`: the demo. `run` plays a scale-out and a reboot wave twice —
//! with the real webhook and without — next to a naive scheduler, and counts
//! pods that landed on a node whose network agent was not ready. `serve`
//! keeps an emulator with the real webhook up for kubectl.
//!
//! The model: a kubelet reports Ready shortly after it starts; a stand-in
//! node lifecycle controller turns `node.kubernetes.io/not-ready` on and off
//! from the Ready condition (strategic merge patch of the whole taint list
//! with a resourceVersion lock, as the real one does); the real
//! nodegate-agent logic runs for every node in this process ([`fleet`]); the
//! simulated network agent is ready only later, and then writes the file the
//! agent probes. After the reboot wave, the pruning agents are stopped, nodes
//! are deleted (one re-created) and the agents restarted: their deletion
//! handlers must run exactly for the nodes deleted meanwhile.
//!
//! `run --strict` compares strict mode's boot gate on and off: pods already
//! bound to rebooting nodes, kubelets that admit them as the kubelet does,
//! the taint-eviction controller, and agent restarts on the same boot.
//!
//! Modules, one way down: `strict` (the strict-mode run) uses `scenario`'s
//! options, `fleet` and `strict_report` (its table and guarantees, pure,
//! drawn with `report`'s table);
//! `scenario` (the run) uses `fleet` (the agents), `publishers` (the roster
//! publishers) and `report` (the table and the guarantees, pure); `serve`
//! (the kubectl playground) uses `publishers`; `lock` is at the bottom.

mod fleet;
mod lock;
pub mod publishers;
mod report;
mod scenario;
mod serve;
mod strict;
mod strict_report;

pub use fleet::{Dispatched, Fleet, Recorder};
pub use report::{PruneReport, ScenarioReport, broken_guarantees, render_table};
pub use scenario::{AdmissionMode, RunOptions, run, run_scenario};
pub use serve::serve;
pub use strict::{run_strict, strict_scenario};
pub use strict_report::{StrictReport, broken_strict_guarantees, render_strict_table};
