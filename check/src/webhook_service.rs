//! The webhook's Service: the first line's `service` clientConfig names it,
//! and it must serve the port the configuration calls.

use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client};

use crate::read::Read;
use crate::report::{Report, Status};
use crate::webhook_config::Hook;

pub const CHECK: &str = "webhook service";

/// The line for Service `ns/name` as read, and whether the API server can
/// reach the webhook through it (an unreadable Service is not held against
/// it).
pub fn verdict(ns: &str, name: &str, port: i32, read: &Read<Service>) -> (Status, String, bool) {
    match read {
        Read::Found(svc) => {
            let ports: Vec<i32> = svc
                .spec
                .iter()
                .flat_map(|s| s.ports.iter().flatten())
                .map(|p| p.port)
                .collect();
            if ports.contains(&port) {
                (
                    Status::Pass,
                    format!("{ns}/{name} serves port {port}"),
                    true,
                )
            } else {
                (
                    Status::Fail,
                    format!("{ns}/{name} has ports {ports:?}, the configuration calls {port}"),
                    false,
                )
            }
        }
        Read::Missing => (
            Status::Fail,
            format!("Service {ns}/{name} not found: the API server cannot reach the webhook"),
            false,
        ),
        Read::Unreadable(e) => (
            Status::Skip,
            format!("cannot read Service {ns}/{name}: {e}"),
            true,
        ),
    }
}

/// Reads the first line's Service and reports [`verdict`]; a line called
/// by url has none (nothing reported).
pub async fn check(client: &Client, hook: &Hook, report: &mut Report) -> bool {
    let Some((ns, name, port)) = &hook.service else {
        return true;
    };
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let (status, detail, ok) = verdict(ns, name, *port, &Read::of(api.get_opt(name).await));
    report.add(CHECK, status, detail);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn verdicts() {
        let svc = |port: i32| -> Read<Service> {
            Read::Found(
                serde_json::from_value(json!({"spec": {"ports": [{"port": port}]}})).unwrap(),
            )
        };
        let rows = [
            (
                svc(443),
                Status::Pass,
                "nodegate/nodegate-webhook serves port 443",
                true,
            ),
            (
                svc(9443),
                Status::Fail,
                "nodegate/nodegate-webhook has ports [9443], the configuration calls 443",
                false,
            ),
            (
                Read::Missing,
                Status::Fail,
                "Service nodegate/nodegate-webhook not found: the API server cannot reach the webhook",
                false,
            ),
            (
                Read::Unreadable("403".into()),
                Status::Skip,
                "cannot read Service nodegate/nodegate-webhook: 403",
                true,
            ),
        ];
        for (read, status, detail, ok) in rows {
            assert_eq!(
                verdict("nodegate", "nodegate-webhook", 443, &read),
                (status, detail.to_string(), ok)
            );
        }
    }
}
