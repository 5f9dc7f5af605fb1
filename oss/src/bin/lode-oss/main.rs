//! `lode-oss`: the object storage server.
//!
//! `lode-oss --data-dir DIR --mds ADDR --listen ADDR [--targets N]` serves N targets kept in
//! DIR (formatting the missing ones, with indices assigned by the MDS), registers them with the
//! MDS and heartbeats their space. `lode-oss scrub --data-dir DIR` checks every block offline;
//! `lode-oss probe --data-dir DIR` measures each target's device again for `--io auto`.

/// mimalloc: the servers and the mount allocate and free small buffers and maps on many
/// threads at once, where glibc's allocator spent a tenth of their time (docs/decisions.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Measure each target's device again (direct against buffered, writes and reads) and
    /// keep the result, which `--io auto` follows from the next start. Offline.
    Probe {
        #[arg(long)]
        data_dir: PathBuf,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// A TOML file with any of `data_dir`, `mds`, `listen`, `targets`, `engine`, `threads`,
    /// `queue_depth`, `io`, `heartbeat_s`, `mds_timeout_s`, `key_file`, `auth`, `privacy`,
    /// `metrics`, `stats` and `job_stats`; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the targets live (one subdirectory each).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The MDS, as IP:PORT or a NID; an MDS on several interfaces by all its addresses,
    /// comma-separated. In a filesystem of several MDTs, MDT0's: it gives the targets their
    /// indices, and names the other MDTs, which the server then registers with too.
    #[arg(long)]
    mds: Option<String>,

    /// Address to serve on [default: 127.0.0.1:9500]. Given again, the server listens on each
    /// (one per interface) and clients use any that answers (multi-rail); the first names it.
    #[arg(long)]
    listen: Vec<SocketAddr>,
    /// Targets to serve; missing ones are formatted [default: 1].
    #[arg(long)]
    targets: Option<u32>,
    /// I/O engine: auto (io_uring, else psync), uring or psync [default: auto].
    #[arg(long)]
    engine: Option<EngineKind>,
    /// Engine threads [default: 2].
    #[arg(long)]
    threads: Option<usize>,
    /// Operations in flight per engine thread [default: 64].
    #[arg(long)]
    queue_depth: Option<usize>,
    /// How large reads and writes reach the disk: auto (per target, by a measurement of its
    /// device kept in the target: buffered where the page cache is faster, else direct),
    /// direct, or buffered. Small I/O goes through the page cache either way [default: auto].
    #[arg(long)]
    io: Option<oss::io_policy::IoMode>,
    /// Seconds between heartbeats to the MDS [default: 5].
    #[arg(long)]
    heartbeat: Option<u64>,
    /// Seconds to keep trying to reach the MDS at start before giving up [default: 60].
    #[arg(long)]
    mds_timeout: Option<u64>,
    /// For this run, take the MDS's view of the targets' objects: an orphan cleanup may
    /// destroy more written objects than its safety bound, and a LAST_ID behind what the
    /// filesystem references (a target rolled back) is moved past it. Only on an operator's
    /// word, after the refusal that named the problem.
    #[arg(long)]
    trust_mds_objects: bool,
    #[command(flatten)]
    auth: daemon::AuthArgs,
    #[command(flatten)]
    stats: daemon::telemetry::StatsArgs,
}

/// The configuration file.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    data_dir: Option<PathBuf>,
    /// The MDS, as IP:PORT or a NID (several, comma-separated, for multi-rail).
    mds: Option<String>,

    /// One address, or a list of them (one per interface).
    listen: Option<daemon::Addrs>,
    targets: Option<u32>,
    /// "auto", "uring" or "psync".
    engine: Option<String>,
    threads: Option<usize>,
    queue_depth: Option<usize>,
    /// "auto", "direct" or "buffered".
    io: Option<String>,
    heartbeat_s: Option<u64>,
    mds_timeout_s: Option<u64>,
    /// The cluster key file.
    key_file: Option<PathBuf>,
    /// `false` runs without authentication (anyone who can reach the port gets in).
    auth: Option<bool>,
    /// Encrypt every connection.
    privacy: Option<bool>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    metrics: Option<SocketAddr>,
    /// `false` counts nothing (no metrics, job statistics or counts for `lode top`).
    stats: Option<bool>,
    /// `false` keeps no job statistics.
    job_stats: Option<bool>,
}

fn main() -> Result<()> {
    daemon::init_logging();
    daemon::no_huge_pages();
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    match cli.cmd {
        Some(Cmd::Scrub { data_dir }) => rt.block_on(scrub(&data_dir)),
        Some(Cmd::Bench(args)) => rt.block_on(bench::run(args)),
        Some(Cmd::Probe { data_dir }) => probe(&data_dir),
        None => rt.block_on(serve(cli.serve)),
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let file: Config = daemon::telemetry::load_config(args.config.as_deref())?;
    let data_dir = args
        .data_dir
        .or(file.data_dir)
        .context("--data-dir (or data_dir in the config) is required")?;
    let mds_arg = args
        .mds
        .as_deref()
        .or(file.mds.as_deref())
        .context("--mds (or mds in the config) is required")?;
    let (mds, mds_rails) =
        Nid::parse_rails(mds_arg).with_context(|| format!("--mds {mds_arg:?}"))?;

    let mut listen = if args.listen.is_empty() {
        file.listen.map(daemon::Addrs::into_vec).unwrap_or_default()
    } else {
        args.listen
    };
    if listen.is_empty() {
        listen.push(SocketAddr::from(([127, 0, 0, 1], 9500)));
    }
    let engine_kind = match (args.engine, file.engine) {
        (Some(e), _) => e,
        (None, Some(name)) => name
            .parse()
            .map_err(|e| anyhow::anyhow!("engine in the config: {e}"))?,
        (None, None) => EngineKind::Auto,
    };
    let io = match (args.io, file.io) {
        (Some(m), _) => m,
        (None, Some(name)) => name
            .parse()
            .map_err(|e| anyhow::anyhow!("io in the config: {e}"))?,
        (None, None) => oss::io_policy::IoMode::Auto,
    };
    let telemetry = args
        .stats
        .telemetry(file.metrics, file.stats, file.job_stats);
    let security = args
        .auth
        .security(file.key_file.as_deref(), file.auth, file.privacy)?;
    let _lock = daemon::DataDirLock::acquire(&data_dir)?;
    let engine = engine::start(
        engine_kind,
        EngineConfig {
            threads: args.threads.or(file.threads).unwrap_or(2),
            queue_depth: args.queue_depth.or(file.queue_depth).unwrap_or(64),
        },
    )?;
    let homes = local_targets(
        &engine,
        &data_dir,
        args.targets.or(file.targets).unwrap_or(1),
    )
    .await?;
    let mut telemetry = telemetry;
    let mut attach = Attach::tcp(listen[0], security).with_rails(listen[1..].to_vec());
    telemetry.attach(&mut attach);
    let mut cfg = OssConfig {
        heartbeat_every: Duration::from_secs(
            args.heartbeat.or(file.heartbeat_s).unwrap_or(5).max(1),
        ),
        mds_timeout: Duration::from_secs(args.mds_timeout.or(file.mds_timeout_s).unwrap_or(60)),
        mds_rails,
        trust_mds_objects: args.trust_mds_objects,
        io,
        ..OssConfig::new(mds)
    };
    if telemetry.counting() {
        cfg.metrics = Some(oss::metrics::OssMetrics::register(&mut telemetry.registry));
    }
    let server = OssServer::start(cfg, homes, &attach)
        .await
        .with_context(|| format!("starting the storage server on {}", listen[0]))?;
    let _metrics = telemetry.serve(server.metrics_refresh()).await?;
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

fn probe(data_dir: &Path) -> Result<()> {
    use oss::io_policy::IoProfile;
    let _lock = daemon::DataDirLock::acquire(data_dir)?;
    let dirs = target_dirs(data_dir)?;
    if dirs.is_empty() {
        bail!("{}: no targets", data_dir.display());
    }
    for dir in dirs {
        let p = IoProfile::measure(&dir).with_context(|| format!("measuring {}", dir.display()))?;
        p.save(&dir)
            .with_context(|| format!("keeping the profile in {}", dir.display()))?;
        let c = p.choose();
        println!(
            "{}: write direct {:.0} MB/s, buffered {:.0} MB/s; read direct {:.0} MB/s, buffered {:.0} MB/s: writes {}, reads {}",
            dir.display(),
            p.direct_write / 1e6,
            p.buffered_write / 1e6,
            p.direct_read / 1e6,
            p.buffered_read / 1e6,
            c.writes(),
            c.reads()
        );
    }
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
