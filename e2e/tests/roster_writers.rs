//! Who may write the node roster (`manifests/components/pruning`), attacked
//! as an intruder would: a namespace editor (a Role with every verb on
//! ConfigMaps and Leases, what a compromised workload or a controller with
//! leader-election rights holds) tries to take the publisher's Lease and to
//! rewrite its shards; the publisher's own token tries to write anything
//! else; and the install is moved to another namespace by kustomize. The
//! publisher itself must still acquire, renew, hand over and publish.
//!
//! Runs against a fresh emulator, or a real cluster with the pruning
//! component installed when NODEGATE_E2E_KUBECONFIG is set (see
//! e2e/README.md). On a real cluster every write that would disturb the
//! installed publisher if it were admitted is a server-side dry run, which
//! goes through the same authorization and admission; the editor is granted
//! through the RBAC API (its part is skipped where the API server has none,
//! as under `nodegate-sim serve`); the other-namespace install is emulator
//! only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodegate_e2e::LoggedChild;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_roster::shard::{self, DEFAULT_NAME};
use serde::Deserialize;
use serde_json::{Value, json};

const NS: &str = "nodegate";
const WRITERS: &str =
    "ValidatingAdmissionPolicy 'nodegate-roster-writers' with binding 'nodegate-roster-writers'";
const CONFINEMENT: &str = "ValidatingAdmissionPolicy 'nodegate-roster-confinement'";
/// Long enough for a lease renewal of the installed publisher (retry period
/// 2 s, lease 15 s) and for a failover of the tests' own (2 s).
const WAIT: Duration = Duration::from_secs(40);

/// Polls `cond` every 50 ms until it returns `Some`, at most [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
    }
}

/// A 403 whose message holds every needle.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>, needles: &[&str]) {
    match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{what}: {}", e.message);
            for n in needles {
                assert!(e.message.contains(n), "{what}: {:?} lacks {n:?}", e.message);
            }
        }
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

/// Writes that would disturb an installed publisher if admitted are dry
/// runs on a real cluster; the emulator is the test's own.
fn post(c: &Cluster) -> PostParams {
    PostParams {
        dry_run: c.is_real(),
        ..PostParams::default()
    }
}

fn delete(c: &Cluster) -> DeleteParams {
    DeleteParams {
        dry_run: c.is_real(),
        ..DeleteParams::default()
    }
}

fn patch_params(c: &Cluster) -> PatchParams {
    PatchParams {
        dry_run: c.is_real(),
        ..PatchParams::default()
    }
}

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }))
    .unwrap()
}

fn config_map(name: &str, labelled: bool) -> ConfigMap {
    let mut cm = json!({"metadata": {"name": name}, "data": {shard::DATA_KEY: "{}"}});
    if labelled {
        cm["metadata"]["labels"] = json!({shard::LABEL: DEFAULT_NAME});
    }
    serde_json::from_value(cm).unwrap()
}

/// A Role with every verb on ConfigMaps and Leases in `ns`, bound to the
/// user `user`: a namespace editor, or any workload holding such rights.
fn editor_rbac(user: &str, ns: &str) -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {user}, namespace: {ns}}}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    verbs: ["*"]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {user}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {user}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]
"#
    )
}

/// A cluster with a namespace editor in `nodegate`: on the emulator its
/// RBAC is given at start (and the roster's policies installed, as the
/// pruning component does); on a real cluster it is created through the
/// RBAC API and deleted afterwards, or `None` where the API server has no
/// RBAC API.
async fn with_editor() -> (Cluster, Option<String>) {
    if std::env::var_os(nodegate_e2e::cluster::REAL_CLUSTER_ENV).is_none() {
        let c = Cluster::start_with_rbac(vec![editor_rbac("editor", NS)])
            .await
            .unwrap();
        c.emulator()
            .unwrap()
            .apply(&nodegate_e2e::process::shipped_roster_policy().unwrap())
            .unwrap();
        return (c, Some("editor".into()));
    }
    let c = Cluster::start().await.unwrap();
    let user = c.name("editor");
    let admin = c.client(users::ADMIN).await.unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&editor_rbac(&user, NS))
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    let role: Role = serde_json::from_value(docs[0].clone()).unwrap();
    match Api::<Role>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &role)
        .await
    {
        Ok(_) => c.delete_on_drop("roles", NS, &user),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            eprintln!("the API server serves no RBAC API: the editor's attacks are skipped");
            return (c, None);
        }
        Err(e) => panic!("granting the editor: {e}"),
    }
    let binding: RoleBinding = serde_json::from_value(docs[1].clone()).unwrap();
    Api::<RoleBinding>::namespaced(admin, NS)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    c.delete_on_drop("rolebindings", NS, &user);
    (c, Some(user))
}

/// The publisher's Lease as the admin reads it. On the emulator the
/// publisher's account creates it first (its own create is allowed); on a
/// real cluster the installed publisher holds it.
async fn publishers_lease(c: &Cluster) -> Lease {
    let admin: Api<Lease> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), NS);
    if let Some(l) = admin.get_opt(DEFAULT_NAME).await.unwrap() {
        return l;
    }
    assert!(
        !c.is_real(),
        "no Lease {NS}/{DEFAULT_NAME}: install the pruning component first"
    );
    let own: Api<Lease> = Api::namespaced(c.client(users::ROSTER).await.unwrap(), NS);
    own.create(&PostParams::default(), &lease(DEFAULT_NAME, "publisher-0"))
        .await
        .expect("the publisher creates its Lease")
}

/// (a) A namespace editor cannot take the publisher's leadership: updating
/// the Lease's holder (replace and patch), deleting it and creating it while
/// absent are refused with a 403 naming the editor; so is every write of a
/// shard. The editor's own ConfigMaps and Leases are untouched by the
/// policy. Threat: the holder decides whether and who publishes the roster
/// every pruning agent reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_editor_cannot_take_the_publishers_lease() {
    let (c, editor) = with_editor().await;
    let Some(editor) = editor else { return };
    let before = publishers_lease(&c).await;
    let leases: Api<Lease> = Api::namespaced(c.client(&editor).await.unwrap(), NS);
    let not_editor =
        format!("only the nodegate-roster ServiceAccount may write the roster Lease, not {editor}");

    // Reading is not refused: it is what RBAC grants, and the Lease is not secret.
    let mut taken = leases.get(DEFAULT_NAME).await.unwrap();
    let spec = taken.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(editor.clone());
    spec.lease_duration_seconds = Some(3600);
    refused(
        "editor replaces the holder",
        leases.replace(DEFAULT_NAME, &post(&c), &taken).await,
        &[
            WRITERS,
            &not_editor,
            &format!("(UPDATE lease {DEFAULT_NAME})"),
        ],
    );
    refused(
        "editor patches the holder",
        leases
            .patch(
                DEFAULT_NAME,
                &patch_params(&c),
                &Patch::Merge(json!({"spec": {"holderIdentity": editor}})),
            )
            .await,
        &[WRITERS, &not_editor],
    );
    refused(
        "editor deletes the Lease",
        leases.delete(DEFAULT_NAME, &delete(&c)).await,
        &[
            WRITERS,
            &not_editor,
            &format!("(DELETE lease {DEFAULT_NAME})"),
        ],
    );
    let admin: Api<Lease> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), NS);
    let after = admin.get(DEFAULT_NAME).await.unwrap();
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        before.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        "the holder is the publisher's"
    );

    // Absent (a publisher not started yet, or its Lease removed for repair):
    // the editor cannot be the one who creates it. On a real cluster the
    // installed Lease stays; the API server runs validating admission before
    // its storage answers AlreadyExists, so the dry run shows the same 403.
    if !c.is_real() {
        admin
            .delete(DEFAULT_NAME, &DeleteParams::default())
            .await
            .unwrap();
    }
    refused(
        "editor creates the Lease",
        leases
            .create(&post(&c), &lease(DEFAULT_NAME, &editor))
            .await,
        &[
            WRITERS,
            &not_editor,
            &format!("(CREATE lease {DEFAULT_NAME})"),
        ],
    );
    if !c.is_real() {
        assert!(admin.get_opt(DEFAULT_NAME).await.unwrap().is_none());
    }

    // Shards: rewrite, create (labelled, or by name alone), delete.
    let not_editor =
        format!("only the nodegate-roster ServiceAccount may write roster shards, not {editor}");
    let cms: Api<ConfigMap> = Api::namespaced(c.client(&editor).await.unwrap(), NS);
    let shard0 = shard::name_of(DEFAULT_NAME, 0);
    if !c.is_real() {
        Api::<ConfigMap>::namespaced(c.client(users::ROSTER).await.unwrap(), NS)
            .create(&PostParams::default(), &config_map(&shard0, true))
            .await
            .expect("the publisher creates a shard");
    }
    let mut poisoned = cms.get(&shard0).await.unwrap();
    poisoned.data = Some(BTreeMap::from([(
        shard::DATA_KEY.to_string(),
        r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#.to_string(),
    )]));
    refused(
        "editor rewrites shard 0",
        cms.replace(&shard0, &post(&c), &poisoned).await,
        &[
            WRITERS,
            &not_editor,
            &format!("(UPDATE configmap {shard0})"),
        ],
    );
    for (name, labelled) in [
        (shard::name_of(DEFAULT_NAME, 1023), true),
        (shard::name_of(DEFAULT_NAME, 7), false),
    ] {
        // On a real cluster shard 7 may exist: admission runs first all the same.
        refused(
            &format!("editor creates {name}"),
            cms.create(&post(&c), &config_map(&name, labelled)).await,
            &[WRITERS, &not_editor],
        );
    }
    refused(
        "editor deletes shard 0",
        cms.delete(&shard0, &delete(&c)).await,
        &[WRITERS, &not_editor],
    );

    // The policy is about the roster only.
    let own = c.name("editors-own");
    c.delete_on_drop("configmaps", NS, &own);
    c.delete_on_drop("leases", NS, &own);
    cms.create(&PostParams::default(), &config_map(&own, false))
        .await
        .expect("the editor's own ConfigMap");
    leases
        .create(&PostParams::default(), &lease(&own, &editor))
        .await
        .expect("the editor's own Lease");
}

/// The shipped roster's shards in `ns` that decode: name → shard.
async fn shards(c: &kube::Client, ns: &str) -> BTreeMap<String, shard::Shard> {
    let lp = ListParams::default().labels(&shard::selector(DEFAULT_NAME));
    Api::<ConfigMap>::namespaced(c.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|cm| {
            let s = shard::decode(DEFAULT_NAME, cm).ok()?;
            Some((cm.metadata.name.clone()?, s))
        })
        .collect()
}

/// The newest epoch once every shard of it is written with `count` shards
/// and no other shard is left.
async fn published(c: &kube::Client, ns: &str, count: u32) -> Option<u64> {
    let found = shards(c, ns).await;
    let (epoch, n) = shard::complete_epoch(found.values())?;
    let names: BTreeSet<&String> = found.keys().collect();
    let want: BTreeSet<String> = (0..count)
        .map(|i| shard::name_of(DEFAULT_NAME, i))
        .collect();
    (n == count && names == want.iter().collect()).then_some(epoch)
}

async fn holder(c: &kube::Client, ns: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(c.clone(), ns)
        .get_opt(DEFAULT_NAME)
        .await
        .unwrap()
}

fn holder_of(l: &Lease) -> Option<&str> {
    l.spec.as_ref()?.holder_identity.as_deref()
}

/// A replica of the real `nodegate-roster` binary, as `kubeconfig`'s user,
/// under the shipped roster name with short lease timings (a failover takes
/// about 2 s).
fn publisher(kubeconfig: &Path, ns: &str, identity: &str, shards: u32) -> LoggedChild {
    let bin = nodegate_e2e::bin_path("nodegate-roster");
    assert!(
        bin.exists(),
        "{} missing: build it first (cargo build -p nodegate-roster)",
        bin.display()
    );
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .args(["--namespace", ns, "--identity", identity])
        .args(["--shards", &shards.to_string(), "--interval", "50ms"])
        .args(["--lease-duration", "2s", "--renew-deadline", "1500ms"])
        .args(["--retry-period", "250ms", "--admin-listen", "127.0.0.1:0"]);
    LoggedChild::spawn(identity, cmd).unwrap()
}

/// No request of the publisher was refused.
fn assert_never_refused(p: &LoggedChild) {
    let refusals: Vec<String> = p
        .logs()
        .into_iter()
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("forbidden") || l.contains("cannot write roster shard")
        })
        .collect();
    assert!(
        refusals.is_empty(),
        "the publisher was refused: {refusals:#?}"
    );
}

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
        let first = holder(&admin, NS)
            .await
            .expect("no Lease nodegate/nodegate-roster: install the pruning component");
        let who = holder_of(&first)
            .expect("the installed Lease has a holder")
            .to_string();
        eventually("the installed publisher renews its Lease", || async {
            let now = holder(&admin, NS).await?;
            let renewed = now.spec.as_ref()?.renew_time != first.spec.as_ref()?.renew_time;
            (renewed && holder_of(&now).is_some()).then_some(())
        })
        .await;
        eventually("the installed roster is complete", || async {
            shard::complete_epoch(shards(&admin, NS).await.values())
        })
        .await;
        let own = c.client(users::ROSTER).await.unwrap();
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        eventually(
            "the publisher's account renews its Lease (dry run)",
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
        eventually(
            "the publisher's account rewrites a shard (dry run)",
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
    eventually("replica 0 creates the Lease and leads", || async {
        let l = holder(&admin, NS).await?;
        (holder_of(&l) == Some("e2e-roster-0")).then_some(())
    })
    .await;
    let taken = holder(&admin, NS).await.unwrap();
    eventually("replica 0 renews", || async {
        let l = holder(&admin, NS).await?;
        (holder_of(&l) == Some("e2e-roster-0")
            && l.spec.as_ref()?.renew_time != taken.spec.as_ref()?.renew_time)
            .then_some(())
    })
    .await;
    let epoch = eventually("64 shards published with every node", || async {
        let epoch = published(&admin, NS, 64).await?;
        let found = shards(&admin, NS).await;
        let listed: BTreeSet<&String> = found.values().flat_map(|s| s.nodes.keys()).collect();
        names.iter().all(|n| listed.contains(n)).then_some(epoch)
    })
    .await;

    let mut second = publisher(&kubeconfig, NS, "e2e-roster-1", 32);
    first.stop().await.unwrap();
    eventually("replica 1 takes the released Lease", || async {
        let l = holder(&admin, NS).await?;
        (holder_of(&l) == Some("e2e-roster-1")).then_some(())
    })
    .await;
    let rebuilt = eventually("32 shards in a new epoch, 32..63 deleted", || async {
        published(&admin, NS, 32).await
    })
    .await;
    assert!(rebuilt > epoch, "a new epoch: {rebuilt} after {epoch}");
    assert_never_refused(&first);
    assert_never_refused(&second);
    second.stop().await.unwrap();
}

/// (c) The publisher's own token, stolen, writes nothing but its shards and
/// its Lease: another ConfigMap or Lease of the namespace cannot be read by
/// name, updated, patched or deleted (RBAC names only the roster's), nor
/// can a new one be planted (RBAC cannot name a create; the confinement
/// policy refuses it). Its own Lease cannot be deleted. What RBAC cannot
/// name: it lists every ConfigMap of the namespace, as the agents do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roster_token_writes_nothing_but_its_shards_and_lease() {
    let c = Cluster::start().await.unwrap();
    if let Some(emu) = c.emulator() {
        emu.apply(&nodegate_e2e::process::shipped_roster_policy().unwrap())
            .unwrap();
    }
    let admin = c.client(users::ADMIN).await.unwrap();
    let other = c.name("other-config");
    c.delete_on_drop("configmaps", NS, &other);
    c.delete_on_drop("leases", NS, &other);
    Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &config_map(&other, false))
        .await
        .unwrap();
    Api::<Lease>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &lease(&other, "someone"))
        .await
        .unwrap();

    let own = c.client(users::ROSTER).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(own.clone(), NS);
    let leases: Api<Lease> = Api::namespaced(own, NS);
    let user = format!("User \"{}\" cannot", users::ROSTER);
    refused(
        "get another ConfigMap",
        cms.get(&other).await,
        &[&user, "get resource \"configmaps\""],
    );
    let mut cm = config_map(&other, false);
    cm.data = Some(BTreeMap::from([("poison".to_string(), "1".to_string())]));
    refused(
        "update another ConfigMap",
        cms.replace(&other, &post(&c), &cm).await,
        &[&user, "update resource \"configmaps\""],
    );
    refused(
        "patch another ConfigMap",
        cms.patch(
            &other,
            &patch_params(&c),
            &Patch::Merge(json!({"data": {"poison": "1"}})),
        )
        .await,
        &[&user, "patch resource \"configmaps\""],
    );
    refused(
        "delete another ConfigMap",
        cms.delete(&other, &delete(&c)).await,
        &[&user, "delete resource \"configmaps\""],
    );
    refused(
        "update another Lease",
        leases
            .replace(&other, &post(&c), &lease(&other, "roster"))
            .await,
        &[&user, "update resource \"leases\""],
    );
    refused(
        "delete another Lease",
        leases.delete(&other, &delete(&c)).await,
        &[&user, "delete resource \"leases\""],
    );
    // Its own Lease: renewed and taken over by update, never deleted.
    refused(
        "delete its own Lease",
        leases.delete(DEFAULT_NAME, &delete(&c)).await,
        &[&user, "delete resource \"leases\""],
    );
    // Planting: a ConfigMap or Lease another component would read or elect on.
    let planted = c.name("planted");
    c.delete_on_drop("configmaps", NS, &planted);
    c.delete_on_drop("leases", NS, &planted);
    refused(
        "plant a ConfigMap",
        cms.create(&post(&c), &config_map(&planted, false)).await,
        &[
            CONFINEMENT,
            &format!(
                "nodegate-roster may write only its shards (ConfigMaps nodegate-roster-*) and its Lease nodegate-roster, not configmap {planted} (CREATE)"
            ),
        ],
    );
    refused(
        "plant a Lease",
        leases.create(&post(&c), &lease(&planted, "roster")).await,
        &[CONFINEMENT, &format!("not lease {planted} (CREATE)")],
    );
    // The exposure RBAC cannot close: list is namespace-wide.
    let listed = cms.list(&ListParams::default()).await.unwrap();
    assert!(
        listed
            .items
            .iter()
            .any(|cm| cm.metadata.name.as_deref() == Some(other.as_str())),
        "list reads every ConfigMap of the namespace"
    );
}

/// (d) Installed by kustomize under `namespace: platform-gates` (the Role
/// bindings, the Namespace and the workloads move; no CEL and no selector
/// is rewritten), the roster is still guarded: an editor there cannot take
/// the Lease or write a shard, the account the old policy named
/// (`nodegate:nodegate-roster`) has no rights there, and the real
/// publisher of that namespace's account leads and publishes. In a
/// namespace where nodegate is not installed (no `app.kubernetes.io/part-of:
/// nodegate` label) the same names are anyone's. Emulator only: it needs a
/// second install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_in_another_namespace_the_roster_is_still_guarded() {
    if std::env::var_os(nodegate_e2e::cluster::REAL_CLUSTER_ENV).is_some() {
        eprintln!("skipped on a real cluster: needs a second install in another namespace");
        return;
    }
    const OTHER: &str = "platform-gates";
    const UNRELATED: &str = "team-a";
    let rendered =
        nodegate_e2e::manifests::kustomize_in_namespace(OTHER, "manifests", &["pruning"]).unwrap();
    let objects = nodegate_e2e::manifests::by_kind_and_name(&rendered).unwrap();
    let policy = &objects[&(
        "ValidatingAdmissionPolicy".to_string(),
        "nodegate-roster-writers".to_string(),
    )];
    assert!(
        !serde_json::to_string(policy)
            .unwrap()
            .contains(":nodegate:"),
        "the writers' policy names no namespace: {policy}"
    );
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(vec![
            rendered.clone(),
            editor_rbac("editor", OTHER),
            editor_rbac("editor", UNRELATED),
        ]),
        ..Default::default()
    })
    .await
    .unwrap();
    for ((kind, _), obj) in &objects {
        if matches!(
            kind.as_str(),
            "Namespace" | "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"
        ) {
            emu.apply(&obj.to_string()).unwrap();
        }
    }
    let namespace = &objects[&("Namespace".to_string(), OTHER.to_string())];
    assert_eq!(
        namespace["metadata"]["labels"]["app.kubernetes.io/part-of"], "nodegate",
        "kustomize keeps the install's Namespace label"
    );
    emu.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": UNRELATED}})
            .to_string(),
    )
    .unwrap();

    // That namespace's publisher account: the real binary leads and publishes.
    let account = format!("system:serviceaccount:{OTHER}:nodegate-roster");
    let admin = emu.client(users::ADMIN).await.unwrap();
    let mut p = publisher(&emu.kubeconfig(&account).unwrap(), OTHER, "moved-0", 4);
    eventually("the moved publisher leads", || async {
        let l = holder(&admin, OTHER).await?;
        (holder_of(&l) == Some("moved-0")).then_some(())
    })
    .await;
    eventually("the moved roster is published", || async {
        published(&admin, OTHER, 4).await
    })
    .await;

    let editor = emu.client("editor").await.unwrap();
    let leases: Api<Lease> = Api::namespaced(editor.clone(), OTHER);
    let cms: Api<ConfigMap> = Api::namespaced(editor.clone(), OTHER);
    let lease_msg =
        "only the nodegate-roster ServiceAccount may write the roster Lease, not editor";
    let mut taken = leases.get(DEFAULT_NAME).await.unwrap();
    taken
        .spec
        .get_or_insert_with(Default::default)
        .holder_identity = Some("editor".into());
    refused(
        "editor takes the moved Lease",
        leases
            .replace(DEFAULT_NAME, &PostParams::default(), &taken)
            .await,
        &[WRITERS, lease_msg],
    );
    refused(
        "editor deletes the moved Lease",
        leases.delete(DEFAULT_NAME, &DeleteParams::default()).await,
        &[WRITERS, lease_msg],
    );
    let shard0 = shard::name_of(DEFAULT_NAME, 0);
    let mut poisoned = cms.get(&shard0).await.unwrap();
    poisoned.data = Some(BTreeMap::from([(
        shard::DATA_KEY.to_string(),
        "{}".to_string(),
    )]));
    refused(
        "editor rewrites a moved shard",
        cms.replace(&shard0, &PostParams::default(), &poisoned)
            .await,
        &[
            WRITERS,
            "only the nodegate-roster ServiceAccount may write roster shards, not editor",
        ],
    );
    // The account the old policy exempted by name has no rights here.
    let old = Api::<Lease>::namespaced(emu.client(users::ROSTER).await.unwrap(), OTHER);
    refused(
        "nodegate's publisher account writes the moved Lease",
        old.replace(DEFAULT_NAME, &PostParams::default(), &taken)
            .await,
        &[&format!(
            "User \"{}\" cannot update resource \"leases\"",
            users::ROSTER
        )],
    );
    // Deleted and absent: the editor cannot be the one who creates it.
    p.stop().await.unwrap();
    assert_never_refused(&p);
    Api::<Lease>::namespaced(admin.clone(), OTHER)
        .delete(DEFAULT_NAME, &DeleteParams::default())
        .await
        .unwrap();
    refused(
        "editor creates the moved Lease",
        leases
            .create(&PostParams::default(), &lease(DEFAULT_NAME, "editor"))
            .await,
        &[WRITERS, lease_msg],
    );

    // Where nodegate is not installed, the names are nobody's.
    Api::<Lease>::namespaced(editor.clone(), UNRELATED)
        .create(&PostParams::default(), &lease(DEFAULT_NAME, "editor"))
        .await
        .expect("a Lease of that name in an unrelated namespace");
    Api::<ConfigMap>::namespaced(editor, UNRELATED)
        .create(&PostParams::default(), &config_map(&shard0, true))
        .await
        .expect("a ConfigMap of that name in an unrelated namespace");
}
