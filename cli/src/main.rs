//! `lode`: the filesystem's command, after Lustre's `lfs`, and a whole local cluster in one
//! command.

/// mimalloc: the servers and the mount allocate and free small buffers and maps on many
/// threads at once, where glibc's allocator spent a tenth of their time (docs/decisions.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `println!` for the command's output: a reader that went away (`lode ls | head`) ends the
/// command quietly, as it ends `ls`, rather than with a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            $crate::output_failed(e);
        }
    }};
}

mod bench;
mod cluster;
mod crypt;
mod health;
mod hsm;
mod jobstats;
mod metabench;
mod monitor;
mod mount;
mod sim;
mod top;
mod verify;

use std::io::{Read, Write};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use client::{Client, OpenOptions};
use proto::layout::{Layout, StripeCount, EOF};
use proto::md::Kind;

#[derive(Parser)]
#[command(
    name = "lode",
    about = "lode parallel filesystem: files, layouts, space, benchmarks, local clusters"
)]
struct Cli {
    /// The MDS (IP:PORT or a NID); default $LODE_MDS, else 127.0.0.1:9400.
    #[arg(long, global = true)]
    mds: Option<String>,
    /// The key to authenticate with; default $LODE_KEY, else /etc/lode/client.key.
    #[arg(long, global = true, value_name = "FILE")]
    key: Option<std::path::PathBuf>,
    /// Connect without authentication (only to a cluster that runs without it).
    #[arg(long, global = true, conflicts_with = "key")]
    no_auth: bool,
    /// Encrypt the connections, not only authenticate them.
    #[arg(long, global = true)]
    privacy: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// How this command authenticates, passed on to a mount it starts in the background.
#[derive(Clone, Default)]
pub struct AuthArgs {
    pub key: Option<std::path::PathBuf>,
    pub no_auth: bool,
    pub privacy: bool,
}

impl AuthArgs {
    pub fn security(&self) -> Result<lnet::auth::Security> {
        Ok(lnet::auth::client_security(
            self.key.as_deref(),
            self.no_auth,
            self.privacy,
        )?)
    }

    /// The same choice as flags for another `lode` process.
    pub fn flags(&self) -> Vec<std::ffi::OsString> {
        let mut out = vec![];
        if let Some(k) = &self.key {
            out.push("--key".into());
            out.push(k.clone().into_os_string());
        }
        if self.no_auth {
            out.push("--no-auth".into());
        }
        if self.privacy {
            out.push("--privacy".into());
        }
        out
    }
}

#[derive(Subcommand)]
enum MirrorCmd {
    /// Copy every stale mirror of each file back from one in sync, then mark it in sync.
    Resync {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Add copies to each file: new mirrors on servers holding no other copy, filled from one
    /// in sync (as `lfs mirror extend`).
    Extend {
        /// Copies to add.
        #[arg(short = 'N', long = "mirror-count", default_value_t = 1)]
        count: u16,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Move every mirror with an object on a target to other targets, copying it from a copy
    /// in sync: for a target wiped, replaced or to be retired.
    Rebuild {
        /// The target's index (as `lode df` lists it).
        #[arg(long)]
        target: u32,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Start, inspect or stop a cluster on this machine.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// Make keys: `key new FILE` (a cluster key), `key client --from CLUSTER_KEY FILE`.
    #[command(subcommand)]
    Key(KeyCmd),
    /// The striping testbed: run experiments through the flow model.
    #[command(subcommand)]
    Sim(sim::SimCmd),
    /// Set the layout of a new or empty file, or a directory's default:
    /// `setstripe -c N -S SIZE [-i IDX] PATH`, or components `-E END -c N -S SIZE ... PATH`.
    Setstripe {
        #[arg(allow_hyphen_values = true, num_args = 1.., required = true)]
        args: Vec<String>,
    },
    /// Mirrored files: `mirror resync PATH...` brings stale copies back in sync, `mirror extend
    /// [-N n] PATH...` adds copies, `mirror rebuild --target N` moves every copy off a target.
    #[command(subcommand)]
    Mirror(MirrorCmd),
    /// Files in S3: `hsm link DIR s3://BUCKET/PREFIX`, `hsm archive|release|restore|state
    /// PATH...`, `hsm links`, `hsm status` (Lustre's `lfs hsm_*`).
    #[command(subcommand)]
    Hsm(hsm::HsmCmd),
    /// Encryption at rest: `crypt set DIR --key-file F` on an empty directory, `crypt unlock
    /// DIR --key-file F`, `crypt lock DIR`, `crypt status DIR` (fscrypt's).
    #[command(subcommand)]
    Crypt(crypt::CryptCmd),
    /// Print a layout with Lustre's fields; -y for YAML.
    Getstripe {
        #[arg(short = 'y', long)]
        yaml: bool,
        path: String,
    },
    /// Where a directory's entries live, with `lfs getdirstripe`'s fields; -m for the MDT
    /// index alone; -D for the default layout of its new subdirectories instead.
    Getdirstripe {
        #[arg(short = 'm', long = "mdt-index")]
        mdt_only: bool,
        #[arg(short = 'D', long = "default")]
        default: bool,
        path: String,
    },
    /// Space of every metadata and storage target, like `lfs df`; -i for the MDTs' inodes.
    #[command(disable_help_flag = true)]
    Df {
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        /// Inodes of every MDT instead of bytes.
        #[arg(short = 'i', long = "inodes")]
        inodes: bool,
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// List a directory (or name a file), as `ls` does.
    Ls {
        /// Long listing: mode, links, owner, group, size, modification time, name.
        #[arg(short = 'l')]
        long: bool,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Print a file.
    Cat { path: String },
    /// Check a checkpoint against its manifest of SHA-256 digests: a file saved by
    /// `lode.torch.save`, or a directory saved by `lode.torch.dcp.Writer`.
    Verify { path: String },
    /// Copy a file into, out of or within lode. Paths are lode paths; a path on this
    /// machine's own filesystem is written `local:PATH` (`local:-` is stdin or stdout):
    /// `lode cp local:/data/a.bin /shards/a.bin`, `lode cp /shards/a.bin local:a.bin`.
    Cp { from: String, to: String },
    /// Make a directory; -i places it on a metadata target (MDT), as `lfs mkdir -i` does.
    Mkdir {
        #[arg(short = 'p')]
        parents: bool,
        /// The MDT the new directory (and what is made in it) lives on. Without it, a
        /// directory in the root goes to the MDT the MDS picks (in turn, the emptier first),
        /// and any other to its parent's MDT.
        #[arg(short = 'i', long = "mdt-index", conflicts_with = "parents")]
        mdt: Option<u32>,
        /// Stripe the new directory's entries over this many MDTs (as `lfs mkdir -c`).
        #[arg(short = 'c', long = "mdt-count", conflicts_with = "parents")]
        count: Option<u32>,
        /// The hash that places names on the shards (`fnv_1a_64`).
        #[arg(short = 'H', long = "mdt-hash", default_value = "fnv_1a_64")]
        hash: String,
        path: String,
    },
    /// Make a directory striped over several MDTs (as `lfs setdirstripe`): `-c N` shards,
    /// shard 0 on MDT `-i` (the parent's by default), names placed by the hash `-H`. With
    /// -D, set instead the default of an existing directory's new subdirectories (each made
    /// so unless its mkdir says otherwise, and passed on --max-inherit levels down, for ever
    /// by default; without -i, each on its parent's MDT, or spread over the MDTs in the
    /// root); -d removes that default.
    Setdirstripe {
        #[arg(short = 'c', long = "mdt-count", default_value_t = 1)]
        count: u32,
        #[arg(short = 'i', long = "mdt-index")]
        mdt: Option<u32>,
        #[arg(short = 'H', long = "mdt-hash", default_value = "fnv_1a_64")]
        hash: String,
        #[arg(short = 'D', long = "default", conflicts_with = "delete")]
        default: bool,
        #[arg(short = 'd', long = "delete")]
        delete: bool,
        /// Levels below the directory the default goes (with -D; -1: all).
        #[arg(
            long = "max-inherit",
            allow_negative_numbers = true,
            requires = "default"
        )]
        max_inherit: Option<i32>,
        path: String,
    },
    /// Remove files (and with -r, directories and what they hold).
    Rm {
        #[arg(short = 'r')]
        recursive: bool,
        paths: Vec<String>,
    },
    /// Rename atomically.
    Mv { from: String, to: String },
    /// Show a file's attributes, as `stat` does, with its FID.
    Stat { path: String },
    /// Sequential write then read of N files by N tasks, against the local disk.
    Bench(bench::BenchArgs),
    /// Mount the filesystem through FUSE (foreground; --daemon to detach). SIGTERM unmounts.
    Mount {
        mountpoint: std::path::PathBuf,
        /// Mount options, comma-separated: ro, allow_other (the default as root), no_allow_other,
        /// default_permissions, no_default_permissions, writeback, readahead_kb=N, ...
        #[arg(short = 'o')]
        options: Option<String>,
        /// Detach: start the mount in the background and return once it is mounted.
        #[arg(long)]
        daemon: bool,
        /// Serve the mount's Prometheus metrics at http://ADDR/metrics: the kernel's requests,
        /// bytes read and written, open files, leases, uncommitted changes, and the calls to
        /// each operation of the servers with their latency and errors.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
        /// Append the mount's log to FILE (made if missing) instead of standard error; with
        /// --daemon, the background process's panics go there too.
        #[arg(long, value_name = "FILE")]
        log_file: Option<std::path::PathBuf>,
    },
    /// Unmount a lode mount.
    Umount { mountpoint: std::path::PathBuf },
    /// A live view of the cluster: bandwidth and operations per target, MDS operations by
    /// type, the busiest jobs, space, servers down.
    Top {
        /// Print one frame as text and exit (for scripts).
        #[arg(long)]
        once: bool,
        /// Seconds between frames (and, with --once, the time the rates are taken over).
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
    },
    /// Whether every server is up, every target in service with room, the journal writing
    /// and the clocks agreeing. Exit status 0: healthy, 1: warnings, 2: failures.
    Health,
    /// Each job's requests and bytes on every server, as `lctl get_param *.job_stats`
    /// prints them (needs the cluster key). Clients name their job from $LODE_JOBID_VAR's
    /// variable (default LODE_JOBID), else the process name and uid.
    Jobstats {
        /// Only this job.
        #[arg(long)]
        job: Option<String>,
    },
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Write a new cluster key (mode 0600) for the servers; it never overwrites a file.
    New { file: std::path::PathBuf },
    /// Write the client key of a cluster key, for client machines.
    Client {
        #[arg(long, value_name = "CLUSTER_KEY")]
        from: std::path::PathBuf,
        file: std::path::PathBuf,
    },
}

fn key(cmd: KeyCmd) -> Result<()> {
    use lnet::auth::KeyFile;
    match cmd {
        KeyCmd::New { file } => {
            KeyFile::generate()?.save_new(&file)?;
            out!("cluster key written to {}", file.display());
        }
        KeyCmd::Client { from, file } => {
            KeyFile::load(&from)?.client_key().save_new(&file)?;
            out!("client key written to {}", file.display());
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
pub enum Place {
    Local,
    Lode,
}

fn place(p: &str) -> (Place, &str) {
    match p.strip_prefix("local:") {
        Some(rest) => (Place::Local, rest),
        None => (Place::Lode, p),
    }
}

pub fn mds_addr(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("LODE_MDS").ok())
        .unwrap_or_else(|| "127.0.0.1:9400".into())
}

/// Argument parsing and one arm per command (long by design: the command table).
/// Ends the command after its output could not be written: quietly (status 141, as a process
/// killed by SIGPIPE) when the reader went away, else with the error.
fn output_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(141);
    }
    eprintln!("lode: writing the output: {e}");
    std::process::exit(1);
}

/// Fails as `ls` and `lfs` do: one line on stderr, naming the command and what went wrong,
/// and status 1.
fn main() {
    let Err(e) = run() else { return };
    let broken_pipe = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if broken_pipe {
        std::process::exit(141);
    }
    if let Some(p) = e.downcast_ref::<PosixError>() {
        eprintln!("lode: {p}");
        std::process::exit(p.exit);
    }
    if let Some(ExitOnly(code)) = e.downcast_ref::<ExitOnly>() {
        std::process::exit(*code);
    }
    eprintln!("lode: {e:#}");
    std::process::exit(1);
}

/// A filesystem call that failed on a path, printed as coreutils print it
/// (`cannot access '/x': No such file or directory`), with their exit status.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {}{}", quoted(what, path), strerror(*errno), detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
struct PosixError {
    what: String,
    path: String,
    errno: i32,
    /// What lode knows beyond the errno, for errors a user cannot act on from the errno
    /// alone (an I/O error: which server, what failed).
    detail: Option<String>,
    exit: i32,
}

/// A failure already reported on stderr: only the exit status is left to give.
#[derive(Debug, thiserror::Error)]
#[error("exit status {0}")]
struct ExitOnly(i32);

/// `'path'`, as coreutils quote an operand, or bare after a command's name (`cat: x`).
fn quoted(what: &str, path: &str) -> String {
    if what.ends_with(':') {
        path.to_string()
    } else {
        format!("'{path}'")
    }
}

/// The text `strerror` gives for `errno`.
fn strerror(errno: i32) -> &'static str {
    nix::errno::Errno::from_raw(errno).desc()
}

/// Maps a client error on `path` to what coreutils print for `what` ("cannot access", ...).
fn posix(
    what: impl Into<String>,
    path: &str,
    exit: i32,
) -> impl FnOnce(client::ClientError) -> anyhow::Error {
    let (what, path) = (what.into(), path.to_string());
    move |e| {
        let errno = e.errno();
        let plain = [
            libc::ENOENT,
            libc::EEXIST,
            libc::EACCES,
            libc::EPERM,
            libc::ENOTDIR,
            libc::EISDIR,
            libc::ENOTEMPTY,
            libc::ENAMETOOLONG,
            libc::ELOOP,
            libc::EXDEV,
        ];
        let detail = (!plain.contains(&errno)).then(|| e.to_string());
        PosixError {
            what,
            path,
            errno,
            detail,
            exit,
        }
        .into()
    }
}

fn run() -> Result<()> {
    let mut cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("LODE_LOG").unwrap_or_else(|_| "warn".into());
    match &cli.cmd {
        // A mount in the foreground with a log file writes there; a background one's parent
        // hands the file to the child as its standard error.
        Cmd::Mount {
            log_file: Some(path),
            daemon: false,
            ..
        } => {
            let file = mount::open_log(path)?;
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        // Colours only for a terminal: a log file or journald gets plain lines.
        _ => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .init(),
    }
    daemon::no_huge_pages();
    if let Cmd::Sim(c) = cli.cmd {
        // The testbed makes its own runtimes.
        return sim::run(c);
    }
    if let Cmd::Key(k) = cli.cmd {
        return key(k);
    }
    let auth = AuthArgs {
        key: cli.key.clone(),
        no_auth: cli.no_auth,
        privacy: cli.privacy,
    };
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    // A path inside a lode mount names its filesystem and its lode path, as `lfs` allows.
    let mut from_mount = None;
    match &mut cli.cmd {
        Cmd::Setstripe { args } => {
            if let Some(last) = args.last_mut() {
                if let Some((m, p)) = mount::in_mount(last) {
                    (*last, from_mount) = (p, Some(m));
                }
            }
        }
        Cmd::Getstripe { path, .. }
        | Cmd::Getdirstripe { path, .. }
        | Cmd::Setdirstripe { path, .. }
        | Cmd::Ls { path, .. }
        | Cmd::Stat { path }
        | Cmd::Cat { path }
        | Cmd::Verify { path } => {
            if let Some((m, p)) = mount::in_mount(path) {
                (*path, from_mount) = (p, Some(m));
            }
        }
        _ => {}
    }
    let mds = from_mount.unwrap_or_else(|| mds_addr(cli.mds));
    rt.block_on(async move {
        let cmd = match cli.cmd {
            Cmd::Cluster(c) => return cluster::run(c).await,
            Cmd::Umount { mountpoint } => return mount::umount(&mountpoint),
            Cmd::Mount {
                mountpoint,
                options,
                daemon: true,
                metrics,
                log_file,
            } => {
                return mount::daemonize(
                    &mds,
                    &auth,
                    &mountpoint,
                    options.as_deref(),
                    metrics,
                    log_file.as_deref(),
                )
                .await
            }
            other => other,
        };
        // A command line should not wait a minute for a dead server.
        // A one-shot command exits at once: its changes are answered durable. The mount and
        // the benchmark run long, keep what is uncommitted and leave cleanly.
        let long_running = matches!(cmd, Cmd::Mount { .. } | Cmd::Bench(_));
        // Watching the cluster with the cluster key is an administrator's work.
        let admin = matches!(cmd, Cmd::Top { .. } | Cmd::Health | Cmd::Jobstats { .. })
            || matches!(&cmd, Cmd::Hsm(h) if h.admin());
        let security = auth.security()?;
        let mut cfg = client::ClientConfig {
            retry_for: std::time::Duration::from_secs(15),
            security: Some(if admin { security.admin() } else { security }),
            commit_behind: long_running,
            ..Default::default()
        };
        let mount_metrics = match &cmd {
            Cmd::Mount {
                metrics: Some(addr),
                ..
            } => Some(mount::Metrics::start(*addr, &mut cfg).await?),
            _ => None,
        };
        let cfg_again = cfg.clone();
        if let Cmd::Health = cmd {
            let client = Client::connect_with(&mds, cfg)
                .await
                .map_err(|e| e.to_string());
            let status = health::run(client, &mds).await;
            if status != 0 {
                return Err(ExitOnly(status).into());
            }
            return Ok(());
        }
        let client = Client::connect_with(&mds, cfg)
            .await
            .with_context(|| format!("connecting to the MDS at {mds}"))?;
        match cmd {
            Cmd::Cluster(_) | Cmd::Sim(_) | Cmd::Key(_) | Cmd::Umount { .. } | Cmd::Health => {
                unreachable!("handled above")
            }
            Cmd::Top { once, interval } => {
                if !(0.1..=3600.0).contains(&interval) {
                    bail!("top: the interval is 0.1 to 3600 seconds, not {interval}");
                }
                let interval = std::time::Duration::from_secs_f64(interval);
                if once {
                    top::once(&client, interval).await
                } else {
                    top::live(&client, interval).await
                }
            }
            Cmd::Jobstats { job } => jobstats::run(&client, job.as_deref()).await,
            Cmd::Mount {
                mountpoint,
                options,
                ..
            } => mount::run(client, &mds, &mountpoint, options.as_deref(), mount_metrics).await,
            Cmd::Setstripe { args } => setstripe(&client, &args).await,
            Cmd::Getstripe { yaml, path } => getstripe(&client, &path, yaml).await,
            Cmd::Getdirstripe {
                default: true,
                path,
                ..
            } => {
                let d = client
                    .dir_default(&path)
                    .await
                    .map_err(posix("cannot access", &path, 2))?;
                if let Some(d) = d {
                    let hash = proto::dirstripe::HashType::from_code(d.hash)
                        .map_or_else(|| format!("unknown({})", d.hash), |h| h.name().into());
                    let offset = d.offset.map_or("-1".to_string(), |o| o.to_string());
                    let inherit = match d.inherit {
                        proto::dirstripe::INHERIT_ALWAYS => "-1".to_string(),
                        n => n.to_string(),
                    };
                    out!(
                        "lmv_stripe_count: {} lmv_stripe_offset: {offset} lmv_hash_type: {hash} lmv_max_inherit: {inherit}",
                        d.count
                    );
                }
                Ok(())
            }
            Cmd::Getdirstripe { mdt_only, path, .. } => {
                let i = client
                    .stat(&path)
                    .await
                    .map_err(posix("cannot access", &path, 2))?;
                if i.kind != Kind::Dir {
                    return Err(PosixError {
                        what: "getdirstripe:".into(),
                        path,
                        errno: libc::ENOTDIR,
                        detail: None,
                        exit: 1,
                    }
                    .into());
                }
                let mdt = proto::fid::mdt_of(i.fid).unwrap_or(0);
                let stripe =
                    client
                        .dir_stripe(i.fid)
                        .await
                        .map_err(posix("cannot access", &path, 2))?;
                match stripe {
                    Some(s) if mdt_only => out!("{}", s.offset),
                    None if mdt_only => out!("{mdt}"),
                    // Not striped: its entries live on one MDT.
                    None => {
                        out!("lmv_stripe_count: 0 lmv_stripe_offset: {mdt} lmv_hash_type: none")
                    }
                    Some(s) => {
                        let hash = proto::dirstripe::HashType::from_code(s.hash)
                            .map_or_else(|| format!("unknown({})", s.hash), |h| h.name().into());
                        out!(
                            "lmv_stripe_count: {} lmv_stripe_offset: {} lmv_hash_type: {hash}",
                            s.count,
                            s.offset
                        );
                        out!("mdtidx\t\t FID[seq:oid:ver]");
                        for f in &s.shards {
                            out!("{:6}\t\t {f}", proto::fid::mdt_of(*f).unwrap_or(0));
                        }
                    }
                }
                Ok(())
            }
            Cmd::Mirror(MirrorCmd::Resync { paths }) => resync(&client, &paths, None).await,
            Cmd::Mirror(MirrorCmd::Extend { count, paths }) => {
                resync(&client, &paths, Some(count)).await
            }
            Cmd::Mirror(MirrorCmd::Rebuild { target }) => rebuild(&client, target).await,
            Cmd::Hsm(h) => hsm::run(&client, h).await,
            Cmd::Crypt(c) => crypt::run(&client, c).await,
            Cmd::Df { human, inodes, .. } => df(&client, human, inodes).await,
            Cmd::Ls { long, path } => ls(&client, &path, long).await,
            Cmd::Cat { path } => {
                // `cat: X: No such file or directory`
                let i = client.stat(&path).await.map_err(posix("cat:", &path, 1))?;
                if i.kind == Kind::Dir {
                    return Err(PosixError {
                        what: "cat:".into(),
                        path,
                        errno: libc::EISDIR,
                        detail: None,
                        exit: 1,
                    }
                    .into());
                }
                cp(&client, &path, "local:-").await
            }
            Cmd::Verify { path } => verify::run(&client, &path).await,
            Cmd::Cp { from, to } => cp(&client, &from, &to).await,
            Cmd::Mkdir {
                parents,
                mdt,
                count,
                hash,
                path,
            } => {
                let err = posix("cannot create directory", &path, 1);
                match (parents, mdt, count) {
                    (true, ..) => client.mkdir_all(&path, 0o755).await.map_err(err)?,
                    (false, mdt, Some(c)) => {
                        mkdir_striped(&client, &path, c, mdt, &hash, "mkdir:").await?
                    }
                    (false, Some(k), None) => {
                        client.mkdir_on(&path, 0o755, k).await.map_err(err)?;
                    }
                    (false, None, None) => {
                        client.mkdir(&path, 0o755).await.map_err(err)?;
                    }
                }
                Ok(())
            }
            Cmd::Setdirstripe {
                delete: true, path, ..
            } => client
                .set_dir_default(&path, None)
                .await
                .map_err(posix("setdirstripe:", &path, 1)),
            Cmd::Setdirstripe {
                count,
                mdt,
                hash,
                default: true,
                max_inherit,
                path,
                ..
            } => {
                let bad = |what: String| PosixError {
                    what: "setdirstripe:".into(),
                    path: path.clone(),
                    errno: libc::EINVAL,
                    detail: Some(what),
                    exit: 1,
                };
                let Some(h) = proto::dirstripe::HashType::parse(&hash) else {
                    return Err(bad(format!("unknown hash {hash:?}")).into());
                };
                let inherit = match max_inherit {
                    None | Some(-1) => proto::dirstripe::INHERIT_ALWAYS,
                    Some(n) if (0..i32::from(proto::dirstripe::INHERIT_ALWAYS)).contains(&n) => {
                        n as u8
                    }
                    Some(n) => return Err(bad(format!("--max-inherit {n} (-1, or 0 to 254)")).into()),
                };
                let d = proto::dirstripe::DirDefault {
                    count,
                    offset: mdt,
                    hash: h.code(),
                    inherit,
                };
                client
                    .set_dir_default(&path, Some(d))
                    .await
                    .map_err(posix("setdirstripe:", &path, 1))
            }
            Cmd::Setdirstripe {
                count,
                mdt,
                hash,
                path,
                ..
            } => mkdir_striped(&client, &path, count, mdt, &hash, "setdirstripe:").await,
            Cmd::Rm { recursive, paths } => {
                // As `rm`: each operand that fails is reported, the others still removed.
                let mut status = Ok(());
                for p in paths {
                    if let Err(e) = rm(&client, &p, recursive).await {
                        match e.downcast::<PosixError>() {
                            Ok(p) => {
                                eprintln!("lode: {p}");
                                status = Err(anyhow::Error::from(ExitOnly(1)));
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                status
            }
            Cmd::Mv { from, to } => {
                let what = format!("cannot move '{from}' to");
                client.rename(&from, &to).await.map_err(posix(what, &to, 1))
            }
            Cmd::Stat { path } => stat(&client, &path).await,
            Cmd::Bench(args) if args.meta => {
                let out = metabench::run(&mds, cfg_again, &args).await;
                client.close().await?;
                out
            }
            Cmd::Bench(args) => {
                bench::run(client.clone(), args).await?;
                client.close().await.map_err(Into::into)
            }
        }
    })
}

pub use client::stripe_args::parse_size;

/// `-E END -c N -S SIZE -i IDX ... PATH` (Lustre's order), or without -E for plain RAID0.
fn parse_layout(args: &[String]) -> Result<(Layout, String)> {
    let Some((path, opts)) = args.split_last() else {
        bail!("setstripe needs a path")
    };
    Ok((client::stripe_args::parse(opts)?, path.clone()))
}

async fn setstripe(client: &Client, args: &[String]) -> Result<()> {
    let (layout, path) = parse_layout(args)?;
    client
        .setstripe(&path, layout)
        .await
        .with_context(|| format!("setstripe {path}"))?;
    Ok(())
}

/// `lode mirror rebuild --target N`: every copy on the target moved elsewhere, with progress.
async fn rebuild(client: &Client, target: u32) -> Result<()> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "rebuilding target {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .expect("a valid template"),
    );
    bar.set_message(target.to_string());
    let report = client::mirrors::rebuild_target(client, target, |done, total, _| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .await
    .with_context(|| format!("rebuild of target {target}"))?;
    bar.finish_and_clear();
    for (fid, e) in &report.failed {
        eprintln!("lode: mirror rebuild: {fid}: {e}");
    }
    out!(
        "target {target}: {} of {} mirrored files rebuilt ({} bytes copied)",
        report.rebuilt,
        report.files,
        report.bytes
    );
    if !report.failed.is_empty() {
        anyhow::bail!("{} files not rebuilt", report.failed.len());
    }
    Ok(())
}

/// `lode mirror resync` (and `extend`, which first adds `add` copies): each file's stale
/// copies brought back, with progress; a file that fails is reported and the others still
/// done, as `cp` does.
async fn resync(client: &Client, paths: &[String], add: Option<u16>) -> Result<()> {
    let mut failed = 0;
    for path in paths {
        let done = async {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(client, path)
                .await?;
            let bar = indicatif::ProgressBar::new(0).with_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                )
                .expect("a valid template"),
            );
            bar.set_message(path.clone());
            let copied = async {
                let mut n = 0;
                for _ in 0..add.unwrap_or(0) {
                    n += f
                        .extend_mirror(|at, total| {
                            bar.set_length(total);
                            bar.set_position(at);
                        })
                        .await?;
                }
                n += f
                    .resync(|at, total| {
                        bar.set_length(total);
                        bar.set_position(at);
                    })
                    .await?;
                Ok::<_, client::ClientError>(n)
            }
            .await;
            bar.finish_and_clear();
            let closed = f.close().await;
            let copied = copied?;
            closed?;
            Ok::<_, client::ClientError>(copied)
        }
        .await;
        match done {
            Ok(n) => out!(
                "{path}: {} ({n} bytes copied)",
                if add.is_some() {
                    "extended"
                } else {
                    "resynced"
                }
            ),
            Err(e) => {
                let verb = if add.is_some() { "extend" } else { "resync" };
                eprintln!("lode: mirror {verb}: {path}: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} files not done", paths.len());
    }
    Ok(())
}

async fn getstripe(client: &Client, path: &str, yaml: bool) -> Result<()> {
    let Some(layout) = client.getstripe(path).await? else {
        out!("{path} has no stripe info");
        return Ok(());
    };
    out!("{path}");
    if yaml {
        out!("  lcm_layout_gen:    {}", layout.generation);
        out!("  lcm_mirror_count:  {}", layout.mirror_count());
        out!("  lcm_entry_count:   {}", layout.components.len());
        out!("  components:");
    }
    for (i, c) in layout.components.iter().enumerate() {
        let count = match c.stripe_count {
            StripeCount::All => -1,
            StripeCount::Count(n) => i64::from(n),
            // As lfs shows a Data-on-MDT component.
            StripeCount::Mdt => 0,
        };
        let pattern = if c.on_mdt() { "mdt" } else { "raid0" };
        let end = if c.end == EOF {
            "EOF".to_string()
        } else {
            c.end.to_string()
        };
        let offset = c
            .objects
            .first()
            .map(|o| i64::from(o.target))
            .or(c.stripe_offset.map(i64::from))
            .unwrap_or(-1);
        if yaml {
            out!("    - lcme_id:             {}", i + 1);
            out!("      lcme_mirror_id:      {}", c.mirror + 1);
            out!(
                "      lcme_flags:          {}",
                if c.stale { "init,stale" } else { "init" }
            );
            out!("      lcme_extent.e_start: {}", c.start);
            out!("      lcme_extent.e_end:   {end}");
            out!("      sub_layout:");
            out!("        lmm_stripe_count:  {count}");
            out!("        lmm_stripe_size:   {}", c.stripe_size);
            out!("        lmm_pattern:       {pattern}");
            out!("        lmm_layout_gen:    {}", layout.generation);
            out!("        lmm_stripe_offset: {offset}");
            if !c.objects.is_empty() {
                out!("        lmm_objects:");
                for o in &c.objects {
                    out!("        - l_ost_idx: {}", o.target);
                    out!("          l_fid:     {}", o.fid);
                }
            }
        } else {
            if layout.mirror_count() > 1 {
                out!(
                    "  mirror {}{}: component {}: [{}, {end})",
                    c.mirror + 1,
                    if c.stale { " (stale)" } else { "" },
                    i + 1,
                    c.start
                );
            } else if layout.components.len() > 1 {
                out!("  component {}: [{}, {end})", i + 1, c.start);
            }
            out!("lmm_stripe_count:  {count}");
            out!("lmm_stripe_size:   {}", c.stripe_size);
            out!("lmm_pattern:       {pattern}");
            out!("lmm_layout_gen:    {}", layout.generation);
            out!("lmm_stripe_offset: {offset}");
            if !c.objects.is_empty() {
                out!("\tobdidx\t\t objid\t\t objid\t\t group");
                for o in &c.objects {
                    out!(
                        "\t{:6}\t{:14}\t{:#14x}\t{:#14x}",
                        o.target,
                        o.fid.oid,
                        o.fid.oid,
                        o.fid.seq
                    );
                }
            }
        }
    }
    Ok(())
}

pub fn human(n: u64) -> String {
    let units = ["B", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}")
    } else {
        format!("{v:.1}{}", units[u])
    }
}

/// Each MDT's figures: MDT0's from the MDS the client uses, the others' from their own MDSs
/// (a down one as `None`).
async fn mdt_stats(client: &Client) -> Result<Vec<(u32, Option<proto::md::FsStats>)>> {
    let mut out = vec![(0, Some(client.statfs().await?))];
    for m in client.mdts().await? {
        let s = if m.up {
            client.mdt_statfs(&m).await.ok()
        } else {
            None
        };
        out.push((m.index, s));
    }
    Ok(out)
}

async fn df(client: &Client, h: bool, inodes: bool) -> Result<()> {
    let fmt = |n: u64| if h { human(n) } else { (n / 1024).to_string() };
    let mdts = mdt_stats(client).await?;
    if inodes {
        // An MDT numbers at most 2^32 - 1 inodes in its sequence: that is its capacity.
        let cap = u64::from(u32::MAX);
        out!(
            "{:<24} {:>12} {:>12} {:>12} {:>5} Mounted on",
            "UUID",
            "Inodes",
            "IUsed",
            "IFree",
            "IUse%"
        );
        let (mut t, mut u) = (0, 0);
        for (k, s) in &mdts {
            match s {
                Some(s) => {
                    let used = s.inodes.min(cap);
                    out!(
                        "{:<24} {:>12} {:>12} {:>12} {:>4}% lode[MDT:{k}]",
                        format!("lode-MDT{k:04x}_UUID"),
                        cap,
                        used,
                        cap - used,
                        used * 100 / cap
                    );
                    (t, u) = (t + cap, u + used);
                }
                None => out!(
                    "{:<24} {:>56} lode[MDT:{k}] (down)",
                    format!("lode-MDT{k:04x}_UUID"),
                    ""
                ),
            }
        }
        out!(
            "\n{:<24} {:>12} {:>12} {:>12} {:>4}% lode",
            "filesystem_summary:",
            t,
            u,
            t - u,
            (u * 100).checked_div(t).unwrap_or(0)
        );
        return Ok(());
    }
    out!(
        "{:<24} {:>12} {:>12} {:>12} {:>5} Mounted on",
        "UUID",
        if h { "bytes" } else { "1K-blocks" },
        "Used",
        "Available",
        "Use%"
    );
    for (k, s) in &mdts {
        match s {
            Some(s) => {
                let used = s.mdt_total.saturating_sub(s.mdt_free);
                out!(
                    "{:<24} {:>12} {:>12} {:>12} {:>4}% lode[MDT:{k}]",
                    format!("lode-MDT{k:04x}_UUID"),
                    fmt(s.mdt_total),
                    fmt(used),
                    fmt(s.mdt_free),
                    (used * 100).checked_div(s.mdt_total).unwrap_or(0)
                );
            }
            None => out!(
                "{:<24} {:>56} lode[MDT:{k}] (down)",
                format!("lode-MDT{k:04x}_UUID"),
                ""
            ),
        }
    }
    let (mut t, mut u, mut a) = (0, 0, 0);
    for tg in client.targets().await? {
        let used = tg.total.saturating_sub(tg.free);
        let pct = (used * 100).checked_div(tg.total).unwrap_or(0);
        let state = if tg.up { "" } else { " (down)" };
        out!(
            "{:<24} {:>12} {:>12} {:>12} {:>4}% lode[OST:{}]{state}",
            format!("lode-OST{:04x}_UUID", tg.index),
            fmt(tg.total),
            fmt(used),
            fmt(tg.free),
            pct,
            tg.index
        );
        if tg.up {
            (t, u, a) = (t + tg.total, u + used, a + tg.free);
        }
    }
    let pct = (u * 100).checked_div(t).unwrap_or(0);
    out!(
        "\n{:<24} {:>12} {:>12} {:>12} {:>4}% lode",
        "filesystem_summary:",
        fmt(t),
        fmt(u),
        fmt(a),
        pct
    );
    Ok(())
}

/// `ls [-l]`: names sorted bytewise (as `LC_ALL=C ls`); a missing operand is status 2.
async fn ls(client: &Client, path: &str, long: bool) -> Result<()> {
    let i = client
        .lstat(path)
        .await
        .map_err(posix("cannot access", path, 2))?;
    if i.kind != Kind::Dir {
        if long {
            let target = link_target(client, path, &i).await;
            print_long(&[(path.to_string(), i, target)]);
        } else {
            out!("{path}");
        }
        return Ok(());
    }
    let mut entries =
        client
            .readdir(path)
            .await
            .map_err(posix("cannot open directory", path, 2))?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    if !long {
        for e in entries {
            out!("{}", String::from_utf8_lossy(&e.name));
        }
        return Ok(());
    }
    let mut rows = vec![];
    for e in entries {
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let full = format!("{}/{name}", path.trim_end_matches('/'));
        // Removed meanwhile: left out, as `ls` leaves it out.
        let Ok(st) = client.lstat(&full).await else {
            continue;
        };
        let target = link_target(client, &full, &st).await;
        rows.push((name, st, target));
    }
    print_long(&rows);
    Ok(())
}

async fn link_target(client: &Client, path: &str, i: &proto::md::Inode) -> Option<String> {
    if i.kind != Kind::Symlink {
        return None;
    }
    client.readlink(path).await.ok()
}

/// `ls -l`'s lines, columns as wide as their widest entry.
fn print_long(rows: &[(String, proto::md::Inode, Option<String>)]) {
    let now = jiff::Timestamp::now();
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|(name, st, target)| {
            let size = match st.kind {
                Kind::CharDev(d) | Kind::BlockDev(d) => {
                    format!(
                        "{}, {}",
                        libc::major(d as libc::dev_t),
                        libc::minor(d as libc::dev_t)
                    )
                }
                _ => st.size.to_string(),
            };
            let name = match target {
                Some(t) => format!("{name} -> {t}"),
                None => name.clone(),
            };
            [
                st.nlink.to_string(),
                user_name(st.uid),
                group_name(st.gid),
                size,
                ls_time(st.mtime, now),
                name,
            ]
        })
        .collect();
    let width = |k: usize| cells.iter().map(|c| c[k].len()).max().unwrap_or(0);
    let (w0, w1, w2, w3) = (width(0), width(1), width(2), width(3));
    for ((_, st, _), c) in rows.iter().zip(&cells) {
        out!(
            "{} {:>w0$} {:<w1$} {:<w2$} {:>w3$} {} {}",
            mode_string(st.kind, st.mode),
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5]
        );
    }
}

/// `drwxr-xr-x`, with the setuid, setgid and sticky bits as `ls` shows them.
fn mode_string(kind: Kind, mode: u32) -> String {
    let t = match kind {
        Kind::Dir => 'd',
        Kind::File => '-',
        Kind::Symlink => 'l',
        Kind::Fifo => 'p',
        Kind::Socket => 's',
        Kind::CharDev(_) => 'c',
        Kind::BlockDev(_) => 'b',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    for (shift, special, set, unset) in [
        (6, 0o4000, 's', 'S'),
        (3, 0o2000, 's', 'S'),
        (0, 0o1000, 't', 'T'),
    ] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, mode & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// `Nov 24 09:13` within six months of now, `Nov 24  2025` otherwise, in local time.
fn ls_time(t: proto::md::Time, now: jiff::Timestamp) -> String {
    let Ok(ts) = jiff::Timestamp::new(t.sec, t.nsec as i32) else {
        return t.sec.to_string();
    };
    let half_year = jiff::SignedDuration::from_secs(183 * 24 * 3600);
    let recent =
        ts <= now + jiff::SignedDuration::from_secs(3600) && now.duration_since(ts) < half_year;
    let zoned = ts.to_zoned(jiff::tz::TimeZone::system());
    if recent {
        zoned.strftime("%b %e %H:%M").to_string()
    } else {
        zoned.strftime("%b %e  %Y").to_string()
    }
}

/// `2026-11-24 09:13:02.123456789 +0000`, as `stat` prints times.
fn stat_time(t: proto::md::Time) -> String {
    match jiff::Timestamp::new(t.sec, t.nsec as i32) {
        Ok(ts) => ts
            .to_zoned(jiff::tz::TimeZone::system())
            .strftime("%Y-%m-%d %H:%M:%S.%f %z")
            .to_string(),
        Err(_) => format!("{}.{:09}", t.sec, t.nsec),
    }
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

fn group_name(gid: u32) -> String {
    match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(g)) => g.name,
        _ => gid.to_string(),
    }
}

/// `stat`: coreutils' layout, with the file's FID where `stat` shows device and inode.
async fn stat(client: &Client, path: &str) -> Result<()> {
    let i = client
        .lstat(path)
        .await
        .map_err(posix("cannot stat", path, 1))?;
    let kind = match i.kind {
        Kind::File if i.size == 0 => "regular empty file",
        Kind::File => "regular file",
        Kind::Dir => "directory",
        Kind::Symlink => "symbolic link",
        Kind::Fifo => "fifo",
        Kind::Socket => "socket",
        Kind::CharDev(_) => "character special file",
        Kind::BlockDev(_) => "block special file",
    };
    match link_target(client, path, &i).await {
        Some(t) => out!("  File: {path} -> {t}"),
        None => out!("  File: {path}"),
    }
    out!("  Size: {:<15} Links: {:<6} {kind}", i.size, i.nlink);
    out!("   FID: {}", i.fid);
    out!(
        "Access: ({:04o}/{})  Uid: ({:5}/{:>8})   Gid: ({:5}/{:>8})",
        i.mode & 0o7777,
        mode_string(i.kind, i.mode),
        i.uid,
        user_name(i.uid),
        i.gid,
        group_name(i.gid)
    );
    out!("Access: {}", stat_time(i.atime));
    out!("Modify: {}", stat_time(i.mtime));
    out!("Change: {}", stat_time(i.ctime));
    out!(" Birth: -");
    Ok(())
}

const COPY_CHUNK: usize = 16 << 20;

async fn cp(client: &Client, from: &str, to: &str) -> Result<()> {
    match (place(from), place(to)) {
        ((Place::Local, src), (Place::Lode, dst)) => {
            let mut input: Box<dyn Read> = if src == "-" {
                Box::new(std::io::stdin())
            } else {
                Box::new(std::fs::File::open(src).with_context(|| format!("opening {src}"))?)
            };
            let f = Arc::new(
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(client, dst)
                    .await
                    .map_err(posix("cannot create regular file", dst, 1))?,
            );
            // Write-behind: 16 MiB transfers, two on their way while the next is read.
            let mut w = f.writer(0, COPY_CHUNK, 2)?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = input.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                w.write(&buf[..n]).await?;
            }
            w.finish().await?;
            f.fsync().await?;
            Arc::try_unwrap(f)
                .map_err(|_| anyhow::anyhow!("a write still holds {dst}"))?
                .close()
                .await?;
        }
        ((Place::Lode, src), (Place::Local, dst)) => {
            let f = Arc::new(OpenOptions::new().open(client, src).await.map_err(posix(
                "cannot stat",
                src,
                1,
            ))?);
            let mut out: Box<dyn Write> = if dst == "-" {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(std::fs::File::create(dst).with_context(|| format!("creating {dst}"))?)
            };
            let mut r = f.reader(0, COPY_CHUNK, 4);
            while let Some(chunk) = r.next_chunk().await? {
                out.write_all(&chunk)?;
            }
            out.flush()?;
        }
        ((Place::Lode, src), (Place::Lode, dst)) => {
            let f = Arc::new(OpenOptions::new().open(client, src).await.map_err(posix(
                "cannot stat",
                src,
                1,
            ))?);
            let g = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(client, dst)
                .await
                .map_err(posix("cannot create regular file", dst, 1))?;
            let mut r = f.reader(0, COPY_CHUNK, 4);
            let mut at = 0;
            while let Some(chunk) = r.next_chunk().await? {
                g.write_at(at, &chunk).await?;
                at += chunk.len() as u64;
            }
            g.fsync().await?;
            g.close().await?;
        }
        ((Place::Local, _), (Place::Local, _)) => {
            bail!("one side of a copy must be in lode (paths without `local:`)")
        }
    }
    Ok(())
}

async fn rm(client: &Client, path: &str, recursive: bool) -> Result<()> {
    let err = || posix("cannot remove", path, 1);
    let i = client.lstat(path).await.map_err(err())?;
    if i.kind != Kind::Dir {
        return client.unlink(path).await.map_err(err());
    }
    if !recursive {
        return Err(PosixError {
            what: "cannot remove".into(),
            path: path.into(),
            errno: libc::EISDIR,
            detail: None,
            exit: 1,
        }
        .into());
    }
    for e in client.readdir(path).await.map_err(err())? {
        let child = format!(
            "{}/{}",
            path.trim_end_matches('/'),
            String::from_utf8_lossy(&e.name)
        );
        Box::pin(rm(client, &child, true)).await?;
    }
    client.rmdir(path).await.map_err(err())
}

/// `lode setdirstripe` / `lode mkdir -c`: the directory `path` striped over `count` MDTs.
async fn mkdir_striped(
    client: &Client,
    path: &str,
    count: u32,
    mdt: Option<u32>,
    hash: &str,
    what: &str,
) -> Result<()> {
    let Some(h) = proto::dirstripe::HashType::parse(hash) else {
        bail!("{what} unknown hash type '{hash}' (known: fnv_1a_64)");
    };
    if count == 0 {
        bail!("{what} the stripe count is at least 1, not 0");
    }
    client
        .mkdir_striped(path, 0o755, count, mdt, h)
        .await
        .map_err(posix("cannot create directory", path, 1))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn setstripe_parses_plain_and_progressive_layouts() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let (l, p) = parse_layout(&args("-c 4 -S 1M /f")).unwrap();
        assert_eq!(p, "/f");
        assert_eq!(l.components.len(), 1);
        assert_eq!(
            (l.components[0].stripe_count, l.components[0].stripe_size),
            (StripeCount::Count(4), 1 << 20)
        );
        let (l, _) = parse_layout(&args("-E 4M -c 1 -E 64M -c 4 -E -1 -c -1 /f")).unwrap();
        let ends: Vec<u64> = l.components.iter().map(|c| c.end).collect();
        assert_eq!(ends, vec![4 << 20, 64 << 20, EOF]);
        assert_eq!(l.components[2].stripe_count, StripeCount::All);
        assert!(
            parse_layout(&args("-S 1000 /f")).is_err(),
            "a stripe size not a multiple of 64 KiB"
        );
        assert!(parse_layout(&args("-x 3 /f")).is_err());
    }
}
