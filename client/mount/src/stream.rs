//! Write-behind and readahead for a file served to many small requests (the FUSE mount): the
//! kernel sends one request of at most 1 MiB at a time per stream, and these keep the striped
//! engine busy behind it.
//!
//! Writes are acknowledged once issued (small ones that follow one another or overlap, once
//! gathered into one write of up to 1 MiB, issued within 5 ms); a file's writes in flight are
//! awaited before anything reads it, asks its size, truncates it, flushes or syncs it, and the
//! first error is returned by the next of those (as NFS reports an unstable write's failure
//! at close). Overlapping writes never run at once, so the later one always wins. Readahead
//! starts after two sequential reads on a handle and keeps a window of chunks in flight; a
//! write to the file through any handle of this mount drops every window over it.

use proto::FsErrorKind;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use proto::Fid;
use tokio::task::{JoinHandle, JoinSet};

use client::{Access, Chunk, ClientError, File, Readahead, Result, Step, WriteBehind};

use crate::metrics::MountMetrics;
use std::time::Instant;

/// Writes in flight for one file: the tasks, the plan that says when the next may go, and
/// small writes gathered into one.
struct Behind {
    tasks: JoinSet<(u64, u64, Result<()>)>,
    plan: WriteBehind<ClientError>,
    gather: Option<Gather>,
    /// Where each write's time in flight is counted.
    metrics: Option<Arc<MountMetrics>>,
}

/// Small writes that follow one another, or overlap, through one handle, acknowledged and not
/// yet issued (the later write's bytes laid over the earlier's): they go to the storage
/// servers as one write when the next write neither follows on nor meets them, when
/// they reach `GATHER_MAX`, after `GATHER_LINGER` (an encrypted file's up to its last whole
/// block), or before anything that waits for the file's writes (a read, a size change, flush,
/// fsync, release).
struct Gather {
    file: Arc<File>,
    offset: u64,
    data: Vec<u8>,
}

/// A write this small starts or extends a gather.
const GATHER_SMALL: usize = 128 << 10;
/// A gather goes once it holds this much.
const GATHER_MAX: usize = 1 << 20;
/// And at the latest this long after it started.
const GATHER_LINGER: std::time::Duration = std::time::Duration::from_millis(5);
/// The storage servers' block: a write that starts or ends inside one makes the server read
/// the block and write it whole, and two writes that share one wait for each other there.
/// So large writes go to the servers cut at block boundaries, the part past the last one
/// held back as a gather for the write that follows.
const BLOCK: u64 = 4096;

/// Where `data` at `offset` is cut so that the part before ends on a block boundary: `None`
/// where it already does, or where no whole block lies before the cut.
fn block_cut(offset: u64, len: usize) -> Option<usize> {
    let end = offset + len as u64;
    let aligned = end / BLOCK * BLOCK;
    (end % BLOCK != 0 && aligned > offset).then(|| (aligned - offset) as usize)
}

/// Issues the file's gather, whatever it holds then, [`GATHER_LINGER`] from now.
fn linger(per: &Arc<PerFile>) {
    // Weak: a file released meanwhile (its gather issued then) is forgotten, not kept.
    let per = Arc::downgrade(per);
    tokio::spawn(async move {
        tokio::time::sleep(GATHER_LINGER).await;
        if let Some(per) = per.upgrade() {
            per.behind.lock().await.lingered().await;
        }
    });
}

impl Default for Behind {
    fn default() -> Self {
        Behind {
            tasks: JoinSet::new(),
            plan: WriteBehind::new(MAX_BEHIND),
            gather: None,
            metrics: None,
        }
    }
}

impl Behind {
    /// Nothing gathered, in flight, or failed and not yet reported: the file's state may be
    /// forgotten with nothing lost.
    fn idle(&self) -> bool {
        self.gather.is_none()
            && self.tasks.is_empty()
            && self.plan.in_flight() == 0
            && !self.plan.has_error()
    }

    /// Puts a write in flight.
    fn spawn(&mut self, file: Arc<File>, offset: u64, data: Vec<u8>) {
        let end = offset + data.len() as u64;
        // The size shows the write at once, as the kernel expects after the reply.
        file.issued_to(end);
        self.plan.issued(offset, end);
        let metrics = self.metrics.clone();
        lnet::job::spawn_in(&mut self.tasks, async move {
            let issued = Instant::now();
            // The kernel's bytes (or the gathered ones), registered as they are: no copy.
            let len = data.len() as u64;
            let r = match file.client().register(data) {
                Ok(region) => file
                    .write_from(offset, Arc::new(region), 0, len)
                    .await
                    .map(|_| ()),
                Err(e) => Err(e),
            };
            if r.is_err() {
                // Acknowledged already: the file must not claim these bytes.
                file.landing_failed(offset);
            }
            if let Some(m) = &metrics {
                m.stage("write_behind", issued);
            }
            (offset, end, r)
        });
    }

    /// The gather has lingered its time: it goes. An encrypted file's keeps the part past its
    /// last whole block for the write that follows on (or for whatever waits for the file's
    /// writes): sent alone, that unit would be read back, decrypted and written again whole
    /// by the write that continues it, one at a time.
    async fn lingered(&mut self) {
        if let Some(g) = self.gather.as_mut().filter(|g| g.file.encrypted()) {
            if (g.offset + g.data.len() as u64) % BLOCK != 0 {
                let Some(cut) = block_cut(g.offset, g.data.len()) else {
                    return; // under a block: kept whole
                };
                let tail = Gather {
                    file: g.file.clone(),
                    offset: g.offset + cut as u64,
                    data: g.data.split_off(cut),
                };
                self.issue_gather().await;
                self.gather = Some(tail);
                return;
            }
        }
        self.issue_gather().await;
    }

    /// Puts the gathered writes in flight, after every write in flight they overlap (and
    /// within the limit of writes in flight). They go even after an earlier failure: the
    /// failure is reported by the next call that waits, as it would be without the gather.
    async fn issue_gather(&mut self) {
        let Some(g) = self.gather.take() else {
            return;
        };
        let end = g.offset + g.data.len() as u64;
        while self.plan.overlaps(g.offset, end) || self.plan.in_flight() >= MAX_BEHIND {
            self.land_one().await;
        }
        self.spawn(g.file, g.offset, g.data);
    }

    /// Waits for any one write in flight.
    async fn land_one(&mut self) {
        match self.tasks.join_next().await {
            Some(Ok((start, end, r))) => self.plan.landed(start, end, r),
            Some(Err(e)) => self
                .plan
                .lost(ClientError::fs(FsErrorKind::Io, e.to_string())),
            None => self.plan.drained(),
        }
    }

    /// Waits for every write, gathered or in flight.
    async fn drain(&mut self) {
        self.issue_gather().await;
        while !self.tasks.is_empty() {
            self.land_one().await;
        }
        self.plan.drained();
    }
}

/// Writes in flight per file before a new one waits.
const MAX_BEHIND: usize = 16;

/// A read of a small file begun before its open was answered ([`Streams::read_early`]), with
/// the file's write epoch when it began.
pub struct Early {
    per: Arc<PerFile>,
    epoch: u64,
    read: client::EarlyRead,
}

/// The state of one file across the handles of this mount.
#[derive(Default)]
struct PerFile {
    behind: tokio::sync::Mutex<Behind>,
    /// Bumped by every write or size change, so readahead windows know they are stale.
    epoch: std::sync::atomic::AtomicU64,
}

/// A handle's readahead window: the plan, and the chunks it asked for, in file order, each
/// holding its share of the mount's budget until it leaves the window.
pub struct Ahead {
    plan: Readahead,
    epoch: u64,
    chunks: VecDeque<(u64, Pending, Permit)>,
    /// The first bytes of a small file, on their way since the handle was opened, with the
    /// file's writes and size changes (held, so that they are counted on) and their count
    /// then (see [`Streams::read_first`]).
    first: Option<(Arc<PerFile>, u64, Pending)>,
}

/// A file this small opened to be read is read whole from its open on.
pub const FIRST: u64 = 64 << 10;

/// The readahead memory of a whole mount, in chunks: what every handle's window holds
/// together stays within it, except that a stream whose window is empty may always take the
/// one chunk under its read, so that no reader waits on another's window.
pub struct Budget {
    held: AtomicUsize,
    most: usize,
}

/// One chunk's share of the budget, given back when the chunk is dropped.
struct Permit(Arc<Budget>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Budget {
    pub fn new(bytes: u64) -> Arc<Budget> {
        Arc::new(Budget {
            held: AtomicUsize::new(0),
            most: (bytes / CHUNK as u64).max(1) as usize,
        })
    }

    /// How many chunks may be taken now, `at_least` even when the budget is spent.
    fn free(&self, at_least: usize) -> usize {
        self.most
            .saturating_sub(self.held.load(Ordering::Acquire))
            .max(at_least)
    }

    fn take(self: &Arc<Self>) -> Permit {
        self.held.fetch_add(1, Ordering::AcqRel);
        Permit(self.clone())
    }

    /// Chunks held now by every window of the mount.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// A chunk of the window: on its way, or landed (and partly read by the kernel already).
enum Pending {
    Reading(JoinHandle<Result<Chunk>>),
    Landed(Arc<Chunk>),
}

impl Pending {
    async fn landed(self) -> Result<Arc<Chunk>> {
        match self {
            Pending::Landed(c) => Ok(c),
            Pending::Reading(h) => {
                Ok(Arc::new(h.await.map_err(|e| {
                    ClientError::fs(FsErrorKind::Io, e.to_string())
                })??))
            }
        }
    }
}

impl Default for Ahead {
    fn default() -> Self {
        Ahead {
            plan: Readahead::new(CHUNK as u64, AHEAD, 2),
            epoch: 0,
            chunks: VecDeque::new(),
            first: None,
        }
    }
}

impl Ahead {
    /// Cancels the reads in flight and waits until they let go of the file.
    pub async fn stop(&mut self) {
        self.plan.reset();
        if let Some((_, _, Pending::Reading(h))) = self.first.take() {
            h.abort();
            let _ = h.await;
        }
        for (_, p, _) in self.chunks.drain(..) {
            if let Pending::Reading(h) = p {
                h.abort();
                let _ = h.await;
            }
        }
    }

    /// Forgets the chunks the plan no longer wants (dropping a handle leaves its read to
    /// finish unseen).
    fn drop_chunks(&mut self, starts: &[u64]) {
        self.chunks.retain(|(s, _, _)| !starts.contains(s));
    }
}

/// Bytes for one read of the kernel: a slice of a chunk that landed once in registered memory,
/// or (a read spanning chunks, or not part of a stream) bytes of their own.
pub enum ReadOut {
    Slice(Arc<Chunk>, std::ops::Range<usize>),
    Chunk(Chunk),
    Joined(Vec<u8>),
}

impl ReadOut {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ReadOut::Slice(c, r) => &c[r.clone()],
            ReadOut::Chunk(c) => c,
            ReadOut::Joined(v) => v,
        }
    }
}

/// Readahead chunk size and how many chunks stay in flight per handle.
const CHUNK: usize = 1 << 20;
const AHEAD: usize = 16;

/// The readahead memory of a mount unless `-o readahead_memory_mb=N` says otherwise: sixteen
/// streams at full depth.
pub const READAHEAD_MEMORY: u64 = 256 << 20;

/// Write-behind and readahead for the files of one mount.
pub struct Streams {
    files: Mutex<HashMap<Fid, Arc<PerFile>>>,
    budget: Arc<Budget>,
    /// Where the time of each stage is counted, when the mount counts.
    metrics: std::sync::OnceLock<Arc<MountMetrics>>,
}

impl Default for Streams {
    fn default() -> Self {
        Streams::new(READAHEAD_MEMORY)
    }
}

impl Streams {
    /// Streams whose readahead windows hold at most `readahead_bytes` together.
    pub fn new(readahead_bytes: u64) -> Streams {
        Streams {
            files: Mutex::default(),
            budget: Budget::new(readahead_bytes),
            metrics: std::sync::OnceLock::new(),
        }
    }

    /// Counts the time of each stage in `metrics` from now on.
    pub fn count_in(&self, metrics: Arc<MountMetrics>) {
        let _ = self.metrics.set(metrics);
    }

    fn stage(&self, stage: &'static str, since: Instant) {
        if let Some(m) = self.metrics.get() {
            m.stage(stage, since);
        }
    }

    /// A file's state, counting its writes where the mount counts.
    fn new_file(&self) -> Arc<PerFile> {
        let per = PerFile::default();
        per.behind.try_lock().expect("a new lock").metrics = self.metrics.get().cloned();
        Arc::new(per)
    }

    /// The mount's readahead budget.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    fn of(&self, fid: Fid) -> Arc<PerFile> {
        self.files
            .lock()
            .entry(fid)
            .or_insert_with(|| self.new_file())
            .clone()
    }

    /// Forgets a file no handle holds any more, once its writes have landed.
    pub async fn release(&self, fid: Fid) -> Result<()> {
        let r = self.settle(fid).await;
        let Some(per) = self.files.lock().get(&fid).cloned() else {
            return r;
        };
        // Another handle of the file may have written since the settle: its writes, gathered
        // or in flight, live in this state, and are forgotten with it only once landed.
        let b = per.behind.lock().await;
        if b.idle() {
            let mut files = self.files.lock();
            if files
                .get(&fid)
                .is_some_and(|p| Arc::ptr_eq(p, &per) && Arc::strong_count(p) == 2)
            {
                files.remove(&fid);
            }
        }
        r
    }

    /// Issues a write and returns once it is in flight (or, at the limit, once an earlier one
    /// landed). An earlier write's failure is returned instead.
    pub async fn write(&self, file: &Arc<File>, offset: u64, data: Vec<u8>) -> Result<()> {
        let admitted = Instant::now();
        let r = self.admit_write(file, offset, data).await;
        self.stage("write_wait", admitted);
        r
    }

    async fn admit_write(&self, file: &Arc<File>, offset: u64, data: Vec<u8>) -> Result<()> {
        let fid = file.fid();
        let per = self.of(fid);
        per.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut b = per.behind.lock().await;
        let end = offset + data.len() as u64;
        // Following on from the gather, through the same handle, with room: joins it.
        let b = &mut *b;
        if let Some(g) = &mut b.gather {
            // Following on, or overlapping what is gathered (a file server rewrites a
            // header, or writes a file's last byte and then its whole): the bytes are laid
            // over the gathered ones, as the later write wins, instead of waiting for the
            // earlier to land first.
            let g_end = g.offset + g.data.len() as u64;
            let (from, to) = (g.offset.min(offset), g_end.max(end));
            let joins = Arc::ptr_eq(&g.file, file)
                && offset <= g_end
                && end >= g.offset
                && to - from <= GATHER_MAX as u64
                && matches!(b.plan.before(offset, end), Step::Issue);
            if joins {
                if from < g.offset {
                    let mut joined = vec![0u8; (to - from) as usize];
                    let at = (g.offset - from) as usize;
                    joined[at..at + g.data.len()].copy_from_slice(&g.data);
                    g.data = joined;
                    g.offset = from;
                } else if to > g_end {
                    g.data.resize((to - from) as usize, 0);
                }
                // Every byte the union added is covered by this write (the two ranges
                // meet), so nothing is left as the zeros it was made with.
                let at = (offset - g.offset) as usize;
                g.data[at..at + data.len()].copy_from_slice(&data);
                file.issued_to(end);
                if g.data.len() >= GATHER_MAX {
                    let tail = block_cut(g.offset, g.data.len()).map(|cut| Gather {
                        file: g.file.clone(),
                        offset: g.offset + cut as u64,
                        data: g.data.split_off(cut),
                    });
                    b.issue_gather().await;
                    if let Some(tail) = tail {
                        b.gather = Some(tail);
                        linger(&per);
                    }
                }
                return Ok(());
            }
        }
        // An encrypted file's write that follows on from a gather ending inside a block takes
        // the gathered bytes of that block with it: sent alone, the block (a unit of the
        // cipher) would be read back, decrypted and written again whole by this write.
        let mut offset = offset;
        let mut data = data;
        let carries = b.gather.as_ref().is_some_and(|g| {
            Arc::ptr_eq(&g.file, file)
                && file.encrypted()
                && offset == g.offset + g.data.len() as u64
                && offset % BLOCK != 0
        });
        if carries {
            let g = b.gather.as_mut().expect("checked");
            let cut = block_cut(g.offset, g.data.len()).unwrap_or(0);
            let mut carried = g.data.split_off(cut);
            offset = g.offset + cut as u64;
            if g.data.is_empty() {
                b.gather = None;
            }
            carried.extend_from_slice(&data);
            data = carried;
        }
        b.issue_gather().await;
        loop {
            match b.plan.before(offset, end) {
                Step::Report => return Err(b.plan.take_error().expect("an error to report")),
                Step::Drain => b.drain().await,
                Step::WaitOne => b.land_one().await,
                Step::Issue => break,
            }
        }
        if data.len() >= GATHER_SMALL {
            let Some(cut) = block_cut(offset, data.len()) else {
                b.spawn(file.clone(), offset, data);
                return Ok(());
            };
            // The blocks it covers whole go now; the rest waits for the next write, as the
            // kernel cuts a large write from a buffer not aligned to a page (Python's, most
            // often) into a large part and a few bytes.
            let tail = data.split_off(cut);
            b.spawn(file.clone(), offset, data);
            (offset, data) = (offset + cut as u64, tail);
        }
        // The size shows the write at once, as the kernel expects after the reply.
        file.issued_to(end);
        b.gather = Some(Gather {
            file: file.clone(),
            offset,
            data,
        });
        linger(&per);
        Ok(())
    }

    /// Waits for the file's writes in flight, keeping any failure for `settle` to report.
    pub async fn wait(&self, fid: Fid) {
        let Some(per) = self.files.lock().get(&fid).cloned() else {
            return;
        };
        per.behind.lock().await.drain().await;
    }

    /// Waits for the file's writes in flight; returns the first failure not yet reported.
    pub async fn settle(&self, fid: Fid) -> Result<()> {
        let Some(per) = self.files.lock().get(&fid).cloned() else {
            return Ok(());
        };
        let mut b = per.behind.lock().await;
        b.drain().await;
        match b.plan.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Marks the file changed other than by `write` (truncate, hole punching).
    pub fn changed(&self, fid: Fid) {
        if let Some(per) = self.files.lock().get(&fid) {
            per.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Begins reading a small file of `client`'s caller before its open is answered, where
    /// the client can ([`client::early`]); the file's write epoch is taken first, so that a
    /// write through this mount meanwhile leaves the bytes unused.
    pub fn read_early(&self, client: &client::Client, fid: Fid) -> Option<Early> {
        let (per, fresh) = {
            let mut files = self.files.lock();
            match files.get(&fid) {
                Some(p) => (p.clone(), false),
                None => {
                    let p = self.new_file();
                    files.insert(fid, p.clone());
                    (p, true)
                }
            }
        };
        let epoch = per.epoch.load(Ordering::SeqCst);
        match client.read_early(fid, FIRST) {
            Some(read) => Some(Early { per, epoch, read }),
            None => {
                drop(per);
                if fresh {
                    self.forget_unused(fid);
                }
                None
            }
        }
    }

    /// Forgets the entry of `fid` if nothing holds it (a read begun early for an open that
    /// failed or went without reading).
    pub fn forget_unused(&self, fid: Fid) {
        let mut files = self.files.lock();
        let idle = files.get(&fid).is_some_and(|p| {
            Arc::strong_count(p) == 1 && p.behind.try_lock().is_ok_and(|b| b.idle())
        });
        if idle {
            files.remove(&fid);
        }
    }

    /// Starts reading the first [`FIRST`] bytes of `file` for the first read of the handle
    /// whose window is `ahead`: a small file opened to be read has its read on the way while
    /// the open's answer goes back to the caller, instead of after the caller asks (or since
    /// before the open was sent: `early`). It is the read the caller's would have made (from
    /// the attributes of the open), and is not used once anything wrote to the file through
    /// this mount.
    pub fn read_first(
        &self,
        file: &Arc<File>,
        ahead: &tokio::sync::Mutex<Ahead>,
        early: Option<Early>,
    ) {
        let (per, epoch, early) = match early {
            Some(e) => (e.per, e.epoch, Some(e.read)),
            None => {
                let per = self.of(file.fid());
                let epoch = per.epoch.load(Ordering::SeqCst);
                (per, epoch, None)
            }
        };
        // Writes of this mount gathered or still in flight: the read could overtake them.
        if per.behind.try_lock().map_or(true, |b| !b.idle()) {
            return;
        }
        let Ok(mut a) = ahead.try_lock() else {
            return;
        };
        let f = file.clone();
        let read = lnet::job::spawn(async move {
            if let Some(early) = early {
                if let Some(chunk) = early.take(&f.inode()).await {
                    return Ok(chunk);
                }
            }
            f.read_chunk(0, FIRST as usize).await
        });
        a.first = Some((per, epoch, Pending::Reading(read)));
    }

    /// Reads `size` bytes at `offset` through `ahead`, the handle's window.
    pub async fn read(
        &self,
        file: &Arc<File>,
        ahead: &tokio::sync::Mutex<Ahead>,
        offset: u64,
        size: usize,
    ) -> Result<ReadOut> {
        let fid = file.fid();
        self.wait(fid).await;
        let epoch = self.of(fid).epoch.load(std::sync::atomic::Ordering::SeqCst);
        let mut a = ahead.lock().await;
        if a.epoch != epoch {
            let stale = a.plan.reset();
            a.drop_chunks(&stale);
            a.epoch = epoch;
        }
        if let Some((per, at, first)) = a.first.take() {
            // The bytes read at the open, while nothing wrote to the file since: what they
            // hold of the read (all of it, or all up to the end of a file shorter than them).
            if at == per.epoch.load(Ordering::SeqCst) && offset < FIRST {
                let chunk = first.landed().await?;
                let end = offset + size as u64;
                if end <= chunk.len() as u64 || (chunk.len() as u64) < FIRST {
                    let from = (offset as usize).min(chunk.len());
                    let to = (end as usize).min(chunk.len());
                    return Ok(ReadOut::Slice(chunk, from..to));
                }
            }
        }
        let (access, dropped) = a.plan.observe(offset, size as u64);
        a.drop_chunks(&dropped);
        // Not (yet) a stream, or a read of the stream that arrived after its chunk left the
        // window: read directly, letting other reads of the handle run too.
        let behind = a.chunks.front().is_some_and(|(s, _, _)| *s > offset);
        if access == Access::Direct || behind {
            drop(a);
            let direct = Instant::now();
            let chunk = file.read_chunk(offset, size).await;
            self.stage("read_direct", direct);
            return Ok(ReadOut::Chunk(chunk?));
        }
        let end = offset + size as u64;
        let mut parts: Vec<ReadOut> = vec![];
        let mut at = offset;
        while at < end {
            top_up(file, &mut a, &self.budget);
            let Some((start, pending, permit)) = a.chunks.pop_front() else {
                break; // past the end of the file
            };
            let waited = matches!(pending, Pending::Reading(_)).then(Instant::now);
            let chunk = pending.landed().await;
            if let Some(since) = waited {
                self.stage("read_wait", since);
            }
            let chunk = chunk?;
            a.plan.landed(start, chunk.len() as u64);
            let chunk_end = start + chunk.len() as u64;
            if at >= chunk_end {
                a.plan.consumed(start);
                if (chunk.len() as u64) < a.plan.chunk() {
                    break;
                }
                continue;
            }
            let from = (at - start) as usize;
            let to = (end.min(chunk_end) - start) as usize;
            at = start + to as u64;
            parts.push(ReadOut::Slice(chunk.clone(), from..to));
            if to < chunk.len() {
                // The rest of this chunk is the next read's start: keep it at the front.
                a.chunks.push_front((start, Pending::Landed(chunk), permit));
                break;
            }
            a.plan.consumed(start);
            if (chunk.len() as u64) < a.plan.chunk() {
                break;
            }
        }
        top_up(file, &mut a, &self.budget);
        Ok(match parts.len() {
            0 => ReadOut::Joined(vec![]),
            1 => parts.pop().expect("one part"),
            _ => ReadOut::Joined(parts.iter().flat_map(|p| p.as_slice().to_vec()).collect()),
        })
    }
}

/// Issues the chunks the plan wants on their way, as far as the mount's budget allows.
fn top_up(file: &Arc<File>, a: &mut Ahead, budget: &Arc<Budget>) {
    let free = budget.free(usize::from(a.chunks.is_empty()));
    for (at, len) in a.plan.issue_at_most(free) {
        let f = file.clone();
        let permit = budget.take();
        let read = lnet::job::spawn(async move { f.read_chunk(at, len as usize).await });
        a.chunks.push_back((at, Pending::Reading(read), permit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_shared_and_given_back_when_chunks_go() {
        let b = Budget::new(3 * CHUNK as u64);
        assert_eq!(b.free(0), 3);
        let held: Vec<Permit> = (0..3).map(|_| b.take()).collect();
        assert_eq!(
            (b.free(0), b.free(1)),
            (0, 1),
            "spent, but a stream may take its one"
        );
        drop(held);
        assert_eq!((b.held(), b.free(0)), (0, 3));
        assert_eq!(Budget::new(1).free(0), 1, "at least one chunk");
    }

    #[test]
    fn a_large_write_is_cut_at_its_last_block_boundary() {
        // Python's 1 MiB buffer, 32 bytes into a page: the kernel sends 1 MiB - 32 bytes.
        assert_eq!(block_cut(0, (1 << 20) - 32), Some((1 << 20) - 4096));
        assert_eq!(block_cut(1 << 20, 1 << 20), None, "aligned already");
        assert_eq!(block_cut(100, 3000), None, "no whole block before the cut");
        assert_eq!(block_cut(4000, 200), Some(96));
        // Starting inside a block: the first part still ends on a boundary (257 blocks in).
        assert_eq!(block_cut(4064, (1 << 20) + 64), Some(257 * 4096 - 4064));
    }
}
