//! `lode-oss`: the object storage server.
//!
//! `lode-oss --data-dir DIR --mds ADDR --listen ADDR [--targets N]` serves N targets kept in
//! DIR (formatting the missing ones, with indices assigned by the MDS), registers them with the
//! MDS and heartbeats their space. `lode-oss scrub --data-dir DIR` checks every block offline.

mod bench;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, Transport};
use oss::engine::{self, Engine, EngineConfig, EngineKind};
use oss::server::OssService;
use oss::Target;
use proto::registry::{Heartbeat, RegisterTargets, TargetReport};
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
}

/// Most targets one server holds.
const MAX_TARGETS_PER_OSS: u32 = 256;

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

/// The target directories under `dir`, formatted or being formatted.
fn target_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ost-"))
            && p.join("TARGET").exists()
        {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

async fn reports(engine: &Arc<dyn Engine>, dirs: &[PathBuf]) -> Result<Vec<TargetReport>> {
    let mut out = vec![];
    for d in dirs {
        let (index, uuid) = Target::label(engine, d).await?;
        let space = engine.space(d)?;
        out.push(TargetReport {
            index,
            uuid,
            total: space.total,
            free: space.free,
        });
    }
    Ok(out)
}

async fn serve(args: ServeArgs) -> Result<()> {
    let data_dir = args.data_dir.context("--data-dir is required")?;
    let mds = parse_nid(args.mds.as_deref().context("--mds is required")?)?;
    if args.targets == 0 || args.targets > MAX_TARGETS_PER_OSS {
        bail!("--targets must be 1..={MAX_TARGETS_PER_OSS}");
    }
    let _lock = daemon::DataDirLock::acquire(&data_dir)?;
    let engine = engine::start(
        args.engine,
        EngineConfig {
            threads: args.threads,
            queue_depth: args.queue_depth,
        },
    )?;
    let mut dirs = target_dirs(&data_dir)?;
    while (dirs.len() as u32) < args.targets {
        let uuid: u128 = rand::random();
        let root = data_dir.join(format!("ost-{uuid:032x}"));
        Target::format(&engine, &root, uuid, None).await?;
        tracing::info!(dir = %root.display(), "formatted a new target");
        dirs.push(root);
    }

    // Bind first: the MDS must be told where this server is.
    let (service_slot, service) = oss_service_slot();
    let ep = TcpEndpoint::bind(args.listen, service, TcpConfig::default())
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let me = ep.nid();
    let client = TcpEndpoint::client(TcpConfig::default());
    let register = RegisterTargets {
        oss: me.clone(),
        targets: reports(&engine, &dirs).await?,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.mds_timeout);
    let registered = loop {
        match call(&client, &mds, &register, Duration::from_secs(5)).await {
            Ok(r) => break r,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tracing::warn!(mds = %mds, error = %e, "MDS not reachable yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e).context(format!("registering with the MDS at {mds}")),
        }
    };
    if registered.indices.len() != dirs.len() {
        bail!(
            "the MDS answered {} indices for {} targets",
            registered.indices.len(),
            dirs.len()
        );
    }
    let mut targets = vec![];
    for (dir, index) in dirs.iter().zip(&registered.indices) {
        Target::assign_index(&engine, dir, *index).await?;
        targets.push(Arc::new(Target::open(engine.clone(), dir).await?));
    }
    service_slot.set(OssService::new(targets.iter().cloned()));
    let indices: Vec<u32> = targets.iter().map(|t| t.index()).collect();
    tracing::info!(nid = %me, ?indices, engine = engine.name(), "serving");
    println!("lode-oss serving targets {indices:?} at {me}");

    let beat = {
        let (engine, dirs, mds, me) = (engine.clone(), dirs.clone(), mds.clone(), me.clone());
        let every = Duration::from_secs(args.heartbeat.max(1));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let targets = match reports(&engine, &dirs).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read target space");
                        continue;
                    }
                };
                let hb = Heartbeat {
                    oss: me.clone(),
                    targets,
                };
                if let Err(e) = call(&client, &mds, &hb, every).await {
                    tracing::warn!(mds = %mds, error = %e, "heartbeat failed");
                }
            }
        })
    };

    let why = daemon::stop_requested().await?;
    tracing::info!(signal = why, "shutting down");
    beat.abort();
    ep.shutdown();
    for t in &targets {
        t.sync_all().await?;
    }
    Ok(())
}

/// The service is built after registration (it needs the targets' indices), but the endpoint
/// is bound before it; until then requests are refused as not yet served.
fn oss_service_slot() -> (Arc<ServiceSlot>, Arc<dyn lnet::Service>) {
    let slot = Arc::new(ServiceSlot(std::sync::OnceLock::new()));
    (slot.clone(), slot)
}

struct ServiceSlot(std::sync::OnceLock<Arc<OssService>>);

impl ServiceSlot {
    fn set(&self, s: Arc<OssService>) {
        let _ = self.0.set(s);
    }
}

impl lnet::Service for ServiceSlot {
    fn handle(
        self: Arc<Self>,
        req: lnet::Incoming,
        bulk: Arc<dyn lnet::BulkPeer>,
    ) -> lnet::service::BoxFuture<'static, Result<Vec<u8>, proto::RemoteError>> {
        match self.0.get() {
            Some(s) => s.clone().handle(req, bulk),
            None => Box::pin(async {
                Err(proto::RemoteError::new(
                    proto::StatusCode::Busy,
                    "targets are starting",
                ))
            }),
        }
    }
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
