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
//!
//! Pure text in, text out; they cite the rules through [`crate::rules::Rule`].

pub mod cel;
pub mod command;
pub mod confinement;
pub mod policy;
pub mod webhook_config;
