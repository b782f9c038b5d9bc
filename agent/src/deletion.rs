//! A deletion to handle: the node's record and where the agent learned of
//! it. Plain data at the bottom, shared by the pruning state, the
//! confirmation and the handlers.

use std::fmt;

use nodegate_roster::record::NodeRecord;

/// A deleted node and how its deletion was learned.
pub type Deletion = (NodeRecord, DeleteSource);

/// What a deletion is tracked by (confirmation, snapshot, held, handled):
/// the node's name and uid, `name/uid`. Not the uid alone: a roster record
/// can carry another node's uid, and must not stand in for that node's
/// own deletion. Neither a Node name nor a uid has a `/`.
pub fn key(r: &NodeRecord) -> String {
    format!("{}/{}", r.name, r.uid)
}

/// Where a deletion was learned from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeleteSource {
    /// A DELETED watch event (or a relist/uid change that implies one).
    Watch,
    /// In the snapshot written before the agent stopped, but not live now.
    Snapshot,
}

impl DeleteSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteSource::Watch => "watch",
            DeleteSource::Snapshot => "snapshot",
        }
    }
}

impl fmt::Display for DeleteSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
