//! Directories: open handles, listings read once and paged, readdirplus.

use super::*;

impl LodeFs {
    /// A directory's changes are applied when the MDS answers them and durable once it has
    /// committed them: fsync of a directory waits for that commit.
    pub(super) fn fsyncdir(&self, req: &Request, ino: INodeNo, reply: ReplyEmpty) {
        self.begin("fsyncdir", req);
        let c = self.client.clone();
        self.empty(reply, async move { c.sync_dir(fid_of(ino)).await });
    }

    pub(super) fn opendir(&self, req: &Request, ino: INodeNo, reply: ReplyOpen) {
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

    pub(super) fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.begin("readdir", req);
        if fh.0 == 0 {
            let unopened = self.unopened(req, ino, offset);
            return self.inline(async move {
                let (id, listing, from) = match unopened.await {
                    Ok(x) => x,
                    Err(e) => return reply.error(e),
                };
                let added = listing
                    .read_from(from, |entries| {
                        for (i, (e, _)) in (from..).zip(entries) {
                            let name = OsStr::from_bytes(&e.name);
                            if reply.add(ino_of(e.fid), cookie(id, i), kind(e.kind), name) {
                                break;
                            }
                        }
                    })
                    .await;
                match added {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(e),
                }
            });
        }
        let listing = listing(self.dirs.clone(), self.parents.clone(), fh.0);
        self.inline(async move {
            let listing = match listing.await {
                Ok(l) => l,
                Err(e) => return reply.error(e),
            };
            let from = offset as usize;
            let added = listing
                .read_from(from, |entries| {
                    for (i, (e, _)) in (from..).zip(entries) {
                        let name = OsStr::from_bytes(&e.name);
                        if reply.add(ino_of(e.fid), i as u64 + 1, kind(e.kind), name) {
                            break;
                        }
                    }
                })
                .await;
            match added {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    pub(super) fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
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
            let unopened = self.unopened(req, ino, offset);
            Box::pin(async move { unopened.await.map(|(id, l, from)| (Some(id), l, from)) })
        } else {
            let listing = listing(self.dirs.clone(), self.parents.clone(), fh.0);
            Box::pin(async move { listing.await.map(|l| (None, l, offset as usize)) })
        };
        self.inline(async move {
            let (id, listing, from) = match read.await {
                Ok(x) => x,
                Err(e) => return reply.error(e),
            };
            let added = listing
                .read_from(from, |entries| {
                    for (i, (e, a)) in (from..).zip(entries) {
                        // Entries come with the attributes read in the same round trip as
                        // the listing.
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
                })
                .await;
            match added {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    pub(super) fn releasedir(&self, req: &Request, fh: FileHandle, reply: ReplyEmpty) {
        self.begin("releasedir", req);
        if let Some(h) = self.dirs.lock().remove(&fh.0) {
            self.pages.released(h.fid, self.client.holds_lease(h.fid));
        }
        reply.ok();
    }
}
