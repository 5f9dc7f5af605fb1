//! The server side of RPC, shared by every backend: what a handler receives, how it moves bulk
//! data with the peer that called it, and the bounded queue in front of the handlers.
//!
//! The queue is a fixed number of slots. A request that finds no free slot is answered at once
//! with `Busy` and never executed, so an overloaded server costs its callers a retry, not its
//! own memory.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use proto::msg::{decode_body, encode_body};
use proto::{BulkDesc, Nid, Opcode, RemoteError, Rpc, StatusCode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Role;
use crate::error::NetError;
use crate::metrics::ServiceMetrics;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A request as a handler sees it.
#[derive(Debug)]
pub struct Incoming {
    /// The role the caller proved when it connected ([`Role::Server`] for every caller when
    /// authentication is off, and on the simulated fabric).
    pub role: Role,
    pub from: Nid,
    /// The NID the request was addressed to (this node, as the caller named it).
    pub to: Nid,
    pub opcode: Opcode,
    pub xid: u64,
    pub body: Vec<u8>,
}

impl Incoming {
    /// Decodes the body as `R`, or a `BadRequest` reply.
    pub fn decode<R: Rpc>(&self) -> Result<R, RemoteError> {
        decode_body(&self.body)
            .map_err(|e| RemoteError::new(StatusCode::BadRequest, format!("{:?}: {e}", R::OPCODE)))
    }
}

/// Encodes a typed reply body.
pub fn reply<R: Rpc>(r: &R::Reply) -> Result<Vec<u8>, RemoteError> {
    encode_body(r).map_err(|e| RemoteError::new(StatusCode::Internal, e.to_string()))
}

/// Moves bulk data between a server and the peer whose request it is serving. The peer owns the
/// memory; the descriptor came in the request.
pub trait BulkPeer: Send + Sync {
    /// Writes `data` into the peer's region (the data of a read). On return the bytes are on
    /// their way in order ahead of the reply, or the transfer has failed.
    fn put(&self, desc: &BulkDesc, data: Bytes) -> BoxFuture<'static, Result<(), NetError>>;
    /// Pulls the described range from the peer's region (the data of a write), verifying the
    /// descriptor's checksum when it carries one.
    fn get(&self, desc: &BulkDesc) -> BoxFuture<'static, Result<Vec<u8>, NetError>>;
}

/// What a server runs: one handler for every request it accepts.
pub trait Service: Send + Sync + 'static {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>>;
}

/// Default number of requests a server holds at once (running or waiting for a thread).
pub const DEFAULT_QUEUE_SLOTS: usize = 512;

/// The bounded queue in front of a service.
#[derive(Clone)]
pub struct Dispatcher {
    service: Arc<dyn Service>,
    slots: Arc<Semaphore>,
    metrics: Option<Arc<ServiceMetrics>>,
}

impl Dispatcher {
    pub fn new(service: Arc<dyn Service>, slots: usize) -> Self {
        Dispatcher {
            service,
            slots: Arc::new(Semaphore::new(slots.max(1))),
            metrics: None,
        }
    }

    /// Counts what the queue and the handlers do into `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<ServiceMetrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Takes a slot for a request, or `None` when the queue is full.
    pub fn admit(&self) -> Option<Admitted> {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            if let Some(m) = &self.metrics {
                m.refused_busy();
            }
            return None;
        };
        Some(Admitted {
            service: self.service.clone(),
            _permit: permit,
            metrics: self.metrics.clone(),
        })
    }
}

/// A request's place in the queue; the slot is freed when the handler is done.
pub struct Admitted {
    service: Arc<dyn Service>,
    _permit: OwnedSemaphorePermit,
    metrics: Option<Arc<ServiceMetrics>>,
}

impl Admitted {
    /// Runs the handler; the caller sends what it returns as the reply.
    pub async fn run(self, req: Incoming, bulk: Arc<dyn BulkPeer>) -> Result<Vec<u8>, RemoteError> {
        let opcode = req.opcode;
        let started = self.metrics.as_ref().map(|m| {
            m.admitted(req.body.len());
            std::time::Instant::now()
        });
        let mut out = self.service.clone().handle(req, bulk).await;
        if out
            .as_ref()
            .is_ok_and(|b| b.len() > proto::MAX_BODY as usize)
        {
            out = Err(RemoteError::new(
                StatusCode::Internal,
                "reply exceeds the body limit",
            ));
        }
        if let Err(e) = &out {
            tracing::debug!(?opcode, error = %e, "request failed");
        }
        if let (Some(m), Some(t)) = (&self.metrics, started) {
            m.answered(opcode, &out, t.elapsed());
        }
        out
    }
}

/// The error reply for a request refused because the queue is full.
pub fn busy() -> RemoteError {
    RemoteError::new(StatusCode::Busy, "server queue full")
}

/// Checks pulled data against the checksum its owner put in the descriptor.
pub(crate) fn verify_desc_crc(desc: &BulkDesc, data: &[u8]) -> Result<(), NetError> {
    if let Some(expected) = desc.crc32c {
        let actual = crc32c::crc32c(data);
        if actual != expected {
            return Err(NetError::Checksum { expected, actual });
        }
    }
    Ok(())
}
