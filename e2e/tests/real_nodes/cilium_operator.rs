//! The stand-in of cilium-operator as its chart runs it (a process with
//! its own ServiceAccount's token), and the API server's audit log read
//! for each one's Node writes: nodegate's and the operator's.

use std::process::{Child, Command, Stdio};

use k8s_openapi::jiff::Timestamp;
use nodegate_e2e::readme::repo_dir;
use nodegate_e2e::real_nodes::audit::node_writes;
use nodegate_e2e::real_nodes::harness::Harness;

use crate::cilium::CILIUM_NS;

const OPERATOR_USER: &str = "system:serviceaccount:kube-system:cilium-operator";

const NODEGATE_USERS: [&str; 2] = [
    "system:serviceaccount:nodegate:nodegate-agent",
    "system:serviceaccount:nodegate:nodegate-webhook",
];

/// The stand-in operator, a process on the host with its own
/// ServiceAccount's token, as the chart runs it with its own credentials.
pub(crate) struct Operator {
    child: Child,
}

impl Operator {
    pub(crate) fn start(h: &Harness) -> Operator {
        let dir = repo_dir().join("e2e/real-nodes/cilium");
        h.kubectl(&format!("apply -f {}", dir.display()));
        let token = h.kubectl(&format!(
            "-n {CILIUM_NS} create token cilium-operator --duration=4h"
        ));
        let kc = h.token_kubeconfig(&h.state.join("cilium-operator.kubeconfig"), token.trim());
        let log = std::fs::File::create(h.state.join("log/cilium-operator.log")).unwrap();
        let child = Command::new(repo_dir().join("target/debug/cilium-operator-standin"))
            .arg("--kubeconfig")
            .arg(&kc)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("cilium-operator-standin is built (cargo build -p nodegate-e2e --bins)");
        Operator { child }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Node writes (patch, update; main resource and status) from the API
/// server's audit log.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Writes {
    pub(crate) nodegate: u64,
    pub(crate) operator: u64,
    /// Writes of either that the API server refused (a failed `test`).
    pub(crate) refused: u64,
}

impl Writes {
    pub(crate) fn total(&self) -> u64 {
        self.nodegate + self.operator
    }
}

pub(crate) fn writes(h: &Harness, nodes: &[&str], from: Timestamp, to: Timestamp) -> Writes {
    let mut w = Writes::default();
    for e in node_writes(h, nodes, from, to) {
        if !e.is_change() {
            continue;
        }
        let counter = if e.user == OPERATOR_USER {
            &mut w.operator
        } else if NODEGATE_USERS.contains(&e.user.as_str()) {
            &mut w.nodegate
        } else {
            continue;
        };
        if e.ok() {
            *counter += 1;
        } else {
            w.refused += 1;
        }
    }
    w
}
