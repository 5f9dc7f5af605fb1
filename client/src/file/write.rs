//! Writes: to every copy in sync, in the caller's order per object, marking a copy that missed one
//! stale before it is acknowledged; the streaming [`Writer`].

use super::*;

impl File {
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
        if let Some(c) = self.contents()? {
            return self
                .write_encrypted(&c, offset, &region, region_offset, len)
                .await;
        }
        self.write_placed(offset, region, region_offset, len, self.append)
            .await
    }

    /// [`File::write_from`] of the bytes as they are to be stored; with `append`, at the end
    /// of the file.
    pub(super) async fn write_placed<B: std::any::Any + Send + Sync>(
        &self,
        offset: u64,
        region: Arc<Registered<B>>,
        region_offset: u64,
        len: u64,
        append: bool,
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
        let turn = match append {
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
        let offset = if append {
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
    pub(super) async fn write_mdt(&self, offset: u64, data: &[u8]) -> Result<()> {
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

    /// Writes `len` bytes of `region` at `offset` to every copy in sync (or to copy `only`,
    /// for a resync: its failure is returned, not marked).
    pub(super) async fn write_copies<B: std::any::Any + Send + Sync>(
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
        let failover = self.failover(&layout);
        let mirrors: Vec<u16> = match only {
            Some(m) => vec![m],
            None => plan::in_sync(&layout),
        };
        let pieces = plan::write(&layout, offset, len, only).map_err(|e| self.plan_error(e))?;
        let mut planned = vec![];
        for p in &pieces {
            let Some((obj, object_offset)) = p.object else {
                return Err(ClientError::fs(
                    FsErrorKind::Io,
                    format!(
                        "{}: copy {} has no objects at offset {}",
                        self.inode.lock().fid,
                        p.mirror,
                        p.file_offset
                    ),
                ));
            };
            planned.push((p, obj, object_offset));
        }
        let servers = self
            .oss_of(&planned.iter().map(|(_, o, _)| o.target).collect())
            .await?;
        let windows: std::collections::HashMap<u32, Arc<Semaphore>> = planned
            .iter()
            .map(|(_, o, _)| (o.target, self.client.window(o.target)))
            .collect();
        let mut tasks = JoinSet::new();
        let sealed = self.client.inner.net.seals_payloads();
        for (p, obj, object_offset) in planned {
            let (mirror, p) = (p.mirror, *p);
            let oss = servers[&obj.target].clone();
            // Its place in the order is taken now, in the caller's order.
            let ticket = self
                .client
                .inner
                .writes
                .begin(obj, object_offset, object_offset + p.len);
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
                    // The bytes' crc32c, for the server to check on arrival (end to end),
                    // unless the connection's tag on each payload already does.
                    let desc = region.desc(
                        region_offset + (p.file_offset - offset),
                        p.len as u32,
                        !sealed,
                    )?;
                    let w = |capa| OstWrite {
                        target: obj.target,
                        fid: obj.fid,
                        offset: object_offset,
                        desc: desc.clone(),
                        sync: false,
                        stamp: ticket.stamp,
                        capa,
                    };
                    let r = client
                        .object_rpc(&caps, &oss, obj.target, obj.fid, w, failover)
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

    /// A write through this handle from `offset` on, acknowledged before it landed (a mount's
    /// write-behind), failed to land. Its bytes are not in the file, and no size this handle
    /// publishes covers them: what was lost reads as the file's end, never as zeros. (The
    /// failure itself is reported by whoever waits for the write.)
    pub fn landing_failed(&self, offset: u64) {
        self.lost_from.fetch_min(offset, Ordering::SeqCst);
        self.client.inner.writes.lost_from(self.fid(), offset);
    }

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
