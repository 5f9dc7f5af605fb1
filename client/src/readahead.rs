//! Readahead as a plain state machine: which chunks of a file to have on their way, decided
//! from the reads seen, with no I/O, no clock and no runtime. The library's [`crate::Reader`]
//! and the mount's streams drive it and carry out the reads it asks for.
//!
//! A read that starts where the last one ended extends a streak; after `trigger` such reads the
//! handle is a stream and the next `depth` chunks past the read are kept on their way. A read
//! that skips ahead by no more than its own length (and by less than half a chunk) counts as
//! sequential too: a strided reader, as Lustre's stride readahead finds. A read
//! inside the chunks already on their way stays in the stream (the kernel sends a stream's
//! readahead as several requests at once, which arrive in any order). Any other read (random
//! access) breaks the streak and drops what was ahead. A chunk that comes back
//! short marks the end of the file: nothing is issued past it.

use std::collections::VecDeque;

/// Most chunks one handle keeps on their way.
pub const MAX_DEPTH: usize = 64;

#[derive(Clone, Debug)]
pub struct Readahead {
    chunk: u64,
    depth: usize,
    trigger: u32,
    /// Where the next sequential read would start.
    next: u64,
    /// Sequential reads seen in a row.
    streak: u32,
    /// Starts of the chunks on their way or landed, in file order.
    ahead: VecDeque<u64>,
    /// Where the next chunk to issue starts.
    issued_to: u64,
    /// The end of the file, once a chunk came back short.
    eof: Option<u64>,
}

/// What a read is, for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Not part of a stream: read it directly.
    Direct,
    /// Part of a stream: served from the chunks ahead. `dropped` chunks (ahead of a stream that
    /// broke) are to be cancelled.
    Stream,
}

impl Readahead {
    /// `chunk` bytes per read issued, `depth` chunks ahead, a stream after `trigger` sequential
    /// reads (0: every read is part of one, as for a reader that only reads forward).
    pub fn new(chunk: u64, depth: usize, trigger: u32) -> Readahead {
        Readahead {
            chunk: chunk.max(1),
            depth: depth.clamp(1, MAX_DEPTH),
            trigger,
            next: 0,
            streak: 0,
            ahead: VecDeque::new(),
            issued_to: 0,
            eof: None,
        }
    }

    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// A read of `len` bytes at `offset`. Returns whether it is part of a stream and the starts
    /// of the chunks ahead that are no longer wanted.
    pub fn observe(&mut self, offset: u64, len: u64) -> (Access, Vec<u64>) {
        let mut dropped = vec![];
        // A stream's reads may arrive out of order (the kernel sends its readahead as several
        // requests at once): one inside what is already on its way stays in the stream.
        let span = self.chunk.saturating_mul(self.depth as u64);
        let in_window = self.streak >= self.trigger
            && !self.ahead.is_empty()
            && offset >= self.next.saturating_sub(span)
            && offset < self.issued_to.max(self.next);
        let end = offset.saturating_add(len);
        // A read that skips forward by no more than it reads, and by less than half a chunk,
        // is a strided stream (records of one writer among several interleaved in a shared
        // file, IOR's segments): read in whole chunks, it wastes at most half of each, and
        // takes one request per chunk instead of one per record.
        let skip = offset.saturating_sub(self.next);
        let strided = offset > self.next && skip <= len && skip < self.chunk / 2;
        if offset == self.next || strided || in_window {
            self.streak = self.streak.saturating_add(1);
            self.next = if in_window { self.next.max(end) } else { end };
        } else {
            self.streak = 0;
            dropped.extend(self.ahead.drain(..));
            self.eof = None;
            self.next = end;
        }
        if self.streak < self.trigger {
            return (Access::Direct, dropped);
        }
        // Chunks wholly behind the read are no longer wanted; a stream restarts at the read.
        while self
            .ahead
            .front()
            .is_some_and(|s| s.saturating_add(self.chunk) <= offset)
        {
            dropped.push(self.ahead.pop_front().expect("just looked"));
        }
        if self.ahead.is_empty() {
            self.issued_to = offset;
        }
        (Access::Stream, dropped)
    }

    /// Chunks to issue now, as (offset, length), to keep `depth` on their way.
    pub fn issue(&mut self) -> Vec<(u64, u64)> {
        self.issue_at_most(usize::MAX)
    }

    /// As [`Readahead::issue`], but at most `most` chunks (what a shared memory budget has
    /// left); the rest are asked for by a later call.
    pub fn issue_at_most(&mut self, most: usize) -> Vec<(u64, u64)> {
        let mut out = vec![];
        if self.streak < self.trigger {
            return out; // not a stream (yet)
        }
        while out.len() < most
            && self.ahead.len() < self.depth
            && self.eof.is_none_or(|e| self.issued_to < e)
        {
            out.push((self.issued_to, self.chunk));
            self.ahead.push_back(self.issued_to);
            self.issued_to += self.chunk;
        }
        out
    }

    /// The chunk at `start` came back with `got` bytes.
    pub fn landed(&mut self, start: u64, got: u64) {
        if got < self.chunk {
            let end = start + got;
            self.eof = Some(self.eof.map_or(end, |e| e.min(end)));
        }
    }

    /// The chunk at `start` has been consumed: it leaves the window.
    pub fn consumed(&mut self, start: u64) {
        if self.ahead.front() == Some(&start) {
            self.ahead.pop_front();
        }
    }

    /// Forgets everything ahead (the file changed); returns the chunks to cancel.
    pub fn reset(&mut self) -> Vec<u64> {
        self.streak = 0;
        self.eof = None;
        self.ahead.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn two_sequential_reads_make_a_stream_that_keeps_depth_chunks_ahead() {
        let mut r = Readahead::new(MIB, 4, 2);
        assert_eq!(r.observe(0, 128 << 10), (Access::Direct, vec![]));
        assert_eq!(r.observe(128 << 10, 128 << 10), (Access::Stream, vec![]));
        let issued = r.issue();
        assert_eq!(
            issued,
            vec![
                (128 << 10, MIB),
                (1152 << 10, MIB),
                (2176 << 10, MIB),
                (3200 << 10, MIB)
            ]
        );
        assert!(r.issue().is_empty(), "depth reached");
        r.consumed(128 << 10);
        assert_eq!(r.issue(), vec![(4224 << 10, MIB)]);
    }

    #[test]
    fn a_random_read_breaks_the_stream_and_drops_what_was_ahead() {
        let mut r = Readahead::new(MIB, 2, 2);
        r.observe(0, MIB);
        r.observe(MIB, MIB);
        assert_eq!(r.issue().len(), 2);
        let (access, dropped) = r.observe(100 * MIB, 4096);
        assert_eq!(access, Access::Direct);
        assert_eq!(dropped, vec![MIB, 2 * MIB]);
        assert!(r.issue().is_empty(), "random reads trigger nothing");
    }

    #[test]
    fn reads_of_a_stream_arriving_out_of_order_keep_it() {
        let mut r = Readahead::new(MIB, 4, 2);
        r.observe(0, MIB);
        r.observe(MIB, MIB);
        assert_eq!(r.issue().len(), 4);
        // The kernel's next three requests, the third first.
        assert_eq!(
            r.observe(3 * MIB, MIB),
            (Access::Stream, vec![MIB, 2 * MIB])
        );
        assert_eq!(r.observe(4 * MIB, MIB).0, Access::Stream);
        // The late one, whose chunk has gone: still the stream (its caller reads it
        // directly), and nothing ahead is dropped.
        assert_eq!(r.observe(2 * MIB, MIB), (Access::Stream, vec![]));
        // A read far from the stream breaks it.
        assert_eq!(r.observe(100 * MIB, MIB).0, Access::Direct);
    }

    #[test]
    fn reads_that_skip_as_much_as_they_read_are_a_strided_stream() {
        // One of two writers' records, interleaved: every other 47,008-byte record.
        const REC: u64 = 47_008;
        let mut r = Readahead::new(MIB, 4, 2);
        assert_eq!(r.observe(REC, REC).0, Access::Direct);
        assert_eq!(r.observe(3 * REC, REC).0, Access::Stream);
        assert_eq!(r.issue()[0], (3 * REC, MIB));
        for k in 2..40 {
            assert_eq!(
                r.observe((2 * k + 1) * REC, REC).0,
                Access::Stream,
                "record {k}"
            );
        }
        // A skip larger than the read is random access.
        let mut r = Readahead::new(MIB, 4, 2);
        r.observe(0, 4096);
        assert_eq!(r.observe(3 * 4096, 4096).0, Access::Direct);
        assert_eq!(r.observe(6 * 4096, 4096).0, Access::Direct);
        assert!(r.issue().is_empty());
    }

    #[test]
    fn nothing_is_issued_past_the_end_of_the_file() {
        let mut r = Readahead::new(MIB, 8, 0);
        assert_eq!(r.observe(0, MIB).0, Access::Stream);
        let issued = r.issue();
        assert_eq!(issued.len(), 8);
        r.landed(0, MIB);
        r.landed(MIB, MIB / 2);
        r.consumed(0);
        assert!(
            r.issue().is_empty(),
            "the file ends inside the second chunk"
        );
        assert_eq!(r.reset().len(), 7);
    }

    #[test]
    fn a_budget_holds_issues_back_until_chunks_are_consumed() {
        let mut r = Readahead::new(MIB, 8, 0);
        r.observe(0, MIB);
        assert_eq!(r.issue_at_most(2), vec![(0, MIB), (MIB, MIB)]);
        assert!(r.issue_at_most(0).is_empty());
        r.consumed(0);
        assert_eq!(r.issue_at_most(1), vec![(2 * MIB, MIB)]);
        assert_eq!(
            r.issue().len(),
            6,
            "the rest of the depth once the budget allows"
        );
    }

    #[test]
    fn a_reader_that_only_reads_forward_streams_from_its_first_read() {
        let mut r = Readahead::new(MIB, 3, 0);
        assert_eq!(r.observe(5 * MIB, MIB).0, Access::Stream);
        assert_eq!(r.issue()[0], (5 * MIB, MIB));
    }
}
