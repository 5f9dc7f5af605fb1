//! The CUDA backend, through cudarc's driver API loaded at run time: the library builds
//! without CUDA, and [`CudaGpu::open`] looks for libcuda before making any CUDA call (one
//! made without it would panic inside the loader).
//!
//! Device pointers are checked with `cuPointerGetAttribute` (device memory, and on which
//! GPU); staging chunks are page-locked with `cuMemHostAlloc`; copies to the device are
//! `cuMemcpyHtoDAsync` on the caller's stream, each followed by an event the ticket waits
//! on; for the direct path on an RDMA NIC, device memory is exported as a dma-buf with
//! `cuMemGetHandleForAddressRange`.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::{
    CopyTicket, DeviceBuf, DeviceDma, DeviceError, DeviceMemory, GpuBackend, GpuError, PinnedBuf,
};

fn check(what: &str, r: sys::CUresult) -> Result<(), GpuError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut s: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the library is loaded (every caller runs after `open` succeeded); the string
    // returned is static.
    let text = unsafe {
        if sys::cuGetErrorString(r, &mut s) == sys::CUresult::CUDA_SUCCESS && !s.is_null() {
            std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned()
        } else {
            format!("{r:?}")
        }
    };
    Err(GpuError::Cuda(format!("{what}: {text}")))
}

/// The primary contexts of the GPUs this process uses.
struct Contexts {
    ctx: parking_lot::Mutex<std::collections::HashMap<u32, usize>>,
}

impl Contexts {
    /// Makes GPU `ordinal`'s primary context current on this thread.
    fn enter(&self, ordinal: u32) -> Result<(), GpuError> {
        let mut map = self.ctx.lock();
        let ctx = match map.get(&ordinal) {
            Some(c) => *c as sys::CUcontext,
            None => {
                let mut dev: sys::CUdevice = 0;
                let mut ctx: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: plain driver calls with out-pointers to locals.
                unsafe {
                    check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal as i32))?;
                    check(
                        "cuDevicePrimaryCtxRetain",
                        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                    )?;
                }
                map.insert(ordinal, ctx as usize);
                ctx
            }
        };
        // SAFETY: a context retained above and never released while the process runs.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
    }
}

/// CUDA, found at run time.
pub struct CudaGpu {
    contexts: Arc<Contexts>,
}

impl CudaGpu {
    /// Loads libcuda and initialises the driver; an error (never a panic) where there is
    /// none.
    pub fn open() -> Result<CudaGpu, GpuError> {
        // SAFETY: only tries to load the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoBackend(
                "libcuda (the NVIDIA driver) was not found".into(),
            ));
        }
        // SAFETY: the library is present.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        Ok(CudaGpu {
            contexts: Arc::new(Contexts {
                ctx: parking_lot::Mutex::new(std::collections::HashMap::new()),
            }),
        })
    }

    fn not_device(&self, buf: &DeviceBuf) -> GpuError {
        GpuError::NotDeviceMemory {
            backend: "cuda",
            addr: buf.addr,
            len: buf.len,
            ordinal: buf.ordinal,
        }
    }
}

/// The direct path's view of CUDA memory: a NIC registers it through dma-buf; copies by
/// address are for transports that move bytes themselves.
struct CudaDma {
    contexts: Arc<Contexts>,
    ordinal: u32,
}

impl CudaDma {
    fn fail(addr: u64, len: usize, e: GpuError) -> DeviceError {
        DeviceError {
            addr,
            len: len as u64,
            reason: e.to_string(),
        }
    }
}

impl DeviceDma for CudaDma {
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), DeviceError> {
        let fail = |e| Self::fail(addr, src.len(), e);
        self.contexts.enter(self.ordinal).map_err(fail)?;
        // SAFETY: `addr` was checked to be device memory of this GPU; `src` is valid.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(addr, src.as_ptr().cast(), src.len())
        })
        .map_err(fail)
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        let len = dst.len();
        let fail = |e| Self::fail(addr, len, e);
        self.contexts.enter(self.ordinal).map_err(fail)?;
        // SAFETY: as in `write`.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), addr, len)
        })
        .map_err(fail)
    }

    fn dmabuf(&self, addr: u64, len: u64) -> Option<(OwnedFd, u64)> {
        self.contexts.enter(self.ordinal).ok()?;
        // dma-buf exports whole pages: the range rounded out, and the offset into it.
        let page = 1u64 << 16;
        let start = addr & !(page - 1);
        let size = (addr + len).div_ceil(page) * page - start;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: `fd` receives a new file descriptor on success.
        let r = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::ffi::c_int).cast(),
                start,
                size as usize,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || fd < 0 {
            return None;
        }
        // SAFETY: the driver handed us this descriptor to own.
        Some((unsafe { OwnedFd::from_raw_fd(fd) }, addr - start))
    }
}

struct CudaTicket {
    contexts: Arc<Contexts>,
    ordinal: u32,
    event: usize,
}

impl CopyTicket for CudaTicket {
    fn wait(self: Box<Self>) -> Result<(), GpuError> {
        self.contexts.enter(self.ordinal)?;
        let event = self.event as sys::CUevent;
        // SAFETY: an event created and recorded by `copy_to_device`, destroyed once, here.
        unsafe {
            let r = check("cuEventSynchronize", sys::cuEventSynchronize(event));
            sys::cuEventDestroy_v2(event);
            r
        }
    }
}

impl GpuBackend for CudaGpu {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn check(&self, buf: &DeviceBuf) -> Result<(), GpuError> {
        self.contexts.enter(buf.ordinal)?;
        let mut kind: std::ffi::c_uint = 0;
        let mut ordinal: std::ffi::c_int = -1;
        // SAFETY: out-pointers to locals of the attribute's type.
        unsafe {
            check(
                "cuPointerGetAttribute",
                sys::cuPointerGetAttribute(
                    (&mut kind as *mut std::ffi::c_uint).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    buf.addr,
                ),
            )
            .map_err(|_| self.not_device(buf))?;
            check(
                "cuPointerGetAttribute",
                sys::cuPointerGetAttribute(
                    (&mut ordinal as *mut std::ffi::c_int).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    buf.addr,
                ),
            )
            .map_err(|_| self.not_device(buf))?;
        }
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as std::ffi::c_uint
            || ordinal != buf.ordinal as std::ffi::c_int
        {
            return Err(self.not_device(buf));
        }
        Ok(())
    }

    fn ordinal_of(&self, addr: u64) -> Result<u32, GpuError> {
        self.device_of(addr)
    }

    fn device_memory(&self, buf: &DeviceBuf) -> Result<DeviceMemory, GpuError> {
        self.check(buf)?;
        Ok(DeviceMemory {
            addr: buf.addr,
            len: buf.len,
            ordinal: buf.ordinal,
            dma: Arc::new(CudaDma {
                contexts: self.contexts.clone(),
                ordinal: buf.ordinal,
            }),
        })
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError> {
        self.contexts.enter(0)?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `p` receives the allocation.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        let contexts = self.contexts.clone();
        // SAFETY: the driver's allocation of `len` bytes, freed once by the closure.
        Ok(unsafe {
            PinnedBuf::from_raw(
                p.cast(),
                len,
                Box::new(move |ptr, _| {
                    if contexts.enter(0).is_ok() {
                        sys::cuMemFreeHost(ptr.cast());
                    }
                }),
            )
        })
    }

    unsafe fn copy_to_device(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: u64,
    ) -> Result<Box<dyn CopyTicket>, GpuError> {
        let ordinal = self.device_of(dst)?;
        self.contexts.enter(ordinal)?;
        let stream = stream as usize as sys::CUstream;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the caller keeps `src..src+len` valid until the ticket is waited on; the
        // event is destroyed by the ticket.
        unsafe {
            check(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream),
            )?;
            check(
                "cuEventCreate",
                sys::cuEventCreate(
                    &mut event,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as std::ffi::c_uint,
                ),
            )?;
            if let Err(e) = check("cuEventRecord", sys::cuEventRecord(event, stream)) {
                sys::cuEventDestroy_v2(event);
                return Err(e);
            }
        }
        Ok(Box::new(CudaTicket {
            contexts: self.contexts.clone(),
            ordinal,
            event: event as usize,
        }))
    }

    fn copy_from_device(&self, dst: &mut [u8], src: u64, stream: u64) -> Result<(), GpuError> {
        let ordinal = self.device_of(src)?;
        self.contexts.enter(ordinal)?;
        let stream = stream as usize as sys::CUstream;
        // SAFETY: `dst` is valid for its length; the stream is synchronised before return.
        unsafe {
            check(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), stream),
            )?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(stream))
        }
    }

    fn zero(&self, dst: u64, len: u64, stream: u64) -> Result<(), GpuError> {
        let ordinal = self.device_of(dst)?;
        self.contexts.enter(ordinal)?;
        let stream = stream as usize as sys::CUstream;
        // SAFETY: `dst..dst+len` was checked to be device memory by the caller.
        unsafe {
            check(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(dst, 0, len as usize, stream),
            )?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(stream))
        }
    }
}

impl CudaGpu {
    /// The GPU of `addr` (unified addressing answers from any context).
    fn device_of(&self, addr: u64) -> Result<u32, GpuError> {
        self.contexts.enter(0)?;
        let mut ordinal: std::ffi::c_int = -1;
        // SAFETY: an out-pointer to a local of the attribute's type.
        check("cuPointerGetAttribute", unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut std::ffi::c_int).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        })?;
        u32::try_from(ordinal).map_err(|_| GpuError::Cuda(format!("{addr:#x} is not on a GPU")))
    }
}
