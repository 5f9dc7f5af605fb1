//! Striped directories ([`proto::dirstripe`]): made, removed and kept in line by the MDS of
//! their master, which coordinates the MDSs of the shards as a server.
//!
//! The master's layout says how far its making or removal went, journaled before each step,
//! so the MDS finishes what a crash interrupted when it starts again:
//!
//! - **mkdir**: the master is named, its layout `Building` (one journaled change, the
//!   client's request, answered from the reply cache if resent); each shard is made on its
//!   MDT (made once however often asked); the layout lists them, `Ready`. Names in the
//!   directory wait (clients are told to read the layout again) until it is `Ready`.
//! - **rmdir**: the layout goes `Removing`; each shard is frozen (refused if it holds a name,
//!   and a frozen shard takes no new name); if one was not empty, every shard thaws and the
//!   layout is `Ready` again (ENOTEMPTY); otherwise every shard is removed, the layout goes
//!   `Emptied`, and the master's name goes. A master found `Emptied` after a restart is
//!   removed: the decision was made.
//!
//! Nothing a client made in a shard can be lost by either: a shard is removed only frozen and
//! empty, and freezing refuses a shard with a name in it.

use proto::dirstripe::{DirStripe, ShardOf, StripeState};

use super::*;

impl MdsService {
    /// The MDTs of the filesystem, in index order (this one included).
    pub(super) async fn mdt_indices(&self) -> Result<Vec<u32>, RemoteError> {
        let own = self.registry.filesystem().mdt;
        let listed = match &self.mdt0 {
            None => self.registry.mdts(),
            Some(mdt0) => {
                lnet::call(
                    self.alloc.net(),
                    mdt0,
                    &ListMdts {},
                    super::remote::PEER_CALL,
                )
                .await
                .map_err(|e| super::remote::peer_error(0, e))?
                .mdts
            }
        };
        let mut all: Vec<u32> = listed.into_iter().map(|m| m.index).collect();
        all.push(own);
        if self.mdt0.is_some() {
            all.push(0);
        }
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }

    /// Checks a striped mkdir against the MDTs there are, before anything is made; a stripe of
    /// one becomes a plain mkdir (here, or on the MDT asked).
    pub(super) async fn mkdir_striped(&self, m: &mut Mutation) -> Result<(), RemoteError> {
        let Mutation::MkdirStriped {
            parent,
            name,
            mode,
            count,
            offset,
            ..
        } = m
        else {
            return Ok(());
        };
        let mdts = self.mdt_indices().await?;
        let invalid = |what: String| RemoteError::new(StatusCode::Fs(FsErrorKind::Invalid), what);
        if let Some(o) = offset {
            if !mdts.contains(o) {
                return Err(invalid(format!(
                    "MDT{o} is not an MDT of this filesystem (it has {mdts:?})"
                )));
            }
        }
        if *count as usize > mdts.len() {
            return Err(invalid(format!(
                "a directory striped over {count} MDTs, but the filesystem has {}",
                mdts.len()
            )));
        }
        if *count <= 1 {
            let own = self.registry.filesystem().mdt;
            *m = match offset.filter(|o| *o != own) {
                Some(mdt) => Mutation::MkdirOn {
                    parent: *parent,
                    name: std::mem::take(name),
                    mode: *mode,
                    mdt,
                },
                None => Mutation::Create {
                    parent: *parent,
                    name: std::mem::take(name),
                    kind: Kind::Dir,
                    mode: *mode,
                    exclusive: true,
                    target: vec![],
                    layout: None,
                },
            };
            // A plain mkdir on another MDT goes the way of one (`mkdir_on`, next).
        }
        Ok(())
    }

    /// `m` carried out by MDT `mdt` (this one's own store when it is this MDT), as a server,
    /// durable when answered.
    pub(super) async fn on_shard_mdt(
        &self,
        mdt: u32,
        m: Mutation,
    ) -> Result<MdsReintReply, RemoteError> {
        if mdt == self.registry.filesystem().mdt {
            let done = self.apply_own(m, None).await?;
            return Ok(MdsReintReply {
                inode: done.applied.inode,
                created: true,
                size_gen: 0,
                grant: None,
                transno: done.transno,
                committed: self.store.committed(),
                instance: self.instance,
                ticket: vec![],
                leased: false,
                changed: vec![],
                after: vec![],
            });
        }
        self.on_mdt(mdt, &Creds::root(), m, None).await
    }

    /// The layout of `fid` now, when it is a striped directory here.
    pub(super) fn stripe_now(&self, fid: proto::Fid) -> Option<(Inode, DirStripe)> {
        self.store
            .read(|ns| ns.inode(fid).ok().cloned())
            .and_then(|i| proto::dirstripe::of_inode(&i).map(|s| (i, s)))
    }

    /// Journals `stripe` as `fid`'s layout.
    async fn set_stripe(&self, fid: proto::Fid, stripe: DirStripe) -> Result<Inode, RemoteError> {
        let done = self
            .apply_own(Mutation::SetDirStripe { fid, stripe }, None)
            .await?;
        done.applied.inode.ok_or_else(|| {
            RemoteError::new(StatusCode::Io, format!("{fid}: no inode after its layout"))
        })
    }

    /// Makes the shards of `fid`, a striped directory `Building`, and lists them: the
    /// directory as it is then.
    pub(super) async fn build_stripe(&self, fid: proto::Fid) -> Result<Inode, RemoteError> {
        let _one = self.striping.lock().await;
        let Some((master, stripe)) = self.stripe_now(fid) else {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::Stale),
                format!("{fid} is no striped directory"),
            ));
        };
        if stripe.state != StripeState::Building {
            return Ok(master);
        }
        let mdts = self.mdt_indices().await?;
        let first = mdts.iter().position(|k| *k == stripe.offset).unwrap_or(0);
        let mut shards = Vec::with_capacity(stripe.count as usize);
        for j in 0..stripe.count {
            let mdt = mdts[(first + j as usize) % mdts.len()];
            let made = self
                .on_shard_mdt(
                    mdt,
                    Mutation::MakeShard {
                        shard: ShardOf {
                            master: fid,
                            index: j,
                            count: stripe.count,
                            hash: stripe.hash,
                            frozen: false,
                        },
                        mode: master.mode,
                        uid: master.uid,
                        gid: master.gid,
                        layout: master.layout.clone(),
                    },
                )
                .await?;
            let shard = made.inode.ok_or_else(|| {
                RemoteError::new(
                    StatusCode::Io,
                    format!("MDT{mdt} made no shard {j} of {fid}"),
                )
            })?;
            if proto::fid::mdt_of(shard.fid) != Some(mdt) {
                return Err(RemoteError::new(
                    StatusCode::Io,
                    format!("MDT{mdt} answered shard {j} of {fid} with {}", shard.fid),
                ));
            }
            shards.push(shard.fid);
        }
        let ready = DirStripe {
            shards,
            state: StripeState::Ready,
            ..stripe
        };
        let made = self.set_stripe(fid, ready).await?;
        tracing::info!(%fid, count = stripe.count, "striped directory made");
        Ok(made)
    }

    /// Before an rmdir of a striped directory is applied: its shards removed (only when every
    /// one is empty; ENOTEMPTY otherwise, and the directory as it was).
    pub(super) async fn rmdir_striped(
        &self,
        m: &Mutation,
        creds: &Creds,
    ) -> Result<(), RemoteError> {
        let Mutation::Unlink {
            parent,
            name,
            dir: true,
        } = m
        else {
            return Ok(());
        };
        let victim = self.store.read(|ns| {
            ns.lookup(*parent, name, creds)
                .ok()
                .filter(|i| i.kind == Kind::Dir && !i.xattrs.is_empty())
                .map(|i| i.fid)
        });
        let Some(fid) = victim else {
            return Ok(());
        };
        if self.stripe_now(fid).is_none() {
            return Ok(());
        }
        self.store
            .read(|ns| ns.may_remove(*parent, name, creds))
            .map_err(ns_error)?;
        self.empty_stripe(fid).await
    }

    /// Freezes and removes every shard of `fid`, a striped directory, leaving it `Emptied`; or,
    /// when one is not empty, thaws them and leaves it `Ready` (ENOTEMPTY).
    async fn empty_stripe(&self, fid: proto::Fid) -> Result<(), RemoteError> {
        let _one = self.striping.lock().await;
        let Some((_, mut stripe)) = self.stripe_now(fid) else {
            return Ok(());
        };
        match stripe.state {
            StripeState::Emptied => return Ok(()),
            StripeState::Building => {
                return Err(RemoteError::new(
                    StatusCode::Busy,
                    format!("{fid}: its shards are still being made"),
                ))
            }
            StripeState::Ready | StripeState::Removing => {}
        }
        stripe.state = StripeState::Removing;
        self.set_stripe(fid, stripe.clone()).await?;
        // Stays Removing on any other error: finished or undone after, by a resend or the
        // MDS's own pass.
        if let Some(e) = self.freeze_shards(&stripe.shards, true).await? {
            self.freeze_shards(&stripe.shards, false).await?;
            stripe.state = StripeState::Ready;
            self.set_stripe(fid, stripe).await?;
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotEmpty),
                format!("{fid} is not empty: {}", e.message),
            ));
        }
        for shard in &stripe.shards {
            let mdt = proto::fid::mdt_of(*shard).unwrap_or(0);
            self.on_shard_mdt(mdt, Mutation::RmdirShard { fid: *shard })
                .await?;
        }
        stripe.state = StripeState::Emptied;
        self.set_stripe(fid, stripe).await?;
        Ok(())
    }

    /// Freezes (or thaws) each of `shards` on its MDT, in order; a shard gone already (a
    /// removal before a crash got that far) is passed. Freezing stops at a shard that is not
    /// empty: its refusal is returned.
    async fn freeze_shards(
        &self,
        shards: &[proto::Fid],
        frozen: bool,
    ) -> Result<Option<RemoteError>, RemoteError> {
        for shard in shards {
            let mdt = proto::fid::mdt_of(*shard).unwrap_or(0);
            let m = Mutation::FreezeShard {
                fid: *shard,
                frozen,
            };
            match self.on_shard_mdt(mdt, m).await {
                Ok(_) => {}
                Err(e) if frozen && e.code == StatusCode::Fs(FsErrorKind::NotEmpty) => {
                    return Ok(Some(e))
                }
                Err(e) if e.code == StatusCode::Fs(FsErrorKind::Stale) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Finishes what a restart interrupted: striped directories being made are made, those
    /// being removed are removed (or kept, if a shard holds a name), those emptied lose their
    /// name. True once none is left (another MDT may be down: tried again later).
    pub(super) async fn settle_stripes_once(&self) -> bool {
        let mut left = 0;
        for (fid, stripe) in self.store.read(|ns| ns.unsettled_stripes()) {
            let done = match stripe.state {
                StripeState::Building => self.build_stripe(fid).await.map(|_| ()),
                StripeState::Removing => match self.empty_stripe(fid).await {
                    Err(e) if e.code == StatusCode::Fs(FsErrorKind::NotEmpty) => Ok(()),
                    other => other,
                },
                StripeState::Emptied => self.unname_emptied(fid).await,
                StripeState::Ready => Ok(()),
            };
            if let Err(e) = done {
                left += 1;
                tracing::warn!(%fid, state = ?stripe.state, error = %e, "a striped directory's shards are not settled yet; trying again");
            }
        }
        left == 0
    }

    /// Removes the name of `fid`, a striped directory whose shards are removed.
    async fn unname_emptied(&self, fid: proto::Fid) -> Result<(), RemoteError> {
        let named = self.store.read(|ns| ns.name_of_dir(fid));
        let Some((parent, name)) = named else {
            return Ok(());
        };
        self.apply_own(
            Mutation::Unlink {
                parent,
                name,
                dir: true,
            },
            None,
        )
        .await
        .map(|_| ())
    }

    /// After a change of a striped directory's owner, group or mode: the same on each shard,
    /// whose MDS decides by them who may add or remove names there.
    pub(super) async fn restripe_attrs(&self, m: &Mutation) {
        let Mutation::Setattr { fid, .. } = m else {
            return;
        };
        let Some((master, stripe)) = self.stripe_now(*fid) else {
            return;
        };
        for shard in &stripe.shards {
            let mdt = proto::fid::mdt_of(*shard).unwrap_or(0);
            let set = Mutation::Setattr {
                fid: *shard,
                attr: SetAttr {
                    mode: Some(master.mode),
                    uid: Some(master.uid),
                    gid: Some(master.gid),
                    ..SetAttr::default()
                },
            };
            if let Err(e) = self.on_shard_mdt(mdt, set).await {
                tracing::warn!(%fid, shard = %shard, error = %e, "a shard keeps its former owner or mode");
            }
        }
    }
}
