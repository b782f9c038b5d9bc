//! Karpenter's NodePools and nodegate's gates. Karpenter launches nodes for
//! pending pods by simulating where they fit, taints included
//! (kubernetes-sigs/karpenter, read at `2266468`, v1.14.0+20; each
//! statement holds for `karpenter.sh/v1`, v1.0.0 on, unless a release is
//! named):
//!
//! - `pkg/controllers/state/statenode.go` `StateNode.Taints()` leaves out a
//!   registered node's declared `startupTaints` and the known ephemeral
//!   taints (`pkg/scheduling/taints.go` `KnownEphemeralTaints`, and since
//!   v1.13.0 every key under `readiness.k8s.io/`), only while the node is not
//!   initialized; any other taint counts. Taints match by key and effect
//!   (`MatchTaint`), the value is ignored.
//! - `provisioning/scheduling/existingnode.go` `ExistingNode.CanAdd` then
//!   refuses the gated node to pods that do not tolerate the gate, and every
//!   10 s pass until the agent's ready patch launches more nodes.
//! - `nodeclaim/lifecycle/initialization.go` ignores undeclared taints: the
//!   node is "initialized" while gated, so disruption drains old nodes onto
//!   nodes that take no pods.
//! - The declaration Karpenter reads is the NodeClaim's `startupTaints`,
//!   copied from the NodePool at launch (`StateNode.Taints()`), so a pool
//!   edit reaches new NodeClaims only (drift replaces the rest).
//! - A gate in a pool's `taints` (not `startupTaints`): `NodeClaim.CanAdd`
//!   (`provisioning/scheduling/nodeclaim.go`) refuses the pool to a pod that
//!   does not tolerate it, and `Registration.syncNode` copies it to the Node
//!   only at registration (skipped for `karpenter.sh/do-not-sync-taints=true`).
//!
//! So each NodePool whose nodes the agent runs on must declare every gate in
//! `spec.template.spec.startupTaints` (or use a key Karpenter knows). A pool
//! declaring one where the agent cannot run keeps its nodes tainted and
//! uninitialized for ever: Karpenter adds the startup taints itself at
//! registration (`Registration.syncNode`) and has no initialization timeout.
//!
//! [`verdict`] decides from what was read; [`check`] only reads.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use serde::Deserialize;
use serde_json::json;

use crate::cilium::OPERATOR_DEFAULT_KEY as CILIUM_KEY;
use crate::gates::{Gate, Version};
use crate::installed::{AgentPlacement, Installed};
use crate::report::{Report, Status};

pub const CHECK: &str = "karpenter";
/// The label every Karpenter node gets with its pool's name.
const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
/// Keys Karpenter knows as ephemeral from v1.13.0 on
/// (`KnownEphemeralTaintKeyPrefixes`).
pub const READINESS_PREFIX: &str = "readiness.k8s.io/";
const READINESS_SINCE: (u64, u64, u64) = (1, 13, 0);
/// The label the webhook and the agent leave alone.
const EXCLUDE: &str = nodegate_shared::keys::EXCLUDE_LABEL;

/// A `karpenter.sh/v1` NodePool, the fields this check reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodePoolSpec {
    template: Template,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Template {
    #[serde(default)]
    metadata: TemplateMeta,
    spec: TemplateSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct TemplateMeta {
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TemplateSpec {
    #[serde(default)]
    taints: Vec<Taint>,
    #[serde(default)]
    startup_taints: Vec<Taint>,
    #[serde(default)]
    requirements: Vec<NodeSelectorRequirement>,
}

/// One NodePool as read.
#[derive(Debug, Clone, Default)]
pub struct Pool {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub requirements: Vec<NodeSelectorRequirement>,
    pub taints: Vec<Taint>,
    pub startup_taints: Vec<Taint>,
}

impl Pool {
    /// A NodePool object's spec; `Err` says what could not be read.
    pub fn from_spec(name: &str, spec: &serde_json::Value) -> Result<Pool, String> {
        let s: NodePoolSpec = serde_json::from_value(spec.clone()).map_err(|e| e.to_string())?;
        let t = s.template;
        Ok(Pool {
            name: name.to_string(),
            labels: t.metadata.labels,
            requirements: t.spec.requirements,
            taints: t.spec.taints,
            startup_taints: t.spec.startup_taints,
        })
    }
}

/// What was read of the NodePools.
#[derive(Debug, Clone)]
pub enum Pools {
    /// `karpenter.sh/v1` is served: each pool, or its name and why it
    /// could not be read.
    Listed(Vec<Result<Pool, (String, String)>>),
    /// Not served. `older`: a Karpenter API version that is (`v1beta1`).
    NotServed {
        older: Option<String>,
    },
    Unreadable(String),
}

/// What [`verdict`] decides on.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub pools: Pools,
    pub version: Version,
    /// nodegate's gates; `None` when its flags could not be read.
    pub gates: Option<Vec<Gate>>,
    /// Where the agent DaemonSet's Pods may run; `None` when unreadable.
    pub agent: Option<AgentPlacement>,
}

/// Whether a pool's nodes can run something.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Fit {
    No(String),
    /// It depends on labels the pool does not pin down.
    Maybe(String),
    Yes,
}

/// One node-selector requirement against a pool's nodes: the template's
/// labels pin a value; the pool's requirements narrow it to a set.
fn requirement_fit(pool: &Pool, r: &NodeSelectorRequirement) -> Fit {
    let values = r.values.clone().unwrap_or_default();
    let pinned: Option<Vec<String>> = if r.key == NODEPOOL_LABEL {
        Some(vec![pool.name.clone()])
    } else if let Some(v) = pool.labels.get(&r.key) {
        Some(vec![v.clone()])
    } else {
        pool.requirements
            .iter()
            .find(|p| p.key == r.key && p.operator == "In")
            .map(|p| p.values.clone().unwrap_or_default())
    };
    let absent = pool
        .requirements
        .iter()
        .any(|p| p.key == r.key && p.operator == "DoesNotExist");
    let what = format!("{} {} {:?}", r.key, r.operator, values);
    match (r.operator.as_str(), pinned) {
        ("In", Some(p)) if p.iter().all(|v| values.contains(v)) => Fit::Yes,
        ("In", Some(p)) if p.iter().any(|v| values.contains(v)) => {
            Fit::Maybe(format!("{what}: only some of its nodes"))
        }
        ("In", Some(_)) => Fit::No(format!("its nodes never have {what}")),
        ("In", None) if absent => Fit::No(format!("its nodes never have {what}")),
        ("NotIn", Some(p)) if p.iter().all(|v| values.contains(v)) => {
            Fit::No(format!("its nodes never have {what}"))
        }
        ("NotIn", Some(p)) if p.iter().any(|v| values.contains(v)) => {
            Fit::Maybe(format!("{what}: only some of its nodes"))
        }
        ("NotIn", Some(_)) => Fit::Yes,
        ("Exists", Some(_)) => Fit::Yes,
        ("Exists", None) if absent => Fit::No(format!("its nodes have no label {}", r.key)),
        ("DoesNotExist", Some(_)) => Fit::No(format!("its nodes have the label {}", r.key)),
        ("DoesNotExist", None) if absent => Fit::Yes,
        _ => Fit::Maybe(format!("{what}: the pool does not pin the label")),
    }
}

fn all_of(fits: impl Iterator<Item = Fit>) -> Fit {
    fits.min().unwrap_or(Fit::Yes)
}

/// A term's expressions (matchFields name single nodes: undecidable here).
fn term_fit(pool: &Pool, t: &NodeSelectorTerm) -> Fit {
    let fields = t
        .match_fields
        .as_ref()
        .is_some_and(|f| !f.is_empty())
        .then(|| Fit::Maybe("a matchFields term".into()));
    all_of(
        t.match_expressions
            .iter()
            .flatten()
            .map(|r| requirement_fit(pool, r))
            .chain(fields),
    )
}

/// `ToleratesTaint` of k8s.io/api `core/v1/toleration.go`.
pub(crate) fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// Whether the agent's Pods can run on the pool's nodes.
fn agent_fit(agent: &AgentPlacement, pool: &Pool, gates: &[Gate]) -> Fit {
    let selector = agent.node_selector.iter().map(|(k, v)| {
        requirement_fit(
            pool,
            &NodeSelectorRequirement {
                key: k.clone(),
                operator: "In".into(),
                values: Some(vec![v.clone()]),
            },
        )
    });
    let affinity = agent.required_terms.as_ref().map(|terms| {
        terms
            .iter()
            .map(|t| term_fit(pool, t))
            .max()
            .unwrap_or(Fit::No("an empty required node affinity".into()))
    });
    let own = |t: &Taint| {
        gates
            .iter()
            .any(|g| g.taint.key() == t.key && g.taint.effect().as_str() == t.effect)
    };
    let untolerated = pool
        .taints
        .iter()
        .chain(&pool.startup_taints)
        .filter(|t| t.effect != "PreferNoSchedule" && !own(t))
        .find(|t| !agent.tolerations.iter().any(|tol| tolerates(tol, t)))
        .map(|t| {
            Fit::No(format!(
                "the agent does not tolerate its taint {}",
                shown(t)
            ))
        });
    all_of(selector.chain(affinity).chain(untolerated))
}

fn shown(t: &Taint) -> String {
    match t.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
        _ => format!("{}:{}", t.key, t.effect),
    }
}

/// `MatchTaint`: key and effect.
fn declares(list: &[Taint], g: &Gate) -> bool {
    list.iter()
        .any(|t| t.key == g.taint.key() && t.effect == g.taint.effect().as_str())
}

/// Whether Karpenter leaves the gate out of its simulation without a
/// declaration: `Some(false)` no, `None` it depends on a version not known.
fn known(g: &Gate, version: &Version) -> Option<bool> {
    if !g.taint.key().starts_with(READINESS_PREFIX) {
        return Some(false);
    }
    version.at_least(READINESS_SINCE)
}

/// The JSON patch that declares `missing` in the pool's startupTaints.
fn patch(pool: &Pool, missing: &[&Gate]) -> String {
    let taint = |g: &Gate| {
        let mut t = json!({"key": g.taint.key(), "effect": g.taint.effect().as_str()});
        if let Some(v) = g.taint.value() {
            t["value"] = json!(v);
        }
        t
    };
    let ops: Vec<serde_json::Value> = if pool.startup_taints.is_empty() {
        vec![json!({
            "op": "add",
            "path": "/spec/template/spec/startupTaints",
            "value": missing.iter().map(|g| taint(g)).collect::<Vec<_>>(),
        })]
    } else {
        missing
            .iter()
            .map(|g| json!({"op": "add", "path": "/spec/template/spec/startupTaints/-", "value": taint(g)}))
            .collect()
    };
    format!(
        "kubectl patch nodepool {} --type=json -p '{}'",
        pool.name,
        serde_json::Value::Array(ops)
    )
}

fn list(gates: &[&Gate]) -> String {
    gates
        .iter()
        .map(|g| g.shown())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The line of a pool whose nodes nodegate's agent cannot run on (`why`):
/// they stay gated, and a gate declared in startupTaints keeps them from
/// ever initializing.
fn agent_cannot_run(pool: &Pool, declared: &[&Gate], why: &str) -> (Status, String) {
    let name = &pool.name;
    // A kubelet may not set the exclude label, so Karpenter adds it only after
    // registration (Registration.syncNode): the webhook has gated the Node's
    // create by then, and an excluded pool's nodes are gated like any other.
    let labelled_excluded = pool.labels.get(EXCLUDE).is_some_and(|v| v == "true");
    if !declared.is_empty() {
        return (
            Status::Fail,
            format!(
                "NodePool {name} declares nodegate's gate {} in startupTaints, but nodegate's agent cannot run on its nodes ({why}): Karpenter adds the taint itself at registration and nothing removes it, so the nodes never initialize and take no pods (Karpenter has no initialization timeout); remove it from spec.template.spec.startupTaints, or let the agent run there",
                list(declared)
            ),
        );
    }
    let label = if labelled_excluded {
        format!(
            " (its label {EXCLUDE}=true reaches a Node only after registration, as no kubelet may set it: too late for the create the webhook gates)"
        )
    } else {
        String::new()
    };
    (
        Status::Fail,
        format!(
            "nodegate's agent cannot run on the nodes of NodePool {name} ({why}), but nodegate's webhook gates every new Node{label}: they stay gated and take no pods; let the agent run there"
        ),
    )
}

/// The line of a pool that does not declare the gates `missing` (those in
/// `unknown_version` maybe known to a Karpenter of unknown version).
fn undeclared(
    pool: &Pool,
    gates: &[Gate],
    missing: &[&Gate],
    unknown_version: &[&Gate],
    may: &str,
    version: &Version,
) -> (Status, String) {
    let name = &pool.name;
    let mut why = vec![format!(
        "NodePool {name} does not declare nodegate's gate {} in startupTaints{may}: Karpenter counts a registered, gated node as one the pending pods do not fit, so each 10 s pass until the agent's ready patch launches more nodes (duplicates), and it marks the node initialized while gated",
        list(missing)
    )];
    let cilium: Vec<&Taint> = pool
        .startup_taints
        .iter()
        .filter(|t| t.key == CILIUM_KEY)
        .collect();
    if !cilium.is_empty() && !gates.iter().any(|g| g.taint.key() == CILIUM_KEY) {
        why.push(format!(
            "it declares Cilium's key {CILIUM_KEY}, as Karpenter's docs tell Cilium users, but nodegate gates with its own key"
        ));
    }
    if !unknown_version.is_empty() {
        let v = match version {
            Version::Unknown(w) => w.clone(),
            Version::Known(_) => String::new(),
        };
        why.push(format!(
            "Karpenter ≥ 1.13.0 knows every key under {READINESS_PREFIX}, but its version is unknown ({v}): pass --karpenter-version"
        ));
    }
    why.push(format!(
        "fix: {}; applying it changes the pool's template hash, so Karpenter drifts and replaces every node of the pool (at its disruption budget, 10 % of nodes at a time by default); only where that drift is unacceptable, the karpenter key profile (Karpenter 1.13.0 and later; its key is in the Node Readiness Controller's reserved domain: docs/autoscalers.md)",
        patch(pool, missing)
    ));
    (Status::Fail, why.join("; "))
}

/// One pool's line.
fn pool_verdict(
    pool: &Pool,
    gates: &[Gate],
    agent: Option<&AgentPlacement>,
    version: &Version,
) -> (Status, String) {
    let name = &pool.name;
    let declared: Vec<&Gate> = gates
        .iter()
        .filter(|g| declares(&pool.startup_taints, g))
        .collect();
    let fit = match agent {
        Some(a) => agent_fit(a, pool, gates),
        None => Fit::Maybe("the agent DaemonSet could not be read".into()),
    };
    if let Fit::No(why) = &fit {
        return agent_cannot_run(pool, &declared, why);
    }
    let in_taints: Vec<&Gate> = gates
        .iter()
        .filter(|g| declares(&pool.taints, g) && !declares(&pool.startup_taints, g))
        .collect();
    if !in_taints.is_empty() {
        return (
            Status::Fail,
            format!(
                "NodePool {name} lists nodegate's gate {} in spec.template.spec.taints: Karpenter launches a pool's nodes only for pods that tolerate its template taints (NodeClaim.CanAdd, provisioning/scheduling/nodeclaim.go), so pods that do not tolerate the gate never get a node from this pool and stay pending or go to another pool; the taint is copied to a Node only at registration (Registration.syncNode), so nothing puts it back once the agent removes it; move it to spec.template.spec.startupTaints",
                list(&in_taints)
            ),
        );
    }
    let mut unknown_version = Vec::new();
    let missing: Vec<&Gate> = gates
        .iter()
        .filter(|g| !declares(&pool.startup_taints, g))
        .filter(|g| match known(g, version) {
            Some(k) => !k,
            None => {
                unknown_version.push(*g);
                true
            }
        })
        .collect();
    let may = match &fit {
        Fit::Maybe(why) => format!(" (the agent may run on its nodes: {why})"),
        _ => String::new(),
    };
    if missing.is_empty() {
        let how: Vec<String> = gates
            .iter()
            .map(|g| {
                if declares(&pool.startup_taints, g) {
                    format!("{} declared in startupTaints", g.shown())
                } else {
                    format!(
                        "{} known to Karpenter (under {READINESS_PREFIX}, the Node Readiness Controller's reserved domain)",
                        g.shown()
                    )
                }
            })
            .collect();
        return (
            Status::Pass,
            format!(
                "NodePool {name}: {}{may}; a gated node is not counted as room for pods, and is initialized only once the gate is gone",
                how.join(", ")
            ),
        );
    }
    undeclared(pool, gates, &missing, &unknown_version, &may, version)
}

/// The lines: one per NodePool, or one saying why there are none.
pub fn verdict(i: &Inputs) -> Vec<(String, Status, String)> {
    let one = |status, detail: String| vec![(CHECK.to_string(), status, detail)];
    let pools = match &i.pools {
        Pools::NotServed { older: None } => {
            return one(
                Status::Pass,
                "Karpenter is not installed (no karpenter.sh/v1 NodePools served)".into(),
            );
        }
        Pools::NotServed { older: Some(v) } => {
            return one(
                Status::Warn,
                format!(
                    "Karpenter serves NodePools as karpenter.sh/{v} only, which nodegate-check does not read: declare nodegate's gates in each pool's startupTaints by hand (docs/autoscalers.md), or upgrade Karpenter to v1"
                ),
            );
        }
        Pools::Unreadable(e) => {
            return one(
                Status::Warn,
                format!(
                    "cannot list karpenter.sh/v1 NodePools ({e}): cannot tell whether Karpenter would launch duplicate nodes for gated ones; let nodegate-check list nodepools"
                ),
            );
        }
        Pools::Listed(p) => p,
    };
    let Some(gates) = &i.gates else {
        return one(
            Status::Skip,
            "cannot tell which taints nodegate adds: neither the webhook StatefulSet's nor the agent DaemonSet's flags could be read (see above)".into(),
        );
    };
    if pools.is_empty() {
        return one(Status::Pass, "no karpenter.sh/v1 NodePools".into());
    }
    pools
        .iter()
        .map(|p| match p {
            Ok(pool) => {
                let (s, d) = pool_verdict(pool, gates, i.agent.as_ref(), &i.version);
                (format!("{CHECK} {}", pool.name), s, d)
            }
            Err((name, e)) => (
                format!("{CHECK} {name}"),
                Status::Fail,
                format!(
                    "cannot read NodePool {name} ({e}): cannot tell whether it declares nodegate's gates; check spec.template.spec.startupTaints by hand"
                ),
            ),
        })
        .collect()
}

fn nodepools(version: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("karpenter.sh", version, "NodePool"),
        "nodepools",
    )
}

async fn read_pools(client: &Client) -> Pools {
    match crate::read::list_specs(client, &nodepools("v1"), Pool::from_spec).await {
        Ok(pools) => Pools::Listed(pools),
        Err(e) if crate::read::not_found(&e) => {
            let older: Api<DynamicObject> = Api::all_with(client.clone(), &nodepools("v1beta1"));
            let served = older.list(&ListParams::default().limit(1)).await.is_ok();
            Pools::NotServed {
                older: served.then(|| "v1beta1".to_string()),
            }
        }
        Err(e) => Pools::Unreadable(e.to_string()),
    }
}

/// The controller's release: `given` (`--karpenter-version`), else the
/// chart's Deployment's (label `app.kubernetes.io/name=karpenter`)
/// `controller` image's tag.
async fn read_version(client: &Client, given: Option<&str>) -> Version {
    if let Some(v) = given {
        return Version::given("karpenter-version", v);
    }
    let api: Api<Deployment> = Api::all(client.clone());
    let list = match api
        .list(&ListParams::default().labels("app.kubernetes.io/name=karpenter"))
        .await
    {
        Ok(l) => l,
        Err(e) => return Version::Unknown(format!("Deployments cannot be listed: {e}")),
    };
    let image = list
        .items
        .iter()
        .flat_map(|d| {
            d.spec
                .iter()
                .flat_map(|s| s.template.spec.iter().flat_map(|p| &p.containers))
        })
        .filter_map(|c| c.image.clone())
        .next();
    match image {
        None => Version::Unknown("no Deployment labelled app.kubernetes.io/name=karpenter".into()),
        Some(img) => Version::of_image(&img),
    }
}

/// Reads the NodePools and Karpenter's version (only when there are pools;
/// `version`: `--karpenter-version`), and reports [`verdict`].
pub async fn check(
    client: &Client,
    version: Option<&str>,
    installed: &Installed,
    report: &mut Report,
) {
    let pools = read_pools(client).await;
    let version = match &pools {
        Pools::Listed(p) if !p.is_empty() => read_version(client, version).await,
        _ => Version::Unknown("not read".into()),
    };
    let inputs = Inputs {
        pools,
        version,
        gates: crate::gates::installed(installed),
        agent: installed.agent_placement.clone(),
    };
    for (check, status, detail) in verdict(&inputs) {
        report.add(check, status, detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::gates::parsed as gates;

    const GATE: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";
    const BOOT: &str = "nodegate.dev/agent-not-ready=true:NoExecute";

    /// A NodePool as a user writes it.
    fn pool(yaml: &str) -> Pool {
        let v: serde_json::Value = serde_yaml::from_str(yaml).unwrap();
        Pool::from_spec("default", &v["spec"]).unwrap()
    }

    const UNDECLARED: &str = "
spec:
  template:
    spec:
      requirements:
        - {key: kubernetes.io/arch, operator: In, values: [amd64]}
";
    const DECLARED: &str = "
spec:
  template:
    spec:
      startupTaints:
        - {key: nodegate.dev/agent-not-ready, value: 'true', effect: NoSchedule}
";

    /// The shipped agent: no selector, tolerates everything.
    fn shipped_agent() -> AgentPlacement {
        AgentPlacement {
            tolerations: vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn run(p: Pool, g: Vec<Gate>, agent: AgentPlacement, version: Version) -> (Status, String) {
        let mut lines = verdict(&Inputs {
            pools: Pools::Listed(vec![Ok(p)]),
            version,
            gates: Some(g),
            agent: Some(agent),
        });
        assert_eq!(lines.len(), 1);
        let (check, s, d) = lines.remove(0);
        assert_eq!(check, "karpenter default");
        (s, d)
    }

    fn v(s: &str) -> Version {
        Version::given("karpenter-version", s)
    }

    #[test]
    fn an_undeclared_gate_fails_with_the_patch_and_the_drift_warning() {
        let (s, d) = run(
            pool(UNDECLARED),
            gates(&[GATE], &[]),
            shipped_agent(),
            v("1.12.0"),
        );
        assert_eq!(s, Status::Fail, "{d}");
        assert!(d.contains("launches more nodes (duplicates)"), "{d}");
        assert!(
            d.contains(r#"kubectl patch nodepool default --type=json -p '[{"op":"add","path":"/spec/template/spec/startupTaints","value":[{"effect":"NoSchedule","key":"nodegate.dev/agent-not-ready","value":"true"}]}]'"#),
            "{d}"
        );
        assert!(
            d.contains("drifts and replaces every node of the pool"),
            "{d}"
        );
    }

    /// Every gate of the declaration, owned ones included, must be
    /// declared: the line names the one that is not, and patches only it.
    #[test]
    fn each_gate_of_a_declaration_is_named() {
        let two = || crate::gates::of_declaration(crate::gates::TWO_GATES);
        let (s, d) = run(pool(DECLARED), two(), shipped_agent(), v("1.0.0"));
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.starts_with("NodePool default does not declare nodegate's gate ebs-csi (ebs.csi.aws.com/agent-not-ready:NoExecute) in startupTaints"),
            "{d}"
        );
        assert!(!d.contains("cni ("), "{d}");
        assert!(
            d.contains(r#"-p '[{"op":"add","path":"/spec/template/spec/startupTaints/-","value":{"effect":"NoExecute","key":"ebs.csi.aws.com/agent-not-ready"}}]'"#),
            "{d}"
        );
        let both = "
spec:
  template:
    spec:
      startupTaints:
        - {key: nodegate.dev/agent-not-ready, value: 'true', effect: NoSchedule}
        - {key: ebs.csi.aws.com/agent-not-ready, effect: NoExecute}
";
        let (s, d) = run(pool(both), two(), shipped_agent(), v("1.0.0"));
        assert_eq!(s, Status::Pass, "{d}");
        assert!(
            d.starts_with("NodePool default: cni (nodegate.dev/agent-not-ready:NoSchedule) declared in startupTaints, ebs-csi (ebs.csi.aws.com/agent-not-ready:NoExecute) declared in startupTaints"),
            "{d}"
        );
    }

    #[test]
    fn the_patch_appends_to_existing_startup_taints() {
        let p = pool(
            "
spec:
  template:
    spec:
      startupTaints:
        - {key: example.com/other, effect: NoSchedule}
",
        );
        let (s, d) = run(p, gates(&[GATE], &[]), shipped_agent(), v("1.0.0"));
        assert_eq!(s, Status::Fail);
        assert!(
            d.contains(r#""path":"/spec/template/spec/startupTaints/-""#),
            "{d}"
        );
    }

    #[test]
    fn a_declared_gate_passes_whatever_its_value() {
        let (s, d) = run(
            pool(DECLARED),
            gates(&[GATE], &[]),
            shipped_agent(),
            v("1.0.0"),
        );
        assert_eq!(s, Status::Pass, "{d}");
        // MatchTaint ignores the value.
        let p = pool(
            "
spec:
  template:
    spec:
      startupTaints:
        - {key: nodegate.dev/agent-not-ready, effect: NoSchedule}
",
        );
        assert_eq!(
            run(p, gates(&[GATE], &[]), shipped_agent(), v("1.0.0")).0,
            Status::Pass
        );
    }

    #[test]
    fn strict_modes_boot_gate_must_be_declared_with_its_own_effect() {
        let (s, d) = run(
            pool(DECLARED),
            gates(&[GATE], &[BOOT]),
            shipped_agent(),
            v("1.0.0"),
        );
        assert_eq!(s, Status::Fail, "{d}");
        assert!(d.contains("nodegate.dev/agent-not-ready:NoExecute"), "{d}");
        assert!(!d.contains("NoSchedule in startupTaints"), "{d}");
        assert!(
            d.contains(r#""path":"/spec/template/spec/startupTaints/-""#),
            "{d}"
        );
    }

    #[test]
    fn only_ciliums_key_declared_is_the_upgrade_trap() {
        let p = pool(
            "
spec:
  template:
    spec:
      startupTaints:
        - {key: node.cilium.io/agent-not-ready, value: 'true', effect: NoExecute}
",
        );
        let (s, d) = run(p, gates(&[GATE], &[]), shipped_agent(), v("1.2.0"));
        assert_eq!(s, Status::Fail);
        assert!(
            d.contains("declares Cilium's key node.cilium.io/agent-not-ready"),
            "{d}"
        );
    }

    #[test]
    fn readiness_keys_are_known_from_1_13() {
        let g = || {
            gates(
                &["readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule"],
                &[],
            )
        };
        let cases = [
            (v("1.13.0"), Status::Pass, "known to Karpenter"),
            (v("1.14.2"), Status::Pass, "known to Karpenter"),
            (v("1.12.9"), Status::Fail, "kubectl patch nodepool"),
            (
                Version::Unknown("no tag".into()),
                Status::Fail,
                "pass --karpenter-version",
            ),
        ];
        for (version, want, text) in cases {
            let (s, d) = run(pool(UNDECLARED), g(), shipped_agent(), version.clone());
            assert_eq!(s, want, "{version:?}: {d}");
            assert!(d.contains(text), "{version:?}: {d}");
        }
    }

    #[test]
    fn a_gate_in_taints_instead_of_startup_taints_fails() {
        let p = pool(
            "
spec:
  template:
    spec:
      taints:
        - {key: nodegate.dev/agent-not-ready, value: 'true', effect: NoSchedule}
",
        );
        let (s, d) = run(p, gates(&[GATE], &[]), shipped_agent(), v("1.0.0"));
        assert_eq!(s, Status::Fail);
        assert!(
            d.contains("move it to spec.template.spec.startupTaints"),
            "{d}"
        );
    }

    #[test]
    fn where_the_agent_cannot_run() {
        let linux_only = AgentPlacement {
            node_selector: [("kubernetes.io/os".to_string(), "linux".to_string())].into(),
            ..shipped_agent()
        };
        let windows = "
spec:
  template:
    spec:
      requirements:
        - {key: kubernetes.io/os, operator: In, values: [windows]}
";
        let windows_declared = "
spec:
  template:
    spec:
      requirements:
        - {key: kubernetes.io/os, operator: In, values: [windows]}
      startupTaints:
        - {key: nodegate.dev/agent-not-ready, value: 'true', effect: NoSchedule}
";
        let (s, d) = run(
            pool(windows_declared),
            gates(&[GATE], &[]),
            linux_only.clone(),
            v("1.0.0"),
        );
        assert_eq!(s, Status::Fail);
        assert!(d.contains("never initialize"), "{d}");
        let (s, d) = run(
            pool(windows),
            gates(&[GATE], &[]),
            linux_only.clone(),
            v("1.0.0"),
        );
        assert_eq!(s, Status::Fail);
        assert!(d.contains("they stay gated"), "{d}");
        // The exclude label comes after registration: no way out of the gate.
        let excluded = format!(
            "
spec:
  template:
    metadata:
      labels: {{{EXCLUDE}: 'true'}}
    spec: {{}}
"
        );
        assert_eq!(
            run(
                pool(&excluded),
                gates(&[GATE], &[]),
                linux_only.clone(),
                v("1.0.0")
            )
            .0,
            Status::Fail
        );
        // A pool that leaves the OS open may run the agent: the gate must be declared.
        let (s, d) = run(
            pool(UNDECLARED),
            gates(&[GATE], &[]),
            linux_only,
            v("1.0.0"),
        );
        assert_eq!(s, Status::Fail);
        assert!(d.contains("the agent may run on its nodes"), "{d}");
        // A taint of the pool the agent does not tolerate.
        let tainted = "
spec:
  template:
    spec:
      taints:
        - {key: dedicated, value: gpu, effect: NoSchedule}
";
        let (s, d) = run(
            pool(tainted),
            gates(&[GATE], &[]),
            AgentPlacement::default(),
            v("1.0.0"),
        );
        assert_eq!(s, Status::Fail);
        assert!(
            d.contains("does not tolerate its taint dedicated=gpu:NoSchedule"),
            "{d}"
        );
    }

    #[test]
    fn node_affinity_terms_are_any_of_and_expressions_all_of() {
        let p = Pool {
            name: "gpu".into(),
            labels: [("team".to_string(), "a".to_string())].into(),
            ..Default::default()
        };
        let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        };
        let term = |rs: Vec<NodeSelectorRequirement>| NodeSelectorTerm {
            match_expressions: Some(rs),
            match_fields: None,
        };
        let agent = |terms| AgentPlacement {
            required_terms: Some(terms),
            ..shipped_agent()
        };
        let cases = [
            (vec![term(vec![req("team", "In", &["b"])])], false),
            (
                vec![
                    term(vec![req("team", "In", &["b"])]),
                    term(vec![req("karpenter.sh/nodepool", "In", &["gpu"])]),
                ],
                true,
            ),
            (vec![term(vec![req("team", "NotIn", &["a"])])], false),
            (
                vec![term(vec![
                    req("team", "Exists", &[]),
                    req("karpenter.sh/nodepool", "NotIn", &["cpu"]),
                ])],
                true,
            ),
        ];
        for (terms, runs) in cases {
            let fit = agent_fit(&agent(terms.clone()), &p, &[]);
            assert_eq!(matches!(fit, Fit::Yes), runs, "{terms:?}: {fit:?}");
        }
    }

    #[test]
    fn no_karpenter_older_karpenter_and_unreadable_pools_say_so() {
        let inputs = |pools| Inputs {
            pools,
            version: Version::Unknown("not read".into()),
            gates: Some(gates(&[GATE], &[])),
            agent: Some(shipped_agent()),
        };
        let line = |pools| verdict(&inputs(pools)).remove(0);
        assert_eq!(line(Pools::NotServed { older: None }).1, Status::Pass);
        let (_, s, d) = line(Pools::NotServed {
            older: Some("v1beta1".into()),
        });
        assert_eq!(s, Status::Warn);
        assert!(d.contains("by hand"), "{d}");
        assert_eq!(line(Pools::Unreadable("403".into())).1, Status::Warn);
        let (check, s, d) = line(Pools::Listed(vec![Err((
            "bad".into(),
            "invalid type".into(),
        ))]));
        assert_eq!((check.as_str(), s), ("karpenter bad", Status::Fail));
        assert!(d.contains("cannot read NodePool bad (invalid type)"), "{d}");
    }

    #[test]
    fn a_nodepool_that_does_not_parse_is_an_error_not_a_panic() {
        let v: serde_json::Value =
            serde_yaml::from_str("template: {spec: {startupTaints: [{key: 3}]}}").unwrap();
        let e = Pool::from_spec("p", &v).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        assert!(Pool::from_spec("p", &serde_json::Value::Null).is_err());
    }
}
