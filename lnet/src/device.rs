//! Device memory (a GPU's) as a bulk-transfer endpoint.
//!
//! A device address is a number lode never dereferences on the CPU. A transport that can
//! reach device memory (an RDMA NIC with the GPU's memory registered through dma-buf, or the
//! simulated fabric) moves bulk bytes in and out of it through the device's DMA engine, which
//! [`DeviceDma`] stands for; every other transport refuses the registration, and the client
//! stages through pinned host memory instead.

use std::fmt;
use std::sync::Arc;

/// What a NIC with peer-to-peer access does to device memory: writes and reads by device
/// address. Implemented by a GPU backend for the memory it owns.
pub trait DeviceDma: Send + Sync + 'static {
    /// Copies `src` to device address `addr`.
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), DeviceError>;
    /// Copies from device address `addr` into `dst`.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), DeviceError>;
    /// A dma-buf exporting `addr..addr+len` and the range's offset in it, for a NIC to
    /// register (`ibv_reg_dmabuf_mr`); `None` where the driver exports none.
    fn dmabuf(&self, addr: u64, len: u64) -> Option<(std::os::fd::OwnedFd, u64)> {
        let _ = (addr, len);
        None
    }
}

/// A device memory access that could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device memory {addr:#x}+{len}: {reason}")]
pub struct DeviceError {
    pub addr: u64,
    pub len: u64,
    pub reason: String,
}

/// A range of one device's memory: its address, length and device ordinal, and the engine
/// that reaches it.
#[derive(Clone)]
pub struct DeviceMemory {
    pub addr: u64,
    pub len: u64,
    pub ordinal: u32,
    pub dma: Arc<dyn DeviceDma>,
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceMemory {{ gpu {}, {:#x}+{} }}",
            self.ordinal, self.addr, self.len
        )
    }
}

/// Where a registered region's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Ordinary (or pinned) host memory, reached by the CPU.
    Host,
    /// Device memory of the GPU with this ordinal, never touched by the CPU.
    Device { ordinal: u32 },
}
