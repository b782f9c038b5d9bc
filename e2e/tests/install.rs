//! The installs as a user runs them: the README's one command each way (and
//! its removal), docs/install.md's bring-your-own-CA steps with the
//! certificate step in a fresh directory, and the caBundle and paths kept
//! when the install is applied again.
//!
//! The whole install (namespace, RBAC, workloads) runs through real kubelets
//! in the real-node harness (`e2e/real-nodes/`); here, in CI, the two steps
//! whose defects can be seen without a cluster: `nodegate-certs` creating its
//! own output directory, and client-side `kubectl apply` of the install after
//! the caBundle went in (the emulator applies kubectl's strategic merge
//! patches with the webhooks' merge key, as the API server does).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;

use nodegate_e2e::process::{bin_path, manifests_dir};
use nodegate_e2e::readme::{install_commands, readme_command, shell, stdout_if_ok, user_dir};
use nodegate_emulator::{Emulator, EmulatorOptions, users};

fn sh(dir: &Path, kubeconfig: Option<&Path>, command: &str) -> Output {
    shell(dir, kubeconfig, command).unwrap()
}

fn ok(what: &str, out: Output) -> String {
    stdout_if_ok(what, out).unwrap()
}

/// A fresh directory with the repository's manifests in it, as a clone has them.
fn fresh_dir() -> tempfile::TempDir {
    assert!(
        bin_path("nodegate-certs").exists(),
        "build nodegate-certs first (cargo build -p nodegate-certs)"
    );
    user_dir().unwrap()
}

/// The README leads with one command per way (what the real-node harness
/// runs verbatim), and each kustomization it names builds.
#[test]
fn the_readme_installs_and_removes_with_one_command_each() {
    assert_eq!(
        readme_command("## Install", true).unwrap(),
        "helm install nodegate charts/nodegate -n nodegate --create-namespace"
    );
    assert_eq!(
        readme_command("## Install", false).unwrap(),
        "kubectl apply -k manifests/"
    );
    assert_eq!(
        readme_command("## Uninstall", true).unwrap(),
        "helm uninstall nodegate -n nodegate"
    );
    let removal = readme_command("## Uninstall", false).unwrap();
    assert_eq!(removal, "kubectl apply -k manifests/uninstall");
    let dir = fresh_dir();
    for k in ["manifests/", "manifests/uninstall"] {
        ok(
            k,
            sh(
                dir.path(),
                None,
                &format!("kubectl kustomize {k} >/dev/null"),
            ),
        );
    }
}

#[test]
fn the_own_ca_certificate_step_runs_as_written_in_a_fresh_directory() {
    let commands = install_commands().unwrap();
    let certs: Vec<&String> = commands
        .iter()
        .filter(|c| c.starts_with("nodegate-certs "))
        .collect();
    assert_eq!(certs.len(), 1, "{commands:?}");
    let dir = fresh_dir();
    ok(
        "the README's nodegate-certs line",
        sh(dir.path(), None, certs[0]),
    );
    for f in ["ca.crt", "tls.crt", "tls.key", "ca-bundle-patch.yaml"] {
        assert!(dir.path().join("ng-certs").join(f).is_file(), "{f} missing");
    }
    // Every file a later command reads is one this step wrote.
    for c in &commands {
        for word in c.split_whitespace() {
            if let Some(f) = word.strip_prefix("./ng-certs/") {
                assert!(dir.path().join("ng-certs").join(f).is_file(), "{c}: {f}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_the_install_again_keeps_the_patched_ca_bundle() {
    let commands = install_commands().unwrap();
    let patch_cmd = commands
        .iter()
        .find(|c| c.starts_with("kubectl patch mutatingwebhookconfiguration"))
        .expect("the README patches the caBundle in")
        .clone();
    let certs_cmd = commands
        .iter()
        .find(|c| c.starts_with("nodegate-certs "))
        .unwrap()
        .clone();
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let kubeconfig = emu.kubeconfig(users::ADMIN).unwrap();
    let dir = fresh_dir();
    let d = dir.path();
    let mwc = manifests_dir().join("webhook/mutatingwebhookconfiguration.yaml");
    let apply = format!("kubectl apply -f {}", mwc.display());
    let bundle = "kubectl get mutatingwebhookconfiguration nodegate -o jsonpath='{.webhooks[0].clientConfig.caBundle}'";
    let paths = "kubectl get mutatingwebhookconfiguration nodegate -o jsonpath='{.webhooks[*].clientConfig.service.path}'";

    ok("certs", sh(d, None, &certs_cmd));
    ok("first apply", sh(d, Some(&kubeconfig), &apply));
    ok("patch", sh(d, Some(&kubeconfig), &patch_cmd));
    let first = ok("read", sh(d, Some(&kubeconfig), bundle));
    assert!(!first.is_empty(), "the patch set no caBundle");
    assert_eq!(
        ok("read", sh(d, Some(&kubeconfig), paths)),
        "",
        "the own-CA patch leaves the paths to the certificates controller"
    );
    // The controller's part: every line to /mutate/<token>, as its JSON patch.
    let token = nodegate_certs::path_token();
    let ops: Vec<serde_json::Value> = (0..3)
        .map(|i| serde_json::json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/service/path"), "value": format!("/mutate/{token}")}))
        .collect();
    std::fs::write(d.join("paths.json"), serde_json::to_string(&ops).unwrap()).unwrap();
    ok(
        "paths",
        sh(
            d,
            Some(&kubeconfig),
            "kubectl patch mutatingwebhookconfiguration nodegate --type=json --patch-file paths.json",
        ),
    );
    let want_paths = vec![format!("/mutate/{token}"); 3].join(" ");
    assert_eq!(ok("read", sh(d, Some(&kubeconfig), paths)), want_paths);
    // An upgrade: the same install applied again, twice.
    for round in 0..2 {
        ok("apply again", sh(d, Some(&kubeconfig), &apply));
        let now = ok("read", sh(d, Some(&kubeconfig), bundle));
        assert_eq!(
            now, first,
            "round {round}: applying the install again changed caBundle"
        );
        assert_eq!(
            ok("read", sh(d, Some(&kubeconfig), paths)),
            want_paths,
            "round {round}: applying the install again changed the lines' path"
        );
    }
    // The rest of the configuration is the shipped one.
    let hooks = ok(
        "read",
        sh(
            d,
            Some(&kubeconfig),
            "kubectl get mutatingwebhookconfiguration nodegate -o jsonpath='{.webhooks[*].failurePolicy}'",
        ),
    );
    // Every line: the first and one backup per replica.
    assert_eq!(hooks, "Ignore Ignore Ignore");

    // What the old install did: the caBundle applied, then the install
    // applied again. Client-side apply removes the field — the defect the
    // patch avoids, and proof that this test sees it.
    let with_ca =
        nodegate_certs::inject_ca_bundle(&std::fs::read_to_string(&mwc).unwrap(), "pem").unwrap();
    std::fs::write(d.join("old-mwc.yaml"), with_ca).unwrap();
    ok(
        "old way",
        sh(d, Some(&kubeconfig), "kubectl apply -f old-mwc.yaml"),
    );
    assert!(!ok("read", sh(d, Some(&kubeconfig), bundle)).is_empty());
    ok("apply again", sh(d, Some(&kubeconfig), &apply));
    assert_eq!(
        ok("read", sh(d, Some(&kubeconfig), bundle)),
        "",
        "client-side apply keeps a field its last apply set: the emulator no longer shows the defect"
    );

    // The migration docs/install.md gives an install made the old way: the
    // last-applied annotation replaced, the object untouched; applies are
    // then safe.
    ok(
        "old way again",
        sh(d, Some(&kubeconfig), "kubectl apply -f old-mwc.yaml"),
    );
    ok(
        "migration",
        sh(
            d,
            Some(&kubeconfig),
            &format!("kubectl apply set-last-applied -f {}", mwc.display()),
        ),
    );
    assert_eq!(ok("read", sh(d, Some(&kubeconfig), bundle)), "cGVt");
    ok(
        "apply after the migration",
        sh(d, Some(&kubeconfig), &apply),
    );
    assert_eq!(
        ok("read", sh(d, Some(&kubeconfig), bundle)),
        "cGVt",
        "applying after the migration emptied caBundle"
    );
}
