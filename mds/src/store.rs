//! The durable namespace: mutations are applied in memory in order, appended to the journal,
//! and acknowledged once a group commit has made them durable.
//!
//! One committer thread writes whatever has accumulated since its last fsync in one append and
//! one fsync, so concurrent operations share the cost of a flush (group commit). A caller waits
//! for the committer to pass its record's sequence number. When the journal grows past
//! `checkpoint_bytes`, the committer writes a snapshot and empties the journal.
//!
//! Reads see every applied mutation, including ones whose flush is still in progress; a
//! mutation is acknowledged to its caller only when durable. If the journal cannot be written,
//! the store refuses every later mutation: memory would otherwise run ahead of the disk.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use concur::commit::{Batch, CommitQueue};
use parking_lot::Mutex;
use proto::md::{Creds, Mutation, Time};
use tokio::sync::watch;

use crate::disk::{DirDisk, MetaDisk};
use crate::journal::{
    self, encode_batch, encode_record, JournalError, JournalWriter, Record, Ticket,
};
use crate::namespace::{Applied, Decision, Namespace, NsError};

/// Journal size that triggers a snapshot.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;
/// Most bytes of records waiting for a flush; past it, mutations wait.
const MAX_PENDING: usize = 64 << 20;
/// The file that holds the mark of inode numbers given out (see [`Store::skip_given_out`]).
const MARK_FILE: &str = "inomark";
/// How far ahead of the next inode number the mark is set: one write of the mark file per
/// this many creates.
const MARK_AHEAD: u32 = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Namespace(#[from] NsError),
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("the journal failed earlier; the MDS accepts no more changes until restarted")]
    Failed,
    /// Another client still holds a lease on an inode the change touches: recall it and try
    /// again.
    #[error("an inode the change touches is leased")]
    Leased,
    /// A copy of a request its client already had the reply to (the network held it back):
    /// answered with nothing, never carried out again.
    #[error("a stale copy of a request already answered")]
    StaleRequest,
}

struct Shared {
    ns: Mutex<(Namespace, u64)>,
    /// Records waiting for the next group commit.
    queue: CommitQueue,
    durable: watch::Sender<Result<u64, ()>>,
    /// The commit interval, in nanoseconds: after a commit, the committer waits this long
    /// (gathering a larger group) unless someone waits for durability.
    interval_ns: std::sync::atomic::AtomicU64,
    /// Set by a caller waiting for durability; cuts the interval short.
    hurry: (std::sync::Mutex<bool>, std::sync::Condvar),
    /// Set by [`Store::halt`]: nothing more is written, as after a kill -9.
    halted: std::sync::atomic::AtomicBool,
    /// Where group commits are counted, once the server has metrics.
    metrics: std::sync::OnceLock<Arc<crate::metrics::MdsMetrics>>,
}

impl Shared {
    fn hurry(&self) {
        if self.interval_ns.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return;
        }
        *self.hurry.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.hurry.1.notify_one();
    }

    /// Waits out the commit interval from `since`, unless hurried.
    fn pause(&self, since: std::time::Instant) {
        let ns = self.interval_ns.load(std::sync::atomic::Ordering::Relaxed);
        if ns == 0 {
            return;
        }
        let until = since + std::time::Duration::from_nanos(ns);
        let mut hurried = self.hurry.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = std::time::Instant::now();
            if *hurried || now >= until {
                break;
            }
            hurried = match self.hurry.1.wait_timeout(hurried, until - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        *hurried = false;
    }
}

/// A change applied before it is durable.
pub struct Done {
    pub applied: Applied,
    /// Its transaction number (a resend's: the last applied, to wait for).
    pub transno: u64,
    /// What replays it exactly (a [`Ticket`], encoded); `None` for a resend answered from
    /// the reply cache.
    pub ticket: Option<Vec<u8>>,
    /// The inodes whose attributes or entries it changed ([`Namespace::touched`]).
    pub touched: Vec<proto::Fid>,
    /// Those of them asked for, as the change left them (read under the same lock).
    pub after: Vec<proto::md::Inode>,
}

const MARK_MAGIC: [u8; 8] = *b"LODEMRK\0";

/// The mark of inode numbers given out, as the last run left it (0 where none was written).
///
/// ```text
/// inomark file:  "LODEMRK\0" (8) | mark u32 | crc32c(mark) u32
/// ```
fn read_mark(disk: &dyn MetaDisk) -> Result<u32, JournalError> {
    let raw = disk.read(MARK_FILE).map_err(|source| JournalError::Io {
        name: MARK_FILE,
        source,
    })?;
    let Some(raw) = raw else { return Ok(0) };
    let damaged = |reason: &str| JournalError::Damaged {
        name: MARK_FILE,
        reason: reason.into(),
    };
    if raw.len() != 16 || raw[..8] != MARK_MAGIC {
        return Err(damaged("not a mark of inode numbers"));
    }
    let mark = [raw[8], raw[9], raw[10], raw[11]];
    if crc32c::crc32c(&mark).to_le_bytes() != raw[12..16] {
        return Err(damaged("checksum mismatch"));
    }
    Ok(u32::from_le_bytes(mark))
}

/// Who writes the journal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommitMode {
    /// A committer thread: concurrent changes share one append and one fsync (group commit).
    #[default]
    Thread,
    /// The caller that queued a change writes the queue at once, on its own thread: for a
    /// simulated cluster on one thread and a virtual clock, where no other thread may run.
    Inline,
    /// As `Inline`, but changes stay queued (answered before they are durable) until a caller
    /// waits for durability or [`Store::commit_queued`] is called: a simulated cluster whose
    /// MDS commits behind, so that a crash loses what its clients must replay.
    Deferred,
}

pub struct Store {
    shared: Arc<Shared>,
    disk: Arc<dyn MetaDisk>,
    committer: Option<std::thread::JoinHandle<()>>,
    /// With [`CommitMode::Inline`] or [`CommitMode::Deferred`], the committer callers run.
    inline: Option<Mutex<Committer>>,
    /// [`CommitMode::Deferred`]: callers commit only when they wait for durability.
    deferred: bool,
    pub recovered_records: u64,
    pub torn_bytes: u64,
    /// No earlier run served this namespace (it was made, or formatted, for this one): no
    /// client of one can hold changes to replay.
    pub fresh: bool,
    clock: Clock,
    /// Where this run's size generations start: random, so none of an earlier run matches.
    gen_salt: u64,
    /// The mark on disk: no inode number at or above it was given out (changed under the
    /// namespace's lock).
    mark: std::sync::atomic::AtomicU32,
    /// Set once recovery is over: the next change first numbers new inodes past the mark.
    skip_due: std::sync::atomic::AtomicBool,
}

/// Where the MDS reads the time it stamps on changes.
pub type Clock = Arc<dyn Fn() -> Time + Send + Sync>;

/// The system's wall clock.
pub fn wall_clock() -> Clock {
    Arc::new(|| {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    })
}

/// The time a change is stamped with: the client's `asked`, where it is no more than
/// [`proto::md::CLIENT_TIME_SKEW`] ahead of the clock's `now` and no more than
/// [`proto::md::CLIENT_TIME_LAG`] behind it; `now` otherwise.
fn stamp_time(now: Time, asked: Option<Time>) -> Time {
    let nanos = |t: Time| i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec);
    let Some(t) = asked else {
        return now;
    };
    let ahead = nanos(t) - nanos(now);
    let fits = ahead <= proto::md::CLIENT_TIME_SKEW.as_nanos() as i128
        && -ahead <= proto::md::CLIENT_TIME_LAG.as_nanos() as i128;
    if fits {
        t
    } else {
        now
    }
}

/// A change for the store to apply, and what it is applied under: the one argument of
/// [`Store::apply`] and [`Store::apply_behind`].
pub struct Change<'a> {
    pub mutation: Mutation,
    /// Who asks (after the nodemap).
    pub who: Creds,
    /// The client's request it answers: a resend gets the first reply.
    pub req: Option<proto::md::ReqId>,
    /// Applied only while this is still the size generation of the file the change changes
    /// (a writer's size, published late, never undoes a truncate).
    pub size_gen: Option<u64>,
    /// The time the client stamped it with (a create answered ahead).
    pub time: Option<Time>,
    /// Applied only if this holds for the inodes the change touches.
    pub clear: &'a (dyn Fn(&[proto::Fid]) -> bool + Sync),
    /// The touched inodes whose attributes come back.
    pub after: &'a (dyn Fn(&proto::Fid) -> bool + Sync),
}

impl Change<'static> {
    /// `mutation` by `who`, with nothing more to check.
    pub fn new(mutation: Mutation, who: Creds) -> Change<'static> {
        Change {
            mutation,
            who,
            req: None,
            size_gen: None,
            time: None,
            clear: &|_| true,
            after: &|_| false,
        }
    }
}

impl<'a> Change<'a> {
    /// As the answer to the client's request `req`.
    pub fn request(self, req: Option<proto::md::ReqId>) -> Change<'a> {
        Change { req, ..self }
    }
}

impl Store {
    /// Recovers the namespace kept in `dir` (or starts one) and starts the committer.
    pub fn open(dir: &Path, checkpoint_bytes: u64) -> Result<Store, StoreError> {
        Self::open_on(Arc::new(DirDisk::new(dir)), checkpoint_bytes)
    }

    /// Recovers the namespace kept on `disk` (or starts one) and starts the committer.
    pub fn open_on(disk: Arc<dyn MetaDisk>, checkpoint_bytes: u64) -> Result<Store, StoreError> {
        Self::open_with(disk, checkpoint_bytes, CommitMode::Thread, wall_clock())
    }

    /// As [`Store::open_on`], committing as `mode` says.
    pub fn open_with(
        disk: Arc<dyn MetaDisk>,
        checkpoint_bytes: u64,
        mode: CommitMode,
        clock: Clock,
    ) -> Result<Store, StoreError> {
        let now = || clock();
        let exists = |name| {
            disk.exists(name).map_err(|source| JournalError::Io {
                name: "data directory",
                source,
            })
        };
        // A journal is made at the first open: without one, no run has served this namespace
        // (it is new, or only formatted) and no client can hold changes of an earlier run.
        let fresh = !exists("journal")?;
        // The MDT the disk holds numbers its inodes in its own sequence (a disk without an
        // identity, in tests, is MDT0's).
        let mdt = crate::format::read(&*disk, "data directory")
            .ok()
            .flatten()
            .map_or(0, |id| id.mdt);
        let rec = journal::recover(&*disk, Namespace::for_mdt(mdt, now()))?;
        if fresh && !exists("snapshot")? {
            // A new filesystem: its root (and the time it was made) is durable from the start.
            journal::write_snapshot(&*disk, &rec.namespace, 0)?;
        }
        let writer = JournalWriter::open(disk.clone(), rec.journal_len)?;
        if rec.torn > 0 {
            tracing::warn!(bytes = rec.torn, "cut a torn tail off the journal");
        }
        tracing::info!(
            records = rec.replayed,
            inodes = rec.namespace.len(),
            seq = rec.last_seq,
            "namespace recovered"
        );
        let mark = read_mark(&*disk)?;
        let (tx, _) = watch::channel(Ok(rec.last_seq));
        let shared = Arc::new(Shared {
            ns: Mutex::new((rec.namespace, rec.last_seq)),
            queue: CommitQueue::new(rec.last_seq, MAX_PENDING),
            durable: tx,
            interval_ns: Default::default(),
            hurry: Default::default(),
            halted: Default::default(),
            metrics: Default::default(),
        });
        let committer = Committer {
            shared: shared.clone(),
            writer,
            disk: disk.clone(),
            checkpoint_bytes,
        };
        let (thread, inline) = match mode {
            CommitMode::Thread => {
                let t = std::thread::Builder::new()
                    .name("mds-commit".into())
                    .spawn(move || committer.run())
                    .map_err(|e| JournalError::Io {
                        name: "committer thread",
                        source: e,
                    })?;
                (Some(t), None)
            }
            CommitMode::Inline | CommitMode::Deferred => (None, Some(Mutex::new(committer))),
        };
        Ok(Store {
            shared,
            disk,
            committer: thread,
            inline,
            deferred: mode == CommitMode::Deferred,
            recovered_records: rec.replayed,
            torn_bytes: rec.torn,
            fresh,
            clock,
            gen_salt: rand::random(),
            mark: mark.into(),
            skip_due: Default::default(),
        })
    }

    /// Sets the mark of inode numbers given out past every number `m` could take, before `m`
    /// is applied (under the namespace's lock, so no one sees such a number before the mark
    /// covers it). A create answered or seen before it is durable may be lost in a crash, and
    /// its number with it; [`Store::skip_given_out`] then starts above the mark, so the number
    /// is never given to another file. One write per [`MARK_AHEAD`] numbers.
    fn mark_ahead(&self, ns: &Namespace, m: &Mutation) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        let takes = match m {
            Mutation::ReserveInodes { count } => *count,
            Mutation::SkipInodes { next } => next.saturating_sub(ns.next_inode()),
            _ => 1,
        };
        let end = ns.next_inode().saturating_add(takes);
        if end <= self.mark.load(Relaxed) {
            return Ok(());
        }
        let mark = end.saturating_add(MARK_AHEAD);
        let mut out = MARK_MAGIC.to_vec();
        out.extend_from_slice(&mark.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&mark.to_le_bytes()).to_le_bytes());
        self.disk
            .replace(MARK_FILE, &out)
            .map_err(|source| JournalError::Io {
                name: MARK_FILE,
                source,
            })?;
        self.mark.store(mark, Relaxed);
        Ok(())
    }

    /// Has the next change number new inodes past the mark on disk, past every number the last
    /// run may have given out: it first journals a `SkipInodes` to the mark, so records after
    /// it replay with the same numbers. Called once recovery is over (replays of changes
    /// answered before the crash take their own numbers first, below the mark); takes no lock,
    /// so recovery may call it under its own.
    pub fn skip_given_out(&self) {
        self.skip_due
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The `SkipInodes` [`Store::skip_given_out`] asked for, journaled ahead of the change
    /// about to be applied (under the namespace's lock).
    fn skip_if_due(
        &self,
        ns: &mut Namespace,
        seq: &mut u64,
        queue: &mut concur::commit::Appender<'_>,
    ) -> Result<(), StoreError> {
        if !self
            .skip_due
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        let mark = self.mark.load(std::sync::atomic::Ordering::Relaxed);
        if mark <= ns.next_inode() {
            return Ok(());
        }
        tracing::info!(
            from = ns.next_inode(),
            to = mark,
            "new inodes are numbered past those the last run may have given out"
        );
        let skip = Record {
            seq: *seq + 1,
            creds: Creds::root(),
            time: (self.clock)(),
            mutation: Mutation::SkipInodes { next: mark },
            req: None,
        };
        if let Err(e) = Self::append(ns, seq, queue, &skip) {
            self.skip_due
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(e);
        }
        Ok(())
    }

    /// Applies `c` and returns once it is durable.
    pub async fn apply(&self, c: Change<'_>) -> Result<Applied, StoreError> {
        let done = self.apply_behind(c)?;
        self.wait_durable(done.transno, done.applied).await
    }

    /// Applies `c`, answered as soon as it is applied, before it is durable (commit-behind):
    /// with its transaction number and, for a change made now, the ticket that replays it
    /// exactly after a restart. A resend of a change already carried out is answered as then,
    /// once everything so far is durable (no ticket: nothing to replay).
    ///
    /// A change with a size generation applies only while it is still the file's (otherwise
    /// `Stale`, and nothing changes); one with a `clear` test only if it holds for the inodes
    /// the change touches, as they are under the namespace's lock (otherwise
    /// [`StoreError::Leased`]). The check and the change are made under one lock, so no
    /// truncate or lease can come between them. The touched inodes `after` picks (other than
    /// the one the change answers with) come back as the change left them. The change is
    /// stamped with `time` where it is close enough to the MDS's clock (see
    /// [`proto::md::CLIENT_TIME_SKEW`]), with the clock's time otherwise.
    pub fn apply_behind(&self, c: Change<'_>) -> Result<Done, StoreError> {
        let Change {
            mutation: m,
            who,
            req,
            size_gen,
            time,
            clear,
            after,
        } = c;
        if self.shared.durable.borrow().is_err() {
            return Err(StoreError::Failed);
        }
        let done = {
            // Held while the sequence number is taken: queue order is sequence order.
            let mut queue = self.shared.queue.appender();
            let mut guard = self.shared.ns.lock();
            let (ns, seq) = &mut *guard;
            if let (Some(want), Mutation::GrowSize { fid, .. }) = (size_gen, &m) {
                if self.gen_salt.wrapping_add(ns.truncates(*fid)) != want {
                    return Err(StoreError::Namespace(NsError {
                        kind: proto::FsErrorKind::Stale,
                        what: format!("{fid} was truncated since its writer learnt its size"),
                    }));
                }
            }
            let touched = ns.touched(&m);
            if !clear(&touched) {
                return Err(StoreError::Leased);
            }
            self.skip_if_due(ns, seq, &mut queue)?;
            self.mark_ahead(ns, &m)?;
            let next_inode = ns.next_inode();
            let rec = Record {
                seq: *seq + 1,
                creds: who,
                time: stamp_time((self.clock)(), time),
                mutation: m,
                req,
            };
            let (applied, encoded) = Self::append(ns, seq, &mut queue, &rec)?;
            let answered = applied.inode.as_ref().map(|i| i.fid);
            let after = touched
                .iter()
                .filter(|f| Some(**f) != answered && after(f))
                .filter_map(|f| ns.inode(*f).ok().cloned())
                .collect();
            Done {
                applied,
                transno: *seq,
                // A resend carried out meanwhile is answered as then, once everything so far
                // is durable: the caller waits for `transno`, with nothing to replay.
                ticket: encoded.map(|e| journal::encode_ticket(next_inode, &e)),
                touched,
                after,
            }
        };
        if !self.deferred {
            self.commit_queued();
        }
        Ok(done)
    }

    /// Applies `rec` (its sequence number the next one) and queues it for the journal, and
    /// returns its encoding; none when it was a resend already carried out (nothing queued).
    /// The record is encoded first: one that cannot be journaled is refused before the
    /// namespace changes.
    fn append(
        ns: &mut Namespace,
        seq: &mut u64,
        queue: &mut concur::commit::Appender<'_>,
        rec: &Record,
    ) -> Result<(Applied, Option<Vec<u8>>), StoreError> {
        let encoded = encode_record(rec).map_err(|e| NsError {
            kind: proto::FsErrorKind::TooBig,
            what: e.to_string(),
        })?;
        let (applied, fresh) = ns.apply_request(&rec.mutation, &rec.creds, rec.time, rec.req)?;
        if !fresh {
            return Ok((applied, None));
        }
        *seq += 1;
        queue.push(*seq, &encoded);
        Ok((applied, Some(encoded)))
    }

    /// Applies again a change a client replays after a restart, exactly as it was first
    /// applied (its time, its credentials, its inode number), under a new transaction number;
    /// returns once it is durable.
    pub async fn replay(&self, t: Ticket) -> Result<Applied, StoreError> {
        if self.shared.durable.borrow().is_err() {
            return Err(StoreError::Failed);
        }
        let seq = {
            let mut queue = self.shared.queue.appender();
            let mut guard = self.shared.ns.lock();
            let (ns, seq) = &mut *guard;
            let now = t.record.time;
            self.mark_ahead(
                ns,
                &Mutation::SkipInodes {
                    next: t.next_inode.saturating_add(1),
                },
            )?;
            if t.next_inode > ns.next_inode() {
                // Creates before it were lost with their client: its inode keeps its number.
                let skip = Record {
                    seq: *seq + 1,
                    creds: Creds::root(),
                    time: now,
                    mutation: Mutation::SkipInodes { next: t.next_inode },
                    req: None,
                };
                Self::append(ns, seq, &mut queue, &skip)?;
            }
            let rec = Record {
                seq: *seq + 1,
                ..t.record
            };
            let (applied, _) = Self::append(ns, seq, &mut queue, &rec)?;
            (applied, *seq)
        };
        self.commit_queued();
        self.wait_durable(seq.1, seq.0).await
    }

    /// Without a committer thread ([`CommitMode::Inline`], [`CommitMode::Deferred`]): writes
    /// what is queued now, on the calling thread. With one, nothing (it commits by itself).
    /// Counts group commits into `metrics` from now on.
    pub fn set_metrics(&self, metrics: Arc<crate::metrics::MdsMetrics>) {
        let _ = self.shared.metrics.set(metrics);
    }

    pub fn commit_queued(&self) {
        if let Some(c) = &self.inline {
            c.lock().commit_queued();
        }
    }

    /// Stops as a process killed with kill -9 does: nothing queued is written, and nothing
    /// more is applied or written (callers are told the store failed). What a run in this
    /// process may still do with the store then changes nothing on disk.
    pub fn halt(&self) {
        self.shared
            .halted
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.shared.durable.send_replace(Err(()));
        self.shared.queue.stop();
    }

    /// Commits at most once per `interval` (larger groups, fewer syncs) unless a caller waits
    /// for durability; zero (the default) commits as soon as the last commit is done.
    pub fn set_commit_interval(&self, interval: std::time::Duration) {
        self.shared.interval_ns.store(
            interval.as_nanos().min(u64::MAX as u128) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Where the journal and snapshot are kept.
    pub fn disk(&self) -> Arc<dyn MetaDisk> {
        self.disk.clone()
    }

    /// The last transaction number that is durable.
    pub fn committed(&self) -> u64 {
        self.shared.durable.borrow().unwrap_or(0)
    }

    /// Whether a journal write failed: the store takes no more changes until reopened.
    pub fn failed(&self) -> bool {
        self.shared.durable.borrow().is_err()
    }

    /// The last transaction number applied.
    pub fn last_applied(&self) -> u64 {
        self.shared.ns.lock().1
    }

    /// Waits until everything applied so far is durable; returns how far that is.
    pub async fn sync(&self) -> Result<u64, StoreError> {
        let seq = self.last_applied();
        let none = Applied {
            inode: None,
            removed: vec![],
            reserved: None,
        };
        self.wait_durable(seq, none).await?;
        Ok(self.committed())
    }

    /// Waits until transaction `transno` is durable.
    pub async fn wait_committed(&self, transno: u64) -> Result<(), StoreError> {
        let none = Applied {
            inode: None,
            removed: vec![],
            reserved: None,
        };
        self.wait_durable(transno, none).await.map(|_| ())
    }

    /// What a request will do ([`Namespace::decide`]). What it answers without a change (a
    /// resend's first reply, an existing file opened) is answered once everything applied so
    /// far is durable, so nothing is acknowledged that a crash could take back.
    ///
    /// The requests of `req`'s client numbered below `acked` had their replies: theirs are
    /// forgotten first.
    pub async fn decide(
        &self,
        m: &Mutation,
        who: &Creds,
        req: Option<proto::md::ReqId>,
        acked: u64,
    ) -> Result<Decision, StoreError> {
        let (decision, seq) = {
            let mut guard = self.shared.ns.lock();
            if let Some(r) = req {
                guard.0.forget_replies(r.client, acked);
                if guard.0.stale_request(r) {
                    return Err(StoreError::StaleRequest);
                }
            }
            (guard.0.decide(m, who, req)?, guard.1)
        };
        match &decision {
            Decision::Applies => {}
            Decision::Replied(_) | Decision::Opens(_) => {
                let none = Applied {
                    inode: None,
                    removed: vec![],
                    reserved: None,
                };
                self.wait_durable(seq, none).await?;
            }
        }
        Ok(decision)
    }

    /// Up to `max` objects of removed files to destroy, from removals that are durable: an
    /// object is never destroyed on the strength of a change a crash could still take back.
    /// Waits for the next commit briefly, without hurrying it; none if it does not come.
    pub async fn doomed(
        &self,
        max: usize,
        held: impl Fn(proto::Fid) -> bool,
    ) -> Vec<proto::layout::StripeObject> {
        let (doomed, seq) = {
            let guard = self.shared.ns.lock();
            (guard.0.doomed(max, held), guard.1)
        };
        let mut rx = self.shared.durable.subscribe();
        let durable = async {
            matches!(
                rx.wait_for(|d| d.map_or(true, |d| d >= seq))
                    .await
                    .as_deref(),
                Ok(Ok(_))
            )
        };
        match tokio::time::timeout(std::time::Duration::from_millis(200), durable).await {
            Ok(true) => doomed,
            _ => vec![],
        }
    }

    /// Up to `max` removed files kept for their handles (Data-on-MDT) that `held` says no
    /// handle holds now.
    pub fn releasable(&self, max: usize, held: impl Fn(proto::Fid) -> bool) -> Vec<proto::Fid> {
        let now = (self.clock)();
        self.shared.ns.lock().0.releasable(max, held, now)
    }

    async fn wait_durable(&self, seq: u64, applied: Applied) -> Result<Applied, StoreError> {
        let mut rx = self.shared.durable.subscribe();
        if rx.borrow().is_ok_and(|d| d < seq) {
            self.shared.hurry();
            if self.deferred {
                self.commit_queued();
            }
        }
        let durable = matches!(
            rx.wait_for(|d| d.map_or(true, |d| d >= seq))
                .await
                .as_deref(),
            Ok(Ok(_))
        );
        if durable {
            Ok(applied)
        } else {
            Err(StoreError::Failed)
        }
    }

    /// Starts this run's size generations from `salt` (by default, random): a simulation
    /// names it so that a seed replays exactly.
    pub fn with_gen_salt(mut self, salt: u64) -> Store {
        self.gen_salt = salt.rotate_left(32);
        self
    }

    /// The size generation of `fid` now: it moves on at every size set (truncate).
    pub fn size_gen(&self, fid: proto::Fid) -> u64 {
        self.gen_salt
            .wrapping_add(self.shared.ns.lock().0.truncates(fid))
    }

    /// Runs `f` on the namespace as it is now.
    pub fn read<T>(&self, f: impl FnOnce(&Namespace) -> T) -> T {
        f(&self.shared.ns.lock().0)
    }
}

/// Takes what is queued, journals it, and says how far the journal is durable.
struct Committer {
    shared: Arc<Shared>,
    writer: JournalWriter,
    disk: Arc<dyn MetaDisk>,
    checkpoint_bytes: u64,
}

impl Committer {
    /// The committer thread: waits for records and commits them until the store stops.
    fn run(mut self) {
        loop {
            let taken = self.shared.queue.next();
            let started = std::time::Instant::now();
            if !self.commit(taken.batch) || taken.stop {
                return;
            }
            self.shared.pause(started);
        }
    }

    /// Commits whatever is queued now, on the calling thread.
    fn commit_queued(&mut self) {
        while let Some(batch) = self.shared.queue.try_next() {
            if !self.commit(Some(batch)) {
                return;
            }
        }
    }

    /// Writes `batch` and a snapshot when one is due; false once the journal failed.
    fn commit(&mut self, batch: Option<Batch>) -> bool {
        let s = &self.shared;
        if s.durable.borrow().is_err() || s.halted.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        if let Some(b) = batch {
            let encoded = encode_batch(b.first_seq, b.count, &b.bytes);
            let started = std::time::Instant::now();
            let appended = self.writer.append(&encoded);
            if let Some(m) = s.metrics.get() {
                m.commit_seconds.observe(started.elapsed().as_secs_f64());
                m.group_records.observe(f64::from(b.count));
            }
            if let Err(e) = appended {
                tracing::error!(error = %e, "journal write failed; refusing further changes");
                let _ = s.durable.send_replace(Err(()));
                return false;
            }
            let _ = s.durable.send_replace(Ok(b.last_seq));
        }
        if self.writer.len() > self.checkpoint_bytes {
            let (snapshot, seq) = {
                let g = s.ns.lock();
                (g.0.clone(), g.1)
            };
            // Records applied but not yet written may be in the snapshot; replay skips them
            // by sequence number, so the order of snapshot and journal does not matter.
            let done = journal::write_snapshot(&*self.disk, &snapshot, seq)
                .and_then(|()| self.writer.reset());
            match done {
                Ok(()) => tracing::info!(seq, "namespace snapshot written; journal emptied"),
                Err(e) => {
                    tracing::error!(error = %e, "snapshot failed; refusing further changes");
                    let _ = s.durable.send_replace(Err(()));
                    return false;
                }
            }
        }
        true
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.shared.queue.stop();
        // A committer waiting out the commit interval commits what is queued and stops now.
        self.shared.hurry();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stamp_time;
    use proto::md::Time;

    #[test]
    fn a_clients_time_is_taken_only_near_the_mds_clock() {
        let now = Time {
            sec: 1_000_000,
            nsec: 500,
        };
        let at = |sec: i64, nsec: u32| Some(Time { sec, nsec });
        assert_eq!(stamp_time(now, None), now);
        // A create that waited in its client's queue, and a client a little ahead.
        assert_eq!(stamp_time(now, at(999_990, 7)), at(999_990, 7).unwrap());
        assert_eq!(
            stamp_time(now, at(1_000_000, 900)),
            at(1_000_000, 900).unwrap()
        );
        assert_eq!(
            stamp_time(now, at(1_000_001, 500)),
            at(1_000_001, 500).unwrap()
        );
        // Too far ahead or behind: the MDS's own.
        assert_eq!(stamp_time(now, at(1_000_001, 501)), now);
        assert_eq!(stamp_time(now, at(999_969, 0)), now);
        assert_eq!(stamp_time(now, at(i64::MAX, 0)), now);
        assert_eq!(stamp_time(now, at(i64::MIN, 0)), now);
    }
}
