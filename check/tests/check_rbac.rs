//! `manifests/components/check-rbac`: nodegate-check run with that
//! credential alone reports what it reports as a cluster admin, and the
//! credential, tried the way a thief would use it, can do nothing beyond
//! what its header states.
//!
//! Against a fresh emulator (the component's RBAC enforced, its policy
//! stored), or, with `NODEGATE_E2E_KUBECONFIG`, against that cluster: it
//! must have nodegate installed with this component (the test installs
//! nothing cluster-wide; it asks the TokenRequest API for a token of the
//! ServiceAccount `nodegate-check` and uses only that token). On a real
//! cluster the only objects it creates are Nodes named
//! `nodegate-e2e-<run>-…`, deleted when it ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_e2e::forged_review::copy_with_boot;
use nodegate_e2e::process::{WEBHOOK_NAMESPACE, WEBHOOK_PATH_SECRET};
use nodegate_emulator::users;
use nodegate_shared::keys::{EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use serde_json::{Value, json};

use support::rbac::{
    GROUP, NODE_CLAIM, POD_NAME_CLAIM, POD_UID_CLAIM, PROBE_POD, SA, admin_kubeconfig,
    assert_forbidden, check_kubeconfig, client_of, cluster, documents, fixture_node, impersonating,
    status_of, verdicts, without_gate,
};
use support::{check, line};

/// The same verdict for every line as the cluster admin's, and none of
/// them held back by a missing permission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_reports_the_same_with_its_own_credential_as_with_an_admin() {
    let cluster = cluster().await;
    let _node = fixture_node(&cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let (admin_code, admin) = check(&admin_kubeconfig(&cluster, dir.path()), &[]);
    let (code, scoped) = check(&check_kubeconfig(&cluster, dir.path()).await, &[]);
    assert_eq!(verdicts(&scoped), verdicts(&admin));
    assert!(verdicts(&scoped).len() > 20, "{scoped}");
    assert_eq!(code, admin_code);
    for l in scoped.lines() {
        let lower = l.to_lowercase();
        assert!(
            !lower.contains("forbidden")
                && !lower.contains("cannot impersonate")
                && !lower.contains(" 403")
                && !lower.contains("may not create services/proxy"),
            "a permission is missing: {l}"
        );
    }
    if !cluster.is_real() {
        // Here every line can pass: the ones that need a permission of
        // their own, each checked.
        assert_eq!(code, 0, "{scoped}");
        for check in [
            "webhook configuration",
            "serving certificate",
            "served cert nodes.nodegate.dev nodegate-webhook-0",
            "served cert nodes.nodegate.dev nodegate-webhook-1",
            "served cert replica-0.nodes.nodegate.dev nodegate-webhook-0",
            "served cert replica-1.nodes.nodegate.dev nodegate-webhook-1",
            "webhook lines",
            "canary dry-run create",
            "line nodes.nodegate.dev",
            "line replica-0.nodes.nodegate.dev",
            "line replica-1.nodes.nodegate.dev",
            "api server counters",
            "credential confinement",
            "confinement dry-run",
            "confinement namespace",
            "forged reviews",
            "cilium operator",
            "released taints",
            "gates declaration",
            "gate default (nodegate.dev/agent-not-ready=true:NoSchedule)",
            "karpenter",
            "cluster autoscaler",
            "node readiness controller",
        ] {
            assert!(
                scoped
                    .lines()
                    .any(|l| l.starts_with(&format!("PASS  {check} "))),
                "no `PASS  {check}` line:\n{scoped}"
            );
        }
    }
}

/// As a Pod of the check runs it (`helm test`): its own credential, and the
/// path token from Secret nodegate-webhook-path as mounted, not read
/// through the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_reads_the_path_token_where_its_pod_mounts_it() {
    let cluster = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let admin = cluster.client(users::ADMIN).await.unwrap();
    let secret = Api::<Secret>::namespaced(admin, WEBHOOK_NAMESPACE)
        .get(WEBHOOK_PATH_SECRET)
        .await
        .unwrap();
    let mounted = dir.path().join("token");
    std::fs::write(&mounted, &secret.data.unwrap()["token"].0).unwrap();
    let kubeconfig = check_kubeconfig(&cluster, dir.path()).await;
    let flag = format!("--path-token-file={}", mounted.display());
    let (code, out) = check(&kubeconfig, &[&flag]);
    assert!(
        line(&out, "PASS", "forged reviews").contains("the webhook holds that token"),
        "{out}"
    );
    if !cluster.is_real() {
        assert_eq!(code, 0, "{out}");
    }
    // A mount that holds no token is said so, and fails the check.
    std::fs::write(&mounted, "\n").unwrap();
    let (code, out) = check(&kubeconfig, &[&flag]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "forged reviews");
    assert!(l.contains("holds no usable token (no token)"), "{l}");
}

/// Nodes: no write but a dry-run.
async fn nodes_only_dry_run(
    cluster: &Cluster,
    admin: &kube::Client,
    check: &kube::Client,
    node: &str,
) {
    let nodes = Api::<Node>::all(check.clone());
    let m = assert_forbidden(
        "label a Node",
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})),
            )
            .await,
    );
    assert!(m.contains("patch"), "{m}");
    assert_forbidden(
        "delete a Node",
        nodes.delete(node, &DeleteParams::default()).await,
    );
    let fake = cluster.node_name("check-rbac-fake");
    let fake_node: Node = serde_json::from_value(json!({"metadata": {"name": fake}})).unwrap();
    let m = assert_forbidden(
        "register a Node",
        nodes.create(&PostParams::default(), &fake_node).await,
    );
    assert!(
        m.contains("ValidatingAdmissionPolicy 'nodegate-check-dry-run-only'")
            && m.contains("may only make dry-run requests, not CREATE nodes"),
        "{m}"
    );
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    nodes.create(&dry, &fake_node).await.unwrap();
    assert!(
        Api::<Node>::all(admin.clone())
            .get_opt(&fake)
            .await
            .unwrap()
            .is_none()
    );
    a_copy_with_a_new_boot_regates_nothing(admin, check, node).await;
}

/// The credential's create of a copy of a ready node with another boot ID,
/// as its kubelet re-registering after a reboot would: the dry-run-only
/// policy refuses it only after mutating admission ran, so the webhook must
/// not have re-gated the node (only the node's own kubelet moves it).
async fn a_copy_with_a_new_boot_regates_nothing(
    admin: &kube::Client,
    check: &kube::Client,
    node: &str,
) {
    let all = Api::<Node>::all(admin.clone());
    let gated = all.get(node).await.unwrap().spec.and_then(|s| s.taints);
    all.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {READY_BOOT_ID_ANNOTATION: "boot-1"}},
                             "spec": {"taints": null}}),
        ),
    )
    .await
    .unwrap();
    let before = all.get(node).await.unwrap();
    let copy = copy_with_boot(&serde_json::to_value(&before).unwrap(), "boot-2");
    let copy: Node = serde_json::from_value(copy).unwrap();
    match Api::<Node>::all(check.clone())
        .create(&PostParams::default(), &copy)
        .await
    {
        Err(kube::Error::Api(e)) => assert!(matches!(e.code, 403 | 409), "{}", e.message),
        other => panic!("the copy's create: {other:?}"),
    }
    let after = all.get(node).await.unwrap();
    assert!(
        after
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .is_empty(),
        "the check's credential re-gated {node}"
    );
    // The gate back, for the steps that follow.
    all.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"taints": gated}})),
    )
    .await
    .unwrap();
}

/// Secrets: the two it names, nothing else.
async fn only_the_named_secrets(check: &kube::Client) {
    let secrets = Api::<Secret>::namespaced(check.clone(), WEBHOOK_NAMESPACE);
    secrets.get(WEBHOOK_PATH_SECRET).await.unwrap();
    for other in ["nodegate-check-other", "nodegate-webhook-token"] {
        assert_forbidden(&format!("get Secret {other}"), secrets.get(other).await);
    }
    assert_forbidden(
        "list Secrets in nodegate",
        secrets.list(&ListParams::default()).await,
    );
    assert_forbidden(
        "list Secrets everywhere",
        Api::<Secret>::all(check.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "get another ConfigMap in kube-system",
        Api::<ConfigMap>::namespaced(check.clone(), "kube-system")
            .get("coredns")
            .await,
    );
}

/// The service proxy: the webhook's Services on https:443, POST only.
async fn only_the_webhooks_proxy(check: &kube::Client) {
    for id in [
        "https:nodegate-webhook-other:443",
        "http:nodegate-webhook:443",
        "nodegate-webhook:443",
        "nodegate-webhook",
        "https:nodegate-webhook:9443",
    ] {
        let path = format!("/api/v1/namespaces/{WEBHOOK_NAMESPACE}/services/{id}/proxy/");
        assert_eq!(
            status_of(check, http::Method::POST, &path).await,
            403,
            "POST {path}"
        );
    }
    for (method, path) in [
        (
            http::Method::POST,
            "/api/v1/namespaces/kube-system/services/https:kube-dns:443/proxy/",
        ),
        (
            http::Method::GET,
            "/api/v1/namespaces/nodegate/services/https:nodegate-webhook:443/proxy/",
        ),
    ] {
        assert_eq!(
            status_of(check, method.clone(), path).await,
            403,
            "{method} {path}"
        );
    }
}

/// Impersonation: the agent's account with the probe's pod claims only,
/// and no token of another account.
async fn only_the_probes_impersonation(cfg: &kube::Config, check: &kube::Client, node: &str) {
    let agent = format!("system:serviceaccount:{WEBHOOK_NAMESPACE}:nodegate-agent");
    let probe = [
        (NODE_CLAIM, node),
        (POD_NAME_CLAIM, PROBE_POD),
        (POD_UID_CLAIM, PROBE_POD),
    ];
    let cases: Vec<(&str, kube::Client)> = vec![
        ("an admin user", impersonating(cfg, "admin", &[], &[])),
        (
            "system:masters",
            impersonating(cfg, "nodegate-check-thief", &["system:masters"], &[]),
        ),
        (
            "the agent in system:masters",
            impersonating(cfg, &agent, &["system:masters"], &probe),
        ),
        (
            "the webhook's account",
            impersonating(
                cfg,
                &format!("system:serviceaccount:{WEBHOOK_NAMESPACE}:nodegate-webhook"),
                &[],
                &[],
            ),
        ),
        (
            "the roster publisher's account",
            impersonating(
                cfg,
                &format!("system:serviceaccount:{WEBHOOK_NAMESPACE}:nodegate-roster"),
                &[],
                &[],
            ),
        ),
        (
            "the agent of another namespace",
            impersonating(
                cfg,
                "system:serviceaccount:kube-system:nodegate-agent",
                &[],
                &probe,
            ),
        ),
        (
            "the agent with another pod's claims",
            impersonating(
                cfg,
                &agent,
                &[],
                &[
                    (NODE_CLAIM, node),
                    (POD_NAME_CLAIM, "nodegate-agent-x"),
                    (POD_UID_CLAIM, PROBE_POD),
                ],
            ),
        ),
        (
            "the agent with a node-uid claim",
            impersonating(
                cfg,
                &agent,
                &[],
                &[
                    (NODE_CLAIM, node),
                    ("authentication.kubernetes.io/node-uid", "x"),
                ],
            ),
        ),
    ];
    for (who, client) in cases {
        assert_forbidden(
            &format!("impersonate {who}"),
            Api::<Node>::all(client)
                .list(&ListParams::default().limit(1))
                .await,
        );
    }
    // No token of another account either.
    assert_forbidden(
        "mint a token of the agent's account",
        Api::<ServiceAccount>::namespaced(check.clone(), WEBHOOK_NAMESPACE)
            .create_token_request(
                "nodegate-agent",
                &PostParams::default(),
                &TokenRequest::default(),
            )
            .await,
    );
}

/// What a thief holding the check's token tries, and what it gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_check_credential_can_do_no_more_than_its_header_says() {
    let cluster = cluster().await;
    let node = fixture_node(&cluster).await;
    let admin = cluster.client(users::ADMIN).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = client_of(&check_kubeconfig(&cluster, dir.path()).await).await;
    let check = kube::Client::try_from(cfg.clone()).unwrap();
    nodes_only_dry_run(&cluster, &admin, &check, &node).await;
    only_the_named_secrets(&check).await;
    only_the_webhooks_proxy(&check).await;
    only_the_probes_impersonation(&cfg, &check, &node).await;

    let agent = format!("system:serviceaccount:{WEBHOOK_NAMESPACE}:nodegate-agent");
    let probe = [
        (NODE_CLAIM, node.as_str()),
        (POD_NAME_CLAIM, PROBE_POD),
        (POD_UID_CLAIM, PROBE_POD),
    ];
    // What it can do, as its header says: the agent's power over any node
    // whose name it gives, confined by the agent's policy. Dry-run here.
    let as_agent = Api::<Node>::all(impersonating(&cfg, &agent, &[], &probe));
    let pp = PatchParams {
        dry_run: true,
        field_manager: Some("nodegate-e2e".into()),
        ..Default::default()
    };
    let lift = without_gate(&admin, &node).await;
    as_agent
        .patch(&node, &pp, &Patch::Merge(&lift))
        .await
        .expect("the agent's power over the named node: lift its gate");
    let m = assert_forbidden(
        "label the node as the agent",
        as_agent
            .patch(
                &node,
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})),
            )
            .await,
    );
    assert!(m.contains("nodegate-agent-confinement"), "{m}");
}

/// The component grants what the code names: the webhook's Services and
/// their proxy names as the shipped configuration calls them, the probe's
/// fixed pod claims, the policies and Secrets the check reads; and it
/// renders as a kustomize component of the install.
#[test]
fn the_component_names_what_the_check_uses() {
    let docs = documents("rbac.yaml");
    let rules = |kind: &str, ns: Option<&str>| -> Vec<Value> {
        docs.iter()
            .filter(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with(SA))
                    && ns.is_none_or(|ns| d["metadata"]["namespace"] == ns)
            })
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let names = |rules: &[Value], resource: &str| -> Vec<String> {
        rules
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == resource))
            })
            .flat_map(|r| r["resourceNames"].as_array().cloned().unwrap_or_default())
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect()
    };
    let ns_rules = rules("Role", Some(WEBHOOK_NAMESPACE));
    let cluster_rules = rules("ClusterRole", None);

    let shipped: Value =
        serde_yaml::from_str(&nodegate_e2e::process::shipped_webhook_config().unwrap()).unwrap();
    let mut services = Vec::new();
    let mut proxies = Vec::new();
    for hook in shipped["webhooks"].as_array().unwrap() {
        let svc = &hook["clientConfig"]["service"];
        let name = svc["name"].as_str().unwrap().to_string();
        let port = svc["port"].as_i64().unwrap_or(443);
        proxies.push(format!("https:{name}:{port}"));
        services.push(name);
    }
    assert_eq!(names(&ns_rules, "services"), services);
    assert_eq!(names(&ns_rules, "services/proxy"), proxies);
    assert_eq!(
        names(&ns_rules, "secrets"),
        [
            nodegate_e2e::process::WEBHOOK_TLS_SECRET,
            nodegate_check::path_token::SECRET
        ]
    );
    assert_eq!(names(&ns_rules, "serviceaccounts"), ["nodegate-agent"]);
    for claim in [POD_NAME_CLAIM, POD_UID_CLAIM] {
        assert_eq!(
            names(&cluster_rules, &format!("userextras/{claim}")),
            [PROBE_POD]
        );
    }
    assert_eq!(
        names(&cluster_rules, "validatingadmissionpolicies"),
        [
            nodegate_webhook::confinement::AGENT_POLICY,
            nodegate_webhook::confinement::WEBHOOK_POLICY
        ]
    );
    assert_eq!(
        names(&cluster_rules, "mutatingwebhookconfigurations"),
        [shipped["metadata"]["name"].as_str().unwrap()]
    );
    // The gate lines: the agent's Events in default, and a gate owner's
    // DaemonSet and Pods in kube-system.
    let allows = |rules: &[Value], group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            let has = |k: &str, v: &str| r[k].as_array().is_some_and(|a| a.iter().any(|x| x == v));
            has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
        })
    };
    let default_rules = rules("Role", Some("default"));
    assert!(allows(&default_rules, "", "events", "list"));
    let system_rules = rules("Role", Some("kube-system"));
    assert!(allows(&system_rules, "apps", "daemonsets", "get"));
    assert!(allows(&system_rules, "", "pods", "list"));
    // Every binding names the ServiceAccount and the group, and only them.
    for b in docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
    {
        let subjects: Vec<(&str, &str)> = b["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["kind"].as_str().unwrap(), s["name"].as_str().unwrap()))
            .collect();
        assert_eq!(subjects, [("ServiceAccount", SA), ("Group", GROUP)], "{b}");
    }
    // The emulator's RBAC reads it (every binding's role exists).
    nodegate_emulator::rbac::Policy::from_documents(&docs).unwrap();

    let rendered = nodegate_e2e::manifests::by_kind_and_name(
        &nodegate_e2e::manifests::kustomize("manifests", &["check-rbac"]).unwrap(),
    )
    .unwrap();
    for key in [
        ("ServiceAccount", SA),
        ("ClusterRole", SA),
        ("ClusterRole", "nodegate-check-impersonate"),
        ("Role", SA),
        ("ValidatingAdmissionPolicy", "nodegate-check-dry-run-only"),
        (
            "ValidatingAdmissionPolicyBinding",
            "nodegate-check-dry-run-only",
        ),
    ] {
        assert!(
            rendered.contains_key(&(key.0.to_string(), key.1.to_string())),
            "{key:?} not rendered"
        );
    }
    let policy = documents("policy.yaml");
    assert_eq!(policy[1]["spec"]["validationActions"], json!(["Deny"]));
}
