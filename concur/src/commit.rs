//! The group-commit queue between the threads that apply changes and the one that journals
//! them. Appliers append encoded records in sequence order while holding the queue (they take
//! the sequence number under their own lock while they hold it, so queue order is sequence
//! order); the committer takes everything queued as one batch, writes it with one append and
//! one fsync, and only then tells the appliers their records are durable. Appliers wait for
//! room when the queue holds more than its limit.

use crate::shim::{lock, wait, Condvar, Mutex, MutexGuard};

/// Records taken for one commit: sequence numbers `first_seq..=last_seq`, `count` of them.
#[derive(Debug, PartialEq, Eq)]
pub struct Batch {
    pub first_seq: u64,
    pub last_seq: u64,
    pub count: u32,
    pub bytes: Vec<u8>,
}

/// What the committer takes: a batch (none when stopping with nothing queued), and whether
/// the queue is stopping.
#[derive(Debug)]
pub struct Taken {
    pub batch: Option<Batch>,
    pub stop: bool,
}

struct Pending {
    bytes: Vec<u8>,
    first_seq: u64,
    last_seq: u64,
    count: u32,
    stop: bool,
}

pub struct CommitQueue {
    pending: Mutex<Pending>,
    /// The committer waits here for records.
    wake: Condvar,
    /// Appliers wait here for room.
    room: Condvar,
    max_bytes: usize,
}

/// The queue held by one applier: records it appends go in this order.
pub struct Appender<'a> {
    queue: &'a CommitQueue,
    pending: MutexGuard<'a, Pending>,
    /// The committer may be waiting for the record this applier appended.
    wake: bool,
}

impl Appender<'_> {
    /// Appends the encoded record `seq` (the one after the last appended).
    pub fn push(&mut self, seq: u64, record: &[u8]) {
        let p = &mut *self.pending;
        debug_assert_eq!(seq, p.last_seq + 1, "records are queued in sequence order");
        if p.count == 0 {
            p.first_seq = seq;
            // The committer waits only on an empty queue: the record that ends that wakes
            // it, and the ones after it are taken with it (a wake-up each would cost a
            // system call each).
            self.wake = true;
        }
        p.bytes.extend_from_slice(record);
        p.count += 1;
        p.last_seq = seq;
    }
}

impl Drop for Appender<'_> {
    fn drop(&mut self) {
        if self.wake {
            self.queue.wake.notify_one();
        }
    }
}

impl CommitQueue {
    /// A queue after record `last_seq`, holding at most `max_bytes` before appliers wait.
    pub fn new(last_seq: u64, max_bytes: usize) -> CommitQueue {
        CommitQueue {
            pending: Mutex::new(Pending {
                bytes: Vec::new(),
                first_seq: last_seq + 1,
                last_seq,
                count: 0,
                stop: false,
            }),
            wake: Condvar::new(),
            room: Condvar::new(),
            max_bytes,
        }
    }

    /// Waits until the queue has room, and holds it for appending.
    pub fn appender(&self) -> Appender<'_> {
        let mut p = lock(&self.pending);
        while p.bytes.len() > self.max_bytes && !p.stop {
            p = wait(&self.room, p);
        }
        Appender {
            queue: self,
            pending: p,
            wake: false,
        }
    }

    /// Waits for records (or a stop) and takes all that are queued.
    pub fn next(&self) -> Taken {
        let mut p = lock(&self.pending);
        while p.count == 0 && !p.stop {
            p = wait(&self.wake, p);
        }
        let count = std::mem::take(&mut p.count);
        let batch = (count > 0).then(|| Batch {
            first_seq: p.first_seq,
            last_seq: p.last_seq,
            count,
            bytes: std::mem::take(&mut p.bytes),
        });
        let stop = p.stop;
        drop(p);
        self.room.notify_all();
        Taken { batch, stop }
    }

    /// Takes all that is queued, if anything is, without waiting.
    pub fn try_next(&self) -> Option<Batch> {
        let mut p = lock(&self.pending);
        let count = std::mem::take(&mut p.count);
        let batch = (count > 0).then(|| Batch {
            first_seq: p.first_seq,
            last_seq: p.last_seq,
            count,
            bytes: std::mem::take(&mut p.bytes),
        });
        drop(p);
        self.room.notify_all();
        batch
    }

    /// Tells the committer to stop once it has taken what is queued.
    pub fn stop(&self) {
        lock(&self.pending).stop = true;
        self.wake.notify_one();
        self.room.notify_all();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn records_queued_between_commits_are_one_batch_in_order() {
        let q = CommitQueue::new(10, 1 << 20);
        {
            let mut a = q.appender();
            a.push(11, b"a");
            a.push(12, b"bc");
        }
        let t = q.next();
        assert_eq!(
            t.batch,
            Some(Batch {
                first_seq: 11,
                last_seq: 12,
                count: 2,
                bytes: b"abc".to_vec()
            })
        );
        q.appender().push(13, b"d");
        q.stop();
        let t = q.next();
        assert_eq!(t.batch.map(|b| (b.first_seq, b.count)), Some((13, 1)));
        assert!(t.stop);
        assert!(q.next().batch.is_none());
    }
}
