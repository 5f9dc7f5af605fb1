//! The reply cache: the replies to each client's latest requests, so that a resent request is
//! answered as the first time instead of carried out twice. It is plain data; the MDS keeps it
//! in its namespace, under the namespace's lock, and consults it twice: once to decide (a
//! resend is answered at once), and again under the same lock as the change is applied (a
//! resend that raced the first attempt finds the first reply there). `tests/loom.rs` checks
//! that protocol.

use std::collections::{BTreeMap, VecDeque};

/// Replies kept per client: its latest requests.
pub const REPLIES_PER_CLIENT: usize = 64;
/// Clients kept; past it, the one with the lowest id is forgotten.
pub const MAX_CLIENTS: usize = 16_384;

/// Replies `V` by client and request sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyCache<V> {
    clients: BTreeMap<u128, VecDeque<(u64, V)>>,
}

impl<V> Default for ReplyCache<V> {
    fn default() -> Self {
        ReplyCache {
            clients: BTreeMap::new(),
        }
    }
}

impl<V> ReplyCache<V> {
    /// The reply given to request `seq` of `client`, if it was carried out.
    pub fn get(&self, client: u128, seq: u64) -> Option<&V> {
        self.clients
            .get(&client)?
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, v)| v)
    }

    /// Records the reply to request `seq` of `client`.
    pub fn record(&mut self, client: u128, seq: u64, reply: V) {
        if !self.clients.contains_key(&client) && self.clients.len() >= MAX_CLIENTS {
            self.clients.pop_first();
        }
        let slots = self.clients.entry(client).or_default();
        if slots.len() >= REPLIES_PER_CLIENT {
            slots.pop_front();
        }
        slots.push_back((seq, reply));
    }

    /// Every client's replies, oldest first (to save them).
    pub fn clients(&self) -> &BTreeMap<u128, VecDeque<(u64, V)>> {
        &self.clients
    }

    /// A cache holding `clients` (as saved).
    pub fn from_clients(clients: BTreeMap<u128, VecDeque<(u64, V)>>) -> ReplyCache<V> {
        ReplyCache { clients }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_client_keeps_its_latest_replies() {
        let mut c = ReplyCache::default();
        for seq in 0..(REPLIES_PER_CLIENT as u64 + 1) {
            c.record(7, seq, seq * 10);
        }
        assert_eq!(c.get(7, 0), None, "the oldest went");
        assert_eq!(c.get(7, 1), Some(&10));
        assert_eq!(c.get(8, 1), None);
    }
}
