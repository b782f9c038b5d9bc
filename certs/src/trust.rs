//! What `--also-trust` may keep in the caBundle during a rotation.
//!
//! A rotation keeps the old CA trusted so that replicas still serving the old
//! leaf stay reachable. Anything else in that file would widen what the API
//! server trusts for webhook calls (another CA, a leaf trusted as a root) or
//! publish what must stay secret (a private key, readable by anyone who may
//! read the webhook configuration). So the file may hold only CA
//! certificates, each already in the live caBundle: a rotation keeps trust,
//! it never adds any. Parsing and the decision are pure; the binary reads
//! the files.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use x509_parser::pem::Pem;

/// The command that prints the live configuration, for the error messages.
pub const LIVE_CONFIG_COMMAND: &str = "kubectl get mutatingwebhookconfiguration nodegate -o yaml";

/// A CA certificate from an `--also-trust` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaCert {
    /// DER, as the caBundle's PEM carries it.
    pub der: Vec<u8>,
    /// The subject, to name the certificate in messages.
    pub subject: String,
}

impl CaCert {
    /// PEM with LF line endings, as `ca.crt` is written.
    pub fn pem(&self) -> String {
        let block = pem::Pem::new("CERTIFICATE", self.der.clone());
        pem::encode_config(
            &block,
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    }
}

/// Why an `--also-trust` file is refused. Block numbers count from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not PEM ({0}): expected the old CA certificate, ca.crt")]
    NotPem(String),
    #[error("no PEM block in it: expected the old CA certificate, ca.crt")]
    NoBlock,
    #[error(
        "block {block} is a {label}: a private key must never be passed around (the caBundle is readable by anyone who may read the webhook configuration); give the CA certificate alone, ca.crt"
    )]
    PrivateKey { block: usize, label: String },
    #[error("block {block} is a {label}, not a CERTIFICATE: give the CA certificate alone, ca.crt")]
    NotCertificate { block: usize, label: String },
    #[error("block {block} is not an X.509 certificate: {reason}")]
    NotX509 { block: usize, reason: String },
    #[error(
        "block {block} ({subject}) is not a CA certificate (no basicConstraints CA:true): a serving certificate in the caBundle would be trusted as a root"
    )]
    NotCa { block: usize, subject: String },
    #[error(
        "block {block} ({subject}) is not in the live caBundle: keeping it trusted would not keep the running replicas reachable"
    )]
    NotLive { block: usize, subject: String },
}

/// Every certificate some line of the live configuration trusts now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveBundle {
    ders: Vec<Vec<u8>>,
}

impl LiveBundle {
    pub fn contains(&self, der: &[u8]) -> bool {
        self.ders.iter().any(|d| d == der)
    }

    pub fn len(&self) -> usize {
        self.ders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ders.is_empty()
    }
}

/// Why the configuration given with `--also-trust` cannot say what the
/// cluster trusts now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveError {
    #[error("not a MutatingWebhookConfiguration: {0}")]
    NotConfig(String),
    #[error(
        "no line has a caBundle, so it is not the live configuration: pass the one the cluster holds (kubectl get mutatingwebhookconfiguration nodegate -o yaml)"
    )]
    NoBundle,
}

/// Parses an `--also-trust` file: PEM whose every block is a CA certificate.
/// Text between blocks is allowed (it never reaches the caBundle: only the
/// certificates do, encoded again).
pub fn parse_ca_certs(text: &[u8]) -> Result<Vec<CaCert>, Refusal> {
    let blocks = pem_blocks(text).map_err(Refusal::NotPem)?;
    if blocks.is_empty() {
        return Err(Refusal::NoBlock);
    }
    // A private key anywhere is named first, whatever else is wrong.
    if let Some((i, b)) = blocks
        .iter()
        .enumerate()
        .find(|(_, b)| b.label.contains("PRIVATE KEY"))
    {
        return Err(Refusal::PrivateKey {
            block: i + 1,
            label: b.label.clone(),
        });
    }
    let mut out = Vec::new();
    for (i, b) in blocks.into_iter().enumerate() {
        let block = i + 1;
        if b.label != "CERTIFICATE" {
            return Err(Refusal::NotCertificate {
                block,
                label: b.label,
            });
        }
        let (rest, cert) =
            x509_parser::parse_x509_certificate(&b.contents).map_err(|e| Refusal::NotX509 {
                block,
                reason: e.to_string(),
            })?;
        if !rest.is_empty() {
            return Err(Refusal::NotX509 {
                block,
                reason: format!("{} bytes after the certificate", rest.len()),
            });
        }
        let subject = cert.subject().to_string();
        let is_ca = cert
            .basic_constraints()
            .map_err(|e| Refusal::NotX509 {
                block,
                reason: format!("basicConstraints: {e}"),
            })?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(Refusal::NotCa { block, subject });
        }
        out.push(CaCert {
            der: b.contents,
            subject,
        });
    }
    Ok(out)
}

/// The decision: every certificate to keep trusting must be one the live
/// caBundle trusts now.
pub fn keep_trusted(certs: &[CaCert], live: &LiveBundle) -> Result<(), Refusal> {
    match certs.iter().position(|c| !live.contains(&c.der)) {
        Some(i) => Err(Refusal::NotLive {
            block: i + 1,
            subject: certs[i].subject.clone(),
        }),
        None => Ok(()),
    }
}

/// [`parse_ca_certs`] then [`keep_trusted`]: the certificates an
/// `--also-trust` file may add to the first patch's caBundle.
pub fn vet_also_trust(text: &[u8], live: &LiveBundle) -> Result<Vec<CaCert>, Refusal> {
    let certs = parse_ca_certs(text)?;
    keep_trusted(&certs, live)?;
    Ok(certs)
}

/// The certificates the live configuration's lines trust, read as the API
/// server reads a caBundle (`CertPool.AppendCertsFromPEM`: CERTIFICATE blocks,
/// the rest skipped). A configuration whose lines all lack a caBundle is not
/// the live one: the shipped file, for instance.
pub fn live_ca_bundle(config_yaml: &str) -> Result<LiveBundle, LiveError> {
    let config: MutatingWebhookConfiguration =
        serde_yaml::from_str(config_yaml).map_err(|e| LiveError::NotConfig(e.to_string()))?;
    let mut ders: Vec<Vec<u8>> = Vec::new();
    for hook in config.webhooks.unwrap_or_default() {
        let Some(bundle) = hook.client_config.ca_bundle else {
            continue;
        };
        for b in Pem::iter_from_buffer(&bundle.0).map_while(Result::ok) {
            if b.label == "CERTIFICATE" && !ders.contains(&b.contents) {
                ders.push(b.contents);
            }
        }
    }
    if ders.is_empty() {
        return Err(LiveError::NoBundle);
    }
    Ok(LiveBundle { ders })
}

/// Every PEM block of `text`, refusing a truncated or undecodable one and a
/// `-----BEGIN` the parser could not frame (one not at the start of a line
/// would otherwise be skipped unseen).
fn pem_blocks(text: &[u8]) -> Result<Vec<Pem>, String> {
    let blocks = Pem::iter_from_buffer(text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let begins = text
        .windows(b"-----BEGIN ".len())
        .filter(|w| *w == b"-----BEGIN ")
        .count();
    if begins != blocks.len() {
        return Err(format!(
            "{begins} BEGIN lines but {} well-formed blocks",
            blocks.len()
        ));
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;
    use crate::ca::{Ca, ServingRequest};
    use crate::webhook_config::inject_ca_bundle;

    fn request() -> ServingRequest {
        ServingRequest {
            service: "nodegate-webhook".into(),
            also_services: vec![],
            namespace: "nodegate".into(),
            ips: vec![],
            days: 1,
        }
    }

    const SHIPPED: &str =
        include_str!("../../manifests/base/webhook/mutatingwebhookconfiguration.yaml");

    /// The live configuration after `kubectl patch` with `bundle`.
    fn live_with(bundle: &str) -> String {
        inject_ca_bundle(SHIPPED, bundle).unwrap()
    }

    #[test]
    fn the_old_ca_in_the_live_bundle_is_kept() {
        let old = Ca::generate(1).unwrap();
        let live = live_ca_bundle(&live_with(old.cert_pem())).unwrap();
        assert_eq!(live.len(), 1);
        let kept = vet_also_trust(old.cert_pem().as_bytes(), &live).unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].subject, "CN=nodegate-webhook-ca");
        // Encoded again, it is the same PEM ca.crt holds.
        assert_eq!(kept[0].pem(), old.cert_pem());
    }

    /// Mid-rotation the live bundle holds two CAs; either, or both, may be
    /// kept, and text around the blocks (openssl's `subject=` lines) is
    /// allowed but never copied.
    #[test]
    fn any_ca_of_a_two_ca_bundle_is_kept_and_only_certificates_are_copied() {
        let (a, b) = (Ca::generate(1).unwrap(), Ca::generate(1).unwrap());
        let both = format!("{}{}", a.cert_pem(), b.cert_pem());
        let live = live_ca_bundle(&live_with(&both)).unwrap();
        assert_eq!(live.len(), 2);
        let file = format!("subject=CN=nodegate-webhook-ca\n{}\n# note\n", b.cert_pem());
        let kept = vet_also_trust(file.as_bytes(), &live).unwrap();
        assert_eq!(kept[0].pem(), b.cert_pem());
        assert_eq!(vet_also_trust(both.as_bytes(), &live).unwrap().len(), 2);
    }

    #[test]
    fn a_private_key_anywhere_is_refused_by_name() {
        let ca = Ca::generate(1).unwrap();
        let leaf = ca.issue(&request()).unwrap();
        let live = live_ca_bundle(&live_with(ca.cert_pem())).unwrap();
        for file in [
            format!("{}{}", ca.cert_pem(), leaf.key_pem),
            format!("{}{}", leaf.key_pem, ca.cert_pem()),
            "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n".to_owned(),
        ] {
            let err = vet_also_trust(file.as_bytes(), &live).unwrap_err();
            assert!(matches!(err, Refusal::PrivateKey { .. }), "{err}");
            assert!(err.to_string().contains("must never be passed around"));
        }
    }

    #[test]
    fn other_blocks_garbage_and_leaves_are_refused() {
        let ca = Ca::generate(1).unwrap();
        let leaf = ca.issue(&request()).unwrap();
        let live = live_ca_bundle(&live_with(ca.cert_pem())).unwrap();
        let not_der = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        let truncated = &ca.cert_pem()[..ca.cert_pem().len() - 30];
        let indented = format!("{}  -----BEGIN PRIVATE KEY-----\n", ca.cert_pem());
        let public = "-----BEGIN PUBLIC KEY-----\naGVsbG8=\n-----END PUBLIC KEY-----\n";
        type Want = fn(&Refusal) -> bool;
        let cases: [(&str, Want); 7] = [
            ("not a pem", |e| *e == Refusal::NoBlock),
            ("", |e| *e == Refusal::NoBlock),
            (not_der, |e| matches!(e, Refusal::NotX509 { block: 1, .. })),
            (truncated, |e| matches!(e, Refusal::NotPem(_))),
            (indented.as_str(), |e| matches!(e, Refusal::NotPem(_))),
            (
                public,
                |e| matches!(e, Refusal::NotCertificate { block: 1, label } if label == "PUBLIC KEY"),
            ),
            (leaf.cert_pem.as_str(), |e| {
                matches!(e, Refusal::NotCa { block: 1, .. })
            }),
        ];
        for (file, want) in cases {
            let err = vet_also_trust(file.as_bytes(), &live).unwrap_err();
            assert!(want(&err), "{file:?}: {err}");
        }
        // A leaf is refused even when the live bundle (wrongly) holds it.
        let live = live_ca_bundle(&live_with(&leaf.cert_pem)).unwrap();
        let err = parse_ca_certs(leaf.cert_pem.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("not a CA certificate"), "{err}");
        assert!(vet_also_trust(leaf.cert_pem.as_bytes(), &live).is_err());
    }

    #[test]
    fn a_ca_the_live_bundle_does_not_hold_is_refused() {
        let (live_ca, other) = (Ca::generate(1).unwrap(), Ca::generate(1).unwrap());
        let live = live_ca_bundle(&live_with(live_ca.cert_pem())).unwrap();
        let file = format!("{}{}", live_ca.cert_pem(), other.cert_pem());
        let err = vet_also_trust(file.as_bytes(), &live).unwrap_err();
        assert!(matches!(err, Refusal::NotLive { block: 2, .. }), "{err}");
        assert!(
            err.to_string()
                .contains("not in the live caBundle: keeping it trusted would not keep the running replicas reachable"),
            "{err}"
        );
        // The decision alone, from parsed inputs.
        let parsed = parse_ca_certs(other.cert_pem().as_bytes()).unwrap();
        assert!(keep_trusted(&parsed, &live).is_err());
        assert_eq!(
            keep_trusted(&parsed, &LiveBundle::default()),
            Err(Refusal::NotLive {
                block: 1,
                subject: "CN=nodegate-webhook-ca".into()
            })
        );
        assert_eq!(keep_trusted(&[], &live), Ok(()));
    }

    #[test]
    fn a_configuration_without_a_ca_bundle_is_not_the_live_one() {
        let err = live_ca_bundle(SHIPPED).unwrap_err();
        assert_eq!(err, LiveError::NoBundle);
        assert!(err.to_string().contains(LIVE_CONFIG_COMMAND), "{err}");
        // An empty caBundle, or one without a certificate, is no better.
        assert_eq!(
            live_ca_bundle(&live_with("")).unwrap_err(),
            LiveError::NoBundle
        );
        assert_eq!(
            live_ca_bundle(&live_with("junk")).unwrap_err(),
            LiveError::NoBundle
        );
        let err = live_ca_bundle("apiVersion: v1\nkind: ConfigMap\n").unwrap_err();
        assert!(matches!(err, LiveError::NotConfig(_)), "{err}");
    }

    /// What `kubectl get -o yaml` prints, server fields and all, is read;
    /// a line without a caBundle beside one with it (a line just added by
    /// an apply) does not hide the others.
    #[test]
    fn reads_the_live_configuration_as_kubectl_prints_it() {
        let ca = Ca::generate(1).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
        let live = format!(
            "apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {{\"apiVersion\":\"admissionregistration.k8s.io/v1\"}}
  creationTimestamp: \"2025-01-01T00:00:00Z\"
  generation: 3
  managedFields:
  - apiVersion: admissionregistration.k8s.io/v1
    fieldsType: FieldsV1
    fieldsV1:
      f:webhooks: {{}}
    manager: kubectl-patch
    operation: Update
    time: \"2025-01-01T00:00:00Z\"
  name: nodegate
  resourceVersion: \"1234\"
  uid: 6c1d6a4e-0000-4000-8000-000000000000
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    caBundle: {b64}
    service: {{name: nodegate-webhook, namespace: nodegate, path: /mutate/abc, port: 443}}
  name: nodes.nodegate.dev
  sideEffects: NoneOnDryRun
- admissionReviewVersions: [v1]
  clientConfig:
    service: {{name: nodegate-webhook-0, namespace: nodegate, port: 443}}
  name: replica-0.nodes.nodegate.dev
  sideEffects: NoneOnDryRun
"
        );
        let bundle = live_ca_bundle(&live).unwrap();
        assert_eq!(bundle.len(), 1);
        vet_also_trust(ca.cert_pem().as_bytes(), &bundle).unwrap();
    }
}
