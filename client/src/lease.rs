//! What the client answers from its cache while it holds the MDS's leases.
//!
//! A lease on an inode is the MDS's promise to recall it before the inode's attributes or, for
//! a directory, its entries change. Under a lease the client keeps the inode's attributes and
//! the names it has seen in the directory (found or absent), and, once it has read a directory
//! whole, the complete listing, so that lookups (positive and negative), getattr and readdir
//! need no round trip. Permission checks made from the cache map the caller's identity as the
//! MDS does.
//!
//! Leases come over one channel, a wait the MDS holds open and answers with recalls: each is
//! applied (what was cached is dropped, and whoever registered [`Leases::on_drop`] is told, so
//! a mount drops the kernel's copy) before the next wait acknowledges it. Every lease lapses
//! [`LEASE_TERM_MS`] (less a margin) after the client sent the last wait that was answered, so
//! a client cut off from the MDS stops using its cache before the MDS stops waiting for it.
//!
//! An answer is cached only if no recall, and none of this client's own changes to the inodes
//! it tells of, came in while it was on its way ([`Stamp`]): a reply read before a change is
//! never kept after it, and one process's changes do not keep another's answers about other
//! inodes from the cache. The client's own changes update what it caches from their replies,
//! in transaction order.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use proto::md::{
    Creds, DirEntry, IdMap, Inode, Kind, MdsLeaseRecall, MdsReintReply, Mutation, LEASE_TERM_MS,
};
use proto::{Fid, FsErrorKind};
use tokio::time::Instant;

use crate::error::{ClientError, Result};

/// Most inodes whose leases a client keeps; past it the least recently used are given back.
pub const MAX_LEASES: usize = 262_144;
/// Largest directory read whole to answer negative lookups from its listing.
pub const MAX_LISTING: usize = proto::md::MAX_LEASED_LISTING;
/// Longest a recall's acknowledgement waits for whoever mirrors the cache (a mount: the
/// kernel) to drop its copy.
const BARRIER_WAIT: Duration = Duration::from_secs(1);
/// How long after the MDS refused to let a directory's lease be held alone it is asked again.
const ASK_ALONE_AGAIN: Duration = Duration::from_millis(50);
/// How long before the MDS's term the client stops trusting its leases (clocks drift).
const MARGIN: Duration = Duration::from_millis(LEASE_TERM_MS / 10);

/// A lease given up, for whoever mirrors the cache (the mount tells the kernel).
#[derive(Debug)]
pub struct Dropped {
    pub fid: Fid,
    /// The names of the directory `fid` that were cached (found or absent).
    pub names: Vec<Vec<u8>>,
}

pub(crate) type Hook = Arc<dyn Fn(Dropped) + Send + Sync>;
/// Resolves once what the hook was told so far has been carried out.
pub type Barrier = Arc<dyn Fn() -> tokio::sync::oneshot::Receiver<()> + Send + Sync>;

/// Where the caches stood when a request was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    recalls: u64,
    own: u64,
    retired: u64,
}

pub struct Leases {
    state: Mutex<State>,
    /// Moves on with every recall or loss of leases.
    recalls: AtomicU64,
    /// Moves on with every change of this client's own applied to the cache.
    own: AtomicU64,
    /// Moves on with every answered wait that retired cancels (leases given back).
    retired: AtomicU64,
    hook: OnceLock<Hook>,
    barrier: OnceLock<Barrier>,
    max: usize,
    /// Woken when leases to give back pile up faster than the held wait returns: the lease
    /// channel then sends them at once (the MDS counts them against this client until it
    /// hears, and refuses grants past its bound).
    give_back: std::sync::Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct State {
    /// Leases hold until then (none before the first answered wait).
    valid_until: Option<Instant>,
    epoch: u64,
    instance: u64,
    idmap: IdMap,
    /// The last recall applied.
    acked: u64,
    /// Boxed: the table is rehashed in place as leases come and go, and moving a pointer is
    /// cheaper than moving a cached inode.
    held: crate::FastMap<Fid, Box<Held>>,
    /// Leases to give back with the next waits (a set: a client past its bound may give back
    /// tens of thousands between two waits, and every answer checks its grants against it).
    cancel: crate::FastSet<Fid>,
    /// The number of the last wait sent ([`proto::md::MdsLeaseWait::nr`]).
    wait_nr: u64,
    /// Leases given back by waits not yet answered, with the wait's number: the MDS may take
    /// the cancel after it granted one of them again, so a grant of one is not kept until a
    /// wait as new is answered.
    /// Keyed by inode, with the last such wait's number (a later one only keeps it longer).
    cancelling: crate::FastMap<Fid, u64>,
    tick: u64,
    /// The number the last lease taken into the cache was given ([`Held::since`]).
    granted: u64,
    /// For each inode a change of this client's own touched, the count of own changes after
    /// it (see [`Leases::own`]): an answer about it sent before then is not kept.
    touched: crate::FastMap<Fid, u64>,
    /// No answer sent before this count of own changes is kept (a change whose inodes are not
    /// all known, or the table above grew too long and was cleared).
    touched_all: u64,
    /// For each inode whose lease this client gave back, the count of waits whose cancels the
    /// MDS had taken when it heard of it ([`Leases::retired`]): a grant of it in an answer
    /// sent before then may predate the cancel, and is not kept.
    given_back: crate::FastMap<Fid, u64>,
    /// No grant in an answer sent before this count is kept (the table above was cleared).
    given_back_all: u64,
    /// For each inode whose lease was dropped (recalled, lost, evicted, or a change to it
    /// failed), the count of recalls once it was ([`Leases::recalls`]): an answer about it
    /// sent before then may predate the recall, and is not kept. Answers about other inodes
    /// are: a recall of one inode says nothing of the rest, and dropping them too unsettled
    /// the whole cache (every batch on its way gave back what it touched, the directory held
    /// alone among it, each drop unsettling the next batch in turn).
    dropped: crate::FastMap<Fid, u64>,
    /// No answer sent before this count of recalls is kept (every lease was lost, or the
    /// table above grew too long and was cleared).
    dropped_all: u64,
}

/// Most inodes remembered as touched by own changes; past it the table is cleared and every
/// answer on its way is given up.
const MAX_TOUCHED: usize = 65_536;

#[derive(Default)]
struct Held {
    attr: Option<Inode>,
    /// The times, size and link count in `attr` moved on with a change of this client's own:
    /// it still serves permission checks, not getattr.
    stale: bool,
    /// `attr` came with a listing (readdirplus): without xattrs, layout or symlink target.
    /// It answers for the POSIX attributes (a mount's lookups and stats); whoever needs the
    /// rest asks the MDS, which replaces it with the whole inode.
    bare: bool,
    /// The transaction number of the change whose answer last brought `attr` (0: none).
    after: u64,
    names: BTreeMap<Vec<u8>, Name>,
    /// `names` holds every entry of the directory.
    complete: bool,
    /// A listing was asked for under this lease (it may have been too long to keep).
    listed: bool,
    /// The MDS lets this client hold the directory's lease alone (it recalls it before any
    /// other client reads the directory): changes there may be answered ahead.
    alone: bool,
    /// When the MDS last refused to let it hold the lease alone.
    refused: Option<Instant>,
    used: u64,
    /// Numbers this lease apart from an earlier one on the same inode, dropped since.
    since: u64,
}

#[derive(Clone, Copy)]
struct Name {
    entry: Option<(Fid, Kind)>,
    /// The transaction that set it (0: a lookup or a listing).
    transno: u64,
}

impl Default for Leases {
    fn default() -> Self {
        Leases::new(MAX_LEASES)
    }
}

/// Whether a name could be an entry, by the MDS's own rule ([`proto::rules::check_name`]):
/// only those are answered from the cache.
fn plain(name: &[u8]) -> bool {
    proto::rules::check_name(name).is_ok()
}

fn not_found(name: &[u8]) -> ClientError {
    ClientError::fs(
        FsErrorKind::NotFound,
        format!("no entry {:?}", String::from_utf8_lossy(name)),
    )
}

impl Leases {
    pub fn new(max: usize) -> Leases {
        Leases {
            state: Mutex::default(),
            recalls: AtomicU64::new(0),
            own: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            hook: OnceLock::new(),
            barrier: OnceLock::new(),
            max: max.max(16),
            give_back: Default::default(),
        }
    }

    /// Calls `f` for every lease dropped (recalled, lost, lapsed or given back).
    pub fn on_drop(&self, f: Hook) {
        let _ = self.hook.set(f);
    }

    /// A recall is acknowledged once `f`'s receiver resolves (or a short while has passed):
    /// a mount waits until the kernel has dropped its copy.
    pub fn on_barrier(&self, f: Barrier) {
        let _ = self.barrier.set(f);
    }

    /// Waits, briefly, until whoever mirrors the cache has dropped what the hook was told.
    pub async fn barrier(&self) {
        if let Some(b) = self.barrier.get() {
            let done = b();
            let _ = tokio::time::timeout(BARRIER_WAIT, done).await;
        }
    }

    /// How many recalls or losses of leases there have been.
    pub fn recalls(&self) -> u64 {
        self.recalls.load(Ordering::SeqCst)
    }

    pub fn stamp(&self) -> Stamp {
        Stamp {
            recalls: self.recalls.load(Ordering::SeqCst),
            own: self.own.load(Ordering::SeqCst),
            retired: self.retired.load(Ordering::SeqCst),
        }
    }

    /// Whether answers may be cached now: the channel is up and the leases hold.
    pub fn live(&self) -> bool {
        self.state
            .lock()
            .valid_until
            .is_some_and(|t| Instant::now() < t)
    }

    /// Leases held now.
    pub fn len(&self) -> usize {
        self.state.lock().held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The state, with every lease dropped first if they lapsed.
    fn live_state(&self) -> Option<parking_lot::MutexGuard<'_, State>> {
        let mut s = self.state.lock();
        match s.valid_until {
            Some(t) if Instant::now() < t => Some(s),
            Some(_) => {
                s.valid_until = None;
                self.drop_all(&mut s);
                None
            }
            None => None,
        }
    }

    /// The entry `name` of `parent` as cached, looked up as `creds`: `None` when the cache
    /// cannot tell.
    pub fn lookup(&self, parent: Fid, name: &[u8], creds: &Creds) -> Option<Result<Inode>> {
        self.lookup_with(parent, name, creds, false, &|_| false)
    }

    /// As [`Leases::lookup`]; with `walk`, for a path walk passing through: an entry whose
    /// times or size moved with this client's own change still serves (its kind, mode and
    /// owner are current).
    pub fn lookup_with(
        &self,
        parent: Fid,
        name: &[u8],
        creds: &Creds,
        walk: bool,
        striped: &dyn Fn(Fid) -> bool,
    ) -> Option<Result<Inode>> {
        if !plain(name) {
            return None;
        }
        let mut s = self.live_state()?;
        let s = &mut *s;
        s.tick += 1;
        let tick = s.tick;
        let who = s.idmap.map(creds.clone());
        let dir = s.held.get_mut(&parent)?;
        let attr = dir.attr.as_ref()?;
        if attr.kind != Kind::Dir {
            return None;
        }
        if !attr.permits(&who, 1) {
            return Some(Err(ClientError::fs(
                FsErrorKind::AccessDenied,
                format!("permission denied on {parent}"),
            )));
        }
        dir.used = tick;
        let entry = match dir.names.get(name) {
            Some(n) => n.entry,
            None if dir.complete => {
                // Kept, so that a kernel told of its absence hears when that changes.
                dir.names.insert(
                    name.to_vec(),
                    Name {
                        entry: None,
                        transno: 0,
                    },
                );
                None
            }
            None => return None,
        };
        let Some((fid, kind)) = entry else {
            return Some(Err(not_found(name)));
        };
        let elsewhere = proto::fid::mdt_of(fid) != proto::fid::mdt_of(parent);
        if walk && kind == Kind::Dir && (elsewhere || striped(fid)) {
            // A directory of another MDT, passed through: its FID is all the walk needs (its
            // MDT checks the search right on it at the next name), and its attributes are
            // never leased here.
            return Some(Ok(Inode::dir_known_by_fid(fid)));
        }
        let child = s.held.get_mut(&fid)?;
        child.used = tick;
        match &child.attr {
            Some(a) if child.bare && a.kind == Kind::Symlink => None,
            Some(a) if !child.stale || walk => Some(Ok(a.clone())),
            _ => None,
        }
    }

    /// Where the lease on directory `parent` is held but a lookup of `name` in it cannot be
    /// answered here: not listed whole (0), or listed whole with `name` one of its entries
    /// but the entry's attributes not cached (the number of names it holds).
    pub fn unlisted(&self, parent: Fid, name: &[u8]) -> Option<usize> {
        let s = self.live_state()?;
        let dir = s.held.get(&parent)?;
        if dir.attr.as_ref()?.kind != Kind::Dir {
            return None;
        }
        if !dir.complete {
            return Some(0);
        }
        let (fid, _) = dir.names.get(name)?.entry?;
        let cached = s
            .held
            .get(&fid)
            .is_some_and(|c| c.attr.is_some() && !c.stale);
        (!cached).then_some(dir.names.len())
    }

    /// An inode's attributes as cached, whole (xattrs, layout and target included).
    pub fn getattr(&self, fid: Fid) -> Option<Inode> {
        self.cached(fid, false)
    }

    /// An inode's POSIX attributes as cached: possibly without xattrs, layout or symlink
    /// target (those a listing brought), which a kernel's getattr does not need.
    pub fn getattr_posix(&self, fid: Fid) -> Option<Inode> {
        self.cached(fid, true)
    }

    /// Whether `fid`'s cached attributes came with a listing, without xattrs, layout or
    /// target.
    pub fn is_bare(&self, fid: Fid) -> bool {
        self.live_state()
            .is_some_and(|s| s.held.get(&fid).is_some_and(|h| h.bare))
    }

    fn cached(&self, fid: Fid, bare: bool) -> Option<Inode> {
        let mut s = self.live_state()?;
        s.tick += 1;
        let tick = s.tick;
        let h = s.held.get_mut(&fid)?;
        h.used = tick;
        h.attr.clone().filter(|_| !h.stale && (bare || !h.bare))
    }

    /// The attributes of directory `dir` as last learnt under its lease held now, even where
    /// this client's own changes in it made them stale (their kind, mode and owners stay: a
    /// setattr drops them).
    pub fn dir_attr_held(&self, dir: Fid) -> Option<Inode> {
        let s = self.live_state()?;
        s.held
            .get(&dir)?
            .attr
            .clone()
            .filter(|a| a.kind == Kind::Dir)
    }

    /// Whether `creds` may open `dir` to list it, where the cache can tell now: its lease held
    /// with attributes, even ones this client's own changes in it made stale (a kind never
    /// changes, and who may read it changes only by a setattr, which drops them).
    pub fn may_list(&self, dir: Fid, creds: &Creds) -> Option<Result<()>> {
        let s = self.live_state()?;
        let who = s.idmap.map(creds.clone());
        let attr = s.held.get(&dir)?.attr.as_ref()?;
        Some(if attr.kind != Kind::Dir {
            Err(ClientError::fs(
                FsErrorKind::NotDir,
                format!("{dir} is not a directory"),
            ))
        } else {
            may_read(attr, &who)
        })
    }

    /// Whether the directory `dir` is held with a listing the cache can answer readdir from.
    /// Returns the listing when `creds` may read it.
    pub fn listing(&self, dir: Fid, creds: &Creds, plus: bool) -> Option<Result<Listing>> {
        let mut s = self.live_state()?;
        let who = s.idmap.map(creds.clone());
        let h = s.held.get(&dir)?;
        let attr = h.attr.as_ref()?;
        if !h.complete || attr.kind != Kind::Dir {
            return None;
        }
        if let Err(e) = may_read(attr, &who) {
            return Some(Err(e));
        }
        let entries: Vec<DirEntry> = h
            .names
            .iter()
            .filter_map(|(n, e)| {
                e.entry.map(|(fid, kind)| DirEntry {
                    name: n.clone(),
                    fid,
                    kind,
                })
            })
            .collect();
        let mut attrs = vec![];
        if plus {
            attrs.reserve(entries.len());
            for e in &entries {
                let a = s.held.get(&e.fid)?;
                // The POSIX attributes, as the MDS's pages carry them: a copy of a file's
                // layout for each entry would cost more than the rest of the listing.
                attrs.push(a.attr.as_ref().filter(|_| !a.stale)?.bare());
            }
        }
        s.tick += 1;
        Some(Ok((entries, attrs)))
    }

    /// Whether `fid`'s attributes are cached (a mount gives the kernel a long timeout then).
    pub fn holds_attr(&self, fid: Fid) -> bool {
        self.live_state().is_some_and(|s| {
            s.held
                .get(&fid)
                .is_some_and(|h| h.attr.is_some() && !h.stale)
        })
    }

    /// Whether the lease on `fid`'s attributes is held, even if this client's own changes
    /// moved them since (another client's change would have recalled it).
    pub fn holds(&self, fid: Fid) -> bool {
        self.live_state()
            .is_some_and(|s| s.held.get(&fid).is_some_and(|h| h.attr.is_some()))
    }

    /// The lease on file `fid`'s attributes, held now with attributes no change of this
    /// client's own has moved: its number and the count of own changes so far, for
    /// [`Leases::unmoved`] to compare with later.
    pub fn mark(&self, fid: Fid) -> Option<(u64, u64)> {
        let s = self.live_state()?;
        let h = s.held.get(&fid)?;
        (h.attr.is_some() && !h.stale && !h.bare)
            .then(|| (h.since, self.own.load(Ordering::SeqCst)))
    }

    /// The attributes of `fid` if the lease [`Leases::mark`] gave `mark` for is still held
    /// and no change of this client's own has touched the inode since.
    pub fn unmoved(&self, fid: Fid, mark: (u64, u64)) -> Option<Inode> {
        let (since, own) = mark;
        let mut s = self.live_state()?;
        if own < s.touched_all || s.touched.get(&fid).is_some_and(|t| *t > own) {
            return None;
        }
        s.tick += 1;
        let tick = s.tick;
        let h = s.held.get_mut(&fid)?;
        if h.since != since || h.stale || h.bare {
            return None;
        }
        h.used = tick;
        h.attr.clone()
    }

    /// The inode the entry `name` of `parent` names, where the cache knows it (its attributes
    /// may not be cached).
    pub fn entry_fid(&self, parent: Fid, name: &[u8]) -> Option<Fid> {
        let s = self.live_state()?;
        s.held.get(&parent)?.names.get(name)?.entry.map(|(f, _)| f)
    }

    /// Whether the entry `name` of `parent` is cached, found or absent.
    pub fn holds_name(&self, parent: Fid, name: &[u8]) -> bool {
        self.live_state().is_some_and(|s| {
            s.held
                .get(&parent)
                .is_some_and(|h| h.names.contains_key(name))
        })
    }

    /// Whether the directory `dir` is held without its listing, and no listing was asked for
    /// under this lease yet; marks it asked for.
    pub fn wants_listing(&self, dir: Fid) -> bool {
        let Some(mut s) = self.live_state() else {
            return false;
        };
        match s.held.get_mut(&dir) {
            Some(h)
                if h.attr.as_ref().is_some_and(|a| a.kind == Kind::Dir)
                    && !h.complete
                    && !h.listed =>
            {
                h.listed = true;
                true
            }
            _ => false,
        }
    }

    /// Whether root on this node stays root at the MDS (as the MDS's identity map, last sent
    /// with the leases, says): its supplementary groups then decide nothing.
    pub fn root_stays_root(&self) -> bool {
        self.live_state().is_some_and(|s| {
            s.idmap
                .map(Creds {
                    uid: 0,
                    gid: 0,
                    groups: vec![],
                })
                .uid
                == 0
        })
    }

    /// Whether asking to hold `dir`'s lease alone is worth a round trip: it is held, not alone
    /// yet, and the MDS did not refuse a moment ago.
    pub fn may_ask_alone(&self, dir: Fid) -> bool {
        self.live_state().is_some_and(|s| {
            s.held.get(&dir).is_some_and(|h| {
                h.attr.as_ref().is_some_and(|a| a.kind == Kind::Dir)
                    && !h.alone
                    && h.refused.is_none_or(|t| t.elapsed() >= ASK_ALONE_AGAIN)
            })
        })
    }

    /// The MDS's answer to holding `dir`'s lease alone, asked when the recalls stood at
    /// `recalls` (a recall since may have taken the lease: the grant is then not kept).
    pub fn learn_alone(&self, recalls: u64, dir: Fid, granted: bool) {
        let Some(mut s) = self.live_state() else {
            return;
        };
        let same = self.recalls.load(Ordering::SeqCst) == recalls;
        if let Some(h) = s.held.get_mut(&dir) {
            if granted && same {
                h.alone = true;
            } else {
                h.refused = Some(Instant::now());
            }
        }
    }

    /// Whether `parent` is held but could not answer for `name`: worth reading whole.
    pub fn held_dir(&self, dir: Fid) -> bool {
        self.live_state()
            .is_some_and(|s| s.held.get(&dir).is_some_and(|h| h.attr.is_some()))
    }

    /// Takes `f` into the cache if nothing moved since `stamp`; otherwise gives back the
    /// leases the answer brought that the cache does not hold.
    fn learn(&self, stamp: Stamp, granted: &[Fid], about: &[Fid], f: impl FnOnce(&mut State)) {
        let Some(mut s) = self.live_state() else {
            return;
        };
        let given_back = granted.iter().any(|g| s.cancelling.contains_key(g));
        let moved = granted
            .iter()
            .chain(about)
            .any(|f| Self::dropped_since(&s, stamp, *f))
            || stamp.own < s.touched_all
            || granted
                .iter()
                .chain(about)
                .any(|f| s.touched.get(f).is_some_and(|t| *t > stamp.own))
            || granted
                .iter()
                .any(|g| Self::given_back_since(&s, stamp, *g));
        if moved || given_back {
            for g in granted {
                if !s.held.contains_key(g) {
                    s.cancel.insert(*g);
                }
            }
            return;
        }
        // Granted again before the wait giving them back was sent: they stay.
        for g in granted {
            s.cancel.remove(g);
        }
        s.tick += 1;
        f(&mut s);
        self.bound(&mut s);
    }

    fn held_mut(s: &mut State, fid: Fid) -> &mut Held {
        let tick = s.tick;
        let next = s.granted + 1;
        let h = s.held.entry(fid).or_insert_with(|| {
            Box::new(Held {
                since: next,
                ..Held::default()
            })
        });
        if h.since == next {
            s.granted = next;
        }
        h.used = tick;
        h
    }

    /// A lookup's answer, `leased` (the directory and the entry).
    pub fn learn_lookup(
        &self,
        stamp: Stamp,
        parent: Fid,
        name: &[u8],
        inode: &Inode,
        leased: bool,
    ) {
        if !leased {
            return;
        }
        self.learn(stamp, &[parent, inode.fid], &[], |s| {
            if plain(name) {
                Self::held_mut(s, parent).names.insert(
                    name.to_vec(),
                    Name {
                        entry: Some((inode.fid, inode.kind)),
                        transno: 0,
                    },
                );
            }
            let c = Self::held_mut(s, inode.fid);
            c.attr = Some(inode.clone());
            c.stale = false;
            c.bare = false;
        });
    }

    /// `name` in `parent`, which was held when the lookup was sent, is `dir`, a directory of
    /// another MDT, or a striped one (`striped`): its attributes are not leased here (or are
    /// recalled at every change in the shard it shares with its master), but its entry is
    /// `parent`'s, so a walk passing through takes its FID from the cache (and asks its MDT,
    /// or its shard, for the rest).
    pub fn learn_passing_dir(
        &self,
        stamp: Stamp,
        parent: Fid,
        name: &[u8],
        dir: &Inode,
        striped: bool,
    ) {
        let elsewhere = proto::fid::mdt_of(dir.fid) != proto::fid::mdt_of(parent);
        if dir.kind == Kind::Dir && (elsewhere || striped) {
            self.learn_entry(stamp, parent, name, Some((dir.fid, Kind::Dir)));
        }
    }

    /// `name` is not in `parent`, which was held when the lookup was sent.
    pub fn learn_absent(&self, stamp: Stamp, parent: Fid, name: &[u8]) {
        self.learn_entry(stamp, parent, name, None);
    }

    /// The entry `name` of `parent` (held when the lookup was sent) is `entry`, kept under
    /// `parent`'s lease alone.
    fn learn_entry(&self, stamp: Stamp, parent: Fid, name: &[u8], entry: Option<(Fid, Kind)>) {
        if !plain(name) {
            return;
        }
        self.learn(stamp, &[], &[parent], |s| {
            if let Some(h) = s.held.get_mut(&parent) {
                h.names.insert(name.to_vec(), Name { entry, transno: 0 });
            }
        });
    }

    /// A getattr's answer.
    pub fn learn_attr(&self, stamp: Stamp, inode: &Inode, leased: bool) {
        if !leased {
            return;
        }
        self.learn(stamp, &[inode.fid], &[], |s| {
            let h = Self::held_mut(s, inode.fid);
            h.attr = Some(inode.clone());
            h.stale = false;
            h.bare = false;
        });
    }

    /// Leases an answer granted that the cache does not take (a listing too long to keep):
    /// those not held are given back with the next wait.
    pub fn give_back(&self, fids: &[Fid]) {
        let Some(mut s) = self.live_state() else {
            return;
        };
        let mut any = false;
        for f in fids {
            if !s.held.contains_key(f) {
                any |= s.cancel.insert(*f);
            }
        }
        if any {
            self.give_back.notify_one();
        }
    }

    /// A directory read whole under its lease (with `attrs`, each entry's, leased too).
    pub fn learn_listing(&self, stamp: Stamp, dir: Fid, entries: &[DirEntry], attrs: &[Inode]) {
        if entries.len() > MAX_LISTING {
            return;
        }
        let mut granted = vec![dir];
        granted.extend(attrs.iter().map(|i| i.fid));
        self.learn(stamp, &granted, &[], |s| {
            let h = Self::held_mut(s, dir);
            // Absent names stay: the kernel may cache them.
            h.names.retain(|_, n| n.entry.is_none());
            for e in entries {
                h.names.insert(
                    e.name.clone(),
                    Name {
                        entry: Some((e.fid, e.kind)),
                        transno: 0,
                    },
                );
            }
            h.complete = true;
            for a in attrs {
                let c = Self::held_mut(s, a.fid);
                // Readdirplus leaves out xattrs, layout and target: keep a fuller copy.
                if c.attr.is_none() || c.stale {
                    c.attr = Some(a.clone());
                    c.stale = false;
                    c.bare = true;
                }
            }
        });
    }

    /// This client's own change `m`, answered with `reply` (sent at `stamp`): what it changed
    /// is updated in the cache, or dropped if a recall came in meanwhile.
    ///
    /// The attributes the change left on the other inodes it touched (`reply.after`) are kept
    /// where `settled` says no change of this client's own queued since touches them (they
    /// would not show it), unless a later change's answer brought newer ones already.
    pub fn learn_change(
        &self,
        stamp: Stamp,
        m: &Mutation,
        reply: &MdsReintReply,
        settled: &dyn Fn(Fid) -> bool,
    ) {
        let Some(mut s) = self.live_state() else {
            return;
        };
        let s = &mut *s;
        s.tick += 1;
        let facts = m.touches();
        let mut touched: Vec<Fid> = reply.changed.clone();
        touched.extend(facts.inodes);
        let named = facts.entries;
        // The change recalled every other client's lease on the directories it named: holding
        // them alone is worth asking again.
        // They are in use, too: a directory created into from answers alone (the kernel
        // asks no lookup before a create) is not the least recently used.
        let tick = s.tick;
        for (p, _) in &named {
            if let Some(h) = s.held.get_mut(p) {
                h.refused = None;
                h.used = tick;
            }
        }
        // The entries named, as cached before the change.
        let before: Vec<Option<(Fid, Kind)>> = named
            .iter()
            .map(|(p, n)| {
                s.held
                    .get(p)
                    .and_then(|h| h.names.get(*n))
                    .and_then(|e| e.entry)
            })
            .collect();
        touched.extend(before.iter().flatten().map(|(f, _)| *f));
        touched.extend(named.iter().map(|(p, _)| *p));
        let spoken_of = touched
            .iter()
            .chain(reply.inode.iter().map(|i| &i.fid))
            .chain(reply.after.iter().map(|i| &i.fid));
        if spoken_of
            .into_iter()
            .any(|f| Self::dropped_since(s, stamp, *f))
        {
            // One of these was recalled meanwhile: what the answer says may predate it.
            touched.sort_unstable();
            touched.dedup();
            for f in &touched {
                self.drop_one(s, *f, true);
            }
            self.moved_here(s, &touched);
            return;
        }
        let t = reply.transno;
        let set = |s: &mut State, parent: Fid, name: &[u8], entry: Option<(Fid, Kind)>| {
            let Some(h) = s.held.get_mut(&parent) else {
                return;
            };
            match h.names.get_mut(name) {
                Some(old) if old.transno > t && t != 0 => {}
                _ if t == 0 => {
                    // Answered from the reply cache: which order it came in is unknown.
                    h.names.remove(name);
                    h.complete = false;
                }
                // Already named (a create answered here): changed in place.
                Some(old) => *old = Name { entry, transno: t },
                None => {
                    h.names.insert(name.to_vec(), Name { entry, transno: t });
                }
            }
        };
        match m {
            Mutation::Create { parent, name, .. } | Mutation::CreateAt { parent, name, .. } => {
                if let Some(i) = reply.inode.as_ref().filter(|_| reply.created) {
                    set(s, *parent, name, Some((i.fid, i.kind)));
                }
            }
            Mutation::Link { parent, name, .. }
            | Mutation::MkdirOn { parent, name, .. }
            | Mutation::MkdirStriped { parent, name, .. } => {
                if let Some(i) = &reply.inode {
                    set(s, *parent, name, Some((i.fid, i.kind)));
                }
            }
            Mutation::Unlink { parent, name, .. } => set(s, *parent, name, None),
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                let (from, to) = (before[0], before[1]);
                match (flags.exchange, from) {
                    (true, Some(_)) if to.is_some() => {
                        set(s, *parent, name, to);
                        set(s, *new_parent, new_name, from);
                    }
                    (false, Some(_)) => {
                        set(s, *parent, name, None);
                        set(s, *new_parent, new_name, from);
                    }
                    _ => {
                        // Not known here: neither name is answered from the cache now.
                        for (p, n) in [(*parent, &name[..]), (*new_parent, &new_name[..])] {
                            if let Some(h) = s.held.get_mut(&p) {
                                h.names.remove(n);
                                h.complete = false;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        for f in &touched {
            if let Some(h) = s.held.get_mut(f) {
                if matches!(m, Mutation::Setattr { .. }) {
                    h.attr = None; // its mode or owner may have moved: no permission checks
                }
                h.stale = true;
            }
        }
        if let Some(i) = reply.inode.as_ref().filter(|_| reply.leased) {
            let cancelled =
                s.cancelling.contains_key(&i.fid) || Self::given_back_since(s, stamp, i.fid);
            if !cancelled {
                let h = Self::held_mut(s, i.fid);
                h.attr = Some(i.clone());
                h.stale = false;
                h.bare = false;
            } else if !s.held.contains_key(&i.fid) {
                // Granted before the MDS took this client's cancel, perhaps: given back again.
                s.cancel.insert(i.fid);
            }
        }
        for i in &reply.after {
            let Some(h) = s.held.get_mut(&i.fid) else {
                continue;
            };
            let newer = t != 0
                && t > h.after
                && h.attr
                    .as_ref()
                    .is_none_or(|a| a.ctime <= i.ctime && a.kind == i.kind);
            if newer && settled(i.fid) {
                h.attr = Some(i.clone());
                h.stale = false;
                h.bare = false;
                h.after = t;
            }
        }
        self.bound(s);
        touched.extend(reply.inode.iter().map(|i| i.fid));
        touched.extend(reply.after.iter().map(|i| i.fid));
        self.moved_here(s, &touched);
    }

    /// Whether this client gave back `fid`'s lease after `stamp` was taken (the MDS took the
    /// cancel since): a grant of it in an answer sent before may predate the cancel.
    fn given_back_since(s: &State, stamp: Stamp, fid: Fid) -> bool {
        stamp.retired < s.given_back_all
            || s.given_back.get(&fid).is_some_and(|t| *t > stamp.retired)
    }

    /// Counts a change of this client's own that touched `fids` (under the state's lock, so
    /// that an answer taken in after it sees it).
    fn moved_here(&self, s: &mut State, fids: &[Fid]) {
        let now = self.own.fetch_add(1, Ordering::SeqCst) + 1;
        if s.touched.len() + fids.len() > MAX_TOUCHED {
            s.touched.clear();
            s.touched_all = now;
        }
        for f in fids {
            s.touched.insert(*f, now);
        }
    }

    /// Whether a create of `name` in `parent` by `creds` can be answered here: the directory
    /// held whole, `name` absent from it, and the caller (mapped as the MDS maps it) allowed
    /// to write and search it. Then `f`'s result, given the directory's attributes and the
    /// mapped identity under the lock (nothing is copied out).
    pub fn may_create<R>(
        &self,
        parent: Fid,
        name: &[u8],
        creds: &Creds,
        f: impl FnOnce(&Inode, Creds) -> R,
    ) -> Option<R> {
        if !plain(name) {
            return None;
        }
        let s = self.live_state()?;
        let h = s.held.get(&parent).filter(|h| h.alone)?;
        let attr = h.attr.as_ref()?;
        let absent = match h.names.get(name) {
            Some(n) => n.entry.is_none(),
            None => h.complete,
        };
        if !absent || attr.kind != Kind::Dir {
            return None;
        }
        let who = s.idmap.map(creds.clone());
        attr.permits(&who, 3).then(|| f(attr, who))
    }

    /// Whether an unlink of `name` in `parent` by `creds` can be answered here: the directory
    /// held, `name` a regular file or symlink whose attributes are held, and the caller allowed
    /// to remove it (write and search on the directory, the sticky bit's rule). The entry's
    /// attributes.
    pub fn may_unlink(&self, parent: Fid, name: &[u8], creds: &Creds) -> Option<Inode> {
        if !plain(name) {
            return None;
        }
        let s = self.live_state()?;
        let who = s.idmap.map(creds.clone());
        let h = s.held.get(&parent).filter(|h| h.alone)?;
        let dir = h.attr.as_ref()?;
        let (fid, kind) = h.names.get(name)?.entry?;
        if !matches!(kind, Kind::File | Kind::Symlink) || dir.kind != Kind::Dir {
            return None;
        }
        let c = s.held.get(&fid)?;
        let victim = c.attr.as_ref().filter(|_| !c.stale)?;
        proto::rules::may_unlink(dir, victim, &who)
            .is_ok()
            .then(|| victim.clone())
    }

    /// A create answered here (see [`Leases::may_create`]): the directory now shows `inode`
    /// under `name`, and its own times are fetched again.
    pub fn created_here(&self, parent: Fid, name: &[u8], inode: &Inode) {
        let mut s = self.state.lock();
        s.tick += 1;
        let tick = s.tick;
        if let Some(h) = s.held.get_mut(&parent) {
            h.used = tick;
            h.names.insert(
                name.to_vec(),
                Name {
                    entry: Some((inode.fid, inode.kind)),
                    transno: 0,
                },
            );
            h.stale = true;
        }
        self.moved_here(&mut s, &[parent, inode.fid]);
    }

    /// The size and times of file `fid` move with a change of this client's own still on its
    /// way (a close finishing behind): its cached attributes serve permission checks only
    /// until the change is answered.
    pub fn moving(&self, fid: Fid) {
        let mut s = self.state.lock();
        if let Some(h) = s.held.get_mut(&fid) {
            h.stale = true;
        }
        self.moved_here(&mut s, &[fid]);
    }

    /// An unlink answered here (see [`Leases::may_unlink`]): `name` is absent now, and the
    /// file's attributes (its link count) are fetched again.
    pub fn unlinked_here(&self, parent: Fid, name: &[u8], fid: Fid) {
        let mut s = self.state.lock();
        s.tick += 1;
        let tick = s.tick;
        if let Some(h) = s.held.get_mut(&parent) {
            h.used = tick;
            h.names.insert(
                name.to_vec(),
                Name {
                    entry: None,
                    transno: 0,
                },
            );
            h.stale = true;
        }
        if let Some(h) = s.held.get_mut(&fid) {
            h.stale = true;
        }
        self.moved_here(&mut s, &[parent, fid]);
    }

    /// A change answered here failed at the MDS: nothing is known of `name` now.
    pub fn undo(&self, parent: Fid, name: &[u8]) {
        let mut s = self.state.lock();
        if let Some(h) = s.held.get_mut(&parent) {
            h.names.remove(name);
            h.complete = false;
            h.stale = true;
        }
        let now = self.recalls.fetch_add(1, Ordering::SeqCst) + 1;
        Self::mark_dropped(&mut s, parent, now);
        drop(s);
        if let Some(hook) = self.hook.get() {
            hook(Dropped {
                fid: parent,
                names: vec![name.to_vec()],
            });
        }
    }

    /// Drops the lease on `fid`, giving it back to the MDS if `cancel`.
    fn drop_one(&self, s: &mut State, fid: Fid, cancel: bool) {
        let now = self.recalls.fetch_add(1, Ordering::SeqCst) + 1;
        Self::mark_dropped(s, fid, now);
        if let Some(h) = s.held.remove(&fid) {
            if cancel {
                s.cancel.insert(fid);
            }
            if let Some(hook) = self.hook.get() {
                hook(Dropped {
                    fid,
                    names: h.names.into_keys().collect(),
                });
            }
        }
    }

    /// Gives back the lease on `fid` to stay within the bound. Nothing moved: answers on
    /// their way about it are still true (the MDS holds the lease for this client until it
    /// takes the cancel), so unlike a recall this does not mark it dropped, which would give
    /// up every answer on its way once the table of those overflowed (and with them the
    /// directories they name).
    fn evict_one(&self, s: &mut State, fid: Fid) {
        if let Some(h) = s.held.remove(&fid) {
            s.cancel.insert(fid);
            if let Some(hook) = self.hook.get() {
                hook(Dropped {
                    fid,
                    names: h.names.into_keys().collect(),
                });
            }
        }
    }

    fn drop_all(&self, s: &mut State) {
        self.recalls.fetch_add(1, Ordering::SeqCst);
        let fids: Vec<Fid> = s.held.keys().copied().collect();
        for f in fids {
            self.drop_one(s, f, false);
        }
        s.cancel.clear();
        s.cancelling.clear();
        s.dropped.clear();
        s.dropped_all = self.recalls.load(Ordering::SeqCst);
    }

    /// Notes that what was cached of `fid` was dropped when the recalls stood at `now`.
    fn mark_dropped(s: &mut State, fid: Fid, now: u64) {
        if s.dropped.len() >= MAX_TOUCHED {
            s.dropped.clear();
            s.dropped_all = now;
        }
        s.dropped.insert(fid, now);
    }

    /// Whether what was cached of `fid` was dropped after `stamp` was taken: an answer sent
    /// before may say what the recall made untrue.
    fn dropped_since(s: &State, stamp: Stamp, fid: Fid) -> bool {
        stamp.recalls < s.dropped_all || s.dropped.get(&fid).is_some_and(|t| *t > stamp.recalls)
    }

    /// Gives back leases past the bound, at random but for the most recently used, the leases
    /// of directories with names cached last.
    fn bound(&self, s: &mut State) {
        if s.held.len() <= self.max {
            return;
        }
        let mut ages: Vec<(u64, Fid, bool)> = s
            .held
            .iter()
            .map(|(f, h)| (h.used, *f, !h.names.is_empty()))
            .collect();
        let n = (s.held.len() - self.max + self.max / 16).min(ages.len());
        // Given back at random, all but the most recently used sixteenth: a scan over more
        // inodes than the bound (stat after create in a directory past it) finds a share of
        // them still cached on its next pass (a fifth, over twice the bound), where giving
        // back the least recently used would miss every time, each miss giving back what the
        // scan reaches next. What was used last, the working set, stays.
        let older = (ages.len() - ages.len() / 16).max(n);
        if older < ages.len() {
            ages.select_nth_unstable(older);
        }
        let pool = &mut ages[..older];
        // Among them, directories with names cached go last: giving one back drops each of
        // its names wherever the cache is mirrored (a mount: one invalidation per name, each
        // under the directory's lock in the kernel, hundreds of thousands for a directory a
        // job filled), and with it the creates this client answers there ahead.
        let mut plain = 0;
        for i in 0..pool.len() {
            if !pool[i].2 {
                pool.swap(i, plain);
                plain += 1;
            }
        }
        let mut rng = rand::thread_rng();
        for i in 0..n {
            let end = if i < plain { plain } else { pool.len() };
            let j = rand::Rng::gen_range(&mut rng, i..end);
            pool.swap(i, j);
        }
        for &(_, f, _) in &pool[..n] {
            self.evict_one(s, f);
        }
        self.give_back.notify_one();
    }

    /// Notified when the bound gave leases back: the lease channel sends them without
    /// waiting for the held wait's answer.
    pub fn gave_back(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.give_back.clone()
    }

    /// Drops every lease (the MDS restarted, or this client leaves).
    pub fn lose_all(&self) {
        let mut s = self.state.lock();
        s.valid_until = None;
        self.drop_all(&mut s);
    }

    /// What the next wait carries: its number, the last recall applied, the epoch known, and
    /// the leases given back.
    pub fn next_wait(&self) -> (u64, u64, u64, Vec<Fid>) {
        let mut s = self.state.lock();
        let n = s.cancel.len().min(proto::md::MAX_RECALL);
        let cancel: Vec<Fid> = s.cancel.iter().take(n).copied().collect();
        for f in &cancel {
            s.cancel.remove(f);
        }
        s.wait_nr += 1;
        let nr = s.wait_nr;
        s.cancelling.extend(cancel.iter().map(|f| (*f, nr)));
        (nr, s.acked, s.epoch, cancel)
    }

    /// Whether `r` takes every lease (a new run of the MDS, or this client lost them there).
    pub fn loses_all(&self, r: &MdsLeaseRecall) -> bool {
        let s = self.state.lock();
        r.instance != s.instance || r.epoch != s.epoch
    }

    /// Wait `nr`, sent at `sent`, was answered: recalls are applied first, then the leases
    /// held are good for a term from `sent`.
    pub fn answered(&self, nr: u64, sent: Instant, r: &MdsLeaseRecall) -> bool {
        let mut s = self.state.lock();
        // The MDS has taken every cancel up to this wait, or never will. Answers to requests
        // sent before now may carry grants of those inodes it made before it took them: none
        // of those is kept. Grants of other inodes are: giving leases back must not unsettle
        // the rest (every batch on its way would otherwise drop what it touched, and give
        // that back in turn).
        let taken: Vec<Fid> = s
            .cancelling
            .iter()
            .filter(|(_, n)| **n <= nr)
            .map(|(f, _)| *f)
            .collect();
        if !taken.is_empty() {
            s.cancelling.retain(|_, n| *n > nr);
            let now = self.retired.fetch_add(1, Ordering::SeqCst) + 1;
            if s.given_back.len() + taken.len() > MAX_TOUCHED {
                s.given_back.clear();
                s.given_back_all = now;
            }
            for f in taken {
                s.given_back.insert(f, now);
            }
        }
        let dropped = r.instance != s.instance || r.epoch != s.epoch || !r.fids.is_empty();
        if r.instance != s.instance || r.epoch != s.epoch {
            // A new run of the MDS, or this client lost its leases there.
            self.drop_all(&mut s);
            s.instance = r.instance;
            s.epoch = r.epoch;
            s.acked = 0;
        }
        for f in &r.fids {
            self.drop_one(&mut s, *f, false);
        }
        if !r.fids.is_empty() {
            s.acked = r.seq;
        }
        s.idmap = r.idmap.clone();
        let term = Duration::from_millis(LEASE_TERM_MS).saturating_sub(MARGIN);
        s.valid_until = Some(sent + term);
        dropped
    }
}

/// A directory's entries, with each one's attributes for readdirplus.
pub type Listing = (Vec<DirEntry>, Vec<Inode>);

/// Whether `who` (as the MDS maps the caller) may read the directory or file `attr`.
fn may_read(attr: &Inode, who: &Creds) -> Result<()> {
    if attr.permits(who, 4) {
        Ok(())
    } else {
        Err(ClientError::fs(
            FsErrorKind::AccessDenied,
            format!("permission denied on {}", attr.fid),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::md::Time;

    fn fid(n: u32) -> Fid {
        Fid::new(proto::fid::FIRST_NORMAL_SEQ, n, 0)
    }

    fn inode(f: Fid, kind: Kind) -> Inode {
        Inode {
            fid: f,
            kind,
            mode: 0o755,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 0,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            xattrs: Default::default(),
            layout: None,
            target: vec![],
        }
    }

    fn live() -> Leases {
        let l = Leases::new(1000);
        let r = MdsLeaseRecall {
            instance: 1,
            epoch: 3,
            seq: 0,
            fids: vec![],
            idmap: IdMap {
                identity: true,
                ..IdMap::default()
            },
        };
        l.answered(0, Instant::now(), &r);
        l
    }

    /// A create of the file `name` in `dir`.
    fn create_of(dir: Fid, name: &[u8]) -> Mutation {
        Mutation::Create {
            parent: dir,
            name: name.to_vec(),
            kind: Kind::File,
            mode: 0o644,
            exclusive: true,
            target: vec![],
            layout: None,
        }
    }

    fn reply(inode: Option<Inode>, transno: u64, changed: Vec<Fid>) -> MdsReintReply {
        MdsReintReply {
            inode,
            created: true,
            size_gen: 0,
            grant: None,
            transno,
            committed: 0,
            instance: 1,
            ticket: vec![],
            leased: true,
            changed,
            after: vec![],
        }
    }

    #[test]
    fn a_listing_answers_negative_lookups_and_an_own_create_updates_it() {
        let l = live();
        let (dir, me) = (fid(2), Creds::root());
        let st = l.stamp();
        l.learn_attr(st, &inode(dir, Kind::Dir), true);
        let st = l.stamp();
        l.learn_listing(st, dir, &[], &[]);
        assert!(l.lookup(dir, b"a", &me).unwrap().is_err());
        let st = l.stamp();
        let m = create_of(dir, b"a");
        l.learn_change(
            st,
            &m,
            &reply(Some(inode(fid(9), Kind::File)), 5, vec![dir]),
            &|_| true,
        );
        assert_eq!(l.lookup(dir, b"a", &me).unwrap().unwrap().fid, fid(9));
        assert!(l.getattr(dir).is_none(), "the directory's times moved on");
        assert!(l.lookup(dir, b"b", &me).unwrap().is_err());
    }

    #[test]
    fn a_changed_directory_takes_the_attributes_its_changes_answers_bring_in_order() {
        let l = live();
        let (dir, me) = (fid(2), Creds::root());
        let st = l.stamp();
        l.learn_attr(st, &inode(dir, Kind::Dir), true);
        let create = |name: &[u8]| create_of(dir, name);
        let dir_at = |secs: i64, nlink: u32| Inode {
            mtime: Time { sec: secs, nsec: 0 },
            ctime: Time { sec: secs, nsec: 0 },
            nlink,
            ..inode(dir, Kind::Dir)
        };
        let answer = |file: u32, transno: u64, after: Inode| MdsReintReply {
            after: vec![after],
            ..reply(Some(inode(fid(file), Kind::File)), transno, vec![dir])
        };
        // A later change of this client's own touches the directory: the answer does not show
        // it, and the attributes stay to be fetched.
        l.learn_change(
            l.stamp(),
            &create(b"a"),
            &answer(9, 5, dir_at(10, 2)),
            &|_| false,
        );
        assert!(l.getattr(dir).is_none());
        // Nothing queued since: the directory's attributes are the answer's.
        l.learn_change(
            l.stamp(),
            &create(b"b"),
            &answer(10, 6, dir_at(11, 3)),
            &|_| true,
        );
        assert_eq!(l.getattr(dir).unwrap().nlink, 3);
        // An earlier change's answer coming late does not take them back.
        l.learn_change(
            l.stamp(),
            &create(b"a"),
            &answer(9, 5, dir_at(10, 2)),
            &|_| true,
        );
        assert!(l.getattr(dir).is_none_or(|i| i.nlink == 3));
        // Nor does an answer from the reply cache (transaction number 0), whose order is unknown.
        l.learn_change(
            l.stamp(),
            &create(b"c"),
            &answer(11, 0, dir_at(12, 4)),
            &|_| true,
        );
        assert!(l.getattr(dir).is_none());
        assert!(l.lookup(dir, b"b", &me).unwrap().is_ok());
    }

    #[test]
    fn an_answer_is_kept_across_own_changes_to_other_inodes_only() {
        let l = live();
        let (d1, d2, f1, f2) = (fid(2), fid(3), fid(10), fid(11));
        let me = Creds::root();
        for d in [d1, d2] {
            l.learn_attr(l.stamp(), &inode(d, Kind::Dir), true);
            l.learn_listing(l.stamp(), d, &[], &[]);
        }
        // Answers on their way while this client creates in the other directory (another
        // process of the same mount): they are kept.
        let st = l.stamp();
        l.created_here(d2, b"x", &inode(fid(20), Kind::File));
        l.learn_attr(st, &inode(f1, Kind::File), true);
        assert!(
            l.getattr(f1).is_some(),
            "an answer about another inode was dropped"
        );
        l.learn_absent(st, d1, b"nothing");
        assert!(l.lookup(d1, b"nothing", &me).unwrap().is_err());
        // An answer about the inode a change touched while it was on its way is not.
        let st = l.stamp();
        l.moving(f2);
        l.learn_attr(st, &inode(f2, Kind::File), true);
        assert!(
            l.getattr(f2).is_none(),
            "an answer predating a change was kept"
        );
        // Nor is a negative lookup in the directory a create went into meanwhile.
        let st = l.stamp();
        l.created_here(d1, b"y", &inode(fid(21), Kind::File));
        l.learn_absent(st, d1, b"y");
        assert!(
            !matches!(l.lookup(d1, b"y", &me), Some(Err(_))),
            "a name created here was taken for absent"
        );
    }

    #[test]
    fn an_answer_that_crossed_a_recall_is_not_kept() {
        let l = live();
        let dir = fid(2);
        let st = l.stamp();
        let recall = MdsLeaseRecall {
            instance: 1,
            epoch: 3,
            seq: 1,
            fids: vec![dir],
            idmap: IdMap {
                identity: true,
                ..IdMap::default()
            },
        };
        l.answered(0, Instant::now(), &recall);
        l.learn_attr(st, &inode(dir, Kind::Dir), true);
        assert!(l.getattr(dir).is_none());
        assert_eq!(
            l.next_wait(),
            (1, 1, 3, vec![dir]),
            "given back, and the recall acked"
        );
    }

    #[test]
    fn a_lease_given_back_is_not_kept_from_a_grant_until_the_wait_is_answered() {
        let l = live();
        let dir = fid(6);
        // An answer read across a recall of the inode is not kept: its grant goes back.
        let old = l.stamp();
        l.answered(0, Instant::now(), &recall_of(dir, 1));
        l.learn_attr(old, &inode(dir, Kind::Dir), true);
        let (nr, _, _, cancel) = l.next_wait();
        assert_eq!(cancel, vec![dir]);
        // While that wait is on its way, the MDS may take its cancel after granting the lease
        // again: a grant now is not kept.
        l.learn_attr(l.stamp(), &inode(dir, Kind::Dir), true);
        assert!(
            l.getattr(dir).is_none(),
            "kept while its cancel was on its way"
        );
        // Once the wait is answered, an answer sent before that is not kept either; one sent
        // after is.
        let before = l.stamp();
        l.answered(nr, Instant::now(), &recall_of(fid(98), 2));
        l.learn_attr(before, &inode(dir, Kind::Dir), true);
        assert!(l.getattr(dir).is_none());
        // That grant goes back too; once its wait is answered, a new answer is kept.
        let (nr, _, _, cancel) = l.next_wait();
        assert_eq!(cancel, vec![dir]);
        l.answered(nr, Instant::now(), &recall_of(fid(97), 3));
        l.learn_attr(l.stamp(), &inode(dir, Kind::Dir), true);
        assert!(l.getattr(dir).is_some());
    }

    #[test]
    fn a_lease_given_back_keeps_other_grants_in_flight_and_only_refuses_its_own() {
        let l = live();
        let (dir, back, made) = (fid(2), fid(40), fid(30));
        l.learn_attr(l.stamp(), &inode(dir, Kind::Dir), true);
        l.learn_listing(l.stamp(), dir, &[], &[]);
        // A grant of `back` read across its recall goes back: its cancel rides the next wait.
        let old = l.stamp();
        l.answered(0, Instant::now(), &recall_of(back, 1));
        l.learn_attr(old, &inode(back, Kind::File), true);
        let (nr, _, _, cancel) = l.next_wait();
        assert_eq!(cancel, vec![back]);
        // Changes on their way while the MDS takes that cancel.
        let st = l.stamp();
        let empty = MdsLeaseRecall {
            fids: vec![],
            ..recall_of(fid(99), 1)
        };
        l.answered(nr, Instant::now(), &empty);
        let create = create_of(dir, b"f");
        l.learn_change(
            st,
            &create,
            &reply(Some(inode(made, Kind::File)), 5, vec![]),
            &|_| true,
        );
        assert!(
            l.getattr(made).is_some(),
            "a grant of another inode was given up for a lease given back"
        );
        assert!(l.holds(dir), "the directory's lease was dropped");
        // A grant of the inode given back, sent before the MDS took the cancel, is not kept.
        let setattr = Mutation::Setattr {
            fid: back,
            attr: Default::default(),
        };
        l.learn_change(
            st,
            &setattr,
            &reply(Some(inode(back, Kind::File)), 6, vec![]),
            &|_| true,
        );
        assert!(
            l.getattr(back).is_none(),
            "a grant predating its cancel was kept"
        );
        assert_eq!(l.next_wait().3, vec![back], "and it goes back again");
    }

    #[test]
    fn a_recall_of_one_inode_keeps_answers_in_flight_about_others() {
        let l = live();
        let (dir, other) = (fid(2), fid(50));
        l.learn_attr(l.stamp(), &inode(dir, Kind::Dir), true);
        l.learn_listing(l.stamp(), dir, &[], &[]);
        l.learn_attr(l.stamp(), &inode(other, Kind::Dir), true);
        let create = |name: &str| create_of(dir, name.as_bytes());
        // Another directory is recalled while a create in `dir` is on its way.
        let st = l.stamp();
        l.answered(0, Instant::now(), &recall_of(other, 1));
        assert!(!l.holds(other));
        let made = inode(fid(31), Kind::File);
        l.learn_change(st, &create("f"), &reply(Some(made), 5, vec![]), &|_| true);
        assert!(
            l.holds(dir),
            "the directory was given up for another's recall"
        );
        assert!(
            l.getattr(fid(31)).is_some(),
            "the file made was given up for another's recall"
        );
        assert!(l.next_wait().3.is_empty(), "nothing goes back");
        // A recall of the directory itself, crossing the next create, drops what it says.
        let st = l.stamp();
        l.answered(1, Instant::now(), &recall_of(dir, 2));
        let made = inode(fid(32), Kind::File);
        l.learn_change(st, &create("g"), &reply(Some(made), 6, vec![]), &|_| true);
        assert!(
            l.getattr(fid(32)).is_none(),
            "kept across its directory's recall"
        );
        assert!(!l.holds(dir));
    }

    /// A recall of `f` (number `seq`) in the run and epoch [`live`] knows.
    fn recall_of(f: Fid, seq: u64) -> MdsLeaseRecall {
        MdsLeaseRecall {
            instance: 1,
            epoch: 3,
            seq,
            fids: vec![f],
            idmap: IdMap {
                identity: true,
                ..IdMap::default()
            },
        }
    }

    #[test]
    fn a_recall_drops_what_was_cached_and_tells_the_hook() {
        let l = live();
        let seen = Arc::new(Mutex::new(vec![]));
        let s2 = seen.clone();
        l.on_drop(Arc::new(move |d: Dropped| s2.lock().push(d.fid)));
        let dir = fid(2);
        let st = l.stamp();
        l.learn_attr(st, &inode(dir, Kind::Dir), true);
        assert!(l.getattr(dir).is_some());
        let recall = MdsLeaseRecall {
            instance: 1,
            epoch: 3,
            seq: 4,
            fids: vec![dir],
            idmap: IdMap::default(),
        };
        l.answered(0, Instant::now(), &recall);
        assert!(l.getattr(dir).is_none());
        assert_eq!(*seen.lock(), vec![dir]);
    }

    #[test]
    fn leases_lapse_a_term_after_the_last_answered_wait() {
        let l = live();
        let st = l.stamp();
        l.learn_attr(st, &inode(fid(3), Kind::File), true);
        assert!(l.getattr(fid(3)).is_some());
        l.state.lock().valid_until = Some(Instant::now() - Duration::from_millis(1));
        assert!(l.getattr(fid(3)).is_none());
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn the_cache_is_bounded() {
        let l = Leases::new(16);
        l.answered(
            0,
            Instant::now(),
            &MdsLeaseRecall {
                instance: 1,
                epoch: 1,
                seq: 0,
                fids: vec![],
                idmap: IdMap::default(),
            },
        );
        for n in 0..100 {
            let st = l.stamp();
            l.learn_attr(st, &inode(fid(n + 10), Kind::File), true);
        }
        assert!(l.len() <= 16);
        assert!(l.getattr(fid(109)).is_some(), "the newest stays");
    }

    #[test]
    fn a_scan_past_the_bound_still_finds_a_share_cached() {
        let l = live();
        // Bound to 1,000 leases. Stat after create, twice over 2,000 inodes: each miss asks
        // the MDS and is cached.
        let mut hits = 0;
        for pass in 0..3 {
            for n in 0..2000 {
                if l.getattr(fid(n + 10)).is_some() {
                    hits += usize::from(pass > 0);
                } else {
                    let st = l.stamp();
                    l.learn_attr(st, &inode(fid(n + 10), Kind::File), true);
                }
            }
            assert!(l.len() <= 1000);
        }
        // Least recently used first would find none (each miss evicting what comes next).
        assert!(hits > 400, "{hits} hits of 4,000");
    }

    #[test]
    fn directories_with_names_are_given_back_after_files() {
        let l = live();
        // Ten directories whose listings were learned, each naming two of its files, then
        // files past the bound: the files make the room.
        let dirs: Vec<Fid> = (0..10).map(|n| fid(100_000 + n)).collect();
        for (k, d) in dirs.iter().enumerate() {
            let files: Vec<Inode> = (0..2)
                .map(|i| inode(fid(200_000 + 2 * k as u32 + i), Kind::File))
                .collect();
            let entries: Vec<DirEntry> = files
                .iter()
                .enumerate()
                .map(|(i, f)| DirEntry {
                    name: format!("f{i}").into_bytes(),
                    fid: f.fid,
                    kind: Kind::File,
                })
                .collect();
            let st = l.stamp();
            l.learn_attr(st, &inode(*d, Kind::Dir), true);
            let st = l.stamp();
            l.learn_listing(st, *d, &entries, &files);
        }
        for n in 0..3000 {
            let st = l.stamp();
            l.learn_attr(st, &inode(fid(n + 10), Kind::File), true);
            assert!(l.len() <= 1000);
        }
        for d in &dirs {
            assert!(l.holds(*d), "{d} was given back while files could be");
        }
    }
}
