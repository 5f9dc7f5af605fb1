//! loom models of the structures that guard acknowledged data: every interleaving of a few
//! threads is explored. Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p lode-concur --release --test loom`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Mutex};
use loom::thread;

use concur::commit::CommitQueue;
use concur::order::WriteOrder;
use concur::range::RangeLocks;
use concur::replies::ReplyCache;

/// A registered region's memory, a peer's transfer and the owner deregistering: once the owner
/// has revoked the region and seen it idle, its own use of the memory never races a transfer.
#[test]
fn nothing_reaches_a_region_once_it_is_revoked_and_idle() {
    loom::model(|| {
        let locks = Arc::new(RangeLocks::new(4));
        let memory = Arc::new(UnsafeCell::new(0u8));
        let peer = {
            let (locks, memory) = (locks.clone(), memory.clone());
            thread::spawn(move || {
                if let Ok(id) = locks.lock(0, 1, true) {
                    // SAFETY: the write lock on the whole region is held.
                    memory.with_mut(|p| unsafe { *p = 1 });
                    locks.unlock(id);
                }
            })
        };
        locks.revoke();
        while !locks.is_idle() {
            thread::yield_now();
        }
        // SAFETY: what the model checks: no transfer can be in the region now.
        memory.with_mut(|p| unsafe { *p = 2 });
        peer.join().unwrap();
    });
}

/// Without the revocation (waiting for idle alone), loom finds the peer that looked the key up
/// before it went and locks after the owner saw the region idle.
#[test]
#[should_panic(expected = "Causality violation")]
fn waiting_for_idle_without_revoking_races_a_late_transfer() {
    loom::model(|| {
        let locks = Arc::new(RangeLocks::new(4));
        let memory = Arc::new(UnsafeCell::new(0u8));
        let peer = {
            let (locks, memory) = (locks.clone(), memory.clone());
            thread::spawn(move || {
                if let Ok(id) = locks.lock(0, 1, true) {
                    // SAFETY: checked by loom, which must find the race.
                    memory.with_mut(|p| unsafe { *p = 1 });
                    locks.unlock(id);
                }
            })
        };
        while !locks.is_idle() {
            thread::yield_now();
        }
        // SAFETY: checked by loom, which must find the race.
        memory.with_mut(|p| unsafe { *p = 2 });
        peer.join().unwrap();
    });
}

/// A reader and a writer of one range never overlap.
#[test]
fn a_writer_never_overlaps_a_reader() {
    loom::model(|| {
        let locks = Arc::new(RangeLocks::new(4));
        let memory = Arc::new(UnsafeCell::new(0u8));
        let threads: Vec<_> = [false, true]
            .into_iter()
            .map(|write| {
                let (locks, memory) = (locks.clone(), memory.clone());
                thread::spawn(move || {
                    if let Ok(id) = locks.lock(0, 8, write) {
                        if write {
                            // SAFETY: the write lock is held.
                            memory.with_mut(|p| unsafe { *p += 1 });
                        } else {
                            // SAFETY: a read lock is held.
                            memory.with(|p| unsafe { *p });
                        }
                        locks.unlock(id);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
}

/// Two writes asked for at once: whichever gets the later xid names the earlier as the oldest
/// in flight, and waits for it if they overlap.
#[test]
fn a_later_write_always_names_an_earlier_one_still_in_flight() {
    loom::model(|| {
        let order = Arc::new(WriteOrder::new());
        let other = {
            let order = order.clone();
            thread::spawn(move || order.begin(1u32, 0, 10))
        };
        let mine = order.begin(1, 5, 15);
        let theirs = other.join().unwrap();
        let (first, second) = if mine.xid < theirs.xid {
            (mine, theirs)
        } else {
            (theirs, mine)
        };
        assert_eq!(second.oldest, first.xid);
        assert!(order.blocked(second.xid));
        assert!(!order.blocked(first.xid));
        order.end(first.xid);
        assert!(!order.blocked(second.xid));
    });
}

/// A write that ends while another is asked for: the other names it as oldest only if it was
/// still in flight, and never names anything newer than itself.
#[test]
fn the_oldest_in_flight_is_never_past_a_write_still_in_flight() {
    loom::model(|| {
        let order = Arc::new(WriteOrder::new());
        let first = order.begin(1u32, 0, 10);
        let ender = {
            let order = order.clone();
            thread::spawn(move || order.end(first.xid))
        };
        let second = order.begin(2, 0, 10);
        ender.join().unwrap();
        assert!(second.oldest == first.xid || second.oldest == second.xid);
        assert!(second.xid > first.xid);
    });
}

/// Two appliers and the committer, with room for one record: every record is committed once,
/// in sequence order, each batch naming its own first and last records.
#[test]
fn group_commit_takes_every_record_once_in_order() {
    loom::model(|| {
        let queue = Arc::new(CommitQueue::new(0, 1));
        let seq = Arc::new(Mutex::new(0u64));
        let appliers: Vec<_> = (0..2)
            .map(|_| {
                let (queue, seq) = (queue.clone(), seq.clone());
                thread::spawn(move || {
                    let mut q = queue.appender();
                    let mut s = seq.lock().unwrap();
                    *s += 1;
                    q.push(*s, &s.to_le_bytes());
                })
            })
            .collect();
        let mut next = 1u64;
        while next <= 2 {
            let Some(b) = queue.next().batch else {
                continue;
            };
            assert_eq!(b.first_seq, next);
            assert_eq!(b.last_seq, next + u64::from(b.count) - 1);
            for chunk in b.bytes.chunks(8) {
                assert_eq!(u64::from_le_bytes(chunk.try_into().unwrap()), next);
                next += 1;
            }
        }
        for a in appliers {
            a.join().unwrap();
        }
        queue.stop();
        let last = queue.next();
        assert!(last.stop && last.batch.is_none());
    });
}

/// A request and its resend at once, as the MDS handles them: decide from the cache under the
/// lock, then apply under the lock, checking the cache again. It is carried out once, and both
/// get the first reply.
#[test]
fn a_resend_racing_its_first_attempt_is_carried_out_once() {
    loom::model(|| {
        // The namespace: the reply cache and how many times the change was applied.
        let ns = Arc::new(Mutex::new((ReplyCache::<u64>::default(), 0u64)));
        let attempt = |ns: Arc<Mutex<(ReplyCache<u64>, u64)>>| {
            if let Some(r) = ns.lock().unwrap().0.get(9, 1) {
                return *r;
            }
            // Allocation and the like happen here, without the lock.
            thread::yield_now();
            let mut g = ns.lock().unwrap();
            if let Some(r) = g.0.get(9, 1) {
                return *r;
            }
            g.1 += 1;
            let reply = 100 + g.1;
            g.0.record(9, 1, reply);
            reply
        };
        let resend = {
            let ns = ns.clone();
            thread::spawn(move || attempt(ns))
        };
        let first = attempt(ns.clone());
        assert_eq!(resend.join().unwrap(), first);
        assert_eq!(ns.lock().unwrap().1, 1, "carried out twice");
    });
}
