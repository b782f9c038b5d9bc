//! The API server's side of a webhook call: TLS verified against the CA with
//! the service name, then HTTP/1.1 keep-alive (or h2) POSTs to `/mutate`.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The name the API server checks for a `service` webhook reference.
pub const SERVER_NAME: &str = "nodegate-webhook.nodegate.svc";
/// Path and query the API server calls (`?timeout=` is always set).
pub const PATH: &str = "/mutate?timeout=10s";

/// HTTP version on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    /// HTTP/1.1, what kube-apiserver uses for service webhooks.
    H1,
    /// HTTP/2 (ALPN h2).
    H2,
}

/// Where and how to connect.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub proto: Proto,
    tls: TlsConnector,
    /// Same trust, but every handshake is a full one (no session resumption),
    /// so the certificate the server serves *now* is seen.
    fresh: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("proto", &self.proto)
            .finish()
    }
}

impl Target {
    /// A target whose certificate must chain to `ca_pem` and name [`SERVER_NAME`].
    pub fn new(addr: SocketAddr, ca_pem: &str, proto: Proto) -> anyhow::Result<Target> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots
                .add(cert.context("parsing the CA PEM")?)
                .context("adding the CA to the trust roots")?;
        }
        if roots.is_empty() {
            bail!("the CA file holds no certificate");
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = match proto {
            Proto::H1 => vec![b"http/1.1".to_vec()],
            Proto::H2 => vec![b"h2".to_vec()],
        };
        let mut fresh = config.clone();
        fresh.resumption = rustls::client::Resumption::disabled();
        Ok(Target {
            addr,
            proto,
            tls: TlsConnector::from(Arc::new(config)),
            fresh: TlsConnector::from(Arc::new(fresh)),
            name: ServerName::try_from(SERVER_NAME).context("server name")?,
        })
    }

    async fn handshake(
        &self,
        connector: &TlsConnector,
    ) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        tcp.set_nodelay(true)?;
        connector
            .connect(self.name.clone(), tcp)
            .await
            .context("TLS handshake")
    }

    /// Opens a connection ready to send requests.
    pub async fn connect(&self) -> anyhow::Result<Conn> {
        let tls = self.handshake(&self.tls).await?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let io = TokioIo::new(tls);
        match self.proto {
            Proto::H1 => {
                let (send, conn) = http1::handshake(io).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(Conn::H1(send))
            }
            Proto::H2 => {
                if alpn.as_deref() != Some(b"h2") {
                    bail!("server did not negotiate h2 (ALPN {alpn:?})");
                }
                let (send, conn) = http2::handshake(TokioExecutor::new(), io).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(Conn::H2(send))
            }
        }
    }

    /// Handshakes and returns a fingerprint of the leaf certificate served,
    /// to see certificate rotation take effect.
    pub async fn leaf_fingerprint(&self) -> anyhow::Result<u64> {
        let tls = self.handshake(&self.fresh).await?;
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .context("server sent no certificate")?;
        let mut h = DefaultHasher::new();
        leaf.as_ref().hash(&mut h);
        Ok(h.finish())
    }
}

/// One open connection.
pub enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    /// POSTs `body` and reads the whole answer.
    pub async fn post(&mut self, body: Bytes) -> Result<(u16, Bytes), hyper::Error> {
        let len = body.len();
        let builder = match self {
            // HTTP/1: origin-form target plus Host, as Go's client sends it.
            Conn::H1(_) => Request::builder()
                .uri(PATH)
                .header(header::HOST, SERVER_NAME),
            Conn::H2(_) => Request::builder().uri(format!("https://{SERVER_NAME}{PATH}")),
        };
        let req = builder
            .method(Method::POST)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, */*")
            .header(header::USER_AGENT, "kube-apiserver-admission")
            .header(header::CONTENT_LENGTH, len)
            .body(Full::new(body))
            .expect("constant request parts are valid");
        let resp: Response<Incoming> = match self {
            Conn::H1(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
            Conn::H2(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}
