//! When the kernel may keep a file's cached pages across an open (`FOPEN_KEEP_CACHE`).
//!
//! Close-to-open: an open must see what any client wrote before its close. Another client's
//! close after writing publishes the size and mtime at the MDS, which first recalls every
//! other client's lease on the file. So the pages this mount cached stay the file's bytes as
//! long as its lease on the file is held without a break: an open that finds the lease held
//! since the pages were read keeps them, and saves reading them again (from a storage server,
//! whose data files bypass its page cache).
//!
//! The pages are known fresh from an open that dropped them (one without `FOPEN_KEEP_CACHE`,
//! the kernel drops them before the open returns) made while the lease was held; they are
//! trusted from that handle's release on, and no longer from the moment the lease is dropped
//! (the drop is heard before a recall is acknowledged).
//!
//! The kernel does not drop a file's pages itself when its mtime moves (no
//! `FUSE_AUTO_INVAL_DATA`): it would drop the pages this mount's own writes left, at the
//! first stat after their close. Pages are dropped instead when the lease on the file is,
//! and when attributes read without a lease show a size or mtime other than those the kernel
//! was given last.
//!
//! A small file made here keeps a copy of its bytes in this mount, as its writes came in
//! ([`Written`]): the kernel keeps no page a write covered only in part (without the write-back
//! cache), so the first read of a small file written in one go would otherwise go to a
//! storage server. That copy answers reads on the same terms as kept pages: while the file is
//! trusted and its lease held.

use std::collections::HashSet;

use parking_lot::Mutex;
use proto::Fid;

#[derive(Default)]
pub(crate) struct PageTrust {
    sets: Mutex<Sets>,
}

#[derive(Default)]
struct Sets {
    /// Opened with their pages dropped, under a lease held since.
    fresh: HashSet<Fid>,
    /// Pages the next open may keep.
    trusted: HashSet<Fid>,
    /// Created ahead here, with no pages but those its creating handle's writes left:
    /// `None` while that handle is open, then what tells whether another client can have
    /// changed the file since (see [`PageTrust::resolve_made`]).
    made: std::collections::HashMap<Fid, Option<Made>>,
    /// The attributes the kernel was last given from the lease cache (size, mtime, ctime),
    /// under a lease held since.
    given: std::collections::HashMap<Fid, Given>,
    /// The size and mtime the kernel was last given without a lease.
    shown: std::collections::HashMap<Fid, (u64, proto::md::Time)>,
    /// Copies of small files made here.
    written: Written,
}

/// The bytes of small files made through this mount, as its writes left them: every write to
/// such a file through this mount lands in its copy before it is acknowledged, and anything
/// else that changes its bytes (a size change, an append placed here, a range copied or
/// allocated into it) drops the copy. A copy answers reads only once vouched for: its file's
/// create was answered with the lease and nothing was recalled since ([`PageTrust::resolve_made`]),
/// so no other client can have written to the file unseen; a copy that cannot be vouched for
/// is dropped. A file grown past [`WRITTEN_FILE`] loses its copy; once [`WRITTEN_BUDGET`] bytes
/// are held, new files get none (a copy held is freed when a read has reached its end, since
/// the kernel's pages then hold it, or when its trust ends).
#[derive(Default)]
struct Written {
    /// Each copy, and whether it is vouched for.
    of: std::collections::HashMap<Fid, (Vec<u8>, bool)>,
    bytes: usize,
}

/// Largest file whose bytes are copied.
pub(crate) const WRITTEN_FILE: usize = 64 << 10;
/// Most bytes held in copies.
pub(crate) const WRITTEN_BUDGET: usize = 128 << 20;

impl Written {
    fn start(&mut self, fid: Fid) {
        if self.bytes < WRITTEN_BUDGET {
            self.forget(fid);
            self.of.insert(fid, (Vec::new(), false));
        }
    }

    fn forget(&mut self, fid: Fid) {
        if let Some((b, _)) = self.of.remove(&fid) {
            self.bytes -= b.len();
        }
    }

    fn vouch(&mut self, fid: Fid) {
        if let Some((_, v)) = self.of.get_mut(&fid) {
            *v = true;
        }
    }

    /// Drops every copy not vouched for (their creates' answers are forgotten).
    fn forget_unvouched(&mut self) {
        let mut freed = 0;
        self.of.retain(|_, (b, vouched)| {
            if !*vouched {
                freed += b.len();
            }
            *vouched
        });
        self.bytes -= freed;
    }

    fn wrote(&mut self, fid: Fid, offset: u64, data: &[u8]) {
        let Some((b, _)) = self.of.get_mut(&fid) else {
            return;
        };
        let end = offset.saturating_add(data.len() as u64);
        if end > WRITTEN_FILE as u64 || self.bytes >= WRITTEN_BUDGET && end > b.len() as u64 {
            self.forget(fid);
            return;
        }
        let (offset, end) = (offset as usize, end as usize);
        if end > b.len() {
            // A write past the end leaves zeros between, as the file reads.
            self.bytes += end - b.len();
            b.resize(end, 0);
        }
        b[offset..end].copy_from_slice(data);
    }

    /// Up to `size` bytes at `offset`; frees the copy once a read returns its last byte.
    fn read(&mut self, fid: Fid, offset: u64, size: usize) -> Option<Vec<u8>> {
        let (b, true) = self.of.get(&fid)? else {
            return None;
        };
        let start = (offset.min(b.len() as u64)) as usize;
        let end = start.saturating_add(size).min(b.len());
        let out = b[start..end].to_vec();
        if start < end && end == b.len() {
            self.forget(fid);
        }
        Some(out)
    }
}

/// What of a file's attributes an open compares: what close-to-open may have moved.
type Given = (u64, proto::md::Time, proto::md::Time);

/// Most files whose attributes given to the kernel are remembered.
const MAX_GIVEN: usize = 1 << 20;

/// Most files created here remembered until their next open.
const MAX_MADE: usize = 1 << 16;

/// A create answered ahead: its answer to come, and the client's count of lease recalls and
/// losses when it was made ([`client::File::create_check`]).
pub(crate) type Made = (client::pending::Sent, u64);

fn given(i: &proto::md::Inode) -> Given {
    (i.size, i.mtime, i.ctime)
}

impl PageTrust {
    /// Whether an open of `fid` may keep its pages; `leased`: the lease on it is held now.
    pub(crate) fn keep(&self, fid: Fid, leased: bool) -> bool {
        leased && self.sets.lock().trusted.contains(&fid)
    }

    /// An open of `fid` that dropped its pages, with the lease held (`leased`) when it was
    /// answered.
    pub(crate) fn opened(&self, fid: Fid, leased: bool) {
        if leased {
            self.sets.lock().fresh.insert(fid);
        }
    }

    /// A handle of `fid` released; `leased`: the lease is held now (checked before this call,
    /// so a drop between the two is seen by [`PageTrust::dropped`] first).
    pub(crate) fn released(&self, fid: Fid, leased: bool) {
        let mut s = self.sets.lock();
        if s.fresh.remove(&fid) && leased {
            s.trusted.insert(fid);
        }
    }

    /// `fid` created ahead through this mount: the kernel has no pages of it, and this mount
    /// copies its bytes as they are written (while it has room).
    pub(crate) fn created(&self, fid: Fid) {
        let mut s = self.sets.lock();
        if s.made.len() >= MAX_MADE {
            s.made.clear();
            s.written.forget_unvouched();
        }
        s.made.insert(fid, None);
        s.written.start(fid);
    }

    /// A write of `data` at `offset` to `fid` through this mount, before it is acknowledged.
    pub(crate) fn wrote(&self, fid: Fid, offset: u64, data: &[u8]) {
        self.sets.lock().written.wrote(fid, offset, data);
    }

    /// `fid`'s bytes changed other than by a write placed here: its copy is dropped.
    pub(crate) fn changed(&self, fid: Fid) {
        self.sets.lock().written.forget(fid);
    }

    /// A read of `fid` answered from this mount's copy of its bytes, when it has one and the
    /// file is trusted as for [`PageTrust::keep`] (`leased`: the lease on it is held now).
    pub(crate) fn read_copy(
        &self,
        fid: Fid,
        leased: bool,
        offset: u64,
        size: usize,
    ) -> Option<Vec<u8>> {
        let mut s = self.sets.lock();
        if !leased || !s.trusted.contains(&fid) {
            return None;
        }
        s.written.read(fid, offset, size)
    }

    /// The handle that created `fid` ahead released, its writes landed: the pages they left
    /// are the file's if no other client can have changed it, which `check` tells once the
    /// create is answered.
    pub(crate) fn released_created(&self, fid: Fid, check: Made) {
        if let Some(slot) = self.sets.lock().made.get_mut(&fid) {
            *slot = Some(check);
        }
    }

    /// Before an open of `fid` asks whether it may keep the pages: a file created here whose
    /// creating handle released, and whose create was answered, is trusted if the answer
    /// leased it to this client, whose count of lease recalls (`recalls`) has not moved since
    /// the create, and the lease is held now (`leased`, checked before this call, so a drop
    /// between the two is seen by [`PageTrust::dropped`] first).
    pub(crate) fn resolve_made(&self, fid: Fid, leased: bool, recalls: u64) {
        let mut s = self.sets.lock();
        let Some(Some((sent, at))) = s.made.get(&fid) else {
            return;
        };
        let Some(answer) = sent.now() else {
            return; // not known yet: the pages are not kept this time
        };
        let untouched = answer.is_ok_and(|r| r.leased) && recalls == *at;
        s.made.remove(&fid);
        if untouched && leased {
            s.trusted.insert(fid);
            s.written.vouch(fid);
        } else {
            // Another client may have written to it unseen: the copy may not be the file.
            s.written.forget(fid);
        }
    }

    /// The lease on `fid` was dropped, or writes through this mount failed to land: its pages
    /// are no longer known to be the file's.
    pub(crate) fn dropped(&self, fid: Fid) {
        let mut s = self.sets.lock();
        s.fresh.remove(&fid);
        s.made.remove(&fid);
        s.trusted.remove(&fid);
        s.given.remove(&fid);
        s.shown.remove(&fid);
        s.written.forget(fid);
    }

    /// The kernel was given `i`'s attributes from the lease cache; `still`: the lease has held
    /// since they were read (checked after the insert, so a drop in between is seen by
    /// [`PageTrust::dropped`] first, or by this check).
    pub(crate) fn gave(&self, i: &proto::md::Inode, still: impl Fn() -> bool) {
        let mut s = self.sets.lock();
        if s.given.len() >= MAX_GIVEN {
            s.given.clear();
        }
        s.given.insert(i.fid, given(i));
        drop(s);
        if !still() {
            self.sets.lock().given.remove(&i.fid);
        }
    }

    /// The kernel is given `i`'s attributes, read without a lease: whether its size or mtime
    /// moved from those it was given last (its cached pages may be older than the file).
    pub(crate) fn moved(&self, i: &proto::md::Inode) -> bool {
        if i.kind != proto::md::Kind::File {
            return false;
        }
        let mut s = self.sets.lock();
        let now = (i.size, i.mtime);
        let before = s
            .shown
            .get(&i.fid)
            .copied()
            .or_else(|| s.given.get(&i.fid).map(|g| (g.0, g.1)));
        if s.shown.len() >= MAX_GIVEN {
            s.shown.clear();
        }
        s.shown.insert(i.fid, now);
        before.is_some_and(|b| b != now)
    }

    /// Whether the kernel's attributes of a file are `now` (the lease cache's, the lease held
    /// since): an open need not drop them for close-to-open.
    pub(crate) fn current(&self, now: &proto::md::Inode) -> bool {
        self.sets.lock().given.get(&now.fid) == Some(&given(now))
    }
}

/// The parent of each directory this mount listed, kept while it holds the directory's lease
/// (moving the directory elsewhere changes it, and recalls the lease first; a move through
/// this mount forgets them all): `..` in a listing without asking the MDS.
#[derive(Default)]
pub(crate) struct Parents {
    of: Mutex<std::collections::HashMap<Fid, Fid>>,
}

impl Parents {
    pub(crate) fn get(&self, dir: Fid, leased: bool) -> Option<Fid> {
        self.of.lock().get(&dir).copied().filter(|_| leased)
    }

    /// `parent` was found as `dir`'s `..` while its lease was held; `still`: it is held now
    /// (checked after the insert, so a drop in between is seen by [`Parents::dropped`] first,
    /// or by this check).
    pub(crate) fn learn(&self, dir: Fid, parent: Fid, still: impl Fn() -> bool) {
        self.of.lock().insert(dir, parent);
        if !still() {
            self.of.lock().remove(&dir);
        }
    }

    pub(crate) fn dropped(&self, dir: Fid) {
        self.of.lock().remove(&dir);
    }

    /// A directory moved through this mount.
    pub(crate) fn forget_all(&self) {
        self.of.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fid(n: u32) -> Fid {
        Fid::new(proto::fid::INODE_SEQ, n, 0)
    }

    #[test]
    fn pages_are_kept_only_after_a_release_under_a_lease_held_throughout() {
        let t = PageTrust::default();
        assert!(!t.keep(fid(1), true), "nothing is trusted before an open");
        t.opened(fid(1), true);
        assert!(!t.keep(fid(1), true), "not before the handle is released");
        t.released(fid(1), true);
        assert!(t.keep(fid(1), true));
        assert!(!t.keep(fid(1), false), "not without the lease now");

        // A drop while open, or after the release, ends the trust.
        t.opened(fid(2), true);
        t.dropped(fid(2));
        t.released(fid(2), true);
        assert!(!t.keep(fid(2), true));
        t.dropped(fid(1));
        assert!(!t.keep(fid(1), true));

        // An open without the lease, or a release without it, trusts nothing.
        t.opened(fid(3), false);
        t.released(fid(3), true);
        assert!(!t.keep(fid(3), true));
        t.opened(fid(4), true);
        t.released(fid(4), false);
        assert!(!t.keep(fid(4), true));
    }

    /// Trusts `fid` as an open under its lease does, and vouches for its copy as a create
    /// answered with the lease, nothing recalled since, does ([`PageTrust::resolve_made`]).
    fn trust(t: &PageTrust, fid: Fid) {
        t.opened(fid, true);
        t.released(fid, true);
        t.sets.lock().written.vouch(fid);
    }

    #[test]
    fn a_copy_of_a_file_made_here_answers_reads_only_while_trusted_and_follows_its_writes() {
        let t = PageTrust::default();
        t.created(fid(1));
        t.wrote(fid(1), 0, b"hello world");
        t.wrote(fid(1), 6, b"XY");
        assert_eq!(t.read_copy(fid(1), true, 0, 100), None, "not trusted yet");
        // Pages trusted by an open under the lease: not the copy, which nothing vouched for
        // (another client may have written before this one held the lease).
        t.opened(fid(1), true);
        t.released(fid(1), true);
        assert_eq!(t.read_copy(fid(1), true, 0, 100), None, "not vouched for");
        trust(&t, fid(1));
        assert_eq!(
            t.read_copy(fid(1), false, 0, 100),
            None,
            "not without the lease"
        );
        assert_eq!(
            t.read_copy(fid(1), true, 2, 3).as_deref(),
            Some(&b"llo"[..])
        );
        assert_eq!(t.read_copy(fid(1), true, 20, 3).as_deref(), Some(&b""[..]));
        // A read to the end frees the copy: the kernel's pages hold the bytes from then on.
        assert_eq!(
            t.read_copy(fid(1), true, 0, 100).as_deref(),
            Some(&b"hello XYrld"[..])
        );
        assert_eq!(t.read_copy(fid(1), true, 0, 100), None);
        assert_eq!(t.sets.lock().written.bytes, 0);

        // A write past the end leaves zeros; a size change, an append or a drop ends the copy.
        t.created(fid(2));
        t.wrote(fid(2), 3, b"z");
        trust(&t, fid(2));
        assert_eq!(
            t.read_copy(fid(2), true, 0, 2).as_deref(),
            Some(&[0u8, 0][..])
        );
        t.changed(fid(2));
        assert_eq!(t.read_copy(fid(2), true, 0, 4), None);
        t.created(fid(3));
        trust(&t, fid(3));
        t.dropped(fid(3));
        trust(&t, fid(3));
        assert_eq!(
            t.read_copy(fid(3), true, 0, 4),
            None,
            "a drop ends it for good"
        );
        t.wrote(fid(3), 0, b"late");
        assert_eq!(t.read_copy(fid(3), true, 0, 4), None);

        // A file grown past the limit loses its copy; writes to files with none are ignored.
        t.created(fid(4));
        t.wrote(fid(4), 0, &vec![1; WRITTEN_FILE]);
        assert_eq!(t.sets.lock().written.bytes, WRITTEN_FILE);
        t.wrote(fid(4), WRITTEN_FILE as u64, b"!");
        assert_eq!(t.sets.lock().written.bytes, 0);
        trust(&t, fid(4));
        assert_eq!(t.read_copy(fid(4), true, 0, 4), None);
    }

    #[test]
    fn copies_no_create_answer_can_vouch_for_any_longer_are_dropped() {
        let t = PageTrust::default();
        t.created(fid(1));
        t.wrote(fid(1), 0, b"kept");
        trust(&t, fid(1));
        t.created(fid(2));
        t.wrote(fid(2), 0, b"gone");
        // The files made here and not opened since overflow what is remembered of them.
        for n in 3..MAX_MADE as u32 + 4 {
            t.created(fid(n));
        }
        trust(&t, fid(2));
        assert_eq!(t.read_copy(fid(2), true, 0, 4), None);
        assert_eq!(
            t.read_copy(fid(1), true, 0, 4).as_deref(),
            Some(&b"kept"[..])
        );
    }

    #[test]
    fn copies_stop_at_their_budget() {
        let t = PageTrust::default();
        let per = WRITTEN_FILE;
        let fit = WRITTEN_BUDGET / per;
        for n in 0..fit as u32 + 2 {
            t.created(fid(n));
            t.wrote(fid(n), 0, &vec![7; per]);
        }
        let s = t.sets.lock();
        assert_eq!(s.written.bytes, WRITTEN_BUDGET);
        assert_eq!(
            s.written.of.len(),
            fit,
            "no copy begun once the budget is held"
        );
    }

    #[test]
    fn the_kernels_attributes_are_current_while_they_are_the_lease_caches_and_it_held() {
        let t = PageTrust::default();
        use proto::md::{Inode, Kind, Time};
        let i = Inode {
            fid: fid(1),
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 10,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            xattrs: Default::default(),
            layout: None,
            target: vec![],
        };
        assert!(!t.current(&i), "nothing given yet");
        // Attributes read without a lease: the first sight moves nothing; a size or mtime
        // other than the last shown does, once.
        assert!(!t.moved(&i));
        assert!(!t.moved(&i));
        let later = Inode {
            mtime: Time { sec: 5, nsec: 0 },
            ..i.clone()
        };
        assert!(t.moved(&later));
        assert!(!t.moved(&later));
        assert!(t.moved(&Inode {
            size: 12,
            ..later.clone()
        }));
        assert!(
            !t.moved(&Inode {
                kind: Kind::Dir,
                size: 1,
                ..i.clone()
            }),
            "a directory's listing is not a file's pages"
        );
        t.dropped(fid(1));
        t.gave(&i, || true);
        assert!(t.current(&i));
        // The cache moved on (a write published a new size): the kernel's copy is older.
        assert!(!t.current(&Inode {
            size: 11,
            ..i.clone()
        }));
        // The lease dropped: forgotten.
        t.dropped(fid(1));
        assert!(!t.current(&i));
        // Dropped while being given.
        t.gave(&i, || false);
        assert!(!t.current(&i));
    }
}
