//! nodegate's own credentials, attacked as a thief would use them: the
//! agent's pod-bound token of node A, the same ServiceAccount's token without
//! a node claim or bound to the Node instead of a pod, and the webhook's
//! token, against the shipped install (RBAC plus the confinement
//! ValidatingAdmissionPolicies). Every forbidden change must be refused (403,
//! naming the node and the field) and every change the workloads need must
//! go through. Runs against a fresh emulator, or a real cluster when
//! NODEGATE_E2E_KUBECONFIG is set (see e2e/README.md).
//!
//! One scenario file per credential or concern, in `confinement/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "confinement/agent_token.rs"]
mod agent_token;
#[path = "confinement/field_ownership.rs"]
mod field_ownership;
#[path = "confinement/namespaces.rs"]
mod namespaces;
#[path = "confinement/strict_mode.rs"]
mod strict_mode;
#[path = "confinement/webhook_token.rs"]
mod webhook_token;
