//! `lode._lode`: the client library for Python. Every call that waits on the network releases
//! the GIL; reads land straight in the caller's buffer (a bytearray, a memoryview, a numpy
//! array: anything with a contiguous writable buffer), with no copy on this side.

mod device;

use proto::FsErrorKind;
use std::collections::HashMap;
use std::sync::Arc;

use client::{Client, ClientError, File, OpenOptions};
use lnet::DmaBuffer;
use parking_lot::Mutex;
use proto::layout::{Layout, StripeCount};
use proto::md::{Inode, Kind};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// The runtime of this process: made again in a child after fork (DataLoader workers), whose
/// copy of the parent's has no threads.
fn runtime() -> PyResult<Arc<Runtime>> {
    static RT: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut rt = RT.lock();
    if let Some((p, r)) = rt.as_ref() {
        if *p == pid {
            return Ok(r.clone());
        }
    }
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| PyOSError::new_err(format!("starting the client's runtime: {e}")))?;
    let r = Arc::new(r);
    // A runtime inherited across fork has no threads to stop: forget it rather than drop it.
    if let Some((p, old)) = rt.replace((pid, r.clone())) {
        if p != pid {
            std::mem::forget(old);
        }
    }
    Ok(r)
}

/// A key or keyring error as an `OSError` (EINVAL for a key file that is no key).
fn crypt_error(e: client::crypt::CryptError) -> PyErr {
    let errno = match &e {
        client::crypt::CryptError::KeyFile { source, .. } => {
            source.raw_os_error().unwrap_or(libc::EIO)
        }
        client::crypt::CryptError::KeyLength(_) => libc::EINVAL,
        client::crypt::CryptError::Keyring(io) => io.raw_os_error().unwrap_or(libc::EIO),
        client::crypt::CryptError::Cipher(_) => libc::EIO,
    };
    PyOSError::new_err((errno, e.to_string()))
}

/// An `OSError` with the errno, which Python turns into FileNotFoundError, PermissionError...
fn os_error(e: ClientError) -> PyErr {
    PyOSError::new_err((e.errno(), e.to_string()))
}

/// Memory of a Python object, held through the buffer protocol for as long as this lives.
struct View {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the exporter keeps the memory valid and in place while the view is held; the view is
// released with the GIL held (in Drop, called from Python-facing methods).
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<View> {
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let flags = if writable {
            ffi::PyBUF_WRITABLE
        } else {
            ffi::PyBUF_SIMPLE
        };
        // SAFETY: a valid object and a view to fill; a failure sets the Python error.
        let r = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if r != 0 {
            let e = PyErr::fetch(obj.py());
            // As Python's own files say it.
            return Err(pyo3::exceptions::PyTypeError::new_err(if writable {
                format!("a read-write bytes-like object is required: {e}")
            } else {
                format!("a bytes-like object is required: {e}")
            }));
        }
        Ok(View { view })
    }

    fn len(&self) -> usize {
        self.view.len as usize
    }

    fn ptr(&self) -> *mut u8 {
        self.view.buf as *mut u8
    }
}

impl Drop for View {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: the view was filled by PyObject_GetBuffer and is released once.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// A view's memory handed to the network layer for one transfer.
struct Mem {
    ptr: *mut u8,
    len: usize,
    _view: Arc<View>,
}

// SAFETY: the memory is the view's, which stays valid and in place while `_view` is held.
unsafe impl Send for Mem {}
unsafe impl Sync for Mem {}

// SAFETY: the pointer and length describe memory that does not move while the region lives.
unsafe impl DmaBuffer for Mem {
    fn dma_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn dma_len(&self) -> usize {
        self.len
    }
}

fn mem(view: &Arc<View>, offset: usize, len: usize) -> Mem {
    Mem {
        // SAFETY: callers keep offset + len within the view.
        ptr: unsafe { view.ptr().add(offset) },
        len,
        _view: view.clone(),
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Dir => "directory",
        Kind::File => "file",
        Kind::Symlink => "link",
        Kind::Fifo => "fifo",
        Kind::Socket => "socket",
        Kind::CharDev(_) => "char",
        Kind::BlockDev(_) => "block",
    }
}

fn info<'py>(py: Python<'py>, name: &str, i: &Inode) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", name)?;
    d.set_item("type", kind_name(i.kind))?;
    d.set_item("size", i.size)?;
    d.set_item("mode", i.mode)?;
    d.set_item("uid", i.uid)?;
    d.set_item("gid", i.gid)?;
    d.set_item("nlink", i.nlink)?;
    let t = |t: proto::md::Time| t.sec as f64 + f64::from(t.nsec) / 1e9;
    d.set_item("mtime", t(i.mtime))?;
    d.set_item("atime", t(i.atime))?;
    d.set_item("ctime", t(i.ctime))?;
    d.set_item("fid", i.fid.to_string())?;
    Ok(d)
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Where one range of a batch read lands.
#[derive(Clone)]
enum Dest {
    Host(Arc<View>),
    Device(client::gpu::DeviceBuf, u64),
}

/// A connection to a lode filesystem.
#[pyclass(module = "lode._lode", frozen)]
struct Filesystem {
    addr: String,
    /// How long calls keep being resent while a server is unreachable or restarting.
    timeout: f64,
    /// The client of the process that made it (pid), made again after fork.
    client: Mutex<Option<(u32, Client)>>,
    /// The key file (`None`: $LODE_KEY, else /etc/lode/client.key), or no authentication.
    key: Option<std::path::PathBuf>,
    auth: bool,
    privacy: bool,
    /// The GPU device buffers belong to (`None`: CUDA if found, else none).
    gpu: Option<client::gpu::Gpu>,
}

impl Drop for Filesystem {
    /// Leaves cleanly when the object goes (best effort: at interpreter exit it may not run,
    /// and the MDS then evicts the silent client from its table).
    fn drop(&mut self) {
        let Some((pid, c)) = self.client.lock().take() else {
            return;
        };
        if pid != std::process::id() {
            return;
        }
        if let Ok(rt) = runtime() {
            let _ = rt.block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(5), c.close()).await
            });
        }
    }
}

impl Filesystem {
    fn client(&self, py: Python<'_>) -> PyResult<(Arc<Runtime>, Client)> {
        let rt = runtime()?;
        let pid = std::process::id();
        if let Some((p, c)) = self.client.lock().as_ref() {
            if *p == pid {
                return Ok((rt, c.clone()));
            }
        }
        let addr = self.addr.clone();
        let security = lnet::auth::client_security(self.key.as_deref(), !self.auth, self.privacy)
            .map_err(|e| os_error(ClientError::from(e)))?;
        let cfg = client::ClientConfig {
            retry_for: std::time::Duration::from_secs_f64(self.timeout.max(0.0)),
            security: Some(security),
            gpu: self.gpu.clone(),
            ..Default::default()
        };
        let c = py
            .detach(|| rt.block_on(Client::connect_with(&addr, cfg)))
            .map_err(os_error)?;
        *self.client.lock() = Some((pid, c.clone()));
        Ok((rt, c))
    }

    /// Runs `f` with the client, the GIL released.
    fn run<T: Send, Fut>(&self, py: Python<'_>, f: impl FnOnce(Client) -> Fut + Send) -> PyResult<T>
    where
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let (rt, c) = self.client(py)?;
        py.detach(|| rt.block_on(f(c))).map_err(os_error)
    }
}

#[pymethods]
impl Filesystem {
    #[new]
    #[pyo3(signature = (addr, timeout=60.0, key=None, auth=true, privacy=false, gpu=None))]
    fn new(
        py: Python<'_>,
        addr: &str,
        timeout: f64,
        key: Option<std::path::PathBuf>,
        auth: bool,
        privacy: bool,
        gpu: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Filesystem> {
        let fs = Filesystem {
            addr: addr.to_string(),
            timeout,
            client: Mutex::new(None),
            key,
            auth,
            privacy,
            gpu: device::choose(gpu)?,
        };
        fs.client(py)?;
        Ok(fs)
    }

    /// The MDS address this filesystem was reached at.
    #[getter]
    fn address(&self) -> String {
        self.addr.clone()
    }

    /// Waits until the MDS has committed every namespace change made so far (creates,
    /// renames, removals are applied when they return, durable after this).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| async move { c.sync().await })
    }

    /// Commits what is uncommitted and leaves the MDS's table of clients; the filesystem
    /// object connects again if used after.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let held = self.client.lock().take();
        if let Some((pid, c)) = held {
            if pid == std::process::id() {
                let rt = runtime()?;
                py.detach(|| rt.block_on(c.close())).map_err(os_error)?;
            }
        }
        Ok(())
    }

    /// Opens `path`: "rb", "wb" (create, truncate), "ab" (create, append), "r+b", "xb"
    /// (create, must not exist). New files take `stripe_count` (-1: all targets) and
    /// `stripe_size` if given, else the directory's default layout.
    #[pyo3(signature = (path, mode="rb", stripe_count=None, stripe_size=None))]
    fn open(
        &self,
        py: Python<'_>,
        path: &str,
        mode: &str,
        stripe_count: Option<i64>,
        stripe_size: Option<u64>,
    ) -> PyResult<RawFile> {
        let m = mode.replace('b', "");
        let mut o = OpenOptions::new();
        let (readable, writable) = match m.as_str() {
            "r" => (true, false),
            "w" => {
                o = o.read(false).write(true).create(true).truncate(true);
                (false, true)
            }
            "a" => {
                o = o.read(false).append(true).create(true);
                (false, true)
            }
            "x" => {
                o = o.read(false).write(true).create_new(true);
                (false, true)
            }
            "r+" => {
                o = o.write(true);
                (true, true)
            }
            "w+" => {
                o = o.write(true).create(true).truncate(true);
                (true, true)
            }
            "a+" => {
                o = o.append(true).create(true);
                (true, true)
            }
            _ => return Err(PyValueError::new_err(format!("invalid mode: {mode:?}"))),
        };
        match stripe_count {
            Some(-1) => o = o.stripe_all(),
            Some(n) if n > 0 && n <= u32::MAX as i64 => o = o.stripe_count(n as u32),
            Some(n) => return Err(PyValueError::new_err(format!("stripe_count {n}"))),
            None => {}
        }
        if let Some(s) = stripe_size {
            o = o.stripe_size(s);
        }
        let p = path.to_string();
        let file = self.run(py, move |c| async move { o.open(&c, &p).await })?;
        let (rt, _) = self.client(py)?;
        let pos = if m.starts_with('a') {
            py.detach(|| rt.block_on(file.size())).map_err(os_error)?
        } else {
            0
        };
        Ok(RawFile {
            state: Mutex::new(Some(Arc::new(file))),
            pos: Mutex::new(pos),
            readable,
            writable,
            rt,
            name: path.to_string(),
            last_io: Mutex::new(None),
        })
    }

    /// Attributes of `path` (symlinks followed): name, type, size, mode, uid, gid, nlink,
    /// times, fid.
    fn stat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let p = path.to_string();
        let i = self.run(py, move |c| async move { c.stat(&p).await })?;
        info(py, path, &i)
    }

    /// The entries of a directory with their attributes (one round trip per page).
    fn ls<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyList>> {
        let p = path.to_string();
        let (single, entries) = self.run(py, move |c| async move {
            let dir = c.stat(&p).await?;
            if dir.kind != Kind::Dir {
                return Ok((true, vec![(String::new(), dir)]));
            }
            let entries = c
                .readdir_plus(dir.fid)
                .await?
                .into_iter()
                .map(|(e, i)| (String::from_utf8_lossy(&e.name).into_owned(), i))
                .collect::<Vec<(String, Inode)>>();
            Ok((false, entries))
        })?;
        let out = PyList::empty(py);
        for (name, i) in &entries {
            let full = if single {
                path.to_string()
            } else {
                join(path, name)
            };
            out.append(info(py, &full, i)?)?;
        }
        Ok(out)
    }

    #[pyo3(signature = (path, parents=false, mode=0o755))]
    fn mkdir(&self, py: Python<'_>, path: &str, parents: bool, mode: u32) -> PyResult<()> {
        let p = path.to_string();
        self.run(py, move |c| async move {
            if parents {
                c.mkdir_all(&p, mode).await
            } else {
                c.mkdir(&p, mode).await.map(|_| ())
            }
        })
    }

    /// Encrypts everything made below the empty directory `path` under the master key in
    /// `key_file` (64 random bytes), and unlocks it for this user on this node.
    fn crypt_set(
        &self,
        py: Python<'_>,
        path: &str,
        key_file: std::path::PathBuf,
    ) -> PyResult<String> {
        let key = client::crypt::MasterKey::read_file(&key_file).map_err(crypt_error)?;
        client::crypt::keyring::add(&key).map_err(crypt_error)?;
        let p = path.to_string();
        self.run(py, move |c| async move {
            c.crypt_set(&p, &key).await.map(|p| p.key_hex())
        })
    }

    /// Gives every process of this user on this node (the kernel keyring; DataLoader workers
    /// too) the key of the encrypted directory `path`, from `key_file`.
    fn crypt_unlock(
        &self,
        py: Python<'_>,
        path: &str,
        key_file: std::path::PathBuf,
    ) -> PyResult<()> {
        let key = client::crypt::MasterKey::read_file(&key_file).map_err(crypt_error)?;
        let p = path.to_string();
        let policy = self.run(py, move |c| async move { c.crypt_policy(&p).await })?;
        match policy {
            None => Err(PyOSError::new_err((
                libc::EINVAL,
                format!("{path}: not encrypted"),
            ))),
            Some(p) if !key.unlocks(&p) => Err(PyOSError::new_err((
                libc::ENOKEY,
                format!("{path}: the key is not the directory's ({})", p.key_hex()),
            ))),
            Some(_) => client::crypt::keyring::add(&key).map_err(crypt_error),
        }
    }

    /// Takes the key of the encrypted directory `path` out of this user's keyring; whether it
    /// was there.
    fn crypt_lock(&self, py: Python<'_>, path: &str) -> PyResult<bool> {
        let p = path.to_string();
        let (was, c) = self.run(py, move |c| async move {
            c.crypt_policy(&p).await.map(|policy| (policy, c))
        })?;
        match was {
            None => Err(PyOSError::new_err((
                libc::EINVAL,
                format!("{path}: not encrypted"),
            ))),
            Some(p) => {
                // This client too lets go of it at once (others within a second).
                c.crypt_remove_key(&p.key_id);
                client::crypt::keyring::remove(&p.key_id).map_err(crypt_error)
            }
        }
    }

    /// Whether `path` is encrypted: None, or the key's identifier and whether it is unlocked.
    fn crypt_status<'py>(
        &self,
        py: Python<'py>,
        path: &str,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let p = path.to_string();
        let got = self.run(py, move |c| async move {
            match c.crypt_policy(&p).await? {
                None => Ok(None),
                Some(p) => Ok(Some((p.key_hex(), c.crypt_unlocked(&p)?))),
            }
        })?;
        let Some((key, unlocked)) = got else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("key", key)?;
        d.set_item("unlocked", unlocked)?;
        d.set_item("contents", "aes-256-xts")?;
        d.set_item("names", "aes-256-gcm-siv")?;
        Ok(Some(d))
    }

    /// Removes a file, or an empty directory; with `recursive`, a directory and all below it.
    #[pyo3(signature = (path, recursive=false))]
    fn rm(&self, py: Python<'_>, path: &str, recursive: bool) -> PyResult<()> {
        let p = path.to_string();
        self.run(py, move |c| async move { remove(&c, p, recursive).await })
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let p = path.to_string();
        self.run(py, move |c| async move { c.rmdir(&p).await })
    }

    /// Renames atomically, replacing `dst` if it exists (POSIX rename).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        let (s, d) = (src.to_string(), dst.to_string());
        self.run(py, move |c| async move { c.rename(&s, &d).await })
    }

    /// Sets the layout of an empty file or a directory's default: `stripe_count` targets (-1:
    /// all) of `stripe_size` bytes.
    #[pyo3(signature = (path, stripe_count=1, stripe_size=4 << 20))]
    fn setstripe(
        &self,
        py: Python<'_>,
        path: &str,
        stripe_count: i64,
        stripe_size: u64,
    ) -> PyResult<()> {
        let count = match stripe_count {
            -1 => None,
            n if n > 0 && n <= u32::MAX as i64 => Some(n as u32),
            n => return Err(PyValueError::new_err(format!("stripe_count {n}"))),
        };
        let layout = client::raid0(count, stripe_size).map_err(os_error)?;
        let p = path.to_string();
        self.run(py, move |c| async move {
            c.setstripe(&p, layout).await.map(|_| ())
        })
    }

    /// The layout of `path` as a dict: components with start, end, stripe_count, stripe_size
    /// and objects (target, fid); None if it has none.
    fn getstripe<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        let p = path.to_string();
        let layout: Option<Layout> = self.run(py, move |c| async move { c.getstripe(&p).await })?;
        let Some(l) = layout else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("generation", l.generation)?;
        d.set_item("text", client::stripe_args::format(&l))?;
        let comps = PyList::empty(py);
        for c in &l.components {
            let cd = PyDict::new(py);
            cd.set_item("start", c.start)?;
            cd.set_item("end", c.end)?;
            cd.set_item("stripe_size", c.stripe_size)?;
            let count: i64 = match c.stripe_count {
                StripeCount::All => -1,
                StripeCount::Count(n) => n.into(),
                StripeCount::Mdt => 0,
            };
            cd.set_item("stripe_count", count)?;
            cd.set_item("pattern", if c.on_mdt() { "mdt" } else { "raid0" })?;
            let objs = PyList::empty(py);
            for o in &c.objects {
                objs.append((o.target, o.fid.to_string()))?;
            }
            cd.set_item("objects", objs)?;
            comps.append(cd)?;
        }
        if let Some(c) = l.components.first() {
            d.set_item("stripe_size", c.stripe_size)?;
            d.set_item(
                "stripe_count",
                match c.stripe_count {
                    StripeCount::All => -1i64,
                    StripeCount::Count(n) => n.into(),
                    StripeCount::Mdt => 0,
                },
            )?;
        }
        d.set_item("components", comps)?;
        Ok(Some(d))
    }

    /// Space and inodes: total, free and used bytes, inodes, targets and targets up.
    fn df<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.run(py, |c| async move { c.statfs().await })?;
        let d = PyDict::new(py);
        d.set_item("total", s.total)?;
        d.set_item("free", s.free)?;
        d.set_item("used", s.total.saturating_sub(s.free))?;
        d.set_item("inodes", s.inodes)?;
        d.set_item("targets", s.targets)?;
        d.set_item("targets_up", s.targets_up)?;
        Ok(d)
    }

    /// Reads every `(path, offset, length)` at once and returns when all have landed: into
    /// the buffers of `into` (one per range, each at least `length` long: host memory, or GPU
    /// memory read on `path`), returning the byte counts, or else as a list of bytes. Short
    /// counts only at the end of a file.
    // Long by design: argument checks on Python objects, then one batch of reads.
    #[pyo3(signature = (ranges, into=None, max_in_flight=256, path="auto"))]
    fn read_ranges<'py>(
        &self,
        py: Python<'py>,
        ranges: Vec<(String, u64, u64)>,
        into: Option<Vec<Bound<'py, PyAny>>>,
        max_in_flight: usize,
        path: &str,
    ) -> PyResult<Bound<'py, PyList>> {
        let io_path = device::parse_path(path)?;
        let (_, client) = self.client(py)?;
        // Kept here, with the GIL, until the reads are done: they hold the Python objects.
        let mut devices: Vec<device::DeviceTarget> = vec![];
        let dests: Vec<Dest> = match &into {
            Some(bufs) => {
                if bufs.len() != ranges.len() {
                    return Err(PyValueError::new_err(format!(
                        "{} buffers for {} ranges",
                        bufs.len(),
                        ranges.len()
                    )));
                }
                let mut v = Vec::with_capacity(bufs.len());
                for (b, r) in bufs.iter().zip(&ranges) {
                    let (dest, len) = match device::device_target(b, || client.gpu())? {
                        Some(d) => {
                            let dest = Dest::Device(d.buf, d.stream);
                            let len = d.buf.len as usize;
                            devices.push(d);
                            (dest, len)
                        }
                        None => {
                            let view = View::get(b, true)?;
                            let len = view.len();
                            (Dest::Host(Arc::new(view)), len)
                        }
                    };
                    if (len as u64) < r.2 {
                        return Err(PyValueError::new_err(format!(
                            "a buffer of {len} bytes for a range of {}",
                            r.2
                        )));
                    }
                    v.push(dest);
                }
                v
            }
            None => {
                let mut v = Vec::with_capacity(ranges.len());
                for r in &ranges {
                    let b = pyo3::types::PyByteArray::new_with(py, r.2 as usize, |_| Ok(()))?;
                    v.push(Dest::Host(Arc::new(View::get(b.as_any(), true)?)));
                }
                v
            }
        };
        let jobs: Vec<(String, u64, u64, Dest)> = ranges
            .iter()
            .zip(&dests)
            .map(|((p, o, l), d)| (p.clone(), *o, *l, d.clone()))
            .collect();
        let counts = self.run(py, move |c| async move {
            // Each file opened once for the batch, then every range in flight at once.
            let mut files: HashMap<String, Arc<File>> = HashMap::new();
            for (p, ..) in &jobs {
                if !files.contains_key(p) {
                    let f = OpenOptions::new().open(&c, p).await?;
                    files.insert(p.clone(), Arc::new(f));
                }
            }
            let gate = Arc::new(Semaphore::new(max_in_flight.max(1)));
            let mut tasks = tokio::task::JoinSet::new();
            for (i, (p, off, len, dest)) in jobs.into_iter().enumerate() {
                let (f, c, gate) = (files[&p].clone(), c.clone(), gate.clone());
                tasks.spawn(async move {
                    let _slot = gate.acquire_owned().await;
                    let n = match dest {
                        Dest::Host(view) => {
                            let region = c.register(mem(&view, 0, len as usize))?;
                            f.read_into(off, &region, 0, len).await?
                        }
                        Dest::Device(buf, stream) => {
                            let io = client::gpu::DeviceIo {
                                path: io_path,
                                stream,
                            };
                            f.read_device(off, &buf, 0, len, io).await?.bytes as usize
                        }
                    };
                    Ok::<_, ClientError>((i, n))
                });
            }
            let mut counts = vec![0usize; tasks.len()];
            while let Some(r) = tasks.join_next().await {
                let (i, n) = r.map_err(|e| ClientError::fs(FsErrorKind::Io, e.to_string()))??;
                counts[i] = n;
            }
            for (_, f) in files {
                if let Ok(f) = Arc::try_unwrap(f) {
                    f.close().await?;
                }
            }
            Ok(counts)
        })?;
        drop(devices);
        let out = PyList::empty(py);
        if into.is_some() {
            for n in counts {
                out.append(n)?;
            }
        } else {
            for (dest, n) in dests.iter().zip(counts) {
                if let Dest::Host(view) = dest {
                    // SAFETY: the bytearray's buffer is held by the view and n is within it.
                    let bytes = unsafe { std::slice::from_raw_parts(view.ptr(), n) };
                    out.append(PyBytes::new(py, bytes))?;
                }
            }
        }
        Ok(out)
    }

    /// Reads each file whole into one reusable buffer of `chunk` bytes with the Rust library
    /// alone, for comparison with the same reads made from Python; returns the bytes read.
    #[pyo3(signature = (paths, chunk=64 << 20))]
    fn _read_files_native(
        &self,
        py: Python<'_>,
        paths: Vec<String>,
        chunk: usize,
    ) -> PyResult<u64> {
        self.run(py, move |c| async move {
            let region = Arc::new(c.register(vec![0u8; chunk])?);
            let mut total = 0u64;
            for p in paths {
                let f = OpenOptions::new().open(&c, &p).await?;
                let mut at = 0u64;
                loop {
                    let n = f.read_into(at, &region, 0, chunk as u64).await?;
                    if n == 0 {
                        break;
                    }
                    at += n as u64;
                }
                total += at;
                f.close().await?;
            }
            Ok(total)
        })
    }
}

async fn remove(c: &Client, path: String, recursive: bool) -> Result<(), ClientError> {
    let i = c.resolve(&path, false).await?;
    if i.kind != Kind::Dir {
        return c.unlink(&path).await;
    }
    if recursive {
        for e in c.readdir_fid(i.fid).await? {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            Box::pin(remove(c, join(&path, &name), true)).await?;
        }
    }
    c.rmdir(&path).await
}

/// An open file: unbuffered reads and writes at a position (`lode.File` wraps it as a Python
/// binary file).
#[pyclass(module = "lode._lode", frozen)]
struct RawFile {
    state: Mutex<Option<Arc<File>>>,
    pos: Mutex<u64>,
    readable: bool,
    writable: bool,
    rt: Arc<Runtime>,
    name: String,
    /// What the last read or write of GPU memory did.
    last_io: Mutex<Option<client::gpu::Completion>>,
}

impl RawFile {
    fn file(&self) -> PyResult<Arc<File>> {
        self.state
            .lock()
            .clone()
            .ok_or_else(|| PyValueError::new_err("I/O operation on closed file"))
    }

    fn check(&self, ok: bool, what: &str) -> PyResult<()> {
        if ok {
            Ok(())
        } else {
            Err(pyo3::exceptions::PyIOError::new_err(format!(
                "{} is not open for {what}",
                self.name
            )))
        }
    }
}

#[pymethods]
impl RawFile {
    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.state.lock().is_none()
    }

    fn readable(&self) -> bool {
        self.readable
    }

    fn writable(&self) -> bool {
        self.writable
    }

    /// Reads into `buffer` at the position, straight from the storage servers; returns the
    /// count (0 at the end of the file). The buffer is host memory (anything with a
    /// contiguous writable buffer) or GPU memory (a CUDA tensor, anything with
    /// `__cuda_array_interface__` or DLPack), read on `path` ("auto", "direct", "staged") and
    /// on the current CUDA stream; `last_io` then says what was done.
    #[pyo3(signature = (buffer, path="auto"))]
    fn readinto(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, path: &str) -> PyResult<usize> {
        self.check(self.readable, "reading")?;
        let f = self.file()?;
        let at = *self.pos.lock();
        let rt = self.rt.clone();
        if let Some(dev) = device::device_target(buffer, || f.client().gpu())? {
            let io = client::gpu::DeviceIo {
                path: device::parse_path(path)?,
                stream: dev.stream,
            };
            let done = py
                .detach(|| rt.block_on(f.read_device(at, &dev.buf, 0, dev.buf.len, io)))
                .map_err(os_error)?;
            *self.pos.lock() = at + done.bytes;
            let n = done.bytes as usize;
            *self.last_io.lock() = Some(done);
            return Ok(n);
        }
        let view = Arc::new(View::get(buffer, true)?);
        let len = view.len();
        let n = py
            .detach(|| {
                rt.block_on(async {
                    let region = f.client().register(mem(&view, 0, len))?;
                    f.read_into(at, &region, 0, len as u64).await
                })
            })
            .map_err(os_error)?;
        *self.pos.lock() = at + n as u64;
        Ok(n)
    }

    /// What the last read or write of GPU memory did: bytes, path ("direct" or "staged"),
    /// verified ("end-to-end" or "server"), staged_bytes, and fallback (why auto staged).
    #[getter]
    fn last_io<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.last_io
            .lock()
            .as_ref()
            .map(|c| device::completion(py, c))
            .transpose()
    }

    /// Reads up to `size` bytes (all to the end of the file if negative).
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        self.check(self.readable, "reading")?;
        let f = self.file()?;
        let at = *self.pos.lock();
        let rt = self.rt.clone();
        let data = py
            .detach(|| {
                rt.block_on(async {
                    let len = if size < 0 {
                        f.size().await?.saturating_sub(at) as usize
                    } else {
                        size as usize
                    };
                    let mut buf = vec![0u8; len];
                    let n = f.read_at(at, &mut buf).await?;
                    buf.truncate(n);
                    Ok::<_, ClientError>(buf)
                })
            })
            .map_err(os_error)?;
        *self.pos.lock() = at + data.len() as u64;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes all of `data` at the position (at the end, for a file opened to append); the
    /// storage servers take the bytes from the caller's memory. `data` is host memory (any
    /// object with a buffer) or GPU memory, written on `path` as `readinto` reads.
    #[pyo3(signature = (data, path="auto"))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, path: &str) -> PyResult<usize> {
        self.check(self.writable, "writing")?;
        let f = self.file()?;
        let at = *self.pos.lock();
        let rt = self.rt.clone();
        if let Some(dev) = device::device_target(data, || f.client().gpu())? {
            let io = client::gpu::DeviceIo {
                path: device::parse_path(path)?,
                stream: dev.stream,
            };
            let done = py
                .detach(|| rt.block_on(f.write_device(at, &dev.buf, 0, dev.buf.len, io)))
                .map_err(os_error)?;
            let n = done.bytes;
            *self.pos.lock() = at + n;
            *self.last_io.lock() = Some(done);
            return Ok(n as usize);
        }
        let view = Arc::new(View::get(data, false)?);
        let len = view.len();
        let written_at = py
            .detach(|| {
                rt.block_on(async {
                    let region = Arc::new(f.client().register(mem(&view, 0, len))?);
                    f.write_from(at, region, 0, len as u64).await
                })
            })
            .map_err(os_error)?;
        *self.pos.lock() = written_at + len as u64;
        Ok(len)
    }

    /// Moves the position: whence 0 from the start, 1 from here, 2 from the end.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let base = match whence {
            0 => 0i64,
            1 => *self.pos.lock() as i64,
            2 => {
                let f = self.file()?;
                let rt = self.rt.clone();
                py.detach(|| rt.block_on(f.size())).map_err(os_error)? as i64
            }
            w => return Err(PyValueError::new_err(format!("invalid whence ({w})"))),
        };
        let to = base
            .checked_add(offset)
            .filter(|t| *t >= 0)
            .ok_or_else(|| PyOSError::new_err((libc::EINVAL, "negative seek position")))?;
        *self.pos.lock() = to as u64;
        Ok(to as u64)
    }

    fn tell(&self) -> u64 {
        *self.pos.lock()
    }

    /// The file's size (asks the MDS; includes this handle's writes).
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        let f = self.file()?;
        let rt = self.rt.clone();
        py.detach(|| rt.block_on(f.size())).map_err(os_error)
    }

    /// Cuts or extends the file to `size` (the position if None).
    #[pyo3(signature = (size=None))]
    fn truncate(&self, py: Python<'_>, size: Option<u64>) -> PyResult<u64> {
        self.check(self.writable, "writing")?;
        let f = self.file()?;
        let size = size.unwrap_or(*self.pos.lock());
        let rt = self.rt.clone();
        py.detach(|| rt.block_on(f.set_len(size)))
            .map_err(os_error)?;
        Ok(size)
    }

    /// Makes the size written visible to every client.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let Some(f) = self.state.lock().clone() else {
            return Ok(());
        };
        let rt = self.rt.clone();
        py.detach(|| rt.block_on(f.flush())).map_err(os_error)
    }

    /// Makes every write durable on the storage servers.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        let f = self.file()?;
        let rt = self.rt.clone();
        py.detach(|| rt.block_on(f.fsync())).map_err(os_error)
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(f) = self.state.lock().take() else {
            return Ok(());
        };
        let rt = self.rt.clone();
        py.detach(|| {
            rt.block_on(async {
                match Arc::try_unwrap(f) {
                    Ok(f) => f.close().await,
                    // Another thread is mid-call on it: the last one to let go closes it.
                    Err(f) => f.flush().await,
                }
            })
        })
        .map_err(os_error)
    }
}

#[pymodule]
fn _lode(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Filesystem>()?;
    m.add_class::<RawFile>()?;
    m.add_class::<device::SimGpu>()?;
    m.add_class::<device::SimArray>()?;
    Ok(())
}
