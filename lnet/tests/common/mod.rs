//! Services used by the network tests, each with one behaviour the tests need to provoke.
#![allow(dead_code)]

use std::sync::Arc;

use lnet::service::{reply, BoxFuture, BulkPeer, Incoming, Service};
use parking_lot::Mutex;
use proto::msg::Echo;
use proto::RemoteError;
use tokio::sync::Semaphore;

/// Echo that records every request it sees (payloads, in arrival order) and holds each one
/// until the test lets it go.
pub struct Gate {
    pub seen: Mutex<Vec<Vec<u8>>>,
    pub open: Arc<Semaphore>,
    pub entered: Arc<Semaphore>,
}

impl Gate {
    /// A gate that lets everything through at once.
    pub fn open() -> Arc<Self> {
        let g = Self::closed();
        g.open.add_permits(Semaphore::MAX_PERMITS / 2);
        g
    }

    /// A gate that holds every request until `release`.
    pub fn closed() -> Arc<Self> {
        Arc::new(Gate {
            seen: Mutex::new(Vec::new()),
            open: Arc::new(Semaphore::new(0)),
            entered: Arc::new(Semaphore::new(0)),
        })
    }

    pub fn release(&self, n: usize) {
        self.open.add_permits(n);
    }

    /// Waits until `n` requests are inside the handler.
    pub async fn wait_entered(&self, n: u32) {
        self.entered.acquire_many(n).await.unwrap().forget();
    }

    pub fn seen(&self) -> Vec<Vec<u8>> {
        self.seen.lock().clone()
    }
}

impl Service for Gate {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        _bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>> {
        Box::pin(async move {
            let e: Echo = req.decode()?;
            self.seen.lock().push(e.payload.clone());
            self.entered.add_permits(1);
            self.open.acquire().await.unwrap().forget();
            reply::<Echo>(&e)
        })
    }
}

pub fn echo(n: u64) -> Echo {
    Echo {
        payload: n.to_le_bytes().to_vec(),
    }
}
