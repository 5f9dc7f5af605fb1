//! The reply cache: the replies to each client's requests that the client may still resend,
//! so that a resent request is answered as the first time instead of carried out twice. It is
//! plain data; the MDS keeps it in its namespace, under the namespace's lock, and consults it
//! twice: once to decide (a resend is answered at once), and again under the same lock as the
//! change is applied (a resend that raced the first attempt finds the first reply there).
//! `tests/loom.rs` checks that protocol.
//!
//! A client says with every request which of its requests it has had replies to (every one
//! numbered below a watermark, Lustre's last-xid-replied): those replies are forgotten, and
//! only those. The client's requests in flight are bounded (a batch is at most 512 changes,
//! and a client queues at most 8,192 of them), far below [`REPLIES_PER_CLIENT`]; that bound
//! forgets the oldest replies only for a client that never says what it had (or a journal
//! replayed without the watermarks it was pruned by). A client whose replies are all
//! forgotten holds no room. Past [`MAX_CLIENTS`] clients with replies, the one idle longest is
//! forgotten: a client that left without saying it had its last replies (every one-shot
//! command does) must not hold room for ever, and one still resending is never the idlest of
//! thousands. A request numbered below what its client said it had is a stale copy, refused
//! ([`ReplyCache::is_stale`]).

use std::collections::{BTreeMap, HashMap};

/// Replies kept per client at most: its requests it may still resend.
pub const REPLIES_PER_CLIENT: usize = 16_384;
/// Clients with replies kept; past it, the one idle longest is forgotten.
pub const MAX_CLIENTS: usize = 16_384;

/// Replies `V` by client and request sequence number.
#[derive(Clone, Debug)]
pub struct ReplyCache<V> {
    /// Per client, its replies by request number.
    clients: BTreeMap<u128, BTreeMap<u64, V>>,
    /// When each client last recorded a reply (a counter), and the clients by that time.
    last: HashMap<u128, u64>,
    by_last: BTreeMap<u64, u128>,
    tick: u64,
    /// Per client, the highest number below which it said it had every reply: a request
    /// numbered below it is a stale copy (a duplicate the network held back), never carried
    /// out. Kept for clients with no replies left too, up to a bound.
    acked: HashMap<u128, u64>,
}

impl<V> Default for ReplyCache<V> {
    fn default() -> Self {
        ReplyCache {
            clients: BTreeMap::new(),
            last: HashMap::new(),
            by_last: BTreeMap::new(),
            tick: 0,
            acked: HashMap::new(),
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
        self.clients.get(&client)?.get(&seq)
    }

    /// Forgets the replies to `client`'s requests numbered below `below`: the client says it
    /// had them, and will not resend those requests.
    pub fn forget_below(&mut self, client: u128, below: u64) {
        if below > 0 {
            if self.acked.len() >= 2 * MAX_CLIENTS && !self.acked.contains_key(&client) {
                // Bounded: the watermarks of clients with no replies kept go first.
                let clients = &self.clients;
                self.acked.retain(|c, _| clients.contains_key(c));
            }
            let a = self.acked.entry(client).or_default();
            *a = (*a).max(below);
        }
        let Some(slots) = self.clients.get_mut(&client) else {
            return;
        };
        // Usually the one or few replies answered since the client's last request: popped in
        // place, nothing copied.
        while slots.first_key_value().is_some_and(|(s, _)| *s < below) {
            slots.pop_first();
        }
        if slots.is_empty() {
            self.clients.remove(&client);
            if let Some(t) = self.last.remove(&client) {
                self.by_last.remove(&t);
            }
        }
    }

    /// Whether request `seq` of `client` is numbered below what the client said it had every
    /// reply below: a stale copy of a request already answered, which must not be carried
    /// out again (its reply may be forgotten).
    pub fn is_stale(&self, client: u128, seq: u64) -> bool {
        self.acked.get(&client).is_some_and(|a| seq < *a)
    }

    /// Replies kept in all.
    pub fn len(&self) -> usize {
        self.clients.values().map(BTreeMap::len).sum()
    }

    /// Whether no reply is kept.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Records the reply to request `seq` of `client`. Past the bounds (a client that never
    /// says what it had; a journal replayed without its watermarks), the client's lowest
    /// numbered reply, or the client idle longest, goes.
    pub fn record(&mut self, client: u128, seq: u64, reply: V) {
        if !self.clients.contains_key(&client) && self.clients.len() >= MAX_CLIENTS {
            if let Some((_, idle)) = self.by_last.pop_first() {
                self.last.remove(&idle);
                self.clients.remove(&idle);
            }
        }
        self.touch(client);
        let slots = self.clients.entry(client).or_default();
        if slots.len() >= REPLIES_PER_CLIENT && !slots.contains_key(&seq) {
            slots.pop_first();
        }
        slots.insert(seq, reply);
    }

    /// Every client's replies, by request number (to save them).
    pub fn clients(&self) -> &BTreeMap<u128, BTreeMap<u64, V>> {
        &self.clients
    }

    /// A cache holding `clients` (as saved); their recency starts in the order given.
    pub fn from_clients(clients: BTreeMap<u128, BTreeMap<u64, V>>) -> ReplyCache<V> {
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
    fn replies_are_kept_until_the_client_says_it_had_them_and_no_longer() {
        let mut c = ReplyCache::default();
        // A batch of 512 changes, and more, all in flight: none is forgotten by count.
        for seq in 0..2048u64 {
            c.record(7, seq, seq);
        }
        assert_eq!(c.get(7, 0), Some(&0));
        c.forget_below(7, 1000);
        assert_eq!(c.get(7, 999), None);
        assert_eq!(c.get(7, 1000), Some(&1000));
        assert_eq!(c.len(), 1048);
        // Caught up: the client holds no room at all.
        c.forget_below(7, 2048);
        assert!(c.is_empty());
        // A copy of an answered request that the network held back is known stale.
        assert!(c.is_stale(7, 1500));
        assert!(!c.is_stale(7, 2048));
        assert!(!c.is_stale(8, 1));
    }

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
