//! GPU buffers from Python: CUDA tensors and anything with `__cuda_array_interface__` or
//! DLPack, found on the GPU backend, with the stream their copies are ordered on; and the
//! simulated GPU (`lode.SimGpu`) for tests on machines without one.

use std::sync::Arc;

use client::gpu::sim::{SimBuffer, SimGpu as Sim};
use client::gpu::{Completion, DeviceBuf, Gpu, GpuBackend, IoPath, PathTaken, Verified};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// DLPack's device types of GPU memory the CUDA driver reaches.
const KDL_CUDA: i64 = 2;
const KDL_CUDA_MANAGED: i64 = 13;

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut std::ffi::c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// A device buffer from a Python object, which is kept alive with it.
pub struct DeviceTarget {
    pub buf: DeviceBuf,
    pub stream: u64,
    _keep: Vec<Py<PyAny>>,
}

fn contiguous(shape: &[i64], strides: Option<&[i64]>, itemsize: i64) -> bool {
    let Some(strides) = strides else { return true };
    let mut want = itemsize;
    for (n, s) in shape.iter().zip(strides).rev() {
        if *n > 1 && *s != want {
            return false;
        }
        want *= n;
    }
    true
}

/// The stream a copy into `obj` is ordered on: the current PyTorch stream of its device for
/// a tensor, the producer's stream of `__cuda_array_interface__`, else the default stream.
fn stream_of(obj: &Bound<'_, PyAny>, iface_stream: Option<u64>) -> PyResult<u64> {
    let module = obj.get_type().module()?.to_string();
    if module.starts_with("torch") {
        let torch = obj.py().import("torch")?;
        let stream = torch
            .getattr("cuda")?
            .call_method1("current_stream", (obj.getattr("device")?,))?;
        return stream.getattr("cuda_stream")?.extract();
    }
    Ok(iface_stream.unwrap_or(0))
}

/// `obj` as a device buffer, if it is GPU memory; `None` for host memory.
pub fn device_target(
    obj: &Bound<'_, PyAny>,
    gpu: impl Fn() -> Arc<dyn GpuBackend>,
) -> PyResult<Option<DeviceTarget>> {
    let py = obj.py();
    if let Ok(iface) = obj.getattr("__cuda_array_interface__") {
        let iface = iface.downcast::<PyDict>()?;
        let item = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            iface.get_item(k)?.ok_or_else(|| {
                PyValueError::new_err(format!("__cuda_array_interface__ has no {k:?}"))
            })
        };
        let (ptr, readonly): (u64, bool) = item("data")?.extract()?;
        if readonly {
            return Err(PyValueError::new_err("the device buffer is read-only"));
        }
        let shape: Vec<i64> = item("shape")?.extract()?;
        let typestr: String = item("typestr")?.extract()?;
        let itemsize: i64 = typestr
            .get(2..)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| PyValueError::new_err(format!("bad typestr {typestr:?}")))?;
        let strides: Option<Vec<i64>> = match iface.get_item("strides")? {
            Some(s) if !s.is_none() => Some(s.extract()?),
            _ => None,
        };
        if !contiguous(&shape, strides.as_deref(), itemsize) {
            return Err(PyValueError::new_err(
                "the device buffer must be contiguous",
            ));
        }
        let len = shape.iter().product::<i64>().max(0) * itemsize;
        let iface_stream = match iface.get_item("stream")? {
            Some(s) if !s.is_none() => Some(s.extract::<u64>()?),
            _ => None,
        };
        let stream = stream_of(obj, iface_stream)?;
        let ordinal = gpu()
            .ordinal_of(ptr)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        return Ok(Some(DeviceTarget {
            buf: DeviceBuf {
                addr: ptr,
                len: len as u64,
                ordinal,
            },
            stream,
            _keep: vec![obj.clone().unbind()],
        }));
    }
    if let Ok(dev) = obj.call_method0("__dlpack_device__") {
        let (kind, _id): (i64, i64) = dev.extract()?;
        if kind != KDL_CUDA && kind != KDL_CUDA_MANAGED {
            return Ok(None);
        }
        let stream = stream_of(obj, None)?;
        let kwargs = PyDict::new(py);
        // Stream 1 is CUDA's legacy default stream in the protocol (0 is disallowed).
        kwargs.set_item("stream", if stream == 0 { 1 } else { stream })?;
        let capsule = obj.call_method("__dlpack__", (), Some(&kwargs))?;
        // SAFETY: a capsule named "dltensor" holds a DLManagedTensor whose first member is
        // the DLTensor, valid while the capsule lives (we keep it, unconsumed: its destructor
        // frees the tensor when it goes).
        let t = unsafe {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr());
            if p.is_null() {
                return Err(PyErr::fetch(py));
            }
            &*(p as *const DlTensor)
        };
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        // SAFETY: DLPack's shape (and strides when not null) have `ndim` entries.
        let shape = unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec();
        let itemsize = (i64::from(t.dtype.bits) + 7) / 8 * i64::from(t.dtype.lanes);
        let strides: Option<Vec<i64>> = (!t.strides.is_null()).then(|| {
            // SAFETY: as above; DLPack strides count elements, not bytes.
            unsafe { std::slice::from_raw_parts(t.strides, ndim) }
                .iter()
                .map(|s| s * itemsize)
                .collect()
        });
        if !contiguous(&shape, strides.as_deref(), itemsize) {
            return Err(PyValueError::new_err(
                "the device buffer must be contiguous",
            ));
        }
        let len = shape.iter().product::<i64>().max(0) * itemsize;
        let addr = t.data as u64 + t.byte_offset;
        let ordinal = gpu()
            .ordinal_of(addr)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        return Ok(Some(DeviceTarget {
            buf: DeviceBuf {
                addr,
                len: len as u64,
                ordinal,
            },
            stream,
            _keep: vec![obj.clone().unbind(), capsule.unbind()],
        }));
    }
    Ok(None)
}

pub fn parse_path(path: &str) -> PyResult<IoPath> {
    path.parse().map_err(PyValueError::new_err)
}

/// A completion as Python sees it.
pub fn completion<'py>(py: Python<'py>, c: &Completion) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", c.bytes)?;
    d.set_item(
        "path",
        match c.path {
            PathTaken::Direct => "direct",
            PathTaken::Staged => "staged",
        },
    )?;
    d.set_item(
        "verified",
        match c.verified {
            Verified::EndToEnd => "end-to-end",
            Verified::ServerOnly => "server",
        },
    )?;
    d.set_item("staged_bytes", c.staged_bytes)?;
    d.set_item("fallback", c.fallback.clone())?;
    Ok(d)
}

/// The GPU backend a connection is given: "auto", "none", "cuda", or a `SimGpu`.
pub fn choose(gpu: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Gpu>> {
    let Some(g) = gpu else { return Ok(None) };
    if let Ok(sim) = g.downcast::<SimGpu>() {
        return Ok(Some(Gpu(Arc::new(sim.get().gpu.clone()))));
    }
    match g.extract::<String>()?.as_str() {
        "auto" => Ok(None),
        "none" => Ok(Some(Gpu(Arc::new(client::gpu::NoGpu)))),
        "cuda" => {
            #[cfg(feature = "cuda")]
            {
                client::gpu::cuda::CudaGpu::open()
                    .map(|c| Some(Gpu(Arc::new(c))))
                    .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
            }
            #[cfg(not(feature = "cuda"))]
            Err(pyo3::exceptions::PyOSError::new_err(
                "this build of lode has no CUDA support",
            ))
        }
        other => Err(PyValueError::new_err(format!(
            "gpu={other:?}: auto, none, cuda or a lode.SimGpu"
        ))),
    }
}

/// A simulated GPU whose memory the CPU cannot touch (for tests without a GPU).
#[pyclass(module = "lode._lode", frozen)]
pub struct SimGpu {
    gpu: Sim,
}

#[pymethods]
impl SimGpu {
    #[new]
    #[pyo3(signature = (capacity=256 << 20, ordinal=0))]
    fn new(capacity: u64, ordinal: u32) -> PyResult<SimGpu> {
        Ok(SimGpu {
            gpu: Sim::new(capacity, ordinal).map_err(|e| PyValueError::new_err(e.to_string()))?,
        })
    }

    /// `nbytes` of device memory (filled with 0xee), as an array of uint8.
    fn empty(&self, nbytes: u64) -> PyResult<SimArray> {
        Ok(SimArray {
            gpu: self.gpu.clone(),
            buf: self
                .gpu
                .alloc(nbytes)
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            len: nbytes,
        })
    }

    /// Bytes the simulated NIC moved in and out of device memory (the direct path).
    #[getter]
    fn dma_bytes(&self) -> u64 {
        self.gpu.dma_bytes()
    }

    /// Bytes copied from host to device memory (the staged path).
    #[getter]
    fn copied_to_device(&self) -> u64 {
        self.gpu.copied_to_device()
    }
}

/// Device memory of a `SimGpu`, exported through `__cuda_array_interface__`.
#[pyclass(module = "lode._lode", frozen)]
pub struct SimArray {
    gpu: Sim,
    buf: SimBuffer,
    len: u64,
}

#[pymethods]
impl SimArray {
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, [self.len])?)?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.buf.buf().addr, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        self.len
    }

    fn __len__(&self) -> usize {
        self.len as usize
    }

    /// The bytes, copied back by the simulated device (the test's device-to-host check).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let mut b = self
            .gpu
            .read_back(&self.buf.buf())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        b.truncate(self.len as usize);
        Ok(pyo3::types::PyBytes::new(py, &b))
    }

    /// Writes `data` at the start (what a kernel would have produced).
    fn fill(&self, data: &[u8]) -> PyResult<()> {
        self.gpu
            .fill(&self.buf.buf(), data)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}
