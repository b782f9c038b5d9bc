//! The emulator's own semantics, pinned against what kube-apiserver does
//! (each behaviour and its upstream function: emulator/README.md). Each test starts a fresh emulator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use nodegate_emulator::admission::{MATCH_CONDITION_ERRORS, MATCH_CONDITION_EXCLUSIONS};
use nodegate_emulator::fake_webhook::{FakeReply, FakeWebhook};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::taint_eviction_controller::TaintEvictionController;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::{Value, json};

const NOT_READY: &str = "node.kubernetes.io/not-ready";

async fn emulator() -> Emulator {
    Emulator::start(EmulatorOptions::default()).await.unwrap()
}

async fn nodes(emu: &Emulator, user: &str) -> Api<Node> {
    Api::all(emu.client(user).await.unwrap())
}

/// A fresh emulator holding node `a`, and the admin's Node API.
async fn with_node_a() -> (Emulator, Api<Node>) {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    (emu, api)
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"pool": "a"}},
        "status": {"nodeInfo": {"bootID": "boot-1"}}
    }))
    .unwrap()
}

fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

/// Creates node `a`, expecting the API server to refuse it.
async fn create_refused(api: &Api<Node>) -> kube::Error {
    api.create(&PostParams::default(), &node("a"))
        .await
        .expect_err("the API server should refuse this create")
}

fn api_reason(e: &kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn poll<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn create_adds_not_ready_taint_and_rejects_duplicates() {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert_eq!(taint_keys(&n), vec![NOT_READY]);
    assert!(n.metadata.resource_version.is_some());
    assert!(n.metadata.uid.is_some());
    // Nodes keep status on create.
    assert_eq!(n.status.unwrap().node_info.unwrap().boot_id, "boot-1");
    let err = create_refused(&api).await;
    assert_eq!(api_reason(&err).0, 409);
    assert_eq!(api_reason(&err).1, "AlreadyExists");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let err = api.create(&dry, &node("a")).await.unwrap_err();
    assert_eq!(api_reason(&err).1, "AlreadyExists");
}

#[tokio::test]
async fn dry_run_runs_admission_and_stores_nothing() {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    let rv0 = emu.store().current_rv();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let n = api.create(&dry, &node("a")).await.unwrap();
    assert_eq!(taint_keys(&n), vec![NOT_READY]);
    assert!(api.get_opt("a").await.unwrap().is_none());
    assert_eq!(emu.store().current_rv(), rv0);

    api.create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    let before = api.get("b").await.unwrap();
    let pp = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let out = api
        .patch(
            "b",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(out.metadata.labels.unwrap()["x"], "y");
    let after = api.get("b").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert!(!after.metadata.labels.unwrap().contains_key("x"));
    api.delete(
        "b",
        &DeleteParams {
            dry_run: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(api.get_opt("b").await.unwrap().is_some());
}

#[tokio::test]
async fn main_writes_keep_status_and_status_writes_keep_spec() {
    let (_emu, api) = with_node_a().await;

    // A main-resource write cannot change status.
    let n = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": {"unschedulable": true},
                "status": {"nodeInfo": {"bootID": "forged"}}
            })),
        )
        .await
        .unwrap();
    assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(n.status.unwrap().node_info.unwrap().boot_id, "boot-1");

    // A status write cannot change spec, but metadata persists.
    let n = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"annotations": {"seen": "yes"}},
                "spec": {"taints": [], "unschedulable": false},
                "status": {"nodeInfo": {"bootID": "boot-2"}}
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        n.status
            .as_ref()
            .unwrap()
            .node_info
            .as_ref()
            .unwrap()
            .boot_id,
        "boot-2"
    );
    assert_eq!(taint_keys(&n), vec![NOT_READY]);
    assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(n.metadata.annotations.unwrap()["seen"], "yes");

    // PUT on the main resource with a different status: status kept.
    let mut cur = api.get("a").await.unwrap();
    cur.status
        .as_mut()
        .unwrap()
        .node_info
        .as_mut()
        .unwrap()
        .boot_id = "forged".into();
    let n = api
        .replace("a", &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_eq!(n.status.unwrap().node_info.unwrap().boot_id, "boot-2");
}

#[tokio::test]
async fn stale_resource_version_is_a_conflict() {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    let first = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    let err = api
        .replace("a", &PostParams::default(), &first)
        .await
        .unwrap_err();
    let (code, reason, msg) = api_reason(&err);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(msg.contains("the object has been modified"), "{msg}");
    // A patch carrying a stale resourceVersion (the node controller's lock) conflicts too.
    let stale = first.metadata.resource_version.clone().unwrap();
    let err = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"resourceVersion": stale}, "spec": {"taints": []}
            })),
        )
        .await
        .unwrap_err();
    assert_eq!(api_reason(&err).0, 409);
    // A JSON patch whose test fails is rejected and changes nothing.
    let err = api
        .patch("a", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(json!([
            {"op": "test", "path": "/spec/taints", "value": []},
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "x", "effect": "NoSchedule"}}
        ])).unwrap()))
        .await
        .unwrap_err();
    assert_eq!(api_reason(&err).0, 422);
    assert_eq!(taint_keys(&api.get("a").await.unwrap()), vec![NOT_READY]);
}

#[tokio::test]
async fn strategic_merge_replaces_taints_and_merges_conditions() {
    let (_emu, api) = with_node_a().await;
    let n = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}
            })),
        )
        .await
        .unwrap();
    assert_eq!(taint_keys(&n), vec!["b"]);
    api.patch_status("a", &PatchParams::default(), &Patch::Strategic(json!({
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]}
    })))
    .await
    .unwrap();
    let n = api
        .patch_status("a", &PatchParams::default(), &Patch::Strategic(json!({
            "status": {"$setElementOrder/conditions": [{"type": "Ready"}, {"type": "DiskPressure"}],
                       "conditions": [{"type": "Ready", "status": "False"}]}
        })))
        .await
        .unwrap();
    let conds = n.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[0].status, "False");
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    for i in 0..5 {
        let mut n = node(&format!("n{i}"));
        n.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("parity".into(), (i % 2).to_string());
        api.create(&PostParams::default(), &n).await.unwrap();
    }
    let even = api
        .list(&ListParams::default().labels("parity=0"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 3);
    let one = api
        .list(&ListParams::default().fields("metadata.name=n3"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    let err = api
        .list(&ListParams::default().fields("spec.nodeName=x"))
        .await
        .unwrap_err();
    assert_eq!(api_reason(&err).0, 400);

    let page = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.metadata.remaining_item_count, Some(3));
    let mut names: Vec<String> = page
        .items
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    let mut cont = page.metadata.continue_;
    while let Some(c) = cont.filter(|c| !c.is_empty()) {
        let p = api
            .list(&ListParams::default().limit(2).continue_token(&c))
            .await
            .unwrap();
        names.extend(p.items.iter().map(|n| n.metadata.name.clone().unwrap()));
        cont = p.metadata.continue_;
    }
    assert_eq!(names, vec!["n0", "n1", "n2", "n3", "n4"]);
}

#[tokio::test]
async fn unknown_token_is_401() {
    let emu = emulator().await;
    let r = emu
        .raw(None, "GET", "/api/v1/nodes", "application/json", vec![])
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            "/apis",
            "application/json",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json().unwrap()["kind"], "APIGroupList");
}

#[tokio::test]
async fn expired_resource_version_is_an_error_event_in_a_200_stream() {
    let (emu, api) = with_node_a().await;
    let old = emu.store().current_rv() - 1;
    api.create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    emu.compact();
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            &format!("/api/v1/nodes?watch=true&resourceVersion={old}&timeoutSeconds=1"),
            "application/json",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let lines: Vec<Value> = r
        .body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    assert_eq!(lines[0]["object"]["reason"], "Expired");

    // kube's typed watch surfaces it as an Error event (not a transport error).
    let mut s = api
        .watch(&WatchParams::default(), &old.to_string())
        .await
        .unwrap()
        .boxed();
    match s.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_replays_from_resource_version_with_bookmarks() {
    let emu = Emulator::start(EmulatorOptions {
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = nodes(&emu, users::ADMIN).await;
    let a = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut s = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while let Some(ev) = s.try_next().await.unwrap() {
        match ev {
            WatchEvent::Modified(_) => seen.push("MODIFIED"),
            WatchEvent::Deleted(_) => seen.push("DELETED"),
            WatchEvent::Added(_) => seen.push("ADDED"),
            WatchEvent::Bookmark(b) => {
                assert!(!b.metadata.resource_version.is_empty());
                seen.push("BOOKMARK");
                break;
            }
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, vec!["MODIFIED", "DELETED", "BOOKMARK"]);
}

#[tokio::test]
async fn kube_runtime_watcher_works_unchanged() {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    for i in 0..3 {
        api.create(&PostParams::default(), &node(&format!("pre{i}")))
            .await
            .unwrap();
    }
    // Paged initial list (limit 2) then a watch.
    let mut stream = watcher(api.clone(), watcher::Config::default().page_size(2))
        .applied_objects()
        .boxed();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 3 {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.insert(n.metadata.name.unwrap());
    }
    api.create(&PostParams::default(), &node("late"))
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = stream.try_next().await.unwrap().unwrap();
            if n.metadata.name.as_deref() == Some("late") {
                return n;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(taint_keys(&n), vec![NOT_READY]);
}

#[tokio::test]
async fn node_restriction() {
    let emu = emulator().await;
    let admin = nodes(&emu, users::ADMIN).await;
    admin
        .create(&PostParams::default(), &node("other"))
        .await
        .unwrap();
    let kubelet = SimKubelet::new(&emu, "mine")
        .await
        .unwrap()
        .register_with_taints(vec![
            json!({"key": "example.com/reg", "effect": "NoSchedule"}),
        ]);
    let n = kubelet.register().await.unwrap();
    assert_eq!(taint_keys(&n), vec!["example.com/reg", NOT_READY]);
    let api = kubelet.api();
    // Not its own node.
    let err = api
        .patch(
            "other",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap_err();
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(
        msg.contains("is not allowed to modify node \"other\""),
        "{msg}"
    );
    // Its own taints.
    let err = api
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": []}})),
        )
        .await
        .unwrap_err();
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(msg.contains("is not allowed to modify taints"), "{msg}");
    // Nor labels in the kubernetes.io namespaces outside its own set.
    let err = api
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}})),
        )
        .await
        .unwrap_err();
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(
        msg.contains("is not allowed to modify labels: node-role.kubernetes.io/worker"),
        "{msg}"
    );
    // Its own labels elsewhere are fine (nodegate's former exclude label too).
    api.patch(
        "mine",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"nodegate.dev/exclude": "true"}}})),
    )
    .await
    .unwrap();
    // Nothing under node-restriction.kubernetes.io, main resource or status.
    for status in [false, true] {
        let patch = Patch::Merge(json!({"metadata": {"labels": {RESTRICTED: "true"}}}));
        let err = if status {
            api.patch_status("mine", &PatchParams::default(), &patch)
                .await
        } else {
            api.patch("mine", &PatchParams::default(), &patch).await
        }
        .unwrap_err();
        let (code, _, msg) = api_reason(&err);
        assert_eq!(code, 403, "status: {status}");
        assert!(
            msg.contains(&format!("is not allowed to modify labels: {RESTRICTED}")),
            "{msg}"
        );
    }
    // Status writes and restarts are fine.
    kubelet.heartbeat().await.unwrap();
    kubelet.restart().await.unwrap();
    // An admin's node-restriction label stays out of the kubelet's reach
    // but does not block its writes that leave it as it is.
    admin
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {RESTRICTED: "true"}}})),
        )
        .await
        .unwrap();
    kubelet.heartbeat().await.unwrap();
    kubelet.restart().await.unwrap();
    for labels in [json!({RESTRICTED: "false"}), json!({RESTRICTED: null})] {
        let err = api
            .patch(
                "mine",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .unwrap_err();
        let (code, _, msg) = api_reason(&err);
        assert_eq!(code, 403, "{labels}");
        assert!(
            msg.contains(&format!("is not allowed to modify labels: {RESTRICTED}")),
            "{msg}"
        );
    }
    // Nor at create: a kubelet cannot register with it (`--node-labels`).
    let err = SimKubelet::new(&emu, "optout")
        .await
        .unwrap()
        .with_label(RESTRICTED, "true")
        .register()
        .await
        .unwrap_err();
    let Some(kube::Error::Api(e)) = err.downcast_ref::<kube::Error>() else {
        panic!("{err:#}");
    };
    assert_eq!(e.code, 403);
    assert!(
        e.message.contains(&format!(
            "node \"optout\" is not allowed to set the following labels: {RESTRICTED}"
        )),
        "{}",
        e.message
    );
    assert!(admin.get_opt("optout").await.unwrap().is_none());
}

/// nodegate's exclude label: NodeRestriction keeps every label under this
/// prefix out of a kubelet's reach.
const RESTRICTED: &str = "node-restriction.kubernetes.io/nodegate-exclude";

#[tokio::test]
async fn pods_binding_status_and_field_selector() {
    let emu = emulator().await;
    let pods: Api<Pod> = Api::namespaced(emu.client(users::ADMIN).await.unwrap(), "default");
    let p: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap();
    let p = pods.create(&PostParams::default(), &p).await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    let r = emu
        .raw(Some(users::SCHEDULER), "POST", "/api/v1/namespaces/default/pods/p1/binding", "application/json",
             serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "n1"}})).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status, 201);
    let r2 = emu
        .raw(
            Some(users::SCHEDULER),
            "POST",
            "/api/v1/namespaces/default/pods/p1/binding",
            "application/json",
            serde_json::to_vec(&json!({"target": {"name": "n2"}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r2.status, 409);
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(on_n1.items.len(), 1);
    let kubelet = SimKubelet::new(&emu, "n1").await.unwrap();
    assert_eq!(kubelet.sync_pods().await.unwrap(), 1);
    assert_eq!(
        pods.get("p1")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
}

/// A NoExecute taint on a node, as nodegate's strict mode adds at a new
/// boot: the kubelet refuses the bound pods that do not tolerate it when it
/// starts, and the taint-eviction controller deletes them; a pod tolerating
/// it stays. NoSchedule taints stop neither.
#[tokio::test]
async fn a_no_execute_taint_gets_untolerating_pods_refused_at_kubelet_start_and_evicted() {
    const GATE: &str = "nodegate.dev/agent-not-ready";
    let emu = emulator().await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut kubelet = SimKubelet::new(&emu, "n1").await.unwrap();
    kubelet.register().await.unwrap();
    let tolerating = |effect: &str| json!([{"key": GATE, "operator": "Exists", "effect": effect}]);
    for (name, node, tolerations) in [
        ("plain", "n1", json!([])),
        ("schedule-only", "n1", tolerating("NoSchedule")),
        ("tolerating", "n1", tolerating("NoExecute")),
        ("elsewhere", "n2", json!([])),
    ] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "tolerations": tolerations,
                     "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    // First boot: only TaintNodesByCondition's NoSchedule taint, every pod starts.
    let first = kubelet.admit_pods().await.unwrap();
    assert_eq!(first.started.len(), 3, "{first:?}");
    assert!(first.rejected.is_empty());

    let mut taints = nodes.get("n1").await.unwrap().spec.unwrap().taints.unwrap();
    taints.push(
        serde_json::from_value(json!({"key": GATE, "value": "true", "effect": "NoExecute"}))
            .unwrap(),
    );
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap();
    kubelet.reboot().await.unwrap();
    let second = kubelet.admit_pods().await.unwrap();
    let rejected: Vec<&str> = second.rejected.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(rejected, ["default/plain", "default/schedule-only"]);
    assert_eq!(second.kept, ["default/tolerating"]);
    let status = pods.get("plain").await.unwrap().status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("TaintToleration"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
        )
    );

    let controller = TaintEvictionController::start(admin.clone());
    let left = poll(
        "the untolerating pods evicted",
        Duration::from_secs(10),
        || async {
            let names: Vec<String> = pods
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            (names.len() == 2).then_some(names)
        },
    )
    .await;
    assert_eq!(left, ["elsewhere", "tolerating"]);
    let evicted: Vec<(String, String)> = controller
        .evictions()
        .into_iter()
        .map(|e| (e.pod.name, e.node))
        .collect();
    assert_eq!(
        evicted,
        [
            ("plain".to_string(), "n1".to_string()),
            ("schedule-only".into(), "n1".into())
        ]
    );
    controller.stop().await;
}

// ---- webhooks, with a scripted fake ----

async fn with_fake(
    overrides: Value,
    handler: impl Fn(&Value) -> FakeReply + Send + Sync + 'static,
) -> (Emulator, FakeWebhook) {
    let fake = FakeWebhook::start("fake", "test", handler).await.unwrap();
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![fake.config("fake", overrides)],
        service_endpoints: HashMap::from([(fake.service().to_string(), fake.addr())]),
        ..Default::default()
    })
    .await
    .unwrap();
    (emu, fake)
}

fn add_label_patch(key: &str) -> Value {
    json!([{"op": "add", "path": format!("/metadata/labels/{}", key.replace('~', "~0").replace('/', "~1")), "value": "yes"}])
}

#[tokio::test]
async fn webhook_review_shape_patch_and_warning() {
    let (emu, fake) = with_fake(json!({}), |req| FakeReply {
        patch: (req["operation"] == "CREATE").then(|| add_label_patch("example.com/hooked")),
        warnings: vec!["added \"hooked\" — ok".into()],
        ..Default::default()
    })
    .await;
    let body = serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a", "labels": {"pool": "x"}}})).unwrap();
    let r = emu
        .raw(
            Some(users::ADMIN),
            "POST",
            "/api/v1/nodes?fieldManager=t&fieldValidation=Strict",
            "application/json",
            body,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(
        r.json().unwrap()["metadata"]["labels"]["example.com/hooked"],
        "yes"
    );
    assert_eq!(r.warnings(), vec!["added \"hooked\" — ok".to_string()]);

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["uri"], "/mutate?timeout=2s");
    let review = &reqs[0]["review"];
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    let req = &review["request"];
    assert!(!req["uid"].as_str().unwrap().is_empty());
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "Node"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "nodes"})
    );
    assert_eq!(req["requestKind"], req["kind"]);
    assert!(req.get("subResource").is_none());
    assert_eq!(req["name"], "a");
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(req["userInfo"]["username"], "admin");
    assert!(req["oldObject"].is_null() && req.get("oldObject").is_some());
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["options"]["kind"], "CreateOptions");
    assert_eq!(req["options"]["fieldManager"], "t");
    // TaintNodesByCondition ran before the webhook.
    assert_eq!(req["object"]["spec"]["taints"][0]["key"], NOT_READY);

    // A status write arrives with its subresource and the old object.
    let api = nodes(&emu, users::ADMIN).await;
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "b"}}})),
    )
    .await
    .unwrap();
    let reqs = fake.requests();
    let req = &reqs.last().unwrap()["review"]["request"];
    assert_eq!(req["subResource"], "status");
    assert_eq!(req["requestSubResource"], "status");
    assert_eq!(req["operation"], "UPDATE");
    assert_eq!(req["options"]["kind"], "UpdateOptions");
    assert_eq!(req["oldObject"]["metadata"]["name"], "a");
}

/// The condition nodegate shipped before the real-cluster fix: it reads
/// `request.subResource` unguarded.
const UNGUARDED: &str = "request.subResource != 'status' || object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID";
/// The same with the `has()` guard the real API server requires.
const GUARDED: &str = "!has(request.subResource) || request.subResource != 'status' || object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID";

fn condition(expr: &str, policy: &str) -> Value {
    json!({"failurePolicy": policy, "matchConditions": [{"name": "boot", "expression": expr}]})
}

#[tokio::test]
async fn match_conditions_are_cel() {
    let (emu, fake) = with_fake(condition(GUARDED, "Fail"), |_| FakeReply::default()).await;
    let kubelet = SimKubelet::new(&emu, "a").await.unwrap();
    kubelet.register().await.unwrap();
    assert_eq!(fake.requests().len(), 1, "create goes through");
    kubelet.heartbeat().await.unwrap();
    assert_eq!(
        fake.requests().len(),
        1,
        "a heartbeat keeps the bootID: filtered out"
    );
    let mut kubelet = kubelet;
    kubelet.reboot().await.unwrap();
    // The reboot: a create (409 after admission) then a status write with a new bootID.
    assert_eq!(fake.requests().len(), 3);
    assert_eq!(
        fake.requests()[2]["review"]["request"]["subResource"],
        "status"
    );
    let m = emu.admission_metrics();
    assert_eq!(m.get(MATCH_CONDITION_ERRORS, "fake.example.com", None), 0);
    assert_eq!(
        m.get(
            MATCH_CONDITION_EXCLUSIONS,
            "fake.example.com",
            Some("UPDATE")
        ),
        1,
        "the heartbeat was excluded"
    );
}

/// The real-cluster bug, reproduced: `request.subResource` is absent on a
/// main-resource write, the condition errors, `failurePolicy: Ignore` skips
/// the webhook silently — and the error is counted where the API server
/// counts it.
#[tokio::test]
async fn unguarded_subresource_skips_the_webhook_on_create_and_is_counted() {
    let (emu, fake) = with_fake(condition(UNGUARDED, "Ignore"), |_| FakeReply {
        patch: Some(add_label_patch("example.com/hooked")),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let created = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert!(fake.requests().is_empty(), "the webhook was never called");
    assert!(
        !created
            .metadata
            .labels
            .unwrap()
            .contains_key("example.com/hooked"),
        "the create went on without the webhook's mutation"
    );
    let m = emu.admission_metrics();
    assert_eq!(
        m.get(MATCH_CONDITION_ERRORS, "fake.example.com", Some("CREATE")),
        1
    );
    assert_eq!(
        m.get(
            MATCH_CONDITION_EXCLUSIONS,
            "fake.example.com",
            Some("CREATE")
        ),
        1
    );
    let ignored = emu.ignored_webhook_failures();
    assert!(
        ignored.len() == 1 && ignored[0].contains("match conditions: boot"),
        "{ignored:?}"
    );
    // A main-resource UPDATE is skipped the same way; a status write is not.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    assert!(fake.requests().is_empty());
    assert_eq!(
        m.get(MATCH_CONDITION_ERRORS, "fake.example.com", Some("UPDATE")),
        1
    );
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "boot-2"}}})),
    )
    .await
    .unwrap();
    assert_eq!(fake.requests().len(), 1, "status write with a new bootID");

    // The same counters on the emulator's /metrics, as on kube-apiserver's.
    let r = emu
        .raw(Some(users::ADMIN), "GET", "/metrics", "", Vec::new())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        text.contains(&format!(
            "{MATCH_CONDITION_ERRORS}{{kind=\"webhook\",name=\"fake.example.com\",operation=\"CREATE\",type=\"admit\"}} 1"
        )),
        "{text}"
    );
}

#[tokio::test]
async fn guarded_condition_calls_the_webhook_on_create() {
    let (emu, fake) = with_fake(condition(GUARDED, "Ignore"), |_| FakeReply {
        patch: Some(add_label_patch("example.com/hooked")),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let created = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(
        created.metadata.labels.unwrap()["example.com/hooked"],
        "yes"
    );
    assert_eq!(
        emu.admission_metrics()
            .get(MATCH_CONDITION_ERRORS, "fake.example.com", None),
        0
    );
    assert!(emu.ignored_webhook_failures().is_empty());
}

/// `generic/webhook.go` ShouldCallHook: a match-condition error under
/// `failurePolicy: Fail` refuses the request with 403, without calling.
#[tokio::test]
async fn match_condition_error_follows_failure_policy() {
    let (emu, fake) = with_fake(condition(UNGUARDED, "Fail"), |_| FakeReply::default()).await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, reason, msg) = api_reason(&err);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"), "{msg}");
    assert!(msg.contains("boot: evaluation failed"), "{msg}");
    assert!(fake.requests().is_empty());
    assert_eq!(
        emu.admission_metrics()
            .get(MATCH_CONDITION_ERRORS, "fake.example.com", Some("CREATE")),
        1
    );
}

/// `matcher.go` Match: a false condition skips the webhook even when another
/// condition errors, whatever the failurePolicy.
#[tokio::test]
async fn a_false_condition_wins_over_an_erroring_one() {
    let (emu, fake) = with_fake(
        json!({"failurePolicy": "Fail", "matchConditions": [
            {"name": "bad", "expression": "object.nope.deeper == 'x'"},
            {"name": "never", "expression": "false"}]}),
        |_| FakeReply::default(),
    )
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert!(fake.requests().is_empty());
    assert_eq!(
        emu.admission_metrics()
            .get(MATCH_CONDITION_ERRORS, "fake.example.com", None),
        1
    );
}

#[tokio::test]
async fn object_selector_matches_old_or_new() {
    let sel = json!({"objectSelector": {"matchExpressions": [{"key": "skip", "operator": "NotIn", "values": ["true"]}]}});
    let (emu, fake) = with_fake(sel, |_| FakeReply::default()).await;
    let api = nodes(&emu, users::ADMIN).await;
    let mut n = node("a");
    n.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("skip".into(), "true".into());
    api.create(&PostParams::default(), &n).await.unwrap();
    assert!(fake.requests().is_empty());
    // Removing the label: the new object matches, so it is called.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"skip": null}}})),
    )
    .await
    .unwrap();
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn failure_policy_fail_and_ignore() {
    // Fail: an unreachable service fails the create with 500.
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply::default()).await;
    emu.remove_service_endpoint("fake.test.svc");
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 500);
    assert!(
        msg.contains("failed calling webhook \"fake.example.com\""),
        "{msg}"
    );

    // Ignore + a webhook slower than timeoutSeconds: the write goes through untouched.
    let (emu, fake) = with_fake(
        json!({"failurePolicy": "Ignore", "timeoutSeconds": 1}),
        |_| FakeReply {
            delay: Duration::from_secs(3),
            patch: Some(add_label_patch("late")),
            ..Default::default()
        },
    )
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let started = std::time::Instant::now();
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "timeout honoured"
    );
    assert!(!n.metadata.labels.unwrap().contains_key("late"));
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn unappliable_patch_fails_even_with_ignore() {
    let (emu, _fake) = with_fake(json!({"failurePolicy": "Ignore"}), |_| FakeReply {
        patch: Some(json!([{"op": "add", "path": "/spec/nothere/-", "value": 1}])),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    assert_eq!(api_reason(&err).0, 500);
    assert!(api.get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn invalid_response_follows_failure_policy() {
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply {
        raw: Some(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "wrong", "allowed": true}})),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 500);
    assert!(msg.contains("expected response.uid"), "{msg}");
}

#[tokio::test]
async fn side_effects_decide_dry_run() {
    let (emu, fake) = with_fake(json!({"sideEffects": "Unknown"}), |_| FakeReply::default()).await;
    let api = nodes(&emu, users::ADMIN).await;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let err = api.create(&dry, &node("a")).await.unwrap_err();
    assert_eq!(api_reason(&err).0, 400);
    assert!(fake.requests().is_empty());

    let (emu, fake) = with_fake(json!({"sideEffects": "NoneOnDryRun"}), |_| {
        FakeReply::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&dry, &node("a")).await.unwrap();
    assert_eq!(fake.requests()[0]["review"]["request"]["dryRun"], true);
}

#[tokio::test]
async fn webhook_denial_is_returned() {
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply {
        deny: Some("no thanks".into()),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(msg.contains("denied the request: no thanks"), "{msg}");
}

#[tokio::test]
async fn server_name_is_verified_against_the_certificate() {
    // The fake's certificate is for fake.test.svc; point another service name at it.
    let fake = FakeWebhook::start("fake", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let cfg = fake.config(
        "fake",
        json!({"clientConfig": {"service": {"name": "impostor", "namespace": "test"}}}),
    );
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![cfg],
        service_endpoints: HashMap::from([("impostor.test.svc".to_string(), fake.addr())]),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    assert_eq!(api_reason(&err).0, 500);
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn reinvocation_if_needed_reruns_an_earlier_webhook_once() {
    let first = FakeWebhook::start("first", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let second = FakeWebhook::start("second", "test", |req| FakeReply {
        patch: (req["object"]["metadata"]["labels"].get("second").is_none())
            .then(|| add_label_patch("second")),
        ..Default::default()
    })
    .await
    .unwrap();
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![
            first.config("a-first", json!({"reinvocationPolicy": "IfNeeded"})),
            second.config("b-second", json!({"reinvocationPolicy": "IfNeeded"})),
        ],
        service_endpoints: HashMap::from([
            (first.service().to_string(), first.addr()),
            (second.service().to_string(), second.addr()),
        ]),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = nodes(&emu, users::ADMIN).await;
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert_eq!(n.metadata.labels.unwrap()["second"], "yes");
    // first saw the object before second changed it: called again, once.
    assert_eq!(first.requests().len(), 2);
    assert_eq!(
        first.requests()[1]["review"]["request"]["object"]["metadata"]["labels"]["second"],
        "yes"
    );
    // second made the last change itself: not reinvoked.
    assert_eq!(second.requests().len(), 1);
}

#[tokio::test]
async fn a_webhook_that_taints_a_kubelet_update_gets_it_forbidden() {
    // What nodegate must never do: mutate taints on the kubelet's own writes.
    let (emu, _fake) = with_fake(json!({}), |req| FakeReply {
        patch: (req["operation"] == "UPDATE").then(|| {
            json!([{"op": "add", "path": "/spec/taints/-", "value": {"key": "example.com/x", "effect": "NoSchedule"}}])
        }),
        ..Default::default()
    })
    .await;
    let kubelet = SimKubelet::new(&emu, "a").await.unwrap();
    kubelet.register().await.unwrap();
    let err = kubelet.heartbeat().await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("is not allowed to modify taints"), "{msg}");
    poll("no change stored", Duration::from_secs(1), || async {
        let n = kubelet.api().get("a").await.ok()?;
        (taint_keys(&n) == vec![NOT_READY]).then_some(())
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_watcher_relists_after_a_410() {
    let (emu, api) = with_node_a().await;
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut restarts = 0;
    // Initial list.
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(watcher::Event::InitDone) => {
                restarts += 1;
                break;
            }
            Some(_) => {}
            None => panic!("ended"),
        }
    }
    // Changes the watcher will miss, then history gone and the watch cut:
    // its re-watch from the old resourceVersion gets the 410 ERROR event.
    api.create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    emu.compact();
    emu.close_watches();
    let mut seen_b = false;
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::InitDone) => restarts += 1,
                Ok(watcher::Event::InitApply(n) | watcher::Event::Apply(n))
                    if n.metadata.name.as_deref() == Some("b") =>
                {
                    seen_b = true
                }
                // kube reports the 410 as an error item, then re-lists.
                Ok(_) | Err(_) => {}
            }
            if seen_b && restarts >= 2 {
                break;
            }
        }
    })
    .await
    .expect("the watcher recovered by re-listing");
    assert!(seen_b);
    assert!(restarts >= 2, "a fresh list after the 410");
}

#[tokio::test]
async fn kube_runtime_event_recorder_and_core_events() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let emu = emulator().await;
    let client = emu.client(users::AGENT).await.unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "nodegate-agent".into(),
            instance: None,
        },
    );
    let node_ref = k8s_openapi::api::core::v1::ObjectReference {
        kind: Some("Node".into()),
        name: Some("n1".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: "AgentReady".into(),
        note: Some("ready".into()),
        action: "RemoveTaint".into(),
        secondary: None,
    };
    recorder.publish(&ev, &node_ref).await.unwrap();
    recorder.publish(&ev, &node_ref).await.unwrap(); // a series: merge patch of the same event
    let events: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].series.as_ref().unwrap().count, 2);
    assert_eq!(list.items[0].reason.as_deref(), Some("AgentReady"));

    let core: Api<CoreEvent> = Api::namespaced(client, "default");
    let e: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "n1.1"},
        "involvedObject": {"kind": "Node", "name": "n1"},
        "reason": "Rebooted", "type": "Warning", "message": "bootID changed"
    }))
    .unwrap();
    core.create(&PostParams::default(), &e).await.unwrap();
    let l = core
        .list(&ListParams::default().fields("involvedObject.name=n1"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.items[0].reason.as_deref(), Some("Rebooted"));
}

#[tokio::test]
async fn rules_tell_nodes_from_nodes_status() {
    for (resources, status_calls) in [
        (json!(["nodes"]), 0),
        (json!(["nodes/*"]), 1),
        (json!(["nodes", "nodes/status"]), 1),
    ] {
        let rules = json!({"rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": resources.clone()}]});
        let (emu, fake) = with_fake(rules, |_| FakeReply::default()).await;
        let api = nodes(&emu, users::ADMIN).await;
        api.create(&PostParams::default(), &node("a"))
            .await
            .unwrap();
        api.patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "b"}}})),
        )
        .await
        .unwrap();
        let subs: Vec<Value> = fake
            .requests()
            .iter()
            .map(|r| r["review"]["request"]["subResource"].clone())
            .collect();
        let on_status = subs.iter().filter(|s| *s == "status").count();
        assert_eq!(on_status, status_calls, "{resources}: {subs:?}");
        // kube-apiserver's matcher: a `*` subresource also matches the main
        // resource (`sub == "*" || sub == request's`), so `nodes/*` sees both.
        let main_calls = subs.iter().filter(|s| s.is_null()).count();
        assert_eq!(main_calls, 1, "{resources}");
    }
}

#[tokio::test]
async fn duplicate_taint_from_a_webhook_fails_validation() {
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply {
        patch: Some(json!([{"op": "add", "path": "/spec/taints/-", "value": {"key": NOT_READY, "effect": "NoSchedule"}}])),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, reason, msg) = api_reason(&err);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(msg.contains("Duplicate value"), "{msg}");
}

#[tokio::test]
async fn kube_runtime_streaming_list_watcher() {
    let (_emu, api) = with_node_a().await;
    // sendInitialEvents: ADDED for the state, then the initial-events-end bookmark.
    let mut stream = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(watcher::Event::InitApply(n)) => initial.push(n.metadata.name.unwrap()),
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => panic!("ended"),
        }
    }
    assert_eq!(initial, vec!["a"]);
    api.create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(next, Some(watcher::Event::Apply(n)) if n.metadata.name.as_deref() == Some("b"))
    );
}

#[tokio::test]
async fn bad_input_gets_a_status_and_the_server_keeps_serving() {
    let emu = emulator().await;
    let post = |path: &'static str, body: &'static [u8]| {
        let emu = &emu;
        async move {
            emu.raw(
                Some(users::ADMIN),
                "POST",
                path,
                "application/json",
                body.to_vec(),
            )
            .await
            .unwrap()
        }
    };
    for (path, body, code) in [
        ("/api/v1/nodes", &b"{not json"[..], 400),
        ("/api/v1/nodes", &b"[1,2]"[..], 400),
        (
            "/api/v1/nodes",
            &br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}"#[..],
            400,
        ),
        (
            "/api/v1/nodes",
            &br#"{"apiVersion":"v1","kind":"Node","metadata":{}}"#[..],
            422,
        ),
        (
            "/api/v1/nodes",
            &br#"{"apiVersion":"v1","kind":"Node","metadata":"weird","spec":"odd"}"#[..],
            422,
        ),
        (
            "/api/v1/namespaces/default/pods",
            &br#"{"metadata":{"name":"p"},"spec":"odd"}"#[..],
            201,
        ),
        (
            "/api/v1/namespaces/default/pods/p/binding",
            &br#"{"target":{"name":"n1"}}"#[..],
            201,
        ),
        ("/api/v1/nopes", &b"{}"[..], 404),
    ] {
        let r = post(path, body).await;
        assert_eq!(r.status, code, "{path} {}", String::from_utf8_lossy(body));
        if code >= 400 {
            assert_eq!(r.json().unwrap()["kind"], "Status");
        }
    }
    let r = emu
        .raw(
            Some(users::ADMIN),
            "PATCH",
            "/api/v1/nodes/x",
            "application/json-patch+json",
            b"[]".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            "/api/v1/nodes?labelSelector=a%20in%201",
            "",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            "/api/v1/nodes?continue=garbage",
            "",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    // Still serving.
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&PostParams::default(), &node("fine"))
        .await
        .unwrap();
}

/// `node_authorizer.go` authorizeNode: a kubelet reads only its own Node
/// (get, or list/watch with a `metadata.name` field selector), never
/// `nodes/status`, and may write (NodeRestriction limits what).
#[tokio::test]
async fn node_authorizer_limits_kubelet_reads() {
    let (emu, admin) = with_node_a().await;
    admin
        .create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    let kubelet = nodes(&emu, &users::node("a")).await;
    assert_eq!(
        kubelet.get("a").await.unwrap().metadata.name.as_deref(),
        Some("a")
    );
    let e = kubelet.get("b").await.unwrap_err();
    let (code, _, msg) = api_reason(&e);
    assert_eq!(code, 403, "{msg}");
    assert!(
        msg.contains("node 'a' cannot read 'b', only its own Node object"),
        "{msg}"
    );
    let e = kubelet.list(&ListParams::default()).await.unwrap_err();
    assert!(api_reason(&e).2.contains("cannot read all nodes"));
    let own = kubelet
        .list(&ListParams::default().fields("metadata.name=a"))
        .await
        .unwrap();
    assert_eq!(own.items.len(), 1);
    let r = emu
        .raw(
            Some(&users::node("a")),
            "GET",
            "/api/v1/nodes/a/status",
            "",
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 403, "a kubelet may not read nodes/status");
    kubelet
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "boot-2"}}})),
        )
        .await
        .unwrap();
    let e = kubelet
        .delete("a", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_reason(&e).0, 403);
}
