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
pub const OPTIONS: &str =
    "allow_other, allow_root, no_allow_other, default_permissions, no_default_permissions, ro, rw, readahead_kb=N, \
     readahead_memory_mb=N, writeback, no_writeback, uring, no_uring, hybrid, no_hybrid, \
     hybrid_min_mb=N";

/// The kernel's readahead for the mount unless `-o readahead_kb=N` says otherwise: enough to
/// keep every stripe of a file busy from the page cache's sequential reads.
pub const READAHEAD_KB: u32 = 16 << 10;

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

/// The kernel readahead `opts` asks for (`readahead_kb=N`), in KiB.
pub fn readahead_kb(opts: Option<&str>) -> Result<u32, MountError> {
    let mut kb = READAHEAD_KB;
    for o in opts.unwrap_or("").split(',') {
        if let Some(v) = o.strip_prefix("readahead_kb=") {
            kb = v
                .parse()
                .ok()
                .filter(|k| *k <= 1 << 20)
                .ok_or_else(|| MountError::UnknownOption(o.to_owned()))?;
        }
    }
    Ok(kb)
}

/// What the daemon's readahead windows may hold together (`readahead_memory_mb=N`), in bytes.
pub fn readahead_memory(opts: Option<&str>) -> Result<u64, MountError> {
    let mut bytes = crate::stream::READAHEAD_MEMORY;
    for o in opts.unwrap_or("").split(',') {
        if let Some(v) = o.strip_prefix("readahead_memory_mb=") {
            bytes = v
                .parse::<u64>()
                .ok()
                .filter(|m| (1..=1 << 20).contains(m))
                .ok_or_else(|| MountError::UnknownOption(o.to_owned()))?
                << 20;
        }
    }
    Ok(bytes)
}

/// Sets the kernel's readahead for the mount at `mountpoint` (its backing device's
/// `read_ahead_kb`): FUSE starts a mount with 128 KiB, so the page cache would ask for a file
/// 128 KiB at a time. Needs root; without it the mount works with the kernel's default.
fn set_readahead(mountpoint: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let dev = match std::fs::metadata(mountpoint) {
        Ok(m) => m.dev(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot set the mount's readahead");
            return;
        }
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => tracing::debug!(%path, kb, "readahead set"),
        Err(e) => {
            tracing::warn!(%path, error = %e, "cannot set the mount's readahead; sequential buffered reads will be slower")
        }
    }
}

/// Whether `opts` turn the kernel's write-back cache on (`writeback`; off by default, since the
/// kernel then trusts its own size and mtime of a cached file over the MDS's, and would not see
/// another node's appends until the file leaves its cache).
pub fn writeback(opts: Option<&str>) -> bool {
    opts.unwrap_or("").split(',').fold(false, |on, o| match o {
        "writeback" => true,
        "no_writeback" => false,
        _ => on,
    })
}

/// Hybrid I/O: which buffered handles bypass the kernel's page cache, as O_DIRECT ones do
/// (Lustre turns large buffered I/O into direct I/O; FUSE decides per handle, at its open). On
/// by default (`hybrid`, off with `no_hybrid`, and off under the write-back cache): write-only
/// handles, files created by their open, and files of at least `min_size` bytes
/// (`hybrid_min_mb=N`, 8 MiB unless said) read and write past the page cache, through the
/// daemon's readahead and write-behind; smaller files opened to be read keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hybrid {
    pub min_size: u64,
}

/// The size from which a file's handles bypass the page cache under hybrid I/O.
pub const HYBRID_MIN_SIZE: u64 = 8 << 20;

/// The hybrid I/O `opts` ask for (`None`: off).
pub fn hybrid(opts: Option<&str>) -> Result<Option<Hybrid>, MountError> {
    let mut on = true;
    let mut min_size = HYBRID_MIN_SIZE;
    for o in opts.unwrap_or("").split(',') {
        match o {
            "hybrid" => on = true,
            "no_hybrid" => on = false,
            o => {
                if let Some(v) = o.strip_prefix("hybrid_min_mb=") {
                    min_size = v
                        .parse::<u64>()
                        .ok()
                        .filter(|m| *m <= 1 << 30)
                        .ok_or_else(|| MountError::UnknownOption(o.to_owned()))?
                        << 20;
                }
            }
        }
    }
    Ok(on.then_some(Hybrid { min_size }))
}

/// Whether `opts` leave the kernel checking permissions (`default_permissions`, the default;
/// `no_default_permissions` leaves every check to the daemon and the MDS, which then never see
/// the lookups the kernel answers from its cache: a name cached for one user is found by
/// another who may not search its directory).
pub fn kernel_checks(opts: Option<&str>) -> bool {
    opts.unwrap_or("").split(',').fold(true, |on, o| match o {
        "default_permissions" => true,
        "no_default_permissions" => false,
        _ => on,
    })
}

/// Whether `opts` leave FUSE over io_uring on (`uring`, the default; `no_uring` keeps every
/// request on /dev/fuse).
pub fn uring(opts: Option<&str>) -> bool {
    opts.unwrap_or("").split(',').fold(true, |on, o| match o {
        "uring" => true,
        "no_uring" => false,
        _ => on,
    })
}

/// The fuse module's switch that lets daemons ask for FUSE over io_uring (off by default in
/// the kernels that have it). It only allows the rings: a daemon still asks for them at INIT,
/// so other FUSE filesystems are unchanged. Turned on when it is off and this process may
/// (root), and said so in the log; without it the mount serves over /dev/fuse.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

fn allow_uring() {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if v.trim() == "Y" => {}
        Ok(_) => match std::fs::write(ENABLE_URING, "Y") {
            Ok(()) => tracing::info!(param = ENABLE_URING, "turned on FUSE over io_uring"),
            Err(e) => {
                tracing::info!(param = ENABLE_URING, error = %e, "cannot turn on FUSE over io_uring; serving over /dev/fuse")
            }
        },
        // A kernel without FUSE rings.
        Err(_) => {}
    }
}

/// The FUSE configuration for a mount of `mds` with `opts` (comma-separated).
pub fn config(opts: Option<&str>, mds: &str) -> Result<fuser::Config, MountError> {
    let mut cfg = fuser::Config::default();
    cfg.n_threads = Some(4);
    // Mounted by root, the filesystem serves every user of the node, as a kernel filesystem
    // does (the kernel checks each caller's access: `default_permissions`); `no_allow_other`
    // keeps it to root. Others mount for themselves alone unless they ask.
    cfg.acl = if nix::unistd::geteuid().is_root() {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
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
            "no_allow_other" => {
                cfg.acl = fuser::SessionACL::Owner;
                continue;
            }
            "ro" => MountOption::RO,
            "rw" => MountOption::RW,
            "default_permissions"
            | "no_default_permissions"
            | "writeback"
            | "no_writeback"
            | "uring"
            | "no_uring"
            | "hybrid"
            | "no_hybrid" => continue,
            o if o.starts_with("readahead_kb=")
                || o.starts_with("readahead_memory_mb=")
                || o.starts_with("hybrid_min_mb=") =>
            {
                continue
            }
            other => return Err(MountError::UnknownOption(other.to_owned())),
        });
    }
    if kernel_checks(opts) {
        out.push(MountOption::DefaultPermissions);
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
/// unmounts; its work is counted in `metrics` when given. Must run on a multi-threaded runtime: the filesystem's calls are carried out on it.
pub async fn serve(
    client: Client,
    mds: &str,
    mountpoint: &Path,
    opts: Option<&str>,
    mounted_now: impl FnOnce(),
    stop: impl Future<Output = ()>,
    metrics: Option<std::sync::Arc<crate::metrics::MountMetrics>>,
) -> Result<(), MountError> {
    let cfg = config(opts, mds)?;
    let readahead = readahead_kb(opts)?;
    let fs = LodeFs::new(
        client,
        tokio::runtime::Handle::current(),
        writeback(opts),
        readahead_memory(opts)?,
    )
    .with_uring(uring(opts))
    .with_hybrid(hybrid(opts)?)
    .with_kernel_checks(kernel_checks(opts))
    .with_metrics(metrics);
    if uring(opts) {
        allow_uring();
    }
    if !kernel_checks(opts) {
        tracing::warn!(
            "mounted with no_default_permissions: the kernel checks no permissions, and names it \
             caches are found without a check of their directories' search permission"
        );
    }
    let notifier = fs.notifier_slot();
    let releasing = fs.releasing();
    let session = fuser::spawn_mount(fs, mountpoint, &cfg).map_err(|source| MountError::Mount {
        path: mountpoint.to_owned(),
        source,
    })?;
    let _ = notifier.set(session.notifier());
    set_readahead(mountpoint, readahead);
    tracing::info!(mountpoint = %mountpoint.display(), %mds, "mounted");
    mounted_now();
    // The session ends when the kernel ends its connection: at an unmount from outside, or at
    // a lazy one once no file is left open in it. Another mount may be made on the same
    // directory meanwhile (with the same device number): that one is not this one.
    let unmounted = async {
        while !session.guard.is_finished() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::select! {
        () = stop => tracing::info!("unmounting"),
        () = unmounted => tracing::info!("unmounted from outside"),
    }
    if session.guard.is_finished() {
        // Already gone: nothing for the session to unmount (it would only complain).
        std::mem::forget(session);
        releasing.idle().await;
        return Ok(());
    }
    let joined = tokio::task::spawn_blocking(move || session.umount_and_join()).await;
    // Files released are closed before the client leaves.
    releasing.idle().await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use fuser::SessionACL;

    #[test]
    fn a_mount_by_root_serves_every_user_unless_told_otherwise() {
        let acl = |o: Option<&str>| config(o, "127.0.0.1:9400").unwrap().acl;
        let root = nix::unistd::geteuid().is_root();
        assert_eq!(
            acl(None),
            if root {
                SessionACL::All
            } else {
                SessionACL::Owner
            }
        );
        assert_eq!(acl(Some("ro,no_allow_other")), SessionACL::Owner);
        assert_eq!(acl(Some("allow_other")), SessionACL::All);
        assert_eq!(acl(Some("allow_root")), SessionACL::RootAndOwner);
        assert!(matches!(
            config(Some("allow_everyone"), "127.0.0.1:9400"),
            Err(MountError::UnknownOption(_))
        ));
    }
}
