//! End-to-end, forged roster shards: every deletion they suggest is
//! confirmed with the API server first, so no handler runs for a live
//! node or with a live node's values. The harness and real-cluster mode:
//! `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kube::api::DeleteParams;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_roster::record::{NodeAddress, NodeRecord};
use nodegate_roster::shard;
use serde_json::json;

use support::nodes::{cluster, create, ip, pod_cidr};
use support::process::Agent;
use support::pruning::{hook_calls, own_hook_calls, own_snapshot};
use support::pruning_agent::Pruning;
use support::roster::{
    forge_shard, name_in_shard0, roster, roster_members, roster_writer, shards_api,
};
use support::wait::eventually;

/// Deletion-confirmation GETs the agent made so far (every result).
async fn confirmations(agent: &Agent) -> f64 {
    let mut n = 0.0;
    for r in ["gone", "live", "error"] {
        let series = format!("nodegate_agent_prune_confirmations_total{{result=\"{r}\"}}");
        n += agent.metric(&series).await.unwrap_or(0.0);
    }
    n
}

/// What the phases of a forgery scenario watch: the agent pruning from the
/// test's roster, its hook's calls and snapshot, the test's live nodes.
struct Watched<'a> {
    c: &'a Cluster,
    agent: &'a Agent,
    roster: &'a str,
    hooks: &'a Path,
    state: &'a Path,
    own: &'a BTreeSet<String>,
    uids: &'a BTreeMap<String, String>,
}

impl Watched<'_> {
    /// One of the agent's series; 0 while it is absent.
    async fn metric(&self, series: &str) -> f64 {
        self.agent.metric(series).await.unwrap_or(0.0)
    }
}

/// With the publisher down, `attacker` overwrites shard 0 with the one-shard
/// empty roster: with the u64::MAX epoch (rejected, so the roster turns
/// incomplete), then with `epoch`, one a publisher could have written (a
/// complete, empty roster: held and refused after a GET). No handler runs
/// for a live node, and the snapshot keeps every one.
async fn forged_empty_rosters_prune_nothing(s: &Watched<'_>, attacker: &str, epoch: u64) {
    let rejected = s
        .metric("nodegate_agent_roster_shards_rejected_total")
        .await;
    forge_shard(
        s.c,
        attacker,
        s.roster,
        r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#,
    )
    .await;
    // Both metrics: one event updates them one after the other.
    eventually("the forged epoch rejected: roster incomplete", || async {
        s.metric("nodegate_agent_roster_shards_rejected_total")
            .await
            > rejected
            && s.metric("nodegate_agent_roster_complete").await == 0.0
    })
    .await;

    let (holds, refused) = (
        s.metric("nodegate_agent_prune_holds_total").await,
        s.metric("nodegate_agent_prune_refused_total").await,
    );
    let gets = confirmations(s.agent).await;
    forge_shard(
        s.c,
        attacker,
        s.roster,
        &format!(r#"{{"version":1,"epoch":{epoch},"shard":0,"shards":1,"nodes":[]}}"#),
    )
    .await;
    eventually("the empty roster held and refused", || async {
        s.metric("nodegate_agent_prune_holds_total").await > holds
            && s.metric("nodegate_agent_prune_refused_total").await > refused
            && s.metric("nodegate_agent_prune_pending").await == 0.0
    })
    .await;
    assert!(
        s.metric("nodegate_agent_prune_confirmations_total{result=\"live\"}")
            .await
            >= 1.0
    );
    if !s.c.is_real() {
        // Alone on the emulator: every node but its own refused, after
        // a single GET.
        assert_eq!(
            confirmations(s.agent).await - gets,
            1.0,
            "GETs for the forgery"
        );
        assert_eq!(
            s.metric("nodegate_agent_prune_refused_total").await - refused,
            s.uids.len() as f64
        );
    }
    assert!(
        own_hook_calls(s.hooks, s.own).is_empty(),
        "{attacker}: a handler ran for a live node: {:?}",
        own_hook_calls(s.hooks, s.own)
    );
    // The refused nodes are live again in the snapshot.
    eventually("snapshot still holds every live node", || async {
        own_snapshot(s.state, s.own).as_ref() == Some(s.uids)
    })
    .await;
}

/// Roster poisoning, as an attacker runs it: with the publisher down, shard
/// 0 is overwritten with the one-shard empty roster — with the u64::MAX
/// epoch, then with an epoch a publisher could have written (a complete,
/// empty roster) — by the roster's own service account and by a namespace
/// editor (the agent cannot tell writers apart; the emulator has no `edit`
/// role, so the admin makes the editor's request). No handler runs for a
/// live node; the mass deletion is held and refused after a GET. The
/// publisher restarted recovers from the forged epochs, and a later real
/// deletion is pruned exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_poisoned_shard_prunes_no_live_node() {
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let w: Vec<String> = (0..8).map(|i| c.node_name(&format!("x{i}"))).collect();
    let own_node = c.node_name("xself");
    let own: BTreeSet<String> = w.iter().chain([&own_node]).cloned().collect();
    let mut uids = BTreeMap::new();
    for (i, name) in w.iter().enumerate() {
        uids.insert(name.clone(), create(&nodes, name, 500 + i).await);
    }
    create(&nodes, &own_node, 600).await;
    let pruning = Pruning::new();
    let (mut publisher, mut agent) = pruning.start_on_roster(&c, &roster, &own_node).await;
    pruning
        .snapshot_is("first snapshot from the roster", &own, &uids)
        .await;
    // The publisher down: nobody repairs the shard while the attack runs.
    assert!(publisher.term().await.success());

    let metric = |name: &'static str| {
        let agent = &agent;
        async move { agent.metric(name).await.unwrap_or(0.0) }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let watched = Watched {
        c: &c,
        agent: &agent,
        roster: &roster,
        hooks: &pruning.hooks,
        state: &pruning.state,
        own: &own,
        uids: &uids,
    };
    for (k, attacker) in [roster_writer(&c), users::ADMIN].into_iter().enumerate() {
        forged_empty_rosters_prune_nothing(&watched, attacker, now + 60 + k as u64).await;
    }

    // The publisher comes back and replaces the forged epoch with its own.
    let mut publisher = pruning.publisher(&c, &roster, 0).await;
    eventually("the roster complete again", || async {
        metric("nodegate_agent_roster_complete").await == 1.0
            && roster_members(&nodes, &roster, &own)
                .await
                .is_some_and(|m| m.len() == own.len())
    })
    .await;
    assert!(publisher.logged("leading: publishing the roster"));
    // With the publisher leading, a forged shard is repaired at once.
    let rejected = metric("nodegate_agent_roster_shards_rejected_total").await;
    forge_shard(
        &c,
        roster_writer(&c),
        &roster,
        r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#,
    )
    .await;
    eventually("the forged shard seen, then rewritten", || async {
        metric("nodegate_agent_roster_shards_rejected_total").await > rejected
            && metric("nodegate_agent_roster_complete").await == 1.0
    })
    .await;

    // A real deletion afterwards: pruned exactly once.
    let gets = confirmations(&agent).await;
    let gone = w[3].clone();
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    eventually("the deleted node's hook", || async {
        !own_hook_calls(&pruning.hooks, &own).is_empty()
    })
    .await;
    let mut want = uids.clone();
    want.remove(&gone);
    pruning
        .snapshot_is("snapshot equals the live set", &own, &want)
        .await;
    let calls = own_hook_calls(&pruning.hooks, &own);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str()),
        (gone.as_str(), "watch")
    );
    assert_eq!(calls[0].3["uid"], uids[&gone].as_str());
    assert!(metric("nodegate_agent_prune_confirmations_total{result=\"gone\"}").await >= 1.0);
    if !c.is_real() {
        assert_eq!(
            confirmations(&agent).await - gets,
            1.0,
            "one GET per deletion"
        );
    }
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}

/// Deletions held after a confirmation found a live node's value, by field.
const ADDRESS: &str = "nodegate_agent_prune_confirmations_total{result=\"conflict_address\"}";
const CIDR: &str = "nodegate_agent_prune_confirmations_total{result=\"conflict_pod_cidr\"}";
const NAME: &str = "nodegate_agent_prune_confirmations_total{result=\"conflict_name\"}";
const REFUSED: &str = "nodegate_agent_prune_refused_total";

/// Shard 0 as `s0` holds it, plus three records that carry live values:
/// (a) a ghost with node 700's InternalIP, (b) a ghost with node 701's
/// podCIDR, (c) the victim's own record under another uid.
fn carrying_live_values(
    s0: &shard::Shard,
    ghost_ip: &str,
    ghost_cidr: &str,
    victim: &str,
) -> String {
    let record = |name: &str, uid: &str, ip: String, cidr: String| NodeRecord {
        name: name.into(),
        uid: uid.into(),
        addresses: vec![NodeAddress {
            kind: "InternalIP".into(),
            address: ip,
        }],
        pod_cidrs: vec![cidr],
        provider_id: None,
        boot_id: None,
        labels: Default::default(),
    };
    let mut forged: Vec<NodeRecord> = s0.nodes.values().cloned().collect();
    forged.push(record(
        ghost_ip,
        "0a0a0a0a-0000-4000-8000-00000000000a",
        ip(700),
        pod_cidr(790),
    ));
    forged.push(record(
        ghost_cidr,
        "0b0b0b0b-0000-4000-8000-00000000000b",
        ip(791),
        pod_cidr(701),
    ));
    let real = forged
        .iter_mut()
        .find(|r| r.name == victim)
        .expect("the victim is in shard 0");
    real.uid = "0c0c0c0c-0000-4000-8000-00000000000c".into();
    shard::encode(s0.epoch, 0, s0.count, &forged)
}

/// Each `(node, field)` deletion was held: counted by field (once each on
/// the emulator, where the agent is alone) and logged with both.
async fn held_counted_and_logged(c: &Cluster, agent: &Agent, held: [(&str, &str); 3]) {
    let metric = |name: &'static str| async move { agent.metric(name).await.unwrap_or(0.0) };
    eventually("the three held and counted", || async {
        metric(ADDRESS).await >= 1.0 && metric(CIDR).await >= 1.0 && metric(NAME).await >= 1.0
    })
    .await;
    for (n, field) in held {
        let node = format!("node={n} ");
        let field = format!("field=\"{field}\"");
        assert!(
            agent.logged_with(&["deletion held, no handler runs", &node, &field]),
            "the refusal of {n} ({field}) is logged"
        );
    }
    if !c.is_real() {
        assert_eq!(
            (
                metric(ADDRESS).await,
                metric(CIDR).await,
                metric(NAME).await
            ),
            (1.0, 1.0, 1.0)
        );
    }
}

/// A roster writer (the roster's own token, the publisher down) adds to
/// shard 0, beside its real records: (a) a ghost — a name the API server
/// never had — carrying a live node's InternalIP, (b) a ghost carrying a
/// live node's podCIDR, (c) a live node's record with a swapped uid. The
/// publisher comes back and repairs the shard, which takes them out again:
/// each is confirmed (404 for the ghosts, the node under its real uid for
/// (c)) and held, counted and logged, and the hook never runs with any of
/// those names, IPs or podCIDRs. A real deletion afterwards runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_records_carrying_live_values_never_reach_the_handler() {
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let w: Vec<String> = (0..4).map(|i| c.node_name(&format!("lv{i}"))).collect();
    let victim = name_in_shard0(&c, "lvictim");
    c.delete_on_drop("nodes", "", &victim);
    let own_node = c.node_name("lvself");
    let mut uids = BTreeMap::new();
    for (i, name) in w.iter().enumerate() {
        uids.insert(name.clone(), create(&nodes, name, 700 + i).await);
    }
    uids.insert(victim.clone(), create(&nodes, &victim, 710).await);
    create(&nodes, &own_node, 720).await;
    let (ghost_ip, ghost_cidr) = (
        name_in_shard0(&c, "ghost-ip"),
        name_in_shard0(&c, "ghost-cidr"),
    );
    let own: BTreeSet<String> = uids
        .keys()
        .chain([&own_node, &ghost_ip, &ghost_cidr])
        .cloned()
        .collect();
    let pruning = Pruning::new();
    let (mut publisher, mut agent) = pruning.start_on_roster(&c, &roster, &own_node).await;
    pruning
        .snapshot_is("first snapshot from the roster", &own, &uids)
        .await;
    assert!(publisher.term().await.success());
    let metric = |name: &'static str| {
        let agent = &agent;
        async move { agent.metric(name).await.unwrap_or(0.0) }
    };
    for series in [ADDRESS, CIDR, NAME] {
        assert_eq!(agent.metric(series).await, Some(0.0), "{series} born at 0");
    }

    // The forgery: shard 0 as it is, plus the three records.
    let api = shards_api(&nodes);
    let cm = api.get(&shard::name_of(&roster, 0)).await.unwrap();
    let s0 = shard::decode(&roster, &cm).unwrap();
    let refused = metric(REFUSED).await;
    let forged = carrying_live_values(&s0, &ghost_ip, &ghost_cidr, &victim);
    forge_shard(&c, roster_writer(&c), &roster, &forged).await;
    // The forged uid makes the real one look deleted: refused (live).
    eventually("the forged shard taken in", || async {
        metric(REFUSED).await > refused
            && own_snapshot(&pruning.state, &own)
                .is_some_and(|s| s.contains_key(&ghost_ip) && s.contains_key(&ghost_cidr))
    })
    .await;

    // The publisher repairs the shard: the three records leave.
    let mut publisher = pruning.publisher(&c, &roster, 0).await;
    // Out of the snapshot once handled or held (a handler that ran would
    // have run by then), and nothing left to confirm.
    eventually("the three deletions concluded", || async {
        own_snapshot(&pruning.state, &own).as_ref() == Some(&uids)
            && metric("nodegate_agent_prune_pending").await == 0.0
    })
    .await;
    // Nothing ran, for these records or with their values.
    let calls = hook_calls(&pruning.hooks);
    assert!(
        own_hook_calls(&pruning.hooks, &own).is_empty(),
        "a handler ran: {calls:?}"
    );
    for (_, _, ips, rec) in &calls {
        assert!(!ips.split(',').any(|i| i == ip(700)), "{calls:?}");
        assert!(rec["podCIDRs"] != json!([pod_cidr(701)]), "{calls:?}");
    }
    let held = [
        (ghost_ip.as_str(), "address"),
        (ghost_cidr.as_str(), "podCIDR"),
        (victim.as_str(), "name"),
    ];
    held_counted_and_logged(&c, &agent, held).await;

    // A real deletion afterwards: handled, once.
    let gone = w[2].clone();
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    eventually("the deleted node's hook", || async {
        !own_hook_calls(&pruning.hooks, &own).is_empty()
    })
    .await;
    let calls = own_hook_calls(&pruning.hooks, &own);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (
            calls[0].0.as_str(),
            calls[0].1.as_str(),
            calls[0].2.as_str()
        ),
        (gone.as_str(), "watch", ip(702).as_str())
    );
    assert_eq!(calls[0].3["uid"], uids[&gone].as_str());
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}
