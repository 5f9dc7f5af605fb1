//! The portable engine: pread, pwrite and fsync on a pool of threads. It runs wherever io_uring
//! does not (old kernels, seccomp profiles that forbid it) and is the baseline io_uring must beat.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use tokio::sync::{oneshot, Semaphore};

use super::{os_file, AlignedBuf, BoxFuture, Engine, EngineConfig, FileHandle};

type Job = Box<dyn FnOnce() + Send>;

pub struct Psync {
    jobs: crossbeam_channel::Sender<Job>,
    /// Bounds the jobs queued or running: threads x queue depth.
    slots: Arc<Semaphore>,
}

impl Psync {
    pub fn start(cfg: EngineConfig) -> Psync {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..cfg.threads.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("psync-{i}"))
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a psync thread");
            }
        }
        Psync {
            jobs: tx,
            slots: Arc::new(Semaphore::new(cfg.threads.max(1) * cfg.queue_depth.max(1))),
        }
    }

    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> BoxFuture<Option<T>> {
        let (jobs, slots) = (self.jobs.clone(), self.slots.clone());
        Box::pin(async move {
            let _permit = slots.acquire_owned().await.ok()?;
            let (tx, rx) = oneshot::channel();
            jobs.send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .ok()?;
            rx.await.ok()
        })
    }
}

fn gone() -> io::Error {
    io::Error::other("psync engine stopped")
}

impl Engine for Psync {
    fn name(&self) -> &'static str {
        "psync"
    }

    fn read_at(
        &self,
        f: &FileHandle,
        offset: u64,
        mut buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        let file = match os_file(f) {
            Ok(file) => file.clone(),
            Err(e) => return Box::pin(async move { (buf, Err(e)) }),
        };
        let job = self.run(move || {
            let mut done = 0;
            let r = loop {
                if done == buf.len() {
                    break Ok(done);
                }
                match file.read_at(&mut buf[done..], offset + done as u64) {
                    Ok(0) => break Ok(done),
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            (buf, r)
        });
        Box::pin(async move {
            match job.await {
                Some(out) => out,
                None => (AlignedBuf::zeroed(0), Err(gone())),
            }
        })
    }

    fn write_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        let file = match os_file(f) {
            Ok(file) => file.clone(),
            Err(e) => return Box::pin(async move { (buf, Err(e)) }),
        };
        let job = self.run(move || {
            let r = file.write_all_at(&buf, offset).map(|()| buf.len());
            (buf, r)
        });
        Box::pin(async move {
            match job.await {
                Some(out) => out,
                None => (AlignedBuf::zeroed(0), Err(gone())),
            }
        })
    }

    fn sync(&self, f: &FileHandle) -> BoxFuture<io::Result<()>> {
        let file = match os_file(f) {
            Ok(file) => file.clone(),
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let job = self.run(move || file.sync_all());
        Box::pin(async move { job.await.unwrap_or_else(|| Err(gone())) })
    }
}
