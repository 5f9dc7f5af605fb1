//! `lode-mds`: the metadata server.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::Transport;
use mds::registry::Registry;
use mds::service::MdsService;

#[derive(Parser)]
#[command(name = "lode-mds", about = "lode metadata server")]
struct Cli {
    /// Where the MDS keeps its state.
    #[arg(long)]
    data_dir: PathBuf,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: SocketAddr,
}

fn main() -> Result<()> {
    daemon::init_logging();
    let cli = Cli::parse();
    let _lock = daemon::DataDirLock::acquire(&cli.data_dir)?;
    let registry = Registry::open(&cli.data_dir)?;
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(async {
        let ep = TcpEndpoint::bind(cli.listen, MdsService::new(registry), TcpConfig::default())
            .await
            .with_context(|| format!("listening on {}", cli.listen))?;
        println!("lode-mds serving at {}", ep.nid());
        let why = daemon::stop_requested().await?;
        tracing::info!(signal = why, "shutting down");
        ep.shutdown();
        Ok(())
    })
}
