//! `lode-oss`: the object storage server.
//!
//! `lode-oss --data-dir DIR --mds ADDR --listen ADDR [--targets N]` serves N targets kept in
//! DIR (formatting the missing ones, with indices assigned by the MDS), registers them with the
//! MDS and heartbeats their space. `lode-oss scrub --data-dir DIR` checks every block offline.

mod bench;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lnet::Attach;
use oss::engine::{self, EngineConfig, EngineKind};
use oss::server::{local_targets, target_dirs};
use oss::{OssConfig, OssServer, Target};
use proto::Nid;

#[derive(Parser)]
#[command(
    name = "lode-oss",
    about = "lode object storage server",
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
    /// Read every block of every object and report those failing their checksums.
    Scrub {
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Measure the I/O engines against plain O_DIRECT file I/O on the same disk.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Where the targets live (one subdirectory each).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The MDS, as IP:PORT or a NID.
    #[arg(long)]
    mds: Option<String>,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:9500")]
    listen: SocketAddr,
    /// Targets to serve; missing ones are formatted.
    #[arg(long, default_value_t = 1)]
    targets: u32,
    /// I/O engine: auto (io_uring, else psync), uring or psync.
    #[arg(long, default_value = "auto")]
    engine: EngineKind,
    /// Engine threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Operations in flight per engine thread.
    #[arg(long, default_value_t = 64)]
    queue_depth: usize,
    /// Seconds between heartbeats to the MDS.
    #[arg(long, default_value_t = 5)]
    heartbeat: u64,
    /// Seconds to keep trying to reach the MDS at start before giving up.
    #[arg(long, default_value_t = 60)]
    mds_timeout: u64,
    #[command(flatten)]
    auth: daemon::AuthArgs,
}

fn main() -> Result<()> {
    daemon::init_logging();
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    match cli.cmd {
        Some(Cmd::Scrub { data_dir }) => rt.block_on(scrub(&data_dir)),
        Some(Cmd::Bench(args)) => rt.block_on(bench::run(args)),
        None => rt.block_on(serve(cli.serve)),
    }
}

pub fn parse_nid(s: &str) -> Result<Nid> {
    if s.contains('@') {
        return s.parse().with_context(|| format!("bad NID {s:?}"));
    }
    Ok(Nid::Tcp(s.parse().with_context(|| {
        format!("{s:?} is neither IP:PORT nor a NID")
    })?))
}

async fn serve(args: ServeArgs) -> Result<()> {
    let data_dir = args.data_dir.context("--data-dir is required")?;
    let mds = parse_nid(args.mds.as_deref().context("--mds is required")?)?;
    let security = args.auth.security(None, None, None)?;
    let _lock = daemon::DataDirLock::acquire(&data_dir)?;
    let engine = engine::start(
        args.engine,
        EngineConfig {
            threads: args.threads,
            queue_depth: args.queue_depth,
        },
    )?;
    let homes = local_targets(&engine, &data_dir, args.targets).await?;
    let cfg = OssConfig {
        heartbeat_every: Duration::from_secs(args.heartbeat.max(1)),
        mds_timeout: Duration::from_secs(args.mds_timeout),
        ..OssConfig::new(mds)
    };
    let server = OssServer::start(cfg, homes, &Attach::tcp(args.listen, security))
        .await
        .with_context(|| format!("starting the storage server on {}", args.listen))?;
    println!(
        "lode-oss serving targets {:?} at {}",
        server.indices(),
        server.nid()
    );
    let why = daemon::stop_requested().await?;
    tracing::info!(signal = why, engine = engine.name(), "shutting down");
    server.stop().await?;
    Ok(())
}

async fn scrub(data_dir: &Path) -> Result<()> {
    let _lock = daemon::DataDirLock::acquire(data_dir)?;
    let engine = engine::start(EngineKind::Auto, EngineConfig::default())?;
    let mut bad_total = 0;
    for dir in target_dirs(data_dir)? {
        let target = match Target::open(engine.clone(), &dir).await {
            Ok(t) => t,
            Err(e) => {
                println!("{}: cannot open: {e}", dir.display());
                bad_total += 1;
                continue;
            }
        };
        let report = target.scrub().await?;
        println!(
            "target {} ({}): {} objects, {} bytes, {} bad blocks",
            target.index(),
            dir.display(),
            report.objects,
            report.bytes,
            report.bad.len()
        );
        for (fid, offset) in &report.bad {
            println!("  bad block: object {fid} offset {offset}");
        }
        bad_total += report.bad.len();
    }
    if bad_total > 0 {
        bail!("{bad_total} problems found");
    }
    Ok(())
}
