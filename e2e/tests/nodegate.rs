//! nodegate end to end: the real `nodegate-webhook` binary (certs from
//! nodegate-certs, the shipped MutatingWebhookConfiguration), the real
//! `kubectl`, and simulated kubelets — against a fresh emulator per test, or
//! a real cluster when NODEGATE_E2E_KUBECONFIG is set (see e2e/README.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use nodegate_e2e::cluster::Cluster;
use nodegate_e2e::standin::{AgentReadiness, StandInAgent};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::users;
use nodegate_shared::keys::{DEFAULT_TAINT, EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use serde_json::json;

const TAINT_KEY: &str = "nodegate.dev/agent-not-ready";
/// The exclude label before it moved under node-restriction.kubernetes.io.
const OLD_EXCLUDE_LABEL: &str = "nodegate.dev/exclude";

fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn has_taint(n: &Node) -> bool {
    taint_keys(n).iter().any(|k| k == TAINT_KEY)
}

async fn kubectl(c: &Cluster, args: &[&str]) -> Output {
    let out = c
        .kubectl(users::ADMIN)
        .unwrap()
        .args(args)
        .output()
        .await
        .unwrap();
    eprintln!(
        "kubectl {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Polls `f` until it holds; fails after `deadline`.
async fn eventually(what: &str, deadline: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + deadline;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < end,
            "not within {deadline:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts `f` holds on every poll for the whole window (a negative
/// property needs a window; it is longer than the positive 1 s bound).
async fn throughout(what: &str, window: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        assert!(f().await, "violated: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node registered by its simulated kubelet and marked ready by the agent
/// (taint removed, current bootID recorded); returns the agent's client too.
async fn registered_and_ready(c: &Cluster, prefix: &str) -> (String, SimKubelet, kube::Client) {
    let name = c.node_name(prefix);
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let agent = c.agent_client(&name).await.unwrap();
    StandInAgent::default()
        .mark_ready(&agent, &name)
        .await
        .unwrap();
    (name, kubelet, agent)
}

/// failurePolicy Ignore would hide a broken call or CEL condition. (On a real
/// cluster the `Cluster` deletes the test's nodes when it drops.)
fn no_ignored_failures(c: &Cluster) {
    if let Some(emu) = c.emulator() {
        assert_eq!(emu.ignored_webhook_failures(), Vec::<String>::new());
    }
}

fn node_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    example.com/pool: e2e\n"
    )
}

#[tokio::test]
async fn kubectl_dry_run_shows_taint_and_warning_and_stores_nothing() {
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("dry");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), node_yaml(&name)).unwrap();
    let path = file.path().to_str().unwrap();
    // Default validation (strict): no --validate=false.
    let out = kubectl(
        &c,
        &["create", "--dry-run=server", "-f", path, "-o", "yaml"],
    )
    .await;
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("key: {TAINT_KEY}")), "{stdout}");
    assert!(
        stdout.contains("key: node.kubernetes.io/not-ready"),
        "{stdout}"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("Warning:") && stderr.contains(TAINT_KEY),
        "{stderr}"
    );

    let out = kubectl(&c, &["get", "node", &name]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("not found"));
    no_ignored_failures(&c);
}

#[tokio::test]
async fn kubectl_create_taint_and_get_behave_as_on_a_cluster() {
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("made");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), node_yaml(&name)).unwrap();
    let out = kubectl(&c, &["create", "-f", file.path().to_str().unwrap()]).await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&format!("node/{name} created")));

    let keys = kubectl(
        &c,
        &["get", "node", &name, "-o", "jsonpath={.spec.taints[*].key}"],
    )
    .await;
    let keys = text(&keys.stdout);
    assert!(keys.contains(TAINT_KEY), "{keys}");
    // On a real cluster the node lifecycle controller adds and removes
    // `node.kubernetes.io/not-ready` on its own schedule after the create,
    // so only the emulator's stored create is asserted to carry it.
    if !c.is_real() {
        assert!(keys.contains("node.kubernetes.io/not-ready"), "{keys}");
    }

    let out = kubectl(
        &c,
        &["taint", "node", &name, "example.com/extra=1:NoSchedule"],
    )
    .await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&format!("node/{name} tainted")));
    // An admin removing nodegate's taint: no ready annotation, so not re-added.
    let out = kubectl(
        &c,
        &["taint", "node", &name, &format!("{TAINT_KEY}:NoSchedule-")],
    )
    .await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&format!("node/{name} untainted")));
    let keys = kubectl(
        &c,
        &["get", "node", &name, "-o", "jsonpath={.spec.taints[*].key}"],
    )
    .await;
    let keys = text(&keys.stdout);
    assert!(
        keys.contains("example.com/extra") && !keys.contains(TAINT_KEY),
        "{keys}"
    );
    // Removing a taint that is not there fails like the real kubectl.
    let out = kubectl(
        &c,
        &["taint", "node", &name, "example.com/none:NoSchedule-"],
    )
    .await;
    assert!(!out.status.success());

    let out = kubectl(&c, &["get", "nodes", "-l", "example.com/pool=e2e"]).await;
    let table = text(&out.stdout);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("STATUS") && table.contains(&name), "{table}");
    no_ignored_failures(&c);
}

#[tokio::test]
async fn new_node_is_tainted_from_its_first_write() {
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("fresh");
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    // A watcher that started before the node existed sees its very first version.
    let mut events = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .boxed();
    // Drain the (empty) initial list.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => panic!("watch ended"),
        }
    }
    let kubelet = c.kubelet(&name).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert!(
        has_taint(&created),
        "create response: {:?}",
        taint_keys(&created)
    );
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(watcher::Event::Apply(n)) = events.try_next().await.unwrap() {
                return n;
            }
        }
    })
    .await
    .unwrap();
    assert!(has_taint(&first));
    if let Some(w) = c.webhook_ref() {
        let metrics = w.metrics().await.unwrap();
        assert!(
            metrics.contains(r#"nodegate_webhook_taints_added_total{reason="create"} 1"#),
            "{metrics}"
        );
    }
    no_ignored_failures(&c);
}

#[tokio::test]
async fn reboot_retaints_within_a_second_and_kubelet_writes_are_never_rejected() {
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, agent_client) = registered_and_ready(&c, "reboot").await;
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let n = api.get(&name).await.unwrap();
    assert!(!has_taint(&n));
    assert_eq!(
        n.metadata.annotations.unwrap()[READY_BOOT_ID_ANNOTATION],
        kubelet.boot_id()
    );

    // Heartbeats and a kubelet restart on the same boot: accepted, nothing changes.
    kubelet.heartbeat().await.unwrap();
    kubelet.restart().await.unwrap();
    throughout(
        "no taint without a reboot",
        Duration::from_millis(1500),
        async || !has_taint(&api.get(&name).await.unwrap()),
    )
    .await;

    // Reboot: the kubelet's create (409) and status write are not rejected…
    kubelet.reboot().await.unwrap();
    // …and the taint is back on the main resource within 1 s.
    eventually(
        "taint back after reboot",
        Duration::from_secs(1),
        async || has_taint(&api.get(&name).await.unwrap()),
    )
    .await;
    // Heartbeats before the agent is ready are accepted too. (Sent after the
    // taint landed: a heartbeat racing the background patch can queue a
    // second one, whose taint-list guard is open to an ABA race with the
    // agent's removal — see emulator/README.md, "Findings".)
    kubelet.heartbeat().await.unwrap();

    // The agent becomes ready on the new boot; later kubelet writes stay accepted.
    StandInAgent::default()
        .mark_ready(&agent_client, &name)
        .await
        .unwrap();
    kubelet.heartbeat().await.unwrap();
    assert!(!has_taint(&api.get(&name).await.unwrap()));
    no_ignored_failures(&c);
}

#[tokio::test]
async fn dry_run_reboot_status_write_retaints_nothing() {
    let c = Cluster::start().await.unwrap();
    let (name, kubelet, _) = registered_and_ready(&c, "dryboot").await;
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let out = kubelet
        .api()
        .patch_status(
            &name,
            &dry,
            &Patch::Strategic(json!({"status": {"nodeInfo": {"bootID": "a-new-boot"}}})),
        )
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().node_info.unwrap().boot_id, "a-new-boot");
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    throughout(
        "no taint after a dry-run reboot write",
        Duration::from_millis(1500),
        async || {
            let n = api.get(&name).await.unwrap();
            !has_taint(&n) && n.status.unwrap().node_info.unwrap().boot_id == kubelet.boot_id()
        },
    )
    .await;
    no_ignored_failures(&c);
}

/// The exclude label is under node-restriction.kubernetes.io, so only an
/// admin sets it: on a Node created with it, or on a registered one (with
/// the taint then removed by hand), nodegate does nothing, also at a reboot.
#[tokio::test]
async fn excluded_node_is_left_alone() {
    let c = Cluster::start().await.unwrap();
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    // Created by an admin with the label: left alone, the kubelet's
    // registration (AlreadyExists, then a status write) too.
    let name = c.node_name("excluded");
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {EXCLUDE_LABEL: "true"}}
    }))
    .unwrap();
    let n = api.create(&PostParams::default(), &node).await.unwrap();
    assert!(!has_taint(&n), "{:?}", taint_keys(&n));
    let kubelet = c.kubelet(&name).await.unwrap();
    let n = kubelet.register().await.unwrap();
    assert!(!has_taint(&n), "{:?}", taint_keys(&n));
    if !c.is_real() {
        assert!(taint_keys(&n).contains(&"node.kubernetes.io/not-ready".to_string()));
    }

    // Labelled after registration: it registered gated; the admin labels it
    // and removes the taint, and a reboot no longer brings it back.
    let name = c.node_name("excluded-later");
    let mut kubelet = c.kubelet(&name).await.unwrap();
    assert!(has_taint(&kubelet.register().await.unwrap()));
    let label = format!("{EXCLUDE_LABEL}=true");
    assert!(
        kubectl(&c, &["label", "node", &name, &label])
            .await
            .status
            .success()
    );
    let untaint = format!("{TAINT_KEY}:NoSchedule-");
    assert!(
        kubectl(&c, &["taint", "node", &name, &untaint])
            .await
            .status
            .success()
    );
    kubelet.reboot().await.unwrap();
    kubelet.heartbeat().await.unwrap();
    throughout(
        "no taint on an excluded node after a reboot",
        Duration::from_millis(1500),
        async || !has_taint(&api.get(&name).await.unwrap()),
    )
    .await;
    no_ignored_failures(&c);
}

/// A kubelet cannot switch its own gate off: NodeRestriction refuses the
/// exclude label from its identity on update (main resource and status)
/// and at create (what `--node-labels` would send), and the node stays gated.
#[tokio::test]
async fn a_kubelet_cannot_exclude_its_own_node() {
    let c = Cluster::start().await.unwrap();
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let name = c.node_name("optout");
    let kubelet = c.kubelet(&name).await.unwrap();
    assert!(has_taint(&kubelet.register().await.unwrap()));
    let label = Patch::Merge(json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}}));
    for status in [false, true] {
        let refused = if status {
            kubelet
                .api()
                .patch_status(&name, &PatchParams::default(), &label)
                .await
        } else {
            kubelet
                .api()
                .patch(&name, &PatchParams::default(), &label)
                .await
        };
        let Err(kube::Error::Api(e)) = refused else {
            panic!("status: {status}: the kubelet labelled its node: {refused:?}");
        };
        assert_eq!(e.code, 403, "status: {status}: {e:?}");
        assert!(
            e.message
                .contains(&format!("is not allowed to modify labels: {EXCLUDE_LABEL}")),
            "{}",
            e.message
        );
    }
    let n = api.get(&name).await.unwrap();
    assert!(has_taint(&n));
    assert!(
        !n.metadata
            .labels
            .unwrap_or_default()
            .contains_key(EXCLUDE_LABEL)
    );

    // At create: refused, nothing stored.
    let name = c.node_name("optout-at-create");
    let err = c
        .kubelet(&name)
        .await
        .unwrap()
        .with_label(EXCLUDE_LABEL, "true")
        .register()
        .await
        .unwrap_err();
    let Some(kube::Error::Api(e)) = err.downcast_ref::<kube::Error>() else {
        panic!("{err:#}");
    };
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains(&format!(
            "is not allowed to set the following labels: {EXCLUDE_LABEL}"
        )),
        "{}",
        e.message
    );
    assert!(api.get_opt(&name).await.unwrap().is_none());
    no_ignored_failures(&c);
}

/// The former exclude label, which any kubelet may set on itself, excludes
/// nothing: a node that registers with it is gated, and one that labels
/// itself with it later is re-gated at its next reboot.
#[tokio::test]
async fn the_old_exclude_label_excludes_nothing() {
    let c = Cluster::start().await.unwrap();
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let name = c.node_name("old-label");
    let kubelet = c
        .kubelet(&name)
        .await
        .unwrap()
        .with_label(OLD_EXCLUDE_LABEL, "true");
    let n = kubelet.register().await.unwrap();
    assert_eq!(
        n.metadata.labels.as_ref().unwrap()[OLD_EXCLUDE_LABEL],
        "true"
    );
    assert!(has_taint(&n), "{:?}", taint_keys(&n));

    let (name, mut kubelet, _) = registered_and_ready(&c, "old-label-later").await;
    let n = kubelet
        .api()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {OLD_EXCLUDE_LABEL: "true"}}})),
        )
        .await
        .unwrap();
    assert!(!has_taint(&n));
    kubelet.reboot().await.unwrap();
    eventually(
        "taint back after a reboot despite the old label",
        Duration::from_secs(1),
        async || has_taint(&api.get(&name).await.unwrap()),
    )
    .await;
    no_ignored_failures(&c);
}

#[tokio::test]
async fn webhook_down_with_failure_policy_ignore_still_registers() {
    let mut c = Cluster::start().await.unwrap();
    if c.is_real() {
        eprintln!("skipped on a real cluster: needs to stop the webhook");
        return;
    }
    // An abrupt outage: the process is gone, connections are refused.
    c.webhook().unwrap().kill().await.unwrap();
    let kubelet = SimKubelet::new(c.emulator().unwrap(), "orphan")
        .await
        .unwrap();
    let n = kubelet.register().await.unwrap();
    assert!(!has_taint(&n));
    assert_eq!(taint_keys(&n), vec!["node.kubernetes.io/not-ready"]);
    kubelet.heartbeat().await.unwrap();
}

#[tokio::test]
async fn default_taint_is_what_the_webhook_adds() {
    // Guards the constant this file relies on against drift in shared/.
    assert!(DEFAULT_TAINT.starts_with(TAINT_KEY));
}

#[tokio::test]
async fn heartbeats_never_reach_the_webhook() {
    // The shipped matchConditions (CEL) keep status writes that keep the
    // bootID away from the webhook; a bootID change gets through.
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: counts the API server's webhook calls");
        return;
    };
    let mut kubelet = SimKubelet::new(emu, "hb").await.unwrap();
    kubelet.register().await.unwrap();
    let after_register = emu.webhook_calls(false).len();
    assert_eq!(after_register, 1, "the create");
    for _ in 0..3 {
        kubelet.heartbeat().await.unwrap();
    }
    kubelet.restart().await.unwrap();
    // The restart's create (409 after admission) is a CREATE: it is called.
    assert_eq!(emu.webhook_calls(false).len(), after_register + 1);
    kubelet.reboot().await.unwrap();
    // Create again, then the status write with the new bootID.
    assert_eq!(emu.webhook_calls(false).len(), after_register + 3);
    no_ignored_failures(&c);
}

#[tokio::test]
async fn kubectl_get_watch_prints_rows() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("watched");
    let mut child = c
        .kubectl(users::ADMIN)
        .unwrap()
        .args(["get", "nodes", "-w", "--output-watch-events"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Whether the node is in kubectl's initial list or arrives on its watch,
    // it is printed as an ADDED row of the server-side Table.
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let row = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let line = lines.next_line().await.unwrap().unwrap();
            if line.contains(&name) {
                return line;
            }
        }
    })
    .await
    .expect("kubectl printed the node");
    assert!(row.starts_with("ADDED") && row.contains("Ready"), "{row}");
    child.kill().await.unwrap();
    no_ignored_failures(&c);
}

#[tokio::test]
async fn node_controller_patch_after_a_reboot_carries_the_taint() {
    // Rule 2: a main-resource write after a reboot (here the node lifecycle
    // controller's strategic merge patch of the whole taint list, with its
    // resourceVersion lock) gets the taint added in the same write — even when
    // the list it sends lacks nodegate's taint (a cache from before it landed).
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, _) = registered_and_ready(&c, "nlc").await;
    kubelet.reboot().await.unwrap();
    let nlc: Api<Node> = Api::all(c.client(users::NODE_CONTROLLER).await.unwrap());
    let patched = loop {
        let n = nlc.get(&name).await.unwrap();
        let rv = n.metadata.resource_version.clone();
        let others: Vec<_> = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != TAINT_KEY && t.key != "node.kubernetes.io/not-ready")
            .collect();
        let patch = json!({"metadata": {"resourceVersion": rv}, "spec": {"taints": others}});
        match nlc
            .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(n) => break n,
            // The background patch moved the node on meanwhile: read again, as the controller does.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert!(has_taint(&patched), "{:?}", taint_keys(&patched));
    assert!(!taint_keys(&patched).contains(&"node.kubernetes.io/not-ready".to_string()));
    no_ignored_failures(&c);
}

/// A reboot patch read before the agent became ready on the new boot must not
/// apply afterwards, even when the taint list went back to what was read (ABA).
#[tokio::test]
async fn stale_reboot_patch_must_not_retaint_a_node_ready_on_its_boot() {
    use nodegate_shared::patch::{Guard, add_taints};
    use nodegate_shared::{NodeView, TaintSpec};
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, agent) = registered_and_ready(&c, "aba").await;
    kubelet.reboot().await.unwrap();
    let webhook: Api<Node> = Api::all(c.client(users::WEBHOOK).await.unwrap());
    // What the webhook's patcher read right after the reboot, before its taint landed.
    let mut seen = serde_json::to_value(webhook.get(&name).await.unwrap()).unwrap();
    seen["spec"]["taints"] =
        json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]);
    let view: NodeView = serde_json::from_value(seen).unwrap();
    let specs: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
    let stale = add_taints(&view, &view.missing(&specs), Guard::Current);
    // The taint lands, then the agent is ready on the new boot and removes it.
    eventually(
        "taint back after reboot",
        Duration::from_secs(1),
        async || has_taint(&webhook.get(&name).await.unwrap()),
    )
    .await;
    StandInAgent::default()
        .mark_ready(&agent, &name)
        .await
        .unwrap();
    // The stale patch arrives now: it must not apply.
    let r = webhook
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(stale))
        .await;
    assert!(
        r.is_err(),
        "a stale guarded patch re-tainted a node whose agent is ready on its boot"
    );
    no_ignored_failures(&c);
}

/// A crash reboot: the kubelet's first write on the new boot is its create
/// of the existing Node (409), then its status write with the new bootID.
/// The webhook re-taints the stored node while it answers that create, so the
/// first stored version that carries the new bootID already carries the
/// taint: no window in which a scheduler could bind a pod to it. A kubelet
/// restart on the same boot changes nothing.
#[tokio::test]
async fn first_stored_version_with_a_new_boot_is_tainted() {
    use kube::api::{WatchEvent, WatchParams};
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, _agent) = registered_and_ready(&c, "reregister").await;
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let before = api.get(&name).await.unwrap();
    assert!(!has_taint(&before), "ready before the crash");
    let boot = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .unwrap_or_default()
    };
    let old_boot = boot(&before);

    // A restart on the same boot: no taint, nothing stored by nodegate.
    kubelet.restart().await.unwrap();
    throughout(
        "a kubelet restart adds no taint",
        Duration::from_millis(1500),
        async || !has_taint(&api.get(&name).await.unwrap()),
    )
    .await;

    let rv = api
        .get(&name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(10);
    let mut versions = api.watch(&wp, &rv).await.unwrap().boxed();
    kubelet.reboot().await.unwrap();
    let first_on_new_boot = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = versions.try_next().await.unwrap() {
            if let WatchEvent::Added(n) | WatchEvent::Modified(n) = ev
                && boot(&n) != old_boot
            {
                return n;
            }
        }
        panic!("the watch ended before a version with the new bootID");
    })
    .await
    .expect("a stored version with the new bootID");
    assert!(
        has_taint(&first_on_new_boot),
        "first stored version with bootID {} has taints {:?}",
        boot(&first_on_new_boot),
        taint_keys(&first_on_new_boot)
    );
    no_ignored_failures(&c);
}

/// Calls of each line so far: (first, replica-0's, replica-1's).
fn line_calls(emu: &nodegate_emulator::Emulator) -> (usize, usize, usize) {
    let calls = emu.webhook_calls(false);
    let n = |name: &str| calls.iter().filter(|c| c.webhook == name).count();
    (
        n("nodes.nodegate.dev"),
        n("replica-0.nodes.nodegate.dev"),
        n("replica-1.nodes.nodegate.dev"),
    )
}

#[tokio::test]
async fn backup_lines_are_never_called_while_the_first_answers() {
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: counts the API server's webhook calls");
        return;
    };
    // A registration, heartbeats, a restart, a reboot, an admin's label on
    // the ready node, the agent's ready patch: every kind of Node write.
    let (name, mut kubelet, agent) = registered_and_ready(&c, "steady").await;
    for _ in 0..3 {
        kubelet.heartbeat().await.unwrap();
    }
    kubelet.restart().await.unwrap();
    let admin: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    admin
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    kubelet.reboot().await.unwrap();
    drop(agent);
    let (first, r0, r1) = line_calls(emu);
    assert!(
        first >= 4,
        "the first line answered every write it gets: {first}"
    );
    assert_eq!((r0, r1), (0, 0), "a backup line was called in steady state");
    no_ignored_failures(&c);
}

/// The first line is called only for a write a rule can act on: a create,
/// a status write that can mean a reboot, an update of a node that rebooted
/// since its agent was ready. The agent's ready patch, heartbeats and an
/// admin's label on a ready node cost the API server no call.
#[tokio::test]
async fn the_first_line_sees_only_writes_a_rule_can_act_on() {
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: counts the API server's webhook calls");
        return;
    };
    let first = || {
        emu.webhook_calls(true)
            .iter()
            .filter(|c| c.webhook == "nodes.nodegate.dev")
            .count()
    };
    let name = c.node_name("calls");
    let mut kubelet = c.kubelet(&name).await.unwrap();
    first();
    kubelet.register().await.unwrap();
    assert!(first() >= 1, "the registration's create");
    let agent = c.agent_client(&name).await.unwrap();
    StandInAgent::default()
        .mark_ready(&agent, &name)
        .await
        .unwrap();
    assert_eq!(first(), 0, "the agent's ready patch");
    for _ in 0..3 {
        kubelet.heartbeat().await.unwrap();
    }
    assert_eq!(first(), 0, "heartbeats");
    let admin: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let label = |v: &'static str| {
        let admin = admin.clone();
        let name = name.clone();
        async move {
            admin
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"team": v}}})),
                )
                .await
                .unwrap()
        }
    };
    label("a").await;
    assert_eq!(first(), 0, "an admin's label on a ready node");
    kubelet.reboot().await.unwrap();
    assert!(first() >= 1, "the reboot's create");
    // Rebooted, not ready again yet: rule 2 may have to put taints back.
    let n = label("b").await;
    assert!(has_taint(&n));
    assert_eq!(first(), 1, "an admin's label on a rebooted node");
    no_ignored_failures(&c);
}

/// Replica 0 dead (its node gone, its endpoint still listed): the first
/// line's call to it fails open, replica 0's own line fails open too, and
/// replica 1's line taints the Node. Not one write stored ungated.
#[tokio::test]
async fn a_dead_replica_fails_no_node_open_while_the_other_serves() {
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: needs a dead replica");
        return;
    };
    use nodegate_emulator::admission::{WEBHOOK_FAIL_OPEN, WEBHOOK_REQUESTS};
    // A port nothing listens on: connections are refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    emu.set_service_endpoint("nodegate-webhook.nodegate.svc", dead);
    emu.set_service_endpoint("nodegate-webhook-0.nodegate.svc", dead);
    for i in 0..5 {
        let kubelet = SimKubelet::new(emu, &format!("during-{i}")).await.unwrap();
        let n = kubelet.register().await.unwrap();
        assert!(has_taint(&n), "during-{i} stored ungated");
    }
    let m = emu.admission_metrics();
    let get = |metric: &str, name: &str| m.get(metric, name, None);
    assert_eq!(get(WEBHOOK_FAIL_OPEN, "nodes.nodegate.dev"), 5);
    assert_eq!(get(WEBHOOK_FAIL_OPEN, "replica-0.nodes.nodegate.dev"), 5);
    assert_eq!(get(WEBHOOK_REQUESTS, "replica-1.nodes.nodegate.dev"), 5);
    assert_eq!(get(WEBHOOK_FAIL_OPEN, "replica-1.nodes.nodegate.dev"), 0);
    // Every replica dead: the write is stored ungated (failurePolicy
    // Ignore), and the alert's count sees it.
    emu.set_service_endpoint("nodegate-webhook-1.nodegate.svc", dead);
    let n = SimKubelet::new(emu, "all-dead")
        .await
        .unwrap()
        .register()
        .await
        .unwrap();
    assert!(!has_taint(&n));
    let backups = [
        "replica-0.nodes.nodegate.dev",
        "replica-1.nodes.nodegate.dev",
    ];
    let sum = |metric: &str| backups.iter().map(|b| get(metric, b)).sum::<u64>();
    let no_line_answered =
        get(WEBHOOK_REQUESTS, backups[0]) - (sum(WEBHOOK_REQUESTS) - sum(WEBHOOK_FAIL_OPEN));
    assert_eq!(no_line_answered, 1);
}
