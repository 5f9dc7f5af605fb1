//! The I/O engines: how a storage target's bytes reach the disk.
//!
//! - [`uring`]: io_uring on dedicated threads, one ring per thread; the default.
//! - [`psync`]: pread/pwrite on a thread pool; used where io_uring is unavailable, or by choice.
//! - [`mem`]: an in-memory image for tests, which can crash (losing everything not synced) and
//!   fail on command (EIO, ENOSPC).
//!
//! An operation that moves bytes takes an owned [`AlignedBuf`] and hands it back with its
//! result, as io_uring requires (the kernel owns the buffer until the operation completes).
//! Data files are opened twice: with O_DIRECT for large I/Os, and through the page cache for
//! small ones (see `crate::object`). The target only ever does whole, aligned 4 KiB blocks.

pub mod buf;
pub mod mem;
pub mod paced;
pub mod psync;
pub mod uring;

use std::fs::File;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

pub use buf::{AlignedBuf, ALIGN};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// An open file of one engine.
#[derive(Clone, Debug)]
pub enum FileHandle {
    Os(Arc<File>),
    Mem(u64),
}

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Must exist.
    Existing,
    /// Created if missing.
    Create,
    /// Created; an existing file is an error.
    CreateNew,
}

/// Space on the filesystem holding a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    pub total: u64,
    pub free: u64,
}

/// What a storage target needs from the disk. The operations that do not move data have
/// defaults that make the plain system calls, which every OS-backed engine shares; the
/// in-memory engine overrides them all.
pub trait Engine: Send + Sync + 'static {
    /// The engine's name, for logs and `lode df`.
    fn name(&self) -> &'static str;
    /// Reads `buf.len()` bytes at `offset`; a short count means end of file.
    fn read_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)>;
    /// Writes all of `buf` at `offset`.
    fn write_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)>;
    /// Makes the file's data and size durable.
    fn sync(&self, f: &FileHandle) -> BoxFuture<io::Result<()>>;

    /// Names this boot of the machine holding the disk: it changes exactly when writes not
    /// yet synced may have been lost (a power cut, a reboot), and not when only the process
    /// died (the kernel still holds them).
    fn boot_id(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }

    /// Opens a file; `direct` asks for O_DIRECT (aligned I/O only).
    fn open(&self, path: &Path, mode: OpenMode, direct: bool) -> io::Result<FileHandle> {
        os::open(path, mode, direct)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    /// Renames a file, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }
    /// Makes the entries of a directory (creations, removals) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        os::sync_dir(path)
    }
    fn len(&self, f: &FileHandle) -> io::Result<u64> {
        os::len(f)
    }
    fn set_len(&self, f: &FileHandle, len: u64) -> io::Result<()> {
        os::set_len(f, len)
    }
    /// Deallocates a range; it reads as zeros afterwards.
    fn punch(&self, f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        os::punch(f, offset, len)
    }
    /// Reserves space for a range, so that writing it cannot fail for lack of space.
    fn allocate(&self, f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        os::allocate(f, offset, len)
    }
    /// The entries of a directory (files and directories), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<std::path::PathBuf>> {
        os::list(dir)
    }
    fn space(&self, path: &Path) -> io::Result<Space> {
        os::space(path)
    }
    /// Reads into `buf` on the calling thread, for small reads of buffered (page-cached)
    /// files, where a trip to an I/O thread would cost more than the read. Short at the end.
    fn read_inline(&self, f: &FileHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        os::read_inline(f, offset, buf)
    }
    /// Writes all of `buf` on the calling thread; for small writes to buffered files.
    fn write_inline(&self, f: &FileHandle, offset: u64, buf: &[u8]) -> io::Result<()> {
        os::write_inline(f, offset, buf)
    }
    /// Starts bringing a range of a buffered file into the page cache without waiting for
    /// it, so that a `read_inline` soon after finds it there or on its way. Only a hint:
    /// nothing happens where the engine keeps no page cache.
    fn will_need(&self, f: &FileHandle, offset: u64, len: u64) {
        if let Ok(file) = os_file(f) {
            os::will_need(file, offset, len);
        }
    }
    /// Says that the buffered file `f` is read only where asked: the kernel reads nothing
    /// ahead into its page cache.
    fn no_readahead(&self, f: &FileHandle) {
        if let Ok(file) = os_file(f) {
            os::advise(file, libc::POSIX_FADV_RANDOM);
        }
    }
    /// Whether a data file's small, aligned I/Os may go through `*_inline` on the calling
    /// thread too (an engine that models a device's pace says no).
    fn data_inline(&self) -> bool {
        true
    }

    /// Whether the files are a real disk's (which [`crate::io_policy`] can measure).
    fn on_disk(&self) -> bool {
        true
    }
}

/// Which engine to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring if the kernel allows it, else psync.
    Auto,
    Uring,
    Psync,
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(EngineKind::Auto),
            "uring" | "io_uring" => Ok(EngineKind::Uring),
            "psync" => Ok(EngineKind::Psync),
            _ => Err(format!("unknown engine {s:?} (auto, uring or psync)")),
        }
    }
}

/// Threads and queue depth of the disk engines.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    pub threads: usize,
    /// Operations in flight per thread (ring size for io_uring).
    pub queue_depth: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            threads: 2,
            queue_depth: 64,
        }
    }
}

/// Starts the engine asked for, falling back from io_uring to psync under `Auto`, and logs
/// which one runs.
pub fn start(kind: EngineKind, cfg: EngineConfig) -> io::Result<Arc<dyn Engine>> {
    let engine: Arc<dyn Engine> = match kind {
        EngineKind::Uring => Arc::new(uring::Uring::start(cfg)?),
        EngineKind::Psync => Arc::new(psync::Psync::start(cfg)),
        EngineKind::Auto => match uring::Uring::start(cfg) {
            Ok(u) => Arc::new(u),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; using psync");
                Arc::new(psync::Psync::start(cfg))
            }
        },
    };
    tracing::info!(
        engine = engine.name(),
        threads = cfg.threads,
        queue_depth = cfg.queue_depth,
        "I/O engine started"
    );
    Ok(engine)
}

fn os_file(f: &FileHandle) -> io::Result<&Arc<File>> {
    match f {
        FileHandle::Os(file) => Ok(file),
        FileHandle::Mem(_) => Err(io::Error::from_raw_os_error(libc::EBADF)),
    }
}

/// The operations every OS-backed engine does the same way: plain system calls that do not
/// move data.
pub(crate) mod os {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;
    use std::sync::Arc;

    use super::{os_file, FileHandle, OpenMode, Space};

    pub fn open(path: &Path, mode: OpenMode, direct: bool) -> io::Result<FileHandle> {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        match mode {
            OpenMode::Existing => {}
            OpenMode::Create => {
                o.create(true);
            }
            OpenMode::CreateNew => {
                o.create_new(true);
            }
        }
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        Ok(FileHandle::Os(Arc::new(o.open(path)?)))
    }

    pub fn sync_dir(path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    pub fn len(f: &FileHandle) -> io::Result<u64> {
        Ok(os_file(f)?.metadata()?.len())
    }

    pub fn set_len(f: &FileHandle, len: u64) -> io::Result<()> {
        os_file(f)?.set_len(len)
    }

    pub fn punch(f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        let file = os_file(f)?;
        let (off, len) = (i64::try_from(offset), i64::try_from(len));
        let (Ok(off), Ok(len)) = (off, len) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: fallocate on a valid descriptor with plain integer arguments.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub fn allocate(f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        let file = os_file(f)?;
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: fallocate on a valid descriptor with plain integer arguments.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, off, len) };
        match rc {
            0 => Ok(()),
            // Filesystems without fallocate: the write itself will report a full disk.
            _ if io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    pub fn will_need(file: &File, offset: u64, len: u64) {
        // SAFETY: a plain system call on a descriptor this file owns; it reads no memory of
        // ours. Its outcome is a hint's: ignored.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    pub fn advise(file: &File, advice: libc::c_int) {
        // SAFETY: the descriptor is open for as long as `file` lives; advice is only a hint.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, advice);
        }
    }

    pub fn read_inline(f: &FileHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let file = os_file(f)?;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    pub fn write_inline(f: &FileHandle, offset: u64, buf: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        os_file(f)?.write_all_at(buf, offset)
    }

    pub fn list(dir: &Path) -> io::Result<Vec<std::path::PathBuf>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.path()))
            .collect()
    }

    #[allow(clippy::unnecessary_cast)] // statvfs field types differ between platforms
    pub fn space(path: &Path) -> io::Result<Space> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: a valid C string and a pointer to a statvfs to fill.
        if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: filled by the successful call.
        let st = unsafe { st.assume_init() };
        let frsize = st.f_frsize as u64;
        Ok(Space {
            total: st.f_blocks as u64 * frsize,
            free: st.f_bavail as u64 * frsize,
        })
    }
}
