//! `lode-mds`: the metadata server.
//!
//! `lode-mds format --data-dir DIR` makes a filesystem; `lode-mds --data-dir DIR --listen
//! ADDR` serves its namespace and the registry of storage targets; `lode-mds fsck --data-dir
//! DIR` checks the namespace's invariants offline.

/// mimalloc: the servers and the mount allocate and free small buffers and maps on many
/// threads at once, where glibc's allocator spent a tenth of their time (docs/decisions.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lnet::Attach;
use mds::identity::{NodeGroup, NodeRange, Nodemap};
use mds::store::DEFAULT_CHECKPOINT_BYTES;
use mds::{MdsConfig, MdsServer};

/// How often the journal commits by default when nobody waits for it: a few milliseconds
/// gather the changes of a busy metadata load into one write and one sync (Lustre's journal
/// commits every 5 s), while a change still reaches the disk long before a client could fail
/// too. Anything that waits for durability commits at once.
const DEFAULT_COMMIT_INTERVAL_MS: u64 = 5;
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
    /// Make a new filesystem in a data directory: an empty namespace and the filesystem's
    /// identity (a uuid and a name), which every storage target records at its first
    /// registration. The MDS serves only a formatted directory; format refuses one that holds
    /// a filesystem already.
    Format {
        /// Where the MDS will keep its state (made if missing).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The configuration file, for its `data_dir`.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The filesystem's name (1 to 32 letters, digits, '-' or '_').
        #[arg(long, default_value = mds::format::DEFAULT_NAME)]
        fsname: String,
        /// The metadata target (MDT) this directory holds. MDT0 makes the filesystem and
        /// holds its root; another MDT joins the filesystem MDT0 made, named by `--fs-uuid`.
        #[arg(long, default_value_t = 0)]
        mdt_index: u32,
        /// The uuid (hexadecimal) of the filesystem an MDT other than 0 joins, as MDT0's
        /// format printed it.
        #[arg(long)]
        fs_uuid: Option<String>,
    },
    /// Add a storage target the registry does not know (its registry file lost, or restored
    /// from an older copy), by the index and uuid its server's refusal named. Offline: the
    /// MDS must be stopped.
    TargetAdd {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long)]
        index: u32,
        /// The target's uuid, in hexadecimal.
        #[arg(long)]
        uuid: String,
        /// Its storage server's address (host:port).
        #[arg(long)]
        oss: String,
    },
    /// Check the namespace's invariants (entries point to inodes, link counts, no cycles, no
    /// orphans) without serving.
    Fsck {
        /// An MDT's data directory; given once per MDT (MDSs stopped), the MDTs are also
        /// checked against each other: every directory placed on another MDT than its
        /// parent's named exactly once, and every such name's directory there.
        #[arg(long, required = true)]
        data_dir: Vec<PathBuf>,
    },
    /// Measure metadata operations through the RPC path against a local directory.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// A TOML file with any of `data_dir`, `listen`, `checkpoint_mib`, `commit_interval_ms`,
    /// `recovery_window_s`,
    /// `evict_after_s`, `key_file`, `auth`, `privacy`, `trusted_nodes`, `squash_uid`,
    /// `squash_gid`, `[[nodemap]]`, `capability_lifetime_s`, `audit_log`, `audit_max_mib`,
    /// `audit_keep`, `auto_resync`, `resync_rate_mib`, `resync_move_after_s`, `metrics`,
    /// `stats` and `job_stats`; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the MDS keeps its state.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to serve on [default: 127.0.0.1:9400]. Given again, the MDS listens on each
    /// (one per interface) and clients given them all use any that answers (multi-rail).
    #[arg(long)]
    listen: Vec<SocketAddr>,
    /// Journal size, in MiB, past which a snapshot is written [default: 64].
    #[arg(long)]
    checkpoint_mib: Option<u64>,
    /// Commit the journal at most once per this many milliseconds, unless a client waits for
    /// durability (fsync, sync, a tool that asks) [default: 5; 0: as soon as possible].
    /// Changes are answered before they commit; clients keep them until then.
    #[arg(long)]
    commit_interval_ms: Option<u64>,
    /// Seconds clients have after a restart to replay their uncommitted changes and count
    /// their open files again [default: 30].
    #[arg(long)]
    recovery_window_s: Option<u64>,
    #[command(flatten)]
    auth: daemon::AuthArgs,
    /// Client nodes whose root is root here (an address or a range such as 10.0.0.0/24;
    /// repeatable). Root on any other client node is squashed to nobody.
    #[arg(long = "trust", value_name = "NODES")]
    trust: Vec<String>,
    /// Write an audit log (JSON lines) to this file.
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    /// Do not resync stale mirrors in the background (`lode mirror resync` still does).
    #[arg(long)]
    no_auto_resync: bool,
    /// On an MDT other than 0: MDT0's MDS (IP:PORT or a NID), which this one registers with.
    #[arg(long)]
    mdt0: Option<String>,
    #[command(flatten)]
    stats: daemon::telemetry::StatsArgs,
}

/// The configuration file.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    data_dir: Option<PathBuf>,
    /// On an MDT other than 0: MDT0's MDS.
    mdt0: Option<String>,
    /// One address, or a list of them (one per interface).
    listen: Option<daemon::Addrs>,
    checkpoint_mib: Option<u64>,
    /// Milliseconds between journal commits at most, unless a client waits.
    commit_interval_ms: Option<u64>,
    /// Seconds clients have after a start to replay and count their open files again.
    recovery_window_s: Option<u64>,
    /// Seconds a client holding files open may stay silent before it loses its handles.
    evict_after_s: Option<u64>,
    /// The cluster key file.
    key_file: Option<PathBuf>,
    /// `false` runs without authentication (anyone who can reach the port gets in).
    auth: Option<bool>,
    /// Encrypt every connection.
    privacy: Option<bool>,
    /// Client nodes whose root is root here.
    trusted_nodes: Option<Vec<String>>,
    /// What root becomes on other nodes [default: 65534].
    squash_uid: Option<u32>,
    squash_gid: Option<u32>,
    /// Per-node identity maps: `[[nodemap]] nodes = ["10.0.1.0/24"]`, `trusted = false`,
    /// `uids = [[1000, 5000]]`, `gids = [[100, 500]]`.
    nodemap: Option<Vec<NodemapEntry>>,
    /// Seconds a capability for object I/O lasts [default: 3600].
    capability_lifetime_s: Option<u64>,
    /// Write the audit log here (one JSON line per open, create, unlink, rename, setattr).
    audit_log: Option<PathBuf>,
    /// Rotate the audit log past this many MiB [default: 64].
    audit_max_mib: Option<u64>,
    /// Rotated audit logs kept [default: 8].
    audit_keep: Option<u32>,
    /// Milliseconds between syncs of the audit log [default: 1000].
    audit_sync_ms: Option<u64>,
    /// While the audit log cannot be written: `refuse-changes` or `refuse-all`
    /// [default: refuse-changes].
    audit_on_failure: Option<String>,
    /// Audit lines a second one client node may write; past it they are counted, not written
    /// [default: 500].
    audit_node_rate: Option<u32>,
    /// Resync stale mirrors in the background [default: true].
    auto_resync: Option<bool>,
    /// MiB a second the background resync copies, at most (0: no limit) [default: 200].
    resync_rate_mib: Option<u64>,
    /// Seconds a stale mirror waits for its servers to return before it is placed on
    /// others [default: 600].
    resync_move_after_s: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    metrics: Option<SocketAddr>,
    /// `false` counts nothing (no metrics, job statistics or counts for `lode top`).
    stats: Option<bool>,
    /// `false` keeps no job statistics.
    job_stats: Option<bool>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NodemapEntry {
    nodes: Vec<String>,
    #[serde(default)]
    trusted: bool,
    #[serde(default)]
    uids: Vec<(u32, u32)>,
    #[serde(default)]
    gids: Vec<(u32, u32)>,
}

fn ranges(nodes: &[String]) -> Result<Vec<NodeRange>> {
    nodes
        .iter()
        .map(|n| n.parse().map_err(anyhow::Error::msg))
        .collect()
}

/// What the server runs with: flags over the file over defaults.
struct Settings {
    data_dir: PathBuf,
    /// The first names the MDS; the others are its other rails.
    listen: Vec<SocketAddr>,
    checkpoint_mib: u64,
    commit_interval: Duration,
    recovery_window: Duration,
    evict_after: Duration,
    security: lnet::auth::Security,
    nodemap: Nodemap,
    capability_lifetime: Duration,
    audit: Option<mds::audit::AuditConfig>,
    heal: Option<client::mirrors::HealConfig>,
    telemetry: daemon::telemetry::Telemetry,
    mdt0: Option<proto::Nid>,
}

impl ServeArgs {
    fn settings(self) -> Result<Settings> {
        let file: Config = daemon::telemetry::load_config(self.config.as_deref())?;
        let mdt0 = match self.mdt0.as_deref().or(file.mdt0.as_deref()) {
            Some(a) => Some(
                proto::Nid::parse_loose(a)
                    .map_err(anyhow::Error::msg)
                    .with_context(|| format!("--mdt0 {a:?}"))?,
            ),
            None => None,
        };
        Ok(Settings {
            mdt0,
            telemetry: self
                .stats
                .telemetry(file.metrics, file.stats, file.job_stats),
            data_dir: self
                .data_dir
                .or(file.data_dir)
                .context("--data-dir (or data_dir in the config) is required")?,
            listen: match (self.listen, file.listen) {
                (flags, _) if !flags.is_empty() => flags,
                (_, Some(file)) if !file.clone().into_vec().is_empty() => file.into_vec(),
                _ => vec![SocketAddr::from(([127, 0, 0, 1], 9400))],
            },
            checkpoint_mib: self
                .checkpoint_mib
                .or(file.checkpoint_mib)
                .unwrap_or(DEFAULT_CHECKPOINT_BYTES >> 20)
                .max(1),
            commit_interval: Duration::from_millis(
                self.commit_interval_ms
                    .or(file.commit_interval_ms)
                    .unwrap_or(DEFAULT_COMMIT_INTERVAL_MS),
            ),
            recovery_window: self
                .recovery_window_s
                .or(file.recovery_window_s)
                .map_or(mds::server::RECOVERY_WINDOW, Duration::from_secs),
            evict_after: file
                .evict_after_s
                .map_or(mds::server::EVICT_AFTER, Duration::from_secs),
            security: self
                .auth
                .security(file.key_file.as_deref(), file.auth, file.privacy)?,
            nodemap: {
                let mut groups = vec![];
                let trusted: Vec<String> = self
                    .trust
                    .into_iter()
                    .chain(file.trusted_nodes.unwrap_or_default())
                    .collect();
                if !trusted.is_empty() {
                    groups.push(NodeGroup {
                        nodes: ranges(&trusted)?,
                        trusted: true,
                        ..NodeGroup::default()
                    });
                }
                for e in file.nodemap.unwrap_or_default() {
                    groups.push(NodeGroup {
                        nodes: ranges(&e.nodes)?,
                        trusted: e.trusted,
                        uids: e.uids,
                        gids: e.gids,
                    });
                }
                Nodemap {
                    groups,
                    squash_uid: file.squash_uid.unwrap_or(mds::identity::NOBODY),
                    squash_gid: file.squash_gid.unwrap_or(mds::identity::NOBODY),
                }
            },
            audit: self
                .audit_log
                .or(file.audit_log)
                .map(|path| -> Result<mds::audit::AuditConfig> {
                    let d = mds::audit::AuditConfig::new(path);
                    Ok(mds::audit::AuditConfig {
                        max_bytes: file.audit_max_mib.unwrap_or(64).max(1) << 20,
                        keep: file.audit_keep.unwrap_or(8),
                        sync_every: file
                            .audit_sync_ms
                            .map_or(d.sync_every, Duration::from_millis),
                        on_failure: match &file.audit_on_failure {
                            Some(f) => f.parse().map_err(anyhow::Error::msg)?,
                            None => d.on_failure,
                        },
                        per_node_rate: file.audit_node_rate.unwrap_or(d.per_node_rate),
                        ..d
                    })
                })
                .transpose()?,
            heal: (!self.no_auto_resync && file.auto_resync != Some(false)).then(|| {
                let d = client::mirrors::HealConfig::default();
                client::mirrors::HealConfig {
                    rate: file.resync_rate_mib.map_or(d.rate, |m| m << 20),
                    move_after: file
                        .resync_move_after_s
                        .map_or(d.move_after, Duration::from_secs),
                    ..d
                }
            }),
            capability_lifetime: file
                .capability_lifetime_s
                .map_or(mds::identity::CAPABILITY_LIFETIME, |s| {
                    Duration::from_secs(s.max(60))
                }),
        })
    }
}

fn main() -> Result<()> {
    daemon::init_logging();
    daemon::no_huge_pages();
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Fsck { data_dir }) => fsck(&data_dir),
        Some(Cmd::Format {
            data_dir,
            config,
            fsname,
            mdt_index,
            fs_uuid,
        }) => format(data_dir, config, &fsname, mdt_index, fs_uuid.as_deref()),
        Some(Cmd::TargetAdd {
            data_dir,
            index,
            uuid,
            oss,
        }) => target_add(&data_dir, index, &uuid, &oss),
        Some(Cmd::Bench(args)) => tokio::runtime::Runtime::new()?.block_on(bench::run(args)),
        None => serve(cli.serve),
    }
}

fn format(
    data_dir: Option<PathBuf>,
    config: Option<PathBuf>,
    name: &str,
    mdt: u32,
    fs_uuid: Option<&str>,
) -> Result<()> {
    let uuid = match (mdt, fs_uuid) {
        (_, Some(u)) => u128::from_str_radix(u.trim_start_matches("0x"), 16)
            .ok()
            .filter(|u| *u != 0)
            .with_context(|| format!("{u:?} is not a filesystem uuid (32 hexadecimal digits)"))?,
        (0, None) => rand::random(),
        (k, None) => bail!(
            "MDT{k} joins a filesystem: give --fs-uuid, the uuid its MDT0's format printed \
             (and the same --fsname)"
        ),
    };
    let file: Config = daemon::telemetry::load_config(config.as_deref())?;
    let dir = data_dir
        .or(file.data_dir)
        .context("--data-dir (or data_dir in the config) is required")?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _lock = daemon::DataDirLock::acquire(&dir)?;
    let disk = mds::disk::DirDisk::new(&dir);
    let id = mds::format::format_mdt(
        &disk,
        &dir.display().to_string(),
        name,
        uuid,
        mdt,
        mds::store::wall_clock()(),
    )?;
    println!(
        "formatted filesystem {} ({:032x}) MDT{} in {}",
        id.name,
        id.uuid,
        id.mdt,
        dir.display()
    );
    Ok(())
}

fn target_add(dir: &std::path::Path, index: u32, uuid: &str, oss: &str) -> Result<()> {
    let uuid = u128::from_str_radix(uuid.trim_start_matches("0x"), 16)
        .with_context(|| format!("{uuid:?} is not a hexadecimal uuid"))?;
    let oss: proto::Nid = if oss.contains('@') {
        oss.parse().map_err(anyhow::Error::msg)?
    } else {
        proto::Nid::Tcp(
            oss.parse()
                .with_context(|| format!("{oss:?} is not host:port"))?,
        )
    };
    if !dir.is_dir() {
        bail!("{} does not exist", dir.display());
    }
    let _lock = daemon::DataDirLock::acquire(dir)?;
    let disk = mds::disk::DirDisk::new(dir);
    let fs = mds::format::read(&disk, &dir.display().to_string())?
        .with_context(|| format!("{} holds no formatted filesystem", dir.display()))?;
    let registry = mds::registry::Registry::open(dir, fs)?;
    registry.admit(index, uuid, &oss)?;
    println!("target {index} ({uuid:032x}) at {oss} added");
    Ok(())
}

fn fsck(dirs: &[PathBuf]) -> Result<()> {
    let mut locks = vec![];
    let mut namespaces = vec![];
    let mut found = 0;
    for dir in dirs {
        locks.push(daemon::DataDirLock::acquire(dir)?);
        let disk = mds::disk::DirDisk::new(dir);
        let id = mds::format::read(&disk, &dir.display().to_string())?;
        let mdt = id.as_ref().map_or(0, |id| id.mdt);
        let fresh = mds::namespace::Namespace::for_mdt(mdt, Default::default());
        let rec = mds::journal::recover(&disk, fresh)
            .with_context(|| format!("reading the namespace in {}", dir.display()))?;
        let problems = rec.namespace.check();
        let named = if dirs.len() > 1 {
            format!("MDT{mdt} ({}): ", dir.display())
        } else {
            String::new()
        };
        println!(
            "{named}{} inodes, {} journal records replayed, {} bytes of torn tail, {} problems",
            rec.namespace.len(),
            rec.replayed,
            rec.torn,
            problems.len()
        );
        for p in &problems {
            println!("  {p}");
        }
        found += problems.len();
        namespaces.push(rec.namespace);
    }
    if namespaces.len() > 1 {
        let refs: Vec<&mds::namespace::Namespace> = namespaces.iter().collect();
        let problems = mds::across::check_across(&refs);
        println!(
            "across the {} MDTs: {} problems",
            refs.len(),
            problems.len()
        );
        for p in &problems {
            println!("  {p}");
        }
        found += problems.len();
    }
    if found > 0 {
        bail!("{found} problems found");
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    let args = args.settings()?;
    let cfg = MdsConfig {
        checkpoint_bytes: args.checkpoint_mib << 20,
        recovery_window: args.recovery_window,
        commit_interval: args.commit_interval,
        evict_after: args.evict_after,
        nodemap: args.nodemap,
        capability_lifetime: args.capability_lifetime,
        audit: args.audit,
        mdt0: args.mdt0.clone(),
        ..MdsConfig::new(args.data_dir)
    };
    let mut telemetry = args.telemetry;
    let mut attach =
        Attach::tcp(args.listen[0], args.security.clone()).with_rails(args.listen[1..].to_vec());
    telemetry.attach(&mut attach);
    let mut cfg = cfg;
    if telemetry.counting() {
        cfg.metrics = Some(mds::metrics::MdsMetrics::register(&mut telemetry.registry));
    }
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(async {
        let server = MdsServer::start(cfg, &attach)
            .await
            .with_context(|| format!("starting the MDS on {}", args.listen[0]))?;
        let _metrics = telemetry.serve(server.metrics_refresh()).await?;
        println!("lode-mds serving at {}", server.nid());
        let _healer = match args.heal {
            Some(heal) => Some(heal_mirrors(
                args.mdt0.clone().unwrap_or_else(|| server.nid()),
                args.security.clone(),
                client::mirrors::HealConfig {
                    mdt: Some(server.mdt()),
                    ..heal
                },
            )),
            None => {
                tracing::warn!("background resync of stale mirrors is off");
                None
            }
        };
        let why = daemon::stop_requested().await?;
        tracing::info!(signal = why, "shutting down");
        server.stop().await;
        Ok(())
    })
}

/// The mirror healer: a client of the filesystem (through MDT0, at `nid`) with the server's
/// own key (the server role: root, no capabilities needed), resyncing stale mirrors of this
/// MDS's files as their servers return.
fn heal_mirrors(
    nid: proto::Nid,
    security: lnet::auth::Security,
    cfg: client::mirrors::HealConfig,
) -> client::mirrors::HealerTask {
    let addr = match &nid {
        proto::Nid::Tcp(a) if a.ip().is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], a.port())).to_string()
        }
        other => other.to_string(),
    };
    let net = lnet::tcp::TcpEndpoint::client(lnet::tcp::TcpConfig {
        security,
        ..Default::default()
    });
    client::mirrors::Healer::spawn(net.into(), addr, client::ClientConfig::default(), cfg)
}
