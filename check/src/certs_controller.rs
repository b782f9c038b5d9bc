//! The certificate controller, the Deployment `nodegate-certs`: it makes the
//! webhook's CA, serving certificate and path token, renews them, and writes
//! the caBundle and the lines' paths into the configuration. Nothing of
//! admission waits on it: with it down the install works until the
//! certificate expires, so every case short of running is a warning, and an
//! install without it (certificates made by hand, or by cert-manager) is
//! told what it misses rather than failed.

use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, Client};

use crate::read::Read;
use crate::report::{Report, Status};

pub const CHECK: &str = "certs controller";

/// What [`verdict`] needs of the Deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// `spec.replicas` (the API server's default, 1, when unset).
    pub replicas: i32,
    /// `status.availableReplicas`.
    pub available: i32,
}

impl State {
    fn of(d: &Deployment) -> State {
        State {
            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            available: d
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0),
        }
    }
}

/// The line for Deployment `ns/name` as read.
pub fn verdict(ns: &str, name: &str, read: &Read<State>) -> (Status, String) {
    match read {
        Read::Found(s) if s.replicas == 0 => (
            Status::Warn,
            format!(
                "Deployment {ns}/{name} is scaled to 0: the webhook's certificate and path token are not renewed"
            ),
        ),
        Read::Found(s) if s.available == 0 => (
            Status::Warn,
            format!(
                "Deployment {ns}/{name}: 0/{} available: the webhook's certificate and path token are not renewed until it runs (see its Pod's events and logs)",
                s.replicas
            ),
        ),
        Read::Found(s) => (
            Status::Pass,
            format!(
                "{ns}/{name}: {}/{} available: it renews the webhook's certificate and path token",
                s.available, s.replicas
            ),
        ),
        Read::Missing => (
            Status::Warn,
            format!(
                "no Deployment {ns}/{name}: nothing renews the webhook's certificate or path token; renew them by hand before the certificate expires (the `serving certificate` line says when)"
            ),
        ),
        Read::Unreadable(e) => (
            Status::Skip,
            format!("cannot read Deployment {ns}/{name}: {e}"),
        ),
    }
}

/// Reads Deployment `ns/name` and reports [`verdict`].
pub async fn check(client: &Client, ns: &str, name: &str, report: &mut Report) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let read = Read::of(api.get_opt(name).await).map(|d| State::of(&d));
    let (status, detail) = verdict(ns, name, &read);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let found = |replicas, available| {
            Read::Found(State {
                replicas,
                available,
            })
        };
        let rows = [
            (
                found(1, 1),
                Status::Pass,
                "nodegate/nodegate-certs: 1/1 available",
            ),
            (
                found(1, 0),
                Status::Warn,
                "0/1 available: the webhook's certificate and path token are not renewed",
            ),
            (found(0, 0), Status::Warn, "is scaled to 0"),
            (
                Read::Missing,
                Status::Warn,
                "no Deployment nodegate/nodegate-certs: nothing renews",
            ),
            (
                Read::Unreadable("403".into()),
                Status::Skip,
                "cannot read Deployment nodegate/nodegate-certs: 403",
            ),
        ];
        for (read, want, part) in rows {
            let (status, detail) = verdict("nodegate", "nodegate-certs", &read);
            assert_eq!(status, want, "{detail}");
            assert!(detail.contains(part), "{detail:?} lacks {part:?}");
        }
    }

    #[test]
    fn state_of_a_deployment() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nodegate-certs"},
            "spec": {"selector": {}, "template": {}},
            "status": {"availableReplicas": 1},
        }))
        .unwrap();
        assert_eq!(
            State::of(&d),
            State {
                replicas: 1,
                available: 1
            }
        );
    }
}
