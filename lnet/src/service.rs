//! The server side of RPC, shared by every backend: what a handler receives, how it moves bulk
//! data with the peer that called it, and the bounded queue in front of the handlers.
//!
//! The queue is a fixed number of slots. A request that finds no free slot is answered at once
//! with `Busy` and never executed, so an overloaded server costs its callers a retry, not its
//! own memory. Two kinds of request have slots of their own, so that clients cannot take them
//! away: long polls (a lease wait held open for a minute) wait in their own slots, and requests
//! from servers (a storage server's heartbeat and registration) have a reserve of slots
//! clients never take.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use proto::msg::{decode_body, encode_body};
use proto::stats::{ServerStats, ServerStatus, ServiceStatus};
use proto::{BulkDesc, FsErrorKind, Nid, Opcode, RemoteError, Rpc, StatusCode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Role;
use crate::error::NetError;
use crate::jobstats::JobTable;
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
    /// The job the caller works for, when it said ([`crate::job`]).
    pub job: Option<proto::JobId>,
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
    /// Whether every payload to and from this peer carries an authentication tag checked on
    /// the bytes where they land (a sealed connection): a checksum of the same bytes then
    /// checks nothing more.
    fn sealed(&self) -> bool {
        false
    }
}

/// What a server runs: one handler for every request it accepts.
pub trait Service: Send + Sync + 'static {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>>;

    /// What only the service can say of itself in the server's status answer (its targets,
    /// its journal); the RPC layer adds its own counts.
    fn status(&self) -> ServiceStatus {
        ServiceStatus::default()
    }

    /// The most shared slots one client connection may hold at once, when the service bounds
    /// it (the MDS: a client flooding over a few connections leaves the rest to others);
    /// `None` for no bound but the slots themselves.
    fn share_per_connection(&self, slots: usize) -> Option<usize> {
        let _ = slots;
        None
    }
}

/// Default number of requests a server holds at once (running or waiting for a thread).
pub const DEFAULT_QUEUE_SLOTS: usize = 512;

/// Long polls held at once ([`proto::msg::opcodes::MDS_LEASE_WAIT`]), in slots of their own.
pub const LONG_POLL_SLOTS: usize = 8192;

/// Slots kept for requests from servers, past the shared ones.
pub const SERVER_SLOTS: usize = 64;

/// Whether a request waits long by design (a long poll), and so takes a long poll's slot.
pub fn is_long_poll(opcode: Opcode) -> bool {
    opcode == proto::msg::opcodes::MDS_LEASE_WAIT
}

/// The job statistics' name for a client node's own counts: `node:` and its address.
pub const NODE_JOB: &str = "node:";

/// The bounded queue in front of a service.
#[derive(Clone)]
pub struct Dispatcher {
    service: Arc<dyn Service>,
    slots: Arc<Semaphore>,
    /// How many shared slots there are.
    shared: usize,
    /// Long polls' own slots.
    polls: Arc<Semaphore>,
    /// Slots only servers take, when the shared ones are full.
    servers: Arc<Semaphore>,
    metrics: Option<Arc<ServiceMetrics>>,
    jobs: Option<Arc<JobTable>>,
    started: std::time::Instant,
}

impl Dispatcher {
    pub fn new(service: Arc<dyn Service>, slots: usize) -> Self {
        Dispatcher {
            service,
            slots: Arc::new(Semaphore::new(slots.max(1))),
            shared: slots.max(1),
            polls: Arc::new(Semaphore::new(LONG_POLL_SLOTS)),
            servers: Arc::new(Semaphore::new(SERVER_SLOTS)),
            metrics: None,
            jobs: None,
            started: std::time::Instant::now(),
        }
    }

    /// Counts what the queue and the handlers do into `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<ServiceMetrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Counts each job's requests and bulk bytes into `jobs`.
    pub fn with_jobs(mut self, jobs: Option<Arc<JobTable>>) -> Self {
        self.jobs = jobs;
        self
    }

    /// The shared slots one client connection may hold at once, as the service bounds it.
    pub fn per_connection(&self) -> Option<usize> {
        self.service.share_per_connection(self.shared)
    }

    /// Counts a request refused because its connection holds its share.
    pub fn refused_busy(&self) {
        if let Some(m) = &self.metrics {
            m.refused_busy();
        }
    }

    /// Takes a slot for a request `opcode` from a peer of `role`, or `None` when its slots
    /// are full: a long poll's own, else a shared one, else (for a server) one of the
    /// servers' reserve.
    pub fn admit(&self, opcode: Opcode, role: Role) -> Option<Admitted> {
        let permit = if is_long_poll(opcode) {
            self.polls.clone().try_acquire_owned().ok()
        } else {
            self.slots.clone().try_acquire_owned().ok().or_else(|| {
                (role == Role::Server)
                    .then(|| self.servers.clone().try_acquire_owned().ok())
                    .flatten()
            })
        };
        let Some(permit) = permit else {
            if let Some(m) = &self.metrics {
                m.refused_busy();
            }
            return None;
        };
        Some(Admitted {
            dispatcher: self.clone(),
            _permit: permit,
        })
    }

    /// The answer to [`ServerStats`]: the RPC layer's counts and the service's own status.
    fn status(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let ask: ServerStats = req.decode()?;
        if ask.jobs && req.role != Role::Server {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "job statistics are for administrators (the cluster key)",
            ));
        }
        let (ops, errors, busy, serving) = self
            .metrics
            .as_ref()
            .map_or((vec![], 0, 0, 0), |m| m.counts());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let status = ServerStatus {
            now_unix_ms: now.as_millis() as u64,
            uptime_s: self.started.elapsed().as_secs(),
            counting: self.metrics.is_some(),
            ops,
            errors,
            busy,
            serving,
            service: self.service.status(),
            jobs: match (&self.jobs, ask.jobs) {
                (Some(jobs), true) => jobs.snapshot(),
                _ => vec![],
            },
        };
        reply::<ServerStats>(&status)
    }
}

/// A request's place in the queue; the slot is freed when the handler is done.
pub struct Admitted {
    dispatcher: Dispatcher,
    _permit: OwnedSemaphorePermit,
}

impl Admitted {
    /// Runs the handler; the caller sends what it returns as the reply.
    pub async fn run(self, req: Incoming, bulk: Arc<dyn BulkPeer>) -> Result<Vec<u8>, RemoteError> {
        let d = &self.dispatcher;
        let opcode = req.opcode;
        let started = d.metrics.as_ref().map(|m| {
            m.admitted(req.body.len());
            std::time::Instant::now()
        });
        // Counted per job the caller names, and per client node whatever it names (the
        // node's entry is `node:ADDR`, a name no caller may take for a job).
        let job = req
            .job
            .clone()
            .filter(|j| d.jobs.is_some() && !j.as_str().starts_with(NODE_JOB));
        let node = match (&req.from, &d.jobs, req.role) {
            (Nid::Tcp(a), Some(_), Role::Client) => {
                proto::JobId::new(&format!("{NODE_JOB}{}", a.ip())).ok()
            }
            _ => None,
        };
        let counted =
            (job.is_some() || node.is_some()).then(|| Arc::new(CountingBulk::new(bulk.clone())));
        let bulk = match &counted {
            Some(c) => c.clone() as Arc<dyn BulkPeer>,
            None => bulk,
        };
        let mut out = if opcode == proto::msg::opcodes::SERVER_STATS {
            d.status(&req)
        } else {
            d.service.clone().handle(req, bulk).await
        };
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
        if let (Some(m), Some(t)) = (&d.metrics, started) {
            m.answered(opcode, &out, t.elapsed());
        }
        if let (Some(jobs), Some(c)) = (&d.jobs, &counted) {
            let (put, got) = c.bytes();
            for j in job.iter().chain(node.iter()) {
                jobs.record(j, opcode, put, got);
            }
        }
        out
    }
}

/// A bulk peer that counts the bytes moved through it: those put are the caller's reads,
/// those got its writes.
struct CountingBulk {
    inner: Arc<dyn BulkPeer>,
    /// Bytes put, then bytes got.
    moved: Arc<[std::sync::atomic::AtomicU64; 2]>,
}

impl CountingBulk {
    fn new(inner: Arc<dyn BulkPeer>) -> Self {
        CountingBulk {
            inner,
            moved: Default::default(),
        }
    }

    fn bytes(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.moved[0].load(Relaxed), self.moved[1].load(Relaxed))
    }
}

impl BulkPeer for CountingBulk {
    fn put(&self, desc: &BulkDesc, data: Bytes) -> BoxFuture<'static, Result<(), NetError>> {
        let (n, moved) = (data.len() as u64, self.moved.clone());
        let fut = self.inner.put(desc, data);
        Box::pin(async move {
            let out = fut.await;
            if out.is_ok() {
                moved[0].fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
            out
        })
    }

    fn get(&self, desc: &BulkDesc) -> BoxFuture<'static, Result<Vec<u8>, NetError>> {
        let moved = self.moved.clone();
        let fut = self.inner.get(desc);
        Box::pin(async move {
            let out = fut.await;
            if let Ok(data) = &out {
                moved[1].fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            out
        })
    }

    fn sealed(&self) -> bool {
        self.inner.sealed()
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
