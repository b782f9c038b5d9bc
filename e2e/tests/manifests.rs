//! Every manifest the project ships — the install, its overlay and every
//! component — is created through the emulator's API with `kubectl create`,
//! so the emulator's validation (CEL compiled in the environment upstream
//! uses for each expression, structural rules, ConfigMap limits) sees each
//! object a user would apply. A manifest it refuses fails CI.
//!
//! Kinds the emulator does not serve are listed with where they are checked
//! instead; a kind that carries CEL is never among them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::Command;

use nodegate_e2e::manifests::{Objects, by_kind_and_name, kustomize, squeezed};
use nodegate_emulator::{Emulator, EmulatorOptions, resources, users};
use serde::Deserialize;
use serde_json::Value;

/// Kinds the emulator does not serve, and where they are validated instead
/// (`.ci/validate-manifests`, `.ci/monitoring`: OpenAPI schemas, strict).
const NOT_SERVED: &[(&str, &str)] = &[
    ("ServiceAccount", "1.32 OpenAPI schema"),
    (
        "ClusterRole",
        "1.32 OpenAPI schema; loaded as the emulator's RBAC",
    ),
    (
        "ClusterRoleBinding",
        "1.32 OpenAPI schema; loaded as the emulator's RBAC",
    ),
    ("Role", "1.32 OpenAPI schema; loaded as the emulator's RBAC"),
    (
        "RoleBinding",
        "1.32 OpenAPI schema; loaded as the emulator's RBAC",
    ),
    ("PodDisruptionBudget", "1.32 OpenAPI schema"),
    ("Certificate", ".ci/crd_schemas.py"),
    ("Issuer", ".ci/crd_schemas.py"),
    ("PodMonitor", ".ci/crd_schemas.py"),
    ("PrometheusRule", ".ci/crd_schemas.py and promtool"),
];

/// Kinds whose objects hold CEL: each must go through the emulator.
const CEL_KINDS: &[&str] = &[
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

fn render(base: &str, components: &[&str]) -> String {
    kustomize(base, components).unwrap()
}

/// Creates every served object of `text` with `kubectl create` as admin in a
/// fresh emulator; returns the kinds that were not served.
async fn create_all(label: &str, text: &str) -> BTreeSet<String> {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let mut served = Vec::new();
    let mut skipped = BTreeSet::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).unwrap();
        if v.is_null() {
            continue;
        }
        let (av, kind) = (
            v["apiVersion"].as_str().unwrap_or_default(),
            v["kind"].as_str().unwrap_or_default(),
        );
        if resources::by_kind(av, kind).is_some() {
            served.push(serde_yaml::to_string(&v).unwrap());
        } else {
            skipped.insert(kind.to_string());
        }
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), served.join("---\n")).unwrap();
    let out = Command::new("kubectl")
        .env("KUBECONFIG", emu.kubeconfig(users::ADMIN).unwrap())
        .args(["create", "-f"])
        .arg(file.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{label}: the emulator refused a shipped manifest:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with(" created")).count(),
        served.len(),
        "{label}: {stdout}"
    );
    skipped
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_manifest_is_created_through_the_emulators_validation() {
    let cases: &[(&str, &str, &[&str])] = &[
        ("install", "manifests", &[]),
        (
            "admission-policy overlay",
            "manifests/overlays/admission-policy",
            &[],
        ),
        ("cert-manager component", "manifests", &["cert-manager"]),
        ("monitoring component", "manifests", &["monitoring"]),
        ("pruning component", "manifests", &["pruning"]),
        ("strict-mode component", "manifests", &["strict-mode"]),
        (
            "admission-policy overlay in strict mode",
            "manifests/overlays/admission-policy",
            &["strict-mode"],
        ),
        (
            "every component",
            "manifests",
            &["cert-manager", "monitoring", "pruning", "strict-mode"],
        ),
        (
            "cluster-autoscaler key profile",
            "manifests",
            &["key-profiles/cluster-autoscaler"],
        ),
        (
            "karpenter key profile under the admission-policy overlay",
            "manifests/overlays/admission-policy",
            &["key-profiles/karpenter"],
        ),
        (
            "cilium-ebs-csi gates component",
            "manifests",
            &["gates/cilium-ebs-csi"],
        ),
        (
            "cilium-ebs-csi gates component under the admission-policy overlay",
            "manifests/overlays/admission-policy",
            &["gates/cilium-ebs-csi"],
        ),
        (
            "cilium-gpu gates component under the admission-policy overlay",
            "manifests/overlays/admission-policy",
            &["gates/cilium-gpu"],
        ),
    ];
    let mut skipped_all = BTreeSet::new();
    for (label, base, components) in cases {
        let text = render(base, components);
        skipped_all.extend(create_all(label, &text).await);
    }
    let known: BTreeSet<String> = NOT_SERVED.iter().map(|(k, _)| k.to_string()).collect();
    let unknown: Vec<&String> = skipped_all.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "kinds neither served nor validated elsewhere: {unknown:?}"
    );
    for k in CEL_KINDS {
        assert!(
            !skipped_all.contains(*k),
            "{k} carries CEL and must be served"
        );
    }
}

fn container_args(objects: &Objects, kind: &str, name: &str) -> Vec<String> {
    let o = &objects[&(kind.to_owned(), name.to_owned())];
    o["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// Strict mode is the component alone: it gives the webhook and the agent
/// the same boot gate, and the policies it ships are the generators' output
/// for those flags, under the plain install and under the admission-policy
/// overlay; without it the install has no NoExecute taint anywhere.
#[test]
fn strict_mode_is_one_component_and_matches_the_generators() {
    use nodegate_shared::TaintSpec;
    use nodegate_shared::keys::DEFAULT_TAINT;
    use nodegate_webhook::{confinement, policy, webhook_config};
    const GATE: &str = "nodegate.dev/agent-not-ready=true:NoExecute";
    let ordinary: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
    let gate: Vec<TaintSpec> = vec![GATE.parse().unwrap()];
    let flag = format!("--boot-taint={GATE}");

    for base in ["manifests", "manifests/overlays/admission-policy"] {
        let plain = render(base, &[]);
        // The agent's confinement names the NoExecute gates only to let
        // the agent release them (a strict mode turned off); no other
        // object names one, and no rule adds one.
        let plain_objects = by_kind_and_name(&plain).unwrap();
        for (key, o) in &plain_objects {
            let text = o.to_string();
            let releases_only = key.1 == "nodegate-agent-confinement";
            assert!(
                !text.contains("--boot-taint")
                    && !text.contains("boot gate")
                    && (releases_only || !text.contains("NoExecute")),
                "{base} without strict mode has a boot gate: {key:?}"
            );
        }

        let built = by_kind_and_name(&render(base, &["strict-mode"])).unwrap();
        for (kind, name) in [
            ("StatefulSet", "nodegate-webhook"),
            ("DaemonSet", "nodegate-agent"),
        ] {
            let args = container_args(&built, kind, name);
            assert_eq!(
                args.iter().filter(|a| **a == flag).count(),
                1,
                "{base}: {kind} {name} args {args:?}"
            );
            assert!(
                args.contains(&format!("--taint={DEFAULT_TAINT}")),
                "{base}: {kind} {name}"
            );
        }
        // Every line of the webhook configuration names the boot gate too
        // (the backups' still-ungated condition): the generator's webhooks.
        let hooks = by_kind_and_name(&webhook_config::render(
            &ordinary,
            &gate,
            webhook_config::DEFAULT_REPLICAS,
        ))
        .unwrap();
        let want = &hooks[&("MutatingWebhookConfiguration".into(), "nodegate".into())];
        let got = &built[&("MutatingWebhookConfiguration".into(), "nodegate".into())];
        if base == "manifests" {
            assert_eq!(got["webhooks"], want["webhooks"], "{base}: webhook lines");
        } else {
            let lines = |v: &serde_json::Value| v["webhooks"].as_array().unwrap()[1..].to_vec();
            assert_eq!(lines(got), lines(want), "{base}: backup lines");
        }
        let mut generated = by_kind_and_name(&confinement::render(&ordinary, &gate, &[])).unwrap();
        if base.ends_with("admission-policy") {
            generated.extend(
                by_kind_and_name(&policy::render(&ordinary, &gate, policy::ApiVersion::V1))
                    .unwrap(),
            );
        }
        for (key, want) in generated {
            let got = built
                .get(&key)
                .unwrap_or_else(|| panic!("{base}: {key:?} missing"));
            assert_eq!(
                squeezed(&got["spec"]),
                squeezed(&want["spec"]),
                "{base}: {key:?} differs from the generator's output"
            );
        }
    }
}

/// Each key profile is one component: the webhook and the agent gate with
/// the profile's key, the agent releases the default taint (so nodes gated
/// before the switch lose it at their ready patch), the webhook tolerates its
/// own gate, and the policies are the generators' output for those flags,
/// under the plain install and under the admission-policy overlay.
#[test]
fn key_profiles_are_one_component_each_and_match_the_generators() {
    use nodegate_shared::TaintSpec;
    use nodegate_shared::keys::{DEFAULT_TAINT, LEGACY_TAINT};
    use nodegate_webhook::{confinement, policy, webhook_config};
    let profiles = [
        (
            "key-profiles/cluster-autoscaler",
            "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoSchedule",
        ),
        (
            "key-profiles/karpenter",
            "readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule",
        ),
    ];
    for (component, taint) in profiles {
        let ordinary: Vec<TaintSpec> = vec![taint.parse().unwrap()];
        let release: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
        for base in ["manifests", "manifests/overlays/admission-policy"] {
            let text = render(base, &[component]);
            assert!(
                !text.contains(&format!("--taint={DEFAULT_TAINT}")),
                "{component} on {base} still gates with the default taint"
            );
            let built = by_kind_and_name(&text).unwrap();
            let webhook = container_args(&built, "StatefulSet", "nodegate-webhook");
            assert!(
                webhook.contains(&format!("--taint={taint}")),
                "{component}: {webhook:?}"
            );
            let agent = container_args(&built, "DaemonSet", "nodegate-agent");
            assert!(
                agent.contains(&format!("--taint={taint}")),
                "{component}: {agent:?}"
            );
            for r in &release {
                assert!(
                    agent.contains(&format!("--release-taint={r}")),
                    "{component}: the agent must release {r}: {agent:?}"
                );
            }
            assert!(
                !agent.contains(&format!("--release-taint={LEGACY_TAINT}")),
                "{component}: Cilium's key is released only with release-cilium-key: {agent:?}"
            );
            let key = ordinary[0].key();
            let tolerations = &built[&("StatefulSet".into(), "nodegate-webhook".into())]["spec"]["template"]
                ["spec"]["tolerations"];
            assert!(
                tolerations
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t["key"] == key && t["operator"] == "Exists"),
                "{component}: the webhook must tolerate {key}"
            );
            let hooks = by_kind_and_name(&webhook_config::render(
                &ordinary,
                &[],
                webhook_config::DEFAULT_REPLICAS,
            ))
            .unwrap();
            let want = &hooks[&("MutatingWebhookConfiguration".into(), "nodegate".into())];
            let got = &built[&("MutatingWebhookConfiguration".into(), "nodegate".into())];
            if base == "manifests" {
                assert_eq!(
                    got["webhooks"], want["webhooks"],
                    "{component}: webhook lines"
                );
            } else {
                let lines = |v: &Value| v["webhooks"].as_array().unwrap()[1..].to_vec();
                assert_eq!(lines(got), lines(want), "{component}: backup lines");
            }
            let mut generated =
                by_kind_and_name(&confinement::render(&ordinary, &[], &release)).unwrap();
            if base.ends_with("admission-policy") {
                generated.extend(
                    by_kind_and_name(&policy::render(&ordinary, &[], policy::ApiVersion::V1))
                        .unwrap(),
                );
            }
            for (k, want) in generated {
                let got = built
                    .get(&k)
                    .unwrap_or_else(|| panic!("{component} on {base}: {k:?} missing"));
                assert_eq!(
                    squeezed(&got["spec"]),
                    squeezed(&want["spec"]),
                    "{component} on {base}: {k:?} differs from the generator's output"
                );
            }
        }
    }
}

/// Cilium's key is released only on request: the taint an older nodegate
/// added can be an admin's or an autoscaler's own gate, which the agent must
/// not lift. Without the component no agent flag and no confinement rule
/// names it; with it, the agent releases it exactly and the confinement is
/// the generator's output for that flag, under both installs.
#[test]
fn cilium_key_is_released_only_with_its_component() {
    use nodegate_shared::TaintSpec;
    use nodegate_shared::keys::{DEFAULT_TAINT, LEGACY_TAINT};
    use nodegate_webhook::confinement;
    let ordinary: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
    let flag = format!("--release-taint={LEGACY_TAINT}");
    for base in ["manifests", "manifests/overlays/admission-policy"] {
        for (components, release) in [
            (&[][..], vec![]),
            (
                &["release-cilium-key"][..],
                vec![LEGACY_TAINT.parse::<TaintSpec>().unwrap()],
            ),
        ] {
            let built = by_kind_and_name(&render(base, components)).unwrap();
            let agent = container_args(&built, "DaemonSet", "nodegate-agent");
            let releases: Vec<&String> = agent
                .iter()
                .filter(|a| a.starts_with("--release-taint="))
                .collect();
            let want: Vec<String> = release.iter().map(|_| flag.clone()).collect();
            assert_eq!(
                releases,
                want.iter().collect::<Vec<_>>(),
                "{base} {components:?}"
            );
            for (key, want) in
                by_kind_and_name(&confinement::render(&ordinary, &[], &release)).unwrap()
            {
                let got = built
                    .get(&key)
                    .unwrap_or_else(|| panic!("{base} {components:?}: {key:?} missing"));
                assert_eq!(
                    squeezed(&got["spec"]),
                    squeezed(&want["spec"]),
                    "{base} {components:?}: {key:?} differs from the generator's output"
                );
            }
        }
    }
}

/// One certificate serves every line of admission: under cert-manager, the
/// Certificate names each Service the webhook configuration calls, and the
/// StatefulSet runs one replica per backup line.
#[test]
fn every_line_has_a_service_a_replica_and_a_name_in_the_certificate() {
    let built = by_kind_and_name(&render("manifests", &["cert-manager"])).unwrap();
    let get = |kind: &str, name: &str| &built[&(kind.to_owned(), name.to_owned())];
    let mwc = get("MutatingWebhookConfiguration", "nodegate");
    let cert = get("Certificate", "nodegate-webhook");
    let dns: Vec<&str> = cert["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    let hooks = mwc["webhooks"].as_array().unwrap();
    for h in hooks {
        let svc = &h["clientConfig"]["service"];
        let (name, ns) = (
            svc["name"].as_str().unwrap(),
            svc["namespace"].as_str().unwrap(),
        );
        assert!(
            dns.contains(&format!("{name}.{ns}.svc").as_str()),
            "{name}.{ns}.svc missing from the Certificate's dnsNames {dns:?}"
        );
        let service = get("Service", name);
        assert_eq!(service["metadata"]["namespace"], ns);
    }
    let replicas = get("StatefulSet", "nodegate-webhook")["spec"]["replicas"]
        .as_u64()
        .unwrap();
    assert_eq!(
        hooks.len() as u64,
        replicas + 1,
        "one backup line per replica"
    );
    for i in 0..replicas {
        let selector = &get("Service", &format!("nodegate-webhook-{i}"))["spec"]["selector"];
        assert_eq!(
            selector["statefulset.kubernetes.io/pod-name"],
            format!("nodegate-webhook-{i}"),
            "the Service of line {i} selects replica {i} alone"
        );
    }
}

/// Each shipped gates component (`nodegate-webhook gates-component`, its
/// files checked against the generator by the webhook's own tests) builds
/// on the install and on the admission-policy overlay: the agent takes the
/// declaration whole (`--gates`, which it refuses beside a taint or probe
/// flag), the webhook names every gate (nodegate's, owned elsewhere, boot)
/// and tolerates each key, and the policies are the generators' output for
/// those flags.
#[test]
fn gates_components_turn_the_install_into_their_gates() {
    use nodegate_shared::gates::Gates;
    use nodegate_webhook::{confinement, policy, webhook_config};
    const PROBE_FLAGS: &[&str] = &[
        "--probe-http",
        "--probe-tcp",
        "--probe-file",
        "--probe-exec",
        "--probe-pod",
    ];
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/components/gates");
    for name in ["cilium-ebs-csi", "cilium-gpu"] {
        let declared =
            Gates::parse(&std::fs::read_to_string(dir.join(name).join("gates.yaml")).unwrap())
                .unwrap();
        let (ordinary, owned, boot) = (
            declared.taints(),
            declared.owned_taints(),
            declared.boot_taints(),
        );
        for base in ["manifests", "manifests/overlays/admission-policy"] {
            let component = format!("gates/{name}");
            let built = by_kind_and_name(&render(base, &[&component])).unwrap();
            let agent = container_args(&built, "DaemonSet", "nodegate-agent");
            let gates: Vec<&String> = agent.iter().filter(|a| a.starts_with("--gates=")).collect();
            assert_eq!(gates.len(), 1, "{name} on {base}: {agent:?}");
            let flag = Gates::parse(gates[0].strip_prefix("--gates=").unwrap()).unwrap();
            assert_eq!(flag, declared, "{name} on {base}: the agent's --gates");
            for a in &agent {
                assert!(
                    !PROBE_FLAGS.iter().any(|p| a.starts_with(&format!("{p}=")))
                        && !a.starts_with("--taint=")
                        && !a.starts_with("--boot-taint="),
                    "{name} on {base}: the agent has {a} beside --gates: {agent:?}"
                );
            }
            let webhook = container_args(&built, "StatefulSet", "nodegate-webhook");
            let mut want: Vec<String> = ordinary.iter().map(|t| format!("--taint={t}")).collect();
            want.extend(owned.iter().map(|t| format!("--owned-taint={t}")));
            want.extend(boot.iter().map(|t| format!("--boot-taint={t}")));
            let got: Vec<&String> = webhook
                .iter()
                .filter(|a| {
                    a.starts_with("--taint=")
                        || a.starts_with("--owned-taint=")
                        || a.starts_with("--boot-taint=")
                })
                .collect();
            assert_eq!(got, want.iter().collect::<Vec<_>>(), "{name} on {base}");
            let sts = &built[&("StatefulSet".into(), "nodegate-webhook".into())];
            let tolerations = sts["spec"]["template"]["spec"]["tolerations"]
                .as_array()
                .unwrap();
            for t in ordinary.iter().chain(&owned).chain(&boot) {
                assert!(
                    tolerations
                        .iter()
                        .any(|x| x["key"] == t.key() && x["operator"] == "Exists"),
                    "{name} on {base}: the webhook must tolerate {}",
                    t.key()
                );
            }
            let hooks = by_kind_and_name(&webhook_config::render_owned(
                &ordinary,
                &boot,
                &owned,
                webhook_config::DEFAULT_REPLICAS,
            ))
            .unwrap();
            let want_hooks = &hooks[&("MutatingWebhookConfiguration".into(), "nodegate".into())];
            let got_hooks = &built[&("MutatingWebhookConfiguration".into(), "nodegate".into())];
            let lines = |v: &Value| v["webhooks"].as_array().unwrap()[1..].to_vec();
            assert_eq!(
                lines(got_hooks),
                lines(want_hooks),
                "{name} on {base}: backup lines"
            );
            let mut generated =
                by_kind_and_name(&confinement::render_owned(&ordinary, &boot, &owned, &[]))
                    .unwrap();
            if base.ends_with("admission-policy") {
                generated.extend(
                    by_kind_and_name(&policy::render_owned(
                        &ordinary,
                        &boot,
                        &owned,
                        policy::ApiVersion::V1,
                    ))
                    .unwrap(),
                );
            }
            for (key, want) in generated {
                let got = built
                    .get(&key)
                    .unwrap_or_else(|| panic!("{name} on {base}: {key:?} missing"));
                assert_eq!(
                    squeezed(&got["spec"]),
                    squeezed(&want["spec"]),
                    "{name} on {base}: {key:?} differs from the generator's output"
                );
            }
            // A pod probe's namespace, and only it, grants the agent Pods.
            let pod_namespaces: Vec<&str> = declared
                .opened()
                .flat_map(|g| g.probes.pod.iter())
                .filter_map(|p| p.split_once('/').map(|(ns, _)| ns))
                .collect();
            let role = built.get(&("Role".into(), "nodegate-agent-probe-pod".into()));
            match pod_namespaces.as_slice() {
                [] => assert!(role.is_none(), "{name} on {base}: no pod probe, no Role"),
                [ns] => {
                    let role = role.unwrap();
                    assert_eq!(role["metadata"]["namespace"], *ns, "{name} on {base}");
                    assert_eq!(
                        role["rules"][0]["verbs"],
                        serde_json::json!(["list", "watch"])
                    );
                    let binding =
                        &built[&("RoleBinding".into(), "nodegate-agent-probe-pod".into())];
                    assert_eq!(binding["subjects"][0]["name"], "nodegate-agent");
                }
                more => panic!("{name}: one pod-probe namespace expected, got {more:?}"),
            }
        }
    }
}
