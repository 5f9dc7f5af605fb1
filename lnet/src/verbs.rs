//! The verbs backend: RDMA hardware through libibverbs.
//!
//! Built on sideway, which links a small shim and loads the real libibverbs and its provider
//! libraries at run time, so this compiles on machines without RDMA libraries and fails with
//! [`NetError::NoRdmaDevice`] (never a panic) on machines without an RDMA device.
//!
//! What is here: device discovery, opening a device with a protection domain, and registering
//! a [`Registered`] region with the NIC so its key is a real rkey: host memory with
//! `ibv_reg_mr`, GPU memory with `ibv_reg_dmabuf_mr` on the dma-buf its driver exports. The queue-pair data path
//! (connection setup through rdma_cm, RDMA READ/WRITE for bulk, SEND/RECV for RPC) is the next
//! step and needs hardware or soft-RoCE to test; see `docs/network.md`.

use std::sync::Arc;

use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::AccessFlags;

use crate::device::DeviceMemory;
use crate::error::NetError;
use crate::region::{DmaBuffer, Registered};

/// The names of the RDMA devices on this machine (`mlx5_0`, `rxe0`...).
pub fn device_names() -> Result<Vec<String>, NetError> {
    let list = DeviceList::new()
        .map_err(|e| NetError::NoRdmaDevice(format!("cannot list devices: {e}")))?;
    Ok(list.iter().map(|d| d.name()).collect())
}

/// An opened RDMA device and its protection domain.
pub struct VerbsNic {
    name: String,
    _ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
}

impl VerbsNic {
    /// Opens the device called `name`, or the first one.
    pub fn open(name: Option<&str>) -> Result<VerbsNic, NetError> {
        let list = DeviceList::new()
            .map_err(|e| NetError::NoRdmaDevice(format!("cannot list devices: {e}")))?;
        let device = list
            .iter()
            .find(|d| name.is_none_or(|n| d.name() == n))
            .ok_or_else(|| {
                NetError::NoRdmaDevice(match name {
                    Some(n) => format!("no device called {n:?}"),
                    None => "this machine has no RDMA device".to_owned(),
                })
            })?;
        let dev_name = device.name();
        let ctx = device
            .open()
            .map_err(|e| NetError::NoRdmaDevice(format!("cannot open {dev_name}: {e}")))?;
        let pd = ctx.alloc_pd().map_err(|e| {
            NetError::NoRdmaDevice(format!(
                "cannot allocate a protection domain on {dev_name}: {e}"
            ))
        })?;
        Ok(VerbsNic {
            name: dev_name,
            _ctx: ctx,
            pd,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Registers a region with the NIC for local and remote reads and writes.
    pub fn register<B: DmaBuffer>(&self, region: &Registered<B>) -> Result<VerbsMr, NetError> {
        let (ptr, len, keep) = region.raw_parts();
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        // SAFETY: `ptr..ptr+len` is the region's memory, valid while the region lives; `keep`
        // holds the region alive for as long as the memory registration exists.
        let mr = unsafe { self.pd.reg_mr(ptr as usize, len, access) }.map_err(|e| {
            NetError::NoRdmaDevice(format!("memory registration on {} failed: {e}", self.name))
        })?;
        Ok(VerbsMr { mr, _keep: keep })
    }

    /// Registers a device memory region through the dma-buf its GPU driver exports, so the
    /// NIC reads and writes GPU memory with no host copy. Fails where the driver exports no
    /// dma-buf; the client then stages through pinned host memory.
    pub fn register_device(
        &self,
        region: &Registered<DeviceMemory>,
        mem: &DeviceMemory,
    ) -> Result<VerbsMr, NetError> {
        use std::os::fd::AsRawFd;
        let (_, len, keep) = region.raw_parts();
        let (fd, offset) = mem.dma.dmabuf(mem.addr, mem.len).ok_or_else(|| {
            NetError::NoDeviceMemory(format!(
                "GPU {} exports no dma-buf for {:#x}+{}",
                mem.ordinal, mem.addr, mem.len
            ))
        })?;
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        // SAFETY: `fd` is a dma-buf the GPU driver exported for `addr..addr+len` at `offset`,
        // kept open for the call; `keep` holds the region (and so the device memory's owner)
        // alive for as long as the registration exists.
        let mr = unsafe {
            self.pd
                .reg_dmabuf_mr(offset, len, mem.addr, fd.as_raw_fd(), access)
        }
        .map_err(|e| {
            NetError::NoDeviceMemory(format!(
                "dma-buf registration of GPU {} memory on {} failed: {e}",
                mem.ordinal, self.name
            ))
        })?;
        Ok(VerbsMr { mr, _keep: keep })
    }
}

/// A region registered with the NIC.
pub struct VerbsMr {
    mr: Arc<MemoryRegion>,
    _keep: crate::region::KeepAlive,
}

impl VerbsMr {
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
}
