//! The client for callers without an async runtime: each call runs to completion on a runtime
//! the wrapper owns.

use proto::FsErrorKind;
use std::future::Future;

use crate::client::Client;
use crate::error::{ClientError, Result};

/// A [`Client`] with its own runtime.
pub struct BlockingClient {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl BlockingClient {
    pub fn connect(mds: &str) -> Result<BlockingClient> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::fs(FsErrorKind::Io, format!("starting a runtime: {e}")))?;
        let client = rt.block_on(Client::connect(mds))?;
        Ok(BlockingClient { rt, client })
    }

    /// Runs `f` with the client and waits for it: `c.run(|c| async move { c.stat("/a").await })`.
    pub fn run<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = T>,
    {
        self.rt.block_on(f(self.client.clone()))
    }
}
