//! The namespace's side of HSM: a file's state set (released, restored), the links kept on
//! the root, files named for an archive's objects, and the rules every other change keeps
//! with an archived file: a change of its bytes marks it dirty, and a released file's size
//! does not change until it is restored.

use proto::hsm::{State, LINKS_XATTR, STATE_XATTR};

use super::*;

/// The file whose bytes (size or modification time) a change sets, if any: what marks an
/// archived file dirty.
fn changes_data(m: &Mutation) -> Option<(Fid, bool)> {
    match m {
        Mutation::GrowSize { fid, .. } | Mutation::WriteMdt { fid, .. } => Some((*fid, true)),
        Mutation::Setattr { fid, attr } if attr.size.is_some() => Some((*fid, true)),
        Mutation::Setattr { fid, attr } if attr.mtime.is_some() || attr.times_now => {
            Some((*fid, false))
        }
        _ => None,
    }
}

impl Namespace {
    /// `fid`'s HSM state, if it has one.
    pub fn hsm_state(&self, fid: Fid) -> Result<Option<State>> {
        Ok(State::of_inode(self.inode(fid)?))
    }

    /// The files with an HSM action recorded, and the action: the coordinator's queue, as
    /// the journal left it.
    pub fn hsm_actions(&self) -> Vec<(Fid, proto::hsm::Action)> {
        self.inodes
            .values()
            .filter(|i| i.kind == Kind::File && i.xattrs.contains_key(STATE_XATTR))
            .filter_map(|i| State::of_inode(i)?.action.map(|a| (i.fid, a)))
            .collect()
    }

    /// Checks a change of `m`'s file's bytes against its HSM state: a released file's size
    /// stays until its bytes are back. Returns the file to mark dirty once the change is
    /// applied.
    pub(super) fn hsm_before(&self, m: &Mutation) -> Result<Option<Fid>> {
        let Some((fid, size)) = changes_data(m) else {
            return Ok(None);
        };
        let Some(state) = self.inodes.get(&fid).and_then(State::of_inode) else {
            return Ok(None);
        };
        if state.released {
            if size {
                return err(
                    FsErrorKind::Io,
                    format!("{fid} is released: its bytes are in the archive; restore it first"),
                );
            }
            return Ok(None);
        }
        Ok((state.archived && !state.dirty).then_some(fid))
    }

    /// Files a link exports, found by a walk that looks at up to `look` entries: the
    /// directories still to look in are `todo` (each with its path below the link), left as
    /// the walk stopped (empty once it ended). Those never archived (with `new`) and those
    /// changed since (with `changed`), with no action under way, with their paths below the
    /// link. A directory gone since is passed over.
    pub fn hsm_to_export(
        &self,
        todo: &mut Vec<(Fid, String)>,
        new: bool,
        changed: bool,
        look: usize,
    ) -> Vec<(Fid, String)> {
        let mut out = vec![];
        let mut looked = 0;
        while let Some((d, at)) = todo.pop() {
            let Some(names) = self.entries.get(&d) else {
                continue;
            };
            for (name, fid) in names {
                looked += 1;
                let Some(i) = self.inodes.get(fid) else {
                    continue;
                };
                let path = format!("{at}/{}", String::from_utf8_lossy(name));
                match i.kind {
                    Kind::Dir => todo.push((*fid, path)),
                    Kind::File => {
                        let wanted = match State::of_inode(i) {
                            None => new,
                            Some(s) => changed && s.archived && s.dirty && s.action.is_none(),
                        };
                        let has_bytes = i
                            .layout
                            .as_ref()
                            .is_some_and(|l| l.components.iter().all(|c| c.is_instantiated()));
                        if wanted && has_bytes {
                            out.push((*fid, path));
                        }
                    }
                    _ => {}
                }
            }
            if looked >= look {
                break;
            }
        }
        out
    }

    /// An archived file changed: its archived copy is no longer its bytes.
    pub(super) fn hsm_dirty(&mut self, fid: Fid) {
        let Some(x) = self.inodes.get_mut(&fid) else {
            return;
        };
        if let Some(mut s) = State::of_inode(x) {
            s.dirty = true;
            x.xattrs.insert(STATE_XATTR.to_string(), s.encode());
        }
    }

    /// The HSM invariants that do not hold (for `fsck`): every state decodes; a released
    /// file is archived, under a key, of its archived size, and its layout names no copy in
    /// sync.
    pub(super) fn check_hsm(&self) -> Vec<String> {
        let mut problems = vec![];
        for i in self.inodes.values() {
            let Some(raw) = i.xattrs.get(STATE_XATTR) else {
                continue;
            };
            let Some(s) = State::decode(raw) else {
                problems.push(format!("{}: an HSM state that does not decode", i.fid));
                continue;
            };
            if s.released {
                // Objects may be placed for a copy a restore fills (queued, or about to be):
                // no copy is in sync until the restore ends.
                let layout_ok = i
                    .layout
                    .as_ref()
                    .is_some_and(|l| l.components.iter().all(|c| c.stale));
                if !s.archived || s.key.is_empty() || s.size != i.size || !layout_ok {
                    problems.push(format!(
                        "{}: released, but {} (size {}, archived {}, layout {:?})",
                        i.fid,
                        s.words(),
                        i.size,
                        s.size,
                        i.layout
                    ));
                }
            }
        }
        problems
    }

    /// Sets `fid`'s HSM state (see [`Mutation::HsmSet`]).
    pub(super) fn hsm_set(
        &mut self,
        fid: Fid,
        state: &[u8],
        release: bool,
        restored: Option<u32>,
    ) -> Result<Applied> {
        let i = self.inode(fid)?;
        if i.kind != Kind::File {
            return err(FsErrorKind::Invalid, format!("{fid} is not a regular file"));
        }
        let Some(new) = State::decode(state) else {
            return err(FsErrorKind::Invalid, "an HSM state that does not decode");
        };
        let Some(layout) = i.layout.as_ref() else {
            return err(FsErrorKind::Invalid, format!("{fid} has no layout"));
        };
        if release && layout.mdt_end().is_some() {
            return err(
                FsErrorKind::Invalid,
                format!("{fid} keeps its first bytes on the MDS: it is not released"),
            );
        }
        if let Some(generation) = restored {
            if layout.generation != generation {
                return err(
                    FsErrorKind::Stale,
                    format!("{fid}'s layout changed during its restore"),
                );
            }
            if layout
                .components
                .iter()
                .any(|c| c.mirror == 0 && !c.is_instantiated())
            {
                return err(
                    FsErrorKind::Invalid,
                    format!("{fid}: mirror 0 has no objects to be restored into"),
                );
            }
        }
        let mut doomed = vec![];
        let x = self.inodes.get_mut(&fid).expect("checked above");
        let layout = x.layout.as_mut().expect("checked above");
        if release {
            for c in &mut layout.components {
                doomed.append(&mut c.objects);
                c.stale = true;
            }
            layout.generation += 1;
        }
        if restored.is_some() {
            for c in layout.components.iter_mut().filter(|c| c.mirror == 0) {
                c.stale = false;
            }
            layout.generation += 1;
        }
        x.xattrs.insert(STATE_XATTR.to_string(), new.encode());
        let inode = x.clone();
        for o in doomed {
            self.doomed.insert(o.fid, (o.target, fid));
        }
        Ok(Applied {
            inode: Some(inode),
            removed: vec![],
            reserved: None,
        })
    }

    /// A released file takes its changed object's size, time and state (see
    /// [`Mutation::HsmReimport`]).
    pub(super) fn hsm_reimport(
        &mut self,
        fid: Fid,
        size: u64,
        mtime: Time,
        state: &[u8],
        now: Time,
    ) -> Result<Applied> {
        let i = self.inode(fid)?;
        let released = State::of_inode(i).is_some_and(|s| s.released && !s.dirty);
        let Some(s) = State::decode(state).filter(|s| s.released && s.archived) else {
            return err(FsErrorKind::Invalid, "a file imported again stays released");
        };
        if !released {
            return err(
                FsErrorKind::Busy,
                format!("{fid} is not released: its bytes in lode are not replaced"),
            );
        }
        if size > MAX_FILE_SIZE {
            return err(
                FsErrorKind::FileTooLarge,
                format!("{size} is past the file size limit"),
            );
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        x.size = size;
        x.mtime = mtime;
        x.ctime = now;
        x.xattrs.insert(STATE_XATTR.to_string(), s.encode());
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Keeps the links on the root.
    pub(super) fn hsm_links(&mut self, links: &[u8]) -> Result<Applied> {
        if proto::hsm::Links::decode(links).is_none() {
            return err(FsErrorKind::Invalid, "links that do not decode");
        }
        let root = self.root;
        let x = self.inodes.get_mut(&root).ok_or_else(|| NsError {
            kind: FsErrorKind::NotFound,
            what: "no root".into(),
        })?;
        x.xattrs.insert(LINKS_XATTR.to_string(), links.to_vec());
        Ok(Applied {
            inode: None,
            removed: vec![],
            reserved: None,
        })
    }

    /// Names a released file for an archive's object (see [`Mutation::HsmImport`]).
    #[allow(clippy::too_many_arguments)] // the fields of one Mutation::HsmImport
    pub(super) fn hsm_import(
        &mut self,
        parent: Fid,
        name: &[u8],
        size: u64,
        mtime: Time,
        state: &[u8],
        layout: &Layout,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        let Some(s) = State::decode(state).filter(|s| s.released && s.archived) else {
            return err(
                FsErrorKind::Invalid,
                "an imported file is archived and released",
            );
        };
        if size > MAX_FILE_SIZE {
            return err(
                FsErrorKind::FileTooLarge,
                format!("{size} is past the file size limit"),
            );
        }
        if layout.mdt_end().is_some()
            || layout
                .components
                .iter()
                .any(|c| c.is_instantiated() || !c.stale)
        {
            return err(
                FsErrorKind::Invalid,
                "an imported file's layout is stale and without objects",
            );
        }
        let made = self.create(
            None,
            parent,
            name,
            Kind::File,
            0o644,
            true,
            &[],
            Some(layout.clone()),
            who,
            now,
        )?;
        let fid = made.inode.expect("a create makes an inode").fid;
        let x = self.inodes.get_mut(&fid).expect("just made");
        x.size = size;
        x.mtime = mtime;
        x.xattrs.insert(STATE_XATTR.to_string(), s.encode());
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }
}
