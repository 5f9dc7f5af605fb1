//! Status codes carried back in error replies. POSIX-facing layers map them to errno.

use serde::{Deserialize, Serialize};

/// Why a request failed on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StatusCode {
    /// The server's queue is full: retry later. The request was not executed.
    Busy,
    /// The request body did not decode or asked for something impossible.
    BadRequest,
    /// No service on the server handles this opcode.
    NoService,
    /// A bulk transfer failed (unknown region, out of bounds, peer gone).
    Bulk,
    /// Data failed its checksum.
    Checksum,
    /// The server failed to carry out a valid request.
    Internal,
    /// No such object (ENOENT).
    NotFound,
    /// Already exists (EEXIST).
    Exists,
    /// An argument is out of range: an offset past the size limit, a length past the I/O limit
    /// (EINVAL, EFBIG).
    Invalid,
    /// The target is full (ENOSPC).
    NoSpace,
    /// The disk failed, or stored data failed its checksum (EIO). The message names the object
    /// and the offset.
    Io,
    /// A filesystem error from the namespace (not empty, access denied, ...).
    Fs(FsErrorKind),
    /// The server refuses what would destroy data or join two filesystems (a target of
    /// another filesystem, an index the MDS does not know, a cleanup past its bound, a
    /// rolled-back LAST_ID); the message names the problem and what an operator can do.
    Refused,
}

/// Why a filesystem operation failed, in the filesystem's own terms. The MDS and the client
/// library speak of these; the POSIX edges (the mount, the Python package, the command line)
/// turn them into errno with [`FsErrorKind::errno`], the one table of that mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FsErrorKind {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    AccessDenied,
    NotPermitted,
    NameTooLong,
    Invalid,
    NoSpace,
    /// Too many symlinks, or a symlink where a file was asked for.
    Loop,
    TooManyLinks,
    TooManyOpen,
    FileTooLarge,
    /// A value does not fit the buffer given for it.
    Range,
    /// A value is larger than it may ever be (an extended attribute's).
    TooBig,
    /// No such extended attribute.
    NoAttribute,
    /// The handle's file is gone.
    Stale,
    NotSupported,
    /// A special file, which the kernel opens itself.
    NoDevice,
    /// A handle used for what it was not opened for, or after close.
    BadHandle,
    /// Try again.
    WouldBlock,
    Io,
    /// Across metadata targets, where the change cannot go (a rename or link between
    /// directories of two MDTs, for now).
    CrossDevice,
    /// A name asked of a striped directory's master, or of a shard it does not hash to: the
    /// caller routes by the directory's layout, read again ([`crate::dirstripe`]). Never seen
    /// past the client library.
    WrongShard,
    /// In use: a file open, or in a state that does not allow the change now (`lode hsm
    /// release` of a file open, or changed since it was archived).
    Busy,
    /// The contents or a name of an encrypted file, asked without the key that unlocks its
    /// directory tree (or with another key).
    NoKey,
}

impl FsErrorKind {
    /// The errno a POSIX caller sees (Linux numbering).
    pub fn errno(self) -> i32 {
        match self {
            FsErrorKind::NotPermitted => 1,  // EPERM
            FsErrorKind::NotFound => 2,      // ENOENT
            FsErrorKind::Io => 5,            // EIO
            FsErrorKind::NoDevice => 6,      // ENXIO
            FsErrorKind::TooBig => 7,        // E2BIG
            FsErrorKind::BadHandle => 9,     // EBADF
            FsErrorKind::WouldBlock => 11,   // EAGAIN
            FsErrorKind::AccessDenied => 13, // EACCES
            FsErrorKind::Exists => 17,       // EEXIST
            FsErrorKind::NotDir => 20,       // ENOTDIR
            FsErrorKind::IsDir => 21,        // EISDIR
            FsErrorKind::Invalid => 22,      // EINVAL
            FsErrorKind::TooManyOpen => 24,  // EMFILE
            FsErrorKind::FileTooLarge => 27, // EFBIG
            FsErrorKind::NoSpace => 28,      // ENOSPC
            FsErrorKind::TooManyLinks => 31, // EMLINK
            FsErrorKind::Range => 34,        // ERANGE
            FsErrorKind::NameTooLong => 36,  // ENAMETOOLONG
            FsErrorKind::NotEmpty => 39,     // ENOTEMPTY
            FsErrorKind::Loop => 40,         // ELOOP
            FsErrorKind::NoAttribute => 61,  // ENODATA
            FsErrorKind::NotSupported => 95, // EOPNOTSUPP
            FsErrorKind::Stale => 116,       // ESTALE
            FsErrorKind::CrossDevice => 18,  // EXDEV
            FsErrorKind::WrongShard => 5,    // EIO: the library reroutes; never a caller's
            FsErrorKind::Busy => 16,         // EBUSY
            FsErrorKind::NoKey => 126,       // ENOKEY
        }
    }
}

impl StatusCode {
    /// The errno a POSIX caller sees for this code.
    pub fn errno(self) -> i32 {
        match self {
            StatusCode::Busy => 16,       // EBUSY
            StatusCode::BadRequest => 71, // EPROTO
            StatusCode::NoService => 38,  // ENOSYS
            StatusCode::Bulk => 5,        // EIO
            StatusCode::Checksum => 5,    // EIO
            StatusCode::Internal => 5,    // EIO
            StatusCode::NotFound => 2,    // ENOENT
            StatusCode::Exists => 17,     // EEXIST
            StatusCode::Invalid => 22,    // EINVAL
            StatusCode::NoSpace => 28,    // ENOSPC
            StatusCode::Io => 5,          // EIO
            StatusCode::Fs(k) => k.errno(),
            StatusCode::Refused => 1, // EPERM
        }
    }
}

/// An error reply: a code for programs and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RemoteError {
    pub code: StatusCode,
    pub message: String,
}

/// Longest message kept in an error reply; longer ones are cut.
pub const MAX_ERROR_MESSAGE: usize = 1024;

impl RemoteError {
    pub fn new(code: StatusCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_ERROR_MESSAGE {
            let mut cut = MAX_ERROR_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        RemoteError { code, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_linux_errno() {
        // Spot checks against the kernel's numbering; the table is the only mapping.
        assert_eq!(FsErrorKind::NotFound.errno(), 2);
        assert_eq!(FsErrorKind::NotEmpty.errno(), 39);
        assert_eq!(FsErrorKind::Stale.errno(), 116);
        assert_eq!(StatusCode::Fs(FsErrorKind::Exists).errno(), 17);
    }
}
