//! TLS for both directions: the emulator's own serving certificate, and the
//! client side of webhook calls (verified against a `caBundle`).
//!
//! No upstream counterpart: the emulator's certificates (`rcgen`) and rustls
//! configurations.

use std::sync::Arc;

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

/// Installs ring as the process-wide rustls provider (idempotent).
pub fn install_crypto_provider() {
    // Err means one is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A throwaway CA and a serving certificate for 127.0.0.1/localhost.
#[derive(Debug, Clone)]
pub struct ServingMaterial {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn generate_serving() -> anyhow::Result<ServingMaterial> {
    let ca_key = KeyPair::generate().context("generating CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "nodegate-emulator-ca");
    let ca_cert = ca_params.self_signed(&ca_key).context("self-signing CA")?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().context("generating serving key")?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    params
        .distinguished_name
        .push(DnType::CommonName, "nodegate-emulator");
    let cert = params
        .signed_by(&key, &issuer)
        .context("signing serving cert")?;
    Ok(ServingMaterial {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

pub fn server_config(m: &ServingMaterial) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    install_crypto_provider();
    let certs = CertificateDer::pem_slice_iter(m.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parsing serving cert")?;
    let key = PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes()).context("parsing serving key")?;
    let mut cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("building TLS server config")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A client config that trusts only the PEM bundle (the webhook's `caBundle`)
/// and speaks HTTP/1.1, as the API server does to webhooks. rustls checks the
/// server name against SANs only — no CN fallback, as Go's crypto/tls.
pub fn client_config_for_bundle(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
        n += 1;
    }
    if n == 0 {
        return Err("caBundle holds no certificate".to_string());
    }
    let mut cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
