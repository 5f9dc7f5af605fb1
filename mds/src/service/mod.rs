//! The metadata service as the network sees it: the registry of targets and the namespace.
//!
//! Callers state their own uid and groups, as NFS's AUTH_SYS and Lustre without Kerberos do;
//! the nodemap ([`crate::identity`]) decides what that claim is worth from the node it comes
//! from (root squashed unless the node is trusted). Only servers may register or heartbeat
//! targets. Opens come with capabilities for the file's objects.
//!
//! [`MdsService::dispatch`] is a table: one handler per request (`serve_*`), each decoding its
//! message, mapping the caller, checking what the caller may do and recording it in the audit
//! log in one place. The handlers live by family:
//!
//! - [`changes`]: namespace changes (`MDS_REINT`, `MDS_BATCH`, `MDS_RESERVE`);
//! - [`opens`]: opens, closes, reopens and the capabilities they grant;
//! - [`sessions`]: clients joining, pinging, leaving, replaying after a restart;
//! - [`leases`]: lease waits and directories held alone;
//! - [`names`]: lookups, attributes, directory pages, statfs;
//! - [`mdt`]: reads of the bytes the MDS keeps (Data-on-MDT);
//! - [`targets`]: storage targets' registration, heartbeats and list;
//! - [`mirrors`]: the administrators' mirror scan;
//! - [`remote`]: the halves of a mkdir and an rmdir across MDTs, and the calls between MDSs;
//! - [`striped`]: striped directories, their shards made and removed on their MDTs;
//! - [`hsm`]: data repository links, archive, release and restore, the copytools' queue;
//! - [`moves`]: renames of files to another MDT's directories, and names of other MDTs' files
//!   that go;
//!
//! and [`audit`] is what each records.

use std::collections::HashSet;
use std::sync::Arc;

use lnet::service::{reply, BoxFuture, BulkPeer, Incoming, Service};
use proto::layout::StripeObject;
use proto::md::*;
use proto::msg::opcodes;
use proto::registry::*;
use proto::{FsErrorKind, RemoteError, StatusCode};

use proto::layout::{Component, Layout, StripeCount, DEFAULT_STRIPE_SIZE};

use crate::alloc::Allocator;
use crate::audit::Audit;
use crate::identity::{Granter, Nodemap};
use crate::journal::Ticket;
use crate::lease::Leases;
use crate::namespace::{Decision, NsError};
use crate::recovery::Clients;
use crate::registry::{Registry, RegistryError};
use crate::store::{Store, StoreError};

mod audit;
mod changes;
mod hsm;
mod leases;
mod mdt;
mod mirrors;
mod moves;
mod names;
mod opens;
mod remote;
mod renames;
mod sessions;
mod spread;
mod striped;
mod targets;

/// How long a create waits for a maintenance pass when no target is in service yet, before it
/// answers Busy (well within a client's attempt time).
const MAINTAIN_IN_REQUEST: std::time::Duration = std::time::Duration::from_secs(1);

pub struct MdsService {
    registry: Arc<Registry>,
    store: Arc<Store>,
    alloc: Arc<Allocator>,
    /// This run of the MDS, as pings answer it.
    instance: u64,
    nodemap: Nodemap,
    granter: Granter,
    audit: Option<Arc<Audit>>,
    metrics: Option<Arc<crate::metrics::MdsMetrics>>,
    /// Clients that keep uncommitted changes, and the recovery after a restart.
    clients: Arc<Clients>,
    /// What clients may answer from their caches.
    leases: Arc<Leases>,
    /// The client ids each connection used.
    peers: crate::peers::Peers,
    /// MDT0's MDS, on another MDT: where the other MDTs are learnt.
    mdt0: Option<proto::Nid>,
    /// The numbers of this run's requests to other MDSs (their reply caches answer a copy
    /// the network made as the first).
    peer_seq: std::sync::atomic::AtomicU64,
    /// Held while a striped directory's shards are made or removed (one at a time).
    striping: tokio::sync::Mutex<()>,
    /// Whether the work across MDTs that outlives requests is under way
    /// ([`MdsService::across_mdts`]).
    settling: std::sync::atomic::AtomicBool,
    /// Wakes that work.
    across: Arc<tokio::sync::Notify>,
    /// Held while a rename to another MDT, or of a directory to another parent, is carried
    /// out (one at a time).
    moving: tokio::sync::Mutex<()>,
    /// Whether this MDS may hold the filesystem's rename lock with no rename under way (it
    /// restarted, or could not tell MDT0 it let go): let go once nothing holds it.
    lock_stale: std::sync::atomic::AtomicBool,
    /// How many top-level directories were placed ([`MdsService::spread_top_dir`]).
    spread_turn: std::sync::atomic::AtomicU64,
    /// The HSM actions queued and under way.
    hsm: crate::hsm::Coordinator,
}

/// What the MDS lets callers do and records of it: the nodemap, the capabilities it grants,
/// and the audit log.
pub struct Policy {
    pub nodemap: Nodemap,
    pub granter: Granter,
    pub audit: Option<Arc<Audit>>,
    /// Where changes and journal commits are counted, for the metrics endpoint.
    pub metrics: Option<Arc<crate::metrics::MdsMetrics>>,
    /// On an MDT other than 0: MDT0's MDS.
    pub mdt0: Option<proto::Nid>,
}

/// Opcodes served while clients replay after a restart; the rest are answered Busy.
const SERVED_IN_RECOVERY: &[proto::msg::Opcode] = &[
    opcodes::MDS_REGISTER_TARGETS,
    opcodes::MDS_HEARTBEAT,
    opcodes::MDS_LIST_TARGETS,
    opcodes::MDS_REGISTER_MDT,
    opcodes::MDS_LIST_MDTS,
    opcodes::MDS_PING,
    opcodes::MDS_CONNECT,
    opcodes::MDS_REPLAY,
    opcodes::MDS_REPLAY_DONE,
    opcodes::MDS_DISCONNECT,
    opcodes::MDS_REOPEN,
    opcodes::MDS_STATFS,
];

/// What an audit record says of an operation before it runs.
struct Audited {
    op: &'static str,
    fid: Option<proto::Fid>,
    path: Option<String>,
    to: Option<String>,
    detail: Option<String>,
}

fn ns_error(e: NsError) -> RemoteError {
    // A name in the middle of a move to another MDT: the client resends until it ends.
    if e.kind == FsErrorKind::WouldBlock {
        return RemoteError::new(StatusCode::Busy, e.what);
    }
    RemoteError::new(StatusCode::Fs(e.kind), e.what)
}

/// An allocation that failed: a target taken out of service while the objects were chosen
/// is Busy (the client resends, and the objects are chosen again); the rest as the namespace
/// says.
fn alloc_error(e: NsError) -> RemoteError {
    if e.kind == FsErrorKind::WouldBlock {
        return RemoteError::new(StatusCode::Busy, e.what);
    }
    ns_error(e)
}

fn store_error(e: StoreError) -> RemoteError {
    match e {
        StoreError::Namespace(e) => ns_error(e),
        StoreError::StaleRequest => {
            RemoteError::new(StatusCode::Fs(FsErrorKind::Stale), e.to_string())
        }
        other => RemoteError::new(StatusCode::Io, other.to_string()),
    }
}

impl MdsService {
    /// The service of one run of the MDS, named `instance` (nonzero; pings answer with it).
    pub fn new(
        registry: Arc<Registry>,
        store: Arc<Store>,
        alloc: Arc<Allocator>,
        instance: u64,
        policy: Policy,
        clients: Arc<Clients>,
    ) -> Arc<Self> {
        if let Some(m) = &policy.metrics {
            store.set_metrics(m.clone());
        }
        // Epochs follow the run's instance: random, unless a simulation named it.
        let leases = Arc::new(Leases::default().epochs_from(instance));
        alloc.recall_through(leases.clone());
        let service = Arc::new(MdsService {
            registry,
            store,
            alloc,
            instance: instance.max(1),
            nodemap: policy.nodemap,
            granter: policy.granter,
            audit: policy.audit,
            metrics: policy.metrics,
            clients,
            leases,
            peers: Default::default(),
            mdt0: policy.mdt0,
            peer_seq: std::sync::atomic::AtomicU64::new(1),
            striping: tokio::sync::Mutex::new(()),
            settling: std::sync::atomic::AtomicBool::new(false),
            across: Arc::new(tokio::sync::Notify::new()),
            moving: tokio::sync::Mutex::new(()),
            lock_stale: std::sync::atomic::AtomicBool::new(true),
            spread_turn: Default::default(),
            hsm: Default::default(),
        });
        service.hsm_rebuild();
        service
    }

    /// Refuses a recovery message meant for another run of the MDS (an earlier one: the
    /// client connects again and replays in this run's recovery).
    fn same_run(&self, instance: u64) -> Result<(), RemoteError> {
        if instance == self.instance {
            return Ok(());
        }
        Err(RemoteError::new(
            StatusCode::Fs(FsErrorKind::Stale),
            format!(
                "a recovery message for MDS run {instance:x}; this is run {:x}",
                self.instance
            ),
        ))
    }

    /// Refuses a client id past what one connection may use ([`crate::peers`]); servers are
    /// trusted with any.
    fn owns(&self, req: &Incoming, client: u128) -> Result<(), RemoteError> {
        if req.role == lnet::auth::Role::Server || self.peers.admit(&req.from, client) {
            return Ok(());
        }
        tracing::warn!(peer = %req.from, "a connection named more client ids than it may");
        Err(RemoteError::new(
            StatusCode::Fs(FsErrorKind::NotPermitted),
            format!(
                "one connection may use at most {} client ids",
                crate::peers::IDS_PER_CONNECTION
            ),
        ))
    }

    /// Registering and heartbeating targets is for servers, which hold the cluster key.
    fn server_only(&self, req: &Incoming) -> Result<(), RemoteError> {
        if req.role == lnet::auth::Role::Server {
            return Ok(());
        }
        tracing::warn!(peer = %req.from, opcode = ?req.opcode, "a client asked for a server's operation");
        Err(RemoteError::new(
            StatusCode::Fs(FsErrorKind::NotPermitted),
            format!("{:?} is for servers only", req.opcode),
        ))
    }

    /// One request, to its handler. While clients replay after a restart, only what recovery
    /// needs is served; the rest is answered Busy.
    async fn dispatch(&self, req: Incoming) -> Result<Vec<u8>, RemoteError> {
        // A batch may carry changes a client answered ahead before the restart: served, once
        // the replays are over, before anyone else's (`serve_batch` decides).
        if !SERVED_IN_RECOVERY.contains(&req.opcode)
            && req.opcode != opcodes::MDS_BATCH
            && self.clients.recovering()
        {
            return Err(RemoteError::new(
                StatusCode::Busy,
                "the MDS is recovering: clients are replaying their changes",
            ));
        }
        match req.opcode {
            opcodes::MDS_REGISTER_TARGETS => self.serve_register_targets(&req),
            opcodes::MDS_HEARTBEAT => self.serve_heartbeat(&req),
            opcodes::MDS_LIST_TARGETS => self.serve_list_targets(&req),
            opcodes::MDS_REGISTER_MDT => self.serve_register_mdt(&req),
            opcodes::MDS_LIST_MDTS => self.serve_list_mdts(&req),
            opcodes::MDS_REINT => self.serve_reint(&req).await,
            opcodes::MDS_BATCH => self.serve_batch(&req).await,
            opcodes::MDS_RESERVE => self.serve_reserve(&req).await,
            opcodes::MDS_OPEN => self.serve_open(&req).await,
            opcodes::MDS_CLOSE => self.serve_close(&req),
            opcodes::MDS_REOPEN => self.serve_reopen(&req),
            opcodes::MDS_PING => self.serve_ping(&req),
            opcodes::MDS_CONNECT => self.serve_connect(&req),
            opcodes::MDS_DISCONNECT => self.serve_disconnect(&req),
            opcodes::MDS_REPLAY => self.serve_replay(&req).await,
            opcodes::MDS_REPLAY_DONE => self.serve_replay_done(&req),
            opcodes::MDS_LEASE_WAIT => self.serve_lease_wait(&req).await,
            opcodes::MDS_SYNC => self.serve_sync(&req).await,
            opcodes::MDS_STATFS => self.serve_statfs(&req),
            opcodes::MDS_MIRROR_SCAN => self.serve_mirror_scan(&req),
            opcodes::MDS_LOOKUP => self.serve_lookup(&req).await,
            opcodes::MDS_LOOKUP_PATH => self.serve_lookup_path(&req).await,
            opcodes::MDS_GETATTR => self.serve_getattr(&req).await,
            opcodes::MDS_READ_MDT => self.serve_read_mdt(&req),
            opcodes::MDS_READDIR => self.serve_readdir(&req).await,
            opcodes::MDS_LEASE_ALONE => self.serve_lease_alone(&req),
            opcodes::MDS_HSM => self.serve_hsm(&req).await,
            other => Err(RemoteError::new(
                StatusCode::NoService,
                format!("the MDS does not serve {other:?}"),
            )),
        }
    }
}

impl MdsService {
    /// The node a client's request comes from (its open handles are bounded per node);
    /// `None` for servers.
    fn node_of(req: &Incoming) -> Option<std::net::IpAddr> {
        match (&req.from, req.role) {
            (proto::Nid::Tcp(a), lnet::auth::Role::Client) => Some(a.ip()),
            _ => None,
        }
    }
}

/// An inode as `creds` may see it: its xattrs only for whom may read the file (as
/// getxattr needs), and whether it is whole (a cut one is not leased: the client's cache
/// serves all its users).
fn shown(mut inode: Inode, creds: &Creds) -> (Inode, bool) {
    if inode.xattrs.is_empty() || inode.permits(creds, 4) {
        return (inode, true);
    }
    // A striped directory's layout stays: it is where its names are, which a caller that may
    // only search it needs as much as one that may read it.
    inode
        .xattrs
        .retain(|k, _| proto::dirstripe::is_internal_xattr(k));
    (inode, false)
}

/// The layout of a file that names none: one stripe of 4 MiB, as in Lustre.
pub fn default_layout() -> Layout {
    Layout {
        generation: 1,
        components: vec![Component::raid0(StripeCount::Count(1), DEFAULT_STRIPE_SIZE)],
    }
}

fn objects_of(l: &Layout) -> Vec<StripeObject> {
    l.components
        .iter()
        .flat_map(|c| c.objects.iter().copied())
        .collect()
}

impl Service for MdsService {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        _bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>> {
        if !self
            .settling
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tokio::spawn(Self::across_mdts(Arc::downgrade(&self)));
            tokio::spawn(Self::hsm_exporter(Arc::downgrade(&self)));
        }
        Box::pin(async move { self.dispatch(req).await })
    }

    /// A sixteenth of the slots (at least 8): a client's library keeps far fewer requests in
    /// flight on one connection (its changes go in batches).
    fn share_per_connection(&self, slots: usize) -> Option<usize> {
        Some((slots / 16).max(8))
    }

    fn status(&self) -> proto::stats::ServiceStatus {
        proto::stats::ServiceStatus {
            kind: "mds".into(),
            targets: vec![],
            journal: Some(proto::stats::JournalStatus {
                applied: self.store.last_applied(),
                committed: self.store.committed(),
                failed: self.store.failed(),
            }),
            clients: self.clients.count() as u64,
            inodes: self.store.read(|ns| ns.len()) as u64,
        }
    }
}
