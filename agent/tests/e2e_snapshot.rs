//! End-to-end, the snapshot file: moved aside when corrupt, never torn by a
//! kill -9, written at most once per interval. The harness and
//! real-cluster mode: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::api::{DeleteParams, Patch, PatchParams};
use nodegate_agent::snapshot;
use serde_json::json;

use support::nodes::{cluster, create};
use support::process::Agent;
use support::pruning::{own_hook_calls, own_snapshot, read_snapshot};
use support::pruning_agent::Pruning;
use support::wait::eventually;

/// A corrupt snapshot is moved aside and counted; the agent keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_snapshot_is_moved_aside() {
    let (c, nodes) = cluster().await;
    let (w1_name, own_node) = (c.node_name("w1"), c.node_name("self"));
    let own = BTreeSet::from([w1_name.clone(), own_node.clone()]);
    let w1 = create(&nodes, &w1_name, 1).await;
    create(&nodes, &own_node, 100).await;

    let pruning = Pruning::new();
    let (hooks, state) = (&pruning.hooks, &pruning.state);
    std::fs::create_dir_all(state).unwrap();
    let garbage = br#"{"version":1,"nodes":[{"name":"gone","uid":"#;
    std::fs::write(snapshot::path_in(state), garbage).unwrap();

    let mut agent = pruning.nodes_agent(&c, &own_node, &[]).await;
    eventually("ready", || agent.ready()).await;
    eventually("fresh snapshot", || async {
        own_snapshot(state, &own) == Some(BTreeMap::from([(w1_name.clone(), w1.clone())]))
    })
    .await;
    let aside: Vec<PathBuf> = std::fs::read_dir(state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("nodes.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "moved aside once");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), garbage);
    assert!(agent.logged("WARN") && agent.logged("unusable snapshot moved aside"));
    assert_eq!(
        agent.metric("nodegate_agent_snapshot_corrupt_total").await,
        Some(1.0)
    );
    assert!(
        own_hook_calls(hooks, &own).is_empty(),
        "treated as empty: nothing pruned"
    );
    // Still working: a live deletion is handled.
    nodes
        .delete(&w1_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("hook after the corrupt start", || async {
        own_hook_calls(hooks, &own).len() == 1
    })
    .await;
    assert!(agent.term().await.success());
}

fn temp_files(state: &Path) -> usize {
    std::fs::read_dir(state)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(".nodes.json.tmp-")
                })
                .count()
        })
        .unwrap_or(0)
}

/// kill -9 while snapshots are being written under node churn: the file is
/// always a complete snapshot, never torn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_snapshot_writes_never_tears_the_file() {
    const N: usize = 600;
    let (c, nodes) = cluster().await;
    let names: Vec<String> = (0..N).map(|i| c.node_name(&format!("w{i:03}"))).collect();
    let own: BTreeSet<String> = names.iter().cloned().collect();
    for (i, name) in names.iter().enumerate() {
        create(&nodes, name, i).await;
    }
    let own_node = c.node_name("self");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");

    // Churn: label changes keep the set dirty, so writes never stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (nodes, stop, names) = (nodes.clone(), stop.clone(), names.clone());
        tokio::spawn(async move {
            let mut k = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = &names[k % N];
                let patch = json!({"metadata": {"labels": {"churn": k.to_string()}}});
                let _ = nodes
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await;
                k += 1;
            }
        })
    };

    let mut mid_write = 0;
    for round in 0..8u32 {
        let mut agent = Agent::start(
            &c,
            &own_node,
            &state,
            &[
                "--snapshot-interval",
                "5ms",
                "--taint-on-shutdown=false",
                "--on-node-delete=true",
                "--prune-source=nodes",
            ],
        )
        .await;
        let series = "nodegate_agent_snapshot_write_duration_seconds_count";
        let want = f64::from(3 + round % 3);
        eventually("snapshot writes under way", || async {
            agent.metric(series).await.unwrap_or(0.0) >= want
        })
        .await;
        // Aim the kill at a write in progress: its temp file exists.
        eventually("a write in progress", || async { temp_files(&state) > 0 }).await;
        agent.kill9().await;
        let snap = own_snapshot(&state, &own).expect("a snapshot exists");
        assert_eq!(snap.len(), N, "round {round}: complete snapshot");
        // A temp file left behind means the kill landed mid-write.
        mid_write += temp_files(&state);
    }
    eprintln!("kills that landed mid-write: {mid_write} of 8");
    assert!(
        mid_write > 0,
        "no kill landed mid-write: the test proved nothing"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.await.unwrap();
    let corrupt = std::fs::read_dir(&state)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("corrupt")
        })
        .count();
    assert_eq!(corrupt, 0, "no restart ever found a torn snapshot");
}

/// A burst of Node events is coalesced: at most one snapshot write per
/// `--snapshot-interval`, not one per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_node_events_is_coalesced_into_few_writes() {
    const BURST: usize = 200;
    let (c, nodes) = cluster().await;
    let own_node = c.node_name("self");
    create(&nodes, &own_node, 1000).await;
    let names: Vec<String> = (0..BURST)
        .map(|i| c.node_name(&format!("b{i:03}")))
        .collect();
    let own: BTreeSet<String> = names.iter().cloned().collect();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &[
            "--snapshot-interval",
            "1s",
            "--on-node-delete=true",
            "--prune-source=nodes",
        ],
    )
    .await;
    let writes = "nodegate_agent_snapshot_write_duration_seconds_count";
    eventually("first snapshot", || async {
        agent.metric(writes).await.unwrap_or(0.0) >= 1.0
    })
    .await;
    let before = agent.metric(writes).await.unwrap();
    let started = std::time::Instant::now();
    for (i, name) in names.iter().enumerate() {
        create(&nodes, name, i).await;
    }
    eventually("all burst nodes in the snapshot", || async {
        own_snapshot(&state, &own).is_some_and(|s| s.len() == BURST)
    })
    .await;
    let extra = agent.metric(writes).await.unwrap() - before;
    // One write per started second of the burst, plus the one in flight.
    let bound = started.elapsed().as_secs_f64().ceil() + 1.0;
    assert!(
        extra >= 1.0 && extra <= bound,
        "{BURST} events cost {extra} writes (bound {bound})"
    );
    // The gauge is the snapshot's size (on a real cluster: other nodes too).
    eventually("snapshot_nodes = nodes in the snapshot file", || async {
        let in_file = read_snapshot(&state).map_or(0, |s| s.len());
        agent.metric("nodegate_agent_snapshot_nodes").await == Some(in_file as f64)
    })
    .await;
    assert!(agent.term().await.success());
}
