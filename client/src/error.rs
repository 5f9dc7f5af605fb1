//! The client's errors, with the errno a POSIX caller expects.

use lnet::NetError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{what} (errno {errno})")]
    Posix { errno: i32, what: String },
    #[error("{0}")]
    Net(#[from] NetError),
    #[error("{0}")]
    Layout(#[from] proto::layout::LayoutError),
}

impl ClientError {
    pub fn posix(errno: i32, what: impl Into<String>) -> Self {
        ClientError::Posix {
            errno,
            what: what.into(),
        }
    }

    /// The errno for this error.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Posix { errno, .. } => *errno,
            ClientError::Net(NetError::Remote { err, .. }) => err.code.errno(),
            ClientError::Net(
                NetError::Timeout { .. }
                | NetError::NodeDown { .. }
                | NetError::Unreachable { .. }
                | NetError::Closed { .. },
            ) => libc::EIO,
            ClientError::Net(NetError::Busy { .. }) => libc::EAGAIN,
            ClientError::Net(_) => libc::EIO,
            ClientError::Layout(_) => libc::EINVAL,
        }
    }

    /// Whether this is the error `errno`.
    pub fn is(&self, errno: i32) -> bool {
        self.errno() == errno
    }
}

impl From<lnet::RegionError> for ClientError {
    fn from(e: lnet::RegionError) -> Self {
        ClientError::Net(NetError::Region(e))
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;
