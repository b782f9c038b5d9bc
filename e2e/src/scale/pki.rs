//! The scale cluster's certificates, all from one in-memory CA: the API
//! server's serving certificate, the control plane's client certificates and
//! one client certificate per simulated kubelet (`system:node:<name>` in
//! `system:nodes`), issued on demand so 1,000 nodes cost no openssl runs.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use time::{Duration, OffsetDateTime};

/// A PEM certificate and its PEM key.
#[derive(Clone)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair").finish_non_exhaustive()
    }
}

pub struct Pki {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

fn validity(params: &mut CertificateParams) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(2);
}

impl Pki {
    pub fn new() -> anyhow::Result<Self> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "nodegate-scale-ca");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        Ok(Self {
            issuer: CertifiedIssuer::self_signed(params, key)?,
        })
    }

    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn ca_der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// A client certificate for `cn` in the groups `orgs`.
    pub fn client(&self, cn: &str, orgs: &[&str]) -> anyhow::Result<Pair> {
        let mut dn = DistinguishedName::new();
        for o in orgs {
            dn.push(DnType::OrganizationName, *o);
        }
        dn.push(DnType::CommonName, cn);
        self.sign(
            CertificateParams::default(),
            dn,
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// A serving certificate for these names and addresses.
    pub fn serving(&self, dns: &[String], ips: &[IpAddr]) -> anyhow::Result<Pair> {
        let mut params = CertificateParams::new(dns.to_vec())?;
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "nodegate-scale-server");
        self.sign(params, dn, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A fresh P-256 key and `params` as a leaf for `usage`, signed by this CA.
    fn sign(
        &self,
        mut params: CertificateParams,
        dn: DistinguishedName,
        usage: ExtendedKeyUsagePurpose,
    ) -> anyhow::Result<Pair> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A fresh ECDSA P-256 key in PKCS#8 PEM: the service-account signing key.
pub fn signing_key_pem() -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}
