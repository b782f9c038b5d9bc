//! On SIGTERM: is nodegate being removed, or only this pod stopped (a
//! rollout, a drain, a node shutdown or reboot)? Decided without I/O from
//! two reads, the agent's DaemonSet and its Namespace (`removal_check`
//! makes them).
//!
//! A stop re-taints the node, so it comes back gated. A removal must not:
//! no agent would be left to open the node. Only positive evidence of a
//! removal opens it; anything unclear (the API server unreachable, a
//! timeout, a 5xx) keeps the re-taint, the safe default.

/// What one GET found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// There, without a `deletionTimestamp`.
    Live,
    /// There, with a `deletionTimestamp` (foreground deletion of the
    /// DaemonSet, a terminating Namespace).
    Deleting,
    /// 404.
    NotFound,
    /// 403: the agent's RBAC is gone.
    Forbidden,
    /// Anything else: unreachable, timed out, 5xx, undecodable.
    Failed,
}

/// Why the agent decided as it did: the `reason` of the metric and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `--daemonset` unset: no check, the shutdown as always.
    NotChecked,
    /// The DaemonSet is live and the Namespace not terminating.
    Installed,
    /// No read gave evidence either way.
    CheckFailed,
    DaemonSetNotFound,
    DaemonSetDeleting,
    /// Its Role is gone, as an uninstall deletes it; the agent could not
    /// tell a live DaemonSet from a deleted one.
    DaemonSetForbidden,
    NamespaceTerminating,
    NamespaceNotFound,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::NotChecked => "not_checked",
            Why::Installed => "installed",
            Why::CheckFailed => "check_failed",
            Why::DaemonSetNotFound => "daemonset_not_found",
            Why::DaemonSetDeleting => "daemonset_deleting",
            Why::DaemonSetForbidden => "daemonset_forbidden",
            Why::NamespaceTerminating => "namespace_terminating",
            Why::NamespaceNotFound => "namespace_not_found",
        }
    }
}

/// What the shutdown does to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Not a removal: the shutdown re-taint (unless `--taint-on-shutdown=false`).
    ReTaint(Why),
    /// A removal: remove every gate the ready patch removes, add none.
    OpenNode(Why),
}

impl Decision {
    /// The `decision` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::ReTaint(_) => "retaint",
            Decision::OpenNode(_) => "open",
        }
    }

    pub fn why(self) -> Why {
        match self {
            Decision::ReTaint(w) | Decision::OpenNode(w) => w,
        }
    }
}

/// The decision from the DaemonSet's and the Namespace's reads. Any sign of
/// a removal wins over an error of the other read: a Namespace being
/// deleted takes its DaemonSet with it, whatever the DaemonSet's read
/// said. A 403 on the Namespace alone proves nothing (its ClusterRole
/// names `nodegate`, so an install in another namespace always gets it).
pub fn decide(daemonset: Lookup, namespace: Lookup) -> Decision {
    match (daemonset, namespace) {
        (Lookup::NotFound, _) => Decision::OpenNode(Why::DaemonSetNotFound),
        (Lookup::Deleting, _) => Decision::OpenNode(Why::DaemonSetDeleting),
        (Lookup::Forbidden, _) => Decision::OpenNode(Why::DaemonSetForbidden),
        (_, Lookup::Deleting) => Decision::OpenNode(Why::NamespaceTerminating),
        (_, Lookup::NotFound) => Decision::OpenNode(Why::NamespaceNotFound),
        (Lookup::Live, Lookup::Live) => Decision::ReTaint(Why::Installed),
        (Lookup::Live | Lookup::Failed, Lookup::Live | Lookup::Forbidden | Lookup::Failed) => {
            Decision::ReTaint(Why::CheckFailed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Lookup::{Deleting, Failed, Forbidden, Live, NotFound};

    const ALL: [Lookup; 5] = [Live, Deleting, NotFound, Forbidden, Failed];

    /// Every pair of reads, and what the shutdown does with it.
    #[test]
    fn only_evidence_of_a_removal_opens_the_node() {
        let open = |w| Decision::OpenNode(w);
        let retaint = |w| Decision::ReTaint(w);
        let rows: &[(Lookup, Lookup, Decision)] = &[
            // Installed: a rollout, a drain, a shutdown or reboot.
            (Live, Live, retaint(Why::Installed)),
            // Unclear: the safe default.
            (Live, Forbidden, retaint(Why::CheckFailed)),
            (Live, Failed, retaint(Why::CheckFailed)),
            (Failed, Live, retaint(Why::CheckFailed)),
            (Failed, Forbidden, retaint(Why::CheckFailed)),
            (Failed, Failed, retaint(Why::CheckFailed)),
            // The DaemonSet gone, going, or no longer readable.
            (NotFound, Live, open(Why::DaemonSetNotFound)),
            (NotFound, Failed, open(Why::DaemonSetNotFound)),
            (Deleting, Live, open(Why::DaemonSetDeleting)),
            (Deleting, Failed, open(Why::DaemonSetDeleting)),
            (Forbidden, Live, open(Why::DaemonSetForbidden)),
            (Forbidden, Forbidden, open(Why::DaemonSetForbidden)),
            (Forbidden, Failed, open(Why::DaemonSetForbidden)),
            // The Namespace terminating or gone (`kubectl delete -k`).
            (Live, Deleting, open(Why::NamespaceTerminating)),
            (Failed, Deleting, open(Why::NamespaceTerminating)),
            (Live, NotFound, open(Why::NamespaceNotFound)),
            (Failed, NotFound, open(Why::NamespaceNotFound)),
            // Both say so: the DaemonSet's read names it.
            (NotFound, Deleting, open(Why::DaemonSetNotFound)),
            (Deleting, NotFound, open(Why::DaemonSetDeleting)),
            (Forbidden, Deleting, open(Why::DaemonSetForbidden)),
        ];
        for &(ds, ns, want) in rows {
            assert_eq!(decide(ds, ns), want, "daemonset {ds:?}, namespace {ns:?}");
        }
        // Every pair is decided, and re-tainting needs a readable, live
        // DaemonSet or a failed read, never evidence of a removal.
        for ds in ALL {
            for ns in ALL {
                let removal = matches!(ds, NotFound | Deleting | Forbidden)
                    || matches!(ns, NotFound | Deleting);
                let d = decide(ds, ns);
                assert_eq!(
                    matches!(d, Decision::OpenNode(_)),
                    removal,
                    "daemonset {ds:?}, namespace {ns:?}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn labels_are_fixed_words() {
        assert_eq!(Decision::ReTaint(Why::Installed).as_str(), "retaint");
        assert_eq!(Decision::OpenNode(Why::DaemonSetNotFound).as_str(), "open");
        assert_eq!(
            Decision::OpenNode(Why::NamespaceTerminating).why().as_str(),
            "namespace_terminating"
        );
    }
}
