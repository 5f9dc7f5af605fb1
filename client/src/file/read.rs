//! Reads: planned by [`crate::plan`], carried out by one executor that verifies every piece in host
//! memory and falls over to the next copy in sync; whole chunks and the streaming [`Reader`].

use super::*;

impl File {
    /// `len` bytes at `offset` of the part of the file the MDS keeps, zeros past what it
    /// holds: from the copy this handle read last while the file's lease shows nothing
    /// changed it since, else from the MDS (which leases the file again).
    pub(super) async fn read_mdt(&self, mdt_end: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
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
            lease: (leases.live() && self.client.here(fid))
                .then_some(self.client.inner.client_id()),
        };
        let mds = self.client.mds_for(fid).await?;
        match self.client.rpc(&mds, &r).await {
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
    /// (end to end), or, over a sealed connection, by the payload's tag on the bytes as they
    /// landed (the server then sends no crc32c); a piece that does not match is read once
    /// more, then reported as
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
        if let Some(c) = self.contents()? {
            return self
                .read_decrypted(&c, offset, region, region_offset, len)
                .await;
        }
        self.read_raw(offset, region, region_offset, len).await
    }

    /// [`File::read_into`] of the bytes as they are stored.
    pub(super) async fn read_raw<B: std::any::Any + Send + Sync>(
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
        // A released file's bytes are brought back from its archive first; while they land,
        // those landed are read from the copy they land in.
        if let Some(copy) = self.restored_to(offset + len).await? {
            let plan = plan::read_copy(&copy, 0, offset, len).map_err(|e| self.plan_error(e))?;
            self.execute(&plan, region, region_offset, None).await?;
            return Ok(len as usize);
        }
        let layout = self.layout_ready().await?;
        let plan = plan::read(&layout, offset, len).map_err(|e| self.plan_error(e))?;
        // The part the MDS keeps comes from it (or from what this handle read last).
        if plan.mdt > 0 {
            let mdt_end = layout.mdt_end().unwrap_or(offset + plan.mdt);
            let bytes = self.read_mdt(mdt_end, offset, plan.mdt).await?;
            region.dma(region_offset, plan.mdt, true)?.copy_in(&bytes)?;
            if plan.mdt == len {
                return Ok(len as usize);
            }
        }
        if plan::in_sync(&layout).is_empty() {
            return Err(ClientError::fs(
                FsErrorKind::Io,
                format!("{}: {}", self.inode.lock().fid, LayoutError::AllStale),
            ));
        }
        // Each stripe unit is read from one copy in sync, the units spread over the copies;
        // a copy that fails (its server does not answer within the failover time, or a piece
        // fails its checksum) is replaced by the next.
        let repairs = self
            .execute(&plan, region, region_offset, self.failover(&layout))
            .await?;
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
        Ok(len as usize)
    }

    /// Whether the file may be released (its bytes in an archive only): its state says so,
    /// or its layout has no copy to read (the state may not have come with the attributes).
    fn maybe_released(&self) -> bool {
        let i = self.inode.lock();
        if let Some(s) = proto::hsm::State::of_inode(&i) {
            return s.released;
        }
        i.layout.as_ref().is_some_and(|l| {
            l.mdt_end().is_none()
                && (plan::in_sync(l).is_empty()
                    || l.components.iter().any(|c| !c.is_instantiated()))
        })
    }

    /// For a released file: asks the MDS to restore it and waits until its bytes up to `end`
    /// landed. `None`: the file is whole (again); a layout: read copy 0 of it, where the
    /// bytes up to `end` are while the rest still lands.
    async fn restored_to(&self, end: u64) -> Result<Option<Layout>> {
        if !self.maybe_released() {
            return Ok(None);
        }
        let fid = self.fid();
        loop {
            let r = self.client.hsm_restore_step(fid, end).await?;
            if r.done || r.landed >= end {
                let mut i = self.inode.lock();
                if r.done {
                    i.layout = r.inode.layout;
                    i.xattrs = r.inode.xattrs;
                    return Ok(None);
                }
                let Some(l) = r.inode.layout.filter(|l| {
                    l.validate().is_ok()
                        && l.components
                            .iter()
                            .filter(|c| c.mirror == 0)
                            .all(|c| c.is_instantiated())
                }) else {
                    return Err(ClientError::fs(
                        FsErrorKind::Io,
                        format!("{fid}: a restore under way with no objects to read"),
                    ));
                };
                return Ok(Some(l));
            }
        }
    }

    /// Restores the file whole if it is released (before a write, which must not meet a
    /// file whose bytes are elsewhere).
    pub(super) async fn restore_whole(&self) -> Result<()> {
        self.restored_to(u64::MAX).await.map(|_| ())
    }

    /// A plan's error, as the client reports it.
    pub(super) fn plan_error(&self, e: plan::PlanError) -> ClientError {
        match e {
            plan::PlanError::Layout(e) => e.into(),
            e @ plan::PlanError::NoMirror(_) => {
                ClientError::fs(FsErrorKind::Invalid, e.to_string())
            }
        }
    }

    /// Carries out a read plan into `region` from `region_offset`: every unit at once, each
    /// from its tries in order (copies on servers that just failed to answer last), each
    /// piece within its target's window and, with more than one copy, within `failover`.
    /// Pieces in host memory are checked against the servers' crc32c; what an object does not
    /// hold inside the read (a hole, or past the object's end) reads as zeros. Returns the
    /// ranges of copies whose stored bytes failed their checksum, to repair: (copy, offset,
    /// length).
    pub(super) async fn execute<B: std::any::Any + Send + Sync>(
        &self,
        plan: &plan::ReadPlan,
        region: &Registered<B>,
        region_offset: u64,
        failover: Option<std::time::Duration>,
    ) -> Result<Vec<(u16, u64, u64)>> {
        let host = region.kind() == lnet::MemoryKind::Host;
        let servers = self.oss_of(&plan.targets()).await?;
        let mut tasks = JoinSet::new();
        for unit in &plan.units {
            let mut tries = vec![];
            for t in &unit.tries {
                let mut pieces = vec![];
                for p in t {
                    let at = region_offset + p.at;
                    // A hole is a piece of no object: it lands nothing, and reads as zeros.
                    let (obj, object_offset) = p.object.unzip();
                    pieces.push(Landed {
                        at,
                        piece: proto::layout::Piece {
                            component: 0,
                            stripe: 0,
                            object_offset: object_offset.unwrap_or(0),
                            file_offset: p.file_offset,
                            len: p.len,
                        },
                        obj: obj.map(|o| (o, servers[&o.target].clone())),
                        desc: region.desc(at, p.len as u32, false)?,
                        done: Default::default(),
                        mirror: p.mirror,
                    });
                }
                tries.push(pieces);
            }
            // Copies on servers that just failed to answer are tried last.
            tries.sort_by_key(|t| {
                t.iter().any(|l| {
                    l.obj
                        .as_ref()
                        .is_some_and(|(o, _)| self.client.shunned(o.target))
                })
            });
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
                        let Some((obj, oss)) = &l.obj else {
                            continue;
                        };
                        let window = client.window(obj.target);
                        let r = read_piece_within(
                            &client,
                            &caps,
                            &window,
                            oss,
                            *obj,
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
                                    client.shun(obj.target);
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
                region.dma(l.at + got, n, true)?.zero()?;
            }
        }
        Ok(repairs)
    }

    /// Checks a piece that landed in host memory against the server's crc32c, reading it
    /// once more on a mismatch (a transfer damaged on the way); a second mismatch is an error
    /// naming the object and the offset.
    pub(super) async fn verify_piece<B: std::any::Any + Send + Sync>(
        &self,
        region: &Registered<B>,
        l: &mut Landed,
    ) -> Result<()> {
        let Some((obj, oss)) = l.obj.clone() else {
            return Ok(()); // a hole
        };
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
                    fid: obj.fid,
                    target: obj.target,
                    object_offset: l.piece.object_offset,
                    file_offset: l.piece.file_offset,
                    len: n,
                    expected,
                    actual,
                });
            }
            tracing::warn!(
                fid = %obj.fid,
                target = obj.target,
                object_offset = l.piece.object_offset,
                "checksum mismatch on a read; reading the piece again"
            );
            let window = self.client.window(obj.target);
            l.done = read_piece(
                &self.client,
                &self.caps,
                &window,
                &oss,
                obj,
                l.piece.object_offset,
                &l.desc,
            )
            .await?;
        }
        Ok(())
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
