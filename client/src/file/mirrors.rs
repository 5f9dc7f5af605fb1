//! A file's copies: read one alone, mark one stale, place one anew, resync, repair bytes that
//! failed their checksum.

use super::*;

impl File {
    /// Reads `len` bytes at `offset` from copy `mirror` alone, in sync or not (holes and the
    /// end of its objects read as zeros): to compare copies.
    pub async fn read_copy(&self, mirror: u16, offset: u64, len: u64) -> Result<Vec<u8>> {
        let layout = self.layout_ready().await?;
        let plan = plan::read_copy(&layout, mirror, offset, len).map_err(|e| self.plan_error(e))?;
        let region = self.client.register(vec![0u8; len as usize])?;
        // Checked as every read is; a piece that fails its checksum twice is an error, not
        // bytes to compare.
        self.execute(&plan, &region, 0, None).await?;
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
    pub(super) async fn place_mirror(
        &self,
        mirror: u16,
        generation: u32,
        exclude: &[u32],
    ) -> Result<()> {
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

    /// Gives copy `mirror` (stale) new objects, as a copytool does before it restores a
    /// released file's bytes into them; returns the layout generation after.
    pub async fn place_copy(&self, mirror: u16) -> Result<u32> {
        let layout = self.layout_any()?;
        self.place_mirror(mirror, layout.generation, &[]).await?;
        Ok(self.layout_any()?.generation)
    }

    /// The layout generation, when copy `mirror` has objects (placed by the MDS, as a
    /// restore's are when it is queued).
    pub fn copy_placed(&self, mirror: u16) -> Option<u32> {
        let l = self.layout_any().ok()?;
        let mut copy = l
            .components
            .iter()
            .filter(|c| c.mirror == mirror)
            .peekable();
        copy.peek()?;
        copy.all(|c| c.is_instantiated()).then_some(l.generation)
    }

    /// Writes `data` at `offset` into copy `mirror` alone (in sync or not).
    pub async fn write_copy(&self, mirror: u16, offset: u64, data: Vec<u8>) -> Result<()> {
        let len = data.len() as u64;
        let region = Arc::new(self.client.register(data)?);
        self.write_copies(offset, &region, 0, len, Some(mirror))
            .await
    }

    /// Cuts copy `mirror`'s objects to `size` and makes them durable: the end of a restore.
    pub async fn finish_copy(&self, mirror: u16, size: u64) -> Result<()> {
        let copy = self.layout_any()?.mirror(mirror);
        self.truncate_objects(copy.clone(), size, None).await?;
        self.sync_objects(&copy).await
    }

    /// The open the MDS counts for this handle.
    pub fn open_handle(&self) -> OpenHandle {
        self.handle
    }

    /// The layout as it is, objects or not (checked).
    fn layout_any(&self) -> Result<Layout> {
        let i = self.inode.lock();
        let l = i
            .layout
            .clone()
            .ok_or_else(|| ClientError::fs(FsErrorKind::Invalid, "a file with no layout"))?;
        l.validate()
            .map_err(|e| ClientError::fs(FsErrorKind::Io, format!("{}: bad layout: {e}", i.fid)))?;
        Ok(l)
    }

    /// Makes every object of `layout` (one copy) durable.
    pub(super) async fn sync_objects(&self, layout: &Layout) -> Result<()> {
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
            self.client
                .object_rpc(&self.caps, &servers[&o.target], o.target, o.fid, sync, None)
                .await?;
        }
        Ok(())
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
}
