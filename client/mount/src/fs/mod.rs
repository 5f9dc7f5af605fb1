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

mod attrs;
mod dirs;
mod io;
mod names;
mod open;
mod xattrs;

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

/// Starts reading the listing of directory `fid` for caller `c`: `.`, `..` and the entries,
/// the entries page by page behind the answer.
async fn read_listing(
    c: &Client,
    fid: proto::Fid,
    parents: &crate::pages::Parents,
) -> Result<Arc<Listing>, Errno> {
    let dots = async {
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
        Ok::<_, ClientError>([dot(b".", dir), dot(b"..", parent)])
    };
    let listing = Listing::begin(dots.await.map_err(|e| errno(&e))?);
    let (c, l) = (c.clone(), listing.clone());
    lnet::job::spawn(async move {
        let read = c
            .readdir_plus_paged(fid, |entries, attrs| {
                l.push(entries.into_iter().zip(attrs).map(|(e, i)| (e, Some(i))))
            })
            .await;
        l.finish(read.map_err(|e| errno(&e)));
    });
    Ok(listing)
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
    let (at, since) = (std::time::Instant::now(), listings.since(c.lease_recalls()));
    // Numbered before it is read, so that the kernel's next request goes on in it while the
    // rest is read; it answers lookups once read whole.
    let l = read_listing(&c, dir, &parents).await?;
    let kept = listings.keep(dir, l.clone());
    listings.answer_from(dir, kept, at, since);
    Ok((kept, l, from.map_or(0, |(_, i)| i)))
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
    /// Hybrid I/O: which handles bypass the kernel's page cache (`session::hybrid`).
    hybrid: Option<crate::session::Hybrid>,
    /// The handles opened to bypass the page cache (asked for with O_DIRECT, or chosen).
    direct: Arc<Mutex<std::collections::HashSet<u64>>>,
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
            hybrid: None,
            direct: Arc::default(),
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

    /// Sends large sequential I/O straight to the daemon, past the kernel's page cache, as
    /// `hybrid` says (see `session::hybrid`); `None` keeps every buffered handle cached.
    pub fn with_hybrid(mut self, hybrid: Option<crate::session::Hybrid>) -> LodeFs {
        self.hybrid = hybrid;
        self
    }

    /// The hybrid I/O rule in force: none under the write-back cache, which keeps writes in
    /// the page cache by choice.
    fn hybrid(&self) -> Option<crate::session::Hybrid> {
        self.hybrid.filter(|_| !self.writeback)
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
            self.streams.count_in(m.clone());
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
        // Listings answer lookups only while nothing could have changed through this mount.
        if !matches!(
            op,
            "lookup"
                | "getattr"
                | "readdir"
                | "readdirplus"
                | "opendir"
                | "releasedir"
                | "statfs"
                | "getxattr"
                | "listxattr"
                | "access"
                | "readlink"
                | "read"
                | "lseek"
                | "forget"
        ) {
            self.listings.changed();
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
    /// The file was cut or extended to `size` through one of its handles: every handle of it
    /// reads up to the new size.
    fn resized(files: &Mutex<HashMap<u64, Arc<File>>>, fid: proto::Fid, size: u64) {
        for f in files.lock().values().filter(|f| f.fid() == fid) {
            f.truncated(size);
        }
    }

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
/// The kernel's requests, each handed to the method of the same name in the module of its
/// topic: [`attrs`], [`names`], [`open`], [`io`], [`dirs`], [`xattrs`].
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
        // A file some handle reads or writes past the page cache may still be mapped through
        // another (or through its own): the kernel then keeps the two coherent, writing back a
        // range's dirty pages before a direct read or write of it, and dropping them after a
        // direct write. Without it, such a file could not be mapped shared at all.
        if config
            .add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_err()
        {
            tracing::info!("the kernel cannot map files read past the page cache: hybrid I/O off");
            self.hybrid = None;
        }
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

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        LodeFs::lookup(self, req, parent, n, reply)
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        LodeFs::getattr(self, req, ino, reply)
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
        LodeFs::setattr(
            self, req, ino, mode, uid, gid, size, atime, mtime, fh, reply,
        )
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        LodeFs::readlink(self, req, ino, reply)
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
        LodeFs::mknod(self, req, parent, n, mode, umask, rdev, reply)
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
        LodeFs::mkdir(self, req, parent, n, mode, umask, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        LodeFs::unlink(self, req, parent, n, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        LodeFs::rmdir(self, req, parent, n, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        LodeFs::symlink(self, req, parent, link, target, reply)
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
        LodeFs::rename(self, req, parent, n, newparent, newname, flags, reply)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        LodeFs::link(self, req, ino, newparent, newname, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        LodeFs::open(self, req, ino, flags, reply)
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
        LodeFs::create(self, req, parent, n, mode, umask, flags, reply)
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        LodeFs::tmpfile(self, req, parent, mode, umask, flags, reply)
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
        LodeFs::read(self, req, fh, offset, size, flags, reply)
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        wf: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill_privs = wf.contains(fuser::WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        LodeFs::write(self, req, fh, offset, data, kill_privs, reply)
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        LodeFs::flush(self, req, fh, reply)
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
        LodeFs::fallocate(self, req, fh, offset, length, mode, reply)
    }

    // Files here are always ready, as on a local disk: "no poll" tells the kernel to answer
    // so itself from now on (its default mask), without a request per call or a warning.
    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

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
        LodeFs::ioctl(self, req, cmd, reply)
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
        LodeFs::copy_file_range(self, req, reply)
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        LodeFs::fsync(self, req, fh, reply)
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        LodeFs::fsyncdir(self, req, ino, reply)
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
        LodeFs::release(self, req, fh, reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        LodeFs::opendir(self, req, ino, reply)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        LodeFs::readdir(self, req, ino, fh, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        LodeFs::readdirplus(self, req, ino, fh, offset, reply)
    }

    fn releasedir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        LodeFs::releasedir(self, req, fh, reply)
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        LodeFs::statfs(self, req, reply)
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
        LodeFs::setxattr(self, req, ino, n, value, flags, reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        LodeFs::getxattr(self, req, ino, n, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        LodeFs::listxattr(self, req, ino, size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        LodeFs::removexattr(self, req, ino, n, reply)
    }

    fn access(&self, req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        LodeFs::access(self, req, reply)
    }
}

/// Whether a handle of a file of `size` bytes, opened with `flags` (`created` by this open),
/// bypasses the page cache. O_DIRECT always does. Under hybrid I/O, a write-only handle does (it
/// cannot map the file, and without the write-back cache each of its writes is a request of its
/// own anyway: the page cache only adds a copy), as do a file created by its open and a file at
/// least `Hybrid::min_size` large: the page cache's copy and readahead cost a stream about
/// twice the CPU per byte, while the daemon's readahead and write-behind keep it going. Small
/// files opened to be read keep the page cache, where re-reads and small reads cost no request.
fn goes_direct(
    hybrid: Option<crate::session::Hybrid>,
    flags: i32,
    size: u64,
    created: bool,
) -> bool {
    if flags & libc::O_DIRECT != 0 {
        return true;
    }
    let Some(h) = hybrid else {
        return false;
    };
    flags & libc::O_ACCMODE == libc::O_WRONLY || created || size >= h.min_size
}
