//! The MDS's state in a directory of a real filesystem.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::MetaDisk;

/// Files in one directory; files written are kept open.
pub struct DirDisk {
    dir: PathBuf,
    open: Mutex<HashMap<String, Arc<File>>>,
}

impl DirDisk {
    pub fn new(dir: impl Into<PathBuf>) -> DirDisk {
        DirDisk {
            dir: dir.into(),
            open: Mutex::new(HashMap::new()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, name: &str) -> io::Result<Arc<File>> {
        if let Some(f) = self.open.lock().get(name) {
            return Ok(f.clone());
        }
        let existed = self.dir.join(name).exists();
        let f = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(self.dir.join(name))?,
        );
        if !existed {
            // The new name itself must survive a crash once the file is synced.
            self.sync_dir()?;
        }
        self.open.lock().insert(name.to_owned(), f.clone());
        Ok(f)
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

impl MetaDisk for DirDisk {
    fn space(&self) -> Option<(u64, u64)> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.dir.as_os_str().as_bytes()).ok()?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a statvfs the call fills.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return None;
        }
        let frag = st.f_frsize as u64;
        Some((
            (st.f_blocks as u64).saturating_mul(frag),
            (st.f_bavail as u64).saturating_mul(frag),
        ))
    }

    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.dir.join(name)) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write_at(&self, name: &str, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.file(name)?.write_all_at(bytes, offset)
    }

    fn set_len(&self, name: &str, len: u64) -> io::Result<()> {
        self.file(name)?.set_len(len)
    }

    fn sync(&self, name: &str) -> io::Result<()> {
        self.file(name)?.sync_all()
    }

    fn sync_data(&self, name: &str) -> io::Result<()> {
        self.file(name)?.sync_data()
    }

    fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join(name))?;
        self.open.lock().remove(name);
        self.sync_dir()
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.dir.join(name).exists())
    }
}
