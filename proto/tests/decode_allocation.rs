//! Decoding hostile bytes must never allocate more than the bytes themselves hold: a lying
//! length prefix cannot make a server reserve memory it was never sent.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use proto::frame::decode_frame;
use proto::msg::{decode_body, BulkDone, BulkRead, BulkWrite, Echo, Ping, Pong};

struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; only counts requested sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocated_by(f: impl FnOnce()) -> usize {
    let before = ALLOCATED.with(|a| a.get());
    f();
    ALLOCATED.with(|a| a.get()) - before
}

/// Error messages are formatted into a String; that is bounded by a constant, not by input.
const ERROR_SLACK: usize = 256;

proptest! {
    #[test]
    fn decoding_random_bodies_allocates_at_most_their_length(
        body in proptest::collection::vec(any::<u8>(), 0..2048)
    ) {
        let used = allocated_by(|| {
            let _ = decode_body::<Ping>(&body);
            let _ = decode_body::<Pong>(&body);
            let _ = decode_body::<Echo>(&body);
            let _ = decode_body::<BulkRead>(&body);
            let _ = decode_body::<BulkWrite>(&body);
            let _ = decode_body::<BulkDone>(&body);
            let _ = decode_body::<proto::RemoteError>(&body);
            let _ = decode_body::<proto::ost::OstWrite>(&body);
            let _ = decode_body::<proto::ost::OstRead>(&body);
            let _ = decode_body::<proto::registry::RegisterTargets>(&body);
            let _ = decode_body::<proto::registry::TargetList>(&body);
        });
        // Eleven decoders, each keeping at most a fixed factor of the body (sequences grow with
        // the elements they decode, never with the count they claim) plus one error message.
        prop_assert!(used <= 11 * (8 * body.len() + ERROR_SLACK), "{} bytes for a {}-byte body", used, body.len());
    }

    #[test]
    fn decoding_random_frames_allocates_nothing(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let used = allocated_by(|| { let _ = decode_frame(&bytes); });
        prop_assert_eq!(used, 0);
    }
}

#[test]
fn a_lying_sequence_length_does_not_reserve_memory() {
    // A TargetList claiming 60 000 entries, followed by nothing.
    let body = [0xe0, 0xd4, 0x03];
    let used = allocated_by(|| assert!(decode_body::<proto::registry::TargetList>(&body).is_err()));
    assert!(used <= ERROR_SLACK, "{used} bytes allocated");
}

#[test]
fn a_lying_length_prefix_does_not_reserve_memory() {
    // An Echo whose byte-string length claims 2^32 - 1 bytes, followed by almost nothing.
    let body = [0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3];
    let used = allocated_by(|| assert!(decode_body::<Echo>(&body).is_err()));
    assert!(used <= ERROR_SLACK, "{used} bytes allocated");
}
