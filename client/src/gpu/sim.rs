//! A simulated GPU for tests: device memory the CPU cannot touch.
//!
//! Its memory is a memory file mapped twice. The **device view** is mapped with no access at
//! all and its addresses are the device pointers handed out: any CPU access to them from
//! lode's data path faults (the test dies with SIGSEGV). The **engine view** is writable and
//! used only by the simulated DMA engine (what a NIC with peer-to-peer access, or the GPU's
//! copy engine, does) and by the test's own device-to-host check ([`SimGpu::read_back`]).
//! Copies to the device run on an engine thread, in order, as a CUDA stream's do.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::{
    CopyTicket, DeviceBuf, DeviceDma, DeviceError, DeviceMemory, GpuBackend, GpuError, PinnedBuf,
};

/// Device allocations are aligned as CUDA's are.
const ALIGN: u64 = 256;

struct Views {
    /// The no-access mapping: device addresses.
    device: usize,
    /// The writable mapping of the same memory.
    engine: memmap2::MmapRaw,
    len: u64,
    _file: std::fs::File,
}

// SAFETY: `device` is an address range nothing dereferences; `engine` is accessed only
// through the bounds-checked copies below.
unsafe impl Send for Views {}
unsafe impl Sync for Views {}

impl Drop for Views {
    fn drop(&mut self) {
        // SAFETY: the device view was mapped by `SimGpu::new` with this length, and is not
        // used after the views are dropped.
        unsafe { libc::munmap(self.device as *mut libc::c_void, self.len as usize) };
    }
}

impl Views {
    /// The engine view's offset of `addr..addr+len`.
    fn offset(&self, addr: u64, len: u64) -> Result<usize, DeviceError> {
        let base = self.device as u64;
        addr.checked_sub(base)
            .filter(|off| off.checked_add(len).is_some_and(|e| e <= self.len))
            .map(|off| off as usize)
            .ok_or_else(|| DeviceError {
                addr,
                len,
                reason: "outside the simulated GPU's memory".into(),
            })
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), DeviceError> {
        let off = self.offset(addr, src.len() as u64)?;
        // SAFETY: `off..off+len` is inside the engine view (checked above); device memory
        // has no Rust references into it, only these copies.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.engine.as_mut_ptr().add(off),
                src.len(),
            )
        };
        Ok(())
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        let off = self.offset(addr, dst.len() as u64)?;
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.engine.as_ptr().add(off),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }
}

/// A copy's outcome, set by the engine, and the signal its waiter sleeps on.
type Done = (Mutex<Option<Result<(), DeviceError>>>, Condvar);

struct Copy {
    dst: u64,
    src: usize,
    len: usize,
    done: Arc<Done>,
}

struct Inner {
    ordinal: u32,
    views: Arc<Views>,
    /// Live allocations: offset to length.
    allocs: Mutex<BTreeMap<u64, u64>>,
    engine: Mutex<mpsc::Sender<Copy>>,
    dma_bytes: AtomicU64,
    copied_to_device: AtomicU64,
    copied_from_device: AtomicU64,
}

/// A simulated GPU. Cheap to clone; every clone is the same device.
#[derive(Clone)]
pub struct SimGpu {
    inner: Arc<Inner>,
}

/// The peer-to-peer side: what the simulated NIC uses for direct transfers.
struct SimDma {
    gpu: Arc<Inner>,
}

impl DeviceDma for SimDma {
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), DeviceError> {
        self.gpu.check_allocated(addr, src.len() as u64)?;
        self.gpu.views.write(addr, src)?;
        self.gpu
            .dma_bytes
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        self.gpu.check_allocated(addr, dst.len() as u64)?;
        self.gpu.views.read(addr, dst)?;
        self.gpu
            .dma_bytes
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl Inner {
    /// Refuses a range outside every live allocation (a use after free, or a wild pointer).
    fn check_allocated(&self, addr: u64, len: u64) -> Result<(), DeviceError> {
        let off = self.views.offset(addr, len)? as u64;
        let allocs = self.allocs.lock();
        let inside = allocs
            .range(..=off)
            .next_back()
            .is_some_and(|(&start, &n)| off + len <= start + n);
        if inside {
            Ok(())
        } else {
            Err(DeviceError {
                addr,
                len,
                reason: "not allocated on the simulated GPU".into(),
            })
        }
    }
}

/// An allocation of the simulated GPU, freed when dropped.
pub struct SimBuffer {
    gpu: SimGpu,
    buf: DeviceBuf,
}

impl SimBuffer {
    /// The device buffer: what a caller hands to lode.
    pub fn buf(&self) -> DeviceBuf {
        self.buf
    }
}

impl Drop for SimBuffer {
    fn drop(&mut self) {
        let off = self.buf.addr - self.gpu.inner.views.device as u64;
        self.gpu.inner.allocs.lock().remove(&off);
    }
}

impl SimGpu {
    /// A GPU with `capacity` bytes of memory, as device ordinal `ordinal`.
    pub fn new(capacity: u64, ordinal: u32) -> Result<SimGpu, GpuError> {
        let err =
            |what: &str| GpuError::Sim(format!("{what}: {}", std::io::Error::last_os_error()));
        if capacity == 0 || capacity > 1 << 40 {
            return Err(GpuError::Sim(format!(
                "capacity {capacity} is not in 1..=1 TiB"
            )));
        }
        // SAFETY: a plain system call with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"lode-sim-gpu".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(err("memfd_create"));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(capacity)
            .map_err(|e| GpuError::Sim(format!("sizing the memory file: {e}")))?;
        // SAFETY: a new mapping of the file, at an address the kernel picks; no access.
        let device = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity as usize,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if device == libc::MAP_FAILED {
            return Err(err("mapping the device view"));
        }
        let engine = memmap2::MmapOptions::new()
            .len(capacity as usize)
            .map_raw(&file);
        let engine = match engine {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: mapped just above with this length.
                unsafe { libc::munmap(device, capacity as usize) };
                return Err(GpuError::Sim(format!("mapping the engine view: {e}")));
            }
        };
        let views = Arc::new(Views {
            device: device as usize,
            engine,
            len: capacity,
            _file: file,
        });
        let (tx, rx) = mpsc::channel::<Copy>();
        let engine_views = views.clone();
        std::thread::Builder::new()
            .name("sim-gpu-copy".into())
            .spawn(move || {
                for c in rx {
                    // SAFETY: the caller of `copy_to_device` keeps `src..src+len` valid and
                    // unchanged until the ticket completes, which happens after this copy.
                    let src = unsafe { std::slice::from_raw_parts(c.src as *const u8, c.len) };
                    let r = engine_views.write(c.dst, src);
                    *c.done.0.lock() = Some(r);
                    c.done.1.notify_all();
                }
            })
            .map_err(|e| GpuError::Sim(format!("starting the copy engine: {e}")))?;
        Ok(SimGpu {
            inner: Arc::new(Inner {
                ordinal,
                views,
                allocs: Mutex::new(BTreeMap::new()),
                engine: Mutex::new(tx),
                dma_bytes: AtomicU64::new(0),
                copied_to_device: AtomicU64::new(0),
                copied_from_device: AtomicU64::new(0),
            }),
        })
    }

    /// Allocates `len` bytes of device memory (first fit), filled with `0xee` so that bytes
    /// lode failed to write stand out.
    pub fn alloc(&self, len: u64) -> Result<SimBuffer, GpuError> {
        let len = len.max(1);
        let cap = self.inner.views.len;
        let off = {
            let mut allocs = self.inner.allocs.lock();
            let mut at = 0u64;
            let mut found = None;
            for (&start, &n) in allocs.iter() {
                if start >= at + len {
                    found = Some(at);
                    break;
                }
                at = (start + n).div_ceil(ALIGN) * ALIGN;
            }
            let off = match found {
                Some(o) => o,
                None if at + len <= cap => at,
                None => {
                    return Err(GpuError::Sim(format!(
                        "out of memory: {len} bytes wanted of {cap}"
                    )))
                }
            };
            allocs.insert(off, len);
            off
        };
        let buf = DeviceBuf {
            addr: self.inner.views.device as u64 + off,
            len,
            ordinal: self.inner.ordinal,
        };
        self.inner
            .views
            .write(buf.addr, &vec![0xee; len as usize])?;
        Ok(SimBuffer {
            gpu: self.clone(),
            buf,
        })
    }

    /// The test's device-to-host check: the buffer's bytes, read through the engine view.
    pub fn read_back(&self, buf: &DeviceBuf) -> Result<Vec<u8>, GpuError> {
        let mut out = vec![0u8; buf.len as usize];
        self.inner.views.read(buf.addr, &mut out)?;
        Ok(out)
    }

    /// The test's host-to-device fill (what a kernel would have written).
    pub fn fill(&self, buf: &DeviceBuf, data: &[u8]) -> Result<(), GpuError> {
        if data.len() as u64 > buf.len {
            return Err(GpuError::Sim("more bytes than the buffer holds".into()));
        }
        Ok(self.inner.views.write(buf.addr, data)?)
    }

    /// Bytes the simulated NIC moved in and out of device memory (the direct path).
    pub fn dma_bytes(&self) -> u64 {
        self.inner.dma_bytes.load(Ordering::Relaxed)
    }

    /// Bytes the copy engine moved from host to device memory (the staged path).
    pub fn copied_to_device(&self) -> u64 {
        self.inner.copied_to_device.load(Ordering::Relaxed)
    }

    /// Bytes the copy engine moved from device to host memory (staged writes).
    pub fn copied_from_device(&self) -> u64 {
        self.inner.copied_from_device.load(Ordering::Relaxed)
    }
}

struct SimTicket {
    done: Arc<Done>,
}

impl CopyTicket for SimTicket {
    fn wait(self: Box<Self>) -> Result<(), GpuError> {
        let mut state = self.done.0.lock();
        loop {
            if let Some(r) = state.take() {
                return Ok(r?);
            }
            self.done.1.wait(&mut state);
        }
    }
}

impl GpuBackend for SimGpu {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn check(&self, buf: &DeviceBuf) -> Result<(), GpuError> {
        if buf.ordinal != self.inner.ordinal {
            return Err(self.not_mine(buf));
        }
        self.inner
            .check_allocated(buf.addr, buf.len)
            .map_err(|_| self.not_mine(buf))
    }

    fn ordinal_of(&self, addr: u64) -> Result<u32, GpuError> {
        self.inner.check_allocated(addr, 1)?;
        Ok(self.inner.ordinal)
    }

    fn device_memory(&self, buf: &DeviceBuf) -> Result<DeviceMemory, GpuError> {
        self.check(buf)?;
        Ok(DeviceMemory {
            addr: buf.addr,
            len: buf.len,
            ordinal: buf.ordinal,
            dma: Arc::new(SimDma {
                gpu: self.inner.clone(),
            }),
        })
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError> {
        Ok(PinnedBuf::host(len))
    }

    unsafe fn copy_to_device(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        _stream: u64,
    ) -> Result<Box<dyn CopyTicket>, GpuError> {
        self.inner.check_allocated(dst, len as u64)?;
        let done = Arc::new((Mutex::new(None), Condvar::new()));
        let copy = Copy {
            dst,
            src: src as usize,
            len,
            done: done.clone(),
        };
        self.inner
            .engine
            .lock()
            .send(copy)
            .map_err(|_| GpuError::Sim("the copy engine stopped".into()))?;
        self.inner
            .copied_to_device
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(Box::new(SimTicket { done }))
    }

    fn copy_from_device(&self, dst: &mut [u8], src: u64, _stream: u64) -> Result<(), GpuError> {
        self.inner.check_allocated(src, dst.len() as u64)?;
        self.inner.views.read(src, dst)?;
        self.inner
            .copied_from_device
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn zero(&self, dst: u64, len: u64, _stream: u64) -> Result<(), GpuError> {
        self.inner.check_allocated(dst, len)?;
        Ok(self.inner.views.write(dst, &vec![0u8; len as usize])?)
    }
}

impl SimGpu {
    fn not_mine(&self, buf: &DeviceBuf) -> GpuError {
        GpuError::NotDeviceMemory {
            backend: "sim",
            addr: buf.addr,
            len: buf.len,
            ordinal: buf.ordinal,
        }
    }
}
