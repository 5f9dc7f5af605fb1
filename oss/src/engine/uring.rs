//! The io_uring engine: dedicated threads, one ring each. Requests reach a thread through a
//! channel; the thread keeps up to `queue_depth` operations in the ring, and sleeps in the ring
//! itself, woken by completions or by an eventfd that senders write when it sleeps.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};
use tokio::sync::{oneshot, Semaphore};

use super::{os_file, AlignedBuf, BoxFuture, Engine, EngineConfig, FileHandle};

enum Kind {
    Read,
    Write,
    Fsync,
}

struct Request {
    kind: Kind,
    file: Arc<File>,
    offset: u64,
    buf: AlignedBuf,
    done: oneshot::Sender<(AlignedBuf, io::Result<usize>)>,
}

struct Worker {
    tx: crossbeam_channel::Sender<Request>,
    sleeping: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
}

pub struct Uring {
    workers: Vec<Worker>,
    next: AtomicUsize,
    slots: Arc<Semaphore>,
}

/// user_data of the eventfd read that wakes a sleeping ring.
const WAKE: u64 = u64::MAX;

impl Uring {
    /// Starts `cfg.threads` rings; fails if the kernel refuses io_uring.
    pub fn start(cfg: EngineConfig) -> io::Result<Uring> {
        let depth = cfg.queue_depth.clamp(1, 4096);
        let mut workers = Vec::new();
        for i in 0..cfg.threads.max(1) {
            // Entries for the operations plus the wake-up read.
            let ring = IoUring::new((depth as u32 + 1).next_power_of_two())?;
            // SAFETY: eventfd takes integer arguments and returns a new descriptor or -1.
            let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if efd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: efd is a fresh descriptor that nothing else owns.
            let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
            let (tx, rx) = crossbeam_channel::unbounded();
            let sleeping = Arc::new(AtomicBool::new(false));
            let (s, w) = (sleeping.clone(), wake.clone());
            std::thread::Builder::new()
                .name(format!("uring-{i}"))
                .spawn(move || {
                    if let Err(e) = run(ring, rx, depth, s, w) {
                        tracing::error!(error = %e, "io_uring thread stopped");
                    }
                })?;
            workers.push(Worker { tx, sleeping, wake });
        }
        Ok(Uring {
            slots: Arc::new(Semaphore::new(workers.len() * depth)),
            workers,
            next: AtomicUsize::new(0),
        })
    }

    fn submit(
        &self,
        kind: Kind,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        let file = match os_file(f) {
            Ok(file) => file.clone(),
            Err(e) => return Box::pin(async move { (buf, Err(e)) }),
        };
        let w = &self.workers[self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len()];
        let (tx, sleeping, wake, slots) = (
            w.tx.clone(),
            w.sleeping.clone(),
            w.wake.clone(),
            self.slots.clone(),
        );
        Box::pin(async move {
            let Ok(_permit) = slots.acquire_owned().await else {
                return (buf, Err(stopped()));
            };
            let (done, rx) = oneshot::channel();
            let req = Request {
                kind,
                file,
                offset,
                buf,
                done,
            };
            if let Err(e) = tx.send(req) {
                return (e.0.buf, Err(stopped()));
            }
            if sleeping.load(Ordering::SeqCst) {
                let one: u64 = 1;
                // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
                unsafe { libc::write(wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
            }
            rx.await
                .unwrap_or_else(|_| (AlignedBuf::zeroed(0), Err(stopped())))
        })
    }
}

fn stopped() -> io::Error {
    io::Error::other("io_uring engine stopped")
}

/// One ring's loop. In-flight requests live in `slots`, indexed by user_data.
///
/// Long by design: submission, completion and the slots they share are one loop; split, the
/// slot bookkeeping would cross function boundaries as borrowed state.
fn run(
    mut ring: IoUring,
    rx: crossbeam_channel::Receiver<Request>,
    depth: usize,
    sleeping: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
) -> io::Result<()> {
    let mut slots: Vec<Option<Request>> = (0..depth).map(|_| None).collect();
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut backlog: VecDeque<Request> = VecDeque::new();
    let mut wake_buf = [0u8; 8];
    let mut wake_armed = false;
    let mut disconnected = false;
    loop {
        // Take what has arrived, without blocking.
        loop {
            match rx.try_recv() {
                Ok(r) => backlog.push_back(r),
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        if disconnected && backlog.is_empty() && free.len() == depth {
            return Ok(());
        }
        // Fill the ring.
        while let (Some(_), Some(&slot)) = (backlog.front(), free.last()) {
            let Some(mut req) = backlog.pop_front() else {
                break;
            };
            let fd = types::Fd(req.file.as_raw_fd());
            let sqe = match req.kind {
                Kind::Read => opcode::Read::new(fd, req.buf.as_mut_ptr(), req.buf.len() as u32)
                    .offset(req.offset)
                    .build(),
                Kind::Write => opcode::Write::new(fd, req.buf.as_ptr(), req.buf.len() as u32)
                    .offset(req.offset)
                    .build(),
                Kind::Fsync => opcode::Fsync::new(fd).build(),
            }
            .user_data(slot as u64);
            // SAFETY: the buffer and file live in `slots[slot]` until the completion arrives.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                backlog.push_front(req);
                break;
            }
            free.pop();
            slots[slot] = Some(req);
        }
        if !wake_armed {
            let sqe = opcode::Read::new(types::Fd(wake.as_raw_fd()), wake_buf.as_mut_ptr(), 8)
                .build()
                .user_data(WAKE);
            // SAFETY: wake_buf lives as long as this loop, which outlives the ring's use of it.
            if unsafe { ring.submission().push(&sqe) }.is_ok() {
                wake_armed = true;
            }
        }
        // Sleep in the ring unless something is waiting to be submitted.
        sleeping.store(true, Ordering::SeqCst);
        let wait = if rx.is_empty() { 1 } else { 0 };
        let r = ring.submit_and_wait(wait);
        sleeping.store(false, Ordering::SeqCst);
        match r {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::EINTR)
                    || e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        for cqe in ring.completion() {
            if cqe.user_data() == WAKE {
                wake_armed = false;
                continue;
            }
            let slot = cqe.user_data() as usize;
            let Some(mut req) = slots.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            free.push(slot);
            let res = cqe.result();
            if res < 0 {
                let _ = req
                    .done
                    .send((req.buf, Err(io::Error::from_raw_os_error(-res))));
                continue;
            }
            let n = res as usize;
            // A short read is end of file; a short write continues where it stopped.
            match req.kind {
                Kind::Write if n < req.buf.len() && n > 0 => {
                    let rest = req.buf.len() - n;
                    let mut tail = AlignedBuf::zeroed(rest);
                    tail.copy_from_slice(&req.buf[n..]);
                    let file = req.file.clone();
                    let r = std::os::unix::fs::FileExt::write_all_at(
                        &*file,
                        &tail,
                        req.offset + n as u64,
                    );
                    let _ = req.done.send((req.buf, r.map(|()| n + rest)));
                }
                Kind::Write if n == 0 && !req.buf.is_empty() => {
                    let _ = req
                        .done
                        .send((req.buf, Err(io::Error::from(io::ErrorKind::WriteZero))));
                }
                _ => {
                    let _ = req.done.send((
                        std::mem::replace(&mut req.buf, AlignedBuf::zeroed(0)),
                        Ok(n),
                    ));
                }
            }
        }
    }
}

impl Engine for Uring {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn read_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        self.submit(Kind::Read, f, offset, buf)
    }

    fn write_at(
        &self,
        f: &FileHandle,
        offset: u64,
        buf: AlignedBuf,
    ) -> BoxFuture<(AlignedBuf, io::Result<usize>)> {
        self.submit(Kind::Write, f, offset, buf)
    }

    fn sync(&self, f: &FileHandle) -> BoxFuture<io::Result<()>> {
        let fut = self.submit(Kind::Fsync, f, 0, AlignedBuf::zeroed(0));
        Box::pin(async move { fut.await.1.map(|_| ()) })
    }
}
