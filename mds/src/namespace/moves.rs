//! Names of files on another MDT: a rename of a file into a directory of another MDT moves
//! the name, not the file. The file stays on its MDT (its *home*), with the same FID, handles
//! and objects; the new name's MDT keeps an entry for it with the file's attributes as they
//! were (a *stub*, as for a directory placed on another MDT), and the home counts the names
//! it has elsewhere in the file's [`ELSEWHERE`] attribute, so its link count stays whole.
//!
//! The steps, each journaled where it applies ([`crate::service`] drives them):
//!
//! 1. the old name's MDT records the move on the file ([`MOVING`]): [`Mutation::MoveOut`];
//! 2. the new name's MDT names the file ([`Mutation::LinkIn`]), once however often asked;
//! 3. the old name goes ([`Mutation::MoveDone`]), or stays if step 2 was refused
//!    ([`Mutation::MoveAbort`]).
//!
//! A name whose move is recorded takes no other change until it ends. A name of another
//! MDT's file that goes (unlink, or a rename over it) leaves its stub marked [`DROPPING`]
//! until the home has counted it gone ([`Mutation::DropLink`], numbered so a copy is not
//! counted twice), then the stub goes ([`Mutation::Dropped`]).

use super::*;
use proto::md::{Linking, Moving};

/// On a file: how many of its names live on other MDTs (a little-endian u32).
pub const ELSEWHERE: &str = "lode.elsewhere";
/// On a file: the moves of its names to other MDTs under way (a list of [`Moving`]).
pub const MOVING: &str = "lode.moving";
/// On a file: its hard links to other MDTs under way (a list of [`Linking`]), each counted in
/// its link count and [`ELSEWHERE`] already, so the file outlives its other names meanwhile.
pub const LINKING: &str = "lode.linking";
/// On MDT0's root: the filesystem's rename lock, held by (MDT, rename number).
pub const RENAME_LOCK: &str = "lode.renamelock";
/// On another MDT's file held here: its name here is gone, and its home is yet to count it
/// (the [`ReqId`] of that report).
pub const DROPPING: &str = "lode.dropping";

/// How many names `i` has on other MDTs.
pub fn elsewhere(i: &Inode) -> u32 {
    i.xattrs
        .get(ELSEWHERE)
        .and_then(|v| v.as_slice().try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn set_elsewhere(i: &mut Inode, n: u32) {
    if n == 0 {
        i.xattrs.remove(ELSEWHERE);
    } else {
        i.xattrs
            .insert(ELSEWHERE.to_string(), n.to_le_bytes().to_vec());
    }
}

/// A list of records kept in `i`'s attribute `key` (none when it has none).
pub(super) fn records<T: serde::de::DeserializeOwned>(i: &Inode, key: &str) -> Vec<T> {
    i.xattrs
        .get(key)
        .and_then(|v| postcard::from_bytes(v).ok())
        .unwrap_or_default()
}

/// Keeps `list` in `i`'s attribute `key`, removed when empty.
pub(super) fn set_records<T: serde::Serialize>(i: &mut Inode, key: &str, list: &[T]) {
    if list.is_empty() {
        i.xattrs.remove(key);
    } else {
        let v = proto::msg::encode(&list).expect("a list of records always encodes");
        i.xattrs.insert(key.to_string(), v);
    }
}

/// The moves under way of `i`'s names.
pub fn moves(i: &Inode) -> Vec<Moving> {
    records(i, MOVING)
}

fn set_moves(i: &mut Inode, m: &[Moving]) {
    set_records(i, MOVING, m)
}

/// The links of `i` to other MDTs under way.
pub fn linkings(i: &Inode) -> Vec<Linking> {
    records(i, LINKING)
}

fn set_linkings(i: &mut Inode, l: &[Linking]) {
    set_records(i, LINKING, l)
}

/// The report still to be made of `i`, a stub whose name here is gone.
pub fn dropping(i: &Inode) -> Option<ReqId> {
    i.xattrs
        .get(DROPPING)
        .and_then(|v| postcard::from_bytes(v).ok())
}

impl Namespace {
    /// Refuses a change of `name` in `parent` while a move of it to another MDT, or a mkdir or
    /// rmdir of it there, is under way.
    pub(super) fn not_moving(&self, parent: Fid, name: &[u8]) -> Result<()> {
        if self.is_placing(parent, name) {
            return err(
                FsErrorKind::WouldBlock,
                format!(
                    "{:?} is being made or removed on another MDT",
                    String::from_utf8_lossy(name)
                ),
            );
        }
        let Some(f) = self.entries.get(&parent).and_then(|d| d.get(name)) else {
            return Ok(());
        };
        let Some(i) = self.inodes.get(f).filter(|i| !i.xattrs.is_empty()) else {
            return Ok(());
        };
        if moves(i)
            .iter()
            .any(|m| m.parent == parent && m.name == name)
        {
            return err(
                FsErrorKind::WouldBlock,
                format!(
                    "{:?} is moving to another MDT",
                    String::from_utf8_lossy(name)
                ),
            );
        }
        Ok(())
    }

    /// Removes the entry `name` of `parent` for `victim`, another MDT's file: its stub stays,
    /// marked for the report to its home, numbered from `now` (the same on a replay).
    pub(super) fn drop_remote_name(&mut self, parent: Fid, name: &[u8], victim: Fid, now: Time) {
        if let Some(d) = self.entries.get_mut(&parent) {
            d.remove(name);
        }
        let mdt = u128::from(self.mdt()) << 64;
        let req = ReqId {
            client: (0x4452_4f50_u128 << 96) | mdt | u128::from(victim.oid) << 32 | 1,
            seq: (now.sec as u64).wrapping_mul(1_000_000_000) + u64::from(now.nsec),
        };
        if let Some(stub) = self.inodes.get_mut(&victim) {
            let v = proto::msg::encode(&req).expect("a request number always encodes");
            stub.xattrs.insert(DROPPING.to_string(), v);
        }
    }

    /// Stubs whose name is gone and whose home is yet to count it: (file, report number).
    pub fn dropping(&self) -> Vec<(Fid, ReqId)> {
        let mut out: Vec<_> = self
            .inodes
            .values()
            .filter(|i| !i.xattrs.is_empty() && self.is_remote(i.fid))
            .filter_map(|i| dropping(i).map(|r| (i.fid, r)))
            .collect();
        out.sort();
        out
    }

    /// Whether `fid`, another MDT's file, is held here only for the report of its name gone.
    pub fn is_dropping(&self, fid: Fid) -> bool {
        self.inodes.get(&fid).is_some_and(|i| dropping(i).is_some())
    }

    /// Whether a name of `fid` here is moving to another MDT, or a link of it is being made
    /// there.
    pub fn is_moving(&self, fid: Fid) -> bool {
        self.inodes
            .get(&fid)
            .is_some_and(|i| i.xattrs.contains_key(MOVING) || i.xattrs.contains_key(LINKING))
    }

    /// The links to other MDTs under way here.
    pub fn linking(&self) -> Vec<Linking> {
        let mut out: Vec<Linking> = self
            .inodes
            .values()
            .filter(|i| !i.xattrs.is_empty())
            .flat_map(linkings)
            .collect();
        out.sort_by_key(|l| (l.fid, l.peer_req));
        out
    }

    /// The moves to other MDTs under way here.
    pub fn moving(&self) -> Vec<Moving> {
        let mut out: Vec<Moving> = self
            .inodes
            .values()
            .filter(|i| !i.xattrs.is_empty())
            .flat_map(moves)
            .collect();
        out.sort_by(|a, b| (a.parent, &a.name).cmp(&(b.parent, &b.name)));
        out
    }

    /// Files here with names on other MDTs: (file, how many).
    pub fn named_elsewhere(&self) -> Vec<(Fid, u32)> {
        let mut out: Vec<_> = self
            .inodes
            .values()
            .filter(|i| !i.xattrs.is_empty() && !self.is_remote(i.fid))
            .map(|i| (i.fid, elsewhere(i)))
            .filter(|(_, n)| *n > 0)
            .collect();
        out.sort();
        out
    }

    /// Other MDTs' files named here (stubs, their names gone or not).
    pub fn remote_files(&self) -> Vec<Fid> {
        let mut out: Vec<Fid> = self
            .inodes
            .values()
            .filter(|i| i.kind != Kind::Dir && self.is_remote(i.fid))
            .map(|i| i.fid)
            .collect();
        out.sort();
        out
    }

    /// Step 1 of a move: checked as a rename's source, and recorded on the file.
    pub(super) fn move_out(&mut self, m: &Moving, who: &Creds) -> Result<Applied> {
        check_name(&m.name)?;
        check_name(&m.new_name)?;
        self.local(m.parent)?;
        let src = self.lookup(m.parent, &m.name, who)?.clone();
        if !self.is_remote(m.new_parent) && (src.kind != Kind::Dir || !self.is_remote(src.fid)) {
            return err(
                FsErrorKind::Invalid,
                format!(
                    "{} is a directory of this MDT: a plain rename",
                    m.new_parent
                ),
            );
        }
        if src.kind == Kind::Dir && m.parent == m.new_parent {
            return err(
                FsErrorKind::Invalid,
                "a directory renamed within its parent: a plain rename",
            );
        }
        if dropping(&src).is_some() {
            return err(FsErrorKind::Stale, format!("{} is gone", src.fid));
        }
        self.not_moving(m.parent, &m.name)?;
        let p = self.inode(m.parent)?.clone();
        self.may_unlink(&p, &src, who)?;
        if src.kind == Kind::Dir && !self.is_remote(src.fid) {
            // Its `..` changes: write permission on it too, as Linux asks (not asked of
            // another MDT's directory, whose stub here may hold an old mode).
            self.require(src.fid, who, 2)?;
        }
        let i = self.inodes.get_mut(&src.fid).expect("looked up");
        let mut all = moves(i);
        all.push(m.clone());
        set_moves(i, &all);
        Ok(Applied {
            inode: Some(i.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Step 2 of a move, on the new name's MDT: `inode` named `name` in `parent`, replacing a
    /// file of that name.
    pub(super) fn link_in(
        &mut self,
        parent: Fid,
        name: &[u8],
        inode: &Inode,
        noreplace: bool,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        check_name(name)?;
        self.local(parent)?;
        self.dir(parent)?;
        self.check_shard(parent, name, true)?;
        if self.is_placing(parent, name) {
            return err(
                FsErrorKind::WouldBlock,
                "the name is being made or removed on another MDT",
            );
        }
        self.require(parent, who, 3)?;
        if inode.kind == Kind::Dir {
            return self.dir_in(parent, name, inode, noreplace, who, now);
        }
        let home = !self.is_remote(inode.fid);
        if home {
            let i = self.inode(inode.fid)?;
            if elsewhere(i) == 0 {
                return err(
                    FsErrorKind::Invalid,
                    format!("{} has no name on another MDT to come back from", inode.fid),
                );
            }
        } else if self.is_dropping(inode.fid) {
            // Its last name here went a moment ago, and its home is yet to hear: asked
            // again once it has (Busy).
            return err(
                FsErrorKind::WouldBlock,
                format!("{}'s name here is going: try again", inode.fid),
            );
        } else if self.inodes.contains_key(&inode.fid) {
            // One name here per file of another MDT (a second would need its own stub).
            return err(
                FsErrorKind::CrossDevice,
                format!("{} has a name on this MDT already", inode.fid),
            );
        }
        let mut removed = vec![];
        if let Some(&v) = self.entries[&parent].get(name) {
            if v == inode.fid {
                return Ok(Applied {
                    inode: Some(self.inode(v)?.clone()),
                    removed,
                    reserved: None,
                });
            }
            if noreplace {
                return err(
                    FsErrorKind::Exists,
                    format!("{:?} exists", String::from_utf8_lossy(name)),
                );
            }
            self.not_moving(parent, name)?;
            let victim = self.inode(v)?.clone();
            if victim.kind == Kind::Dir {
                return err(FsErrorKind::IsDir, format!("{v} is a directory"));
            }
            let p = self.inode(parent)?.clone();
            self.may_unlink(&p, &victim, who)?;
            if self.is_remote(v) {
                self.drop_remote_name(parent, name, v, now);
            } else {
                if let Some(d) = self.entries.get_mut(&parent) {
                    d.remove(name);
                }
                removed.extend(self.drop_link(v, now));
            }
        }
        let named = if home {
            let i = self.inodes.get_mut(&inode.fid).expect("checked");
            let n = elsewhere(i) - 1;
            set_elsewhere(i, n);
            i.ctime = now;
            i.clone()
        } else {
            let stub = Inode {
                xattrs: BTreeMap::new(),
                ctime: now,
                ..inode.clone()
            };
            self.inodes.insert(stub.fid, stub.clone());
            stub
        };
        self.entries
            .get_mut(&parent)
            .expect("checked: a directory")
            .insert(name.to_vec(), named.fid);
        self.touch_dir(parent, now);
        Ok(Applied {
            inode: Some(named),
            removed,
            reserved: None,
        })
    }

    /// Step 3 of a move: the old name goes.
    pub(super) fn move_done(&mut self, parent: Fid, name: &[u8], now: Time) -> Result<Applied> {
        let Some(&f) = self.entries.get(&parent).and_then(|d| d.get(name)) else {
            return err(FsErrorKind::NotFound, "no such move under way");
        };
        let i = self.inodes.get_mut(&f).expect("named");
        let mut all = moves(i);
        let Some(at) = all
            .iter()
            .position(|m| m.parent == parent && m.name == name)
        else {
            return err(FsErrorKind::NotFound, "no such move under way");
        };
        let done = all.remove(at);
        set_moves(i, &all);
        i.ctime = now;
        let dir = i.kind == Kind::Dir;
        if let Some(d) = self.entries.get_mut(&parent) {
            d.remove(name);
        }
        self.touch_dir(parent, now);
        if dir {
            return Ok(self.dir_out(f, parent, &done, now));
        }
        let moved = if self.is_remote(f) {
            // Another MDT's file, named here once: its name lives on elsewhere now (counted
            // by its home as before, or back home).
            self.inodes.remove(&f)
        } else {
            let i = self.inodes.get_mut(&f).expect("named");
            let n = elsewhere(i) + 1;
            set_elsewhere(i, n);
            Some(i.clone())
        };
        Ok(Applied {
            inode: moved,
            removed: vec![],
            reserved: None,
        })
    }

    /// A move refused by the other MDT: the name stays as it was.
    pub(super) fn move_abort(&mut self, parent: Fid, name: &[u8]) -> Result<Applied> {
        let Some(&f) = self.entries.get(&parent).and_then(|d| d.get(name)) else {
            return err(FsErrorKind::NotFound, "no such move under way");
        };
        let i = self.inodes.get_mut(&f).expect("named");
        let mut all = moves(i);
        all.retain(|m| !(m.parent == parent && m.name == name));
        set_moves(i, &all);
        Ok(Applied {
            inode: Some(i.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Step 1 of a link to another MDT, at the file's home: checked as a link's source, then
    /// counted (link count and names elsewhere) and recorded on the file, so that the file
    /// stays while the other MDT may name it.
    pub(super) fn link_out(&mut self, l: &Linking, who: &Creds, now: Time) -> Result<Applied> {
        check_name(&l.new_name)?;
        self.local(l.fid)?;
        if !self.is_remote(l.new_parent) {
            return err(
                FsErrorKind::Invalid,
                format!("{} is a directory of this MDT: a plain link", l.new_parent),
            );
        }
        let i = self.inode(l.fid)?;
        if i.kind == Kind::Dir {
            return err(
                FsErrorKind::NotPermitted,
                "directories cannot be hard-linked",
            );
        }
        if i.nlink == 0 {
            // Kept for its handles only (O_TMPFILE, or removed while open): named again only
            // in a directory of its own MDT.
            return err(
                FsErrorKind::CrossDevice,
                format!("{} has no name: it is linked only on its own MDT", l.fid),
            );
        }
        if i.nlink >= MAX_LINKS {
            return err(
                FsErrorKind::TooManyLinks,
                format!("{} has {MAX_LINKS} links", l.fid),
            );
        }
        self.may_link(l.fid, who)?;
        let i = self.inodes.get_mut(&l.fid).expect("checked above");
        let mut all = linkings(i);
        if all.iter().any(|o| o.peer_req == l.peer_req) {
            return err(FsErrorKind::Exists, "this link is under way already");
        }
        all.push(l.clone());
        set_linkings(i, &all);
        set_elsewhere(i, elsewhere(i) + 1);
        i.nlink += 1;
        i.ctime = now;
        Ok(Applied {
            inode: Some(i.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Takes the record of link `peer_req` off `fid`, which is returned.
    fn end_linking(&mut self, fid: Fid, peer_req: ReqId) -> Result<&mut Inode> {
        let i = self.inodes.get_mut(&fid).ok_or_else(|| NsError {
            kind: FsErrorKind::Stale,
            what: format!("{fid} does not exist"),
        })?;
        let mut all = linkings(i);
        let before = all.len();
        all.retain(|l| l.peer_req != peer_req);
        if all.len() == before {
            return err(FsErrorKind::NotFound, "no such link under way");
        }
        set_linkings(i, &all);
        Ok(i)
    }

    /// The last step of a link to another MDT: named there, its record goes.
    pub(super) fn link_done(&mut self, fid: Fid, peer_req: ReqId) -> Result<Applied> {
        let i = self.end_linking(fid, peer_req)?;
        Ok(Applied {
            inode: Some(i.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// A link the other MDT refused: its record and its count go (and the file with them, if
    /// its other names went meanwhile).
    pub(super) fn link_abort(&mut self, fid: Fid, peer_req: ReqId, now: Time) -> Result<Applied> {
        let i = self.end_linking(fid, peer_req)?;
        set_elsewhere(i, elsewhere(i).saturating_sub(1));
        let removed = self.drop_link(fid, now);
        Ok(Applied {
            inode: self.inodes.get(&fid).filter(|i| i.nlink > 0).cloned(),
            removed: removed.into_iter().collect(),
            reserved: None,
        })
    }

    /// At the home: one of `fid`'s names on another MDT is gone.
    pub(super) fn drop_link_elsewhere(&mut self, fid: Fid, now: Time) -> Result<Applied> {
        let i = self.inodes.get_mut(&fid).ok_or_else(|| NsError {
            kind: FsErrorKind::Stale,
            what: format!("{fid} does not exist"),
        })?;
        let n = elsewhere(i);
        if n == 0 {
            return err(
                FsErrorKind::Invalid,
                format!("{fid} has no name on another MDT"),
            );
        }
        set_elsewhere(i, n - 1);
        let removed = self.drop_link(fid, now);
        Ok(Applied {
            inode: self.inodes.get(&fid).filter(|i| i.nlink > 0).cloned(),
            removed: removed.into_iter().collect(),
            reserved: None,
        })
    }

    /// The stub of `fid`, whose home counted its name gone, goes.
    pub(super) fn forget_dropped(&mut self, fid: Fid) -> Result<Applied> {
        if self
            .inodes
            .get(&fid)
            .is_some_and(|i| self.is_remote(fid) && dropping(i).is_some())
        {
            self.inodes.remove(&fid);
        }
        Ok(Applied {
            inode: None,
            removed: vec![],
            reserved: None,
        })
    }

    /// Step 2 of a move of directory `inode`, at its new name's MDT: named `name` in
    /// `parent`, replacing an empty directory there as a rename does. Its own MDT's, it is
    /// back home (its parent here); another MDT's, it is held as a stub, as a directory made
    /// there for a name here is. A stub here already is renamed within this MDT (its record
    /// of the move says so).
    fn dir_in(
        &mut self,
        parent: Fid,
        name: &[u8],
        inode: &Inode,
        noreplace: bool,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        let fid = inode.fid;
        let home = !self.is_remote(fid);
        if let Some(&v) = self.entries[&parent].get(name) {
            if v == fid {
                return Ok(Applied {
                    inode: Some(self.inode(v)?.clone()),
                    removed: vec![],
                    reserved: None,
                });
            }
        }
        if home {
            self.dir(fid)?;
            if !self.parents.get(&fid).is_some_and(|p| self.is_remote(*p)) {
                return err(
                    FsErrorKind::Invalid,
                    format!("{fid} is named on this MDT: a plain rename"),
                );
            }
        } else if let Some(stub) = self.inodes.get(&fid) {
            let here = moves(stub)
                .iter()
                .any(|m| m.new_parent == parent && m.new_name == name);
            if !here {
                return err(
                    FsErrorKind::CrossDevice,
                    format!("{fid} has a name on this MDT already"),
                );
            }
        }
        let mut removed = vec![];
        if let Some(&v) = self.entries[&parent].get(name) {
            if noreplace {
                return err(
                    FsErrorKind::Exists,
                    format!("{:?} exists", String::from_utf8_lossy(name)),
                );
            }
            self.not_moving(parent, name)?;
            let victim = self.inode(v)?.clone();
            if victim.kind != Kind::Dir {
                return err(FsErrorKind::NotDir, format!("{v} is not a directory"));
            }
            if self.is_remote(v) {
                // Its removal would be a third MDT's rmdir, not part of this rename.
                return err(
                    FsErrorKind::CrossDevice,
                    format!("{v} is a directory of another MDT: remove it first"),
                );
            }
            if !self.entries.get(&v).is_none_or(BTreeMap::is_empty) || striped_in_use(&victim) {
                return err(FsErrorKind::NotEmpty, format!("{v} is not empty"));
            }
            let p = self.inode(parent)?.clone();
            self.may_unlink(&p, &victim, who)?;
            if let Some(d) = self.entries.get_mut(&parent) {
                d.remove(name);
            }
            removed.extend(self.drop_link(v, now));
        }
        let named = if home {
            self.parents.insert(fid, parent);
            let i = self.inodes.get_mut(&fid).expect("checked");
            i.ctime = now;
            i.clone()
        } else if let Some(stub) = self.inodes.get(&fid) {
            stub.clone()
        } else {
            let stub = Inode {
                xattrs: BTreeMap::new(),
                ctime: now,
                ..inode.clone()
            };
            self.inodes.insert(fid, stub.clone());
            stub
        };
        self.entries
            .get_mut(&parent)
            .expect("checked: a directory")
            .insert(name.to_vec(), fid);
        if let Some(p) = self.inodes.get_mut(&parent) {
            p.nlink = p.nlink.saturating_add(1);
        }
        self.touch_dir(parent, now);
        Ok(Applied {
            inode: Some(named),
            removed,
            reserved: None,
        })
    }

    /// Step 3 of a move of directory `fid` (its old name gone already): its old parent counts
    /// it no more; this MDT's, its parent is the new one there; another MDT's, its stub goes,
    /// unless it was renamed within this MDT (named here still).
    fn dir_out(&mut self, fid: Fid, parent: Fid, m: &Moving, now: Time) -> Applied {
        if let Some(p) = self.inodes.get_mut(&parent) {
            p.nlink = p.nlink.saturating_sub(1);
        }
        let moved = if !self.is_remote(fid) {
            self.parents.insert(fid, m.new_parent);
            self.inodes.get(&fid).cloned()
        } else if self
            .entries
            .get(&m.new_parent)
            .and_then(|d| d.get(m.new_name.as_slice()))
            == Some(&fid)
        {
            let i = self.inodes.get_mut(&fid).expect("named");
            i.ctime = now;
            Some(i.clone())
        } else {
            self.inodes.remove(&fid)
        };
        Applied {
            inode: moved,
            removed: vec![],
            reserved: None,
        }
    }

    /// Directory `dir` of this MDT, named on another, is named on a third now: its parent is
    /// `parent` there.
    pub(super) fn reparent(&mut self, dir: Fid, parent: Fid, now: Time) -> Result<Applied> {
        self.local(dir)?;
        self.dir(dir)?;
        if !self.is_remote(parent) || !self.parents.get(&dir).is_some_and(|p| self.is_remote(*p)) {
            return err(
                FsErrorKind::Invalid,
                format!("{dir} is not named on another MDT, or {parent} is this MDT's"),
            );
        }
        self.parents.insert(dir, parent);
        let i = self.inodes.get_mut(&dir).expect("a directory");
        i.ctime = now;
        Ok(Applied {
            inode: Some(i.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Who holds the filesystem's rename lock (MDT0 keeps it): (MDT, the rename's number).
    pub fn rename_lock(&self) -> Option<(u32, ReqId)> {
        self.inodes
            .get(&self.root)
            .and_then(|r| r.xattrs.get(RENAME_LOCK))
            .and_then(|v| postcard::from_bytes(v).ok())
    }

    /// Takes the rename lock for MDT `holder`'s rename `key`, or lets it go (`None`).
    pub(super) fn set_rename_lock(&mut self, holder: u32, key: Option<ReqId>) -> Result<Applied> {
        if self.mdt() != 0 {
            return err(FsErrorKind::Invalid, "MDT0 keeps the rename lock");
        }
        let held = self.rename_lock();
        let root = self.root;
        let r = self.inodes.get_mut(&root).expect("the root");
        match (key, held) {
            (Some(_), Some((h, k))) if h != holder => {
                return err(
                    FsErrorKind::WouldBlock,
                    format!("MDT{h} is renaming a directory (rename {k:?})"),
                );
            }
            (Some(k), _) => {
                let v = proto::msg::encode(&(holder, k)).expect("a lock always encodes");
                r.xattrs.insert(RENAME_LOCK.to_string(), v);
            }
            (None, Some((h, _))) if h == holder => {
                r.xattrs.remove(RENAME_LOCK);
            }
            (None, _) => {}
        }
        Ok(Applied {
            inode: None,
            removed: vec![],
            reserved: None,
        })
    }

    /// The parent of directory `dir` of this MDT (here, or the MDT its name is on).
    pub fn parent_of(&self, dir: Fid) -> Option<Fid> {
        self.parents.get(&dir).copied()
    }
}
