//! The reply cache: the replies to each client's latest requests, so that a resent request is
//! answered as the first time instead of carried out twice. It is plain data; the MDS keeps it
//! in its namespace, under the namespace's lock, and consults it twice: once to decide (a
//! resend is answered at once), and again under the same lock as the change is applied (a
//! resend that raced the first attempt finds the first reply there). `tests/loom.rs` checks
//! that protocol.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// Replies kept per client: its latest requests.
pub const REPLIES_PER_CLIENT: usize = 64;
/// Clients kept; past it, the one that recorded a reply least recently is forgotten, so no
/// client can push out the replies of one that is busy.
pub const MAX_CLIENTS: usize = 16_384;

/// Replies `V` by client and request sequence number.
#[derive(Clone, Debug)]
pub struct ReplyCache<V> {
    clients: BTreeMap<u128, VecDeque<(u64, V)>>,
    /// When each client last recorded a reply (a counter), and the clients by that time.
    last: HashMap<u128, u64>,
    by_last: BTreeMap<u64, u128>,
    tick: u64,
}

impl<V> Default for ReplyCache<V> {
    fn default() -> Self {
        ReplyCache {
            clients: BTreeMap::new(),
            last: HashMap::new(),
            by_last: BTreeMap::new(),
            tick: 0,
        }
    }
}

/// Two caches are equal when they hold the same replies (recency is not part of what they
/// hold: it is rebuilt when a cache is loaded).
impl<V: PartialEq> PartialEq for ReplyCache<V> {
    fn eq(&self, other: &Self) -> bool {
        self.clients == other.clients
    }
}

impl<V: Eq> Eq for ReplyCache<V> {}

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
            if let Some((_, idle)) = self.by_last.pop_first() {
                self.last.remove(&idle);
                self.clients.remove(&idle);
            }
        }
        self.touch(client);
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

    /// A cache holding `clients` (as saved); their recency starts in the order given.
    pub fn from_clients(clients: BTreeMap<u128, VecDeque<(u64, V)>>) -> ReplyCache<V> {
        let mut c = ReplyCache {
            clients,
            ..ReplyCache::default()
        };
        let ids: Vec<u128> = c.clients.keys().copied().collect();
        for id in ids {
            c.touch(id);
        }
        c
    }

    fn touch(&mut self, client: u128) {
        self.tick += 1;
        if let Some(before) = self.last.insert(client, self.tick) {
            self.by_last.remove(&before);
        }
        self.by_last.insert(self.tick, client);
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

    #[test]
    fn the_client_idle_longest_goes_first_when_the_cache_is_full() {
        let mut c = ReplyCache::default();
        for client in 0..MAX_CLIENTS as u128 {
            c.record(client, 1, 0u8);
        }
        // Client 0 is busy again; a new client then pushes out the one idle longest, client 1.
        c.record(0, 2, 0);
        c.record(u128::MAX, 1, 0);
        assert_eq!(c.get(0, 2), Some(&0));
        assert_eq!(c.get(1, 1), None);
        assert_eq!(c.get(u128::MAX, 1), Some(&0));
    }
}
