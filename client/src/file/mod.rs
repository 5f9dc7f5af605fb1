//! Files: opening with the usual flags, and striped parallel reads and writes straight
//! between the caller's memory and the storage targets.
//!
//! A read or write is cut into pieces, each inside one stripe unit of one object
//! (`Layout::pieces`), and up to `window` pieces per target are in flight at once (over all
//! of the client's calls, as Lustre bounds RPCs in flight per target), so one large call
//! reaches the bandwidth of all the targets it touches and many calls do not flood one
//! target. Reads can land directly in memory the caller registered ([`File::read_into`]): the
//! storage server puts the bytes there, with no copy on the client. A file's size is its
//! writers' business: on `fsync` and `close` they report how far they wrote, and the MDS keeps
//! the largest (so disjoint writers of one file leave the right size).

mod cipher;
mod device;
mod mirrors;
mod open;
mod read;
mod resize;
mod sync;
mod write;

pub use open::{At, OpenOptions};
pub use read::{Chunk, Reader};
use resize::objects_extent;
use sync::publish;
pub use sync::Behind;
pub use write::Writer;

use proto::FsErrorKind;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use lnet::{Registered, Transport};
use parking_lot::Mutex;
use proto::capa::Grant;
use proto::layout::{Component, Layout, LayoutError, StripeCount, StripeObject};
use proto::md::{Inode, Kind, MdsOpen, MdsReadMdt, Mutation, OpenHandle, SetAttr};

use crate::caps::Caps;
use crate::plan;
use proto::ost::{OstPunch, OstRead, OstSync, OstTruncate, OstWrite};
use proto::Nid;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::gpu::{Completion, DeviceBuf, DeviceIo, GpuBackend, GpuError, IoPath};
use crate::readahead::Readahead;
use crate::writebehind::{Step, WriteBehind};

/// Most times an open by path looks the path up again because its file was replaced.
const MAX_REOPEN: u32 = 8;

/// An open the MDS counted: the file as of then, and what came with it.
struct Counted {
    inode: Inode,
    handle: OpenHandle,
    gen: u64,
    grant: Grant,
    mdt: Option<MdtCopy>,
    /// The capabilities of a handle kept past its close, taken for this open.
    kept: Option<Arc<Caps>>,
}

/// The bytes the MDS keeps of a Data-on-MDT file (up to its size), as a handle last read them.
/// They are read again unless the client's leases are where they were then (no recall and no
/// change of this client's own since) and it holds the file's lease: another client's write
/// recalls that lease before it is applied.
struct MdtCopy {
    bytes: Vec<u8>,
    stamp: crate::lease::Stamp,
}

/// An open file.
pub struct File {
    client: Client,
    inode: Mutex<Inode>,
    /// Capabilities for the file's objects.
    caps: Arc<Caps>,
    /// The open the MDS counts for this handle.
    handle: OpenHandle,
    /// The file's size generation as this handle last learnt it: a size it publishes counts
    /// only if no truncate came since.
    size_gen: AtomicU64,
    append: bool,
    writable: bool,
    /// The furthest end this handle has written.
    written_to: AtomicU64,
    /// The first byte of a write through this handle, acknowledged before it landed, that
    /// failed to land ([`File::landing_failed`]); `u64::MAX`: none.
    lost_from: AtomicU64,
    closed: AtomicBool,
    /// Written since the size was last published.
    unpublished: AtomicBool,
    /// A file created ahead ([`crate::pending`]): the MDS's answer to come, which brings its
    /// objects and capabilities.
    ahead: Option<crate::pending::Sent>,
    /// The directory a file created ahead was created in.
    created_in: Option<proto::Fid>,
    /// The client's count of lease recalls when the file was created ahead.
    recalls_at_create: u64,
    /// Closed behind its caller ([`File::close_behind`]).
    behind: AtomicBool,
    /// The answer came and was taken in (or the file was not created ahead).
    ready: AtomicBool,
    /// Held while the answer is taken in.
    taking_in: Mutex<()>,
    /// The bytes the MDS keeps of the file (Data-on-MDT), as last read.
    mdt: Mutex<Option<MdtCopy>>,
    /// The client's evictions that lost acknowledged changes, as this handle has reported
    /// them (from its open on): a later one fails its next `fsync` and its close with EIO.
    evictions_seen: AtomicU64,
    /// The contents cipher of an encrypted file ([`cipher`]).
    cipher: cipher::Cipher,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("fid", &self.inode.lock().fid)
            .finish()
    }
}

impl File {
    /// A view of a file for reading under capabilities borrowed from an earlier open, before
    /// (or without) an open of its own ([`crate::early`]): the MDS counts no handle for it, so
    /// there is nothing to close.
    pub(crate) fn borrowed(client: &Client, inode: Inode, caps: Caps) -> File {
        let handle = caps.handle();
        let client = &client.at_now(inode.fid).unwrap_or_else(|| client.clone());
        let cipher = cipher::Cipher::of(client, &inode);
        File {
            client: client.clone(),
            inode: Mutex::new(inode),
            caps: Arc::new(caps),
            handle,
            size_gen: AtomicU64::new(0),
            append: false,
            writable: false,
            written_to: AtomicU64::new(0),
            lost_from: AtomicU64::new(u64::MAX),
            closed: AtomicBool::new(true),
            unpublished: AtomicBool::new(false),
            ahead: None,
            created_in: None,
            recalls_at_create: 0,
            behind: AtomicBool::new(false),
            ready: AtomicBool::new(true),
            taking_in: Mutex::new(()),
            mdt: Mutex::new(None),
            evictions_seen: AtomicU64::new(client.evictions()),
            cipher,
        }
    }

    /// The client this file was opened through (to register memory for it, say).
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn inode(&self) -> Inode {
        self.inode.lock().clone()
    }

    /// How far this handle reads: the size as of open (close-to-open), or further if this
    /// handle wrote further; a file removed while open stays readable, so this does not ask
    /// the MDS.
    /// How far a read may go: the size as last learnt, or further where this client's own
    /// writes (through any handle) went further and are not published yet.
    fn readable_size(&self) -> u64 {
        let (fid, size) = {
            let i = self.inode.lock();
            (i.fid, i.size)
        };
        size.max(self.written_to.load(Ordering::Relaxed))
            .max(self.client.inner.writes.end_of(fid))
    }

    /// The file's FID (without copying the rest of its inode).
    pub fn fid(&self) -> proto::Fid {
        self.inode.lock().fid
    }

    /// The attributes of a file created ahead, as made here, while they are known to be all
    /// there is: its create not yet answered, and no lease recalled since (another client
    /// that found the file and changed it would have recalled this client's lease on it
    /// first). Its layout is not known until the answer.
    pub fn made_here(&self) -> Option<Inode> {
        let sent = self.ahead.as_ref()?;
        let quiet = self.client.lease_recalls() == self.recalls_at_create;
        (quiet && !sent.arrived() && !self.ready.load(Ordering::SeqCst))
            .then(|| self.inode.lock().clone())
    }

    /// Whether this handle created the file ahead ([`crate::pending`]).
    pub fn created_ahead(&self) -> bool {
        self.ahead.is_some()
    }

    /// For a file this handle created ahead: its create's answer to come, and this client's
    /// count of lease recalls and losses when it was made. The file is untouched by any other
    /// client since if the answer leased it to this client and the count has not moved
    /// (another client's change recalls the lease first). `None` for any other handle.
    pub fn create_check(&self) -> Option<(crate::pending::Sent, u64)> {
        Some((self.ahead.clone()?, self.recalls_at_create))
    }

    /// Whether the MDS has answered for the file: false for a file created ahead until its
    /// create's answer was taken in (its times are this client's clock, which the MDS stamps
    /// the create with).
    pub fn answered(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Waits, for a file created ahead, for the MDS's answer and takes in the file's objects
    /// and capabilities; the create's failure, if it failed.
    async fn ready(&self) -> Result<()> {
        if self.ready.load(Ordering::SeqCst) {
            return Ok(());
        }
        let Some(sent) = &self.ahead else {
            return Ok(());
        };
        // A close finishing behind its caller lets the create go with the next batch.
        let reply = sent
            .reply_after(!self.behind.load(Ordering::SeqCst))
            .await?;
        let inode = reply
            .inode
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))?;
        // Taken in once, and `ready` set only after: a caller that sees it set also sees the
        // objects and capabilities (another write of the file may be looking at that moment).
        let _once = self.taking_in.lock();
        if self.ready.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Counted again after an MDS restart from now on.
        self.client
            .inner
            .opens
            .insert(self.handle.handle, inode.fid);
        *self.inode.lock() = inode;
        self.size_gen.store(reply.size_gen, Ordering::SeqCst);
        if let Some(g) = reply.grant {
            let fid = self.inode.lock().fid;
            self.client
                .inner
                .grants
                .remember(fid, self.caps.creds(), &g);
            self.caps.set(g);
        }
        self.ready.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The file's layout, once it is known (see [`File::ready`]).
    async fn layout_ready(&self) -> Result<Layout> {
        self.ready().await?;
        self.layout()
    }

    fn layout(&self) -> Result<Layout> {
        let i = self.inode.lock();
        match &i.layout {
            // A layout from the network is checked before any arithmetic is done with it.
            Some(l) if l.components.iter().all(|c| c.is_instantiated()) => {
                l.validate().map_err(|e| {
                    ClientError::fs(FsErrorKind::Io, format!("{}: bad layout: {e}", i.fid))
                })?;
                Ok(l.clone())
            }
            _ => Err(ClientError::fs(
                FsErrorKind::Io,
                format!(
                    "{} has no objects (no storage target was up when it was made)",
                    i.fid
                ),
            )),
        }
    }

    /// How long one copy of the file may fail to answer before another is used: `None` for a
    /// file with one copy (its calls wait for its server, up to the client's `retry_for`).
    fn failover(&self, layout: &Layout) -> Option<std::time::Duration> {
        (layout.mirror_count() > 1).then_some(self.client.inner.cfg.mirror_failover)
    }

    /// Marks `mirror` stale at the MDS (durably, before the write that missed it is
    /// acknowledged) and takes the layout the MDS answers with.
    async fn mark_stale(&self, layout: &Layout, mirror: u16, why: &ClientError) -> Result<()> {
        let fid = self.inode.lock().fid;
        tracing::warn!(%fid, mirror, error = %why, "a mirror missed a write; marking it stale");
        self.mark_stale_quietly(layout, mirror, why).await
    }

    async fn mark_stale_quietly(
        &self,
        layout: &Layout,
        mirror: u16,
        why: &ClientError,
    ) -> Result<()> {
        let fid = self.inode.lock().fid;
        let m = Mutation::MirrorState {
            fid,
            mirror,
            stale: true,
            generation: layout.generation,
        };
        let failed = |e: ClientError| {
            ClientError::fs(
                FsErrorKind::Io,
                format!("{fid}: mirror {mirror} missed a write ({why}) and could not be marked stale: {e}"),
            )
        };
        let r = self
            .client
            .reint_if(m, Some(self.handle), None)
            .await
            .map_err(failed)?;
        // Durable before the write it covers is acknowledged: an MDS that forgot the mark
        // (a crash before its commit, the client gone too) would let readers take the copy
        // that missed the write.
        if r.transno > r.committed {
            self.client.sync_committed().await.map_err(failed)?;
        }
        if let Some(i) = r.inode {
            let mut mine = self.inode.lock();
            mine.layout = i.layout;
        }
        Ok(())
    }
}

impl File {
    /// Where the storage server of `target` is.
    async fn oss_of(&self, targets: &HashSet<u32>) -> Result<std::collections::HashMap<u32, Nid>> {
        self.client.servers_of(targets).await
    }

    /// The file's size: the MDS's, or further if this handle wrote further.
    pub async fn size(&self) -> Result<u64> {
        let fid = self.inode.lock().fid;
        let written = self.written_to.load(Ordering::Relaxed);
        match self.client.getattr(fid).await {
            Ok(fresh) => {
                let size = fresh.size.max(written);
                *self.inode.lock() = fresh;
                Ok(size)
            }
            // The file lost its last name while this handle holds it: it stays as it was,
            // and only this client's own writes can have grown it.
            Err(e) if e.is(FsErrorKind::Stale) => {
                let mut inode = self.inode.lock();
                inode.nlink = 0;
                Ok(inode.size.max(written))
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for File {
    /// A handle dropped without `close` still tells the MDS, in the background, when it can.
    fn drop(&mut self) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        self.client.inner.writes.closed(self.inode.lock().fid);
        // Not counted again after an MDS restart, whether or not the close gets through.
        self.client.inner.opens.remove(self.handle.handle);
        if !self.ready.load(Ordering::SeqCst) {
            let fid = self.inode.lock().fid;
            self.client
                .close_ahead(self.handle, fid, self.ahead.as_ref());
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let caps = self.caps.clone();
            let (client, inode, end, handle, gen) = (
                self.client.clone(),
                self.inode.lock().clone(),
                self.written_to.load(Ordering::Relaxed),
                self.handle,
                self.size_gen.load(Ordering::SeqCst),
            );
            let unpublished = self.unpublished.load(Ordering::SeqCst);
            lnet::job::spawn_on(&rt, async move {
                if unpublished {
                    let _ = publish(&client, &inode, &caps, handle, end, gen).await;
                }
                let _ = client.close_handle(handle, inode.fid).await;
            });
        }
    }
}

/// A registered buffer of a [`Writer`].
type Buffer = Arc<Registered<Vec<u8>>>;

/// A piece of a read that has landed, with what the server said of it.
struct Landed {
    at: u64,
    piece: proto::layout::Piece,
    /// The object and its server; `None` for a hole.
    obj: Option<(StripeObject, Nid)>,
    desc: proto::BulkDesc,
    done: proto::ost::OstReadDone,
    /// The copy of the file it was read from.
    mirror: u16,
}

/// Reads one piece of one object into the range `desc` names, within the target's window.
async fn read_piece(
    client: &Client,
    caps: &Caps,
    window: &Arc<Semaphore>,
    oss: &Nid,
    obj: StripeObject,
    object_offset: u64,
    desc: &proto::BulkDesc,
) -> Result<proto::ost::OstReadDone> {
    read_piece_within(client, caps, window, oss, obj, object_offset, desc, None).await
}

/// As [`read_piece`], giving up on the server after `limit` when one is given.
#[allow(clippy::too_many_arguments)]
async fn read_piece_within(
    client: &Client,
    caps: &Caps,
    window: &Arc<Semaphore>,
    oss: &Nid,
    obj: StripeObject,
    object_offset: u64,
    desc: &proto::BulkDesc,
    limit: Option<std::time::Duration>,
) -> Result<proto::ost::OstReadDone> {
    let _slot = window
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ClientError::fs(FsErrorKind::Io, "closed"))?;
    let r = |capa| OstRead {
        target: obj.target,
        fid: obj.fid,
        offset: object_offset,
        desc: desc.clone(),
        capa,
    };
    client
        .object_rpc(caps, oss, obj.target, obj.fid, r, limit)
        .await
}
