//! Changes the MDS answered before they were durable (commit-behind), kept until its committed
//! transaction number passes them, to be replayed in order after an MDS restart.
//!
//! The MDS answers a change with its transaction number, the last committed one, and a sealed
//! ticket that applies it again exactly. The client keeps the tickets of changes above the
//! committed number, bounded: past [`MAX_TICKETS`] or [`MAX_TICKET_BYTES`], the next change
//! first waits for the MDS to commit (back-pressure), so a client never holds more than that.

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
}

impl Uncommitted {
    /// Keeps the ticket of change `transno`, unless it is committed already.
    pub fn keep(&self, transno: u64, ticket: Vec<u8>, committed: u64) {
        let mut h = self.inner.lock();
        if transno > committed.max(h.committed) && !ticket.is_empty() {
            h.bytes += ticket.len();
            if let Some(old) = h.tickets.insert(transno, ticket) {
                h.bytes -= old.len();
            }
        }
        drop(h);
        self.committed(committed);
    }

    /// The MDS has committed every change up to `committed`: their tickets go.
    pub fn committed(&self, committed: u64) {
        let mut h = self.inner.lock();
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

    /// Whether the next change must first wait for the MDS to commit.
    pub fn full(&self) -> bool {
        let h = self.inner.lock();
        h.tickets.len() >= MAX_TICKETS || h.bytes >= MAX_TICKET_BYTES
    }

    /// Uncommitted changes held now.
    pub fn len(&self) -> usize {
        self.inner.lock().tickets.len()
    }

    /// Every ticket held, in transaction order, for a replay. After a restart, the MDS's
    /// transaction numbers start again from its last committed one: what the old run
    /// committed is forgotten here too.
    pub fn take_all(&self) -> Vec<(u64, Vec<u8>)> {
        let mut h = self.inner.lock();
        h.bytes = 0;
        h.committed = 0;
        std::mem::take(&mut h.tickets).into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_go_once_committed_and_come_back_in_order() {
        let u = Uncommitted::default();
        u.keep(5, vec![5; 10], 3);
        u.keep(4, vec![4; 10], 3);
        u.keep(3, vec![3; 10], 3); // committed already: not kept
        u.keep(7, vec![7; 10], 3);
        assert_eq!(u.len(), 3);
        u.committed(4);
        assert_eq!(u.len(), 2);
        let all = u.take_all();
        assert_eq!(all.iter().map(|t| t.0).collect::<Vec<_>>(), vec![5, 7]);
        assert_eq!(u.len(), 0);
        assert!(!u.full());
    }
}
