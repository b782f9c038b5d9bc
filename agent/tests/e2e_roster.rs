//! End-to-end, pruning from the node roster (`--prune-source=roster`, the
//! default): across an agent restart, a publisher failover, a roster being
//! rebuilt. The harness and real-cluster mode: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{DeleteParams, PostParams};

use support::nodes::{cluster, create};
use support::pruning::{own_hook_calls, own_snapshot};
use support::pruning_agent::{Pruning, delete_w2_to_w4_recreate_w4, restart_workers};
use support::roster::{SHARDS, roster, roster_members, shards_api};
use support::wait::eventually;

/// Agent stopped; three nodes deleted (one re-created under its name) and
/// the roster updated; agent restarted → the hook ran exactly for those
/// three, source `snapshot`, with their old uids and the roster's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_restart_prunes_exactly_the_nodes_deleted_while_down() {
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let (w, uids) = restart_workers(&c, &nodes, "rw", 5).await;
    let own_node = c.node_name("rself");
    let own: BTreeSet<String> = w.values().chain([&own_node]).cloned().collect();
    create(&nodes, &own_node, 100).await;
    let pruning = Pruning::new();
    let (mut publisher, mut agent) = pruning.start_on_roster(&c, &roster, &own_node).await;
    pruning
        .snapshot_is("snapshot of the five workers from the roster", &own, &uids)
        .await;
    assert_eq!(
        agent.metric("nodegate_agent_roster_complete").await,
        Some(1.0)
    );
    assert!(agent.term().await.success());

    let want_live = delete_w2_to_w4_recreate_w4(&nodes, &w, &uids).await;
    let new_w4 = &want_live[&w[&4]];
    let mut in_roster = want_live.clone();
    in_roster.insert(own_node.clone(), String::new());
    eventually("the roster shows the deletions", || async {
        roster_members(&nodes, &roster, &own)
            .await
            .is_some_and(|m| m.keys().eq(in_roster.keys()) && m.get(&w[&4]) == Some(new_w4))
    })
    .await;

    let mut agent = pruning.roster_agent(&c, &own_node, &roster).await;
    let calls = pruning
        .w2_w3_pruned_w4_held(&agent, &own, &w, &uids, &want_live)
        .await;
    // The roster's record: what a handler cleans up by, without labels or boot ID.
    assert!(calls[0].3.get("labels").is_none() && calls[0].3.get("bootID").is_none());
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}

/// Two publishers; the leader is SIGKILLed in the middle of a churn of
/// joins and deletes (each node listed in the roster before it leaves, so
/// the agent knew it). The standby takes over after the lease expires; the
/// running agent's hook ran exactly once for every deleted node (its uid),
/// never for a live one, and its snapshot ends equal to the live set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_leader_killed_during_churn_loses_nothing() {
    const CHURN: usize = 12;
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let pruning = Pruning::new();
    let mut pubs = [
        pruning.publisher(&c, &roster, 0).await,
        pruning.publisher(&c, &roster, 1).await,
    ];
    let own_node = c.node_name("cself");
    create(&nodes, &own_node, 250).await;
    let mut names: Vec<String> = (0..CHURN * 2)
        .map(|i| c.node_name(&format!("c{i:02}")))
        .collect();
    names.push(own_node.clone());
    let own: BTreeSet<String> = names.iter().cloned().collect();
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    for (i, name) in names.iter().take(4).enumerate() {
        live.insert(name.clone(), create(&nodes, name, 200 + i).await);
    }
    let mut agent = pruning.roster_agent(&c, &own_node, &roster).await;
    pruning
        .snapshot_is("first snapshot from the roster", &own, &live)
        .await;

    let mut deleted: BTreeSet<(String, String)> = BTreeSet::new();
    let mut killed = None;
    for k in 0..CHURN {
        let joining = &names[4 + k];
        let uid = create(&nodes, joining, 210 + k).await;
        live.insert(joining.clone(), uid.clone());
        // Each node is in the roster before it leaves: the agent knew it, so
        // its deletion must reach the hook (across the failover too).
        eventually("the joining node in the roster", || async {
            roster_members(&nodes, &roster, &own)
                .await
                .is_some_and(|m| m.get(joining) == Some(&uid))
        })
        .await;
        let leaving = names[k].clone();
        let uid = live.remove(&leaving).unwrap();
        nodes
            .delete(&leaving, &DeleteParams::default())
            .await
            .unwrap();
        deleted.insert((leaving, uid));
        if k == CHURN / 2 {
            let mut leader = None;
            for (i, p) in pubs.iter().enumerate() {
                if p.metric("nodegate_roster_leader").await == Some(1.0) {
                    leader = Some(i);
                }
            }
            let i = leader.expect("one publisher leads");
            pubs[i].kill9().await;
            killed = Some(i);
        }
    }
    let standby = 1 - killed.unwrap();
    eventually("the standby leads", || async {
        pubs[standby].metric("nodegate_roster_leader").await == Some(1.0)
    })
    .await;
    pruning
        .snapshot_is("snapshot equals the live set", &own, &live)
        .await;
    eventually("a hook run per deleted node", || async {
        own_hook_calls(&pruning.hooks, &own).len() >= deleted.len()
    })
    .await;
    let calls: Vec<(String, String)> = own_hook_calls(&pruning.hooks, &own)
        .iter()
        .map(|(n, _, _, rec)| (n.clone(), rec["uid"].as_str().unwrap().to_string()))
        .collect();
    let once: BTreeSet<(String, String)> = calls.iter().cloned().collect();
    assert_eq!(once.len(), calls.len(), "a node pruned twice: {calls:?}");
    assert_eq!(once, deleted, "lost or false prunes");
    assert!(agent.term().await.success());
    assert!(pubs[standby].term().await.success());
}

/// While the agent restarts, one shard is rewritten under a new epoch
/// without its nodes, as a rebuild in progress would leave it. The agent
/// sees an incomplete roster and prunes nothing, not even the nodes missing
/// from the rewritten shard; once the publisher has rewritten every shard,
/// exactly the node deleted meanwhile is pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_partial_view_during_agent_restart_prunes_nothing() {
    use nodegate_roster::shard;
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let w: Vec<String> = (0..8).map(|i| c.node_name(&format!("p{i}"))).collect();
    let own_node = c.node_name("pself");
    let own: BTreeSet<String> = w.iter().chain([&own_node]).cloned().collect();
    let mut uids = BTreeMap::new();
    for (i, name) in w.iter().enumerate() {
        uids.insert(name.clone(), create(&nodes, name, 300 + i).await);
    }
    create(&nodes, &own_node, 400).await;
    let pruning = Pruning::new();
    let (mut publisher, mut agent) = pruning.start_on_roster(&c, &roster, &own_node).await;
    pruning.snapshot_is("first snapshot", &own, &uids).await;
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());

    // Deleted while everything is down.
    let gone = w[0].clone();
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    // A shard holding another test node, rewritten empty under a new epoch.
    let api = shards_api(&nodes);
    let victim = w[1..]
        .iter()
        .map(|n| shard::shard_of(n, SHARDS))
        .filter(|&i| i != shard::shard_of(&gone, SHARDS))
        // The highest: the publisher writes it last, the moment a reader
        // would see the epoch complete if the publisher adopted it.
        .max()
        .expect("test nodes in two shards");
    let missing: Vec<String> = w[1..]
        .iter()
        .filter(|n| shard::shard_of(n, SHARDS) == victim)
        .cloned()
        .collect();
    let mut cm = api.get(&shard::name_of(&roster, victim)).await.unwrap();
    let epoch = shard::decode(&roster, &cm).unwrap().epoch;
    cm.data = shard::config_map(
        "nodegate",
        &roster,
        victim,
        shard::encode(epoch + 1, victim, SHARDS, []),
    )
    .data;
    api.replace(
        &shard::name_of(&roster, victim),
        &PostParams::default(),
        &cm,
    )
    .await
    .unwrap();

    let mut agent = pruning.roster_agent(&c, &own_node, &roster).await;
    eventually("the agent holds every shard", || async {
        agent.metric("nodegate_agent_roster_shards").await == Some(f64::from(SHARDS))
    })
    .await;
    assert_eq!(
        agent.metric("nodegate_agent_roster_complete").await,
        Some(0.0)
    );
    assert!(!agent.ready().await, "not ready before a complete view");
    assert!(
        own_hook_calls(&pruning.hooks, &own).is_empty(),
        "nothing pruned from a partial view"
    );
    assert_eq!(
        own_snapshot(&pruning.state, &own).as_ref(),
        Some(&uids),
        "snapshot kept as it was"
    );

    let mut publisher = pruning.publisher(&c, &roster, 0).await;
    let mut want = uids.clone();
    want.remove(&gone);
    pruning
        .snapshot_is("snapshot equals the live set", &own, &want)
        .await;
    eventually("one hook run", || async {
        !own_hook_calls(&pruning.hooks, &own).is_empty()
    })
    .await;
    let calls = own_hook_calls(&pruning.hooks, &own);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str()),
        (gone.as_str(), "snapshot")
    );
    assert_eq!(calls[0].3["uid"], uids[&gone].as_str());
    assert!(
        !missing.is_empty()
            && missing
                .iter()
                .all(|m| own_snapshot(&pruning.state, &own).unwrap().contains_key(m))
    );
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}
