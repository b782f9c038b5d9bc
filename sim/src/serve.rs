//! `nodegate-sim serve`: an emulator with the real webhook, for kubectl.

use std::path::PathBuf;

use anyhow::Context;
use nodegate_e2e::process::{WebhookOptions, WebhookProcess};
use nodegate_emulator::{Emulator, EmulatorOptions};

use crate::publishers;

/// `nodegate-sim serve`: emulator + real webhook + the roster publisher
/// (both replicas) until Ctrl-C.
pub async fn serve(kubeconfig_out: PathBuf, user: &str) -> anyhow::Result<()> {
    // Handlers first: a Ctrl-C or SIGTERM that arrives while starting (or
    // right after "Ctrl-C stops." is printed) must still stop the webhook
    // child rather than kill this process with the child left running.
    let shutdown = nodegate_shared::signal::shutdown();
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(nodegate_e2e::process::shipped_rbac()?),
        ..Default::default()
    })
    .await?;
    let mut webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.webhook_kubeconfig()?),
        // As the README installs it: only the API server's reviews act.
        path_token: true,
        ..Default::default()
    })
    .await?;
    webhook.attach(&emu, None)?;
    webhook.install_objects(&emu)?;
    // The pruning component runs here (both publishers), with its policy.
    emu.apply(&nodegate_e2e::process::shipped_roster_policy()?)?;
    let publishers = publishers::Publishers::start(&emu).await?;
    std::fs::write(&kubeconfig_out, emu.kubeconfig_yaml(user))
        .with_context(|| format!("writing {}", kubeconfig_out.display()))?;
    println!("emulated API server: {}", emu.url());
    println!(
        "nodegate-webhook:    https={} admin=http://{}",
        webhook.https_addr(),
        webhook.admin_addr()
    );
    println!("kubeconfig ({user}):  {}", kubeconfig_out.display());
    println!(
        "try: KUBECONFIG={} kubectl create --dry-run=server -f node.yaml -o yaml",
        kubeconfig_out.display()
    );
    println!("Ctrl-C stops.");
    // SIGTERM too (`kill`, process supervisors).
    shutdown.await;
    let _ = publishers.stop().await;
    let _ = webhook.stop().await;
    emu.shutdown().await;
    Ok(())
}
