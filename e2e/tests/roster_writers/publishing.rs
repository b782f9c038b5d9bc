//! (b) The publisher itself, under the narrowed RBAC and the policies:
//! it still acquires, renews, hands over and publishes.

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_roster::shard::{self, DEFAULT_NAME};
use serde_json::json;

use crate::support::poll::eventually_some;
use crate::support::roster::{NS, holder, holder_of, published, shards};
use crate::support::roster_publisher::{WAIT, assert_never_refused, publisher};

/// (b) Under the narrowed RBAC and the policies, the publisher's own
/// account still does everything an election and a roster need. Emulator:
/// the real binary creates the Lease and becomes leader, renews it, writes
/// all 64 shards with the cluster's nodes; a second replica with
/// `--shards=32` takes over when the first stops (its release and the
/// takeover are Lease updates), rebuilds in a new epoch and deletes shards
/// 32..63 as stale. Real cluster: the installed publisher holds and renews
/// the Lease and its roster is complete, and the account's update of both
/// (a dry run) is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_still_acquires_renews_and_publishes() {
    let c = Cluster::start().await.unwrap();
    let admin = c.client(users::ADMIN).await.unwrap();
    if c.is_real() {
        the_installed_publisher_holds_and_renews(&c, &admin).await;
        return;
    }
    c.emulator()
        .unwrap()
        .apply(&nodegate_e2e::process::shipped_roster_policy().unwrap())
        .unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let names: Vec<String> = (0..3)
        .map(|i| c.node_name(&format!("roster-w{i}")))
        .collect();
    for n in &names {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let kubeconfig = c.kubeconfig(users::ROSTER).unwrap();
    let mut first = publisher(&kubeconfig, NS, "e2e-roster-0", 64);
    eventually_some("replica 0 creates the Lease and leads", WAIT, || async {
        let l = holder(&admin, NS).await?;
        (holder_of(&l) == Some("e2e-roster-0")).then_some(())
    })
    .await;
    let taken = holder(&admin, NS).await.unwrap();
    eventually_some("replica 0 renews", WAIT, || async {
        let l = holder(&admin, NS).await?;
        (holder_of(&l) == Some("e2e-roster-0")
            && l.spec.as_ref()?.renew_time != taken.spec.as_ref()?.renew_time)
            .then_some(())
    })
    .await;
    let epoch = eventually_some("64 shards published with every node", WAIT, || async {
        let epoch = published(&admin, NS, 64).await?;
        let found = shards(&admin, NS).await;
        let listed: BTreeSet<&String> = found.values().flat_map(|s| s.nodes.keys()).collect();
        names.iter().all(|n| listed.contains(n)).then_some(epoch)
    })
    .await;

    let mut second = publisher(&kubeconfig, NS, "e2e-roster-1", 32);
    first.stop().await.unwrap();
    eventually_some("replica 1 takes the released Lease", WAIT, || async {
        let l = holder(&admin, NS).await?;
        (holder_of(&l) == Some("e2e-roster-1")).then_some(())
    })
    .await;
    let rebuilt = eventually_some("32 shards in a new epoch, 32..63 deleted", WAIT, || async {
        published(&admin, NS, 32).await
    })
    .await;
    assert!(rebuilt > epoch, "a new epoch: {rebuilt} after {epoch}");
    assert_never_refused(&first);
    assert_never_refused(&second);
    second.stop().await.unwrap();
}

/// Real cluster: the installed publisher holds and renews the Lease and its
/// roster is complete, and its account's update of both (a dry run) is
/// admitted.
async fn the_installed_publisher_holds_and_renews(c: &Cluster, admin: &kube::Client) {
    let first = holder(admin, NS)
        .await
        .expect("no Lease nodegate/nodegate-roster: install the pruning component");
    let who = holder_of(&first)
        .expect("the installed Lease has a holder")
        .to_string();
    eventually_some("the installed publisher renews its Lease", WAIT, || async {
        let now = holder(admin, NS).await?;
        let renewed = now.spec.as_ref()?.renew_time != first.spec.as_ref()?.renew_time;
        (renewed && holder_of(&now).is_some()).then_some(())
    })
    .await;
    eventually_some("the installed roster is complete", WAIT, || async {
        shard::complete_epoch(shards(admin, NS).await.values())
    })
    .await;
    let own = c.client(users::ROSTER).await.unwrap();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    eventually_some(
        "the publisher's account renews its Lease (dry run)",
        WAIT,
        || async {
            let leases: Api<Lease> = Api::namespaced(own.clone(), NS);
            let l = leases.get(DEFAULT_NAME).await.unwrap();
            match leases.replace(DEFAULT_NAME, &dry, &l).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(e)) if e.code == 409 => None,
                Err(e) => panic!("renewal refused: {e}"),
            }
        },
    )
    .await;
    eventually_some(
        "the publisher's account rewrites a shard (dry run)",
        WAIT,
        || async {
            let cms: Api<ConfigMap> = Api::namespaced(own.clone(), NS);
            let name = shard::name_of(DEFAULT_NAME, 0);
            let cm = cms.get(&name).await.unwrap();
            match cms.replace(&name, &dry, &cm).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(e)) if e.code == 409 => None,
                Err(e) => panic!("shard write refused: {e}"),
            }
        },
    )
    .await;
    eprintln!("installed publisher {who} holds and renews the Lease");
}
