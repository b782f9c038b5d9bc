//! Helpers shared by the webhook's integration tests: a certificate directory
//! laid out like a mounted Kubernetes Secret, and an HTTPS client that checks
//! the server the way the API server does (only the webhook CA, SANs only).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nodegate_certs::{Ca, ServingCert, ServingRequest, write_files};
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The name the API server uses for a service webhook.
pub const SERVER_NAME: &str = "nodegate-webhook.nodegate.svc";

pub fn serving_request() -> ServingRequest {
    ServingRequest {
        also_services: vec![],
        service: "nodegate-webhook".into(),
        namespace: "nodegate".into(),
        ips: vec!["127.0.0.1".parse().unwrap()],
        days: 1,
    }
}

/// A directory updated like kubelet's AtomicWriter updates a Secret volume:
/// files live in `..<n>/`, `..data` points at the current one, and
/// `tls.crt`/`tls.key` are symlinks through `..data`. An update swaps `..data`.
pub struct SecretDir {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
    generation: usize,
}

impl SecretDir {
    pub fn new(first: &ServingCert, ca: Ca) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Self {
            dir,
            ca,
            generation: 0,
        };
        s.install(first);
        for f in ["ca.crt", "tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), s.dir.path().join(f)).unwrap();
        }
        s
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    /// Atomically replaces cert and key (both at once, as the kubelet does).
    pub fn install(&mut self, pair: &ServingCert) {
        self.generation += 1;
        let data = format!("..{}", self.generation);
        write_files(self.dir.path().join(&data), self.ca.cert_pem(), pair).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    /// Installs arbitrary bytes as the pair (for bad rotations).
    pub fn install_raw(&mut self, cert_pem: &str, key_pem: &str) {
        self.install(&ServingCert {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
        });
    }
}

/// A client config trusting only `ca_pem`, offering `alpn`.
pub fn client_config(ca_pem: &str, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let mut cfg =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // Full handshakes only: a resumed session reports the certificate of the
    // session it resumes, which would hide a rotation.
    cfg.resumption = rustls::client::Resumption::disabled();
    Arc::new(cfg)
}

/// DER of a PEM certificate, to compare with what a server presented.
pub fn der(cert_pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Connects and verifies the server as `SERVER_NAME`; returns the stream and
/// the leaf the server presented.
pub async fn connect(
    addr: SocketAddr,
    cfg: &Arc<ClientConfig>,
) -> std::io::Result<(TlsStream<TcpStream>, Vec<u8>)> {
    let tcp = TcpStream::connect(addr).await?;
    let tls = TlsConnector::from(cfg.clone())
        .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    Ok((tls, leaf))
}

/// An HTTP/1.1 keep-alive connection to the webhook.
pub struct H1 {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    pub leaf: Vec<u8>,
}

impl H1 {
    pub async fn open(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> anyhow::Result<Self> {
        let (tls, leaf) = connect(addr, cfg).await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok(Self { send, leaf })
    }

    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> anyhow::Result<(StatusCode, Bytes)> {
        self.send.ready().await?;
        let req = Request::post(path)
            .header("host", SERVER_NAME)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let resp = self.send.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// An HTTP/2 connection to the webhook.
pub async fn post_h2(
    addr: SocketAddr,
    cfg: &Arc<ClientConfig>,
    body: Vec<u8>,
) -> anyhow::Result<(StatusCode, Bytes, Option<Vec<u8>>)> {
    let (tls, _) = connect(addr, cfg).await?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = Request::post(format!("https://{SERVER_NAME}/mutate"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let resp = send.send_request(req).await?;
    let status = resp.status();
    Ok((status, resp.into_body().collect().await?.to_bytes(), alpn))
}

/// A plain HTTP/1.1 GET (admin port): status and body.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// Polls `f` until it returns true, failing after `secs` seconds.
pub async fn eventually<F, Fut>(what: &str, secs: u64, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if f().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
