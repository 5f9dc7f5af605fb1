//! Durability and closing: fsync, the size published to the MDS, close (now or behind), times set
//! through the handle.

use super::*;

impl File {
    /// Makes every write this client made to the file durable (through any handle), its size
    /// visible to everyone, and every namespace change before it committed at the MDS. Every object is synced even when one fails; a failure is
    /// reported and its writes stay to be synced by the next call. Writes a storage target
    /// lost (its machine restarted before they were synced) are reported as EIO by every
    /// call until the client's last handle on the file closes.
    pub async fn fsync(&self) -> Result<()> {
        self.ready().await?;
        let fid = self.inode.lock().fid;
        self.client.after_closing(fid).await;
        let layout = self.layout_ready().await.ok();
        // A stale copy's objects are left to its resync.
        let stale: Vec<StripeObject> = layout
            .iter()
            .flat_map(|l| &l.components)
            .filter(|c| c.stale)
            .flat_map(|c| c.objects.iter().copied())
            .collect();
        let mut unsynced = self.client.inner.writes.unsynced(fid);
        unsynced.retain(|(o, _)| !stale.contains(o));
        let servers = self
            .oss_of(&unsynced.iter().map(|(o, _)| o.target).collect())
            .await?;
        let mut tasks = JoinSet::new();
        let failover = layout.as_ref().and_then(|l| self.failover(l));
        for (o, seen) in unsynced {
            let (client, oss) = (self.client.clone(), servers[&o.target].clone());
            let caps = self.caps.clone();
            lnet::job::spawn_in(&mut tasks, async move {
                let sync = |capa| OstSync {
                    target: o.target,
                    fid: o.fid,
                    capa,
                };
                let ack = match client
                    .object_rpc(&caps, &oss, o.target, o.fid, sync, failover)
                    .await
                {
                    Ok(ack) => ack,
                    Err(e) => {
                        if let ClientError::Net(lnet::NetError::Remote { err, .. }) = &e {
                            if err.code == proto::StatusCode::Io {
                                client.inner.writes.sync_failed(fid, o);
                            }
                        }
                        return Err((o, e));
                    }
                };
                if client.inner.writes.synced(fid, o, seen, ack.epoch) {
                    Ok(())
                } else {
                    Err((
                        o,
                        ClientError::fs(
                            FsErrorKind::Io,
                            format!(
                                "target {} restarted and lost writes to object {} that were not \
                                 yet synced",
                                o.target, o.fid
                            ),
                        ),
                    ))
                }
            });
        }
        // Failures by copy: a copy that lost or could not sync its writes is marked stale
        // when another copy in sync holds them durably; otherwise the failure is reported.
        let mirror_of = |o: &StripeObject| {
            layout.as_ref().and_then(|l| {
                l.components
                    .iter()
                    .find(|c| c.objects.contains(o))
                    .map(|c| c.mirror)
            })
        };
        let mut failed: std::collections::BTreeMap<Option<u16>, ClientError> = Default::default();
        let objects = async {
            while let Some(r) = tasks.join_next().await {
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err((o, e))) => {
                        failed.entry(mirror_of(&o)).or_insert(e);
                    }
                    Err(e) => {
                        failed
                            .entry(None)
                            .or_insert(ClientError::fs(FsErrorKind::Io, e.to_string()));
                    }
                }
            }
        };
        // The size and the file's name and attributes go to the MDS, and are made durable
        // there, while the storage servers sync: this call succeeds only once both have, and
        // a size the MDS has before the bytes are durable is what any close publishes (an
        // unsynced write lost to a power cut reads as it was before, and the writer's fsync
        // reports it).
        let metadata = async {
            self.publish_size().await?;
            // Its create (and every change before it) is durable at the MDS, not only
            // applied.
            self.client.sync_quiet().await
        };
        let ((), metadata) = tokio::join!(objects, metadata);
        metadata?;
        if !failed.is_empty() {
            let Some(layout) = layout.filter(|l| l.mirror_count() > 1) else {
                return Err(failed.into_values().next().expect("not empty"));
            };
            let stale = layout.stale_mirrors();
            let kept = (0..layout.mirror_count())
                .any(|m| !stale.contains(&m) && !failed.contains_key(&Some(m)));
            if failed.contains_key(&None) || !kept {
                return Err(failed.into_values().next().expect("not empty"));
            }
            for (m, e) in &failed {
                self.mark_stale(&layout, m.expect("checked above"), e)
                    .await?;
            }
            // The copies marked stale are durable too before the sync succeeds.
            self.client.sync_quiet().await?;
        }
        // Changes an eviction lost since this handle's open, or its last report.
        self.client.evicted_since(&self.evictions_seen)
    }

    /// Makes the size this handle wrote visible to every client (what close(2) does).
    pub async fn flush(&self) -> Result<()> {
        self.publish_size().await
    }

    pub(super) async fn publish_size(&self) -> Result<()> {
        // Only after new writes: a publish also sets the mtime, which must not undo a utimes
        // made since (as tar does between close and release).
        if !self.unpublished.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        // Never over bytes this handle's writes failed to put there. (Published sizes only
        // grow: what others made the file stays.)
        let end = self
            .written_to
            .load(Ordering::Relaxed)
            .min(self.lost_from.load(Ordering::SeqCst));
        let inode = self.inode.lock().clone();
        let gen = self.size_gen.load(Ordering::SeqCst);
        match publish(&self.client, &inode, &self.caps, self.handle, end, gen).await {
            Ok((i, gen)) => {
                if let Some(i) = i {
                    *self.inode.lock() = i;
                }
                self.size_gen.store(gen, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                // Still to publish: the next flush or fsync tries again.
                self.unpublished.store(true, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Begins closing this handle behind its caller where it may ([`crate::closing`]): a small
    /// file this handle created ahead and wrote, in a directory this client has held alone
    /// since. The caller then lands the handle's writes and hands their outcome to
    /// [`Behind::finish`], while the caller's close returns. `None`: the close waits for
    /// its writes and publishes the size itself, as usual.
    pub fn close_behind(self: &Arc<File>) -> Option<Behind> {
        let parent = self.created_in?;
        let inner = &self.client.inner;
        if !self.writable
            || !self.unpublished.load(Ordering::SeqCst)
            || self.written_to.load(Ordering::Relaxed) > crate::closing::MAX_BEHIND_BYTES
            || !inner.closings.has_room()
        {
            return None;
        }
        // Under the gate a recall is applied under: the recall either came before (and this
        // close waits as usual) or waits for this one.
        let _gate = inner.pending.gate.lock();
        if self.client.lease_recalls() != self.recalls_at_create || !inner.leases.live() {
            return None;
        }
        let fid = self.fid();
        let closing = inner.closings.begin(fid, parent);
        inner.leases.moving(fid);
        self.behind.store(true, Ordering::SeqCst);
        Some(Behind {
            closing,
            file: self.clone(),
            dir: parent,
        })
    }

    /// Whether this handle was closed behind its caller ([`File::close_behind`]).
    pub fn closed_behind(&self) -> bool {
        self.behind.load(Ordering::SeqCst)
    }

    /// Queues the size this handle's writes reached with the changes answered ahead, instead
    /// of sending it and waiting ([`crate::pending`]).
    pub(super) async fn publish_queued(&self) -> Option<crate::pending::Sent> {
        let inner = &self.client.inner;
        inner.pending.room().await;
        if !self.unpublished.swap(false, Ordering::SeqCst) {
            return None;
        }
        let fid = self.fid();
        let r = proto::md::MdsReint {
            creds: self.client.creds().clone(),
            mutation: Mutation::GrowSize {
                fid,
                size: self.written_to.load(Ordering::Relaxed),
            },
            req: Some(self.client.next_req()),
            acked: 0,
            open: Some(self.handle),
            size_gen: Some(self.size_gen.load(Ordering::SeqCst)),
            behind: true,
            lease: inner.leases.live(),
            time: None,
        };
        Some(inner.pending.push_quiet(proto::md::BatchOp::Reint(r), fid))
    }

    /// Closes the file: its size becomes visible to every client that opens it next
    /// (close-to-open). Data is durable only after `fsync`.
    pub async fn close(self) -> Result<()> {
        let client = self.client.clone();
        let seen = AtomicU64::new(self.evictions_seen.load(Ordering::SeqCst));
        let closed = self.close_here().await;
        // Changes an eviction lost since this handle's open, or its last report.
        closed.and_then(|()| client.evicted_since(&seen))
    }

    pub(super) async fn close_here(self) -> Result<()> {
        self.closed.store(true, Ordering::SeqCst);
        if !self.ready.load(Ordering::SeqCst) {
            // Created ahead and not used: the close goes after the create, in the queue.
            let fid = self.inode.lock().fid;
            self.client.inner.writes.closed(fid);
            self.client.inner.opens.remove(self.handle.handle);
            if let Some(Err(e)) = self.ahead.as_ref().and_then(|s| s.now()) {
                return Err(e);
            }
            self.client
                .close_ahead(self.handle, fid, self.ahead.as_ref());
            return Ok(());
        }
        let published = self.publish_size().await;
        let fid = self.inode.lock().fid;
        self.client.inner.writes.closed(fid);
        if self.behind.load(Ordering::SeqCst)
            && published.is_ok()
            && self.client.inner.pending.touching(fid).is_some()
        {
            // Closed behind, its size still going with the changes answered ahead: so does
            // the close, which answers nothing.
            self.client.inner.opens.remove(self.handle.handle);
            self.client
                .close_ahead(self.handle, fid, self.ahead.as_ref());
            return Ok(());
        }
        if published.is_ok() {
            // Kept past the close while the file's lease holds: the next open of it here
            // takes the handle without asking the MDS ([`crate::kept`]).
            let inner = &self.client.inner;
            let gen = self.size_gen.load(Ordering::SeqCst);
            if inner
                .kept
                .keep(&inner.leases, fid, self.handle, self.caps.clone(), gen)
                .is_ok()
            {
                return Ok(());
            }
        }
        if published.is_ok() && (self.ahead.is_some() || self.behind.load(Ordering::SeqCst)) {
            // Made or closed behind here: its close goes with the changes answered ahead.
            self.client.inner.opens.remove(self.handle.handle);
            self.client
                .close_ahead(self.handle, fid, self.ahead.as_ref());
            return Ok(());
        }
        self.client.close_handle(self.handle, fid).await?;
        published
    }

    /// Closes the file as [`File::close`] does, for a caller nobody waits on (a mount's
    /// release): a handle whose create or size is still on its way with the changes answered
    /// ahead ([`crate::pending`]) waits for their answer, so that it may be kept past its close
    /// as any other ([`crate::kept`]) and the file opens again here without the MDS.
    pub async fn close_unwaited(self) -> Result<()> {
        let inner = &self.client.inner;
        let fid = self.fid();
        if (self.ahead.is_some() || self.behind.load(Ordering::SeqCst))
            && inner.leases.live()
            && inner.kept.has_room()
        {
            if let Some(last) = inner.pending.touching(fid) {
                inner.pending.answered_to(last).await;
            }
            // Taken in, so that the handle has the objects and capabilities the MDS gave; a
            // create that failed is reported by the close.
            let _ = self.ready().await;
        }
        self.close().await
    }

    /// Marks the file changed (ctime, and mtime with `modified`) on behalf of this handle.
    pub async fn touch(&self, modified: bool) -> Result<()> {
        let attr = SetAttr {
            mtime: modified.then(proto::md::Time::now),
            times_now: true,
            ..Default::default()
        };
        self.set_by_handle(attr).await.map(|_| ())
    }

    /// Sets the mtime of this handle's writes as the writer's clock took it (what a page cache
    /// that keeps the mtime of cached writes hands over when it writes them back, as a Lustre
    /// client's close carries it). The handle must be open for writing.
    pub async fn set_mtime(&self, mtime: proto::md::Time) -> Result<Inode> {
        if !self.writable {
            return Err(ClientError::fs(
                FsErrorKind::BadHandle,
                "the file is not open for writing",
            ));
        }
        let attr = SetAttr {
            mtime: Some(mtime),
            ..Default::default()
        };
        self.set_by_handle(attr).await
    }

    /// A change of times through the open handle, as for a truncate: the open was the check.
    pub(super) async fn set_by_handle(&self, attr: SetAttr) -> Result<Inode> {
        let fid = self.inode.lock().fid;
        let done = self
            .client
            .reint_with(Mutation::Setattr { fid, attr }, Some(self.handle))
            .await?;
        if let Some(i) = done.inode {
            *self.inode.lock() = i;
        }
        Ok(self.inode())
    }
}

/// Publishes that a writer wrote up to `end` of the file `inode`, if no truncate came since
/// the writer learnt size generation `gen`. If one did, the writes may be older than the
/// truncate: the file's true extent is read from its objects, and only what they hold is
/// published. Returns the file's fresh attributes and size generation.
pub(super) async fn publish(
    client: &Client,
    inode: &Inode,
    caps: &Caps,
    handle: OpenHandle,
    end: u64,
    gen: u64,
) -> Result<(Option<Inode>, u64)> {
    let fid = inode.fid;
    let grow = |size| Mutation::GrowSize { fid, size };
    // Through the open handle: a writer needs no write permission now (its open was the
    // check).
    match client.reint_if(grow(end), Some(handle), Some(gen)).await {
        Ok(r) => Ok((r.inode, r.size_gen)),
        Err(e) if e.is(FsErrorKind::Stale) => {
            let held = objects_extent(client, inode, caps).await?;
            match client
                .reint_if(grow(end.min(held)), Some(handle), None)
                .await
            {
                Ok(r) => Ok((r.inode, r.size_gen)),
                // Without a size generation to check, only a file that is gone is stale: its
                // last name was removed (here or by another client) while this handle held
                // it open. No one can open it again, so there is no size to publish; its
                // bytes stay in its objects for the handles still open, as POSIX keeps an
                // unlinked open file.
                Err(e) if e.is(FsErrorKind::Stale) => Ok((None, gen)),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// A close finishing behind its caller ([`File::close_behind`]).
pub struct Behind {
    closing: crate::closing::Closing,
    file: Arc<File>,
    dir: proto::Fid,
}

impl Behind {
    /// Finishes the close once the handle's writes have landed (`landed`: their outcome):
    /// the size they reached is queued after the changes answered ahead so far, or, if they
    /// failed, nothing is published over them and the failure waits for the next `fsync`.
    pub async fn finish(self, landed: Result<()>) {
        let Behind { closing, file, dir } = self;
        let inner = &file.client.inner;
        let fid = file.fid();
        // Kept for the next fsync of the file or its directory, or sync.
        let keep = |e: &ClientError| {
            inner.pending.failed(crate::pending::Failed {
                dir: Some(dir),
                fid: Some(fid),
                kind: e.kind(),
                what: e.to_string(),
            })
        };
        let sent = match landed {
            Ok(()) => file.publish_queued().await,
            Err(e) => {
                file.unpublished.store(false, Ordering::SeqCst);
                keep(&e);
                None
            }
        };
        if let Some(s) = &sent {
            inner.closings.queued(s.seq());
        }
        // Finished: what follows is ordered by the queue.
        drop(closing);
        let Some(sent) = sent else {
            return;
        };
        let failed = match sent.reply().await {
            Ok(r) => {
                if let Some(i) = r.inode {
                    *file.inode.lock() = i;
                }
                file.size_gen.store(r.size_gen, Ordering::SeqCst);
                return;
            }
            // A truncate came in between, or the file is gone (unlinked while this handle was
            // open): published again as a close does, up to what the objects hold.
            Err(e) if e.is(FsErrorKind::Stale) => {
                file.unpublished.store(true, Ordering::SeqCst);
                match file.publish_size().await {
                    Ok(()) => return,
                    Err(e) if e.is(FsErrorKind::Stale) => {
                        // Gone: no one can open it again, so nothing is lost to anyone.
                        file.unpublished.store(false, Ordering::SeqCst);
                        tracing::debug!(%fid, "a file closed behind was removed meanwhile");
                        return;
                    }
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        tracing::warn!(%fid, error = %failed, "a size published behind its close failed");
        keep(&failed);
    }
}
