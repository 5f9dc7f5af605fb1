//! `lode-mds`: the metadata server.
//!
//! `lode-mds --data-dir DIR --listen ADDR` serves the namespace and the registry of storage
//! targets; `lode-mds fsck --data-dir DIR` checks the namespace's invariants offline.

mod bench;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lnet::Attach;
use mds::store::DEFAULT_CHECKPOINT_BYTES;
use mds::{MdsConfig, MdsServer};

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
    /// A TOML file with any of `data_dir`, `listen`, `checkpoint_mib`, `recovery_window_s`
    /// and `evict_after_s`; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the MDS keeps its state.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to serve on [default: 127.0.0.1:9400].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Journal size, in MiB, past which a snapshot is written [default: 64].
    #[arg(long)]
    checkpoint_mib: Option<u64>,
}

/// The configuration file.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    checkpoint_mib: Option<u64>,
    /// Seconds clients have after a start to count their open files again.
    recovery_window_s: Option<u64>,
    /// Seconds a client holding files open may stay silent before it loses its handles.
    evict_after_s: Option<u64>,
}

/// What the server runs with: flags over the file over defaults.
struct Settings {
    data_dir: PathBuf,
    listen: SocketAddr,
    checkpoint_mib: u64,
    recovery_window: Duration,
    evict_after: Duration,
}

impl ServeArgs {
    fn settings(self) -> Result<Settings> {
        let file: Config = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
            }
            None => Config::default(),
        };
        Ok(Settings {
            data_dir: self
                .data_dir
                .or(file.data_dir)
                .context("--data-dir (or data_dir in the config) is required")?,
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9400))),
            checkpoint_mib: self
                .checkpoint_mib
                .or(file.checkpoint_mib)
                .unwrap_or(DEFAULT_CHECKPOINT_BYTES >> 20)
                .max(1),
            recovery_window: file
                .recovery_window_s
                .map_or(mds::server::RECOVERY_WINDOW, Duration::from_secs),
            evict_after: file
                .evict_after_s
                .map_or(mds::server::EVICT_AFTER, Duration::from_secs),
        })
    }
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
    let disk = mds::disk::DirDisk::new(dir);
    let rec = mds::journal::recover(&disk, mds::namespace::Namespace::default())
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
    let args = args.settings()?;
    let cfg = MdsConfig {
        checkpoint_bytes: args.checkpoint_mib << 20,
        recovery_window: args.recovery_window,
        evict_after: args.evict_after,
        ..MdsConfig::new(args.data_dir)
    };
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(async {
        let server = MdsServer::start(cfg, &Attach::tcp(args.listen))
            .await
            .with_context(|| format!("starting the MDS on {}", args.listen))?;
        println!("lode-mds serving at {}", server.nid());
        let why = daemon::stop_requested().await?;
        tracing::info!(signal = why, "shutting down");
        server.stop().await;
        Ok(())
    })
}
