//! `nodegate-check` as an operator runs it: the real binary with a
//! kubeconfig, against `nodegate-sim serve` (must pass) and against emulated
//! installs broken the ways real ones break (each must fail, exit 1, and
//! say why).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nodegate_e2e::manifests::{Objects, by_kind_and_name, kustomize};
use nodegate_e2e::process::{REPLICAS, deployment_status, statefulset_status};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{DEFAULT_TAINT, LEGACY_TAINT};
use nodegate_shared::taint::Effect;

/// The shipped expression minus the guard: what broke on real clusters.
fn unguarded(yaml: &str) -> String {
    let fixed = yaml.replace(
        "!has(request.subResource) || request.subResource",
        "request.subResource",
    );
    assert_ne!(fixed, yaml, "the shipped condition has the guard");
    fixed
}

/// Runs the real binary; returns its exit code and stdout.
fn check(kubeconfig: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-check"))
        .args(extra)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "--- nodegate-check {extra:?}\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

fn line<'a>(out: &'a str, status: &str, check: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{status}  {check}")))
        .unwrap_or_else(|| panic!("no `{status}  {check}` line in:\n{out}"))
}

/// An emulated cluster with nodegate installed as the README says.
async fn installed(config: Option<String>) -> (Emulator, WebhookProcess, tempfile::TempDir) {
    installed_with(config, None).await
}

/// The same, plus `objects` applied (e.g. the admission policy and binding).
async fn installed_with(
    config: Option<String>,
    objects: Option<&str>,
) -> (Emulator, WebhookProcess, tempfile::TempDir) {
    installed_serving(config, objects, &[]).await
}

/// The same with the webhook process started with `webhook_args` on top of
/// the default ones: what it serves, whatever the stored StatefulSet lists.
async fn installed_serving(
    config: Option<String>,
    objects: Option<&str>,
    webhook_args: &[&str],
) -> (Emulator, WebhookProcess, tempfile::TempDir) {
    installed_full(config, objects, webhook_args, Vec::new()).await
}

/// The same with `rbac` documents granted on top of the shipped ones.
async fn installed_full(
    config: Option<String>,
    objects: Option<&str>,
    webhook_args: &[&str],
    rbac: Vec<String>,
) -> (Emulator, WebhookProcess, tempfile::TempDir) {
    let mut docs = nodegate_e2e::process::shipped_rbac().unwrap();
    docs.extend(rbac);
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(docs),
        ..Default::default()
    })
    .await
    .unwrap();
    let webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.kubeconfig(users::WEBHOOK).unwrap()),
        extra_args: webhook_args.iter().map(ToString::to_string).collect(),
        // As the README installs it.
        path_token: true,
        ..Default::default()
    })
    .await
    .unwrap();
    webhook.attach(&emu, config.as_deref()).unwrap();
    webhook.install_objects(&emu).unwrap();
    if let Some(objects) = objects {
        emu.apply(objects).unwrap();
    }
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("kubeconfig"),
        emu.kubeconfig_yaml(users::ADMIN),
    )
    .unwrap();
    (emu, webhook, home)
}

#[test]
fn passes_against_nodegate_sim_serve() {
    let sim_bin = nodegate_e2e::bin_path("nodegate-sim");
    assert!(
        sim_bin.exists(),
        "build nodegate-sim first (cargo test --workspace does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut sim = Command::new(sim_bin)
        .args(["serve", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(sim.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut https = None;
    for l in lines.by_ref() {
        if let Some(rest) = l.split("https=").nth(1) {
            https = rest.split_whitespace().next().map(str::to_string);
        }
        if l.contains("Ctrl-C stops.") || Instant::now() > deadline {
            break;
        }
    }
    let https = https.expect("serve printed the webhook's address");
    let (code, out) = check(&kubeconfig, &["--webhook-address", &https]);
    // SIGTERM, as a user's Ctrl-C or a supervisor stops it: serve stops its
    // webhook child first (a SIGKILL would leave that child running).
    let term = Command::new("kill")
        .arg("-TERM")
        .arg(sim.id().to_string())
        .status()
        .unwrap();
    assert!(term.success());
    let stop_by = Instant::now() + Duration::from_secs(30);
    let stopped = loop {
        if let Some(status) = sim.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > stop_by {
            let _ = sim.kill();
            panic!("nodegate-sim serve did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        stopped.success(),
        "nodegate-sim serve on SIGTERM: {stopped}"
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\nresult: PASS ("), "{out}");
    for c in [
        "webhook configuration",
        "match conditions",
        "webhook service",
        "webhook statefulset",
        "webhook lines",
        "serving certificate",
        "served certificate",
        "canary dry-run create",
        "line nodes.nodegate.dev",
        "line replica-0.nodes.nodegate.dev",
        "line replica-1.nodes.nodegate.dev",
        "api server counters",
        "credential confinement",
        "forged reviews",
        "released taints",
    ] {
        line(&out, "PASS", c);
    }
    assert!(line(&out, "PASS", "canary dry-run create").contains(DEFAULT_TAINT));
    // The served certificate carries every line's name.
    assert!(
        line(&out, "PASS", "served certificate").contains(
            "nodegate-webhook.nodegate.svc, nodegate-webhook-0.nodegate.svc, nodegate-webhook-1.nodegate.svc"
        )
    );
}

/// An earlier first line, called for every update of a Node: correct, but
/// the agent's ready patch and every controller's Node write wait on a
/// call. The check warns and names the fix; it does not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warns_on_a_first_line_every_node_update_reaches() {
    let mut cfg = shipped_config();
    let conditions = cfg["webhooks"][0]["matchConditions"]
        .as_array_mut()
        .unwrap();
    let before = conditions.len();
    conditions.retain(|c| c["name"] != "create-or-update-after-reboot");
    assert_eq!(
        conditions.len(),
        before - 1,
        "the shipped first line has it"
    );
    let (_emu, _webhook, home) = installed(Some(serde_yaml::to_string(&cfg).unwrap())).await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 0, "{out}");
    let mc = line(&out, "WARN", "match conditions");
    assert!(
        mc.contains("an update of a ready node reaches the webhook")
            && mc.contains("nodegate-webhook webhook-config"),
        "{mc}"
    );
}

/// The first line's old mistake: it errors on every Node CREATE, so the API
/// server skips it silently. The first backup line then taints the canary
/// (what the backup lines are for), and the check still fails on the
/// condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_on_the_unguarded_match_condition() {
    let shipped = nodegate_e2e::process::shipped_webhook_config().unwrap();
    let (emu, _webhook, home) = installed(Some(unguarded(&shipped))).await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    let mc = line(&out, "FAIL", "match conditions");
    assert!(
        mc.contains("not-a-heartbeat") && mc.contains("on a Node CREATE") && mc.contains("has()"),
        "{mc}"
    );
    assert!(line(&out, "PASS", "canary dry-run create").contains(DEFAULT_TAINT));
    line(&out, "PASS", "webhook lines");
    // The canary's own evaluation errors (once per dispatch round), counted
    // by the API server; the backup lines had none.
    let counters = line(&out, "WARN", "api server counters");
    assert!(
        counters.contains(
            "match-condition evaluation errors and 0 fail-open calls for nodes.nodegate.dev"
        ) && !counters.contains("for replica-"),
        "{counters}"
    );
    assert!(out.contains("\nresult: FAIL ("));
    let called: Vec<String> = emu
        .webhook_calls(false)
        .into_iter()
        .map(|c| c.webhook)
        .collect();
    assert_eq!(
        called,
        ["replica-0.nodes.nodegate.dev"],
        "only the first backup line called the webhook"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_on_a_wrong_ca_bundle() {
    let other = nodegate_certs::Ca::generate(1).unwrap();
    let shipped = nodegate_e2e::process::shipped_webhook_config().unwrap();
    let wrong = nodegate_certs::inject_ca_bundle(&shipped, other.cert_pem()).unwrap();
    let (emu, webhook, home) = installed(None).await;
    emu.apply_webhook_config(&wrong).unwrap();
    let addr = webhook.https_addr().to_string();
    let (code, out) = check(
        &home.path().join("kubeconfig"),
        &["--webhook-address", &addr],
    );
    assert_eq!(code, 1, "{out}");
    let serving = line(&out, "FAIL", "serving certificate");
    for (l, host) in [
        ("nodes.nodegate.dev", "nodegate-webhook.nodegate.svc"),
        (
            "replica-0.nodes.nodegate.dev",
            "nodegate-webhook-0.nodegate.svc",
        ),
        (
            "replica-1.nodes.nodegate.dev",
            "nodegate-webhook-1.nodegate.svc",
        ),
    ] {
        assert!(
            serving.contains(&format!(
                "{l}: caBundle does not verify Secret nodegate/nodegate-webhook-tls for {host}"
            )),
            "{serving}"
        );
    }
    assert!(line(&out, "FAIL", "served certificate").contains("TLS handshake"));
    line(&out, "FAIL", "canary dry-run create");
    assert!(line(&out, "FAIL", "diagnosis").contains("cannot verify the webhook's certificate"));
    line(&out, "PASS", "match conditions");
    // The service proxy does not verify the certificate: the replicas
    // answer it, the API server's admission calls fail.
    line(&out, "PASS", "line replica-1.nodes.nodegate.dev");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_when_the_webhook_is_down() {
    let (emu, mut webhook, home) = installed(None).await;
    webhook.kill().await.unwrap();
    // What the StatefulSet controller writes once the pods are gone.
    let mut sts = serde_json::to_value(
        emu.store()
            .get(
                &nodegate_emulator::resources::STATEFULSETS,
                "nodegate",
                "nodegate-webhook",
            )
            .unwrap()
            .as_ref(),
    )
    .unwrap();
    sts["status"] = statefulset_status(REPLICAS, 0);
    emu.apply(&sts.to_string()).unwrap();
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "FAIL", "webhook statefulset").contains("0/2 available"));
    assert!(line(&out, "FAIL", "canary dry-run create").contains("WITHOUT"));
    let diagnosis = line(&out, "FAIL", "diagnosis");
    assert!(
        diagnosis.contains("no available replica")
            && diagnosis.contains("no line's replica answered a direct call"),
        "{diagnosis}"
    );
    for (l, svc) in [
        ("nodes.nodegate.dev", "nodegate-webhook"),
        ("replica-0.nodes.nodegate.dev", "nodegate-webhook-0"),
        ("replica-1.nodes.nodegate.dev", "nodegate-webhook-1"),
    ] {
        let got = line(&out, "FAIL", &format!("line {l} "));
        assert!(
            got.contains(&format!("POST to nodegate/{svc}:443/mutate/<token> through the API server's service proxy answered HTTP 503: error trying to reach service"))
                && got.contains("this line fails open"),
            "{got}"
        );
    }
    // Every line failed open once for the canary.
    let counters = line(&out, "WARN", "api server counters");
    for l in [
        "nodes.nodegate.dev",
        "replica-0.nodes.nodegate.dev",
        "replica-1.nodes.nodegate.dev",
    ] {
        assert!(
            counters.contains(&format!(
                "0 match-condition evaluation errors and 1 fail-open calls for {l}"
            )),
            "{counters}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_when_a_taint_is_missing_from_the_answer() {
    let (_emu, _webhook, home) = installed(None).await;
    let (code, out) = check(
        &home.path().join("kubeconfig"),
        &[
            "--taint",
            DEFAULT_TAINT,
            "--taint",
            "example.com/extra=x:NoSchedule",
        ],
    );
    assert_eq!(code, 1, "{out}");
    let canary = line(&out, "FAIL", "canary dry-run create");
    assert!(
        canary.contains("WITHOUT [\"example.com/extra=x:NoSchedule\"]"),
        "{canary}"
    );
    assert!(line(&out, "FAIL", "diagnosis").contains("did not add it"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_clearly_without_an_install() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let kc = home.path().join("kubeconfig");
    std::fs::write(&kc, emu.kubeconfig_yaml(users::ADMIN)).unwrap();
    let (code, out) = check(&kc, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "FAIL", "webhook configuration").contains("not found"));
    assert!(line(&out, "FAIL", "diagnosis").contains("missing"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_on_the_admission_policy_install() {
    use nodegate_e2e::process::{policy_mode_webhook_config, shipped_policy};
    let policy = shipped_policy().unwrap();
    let (_emu, _webhook, home) =
        installed_with(Some(policy_mode_webhook_config().unwrap()), Some(&policy)).await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", "admission policy").contains("is bound"));
    assert!(line(&out, "PASS", "webhook configuration").contains("the admission policy admits"));
    assert!(line(&out, "PASS", "canary dry-run create").contains("from the admission policy"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_when_the_admission_policy_is_not_bound() {
    use nodegate_e2e::process::{policy_mode_webhook_config, shipped_policy};
    let policy = shipped_policy().unwrap();
    let without_binding = policy.split("\n---\n").next().unwrap().to_string();
    let (_emu, _webhook, home) = installed_with(
        Some(policy_mode_webhook_config().unwrap()),
        Some(&without_binding),
    )
    .await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "FAIL", "admission policy").contains("no MutatingAdmissionPolicyBinding"));
    // The webhook, which keeps Node CREATE for re-registrations, tainted the
    // canary: nodes are protected, but not by the policy.
    assert!(
        line(&out, "FAIL", "canary dry-run create")
            .contains("tainted by the webhook, not the admission policy")
    );
    assert!(line(&out, "FAIL", "diagnosis").contains("unbound"));
}

/// The agent's confinement, verified the way an attacker would test it: a
/// dry-run label of a Node as the agent's ServiceAccount with that node's
/// claim is refused. Without the policy the check fails loudly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifies_the_agents_confinement_and_fails_without_it() {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, DeleteParams, PostParams};
    let (emu, _webhook, home) = installed(None).await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    let node: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "canary-host"}})).unwrap();
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", "credential confinement").contains("nodegate-agent-confinement"));
    assert!(
        line(&out, "PASS", "confinement dry-run").contains("may not label its own node"),
        "{out}"
    );

    // The policy's binding removed: a stolen agent token could switch the gate off.
    let bindings: Api<kube::api::DynamicObject> = Api::all_with(
        admin,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
            ),
            "validatingadmissionpolicybindings",
        ),
    );
    bindings
        .delete("nodegate-agent-confinement", &DeleteParams::default())
        .await
        .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "FAIL", "credential confinement").contains("can rewrite every Node"));
    assert!(
        line(&out, "FAIL", "confinement dry-run")
            .contains(&format!("{}=true", nodegate_shared::keys::EXCLUDE_LABEL))
    );
}

/// `kubectl kustomize` of the install `base` with `components`, as an
/// operator builds it, keyed by kind and name.
fn kustomized(base: &str, components: &[&str]) -> Objects {
    by_kind_and_name(&kustomize(base, components).unwrap()).unwrap()
}

/// Applies the rendered `kind`s named `name` of `objects`; workloads get
/// the statuses of the emulated install (every webhook replica available,
/// the agent on no node) so only their args change.
fn apply_rendered(emu: &Emulator, objects: &Objects, which: &[(&str, &str)]) {
    for (kind, name) in which {
        let mut v = objects[&(kind.to_string(), name.to_string())].clone();
        match *kind {
            "StatefulSet" => {
                v["status"] = statefulset_status(REPLICAS, REPLICAS);
            }
            "DaemonSet" => {
                v["status"] = serde_json::json!({
                    "desiredNumberScheduled": 0, "currentNumberScheduled": 0, "numberReady": 0,
                    "numberAvailable": 0, "numberMisscheduled": 0, "updatedNumberScheduled": 0,
                });
            }
            _ => {}
        }
        emu.apply(&v.to_string()).unwrap();
    }
}

const WORKLOADS: &[(&str, &str)] = &[
    ("StatefulSet", "nodegate-webhook"),
    ("DaemonSet", "nodegate-agent"),
];
const CONFINEMENT: &[(&str, &str)] = &[
    ("ValidatingAdmissionPolicy", "nodegate-agent-confinement"),
    ("ValidatingAdmissionPolicy", "nodegate-webhook-confinement"),
    (
        "ValidatingAdmissionPolicyBinding",
        "nodegate-agent-confinement",
    ),
    (
        "ValidatingAdmissionPolicyBinding",
        "nodegate-webhook-confinement",
    ),
];

/// Strict mode's boot gate, as the component sets it: nodegate's default
/// taint with effect NoExecute.
fn gate() -> String {
    let t: TaintSpec = DEFAULT_TAINT.parse().unwrap();
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
        l.contains(&format!("on (boot gate {gate}): the webhook and the agent run with the same --boot-taint and --taint flags"))
            && l.contains("are generated for them"),
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
    use nodegate_e2e::process::{policy_mode_webhook_config, shipped_policy};
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
    let fails: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
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
fn retaint(
    emu: &Emulator,
    res: &nodegate_emulator::resources::ResourceDef,
    name: &str,
    taint: &str,
) {
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
    use nodegate_emulator::resources::{DAEMONSETS, STATEFULSETS};
    const CHECK: &str = "cilium operator";
    let own_key = DEFAULT_TAINT
        .parse::<TaintSpec>()
        .unwrap()
        .key()
        .to_string();
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
    assert_eq!(
        out.lines().filter(|l| l.starts_with("FAIL")).count(),
        1,
        "only the Cilium line fails: {out}"
    );
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
    assert_eq!(
        out.lines().filter(|l| l.starts_with("FAIL")).count(),
        1,
        "only the Cilium line fails: {out}"
    );
}

/// The shipped configuration (with this process's caBundle) as JSON, for
/// tests that break one line of it.
fn shipped_config() -> serde_json::Value {
    serde_yaml::from_str(&nodegate_e2e::process::shipped_webhook_config().unwrap()).unwrap()
}

fn webhook_pod(replica: usize, node: &str) -> String {
    let name = format!("nodegate-webhook-{replica}");
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "nodegate", "labels": {
            "app.kubernetes.io/name": "nodegate-webhook",
            "app.kubernetes.io/part-of": "nodegate",
            "statefulset.kubernetes.io/pod-name": name,
        }},
        "spec": {"nodeName": node, "containers": [{"name": "webhook", "image": "nodegate/nodegate-webhook"}]},
    })
    .to_string()
}

/// The install as shipped: the first line and one backup line per replica,
/// each replica answering directly through the API server's service proxy;
/// replica placement once Pods are visible (none in the emulator at first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_the_install_answers() {
    let (emu, _webhook, home) = installed(None).await;
    let kubeconfig = home.path().join("kubeconfig");
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "PASS", "webhook statefulset")
            .contains("nodegate/nodegate-webhook: 2/2 available")
    );
    let lines = line(&out, "PASS", "webhook lines");
    assert!(
        lines.contains("first line nodes.nodegate.dev → nodegate/nodegate-webhook, then replica-0.nodes.nodegate.dev → nodegate/nodegate-webhook-0 (Pod nodegate-webhook-0), replica-1.nodes.nodegate.dev → nodegate/nodegate-webhook-1 (Pod nodegate-webhook-1)")
            && lines.contains("failurePolicy Ignore and reinvocationPolicy Never on every line"),
        "{lines}"
    );
    for (l, svc) in [
        ("nodes.nodegate.dev", "nodegate-webhook"),
        ("replica-0.nodes.nodegate.dev", "nodegate-webhook-0"),
        ("replica-1.nodes.nodegate.dev", "nodegate-webhook-1"),
    ] {
        let got = line(&out, "PASS", &format!("line {l} "));
        assert!(
            got.contains(&format!("nodegate/{svc}:443/mutate/<token> through the API server's service proxy allowed a Node CREATE with a patch adding [\"{DEFAULT_TAINT}\"]")),
            "{got}"
        );
    }
    assert!(
        line(&out, "PASS", "serving certificate").contains(
            "for nodegate-webhook.nodegate.svc, nodegate-webhook-0.nodegate.svc, nodegate-webhook-1.nodegate.svc"
        )
    );
    assert!(line(&out, "SKIP", "replica placement").contains("no scheduled Pod"));
    assert!(line(&out, "PASS", "api server counters").contains(
        "for nodes.nodegate.dev, replica-0.nodes.nodegate.dev, replica-1.nodes.nodegate.dev"
    ));

    emu.apply(&webhook_pod(0, "n1")).unwrap();
    emu.apply(&webhook_pod(1, "n2")).unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", "replica placement").contains(
        "replica-0.nodes.nodegate.dev → nodegate-webhook-0 on n1, replica-1.nodes.nodegate.dev → nodegate-webhook-1 on n2"
    ));
    emu.apply(&webhook_pod(1, "n1")).unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "WARN", "replica placement");
    assert!(
        l.contains("replica-0.nodes.nodegate.dev and replica-1.nodes.nodegate.dev run on node n1")
            && l.contains("one node failure takes those lines at once"),
        "{l}"
    );
}

/// A configuration with the first line only, beside the StatefulSet: every
/// replica lacks its backup line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_without_backup_lines() {
    let mut cfg = shipped_config();
    cfg["webhooks"].as_array_mut().unwrap().truncate(1);
    let (_emu, _webhook, home) = installed(Some(serde_yaml::to_string(&cfg).unwrap())).await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "webhook lines");
    assert!(
        l.contains("no backup line for replica nodegate-webhook-0, nodegate-webhook-1 of StatefulSet nodegate/nodegate-webhook")
            && l.contains("nodegate-webhook webhook-config --replicas 2"),
        "{l}"
    );
    line(&out, "PASS", "line nodes.nodegate.dev");
    assert!(!out.contains("line replica-"), "{out}");
    line(&out, "PASS", "canary dry-run create");
}

/// An install from before the StatefulSet: a Deployment and one line of
/// admission. It works, with the risk the backup lines remove: a warning.
/// `--deployment`, the flag's former name, still names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warns_on_an_install_from_before_the_statefulset() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let mut cfg = shipped_config();
    cfg["webhooks"].as_array_mut().unwrap().truncate(1);
    let (emu, _webhook, home) = installed(Some(serde_yaml::to_string(&cfg).unwrap())).await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    let sets: kube::Api<StatefulSet> = kube::Api::namespaced(admin, "nodegate");
    let mut deploy = serde_json::to_value(sets.get("nodegate-webhook").await.unwrap()).unwrap();
    sets.delete("nodegate-webhook", &Default::default())
        .await
        .unwrap();
    // The older manifest: the same Pod template in a Deployment.
    deploy["kind"] = serde_json::json!("Deployment");
    deploy["metadata"] = serde_json::json!({"name": "nodegate-webhook", "namespace": "nodegate"});
    let spec = deploy["spec"].as_object_mut().unwrap();
    for k in [
        "serviceName",
        "podManagementPolicy",
        "updateStrategy",
        "persistentVolumeClaimRetentionPolicy",
        "revisionHistoryLimit",
    ] {
        spec.remove(k);
    }
    deploy["status"] = deployment_status(2, 2);
    emu.apply(&deploy.to_string()).unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    for args in [&[][..], &["--deployment", "nodegate-webhook"][..]] {
        let (code, out) = check(&kubeconfig, args);
        assert_eq!(code, 0, "{out}");
        assert!(
            line(&out, "PASS", "webhook deployment")
                .contains("nodegate/nodegate-webhook: 2/2 available")
        );
        let l = line(&out, "WARN", "webhook lines");
        assert!(
            l.contains("Deployment nodegate/nodegate-webhook (an install from before the per-replica lines): one line of admission")
                && l.contains("docs/webhook.md"),
            "{l}"
        );
        line(&out, "PASS", "strict mode");
    }
    let (code, out) = check(&kubeconfig, &["--statefulset", "other"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "FAIL", "webhook statefulset")
            .contains("StatefulSet nodegate/other not found (nor a Deployment of that name)")
    );
    let l = line(&out, "WARN", "webhook lines");
    assert!(
        l.contains("the configuration has the first line only"),
        "{l}"
    );
}

/// A backup line whose Service has no endpoint (its replica gone): that
/// line's direct call fails and names it; the others still answer, and the
/// canary passes through the first line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_the_line_of_a_service_without_endpoint() {
    let (emu, _webhook, home) = installed(None).await;
    emu.remove_service_endpoint("nodegate-webhook-1.nodegate.svc");
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "line replica-1.nodes.nodegate.dev");
    assert!(
        l.contains("POST to nodegate/nodegate-webhook-1:443/mutate/<token> through the API server's service proxy answered HTTP 503: no endpoints available for service \"nodegate-webhook-1\": this line fails open"),
        "{l}"
    );
    line(&out, "PASS", "line nodes.nodegate.dev");
    line(&out, "PASS", "line replica-0.nodes.nodegate.dev");
    line(&out, "PASS", "canary dry-run create");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("FAIL")).count(),
        1,
        "only that line fails: {out}"
    );
}

/// `reinvocationPolicy: IfNeeded` on a backup line: named, and failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_a_line_that_is_reinvoked() {
    let mut cfg = shipped_config();
    cfg["webhooks"][2]["reinvocationPolicy"] = serde_json::json!("IfNeeded");
    let (_emu, _webhook, home) = installed(Some(serde_yaml::to_string(&cfg).unwrap())).await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "webhook lines");
    assert!(
        l.contains("replica-1.nodes.nodegate.dev has reinvocationPolicy IfNeeded: a line that failed open is called again after a later line's patch, so a dead replica costs a second timeout; set Never"),
        "{l}"
    );
    assert!(!l.contains("replica-0.nodes.nodegate.dev has"), "{l}");
}

/// Without `create` on `services/proxy`, the lines cannot be called
/// directly: a warning per line, not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warns_when_the_service_proxy_is_forbidden() {
    const CHECKER: &str = "checker";
    let reader = vec![
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "checker"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
                      {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create"]}]})
        .to_string(),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "checker"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "checker"},
            "subjects": [{"kind": "User", "name": CHECKER}]})
        .to_string(),
    ];
    let (emu, _webhook, home) = installed_full(None, None, &[], reader).await;
    let kubeconfig = home.path().join("kubeconfig-checker");
    std::fs::write(&kubeconfig, emu.kubeconfig_yaml(CHECKER)).unwrap();
    let (_, out) = check(&kubeconfig, &[]);
    for l in [
        "nodes.nodegate.dev",
        "replica-0.nodes.nodegate.dev",
        "replica-1.nodes.nodegate.dev",
    ] {
        let got = line(&out, "WARN", &format!("line {l} "));
        assert!(
            got.contains(
                "not called: nodegate-check may not create services/proxy in namespace nodegate"
            ) && got.contains("User \"checker\" cannot create resource \"services/proxy\""),
            "{got}"
        );
    }
    line(&out, "PASS", "canary dry-run create");
    line(&out, "PASS", "webhook lines");
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
    let key = DEFAULT_TAINT
        .parse::<TaintSpec>()
        .unwrap()
        .key()
        .to_string();
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
        l.contains("kube-system/aws-cluster-autoscaler: it does not treat nodegate's gate")
            && l.contains(&format!("add --startup-taint={key} to its args")),
        "{l}"
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("FAIL")).count(),
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
    emu.apply(
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cluster-autoscaler-status","namespace":"kube-system"},"data":{"status":"..."}}"#,
    )
    .unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "FAIL", CA).contains("a managed Cluster Autoscaler runs here")
            && out.contains("key-profiles/cluster-autoscaler"),
        "{out}"
    );
}

/// An EndpointSlice of `service` as the EndpointSlice controller writes it
/// for host-network replicas: each Pod at the node's address (loopback
/// here), on the port the Service's `https` port targets (`port`: one slice
/// per port, as the controller groups them).
fn endpoint_slice(name: &str, service: &str, port: u16, pods: &[&str]) -> String {
    let endpoints: Vec<serde_json::Value> = pods
        .iter()
        .map(|p| {
            serde_json::json!({
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-of-{p}"),
                "targetRef": {"kind": "Pod", "namespace": "nodegate", "name": p},
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "nodegate",
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    })
    .to_string()
}

/// The slices of the install's three Services: replica 0 at `port0`,
/// replica 1 at `port1` (the first line's Service selects both).
fn endpoint_slices(emu: &Emulator, port0: u16, port1: u16) {
    const R0: &str = "nodegate-webhook-0";
    const R1: &str = "nodegate-webhook-1";
    for doc in [
        endpoint_slice("nodegate-webhook-r0", "nodegate-webhook", port0, &[R0]),
        endpoint_slice("nodegate-webhook-r1", "nodegate-webhook", port1, &[R1]),
        endpoint_slice("nodegate-webhook-0-r0", R0, port0, &[R0]),
        endpoint_slice("nodegate-webhook-1-r1", R1, port1, &[R1]),
    ] {
        emu.apply(&doc).unwrap();
    }
}

/// Replica 1 still serves a certificate of an earlier CA (same names, same
/// CA name) while the Secret and every caBundle moved on: the Secret
/// comparison passes, the service proxy answers (it verifies nothing), and
/// only dialling each replica finds it — on every line that reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_the_replica_that_serves_a_certificate_its_line_does_not_trust() {
    let (emu, webhook, home) = installed(None).await;
    let stale = WebhookProcess::start(WebhookOptions {
        path_token: true,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_ne!(stale.ca_pem(), webhook.ca_pem());
    emu.set_service_endpoint("nodegate-webhook-1.nodegate.svc", stale.https_addr());
    endpoint_slices(&emu, webhook.https_addr().port(), stale.https_addr().port());
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    for l in ["nodes.nodegate.dev", "replica-0.nodes.nodegate.dev"] {
        let got = line(
            &out,
            "PASS",
            &format!("served cert {l} nodegate-webhook-0 "),
        );
        assert!(
            got.contains(&format!(
                "127.0.0.1:{} (node node-of-nodegate-webhook-0) serves a chain {l}'s caBundle verifies for",
                webhook.https_addr().port()
            )) && got.contains("CN=nodegate-webhook") && got.contains(", expires "),
            "{got}"
        );
    }
    for l in ["nodes.nodegate.dev", "replica-1.nodes.nodegate.dev"] {
        let got = line(
            &out,
            "FAIL",
            &format!("served cert {l} nodegate-webhook-1 "),
        );
        assert!(
            got.contains(&format!(
                "127.0.0.1:{} (node node-of-nodegate-webhook-1) serves CN=",
                stale.https_addr().port()
            )) && got.contains("not signed by a CA of the line's caBundle")
                && got.contains(&format!(
                    "the API server fails {l}'s calls that reach this replica"
                )),
            "{got}"
        );
    }
    // What the check saw before: the Secret verifies, the proxy answers.
    line(&out, "PASS", "serving certificate");
    line(&out, "PASS", "line replica-1.nodes.nodegate.dev");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("FAIL  served cert"))
            .count(),
        2,
        "{out}"
    );
}

/// Endpoints the check cannot reach (a closed port here; a firewall or
/// another network in practice) warn, say that only the Secret was
/// compared and where to run the check; a line without ready endpoints is
/// skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warns_when_a_replica_cannot_be_reached_from_here() {
    let (emu, webhook, home) = installed(None).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    endpoint_slices(&emu, webhook.https_addr().port(), port);
    let mut not_ready: serde_json::Value = serde_json::from_str(&endpoint_slice(
        "nodegate-webhook-1-r1",
        "nodegate-webhook-1",
        port,
        &["nodegate-webhook-1"],
    ))
    .unwrap();
    not_ready["endpoints"][0]["conditions"]["ready"] = serde_json::json!(false);
    emu.apply(&not_ready.to_string()).unwrap();
    let (code, out) = check(
        &home.path().join("kubeconfig"),
        &["--replica-connect-timeout", "2s"],
    );
    assert_eq!(code, 0, "{out}");
    let got = line(
        &out,
        "WARN",
        "served cert nodes.nodegate.dev nodegate-webhook-1 ",
    );
    assert!(
        got.contains(&format!("127.0.0.1:{port} (node node-of-nodegate-webhook-1) not reached from here (TCP connect: "))
            && got.contains("only the Secret's certificate was compared with the caBundle (`serving certificate`), not what this replica serves; run nodegate-check where the replicas' node addresses are reachable on port"),
        "{got}"
    );
    line(
        &out,
        "PASS",
        "served cert replica-0.nodes.nodegate.dev nodegate-webhook-0 ",
    );
    let skipped = line(&out, "SKIP", "served cert replica-1.nodes.nodegate.dev ");
    assert!(
        skipped.contains("no ready endpoint behind nodegate-webhook-1.nodegate.svc (1 not ready)"),
        "{skipped}"
    );
}
