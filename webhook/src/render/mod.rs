//! The manifests `nodegate-webhook` prints instead of serving, generated from
//! the same taint flags as the webhook so the shipped files never drift from
//! it (tests compare them with these renderers):
//!
//! * [`command`]: the subcommands, their flags, and which renderer each runs.
//! * [`policy`]: the MutatingAdmissionPolicy that carries the webhook's rules
//!   into the API server.
//! * [`webhook_config`]: the MutatingWebhookConfiguration, one line of
//!   admission per replica.
//! * [`confinement`]: the ValidatingAdmissionPolicies that confine the
//!   agent's and the webhook's own credentials.
//! * [`cel`]: the CEL text the policy and the webhook configuration share.
//! * [`gates_component`]: a kustomize Component that turns the base install
//!   into the gate set of a gates declaration, from all of the above.
//!
//! Pure text in, text out (the command writes the component's files); they
//! cite the rules through [`crate::rules::Rule`].

pub mod cel;
pub mod command;
pub mod confinement;
pub mod gates_component;
pub mod policy;
pub mod webhook_config;

use nodegate_shared::TaintSpec;

/// The flags (`--taint`, `--owned-taint`, `--boot-taint`) that configure
/// these taints, as a generated file names the command that made it; the
/// same text as `nodegate_shared::taint::as_flags` without owned taints.
pub fn taint_flags(ordinary: &[TaintSpec], owned: &[TaintSpec], boot: &[TaintSpec]) -> String {
    let flags: Vec<String> = ordinary
        .iter()
        .map(|t| format!("--taint={t}"))
        .chain(owned.iter().map(|t| format!("--owned-taint={t}")))
        .chain(boot.iter().map(|t| format!("--boot-taint={t}")))
        .collect();
    flags.join(" ")
}
