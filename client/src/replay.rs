//! Changes the MDS answered before they were durable (commit-behind), kept until its committed
//! transaction number passes them, to be replayed in order after an MDS restart.
//!
//! The MDS answers a change with its transaction number, the last committed one, its run (its
//! instance), and a sealed ticket that applies it again exactly. The client keeps the tickets
//! of changes above the committed number, bounded: past [`MAX_TICKETS`] or
//! [`MAX_TICKET_BYTES`], the next change first waits for the MDS to commit (back-pressure), so
//! a client never holds more than that.
//!
//! Tickets belong to the run that issued them: a committed number of another run says nothing
//! of them (a later run numbers its transactions again from its first one). They are replayed
//! when the client sees the restart, or lost if the new run answers this client's changes
//! while it still holds them: its recovery then ended without this client (an eviction, as
//! Lustre's). A loss is never silent: it is counted ([`Uncommitted::evictions`]), logged, and
//! the next `sync`, and the next `fsync` and close of each file open then, fail with EIO.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// Most uncommitted changes a client keeps before it waits for the MDS to commit.
pub const MAX_TICKETS: usize = 65_536;
/// Most bytes of tickets a client keeps before it waits for the MDS to commit.
pub const MAX_TICKET_BYTES: usize = 64 << 20;

#[derive(Default)]
pub(crate) struct Uncommitted {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    tickets: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
    committed: u64,
    /// The MDS run the tickets (and `committed`) belong to; 0 before the first answer.
    run: u64,
    /// Evictions that lost acknowledged changes, and what the last one lost.
    evictions: u64,
    lost: String,
}

impl Held {
    /// Adopts `run` when nothing of another is held. False when tickets of another are.
    fn in_run(&mut self, run: u64) -> bool {
        if run == self.run || run == 0 {
            return true;
        }
        if self.tickets.is_empty() {
            self.run = run;
            self.committed = 0;
            return true;
        }
        false
    }

    /// The tickets of the run before are lost: its recovery ended without this client.
    fn evicted(&mut self, run: u64) {
        let n = self.tickets.len();
        tracing::error!(
            lost = n,
            old_run = %format_args!("{:x}", self.run),
            new_run = %format_args!("{run:x}"),
            "the MDS restarted and recovered without this client (evicted): {n} acknowledged changes that were not yet committed are lost"
        );
        self.evictions += 1;
        self.lost = format!(
            "evicted by the MDS after its restart: {n} acknowledged metadata changes that were \
             not yet committed are lost"
        );
        self.tickets.clear();
        self.bytes = 0;
        self.run = run;
        self.committed = 0;
    }
}

impl Uncommitted {
    /// Keeps the ticket of change `transno` of MDS run `run`, unless it is committed already.
    /// An answer of another run while tickets of an earlier one are held means they are lost
    /// (see the module's notes).
    pub fn keep(&self, run: u64, transno: u64, ticket: Vec<u8>, committed: u64) {
        let mut h = self.inner.lock();
        if !h.in_run(run) {
            h.evicted(run);
        }
        if transno > committed.max(h.committed) && !ticket.is_empty() {
            h.bytes += ticket.len();
            if let Some(old) = h.tickets.insert(transno, ticket) {
                h.bytes -= old.len();
            }
        }
        drop(h);
        self.committed(run, committed);
    }

    /// Run `run` of the MDS has committed every change up to `committed`: their tickets go.
    /// The number of another run passes over tickets of an earlier one (they wait for their
    /// replay).
    pub fn committed(&self, run: u64, committed: u64) {
        let mut h = self.inner.lock();
        if !h.in_run(run) {
            return;
        }
        if committed <= h.committed
            && h.tickets
                .first_key_value()
                .is_none_or(|(t, _)| *t > committed)
        {
            return;
        }
        h.committed = h.committed.max(committed);
        let keep = h.tickets.split_off(&(committed + 1));
        let gone: usize = h.tickets.values().map(Vec::len).sum();
        h.tickets = keep;
        h.bytes -= gone;
    }

    /// An answer of run `run` to a request it serves only outside recovery (a sync, a
    /// change): tickets of an earlier run still held were never replayed, and are lost.
    pub fn served_in(&self, run: u64, committed: u64) {
        {
            let mut h = self.inner.lock();
            if !h.in_run(run) {
                h.evicted(run);
            }
        }
        self.committed(run, committed);
    }

    /// Changes of this client that a replay could not apply: lost, as in an eviction.
    pub fn lost_in_replay(&self, refused: u64, why: &str) {
        let mut h = self.inner.lock();
        h.evictions += 1;
        h.lost = format!("{refused} acknowledged metadata changes could not be replayed after an MDS restart: {why}");
    }

    /// Evictions so far that lost acknowledged changes, and what the last one lost.
    pub fn evictions(&self) -> (u64, String) {
        let h = self.inner.lock();
        (h.evictions, h.lost.clone())
    }

    /// Whether the next change must first wait for the MDS to commit.
    pub fn full(&self) -> bool {
        let h = self.inner.lock();
        h.tickets.len() >= MAX_TICKETS || h.bytes >= MAX_TICKET_BYTES
    }

    /// Uncommitted changes held now.
    pub fn len(&self) -> usize {
        self.inner.lock().tickets.len()
    }

    /// Every ticket held, in transaction order, for a replay in run `run`. What the old run
    /// committed is forgotten here too; the replayed changes are the new run's.
    pub fn take_all(&self, run: u64) -> Vec<(u64, Vec<u8>)> {
        let mut h = self.inner.lock();
        h.bytes = 0;
        h.committed = 0;
        h.run = run;
        std::mem::take(&mut h.tickets).into_iter().collect()
    }

    /// Puts back tickets a replay did not get to (the MDS restarted again, or went out of
    /// reach), as the old run's: the next recovery replays them.
    pub fn put_back(&self, old_run: u64, tickets: impl IntoIterator<Item = (u64, Vec<u8>)>) {
        let mut h = self.inner.lock();
        h.run = old_run;
        for (t, ticket) in tickets {
            h.bytes += ticket.len();
            if let Some(old) = h.tickets.insert(t, ticket) {
                h.bytes -= old.len();
            }
        }
    }

    /// The run the held tickets belong to.
    pub fn run(&self) -> u64 {
        self.inner.lock().run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_go_once_committed_and_come_back_in_order() {
        let u = Uncommitted::default();
        u.keep(1, 5, vec![5; 10], 3);
        u.keep(1, 4, vec![4; 10], 3);
        u.keep(1, 3, vec![3; 10], 3); // committed already: not kept
        u.keep(1, 7, vec![7; 10], 3);
        assert_eq!(u.len(), 3);
        u.committed(1, 4);
        assert_eq!(u.len(), 2);
        let all = u.take_all(2);
        assert_eq!(all.iter().map(|t| t.0).collect::<Vec<_>>(), vec![5, 7]);
        assert_eq!(u.len(), 0);
        assert!(!u.full());
    }

    #[test]
    fn a_later_runs_committed_number_never_drops_an_earlier_runs_tickets() {
        let u = Uncommitted::default();
        u.keep(1, 10, vec![1; 10], 9);
        // The MDS restarted and its new run committed far past 10 (other clients' changes
        // after recovery): that says nothing of this ticket.
        u.committed(2, 500);
        assert_eq!(u.len(), 1);
        assert_eq!(u.evictions().0, 0);
        // The new run serves this client a change while it holds the old ticket: it was
        // evicted, and the loss is counted, not dropped silently.
        u.served_in(2, 500);
        assert_eq!(u.len(), 0);
        let (n, what) = u.evictions();
        assert_eq!(n, 1);
        assert!(what.contains("1 acknowledged"), "{what}");
        // Tickets of the new run are kept as usual.
        u.keep(2, 501, vec![2; 10], 500);
        assert_eq!(u.len(), 1);
    }
}
