//! The agent DaemonSet: there, and available on every node it is scheduled
//! on (a node without a ready agent keeps the taint).

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use kube::{Api, Client};

use crate::read::Read;
use crate::report::{Report, Status};

pub const CHECK: &str = "agent daemonset";

/// The line for DaemonSet `ns/name`, from its status as read.
pub fn verdict(ns: &str, name: &str, read: &Read<DaemonSetStatus>) -> (Status, String) {
    let s = match read {
        Read::Found(s) => s,
        Read::Missing => {
            return (
                Status::Fail,
                format!(
                    "DaemonSet {ns}/{name} not found: nothing removes the taint, nodes stay unschedulable"
                ),
            );
        }
        Read::Unreadable(e) => {
            return (
                Status::Skip,
                format!("cannot read DaemonSet {ns}/{name}: {e}"),
            );
        }
    };
    let (desired, available) = (s.desired_number_scheduled, s.number_available.unwrap_or(0));
    let what = format!("{ns}/{name}: {available}/{desired} available");
    if desired == 0 {
        (Status::Warn, format!("{what}: scheduled on no node"))
    } else if available < desired {
        (
            Status::Warn,
            format!(
                "{what}: nodes without a ready agent keep the taint (check tolerations and the agent's logs)"
            ),
        )
    } else {
        (Status::Pass, what)
    }
}

/// Reads DaemonSet `ns/name` and reports [`verdict`].
pub async fn check(client: &Client, ns: &str, name: &str, report: &mut Report) {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let read = Read::of(api.get_opt(name).await).map(|d| d.status.unwrap_or_default());
    let (status, detail) = verdict(ns, name, &read);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let status = |desired: i32, available: Option<i32>| {
            Read::Found(DaemonSetStatus {
                desired_number_scheduled: desired,
                number_available: available,
                ..Default::default()
            })
        };
        let rows = [
            (
                status(3, Some(3)),
                Status::Pass,
                "nodegate/nodegate-agent: 3/3 available",
            ),
            (
                status(3, None),
                Status::Warn,
                "nodegate/nodegate-agent: 0/3 available: nodes without a ready agent keep the taint (check tolerations and the agent's logs)",
            ),
            (
                status(0, Some(0)),
                Status::Warn,
                "nodegate/nodegate-agent: 0/0 available: scheduled on no node",
            ),
            (
                Read::Missing,
                Status::Fail,
                "DaemonSet nodegate/nodegate-agent not found: nothing removes the taint, nodes stay unschedulable",
            ),
            (
                Read::Unreadable("403".into()),
                Status::Skip,
                "cannot read DaemonSet nodegate/nodegate-agent: 403",
            ),
        ];
        for (read, want, detail) in rows {
            assert_eq!(
                verdict("nodegate", "nodegate-agent", &read),
                (want, detail.to_string())
            );
        }
    }
}
