//! Changes across MDTs: a directory placed on another MDT than its parent's (`mkdir -i`), and
//! its removal. The parent's MDS coordinates: it checks the caller and the name, records the
//! change on the parent (`PlaceOut`, journaled and synced), asks the other MDT's MDS (as a
//! server, numbered so that it is carried out once) to make or remove the directory, then
//! adds or removes the name in its own journal, which ends the record (or drops the record
//! if the other MDT refused). So the client sends one request, to the parent's MDT, every
//! right is decided by the servers, and a crash of either MDS or of the client between the
//! halves ends the change whole: the parent's MDS carries on every record when it starts
//! ([`MdsService::resume_placing_once`]).

use lnet::call;

use proto::md::Placing;

use super::*;

/// How long one call to another MDS may take before the client's request is answered Busy
/// (and resent).
pub(super) const PEER_CALL: std::time::Duration = std::time::Duration::from_secs(5);

impl MdsService {
    /// Leases `fids` to `client`, unless one is another MDT's (a remote directory's stub: its
    /// attributes change there, and no recall of this MDS's would reach the client's copy).
    pub(super) fn grant(&self, client: u128, fids: &[proto::Fid]) -> bool {
        let own = self.registry.filesystem().mdt;
        let remote = fids
            .iter()
            .any(|f| proto::fid::mdt_of(*f).is_some_and(|k| k != own));
        if remote {
            return false;
        }
        // Nor on a striped directory's master: it holds no names (its shards do), and a
        // client keeping its empty listing would answer lookups in it from that.
        let striped = self.store.read(|ns| {
            fids.iter().any(|f| {
                ns.inode(*f)
                    .is_ok_and(|i| i.xattrs.contains_key(proto::dirstripe::LMV_XATTR))
            })
        });
        !striped && self.leases.grant(client, fids)
    }

    /// The server-only halves of changes across MDTs, refused from clients: a client naming a
    /// directory of another MDT itself could give a directory two names, or take a name
    /// away from a directory that is not empty.
    pub(super) fn servers_only_change(
        &self,
        req: &Incoming,
        m: &Mutation,
    ) -> Result<(), RemoteError> {
        match m {
            Mutation::MkdirForRemote { .. }
            | Mutation::LinkRemoteDir { .. }
            | Mutation::RmdirRemote { .. }
            | Mutation::MakeShard { .. }
            | Mutation::SetDirStripe { .. }
            | Mutation::FreezeShard { .. }
            | Mutation::RmdirShard { .. }
            | Mutation::MoveOut { .. }
            | Mutation::LinkIn { .. }
            | Mutation::MoveDone { .. }
            | Mutation::MoveAbort { .. }
            | Mutation::DropLink { .. }
            | Mutation::Dropped { .. }
            | Mutation::LinkOut { .. }
            | Mutation::LinkDone { .. }
            | Mutation::LinkAbort { .. }
            | Mutation::PlaceOut { .. }
            | Mutation::PlaceDone { .. }
            | Mutation::PlaceAbort { .. }
            | Mutation::Reparent { .. }
            | Mutation::RenameLock { .. } => self.server_only(req),
            // The MDS's own: decided by the HSM requests, never sent as changes.
            Mutation::HsmSet { .. }
            | Mutation::HsmLinks { .. }
            | Mutation::HsmImport { .. }
            | Mutation::HsmReimport { .. } => Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "HSM states, links and imports are set through the HSM requests",
            )),
            _ => Ok(()),
        }
    }

    /// Where MDT `mdt`'s MDS serves: MDT0 keeps the list; another MDT asks MDT0.
    pub(super) async fn mdt_nid(&self, mdt: u32) -> Result<proto::Nid, RemoteError> {
        let own = self.registry.filesystem().mdt;
        let unknown = || {
            RemoteError::new(
                StatusCode::Fs(FsErrorKind::Invalid),
                format!("MDT{mdt} is not an MDT of this filesystem"),
            )
        };
        if mdt == own {
            return Err(unknown());
        }
        let listed = match (&self.mdt0, mdt) {
            (None, _) => self.registry.mdts(),
            (Some(mdt0), 0) => return Ok(mdt0.clone()),
            (Some(mdt0), _) => {
                call(self.alloc.net(), mdt0, &ListMdts {}, PEER_CALL)
                    .await
                    .map_err(|e| peer_error(0, e))?
                    .mdts
            }
        };
        listed
            .into_iter()
            .find(|m| m.index == mdt)
            .map(|m| m.nid)
            .ok_or_else(unknown)
    }

    /// The number of this MDS's request to another MDS on behalf of the client request `of`:
    /// derived from it, so that the client's resend (after an answer lost, or a call to the
    /// other MDS that timed out) asks the same, and is answered there from its reply cache
    /// instead of being carried out again; without one, this run's own numbering.
    pub(super) fn peer_req(&self, of: Option<ReqId>) -> ReqId {
        const PEER: u128 = 0x4d44_5450 << 96; // "MDTP"
        let mdt = u128::from(self.registry.filesystem().mdt) << 64;
        match of {
            Some(q) => ReqId {
                client: q.client.rotate_left(17) ^ PEER ^ mdt,
                seq: q.seq,
            },
            None => ReqId {
                client: PEER | mdt | u128::from(self.instance),
                seq: self
                    .peer_seq
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            },
        }
    }

    /// `m`, carried out by MDT `mdt`'s MDS for `creds` (durable when answered), for the
    /// client request `of`.
    pub(super) async fn on_mdt(
        &self,
        mdt: u32,
        creds: &Creds,
        m: Mutation,
        of: Option<ReqId>,
    ) -> Result<MdsReintReply, RemoteError> {
        // Numbered, as a client numbers its changes: a copy of the request the network
        // delivers twice is answered from the other MDS's reply cache, not carried out again
        // (a second directory there that no name reaches).
        self.on_mdt_numbered(mdt, creds, m, self.peer_req(of)).await
    }

    /// `m`, carried out by MDT `mdt`'s MDS for `creds` as request `req` (durable when
    /// answered; a copy is answered from its reply cache).
    pub(super) async fn on_mdt_numbered(
        &self,
        mdt: u32,
        creds: &Creds,
        m: Mutation,
        req: ReqId,
    ) -> Result<MdsReintReply, RemoteError> {
        let nid = self.mdt_nid(mdt).await?;
        let r = MdsReint {
            req: Some(req),
            ..MdsReint::durable(creds.clone(), m)
        };
        call(self.alloc.net(), &nid, &r, PEER_CALL)
            .await
            .map_err(|e| peer_error(mdt, e))
    }

    /// A mkdir on another MDT, decided here: the directory made there, and the change turned
    /// into naming it here (`LinkRemoteDir`, applied as any change is).
    pub(super) async fn mkdir_on(
        &self,
        m: &mut Mutation,
        creds: &Creds,
        of: Option<ReqId>,
    ) -> Result<(), RemoteError> {
        let Mutation::MkdirOn {
            parent,
            name,
            mode,
            mdt,
        } = m
        else {
            return Ok(());
        };
        let (parent, mdt) = (*parent, *mdt);
        if mdt == self.registry.filesystem().mdt {
            // On this MDT after all: a plain mkdir.
            *m = Mutation::Create {
                parent,
                name: std::mem::take(name),
                kind: Kind::Dir,
                mode: *mode,
                exclusive: true,
                target: vec![],
                layout: None,
            };
            return Ok(());
        }
        let (gid, layout) = self
            .store
            .read(|ns| {
                ns.inode(parent).map(|p| {
                    let gid = if p.mode & 0o2000 != 0 {
                        p.gid
                    } else {
                        creds.gid
                    };
                    (gid, p.layout.clone())
                })
            })
            .map_err(ns_error)?;
        let step = Mutation::MkdirForRemote {
            parent,
            name: name.clone(),
            mode: *mode,
            gid,
            layout,
        };
        let placing = Placing {
            name: name.clone(),
            mdt,
            step: Box::new(step.clone()),
            creds: creds.clone(),
            client_req: of,
            peer_req: self.peer_req(of),
        };
        let out = Mutation::PlaceOut {
            parent,
            placing: placing.clone(),
        };
        self.apply_step(out, creds).await?;
        let made = self
            .on_mdt_numbered(mdt, creds, step, placing.peer_req)
            .await
            .and_then(|made| made_dir(mdt, made));
        let inode = match made {
            Ok(i) => i,
            Err(e) => {
                self.end_refused(parent, &placing.name, &e).await;
                return Err(e);
            }
        };
        self.pass_parents_default(parent, &inode).await;
        *m = Mutation::LinkRemoteDir {
            parent,
            name: std::mem::take(name),
            inode,
        };
        Ok(())
    }

    /// Ends a mkdir or rmdir on another MDT whose other half was refused there (the record
    /// goes, and the name is as it was); one not answered stays recorded, and is asked again
    /// by this MDS's pass over what is left across MDTs.
    pub(super) async fn end_refused(&self, parent: proto::Fid, name: &[u8], e: &RemoteError) {
        if !matches!(e.code, StatusCode::Fs(_)) {
            self.across.notify_one();
            return;
        }
        let abort = Mutation::PlaceAbort {
            parent,
            name: name.to_vec(),
        };
        if let Err(e) = self.apply_own(abort, None).await {
            tracing::warn!(%parent, error = %e, "a refused mkdir or rmdir across MDTs stays recorded");
        }
    }

    /// Carries on the mkdirs and rmdirs on other MDTs a restart or a silent MDT left; true
    /// once none is left.
    pub(super) async fn resume_placing_once(&self) -> bool {
        let mut left = 0;
        for (parent, p) in self.store.read(|ns| ns.placing()) {
            let _one = self.moving.lock().await;
            let still = self
                .store
                .read(|ns| ns.placing())
                .into_iter()
                .any(|(d, q)| d == parent && q == p);
            if !still {
                continue;
            }
            let asked = self
                .on_mdt_numbered(p.mdt, &p.creds, (*p.step).clone(), p.peer_req)
                .await;
            let end = match (&*p.step, asked) {
                (Mutation::MkdirForRemote { .. }, Ok(made)) => match made_dir(p.mdt, made) {
                    Ok(inode) => {
                        self.pass_parents_default(parent, &inode).await;
                        Ok(Mutation::LinkRemoteDir {
                            parent,
                            name: p.name.clone(),
                            inode,
                        })
                    }
                    Err(e) => Err(e),
                },
                (Mutation::RmdirRemote { .. }, Ok(_)) => Ok(Mutation::PlaceDone {
                    parent,
                    name: p.name.clone(),
                }),
                (Mutation::RmdirRemote { .. }, Err(e))
                    if e.code == StatusCode::Fs(FsErrorKind::Stale) =>
                {
                    Ok(Mutation::PlaceDone {
                        parent,
                        name: p.name.clone(),
                    })
                }
                (_, Err(e)) => Err(e),
                (_, Ok(_)) => Err(RemoteError::new(StatusCode::Invalid, "not a placing step")),
            };
            let ended = match end {
                Ok(m) => self.apply_own(m, p.client_req).await.map(|_| ()),
                Err(e) if matches!(e.code, StatusCode::Fs(_)) => {
                    self.end_refused(parent, &p.name, &e).await;
                    Ok(())
                }
                Err(e) => Err(e),
            };
            if let Err(e) = ended {
                left += 1;
                tracing::warn!(%parent, mdt = p.mdt, error = %e, "a mkdir or rmdir on another MDT waits for it");
            }
        }
        left == 0
    }

    /// Undoes the first half of a mkdir on another MDT whose name could not be added here
    /// (logged when that fails too: an empty directory no name reaches is left there).
    pub(super) async fn unmake_remote(&self, fid: proto::Fid) {
        let Some(mdt) = proto::fid::mdt_of(fid) else {
            return;
        };
        if let Err(e) = self
            .on_mdt(mdt, &Creds::root(), Mutation::RmdirRemote { fid }, None)
            .await
        {
            tracing::warn!(%fid, mdt, error = %e, "an empty directory of a failed mkdir is left on its MDT (fsck there lists it)");
        }
    }

    /// Whether `m` removes a directory with a part on another MDT: one placed there, or a
    /// striped one.
    pub(super) fn removes_dir_across(&self, m: &Mutation) -> bool {
        let Mutation::Unlink {
            parent,
            name,
            dir: true,
        } = m
        else {
            return false;
        };
        self.store.read(|ns| {
            ns.lookup(*parent, name, &Creds::root()).is_ok_and(|i| {
                ns.is_remote(i.fid) || i.xattrs.contains_key(proto::dirstripe::LMV_XATTR)
            })
        })
    }

    /// An rmdir of a directory another MDT holds: recorded here, the directory removed there
    /// (refused there when it is not empty), and the change turned into removing the name
    /// (`PlaceDone`). One gone already (a crash came between the halves) lets the name go.
    pub(super) async fn rmdir_remote(
        &self,
        m: &mut Mutation,
        creds: &Creds,
        of: Option<ReqId>,
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
                .map(|i| i.fid)
                .filter(|f| ns.is_remote(*f))
        });
        let Some(fid) = victim else {
            return Ok(());
        };
        // The caller's right to remove the name is checked here, before anything goes there.
        self.store
            .read(|ns| ns.may_remove(*parent, name, creds))
            .map_err(ns_error)?;
        let mdt = proto::fid::mdt_of(fid).unwrap_or(0);
        let placing = Placing {
            name: name.clone(),
            mdt,
            step: Box::new(Mutation::RmdirRemote { fid }),
            creds: creds.clone(),
            client_req: of,
            peer_req: self.peer_req(of),
        };
        let out = Mutation::PlaceOut {
            parent: *parent,
            placing: placing.clone(),
        };
        self.apply_step(out, creds).await?;
        match self
            .on_mdt_numbered(
                mdt,
                &Creds::root(),
                Mutation::RmdirRemote { fid },
                placing.peer_req,
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == StatusCode::Fs(FsErrorKind::Stale) => {
                tracing::info!(%fid, mdt, "the directory of a name being removed was gone already");
            }
            Err(e) => {
                self.end_refused(*parent, name, &e).await;
                return Err(e);
            }
        }
        *m = Mutation::PlaceDone {
            parent: *parent,
            name: std::mem::take(name),
        };
        Ok(())
    }
}

/// The directory MDT `mdt` answered a mkdir with, checked to be one of its directories.
fn made_dir(mdt: u32, made: MdsReintReply) -> Result<Inode, RemoteError> {
    let inode = made.inode.ok_or_else(|| {
        RemoteError::new(
            StatusCode::Io,
            format!("MDT{mdt} made the directory but named none"),
        )
    })?;
    if proto::fid::mdt_of(inode.fid) != Some(mdt) || inode.kind != Kind::Dir {
        return Err(RemoteError::new(
            StatusCode::Io,
            format!(
                "MDT{mdt} answered a mkdir with {}, not one of its directories",
                inode.fid
            ),
        ));
    }
    Ok(inode)
}

/// A call to another MDS that failed: its own refusal as it gave it; no answer as Busy, which
/// the client resends.
pub(super) fn peer_error(mdt: u32, e: lnet::NetError) -> RemoteError {
    match e {
        lnet::NetError::Remote { err, .. } => err,
        other => RemoteError::new(
            StatusCode::Busy,
            format!("MDT{mdt}'s MDS does not answer: {other}"),
        ),
    }
}
