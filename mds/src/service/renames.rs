//! Renames of directories to another parent when the filesystem has several MDTs: a
//! directory's ancestors may live on other MDTs, so the check that it does not move below
//! itself walks them there, and holds the filesystem's rename lock (kept by MDT0) from the
//! check until the rename ends. Two renames each checked alone could otherwise make a loop
//! together (`a` into `b/` on one MDT while `b` goes into `a/` on another). As Lustre's big
//! filesystem lock, it serialises only these renames; everything else goes on.

use proto::Fid;

use super::*;

/// Most directories between a directory and the root that the check walks.
const MAX_DEPTH: usize = 4096;

impl MdsService {
    /// Whether the filesystem has MDTs other than this one.
    pub(super) fn several_mdts(&self) -> bool {
        self.registry.filesystem().mdt != 0 || !self.registry.mdts().is_empty()
    }

    /// The directories a rename on this MDT moves to another parent, each with it: what the
    /// rename lock and the walk across MDTs guard. Empty when nothing needs them (a single
    /// MDT checks alone; a file's rename makes no loop).
    pub(super) fn dirs_reparented(&self, m: &Mutation) -> Vec<(Fid, Fid)> {
        let Mutation::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } = m
        else {
            return vec![];
        };
        if parent == new_parent || !self.several_mdts() {
            return vec![];
        }
        self.store.read(|ns| {
            let dir = |p: Fid, n: &[u8]| {
                ns.lookup(p, n, &Creds::root())
                    .ok()
                    .filter(|i| i.kind == Kind::Dir)
                    .map(|i| i.fid)
            };
            let mut out = vec![];
            if let Some(d) = dir(*parent, name) {
                out.push((d, *new_parent));
            }
            if flags.exchange {
                if let Some(d) = dir(*new_parent, new_name) {
                    out.push((d, *parent));
                }
            }
            out
        })
    }

    /// Refuses a rename that needs the rename lock while this MDS holds it for another (a
    /// move of a directory recorded and not ended).
    pub(super) fn no_other_dir_move(&self, key: ReqId) -> Result<(), RemoteError> {
        let busy = self.store.read(|ns| {
            ns.moving().iter().any(|m| {
                m.peer_req != key
                    && ns
                        .lookup(m.parent, &m.name, &Creds::root())
                        .is_ok_and(|i| i.kind == Kind::Dir)
            })
        });
        if busy {
            return Err(RemoteError::new(
                StatusCode::Busy,
                "another rename of a directory is under way",
            ));
        }
        Ok(())
    }

    /// Takes the filesystem's rename lock for rename `key` (answered Busy while another MDT
    /// holds it).
    pub(super) async fn lock_renames(&self, key: ReqId) -> Result<(), RemoteError> {
        let own = self.registry.filesystem().mdt;
        let m = Mutation::RenameLock {
            holder: own,
            key: Some(key),
        };
        if own == 0 {
            self.apply_own(m, None).await?;
        } else {
            self.on_mdt(0, &Creds::root(), m, None).await?;
        }
        Ok(())
    }

    /// Lets go of the rename lock; one MDT0 did not hear of is let go later.
    pub(super) async fn unlock_renames(&self) {
        let own = self.registry.filesystem().mdt;
        let m = Mutation::RenameLock {
            holder: own,
            key: None,
        };
        let done = if own == 0 {
            self.apply_own(m, None).await.map(|_| ())
        } else {
            self.on_mdt(0, &Creds::root(), m, None).await.map(|_| ())
        };
        match done {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the rename lock is let go later");
                self.lock_stale
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.across.notify_one();
            }
        }
    }

    /// Lets go of a rename lock this MDS may hold from before (a restart, a lost answer) when
    /// no rename of a directory is under way here; true once done or not needed.
    pub(super) async fn let_go_stale_lock_once(&self) -> bool {
        use std::sync::atomic::Ordering;
        if !self.lock_stale.load(Ordering::SeqCst) {
            return true;
        }
        let own = self.registry.filesystem().mdt;
        if own == 0
            && self
                .store
                .read(|ns| ns.rename_lock())
                .is_none_or(|(h, _)| h != 0)
        {
            self.lock_stale.store(false, Ordering::SeqCst);
            return true;
        }
        if !self.several_mdts() {
            self.lock_stale.store(false, Ordering::SeqCst);
            return true;
        }
        let _one = self.moving.lock().await;
        let fresh = self.peer_req(None);
        if self.no_other_dir_move(fresh).is_err() {
            // Held for that move, which lets it go as it ends.
            return true;
        }
        self.lock_stale.store(false, Ordering::SeqCst);
        self.unlock_renames().await;
        !self.lock_stale.load(Ordering::SeqCst)
    }

    /// Whether directory `dir` is `ancestor` or lies below it, its parents followed across
    /// MDTs (a directory of another MDT asks that MDT for its `..`).
    pub(super) async fn within_across(&self, dir: Fid, ancestor: Fid) -> Result<bool, RemoteError> {
        let own = self.registry.filesystem().mdt;
        let mut at = dir;
        for _ in 0..MAX_DEPTH {
            if at == ancestor {
                return Ok(true);
            }
            let mdt = proto::fid::mdt_of(at).unwrap_or(0);
            let up = if mdt == own {
                self.store.read(|ns| ns.parent_of(at))
            } else {
                let nid = self.mdt_nid(mdt).await?;
                let r = MdsLookup {
                    creds: Creds::root(),
                    parent: at,
                    name: b"..".to_vec(),
                    lease: None,
                };
                let up = lnet::call(self.alloc.net(), &nid, &r, remote::PEER_CALL)
                    .await
                    .map_err(|e| remote::peer_error(mdt, e))?;
                Some(up.inode.fid)
            };
            match up {
                Some(p) if p != at => at = p,
                // The root (its own parent), or a directory gone: nothing above.
                _ => return Ok(false),
            }
        }
        Err(RemoteError::new(
            StatusCode::Fs(FsErrorKind::Invalid),
            format!("{dir} lies more than {MAX_DEPTH} directories deep, or in a loop"),
        ))
    }

    /// Write permission on a directory of another MDT given another parent by `creds` (its
    /// `..` changes), as one of this MDT's is checked: its mode and owners asked of its own
    /// MDT, as a server (the stub here may hold an old mode).
    pub(super) async fn may_reparent_remote(
        &self,
        dir: Fid,
        creds: &Creds,
    ) -> Result<(), RemoteError> {
        let mdt = proto::fid::mdt_of(dir).unwrap_or(0);
        if mdt == self.registry.filesystem().mdt {
            return Ok(());
        }
        let nid = self.mdt_nid(mdt).await?;
        let r = MdsGetattr {
            fid: dir,
            creds: Creds::root(),
            lease: None,
        };
        let got = lnet::call(self.alloc.net(), &nid, &r, remote::PEER_CALL)
            .await
            .map_err(|e| remote::peer_error(mdt, e))?;
        if !crate::namespace::Namespace::permits(&got.inode, creds, 2) {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::AccessDenied),
                format!("permission denied on {dir}"),
            ));
        }
        Ok(())
    }

    /// Refuses moving each directory under its new parent if that lies below it.
    pub(super) async fn not_below_itself(&self, dirs: &[(Fid, Fid)]) -> Result<(), RemoteError> {
        for &(dir, under) in dirs {
            if self.within_across(under, dir).await? {
                return Err(RemoteError::new(
                    StatusCode::Fs(FsErrorKind::Invalid),
                    format!("cannot move directory {dir} below itself"),
                ));
            }
        }
        Ok(())
    }

    /// A rename on this MDT that moves directories to other parents of a filesystem with
    /// several MDTs: under the rename lock, checked across MDTs, then carried out as any
    /// change is.
    pub(super) async fn rename_dirs_locked(
        &self,
        mut r: MdsReint,
        node: Option<std::net::IpAddr>,
        dirs: Vec<(Fid, Fid)>,
    ) -> Result<MdsReintReply, RemoteError> {
        // Answered once durable: a replay after a crash would carry it out unchecked.
        r.behind = false;
        let _one = self.moving.lock().await;
        if let Some(q) = r.req {
            if self.store.read(|ns| ns.replied(q)).is_some() {
                // A resend of one carried out: answered from the reply cache.
                return self.reint_plain(r, node).await;
            }
        }
        let key = self.peer_req(None);
        self.no_other_dir_move(key)?;
        self.lock_renames(key).await?;
        let done = match self.not_below_itself(&dirs).await {
            Ok(()) => self.reint_plain(r, node).await,
            Err(e) => Err(e),
        };
        self.unlock_renames().await;
        done
    }
}
