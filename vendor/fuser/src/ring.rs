//! FUSE over io_uring (Linux 6.14 and later, with the fuse module's `enable_uring` on).
//!
//! Once the INIT handshake has agreed on `FUSE_OVER_IO_URING`, one thread per possible CPU,
//! pinned to that CPU, registers ring entries for the CPU's queue. From the moment every queue
//! has entries, the kernel hands each request to the queue of the CPU it was made on, so the
//! request is served on the core of the process that waits for it, and a reply together with
//! the wait for the next request is one system call (commit and fetch). Forgets, interrupts and
//! notifications still travel over /dev/fuse, whose readers keep running beside the rings.
//!
//! An entry is a header buffer (the request's `fuse_in_header`, the operation's own header and
//! the entry's commit id and payload size) and a payload buffer (names, write data; on the way
//! back, the reply's body). The kernel writes an entry only between a fetch and its completion,
//! and reads it only at a commit, so the thread that took a request (or the one its reply is
//! handed to) owns the entry's buffers until it commits.

use std::cell::UnsafeCell;
use std::fmt;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `FUSE_IO_URING_CMD_REGISTER`: hand an entry to the kernel for the first time.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: answer the entry's request and wait for the next.
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_in_header`.
const IN_HEADER: usize = 40;
/// `struct fuse_out_header`.
const OUT_HEADER: usize = 16;
/// Where `struct fuse_uring_req_header` keeps the operation's header (`op_in`).
const OP_IN: usize = 128;
/// The room for the operation's header.
const OP_IN_SIZE: usize = 128;
/// Where it keeps `struct fuse_uring_ent_in_out` (flags, commit id, payload size).
const ENT_IN_OUT: usize = OP_IN + OP_IN_SIZE;
/// `sizeof(struct fuse_uring_req_header)`.
const HEADER_SIZE: usize = ENT_IN_OUT + 32;
/// Entries per queue: requests of one CPU that can be in the daemon at once (more wait in the
/// kernel's queue for an entry).
const DEPTH: usize = 8;

/// The CPUs the kernel counts queues for (`nr_cpu_ids`): the highest possible CPU, plus one.
pub(crate) fn queues() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map(|last| last + 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One entry's buffers; see the module's comment for who may touch them when.
struct Entry {
    header: UnsafeCell<Vec<u8>>,
    payload: UnsafeCell<Vec<u8>>,
    /// The two buffers, as the kernel reads them at registration.
    iov: UnsafeCell<[libc::iovec; 2]>,
    /// The commit id of the request it holds (0: not registered yet).
    commit_id: AtomicU64,
}

/// One CPU's queue: its ring and entries.
pub(crate) struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Pushes to the submission queue come from the ring's thread and from any thread a reply
    /// was handed to.
    sq: Mutex<()>,
    entries: Vec<Entry>,
    payload_size: usize,
    /// The /dev/fuse file the commands name, kept open as long as the queue.
    dev: Channel,
}

// SAFETY: an entry's buffers are touched by one thread at a time (the module's comment says
// which); the ring's submission queue is pushed to under `sq` and its completion queue is read
// by the queue's own thread alone.
unsafe impl Sync for Queue {}
// SAFETY: as above; nothing in it belongs to a thread.
unsafe impl Send for Queue {}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue").field("qid", &self.qid).finish()
    }
}

/// Where a request that came over a ring is answered: its entry.
#[derive(Clone, Debug)]
pub(crate) struct RingSlot {
    queue: Arc<Queue>,
    entry: usize,
    /// For what still goes over /dev/fuse (backing files).
    pub(crate) ch: ChannelSender,
}

impl RingSlot {
    /// Writes the reply (`fuse_out_header` and body) into the entry and commits it.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let q = &self.queue;
        let e = &q.entries[self.entry];
        let total: usize = data.iter().map(|d| d.len()).sum();
        if total < OUT_HEADER {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "short reply"));
        }
        // SAFETY: the entry's request is answered once, by this call: nobody else touches its
        // buffers until the commit below hands them back to the kernel.
        let (header, payload) = unsafe { (&mut *e.header.get(), &mut *e.payload.get()) };
        let body = total - OUT_HEADER;
        if body > payload.len() {
            error!("a reply of {body} bytes exceeds the ring's {}", payload.len());
            let unique = &mut [0u8; 8];
            let mut at = 0;
            copy_out(data, |i, b| {
                if (8..16).contains(&i) {
                    unique[at] = b;
                    at += 1;
                }
            });
            header[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            header[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            header[8..16].copy_from_slice(unique);
            set_payload_size(header, 0);
        } else {
            let mut at = 0;
            for d in data {
                let mut d: &[u8] = d;
                if at < OUT_HEADER {
                    let n = d.len().min(OUT_HEADER - at);
                    header[at..at + n].copy_from_slice(&d[..n]);
                    at += n;
                    d = &d[n..];
                }
                let off = at - OUT_HEADER;
                payload[off..off + d.len()].copy_from_slice(d);
                at += d.len();
            }
            set_payload_size(header, body as u32);
        }
        q.submit(self.entry, CMD_COMMIT_AND_FETCH)
    }
}

/// Calls `f` with each byte of `data` and its index (for the rare path only).
fn copy_out(data: &[IoSlice<'_>], mut f: impl FnMut(usize, u8)) {
    data.iter()
        .flat_map(|d| d.iter().copied())
        .enumerate()
        .for_each(|(i, b)| f(i, b));
}

fn set_payload_size(header: &mut [u8], size: u32) {
    header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&size.to_ne_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Queue {
    fn new(qid: u16, dev: Channel, payload_size: usize) -> io::Result<Queue> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build((2 * DEPTH) as u32)?;
        let entries = (0..DEPTH)
            .map(|_| {
                let header = vec![0u8; HEADER_SIZE];
                let payload = vec![0u8; payload_size];
                Entry {
                    iov: UnsafeCell::new([
                        libc::iovec {
                            iov_base: header.as_ptr() as *mut libc::c_void,
                            iov_len: header.len(),
                        },
                        libc::iovec {
                            iov_base: payload.as_ptr() as *mut libc::c_void,
                            iov_len: payload.len(),
                        },
                    ]),
                    header: UnsafeCell::new(header),
                    payload: UnsafeCell::new(payload),
                    commit_id: AtomicU64::new(0),
                }
            })
            .collect();
        Ok(Queue {
            qid,
            ring,
            sq: Mutex::new(()),
            entries,
            payload_size,
            dev,
        })
    }

    /// Sends `cmd` for entry `i`: a registration, or the commit of the request it holds.
    fn submit(&self, i: usize, cmd: u32) -> io::Result<()> {
        let e = &self.entries[i];
        let commit_id = if cmd == CMD_REGISTER {
            0
        } else {
            e.commit_id.load(Ordering::Acquire)
        };
        // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
        let mut req = [0u8; 80];
        req[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        req[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.dev.as_fd().as_raw_fd()), cmd).cmd(req);
        if cmd == CMD_REGISTER {
            sqe = sqe.addr(Some(e.iov.get() as u64));
        }
        let mut sqe = sqe.build().user_data(i as u64);
        if cmd == CMD_REGISTER {
            // The registration names its two iovecs in the entry's `len`, which the opcode's
            // builder has no setter for (struct io_uring_sqe: `len` is the u32 at offset 24).
            const _: () = assert!(size_of::<squeue::Entry128>() == 128);
            // SAFETY: Entry128 is a repr(C) pair of the 64-byte SQE and its 64 bytes of command
            // data, with no padding and no invalid bit patterns.
            let raw = unsafe { &mut *(&raw mut sqe).cast::<[u8; 128]>() };
            raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        }
        let _held = self.sq.lock();
        // SAFETY: pushes are serialized by `sq`; the entry's buffers outlive the queue's ring.
        unsafe {
            let mut sq = self.ring.submission_shared();
            if sq.push(&sqe).is_err() {
                return Err(io::Error::other("fuse ring: submission queue full"));
            }
        }
        // On the queue's own thread the command goes with its next wait for completions (one
        // system call per request instead of two); the queue has room for a command per entry.
        if SERVING.get() == Some(self.qid) {
            HELD.set(true);
        } else {
            self.ring.submitter().submit()?;
        }
        Ok(())
    }

    /// Submits the commands this queue's thread has held back (before it dispatches another
    /// request, whose handling might wait on the kernel for a reply held back here).
    fn submit_held(&self) {
        if HELD.replace(false) {
            let _held = self.sq.lock();
            if let Err(err) = self.ring.submitter().submit() {
                warn!("fuse ring {}: cannot submit: {err}", self.qid);
            }
        }
    }

    /// Answers the request in entry `i` with an error, when it cannot be dispatched.
    fn fail(&self, i: usize, unique: u64, errno: i32) {
        let e = &self.entries[i];
        // SAFETY: the entry's request is ours until committed.
        let header = unsafe { &mut *e.header.get() };
        header[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
        header[4..8].copy_from_slice(&(-errno).to_ne_bytes());
        header[8..16].copy_from_slice(&unique.to_ne_bytes());
        set_payload_size(header, 0);
        if let Err(err) = self.submit(i, CMD_COMMIT_AND_FETCH) {
            error!("fuse ring {}: cannot commit an error: {err}", self.qid);
        }
    }
}

/// Starts one pinned thread per queue; each serves its queue until the connection ends.
pub(crate) fn start<FS: Filesystem>(
    ch: &Channel,
    payload_size: usize,
    mut event_loop: impl FnMut(String) -> SessionEventLoop<FS>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for qid in 0..queues() {
        let name = format!("fuser-ring-{qid}");
        let queue = match Queue::new(qid as u16, ch.clone(), payload_size) {
            Ok(q) => Arc::new(q),
            Err(err) => {
                warn!("fuse ring {qid}: cannot set up an io_uring ({err}); staying on /dev/fuse");
                continue;
            }
        };
        let se = event_loop(name.clone());
        match std::thread::Builder::new()
            .name(name)
            .spawn(move || serve(queue, &se))
        {
            Ok(t) => threads.push(t),
            Err(err) => warn!("fuse ring {qid}: cannot start its thread: {err}"),
        }
    }
    threads
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays inside it for cpu < its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * size_of::<libc::cpu_set_t>() {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            // An offline CPU: the queue still serves, from wherever the thread runs.
            debug!("fuse ring {cpu}: cannot pin: {}", io::Error::last_os_error());
        }
    }
}

thread_local! {
    /// The queue this thread serves, if it is a queue's thread.
    static SERVING: std::cell::Cell<Option<u16>> = const { std::cell::Cell::new(None) };
    /// Whether it has pushed commands it has not submitted yet.
    static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn serve<FS: Filesystem>(queue: Arc<Queue>, se: &SessionEventLoop<FS>) {
    let qid = queue.qid;
    pin(qid as usize);
    SERVING.set(Some(qid));
    let mut live = 0;
    for i in 0..queue.entries.len() {
        match queue.submit(i, CMD_REGISTER) {
            Ok(()) => live += 1,
            Err(err) => warn!("fuse ring {qid}: cannot register an entry: {err}"),
        }
    }
    let mut buf = Vec::with_capacity(IN_HEADER + OP_IN_SIZE + queue.payload_size);
    let mut done = Vec::with_capacity(2 * DEPTH);
    while live > 0 {
        HELD.set(false);
        match queue.ring.submitter().submit_and_wait(1) {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
            Err(err) => {
                error!("fuse ring {qid}: {err}");
                return;
            }
        }
        done.clear();
        // SAFETY: only this thread reads the completion queue.
        done.extend(unsafe { queue.ring.completion_shared() }.map(|c| (c.user_data(), c.result())));
        for &(i, res) in &done {
            queue.submit_held();
            let i = i as usize;
            if i >= queue.entries.len() {
                continue;
            }
            if res == -libc::EAGAIN || res == -libc::EINTR {
                let cmd = if queue.entries[i].commit_id.load(Ordering::Acquire) == 0 {
                    CMD_REGISTER
                } else {
                    CMD_COMMIT_AND_FETCH
                };
                if queue.submit(i, cmd).is_err() {
                    live -= 1;
                }
                continue;
            }
            if res < 0 {
                // The connection ended (unmount, abort), or the kernel refused the entry.
                if res != -libc::ENOTCONN && res != -libc::ECONNABORTED && res != -libc::ENODEV {
                    warn!(
                        "fuse ring {qid}: entry {i} ended: {}",
                        io::Error::from_raw_os_error(-res)
                    );
                }
                live -= 1;
                continue;
            }
            dispatch(&queue, i, se, &mut buf);
        }
    }
    debug!("fuse ring {qid}: done");
}

/// Rebuilds the request in entry `i` as /dev/fuse would have delivered it, and dispatches it.
fn dispatch<FS: Filesystem>(
    queue: &Arc<Queue>,
    i: usize,
    se: &SessionEventLoop<FS>,
    buf: &mut Vec<u8>,
) {
    let e = &queue.entries[i];
    // SAFETY: the kernel has completed the fetch: the entry's buffers are ours until committed.
    let (header, payload) = unsafe { (&*e.header.get(), &*e.payload.get()) };
    let len = u32_at(header, 0) as usize;
    let unique = u64_at(header, 8);
    let commit_id = u64_at(header, ENT_IN_OUT + 8);
    let payload_len = u32_at(header, ENT_IN_OUT + 16) as usize;
    e.commit_id.store(commit_id, Ordering::Release);
    let op_len = len.checked_sub(IN_HEADER + payload_len);
    let Some(op_len) = op_len.filter(|&n| n <= OP_IN_SIZE && payload_len <= payload.len()) else {
        error!("fuse ring {}: a malformed request (length {len})", queue.qid);
        queue.fail(i, unique, libc::EIO);
        return;
    };
    buf.clear();
    buf.extend_from_slice(&header[..IN_HEADER]);
    buf.extend_from_slice(&header[OP_IN..OP_IN + op_len]);
    buf.extend_from_slice(&payload[..payload_len]);
    let slot = RingSlot {
        queue: queue.clone(),
        entry: i,
        ch: se.ch.sender(),
    };
    match RequestWithSender::with_sender(ReplySender::Ring(slot), buf) {
        Some(req) => {
            if let Ok(Operation::Destroy(_)) = req.request.operation() {
                req.reply::<ReplyEmpty>().ok();
            } else {
                req.dispatch(se);
            }
        }
        None => queue.fail(i, unique, libc::EIO),
    }
}
