//! The `nodegate-certs` binary: files and the caBundle patch written, bad input
//! refused before anything is written.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use base64::Engine;

const CONFIG: &str = "apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: nodegate}
webhooks:
  - name: nodes.nodegate.dev
    clientConfig: {service: {name: nodegate-webhook, namespace: nodegate, path: /mutate}}
";

#[test]
fn writes_files_and_the_ca_bundle_patch_into_a_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mwc.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let out_dir = dir.path().join("tls");
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-certs"))
        .arg("--out-dir")
        .arg(&out_dir)
        .args(["--ip", "127.0.0.1", "--days", "2"])
        .arg("--webhook-config")
        .arg(&config)
        .env("NODEGATE_CERTS_NAMESPACE", "other-ns")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ca = std::fs::read_to_string(out_dir.join("ca.crt")).unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(
        std::fs::read_to_string(out_dir.join("tls.key"))
            .unwrap()
            .contains("PRIVATE KEY")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out_dir.join("tls.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // Nothing on stdout: a shell redirect into --out-dir would be opened
    // before the directory exists.
    assert!(out.stdout.is_empty());
    let patch = std::fs::read_to_string(out_dir.join("ca-bundle-patch.yaml")).unwrap();
    let printed: serde_yaml::Value = serde_yaml::from_str(&patch).unwrap();
    assert_eq!(printed["webhooks"][0]["name"], "nodes.nodegate.dev");
    let bundle = printed["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .unwrap(),
        ca.as_bytes()
    );

    // The namespace came from the environment: the leaf is for other-ns.
    let leaf = std::fs::read_to_string(out_dir.join("tls.crt")).unwrap();
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(leaf.as_bytes())
        .map(|d: rustls_pki_types::CertificateDer<'_>| d.to_vec())
        .unwrap();
    let needle = b"nodegate-webhook.other-ns.svc";
    assert!(der.windows(needle.len()).any(|w| w == needle));
}

#[test]
fn bad_config_fails_before_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cm.yaml");
    std::fs::write(&config, "apiVersion: v1\nkind: ConfigMap\n").unwrap();
    let out_dir = dir.path().join("tls");
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-certs"))
        .arg("--out-dir")
        .arg(&out_dir)
        .arg("--webhook-config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MutatingWebhookConfiguration"), "{err}");
    assert!(!out_dir.exists(), "files written despite the error");

    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-certs"))
        .arg("--out-dir")
        .arg(&out_dir)
        .args(["--service", "Not_A_Label"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("DNS-1123"));
}

/// The SANs of the leaf in `dir`, as DER bytes to search.
fn leaf_der(dir: &std::path::Path) -> Vec<u8> {
    let leaf = std::fs::read_to_string(dir.join("tls.crt")).unwrap();
    rustls_pki_types::pem::PemObject::from_pem_slice(leaf.as_bytes())
        .map(|d: rustls_pki_types::CertificateDer<'_>| d.to_vec())
        .unwrap()
}

fn bundle_of(patch_file: &std::path::Path) -> Vec<String> {
    let patch: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(patch_file).unwrap()).unwrap();
    patch["webhooks"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|h| {
            let b = h["clientConfig"]["caBundle"].as_str().unwrap();
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap()
        })
        .collect()
}

/// One certificate for every line: the shipped configuration names the
/// first line's Service and each replica's own, and the leaf carries all.
#[test]
fn the_leaf_serves_every_service_the_shipped_configuration_calls() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/base/webhook/mutatingwebhookconfiguration.yaml"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-certs"))
        .arg("--out-dir")
        .arg(dir.path())
        .args(["--webhook-config", shipped])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let der = leaf_der(dir.path());
    for name in [
        "nodegate-webhook.nodegate.svc",
        "nodegate-webhook-0.nodegate.svc",
        "nodegate-webhook-1.nodegate.svc",
    ] {
        assert!(
            der.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name} missing from the leaf"
        );
    }
    let bundles = bundle_of(&dir.path().join("ca-bundle-patch.yaml"));
    assert_eq!(bundles.len(), 3, "a caBundle for every line");
    assert!(!dir.path().join("ca-bundle-final-patch.yaml").exists());
}

fn certs(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nodegate-certs"))
        .args(args)
        .output()
        .unwrap()
}

fn succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rotation to a new CA: the first patch trusts the old and the new CA
/// (replicas still serving the old leaf stay verifiable), the final one the
/// new CA alone. The old CA is checked against the live configuration, here
/// what `kubectl patch` left after the install.
#[test]
fn also_trust_keeps_the_old_ca_until_the_final_patch() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(p("mwc.yaml"), CONFIG).unwrap();
    succeeded(&certs(&[
        "--out-dir".as_ref(),
        p("old").as_os_str(),
        "--webhook-config".as_ref(),
        p("mwc.yaml").as_os_str(),
    ]));
    let old_ca = std::fs::read_to_string(p("old/ca.crt")).unwrap();
    let live = nodegate_certs::inject_ca_bundle(CONFIG, &old_ca).unwrap();
    std::fs::write(p("live.yaml"), live).unwrap();
    let old_ca_path = p("old/ca.crt");
    succeeded(&certs(&[
        "--out-dir".as_ref(),
        p("new").as_os_str(),
        "--webhook-config".as_ref(),
        p("live.yaml").as_os_str(),
        "--also-trust".as_ref(),
        old_ca_path.as_os_str(),
    ]));
    let new_ca = std::fs::read_to_string(p("new/ca.crt")).unwrap();
    assert_ne!(old_ca, new_ca);
    let both = bundle_of(&p("new/ca-bundle-patch.yaml"));
    assert_eq!(both[0], format!("{new_ca}{old_ca}"));
    let last = bundle_of(&p("new/ca-bundle-final-patch.yaml"));
    assert_eq!(last[0], new_ca);
}

/// Every refusal of `--also-trust` names the file and the reason, and comes
/// before anything is written.
#[test]
fn also_trust_refuses_keys_leaves_garbage_and_cas_the_cluster_does_not_trust() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(p("mwc.yaml"), CONFIG).unwrap();
    for run in ["old", "other"] {
        succeeded(&certs(&[
            "--out-dir".as_ref(),
            p(run).as_os_str(),
            "--webhook-config".as_ref(),
            p("mwc.yaml").as_os_str(),
        ]));
    }
    let read = |name: &str| std::fs::read_to_string(p(name)).unwrap();
    let live = nodegate_certs::inject_ca_bundle(CONFIG, &read("old/ca.crt")).unwrap();
    std::fs::write(p("live.yaml"), live).unwrap();
    std::fs::write(p("with-key.pem"), read("old/ca.crt") + &read("old/tls.key")).unwrap();
    std::fs::write(p("garbage.pem"), "not a pem").unwrap();
    // (configuration, file, the reason, the file the error names)
    let cases = [
        (
            "live.yaml",
            "with-key.pem",
            "a private key must never be passed around",
            "with-key.pem",
        ),
        // The key is named first, even with the wrong configuration.
        (
            "mwc.yaml",
            "with-key.pem",
            "a private key must never be passed around",
            "with-key.pem",
        ),
        (
            "live.yaml",
            "old/tls.crt",
            "is not a CA certificate",
            "old/tls.crt",
        ),
        ("live.yaml", "garbage.pem", "no PEM block", "garbage.pem"),
        (
            "live.yaml",
            "other/ca.crt",
            "not in the live caBundle: keeping it trusted would not keep the running replicas reachable",
            "other/ca.crt",
        ),
        // The shipped file has no caBundle: not the live configuration.
        (
            "mwc.yaml",
            "old/ca.crt",
            "kubectl get mutatingwebhookconfiguration nodegate -o yaml",
            "mwc.yaml",
        ),
    ];
    for (config, file, why, named) in cases {
        let out_dir = p("refused");
        let out = certs(&[
            "--out-dir".as_ref(),
            out_dir.as_os_str(),
            "--webhook-config".as_ref(),
            p(config).as_os_str(),
            "--also-trust".as_ref(),
            p(file).as_os_str(),
        ]);
        assert!(!out.status.success(), "{file} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{file}: {err}");
        assert!(
            err.contains(named),
            "{file}: the error does not name {named}: {err}"
        );
        assert!(!out_dir.exists(), "{file}: files written despite the error");
    }
}

/// A rotation run in a fresh directory (the first run's `path-token` lost)
/// keeps the token the live lines call: a new one would point every line at
/// a path the running replicas refuse to act on.
#[test]
fn a_rotation_without_the_token_file_keeps_the_live_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = "0123456789abcdef0123456789abcdef0123456789abcdef";
    let live = dir.path().join("live.yaml");
    std::fs::write(
        &live,
        CONFIG.replace("path: /mutate}", &format!("path: /mutate/{token}}}")),
    )
    .unwrap();
    let out_dir = dir.path().join("rotated");
    succeeded(&certs(&[
        "--out-dir".as_ref(),
        out_dir.as_os_str(),
        "--webhook-config".as_ref(),
        live.as_os_str(),
    ]));
    assert_eq!(
        std::fs::read_to_string(out_dir.join("path-token")).unwrap(),
        token
    );
    let patch: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(out_dir.join("ca-bundle-patch.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        patch["webhooks"][0]["clientConfig"]["service"]["path"],
        format!("/mutate/{token}").as_str()
    );
}

/// The path token is a secret: `path-token` and every patch whose lines call
/// `/mutate/<token>` (the install's and a rotation's two) are readable by
/// their owner alone, and no file others may read holds the token.
#[test]
fn every_file_that_holds_the_path_token_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(p("mwc.yaml"), CONFIG).unwrap();
    succeeded(&certs(&[
        "--out-dir".as_ref(),
        p("install").as_os_str(),
        "--webhook-config".as_ref(),
        p("mwc.yaml").as_os_str(),
    ]));
    let token = std::fs::read_to_string(p("install/path-token")).unwrap();
    let ca = std::fs::read_to_string(p("install/ca.crt")).unwrap();
    let live = nodegate_certs::inject_ca_bundle(CONFIG, &ca)
        .unwrap()
        .replace("path: /mutate", &format!("path: /mutate/{token}"));
    std::fs::write(p("live.yaml"), live).unwrap();
    let old_ca = p("install/ca.crt");
    succeeded(&certs(&[
        "--out-dir".as_ref(),
        p("rotation").as_os_str(),
        "--webhook-config".as_ref(),
        p("live.yaml").as_os_str(),
        "--also-trust".as_ref(),
        old_ca.as_os_str(),
    ]));
    let private = [
        "install/path-token",
        "install/ca-bundle-patch.yaml",
        "rotation/path-token",
        "rotation/ca-bundle-patch.yaml",
        "rotation/ca-bundle-final-patch.yaml",
    ];
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    for name in private {
        let text = std::fs::read_to_string(p(name)).unwrap();
        assert!(text.contains(&token), "{name} holds no token: {text}");
        assert_eq!(mode(&p(name)), 0o600, "{name}");
    }
    for run in ["install", "rotation"] {
        for entry in std::fs::read_dir(p(run)).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read(&path).unwrap();
            let holds = text.windows(token.len()).any(|w| w == token.as_bytes());
            assert!(
                !holds || mode(&path) == 0o600,
                "{} holds the token with mode {:o}",
                path.display(),
                mode(&path)
            );
        }
    }
}
