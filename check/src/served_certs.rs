//! What each webhook replica actually serves, verified the way the API
//! server verifies it. The `serving certificate` line compares the Secret
//! with each line's caBundle, and the `line <entry>` checks reach the
//! replicas through the API server's service proxy, which does not verify
//! their certificates: a replica still serving an old certificate (or a
//! caBundle flipped before the pods reloaded the Secret) passes both. Here,
//! for every line of admission, each ready endpoint of the line's Service
//! (its EndpointSlices: the replicas use the host network, so the node's
//! address and the port the Service targets) is dialled directly from where
//! the check runs, and the chain it presents in a TLS handshake for
//! `<service>.<namespace>.svc` is verified against THAT line's caBundle.
//!
//! [`read`] does the I/O (Service, EndpointSlices, one handshake per line
//! and endpoint), [`verdict`] judges what was read, [`check`] reports it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::task::JoinSet;

use crate::lines::{ServiceRef, lines};
use crate::report::{Report, Status};
use crate::webhook_config::Hook;

/// Every report line of this check starts with it: `served cert <entry>`,
/// then the replica (`served cert <entry> <pod>`).
pub const CHECK: &str = "served cert";
/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The flags of this check.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "served-certs")]
pub struct Args {
    /// How long to wait for the TCP connection, then again for the TLS
    /// handshake, with each webhook replica's endpoint (`500ms`, `3s`, …).
    /// An endpoint not reached in time is reported as a warning: the check
    /// does not run where the replicas' node addresses are reachable.
    #[arg(
        long = "replica-connect-timeout",
        env = "NODEGATE_CHECK_REPLICA_CONNECT_TIMEOUT",
        default_value = "3s",
        value_parser = nodegate_shared::duration::parse
    )]
    pub connect_timeout: Duration,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            connect_timeout: Duration::from_secs(3),
        }
    }
}

/// What one endpoint presented.
#[derive(Debug, Clone)]
pub enum Served {
    /// The handshake completed: the chain the replica sent, leaf first (it
    /// proved it holds the leaf's key).
    Chain(Vec<CertificateDer<'static>>),
    /// No TCP connection, or no TLS answer on it, within the timeout: the
    /// endpoint cannot be reached from here.
    Unreached(String),
    /// Connected, but the TLS handshake failed.
    Handshake(String),
}

/// One ready endpoint of a line's Service and what it served.
#[derive(Debug, Clone)]
pub struct Replica {
    /// The Pod behind it (the EndpointSlice's `targetRef`), if named.
    pub pod: Option<String>,
    pub node: Option<String>,
    pub address: String,
    pub port: u16,
    pub served: Served,
}

impl Replica {
    /// `address:port`, an IPv6 address in brackets.
    pub fn at(&self) -> String {
        if self.address.contains(':') {
            format!("[{}]:{}", self.address, self.port)
        } else {
            format!("{}:{}", self.address, self.port)
        }
    }

    /// The report line's suffix: the Pod, else the address.
    fn who(&self) -> String {
        self.pod.clone().unwrap_or_else(|| self.at())
    }
}

/// A line's endpoints, or why there are none to dial.
#[derive(Debug, Clone)]
pub enum Endpoints {
    /// The ready endpoints of the line's Service (not-ready ones counted).
    Listed {
        replicas: Vec<Replica>,
        not_ready: usize,
    },
    /// Called by `url`: no Service, nothing in the cluster to list.
    Url,
    /// The Service, its port or its EndpointSlices could not be used.
    Unusable(String),
}

/// One line of admission as read.
#[derive(Debug, Clone)]
pub struct Line {
    pub name: String,
    /// `<service>.<namespace>.svc`, the name the API server verifies.
    pub host: String,
    pub ca_bundle: Vec<u8>,
    pub endpoints: Endpoints,
}

/// One report line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub check: String,
    pub status: Status,
    pub detail: String,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("the caBundle is not PEM ({e})"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the caBundle holds an unusable certificate ({e})"))?;
    }
    if roots.is_empty() {
        return Err("the caBundle holds no certificate".into());
    }
    Ok(roots)
}

/// Why a chain does not verify, in the operator's terms.
fn reason(e: &rustls::Error, host: &str) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => {
                "not signed by a CA of the line's caBundle (unknown issuer)".into()
            }
            CertificateError::NotValidForName
            | CertificateError::NotValidForNameContext { .. } => {
                format!("not valid for {host} (the name the API server dials)")
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "expired".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "not valid yet".into()
            }
            // webpki finds the issuer by name: every nodegate CA has the same one.
            CertificateError::BadSignature => "not signed by a CA of the line's caBundle (a CA there has its issuer's name but not its key: an earlier or another CA signed it)".into(),
            other => format!("{other:?}"),
        },
        other => other.to_string(),
    }
}

/// Verifies `chain` (leaf first) for `host` against `ca_pem` at `now`, as
/// the API server does for a `service` reference (SANs only).
pub fn verify(
    ca_pem: &[u8],
    chain: &[CertificateDer<'static>],
    host: &str,
    now: UnixTime,
) -> Result<(), String> {
    let roots = roots(ca_pem)?;
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| format!("the caBundle cannot verify anything ({e})"))?;
    let (leaf, rest) = chain
        .split_first()
        .ok_or("the replica sent no certificate")?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    verifier
        .verify_server_cert(leaf, rest, &name, &[], now)
        .map(|_| ())
        .map_err(|e| reason(&e, host))
}

/// The leaf's subject, issuer and expiry, for the report.
struct Leaf {
    subject: String,
    issuer: String,
    /// Seconds since the epoch.
    not_after: i64,
    not_after_text: String,
}

fn leaf(chain: &[CertificateDer<'static>]) -> Option<Leaf> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(chain.first()?.as_ref()).ok()?;
    let not_after = cert.validity().not_after;
    let date = not_after.to_datetime();
    Some(Leaf {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        not_after: not_after.timestamp(),
        not_after_text: format!(
            "{:04}-{:02}-{:02}",
            date.year(),
            u8::from(date.month()),
            date.day()
        ),
    })
}

fn days(n: i64) -> String {
    if n == 1 {
        "1 day".into()
    } else {
        format!("{n} days")
    }
}

fn expiry(l: &Leaf, now: UnixTime) -> String {
    let left = l.not_after - i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    if left >= 0 {
        format!("expires {} (in {})", l.not_after_text, days(left / 86_400))
    } else {
        format!(
            "expired {} ({} ago)",
            l.not_after_text,
            days(-left / 86_400)
        )
    }
}

/// One endpoint's verdict: its status and the detail after the address.
fn judge(line: &Line, r: &Replica, now: UnixTime) -> (Status, String) {
    let at = match &r.node {
        Some(n) => format!("{} (node {n})", r.at()),
        None => r.at(),
    };
    match &r.served {
        Served::Chain(chain) => {
            let shown = leaf(chain);
            let described = shown
                .as_ref()
                .map(|l| format!("{} issued by {}, {}", l.subject, l.issuer, expiry(l, now)))
                .unwrap_or_else(|| "a certificate that does not parse".into());
            match verify(&line.ca_bundle, chain, &line.host, now) {
                Ok(()) => (
                    Status::Pass,
                    format!(
                        "{at} serves a chain {}'s caBundle verifies for {}: {described}",
                        line.name, line.host
                    ),
                ),
                Err(why) => (
                    Status::Fail,
                    format!(
                        "{at} serves {described}: {why} — the API server fails {}'s calls that reach this replica (failurePolicy Ignore: the Node write goes on without this line); restart the replica to load the Secret, or re-issue the certificate for every line's Service and re-inject the caBundle",
                        line.name
                    ),
                ),
            }
        }
        Served::Handshake(e) => (
            Status::Fail,
            format!(
                "{at}: TLS handshake for {} failed: {e} — the API server's calls of {} fail the same way",
                line.host, line.name
            ),
        ),
        Served::Unreached(e) => (
            Status::Warn,
            format!(
                "{at} not reached from here ({e}): only the Secret's certificate was compared with the caBundle (`serving certificate`), not what this replica serves; run nodegate-check where the replicas' node addresses are reachable on port {} (on a node, or a host in the nodes' network: the replicas use the host network), or raise --replica-connect-timeout",
                r.port
            ),
        ),
    }
}

/// The report lines for one line of admission: one per ready endpoint, or
/// one saying why none was dialled.
pub fn verdict(line: &Line, now: UnixTime) -> Vec<Verdict> {
    let base = format!("{CHECK} {}", line.name);
    let one = |status, detail: String| {
        vec![Verdict {
            check: base.clone(),
            status,
            detail,
        }]
    };
    match &line.endpoints {
        Endpoints::Url => one(
            Status::Skip,
            "called by url: no Service whose endpoints could be dialled".into(),
        ),
        Endpoints::Unusable(why) => one(Status::Skip, why.clone()),
        Endpoints::Listed {
            replicas,
            not_ready,
        } if replicas.is_empty() => one(
            Status::Skip,
            format!(
                "no ready endpoint behind {} ({not_ready} not ready): nothing to dial (the `line {}` check says whether the line answers)",
                line.host, line.name
            ),
        ),
        Endpoints::Listed { replicas, .. } => replicas
            .iter()
            .map(|r| {
                let (status, detail) = judge(line, r, now);
                Verdict {
                    check: format!("{base} {}", r.who()),
                    status,
                    detail,
                }
            })
            .collect(),
    }
}

/// Accepts any chain, keeps it, and still checks the handshake's
/// signatures: a completed handshake proves the replica holds the key of
/// the leaf it sent. The chain is judged afterwards, by [`verify`].
#[derive(Debug)]
struct Capture {
    chain: Mutex<Vec<CertificateDer<'static>>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut chain = self.chain.lock().unwrap_or_else(|p| p.into_inner());
        *chain = std::iter::once(end_entity)
            .chain(intermediates)
            .map(|c| c.clone().into_owned())
            .collect();
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Dials `address:port` and shakes hands for `host` (SNI, as the API
/// server does), each step within `timeout`.
pub async fn fetch(address: &str, port: u16, host: &str, timeout: Duration) -> Served {
    let provider = provider();
    let capture = Arc::new(Capture {
        chain: Mutex::new(Vec::new()),
        algorithms: provider.signature_verification_algorithms,
    });
    let config = match rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
    {
        Ok(b) => b
            .dangerous()
            .with_custom_certificate_verifier(capture.clone())
            .with_no_client_auth(),
        Err(e) => return Served::Handshake(format!("TLS client: {e}")),
    };
    let name = match ServerName::try_from(host.to_string()) {
        Ok(n) => n,
        Err(e) => return Served::Handshake(format!("{host}: {e}")),
    };
    let secs = timeout.as_secs_f64();
    let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((address, port)))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Served::Unreached(format!("TCP connect: {e}")),
        Err(_) => return Served::Unreached(format!("no TCP connection within {secs} s")),
    };
    let handshake = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(_stream)) => Served::Chain(std::mem::take(
            &mut *capture.chain.lock().unwrap_or_else(|p| p.into_inner()),
        )),
        Ok(Err(e)) => Served::Handshake(e.to_string()),
        Err(_) => Served::Unreached(format!(
            "TCP connected, but no TLS answer within {secs} s (a middlebox on the way, or the replica hangs)"
        )),
    }
}

/// An endpoint to dial, before the handshake.
#[derive(Debug, Clone)]
struct Target {
    pod: Option<String>,
    node: Option<String>,
    address: String,
    port: u16,
}

/// A failed read in the report: the API server's message, and for a 403
/// what to grant.
fn unreadable(what: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "cannot read {what}: {} (grant it as manifests/components/check-rbac does)",
            s.message
        ),
        kube::Error::Api(s) => format!("cannot read {what}: {} ({})", s.message, s.code),
        other => format!("cannot read {what}: {other}"),
    }
}

/// The ready endpoints of `svc` (and the count of not-ready ones), on the
/// port its EndpointSlices resolve the line's Service port to.
async fn endpoints(client: &Client, svc: &ServiceRef) -> Result<(Vec<Target>, usize), String> {
    let at = format!("{}/{}", svc.namespace, svc.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &svc.namespace);
    let service = match services.get_opt(&svc.name).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(format!(
                "Service {at} not found (see `webhook lines`): nothing to dial"
            ));
        }
        Err(e) => return Err(unreadable(&format!("Service {at}"), &e)),
    };
    let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
    let Some(port) = ports.iter().find(|p| p.port == svc.port) else {
        return Err(format!(
            "Service {at} has no port {} (see `webhook lines`): nothing to dial",
            svc.port
        ));
    };
    // An EndpointSlice names its ports as the Service does ("" unnamed).
    let port_name = port.name.clone().unwrap_or_default();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &svc.namespace);
    let lp = ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={}", svc.name));
    let list = slices
        .list(&lp)
        .await
        .map_err(|e| unreadable(&format!("the EndpointSlices of Service {at}"), &e))?;
    let (mut ready, mut not_ready) = (Vec::new(), 0);
    for slice in list.items {
        let target = slice.ports.iter().flatten().find(|p| {
            p.name.clone().unwrap_or_default() == port_name
                && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        });
        let Some(target) = target
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for e in slice.endpoints {
            // `ready` unset means unknown, which consumers treat as ready.
            if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                not_ready += 1;
                continue;
            }
            let Some(address) = e.addresses.first().cloned() else {
                continue;
            };
            ready.push(Target {
                pod: e
                    .target_ref
                    .as_ref()
                    .filter(|r| r.kind.as_deref() == Some("Pod"))
                    .and_then(|r| r.name.clone()),
                node: e.node_name.clone(),
                address,
                port: target,
            });
        }
    }
    Ok((ready, not_ready))
}

/// Reads every line's endpoints and shakes hands with each of them (all at
/// once: an unreachable endpoint costs its timeout once, not per line).
pub async fn read(client: &Client, hook: &Hook, args: &Args) -> Vec<Line> {
    let mut out = Vec::new();
    let mut dials = JoinSet::new();
    for (i, l) in lines(hook).into_iter().enumerate() {
        let Some(svc) = &l.service else {
            out.push(Line {
                name: l.name,
                host: String::new(),
                ca_bundle: l.ca_bundle,
                endpoints: Endpoints::Url,
            });
            continue;
        };
        let host = svc.host();
        let endpoints = match endpoints(client, svc).await {
            Ok((targets, not_ready)) => {
                for (j, t) in targets.iter().enumerate() {
                    let (t, host, timeout) = (t.clone(), host.clone(), args.connect_timeout);
                    dials.spawn(async move {
                        let served = fetch(&t.address, t.port, &host, timeout).await;
                        (i, j, served)
                    });
                }
                let replicas = targets
                    .into_iter()
                    .map(|t| Replica {
                        pod: t.pod,
                        node: t.node,
                        address: t.address,
                        port: t.port,
                        served: Served::Unreached("not dialled".into()),
                    })
                    .collect();
                Endpoints::Listed {
                    replicas,
                    not_ready,
                }
            }
            Err(why) => Endpoints::Unusable(why),
        };
        out.push(Line {
            name: l.name,
            host,
            ca_bundle: l.ca_bundle,
            endpoints,
        });
    }
    while let Some(done) = dials.join_next().await {
        let Ok((i, j, served)) = done else { continue };
        if let Some(Line {
            endpoints: Endpoints::Listed { replicas, .. },
            ..
        }) = out.get_mut(i)
            && let Some(r) = replicas.get_mut(j)
        {
            r.served = served;
        }
    }
    out
}

/// Reads, judges and reports every line's replicas.
pub async fn check(client: &Client, hook: &Hook, args: &Args, report: &mut Report) {
    let now = UnixTime::since_unix_epoch(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    for line in read(client, hook, args).await {
        for v in verdict(&line, now) {
            report.add(v.check, v.status, v.detail);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use nodegate_certs::{Ca, ServingRequest};

    fn chain(ca: &Ca, service: &str, days: u32) -> Vec<CertificateDer<'static>> {
        let cert = ca
            .issue(&ServingRequest {
                service: service.into(),
                namespace: "nodegate".into(),
                also_services: Vec::new(),
                ips: Vec::new(),
                days,
            })
            .unwrap();
        CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    }

    fn replica(pod: &str, served: Served) -> Replica {
        Replica {
            pod: Some(pod.into()),
            node: Some("node-a".into()),
            address: "10.0.0.7".into(),
            port: 9443,
            served,
        }
    }

    fn line(ca: &Ca, endpoints: Endpoints) -> Line {
        Line {
            name: "replica-0.nodes.nodegate.dev".into(),
            host: "nodegate-webhook-0.nodegate.svc".into(),
            ca_bundle: ca.cert_pem().as_bytes().to_vec(),
            endpoints,
        }
    }

    fn now_plus(days: u64) -> UnixTime {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        UnixTime::since_unix_epoch(now + Duration::from_secs(days * 86_400))
    }

    // (what was read, when, expected (check suffix, status, detail part) per report line)
    type Row<'a> = (Line, UnixTime, Vec<(&'a str, Status, &'a str)>);

    fn listed(rs: Vec<Replica>) -> Endpoints {
        Endpoints::Listed {
            replicas: rs,
            not_ready: 0,
        }
    }

    /// Each row's lines, in order, have the check, the status and the part
    /// of the detail it names.
    fn assert_rows(table: Vec<Row>) {
        for (i, (l, now, want)) in table.into_iter().enumerate() {
            let got = verdict(&l, now);
            assert_eq!(got.len(), want.len(), "row {i}: {got:?}");
            for (g, (suffix, status, part)) in got.iter().zip(want) {
                assert_eq!(
                    g.check,
                    format!("{CHECK} replica-0.nodes.nodegate.dev{suffix}"),
                    "row {i}"
                );
                assert_eq!(g.status, status, "row {i}: {}", g.detail);
                assert!(
                    g.detail.contains(part),
                    "row {i}: {:?} lacks {part:?}",
                    g.detail
                );
            }
        }
    }

    /// What a replica serves: a chain its line's caBundle verifies for the
    /// line's name, or not, or no longer.
    #[test]
    fn verdicts_on_what_a_replica_serves() {
        let ca = Ca::generate(30).unwrap();
        let other = Ca::generate(30).unwrap();
        let good = chain(&ca, "nodegate-webhook-0", 10);
        assert_rows(vec![
            (
                line(
                    &ca,
                    listed(vec![replica(
                        "nodegate-webhook-0",
                        Served::Chain(good.clone()),
                    )]),
                ),
                now_plus(0),
                vec![(
                    " nodegate-webhook-0",
                    Status::Pass,
                    "10.0.0.7:9443 (node node-a) serves a chain replica-0.nodes.nodegate.dev's caBundle verifies for nodegate-webhook-0.nodegate.svc: CN=nodegate-webhook-0.nodegate.svc",
                )],
            ),
            (
                line(
                    &ca,
                    listed(vec![replica(
                        "nodegate-webhook-0",
                        Served::Chain(good.clone()),
                    )]),
                ),
                now_plus(0),
                vec![(
                    " nodegate-webhook-0",
                    Status::Pass,
                    "issued by CN=nodegate-webhook-ca, expires ",
                )],
            ),
            // Another CA signed what this replica serves (it still runs
            // with an old certificate, or the caBundle moved on).
            (
                line(
                    &ca,
                    listed(vec![
                        replica("nodegate-webhook-0", Served::Chain(good.clone())),
                        replica(
                            "nodegate-webhook-1",
                            Served::Chain(chain(&other, "nodegate-webhook-0", 10)),
                        ),
                    ]),
                ),
                now_plus(0),
                vec![
                    (" nodegate-webhook-0", Status::Pass, "verifies"),
                    (
                        " nodegate-webhook-1",
                        Status::Fail,
                        "not signed by a CA of the line's caBundle",
                    ),
                ],
            ),
            // Signed by the right CA for another line's Service only.
            (
                line(
                    &ca,
                    listed(vec![replica(
                        "nodegate-webhook-0",
                        Served::Chain(chain(&ca, "nodegate-webhook", 10)),
                    )]),
                ),
                now_plus(0),
                vec![(
                    " nodegate-webhook-0",
                    Status::Fail,
                    "not valid for nodegate-webhook-0.nodegate.svc",
                )],
            ),
            (
                line(
                    &ca,
                    listed(vec![replica(
                        "nodegate-webhook-0",
                        Served::Chain(good.clone()),
                    )]),
                ),
                now_plus(11),
                vec![(
                    " nodegate-webhook-0",
                    Status::Fail,
                    ": expired — the API server fails",
                )],
            ),
        ]);
    }

    /// Replicas that do not finish a handshake or cannot be reached, lines
    /// without endpoints, and a caBundle that verifies nothing.
    #[test]
    fn verdicts_on_reaching_the_replicas() {
        let ca = Ca::generate(30).unwrap();
        let good = chain(&ca, "nodegate-webhook-0", 10);
        assert_rows(vec![
            (
                line(
                    &ca,
                    listed(vec![replica(
                        "nodegate-webhook-0",
                        Served::Handshake("received fatal alert: HandshakeFailure".into()),
                    )]),
                ),
                now_plus(0),
                vec![(
                    " nodegate-webhook-0",
                    Status::Fail,
                    "TLS handshake for nodegate-webhook-0.nodegate.svc failed: received fatal alert",
                )],
            ),
            (
                line(
                    &ca,
                    listed(vec![replica(
                        "nodegate-webhook-0",
                        Served::Unreached("no TCP connection within 3 s".into()),
                    )]),
                ),
                now_plus(0),
                vec![(
                    " nodegate-webhook-0",
                    Status::Warn,
                    "not reached from here (no TCP connection within 3 s): only the Secret's certificate was compared",
                )],
            ),
            // An endpoint without targetRef is named by its address.
            (
                line(
                    &ca,
                    listed(vec![Replica {
                        pod: None,
                        node: None,
                        address: "fd00::7".into(),
                        port: 9443,
                        served: Served::Chain(good.clone()),
                    }]),
                ),
                now_plus(0),
                vec![(" [fd00::7]:9443", Status::Pass, "[fd00::7]:9443 serves")],
            ),
            (
                line(
                    &ca,
                    Endpoints::Listed {
                        replicas: Vec::new(),
                        not_ready: 2,
                    },
                ),
                now_plus(0),
                vec![("", Status::Skip, "no ready endpoint behind nodegate-webhook-0.nodegate.svc (2 not ready)")],
            ),
            (
                line(&ca, Endpoints::Url),
                now_plus(0),
                vec![("", Status::Skip, "called by url")],
            ),
            (
                line(
                    &ca,
                    Endpoints::Unusable("cannot read the EndpointSlices of Service nodegate/nodegate-webhook-0: forbidden".into()),
                ),
                now_plus(0),
                vec![("", Status::Skip, "forbidden")],
            ),
            // A caBundle that verifies nothing fails every replica.
            (
                Line {
                    ca_bundle: b"not pem".to_vec(),
                    ..line(&ca, listed(vec![replica("nodegate-webhook-0", Served::Chain(good.clone()))]))
                },
                now_plus(0),
                vec![(" nodegate-webhook-0", Status::Fail, "the caBundle holds no certificate")],
            ),
        ]);
    }

    /// The handshake against a local TLS server: the chain it sends comes
    /// back whatever CA signed it; a closed port is unreached.
    #[tokio::test]
    async fn fetch_returns_the_served_chain() {
        let ca = Ca::generate(30).unwrap();
        let cert = ca
            .issue(&ServingRequest {
                service: "nodegate-webhook".into(),
                namespace: "nodegate".into(),
                also_services: Vec::new(),
                ips: Vec::new(),
                days: 10,
            })
            .unwrap();
        let certs = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs.clone(), key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serve = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = acceptor.accept(tcp).await;
        });
        let host = "nodegate-webhook.nodegate.svc";
        match fetch("127.0.0.1", port, host, Duration::from_secs(5)).await {
            Served::Chain(got) => {
                assert_eq!(got, certs);
                assert!(verify(ca.cert_pem().as_bytes(), &got, host, now_plus(0)).is_ok());
            }
            other => panic!("{other:?}"),
        }
        serve.await.unwrap();

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        match fetch("127.0.0.1", port, host, Duration::from_secs(5)).await {
            Served::Unreached(e) => assert!(e.contains("TCP connect"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
