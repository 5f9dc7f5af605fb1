//! What can go wrong in a storage target, and how it travels back to a client.

use std::io;

use proto::{Fid, RemoteError, StatusCode};

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("object {0} does not exist")]
    NotFound(Fid),
    #[error("object {0} already exists")]
    Exists(Fid),
    #[error("object {fid}: checksum mismatch in the block at offset {offset}")]
    Checksum { fid: Fid, offset: u64 },
    #[error("{0}")]
    Invalid(String),
    #[error("target is full")]
    NoSpace,
    #[error("object {fid}: I/O error at offset {offset}: {source}")]
    Io {
        fid: Fid,
        offset: u64,
        source: io::Error,
    },
    #[error("target {what}: {source}")]
    Target { what: String, source: io::Error },
    #[error("target metadata is damaged: {0}")]
    Damaged(String),
    /// A write that arrived after a newer overlapping one from its client: not applied.
    #[error("stale write: {0}")]
    Stale(String),
    /// A sync failed: the object's unsynced writes may be lost, and its syncs fail until
    /// they are written again.
    #[error("object {fid}: sync failed ({reason}): its unsynced writes may be lost")]
    SyncFailed { fid: Fid, reason: String },
    /// What would destroy data or join two filesystems: refused, with what an operator can
    /// do.
    #[error("refused: {0}")]
    Refused(String),
}

impl TargetError {
    /// An I/O error on an object, turned into `NoSpace` when that is what it is.
    pub(crate) fn io(fid: Fid, offset: u64, source: io::Error) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            return TargetError::NoSpace;
        }
        TargetError::Io {
            fid,
            offset,
            source,
        }
    }

    pub(crate) fn target(what: impl Into<String>, source: io::Error) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            return TargetError::NoSpace;
        }
        TargetError::Target {
            what: what.into(),
            source,
        }
    }

    pub fn code(&self) -> StatusCode {
        match self {
            TargetError::NotFound(_) => StatusCode::NotFound,
            TargetError::Exists(_) => StatusCode::Exists,
            TargetError::Checksum { .. } => StatusCode::Checksum,
            TargetError::Invalid(_) => StatusCode::Invalid,
            TargetError::NoSpace => StatusCode::NoSpace,
            TargetError::Stale(_) => StatusCode::Fs(proto::FsErrorKind::Stale),
            TargetError::Refused(_) => StatusCode::Refused,
            TargetError::Io { .. }
            | TargetError::Target { .. }
            | TargetError::Damaged(_)
            | TargetError::SyncFailed { .. } => StatusCode::Io,
        }
    }
}

impl From<TargetError> for RemoteError {
    fn from(e: TargetError) -> RemoteError {
        RemoteError::new(e.code(), e.to_string())
    }
}
