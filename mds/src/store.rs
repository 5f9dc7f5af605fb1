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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use proto::md::{Creds, Mutation, Time};
use tokio::sync::watch;

use crate::journal::{self, encode_record, JournalError, JournalWriter, Record};
use crate::namespace::{Applied, Decision, Namespace, NsError};

/// Journal size that triggers a snapshot.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;
/// Most bytes of records waiting for a flush; past it, mutations wait.
const MAX_PENDING: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Namespace(#[from] NsError),
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("the journal failed earlier; the MDS accepts no more changes until restarted")]
    Failed,
}

struct Pending {
    bytes: Vec<u8>,
    last_seq: u64,
    stop: bool,
}

struct Shared {
    ns: Mutex<(Namespace, u64)>,
    pending: Mutex<Pending>,
    wake: Condvar,
    room: Condvar,
    durable: watch::Sender<Result<u64, ()>>,
}

pub struct Store {
    shared: Arc<Shared>,
    committer: Option<std::thread::JoinHandle<()>>,
    pub recovered_records: u64,
    pub torn_bytes: u64,
}

fn now() -> Time {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

impl Store {
    /// Recovers the namespace kept in `dir` (or starts one) and starts the committer.
    pub fn open(dir: &Path, checkpoint_bytes: u64) -> Result<Store, StoreError> {
        let fresh = !dir.join("snapshot").exists() && !dir.join("journal").exists();
        let rec = journal::recover(dir, Namespace::new(now()))?;
        if fresh {
            // A new filesystem: its root (and the time it was made) is durable from the start.
            journal::write_snapshot(dir, &rec.namespace, 0)?;
        }
        let writer = JournalWriter::open(dir, rec.journal_len)?;
        if rec.torn > 0 {
            tracing::warn!(bytes = rec.torn, "cut a torn tail off the journal");
        }
        tracing::info!(
            records = rec.replayed,
            inodes = rec.namespace.len(),
            seq = rec.last_seq,
            "namespace recovered"
        );
        let (tx, _) = watch::channel(Ok(rec.last_seq));
        let shared = Arc::new(Shared {
            ns: Mutex::new((rec.namespace, rec.last_seq)),
            pending: Mutex::new(Pending {
                bytes: vec![],
                last_seq: rec.last_seq,
                stop: false,
            }),
            wake: Condvar::new(),
            room: Condvar::new(),
            durable: tx,
        });
        let s = shared.clone();
        let dir = dir.to_path_buf();
        let committer = std::thread::Builder::new()
            .name("mds-commit".into())
            .spawn(move || commit_loop(s, writer, dir, checkpoint_bytes))
            .map_err(|e| JournalError::Io {
                path: PathBuf::from("committer thread"),
                source: e,
            })?;
        Ok(Store {
            shared,
            committer: Some(committer),
            recovered_records: rec.replayed,
            torn_bytes: rec.torn,
        })
    }

    /// Applies a mutation and returns once it is durable.
    pub async fn apply(&self, m: Mutation, who: Creds) -> Result<Applied, StoreError> {
        self.apply_request(m, who, None).await
    }

    /// Applies a client's request once (a resend gets the first reply) and returns once it is
    /// durable.
    pub async fn apply_request(
        &self,
        m: Mutation,
        who: Creds,
        req: Option<proto::md::ReqId>,
    ) -> Result<Applied, StoreError> {
        let rx = self.shared.durable.subscribe();
        if rx.borrow().is_err() {
            return Err(StoreError::Failed);
        }
        let (applied, seq) = {
            let mut pending = self.shared.pending.lock();
            while pending.bytes.len() > MAX_PENDING {
                self.shared.room.wait(&mut pending);
            }
            let mut guard = self.shared.ns.lock();
            let (ns, seq) = &mut *guard;
            let time = now();
            let (applied, fresh) = ns.apply_request(&m, &who, time, req)?;
            if fresh {
                *seq += 1;
                let rec = Record {
                    seq: *seq,
                    creds: who,
                    time,
                    mutation: m,
                    req,
                };
                pending.bytes.extend_from_slice(&encode_record(&rec));
                pending.last_seq = *seq;
            }
            // A resend carried out meanwhile is answered as then, once everything so far is
            // durable.
            (applied, *seq)
        };
        self.shared.wake.notify_one();
        self.wait_durable(seq, applied).await
    }

    /// What a request will do ([`Namespace::decide`]). What it answers without a change (a
    /// resend's first reply, an existing file opened) is answered once everything applied so
    /// far is durable, so nothing is acknowledged that a crash could take back.
    pub async fn decide(
        &self,
        m: &Mutation,
        who: &Creds,
        req: Option<proto::md::ReqId>,
    ) -> Result<Decision, StoreError> {
        let (decision, seq) = {
            let guard = self.shared.ns.lock();
            (guard.0.decide(m, who, req)?, guard.1)
        };
        match &decision {
            Decision::Applies => {}
            Decision::Replied(_) | Decision::Opens(_) => {
                let none = Applied {
                    inode: None,
                    removed: vec![],
                };
                self.wait_durable(seq, none).await?;
            }
        }
        Ok(decision)
    }

    async fn wait_durable(&self, seq: u64, applied: Applied) -> Result<Applied, StoreError> {
        let mut rx = self.shared.durable.subscribe();
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

    /// Runs `f` on the namespace as it is now.
    pub fn read<T>(&self, f: impl FnOnce(&Namespace) -> T) -> T {
        f(&self.shared.ns.lock().0)
    }
}

fn commit_loop(s: Arc<Shared>, mut writer: JournalWriter, dir: PathBuf, checkpoint_bytes: u64) {
    loop {
        let (batch, last_seq, stop) = {
            let mut p = s.pending.lock();
            while p.bytes.is_empty() && !p.stop {
                s.wake.wait(&mut p);
            }
            (std::mem::take(&mut p.bytes), p.last_seq, p.stop)
        };
        s.room.notify_all();
        if !batch.is_empty() {
            if let Err(e) = writer.append(&batch) {
                tracing::error!(error = %e, "journal write failed; refusing further changes");
                let _ = s.durable.send_replace(Err(()));
                return;
            }
            let _ = s.durable.send_replace(Ok(last_seq));
        }
        if writer.len() > checkpoint_bytes {
            let (snapshot, seq) = {
                let g = s.ns.lock();
                (g.0.clone(), g.1)
            };
            // Records applied but not yet written may be in the snapshot; replay skips them
            // by sequence number, so the order of snapshot and journal does not matter.
            let done = journal::write_snapshot(&dir, &snapshot, seq).and_then(|()| writer.reset());
            match done {
                Ok(()) => tracing::info!(seq, "namespace snapshot written; journal emptied"),
                Err(e) => {
                    tracing::error!(error = %e, "snapshot failed; refusing further changes");
                    let _ = s.durable.send_replace(Err(()));
                    return;
                }
            }
        }
        if stop {
            return;
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.shared.pending.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}
