//! A client's write order: every write gets a rising xid and the oldest xid still in flight,
//! taken together under one lock in the order the writes are asked for, so a server that has
//! seen a write naming oldest `n` may refuse anything below `n` as abandoned. A write that
//! overlaps an earlier one still in flight to the same object must wait for it (see
//! [`WriteOrder::blocked`]), so a server never sees two live writes out of order.

use std::collections::BTreeMap;

use crate::shim::{lock, Mutex};

/// A write's place in the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub xid: u64,
    /// The oldest xid in flight when this one was taken (itself, if none older).
    pub oldest: u64,
}

struct State<K> {
    next: u64,
    in_flight: BTreeMap<u64, (K, u64, u64)>,
}

/// Writes in flight, by xid, each with its object `K` and byte range.
pub struct WriteOrder<K> {
    state: Mutex<State<K>>,
}

impl<K: Copy + Eq> Default for WriteOrder<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Copy + Eq> WriteOrder<K> {
    pub fn new() -> WriteOrder<K> {
        WriteOrder {
            state: Mutex::new(State {
                next: 1,
                in_flight: BTreeMap::new(),
            }),
        }
    }

    /// Takes the next place for a write of `start..end` of `object`; it is in flight until
    /// [`WriteOrder::end`].
    pub fn begin(&self, object: K, start: u64, end: u64) -> Place {
        let mut s = lock(&self.state);
        let xid = s.next;
        s.next += 1;
        s.in_flight.insert(xid, (object, start, end));
        let oldest = s.in_flight.keys().next().copied().unwrap_or(xid);
        Place { xid, oldest }
    }

    /// Whether an earlier write overlapping write `xid` is still in flight to its object.
    pub fn blocked(&self, xid: u64) -> bool {
        let s = lock(&self.state);
        let Some(&(object, start, end)) = s.in_flight.get(&xid) else {
            return false;
        };
        s.in_flight
            .range(..xid)
            .any(|(_, &(o, b, e))| o == object && b < end && start < e)
    }

    /// Write `xid` was answered or abandoned.
    pub fn end(&self, xid: u64) {
        lock(&self.state).in_flight.remove(&xid);
    }

    /// Writes in flight.
    pub fn in_flight(&self) -> usize {
        lock(&self.state).in_flight.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_overlapping_write_is_blocked_until_the_earlier_one_ends() {
        let o = WriteOrder::new();
        let a = o.begin(1u32, 0, 100);
        let b = o.begin(1, 100, 200);
        let c = o.begin(2, 0, 100);
        let d = o.begin(1, 50, 60);
        assert_eq!(d.oldest, a.xid);
        assert!(!o.blocked(b.xid) && !o.blocked(c.xid));
        assert!(o.blocked(d.xid));
        o.end(a.xid);
        assert!(!o.blocked(d.xid));
        assert_eq!(o.begin(3, 0, 1).oldest, b.xid);
    }
}
