//! CA and serving certificate generation for the nodegate webhook.
//!
//! The API server reaches a service webhook at `<svc>.<ns>.svc`, verifies the
//! chain against the configuration's `caBundle` and checks SANs only (no CN
//! fallback), so the leaf carries every service DNS form as a SAN and the CA
//! PEM goes into `clientConfig.caBundle` of the MutatingWebhookConfiguration.

mod ca;
pub mod cert_info;
pub mod cli;
pub mod controller;
mod error;
mod files;
pub mod rotate;
pub mod trust;
pub mod uninstall;
mod webhook_config;

pub use ca::{Ca, ServingCert, ServingRequest};
pub use error::CertError;
pub use files::{CA_FILE, CERT_FILE, KEY_FILE, write_atomic, write_files};
pub use webhook_config::{
    ca_bundle_patch, inject_ca_bundle, live_path_token, path_token, webhook_services,
};
