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
//!
//! Clients name themselves, so one holder of the client key could pose as thousands of
//! clients that never say what they had. All together the cache keeps at most
//! [`MAX_REPLIES`]; past it, the client that holds the most loses its oldest reply. An honest
//! client holds a few replies (those in flight), so the cache's cost falls on whoever fills
//! it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Replies kept per client at most: its requests it may still resend.
pub const REPLIES_PER_CLIENT: usize = 16_384;
/// Clients with replies kept; past it, the one idle longest is forgotten.
pub const MAX_CLIENTS: usize = 16_384;
/// Replies kept in all; past it, the client holding the most loses its oldest.
pub const MAX_REPLIES: usize = 1 << 18;

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
    /// The clients by the replies they hold, and the replies held in all.
    by_count: BTreeSet<(usize, u128)>,
    total: usize,
}

impl<V> Default for ReplyCache<V> {
    fn default() -> Self {
        ReplyCache {
            clients: BTreeMap::new(),
            last: HashMap::new(),
            by_last: BTreeMap::new(),
            tick: 0,
            acked: HashMap::new(),
            by_count: BTreeSet::new(),
            total: 0,
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
        let before = slots.len();
        // Usually the one or few replies answered since the client's last request: popped in
        // place, nothing copied.
        while slots.first_key_value().is_some_and(|(s, _)| *s < below) {
            slots.pop_first();
        }
        let after = slots.len();
        self.counted(client, before, after);
        if after == 0 {
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
        self.total
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
                if let Some(gone) = self.clients.remove(&idle) {
                    self.counted(idle, gone.len(), 0);
                }
            }
        }
        let new = self.get(client, seq).is_none();
        if new && self.total >= MAX_REPLIES {
            // The client holding the most gives up its oldest.
            if let Some(&(_, most)) = self.by_count.last() {
                if let Some(slots) = self.clients.get_mut(&most) {
                    let before = slots.len();
                    slots.pop_first();
                    let after = slots.len();
                    self.counted(most, before, after);
                    if after == 0 {
                        self.clients.remove(&most);
                        if let Some(t) = self.last.remove(&most) {
                            self.by_last.remove(&t);
                        }
                    }
                }
            }
        }
        self.touch(client);
        let slots = self.clients.entry(client).or_default();
        let before = slots.len();
        if slots.len() >= REPLIES_PER_CLIENT && new {
            slots.pop_first();
        }
        slots.insert(seq, reply);
        let after = slots.len();
        self.counted(client, before, after);
    }

    /// `client` went from holding `before` replies to `after`.
    fn counted(&mut self, client: u128, before: usize, after: usize) {
        if before == after {
            return;
        }
        if before > 0 {
            self.by_count.remove(&(before, client));
        }
        if after > 0 {
            self.by_count.insert((after, client));
        }
        self.total = self.total + after - before;
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
        let counts: Vec<(u128, usize)> = c.clients.iter().map(|(id, r)| (*id, r.len())).collect();
        for (id, n) in counts {
            c.touch(id);
            c.counted(id, 0, n);
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

    #[test]
    fn past_the_total_bound_the_client_holding_most_pays() {
        let mut c = ReplyCache::default();
        c.record(1, 5, 0u8); // an honest client: one reply in flight
                             // Clients that never say what they had, posing as many.
        let flooders = (MAX_REPLIES / REPLIES_PER_CLIENT + 2) as u128;
        for client in 100..100 + flooders {
            for seq in 0..REPLIES_PER_CLIENT as u64 {
                c.record(client, seq, 0);
            }
        }
        assert_eq!(c.len(), MAX_REPLIES, "bounded in all");
        assert_eq!(c.get(1, 5), Some(&0), "the honest client's reply stays");
        let held: usize = c.clients().values().map(|r| r.len()).sum();
        assert_eq!(held, c.len());
        // Forgetting keeps the count.
        c.forget_below(100, u64::MAX);
        let held: usize = c.clients().values().map(|r| r.len()).sum();
        assert_eq!(held, c.len());
    }
}
