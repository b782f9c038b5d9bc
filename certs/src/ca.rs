//! The CA and the serving certificates it issues, with their validity.

use std::net::IpAddr;

use nodegate_shared::taint::is_dns1123_label;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
    SanType,
};
use time::{Duration, OffsetDateTime};

use crate::error::CertError;

/// Validity is capped so that `now + days` can never overflow the date types.
const MAX_DAYS: u32 = 36_500;

/// A self-signed CA that can issue serving certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
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
        let certified = CertifiedIssuer::self_signed(params, key)?;
        let cert_pem = certified.pem();
        let key_pem = certified.key().serialize_pem();
        Ca::from_pem(&cert_pem, &key_pem)
    }

    /// A CA kept from an earlier run (the in-cluster controller's Secret):
    /// its certificate and its key, both PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, CertError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(Ca {
            issuer,
            cert_pem: cert_pem.to_owned(),
        })
    }

    /// The CA's private key, PEM: only for the Secret that keeps it.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
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

/// A serving request for the webhook's Service and loopback, as the tests
/// of every module issue it.
#[cfg(test)]
pub(crate) fn test_request() -> ServingRequest {
    ServingRequest {
        service: "nodegate-webhook".into(),
        also_services: vec![],
        namespace: "nodegate".into(),
        ips: vec![
            std::net::IpAddr::from([127, 0, 0, 1]),
            std::net::IpAddr::from([0, 0, 0, 0, 0, 0, 0, 1u16]),
        ],
        days: 30,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

    use super::test_request as request;
    use super::*;

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
    fn a_kept_ca_issues_leaves_its_certificate_verifies() {
        let ca = Ca::generate(30).unwrap();
        let kept = Ca::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        assert_eq!(kept.cert_pem(), ca.cert_pem());
        let leaf = kept.issue(&request()).unwrap();
        verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            "nodegate-webhook.nodegate.svc",
        )
        .unwrap();
        assert!(Ca::from_pem(ca.cert_pem(), "not a key").is_err());
        assert!(Ca::from_pem("not a cert", &ca.key_pem()).is_err());
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
}
