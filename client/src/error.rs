//! The client's errors. They are typed: what went wrong in the filesystem's terms
//! ([`FsErrorKind`]), or the network's error as it is. The POSIX edges (the mount, the Python
//! package, the command line) turn them into errno with [`ClientError::errno`].

use lnet::NetError;
use proto::{FsErrorKind, StatusCode};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{what} ({kind:?})")]
    Fs { kind: FsErrorKind, what: String },
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Layout(#[from] proto::layout::LayoutError),
    #[error(transparent)]
    Auth(#[from] lnet::auth::AuthError),
    #[error("{fid} on target {target}: checksum mismatch at object offset {object_offset} (file offset {file_offset}, {len} bytes): the server sent crc32c {expected:#010x}, {actual:#010x} arrived")]
    Checksum {
        fid: proto::Fid,
        target: u32,
        object_offset: u64,
        file_offset: u64,
        len: u64,
        expected: u32,
        actual: u32,
    },
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
}

impl ClientError {
    pub fn fs(kind: FsErrorKind, what: impl Into<String>) -> Self {
        ClientError::Fs {
            kind,
            what: what.into(),
        }
    }

    /// What went wrong, in the filesystem's terms.
    pub fn kind(&self) -> FsErrorKind {
        match self {
            ClientError::Fs { kind, .. } => *kind,
            ClientError::Net(NetError::Remote { err, .. }) => match err.code {
                StatusCode::Fs(k) => k,
                StatusCode::NotFound => FsErrorKind::NotFound,
                StatusCode::Exists => FsErrorKind::Exists,
                StatusCode::Invalid => FsErrorKind::Invalid,
                StatusCode::NoSpace => FsErrorKind::NoSpace,
                StatusCode::Busy => FsErrorKind::WouldBlock,
                _ => FsErrorKind::Io,
            },
            ClientError::Net(NetError::Busy { .. }) => FsErrorKind::WouldBlock,
            ClientError::Net(NetError::Refused { .. }) => FsErrorKind::AccessDenied,
            ClientError::Net(_) => FsErrorKind::Io,
            ClientError::Layout(_) => FsErrorKind::Invalid,
            ClientError::Auth(_) => FsErrorKind::AccessDenied,
            ClientError::Checksum { .. } => FsErrorKind::Io,
            ClientError::Gpu(crate::gpu::GpuError::NoBackend(_))
            | ClientError::Gpu(crate::gpu::GpuError::DirectUnavailable(_)) => {
                FsErrorKind::NotSupported
            }
            ClientError::Gpu(crate::gpu::GpuError::NotDeviceMemory { .. }) => FsErrorKind::Invalid,
            ClientError::Gpu(_) => FsErrorKind::Io,
        }
    }

    /// Whether a storage server found the bytes it holds damaged (a block failing its
    /// checksum): another copy may hold them whole.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, ClientError::Net(NetError::Remote { err, .. }) if err.code == StatusCode::Checksum)
    }

    /// Whether this is an error of `kind`.
    pub fn is(&self, kind: FsErrorKind) -> bool {
        self.kind() == kind
    }

    /// The errno a POSIX caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            // A server's own code keeps its errno (EPROTO, ENOSYS, EBUSY...).
            ClientError::Net(NetError::Remote { err, .. }) => err.code.errno(),
            ClientError::Net(NetError::Busy { .. }) => libc::EAGAIN,
            other => other.kind().errno(),
        }
    }
}

impl From<lnet::RegionError> for ClientError {
    fn from(e: lnet::RegionError) -> Self {
        ClientError::Net(NetError::Region(e))
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;
