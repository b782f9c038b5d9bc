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

/// A rotation to a new CA: the first patch trusts the old and the new CA
/// (replicas still serving the old leaf stay verifiable), the final one the
/// new CA alone.
#[test]
fn also_trust_keeps_the_old_ca_until_the_final_patch() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mwc.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let run = |out_dir: &std::path::Path, extra: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_nodegate-certs"))
            .arg("--out-dir")
            .arg(out_dir)
            .arg("--webhook-config")
            .arg(&config)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    run(&old, &[]);
    let old_ca_path = old.join("ca.crt");
    run(&new, &["--also-trust".as_ref(), old_ca_path.as_os_str()]);
    let old_ca = std::fs::read_to_string(&old_ca_path).unwrap();
    let new_ca = std::fs::read_to_string(new.join("ca.crt")).unwrap();
    assert_ne!(old_ca, new_ca);
    let both = bundle_of(&new.join("ca-bundle-patch.yaml"));
    assert!(both[0].contains(old_ca.trim()) && both[0].contains(new_ca.trim()));
    let last = bundle_of(&new.join("ca-bundle-final-patch.yaml"));
    assert_eq!(last[0], new_ca);

    // Not a certificate: refused before anything is written.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a pem").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-certs"))
        .arg("--out-dir")
        .arg(dir.path().join("refused"))
        .arg("--webhook-config")
        .arg(&config)
        .arg("--also-trust")
        .arg(&junk)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no PEM certificate"));
    assert!(!dir.path().join("refused").exists());
}
