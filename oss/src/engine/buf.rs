//! Aligned buffers: what O_DIRECT needs, and what the engines hand back when an operation ends.
//!
//! Buffers come from a pool of power-of-two size classes and go back to it when dropped, so the
//! I/O path does not pay for fresh pages (page faults and kernel zeroing) on every operation.
//! The pool is bounded per class; past the bound, buffers are freed.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use parking_lot::Mutex;

/// Smallest and largest pooled sizes: 4 KiB and 32 MiB.
const MIN_CLASS: u32 = 12;
const MAX_CLASS: u32 = 25;
/// Bytes kept idle per size class (at least 4 buffers).
const POOL_BYTES_PER_CLASS: usize = 64 << 20;

struct Idle(NonNull<u8>);

// SAFETY: an idle pooled allocation is owned by the pool alone.
unsafe impl Send for Idle {}

static POOL: Mutex<Vec<Vec<Idle>>> = Mutex::new(Vec::new());

fn class_of(cap: usize) -> Option<u32> {
    let c = cap.next_power_of_two().trailing_zeros().max(MIN_CLASS);
    (c <= MAX_CLASS).then_some(c)
}

/// Alignment of every buffer: the largest logical block size of common NVMe devices.
pub const ALIGN: usize = 4096;

/// A heap buffer aligned to [`ALIGN`], zeroed when allocated. Its length is fixed.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let mut b = Self::reused(len);
        b.fill(0);
        b
    }

    /// A buffer of `len` bytes whose contents are left over from an earlier use: the caller
    /// must overwrite every byte it will read.
    pub fn reused(len: usize) -> AlignedBuf {
        let want = len.div_ceil(ALIGN).max(1) * ALIGN;
        let cap = class_of(want).map_or(want, |c| 1usize << c);
        // ALIGN is a power of two and cap a multiple of it, so the layout is valid.
        let layout = Layout::from_size_align(cap, ALIGN).expect("aligned layout");
        if let Some(c) = class_of(cap) {
            if let Some(Idle(ptr)) = POOL.lock().get_mut(c as usize).and_then(Vec::pop) {
                return AlignedBuf { ptr, len, layout };
            }
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len, layout }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for `len` initialised (zeroed at allocation) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref, and &mut self makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let cap = self.layout.size();
        if let Some(c) = class_of(cap).filter(|&c| 1usize << c == cap) {
            let mut pool = POOL.lock();
            if pool.len() <= c as usize {
                pool.resize_with(c as usize + 1, Vec::new);
            }
            let class = &mut pool[c as usize];
            if class.len() < (POOL_BYTES_PER_CLASS / cap).max(4) {
                class.push(Idle(self.ptr));
                return;
            }
        }
        // SAFETY: allocated in `reused` with this same layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: heap memory that does not move with the value, of fixed length.
unsafe impl lnet::DmaBuffer for AlignedBuf {
    fn dma_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn dma_len(&self) -> usize {
        self.len
    }
}
