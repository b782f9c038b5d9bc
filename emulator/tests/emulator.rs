//! The emulator's own semantics, pinned against what kube-apiserver does
//! (each behaviour and its upstream function: emulator/README.md). Each test starts a fresh emulator.
//!
//! One scenario file per behaviour, in `emulator/`; the helpers they share
//! in `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "emulator/match_conditions.rs"]
mod match_conditions;
#[path = "emulator/node_restriction.rs"]
mod node_restriction;
#[path = "emulator/pods.rs"]
mod pods;
#[path = "emulator/service_proxy.rs"]
mod service_proxy;
#[path = "emulator/serving.rs"]
mod serving;
#[path = "emulator/storage.rs"]
mod storage;
#[path = "emulator/watches.rs"]
mod watches;
#[path = "emulator/webhooks.rs"]
mod webhooks;
