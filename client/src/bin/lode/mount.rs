//! `lode mount` and `lode umount`.

use std::path::Path;
use std::time::{Duration, Instant};

use std::process::Command;

use anyhow::{bail, Context, Result};
use client::fuse::LodeFs;
use client::Client;
use fuser::MountOption;

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

fn config(opts: Option<&str>, mds: &str) -> Result<fuser::Config> {
    let mut cfg = fuser::Config::default();
    cfg.n_threads = Some(4);
    let mut out = vec![
        MountOption::FSName(format!("lode@{mds}")),
        MountOption::Subtype("lode".into()),
    ];
    for o in opts.unwrap_or("").split(',').filter(|o| !o.is_empty()) {
        out.push(match o {
            "allow_other" => {
                cfg.acl = fuser::SessionACL::All;
                continue;
            }
            "allow_root" => {
                cfg.acl = fuser::SessionACL::RootAndOwner;
                continue;
            }
            "default_permissions" => MountOption::DefaultPermissions,
            "ro" => MountOption::RO,
            "rw" => MountOption::RW,
            other => bail!("unknown mount option {other:?} (allow_other, allow_root, default_permissions, ro, rw)"),
        });
    }
    cfg.mount_options = out;
    Ok(cfg)
}

/// Whether `path` is a mount point now.
fn mounted(path: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(path) else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_string_lossy().as_ref()))
}

/// Mounts in the foreground until SIGTERM or SIGINT, then unmounts.
pub async fn run(client: Client, mds: &str, mountpoint: &Path, opts: Option<&str>) -> Result<()> {
    let cfg = config(opts, mds)?;
    let fs = LodeFs::new(client, tokio::runtime::Handle::current());
    let notifier = fs.notifier_slot();
    let session = fuser::spawn_mount(fs, mountpoint, &cfg)
        .with_context(|| format!("mounting on {}", mountpoint.display()))?;
    let _ = notifier.set(session.notifier());
    println!("lode mounted on {} from {mds}", mountpoint.display());
    // Until asked to stop, or until someone unmounts it (lode umount, fusermount3 -u).
    let unmounted = async {
        while mounted(mountpoint) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::select! {
        why = daemon_signal() => tracing::info!(signal = why?, "unmounting"),
        () = unmounted => tracing::info!("unmounted from outside"),
    }
    if !mounted(mountpoint) {
        // Already gone: nothing for the session to unmount (it would only complain).
        std::mem::forget(session);
        return Ok(());
    }
    {
        if let Err(e) = tokio::task::spawn_blocking(move || session.umount_and_join()).await? {
            // Busy (files open in it): detach it now; it goes when the last user lets go.
            tracing::warn!(error = %e, "mount busy; detaching it");
            let lazy = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(mountpoint)
                .status();
            if !lazy.is_ok_and(|s| s.success()) {
                bail!("cannot unmount {}: {e}", mountpoint.display());
            }
        }
    }
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

/// Starts the mount as a background process and returns once it is mounted.
pub async fn daemonize(mds: &str, mountpoint: &Path, opts: Option<&str>) -> Result<()> {
    use std::os::unix::process::CommandExt;
    config(opts, mds)?; // refuse bad options here, not in a background process
    if !mountpoint.is_dir() {
        bail!("{} is not a directory", mountpoint.display());
    }
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(["--mds", mds, "mount"]).arg(mountpoint);
    if let Some(o) = opts {
        cmd.args(["-o", o]);
    }
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting the mount")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mounted(mountpoint) {
        if Instant::now() > deadline {
            bail!(
                "{} was not mounted within 20 s (mount process {})",
                mountpoint.display(),
                child.id()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
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
