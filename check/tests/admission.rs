//! `nodegate-check` as an operator runs it, on whether admission taints a
//! new Node: the real binary with a kubeconfig against `nodegate-sim serve`
//! (must pass), against no install, and against emulated installs whose
//! configuration, certificate, webhook or admission policy is broken the
//! ways real ones break (each must fail, exit 1, and say why); and the
//! agent's confinement, tried as a thief would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nodegate_e2e::process::{
    REPLICAS, policy_mode_webhook_config, shipped_policy, statefulset_status,
};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::keys::DEFAULT_TAINT;

use support::install::{installed, installed_with, shipped_config};
use support::{check, line};

/// The shipped expression minus the guard: what broke on real clusters.
fn unguarded(yaml: &str) -> String {
    let fixed = yaml.replace(
        "!has(request.subResource) || request.subResource",
        "request.subResource",
    );
    assert_ne!(fixed, yaml, "the shipped condition has the guard");
    fixed
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
    // Waited for on a thread of its own: the test waits for it to exit,
    // and kills it (by pid, as it is moved) if it has not within 30 s.
    let pid = sim.id().to_string();
    let (exited, exit) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exited.send(sim.wait());
    });
    let stopped = match exit.recv_timeout(Duration::from_secs(30)) {
        Ok(status) => status.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("nodegate-sim serve did not stop within 30 s of SIGTERM");
        }
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
            got.contains(&format!("POST to nodegate/{svc}:443/mutate through the API server's service proxy answered HTTP 503: error trying to reach service"))
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
async fn passes_on_the_admission_policy_install() {
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
