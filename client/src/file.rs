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

/// How to open a file, after `std::fs::OpenOptions`, with a layout for new files.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: Option<u32>,
    stripe_count: Option<StripeCount>,
    stripe_size: Option<u64>,
    stripe_offset: Option<u32>,
    layout: Option<Layout>,
}

impl OpenOptions {
    pub fn new() -> Self {
        OpenOptions {
            read: true,
            ..Default::default()
        }
    }

    pub fn read(mut self, v: bool) -> Self {
        self.read = v;
        self
    }
    pub fn write(mut self, v: bool) -> Self {
        self.write = v;
        self
    }
    /// O_APPEND: every write goes to the end of the file.
    pub fn append(mut self, v: bool) -> Self {
        self.append = v;
        self.write |= v;
        self
    }
    /// O_TRUNC.
    pub fn truncate(mut self, v: bool) -> Self {
        self.truncate = v;
        self
    }
    /// O_CREAT.
    pub fn create(mut self, v: bool) -> Self {
        self.create = v;
        self
    }
    /// O_CREAT | O_EXCL.
    pub fn create_new(mut self, v: bool) -> Self {
        self.create_new = v;
        self
    }
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = Some(mode);
        self
    }
    /// Stripes of a new file (-1 in `lfs`: use [`OpenOptions::stripe_all`]).
    pub fn stripe_count(mut self, n: u32) -> Self {
        self.stripe_count = Some(StripeCount::Count(n));
        self
    }
    /// Stripe over every target.
    pub fn stripe_all(mut self) -> Self {
        self.stripe_count = Some(StripeCount::All);
        self
    }
    pub fn stripe_size(mut self, bytes: u64) -> Self {
        self.stripe_size = Some(bytes);
        self
    }
    /// The first target of a new file.
    pub fn stripe_offset(mut self, target: u32) -> Self {
        self.stripe_offset = Some(target);
        self
    }
    /// A whole layout (progressive components) for a new file.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = Some(layout);
        self
    }

    fn new_file_layout(&self) -> Result<Option<Layout>> {
        if let Some(l) = &self.layout {
            l.validate()?;
            return Ok(Some(l.clone()));
        }
        if self.stripe_count.is_none() && self.stripe_size.is_none() && self.stripe_offset.is_none()
        {
            return Ok(None); // the directory's default, or the filesystem's
        }
        let mut c = Component::raid0(
            self.stripe_count.unwrap_or(StripeCount::Count(1)),
            self.stripe_size
                .unwrap_or(proto::layout::DEFAULT_STRIPE_SIZE),
        );
        c.stripe_offset = self.stripe_offset;
        Ok(Some(Layout::new(vec![c])?))
    }

    pub async fn open(&self, client: &Client, path: &str) -> Result<File> {
        if self.create || self.create_new {
            let (parent, name) = client.parent_of(path).await?;
            match self.open_in(client, parent.fid, name).await {
                // An existing directory or symlink under O_CREAT: resolve it as open(2) does.
                Err(e) if e.is(FsErrorKind::Exists) && !self.create_new => {}
                other => return other,
            }
        }
        // Between the lookup and the open, a rename may replace the file the path named (a
        // checkpoint committed): the old one is gone, and the path now names the new one.
        let mut tries = 0;
        loop {
            let inode = client.resolve(path, true).await?;
            match self.open_named(client, inode, Some(path)).await {
                Err(e) if e.is(FsErrorKind::Stale) && tries < MAX_REOPEN => tries += 1,
                other => return other,
            }
        }
    }

    /// Opens (creating it, with `create`) the entry `name` of directory `parent`.
    pub async fn open_in(&self, client: &Client, parent: proto::Fid, name: &[u8]) -> Result<File> {
        if self.create || self.create_new {
            if let Some(f) = self.create_ahead(client, parent, name).await {
                return f;
            }
            // One round trip: the MDS creates the file, or (without O_EXCL) finds it there and
            // opens it, counting the open either way.
            let m = Mutation::Create {
                parent,
                name: name.to_vec(),
                kind: Kind::File,
                mode: self.mode.unwrap_or(0o644),
                exclusive: self.create_new,
                target: vec![],
                layout: self.new_file_layout()?,
            };
            let (counted, created) = Self::create_counted(client, m).await?;
            let inode = counted.inode.clone();
            if !created {
                // An existing file: opened with the access its mode gives, as any open.
                if let Err(e) = self.check_access(client, &inode) {
                    let _ = client.close_handle(counted.handle, inode.fid).await;
                    return Err(e);
                }
            }
            return self.open_counted(client, inode, Some(counted), None).await;
        }
        let inode = client.lookup(parent, name).await?;
        self.open_inode(client, inode).await
    }

    /// Creates a regular file with no name in directory `parent` (open(2)'s O_TMPFILE) and
    /// opens it, in one round trip: the MDS keeps it while a handle holds it, and it is gone
    /// after the last close unless a link names it first ([`Client::link_fid`]). Needs write
    /// access; the mode is as for a create.
    pub async fn open_unnamed(&self, client: &Client, parent: proto::Fid) -> Result<File> {
        if !self.write {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                "a file with no name is opened for writing",
            ));
        }
        let m = Mutation::CreateUnnamed {
            parent,
            mode: self.mode.unwrap_or(0o600),
            layout: self.new_file_layout()?,
        };
        let (counted, _) = Self::create_counted(client, m).await?;
        let inode = counted.inode.clone();
        self.open_counted(client, inode, Some(counted), None).await
    }

    /// Sends create `m` with a new handle, so the MDS counts the open with it (one round
    /// trip), and records the handle: the open counted, and whether the file was made now.
    async fn create_counted(client: &Client, m: Mutation) -> Result<(Counted, bool)> {
        let handle = client.handle(client.inner.opens.next_handle());
        let replays = client.inner.opens.replays();
        let done = client.reint_with(m, Some(handle)).await?;
        let inode = done
            .inode
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))?;
        client.opened(handle, inode.fid, replays).await?;
        let counted = Counted {
            inode,
            handle,
            gen: done.size_gen,
            grant: done.grant.unwrap_or_default(),
            mdt: None,
            kept: None,
        };
        Ok((counted, done.created))
    }

    /// Creates and opens the file without waiting for the MDS, when the client's leases let
    /// it ([`Client::create_ahead`]): its objects come with the MDS's answer, which the first
    /// read or write waits for.
    async fn create_ahead(
        &self,
        client: &Client,
        parent: proto::Fid,
        name: &[u8],
    ) -> Option<Result<File>> {
        let layout = match self.new_file_layout() {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        if layout.is_some() {
            return None;
        }
        let handle = client.handle(client.inner.opens.next_handle());
        let mode = self.mode.unwrap_or(0o644);
        let (inode, sent) = match client
            .create_ahead(parent, name, mode, Some(handle))
            .await?
        {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        let caps = Arc::new(Caps::new(
            inode.fid,
            handle,
            client.creds().clone(),
            Grant::default(),
        ));
        client.inner.writes.opened(inode.fid);
        Some(Ok(File {
            client: client.clone(),
            inode: Mutex::new(inode),
            caps,
            handle,
            size_gen: AtomicU64::new(0),
            append: self.append,
            writable: self.write || self.append,
            written_to: AtomicU64::new(0),
            lost_from: AtomicU64::new(u64::MAX),
            closed: AtomicBool::new(false),
            unpublished: AtomicBool::new(false),
            ahead: Some(sent),
            created_in: Some(parent),
            recalls_at_create: client.lease_recalls(),
            behind: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            taking_in: Mutex::new(()),
            mdt: Mutex::new(None),
            evictions_seen: AtomicU64::new(client.evictions()),
        }))
    }

    /// Opens the file `fid` in one round trip: the MDS counts the open and answers with its
    /// attributes as of now (close-to-open); the access asked for is then checked, and the open
    /// undone if it is refused.
    pub async fn open_fid(&self, client: &Client, fid: proto::Fid) -> Result<File> {
        let counted = Self::count_open(client, fid, None, self.rights()).await?;
        let checked = self
            .check_access(client, &counted.inode)
            .and_then(|()| self.kind_opens(&counted.inode));
        if let Err(e) = checked {
            let _ = client.close_handle(counted.handle, fid).await;
            return Err(e);
        }
        self.open_counted(client, counted.inode.clone(), Some(counted), None)
            .await
    }

    /// Has the MDS count an open of `fid` under a new handle, or takes a handle kept past its
    /// close that allows `rights` ([`crate::kept`]); the file's attributes as of now and the
    /// capabilities for its objects.
    async fn count_open(
        client: &Client,
        fid: proto::Fid,
        path: Option<&str>,
        rights: u8,
    ) -> Result<Counted> {
        // Close-to-open with this client's own closes finishing behind.
        if path.is_some() {
            client.after_closings().await;
        } else {
            client.after_closing(fid).await;
        }
        let inner = &client.inner;
        let (kept, stale) = inner.kept.take(&inner.leases, fid, client.creds(), rights);
        client.close_unkept(stale.into_iter().map(|e| (fid, e)));
        if let Some((e, inode)) = kept {
            return Ok(Counted {
                inode,
                handle: e.handle,
                gen: e.gen,
                grant: Grant::default(),
                mdt: None,
                kept: Some(e.caps),
            });
        }
        let handle = client.handle(client.inner.opens.next_handle());
        let replays = client.inner.opens.replays();
        let mds = client.inner.mds.clone();
        let leases = &client.inner.leases;
        let open = MdsOpen {
            fid,
            handle,
            creds: client.creds().clone(),
            path: path.map(str::to_owned),
            lease: leases.live().then_some(client.inner.client_id()),
        };
        let stamp = leases.stamp();
        let opened = client.rpc(&mds, &open).await?;
        leases.learn_attr(stamp, &opened.inode, opened.leased);
        client.opened(handle, fid, replays).await?;
        let mdt = opened
            .inode
            .layout
            .as_ref()
            .is_some_and(|l| l.mdt_end().is_some())
            .then_some(MdtCopy {
                bytes: opened.mdt,
                stamp,
            });
        Ok(Counted {
            inode: opened.inode,
            handle,
            gen: opened.size_gen,
            grant: opened.grant,
            mdt,
            kept: None,
        })
    }

    /// The rights on objects this open needs.
    fn rights(&self) -> u8 {
        let mut r = 0;
        if self.read {
            r |= proto::capa::READ;
        }
        if self.write || self.append || self.truncate {
            r |= proto::capa::WRITE;
        }
        r
    }

    /// Opens a file already looked up, if the client's credentials allow the access asked for.
    pub async fn open_inode(&self, client: &Client, inode: Inode) -> Result<File> {
        self.open_named(client, inode, None).await
    }

    /// As [`OpenOptions::open_inode`], naming the path the file was found at (the MDS's audit
    /// log records it).
    async fn open_named(&self, client: &Client, inode: Inode, path: Option<&str>) -> Result<File> {
        self.check_access(client, &inode)?;
        self.open_counted(client, inode, None, path).await
    }

    /// Only regular files are opened here (a directory, a symlink or a special file is not).
    fn kind_opens(&self, inode: &Inode) -> Result<()> {
        let (kind, what) = match inode.kind {
            Kind::File => return Ok(()),
            Kind::Dir => (FsErrorKind::IsDir, "a directory"),
            Kind::Symlink => (FsErrorKind::Loop, "a symlink"),
            _ => (
                FsErrorKind::NoDevice,
                "a special file, opened by the kernel",
            ),
        };
        Err(ClientError::fs(kind, format!("{} is {what}", inode.fid)))
    }

    /// Whether the client's credentials allow the access asked for on an existing file.
    fn check_access(&self, client: &Client, inode: &Inode) -> Result<()> {
        let want = if self.read { 4 } else { 0 }
            | if self.write || self.append || self.truncate {
                2
            } else {
                0
            };
        if inode.kind == Kind::File && !inode.permits(client.creds(), want) {
            return Err(ClientError::fs(
                FsErrorKind::AccessDenied,
                format!("permission denied on {}", inode.fid),
            ));
        }
        Ok(())
    }

    /// Opens `inode`; with `counted`, the handle the MDS already counted this open under and
    /// the file's size generation then.
    async fn open_counted(
        &self,
        client: &Client,
        inode: Inode,
        counted: Option<Counted>,
        path: Option<&str>,
    ) -> Result<File> {
        self.kind_opens(&inode)?;
        // Counted open at the MDS: if the file loses its last name meanwhile, its objects stay
        // until this handle closes. Its answer is the freshest view of the file.
        let Counted {
            inode,
            handle,
            gen,
            grant,
            mdt,
            kept,
        } = match counted {
            Some(c) => c,
            None => Self::count_open(client, inode.fid, path, self.rights()).await?,
        };
        let caps = match kept {
            Some(caps) => caps,
            None => {
                client
                    .inner
                    .grants
                    .remember(inode.fid, client.creds(), &grant);
                Arc::new(Caps::new(inode.fid, handle, client.creds().clone(), grant))
            }
        };
        // The MDS decides with the identity it maps this client's to (root squashed on an
        // untrusted node): an access it did not grant is refused here, at the open.
        if !caps.allows(self.rights()) {
            let _ = client.close_handle(handle, inode.fid).await;
            return Err(ClientError::fs(
                FsErrorKind::AccessDenied,
                format!("permission denied on {}", inode.fid),
            ));
        }
        let file = File {
            client: client.clone(),
            inode: Mutex::new(inode),
            caps,
            handle,
            size_gen: AtomicU64::new(gen),
            append: self.append,
            writable: self.write || self.append,
            written_to: AtomicU64::new(0),
            lost_from: AtomicU64::new(u64::MAX),
            closed: AtomicBool::new(false),
            unpublished: AtomicBool::new(false),
            ahead: None,
            created_in: None,
            behind: AtomicBool::new(false),
            recalls_at_create: 0,
            ready: AtomicBool::new(true),
            taking_in: Mutex::new(()),
            mdt: Mutex::new(mdt),
            evictions_seen: AtomicU64::new(client.evictions()),
        };
        client.inner.writes.opened(file.inode.lock().fid);
        if self.truncate && (self.write || self.append) {
            file.set_len(0).await?;
        }
        Ok(file)
    }
}

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

/// The pieces of `offset..offset+len` in `layout` (one mirror), each with its object and that
/// object's server.
async fn plan_in(
    client: &Client,
    layout: &Layout,
    offset: u64,
    len: u64,
) -> Result<Vec<(proto::layout::Piece, StripeObject, Nid)>> {
    {
        let pieces = layout.pieces(offset, len)?;
        let objects: Vec<StripeObject> = pieces
            .iter()
            .map(|p| layout.components[p.component].objects[p.stripe as usize])
            .collect();
        let servers = client
            .servers_of(&objects.iter().map(|o| o.target).collect())
            .await?;
        Ok(pieces
            .into_iter()
            .zip(objects)
            .map(|(p, o)| (p, o, servers[&o.target].clone()))
            .collect())
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

    /// Writes all of `data` at `offset` (at the end, for a file opened to append); returns the
    /// offset written at.
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<u64> {
        if data.is_empty() {
            return Ok(offset);
        }
        let region = Arc::new(self.client.register(data.to_vec())?);
        self.write_from(offset, region, 0, data.len() as u64).await
    }

    /// Writes `len` bytes of `region` (from `region_offset`) at `offset`: the storage servers
    /// pull the bytes straight from the registered memory, with no copy on this side. Returns
    /// the offset written at (the end of the file, for a file opened to append).
    pub async fn write_from<B: std::any::Any + Send + Sync>(
        &self,
        offset: u64,
        region: Arc<Registered<B>>,
        region_offset: u64,
        len: u64,
    ) -> Result<u64> {
        if !self.writable {
            return Err(ClientError::fs(
                FsErrorKind::BadHandle,
                "the file is not open for writing",
            ));
        }
        // An append waits for the appends before it from this client (any handle, any
        // process of a mount) and goes where the last of them ended: it finds that end in the
        // size each publishes before letting the next go, and in the client's own count.
        let turn = match self.append {
            true => Some(
                self.client
                    .inner
                    .writes
                    .append_turn(self.fid())
                    .lock_owned()
                    .await,
            ),
            false => None,
        };
        let offset = if self.append {
            let mine = self.client.inner.writes.end_of(self.fid());
            self.size().await?.max(mine)
        } else {
            offset
        };
        if len == 0 {
            return Ok(offset);
        }
        if region_offset
            .checked_add(len)
            .is_none_or(|e| e > region.len())
        {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                "the write does not fit the region",
            ));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= proto::md::MAX_FILE_SIZE)
            .ok_or_else(|| {
                ClientError::fs(FsErrorKind::FileTooLarge, "past the file size limit")
            })?;
        let layout = self.layout_ready().await?;
        if layout.components.iter().map(|c| c.end).max().unwrap_or(0) < end {
            return Err(ClientError::fs(
                FsErrorKind::FileTooLarge,
                "past the last component of the file's layout",
            ));
        }
        // The bytes the MDS keeps go to it, each write a change of the file it journals;
        // the rest to the objects.
        let mut on_mdt = 0;
        if let Some(mdt_end) = layout.mdt_end().filter(|e| offset < *e) {
            on_mdt = len.min(mdt_end - offset);
            let data = region.read(region_offset, on_mdt)?.as_slice().to_vec();
            self.write_mdt(offset, &data).await?;
        }
        if on_mdt < len {
            self.write_copies(
                offset + on_mdt,
                &region,
                region_offset + on_mdt,
                len - on_mdt,
                None,
            )
            .await?;
            // The MDS grew the size for the part it keeps; the objects' end is published.
            self.unpublished.store(true, Ordering::SeqCst);
        }
        self.written_to.fetch_max(end, Ordering::Relaxed);
        self.client.inner.writes.wrote_to(self.fid(), end);
        if turn.is_some() {
            self.publish_size().await?;
        }
        drop(turn);
        Ok(offset)
    }

    /// Writes `data` at `offset` into the part of the file the MDS keeps (Data-on-MDT),
    /// through this handle.
    async fn write_mdt(&self, offset: u64, data: &[u8]) -> Result<()> {
        let fid = self.inode.lock().fid;
        let mut at = offset;
        for chunk in data.chunks(proto::md::MAX_MDT_WRITE) {
            let m = Mutation::WriteMdt {
                fid,
                offset: at,
                data: chunk.to_vec(),
            };
            let done = self.client.reint_with(m, Some(self.handle)).await?;
            if let Some(i) = done.inode {
                *self.inode.lock() = i;
            }
            at += chunk.len() as u64;
        }
        Ok(())
    }

    /// `len` bytes at `offset` of the part of the file the MDS keeps, zeros past what it
    /// holds: from the copy this handle read last while the file's lease shows nothing
    /// changed it since, else from the MDS (which leases the file again).
    async fn read_mdt(&self, mdt_end: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        let cut = |bytes: &[u8]| {
            let mut out = vec![0u8; len as usize];
            let from = (offset as usize).min(bytes.len());
            let have = (bytes.len() - from).min(len as usize);
            out[..have].copy_from_slice(&bytes[from..from + have]);
            out
        };
        let fid = self.inode.lock().fid;
        let leases = &self.client.inner.leases;
        if let Some(c) = &*self.mdt.lock() {
            if c.stamp == leases.stamp() && leases.holds(fid) {
                return Ok(cut(&c.bytes));
            }
        }
        let stamp = leases.stamp();
        let r = MdsReadMdt {
            fid,
            handle: Some(self.handle),
            creds: self.client.creds().clone(),
            offset: 0,
            len: u32::try_from(mdt_end.min(proto::layout::MAX_MDT_SIZE)).unwrap_or(u32::MAX),
            lease: leases.live().then_some(self.client.inner.client_id()),
        };
        match self.client.rpc(&self.client.inner.mds.clone(), &r).await {
            Ok(got) => {
                leases.learn_attr(stamp, &got.inode, got.leased);
                let out = cut(&got.data);
                *self.mdt.lock() = Some(MdtCopy {
                    bytes: got.data,
                    stamp,
                });
                Ok(out)
            }
            // The file lost its last name while this handle holds it: nobody can change it
            // but other holders, and the bytes are those this handle read last.
            Err(e) if e.is(FsErrorKind::Stale) => match &*self.mdt.lock() {
                Some(c) => Ok(cut(&c.bytes)),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Writes `len` bytes of `region` at `offset` to every copy in sync (or to copy `only`,
    /// for a resync: its failure is returned, not marked).
    async fn write_copies<B: std::any::Any + Send + Sync>(
        &self,
        offset: u64,
        region: &Arc<Registered<B>>,
        region_offset: u64,
        len: u64,
        only: Option<u16>,
    ) -> Result<()> {
        // Every copy in sync gets the write; one whose server does not answer within the
        // failover time is marked stale before the write is acknowledged.
        let layout = self.layout_ready().await?;
        let stale = layout.stale_mirrors();
        let failover = self.failover(&layout);
        let mirrors: Vec<u16> = match only {
            Some(m) => vec![m],
            None => (0..layout.mirror_count())
                .filter(|m| !stale.contains(m))
                .collect(),
        };
        let mut planned = vec![];
        for &m in &mirrors {
            let of_mirror = plan_in(&self.client, &layout.mirror(m), offset, len).await?;
            planned.extend(of_mirror.into_iter().map(|x| (m, x)));
        }
        let windows: std::collections::HashMap<u32, Arc<Semaphore>> = planned
            .iter()
            .map(|(_, (_, o, _))| (o.target, self.client.window(o.target)))
            .collect();
        let mut tasks = JoinSet::new();
        for (mirror, (p, obj, oss)) in planned {
            // Its place in the order is taken now, in the caller's order.
            let ticket =
                self.client
                    .inner
                    .writes
                    .begin(obj, p.object_offset, p.object_offset + p.len);
            let window = windows[&obj.target].clone();
            let (client, region) = (self.client.clone(), region.clone());
            let caps = self.caps.clone();
            lnet::job::spawn_in(&mut tasks, async move {
                let r = async {
                    // Before taking a slot of the window: a write holding one never waits for
                    // another that needs one.
                    ticket.ready().await;
                    let _slot = window
                        .acquire_owned()
                        .await
                        .map_err(|_| ClientError::fs(FsErrorKind::Io, "closed"))?;
                    let desc = region.desc(
                        region_offset + (p.file_offset - offset),
                        p.len as u32,
                        true,
                    )?;
                    let w = |capa| OstWrite {
                        target: obj.target,
                        fid: obj.fid,
                        offset: p.object_offset,
                        desc: desc.clone(),
                        sync: false,
                        stamp: ticket.stamp,
                        capa,
                    };
                    let r = caps
                        .rpc_within(&client, &oss, obj.target, obj.fid, w, failover)
                        .await;
                    drop(ticket);
                    r.map(|r| (obj, r.epoch))
                }
                .await;
                (mirror, r)
            });
        }
        let fid = self.inode.lock().fid;
        let mut failed: std::collections::BTreeMap<u16, ClientError> = Default::default();
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok((_, Ok((obj, epoch)))) => {
                    self.client.inner.writes.written(fid, obj, epoch);
                }
                Ok((m, Err(e))) => {
                    failed.entry(m).or_insert(e);
                }
                Err(e) => return Err(ClientError::fs(FsErrorKind::Io, e.to_string())),
            }
        }
        if mirrors.iter().all(|m| failed.contains_key(m)) || (only.is_some() && !failed.is_empty())
        {
            return Err(failed.into_values().next().unwrap_or_else(|| {
                ClientError::fs(FsErrorKind::Io, LayoutError::AllStale.to_string())
            }));
        }
        for (m, e) in &failed {
            self.mark_stale(&layout, *m, e).await?;
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` from copy `mirror` alone, in sync or not (holes and the
    /// end of its objects read as zeros): to compare copies.
    pub async fn read_copy(&self, mirror: u16, offset: u64, len: u64) -> Result<Vec<u8>> {
        let layout = self.layout_ready().await?;
        if mirror >= layout.mirror_count() {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                format!("the file has no mirror {mirror}"),
            ));
        }
        let region = self.client.register(vec![0u8; len as usize])?;
        let plan = plan_in(&self.client, &layout.mirror(mirror), offset, len).await?;
        // Every piece at once, each within its target's window.
        let reads = plan.into_iter().map(|(p, obj, oss)| {
            let region = &region;
            async move {
                let at = p.file_offset - offset;
                let desc = region.desc(at, p.len as u32, false)?;
                let window = self.client.window(obj.target);
                let done = read_piece(
                    &self.client,
                    &self.caps,
                    &window,
                    &oss,
                    obj,
                    p.object_offset,
                    &desc,
                )
                .await?;
                let got = u64::from(done.bytes).min(p.len);
                if got < p.len {
                    region.dma(at + got, p.len - got, true)?.copy_in(&vec![
                        0u8;
                        (p.len - got)
                            as usize
                    ])?;
                }
                Ok::<_, ClientError>(())
            }
        });
        futures_util::future::try_join_all(reads).await?;
        Ok(region.read(0, len)?.as_slice().to_vec())
    }

    /// Brings every stale copy of the file back in sync from one in sync (see
    /// [`File::resync_limited`]); returns the bytes copied.
    pub async fn resync(&self, progress: impl FnMut(u64, u64)) -> Result<u64> {
        self.resync_limited(progress, None).await
    }

    /// Adds a copy to the file: a new mirror on servers that hold no other copy, placed by
    /// the MDS with the stripe pattern of mirror 0, then filled by a resync. Returns the
    /// bytes copied.
    pub async fn extend_mirror(&self, progress: impl FnMut(u64, u64)) -> Result<u64> {
        let layout = self.layout_ready().await?;
        self.place_mirror(layout.mirror_count(), layout.generation, &[])
            .await?;
        self.resync_limited(progress, None).await
    }

    /// Marks `mirror` stale at the MDS (its copy is lost or must be rebuilt), unless it is the
    /// last copy in sync, which the MDS refuses.
    pub async fn mark_mirror_stale(&self, mirror: u16, why: &str) -> Result<()> {
        let layout = self.layout_ready().await?;
        if layout.stale_mirrors().contains(&mirror) {
            return Ok(());
        }
        tracing::warn!(fid = %self.inode.lock().fid, mirror, why, "marking a mirror stale");
        self.mark_stale_quietly(&layout, mirror, &ClientError::fs(FsErrorKind::Io, why))
            .await
    }

    /// Asks the MDS for new objects for `mirror` (stale, or one past the last), at the
    /// layout's `generation`, and takes the layout it answers with.
    async fn place_mirror(&self, mirror: u16, generation: u32, exclude: &[u32]) -> Result<()> {
        let fid = self.inode.lock().fid;
        let m = Mutation::PlaceMirror {
            fid,
            mirror,
            generation,
            exclude: exclude.to_vec(),
            components: vec![],
        };
        let r = self.client.reint_if(m, Some(self.handle), None).await?;
        if let Some(i) = r.inode {
            self.inode.lock().layout = i.layout;
        }
        Ok(())
    }

    /// Brings every stale copy of the file back in sync from one in sync, copying at most
    /// `rate` bytes a second when given. For each stale copy: the MDS places it on new
    /// objects (on servers up now and holding no other copy; the old objects go to the
    /// destroy queue), the file's bytes are copied over (all-zero chunks left as holes), its
    /// objects cut to the size and synced, the whole copy compared with the source, and the
    /// copy marked in sync at the MDS if the layout did not change meanwhile. Returns the
    /// bytes copied. The handle must be open for writing. A write made through another
    /// handle during the resync is caught by the comparison only if it lands before it;
    /// resync files that are not being written.
    pub async fn resync_limited(
        &self,
        progress: impl FnMut(u64, u64),
        rate: Option<u64>,
    ) -> Result<u64> {
        self.resync_avoiding(progress, rate, &[]).await
    }

    /// As [`File::resync_limited`], placing the copies on none of the targets in `exclude`.
    pub async fn resync_avoiding(
        &self,
        mut progress: impl FnMut(u64, u64),
        rate: Option<u64>,
        exclude: &[u32],
    ) -> Result<u64> {
        use futures_util::StreamExt;
        const CHUNK: u64 = 4 << 20;
        const IN_FLIGHT: usize = 4;
        let started = tokio::time::Instant::now();
        let mut copied = 0;
        let fid = self.inode.lock().fid;
        for _attempt in 0..3 {
            let size = self.size().await?;
            let layout = self.layout_ready().await?;
            let stale = layout.stale_mirrors();
            if stale.is_empty() {
                return Ok(copied);
            }
            let Some(src) = (0..layout.mirror_count()).find(|m| !stale.contains(m)) else {
                return Err(ClientError::fs(
                    FsErrorKind::Io,
                    format!("{fid}: {}", LayoutError::AllStale),
                ));
            };
            let total = size * stale.len() as u64;
            let mut changed = false;
            for (k, &m) in stale.iter().enumerate() {
                let generation = self.layout_ready().await?.generation;
                match self.place_mirror(m, generation, exclude).await {
                    Ok(()) => {}
                    Err(e) if e.is(FsErrorKind::Stale) => {
                        changed = true;
                        break;
                    }
                    Err(e) => {
                        return Err(ClientError::fs(
                            e.kind(),
                            format!("{fid}: no new place for mirror {m}: {e}"),
                        ))
                    }
                }
                let copy = self.layout_ready().await?.mirror(m);
                // Chunks copied a few at a time, so that every server of both copies is busy.
                let chunks = (0..size).step_by(CHUNK as usize).map(|at| {
                    let n = CHUNK.min(size - at);
                    async move {
                        let bytes = self.read_copy(src, at, n).await?;
                        if !bytes.iter().any(|&b| b != 0) {
                            return Ok::<_, ClientError>((n, 0));
                        }
                        let region = Arc::new(self.client.register(bytes)?);
                        self.write_copies(at, &region, 0, n, Some(m)).await?;
                        Ok((n, n))
                    }
                });
                let mut chunks = futures_util::stream::iter(chunks).buffered(IN_FLIGHT);
                let mut at = 0;
                while let Some(r) = chunks.next().await {
                    let (n, written) = r?;
                    copied += written;
                    at += n;
                    progress(k as u64 * size + at, total);
                    if let Some(rate) = rate.filter(|r| *r > 0) {
                        let due = std::time::Duration::from_secs_f64(copied as f64 / rate as f64);
                        tokio::time::sleep_until(started + due).await;
                    }
                }
                drop(chunks);
                self.truncate_objects(copy.clone(), size, None).await?;
                self.sync_objects(&copy).await?;
                // The copy must now read as the source does.
                let compares = (0..size).step_by(CHUNK as usize).map(|at| {
                    let n = CHUNK.min(size - at);
                    async move {
                        let (a, b) =
                            tokio::try_join!(self.read_copy(src, at, n), self.read_copy(m, at, n))?;
                        Ok::<_, ClientError>((at, a == b))
                    }
                });
                let mut compares = futures_util::stream::iter(compares).buffered(IN_FLIGHT);
                while let Some(r) = compares.next().await {
                    let (at, same) = r?;
                    if !same {
                        return Err(ClientError::fs(
                            FsErrorKind::Io,
                            format!(
                                "{fid}: mirror {m} differs from mirror {src} at {at} after its resync (written meanwhile?)"
                            ),
                        ));
                    }
                }
            }
            if !changed {
                for &m in &stale {
                    let clear = Mutation::MirrorState {
                        fid,
                        mirror: m,
                        stale: false,
                        generation: self.layout_ready().await?.generation,
                    };
                    match self.client.reint_if(clear, Some(self.handle), None).await {
                        Ok(r) => {
                            if let Some(i) = r.inode {
                                self.inode.lock().layout = i.layout;
                            }
                        }
                        Err(e) if e.is(FsErrorKind::Stale) => changed = true,
                        Err(e) => return Err(e),
                    }
                }
            }
            if !changed {
                return Ok(copied);
            }
            // The layout changed under the resync: start again from what it is now.
            if let Ok(i) = self.client.getattr(fid).await {
                *self.inode.lock() = i;
            }
        }
        Err(ClientError::fs(
            FsErrorKind::Io,
            "the file's layout kept changing during its resync",
        ))
    }

    /// Makes every object of `layout` (one copy) durable.
    async fn sync_objects(&self, layout: &Layout) -> Result<()> {
        let targets = layout
            .components
            .iter()
            .flat_map(|c| c.objects.iter().map(|o| o.target))
            .collect();
        let servers = self.oss_of(&targets).await?;
        for o in layout.components.iter().flat_map(|c| &c.objects) {
            let sync = |capa| OstSync {
                target: o.target,
                fid: o.fid,
                capa,
            };
            self.caps
                .rpc(&self.client, &servers[&o.target], o.target, o.fid, sync)
                .await?;
        }
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `offset` into `buf`; returns how many (short only at
    /// the end of the file). Holes read as zeros.
    pub async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let chunk = self.read_chunk(offset, buf.len()).await?;
        buf[..chunk.len()].copy_from_slice(&chunk);
        Ok(chunk.len())
    }

    /// Reads up to `len` bytes at `offset` straight into `region` at `region_offset`: the
    /// storage servers put the bytes there, with no copy on this side. Returns how many.
    ///
    /// Host memory is checked against the crc32c each server took from the data it read
    /// (end to end); a piece that does not match is read once more, then reported as
    /// [`ClientError::Checksum`]. Device memory (a region from
    /// [`lnet::Transport::register_device`]) is not visible to the CPU: its bytes were checked
    /// by the servers only.
    pub async fn read_into<B: std::any::Any + Send + Sync>(
        &self,
        offset: u64,
        region: &Registered<B>,
        region_offset: u64,
        len: u64,
    ) -> Result<usize> {
        let size = self.readable_size();
        if offset >= size || len == 0 {
            return Ok(0);
        }
        let len = len.min(size - offset);
        if region_offset
            .checked_add(len)
            .is_none_or(|e| e > region.len())
        {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                "the read does not fit the region",
            ));
        }
        let host = region.kind() == lnet::MemoryKind::Host;
        let layout = self.layout_ready().await?;
        let total = len;
        // The part the MDS keeps comes from it (or from what this handle read last).
        let (offset, region_offset, len) = match layout.mdt_end().filter(|e| offset < *e) {
            Some(mdt_end) => {
                let n = len.min(mdt_end - offset);
                let bytes = self.read_mdt(mdt_end, offset, n).await?;
                region.dma(region_offset, n, true)?.copy_in(&bytes)?;
                if n == len {
                    return Ok(len as usize);
                }
                (offset + n, region_offset + n, len - n)
            }
            None => (offset, region_offset, len),
        };
        // Each stripe unit is read from one copy in sync, the units spread over the copies;
        // a copy that fails (its server does not answer within the failover time, or a piece
        // fails its checksum) is replaced by the next.
        let stale = layout.stale_mirrors();
        let in_sync: Vec<u16> = (0..layout.mirror_count())
            .filter(|m| !stale.contains(m))
            .collect();
        let Some(&first) = in_sync.first() else {
            return Err(ClientError::fs(
                FsErrorKind::Io,
                format!("{}: {}", self.inode.lock().fid, LayoutError::AllStale),
            ));
        };
        let failover = self.failover(&layout);
        let base = layout.mirror(first);
        let mut tasks = JoinSet::new();
        for unit in base.pieces(offset, len)? {
            let spread = (unit.file_offset / base.components[unit.component].stripe_size) as usize;
            let mut tries = vec![];
            for k in 0..in_sync.len() {
                let m = in_sync[(spread + k) % in_sync.len()];
                let mut pieces = vec![];
                for (p, obj, oss) in
                    plan_in(&self.client, &layout.mirror(m), unit.file_offset, unit.len).await?
                {
                    let at = region_offset + (p.file_offset - offset);
                    let desc = region.desc(at, p.len as u32, false)?;
                    pieces.push(Landed {
                        at,
                        piece: p,
                        obj,
                        oss,
                        desc,
                        done: Default::default(),
                        mirror: m,
                    });
                }
                tries.push(pieces);
            }
            // Copies on servers that just failed to answer are tried last.
            tries.sort_by_key(|t| t.iter().any(|l| self.client.shunned(l.obj.target)));
            let client = self.client.clone();
            let caps = self.caps.clone();
            let unit_range = (unit.file_offset, unit.len);
            lnet::job::spawn_in(&mut tasks, async move {
                let last = tries.len() - 1;
                // Copies whose stored bytes failed their checksum: repaired once the read is done.
                let mut corrupt = vec![];
                for (k, mut pieces) in tries.into_iter().enumerate() {
                    let mut failed = None;
                    for l in &mut pieces {
                        let window = client.window(l.obj.target);
                        let r = read_piece_within(
                            &client,
                            &caps,
                            &window,
                            &l.oss,
                            l.obj,
                            l.piece.object_offset,
                            &l.desc,
                            failover,
                        )
                        .await;
                        match r {
                            Ok(done) => l.done = done,
                            Err(e) => {
                                if e.is_corrupt() {
                                    corrupt.push(l.mirror);
                                } else if !e.is(FsErrorKind::AccessDenied) {
                                    client.shun(l.obj.target);
                                }
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    match failed {
                        None => return Ok((pieces, corrupt, unit_range)),
                        Some(e) if k == last => return Err(e),
                        Some(e) => tracing::warn!(
                            mirror = pieces[0].mirror,
                            error = %e,
                            "a mirror failed a read; reading another"
                        ),
                    }
                }
                unreachable!("the last try returns")
            });
        }
        let mut landed = vec![];
        let mut repairs = vec![];
        let mut first_err = None;
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok((l, corrupt, (at, n)))) => {
                    landed.extend(l);
                    repairs.extend(corrupt.into_iter().map(|m| (m, at, n)));
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(ClientError::fs(FsErrorKind::Io, e.to_string()));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for l in &mut landed {
            if host {
                self.verify_piece(region, l).await?;
            }
            // Inside the file's size, what an object does not hold is a hole: zeros.
            let got = u64::from(l.done.bytes).min(l.piece.len);
            if got < l.piece.len {
                let n = l.piece.len - got;
                region
                    .dma(l.at + got, n, true)?
                    .copy_in(&vec![0u8; n as usize])?;
            }
        }
        for (m, at, n) in repairs {
            match self.repair(m, at, n).await {
                Ok(()) => tracing::warn!(
                    fid = %self.inode.lock().fid,
                    mirror = m,
                    offset = at,
                    len = n,
                    "rewrote bytes that failed their checksum from another mirror"
                ),
                Err(e) => tracing::error!(
                    fid = %self.inode.lock().fid,
                    mirror = m,
                    offset = at,
                    error = %e,
                    "could not repair bytes that failed their checksum; the copy stays damaged"
                ),
            }
        }
        Ok(total as usize)
    }

    /// Rewrites `offset..offset+len` of copy `mirror` (whose stored bytes failed a checksum)
    /// from another copy in sync: whole 4 KiB blocks, so that no damaged block is read to keep
    /// part of it. Nothing else writes the damaged copy's range meanwhile is assumed: a
    /// write through another client in between could be undone on this copy.
    pub async fn repair(&self, mirror: u16, offset: u64, len: u64) -> Result<()> {
        const BLOCK: u64 = 4096;
        let layout = self.layout_ready().await?;
        let stale = layout.stale_mirrors();
        let Some(good) = (0..layout.mirror_count()).find(|m| *m != mirror && !stale.contains(m))
        else {
            return Err(ClientError::fs(
                FsErrorKind::Io,
                "no other mirror in sync to repair from",
            ));
        };
        let size = self
            .inode
            .lock()
            .size
            .max(self.written_to.load(Ordering::Relaxed));
        let start = offset / BLOCK * BLOCK;
        let end = (offset + len)
            .div_ceil(BLOCK)
            .saturating_mul(BLOCK)
            .min(size);
        if end <= start {
            return Ok(());
        }
        let bytes = self.read_copy(good, start, end - start).await?;
        let region = Arc::new(self.client.register(bytes)?);
        self.write_copies(start, &region, 0, end - start, Some(mirror))
            .await?;
        // The repaired copy must now read as the good one.
        if self.read_copy(mirror, start, end - start).await?
            != region.read(0, end - start)?.as_slice()
        {
            return Err(ClientError::fs(
                FsErrorKind::Io,
                format!("mirror {mirror} still differs from mirror {good} after its repair"),
            ));
        }
        Ok(())
    }

    /// Checks a piece that landed in host memory against the server's crc32c, reading it
    /// once more on a mismatch (a transfer damaged on the way); a second mismatch is an error
    /// naming the object and the offset.
    async fn verify_piece<B: std::any::Any + Send + Sync>(
        &self,
        region: &Registered<B>,
        l: &mut Landed,
    ) -> Result<()> {
        for attempt in 0..2 {
            let Some(expected) = l.done.crc32c else {
                return Ok(());
            };
            let n = u64::from(l.done.bytes).min(l.piece.len);
            let actual = crc32c::crc32c(region.read(l.at, n)?.as_slice());
            if actual == expected {
                return Ok(());
            }
            if attempt == 1 {
                return Err(ClientError::Checksum {
                    fid: l.obj.fid,
                    target: l.obj.target,
                    object_offset: l.piece.object_offset,
                    file_offset: l.piece.file_offset,
                    len: n,
                    expected,
                    actual,
                });
            }
            tracing::warn!(
                fid = %l.obj.fid,
                target = l.obj.target,
                object_offset = l.piece.object_offset,
                "checksum mismatch on a read; reading the piece again"
            );
            let window = self.client.window(l.obj.target);
            l.done = read_piece(
                &self.client,
                &self.caps,
                &window,
                &l.oss,
                l.obj,
                l.piece.object_offset,
                &l.desc,
            )
            .await?;
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` into device memory `buf` at `buf_offset`, on the
    /// path `io` asks for (see [`crate::gpu`]). Returns what was done: the count (short only
    /// at the end of the file), the path taken, what was verified and how many bytes passed
    /// through host staging. The bytes are on the device when it returns.
    pub async fn read_device(
        &self,
        offset: u64,
        buf: &DeviceBuf,
        buf_offset: u64,
        len: u64,
        io: DeviceIo,
    ) -> Result<Completion> {
        let dst = buf.slice(buf_offset, len).ok_or_else(|| {
            ClientError::fs(
                FsErrorKind::Invalid,
                "the read does not fit the device buffer",
            )
        })?;
        let gpu = self.client.gpu();
        gpu.check(&dst)?;
        let size = self
            .inode
            .lock()
            .size
            .max(self.written_to.load(Ordering::Relaxed));
        let len = len.min(size.saturating_sub(offset));
        let dst = DeviceBuf { len, ..dst };
        let fallback = match self.route(&*gpu, &dst, io.path, "read")? {
            Route::Direct(region) => {
                let n = self.read_into(offset, &region, 0, len).await?;
                return Ok(Completion::direct(n as u64));
            }
            Route::Staged(fallback) => fallback,
        };
        let n = self.read_staged(offset, &dst, io.stream, &gpu).await?;
        Ok(Completion::staged(n, fallback))
    }

    /// The path a device transfer of `buf` takes: direct with `buf` registered, or staged
    /// (with the reason, when `Auto` could not go direct); `Direct` that cannot be honoured is
    /// an error.
    fn route(
        &self,
        gpu: &dyn GpuBackend,
        buf: &DeviceBuf,
        path: IoPath,
        what: &str,
    ) -> Result<Route> {
        if path == IoPath::Staged {
            return Ok(Route::Staged(None));
        }
        match self.direct_region(gpu, buf) {
            Ok(region) => Ok(Route::Direct(region)),
            Err(why) if path == IoPath::Auto => {
                tracing::info!(reason = %why, "device {what} staged through host memory");
                Ok(Route::Staged(Some(why)))
            }
            Err(why) => Err(GpuError::DirectUnavailable(why).into()),
        }
    }

    /// `dst` registered with the transport as device memory, or why it cannot be.
    fn direct_region(
        &self,
        gpu: &dyn GpuBackend,
        dst: &DeviceBuf,
    ) -> std::result::Result<Registered<lnet::DeviceMemory>, String> {
        let mem = gpu.device_memory(dst).map_err(|e| e.to_string())?;
        self.client
            .inner
            .net
            .register_device(mem)
            .map_err(|e| e.to_string())
    }

    /// The staged read: chunks of the ring are filled (and verified) in parallel, and each is
    /// copied to the device as soon as it has landed, while later chunks are on the network.
    async fn read_staged(
        &self,
        offset: u64,
        dst: &DeviceBuf,
        stream: u64,
        gpu: &Arc<dyn GpuBackend>,
    ) -> Result<u64> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let chunk = self.client.inner.staging.chunk() as u64;
        let ring = self.client.inner.cfg.staging_chunks.max(1);
        let mut inflight = FuturesUnordered::new();
        let mut first_err = None;
        let mut at = 0;
        loop {
            while at < dst.len && inflight.len() < ring && first_err.is_none() {
                let n = chunk.min(dst.len - at);
                inflight.push(self.stage_chunk(offset + at, dst.addr + at, n, stream, gpu));
                at += n;
            }
            match inflight.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                None => break,
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(dst.len),
        }
    }

    /// One chunk of a staged read: into a pinned chunk, verified, then copied to `device_addr`.
    async fn stage_chunk(
        &self,
        offset: u64,
        device_addr: u64,
        n: u64,
        stream: u64,
        gpu: &Arc<dyn GpuBackend>,
    ) -> Result<u64> {
        let staging = &self.client.inner.staging;
        let slot = staging.take(&**gpu, &self.client.inner.net).await?;
        let got = self.read_into(offset, &slot.region, 0, n).await? as u64;
        staging.count(got);
        if got < n {
            // Past the end of the file as it is now (it shrank since the size was learnt).
            return Err(ClientError::fs(
                FsErrorKind::Io,
                format!("the file ended at {} during a device read", offset + got),
            ));
        }
        let access = slot.region.read(0, got)?;
        let src = access.as_slice().as_ptr() as usize;
        let gpu = gpu.clone();
        // The copy runs on the GPU's engine; the chunk stays read-locked (and so unchanged)
        // until it is done.
        tokio::task::spawn_blocking(move || {
            // SAFETY: `access` holds `src..src+got` of the registered chunk, which nobody may
            // change while it is held, and it is held until the copy has finished.
            let ticket =
                unsafe { gpu.copy_to_device(device_addr, src as *const u8, got as usize, stream) }?;
            let r = ticket.wait();
            drop(access);
            drop(slot);
            r
        })
        .await
        .map_err(|e| ClientError::fs(FsErrorKind::Io, e.to_string()))??;
        Ok(got)
    }

    /// Writes `len` bytes of device memory `buf` (from `buf_offset`) at `offset`, on the path
    /// `io` asks for. Staged, each chunk is copied into pinned host memory, checksummed there
    /// and sent (verified end to end); direct, the storage servers pull the bytes from device
    /// memory and checksum them on receipt.
    pub async fn write_device(
        &self,
        offset: u64,
        buf: &DeviceBuf,
        buf_offset: u64,
        len: u64,
        io: DeviceIo,
    ) -> Result<Completion> {
        let src = buf.slice(buf_offset, len).ok_or_else(|| {
            ClientError::fs(
                FsErrorKind::Invalid,
                "the write does not fit the device buffer",
            )
        })?;
        let gpu = self.client.gpu();
        gpu.check(&src)?;
        let fallback = match self.route(&*gpu, &src, io.path, "write")? {
            Route::Direct(region) => {
                self.write_from(offset, Arc::new(region), 0, len).await?;
                return Ok(Completion::direct(len));
            }
            Route::Staged(fallback) => fallback,
        };
        let staging = self.client.inner.staging.clone();
        let chunk = staging.chunk() as u64;
        let mut at = 0;
        let offset = if self.append {
            self.size().await?
        } else {
            offset
        };
        while at < len {
            let n = chunk.min(len - at);
            let slot = staging.take(&*gpu, &self.client.inner.net).await?;
            {
                let mut w = slot.region.write(0, n)?;
                let host = w.as_mut_slice().unwrap_or_default();
                gpu.copy_from_device(host, src.addr + at, io.stream)?;
            }
            staging.count(n);
            self.write_from(offset + at, slot.region.clone(), 0, n)
                .await?;
            at += n;
        }
        Ok(Completion::staged(len, fallback))
    }

    /// Makes every write this client made to the file durable (through any handle), its size
    /// visible to everyone, and every namespace change before it committed at the MDS. Every object is synced even when one fails; a failure is
    /// reported and its writes stay to be synced by the next call. Writes a storage target
    /// lost (its machine restarted before they were synced) are reported as EIO by every
    /// call until the client's last handle on the file closes.
    pub async fn fsync(&self) -> Result<()> {
        self.ready().await?;
        let fid = self.inode.lock().fid;
        self.client.after_closing(fid).await;
        let layout = self.layout_ready().await.ok();
        // A stale copy's objects are left to its resync.
        let stale: Vec<StripeObject> = layout
            .iter()
            .flat_map(|l| &l.components)
            .filter(|c| c.stale)
            .flat_map(|c| c.objects.iter().copied())
            .collect();
        let mut unsynced = self.client.inner.writes.unsynced(fid);
        unsynced.retain(|(o, _)| !stale.contains(o));
        let servers = self
            .oss_of(&unsynced.iter().map(|(o, _)| o.target).collect())
            .await?;
        let mut tasks = JoinSet::new();
        let failover = layout.as_ref().and_then(|l| self.failover(l));
        for (o, seen) in unsynced {
            let (client, oss) = (self.client.clone(), servers[&o.target].clone());
            let caps = self.caps.clone();
            lnet::job::spawn_in(&mut tasks, async move {
                let sync = |capa| OstSync {
                    target: o.target,
                    fid: o.fid,
                    capa,
                };
                let ack = match caps
                    .rpc_within(&client, &oss, o.target, o.fid, sync, failover)
                    .await
                {
                    Ok(ack) => ack,
                    Err(e) => {
                        if let ClientError::Net(lnet::NetError::Remote { err, .. }) = &e {
                            if err.code == proto::StatusCode::Io {
                                client.inner.writes.sync_failed(fid, o);
                            }
                        }
                        return Err((o, e));
                    }
                };
                if client.inner.writes.synced(fid, o, seen, ack.epoch) {
                    Ok(())
                } else {
                    Err((
                        o,
                        ClientError::fs(
                            FsErrorKind::Io,
                            format!(
                                "target {} restarted and lost writes to object {} that were not \
                                 yet synced",
                                o.target, o.fid
                            ),
                        ),
                    ))
                }
            });
        }
        // Failures by copy: a copy that lost or could not sync its writes is marked stale
        // when another copy in sync holds them durably; otherwise the failure is reported.
        let mirror_of = |o: &StripeObject| {
            layout.as_ref().and_then(|l| {
                l.components
                    .iter()
                    .find(|c| c.objects.contains(o))
                    .map(|c| c.mirror)
            })
        };
        let mut failed: std::collections::BTreeMap<Option<u16>, ClientError> = Default::default();
        let objects = async {
            while let Some(r) = tasks.join_next().await {
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err((o, e))) => {
                        failed.entry(mirror_of(&o)).or_insert(e);
                    }
                    Err(e) => {
                        failed
                            .entry(None)
                            .or_insert(ClientError::fs(FsErrorKind::Io, e.to_string()));
                    }
                }
            }
        };
        // The size and the file's name and attributes go to the MDS, and are made durable
        // there, while the storage servers sync: this call succeeds only once both have, and
        // a size the MDS has before the bytes are durable is what any close publishes (an
        // unsynced write lost to a power cut reads as it was before, and the writer's fsync
        // reports it).
        let metadata = async {
            self.publish_size().await?;
            // Its create (and every change before it) is durable at the MDS, not only
            // applied.
            self.client.sync_quiet().await
        };
        let ((), metadata) = tokio::join!(objects, metadata);
        metadata?;
        if !failed.is_empty() {
            let Some(layout) = layout.filter(|l| l.mirror_count() > 1) else {
                return Err(failed.into_values().next().expect("not empty"));
            };
            let stale = layout.stale_mirrors();
            let kept = (0..layout.mirror_count())
                .any(|m| !stale.contains(&m) && !failed.contains_key(&Some(m)));
            if failed.contains_key(&None) || !kept {
                return Err(failed.into_values().next().expect("not empty"));
            }
            for (m, e) in &failed {
                self.mark_stale(&layout, m.expect("checked above"), e)
                    .await?;
            }
            // The copies marked stale are durable too before the sync succeeds.
            self.client.sync_quiet().await?;
        }
        // Changes an eviction lost since this handle's open, or its last report.
        self.client.evicted_since(&self.evictions_seen)
    }

    /// How far this handle has written (the size other clients see after `flush`): short of
    /// the first byte that failed to land ([`File::landing_failed`]), if one did.
    pub fn written_to(&self) -> u64 {
        self.written_to
            .load(Ordering::Relaxed)
            .min(self.lost_from.load(Ordering::SeqCst))
    }

    /// Counts a write up to `end` as made, ahead of its landing (write-behind): the size this
    /// handle shows and publishes includes it.
    pub fn issued_to(&self, end: u64) {
        self.written_to.fetch_max(end, Ordering::Relaxed);
        self.client.inner.writes.wrote_to(self.fid(), end);
        self.unpublished.store(true, Ordering::SeqCst);
    }

    /// Whether the handle is open for writing.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Whether writes go to the end of the file whatever their offset (O_APPEND).
    pub fn appends(&self) -> bool {
        self.append
    }

    /// Tells this handle that the file was cut to `size` through another handle, so that it no
    /// longer claims to have written past it.
    pub fn truncated(&self, size: u64) {
        self.written_to.fetch_min(size, Ordering::Relaxed);
        self.cut_loss(size);
        self.client.inner.writes.cut(self.fid(), size);
    }

    /// A write through this handle from `offset` on, acknowledged before it landed (a mount's
    /// write-behind), failed to land. Its bytes are not in the file, and no size this handle
    /// publishes covers them: what was lost reads as the file's end, never as zeros. (The
    /// failure itself is reported by whoever waits for the write.)
    pub fn landing_failed(&self, offset: u64) {
        self.lost_from.fetch_min(offset, Ordering::SeqCst);
        self.client.inner.writes.lost_from(self.fid(), offset);
    }

    /// Makes the size this handle wrote visible to every client (what close(2) does).
    pub async fn flush(&self) -> Result<()> {
        self.publish_size().await
    }

    async fn publish_size(&self) -> Result<()> {
        // Only after new writes: a publish also sets the mtime, which must not undo a utimes
        // made since (as tar does between close and release).
        if !self.unpublished.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        // Never over bytes this handle's writes failed to put there. (Published sizes only
        // grow: what others made the file stays.)
        let end = self
            .written_to
            .load(Ordering::Relaxed)
            .min(self.lost_from.load(Ordering::SeqCst));
        let inode = self.inode.lock().clone();
        let gen = self.size_gen.load(Ordering::SeqCst);
        match publish(&self.client, &inode, &self.caps, self.handle, end, gen).await {
            Ok((i, gen)) => {
                if let Some(i) = i {
                    *self.inode.lock() = i;
                }
                self.size_gen.store(gen, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                // Still to publish: the next flush or fsync tries again.
                self.unpublished.store(true, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Begins closing this handle behind its caller where it may ([`crate::closing`]): a small
    /// file this handle created ahead and wrote, in a directory this client has held alone
    /// since. The caller then lands the handle's writes and hands their outcome to
    /// [`Behind::finish`], while the caller's close returns. `None`: the close waits for
    /// its writes and publishes the size itself, as usual.
    pub fn close_behind(self: &Arc<File>) -> Option<Behind> {
        let parent = self.created_in?;
        let inner = &self.client.inner;
        if !self.writable
            || !self.unpublished.load(Ordering::SeqCst)
            || self.written_to.load(Ordering::Relaxed) > crate::closing::MAX_BEHIND_BYTES
            || !inner.closings.has_room()
        {
            return None;
        }
        // Under the gate a recall is applied under: the recall either came before (and this
        // close waits as usual) or waits for this one.
        let _gate = inner.pending.gate.lock();
        if self.client.lease_recalls() != self.recalls_at_create || !inner.leases.live() {
            return None;
        }
        let fid = self.fid();
        let closing = inner.closings.begin(fid, parent);
        inner.leases.moving(fid);
        self.behind.store(true, Ordering::SeqCst);
        Some(Behind {
            closing,
            file: self.clone(),
            dir: parent,
        })
    }

    /// Whether this handle was closed behind its caller ([`File::close_behind`]).
    pub fn closed_behind(&self) -> bool {
        self.behind.load(Ordering::SeqCst)
    }

    /// Queues the size this handle's writes reached with the changes answered ahead, instead
    /// of sending it and waiting ([`crate::pending`]).
    async fn publish_queued(&self) -> Option<crate::pending::Sent> {
        let inner = &self.client.inner;
        inner.pending.room().await;
        if !self.unpublished.swap(false, Ordering::SeqCst) {
            return None;
        }
        let fid = self.fid();
        let r = proto::md::MdsReint {
            creds: self.client.creds().clone(),
            mutation: Mutation::GrowSize {
                fid,
                size: self.written_to.load(Ordering::Relaxed),
            },
            req: Some(self.client.next_req()),
            acked: 0,
            open: Some(self.handle),
            size_gen: Some(self.size_gen.load(Ordering::SeqCst)),
            behind: true,
            lease: inner.leases.live(),
            time: None,
        };
        Some(inner.pending.push_quiet(proto::md::BatchOp::Reint(r), fid))
    }

    /// Closes the file: its size becomes visible to every client that opens it next
    /// (close-to-open). Data is durable only after `fsync`.
    pub async fn close(self) -> Result<()> {
        let client = self.client.clone();
        let seen = AtomicU64::new(self.evictions_seen.load(Ordering::SeqCst));
        let closed = self.close_here().await;
        // Changes an eviction lost since this handle's open, or its last report.
        closed.and_then(|()| client.evicted_since(&seen))
    }

    async fn close_here(self) -> Result<()> {
        self.closed.store(true, Ordering::SeqCst);
        if !self.ready.load(Ordering::SeqCst) {
            // Created ahead and not used: the close goes after the create, in the queue.
            let fid = self.inode.lock().fid;
            self.client.inner.writes.closed(fid);
            self.client.inner.opens.remove(self.handle.handle);
            if let Some(Err(e)) = self.ahead.as_ref().and_then(|s| s.now()) {
                return Err(e);
            }
            self.client
                .close_ahead(self.handle, fid, self.ahead.as_ref());
            return Ok(());
        }
        let published = self.publish_size().await;
        let fid = self.inode.lock().fid;
        self.client.inner.writes.closed(fid);
        if self.behind.load(Ordering::SeqCst)
            && published.is_ok()
            && self.client.inner.pending.touching(fid).is_some()
        {
            // Closed behind, its size still going with the changes answered ahead: so does
            // the close, which answers nothing.
            self.client.inner.opens.remove(self.handle.handle);
            self.client
                .close_ahead(self.handle, fid, self.ahead.as_ref());
            return Ok(());
        }
        if published.is_ok() {
            // Kept past the close while the file's lease holds: the next open of it here
            // takes the handle without asking the MDS ([`crate::kept`]).
            let inner = &self.client.inner;
            let gen = self.size_gen.load(Ordering::SeqCst);
            if inner
                .kept
                .keep(&inner.leases, fid, self.handle, self.caps.clone(), gen)
                .is_ok()
            {
                return Ok(());
            }
        }
        if published.is_ok() && (self.ahead.is_some() || self.behind.load(Ordering::SeqCst)) {
            // Made or closed behind here: its close goes with the changes answered ahead.
            self.client.inner.opens.remove(self.handle.handle);
            self.client
                .close_ahead(self.handle, fid, self.ahead.as_ref());
            return Ok(());
        }
        self.client.close_handle(self.handle, fid).await?;
        published
    }

    /// Closes the file as [`File::close`] does, for a caller nobody waits on (a mount's
    /// release): a handle whose create or size is still on its way with the changes answered
    /// ahead ([`crate::pending`]) waits for their answer, so that it may be kept past its close
    /// as any other ([`crate::kept`]) and the file opens again here without the MDS.
    pub async fn close_unwaited(self) -> Result<()> {
        let inner = &self.client.inner;
        let fid = self.fid();
        if (self.ahead.is_some() || self.behind.load(Ordering::SeqCst))
            && inner.leases.live()
            && inner.kept.has_room()
        {
            if let Some(last) = inner.pending.touching(fid) {
                inner.pending.answered_to(last).await;
            }
            // Taken in, so that the handle has the objects and capabilities the MDS gave; a
            // create that failed is reported by the close.
            let _ = self.ready().await;
        }
        self.close().await
    }

    /// Truncates or extends the file to `size`.
    pub async fn set_len(&self, size: u64) -> Result<()> {
        if !self.writable {
            return Err(ClientError::fs(
                FsErrorKind::BadHandle,
                "the file is not open for writing",
            ));
        }
        let fid = self.inode.lock().fid;
        if let Ok(layout) = self.layout_ready().await {
            self.on_every_copy(&layout, |ml, failover| {
                self.truncate_objects(ml, size, failover)
            })
            .await?;
        }
        let attr = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        // Truncating through a handle open for writing needs no write permission now (the
        // handle's open was the check), as ftruncate on a file created with mode 0 shows: the
        // MDS sees the open handle.
        let done = self
            .client
            .reint_with(Mutation::Setattr { fid, attr }, Some(self.handle))
            .await?;
        if let Some(i) = done.inode {
            *self.inode.lock() = i;
        }
        // This handle's own truncate: what it writes from now on counts.
        self.size_gen.store(done.size_gen, Ordering::SeqCst);
        self.written_to.store(
            size.min(self.written_to.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        self.cut_loss(size);
        self.client.inner.writes.cut(fid, size);
        Ok(())
    }

    /// The file was cut to `size`: a loss at or past it is no longer in the file.
    fn cut_loss(&self, size: u64) {
        let _ = self
            .lost_from
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |at| {
                (size <= at).then_some(u64::MAX)
            });
    }

    /// Deallocates `[offset, offset + len)`, which then reads as zeros; the size is kept
    /// (fallocate's PUNCH_HOLE | KEEP_SIZE).
    pub async fn punch(&self, offset: u64, len: u64) -> Result<()> {
        if !self.writable {
            return Err(ClientError::fs(
                FsErrorKind::BadHandle,
                "the file is not open for writing",
            ));
        }
        let Ok(layout) = self.layout_ready().await else {
            return Ok(()); // no objects: nothing to deallocate
        };
        let mut offset = offset;
        let end = offset.saturating_add(len).min(proto::md::MAX_FILE_SIZE);
        let fid = self.inode.lock().fid;
        if let Some(mdt_end) = layout.mdt_end().filter(|e| offset < *e) {
            // The MDS's part holds no blocks to free: the range becomes zeros, up to the size.
            let size = self.size().await?;
            let zeros = end.min(mdt_end).min(size).saturating_sub(offset);
            if zeros > 0 {
                self.write_mdt(offset, &vec![0u8; zeros as usize]).await?;
            }
            offset = mdt_end;
        }
        let last = layout.components.iter().map(|c| c.end).max().unwrap_or(0);
        let end = end.min(last);
        if offset >= end {
            return self.touch(true).await;
        }
        let punched = self
            .on_every_copy(&layout, |ml, failover| {
                self.punch_objects(ml, offset, end, failover)
            })
            .await?;
        for (o, epochs) in punched {
            // Each epoch a part went under: a sync under another one reports the loss.
            for epoch in epochs {
                self.client.inner.writes.written(fid, o, epoch);
            }
        }
        self.touch(true).await
    }

    /// Runs `op` on each copy of the file in sync (the whole layout for a file of one copy).
    /// A copy that fails is marked stale when another succeeded; if none did, the first
    /// failure is returned. Returns what the copies that succeeded returned.
    async fn on_every_copy<'a, T, F, Fut>(&'a self, layout: &'a Layout, op: F) -> Result<Vec<T>>
    where
        F: Fn(Layout, Option<std::time::Duration>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<T>>> + 'a,
    {
        let stale = layout.stale_mirrors();
        let failover = self.failover(layout);
        let mut failed = std::collections::BTreeMap::new();
        let mut out = vec![];
        let mut any = false;
        for m in (0..layout.mirror_count()).filter(|m| !stale.contains(m)) {
            match op(layout.mirror(m), failover).await {
                Ok(v) => {
                    out.extend(v);
                    any = true;
                }
                Err(e) => {
                    failed.insert(m, e);
                }
            }
        }
        if !any {
            return Err(failed.into_values().next().unwrap_or_else(|| {
                ClientError::fs(FsErrorKind::Io, LayoutError::AllStale.to_string())
            }));
        }
        for (m, e) in &failed {
            self.mark_stale(layout, *m, e).await?;
        }
        Ok(out)
    }

    /// Cuts every object of `layout` (one copy) to what a file of `size` bytes holds.
    async fn truncate_objects(
        &self,
        layout: Layout,
        size: u64,
        failover: Option<std::time::Duration>,
    ) -> Result<Vec<()>> {
        let mut targets = HashSet::new();
        for c in &layout.components {
            targets.extend(c.objects.iter().map(|o| o.target));
        }
        let servers = self.oss_of(&targets).await?;
        for c in &layout.components {
            for (k, o) in c.objects.iter().enumerate() {
                let osize = c.object_size(k as u64, size);
                // In this client's order with its writes to the object: after the ones asked
                // for before it, and never applied over one asked for after it.
                let ticket = self.client.inner.writes.begin(*o, osize, u64::MAX);
                ticket.ready().await;
                let stamp = ticket.stamp;
                let truncate = |capa| OstTruncate {
                    target: o.target,
                    fid: o.fid,
                    size: osize,
                    stamp,
                    capa,
                };
                self.caps
                    .rpc_within(
                        &self.client,
                        &servers[&o.target],
                        o.target,
                        o.fid,
                        truncate,
                        failover,
                    )
                    .await?;
            }
        }
        Ok(vec![])
    }

    /// Deallocates `offset..end` in the objects of `layout` (one copy); returns the epochs
    /// each object's parts went under.
    async fn punch_objects(
        &self,
        layout: Layout,
        offset: u64,
        end: u64,
        failover: Option<std::time::Duration>,
    ) -> Result<Vec<(StripeObject, Vec<u64>)>> {
        let pieces = layout
            .pieces(offset, end.saturating_sub(offset))
            .map_err(|e| ClientError::fs(FsErrorKind::Invalid, e.to_string()))?;
        // One extent per object: the pieces of one object are contiguous in it.
        let mut extents: Vec<(StripeObject, u64, u64)> = vec![];
        for p in pieces {
            let o = layout.components[p.component].objects[p.stripe as usize];
            match extents.iter_mut().find(|(x, ..)| *x == o) {
                Some((_, from, to)) if *to == p.object_offset => *to += p.len,
                Some((_, from, to)) => {
                    *from = (*from).min(p.object_offset);
                    *to = (*to).max(p.object_offset + p.len);
                }
                None => extents.push((o, p.object_offset, p.object_offset + p.len)),
            }
        }
        let targets = extents.iter().map(|(o, ..)| o.target).collect();
        let servers = self.oss_of(&targets).await?;
        let mut calls = JoinSet::new();
        for (o, from, to) in extents {
            let (client, peer) = (self.client.clone(), servers[&o.target].clone());
            let caps = self.caps.clone();
            lnet::job::spawn_in(&mut calls, async move {
                // A server does a bounded amount of work per request: a large hole takes several.
                let mut at = from;
                let mut epochs = vec![];
                while at < to {
                    let len = (to - at).min(proto::ost::MAX_PUNCH);
                    let ticket = client.inner.writes.begin(o, at, at + len);
                    ticket.ready().await;
                    let stamp = ticket.stamp;
                    let punch = |capa| OstPunch {
                        target: o.target,
                        fid: o.fid,
                        offset: at,
                        len,
                        stamp,
                        capa,
                    };
                    let ack = caps
                        .rpc_within(&client, &peer, o.target, o.fid, punch, failover)
                        .await?;
                    epochs.push(ack.epoch);
                    at += len;
                }
                Ok::<_, ClientError>((o, epochs))
            });
        }
        let mut out = vec![];
        while let Some(r) = calls.join_next().await {
            out.push(r.map_err(|e| ClientError::fs(FsErrorKind::Io, e.to_string()))??);
        }
        Ok(out)
    }

    /// Marks the file changed (ctime, and mtime with `modified`) on behalf of this handle.
    pub async fn touch(&self, modified: bool) -> Result<()> {
        let attr = SetAttr {
            mtime: modified.then(proto::md::Time::now),
            times_now: true,
            ..Default::default()
        };
        self.set_by_handle(attr).await.map(|_| ())
    }

    /// Sets the mtime of this handle's writes as the writer's clock took it (what a page cache
    /// that keeps the mtime of cached writes hands over when it writes them back, as a Lustre
    /// client's close carries it). The handle must be open for writing.
    pub async fn set_mtime(&self, mtime: proto::md::Time) -> Result<Inode> {
        if !self.writable {
            return Err(ClientError::fs(
                FsErrorKind::BadHandle,
                "the file is not open for writing",
            ));
        }
        let attr = SetAttr {
            mtime: Some(mtime),
            ..Default::default()
        };
        self.set_by_handle(attr).await
    }

    /// A change of times through the open handle, as for a truncate: the open was the check.
    async fn set_by_handle(&self, attr: SetAttr) -> Result<Inode> {
        let fid = self.inode.lock().fid;
        let done = self
            .client
            .reint_with(Mutation::Setattr { fid, attr }, Some(self.handle))
            .await?;
        if let Some(i) = done.inode {
            *self.inode.lock() = i;
        }
        Ok(self.inode())
    }

    /// A reader of `chunk`-byte pieces from `offset` on, keeping `ahead` chunks in flight.
    pub fn reader(self: &Arc<Self>, offset: u64, chunk: usize, ahead: usize) -> Reader {
        let mut plan = Readahead::new(chunk as u64, ahead, 0);
        plan.observe(offset, 0);
        Reader {
            file: self.clone(),
            plan,
            inflight: VecDeque::new(),
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

/// Publishes that a writer wrote up to `end` of the file `inode`, if no truncate came since
/// the writer learnt size generation `gen`. If one did, the writes may be older than the
/// truncate: the file's true extent is read from its objects, and only what they hold is
/// published. Returns the file's fresh attributes and size generation.
async fn publish(
    client: &Client,
    inode: &Inode,
    caps: &Caps,
    handle: OpenHandle,
    end: u64,
    gen: u64,
) -> Result<(Option<Inode>, u64)> {
    let fid = inode.fid;
    let grow = |size| Mutation::GrowSize { fid, size };
    // Through the open handle: a writer needs no write permission now (its open was the
    // check).
    match client.reint_if(grow(end), Some(handle), Some(gen)).await {
        Ok(r) => Ok((r.inode, r.size_gen)),
        Err(e) if e.is(FsErrorKind::Stale) => {
            let held = objects_extent(client, inode, caps).await?;
            match client
                .reint_if(grow(end.min(held)), Some(handle), None)
                .await
            {
                Ok(r) => Ok((r.inode, r.size_gen)),
                // Without a size generation to check, only a file that is gone is stale: its
                // last name was removed (here or by another client) while this handle held
                // it open. No one can open it again, so there is no size to publish; its
                // bytes stay in its objects for the handles still open, as POSIX keeps an
                // unlinked open file.
                Err(e) if e.is(FsErrorKind::Stale) => Ok((None, gen)),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// How far the file's objects hold bytes: the end of the last file byte any object holds.
async fn objects_extent(client: &Client, inode: &Inode, caps: &Caps) -> Result<u64> {
    let Some(layout) = &inode.layout else {
        return Ok(0);
    };
    // Every copy in sync holds the same bytes: the first one answers.
    let stale = layout.stale_mirrors();
    let Some(m) = (0..layout.mirror_count()).find(|m| !stale.contains(m)) else {
        return Err(ClientError::fs(
            FsErrorKind::Io,
            format!("{}: {}", inode.fid, LayoutError::AllStale),
        ));
    };
    let layout = &layout.mirror(m);
    let targets: HashSet<u32> = layout
        .components
        .iter()
        .flat_map(|c| c.objects.iter().map(|o| o.target))
        .collect();
    let servers = client.servers_of(&targets).await?;
    let mut extent = 0;
    for c in &layout.components {
        for (stripe, o) in c.objects.iter().enumerate() {
            let oss = &servers[&o.target];
            let getattr = |capa| proto::ost::OstGetattr {
                target: o.target,
                fid: o.fid,
                capa,
            };
            let size = caps.rpc(client, oss, o.target, o.fid, getattr).await?.size;
            if let Some(at) = size.checked_sub(1).and_then(|s| c.unmap(stripe as u64, s)) {
                extent = extent.max(at + 1);
            }
        }
    }
    Ok(extent)
}

/// A close finishing behind its caller ([`File::close_behind`]).
pub struct Behind {
    closing: crate::closing::Closing,
    file: Arc<File>,
    dir: proto::Fid,
}

impl Behind {
    /// Finishes the close once the handle's writes have landed (`landed`: their outcome):
    /// the size they reached is queued after the changes answered ahead so far, or, if they
    /// failed, nothing is published over them and the failure waits for the next `fsync`.
    pub async fn finish(self, landed: Result<()>) {
        let Behind { closing, file, dir } = self;
        let inner = &file.client.inner;
        let fid = file.fid();
        // Kept for the next fsync of the file or its directory, or sync.
        let keep = |e: &ClientError| {
            inner.pending.failed(crate::pending::Failed {
                dir: Some(dir),
                fid: Some(fid),
                kind: e.kind(),
                what: e.to_string(),
            })
        };
        let sent = match landed {
            Ok(()) => file.publish_queued().await,
            Err(e) => {
                file.unpublished.store(false, Ordering::SeqCst);
                keep(&e);
                None
            }
        };
        if let Some(s) = &sent {
            inner.closings.queued(s.seq());
        }
        // Finished: what follows is ordered by the queue.
        drop(closing);
        let Some(sent) = sent else {
            return;
        };
        let failed = match sent.reply().await {
            Ok(r) => {
                if let Some(i) = r.inode {
                    *file.inode.lock() = i;
                }
                file.size_gen.store(r.size_gen, Ordering::SeqCst);
                return;
            }
            // A truncate came in between, or the file is gone (unlinked while this handle was
            // open): published again as a close does, up to what the objects hold.
            Err(e) if e.is(FsErrorKind::Stale) => {
                file.unpublished.store(true, Ordering::SeqCst);
                match file.publish_size().await {
                    Ok(()) => return,
                    Err(e) if e.is(FsErrorKind::Stale) => {
                        // Gone: no one can open it again, so nothing is lost to anyone.
                        file.unpublished.store(false, Ordering::SeqCst);
                        tracing::debug!(%fid, "a file closed behind was removed meanwhile");
                        return;
                    }
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        tracing::warn!(%fid, error = %failed, "a size published behind its close failed");
        keep(&failed);
    }
}

/// Bytes read from a file, landed once in registered memory (the storage servers put them
/// there); they are handed on as a slice, without a copy.
pub struct Chunk {
    bytes: lnet::region::RegionAccess,
    _region: Registered<Vec<u8>>,
}

impl std::ops::Deref for Chunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes.as_slice()
    }
}

impl File {
    /// Reads up to `len` bytes at `offset` into memory of its own (short only at the end of
    /// the file).
    pub async fn read_chunk(&self, offset: u64, len: usize) -> Result<Chunk> {
        // No larger than the file can fill: the kernel asks for a whole readahead window of a
        // file of a few KiB.
        let left = self.readable_size().saturating_sub(offset);
        let len = len.min(usize::try_from(left).unwrap_or(usize::MAX));
        let region = self.client.register(vec![0u8; len])?;
        let n = self.read_into(offset, &region, 0, len as u64).await?;
        Ok(Chunk {
            bytes: region.read(0, n as u64)?,
            _region: region,
        })
    }
}

/// Sequential reads with readahead: the next `ahead` chunks are always on their way, as
/// [`Readahead`] decides.
pub struct Reader {
    file: Arc<File>,
    plan: Readahead,
    inflight: VecDeque<(u64, tokio::task::JoinHandle<Result<Chunk>>)>,
}

impl Reader {
    /// The next chunk, or `None` at the end of the file.
    pub async fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        for (at, len) in self.plan.issue() {
            let file = self.file.clone();
            let read = lnet::job::spawn(async move { file.read_chunk(at, len as usize).await });
            self.inflight.push_back((at, read));
        }
        let Some((at, first)) = self.inflight.pop_front() else {
            return Ok(None);
        };
        let chunk = first
            .await
            .map_err(|e| ClientError::fs(FsErrorKind::Io, e.to_string()))??;
        self.plan.landed(at, chunk.len() as u64);
        self.plan.consumed(at);
        self.plan.observe(at, chunk.len() as u64);
        if chunk.is_empty() {
            for (_, t) in self.inflight.drain(..) {
                t.abort();
            }
            return Ok(None);
        }
        Ok(Some(chunk))
    }
}

/// Sequential writes with write-behind: bytes are gathered into `chunk`-sized transfers (a
/// multiple of the stripe size is best) and up to `ahead` of them are on their way at once,
/// straight from registered buffers. Errors surface on a later `write` or on `finish`.
pub struct Writer {
    file: Arc<File>,
    next: u64,
    chunk: usize,
    /// Registered buffers not in flight.
    free: Vec<Buffer>,
    /// The buffer being filled and how much of it is.
    filling: Option<(Buffer, usize)>,
    /// Writes in flight, in issue order, with their ranges.
    inflight: VecDeque<(u64, u64, tokio::task::JoinHandle<Result<Buffer>>)>,
    plan: WriteBehind<ClientError>,
}

/// A registered buffer of a [`Writer`].
type Buffer = Arc<Registered<Vec<u8>>>;

impl File {
    /// A write-behind writer from `offset` on, in `chunk`-byte transfers, `ahead` in flight.
    pub fn writer(self: &Arc<Self>, offset: u64, chunk: usize, ahead: usize) -> Result<Writer> {
        let chunk = chunk.max(1);
        let free = (0..ahead.max(1) + 1)
            .map(|_| self.client.register(vec![0u8; chunk]).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(Writer {
            file: self.clone(),
            next: offset,
            chunk,
            free,
            filling: None,
            inflight: VecDeque::new(),
            plan: WriteBehind::new(ahead),
        })
    }
}

impl Writer {
    /// Waits for the oldest write in flight and takes its buffer back.
    async fn reclaim_one(&mut self) {
        let Some((start, end, t)) = self.inflight.pop_front() else {
            return;
        };
        let landed = t
            .await
            .map_err(|e| ClientError::fs(FsErrorKind::Io, e.to_string()))
            .and_then(|r| r);
        match landed {
            Ok(buf) => {
                self.free.push(buf);
                self.plan.landed(start, end, Ok(()));
            }
            Err(e) => {
                // The buffer went with the failed write: a fresh one replaces it.
                if let Ok(b) = self.file.client.register(vec![0u8; self.chunk]) {
                    self.free.push(Arc::new(b));
                }
                self.plan.landed(start, end, Err(e));
            }
        }
    }

    /// Issues the buffer being filled, once the plan lets it go.
    async fn send(&mut self) -> Result<()> {
        let Some((buf, len)) = self.filling.take() else {
            return Ok(());
        };
        if len == 0 {
            self.free.push(buf);
            return Ok(());
        }
        let (at, end) = (self.next, self.next + len as u64);
        loop {
            match self.plan.before(at, end) {
                Step::Report => {
                    self.free.push(buf);
                    return Err(self.plan.take_error().expect("an error to report"));
                }
                Step::Drain | Step::WaitOne => self.reclaim_one().await,
                Step::Issue => break,
            }
        }
        self.next = end;
        self.plan.issued(at, end);
        let file = self.file.clone();
        let write = lnet::job::spawn(async move {
            file.write_from(at, buf.clone(), 0, len as u64).await?;
            Ok(buf)
        });
        self.inflight.push_back((at, end, write));
        Ok(())
    }

    /// Appends `data` to the stream. A failure of an earlier write is returned here.
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if self.filling.is_none() {
                while self.free.is_empty() {
                    self.reclaim_one().await;
                }
                if let Some(e) = self.plan.take_error() {
                    return Err(e);
                }
                let buf = self.free.pop().expect("a free buffer after reclaiming");
                self.filling = Some((buf, 0));
            }
            let (buf, len) = self.filling.as_mut().expect("filling");
            let n = data.len().min(self.chunk - *len);
            {
                let mut w = buf.write(*len as u64, n as u64)?;
                if let Some(s) = w.as_mut_slice() {
                    s.copy_from_slice(&data[..n]);
                }
            }
            *len += n;
            data = &data[n..];
            if *len == self.chunk {
                self.send().await?;
            }
        }
        Ok(())
    }

    /// Sends what is gathered and waits for every write; returns the offset reached, or the
    /// first failure.
    pub async fn finish(mut self) -> Result<u64> {
        self.send().await?;
        while !self.inflight.is_empty() {
            self.reclaim_one().await;
        }
        match self.plan.take_error() {
            Some(e) => Err(e),
            None => Ok(self.next),
        }
    }
}

/// A piece of a read that has landed, with what the server said of it.
struct Landed {
    at: u64,
    piece: proto::layout::Piece,
    obj: StripeObject,
    oss: Nid,
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
    caps.rpc_within(client, oss, obj.target, obj.fid, r, limit)
        .await
}

/// Where a device transfer goes: straight to the registered device memory, or through the
/// staging ring (with why, when it could not go direct).
enum Route {
    Direct(Registered<lnet::DeviceMemory>),
    Staged(Option<String>),
}
