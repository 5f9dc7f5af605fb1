//! Multi-rail: a peer reached at several addresses (one per network interface), as LNet's
//! multi-rail peers are. The peer is named by its first address everywhere above the
//! transport; calls go round the rails that answer, and a rail that failed (no connection, no
//! reply, a dropped connection) is set aside for [`RAIL_RETRY`], after which calls try it
//! again. When every rail has failed, the one that failed longest ago is tried first.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Most addresses one peer may have.
pub const MAX_RAILS: usize = 8;
/// How long a failed rail is set aside before calls try it again.
pub const RAIL_RETRY: Duration = Duration::from_secs(10);
/// How long bytes sent over one rail may go unacknowledged before its connection is closed
/// and the calls on it are resent over another.
pub const RAIL_DEAD: Duration = Duration::from_secs(3);
/// How long connecting over one rail may take before the next is tried, when there is one.
pub const RAIL_CONNECT: Duration = Duration::from_secs(2);

/// The addresses of one peer, the first being its name.
#[derive(Debug)]
pub(crate) struct Rails {
    addrs: Vec<SocketAddr>,
    /// When each rail last failed, `None` while it works.
    failed: Mutex<Vec<Option<Instant>>>,
    next: AtomicUsize,
}

impl Rails {
    /// `addrs[0]` names the peer; duplicates are dropped and at most [`MAX_RAILS`] kept.
    pub(crate) fn new(addrs: &[SocketAddr]) -> Rails {
        let mut unique: Vec<SocketAddr> = Vec::with_capacity(addrs.len().min(MAX_RAILS));
        for a in addrs {
            if !unique.contains(a) && unique.len() < MAX_RAILS {
                unique.push(*a);
            }
        }
        let failed = Mutex::new(vec![None; unique.len()]);
        Rails {
            addrs: unique,
            failed,
            next: AtomicUsize::new(0),
        }
    }

    pub(crate) fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The rails to try for one call, in order: those working, taken in turn from call to
    /// call (spreading the load), then those that failed, the longest ago first.
    pub(crate) fn order(&self, now: Instant) -> Vec<SocketAddr> {
        let failed = self.failed.lock();
        let n = self.addrs.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let mut good = vec![];
        let mut bad = vec![];
        for k in 0..n {
            let i = (start + k) % n;
            match failed[i] {
                Some(at) if now.duration_since(at) < RAIL_RETRY => bad.push((at, self.addrs[i])),
                _ => good.push(self.addrs[i]),
            }
        }
        bad.sort_by_key(|(at, _)| *at);
        good.extend(bad.into_iter().map(|(_, a)| a));
        good
    }

    /// Sets `addr` aside: it did not connect, did not answer, or dropped a call.
    pub(crate) fn failed(&self, addr: SocketAddr, now: Instant) -> bool {
        let Some(i) = self.addrs.iter().position(|a| *a == addr) else {
            return false;
        };
        let mut failed = self.failed.lock();
        let first = failed[i].is_none();
        failed[i] = Some(now);
        first
    }

    /// `addr` answered: it takes calls again. Whether it had been set aside.
    pub(crate) fn worked(&self, addr: SocketAddr) -> bool {
        let Some(i) = self.addrs.iter().position(|a| *a == addr) else {
            return false;
        };
        let mut failed = self.failed.lock();
        failed[i].take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn working_rails_take_calls_in_turn_and_a_failed_one_waits() {
        let r = Rails::new(&[addr(1), addr(2), addr(2), addr(3)]);
        assert_eq!(r.addrs(), &[addr(1), addr(2), addr(3)]);
        let now = Instant::now();
        let firsts: Vec<_> = (0..6).map(|_| r.order(now)[0]).collect();
        assert_eq!(
            firsts,
            [addr(1), addr(2), addr(3), addr(1), addr(2), addr(3)]
        );
        assert!(r.failed(addr(2), now));
        assert!(!r.failed(addr(2), now), "already set aside");
        for _ in 0..6 {
            let order = r.order(now);
            assert_eq!(order.len(), 3);
            assert_eq!(order[2], addr(2), "a failed rail is tried last");
        }
        // After the retry time it takes calls again; and at once when it answers.
        assert_ne!(r.order(now + RAIL_RETRY)[2], addr(2));
        assert!(r.worked(addr(2)));
        assert!(!r.worked(addr(2)));
    }

    #[test]
    fn when_every_rail_failed_the_oldest_failure_goes_first() {
        let r = Rails::new(&[addr(1), addr(2)]);
        let now = Instant::now();
        r.failed(addr(2), now);
        r.failed(addr(1), now + Duration::from_millis(5));
        let later = now + Duration::from_millis(10);
        for _ in 0..4 {
            assert_eq!(r.order(later), [addr(2), addr(1)]);
        }
        assert!(!r.failed(addr(9), now), "not one of its rails");
    }

    #[test]
    fn rails_are_bounded() {
        let many: Vec<_> = (1..40).map(addr).collect();
        assert_eq!(Rails::new(&many).addrs().len(), MAX_RAILS);
    }
}
