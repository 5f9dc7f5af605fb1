//! Attributes: getattr, setattr (size, mode, owner, times), statfs and access.

use super::*;

impl LodeFs {
    pub(super) fn getattr(&self, req: &Request, ino: INodeNo, reply: ReplyAttr) {
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

    #[allow(clippy::too_many_arguments)] // the kernel's request, as fuser passes it
    pub(super) fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
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
                                .open(&c, fid)
                                .await?,
                        ),
                    };
                    f.set_len(size).await?;
                    Self::resized(&files, fid, size);
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

    pub(super) fn statfs(&self, req: &Request, reply: ReplyStatfs) {
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

    pub(super) fn access(&self, req: &Request, reply: ReplyEmpty) {
        self.begin("access", req);
        // The MDS checks every operation with the caller's credentials.
        reply.ok();
    }
}
