//! Directories made or removed on another MDT from here: the parent's MDS records the change
//! on the parent ([`PLACING`]) before it asks the other MDT for its half, so that a crash of
//! either MDS, or of the client, ends it one way: the parent's MDS asks again after its
//! restart (numbered as the first time, so the other MDT carries it out once) and ends it as
//! the answer says. Meanwhile the name takes no other change.
//!
//! 1. the parent's MDT records the mkdir or rmdir: [`Mutation::PlaceOut`];
//! 2. the other MDT makes the directory ([`Mutation::MkdirForRemote`]) or removes it
//!    ([`Mutation::RmdirRemote`]), once however often asked;
//! 3. the name is added ([`Mutation::LinkRemoteDir`]) or removed ([`Mutation::PlaceDone`]),
//!    and the record goes with it; or, refused there, only the record goes
//!    ([`Mutation::PlaceAbort`]).

use super::*;
use proto::md::Placing;

/// On a directory: the mkdirs and rmdirs of its names on other MDTs under way (a list of
/// [`Placing`]).
pub const PLACING: &str = "lode.placing";

/// The changes of `dir`'s names on other MDTs under way.
pub fn placings(dir: &Inode) -> Vec<Placing> {
    super::moves::records(dir, PLACING)
}

fn set_placings(dir: &mut Inode, p: &[Placing]) {
    super::moves::set_records(dir, PLACING, p)
}

impl Namespace {
    /// Whether a mkdir or rmdir of `name` in `parent` on another MDT is under way.
    pub(super) fn is_placing(&self, parent: Fid, name: &[u8]) -> bool {
        self.inodes
            .get(&parent)
            .filter(|d| !d.xattrs.is_empty())
            .is_some_and(|d| placings(d).iter().any(|p| p.name == name))
    }

    /// The mkdirs and rmdirs on other MDTs under way here: (parent, placing).
    pub fn placing(&self) -> Vec<(Fid, Placing)> {
        let mut out: Vec<(Fid, Placing)> = self
            .inodes
            .values()
            .filter(|i| i.kind == Kind::Dir && !i.xattrs.is_empty())
            .flat_map(|d| placings(d).into_iter().map(|p| (d.fid, p)))
            .collect();
        out.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
        out
    }

    /// Step 1: checked for `who` as the mkdir or rmdir is, then recorded on `parent`.
    pub(super) fn place_out(&mut self, parent: Fid, p: &Placing, who: &Creds) -> Result<Applied> {
        check_name(&p.name)?;
        self.local(parent)?;
        match &*p.step {
            Mutation::MkdirForRemote {
                parent: at, name, ..
            } => {
                if *at != parent || *name != p.name || p.mdt == self.mdt() {
                    return err(
                        FsErrorKind::Invalid,
                        "a mkdir on another MDT that names another",
                    );
                }
                if self
                    .check_create(parent, &p.name, Kind::Dir, true, who)?
                    .is_some()
                {
                    return err(
                        FsErrorKind::Exists,
                        format!("{:?} exists", String::from_utf8_lossy(&p.name)),
                    );
                }
            }
            Mutation::RmdirRemote { fid } => {
                self.not_moving(parent, &p.name)?;
                let victim = self.lookup(parent, &p.name, who)?;
                if victim.fid != *fid || !self.is_remote(*fid) || victim.kind != Kind::Dir {
                    return err(
                        FsErrorKind::Invalid,
                        format!("{fid} is not the directory of another MDT named so"),
                    );
                }
                self.may_remove(parent, &p.name, who)?;
            }
            _ => return err(FsErrorKind::Invalid, "not a step of a mkdir or an rmdir"),
        }
        let d = self.inodes.get_mut(&parent).expect("checked: a directory");
        let mut all = placings(d);
        all.push(p.clone());
        set_placings(d, &all);
        Ok(Applied {
            inode: Some(d.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Takes the record of `name` off `parent`: the step that ends it applies next.
    pub(super) fn end_placing(&mut self, parent: Fid, name: &[u8]) -> Option<Placing> {
        let d = self.inodes.get_mut(&parent)?;
        let mut all = placings(d);
        let at = all.iter().position(|p| p.name == name)?;
        let p = all.remove(at);
        set_placings(d, &all);
        Some(p)
    }

    /// Step 3 of an rmdir: the other MDT removed the directory, and its name goes.
    pub(super) fn place_done(&mut self, parent: Fid, name: &[u8], now: Time) -> Result<Applied> {
        let recorded = self.inodes.get(&parent).and_then(|d| {
            placings(d).into_iter().find_map(|p| match *p.step {
                Mutation::RmdirRemote { fid } if p.name == name => Some(fid),
                _ => None,
            })
        });
        let named = self.entries.get(&parent).and_then(|d| d.get(name)).copied();
        if recorded.is_none() || recorded != named {
            return err(FsErrorKind::NotFound, "no such rmdir under way");
        }
        self.end_placing(parent, name);
        self.unlink(parent, name, true, &Creds::root(), now)
    }

    /// A mkdir or rmdir the other MDT refused: the name stays as it was.
    pub(super) fn place_abort(&mut self, parent: Fid, name: &[u8]) -> Result<Applied> {
        if self.end_placing(parent, name).is_none() {
            return err(FsErrorKind::NotFound, "no such mkdir or rmdir under way");
        }
        Ok(Applied {
            inode: self.inodes.get(&parent).cloned(),
            removed: vec![],
            reserved: None,
        })
    }
}
