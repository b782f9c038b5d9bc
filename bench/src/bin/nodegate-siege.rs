//! `nodegate-siege`: the webhook under slowloris connections and slow
//! bodies, with an API-server-shaped client. See `nodegate_bench::siege`.

use std::process::ExitCode;

use clap::Parser;
use nodegate_bench::siege::{Args, print, run};

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let report = run(&args).await?;
    print(&args, &report);
    Ok(if args.check && !report.met(&args) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
