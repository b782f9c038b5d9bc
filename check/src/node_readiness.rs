//! SIG Node's Node Readiness Controller (NRC) and nodegate's gate key.
//! Everything below was read in kubernetes-sigs/node-readiness-controller at
//! commit `e5ff8d103234409eed9555922465d1c38618564e` (`v0.5.0-14-ge5ff8d1`);
//! each point holds at tag `v0.5.0` (`704b65442f11`) too.
//!
//! - The API: group `readiness.node.x-k8s.io`, version `v1alpha1` (the only
//!   one, served and stored), kind `NodeReadinessRule`, plural
//!   `nodereadinessrules`, cluster-scoped (`api/v1alpha1/groupversion_info.go`
//!   `GroupVersion`; `api/v1alpha1/nodereadinessrule_types.go`
//!   `+kubebuilder:resource:scope=Cluster,shortName=nrr`;
//!   `config/crd/bases/readiness.node.x-k8s.io_nodereadinessrules.yaml`).
//! - A rule's taint is `spec.taint`, a `corev1.Taint` (`key`, `value`,
//!   `effect`), `NodeReadinessRuleSpec.Taint` in
//!   `api/v1alpha1/nodereadinessrule_types.go`. Its CEL rules force
//!   `self.key.startsWith('readiness.k8s.io/')` ("taint key must start with
//!   'readiness.k8s.io/'", since v0.2.0, PR #112) and make key, effect and
//!   value immutable.
//! - The domain is NRC's: "Treat this domain as reserved for the controller
//!   and closely related components, and avoid reusing it for unrelated
//!   taints" (`docs/book/src/user-guide/concepts.md`, "Readiness Domain and
//!   Taint Keys"). nodegate's `karpenter` key profile uses
//!   `readiness.k8s.io/nodegate-agent-not-ready` (Karpenter knows every key
//!   there as ephemeral).
//! - NRC owns its rule's taint on every node the rule's `nodeSelector`
//!   selects (`internal/controller/nodereadinessrule_controller.go`
//!   `ruleAppliesTo`), matched by key and effect, the value ignored
//!   (`internal/controller/node_controller.go` `hasTaintBySpec`):
//!   `evaluateRuleForNode` (same controller file) adds it while the rule's
//!   conditions are unmet (`addTaintBySpec`), adopts one already there
//!   ("Adopting pre-existing taint": nodegate's gate on a new node), and
//!   removes it as soon as the conditions are met (`removeTaintBySpec`,
//!   `removeTaintAndCompleteBootstrap`), whatever nodegate's agent says.
//! - Deleting a rule: its finalizer `readiness.node.x-k8s.io/cleanup-taints`
//!   holds it until `RuleReconciler.reconcileDelete` has run
//!   `RuleReadinessController.cleanupTaintsForRule`
//!   (`internal/controller/nodereadinessrule_controller.go`), which removes
//!   the taint from every node the rule selects — gated nodes whose agent is
//!   not ready included, and for a `dryRun` rule too (neither function looks
//!   at `dryRun`).
//! - NRC's validating webhook (`internal/webhook/nodereadinessgaterule_webhook.go`
//!   `validateNodeReadinessRule` → `validateSpec`, `validateTaintConflicts`)
//!   compares a rule with the other rules only (same key and effect,
//!   overlapping selectors): nothing stops a rule naming a key another
//!   component (nodegate) already puts on nodes.
//!
//! So a rule naming one of nodegate's keys gives that key two owners that
//! add and remove it on their own conditions, and deleting the rule strips
//! nodegate's gate from every selected node. That fails; a served API with
//! no such rule passes, noting the reserved domain when nodegate's key is in
//! it.
//!
//! [`verdict`] decides from what was read; [`check`] only reads.

use k8s_openapi::api::core::v1::Taint;
use kube::Client;
use kube::api::ApiResource;
use kube::core::GroupVersionKind;
use serde::Deserialize;

use crate::gates::{Gate, keys};
use crate::installed::Installed;
use crate::report::{Report, Status};

pub const CHECK: &str = "node readiness controller";
pub const GROUP: &str = "readiness.node.x-k8s.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "NodeReadinessRule";
pub const PLURAL: &str = "nodereadinessrules";
/// The domain NRC reserves, and its CRD forces every rule's key under.
pub const RESERVED_PREFIX: &str = "readiness.k8s.io/";
/// `docs/book/src/user-guide/concepts.md`, word for word.
pub const RESERVED_QUOTE: &str = "Treat this domain as reserved for the controller and closely related components, and avoid reusing it for unrelated taints";

/// A `readiness.node.x-k8s.io/v1alpha1` NodeReadinessRule's spec, the
/// fields this check reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleSpec {
    pub taint: Taint,
    #[serde(default)]
    pub enforcement_mode: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
}

/// One NodeReadinessRule as read.
#[derive(Debug, Clone, Default)]
pub struct Rule {
    pub name: String,
    pub spec: RuleSpec,
}

impl Rule {
    /// A rule object's spec; `Err` says what could not be read.
    pub fn from_spec(name: &str, spec: &serde_json::Value) -> Result<Rule, String> {
        let spec: RuleSpec = serde_json::from_value(spec.clone()).map_err(|e| e.to_string())?;
        Ok(Rule {
            name: name.to_string(),
            spec,
        })
    }

    /// `key=value:Effect` (`key:Effect` without a value).
    fn taint(&self) -> String {
        let t = &self.spec.taint;
        match t.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
            _ => format!("{}:{}", t.key, t.effect),
        }
    }
}

/// What was read of the NodeReadinessRules.
#[derive(Debug, Clone)]
pub enum Rules {
    /// Served: each rule, or its name and why it could not be read.
    Listed(Vec<Result<Rule, (String, String)>>),
    /// The list answered 404: no Node Readiness Controller's CRD.
    NotServed,
    Unreadable(String),
}

/// What [`verdict`] decides on.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub rules: Rules,
    /// nodegate's gates as installed; `None`: unknown.
    pub gates: Option<Vec<Gate>>,
}

/// The key of a `key=value:Effect` constant.
fn key_of(taint: &'static str) -> &'static str {
    taint.split_once('=').map_or(taint, |(key, _)| key)
}

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// The Node Readiness Controller line.
pub fn verdict(i: &Inputs) -> (Status, String) {
    let rules = match &i.rules {
        Rules::NotServed => {
            return (
                Status::Pass,
                format!("no Node Readiness Controller ({KIND} not served)"),
            );
        }
        Rules::Unreadable(e) => {
            return (
                Status::Warn,
                format!(
                    "cannot list {GROUP}/{VERSION} {KIND}s ({e}): cannot tell whether a rule of the Node Readiness Controller names nodegate's gate key, which would give the key two owners; check by hand with `kubectl get {PLURAL} -o custom-columns=NAME:.metadata.name,TAINT:.spec.taint.key`, and let nodegate-check list {PLURAL}.{GROUP}"
                ),
            );
        }
        Rules::Listed(r) => r,
    };
    let Some(gates) = &i.gates else {
        return (
            Status::Skip,
            "cannot tell which taints nodegate adds: neither the webhook StatefulSet's nor the agent DaemonSet's flags could be read (see above)".into(),
        );
    };
    let keys = keys(gates);
    // Every shipped gate's key too: whatever the profile, the agent releases
    // them and they stand in for the configured gate, so a rule naming one
    // is a second owner under every configuration.
    let shipped: Vec<String> = nodegate_shared::taint::shipped_gates()
        .iter()
        .map(|g| g.key().to_string())
        .collect();
    let clashes: Vec<String> = rules
        .iter()
        .flatten()
        .filter(|r| {
            let k = r.spec.taint.key.as_str();
            keys.contains(&k) || shipped.iter().any(|s| s == k)
        })
        .map(|r| {
            let dry = if r.spec.dry_run { " (dryRun)" } else { "" };
            format!(
                "{KIND} {}{dry} manages {}, nodegate's key {}",
                r.name,
                r.taint(),
                r.spec.taint.key
            )
        })
        .collect();
    if !clashes.is_empty() {
        return (
            Status::Fail,
            format!(
                "{}: the key has two owners. The Node Readiness Controller adds it to every node the rule's nodeSelector selects while the rule's conditions are unmet, adopts nodegate's gate on a new node, and removes it as soon as its conditions are met, whether or not nodegate's agent is ready; deleting the rule runs cleanupTaintsForRule, which removes it from every selected node, gated ones included (a dryRun rule too). Fix: delete the rule, or recreate it with a taint key of its own (spec.taint is immutable); or move nodegate off {RESERVED_PREFIX}: the default key {} plus each NodePool's startupTaints (docs/autoscalers.md)",
                clashes.join("; "),
                key_of(nodegate_shared::keys::DEFAULT_TAINT),
            ),
        );
    }
    let unread: Vec<String> = rules
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|(name, e)| format!("{name} ({e})"))
        .collect();
    if !unread.is_empty() {
        return (
            Status::Warn,
            format!(
                "cannot read {KIND} {}: cannot tell whether it names nodegate's key ({}); check its spec.taint.key by hand",
                unread.join(", "),
                keys.join(", ")
            ),
        );
    }
    let count = plural(rules.len(), KIND);
    let reserved: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| k.starts_with(RESERVED_PREFIX))
        .collect();
    if reserved.is_empty() {
        return (
            Status::Pass,
            format!("{count}, none names nodegate's key ({})", keys.join(", ")),
        );
    }
    let profile = key_of(nodegate_shared::keys::KARPENTER_PROFILE_TAINT);
    let named: Vec<String> = reserved
        .iter()
        .map(|k| {
            if *k == profile {
                format!("{k} (the karpenter key profile)")
            } else {
                (*k).to_string()
            }
        })
        .collect();
    (
        Status::Pass,
        format!(
            "the Node Readiness Controller runs here ({count}, none names nodegate's key), and nodegate's gate {} is in its reserved domain {RESERVED_PREFIX}: \"{RESERVED_QUOTE}\" (docs/book/src/user-guide/concepts.md); its webhook checks a rule against other rules only, so a rule naming this key later would give it two owners",
            named.join(", ")
        ),
    )
}

fn rules_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

async fn read_rules(client: &Client) -> Rules {
    match crate::read::list_specs(client, &rules_resource(), Rule::from_spec).await {
        Ok(rules) => Rules::Listed(rules),
        Err(e) if crate::read::not_found(&e) => Rules::NotServed,
        Err(e) => Rules::Unreadable(e.to_string()),
    }
}

/// Lists the NodeReadinessRules and reports [`verdict`].
pub async fn check(client: &Client, installed: &Installed, report: &mut Report) {
    let inputs = Inputs {
        rules: read_rules(client).await,
        // A gate owned elsewhere is another component's to remove: a rule
        // may well be how it does.
        gates: crate::gates::installed(installed)
            .map(|g| g.into_iter().filter(|g| g.owner.is_none()).collect()),
    };
    let (status, detail) = verdict(&inputs);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::{DEFAULT_TAINT, KARPENTER_PROFILE_TAINT};

    const KARPENTER_KEY: &str = "readiness.k8s.io/nodegate-agent-not-ready";

    use crate::gates::parsed as gates;

    /// Upstream's `config/samples/v1alpha1_nodereadinessrule.yaml`.
    const SAMPLE: &str = r#"
apiVersion: readiness.node.x-k8s.io/v1alpha1
kind: NodeReadinessRule
metadata:
  labels:
    app.kubernetes.io/name: nrrcontroller
    app.kubernetes.io/managed-by: kustomize
  name: nodereadinessrule-sample
spec:
  conditions:
    - type: "network.kubernetes.io/CNIReady"
      requiredStatus: "True"
  taint:
    key: "readiness.k8s.io/NetworkReady"
    effect: "NoSchedule"
    value: "pending"
  enforcementMode: "bootstrap-only"
  nodeSelector:
    matchLabels:
      node-role.kubernetes.io/worker: ""
"#;

    fn from_yaml(yaml: &str) -> Rule {
        let v: serde_json::Value = serde_yaml::from_str(yaml).unwrap();
        Rule::from_spec(v["metadata"]["name"].as_str().unwrap(), &v["spec"]).unwrap()
    }

    fn rule(name: &str, key: &str, effect: &str, dry_run: bool) -> Rule {
        Rule {
            name: name.into(),
            spec: RuleSpec {
                taint: Taint {
                    key: key.into(),
                    effect: effect.into(),
                    value: Some("pending".into()),
                    ..Default::default()
                },
                enforcement_mode: Some("continuous".into()),
                dry_run,
            },
        }
    }

    #[test]
    fn upstreams_sample_rule_reads() {
        let r = from_yaml(SAMPLE);
        assert_eq!(r.name, "nodereadinessrule-sample");
        assert_eq!(r.spec.taint.key, "readiness.k8s.io/NetworkReady");
        assert_eq!(r.spec.taint.effect, "NoSchedule");
        assert_eq!(r.spec.taint.value.as_deref(), Some("pending"));
        assert_eq!(r.spec.enforcement_mode.as_deref(), Some("bootstrap-only"));
        assert!(!r.spec.dry_run);
        assert_eq!(
            r.taint(),
            "readiness.k8s.io/NetworkReady=pending:NoSchedule"
        );
    }

    #[test]
    fn a_rule_without_a_taint_is_unreadable() {
        let v = serde_json::json!({"conditions": [], "enforcementMode": "continuous"});
        assert!(Rule::from_spec("broken", &v).is_err());
    }

    /// What was read, nodegate's gates, the status, what the detail must
    /// say.
    type Case = (Rules, Option<Vec<Gate>>, Status, Vec<&'static str>);

    #[test]
    fn verdicts() {
        let karpenter = || Some(gates(&[KARPENTER_PROFILE_TAINT], &[]));
        let default = || Some(gates(&[DEFAULT_TAINT], &[]));
        let strict_karpenter = || {
            Some(gates(
                &[KARPENTER_PROFILE_TAINT],
                &["readiness.k8s.io/nodegate-agent-not-ready=true:NoExecute"],
            ))
        };
        let sample = || Ok(from_yaml(SAMPLE));
        let ours = |effect, dry| Ok(rule("nodegate-gate", KARPENTER_KEY, effect, dry));
        let cases: Vec<Case> = vec![
            (
                Rules::NotServed,
                karpenter(),
                Status::Pass,
                vec!["no Node Readiness Controller (NodeReadinessRule not served)"],
            ),
            // Not served decides before the gates are known.
            (Rules::NotServed, None, Status::Pass, vec!["not served"]),
            (
                Rules::Unreadable("nodereadinessrules.readiness.node.x-k8s.io is forbidden".into()),
                karpenter(),
                Status::Warn,
                vec![
                    "is forbidden",
                    "kubectl get nodereadinessrules",
                    "let nodegate-check list nodereadinessrules.readiness.node.x-k8s.io",
                ],
            ),
            (
                Rules::Listed(vec![sample()]),
                None,
                Status::Skip,
                vec!["cannot tell which taints nodegate adds"],
            ),
            (
                Rules::Listed(vec![sample(), ours("NoSchedule", false)]),
                karpenter(),
                Status::Fail,
                vec![
                    "NodeReadinessRule nodegate-gate manages readiness.k8s.io/nodegate-agent-not-ready=pending:NoSchedule, nodegate's key readiness.k8s.io/nodegate-agent-not-ready",
                    "two owners",
                    "cleanupTaintsForRule",
                    "delete the rule",
                    "nodegate.dev/agent-not-ready plus each NodePool's startupTaints (docs/autoscalers.md)",
                ],
            ),
            // Another effect, a dry run: still nodegate's key, still
            // cleaned up on delete.
            (
                Rules::Listed(vec![ours("NoExecute", true)]),
                strict_karpenter(),
                Status::Fail,
                vec![
                    "nodegate-gate (dryRun) manages",
                    ":NoExecute",
                    "a dryRun rule too",
                ],
            ),
            // A clash fails even next to a rule that cannot be read.
            (
                Rules::Listed(vec![
                    Err(("broken".into(), "missing field `taint`".into())),
                    ours("NoSchedule", false),
                ]),
                karpenter(),
                Status::Fail,
                vec!["nodegate-gate"],
            ),
            (
                Rules::Listed(vec![
                    sample(),
                    Err(("broken".into(), "missing field `taint`".into())),
                ]),
                karpenter(),
                Status::Warn,
                vec!["cannot read NodeReadinessRule broken (missing field `taint`)"],
            ),
            (
                Rules::Listed(vec![sample()]),
                karpenter(),
                Status::Pass,
                vec![
                    "the Node Readiness Controller runs here (1 NodeReadinessRule, none names nodegate's key)",
                    "readiness.k8s.io/nodegate-agent-not-ready (the karpenter key profile)",
                    RESERVED_QUOTE,
                ],
            ),
            (
                Rules::Listed(vec![]),
                karpenter(),
                Status::Pass,
                vec!["0 NodeReadinessRules", "reserved domain"],
            ),
            (
                Rules::Listed(vec![
                    sample(),
                    Ok(rule("cni", "readiness.k8s.io/cni", "NoSchedule", false)),
                ]),
                default(),
                Status::Pass,
                vec![
                    "2 NodeReadinessRules, none names nodegate's key (nodegate.dev/agent-not-ready)",
                ],
            ),
        ];
        for (rules, gates, want, says) in cases {
            let what = format!("{rules:?} {gates:?}");
            let (status, detail) = verdict(&Inputs { rules, gates });
            assert_eq!(status, want, "{what}: {detail}");
            for s in says {
                assert!(detail.contains(s), "{what}: {detail:?} lacks {s:?}");
            }
        }
    }

    #[test]
    fn only_the_profiles_key_is_called_the_karpenter_profile() {
        let (status, detail) = verdict(&Inputs {
            rules: Rules::Listed(vec![]),
            gates: Some(gates(&["readiness.k8s.io/my-gate=true:NoSchedule"], &[])),
        });
        assert_eq!(status, Status::Pass, "{detail}");
        assert!(
            detail.contains("gate readiness.k8s.io/my-gate is in its reserved domain"),
            "{detail}"
        );
        assert!(!detail.contains("karpenter"), "{detail}");
    }

    #[test]
    fn the_karpenter_profiles_key_clashes_under_every_profile() {
        // The default install releases that key and takes it as a stand-in
        // for its own gate, so a rule naming it is a second owner there too.
        let (status, detail) = verdict(&Inputs {
            rules: Rules::Listed(vec![Ok(rule("x", KARPENTER_KEY, "NoSchedule", false))]),
            gates: Some(gates(&[DEFAULT_TAINT], &[])),
        });
        assert_eq!(status, Status::Fail, "{detail}");
        assert!(detail.contains("two owners"), "{detail}");
        // A rule of its own key is fine.
        let (status, detail) = verdict(&Inputs {
            rules: Rules::Listed(vec![Ok(rule(
                "x",
                "readiness.k8s.io/network-ready",
                "NoSchedule",
                false,
            ))]),
            gates: Some(gates(&[DEFAULT_TAINT], &[])),
        });
        assert_eq!(status, Status::Pass, "{detail}");
        assert!(!detail.contains("reserved"), "{detail}");
    }

    #[test]
    fn the_resource_is_the_crds() {
        let r = rules_resource();
        assert_eq!(r.api_version, "readiness.node.x-k8s.io/v1alpha1");
        assert_eq!(r.kind, "NodeReadinessRule");
        assert_eq!(r.plural, "nodereadinessrules");
    }
}
