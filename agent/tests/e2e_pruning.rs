//! End-to-end, pruning from a watch on every Node (`--prune-source=nodes`):
//! deletions missed while the agent was down, one interrupted by a crash,
//! in-process handlers. The harness and real-cluster mode: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use kube::api::DeleteParams;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use support::nodes::{cluster, create, ip};
use support::process::Agent;
use support::pruning::{hook_calls, own_hook_calls, own_snapshot, read_snapshot};
use support::pruning_agent::{Pruning, delete_w2_to_w4_recreate_w4, restart_workers};
use support::wait::eventually;

/// Agent stopped; three nodes deleted (one re-created under its name);
/// agent restarted → the hook ran exactly for those three, from the
/// snapshot, with the stored records; never for live nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_prunes_exactly_the_nodes_deleted_while_down() {
    let (c, nodes) = cluster().await;
    let (w, uids) = restart_workers(&c, &nodes, "w", 6).await;
    let own_node = c.node_name("self");
    let own: BTreeSet<String> = w.values().chain([&own_node]).cloned().collect();
    let own_uid = create(&nodes, &own_node, 100).await;
    assert!(!own_uid.is_empty());

    let pruning = Pruning::new();
    let extra = ["--taint-on-shutdown=false"];

    let mut agent = pruning.nodes_agent(&c, &own_node, &extra).await;
    eventually("/readyz after the first list", || agent.ready()).await;
    pruning
        .snapshot_is("snapshot of the six workers", &own, &uids)
        .await;
    assert!(agent.term().await.success());
    assert!(
        own_hook_calls(&pruning.hooks, &own).is_empty(),
        "first start: nothing pruned"
    );

    // While the agent is down.
    let want_live = delete_w2_to_w4_recreate_w4(&nodes, &w, &uids).await;
    assert_ne!(want_live[&w[&4]], uids[&w[&4]]);

    let mut agent = pruning.nodes_agent(&c, &own_node, &extra).await;
    // The rewritten snapshot means the first list was processed in full.
    let calls = pruning
        .w2_w3_pruned_w4_held(&agent, &own, &w, &uids, &want_live)
        .await;
    // The full stored record went to the hook, the boot ID too.
    assert_eq!(calls[0].3["bootID"], format!("boot-{}", w[&2]));
    snapshot_prunes_are_counted(&agent, &pruning.hooks).await;

    // A live deletion is dispatched from the watch.
    nodes
        .delete(&w[&5], &DeleteParams::default())
        .await
        .unwrap();
    eventually("watch deletion hook", || async {
        own_hook_calls(&pruning.hooks, &own).len() == 3
    })
    .await;
    let calls = own_hook_calls(&pruning.hooks, &own);
    let w5 = calls.iter().find(|c| c.0 == w[&5]).expect("w5 hook");
    assert_eq!((w5.1.as_str(), w5.2.as_str()), ("watch", ip(5).as_str()));
    assert!(
        calls
            .iter()
            .all(|c| ![&w[&1], &w[&4], &w[&6], &own_node].contains(&&c.0)),
        "never for live nodes or the own node: {calls:?}"
    );
    assert!(agent.term().await.success());
}

/// The counter counts every snapshot prune the hook ran (on a real cluster
/// that may include other tests' nodes deleted meanwhile).
async fn snapshot_prunes_are_counted(agent: &Agent, hooks: &Path) {
    eventually(
        "pruned_nodes_total{source=snapshot} = snapshot hook runs",
        || async {
            let runs = hook_calls(hooks)
                .iter()
                .filter(|c| c.1 == "snapshot")
                .count();
            agent
                .metric("nodegate_agent_pruned_nodes_total{source=\"snapshot\"}")
                .await
                == Some(runs as f64)
        },
    )
    .await;
}

/// A deletion whose handler had not finished when the agent was killed is
/// still in the snapshot, so the restarted agent runs it (source snapshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_interrupted_by_a_crash_is_retried_after_restart() {
    let (c, nodes) = cluster().await;
    let [w1_name, w2_name, w3_name, own_node] = ["w1", "w2", "w3", "self"].map(|b| c.node_name(b));
    let own = BTreeSet::from([
        w1_name.clone(),
        w2_name.clone(),
        w3_name.clone(),
        own_node.clone(),
    ]);
    let w1 = create(&nodes, &w1_name, 1).await;
    let w2 = create(&nodes, &w2_name, 2).await;
    create(&nodes, &own_node, 100).await;

    let pruning = Pruning::new();
    let pid_file = pruning.hooks.join("blocked.pid");
    // Blocks on w1 only: on a real cluster other nodes come and go.
    let blocking = format!(
        "[ \"$NODEGATE_NODE_NAME\" != {w1_name} ] || {{ echo $$ > {p}.tmp && mv {p}.tmp {p} && exec sleep 60; }}",
        p = pid_file.display()
    );
    let mut agent = Agent::start(
        &c,
        &own_node,
        &pruning.state,
        &[
            "--on-node-delete",
            &blocking,
            "--prune-source=nodes",
            "--on-node-delete-timeout",
            "120s",
        ],
    )
    .await;
    eventually("first snapshot", || async {
        own_snapshot(&pruning.state, &own).is_some_and(|s| s.len() == 2)
    })
    .await;

    nodes
        .delete(&w1_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("hook for w1 started", || async { pid_file.exists() }).await;
    let w3 = create(&nodes, &w3_name, 3).await;
    eventually("snapshot written after the deletion", || async {
        read_snapshot(&pruning.state).is_some_and(|s| s.contains_key(&w3_name))
    })
    .await;
    let snap = read_snapshot(&pruning.state).unwrap();
    assert_eq!(
        snap.get(&w1_name),
        Some(&w1),
        "unhandled deletion kept: {snap:?}"
    );

    agent.kill9().await;
    let hook_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = kill(Pid::from_raw(hook_pid), Signal::SIGKILL);

    let mut agent = pruning.nodes_agent(&c, &own_node, &[]).await;
    eventually("w1 handled after restart", || async {
        own_hook_calls(&pruning.hooks, &own).len() == 1
    })
    .await;
    let calls = own_hook_calls(&pruning.hooks, &own);
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str()),
        (w1_name.as_str(), "snapshot")
    );
    assert_eq!(calls[0].3["uid"], w1.as_str());
    eventually("w1 leaves the snapshot once handled", || async {
        own_snapshot(&pruning.state, &own)
            == Some(BTreeMap::from([
                (w2_name.clone(), w2.clone()),
                (w3_name.clone(), w3.clone()),
            ]))
    })
    .await;
    assert!(agent.term().await.success());
}

/// Records every dispatched deletion (an embedding simulator's handler).
#[derive(Default)]
struct Recording(Mutex<Vec<(String, String, nodegate_agent::handler::DeleteSource)>>);

impl nodegate_agent::handler::NodeDeleteHandler for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    fn handle<'a>(
        &'a self,
        node: &'a nodegate_roster::record::NodeRecord,
        source: nodegate_agent::handler::DeleteSource,
    ) -> futures::future::BoxFuture<'a, Result<(), nodegate_agent::handler::HandlerError>> {
        self.0
            .lock()
            .unwrap()
            .push((node.name.clone(), node.uid.clone(), source));
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn in_process_handlers_get_the_deletions_missed_while_down() {
    use clap::Parser;
    use nodegate_agent::handler::DeleteSource;
    let (c, nodes) = cluster().await;
    let [own_node, keep_name, gone_name] = ["own", "keep", "gone"].map(|b| c.node_name(b));
    let own = BTreeSet::from([own_node.clone(), keep_name.clone(), gone_name.clone()]);
    create(&nodes, &own_node, 1).await;
    let keep = create(&nodes, &keep_name, 2).await;
    let gone = create(&nodes, &gone_name, 3).await;
    let state = tempfile::tempdir().unwrap();
    let args = || {
        nodegate_agent::Args::try_parse_from([
            "nodegate-agent".as_ref(),
            "--node-name".as_ref(),
            own_node.as_ref(),
            "--state-dir".as_ref(),
            state.path().as_os_str(),
            "--snapshot-interval".as_ref(),
            "100ms".as_ref(),
            "--admin-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--prune-source=nodes".as_ref(),
        ])
        .unwrap()
    };
    let client = c.agent_client(&own_node).await.unwrap();
    let run = |rec: Arc<Recording>| {
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(nodegate_agent::run_with_handlers(
            args(),
            client.clone(),
            vec![rec as Arc<dyn nodegate_agent::handler::NodeDeleteHandler>],
            async move {
                let _ = rx.await;
            },
        ));
        (stop, task)
    };

    let first = Arc::new(Recording::default());
    let (stop, task) = run(first.clone());
    let want: BTreeMap<String, String> = [
        (keep_name.clone(), keep.clone()),
        (gone_name.clone(), gone.clone()),
    ]
    .into();
    eventually("first snapshot", || async {
        own_snapshot(state.path(), &own).as_ref() == Some(&want)
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();

    nodes
        .delete(&gone_name, &DeleteParams::default())
        .await
        .unwrap();
    let second = Arc::new(Recording::default());
    let (stop, task) = run(second.clone());
    let want: BTreeMap<String, String> = [(keep_name.clone(), keep)].into();
    eventually("snapshot without the deleted node", || async {
        own_snapshot(state.path(), &own).as_ref() == Some(&want)
    })
    .await;
    let own_calls = |r: &Recording| {
        let mut v = r.0.lock().unwrap().clone();
        v.retain(|(name, _, _)| own.contains(name));
        v
    };
    assert!(own_calls(&first).is_empty());
    assert_eq!(
        own_calls(&second),
        vec![(gone_name.clone(), gone, DeleteSource::Snapshot)]
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}
