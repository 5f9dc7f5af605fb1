//! Changing a file's length: truncate, punch holes, on every copy.

use super::*;

impl File {
    /// Tells this handle that the file was cut or extended to `size` through another handle of
    /// this client: it no longer claims to have written past it, and reads up to it (an
    /// extension reads as zeros here too, not as the end of the file).
    pub fn truncated(&self, size: u64) {
        self.inode.lock().size = size;
        self.written_to.fetch_min(size, Ordering::Relaxed);
        self.cut_loss(size);
        self.client.inner.writes.cut(self.fid(), size);
    }

    /// Truncates or extends the file to `size`.
    pub async fn set_len(&self, size: u64) -> Result<()> {
        if !self.writable {
            return Err(ClientError::fs(
                FsErrorKind::BadHandle,
                "the file is not open for writing",
            ));
        }
        match self.contents()? {
            Some(c) => {
                self.resize_encrypted(&c, size, || self.set_len_placed(size))
                    .await
            }
            None => self.set_len_placed(size).await,
        }
    }

    /// [`File::set_len`] on the servers, the bytes as they are stored.
    async fn set_len_placed(&self, size: u64) -> Result<()> {
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
    pub(super) fn cut_loss(&self, size: u64) {
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
        if let Some(c) = self.contents()? {
            // An encrypted unit is all or nothing: the range becomes encrypted zeros, up to
            // the size (its blocks are not freed).
            let end = offset.saturating_add(len).min(self.size().await?);
            let mut at = offset;
            while at < end {
                let n = (end - at).min(1 << 20);
                let zeros = self.client.register(vec![0u8; n as usize])?;
                self.write_encrypted(&c, at, &zeros, 0, n).await?;
                at += n;
            }
            return Ok(());
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
    pub(super) async fn on_every_copy<'a, T, F, Fut>(
        &'a self,
        layout: &'a Layout,
        op: F,
    ) -> Result<Vec<T>>
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
    pub(super) async fn truncate_objects(
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
                self.client
                    .object_rpc(
                        &self.caps,
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
    pub(super) async fn punch_objects(
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
                    let ack = client
                        .object_rpc(&caps, &peer, o.target, o.fid, punch, failover)
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
}

/// How far the file's objects hold bytes: the end of the last file byte any object holds.
pub(super) async fn objects_extent(client: &Client, inode: &Inode, caps: &Caps) -> Result<u64> {
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
            let size = client
                .object_rpc(caps, oss, o.target, o.fid, getattr, None)
                .await?
                .size;
            if let Some(at) = size.checked_sub(1).and_then(|s| c.unmap(stripe as u64, s)) {
                extent = extent.max(at + 1);
            }
        }
    }
    Ok(extent)
}
