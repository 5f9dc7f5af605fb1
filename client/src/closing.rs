//! Closes finished behind the caller: a small file this client created ahead, in a directory
//! it holds alone, is closed without waiting for its last writes to land and its size to be
//! published (Lustre's client keeps dirty data past close under its locks the same way).
//!
//! No other client can find such a file until the directory's lease is recalled, and the
//! recall is acknowledged only after every close begun before it has finished: its writes
//! landed and its size is queued with the changes answered ahead ([`crate::pending`]), which
//! the acknowledgement also waits for. So another client that opens the file after the close
//! sees its bytes and its size, as close-to-open promises.
//!
//! This client's own calls keep their order too: whatever reads or changes a file waits for
//! that file's close to finish (its attributes, an open, a truncate, an fsync), a listing waits
//! for the closes begun before it in its directory (and, should an entry it read be a file
//! still closing under another name, for every close), and whatever else may see a file
//! through its directory waits for every close begun before it (a rename, a link, an unlink,
//! `sync`). Calls a close itself makes (its writes, a capability's
//! renewal, the size it publishes) never wait for closes, so none waits on itself.
//!
//! A close that fails behind (a write refused, the storage full) publishes no size over the
//! bytes it could not keep; its error is reported, as POSIX allows, at the next `fsync` of the
//! file or its directory, or `sync`, as for a change answered ahead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use proto::Fid;
use tokio::sync::Notify;

/// Most closes finishing behind at once; a close past it waits for its writes itself.
pub const MAX_BEHIND: usize = 1024;
/// Largest file closed behind: a larger one's close waits for its writes, so that a failure
/// to store it is reported by the close itself.
pub const MAX_BEHIND_BYTES: u64 = 1 << 20;

#[derive(Default)]
pub(crate) struct Closings {
    state: Mutex<State>,
    /// Woken whenever a close finishes.
    done: Notify,
    /// The place in the queue of changes answered ahead of the last size a close behind
    /// queued: what a recall's acknowledgement waits to see answered.
    published: AtomicU64,
}

#[derive(Default)]
struct State {
    /// The number of the last close begun.
    begun: u64,
    /// Closes not finished, by number: the file and the directory it was made in.
    live: BTreeMap<u64, (Fid, Fid)>,
    /// How many of them each file has.
    files: crate::FastMap<Fid, u32>,
    /// How many of them each directory has.
    dirs: crate::FastMap<Fid, u32>,
}

/// Counts one down in `counts`, dropping its entry at zero.
fn count_down(counts: &mut crate::FastMap<Fid, u32>, key: Fid) {
    if let Some(n) = counts.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(&key);
        }
    }
}

/// A close finishing behind; finished when dropped.
pub(crate) struct Closing {
    closings: Arc<Closings>,
    seq: u64,
}

impl Drop for Closing {
    fn drop(&mut self) {
        self.closings.end(self.seq);
    }
}

impl Closings {
    /// Whether another close may begin behind now.
    pub fn has_room(&self) -> bool {
        self.state.lock().live.len() < MAX_BEHIND
    }

    /// Begins a close of `fid`, made in directory `dir`, finishing behind.
    pub fn begin(self: &Arc<Self>, fid: Fid, dir: Fid) -> Closing {
        let mut s = self.state.lock();
        s.begun += 1;
        let seq = s.begun;
        s.live.insert(seq, (fid, dir));
        *s.files.entry(fid).or_default() += 1;
        *s.dirs.entry(dir).or_default() += 1;
        Closing {
            closings: self.clone(),
            seq,
        }
    }

    fn end(&self, seq: u64) {
        let mut s = self.state.lock();
        if let Some((fid, dir)) = s.live.remove(&seq) {
            count_down(&mut s.files, fid);
            count_down(&mut s.dirs, dir);
        }
        drop(s);
        self.done.notify_waiters();
    }

    /// Whether a close of `fid` is finishing behind.
    pub fn busy(&self, fid: Fid) -> bool {
        self.state.lock().files.contains_key(&fid)
    }

    /// Whether a close of a file made in `dir` is finishing behind.
    pub fn any_in(&self, dir: Fid) -> bool {
        self.state.lock().dirs.contains_key(&dir)
    }

    /// Whether any close is finishing behind.
    pub fn any(&self) -> bool {
        !self.state.lock().live.is_empty()
    }

    /// Whether a close of any of `fids` is finishing behind.
    pub fn any_busy(&self, fids: impl IntoIterator<Item = Fid>) -> bool {
        let s = self.state.lock();
        !s.files.is_empty() && fids.into_iter().any(|f| s.files.contains_key(&f))
    }

    /// A close behind queued its size as change `seq` ([`crate::pending`]).
    pub fn queued(&self, seq: u64) {
        self.published.fetch_max(seq, Ordering::SeqCst);
    }

    /// The last change a close behind queued.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::SeqCst)
    }

    /// The number of the last close begun so far.
    pub fn begun(&self) -> u64 {
        self.state.lock().begun
    }

    /// Waits until no close of `fid` is finishing behind.
    pub async fn file(&self, fid: Fid) {
        loop {
            let done = self.done.notified();
            if !self.busy(fid) {
                return;
            }
            done.await;
        }
    }

    /// Waits until every close of a file made in `dir` begun so far has finished (later ones
    /// are not waited for).
    pub async fn dir(&self, dir: Fid) {
        let upto = self.begun();
        loop {
            let done = self.done.notified();
            let left = {
                let s = self.state.lock();
                s.dirs.contains_key(&dir)
                    && s.live.range(..=upto).any(|(_, (_, in_dir))| *in_dir == dir)
            };
            if !left {
                return;
            }
            done.await;
        }
    }

    /// Waits until every close begun so far has finished (later ones are not waited for).
    pub async fn all(&self) {
        let upto = self.begun();
        loop {
            let done = self.done.notified();
            let left = self
                .state
                .lock()
                .live
                .first_key_value()
                .is_some_and(|(seq, _)| *seq <= upto);
            if !left {
                return;
            }
            done.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fid(n: u32) -> Fid {
        Fid::new(proto::fid::INODE_SEQ, n, 0)
    }

    #[tokio::test]
    async fn a_wait_for_all_waits_only_for_closes_begun_before_it() {
        let c = Arc::new(Closings::default());
        let first = c.begin(fid(1), fid(100));
        let all = {
            let c = c.clone();
            tokio::spawn(async move { c.all().await })
        };
        tokio::task::yield_now().await;
        // Begun after the wait: it does not hold the wait back.
        let later = c.begin(fid(2), fid(100));
        assert!(!all.is_finished());
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(5), all)
            .await
            .expect("the wait ended once the earlier close finished")
            .unwrap();
        assert!(c.busy(fid(2)));
        drop(later);
        assert!(!c.busy(fid(2)));
    }

    #[tokio::test]
    async fn a_wait_for_a_file_ends_when_its_last_close_finishes() {
        let c = Arc::new(Closings::default());
        let a = c.begin(fid(1), fid(100));
        let b = c.begin(fid(1), fid(100));
        let other = c.begin(fid(3), fid(100));
        let wait = {
            let c = c.clone();
            tokio::spawn(async move { c.file(fid(1)).await })
        };
        drop(a);
        tokio::task::yield_now().await;
        assert!(c.busy(fid(1)));
        assert!(!wait.is_finished());
        drop(b);
        tokio::time::timeout(std::time::Duration::from_secs(5), wait)
            .await
            .expect("the wait ended with the file's last close")
            .unwrap();
        // Another file's close is not waited for.
        assert!(c.busy(fid(3)));
        drop(other);
    }

    #[tokio::test]
    async fn a_wait_for_a_directory_waits_only_for_closes_begun_before_it_there() {
        let c = Arc::new(Closings::default());
        let here = c.begin(fid(1), fid(100));
        let elsewhere = c.begin(fid(2), fid(200));
        let wait = {
            let c = c.clone();
            tokio::spawn(async move { c.dir(fid(100)).await })
        };
        tokio::task::yield_now().await;
        // Begun after the wait, in the same directory: it does not hold the wait back.
        let later = c.begin(fid(3), fid(100));
        assert!(!wait.is_finished());
        assert!(c.any_busy([fid(9), fid(1)]));
        drop(here);
        tokio::time::timeout(std::time::Duration::from_secs(5), wait)
            .await
            .expect("the wait ended once the earlier close there finished")
            .unwrap();
        // The other directory's close was not waited for.
        assert!(c.busy(fid(2)));
        assert!(!c.any_busy([fid(1), fid(9)]));
        drop((elsewhere, later));
        assert!(!c.any_busy([fid(2), fid(3)]));
    }
}
