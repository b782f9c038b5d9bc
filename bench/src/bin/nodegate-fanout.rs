//! `nodegate-fanout`: what pruning costs the API server and the agents,
//! Node watch against node roster. See `nodegate_bench::fanout`.

use clap::Parser;
use nodegate_bench::fanout::{Opts, print, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = Opts::parse();
    let sources: Vec<&str> = match o.source.as_str() {
        "both" => vec!["nodes", "roster"],
        s @ ("nodes" | "roster") => vec![s],
        other => anyhow::bail!("--source {other:?}: use nodes, roster or both"),
    };
    let mut reports = Vec::new();
    for s in sources {
        eprintln!(
            "running --prune-source={s} with {} nodes, {} agents…",
            o.nodes,
            o.agents + 1
        );
        reports.push(run(&o, s).await?);
    }
    print(&reports);
    Ok(())
}
