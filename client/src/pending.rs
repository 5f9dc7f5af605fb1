//! Changes the client answered before sending them: creates and unlinks in a directory it
//! holds whole under a lease, and closes of files nothing was done with (CephFS's
//! asynchronous creates and unlinks).
//!
//! The client can answer such a change itself because its lease tells it the outcome: the
//! name is absent (or present), the caller may write the directory, and no other client can
//! change the directory without a recall. A create takes its FID from a range the MDS set
//! aside for this client ([`proto::md::MdsReserve`]). The change then waits in one queue,
//! in order, and one task sends the queue in batches ([`proto::md::MdsBatch`]): one round trip
//! and one journal group for many changes, each still its own request (numbered, answered,
//! kept until committed and replayed like any other).
//!
//! Order is kept with everything else the client sends: every other request to the MDS waits
//! until the changes queued before it have been answered ([`Pending::settle`]), and so does the
//! acknowledgement of a recall, so another client sees them before its own change goes ahead.
//!
//! A change that fails at the MDS (which a lease makes rare: the caller's identity was mapped
//! differently, the storage is full, this client lost its leases) cannot fail the call that
//! was answered already. Its error is kept and reported, as POSIX allows, at the next `fsync`
//! of the file or its directory, or `sync` ([`Pending::take_errors`]), and by any later use
//! of the file's handle; the cache forgets the name.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use proto::md::{BatchOp, MdsReintReply, RESERVATIONS_KEPT};
use proto::{Fid, FsErrorKind};
use tokio::sync::{watch, Notify};

use crate::error::{ClientError, Result};

/// Most changes waiting to be sent; a caller past it waits for room.
pub const MAX_QUEUED: usize = 8192;
/// Inode numbers asked for at once.
pub(crate) const RESERVE: u32 = proto::md::MAX_RESERVE;
/// Most failures kept for `fsync` to report.
const MAX_ERRORS: usize = 1024;

/// A range of FIDs an MDS set aside for this client: the sequence (of that MDS's MDT), the
/// first object number and the end.
pub type Reserved = (u64, u32, u32);

/// How long the sender holds a short queue for more changes to join it, unless someone waits
/// for an answer: one round trip and one wake-up of the MDS carry what a loop of creates or
/// unlinks queues meanwhile, instead of one each.
pub const LINGER: Duration = Duration::from_millis(2);
/// A queue this long goes at once.
pub(crate) const LINGER_BATCH: usize = 128;

/// The outcome of one change sent ahead, for whoever needs it (the first read or write of a
/// file created this way needs its objects).
#[derive(Clone)]
pub struct Sent {
    rx: watch::Receiver<Option<Outcome>>,
    seq: u64,
    pub(crate) hurry: std::sync::Arc<Hurry>,
}

/// Who waits for an answer: the sender does not hold back a change at or before `upto`.
#[derive(Default)]
pub(crate) struct Hurry {
    pub(crate) upto: AtomicU64,
    pub(crate) wake: Notify,
}

impl Hurry {
    fn to(&self, seq: u64) {
        if self.upto.fetch_max(seq, Ordering::SeqCst) < seq {
            self.wake.notify_one();
        }
    }
}

pub(crate) type Outcome = std::result::Result<MdsReintReply, (FsErrorKind, String)>;

impl Sent {
    /// The MDS's reply, once it came.
    pub async fn reply(&self) -> Result<MdsReintReply> {
        self.reply_after(true).await
    }

    /// As [`Sent::reply`]; without `hurry`, the change goes with the next batch as it would
    /// had nobody waited (work behind a caller that returned already).
    pub async fn reply_after(&self, hurry: bool) -> Result<MdsReintReply> {
        let mut rx = self.rx.clone();
        if hurry && rx.borrow().is_none() {
            self.hurry.to(self.seq);
        }
        let got = rx
            .wait_for(|o| o.is_some())
            .await
            .map_err(|_| ClientError::fs(FsErrorKind::Io, "the client closed"))?;
        match got.as_ref().expect("waited for") {
            Ok(r) => Ok(r.clone()),
            Err((kind, what)) => Err(ClientError::fs(*kind, what.clone())),
        }
    }

    /// Its place in the queue.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether the MDS's answer has come.
    pub fn arrived(&self) -> bool {
        self.rx.borrow().is_some()
    }

    /// The reply if it came already.
    pub fn now(&self) -> Option<Result<MdsReintReply>> {
        self.rx.borrow().as_ref().map(|o| match o {
            Ok(r) => Ok(r.clone()),
            Err((kind, what)) => Err(ClientError::fs(*kind, what.clone())),
        })
    }
}

pub(crate) struct Queued {
    pub(crate) seq: u64,
    pub(crate) op: BatchOp,
    /// The directory and name a create or unlink changed in the cache.
    pub(crate) named: Option<(Fid, Vec<u8>)>,
    pub(crate) fid: Option<Fid>,
    pub(crate) done: Option<watch::Sender<Option<Outcome>>>,
    /// Its failure is for whoever waits on it to report, not kept for `fsync`.
    pub(crate) quiet: bool,
}

/// A change that failed after it was answered.
#[derive(Clone, Debug)]
pub struct Failed {
    pub dir: Option<Fid>,
    pub fid: Option<Fid>,
    pub kind: FsErrorKind,
    pub what: String,
}

#[derive(Default)]
pub(crate) struct Pending {
    /// Held while a change is checked against the cache and queued, and while a recall is
    /// applied: a change answered ahead is either queued before the recall (and sent before it
    /// is acknowledged) or checked after it (and not answered ahead).
    pub gate: Mutex<()>,
    pub(crate) queue: Mutex<VecDeque<Queued>>,
    /// Sequence numbers of changes queued so far, and of those answered.
    queued: AtomicU64,
    pub(crate) answered: watch::Sender<u64>,
    /// Wakes the sender: the queue has something, is long, or someone waits.
    pub(crate) hurry: std::sync::Arc<Hurry>,
    pub(crate) room: Notify,
    /// FIDs set aside for this client not yet taken: their sequence (the MDS's MDT's), the
    /// next and the end.
    fids: Mutex<VecDeque<Reserved>>,
    /// The ranges the MDS keeps for this client: the last it gave, oldest first.
    given: Mutex<VecDeque<Reserved>>,
    reserving: tokio::sync::Mutex<()>,
    errors: Mutex<VecDeque<Failed>>,
    /// For each inode a change queued (or on its way) touches (its directory, the inode
    /// named): the last such change, until answered.
    pub(crate) touching: Mutex<crate::FastMap<Fid, u64>>,
}

impl Pending {
    /// Waits until every change queued before this call has been answered.
    pub async fn settle(&self) {
        self.settle_to(self.queued()).await
    }

    /// Sends every change queued so far with the next batch, without lingering: someone waits
    /// on one of them (a close finishing behind that waits for its create's answer).
    pub fn hurry_queued(&self) {
        self.hurry.to(self.queued());
    }

    /// How many changes were queued so far.
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::SeqCst)
    }

    /// Changes queued and not answered yet.
    pub fn unanswered(&self) -> u64 {
        self.queued().saturating_sub(*self.answered.borrow())
    }

    /// Waits until the first `upto` changes queued have been answered.
    pub async fn settle_to(&self, upto: u64) {
        if *self.answered.borrow() >= upto {
            return;
        }
        self.hurry.to(upto);
        let mut rx = self.answered.subscribe();
        let _ = rx.wait_for(|a| *a >= upto).await;
    }

    /// Sends the first `upto` changes queued with the next batch, without lingering.
    pub fn hurry_to(&self, upto: u64) {
        self.hurry.to(upto);
    }

    /// Whether the first `upto` changes queued have been answered.
    pub fn answered_past(&self, upto: u64) -> bool {
        *self.answered.borrow() >= upto
    }

    /// Waits until the first `upto` changes queued have been answered, without hurrying the
    /// sender: for a caller nobody waits on.
    pub async fn answered_to(&self, upto: u64) {
        let mut rx = self.answered.subscribe();
        let _ = rx.wait_for(|a| *a >= upto).await;
    }

    /// The last change queued or on its way that touches one of `fids` (0: none): what a
    /// recall of leases on them waits for.
    pub fn last_touching(&self, fids: &[Fid]) -> u64 {
        let t = self.touching.lock();
        fids.iter()
            .filter_map(|f| t.get(f))
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Whether no change queued or on its way after the `upto`th touches `fid`: an answer to
    /// that one shows what this client did to it.
    pub fn settled(&self, fid: Fid, upto: u64) -> bool {
        self.touching
            .lock()
            .get(&fid)
            .is_none_or(|seq| *seq <= upto)
    }

    /// The last change queued or on its way that touches `fid`, if any.
    pub fn touching(&self, fid: Fid) -> Option<u64> {
        self.touching.lock().get(&fid).copied()
    }

    /// Waits for room in the queue.
    pub async fn room(&self) {
        loop {
            let wait = self.room.notified();
            if self.queue.lock().len() < MAX_QUEUED {
                return;
            }
            wait.await;
        }
    }

    /// Queues `op`; `named` is what the cache already shows of it, undone if it fails.
    pub fn push(&self, op: BatchOp, named: Option<(Fid, Vec<u8>)>, fid: Option<Fid>) -> Sent {
        self.push_as(op, named, fid, false)
    }

    /// As [`Pending::push`]; a failure of `op` is left to whoever waits for its answer, which
    /// decides whether it is one to keep for `fsync`.
    pub fn push_quiet(&self, op: BatchOp, fid: Fid) -> Sent {
        self.push_as(op, None, Some(fid), true)
    }

    fn push_as(
        &self,
        op: BatchOp,
        named: Option<(Fid, Vec<u8>)>,
        fid: Option<Fid>,
        quiet: bool,
    ) -> Sent {
        let (tx, rx) = watch::channel(None);
        let (seq, len) = {
            let mut q = self.queue.lock();
            let seq = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
            let mut t = self.touching.lock();
            for f in named.iter().map(|(d, _)| *d).chain(fid) {
                t.insert(f, seq);
            }
            drop(t);
            q.push_back(Queued {
                seq,
                op,
                named,
                fid,
                done: Some(tx),
                quiet,
            });
            (seq, q.len())
        };
        // The sender wakes for the first change of a queue and for a long one; in between it
        // lingers (see [`LINGER`]). The first change wakes only a sender that waits: one busy
        // sending the batch before finds the queue when it is back, and lingers on it (a
        // stored wake-up would cut that linger short, and a loop of changes would go one or
        // two per batch).
        if len == 1 {
            self.hurry.wake.notify_waiters();
        } else if len == LINGER_BATCH {
            self.hurry.wake.notify_one();
        }
        Sent {
            rx,
            seq,
            hurry: self.hurry.clone(),
        }
    }

    /// Takes the open off the create queued as `seq`, if it is still queued: the file was
    /// closed before the create was sent, so the MDS need count no open (nor send the close,
    /// nor a capability for it). False once the create is on its way.
    pub fn drop_open(&self, seq: u64) -> bool {
        let mut q = self.queue.lock();
        let Ok(at) = q.binary_search_by_key(&seq, |x| x.seq) else {
            return false;
        };
        match &mut q[at].op {
            BatchOp::Reint(r) if r.open.is_some() => {
                r.open = None;
                true
            }
            _ => false,
        }
    }

    /// Waits until a FID set aside for this client is at hand, asking the MDS for more when
    /// none is left. The caller takes it with [`Pending::take_fid`] under the gate and queues
    /// its create before letting the gate go.
    /// `reserve` asks the MDS for a range (`MDS_RESERVE`) and returns it.
    pub async fn fids_at_hand<F, Fut>(&self, reserve: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Reserved>>,
    {
        let at_hand = || self.fids.lock().iter().any(|(_, n, e)| n < e);
        loop {
            if at_hand() {
                return Ok(());
            }
            let _one = self.reserving.lock().await;
            if at_hand() {
                continue;
            }
            // The MDS keeps the last few ranges it gave this client: the next one pushes the
            // oldest out, and a create from it the MDS has yet to see would be refused after
            // it was answered here.
            let oldest = {
                let given = self.given.lock();
                (given.len() >= RESERVATIONS_KEPT).then(|| given[0])
            };
            if let Some(range) = oldest {
                self.answered_from(range).await;
            }
            let range = reserve().await?;
            self.fids.lock().push_back(range);
            let mut given = self.given.lock();
            given.push_back(range);
            while given.len() > RESERVATIONS_KEPT {
                given.pop_front();
            }
        }
    }

    /// Waits until every create naming a FID of `first..end` has been answered. Each FID is
    /// taken and its create queued under the gate: once the gate was free, every create from
    /// a range no longer handed out shows among the changes on their way.
    async fn answered_from(&self, (seq, first, end): Reserved) {
        loop {
            drop(self.gate.lock());
            let last = self
                .touching
                .lock()
                .iter()
                .filter(|(f, _)| f.seq == seq && f.ver == 0 && (first..end).contains(&f.oid))
                .map(|(_, seq)| *seq)
                .max();
            match last {
                Some(seq) => self.settle_to(seq).await,
                None => return,
            }
        }
    }

    /// A FID set aside for this client, if one is at hand: taken under the gate, with the
    /// create that names it queued before the gate is let go.
    pub(crate) fn take_fid(&self) -> Option<Fid> {
        let mut fids = self.fids.lock();
        while let Some((seq, next, end)) = fids.front_mut() {
            if *next < *end {
                let f = Fid::new(*seq, *next, 0);
                *next += 1;
                return Some(f);
            }
            fids.pop_front();
        }
        None
    }

    /// Failures kept for `dir` (every one with `None`), taken: the first is reported.
    pub fn take_errors(&self, dir: Option<Fid>) -> Option<Failed> {
        let mut errors = self.errors.lock();
        let mut first = None;
        errors.retain(|f| {
            let mine = dir.is_none() || f.dir == dir || f.fid == dir;
            if mine && first.is_none() {
                first = Some(f.clone());
            }
            !mine
        });
        first
    }

    pub(crate) fn failed(&self, f: Failed) {
        tracing::warn!(dir = ?f.dir, fid = ?f.fid, kind = ?f.kind, what = %f.what, "a change answered ahead failed at the MDS");
        let mut errors = self.errors.lock();
        if errors.len() >= MAX_ERRORS {
            errors.pop_front();
        }
        errors.push_back(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::md::{Creds, MdsReint, Mutation, OpenHandle};
    use proto::Fid;

    fn create(open: Option<OpenHandle>) -> BatchOp {
        BatchOp::Reint(MdsReint {
            creds: Creds::root(),
            mutation: Mutation::CreateAt {
                fid: Fid::new(proto::fid::INODE_SEQ, 9, 0),
                parent: Fid::new(proto::fid::INODE_SEQ, 1, 0),
                name: b"x".to_vec(),
                kind: proto::md::Kind::File,
                mode: 0o644,
                target: vec![],
                layout: None,
            },
            req: None,
            acked: 0,
            open,
            size_gen: None,
            behind: true,
            lease: false,
            time: None,
        })
    }

    #[test]
    fn a_close_takes_the_open_off_a_create_still_queued_and_only_then() {
        let p = Pending::default();
        let h = OpenHandle {
            client: 7,
            handle: 1,
        };
        let first = p.push(create(Some(h)), None, None);
        let second = p.push(create(Some(h)), None, None);
        assert!(p.drop_open(second.seq()));
        // Once taken off, there is nothing more to take.
        assert!(!p.drop_open(second.seq()));
        let queued: Vec<Option<OpenHandle>> = p
            .queue
            .lock()
            .iter()
            .map(|q| match &q.op {
                BatchOp::Reint(r) => r.open,
                BatchOp::Close(_) => None,
            })
            .collect();
        assert_eq!(queued, vec![Some(h), None]);
        // Sent already (no longer queued): the close must go to the MDS.
        p.queue.lock().pop_front();
        assert!(!p.drop_open(first.seq()));
    }
}
