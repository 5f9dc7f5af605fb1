//! Leases: the MDS's promise to a client to tell it before an inode's attributes or, for a
//! directory, its entries change, so that the client answers lookups, getattr and readdir from
//! what it caches (an AFS callback; in Lustre, a lock whose blocking AST comes first).
//!
//! A change first recalls the leases other clients hold on every inode it touches, then waits
//! until each holder has acknowledged (it dropped what it cached) or could no longer be using
//! the lease: a client's leases hold only until [`LEASE_TERM_MS`] after it sent the last
//! [`MdsLeaseWait`] that was answered, and one that does not acknowledge in that time loses
//! them all. Only the change waits; every other request goes on. The changer keeps its own
//! leases (it updates its cache from the reply). The check that no other client holds a lease
//! on what a change touches is made again under the namespace's lock, as the change applies:
//! a lease granted after the recall, or on an inode the recall did not know, sends the change
//! round again.
//!
//! A client holding the only lease on a directory may ask to hold it **alone**
//! ([`Leases::grant_alone`]): it then answers creates and unlinks there before sending them,
//! and the MDS recalls that lease before it serves another client anything that reads the
//! directory (a lookup in it, its listing, its attributes), not only before a change. The
//! holder sends what it queued before it acknowledges, so the other client sees it.
//!
//! A grant is made before the state it covers is read, so a change either sees the grant and
//! recalls it, or was applied before the read. Grants are bounded per client and in all, and
//! refused while the inode is being recalled or the client has not confirmed its epoch. Leases
//! live in memory: after a restart, recovery outlasts the term, so none of the last run holds.
//!
//! [`MdsLeaseWait`]: proto::md::MdsLeaseWait

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::{FastMap, FastSet};
use parking_lot::Mutex;
use proto::md::{IdMap, MdsLeaseRecall, LEASE_TERM_MS, MAX_RECALL};
use proto::Fid;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// How long a lease holds after the wait that renewed it.
pub const TERM: Duration = Duration::from_millis(LEASE_TERM_MS);
/// How long a wait is held when there is nothing to recall.
pub const HOLD: Duration = Duration::from_millis(LEASE_TERM_MS / 3);
/// Most leases one client holds.
pub const MAX_PER_CLIENT: usize = 524_288;
/// Most leases held in all.
pub const MAX_TOTAL: usize = 8 << 20;

/// Every lease the MDS has granted.
pub struct Leases {
    state: Mutex<State>,
    term: Duration,
    hold: Duration,
}

#[derive(Default)]
struct State {
    /// Who holds a lease on each inode.
    holders: FastMap<Fid, Vec<u128>>,
    /// Changes under way on each inode: no grants meanwhile.
    recalling: FastMap<Fid, u32>,
    /// Directories held alone, and by whom (while that client still holds the lease).
    alone: FastMap<Fid, u128>,
    /// Recalls sent and not yet acknowledged, on each inode: (client, recall number). A
    /// change on the inode waits for them too, not only for the recalls it sends itself.
    outstanding: FastMap<Fid, Vec<(u128, u64)>>,
    clients: FastMap<u128, Holder>,
    total: usize,
    last_tidy: Option<Instant>,
    /// The last epoch given out: every holder and every loss takes a new one, so no client
    /// sees an epoch it knew before in this run.
    last_epoch: u64,
}

impl State {
    fn next_epoch(&mut self) -> u64 {
        self.last_epoch = self.last_epoch.wrapping_add(2);
        self.last_epoch
    }
}

struct Holder {
    held: FastSet<Fid>,
    /// Changes when the client loses every lease; it must say it saw the new one before it
    /// is granted any again.
    epoch: u64,
    knows_epoch: bool,
    /// The number of the last recall.
    seq: u64,
    /// The newest wait whose cancels were taken ([`proto::md::MdsLeaseWait::nr`]).
    last_wait: u64,
    /// Recalls not yet acknowledged, in order.
    pending: VecDeque<(u64, Fid)>,
    acked: watch::Sender<u64>,
    wake: Arc<Notify>,
    /// The client's leases cannot hold past this (the last answered wait, plus the term).
    confirmed_until: Instant,
    /// Its waits held open now (at most [`WAITS_HELD_PER_CLIENT`]), since the newest wait
    /// came: that one lets go of those held before (the client gave up on them).
    waiting: u32,
    /// Counts the waits that let go of those held before.
    wait_gen: u64,
}

/// Waits of one client held open at once: the client library keeps one, and one more covers a
/// late copy; past that a wait is answered at once, so one client cannot hold the MDS's
/// waiting slots.
pub const WAITS_HELD_PER_CLIENT: u32 = 2;

impl Holder {
    fn new(epoch: u64) -> Holder {
        Holder {
            held: FastSet::default(),
            epoch,
            knows_epoch: false,
            seq: 0,
            last_wait: 0,
            pending: VecDeque::new(),
            acked: watch::channel(0).0,
            wake: Arc::new(Notify::new()),
            confirmed_until: Instant::now(),
            waiting: 0,
            wait_gen: 0,
        }
    }
}

/// Whether `client` still has recall `seq` to acknowledge (a client forgotten has none).
fn unacknowledged(clients: &FastMap<u128, Holder>, client: u128, seq: u64) -> bool {
    clients
        .get(&client)
        .is_some_and(|h| *h.acked.borrow() < seq)
}

/// A change's recall: while it lives, no lease on its inodes is granted.
pub struct Recall<'l> {
    leases: &'l Leases,
    fids: Vec<Fid>,
}

impl Drop for Recall<'_> {
    fn drop(&mut self) {
        let mut s = self.leases.state.lock();
        for f in &self.fids {
            if let Some(n) = s.recalling.get_mut(f) {
                *n -= 1;
                if *n == 0 {
                    s.recalling.remove(f);
                }
            }
        }
    }
}

impl Default for Leases {
    fn default() -> Self {
        Leases::new(TERM, HOLD)
    }
}

impl Leases {
    pub fn new(term: Duration, hold: Duration) -> Leases {
        Leases {
            state: Mutex::new(State {
                last_epoch: rand::random::<u64>() | 1,
                ..State::default()
            }),
            term,
            hold,
        }
    }

    /// Numbers epochs from `seed` rather than at random (a simulation that must replay
    /// exactly names it).
    pub fn epochs_from(self, seed: u64) -> Leases {
        self.state.lock().last_epoch = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        self
    }

    /// Grants `client` leases on all of `fids`, or on none: false when the client has no
    /// live channel, is over its bound, or one of them is being recalled.
    pub fn grant(&self, client: u128, fids: &[Fid]) -> bool {
        let mut s = self.state.lock();
        if fids.iter().any(|f| s.recalling.contains_key(f)) {
            return false;
        }
        if fids
            .iter()
            .any(|f| Self::alone_by(&s, *f).is_some_and(|c| c != client))
        {
            return false;
        }
        let total = s.total;
        let Some(h) = s.clients.get_mut(&client) else {
            return false;
        };
        if !h.knows_epoch || h.confirmed_until <= Instant::now() {
            return false;
        }
        // A few FIDs at a time: a scan dedups them.
        let mut new: Vec<Fid> = Vec::with_capacity(fids.len());
        for f in fids {
            if !h.held.contains(f) && !new.contains(f) {
                new.push(*f);
            }
        }
        if h.held.len() + new.len() > MAX_PER_CLIENT || total + new.len() > MAX_TOTAL {
            return false;
        }
        h.held.extend(new.iter().copied());
        s.total += new.len();
        for f in new {
            s.holders.entry(f).or_default().push(client);
            // A lease given back and granted again is shared until asked for alone again.
            if s.alone.get(&f) == Some(&client) {
                s.alone.remove(&f);
            }
        }
        true
    }

    /// Who holds the lease on `f` alone, if anyone still does.
    fn alone_by(s: &State, f: Fid) -> Option<u128> {
        let c = *s.alone.get(&f)?;
        s.holders
            .get(&f)
            .is_some_and(|hs| hs.contains(&c))
            .then_some(c)
    }

    /// Lets `client`, which holds the only lease on `dir`, hold it alone (see the module's
    /// text): false when another client holds one too, it is being recalled, or the client
    /// holds none.
    pub fn grant_alone(&self, client: u128, dir: Fid) -> bool {
        let mut s = self.state.lock();
        if s.recalling.contains_key(&dir) {
            return false;
        }
        let live = s
            .clients
            .get(&client)
            .is_some_and(|h| h.knows_epoch && h.confirmed_until > Instant::now());
        if !live
            || s.holders
                .get(&dir)
                .is_none_or(|hs| hs.as_slice() != [client])
        {
            return false;
        }
        s.alone.insert(dir, client);
        true
    }

    /// Before another client than `asker` is served a read of `fids`: recalls the leases on
    /// those held alone by someone else, and waits as [`Leases::recall`] does.
    pub async fn recall_alone(&self, fids: &[Fid], asker: Option<u128>) {
        let held: Vec<Fid> = {
            let s = self.state.lock();
            fids.iter()
                .copied()
                .filter(|f| Self::alone_by(&s, *f).is_some_and(|c| Some(c) != asker))
                .collect()
        };
        if !held.is_empty() {
            drop(self.recall(&held, asker).await);
        }
    }

    /// Whether `client` holds the lease on `fid`.
    pub fn holds(&self, client: u128, fid: Fid) -> bool {
        self.state
            .lock()
            .holders
            .get(&fid)
            .is_some_and(|hs| hs.contains(&client))
    }

    /// Whether any of `fids` is held alone by a client other than `asker`.
    pub fn held_alone(&self, fids: &[Fid], asker: Option<u128>) -> bool {
        let s = self.state.lock();
        fids.iter()
            .any(|f| Self::alone_by(&s, *f).is_some_and(|c| Some(c) != asker))
    }

    /// Recalls every lease on `fids` held by a client other than `except`, and waits until
    /// each holder acknowledged or its leases ran out (it then loses them all).
    pub async fn recall(&self, fids: &[Fid], except: Option<u128>) -> Recall<'_> {
        let mut waits = vec![];
        {
            let mut s = self.state.lock();
            let s = &mut *s;
            for f in fids {
                *s.recalling.entry(*f).or_default() += 1;
                let others: Vec<u128> = match s.holders.get_mut(f) {
                    Some(holders) => {
                        let others = holders
                            .iter()
                            .copied()
                            .filter(|c| Some(*c) != except)
                            .collect();
                        holders.retain(|c| Some(*c) == except);
                        if holders.is_empty() {
                            s.holders.remove(f);
                        }
                        others
                    }
                    None => vec![],
                };
                if s.alone.get(f).is_some_and(|c| Some(*c) != except) {
                    s.alone.remove(f);
                }
                for c in others {
                    let Some(h) = s.clients.get_mut(&c) else {
                        continue;
                    };
                    if h.held.remove(f) {
                        s.total -= 1;
                    }
                    h.seq += 1;
                    h.pending.push_back((h.seq, *f));
                    h.wake.notify_one();
                    s.outstanding.entry(*f).or_default().push((c, h.seq));
                }
                // Every recall of this inode not yet acknowledged, this change's and those
                // of changes before it: a holder that has not dropped its copy yet may still
                // answer from it.
                let clients = &s.clients;
                if let Some(out) = s.outstanding.get_mut(f) {
                    out.retain(|&(c, seq)| unacknowledged(clients, c, seq));
                    for (c, seq) in out.iter() {
                        if Some(*c) == except {
                            continue;
                        }
                        let h = &clients[c];
                        waits.push((*c, *seq, h.acked.subscribe(), h.confirmed_until));
                    }
                    if out.is_empty() {
                        s.outstanding.remove(f);
                    }
                }
            }
        }
        for (client, seq, mut acked, until) in waits {
            let done = tokio::time::timeout_at(until, acked.wait_for(|a| *a >= seq)).await;
            if !matches!(done, Ok(Ok(_))) {
                self.lose(client, seq);
            }
        }
        Recall {
            leases: self,
            fids: fids.to_vec(),
        }
    }

    /// Whether no client but `except` holds a lease on any of `fids` (checked under the
    /// namespace's lock, as a change applies).
    pub fn clear(&self, fids: &[Fid], except: Option<u128>) -> bool {
        let s = self.state.lock();
        fids.iter().all(|f| {
            let held = s
                .holders
                .get(f)
                .is_some_and(|hs| hs.iter().any(|c| Some(*c) != except));
            let unacknowledged = s.outstanding.get(f).is_some_and(|out| {
                out.iter()
                    .any(|(c, seq)| Some(*c) != except && unacknowledged(&s.clients, *c, *seq))
            });
            !held && !unacknowledged
        })
    }

    /// `client` did not acknowledge recall `seq` before its leases ran out: it loses them all.
    fn lose(&self, client: u128, seq: u64) {
        let mut s = self.state.lock();
        let Some(h) = s.clients.get(&client) else {
            return;
        };
        if *h.acked.borrow() >= seq {
            return; // acknowledged after all
        }
        if seq > h.seq {
            // Sent to an earlier holder of this client, forgotten since: nothing to lose.
            Self::settle(&mut s, client);
            return;
        }
        tracing::warn!(
            client = format!("{client:032x}"),
            "a client did not acknowledge a lease recall in time: it loses all its leases"
        );
        Self::drop_all(&mut s, client);
        let epoch = s.next_epoch();
        if let Some(h) = s.clients.get_mut(&client) {
            h.epoch = epoch;
            h.knows_epoch = false;
            h.pending.clear();
            // Every recall so far is settled: the client holds nothing of this epoch.
            h.acked.send_replace(h.seq);
            h.wake.notify_one();
        }
    }

    fn drop_all(s: &mut State, client: u128) {
        let Some(h) = s.clients.get_mut(&client) else {
            return;
        };
        let held: Vec<Fid> = h.held.drain().collect();
        s.total -= held.len();
        for f in held {
            if s.alone.get(&f) == Some(&client) {
                s.alone.remove(&f);
            }
            if let Some(hs) = s.holders.get_mut(&f) {
                hs.retain(|c| *c != client);
                if hs.is_empty() {
                    s.holders.remove(&f);
                }
            }
        }
    }

    /// A client left or was evicted: its leases are gone, and no change waits on a recall
    /// sent to it.
    pub fn forget(&self, client: u128) {
        let mut s = self.state.lock();
        Self::drop_all(&mut s, client);
        if let Some(h) = s.clients.remove(&client) {
            h.acked.send_replace(u64::MAX);
        }
        Self::settle(&mut s, client);
    }

    /// Takes `client`'s recalls off the list changes wait on: it holds nothing they recalled
    /// (it was forgotten, or lost every lease). Its recall numbers start again when it comes
    /// back, so a recall left listed from before would never be acknowledged.
    fn settle(s: &mut State, client: u128) {
        s.outstanding.retain(|_, out| {
            out.retain(|(c, _)| *c != client);
            !out.is_empty()
        });
    }

    /// `client`'s holder, made anew (holding nothing) if it has none.
    fn holder(s: &mut State, client: u128) -> &mut Holder {
        if !s.clients.contains_key(&client) {
            Self::settle(s, client);
            let e = s.next_epoch();
            s.clients.insert(client, Holder::new(e));
        }
        s.clients.get_mut(&client).expect("inserted above")
    }

    /// Leases `client` holds now.
    pub fn held_by(&self, client: u128) -> usize {
        self.state
            .lock()
            .clients
            .get(&client)
            .map_or(0, |h| h.held.len())
    }

    /// Leases held in all.
    pub fn total(&self) -> usize {
        self.state.lock().total
    }

    /// One lease wait of `client`, number `nr`: takes its acknowledgements and (if it is the
    /// newest wait yet) its cancels, then answers with the recalls pending, at once or when
    /// one comes, or empty after the hold. A wait that gives leases back is answered at once,
    /// and the newest wait lets go of those held before it.
    #[allow(clippy::too_many_arguments)]
    pub async fn wait(
        &self,
        client: u128,
        nr: u64,
        acked: u64,
        epoch: u64,
        cancel: &[Fid],
        instance: u64,
        idmap: IdMap,
    ) -> MdsLeaseRecall {
        let wake = {
            let mut s = self.state.lock();
            let s = &mut *s;
            self.tidy(s);
            Self::holder(s, client);
            let h = s.clients.get_mut(&client).expect("made above");
            if epoch == h.epoch {
                h.knows_epoch = true;
            }
            h.pending.retain(|(seq, _)| *seq > acked);
            h.acked.send_if_modified(|a| {
                let up = acked > *a && acked <= h.seq;
                if up {
                    *a = acked;
                }
                up
            });
            // A late copy of an older wait gives back nothing: the client may have been
            // granted those leases again since it sent it.
            let cancel = if nr > h.last_wait {
                h.last_wait = nr;
                if h.waiting > 0 {
                    // The client sent a new wait while others were held: it gave up on them
                    // (to give leases back at once). They end now, and no longer count.
                    h.wait_gen += 1;
                    h.waiting = 0;
                    h.wake.notify_waiters();
                }
                cancel
            } else {
                &[]
            };
            let gave_back = !cancel.is_empty();
            for f in cancel {
                if h.held.remove(f) {
                    s.total -= 1;
                    if let Some(hs) = s.holders.get_mut(f) {
                        hs.retain(|c| *c != client);
                        if hs.is_empty() {
                            s.holders.remove(f);
                        }
                    }
                }
            }
            // A wait that gave leases back is answered at once: the client has more to give
            // back, or it would not have sent it before the held one's answer.
            let hold = h.pending.is_empty()
                && h.knows_epoch
                && !gave_back
                && h.waiting < WAITS_HELD_PER_CLIENT;
            if hold {
                h.waiting += 1;
            }
            // Made under the lock: a newer wait's wake-up reaches it however soon that comes.
            hold.then(|| (h.wake.clone().notified_owned(), h.wait_gen))
        };
        if let Some((woken, gen)) = wake {
            // Counted down however the wait ends (its task dropped too), unless a newer wait
            // let go of it first.
            struct Held<'a>(&'a Leases, u128, u64);
            impl Drop for Held<'_> {
                fn drop(&mut self) {
                    if let Some(h) = self.0.state.lock().clients.get_mut(&self.1) {
                        if h.wait_gen == self.2 {
                            h.waiting = h.waiting.saturating_sub(1);
                        }
                    }
                }
            }
            let _held = Held(self, client, gen);
            let _ = tokio::time::timeout(self.hold, woken).await;
        }
        let mut s = self.state.lock();
        let h = Self::holder(&mut s, client);
        let fids: Vec<(u64, Fid)> = h.pending.iter().take(MAX_RECALL).copied().collect();
        h.confirmed_until = h.confirmed_until.max(Instant::now() + self.term);
        MdsLeaseRecall {
            instance,
            epoch: h.epoch,
            seq: fids.last().map_or(0, |(s, _)| *s),
            fids: fids.into_iter().map(|(_, f)| f).collect(),
            idmap,
        }
    }

    /// Forgets clients whose channel went quiet a term past their leases' end: those leases
    /// cannot be in use, so nothing needs recalling from them.
    fn tidy(&self, s: &mut State) {
        let now = Instant::now();
        if s.last_tidy
            .is_some_and(|t| now.duration_since(t) < self.term)
        {
            return;
        }
        s.last_tidy = Some(now);
        let quiet: Vec<u128> = s
            .clients
            .iter()
            .filter(|(_, h)| h.confirmed_until + self.term < now)
            .map(|(c, _)| *c)
            .collect();
        for c in quiet {
            Self::drop_all(s, c);
            if let Some(h) = s.clients.remove(&c) {
                h.acked.send_replace(u64::MAX);
            }
        }
        let clients = &s.clients;
        s.outstanding.retain(|_, out| {
            out.retain(|&(c, seq)| unacknowledged(clients, c, seq));
            !out.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::fid::ROOT;

    fn fid(n: u32) -> Fid {
        Fid::new(proto::fid::FIRST_NORMAL_SEQ, n, 0)
    }

    #[tokio::test]
    async fn a_grant_needs_a_live_channel_and_a_known_epoch() {
        let l = Leases::new(Duration::from_secs(5), Duration::from_millis(10));
        assert!(!l.grant(7, &[ROOT]), "no channel yet");
        let r = l.wait(7, 1, 0, 0, &[], 1, IdMap::default()).await;
        assert!(!l.grant(7, &[ROOT]), "the epoch is not known yet");
        l.wait(7, 2, 0, r.epoch, &[], 1, IdMap::default()).await;
        assert!(l.grant(7, &[ROOT, fid(5)]));
        assert_eq!(l.held_by(7), 2);
        assert!(!l.clear(&[ROOT], None));
        assert!(l.clear(&[ROOT], Some(7)));
    }

    #[tokio::test]
    async fn a_recall_waits_for_the_acknowledgement_and_blocks_grants_meanwhile() {
        let l = Arc::new(Leases::new(Duration::from_secs(5), Duration::from_secs(1)));
        let e = l.wait(1, 3, 0, 0, &[], 1, IdMap::default()).await.epoch;
        l.wait(1, 4, 0, e, &[], 1, IdMap::default()).await;
        assert!(l.grant(1, &[fid(9)]));
        let l2 = l.clone();
        let changer = tokio::spawn(async move {
            let _r = l2.recall(&[fid(9)], Some(2)).await;
            assert!(!l2.grant(1, &[fid(9)]), "no grant while recalling");
            assert!(l2.clear(&[fid(9)], Some(2)));
        });
        let got = l.wait(1, 5, 0, e, &[], 1, IdMap::default()).await;
        assert_eq!(got.fids, vec![fid(9)]);
        assert_eq!(l.held_by(1), 0);
        // The acknowledgement lets the change go on.
        let acked = l.clone();
        let seq = got.seq;
        tokio::spawn(async move { acked.wait(1, 6, seq, e, &[], 1, IdMap::default()).await });
        tokio::time::timeout(Duration::from_secs(2), changer)
            .await
            .expect("the change went ahead once acknowledged")
            .unwrap();
        assert!(
            l.grant(1, &[fid(9)]),
            "granted again once the change is done"
        );
    }

    #[tokio::test]
    async fn a_holder_that_never_acknowledges_loses_every_lease_after_the_term() {
        let l = Leases::new(Duration::from_millis(300), Duration::from_millis(50));
        let e = l.wait(1, 7, 0, 0, &[], 1, IdMap::default()).await.epoch;
        l.wait(1, 8, 0, e, &[], 1, IdMap::default()).await;
        assert!(l.grant(1, &[fid(1), fid(2)]));
        let t = Instant::now();
        drop(l.recall(&[fid(1)], None).await);
        let waited = t.elapsed();
        assert!(waited <= Duration::from_millis(400), "waited {waited:?}");
        assert_eq!(l.held_by(1), 0, "all its leases are gone");
        assert!(
            !l.grant(1, &[fid(3)]),
            "no grants until it sees the new epoch"
        );
        let r = l.wait(1, 9, 0, e, &[], 1, IdMap::default()).await;
        assert_ne!(r.epoch, e);
        l.wait(1, 10, r.seq, r.epoch, &[], 1, IdMap::default())
            .await;
        assert!(l.grant(1, &[fid(3)]));
    }

    #[tokio::test]
    async fn a_recall_sent_before_the_holder_was_forgotten_holds_up_no_change() {
        let l = Leases::new(Duration::from_millis(300), Duration::from_millis(50));
        let e = l.wait(1, 1, 0, 0, &[], 1, IdMap::default()).await.epoch;
        l.wait(1, 2, 0, e, &[], 1, IdMap::default()).await;
        assert!(l.grant(1, &[fid(1)]));
        // A recall goes out; the holder is forgotten before it answers, then comes back
        // (a new channel) with its recall numbers starting again.
        {
            let mut s = l.state.lock();
            let s = &mut *s;
            let h = s.clients.get_mut(&1).unwrap();
            h.held.remove(&fid(1));
            h.seq += 1;
            s.outstanding.entry(fid(1)).or_default().push((1, h.seq));
            s.holders.remove(&fid(1));
            s.total -= 1;
        }
        l.forget(1);
        l.wait(1, 1, 0, 0, &[], 1, IdMap::default()).await;
        assert!(l.clear(&[fid(1)], None), "nothing is held or owed on it");
        let t = Instant::now();
        drop(l.recall(&[fid(1)], None).await);
        assert!(t.elapsed() < Duration::from_millis(100));
        // Even if a stale recall is listed when the holder comes back, it settles at once.
        l.state
            .lock()
            .outstanding
            .entry(fid(2))
            .or_default()
            .push((1, 5));
        drop(l.recall(&[fid(2)], None).await);
        assert!(l.clear(&[fid(2)], None), "a stale recall settles");
    }

    #[tokio::test]
    async fn cancelled_leases_are_not_recalled() {
        let l = Leases::new(Duration::from_secs(5), Duration::from_millis(10));
        let e = l.wait(1, 11, 0, 0, &[], 1, IdMap::default()).await.epoch;
        l.wait(1, 12, 0, e, &[], 1, IdMap::default()).await;
        assert!(l.grant(1, &[fid(4)]));
        l.wait(1, 13, 0, e, &[fid(4)], 1, IdMap::default()).await;
        assert_eq!(l.total(), 0);
        let t = Instant::now();
        drop(l.recall(&[fid(4)], None).await);
        assert!(t.elapsed() < Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_wait_giving_back_is_answered_at_once_and_lets_go_of_the_held_one() {
        let l = Arc::new(Leases::new(Duration::from_secs(5), Duration::from_secs(3)));
        let e = l.wait(1, 1, 0, 0, &[], 1, IdMap::default()).await.epoch;
        // Wait 2 gives nothing back: held for the hold.
        let held = tokio::spawn({
            let l = l.clone();
            async move { l.wait(1, 2, 0, e, &[], 1, IdMap::default()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !held.is_finished(),
            "a wait with nothing to give back is held"
        );
        assert!(l.grant(1, &[fid(4), fid(5)]));
        // The client gave up on it to give leases back.
        let t = Instant::now();
        l.wait(1, 3, 0, e, &[fid(4)], 1, IdMap::default()).await;
        assert!(t.elapsed() < Duration::from_secs(1), "answered at once");
        assert_eq!(l.held_by(1), 1);
        tokio::time::timeout(Duration::from_secs(1), held)
            .await
            .expect("the newer wait lets go of the held one")
            .unwrap();
        // The slots it held are free: the next two waits are held again, a third is not.
        let a = tokio::spawn({
            let l = l.clone();
            async move { l.wait(1, 4, 0, e, &[], 1, IdMap::default()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!a.is_finished(), "held");
        let t = Instant::now();
        l.wait(1, 4, 0, e, &[], 1, IdMap::default()).await;
        l.wait(1, 4, 0, e, &[], 1, IdMap::default()).await;
        assert!(t.elapsed() >= Duration::from_secs(2), "two copies held");
        a.abort();
    }

    #[tokio::test]
    async fn a_late_copy_of_an_old_wait_gives_back_nothing() {
        let l = Leases::new(Duration::from_secs(5), Duration::from_millis(10));
        let e = l.wait(1, 1, 0, 0, &[], 1, IdMap::default()).await.epoch;
        l.wait(1, 2, 0, e, &[], 1, IdMap::default()).await;
        assert!(l.grant(1, &[fid(4)]));
        l.wait(1, 3, 0, e, &[fid(4)], 1, IdMap::default()).await;
        assert_eq!(l.held_by(1), 0);
        // Granted again; then a copy of wait 3 arrives late.
        assert!(l.grant(1, &[fid(4)]));
        l.wait(1, 3, 0, e, &[fid(4)], 1, IdMap::default()).await;
        assert_eq!(l.held_by(1), 1, "the grant made after wait 3 stands");
        assert!(!l.clear(&[fid(4)], None));
    }

    #[tokio::test]
    async fn a_change_waits_for_a_recall_another_change_sent() {
        let l = Arc::new(Leases::new(Duration::from_secs(5), Duration::from_secs(1)));
        let e = l.wait(1, 1, 0, 0, &[], 1, IdMap::default()).await.epoch;
        l.wait(1, 2, 0, e, &[], 1, IdMap::default()).await;
        assert!(l.grant(1, &[fid(9)]));
        // A first change recalls the lease and waits (its caller gave up, say).
        let l2 = l.clone();
        let first = tokio::spawn(async move { drop(l2.recall(&[fid(9)], Some(2)).await) });
        tokio::task::yield_now().await;
        // A second change on the same inode finds no holder, but the holder has not dropped
        // its copy yet: it is not clear, and its recall waits too.
        assert!(!l.clear(&[fid(9)], Some(2)));
        let l3 = l.clone();
        let second = tokio::spawn(async move { drop(l3.recall(&[fid(9)], Some(2)).await) });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !second.is_finished(),
            "went ahead before the holder acknowledged"
        );
        let got = l.wait(1, 3, 0, e, &[], 1, IdMap::default()).await;
        l.wait(1, 4, got.seq, e, &[], 1, IdMap::default()).await;
        tokio::time::timeout(Duration::from_secs(2), second)
            .await
            .expect("acknowledged: the second change goes on")
            .unwrap();
        first.await.unwrap();
        assert!(l.clear(&[fid(9)], Some(2)));
    }
}
