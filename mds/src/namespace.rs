//! The namespace, as plain data and pure functions: inodes, directories, and every operation
//! that changes them. No I/O, no clock, no locks: a mutation carries its own timestamp, so
//! replaying the journal rebuilds exactly the same state.
//!
//! Every operation is checked in full before anything changes, so a failed operation changes
//! nothing. Errors are typed ([`FsErrorKind`]); the POSIX edges turn them into errno.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use concur::replies::ReplyCache;
use proto::layout::Layout;
use proto::{Fid, FsErrorKind};
use serde::{Deserialize, Serialize};

use crate::FastMap;

mod crypt;
mod hsm;
mod moves;
mod placing;
pub use moves::{elsewhere, DROPPING, ELSEWHERE, LINKING, MOVING};
pub use placing::PLACING;
use proto::md::new_inode;
pub use proto::md::{Creds, Inode, Kind, Mutation, RenameFlags, ReqId, SetAttr, Time};

/// The sequence new inodes are numbered in.
pub use proto::fid::INODE_SEQ;
/// The root directory's FID, as in Lustre.
pub use proto::fid::ROOT;
/// Longest name in a directory.
pub use proto::rules::MAX_NAME;
/// Longest symlink target.
pub const MAX_SYMLINK: usize = 4095;
/// Most hard links to one file.
pub const MAX_LINKS: u32 = 65_000;
/// Most user xattrs per inode, and their sizes.
pub const MAX_XATTRS: usize = 128;
pub const MAX_XATTR_NAME: usize = 255;
pub const MAX_XATTR_VALUE: usize = 64 << 10;
/// Bytes of names and values one inode's xattrs hold at most, checked as a client sets one (a
/// change already in the journal is not checked again).
pub const MAX_XATTR_BYTES: usize = 64 << 10;
pub use proto::md::MAX_FILE_SIZE;

pub use proto::rules::S_ISVTX;
const PERM_MASK: u32 = 0o7777;

/// What a mutation did, for the reply (and for the storage cleanup it implies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The inode created, linked or changed.
    pub inode: Option<Inode>,
    /// Inodes whose last link went away: their objects are to be destroyed.
    pub removed: Vec<Inode>,
    /// A reservation's first inode number.
    pub reserved: Option<u32>,
}

/// What a request will do, decided before anything is allocated for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A resend of a request already carried out: its first reply.
    Replied(Applied),
    /// `open(O_CREAT)` without `O_EXCL` of an existing file: it is opened, nothing changes.
    Opens(Inode),
    /// A change to apply.
    Applies,
}

/// What went wrong, and what it was about.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} ({kind:?})")]
pub struct NsError {
    pub kind: FsErrorKind,
    pub what: String,
}

impl NsError {
    /// The errno a POSIX caller sees for it.
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }
}

fn err<T>(kind: FsErrorKind, what: impl Into<String>) -> Result<T> {
    Err(NsError {
        kind,
        what: what.into(),
    })
}

type Result<T> = std::result::Result<T, NsError>;

/// A file kept with no name is released no sooner than this after its last change.
pub const RELEASE_AFTER_S: i64 = 5;

/// The whole namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    inodes: FastMap<Fid, Inode>,
    entries: FastMap<Fid, BTreeMap<Vec<u8>, Fid>>,
    /// Each directory's parent (the root is its own).
    parents: FastMap<Fid, Fid>,
    next_oid: u32,
    /// Objects of removed files, waiting to be destroyed: object -> (target, the file's FID).
    doomed: BTreeMap<Fid, (u32, Fid)>,
    /// The replies to clients' latest requests, so a resent request is answered, not redone.
    #[serde(with = "saved_replies")]
    replies: ReplyCache<Option<Inode>>,
    /// Truncates per file in this run, for size generations (not saved: a restart starts a
    /// new run of generations, see `Store::size_gen`).
    #[serde(skip)]
    truncates: Truncates,
    /// The bytes the MDS keeps of files with a Data-on-MDT component, up to their size (a
    /// file without an entry here reads as zeros there). Snapshots keep them after the rest
    /// ([`crate::journal`]), so a snapshot of the earlier format still reads.
    #[serde(skip)]
    mdt: HashMap<Fid, Vec<u8>>,
    /// Files kept with no name (nlink 0, no entry) for the handles that may hold them: files
    /// with a Data-on-MDT component removed while open (their bytes are here), and files made
    /// with no name (O_TMPFILE). When the MDS records one released, it goes and its objects
    /// join `doomed`. Not saved: they are the files with no link.
    #[serde(skip)]
    unlinked: BTreeSet<Fid>,
    /// The sequence new inodes are numbered in: the MDT's ([`proto::fid::inode_seq`]). Not
    /// saved: it is the MDT's identity's, which [`crate::journal::recover`] carries over.
    #[serde(skip, default = "mdt0_seq")]
    seq: u64,
    /// The MDT's root directory: the filesystem's on MDT0 ([`ROOT`]); on another MDT, the
    /// directory its own tree hangs from ([`proto::fid::mdt_root`]). Not saved, as `seq`.
    #[serde(skip, default = "mdt0_root")]
    root: Fid,
}

fn mdt0_root() -> Fid {
    ROOT
}

fn mdt0_seq() -> u64 {
    INODE_SEQ
}

/// Truncates per file. Not part of what a namespace holds, so not compared.
#[derive(Clone, Debug, Default)]
struct Truncates(HashMap<Fid, u64>);

impl PartialEq for Truncates {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Truncates {}

/// The reply cache as snapshots keep it: the map of each client's replies.
mod saved_replies {
    use std::collections::BTreeMap;

    use concur::replies::ReplyCache;
    use proto::md::Inode;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Each client's replies by request number. Written as a map, which postcard writes as a
    /// length and pairs: the same bytes as the list of (number, reply) kept before, so older
    /// snapshots load.
    type Saved = BTreeMap<u128, BTreeMap<u64, Option<Inode>>>;

    pub fn serialize<S: Serializer>(
        c: &ReplyCache<Option<Inode>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        c.clients().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<ReplyCache<Option<Inode>>, D::Error> {
        Saved::deserialize(d).map(ReplyCache::from_clients)
    }
}

/// Replies kept per client, and clients kept.
pub use concur::replies::{MAX_CLIENTS, MAX_REPLIES, REPLIES_PER_CLIENT};

/// Whether `name` may be a directory entry (the rule the client answers ahead by too).
///
/// A name of an encrypted directory (its ciphertext in base64url) may be longer: the
/// directory's own checks ([`Namespace::check_name_in`]) keep every other to [`MAX_NAME`].
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME && crypt::stored_name(name) {
        return Ok(());
    }
    proto::rules::check_name(name).map_err(|e| NsError {
        kind: e.kind(),
        what: e.to_string(),
    })
}

impl Default for Namespace {
    fn default() -> Self {
        Self::new(Time::default())
    }
}

impl Namespace {
    /// An empty namespace of MDT0: the root directory, owned by root, mode 0755.
    pub fn new(now: Time) -> Namespace {
        Self::for_mdt(0, now)
    }

    /// An empty namespace of MDT `mdt`, whose inodes are numbered in its sequence.
    pub fn for_mdt(mdt: u32, now: Time) -> Namespace {
        let root_fid = proto::fid::mdt_root(mdt);
        let root = Inode {
            fid: root_fid,
            kind: Kind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs: BTreeMap::new(),
            layout: None,
            target: vec![],
        };
        Namespace {
            inodes: FastMap::from_iter([(root_fid, root)]),
            entries: FastMap::from_iter([(root_fid, BTreeMap::new())]),
            parents: FastMap::from_iter([(root_fid, root_fid)]),
            next_oid: 1,
            doomed: BTreeMap::new(),
            replies: ReplyCache::default(),
            truncates: Truncates::default(),
            mdt: HashMap::new(),
            unlinked: BTreeSet::new(),
            seq: proto::fid::inode_seq(mdt),
            root: root_fid,
        }
    }

    /// The sequence this namespace numbers its inodes in.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The MDT this namespace is.
    pub fn mdt(&self) -> u32 {
        (self.seq - INODE_SEQ) as u32
    }

    /// Whether `fid` is an inode of another MDT (held here, if at all, as the entry that names
    /// a directory there: a remote directory's stub).
    pub fn is_remote(&self, fid: Fid) -> bool {
        proto::fid::mdt_of(fid).is_some_and(|k| k != self.mdt())
    }

    /// Refuses a change to `fid` when another MDT holds it: its MDS is the one to ask.
    fn local(&self, fid: Fid) -> Result<()> {
        if self.is_remote(fid) {
            return err(
                FsErrorKind::CrossDevice,
                format!(
                    "{fid} is held by MDT{}, not MDT{}",
                    proto::fid::mdt_of(fid).unwrap_or(0),
                    self.mdt()
                ),
            );
        }
        Ok(())
    }

    /// Makes directory `name` of `parent`, a directory of another MDT, here: its inode and
    /// (empty) entries, with `parent` recorded as its parent.
    #[allow(clippy::too_many_arguments)] // the fields of one Mutation::MkdirForRemote
    fn mkdir_for_remote(
        &mut self,
        parent: Fid,
        name: &[u8],
        mode: u32,
        gid: u32,
        layout: Option<Layout>,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        check_name(name)?;
        if !self.is_remote(parent) {
            return err(
                FsErrorKind::Invalid,
                format!("{parent} is a directory of this MDT: a mkdir there is a plain one"),
            );
        }
        check_new_inode(Kind::Dir, &[], layout.as_ref())?;
        let oid = self.next_oid;
        let Some(next) = oid.checked_add(1) else {
            return err(FsErrorKind::NoSpace, "inode numbers are exhausted");
        };
        let fid = Fid::new(self.seq, oid, 0);
        let inode = Inode {
            fid,
            kind: Kind::Dir,
            mode: mode & PERM_MASK,
            uid: who.uid,
            gid,
            nlink: 2,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs: BTreeMap::new(),
            layout,
            target: vec![],
        };
        self.next_oid = next;
        self.entries.insert(fid, BTreeMap::new());
        self.parents.insert(fid, parent);
        self.inodes.insert(fid, inode.clone());
        Ok(Applied {
            inode: Some(inode),
            removed: vec![],
            reserved: None,
        })
    }

    /// Names `inode`, a directory another MDT holds, `name` in `parent`: the entry, and the
    /// directory's attributes as it was made (its stub).
    fn link_remote_dir(
        &mut self,
        parent: Fid,
        name: &[u8],
        inode: &Inode,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        if !self.is_remote(inode.fid) || inode.kind != Kind::Dir {
            return err(
                FsErrorKind::Invalid,
                format!("{} is no directory of another MDT", inode.fid),
            );
        }
        if self.inodes.contains_key(&inode.fid) {
            return err(
                FsErrorKind::Exists,
                format!("{} is named already", inode.fid),
            );
        }
        // Checked as a create is, the mkdir recorded for this name aside: it ends here.
        check_name(name)?;
        self.dir(parent)?;
        self.check_shard(parent, name, true)?;
        if self.entries[&parent].contains_key(name) {
            return err(
                FsErrorKind::Exists,
                format!("{:?} exists", String::from_utf8_lossy(name)),
            );
        }
        self.require(parent, who, 3)?;
        self.end_placing(parent, name);
        let stub = Inode {
            xattrs: BTreeMap::new(),
            ..inode.clone()
        };
        self.entries
            .get_mut(&parent)
            .expect("checked: a directory")
            .insert(name.to_vec(), stub.fid);
        self.inodes.insert(stub.fid, stub.clone());
        if let Some(p) = self.inodes.get_mut(&parent) {
            p.nlink = p.nlink.saturating_add(1);
        }
        self.touch_dir(parent, now);
        Ok(Applied {
            inode: Some(stub),
            removed: vec![],
            reserved: None,
        })
    }

    /// Entries naming another MDT's directories: (directory here, name, that directory). Names
    /// of other MDTs' files are checked with their homes' counts ([`Namespace::remote_files`]).
    pub fn remote_entries(&self) -> Vec<(Fid, Vec<u8>, Fid)> {
        let mut out = vec![];
        for (dir, d) in &self.entries {
            for (name, f) in d {
                let dir_there = self.inodes.get(f).is_some_and(|i| i.kind == Kind::Dir);
                if self.is_remote(*f) && dir_there {
                    out.push((*dir, name.clone(), *f));
                }
            }
        }
        out.sort();
        out
    }

    /// The parent of directory `dir` here when it is another MDT's (`dir` was placed here
    /// from there); `None` otherwise.
    pub fn remote_parent_of(&self, dir: Fid) -> Option<Fid> {
        self.parents
            .get(&dir)
            .copied()
            .filter(|p| dir != self.root && self.is_remote(*p))
    }

    /// Directories here whose parent is on another MDT: (directory, parent, its entries).
    pub fn remote_parented(&self) -> Vec<(Fid, Fid, usize)> {
        let mut out: Vec<(Fid, Fid, usize)> = self
            .parents
            .iter()
            .filter(|(d, p)| **d != self.root && self.is_remote(**p))
            .map(|(d, p)| (*d, *p, self.entries.get(d).map_or(0, BTreeMap::len)))
            .collect();
        out.sort();
        out
    }

    /// The parent of directory `dir` when it lives on another MDT (`dir` was placed here from
    /// there), checked as a lookup of `..` in `dir` by `who` is; `None` when it is here.
    pub fn remote_parent(&self, dir: Fid, who: &Creds) -> Result<Option<Fid>> {
        self.dir(dir)?;
        self.require(dir, who, 1)?;
        Ok(self
            .parents
            .get(&dir)
            .copied()
            .filter(|p| self.is_remote(*p)))
    }

    /// Whether `who` may remove the entry `name` of `parent` (the checks of an unlink, without
    /// the change).
    pub fn may_remove(&self, parent: Fid, name: &[u8], who: &Creds) -> Result<()> {
        let victim = self.lookup(parent, name, who)?;
        let p = self.inode(parent)?;
        self.may_unlink(p, victim, who)
    }

    /// Removes `fid`, a directory here whose name lives on another MDT, if it is empty.
    fn rmdir_remote(&mut self, fid: Fid) -> Result<Applied> {
        self.local(fid)?;
        let Some(d) = self.entries.get(&fid) else {
            self.inode(fid)?;
            return err(FsErrorKind::NotDir, format!("{fid} is not a directory"));
        };
        if !self.parents.get(&fid).is_some_and(|p| self.is_remote(*p)) {
            return err(
                FsErrorKind::Invalid,
                format!("{fid} is named on this MDT: an rmdir of it is a plain one"),
            );
        }
        if !d.is_empty() {
            return err(FsErrorKind::NotEmpty, format!("{fid} is not empty"));
        }
        self.entries.remove(&fid);
        self.parents.remove(&fid);
        let gone = self.inodes.remove(&fid);
        Ok(Applied {
            inode: None,
            removed: gone.into_iter().collect(),
            reserved: None,
        })
    }

    /// Refuses `name` in `dir` where it does not live: `dir` a striped directory's master
    /// (its names are in its shards) or a shard the name does not hash to; with `adding`, a
    /// shard an rmdir of its directory has frozen too. The caller reads the layout again
    /// and goes to the right shard.
    fn check_shard(&self, dir: Fid, name: &[u8], adding: bool) -> Result<()> {
        let Some(d) = self.inodes.get(&dir).filter(|d| !d.xattrs.is_empty()) else {
            return Ok(());
        };
        if let Some(s) = proto::dirstripe::of_inode(d) {
            return err(
                FsErrorKind::WrongShard,
                format!(
                    "{dir} is striped over {} shards: {:?} lives in shard {:?}",
                    s.count,
                    String::from_utf8_lossy(name),
                    s.shard_index(name)
                ),
            );
        }
        if let Some(s) = proto::dirstripe::shard_of_inode(d) {
            if !s.holds(name) {
                return err(
                    FsErrorKind::WrongShard,
                    format!(
                        "{:?} is not in shard {} of {}",
                        String::from_utf8_lossy(name),
                        s.index,
                        s.master
                    ),
                );
            }
            if adding && s.frozen {
                return err(
                    FsErrorKind::WrongShard,
                    format!("{dir}, a shard of {}, is frozen by an rmdir", s.master),
                );
            }
        }
        Ok(())
    }

    /// Makes the striped directory `name` in `parent`: its master, with the layout to be
    /// filled in as its shards are made.
    #[allow(clippy::too_many_arguments)] // the fields of one Mutation::MkdirStriped
    fn mkdir_striped(
        &mut self,
        parent: Fid,
        name: &[u8],
        mode: u32,
        count: u32,
        offset: Option<u32>,
        hash: u32,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        if proto::dirstripe::HashType::from_code(hash).is_none() {
            return err(
                FsErrorKind::Invalid,
                format!("no directory hash numbered {hash}"),
            );
        }
        if !(2..=proto::dirstripe::MAX_DIR_STRIPES).contains(&count) {
            return err(
                FsErrorKind::Invalid,
                format!(
                    "a striped directory has 2 to {} shards, not {count}",
                    proto::dirstripe::MAX_DIR_STRIPES
                ),
            );
        }
        let stripe = proto::dirstripe::DirStripe {
            hash,
            count,
            offset: offset.unwrap_or(self.mdt()),
            shards: vec![],
            state: proto::dirstripe::StripeState::Building,
        };
        let mut a = self.create(
            None,
            parent,
            name,
            Kind::Dir,
            mode,
            true,
            &[],
            None,
            who,
            now,
        )?;
        if let Some(made) = a.inode.as_mut() {
            made.xattrs
                .insert(proto::dirstripe::LMV_XATTR.to_string(), stripe.encode());
            self.inodes.insert(made.fid, made.clone());
        }
        Ok(a)
    }

    /// The shard `index` of striped directory `master` made here, if it is.
    fn shard_here(&self, master: Fid, index: u32) -> Option<Fid> {
        self.parents
            .iter()
            .filter(|(_, p)| **p == master)
            .map(|(d, _)| *d)
            .find(|d| {
                self.inodes
                    .get(d)
                    .and_then(proto::dirstripe::shard_of_inode)
                    .is_some_and(|s| s.master == master && s.index == index)
            })
    }

    /// Makes a shard of a striped directory here, or answers the one made already.
    fn make_shard(
        &mut self,
        shard: &proto::dirstripe::ShardOf,
        mode: u32,
        uid: u32,
        gid: u32,
        layout: Option<Layout>,
        now: Time,
    ) -> Result<Applied> {
        if let Some(made) = self.shard_here(shard.master, shard.index) {
            return Ok(Applied {
                inode: Some(self.inode(made)?.clone()),
                removed: vec![],
                reserved: None,
            });
        }
        if proto::dirstripe::shard_index(shard.hash, shard.count, b"").is_none()
            || shard.index >= shard.count
            || shard.frozen
        {
            return err(
                FsErrorKind::Invalid,
                format!(
                    "no shard {} of {} under hash {}",
                    shard.index, shard.count, shard.hash
                ),
            );
        }
        if !self.is_remote(shard.master) && self.dir(shard.master).is_err() {
            return err(
                FsErrorKind::Stale,
                format!("{} is no directory here", shard.master),
            );
        }
        check_new_inode(Kind::Dir, &[], layout.as_ref())?;
        let oid = self.next_oid;
        let Some(next) = oid.checked_add(1) else {
            return err(FsErrorKind::NoSpace, "inode numbers are exhausted");
        };
        let fid = Fid::new(self.seq, oid, 0);
        let mut xattrs = BTreeMap::new();
        xattrs.insert(proto::dirstripe::SHARD_XATTR.to_string(), shard.encode());
        let inode = Inode {
            fid,
            kind: Kind::Dir,
            mode: mode & PERM_MASK,
            uid,
            gid,
            nlink: 2,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs,
            layout,
            target: vec![],
        };
        self.next_oid = next;
        self.entries.insert(fid, BTreeMap::new());
        self.parents.insert(fid, shard.master);
        self.inodes.insert(fid, inode.clone());
        Ok(Applied {
            inode: Some(inode),
            removed: vec![],
            reserved: None,
        })
    }

    /// Sets the layout of `fid`, a striped directory here.
    fn set_dir_stripe(
        &mut self,
        fid: Fid,
        stripe: &proto::dirstripe::DirStripe,
        now: Time,
    ) -> Result<Applied> {
        self.local(fid)?;
        self.dir(fid)?;
        let i = self.inodes.get_mut(&fid).expect("checked: a directory");
        if proto::dirstripe::of_inode(i).is_none() {
            return err(FsErrorKind::Invalid, format!("{fid} is not striped"));
        }
        i.xattrs
            .insert(proto::dirstripe::LMV_XATTR.to_string(), stripe.encode());
        i.ctime = now;
        Ok(Applied {
            inode: Some(i.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Freezes (refused when it has an entry) or thaws `fid`, a shard here.
    fn freeze_shard(&mut self, fid: Fid, frozen: bool) -> Result<Applied> {
        self.local(fid)?;
        let d = self.dir(fid)?;
        if frozen && !d.is_empty() {
            return err(FsErrorKind::NotEmpty, format!("{fid} is not empty"));
        }
        let i = self.inodes.get_mut(&fid).expect("checked: a directory");
        let Some(mut s) = proto::dirstripe::shard_of_inode(i) else {
            return err(FsErrorKind::Invalid, format!("{fid} is no shard"));
        };
        s.frozen = frozen;
        i.xattrs
            .insert(proto::dirstripe::SHARD_XATTR.to_string(), s.encode());
        Ok(Applied {
            inode: Some(i.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Removes `fid`, a frozen, empty shard here (gone already: nothing to do).
    fn rmdir_shard(&mut self, fid: Fid) -> Result<Applied> {
        self.local(fid)?;
        let Some(i) = self.inodes.get(&fid) else {
            return Ok(Applied {
                inode: None,
                removed: vec![],
                reserved: None,
            });
        };
        if !proto::dirstripe::shard_of_inode(i).is_some_and(|s| s.frozen) {
            return err(
                FsErrorKind::Invalid,
                format!("{fid} is no shard frozen for removal"),
            );
        }
        if !self.dir(fid)?.is_empty() {
            return err(FsErrorKind::NotEmpty, format!("{fid} is not empty"));
        }
        self.entries.remove(&fid);
        self.parents.remove(&fid);
        self.inodes.remove(&fid);
        Ok(Applied {
            inode: None,
            removed: vec![],
            reserved: None,
        })
    }

    /// The parent and name of directory `dir`, when it is named here.
    pub fn name_of_dir(&self, dir: Fid) -> Option<(Fid, Vec<u8>)> {
        let parent = *self.parents.get(&dir)?;
        let d = self.entries.get(&parent)?;
        d.iter()
            .find(|(_, f)| **f == dir)
            .map(|(n, _)| (parent, n.clone()))
    }

    /// Every shard here of a striped directory: (shard, its place, its entries).
    pub fn shards(&self) -> Vec<(Fid, proto::dirstripe::ShardOf, usize)> {
        let mut out: Vec<_> = self
            .inodes
            .values()
            .filter(|i| i.kind == Kind::Dir && !i.xattrs.is_empty() && !self.is_remote(i.fid))
            .filter_map(|i| {
                proto::dirstripe::shard_of_inode(i)
                    .map(|s| (i.fid, s, self.entries.get(&i.fid).map_or(0, BTreeMap::len)))
            })
            .collect();
        out.sort_by_key(|(f, ..)| *f);
        out
    }

    /// Every striped directory here, with its layout.
    pub fn striped(&self) -> Vec<(Fid, proto::dirstripe::DirStripe)> {
        let mut out: Vec<_> = self
            .inodes
            .values()
            .filter(|i| i.kind == Kind::Dir && !i.xattrs.is_empty() && !self.is_remote(i.fid))
            .filter_map(|i| proto::dirstripe::of_inode(i).map(|s| (i.fid, s)))
            .collect();
        out.sort_by_key(|(f, _)| *f);
        out
    }

    /// Striped directories here whose shards are being made or removed: the work their MDS
    /// finishes after a restart.
    pub fn unsettled_stripes(&self) -> Vec<(Fid, proto::dirstripe::DirStripe)> {
        let mut out: Vec<_> = self
            .inodes
            .values()
            .filter(|i| i.kind == Kind::Dir && !i.xattrs.is_empty())
            .filter_map(|i| proto::dirstripe::of_inode(i).map(|s| (i.fid, s)))
            .filter(|(_, s)| s.state != proto::dirstripe::StripeState::Ready)
            .collect();
        out.sort_by_key(|(f, _)| *f);
        out
    }

    /// The MDT's root directory.
    pub fn root(&self) -> Fid {
        self.root
    }

    /// Numbers new inodes in sequence `seq` under root `root`, an MDT's (a namespace read
    /// back from a snapshot gets them from its MDT's identity).
    pub fn belong_to(&mut self, (seq, root): (u64, Fid)) {
        self.seq = seq;
        self.root = root;
    }

    /// The inode number the next create takes.
    pub fn next_inode(&self) -> u32 {
        self.next_oid
    }

    pub fn inode(&self, fid: Fid) -> Result<&Inode> {
        match self.inodes.get(&fid) {
            Some(i) => Ok(i),
            None => err(FsErrorKind::Stale, format!("{fid} does not exist")),
        }
    }

    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty()
    }

    /// The path of directory `dir` from the root, for the audit log (`None` for what is not a
    /// directory). Each step finds the directory's name among its parent's entries.
    pub fn dir_path(&self, dir: Fid) -> Option<String> {
        let mut names = vec![];
        let mut at = dir;
        while at != self.root {
            let parent = *self.parents.get(&at)?;
            let (name, _) = self.entries.get(&parent)?.iter().find(|(_, f)| **f == at)?;
            names.push(String::from_utf8_lossy(name).into_owned());
            at = parent;
            if names.len() > 4096 {
                return None;
            }
        }
        names.reverse();
        Some(format!("/{}", names.join("/")))
    }

    fn dir(&self, fid: Fid) -> Result<&BTreeMap<Vec<u8>, Fid>> {
        self.inode(fid)?;
        match self.entries.get(&fid) {
            Some(d) => Ok(d),
            None => err(FsErrorKind::NotDir, format!("{fid} is not a directory")),
        }
    }

    /// Whether `who` may access `inode` for `want` (bits of rwx: 4, 2, 1).
    pub fn permits(inode: &Inode, who: &Creds, want: u32) -> bool {
        inode.permits(who, want)
    }

    fn require(&self, fid: Fid, who: &Creds, want: u32) -> Result<&Inode> {
        let inode = self.inode(fid)?;
        if Self::permits(inode, who, want) {
            Ok(inode)
        } else {
            err(
                FsErrorKind::AccessDenied,
                format!("permission denied on {fid}"),
            )
        }
    }

    /// The inodes whose attributes or entries `m` would change if applied now: leases on them
    /// are recalled first.
    pub fn touched(&self, m: &Mutation) -> Vec<Fid> {
        let t = m.touches();
        let mut out = t.inodes;
        for (parent, name) in &t.entries {
            out.push(*parent);
            if t.replaces {
                out.extend(self.entries.get(parent).and_then(|d| d.get(*name)).copied());
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The entry `name` in `parent`.
    pub fn lookup(&self, parent: Fid, name: &[u8], who: &Creds) -> Result<&Inode> {
        self.dir(parent)?;
        self.require(parent, who, 1)?;
        if name == b"." {
            return self.inode(parent);
        }
        if name == b".." {
            return self.inode(self.parents[&parent]);
        }
        check_name(name)?;
        self.check_shard(parent, name, false)?;
        match self.entries[&parent].get(name) {
            Some(f) => self.inode(*f),
            None => err(
                FsErrorKind::NotFound,
                format!("no entry {:?}", String::from_utf8_lossy(name)),
            ),
        }
    }

    /// Up to `max` entries of `dir` after `after` (a name from an earlier page), in name order.
    /// Resuming from a name stays valid however the directory changes meanwhile: no entry
    /// present throughout is skipped or repeated.
    pub fn readdir(
        &self,
        dir: Fid,
        after: Option<&[u8]>,
        max: usize,
        who: &Creds,
    ) -> Result<Vec<(Vec<u8>, Fid, Kind)>> {
        Ok(self
            .entries_after(dir, after, who)?
            .take(max)
            .map(|(n, f)| (n.clone(), *f, self.inodes[f].kind))
            .collect())
    }

    /// The entries of `dir` after `after` in name order, once `who` may read it.
    fn entries_after<'a>(
        &'a self,
        dir: Fid,
        after: Option<&[u8]>,
        who: &Creds,
    ) -> Result<std::collections::btree_map::Range<'a, Vec<u8>, Fid>> {
        let d = self.dir(dir)?;
        self.require(dir, who, 4)?;
        if let Some(s) = self.inodes.get(&dir).and_then(proto::dirstripe::of_inode) {
            return err(
                FsErrorKind::WrongShard,
                format!("{dir} is striped over {} shards: list each", s.count),
            );
        }
        Ok(match after {
            Some(a) => {
                d.range::<[u8], _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
            }
            None => d.range::<[u8], _>(..),
        })
    }

    /// How many entries directory `dir` has (`None` where it is not a directory).
    pub fn entry_count(&self, dir: Fid) -> Option<usize> {
        self.entries.get(&dir).map(BTreeMap::len)
    }

    /// As [`Namespace::readdir`], each entry with its inode (one lookup per entry: a listing
    /// with attributes reads each inode once).
    pub fn readdir_inodes(
        &self,
        dir: Fid,
        after: Option<&[u8]>,
        max: usize,
        who: &Creds,
    ) -> Result<Vec<(&[u8], &Inode)>> {
        Ok(self
            .entries_after(dir, after, who)?
            .take(max)
            .map(|(n, f)| (n.as_slice(), &self.inodes[f]))
            .collect())
    }

    /// Whether `dir` is `ancestor` or lies below it.
    fn is_within(&self, mut dir: Fid, ancestor: Fid) -> bool {
        loop {
            if dir == ancestor {
                return true;
            }
            // A directory named on another MDT: its ancestors there are none of this MDT's.
            let Some(&up) = self.parents.get(&dir) else {
                return false;
            };
            if up == dir {
                return false;
            }
            dir = up;
        }
    }

    /// Whether the entry `name` of `parent` names another MDT's file (removing it leaves a
    /// report to that MDT to make).
    pub fn names_remote_file(&self, parent: Fid, name: &[u8]) -> bool {
        self.entries
            .get(&parent)
            .and_then(|d| d.get(name))
            .and_then(|f| self.inodes.get(f))
            .is_some_and(|i| i.kind != Kind::Dir && self.is_remote(i.fid))
    }

    /// Whether `who` may remove or replace the entry for `victim` in `parent` (the rule the
    /// client answers ahead by too).
    fn may_unlink(&self, parent: &Inode, victim: &Inode, who: &Creds) -> Result<()> {
        proto::rules::may_unlink(parent, victim, who).map_err(|e| NsError {
            kind: e.kind(),
            what: e.to_string(),
        })
    }

    /// Forgets the replies to `client`'s requests numbered below `below` (it had them).
    pub fn forget_replies(&mut self, client: u128, below: u64) {
        self.replies.forget_below(client, below);
    }

    /// Whether request `req` is a stale copy of one its client already had the reply to.
    pub fn stale_request(&self, req: ReqId) -> bool {
        self.replies.is_stale(req.client, req.seq)
    }

    /// Replies kept for resends, in all.
    pub fn replies_kept(&self) -> usize {
        self.replies.len()
    }

    /// The replies kept and the bytes they come to as saved (what they weigh in a snapshot;
    /// in memory they weigh about as much again). Walks them all: for tests and reports.
    pub fn replies_weight(&self) -> (usize, usize) {
        let bytes = self
            .replies
            .clients()
            .values()
            .flat_map(|r| r.values())
            .map(|v| postcard::to_allocvec(v).map_or(0, |b| b.len()) + 24)
            .sum();
        (self.replies.len(), bytes)
    }

    /// The reply already given to request `req`, if it was carried out.
    pub fn replied(&self, req: ReqId) -> Option<Applied> {
        let mut inode = self.replies.get(req.client, req.seq)?.clone();
        // Kept without its xattrs (a reply must not cost the MDS what the inode's xattrs
        // weigh): they are the inode's as it is now.
        if let Some(i) = inode.as_mut() {
            if let Some(now) = self.inodes.get(&i.fid) {
                i.xattrs = now.xattrs.clone();
            }
        }
        Some(Applied {
            inode,
            removed: vec![],
            reserved: None,
        })
    }

    /// Linux's protected hard links: a name for someone else's file only for whom may read
    /// and write it (a link would outlive the owner's removal of it, and keep its data
    /// reachable).
    pub(super) fn may_link(&self, fid: Fid, who: &Creds) -> Result<()> {
        let i = self.inode(fid)?;
        if who.uid != 0 && who.uid != i.uid && !i.permits(who, 6) {
            return err(
                FsErrorKind::NotPermitted,
                format!("{fid} is another user's file, which the caller may not read and write"),
            );
        }
        Ok(())
    }

    /// What request `req` will do, decided before anything is allocated for it: answered as
    /// before (a resend), an existing file opened (`open(O_CREAT)` without `O_EXCL`: nothing to
    /// change), or a change to apply. A create that cannot succeed fails here. This is the one
    /// place the reply cache is consulted; [`Namespace::apply_request`] guards only against a
    /// resend carried out in between.
    pub fn decide(&self, m: &Mutation, who: &Creds, req: Option<ReqId>) -> Result<Decision> {
        if let Some(done) = req.and_then(|r| self.replied(r)) {
            return Ok(Decision::Replied(done));
        }
        match m {
            Mutation::Create {
                parent,
                name,
                kind,
                exclusive,
                ..
            } => {
                if let Some(existing) = self.check_create(*parent, name, *kind, *exclusive, who)? {
                    return Ok(Decision::Opens(existing.clone()));
                }
            }
            Mutation::CreateAt {
                fid,
                parent,
                name,
                kind,
                ..
            } => {
                self.check_create(*parent, name, *kind, true, who)?;
                self.check_reserved(*fid)?;
            }
            Mutation::MkdirOn { parent, .. } | Mutation::MkdirStriped { parent, .. }
                if self.inode(*parent).is_ok_and(proto::crypt::is_encrypted) =>
            {
                return err(
                    FsErrorKind::NotSupported,
                    "an encrypted directory's subdirectories stay on its MDT, unstriped",
                );
            }
            // Checked in full before the other MDT is asked to make anything.
            Mutation::MkdirOn {
                parent, name, mdt, ..
            } => {
                if *mdt >= proto::fid::MAX_MDTS {
                    return err(
                        FsErrorKind::Invalid,
                        format!("MDT{mdt} is past the most a filesystem has"),
                    );
                }
                self.local(*parent)?;
                self.check_create(*parent, name, Kind::Dir, true, who)?;
            }
            // Linux's protected hard links: a name for someone else's file only for whom
            // may read and write it (a link would outlive the owner's removal of it, and
            // keep its data reachable).
            Mutation::Link { fid, .. } => self.may_link(*fid, who)?,
            Mutation::SetXattr { fid, name, value }
            | Mutation::SetXattrIf {
                fid, name, value, ..
            } => {
                let i = self.inode(*fid)?;
                let others: usize = i
                    .xattrs
                    .iter()
                    .filter(|(n, _)| *n != name)
                    .map(|(n, v)| n.len() + v.len())
                    .sum();
                if others + name.len() + value.len() > MAX_XATTR_BYTES {
                    return err(
                        FsErrorKind::NoSpace,
                        format!("an inode's xattrs hold at most {MAX_XATTR_BYTES} bytes"),
                    );
                }
            }
            _ => {}
        }
        Ok(Decision::Applies)
    }

    /// Applies a client's request once. Returns what it did, and whether it was carried out
    /// now (false: a resend of a request already carried out, answered as then).
    pub fn apply_request(
        &mut self,
        m: &Mutation,
        who: &Creds,
        now: Time,
        req: Option<ReqId>,
    ) -> Result<(Applied, bool)> {
        if let Some(done) = req.and_then(|r| self.replied(r)) {
            return Ok((done, false));
        }
        // A copy decided before its twin was carried out and its client moved on (and said
        // so): its reply may be forgotten, and it must not be carried out a second time.
        if req.is_some_and(|r| self.stale_request(r)) {
            return err(
                FsErrorKind::Stale,
                "a stale copy of a request already answered",
            );
        }
        let applied = self.apply(m, who, now)?;
        if let Some(r) = req {
            let kept = applied.inode.as_ref().map(|i| Inode {
                xattrs: Default::default(),
                ..i.clone()
            });
            self.replies.record(r.client, r.seq, kept);
        }
        Ok((applied, true))
    }

    /// Checks and applies one mutation by `who` at time `now`; on error nothing changed.
    pub fn apply(&mut self, m: &Mutation, who: &Creds, now: Time) -> Result<Applied> {
        // What another MDT holds is changed there, and only its entries here.
        for fid in m.touches().inodes {
            self.local(fid)?;
        }
        let dirty = self.hsm_before(m)?;
        let applied = self.apply_checked(m, who, now)?;
        if let Some(fid) = dirty {
            self.hsm_dirty(fid);
        }
        Ok(applied)
    }

    fn apply_checked(&mut self, m: &Mutation, who: &Creds, now: Time) -> Result<Applied> {
        match m {
            Mutation::Create {
                parent,
                name,
                kind,
                mode,
                exclusive,
                target,
                layout,
            } => self.create(
                None,
                *parent,
                name,
                *kind,
                *mode,
                *exclusive,
                target,
                layout.clone(),
                who,
                now,
            ),
            Mutation::CreateAt {
                fid,
                parent,
                name,
                kind,
                mode,
                target,
                layout,
            } => self.create(
                Some(*fid),
                *parent,
                name,
                *kind,
                *mode,
                true,
                target,
                layout.clone(),
                who,
                now,
            ),
            Mutation::CreateUnnamed {
                parent,
                mode,
                layout,
            } => self.create_unnamed(*parent, *mode, layout.clone(), who, now),
            Mutation::ReserveInodes { count } => {
                let first = self.next_oid;
                let Some(next) = first.checked_add(*count) else {
                    return err(FsErrorKind::NoSpace, "inode numbers are exhausted");
                };
                self.next_oid = next;
                Ok(Applied {
                    inode: None,
                    removed: vec![],
                    reserved: Some(first),
                })
            }
            Mutation::Link { fid, parent, name } => self.link(*fid, *parent, name, who, now),
            Mutation::Unlink { parent, name, dir } => self.unlink(*parent, name, *dir, who, now),
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => self.rename(*parent, name, *new_parent, new_name, *flags, who, now),
            Mutation::Setattr { fid, attr } => {
                let done = self.setattr(*fid, attr, who, now)?;
                if attr.size.is_some() {
                    *self.truncates.0.entry(*fid).or_default() += 1;
                }
                Ok(done)
            }
            Mutation::SetXattr { fid, name, value } => {
                self.set_xattr(*fid, name, Some(value), None, who, now)
            }
            Mutation::SetXattrIf {
                fid,
                name,
                value,
                replace,
            } => self.set_xattr(*fid, name, Some(value), Some(*replace), who, now),
            Mutation::RemoveXattr { fid, name } => self.set_xattr(*fid, name, None, None, who, now),
            Mutation::GrowSize { fid, size } => self.grow_size(*fid, *size, who, now),
            Mutation::WriteMdt { fid, offset, data } => {
                self.write_mdt(*fid, *offset, data, who, now)
            }
            Mutation::SetLayout { fid, layout } => self.set_layout(*fid, layout, who, now),
            Mutation::MirrorState {
                fid,
                mirror,
                stale,
                generation,
            } => self.mirror_state(*fid, *mirror, *stale, *generation, who, now),
            Mutation::PlaceMirror {
                fid,
                mirror,
                generation,
                components,
                ..
            } => self.place_mirror(*fid, *mirror, *generation, components, who, now),
            Mutation::Destroyed { objects } => {
                for o in objects {
                    self.doomed.remove(&o.fid);
                }
                Ok(Applied {
                    inode: None,
                    removed: vec![],
                    reserved: None,
                })
            }
            Mutation::Released { fids } => {
                for f in fids {
                    if self.unlinked.remove(f) {
                        self.mdt.remove(f);
                        if let Some(gone) = self.inodes.remove(f) {
                            self.doom(&gone);
                        }
                    }
                }
                Ok(Applied {
                    inode: None,
                    removed: vec![],
                    reserved: None,
                })
            }
            Mutation::MkdirOn { .. } => err(
                FsErrorKind::Invalid,
                "a mkdir on another MDT is carried out by the parent's MDS, not applied as such",
            ),
            Mutation::MkdirForRemote {
                parent,
                name,
                mode,
                gid,
                layout,
            } => self.mkdir_for_remote(*parent, name, *mode, *gid, layout.clone(), who, now),
            Mutation::LinkRemoteDir {
                parent,
                name,
                inode,
            } => self.link_remote_dir(*parent, name, inode, who, now),
            Mutation::RmdirRemote { fid } => self.rmdir_remote(*fid),
            Mutation::MkdirStriped {
                parent,
                name,
                mode,
                count,
                offset,
                hash,
            } => self.mkdir_striped(*parent, name, *mode, *count, *offset, *hash, who, now),
            Mutation::MakeShard {
                shard,
                mode,
                uid,
                gid,
                layout,
            } => self.make_shard(shard, *mode, *uid, *gid, layout.clone(), now),
            Mutation::SetDirStripe { fid, stripe } => self.set_dir_stripe(*fid, stripe, now),
            Mutation::FreezeShard { fid, frozen } => self.freeze_shard(*fid, *frozen),
            Mutation::RmdirShard { fid } => self.rmdir_shard(*fid),
            Mutation::MoveOut { moving } => self.move_out(moving, who),
            Mutation::LinkIn {
                parent,
                name,
                inode,
                noreplace,
            } => self.link_in(*parent, name, inode, *noreplace, who, now),
            Mutation::MoveDone { parent, name } => self.move_done(*parent, name, now),
            Mutation::MoveAbort { parent, name } => self.move_abort(*parent, name),
            Mutation::DropLink { fid } => self.drop_link_elsewhere(*fid, now),
            Mutation::Dropped { fid } => self.forget_dropped(*fid),
            Mutation::LinkOut { linking } => self.link_out(linking, who, now),
            Mutation::LinkDone { fid, peer_req } => self.link_done(*fid, *peer_req),
            Mutation::LinkAbort { fid, peer_req } => self.link_abort(*fid, *peer_req, now),
            Mutation::PlaceOut { parent, placing } => self.place_out(*parent, placing, who),
            Mutation::PlaceDone { parent, name } => self.place_done(*parent, name, now),
            Mutation::PlaceAbort { parent, name } => self.place_abort(*parent, name),
            Mutation::Reparent { dir, parent } => self.reparent(*dir, *parent, now),
            Mutation::RenameLock { holder, key } => self.set_rename_lock(*holder, *key),
            Mutation::HsmSet {
                fid,
                state,
                release,
                restored,
            } => self.hsm_set(*fid, state, *release, *restored),
            Mutation::HsmLinks { links } => self.hsm_links(links),
            Mutation::HsmImport {
                parent,
                name,
                size,
                mtime,
                state,
                layout,
            } => self.hsm_import(*parent, name, *size, *mtime, state, layout, who, now),
            Mutation::HsmReimport {
                fid,
                size,
                mtime,
                state,
            } => self.hsm_reimport(*fid, *size, *mtime, state, now),
            Mutation::SkipInodes { next } => {
                self.next_oid = self.next_oid.max(*next);
                Ok(Applied {
                    inode: None,
                    removed: vec![],
                    reserved: None,
                })
            }
        }
    }

    fn touch_dir(&mut self, dir: Fid, now: Time) {
        if let Some(d) = self.inodes.get_mut(&dir) {
            d.mtime = now;
            d.ctime = now;
        }
    }

    /// Whether a create of `name` in `parent` can go ahead: `Some(existing)` when it opens an
    /// existing file instead (`open(O_CREAT)` without `O_EXCL`), `None` when it creates.
    fn check_create(
        &self,
        parent: Fid,
        name: &[u8],
        kind: Kind,
        exclusive: bool,
        who: &Creds,
    ) -> Result<Option<&Inode>> {
        self.check_name_in(parent, name)?;
        self.dir(parent)?;
        self.check_shard(parent, name, true)?;
        self.not_moving(parent, name)?;
        let Some(existing) = self.entries[&parent].get(name) else {
            self.require(parent, who, 3)?;
            return Ok(None);
        };
        let existing = self.inode(*existing)?;
        // Another MDT's file is opened there (the client looks it up and opens it by FID).
        if exclusive
            || kind != Kind::File
            || existing.kind != Kind::File
            || self.is_remote(existing.fid)
        {
            return err(
                FsErrorKind::Exists,
                format!("{:?} exists", String::from_utf8_lossy(name)),
            );
        }
        self.require(parent, who, 1)?;
        Ok(Some(existing))
    }

    /// Whether `fid` can be a new inode's: an inode number set aside already (below the next
    /// one given out) that no inode has. Which client may use it is the MDS's business.
    fn check_reserved(&self, fid: Fid) -> Result<()> {
        if fid.seq != self.seq || fid.ver != 0 || fid.oid == 0 || fid.oid >= self.next_oid {
            return err(
                FsErrorKind::Invalid,
                format!("{fid} is not an inode number set aside"),
            );
        }
        if self.inodes.contains_key(&fid) {
            return err(FsErrorKind::Exists, format!("{fid} exists"));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // the fields of one Mutation::Create
    fn create(
        &mut self,
        at: Option<Fid>,
        parent: Fid,
        name: &[u8],
        kind: Kind,
        mode: u32,
        exclusive: bool,
        target: &[u8],
        layout: Option<Layout>,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        if let Some(existing) = self.check_create(parent, name, kind, exclusive, who)? {
            // open(O_CREAT) without O_EXCL on an existing file opens it.
            return Ok(Applied {
                inode: Some(existing.clone()),
                removed: vec![],
                reserved: None,
            });
        }
        check_new_inode(kind, target, layout.as_ref())?;
        let (fid, next) = match at {
            Some(fid) => {
                self.check_reserved(fid)?;
                (fid, self.next_oid)
            }
            None => {
                let oid = self.next_oid;
                let Some(next) = oid.checked_add(1) else {
                    return err(FsErrorKind::NoSpace, "inode numbers are exhausted");
                };
                (Fid::new(self.seq, oid, 0), next)
            }
        };
        let p = self.inode(parent)?;
        let inode = new_inode(fid, kind, mode, target, layout, p, who, now);
        self.next_oid = next;
        let fid = inode.fid;
        if kind == Kind::Dir {
            self.entries.insert(fid, BTreeMap::new());
            self.parents.insert(fid, parent);
            if let Some(p) = self.inodes.get_mut(&parent) {
                p.nlink += 1;
            }
        }
        self.inodes.insert(fid, inode.clone());
        if let Some(d) = self.entries.get_mut(&parent) {
            d.insert(name.to_vec(), fid);
        }
        self.touch_dir(parent, now);
        Ok(Applied {
            inode: Some(inode),
            removed: vec![],
            reserved: None,
        })
    }

    fn link(
        &mut self,
        fid: Fid,
        parent: Fid,
        name: &[u8],
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        self.check_name_in(parent, name)?;
        // Counted at its home only: another MDT's file is linked there (across MDTs).
        self.local(fid)?;
        self.local(parent)?;
        let inode = self.inode(fid)?;
        self.same_policy(inode, parent)?;
        if inode.kind == Kind::Dir {
            return err(
                FsErrorKind::NotPermitted,
                "directories cannot be hard-linked",
            );
        }
        // A file with no name is linked only while kept for its handles (made with no name,
        // or removed while open): the kernel allows only the first (linkat of an O_TMPFILE).
        let unnamed = inode.nlink == 0;
        if inode.nlink >= MAX_LINKS {
            return err(
                FsErrorKind::TooManyLinks,
                format!("{fid} has {MAX_LINKS} links"),
            );
        }
        self.dir(parent)?;
        self.check_shard(parent, name, true)?;
        self.not_moving(parent, name)?;
        self.require(parent, who, 3)?;
        if self.entries[&parent].contains_key(name) {
            return err(
                FsErrorKind::Exists,
                format!("{:?} exists", String::from_utf8_lossy(name)),
            );
        }
        let i = self.inodes.get_mut(&fid).expect("checked above");
        i.nlink += 1;
        i.ctime = now;
        let inode = i.clone();
        if unnamed {
            self.unlinked.remove(&fid);
        }
        if let Some(d) = self.entries.get_mut(&parent) {
            d.insert(name.to_vec(), fid);
        }
        self.touch_dir(parent, now);
        Ok(Applied {
            inode: Some(inode),
            removed: vec![],
            reserved: None,
        })
    }

    /// Drops one link to `fid`; returns the inode if that was its last.
    fn drop_link(&mut self, fid: Fid, now: Time) -> Option<Inode> {
        let i = self.inodes.get_mut(&fid)?;
        let dir = i.kind == Kind::Dir;
        i.nlink = if dir { 0 } else { i.nlink.saturating_sub(1) };
        i.ctime = now;
        if i.nlink > 0 {
            return None;
        }
        if dir {
            self.entries.remove(&fid);
            if let Some(p) = self.parents.remove(&fid) {
                if let Some(pi) = self.inodes.get_mut(&p) {
                    pi.nlink = pi.nlink.saturating_sub(1);
                }
            }
        }
        let dom = !dir
            && self.inodes[&fid]
                .layout
                .as_ref()
                .is_some_and(|l| l.mdt_end().is_some());
        if dom {
            // Its bytes live here: kept, with the inode, for the handles that may hold it;
            // its objects go when it is released.
            self.unlinked.insert(fid);
            return Some(self.inodes[&fid].clone());
        }
        let gone = self.inodes.remove(&fid)?;
        self.mdt.remove(&fid);
        if !dir {
            self.doom(&gone);
        }
        Some(gone)
    }

    /// Queues the objects of removed file `gone` for destruction.
    fn doom(&mut self, gone: &Inode) {
        for o in gone
            .layout
            .iter()
            .flat_map(|l| &l.components)
            .flat_map(|c| &c.objects)
        {
            self.doomed.insert(o.fid, (o.target, gone.fid));
        }
    }

    /// A regular file in no directory (O_TMPFILE), made as `parent` would make it: kept, as
    /// a file removed while open is, until a link names it or it is released.
    fn create_unnamed(
        &mut self,
        parent: Fid,
        mode: u32,
        layout: Option<Layout>,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        self.dir(parent)?;
        self.require(parent, who, 3)?;
        check_new_inode(Kind::File, &[], layout.as_ref())?;
        let oid = self.next_oid;
        let Some(next) = oid.checked_add(1) else {
            return err(FsErrorKind::NoSpace, "inode numbers are exhausted");
        };
        let p = self.inode(parent)?;
        let mut inode = new_inode(
            Fid::new(self.seq, oid, 0),
            Kind::File,
            mode,
            &[],
            layout,
            p,
            who,
            now,
        );
        inode.nlink = 0;
        self.next_oid = next;
        self.inodes.insert(inode.fid, inode.clone());
        self.unlinked.insert(inode.fid);
        Ok(Applied {
            inode: Some(inode),
            removed: vec![],
            reserved: None,
        })
    }

    fn grow_size(&mut self, fid: Fid, size: u64, who: &Creds, now: Time) -> Result<Applied> {
        let i = self.require(fid, who, 2)?;
        if i.kind != Kind::File {
            return err(FsErrorKind::Invalid, format!("{fid} is not a regular file"));
        }
        if size > MAX_FILE_SIZE {
            return err(
                FsErrorKind::FileTooLarge,
                format!("{size} is past the file size limit"),
            );
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        if size > x.size {
            x.size = size;
        }
        x.mtime = now;
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    fn mirror_state(
        &mut self,
        fid: Fid,
        mirror: u16,
        stale: bool,
        generation: u32,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        let i = self.require(fid, who, 2)?;
        let Some(layout) = i.layout.as_ref().filter(|_| i.kind == Kind::File) else {
            return err(FsErrorKind::Invalid, format!("{fid} has no mirrors"));
        };
        if mirror >= layout.mirror_count() {
            return err(
                FsErrorKind::Invalid,
                format!("{fid} has no mirror {mirror}"),
            );
        }
        let others_in_sync = (0..layout.mirror_count())
            .filter(|m| *m != mirror)
            .any(|m| !layout.stale_mirrors().contains(&m));
        if stale && !others_in_sync {
            // The last copy in sync is never marked stale: the write that missed it fails.
            return err(
                FsErrorKind::Io,
                format!("{fid}: mirror {mirror} is the last one in sync"),
            );
        }
        if !stale && layout.generation != generation {
            return err(
                FsErrorKind::Stale,
                format!("{fid}'s layout changed during the resync of mirror {mirror}"),
            );
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        let layout = x.layout.as_mut().expect("checked above");
        let mut changed = false;
        for c in layout.components.iter_mut().filter(|c| c.mirror == mirror) {
            changed |= c.stale != stale;
            c.stale = stale;
        }
        if changed {
            layout.generation += 1;
            x.ctime = now;
        }
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Checks that `mirror` of `fid` may be given new objects at `generation`: it is stale, or
    /// one past the last mirror (a new copy, up to [`proto::layout::MAX_MIRRORS`]). Returns
    /// the file's layout.
    pub fn may_place_mirror(
        &self,
        fid: Fid,
        mirror: u16,
        generation: u32,
        who: &Creds,
    ) -> Result<&Layout> {
        let i = self.require(fid, who, 2)?;
        let Some(layout) = i.layout.as_ref().filter(|_| i.kind == Kind::File) else {
            return err(
                FsErrorKind::Invalid,
                format!("{fid} is not a file with a layout"),
            );
        };
        if layout.generation != generation {
            return err(
                FsErrorKind::Stale,
                format!("{fid}'s layout changed before mirror {mirror} was placed"),
            );
        }
        let count = layout.mirror_count();
        if mirror > count || (mirror == count && count >= proto::layout::MAX_MIRRORS) {
            return err(
                FsErrorKind::Invalid,
                format!(
                    "{fid} has {count} mirrors: no mirror {mirror} can be placed (at most {})",
                    proto::layout::MAX_MIRRORS
                ),
            );
        }
        if mirror < count && !layout.stale_mirrors().contains(&mirror) {
            return err(
                FsErrorKind::Invalid,
                format!("{fid}: mirror {mirror} is in sync; only a stale mirror is moved"),
            );
        }
        Ok(layout)
    }

    fn place_mirror(
        &mut self,
        fid: Fid,
        mirror: u16,
        generation: u32,
        components: &[proto::layout::Component],
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        let layout = self.may_place_mirror(fid, mirror, generation, who)?;
        if components.is_empty()
            || components
                .iter()
                .any(|c| c.mirror != mirror || !c.stale || !c.is_instantiated())
        {
            return err(
                FsErrorKind::Invalid,
                format!("mirror {mirror} of {fid} must be placed as stale components with objects"),
            );
        }
        let mut next = layout.clone();
        let old: Vec<proto::layout::StripeObject> = next
            .components
            .iter()
            .filter(|c| c.mirror == mirror)
            .flat_map(|c| c.objects.iter().copied())
            .collect();
        next.components.retain(|c| c.mirror != mirror);
        let at = next
            .components
            .iter()
            .position(|c| c.mirror > mirror)
            .unwrap_or(next.components.len());
        next.components.splice(at..at, components.iter().cloned());
        next.generation += 1;
        next.validate().map_err(|e| NsError {
            kind: FsErrorKind::Invalid,
            what: e.to_string(),
        })?;
        for o in old {
            self.doomed.insert(o.fid, (o.target, fid));
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        x.layout = Some(next);
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Files with more than one mirror that `want` picks, in FID order after `after`, up to
    /// `max`; and whether none follow. One pass over every inode.
    pub fn mirrored_files(
        &self,
        after: Option<Fid>,
        max: usize,
        want: impl Fn(&Layout) -> bool,
    ) -> (Vec<&Inode>, bool) {
        let mut found: Vec<&Inode> = self
            .inodes
            .values()
            .filter(|i| i.kind == Kind::File && after.is_none_or(|a| i.fid > a))
            .filter(|i| {
                i.layout
                    .as_ref()
                    .is_some_and(|l| l.mirror_count() > 1 && want(l))
            })
            .collect();
        found.sort_by_key(|i| i.fid);
        let end = found.len() <= max;
        found.truncate(max);
        (found, end)
    }

    fn set_layout(&mut self, fid: Fid, layout: &Layout, who: &Creds, now: Time) -> Result<Applied> {
        let i = self.require(fid, who, 2)?;
        layout.validate().map_err(|e| NsError {
            kind: FsErrorKind::Invalid,
            what: e.to_string(),
        })?;
        match i.kind {
            Kind::Symlink => return err(FsErrorKind::Invalid, "a symlink has no layout"),
            k if k.is_special() => {
                return err(FsErrorKind::Invalid, "a special file has no layout")
            }
            Kind::Dir if layout.components.iter().any(|c| !c.objects.is_empty()) => {
                return err(
                    FsErrorKind::Invalid,
                    "a directory's layout is a template, without objects",
                );
            }
            Kind::File if i.size > 0 => {
                return err(FsErrorKind::Exists, format!("{fid} already has data"));
            }
            _ => {}
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        let generation = x.layout.as_ref().map_or(0, |l| l.generation) + 1;
        // An empty file's old objects (given at create) go to the destroy queue.
        let old = x.layout.replace(Layout {
            generation,
            ..layout.clone()
        });
        for o in old
            .iter()
            .flat_map(|l| &l.components)
            .flat_map(|c| &c.objects)
        {
            self.doomed.insert(o.fid, (o.target, fid));
        }
        self.mdt.remove(&fid);
        let x = self.inodes.get_mut(&fid).expect("checked above");
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Writes into the bytes the MDS keeps of `fid` (Data-on-MDT).
    fn write_mdt(
        &mut self,
        fid: Fid,
        offset: u64,
        data: &[u8],
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        let mdt_end = Self::mdt_end(self.require(fid, who, 2)?)?;
        if data.len() > proto::md::MAX_MDT_WRITE {
            return err(
                FsErrorKind::TooBig,
                format!(
                    "a write to the MDS carries at most {} bytes",
                    proto::md::MAX_MDT_WRITE
                ),
            );
        }
        let end = offset.saturating_add(data.len() as u64);
        if end > mdt_end {
            return err(
                FsErrorKind::Invalid,
                format!(
                    "[{offset}, {end}) is not inside the MDS's part of {fid} (up to {mdt_end})"
                ),
            );
        }
        // Past what the vector holds, the file reads as zeros (a hole, or never written).
        let bytes = self.mdt.entry(fid).or_default();
        if (bytes.len() as u64) < end {
            bytes.resize(end as usize, 0);
        }
        bytes[offset as usize..end as usize].copy_from_slice(data);
        let x = self.inodes.get_mut(&fid).expect("checked above");
        if end > x.size {
            x.size = end;
        }
        x.mtime = now;
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// The bytes `offset..offset+len` the MDS keeps of `fid`, cut at the file's size and at
    /// the end of its Data-on-MDT component; what was never written reads as zeros.
    pub fn read_mdt(&self, fid: Fid, offset: u64, len: u64) -> Result<Vec<u8>> {
        let i = self.inode(fid)?;
        let mdt_end = Self::mdt_end(i)?;
        let end = offset.saturating_add(len).min(i.size).min(mdt_end);
        if offset >= end {
            return Ok(vec![]);
        }
        let mut out = vec![0u8; (end - offset) as usize];
        if let Some(d) = self.mdt.get(&fid) {
            let have = (d.len() as u64).min(end);
            if offset < have {
                out[..(have - offset) as usize].copy_from_slice(&d[offset as usize..have as usize]);
            }
        }
        Ok(out)
    }

    /// Where the part the MDS keeps of regular file `i` ends.
    fn mdt_end(i: &Inode) -> Result<u64> {
        if i.kind != Kind::File {
            return err(
                FsErrorKind::Invalid,
                format!("{} is not a regular file", i.fid),
            );
        }
        match i.layout.as_ref().and_then(|l| l.mdt_end()) {
            Some(end) => Ok(end),
            None => err(
                FsErrorKind::Invalid,
                format!("{} has no Data-on-MDT component", i.fid),
            ),
        }
    }

    /// The bytes the MDS keeps of every file with a Data-on-MDT component, for a snapshot.
    pub(crate) fn mdt_bytes(&self) -> &HashMap<Fid, Vec<u8>> {
        &self.mdt
    }

    /// Takes in the bytes a snapshot kept.
    pub(crate) fn set_mdt_bytes(&mut self, mdt: HashMap<Fid, Vec<u8>>) {
        self.mdt = mdt;
    }

    /// Finds again, after a snapshot is read, the files kept with no name.
    pub(crate) fn find_unlinked(&mut self) {
        self.unlinked = self
            .inodes
            .values()
            .filter(|i| i.kind != Kind::Dir && i.nlink == 0)
            .map(|i| i.fid)
            .collect();
    }

    /// Up to `max` files kept with no name for their handles that `held` says no handle holds
    /// now, and that changed last at least [`RELEASE_AFTER_S`] before `now` (the open that
    /// made a file with no name is counted only once the create has applied).
    pub fn releasable(&self, max: usize, held: impl Fn(Fid) -> bool, now: Time) -> Vec<Fid> {
        self.unlinked
            .iter()
            .copied()
            .filter(|f| {
                !held(*f)
                    && self
                        .inodes
                        .get(f)
                        .is_none_or(|i| i.ctime.sec.saturating_add(RELEASE_AFTER_S) <= now.sec)
            })
            .take(max)
            .collect()
    }

    /// How many times `fid`'s size was set in this run.
    pub fn truncates(&self, fid: Fid) -> u64 {
        self.truncates.0.get(&fid).copied().unwrap_or(0)
    }

    /// Which of `fids` still exist, by a name or (removed) by objects kept for them, waiting
    /// for their last close or for destruction. One pass over the destroy queue.
    pub fn still_kept(&self, fids: &[Fid]) -> std::collections::HashSet<Fid> {
        let mut kept: std::collections::HashSet<Fid> = fids
            .iter()
            .copied()
            .filter(|f| self.inodes.contains_key(f))
            .collect();
        if kept.len() < fids.len() {
            let removed: std::collections::HashSet<Fid> =
                fids.iter().copied().filter(|f| !kept.contains(f)).collect();
            kept.extend(
                self.doomed
                    .values()
                    .map(|&(_, owner)| owner)
                    .filter(|o| removed.contains(o)),
            );
        }
        kept
    }

    /// Up to `max` objects waiting to be destroyed, but for those of files `held` says are
    /// still open somewhere (a removed file stays readable until its last close).
    pub fn doomed(
        &self,
        max: usize,
        held: impl Fn(Fid) -> bool,
    ) -> Vec<proto::layout::StripeObject> {
        self.doomed
            .iter()
            .filter(|(_, (_, owner))| !held(*owner))
            .take(max)
            .map(|(fid, (target, _))| proto::layout::StripeObject {
                target: *target,
                fid: *fid,
            })
            .collect()
    }

    /// The highest object id of MDT `mdt`'s sequence on `target` that a file (or the destroy
    /// queue) knows about; objects of that sequence above it are orphans.
    pub fn highest_object(&self, target: u32, mdt: u32) -> u32 {
        let seq = proto::fid::object_seq(target, mdt);
        let in_files = self
            .inodes
            .values()
            .flat_map(|i| i.layout.iter())
            .flat_map(|l| &l.components)
            .flat_map(|c| &c.objects)
            .filter(|o| o.target == target && o.fid.seq == seq)
            .map(|o| o.fid.oid);
        let in_queue = self
            .doomed
            .iter()
            .filter(|(f, (t, _))| *t == target && f.seq == seq)
            .map(|(f, _)| f.oid);
        in_files.chain(in_queue).max().unwrap_or(0)
    }

    fn unlink(
        &mut self,
        parent: Fid,
        name: &[u8],
        dir: bool,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        check_name(name)?;
        let victim = self.lookup(parent, name, who)?.clone();
        self.not_moving(parent, name)?;
        if self.is_remote(victim.fid) && victim.kind != Kind::Dir {
            // Another MDT's file, named here: the name goes, and its home counts it gone.
            if dir {
                return err(
                    FsErrorKind::NotDir,
                    format!("{} is not a directory", victim.fid),
                );
            }
            let p = self.inode(parent)?.clone();
            self.may_unlink(&p, &victim, who)?;
            self.drop_remote_name(parent, name, victim.fid, now);
            self.touch_dir(parent, now);
            return Ok(Applied {
                inode: None,
                removed: vec![],
                reserved: None,
            });
        }
        if self.is_remote(victim.fid) {
            // A directory of another MDT, which removed it (empty) before the name goes.
            if !dir {
                return err(FsErrorKind::IsDir, format!("{} is a directory", victim.fid));
            }
            let p = self.inode(parent)?.clone();
            self.may_unlink(&p, &victim, who)?;
            if let Some(d) = self.entries.get_mut(&parent) {
                d.remove(name);
            }
            self.inodes.remove(&victim.fid);
            if let Some(p) = self.inodes.get_mut(&parent) {
                p.nlink = p.nlink.saturating_sub(1);
            }
            self.touch_dir(parent, now);
            return Ok(Applied {
                inode: None,
                removed: vec![],
                reserved: None,
            });
        }
        match (dir, victim.kind == Kind::Dir) {
            (true, false) => {
                return err(
                    FsErrorKind::NotDir,
                    format!("{victim_fid} is not a directory", victim_fid = victim.fid),
                )
            }
            (false, true) => {
                return err(FsErrorKind::IsDir, format!("{} is a directory", victim.fid))
            }
            _ => {}
        }
        if dir && (!self.entries[&victim.fid].is_empty() || striped_in_use(&victim)) {
            return err(
                FsErrorKind::NotEmpty,
                format!("{} is not empty", victim.fid),
            );
        }
        let p = self.inode(parent)?.clone();
        self.may_unlink(&p, &victim, who)?;
        if let Some(d) = self.entries.get_mut(&parent) {
            d.remove(name);
        }
        self.touch_dir(parent, now);
        let removed = self.drop_link(victim.fid, now);
        Ok(Applied {
            inode: self
                .inodes
                .get(&victim.fid)
                .filter(|i| i.nlink > 0)
                .cloned(),
            removed: removed.into_iter().collect(),
            reserved: None,
        })
    }

    /// Long by design: rename's checks in the order POSIX gives its errors, then the change;
    /// every check must pass before anything changes.
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &mut self,
        parent: Fid,
        name: &[u8],
        new_parent: Fid,
        new_name: &[u8],
        flags: RenameFlags,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        check_name(name)?;
        check_name(new_name)?;
        if flags.noreplace && flags.exchange {
            return err(
                FsErrorKind::Invalid,
                "RENAME_NOREPLACE and RENAME_EXCHANGE exclude each other",
            );
        }
        self.local(new_parent)?;
        let src = self.lookup(parent, name, who)?.clone();
        // Another MDT's directory records its parent there: its name changes within that
        // directory only (no RENAME_EXCHANGE, which would move it).
        if src.kind == Kind::Dir && (parent != new_parent || flags.exchange) {
            self.local(src.fid)?;
        }
        self.not_moving(parent, name)?;
        self.not_moving(new_parent, new_name)?;
        self.dir(new_parent)?;
        self.check_name_in(new_parent, new_name)?;
        self.same_policy(&src, new_parent)?;
        self.check_shard(new_parent, new_name, true)?;
        self.require(new_parent, who, 3)?;
        let p = self.inode(parent)?.clone();
        self.may_unlink(&p, &src, who)?;
        let dst = self.entries[&new_parent]
            .get(new_name)
            .map(|f| self.inodes[f].clone());
        if let Some(d) = dst.as_ref().filter(|d| d.kind == Kind::Dir) {
            self.local(d.fid)?;
        }
        if let Some(d) = dst.as_ref().filter(|_| flags.exchange) {
            self.same_policy(d, parent)?;
        }
        let src_dir = src.kind == Kind::Dir;
        // A directory cannot move below itself.
        if src_dir && self.is_within(new_parent, src.fid) {
            return err(FsErrorKind::Invalid, "cannot move a directory below itself");
        }
        // A directory given another parent has its `..` changed: Linux's rule asks write
        // permission on it too.
        if src_dir && parent != new_parent {
            self.require(src.fid, who, 2)?;
        }
        if let Some(d) = &dst {
            if d.fid == src.fid {
                return Ok(Applied {
                    inode: Some(src),
                    removed: vec![],
                    reserved: None,
                }); // two names of one inode: nothing to do
            }
            let np = self.inode(new_parent)?.clone();
            self.may_unlink(&np, d, who)?;
            if flags.noreplace {
                return err(
                    FsErrorKind::Exists,
                    format!("{:?} exists", String::from_utf8_lossy(new_name)),
                );
            }
            if flags.exchange {
                if d.kind == Kind::Dir && self.is_within(parent, d.fid) {
                    return err(FsErrorKind::Invalid, "cannot move a directory below itself");
                }
                if d.kind == Kind::Dir && parent != new_parent {
                    self.require(d.fid, who, 2)?;
                }
                return Ok(self.exchange(parent, name, &src, new_parent, new_name, d, now));
            }
            match (src_dir, d.kind == Kind::Dir) {
                (true, false) => {
                    return err(FsErrorKind::NotDir, format!("{} is not a directory", d.fid))
                }
                (false, true) => {
                    return err(FsErrorKind::IsDir, format!("{} is a directory", d.fid))
                }
                (true, true) if !self.entries[&d.fid].is_empty() || striped_in_use(d) => {
                    return err(FsErrorKind::NotEmpty, format!("{} is not empty", d.fid))
                }
                _ => {}
            }
        } else if flags.exchange {
            return err(
                FsErrorKind::NotFound,
                format!(
                    "no entry {:?} to exchange with",
                    String::from_utf8_lossy(new_name)
                ),
            );
        }
        // Checked: now change, atomically as far as any reader can see.
        if let Some(d) = self.entries.get_mut(&parent) {
            d.remove(name);
        }
        let replaced = match dst {
            // Another MDT's file: its name goes, and its home counts it gone.
            Some(d) if self.is_remote(d.fid) => {
                self.drop_remote_name(new_parent, new_name, d.fid, now);
                None
            }
            Some(d) => self.drop_link(d.fid, now),
            None => None,
        };
        if let Some(d) = self.entries.get_mut(&new_parent) {
            d.insert(new_name.to_vec(), src.fid);
        }
        if src_dir && parent != new_parent {
            self.parents.insert(src.fid, new_parent);
            if let Some(pi) = self.inodes.get_mut(&parent) {
                pi.nlink = pi.nlink.saturating_sub(1);
            }
            if let Some(pi) = self.inodes.get_mut(&new_parent) {
                pi.nlink += 1;
            }
        }
        if let Some(i) = self.inodes.get_mut(&src.fid) {
            i.ctime = now;
        }
        self.touch_dir(parent, now);
        self.touch_dir(new_parent, now);
        Ok(Applied {
            inode: self.inodes.get(&src.fid).cloned(),
            removed: replaced.into_iter().collect(),
            reserved: None,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn exchange(
        &mut self,
        parent: Fid,
        name: &[u8],
        a: &Inode,
        new_parent: Fid,
        new_name: &[u8],
        b: &Inode,
        now: Time,
    ) -> Applied {
        if let Some(d) = self.entries.get_mut(&parent) {
            d.insert(name.to_vec(), b.fid);
        }
        if let Some(d) = self.entries.get_mut(&new_parent) {
            d.insert(new_name.to_vec(), a.fid);
        }
        for (fid, to, from) in [(a.fid, new_parent, parent), (b.fid, parent, new_parent)] {
            if self.entries.contains_key(&fid) && to != from {
                self.parents.insert(fid, to);
                if let Some(pi) = self.inodes.get_mut(&from) {
                    pi.nlink = pi.nlink.saturating_sub(1);
                }
                if let Some(pi) = self.inodes.get_mut(&to) {
                    pi.nlink += 1;
                }
            }
            if let Some(i) = self.inodes.get_mut(&fid) {
                i.ctime = now;
            }
        }
        self.touch_dir(parent, now);
        self.touch_dir(new_parent, now);
        Applied {
            inode: self.inodes.get(&a.fid).cloned(),
            removed: vec![],
            reserved: None,
        }
    }

    fn setattr(&mut self, fid: Fid, a: &SetAttr, who: &Creds, now: Time) -> Result<Applied> {
        let i = self.inode(fid)?.clone();
        let owner = who.uid == 0 || who.uid == i.uid;
        // A writer who is not the owner may clear the set-user-ID and set-group-ID bits, and
        // nothing else: a write or truncate by anyone else drops them (the kernel asks on the
        // writer's behalf), as on every local filesystem.
        let kills_priv_only = a.mode.is_some_and(|m| {
            (m & PERM_MASK) == (i.mode & PERM_MASK & !0o6000) && i.mode & 0o6000 != 0
        });
        if a.mode.is_some() && !owner && !(kills_priv_only && Self::permits(&i, who, 2)) {
            return err(
                FsErrorKind::NotPermitted,
                "only the owner may change the mode",
            );
        }
        if let Some(uid) = a.uid {
            if who.uid != 0 && uid != i.uid {
                return err(FsErrorKind::NotPermitted, "only root may change the owner");
            }
        }
        if let Some(gid) = a.gid {
            if who.uid != 0 && (!owner || !who.in_group(gid)) {
                return err(
                    FsErrorKind::NotPermitted,
                    "only the owner may change the group, to one of theirs",
                );
            }
        }
        if (a.atime.is_some() || a.mtime.is_some()) && !owner {
            if !a.times_now {
                return err(
                    FsErrorKind::NotPermitted,
                    "only the owner may set times other than now",
                );
            }
            if !Self::permits(&i, who, 2) {
                return err(FsErrorKind::AccessDenied, "permission denied to set times");
            }
        }
        if let Some(size) = a.size {
            if i.kind == Kind::Dir {
                return err(FsErrorKind::IsDir, format!("{fid} is a directory"));
            }
            if i.kind != Kind::File {
                return err(FsErrorKind::Invalid, format!("{fid} is not a regular file"));
            }
            if size > MAX_FILE_SIZE {
                return err(
                    FsErrorKind::FileTooLarge,
                    format!("{size} is past the file size limit"),
                );
            }
            if !Self::permits(&i, who, 2) {
                return err(
                    FsErrorKind::AccessDenied,
                    format!("permission denied on {fid}"),
                );
            }
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        if let Some(m) = a.mode {
            x.mode = m & PERM_MASK;
        }
        if let Some(u) = a.uid {
            x.uid = u;
        }
        if let Some(g) = a.gid {
            x.gid = g;
        }
        if let Some(s) = a.size {
            x.size = s;
            x.mtime = now;
            if let Some(d) = self.mdt.get_mut(&fid) {
                d.truncate(usize::try_from(s).unwrap_or(usize::MAX));
            }
        }
        if let Some(t) = a.atime {
            x.atime = t;
        }
        if let Some(t) = a.mtime {
            x.mtime = t;
        }
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Sets (`value`) or removes `name`; with `there`, only if the inode has it (`true`) or
    /// has not (`false`).
    fn set_xattr(
        &mut self,
        fid: Fid,
        name: &str,
        value: Option<&Vec<u8>>,
        there: Option<bool>,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        if name == proto::dirstripe::DEFAULT_XATTR {
            return self.set_dir_default(fid, value, who, now);
        }
        if name == proto::crypt::POLICY_XATTR {
            return self.set_crypt_policy(fid, value, who, now);
        }
        let Some(short) = name.strip_prefix("user.") else {
            return err(
                FsErrorKind::NotSupported,
                "only user.* extended attributes are kept",
            );
        };
        if short.is_empty() || name.len() > MAX_XATTR_NAME {
            return err(
                FsErrorKind::Range,
                format!("an xattr name is at most {MAX_XATTR_NAME} bytes"),
            );
        }
        let i = self.require(fid, who, 2)?;
        match (there, i.xattrs.contains_key(name)) {
            (Some(false), true) => {
                return err(FsErrorKind::Exists, format!("xattr {name} exists"));
            }
            (Some(true), false) => {
                return err(FsErrorKind::NoAttribute, format!("no xattr {name}"));
            }
            _ => {}
        }
        match value {
            Some(v) if v.len() > MAX_XATTR_VALUE => {
                return err(FsErrorKind::TooBig, "xattr value too large")
            }
            Some(_) if !i.xattrs.contains_key(name) && i.xattrs.len() >= MAX_XATTRS => {
                return err(
                    FsErrorKind::NoSpace,
                    format!("an inode holds at most {MAX_XATTRS} xattrs"),
                )
            }
            None if !i.xattrs.contains_key(name) => {
                return err(FsErrorKind::NoAttribute, format!("no xattr {name}"))
            }
            _ => {}
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        match value {
            Some(v) => x.xattrs.insert(name.to_owned(), v.clone()),
            None => x.xattrs.remove(name),
        };
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Sets (or, with `None`, removes) the default layout of directory `fid`'s new
    /// subdirectories ([`proto::dirstripe::DirDefault`]): by its owner or root, as
    /// `lfs setdirstripe -D` and `-d`. Removing one that is not there changes nothing.
    fn set_dir_default(
        &mut self,
        fid: Fid,
        value: Option<&Vec<u8>>,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        self.dir(fid)?;
        let i = self.inode(fid)?;
        if who.uid != 0 && who.uid != i.uid {
            return err(
                FsErrorKind::NotPermitted,
                format!("only {fid}'s owner or root sets its subdirectories' default layout"),
            );
        }
        if let Some(v) = value {
            let Some(d) = proto::dirstripe::DirDefault::decode(v) else {
                return err(FsErrorKind::Invalid, "not a default directory layout");
            };
            if let Some(why) = d.invalid() {
                return err(FsErrorKind::Invalid, why);
            }
        }
        let name = proto::dirstripe::DEFAULT_XATTR;
        let x = self.inodes.get_mut(&fid).expect("checked above");
        match value {
            Some(v) => {
                x.xattrs.insert(name.to_owned(), v.clone());
            }
            None => {
                x.xattrs.remove(name);
            }
        }
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }

    /// Checks the namespace's invariants; returns every violation found.
    pub fn check(&self) -> Vec<String> {
        let mut problems = self.check_hsm();
        let mut links: HashMap<Fid, u32> = HashMap::new();
        let mut subdirs: HashMap<Fid, u32> = HashMap::new();
        for (dir, d) in &self.entries {
            if !self.inodes.get(dir).is_some_and(|i| i.kind == Kind::Dir) {
                problems.push(format!("{dir} has entries but is not a directory"));
            }
            for (name, f) in d {
                match self.inodes.get(f) {
                    None => problems.push(format!(
                        "{dir}/{} points to missing {f}",
                        String::from_utf8_lossy(name)
                    )),
                    // A directory of another MDT: named here once, its stub kept.
                    Some(i) if i.kind == Kind::Dir && self.is_remote(*f) => {
                        *subdirs.entry(*dir).or_default() += 1;
                        *links.entry(*f).or_default() += 1;
                    }
                    Some(i) if i.kind == Kind::Dir => {
                        *subdirs.entry(*dir).or_default() += 1;
                        if self.parents.get(f) != Some(dir) {
                            problems.push(format!("{f}'s parent is not {dir}"));
                        }
                    }
                    Some(_) => *links.entry(*f).or_default() += 1,
                }
            }
        }
        for (fid, i) in &self.inodes {
            if self.is_remote(*fid) {
                let want = if moves::dropping(i).is_some() { 0 } else { 1 };
                let have = links.get(fid).copied().unwrap_or(0);
                // A directory of another MDT renamed between two directories here: named in
                // both while its move is recorded.
                let renamed = i.kind == Kind::Dir && have == 2 && !moves::moves(i).is_empty();
                if have != want && !renamed {
                    problems.push(format!(
                        "{fid}, a {} of another MDT, is not named {} here",
                        if i.kind == Kind::Dir {
                            "directory"
                        } else {
                            "file"
                        },
                        if want == 1 { "exactly once" } else { "no more" }
                    ));
                }
                continue;
            }
            let want = match i.kind {
                Kind::Dir => 2 + subdirs.get(fid).copied().unwrap_or(0),
                _ => links.get(fid).copied().unwrap_or(0) + moves::elsewhere(i),
            };
            if i.nlink != want {
                problems.push(format!("{fid} has nlink {} but {want} links", i.nlink));
            }
            if i.kind == Kind::Dir && *fid != self.root {
                // Reachable from the root without a cycle.
                let mut at = *fid;
                let mut steps = 0;
                while at != self.root && steps <= self.entries.len() {
                    at = self.parents.get(&at).copied().unwrap_or(self.root);
                    // Named on another MDT: reachable through it (its fsck checks the name).
                    if self.is_remote(at) {
                        at = self.root;
                    }
                    steps += 1;
                }
                if at != self.root {
                    problems.push(format!("{fid} is not reachable from the root"));
                }
            }
            if i.kind != Kind::Dir
                && !links.contains_key(fid)
                && !self.unlinked.contains(fid)
                && moves::elsewhere(i) == 0
            {
                problems.push(format!("{fid} is an orphan (no entry names it)"));
            }
        }
        // Striped directories: a master holds no names; a shard only names its hash places
        // there (no name is in two shards), and one whose master is here is listed by it.
        for (fid, i) in &self.inodes {
            if i.xattrs.is_empty() || self.is_remote(*fid) {
                continue;
            }
            if proto::dirstripe::of_inode(i).is_some()
                && self.entries.get(fid).is_some_and(|d| !d.is_empty())
            {
                problems.push(format!("{fid}, a striped directory, holds names itself"));
            }
            if let Some(s) = proto::dirstripe::shard_of_inode(i) {
                for name in self.entries.get(fid).into_iter().flat_map(|d| d.keys()) {
                    if !s.holds(name) {
                        problems.push(format!(
                            "{fid}/{} is in shard {} of {}, not the one its hash gives",
                            String::from_utf8_lossy(name),
                            s.index,
                            s.master
                        ));
                    }
                }
                if !self.is_remote(s.master) {
                    match self
                        .inodes
                        .get(&s.master)
                        .and_then(proto::dirstripe::of_inode)
                    {
                        Some(m) if m.shards.get(s.index as usize) == Some(fid) => {}
                        Some(m) if m.state != proto::dirstripe::StripeState::Ready => {}
                        _ => problems.push(format!(
                            "{fid} is shard {} of {}, which does not list it",
                            s.index, s.master
                        )),
                    }
                }
            }
        }
        for (fid, d) in &self.mdt {
            match self.inodes.get(fid) {
                Some(i)
                    if i.layout
                        .as_ref()
                        .and_then(|l| l.mdt_end())
                        .is_some_and(|e| d.len() as u64 <= e.min(i.size)) => {}
                _ => problems.push(format!(
                    "{fid} has {} bytes on the MDS but no Data-on-MDT component holding them",
                    d.len()
                )),
            }
        }
        // Every object belongs to one file, or waits in the destroy queue: never two.
        let mut owners: HashMap<Fid, Fid> = HashMap::new();
        for i in self.inodes.values() {
            for o in i
                .layout
                .iter()
                .flat_map(|l| &l.components)
                .flat_map(|c| &c.objects)
            {
                if let Some(other) = owners.insert(o.fid, i.fid) {
                    problems.push(format!(
                        "object {} belongs to both {other} and {}",
                        o.fid, i.fid
                    ));
                }
                if self.doomed.contains_key(&o.fid) {
                    problems.push(format!(
                        "object {} of {} is also queued for destruction",
                        o.fid, i.fid
                    ));
                }
            }
        }
        problems
    }
}

/// What a new inode of `kind` must satisfy: a symlink's target length, no layout on special
/// files, a valid layout, objects only in a file's layout.
fn check_new_inode(kind: Kind, target: &[u8], layout: Option<&Layout>) -> Result<()> {
    if kind == Kind::Symlink && (target.is_empty() || target.len() > MAX_SYMLINK) {
        return err(
            FsErrorKind::NameTooLong,
            format!("a symlink target is 1 to {MAX_SYMLINK} bytes"),
        );
    }
    if kind.is_special() && layout.is_some() {
        return err(FsErrorKind::Invalid, "a special file has no layout");
    }
    if let Some(l) = layout {
        l.validate().map_err(|e| NsError {
            kind: FsErrorKind::Invalid,
            what: e.to_string(),
        })?;
        if kind != Kind::File && l.components.iter().any(|c| !c.objects.is_empty()) {
            return err(
                FsErrorKind::Invalid,
                "only a file's layout has objects; a directory's is a template",
            );
        }
    }
    Ok(())
}

/// Whether `dir` is a striped directory whose shards are not all removed yet (its rmdir
/// removes them first).
fn striped_in_use(dir: &Inode) -> bool {
    !dir.xattrs.is_empty()
        && proto::dirstripe::of_inode(dir)
            .is_some_and(|s| s.state != proto::dirstripe::StripeState::Emptied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(ns: &mut Namespace, name: &str) -> Fid {
        let m = Mutation::Create {
            parent: ROOT,
            name: name.into(),
            kind: Kind::File,
            mode: 0o644,
            exclusive: true,
            target: vec![],
            layout: None,
        };
        ns.apply(&m, &Creds::root(), Time::default())
            .unwrap()
            .inode
            .unwrap()
            .fid
    }

    #[test]
    fn the_checker_finds_each_kind_of_damage() {
        let mut ns = Namespace::default();
        let a = file(&mut ns, "a");
        let b = file(&mut ns, "b");
        assert!(ns.check().is_empty());

        let mut bad = ns.clone();
        bad.inodes.get_mut(&a).unwrap().nlink = 5;
        assert!(bad.check().iter().any(|p| p.contains("nlink")));

        let mut bad = ns.clone();
        bad.inodes.remove(&b);
        assert!(bad.check().iter().any(|p| p.contains("missing")));

        let mut bad = ns.clone();
        bad.entries.get_mut(&ROOT).unwrap().remove(b"a".as_slice());
        assert!(bad.check().iter().any(|p| p.contains("orphan")));

        let mut bad = ns.clone();
        let d = Fid::new(INODE_SEQ, 999, 0);
        let mut dir = bad.inodes[&ROOT].clone();
        dir.fid = d;
        bad.inodes.insert(d, dir);
        bad.entries.insert(d, BTreeMap::new());
        bad.parents.insert(d, d);
        assert!(bad.check().iter().any(|p| p.contains("not reachable")));

        let mut bad = ns.clone();
        let obj = proto::layout::StripeObject {
            target: 0,
            fid: Fid::new(1, 1, 0),
        };
        let mut layout = Layout::new(vec![proto::layout::Component::raid0(
            proto::layout::StripeCount::Count(1),
            1 << 20,
        )])
        .unwrap();
        layout.components[0].objects = vec![obj];
        for f in [a, b] {
            bad.inodes.get_mut(&f).unwrap().layout = Some(layout.clone());
        }
        assert!(bad.check().iter().any(|p| p.contains("belongs to both")));
    }
}
