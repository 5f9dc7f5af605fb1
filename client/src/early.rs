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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use proto::capa::Grant;
use proto::md::{Creds, Inode, Kind};
use proto::Fid;

use crate::caps::Caps;
use crate::client::Client;
use crate::error::Result;
use crate::file::{Chunk, File};

/// Most grants remembered; past it, the table starts again.
const MAX_GRANTS: usize = 65_536;
/// A grant with less than this left before its expiry is not lent (seconds).
const LEND_MARGIN: u64 = 60;

/// The latest grant each file's objects were given to this client, with the credentials
/// they were given for.
#[derive(Default)]
pub(crate) struct Grants {
    of: Mutex<HashMap<Fid, (Creds, Grant)>>,
}

impl Grants {
    pub(crate) fn remember(&self, fid: Fid, creds: &Creds, grant: &Grant) {
        let mut of = self.of.lock();
        if of.len() >= MAX_GRANTS && !of.contains_key(&fid) {
            of.clear();
        }
        of.insert(fid, (creds.clone(), grant.clone()));
    }

    /// A grant `creds` were given to read `fid`'s objects, fresh enough to lend.
    fn lend(&self, fid: Fid, creds: &Creds) -> Option<Grant> {
        let of = self.of.lock();
        let (who, g) = of.get(&fid)?;
        let unchecked = g.expiry == u64::MAX && g.objects.is_empty();
        let readable = g.rights & proto::capa::READ != 0;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(u64::MAX, |d| d.as_secs());
        (who == creds && (unchecked || (readable && g.expiry >= now.saturating_add(LEND_MARGIN))))
            .then(|| g.clone())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proto::capa::ObjectMac;

    fn grant(rights: u8, expiry: u64) -> Grant {
        Grant {
            rights,
            expiry,
            objects: vec![ObjectMac {
                target: 0,
                object: Fid {
                    seq: proto::fid::INODE_SEQ,
                    oid: 2,
                    ver: 0,
                },
                mac: [0; 16],
            }],
        }
    }

    fn user(uid: u32) -> Creds {
        Creds {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    #[test]
    fn a_grant_is_lent_only_to_its_credentials_to_read_while_fresh() {
        let g = Grants::default();
        let f = Fid {
            seq: proto::fid::INODE_SEQ,
            oid: 1,
            ver: 0,
        };
        let later = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        assert!(g.lend(f, &user(5)).is_none(), "nothing remembered yet");
        g.remember(f, &user(5), &grant(proto::capa::READ, later));
        assert!(g.lend(f, &user(5)).is_some());
        assert!(g.lend(f, &user(6)).is_none(), "another caller's grant");
        g.remember(f, &user(5), &grant(proto::capa::WRITE, later));
        assert!(g.lend(f, &user(5)).is_none(), "no right to read");
        g.remember(f, &user(5), &grant(proto::capa::READ, later - 3600 + 10));
        assert!(g.lend(f, &user(5)).is_none(), "about to expire");
    }
}
