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
    /// A POSIX error from the namespace, carried as its errno (ENOTEMPTY, EACCES, ...).
    Posix(i32),
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
            StatusCode::Posix(e) => e,
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
