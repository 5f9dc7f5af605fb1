//! Where the MDS's journal and snapshot bytes go: a directory on a real filesystem
//! ([`os::DirDisk`]), or an in-memory image that can crash ([`mem::MemDisk`]).
//!
//! The journal and snapshot code see only these few operations on named files, so the same
//! recovery code runs against a disk that loses everything not synced, tears writes and fails
//! on command. Names are plain file names within one directory (`journal`, `snapshot`).

pub mod mem;
pub mod os;

use std::io;

pub use mem::MemDisk;
pub use os::DirDisk;

/// What the MDS's durable state needs from a disk.
pub trait MetaDisk: Send + Sync + 'static {
    /// A file's whole contents; `None` if it does not exist.
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Writes `bytes` at `offset`, creating the file if needed (not durable until `sync`).
    fn write_at(&self, name: &str, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Sets a file's length (not durable until `sync`).
    fn set_len(&self, name: &str, len: u64) -> io::Result<()>;
    /// Makes a file's data and length durable.
    fn sync(&self, name: &str) -> io::Result<()>;
    /// Makes a file's data durable; its length must already be (fdatasync).
    fn sync_data(&self, name: &str) -> io::Result<()> {
        self.sync(name)
    }
    /// Replaces `name` by a file holding `bytes`, durably and atomically: after a crash the
    /// name holds the old contents or the new, never a mix.
    fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// Whether a file exists.
    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.read(name)?.is_some())
    }
    /// The bytes of the device the files are on, and how many are free to an unprivileged
    /// writer; `None` where there is no such device (a disk in memory).
    fn space(&self) -> Option<(u64, u64)> {
        None
    }
    /// Whether a write costs no real I/O (a disk in memory): the caller may write on its own
    /// task instead of a blocking thread, which keeps a simulation under a virtual clock from
    /// racing a real thread.
    fn in_memory(&self) -> bool {
        false
    }
}
