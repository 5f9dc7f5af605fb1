//! What every lode server process needs from its host, done one way for all of them: an
//! exclusive lock on its data directory, logging set up from the environment, and a future
//! that completes on SIGTERM or SIGINT.

pub mod metrics;
pub mod telemetry;

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("data directory {dir} is in use by process {holder}")]
    InUse { dir: PathBuf, holder: String },
    #[error("cannot lock data directory {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
}

/// Held for as long as the process serves a data directory; released when dropped or when the
/// process dies (the kernel drops flock locks with the descriptor, even on `kill -9`).
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Creates `dir` if needed and takes its lock, or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, LockError> {
        let io = |source| LockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("lock"))
            .map_err(io)?;
        // SAFETY: flock on a descriptor we own, with integer flags.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(LockError::InUse {
                    dir: dir.to_path_buf(),
                    holder: holder.trim().to_owned(),
                });
            }
            return Err(io(err));
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataDirLock { _file: file })
    }
}

/// Turns transparent huge pages off for this process (and what it starts), as databases that
/// keep their state in memory advise. The allocator grows its heap in 2 MiB pages otherwise,
/// and the kernel zeroes each one whole as it is first touched: a process that grows by
/// hundreds of megabytes, as a client answering creates ahead or an MDS taking a burst does,
/// stalls for a fifth of a millisecond per page, and keeps pages it barely uses. Pages of 4 KiB
/// cost more in the TLB; measured on the create benchmark, the stalls cost more.
pub fn no_huge_pages() {
    // SAFETY: prctl with PR_SET_THP_DISABLE takes no pointers.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "transparent huge pages stay on");
    }
}

/// Logs to stderr, filtered by `LODE_LOG` (default `info`).
pub fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("LODE_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .try_init();
}

/// Completes when the process is asked to stop (SIGTERM or SIGINT).
pub async fn stop_requested() -> io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_told_who_holds_it() {
        let dir = std::env::temp_dir().join(format!("lode-lock-{}", std::process::id()));
        let first = DataDirLock::acquire(&dir).unwrap();
        match DataDirLock::acquire(&dir) {
            Err(LockError::InUse { holder, .. }) => {
                assert_eq!(holder, std::process::id().to_string())
            }
            Err(other) => panic!("wrong error: {other}"),
            Ok(_) => panic!("locked twice"),
        }
        drop(first);
        DataDirLock::acquire(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Where a server listens, as a configuration file gives it: one address, or a list of them
/// (one per interface: multi-rail, the first naming the server).
#[derive(serde::Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Addrs {
    One(std::net::SocketAddr),
    Many(Vec<std::net::SocketAddr>),
}

impl Addrs {
    pub fn into_vec(self) -> Vec<std::net::SocketAddr> {
        match self {
            Addrs::One(a) => vec![a],
            Addrs::Many(v) => v,
        }
    }
}

/// How a server authenticates its peers: the flags `lode-mds` and `lode-oss` share.
#[derive(clap::Args, Debug, Default)]
pub struct AuthArgs {
    /// The cluster key (`lode key new FILE`); connections authenticate with it.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Run without authentication: anyone who can reach the port gets in, as root.
    #[arg(long, conflicts_with = "key")]
    pub no_auth: bool,
    /// Encrypt every connection, not only authenticate it.
    #[arg(long)]
    pub privacy: bool,
}

impl AuthArgs {
    /// The server's security settings: the flags, over a configuration file's `key_file`,
    /// `auth` and `privacy`.
    pub fn security(
        &self,
        file_key: Option<&Path>,
        file_auth: Option<bool>,
        file_privacy: Option<bool>,
    ) -> Result<lnet::auth::Security, lnet::auth::AuthError> {
        lnet::auth::server_security(
            self.key.as_deref().or(file_key),
            self.no_auth || file_auth == Some(false),
            self.privacy || file_privacy == Some(true),
        )
    }
}
