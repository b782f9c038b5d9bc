//! Who may write the node roster (`manifests/components/pruning`), attacked
//! as an intruder would: a namespace editor (a Role with every verb on
//! ConfigMaps and Leases, what a compromised workload or a controller with
//! leader-election rights holds) tries to take the publisher's Lease and to
//! rewrite its shards; the publisher's own token tries to write anything
//! else; and the install is moved to another namespace by kustomize. The
//! publisher itself must still acquire, renew, hand over and publish.
//!
//! Runs against a fresh emulator, or a real cluster with the pruning
//! component installed when NODEGATE_E2E_KUBECONFIG is set (see
//! e2e/README.md). On a real cluster every write that would disturb the
//! installed publisher if it were admitted is a server-side dry run, which
//! goes through the same authorization and admission; the editor is granted
//! through the RBAC API (its part is skipped where the API server has none,
//! as under `nodegate-sim serve`); the other-namespace install is emulator
//! only.
//!
//! One scenario file per attacker or duty, (a)–(d), in `roster_writers/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "roster_writers/editor_lease.rs"]
mod editor_lease;
#[path = "roster_writers/other_namespace.rs"]
mod other_namespace;
#[path = "roster_writers/publishing.rs"]
mod publishing;
#[path = "roster_writers/roster_token.rs"]
mod roster_token;
