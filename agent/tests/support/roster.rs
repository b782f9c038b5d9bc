//! The test's own node roster: its name, its shards, who writes them and
//! how an attacker would.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::{ListParams, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_roster::shard;

/// Shards of the tests' rosters (few, so each holds several test nodes).
pub const SHARDS: u32 = 4;

/// The test's own roster, unique per test on a real cluster, deleted after.
pub fn roster(c: &Cluster) -> String {
    let name = c.name("roster");
    for i in 0..SHARDS {
        c.delete_on_drop("configmaps", "nodegate", &format!("{name}-{i}"));
    }
    c.delete_on_drop("leases", "nodegate", &name);
    name
}

pub fn shards_api(nodes: &Api<Node>) -> Api<ConfigMap> {
    Api::namespaced(nodes.clone().into_client(), "nodegate")
}

/// The test's own nodes in the roster's current shards (name → uid), or
/// `None` while it is not complete.
pub async fn roster_members(
    nodes: &Api<Node>,
    roster: &str,
    own: &BTreeSet<String>,
) -> Option<BTreeMap<String, String>> {
    let lp = ListParams::default().labels(&shard::selector(roster));
    let cms = shards_api(nodes).list(&lp).await.ok()?;
    let shards: Vec<shard::Shard> = cms
        .items
        .iter()
        .filter_map(|cm| shard::decode(roster, cm).ok())
        .collect();
    let epoch = shards.iter().map(|s| s.epoch).max()?;
    let current: Vec<&shard::Shard> = shards.iter().filter(|s| s.epoch == epoch).collect();
    if current.len() != SHARDS as usize {
        return None;
    }
    Some(
        current
            .iter()
            .flat_map(|s| s.nodes.values())
            .filter(|r| own.contains(&r.name))
            .map(|r| (r.name.clone(), r.uid.clone()))
            .collect(),
    )
}

pub fn roster_agent_args<'a>(hook_cmd: &'a str, roster: &'a str) -> [&'a str; 5] {
    [
        "--on-node-delete",
        hook_cmd,
        "--roster-name",
        roster,
        "--taint-on-shutdown=false",
    ]
}

/// Who writes a test's own roster: the publisher's account on the emulator;
/// on a real cluster the installed RBAC and policies let that account write
/// only the installed roster's names (e2e/tests/roster_writers.rs proves
/// them), so the admin, whom the writers' policy exempts.
pub fn roster_writer(c: &Cluster) -> &'static str {
    if c.is_real() {
        users::ADMIN
    } else {
        users::ROSTER
    }
}

/// Writes `body` into shard 0 of `roster` as `user`, the way an attacker
/// with ConfigMap write access in the namespace would (again on a conflict
/// with the publisher).
pub async fn forge_shard(c: &Cluster, user: &str, roster: &str, body: &str) {
    let api: Api<ConfigMap> = Api::namespaced(c.client(user).await.unwrap(), "nodegate");
    let name = shard::name_of(roster, 0);
    for _ in 0..10 {
        let mut cm = api.get(&name).await.unwrap();
        cm.data = Some(BTreeMap::from([(
            shard::DATA_KEY.to_string(),
            body.to_string(),
        )]));
        match api.replace(&name, &PostParams::default(), &cm).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("{user} cannot write {name}: {e}"),
        }
    }
    panic!("{name}: conflicts on every attempt");
}

/// The first name `base-<k>` (as the cluster spells it) whose roster shard
/// is 0, the shard `forge_shard` writes.
pub fn name_in_shard0(c: &Cluster, base: &str) -> String {
    (0..)
        .map(|k| c.name(&format!("{base}-{k}")))
        .find(|n| shard::shard_of(n, SHARDS) == 0)
        .unwrap()
}
