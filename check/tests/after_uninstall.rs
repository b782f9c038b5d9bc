//! `nodegate-check --after-uninstall` against the emulator: a clean cluster
//! passes; a Node with a gate and the MutatingWebhookConfiguration left
//! behind fail, each with its command; running the printed commands with
//! kubectl leaves the cluster clean.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;

use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{DEFAULT_TAINT, READY_BOOT_ID_ANNOTATION};
use serde_json::json;

use support::{check, failed, line};

/// Runs a command the report printed (`kubectl …`, `&&`-joined) as the
/// admin would; panics if one fails.
fn run_printed(kubeconfig: &Path, commands: &str) {
    for command in commands.split(" && ") {
        let words: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"kubectl"), "{command}");
        let out = Command::new("kubectl")
            .args(&words[1..])
            .env("KUBECONFIG", kubeconfig)
            .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// What follows `marker` in `l`.
fn after<'a>(l: &'a str, marker: &str) -> &'a str {
    let i = l
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in {l}"));
    &l[i + marker.len()..]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_what_is_left_with_the_commands_that_remove_it() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(&kubeconfig, emu.kubeconfig_yaml(users::ADMIN)).unwrap();

    let (code, out) = check(&kubeconfig, &["--after-uninstall"]);
    assert_eq!(code, 0, "{out}");
    assert!(failed(&out).is_empty(), "{out}");
    line(&out, "PASS", "gated nodes");
    line(&out, "PASS", "admission objects");

    // What an uninstall leaves when the agent was gone before the nodes
    // turned ready, and the configuration was not deleted.
    let gate: TaintSpec = DEFAULT_TAINT.parse().unwrap();
    for (name, taints) in [
        ("worker-1", json!([gate.to_json()])),
        ("worker-2", json!([])),
    ] {
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {READY_BOOT_ID_ANNOTATION: "boot-1"}},
            "spec": {"taints": taints},
        });
        emu.apply(&node.to_string()).unwrap();
    }
    emu.apply(&nodegate_e2e::process::shipped_webhook_config().unwrap())
        .unwrap();

    let (code, out) = check(&kubeconfig, &["--after-uninstall"]);
    assert_eq!(code, 1, "{out}");
    let key = gate.key();
    let node = line(&out, "FAIL", "gated node worker-1");
    assert!(
        node.ends_with(&format!("kubectl taint node worker-1 {key}:NoSchedule-")),
        "{node}"
    );
    let all_nodes = line(&out, "FAIL", "gated nodes");
    assert!(
        all_nodes.ends_with(&format!(
            "all at once: kubectl taint nodes worker-1 {key}:NoSchedule-"
        )),
        "{all_nodes}"
    );
    let config = line(&out, "FAIL", "admission objects");
    assert!(
        config.contains("MutatingWebhookConfiguration nodegate is left")
            && config.ends_with("; kubectl delete mutatingwebhookconfiguration/nodegate"),
        "{config}"
    );
    assert_eq!(failed(&out).len(), 3, "{out}");
    assert!(!out.contains("gated node worker-2"), "{out}");
    line(&out, "INFO", "ready-boot-id");

    // The printed commands finish the removal.
    run_printed(&kubeconfig, after(all_nodes, "all at once: "));
    run_printed(&kubeconfig, after(config, "; "));
    let (code, out) = check(&kubeconfig, &["--after-uninstall"]);
    assert_eq!(code, 0, "{out}");
    line(&out, "PASS", "gated nodes");
    line(&out, "PASS", "admission objects");
    // The annotation is only a note, and its command works too.
    let note = line(&out, "INFO", "ready-boot-id");
    run_printed(&kubeconfig, after(note, "to drop it: "));
    let (code, out) = check(&kubeconfig, &["--after-uninstall"]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("INFO  ready-boot-id"), "{out}");
}
