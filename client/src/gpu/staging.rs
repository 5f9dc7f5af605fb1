//! The staging ring: pinned host chunks, registered once with the transport and reused, that
//! device reads and writes pass through when they cannot go direct.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lnet::{Registered, Transport};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{GpuBackend, GpuError, PinnedBuf};

pub(crate) struct Staging {
    chunk: usize,
    slots: Arc<Semaphore>,
    free: Mutex<Vec<Arc<Registered<PinnedBuf>>>>,
    /// Bytes that passed through the ring since the client connected.
    pub(crate) bytes: AtomicU64,
}

/// A chunk of the ring, taken for one transfer; it goes back to the ring when dropped.
pub(crate) struct Slot {
    pub(crate) region: Arc<Registered<PinnedBuf>>,
    staging: Arc<Staging>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.staging.free.lock().push(self.region.clone());
    }
}

impl Staging {
    pub(crate) fn new(chunk: usize, chunks: usize) -> Arc<Staging> {
        Arc::new(Staging {
            chunk: chunk.max(4096),
            slots: Arc::new(Semaphore::new(chunks.max(1))),
            free: Mutex::new(vec![]),
            bytes: AtomicU64::new(0),
        })
    }

    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// A free chunk, allocated and registered on first use; waits while all are in use.
    pub(crate) async fn take(
        self: &Arc<Self>,
        gpu: &dyn GpuBackend,
        net: &impl Transport,
    ) -> Result<Slot, GpuError> {
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| GpuError::Staging("closed".into()))?;
        let reused = self.free.lock().pop();
        let region = match reused {
            Some(r) => r,
            None => Arc::new(
                net.register(gpu.alloc_pinned(self.chunk)?)
                    .map_err(|e| GpuError::Staging(e.to_string()))?,
            ),
        };
        Ok(Slot {
            region,
            staging: self.clone(),
            _permit: permit,
        })
    }

    pub(crate) fn count(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }
}
