//! `lode mount` and `lode umount`.

use std::path::Path;
use std::time::{Duration, Instant};

use std::process::Command;

use anyhow::{bail, Context, Result};
use client::Client;
use mount::mounted;

/// The MDS and lode path behind `path`, if it lies inside a lode mount on this machine. The
/// mount's source names its MDS (`lode@ADDR`).
pub fn in_mount(path: &str) -> Option<(String, String)> {
    let p = Path::new(path);
    let canon = std::fs::canonicalize(p).ok().or_else(|| {
        Some(
            std::fs::canonicalize(p.parent()?)
                .ok()?
                .join(p.file_name()?),
        )
    })?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mountpoint = left.split(' ').nth(4)?;
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, r.next()?);
        let mds = source
            .strip_prefix("lode@")
            .filter(|_| fstype == "fuse" || fstype == "fuse.lode")?;
        let rel = canon.strip_prefix(mountpoint).ok()?;
        Some((mds.to_owned(), format!("/{}", rel.to_string_lossy())))
    })
}

/// The mount's metrics endpoint: its own counters and its client's calls, in one registry.
pub struct Metrics {
    mount: std::sync::Arc<mount::metrics::MountMetrics>,
    _server: daemon::metrics::MetricsServer,
}

impl Metrics {
    /// Registers the counters, has the client `cfg` describes count its calls, and serves
    /// them at `addr`.
    pub async fn start(
        addr: std::net::SocketAddr,
        cfg: &mut client::ClientConfig,
    ) -> Result<Metrics> {
        let mut registry = prometheus_client::registry::Registry::default();
        cfg.calls = Some(lnet::metrics::CallMetrics::register(&mut registry));
        let mount = mount::metrics::MountMetrics::register(&mut registry);
        let m = mount.clone();
        let server = daemon::metrics::MetricsServer::start(
            addr,
            std::sync::Arc::new(registry),
            Some(std::sync::Arc::new(move || m.refresh())),
        )
        .await?;
        Ok(Metrics {
            mount,
            _server: server,
        })
    }
}

/// Mounts in the foreground until SIGTERM or SIGINT, then unmounts.
pub async fn run(
    client: Client,
    mds: &str,
    mountpoint: &Path,
    opts: Option<&str>,
    metrics: Option<Metrics>,
) -> Result<()> {
    let stop = async {
        match daemon_signal().await {
            Ok(why) => tracing::info!(signal = why, "asked to stop"),
            Err(e) => tracing::warn!(error = %e, "cannot wait for signals; stopping"),
        }
    };
    let mounted_now = || out!("lode mounted on {} from {mds}", mountpoint.display());
    let counters = metrics.as_ref().map(|m| m.mount.clone());
    mount::serve(
        client.clone(),
        mds,
        mountpoint,
        opts,
        mounted_now,
        stop,
        counters,
    )
    .await?;
    drop(metrics);
    // Unmounted: what the MDS has not committed yet is committed before the mount leaves.
    client.close().await?;
    Ok(())
}

async fn daemon_signal() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Opens a mount's log file for appending, made with mode 0600 if missing.
pub fn open_log(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open the log file {}", path.display()))
}

/// Starts the mount as a background process and returns once it is mounted. Its log goes to
/// `log` if given, else to this process's standard error (a pipe read to its end would wait
/// for the mount to end).
pub async fn daemonize(
    mds: &str,
    auth: &crate::AuthArgs,
    mountpoint: &Path,
    opts: Option<&str>,
    metrics: Option<std::net::SocketAddr>,
    log: Option<&Path>,
) -> Result<()> {
    use std::os::unix::process::CommandExt;
    mount::config(opts, mds)?; // refuse bad options here, not in a background process
    if !mountpoint.is_dir() {
        bail!("{} is not a directory", mountpoint.display());
    }
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    // Refuse a missing key here too, not in the background.
    auth.security()?;
    cmd.args(["--mds", mds])
        .args(auth.flags())
        .arg("mount")
        .arg(mountpoint);
    if let Some(o) = opts {
        cmd.args(["-o", o]);
    }
    if let Some(addr) = metrics {
        cmd.args(["--metrics", &addr.to_string()]);
    }
    if let Some(path) = log {
        cmd.stderr(open_log(path)?);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting the mount")?;
    let see = log.map_or(String::new(), |p| format!("; its log is {}", p.display()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mounted(mountpoint) {
        if let Some(status) = child.try_wait()? {
            bail!(
                "the mount process for {} ended ({status}) before mounting{see}",
                mountpoint.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{} was not mounted within 20 s (mount process {}){see}",
                mountpoint.display(),
                child.id()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out!(
        "lode mounted on {} from {mds} (process {})",
        mountpoint.display(),
        child.id()
    );
    Ok(())
}

pub fn umount(mountpoint: &Path) -> Result<()> {
    let ok = Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
        || Command::new("umount")
            .arg(mountpoint)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
    if !ok {
        bail!("cannot unmount {}", mountpoint.display());
    }
    Ok(())
}
