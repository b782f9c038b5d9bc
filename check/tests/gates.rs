//! `nodegate-check` on nodegate's gates and the software that handles the
//! same taints: strict mode's boot gate off, on and half installed, the
//! canary's expectations of it, Cilium's operator beside nodegate, and the
//! autoscalers waiting for the gates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use nodegate_emulator::Emulator;
use nodegate_emulator::resources::{DAEMONSETS, ResourceDef, STATEFULSETS};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{DEFAULT_TAINT, LEGACY_TAINT};
use nodegate_shared::taint::Effect;

use nodegate_e2e::process::{policy_mode_webhook_config, shipped_policy};
use support::install::{
    CONFINEMENT, WORKLOADS, apply_rendered, installed, installed_serving, installed_with,
    kustomized,
};
use support::{check, failed, line};

fn default_taint() -> TaintSpec {
    DEFAULT_TAINT.parse().unwrap()
}

/// Strict mode's boot gate, as the component sets it: nodegate's default
/// taint with effect NoExecute.
fn gate() -> String {
    let t = default_taint();
    TaintSpec::new(t.key(), t.value(), Effect::NoExecute)
        .unwrap()
        .to_string()
}

fn gate_flag() -> String {
    format!("--boot-taint={}", gate())
}

/// Strict mode as the component installs it, and each way it is half
/// installed: the flags without the confinement (the gate's writes are
/// refused), and the agent's args rolled back alone (nothing removes the
/// gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_strict_mode_off_on_and_half_installed() {
    let gate = gate();
    // The webhook serves the component's gate throughout: the canary expects
    // it once the StatefulSet lists it, and an extra taint fails nothing.
    let (emu, _webhook, home) = installed_serving(None, None, &[&gate_flag()]).await;
    let kubeconfig = home.path().join("kubeconfig");
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "PASS", "strict mode")
            .contains("off: neither the webhook nor the agent runs with --boot-taint")
    );

    let strict = kustomized("manifests", &["strict-mode"]);
    apply_rendered(&emu, &strict, WORKLOADS);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "strict mode");
    assert!(
        l.contains(&format!("on (boot gate {gate}), but"))
            && l.contains("nodegate-agent-confinement was generated without --boot-taint")
            && l.contains("refuses the agent's write that removes")
            && l.contains("nodegate-webhook-confinement was generated without --boot-taint"),
        "{l}"
    );

    // The component's confinement, re-folded by kustomize, is its generator's.
    apply_rendered(&emu, &strict, CONFINEMENT);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", "canary dry-run create").contains(&gate));
    let l = line(&out, "PASS", "strict mode");
    assert!(
        l.contains(&format!(
            "on (boot gate {gate}): the webhook and the agent run with the same --boot-taint flags"
        )) && l.contains("are generated for them"),
        "{l}"
    );

    let plain = kustomized("manifests", &[]);
    apply_rendered(&emu, &plain, &[("DaemonSet", "nodegate-agent")]);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "strict mode");
    assert!(
        l.contains(&format!("inconsistent: the webhook adds the boot gate {gate} but the agent DaemonSet has no --boot-taint"))
            && l.contains("all its workloads are evicted")
            && l.contains(&format!("add --boot-taint={gate} to the agent's args")),
        "{l}"
    );
}

/// Under the admission-policy overlay the policy must add the gate too: the
/// overlay's policy alone does not, the strict-mode component's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_needs_the_gate_in_the_admission_policy() {
    let gate = gate();
    let policy = shipped_policy().unwrap();
    let (emu, _webhook, home) =
        installed_with(Some(policy_mode_webhook_config().unwrap()), Some(&policy)).await;
    let kubeconfig = home.path().join("kubeconfig");
    let strict = kustomized("manifests/overlays/admission-policy", &["strict-mode"]);
    apply_rendered(&emu, &strict, WORKLOADS);
    apply_rendered(&emu, &strict, CONFINEMENT);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "strict mode");
    assert!(
        l.contains(&format!(
            "MutatingAdmissionPolicy nodegate does not add the boot gate {gate}"
        )),
        "{l}"
    );
    // Neither the policy nor the webhook (which runs without the gate) adds it.
    let l = line(&out, "FAIL", "canary dry-run create");
    assert!(
        l.contains(&format!("WITHOUT the boot gate [\"{gate}\"]")),
        "{l}"
    );
    assert!(line(&out, "FAIL", "diagnosis").contains("--boot-taint flags checked here"));

    apply_rendered(&emu, &strict, &[("MutatingAdmissionPolicy", "nodegate")]);
    let (code, out) = check(&kubeconfig, &[]);
    let l = line(&out, "PASS", "canary dry-run create");
    assert!(
        l.contains(&gate) && l.contains("boot gate included) from the admission policy"),
        "{l}"
    );
    assert!(
        line(&out, "PASS", "strict mode")
            .contains("MutatingAdmissionPolicy nodegate adds the gate")
    );
    line(&out, "PASS", "admission policy");
    // What the policy hides from the canary, the direct calls show: the
    // running webhook (a re-registration's re-taint) lacks the gate the
    // StatefulSet lists. Nothing else fails.
    assert_eq!(code, 1, "{out}");
    let fails = failed(&out);
    assert_eq!(fails.len(), 3, "{out}");
    for f in fails {
        assert!(
            f.starts_with("FAIL  line ")
                && f.contains(&format!("allowed a Node CREATE WITHOUT [\"{gate}\"]")),
            "{f}"
        );
    }
}

/// The canary expects the gate the StatefulSet lists: a webhook serving it
/// passes; one still running without it (pods not rolled since the
/// component was applied) fails the canary and each line's direct call,
/// though strict mode's line reads only the consistent manifests and passes.
/// nodegate-check's own flags replace the StatefulSet's as one set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_expects_the_deployments_boot_gate() {
    let gate = gate();
    let strict = kustomized("manifests", &["strict-mode"]);

    let (emu, _webhook, home) = installed_serving(None, None, &[&gate_flag()]).await;
    apply_rendered(&emu, &strict, WORKLOADS);
    apply_rendered(&emu, &strict, CONFINEMENT);
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "PASS", "canary dry-run create");
    assert!(
        l.contains(&format!(
            "[\"{DEFAULT_TAINT}\", \"{gate}\"] (strict mode's boot gate included) and the webhook's warning"
        )),
        "{l}"
    );
    drop((emu, _webhook));

    let (emu, _webhook, home) = installed(None).await;
    apply_rendered(&emu, &strict, WORKLOADS);
    apply_rendered(&emu, &strict, CONFINEMENT);
    let kubeconfig = home.path().join("kubeconfig");
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "canary dry-run create");
    assert!(
        l.contains(&format!("WITHOUT the boot gate [\"{gate}\"]"))
            && l.contains(
                "pods bound to a new or rebooted node run before its network agent is ready"
            ),
        "{l}"
    );
    assert!(
        line(&out, "FAIL", "diagnosis").contains(
            "does the running webhook have the --taint and --boot-taint flags checked here"
        )
    );
    line(&out, "PASS", "strict mode");

    // `--taint` alone: a webhook without strict mode is what is checked.
    let (code, out) = check(&kubeconfig, &["--taint", DEFAULT_TAINT]);
    assert!(!line(&out, "PASS", "canary dry-run create").contains("NoExecute"));
    assert_eq!(code, 0, "{out}");
    // `--boot-taint` alone: the default taint and that gate.
    let (code, out) = check(&kubeconfig, &["--boot-taint", &gate]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "FAIL", "canary dry-run create").contains("WITHOUT the boot gate"));
    // Flags the webhook would refuse are said to be wrong.
    let (code, out) = check(&kubeconfig, &["--boot-taint", DEFAULT_TAINT]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "FAIL", "configured taints").contains(&format!(
        "nodegate-check's --taint/--boot-taint: boot taint {DEFAULT_TAINT} must have effect NoExecute"
    )));
    line(&out, "SKIP", "canary dry-run create");
}

/// What `helm install cilium` (chart defaults: `operator.removeNodeTaints`
/// true, `operator.setNodeTaints` unset and so the same,
/// `operator.setNodeNetworkStatus` true, `agentNotReadyTaintKey`) writes into
/// `cilium-config` for the operator's node-taint controller, among the rest
/// (install/kubernetes/cilium/templates/cilium-configmap.yaml).
fn cilium_config_helm_defaults() -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cilium-config", "namespace": "kube-system"},
        "data": {
            "identity-allocation-mode": "crd",
            "remove-cilium-node-taints": "true",
            "set-cilium-node-taints": "true",
            "set-cilium-is-up-condition": "true",
            "agent-not-ready-taint-key": "node.cilium.io/agent-not-ready",
        },
    })
    .to_string()
}

fn pod(namespace: &str, name: &str, app: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"k8s-app": app}},
        "spec": {"nodeName": "n1", "containers": [{"name": app, "image": app}]},
    })
    .to_string()
}

/// Rewrites the `--taint` args of a stored workload's first container to
/// `taint` and drops its `--release-taint` args: nodegate as installed
/// before it had a key of its own.
fn retaint(emu: &Emulator, res: &ResourceDef, name: &str, taint: &str) {
    let stored = emu.store().get(res, "nodegate", name).unwrap();
    let mut v = serde_json::to_value(stored.as_ref()).unwrap();
    let args = v["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .unwrap();
    args.retain(|a| {
        let a = a.as_str().unwrap_or_default();
        !a.starts_with("--taint") && !a.starts_with("--release-taint")
    });
    args.push(serde_json::json!(format!("--taint={taint}")));
    emu.apply(&v.to_string()).unwrap();
}

/// Cilium's operator next to nodegate: absent, its agent pods without its
/// ConfigMap, the Helm chart's defaults with nodegate as shipped (each owns
/// its key), and nodegate configured with the operator's key (they fight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_the_cilium_operator() {
    const CHECK: &str = "cilium operator";
    let own_key = default_taint().key().to_string();
    let (emu, _webhook, home) = installed(None).await;
    let kubeconfig = home.path().join("kubeconfig");
    // Another kube-system pod: not Cilium's.
    emu.apply(&pod("kube-system", "coredns-1", "kube-dns"))
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", CHECK).contains(
        "Cilium is not installed in kube-system (ConfigMap kube-system/cilium-config not found, no pod k8s-app=cilium)"
    ));

    // Cilium's agent runs, its ConfigMap is not where nodegate-check looks.
    emu.apply(&pod("kube-system", "cilium-x7k2p", "cilium"))
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", CHECK);
    assert!(
        l.contains("Cilium runs here (pod kube-system/cilium-x7k2p), but its ConfigMap kube-system/cilium-config not found")
            && l.contains("a fight with nodegate over a taint key cannot be ruled out"),
        "{l}"
    );
    assert_eq!(failed(&out).len(), 1, "only the Cilium line fails: {out}");
    // Another namespace, with neither.
    let (code, out) = check(&kubeconfig, &["--cilium-namespace", "cilium"]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", CHECK).contains("Cilium is not installed in cilium"));

    // The Helm chart's defaults, nodegate as shipped: two keys, two owners.
    emu.apply(&cilium_config_helm_defaults()).unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "PASS", CHECK);
    assert!(
        l.contains(&format!(
            "Cilium's operator owns node.cilium.io/agent-not-ready (removes it when the node's Cilium pod is Ready, sets it while not); nodegate owns {own_key}; a node takes pods when both are gone"
        )) && !l.contains("--release-taint"),
        "{l}"
    );

    // nodegate configured with the operator's key (as it was by default).
    retaint(&emu, &STATEFULSETS, "nodegate-webhook", LEGACY_TAINT);
    retaint(&emu, &DAEMONSETS, "nodegate-agent", LEGACY_TAINT);
    // The running webhook still adds nodegate's own taint: expect that of
    // the canary, so only the Cilium line fails.
    let (code, out) = check(&kubeconfig, &["--taint", DEFAULT_TAINT]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", CHECK);
    assert!(
        l.contains(&format!(
            "Cilium's operator owns every taint with key node.cilium.io/agent-not-ready (removes it when the node's Cilium pod is Ready, sets it while not), and nodegate manages that key too (the webhook's --taint={LEGACY_TAINT}, the agent's --taint={LEGACY_TAINT})"
        )) && l.contains("a write loop between the operator and the agent")
            && l.contains("at re-registration the operator removes nodegate's gate from its stale cache")
            && l.contains(&format!("fix: either give nodegate its own key, the default {own_key} (--taint={DEFAULT_TAINT} on the webhook and the agent instead, and --release-taint={LEGACY_TAINT} on the agent"))
            && l.contains("operator.removeNodeTaints=false, operator.setNodeTaints=false and extraConfig.remove-cilium-node-taints=\"false\""),
        "{l}"
    );
    assert_eq!(failed(&out).len(), 1, "only the Cilium line fails: {out}");
}

/// A Cluster Autoscaler Deployment as its chart installs it, with `args`.
fn cluster_autoscaler(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"aws-cluster-autoscaler","namespace":"kube-system"}},
  "spec":{{"selector":{{"matchLabels":{{"app":"ca"}}}},"template":{{"metadata":{{"labels":{{"app":"ca"}}}},"spec":{{"containers":[
    {{"name":"aws-cluster-autoscaler","image":"registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5",
      "command":["./cluster-autoscaler","--cloud-provider=aws",{}]}}]}}}}}}}}"#,
        args.join(",")
    )
}

/// The autoscaler lines on a cluster with neither, a CA at its defaults
/// (fails, names the flag), a CA told the gate (passes), a CA with only
/// Cilium's key or a status taint (fails), and a managed CA (fails unless
/// the key is under CA's startup prefix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_the_autoscalers() {
    const CA: &str = "cluster autoscaler";
    let key = default_taint().key().to_string();
    let (emu, _webhook, home) = installed(None).await;
    let kubeconfig = home.path().join("kubeconfig");
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", "karpenter").contains("Karpenter is not installed"));
    assert!(line(&out, "PASS", CA).contains("no Cluster Autoscaler"));

    emu.apply(&cluster_autoscaler(&["--scan-interval=10s"]))
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", CA);
    assert!(
        l.contains(
            "kube-system/aws-cluster-autoscaler (CA 1.31.5): it does not treat nodegate's gate"
        ) && l.contains(&format!("add --startup-taint={key} to its args")),
        "{l}"
    );
    assert_eq!(
        failed(&out).len(),
        1,
        "only the autoscaler line fails: {out}"
    );

    for (args, want) in [
        (
            vec!["--startup-taint=node.cilium.io/agent-not-ready"],
            "names Cilium's key",
        ),
        (
            vec![&*format!("--status-taint={key}")],
            "only a status taint",
        ),
    ] {
        emu.apply(&cluster_autoscaler(&args)).unwrap();
        let (code, out) = check(&kubeconfig, &[]);
        assert_eq!(code, 1, "{out}");
        assert!(line(&out, "FAIL", CA).contains(want), "{out}");
    }

    emu.apply(&cluster_autoscaler(&[&format!("--startup-taint={key}")]))
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", CA).contains(&format!("--startup-taint={key}")));

    // A managed CA: its status ConfigMap, no Deployment.
    emu.store()
        .delete(
            &nodegate_emulator::resources::DEPLOYMENTS,
            "kube-system",
            "aws-cluster-autoscaler",
            None,
            false,
        )
        .unwrap();
    // Its status ConfigMap, as WriteStatusConfigMap stamps it, and no
    // Deployment: a CA the check cannot see, whose flags are unknown.
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%d %H:%M:%S%.f +0000 UTC")
        .to_string();
    emu.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cluster-autoscaler-status","namespace":"kube-system",
          "annotations":{{"cluster-autoscaler.kubernetes.io/last-updated":"{now}"}}}},"data":{{"status":"..."}}}}"#
    ))
    .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "WARN", CA);
    assert!(
        l.contains("a CA runs that nodegate-check cannot see")
            && l.contains("managed")
            && l.contains("key-profiles/cluster-autoscaler"),
        "{out}"
    );
}

/// A CA release that predates `--startup-taint` (1.28): the flag nodegate
/// asks of 1.29 and later would stop it, so the line names `--ignore-taint`;
/// `--cluster-autoscaler-version` overrides an image tag that says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_the_declaration_each_release_accepts() {
    const CA: &str = "cluster autoscaler";
    let key = default_taint().key().to_string();
    let (emu, _webhook, home) = installed(None).await;
    let kubeconfig = home.path().join("kubeconfig");
    let at = |image: &str, args: &[&str]| {
        cluster_autoscaler(args).replace(
            "registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5",
            image,
        )
    };
    let old = "registry.k8s.io/autoscaling/cluster-autoscaler:v1.28.7";
    emu.apply(&at(old, &[&format!("--startup-taint={key}")]))
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", CA);
    assert!(
        l.contains(&format!("CA 1.28.7 does not define --startup-taint={key} (from 1.29.0): it stops at start on that flag"))
            && l.contains(&format!("write --ignore-taint={key}")),
        "{out}"
    );
    emu.apply(&at(old, &[&format!("--ignore-taint={key}")]))
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", CA).contains("(CA 1.28.7)"), "{out}");
    let untagged = "registry.k8s.io/autoscaling/cluster-autoscaler@sha256:0123";
    emu.apply(&at(untagged, &[&format!("--startup-taint={key}")]))
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "WARN", CA).contains("cannot tell its release"),
        "{out}"
    );
    let (code, out) = check(&kubeconfig, &["--cluster-autoscaler-version=1.31.5"]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", CA).contains("(CA 1.31.5)"), "{out}");
}

/// The agent's `--gates` with two gates it opens and one owned elsewhere:
/// the declaration line names the gate the webhook does not add, and one
/// line per gate says how many nodes it holds, which the longest and why
/// (the agent's Event), and where an owned gate's owner does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_line_per_declared_gate() {
    const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";
    const OWNER: &str = "kube-system/ebs-csi-node";
    let (emu, _webhook, home) = installed(None).await;
    let kubeconfig = home.path().join("kubeconfig");
    let (_, out) = check(&kubeconfig, &[]);
    assert!(
        line(&out, "PASS", "gates declaration").contains(&format!(
            "the agent has no --gates: one gate, of its --taint and --probe-* flags: opened by the agent: default ({DEFAULT_TAINT}, 2 probes); the webhook adds it (--taint) and no other"
        )),
        "{out}"
    );
    assert!(
        line(&out, "PASS", &format!("gate default ({DEFAULT_TAINT})")).contains(" holds 0 of ")
    );

    let declaration = serde_json::json!({"gates": [
        {"name": "cni", "taint": DEFAULT_TAINT, "probes": {"http": ["http://127.0.0.1:9879/healthz"]}},
        {"name": "dns", "taint": "example.com/dns-not-ready:NoSchedule", "probes": {"tcp": ["127.0.0.1:53"]}},
        {"name": "ebs-csi", "taint": EBS, "owner": {"daemonSet": OWNER}},
    ]});
    let mut objects = kustomized("manifests", &[]);
    let key = |kind: &str, name: &str| (kind.to_string(), name.to_string());
    let agent = objects
        .get_mut(&key("DaemonSet", "nodegate-agent"))
        .unwrap();
    let args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .unwrap();
    args.retain(|a| {
        !["--taint", "--probe-"]
            .iter()
            .any(|f| a.as_str().unwrap().starts_with(f))
    });
    args.push(format!("--gates={declaration}").into());
    let webhook = objects
        .get_mut(&key("StatefulSet", "nodegate-webhook"))
        .unwrap();
    webhook["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .unwrap()
        .push(format!("--owned-taint={EBS}").into());
    apply_rendered(&emu, &objects, WORKLOADS);

    let node = |name: &str, taint: &str| {
        let t: TaintSpec = taint.parse().unwrap();
        emu.apply(
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "spec": {"taints": [t.to_json()]},
            })
            .to_string(),
        )
        .unwrap();
    };
    node("gated-cni", DEFAULT_TAINT);
    node("gated-ebs", EBS);
    let now = k8s_openapi::jiff::Timestamp::now();
    let since = (now - k8s_openapi::jiff::SignedDuration::from_mins(30))
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap();
    emu.apply(
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "gated-cni.1", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "gated-cni"},
            "reason": "NodegateGateHeld", "type": "Warning",
            "message": format!("gate cni ({DEFAULT_TAINT}) has held this node since {since}: http[0] failed: connection refused"),
            "firstTimestamp": now.to_string(), "lastTimestamp": now.to_string(),
        })
        .to_string(),
    )
    .unwrap();

    let (_, out) = check(&kubeconfig, &[]);
    assert!(
        line(&out, "FAIL", "gates declaration").contains(
            "gate dns (example.com/dns-not-ready:NoSchedule): the agent opens it, but the webhook does not add it"
        ),
        "{out}"
    );
    let l = line(&out, "WARN", &format!("gate cni ({DEFAULT_TAINT})"));
    assert!(
        l.contains("holds 1 of ")
            && l.contains(&format!(
                "1 node held longer than 10 min: gated-cni since {since} ("
            ))
            && l.ends_with(" min): http[0] failed: connection refused"),
        "{l}"
    );
    assert!(
        line(
            &out,
            "PASS",
            "gate dns (example.com/dns-not-ready:NoSchedule)"
        )
        .contains("holds 0 of ")
    );
    let ebs_line = format!("gate ebs-csi ({EBS})");
    assert!(
        line(&out, "WARN", &ebs_line).contains(&format!(
            "its owner, DaemonSet {OWNER}, does not exist: nodes will stay gated: nothing removes {EBS} (1 of "
        )),
        "{out}"
    );
    // `--gate-held-warn-after` moves the threshold.
    let (_, out) = check(&kubeconfig, &["--gate-held-warn-after=1h"]);
    assert!(
        line(&out, "PASS", &format!("gate cni ({DEFAULT_TAINT})"))
            .contains("; oldest gated-cni since "),
        "{out}"
    );

    // The owner, tolerating its gate, with a Pod elsewhere only.
    emu.apply(
        &serde_json::json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "ebs-csi-node", "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": {"app": "ebs-csi-node"}},
                "template": {
                    "metadata": {"labels": {"app": "ebs-csi-node"}},
                    "spec": {
                        "containers": [{"name": "node", "image": "ebs"}],
                        "tolerations": [{"operator": "Exists"}],
                    },
                },
            },
        })
        .to_string(),
    )
    .unwrap();
    let pod = |node: &str| {
        emu.apply(
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("ebs-csi-node-{node}"), "namespace": "kube-system", "labels": {"app": "ebs-csi-node"}},
                "spec": {"nodeName": node, "containers": [{"name": "node", "image": "ebs"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            })
            .to_string(),
        )
        .unwrap();
    };
    pod("gated-cni");
    let (_, out) = check(&kubeconfig, &[]);
    assert!(
        line(&out, "WARN", &ebs_line).contains(&format!(
            "1 node has no Pod of DaemonSet {OWNER}, its owner, and will stay gated: gated-ebs"
        )),
        "{out}"
    );
    pod("gated-ebs");
    let (_, out) = check(&kubeconfig, &[]);
    assert!(
        line(&out, "PASS", &ebs_line).contains(&format!(
            ", each with a Pod of DaemonSet {OWNER}, its owner"
        )),
        "{out}"
    );
}

/// A gate owned elsewhere, as `components/gates/cilium-ebs-csi` declares it.
const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";

/// The webhook adds a gate owned elsewhere at create, so the canary and each
/// line's direct call must come back with it: a webhook serving
/// `--owned-taint` passes; one still running without it (pods not rolled
/// since the component was applied) fails both, though the manifests agree.
/// An agent declaring the gate beside a StatefulSet without it fails the
/// declaration line instead (the canary expects what the StatefulSet lists).
/// nodegate-check's own `--owned-taint` joins its `--taint` as one set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_expects_the_gates_owned_elsewhere() {
    let component = kustomized("manifests", &["gates/cilium-ebs-csi"]);
    let owned_flag = format!("--owned-taint={EBS}");

    let (emu, _webhook, home) = installed_serving(None, None, &[&owned_flag]).await;
    apply_rendered(&emu, &component, WORKLOADS);
    apply_rendered(&emu, &component, CONFINEMENT);
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "PASS", "canary dry-run create");
    assert!(
        l.contains(&format!(
            "[\"{DEFAULT_TAINT}\", \"{EBS}\"] (gates owned elsewhere included) and the webhook's warning; nothing stored"
        )),
        "{l}"
    );
    for l in [
        "nodes.nodegate.dev",
        "replica-0.nodes.nodegate.dev",
        "replica-1.nodes.nodegate.dev",
    ] {
        let got = line(&out, "PASS", &format!("line {l} "));
        assert!(
            got.contains(&format!(
                "allowed a Node CREATE with a patch adding [\"{DEFAULT_TAINT}\", \"{EBS}\"]"
            )),
            "{got}"
        );
    }
    assert!(
        line(&out, "PASS", "gates declaration")
            .contains("the webhook adds each (--taint, --owned-taint) and no other")
    );
    drop((emu, _webhook));

    // The running webhook without the flag. First only the agent declares
    // the gate: the declaration line fails, the canary expects what the
    // StatefulSet lists and passes.
    let (emu, _webhook, home) = installed(None).await;
    let kubeconfig = home.path().join("kubeconfig");
    apply_rendered(&emu, &component, &[("DaemonSet", "nodegate-agent")]);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "FAIL", "gates declaration").contains(&format!(
            "gate ebs-csi ({EBS}), owned by DaemonSet kube-system/ebs-csi-node: the webhook does not add it (no --owned-taint={EBS})"
        )),
        "{out}"
    );
    assert!(!line(&out, "PASS", "canary dry-run create").contains(EBS));

    // Then the StatefulSet lists it too, and the running webhook lags.
    apply_rendered(&emu, &component, WORKLOADS);
    apply_rendered(&emu, &component, CONFINEMENT);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    line(&out, "PASS", "gates declaration");
    let l = line(&out, "FAIL", "canary dry-run create");
    assert!(
        l.contains(&format!("WITHOUT the gates owned elsewhere [\"{EBS}\"]"))
            && l.contains("they are configured (--owned-taint) but not applied"),
        "{l}"
    );
    assert!(
        line(&out, "FAIL", "diagnosis").contains(
            "does the running webhook have the --taint, --owned-taint and --boot-taint flags checked here"
        ),
        "{out}"
    );
    for l in [
        "nodes.nodegate.dev",
        "replica-0.nodes.nodegate.dev",
        "replica-1.nodes.nodegate.dev",
    ] {
        let got = line(&out, "FAIL", &format!("line {l} "));
        assert!(
            got.contains(&format!(
                "allowed a Node CREATE WITHOUT [\"{EBS}\"]: does that replica run with the --taint, --owned-taint and --boot-taint flags checked here?"
            )),
            "{got}"
        );
    }

    // nodegate-check's own flags replace the StatefulSet's as one set:
    // `--taint` alone expects no gate owned elsewhere, with `--owned-taint`
    // it expects that one.
    let (_, out) = check(&kubeconfig, &["--taint", DEFAULT_TAINT]);
    assert!(!line(&out, "PASS", "canary dry-run create").contains(EBS));
    let (_, out) = check(&kubeconfig, &["--taint", DEFAULT_TAINT, &owned_flag]);
    assert!(
        line(&out, "FAIL", "canary dry-run create")
            .contains(&format!("WITHOUT the gates owned elsewhere [\"{EBS}\"]"))
    );
    // Flags the webhook would refuse are said to be wrong.
    let (code, out) = check(&kubeconfig, &[&format!("--owned-taint={DEFAULT_TAINT}")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "FAIL", "configured taints").contains(&format!(
            "nodegate-check's --owned-taint: owned taint {DEFAULT_TAINT} has the key and effect of a gate nodegate ships"
        )),
        "{out}"
    );
    line(&out, "SKIP", "canary dry-run create");
}

/// Under the admission-policy overlay the policy adds the gates owned
/// elsewhere at CREATE: the overlay's own policy does not (the webhook
/// does, and the canary warns), the component's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_adds_the_gates_owned_elsewhere() {
    let component = kustomized(
        "manifests/overlays/admission-policy",
        &["gates/cilium-ebs-csi"],
    );
    let policy = shipped_policy().unwrap();
    let (emu, _webhook, home) = installed_serving(
        Some(policy_mode_webhook_config().unwrap()),
        Some(&policy),
        &[&format!("--owned-taint={EBS}")],
    )
    .await;
    let kubeconfig = home.path().join("kubeconfig");
    apply_rendered(&emu, &component, WORKLOADS);
    apply_rendered(&emu, &component, CONFINEMENT);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "WARN", "canary dry-run create");
    assert!(
        l.contains(&format!(
            "but [\"{EBS}\"] from the webhook, not the admission policy"
        )) && l.contains("the policy does not add them")
            && l.contains("--taint, --owned-taint and --boot-taint (nodegate-webhook policy)"),
        "{l}"
    );

    apply_rendered(&emu, &component, &[("MutatingAdmissionPolicy", "nodegate")]);
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "PASS", "canary dry-run create");
    assert!(
        l.contains(&format!(
            "[\"{DEFAULT_TAINT}\", \"{EBS}\"] (gates owned elsewhere included) from the admission policy"
        )),
        "{l}"
    );
    line(&out, "PASS", "admission policy");
}
