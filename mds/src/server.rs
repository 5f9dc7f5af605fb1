//! One metadata server, assembled and running: the data directory locked, the registry and
//! the namespace's store opened, the allocator's maintenance loop started, the service served
//! on any network. `lode-mds` is argument parsing plus [`MdsServer::start`]; in-process
//! clusters (tests, the testbed) call the same function.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lnet::{AnyNet, Attach, NetError, Transport};
use proto::Nid;
use tokio::task::JoinHandle;

use crate::alloc::Allocator;
use crate::disk::MetaDisk;
use crate::format::FormatError;
use crate::registry::{Registry, RegistryError, HEARTBEAT_TIMEOUT};
use crate::service::MdsService;
use crate::store::{wall_clock, CommitMode, Store, StoreError, DEFAULT_CHECKPOINT_BYTES};

/// What an MDS runs with.
#[derive(Clone)]
pub struct MdsConfig {
    /// Where the journal, snapshots and the registry of targets live.
    pub data_dir: PathBuf,
    /// Journal bytes past which a snapshot is written.
    pub checkpoint_bytes: u64,
    /// How often the allocator refills object pools and destroys removed files' objects.
    pub maintain_every: Duration,
    /// A target not heard from for this long is reported down and gets no new stripes.
    pub heartbeat_timeout: Duration,
    /// Where the journal and snapshot go instead of `data_dir` (a crash-simulating disk, in
    /// tests and the simulator).
    pub disk: Option<Arc<dyn MetaDisk>>,
    /// After a start, how long clients have to count again the files they hold open; nothing
    /// is destroyed meanwhile.
    pub recovery_window: Duration,
    /// A client holding files open and not heard from for this long loses its handles.
    pub evict_after: Duration,
    /// The journal is committed at most this often, unless a caller waits for durability
    /// (zero: as soon as the previous commit is done). Changes answered before they are
    /// durable wait up to this long for their commit.
    pub commit_interval: Duration,
    /// Who writes the journal: a committer thread, or (a simulated cluster on one thread)
    /// each caller.
    pub commit: CommitMode,
    /// This run's instance, which clients' pings see change at a restart; random when `None`
    /// (a simulation names it, so that a seed replays exactly).
    pub instance: Option<u64>,
    /// The clock stamped on changes; the wall clock when `None` (a simulation gives its
    /// virtual one, so that a seed replays exactly).
    pub clock: Option<crate::store::Clock>,
    /// Whom the MDS trusts with root, and how client nodes' identities map.
    pub nodemap: crate::identity::Nodemap,
    /// How long a capability lasts.
    pub capability_lifetime: Duration,
    /// Where the audit log goes, if anywhere.
    pub audit: Option<crate::audit::AuditConfig>,
    /// Where changes and journal commits are counted, for the metrics endpoint.
    pub metrics: Option<Arc<crate::metrics::MdsMetrics>>,
    /// On an MDT other than 0: MDT0's MDS, which this one registers with (again at every
    /// `mdt_heartbeat`) so storage servers and clients learn where it serves.
    pub mdt0: Option<Nid>,
    pub mdt_heartbeat: Duration,
}

impl std::fmt::Debug for MdsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MdsConfig")
            .field("data_dir", &self.data_dir)
            .field("checkpoint_bytes", &self.checkpoint_bytes)
            .field("maintain_every", &self.maintain_every)
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("disk", &self.disk.as_ref().map(|_| "custom"))
            .field("recovery_window", &self.recovery_window)
            .field("evict_after", &self.evict_after)
            .field("commit_interval", &self.commit_interval)
            .field("commit", &self.commit)
            .field("instance", &self.instance)
            .field("clock", &self.clock.as_ref().map(|_| "custom"))
            .field("nodemap", &self.nodemap)
            .field("capability_lifetime", &self.capability_lifetime)
            .field("audit", &self.audit)
            .field("mdt0", &self.mdt0)
            .finish()
    }
}

/// How long clients have after an MDS start to count their open files again: several of
/// their pings ([`proto::md::MdsPing`]), with room for the resends of a restart.
pub const RECOVERY_WINDOW: Duration = Duration::from_secs(30);
/// How long a client holding files open may stay silent before it loses its handles.
pub const EVICT_AFTER: Duration = Duration::from_secs(120);

impl MdsConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> MdsConfig {
        MdsConfig {
            data_dir: data_dir.into(),
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            maintain_every: Duration::from_secs(1),
            heartbeat_timeout: HEARTBEAT_TIMEOUT,
            disk: None,
            recovery_window: RECOVERY_WINDOW,
            evict_after: EVICT_AFTER,
            commit_interval: Duration::ZERO,
            commit: CommitMode::Thread,
            instance: None,
            clock: None,
            nodemap: crate::identity::Nodemap::default(),
            capability_lifetime: crate::identity::CAPABILITY_LIFETIME,
            audit: None,
            metrics: None,
            mdt0: None,
            mdt_heartbeat: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Lock(#[from] daemon::LockError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("attaching to the network: {0}")]
    Net(#[from] NetError),
    #[error("the table of clients: {0}")]
    Clients(String),
    #[error("{0} holds MDT{1}, which registers with MDT0's MDS: give its address (--mdt0 / mdt0)")]
    NoMdt0(String, u32),
    #[error("opening the audit log {path}: {source}")]
    Audit {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A running MDS. Dropping it without [`MdsServer::stop`] leaves its tasks to the runtime.
pub struct MdsServer {
    net: AnyNet,
    /// The allocator's endpoint for its calls to the storage servers.
    caller: AnyNet,
    maintain: JoinHandle<()>,
    /// Closes the recovery window and evicts silent clients from the table.
    watcher: JoinHandle<()>,
    /// On an MDT other than 0: its registrations with MDT0.
    beat: Option<JoinHandle<()>>,
    registry: Arc<Registry>,
    store: Arc<Store>,
    clients: Arc<crate::recovery::Clients>,
    /// Files held open by clients.
    opens: Arc<crate::open::OpenFiles>,
    metrics: Option<Arc<crate::metrics::MdsMetrics>>,
    _lock: daemon::DataDirLock,
}

impl MdsServer {
    /// Opens the MDS's state in `cfg.data_dir` (recovering the journal) and serves it at `at`.
    pub async fn start(cfg: MdsConfig, at: &Attach) -> Result<MdsServer, ServerError> {
        let dir = cfg.data_dir.display().to_string();
        // Never made here: a missing directory is a volume not mounted or a path mistyped.
        if !cfg.data_dir.is_dir() {
            return Err(FormatError::NotFormatted { dir }.into());
        }
        let lock = daemon::DataDirLock::acquire(&cfg.data_dir)?;
        let disk: Arc<dyn MetaDisk> = match &cfg.disk {
            Some(disk) => disk.clone(),
            None => Arc::new(crate::disk::DirDisk::new(&cfg.data_dir)),
        };
        // Before anything is opened or served: which filesystem this is.
        let fs = crate::format::check(&*disk, &dir, rand::random())?;
        if fs.mdt != 0 && cfg.mdt0.is_none() {
            return Err(ServerError::NoMdt0(dir, fs.mdt));
        }
        let registry = Arc::new(
            Registry::open(&cfg.data_dir, fs.clone())?
                .with_heartbeat_timeout(cfg.heartbeat_timeout),
        );
        let instance = cfg.instance.unwrap_or_else(rand::random);
        let store = Arc::new(
            Store::open_with(
                disk,
                cfg.checkpoint_bytes,
                cfg.commit,
                cfg.clock.clone().unwrap_or_else(wall_clock),
            )?
            .with_gen_salt(instance),
        );
        store.set_commit_interval(cfg.commit_interval);
        let caller = at.caller("alloc")?;
        // A new filesystem has no clients of an earlier run to wait for.
        // Leases of the last run hold at most a term past its end: recovery outlasts them.
        let window = if store.fresh {
            Duration::ZERO
        } else {
            cfg.recovery_window.max(crate::lease::TERM)
        };
        let alloc = Allocator::with_net(registry.clone(), caller.clone())
            .recovering(window, cfg.evict_after)
            .in_run(instance);
        let clients = crate::recovery::Clients::open(store.disk(), store.clone(), window)
            .map_err(|e| ServerError::Clients(e.to_string()))?;
        alloc.wait_for_replays(clients.clone());
        let watcher = tokio::spawn(clients.clone().watch(cfg.evict_after));
        let maintain = tokio::spawn(alloc.clone().run(store.clone(), cfg.maintain_every));
        let granter = crate::identity::Granter {
            key: at.capability_key(),
            lifetime: cfg.capability_lifetime,
        };
        let audit =
            match &cfg.audit {
                Some(a) => Some(crate::audit::Audit::open(a.clone()).map_err(|source| {
                    ServerError::Audit {
                        path: a.path.clone(),
                        source,
                    }
                })?),
                None => None,
            };
        let opens = alloc.open.clone();
        let service = MdsService::new(
            registry.clone(),
            store.clone(),
            alloc,
            instance,
            crate::service::Policy {
                nodemap: cfg.nodemap.clone(),
                granter,
                audit,
                metrics: cfg.metrics.clone(),
                mdt0: cfg.mdt0.clone(),
            },
            clients.clone(),
        );
        let net = match at.serve(service).await {
            Ok(net) => net,
            Err(e) => {
                maintain.abort();
                watcher.abort();
                caller.shutdown();
                return Err(e.into());
            }
        };
        tracing::info!(nid = %net.nid(), dir = %cfg.data_dir.display(), filesystem = %fs, "MDS serving");
        let beat = cfg.mdt0.clone().filter(|_| fs.mdt != 0).map(|mdt0| {
            let r = proto::registry::RegisterMdt {
                mdt: fs.mdt,
                fs: fs.uuid,
                nid: net.nid(),
                rails: net.rails(),
                inodes: 0,
            };
            tokio::spawn(register_with_mdt0(
                caller.clone(),
                mdt0,
                r,
                store.clone(),
                cfg.mdt_heartbeat.max(Duration::from_millis(10)),
            ))
        });
        Ok(MdsServer {
            net,
            caller,
            maintain,
            watcher,
            beat,
            registry,
            store,
            clients,
            opens,
            metrics: cfg.metrics.clone(),
            _lock: lock,
        })
    }

    /// Where clients and storage servers reach it.
    pub fn nid(&self) -> Nid {
        self.net.nid()
    }

    /// The index of the MDT it serves.
    pub fn mdt(&self) -> u32 {
        self.registry.filesystem().mdt
    }

    /// Open handles it counts (files held open by clients).
    pub fn open_handles(&self) -> usize {
        self.opens.handles()
    }

    /// The storage targets it knows, with their liveness.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Brings the gauges of the metrics endpoint up to date: run before each scrape.
    pub fn metrics_refresh(&self) -> Option<daemon::metrics::Refresh> {
        let m = self.metrics.clone()?;
        let (store, clients, registry) = (
            self.store.clone(),
            self.clients.clone(),
            self.registry.clone(),
        );
        Some(Arc::new(move || {
            m.clients.set(clients.count() as i64);
            m.inodes.set(store.read(|ns| ns.len()) as i64);
            m.targets
                .set(registry.list().iter().filter(|t| t.up).count() as i64);
        }))
    }

    /// Without a committer thread, writes what the journal has queued now (a simulation's
    /// MDS committing behind chooses when); with one, nothing.
    pub fn commit_queued(&self) {
        self.store.commit_queued();
    }

    /// The replies the reply cache keeps, and their weight in bytes as saved.
    pub fn replies_kept(&self) -> (usize, usize) {
        self.store.read(|ns| ns.replies_weight())
    }

    /// The number of clients in the table of clients.
    pub fn clients_joined(&self) -> usize {
        self.clients.count()
    }

    /// The namespace's invariants that do not hold now (empty when sound), as `fsck` checks.
    pub fn fsck(&self) -> Vec<String> {
        self.store.read(|ns| ns.check())
    }

    /// A copy of the namespace as it stands (for checks across MDTs).
    pub fn namespace(&self) -> crate::namespace::Namespace {
        self.store.read(Clone::clone)
    }

    /// Stops as kill -9 would: the store writes nothing more (what was not committed is lost),
    /// then the server stops serving.
    pub async fn kill(self) {
        self.store.halt();
        self.stop().await;
    }

    /// Stops serving and closes the store (its committed journal is on disk).
    pub async fn stop(self) {
        if let Some(b) = &self.beat {
            b.abort();
        }
        self.net.shutdown();
        self.maintain.abort();
        self.watcher.abort();
        let _ = self.maintain.await;
        self.caller.shutdown();
        drop(self.store);
    }
}

/// Registers MDT `r.mdt` with MDT0's MDS every `every`, for as long as the MDS runs: MDT0
/// learns where it serves and that it is up. Failures are logged when they start and stop.
async fn register_with_mdt0(
    caller: AnyNet,
    mdt0: Nid,
    mut r: proto::registry::RegisterMdt,
    store: Arc<crate::store::Store>,
    every: Duration,
) {
    let mut failing: Option<String> = None;
    let mut first = true;
    loop {
        r.inodes = store.read(|ns| ns.len() as u64);
        match lnet::call(&caller, &mdt0, &r, every.max(Duration::from_secs(5))).await {
            Ok(_) => {
                if first || failing.take().is_some() {
                    tracing::info!(mdt = r.mdt, %mdt0, "registered with MDT0");
                }
                first = false;
            }
            Err(e) => {
                let e = e.to_string();
                if failing.as_ref() != Some(&e) {
                    tracing::warn!(mdt = r.mdt, %mdt0, error = %e, "cannot register with MDT0; retrying");
                    failing = Some(e);
                }
            }
        }
        // The first registrations come fast: storage servers and clients wait on them.
        let pause = if first {
            every.min(Duration::from_millis(200))
        } else {
            every
        };
        tokio::time::sleep(pause).await;
    }
}
