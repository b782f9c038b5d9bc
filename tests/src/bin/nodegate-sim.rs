use clap::Parser;
use nodegate_tests::{Emulator, EmulatorOptions};

#[derive(Parser)]
struct Cli {
    #[arg(long)]
    kubeconfig_out: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let cli = Cli::parse();
    let emu = Emulator::start(EmulatorOptions::default()).await?;
    std::fs::write(&cli.kubeconfig_out, emu.kubeconfig_yaml("admin"))?;
    println!("serving {}", emu.url());
    tokio::signal::ctrl_c().await?;
    emu.shutdown().await;
    Ok(())
}
