//! nodegate end to end: the real `nodegate-webhook` binary (certs from
//! nodegate-certs, the shipped MutatingWebhookConfiguration), the real
//! `kubectl`, and simulated kubelets — against a fresh emulator per test, or
//! a real cluster when NODEGATE_E2E_KUBECONFIG is set (see e2e/README.md).
//!
//! One scenario file per part of a node's life, in `nodegate/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "nodegate/admission_lines.rs"]
mod admission_lines;
#[path = "nodegate/exclusion.rs"]
mod exclusion;
#[path = "nodegate/kubectl_output.rs"]
mod kubectl_output;
#[path = "nodegate/reboot.rs"]
mod reboot;
#[path = "nodegate/registration.rs"]
mod registration;
