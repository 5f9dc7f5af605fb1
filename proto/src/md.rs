//! Metadata: inodes, the mutations that change the namespace, and the MDS's messages. The
//! namespace's rules live in the MDS; these are the shapes that travel and are journaled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::capa::Grant;
use crate::layout::Layout;
use crate::msg::{opcodes, Opcode, Rpc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::Fid;

/// Largest file size: 1 PiB.
pub const MAX_FILE_SIZE: u64 = 1 << 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// A named pipe: the namespace keeps its name and attributes; data never reaches lode.
    Fifo,
    /// A Unix socket's name.
    Socket,
    /// A character device node, with its device number (`makedev`).
    CharDev(u64),
    /// A block device node, with its device number.
    BlockDev(u64),
}

impl Kind {
    /// FIFOs, sockets and device nodes: names with attributes, no data and no layout.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::Fifo | Kind::Socket | Kind::CharDev(_) | Kind::BlockDev(_)
        )
    }

    /// The device number of a device node, else 0.
    pub fn rdev(self) -> u64 {
        match self {
            Kind::CharDev(d) | Kind::BlockDev(d) => d,
            _ => 0,
        }
    }
}

/// A point in time: seconds from 1970 and a nanosecond part below one second (a time whose
/// nanoseconds are out of range is refused when decoded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "RawTime")]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// A [`Time`] as it comes off the wire, before it is checked.
#[derive(Deserialize)]
struct RawTime {
    sec: i64,
    nsec: u32,
}

impl TryFrom<RawTime> for Time {
    type Error = String;
    fn try_from(t: RawTime) -> Result<Time, String> {
        if t.nsec >= 1_000_000_000 {
            return Err(format!("{} nanoseconds is not below one second", t.nsec));
        }
        Ok(Time {
            sec: t.sec,
            nsec: t.nsec,
        })
    }
}

impl Time {
    /// The wall clock now.
    pub fn now() -> Time {
        Time::from(SystemTime::now())
    }

    /// The time as the system's clock type; a time it cannot hold becomes the nearest one it
    /// can, so a hostile or damaged time never panics.
    pub fn to_system_time(self) -> SystemTime {
        let nsec = Duration::from_nanos(u64::from(self.nsec.min(999_999_999)));
        let t = if self.sec >= 0 {
            UNIX_EPOCH.checked_add(Duration::from_secs(self.sec as u64) + nsec)
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::from_secs(self.sec.unsigned_abs()))
                .and_then(|t| t.checked_add(nsec))
        };
        t.unwrap_or_else(|| {
            // The largest span every platform's clock holds either side of 1970.
            let edge = Duration::from_secs(i32::MAX as u64);
            if self.sec >= 0 {
                UNIX_EPOCH + edge
            } else {
                UNIX_EPOCH - edge
            }
        })
    }
}

impl From<SystemTime> for Time {
    /// Times before 1970 keep a non-negative nanosecond part: -0.5 s is `{ sec: -1, nsec: 5e8 }`.
    fn from(t: SystemTime) -> Time {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let (sec, nsec) = if d.subsec_nanos() == 0 {
                    (-(d.as_secs() as i64), 0)
                } else {
                    (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                };
                Time { sec, nsec }
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub fid: Fid,
    pub kind: Kind,
    /// Permission bits (with setuid, setgid, sticky); the kind is separate.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// A file's layout, or a directory's default for new entries.
    pub layout: Option<Layout>,
    /// A symlink's target.
    #[serde(with = "crate::msg::bytes_field")]
    pub target: Vec<u8>,
}

impl Inode {
    /// What is known of directory `fid` where only its FID is (one another MDT holds, met on
    /// a walk): its kind, and nothing of its attributes (those its MDT answers).
    pub fn dir_known_by_fid(fid: Fid) -> Inode {
        Inode {
            fid,
            kind: Kind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            size: 0,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            xattrs: BTreeMap::new(),
            layout: None,
            target: vec![],
        }
    }

    /// The attributes as readdirplus carries them: without layout, symlink target or xattrs
    /// but the encryption policy (whoever meets a directory needs it for the names in it).
    pub fn bare(&self) -> Inode {
        // Field by field: a clone would copy the layout and xattrs only to drop them.
        Inode {
            fid: self.fid,
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            size: self.size,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            xattrs: self
                .xattrs
                .get(crate::crypt::POLICY_XATTR)
                .map(|v| BTreeMap::from([(crate::crypt::POLICY_XATTR.to_string(), v.clone())]))
                .unwrap_or_default(),
            layout: None,
            target: vec![],
        }
    }

    /// Whether `who` may read (4), write (2) and/or search or execute (1) this inode, by its mode
    /// bits as POSIX checks them: owner, else group, else others; root passes all but execute of
    /// a file nobody may execute.
    pub fn permits(&self, who: &Creds, want: u32) -> bool {
        if who.uid == 0 {
            return want & 1 == 0 || self.kind == Kind::Dir || self.mode & 0o111 != 0;
        }
        let bits = if who.uid == self.uid {
            self.mode >> 6
        } else if who.in_group(self.gid) {
            self.mode >> 3
        } else {
            self.mode
        } & 7;
        bits & want == want
    }
}

/// Who is asking. uid 0 passes every permission check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub groups: Vec<u32>,
}

impl Creds {
    /// The superuser, who passes every permission check.
    pub fn root() -> Creds {
        Creds {
            uid: 0,
            gid: 0,
            groups: vec![],
        }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// An operation that changes the namespace: what the journal records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    Create {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        kind: Kind,
        mode: u32,
        exclusive: bool,
        #[serde(with = "crate::msg::bytes_field")]
        target: Vec<u8>,
        layout: Option<Layout>,
    },
    Link {
        fid: Fid,
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
    },
    Unlink {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        dir: bool,
    },
    Rename {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        new_parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        new_name: Vec<u8>,
        flags: RenameFlags,
    },
    Setattr {
        fid: Fid,
        attr: SetAttr,
    },
    SetXattr {
        fid: Fid,
        name: String,
        #[serde(with = "crate::msg::bytes_field")]
        value: Vec<u8>,
    },
    RemoveXattr {
        fid: Fid,
        name: String,
    },
    /// A writer reports how far the file now reaches: the size becomes the larger of the two,
    /// so writers of disjoint ranges of one file leave it at the furthest end.
    GrowSize {
        fid: Fid,
        size: u64,
    },
    /// Gives an empty file its layout (with its objects) before its first write.
    SetLayout {
        fid: Fid,
        layout: Layout,
    },
    /// Marks one mirror of a file stale (a write did not reach it) or in sync again (a resync
    /// copied it whole). Clearing applies only while the layout is still at `generation`, so a
    /// mirror that missed a write during its resync stays stale.
    MirrorState {
        fid: Fid,
        mirror: u16,
        stale: bool,
        generation: u32,
    },
    /// Gives mirror `mirror` new objects, placed as a new file's would be (on servers that
    /// hold no other copy, and up now): a stale mirror moves off the objects it had (they go
    /// to the destroy queue), and a mirror one past the last is a new copy with the stripe
    /// pattern of mirror 0. Either way the mirror is stale until a resync fills it. Applies
    /// only while the layout is still at `generation`. `components` are filled in by the MDS
    /// (a client sends none), on no target of `exclude`.
    PlaceMirror {
        fid: Fid,
        mirror: u16,
        generation: u32,
        #[serde(deserialize_with = "crate::seq::deserialize")]
        exclude: Vec<u32>,
        #[serde(deserialize_with = "crate::seq::deserialize")]
        components: Vec<crate::layout::Component>,
    },
    /// The storage servers have destroyed these objects of removed files.
    Destroyed {
        #[serde(deserialize_with = "crate::seq::deserialize")]
        objects: Vec<crate::layout::StripeObject>,
    },
    /// Inode numbers below `next` are not to be given out: recovery replayed a create whose
    /// number came after creates that were lost (only the MDS records it).
    SkipInodes {
        next: u32,
    },
    /// A create under a FID the MDS reserved for the creating client ([`MdsReserve`]), so
    /// that the client could answer it before sending it (an asynchronous create). Always
    /// exclusive.
    CreateAt {
        fid: Fid,
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        kind: Kind,
        mode: u32,
        #[serde(with = "crate::msg::bytes_field")]
        target: Vec<u8>,
        layout: Option<Layout>,
    },
    /// The next `count` inode numbers are set aside for one client's creates (only the MDS
    /// records it).
    ReserveInodes {
        count: u32,
    },
    /// Writes `data` at `offset` into the bytes the MDS keeps of a file with a Data-on-MDT
    /// first component (the whole write inside it, at most [`MAX_MDT_WRITE`] bytes); the
    /// size grows to the write's end, as a write's would.
    WriteMdt {
        fid: Fid,
        offset: u64,
        #[serde(with = "crate::msg::bytes_field")]
        data: Vec<u8>,
    },
    /// Sets an extended attribute only if the inode has it already (`replace`: setxattr's
    /// XATTR_REPLACE, else ENODATA) or only if it has not (XATTR_CREATE, else EEXIST), checked
    /// and set in one step.
    SetXattrIf {
        fid: Fid,
        name: String,
        #[serde(with = "crate::msg::bytes_field")]
        value: Vec<u8>,
        replace: bool,
    },
    /// Files kept with no name for their open handles (removed while open with bytes on the
    /// MDS, or made with no name) are gone: no handle holds them any more (only the MDS
    /// records it). Their objects go to the destroy queue.
    Released {
        #[serde(deserialize_with = "crate::seq::deserialize")]
        fids: Vec<Fid>,
    },
    /// A regular file in no directory (open(2)'s O_TMPFILE): link count 0, kept while a handle
    /// holds it (asked with `open`, so it is counted with the create), until a link names it.
    CreateUnnamed {
        parent: Fid,
        mode: u32,
        layout: Option<Layout>,
    },
    /// mkdir of `name` in `parent` with the new directory on MDT `mdt` (`lfs mkdir -i`): the
    /// parent's MDS has the directory made there ([`Mutation::MkdirForRemote`]) and names it
    /// here ([`Mutation::LinkRemoteDir`]). Never journaled as such.
    MkdirOn {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        mode: u32,
        mdt: u32,
    },
    /// A directory whose name lives on another MDT, made at the word of that MDT's MDS
    /// (servers only): its parent is `parent` there, its owner the caller, its group `gid` and
    /// its default layout `layout` (the parent's, passed on). `name` is the name it is to get,
    /// kept for the checks that pair the two.
    MkdirForRemote {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        mode: u32,
        gid: u32,
        layout: Option<Layout>,
    },
    /// The entry `name` in `parent` for `inode`, a directory another MDT holds (servers only):
    /// kept with the attributes it was made with, which only its own MDT keeps up to date.
    LinkRemoteDir {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        inode: Inode,
    },
    /// Removes the empty directory `fid`, whose name lives on another MDT (servers only: that
    /// MDT's MDS asks before it removes the name).
    RmdirRemote {
        fid: Fid,
    },
    /// mkdir of `name` in `parent`, striped over `count` shards on as many MDTs, shard 0 on
    /// MDT `offset` (the parent's when `None`), names placed by the hash numbered `hash`
    /// (`lfs setdirstripe`). The parent's MDS makes the master (this change, journaled, the
    /// layout [`crate::dirstripe::StripeState::Building`]), has each shard made on its MDT
    /// ([`Mutation::MakeShard`]) and lists them ([`Mutation::SetDirStripe`]).
    MkdirStriped {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        mode: u32,
        count: u32,
        offset: Option<u32>,
        hash: u32,
    },
    /// Shard `shard.index` of the striped directory `shard.master` (servers only): made with
    /// the master's owner, group, mode and default layout; made once however often asked.
    MakeShard {
        shard: crate::dirstripe::ShardOf,
        mode: u32,
        uid: u32,
        gid: u32,
        layout: Option<Layout>,
    },
    /// The layout of the striped directory `fid` (servers only: its MDS, as it makes or
    /// removes the shards).
    SetDirStripe {
        fid: Fid,
        stripe: crate::dirstripe::DirStripe,
    },
    /// Freezes (no new name, refused if it has one) or thaws a shard of a striped directory
    /// being removed (servers only).
    FreezeShard {
        fid: Fid,
        frozen: bool,
    },
    /// Removes `fid`, a frozen, empty shard of a striped directory (servers only); one gone
    /// already is not an error.
    RmdirShard {
        fid: Fid,
    },
    /// The first step of a rename of a file to a directory of another MDT, on the MDS of the
    /// name's directory (its own, never sent): the move, recorded on the file, until the
    /// other MDT has named it ([`Mutation::LinkIn`]) and [`Mutation::MoveDone`] or
    /// [`Mutation::MoveAbort`] ends it. Checked as the rename's source is.
    MoveOut {
        moving: Moving,
    },
    /// `inode`, a file of another MDT (or of this one, coming back), named `name` in `parent`
    /// as a rename from another MDT lands (servers only), replacing a file of that name as a
    /// rename does. Checked as the rename's target is, for the caller.
    LinkIn {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        inode: Inode,
        /// RENAME_NOREPLACE: refused if the name is taken.
        noreplace: bool,
    },
    /// The last step of a move: `name` of `parent`, named on the other MDT now, goes here
    /// (the MDS's own).
    MoveDone {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
    },
    /// A move the other MDT refused: `name` of `parent` stays (the MDS's own).
    MoveAbort {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
    },
    /// One of the names of file `fid` on another MDT is gone (servers only: that MDT's MDS,
    /// once per name, numbered so that a copy is answered from the reply cache).
    DropLink {
        fid: Fid,
    },
    /// The name of `fid`, another MDT's file, whose removal this MDS reported to that MDT, is
    /// forgotten here (the MDS's own).
    Dropped {
        fid: Fid,
    },
    /// The first step of a hard link of a file to a directory of another MDT, on the file's
    /// MDS (its own, never sent): the link counted and recorded on the file, until the other
    /// MDT has named it ([`Mutation::LinkIn`]) and [`Mutation::LinkDone`] or
    /// [`Mutation::LinkAbort`] ends it. Checked as a link's source is.
    LinkOut {
        linking: Linking,
    },
    /// The link recorded as `peer_req` on `fid` is made (the MDS's own).
    LinkDone {
        fid: Fid,
        peer_req: ReqId,
    },
    /// The link recorded as `peer_req` on `fid` was refused by the other MDT: its count goes
    /// (the MDS's own).
    LinkAbort {
        fid: Fid,
        peer_req: ReqId,
    },
    /// The first step of a mkdir or rmdir of a directory on another MDT, on the MDS of its
    /// parent (its own, never sent): checked as the change is for the caller, then recorded on
    /// the parent, the name taking no other change, until the other MDT's half is done and
    /// [`Mutation::LinkRemoteDir`] or [`Mutation::PlaceDone`] ends it, or it is refused and
    /// [`Mutation::PlaceAbort`] does.
    PlaceOut {
        parent: Fid,
        placing: Placing,
    },
    /// The directory named `name` in `parent`, removed on its MDT, loses its name here (the
    /// MDS's own).
    PlaceDone {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
    },
    /// A mkdir or rmdir the other MDT refused: the record of `name` in `parent` goes, and the
    /// name is as it was (the MDS's own).
    PlaceAbort {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
    },
    /// Directory `dir`, whose name moved between two other MDTs, has `parent` for its parent
    /// now (servers only: the MDS that moved the name).
    Reparent {
        dir: Fid,
        parent: Fid,
    },
    /// The filesystem's rename lock, kept by MDT0 (servers only): taken by MDT `holder` for
    /// the rename `key` when free or held by `holder` already, let go when `key` is `None`.
    /// A rename of a directory to another parent holds it while it checks that the directory
    /// does not move below itself and until it ends, so that no two such renames, each
    /// checked alone, make a loop together (Lustre's big filesystem lock).
    RenameLock {
        holder: u32,
        key: Option<ReqId>,
    },
    /// File `fid`'s HSM state becomes `state` (a [`crate::hsm::State`] encoded; the MDS's
    /// own, at a copytool's or a user's word). With `release`, the file's objects go to the
    /// destroy queue and every copy is left stale without objects (its bytes are in the
    /// archive only); with `restored`, mirror 0, placed and filled while the layout was at that
    /// generation, is in sync again.
    HsmSet {
        fid: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        state: Vec<u8>,
        release: bool,
        restored: Option<u32>,
    },
    /// The data repository links, kept on the root (the MDS's own; a
    /// [`crate::hsm::Links`] encoded).
    HsmLinks {
        #[serde(with = "crate::msg::bytes_field")]
        links: Vec<u8>,
    },
    /// A file named `name` in `parent` for an object of a linked archive, made by the
    /// directory's owner (the MDS's own, at a copytool's word): released, of `size` and
    /// `mtime`, with `layout` (stale, without objects) and the HSM state `state`.
    HsmImport {
        parent: Fid,
        #[serde(with = "crate::msg::bytes_field")]
        name: Vec<u8>,
        size: u64,
        mtime: Time,
        #[serde(with = "crate::msg::bytes_field")]
        state: Vec<u8>,
        layout: Layout,
    },
    /// A released file whose object changed in its archive takes the new object's `size`,
    /// `mtime` and state (the MDS's own, at a copytool's import).
    HsmReimport {
        fid: Fid,
        size: u64,
        mtime: Time,
        #[serde(with = "crate::msg::bytes_field")]
        state: Vec<u8>,
    },
}

/// A mkdir or rmdir of a directory on another MDT under way, kept on its parent by the
/// parent's MDS until it ends, so that it ends the same way after any crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placing {
    #[serde(with = "crate::msg::bytes_field")]
    pub name: Vec<u8>,
    /// The other MDT, and its half: [`Mutation::MkdirForRemote`] or
    /// [`Mutation::RmdirRemote`].
    pub mdt: u32,
    pub step: Box<Mutation>,
    /// Who asked.
    pub creds: Creds,
    /// The client's request, answered once it ends.
    pub client_req: Option<ReqId>,
    /// The number of the request to the other MDT, the same every time it is sent.
    pub peer_req: ReqId,
}

/// A hard link of a file to another MDT's directory under way, kept on the file by its MDS
/// until it ends, so that it ends the same way after any crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Linking {
    pub fid: Fid,
    pub new_parent: Fid,
    #[serde(with = "crate::msg::bytes_field")]
    pub new_name: Vec<u8>,
    /// Who asked: the other MDT checks its half for them.
    pub creds: Creds,
    /// The client's request, answered once the link ends.
    pub client_req: Option<ReqId>,
    /// The number of the request to the other MDT, the same every time it is sent.
    pub peer_req: ReqId,
}

/// A rename to another MDT's directory under way (or of a directory of another MDT between two
/// directories here), kept on the file or directory by the MDS of its old name until it ends,
/// so that it ends the same way after any crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moving {
    pub parent: Fid,
    #[serde(with = "crate::msg::bytes_field")]
    pub name: Vec<u8>,
    pub new_parent: Fid,
    #[serde(with = "crate::msg::bytes_field")]
    pub new_name: Vec<u8>,
    /// Who asked: the other MDT checks its half for them.
    pub creds: Creds,
    /// The client's request, answered once the move ends.
    pub client_req: Option<ReqId>,
    /// The number of the request to the other MDT: the same every time it is sent, so it is
    /// carried out there once.
    pub peer_req: ReqId,
}

impl Mutation {
    /// The change's kind, as metrics and logs name it ("create", "rename", "setattr").
    pub fn name(&self) -> &'static str {
        match self {
            Mutation::Create { .. } => "create",
            Mutation::Link { .. } => "link",
            Mutation::Unlink { .. } => "unlink",
            Mutation::Rename { .. } => "rename",
            Mutation::Setattr { .. } => "setattr",
            Mutation::SetXattr { .. } => "set_xattr",
            Mutation::RemoveXattr { .. } => "remove_xattr",
            Mutation::GrowSize { .. } => "grow_size",
            Mutation::SetLayout { .. } => "set_layout",
            Mutation::MirrorState { .. } => "mirror_state",
            Mutation::PlaceMirror { .. } => "place_mirror",
            Mutation::Destroyed { .. } => "destroyed",
            Mutation::SkipInodes { .. } => "skip_inodes",
            Mutation::CreateAt { .. } => "create",
            Mutation::ReserveInodes { .. } => "reserve_inodes",
            Mutation::WriteMdt { .. } => "write_mdt",
            Mutation::SetXattrIf { .. } => "set_xattr",
            Mutation::Released { .. } => "released",
            Mutation::CreateUnnamed { .. } => "create",
            Mutation::MkdirOn { .. } | Mutation::MkdirForRemote { .. } => "create",
            Mutation::MkdirStriped { .. } | Mutation::MakeShard { .. } => "create",
            Mutation::SetDirStripe { .. } | Mutation::FreezeShard { .. } => "setattr",
            Mutation::RmdirShard { .. } => "unlink",
            Mutation::MoveOut { .. }
            | Mutation::LinkIn { .. }
            | Mutation::MoveDone { .. }
            | Mutation::MoveAbort { .. } => "rename",
            Mutation::DropLink { .. } | Mutation::Dropped { .. } => "unlink",
            Mutation::LinkOut { .. } | Mutation::LinkDone { .. } | Mutation::LinkAbort { .. } => {
                "link"
            }
            Mutation::PlaceOut { placing, .. } => match &*placing.step {
                Mutation::RmdirRemote { .. } => "unlink",
                _ => "create",
            },
            Mutation::PlaceDone { .. } => "unlink",
            Mutation::PlaceAbort { .. } => "setattr",
            Mutation::Reparent { .. } | Mutation::RenameLock { .. } => "rename",
            Mutation::HsmSet { .. } | Mutation::HsmLinks { .. } => "hsm",
            Mutation::HsmImport { .. } => "create",
            Mutation::HsmReimport { .. } => "setattr",
            Mutation::LinkRemoteDir { .. } => "link",
            Mutation::RmdirRemote { .. } => "unlink",
        }
    }
}

/// Most bytes one [`Mutation::WriteMdt`] carries (a journal record holds at most 1 MiB).
pub const MAX_MDT_WRITE: usize = 256 << 10;

/// Bits of a mode an inode keeps (permissions, setuid, setgid, sticky).
pub const PERM_MASK: u32 = 0o7777;

/// A new inode in directory `p`, as the MDS makes it: it takes the directory's group when that
/// is setgid, its encryption policy, and its default layout unless it brings one (a directory
/// passes it on to subdirectories too). A client answering a create before sending it makes the same.
#[allow(clippy::too_many_arguments)] // the fields of one Mutation::Create, and where
pub fn new_inode(
    fid: Fid,
    kind: Kind,
    mode: u32,
    target: &[u8],
    layout: Option<Layout>,
    p: &Inode,
    who: &Creds,
    now: Time,
) -> Inode {
    let gid = if p.mode & 0o2000 != 0 { p.gid } else { who.gid };
    let layout = match kind {
        Kind::Dir | Kind::File => layout.or_else(|| p.layout.clone()),
        _ => None,
    };
    Inode {
        fid,
        kind,
        mode: if kind == Kind::Symlink {
            0o777
        } else {
            mode & PERM_MASK
        },
        uid: who.uid,
        gid,
        nlink: if kind == Kind::Dir { 2 } else { 1 },
        size: if kind == Kind::Symlink {
            target.len() as u64
        } else {
            0
        },
        atime: now,
        mtime: now,
        ctime: now,
        // Everything made in an encrypted tree is encrypted under the tree's policy.
        xattrs: p
            .xattrs
            .get(crate::crypt::POLICY_XATTR)
            .map(|v| BTreeMap::from([(crate::crypt::POLICY_XATTR.to_string(), v.clone())]))
            .unwrap_or_default(),
        layout,
        target: target.to_vec(),
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
    /// The times given are the current time (UTIME_NOW, `touch`): write permission suffices.
    /// Other times may be set only by the owner.
    pub times_now: bool,
}

/// Carries out one mutation for `creds`: durable when answered, or with `behind`, applied when
/// answered and durable once the MDS's committed transaction number passes the reply's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReint {
    pub creds: Creds,
    pub mutation: Mutation,
    /// Names the request across resends: the MDS answers a resend of a request it already
    /// carried out with the reply it gave then, instead of doing it twice.
    pub req: Option<ReqId>,
    /// The `req` client had replies to every one of its requests numbered below this (Lustre's
    /// last-xid-replied): the MDS forgets those replies, and keeps every other until told.
    pub acked: u64,
    /// Also count an open of the regular file the mutation returns, under this handle (a
    /// create that opens, in one round trip); the matching close is an `MdsClose`.
    pub open: Option<OpenHandle>,
    /// With a `GrowSize`: apply it only if the file's size generation is still this one (no
    /// truncate since the writer learnt it); otherwise the call fails with `Stale` and the
    /// writer reads the true size from the objects.
    pub size_gen: Option<u64>,
    /// Answer as soon as the change is applied, before it is durable (commit-behind): the
    /// caller keeps the reply's ticket until the change is committed and replays it after an
    /// MDS restart ([`MdsReplay`]). Only for a client that joined with [`MdsConnect`].
    pub behind: bool,
    /// Lease the inode the change returns to the caller (the `req` client), when it may
    /// (see [`MdsLeaseWait`]).
    pub lease: bool,
    /// With a [`Mutation::CreateAt`] the client answered ahead: the time it stamped the new
    /// file with (and showed its caller). The MDS stamps the change with it, as Lustre's MDS
    /// takes the client's time for the change it makes, so the attributes the client gave out
    /// stay true; a time further than [`CLIENT_TIME_SKEW`] from the MDS's clock is not taken.
    pub time: Option<Time>,
}

impl MdsReint {
    /// `mutation` by `creds`, answered once durable: no request number (a resend is carried
    /// out again), no open, no lease, the MDS's time. What one server asks of another MDS.
    pub fn durable(creds: Creds, mutation: Mutation) -> MdsReint {
        MdsReint {
            creds,
            mutation,
            req: None,
            acked: 0,
            open: None,
            size_gen: None,
            behind: false,
            lease: false,
            time: None,
        }
    }
}

/// How far a client's clock may be from the MDS's for a create's time to be taken
/// ([`MdsReint::time`]): later by this much at most, or earlier (the create waited in the
/// client's queue) by [`CLIENT_TIME_LAG`] at most.
pub const CLIENT_TIME_SKEW: std::time::Duration = std::time::Duration::from_secs(1);

/// See [`CLIENT_TIME_SKEW`].
pub const CLIENT_TIME_LAG: std::time::Duration = std::time::Duration::from_secs(30);

/// A client's own numbering of its modifying requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReqId {
    /// Chosen at random by the client when it starts.
    pub client: u128,
    /// Increases with every request of that client.
    pub seq: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReintReply {
    /// The inode created, linked or changed, with fresh attributes.
    pub inode: Option<Inode>,
    /// False when a create without `exclusive` found the file there and opened it (the
    /// caller then checks its access as for any open); true otherwise.
    pub created: bool,
    /// The size generation of `inode` now: it moves on at every truncate (a size set).
    pub size_gen: u64,
    /// With `open`: capabilities for the file's objects.
    pub grant: Option<Grant>,
    /// The change's transaction number (0 when nothing changed).
    pub transno: u64,
    /// The MDS's last committed transaction number: every change up to it is durable.
    pub committed: u64,
    /// The MDS run (its instance) `transno` and `committed` are numbers of.
    pub instance: u64,
    /// With `behind` and a change not yet durable: what to replay it with after an MDS
    /// restart (sealed by the MDS; opaque to the client).
    #[serde(with = "crate::msg::bytes_field")]
    pub ticket: Vec<u8>,
    /// `inode` is leased to the caller.
    pub leased: bool,
    /// Every inode whose attributes or entries the change touched (the caller's own leases
    /// on them are not recalled: it updates what it caches itself).
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub changed: Vec<Fid>,
    /// The attributes the change left on the inodes of `changed` (other than `inode`) that
    /// the caller holds leases on, as of the change: a directory's new times and link count,
    /// a removed file's link count. The caller's cache takes them instead of asking again.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub after: Vec<Inode>,
}

/// Looks up `name` in `parent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsLookup {
    pub creds: Creds,
    pub parent: Fid,
    #[serde(with = "crate::msg::bytes_field")]
    pub name: Vec<u8>,
    /// The client asking, when it wants leases on `parent` and the entry found.
    pub lease: Option<u128>,
}

/// Most names in one [`MdsLookupPath`].
pub const MAX_PATH_NAMES: usize = 256;

/// Looks up `names` one below the other from `dir`, in one round trip: a path's components
/// (none of them `..`, which the client resolves by the path it walked). The walk stops after
/// a symlink, which the client follows itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsLookupPath {
    pub creds: Creds,
    pub dir: Fid,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub names: Vec<Name>,
}

/// One name, as a byte string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Name(#[serde(with = "crate::msg::bytes_field")] pub Vec<u8>);

/// The inodes walked, in order: all of `names`, or up to and including a symlink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsPath {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub inodes: Vec<Inode>,
}

impl Rpc for MdsLookupPath {
    const OPCODE: Opcode = opcodes::MDS_LOOKUP_PATH;
    type Reply = MdsPath;
}

/// An inode's attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsGetattr {
    pub fid: Fid,
    /// Who asks: xattrs come only to whom may read the file.
    pub creds: Creds,
    /// The client asking, when it wants a lease on `fid`.
    pub lease: Option<u128>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsInode {
    pub inode: Inode,
    /// The inode (and, for a lookup, the directory searched) is leased to the caller.
    pub leased: bool,
}

/// Up to `max` entries of `dir` after the name `after` (empty: from the start).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReaddir {
    pub creds: Creds,
    pub dir: Fid,
    #[serde(with = "crate::msg::bytes_field")]
    pub after: Vec<u8>,
    pub max: u32,
    /// Also return each entry's attributes (readdirplus).
    pub plus: bool,
    /// The client asking, when it wants a lease on `dir` (and, with `plus`, on the entries).
    pub lease: Option<u128>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    #[serde(with = "crate::msg::bytes_field")]
    pub name: Vec<u8>,
    pub fid: Fid,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsDirPage {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub entries: Vec<DirEntry>,
    /// With `plus`, each entry's attributes, in order: without layout, xattrs or symlink
    /// target, which are fetched on demand.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub attrs: Vec<Inode>,
    /// No entries after these.
    pub end: bool,
    /// `dir` (and, with `plus`, every entry of the page) is leased to the caller.
    pub leased: bool,
}

/// Names one open of a file across resends and MDS restarts: the client that opened it and
/// its own number for the handle. Opening and closing the same handle twice counts once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpenHandle {
    /// Chosen at random by the client when it starts (the [`ReqId`] client).
    pub client: u128,
    pub handle: u64,
}

/// A client opened the file: its objects outlive its names until the matching close. The
/// answer carries the file's attributes as of the open (close-to-open), so that an open by
/// FID is one round trip.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsOpen {
    pub fid: Fid,
    pub handle: OpenHandle,
    /// Who opens: the capability granted carries the access these credentials have.
    pub creds: Creds,
    /// The path the client opened, as it names it (for the audit log; the FID is what
    /// counts).
    pub path: Option<String>,
    /// The client opening, when it wants a lease on the file's attributes (a mount keeps the
    /// file's pages across opens while it holds one).
    pub lease: Option<u128>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsOpened {
    pub inode: Inode,
    /// The file's size generation now (see [`MdsReint::size_gen`]).
    pub size_gen: u64,
    /// Capabilities for the file's objects, with the access the credentials have. Sending
    /// the same open again renews them.
    pub grant: Grant,
    /// For a file with a Data-on-MDT component, opened with read access: the bytes the MDS
    /// keeps, up to the file's size (so a small file is opened and read in one round trip).
    #[serde(with = "crate::msg::bytes_field")]
    pub mdt: Vec<u8>,
    /// The file's attributes are leased to the opener (granted before `inode` was read).
    pub leased: bool,
}

/// The matching close.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsClose {
    pub fid: Fid,
    pub handle: OpenHandle,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsOpenDone {}

impl Rpc for MdsOpen {
    const OPCODE: Opcode = opcodes::MDS_OPEN;
    type Reply = MdsOpened;
}

impl Rpc for MdsClose {
    const OPCODE: Opcode = opcodes::MDS_CLOSE;
    type Reply = MdsOpenDone;
}

/// Most handles in one [`MdsReopen`].
pub const MAX_REOPEN: usize = 4096;

/// After the MDS restarted, a client counts again the handles it holds open (Lustre's open
/// replay). A file that lost its last name while open is counted again if its objects are
/// still kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReopen {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub handles: Vec<(Fid, OpenHandle)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReopened {
    /// Files of `handles` the MDS no longer has: neither a name nor kept objects.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub gone: Vec<Fid>,
}

impl Rpc for MdsReopen {
    const OPCODE: Opcode = opcodes::MDS_REOPEN;
    type Reply = MdsReopened;
}

/// A client holding files open says it is alive; the answer names the MDS's run, so that the
/// client sees a restart and reopens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsPing {
    pub client: u128,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsPong {
    /// Chosen at random each time the MDS starts.
    pub instance: u64,
    /// The last committed transaction number.
    pub committed: u64,
}

/// A client that keeps its uncommitted changes joins the MDS's table of clients: after an
/// MDS restart, recovery waits (for its window) for every client in the table to replay
/// before serving new requests. Durable when answered. Sent again after a restart, before
/// replaying.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsConnect {
    pub client: u128,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsConnected {
    pub instance: u64,
    pub committed: u64,
    /// The MDS is recovering: it waits for this client's replays and [`MdsReplayDone`].
    pub recovering: bool,
    /// While recovering: the last change of the run before that its journal kept. A client
    /// replays only its changes after it (Lustre's last_committed at reconnect): those up to
    /// it are there.
    pub recovered: u64,
}

impl Rpc for MdsConnect {
    const OPCODE: Opcode = opcodes::MDS_CONNECT;
    type Reply = MdsConnected;
}

/// One uncommitted change replayed after an MDS restart, in transaction order: the ticket of
/// its reply. Answered once it is durable again (or refused).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReplay {
    pub client: u128,
    pub transno: u64,
    #[serde(with = "crate::msg::bytes_field")]
    pub ticket: Vec<u8>,
    /// The MDS run the client connected to for this recovery ([`MdsConnected::instance`]):
    /// a replay resent to a later run is refused, and replayed again in that run's recovery.
    pub instance: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplayOutcome {
    /// Applied again, and durable.
    Applied,
    /// It was committed before the restart: nothing to do.
    Committed,
    /// It could not be applied (a change it depended on was lost with a client that did not
    /// come back, or recovery ended without it): the change is lost, and says why.
    Refused(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReplayed {
    pub outcome: ReplayOutcome,
}

impl Rpc for MdsReplay {
    const OPCODE: Opcode = opcodes::MDS_REPLAY;
    type Reply = MdsReplayed;
}

/// The client has replayed everything it held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReplayDone {
    pub client: u128,
    /// The MDS run the client connected to for this recovery: a later run refuses it (a
    /// resend that outlived the run it was meant for would end the later run's recovery
    /// before this client replayed there).
    pub instance: u64,
    /// The client still holds changes it answered ahead and had not sent when the MDS
    /// stopped: the MDS takes them (`MDS_BATCH`) once every client's replays are over and
    /// before anyone's new change, and the client says it is done again, without them, once
    /// they are answered.
    pub ahead: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReplayDoneAck {}

impl Rpc for MdsReplayDone {
    const OPCODE: Opcode = opcodes::MDS_REPLAY_DONE;
    type Reply = MdsReplayDoneAck;
}

/// Waits until every change the MDS has applied so far is durable (fsync of a file or a
/// directory, `sync`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsSync {}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsSynced {
    pub committed: u64,
    /// The MDS run `committed` is a number of.
    pub instance: u64,
}

impl Rpc for MdsSync {
    const OPCODE: Opcode = opcodes::MDS_SYNC;
    type Reply = MdsSynced;
}

/// A client leaves the table of clients (it holds nothing uncommitted: it synced first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsDisconnect {
    pub client: u128,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsDisconnected {}

impl Rpc for MdsDisconnect {
    const OPCODE: Opcode = opcodes::MDS_DISCONNECT;
    type Reply = MdsDisconnected;
}

impl Rpc for MdsPing {
    const OPCODE: Opcode = opcodes::MDS_PING;
    type Reply = MdsPong;
}

/// Most inodes one lease recall names; more wait for the next.
pub const MAX_RECALL: usize = 4096;

/// A client's channel for lease recalls, held open by the MDS (a long poll): the answer comes
/// as soon as a lease of this client must be recalled, or after a short hold with none.
///
/// A lease on an inode is the MDS's promise to tell its holder before the inode's attributes
/// or, for a directory, its entries change (an AFS callback, a Lustre lock's blocking AST). The
/// holder answers lookups, getattr and readdir from what it caches while the lease holds.
/// Leases hold for [`LEASE_TERM_MS`] after the holder sent the last wait that was answered; a
/// holder that does not acknowledge a recall loses all its leases, and the change goes ahead
/// once they have run out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsLeaseWait {
    pub client: u128,
    /// Every recall up to this number is done: the client dropped what it cached.
    pub acked: u64,
    /// The lease epoch the client knows (see [`MdsLeaseRecall::epoch`]).
    pub epoch: u64,
    /// This wait's number, counting up: the MDS takes a wait's cancels only if it is newer
    /// than every wait it took them from before, so a late copy of an old wait gives back
    /// nothing granted since.
    pub nr: u64,
    /// Leases the client gives back (its cache is full, or it did not keep an answer).
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub cancel: Vec<Fid>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsLeaseRecall {
    /// The MDS's run: a client seeing a new one drops every lease.
    pub instance: u64,
    /// The client's lease epoch: when it differs from the one the client knows, every lease
    /// it held is gone (it did not acknowledge a recall in time, or this is its first wait).
    pub epoch: u64,
    /// Leases recalled, numbered: the last is `seq`, the first `seq - fids.len() + 1`.
    pub seq: u64,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub fids: Vec<Fid>,
    /// How the MDS maps this client's identities, so that permission checks the client makes
    /// from its cache match the MDS's.
    pub idmap: IdMap,
}

impl Rpc for MdsLeaseWait {
    const OPCODE: Opcode = opcodes::MDS_LEASE_WAIT;
    type Reply = MdsLeaseRecall;
}

/// How long leases hold after the wait that last renewed them, in milliseconds.
pub const LEASE_TERM_MS: u64 = 5_000;

/// Most operations in one [`MdsBatch`].
pub const MAX_BATCH: usize = 512;
/// Most inode numbers one [`MdsReserve`] sets aside.
pub const MAX_RESERVE: u32 = 4096;
/// Reservations the MDS keeps per client: the last this many it gave. A create naming a FID of
/// an older one is refused, so a client asks for a new range only once every create from the
/// one it pushes out has been answered.
pub const RESERVATIONS_KEPT: usize = 3;

/// One operation of a batch.
#[allow(clippy::large_enum_variant)] // nearly every operation is a change
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOp {
    Reint(MdsReint),
    Close(MdsClose),
}

/// Several changes and closes in one round trip, carried out in order, each as if sent alone
/// (a failed one does not stop the next). A client sends the changes it answered before
/// sending them (asynchronous creates and unlinks, closes) this way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsBatch {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub ops: Vec<BatchOp>,
}

/// What one operation of a batch came to.
#[allow(clippy::large_enum_variant)] // nearly every operation is a change
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchResult {
    Reint(MdsReintReply),
    Closed,
    Failed(crate::RemoteError),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsBatched {
    /// One per operation, in order.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub results: Vec<BatchResult>,
}

impl Rpc for MdsBatch {
    const OPCODE: Opcode = opcodes::MDS_BATCH;
    type Reply = MdsBatched;
}

/// Sets aside `count` inode numbers (at most [`MAX_RESERVE`]) for `client`, which must have
/// joined ([`MdsConnect`]): its creates may then name them ([`Mutation::CreateAt`]). The
/// reservation is durable before it is answered and lasts while the client stays in the
/// table; the client's older reservations beyond the last [`RESERVATIONS_KEPT`] lapse.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReserve {
    pub client: u128,
    pub count: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReserved {
    /// The first FID set aside; the others follow it (`oid` counting up).
    pub first: Fid,
    pub count: u32,
}

impl Rpc for MdsReserve {
    const OPCODE: Opcode = opcodes::MDS_RESERVE;
    type Reply = MdsReserved;
}

/// Reads `len` bytes at `offset` of the part of a file the MDS keeps (Data-on-MDT), through
/// the open `handle` (or, without one, with the read permission of `creds`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsReadMdt {
    pub fid: Fid,
    pub handle: Option<OpenHandle>,
    pub creds: Creds,
    pub offset: u64,
    pub len: u32,
    /// The client asking, when it wants a lease on the file (the bytes then hold until it is
    /// recalled).
    pub lease: Option<u128>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsMdtData {
    /// The bytes, cut at the file's size (and at the end of what the MDS keeps).
    #[serde(with = "crate::msg::bytes_field")]
    pub data: Vec<u8>,
    /// The file's attributes as the bytes were read.
    pub inode: Inode,
    pub leased: bool,
}

impl Rpc for MdsReadMdt {
    const OPCODE: Opcode = opcodes::MDS_READ_MDT;
    type Reply = MdsMdtData;
}

/// Asks that `client`, holding the only lease on directory `dir`, hold it alone: until it is
/// recalled, the MDS recalls it before serving any other client a lookup in the directory,
/// its listing or its attributes, as well as before any other client's change there. The
/// holder may then answer creates and unlinks in it before sending them (it sends them before
/// it acknowledges a recall), and every other client still sees them at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsLeaseAlone {
    pub client: u128,
    pub dir: Fid,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsLeaseAloneReply {
    /// False when another client holds a lease on the directory too, it is being recalled,
    /// or the asker holds none.
    pub granted: bool,
}

impl Rpc for MdsLeaseAlone {
    const OPCODE: Opcode = opcodes::MDS_LEASE_ALONE;
    type Reply = MdsLeaseAloneReply;
}

/// What the identities a client claims become at the MDS.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    /// Every identity is taken as claimed.
    pub identity: bool,
    /// Root keeps uid and gid 0; otherwise they become `squash_uid` and `squash_gid`.
    pub trusted: bool,
    pub squash_uid: u32,
    pub squash_gid: u32,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub uids: Vec<(u32, u32)>,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub gids: Vec<(u32, u32)>,
}

impl IdMap {
    /// The identity `creds` become.
    pub fn map(&self, creds: Creds) -> Creds {
        if self.identity {
            return creds;
        }
        // On a node with a map, an id the map does not list is squashed (Lustre's mapped
        // nodemaps): a node's users reach only the identities the operator gave them.
        let map = |pairs: &[(u32, u32)], id: u32, squash: u32| {
            if pairs.is_empty() {
                return id;
            }
            pairs
                .iter()
                .find(|(from, _)| *from == id)
                .map_or(squash, |(_, to)| *to)
        };
        let uid = |id: u32| match id {
            0 if self.trusted => 0,
            0 => self.squash_uid,
            _ => map(&self.uids, id, self.squash_uid),
        };
        let gid = |id: u32| match id {
            0 if self.trusted => 0,
            0 => self.squash_gid,
            _ => map(&self.gids, id, self.squash_gid),
        };
        Creds {
            uid: uid(creds.uid),
            gid: gid(creds.gid),
            groups: creds.groups.into_iter().map(gid).collect(),
        }
    }
}

/// Most files in one [`MdsMirrorScanned`].
pub const MAX_MIRROR_SCAN: u32 = 4096;

/// Files that need a mirror's care, in FID order after `after`: with `stale`, files with a
/// stale mirror; with `target`, files with an object on that target (their mirrors there
/// named in `on_target`). Up to `max` (at most [`MAX_MIRROR_SCAN`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsMirrorScan {
    pub after: Option<Fid>,
    pub max: u32,
    pub stale: bool,
    pub target: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScannedFile {
    pub fid: Fid,
    pub size: u64,
    pub mirrors: u16,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub stale: Vec<u16>,
    /// The mirrors with an object on the target asked about.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub on_target: Vec<u16>,
    /// The targets of each stale mirror's objects.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub stale_targets: Vec<u32>,
    /// Some client holds the file open.
    pub open: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsMirrorScanned {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub files: Vec<ScannedFile>,
    /// No files after these.
    pub end: bool,
}

impl Rpc for MdsMirrorScan {
    const OPCODE: Opcode = opcodes::MDS_MIRROR_SCAN;
    type Reply = MdsMirrorScanned;
}

/// The filesystem's totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsStatfs {}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStats {
    /// Inodes this MDT holds.
    pub inodes: u64,
    /// Bytes of the storage targets that are up, and free there.
    pub total: u64,
    pub free: u64,
    pub targets: u32,
    pub targets_up: u32,
    /// The MDT answering, and the bytes of the device its journal is on, and free there (0
    /// where it is not on a device).
    pub mdt: u32,
    pub mdt_total: u64,
    pub mdt_free: u64,
}

impl Rpc for MdsStatfs {
    const OPCODE: Opcode = opcodes::MDS_STATFS;
    type Reply = FsStats;
}

/// Most entries in one readdir reply.
pub const MAX_READDIR: u32 = 4096;

/// Longest directory whose listing is leased: the MDS grants no leases with the pages of a
/// longer one (a client would keep no such listing, and the leases of its entries would only
/// be granted to be given back).
pub const MAX_LEASED_LISTING: usize = 65_536;

impl Rpc for MdsReint {
    const OPCODE: Opcode = opcodes::MDS_REINT;
    type Reply = MdsReintReply;
}

impl Rpc for MdsLookup {
    const OPCODE: Opcode = opcodes::MDS_LOOKUP;
    type Reply = MdsInode;
}

impl Rpc for MdsGetattr {
    const OPCODE: Opcode = opcodes::MDS_GETATTR;
    type Reply = MdsInode;
}

impl Rpc for MdsReaddir {
    const OPCODE: Opcode = opcodes::MDS_READDIR;
    type Reply = MdsDirPage;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{decode_body, encode_body};

    #[test]
    fn a_time_with_nanoseconds_past_a_second_is_refused_and_none_panics() {
        #[derive(Serialize)]
        struct Raw {
            sec: i64,
            nsec: u32,
        }
        let bad = encode_body(&Raw {
            sec: 1,
            nsec: 1_000_000_000,
        })
        .unwrap();
        assert!(decode_body::<Time>(&bad).is_err());
        for sec in [i64::MAX, i64::MIN, 0, -1] {
            let raw = encode_body(&Raw {
                sec,
                nsec: 999_999_999,
            })
            .unwrap();
            let t: Time = decode_body(&raw).unwrap();
            let _ = t.to_system_time();
        }
    }
}
