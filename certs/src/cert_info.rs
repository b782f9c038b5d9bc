//! What the in-cluster controller needs to know of a certificate it finds:
//! its validity, the key it names, and its DNS names. Pure parsing.

use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::pem::Pem;

/// One parsed certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub der: Vec<u8>,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    pub is_ca: bool,
    /// SubjectKeyIdentifier (a CA's), and AuthorityKeyIdentifier (the key
    /// of the CA that signed a leaf): a leaf belongs to the CA whose key it
    /// names.
    pub subject_key_id: Option<Vec<u8>>,
    pub authority_key_id: Option<Vec<u8>>,
    pub dns_names: Vec<String>,
}

impl CertInfo {
    /// The share of its lifetime left at `now`, 0 to 1.
    pub fn life_left(&self, now: i64) -> f64 {
        let total = (self.not_after - self.not_before).max(1) as f64;
        ((self.not_after - now) as f64 / total).clamp(0.0, 1.0)
    }

    /// Whether `leaf` names this CA's key as its signer.
    pub fn signed(&self, leaf: &CertInfo) -> bool {
        self.subject_key_id.is_some() && self.subject_key_id == leaf.authority_key_id
    }

    /// PEM with LF line endings.
    pub fn pem(&self) -> String {
        pem::encode_config(
            &pem::Pem::new("CERTIFICATE", self.der.clone()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    }
}

/// Every CERTIFICATE block of a PEM text, in order; `Err` names the first
/// block that is not a parsable certificate.
pub fn parse_pem_certs(text: &[u8]) -> Result<Vec<CertInfo>, String> {
    let mut out = Vec::new();
    for (i, block) in Pem::iter_from_buffer(text).enumerate() {
        let block = block.map_err(|e| format!("block {}: not PEM ({e})", i + 1))?;
        if block.label != "CERTIFICATE" {
            return Err(format!("block {} is a {}", i + 1, block.label));
        }
        out.push(parse_der(&block.contents).map_err(|e| format!("block {}: {e}", i + 1))?);
    }
    Ok(out)
}

/// One DER certificate.
pub fn parse_der(der: &[u8]) -> Result<CertInfo, String> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("not X.509: {e}"))?;
    let mut info = CertInfo {
        der: der.to_vec(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        is_ca: cert.is_ca(),
        subject_key_id: None,
        authority_key_id: None,
        dns_names: Vec::new(),
    };
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => info.subject_key_id = Some(k.0.to_vec()),
            ParsedExtension::AuthorityKeyIdentifier(a) => {
                info.authority_key_id = a.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    if let GeneralName::DNSName(d) = name {
                        info.dns_names.push((*d).to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ca;
    use crate::ca::test_request;

    #[test]
    fn a_leaf_names_the_ca_that_signed_it_and_its_service_names() {
        let ca = Ca::generate(30).unwrap();
        let other = Ca::generate(30).unwrap();
        let leaf = ca.issue(&test_request()).unwrap();
        let ca_info = &parse_pem_certs(ca.cert_pem().as_bytes()).unwrap()[0];
        let other_info = &parse_pem_certs(other.cert_pem().as_bytes()).unwrap()[0];
        let leaf_info = &parse_pem_certs(leaf.cert_pem.as_bytes()).unwrap()[0];
        assert!(ca_info.is_ca && !leaf_info.is_ca);
        assert!(ca_info.signed(leaf_info));
        assert!(!other_info.signed(leaf_info));
        assert!(
            leaf_info
                .dns_names
                .contains(&"nodegate-webhook.nodegate.svc".to_string())
        );
        let days = (leaf_info.not_after - leaf_info.not_before) / 86_400;
        assert_eq!(days, 30, "30 days and the 5 minutes of backdating");
        assert!(leaf_info.life_left(leaf_info.not_before) > 0.99);
        assert_eq!(leaf_info.life_left(leaf_info.not_after + 1), 0.0);
        assert_eq!(ca_info.pem(), ca.cert_pem().replace("\r\n", "\n"));
    }

    #[test]
    fn a_key_or_garbage_is_no_certificate() {
        let ca = Ca::generate(1).unwrap();
        assert!(parse_pem_certs(ca.key_pem().as_bytes()).is_err());
        assert!(
            parse_pem_certs(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
                .is_err()
        );
        assert_eq!(parse_pem_certs(b"").unwrap(), vec![]);
    }
}
