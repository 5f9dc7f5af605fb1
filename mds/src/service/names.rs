//! Lookups, attributes, directory pages and statfs: reads of the namespace, each showing the caller
//! only what it may see, with leases granted before the state is read.

use super::*;

impl MdsService {
    /// One name in a directory (`MDS_LOOKUP`).
    pub(super) async fn serve_lookup(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let mut r: MdsLookup = req.decode()?;
        r.creds = self.nodemap.map(req, r.creds);
        // A directory another client holds alone: what it answered ahead comes first.
        self.leases.recall_alone(&[r.parent], r.lease).await;
        // Granted before the state is read: a change after the grant recalls it.
        let client = self.lessee(r.lease);
        let mut leased = client.is_some_and(|c| self.grant(c, &[r.parent]));
        let mut inode = self
            .store
            .read(|ns| {
                // `..` of a directory placed here from another MDT: its parent is there, and
                // only its FID is known here (the client asks that MDT for the rest).
                if r.name == b".." {
                    if let Some(p) = ns.remote_parent(r.parent, &r.creds)? {
                        return Ok(Inode::dir_known_by_fid(p));
                    }
                }
                ns.lookup(r.parent, &r.name, &r.creds).cloned()
            })
            .map_err(ns_error)?;
        if let Some(c) = client.filter(|_| leased) {
            leased = self.grant(c, &[inode.fid]);
            if leased {
                // Read again, after the grant.
                match self.store.read(|ns| ns.inode(inode.fid).cloned()) {
                    Ok(i) => inode = i,
                    Err(_) => leased = false,
                }
            }
        }
        let (inode, whole) = shown(inode, &r.creds);
        reply::<MdsLookup>(&MdsInode {
            inode,
            leased: leased && whole,
        })
    }

    /// A path's names walked in one call (`MDS_LOOKUP_PATH`).
    pub(super) async fn serve_lookup_path(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let mut r: MdsLookupPath = req.decode()?;
        r.creds = self.nodemap.map(req, r.creds);
        if r.names.len() > MAX_PATH_NAMES {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::Invalid),
                format!(
                    "{} names in one lookup, past {MAX_PATH_NAMES}",
                    r.names.len()
                ),
            ));
        }
        // The inodes walked, and every directory looked in (a failed lookup too).
        let walk = || {
            self.store.read(|ns| {
                let mut out: Vec<Inode> = vec![];
                let mut dirs = vec![r.dir];
                let mut dir = r.dir;
                for n in &r.names {
                    let i = match ns.lookup(dir, &n.0, &r.creds) {
                        Ok(i) => i,
                        Err(e) => return (dirs, Err(e)),
                    };
                    dir = i.fid;
                    out.push(i.clone());
                    if i.kind == Kind::Symlink {
                        break; // the client follows it
                    }
                    if ns.is_remote(i.fid) {
                        break; // another MDT's directory: the client walks on there
                    }
                    if i.xattrs.contains_key(proto::dirstripe::LMV_XATTR) {
                        break; // a striped directory: the client walks on in its shards
                    }
                    if i.kind == Kind::Dir && proto::crypt::is_encrypted(i) {
                        break; // its names are encrypted: the client walks on with its key
                    }
                    if i.kind == Kind::Dir {
                        dirs.push(i.fid);
                    }
                }
                (dirs, Ok(out))
            })
        };
        // A directory held alone by a client is recalled first (what it answered ahead
        // comes first), and the walk made again.
        let (mut dirs, mut walked) = walk();
        for _ in 0..MAX_PATH_NAMES {
            if !self.leases.held_alone(&dirs, None) {
                break;
            }
            self.leases.recall_alone(&dirs, None).await;
            (dirs, walked) = walk();
        }
        let inodes = walked
            .map_err(ns_error)?
            .into_iter()
            .map(|i| shown(i, &r.creds).0)
            .collect();
        reply::<MdsLookupPath>(&MdsPath { inodes })
    }

    /// An inode's attributes (`MDS_GETATTR`).
    pub(super) async fn serve_getattr(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let mut r: MdsGetattr = req.decode()?;
        r.creds = self.nodemap.map(req, r.creds);
        self.leases.recall_alone(&[r.fid], r.lease).await;
        let leased = self
            .lessee(r.lease)
            .is_some_and(|c| self.grant(c, &[r.fid]));
        let inode = self
            .store
            .read(|ns| ns.inode(r.fid).cloned())
            .map_err(ns_error)?;
        let (inode, whole) = shown(inode, &r.creds);
        reply::<MdsGetattr>(&MdsInode {
            inode,
            leased: leased && whole,
        })
    }

    /// A page of a directory (`MDS_READDIR`).
    pub(super) async fn serve_readdir(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let mut r: MdsReaddir = req.decode()?;
        r.creds = self.nodemap.map(req, r.creds);
        self.leases.recall_alone(&[r.dir], r.lease).await;
        self.readdir(r)
    }

    /// One page of a directory, cut to fit a reply whatever the names' length; with `plus`,
    /// each entry's attributes (without xattrs, layout or target).
    pub(super) fn readdir(&self, r: MdsReaddir) -> Result<Vec<u8>, RemoteError> {
        let max = r.max.clamp(1, MAX_READDIR) as usize;
        let after = (!r.after.is_empty()).then_some(&r.after[..]);
        // The listing of a directory too long for a client to keep is read without leases.
        let long = || {
            self.store
                .read(|ns| ns.entry_count(r.dir))
                .is_some_and(|n| n > proto::md::MAX_LEASED_LISTING)
        };
        let client = self.lessee(r.lease).filter(|_| !long());
        let mut leased = client.is_some_and(|c| self.grant(c, &[r.dir]));
        let (entries, mut attrs, max) = self
            .store
            .read(|ns| {
                // A page stays well under the largest body, whatever the names' length.
                let per_entry = if r.plus { 192 } else { 32 };
                // How many of the entries (by their names' lengths) fit a page.
                let fits = |lens: &[usize]| {
                    let mut budget = proto::frame::MAX_BODY as usize / 2;
                    lens.iter()
                        .position(|len| {
                            budget = budget.saturating_sub(len + per_entry);
                            budget == 0
                        })
                        .map_or(max, |fits| max.min(fits.max(1)))
                };
                if r.plus {
                    let listed = ns.readdir_inodes(r.dir, after, max + 1, &r.creds)?;
                    let max = fits(&listed.iter().map(|(n, _)| n.len()).collect::<Vec<_>>());
                    let attrs: Vec<Inode> =
                        listed.iter().take(max).map(|(_, i)| i.bare()).collect();
                    let entries: Vec<(Vec<u8>, proto::Fid, Kind)> = listed
                        .into_iter()
                        .take(max + 1)
                        .map(|(n, i)| (n.to_vec(), i.fid, i.kind))
                        .collect();
                    Ok((entries, attrs, max))
                } else {
                    let mut entries = ns.readdir(r.dir, after, max + 1, &r.creds)?;
                    let max = fits(&entries.iter().map(|(n, ..)| n.len()).collect::<Vec<_>>());
                    entries.truncate(max + 1);
                    Ok((entries, vec![], max))
                }
            })
            .map_err(ns_error)?;
        let end = entries.len() <= max;
        let entries: Vec<DirEntry> = entries
            .into_iter()
            .take(max)
            .map(|(name, fid, kind)| DirEntry { name, fid, kind })
            .collect();
        if let Some(c) = client.filter(|_| leased && r.plus) {
            // The entries' leases, then their attributes read again after the grant.
            let fids: Vec<proto::Fid> = attrs.iter().map(|i| i.fid).collect();
            leased = self.grant(c, &fids);
            if leased {
                let fresh: Vec<Inode> = self.store.read(|ns| {
                    fids.iter()
                        .filter_map(|f| ns.inode(*f).ok())
                        .map(Inode::bare)
                        .collect()
                });
                leased = fresh.len() == attrs.len();
                attrs = fresh;
            }
        }
        reply::<MdsReaddir>(&MdsDirPage {
            entries,
            attrs,
            end,
            leased,
        })
    }

    /// The filesystem's inodes and space (`MDS_STATFS`).
    pub(super) fn serve_statfs(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let _: MdsStatfs = req.decode()?;
        self.statfs()
    }

    pub(super) fn statfs(&self) -> Result<Vec<u8>, RemoteError> {
        let targets = self.registry.list();
        let up: Vec<_> = targets.iter().filter(|t| t.up).collect();
        let space = self.store.disk().space().unwrap_or((0, 0));
        reply::<MdsStatfs>(&FsStats {
            inodes: self.store.read(|ns| ns.len() as u64),
            total: up.iter().map(|t| t.total).sum(),
            free: up.iter().map(|t| t.free).sum(),
            targets: targets.len() as u32,
            targets_up: up.len() as u32,
            mdt: self.registry.filesystem().mdt,
            mdt_total: space.0,
            mdt_free: space.1,
        })
    }
}
