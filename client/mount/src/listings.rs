//! Directory listings read for the kernel where it opens directories without asking the
//! daemon (the kernel checks permissions itself, `default_permissions`): a listing read over
//! several requests goes on in the one its first request read. Each listing read from its
//! start is kept under a number, and the offset the kernel gets back with each entry names
//! the listing and the entry (`(number << 32) | (index + 1)`), so a read that goes on from an
//! offset continues in the same listing whatever changed in the directory since, as a read
//! through one open handle does. The kernel keeps what it read in its own cache of the
//! directory, which the lease cache's drops and its own checks of the directory's mtime reset.
//!
//! At most [`MAX_KEPT`] listings of at most [`MAX_KEPT_ENTRIES`] entries together are kept;
//! the oldest go first. A read that goes on in a listing no longer kept reads the directory
//! again and goes on from the same index in it.
//!
//! A listing also answers lookups of its names for as long as the kernel would keep the
//! entries readdirplus gives it ([`crate::kernel::TTL`]), and only while nothing changed
//! through this mount and no lease was recalled since the listing was asked for: `find` over
//! a directory too long for the lease cache then stats the names it lists without a trip to
//! the MDS each, and sees what an `ls -l` (readdirplus) of the same moment would.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use fuser::Errno;
use parking_lot::Mutex;
use proto::md::{DirEntry, Inode};
use proto::Fid;

/// One entry of a listing, with its attributes where known.
pub(crate) type Entry = (DirEntry, Option<Inode>);

/// A directory's entries (`.` and `..` first), with their attributes where known, read page
/// by page: a reader is answered from the entries already there while the rest is on its
/// way, so the first entries of a long directory reach the kernel after one round trip to
/// the MDS, and the kernel and the MDS work side by side on the rest.
pub(crate) struct Listing {
    filled: Mutex<Filled>,
    grew: Notify,
}

struct Filled {
    entries: Vec<Entry>,
    /// Whether the entries past `.` and `..` are in order of their names.
    sorted: bool,
    /// How the reading ended, once it did.
    end: Option<Result<(), Errno>>,
}

impl Listing {
    /// A listing that goes on past `dots` (`.` and `..`) as [`Listing::push`] adds entries.
    pub(crate) fn begin(dots: [Entry; 2]) -> Arc<Listing> {
        Arc::new(Listing {
            filled: Mutex::new(Filled {
                entries: dots.into(),
                sorted: true,
                end: None,
            }),
            grew: Notify::new(),
        })
    }

    /// A listing read whole: `entries`, `.` and `..` first.
    #[cfg(test)]
    pub(crate) fn whole(entries: Vec<Entry>) -> Arc<Listing> {
        let l = Listing::begin([entries[0].clone(), entries[1].clone()]);
        l.push(entries.into_iter().skip(2));
        l.finish(Ok(()));
        l
    }

    /// Adds the entries of the next page.
    pub(crate) fn push(&self, page: impl IntoIterator<Item = Entry>) {
        let mut f = self.filled.lock();
        let from = f.entries.len();
        f.entries.extend(page);
        let Filled {
            entries, sorted, ..
        } = &mut *f;
        if *sorted {
            let start = from.max(3) - 1;
            *sorted = entries
                .get(start..)
                .is_none_or(|r| r.windows(2).all(|w| w[0].0.name < w[1].0.name));
        }
        drop(f);
        self.grew.notify_waiters();
    }

    /// The reading ended, whole (`Ok`) or with the error readers past its entries get.
    pub(crate) fn finish(&self, end: Result<(), Errno>) {
        self.filled.lock().end = Some(end);
        self.grew.notify_waiters();
    }

    /// Whether the reading ended without error.
    #[cfg(test)]
    fn is_whole(&self) -> bool {
        self.filled.lock().end == Some(Ok(()))
    }

    /// How many entries are there now.
    pub(crate) fn len(&self) -> usize {
        self.filled.lock().entries.len()
    }

    /// Once entry `from` is there or the reading ended, `read` of the entries from `from`
    /// on (none at the listing's end); the reading's error where it ended before `from`.
    pub(crate) async fn read_from<R>(
        &self,
        from: usize,
        read: impl FnOnce(&[Entry]) -> R,
    ) -> Result<R, Errno> {
        loop {
            // Made before the check, so that an entry pushed between is not missed.
            let grew = self.grew.notified();
            {
                let f = self.filled.lock();
                if let Some(there) = f.entries.get(from..).filter(|r| !r.is_empty()) {
                    return Ok(read(there));
                }
                match f.end {
                    Some(Ok(())) => return Ok(read(&[])),
                    Some(Err(e)) => return Err(e),
                    None => {}
                }
            }
            grew.await;
        }
    }

    /// The attributes of `name`, where the listing was read whole and its names are in
    /// order.
    fn find(&self, name: &[u8]) -> Option<Inode> {
        let f = self.filled.lock();
        if f.end != Some(Ok(())) || !f.sorted {
            return None;
        }
        let rest = f.entries.get(2..)?;
        let i = rest
            .binary_search_by(|(e, _)| e.name.as_slice().cmp(name))
            .ok()?;
        rest[i].1.clone()
    }
}

/// Most listings kept at once.
pub(crate) const MAX_KEPT: usize = 256;
/// Most entries over all the listings kept.
pub(crate) const MAX_KEPT_ENTRIES: usize = 1 << 20;
/// Listing numbers stay below this, so that every offset is a positive `loff_t`.
const MAX_ID: u32 = 0x7fff_ffff;

#[derive(Default)]
struct Kept {
    last: u32,
    by_id: HashMap<u32, (Fid, Arc<Listing>)>,
    /// Numbers, oldest first.
    order: VecDeque<u32>,
    /// Per directory, its newest listing that may answer lookups: its number, when it was
    /// asked for, and the changes and recalls counted then.
    fresh: HashMap<Fid, (u32, Instant, Since)>,
}

/// Where the counts of changes stood.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Since {
    changes: u64,
    recalls: u64,
}

pub(crate) struct Listings {
    kept: Mutex<Kept>,
    max_kept: usize,
    max_entries: usize,
    /// Moves on with every request through this mount that may change the namespace.
    changes: AtomicU64,
}

impl Default for Listings {
    fn default() -> Self {
        Listings::within(MAX_KEPT, MAX_KEPT_ENTRIES)
    }
}

impl Listings {
    /// Keeping at most `max_kept` listings of at most `max_entries` entries together.
    pub(crate) fn within(max_kept: usize, max_entries: usize) -> Listings {
        Listings {
            kept: Mutex::default(),
            max_kept,
            max_entries,
            changes: AtomicU64::new(0),
        }
    }

    /// A request that may change names or attributes came in.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The counts now, with the lease cache's `recalls`: taken before a listing is asked for.
    pub(crate) fn since(&self, recalls: u64) -> Since {
        Since {
            changes: self.changes.load(Ordering::SeqCst),
            recalls,
        }
    }

    /// Lets listing `id` of `dir`, asked for at `at` with the counts `since`, answer lookups
    /// once it is read whole (if its names after `.` and `..` are in order, as the MDS lists
    /// them).
    pub(crate) fn answer_from(&self, dir: Fid, id: u32, at: Instant, since: Since) {
        let mut k = self.kept.lock();
        if k.by_id.contains_key(&id) {
            k.fresh.insert(dir, (id, at, since));
        }
    }

    /// The attributes of `name` in `dir` from a listing that may answer lookups: asked for
    /// less than `within` ago, with the counts `now` unchanged since.
    pub(crate) fn entry(
        &self,
        dir: Fid,
        name: &[u8],
        within: Duration,
        now: Since,
    ) -> Option<Inode> {
        let k = self.kept.lock();
        let &(id, at, since) = k.fresh.get(&dir)?;
        if since != now || at.elapsed() >= within {
            return None;
        }
        let (_, l) = k.by_id.get(&id)?;
        l.find(name)
    }

    /// Keeps `listing` of `dir`; its number. Listings grow after they are kept (they are
    /// read page by page), so the entries kept are counted again at each keep.
    pub(crate) fn keep(&self, dir: Fid, listing: Arc<Listing>) -> u32 {
        let mut k = self.kept.lock();
        let mut entries: usize = k.by_id.values().map(|(_, l)| l.len()).sum();
        while !k.order.is_empty()
            && (k.order.len() >= self.max_kept || entries + listing.len() > self.max_entries)
        {
            if let Some(old) = k.order.pop_front() {
                if let Some((d, l)) = k.by_id.remove(&old) {
                    entries -= l.len().min(entries);
                    if k.fresh.get(&d).is_some_and(|f| f.0 == old) {
                        k.fresh.remove(&d);
                    }
                }
            }
        }
        k.last = if k.last >= MAX_ID { 1 } else { k.last + 1 };
        let id = k.last;
        k.order.push_back(id);
        k.by_id.insert(id, (dir, listing));
        id
    }

    /// Listing `id` of `dir`, while it is kept.
    pub(crate) fn get(&self, dir: Fid, id: u32) -> Option<Arc<Listing>> {
        let k = self.kept.lock();
        k.by_id
            .get(&id)
            .filter(|(d, _)| *d == dir)
            .map(|(_, l)| l.clone())
    }
}

/// The offset to continue after entry `index` of listing `id`.
pub(crate) fn cookie(id: u32, index: usize) -> u64 {
    (u64::from(id) << 32) | (index as u64 + 1).min(u64::from(u32::MAX))
}

/// Which listing an offset continues, and at which entry; `None` for the start.
pub(crate) fn resume(offset: u64) -> Option<(u32, usize)> {
    (offset != 0).then_some(((offset >> 32) as u32, (offset & 0xffff_ffff) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::md::Kind;

    fn dir(n: u32) -> Fid {
        Fid {
            seq: proto::fid::INODE_SEQ,
            oid: n,
            ver: 0,
        }
    }

    /// `.`, `..` and `n - 2` more entries.
    fn listing(n: usize) -> Arc<Listing> {
        Listing::whole(
            (0..n.max(2))
                .map(|i| {
                    (
                        DirEntry {
                            name: format!("f{i:06}").into_bytes(),
                            fid: dir(1000 + i as u32),
                            kind: Kind::File,
                        },
                        None,
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn an_offset_names_its_listing_and_the_entry_after_it() {
        assert_eq!(resume(0), None);
        for (id, i) in [(1, 0), (7, 41), (MAX_ID, 1 << 20)] {
            let c = cookie(id, i);
            assert!(c > 0 && c <= i64::MAX as u64, "a positive loff_t");
            assert_eq!(resume(c), Some((id, i + 1)));
        }
    }

    #[test]
    fn listings_are_kept_per_directory_within_their_bounds_oldest_going_first() {
        let l = Listings::within(16, 100);
        let a = l.keep(dir(1), listing(3));
        assert_eq!(l.get(dir(1), a).map(|x| x.len()), Some(3));
        assert!(l.get(dir(2), a).is_none(), "another directory's number");
        let mut ids = vec![a];
        for _ in 0..16 {
            ids.push(l.keep(dir(1), listing(2)));
        }
        assert!(l.get(dir(1), a).is_none(), "the oldest went first");
        assert!(l.get(dir(1), ids[1]).is_some());
        let big = l.keep(dir(3), listing(100));
        assert!(l.get(dir(3), big).is_some());
        assert!(
            l.get(dir(1), *ids.last().unwrap()).is_none(),
            "every other listing made room for it"
        );
        let mut ids = std::collections::HashSet::new();
        for _ in 0..1000 {
            assert!(
                ids.insert(l.keep(dir(4), listing(2))),
                "numbers do not repeat"
            );
        }
    }

    fn attrs(fid: Fid) -> Inode {
        Inode {
            fid,
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 3901,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            xattrs: Default::default(),
            layout: None,
            target: vec![],
        }
    }

    /// `.`, `..` and `names` in the order given, each with attributes.
    fn with_attrs(names: &[&str]) -> Arc<Listing> {
        let e = |n: &str, i: u32| {
            (
                DirEntry {
                    name: n.as_bytes().to_vec(),
                    fid: dir(1000 + i),
                    kind: Kind::File,
                },
                Some(attrs(dir(1000 + i))),
            )
        };
        Listing::whole(
            [".", ".."]
                .iter()
                .chain(names)
                .enumerate()
                .map(|(i, n)| e(n, i as u32))
                .collect(),
        )
    }

    #[test]
    fn a_fresh_listing_answers_lookups_until_anything_changes_or_it_ages() {
        let l = Listings::default();
        let d = dir(1);
        let since = l.since(5);
        let id = l.keep(d, with_attrs(&["a", "file.01", "file.02", "z"]));
        l.answer_from(d, id, Instant::now(), since);
        let ttl = Duration::from_secs(60);
        let got = l.entry(d, b"file.02", ttl, l.since(5)).expect("listed");
        assert_eq!(got.fid, dir(1004), "the entry of that name");
        assert_eq!(
            l.entry(d, b"file.03", ttl, l.since(5)),
            None,
            "absent: asked of the MDS"
        );
        assert_eq!(
            l.entry(dir(2), b"a", ttl, l.since(5)),
            None,
            "another directory"
        );
        assert_eq!(
            l.entry(d, b"a", ttl, l.since(6)),
            None,
            "a lease was recalled since"
        );
        assert_eq!(
            l.entry(d, b"a", Duration::ZERO, l.since(5)),
            None,
            "too old"
        );
        l.changed();
        assert_eq!(
            l.entry(d, b"a", ttl, l.since(5)),
            None,
            "a change through the mount"
        );
        // A listing out of order never answers.
        let id = l.keep(d, with_attrs(&["b", "a"]));
        l.answer_from(d, id, Instant::now(), l.since(5));
        assert_eq!(l.entry(d, b"a", ttl, l.since(5)), None);
    }

    #[tokio::test]
    async fn readers_are_answered_from_the_entries_there_and_wait_for_the_rest() {
        let whole = with_attrs(&["a", "b", "c", "d"]);
        let all: Vec<Entry> = whole.read_from(0, |e| e.to_vec()).await.unwrap();
        let l = Listing::begin([all[0].clone(), all[1].clone()]);
        l.push(all[2..4].iter().cloned());
        let names = |e: &[Entry]| e.iter().map(|(e, _)| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            l.read_from(1, names).await.unwrap(),
            vec![b"..".to_vec(), b"a".to_vec(), b"b".to_vec()],
            "what is there is answered at once"
        );
        // A reader past the entries waits for the next page.
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.read_from(4, names).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "nothing past entry 4 yet");
        l.push(all[4..].iter().cloned());
        assert_eq!(
            waiting.await.unwrap().unwrap(),
            vec![b"c".to_vec(), b"d".to_vec()]
        );
        // A lookup is answered only from a listing read whole.
        let kept = Listings::default();
        let id = kept.keep(dir(1), l.clone());
        kept.answer_from(dir(1), id, Instant::now(), kept.since(0));
        let ttl = Duration::from_secs(60);
        assert_eq!(
            kept.entry(dir(1), b"c", ttl, kept.since(0)),
            None,
            "not yet whole"
        );
        l.finish(Ok(()));
        assert!(kept.entry(dir(1), b"c", ttl, kept.since(0)).is_some());
        assert_eq!(
            l.read_from(6, names).await.unwrap(),
            Vec::<Vec<u8>>::new(),
            "past the end: no entries"
        );
    }

    #[tokio::test]
    async fn a_listing_that_fails_part_way_fails_only_the_readers_past_its_entries() {
        let all: Vec<Entry> = with_attrs(&["b", "a", "c"])
            .read_from(0, |e| e.to_vec())
            .await
            .unwrap();
        let l = Listing::begin([all[0].clone(), all[1].clone()]);
        l.push(all[2..4].iter().cloned());
        l.finish(Err(Errno::EIO));
        assert_eq!(l.read_from(3, |e| e.len()).await, Ok(1));
        assert_eq!(l.read_from(4, |e| e.len()).await, Err(Errno::EIO));
        assert!(!l.is_whole());
        // Names out of order across pages are seen as such.
        let o = Listing::begin([all[0].clone(), all[1].clone()]);
        o.push([all[2].clone()]);
        o.push([all[3].clone()]);
        o.finish(Ok(()));
        assert_eq!(o.find(b"a"), None, "b then a: never answers");
    }
}
