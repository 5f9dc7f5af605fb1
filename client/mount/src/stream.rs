//! Write-behind and readahead for a file served to many small requests (the FUSE mount): the
//! kernel sends one request of at most 1 MiB at a time per stream, and these keep the striped
//! engine busy behind it.
//!
//! Writes are acknowledged once issued; a file's writes in flight are awaited before anything
//! reads it, asks its size, truncates it, flushes or syncs it, and the first error is returned
//! by the next of those (as NFS reports an unstable write's failure at close). Overlapping
//! writes never run at once, so the later one always wins. Readahead starts after two
//! sequential reads on a handle and keeps a window of chunks in flight; a write to the file
//! through any handle of this mount drops every window over it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use proto::Fid;
use tokio::task::{JoinHandle, JoinSet};

use client::File;
use client::{ClientError, Result};

/// Writes in flight for one file.
#[derive(Default)]
struct Behind {
    tasks: JoinSet<(u64, u64, Result<()>)>,
    ranges: Vec<(u64, u64)>,
    error: Option<ClientError>,
}

impl Behind {
    fn settle(&mut self, done: (u64, u64, Result<()>)) {
        let (start, end, r) = done;
        if let Some(i) = self.ranges.iter().position(|&x| x == (start, end)) {
            self.ranges.swap_remove(i);
        }
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }

    async fn drain(&mut self) {
        while let Some(r) = self.tasks.join_next().await {
            let done =
                r.unwrap_or_else(|e| (0, 0, Err(ClientError::posix(libc::EIO, e.to_string()))));
            self.settle(done);
        }
        self.ranges.clear();
    }
}

/// The state of one file across the handles of this mount.
#[derive(Default)]
struct PerFile {
    behind: tokio::sync::Mutex<Behind>,
    /// Bumped by every write or size change, so readahead windows know they are stale.
    epoch: std::sync::atomic::AtomicU64,
}

/// A handle's readahead window.
#[derive(Default)]
pub struct Ahead {
    /// Where the next sequential read would start.
    next: u64,
    /// Sequential reads seen in a row.
    streak: u32,
    epoch: u64,
    /// Chunks in flight or landed, in file order: (offset, read).
    chunks: VecDeque<(u64, JoinHandle<Result<Vec<u8>>>)>,
    /// Where the next chunk to issue starts.
    issued_to: u64,
    /// A chunk came back short: nothing to issue past it.
    eof: bool,
}

impl Ahead {
    /// Cancels the reads in flight and waits until they let go of the file.
    pub async fn stop(&mut self) {
        for (_, h) in self.chunks.drain(..) {
            h.abort();
            let _ = h.await;
        }
    }
}

/// Write-behind and readahead for the files of one mount.
pub struct Streams {
    files: Mutex<HashMap<Fid, Arc<PerFile>>>,
    /// Writes in flight per file before a new one waits.
    pub max_behind: usize,
    /// Readahead chunk size and how many chunks stay in flight.
    pub chunk: usize,
    pub ahead: usize,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            files: Mutex::default(),
            max_behind: 16,
            chunk: 1 << 20,
            ahead: 16,
        }
    }
}

impl Streams {
    fn of(&self, fid: Fid) -> Arc<PerFile> {
        self.files.lock().entry(fid).or_default().clone()
    }

    /// Forgets a file no handle holds any more, once its writes have landed.
    pub async fn release(&self, fid: Fid) -> Result<()> {
        let r = self.settle(fid).await;
        let mut files = self.files.lock();
        if files.get(&fid).is_some_and(|p| Arc::strong_count(p) == 1) {
            files.remove(&fid);
        }
        r
    }

    /// Issues a write and returns once it is in flight (or, at the limit, once an earlier one
    /// landed). An earlier write's failure is returned instead.
    pub async fn write(&self, file: &Arc<File>, offset: u64, data: Vec<u8>) -> Result<()> {
        let fid = file.inode().fid;
        let per = self.of(fid);
        per.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut b = per.behind.lock().await;
        if let Some(e) = b.error.take() {
            return Err(e);
        }
        let end = offset + data.len() as u64;
        if b.ranges.iter().any(|&(s, e)| s < end && offset < e) {
            b.drain().await;
        }
        while b.tasks.len() >= self.max_behind.max(1) {
            if let Some(r) = b.tasks.join_next().await {
                let done =
                    r.unwrap_or_else(|e| (0, 0, Err(ClientError::posix(libc::EIO, e.to_string()))));
                b.settle(done);
            }
        }
        if let Some(e) = b.error.take() {
            return Err(e);
        }
        // The size shows the write at once, as the kernel expects after the reply.
        file.issued_to(end);
        b.ranges.push((offset, end));
        let f = file.clone();
        b.tasks.spawn(async move {
            let r = f.write_at(offset, &data).await.map(|_| ());
            (offset, end, r)
        });
        Ok(())
    }

    /// Waits for the file's writes in flight, keeping any failure for `settle` to report.
    pub async fn wait(&self, fid: Fid) {
        let Some(per) = self.files.lock().get(&fid).cloned() else {
            return;
        };
        per.behind.lock().await.drain().await;
    }

    /// Waits for the file's writes in flight; returns the first failure not yet reported.
    pub async fn settle(&self, fid: Fid) -> Result<()> {
        let Some(per) = self.files.lock().get(&fid).cloned() else {
            return Ok(());
        };
        let mut b = per.behind.lock().await;
        b.drain().await;
        match b.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Marks the file changed other than by `write` (truncate, hole punching).
    pub fn changed(&self, fid: Fid) {
        if let Some(per) = self.files.lock().get(&fid) {
            per.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Reads `size` bytes at `offset` through `ahead`, the handle's window.
    pub async fn read(
        &self,
        file: &Arc<File>,
        ahead: &tokio::sync::Mutex<Ahead>,
        offset: u64,
        size: usize,
    ) -> Result<Vec<u8>> {
        let fid = file.inode().fid;
        self.wait(fid).await;
        let epoch = self.of(fid).epoch.load(std::sync::atomic::Ordering::SeqCst);
        let mut a = ahead.lock().await;
        if a.epoch != epoch || offset != a.next {
            a.chunks.clear(); // dropping a JoinHandle leaves its read to finish unseen
            a.eof = false;
            a.epoch = epoch;
            a.streak = if offset == a.next { a.streak + 1 } else { 0 };
        } else {
            a.streak += 1;
        }
        a.next = offset + size as u64;
        if a.streak < 2 {
            // Not (yet) a stream: read directly, letting other reads of the handle run too.
            drop(a);
            let mut buf = vec![0u8; size];
            let n = file.read_at(offset, &mut buf).await?;
            buf.truncate(n);
            return Ok(buf);
        }
        if a.chunks.is_empty() {
            a.issued_to = offset;
        }
        let mut out = Vec::with_capacity(size);
        let end = offset + size as u64;
        let mut at = offset;
        while at < end {
            self.top_up(file, &mut a);
            let Some((start, _)) = a.chunks.front() else {
                break; // past the end of the file
            };
            let start = *start;
            let (_, handle) = a.chunks.pop_front().expect("just looked");
            let data = handle
                .await
                .map_err(|e| ClientError::posix(libc::EIO, e.to_string()))??;
            let chunk_end = start + data.len() as u64;
            if (data.len()) < self.chunk {
                a.eof = true;
                a.chunks.clear();
            }
            if at >= chunk_end {
                if data.len() < self.chunk {
                    break;
                }
                continue;
            }
            let from = (at - start) as usize;
            let to = ((end.min(chunk_end)) - start) as usize;
            out.extend_from_slice(&data[from..to]);
            at = start + to as u64;
            if to < data.len() {
                // The rest of this chunk is the next read's start: keep it at the front.
                let rest = data;
                let keep = tokio::spawn(async move { Ok(rest) });
                a.chunks.push_front((start, keep));
                break;
            }
            if data.len() < self.chunk {
                break;
            }
        }
        self.top_up(file, &mut a);
        Ok(out)
    }

    fn top_up(&self, file: &Arc<File>, a: &mut Ahead) {
        while !a.eof && a.chunks.len() < self.ahead.max(1) {
            let (f, at, len) = (file.clone(), a.issued_to, self.chunk);
            let read = tokio::spawn(async move {
                let mut buf = vec![0u8; len];
                let n = f.read_at(at, &mut buf).await?;
                buf.truncate(n);
                Ok(buf)
            });
            a.chunks.push_back((at, read));
            a.issued_to += len as u64;
        }
    }
}
