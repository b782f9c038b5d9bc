//! Storage and the REST verbs on Nodes: create (TaintNodesByCondition's
//! taint, AlreadyExists), dryRun, the main-resource and status strategies,
//! resourceVersion conflicts, strategic merge, list selectors and pages.

use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodegate_emulator::users;
use serde_json::json;

use crate::support::{
    NOT_READY, api_reason, create_refused, emulator, node, nodes, taint_keys, with_node_a,
};

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
