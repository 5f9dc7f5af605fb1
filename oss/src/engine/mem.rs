//! The crash-simulating engine: files live in memory as two images, what the program sees
//! (`live`) and what would survive a power cut (`durable`). `sync` copies a file's live image to
//! its durable one; `sync_dir` makes the directory's creations and removals durable; `crash`
//! throws every live image away and goes back to the durable state, as a machine that lost
//! power and rebooted would. It can also fail the next operations with a chosen errno and has a
//! capacity past which writes that need more space fail with ENOSPC (an overwrite in place
//! needs none), leaving nothing half-written. A failed sync
//! behaves as Linux's does: the file's unsynced changes still read, but the next sync says Ok
//! without making them durable (the kernel marked the pages of the failed write-back clean),
//! until the file is changed again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::{AlignedBuf, BoxFuture, Engine, FileHandle, OpenMode, Space};

/// Which operations an injected failure applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Sync,
}

#[derive(Default, Clone)]
struct Image {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// A sync of the file failed and, as Linux does with the pages of a failed write-back,
    /// its unsynced changes were dropped from the write-back: they still read (`live`) but
    /// the next sync says Ok without making them durable, until the file is changed again.
    dropped: bool,
}

/// File names by directory, then name: each directory's entries can be listed and synced
/// without looking at the others.
type Names = BTreeMap<PathBuf, BTreeMap<OsString, u64>>;

/// A path's directory and name.
fn split(path: &Path) -> (PathBuf, OsString) {
    (
        path.parent().unwrap_or(Path::new("/")).to_path_buf(),
        path.file_name().unwrap_or_default().to_owned(),
    )
}

fn lookup(names: &Names, path: &Path) -> Option<u64> {
    let (dir, name) = split(path);
    names.get(&dir)?.get(&name).copied()
}

#[derive(Default)]
struct State {
    /// File ids by directory and name, as the program sees the namespace.
    live_names: Names,
    /// File ids by directory and name, as they would be after a crash.
    durable_names: Names,
    files: HashMap<u64, Image>,
    dirs: Vec<PathBuf>,
    next_id: u64,
    failures: VecDeque<(Op, i32)>,
    capacity: u64,
    crashes: u64,
}

impl State {
    fn used(&self) -> u64 {
        self.live_names
            .values()
            .flat_map(|d| d.values())
            .filter_map(|id| self.files.get(id))
            .map(|f| f.live.len() as u64)
            .sum()
    }

    fn injected(&mut self, op: Op) -> io::Result<()> {
        if let Some(i) = self.failures.iter().position(|(o, _)| *o == op) {
            let (_, errno) = self.failures.remove(i).unwrap_or((op, libc::EIO));
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(())
    }

    fn image(&mut self, f: &FileHandle) -> io::Result<&mut Image> {
        let FileHandle::Mem(id) = f else {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
        self.files
            .get_mut(id)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }
}

/// An in-memory disk that can crash.
pub struct MemEngine {
    state: Mutex<State>,
}

impl MemEngine {
    /// An empty disk of `capacity` bytes.
    pub fn new(capacity: u64) -> MemEngine {
        MemEngine {
            state: Mutex::new(State {
                capacity,
                ..Default::default()
            }),
        }
    }

    /// Loses everything not made durable. Handles opened before stay usable only if their file
    /// survived; reopen files after a crash, as a restarted process would.
    pub fn crash(&self) {
        let mut st = self.state.lock();
        st.live_names = st.durable_names.clone();
        let keep: std::collections::HashSet<u64> = st
            .durable_names
            .values()
            .flat_map(|d| d.values().copied())
            .collect();
        st.files.retain(|id, _| keep.contains(id));
        for img in st.files.values_mut() {
            img.live = img.durable.clone();
            img.dropped = false;
        }
        st.failures.clear();
        st.crashes += 1;
    }

    /// Makes the next operation of kind `op` fail with `errno`.
    pub fn fail_next(&self, op: Op, errno: i32) {
        self.state.lock().failures.push_back((op, errno));
    }

    /// Changes the capacity; writes that would need more space fail with ENOSPC.
    pub fn set_capacity(&self, bytes: u64) {
        self.state.lock().capacity = bytes;
    }

    /// The live bytes of the file at `path`, for tests that corrupt or inspect the disk.
    pub fn with_file<T>(&self, path: &Path, f: impl FnOnce(&mut Vec<u8>) -> T) -> Option<T> {
        let mut st = self.state.lock();
        let id = lookup(&st.live_names, path)?;
        st.files.get_mut(&id).map(|img| f(&mut img.live))
    }
}

fn ready<T: Send + 'static>(v: T) -> BoxFuture<T> {
    Box::pin(async move { v })
}

fn not_found() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

impl Engine for MemEngine {
    fn boot_id(&self) -> String {
        format!("mem-{}", self.state.lock().crashes)
    }

    fn on_disk(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "mem"
    }

    fn open(&self, path: &Path, mode: OpenMode, _direct: bool) -> io::Result<FileHandle> {
        let mut st = self.state.lock();
        if let Some(id) = lookup(&st.live_names, path) {
            if mode == OpenMode::CreateNew {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            return Ok(FileHandle::Mem(id));
        }
        if mode == OpenMode::Existing {
            return Err(not_found());
        }
        let parent = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        if !st.dirs.contains(&parent) {
            return Err(not_found());
        }
        st.next_id += 1;
        let id = st.next_id;
        st.files.insert(id, Image::default());
        let (dir, name) = split(path);
        st.live_names.entry(dir).or_default().insert(name, id);
        Ok(FileHandle::Mem(id))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let (dir, name) = split(path);
        st.live_names
            .get_mut(&dir)
            .and_then(|d| d.remove(&name))
            .map(|_| ())
            .ok_or_else(not_found)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let ((from_dir, from_name), (to_dir, to_name)) = (split(from), split(to));
        if !st.dirs.contains(&to_dir) {
            return Err(not_found());
        }
        let id = st
            .live_names
            .get_mut(&from_dir)
            .and_then(|d| d.remove(&from_name))
            .ok_or_else(not_found)?;
        st.live_names.entry(to_dir).or_default().insert(to_name, id);
        Ok(())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // Directories are durable at once: the targets create them once, at format time.
        let mut st = self.state.lock();
        for dir in path.ancestors() {
            if !st.dirs.iter().any(|d| d == dir) {
                st.dirs.push(dir.to_path_buf());
            }
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let live = st.live_names.get(path).cloned().unwrap_or_default();
        st.durable_names.insert(path.to_path_buf(), live);
        Ok(())
    }

    fn len(&self, f: &FileHandle) -> io::Result<u64> {
        Ok(self.state.lock().image(f)?.live.len() as u64)
    }

    fn set_len(&self, f: &FileHandle, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        let grow = len.saturating_sub(st.image(f)?.live.len() as u64);
        if grow > 0 && st.used() + grow > st.capacity {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let img = st.image(f)?;
        img.live.resize(len as usize, 0);
        img.dropped = false;
        Ok(())
    }

    fn punch(&self, f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        let img = st.image(f)?;
        let end = (offset.saturating_add(len) as usize).min(img.live.len());
        if let Some(r) = img.live.get_mut(offset as usize..end) {
            r.fill(0);
        }
        img.dropped = false;
        Ok(())
    }

    fn allocate(&self, f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        let end = offset.saturating_add(len);
        let grow = end.saturating_sub(st.image(f)?.live.len() as u64);
        if grow > 0 && st.used() + grow > st.capacity {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let st = self.state.lock();
        let files = st
            .live_names
            .get(dir)
            .into_iter()
            .flat_map(|d| d.keys())
            .map(|name| dir.join(name));
        let dirs = st.dirs.iter().filter(|p| p.parent() == Some(dir)).cloned();
        Ok(files.chain(dirs).collect())
    }

    fn space(&self, _path: &Path) -> io::Result<Space> {
        let st = self.state.lock();
        Ok(Space {
            total: st.capacity,
            free: st.capacity.saturating_sub(st.used()),
        })
    }

    fn read_at(
        &self,
        f: &FileHandle,
        offset: u64,
        mut buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        let r = self.read_inline(f, offset, &mut buf);
        ready((buf, r))
    }

    fn write_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        let r = self.write_inline(f, offset, &buf).map(|()| buf.len());
        ready((buf, r))
    }

    fn read_inline(&self, f: &FileHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut st = self.state.lock();
        st.injected(Op::Read)?;
        let img = st.image(f)?;
        let start = (offset as usize).min(img.live.len());
        let n = buf.len().min(img.live.len() - start);
        buf[..n].copy_from_slice(&img.live[start..start + n]);
        Ok(n)
    }

    fn write_inline(&self, f: &FileHandle, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        st.injected(Op::Write)?;
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        let grow = end.saturating_sub(st.image(f)?.live.len() as u64);
        if grow > 0 && st.used() + grow > st.capacity {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let img = st.image(f)?;
        if img.live.len() < end as usize {
            img.live.resize(end as usize, 0);
        }
        img.live[offset as usize..end as usize].copy_from_slice(buf);
        img.dropped = false;
        Ok(())
    }

    fn sync(&self, f: &FileHandle) -> BoxFuture<io::Result<()>> {
        let mut st = self.state.lock();
        let r = match st.injected(Op::Sync) {
            Ok(()) => st.image(f).map(|img| {
                if !img.dropped {
                    img.durable = img.live.clone();
                }
            }),
            Err(e) => {
                if let Ok(img) = st.image(f) {
                    img.dropped = true;
                }
                Err(e)
            }
        };
        ready(r)
    }
}
