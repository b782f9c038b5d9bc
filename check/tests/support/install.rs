//! An emulated cluster with nodegate installed as the README says (the
//! webhook a real process, its Services, StatefulSet, DaemonSet, policies
//! and configuration in the emulator), and the edits the scenarios make to
//! it.

use nodegate_e2e::manifests::{Objects, by_kind_and_name, kustomize};
use nodegate_e2e::process::{REPLICAS, statefulset_status};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::{Emulator, EmulatorOptions, users};

/// The install, and a directory holding the admin's `kubeconfig`.
pub type Installed = (Emulator, WebhookProcess, tempfile::TempDir);

/// nodegate installed with `config` as its MutatingWebhookConfiguration
/// (`None`: the shipped one).
pub async fn installed(config: Option<String>) -> Installed {
    installed_with(config, None).await
}

/// The same, plus `objects` applied (e.g. the admission policy and binding).
pub async fn installed_with(config: Option<String>, objects: Option<&str>) -> Installed {
    installed_serving(config, objects, &[]).await
}

/// The same with the webhook process started with `webhook_args` on top of
/// the default ones: what it serves, whatever the stored StatefulSet lists.
pub async fn installed_serving(
    config: Option<String>,
    objects: Option<&str>,
    webhook_args: &[&str],
) -> Installed {
    installed_full(config, objects, webhook_args, Vec::new()).await
}

/// The same with `rbac` documents granted on top of the shipped ones.
pub async fn installed_full(
    config: Option<String>,
    objects: Option<&str>,
    webhook_args: &[&str],
    rbac: Vec<String>,
) -> Installed {
    let mut docs = nodegate_e2e::process::shipped_rbac().unwrap();
    docs.extend(rbac);
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(docs),
        ..Default::default()
    })
    .await
    .unwrap();
    let webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
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

/// The shipped configuration (with this process's caBundle) as JSON, for
/// tests that break one line of it.
pub fn shipped_config() -> serde_json::Value {
    serde_yaml::from_str(&nodegate_e2e::process::shipped_webhook_config().unwrap()).unwrap()
}

/// `kubectl kustomize` of the install `base` with `components`, as an
/// operator builds it, keyed by kind and name.
pub fn kustomized(base: &str, components: &[&str]) -> Objects {
    by_kind_and_name(&kustomize(base, components).unwrap()).unwrap()
}

/// Applies the rendered `kind`s named `name` of `objects`; workloads get
/// the statuses of the emulated install (every webhook replica available,
/// the agent on no node) so only their args change.
pub fn apply_rendered(emu: &Emulator, objects: &Objects, which: &[(&str, &str)]) {
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

/// The webhook StatefulSet and the agent DaemonSet.
pub const WORKLOADS: &[(&str, &str)] = &[
    ("StatefulSet", "nodegate-webhook"),
    ("DaemonSet", "nodegate-agent"),
];

/// The confinement policies and their bindings.
pub const CONFINEMENT: &[(&str, &str)] = &[
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
