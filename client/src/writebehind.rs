//! Write-behind as a plain state machine: when a write may be issued, which writes are in
//! flight, and the first failure not yet reported. No I/O, no runtime: the library's
//! [`crate::Writer`] and the mount's streams issue the writes and report their landings.
//!
//! A write is acknowledged once issued. At most `max` are in flight; a write overlapping one in
//! flight waits until everything in flight has landed, so that the later write always wins. The
//! first failure is kept and returned by the next call that asks (the next write, a flush, a
//! sync, close), as NFS reports an unstable write's failure.

use std::collections::VecDeque;

/// Most writes one stream keeps in flight.
pub const MAX_IN_FLIGHT: usize = 256;

#[derive(Debug)]
pub struct WriteBehind<E> {
    max: usize,
    /// Byte ranges in flight, in issue order.
    ranges: VecDeque<(u64, u64)>,
    error: Option<E>,
}

/// What must happen before a write may be issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// An earlier write failed: report it ([`WriteBehind::take_error`]) instead.
    Report,
    /// The write overlaps one in flight: wait for every write in flight.
    Drain,
    /// The window is full: wait for any one write to land.
    WaitOne,
    /// Issue it now.
    Issue,
}

impl<E> WriteBehind<E> {
    pub fn new(max: usize) -> WriteBehind<E> {
        WriteBehind {
            max: max.clamp(1, MAX_IN_FLIGHT),
            ranges: VecDeque::new(),
            error: None,
        }
    }

    /// What to do before issuing a write of `start..end`; ask again after doing it.
    pub fn before(&self, start: u64, end: u64) -> Step {
        if self.error.is_some() {
            Step::Report
        } else if self.overlaps(start, end) {
            Step::Drain
        } else if self.ranges.len() >= self.max {
            Step::WaitOne
        } else {
            Step::Issue
        }
    }

    /// Whether a write in flight overlaps `start..end` (a later write there must wait for it).
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.ranges.iter().any(|&(s, e)| s < end && start < e)
    }

    /// A write of `start..end` is on its way.
    pub fn issued(&mut self, start: u64, end: u64) {
        self.ranges.push_back((start, end));
    }

    /// The write of `start..end` landed, or failed.
    pub fn landed(&mut self, start: u64, end: u64, result: Result<(), E>) {
        if let Some(i) = self.ranges.iter().position(|&r| r == (start, end)) {
            self.ranges.remove(i);
        }
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
    }

    /// A write whose range is unknown failed (its task was lost).
    pub fn lost(&mut self, e: E) {
        self.error.get_or_insert(e);
    }

    /// Writes in flight.
    pub fn in_flight(&self) -> usize {
        self.ranges.len()
    }

    /// Forgets every range in flight (the caller has waited for all of them).
    pub fn drained(&mut self) {
        self.ranges.clear();
    }

    /// The first failure not yet reported.
    pub fn take_error(&mut self) -> Option<E> {
        self.error.take()
    }

    /// Whether a failure waits to be reported.
    pub fn has_error(&self) -> bool {
        self.error.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_issued_up_to_the_window_then_wait_for_one() {
        let mut w = WriteBehind::<&str>::new(2);
        assert_eq!(w.before(0, 10), Step::Issue);
        w.issued(0, 10);
        w.issued(10, 20);
        assert_eq!(w.before(20, 30), Step::WaitOne);
        w.landed(0, 10, Ok(()));
        assert_eq!(w.before(20, 30), Step::Issue);
    }

    #[test]
    fn an_overlapping_write_waits_for_everything_in_flight() {
        let mut w = WriteBehind::<&str>::new(8);
        w.issued(0, 10);
        assert_eq!(w.before(5, 6), Step::Drain);
        assert_eq!(w.before(10, 11), Step::Issue, "touching is not overlapping");
        w.drained();
        assert_eq!(w.before(5, 6), Step::Issue);
    }

    #[test]
    fn the_first_failure_is_reported_once_by_the_next_caller() {
        let mut w = WriteBehind::new(4);
        w.issued(0, 10);
        w.issued(10, 20);
        w.landed(10, 20, Err("first"));
        w.landed(0, 10, Err("second"));
        assert_eq!(w.before(20, 30), Step::Report);
        assert_eq!(w.take_error(), Some("first"));
        assert_eq!(w.take_error(), None);
        assert_eq!(w.before(20, 30), Step::Issue);
    }
}
