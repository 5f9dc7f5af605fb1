//! Reads begun before the open they are for: a small file opened to be read, whose
//! attributes this client holds under a lease and whose objects an earlier open of the same
//! caller was granted access to, has its bytes on the way from the storage servers while the
//! MDS counts the open, instead of after. The open's answer decides: the bytes are the file's
//! only if the file it found is the one they were read from (same objects, size and times;
//! another client's change between would have moved the times, and recalled the lease
//! first). Otherwise, or if the read failed, they are dropped and the file is read as usual,
//! so a read begun early changes nothing but when the bytes arrive.
//!
//! The capabilities are borrowed, never renewed: the MDS counts no handle for the read, and a
//! grant too close to its expiry is not used. Nothing read early reaches a caller whose open
//! the MDS refused.

use std::sync::Arc;

use proto::md::{Inode, Kind};
use proto::Fid;

use crate::caps::Caps;
use crate::client::Client;
use crate::error::Result;
use crate::file::{Chunk, File};

/// A read of a file's first bytes begun before its open was answered.
pub struct EarlyRead {
    /// The file as the read saw it.
    inode: Inode,
    read: tokio::task::JoinHandle<Result<Chunk>>,
}

impl EarlyRead {
    /// The bytes, if `opened` (the file as its open found it) is the file they were read
    /// from and the read succeeded; `None` otherwise (the caller reads as usual).
    pub async fn take(mut self, opened: &Inode) -> Option<Chunk> {
        if !same_file(&self.inode, opened) {
            self.read.abort();
            return None;
        }
        match (&mut self.read).await {
            Ok(Ok(chunk)) => Some(chunk),
            Ok(Err(e)) => {
                tracing::debug!(fid = %opened.fid, error = %e, "a read begun early failed; reading again");
                None
            }
            Err(_) => None,
        }
    }
}

impl Drop for EarlyRead {
    fn drop(&mut self) {
        self.read.abort();
    }
}

/// Whether two views of a file describe the same bytes: the same objects, size and times.
fn same_file(a: &Inode, b: &Inode) -> bool {
    a.fid == b.fid
        && a.size == b.size
        && a.mtime == b.mtime
        && a.ctime == b.ctime
        && a.layout == b.layout
}

impl Client {
    /// Begins reading the first `max` bytes of `fid` (a file of at most `max` bytes) for this
    /// client's caller before its open is answered, where it can: the file's attributes are
    /// held under a lease, its data is on the storage servers only, and an earlier open by the
    /// same credentials was granted read access to its objects. Pair it with the open through
    /// [`EarlyRead::take`].
    pub fn read_early(&self, fid: Fid, max: u64) -> Option<EarlyRead> {
        let inode = self.getattr_cached(fid)?;
        let layout = inode.layout.as_ref()?;
        // A handle of this client wrote to the file and is still open: its writes may reach
        // past the size the MDS knows, which is all an early read would read.
        if self.inner.writes.end_of(fid) != 0 {
            return None;
        }
        if inode.kind != Kind::File
            || inode.size == 0
            || inode.size > max
            || layout.mdt_end().is_some()
        {
            return None;
        }
        let grant = self.inner.grants.lend(fid, self.creds())?;
        let handle = self.handle(0);
        let caps = Caps::borrowed(fid, handle, self.creds().clone(), grant);
        let file = Arc::new(File::borrowed(self, inode.clone(), caps));
        let len = inode.size as usize;
        let read = lnet::job::spawn(async move { file.read_chunk(0, len).await });
        Some(EarlyRead { inode, read })
    }
}
