//! Prometheus metrics, all named `nodegate_webhook_*`.
//!
//! Every label combination is created up front and its handle kept, so the
//! hot path increments an atomic without a map lookup, and every series is
//! exported (as 0) from the start.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::caller::Authority;
use crate::rules::{Foreign, Reason};

/// `operation` label values, in [`Op`] order.
const OPERATIONS: [&str; 5] = ["CREATE", "UPDATE", "DELETE", "CONNECT", "UNKNOWN"];
/// `result` label values of the request counter, in [`Outcome`] order.
const OUTCOMES: [&str; 3] = ["patched", "allowed", "invalid"];

/// The operation of a request; `Unknown` when it could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Update,
    Delete,
    Connect,
    Unknown,
}

impl From<&kube::core::admission::Operation> for Op {
    fn from(op: &kube::core::admission::Operation) -> Self {
        use kube::core::admission::Operation as O;
        match op {
            O::Create => Op::Create,
            O::Update => Op::Update,
            O::Delete => Op::Delete,
            O::Connect => Op::Connect,
        }
    }
}

/// How a request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed with a patch that adds taints.
    Patched,
    /// Allowed untouched.
    Allowed,
    /// Not a usable AdmissionReview (answered allowed, or HTTP 400/413).
    Invalid,
}

/// Result of one background reboot patch (after a status write showed a
/// reboot) or of one re-registration check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Background {
    /// Taints added to the main resource.
    Ok,
    /// Gave up after retries, or the queue was full.
    Failed,
    /// No cluster credentials: reboot patches are disabled.
    Skipped,
    /// Re-read showed nothing to do (agent ready again, taints present, node gone).
    Unneeded,
}

const BACKGROUND: [&str; 4] = ["ok", "failed", "skipped", "unneeded"];

/// A limit that refused a connection or a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The connection cap was reached: the new connection was closed at once.
    ConnectionLimit,
    /// No TLS handshake within the handshake timeout.
    HandshakeTimeout,
    /// No complete request head within the header read timeout (HTTP/1.1;
    /// also an idle keep-alive connection).
    HeaderTimeout,
    /// A body over the size cap.
    BodyTooLarge,
    /// A body not complete within the body read timeout.
    BodyTimeout,
    /// The shared body budget was spent.
    BodyBudget,
    /// No answer within the request deadline (waiting for a slot included).
    RequestTimeout,
}

const REFUSALS: [&str; 7] = [
    "connection_limit",
    "handshake_timeout",
    "header_timeout",
    "body_too_large",
    "body_timeout",
    "body_budget",
    "request_timeout",
];

/// Which port a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Https,
    Admin,
}

const PORTS: [&str; 2] = ["https", "admin"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    operation: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    port: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabels {
    port: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: &'static str,
}

/// How a re-registration's claim of a reboot ended ([`crate::claims`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimResult {
    Confirmed = 0,
    Unconfirmed = 1,
    RateLimited = 2,
}

/// The webhook's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Vec<[Counter; 3]>,
    duration: Histogram,
    taints_added: [Counter; 2],
    background: [Counter; 4],
    reregistrations: [Counter; 4],
    unauthenticated: [Counter; 2],
    foreign: [Counter; 2],
    tls_reloads: [Counter; 2],
    refused: [[Counter; 7]; 2],
    connections: [Gauge; 2],
    inflight: Gauge,
    path_tokens: Gauge,
    reboot_claims: [Counter; 3],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodegate_webhook");
        let requests_family = Family::<RequestLabels, Counter>::default();
        let requests = OPERATIONS
            .iter()
            .map(|&operation| {
                OUTCOMES.map(|result| {
                    requests_family
                        .get_or_create(&RequestLabels { operation, result })
                        .clone()
                })
            })
            .collect();
        registry.register(
            "requests",
            "Admission requests by operation and result (patched, allowed, invalid)",
            requests_family,
        );
        // 50 µs .. ~1.6 s.
        let duration = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "request_duration_seconds",
            "Time to decode, decide and encode one admission request",
            duration.clone(),
        );
        let reasons = Family::<ReasonLabels, Counter>::default();
        let taints_added = ["create", "reboot"]
            .map(|reason| reasons.get_or_create(&ReasonLabels { reason }).clone());
        registry.register(
            "taints_added",
            "Taints added to Nodes, by reason (create, reboot)",
            reasons,
        );
        let bg = Family::<ResultLabels, Counter>::default();
        let background =
            BACKGROUND.map(|result| bg.get_or_create(&ResultLabels { result }).clone());
        registry.register(
            "background_patches",
            "Background reboot patches of the main Node resource after a status write, by result",
            bg,
        );
        let rereg = Family::<ResultLabels, Counter>::default();
        let reregistrations =
            BACKGROUND.map(|result| rereg.get_or_create(&ResultLabels { result }).clone());
        registry.register(
            "reregistration_patches",
            "Re-taints of a stored Node when its kubelet re-registers after a reboot, done before the create is answered, by result",
            rereg,
        );
        let unauth = Family::<RuleLabels, Counter>::default();
        let unauthenticated = ["reregistration", "status"]
            .map(|rule| unauth.get_or_create(&RuleLabels { rule }).clone());
        registry.register(
            "unauthenticated_side_effects",
            "Writes of a stored Node a review asked for but did not get: it was not posted to the configuration's /mutate/<token> path, so anyone could have sent it (rule: reregistration, status)",
            unauth,
        );
        let not_node = Family::<RuleLabels, Counter>::default();
        let foreign = ["reregistration", "status"]
            .map(|rule| not_node.get_or_create(&RuleLabels { rule }).clone());
        registry.register(
            "foreign_side_effects",
            "Writes of a stored Node a review asked for but did not get: the write it reviews is not the node's own kubelet's (system:node:<name>), so it proves no reboot (rule: reregistration, status)",
            not_node,
        );
        let tls = Family::<ResultLabels, Counter>::default();
        let tls_reloads =
            ["ok", "failed"].map(|result| tls.get_or_create(&ResultLabels { result }).clone());
        registry.register(
            "tls_reloads",
            "Serving certificate reloads after the files changed, by result",
            tls,
        );
        let refusals = Family::<RefusalLabels, Counter>::default();
        let refused = PORTS.map(|port| {
            REFUSALS.map(|reason| {
                refusals
                    .get_or_create(&RefusalLabels { port, reason })
                    .clone()
            })
        });
        registry.register(
            "refused",
            "Connections and requests refused by a limit, by port and reason",
            refusals,
        );
        let open = Family::<PortLabels, Gauge>::default();
        let connections = PORTS.map(|port| open.get_or_create(&PortLabels { port }).clone());
        registry.register(
            "open_connections",
            "Connections open now (TLS handshake included), by port",
            open,
        );
        let inflight = Gauge::default();
        registry.register(
            "inflight_requests",
            "Admission requests past their headers now (reading the body or being decided)",
            inflight.clone(),
        );
        let path_tokens = Gauge::default();
        registry.register(
            "path_tokens",
            "Path tokens a review may present to write a stored Node: 1, or 2 while a rotation runs; 0 when --path-token-file is unusable, -1 without it",
            path_tokens.clone(),
        );
        let claims = Family::<ResultLabels, Counter>::default();
        let reboot_claims = ["confirmed", "unconfirmed", "rate_limited"]
            .map(|result| claims.get_or_create(&ResultLabels { result }).clone());
        registry.register(
            "reboot_claims",
            "Re-registrations that claimed a reboot, by result: confirmed (the stored node reported the boot), unconfirmed (it never did: no real reboot followed the re-taint), rate_limited (not re-tainted: the node was re-tainted on a claim less than --reregistration-min-interval ago)",
            claims,
        );
        Self {
            registry,
            path_tokens,
            reboot_claims,
            requests,
            duration,
            taints_added,
            background,
            reregistrations,
            unauthenticated,
            foreign,
            tls_reloads,
            refused,
            connections,
            inflight,
        }
    }

    pub fn refused(&self, port: Port, why: Refusal) {
        self.refused[port as usize][why as usize].inc();
    }

    /// Open connections on `port`: the gauge to move.
    pub fn connections(&self, port: Port) -> &Gauge {
        &self.connections[port as usize]
    }

    /// Requests past their headers: the gauge to move.
    pub fn inflight(&self) -> &Gauge {
        &self.inflight
    }

    pub fn request(&self, op: Op, outcome: Outcome, seconds: f64) {
        self.requests[op as usize][outcome as usize].inc();
        self.duration.observe(seconds);
    }

    /// A request whose body could not even be read (too large, broken off):
    /// counted, but kept out of the latency histogram.
    pub fn unreadable_request(&self) {
        self.requests[Op::Unknown as usize][Outcome::Invalid as usize].inc();
    }

    pub fn taints_added(&self, reason: Reason, n: usize) {
        let i = match reason {
            Reason::Create => 0,
            Reason::Reboot => 1,
        };
        self.taints_added[i].inc_by(n as u64);
    }

    /// A re-registration check (same results as background patches; `ok`
    /// when taints were added).
    pub fn reregistration(&self, result: Background) {
        self.reregistrations[result as usize].inc();
    }

    /// A side effect not taken: `reregistration` (a create's re-taint) or
    /// `status` (the background patch after a status write).
    pub fn unauthenticated(&self, status_write: bool) {
        self.unauthenticated[usize::from(status_write)].inc();
    }

    /// A side effect not taken because the write is not the node's own
    /// kubelet's.
    pub fn foreign(&self, which: Foreign) {
        self.foreign[match which {
            Foreign::Reregistration => 0,
            Foreign::Status => 1,
        }]
        .inc();
    }

    pub fn reboot_claim(&self, result: ClaimResult) {
        self.reboot_claims[result as usize].inc();
    }

    /// What the path token file admits now.
    pub fn path_tokens(&self, authority: &Authority) {
        self.path_tokens.set(match authority {
            Authority::Open => -1,
            Authority::Missing(_) => 0,
            Authority::Token(t) => i64::try_from(t.len()).unwrap_or(i64::MAX),
        });
    }

    pub fn background(&self, result: Background) {
        self.background[result as usize].inc();
    }

    pub fn tls_reload(&self, ok: bool) {
        self.tls_reloads[usize::from(!ok)].inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_every_series_with_the_documented_names() {
        let m = Metrics::new();
        m.request(Op::Create, Outcome::Patched, 0.001);
        m.taints_added(Reason::Reboot, 2);
        m.background(Background::Skipped);
        m.tls_reload(false);
        m.refused(Port::Https, Refusal::BodyTooLarge);
        m.connections(Port::Admin).inc();
        m.path_tokens(&Authority::Token(vec!["a".into(), "b".into()]));
        let text = m.encode();
        for line in [
            r#"nodegate_webhook_requests_total{operation="CREATE",result="patched"} 1"#,
            r#"nodegate_webhook_requests_total{operation="UPDATE",result="invalid"} 0"#,
            "nodegate_webhook_request_duration_seconds_count 1",
            r#"nodegate_webhook_taints_added_total{reason="reboot"} 2"#,
            r#"nodegate_webhook_taints_added_total{reason="create"} 0"#,
            r#"nodegate_webhook_background_patches_total{result="skipped"} 1"#,
            r#"nodegate_webhook_background_patches_total{result="ok"} 0"#,
            r#"nodegate_webhook_tls_reloads_total{result="failed"} 1"#,
            r#"nodegate_webhook_refused_total{port="https",reason="body_too_large"} 1"#,
            r#"nodegate_webhook_refused_total{port="admin",reason="connection_limit"} 0"#,
            r#"nodegate_webhook_open_connections{port="admin"} 1"#,
            "nodegate_webhook_inflight_requests 0",
            "nodegate_webhook_path_tokens 2",
            r#"nodegate_webhook_reboot_claims_total{result="unconfirmed"} 0"#,
            r#"nodegate_webhook_foreign_side_effects_total{rule="reregistration"} 0"#,
            r#"nodegate_webhook_foreign_side_effects_total{rule="status"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        // One decoder now: no per-decoder series.
        assert!(!text.contains("decodes"), "{text}");
    }
}
