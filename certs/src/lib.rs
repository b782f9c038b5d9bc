//! CA and serving certificate generation for the nodegate webhook.
//!
//! The API server reaches a service webhook at `<svc>.<ns>.svc`, verifies the
//! chain against the configuration's `caBundle` and checks SANs only (no CN
//! fallback), so the leaf carries every service DNS form as a SAN and the CA
//! PEM goes into `clientConfig.caBundle` of the MutatingWebhookConfiguration.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine;
use nodegate_shared::taint::is_dns1123_label;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use time::{Duration, OffsetDateTime};

pub mod trust;

/// File names inside the output directory, as a `kubernetes.io/tls` Secret
/// (plus `ca.crt`) mounts them.
pub const CA_FILE: &str = "ca.crt";
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// Validity is capped so that `now + days` can never overflow the date types.
const MAX_DAYS: u32 = 36_500;

/// Why certificates could not be generated, written or injected.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("webhook configuration is not valid YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("webhook configuration: {0}")]
    NotWebhookConfig(String),
}

/// A self-signed CA that can issue serving certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the signing key.
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// What the serving certificate is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingRequest {
    pub service: String,
    pub namespace: String,
    /// More Services the same certificate serves, `(name, namespace)`: one
    /// per replica when each has its own line of admission.
    pub also_services: Vec<(String, String)>,
    /// Extra IP SANs, for running the webhook outside the cluster (tests, local use).
    pub ips: Vec<IpAddr>,
    pub days: u32,
}

/// A serving certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl ServingRequest {
    /// The DNS SANs: every name a client inside the cluster may use for the service.
    pub fn dns_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        let first = (self.service.clone(), self.namespace.clone());
        for (svc, ns) in std::iter::once(&first).chain(&self.also_services) {
            for name in [
                svc.clone(),
                format!("{svc}.{ns}"),
                format!("{svc}.{ns}.svc"),
                format!("{svc}.{ns}.svc.cluster.local"),
            ] {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names
    }

    fn validate(&self) -> Result<(), CertError> {
        for (what, v) in [("service", &self.service), ("namespace", &self.namespace)] {
            if !is_dns1123_label(v) {
                return Err(CertError::Invalid(format!(
                    "{what} {v:?} must be a DNS-1123 label (lowercase alphanumerics and '-', at most 63)"
                )));
            }
        }
        check_days(self.days)
    }
}

fn check_days(days: u32) -> Result<(), CertError> {
    if days == 0 || days > MAX_DAYS {
        return Err(CertError::Invalid(format!(
            "days must be between 1 and {MAX_DAYS}, got {days}"
        )));
    }
    Ok(())
}

/// Backdated a little so a client with a slightly slow clock accepts a fresh cert.
fn validity(params: &mut CertificateParams, days: u32) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(i64::from(days));
}

impl Ca {
    /// A new ECDSA P-256 CA valid for `days`.
    pub fn generate(days: u32) -> Result<Ca, CertError> {
        check_days(days)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "nodegate-webhook-ca");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, days);
        let issuer = CertifiedIssuer::self_signed(params, key)?;
        let cert_pem = issuer.pem();
        Ok(Ca { issuer, cert_pem })
    }

    /// The CA certificate, for `ca.crt` and the webhook's `caBundle`.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A fresh ECDSA P-256 serving certificate for the service, signed by this CA.
    pub fn issue(&self, req: &ServingRequest) -> Result<ServingCert, CertError> {
        req.validate()?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(req.dns_names())?;
        params
            .subject_alt_names
            .extend(req.ips.iter().copied().map(SanType::IpAddress));
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            format!("{}.{}.svc", req.service, req.namespace),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, req.days);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`, creating it.
///
/// Each file is written to a temporary name and renamed into place, so a
/// reader (the webhook's reloader) never sees a partly written file.
pub fn write_files(
    dir: impl AsRef<Path>,
    ca_pem: &str,
    serving: &ServingCert,
) -> Result<(), CertError> {
    let dir = dir.as_ref();
    fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_owned(),
        source,
    })?;
    write_atomic(&dir.join(CA_FILE), ca_pem.as_bytes(), 0o644)?;
    write_atomic(&dir.join(KEY_FILE), serving.key_pem.as_bytes(), 0o600)?;
    write_atomic(&dir.join(CERT_FILE), serving.cert_pem.as_bytes(), 0o644)?;
    Ok(())
}

/// Writes `data` to `path` with `mode` through a temporary name and a rename.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_owned(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut f = opts.open(&tmp)?;
        // The mode given to open() only applies when the file is created.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Sets `clientConfig.caBundle` (base64 of `ca_pem`) on every webhook of a
/// MutatingWebhookConfiguration given as YAML (or JSON), and returns the YAML.
pub fn inject_ca_bundle(webhook_config_yaml: &str, ca_pem: &str) -> Result<String, CertError> {
    use serde_yaml::Value;
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    for (i, hook) in webhooks_mut(&mut doc)?.iter_mut().enumerate() {
        let hook = hook.as_mapping_mut().ok_or_else(|| {
            CertError::NotWebhookConfig(format!("webhooks[{i}] is not a mapping"))
        })?;
        let client = hook
            .entry("clientConfig".into())
            .or_insert_with(|| Value::Mapping(Default::default()));
        let client = client.as_mapping_mut().ok_or_else(|| {
            CertError::NotWebhookConfig(format!("webhooks[{i}].clientConfig is not a mapping"))
        })?;
        client.insert("caBundle".into(), Value::String(bundle.clone()));
    }
    Ok(serde_yaml::to_string(&doc)?)
}

/// A new path token: 192 random bits, lowercase hex (what the API server
/// accepts in a webhook path).
pub fn path_token() -> String {
    let bytes: [u8; 24] = rand::random();
    nodegate_shared::path_token::encode(&bytes)
}

/// A strategic merge patch (`kubectl patch mutatingwebhookconfiguration NAME
/// --patch-file`) that sets `clientConfig.caBundle` on every webhook of the
/// given configuration, by webhook name (the list's merge key), and with a
/// `token`, `clientConfig.service.path` to `/mutate/<token>` on every webhook
/// that calls a Service: only the API server, which reads the path from the
/// configuration, then calls the route whose reviews may write Nodes.
///
/// A patch, not a whole configuration for `kubectl apply`: client-side apply
/// removes any field its last-applied configuration had and the next one
/// lacks, so applying the install again (without the caBundle) after applying
/// a configuration with it would silently empty `caBundle`. A patched field is
/// never in the last-applied configuration, so re-applying keeps it.
pub fn ca_bundle_patch(
    webhook_config_yaml: &str,
    ca_pem: &str,
    token: Option<&str>,
) -> Result<String, CertError> {
    use serde_yaml::{Mapping, Value};
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut hooks = Vec::new();
    for (i, hook) in webhooks_mut(&mut doc)?.iter().enumerate() {
        let name = hook
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| CertError::NotWebhookConfig(format!("webhooks[{i}] has no name")))?;
        let mut client = Mapping::new();
        client.insert("caBundle".into(), Value::String(bundle.clone()));
        let calls_service = hook
            .get("clientConfig")
            .and_then(|c| c.get("service"))
            .is_some();
        if let (Some(t), true) = (token, calls_service) {
            let mut service = Mapping::new();
            service.insert(
                "path".into(),
                Value::String(format!("{}{t}", nodegate_shared::path_token::PATH_PREFIX)),
            );
            client.insert("service".into(), Value::Mapping(service));
        }
        let mut entry = Mapping::new();
        entry.insert("name".into(), Value::String(name.to_owned()));
        entry.insert("clientConfig".into(), Value::Mapping(client));
        hooks.push(Value::Mapping(entry));
    }
    let mut patch = Mapping::new();
    patch.insert("webhooks".into(), Value::Sequence(hooks));
    Ok(serde_yaml::to_string(&Value::Mapping(patch))?)
}

/// Every Service the configuration's webhooks call, `(name, namespace)`, in
/// order and once each: the names one serving certificate must carry.
pub fn webhook_services(webhook_config_yaml: &str) -> Result<Vec<(String, String)>, CertError> {
    use serde_yaml::Value;
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let mut out = Vec::new();
    for hook in webhooks_mut(&mut doc)?.iter() {
        let Some(svc) = hook.get("clientConfig").and_then(|c| c.get("service")) else {
            continue;
        };
        let field = |k: &str| svc.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let pair = (field("name"), field("namespace"));
        if !pair.0.is_empty() && !out.contains(&pair) {
            out.push(pair);
        }
    }
    Ok(out)
}

/// The path token the configuration's lines already call
/// (`service.path` `/mutate/<token>`), so a rotation that lost its
/// `path-token` file keeps the path the running replicas accept: `None` when
/// no line names one (a configuration never patched); an error when lines
/// disagree or a token is malformed, which a user must resolve.
pub fn live_path_token(webhook_config_yaml: &str) -> Result<Option<String>, CertError> {
    use serde_yaml::Value;
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let mut found: Option<String> = None;
    for hook in webhooks_mut(&mut doc)?.iter() {
        let Some(path) = hook
            .get("clientConfig")
            .and_then(|c| c.get("service"))
            .and_then(|s| s.get("path"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        // A path without a token (an older release's `/mutate`) names none.
        let Some(t) = path.strip_prefix("/mutate/") else {
            continue;
        };
        let token = nodegate_shared::path_token::parse(t)
            .map_err(|why| CertError::NotWebhookConfig(format!("a line calls {path:?}: {why}")))?
            .to_string();
        match &found {
            Some(f) if *f != token => {
                return Err(CertError::NotWebhookConfig(
                    "its lines call different path tokens".into(),
                ));
            }
            _ => found = Some(token),
        }
    }
    Ok(found)
}

/// The non-empty `webhooks` list of a v1 MutatingWebhookConfiguration.
fn webhooks_mut(doc: &mut serde_yaml::Value) -> Result<&mut Vec<serde_yaml::Value>, CertError> {
    use serde_yaml::Value;
    let root = doc.as_mapping_mut().ok_or_else(|| {
        CertError::NotWebhookConfig("expected a single YAML mapping (one document)".into())
    })?;
    let kind = root.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "MutatingWebhookConfiguration" {
        return Err(CertError::NotWebhookConfig(format!(
            "expected kind MutatingWebhookConfiguration, found {:?}",
            kind
        )));
    }
    let api = root.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api != "admissionregistration.k8s.io/v1" {
        return Err(CertError::NotWebhookConfig(format!(
            "expected apiVersion admissionregistration.k8s.io/v1, found {api:?}"
        )));
    }
    root.get_mut("webhooks")
        .and_then(Value::as_sequence_mut)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| CertError::NotWebhookConfig("it has no webhooks".into()))
}

#[cfg(test)]
mod tests {

    fn config_with_paths(paths: &[Option<&str>]) -> String {
        let hooks: Vec<serde_json::Value> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut svc = serde_json::json!({"name": format!("s{i}"), "namespace": "nodegate"});
                if let Some(p) = p {
                    svc["path"] = serde_json::json!(p);
                }
                serde_json::json!({"name": format!("l{i}.nodegate.dev"), "clientConfig": {"service": svc}})
            })
            .collect();
        serde_yaml::to_string(&serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "nodegate"},
            "webhooks": hooks,
        }))
        .unwrap()
    }

    #[test]
    fn the_live_path_token_is_the_one_every_line_calls() {
        let t = "0123456789abcdef0123456789abcdef0123456789abcdef";
        let path = format!("/mutate/{t}");
        type Case<'a> = (&'a [Option<&'a str>], Result<Option<&'a str>, &'a str>);
        let cases: [Case; 5] = [
            (&[None, None], Ok(None)),
            (&[Some(&path), Some(&path)], Ok(Some(t))),
            (
                &[
                    Some(&path),
                    Some("/mutate/0123456789abcdef0123456789abcdef0"),
                ],
                Err("different path tokens"),
            ),
            (&[Some("/mutate"), None], Ok(None)),
            (&[Some("/mutate/NOT-A-TOKEN")], Err("a line calls")),
        ];
        for (paths, want) in cases {
            let got = live_path_token(&config_with_paths(paths));
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g.as_deref(), w, "{paths:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{paths:?}: {e}"),
                (g, w) => panic!("{paths:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

    use super::*;

    fn request() -> ServingRequest {
        ServingRequest {
            service: "nodegate-webhook".into(),
            also_services: vec![],
            namespace: "nodegate".into(),
            ips: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
            days: 30,
        }
    }

    fn verifier(ca_pem: &str) -> Arc<WebPkiServerVerifier> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap()
    }

    fn verify(ca_pem: &str, leaf_pem: &str, name: &str) -> Result<(), rustls::Error> {
        let leaf = CertificateDer::from_pem_slice(leaf_pem.as_bytes()).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        verifier(ca_pem)
            .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn leaf_verifies_against_ca_for_every_san() {
        let ca = Ca::generate(365).unwrap();
        let leaf = ca.issue(&request()).unwrap();
        for name in [
            "nodegate-webhook",
            "nodegate-webhook.nodegate",
            "nodegate-webhook.nodegate.svc",
            "nodegate-webhook.nodegate.svc.cluster.local",
            "127.0.0.1",
            "::1",
        ] {
            verify(ca.cert_pem(), &leaf.cert_pem, name)
                .unwrap_or_else(|e| panic!("{name} should verify: {e}"));
        }
        let err = verify(ca.cert_pem(), &leaf.cert_pem, "other.nodegate.svc").unwrap_err();
        assert!(err.to_string().contains("not valid for name"), "{err}");
        // The key is a usable PKCS#8 EC key matching the cert.
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        assert!(matches!(key, PrivateKeyDer::Pkcs8(_)));
    }

    #[test]
    fn leaf_from_another_ca_is_rejected() {
        let ca = Ca::generate(1).unwrap();
        let other = Ca::generate(1).unwrap();
        let leaf = other.issue(&request()).unwrap();
        assert!(
            verify(
                ca.cert_pem(),
                &leaf.cert_pem,
                "nodegate-webhook.nodegate.svc"
            )
            .is_err()
        );
    }

    #[test]
    fn rotation_issues_a_new_leaf_from_the_same_ca() {
        let ca = Ca::generate(1).unwrap();
        let a = ca.issue(&request()).unwrap();
        let b = ca.issue(&request()).unwrap();
        assert_ne!(a.cert_pem, b.cert_pem);
        assert_ne!(a.key_pem, b.key_pem);
        verify(ca.cert_pem(), &b.cert_pem, "nodegate-webhook.nodegate.svc").unwrap();
    }

    #[test]
    fn refuses_bad_requests() {
        let ca = Ca::generate(1).unwrap();
        let mut req = request();
        req.service = "Bad_Name".into();
        let err = ca.issue(&req).unwrap_err().to_string();
        assert!(err.contains("service \"Bad_Name\""), "{err}");
        let mut req = request();
        req.days = 0;
        assert!(ca.issue(&req).unwrap_err().to_string().contains("days"));
        assert!(Ca::generate(MAX_DAYS + 1).is_err());
    }

    #[test]
    fn writes_files_atomically_with_private_key_mode() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let ca = Ca::generate(1).unwrap();
        let leaf = ca.issue(&request()).unwrap();
        write_files(&out, ca.cert_pem(), &leaf).unwrap();
        assert_eq!(
            fs::read_to_string(out.join(CA_FILE)).unwrap(),
            ca.cert_pem()
        );
        assert_eq!(
            fs::read_to_string(out.join(CERT_FILE)).unwrap(),
            leaf.cert_pem
        );
        assert_eq!(
            fs::read_to_string(out.join(KEY_FILE)).unwrap(),
            leaf.key_pem
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(out.join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Overwriting works and leaves no temporary files behind.
        let leaf2 = ca.issue(&request()).unwrap();
        write_files(&out, ca.cert_pem(), &leaf2).unwrap();
        assert_eq!(
            fs::read_to_string(out.join(CERT_FILE)).unwrap(),
            leaf2.cert_pem
        );
        let mut names: Vec<_> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["ca.crt", "tls.crt", "tls.key"]);
    }

    const CONFIG: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: nodegate
webhooks:
  - name: nodes.nodegate.dev
    clientConfig:
      service: {name: nodegate-webhook, namespace: nodegate, path: /mutate}
    failurePolicy: Ignore
  - name: status.nodegate.dev
    clientConfig:
      caBundle: b2xk
      service: {name: nodegate-webhook, namespace: nodegate, path: /mutate}
"#;

    #[test]
    fn inject_sets_ca_bundle_on_every_webhook() {
        let ca = Ca::generate(1).unwrap();
        let out = inject_ca_bundle(CONFIG, ca.cert_pem()).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        let hooks = doc["webhooks"].as_sequence().unwrap();
        assert_eq!(hooks.len(), 2);
        for hook in hooks {
            let b64 = hook["clientConfig"]["caBundle"].as_str().unwrap();
            let pem = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            assert_eq!(pem, ca.cert_pem().as_bytes());
            assert_eq!(hook["clientConfig"]["service"]["path"], "/mutate");
        }
        assert_eq!(hooks[0]["failurePolicy"], "Ignore");
        // Round trip: injecting again replaces, never duplicates.
        let again = inject_ca_bundle(&out, ca.cert_pem()).unwrap();
        assert_eq!(again, out);
    }

    #[test]
    fn patch_names_every_webhook_and_carries_only_its_ca_bundle() {
        let ca = Ca::generate(1).unwrap();
        let patch = ca_bundle_patch(CONFIG, ca.cert_pem(), None).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&patch).unwrap();
        let hooks = doc["webhooks"].as_sequence().unwrap();
        let names: Vec<_> = hooks.iter().map(|h| h["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["nodes.nodegate.dev", "status.nodegate.dev"]);
        for hook in hooks {
            // Only the merge key and the bundle: a patch must not reset the
            // rest of the configuration.
            assert_eq!(hook.as_mapping().unwrap().len(), 2, "{hook:?}");
            assert_eq!(hook["clientConfig"].as_mapping().unwrap().len(), 1);
            let pem = base64::engine::general_purpose::STANDARD
                .decode(hook["clientConfig"]["caBundle"].as_str().unwrap())
                .unwrap();
            assert_eq!(pem, ca.cert_pem().as_bytes());
        }
        assert_eq!(doc.as_mapping().unwrap().len(), 1, "only webhooks");
        let nameless = "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: [{clientConfig: {}}]\n";
        let err = ca_bundle_patch(nameless, "pem", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("webhooks[0] has no name"), "{err}");
        let err = ca_bundle_patch("apiVersion: v1\nkind: ConfigMap\n", "pem", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ConfigMap"), "{err}");
    }

    /// With a token every line's Service path becomes `/mutate/<token>`,
    /// and nothing else of the Service is in the patch (the merge keeps
    /// name, namespace and port); tokens are long, URL-safe and fresh.
    #[test]
    fn patch_points_every_line_at_the_token_path() {
        let token = path_token();
        assert_eq!(
            nodegate_shared::path_token::parse(&token),
            Ok(token.as_str())
        );
        assert_ne!(token, path_token());
        let patch = ca_bundle_patch(CONFIG, "pem", Some(&token)).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&patch).unwrap();
        for hook in doc["webhooks"].as_sequence().unwrap() {
            let service = hook["clientConfig"]["service"].as_mapping().unwrap();
            assert_eq!(service.len(), 1, "{service:?}");
            assert_eq!(
                hook["clientConfig"]["service"]["path"].as_str().unwrap(),
                format!("/mutate/{token}")
            );
        }
        let url_hook = "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: [{name: a, clientConfig: {url: 'https://x/mutate'}}]\n";
        let patch = ca_bundle_patch(url_hook, "pem", Some(&token)).unwrap();
        assert!(
            !patch.contains(&token),
            "a url line is left as it is: {patch}"
        );
    }

    #[test]
    fn inject_refuses_what_is_not_a_webhook_config() {
        let cases = [
            ("webhooks: [unclosed", "not valid YAML"),
            ("- a\n- b\n", "single YAML mapping"),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
                "found \"ConfigMap\"",
            ),
            (
                "apiVersion: admissionregistration.k8s.io/v1beta1\nkind: MutatingWebhookConfiguration\nwebhooks: [{name: a}]\n",
                "apiVersion",
            ),
            (
                "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: []\n",
                "no webhooks",
            ),
            (
                "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: [{name: a, clientConfig: 3}]\n",
                "clientConfig is not a mapping",
            ),
        ];
        for (input, want) in cases {
            let err = inject_ca_bundle(input, "pem").unwrap_err().to_string();
            assert!(err.contains(want), "{input:?}: {err} should mention {want}");
        }
    }
}
