//! A test's pruning agent: the real agent with the recording deletion hook,
//! pruning from a watch of every Node or from the test's own roster (then
//! with its publishers), the files it leaves behind, and the restart
//! scenario both sources share.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::DeleteParams;
use nodegate_e2e::cluster::Cluster;
use serde_json::json;
use tempfile::TempDir;

use super::nodes::{create, ip, pod_cidr};
use super::process::Agent;
use super::pruning::{HookCall, call_summaries, hook, own_hook_calls, own_snapshot};
use super::roster::roster_agent_args;
use super::wait::eventually;

/// The temp dir of a pruning agent (also its publishers' home), the hook's
/// records in `hooks` and the agent's `state` dir.
pub struct Pruning {
    dir: TempDir,
    pub hooks: PathBuf,
    pub state: PathBuf,
    /// The recording hook (`pruning::hook`) for `--on-node-delete`.
    hook_cmd: String,
}

impl Pruning {
    pub fn new() -> Pruning {
        let dir = tempfile::tempdir().unwrap();
        let (hooks, state) = (dir.path().join("hooks"), dir.path().join("state"));
        std::fs::create_dir_all(&hooks).unwrap();
        let hook_cmd = hook(&hooks);
        Pruning {
            dir,
            hooks,
            state,
            hook_cmd,
        }
    }

    /// The agent on `node` pruning from a watch of every Node
    /// (`--prune-source=nodes`), with `extra` flags after those.
    pub async fn nodes_agent(&self, c: &Cluster, node: &str, extra: &[&str]) -> Agent {
        let mut args = vec![
            "--on-node-delete",
            self.hook_cmd.as_str(),
            "--prune-source=nodes",
        ];
        args.extend_from_slice(extra);
        Agent::start(c, node, &self.state, &args).await
    }

    /// A publisher replica of `roster` (`Agent::publisher`), at home in the
    /// temp dir.
    pub async fn publisher(&self, c: &Cluster, roster: &str, replica: usize) -> Agent {
        Agent::publisher(c, roster, replica, self.dir.path()).await
    }

    /// The agent on `node` pruning from `roster` (`roster_agent_args`).
    pub async fn roster_agent(&self, c: &Cluster, node: &str, roster: &str) -> Agent {
        Agent::start(
            c,
            node,
            &self.state,
            &roster_agent_args(&self.hook_cmd, roster),
        )
        .await
    }

    /// Publisher replica 0 of `roster`, then the agent on `node` pruning
    /// from it: (publisher, agent).
    pub async fn start_on_roster(&self, c: &Cluster, roster: &str, node: &str) -> (Agent, Agent) {
        let publisher = self.publisher(c, roster, 0).await;
        let agent = self.roster_agent(c, node, roster).await;
        (publisher, agent)
    }

    /// Waits (`what`) until the test's own nodes in the snapshot are `want`.
    pub async fn snapshot_is(
        &self,
        what: &str,
        own: &BTreeSet<String>,
        want: &BTreeMap<String, String>,
    ) {
        eventually(what, || async {
            own_snapshot(&self.state, own).as_ref() == Some(want)
        })
        .await;
    }

    /// The restart scenario's outcome, pruning from either source: workers
    /// `w` 2 and 3 deleted and 4 re-created under its name while the agent
    /// was down, the restarted `agent` rewrites the snapshot with
    /// `want_live`, holds w4's old incarnation and runs the hook exactly for
    /// w2 and w3 (source `snapshot`, their IPs and old uids), the record
    /// with w2's podCIDR and providerID. Returns the test's hook calls.
    pub async fn w2_w3_pruned_w4_held(
        &self,
        agent: &Agent,
        own: &BTreeSet<String>,
        w: &BTreeMap<usize, String>,
        uids: &BTreeMap<String, String>,
        want_live: &BTreeMap<String, String>,
    ) -> Vec<HookCall> {
        self.snapshot_is("snapshot rewritten with the live set", own, want_live)
            .await;
        // w4 was re-created under its name: its old incarnation is held.
        eventually("two hook runs, w4 held", || async {
            own_hook_calls(&self.hooks, own).len() >= 2
                && agent
                    .metric("nodegate_agent_prune_confirmations_total{result=\"conflict_name\"}")
                    .await
                    .is_some_and(|v| v >= 1.0)
        })
        .await;
        let calls = own_hook_calls(&self.hooks, own);
        let want: Vec<_> = (2..=3)
            .map(|i| {
                (
                    w[&i].clone(),
                    "snapshot".into(),
                    ip(i),
                    uids[&w[&i]].clone(),
                )
            })
            .collect();
        assert_eq!(call_summaries(&calls), want);
        assert_eq!(calls[0].3["podCIDRs"], json!([pod_cidr(2)]));
        assert_eq!(
            calls[0].3["providerID"],
            format!("kind://docker/kind/{}", w[&2])
        );
        calls
    }
}

/// The restart scenario's workers `w`: nodes 1 to `n` named `<prefix><i>`,
/// node i with the i-th InternalIP and podCIDR; returns them and their uids.
pub async fn restart_workers(
    c: &Cluster,
    nodes: &Api<Node>,
    prefix: &str,
    n: usize,
) -> (BTreeMap<usize, String>, BTreeMap<String, String>) {
    let w: BTreeMap<usize, String> = (1..=n)
        .map(|i| (i, c.node_name(&format!("{prefix}{i}"))))
        .collect();
    let mut uids = BTreeMap::new();
    for (&i, name) in &w {
        uids.insert(name.clone(), create(nodes, name, i).await);
    }
    (w, uids)
}

/// While the agent is down: w2, w3 and w4 deleted, w4 re-created under its
/// name (a new uid). Returns the live workers (name → uid).
pub async fn delete_w2_to_w4_recreate_w4(
    nodes: &Api<Node>,
    w: &BTreeMap<usize, String>,
    uids: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    for i in 2..=4 {
        nodes
            .delete(&w[&i], &DeleteParams::default())
            .await
            .unwrap();
    }
    let new_w4 = create(nodes, &w[&4], 44).await;
    let mut live = uids.clone();
    live.remove(&w[&2]);
    live.remove(&w[&3]);
    live.insert(w[&4].clone(), new_w4);
    live
}
