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
