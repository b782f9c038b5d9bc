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
use crate::read::Read;
use crate::report::{Report, Status};
use crate::webhook_config::Hook;

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

/// A line the API server calls through a Service: its name, the host it
/// verifies the certificate for (`<svc>.<ns>.svc`), and its caBundle.
#[derive(Debug, Clone)]
pub struct Target {
    pub line: String,
    pub host: String,
    pub ca_bundle: Vec<u8>,
}

fn targets(hook: &Hook) -> Vec<Target> {
    lines(hook)
        .into_iter()
        .filter_map(|l| {
            Some(Target {
                host: l.service?.host(),
                line: l.name,
                ca_bundle: l.ca_bundle,
            })
        })
        .collect()
}

fn names(targets: &[Target]) -> String {
    let names: Vec<&str> = targets.iter().map(|t| t.host.as_str()).collect();
    names.join(", ")
}

/// The `serving certificate` line for Secret `ns/secret` as read (its
/// `tls.crt`, `None` when it has none), and whether every line verifies it.
pub fn secret_verdict(
    targets: &[Target],
    ns: &str,
    secret: &str,
    read: &Read<Option<Vec<u8>>>,
) -> (Status, String, bool) {
    let crt = match read {
        Read::Found(Some(crt)) => crt,
        Read::Found(None) => {
            return (
                Status::Fail,
                format!("Secret {ns}/{secret} has no tls.crt"),
                false,
            );
        }
        Read::Missing => {
            return (
                Status::Skip,
                format!(
                    "no Secret {ns}/{secret} (certificates managed elsewhere?); the canary below still proves the path"
                ),
                true,
            );
        }
        Read::Unreadable(e) => {
            return (
                Status::Skip,
                format!("cannot read Secret {ns}/{secret}: {e}"),
                true,
            );
        }
    };
    let failed: Vec<String> = targets
        .iter()
        .filter_map(|t| {
            let e = verify_chain(&t.ca_bundle, crt, &t.host).err()?;
            Some(format!(
                "{}: caBundle does not verify Secret {ns}/{secret} for {}: {e}",
                t.line, t.host
            ))
        })
        .collect();
    if failed.is_empty() {
        (
            Status::Pass,
            format!(
                "caBundle verifies Secret {ns}/{secret} for {}",
                names(targets)
            ),
            true,
        )
    } else {
        (
            Status::Fail,
            format!(
                "{} — the API server will fail every call of those lines (and skip them under failurePolicy Ignore); re-issue the certificate for every line's Service (nodegate-certs --webhook-config) and re-inject the caBundle",
                failed.join("; ")
            ),
            false,
        )
    }
}

/// The `served certificate` line for `addr`, from each line's handshake
/// with it, and whether every one verified.
pub fn served_verdict(
    targets: &[Target],
    addr: &str,
    handshakes: &[Result<(), String>],
) -> (Status, String, bool) {
    let failed: Vec<String> = targets
        .iter()
        .zip(handshakes)
        .filter_map(|(t, r)| {
            let e = r.as_ref().err()?;
            Some(format!(
                "{}: {e} (trusting only its caBundle, name {})",
                t.line, t.host
            ))
        })
        .collect();
    if failed.is_empty() {
        (
            Status::Pass,
            format!(
                "{addr} presents a certificate the caBundle verifies for {}",
                names(targets)
            ),
            true,
        )
    } else {
        (Status::Fail, failed.join("; "), false)
    }
}

/// The Secret's `tls.crt`.
pub async fn read_secret(client: &Client, ns: &str, name: &str) -> Read<Option<Vec<u8>>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    Read::of(secrets.get_opt(name).await).map(|s| {
        s.data
            .as_ref()
            .and_then(|d| d.get("tls.crt"))
            .map(|b| b.0.clone())
    })
}

/// True when each line's caBundle verifies the serving certificate (Secret
/// `tls_secret`) for the name the API server dials for that line (one
/// certificate serves every line's Service), and what `address` presents
/// when given.
pub async fn check(
    client: &Client,
    tls_secret: &str,
    address: Option<&str>,
    hook: &Hook,
    report: &mut Report,
) -> bool {
    const CHECK: &str = "serving certificate";
    let Some((ns, _, _)) = &hook.service else {
        report.add(
            CHECK,
            Status::Skip,
            "the webhook is called by url, not service: its certificate is not in the cluster",
        );
        return true;
    };
    let targets = targets(hook);
    let read = read_secret(client, ns, tls_secret).await;
    let (status, detail, mut ok) = secret_verdict(&targets, ns, tls_secret, &read);
    report.add(CHECK, status, detail);
    if let Some(addr) = address {
        let mut handshakes = Vec::new();
        for t in &targets {
            handshakes.push(verify_live(&t.ca_bundle, addr, &t.host).await);
        }
        let (status, detail, served) = served_verdict(&targets, addr, &handshakes);
        report.add("served certificate", status, detail);
        ok &= served;
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_certs::{Ca, ServingRequest};

    fn issued(ca: &Ca) -> Vec<u8> {
        let cert = ca
            .issue(&ServingRequest {
                service: "nodegate-webhook".into(),
                namespace: "nodegate".into(),
                also_services: vec![("nodegate-webhook-0".into(), "nodegate".into())],
                ips: Vec::new(),
                days: 30,
            })
            .unwrap();
        cert.cert_pem.into_bytes()
    }

    fn target(line: &str, host: &str, ca: &Ca) -> Target {
        Target {
            line: line.into(),
            host: host.into(),
            ca_bundle: ca.cert_pem().as_bytes().to_vec(),
        }
    }

    #[test]
    fn secret_verdicts() {
        let (ca, other) = (Ca::generate(1).unwrap(), Ca::generate(1).unwrap());
        let crt = issued(&ca);
        let lines = [
            target("first", "nodegate-webhook.nodegate.svc", &ca),
            target("r0", "nodegate-webhook-0.nodegate.svc", &ca),
        ];
        let wrong = [
            target("r1", "nodegate-webhook-1.nodegate.svc", &ca),
            target("r0", "nodegate-webhook-0.nodegate.svc", &other),
        ];
        let rows = [
            (
                &lines[..],
                Read::Found(Some(crt.clone())),
                Status::Pass,
                true,
                "caBundle verifies Secret nodegate/tls for nodegate-webhook.nodegate.svc, nodegate-webhook-0.nodegate.svc",
            ),
            (
                &wrong[..],
                Read::Found(Some(crt.clone())),
                Status::Fail,
                false,
                "r1: caBundle does not verify Secret nodegate/tls for nodegate-webhook-1.nodegate.svc: ",
            ),
            (
                &wrong[..],
                Read::Found(Some(crt)),
                Status::Fail,
                false,
                "; r0: caBundle does not verify Secret nodegate/tls for nodegate-webhook-0.nodegate.svc: ",
            ),
            (
                &lines[..],
                Read::Found(None),
                Status::Fail,
                false,
                "Secret nodegate/tls has no tls.crt",
            ),
            (
                &lines[..],
                Read::Missing,
                Status::Skip,
                true,
                "no Secret nodegate/tls (certificates managed elsewhere?); the canary below still proves the path",
            ),
            (
                &lines[..],
                Read::Unreadable("403".into()),
                Status::Skip,
                true,
                "cannot read Secret nodegate/tls: 403",
            ),
        ];
        for (targets, read, status, ok, part) in rows {
            let (got, detail, verified) = secret_verdict(targets, "nodegate", "tls", &read);
            assert_eq!((got, verified), (status, ok), "{detail}");
            assert!(detail.contains(part), "{detail:?} lacks {part:?}");
        }
    }

    #[test]
    fn served_verdicts() {
        let ca = Ca::generate(1).unwrap();
        let lines = [
            target("first", "nodegate-webhook.nodegate.svc", &ca),
            target("r0", "nodegate-webhook-0.nodegate.svc", &ca),
        ];
        let (s, d, ok) = served_verdict(&lines, "127.0.0.1:9443", &[Ok(()), Ok(())]);
        assert_eq!((s, ok), (Status::Pass, true));
        assert_eq!(
            d,
            "127.0.0.1:9443 presents a certificate the caBundle verifies for nodegate-webhook.nodegate.svc, nodegate-webhook-0.nodegate.svc"
        );
        let (s, d, ok) = served_verdict(
            &lines,
            "a:1",
            &[Ok(()), Err("TLS handshake with a:1: bad".into())],
        );
        assert_eq!((s, ok), (Status::Fail, false));
        assert_eq!(
            d,
            "r0: TLS handshake with a:1: bad (trusting only its caBundle, name nodegate-webhook-0.nodegate.svc)"
        );
    }
}
