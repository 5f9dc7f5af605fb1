//! `lode-mds`: the metadata server.
//!
//! `lode-mds --data-dir DIR --listen ADDR` serves the namespace and the registry of storage
//! targets; `lode-mds fsck --data-dir DIR` checks the namespace's invariants offline.

mod bench;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::Transport;
use std::sync::Arc;
use std::time::Duration;

use mds::alloc::Allocator;
use mds::registry::Registry;
use mds::service::MdsService;
use mds::store::{Store, DEFAULT_CHECKPOINT_BYTES};

#[derive(Parser)]
#[command(
    name = "lode-mds",
    about = "lode metadata server",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check the namespace's invariants (entries point to inodes, link counts, no cycles, no
    /// orphans) without serving.
    Fsck {
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Measure metadata operations through the RPC path against a local directory.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Where the MDS keeps its state.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: SocketAddr,
    /// Journal size, in MiB, past which a snapshot is written.
    #[arg(long, default_value_t = DEFAULT_CHECKPOINT_BYTES >> 20)]
    checkpoint_mib: u64,
}

fn main() -> Result<()> {
    daemon::init_logging();
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Fsck { data_dir }) => fsck(&data_dir),
        Some(Cmd::Bench(args)) => tokio::runtime::Runtime::new()?.block_on(bench::run(args)),
        None => serve(cli.serve),
    }
}

fn fsck(dir: &std::path::Path) -> Result<()> {
    let _lock = daemon::DataDirLock::acquire(dir)?;
    let rec = mds::journal::recover(dir, mds::namespace::Namespace::default())
        .with_context(|| format!("reading the namespace in {}", dir.display()))?;
    let problems = rec.namespace.check();
    println!(
        "{} inodes, {} journal records replayed, {} bytes of torn tail, {} problems",
        rec.namespace.len(),
        rec.replayed,
        rec.torn,
        problems.len()
    );
    for p in &problems {
        println!("  {p}");
    }
    if !problems.is_empty() {
        bail!("{} problems found", problems.len());
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    let data_dir = args.data_dir.context("--data-dir is required")?;
    let _lock = daemon::DataDirLock::acquire(&data_dir)?;
    let registry = Arc::new(Registry::open(&data_dir)?);
    let store = Arc::new(Store::open(&data_dir, args.checkpoint_mib.max(1) << 20)?);
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(async {
        let alloc = Allocator::new(registry.clone());
        tokio::spawn(alloc.clone().run(store.clone(), Duration::from_secs(1)));
        let service = MdsService::new(registry, store, alloc);
        let ep = TcpEndpoint::bind(args.listen, service, TcpConfig::default())
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        println!("lode-mds serving at {}", ep.nid());
        let why = daemon::stop_requested().await?;
        tracing::info!(signal = why, "shutting down");
        ep.shutdown();
        Ok(())
    })
}
