//! Cluster Autoscaler and nodegate's gates, per CA release
//! (kubernetes/autoscaler `cluster-autoscaler/`, branches
//! `cluster-autoscaler-release-1.28` … `-1.37`):
//!
//! - A Ready node whose taint CA does not know is neither unready nor
//!   upcoming (`clusterstate/clusterstate.go`
//!   `ClusterStateRegistry.updateReadinessStats`): the pending pods do not
//!   fit it, and the next 10 s loop scales up again.
//! - A Ready node carrying a startup taint becomes an unready copy, so it is
//!   upcoming and there is no second scale-up (`core/static_autoscaler.go`
//!   `obtainNodeLists` → `utils/taints/taints.go`
//!   `FilterOutNodesWithStartupTaints`; up to 1.28
//!   `FilterOutNodesWithIgnoredTaints`).
//! - What a startup taint is (`utils/taints/taints.go` `NewTaintConfig`,
//!   `IsStartupTaint`; flags in `main.go`, from 1.33 `config/flags/flags.go`),
//!   keys compared by key alone:
//!   - every release: a key given to `--ignore-taint`, or under
//!     `ignore-taint.cluster-autoscaler.kubernetes.io/` (deprecated from
//!     1.29, still there in 1.37);
//!   - from 1.29.0: a key given to `--startup-taint`, or under
//!     `startup-taint.cluster-autoscaler.kubernetes.io/`; 1.28 has neither
//!     flag nor prefix, and a flag a release does not define stops CA at
//!     start;
//!   - from 1.36.0: a key under a `--startup-taint-prefix`.
//!   - `--status-taint` keys and `status-taint.…/` (from 1.29) are only
//!     sanitized out of templates (`SanitizeTaints`): the node still counts
//!     as Ready, so they do not stop duplicates.
//! - A node that is not ready counts as starting (upcoming) while younger
//!   than `MaxNodeStartupTime`: a constant 15 min up to 1.34
//!   (`clusterstate/clusterstate.go`); from 1.35 the flag
//!   `--max-node-startup-time` (default 15m), which a node group may override
//!   (`processors/nodegroupconfig/node_group_config_processor.go`
//!   `GetMaxNodeStartupTime`). The agent's runtime signal assumes its own
//!   `--ca-max-node-startup-time` (15m): the line compares the two.
//! - CA writes its status to ConfigMap `kube-system/cluster-autoscaler-status`
//!   at the end of every loop (`StaticAutoscaler.RunOnce`, through
//!   `clusterstate/utils/status.go` `WriteStatusConfigMap`, which stamps the
//!   annotation `cluster-autoscaler.kubernetes.io/last-updated`) unless
//!   `--write-status-configmap=false`; `--status-config-map-name` and
//!   `--namespace` move it, and it is deleted only on a clean exit
//!   (`ExitCleanUp`). So that ConfigMap without a CA Deployment is a CA
//!   nodegate-check cannot see (a managed one, one in a Cluster API
//!   management cluster writing through `--kubeconfig`, a static pod), or a
//!   leftover of a CA that was killed.
//!
//! [`verdict`] decides from what was read; [`check`] only reads.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams};

use crate::cilium::OPERATOR_DEFAULT_KEY as CILIUM_KEY;
use crate::container_flags::container_flag;
use crate::gates::{Gate, Version, gate_names, image_name, key_shown, keys};
use crate::installed::Installed;
use crate::report::{Report, Status};

pub const CHECK: &str = "cluster autoscaler";
pub const STARTUP_PREFIX: &str = "startup-taint.cluster-autoscaler.kubernetes.io/";
pub const IGNORE_PREFIX: &str = "ignore-taint.cluster-autoscaler.kubernetes.io/";
const STATUS_PREFIX: &str = "status-taint.cluster-autoscaler.kubernetes.io/";
/// `--startup-taint`, `--status-taint` and their prefixes, from this release.
pub const STARTUP_SINCE: (u64, u64, u64) = (1, 29, 0);
/// `--startup-taint-prefix`, from this release.
const PREFIX_FLAG_SINCE: (u64, u64, u64) = (1, 36, 0);
/// The first release after the newest branch these verdicts were read from.
const NEWEST_READ: (u64, u64, u64) = (1, 38, 0);
/// `--max-node-startup-time`, from this release (a constant before).
const STARTUP_TIME_FLAG_SINCE: (u64, u64, u64) = (1, 35, 0);
/// `MaxNodeStartupTime`'s constant, and the flag's default.
pub const DEFAULT_MAX_NODE_STARTUP: Duration = Duration::from_secs(15 * 60);
/// The agent's flag that mirrors CA's `--max-node-startup-time`.
pub const AGENT_WINDOW_FLAG: &str = "ca-max-node-startup-time";
const AGENT_WINDOW_ENV: &str = "NODEGATE_CA_MAX_NODE_STARTUP_TIME";
/// A status ConfigMap not written for this long has no running CA behind
/// it: a running one rewrites it every loop (`--scan-interval`, 10 s).
const STALE_STATUS: Duration = Duration::from_secs(10 * 60);
/// The annotation `WriteStatusConfigMap` stamps.
const LAST_UPDATED: &str = "cluster-autoscaler.kubernetes.io/last-updated";

/// One CA Deployment: its container's image and command line.
#[derive(Debug, Clone, Default)]
pub struct Autoscaler {
    /// `namespace/name`.
    pub at: String,
    pub image: String,
    /// The container's command and args, in that order.
    pub argv: Vec<String>,
}

/// CA's status ConfigMap, found without a CA Deployment.
#[derive(Debug, Clone)]
pub struct StatusConfigMap {
    /// `namespace/name`.
    pub at: String,
    /// Since CA last wrote it; `None` when its annotation is missing or
    /// unreadable.
    pub written_ago: Option<Duration>,
}

/// What was found of Cluster Autoscaler.
#[derive(Debug, Clone)]
pub enum Found {
    Deployments(Vec<Autoscaler>),
    /// No Deployment, but CA's status ConfigMap.
    StatusOnly(StatusConfigMap),
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
    /// `--cluster-autoscaler-version`: overrides every image tag.
    pub version: Option<Version>,
    /// The agent's `--ca-max-node-startup-time`.
    pub agent_window: Duration,
}

/// The taint flags CA runs with, as its command line reads them
/// (`--flag=value` or `--flag value`, `_` and `-` alike; each value one key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaintFlags {
    pub startup: Vec<String>,
    pub ignore: Vec<String>,
    pub status: Vec<String>,
    pub prefixes: Vec<String>,
    /// `--max-node-startup-time`, as written.
    pub max_node_startup: Option<String>,
    /// Values nodegate-check cannot read (an unexpanded `$(VAR)`).
    pub unreadable: Vec<String>,
}

pub fn taint_flags(argv: &[String]) -> TaintFlags {
    let mut f = TaintFlags::default();
    // `sh -c "./cluster-autoscaler --flag=…"`: the words of the script
    // (split at whitespace; quoting inside it is not read).
    let shell = argv.first().is_some_and(|s| {
        let name = s.rsplit('/').next().unwrap_or(s);
        name == "sh" || name == "bash"
    }) && argv.get(1).is_some_and(|a| a == "-c");
    let words: Vec<String> = match argv.get(2) {
        Some(script) if shell => script.split_whitespace().map(String::from).collect(),
        _ => argv.to_vec(),
    };
    let mut it = words.iter();
    while let Some(a) = it.next() {
        let Some(flag) = a.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.replace('_', "-"), Some(v.to_string())),
            None => (flag.replace('_', "-"), None),
        };
        let known = [
            "startup-taint",
            "ignore-taint",
            "status-taint",
            "startup-taint-prefix",
            "max-node-startup-time",
        ];
        if !known.contains(&name.as_str()) {
            continue;
        }
        let Some(v) = value.or_else(|| it.next().cloned()) else {
            continue;
        };
        if v.contains("$(") {
            f.unreadable.push(format!("--{name}={v}"));
            continue;
        }
        match name.as_str() {
            "startup-taint" => f.startup.push(v),
            "ignore-taint" => f.ignore.push(v),
            "status-taint" => f.status.push(v),
            "startup-taint-prefix" => f.prefixes.push(v),
            _ => f.max_node_startup = Some(v),
        }
    }
    f
}

/// A duration as CA's flags take it (Go's `15m`, `1h30m`, `15m0s`), read by
/// the parser every nodegate binary uses, the agent's flag included.
pub fn go_duration(s: &str) -> Option<Duration> {
    nodegate_shared::duration::parse(s).ok()
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// How CA treats one of nodegate's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Treats {
    Startup(String),
    /// A startup taint from release `since` on; the version is unknown.
    FromRelease {
        how: String,
        since: &'static str,
    },
    /// Declared with something this (known) release does not have.
    TooOld(String),
    /// Only as a status taint: still Ready, still room.
    Status,
    /// Given to `--startup-taint` as a whole taint (`key=value:Effect`),
    /// which CA compares with keys: it never matches.
    WrittenAsTaint(String),
    Unknown,
}

fn treats(key: &str, f: &TaintFlags, version: &Version) -> Treats {
    let release = |v: (u64, u64, u64)| format!("{}.{}.{}", v.0, v.1, v.2);
    let shown = match version {
        Version::Known(v) => release(*v),
        Version::Unknown(_) => String::new(),
    };
    // Every release knows these.
    if f.ignore.iter().any(|k| k == key) {
        return Treats::Startup(format!("--ignore-taint={key}"));
    }
    if key.starts_with(IGNORE_PREFIX) {
        return Treats::Startup(format!("its key is under {IGNORE_PREFIX}"));
    }
    let since_129 = version.at_least(STARTUP_SINCE);
    // A flag the release does not define is reported once, by
    // `undefined_flags`; the key then counts as undeclared.
    if f.startup.iter().any(|k| k == key) && since_129 != Some(false) {
        let how = format!("--startup-taint={key}");
        return match since_129 {
            Some(true) => Treats::Startup(how),
            _ => Treats::FromRelease {
                how,
                since: "1.29.0",
            },
        };
    }
    if key.starts_with(STARTUP_PREFIX) {
        let how = format!("its key is under {STARTUP_PREFIX}");
        return match since_129 {
            Some(true) => Treats::Startup(how),
            None => Treats::FromRelease {
                how,
                since: "1.29.0",
            },
            Some(false) => Treats::TooOld(format!(
                "CA {shown} does not know the prefix {STARTUP_PREFIX} (it first appears in 1.29.0, utils/taints/taints.go): add --ignore-taint={key}, or gate with a key under {IGNORE_PREFIX}, which every release knows"
            )),
        };
    }
    let prefix_flag = version.at_least(PREFIX_FLAG_SINCE);
    if let Some(p) = f
        .prefixes
        .iter()
        .find(|p| !p.is_empty() && key.starts_with(p.as_str()))
        && prefix_flag != Some(false)
    {
        let how = format!("--startup-taint-prefix={p}");
        return match prefix_flag {
            Some(true) => Treats::Startup(how),
            _ => Treats::FromRelease {
                how,
                since: "1.36.0",
            },
        };
    }
    if let Some(w) = f
        .startup
        .iter()
        .chain(&f.ignore)
        .find(|k| k.split(['=', ':']).next() == Some(key) && k.as_str() != key)
    {
        return Treats::WrittenAsTaint(w.clone());
    }
    // Status taints exist from 1.29; before, the key is simply unknown.
    if since_129 != Some(false)
        && (f.status.iter().any(|k| k == key) || key.starts_with(STATUS_PREFIX))
    {
        return Treats::Status;
    }
    Treats::Unknown
}

/// The flags in `f` that release `version` does not define: CA stops at
/// start on each (release-1.28 `main.go` has neither `--startup-taint` nor
/// `--status-taint`; `--max-node-startup-time` comes in 1.35,
/// `--startup-taint-prefix` in 1.36).
fn undefined_flags(f: &TaintFlags, version: &Version) -> Vec<String> {
    let Version::Known((a, b, c)) = version else {
        return Vec::new();
    };
    let values = |flag: &str, v: &[String]| -> Vec<String> {
        v.iter().map(|x| format!("--{flag}={x}")).collect()
    };
    let mut out = Vec::new();
    let mut push = |since: (u64, u64, u64), flags: Vec<String>, instead: &str| {
        if !flags.is_empty() && version.at_least(since) == Some(false) {
            out.push(format!(
                "CA {a}.{b}.{c} does not define {} (from {}.{}.{}): it stops at start on that flag{instead}",
                flags.join(" "),
                since.0,
                since.1,
                since.2
            ));
        }
    };
    let ignore: Vec<String> = f
        .startup
        .iter()
        .map(|k| format!("--ignore-taint={k}"))
        .collect();
    push(
        STARTUP_SINCE,
        values("startup-taint", &f.startup),
        &format!(
            " (release-1.28 main.go has only --ignore-taint); write {}",
            ignore.join(" ")
        ),
    );
    push(STARTUP_SINCE, values("status-taint", &f.status), "");
    push(
        PREFIX_FLAG_SINCE,
        values("startup-taint-prefix", &f.prefixes),
        "",
    );
    let window: Vec<String> = f
        .max_node_startup
        .iter()
        .map(|v| format!("--max-node-startup-time={v}"))
        .collect();
    push(STARTUP_TIME_FLAG_SINCE, window, "");
    out
}

/// CA's releases are 1.x: a tag of another scheme (a chart's version, a
/// date) says nothing about which flags it has.
fn ca_release(v: Version) -> Version {
    match v {
        Version::Known((1, _, _)) | Version::Unknown(_) => v,
        Version::Known((a, b, c)) => Version::Unknown(format!(
            "{a}.{b}.{c} is no Cluster Autoscaler release (they are 1.x)"
        )),
    }
}

/// The declaration `version` accepts.
fn fix(key: &str, version: &Version) -> String {
    match version.at_least(STARTUP_SINCE) {
        Some(true) => format!("add --startup-taint={key} to its args"),
        Some(false) => format!(
            "add --ignore-taint={key} to its args (this release has no --startup-taint, and an unknown flag stops CA at start)"
        ),
        None => format!(
            "add --startup-taint={key} to its args if it is 1.29.0 or later, else --ignore-taint={key} (every release knows it; deprecated from 1.29); an unknown flag stops CA at start"
        ),
    }
}

/// CA's startup window beside the agent's, when they differ.
fn window_note(f: &TaintFlags, version: &Version, agent: Duration) -> Option<String> {
    let flag = f.max_node_startup.as_deref();
    let ca = match (version.at_least(STARTUP_TIME_FLAG_SINCE), flag) {
        (Some(false), _) | (_, None) => DEFAULT_MAX_NODE_STARTUP,
        (_, Some(v)) => match go_duration(v) {
            Some(d) => d,
            None => {
                return Some(format!(
                    "cannot read --max-node-startup-time={v}; the agent assumes {}",
                    minutes(agent)
                ));
            }
        },
    };
    (ca != agent).then(|| {
        format!(
            "CA counts a gated node as starting for {} (--max-node-startup-time), but the agent's NodegateGateNotStartupTaint signal assumes {}: set the agent's --{AGENT_WINDOW_FLAG}={}s, or it may report a declared gate as undeclared",
            minutes(ca),
            minutes(agent),
            ca.as_secs()
        )
    })
}

/// `key (how)`, with the gates that use it: `key (gate cni: how)`.
fn how_shown(gates: &[Gate], key: &str, how: &str) -> String {
    match gate_names(gates, key) {
        Some(n) => format!("{key} ({n}: {how})"),
        None => format!("{key} ({how})"),
    }
}

fn one_deployment(a: &Autoscaler, gates: &[Gate], i: &Inputs) -> (Status, String) {
    let keys = keys(gates);
    let f = taint_flags(&a.argv);
    let given = i.version.clone();
    let version = match ca_release(given.unwrap_or_else(|| Version::of_image(&a.image))) {
        Version::Unknown(why) => {
            Version::Unknown(format!("{why}: pass --cluster-autoscaler-version"))
        }
        known => known,
    };
    let release = match &version {
        Version::Known((a, b, c)) => format!("CA {a}.{b}.{c}"),
        Version::Unknown(_) => "CA".to_string(),
    };
    let mut ok = Vec::new();
    let mut maybe = Vec::new();
    let mut bad = undefined_flags(&f, &version);
    let past_read = version.at_least(NEWEST_READ) == Some(true);
    for key in &keys {
        let shown = key_shown(gates, key);
        match treats(key, &f, &version) {
            // Deprecated from 1.29; the branches read end at 1.37.
            Treats::Startup(how) if past_read && how.contains("ignore-taint") => {
                maybe.push(format!(
                    "{} relies on ignore-taint, deprecated from 1.29 and read here up to release 1.37: check that {release} still has it, or use --startup-taint",
                    how_shown(gates, key, &how)
                ))
            }
            Treats::Startup(how) => ok.push(how_shown(gates, key, &how)),
            Treats::FromRelease { how, since } => maybe.push(format!(
                "{} is a startup taint only from CA {since}",
                how_shown(gates, key, &how)
            )),
            Treats::TooOld(why) => bad.push(format!("{shown}: {why}")),
            Treats::Status => bad.push(format!(
                "{shown} is only a status taint to it (--status-taint), which is sanitized out of templates but leaves a gated node Ready: pods do not fit it and each 10 s loop scales up again; {}",
                fix(key, &version)
            )),
            Treats::WrittenAsTaint(w) => bad.push(format!(
                "{w} is a whole taint, but CA reads a key there and compares keys: write only the key {key}"
            )),
            Treats::Unknown => bad.push(format!(
                "it does not treat nodegate's gate {shown} as a startup taint: a node stays gated after it turns Ready, the pending pods do not fit it, and each 10 s loop scales up again (duplicate nodes, which stay at least --scale-down-unneeded-time, 10 min by default); {}",
                fix(key, &version)
            )),
        }
    }
    let at = &a.at;
    let unreadable = (!f.unreadable.is_empty()).then(|| f.unreadable.join(" "));
    if !bad.is_empty() {
        let mut why = vec![format!("{at} ({release}): {}", bad.join("; "))];
        if f.startup.iter().chain(&f.ignore).any(|k| k == CILIUM_KEY) && !keys.contains(&CILIUM_KEY)
        {
            why.push(format!(
                "it names Cilium's key {CILIUM_KEY} only, but nodegate gates with its own key"
            ));
        }
        if let Some(u) = unreadable {
            why.push(format!(
                "nodegate-check cannot expand {u}: if that is the fix already, ignore this line"
            ));
        }
        return (Status::Fail, why.join("; "));
    }
    if !maybe.is_empty() {
        let why = match &version {
            Version::Unknown(w) => w.clone(),
            Version::Known(_) => {
                return (
                    Status::Warn,
                    format!("{at} ({release}): {}", maybe.join("; ")),
                );
            }
        };
        return (
            Status::Warn,
            format!(
                "{at}: cannot tell its release ({why}), and {}; an older CA counts a gated, Ready node as room and scales up again each 10 s loop. Pass --cluster-autoscaler-version, or declare with --ignore-taint=<key>, which every release knows",
                maybe.join("; ")
            ),
        );
    }
    let mut detail = format!(
        "{at} ({release}) treats nodegate's gates as startup taints: {}; a gated node counts as starting up, not as room for pods (a reboot wave that gates more than 45 % of nodes, and more than 3, pauses CA until they are ready: docs/autoscalers.md)",
        ok.join(", ")
    );
    if let Some(u) = unreadable {
        detail.push_str(&format!("; not read: {u}"));
    }
    match window_note(&f, &version, i.agent_window) {
        Some(note) => (Status::Warn, format!("{detail}; {note}")),
        None => (Status::Pass, detail),
    }
}

/// The line for a status ConfigMap without a CA Deployment: what was seen,
/// what it may mean, and what holds for each reading.
fn status_only(cm: &StatusConfigMap, gates: &[Gate], i: &Inputs) -> (Status, String) {
    let keys = keys(gates);
    let at = &cm.at;
    let stale = cm.written_ago.is_none_or(|d| d > STALE_STATUS);
    let seen = match cm.written_ago {
        Some(d) => format!(
            "no Deployment runs Cluster Autoscaler's image, but its status ConfigMap {at} was written {} ago",
            if d.as_secs() < 60 {
                format!("{} s", d.as_secs())
            } else {
                minutes(Duration::from_secs(d.as_secs() / 60 * 60))
            }
        ),
        None => format!(
            "no Deployment runs Cluster Autoscaler's image, but its status ConfigMap {at} exists (without a readable {LAST_UPDATED})"
        ),
    };
    if stale {
        return (
            Status::Warn,
            format!(
                "{seen}: a running CA rewrites it every loop, so it is probably left by a CA stopped without a clean exit (CA deletes it only then), or one failing every loop before it writes its status (its logs say which); delete it if no CA runs, else pass --cluster-autoscaler-status with the ConfigMap the running one writes"
            ),
        );
    }
    let version = ca_release(i.version.clone().unwrap_or_else(|| {
        Version::Unknown(
            "nodegate-check cannot see that CA's image: pass --cluster-autoscaler-version".into(),
        )
    }));
    let meaning = "a CA runs that nodegate-check cannot see: a managed one (GKE, AKS; no flags can be set, and as far as their documented settings go, AKS's cluster-autoscaler profile and GKE's autoscaling profiles set no startup taint), one in another cluster writing here through --kubeconfig (Cluster API), or a static Pod";
    let f = TaintFlags::default();
    let mut bad = Vec::new();
    let mut maybe = Vec::new();
    let mut too_old = Vec::new();
    for key in &keys {
        match treats(key, &f, &version) {
            Treats::Startup(_) => {}
            Treats::FromRelease { how, since } => {
                maybe.push(format!("{} from CA {since}", how_shown(gates, key, &how)))
            }
            Treats::TooOld(_) => too_old.push(key_shown(gates, key)),
            _ => bad.push(key_shown(gates, key)),
        }
    }
    if !too_old.is_empty() {
        let release = match &version {
            Version::Known((a, b, c)) => format!("CA {a}.{b}.{c}"),
            Version::Unknown(_) => "this CA".into(),
        };
        return (
            Status::Fail,
            format!(
                "{seen}: {meaning}. {release} does not know the prefix {STARTUP_PREFIX} (it first appears in 1.29.0, utils/taints/taints.go), so {} is not a startup taint to it: where its flags can be set add --ignore-taint=<key>; where they cannot, gate with a key under {IGNORE_PREFIX}, which every release knows (docs/autoscalers.md, \"Older Cluster Autoscalers\")",
                too_old.join(", ")
            ),
        );
    }
    if bad.is_empty() && maybe.is_empty() {
        return (
            Status::Pass,
            format!(
                "{seen}: {meaning}. nodegate's keys are startup taints to it without a flag: {}",
                keys.iter()
                    .map(|k| key_shown(gates, k))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if bad.is_empty() {
        let why = match &version {
            Version::Unknown(w) => w.clone(),
            Version::Known(_) => String::new(),
        };
        return (
            Status::Warn,
            format!(
                "{seen}: {meaning}. Its release cannot be told ({why}), and {}; a CA older than that counts a gated, Ready node as room; a key under {IGNORE_PREFIX} works on every release",
                maybe.join("; ")
            ),
        );
    }
    (
        Status::Warn,
        format!(
            "{seen}: {meaning}. nodegate-check cannot read its flags, and without one {} is not a startup taint to it: each 10 s loop while a new node is Ready and gated scales up again. If its flags cannot be set, use the cluster-autoscaler key profile (a key under {STARTUP_PREFIX}, CA 1.29.0 and later: manifests/components/key-profiles/cluster-autoscaler, docs/autoscalers.md); if they can, {}",
            bad.join(", "),
            fix("<key>", &version)
        ),
    )
}

/// The Cluster Autoscaler line.
pub fn verdict(i: &Inputs) -> (Status, String) {
    let Some(gates) = &i.gates else {
        return (
            Status::Skip,
            "cannot tell which taints nodegate adds: neither the webhook StatefulSet's nor the agent DaemonSet's flags could be read (see above)".into(),
        );
    };
    let keys: Vec<String> = keys(gates)
        .into_iter()
        .map(|k| key_shown(gates, k))
        .collect();
    match &i.found {
        Found::None => (
            Status::Pass,
            format!(
                "no Cluster Autoscaler seen: no Deployment runs its image and there is no ConfigMap {} (a CA elsewhere with --write-status-configmap=false, or writing another --status-config-map-name or --namespace, is not seen: pass --cluster-autoscaler-status)",
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
        Found::StatusOnly(cm) => status_only(cm, gates, i),
        Found::Deployments(list) => {
            let lines: Vec<(Status, String)> =
                list.iter().map(|a| one_deployment(a, gates, i)).collect();
            let status = [Status::Fail, Status::Warn]
                .into_iter()
                .find(|s| lines.iter().any(|(l, _)| l == s))
                .unwrap_or(Status::Pass);
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

/// `WriteStatusConfigMap`'s stamp (Go's `2006-01-02 15:04:05.999999999
/// -0700 MST`): the instant, without the zone's name.
pub fn last_updated(stamp: &str) -> Option<Timestamp> {
    let (without_zone, _) = stamp.trim().rsplit_once(' ')?;
    k8s_openapi::jiff::fmt::strtime::parse("%Y-%m-%d %H:%M:%S%.f %z", without_zone)
        .ok()?
        .to_timestamp()
        .ok()
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
        Ok(Some(cm)) => {
            let stamp = cm
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LAST_UPDATED))
                .and_then(|s| last_updated(s));
            // A stamp ahead of this machine's clock (skew) is fresh.
            let written_ago = stamp.map(|t| {
                let ago = Timestamp::now().duration_since(t);
                Duration::try_from(ago).unwrap_or(Duration::ZERO)
            });
            Found::StatusOnly(StatusConfigMap {
                at: status_cm.to_string(),
                written_ago,
            })
        }
        Ok(None) => Found::None,
        Err(e) => Found::Unreadable(format!("ConfigMap {status_cm} cannot be read: {e}")),
    }
}

/// The agent's `--ca-max-node-startup-time` (or its env form), read as the
/// agent's clap reads it (the last value wins), else CA's default.
fn agent_window(installed: &Installed) -> Duration {
    installed
        .agent
        .container()
        .and_then(|c| {
            let flag = format!("--{AGENT_WINDOW_FLAG}");
            container_flag(c, &flag, AGENT_WINDOW_ENV).pop()
        })
        .and_then(|v| go_duration(&v))
        .unwrap_or(DEFAULT_MAX_NODE_STARTUP)
}

/// Reads CA's Deployments (or its status ConfigMap, `status_cm`:
/// `namespace/name`) and reports [`verdict`]; `version`:
/// `--cluster-autoscaler-version`.
pub async fn check(
    client: &Client,
    status_cm: &str,
    version: Option<&str>,
    installed: &Installed,
    report: &mut Report,
) {
    let inputs = Inputs {
        found: read(client, status_cm).await,
        gates: crate::gates::installed(installed),
        status_config_map: status_cm.to_string(),
        version: version.map(|v| Version::given("cluster-autoscaler-version", v)),
        agent_window: agent_window(installed),
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
                name: None,
                owner: None,
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

    fn inputs(found: Found, g: Vec<Gate>) -> Inputs {
        Inputs {
            found,
            gates: Some(g),
            status_config_map: "kube-system/cluster-autoscaler-status".into(),
            version: None,
            agent_window: DEFAULT_MAX_NODE_STARTUP,
        }
    }

    fn run(found: Found, g: Vec<Gate>) -> (Status, String) {
        verdict(&inputs(found, g))
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
                "write only the key nodegate.dev/agent-not-ready",
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

    /// Every key of the declaration, owned gates' included: the line names
    /// the gate CA does not wait for.
    #[test]
    fn each_gate_of_a_declaration_is_named() {
        let two = || crate::gates::of_declaration(crate::gates::TWO_GATES);
        let one = deployment(IMAGE, &[&format!("--startup-taint={KEY}")]);
        let (s, d) = run(Found::Deployments(vec![one]), two());
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.contains("it does not treat nodegate's gate ebs.csi.aws.com/agent-not-ready (gate ebs-csi) as a startup taint")
                && d.contains("add --startup-taint=ebs.csi.aws.com/agent-not-ready to its args"),
            "{d}"
        );
        assert!(!d.contains("gate cni"), "{d}");
        let both = deployment(
            IMAGE,
            &[
                &format!("--startup-taint={KEY}"),
                "--startup-taint=ebs.csi.aws.com/agent-not-ready",
            ],
        );
        let (s, d) = run(Found::Deployments(vec![both]), two());
        assert_eq!(s, Status::Pass, "{d}");
        assert!(
            d.contains(&format!("treats nodegate's gates as startup taints: {KEY} (gate cni: --startup-taint={KEY}), ebs.csi.aws.com/agent-not-ready (gate ebs-csi: --startup-taint=ebs.csi.aws.com/agent-not-ready)")),
            "{d}"
        );
        // Without its flags (a managed CA), each undeclared gate is named.
        let (s, d) = run(status_only(Some(20)), two());
        assert_eq!(s, Status::Warn, "{d}");
        assert!(
            d.contains(&format!(
                "without one {KEY} (gate cni), ebs.csi.aws.com/agent-not-ready (gate ebs-csi) is not a startup taint"
            )),
            "{d}"
        );
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

    fn status_only(written_ago: Option<u64>) -> Found {
        Found::StatusOnly(StatusConfigMap {
            at: "kube-system/cluster-autoscaler-status".into(),
            written_ago: written_ago.map(Duration::from_secs),
        })
    }

    const STARTUP_GATE: &str =
        "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoSchedule";
    const IGNORE_GATE: &str =
        "ignore-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoSchedule";

    #[test]
    fn a_status_config_map_without_a_deployment_says_what_it_may_mean() {
        // Fresh: a CA runs that the check cannot see; its flags are unknown.
        let (s, d) = run(status_only(Some(20)), gates(&[(GATE, false)]));
        assert_eq!(s, Status::Warn, "{d}");
        assert!(
            d.contains("managed") && d.contains("--kubeconfig") && d.contains("static Pod"),
            "{d}"
        );
        assert!(d.contains("key-profiles/cluster-autoscaler"), "{d}");
        // The startup prefix holds from 1.29 only: unknown release, no pass.
        let (s, d) = run(status_only(Some(20)), gates(&[(STARTUP_GATE, false)]));
        assert_eq!(s, Status::Warn, "{d}");
        assert!(d.contains("--cluster-autoscaler-version"), "{d}");
        // Told the release, it passes or fails by it.
        let mut i = inputs(status_only(Some(20)), gates(&[(STARTUP_GATE, false)]));
        i.version = Some(Version::given("cluster-autoscaler-version", "1.33.1"));
        assert_eq!(verdict(&i).0, Status::Pass);
        i.version = Some(Version::given("cluster-autoscaler-version", "1.28.7"));
        let (s, d) = verdict(&i);
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.contains("CA 1.28.7 does not know the prefix")
                && d.contains("gate with a key under ignore-taint."),
            "{d}"
        );
        assert!(d.contains(IGNORE_PREFIX), "{d}");
        // The ignore prefix, every release.
        assert_eq!(
            run(status_only(Some(20)), gates(&[(IGNORE_GATE, false)])).0,
            Status::Pass
        );
        // Not written for an hour, or never stamped: left behind.
        for stale in [Some(3600), None] {
            let (s, d) = run(status_only(stale), gates(&[(STARTUP_GATE, false)]));
            assert_eq!(s, Status::Warn, "{d}");
            assert!(d.contains("clean exit"), "{d}");
        }
    }

    /// Each configuration at each release range, from the release branches'
    /// `utils/taints/taints.go` and flag definitions.
    #[test]
    fn each_declaration_holds_from_the_release_that_has_it() {
        let img = |v: &str| format!("registry.k8s.io/autoscaling/cluster-autoscaler:v{v}");
        let startup = "--startup-taint=nodegate.dev/agent-not-ready";
        let ignore = "--ignore-taint=nodegate.dev/agent-not-ready";
        let prefix = "--startup-taint-prefix=nodegate.dev/";
        let digest = "registry.k8s.io/autoscaling/cluster-autoscaler@sha256:ab";
        let cases: &[(&str, &str, &[&str], Status, &str)] = &[
            // gate, image, args, status, text
            (
                GATE,
                "1.28.7",
                &[startup],
                Status::Fail,
                "does not define --startup-taint",
            ),
            (GATE, "1.28.7", &[ignore], Status::Pass, "--ignore-taint"),
            (
                GATE,
                "1.28.7",
                &[],
                Status::Fail,
                "add --ignore-taint=nodegate.dev/agent-not-ready",
            ),
            (GATE, "1.29.0", &[startup], Status::Pass, "--startup-taint"),
            (
                GATE,
                "1.29.0",
                &[],
                Status::Fail,
                "add --startup-taint=nodegate.dev/agent-not-ready",
            ),
            (GATE, "1.37.0", &[ignore], Status::Pass, "--ignore-taint"),
            (
                GATE,
                "1.35.2",
                &[prefix],
                Status::Fail,
                "does not define --startup-taint-prefix",
            ),
            (
                GATE,
                "1.36.0",
                &[prefix],
                Status::Pass,
                "--startup-taint-prefix",
            ),
            (
                STARTUP_GATE,
                "1.28.7",
                &[],
                Status::Fail,
                "does not know the prefix",
            ),
            (
                STARTUP_GATE,
                "1.29.0",
                &[],
                Status::Pass,
                "under startup-taint.",
            ),
            (
                IGNORE_GATE,
                "1.28.7",
                &[],
                Status::Pass,
                "under ignore-taint.",
            ),
            (
                IGNORE_GATE,
                "1.37.0",
                &[],
                Status::Pass,
                "under ignore-taint.",
            ),
        ];
        for (gate, v, args, want, text) in cases {
            let (s, d) = run(
                Found::Deployments(vec![deployment(&img(v), args)]),
                gates(&[(gate, false)]),
            );
            assert_eq!(s, *want, "{gate} {v} {args:?}: {d}");
            assert!(d.contains(text), "{gate} {v} {args:?}: {d}");
        }
        // An image without a version: what depends on it is not passed.
        for (gate, args) in [
            (GATE, &[startup][..]),
            (STARTUP_GATE, &[][..]),
            (GATE, &[prefix][..]),
        ] {
            let (s, d) = run(
                Found::Deployments(vec![deployment(digest, args)]),
                gates(&[(gate, false)]),
            );
            assert_eq!(s, Status::Warn, "{gate} {args:?}: {d}");
            assert!(
                d.contains("cannot tell its release") && d.contains("--cluster-autoscaler-version"),
                "{d}"
            );
        }
        let (s, d) = run(
            Found::Deployments(vec![deployment(digest, &[])]),
            gates(&[(GATE, false)]),
        );
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.contains("if it is 1.29.0 or later, else --ignore-taint"),
            "{d}"
        );
        assert_eq!(
            run(
                Found::Deployments(vec![deployment(digest, &[ignore])]),
                gates(&[(GATE, false)])
            )
            .0,
            Status::Pass
        );
        // Flags a known release does not define stop CA: each is named.
        let (s, d) = run(
            Found::Deployments(vec![deployment(
                &img("1.28.7"),
                &[ignore, "--status-taint=x"],
            )]),
            gates(&[(GATE, false)]),
        );
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.contains("does not define --status-taint=x (from 1.29.0)"),
            "{d}"
        );
        // A tag of another scheme is no release.
        let (s, d) = run(
            Found::Deployments(vec![deployment("x/cluster-autoscaler:9.37.0", &[startup])]),
            gates(&[(GATE, false)]),
        );
        assert_eq!(s, Status::Warn, "{d}");
        assert!(d.contains("9.37.0 is no Cluster Autoscaler release"), "{d}");
        // Past the newest branch read, the deprecated declaration is not passed.
        let (s, d) = run(
            Found::Deployments(vec![deployment(&img("1.40.0"), &[ignore])]),
            gates(&[(GATE, false)]),
        );
        assert_eq!(s, Status::Warn, "{d}");
        assert!(d.contains("read here up to release 1.37"), "{d}");
        assert_eq!(
            run(
                Found::Deployments(vec![deployment(&img("1.40.0"), &[startup])]),
                gates(&[(GATE, false)])
            )
            .0,
            Status::Pass
        );
        // A shell-wrapped command line is read too.
        let mut wrapped = deployment(&img("1.31.5"), &[]);
        wrapped.argv = vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("./cluster-autoscaler --v=2 {startup}"),
        ];
        assert_eq!(
            run(Found::Deployments(vec![wrapped]), gates(&[(GATE, false)])).0,
            Status::Pass
        );
        // The flag overrides the tag.
        let mut i = inputs(
            Found::Deployments(vec![deployment(&img("1.31.5"), &[startup])]),
            gates(&[(GATE, false)]),
        );
        i.version = Some(Version::given("cluster-autoscaler-version", "1.28.2"));
        assert_eq!(verdict(&i).0, Status::Fail);
    }

    #[test]
    fn the_startup_window_beside_the_agents() {
        let startup = "--startup-taint=nodegate.dev/agent-not-ready";
        let img = |v: &str| format!("registry.k8s.io/autoscaling/cluster-autoscaler:v{v}");
        let cases: &[(&str, &[&str], u64, Status)] = &[
            (
                "1.35.0",
                &[startup, "--max-node-startup-time=5m"],
                900,
                Status::Warn,
            ),
            (
                "1.35.0",
                &[startup, "--max-node-startup-time", "5m"],
                300,
                Status::Pass,
            ),
            (
                "1.35.0",
                &[startup, "--max-node-startup-time=15m0s"],
                900,
                Status::Pass,
            ),
            ("1.35.0", &[startup], 900, Status::Pass),
            ("1.35.0", &[startup], 300, Status::Warn),
            // Before 1.35 the window is a constant, and the flag stops CA.
            (
                "1.34.1",
                &[startup, "--max-node-startup-time=5m"],
                900,
                Status::Fail,
            ),
        ];
        for (v, args, agent, want) in cases {
            let mut i = inputs(
                Found::Deployments(vec![deployment(&img(v), args)]),
                gates(&[(GATE, false)]),
            );
            i.agent_window = Duration::from_secs(*agent);
            let (s, d) = verdict(&i);
            assert_eq!(s, *want, "{v} {args:?} agent {agent}: {d}");
            if s == Status::Warn {
                let ca = if args.len() > 1 { 300 } else { 900 };
                assert!(
                    d.contains(&format!("--ca-max-node-startup-time={ca}s")),
                    "{d}"
                );
            }
        }
    }

    /// The agent's window as its DaemonSet sets it: an arg (the last one
    /// wins, as clap reads it), else the env form, else CA's default.
    #[test]
    fn the_agents_window_is_read_from_its_daemonset() {
        use crate::installed::{Installed, Workload};
        use k8s_openapi::api::core::v1::{Container, EnvVar};
        let installed = |args: &[&str], env: Option<&str>| Installed {
            webhook: Workload::Missing,
            agent: Workload::Container(Box::new(Container {
                args: Some(args.iter().map(|a| a.to_string()).collect()),
                env: env.map(|v| {
                    vec![EnvVar {
                        name: AGENT_WINDOW_ENV.into(),
                        value: Some(v.into()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            })),
            agent_placement: None,
        };
        let cases: &[(&[&str], Option<&str>, u64)] = &[
            (&[], None, 900),
            (&["--ca-max-node-startup-time=5m"], None, 300),
            (&["--ca-max-node-startup-time", "20m0s"], None, 1200),
            (
                &[
                    "--ca-max-node-startup-time=5m",
                    "--ca-max-node-startup-time=7m",
                ],
                None,
                420,
            ),
            (&[], Some("10m"), 600),
            (&["--ca-max-node-startup-time=5m"], Some("10m"), 300),
        ];
        for (args, env, want) in cases {
            assert_eq!(
                agent_window(&installed(args, *env)),
                Duration::from_secs(*want),
                "{args:?} {env:?}"
            );
        }
        let missing = Installed {
            webhook: Workload::Missing,
            agent: Workload::Missing,
            agent_placement: None,
        };
        assert_eq!(agent_window(&missing), DEFAULT_MAX_NODE_STARTUP);
    }

    #[test]
    fn go_durations_and_the_status_stamp() {
        let cases = [
            ("15m", 900.0),
            ("1h30m", 5400.0),
            ("900s", 900.0),
            ("2.5m", 150.0),
            ("15m0s", 900.0),
            ("0", 0.0),
        ];
        for (s, want) in cases {
            assert_eq!(go_duration(s).map(|d| d.as_secs_f64()), Some(want), "{s}");
        }
        assert_eq!(go_duration("15min"), None);
        assert_eq!(go_duration("m"), None);
        assert_eq!(go_duration("99999999999999999999h"), None);
        let t = last_updated("2026-11-29 11:04:23.123456789 +0000 UTC").unwrap();
        assert_eq!(t.to_string(), "2026-11-29T11:04:23.123456789Z");
        let t = last_updated("2026-11-29 12:04:23 +0100 CET").unwrap();
        assert_eq!(t.to_string(), "2026-11-29T11:04:23Z");
        assert!(last_updated("yesterday").is_none());
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
        assert!(d.contains("other/ca (CA 1.31.5): it does not treat"), "{d}");
        let mut no_gates = inputs(Found::None, vec![]);
        no_gates.gates = None;
        let no_gates = verdict(&no_gates);
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
