//! Where end-to-end tests run: a fresh emulator with the real webhook binary
//! and the shipped MutatingWebhookConfiguration, or — when
//! `NODEGATE_E2E_KUBECONFIG` names a kubeconfig — a real cluster (e.g. kind)
//! with nodegate installed. Users other than the kubeconfig's own are then
//! impersonated (`--as`), so the kubeconfig's user needs `impersonate` rights.

use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::process::Command;

use crate::process::{WebhookOptions, WebhookProcess};
use crate::{Emulator, EmulatorOptions, users};

/// Env var that switches the end-to-end tests to a real cluster.
pub const REAL_CLUSTER_ENV: &str = "NODEGATE_E2E_KUBECONFIG";

#[derive(Debug)]
pub enum Cluster {
    Emulated {
        emu: Emulator,
        webhook: Box<WebhookProcess>,
        scratch: tempfile::TempDir,
    },
    Real {
        kubeconfig: PathBuf,
        scratch: tempfile::TempDir,
    },
}

fn groups(user: &str) -> Vec<String> {
    crate::users::user_info(user)["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(str::to_string))
        .filter(|g| g != "system:authenticated")
        .collect()
}

impl Cluster {
    /// A fresh emulator + webhook, or the real cluster from the env var.
    pub async fn start() -> anyhow::Result<Cluster> {
        let scratch = tempfile::tempdir()?;
        if let Some(kc) = std::env::var_os(REAL_CLUSTER_ENV) {
            return Ok(Cluster::Real {
                kubeconfig: PathBuf::from(kc),
                scratch,
            });
        }
        // The shipped RBAC is enforced, so a manifest that grants too little fails here.
        let emu = Emulator::start(EmulatorOptions {
            rbac: Some(crate::process::shipped_rbac()?),
            ..Default::default()
        })
        .await?;
        let webhook = WebhookProcess::start(WebhookOptions {
            kubeconfig: Some(emu.kubeconfig(users::WEBHOOK)?),
            ..Default::default()
        })
        .await?;
        webhook.attach(&emu, None)?;
        webhook.install_objects(&emu)?;
        Ok(Cluster::Emulated {
            emu,
            webhook: Box::new(webhook),
            scratch,
        })
    }

    pub fn is_real(&self) -> bool {
        matches!(self, Cluster::Real { .. })
    }

    pub fn emulator(&self) -> Option<&Emulator> {
        match self {
            Cluster::Emulated { emu, .. } => Some(emu),
            Cluster::Real { .. } => None,
        }
    }

    pub fn webhook_ref(&self) -> Option<&WebhookProcess> {
        match self {
            Cluster::Emulated { webhook, .. } => Some(webhook),
            Cluster::Real { .. } => None,
        }
    }

    pub fn webhook(&mut self) -> Option<&mut WebhookProcess> {
        match self {
            Cluster::Emulated { webhook, .. } => Some(webhook),
            Cluster::Real { .. } => None,
        }
    }

    fn scratch(&self) -> &Path {
        match self {
            Cluster::Emulated { scratch, .. } | Cluster::Real { scratch, .. } => scratch.path(),
        }
    }

    /// A node name unique to this test run (real clusters are shared).
    pub fn node_name(&self, base: &str) -> String {
        if self.is_real() {
            format!("nodegate-e2e-{base}-{:04x}", rand::random::<u16>())
        } else {
            base.to_string()
        }
    }

    /// A kube client acting as `user`.
    pub async fn client(&self, user: &str) -> anyhow::Result<kube::Client> {
        match self {
            Cluster::Emulated { emu, .. } => emu.client(user).await,
            Cluster::Real { kubeconfig, .. } => {
                let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
                let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
                if user != users::ADMIN {
                    cfg.auth_info.impersonate = Some(user.to_string());
                    cfg.auth_info.impersonate_groups = Some(groups(user));
                }
                Ok(kube::Client::try_from(cfg)?)
            }
        }
    }

    /// `kubectl` as `user` with a fresh cache and HOME (per test directory).
    pub fn kubectl(&self, user: &str) -> anyhow::Result<Command> {
        let home = self.scratch().join("home");
        std::fs::create_dir_all(&home)?;
        let mut cmd = Command::new("kubectl");
        cmd.env("HOME", &home)
            .env("KUBECACHEDIR", home.join("kube-cache"))
            .env_remove("KUBECTL_EXTERNAL_DIFF");
        match self {
            Cluster::Emulated { emu, .. } => {
                cmd.env("KUBECONFIG", emu.kubeconfig(user).context("kubeconfig")?);
            }
            Cluster::Real { kubeconfig, .. } => {
                cmd.env("KUBECONFIG", kubeconfig);
                if user != users::ADMIN {
                    cmd.arg(format!("--as={user}"));
                    for g in groups(user) {
                        cmd.arg(format!("--as-group={g}"));
                    }
                }
            }
        }
        Ok(cmd)
    }
}
