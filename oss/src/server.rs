//! One storage server, assembled and running: its targets registered with the MDS (which
//! assigns an index to each new one), served on any network, their space reported by a
//! heartbeat, and synced on the way down. `lode-oss` is argument parsing plus
//! [`local_targets`] and [`OssServer::start`]; in-process clusters (tests, the testbed) call the
//! same function with targets on in-memory or paced engines.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lnet::{call, AnyNet, Attach, NetError, Transport};
use proto::registry::{Heartbeat, RegisterTargets, TargetReport};
use proto::Nid;
use tokio::task::JoinHandle;

use crate::engine::Engine;
use crate::error::TargetError;
use crate::service::{OssService, ServiceSlot};
use crate::target::Target;

/// Most targets one server holds.
pub const MAX_TARGETS_PER_OSS: u32 = 256;
/// How long one registration or heartbeat call may take.
const MDS_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A target this server holds: the engine its bytes go through and its directory there. The
/// directory must hold a formatted target ([`Target::format`]), with or without an index.
#[derive(Clone)]
pub struct TargetHome {
    pub engine: Arc<dyn Engine>,
    pub root: PathBuf,
}

/// What a storage server runs with.
#[derive(Clone, Debug)]
pub struct OssConfig {
    /// The MDS to register with and heartbeat to: MDT0's, which assigns the targets their
    /// indices.
    pub mds: Nid,
    /// The MDS's other addresses (multi-rail).
    pub mds_rails: Vec<Nid>,

    /// Time between heartbeats.
    pub heartbeat_every: Duration,
    /// How long to keep trying to reach the MDS at start before giving up.
    pub mds_timeout: Duration,
    /// Where reads, writes and space are counted, for the metrics endpoint.
    pub metrics: Option<Arc<crate::metrics::OssMetrics>>,
    /// An operator's word for this run: the MDS's view of the targets' objects wins, so an
    /// orphan cleanup may destroy past its bound and a rolled-back LAST_ID is moved on
    /// ([`Target::trust_mds_objects`]).
    pub trust_mds_objects: bool,
    /// Whether streams go through the page cache or direct (see [`crate::io_policy`]).
    pub io: crate::io_policy::IoMode,
}

impl OssConfig {
    pub fn new(mds: Nid) -> OssConfig {
        OssConfig {
            mds,
            mds_rails: vec![],
            heartbeat_every: Duration::from_secs(5),
            mds_timeout: Duration::from_secs(60),
            metrics: None,
            trust_mds_objects: false,
            io: crate::io_policy::IoMode::Auto,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("a storage server holds 1 to {MAX_TARGETS_PER_OSS} targets, not {0}")]
    TargetCount(usize),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("attaching to the network: {0}")]
    Net(NetError),
    #[error("registering with the MDS at {mds}: {source}")]
    Register { mds: Nid, source: NetError },
    #[error("the MDS answered {got} indices for {sent} targets")]
    Indices { got: usize, sent: usize },
    #[error("reading {dir}: {source}")]
    DataDir {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// A running storage server.
pub struct OssServer {
    net: AnyNet,
    /// The endpoint of registration and heartbeats.
    caller: AnyNet,
    targets: Vec<Arc<Target>>,
    /// One per MDS: registration (for the other MDTs') and heartbeats.
    heartbeats: Beats,
    metrics: Option<Arc<crate::metrics::OssMetrics>>,
}

impl OssServer {
    /// Binds at `at`, registers `homes` with the MDS (retrying while it cannot be reached,
    /// up to `cfg.mds_timeout`), writes the indices it assigns into the targets, serves them
    /// and starts the heartbeat.
    pub async fn start(
        cfg: OssConfig,
        homes: Vec<TargetHome>,
        at: &Attach,
    ) -> Result<OssServer, ServerError> {
        if homes.is_empty() || homes.len() > MAX_TARGETS_PER_OSS as usize {
            return Err(ServerError::TargetCount(homes.len()));
        }
        // Bind first: the MDS must be told where this server is. Until the targets have
        // their indices, requests are answered Busy.
        let slot = ServiceSlot::new();
        let net = at.serve(slot.clone()).await.map_err(ServerError::Net)?;
        let caller = match at.caller("mgmt") {
            Ok(c) => c,
            Err(e) => {
                net.shutdown();
                return Err(ServerError::Net(e));
            }
        };
        let (targets, heartbeats) = match Self::join(&cfg, homes, &net, &caller).await {
            Ok(t) => t,
            Err(e) => {
                net.shutdown();
                caller.shutdown();
                return Err(e);
            }
        };
        slot.set(OssService::new(
            targets.iter().cloned(),
            at.capability_key(),
            cfg.metrics.clone(),
        ));
        let indices: Vec<u32> = targets.iter().map(|t| t.index()).collect();
        tracing::info!(nid = %net.nid(), ?indices, "storage server serving");
        Ok(OssServer {
            net,
            caller,
            targets,
            heartbeats,
            metrics: cfg.metrics,
        })
    }

    /// Registration, index assignment and the heartbeat's start.
    async fn join(
        cfg: &OssConfig,
        homes: Vec<TargetHome>,
        net: &AnyNet,
        caller: &AnyNet,
    ) -> Result<(Vec<Arc<Target>>, Beats), ServerError> {
        // Measure each device before registering: a target the MDS knows of must answer at
        // once, not stay Busy through a probe of seconds while the MDS tries to fill its pool.
        let mut policies = Vec::with_capacity(homes.len());
        for home in &homes {
            policies.push(cfg.io.policy(&home.root, home.engine.on_disk()).await);
        }
        caller.set_peer_rails(&cfg.mds, &cfg.mds_rails);
        let register = RegisterTargets {
            oss: net.nid(),
            rails: net.rails(),
            targets: reports(&homes).await?,
        };
        let deadline = tokio::time::Instant::now() + cfg.mds_timeout;
        let registered = loop {
            match call(caller, &cfg.mds, &register, MDS_CALL_TIMEOUT).await {
                Ok(r) => break r,
                Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                    tracing::warn!(mds = %cfg.mds, error = %e, "MDS not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(source) => {
                    return Err(ServerError::Register {
                        mds: cfg.mds.clone(),
                        source,
                    })
                }
            }
        };
        if registered.indices.len() != homes.len() {
            return Err(ServerError::Indices {
                got: registered.indices.len(),
                sent: homes.len(),
            });
        }
        let mut targets = vec![];
        if registered.fs == 0 {
            return Err(ServerError::Target(TargetError::Refused(
                "the MDS named no filesystem".into(),
            )));
        }
        for (home, index) in homes.iter().zip(&registered.indices) {
            Target::bind(&home.engine, &home.root, *index, registered.fs).await?;
        }
        tracing::info!(filesystem = %registered.fs_name, uuid = %format_args!("{:032x}", registered.fs), "registered with the MDS");
        for (home, io) in homes.iter().zip(policies) {
            let target = Target::open(home.engine.clone(), &home.root).await?;
            if cfg.trust_mds_objects {
                target.trust_mds_objects();
            }
            tracing::info!(
                target = target.index(),
                reads = io.reads(),
                writes = io.writes(),
                "stream I/O"
            );
            target.set_io(io);
            targets.push(Arc::new(target));
        }
        let every = cfg.heartbeat_every.max(Duration::from_millis(10));
        let beats = Beats::default();
        let others = Others {
            beats: beats.clone(),
            joined: Default::default(),
            register,
            indices: registered.indices.clone(),
        };
        // The other MDTs MDT0 knows now; those that join later come with its heartbeats.
        match call(
            caller,
            &cfg.mds,
            &proto::registry::ListMdts {},
            MDS_CALL_TIMEOUT,
        )
        .await
        {
            Ok(list) => others.learn(caller, &list.mdts, &homes, every),
            Err(e) => tracing::warn!(mds = %cfg.mds, error = %e, "cannot list the other MDTs yet"),
        }
        beats.push(tokio::spawn(heartbeat(
            caller.clone(),
            cfg.mds.clone(),
            net.nid(),
            net.rails(),
            homes.clone(),
            every,
            Some(others),
        )));
        Ok((targets, beats))
    }

    /// Where clients and the MDS reach it.
    pub fn nid(&self) -> Nid {
        self.net.nid()
    }

    /// Brings the gauges of the metrics endpoint up to date: run before each scrape.
    pub fn metrics_refresh(&self) -> Option<daemon::metrics::Refresh> {
        let m = self.metrics.clone()?;
        let targets = self.targets.clone();
        Some(Arc::new(move || m.refresh(&targets)))
    }

    /// The indices of the targets it serves.
    pub fn indices(&self) -> Vec<u32> {
        self.targets.iter().map(|t| t.index()).collect()
    }

    /// Stops heartbeating and serving, then syncs every target.
    /// Reads every object of every target and reports the blocks failing their checksum.
    pub async fn scrub(&self) -> Result<Vec<crate::target::ScrubReport>, TargetError> {
        let mut out = vec![];
        for t in &self.targets {
            out.push(t.scrub().await?);
        }
        Ok(out)
    }

    /// Stops at once, as kill -9 would: no last sync (the kernel, or the simulated disk,
    /// keeps what was written).
    pub fn kill(self) {
        self.heartbeats.abort();
        self.net.shutdown();
        self.caller.shutdown();
    }

    pub async fn stop(self) -> Result<(), TargetError> {
        self.heartbeats.abort();
        self.net.shutdown();
        self.caller.shutdown();
        for t in &self.targets {
            t.sync_all().await?;
        }
        Ok(())
    }
}

/// Each target's label and space, as the MDS wants them.
async fn reports(homes: &[TargetHome]) -> Result<Vec<TargetReport>, TargetError> {
    let mut out = vec![];
    for h in homes {
        let label = Target::label(&h.engine, &h.root).await?;
        let space = h.engine.space(&h.root).map_err(|e| TargetError::Target {
            what: format!("{} space", h.root.display()),
            source: e,
        })?;
        out.push(TargetReport {
            index: label.index,
            uuid: label.uuid,
            fs: label.fs,
            total: space.total,
            free: space.free,
        });
    }
    Ok(out)
}

/// The server's registration and heartbeat tasks, one per MDS; aborted together.
#[derive(Clone, Default)]
struct Beats(Arc<parking_lot::Mutex<Vec<JoinHandle<()>>>>);

impl Beats {
    fn push(&self, h: JoinHandle<()>) {
        self.0.lock().push(h);
    }

    fn abort(&self) {
        for h in self.0.lock().drain(..) {
            h.abort();
        }
    }
}

/// What joining the other MDTs takes: MDT0's heartbeat answers name them, and the server
/// registers with each it has not yet.
#[derive(Clone)]
struct Others {
    beats: Beats,
    /// The MDTs joined, and where.
    joined: Arc<parking_lot::Mutex<std::collections::HashMap<u32, Nid>>>,
    register: RegisterTargets,
    /// The indices MDT0 gave the targets.
    indices: Vec<u32>,
}

impl Others {
    /// Joins every MDT of `mdts` not joined yet where it now serves.
    fn learn(
        &self,
        caller: &AnyNet,
        mdts: &[proto::registry::MdtInfo],
        homes: &[TargetHome],
        every: Duration,
    ) {
        let mut joined = self.joined.lock();
        for m in mdts {
            if joined.get(&m.index) == Some(&m.nid) {
                continue;
            }
            tracing::info!(mdt = m.index, nid = %m.nid, "joining another MDT");
            joined.insert(m.index, m.nid.clone());
            self.beats.push(tokio::spawn(join_other(
                caller.clone(),
                m.nid.clone(),
                self.register.clone(),
                self.indices.clone(),
                homes.to_vec(),
                every,
            )));
        }
    }
}

/// Registers the targets with the MDS of another MDT (`mds`), retrying while it cannot be
/// reached or refuses, then heartbeats to it. Its answer must give each target the index MDT0
/// gave (`indices`); a server whose targets another MDT knows by other indices is left
/// unregistered there, loudly.
async fn join_other(
    caller: AnyNet,
    mds: Nid,
    mut register: RegisterTargets,
    indices: Vec<u32>,
    homes: Vec<TargetHome>,
    every: Duration,
) {
    let mut warned = false;
    loop {
        // The labels now hold the indices and the filesystem MDT0 gave.
        match reports(&homes).await {
            Ok(t) => register.targets = t,
            Err(e) => tracing::warn!(error = %e, "cannot read the targets' labels"),
        }
        match call(&caller, &mds, &register, MDS_CALL_TIMEOUT).await {
            Ok(r) if r.indices == indices => {
                tracing::info!(%mds, "registered with the MDS of another MDT");
                break;
            }
            Ok(r) => {
                tracing::error!(%mds, theirs = ?r.indices, ours = ?indices, "the MDS of another MDT knows these targets by other indices: not serving it");
                return;
            }
            Err(e) => {
                if !warned {
                    tracing::warn!(%mds, error = %e, "cannot register with the MDS of another MDT yet; retrying");
                    warned = true;
                }
                tokio::time::sleep(every.min(Duration::from_secs(1))).await;
            }
        }
    }
    heartbeat(
        caller,
        mds,
        register.oss,
        register.rails,
        homes,
        every,
        None,
    )
    .await
}

/// Tells the MDS every `every` that this server is up and how much space its targets have.
async fn heartbeat(
    caller: AnyNet,
    mds: Nid,
    me: Nid,
    rails: Vec<Nid>,
    homes: Vec<TargetHome>,
    every: Duration,
    others: Option<Others>,
) {
    loop {
        tokio::time::sleep(every).await;
        let targets = match reports(&homes).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read target space");
                continue;
            }
        };
        let hb = Heartbeat {
            oss: me.clone(),
            rails: rails.clone(),
            targets,
        };
        match call(&caller, &mds, &hb, every.max(MDS_CALL_TIMEOUT)).await {
            Ok(ack) => {
                if let Some(o) = &others {
                    o.learn(&caller, &ack.mdts, &homes, every);
                }
            }
            Err(e) => tracing::warn!(mds = %mds, error = %e, "heartbeat failed"),
        }
    }
}

/// The targets of a server of local disks: every formatted target under `data_dir`, and new
/// ones formatted (without an index: the MDS assigns it) until there are `count`.
pub async fn local_targets(
    engine: &Arc<dyn Engine>,
    data_dir: &Path,
    count: u32,
) -> Result<Vec<TargetHome>, ServerError> {
    if count == 0 || count > MAX_TARGETS_PER_OSS {
        return Err(ServerError::TargetCount(count as usize));
    }
    let mut dirs = target_dirs(data_dir)?;
    while (dirs.len() as u32) < count {
        let uuid: u128 = rand::random();
        let root = data_dir.join(format!("ost-{uuid:032x}"));
        Target::format(engine, &root, uuid, None).await?;
        tracing::info!(dir = %root.display(), "formatted a new target");
        dirs.push(root);
    }
    Ok(dirs
        .into_iter()
        .map(|root| TargetHome {
            engine: engine.clone(),
            root,
        })
        .collect())
}

/// The formatted target directories under `dir` (each `ost-*` with a `TARGET` label).
pub fn target_dirs(dir: &Path) -> Result<Vec<PathBuf>, ServerError> {
    let err = |source| ServerError::DataDir {
        dir: dir.to_owned(),
        source,
    };
    let mut out = vec![];
    for e in std::fs::read_dir(dir).map_err(err)? {
        let p = e.map_err(err)?.path();
        if p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ost-"))
            && p.join("TARGET").exists()
        {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}
