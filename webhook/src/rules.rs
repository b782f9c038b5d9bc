//! The admission decision: which Node writes get which taints, and why.
//!
//! Pure and synchronous: no I/O, so it is table-tested directly and runs on
//! the runtime threads without blocking them. It reads kube's
//! `AdmissionRequest` with the Node as the workspace's [`NodeView`], and owns
//! everything a decision carries: the taints to add and why, the patch that
//! adds them (shaped by `nodegate_shared::patch::add_taints`, the same builder
//! the agent and the background patcher use), and the follow-up jobs.
//! Nothing here knows about bytes, HTTP or metrics.
//!
//! [`Rule`] names the rules, as docs/webhook.md states them; the manifest
//! renderers cite the same names.

use json_patch::Patch;
use kube::core::admission::{AdmissionRequest, Operation};
use nodegate_shared::keys::NODE_USER_PREFIX;
use nodegate_shared::node::{boot_id_changed, rebooted_since_ready};
use nodegate_shared::patch::{Guard, add_taints};
use nodegate_shared::taint::{Effect, check_unique};
use nodegate_shared::{NodeView, TaintError, TaintSpec};

/// An admission request for a Node, as kube decodes it.
pub type Request = AdmissionRequest<NodeView>;

/// The webhook's rules, as docs/webhook.md states them. Generated manifests
/// and older texts cite them as "rule N": [`Rule::number`] is that N, so the
/// numbers never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Rule 1. A Node create gets every configured taint it lacks, dry-run
    /// too. When a kubelet re-registers (the Node exists) and the create's
    /// boot ID shows a reboot, the stored Node is re-tainted before the
    /// create is answered.
    NodeCreate,
    /// Rule 2. An update of the main resource gets the taints back when the
    /// node rebooted since its agent was last ready (the ready-boot-id
    /// annotation differs from the stored bootID). A kubelet's own update is
    /// never mutated: NodeRestriction would refuse it.
    UpdateAfterReboot,
    /// Rule 3. A `nodes/status` write is never patched (the API server keeps
    /// the stored spec); one that shows a reboot gets the main resource
    /// re-tainted by a guarded background patch.
    StatusShowsReboot,
    /// Rule 4. Excluded Nodes (the exclude label, which only an admin can
    /// set), other kinds, deletes and connects are left untouched.
    Excluded,
    /// Rule 5. Only missing taints are added (by key and effect), in front
    /// of the others, so a second call on the mutated object adds nothing.
    Idempotent,
    /// Rule 6. An answer that adds taints warns once per taint, naming it and
    /// why.
    Warning,
    /// Rule 7. Strict mode's boot gate (`--boot-taint`) is one more
    /// configured taint for every rule above.
    BootGate,
}

impl Rule {
    /// Every rule, in order.
    pub const ALL: [Rule; 7] = [
        Rule::NodeCreate,
        Rule::UpdateAfterReboot,
        Rule::StatusShowsReboot,
        Rule::Excluded,
        Rule::Idempotent,
        Rule::Warning,
        Rule::BootGate,
    ];

    /// The number docs/webhook.md gives the rule.
    pub const fn number(self) -> u8 {
        match self {
            Rule::NodeCreate => 1,
            Rule::UpdateAfterReboot => 2,
            Rule::StatusShowsReboot => 3,
            Rule::Excluded => 4,
            Rule::Idempotent => 5,
            Rule::Warning => 6,
            Rule::BootGate => 7,
        }
    }

    /// The rules' numbers as prose lists them: `1`, `1 and 2`, `1, 2, 4 and 5`.
    pub fn numbers(rules: &[Rule]) -> String {
        let shown: Vec<String> = rules.iter().map(|r| r.number().to_string()).collect();
        match shown.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => shown.concat(),
        }
    }
}

/// Why taints were added; also the `reason` label of the taints metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A new Node: its network agent cannot be ready yet.
    Create,
    /// A write after the node rebooted since its agent was last ready.
    Reboot,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Create => "create",
            Reason::Reboot => "reboot",
        }
    }

    /// The end of the warning the requester sees for each added taint.
    fn explanation(self) -> &'static str {
        match self {
            Reason::Create => "new node, its network agent is not ready yet",
            Reason::Reboot => "node rebooted since its network agent was last ready",
        }
    }

    /// The same for a gate owned elsewhere: its owner, not nodegate, lifts it.
    fn owned_explanation(self) -> &'static str {
        match self {
            Reason::Create => "new node; the component that owns this gate removes it",
            Reason::Reboot => "node rebooted; the component that owns this gate removes it",
        }
    }
}

/// Taints added by the answer: which, why, and the JSON patch adding them to
/// the object under review.
#[derive(Debug, Clone, PartialEq)]
pub struct Added {
    pub reason: Reason,
    /// Every taint added, gates owned elsewhere included, in patch order.
    pub taints: Vec<TaintSpec>,
    /// Those of `taints` owned elsewhere (`--owned-taint`).
    pub owned: Vec<TaintSpec>,
    pub patch: Patch,
}

impl Added {
    /// One warning per added taint, shown to the client that made the write.
    pub fn warnings(&self) -> Vec<String> {
        self.taints
            .iter()
            .map(|t| {
                let why = if self.owned.contains(t) {
                    self.reason.owned_explanation()
                } else {
                    self.reason.explanation()
                };
                format!("nodegate: added taint {t}: {why}")
            })
            .collect()
    }
}

/// A node whose status write showed a reboot: its main resource needs the
/// taints, patched in the background (a status write cannot carry them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootJob {
    pub node: String,
    /// When the write changes the bootID: the one it replaces (empty when
    /// there was none). Until the stored node moves off it, the write that
    /// triggered the job is not stored yet. Set, the boot is new and the
    /// job adds the gates owned elsewhere too; unset, nodegate's taints only.
    pub previous_boot: Option<String>,
}

/// A kubelet's create of a Node that may already exist: its name and the boot
/// ID the create carries (`initialNode` fills the status before the create).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reregistration {
    pub node: String,
    pub boot_id: String,
}

/// A write of the stored Node that a review asked for and did not get,
/// because the write it reviews is not the node's own kubelet's.
///
/// Threat: anyone who may create Nodes (Cluster API, virtual-kubelet, an
/// autoscaler's provider, a dry-run-only credential) or write `nodes/status`
/// could otherwise post a copy of a ready Node with another boot ID. Mutating
/// admission runs before the store answers AlreadyExists, so the re-taint
/// would stay, and in strict mode the boot gate would evict the node's pods.
/// Only `system:node:<name>`, which NodeRestriction already holds to its own
/// Node, reports that node's boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// A create of a Node by someone other than its kubelet.
    Reregistration,
    /// A status write showing a reboot by someone other than its kubelet.
    Status,
}

/// The outcome of one review. The answer is always allowed: nodegate only
/// adds taints, and never blocks a write.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Taints the answer adds, with its patch.
    pub added: Option<Added>,
    /// A status write after a reboot: this node needs a background patch of
    /// its main resource. `None` on dry-run.
    pub reboot_job: Option<RebootJob>,
    /// A Node create (not dry-run): if the name already exists this is a
    /// kubelet re-registering, and the stored node may need its taints back
    /// before the create is answered (the kubelet's status write follows the
    /// answer).
    pub reregistration: Option<Reregistration>,
    /// A write of the stored Node this review would have asked for, not
    /// asked: the write is not the node's own kubelet's ([`Foreign`]).
    pub foreign: Option<Foreign>,
    /// The rule that decided; the answer is what it says.
    pub rule: Rule,
    /// One short phrase for the log line.
    pub why: &'static str,
}

impl Decision {
    fn allow(rule: Rule, why: &'static str) -> Self {
        Decision {
            added: None,
            reboot_job: None,
            reregistration: None,
            foreign: None,
            rule,
            why,
        }
    }
}

/// The configured taints and the decisions made with them.
#[derive(Debug, Clone)]
pub struct Rules {
    /// nodegate's gates (`--taint`, then `--boot-taint`).
    taints: Vec<TaintSpec>,
    /// Gates owned elsewhere (`--owned-taint`).
    owned: Vec<TaintSpec>,
    /// `owned` then `taints`: what a new node or a new boot gets. Each add
    /// goes to index 0, so nodegate's land in front of the owned ones, and
    /// an owner's removal never moves the gate the agent's ready patch
    /// tests at its index.
    new_boot: Vec<TaintSpec>,
}

/// `system:node:<name>`: the kubelet of that node.
fn is_node_itself(username: Option<&str>, node: Option<&str>) -> bool {
    match (
        username.and_then(|u| u.strip_prefix(NODE_USER_PREFIX)),
        node,
    ) {
        (Some(user_node), Some(node)) => user_node == node,
        _ => false,
    }
}

/// The ServiceAccount name of nodegate's agent, in any namespace, as the
/// confinement matches it (`nodegate-webhook confinement`).
pub const AGENT_SERVICE_ACCOUNT: &str = "nodegate-agent";
/// The claim a pod-bound token carries: the node its pod runs on.
pub const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";

/// The agent of `node` itself: `nodegate-agent`'s pod-bound token with that
/// node's claim. Its confinement lets it touch only its own node's gates.
fn is_own_agent(user: &k8s_openapi::api::authentication::v1::UserInfo, node: Option<&str>) -> bool {
    let sa = user
        .username
        .as_deref()
        .and_then(|u| u.strip_prefix("system:serviceaccount:"))
        .and_then(|u| u.split_once(':'))
        .is_some_and(|(_, name)| name == AGENT_SERVICE_ACCOUNT);
    let claim = user
        .extra
        .as_ref()
        .and_then(|e| e.get(NODE_CLAIM))
        .and_then(|v| v.first())
        .map(String::as_str);
    sa && node.is_some() && claim == node
}

impl Rules {
    /// Refuses duplicates (same key and effect): the API server would reject
    /// a Node carrying both.
    pub fn new(taints: Vec<TaintSpec>) -> Result<Self, TaintError> {
        Self::with_owned(taints, Vec::new())
    }

    /// [`Rules::new`] with gates owned elsewhere (`--owned-taint`: another
    /// component, such as a CSI node plugin, removes them), none sharing a
    /// key and effect with another taint. They are added with the taints on
    /// a new node and on a new boot only: at a create ([`Rule::NodeCreate`],
    /// dry-run too), at a re-registration claiming a new boot (never a
    /// `NoExecute` one there), and by the background patch of the status
    /// write that moves the bootID ([`Rule::StatusShowsReboot`]). Never on
    /// a later write of the same boot, [`Rule::UpdateAfterReboot`]
    /// included: the owner removes its taint with such a write, and adding
    /// it back would undo the removal, each write calling for the next.
    pub fn with_owned(taints: Vec<TaintSpec>, owned: Vec<TaintSpec>) -> Result<Self, TaintError> {
        let new_boot: Vec<TaintSpec> = owned.iter().chain(&taints).cloned().collect();
        check_unique(&new_boot)?;
        Ok(Self {
            taints,
            owned,
            new_boot,
        })
    }

    pub fn taints(&self) -> &[TaintSpec] {
        &self.taints
    }

    /// The gates owned elsewhere.
    pub fn owned(&self) -> &[TaintSpec] {
        &self.owned
    }

    /// Decides one admission request. Never denies: nodegate only adds taints.
    pub fn review(&self, req: &Request) -> Decision {
        let allow = Decision::allow;
        // Only core v1 Nodes are ours, whatever the configuration sends.
        if !req.kind.group.is_empty() || req.kind.version != "v1" || req.kind.kind != "Node" {
            return allow(Rule::Excluded, "not a v1 Node");
        }
        let Some(node) = req.object.as_ref() else {
            return allow(Rule::Excluded, "no object");
        };
        if node.is_excluded() {
            return allow(Rule::Excluded, "node excluded by label");
        }
        let sub = req.sub_resource.as_deref().unwrap_or("");
        match (&req.operation, sub) {
            (Operation::Create, "") => self.node_create(req, node),
            (Operation::Update, "") => self.update_after_reboot(req, node),
            (Operation::Update, "status") => self.status_shows_reboot(req, node),
            _ => allow(Rule::Excluded, "operation not handled"),
        }
    }

    /// [`Rule::NodeCreate`]: a new node cannot have a ready agent. A pure
    /// mutation of the object under review, so a dry-run gets it too.
    fn node_create(&self, req: &Request, node: &NodeView) -> Decision {
        // A new node: the gates owned elsewhere too.
        let mut d = self.taint(
            node,
            &self.new_boot,
            Rule::NodeCreate,
            Reason::Create,
            "create",
        );
        if !req.dry_run
            && let (Some(name), Some(boot)) = (node.name(), node.boot_id())
        {
            if is_node_itself(req.user_info.username.as_deref(), Some(name)) {
                d.reregistration = Some(Reregistration {
                    node: name.to_owned(),
                    boot_id: boot.to_owned(),
                });
            } else {
                d.foreign = Some(Foreign::Reregistration);
            }
        }
        d
    }

    /// [`Rule::UpdateAfterReboot`]: the stored object says whether the node
    /// rebooted since its agent was last ready. nodegate's taints only: the
    /// owner of a gate owned elsewhere removes it with just such an update,
    /// and adding it back here would undo that in the same write
    /// ([`Rules::with_owned`]).
    fn update_after_reboot(&self, req: &Request, node: &NodeView) -> Decision {
        let rule = Rule::UpdateAfterReboot;
        // The kubelet's own update: NodeRestriction refuses a kubelet update
        // that changes taints, and it runs again after a mutation, so
        // patching it would fail the kubelet's write.
        if is_node_itself(req.user_info.username.as_deref(), node.name()) {
            return Decision::allow(rule, "update by the node itself");
        }
        // The node's own agent opens its gates one at a time: a gate it
        // removes while another still holds the node (before the last one's
        // patch records the boot) is meant, and adding it back would undo
        // each such write, write after write.
        if is_own_agent(&req.user_info, node.name()) {
            return Decision::allow(rule, "update by the node's own agent");
        }
        let old_boot = req.old_object.as_ref().and_then(NodeView::boot_id);
        if !rebooted_since_ready(node.ready_boot_id(), old_boot) {
            return Decision::allow(rule, "update: no reboot since ready");
        }
        self.taint(
            node,
            &self.taints,
            rule,
            Reason::Reboot,
            "update after reboot",
        )
    }

    /// [`Rule::StatusShowsReboot`]: a status write keeps the stored spec, so
    /// a patch of its taints would be dropped: the main resource is fixed in
    /// the background instead.
    fn status_shows_reboot(&self, req: &Request, node: &NodeView) -> Decision {
        let allow = |why| Decision::allow(Rule::StatusShowsReboot, why);
        let old = req.old_object.as_ref();
        let old_boot = old.and_then(NodeView::boot_id);
        let new_boot = node.boot_id();
        let rebooted = boot_id_changed(old_boot, new_boot)
            || rebooted_since_ready(node.ready_boot_id(), new_boot);
        if !rebooted {
            return allow("status: no reboot");
        }
        // The write that moves the bootID happens once per boot: only it
        // brings back the gates owned elsewhere. Every later status
        // write of that boot still differs from the ready record, and adding
        // them then would undo their owner's removal, again and again.
        let moves_boot = old_boot != new_boot;
        let wanted = if moves_boot {
            &self.new_boot
        } else {
            &self.taints
        };
        // The stored spec is what a status write keeps.
        let stored = old.filter(|o| o.has_spec()).unwrap_or(node);
        if stored.missing(wanted).is_empty() {
            return allow("status: rebooted, taints present");
        }
        if req.dry_run {
            return allow("status: rebooted, dry-run");
        }
        if !is_node_itself(req.user_info.username.as_deref(), node.name()) {
            let mut d = allow("status: rebooted, not written by the node's kubelet");
            d.foreign = Some(Foreign::Status);
            return d;
        }
        let mut d = allow("status: rebooted, background patch");
        d.reboot_job = node.name().map(|name| RebootJob {
            node: name.to_owned(),
            previous_boot: moves_boot.then(|| old_boot.unwrap_or("").to_owned()),
        });
        d
    }

    /// Adds the configured taints `node` lacks, as `rule` decided. Taints
    /// already there are left alone, so a second call on the patched object
    /// (the API server may reinvoke webhooks) adds nothing: that answer is
    /// [`Rule::Idempotent`]'s.
    fn taint(
        &self,
        node: &NodeView,
        wanted: &[TaintSpec],
        rule: Rule,
        reason: Reason,
        why: &'static str,
    ) -> Decision {
        let missing = node.missing(wanted);
        if missing.is_empty() {
            return Decision::allow(Rule::Idempotent, "taints already present");
        }
        let patch = add_taints(node, &missing, Guard::None);
        let owned = missing
            .iter()
            .filter(|t| self.owned.contains(t))
            .map(|t| (*t).clone())
            .collect();
        Decision {
            added: Some(Added {
                reason,
                taints: missing.into_iter().cloned().collect(),
                owned,
                patch,
            }),
            reboot_job: None,
            reregistration: None,
            foreign: None,
            rule,
            why,
        }
    }

    /// A kubelet re-registering (its create of an existing Node), the second
    /// half of [`Rule::NodeCreate`]: the taints the stored node needs back. The create's boot ID shows a reboot when
    /// the agent recorded another boot as ready, or the stored node runs
    /// another boot; the same boot (a kubelet restart) changes nothing, and an
    /// excluded node stays excluded.
    ///
    /// The gates owned elsewhere come back with nodegate's: this is a new
    /// boot ([`Rules::with_owned`]). Never a `NoExecute` taint (strict mode's
    /// boot gate, or an evicting gate owned elsewhere): the boot is only
    /// the create's claim, which no stored version confirms yet, and a
    /// forged claim must not evict a node's pods. Those follow once the
    /// kubelet's status write has stored the new boot
    /// ([`Rules::new_boot_taints_needed`]).
    pub fn reregistration_taints_needed<'a>(
        &'a self,
        stored: &NodeView,
        create_boot: &str,
    ) -> Vec<&'a TaintSpec> {
        if stored.is_excluded() || create_boot.is_empty() {
            return Vec::new();
        }
        let rebooted = rebooted_since_ready(stored.ready_boot_id(), Some(create_boot))
            || boot_id_changed(stored.boot_id(), Some(create_boot));
        if !rebooted || stored.ready_boot_id() == Some(create_boot) {
            return Vec::new();
        }
        stored
            .missing(&self.new_boot)
            .into_iter()
            .filter(|t| t.effect() != Effect::NoExecute)
            .collect()
    }

    /// The background re-check of [`Rule::StatusShowsReboot`], on a
    /// freshly read node, for a status write that kept the bootID:
    /// nodegate's taints to add, or none when the node is excluded or its
    /// agent already recorded the current boot as ready. Never a gate owned
    /// elsewhere: this boot is not new, and its owner may have removed it.
    pub fn reboot_taints_needed<'a>(&'a self, node: &NodeView) -> Vec<&'a TaintSpec> {
        Self::after_reboot(node, &self.taints)
    }

    /// [`Rules::reboot_taints_needed`] for the status write that moved the
    /// bootID (the job's `previous_boot` is set): a new boot, so the gates
    /// owned elsewhere too ([`Rules::with_owned`]).
    pub fn new_boot_taints_needed<'a>(&'a self, node: &NodeView) -> Vec<&'a TaintSpec> {
        Self::after_reboot(node, &self.new_boot)
    }

    fn after_reboot<'a>(node: &NodeView, wanted: &'a [TaintSpec]) -> Vec<&'a TaintSpec> {
        if node.is_excluded() {
            return Vec::new();
        }
        match (node.ready_boot_id(), node.boot_id()) {
            (Some(ready), Some(now)) if ready == now => Vec::new(),
            (_, None) => Vec::new(),
            _ => node.missing(wanted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_the_documented_ones_listed_as_prose() {
        let numbers: Vec<u8> = Rule::ALL.iter().map(|r| r.number()).collect();
        assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(Rule::numbers(&[Rule::Excluded]), "4");
        assert_eq!(
            Rule::numbers(&[Rule::NodeCreate, Rule::UpdateAfterReboot]),
            "1 and 2"
        );
        assert_eq!(
            Rule::numbers(&[
                Rule::NodeCreate,
                Rule::UpdateAfterReboot,
                Rule::Excluded,
                Rule::Idempotent
            ]),
            "1, 2, 4 and 5"
        );
    }

    /// docs/webhook.md states each rule under its name and number.
    #[test]
    fn the_docs_name_every_rule_with_its_number() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/webhook.md");
        let docs = std::fs::read_to_string(path).unwrap();
        for rule in Rule::ALL {
            let item = format!("{}. ", rule.number());
            let name = format!("`Rule::{rule:?}`");
            assert!(
                docs.lines()
                    .any(|l| l.starts_with(&item) && l.contains(&name)),
                "{path}: no item `{item}…` naming {name}"
            );
        }
    }
}
