//! One object: a data file and a checksum file, and the block rules that keep them honest.
//!
//! Data is stored and checked in 4 KiB blocks; every disk I/O is whole, aligned blocks, so data
//! files are always opened O_DIRECT. A write that covers part of a block reads the block,
//! checks it, and writes it back whole.
//!
//! The checksum file starts with a 32-byte header (magic, version 2, block size, logical size),
//! then holds one 12-byte entry per block: the crc32c of the block's newest contents (`cur`), of
//! the contents that write replaced (`prev`), and of the contents last made durable (`synced`).
//! A block is good if its crc32c matches any of them, or if it is all zeros and a slot is 0
//! (never written). Checksums are written before the data, so a process killed between the two
//! leaves the block as `prev` describes; a power cut leaves it as `synced` describes (or as a
//! later write, if the disk kept it). `synced` moves only at the first write to a block after a
//! sync; until an object has been synced in this run, no block counts as synced (the last run
//! may have been killed before syncing), so `synced` is kept.
//!
//! Writes carry their client's order ([`proto::ost::WriteStamp`]): under the block lock, a write
//! that overlaps a newer one already applied from the same client is refused as stale.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use proto::ost::WriteStamp;
use proto::Fid;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::{Notify, RwLock};

use crate::engine::{AlignedBuf, Engine, FileHandle, OpenMode};
use crate::error::TargetError;
use crate::io_policy::IoPolicy;

/// Bytes per checksummed block.
pub const BLOCK: u64 = 4096;
/// Largest object: 16 TiB.
pub const MAX_OBJECT_SIZE: u64 = 1 << 44;
/// Largest single read or write: one bulk transfer.
pub const MAX_IO: u64 = proto::MAX_BULK as u64;

const META_MAGIC: [u8; 8] = *b"LODEOBJ\0";
const META_VERSION: u32 = 2;
pub(crate) const META_HEADER: u64 = 32;
const ENTRY: u64 = 12;
/// Data I/Os this small are made on the calling thread (when the engine allows it): a few
/// blocks take the disk tens of microseconds, less than the trip to an engine thread and back.
const INLINE_DATA: u64 = 16 << 10;
/// Writes through the page cache this small are made on the calling thread too: copying whole
/// blocks into the cache takes microseconds, where io_uring hands a buffered write to one of
/// its worker threads (ext4 cannot take one without blocking) and wakes two threads more on
/// its way back.
const INLINE_CACHED_WRITE: u64 = 128 << 10;
// Data I/Os up to a size go through the page cache (the data file's buffered open), as
// Lustre's OSS caches small I/O: a small file read soon after it was written, or read again,
// costs no disk trip. Larger ones, a stream's, go straight to the disk (O_DIRECT), or through
// the cache too where the target's device is faster so ([`IoPolicy`]). The kernel keeps the
// two coherent: a direct read writes back the cached range first, and a direct write drops it.
// The buffered open reads nothing ahead, so no page of a block comes into the cache but under
// that block's lock.
/// Writes remembered per object for ordering (beyond the client's oldest write in flight).
pub const MAX_STAMPS: usize = 4096;

type Result<T> = std::result::Result<T, TargetError>;

/// The checksum entry of one block: (cur, prev, synced).
type Entry = (u32, u32, u32);

/// A block of zeros, to compare holes against.
static ZEROS: [u8; BLOCK as usize] = [0; BLOCK as usize];

/// The length of `data` without the whole blocks of zeros at its end: a reader that takes
/// what is missing as zeros (a hole) need not be sent them.
pub fn without_trailing_zeros(data: &[u8]) -> usize {
    let mut end = data.len();
    while end > 0 {
        let start = (end - 1) / BLOCK as usize * BLOCK as usize;
        if data[start..end] != ZEROS[..end - start] {
            break;
        }
        end = start;
    }
    end
}

/// Whether a block's contents match its entry. An entry naming a hole (a 0) matches zeros;
/// that is checked first, by one comparison against [`ZEROS`], which leaves at the first
/// byte of data: reading a sparse object's holes costs no checksum.
fn block_ok(data: &[u8], (cur, prev, synced): Entry) -> bool {
    // A block whose newest contents are known durable (`synced == cur`, set at the sync that
    // made them so) holds them and nothing else: zeros there are a range the disk lost.
    let durable = synced != 0 && synced == cur;
    if !durable && (cur == 0 || prev == 0 || synced == 0) && data == &ZEROS[..data.len()] {
        return true;
    }
    let c = crc32c::crc32c(data);
    c == cur || c == prev || c == synced
}

/// The writes applied lately, per client, so a late one is never applied over a newer one.
#[derive(Default)]
struct Stamps {
    /// (client, xid, start, end) of applied writes.
    applied: Vec<(u64, u64, u64, u64)>,
    /// Per client, the highest xid forgotten to stay within [`MAX_STAMPS`]: older writes from
    /// it are refused, since their overlap can no longer be checked.
    forgotten: BTreeMap<u64, u64>,
}

impl Stamps {
    /// Whether `stamp`'s write over `start..end` may be applied; records it if so.
    fn admit(&mut self, stamp: WriteStamp, floor: u64, start: u64, end: u64) -> bool {
        if stamp.client == 0 {
            return true;
        }
        self.applied
            .retain(|&(c, xid, ..)| c != stamp.client || xid >= floor);
        if stamp.xid < floor
            || self
                .forgotten
                .get(&stamp.client)
                .is_some_and(|&f| stamp.xid <= f)
        {
            return false;
        }
        let newer = self
            .applied
            .iter()
            .any(|&(c, xid, s, e)| c == stamp.client && xid > stamp.xid && s < end && start < e);
        if newer {
            return false;
        }
        if self.applied.len() >= MAX_STAMPS {
            let (c, xid, ..) = self.applied.remove(0);
            let f = self.forgotten.entry(c).or_default();
            *f = (*f).max(xid);
        }
        self.applied.push((stamp.client, stamp.xid, start, end));
        true
    }
}

/// The blocks written since the last sync, as merged ranges.
#[derive(Default)]
struct Dirty(BTreeMap<u64, u64>);

impl Dirty {
    fn contains(&self, b: u64) -> bool {
        self.0
            .range(..=b)
            .next_back()
            .is_some_and(|(_, &end)| b < end)
    }

    fn insert(&mut self, mut start: u64, mut end: u64) {
        let overlapping: Vec<(u64, u64)> = self
            .0
            .range(..=end)
            .filter(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.0.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }

    /// Takes blocks `start..end` out.
    fn remove(&mut self, start: u64, end: u64) {
        let overlapping: Vec<(u64, u64)> = self
            .0
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.0.remove(&s);
            if s < start {
                self.0.insert(s, start);
            }
            if e > end {
                self.0.insert(end, e);
            }
        }
    }

    fn first(&self) -> Option<(u64, u64)> {
        self.0.iter().next().map(|(&s, &e)| (s, e))
    }

    fn truncate(&mut self, end: u64) {
        let above: Vec<u64> = self.0.range(end..).map(|(&s, _)| s).collect();
        for s in above {
            self.0.remove(&s);
        }
        if let Some((_, e)) = self.0.range_mut(..end).next_back() {
            *e = (*e).min(end);
        }
    }
}

struct State {
    size: u64,
    dirty: Dirty,
}

/// Checks that `offset..offset+len` is a range an object may have.
pub(crate) fn check_range(offset: u64, len: u64) -> Result<u64> {
    if len > MAX_IO {
        return Err(TargetError::Invalid(format!(
            "I/O of {len} bytes exceeds the limit of {MAX_IO}"
        )));
    }
    match offset.checked_add(len) {
        Some(end) if end <= MAX_OBJECT_SIZE => Ok(end),
        _ => Err(TargetError::Invalid(format!(
            "range {offset}+{len} is past the object size limit of {MAX_OBJECT_SIZE}"
        ))),
    }
}

/// Ranges of blocks being read or written: readers share a range, a writer has it alone.
/// Operations on different blocks of one object proceed in parallel.
#[derive(Default)]
struct BlockLocks {
    held: Mutex<Vec<(u64, u64, bool, u64)>>,
    next: AtomicU64,
    freed: Notify,
}

struct BlockGuard<'a> {
    locks: &'a BlockLocks,
    id: u64,
}

impl BlockLocks {
    async fn lock(&self, start: u64, end: u64, write: bool) -> BlockGuard<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        loop {
            // Created before the check, so a release between the check and the wait is seen.
            let freed = self.freed.notified();
            {
                let mut held = self.held.lock();
                let clash = held
                    .iter()
                    .any(|&(s, e, w, _)| s < end && start < e && (w || write));
                if !clash {
                    held.push((start, end, write, id));
                    return BlockGuard { locks: self, id };
                }
            }
            freed.await;
        }
    }
}

impl Drop for BlockGuard<'_> {
    fn drop(&mut self) {
        self.locks.held.lock().retain(|h| h.3 != self.id);
        self.locks.freed.notify_waiters();
    }
}

/// One stored object: its data file and its checksum file, read and written block by block.
pub struct Object {
    pub fid: Fid,
    engine: Arc<dyn Engine>,
    data: FileHandle,
    /// The data file opened again through the page cache, for I/Os up to `io`'s limits.
    cached: FileHandle,
    io: IoPolicy,
    meta: FileHandle,
    /// Reads and writes share it; sync, truncate and punch take it alone.
    gate: RwLock<()>,
    blocks: BlockLocks,
    state: Mutex<State>,
    /// No sync yet in this run: no block's contents are known durable.
    unsynced_since_open: AtomicBool,
    /// Blocks whose writes a failed sync may have lost (the kernel drops the pages of a
    /// failed write-back and a later fsync succeeds): every sync fails until they are all
    /// written again.
    lost: Mutex<Dirty>,
    /// Made in this run, in this directory, whose entries are not known durable yet.
    new_in: Mutex<Option<std::path::PathBuf>>,
    /// Tests: the process "dies" right after a write's checksums are written.
    #[cfg(test)]
    die_after_checksums: AtomicBool,
    stamps: Mutex<Stamps>,
}

impl Object {
    /// Creates the files of a new, empty object and opens it (not yet durable: see
    /// [`Object::new_in`]; an empty checksum file reads as an empty object). The checksum
    /// file comes first, since the data file's name says that the object exists; either may
    /// be left by a crash, and a checksum file left so is read as it stands.
    pub fn create(engine: Arc<dyn Engine>, fid: Fid, data: &Path, meta: &Path) -> Result<Object> {
        let io = |e| TargetError::io(fid, 0, e);
        let meta = engine.open(meta, OpenMode::Create, false).map_err(io)?;
        let cached = engine.open(data, OpenMode::Create, false).map_err(io)?;
        let data = engine.open(data, OpenMode::Existing, true).map_err(io)?;
        Object::with(engine, fid, data, cached, meta).map(Object::made_in_this_run)
    }

    /// A new object (made or reused empty in this run) has no earlier run's contents whose
    /// durability is unknown.
    fn made_in_this_run(self) -> Object {
        self.unsynced_since_open.store(false, Ordering::Release);
        self
    }

    /// Says that the object's files were just made in `dir`: its first sync makes their
    /// entries durable too.
    pub fn new_in(&self, dir: std::path::PathBuf) {
        *self.new_in.lock() = Some(dir);
    }

    pub async fn open(
        engine: Arc<dyn Engine>,
        fid: Fid,
        data: &Path,
        meta: &Path,
    ) -> Result<Object> {
        let open = |p, direct| {
            engine.open(p, OpenMode::Existing, direct).map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOENT) {
                    TargetError::NotFound(fid)
                } else {
                    TargetError::io(fid, 0, e)
                }
            })
        };
        let (cached, meta) = (open(data, false)?, open(meta, false)?);
        let data = open(data, true)?;
        Object::with(engine, fid, data, cached, meta)
    }

    /// Opens the files of a destroyed object, just renamed to this object's names, as a new
    /// empty object. They were emptied durably when set aside; whatever they still hold (a
    /// crash came between) is cut first, durably too.
    pub async fn reuse(
        engine: Arc<dyn Engine>,
        fid: Fid,
        data: &Path,
        meta: &Path,
    ) -> Result<Object> {
        let io = |e| TargetError::io(fid, 0, e);
        let meta = engine.open(meta, OpenMode::Existing, false).map_err(io)?;
        let cached = engine.open(data, OpenMode::Existing, false).map_err(io)?;
        for f in [&meta, &cached] {
            if engine.len(f).map_err(io)? > 0 {
                engine.set_len(f, 0).map_err(io)?;
                engine.sync(f).await.map_err(io)?;
            }
        }
        let data = engine.open(data, OpenMode::Existing, true).map_err(io)?;
        Object::with(engine, fid, data, cached, meta).map(Object::made_in_this_run)
    }

    /// The object whose files are open as `data` and `meta`, its size read from the header.
    fn with(
        engine: Arc<dyn Engine>,
        fid: Fid,
        data: FileHandle,
        cached: FileHandle,
        meta: FileHandle,
    ) -> Result<Object> {
        engine.no_readahead(&cached);
        let obj = Object {
            fid,
            engine,
            data,
            cached,
            io: IoPolicy::default(),
            meta,
            gate: RwLock::new(()),
            blocks: BlockLocks::default(),
            state: Mutex::new(State {
                size: 0,
                dirty: Dirty::default(),
            }),
            unsynced_since_open: AtomicBool::new(true),
            lost: Mutex::new(Dirty::default()),
            new_in: Mutex::new(None),
            stamps: Mutex::new(Stamps::default()),
            #[cfg(test)]
            die_after_checksums: AtomicBool::new(false),
        };
        let size = obj.read_header()?;
        obj.state.lock().size = size;
        // Bytes of the data file past the size are a truncate whose data-file half was lost
        // with a failed sync (the checksum file's half, the size, was kept): they must not
        // come back as the contents of blocks the object later grows over.
        let blocks = size.div_ceil(BLOCK);
        let io = |e| TargetError::io(fid, 0, e);
        if obj.engine.len(&obj.data).map_err(io)? > blocks * BLOCK {
            obj.engine.set_len(&obj.data, blocks * BLOCK).map_err(io)?;
        }
        if obj.engine.len(&obj.meta).map_err(io)? > META_HEADER + blocks * ENTRY {
            obj.engine
                .set_len(&obj.meta, META_HEADER + blocks * ENTRY)
                .map_err(io)?;
        }
        Ok(obj)
    }

    fn io(&self, offset: u64) -> impl Fn(std::io::Error) -> TargetError + '_ {
        move |e| TargetError::io(self.fid, offset, e)
    }

    /// The open of the data file a read of `len` bytes goes through.
    fn data_to_read(&self, len: u64) -> &FileHandle {
        if len <= self.io.cache_max_read {
            &self.cached
        } else {
            &self.data
        }
    }

    /// The open of the data file a write of `len` bytes (and the reads of its edge blocks)
    /// goes through.
    fn data_to_write(&self, len: u64) -> &FileHandle {
        if len <= self.io.cache_max_write {
            &self.cached
        } else {
            &self.data
        }
    }

    /// Streams through the page cache or direct, as `io` says (set before the object is
    /// used: a target sets it as it opens the object).
    pub fn with_io(mut self, io: IoPolicy) -> Object {
        self.io = io;
        self
    }

    async fn pread(&self, f: &FileHandle, offset: u64, len: u64) -> Result<AlignedBuf> {
        if len <= INLINE_DATA && self.engine.data_inline() {
            let mut buf = AlignedBuf::zeroed(len as usize);
            self.engine
                .read_inline(f, offset, &mut buf)
                .map_err(self.io(offset))?;
            return Ok(buf);
        }
        let (buf, r) = self
            .engine
            .read_at(f, offset, AlignedBuf::zeroed(len as usize))
            .await;
        // A short read is the end of the file: the rest of the buffer stays zero.
        r.map_err(self.io(offset))?;
        Ok(buf)
    }

    async fn pwrite(&self, f: &FileHandle, offset: u64, buf: AlignedBuf) -> Result<()> {
        let len = buf.len() as u64;
        let cached = std::ptr::eq(f, &self.cached);
        let inline = len <= INLINE_DATA || (cached && len <= INLINE_CACHED_WRITE);
        if inline && self.engine.data_inline() {
            return self
                .engine
                .write_inline(f, offset, &buf)
                .map_err(self.io(offset));
        }
        let (_, r) = self.engine.write_at(f, offset, buf).await;
        r.map(|_| ()).map_err(self.io(offset))
    }

    // The checksum file is small and page-cached: it is read and written on the calling thread
    // (`*_inline`), which costs less than a trip through an I/O engine thread.

    fn read_header(&self) -> Result<u64> {
        let mut h = [0u8; META_HEADER as usize];
        let n = self
            .engine
            .read_inline(&self.meta, 0, &mut h)
            .map_err(self.io(0))?;
        if n == 0 || h[..8] == [0u8; 8] {
            // Created, and the header not yet written (a first write writes its checksums,
            // then its data, then the header): an empty object.
            return Ok(0);
        }
        let word =
            |r: std::ops::Range<usize>| h[r].iter().rev().fold(0u64, |a, &b| a << 8 | u64::from(b));
        if n < h.len()
            || h[..8] != META_MAGIC
            || word(8..12) != u64::from(META_VERSION)
            || word(12..16) != BLOCK
        {
            return Err(TargetError::Damaged(format!(
                "object {}: bad checksum file header",
                self.fid
            )));
        }
        let size = word(16..24);
        if size > MAX_OBJECT_SIZE {
            return Err(TargetError::Damaged(format!(
                "object {}: a size of {size} in the checksum file is past the limit",
                self.fid
            )));
        }
        Ok(size)
    }

    fn write_header(&self, size: u64) -> Result<()> {
        let mut h = [0u8; META_HEADER as usize];
        h[..8].copy_from_slice(&META_MAGIC);
        h[8..12].copy_from_slice(&META_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        h[16..24].copy_from_slice(&size.to_le_bytes());
        self.engine
            .write_inline(&self.meta, 0, &h)
            .map_err(self.io(0))
    }

    fn read_entries(&self, b0: u64, n: u64) -> Result<Vec<Entry>> {
        let mut raw = vec![0u8; (n * ENTRY) as usize];
        let got = self
            .engine
            .read_inline(&self.meta, META_HEADER + b0 * ENTRY, &mut raw)
            .map_err(self.io(b0 * BLOCK))?;
        raw[got..].fill(0); // past the end of the file: never written
        Ok(raw
            .chunks_exact(ENTRY as usize)
            .map(|c| {
                let w = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
                (w(0), w(4), w(8))
            })
            .collect())
    }

    fn write_entries(&self, b0: u64, entries: &[Entry]) -> Result<()> {
        let mut raw = vec![0u8; entries.len() * ENTRY as usize];
        for (c, (cur, prev, synced)) in raw.chunks_exact_mut(ENTRY as usize).zip(entries) {
            c[..4].copy_from_slice(&cur.to_le_bytes());
            c[4..8].copy_from_slice(&prev.to_le_bytes());
            c[8..].copy_from_slice(&synced.to_le_bytes());
        }
        self.engine
            .write_inline(&self.meta, META_HEADER + b0 * ENTRY, &raw)
            .map_err(self.io(b0 * BLOCK))
    }

    fn verify(&self, b0: u64, buf: &[u8], entries: &[Entry]) -> Result<()> {
        for (i, (block, e)) in buf.chunks(BLOCK as usize).zip(entries).enumerate() {
            if !block_ok(block, *e) {
                return Err(TargetError::Checksum {
                    fid: self.fid,
                    offset: (b0 + i as u64) * BLOCK,
                });
            }
        }
        Ok(())
    }

    pub async fn size(&self) -> u64 {
        self.state.lock().size
    }

    /// Reads up to `len` bytes at `offset`: short at the end of the object, zeros in holes,
    /// an error naming the block if any block fails its checksum.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes> {
        check_range(offset, len)?;
        let _gate = self.gate.read().await;
        let size = self.state.lock().size;
        if offset >= size || len == 0 {
            return Ok(Bytes::new());
        }
        let len = len.min(size - offset);
        let (b0, b1) = (offset / BLOCK, (offset + len).div_ceil(BLOCK));
        let _blocks = self.blocks.lock(b0, b1, false).await;
        // The checksums come from the page cache; where they are not there, the disk reads
        // them while it reads the data, instead of after.
        self.engine
            .will_need(&self.meta, META_HEADER + b0 * ENTRY, (b1 - b0) * ENTRY);
        let whole = (b1 - b0) * BLOCK;
        let buf = self
            .pread(self.data_to_read(whole), b0 * BLOCK, whole)
            .await?;
        let entries = self.read_entries(b0, b1 - b0)?;
        self.verify(b0, &buf, &entries)?;
        let start = (offset - b0 * BLOCK) as usize;
        Ok(Bytes::from_owner(buf).slice(start..start + len as usize))
    }

    /// Writes `data` at `offset`, extending the object if needed; with `sync`, durably.
    /// A write older than an overlapping one already applied from its client (by `stamp`;
    /// `floor` is that client's oldest write still in flight) is refused as stale.
    /// Returns the object's size.
    pub async fn write(
        &self,
        offset: u64,
        data: &[u8],
        sync: bool,
        stamp: WriteStamp,
        floor: u64,
    ) -> Result<u64> {
        let end = check_range(offset, data.len() as u64)?;
        self.settle().await?;
        {
            let _gate = self.gate.read().await;
            self.write_blocks(offset, end, data, Some((stamp, floor)))
                .await?;
        }
        if sync {
            self.sync().await?;
        }
        Ok(self.state.lock().size)
    }

    /// Writes `data` over `offset..end`, holding those blocks alone; a client's write is
    /// checked against its order first.
    async fn write_blocks(
        &self,
        offset: u64,
        end: u64,
        data: &[u8],
        order: Option<(WriteStamp, u64)>,
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let (b0, b1) = (offset / BLOCK, end.div_ceil(BLOCK));
        let n = b1 - b0;
        let _blocks = self.blocks.lock(b0, b1, true).await;
        if let Some((stamp, floor)) = order {
            // Under the block lock: no overlapping write can land between check and write.
            if !self.stamps.lock().admit(stamp, floor, offset, end) {
                tracing::warn!(
                    client = %format_args!("{:x}", stamp.client),
                    xid = stamp.xid,
                    oldest = stamp.oldest,
                    floor,
                    offset,
                    len = end - offset,
                    "refused a stale write"
                );
                return Err(TargetError::Stale(format!(
                    "write {} of client {:x} to {}+{} is older than one already applied",
                    stamp.xid,
                    stamp.client,
                    offset,
                    end - offset
                )));
            }
        }
        // Blocks past the size are holes whatever other writers do meanwhile: they write
        // other blocks.
        let unknown = self.unsynced_since_open.load(Ordering::Acquire);
        let (size, clean): (u64, Vec<bool>) = {
            let st = self.state.lock();
            (
                st.size,
                (b0..b1)
                    .map(|b| !unknown && !st.dirty.contains(b))
                    .collect(),
            )
        };
        // Every block is either wholly covered by `data` or an edge block, zeroed or read here.
        let mut buf = AlignedBuf::reused((n * BLOCK) as usize);
        buf[..BLOCK as usize].fill(0);
        let last = ((n - 1) * BLOCK) as usize;
        buf[last..].fill(0);
        let mut entries = self.read_entries(b0, n)?;
        // Blocks only partly covered keep their other bytes: read and check them first. A
        // block's bytes before the write count if the block starts inside the object; its
        // bytes after the write only if the object reaches past the write (beyond the size
        // there is nothing to keep, so a write to the end of an object never reads its last
        // block: a damaged one can be rewritten whole).
        let mut edges = vec![];
        if offset % BLOCK != 0 && b0 * BLOCK < size {
            edges.push(b0);
        }
        if end % BLOCK != 0 && end < size && !edges.contains(&(b1 - 1)) {
            edges.push(b1 - 1);
        }
        for b in edges {
            let old = self
                .pread(self.data_to_write(n * BLOCK), b * BLOCK, BLOCK)
                .await?;
            let i = (b - b0) as usize;
            self.verify(b, &old, &entries[i..=i])?;
            buf[i * BLOCK as usize..(i + 1) * BLOCK as usize].copy_from_slice(&old);
        }
        let start = (offset - b0 * BLOCK) as usize;
        buf[start..start + data.len()].copy_from_slice(data);

        let before = entries.clone();
        for ((block, e), clean) in buf
            .chunks(BLOCK as usize)
            .zip(entries.iter_mut())
            .zip(clean)
        {
            if clean {
                e.2 = e.0;
            }
            e.1 = e.0;
            e.0 = crc32c::crc32c(block);
        }
        // Reserve the space first, so a full disk refuses the write before anything changes.
        self.engine
            .allocate(&self.data, b0 * BLOCK, n * BLOCK)
            .map_err(self.io(b0 * BLOCK))?;
        self.write_entries(b0, &entries)?;
        #[cfg(test)]
        if self.die_after_checksums.load(Ordering::Relaxed) {
            return Err(TargetError::Invalid("killed".into()));
        }
        if let Err(e) = self
            .pwrite(self.data_to_write(n * BLOCK), b0 * BLOCK, buf)
            .await
        {
            // The old data is still what the checksums must describe.
            let _ = self.write_entries(b0, &before);
            return Err(e);
        }
        self.lost.lock().remove(b0, b1);
        let mut st = self.state.lock();
        st.dirty.insert(b0, b1);
        if end > st.size {
            self.write_header(end)?;
            st.size = end;
        }
        Ok(())
    }

    /// Makes every write so far durable. Waits for reads and writes in flight.
    pub async fn sync(&self) -> Result<()> {
        let _gate = self.gate.write().await;
        self.sync_alone().await
    }

    /// The first change in this run to an object opened from disk makes what the page cache
    /// holds of it durable first: the last run may have written without syncing, and which
    /// contents are on the disk is unknown until then, so no write could move a block's
    /// `synced` slot, and contents synced in the last run would be stranded by two
    /// overwrites and a power cut. After it every block's durable contents are its `cur`.
    async fn settle(&self) -> Result<()> {
        if self.unsynced_since_open.load(Ordering::Acquire) {
            self.sync().await?;
        }
        Ok(())
    }

    async fn sync_alone(&self) -> Result<()> {
        if let Some((first, end)) = self.lost.lock().first() {
            return Err(TargetError::SyncFailed {
                fid: self.fid,
                reason: format!(
                    "an earlier sync failed and blocks {first}..{end} (or more) were not rewritten since"
                ),
            });
        }
        // The data file, the checksum file and a new object's directory are synced at once:
        // nothing orders their write-back before a sync (see docs/oss.md), so none needs to
        // wait for another, and the disk's journal takes them in one commit where it can.
        let dir = self.new_in.lock().clone();
        let (data, meta, dir_synced) = tokio::join!(
            self.engine.sync(&self.data),
            self.engine.sync(&self.meta),
            async {
                match &dir {
                    Some(dir) => self.engine.sync_dir(dir),
                    None => Ok(()),
                }
            }
        );
        if let Err(e) = data.and(meta).and(dir_synced) {
            // What was unsynced may be gone while the page cache says it is clean: poisoned
            // until rewritten. A sync that failed before anything was known durable in this
            // run may have lost any block.
            let (size, dirty) = {
                let st = self.state.lock();
                (st.size, st.dirty.0.clone())
            };
            {
                let mut lost = self.lost.lock();
                if self.unsynced_since_open.load(Ordering::Acquire) {
                    lost.insert(0, size.div_ceil(BLOCK).max(1));
                }
                for (s, e) in &dirty {
                    lost.insert(*s, *e);
                }
            }
            // The checksum file's pages of the failed write-back may have been dropped too,
            // while the data's reached the disk: written again as they are (each dirty
            // block's entry names its new contents and the last synced ones) and synced alone,
            // so that after a power cut a block holds contents its entry names, old or new.
            let rewritten = dirty
                .iter()
                .try_for_each(|(s, e)| self.write_entries(*s, &self.read_entries(*s, e - s)?))
                .and_then(|()| self.write_header(size));
            let resynced = match rewritten {
                Ok(()) => self.engine.sync(&self.meta).await.map_err(self.io(0)),
                Err(e) => Err(e),
            };
            if let Err(again) = resynced {
                tracing::error!(fid = %self.fid, error = %again, "the checksums of a failed sync could not be written again");
            }
            tracing::error!(fid = %self.fid, error = %e, "sync failed: the object's unsynced writes may be lost; its syncs fail until they are rewritten");
            return Err(TargetError::SyncFailed {
                fid: self.fid,
                reason: e.to_string(),
            });
        }
        if dir.is_some() {
            *self.new_in.lock() = None;
        }
        let dirty = std::mem::take(&mut self.state.lock().dirty);
        // Each block written since the last sync now holds its newest contents durably: its
        // entry says so (`synced = cur`), so that zeros read there later, where a disk lost
        // the range, are an error rather than a hole. The entries reach the disk with the
        // next sync or write-back; until then a crash leaves the weaker entry, which is true.
        let marked = dirty.0.iter().try_for_each(|(s, e)| {
            let mut entries = self.read_entries(*s, e - s)?;
            for entry in &mut entries {
                entry.2 = entry.0;
            }
            self.write_entries(*s, &entries)
        });
        if let Err(e) = marked {
            tracing::warn!(fid = %self.fid, error = %e, "synced blocks could not be marked durable in their checksum entries");
        }
        self.unsynced_since_open.store(false, Ordering::Release);
        Ok(())
    }

    /// A truncate's or a punch's place in its client's order over `start..end`, checked as a
    /// write's is (under the gate, which no write holds meanwhile): one older than a write it
    /// overlaps, already applied, is refused as stale.
    fn admit(&self, stamp: WriteStamp, floor: u64, start: u64, end: u64) -> Result<()> {
        if self.stamps.lock().admit(stamp, floor, start, end) {
            return Ok(());
        }
        Err(TargetError::Stale(format!(
            "a truncate or punch {} of client {:x} over {start}..{end} is older than a write already applied",
            stamp.xid, stamp.client
        )))
    }

    /// Sets the size; bytes past a shrunk size are gone and read as zeros if the object grows
    /// again. Durable on return.
    pub async fn truncate(&self, size: u64, stamp: WriteStamp, floor: u64) -> Result<()> {
        check_range(size, 0)?;
        let _gate = self.gate.write().await;
        self.admit(stamp, floor, size, MAX_OBJECT_SIZE)?;
        let old = self.state.lock().size;
        if size < old {
            let keep = size.div_ceil(BLOCK);
            if size % BLOCK != 0 {
                let zeros = vec![0u8; (BLOCK - size % BLOCK) as usize];
                self.write_blocks(size, keep * BLOCK, &zeros, None).await?;
            }
            self.engine
                .set_len(&self.data, keep * BLOCK)
                .map_err(self.io(size))?;
            self.engine
                .set_len(&self.meta, META_HEADER + keep * ENTRY)
                .map_err(self.io(size))?;
            self.state.lock().dirty.truncate(keep);
        }
        // Blocks cut off cannot hold lost writes any more.
        self.lost.lock().truncate(size.div_ceil(BLOCK));
        self.write_header(size)?;
        self.state.lock().size = size;
        self.sync_alone().await
    }

    /// Deallocates `offset..offset+len` within the object; it reads as zeros. The size does
    /// not change.
    pub async fn punch(&self, offset: u64, len: u64, stamp: WriteStamp, floor: u64) -> Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_OBJECT_SIZE)
            .ok_or_else(|| {
                TargetError::Invalid(format!(
                    "range {offset}+{len} is past the object size limit"
                ))
            })?;
        self.settle().await?;
        let _gate = self.gate.write().await;
        self.admit(stamp, floor, offset, end)?;
        let end = end.min(self.state.lock().size);
        if offset >= end {
            return Ok(());
        }
        let (first, last) = (offset.div_ceil(BLOCK), end / BLOCK);
        if first >= last {
            let zeros = vec![0u8; (end - offset) as usize];
            return self.write_blocks(offset, end, &zeros, None).await;
        }
        if offset < first * BLOCK {
            let zeros = vec![0u8; (first * BLOCK - offset) as usize];
            self.write_blocks(offset, first * BLOCK, &zeros, None)
                .await?;
        }
        if end > last * BLOCK {
            let zeros = vec![0u8; (end - last * BLOCK) as usize];
            self.write_blocks(last * BLOCK, end, &zeros, None).await?;
        }
        // Whole blocks: mark them unwritten (keeping the old checksum as `prev`), then free them.
        for chunk_start in (first..last).step_by(65536) {
            let chunk_end = (chunk_start + 65536).min(last);
            let mut entries = self.read_entries(chunk_start, chunk_end - chunk_start)?;
            let unknown = self.unsynced_since_open.load(Ordering::Acquire);
            let mut st = self.state.lock();
            for (i, e) in entries.iter_mut().enumerate() {
                if !unknown && !st.dirty.contains(chunk_start + i as u64) {
                    e.2 = e.0;
                }
                e.1 = e.0;
                e.0 = 0;
            }
            // Punched blocks hold no lost writes: they read as zeros, as they now must.
            self.lost.lock().remove(chunk_start, chunk_end);
            self.write_entries(chunk_start, &entries)?;
            st.dirty.insert(chunk_start, chunk_end);
        }
        self.engine
            .punch(&self.data, first * BLOCK, (last - first) * BLOCK)
            .map_err(self.io(first * BLOCK))
    }

    /// Reads every block and returns the offsets of those failing their checksum.
    pub async fn scrub(&self) -> Result<Vec<u64>> {
        const CHUNK: u64 = 256;
        let _gate = self.gate.read().await;
        let blocks = self.state.lock().size.div_ceil(BLOCK);
        let mut bad = vec![];
        for b0 in (0..blocks).step_by(CHUNK as usize) {
            let n = CHUNK.min(blocks - b0);
            let buf = self.pread(&self.data, b0 * BLOCK, n * BLOCK).await?;
            let entries = self.read_entries(b0, n)?;
            for (i, (block, e)) in buf.chunks(BLOCK as usize).zip(&entries).enumerate() {
                if !block_ok(block, *e) {
                    bad.push((b0 + i as u64) * BLOCK);
                }
            }
        }
        Ok(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::mem::MemEngine;

    async fn reopen(engine: &Arc<dyn Engine>) -> Object {
        let (data, meta) = (Path::new("/t/o"), Path::new("/t/o.cs"));
        Object::open(engine.clone(), Fid::new(1, 1, 0), data, meta)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_kill_between_checksum_and_data_leaves_every_written_block_readable() {
        let mem = Arc::new(MemEngine::new(1 << 30));
        let engine: Arc<dyn Engine> = mem.clone();
        let fid = Fid::new(1, 1, 0);
        engine.create_dir_all(Path::new("/t")).unwrap();
        drop(Object::create(engine.clone(), fid, Path::new("/t/o"), Path::new("/t/o.cs")).unwrap());
        engine.sync_dir(Path::new("/t")).unwrap();
        let none = WriteStamp::default();
        let obj = reopen(&engine).await;
        let synced = vec![1u8; BLOCK as usize];
        obj.write(0, &synced, true, none, 0).await.unwrap();
        let w1 = vec![2u8; BLOCK as usize];
        obj.write(0, &w1, false, none, 0).await.unwrap();
        // The second overwrite gets as far as its checksums; then the process is killed.
        obj.die_after_checksums.store(true, Ordering::Relaxed);
        let w2 = vec![3u8; BLOCK as usize];
        assert!(obj.write(0, &w2, false, none, 0).await.is_err());
        drop(obj);
        // The restarted server still reads the last write that completed ...
        let obj = reopen(&engine).await;
        assert_eq!(&obj.read(0, BLOCK).await.unwrap()[..], &w1[..]);
        // ... and a resent partial write goes through.
        obj.write(100, b"resent", false, none, 0).await.unwrap();
        let mut want = w1.clone();
        want[100..106].copy_from_slice(b"resent");
        assert_eq!(&obj.read(0, BLOCK).await.unwrap()[..], &want[..]);
        drop(obj);
        // A power cut now: the restarted server made what it found durable before its first
        // write (the last run's unsynced contents), so that is back, not the resent write.
        mem.crash();
        let obj = reopen(&engine).await;
        assert_eq!(&obj.read(0, BLOCK).await.unwrap()[..], &w1[..]);
        assert_ne!(w1, synced);
    }

    #[tokio::test]
    async fn a_synced_block_the_disk_then_lost_is_an_error_never_zeros() {
        let engine: Arc<dyn Engine> = Arc::new(MemEngine::new(1 << 30));
        engine.create_dir_all(Path::new("/t")).unwrap();
        let fid = Fid::new(1, 1, 0);
        drop(Object::create(engine.clone(), fid, Path::new("/t/o"), Path::new("/t/o.cs")).unwrap());
        let none = WriteStamp::default();
        let obj = reopen(&engine).await;
        let data = vec![7u8; 2 * BLOCK as usize];
        obj.write(0, &data, true, none, 0).await.unwrap(); // written once, synced
        obj.write(2 * BLOCK, &data[..BLOCK as usize], false, none, 0)
            .await
            .unwrap(); // written once, not synced
                       // The disk loses the data file's contents under the running server.
        engine.set_len(&obj.data, 0).unwrap();
        let err = obj.read(0, BLOCK).await.unwrap_err();
        assert!(
            matches!(err, TargetError::Checksum { offset: 0, .. }),
            "{err}"
        );
        assert!(obj.read(BLOCK, BLOCK).await.is_err());
        // An unsynced first write may be lost (a torn write leaves a hole): zeros stay good.
        assert_eq!(
            &obj.read(2 * BLOCK, BLOCK).await.unwrap()[..],
            &ZEROS[..BLOCK as usize]
        );
        // A block rewritten whole is good again, and so are punched ones.
        obj.write(0, &data[..BLOCK as usize], true, none, 0)
            .await
            .unwrap();
        assert_eq!(
            &obj.read(0, BLOCK).await.unwrap()[..],
            &data[..BLOCK as usize]
        );
        obj.punch(BLOCK, BLOCK, none, 0).await.unwrap();
        assert_eq!(
            &obj.read(BLOCK, BLOCK).await.unwrap()[..],
            &ZEROS[..BLOCK as usize]
        );
    }

    #[test]
    fn a_late_write_never_lands_over_a_newer_overlapping_one() {
        let mut s = Stamps::default();
        let st = |xid, oldest| WriteStamp {
            client: 7,
            xid,
            oldest,
        };
        assert!(s.admit(st(9, 5), 5, 0, 100));
        assert!(!s.admit(st(5, 5), 5, 50, 150), "older and overlapping");
        assert!(s.admit(st(6, 5), 5, 100, 200), "older but apart");
        assert!(
            !s.admit(st(4, 10), 10, 500, 600),
            "below the client's oldest in flight"
        );
        let other = WriteStamp {
            client: 8,
            xid: 1,
            oldest: 1,
        };
        assert!(
            s.admit(other, 1, 0, 100),
            "another client's order is its own"
        );
    }

    #[test]
    fn dirty_ranges_merge_and_truncate() {
        let mut d = Dirty::default();
        d.insert(0, 4);
        d.insert(4, 8);
        d.insert(10, 12);
        assert!(d.contains(0) && d.contains(7) && !d.contains(8) && d.contains(11));
        d.insert(6, 11);
        assert_eq!(d.0.len(), 1);
        d.truncate(5);
        assert!(d.contains(4) && !d.contains(5));
    }

    #[test]
    fn a_block_matches_either_slot_or_is_unwritten_zeros() {
        let data = [7u8; BLOCK as usize];
        let c = crc32c::crc32c(&data);
        assert!(block_ok(&data, (c, 1, 1)));
        assert!(block_ok(&data, (1, c, 1)));
        assert!(block_ok(&data, (1, 2, c)));
        assert!(!block_ok(&data, (1, 2, 3)));
        assert!(!block_ok(&data, (0, 0, 0)));
        assert!(block_ok(&[0u8; BLOCK as usize], (0, 0, 0)));
        assert!(block_ok(&[0u8; BLOCK as usize], (c, 1, 0)));
        assert!(!block_ok(&[0u8; BLOCK as usize], (c, 1, 2)));
        // A short last block of zeros is a hole too; one nonzero byte is not.
        assert!(block_ok(&[0u8; 100], (0, 0, 0)));
        let mut one = [0u8; BLOCK as usize];
        one[BLOCK as usize - 1] = 1;
        assert!(!block_ok(&one, (0, 0, 0)));
    }

    #[test]
    fn only_whole_blocks_of_zeros_at_the_end_are_cut() {
        let b = BLOCK as usize;
        assert_eq!(without_trailing_zeros(&[]), 0);
        assert_eq!(without_trailing_zeros(&vec![0u8; 3 * b]), 0);
        let mut d = vec![0u8; 3 * b + 10];
        d[b + 5] = 1;
        // The block holding data is kept whole, zeros and all.
        assert_eq!(without_trailing_zeros(&d), 2 * b);
        d[3 * b + 9] = 1;
        assert_eq!(without_trailing_zeros(&d), 3 * b + 10);
        d[3 * b + 9] = 0;
        d[b - 1] = 9;
        d[b + 5] = 0;
        assert_eq!(without_trailing_zeros(&d), b);
    }
}
