//! The numbers of this client's modifying requests, and which of them it may still send
//! again: what it tells the MDS it had replies below (Lustre's last-xid-replied), so the MDS
//! keeps the reply to every request a resend could ask for, and forgets the others.
//!
//! A number is taken when a request is made (sent at once, or queued to go in a batch) and
//! settled once the client will never send it again: its reply came, or the client gave up.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

#[derive(Debug)]
pub(crate) struct Requests {
    next: AtomicU64,
    /// Taken and not yet settled.
    open: Mutex<BTreeSet<u64>>,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            next: AtomicU64::new(1),
            open: Mutex::new(BTreeSet::new()),
        }
    }
}

impl Requests {
    /// A new request number, open until [`Requests::settle`].
    pub(crate) fn take(&self) -> u64 {
        let mut open = self.open.lock();
        // Under the set's lock: `replied_below` never passes a number being taken.
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        open.insert(seq);
        seq
    }

    /// Request `seq` will not be sent again.
    pub(crate) fn settle(&self, seq: u64) {
        self.open.lock().remove(&seq);
    }

    /// Every request numbered below this is settled.
    pub(crate) fn replied_below(&self) -> u64 {
        let open = self.open.lock();
        open.first()
            .copied()
            .unwrap_or_else(|| self.next.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_stays_below_every_request_that_may_be_resent() {
        let r = Requests::default();
        let (a, b, c) = (r.take(), r.take(), r.take());
        assert_eq!(r.replied_below(), a);
        // Replies out of order: the oldest still open holds the watermark.
        r.settle(c);
        r.settle(b);
        assert_eq!(r.replied_below(), a);
        r.settle(a);
        assert_eq!(r.replied_below(), c + 1);
        let d = r.take();
        assert_eq!(r.replied_below(), d);
    }
}
