//! The files this client holds open, as the MDS counts them: each open is a handle the MDS
//! keeps the file's objects for, even once its last name is gone. The MDS keeps its count in
//! memory; when it restarts (its pings answer with another instance), the client counts every
//! handle again (Lustre's open replay), within the MDS's recovery window.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use proto::Fid;

#[derive(Default)]
pub(crate) struct Opens {
    handles: Mutex<HashMap<u64, Fid>>,
    /// The MDS instance last seen (0 before the first ping).
    instance: AtomicU64,
    /// How many times the client counted its handles again.
    replays: AtomicU64,
    /// A replay that failed, to be tried again at the next ping.
    unfinished: std::sync::atomic::AtomicBool,
}

impl Opens {
    /// How many replays began so far: read before sending an open, compared after
    /// [`Opens::insert`] (see [`Client::opened`]).
    pub fn replays(&self) -> u64 {
        self.replays.load(Ordering::SeqCst)
    }

    pub fn insert(&self, handle: u64, fid: Fid) {
        self.handles.lock().insert(handle, fid);
    }

    pub fn remove(&self, handle: u64) {
        self.handles.lock().remove(&handle);
    }

    pub fn is_empty(&self) -> bool {
        self.handles.lock().is_empty()
    }

    /// Whether the handles must be counted again: `instance` is another run of the MDS than
    /// the one seen before, or the last replay did not finish.
    pub fn restarted(&self, instance: u64) -> bool {
        let before = self.instance.swap(instance, Ordering::SeqCst);
        let unfinished = self.unfinished.swap(false, Ordering::SeqCst);
        unfinished || (before != 0 && before != instance)
    }

    /// The replay just begun failed: the next ping tries again.
    pub fn replay_failed(&self) {
        self.unfinished.store(true, Ordering::SeqCst);
    }

    /// Begins a replay: every handle held now. A handle inserted later sees the count move.
    pub fn replaying(&self) -> Vec<(u64, Fid)> {
        self.replays.fetch_add(1, Ordering::SeqCst);
        self.handles.lock().iter().map(|(h, f)| (*h, *f)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_opened_during_a_replay_sees_the_count_move() {
        let o = Opens::default();
        assert!(!o.restarted(7), "the first instance seen is no restart");
        assert!(!o.restarted(7));
        let before = o.replays();
        let held = o.replaying();
        assert!(held.is_empty());
        o.insert(1, Fid::new(0x200000400, 1, 0));
        assert_ne!(
            o.replays(),
            before,
            "the opener must count its handle itself"
        );
        assert!(o.restarted(8));
        o.replay_failed();
        assert!(o.restarted(8), "a replay that failed is tried again");
        assert!(!o.restarted(8));
    }
}
