//! What this client wrote that no storage target has yet confirmed durable, per file, shared
//! by every handle of the client on that file: what `fsync` must sync, and how it knows a
//! target lost writes.
//!
//! Each object written since its last successful sync is remembered with the target's
//! durability epoch its writes were answered under. A sync answered under another epoch means
//! the target's machine restarted in between and may have lost those writes: the object is
//! then marked lost, and every `fsync` of the file reports EIO until the client's last handle
//! on it closes. Nothing is forgotten because a sync failed: the next `fsync` tries again.
//!
//! Writes also carry their place in the client's order ([`WriteStamp`]): a rising xid, and the
//! oldest xid still in flight, so a storage server can refuse a write that arrives late. The
//! xid is taken when the write is asked for, in the caller's order; a write overlapping an
//! earlier one still in flight to the same object waits for it, so the server never sees two
//! of them out of order (and refuses only writes the client gave up on).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use concur::order::WriteOrder;
use parking_lot::Mutex;
use proto::layout::StripeObject;
use proto::ost::WriteStamp;
use proto::Fid;

/// One object's unsynced state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unstable {
    /// The epoch its unsynced writes were answered under.
    pub epoch: u64,
    /// Bumped at every write, so a sync removes only what it covered.
    pub generation: u64,
    /// Its target restarted and may have lost writes of this client.
    pub lost: bool,
}

#[derive(Default)]
struct FileWrites {
    handles: u32,
    objects: HashMap<StripeObject, Unstable>,
    /// Taken by each append of this client to the file, for the whole of it ([`Writes::append_turn`]).
    appending: Option<Arc<tokio::sync::Mutex<()>>>,
    /// An encrypted file's turn and stored length (see [`crate::crypt::CipherTurn`]).
    ciphered: Option<Arc<crate::crypt::CipherTurn>>,
    /// The furthest end any handle of this client wrote, less what it truncated since.
    end: u64,
}

/// The client's unsynced writes and write order.
pub(crate) struct Writes {
    files: Mutex<crate::FastMap<Fid, FileWrites>>,
    id: u64,
    order: WriteOrder<StripeObject>,
    /// Woken whenever a write leaves the order.
    left: tokio::sync::Notify,
    generation: AtomicU64,
}

/// A write's place in the client's order, held until it is answered or abandoned (dropping
/// it, as an aborted task does, leaves the order).
pub(crate) struct Ticket {
    writes: Arc<Writes>,
    pub stamp: WriteStamp,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.writes.order.end(self.stamp.xid);
        self.writes.left.notify_waiters();
    }
}

impl Ticket {
    /// Waits until no earlier write overlapping this one is in flight to its object.
    pub async fn ready(&self) {
        loop {
            let left = self.writes.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if !self.writes.order.blocked(self.stamp.xid) {
                return;
            }
            left.await;
        }
    }
}

impl Writes {
    pub fn new(id: u64) -> Writes {
        Writes {
            files: Mutex::new(Default::default()),
            id: id.max(1),
            order: WriteOrder::new(),
            left: tokio::sync::Notify::new(),
            generation: AtomicU64::new(1),
        }
    }

    /// Takes the next place in the order for a write of `start..end` of `object`; it counts in
    /// flight until the ticket is dropped. The xid and the oldest in flight are taken together,
    /// so no write can get an older xid once a newer one has named the oldest.
    pub fn begin(self: &Arc<Self>, object: StripeObject, start: u64, end: u64) -> Ticket {
        let place = self.order.begin(object, start, end);
        Ticket {
            writes: self.clone(),
            stamp: WriteStamp {
                client: self.id,
                xid: place.xid,
                oldest: place.oldest,
            },
        }
    }

    /// The turn every append of this client to `file` takes, through whichever handle: one
    /// at a time, each placed at the end the one before it left and publishing that end
    /// before the next looks for it.
    pub fn append_turn(&self, file: Fid) -> Arc<tokio::sync::Mutex<()>> {
        self.files
            .lock()
            .entry(file)
            .or_default()
            .appending
            .get_or_insert_with(Default::default)
            .clone()
    }

    /// The turn every write, truncate and read of encrypted `file` takes on this client,
    /// through whichever handle.
    pub fn cipher_turn(&self, file: Fid) -> Arc<crate::crypt::CipherTurn> {
        self.files
            .lock()
            .entry(file)
            .or_default()
            .ciphered
            .get_or_insert_with(Default::default)
            .clone()
    }

    /// A handle of this client wrote `file` up to `end`.
    pub fn wrote_to(&self, file: Fid, end: u64) {
        let mut files = self.files.lock();
        let f = files.entry(file).or_default();
        f.end = f.end.max(end);
    }

    /// Writes to `file` from `offset` on, acknowledged before they landed, failed to land: no
    /// handle of this client reads past `offset` on their account.
    pub fn lost_from(&self, file: Fid, offset: u64) {
        if let Some(f) = self.files.lock().get_mut(&file) {
            f.end = f.end.min(offset);
        }
    }

    /// `file` was cut to `size` through this client.
    pub fn cut(&self, file: Fid, size: u64) {
        if let Some(f) = self.files.lock().get_mut(&file) {
            f.end = f.end.min(size);
        }
    }

    /// The furthest end any handle of this client wrote `file` to while one is open: every
    /// handle reads up to it, whether or not the size is published yet.
    pub fn end_of(&self, file: Fid) -> u64 {
        self.files.lock().get(&file).map_or(0, |f| f.end)
    }

    pub fn opened(&self, file: Fid) {
        self.files.lock().entry(file).or_default().handles += 1;
    }

    /// The client's handle on `file` closed; its last one forgets the file if nothing
    /// unsynced is left but losses (reported by `fsync`, or never asked for).
    pub fn closed(&self, file: Fid) {
        let mut files = self.files.lock();
        if let Some(f) = files.get_mut(&file) {
            f.handles = f.handles.saturating_sub(1);
            if f.handles == 0 {
                // Published by the closes: the size says it from now on.
                f.end = 0;
                f.objects.retain(|_, u| !u.lost);
                if f.objects.is_empty() {
                    files.remove(&file);
                }
            }
        }
    }

    /// A write (or punch) to `object` of `file` was answered under `epoch`.
    pub fn written(&self, file: Fid, object: StripeObject, epoch: u64) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let mut files = self.files.lock();
        let u = files
            .entry(file)
            .or_default()
            .objects
            .entry(object)
            .or_insert(Unstable {
                epoch,
                generation,
                lost: false,
            });
        if u.epoch != epoch {
            u.lost = true;
        }
        u.generation = generation;
    }

    /// The storage server failed to make `object`'s writes durable (its disk failed the
    /// sync): they may be gone although a later sync would say Ok, so they count as lost,
    /// reported by every `fsync` until the client's last handle on the file closes.
    pub fn sync_failed(&self, file: Fid, object: StripeObject) {
        if let Some(u) = self
            .files
            .lock()
            .get_mut(&file)
            .and_then(|f| f.objects.get_mut(&object))
        {
            u.lost = true;
        }
    }

    /// What `fsync` of `file` must sync, in object order (the same order every run, so that a
    /// simulation replays exactly).
    pub fn unsynced(&self, file: Fid) -> Vec<(StripeObject, Unstable)> {
        let mut out: Vec<(StripeObject, Unstable)> = self
            .files
            .lock()
            .get(&file)
            .map(|f| f.objects.iter().map(|(o, u)| (*o, *u)).collect())
            .unwrap_or_default();
        out.sort_by_key(|(o, _)| (o.target, o.fid));
        out
    }

    /// `object` was synced under `epoch`: forgotten if nothing was written since `seen` and
    /// the epoch is the one its writes were answered under; marked lost (and kept) if not.
    /// Returns whether its writes are durable.
    pub fn synced(&self, file: Fid, object: StripeObject, seen: Unstable, epoch: u64) -> bool {
        let mut files = self.files.lock();
        let Some(f) = files.get_mut(&file) else {
            return !seen.lost && seen.epoch == epoch;
        };
        let Some(u) = f.objects.get_mut(&object) else {
            return true;
        };
        if u.lost || u.epoch != epoch {
            u.lost = true;
            return false;
        }
        if u.generation == seen.generation {
            f.objects.remove(&object);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(oid: u32) -> StripeObject {
        StripeObject {
            target: 0,
            fid: Fid::new(0x100000000, oid, 0),
        }
    }

    #[test]
    fn a_sync_under_a_new_epoch_marks_the_writes_lost_until_the_last_close() {
        let w = Writes::new(5);
        let file = Fid::new(0x200000400, 1, 0);
        w.opened(file);
        w.written(file, obj(1), 3);
        let (o, seen) = w.unsynced(file)[0];
        assert!(!w.synced(file, o, seen, 4), "the target restarted");
        assert!(w.unsynced(file)[0].1.lost, "and every later fsync says so");
        w.closed(file);
        assert!(w.unsynced(file).is_empty());
    }

    #[test]
    fn a_write_during_a_sync_stays_unsynced() {
        let w = Writes::new(5);
        let file = Fid::new(0x200000400, 1, 0);
        w.written(file, obj(1), 3);
        let (o, seen) = w.unsynced(file)[0];
        w.written(file, obj(1), 3);
        assert!(w.synced(file, o, seen, 3));
        assert_eq!(w.unsynced(file).len(), 1);
        let (o, seen) = w.unsynced(file)[0];
        assert!(w.synced(file, o, seen, 3));
        assert!(w.unsynced(file).is_empty());
    }

    #[test]
    fn the_oldest_write_in_flight_is_in_every_stamp() {
        let w = Arc::new(Writes::new(5));
        let a = w.begin(obj(1), 0, 10);
        let b = w.begin(obj(2), 0, 10);
        assert_eq!((a.stamp.oldest, b.stamp.oldest), (a.stamp.xid, a.stamp.xid));
        let bx = b.stamp.xid;
        drop(a);
        assert_eq!(w.begin(obj(1), 0, 10).stamp.oldest, bx);
    }

    #[tokio::test]
    async fn an_overlapping_write_waits_for_the_earlier_one_and_others_do_not() {
        let w = Arc::new(Writes::new(5));
        let first = w.begin(obj(1), 0, 100);
        let apart = w.begin(obj(1), 100, 200);
        let other = w.begin(obj(2), 0, 100);
        let over = w.begin(obj(1), 50, 60);
        apart.ready().await;
        other.ready().await;
        let waiting = tokio::spawn(async move {
            over.ready().await;
            over.stamp.xid
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "it went before the write it overlaps"
        );
        drop(first);
        assert!(waiting.await.unwrap() > apart.stamp.xid);
    }
}
