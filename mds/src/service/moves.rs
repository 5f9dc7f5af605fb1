//! Renames of files between directories of two MDTs ([`crate::namespace`]'s `moves`), and
//! hard links of files to another MDT's directories (the same, the file's MDS coordinating
//! and the old name staying): this MDS, the old name's, coordinates; the new name's MDS names the file as a server would be
//! asked to. The move is recorded on the file before the other MDT is asked, so a crash of
//! either MDS, or of the client, ends it one way: this MDS asks again after its restart (the
//! request numbered as the first, so the other carries it out once), and ends it as the
//! answer says. A client that resends its rename meanwhile is answered when it ends.
//!
//! Names of other MDTs' files that go are reported to their home here too
//! ([`MdsService::report_dropped_once`]).

use proto::md::{Linking, Moving};

use super::*;

impl MdsService {
    /// Whether `m` is a rename from a directory of this MDT to one of another, or of another
    /// MDT's directory between two directories here (whose MDT must learn its new parent).
    pub(super) fn moves_across(&self, m: &Mutation) -> bool {
        let own = self.registry.filesystem().mdt;
        let mdt = |f: &proto::Fid| proto::fid::mdt_of(*f).unwrap_or(0);
        let Mutation::Rename {
            parent,
            name,
            new_parent,
            flags,
            ..
        } = m
        else {
            return false;
        };
        if mdt(parent) != own {
            return false;
        }
        if mdt(new_parent) != own {
            return true;
        }
        parent != new_parent
            && !flags.exchange
            && self.store.read(|ns| {
                ns.lookup(*parent, name, &Creds::root())
                    .is_ok_and(|i| i.kind == Kind::Dir && ns.is_remote(i.fid))
            })
    }

    /// The directory `m`'s move records, when it moves one.
    fn moved_dir(&self, m: &Moving) -> Option<proto::Fid> {
        self.store.read(|ns| {
            ns.lookup(m.parent, &m.name, &Creds::root())
                .ok()
                .filter(|i| i.kind == Kind::Dir)
                .map(|i| i.fid)
        })
    }

    /// Whether `m` is a hard link of a file of this MDT into a directory of another.
    pub(super) fn links_across(&self, m: &Mutation) -> bool {
        let own = self.registry.filesystem().mdt;
        let mdt = |f: &proto::Fid| proto::fid::mdt_of(*f).unwrap_or(0);
        matches!(m, Mutation::Link { fid, parent, .. }
            if mdt(fid) == own && mdt(parent) != own)
    }

    /// A hard link of a file of this MDT into a directory of another, carried out or refused
    /// whole: counted and recorded on the file here, named there, then the record goes (or
    /// the count, if the other MDT refused).
    pub(super) async fn link_across(&self, r: &MdsReint) -> Result<MdsReintReply, RemoteError> {
        let Mutation::Link { fid, parent, name } = &r.mutation else {
            return Err(RemoteError::new(StatusCode::Invalid, "not a link"));
        };
        let _one = self.moving.lock().await;
        if let Some(done) = r.req.and_then(|q| self.store.read(|ns| ns.replied(q))) {
            return Ok(self.moved_reply(done.inode, 0));
        }
        let pending = self
            .store
            .read(|ns| ns.linking())
            .into_iter()
            .find(|l| l.fid == *fid && l.new_parent == *parent && l.new_name == *name);
        let linking = match pending {
            Some(l) if r.req.is_some() && l.client_req == r.req => l,
            Some(_) => {
                return Err(RemoteError::new(
                    StatusCode::Busy,
                    "another link of this file to this name is under way",
                ))
            }
            None => {
                let l = Linking {
                    fid: *fid,
                    new_parent: *parent,
                    new_name: name.clone(),
                    creds: r.creds.clone(),
                    client_req: r.req,
                    peer_req: self.peer_req(None),
                };
                self.apply_step(Mutation::LinkOut { linking: l.clone() }, &r.creds)
                    .await?;
                l
            }
        };
        self.finish_link(&linking).await
    }

    /// Asks the new name's MDT to name the file, then ends the link as it answers. No answer
    /// leaves it recorded (asked again later).
    async fn finish_link(&self, l: &Linking) -> Result<MdsReintReply, RemoteError> {
        let inode = self
            .store
            .read(|ns| ns.inode(l.fid).cloned())
            .map_err(ns_error)?;
        let mdt = proto::fid::mdt_of(l.new_parent).unwrap_or(0);
        let link = Mutation::LinkIn {
            parent: l.new_parent,
            name: l.new_name.clone(),
            inode,
            noreplace: true,
        };
        match self.on_mdt_numbered(mdt, &l.creds, link, l.peer_req).await {
            Ok(_) => {
                let done = self
                    .apply_own(
                        Mutation::LinkDone {
                            fid: l.fid,
                            peer_req: l.peer_req,
                        },
                        l.client_req,
                    )
                    .await?;
                Ok(self.moved_reply(done.applied.inode, done.transno))
            }
            Err(e) if matches!(e.code, StatusCode::Fs(_)) => {
                self.apply_own(
                    Mutation::LinkAbort {
                        fid: l.fid,
                        peer_req: l.peer_req,
                    },
                    None,
                )
                .await?;
                Err(e)
            }
            Err(e) => {
                self.across.notify_one();
                Err(e)
            }
        }
    }

    /// A rename to a directory of another MDT (or of another MDT's directory between two
    /// here), carried out or refused whole.
    pub(super) async fn rename_across(&self, r: &MdsReint) -> Result<MdsReintReply, RemoteError> {
        let Mutation::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } = &r.mutation
        else {
            return Err(RemoteError::new(StatusCode::Invalid, "not a rename"));
        };
        if flags.exchange {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::CrossDevice),
                "RENAME_EXCHANGE between two MDTs is not supported",
            ));
        }
        let _one = self.moving.lock().await;
        // Asked after the lock: a resend that waited for it behind this MDS's own carrying on
        // of the same move (after a restart, or a step the other MDT did not answer) finds it
        // ended, and is answered so, not refused for a name that has moved.
        if let Some(done) = r.req.and_then(|q| self.store.read(|ns| ns.replied(q))) {
            return Ok(self.moved_reply(done.inode, 0));
        }
        let pending = self
            .store
            .read(|ns| ns.moving())
            .into_iter()
            .find(|m| m.parent == *parent && m.name == *name);
        let moving = match pending {
            // This request's, resent (its answer lost, or this MDS restarted): carried on.
            Some(m) if r.req.is_some() && m.client_req == r.req => m,
            Some(_) => {
                return Err(RemoteError::new(
                    StatusCode::Busy,
                    "another rename of this name is under way",
                ))
            }
            None => {
                let m = Moving {
                    parent: *parent,
                    name: name.clone(),
                    new_parent: *new_parent,
                    new_name: new_name.clone(),
                    creds: r.creds.clone(),
                    client_req: r.req,
                    peer_req: self.peer_req(None),
                };
                // A directory: under the rename lock from the check that it does not move
                // below itself until the move ends (kept through any crash with the record).
                let dir = self.moved_dir(&m);
                if let Some(d) = dir {
                    self.no_other_dir_move(m.peer_req)?;
                    self.lock_renames(m.peer_req).await?;
                    let checked = match self.not_below_itself(&[(d, m.new_parent)]).await {
                        Ok(()) => self.may_reparent_remote(d, &r.creds).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = checked {
                        self.unlock_renames().await;
                        return Err(e);
                    }
                }
                let out = self
                    .apply_step(Mutation::MoveOut { moving: m.clone() }, &r.creds)
                    .await;
                if let Err(e) = out {
                    if dir.is_some() {
                        self.unlock_renames().await;
                    }
                    return Err(e);
                }
                m
            }
        };
        self.finish_move(&moving, flags.noreplace).await
    }

    /// Asks the new name's MDT to name the file, then ends the move as it answers: done, or
    /// undone when it refused. No answer leaves it recorded (asked again later).
    async fn finish_move(&self, m: &Moving, noreplace: bool) -> Result<MdsReintReply, RemoteError> {
        let inode = self
            .store
            .read(|ns| ns.lookup(m.parent, &m.name, &Creds::root()).cloned())
            .map_err(ns_error)?;
        let own = self.registry.filesystem().mdt;
        let mdt = proto::fid::mdt_of(m.new_parent).unwrap_or(0);
        let home = proto::fid::mdt_of(inode.fid).unwrap_or(0);
        let dir = inode.kind == Kind::Dir;
        let fid = inode.fid;
        let link = Mutation::LinkIn {
            parent: m.new_parent,
            name: m.new_name.clone(),
            inode,
            noreplace,
        };
        let linked = if mdt == own {
            // Another MDT's directory renamed between two directories here.
            self.apply_step(link, &m.creds).await.map(|_| ())
        } else {
            self.on_mdt_numbered(mdt, &m.creds, link, m.peer_req)
                .await
                .map(|_| ())
        };
        let linked = match linked {
            // A directory of a third MDT: its parent there is the new one now.
            Ok(()) if dir && home != own && home != mdt => {
                let step = Mutation::Reparent {
                    dir: fid,
                    parent: m.new_parent,
                };
                match self
                    .on_mdt_numbered(home, &Creds::root(), step, m.peer_req)
                    .await
                {
                    Err(e) if matches!(e.code, StatusCode::Fs(_)) => {
                        tracing::error!(dir = %fid, mdt = home, error = %e, "a moved directory's MDT refused its new parent: fsck will report it");
                        Ok(())
                    }
                    other => other.map(|_| ()),
                }
            }
            other => other,
        };
        match linked {
            Ok(()) => {
                let done = self
                    .apply_own(
                        Mutation::MoveDone {
                            parent: m.parent,
                            name: m.name.clone(),
                        },
                        m.client_req,
                    )
                    .await?;
                if dir {
                    self.unlock_renames().await;
                }
                Ok(self.moved_reply(done.applied.inode, done.transno))
            }
            Err(e) if matches!(e.code, StatusCode::Fs(_)) => {
                self.apply_own(
                    Mutation::MoveAbort {
                        parent: m.parent,
                        name: m.name.clone(),
                    },
                    None,
                )
                .await?;
                if dir {
                    self.unlock_renames().await;
                }
                Err(e)
            }
            Err(e) => {
                // Left recorded: carried on by the client's resend, or by this MDS's own pass.
                self.across.notify_one();
                Err(e)
            }
        }
    }

    fn moved_reply(&self, inode: Option<Inode>, transno: u64) -> MdsReintReply {
        MdsReintReply {
            inode,
            created: true,
            size_gen: 0,
            grant: None,
            transno,
            committed: self.store.committed(),
            instance: self.instance,
            ticket: vec![],
            leased: false,
            changed: vec![],
            after: vec![],
        }
    }

    /// Carries on the moves a restart interrupted; true once none is left.
    pub(super) async fn resume_moves_once(&self) -> bool {
        let mut left = 0;
        for m in self.store.read(|ns| ns.moving()) {
            let _one = self.moving.lock().await;
            // Ended meanwhile (its client's resend carried it on)?
            let still = self
                .store
                .read(|ns| ns.moving())
                .into_iter()
                .any(|p| p == m);
            if !still {
                continue;
            }
            match self.finish_move(&m, false).await {
                Ok(_) => {}
                Err(e) if matches!(e.code, StatusCode::Fs(_)) => {}
                Err(e) => {
                    left += 1;
                    tracing::warn!(from = %m.parent, to = %m.new_parent, error = %e, "a rename to another MDT waits for it");
                }
            }
        }
        for l in self.store.read(|ns| ns.linking()) {
            let _one = self.moving.lock().await;
            let still = self
                .store
                .read(|ns| ns.linking())
                .into_iter()
                .any(|p| p == l);
            if !still {
                continue;
            }
            match self.finish_link(&l).await {
                Ok(_) => {}
                Err(e) if matches!(e.code, StatusCode::Fs(_)) => {}
                Err(e) => {
                    left += 1;
                    tracing::warn!(fid = %l.fid, to = %l.new_parent, error = %e, "a link to another MDT waits for it");
                }
            }
        }
        left == 0
    }

    /// Whether applying `m` removes a name of another MDT's file (whose home is then told).
    pub(super) fn drops_remote_name(&self, m: &Mutation) -> bool {
        self.store.read(|ns| match m {
            Mutation::Unlink { parent, name, .. }
            | Mutation::LinkIn { parent, name, .. }
            | Mutation::Rename {
                new_parent: parent,
                new_name: name,
                ..
            } => ns.names_remote_file(*parent, name),
            _ => false,
        })
    }

    /// Tells the homes of other MDTs' files whose names here went, each once, and forgets
    /// their stubs; true once every one is told.
    pub(super) async fn report_dropped_once(&self) -> bool {
        let dropping = self.store.read(|ns| ns.dropping());
        if dropping.is_empty() {
            return true;
        }
        // Only a removal that is durable here is reported: one answered before it was (a
        // client's commit-behind) and lost in a crash would otherwise leave the name here and
        // the file gone at its home.
        if let Err(e) = self.store.sync().await {
            tracing::warn!(error = %e, "removed names of other MDTs' files wait for the journal");
            return false;
        }
        let mut left = 0;
        for (fid, req) in dropping {
            let mdt = proto::fid::mdt_of(fid).unwrap_or(0);
            let told = self
                .on_mdt_numbered(mdt, &Creds::root(), Mutation::DropLink { fid }, req)
                .await;
            match told {
                // Counted, or the file is gone there already.
                Ok(_) => {}
                Err(e) if e.code == StatusCode::Fs(FsErrorKind::Stale) => {}
                Err(e) => {
                    left += 1;
                    tracing::warn!(%fid, mdt, error = %e, "a removed name of another MDT's file is yet to be counted there");
                    continue;
                }
            }
            let forgot = self.apply_own(Mutation::Dropped { fid }, None).await;
            if let Err(e) = forgot {
                left += 1;
                tracing::warn!(%fid, error = %e, "a reported name's stub stays");
            }
        }
        left == 0
    }

    /// The MDS's work across MDTs that outlives a request: striped directories half made or
    /// removed, moves cut short, removed names of other MDTs' files to report. Run from the
    /// first request on, until the service is gone. Each kind is looked for at the start,
    /// when a change wakes it, and once a minute (a change replayed after a restart wakes
    /// nothing); each look walks the namespace, which must not be held up every few seconds.
    /// What is left is tried again every second.
    pub(super) async fn across_mdts(me: std::sync::Weak<Self>) {
        let (mut stripes, mut moves, mut reported) = (false, false, false);
        let mut idle = 0u32;
        loop {
            let across = {
                let Some(s) = me.upgrade() else {
                    return;
                };
                if !stripes {
                    stripes = s.settle_stripes_once().await;
                }
                if !moves {
                    moves = s.resume_moves_once().await
                        & s.resume_placing_once().await
                        & s.let_go_stale_lock_once().await;
                }
                if !reported {
                    reported = s.report_dropped_once().await;
                }
                s.across.clone()
            };
            // Holding no reference to the service meanwhile: a stopped MDS's state goes. With
            // work left, the next look is a whole second away whatever wakes it: a step that
            // failed wakes it too, and would otherwise be tried again at once, for ever.
            let all_done = stripes && moves && reported;
            let wait = std::time::Duration::from_secs(if all_done { 10 } else { 1 });
            let began = tokio::time::Instant::now();
            let woken = tokio::time::timeout(wait, across.notified()).await.is_ok();
            if woken && !all_done {
                tokio::time::sleep_until(began + wait).await;
            }
            idle = if woken { 0 } else { idle + 1 };
            if woken || idle >= 6 {
                (stripes, moves, reported) = (false, false, false);
                idle = 0;
            }
        }
    }
}
