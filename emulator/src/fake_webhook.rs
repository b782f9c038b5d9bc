//! A tiny in-process webhook whose answers a test scripts, to pin the
//! emulator's admission semantics independently of the real webhook.
//!
//! No upstream counterpart: a test double, answering as
//! `k8s.io/api/admission/v1` (`AdmissionReview`) prescribes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use nodegate_certs::{Ca, ServingRequest};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// What the fake answers to one request.
#[derive(Debug, Clone, Default)]
pub struct FakeReply {
    pub deny: Option<String>,
    /// A JSON patch, sent base64-encoded.
    pub patch: Option<Value>,
    pub warnings: Vec<String>,
    /// Sleep before answering (to exceed `timeoutSeconds`).
    pub delay: Duration,
    /// Answer with this body instead (malformed responses).
    pub raw: Option<Value>,
}

type Handler = Arc<dyn Fn(&Value) -> FakeReply + Send + Sync>;

/// A running fake webhook.
pub struct FakeWebhook {
    addr: SocketAddr,
    ca_pem: String,
    service: String,
    requests: Arc<Mutex<Vec<Value>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for FakeWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeWebhook")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for FakeWebhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeWebhook {
    /// Serves `<service>.<namespace>.svc` with a certificate from nodegate-certs.
    pub async fn start(
        service: &str,
        namespace: &str,
        handler: impl Fn(&Value) -> FakeReply + Send + Sync + 'static,
    ) -> anyhow::Result<FakeWebhook> {
        crate::tls::install_crypto_provider();
        let ca = Ca::generate(1)?;
        let cert = ca.issue(&ServingRequest {
            also_services: vec![],
            service: service.into(),
            namespace: namespace.into(),
            ips: vec![],
            days: 1,
        })?;
        let certs = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("cert")?;
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).context("key")?;
        let cfg = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let reqs = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let handler = handler.clone();
                let reqs = reqs.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let handler = handler.clone();
                        let reqs = reqs.clone();
                        async move {
                            let uri = req.uri().to_string();
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let mut review: Value =
                                serde_json::from_slice(&body).unwrap_or(Value::Null);
                            reqs.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(json!({"uri": uri, "review": review.clone()}));
                            if !review.is_object() {
                                review = json!({});
                            }
                            let reply = handler(&review["request"]);
                            tokio::time::sleep(reply.delay).await;
                            let out = reply.raw.clone().unwrap_or_else(|| {
                                let mut resp = json!({
                                    "uid": review["request"]["uid"],
                                    "allowed": reply.deny.is_none(),
                                });
                                if let Some(msg) = &reply.deny {
                                    resp["status"] = json!({"code": 403, "message": msg});
                                }
                                if let Some(p) = &reply.patch {
                                    resp["patchType"] = json!("JSONPatch");
                                    resp["patch"] = json!(STANDARD.encode(p.to_string()));
                                }
                                if !reply.warnings.is_empty() {
                                    resp["warnings"] = json!(reply.warnings);
                                }
                                json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp})
                            });
                            let bytes = Bytes::from(serde_json::to_vec(&out).unwrap_or_default());
                            Ok::<_, std::convert::Infallible>(
                                http::Response::builder()
                                    .header(http::header::CONTENT_TYPE, "application/json")
                                    .body(Full::new(bytes))
                                    .unwrap_or_default(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Ok(FakeWebhook {
            addr,
            ca_pem: ca.cert_pem().to_string(),
            service: format!("{service}.{namespace}.svc"),
            requests,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `"<svc>.<ns>.svc"`.
    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Every request so far, as `{"uri": ..., "review": AdmissionReview}`.
    pub fn requests(&self) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A MutatingWebhookConfiguration pointing at this fake: one webhook with
    /// the given rules and fields merged over sane defaults.
    pub fn config(&self, name: &str, webhook_overrides: Value) -> String {
        configuration(name, vec![self.hook(name, webhook_overrides)])
    }

    /// One webhook entry (named `<name>.example.com`) pointing at this fake,
    /// with `webhook_overrides` merged over sane defaults; several of them make
    /// a multi-entry configuration with [`configuration`].
    pub fn hook(&self, name: &str, webhook_overrides: Value) -> Value {
        let (svc, rest) = self.service.split_once('.').unwrap_or((&self.service, ""));
        let ns = rest.trim_end_matches(".svc");
        let mut hook = json!({
            "name": format!("{name}.example.com"),
            "admissionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {"name": svc, "namespace": ns, "path": "/mutate", "port": 443},
                "caBundle": STANDARD.encode(&self.ca_pem),
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["nodes", "nodes/status"]}],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 2,
        });
        json_patch::merge(&mut hook, &webhook_overrides);
        hook
    }
}

/// A MutatingWebhookConfiguration named `name` holding `hooks` in order.
pub fn configuration(name: &str, hooks: Vec<Value>) -> String {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    })
    .to_string()
}
