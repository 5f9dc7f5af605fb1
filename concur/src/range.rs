//! Range locks over a registered memory region: transfers lock the bytes they read or write,
//! readers share, a writer is alone. Revoking (the owner takes the memory back) refuses every
//! later lock, so once the region is idle after a revocation nothing can reach the memory.

use crate::shim::{lock, Mutex};

/// Why a range could not be locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// An overlapping range is held and one of the two writes.
    Conflict,
    /// As many ranges as allowed are held.
    Full,
    /// The region was revoked.
    Revoked,
}

struct Held {
    id: u64,
    start: u64,
    end: u64,
    write: bool,
}

struct State {
    held: Vec<Held>,
    next: u64,
    revoked: bool,
}

/// The ranges held in one region.
pub struct RangeLocks {
    state: Mutex<State>,
    max: usize,
}

impl RangeLocks {
    /// Locks over a region that holds at most `max` ranges at once.
    pub fn new(max: usize) -> RangeLocks {
        RangeLocks {
            state: Mutex::new(State {
                held: Vec::new(),
                next: 0,
                revoked: false,
            }),
            max,
        }
    }

    /// Locks `start..end` for reading, or for writing; returns the lock's id for
    /// [`RangeLocks::unlock`].
    pub fn lock(&self, start: u64, end: u64, write: bool) -> Result<u64, Refused> {
        let mut s = lock(&self.state);
        if s.revoked {
            return Err(Refused::Revoked);
        }
        if s.held
            .iter()
            .any(|h| (h.write || write) && h.start < end && start < h.end)
        {
            return Err(Refused::Conflict);
        }
        if s.held.len() >= self.max {
            return Err(Refused::Full);
        }
        let id = s.next;
        s.next += 1;
        s.held.push(Held {
            id,
            start,
            end,
            write,
        });
        Ok(id)
    }

    /// Releases the lock `id`; true if no range is held any more (wake whoever waits for it).
    pub fn unlock(&self, id: u64) -> bool {
        let mut s = lock(&self.state);
        s.held.retain(|h| h.id != id);
        s.held.is_empty()
    }

    /// Refuses every later lock; true if no range is held now.
    pub fn revoke(&self) -> bool {
        let mut s = lock(&self.state);
        s.revoked = true;
        s.held.is_empty()
    }

    /// Whether no range is held.
    pub fn is_idle(&self) -> bool {
        lock(&self.state).held.is_empty()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn readers_share_a_writer_is_alone_and_a_revoked_region_refuses() {
        let l = RangeLocks::new(4);
        let a = l.lock(0, 10, false).unwrap();
        let b = l.lock(5, 15, false).unwrap();
        assert_eq!(l.lock(8, 9, true), Err(Refused::Conflict));
        assert!(l.lock(10, 20, false).is_ok());
        assert!(!l.unlock(a));
        assert!(!l.revoke(), "b and the third are still held");
        assert_eq!(l.lock(30, 40, false), Err(Refused::Revoked));
        l.unlock(b);
        assert!(l.unlock(2));
        assert!(l.is_idle());
    }
}
