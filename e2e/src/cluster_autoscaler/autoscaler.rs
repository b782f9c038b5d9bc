//! The real Cluster Autoscaler as a child process with its KWOK cloud
//! provider (`KWOK_PROVIDER_MODE=local`): one node group, `ca-e2e`, whose
//! Nodes CA creates from a template in the `kwok-provider-templates`
//! ConfigMap; its release (read from the binary, or `--ca-version`) and the
//! flag that declares a taint in it; the Deployment object that says how it
//! runs (for nodegate-check); and the status CA writes every loop.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::scale::control_plane::Proc;
use crate::scale::install::kubectl;

/// CA's namespace (its `--namespace`, the KWOK provider's `POD_NAMESPACE`).
pub const NAMESPACE: &str = "kube-system";
/// The label the KWOK provider groups Nodes by (`fromNodeLabelKey`).
pub const GROUP_LABEL: &str = "nodegate.dev/ca-e2e-group";
/// The node group.
pub const GROUP: &str = "ca-e2e";
/// The annotation the KWOK provider marks its Nodes' group with.
pub const GROUP_ANNOTATION: &str = "cluster-autoscaler.kwok.nodegroup/name";
/// The node group's maximum size: bounds what duplicates can cost here.
pub const MAX_GROUP_SIZE: usize = 24;
/// The status CA writes at the end of every loop.
pub const STATUS_CONFIGMAP: &str = "cluster-autoscaler-status";
/// The image of the Deployment object, less its tag `v<CA's release>`
/// (nothing pulls it: replicas 0).
pub const IMAGE_REPO: &str = "registry.k8s.io/autoscaling/cluster-autoscaler";
/// The Deployment nodegate-check reads.
pub const DEPLOYMENT: &str = "cluster-autoscaler";
/// What every Node of the group has, as the simulated kubelet reports it.
pub const NODE_CPU_MILLI: u64 = 8000;

/// The KWOK provider's configuration: templates from the ConfigMap, groups
/// by [`GROUP_LABEL`], no taint of its own (`skipTaint`), so the only taints
/// on its Nodes are the API server's and nodegate's.
const KWOK_CONFIG: &str = r#"apiVersion: v1alpha1
readNodesFrom: configmap
nodegroups:
  fromNodeLabelKey: "nodegate.dev/ca-e2e-group"
nodes:
  skipTaint: true
configmap:
  name: kwok-provider-templates
"#;

/// The group's template: the simulated kubelet's capacity; no hostname
/// label (a template carries none); `Ready=False` as a kubelet registering,
/// until the kubelet of the Node reports.
fn template() -> String {
    let resources =
        json!({"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": GROUP,
            "annotations": {
                "cluster-autoscaler.kwok.nodegroup/max-count": MAX_GROUP_SIZE.to_string(),
            },
            "labels": {
                GROUP_LABEL: GROUP,
                "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                            "message": "registering"}],
        },
    });
    json!({"apiVersion": "v1", "kind": "List", "items": [node]}).to_string()
}

/// Both ConfigMaps the KWOK provider reads at start.
pub fn configure(kubeconfig: &Path) -> anyhow::Result<()> {
    let cms = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kwok-provider-config", "namespace": NAMESPACE},
         "data": {"config": KWOK_CONFIG}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kwok-provider-templates", "namespace": NAMESPACE},
         "data": {"templates": template()}},
    ]});
    kubectl(
        kubeconfig,
        &["apply", "--server-side", "-f", "-"],
        Some(&cms.to_string()),
    )?;
    Ok(())
}

/// A Cluster Autoscaler release, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CaVersion(pub u32, pub u32, pub u32);

impl CaVersion {
    /// The release in a CA log: the line `Cluster Autoscaler <x.y.z>` that
    /// `main()` logs at `--v=1` (`main.go`, every release from 1.28 to 1.31).
    pub fn from_log(log: &str) -> Option<Self> {
        const MARK: &str = "Cluster Autoscaler ";
        log.lines().find_map(|l| {
            let rest = &l[l.find(MARK)? + MARK.len()..];
            rest.split_whitespace().next()?.parse().ok()
        })
    }
}

impl FromStr for CaVersion {
    type Err = String;

    /// `1.31.5` or `v1.31.5`; a build suffix (`-gke.100`, `+abc`) is
    /// ignored.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a CA release x.y.z (e.g. 1.31.5)");
        let core = s.trim().strip_prefix('v').unwrap_or(s.trim());
        let core = core.split(['-', '+']).next().unwrap_or_default();
        let mut parts = core.split('.').map(|p| {
            (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse::<u32>().ok())
                .flatten()
        });
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Some(a)), Some(Some(b)), Some(Some(c)), None) => Ok(Self(a, b, c)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for CaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The first release with `--startup-taint`: release-1.29's `main.go`
/// defines it beside `--ignore-taint` (deprecated there, and equivalent);
/// release-1.28's defines only `--ignore-taint`, and CA exits at start on a
/// flag it does not define.
pub const STARTUP_TAINT_SINCE: CaVersion = CaVersion(1, 29, 0);

/// The flag that makes a taint key a startup taint to CA `version`.
pub fn declare_flag(version: CaVersion) -> &'static str {
    if version >= STARTUP_TAINT_SINCE {
        "startup-taint"
    } else {
        "ignore-taint"
    }
}

/// The first release with the KWOK cloud provider
/// (`cloudprovider/kwok` first appears in release-1.29).
pub const KWOK_SINCE: CaVersion = CaVersion(1, 29, 0);

/// The Deployment object's image for CA `version`.
pub fn image(version: CaVersion) -> String {
    format!("{IMAGE_REPO}:v{version}")
}

/// The arguments that make CA log its release and exit at once, touching
/// nothing: `main()` logs `Cluster Autoscaler <version>` at `--v=1` before
/// it reads its kubeconfig, and exits (`Failed to build config`) on one
/// that cannot exist. CA has no `--version` flag (release-1.28 to 1.31
/// `main.go`): pflag rejects it with the usage and exit 2.
const PROBE_ARGS: [&str; 3] = [
    "--v=1",
    "--kubeconfig=/dev/null/kubeconfig",
    "--address=127.0.0.1:0",
];

/// CA's release as the binary `bin` says it.
pub async fn binary_version(bin: &Path) -> anyhow::Result<CaVersion> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(PROBE_ARGS)
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "{} {} did not exit in 30 s",
                bin.display(),
                PROBE_ARGS.join(" ")
            )
        })??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    CaVersion::from_log(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} {} logged no 'Cluster Autoscaler <x.y.z>' line (pass --ca-version): {}",
            bin.display(),
            PROBE_ARGS.join(" "),
            text.lines().take(3).collect::<Vec<_>>().join(" | ")
        )
    })
}

/// CA's flags: the KWOK provider, the defaults the scenarios depend on
/// spelt out, and the declaration `version` takes ([`declare_flag`]) for
/// each of `startup_taints`. Leader election is off (one replica, and a
/// restart must not wait for the old lease); the metrics port is any free
/// one.
pub fn args(kubeconfig: &Path, version: CaVersion, startup_taints: &[&str]) -> Vec<String> {
    let mut a = vec![
        "--cloud-provider=kwok".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--namespace={NAMESPACE}"),
        "--scan-interval=10s".into(),
        "--max-node-provision-time=15m".into(),
        "--leader-elect=false".into(),
        "--address=127.0.0.1:0".into(),
        "--v=4".into(),
    ];
    a.extend(
        startup_taints
            .iter()
            .map(|k| format!("--{}={k}", declare_flag(version))),
    );
    a
}

/// The Deployment that says how CA runs: replicas 0 (the process here is
/// what runs), the upstream image of CA's `version` and its command, and
/// the same args as the process, so nodegate-check reads what actually
/// runs.
pub fn publish(kubeconfig: &Path, version: CaVersion, args: &[String]) -> anyhow::Result<()> {
    let labels = json!({"app.kubernetes.io/name": DEPLOYMENT});
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": DEPLOYMENT, "image": image(version),
                    "command": ["./cluster-autoscaler"], "args": args,
                    "env": [{"name": "POD_NAMESPACE", "value": NAMESPACE},
                            {"name": "KWOK_PROVIDER_MODE", "value": "local"}],
                }]},
            },
        },
    });
    kubectl(
        kubeconfig,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&d.to_string()),
    )?;
    Ok(())
}

/// The running CA.
#[derive(Debug)]
pub struct Autoscaler {
    proc: Proc,
}

impl Autoscaler {
    /// Starts `bin` with `args` as the admin (`kubeconfig`); its log is
    /// `<log_dir>/<name>.log`.
    pub fn start(
        bin: &Path,
        name: &str,
        log_dir: &Path,
        kubeconfig: &Path,
        args: &[String],
    ) -> anyhow::Result<Self> {
        let proc = Proc::spawn(
            name,
            log_dir,
            bin,
            args,
            &[
                ("KUBECONFIG", kubeconfig.display().to_string()),
                ("KWOK_PROVIDER_MODE", "local".into()),
                ("POD_NAMESPACE", NAMESPACE.into()),
            ],
        )?;
        Ok(Self { proc })
    }

    /// SIGTERM: CA deletes every Node its KWOK provider made, then exits.
    pub async fn stop(self) {
        self.proc.stop(Duration::from_secs(60)).await;
    }
}

/// One status CA wrote.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the harness saw it.
    pub seen: Instant,
    /// The start of the loop that wrote it (CA's `time`).
    pub loop_start: Option<Timestamp>,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
    pub ready: u64,
    pub unready: u64,
    pub not_started: u64,
    pub registered: u64,
    /// The cluster-wide scale-up condition (`InProgress`, `NoActivity`…).
    pub scale_up: String,
}

/// Every status CA wrote, as watched.
pub type Statuses = Arc<Mutex<Vec<Sample>>>;

/// CA's `time`: `2023-11-24 04:28:19.546750398 +0000 UTC` (Go's
/// `2006-01-02 15:04:05.999999999 -0700 MST`).
pub fn parse_time(s: &str) -> Option<Timestamp> {
    let mut it = s.split_whitespace();
    let (date, time, off) = (it.next()?, it.next()?, it.next()?);
    if off.len() != 5 {
        return None;
    }
    let off = format!("{}:{}", &off[..3], &off[3..]);
    format!("{date}T{time}{off}").parse().ok()
}

fn sample(cm: &ConfigMap) -> Option<Sample> {
    let text = cm.data.as_ref()?.get("status")?;
    let v: Value = serde_yaml::from_str(text).ok()?;
    let health = &v["clusterWide"]["health"];
    let reg = &health["nodeCounts"]["registered"];
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    Some(Sample {
        seen: Instant::now(),
        loop_start: v["time"].as_str().and_then(parse_time),
        health: health["status"].as_str().unwrap_or_default().to_string(),
        ready: n(&reg["ready"]),
        unready: n(&reg["unready"]["total"]),
        not_started: n(&reg["notStarted"]),
        registered: n(&reg["total"]),
        scale_up: v["clusterWide"]["scaleUp"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

/// Watches CA's status ConfigMap until the process ends.
pub fn watch_status(admin: Client) -> (Statuses, JoinHandle<()>) {
    let out: Statuses = Arc::default();
    let rec = out.clone();
    let task = tokio::spawn(async move {
        let api: Api<ConfigMap> = Api::namespaced(admin, NAMESPACE);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={STATUS_CONFIGMAP}"));
        let stream = watcher(api, cfg).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(cm) => {
                    if let Some(s) = sample(&cm) {
                        rec.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "status watch"),
            }
        }
    });
    (out, task)
}

/// Every status seen.
pub fn all(statuses: &Statuses) -> Vec<Sample> {
    statuses.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The statuses seen since `since`.
pub fn since(statuses: &Statuses, since: Instant) -> Vec<Sample> {
    statuses
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|s| s.seen >= since)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parse() {
        assert_eq!("1.31.5".parse(), Ok(CaVersion(1, 31, 5)));
        assert_eq!("v1.28.7".parse(), Ok(CaVersion(1, 28, 7)));
        assert_eq!(" 1.29.0-gke.100 ".parse(), Ok(CaVersion(1, 29, 0)));
        assert_eq!("1.30.10+abc".parse(), Ok(CaVersion(1, 30, 10)));
        for bad in [
            "", "1.31", "1.31.5.1", "1..5", "v", "x.y.z", "1.31.-5", "1.31.5x",
        ] {
            assert!(bad.parse::<CaVersion>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(CaVersion(1, 31, 5).to_string(), "1.31.5");
    }

    #[test]
    fn version_from_log() {
        // What 1.31.5 logs for PROBE_ARGS.
        let log = "I1129 11:10:31.649840    1670 main.go:677] Cluster Autoscaler 1.31.5\n\
                   I1129 11:10:31.650082    1670 client.go:48] Using kubeconfig file: /dev/null/kubeconfig\n\
                   F1129 11:10:31.650106    1670 client.go:52] Failed to build config: stat /dev/null/kubeconfig: not a directory\n";
        assert_eq!(CaVersion::from_log(log), Some(CaVersion(1, 31, 5)));
        // The usage pflag prints for an unknown flag names releases but
        // has no such line.
        let usage = "unknown flag: --version\nUsage of cluster-autoscaler:\n      --max-empty-bulk-delete int  deprecated in k8s version 1.29.0\n";
        assert_eq!(CaVersion::from_log(usage), None);
        assert_eq!(CaVersion::from_log("Cluster Autoscaler \n"), None);
    }

    #[test]
    fn declaration_follows_the_release() {
        assert_eq!(declare_flag(CaVersion(1, 28, 7)), "ignore-taint");
        assert_eq!(declare_flag(CaVersion(1, 27, 0)), "ignore-taint");
        assert_eq!(declare_flag(CaVersion(1, 29, 0)), "startup-taint");
        assert_eq!(declare_flag(CaVersion(1, 31, 5)), "startup-taint");
        assert_eq!(declare_flag(CaVersion(2, 0, 0)), "startup-taint");
        let kc = Path::new("/k");
        let key = "nodegate.dev/agent-not-ready";
        let a = args(kc, CaVersion(1, 31, 5), &[key]);
        assert_eq!(
            a.last().map(String::as_str),
            Some("--startup-taint=nodegate.dev/agent-not-ready")
        );
        assert!(!a.iter().any(|x| x.starts_with("--ignore-taint")));
        let a = args(kc, CaVersion(1, 28, 7), &[key]);
        assert_eq!(
            a.last().map(String::as_str),
            Some("--ignore-taint=nodegate.dev/agent-not-ready")
        );
        assert!(!a.iter().any(|x| x.starts_with("--startup-taint")));
        let a = args(kc, CaVersion(1, 31, 5), &[]);
        assert!(!a.iter().any(|x| x.contains("taint")));
    }

    /// A stand-in binary that answers PROBE_ARGS as `body` says.
    fn stub(dir: &Path, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("cluster-autoscaler");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write the stub");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    #[tokio::test]
    async fn version_from_the_binary() {
        let dir = tempfile::tempdir().expect("a temp dir");
        // As CA does for PROBE_ARGS: the line on stderr, then exit 255;
        // the stub answers only for exactly those arguments.
        let ca = stub(
            dir.path(),
            r#"[ "$*" = "--v=1 --kubeconfig=/dev/null/kubeconfig --address=127.0.0.1:0" ] || exit 2
echo 'I1129 11:10:31.649840 1 main.go:649] Cluster Autoscaler 1.30.7' >&2
echo 'F1129 11:10:31.650106 1 client.go:52] Failed to build config' >&2
exit 255"#,
        );
        assert_eq!(
            binary_version(&ca).await.expect("a version"),
            CaVersion(1, 30, 7)
        );
        let ca = stub(dir.path(), "echo 'unknown flag: --v' >&2; exit 2");
        let e = binary_version(&ca).await.expect_err("no version line");
        assert!(e.to_string().contains("--ca-version"), "{e}");
    }

    #[test]
    fn image_tag_is_the_release() {
        assert_eq!(
            image(CaVersion(1, 31, 5)),
            "registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5"
        );
        assert_eq!(
            image(CaVersion(1, 28, 7)),
            "registry.k8s.io/autoscaling/cluster-autoscaler:v1.28.7"
        );
    }

    #[test]
    fn ca_time() {
        let t = parse_time("2023-11-24 04:28:19.546750398 +0000 UTC").expect("parses");
        assert_eq!(t.to_string(), "2023-11-24T04:28:19.546750398Z");
        assert!(parse_time("garbage").is_none());
    }

    #[test]
    fn status_sample() {
        let cm: ConfigMap = serde_json::from_value(json!({"data": {"status":
            "time: \"2023-11-24 04:28:19.546750398 +0000 UTC\"\nclusterWide:\n  health:\n    status: \"Unhealthy\"\n    nodeCounts:\n      registered:\n        total: 10\n        ready: 4\n        notStarted: 3\n        unready:\n          total: 2\n  scaleUp:\n    status: \"NoActivity\"\n"}}))
        .expect("a ConfigMap");
        let s = sample(&cm).expect("a sample");
        assert_eq!(s.health, "Unhealthy");
        assert_eq!(
            (s.ready, s.unready, s.not_started, s.registered),
            (4, 2, 3, 10)
        );
        assert_eq!(s.scale_up, "NoActivity");
        assert!(s.loop_start.is_some());
    }
}
