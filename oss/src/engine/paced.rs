//! An engine that holds another to a device's pace: a read and a write bandwidth, a time per
//! I/O and how many I/Os it works on at once, as a disk of those figures would. The testbed's
//! real-code mode gives each simulated target one, over the in-memory engine.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::{AlignedBuf, BoxFuture, Engine, FileHandle, OpenMode, Space};

/// A device's figures.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Bytes per second; 0 for no limit.
    pub read_bps: u64,
    pub write_bps: u64,
    /// Added to every data I/O (its service time, overlapping other I/Os' transfers).
    pub io_latency: Duration,
    /// Data I/Os in service at once; more wait for a slot (0: no limit). Random I/Os then
    /// complete `queue_depth` per `io_latency` and transfer.
    pub queue_depth: usize,
}

pub struct PacedEngine {
    inner: Arc<dyn Engine>,
    clock: Arc<Clock>,
    /// The device's queue: one permit per I/O in service.
    slots: Option<Arc<tokio::sync::Semaphore>>,
}

/// The device's channels: when each is next free.
struct Clock {
    pace: Pace,
    /// When the device's read and write channels are next free.
    free: Mutex<(Instant, Instant)>,
    enabled: std::sync::atomic::AtomicBool,
}

impl PacedEngine {
    pub fn new(inner: Arc<dyn Engine>, pace: Pace) -> PacedEngine {
        let now = Instant::now();
        PacedEngine {
            inner,
            clock: Arc::new(Clock {
                pace,
                free: Mutex::new((now, now)),
                enabled: std::sync::atomic::AtomicBool::new(true),
            }),
            slots: (pace.queue_depth > 0)
                .then(|| Arc::new(tokio::sync::Semaphore::new(pace.queue_depth))),
        }
    }

    /// Turns the pacing off (to lay down data before a measured run) or on again.
    pub fn set_enabled(&self, on: bool) {
        self.clock
            .enabled
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// An I/O of `len` bytes through `op`, once the device has a slot for it: it ends when the
    /// device would have finished it.
    fn paced<T: Send + 'static>(
        &self,
        len: usize,
        write: bool,
        op: impl FnOnce() -> BoxFuture<T> + Send + 'static,
    ) -> BoxFuture<T> {
        let (clock, slots) = (self.clock.clone(), self.slots.clone());
        Box::pin(async move {
            let _slot = match &slots {
                Some(s) if clock.enabled.load(std::sync::atomic::Ordering::SeqCst) => {
                    s.clone().acquire_owned().await.ok()
                }
                _ => None,
            };
            let due = clock.due(len, write);
            let r = op().await;
            tokio::time::sleep_until(due).await;
            r
        })
    }
}

impl Clock {
    /// When an I/O of `bytes` issued now completes: transfers queue behind each other at the
    /// channel's bandwidth, and each also waits one I/O time.
    fn due(&self, bytes: usize, write: bool) -> Instant {
        let now = Instant::now();
        if !self.enabled.load(std::sync::atomic::Ordering::SeqCst) {
            return now;
        }
        let bps = if write {
            self.pace.write_bps
        } else {
            self.pace.read_bps
        };
        let mut free = self.free.lock();
        let chan = if write { &mut free.1 } else { &mut free.0 };
        let start = (*chan).max(now);
        let took = if bps == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(bytes as f64 / bps as f64)
        };
        *chan = start + took;
        *chan + self.pace.io_latency
    }
}

impl Engine for PacedEngine {
    fn on_disk(&self) -> bool {
        self.inner.on_disk()
    }

    fn name(&self) -> &'static str {
        "paced"
    }

    fn boot_id(&self) -> String {
        self.inner.boot_id()
    }

    fn read_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        let (inner, f) = (self.inner.clone(), f.clone());
        self.paced(buf.len(), false, move || inner.read_at(&f, offset, buf))
    }

    fn write_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        let (inner, f) = (self.inner.clone(), f.clone());
        self.paced(buf.len(), true, move || inner.write_at(&f, offset, buf))
    }

    fn sync(&self, f: &FileHandle) -> BoxFuture<io::Result<()>> {
        self.inner.sync(f)
    }

    fn open(&self, path: &Path, mode: OpenMode, direct: bool) -> io::Result<FileHandle> {
        self.inner.open(path, mode, direct)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn len(&self, f: &FileHandle) -> io::Result<u64> {
        self.inner.len(f)
    }
    fn set_len(&self, f: &FileHandle, len: u64) -> io::Result<()> {
        self.inner.set_len(f, len)
    }
    fn punch(&self, f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        self.inner.punch(f, offset, len)
    }
    fn allocate(&self, f: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
        self.inner.allocate(f, offset, len)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.list(dir)
    }
    fn space(&self, path: &Path) -> io::Result<Space> {
        self.inner.space(path)
    }
    fn read_inline(&self, f: &FileHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read_inline(f, offset, buf)
    }
    fn write_inline(&self, f: &FileHandle, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_inline(f, offset, buf)
    }
    fn data_inline(&self) -> bool {
        false // every data I/O keeps the device's pace
    }
}
