//! The POSIX mount: lode as an ordinary directory, through FUSE.
//!
//! Each kernel request is answered by a task on the client's runtime, so many run at once;
//! replies carry the attributes the MDS returned, so the kernel's cache is fresh after every
//! change made through this mount. Inode numbers map one to one to FIDs (the root is 1; an
//! inode `[0x200000400:n:0]` is `n + 1`). Permissions are checked by the kernel
//! (`default_permissions`, unless the mount says `no_default_permissions`) and by the MDS with
//! the calling process's uid and gid; where the kernel checks, it opens directories alone.

use proto::FsErrorKind;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future as _;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags as FuseRename, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow,
};
use parking_lot::Mutex;
use proto::md::{Creds, DirEntry, Inode, Kind, Mutation, RenameFlags, SetAttr};

use crate::kernel::*;
use crate::stream::{Ahead, Streams};
use client::ClientError;
use client::{Client, ROOT};
use client::{File, OpenOptions};

use crate::listings::{cookie, resume, Listing, Listings};

/// An open directory: whose it is and for whom, and its listing once a read asked for it
/// (an open the kernel answers from its own cache of the listing never does).
struct DirHandle {
    fid: proto::Fid,
    caller: Client,
    listing: Option<Arc<Listing>>,
}

/// The listing of handle `fh`, read on its first call: `.`, `..` and the entries.
async fn listing(
    dirs: Arc<Mutex<HashMap<u64, DirHandle>>>,
    parents: Arc<crate::pages::Parents>,
    fh: u64,
) -> Result<Arc<Listing>, Errno> {
    let (fid, c) = {
        let dirs = dirs.lock();
        let Some(h) = dirs.get(&fh) else {
            return Err(Errno::EBADF);
        };
        if let Some(l) = &h.listing {
            return Ok(l.clone());
        }
        (h.fid, h.caller.clone())
    };
    let listing = read_listing(&c, fid, &parents).await?;
    if let Some(h) = dirs.lock().get_mut(&fh) {
        h.listing = Some(listing.clone());
    }
    Ok(listing)
}

/// Reads the listing of directory `fid` for caller `c`: `.`, `..` and the entries.
async fn read_listing(
    c: &Client,
    fid: proto::Fid,
    parents: &crate::pages::Parents,
) -> Result<Arc<Listing>, Errno> {
    let read = async {
        let dir = c.getattr(fid).await?;
        if dir.kind != Kind::Dir {
            return Err(ClientError::fs(FsErrorKind::NotDir, "not a directory"));
        }
        let known = parents.get(dir.fid, c.holds_lease(dir.fid));
        let parent = if dir.fid == ROOT {
            dir.clone()
        } else if let Some(p) = known {
            c.getattr(p).await?
        } else {
            let p = c.lookup(dir.fid, b"..").await?;
            if c.holds_lease(dir.fid) {
                parents.learn(dir.fid, p.fid, || c.holds_lease(dir.fid));
            }
            p
        };
        let dot = |name: &[u8], i: Inode| {
            let e = DirEntry {
                name: name.to_vec(),
                fid: i.fid,
                kind: Kind::Dir,
            };
            (e, Some(i))
        };
        let mut all = vec![dot(b".", dir.clone()), dot(b"..", parent)];
        all.extend(
            c.readdir_plus(dir.fid)
                .await?
                .into_iter()
                .map(|(e, i)| (e, Some(i))),
        );
        Ok::<_, ClientError>(Arc::new(all))
    };
    read.await.map_err(|e| errno(&e))
}

/// The listing a read of directory `dir` from `offset` goes on in, with the number it is kept
/// under, and the entry to start at (see [`crate::listings`]): for a kernel that opens
/// directories without asking.
async fn unopened_listing(
    c: Client,
    dir: proto::Fid,
    offset: u64,
    parents: Arc<crate::pages::Parents>,
    listings: Arc<Listings>,
) -> Result<(u32, Arc<Listing>, usize), Errno> {
    let from = resume(offset);
    if let Some((id, i)) = from {
        if let Some(l) = listings.get(dir, id) {
            return Ok((id, l, i));
        }
        tracing::debug!(%dir, offset, "a listing read on from an offset is no longer kept; reading it again");
    }
    let l = read_listing(&c, dir, &parents).await?;
    let id = listings.keep(dir, l.clone());
    Ok((id, l, from.map_or(0, |(_, i)| i)))
}

/// The mounted filesystem.
pub struct LodeFs {
    client: Client,
    rt: tokio::runtime::Handle,
    files: Arc<Mutex<HashMap<u64, Arc<File>>>>,
    /// Open directories.
    dirs: Arc<Mutex<HashMap<u64, DirHandle>>>,
    /// The kernel checks permissions itself (`default_permissions`): it opens directories
    /// without asking, and lists them through [`Listings`].
    kernel_checks: bool,
    /// Listings read for directories the kernel opened without asking.
    listings: Arc<Listings>,
    /// Tells the kernel to drop what it caches; set once the session is up.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// Write-behind and readahead behind the kernel's one-at-a-time requests.
    streams: Arc<Streams>,
    /// Each open file's readahead window.
    windows: Arc<Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Ahead>>>>>,
    /// The kernel's write-back cache is on: it keeps buffered writes, the size and the mtime,
    /// and sends the pages in large writes of its own.
    writeback: bool,
    /// Ask the kernel for FUSE over io_uring at INIT.
    uring: bool,
    /// Which files' pages, and directories' listings, an open may keep.
    pages: Arc<crate::pages::PageTrust>,
    /// Directories' parents, for `..` in their listings.
    parents: Arc<crate::pages::Parents>,
    /// Drops files' pages in the kernel.
    dropper: crate::invalidate::PageDropper,
    /// The last statfs answer, and when it came.
    statfs: Arc<Mutex<Option<(std::time::Instant, proto::md::FsStats)>>>,
    next_fh: AtomicU64,
    /// What the mount counts, when it serves metrics.
    metrics: Option<Arc<crate::metrics::MountMetrics>>,
    /// The job of each calling process.
    jobs: JobCache,
    /// Releases answered and still closing their files.
    releasing: Arc<Releasing>,
}

/// Work still under way after its request was answered, which the mount waits for before it
/// leaves.
#[derive(Default)]
pub struct Releasing {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One release under way; finished when dropped.
pub(crate) struct Release(Arc<Releasing>);

impl Drop for Release {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Releasing {
    fn begin(self: &Arc<Self>) -> Release {
        self.count.fetch_add(1, Ordering::SeqCst);
        Release(self.clone())
    }

    /// Waits until no release is under way.
    pub async fn idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

thread_local! {
    /// The job of the request this thread is handling.
    static CALLER_JOB: std::cell::RefCell<Option<proto::JobId>> = const { std::cell::RefCell::new(None) };
}

/// Most processes whose job is remembered.
const JOBS_KEPT: usize = 4096;
/// How long a process's job is remembered before it is read again.
const JOB_KEPT_FOR: Duration = Duration::from_secs(30);
/// How old a statfs answer may be when given again.
const STATFS_MAX_AGE: Duration = Duration::from_secs(1);

type KnownJob = (Option<proto::JobId>, std::time::Instant);

/// The jobs of the processes calling the mount, read once per [`JOB_KEPT_FOR`].
///
/// A process's environment is read off the request's thread, in the background: reading
/// `/proc/PID/environ` takes the process's memory lock, which the process may hold while it
/// waits on this very mount (a page fault on a mapped file), so a request never waits for it.
/// Until it is read, a process's requests carry the mount's own job.
#[derive(Clone)]
struct JobCache {
    source: Arc<lnet::job::JobSource>,
    /// The mount's own job: for requests of no process (the kernel writing back pages), of
    /// one whose job is being read, or of one gone before its job was read.
    own: Option<proto::JobId>,
    /// By (pid, uid): the job, and when it was read (or its reading began).
    by_pid: Arc<Mutex<HashMap<(u32, u32), KnownJob>>>,
}

impl JobCache {
    fn of(&self, pid: u32, uid: u32, rt: &tokio::runtime::Handle) -> Option<proto::JobId> {
        if *self.source == lnet::job::JobSource::Disabled {
            return None;
        }
        let now = std::time::Instant::now();
        let mut cache = self.by_pid.lock();
        let stale = match cache.get(&(pid, uid)) {
            Some((job, at)) if now.duration_since(*at) < JOB_KEPT_FOR => return job.clone(),
            Some((job, _)) => job.clone(),
            None => None,
        };
        if cache.len() >= JOBS_KEPT {
            cache.retain(|_, (_, at)| now.duration_since(*at) < JOB_KEPT_FOR);
            if cache.len() >= JOBS_KEPT {
                cache.clear();
            }
        }
        // Meanwhile: what was known, else the mount's own; read once, in the background.
        let meanwhile = stale.or_else(|| self.own.clone());
        cache.insert((pid, uid), (meanwhile.clone(), now));
        drop(cache);
        let me = self.clone();
        rt.spawn_blocking(move || {
            let job = lnet::job::of_process(&me.source, pid, uid).or_else(|| me.own.clone());
            me.by_pid
                .lock()
                .insert((pid, uid), (job, std::time::Instant::now()));
        });
        meanwhile
    }
}

impl LodeFs {
    /// `readahead_bytes`: what the readahead windows of all the mount's open files may hold
    /// together.
    pub fn new(
        client: Client,
        rt: tokio::runtime::Handle,
        writeback: bool,
        readahead_bytes: u64,
    ) -> LodeFs {
        let notifier: Arc<std::sync::OnceLock<fuser::Notifier>> = Arc::default();
        let pages: Arc<crate::pages::PageTrust> = Arc::default();
        let parents: Arc<crate::pages::Parents> = Arc::default();
        let dropper =
            crate::invalidate::start(&client, notifier.clone(), pages.clone(), parents.clone());
        LodeFs {
            client,
            rt,
            files: Arc::default(),
            dirs: Arc::default(),
            kernel_checks: false,
            listings: Arc::default(),
            notifier,
            streams: Arc::new(Streams::new(readahead_bytes)),
            windows: Arc::default(),
            writeback,
            uring: false,
            pages,
            parents,
            dropper,
            statfs: Arc::default(),
            next_fh: AtomicU64::new(1),
            metrics: None,
            jobs: JobCache {
                source: Arc::new(lnet::job::JobSource::from_env()),
                own: lnet::job::from_env(),
                by_pid: Arc::default(),
            },
            releasing: Arc::default(),
        }
    }

    /// Releases answered and still closing their files: wait for them before the client
    /// leaves.
    pub fn releasing(&self) -> Arc<Releasing> {
        self.releasing.clone()
    }

    /// Serves requests over FUSE rings when the kernel offers them (see `session::uring`).
    pub fn with_uring(mut self, uring: bool) -> LodeFs {
        self.uring = uring;
        self
    }

    /// Whether the kernel checks permissions itself (mounted with `default_permissions`): it
    /// then opens directories without asking the daemon.
    pub fn with_kernel_checks(mut self, on: bool) -> LodeFs {
        self.kernel_checks = on;
        self
    }

    /// Counts the mount's work in `metrics`, whose gauges are read from this mount's state.
    pub fn with_metrics(mut self, metrics: Option<Arc<crate::metrics::MountMetrics>>) -> LodeFs {
        if let Some(m) = &metrics {
            let (client, files) = (self.client.clone(), self.files.clone());
            m.watch(Box::new(move || {
                (
                    files.lock().len(),
                    client.leases_held(),
                    client.uncommitted(),
                )
            }));
        }
        self.metrics = metrics;
        self
    }

    /// Each kernel request begins here: it is counted, and the calls it makes carry the
    /// job of the process that made it (read from `/proc/PID`, as `$LODE_JOBID_VAR` says in the
    /// mount's environment, in the background, and kept a while per process: [`JobCache`]).
    fn begin(&self, op: &'static str, req: &Request) {
        if let Some(m) = &self.metrics {
            m.request(op);
        }
        let job = self.jobs.of(req.pid(), req.uid(), &self.rt);
        CALLER_JOB.with(|j| *j.borrow_mut() = job);
    }

    /// Where the mount puts the session's notifier once it runs, so that opens can drop the
    /// kernel's cached attributes (close-to-open consistency with other clients).
    pub fn notifier_slot(&self) -> Arc<std::sync::OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    fn as_caller(&self, req: &Request) -> Client {
        // Root that stays root passes every check: its groups (read from /proc on every call
        // otherwise) decide nothing.
        let groups = if req.uid() == 0 && self.client.root_stays_root() {
            vec![]
        } else {
            groups_of(req.pid())
        };
        self.client.as_user(Creds {
            uid: req.uid(),
            gid: req.gid(),
            groups,
        })
    }

    /// The size to show for an inode: further than the MDS knows if an open handle wrote further.
    fn size_of(files: &Mutex<HashMap<u64, Arc<File>>>, i: &Inode) -> u64 {
        let local = files
            .lock()
            .values()
            .filter(|f| f.fid() == i.fid)
            .map(|f| f.written_to())
            .max()
            .unwrap_or(0);
        i.size.max(local)
    }

    /// Runs a request's work on this thread as far as it goes without waiting (an answer from
    /// the lease cache, a change answered ahead: no hand-off to another thread, no wake-up),
    /// and hands the rest to the runtime.
    fn inline(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        let job = CALLER_JOB.with(|j| j.borrow().clone());
        let mut f = Box::pin(lnet::job::scope(job, f));
        let _in = self.rt.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // A future polled again takes the waker of that poll: the runtime's, from then on.
        if f.as_mut().poll(&mut cx).is_pending() {
            self.rt.spawn(f);
        }
    }

    fn entry(
        &self,
        reply: ReplyEntry,
        f: impl std::future::Future<Output = Result<Inode, ClientError>> + Send + 'static,
    ) {
        let files = self.files.clone();
        let (pages, dropper) = (self.pages.clone(), self.dropper.clone());
        self.inline(async move {
            match f.await {
                Ok(i) => {
                    if pages.moved(&i) {
                        dropper.drop_pages(ino_of(i.fid));
                    }
                    reply.entry(&TTL, &attr(&i, Self::size_of(&files, &i)), Generation(0))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn empty(
        &self,
        reply: ReplyEmpty,
        f: impl std::future::Future<Output = Result<(), ClientError>> + Send + 'static,
    ) {
        self.inline(async move {
            match f.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// The attributes of `fid` as made here, while it is a file this mount created ahead
    /// whose create the MDS has not answered yet and a handle of it is open.
    fn made_here(&self, fid: proto::Fid) -> Option<Inode> {
        self.files
            .lock()
            .values()
            .find(|f| f.fid() == fid)
            .and_then(|f| f.made_here())
    }

    /// The listing a read of directory `ino` from `offset` goes on in, for its caller, where
    /// the kernel opened the directory alone (see [`unopened_listing`]).
    fn unopened(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
    ) -> impl std::future::Future<Output = Result<(u32, Arc<Listing>, usize), Errno>> + Send + 'static
    {
        unopened_listing(
            self.as_caller(req),
            fid_of(ino),
            offset,
            self.parents.clone(),
            self.listings.clone(),
        )
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, ClientError> {
        self.files
            .lock()
            .get(&fh.0)
            .cloned()
            .ok_or_else(|| ClientError::fs(FsErrorKind::BadHandle, "no such open file"))
    }
}

/// The extended attribute that shows and sets a layout, as `lode setstripe` options (as Lustre
/// exposes `lustre.lov`).
pub const LAYOUT_XATTR: &str = "lode.layout";

/// Largest read or write the kernel sends at once.
const MAX_IO: u32 = 1 << 20;

// One block because fuser's trait is one: each call unpacks the kernel's arguments, hands the
// work to the library (or to `stream`) on the runtime, and answers; none is over ~70 lines.
// How lode looks to the kernel is in `kernel.rs`, readahead and write-behind in `stream.rs`.
impl Filesystem for LodeFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // 1 MiB requests (the kernel's limit with max_pages), and readahead to match.
        let _ = config.set_max_write(MAX_IO);
        // As much readahead as the kernel offers; the mount raises it further once it is up
        // (the backing device's read_ahead_kb, which FUSE starts at 128 KiB).
        if let Err(most) = config.set_max_readahead(16 << 20) {
            let _ = config.set_max_readahead(most);
        }
        let _ = config.set_max_background(64);
        // readdirplus (adaptive, as libfuse does), parallel lookups in one directory, and
        // O_DIRECT requests submitted asynchronously (so io_depth reaches the daemon). The
        // kernel drops a file's pages when its size moves under it, not when its mtime does
        // (no FUSE_AUTO_INVAL_DATA): this mount's own writes move the mtime of pages that are
        // the file's, and the daemon drops pages another client's change made old (see
        // `pages.rs`). O_TRUNC is not
        // taken with the open (FUSE_ATOMIC_O_TRUNC): the kernel checks that no process runs
        // the file only after the open, and a read-only open with O_TRUNC of a running
        // program would have truncated it before failing with ETXTBSY. The kernel truncates
        // with a setattr after its checks instead.
        let _ = config.add_capabilities(
            fuser::InitFlags::FUSE_DO_READDIRPLUS
                | fuser::InitFlags::FUSE_READDIRPLUS_AUTO
                | fuser::InitFlags::FUSE_PARALLEL_DIROPS
                | fuser::InitFlags::FUSE_ASYNC_DIO,
        );
        // The write-back cache: buffered writes stay in the page cache and reach the daemon
        // as the kernel writes them back, in requests of up to 1 MiB many at a time; the
        // kernel keeps the size and mtime they made, and flushes both at fsync and close.
        if self.writeback
            && config
                .add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE)
                .is_err()
        {
            tracing::warn!("the kernel offers no write-back cache; buffered writes go one by one");
            self.writeback = false;
        }
        // Requests over per-CPU io_uring queues: each served on the core of the process that
        // made it, with the reply and the wait for the next request in one system call.
        if self.uring {
            match config.add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING) {
                Ok(()) => tracing::info!("serving requests over FUSE rings"),
                Err(_) => tracing::info!(
                    "the kernel offers no FUSE rings (fuse's enable_uring is off); serving over /dev/fuse"
                ),
            }
        }
        Ok(())
    }

    // Entries keep the short timeout: the kernel asks again, and the lease cache answers
    // without a round trip (dropping an entry takes the kernel's lock on its directory, which a
    // call in that directory may hold while it waits on this daemon, so a recall cannot wait
    // for it). Attributes the lease cache covers go to the kernel with a long timeout and are
    // dropped, before the recall is acknowledged, when the lease is. A lease dropped while the
    // answer was on its way drops the kernel's copy again after it.
    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.begin("lookup", req);
        let (c, n) = (self.as_caller(req), name(n));
        // What the lease cache answers is answered on this thread, with no hand-off.
        let before = c.lease_recalls();
        match c.lookup_cached(fid_of(parent), &n) {
            Some(Ok(i)) => {
                let a = attr(&i, Self::size_of(&self.files, &i));
                reply.entry(&TTL, &a, Generation(0));
                if a.size == i.size {
                    self.pages.gave(&i, || c.lease_recalls() == before);
                }
                return;
            }
            Some(Err(e)) if errno(&e) == Errno::ENOENT => {
                // Known absent under the directory's lease: the kernel keeps the negative
                // entry as long as a found one, and it is dropped the same way (a creation
                // elsewhere recalls the lease, and the names it covered are dropped).
                return reply.entry(&TTL, &absent(), Generation(0));
            }
            Some(Err(e)) => return reply.error(errno(&e)),
            None => {}
        }
        self.entry(reply, async move { c.lookup(fid_of(parent), &n).await });
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.begin("getattr", req);
        let (c, files) = (self.client.clone(), self.files.clone());
        let notifier = self.notifier.clone();
        let fid = fid_of(ino);
        let before = c.lease_recalls();
        if let Some(i) = c.getattr_cached(fid) {
            let a = attr(&i, Self::size_of(&files, &i));
            reply.attr(&LEASED_TTL, &a);
            if a.size == i.size {
                self.pages.gave(&i, || c.lease_recalls() == before);
            }
            if c.lease_recalls() != before {
                // Dropped while on its way: the kernel must not keep it.
                if let Some(n) = notifier.get() {
                    let _ = n.inval_inode(ino, -1, 0);
                }
            }
            return;
        }
        // A file this mount created ahead whose create the MDS has not answered yet: its
        // attributes are those made here, times included (the MDS stamps the create with
        // them).
        if let Some(i) = self.made_here(fid) {
            return reply.attr(&TTL, &attr(&i, Self::size_of(&files, &i)));
        }
        if let Some(i) = c.dir_attr_ahead(fid) {
            // A directory this mount's creates or unlinks answered ahead are still on their
            // way in: the kernel's permission checks ask before each of the next (every change
            // drops its copy of the directory's attributes), and the answer need not wait for
            // the MDS's. The kernel keeps it for the short time of attributes held without a
            // lease; the next change drops it, and once the queue is answered stats get the
            // MDS's times.
            return reply.attr(&TTL, &attr(&i, i.size));
        }
        let (pages, dropper) = (self.pages.clone(), self.dropper.clone());
        self.inline(async move {
            let fid = fid_of(ino);
            let before = c.lease_recalls();
            match c.getattr(fid).await {
                Ok(i) => {
                    let leased = c.leased_attr(fid);
                    if !leased && pages.moved(&i) {
                        dropper.drop_pages(ino);
                    }
                    let ttl = if leased { LEASED_TTL } else { TTL };
                    reply.attr(&ttl, &attr(&i, Self::size_of(&files, &i)));
                    if leased && c.lease_recalls() != before {
                        // Dropped while on its way: the kernel must not keep it.
                        if let Some(n) = notifier.get() {
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                    }
                }
                Err(e) => {
                    // A file removed while open is still there for its open handles.
                    let held = files
                        .lock()
                        .values()
                        .map(|f| f.inode())
                        .find(|i| i.fid == fid);
                    match held.map(|i| Inode { nlink: 0, ..i }) {
                        Some(i) => reply.attr(&TTL, &attr(&i, Self::size_of(&files, &i))),
                        None => reply.error(errno(&e)),
                    }
                }
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.begin("setattr", req);
        let c = self.as_caller(req);
        let open = fh.and_then(|h| self.file(h).ok());
        let files = self.files.clone();
        // The write-back cache hands over the mtime of the writes it kept through a handle
        // open for writing; the writer may set it whoever owns the file.
        let kept_mtime = match (mtime, &open) {
            (Some(TimeOrNow::SpecificTime(t)), Some(f))
                if self.writeback
                    && f.writable()
                    && mode.is_none()
                    && uid.is_none()
                    && gid.is_none()
                    && size.is_none()
                    && atime.is_none() =>
            {
                Some(from_time(t))
            }
            _ => None,
        };
        if let (Some(t), Some(f)) = (kept_mtime, open.clone()) {
            self.inline(async move {
                match f.set_mtime(t).await {
                    Ok(i) => reply.attr(&TTL, &attr(&i, Self::size_of(&files, &i))),
                    Err(e) => reply.error(errno(&e)),
                }
            });
            return;
        }
        // Under the write-back cache the kernel sends UTIME_NOW's mtime as its own clock's
        // time (only the atime keeps the "now" flag): a change of both to now is judged as one
        // (any writer may make it), not as times only the owner may set.
        let mtime = match (atime, mtime) {
            (Some(TimeOrNow::Now), Some(TimeOrNow::SpecificTime(_))) if self.writeback => {
                Some(TimeOrNow::Now)
            }
            _ => mtime,
        };
        let t = |x: TimeOrNow| match x {
            TimeOrNow::Now => from_time(SystemTime::now()),
            TimeOrNow::SpecificTime(s) => from_time(s),
        };
        let is_now = |x: &Option<TimeOrNow>| matches!(x, None | Some(TimeOrNow::Now));
        let times_now = is_now(&atime) && is_now(&mtime);
        let mtime_given = matches!(mtime, Some(TimeOrNow::SpecificTime(_)));
        let (atime, mtime) = (atime.map(t), mtime.map(t));
        let streams = self.streams.clone();
        if size.is_some() {
            self.pages.changed(fid_of(ino));
        }
        self.inline(async move {
            let fid = fid_of(ino);
            let result = async {
                if let Some(size) = size {
                    streams.wait(fid).await;
                    streams.changed(fid);
                    let f = match open {
                        Some(f) => f,
                        None => Arc::new(
                            OpenOptions::new()
                                .read(false)
                                .write(true)
                                .open_fid(&c, fid)
                                .await?,
                        ),
                    };
                    f.set_len(size).await?;
                    for other in files.lock().values().filter(|o| o.fid() == fid) {
                        other.truncated(size);
                    }
                }
                if mtime_given {
                    // An mtime set outright (cp -a and tar set it through the handle they
                    // wrote, before closing it) stays: the sizes this node's writes
                    // reached are published first, since a publish moves the mtime to now,
                    // as an NFS client writes back before a setattr. A failure stays with
                    // the handle, for its fsync or close to report.
                    streams.wait(fid).await;
                    let writers: Vec<Arc<client::File>> = files
                        .lock()
                        .values()
                        .filter(|o| o.fid() == fid && o.writable())
                        .cloned()
                        .collect();
                    for w in writers {
                        let _ = w.flush().await;
                    }
                }
                let a = SetAttr {
                    mode,
                    uid,
                    gid,
                    size: None,
                    atime,
                    mtime,
                    times_now,
                };
                c.reint(Mutation::Setattr { fid, attr: a })
                    .await
                    .and_then(created)
            };
            match result.await {
                Ok(i) => reply.attr(
                    &TTL,
                    &attr(&i, size.unwrap_or_else(|| Self::size_of(&files, &i))),
                ),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.begin("readlink", req);
        let c = self.client.clone();
        self.inline(async move {
            match c.getattr(fid_of(ino)).await {
                Ok(i) if i.kind == Kind::Symlink => reply.data(&i.target),
                Ok(_) => reply.error(Errno::EINVAL),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.begin("mknod", req);
        // The kernel has already checked CAP_MKNOD for device nodes.
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev(rdev.into()),
            libc::S_IFBLK => Kind::BlockDev(rdev.into()),
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        let (c, n) = (self.as_caller(req), name(n));
        let m = Mutation::Create {
            parent: fid_of(parent),
            name: n,
            kind,
            mode: mode & !umask & 0o7777,
            exclusive: true,
            target: vec![],
            layout: None,
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.begin("mkdir", req);
        let (c, n) = (self.as_caller(req), name(n));
        let m = Mutation::Create {
            parent: fid_of(parent),
            name: n,
            kind: Kind::Dir,
            mode: mode & !umask & 0o7777,
            exclusive: true,
            target: vec![],
            layout: None,
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.begin("unlink", req);
        let (c, n) = (self.as_caller(req), name(n));
        self.empty(reply, async move {
            // Answered here when the directory's lease tells the outcome; sent behind.
            if c.unlink_ahead(fid_of(parent), &n).await {
                return Ok(());
            }
            c.reint(Mutation::Unlink {
                parent: fid_of(parent),
                name: n,
                dir: false,
            })
            .await
            .map(|_| ())
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.begin("rmdir", req);
        let (c, n) = (self.as_caller(req), name(n));
        self.empty(reply, async move {
            c.reint(Mutation::Unlink {
                parent: fid_of(parent),
                name: n,
                dir: true,
            })
            .await
            .map(|_| ())
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        self.begin("symlink", req);
        let (c, n) = (self.as_caller(req), name(link));
        let m = Mutation::Create {
            parent: fid_of(parent),
            name: n,
            kind: Kind::Symlink,
            mode: 0o777,
            exclusive: true,
            target: target.as_os_str().as_bytes().to_vec(),
            layout: None,
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: FuseRename,
        reply: ReplyEmpty,
    ) {
        self.begin("rename", req);
        let c = self.as_caller(req);
        let bits = flags.bits();
        let flags = RenameFlags {
            noreplace: bits & libc::RENAME_NOREPLACE != 0,
            exchange: bits & libc::RENAME_EXCHANGE != 0,
        };
        let m = Mutation::Rename {
            parent: fid_of(parent),
            name: name(n),
            new_parent: fid_of(newparent),
            new_name: name(newname),
            flags,
        };
        // A directory moved to another parent has a new `..`.
        let parents = (parent != newparent).then(|| self.parents.clone());
        if let Some(p) = &parents {
            p.forget_all();
        }
        self.empty(reply, async move {
            let done = c.reint(m).await.map(|_| ());
            if let Some(p) = parents {
                p.forget_all();
            }
            done
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.begin("link", req);
        let c = self.as_caller(req);
        let m = Mutation::Link {
            fid: fid_of(ino),
            parent: fid_of(newparent),
            name: name(newname),
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.begin("open", req);
        let c = self.as_caller(req);
        let raw = flags.0;
        let files = self.files.clone();
        let notifier = self.notifier.clone();
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let writeback = self.writeback;
        let pages = self.pages.clone();
        let (streams, windows) = (self.streams.clone(), self.windows.clone());
        self.inline(async move {
            let acc = raw & libc::O_ACCMODE;
            // O_DIRECT: bypass the kernel's page cache for this handle.
            let direct = raw & libc::O_DIRECT != 0;
            let mut fopen = if direct {
                FopenFlags::FOPEN_DIRECT_IO
            } else {
                FopenFlags::empty()
            };
            if acc == libc::O_RDONLY && !writeback {
                // Nothing to flush at its close: it writes nothing, and locks are the
                // kernel's (released at close without the daemon). Its close then costs no
                // request the caller waits for. (The write-back cache flushes at every close,
                // whatever the open said.)
                fopen |= FopenFlags::FOPEN_NOFLUSH;
            }
            let opts = |read: bool| {
                OpenOptions::new()
                    .read(read)
                    .write(acc != libc::O_RDONLY)
                    .append(raw & libc::O_APPEND != 0 && !writeback)
                    .truncate(raw & libc::O_TRUNC != 0)
            };
            // The write-back cache reads the rest of a page a write covers in part, through
            // whichever handle wrote: a write-only open reads too where the caller may.
            let fid = fid_of(ino);
            if raw & libc::O_TRUNC != 0 {
                pages.changed(fid);
            }
            pages.resolve_made(fid, c.holds_lease(fid), c.lease_recalls());
            // A small file to be read whose pages the kernel will not keep: its bytes are on
            // their way while the MDS counts the open, where the client can read them early.
            let mut early =
                (acc == libc::O_RDONLY && !direct && !pages.keep(fid, c.holds_lease(fid)))
                    .then(|| streams.read_early(&c, fid))
                    .flatten();
            let mut opened = opts(acc != libc::O_WRONLY || writeback)
                .open_fid(&c, fid)
                .await;
            if acc == libc::O_WRONLY
                && writeback
                && opened
                    .as_ref()
                    .is_err_and(|e| e.is(FsErrorKind::AccessDenied))
            {
                opened = opts(false).open_fid(&c, fid).await;
            }
            match opened {
                Ok(f) => {
                    let leased = !direct && c.holds_lease(fid);
                    let keep = pages.keep(fid, leased);
                    let fopen = if keep {
                        // Held under a lease since its pages were read: they are the file.
                        fopen | FopenFlags::FOPEN_KEEP_CACHE
                    } else {
                        // Close-to-open: another client may have changed the file since the
                        // kernel cached its attributes; the next stat asks again (its pages
                        // are dropped at open, as no FOPEN_KEEP_CACHE is given). Not when the
                        // kernel's are the lease cache's now, the lease held since they were
                        // given: another client's change would have recalled it first.
                        let current =
                            leased && c.getattr_cached(fid).is_some_and(|now| pages.current(&now));
                        if let (Some(n), false) = (notifier.get(), current) {
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                        pages.opened(fid, leased);
                        fopen
                    };
                    let f = Arc::new(f);
                    files.lock().insert(fh, f.clone());
                    reply.opened(FileHandle(fh), fopen);
                    // A small file opened to be read through the page cache, whose pages the
                    // kernel does not keep: its bytes are read now (those on the MDS came with
                    // the open).
                    let i = f.inode();
                    let small = i.size > 0 && i.size <= crate::stream::FIRST;
                    let on_mds = i.layout.as_ref().is_some_and(|l| l.mdt_end().is_some());
                    if acc == libc::O_RDONLY && !direct && !keep && small && !on_mds {
                        let window = windows.lock().entry(fh).or_default().clone();
                        streams.read_first(&f, &window, early);
                    } else if early.take().is_some() {
                        streams.forget_unused(fid);
                    }
                }
                Err(e) => {
                    reply.error(errno(&e));
                    if early.take().is_some() {
                        streams.forget_unused(fid);
                    }
                }
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.begin("create", req);
        let (c, n) = (self.as_caller(req), name(n));
        let files = self.files.clone();
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // Under the write-back cache the kernel places appends itself, and may read back
        // through this handle: it reads too where the caller may (its creator may whatever
        // the mode; a file that was already there, as its mode says).
        let writeback = self.writeback;
        let pages = self.pages.clone();
        self.inline(async move {
            let opts = |read: bool| {
                OpenOptions::new()
                    .read(read)
                    .write(true)
                    .create(true)
                    .create_new(flags & libc::O_EXCL != 0)
                    .append(flags & libc::O_APPEND != 0 && !writeback)
                    .truncate(flags & libc::O_TRUNC != 0)
                    .mode(mode & !umask & 0o7777)
            };
            let parent = fid_of(parent);
            let mut opened = opts(writeback).open_in(&c, parent, &n).await;
            if writeback
                && opened
                    .as_ref()
                    .is_err_and(|e| e.is(FsErrorKind::AccessDenied))
            {
                opened = opts(false).open_in(&c, parent, &n).await;
            }
            match opened {
                Ok(f) => {
                    let i = f.inode();
                    let a = attr(&i, i.size);
                    // A file created ahead has this client's times, which the MDS stamps
                    // its create with: the kernel may keep them as it keeps any (its
                    // permission check at the open then needs no request of its own).
                    let ttl = TTL;
                    // The kernel has no pages of it after this (a new file has none; an old
                    // one's are dropped, as no FOPEN_KEEP_CACHE is given).
                    pages.opened(i.fid, c.holds_lease(i.fid));
                    if f.created_ahead() {
                        pages.created(i.fid);
                    } else if flags & libc::O_TRUNC != 0 {
                        pages.changed(i.fid);
                    }
                    files.lock().insert(fh, Arc::new(f));
                    reply.created(&ttl, &a, Generation(0), FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    // O_TMPFILE: a file with no name, counted open with its create; a link (linkat of
    // /proc/self/fd/N, or AT_EMPTY_PATH) names it, else it goes after its last close.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.begin("tmpfile", req);
        let c = self.as_caller(req);
        let files = self.files.clone();
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let writeback = self.writeback;
        let pages = self.pages.clone();
        self.inline(async move {
            let opened = OpenOptions::new()
                // Under the write-back cache the kernel may read back through the handle.
                .read(writeback || flags & libc::O_ACCMODE == libc::O_RDWR)
                .write(true)
                .append(flags & libc::O_APPEND != 0 && !writeback)
                .mode(mode & !umask & 0o7777)
                .open_unnamed(&c, fid_of(parent))
                .await;
            match opened {
                Ok(f) => {
                    let i = f.inode();
                    let a = attr(&i, i.size);
                    pages.opened(i.fid, c.holds_lease(i.fid));
                    files.lock().insert(fh, Arc::new(f));
                    reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.begin("read", req);
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(errno(&e)),
        };
        let fid = f.fid();
        // A small file made here, trusted as kept pages are: its bytes are this mount's. Not
        // for O_DIRECT, which asks for the storage itself.
        let copy = (flags.0 & libc::O_DIRECT == 0)
            .then(|| {
                let leased = self.client.holds_lease(fid);
                self.pages.read_copy(fid, leased, offset, size as usize)
            })
            .flatten();
        if let Some(data) = copy {
            if let Some(m) = &self.metrics {
                m.read_copy(data.len());
            }
            return reply.data(&data);
        }
        let window = self.windows.lock().entry(fh.0).or_default().clone();
        let streams = self.streams.clone();
        let metrics = self.metrics.clone();
        self.inline(async move {
            let r = streams.read(&f, &window, offset, size as usize).await;
            if let Some(m) = &metrics {
                m.read(&r.as_ref().map(|d| d.as_slice().len()).map_err(|_| ()));
            }
            match r {
                Ok(data) => reply.data(data.as_slice()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.begin("write", req);
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(errno(&e)),
        };
        if f.appends() {
            // Placed at the end the writes before it leave, not at `offset`.
            self.pages.changed(f.fid());
        } else {
            self.pages.wrote(f.fid(), offset, data);
        }
        // Past the largest file lode keeps, a write is refused now, not acknowledged and then
        // failed behind the caller.
        let past = offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > proto::md::MAX_FILE_SIZE);
        if past && !f.appends() {
            self.pages.changed(f.fid());
            return reply.error(Errno::from_i32(libc::EFBIG));
        }
        let data = data.to_vec();
        let streams = self.streams.clone();
        let metrics = self.metrics.clone();
        let pages = self.pages.clone();
        self.inline(async move {
            let n = data.len() as u32;
            let r = if f.appends() {
                // Appends land in order, each at the end the one before left.
                match streams.settle(f.fid()).await {
                    Ok(()) => f.write_at(offset, &data).await.map(|_| ()),
                    Err(e) => Err(e),
                }
            } else {
                streams.write(&f, offset, data).await
            };
            if let Some(m) = &metrics {
                m.written(&r.as_ref().map(|_| n as usize).map_err(|_| ()));
            }
            match r {
                Ok(()) => reply.written(n),
                Err(e) => {
                    // Refused: the copy has bytes the file may not.
                    pages.changed(f.fid());
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.begin("flush", req);
        match self.file(fh) {
            Ok(f) => {
                let streams = self.streams.clone();
                let (pages, dropper) = (self.pages.clone(), self.dropper.clone());
                let fid = f.fid();
                let failed = move || dropper.lost_writes(&pages, fid);
                if let Some(behind) = f.close_behind() {
                    // A small file made here that no one else can see yet: its writes land
                    // and its size is published behind the caller (see client::closing).
                    reply.ok();
                    return self.inline(async move {
                        let landed = streams.settle(fid).await;
                        if landed.is_err() {
                            failed();
                        }
                        behind.finish(landed).await;
                    });
                }
                self.empty(reply, async move {
                    let done = async {
                        streams.settle(fid).await?;
                        f.flush().await
                    }
                    .await;
                    if done.is_err() {
                        failed();
                    }
                    done
                })
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.begin("fallocate", req);
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(errno(&e)),
        };
        let streams = self.streams.clone();
        let files = self.files.clone();
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 || (mode & libc::FALLOC_FL_PUNCH_HOLE != 0 && !keep) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let Some(end) = offset
            .checked_add(length)
            .filter(|e| *e <= proto::md::MAX_FILE_SIZE)
        else {
            return reply.error(Errno::EFBIG);
        };
        self.pages.changed(f.fid());
        self.empty(reply, async move {
            // Objects are sparse and space is not reserved: allocating is extending the size
            // (ENOSPC comes at write time); a punched or zeroed range reads as zeros.
            let fid = f.fid();
            streams.wait(fid).await;
            streams.changed(fid);
            if zero {
                f.punch(offset, length).await?;
            }
            let size = Self::size_of(&files, &f.inode());
            if !keep && end > size {
                f.set_len(end).await
            } else if !zero {
                f.touch(false).await
            } else {
                Ok(())
            }
        });
    }

    // lode has no ioctls of its own. Callers probe for them often (Python's `open` asks each
    // file whether it is a terminal, `cp` tries to clone): "not a terminal / no such
    // request", answered on this thread and not logged.
    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        self.begin("ioctl", req);
        tracing::trace!(cmd, "ioctl refused");
        reply.error(Errno::ENOTTY);
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.begin("copy_file_range", req);
        // The kernel then copies through reads and writes (and stops asking).
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.begin("fsync", req);
        match self.file(fh) {
            Ok(f) => {
                let streams = self.streams.clone();
                let (pages, dropper) = (self.pages.clone(), self.dropper.clone());
                self.empty(reply, async move {
                    let fid = f.fid();
                    let done = async {
                        streams.settle(fid).await?;
                        f.fsync().await
                    }
                    .await;
                    if done.is_err() {
                        // Writes a storage server lost or never took.
                        dropper.lost_writes(&pages, fid);
                    }
                    done
                })
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A directory's changes are applied when the MDS answers them and durable once it has
    /// committed them: fsync of a directory waits for that commit.
    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.begin("fsyncdir", req);
        let c = self.client.clone();
        self.empty(reply, async move { c.sync_dir(fid_of(ino)).await });
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.begin("release", req);
        let f = self.files.lock().remove(&fh.0);
        let window = self.windows.lock().remove(&fh.0);
        let streams = self.streams.clone();
        let Some(mut f) = f else {
            return reply.ok();
        };
        let fid = f.fid();
        self.pages.released(fid, self.client.holds_lease(fid));
        let client = self.client.clone();
        let (pages, dropper) = (self.pages.clone(), self.dropper.clone());
        let work = async move {
            if let Some(w) = window {
                w.lock().await.stop().await;
            }
            // After a close finishing behind: its size goes first, then the handle's close.
            client.after_closing_unhurried(fid).await;
            let landed = streams.release(f.fid()).await;
            match (&landed, f.create_check()) {
                (Err(_), _) => dropper.lost_writes(&pages, fid),
                // The pages of a file made here are the file's if no one else can have
                // changed it since: its own writes made them.
                (Ok(()), Some(check)) => pages.released_created(fid, check),
                (Ok(()), None) => {}
            }
            // Requests still in flight on this handle finish first; past a bound it closes
            // itself when the last of them drops it.
            for _ in 0..1000 {
                match Arc::try_unwrap(f) {
                    Ok(file) => return landed.and(file.close_unwaited().await),
                    Err(held) => f = held,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            landed
        };
        // Nobody waits for a release (the caller's close returned at its flush) and the kernel
        // ignores its outcome: it is answered at once, and its ring entry freed for requests
        // someone waits for. The mount waits for releases still under way before it leaves.
        reply.ok();
        let releasing = self.releasing.begin();
        self.inline(async move {
            if let Err(e) = work.await {
                tracing::warn!(%fid, error = %e, "closing a file after its release failed");
            }
            drop(releasing);
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.begin("opendir", req);
        if self.kernel_checks {
            // Where the kernel checks permissions, an open directory needs nothing of the
            // daemon: this answer has the kernel open directories without asking from now on
            // (no opendir, no releasedir), keep what it lists in its cache of the directory
            // (reset by the lease cache's drops and by the directory's mtime), and list it
            // through `Listings`.
            tracing::info!("directories open in the kernel alone; the kernel checks permissions");
            return reply.error(Errno::ENOSYS);
        }
        let c = self.as_caller(req);
        let dirs = self.dirs.clone();
        let parents = self.parents.clone();
        let pages = self.pages.clone();
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.inline(async move {
            let dir = fid_of(ino);
            // Where the lease cache can tell, the caller's right to read the directory is
            // checked there, as the MDS checks it (even where this mount's own changes in it
            // left its times to be fetched again), and the listing is read only if the kernel
            // asks for it. Otherwise it is read now: the MDS's answer is the check.
            let cached = c.may_list_cached(dir);
            if let Some(Err(e)) = &cached {
                return reply.error(errno(e));
            }
            dirs.lock().insert(
                fh,
                DirHandle {
                    fid: dir,
                    caller: c.clone(),
                    listing: None,
                },
            );
            if cached.is_none() {
                if let Err(e) = listing(dirs.clone(), parents, fh).await {
                    dirs.lock().remove(&fh);
                    return reply.error(e);
                }
            }
            // Under the directory's lease the kernel caches the listing it reads, and an open
            // keeps that cache while the lease has been held since it was read (the rules
            // are the same as for a file's pages): a listing of a leased directory then costs
            // the kernel no read at all. A change made through this mount resets the cache in
            // the kernel; another client's recalls the lease first. Every open is checked as
            // above, so the cache serves only callers who may read the directory.
            let leased = c.holds_lease(dir);
            let fopen = if pages.keep(dir, leased) {
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
            } else if leased {
                pages.opened(dir, true);
                FopenFlags::FOPEN_CACHE_DIR
            } else {
                FopenFlags::empty()
            };
            reply.opened(FileHandle(fh), fopen);
        });
    }

    fn readdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.begin("readdir", req);
        if fh.0 == 0 {
            let unopened = self.unopened(req, _ino, offset);
            return self.inline(async move {
                let (id, entries, from) = match unopened.await {
                    Ok(x) => x,
                    Err(e) => return reply.error(e),
                };
                for (i, (e, _)) in entries.iter().enumerate().skip(from) {
                    let name = OsStr::from_bytes(&e.name);
                    if reply.add(ino_of(e.fid), cookie(id, i), kind(e.kind), name) {
                        break;
                    }
                }
                reply.ok();
            });
        }
        let listing = listing(self.dirs.clone(), self.parents.clone(), fh.0);
        self.inline(async move {
            let entries = match listing.await {
                Ok(l) => l,
                Err(e) => return reply.error(e),
            };
            for (i, (e, _)) in entries.iter().enumerate().skip(offset as usize) {
                if reply.add(
                    ino_of(e.fid),
                    i as u64 + 1,
                    kind(e.kind),
                    OsStr::from_bytes(&e.name),
                ) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.begin("readdirplus", req);
        let files = self.files.clone();
        type Read = std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<(Option<u32>, Arc<Listing>, usize), Errno>>
                    + Send,
            >,
        >;
        let read: Read = if fh.0 == 0 {
            let unopened = self.unopened(req, _ino, offset);
            Box::pin(async move { unopened.await.map(|(id, l, from)| (Some(id), l, from)) })
        } else {
            let listing = listing(self.dirs.clone(), self.parents.clone(), fh.0);
            Box::pin(async move { listing.await.map(|l| (None, l, offset as usize)) })
        };
        self.inline(async move {
            let (id, entries, from) = match read.await {
                Ok(x) => x,
                Err(e) => return reply.error(e),
            };
            for (i, (e, a)) in entries.iter().enumerate().skip(from) {
                // Entries come with the attributes read in the same round trip as the listing.
                let Some(a) = a else { continue };
                let full = reply.add(
                    ino_of(e.fid),
                    id.map_or(i as u64 + 1, |id| cookie(id, i)),
                    OsStr::from_bytes(&e.name),
                    &TTL,
                    &attr(a, Self::size_of(&files, a)),
                    Generation(0),
                );
                if full {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn releasedir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.begin("releasedir", req);
        if let Some(h) = self.dirs.lock().remove(&fh.0) {
            self.pages.released(h.fid, self.client.holds_lease(h.fid));
        }
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.begin("statfs", req);
        let c = self.client.clone();
        let cached = self.statfs.clone();
        self.inline(async move {
            // As a Lustre client does, an answer up to a second old is answered again: df and
            // file servers ask for every few operations.
            let recent = cached
                .lock()
                .clone()
                .filter(|(at, _)| at.elapsed() < STATFS_MAX_AGE)
                .map(|(_, s)| s);
            let answer = match recent {
                Some(s) => Ok(s),
                None => c.statfs().await.inspect(|s| {
                    *cached.lock() = Some((std::time::Instant::now(), s.clone()));
                }),
            };
            match answer {
                Ok(s) => {
                    let bsize = 4096u64;
                    // Inode numbers are 32 bits: that many files in all, less those there.
                    let files = u64::from(u32::MAX).max(s.inodes);
                    reply.statfs(
                        s.total / bsize,
                        s.free / bsize,
                        s.free / bsize,
                        files,
                        files - s.inodes,
                        bsize as u32,
                        255,
                        bsize as u32,
                    )
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.begin("setxattr", req);
        let c = self.as_caller(req);
        let name = n.to_string_lossy().into_owned();
        let fid = fid_of(ino);
        if name == LAYOUT_XATTR {
            // The layout as `lode setstripe` options: set on a directory or an empty file. On a
            // file that already holds data it is ignored, as Lustre does with lustre.lov, so
            // that tools copying extended attributes (cp -a, rsync -X, shutil) keep working.
            let text = String::from_utf8_lossy(value).into_owned();
            let opts: Vec<String> = text.split_whitespace().map(String::from).collect();
            let layout = match client::stripe_args::parse(&opts) {
                Ok(l) => l,
                Err(e) => return reply.error(errno(&e)),
            };
            return self.empty(reply, async move {
                let i = c.getattr(fid).await?;
                if i.kind == Kind::File && i.size > 0 {
                    return Ok(());
                }
                c.reint(Mutation::SetLayout { fid, layout })
                    .await
                    .map(|_| ())
            });
        }
        let value = value.to_vec();
        // XATTR_CREATE and XATTR_REPLACE are checked by the MDS with the change, in one step.
        let m = match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
            0 => Mutation::SetXattr { fid, name, value },
            libc::XATTR_CREATE => Mutation::SetXattrIf {
                fid,
                name,
                value,
                replace: false,
            },
            libc::XATTR_REPLACE => Mutation::SetXattrIf {
                fid,
                name,
                value,
                replace: true,
            },
            _ => return reply.error(Errno::EINVAL),
        };
        self.empty(reply, async move { c.reint(m).await.map(|_| ()) });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        self.begin("getxattr", req);
        let (c, n) = (self.client.clone(), n.to_string_lossy().into_owned());
        let layout = n == LAYOUT_XATTR;
        let answer = move |i: &Inode, reply: ReplyXattr| match layout
            .then(|| {
                i.layout
                    .as_ref()
                    .map(|l| client::stripe_args::format(l).into_bytes())
            })
            .flatten()
            .as_ref()
            .or(i.xattrs.get(&n))
        {
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() <= size as usize => reply.data(v),
            Some(_) => reply.error(Errno::from_i32(libc::ERANGE)),
            None => reply.error(Errno::from_i32(libc::ENODATA)),
        };
        // A file this mount created ahead whose create the MDS has not answered yet: its
        // attributes are those made here, and the kernel's check for a capability before
        // every write need not wait for the answer. Only its layout comes with the answer.
        let fid = fid_of(ino);
        if !layout {
            if let Some(i) = self.made_here(fid) {
                return answer(&i, reply);
            }
        }
        self.inline(async move {
            match c.getattr(fid).await {
                Ok(i) => answer(&i, reply),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.begin("listxattr", req);
        let c = self.client.clone();
        self.inline(async move {
            match c.getattr(fid_of(ino)).await {
                Ok(i) => {
                    let mut list = vec![];
                    if i.layout.is_some() {
                        list.extend_from_slice(LAYOUT_XATTR.as_bytes());
                        list.push(0);
                    }
                    for k in i.xattrs.keys() {
                        list.extend_from_slice(k.as_bytes());
                        list.push(0);
                    }
                    if size == 0 {
                        reply.size(list.len() as u32)
                    } else if list.len() <= size as usize {
                        reply.data(&list)
                    } else {
                        reply.error(Errno::from_i32(libc::ERANGE))
                    }
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.begin("removexattr", req);
        let c = self.as_caller(req);
        let m = Mutation::RemoveXattr {
            fid: fid_of(ino),
            name: n.to_string_lossy().into_owned(),
        };
        self.empty(reply, async move { c.reint(m).await.map(|_| ()) });
    }

    fn access(&self, req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        self.begin("access", req);
        // The MDS checks every operation with the caller's credentials.
        reply.ok();
    }
}
