//! Opens kept past their close (Lustre's open cache): a file closed while this client holds
//! the lease on its attributes keeps its handle at the MDS for a while, and the next open of
//! it by the same credentials takes that handle without asking the MDS.
//!
//! That open answers what an open at the MDS would: the lease's attributes are the file as of
//! now, since another client's change (a write's size or mtime published at its close, a
//! truncate, a chmod, an unlink) recalls the lease before it is applied, and a change of this
//! client's own is seen as one ([`Leases::unmoved`]). So close-to-open holds. The handle's
//! grant covers the access asked for (it is renewed, as any, before it expires), and the MDS
//! still counts the handle, so a file unlinked meanwhile keeps its objects while it is open.
//!
//! A kept handle is closed at the MDS when it is no longer of use: its lease dropped or moved
//! on, after [`KEEP_FOR`] unused, past [`MAX_KEPT`] handles, and when the client leaves. What
//! an MDS restart loses is counted again with every other handle. The MDS's audit log records
//! the first open of a file under its handle, not the later ones that took it from here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use proto::md::{Creds, Inode, OpenHandle};
use proto::Fid;

use crate::caps::Caps;
use crate::lease::Leases;
use crate::FastMap;

/// Most handles kept past their close; a close past it closes at the MDS as usual.
pub const MAX_KEPT: usize = 8192;
/// A kept handle unused for this long is closed.
pub const KEEP_FOR: Duration = Duration::from_secs(10);

/// A handle kept past its close.
pub(crate) struct Entry {
    pub handle: OpenHandle,
    pub caps: Arc<Caps>,
    /// The file's size generation as the handle last learnt it.
    pub gen: u64,
    /// The lease it was kept under ([`Leases::mark`]).
    mark: (u64, u64),
    at: Instant,
}

#[derive(Default)]
pub(crate) struct Kept {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    files: FastMap<Fid, Vec<Entry>>,
    count: usize,
}

impl Kept {
    /// Keeps the handle `handle` of `fid` past its close, if its lease is held with
    /// attributes no change of this client's own moved and there is room. Gives the handle
    /// back otherwise: the caller closes it.
    pub fn keep(
        &self,
        leases: &Leases,
        fid: Fid,
        handle: OpenHandle,
        caps: Arc<Caps>,
        gen: u64,
    ) -> Result<(), OpenHandle> {
        let mut s = self.state.lock();
        if s.count >= MAX_KEPT {
            return Err(handle);
        }
        // Marked under this lock: a take or a sweep compares with the lease as of now.
        let Some(mark) = leases.mark(fid) else {
            return Err(handle);
        };
        // A file with no name left cannot be opened again by one: its handle goes, so the
        // MDS can let it go.
        if leases.unmoved(fid, mark).is_none_or(|i| i.nlink == 0) {
            return Err(handle);
        }
        s.files.entry(fid).or_default().push(Entry {
            handle,
            caps,
            gen,
            mark,
            at: Instant::now(),
        });
        s.count += 1;
        Ok(())
    }

    /// A handle of `fid` kept for `creds` whose grant allows `rights`, with the attributes
    /// the lease holds now; and the handles of `fid` of no use any more, for the caller to
    /// close.
    pub fn take(
        &self,
        leases: &Leases,
        fid: Fid,
        creds: &Creds,
        rights: u8,
    ) -> (Option<(Entry, Inode)>, Vec<Entry>) {
        let mut s = self.state.lock();
        let Some(entries) = s.files.get_mut(&fid) else {
            return (None, vec![]);
        };
        let mut stale = vec![];
        let mut found = None;
        let mut i = 0;
        while i < entries.len() {
            let e = &entries[i];
            let Some(inode) = leases.unmoved(fid, e.mark) else {
                stale.push(entries.swap_remove(i));
                continue;
            };
            if found.is_none() && e.caps.creds() == creds && e.caps.allows(rights) {
                found = Some((entries.swap_remove(i), inode));
                continue;
            }
            i += 1;
        }
        if entries.is_empty() {
            s.files.remove(&fid);
        }
        s.count -= stale.len() + usize::from(found.is_some());
        (found, stale)
    }

    /// Takes out the handles of no use any more: their lease dropped or moved on, unused for
    /// [`KEEP_FOR`], or all of them with `all`.
    pub fn sweep(&self, leases: &Leases, all: bool) -> Vec<(Fid, Entry)> {
        let mut s = self.state.lock();
        if s.count == 0 {
            return vec![];
        }
        let mut out = vec![];
        s.files.retain(|fid, entries| {
            let mut i = 0;
            while i < entries.len() {
                let e = &entries[i];
                if all || e.at.elapsed() >= KEEP_FOR || leases.unmoved(*fid, e.mark).is_none() {
                    out.push((*fid, entries.swap_remove(i)));
                } else {
                    i += 1;
                }
            }
            !entries.is_empty()
        });
        s.count -= out.len();
        out
    }

    /// Whether another handle may be kept now.
    pub fn has_room(&self) -> bool {
        self.state.lock().count < MAX_KEPT
    }

    /// Handles kept now.
    pub fn len(&self) -> usize {
        self.state.lock().count
    }
}
