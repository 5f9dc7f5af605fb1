//! Namespace changes (`MDS_REINT`, `MDS_BATCH`, `MDS_RESERVE`): the caller mapped and checked, the
//! change decided, objects allocated only for one that goes ahead, audited.

use super::*;

impl MdsService {
    /// One change (`MDS_REINT`).
    pub(super) async fn serve_reint(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsReint = req.decode()?;
        let out = self.reint_from(req, r).await?;
        reply::<MdsReint>(&out)
    }

    /// Changes and closes in one message (`MDS_BATCH`), in order.
    pub(super) async fn serve_batch(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsBatch = req.decode()?;
        if r.ops.len() > MAX_BATCH {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::Invalid),
                format!("{} operations in one batch, past {MAX_BATCH}", r.ops.len()),
            ));
        }
        if self.clients.recovering() {
            // Only the changes a client answered ahead before the restart, once every replay
            // is over, and only its own (each operation is checked as the caller's below).
            let client = r.ops.iter().find_map(|op| match op {
                BatchOp::Reint(r) => r.req.map(|q| q.client),
                BatchOp::Close(c) => Some(c.handle.client),
            });
            let mine = |c: u128| {
                r.ops.iter().all(|op| match op {
                    BatchOp::Reint(r) => r.req.is_none_or(|q| q.client == c),
                    BatchOp::Close(x) => x.handle.client == c,
                })
            };
            let may = client.is_some_and(|c| mine(c) && self.clients.may_flush(c));
            if !may {
                return Err(RemoteError::new(
                    StatusCode::Busy,
                    "the MDS is recovering: clients are replaying their changes",
                ));
            }
        }
        let mut results = Vec::with_capacity(r.ops.len());
        // An operation refused for now (Busy: no storage target in service yet) stops
        // the batch there: the later ones may depend on it, and the client sends them
        // all again, in order.
        let mut busy: Option<RemoteError> = None;
        for op in r.ops {
            if let Some(e) = &busy {
                results.push(BatchResult::Failed(e.clone()));
                continue;
            }
            let out = match op {
                BatchOp::Reint(r) => self.reint_from(req, r).await.map(BatchResult::Reint),
                BatchOp::Close(c) => self.owns(req, c.handle.client).map(|_| {
                    self.alloc.open.close(c.fid, c.handle);
                    BatchResult::Closed
                }),
            };
            if let Err(e) = &out {
                if e.code == StatusCode::Busy {
                    busy = Some(e.clone());
                }
            }
            results.push(out.unwrap_or_else(BatchResult::Failed));
        }
        // The attributes a change left on an inode that a later change of the batch
        // touched too are of no use to the client: only the last are sent.
        let mut later = std::collections::HashSet::new();
        for r in results.iter_mut().rev() {
            if let BatchResult::Reint(reply) = r {
                reply.after.retain(|i| later.insert(i.fid));
            }
        }
        reply::<MdsBatch>(&MdsBatched { results })
    }

    /// Inode numbers set aside for creates answered ahead (`MDS_RESERVE`).
    pub(super) async fn serve_reserve(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsReserve = req.decode()?;
        self.owns(req, r.client)?;
        self.reserve(r).await
    }

    /// One mutation: decided in the namespace first (a resend is answered as then, an
    /// `O_CREAT` of an existing file opens it without a change), objects taken only for a
    /// change that goes ahead, the open counted with it when asked.
    /// A change from the network: mapped to the identity the MDS gives the caller, audited,
    /// and, for a create at a FID of the client's choosing, checked against what the MDS set
    /// aside for that client.
    pub(super) async fn reint_from(
        &self,
        req: &Incoming,
        mut r: MdsReint,
    ) -> Result<MdsReintReply, RemoteError> {
        r.creds = self.nodemap.map(req, r.creds);
        self.servers_only_change(req, &r.mutation)?;
        if let Some(q) = r.req {
            self.owns(req, q.client)?;
        }
        if let Some(h) = r.open {
            self.owns(req, h.client)?;
        }
        if let Mutation::CreateAt { fid, .. } = &r.mutation {
            let mine = r.req.is_some_and(|q| {
                self.clients.holds(q.client) && self.clients.reserved.holds(q.client, *fid)
            });
            if !mine {
                return Err(RemoteError::new(
                    StatusCode::Fs(FsErrorKind::NotPermitted),
                    format!("{fid} was not set aside for this client"),
                ));
            }
        }
        let creds = r.creds.clone();
        let audited = self.audited(&r.mutation);
        if audited.is_some() {
            self.audit_writes(true)?;
        }
        let out = self.reint(r, Self::node_of(req)).await;
        if let Some(what) = audited {
            let made = out
                .as_ref()
                .ok()
                .and_then(|r| r.inode.as_ref().map(|i| i.fid));
            self.record(req, &creds, what, made, &out);
        }
        out
    }

    /// Sets inode numbers aside for a client's asynchronous creates: taken from the namespace
    /// and committed, then recorded as the client's, before the answer.
    pub(super) async fn reserve(&self, r: MdsReserve) -> Result<Vec<u8>, RemoteError> {
        if !self.clients.holds(r.client) {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "inode numbers are set aside for clients that joined (MDS_CONNECT)",
            ));
        }
        let count = r.count.clamp(1, MAX_RESERVE);
        let done = self
            .store
            .apply(crate::store::Change::new(
                Mutation::ReserveInodes { count },
                Creds::root(),
            ))
            .await
            .map_err(store_error)?;
        let first = done.reserved.ok_or_else(|| {
            RemoteError::new(StatusCode::Io, "the reservation took no inode numbers")
        })?;
        self.clients
            .reserved
            .give(r.client, first, first + count, |c| self.clients.holds(c))
            .await
            .map_err(|e| RemoteError::new(StatusCode::Io, e.to_string()))?;
        reply::<MdsReserve>(&MdsReserved {
            first: proto::Fid::new(self.store.read(|ns| ns.seq()), first, 0),
            count,
        })
    }

    /// A layout with objects for a new file, from `template` (or the default), when there are
    /// targets to put them on; otherwise the template as it is (metadata only, until storage
    /// registers).
    pub(super) async fn objects_for(
        &self,
        template: Option<Layout>,
    ) -> Result<(Option<Layout>, Vec<StripeObject>), RemoteError> {
        // One look at the registry for the whole create, unless no target is in service.
        let mut known = self.registry.targets();
        let registered = !known.is_empty();
        if !self.alloc.has_targets_in(&known) && registered {
            // A pass may bring a target into service now; a long one (a big orphan cleanup)
            // goes on in the background while this request is answered Busy and resent.
            let pass = self.alloc.maintain(&self.store);
            let _ = tokio::time::timeout(MAINTAIN_IN_REQUEST, pass).await;
            known = self.registry.list().into();
        }
        if !self.alloc.has_targets_in(&known) {
            if registered {
                // Targets exist but none is in service yet (after an MDS restart, before
                // their orphans are cleaned up): a file made now would have no objects for
                // good. The client resends.
                return Err(RemoteError::new(
                    StatusCode::Busy,
                    "no storage target is in service yet",
                ));
            }
            return Ok((template, vec![]));
        }
        let template = template.unwrap_or_else(default_layout);
        // Checked before anything is allocated: a bad template costs no storage server work.
        template.validate().map_err(|e| {
            ns_error(NsError {
                kind: FsErrorKind::Invalid,
                what: e.to_string(),
            })
        })?;
        let layout = self
            .alloc
            .instantiate_among(&template, &Default::default(), &known)
            .await
            .map_err(alloc_error)?;
        let objects = objects_of(&layout);
        Ok((Some(layout), objects))
    }

    /// Fills in what only the MDS decides before a mutation is applied: the objects of a new
    /// file, or of an empty file getting a layout. A layout from the network must not name
    /// objects: only the MDS hands them out.
    pub(super) async fn prepare(&self, m: &mut Mutation) -> Result<Vec<StripeObject>, RemoteError> {
        let forged = |l: &Layout| l.components.iter().any(|c| !c.objects.is_empty());
        let refuse = |kind, what: &str| {
            Err(ns_error(NsError {
                kind,
                what: what.into(),
            }))
        };
        match m {
            Mutation::Create {
                kind: Kind::File,
                layout,
                parent,
                ..
            }
            | Mutation::CreateAt {
                kind: Kind::File,
                layout,
                parent,
                ..
            }
            | Mutation::CreateUnnamed { layout, parent, .. } => {
                if layout.as_ref().is_some_and(forged) {
                    return refuse(
                        FsErrorKind::Invalid,
                        "a layout from a client cannot name objects",
                    );
                }
                let parent = *parent;
                let template = match layout.take() {
                    Some(l) => Some(l),
                    None => self
                        .store
                        .read(|ns| ns.inode(parent).ok().and_then(|p| p.layout.clone())),
                };
                let (l, objects) = self.objects_for(template).await?;
                *layout = l;
                Ok(objects)
            }
            Mutation::SetLayout { fid, layout } => {
                if forged(layout) {
                    return refuse(
                        FsErrorKind::Invalid,
                        "a layout from a client cannot name objects",
                    );
                }
                let fid = *fid;
                let is_file = self
                    .store
                    .read(|ns| ns.inode(fid).map(|i| i.kind == Kind::File))
                    .map_err(ns_error)?;
                if !is_file {
                    return Ok(vec![]); // a directory's default stays a template
                }
                let (l, objects) = self.objects_for(Some(layout.clone())).await?;
                if let Some(l) = l {
                    *layout = l;
                }
                Ok(objects)
            }
            Mutation::PlaceMirror {
                fid,
                mirror,
                generation,
                exclude,
                components,
            } => {
                if !components.is_empty() {
                    return refuse(
                        FsErrorKind::Invalid,
                        "a client cannot name a mirror's components: the MDS places them",
                    );
                }
                let (fid, mirror) = (*fid, *mirror);
                let current = self
                    .store
                    .read(|ns| {
                        ns.may_place_mirror(fid, mirror, *generation, &Creds::root())
                            .cloned()
                    })
                    .map_err(ns_error)?;
                // The other mirrors as they are; this one as a template, like a new file's.
                let pattern: Vec<Component> = if mirror < current.mirror_count() {
                    current
                        .components
                        .iter()
                        .filter(|c| c.mirror == mirror)
                        .cloned()
                        .collect()
                } else {
                    current
                        .components
                        .iter()
                        .filter(|c| c.mirror == 0)
                        .cloned()
                        .collect()
                };
                let mut template = current.clone();
                template.components.retain(|c| c.mirror != mirror);
                template
                    .components
                    .extend(pattern.into_iter().map(|c| Component {
                        stripe_offset: None,
                        targets: vec![],
                        objects: vec![],
                        mirror,
                        stale: true,
                        ..c
                    }));
                // In mirror order, as a layout keeps them (stable: extents stay in order).
                template.components.sort_by_key(|c| c.mirror);
                if !self.alloc.has_targets() {
                    return Err(RemoteError::new(
                        StatusCode::Busy,
                        "no storage target is in service yet",
                    ));
                }
                let exclude: HashSet<u32> = exclude.iter().copied().collect();
                let placed = self
                    .alloc
                    .instantiate_excluding(&template, &exclude)
                    .await
                    .map_err(alloc_error)?;
                let mine: Vec<Component> = placed
                    .components
                    .into_iter()
                    .filter(|c| c.mirror == mirror)
                    .collect();
                let objects = mine
                    .iter()
                    .flat_map(|c| c.objects.iter().copied())
                    .collect();
                *components = mine;
                Ok(objects)
            }
            Mutation::Destroyed { .. } | Mutation::Released { .. } => refuse(
                FsErrorKind::NotPermitted,
                "only the MDS records destroyed objects and released files",
            ),
            Mutation::SkipInodes { .. } | Mutation::ReserveInodes { .. } => refuse(
                FsErrorKind::NotPermitted,
                "only the MDS skips or sets aside inode numbers",
            ),
            _ => Ok(vec![]),
        }
    }

    pub(super) async fn reint(
        &self,
        r: MdsReint,
        node: Option<std::net::IpAddr>,
    ) -> Result<MdsReintReply, RemoteError> {
        if self.moves_across(&r.mutation) {
            return self.rename_across(&r).await;
        }
        if self.links_across(&r.mutation) {
            return self.link_across(&r).await;
        }
        let dirs = self.dirs_reparented(&r.mutation);
        if !dirs.is_empty() {
            return self.rename_dirs_locked(r, node, dirs).await;
        }
        self.reint_plain(r, node).await
    }

    /// A change carried out on this MDT alone (its halves on others asked for on the way).
    pub(super) async fn reint_plain(
        &self,
        mut r: MdsReint,
        node: Option<std::net::IpAddr>,
    ) -> Result<MdsReintReply, RemoteError> {
        // A stale copy is declared in sync only by a resync that held the file alone from
        // before it copied: a writer open meanwhile (or opened and closed again) wrote only the
        // copies in sync, and the cleared copy would lack its acknowledged writes.
        if let Mutation::MirrorState {
            fid, stale: false, ..
        } = &r.mutation
        {
            let alone = r.open.is_some_and(|h| {
                self.alloc.open.alone_since(*fid, h) && self.may_write_through(*fid, h)
            });
            if !alone {
                return Err(RemoteError::new(
                    StatusCode::Fs(FsErrorKind::WouldBlock),
                    format!(
                        "{fid}: another handle opened the file during the resync; its writes may \
                         be missing from the new copy, which stays stale (resync again once the \
                         file is closed)"
                    ),
                ));
            }
        }
        // A change of size or times through a handle opened for writing needs no permission
        // now: the open was the check (ftruncate of a file created with mode 0). Times are
        // now, or the mtime the writer's page cache kept for its writes (never an atime of its
        // choosing). A handle opened only for reading allows nothing more than the caller's
        // identity does.
        let by_handle = match (r.mutation.allowed_by_handle(), r.open) {
            (Some(fid), Some(h)) => self.may_write_through(fid, h),
            _ => false,
        };
        if by_handle {
            r.creds = Creds::root();
        }
        // Only a create (`O_CREAT`) counts an open; a handle on a size or times change names
        // the open that allows it, and on any other change it means nothing.
        let opens = r.open.filter(|_| r.mutation.counts_open());

        let creds = r.creds.clone();
        let client = r.req.map(|q| q.client);
        // A directory another client holds alone may hide changes it answered ahead (the
        // unlink of the name this creates, say): they come first, as before any read there.
        // Decided before them, an `O_CREAT` would open the file that client removed, or an
        // exclusive create find the name it freed taken.
        let dirs: Vec<proto::Fid> = {
            let t = r.mutation.touches();
            t.entries.iter().map(|(d, _)| *d).chain(t.inodes).collect()
        };
        self.leases.recall_alone(&dirs, client).await;
        let mut stamp: (u64, Option<Vec<u8>>) = (0, None);
        let mut changed = vec![];
        let mut after = vec![];
        let decided = self
            .store
            .decide(&r.mutation, &r.creds, r.req, r.acked)
            .await;
        let (inode, created) = match decided.map_err(store_error)? {
            Decision::Replied(done) => {
                // The first attempt counted its open, if it asked for one (counting the same
                // handle again changes nothing).
                let size_gen = done
                    .inode
                    .as_ref()
                    .map_or(0, |i| self.store.size_gen(i.fid));
                // The creator's rights again only for a resent create of the caller's own
                // file: a request number does not say what the first request was.
                let grant = match (opens, done.inode.as_ref()) {
                    (Some(h), Some(i)) if i.kind == Kind::File => {
                        let mine = i.uid == creds.uid;
                        let allowed = Granter::rights(i, &creds, mine);
                        let rights = self.alloc.open.rights(i.fid, h).unwrap_or(0) | allowed;
                        Some(self.granter.grant_rights(i, rights))
                    }
                    _ => None,
                };
                return Ok(MdsReintReply {
                    inode: done.inode,
                    created: true,
                    size_gen,
                    grant,
                    transno: 0,
                    committed: self.store.committed(),
                    instance: self.instance,
                    ticket: vec![],
                    leased: false,
                    changed: vec![],
                    after: vec![],
                });
            }
            Decision::Opens(inode) => (Some(inode), false),
            Decision::Applies => {
                let mut m = r.mutation;
                // Only a create answered ahead is stamped with the client's time.
                let time = r.time.filter(|_| matches!(m, Mutation::CreateAt { .. }));
                // Across MDTs: the other MDT's half first.
                let pass = self.place_new_dir(&mut m).await?;
                self.mkdir_striped(&mut m).await?;
                self.mkdir_on(&mut m, &r.creds, r.req).await?;
                let removes_across = self.removes_dir_across(&m);
                self.rmdir_remote(&mut m, &r.creds, r.req).await?;
                self.rmdir_striped(&m, &r.creds).await?;
                let striped = matches!(m, Mutation::MkdirStriped { .. });
                let chattr = match &m {
                    Mutation::Setattr { attr, .. }
                        if attr.mode.is_some() || attr.uid.is_some() || attr.gid.is_some() =>
                    {
                        Some(m.clone())
                    }
                    _ => None,
                };
                let default_set = match &m {
                    Mutation::SetXattr { name, .. } | Mutation::RemoveXattr { name, .. }
                        if name == proto::dirstripe::DEFAULT_XATTR =>
                    {
                        Some(m.clone())
                    }
                    _ => None,
                };
                let made_remote = match &m {
                    Mutation::LinkRemoteDir {
                        parent,
                        name,
                        inode,
                    } => Some((inode.fid, *parent, name.clone())),
                    _ => None,
                };
                let remote_made = made_remote.is_some();
                let drops = self.drops_remote_name(&m);
                let objects = self.prepare(&mut m).await?;
                // Only a client in the table is answered before the change is durable: only
                // its changes are waited for after a restart. A directory made on other MDTs
                // is answered once its name is durable here: what the client then makes in it
                // there is durable at once, and must never hang from a name a crash of this
                // MDS and of the client could take away. So is one removed there: its name
                // must not come back after the directory went.
                let across = made_remote.is_some() || striped || removes_across;
                let behind =
                    r.behind && !across && r.req.is_some_and(|q| self.clients.holds(q.client));
                let done = match self
                    .apply(m, r.creds, r.req, r.size_gen, objects, behind, time)
                    .await
                {
                    Ok(d) => {
                        // A copy of the request carried out meanwhile (a resend that came
                        // while this one asked the other MDT) is answered as it was: the
                        // directory this one made there is named nowhere.
                        if let Some((fid, ..)) = made_remote {
                            if d.applied.inode.as_ref().map(|i| i.fid) != Some(fid) {
                                self.unmake_remote(fid).await;
                            }
                        }
                        d
                    }
                    Err(e) => {
                        // Refused here: the directory made there goes, and the record with
                        // it. Not applied for want of the journal: the record stays, and the
                        // name is added once it can be (the other MDT answers the same again).
                        if let Some((fid, parent, name)) = made_remote {
                            if matches!(e.code, StatusCode::Fs(_)) {
                                self.unmake_remote(fid).await;
                            }
                            self.end_refused(parent, &name, &e).await;
                        }
                        return Err(e);
                    }
                };
                if drops {
                    self.across.notify_one();
                }
                stamp = (done.transno, done.ticket);
                changed = done.touched;
                after = done.after;
                let mut inode = done.applied.inode;
                if let Some(set) = chattr {
                    self.restripe_attrs(&set).await;
                }
                if let Some(set) = default_set {
                    self.restripe_default(&set).await;
                }
                if let Some(master) = inode.as_ref().filter(|_| striped).map(|i| i.fid) {
                    // The shards now; should an MDT not answer, the directory is named and
                    // its shards are made once it does (names in it wait till then).
                    match self.build_stripe(master).await {
                        Ok(made) => inode = Some(made),
                        Err(e) => {
                            tracing::warn!(%master, error = %e, "a striped directory's shards wait for their MDTs");
                            self.across.notify_one();
                        }
                    }
                }
                // A directory made on another MDT was given it before its name.
                let pass = pass.filter(|_| !remote_made);
                if let (Some(pass), Some(made)) = (pass, inode.clone()) {
                    self.pass_dir_default(&made, pass).await;
                    // Answered as it is now, default and all, when it is this MDT's.
                    if let Some(now) = self.store.read(|ns| ns.inode(made.fid).ok().cloned()) {
                        inode = Some(now);
                    }
                }
                (inode, true)
            }
        };
        let mut grant = None;
        if let Some(handle) = opens {
            if let Some(i) = inode.as_ref().filter(|i| i.kind == Kind::File) {
                // The creator may use what it made whatever its mode; an existing file opened
                // by `O_CREAT` gets what the caller's identity allows, and is not opened when
                // that is nothing.
                let allowed = Granter::rights(i, &creds, created);
                if allowed == 0 {
                    return Err(RemoteError::new(
                        StatusCode::Fs(FsErrorKind::AccessDenied),
                        format!("permission denied on {}", i.fid),
                    ));
                }
                let rights = self.count_open(i.fid, handle, allowed, node)?;
                grant = Some(self.granter.grant_rights(i, rights));
            }
        }
        let size_gen = inode.as_ref().map_or(0, |i| self.store.size_gen(i.fid));
        let ticket = match (stamp.1, client) {
            (Some(t), Some(c)) => self.seal(c, t),
            _ => vec![],
        };
        // The inode returned, leased to its changer and read again after the grant.
        let mut leased = false;
        let mut inode = inode;
        if let (Some(c), Some(i)) = (self.lessee(client.filter(|_| r.lease)), &inode) {
            if self.grant(c, &[i.fid]) {
                if let Ok(fresh) = self.store.read(|ns| ns.inode(i.fid).cloned()) {
                    inode = Some(fresh);
                    leased = true;
                }
            }
        }
        Ok(MdsReintReply {
            inode,
            created,
            size_gen,
            grant,
            transno: stamp.0,
            committed: self.store.committed(),
            instance: self.instance,
            ticket,
            leased,
            changed,
            after,
        })
    }

    /// Applies a mutation; objects allocated for it that it did not use (an existing file was
    /// opened, or it failed) go back to their pools.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply(
        &self,
        m: Mutation,
        creds: Creds,
        req: Option<ReqId>,
        size_gen: Option<u64>,
        objects: Vec<StripeObject>,
        behind: bool,
        time: Option<proto::md::Time>,
    ) -> Result<crate::store::Done, RemoteError> {
        // Other clients' leases on what the change touches are recalled first; the check is
        // made again as it applies, and the change goes round again if one was granted since.
        let except = req.map(|q| q.client);
        let kind = m.name();
        let mut result = loop {
            let touched = self.store.read(|ns| ns.touched(&m));
            let _recall = self.leases.recall(&touched, except).await;
            let clear = |fids: &[proto::Fid]| self.leases.clear(fids, except);
            let after = |f: &proto::Fid| except.is_some_and(|c| self.leases.holds(c, *f));
            let change = crate::store::Change {
                mutation: m.clone(),
                who: creds.clone(),
                req,
                size_gen,
                time,
                clear: &clear,
                after: &after,
            };
            match self.store.apply_behind(change) {
                Err(StoreError::Leased) => continue,
                other => break other,
            }
        };
        if let Ok(done) = &mut result {
            if !behind || done.ticket.is_none() {
                // Answered once durable: nothing to replay.
                done.ticket = None;
                if let Err(e) = self.store.wait_committed(done.transno).await {
                    result = Err(e);
                }
            }
        }
        if let (Some(metrics), Ok(_)) = (&self.metrics, &result) {
            metrics.applied(kind);
        }
        let used = match &result {
            Ok(d) => d
                .applied
                .inode
                .as_ref()
                .and_then(|i| i.layout.as_ref())
                .map(objects_of)
                .unwrap_or_default(),
            Err(_) => vec![],
        };
        let unused: Vec<StripeObject> = objects.into_iter().filter(|o| !used.contains(o)).collect();
        self.alloc.give_back(&unused);
        result.map_err(store_error)
    }

    /// `m` applied as this MDS's own change (no lease recall exempted, nothing allocated),
    /// durable when returned; recorded as the reply to `req` when given.
    pub(super) async fn apply_own(
        &self,
        m: Mutation,
        req: Option<ReqId>,
    ) -> Result<crate::store::Done, RemoteError> {
        self.apply(m, Creds::root(), req, None, vec![], false, None)
            .await
    }

    /// A step of a change across MDTs, checked for `creds` who asked for it and journaled
    /// durably before it is answered.
    pub(super) async fn apply_step(
        &self,
        m: Mutation,
        creds: &Creds,
    ) -> Result<crate::store::Done, RemoteError> {
        self.apply(m, creds.clone(), None, None, vec![], false, None)
            .await
    }

    /// Whether `handle` is open on `fid` with the right to write.
    pub(super) fn may_write_through(&self, fid: proto::Fid, handle: OpenHandle) -> bool {
        self.alloc
            .open
            .rights(fid, handle)
            .is_some_and(|r| r & proto::capa::WRITE != 0)
    }
}
