//! Opening and closing files: open, create, O_TMPFILE, flush and release.

use super::*;

impl LodeFs {
    pub(super) fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.begin("open", req);
        let c = self.as_caller(req);
        let raw = flags.0;
        let files = self.files.clone();
        let notifier = self.notifier.clone();
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let writeback = self.writeback;
        let pages = self.pages.clone();
        let (streams, windows) = (self.streams.clone(), self.windows.clone());
        let (hybrid, handles) = (self.hybrid(), self.direct.clone());
        let metrics = self.metrics.clone();
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
            let mut opened = opts(acc != libc::O_WRONLY || writeback).open(&c, fid).await;
            if acc == libc::O_WRONLY
                && writeback
                && opened
                    .as_ref()
                    .is_err_and(|e| e.is(FsErrorKind::AccessDenied))
            {
                opened = opts(false).open(&c, fid).await;
            }
            match opened {
                Ok(f) => {
                    // Chosen to bypass the page cache (hybrid I/O): as if asked with O_DIRECT,
                    // except that it may still map the file.
                    let direct = direct || goes_direct(hybrid, raw, f.inode().size, false);
                    let mut fopen = fopen;
                    if direct {
                        fopen |= FopenFlags::FOPEN_DIRECT_IO;
                        handles.lock().insert(fh);
                    }
                    if let Some(m) = &metrics {
                        m.opened(direct);
                    }
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

    #[allow(clippy::too_many_arguments)] // the kernel's request, as fuser passes it
    pub(super) fn create(
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
        let (hybrid, handles) = (self.hybrid(), self.direct.clone());
        let metrics = self.metrics.clone();
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
            let mut opened = opts(writeback)
                .open(&c, client::At::Entry { parent, name: &n })
                .await;
            if writeback
                && opened
                    .as_ref()
                    .is_err_and(|e| e.is(FsErrorKind::AccessDenied))
            {
                opened = opts(false)
                    .open(&c, client::At::Entry { parent, name: &n })
                    .await;
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
                    let direct = goes_direct(hybrid, flags, i.size, true);
                    if direct {
                        handles.lock().insert(fh);
                    }
                    if let Some(m) = &metrics {
                        m.opened(direct);
                    }
                    let fopen = if direct {
                        FopenFlags::FOPEN_DIRECT_IO
                    } else {
                        FopenFlags::empty()
                    };
                    reply.created(&ttl, &a, Generation(0), FileHandle(fh), fopen);
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    // O_TMPFILE: a file with no name, counted open with its create; a link (linkat of
    // /proc/self/fd/N, or AT_EMPTY_PATH) names it, else it goes after its last close.
    pub(super) fn tmpfile(
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
                .open(
                    &c,
                    client::At::Unnamed {
                        parent: fid_of(parent),
                    },
                )
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

    pub(super) fn flush(&self, req: &Request, fh: FileHandle, reply: ReplyEmpty) {
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
                let metrics = self.metrics.clone();
                self.empty(reply, async move {
                    let asked = std::time::Instant::now();
                    let done = async {
                        streams.settle(fid).await?;
                        f.flush().await
                    }
                    .await;
                    if let Some(m) = &metrics {
                        m.stage("flush", asked);
                    }
                    if done.is_err() {
                        failed();
                    }
                    done
                })
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(super) fn release(&self, req: &Request, fh: FileHandle, reply: ReplyEmpty) {
        self.begin("release", req);
        let f = self.files.lock().remove(&fh.0);
        let window = self.windows.lock().remove(&fh.0);
        self.direct.lock().remove(&fh.0);
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
}
