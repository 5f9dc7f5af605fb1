//! A mount's life: options checked, the FUSE session started on the runtime that serves it, and
//! taken down when asked to stop or when someone unmounts it from outside.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use client::Client;
use fuser::MountOption;

use crate::fs::LodeFs;

/// The mount options `lode mount -o` takes.
pub const OPTIONS: &str = "allow_other, allow_root, default_permissions, ro, rw";

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("unknown mount option {0:?} ({OPTIONS})")]
    UnknownOption(String),
    #[error("mounting on {path}: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot unmount {path}: {why}")]
    Unmount { path: PathBuf, why: String },
}

/// The FUSE configuration for a mount of `mds` with `opts` (comma-separated).
pub fn config(opts: Option<&str>, mds: &str) -> Result<fuser::Config, MountError> {
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
            other => return Err(MountError::UnknownOption(other.to_owned())),
        });
    }
    cfg.mount_options = out;
    Ok(cfg)
}

/// Whether `path` is a mount point now.
pub fn mounted(path: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(path) else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_string_lossy().as_ref()))
}

/// Mounts `client`'s filesystem on `mountpoint`, calls `mounted` once it is there, and serves
/// it until `stop` completes or the mount is taken away from outside (`fusermount3 -u`), then
/// unmounts. Must run on a multi-threaded runtime: the filesystem's calls are carried out on it.
pub async fn serve(
    client: Client,
    mds: &str,
    mountpoint: &Path,
    opts: Option<&str>,
    mounted_now: impl FnOnce(),
    stop: impl Future<Output = ()>,
) -> Result<(), MountError> {
    let cfg = config(opts, mds)?;
    let fs = LodeFs::new(client, tokio::runtime::Handle::current());
    let notifier = fs.notifier_slot();
    let session = fuser::spawn_mount(fs, mountpoint, &cfg).map_err(|source| MountError::Mount {
        path: mountpoint.to_owned(),
        source,
    })?;
    let _ = notifier.set(session.notifier());
    tracing::info!(mountpoint = %mountpoint.display(), %mds, "mounted");
    mounted_now();
    let unmounted = async {
        while mounted(mountpoint) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::select! {
        () = stop => tracing::info!("unmounting"),
        () = unmounted => tracing::info!("unmounted from outside"),
    }
    if !mounted(mountpoint) {
        // Already gone: nothing for the session to unmount (it would only complain).
        std::mem::forget(session);
        return Ok(());
    }
    let joined = tokio::task::spawn_blocking(move || session.umount_and_join()).await;
    let busy = match joined {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    // Busy (files open in it): detach it now; it goes when the last user lets go.
    tracing::warn!(error = %busy, "mount busy; detaching it");
    let lazy = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .status();
    if !lazy.is_ok_and(|s| s.success()) {
        return Err(MountError::Unmount {
            path: mountpoint.to_owned(),
            why: busy,
        });
    }
    Ok(())
}
