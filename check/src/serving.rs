//! The caBundle against the serving certificate, verified as the API server
//! does for a `service` reference: chain to the caBundle, SAN
//! `<service>.<namespace>.svc` (no CN fallback), for every line of admission.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};

use crate::lines::lines;
use crate::webhook_config::Hook;
use crate::{Args, Report, Status};

fn roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("caBundle is not PEM: {e}"))?;
        roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("caBundle holds no certificate".into());
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Verifies a PEM chain (leaf first) for `server_name` against `ca_pem`.
pub fn verify_chain(ca_pem: &[u8], chain_pem: &[u8], server_name: &str) -> Result<(), String> {
    let verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider())
            .build()
            .map_err(|e| e.to_string())?;
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("serving certificate is not PEM: {e}"))?;
    let (leaf, rest) = chain.split_first().ok_or("no certificate in tls.crt")?;
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    verifier
        .verify_server_cert(leaf, rest, &name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A TLS handshake with `addr` that trusts only the caBundle.
pub async fn verify_live(ca_pem: &[u8], addr: &str, server_name: &str) -> Result<(), String> {
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake with {addr}: {e}"))
    };
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(format!("TLS handshake with {addr} timed out")),
    }
}

/// True when each line's caBundle verifies the serving certificate for the
/// name the API server dials for that line (one certificate serves every
/// line's Service).
pub async fn check(client: &Client, args: &Args, hook: &Hook, report: &mut Report) -> bool {
    const CHECK: &str = "serving certificate";
    // (line, `<svc>.<ns>.svc`, caBundle)
    let targets: Vec<(String, String, Vec<u8>)> = lines(hook)
        .into_iter()
        .filter_map(|l| Some((l.name, l.service?.host(), l.ca_bundle)))
        .collect();
    let Some((ns, _, _)) = &hook.service else {
        report.add(
            CHECK,
            Status::Skip,
            "the webhook is called by url, not service: its certificate is not in the cluster",
        );
        return true;
    };
    let names: Vec<&str> = targets.iter().map(|t| t.1.as_str()).collect();
    let names = names.join(", ");
    let mut ok = true;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    match secrets.get_opt(&args.tls_secret).await {
        Ok(Some(s)) => {
            let crt = s.data.as_ref().and_then(|d| d.get("tls.crt")).map(|b| b.0.clone());
            match crt {
                Some(crt) => {
                    let failed: Vec<String> = targets
                        .iter()
                        .filter_map(|(line, host, ca)| {
                            let e = verify_chain(ca, &crt, host).err()?;
                            Some(format!("{line}: caBundle does not verify Secret {ns}/{} for {host}: {e}", args.tls_secret))
                        })
                        .collect();
                    if failed.is_empty() {
                        report.add(
                            CHECK,
                            Status::Pass,
                            format!("caBundle verifies Secret {ns}/{} for {names}", args.tls_secret),
                        );
                    } else {
                        ok = false;
                        report.add(
                            CHECK,
                            Status::Fail,
                            format!(
                                "{} — the API server will fail every call of those lines (and skip them under failurePolicy Ignore); re-issue the certificate for every line's Service (nodegate-certs --webhook-config) and re-inject the caBundle",
                                failed.join("; ")
                            ),
                        );
                    }
                }
                None => {
                    ok = false;
                    report.add(CHECK, Status::Fail, format!("Secret {ns}/{} has no tls.crt", args.tls_secret));
                }
            }
        }
        Ok(None) => report.add(
            CHECK,
            Status::Skip,
            format!("no Secret {ns}/{} (certificates managed elsewhere?); the canary below still proves the path", args.tls_secret),
        ),
        Err(e) => report.add(CHECK, Status::Skip, format!("cannot read Secret {ns}/{}: {e}", args.tls_secret)),
    }
    if let Some(addr) = &args.webhook_address {
        let mut failed = Vec::new();
        for (line, host, ca) in &targets {
            if let Err(e) = verify_live(ca, addr, host).await {
                failed.push(format!(
                    "{line}: {e} (trusting only its caBundle, name {host})"
                ));
            }
        }
        if failed.is_empty() {
            report.add(
                "served certificate",
                Status::Pass,
                format!("{addr} presents a certificate the caBundle verifies for {names}"),
            );
        } else {
            ok = false;
            report.add("served certificate", Status::Fail, failed.join("; "));
        }
    }
    ok
}
