//! A storage target (an OST): a directory of objects in a hashed tree, as Lustre keeps them on
//! ldiskfs, and the counter that names new objects.
//!
//! ```text
//! <root>/TARGET                      magic, version u32, index u32, uuid u128, filesystem
//!                                    u128 (48 bytes; index 0xffffffff until the MDS assigns
//!                                    one, filesystem 0 until the first registration; the
//!                                    first version had 32 bytes and no filesystem)
//! <root>/LAST_ID                     the highest object id handed out (u64, little-endian)
//! <root>/DEAD                        "LODEDEAD" | one bit per object id: destroyed
//! <root>/EPOCH                       durability epoch (u64) | boot id length u8 | boot id
//! <root>/O/<seq>/d<oid % 32>/<oid>     object data (hex names)
//! <root>/O/<seq>/d<oid % 32>/<oid>.cs  its checksums and size
//! <root>/O/<seq>/LAST_ID, DEAD        the same as LAST_ID and DEAD, for an MDT other than 0
//! ```
//!
//! Each MDT allocates objects on the target in a sequence of its own
//! ([`proto::fid::object_seq`]): MDT0's objects of target `i` have FIDs in sequence
//! `OST_SEQ_BASE + i`, with LAST_ID and DEAD beside TARGET, as before there were several MDTs;
//! another MDT's sequence, with its own LAST_ID and DEAD in its directory under `O/`, is made at
//! its first precreate. Everything below holds per sequence: one MDT's precreates and orphan
//! cleanups never touch another's ids. A precreate only moves
//! LAST_ID on, durably, so an id is never handed out twice, even across a crash. An object's
//! files are made at its first write (or truncate), and their directory entries are durable
//! before its first sync is answered: until then the object is empty, as a new file is. Most
//! files are never written beyond their first component or at all, and a create costs the
//! storage server nothing.
//!
//! An id is then in one of three states: handed out and not written (no files: reads as
//! empty), written (files), or destroyed (its bit in DEAD, made durable before its files go).
//! A destroyed object is not found, as it was when precreated objects had files, so a late
//! write from a client holding an old layout fails instead of bringing the object back. A
//! target made before DEAD existed gets it at its first open: every id up to LAST_ID without
//! files was destroyed. The bitmap's magic is written last, so a crash while it is built
//! builds it again.
//!
//! The durability epoch counts the machine boots under which the target was opened: it goes
//! up when the target opens under a boot id other than the one recorded (the machine
//! restarted, and writes not synced before may be gone) and stays when only the process
//! restarted. Clients compare the epoch their writes were answered under with the one their
//! sync is answered under.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use proto::Fid;

use crate::engine::{AlignedBuf, Engine, FileHandle, OpenMode, Space};
use crate::error::TargetError;
use crate::io_policy::IoPolicy;
use crate::object::Object;

type Result<T> = std::result::Result<T, TargetError>;

pub use proto::fid::OST_SEQ_BASE;
use proto::fid::{object_owner, object_seq};
/// Most objects created by one precreate.
pub const MAX_PRECREATE: u32 = 20_000;
/// Written objects an orphan cleanup destroys without an operator's word when they are more
/// than a tenth of the target's: an MDS crash leaves a few files written whose creates were
/// lost with it, never a target's worth.
pub const MAX_ORPHANS: usize = 64;
/// Objects kept open at once; beyond it, idle ones are closed.
pub const MAX_OPEN_OBJECTS: usize = 4096;
/// Subdirectories per sequence.
const FANOUT: u32 = 32;
/// Files of destroyed objects kept per object directory for new objects to take (see
/// [`Target::keep_free`]).
const FREE_PER_DIR: usize = 256;
/// A destroyed object's data file this large or larger is removed rather than kept.
const FREE_MAX_BYTES: u64 = 1 << 20;
/// How the names of kept files start (never a hexadecimal object id).
const FREE_PREFIX: &str = "free.";

const TARGET_MAGIC: [u8; 8] = *b"LODEOST\0";
const DEAD_MAGIC: [u8; 8] = *b"LODEDEAD";
/// Where DEAD's bitmap starts.
const DEAD_HEAD: u64 = 8;
/// The label's version: 2 added the filesystem the target is bound to.
const TARGET_VERSION: u32 = 2;
/// The label's length (the first version's was 32 bytes).
const LABEL_LEN: usize = 48;
const UNASSIGNED: u32 = u32::MAX;

/// What a target's `TARGET` file says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    /// `None` until the MDS assigns one.
    pub index: Option<u32>,
    /// Chosen when the target is formatted.
    pub uuid: u128,
    /// The filesystem whose MDS it first registered with; `None` until then.
    pub fs: Option<u128>,
}

/// What a scrub found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScrubReport {
    pub objects: u64,
    pub bytes: u64,
    /// (object, offset of the bad block)
    pub bad: Vec<(Fid, u64)>,
}

/// The objects one MDT allocates on a target: their sequence, the highest id handed out and
/// the ids destroyed.
struct Sequence {
    mdt: u32,
    seq: u64,
    /// Where its LAST_ID and DEAD are.
    home: PathBuf,
    last_id_file: FileHandle,
    /// The highest object id handed out; held across a precreate.
    last_id: tokio::sync::Mutex<u32>,
    /// The same, for readers that must not wait on a precreate.
    allocated: AtomicU32,
    dead_file: FileHandle,
    /// DEAD's bitmap: bit `oid % 8` of byte `oid / 8` is set when the object was destroyed.
    dead: Mutex<Vec<u8>>,
    /// One writer of DEAD at a time.
    dead_io: tokio::sync::Mutex<()>,
    /// Held by an orphan cleanup: one at a time, each seeing what the one before left.
    cleanup: tokio::sync::Mutex<()>,
    /// The MDS run whose cleanup came last, and the highest id then handed out.
    cleaned: Mutex<Option<(u64, u32)>>,
    /// Per object directory, the files of destroyed objects kept there, emptied, for new
    /// objects: a rename costs the file system far less than making a file (ext4 without a
    /// journal scans past every recently freed inode to allocate one). Changed only under
    /// the target's `opening`, or (adding) once set aside under it and emptied.
    free: Mutex<Vec<Vec<String>>>,
}

impl Sequence {
    /// MDT `mdt`'s sequence `seq`, its files in `home`: LAST_ID opened with the id it holds,
    /// DEAD opened with its bitmap.
    fn new(
        mdt: u32,
        seq: u64,
        home: PathBuf,
        (last_id_file, last): (FileHandle, u32),
        (dead_file, dead): (FileHandle, Vec<u8>),
    ) -> Sequence {
        Sequence {
            mdt,
            seq,
            home,
            last_id_file,
            last_id: tokio::sync::Mutex::new(last),
            allocated: AtomicU32::new(last),
            dead_file,
            dead: Mutex::new(dead),
            dead_io: tokio::sync::Mutex::new(()),
            cleanup: tokio::sync::Mutex::new(()),
            cleaned: Mutex::new(None),
            free: Mutex::new(vec![vec![]; FANOUT as usize]),
        }
    }

    fn is_dead(&self, oid: u32) -> bool {
        let d = self.dead.lock();
        d.get(oid as usize / 8)
            .is_some_and(|b| b & (1 << (oid % 8)) != 0)
    }

    /// Whether `oid` was handed out and not destroyed.
    fn live(&self, oid: u32) -> bool {
        oid != 0 && oid <= self.allocated.load(Ordering::SeqCst) && !self.is_dead(oid)
    }
}

pub struct Target {
    index: u32,
    root: PathBuf,
    engine: Arc<dyn Engine>,
    /// MDT0's sequence.
    first: Arc<Sequence>,
    /// The other MDTs' sequences, by MDT.
    others: Mutex<HashMap<u32, Arc<Sequence>>>,
    /// One maker of a new sequence at a time.
    making: tokio::sync::Mutex<()>,
    objects: Mutex<HashMap<Fid, Arc<Object>>>,
    opening: tokio::sync::Mutex<()>,
    /// The durability epoch; moved on (durably) by a failed sync too.
    epoch: std::sync::atomic::AtomicU64,
    /// One writer of EPOCH at a time.
    epoch_io: tokio::sync::Mutex<()>,
    /// Per client, the oldest write it still waits on (see [`proto::ost::WriteStamp`]).
    floors: Mutex<HashMap<u64, u64>>,
    /// The filesystem it is bound to, as its label said at open.
    fs: Option<u128>,
    /// The operator's word for this run ([`Target::trust_mds_objects`]).
    trust_mds: std::sync::atomic::AtomicBool,
    /// Which data I/O goes through the page cache (see [`crate::io_policy`]).
    io: Mutex<IoPolicy>,
}

/// Clients whose write order is remembered; past it, the table starts again (ordering then
/// rests on the objects' own records).
const MAX_CLIENTS: usize = 65_536;

fn word(b: &[u8], at: usize, n: usize) -> u64 {
    b[at..at + n]
        .iter()
        .rev()
        .fold(0, |a, &x| a << 8 | u64::from(x))
}

impl Target {
    /// Creates an empty target in `root`, identified by `uuid`, with its index if known.
    pub async fn format(
        engine: &Arc<dyn Engine>,
        root: &Path,
        uuid: u128,
        index: Option<u32>,
    ) -> Result<()> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        engine.create_dir_all(root).map_err(err("create"))?;
        let last = engine
            .open(&root.join("LAST_ID"), OpenMode::CreateNew, false)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EEXIST) => {
                    TargetError::Invalid(format!("{} is already formatted", root.display()))
                }
                _ => TargetError::target(format!("{} create", root.display()), e),
            })?;
        engine
            .write_at(&last, 0, AlignedBuf::zeroed(8))
            .await
            .1
            .map_err(err("write LAST_ID"))?;
        engine.sync(&last).await.map_err(err("sync LAST_ID"))?;
        Self::write_dead(engine, root, &[]).await?;
        // TARGET last: a directory with a TARGET file is a whole target.
        let label = Label {
            index,
            uuid,
            fs: None,
        };
        Self::write_label(engine, root, &label, OpenMode::CreateNew).await?;
        engine.sync_dir(root).map_err(err("sync"))
    }

    async fn write_label(
        engine: &Arc<dyn Engine>,
        root: &Path,
        label: &Label,
        mode: OpenMode,
    ) -> Result<()> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        let f = engine
            .open(&root.join("TARGET"), mode, false)
            .map_err(err("open TARGET"))?;
        let mut head = AlignedBuf::zeroed(LABEL_LEN);
        head[..8].copy_from_slice(&TARGET_MAGIC);
        head[8..12].copy_from_slice(&TARGET_VERSION.to_le_bytes());
        head[12..16].copy_from_slice(&label.index.unwrap_or(UNASSIGNED).to_le_bytes());
        head[16..32].copy_from_slice(&label.uuid.to_le_bytes());
        head[32..48].copy_from_slice(&label.fs.unwrap_or(0).to_le_bytes());
        engine
            .write_at(&f, 0, head)
            .await
            .1
            .map_err(err("write TARGET"))?;
        engine.sync(&f).await.map_err(err("sync TARGET"))
    }

    /// The label of the target in `root`: its index (if assigned), uuid and filesystem (if
    /// bound). A label of the first version (no filesystem) reads as unbound.
    pub async fn label(engine: &Arc<dyn Engine>, root: &Path) -> Result<Label> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        let target = engine
            .open(&root.join("TARGET"), OpenMode::Existing, false)
            .map_err(err("open TARGET (is it formatted?)"))?;
        let (head, r) = engine
            .read_at(&target, 0, AlignedBuf::zeroed(LABEL_LEN))
            .await;
        let got = r.map_err(err("read TARGET"))?;
        let version = if got >= 12 { word(&head, 8, 4) } else { 0 };
        let whole = match version {
            1 => got >= 32,
            2 => got >= LABEL_LEN,
            _ => false,
        };
        if !whole || head[..8] != TARGET_MAGIC {
            return Err(TargetError::Damaged(format!(
                "{}/TARGET is not a lode target",
                root.display()
            )));
        }
        let index = word(&head, 12, 4) as u32;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&head[16..32]);
        let fs = if version >= 2 {
            let mut fs = [0u8; 16];
            fs.copy_from_slice(&head[32..48]);
            Some(u128::from_le_bytes(fs)).filter(|f| *f != 0)
        } else {
            None
        };
        Ok(Label {
            index: (index != UNASSIGNED).then_some(index),
            uuid: u128::from_le_bytes(uuid),
            fs,
        })
    }

    /// Records what the MDS of filesystem `fs` answered at registration: the index it
    /// assigned, and the filesystem, which the target keeps from then on. Refused if the
    /// target has another index, or belongs to another filesystem.
    pub async fn bind(engine: &Arc<dyn Engine>, root: &Path, index: u32, fs: u128) -> Result<()> {
        let current = Self::label(engine, root).await?;
        match current.index {
            Some(i) if i != index => {
                return Err(TargetError::Invalid(format!(
                    "{} already has index {i}",
                    root.display()
                )))
            }
            _ => {}
        }
        match current.fs {
            Some(f) if f != fs => Err(TargetError::Refused(format!(
                "{} belongs to filesystem {f:032x}, not to {fs:032x}, which the MDS serves",
                root.display()
            ))),
            Some(_) if current.index == Some(index) => Ok(()),
            _ => {
                let bound = Label {
                    index: Some(index),
                    fs: Some(fs),
                    ..current
                };
                Self::write_label(engine, root, &bound, OpenMode::Existing).await
            }
        }
    }

    /// Opens a formatted target whose index is assigned.
    pub async fn open(engine: Arc<dyn Engine>, root: &Path) -> Result<Target> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        let label = Self::label(&engine, root).await?;
        let index = label
            .index
            .ok_or_else(|| TargetError::Invalid(format!("{} has no index yet", root.display())))?;
        let (last_id_file, last) = Self::read_last_id(&engine, root, OpenMode::Existing).await?;
        let epoch = Self::next_epoch(&engine, root).await?;
        let (dead_file, dead) = match Self::read_dead(&engine, root).await? {
            Some(d) => d,
            None => {
                // Made before objects were created at their first write: every id handed
                // out without files was destroyed.
                let mut bits = vec![0u8; last as usize / 8 + 1];
                for oid in 1..=last {
                    bits[oid as usize / 8] |= 1 << (oid % 8);
                }
                let seq = object_seq(index, 0);
                for fid in list_objects(&engine, root, seq)? {
                    if fid.oid <= last {
                        bits[fid.oid as usize / 8] &= !(1 << (fid.oid % 8));
                    }
                }
                tracing::info!(root = %root.display(), "recording the destroyed objects of a target made before DEAD");
                Self::write_dead(&engine, root, &bits).await?;
                Self::read_dead(&engine, root).await?.ok_or_else(|| {
                    TargetError::Damaged(format!("{}/DEAD was not written", root.display()))
                })?
            }
        };
        let first = Arc::new(Sequence::new(
            0,
            object_seq(index, 0),
            root.to_path_buf(),
            (last_id_file, last),
            (dead_file, dead),
        ));
        let target = Target {
            index,
            root: root.to_path_buf(),
            engine,
            first,
            others: Mutex::new(HashMap::new()),
            making: tokio::sync::Mutex::new(()),
            objects: Mutex::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
            epoch: epoch.into(),
            epoch_io: tokio::sync::Mutex::new(()),
            floors: Mutex::new(HashMap::new()),
            fs: label.fs,
            trust_mds: Default::default(),
            io: Mutex::new(IoPolicy::default()),
        };
        // The other MDTs' sequences: every directory under O/ that one of them made.
        let objects_dir = root.join("O");
        let listed = match target.engine.list(&objects_dir) {
            Ok(l) => l,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => vec![],
            Err(e) => return Err(err("list O")(e)),
        };
        for p in listed {
            let owner = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| u64::from_str_radix(n, 16).ok())
                .and_then(|seq| object_owner(seq).map(|o| (seq, o)));
            match owner {
                Some((seq, (i, mdt))) if i == index && mdt != 0 => {
                    let sq = target.make_sequence(mdt, seq).await?;
                    target.others.lock().insert(mdt, Arc::new(sq));
                }
                Some((_, (i, 0))) if i == index => {}
                _ => {
                    tracing::warn!(dir = %p.display(), "a directory under O/ that is no sequence of this target's: left alone");
                }
            }
        }
        let mut sequences = vec![target.first.clone()];
        sequences.extend(target.others.lock().values().cloned());
        for sq in &sequences {
            target.open_sequence(sq).await?;
        }
        Ok(target)
    }

    /// Makes ready the object directories of a sequence just opened or made: made if
    /// missing, kept files of the last run dropped, synced.
    async fn open_sequence(&self, sq: &Sequence) -> Result<()> {
        let err = |what: &str| {
            let what = format!("{} {what}", self.root.display());
            move |e| TargetError::target(what, e)
        };
        for d in 0..FANOUT {
            self.engine
                .create_dir_all(&object_dir(&self.root, sq.seq, d))
                .map_err(err("create object directories"))?;
        }
        self.drop_kept(sq.seq)?;
        // Objects made by an earlier run may have files whose directory entries were never
        // synced (the run died before their first sync): their first sync in this run does
        // not sync the directory, so every object directory is synced once now.
        for d in 0..FANOUT {
            let dir = object_dir(&self.root, sq.seq, d);
            self.engine
                .sync_dir(&dir)
                .map_err(|e| TargetError::target(format!("sync {}", dir.display()), e))?;
        }
        // A target whose DEAD predates the room kept for every id handed out gets it now; on
        // a full disk, later (its next precreate).
        let last = *sq.last_id.lock().await;
        if let Err(e) = self.room_in_dead(sq, last).await {
            tracing::warn!(root = %self.root.display(), mdt = sq.mdt, error = %e, "no room yet in DEAD for every object id handed out");
        }
        Ok(())
    }

    /// LAST_ID in `home`, opened with `mode`, and the id it holds.
    async fn read_last_id(
        engine: &Arc<dyn Engine>,
        home: &Path,
        mode: OpenMode,
    ) -> Result<(FileHandle, u32)> {
        let err = |what: &str| {
            let what = format!("{} {what}", home.display());
            move |e| TargetError::target(what, e)
        };
        let f = engine
            .open(&home.join("LAST_ID"), mode, false)
            .map_err(err("open LAST_ID"))?;
        let (raw, r) = engine.read_at(&f, 0, AlignedBuf::zeroed(8)).await;
        if r.map_err(err("read LAST_ID"))? < 8 {
            return Err(TargetError::Damaged(format!(
                "{}/LAST_ID is short",
                home.display()
            )));
        }
        let last = u32::try_from(word(&raw, 0, 8)).map_err(|_| {
            TargetError::Damaged(format!("{}/LAST_ID is out of range", home.display()))
        })?;
        Ok((f, last))
    }

    /// MDT `mdt`'s sequence `seq` in `O/<seq>/`: opened, or made (or its making, cut by a
    /// crash, finished). A sequence's DEAD is finished last, and ids are handed out only
    /// after: one whose DEAD is unfinished never handed any out, and starts again empty.
    async fn make_sequence(&self, mdt: u32, seq: u64) -> Result<Sequence> {
        let home = self.root.join("O").join(format!("{seq:x}"));
        let err = |what: &str| {
            let what = format!("{} {what}", home.display());
            move |e| TargetError::target(what, e)
        };
        let (last_id_file, last, dead_file, dead) = match Self::read_dead(&self.engine, &home)
            .await?
        {
            Some((dead_file, dead)) => {
                let (f, last) = Self::read_last_id(&self.engine, &home, OpenMode::Existing).await?;
                (f, last, dead_file, dead)
            }
            None => {
                self.engine.create_dir_all(&home).map_err(err("create"))?;
                let f = self
                    .engine
                    .open(&home.join("LAST_ID"), OpenMode::Create, false)
                    .map_err(err("open LAST_ID"))?;
                self.engine
                    .write_at(&f, 0, AlignedBuf::zeroed(8))
                    .await
                    .1
                    .map_err(err("write LAST_ID"))?;
                self.engine.sync(&f).await.map_err(err("sync LAST_ID"))?;
                Self::write_dead(&self.engine, &home, &[]).await?;
                self.engine
                    .sync_dir(&self.root.join("O"))
                    .map_err(err("sync O"))?;
                let (dead_file, dead) =
                    Self::read_dead(&self.engine, &home).await?.ok_or_else(|| {
                        TargetError::Damaged(format!("{}/DEAD was not written", home.display()))
                    })?;
                tracing::info!(target = self.index, mdt, "a new object sequence for an MDT");
                (f, 0, dead_file, dead)
            }
        };
        Ok(Sequence::new(
            mdt,
            seq,
            home,
            (last_id_file, last),
            (dead_file, dead),
        ))
    }

    /// MDT `mdt`'s sequence, if it has one here.
    fn sequence(&self, mdt: u32) -> Option<Arc<Sequence>> {
        if mdt == 0 {
            Some(self.first.clone())
        } else {
            self.others.lock().get(&mdt).cloned()
        }
    }

    /// The sequence `fid` belongs to, if it is one of this target's.
    fn sequence_of(&self, fid: Fid) -> Option<Arc<Sequence>> {
        if fid.seq == self.first.seq {
            return Some(self.first.clone());
        }
        match object_owner(fid.seq) {
            Some((i, mdt)) if i == self.index => self.sequence(mdt),
            _ => None,
        }
    }

    /// MDT `mdt`'s sequence, made at its first use.
    async fn sequence_made(&self, mdt: u32) -> Result<Arc<Sequence>> {
        if let Some(sq) = self.sequence(mdt) {
            return Ok(sq);
        }
        if mdt >= proto::fid::MAX_MDTS {
            return Err(TargetError::Invalid(format!(
                "MDT {mdt} is past the most a filesystem has ({})",
                proto::fid::MAX_MDTS
            )));
        }
        let _one = self.making.lock().await;
        if let Some(sq) = self.sequence(mdt) {
            return Ok(sq);
        }
        let sq = self.make_sequence(mdt, object_seq(self.index, mdt)).await?;
        self.open_sequence(&sq).await?;
        let sq = Arc::new(sq);
        self.others.lock().insert(mdt, sq.clone());
        Ok(sq)
    }

    /// Writes DEAD whole: the bitmap, then (once it is durable) the magic that says it is.
    async fn write_dead(engine: &Arc<dyn Engine>, root: &Path, bits: &[u8]) -> Result<()> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        let f = engine
            .open(&root.join("DEAD"), OpenMode::Create, false)
            .map_err(err("open DEAD"))?;
        engine
            .write_at(&f, 0, AlignedBuf::zeroed(DEAD_HEAD as usize))
            .await
            .1
            .map_err(err("write DEAD"))?;
        engine
            .set_len(&f, DEAD_HEAD + bits.len() as u64)
            .map_err(err("size DEAD"))?;
        if !bits.is_empty() {
            let mut buf = AlignedBuf::zeroed(bits.len());
            buf.copy_from_slice(bits);
            engine
                .write_at(&f, DEAD_HEAD, buf)
                .await
                .1
                .map_err(err("write DEAD"))?;
        }
        engine.sync(&f).await.map_err(err("sync DEAD"))?;
        let mut head = AlignedBuf::zeroed(DEAD_HEAD as usize);
        head.copy_from_slice(&DEAD_MAGIC);
        engine
            .write_at(&f, 0, head)
            .await
            .1
            .map_err(err("write DEAD"))?;
        engine.sync(&f).await.map_err(err("sync DEAD"))?;
        engine.sync_dir(root).map_err(err("sync"))
    }

    /// DEAD and its bitmap, or `None` if it is missing or was never finished.
    async fn read_dead(
        engine: &Arc<dyn Engine>,
        root: &Path,
    ) -> Result<Option<(FileHandle, Vec<u8>)>> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        let f = match engine.open(&root.join("DEAD"), OpenMode::Existing, false) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(err("open DEAD")(e)),
        };
        let len = engine.len(&f).map_err(err("size DEAD"))?;
        if len < DEAD_HEAD {
            return Ok(None);
        }
        let (raw, r) = engine
            .read_at(&f, 0, AlignedBuf::zeroed(len as usize))
            .await;
        if (r.map_err(err("read DEAD"))? as u64) < len || raw[..8] != DEAD_MAGIC {
            return Ok(None);
        }
        Ok(Some((f, raw[DEAD_HEAD as usize..].to_vec())))
    }

    /// Records the ids `oids` of sequence `sq` destroyed, durably: the bytes they touch are
    /// written in runs, and DEAD is synced once.
    async fn mark_dead(&self, sq: &Sequence, oids: impl IntoIterator<Item = u32>) -> Result<()> {
        /// Bytes between two touched ones that are written rather than starting a new run.
        const GAP: usize = 512;
        let _one = sq.dead_io.lock().await;
        let runs: Vec<(usize, AlignedBuf)> = {
            let mut d = sq.dead.lock();
            let mut touched: Vec<usize> = vec![];
            for oid in oids {
                let at = oid as usize / 8;
                if d.len() <= at {
                    d.resize(at + 1, 0);
                }
                d[at] |= 1 << (oid % 8);
                touched.push(at);
            }
            touched.sort_unstable();
            touched.dedup();
            let mut spans: Vec<(usize, usize)> = vec![];
            for at in touched {
                match spans.last_mut() {
                    Some((_, end)) if at <= *end + GAP => *end = at,
                    _ => spans.push((at, at)),
                }
            }
            spans
                .into_iter()
                .map(|(first, last)| {
                    let mut buf = AlignedBuf::zeroed(last - first + 1);
                    buf.copy_from_slice(&d[first..=last]);
                    (first, buf)
                })
                .collect()
        };
        if runs.is_empty() {
            return Ok(());
        }
        let err = |e| TargetError::target(format!("{}/DEAD", sq.home.display()), e);
        for (first, buf) in runs {
            self.engine
                .write_at(&sq.dead_file, DEAD_HEAD + first as u64, buf)
                .await
                .1
                .map_err(err)?;
        }
        self.engine.sync(&sq.dead_file).await.map_err(err)
    }

    /// EPOCH, opened (made if missing), and this boot's id as it is recorded there.
    fn epoch_file(engine: &Arc<dyn Engine>, root: &Path) -> Result<(FileHandle, String)> {
        let f = engine
            .open(&root.join("EPOCH"), OpenMode::Create, false)
            .map_err(|e| TargetError::target(format!("{} open EPOCH", root.display()), e))?;
        let mut boot = engine.boot_id();
        // At most 64 bytes are kept (a boot id is ASCII; a longer one is cut where a char
        // begins).
        let mut cut = boot.len().min(64);
        while !boot.is_char_boundary(cut) {
            cut -= 1;
        }
        boot.truncate(cut);
        Ok((f, boot))
    }

    /// Reads the durability epoch, moving it on (durably) if the machine booted since.
    async fn next_epoch(engine: &Arc<dyn Engine>, root: &Path) -> Result<u64> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        let (f, boot) = Self::epoch_file(engine, root)?;
        let boot = boot.as_bytes();
        let (raw, r) = engine.read_at(&f, 0, AlignedBuf::zeroed(128)).await;
        let n = r.map_err(err("read EPOCH"))?;
        let (epoch, same_boot) = if n >= 9 {
            let len = usize::from(raw[8]).min(64);
            (word(&raw, 0, 8), raw.get(9..9 + len) == Some(boot))
        } else {
            (0, false)
        };
        if same_boot {
            return Ok(epoch);
        }
        Self::write_epoch(engine, root, epoch + 1).await
    }

    /// Writes `epoch` (with this boot's id) into EPOCH, durably.
    async fn write_epoch(engine: &Arc<dyn Engine>, root: &Path, epoch: u64) -> Result<u64> {
        let err = |what: &str| {
            let what = format!("{} {what}", root.display());
            move |e| TargetError::target(what, e)
        };
        let (f, boot) = Self::epoch_file(engine, root)?;
        let boot = boot.as_bytes();
        let mut out = AlignedBuf::zeroed(128);
        out[..8].copy_from_slice(&epoch.to_le_bytes());
        out[8] = boot.len() as u8;
        out[9..9 + boot.len()].copy_from_slice(boot);
        engine
            .write_at(&f, 0, out)
            .await
            .1
            .map_err(err("write EPOCH"))?;
        engine.sync(&f).await.map_err(err("sync EPOCH"))?;
        engine.sync_dir(root).map_err(err("sync"))?;
        Ok(epoch)
    }

    /// The durability epoch (see the module's notes).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// After a failed sync: writes answered before it may be lost although the kernel says
    /// their pages are clean. The epoch moves on, durably (and in memory even if the disk
    /// refuses that too), so every client whose writes were answered under the old one
    /// learns at its next sync that they may be lost, in this run or the next.
    async fn lose_unsynced<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(TargetError::SyncFailed { .. }) = &r {
            let _one = self.epoch_io.lock().await;
            let next = self.epoch() + 1;
            if let Err(e) = Self::write_epoch(&self.engine, &self.root, next).await {
                tracing::error!(target = self.index, error = %e, "cannot record the new durability epoch after a failed sync: it holds until this server restarts");
            }
            self.epoch.store(next, Ordering::SeqCst);
        }
        r
    }

    /// Sets which data I/O goes through the page cache, for the objects opened from now on
    /// (a server sets it before it serves the target).
    pub fn set_io(&self, io: IoPolicy) {
        *self.io.lock() = io;
    }

    pub fn io(&self) -> IoPolicy {
        *self.io.lock()
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The sequence MDT0's objects here are in.
    pub fn seq(&self) -> u64 {
        self.first.seq
    }

    /// The directory of object `oid` of sequence `seq`.
    fn dir_of(&self, seq: u64, oid: u32) -> PathBuf {
        object_dir(&self.root, seq, oid % FANOUT)
    }

    fn paths(&self, fid: Fid) -> (PathBuf, PathBuf) {
        let dir = self.dir_of(fid.seq, fid.oid);
        (
            dir.join(format!("{:x}", fid.oid)),
            dir.join(format!("{:x}.cs", fid.oid)),
        )
    }

    /// Hands out `count` new object ids of MDT0's sequence and returns the first (see
    /// [`Target::precreate_for`]).
    pub async fn precreate(&self, count: u32) -> Result<Fid> {
        self.precreate_for(0, count).await
    }

    /// Hands out `count` new object ids of MDT `mdt`'s sequence (made at its first
    /// precreate) and returns the first; the ids are consecutive. The objects are empty, and
    /// get their files when first written.
    pub async fn precreate_for(&self, mdt: u32, count: u32) -> Result<Fid> {
        if count == 0 || count > MAX_PRECREATE {
            return Err(TargetError::Invalid(format!(
                "precreate count must be 1..={MAX_PRECREATE}, not {count}"
            )));
        }
        let sq = self.sequence_made(mdt).await?;
        let mut last = sq.last_id.lock().await;
        let first = last
            .checked_add(1)
            .filter(|f| f.checked_add(count - 1).is_some())
            .ok_or_else(|| TargetError::Invalid("this target's object ids are exhausted".into()))?;
        let new_last = first + (count - 1);
        // Their bits in DEAD take room now: destroying them later, even on a full disk (when
        // destroying is how room is made), only writes inside the file.
        self.room_in_dead(&sq, new_last).await?;
        self.write_last_id(&sq, &mut last, new_last).await?;
        Ok(Fid::new(sq.seq, first, 0))
    }

    /// Moves `sq`'s LAST_ID to `new_last`, durably, under its lock (`last`).
    async fn write_last_id(&self, sq: &Sequence, last: &mut u32, new_last: u32) -> Result<()> {
        let mut raw = AlignedBuf::zeroed(8);
        raw.copy_from_slice(&u64::from(new_last).to_le_bytes());
        let err = |e| TargetError::target(format!("{} LAST_ID", sq.home.display()), e);
        self.engine
            .write_at(&sq.last_id_file, 0, raw)
            .await
            .1
            .map_err(err)?;
        self.engine.sync(&sq.last_id_file).await.map_err(err)?;
        *last = new_last;
        sq.allocated.store(new_last, Ordering::SeqCst);
        Ok(())
    }

    /// An operator's word for this run: the MDS's view of the objects wins. An orphan
    /// cleanup may then destroy more than [`MAX_ORPHANS`] written objects, and a LAST_ID
    /// behind what the filesystem references is moved past it.
    pub fn trust_mds_objects(&self) {
        self.trust_mds.store(true, Ordering::SeqCst);
    }

    /// The filesystem this target is bound to (`None` before its first registration).
    pub fn filesystem(&self) -> Option<u128> {
        self.fs
    }

    /// Makes DEAD long enough (its bytes written, not a hole) to hold the bits of every id up
    /// to `last`.
    async fn room_in_dead(&self, sq: &Sequence, last: u32) -> Result<()> {
        let _one = sq.dead_io.lock().await;
        let want = last as usize / 8 + 1;
        let have = sq.dead.lock().len();
        if have >= want {
            return Ok(());
        }
        let err = |e| TargetError::target(format!("{}/DEAD", sq.home.display()), e);
        let (_, r) = self
            .engine
            .write_at(
                &sq.dead_file,
                DEAD_HEAD + have as u64,
                AlignedBuf::zeroed(want - have),
            )
            .await;
        r.map_err(err)?;
        let mut d = sq.dead.lock();
        if d.len() < want {
            d.resize(want, 0);
        }
        Ok(())
    }

    /// Removes the files kept by [`Target::keep_free`] before a restart: a crash may have
    /// come between setting them aside and emptying them, so none is trusted.
    fn drop_kept(&self, seq: u64) -> Result<()> {
        for d in 0..FANOUT {
            let dir = self.dir_of(seq, d);
            let entries = self
                .engine
                .list(&dir)
                .map_err(|e| TargetError::target(format!("list {}", dir.display()), e))?;
            for p in entries {
                if p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(FREE_PREFIX))
                {
                    // One left behind is no object's: it costs an inode, not the target.
                    if let Err(e) = self.engine.remove(&p) {
                        tracing::warn!(file = %p.display(), error = %e, "cannot remove a kept file");
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets the files of `fid`, just destroyed and open nowhere, aside for a new object:
    /// renamed in their directory, data file first (its name says the object exists). Returns
    /// their new name, or `None` when they were not set aside (the directory keeps enough, the
    /// object is large, or it was never written); the caller removes them then. Called under
    /// `opening`, so no open of the destroyed object can start meanwhile; [`Target::keep_free`]
    /// then empties them.
    fn set_aside(&self, sq: &Sequence, fid: Fid) -> std::io::Result<Option<String>> {
        let d = (fid.oid % FANOUT) as usize;
        if sq.free.lock()[d].len() >= FREE_PER_DIR {
            return Ok(None);
        }
        let (data, meta) = self.paths(fid);
        let f = match self.engine.open(&data, OpenMode::Existing, false) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        if self.engine.len(&f)? > FREE_MAX_BYTES {
            return Ok(None);
        }
        // Made with the data file if missing: a crash can leave a data file alone.
        drop(self.engine.open(&meta, OpenMode::Create, false)?);
        let name = format!("{FREE_PREFIX}{:016x}", rand::random::<u64>());
        let dir = self.dir_of(fid.seq, fid.oid);
        self.engine.rename(&data, &dir.join(&name))?;
        self.engine.rename(&meta, &dir.join(format!("{name}.cs")))?;
        Ok(Some(name))
    }

    /// Empties the files set aside as `name` in the directory of `oid`, durably (so no power
    /// cut brings a destroyed object's bytes back under a new object's name), and keeps them
    /// for a new object.
    async fn keep_free(&self, sq: &Sequence, oid: u32, name: String) -> std::io::Result<()> {
        let dir = self.dir_of(sq.seq, oid);
        for p in [dir.join(format!("{name}.cs")), dir.join(&name)] {
            let f = self.engine.open(&p, OpenMode::Existing, false)?;
            self.engine.set_len(&f, 0)?;
            self.engine.sync(&f).await?;
        }
        sq.free.lock()[(oid % FANOUT) as usize].push(name);
        Ok(())
    }

    /// The files of a new object `fid`: a destroyed object's kept ones if its directory has
    /// some, renamed to its names (checksum file first, as a create makes them), else new
    /// ones. Called under `opening`.
    async fn new_files(&self, sq: &Sequence, fid: Fid, data: &Path, meta: &Path) -> Result<Object> {
        let d = (fid.oid % FANOUT) as usize;
        let kept = sq.free.lock()[d].pop();
        if let Some(name) = kept {
            let dir = self.dir_of(fid.seq, fid.oid);
            let moved = self
                .engine
                .rename(&dir.join(format!("{name}.cs")), meta)
                .and_then(|()| self.engine.rename(&dir.join(&name), data));
            match moved {
                Ok(()) => return Object::reuse(self.engine.clone(), fid, data, meta).await,
                Err(e) => {
                    // Whatever moved is dropped: a checksum file with no data file beside it
                    // belongs to no object.
                    tracing::warn!(object = %fid, error = %e, "a kept file could not be taken; making new ones");
                    for p in [dir.join(&name), dir.join(format!("{name}.cs")), meta.into()] {
                        let _ = self.engine.remove(&p);
                    }
                }
            }
        }
        Object::create(self.engine.clone(), fid, data, meta)
    }

    /// Whether `fid` names an object of this target that was handed out and not destroyed.
    fn live(&self, fid: Fid) -> bool {
        fid.ver == 0 && self.sequence_of(fid).is_some_and(|sq| sq.live(fid.oid))
    }

    /// Whether `fid` is no object of this target's, or a destroyed one.
    fn gone(&self, fid: Fid) -> bool {
        fid.ver != 0 || self.sequence_of(fid).is_none_or(|sq| sq.is_dead(fid.oid))
    }

    /// The object, opened; `None` for one handed out and never written (it is empty).
    async fn existing(&self, fid: Fid) -> Result<Option<Arc<Object>>> {
        match self.object(fid).await {
            Ok(o) => Ok(Some(o)),
            Err(TargetError::NotFound(_)) if self.live(fid) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The object, opened, its files made first if it was never written.
    async fn made(&self, fid: Fid) -> Result<Arc<Object>> {
        match self.object(fid).await {
            Err(TargetError::NotFound(_)) => {}
            other => return other,
        }
        let _opening = self.opening.lock().await;
        if let Some(o) = self.objects.lock().get(&fid) {
            return Ok(o.clone());
        }
        // Checked under the opening lock, which a destroy takes to mark the id dead.
        let sq = match self.sequence_of(fid) {
            Some(sq) if fid.ver == 0 && sq.live(fid.oid) => sq,
            _ => return Err(TargetError::NotFound(fid)),
        };
        let (data, meta) = self.paths(fid);
        let obj = self.new_files(&sq, fid, &data, &meta).await?;
        obj.new_in(self.dir_of(fid.seq, fid.oid));
        Ok(self.keep_open(obj))
    }

    /// Keeps `obj` among the open objects (closing idle ones past the bound).
    fn keep_open(&self, obj: Object) -> Arc<Object> {
        let mut objects = self.objects.lock();
        if objects.len() >= MAX_OPEN_OBJECTS {
            objects.retain(|_, o| Arc::strong_count(o) > 1);
        }
        objects
            .entry(obj.fid)
            .or_insert_with(|| Arc::new(obj.with_io(*self.io.lock())))
            .clone()
    }

    async fn object(&self, fid: Fid) -> Result<Arc<Object>> {
        if self.gone(fid) {
            return Err(TargetError::NotFound(fid));
        }
        if let Some(o) = self.objects.lock().get(&fid) {
            return Ok(o.clone());
        }
        // One opener at a time, so an object never has two instances (two sets of locks).
        let _opening = self.opening.lock().await;
        if let Some(o) = self.objects.lock().get(&fid) {
            return Ok(o.clone());
        }
        // Checked again under the lock a destroy takes: a destroyed object's files may be
        // another object's by now.
        if self.gone(fid) {
            return Err(TargetError::NotFound(fid));
        }
        let (data, meta) = self.paths(fid);
        let obj = Object::open(self.engine.clone(), fid, &data, &meta).await?;
        Ok(self.keep_open(obj))
    }

    /// Writes `data` at `offset`; a write `stamp` shows to be stale is refused.
    pub async fn write(
        &self,
        fid: Fid,
        offset: u64,
        data: &[u8],
        sync: bool,
        stamp: proto::ost::WriteStamp,
    ) -> Result<u64> {
        let floor = self.floor(stamp);
        crate::object::check_range(offset, data.len() as u64)?;
        let r = self
            .made(fid)
            .await?
            .write(offset, data, sync, stamp, floor)
            .await;
        self.lose_unsynced(r).await
    }

    /// The oldest write `stamp`'s client still waits on, as far as this target knows.
    fn floor(&self, stamp: proto::ost::WriteStamp) -> u64 {
        if stamp.client == 0 {
            return 0;
        }
        let mut floors = self.floors.lock();
        if floors.len() >= MAX_CLIENTS && !floors.contains_key(&stamp.client) {
            floors.clear();
        }
        let f = floors.entry(stamp.client).or_default();
        *f = (*f).max(stamp.oldest);
        *f
    }

    pub async fn read(&self, fid: Fid, offset: u64, len: u64) -> Result<Bytes> {
        match self.existing(fid).await? {
            Some(o) => o.read(offset, len).await,
            None => crate::object::check_range(offset, len).map(|_| Bytes::new()),
        }
    }

    pub async fn size(&self, fid: Fid) -> Result<u64> {
        match self.existing(fid).await? {
            Some(o) => Ok(o.size().await),
            None => Ok(0),
        }
    }

    pub async fn truncate(&self, fid: Fid, size: u64, stamp: proto::ost::WriteStamp) -> Result<()> {
        crate::object::check_range(size, 0)?;
        let floor = self.floor(stamp);
        let r = match self.existing(fid).await? {
            Some(o) => o.truncate(size, stamp, floor).await,
            // Empty already; a longer object is made.
            None if size == 0 => Ok(()),
            None => self.made(fid).await?.truncate(size, stamp, floor).await,
        };
        self.lose_unsynced(r).await
    }

    pub async fn punch(
        &self,
        fid: Fid,
        offset: u64,
        len: u64,
        stamp: proto::ost::WriteStamp,
    ) -> Result<()> {
        let floor = self.floor(stamp);
        let r = match self.existing(fid).await? {
            Some(o) => o.punch(offset, len, stamp, floor).await,
            None => match offset.checked_add(len) {
                Some(end) if end <= crate::object::MAX_OBJECT_SIZE => Ok(()),
                _ => Err(TargetError::Invalid(format!(
                    "range {offset}+{len} is past the object size limit"
                ))),
            },
        };
        self.lose_unsynced(r).await
    }

    pub async fn sync(&self, fid: Fid) -> Result<()> {
        let r = match self.existing(fid).await? {
            Some(o) => o.sync().await,
            None => Ok(()),
        };
        self.lose_unsynced(r).await
    }

    /// Destroys an object: its id is recorded dead, then its files (if it was written) go;
    /// durable on return.
    pub async fn destroy(&self, fid: Fid) -> Result<()> {
        match self.destroy_many(&[fid]).await?.as_slice() {
            [] => Ok(()),
            _ => Err(TargetError::NotFound(fid)),
        }
    }

    /// Destroys the objects `fids` as [`Target::destroy`] does, with one sync of DEAD and one
    /// of each directory that lost files; returns those that were not there.
    pub async fn destroy_many(&self, fids: &[Fid]) -> Result<Vec<Fid>> {
        let (live, missing): (Vec<Fid>, Vec<Fid>) = fids.iter().partition(|f| self.live(**f));
        // One MDT asks, so the objects are of one sequence; each is done on its own.
        let mut by_seq: HashMap<u64, Vec<Fid>> = HashMap::new();
        for f in live {
            by_seq.entry(f.seq).or_default().push(f);
        }
        for (_, live) in by_seq {
            if let Some(sq) = self.sequence_of(live[0]) {
                self.destroy_live(&sq, &live).await?;
            }
        }
        Ok(missing)
    }

    /// Destroys `live`, objects of `sq` handed out and not destroyed.
    async fn destroy_live(&self, sq: &Sequence, live: &[Fid]) -> Result<()> {
        let gone = |r: std::io::Result<()>| match r {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        };
        let mut dirs = std::collections::BTreeSet::new();
        let mut remove = vec![];
        let mut aside = vec![];
        {
            // No write makes these objects' files from now on, and none opens them.
            let _opening = self.opening.lock().await;
            self.mark_dead(sq, live.iter().map(|f| f.oid)).await?;
            let mut objects = self.objects.lock();
            let in_use: Vec<Fid> = live
                .iter()
                .filter(|f| objects.remove(f).is_some_and(|o| Arc::strong_count(&o) > 1))
                .copied()
                .collect();
            drop(objects);
            for &fid in live {
                // Files a request still works on are removed, so its late writes land nowhere.
                let set = if in_use.contains(&fid) {
                    None
                } else {
                    self.set_aside(sq, fid)
                        .map_err(|e| TargetError::io(fid, 0, e))?
                };
                match set {
                    Some(name) => aside.push((fid, name)),
                    None => remove.push(fid),
                }
            }
        }
        for (fid, name) in aside {
            dirs.insert(fid.oid % FANOUT);
            self.keep_free(sq, fid.oid, name)
                .await
                .map_err(|e| TargetError::io(fid, 0, e))?;
        }
        for fid in remove {
            let (data, meta) = self.paths(fid);
            let err = |e| TargetError::io(fid, 0, e);
            if gone(self.engine.remove(&data)).map_err(err)? {
                dirs.insert(fid.oid % FANOUT);
            }
            gone(self.engine.remove(&meta)).map_err(err)?;
        }
        for d in dirs {
            let dir = self.dir_of(sq.seq, d);
            self.engine
                .sync_dir(&dir)
                .map_err(|e| TargetError::target(format!("sync {}", dir.display()), e))?;
        }
        Ok(())
    }

    /// Destroys every object of MDT `mdt`'s sequence with an id above `keep_up_to` (orphans
    /// of an MDS crash); returns how many went. Another MDT's objects are never touched. Durable on return, with one sync per directory rather than per object.
    /// Cleanups asked for at once run one after the other.
    ///
    /// `run` names the MDS run asking. The ids precreated after a run's cleanup are that
    /// run's to hand out, so another cleanup from the same run (a message held back or
    /// duplicated on the way) reaches no higher than the first did.
    ///
    /// Refused, destroying nothing: an MDS of another filesystem (`fs`), or of none yet; a
    /// `keep_up_to` past LAST_ID (the target was rolled back: its ids would be handed out
    /// twice); more written objects than [`MAX_ORPHANS`] that are also more than a tenth of
    /// the target's (an MDS that lost its namespace would destroy the target's data as
    /// orphans). [`Target::trust_mds_objects`] lifts the last two.
    pub async fn destroy_above(
        &self,
        mdt: u32,
        keep_up_to: u32,
        run: u64,
        fs: u128,
    ) -> Result<u32> {
        if self.fs != Some(fs) {
            return Err(TargetError::Refused(format!(
                "{} belongs to filesystem {}, and an MDS of {fs:032x} asked to clean it up",
                self.root.display(),
                self.fs
                    .map_or("(none yet)".to_string(), |f| format!("{f:032x}")),
            )));
        }
        // An MDT's first cleanup makes its sequence: it then precreates there.
        let sq = self.sequence_made(mdt).await?;
        let _one = sq.cleanup.lock().await;
        let trust = self.trust_mds.load(Ordering::SeqCst);
        {
            let mut last = sq.last_id.lock().await;
            if keep_up_to > *last {
                if !trust {
                    return Err(TargetError::Refused(format!(
                        "target {} ({}): its LAST_ID is {} but the filesystem references its \
                         objects up to {keep_up_to}: the target was rolled back or restored \
                         from an older copy, and would hand out object ids twice; it takes no \
                         new files. Restore the newer copy, or restart its server with \
                         --trust-mds-objects to move LAST_ID past them (objects above {} are \
                         lost and read as errors)",
                        self.index,
                        self.root.display(),
                        *last,
                        *last,
                    )));
                }
                let lost = *last + 1..=keep_up_to;
                tracing::warn!(target = self.index, mdt, last = *last, keep_up_to, "LAST_ID is behind the filesystem: moved past it on the operator's word; the objects between are lost");
                self.room_in_dead(&sq, keep_up_to).await?;
                self.mark_dead(&sq, lost).await?;
                self.write_last_id(&sq, &mut last, keep_up_to).await?;
            }
        }
        let mut last = *sq.last_id.lock().await;
        let cleaned_before = *sq.cleaned.lock();
        if let Some((r, reached)) = cleaned_before {
            if r == run {
                last = last.min(reached);
            }
        }
        let all = list_objects(&self.engine, &self.root, sq.seq)?;
        let doomed: Vec<Fid> = all
            .iter()
            .copied()
            .filter(|f| f.oid > keep_up_to && f.oid <= last)
            .collect();
        if !trust && doomed.len() > MAX_ORPHANS && doomed.len() * 10 > all.len() {
            return Err(TargetError::Refused(format!(
                "target {} ({}): the MDS's namespace references none of its {} written objects \
                 above id {keep_up_to} ({} of {} on the target): this is not an MDS crash's \
                 handful of orphans but an MDS that lost its namespace (a wrong or restored \
                 data directory?). Nothing was destroyed and the target takes no new files; if \
                 the namespace is right, restart its server with --trust-mds-objects",
                self.index,
                self.root.display(),
                doomed.len(),
                doomed.len(),
                all.len(),
            )));
        }
        if cleaned_before.is_none_or(|(r, _)| r != run) {
            *sq.cleaned.lock() = Some((run, last));
        }
        if keep_up_to < last {
            let _opening = self.opening.lock().await;
            self.mark_dead(&sq, keep_up_to + 1..=last).await?;
        }
        let gone = |r: std::io::Result<()>| match r {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        };
        let mut n = 0;
        let mut dirs = std::collections::BTreeSet::new();
        for fid in doomed {
            self.objects.lock().remove(&fid);
            let (data, meta) = self.paths(fid);
            let err = |e| TargetError::io(fid, 0, e);
            if gone(self.engine.remove(&data)).map_err(err)? {
                n += 1;
            }
            gone(self.engine.remove(&meta)).map_err(err)?;
            dirs.insert(fid.oid % FANOUT);
        }
        for d in dirs {
            let dir = self.dir_of(sq.seq, d);
            self.engine
                .sync_dir(&dir)
                .map_err(|e| TargetError::target(format!("sync {}", dir.display()), e))?;
        }
        Ok(n)
    }

    pub fn space(&self) -> Result<Space> {
        self.engine
            .space(&self.root)
            .map_err(|e| TargetError::target(format!("{} statfs", self.root.display()), e))
    }

    /// Every object, of every MDT's sequence, that has a data file (was written and not
    /// destroyed).
    pub fn objects(&self) -> Result<Vec<Fid>> {
        let mut seqs = vec![self.first.seq];
        seqs.extend(self.others.lock().values().map(|sq| sq.seq));
        let mut out = vec![];
        for seq in seqs {
            out.extend(list_objects(&self.engine, &self.root, seq)?);
        }
        out.sort();
        Ok(out)
    }

    /// Makes every write to every open object durable (a clean shutdown).
    pub async fn sync_all(&self) -> Result<()> {
        let open: Vec<Arc<Object>> = self.objects.lock().values().cloned().collect();
        for o in open {
            o.sync().await?;
        }
        Ok(())
    }

    /// Reads every block of every object and reports those failing their checksums.
    pub async fn scrub(&self) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        for fid in self.objects()? {
            let obj = match self.object(fid).await {
                Ok(o) => o,
                // Destroyed since it was listed.
                Err(TargetError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            report.objects += 1;
            report.bytes += obj.size().await;
            report
                .bad
                .extend(obj.scrub().await?.into_iter().map(|off| (fid, off)));
        }
        Ok(report)
    }
}

fn object_dir(root: &Path, seq: u64, d: u32) -> PathBuf {
    root.join("O")
        .join(format!("{seq:x}"))
        .join(format!("d{d}"))
}

/// Every object id of sequence `seq` in `root` that has a data file.
fn list_objects(engine: &Arc<dyn Engine>, root: &Path, seq: u64) -> Result<Vec<Fid>> {
    let mut out = vec![];
    for d in 0..FANOUT {
        let dir = object_dir(root, seq, d);
        let entries = match engine.list(&dir) {
            Ok(e) => e,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(TargetError::target(format!("list {}", dir.display()), e)),
        };
        for p in entries {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if let Ok(oid) = u32::from_str_radix(name, 16) {
                out.push(Fid::new(seq, oid, 0));
            }
        }
    }
    out.sort();
    Ok(out)
}
