//! File data: reads, writes, fallocate, copy_file_range, fsync.

use super::*;

impl LodeFs {
    pub(super) fn read(
        &self,
        req: &Request,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        reply: ReplyData,
    ) {
        self.begin("read", req);
        let asked = std::time::Instant::now();
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
        let direct = metrics.is_some() && self.direct.lock().contains(&fh.0);
        self.inline(async move {
            let r = streams.read(&f, &window, offset, size as usize).await;
            match &r {
                Ok(data) => reply.data(data.as_slice()),
                Err(e) => reply.error(errno(e)),
            }
            if let Some(m) = &metrics {
                m.read(&r.as_ref().map(|d| d.as_slice().len()).map_err(|_| ()));
                if let Ok(d) = &r {
                    m.io_bytes("read", direct, d.as_slice().len());
                }
                m.stage("read", asked);
            }
        });
    }

    pub(super) fn write(
        &self,
        req: &Request,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        kill_privs: bool,
        reply: ReplyWrite,
    ) {
        self.begin("write", req);
        let asked = std::time::Instant::now();
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
        // A direct write by a writer without CAP_FSETID asks the daemon to drop the set-user-ID
        // and set-group-ID bits (the page cache's writes ask with a setattr of their own), as
        // the writer: the MDS lets anyone who may write make exactly that change.
        let drop_privs = kill_privs
            .then(|| {
                let fid = f.fid();
                let mode = self
                    .client
                    .getattr_cached(fid)
                    .map_or_else(|| f.inode().mode, |i| i.mode);
                (mode & 0o6000 != 0).then(|| (self.as_caller(req), fid, mode & 0o7777 & !0o6000))
            })
            .flatten();
        let data = data.to_vec();
        let streams = self.streams.clone();
        let metrics = self.metrics.clone();
        let direct = metrics.is_some() && self.direct.lock().contains(&fh.0);
        let pages = self.pages.clone();
        self.inline(async move {
            let n = data.len() as u32;
            let dropped = match drop_privs {
                Some((c, fid, mode)) => {
                    let attr = proto::md::SetAttr {
                        mode: Some(mode),
                        ..Default::default()
                    };
                    c.reint(Mutation::Setattr { fid, attr }).await.map(|_| ())
                }
                None => Ok(()),
            };
            let r = if let Err(e) = dropped {
                Err(e)
            } else if f.appends() {
                // Appends land in order, each at the end the one before left.
                match streams.settle(f.fid()).await {
                    Ok(()) => f.write_at(offset, &data).await.map(|_| ()),
                    Err(e) => Err(e),
                }
            } else {
                streams.write(&f, offset, data).await
            };
            match &r {
                Ok(()) => reply.written(n),
                Err(e) => {
                    // Refused: the copy has bytes the file may not.
                    pages.changed(f.fid());
                    reply.error(errno(e))
                }
            }
            if let Some(m) = &metrics {
                m.written(&r.as_ref().map(|_| n as usize).map_err(|_| ()));
                if r.is_ok() {
                    m.io_bytes("write", direct, n as usize);
                }
                m.stage("write", asked);
            }
        });
    }

    pub(super) fn fallocate(
        &self,
        req: &Request,
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
                f.set_len(end).await?;
                Self::resized(&files, fid, end);
                Ok(())
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
    pub(super) fn ioctl(&self, req: &Request, cmd: u32, reply: fuser::ReplyIoctl) {
        self.begin("ioctl", req);
        tracing::trace!(cmd, "ioctl refused");
        reply.error(Errno::ENOTTY);
    }

    pub(super) fn copy_file_range(&self, req: &Request, reply: ReplyWrite) {
        self.begin("copy_file_range", req);
        // The kernel then copies through reads and writes (and stops asking).
        reply.error(Errno::ENOSYS);
    }

    pub(super) fn fsync(&self, req: &Request, fh: FileHandle, reply: ReplyEmpty) {
        self.begin("fsync", req);
        match self.file(fh) {
            Ok(f) => {
                let streams = self.streams.clone();
                let (pages, dropper) = (self.pages.clone(), self.dropper.clone());
                let metrics = self.metrics.clone();
                self.empty(reply, async move {
                    let fid = f.fid();
                    let stage = |stage, since| {
                        if let Some(m) = &metrics {
                            m.stage(stage, since);
                        }
                    };
                    let done = async {
                        let settling = std::time::Instant::now();
                        let settled = streams.settle(fid).await;
                        stage("fsync_settle", settling);
                        settled?;
                        let committing = std::time::Instant::now();
                        let committed = f.fsync().await;
                        stage("fsync_commit", committing);
                        committed
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
}
