//! Cluster Autoscaler and nodegate's gates (kubernetes/autoscaler
//! `cluster-autoscaler/`):
//!
//! - A Ready node whose taint CA does not know is neither unready nor
//!   upcoming (`clusterstate/clusterstate.go` `updateReadinessStats`): the
//!   pending pods do not fit it, and the next 10 s loop scales up again.
//! - `core/static_autoscaler.go` `obtainNodeLists` →
//!   `FilterOutNodesWithStartupTaints` turns a Ready node carrying a startup
//!   taint into an unready copy: upcoming, so no second scale-up.
//! - `utils/taints/taints.go` `NewTaintConfig`, `IsStartupTaint`: a startup
//!   taint is a key given to `--startup-taint` or `--ignore-taint` (compared
//!   by key alone), or a key under `startup-taint.cluster-autoscaler.kubernetes.io/`
//!   or `ignore-taint.cluster-autoscaler.kubernetes.io/`; from 1.36 also under a
//!   `--startup-taint-prefix`. `--status-taint` keys are only sanitized out of
//!   templates: the node still counts as Ready, so they do not stop duplicates.
//! - Managed CAs (GKE, AKS) take no flags: only a key under the startup
//!   prefix works there. CA writes its status to ConfigMap
//!   `kube-system/cluster-autoscaler-status`, so that ConfigMap without a CA
//!   Deployment in the cluster means a managed CA.
//!
//! [`verdict`] decides from what was read; [`check`] only reads.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ListParams};

use crate::cilium::OPERATOR_DEFAULT_KEY as CILIUM_KEY;
use crate::gates::{Gate, image_name, image_version, keys};
use crate::installed::Installed;
use crate::report::{Report, Status};

pub const CHECK: &str = "cluster autoscaler";
pub const STARTUP_PREFIX: &str = "startup-taint.cluster-autoscaler.kubernetes.io/";
const IGNORE_PREFIX: &str = "ignore-taint.cluster-autoscaler.kubernetes.io/";
const STATUS_PREFIX: &str = "status-taint.cluster-autoscaler.kubernetes.io/";
/// `--startup-taint-prefix` is a flag from this release on.
const PREFIX_FLAG_SINCE: (u64, u64, u64) = (1, 36, 0);

/// One CA Deployment: its container's image and command line.
#[derive(Debug, Clone, Default)]
pub struct Autoscaler {
    /// `namespace/name`.
    pub at: String,
    pub image: String,
    /// The container's command and args, in that order.
    pub argv: Vec<String>,
}

/// What was found of Cluster Autoscaler.
#[derive(Debug, Clone)]
pub enum Found {
    Deployments(Vec<Autoscaler>),
    /// No Deployment, but CA's status ConfigMap (`namespace/name`).
    Managed(String),
    None,
    Unreadable(String),
}

/// What [`verdict`] decides on.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub found: Found,
    /// nodegate's gates; `None` when its flags could not be read.
    pub gates: Option<Vec<Gate>>,
    /// `namespace/name` of CA's status ConfigMap, for the lines.
    pub status_config_map: String,
}

/// The taint flags CA runs with, as its pflag command line reads them
/// (`--flag=value` or `--flag value`, `_` and `-` alike; each value one key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaintFlags {
    pub startup: Vec<String>,
    pub status: Vec<String>,
    pub prefixes: Vec<String>,
    /// Values nodegate-check cannot read (an unexpanded `$(VAR)`).
    pub unreadable: Vec<String>,
}

pub fn taint_flags(argv: &[String]) -> TaintFlags {
    let mut f = TaintFlags::default();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let Some(flag) = a.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.replace('_', "-"), Some(v.to_string())),
            None => (flag.replace('_', "-"), None),
        };
        let list = match name.as_str() {
            "startup-taint" | "ignore-taint" => &mut f.startup,
            "status-taint" => &mut f.status,
            "startup-taint-prefix" => &mut f.prefixes,
            _ => continue,
        };
        let Some(v) = value.or_else(|| it.next().cloned()) else {
            continue;
        };
        if v.contains("$(") {
            f.unreadable.push(format!("--{name}={v}"));
        } else {
            list.push(v);
        }
    }
    f
}

/// How CA treats one of nodegate's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Treats {
    Startup(String),
    /// Only as a status taint: still Ready, still room.
    Status,
    /// Given to `--startup-taint` as a whole taint (`key=value:Effect`),
    /// which CA compares with keys: it never matches.
    WrittenAsTaint(String),
    Unknown,
}

fn treats(key: &str, f: &TaintFlags, version: Option<(u64, u64, u64)>) -> Treats {
    if f.startup.iter().any(|k| k == key) {
        return Treats::Startup(format!("--startup-taint={key}"));
    }
    for p in [STARTUP_PREFIX, IGNORE_PREFIX] {
        if key.starts_with(p) {
            return Treats::Startup(format!("its key is under {p}"));
        }
    }
    let prefix_flag = version.is_none_or(|v| v >= PREFIX_FLAG_SINCE);
    if let Some(p) = f
        .prefixes
        .iter()
        .find(|p| !p.is_empty() && key.starts_with(p.as_str()))
        && prefix_flag
    {
        return Treats::Startup(format!("--startup-taint-prefix={p}"));
    }
    if let Some(w) = f
        .startup
        .iter()
        .find(|k| k.split(['=', ':']).next() == Some(key) && k.as_str() != key)
    {
        return Treats::WrittenAsTaint(w.clone());
    }
    if f.status.iter().any(|k| k == key) || key.starts_with(STATUS_PREFIX) {
        return Treats::Status;
    }
    Treats::Unknown
}

fn one_deployment(a: &Autoscaler, keys: &[&str]) -> (Status, String) {
    let f = taint_flags(&a.argv);
    let version = image_version(&a.image);
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for key in keys {
        match treats(key, &f, version) {
            Treats::Startup(how) => ok.push(format!("{key} ({how})")),
            Treats::Status => bad.push(format!(
                "{key} is only a status taint to it (--status-taint), which is sanitized out of templates but leaves a gated node Ready: pods do not fit it and each 10 s loop scales up again; use --startup-taint={key} instead"
            )),
            Treats::WrittenAsTaint(w) => bad.push(format!(
                "--startup-taint={w} is a whole taint, but CA reads a key there and compares keys: write --startup-taint={key}"
            )),
            Treats::Unknown => bad.push(format!(
                "it does not treat nodegate's gate {key} as a startup taint: a node stays gated after it turns Ready, the pending pods do not fit it, and each 10 s loop scales up again (duplicate nodes, which stay at least --scale-down-unneeded-time, 10 min by default); add --startup-taint={key} to its args"
            )),
        }
    }
    let at = &a.at;
    if bad.is_empty() {
        let mut detail = format!(
            "{at} treats nodegate's gates as startup taints: {}; a gated node counts as starting up, not as room for pods (a reboot wave that gates more than 45 % of nodes, and more than 3, pauses CA until they are ready: docs/autoscalers.md)",
            ok.join(", ")
        );
        if !f.unreadable.is_empty() {
            detail.push_str(&format!("; not read: {}", f.unreadable.join(" ")));
        }
        return (Status::Pass, detail);
    }
    let mut why = vec![format!("{at}: {}", bad.join("; "))];
    if f.startup.iter().any(|k| k == CILIUM_KEY) && !keys.contains(&CILIUM_KEY) {
        why.push(format!(
            "it names Cilium's key {CILIUM_KEY} only, but nodegate gates with its own key"
        ));
    }
    if !f.unreadable.is_empty() {
        why.push(format!(
            "nodegate-check cannot expand {}: if that is the fix already, ignore this line",
            f.unreadable.join(" ")
        ));
    }
    (Status::Fail, why.join("; "))
}

/// The Cluster Autoscaler line.
pub fn verdict(i: &Inputs) -> (Status, String) {
    let Some(gates) = &i.gates else {
        return (
            Status::Skip,
            "cannot tell which taints nodegate adds: neither the webhook StatefulSet's nor the agent DaemonSet's flags could be read (see above)".into(),
        );
    };
    let keys = keys(gates);
    match &i.found {
        Found::None => (
            Status::Pass,
            format!(
                "no Cluster Autoscaler: no Deployment runs its image and there is no ConfigMap {}",
                i.status_config_map
            ),
        ),
        Found::Unreadable(e) => (
            Status::Warn,
            format!(
                "cannot tell whether Cluster Autoscaler runs ({e}): if it does, it must treat {} as startup taints (docs/autoscalers.md)",
                keys.join(", ")
            ),
        ),
        Found::Managed(cm) => {
            let outside: Vec<&&str> = keys
                .iter()
                .filter(|k| !k.starts_with(STARTUP_PREFIX))
                .collect();
            if outside.is_empty() {
                (
                    Status::Pass,
                    format!(
                        "a managed Cluster Autoscaler runs here (ConfigMap {cm}, no Deployment): nodegate's keys are under {STARTUP_PREFIX}, so it treats them as startup taints without a flag"
                    ),
                )
            } else {
                let shown: Vec<String> = outside.iter().map(|k| k.to_string()).collect();
                (
                    Status::Fail,
                    format!(
                        "a managed Cluster Autoscaler runs here (ConfigMap {cm}, no Deployment) and its flags cannot be set, so it does not treat nodegate's gate {} as a startup taint: each 10 s loop while a new node is gated scales up again; use the cluster-autoscaler key profile (a key under {STARTUP_PREFIX}: manifests/components/key-profiles/cluster-autoscaler, docs/autoscalers.md)",
                        shown.join(", ")
                    ),
                )
            }
        }
        Found::Deployments(list) => {
            let lines: Vec<(Status, String)> =
                list.iter().map(|a| one_deployment(a, &keys)).collect();
            let status = if lines.iter().any(|(s, _)| *s == Status::Fail) {
                Status::Fail
            } else {
                Status::Pass
            };
            let detail: Vec<String> = lines.into_iter().map(|(_, d)| d).collect();
            (status, detail.join(" | "))
        }
    }
}

/// The CA container of a Deployment: its image's name is
/// `…/cluster-autoscaler`, or its command runs a `cluster-autoscaler`.
fn autoscaler(d: &Deployment) -> Option<Autoscaler> {
    let spec = d.spec.as_ref()?.template.spec.as_ref()?;
    let is_ca = |s: &str| s == "cluster-autoscaler" || s.ends_with("/cluster-autoscaler");
    let c = spec.containers.iter().find(|c| {
        c.image.as_deref().is_some_and(|i| is_ca(image_name(i)))
            || c.command.iter().flatten().next().is_some_and(|s| is_ca(s))
    })?;
    Some(Autoscaler {
        at: format!(
            "{}/{}",
            d.metadata.namespace.as_deref().unwrap_or_default(),
            d.metadata.name.as_deref().unwrap_or_default()
        ),
        image: c.image.clone().unwrap_or_default(),
        argv: c
            .command
            .iter()
            .flatten()
            .chain(c.args.iter().flatten())
            .cloned()
            .collect(),
    })
}

/// Lists every Deployment (one request; CA's chart names and labels it
/// after the cloud provider, so no selector finds them all) and, without a
/// CA among them, reads CA's status ConfigMap.
async fn read(client: &Client, status_cm: &str) -> Found {
    let api: Api<Deployment> = Api::all(client.clone());
    let found: Vec<Autoscaler> = match api.list(&ListParams::default()).await {
        Ok(l) => l.items.iter().filter_map(autoscaler).collect(),
        Err(e) => return Found::Unreadable(format!("Deployments cannot be listed: {e}")),
    };
    if !found.is_empty() {
        return Found::Deployments(found);
    }
    let (ns, name) = status_cm
        .split_once('/')
        .unwrap_or(("kube-system", status_cm));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match cms.get_opt(name).await {
        Ok(Some(_)) => Found::Managed(status_cm.to_string()),
        Ok(None) => Found::None,
        Err(e) => Found::Unreadable(format!("ConfigMap {status_cm} cannot be read: {e}")),
    }
}

/// Reads CA's Deployments (or its status ConfigMap, `status_cm`:
/// `namespace/name`) and reports [`verdict`].
pub async fn check(client: &Client, status_cm: &str, installed: &Installed, report: &mut Report) {
    let inputs = Inputs {
        found: read(client, status_cm).await,
        gates: crate::gates::installed(installed),
        status_config_map: status_cm.to_string(),
    };
    let (status, detail) = verdict(&inputs);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::TaintSpec;

    fn gates(specs: &[(&str, bool)]) -> Vec<Gate> {
        specs
            .iter()
            .map(|(s, boot)| Gate {
                taint: s.parse::<TaintSpec>().unwrap(),
                boot: *boot,
            })
            .collect()
    }

    const GATE: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";
    const KEY: &str = "nodegate.dev/agent-not-ready";

    fn deployment(image: &str, args: &[&str]) -> Autoscaler {
        Autoscaler {
            at: "kube-system/cluster-autoscaler".into(),
            image: image.into(),
            argv: std::iter::once("./cluster-autoscaler")
                .chain(args.iter().copied())
                .map(String::from)
                .collect(),
        }
    }

    fn run(found: Found, g: Vec<Gate>) -> (Status, String) {
        verdict(&Inputs {
            found,
            gates: Some(g),
            status_config_map: "kube-system/cluster-autoscaler-status".into(),
        })
    }

    const IMAGE: &str = "registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5";

    #[test]
    fn each_configuration_of_a_deployment() {
        let cases: &[(&[&str], Status, &str)] = &[
            (
                &["--cloud-provider=aws"],
                Status::Fail,
                "add --startup-taint=nodegate.dev/agent-not-ready",
            ),
            (
                &["--startup-taint=nodegate.dev/agent-not-ready"],
                Status::Pass,
                "--startup-taint=nodegate.dev/agent-not-ready",
            ),
            (
                &["--startup-taint", "nodegate.dev/agent-not-ready"],
                Status::Pass,
                "treats nodegate's gates as startup taints",
            ),
            (
                &["--ignore-taint=nodegate.dev/agent-not-ready"],
                Status::Pass,
                "startup taints",
            ),
            (
                &["--startup_taint=nodegate.dev/agent-not-ready"],
                Status::Pass,
                "startup taints",
            ),
            (
                &["--status-taint=nodegate.dev/agent-not-ready"],
                Status::Fail,
                "only a status taint",
            ),
            (
                &["--startup-taint=nodegate.dev/agent-not-ready=true:NoSchedule"],
                Status::Fail,
                "write --startup-taint=nodegate.dev/agent-not-ready",
            ),
            (
                &["--startup-taint=node.cilium.io/agent-not-ready"],
                Status::Fail,
                "names Cilium's key node.cilium.io/agent-not-ready only",
            ),
            (
                &["--startup-taint=$(GATE)"],
                Status::Fail,
                "cannot expand --startup-taint=$(GATE)",
            ),
        ];
        for (args, want, text) in cases {
            let (s, d) = run(
                Found::Deployments(vec![deployment(IMAGE, args)]),
                gates(&[(GATE, false)]),
            );
            assert_eq!(s, *want, "{args:?}: {d}");
            assert!(d.contains(text), "{args:?}: {d}");
        }
    }

    #[test]
    fn the_prefix_flag_counts_from_1_36() {
        let args = ["--startup-taint-prefix=nodegate.dev/"];
        let new = deployment(
            "registry.k8s.io/autoscaling/cluster-autoscaler:v1.36.0",
            &args,
        );
        assert_eq!(
            run(Found::Deployments(vec![new]), gates(&[(GATE, false)])).0,
            Status::Pass
        );
        let old = deployment(IMAGE, &args);
        assert_eq!(
            run(Found::Deployments(vec![old]), gates(&[(GATE, false)])).0,
            Status::Fail
        );
    }

    #[test]
    fn keys_under_the_startup_prefix_need_no_flag_and_status_ones_do_not_help() {
        let startup = "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoSchedule";
        let (s, d) = run(
            Found::Deployments(vec![deployment(IMAGE, &[])]),
            gates(&[(startup, false)]),
        );
        assert_eq!(s, Status::Pass, "{d}");
        let status = "status-taint.cluster-autoscaler.kubernetes.io/nodegate=true:NoSchedule";
        assert_eq!(
            run(
                Found::Deployments(vec![deployment(IMAGE, &[])]),
                gates(&[(status, false)])
            )
            .0,
            Status::Fail
        );
    }

    #[test]
    fn strict_modes_boot_gate_shares_the_key() {
        let boot = "nodegate.dev/agent-not-ready=true:NoExecute";
        let g = gates(&[(GATE, false), (boot, true)]);
        let d = deployment(IMAGE, &["--startup-taint=nodegate.dev/agent-not-ready"]);
        assert_eq!(run(Found::Deployments(vec![d]), g).0, Status::Pass);
    }

    #[test]
    fn a_managed_autoscaler_needs_the_startup_prefix() {
        let cm = || Found::Managed("kube-system/cluster-autoscaler-status".into());
        let (s, d) = run(cm(), gates(&[(GATE, false)]));
        assert_eq!(s, Status::Fail);
        assert!(d.contains("key-profiles/cluster-autoscaler"), "{d}");
        let startup = "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoSchedule";
        assert_eq!(run(cm(), gates(&[(startup, false)])).0, Status::Pass);
    }

    #[test]
    fn none_unreadable_and_one_bad_deployment_among_good_ones() {
        assert_eq!(run(Found::None, gates(&[(GATE, false)])).0, Status::Pass);
        assert_eq!(
            run(Found::Unreadable("403".into()), gates(&[(GATE, false)])).0,
            Status::Warn
        );
        let good = deployment(IMAGE, &["--startup-taint=nodegate.dev/agent-not-ready"]);
        let mut bad = deployment(IMAGE, &[]);
        bad.at = "other/ca".into();
        let (s, d) = run(Found::Deployments(vec![good, bad]), gates(&[(GATE, false)]));
        assert_eq!(s, Status::Fail);
        assert!(d.contains("other/ca: it does not treat"), "{d}");
        let no_gates = verdict(&Inputs {
            found: Found::None,
            gates: None,
            status_config_map: String::new(),
        });
        assert_eq!(no_gates.0, Status::Skip);
    }

    #[test]
    fn finds_the_autoscaler_by_image_or_command() {
        let d: Deployment = serde_yaml::from_str(
            "
metadata: {name: ca, namespace: kube-system}
spec:
  selector: {}
  template:
    spec:
      containers:
        - {name: sidecar, image: busybox}
        - name: aws-cluster-autoscaler
          image: registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5
          command: [./cluster-autoscaler, --cloud-provider=aws]
          args: [--startup-taint=nodegate.dev/agent-not-ready]
",
        )
        .unwrap();
        let a = autoscaler(&d).unwrap();
        assert_eq!(a.at, "kube-system/ca");
        assert_eq!(taint_flags(&a.argv).startup, vec![KEY.to_string()]);
        let other: Deployment = serde_yaml::from_str(
            "
metadata: {name: web, namespace: default}
spec:
  selector: {}
  template:
    spec:
      containers: [{name: web, image: nginx, command: [nginx]}]
",
        )
        .unwrap();
        assert!(autoscaler(&other).is_none());
    }
}
