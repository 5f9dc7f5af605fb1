//! `lode cluster up|status|down`: an MDS and N storage servers on loopback, as real processes,
//! with their data, logs and process ids under one directory. `up` again on the same directory
//! brings the same filesystem back.
//!
//! ```text
//! DIR/cluster.conf      mds address, OSS count, targets per OSS (written by the first `up`)
//! DIR/cluster.key       the cluster key the servers authenticate with (mode 0600)
//! DIR/client.key        its client key, for clients (`export LODE_KEY=DIR/client.key`)
//! DIR/cluster.pids      one line per running process: role, pid
//! DIR/mds/  DIR/oss<i>/ their data (the MDS's formatted by the first `up`)
//! DIR/mdt<k>/           with --mds N: MDT k's MDS's data (formatted into MDT0's filesystem)
//! DIR/logs/             their logs
//! ```
//!
//! With `--netns` (root, iproute2) each server runs in a network namespace of its own with its
//! own address on a bridge (`SUBNET.1` the MDS, `SUBNET.11`... the storage servers), and this
//! host joins the bridge as `SUBNET.254`, so clients and mounts here reach the cluster as they
//! would reach other hosts. `down` removes the namespaces.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use client::Client;

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Start the cluster (or start again the servers of it that stopped) and wait until it is
    /// ready.
    Up(UpArgs),
    /// Show which processes run and the targets' state.
    Status {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Stop every process of the cluster (SIGTERM), keeping its data.
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(Args)]
pub struct UpArgs {
    /// Where the cluster keeps everything.
    #[arg(long)]
    dir: PathBuf,
    /// Storage servers (the first `up` only).
    #[arg(long, default_value_t = 4)]
    oss: u32,
    /// Metadata servers, one MDT each: MDT0's at --port, MDT k's at the port k after it (the
    /// first `up` only).
    #[arg(long = "mdts", default_value_t = 1)]
    mdts: u32,
    /// Targets per storage server (the first `up` only).
    #[arg(long, default_value_t = 1)]
    targets_per_oss: u32,
    /// The MDS's port; storage servers use the ports after it (the first `up` only).
    #[arg(long, default_value_t = 9400)]
    port: u16,
    /// Run without authentication: anyone who can reach the ports gets in (the first `up`
    /// only).
    #[arg(long)]
    no_auth: bool,
    /// Each server in a network namespace of its own, on a bridge this host joins (root and
    /// iproute2; the first `up` only).
    #[arg(long)]
    netns: bool,
    /// With --netns: the first three numbers of the bridge's /24 network.
    #[arg(long, default_value = "10.99.0", requires = "netns")]
    subnet: String,
    /// Serve each server's Prometheus metrics: the MDS's at this port of its address, storage
    /// server N's at the port N + 1 after it (the first `up` only).
    #[arg(long)]
    metrics_port: Option<u16>,
    /// How the storage servers' large reads and writes reach the disk: auto (measured per
    /// target), direct or buffered (the first `up` only; see `lode-oss --io`).
    #[arg(long, default_value = "auto", value_parser = ["auto", "direct", "buffered"])]
    oss_io: String,
}

struct Conf {
    port: u16,
    /// MDTs, each on an MDS of its own.
    mdts: u32,
    oss: u32,
    targets: u32,
    auth: bool,
    /// With namespaces: the bridge's /24 (its first three numbers).
    netns: Option<String>,
    /// Where the MDS serves its metrics; storage server N at the port N + 1 after it.
    metrics_port: Option<u16>,
    /// The storage servers' `--io`.
    oss_io: String,
}

impl Conf {
    /// The address of the MDS (`None`) or of storage server `Some(i)`.
    fn host(&self, server: Option<u32>) -> String {
        match (&self.netns, server) {
            (None, _) => "127.0.0.1".into(),
            (Some(net), None) => format!("{net}.1"),
            (Some(net), Some(i)) => format!("{net}.{}", 11 + i),
        }
    }

    fn mds_addr(&self) -> String {
        format!("{}:{}", self.host(None), self.port)
    }

    /// The `--metrics ADDR` arguments of the MDS (`None`) or storage server `Some(i)`.
    fn metrics_at(&self, server: Option<u32>) -> Vec<String> {
        let Some(base) = self.metrics_port else {
            return vec![];
        };
        let port = u32::from(base) + server.map_or(0, |i| i + 1);
        vec!["--metrics".into(), format!("{}:{port}", self.host(server))]
    }

    /// Where the server `role` (`mds`, `mdt1`, ..., `oss0`, ...) listens.
    fn addr_of(&self, role: &str) -> Option<String> {
        if role == "mds" {
            return Some(self.mds_addr());
        }
        if let Some(k) = role.strip_prefix("mdt").and_then(|k| k.parse::<u32>().ok()) {
            return (k > 0 && k < self.mdts)
                .then(|| format!("{}:{}", self.host(None), u32::from(self.port) + k));
        }
        let i: u32 = role.strip_prefix("oss")?.parse().ok()?;
        Some(format!(
            "{}:{}",
            self.host(Some(i)),
            u32::from(self.port) + 100 + i
        ))
    }
}

fn read_conf(dir: &Path) -> Option<Conf> {
    let text = std::fs::read_to_string(dir.join("cluster.conf")).ok()?;
    let get = |k: &str| -> Option<u32> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} = ")))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(Conf {
        port: u16::try_from(get("port")?).ok()?,
        mdts: get("mdts").unwrap_or(1),
        oss: get("oss")?,
        targets: get("targets_per_oss")?,
        auth: get("auth").unwrap_or(1) != 0,
        netns: text
            .lines()
            .find_map(|l| l.strip_prefix("netns = "))
            .map(|v| v.trim().to_owned()),
        metrics_port: get("metrics_port").and_then(|p| u16::try_from(p).ok()),
        oss_io: text
            .lines()
            .find_map(|l| l.strip_prefix("oss_io = "))
            .map_or_else(|| "auto".to_owned(), |v| v.trim().to_owned()),
    })
}

fn sibling(bin: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the lode binary")?;
    let path = exe
        .parent()
        .context("the lode binary's directory")?
        .join(bin);
    if !path.exists() {
        bail!(
            "{} is missing: build the workspace (cargo build --release)",
            path.display()
        );
    }
    Ok(path)
}

/// Whether `pid` runs: it exists and is not a zombie (a server that exited stays one until
/// its parent reaps it, and `kill -0` still succeeds on it).
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    // The state is the field after the command's closing parenthesis, the flags the seventh.
    // A process killed a moment ago may not show as a zombie yet, but it is exiting
    // (PF_EXITING), or the kill is still pending: it counts as gone, to be started again.
    const PF_EXITING: u64 = 0x4;
    let exiting = |stat: &str| {
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let state = fields.first().copied().unwrap_or("");
        let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
        state == "Z" || state == "X" || flags & PF_EXITING != 0
    };
    let killed = || {
        const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
            status.lines().any(|l| {
                let pending = l
                    .strip_prefix("ShdPnd:")
                    .or_else(|| l.strip_prefix("SigPnd:"));
                pending
                    .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                    .is_some_and(|m| m & SIGKILL_BIT != 0)
            })
        })
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !exiting(&stat) && !killed(),
        Err(_) => false,
    }
}

/// Waits (up to 10 s) until a stopped process has let go of what it held. A process killed
/// with SIGKILL shows as a zombie as soon as its first thread has exited, while its other
/// threads may still hold its descriptors, and with them the lock on its data directory.
async fn gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
        if threads <= 1 && !alive(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pids(dir: &Path) -> Vec<(String, i32)> {
    std::fs::read_to_string(dir.join("cluster.pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (role, pid) = l.split_once(' ')?;
            Some((role.to_owned(), pid.trim().parse().ok()?))
        })
        .collect()
}

/// Starts `bin` (in network namespace `ns` when given: `ip netns exec` becomes the server,
/// keeping its pid).
fn spawn(dir: &Path, role: &str, ns: Option<&str>, bin: &Path, args: &[String]) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs.join(format!("{role}.log")))?;
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let child = cmd
        .args(args)
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        // Its own process group: a ^C in this terminal does not stop the cluster.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(child.id() as i32)
}

pub async fn run(cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Up(a) => up(a).await,
        ClusterCmd::Status { dir } => status(&dir).await,
        ClusterCmd::Down { dir } => down(&dir),
    }
}

async fn up(a: UpArgs) -> Result<()> {
    let dir = a.dir.clone();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let recorded = pids(&dir);
    let running: Vec<(String, i32)> = recorded
        .iter()
        .filter(|(_, p)| alive(*p))
        .cloned()
        .collect();
    let conf = match read_conf(&dir) {
        Some(c) => c,
        None if running.is_empty() => {
            let conf = new_conf(&dir, &a)?;
            // The first `up` makes the filesystem, as an operator does once with
            // `lode-mds format`; later ones serve what it made, and an MDS directory gone
            // missing is refused rather than formatted again.
            let uuid = format_mds(&dir.join("mds"))?;
            for k in 1..conf.mdts {
                format_mdt(&dir.join(format!("mdt{k}")), k, &uuid)?;
            }
            conf
        }
        None => bail!("{} has running servers but no cluster.conf", dir.display()),
    };
    let mds_addr = conf.mds_addr();
    let roles = std::iter::once("mds".to_owned())
        .chain((1..conf.mdts).map(|k| format!("mdt{k}")))
        .chain((0..conf.oss).map(|i| format!("oss{i}")));
    let missing: Vec<String> = roles
        .filter(|r| !running.iter().any(|(role, _)| role == r))
        .collect();
    if missing.is_empty() {
        bail!(
            "a cluster already runs in {} (lode cluster down --dir {0})",
            dir.display()
        );
    }
    // A server started again waits until the one before it has let go of its data directory
    // and its port.
    for (role, pid) in recorded.iter().filter(|(r, _)| missing.contains(r)) {
        gone(*pid).await;
        if !running.is_empty() {
            out!("lode cluster up: starting {role} again (pid {pid} stopped)");
        }
    }
    // With the rest of the cluster running, only what stopped is started again, in the
    // network namespaces it had.
    if running.is_empty() {
        match &conf.netns {
            Some(net) => netns::create(&dir, net, conf.oss)?,
            None => ports_free(&conf)?,
        }
    }
    if conf.auth {
        make_keys(&dir)?;
    }
    let started = start_servers(&dir, &conf, &mds_addr, &missing, &running)?;
    let want = conf.oss * conf.targets;
    wait_ready(&dir, &started, &missing, &mds_addr, want, &conf).await?;
    let mdts = if conf.mdts > 1 {
        format!(" (MDT0; {} MDTs in all)", conf.mdts)
    } else {
        String::new()
    };
    out!(
        "lode cluster up: MDS at {mds_addr}{mdts}, {want} targets on {} storage servers, data in {}",
        conf.oss,
        dir.display()
    );
    if conf.auth {
        out!(
            "  export LODE_MDS={mds_addr} LODE_KEY={}",
            dir.join("client.key").display()
        );
    } else {
        out!("  export LODE_MDS={mds_addr}   # authentication is OFF: --no-auth on clients");
    }
    out!("  lode mkdir /data && lode setstripe -c -1 -S 4M /data && lode cp local:/etc/hosts /data/hosts");
    out!(
        "  lode getstripe /data/hosts && lode df -h && lode cluster down --dir {}",
        dir.display()
    );
    Ok(())
}

/// `lode-mds format` on the MDS's data directory, unless it holds a filesystem already (a
/// directory from before `cluster.conf` recorded it); returns the filesystem's uuid, as the
/// format printed it.
fn format_mds(mds_dir: &Path) -> Result<String> {
    if mds_dir.join("filesystem").exists() {
        return Ok(String::new());
    }
    let out = Command::new(sibling("lode-mds")?)
        .arg("format")
        .arg("--data-dir")
        .arg(mds_dir)
        .stdin(Stdio::null())
        .output()
        .context("running lode-mds format")?;
    if !out.status.success() {
        bail!(
            "lode-mds format --data-dir {}: {}",
            mds_dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // "formatted filesystem NAME (UUID) MDT0 in DIR"
    let printed = String::from_utf8_lossy(&out.stdout);
    Ok(printed
        .split(['(', ')'])
        .nth(1)
        .unwrap_or_default()
        .to_owned())
}

/// `lode-mds format --mdt-index k --fs-uuid UUID` on MDT `k`'s data directory.
fn format_mdt(dir: &Path, k: u32, uuid: &str) -> Result<()> {
    if uuid.is_empty() {
        bail!("the filesystem's uuid is unknown: MDT{k} cannot be formatted into it");
    }
    let out = Command::new(sibling("lode-mds")?)
        .args(["format", "--mdt-index", &k.to_string(), "--fs-uuid", uuid])
        .arg("--data-dir")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .context("running lode-mds format")?;
    if !out.status.success() {
        bail!(
            "lode-mds format --mdt-index {k} --data-dir {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The cluster key and its client key, made once.
fn make_keys(dir: &Path) -> Result<()> {
    use lnet::auth::KeyFile;
    let cluster = dir.join("cluster.key");
    if !cluster.exists() {
        KeyFile::generate()?.save_new(&cluster)?;
    }
    let client = dir.join("client.key");
    if !client.exists() {
        KeyFile::load(&cluster)?.client_key().save_new(&client)?;
    }
    Ok(())
}

/// What the tools of this cluster authenticate with.
fn security(dir: &Path, conf: &Conf) -> Result<lnet::auth::Security> {
    if !conf.auth {
        return Ok(lnet::auth::Security::Off);
    }
    Ok(lnet::auth::client_security(
        Some(&dir.join("cluster.key")),
        false,
        false,
    )?)
}

/// A new cluster's settings, written to `cluster.conf` so that a later `up` reuses them.
fn new_conf(dir: &Path, a: &UpArgs) -> Result<Conf> {
    if a.oss == 0 || a.oss > 64 || a.targets_per_oss == 0 || a.targets_per_oss > 64 {
        bail!("--oss and --targets-per-oss must be 1..=64");
    }
    if a.mdts == 0 || a.mdts > 16 {
        bail!("--mdts must be 1..=16");
    }
    if a.mdts > 1 && a.netns {
        bail!("--netns runs one MDS; several (--mdts) run on loopback");
    }
    if a.netns {
        netns::check_subnet(&a.subnet)?;
        if a.oss > 200 {
            bail!("--netns holds at most 200 storage servers");
        }
    }
    let c = Conf {
        port: a.port,
        mdts: a.mdts,
        oss: a.oss,
        targets: a.targets_per_oss,
        auth: !a.no_auth,
        netns: a.netns.then(|| a.subnet.clone()),
        metrics_port: a.metrics_port,
        oss_io: a.oss_io.clone(),
    };
    if a.metrics_port
        .is_some_and(|p| u32::from(p) + a.oss > u32::from(u16::MAX))
    {
        bail!("--metrics-port leaves no port for the last storage server");
    }
    let mut text = format!(
        "port = {}\nmdts = {}\noss = {}\ntargets_per_oss = {}\nauth = {}\n",
        c.port,
        c.mdts,
        c.oss,
        c.targets,
        u8::from(c.auth)
    );
    if let Some(net) = &c.netns {
        text.push_str(&format!("netns = {net}\n"));
    }
    if let Some(p) = c.metrics_port {
        text.push_str(&format!("metrics_port = {p}\n"));
    }
    text.push_str(&format!("oss_io = {}\n", c.oss_io));
    std::fs::write(dir.join("cluster.conf"), text)?;
    Ok(c)
}

/// Refuses ports in use: another cluster (or anything) there would answer in our servers' place.
fn ports_free(conf: &Conf) -> Result<()> {
    for port in (0..conf.mdts)
        .map(|k| u32::from(conf.port) + k)
        .chain((0..conf.oss).map(|i| u32::from(conf.port) + 100 + i))
    {
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_err() {
            bail!(
                "port {port} on 127.0.0.1 is in use: another cluster is running there \
                 (lode cluster status/down --dir ...), or choose --port"
            );
        }
    }
    Ok(())
}

/// Starts the servers named in `missing` (the MDS is `mds`, storage servers `oss0`, `oss1`, ...),
/// recording each one's pid as it starts beside those of `running`. Returns every server's.
fn start_servers(
    dir: &Path,
    conf: &Conf,
    mds_addr: &str,
    missing: &[String],
    running: &[(String, i32)],
) -> Result<Vec<(String, i32)>> {
    let d = |p: &str| dir.join(p).to_string_lossy().into_owned();
    let mut started: Vec<(String, i32)> = running.to_vec();
    let wanted = |role: &str| missing.iter().any(|m| m == role);
    let auth: Vec<String> = if conf.auth {
        vec!["--key".into(), d("cluster.key")]
    } else {
        vec!["--no-auth".into()]
    };
    // A cluster on one machine trusts root on that machine (its bridge, with namespaces).
    let trust = match &conf.netns {
        Some(net) => format!("{net}.0/24"),
        None => "127.0.0.0/8".into(),
    };
    let names = conf.netns.as_ref().map(|_| netns::Names::of(dir));
    let mds_args: Vec<String> = [
        "--data-dir".into(),
        d("mds"),
        "--listen".into(),
        mds_addr.into(),
        "--trust".into(),
        trust,
    ]
    .into_iter()
    .chain(auth.iter().cloned())
    .chain(conf.metrics_at(None))
    .collect();
    if wanted("mds") {
        started.push((
            "mds".to_owned(),
            spawn(
                dir,
                "mds",
                names.as_ref().map(|n| n.ns("mds")).as_deref(),
                &sibling("lode-mds")?,
                &mds_args,
            )?,
        ));
        write_pids(dir, &started)?;
    }
    for k in 1..conf.mdts {
        let role = format!("mdt{k}");
        let Some(listen) = conf.addr_of(&role).filter(|_| wanted(&role)) else {
            continue;
        };
        let args: Vec<String> = [
            "--data-dir".into(),
            d(&role),
            "--listen".into(),
            listen,
            "--mdt0".into(),
            mds_addr.into(),
            "--trust".into(),
            "127.0.0.0/8".into(),
        ]
        .into_iter()
        .chain(auth.iter().cloned())
        .collect();
        started.push((
            role.clone(),
            spawn(dir, &role, None, &sibling("lode-mds")?, &args)?,
        ));
        write_pids(dir, &started)?;
    }
    for i in 0..conf.oss {
        let role = format!("oss{i}");
        let Some(listen) = conf.addr_of(&role).filter(|_| wanted(&role)) else {
            continue;
        };
        let args: Vec<String> = [
            "--data-dir".into(),
            d(&role),
            "--mds".into(),
            mds_addr.into(),
            "--listen".into(),
            listen,
            "--targets".into(),
            conf.targets.to_string(),
            "--io".into(),
            conf.oss_io.clone(),
        ]
        .into_iter()
        .chain(auth.iter().cloned())
        .chain(conf.metrics_at(Some(i)))
        .collect();
        started.push((
            role.clone(),
            spawn(
                dir,
                &role,
                names.as_ref().map(|n| n.ns(&role)).as_deref(),
                &sibling("lode-oss")?,
                &args,
            )?,
        ));
        write_pids(dir, &started)?;
    }
    Ok(started)
}

fn write_pids(dir: &Path, started: &[(String, i32)]) -> Result<()> {
    let mut started = started.to_vec();
    // The MDS first, then the storage servers in order.
    started.sort_by_key(|(r, _)| (r != "mds", r.len(), r.clone()));
    let text: String = started.iter().map(|(r, p)| format!("{r} {p}\n")).collect();
    Ok(std::fs::write(dir.join("cluster.pids"), text)?)
}

/// Waits until a new file can use every target: up, and taken into service by the allocator.
async fn wait_ready(
    dir: &Path,
    started: &[(String, i32)],
    fresh: &[String],
    mds_addr: &str,
    want: u32,
    conf: &Conf,
) -> Result<()> {
    let cfg = client::ClientConfig {
        security: Some(security(dir, conf)?),
        ..quick()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((role, _)) = started.iter().find(|(_, p)| !alive(*p)) {
            let log = dir.join("logs").join(format!("{role}.log"));
            // Its last words, which say why (the whole log stays in the file).
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let last = lines[lines.len().saturating_sub(3)..].join("\n  ");
            bail!(
                "{role} exited while starting; see {}:\n  {last}",
                log.display()
            );
        }
        let mut why = "the MDS does not answer".to_owned();
        // A server started again listens before it is counted: until then the MDS may still
        // list the targets of the one that stopped as up.
        let deaf = fresh.iter().find(|role| {
            conf.addr_of(role)
                .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
                .is_some_and(|a| {
                    std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_err()
                })
        });
        if let Some(role) = deaf {
            why = format!("{role} does not listen yet");
        } else if let Ok(c) = Client::connect_with(mds_addr, cfg.clone()).await {
            let mdts_up = match c.mdts().await {
                Ok(m) => m.iter().filter(|m| m.up).count() as u32 + 1,
                Err(_) => 0,
            };
            match c.can_stripe_over(want).await {
                Ok(true) if mdts_up < conf.mdts => {
                    why = format!("{mdts_up} of {} MDTs are up", conf.mdts);
                }
                Ok(true) => return Ok(()),
                Ok(false) => {
                    why = match c.statfs().await {
                        Ok(s) if s.targets_up < want => {
                            format!("{} of {want} targets are up", s.targets_up)
                        }
                        // Targets with 1% free or less take no new stripes.
                        Ok(s) if s.free.saturating_mul(100) <= s.total => format!(
                            "the disk holding {} is full ({} of {} bytes free): targets \
                             with 1% free or less take no new files",
                            dir.display(),
                            s.free,
                            s.total
                        ),
                        _ => "not every target takes new stripes yet".to_owned(),
                    }
                }
                Err(e) => why = format!("the target list could not be read: {e}"),
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the cluster was not ready within 60 s: {why}; see {}",
                dir.join("logs").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A probe's client: gives up quickly, and, like any one-shot command's, has its changes
/// answered once durable and holds no leases. A client that leaves without giving its leases
/// back holds up the next change to what it cached until its lease term runs out.
fn quick() -> client::ClientConfig {
    client::ClientConfig {
        retry_for: Duration::from_millis(200),
        commit_behind: false,
        ..Default::default()
    }
}

async fn status(dir: &Path) -> Result<()> {
    let procs = pids(dir);
    if procs.is_empty() {
        out!("no cluster has run in {}", dir.display());
        return Ok(());
    }
    for (role, pid) in &procs {
        out!(
            "{role:<6} pid {pid:<8} {}",
            if alive(*pid) { "running" } else { "stopped" }
        );
    }
    if let Some(conf) = read_conf(dir) {
        let addr = conf.mds_addr();
        let cfg = client::ClientConfig {
            security: Some(security(dir, &conf)?),
            ..quick()
        };
        match Client::connect_with(&addr, cfg).await {
            Ok(c) => {
                for m in c.mdts().await? {
                    out!(
                        "MDT{:<4}   on {:<22} {}",
                        m.index,
                        m.nid.to_string(),
                        if m.up { "up" } else { "down" }
                    );
                }
                for t in c.targets().await? {
                    out!(
                        "target {:<4} on {:<22} {:>10} free of {:>10} {}",
                        t.index,
                        t.oss.to_string(),
                        crate::human(t.free),
                        crate::human(t.total),
                        match (t.up, t.takes_stripes) {
                            (false, _) => "down",
                            (true, false) => "up, taking no new files",
                            (true, true) => "up",
                        }
                    );
                }
            }
            Err(e) => out!("MDS at {addr}: {e}"),
        }
    }
    Ok(())
}

fn down(dir: &Path) -> Result<()> {
    let procs = pids(dir);
    // Storage servers first, then the MDS.
    for (role, pid) in procs.iter().rev() {
        if alive(*pid) {
            // SAFETY: SIGTERM to a process this cluster started.
            unsafe { libc::kill(*pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while alive(*pid) && Instant::now() < deadline {
                reap(*pid);
                std::thread::sleep(Duration::from_millis(20));
            }
            if alive(*pid) {
                bail!("{role} (pid {pid}) did not stop within 20 s");
            }
        }
    }
    let _ = std::fs::remove_file(dir.join("cluster.pids"));
    if read_conf(dir).is_some_and(|c| c.netns.is_some()) {
        netns::remove(dir);
    }
    out!(
        "lode cluster down: {} processes stopped; data kept in {}",
        procs.len(),
        dir.display()
    );
    Ok(())
}

/// Collects a child that has exited (when `down` runs in the process that started it).
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG on a pid; fails harmlessly if it is not our child.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}

/// The network namespaces of a `--netns` cluster: a bridge in a namespace of its own, one
/// namespace per server with a veth pair to the bridge, and one veth from this host.
mod netns {
    use std::path::Path;
    use std::process::Command;

    use anyhow::{bail, Context, Result};

    /// The names of one cluster's namespaces and links, from a tag of its directory (links
    /// are at most 15 bytes).
    pub struct Names {
        tag: String,
    }

    impl Names {
        pub fn of(dir: &Path) -> Names {
            let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            let crc = crc32c::crc32c(canon.to_string_lossy().as_bytes());
            Names {
                tag: format!("{:06x}", crc & 0xff_ffff),
            }
        }

        pub fn ns(&self, role: &str) -> String {
            format!("lode{}-{role}", self.tag)
        }

        /// The host's link to the bridge.
        fn host_link(&self) -> String {
            format!("lh{}", self.tag)
        }

        /// The two ends of server `i`'s link.
        fn link(&self, i: usize) -> (String, String) {
            (format!("lv{}{i}", self.tag), format!("lb{}{i}", self.tag))
        }
    }

    pub fn check_subnet(net: &str) -> Result<()> {
        let parts: Vec<&str> = net.split('.').collect();
        if parts.len() != 3 || parts.iter().any(|p| p.parse::<u8>().is_err()) {
            bail!("--subnet is three numbers 0-255 (10.99.0), not {net:?}");
        }
        Ok(())
    }

    fn ip(args: &[&str]) -> Result<()> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .context("running ip (iproute2): --netns needs it")?;
        if !out.status.success() {
            bail!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Makes the namespaces and links (again, after a `down`); removes them on failure.
    pub fn create(dir: &Path, net: &str, oss: u32) -> Result<()> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("--netns needs root (it makes network namespaces)");
        }
        remove(dir);
        // Another cluster (or anything) on this /24 would take the host's traffic for it.
        let addrs = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if addrs.contains(&format!(" inet {net}.")) {
            bail!("{net}.0/24 is in use on this host: choose another --subnet");
        }
        let made = build(dir, net, oss);
        if made.is_err() {
            remove(dir);
        }
        made
    }

    fn build(dir: &Path, net: &str, oss: u32) -> Result<()> {
        let n = Names::of(dir);
        let br = n.ns("br");
        ip(&["netns", "add", &br])?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        let roles: Vec<String> = std::iter::once("mds".to_owned())
            .chain((0..oss).map(|i| format!("oss{i}")))
            .collect();
        for (i, role) in roles.iter().enumerate() {
            let ns = n.ns(role);
            let (inside, outside) = n.link(i);
            let host = if i == 0 { 1 } else { 10 + i };
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &inside, "type", "veth", "peer", "name", &outside,
            ])?;
            ip(&["link", "set", &inside, "netns", &ns])?;
            ip(&["link", "set", &outside, "netns", &br])?;
            ip(&["-n", &br, "link", "set", &outside, "master", "br0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &ns, "link", "set", &inside, "name", "eth0"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{net}.{host}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        let (link, peer) = (n.host_link(), format!("{}b", n.host_link()));
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "netns", &br])?;
        ip(&["-n", &br, "link", "set", &peer, "master", "br0", "up"])?;
        ip(&["addr", "add", &format!("{net}.254/24"), "dev", &link])?;
        ip(&["link", "set", &link, "up"])?;
        Ok(())
    }

    /// Removes whatever exists of them: the bridge's namespace takes the links with it.
    pub fn remove(dir: &Path) {
        let n = Names::of(dir);
        let _ = ip(&["link", "del", &n.host_link()]);
        let list = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let prefix = format!("lode{}-", n.tag);
        for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if ns.starts_with(&prefix) {
                let _ = ip(&["netns", "del", ns]);
            }
        }
    }
}
