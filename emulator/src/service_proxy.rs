//! The Service proxy subresource:
//! `/api/v1/namespaces/{ns}/services/{[scheme:]name[:port]}/proxy/{path}`
//! forwards the request to an endpoint of the Service and answers with the
//! endpoint's status, headers and body.
//!
//! Follows `pkg/registry/core/service/proxy.go` (`ProxyREST.Connect`: resolve
//! the location, join the proxied path onto it, hand the request to an
//! upgrade-aware proxy handler with the location's transport) and
//! `pkg/registry/core/service/storage/storage.go` (`REST.ResourceLocation`:
//! `utilnet.SplitSchemeNamePort` of the id, 400 "invalid service request %q";
//! a port number is looked up among the Service's ports, 503 "no service port
//! %d found for service %q"; no endpoint, 503 "no endpoints available for
//! service %q"). The transport is kube-apiserver's `CreateProxyTransport`
//! (`cmd/kube-apiserver/app/server.go`): `InsecureSkipVerify`, because
//! proxying to pods and services is IP-based; a failed dial is 503 "error
//! trying to reach service: …" (`k8s.io/apimachinery/pkg/util/proxy/
//! transport.go`). Authorization runs first, as for any request: the
//! method's verb (POST is `create`, `request/requestinfo.go`) on
//! `services/proxy` with the id as the name; the Node authorizer has no rule
//! for it, so kubelets are refused. The caller's `Authorization` header is
//! not forwarded (`filters/authentication.go` deletes it once authenticated).
//!
//! Differences: endpoints come from the emulator's service → address map
//! (what webhook calls use, `"<svc>.<ns>.svc"`), not Endpoints objects, and
//! the Service object is read whatever the port form (upstream reads it only
//! for a port number). The address is the endpoint's; the Service's port
//! only has to exist.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, Method};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;

use crate::admission::Admission;
use crate::rbac::Policy;
use crate::resources;
use crate::status::ApiError;
use crate::store::Store;
use crate::users;

/// kube-apiserver's default `--request-timeout`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What the proxy reads: Services, their endpoints, and the RBAC policy
/// (`None`: every authenticated user may do anything).
#[derive(Debug, Clone, Copy)]
pub struct Cluster<'a> {
    pub store: &'a Store,
    pub admission: &'a Admission,
    pub policy: Option<&'a Policy>,
}

/// The request to proxy, as the router split it.
#[derive(Debug)]
pub struct ProxyRequest<'a> {
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
    pub namespace: &'a str,
    /// `[scheme:]name[:port]`, percent-decoded.
    pub id: String,
    /// The path after `/proxy`, with its leading `/`.
    pub path: String,
    pub body: Bytes,
}

impl<'a> ProxyRequest<'a> {
    /// From the request and the path segments around `proxy`: `rest` is
    /// what follows it.
    pub fn new(
        parts: &'a http::request::Parts,
        namespace: &'a str,
        id: &str,
        rest: &[&str],
        body: Bytes,
    ) -> Self {
        let mut path = format!("/{}", rest.join("/"));
        // JoinPreservingTrailingSlash: `/proxy/x/` proxies to `/x/`.
        if !rest.is_empty() && parts.uri.path().ends_with('/') {
            path.push('/');
        }
        Self {
            method: &parts.method,
            headers: &parts.headers,
            query: parts.uri.query(),
            namespace,
            // Clients may escape the colons of `https:name:port`.
            id: id.replace("%3A", ":").replace("%3a", ":"),
            path,
            body,
        }
    }
}

/// `utilnet.SplitSchemeNamePort`: `name`, `name:port` or `scheme:name:port`,
/// scheme `""`, `http` or `https`, name non-empty.
pub fn split_scheme_name_port(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some((scheme, name, port))
}

/// The verb `requestinfo.go` gives a connect request's method.
fn verb(method: &Method) -> String {
    match *method {
        Method::POST => "create".into(),
        Method::GET | Method::HEAD => "get".into(),
        Method::PUT => "update".into(),
        Method::PATCH => "patch".into(),
        Method::DELETE => "delete".into(),
        ref other => other.as_str().to_ascii_lowercase(),
    }
}

fn authorize(c: Cluster<'_>, user: &users::Identity, r: &ProxyRequest<'_>) -> Result<(), ApiError> {
    let verb = verb(r.method);
    let refuse = |why: String| ApiError::forbidden("services", "", &r.id, &why);
    if users::node_name_of(user).is_some() {
        return Err(refuse(format!(
            "User \"{user}\" cannot {verb} resource \"services/proxy\" in API group \"\" in the namespace \"{}\"",
            r.namespace
        )));
    }
    if let Some(policy) = c.policy {
        policy
            .authorize(&crate::rbac::Request {
                user,
                verb: &verb,
                group: "",
                resource: "services/proxy".into(),
                namespace: r.namespace,
                name: Some(&r.id),
            })
            .map_err(refuse)?;
    }
    Ok(())
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(503, "ServiceUnavailable", message)
}

/// Where to send the request: `(scheme, address)`.
fn resource_location(
    c: Cluster<'_>,
    ns: &str,
    id: &str,
) -> Result<(&'static str, std::net::SocketAddr), ApiError> {
    let (scheme, name, port) = split_scheme_name_port(id)
        .ok_or_else(|| ApiError::bad_request(format!("invalid service request {id:?}")))?;
    let svc = c
        .store
        .get(&resources::SERVICES, ns, name)
        .ok_or_else(|| ApiError::not_found("services", "", name))?;
    let ports: Vec<&Value> = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|p| p.iter().collect())
        .unwrap_or_default();
    fn port_name(p: &Value) -> &str {
        p.get("name").and_then(Value::as_str).unwrap_or("")
    }
    let declared = match port.parse::<i64>() {
        Ok(n) => {
            if !ports
                .iter()
                .any(|p| p.get("port").and_then(Value::as_i64) == Some(n))
            {
                return Err(unavailable(format!(
                    "no service port {n} found for service {name:?}"
                )));
            }
            true
        }
        // A name (or none) must name a port of the Endpoints, which follow the Service's.
        Err(_) => ports.iter().any(|p| port_name(p) == port),
    };
    if !declared {
        return Err(unavailable(format!(
            "no endpoints available for service {id:?}"
        )));
    }
    let addr = c
        .admission
        .endpoint(&format!("{name}.{ns}.svc"))
        .ok_or_else(|| unavailable(format!("no endpoints available for service {name:?}")))?;
    let scheme = if scheme == "https" { "https" } else { "http" };
    Ok((scheme, addr))
}

/// Accepts any certificate, as the proxy transport's `InsecureSkipVerify`
/// does; handshake signatures are still checked.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn insecure_client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Hop-by-hop headers a proxy does not pass on (RFC 9110 §7.6.1), and the
/// caller's credentials.
fn forwarded(name: &http::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "authorization"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// One HTTP/1.1 exchange with the endpoint; `Err` is a transport failure.
async fn round_trip(
    scheme: &str,
    addr: std::net::SocketAddr,
    r: &ProxyRequest<'_>,
) -> Result<http::Response<Bytes>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: {e}"))?;
    let mut builder = http::Request::builder()
        .method(r.method.clone())
        .uri(match r.query {
            Some(q) => format!("{}?{q}", r.path),
            None => r.path.clone(),
        })
        .header(http::header::HOST, addr.to_string());
    for (k, v) in r.headers.iter().filter(|(k, _)| forwarded(k)) {
        builder = builder.header(k, v);
    }
    let req = builder
        .body(Full::new(r.body.clone()))
        .map_err(|e| e.to_string())?;
    let resp = if scheme == "https" {
        let name = ServerName::IpAddress(addr.ip().into());
        let tls = tokio_rustls::TlsConnector::from(insecure_client_config()?)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        send(TokioIo::new(tls), req).await?
    } else {
        send(TokioIo::new(tcp), req).await?
    };
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(http::Response::from_parts(parts, bytes))
}

async fn send<T>(
    io: TokioIo<T>,
    req: http::Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "service proxy connection ended");
        }
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// Authorizes, resolves and forwards one proxied request.
pub async fn handle(
    c: Cluster<'_>,
    user: &users::Identity,
    r: ProxyRequest<'_>,
) -> Result<Response, ApiError> {
    authorize(c, user, &r)?;
    let (scheme, addr) = resource_location(c, r.namespace, &r.id)?;
    let resp = match tokio::time::timeout(REQUEST_TIMEOUT, round_trip(scheme, addr, &r)).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => return Err(unavailable(format!("error trying to reach service: {e}"))),
        Err(_) => {
            return Err(ApiError::new(
                504,
                "Timeout",
                "Timeout: request did not complete within requested timeout",
            ));
        }
    };
    let (parts, bytes) = resp.into_parts();
    let mut out = Response::new(Body::from(bytes));
    *out.status_mut() = parts.status;
    for (k, v) in parts.headers.iter().filter(|(k, _)| forwarded(k)) {
        out.headers_mut().append(k, v.clone());
    }
    Ok(out.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_ids_as_utilnet_does() {
        assert_eq!(split_scheme_name_port("svc"), Some(("", "svc", "")));
        assert_eq!(split_scheme_name_port("svc:443"), Some(("", "svc", "443")));
        assert_eq!(
            split_scheme_name_port("https:svc:https"),
            Some(("https", "svc", "https"))
        );
        assert_eq!(split_scheme_name_port("ftp:svc:21"), None);
        assert_eq!(split_scheme_name_port(":443"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
    }
}
