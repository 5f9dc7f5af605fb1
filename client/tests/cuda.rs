//! The CUDA backend's own tests: on a machine without libcuda, opening it is an error (never a
//! panic) and the rest skip, saying so; with a GPU, copies round-trip through device memory.
//!
//! `cargo test -p lode-client --features cuda --test cuda -- --nocapture`

#![cfg(feature = "cuda")]

use client::gpu::cuda::CudaGpu;
use client::gpu::{DeviceBuf, GpuBackend, GpuError};
use cudarc::driver::sys;

fn gpu() -> Option<CudaGpu> {
    match CudaGpu::open() {
        Ok(g) => Some(g),
        Err(e) => {
            assert!(matches!(e, GpuError::NoBackend(_)), "{e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// Device memory from the driver, freed on drop.
struct DevMem(u64, usize);

impl DevMem {
    fn new(len: usize) -> DevMem {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: the library is loaded (CudaGpu::open succeeded) and its context is current
        // on this thread after any backend call.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, len) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        DevMem(p, len)
    }
    fn buf(&self) -> DeviceBuf {
        DeviceBuf {
            addr: self.0,
            len: self.1 as u64,
            ordinal: 0,
        }
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc above, freed once.
        unsafe { sys::cuMemFree_v2(self.0) };
    }
}

#[test]
fn opening_without_libcuda_is_an_error_and_with_it_the_driver_answers() {
    if let Some(g) = gpu() {
        assert_eq!(g.name(), "cuda");
    }
}

#[test]
fn copies_round_trip_through_device_memory_and_host_pointers_are_refused() {
    let Some(g) = gpu() else { return };
    // Any call makes the primary context current on this thread.
    let pinned = g.alloc_pinned(8 << 20).unwrap();
    drop(pinned);
    let mem = DevMem::new(8 << 20);
    g.check(&mem.buf()).unwrap();
    assert_eq!(g.ordinal_of(mem.0).unwrap(), 0);
    let data: Vec<u8> = (0..8 << 20).map(|i| (i * 31 % 251) as u8).collect();
    // SAFETY: `data` outlives the wait below.
    let ticket = unsafe { g.copy_to_device(mem.0, data.as_ptr(), data.len(), 0) }.unwrap();
    ticket.wait().unwrap();
    let mut back = vec![0u8; data.len()];
    g.copy_from_device(&mut back, mem.0, 0).unwrap();
    assert!(back == data);
    g.zero(mem.0 + 4096, 4096, 0).unwrap();
    g.copy_from_device(&mut back[..8192], mem.0, 0).unwrap();
    assert!(back[4096..8192].iter().all(|&b| b == 0) && back[..4096] == data[..4096]);
    // Host memory is not device memory.
    let host = DeviceBuf {
        addr: data.as_ptr() as u64,
        len: 4096,
        ordinal: 0,
    };
    assert!(matches!(
        g.check(&host),
        Err(GpuError::NotDeviceMemory { .. })
    ));
    // Where the driver exports dma-buf, the direct path's registration can use it.
    let dm = g.device_memory(&mem.buf()).unwrap();
    match dm.dma.dmabuf(dm.addr, dm.len) {
        Some((_fd, offset)) => eprintln!("dma-buf exported (offset {offset})"),
        None => eprintln!("this driver exports no dma-buf: the direct path needs it"),
    }
}
