//! GPU memory as a destination (and a source) of file I/O.
//!
//! A [`DeviceBuf`] is an address and a length on one GPU, which lode never dereferences on
//! the CPU. A read into one ([`crate::File::read_device`]) takes one of two paths:
//!
//! - **direct**: the buffer is registered with the transport as device memory and the storage
//!   servers' bulk transfers land in it, as an RDMA NIC does with GPU memory registered
//!   through dma-buf. No byte passes through host memory. The client cannot see the bytes,
//!   so they are verified by the server only (it checks its stored checksums before sending).
//! - **staged**: stripes land in a ring of pinned host chunks, are checked there against the
//!   crc32c the server took from the data it read (end to end), and are copied to the device
//!   on the caller's stream, chunk by chunk as they arrive, so the network and the copies
//!   overlap.
//!
//! [`IoPath::Auto`] takes the direct path where the transport can reach device memory and
//! the staged path otherwise; [`IoPath::Direct`] that cannot be honoured is an error, never a
//! silent fallback. Every [`Completion`] says which path ran, what was verified, how many
//! bytes went through host staging and, for a fallback, why.
//!
//! The GPU itself is a [`GpuBackend`]: none (the default build), CUDA (feature `cuda`,
//! loading libcuda at run time), or [`sim::SimGpu`], a simulated GPU whose memory the CPU
//! cannot touch, for tests.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod sim;
pub(crate) mod staging;

use std::fmt;
use std::sync::Arc;

pub use lnet::{DeviceDma, DeviceError, DeviceMemory, MemoryKind};

/// A buffer in device memory: an address, a length and the GPU's ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBuf {
    pub addr: u64,
    pub len: u64,
    pub ordinal: u32,
}

impl DeviceBuf {
    /// `len` bytes from `offset` into the buffer, if they lie inside it.
    pub fn slice(&self, offset: u64, len: u64) -> Option<DeviceBuf> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| DeviceBuf {
            addr: self.addr + offset,
            len,
            ordinal: self.ordinal,
        })
    }
}

/// Which path a device read or write is to take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoPath {
    /// Direct where the transport reaches device memory, staged elsewhere (said in the
    /// completion).
    #[default]
    Auto,
    /// Direct, or an error.
    Direct,
    /// Through pinned host memory.
    Staged,
}

impl std::str::FromStr for IoPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoPath::Auto),
            "direct" => Ok(IoPath::Direct),
            "staged" => Ok(IoPath::Staged),
            other => Err(format!("{other:?}: the path is auto, direct or staged")),
        }
    }
}

/// The path a device read or write took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathTaken {
    Direct,
    Staged,
}

/// What checked the bytes of a device read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// The client checked the bytes in its own memory against the crc32c the server took
    /// from its verified data (reads), or the server checked them against the crc32c the
    /// client took from its memory (writes).
    EndToEnd,
    /// The server checked its stored checksums before sending (reads) or checksummed what it
    /// received (writes); the client could not see the bytes.
    ServerOnly,
}

/// How a device read or write is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceIo {
    pub path: IoPath,
    /// The CUDA stream the copies are ordered on (0: the default stream).
    pub stream: u64,
}

/// What a device read or write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Bytes read (short only at the end of the file) or written.
    pub bytes: u64,
    pub path: PathTaken,
    pub verified: Verified,
    /// Bytes that passed through pinned host memory (0 on the direct path).
    pub staged_bytes: u64,
    /// Why the direct path was not taken, when `IoPath::Auto` fell back to staging.
    pub fallback: Option<String>,
}

impl Completion {
    /// `bytes` moved straight between device memory and the storage servers.
    pub fn direct(bytes: u64) -> Completion {
        Completion {
            bytes,
            path: PathTaken::Direct,
            verified: Verified::ServerOnly,
            staged_bytes: 0,
            fallback: None,
        }
    }

    /// `bytes` moved through the staging ring, and why, if direct was wanted.
    pub fn staged(bytes: u64, fallback: Option<String>) -> Completion {
        Completion {
            bytes,
            path: PathTaken::Staged,
            verified: Verified::EndToEnd,
            staged_bytes: bytes,
            fallback,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU backend: {0}")]
    NoBackend(String),
    #[error("{addr:#x}+{len} is not memory of {backend} GPU {ordinal}")]
    NotDeviceMemory {
        backend: &'static str,
        addr: u64,
        len: u64,
        ordinal: u32,
    },
    #[error("the direct path is not available: {0}")]
    DirectUnavailable(String),
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("simulated GPU: {0}")]
    Sim(String),
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The host staging ring could not give a chunk (closed, or its memory not registered).
    #[error("staging ring: {0}")]
    Staging(String),
}

/// A copy to the device in flight; `wait` returns once it is done.
pub trait CopyTicket: Send {
    fn wait(self: Box<Self>) -> Result<(), GpuError>;
}

/// A GPU as the client uses it: its memory for direct transfers, pinned host memory for
/// staging, and its copy engine.
pub trait GpuBackend: Send + Sync + 'static {
    /// `none`, `cuda` or `sim`.
    fn name(&self) -> &'static str;

    /// Checks that `buf` is device memory this backend can copy to and from.
    fn check(&self, buf: &DeviceBuf) -> Result<(), GpuError>;

    /// The ordinal of the GPU whose memory `addr` is.
    fn ordinal_of(&self, addr: u64) -> Result<u32, GpuError>;

    /// `buf` as a NIC reaches it, for the direct path; an error says why it cannot be.
    fn device_memory(&self, buf: &DeviceBuf) -> Result<DeviceMemory, GpuError>;

    /// `len` bytes of pinned host memory, for staging.
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError>;

    /// Starts copying `len` bytes from `src` to device address `dst`, ordered on `stream`.
    ///
    /// # Safety
    /// `src..src+len` must stay valid, and unchanged, until the ticket's `wait` returns.
    unsafe fn copy_to_device(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: u64,
    ) -> Result<Box<dyn CopyTicket>, GpuError>;

    /// Copies `dst.len()` bytes from device address `src` into `dst`, ordered on `stream`,
    /// and waits for the copy.
    fn copy_from_device(&self, dst: &mut [u8], src: u64, stream: u64) -> Result<(), GpuError>;

    /// Sets `len` bytes at device address `dst` to zero (holes of a sparse file), ordered on
    /// `stream`, and waits.
    fn zero(&self, dst: u64, len: u64, stream: u64) -> Result<(), GpuError>;
}

/// A client's GPU backend, chosen in its configuration.
#[derive(Clone)]
pub struct Gpu(pub Arc<dyn GpuBackend>);

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gpu({})", self.0.name())
    }
}

impl Gpu {
    /// CUDA where this build has it and the machine has libcuda, else none.
    pub fn detect() -> Gpu {
        #[cfg(feature = "cuda")]
        {
            match cuda::CudaGpu::open() {
                Ok(g) => return Gpu(Arc::new(g)),
                Err(e) => tracing::debug!(error = %e, "no CUDA: device buffers are refused"),
            }
        }
        Gpu(Arc::new(NoGpu))
    }
}

/// No GPU: every device buffer is refused, with the reason.
pub struct NoGpu;

impl NoGpu {
    fn refuse<T>(&self) -> Result<T, GpuError> {
        Err(GpuError::NoBackend(if cfg!(feature = "cuda") {
            "libcuda was not found on this machine".into()
        } else {
            "this build has no CUDA support (feature `cuda`)".into()
        }))
    }
}

impl GpuBackend for NoGpu {
    fn name(&self) -> &'static str {
        "none"
    }
    fn check(&self, _: &DeviceBuf) -> Result<(), GpuError> {
        self.refuse()
    }
    fn ordinal_of(&self, _: u64) -> Result<u32, GpuError> {
        self.refuse()
    }
    fn device_memory(&self, _: &DeviceBuf) -> Result<DeviceMemory, GpuError> {
        self.refuse()
    }
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError> {
        Ok(PinnedBuf::host(len))
    }
    unsafe fn copy_to_device(
        &self,
        _: u64,
        _: *const u8,
        _: usize,
        _: u64,
    ) -> Result<Box<dyn CopyTicket>, GpuError> {
        self.refuse()
    }
    fn copy_from_device(&self, _: &mut [u8], _: u64, _: u64) -> Result<(), GpuError> {
        self.refuse()
    }
    fn zero(&self, _: u64, _: u64, _: u64) -> Result<(), GpuError> {
        self.refuse()
    }
}

/// Host memory for staging: page-locked by the GPU driver where there is one, so its copy
/// engine reads it without another bounce.
pub struct PinnedBuf {
    ptr: *mut u8,
    len: usize,
    /// Gives the memory back (the driver's free, or the Vec's drop).
    free: Option<Box<dyn FnOnce(*mut u8, usize) + Send + Sync>>,
}

// SAFETY: the memory is owned by this value alone; the pointer is not shared.
unsafe impl Send for PinnedBuf {}
unsafe impl Sync for PinnedBuf {}

impl PinnedBuf {
    /// Ordinary host memory (a backend without page-locking).
    pub fn host(len: usize) -> PinnedBuf {
        let mut v = vec![0u8; len].into_boxed_slice();
        let ptr = v.as_mut_ptr();
        std::mem::forget(v);
        PinnedBuf {
            ptr,
            len,
            free: Some(Box::new(|ptr, len| {
                // SAFETY: `ptr, len` came from the boxed slice forgotten above.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
            })),
        }
    }

    /// Memory a driver allocated; `free` gives it back.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes until `free` is called with it, and
    /// owned by nothing else.
    pub unsafe fn from_raw(
        ptr: *mut u8,
        len: usize,
        free: Box<dyn FnOnce(*mut u8, usize) + Send + Sync>,
    ) -> PinnedBuf {
        PinnedBuf {
            ptr,
            len,
            free: Some(free),
        }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        if let Some(free) = self.free.take() {
            free(self.ptr, self.len);
        }
    }
}

// SAFETY: the pointer is valid for `len` bytes for as long as the value lives and does not
// move with it (heap or driver memory).
unsafe impl lnet::DmaBuffer for PinnedBuf {
    fn dma_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn dma_len(&self) -> usize {
        self.len
    }
}
