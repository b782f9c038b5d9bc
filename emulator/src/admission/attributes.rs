//! What admission knows about a request.
//!
//! Follows `k8s.io/apiserver/pkg/admission/interfaces.go` (`Operation`,
//! `Attributes`) and `attributes.go` (`NewAttributesRecord`).

use serde_json::Value;

use crate::resources::ResourceDef;
use crate::users;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// What admission knows about a request.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    pub res: &'static ResourceDef,
    pub subresource: &'a str,
    pub operation: Operation,
    pub name: &'a str,
    pub namespace: &'a str,
    pub user: &'a str,
    /// The user's extra (`request.userInfo.extra`).
    pub extra: &'a users::Extra,
    pub dry_run: bool,
    /// CreateOptions / UpdateOptions / DeleteOptions, as sent to webhooks.
    pub options: Value,
}
