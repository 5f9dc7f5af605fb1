//! HSM (`MDS_HSM`): data repository links (administrators), archive, release and restore of
//! files (who may write, or read, them), and the copytools' queue (the cluster key). Every
//! state change is decided here from the file as the namespace has it, and journaled.

use std::time::Duration;

use proto::hsm::*;
use proto::Fid;

use super::*;
use crate::hsm::Ended;

/// How long a restore request waits for its bytes before it answers how far they are (the
/// client asks again).
const RESTORE_WAIT: Duration = Duration::from_secs(8);
/// How long a failed restore is the answer to readers of its file; a reader after that has
/// it tried again.
const FAILED_FOR: Duration = Duration::from_secs(10);
/// How often links with an export policy are looked through, and the most entries one look
/// looks at per link.
const EXPORT_EVERY: Duration = Duration::from_secs(2);
const EXPORT_LOOK: usize = 65_536;
/// How long a file whose export failed waits before it is tried again.
const EXPORT_PAUSE: Duration = Duration::from_secs(60);
/// How long a copytool's take waits for work.
const TAKE_WAIT: Duration = Duration::from_secs(5);
/// How long a release waits for the file's last handles to close after its lease is recalled:
/// a client closes the handles it kept past their close under a lease at its next ping (every
/// 5 s).
const RELEASE_WAIT: Duration = Duration::from_secs(6);

fn refuse<T>(kind: FsErrorKind, what: impl Into<String>) -> Result<T, RemoteError> {
    Err(RemoteError::new(StatusCode::Fs(kind), what))
}

/// Whether `path` is `dir` or below it.
fn below(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    dir.is_empty() || path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// The layout an imported file gets: `template`'s stripes (a directory's default, or the
/// filesystem's), every copy stale and without objects until a restore places them.
fn released_layout(template: Option<&Layout>) -> Layout {
    let base = template
        .filter(|l| l.mdt_end().is_none())
        .cloned()
        .unwrap_or_else(default_layout);
    Layout {
        generation: 1,
        components: base
            .components
            .into_iter()
            .map(|c| Component {
                objects: vec![],
                stale: true,
                stripe_offset: None,
                targets: vec![],
                ..c
            })
            .collect(),
    }
}

impl MdsService {
    pub(super) async fn serve_hsm(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsHsm = req.decode()?;
        let server = req.role == lnet::auth::Role::Server;
        let creds = self.nodemap.map(req, r.creds);
        let admin = server || creds.uid == 0;
        let admins_only = || {
            if admin {
                Ok(())
            } else {
                refuse(
                    FsErrorKind::NotPermitted,
                    "data repository links are for administrators (the cluster key, or root on a trusted node)",
                )
            }
        };
        let copytools_only = || {
            if server {
                Ok(())
            } else {
                refuse(
                    FsErrorKind::NotPermitted,
                    "a copytool's requests need the cluster key",
                )
            }
        };
        let out = match r.request {
            HsmRequest::Link(link) => {
                admins_only()?;
                HsmReply::Link(self.hsm_link(link).await?)
            }
            HsmRequest::Unlink { path } => {
                admins_only()?;
                self.hsm_unlink(&path).await?;
                HsmReply::Done
            }
            HsmRequest::ImportAgain { path } => {
                admins_only()?;
                let dir = self.hsm_resolve(&path)?;
                let mut links = self.hsm_links();
                let Some(l) = links.links.iter_mut().find(|l| l.dir == dir) else {
                    return refuse(FsErrorKind::NotFound, format!("{path} is not linked"));
                };
                l.importing = true;
                let id = l.id;
                self.hsm_save_links(&links).await?;
                self.hsm.queue_import(id);
                HsmReply::Done
            }
            HsmRequest::Links => HsmReply::Links(self.hsm_links().links),
            HsmRequest::State { fid } => {
                // The flags for anyone; the object's key and ETag (a path in the archive) only
                // for who may read the file, as its xattrs are.
                let state = self.store.read(|ns| ns.hsm_state(fid)).map_err(ns_error)?;
                let state = match state {
                    Some(s) if self.hsm_may(fid, &creds, 4).is_err() => Some(State {
                        key: String::new(),
                        etag: String::new(),
                        ..s
                    }),
                    other => other,
                };
                HsmReply::State(state)
            }
            HsmRequest::Archive { fid, path } => {
                self.hsm_may(fid, &creds, 2)?;
                HsmReply::State(Some(self.hsm_archive(fid, &path).await?))
            }
            HsmRequest::Release { fid } => {
                self.hsm_may(fid, &creds, 2)?;
                HsmReply::State(Some(self.hsm_release(fid).await?))
            }
            HsmRequest::Restore { fid, end } => {
                self.hsm_may(fid, &creds, 4)?;
                self.hsm_restore(fid, end).await?
            }
            HsmRequest::Status => {
                let (actions, imports, [archived, restored, failed]) = self.hsm.status();
                HsmReply::Status {
                    actions,
                    imports,
                    archived,
                    restored,
                    failed,
                }
            }
            HsmRequest::Take { copytool, max } => {
                copytools_only()?;
                self.owns(req, copytool)?;
                HsmReply::Work(self.hsm_take(copytool, max).await?)
            }
            HsmRequest::TakeImport { copytool } => {
                copytools_only()?;
                let work = self.hsm.take_import(copytool).and_then(|id| {
                    let link = self.hsm_links().links.into_iter().find(|l| l.id == id);
                    if link.is_none() {
                        self.hsm.drop_import(id);
                    }
                    link.map(|link| ImportWork { link })
                });
                HsmReply::Import(work)
            }
            HsmRequest::Import {
                link,
                parent,
                entries,
            } => {
                copytools_only()?;
                let (made, skipped) = self.hsm_import(link, parent, entries).await?;
                HsmReply::Imported { made, skipped }
            }
            HsmRequest::Progress {
                copytool,
                id,
                landed,
            } => {
                copytools_only()?;
                if self.hsm.held(id, Some(copytool)).is_none() {
                    return refuse(
                        FsErrorKind::Stale,
                        format!("action {id:x} is not this copytool's"),
                    );
                }
                self.hsm.progress(id, landed);
                HsmReply::Done
            }
            HsmRequest::Done {
                copytool,
                id,
                result,
            } => {
                copytools_only()?;
                self.hsm_done(copytool, id, result).await?;
                HsmReply::Done
            }
            HsmRequest::ImportDone {
                copytool: _,
                link,
                result,
            } => {
                copytools_only()?;
                let error = result.as_ref().err().map(String::as_str);
                self.hsm.import_ended(link, error);
                if error.is_none() {
                    let mut links = self.hsm_links();
                    if let Some(l) = links.links.iter_mut().find(|l| l.id == link) {
                        l.importing = false;
                        self.hsm_save_links(&links).await?;
                    }
                }
                HsmReply::Done
            }
        };
        reply::<MdsHsm>(&out)
    }

    /// A file with an HSM state as it is once an open is counted: a release checks for opens
    /// under the namespace's lock, so an open counted after it reads the released layout.
    pub(super) fn hsm_opened(&self, fid: Fid) -> Result<Inode, RemoteError> {
        self.store
            .read(|ns| ns.inode(fid).cloned())
            .map_err(ns_error)
    }

    /// Archives what links with an export policy export, in the background: every 2 s, the
    /// files below them never archived (`new`) or changed since (`changed`) that nobody holds
    /// open (closed after writing) are queued.
    pub(super) async fn hsm_exporter(me: std::sync::Weak<Self>) {
        // Where each link's walk stands: the directories still to look in. A pass looks at
        // no more than EXPORT_LOOK entries (the namespace is locked meanwhile) and the next
        // carries on; a walk that ended starts again from the linked directory.
        let mut walks: std::collections::HashMap<u32, Vec<(Fid, String)>> = Default::default();
        loop {
            tokio::time::sleep(EXPORT_EVERY).await;
            let Some(s) = me.upgrade() else {
                return;
            };
            if s.clients.recovering() {
                continue;
            }
            let links = s.hsm_links();
            walks.retain(|id, _| links.links.iter().any(|l| l.id == *id));
            for l in links
                .links
                .iter()
                .filter(|l| l.export.new || l.export.changed)
            {
                let walk = walks.entry(l.id).or_default();
                if walk.is_empty() {
                    walk.push((l.dir, String::new()));
                }
                let found = s
                    .store
                    .read(|ns| ns.hsm_to_export(walk, l.export.new, l.export.changed, EXPORT_LOOK));
                for (fid, rel) in found {
                    // Open (still being written), queued, or failed lately (tried again later).
                    let failed = matches!(
                        s.hsm.restore_of(fid, EXPORT_PAUSE),
                        Some(Err(Ended::Failed(_)))
                    );
                    if failed || s.alloc.open.is_open(fid) || s.hsm.of_file(fid).is_some() {
                        continue;
                    }
                    let Ok(state) = s.store.read(|ns| ns.hsm_state(fid)) else {
                        continue;
                    };
                    let state = state.unwrap_or_default();
                    let key = if state.link == l.id && !state.key.is_empty() {
                        state.key.clone()
                    } else {
                        l.key_of(&rel)
                    };
                    let state = State {
                        link: l.id,
                        key,
                        ..state
                    };
                    if let Err(e) = s.hsm_start(fid, state, ActionKind::Archive).await {
                        tracing::warn!(%fid, error = %e, "could not queue an export");
                    }
                }
            }
        }
    }

    /// A change of a file's HSM state alone (an action recorded or ended, a restored copy
    /// marked in sync), durable when returned. It recalls no lease: what clients keep of the
    /// file (its size, times, mode, and the bytes a reader reads) stays true, and a client
    /// whose copy still says released asks the MDS, which answers how it is now. A release,
    /// which does change what readers may use, recalls the file's leases itself.
    async fn hsm_apply(&self, m: Mutation) -> Result<(), RemoteError> {
        self.store
            .apply(crate::store::Change::new(m, Creds::root()))
            .await
            .map(|_| ())
            .map_err(store_error)
    }

    /// New objects for copy 0 of the released file `fid` (as `inode` is), unless it has them
    /// (placed for an earlier attempt): a restore writes into them. Recalls no lease.
    async fn hsm_place(&self, fid: Fid, inode: &Inode) -> Result<(), RemoteError> {
        let Some(layout) = inode.layout.as_ref() else {
            return Ok(());
        };
        let placed = layout
            .components
            .iter()
            .filter(|c| c.mirror == 0)
            .all(|c| c.is_instantiated());
        if placed {
            return Ok(());
        }
        let mut m = Mutation::PlaceMirror {
            fid,
            mirror: 0,
            generation: layout.generation,
            exclude: vec![],
            components: vec![],
        };
        let objects = self.prepare(&mut m).await?;
        match self
            .store
            .apply(crate::store::Change::new(m, Creds::root()))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                self.alloc.give_back(&objects);
                Err(store_error(e))
            }
        }
    }

    /// The links, as the root keeps them.
    fn hsm_links(&self) -> Links {
        self.store.read(|ns| {
            ns.inode(crate::namespace::ROOT)
                .map(Links::of_inode)
                .unwrap_or_default()
        })
    }

    async fn hsm_save_links(&self, links: &Links) -> Result<(), RemoteError> {
        let m = Mutation::HsmLinks {
            links: links.encode(),
        };
        self.apply_own(m, None).await.map(|_| ())
    }

    /// The queue as the journal left it (at start).
    pub(super) fn hsm_rebuild(&self) {
        let actions = self.store.read(|ns| ns.hsm_actions());
        let imports = self
            .hsm_links()
            .links
            .iter()
            .filter(|l| l.importing)
            .map(|l| l.id)
            .collect();
        self.hsm.rebuild(actions, imports);
    }

    /// The FID of `path`, walked from the root on this MDT.
    fn hsm_resolve(&self, path: &str) -> Result<Fid, RemoteError> {
        let names: Vec<&str> = path.split('/').filter(|n| !n.is_empty()).collect();
        if path.len() > 4096 || names.len() > MAX_PATH_NAMES {
            return refuse(FsErrorKind::NameTooLong, "path too long");
        }
        self.store
            .read(|ns| {
                let mut at = crate::namespace::ROOT;
                for n in &names {
                    at = ns.lookup(at, n.as_bytes(), &Creds::root())?.fid;
                }
                Ok(at)
            })
            .map_err(ns_error)
    }

    /// Whether the caller may act on `fid` for `want` (2: archive or release, as who may write
    /// it; 4: restore, as who may read it); its owner and root always may.
    fn hsm_may(&self, fid: Fid, creds: &Creds, want: u32) -> Result<(), RemoteError> {
        let i = self
            .store
            .read(|ns| ns.inode(fid).cloned())
            .map_err(ns_error)?;
        if i.kind != Kind::File {
            return refuse(FsErrorKind::Invalid, format!("{fid} is not a regular file"));
        }
        if creds.uid == 0 || creds.uid == i.uid || i.permits(creds, want) {
            return Ok(());
        }
        refuse(
            FsErrorKind::AccessDenied,
            format!("permission denied on {fid}"),
        )
    }

    async fn hsm_link(&self, mut link: Link) -> Result<Link, RemoteError> {
        let dir = self.hsm_resolve(&link.path)?;
        let path = self
            .store
            .read(|ns| {
                ns.inode(dir)
                    .map(|i| (i.kind == Kind::Dir && !ns.is_remote(dir)).then(|| ns.dir_path(dir)))
            })
            .map_err(ns_error)?;
        let Some(Some(path)) = path else {
            return refuse(
                FsErrorKind::NotDir,
                format!("{} is not a directory of this MDT", link.path),
            );
        };
        // The names imported would be in clear in a tree whose names are encrypted.
        if self
            .store
            .read(|ns| ns.inode(dir).is_ok_and(proto::crypt::is_encrypted))
        {
            return refuse(
                FsErrorKind::NotSupported,
                format!("{path} is encrypted: a data repository is linked to a clear directory"),
            );
        }
        let mut links = self.hsm_links();
        if links.links.len() >= MAX_LINKS {
            return refuse(
                FsErrorKind::NoSpace,
                format!("a filesystem has at most {MAX_LINKS} links"),
            );
        }
        for l in &links.links {
            let there = self
                .store
                .read(|ns| ns.dir_path(l.dir))
                .unwrap_or_else(|| l.path.clone());
            if below(&path, &there) || below(&there, &path) {
                return refuse(
                    FsErrorKind::Exists,
                    format!("{path} overlaps the link of {there} ({})", l.url()),
                );
            }
        }
        link.id = links.next.max(1);
        link.dir = dir;
        link.path = path;
        link.importing = link.import.new || link.import.changed;
        links.next = link.id + 1;
        links.links.push(link.clone());
        self.hsm_save_links(&links).await?;
        if link.importing {
            self.hsm.queue_import(link.id);
        }
        tracing::info!(dir = %link.path, archive = %link.url(), "linked");
        Ok(link)
    }

    async fn hsm_unlink(&self, path: &str) -> Result<(), RemoteError> {
        let dir = self.hsm_resolve(path)?;
        let mut links = self.hsm_links();
        let Some(at) = links.links.iter().position(|l| l.dir == dir) else {
            return refuse(FsErrorKind::NotFound, format!("{path} is not linked"));
        };
        let gone = links.links.remove(at);
        self.hsm_save_links(&links).await?;
        self.hsm.drop_import(gone.id);
        Ok(())
    }

    /// Records `action` on `fid` (its state otherwise `state`) and queues it.
    async fn hsm_start(
        &self,
        fid: Fid,
        mut state: State,
        kind: ActionKind,
    ) -> Result<State, RemoteError> {
        // One start at a time: a start that finds an action recorded since its caller looked
        // (another reader's restore, an archive asked twice) leaves it be.
        let _one = self.hsm.starting.lock().await;
        let now = self
            .store
            .read(|ns| ns.hsm_state(fid))
            .map_err(ns_error)?
            .unwrap_or_default();
        if now.action.is_some() || (kind == ActionKind::Restore && !now.released) {
            return Ok(now);
        }
        let id = loop {
            let id: u64 = rand::random();
            if id != 0 {
                break id;
            }
        };
        state.action = Some(Action { id, kind });
        let m = Mutation::HsmSet {
            fid,
            state: state.encode(),
            release: false,
            restored: None,
        };
        if kind == ActionKind::Archive {
            // Handles clients keep past their close under the file's lease go with it (at
            // their next ping): the copytool's open must hold the file alone.
            self.apply_own(m, None).await?;
        } else {
            self.hsm_apply(m).await?;
        }
        self.hsm.queue(fid, id, kind);
        Ok(state)
    }

    async fn hsm_archive(&self, fid: Fid, path: &str) -> Result<State, RemoteError> {
        if self.hsm_resolve(path)? != fid {
            return refuse(FsErrorKind::Invalid, format!("{path} does not name {fid}"));
        }
        let state = self
            .store
            .read(|ns| ns.hsm_state(fid))
            .map_err(ns_error)?
            .unwrap_or_default();
        if state.action.is_some() || state.released || (state.archived && !state.dirty) {
            return Ok(state); // under way, or nothing to do
        }
        let names: Vec<&str> = path.split('/').filter(|n| !n.is_empty()).collect();
        let path = format!("/{}", names.join("/"));
        let links = self.hsm_links();
        let link = links
            .links
            .iter()
            .filter_map(|l| {
                let there = self.store.read(|ns| ns.dir_path(l.dir))?;
                below(&path, &there).then_some((l, there))
            })
            .max_by_key(|(_, there)| there.len());
        let Some((link, there)) = link else {
            return refuse(
                FsErrorKind::Invalid,
                format!("{path} is in no linked directory (lode hsm link)"),
            );
        };
        let key = if state.link == link.id && !state.key.is_empty() {
            state.key.clone()
        } else {
            link.key_of(&path[there.trim_end_matches('/').len()..])
        };
        let state = State {
            link: link.id,
            key,
            ..state
        };
        self.hsm_start(fid, state, ActionKind::Archive).await
    }

    async fn hsm_release(&self, fid: Fid) -> Result<State, RemoteError> {
        let (inode, state) = self
            .store
            .read(|ns| Ok::<_, NsError>((ns.inode(fid)?.clone(), ns.hsm_state(fid)?)))
            .map_err(ns_error)?;
        let Some(mut state) = state else {
            return refuse(FsErrorKind::Invalid, format!("{fid} was never archived"));
        };
        if state.released {
            return Ok(state);
        }
        if !state.archived || state.dirty || state.action.is_some() {
            return refuse(
                FsErrorKind::Busy,
                format!(
                    "{fid} is {}: only a file archived and unchanged since is released",
                    state.words()
                ),
            );
        }
        if inode.size != state.size || inode.mtime != state.mtime {
            return refuse(
                FsErrorKind::Busy,
                format!("{fid} changed since it was archived"),
            );
        }
        if !self.hsm_links().links.iter().any(|l| l.id == state.link) {
            return refuse(
                FsErrorKind::Invalid,
                format!("{fid}'s archive is no longer linked: it could not be restored"),
            );
        }
        // Handles kept past their close go with the lease (at their client's next ping); the
        // rest must close.
        let _recall = self.leases.recall(&[fid], None).await;
        let until = tokio::time::Instant::now() + RELEASE_WAIT;
        while self.alloc.open.is_open(fid) && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        state.released = true;
        let m = Mutation::HsmSet {
            fid,
            state: state.encode(),
            release: true,
            restored: None,
        };
        // Checked again under the namespace's lock: an open counted after this check reads
        // the released layout (an open reads a file's layout again once counted).
        let open = std::sync::atomic::AtomicBool::new(false);
        let result = loop {
            let _recall = self.leases.recall(&[fid], None).await;
            let clear = |fids: &[proto::Fid]| {
                if self.alloc.open.is_open(fid) {
                    open.store(true, std::sync::atomic::Ordering::Relaxed);
                    return false;
                }
                self.leases.clear(fids, None)
            };
            let change = crate::store::Change {
                clear: &clear,
                ..crate::store::Change::new(m.clone(), Creds::root())
            };
            match self.store.apply_behind(change) {
                Err(StoreError::Leased) if open.load(std::sync::atomic::Ordering::Relaxed) => {
                    return refuse(
                        FsErrorKind::Busy,
                        format!("{fid} is open: a file is released once closed"),
                    );
                }
                Err(StoreError::Leased) => continue,
                other => break other,
            }
        };
        let done = result.map_err(store_error)?;
        self.store
            .wait_committed(done.transno)
            .await
            .map_err(store_error)?;
        Ok(state)
    }

    /// A restore's progress for a reader of `fid` up to `end`: started if the file is
    /// released and none is under way, then waited for a while.
    async fn hsm_restore(&self, fid: Fid, end: u64) -> Result<HsmReply, RemoteError> {
        let until = tokio::time::Instant::now() + RESTORE_WAIT;
        loop {
            let progressed = self.hsm.progress.notified();
            tokio::pin!(progressed);
            progressed.as_mut().enable();
            let (inode, state) = self
                .store
                .read(|ns| Ok::<_, NsError>((ns.inode(fid)?.clone(), ns.hsm_state(fid)?)))
                .map_err(ns_error)?;
            let Some(state) = state.filter(|s| s.released) else {
                return Ok(HsmReply::Restoring {
                    done: true,
                    landed: inode.size,
                    inode,
                });
            };
            match (&state.action, self.hsm.restore_of(fid, FAILED_FOR)) {
                // Failed lately: the readers waiting, and those that come soon after, are
                // told why; a reader after that tries again.
                (None, Some(Err(Ended::Failed(e)))) => {
                    return refuse(FsErrorKind::Io, format!("restoring {fid} failed: {e}"));
                }
                (None, _) => {
                    if !self.hsm_links().links.iter().any(|l| l.id == state.link) {
                        return refuse(
                            FsErrorKind::Io,
                            format!("{fid} is released and its archive is no longer linked"),
                        );
                    }
                    // Its copy's objects first: the copytool writes at once, and nobody's
                    // lease is recalled (placing them as a client would recalls the reader's).
                    if let Err(e) = self.hsm_place(fid, &inode).await {
                        tracing::debug!(%fid, error = %e, "the copytool places the copy itself");
                    }
                    self.hsm_start(fid, state, ActionKind::Restore).await?;
                }
                (Some(_), Some(Ok(landed)))
                    if end != u64::MAX && landed >= end.min(inode.size) && landed > 0 =>
                {
                    return Ok(HsmReply::Restoring {
                        done: false,
                        landed,
                        inode,
                    });
                }
                (Some(_), _) => {}
            }
            if tokio::time::timeout_at(until, progressed).await.is_err() {
                let landed = match self.hsm.restore_of(fid, FAILED_FOR) {
                    Some(Ok(l)) => l,
                    _ => 0,
                };
                return Ok(HsmReply::Restoring {
                    done: false,
                    landed,
                    inode,
                });
            }
        }
    }

    async fn hsm_take(&self, copytool: u128, max: u32) -> Result<Vec<Work>, RemoteError> {
        let max = max.clamp(1, MAX_TAKE) as usize;
        let until = tokio::time::Instant::now() + TAKE_WAIT;
        loop {
            let queued = self.hsm.work.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            let taken = self.hsm.take(copytool, max);
            if !taken.is_empty() {
                let links = self.hsm_links();
                let mut out = vec![];
                for (id, fid, kind) in taken {
                    let state = self.store.read(|ns| ns.hsm_state(fid)).ok().flatten();
                    let link = state
                        .as_ref()
                        .and_then(|s| links.links.iter().find(|l| l.id == s.link));
                    match (state.as_ref(), link) {
                        (Some(s), Some(l)) if s.action.as_ref().is_some_and(|a| a.id == id) => out
                            .push(Work {
                                id,
                                kind,
                                fid,
                                link: l.clone(),
                                key: s.key.clone(),
                                size: s.size,
                                etag: s.etag.clone(),
                            }),
                        _ => {
                            let failure = Failure {
                                error: "the file or its link is gone".into(),
                                permanent: true,
                            };
                            self.hsm_done(copytool, id, Err(failure)).await.ok();
                        }
                    }
                }
                if !out.is_empty() {
                    return Ok(out);
                }
                continue;
            }
            if tokio::time::timeout_at(until, queued).await.is_err() {
                return Ok(vec![]);
            }
        }
    }

    async fn hsm_done(
        &self,
        copytool: u128,
        id: u64,
        result: Result<Finished, Failure>,
    ) -> Result<(), RemoteError> {
        let Some((fid, kind)) = self.hsm.held(id, Some(copytool)) else {
            return refuse(
                FsErrorKind::Stale,
                format!("action {id:x} is not this copytool's"),
            );
        };
        let (inode, state) = self
            .store
            .read(|ns| Ok::<_, NsError>((ns.inode(fid)?.clone(), ns.hsm_state(fid)?)))
            .map_err(ns_error)?;
        let Some(mut state) = state.filter(|s| s.action.as_ref().is_some_and(|a| a.id == id))
        else {
            self.hsm
                .finish(id, Ended::Failed("the action was replaced".into()));
            return Ok(());
        };
        let result = match (kind, result) {
            (ActionKind::Archive, Ok(f))
                if f.size != inode.size
                    || f.mtime != inode.mtime
                    || !self.alloc.open.alone_since(fid, f.handle) =>
            {
                Err(Failure {
                    error: "the file changed while it was archived".into(),
                    permanent: false,
                })
            }
            (_, r) => r,
        };
        match result {
            Ok(f) => {
                let (restored, what) = match kind {
                    ActionKind::Archive => {
                        state.archived = true;
                        state.dirty = false;
                        state.lost = false;
                        state.etag = f.etag;
                        state.size = f.size;
                        state.mtime = f.mtime;
                        (None, "archived")
                    }
                    ActionKind::Restore => {
                        state.released = false;
                        (Some(f.generation), "restored")
                    }
                };
                state.action = None;
                let m = Mutation::HsmSet {
                    fid,
                    state: state.encode(),
                    release: false,
                    restored,
                };
                match self.hsm_apply(m).await {
                    Ok(_) => {
                        tracing::info!(%fid, key = %state.key, "{what}");
                        self.hsm.finish(id, Ended::Done);
                    }
                    Err(e) => {
                        let failure = Failure {
                            error: e.to_string(),
                            permanent: false,
                        };
                        self.hsm_failed(fid, id, state, failure).await?;
                    }
                }
            }
            Err(failure) => self.hsm_failed(fid, id, state, failure).await?,
        }
        Ok(())
    }

    /// Action `id` on `fid` failed: tried again later, or ended with the error.
    async fn hsm_failed(
        &self,
        fid: Fid,
        id: u64,
        mut state: State,
        failure: Failure,
    ) -> Result<(), RemoteError> {
        tracing::warn!(%fid, error = %failure.error, "an HSM action failed");
        if !self.hsm.failed(id, &failure.error, failure.permanent) {
            return Ok(());
        }
        state.action = None;
        let m = Mutation::HsmSet {
            fid,
            state: state.encode(),
            release: false,
            restored: None,
        };
        self.hsm_apply(m).await?;
        self.hsm.finish(id, Ended::Failed(failure.error));
        Ok(())
    }

    async fn hsm_import(
        &self,
        link: u32,
        parent: Fid,
        entries: Vec<Imported>,
    ) -> Result<(u32, u32), RemoteError> {
        if entries.len() > MAX_IMPORT {
            return refuse(
                FsErrorKind::Invalid,
                format!("at most {MAX_IMPORT} names in one import"),
            );
        }
        let Some(l) = self.hsm_links().links.into_iter().find(|l| l.id == link) else {
            return refuse(FsErrorKind::NotFound, format!("no link {link}"));
        };
        let (dir, there, here) = self
            .store
            .read(|ns| {
                let dir = ns.inode(parent)?.clone();
                Ok::<_, NsError>((dir, ns.dir_path(l.dir), ns.dir_path(parent)))
            })
            .map_err(ns_error)?;
        let inside = matches!((&there, &here), (Some(t), Some(h)) if below(h, t));
        if dir.kind != Kind::Dir || !inside {
            return refuse(
                FsErrorKind::Invalid,
                format!("{parent} is not a directory under the link of {}", l.path),
            );
        }
        let owner = Creds {
            uid: dir.uid,
            gid: dir.gid,
            groups: vec![],
        };
        let layout = released_layout(dir.layout.as_ref());
        let (mut made, mut skipped) = (0, 0);
        for e in entries {
            let exists = self.store.read(|ns| {
                let i = ns.lookup(parent, &e.name, &Creds::root()).ok()?;
                Some((i.fid, State::of_inode(i)))
            });
            if let Some((fid, now)) = exists {
                // A released file of this object, unchanged here, whose object changed: it
                // takes the new object (with `--import changed`). Anything else stays.
                let changed = match now {
                    Some(s)
                        if l.import.changed
                            && s.link == link
                            && s.key == e.key
                            && s.etag != e.etag
                            && s.released
                            && !s.dirty
                            && s.action.is_none() =>
                    {
                        Some(State {
                            etag: e.etag.clone(),
                            size: e.size,
                            mtime: e.mtime,
                            ..s
                        })
                    }
                    _ => None,
                };
                match changed {
                    Some(state) => {
                        let m = Mutation::HsmReimport {
                            fid,
                            size: e.size,
                            mtime: e.mtime,
                            state: state.encode(),
                        };
                        self.apply(m, Creds::root(), None, None, vec![], true, None)
                            .await?;
                        made += 1;
                    }
                    None => skipped += 1,
                }
                continue;
            }
            if !l.import.new {
                skipped += 1;
                continue;
            }
            let state = State {
                archived: true,
                released: true,
                link,
                key: e.key,
                etag: e.etag,
                size: e.size,
                mtime: e.mtime,
                ..State::default()
            };
            let m = Mutation::HsmImport {
                parent,
                name: e.name,
                size: e.size,
                mtime: e.mtime,
                state: state.encode(),
                layout: layout.clone(),
            };
            match self
                .apply(m, owner.clone(), None, None, vec![], true, None)
                .await
            {
                Ok(_) => made += 1,
                Err(e) if e.code == StatusCode::Fs(FsErrorKind::Exists) => skipped += 1,
                Err(e) => return Err(e),
            }
        }
        self.store.sync().await.map_err(store_error)?;
        Ok((made, skipped))
    }
}
