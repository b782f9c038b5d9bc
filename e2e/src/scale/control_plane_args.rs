//! The command lines of the scale harness's control plane: the flags it
//! shares with the real-nodes harness (`e2e/control-plane/*.flags`) filled
//! with this run's layout, plus the extras only 1,000 simulated nodes need.
//! Pure: [`super::control_plane`] writes the files and starts the processes.

use std::net::IpAddr;
use std::path::PathBuf;

use crate::control_plane_flags as shared;

/// What differs per run: the placeholders of the shared flags.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The state directory: etcd's data, the kubeconfigs, the audit policy,
    /// `pki/` and `log/`.
    pub dir: PathBuf,
    pub api_ip: IpAddr,
    pub api_port: u16,
    pub etcd_port: u16,
    pub etcd_peer_port: u16,
}

impl Layout {
    /// Where the certificates and keys the flags name are written.
    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }

    fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("STATE", self.dir.display().to_string()),
            ("PKI", self.pki().display().to_string()),
            ("LOG", self.log().display().to_string()),
            ("ETCD_NAME", "scale".into()),
            ("ETCD_PORT", self.etcd_port.to_string()),
            ("ETCD_PEER_PORT", self.etcd_peer_port.to_string()),
            ("API_IP", self.api_ip.to_string()),
            ("API_PORT", self.api_port.to_string()),
        ]
    }

    fn values_with_port(&self, secure_port: u16) -> Vec<(&'static str, String)> {
        let mut v = self.values();
        v.push(("SECURE_PORT", secure_port.to_string()));
        v
    }
}

pub fn etcd(l: &Layout) -> anyhow::Result<Vec<String>> {
    let mut args = shared::render(shared::ETCD, &l.values())?;
    // Only 1,000 nodes write this much: the default 2 GiB quota is reached
    // by no run here; the history of 1,000 Leases renewed every 10 s is
    // compacted by the API server every 5 min.
    args.push("--quota-backend-bytes=8589934592".into());
    Ok(args)
}

/// The shared flags alone: no real kubelet to dial, no container to admit.
pub fn kube_apiserver(l: &Layout) -> anyhow::Result<Vec<String>> {
    Ok(shared::render(shared::KUBE_APISERVER, &l.values())?)
}

pub fn kube_controller_manager(
    l: &Layout,
    secure_port: u16,
    qps: u32,
) -> anyhow::Result<Vec<String>> {
    let mut args = shared::render(
        shared::KUBE_CONTROLLER_MANAGER,
        &l.values_with_port(secure_port),
    )?;
    args.extend(client_limits(qps));
    Ok(args)
}

pub fn kube_scheduler(l: &Layout, secure_port: u16, qps: u32) -> anyhow::Result<Vec<String>> {
    let mut args = shared::render(shared::KUBE_SCHEDULER, &l.values_with_port(secure_port))?;
    args.extend(client_limits(qps));
    Ok(args)
}

/// A controller's client limits; none (the component's defaults) for 0.
/// Only a storm of 1,000 nodes outruns the defaults: the DaemonSet
/// controller creates about 20 Pods a second at 20 QPS.
fn client_limits(qps: u32) -> Vec<String> {
    if qps == 0 {
        return Vec::new();
    }
    vec![
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={qps}"),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn layout() -> Layout {
        Layout {
            dir: "/s".into(),
            api_ip: "10.215.0.1".parse().unwrap(),
            api_port: 6443,
            etcd_port: 2379,
            etcd_peer_port: 2380,
        }
    }

    /// `args` as a set, with no flag given twice.
    fn set(args: Vec<String>) -> BTreeSet<String> {
        let n = args.len();
        let s: BTreeSet<String> = args.into_iter().collect();
        assert_eq!(s.len(), n, "a flag given twice");
        s
    }

    fn want(flags: &[&str]) -> BTreeSet<String> {
        flags.iter().map(|f| f.to_string()).collect()
    }

    // The expected sets are the command lines this harness built before the
    // flags moved to e2e/control-plane/, for the same values.

    #[test]
    fn etcd_is_started_as_before() {
        assert_eq!(
            set(etcd(&layout()).unwrap()),
            want(&[
                "--data-dir=/s/etcd",
                "--name=scale",
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=scale=http://127.0.0.1:2380",
                "--quota-backend-bytes=8589934592",
            ])
        );
    }

    #[test]
    fn kube_apiserver_is_started_as_before() {
        assert_eq!(
            set(kube_apiserver(&layout()).unwrap()),
            want(&[
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=10.215.0.1",
                "--advertise-address=10.215.0.1",
                "--secure-port=6443",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--client-ca-file=/s/pki/ca.crt",
                "--tls-cert-file=/s/pki/apiserver.crt",
                "--tls-private-key-file=/s/pki/apiserver.key",
                "--service-account-key-file=/s/pki/sa.pub",
                "--service-account-signing-key-file=/s/pki/sa.key",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--enable-aggregator-routing=true",
                "--profiling=false",
                "--audit-policy-file=/s/audit-policy.yaml",
                "--audit-log-path=/s/log/audit.log",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
            ])
        );
    }

    #[test]
    fn kube_controller_manager_is_started_as_before() {
        let common = [
            "--kubeconfig=/s/kcm.kubeconfig",
            "--authentication-kubeconfig=/s/kcm.kubeconfig",
            "--authorization-kubeconfig=/s/kcm.kubeconfig",
            "--service-account-private-key-file=/s/pki/sa.key",
            "--root-ca-file=/s/pki/ca.crt",
            "--use-service-account-credentials",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=10257",
            "--service-cluster-ip-range=10.96.0.0/16",
        ];
        let limited = [&common[..], &["--kube-api-qps=100", "--kube-api-burst=100"]].concat();
        let l = layout();
        assert_eq!(
            set(kube_controller_manager(&l, 10257, 100).unwrap()),
            want(&limited)
        );
        assert_eq!(
            set(kube_controller_manager(&l, 10257, 0).unwrap()),
            want(&common)
        );
    }

    #[test]
    fn kube_scheduler_is_started_as_before() {
        let common = [
            "--kubeconfig=/s/scheduler.kubeconfig",
            "--authentication-kubeconfig=/s/scheduler.kubeconfig",
            "--authorization-kubeconfig=/s/scheduler.kubeconfig",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=10259",
        ];
        let limited = [&common[..], &["--kube-api-qps=50", "--kube-api-burst=50"]].concat();
        let l = layout();
        assert_eq!(set(kube_scheduler(&l, 10259, 50).unwrap()), want(&limited));
        assert_eq!(set(kube_scheduler(&l, 10259, 0).unwrap()), want(&common));
    }
}
