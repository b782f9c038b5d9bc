//! The roster publisher's replicas, as the pruning component installs them
//! (two, one leader on the Lease), in this process with the publisher's
//! service account.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use nodegate_emulator::{Emulator, users};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

type Replica = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), nodegate_roster::Error>>,
);

/// Running replicas of `nodegate-roster`.
pub struct Publishers {
    running: Vec<Replica>,
}

/// Replicas in a cluster install (`manifests/components/pruning`).
pub const REPLICAS: usize = 2;

impl Publishers {
    /// Starts `REPLICAS` publishers in namespace `nodegate` (created if missing).
    pub async fn start(emu: &Emulator) -> anyhow::Result<Publishers> {
        emu.apply(&std::fs::read_to_string(
            nodegate_e2e::process::manifests_dir().join("namespace.yaml"),
        )?)?;
        let mut running = Vec::new();
        for i in 0..REPLICAS {
            let args = nodegate_roster::Args::try_parse_from([
                "nodegate-roster",
                "--namespace",
                "nodegate",
                "--identity",
                &format!("nodegate-roster-sim-{i}"),
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .context("publisher arguments")?;
            let client = emu.client(users::ROSTER).await?;
            let (stop, rx) = oneshot::channel::<()>();
            let task = tokio::spawn(nodegate_roster::run_with_client(args, client, async move {
                let _ = rx.await;
            }));
            running.push((stop, task));
        }
        Ok(Publishers { running })
    }

    /// Stops every replica (the leader releases its Lease) and waits.
    pub async fn stop(self) -> anyhow::Result<()> {
        for (stop, task) in self.running {
            let _ = stop.send(());
            match tokio::time::timeout(Duration::from_secs(15), task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => return Err(anyhow::Error::new(e).context("roster publisher")),
                Ok(Err(e)) => anyhow::bail!("roster publisher panicked: {e}"),
                Err(_) => anyhow::bail!("roster publisher did not stop within 15 s"),
            }
        }
        Ok(())
    }
}
