//! A whole lode cluster in one process: an MDS, storage servers and clients, on loopback TCP
//! or on the simulated fabric. Servers start through [`mds::MdsServer::start`] and
//! [`oss::OssServer::start`], the calls `lode-mds` and `lode-oss` make, so targets join by
//! registration (the MDS assigns their indices) and stay up by heartbeats, as in production.
//!
//! Used by the cross-crate tests and the testbed's real-code mode. It never picks a port of
//! its own on TCP (the system gives one) and keeps every file under the scratch directory it is
//! given; targets live on whatever engines the caller hands it (in memory, paced, or on disk).

pub mod simulate;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use client::{Client, ClientConfig, ClientError};
use lnet::auth::{KeyFile, Keyring, Role, Security};
use lnet::sim::Fabric;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{AnyNet, Attach, NetError};
use mds::identity::Nodemap;
use mds::{MdsConfig, MdsServer};
use oss::engine::Engine;
use oss::{OssConfig, OssServer, Target, TargetError, TargetHome};
use proto::Nid;

/// Where the cluster's nodes meet.
#[derive(Clone)]
pub enum Network {
    /// Real sockets on 127.0.0.1, ports chosen by the system.
    Loopback,
    /// Named nodes of a simulated fabric: `mds`, `oss0`, `oss1`, ... and the clients' names.
    Fabric(Fabric),
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("starting the MDS: {0}")]
    Mds(#[from] mds::server::ServerError),
    #[error("starting storage server {index}: {source}")]
    Oss {
        index: usize,
        source: Box<oss::server::ServerError>,
    },
    #[error("formatting a target: {0}")]
    Format(#[from] TargetError),
    #[error("formatting the MDS: {0}")]
    FormatMds(#[from] mds::format::FormatError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("creating {path}: {source}")]
    Scratch {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("only {up} of {want} targets took new stripes within {within:?}")]
    NotReady {
        up: u32,
        want: u32,
        within: Duration,
    },
}

/// How to build a cluster.
pub struct ClusterBuilder {
    network: Network,
    scratch: PathBuf,
    servers: Vec<Vec<Arc<dyn Engine>>>,
    heartbeat_every: Duration,
    heartbeat_timeout: Duration,
    maintain_every: Duration,
    mds_disk: Option<Arc<dyn mds::disk::MetaDisk>>,
    recovery_window: Duration,
    evict_after: Duration,
    commit: mds::store::CommitMode,
    instance: Option<u64>,
    clock: Option<mds::store::Clock>,
    /// The cluster key on loopback (`None`: authentication off), and whether connections are
    /// encrypted.
    key: Option<KeyFile>,
    privacy: bool,
    nodemap: Nodemap,
    capability_lifetime: Duration,
    audit: Option<mds::audit::AuditConfig>,
    heal: Option<(client::mirrors::HealConfig, ClientConfig)>,
    /// Metadata targets: MDT0 (the MDS) and this many more, each on an MDS of its own.
    mdts: u32,
    /// Where MDT 1, 2, ... keep their journals, when not in their directories.
    mdt_disks: Vec<Arc<dyn mds::disk::MetaDisk>>,
}

impl ClusterBuilder {
    /// Serves `n` metadata targets, each on an MDS of its own (MDT0 is [`Cluster::mds`]; the
    /// others [`Cluster::mdt`]); the storage servers register with all of them.
    pub fn mdts(mut self, n: u32) -> ClusterBuilder {
        self.mdts = n.max(1);
        self
    }

    /// Keeps the next MDT's (1, then 2, ...) journal and snapshot on `disk` (a crash-simulating
    /// one) rather than in its directory.
    pub fn mdt_disk(mut self, disk: Arc<dyn mds::disk::MetaDisk>) -> ClusterBuilder {
        self.mdt_disks.push(disk);
        self
    }

    /// MDT `k`'s disk (not 0's): the one given, or its directory.
    fn disk_of_mdt(&self, k: u32, dir: &std::path::Path) -> Arc<dyn mds::disk::MetaDisk> {
        self.mdt_disks
            .get((k as usize).wrapping_sub(1))
            .cloned()
            .unwrap_or_else(|| Arc::new(mds::disk::DirDisk::new(dir)))
    }

    /// A cluster on `network` keeping the MDS's files under `scratch`.
    pub fn new(network: Network, scratch: impl Into<PathBuf>) -> ClusterBuilder {
        let mds = MdsConfig::new("");
        ClusterBuilder {
            network,
            scratch: scratch.into(),
            servers: vec![],
            heartbeat_every: OssConfig::new(Nid::sim("mds").expect("a valid name")).heartbeat_every,
            heartbeat_timeout: mds.heartbeat_timeout,
            maintain_every: Duration::from_millis(200),
            mds_disk: None,
            recovery_window: mds.recovery_window,
            evict_after: mds.evict_after,
            commit: mds.commit,
            instance: None,
            clock: None,
            key: Some(KeyFile::generate().expect("the system's random source")),
            privacy: false,
            // The tests' clients run as root on this machine, which trusts itself.
            nodemap: Nodemap::trusting(vec!["127.0.0.0/8".parse().expect("a valid range")]),
            capability_lifetime: mds.capability_lifetime,
            audit: None,
            heal: None,
            mdts: 1,
            mdt_disks: vec![],
        }
    }

    /// Runs the MDS's mirror healer beside it, as `lode-mds` does (off by default here, so a
    /// test sees a stale copy stay stale until it resyncs it). `client` is the healer's client
    /// settings; a given id is counted up each time the MDS restarts.
    pub fn heal(
        mut self,
        cfg: client::mirrors::HealConfig,
        client: ClientConfig,
    ) -> ClusterBuilder {
        self.heal = Some((cfg, client));
        self
    }

    /// Runs without authentication: every connection is let in (a baseline to measure the
    /// cost of authentication against).
    pub fn insecure(mut self) -> ClusterBuilder {
        self.key = None;
        self
    }

    /// Encrypts every connection.
    pub fn privacy(mut self) -> ClusterBuilder {
        self.privacy = true;
        self
    }

    /// Maps client identities with `nodemap` (by default, root on this machine is root).
    pub fn nodemap(mut self, nodemap: Nodemap) -> ClusterBuilder {
        self.nodemap = nodemap;
        self
    }

    /// How long the MDS's capabilities last (clients renew them).
    pub fn capability_lifetime(mut self, lifetime: Duration) -> ClusterBuilder {
        self.capability_lifetime = lifetime;
        self
    }

    /// Has the MDS write an audit log.
    pub fn audit(mut self, audit: mds::audit::AuditConfig) -> ClusterBuilder {
        self.audit = Some(audit);
        self
    }

    /// The servers' security settings.
    fn server_security(&self) -> Security {
        match &self.key {
            Some(k) => Security::Keyed {
                keys: Arc::new(Keyring::new(k)),
                role: Role::Server,
                privacy: self.privacy,
            },
            None => Security::Off,
        }
    }

    /// Keeps the MDS's journal and snapshot on `disk` (a crash-simulating one, say) rather
    /// than in the scratch directory.
    pub fn mds_disk(mut self, disk: Arc<dyn mds::disk::MetaDisk>) -> ClusterBuilder {
        self.mds_disk = Some(disk);
        self
    }

    /// Adds a storage server with one target on each of `engines` (targets may share one).
    pub fn storage_server(mut self, engines: Vec<Arc<dyn Engine>>) -> ClusterBuilder {
        self.servers.push(engines);
        self
    }

    /// Heartbeats every `every`; a target silent for `timeout` is down.
    pub fn heartbeat(mut self, every: Duration, timeout: Duration) -> ClusterBuilder {
        self.heartbeat_every = every;
        self.heartbeat_timeout = timeout;
        self
    }

    /// After an MDS start, how long clients have to count their open files again; and how
    /// long a client holding files open may stay silent before the MDS evicts it.
    pub fn open_recovery(mut self, window: Duration, evict_after: Duration) -> ClusterBuilder {
        self.recovery_window = window;
        self.evict_after = evict_after;
        self
    }

    /// Has each caller of the MDS write the journal instead of a committer thread, so that the
    /// whole cluster runs on one thread (under a virtual clock, say).
    pub fn inline_commit(mut self) -> ClusterBuilder {
        self.commit = mds::store::CommitMode::Inline;
        self
    }

    /// As [`ClusterBuilder::inline_commit`], but the MDS commits only when a caller waits for
    /// durability or [`mds::store::Store::commit_queued`] is called: changes are answered
    /// before they are durable, and an MDS crash loses them unless their clients replay them.
    pub fn deferred_commit(mut self) -> ClusterBuilder {
        self.commit = mds::store::CommitMode::Deferred;
        self
    }

    /// Names the MDS's runs `first`, `first + 1`, ... instead of at random (a simulation that
    /// must replay exactly).
    pub fn mds_instances(mut self, first: u64) -> ClusterBuilder {
        self.instance = Some(first);
        self
    }

    /// Has the MDS stamp changes with `clock` instead of the wall clock (a simulation's
    /// virtual time).
    pub fn mds_clock(mut self, clock: mds::store::Clock) -> ClusterBuilder {
        self.clock = Some(clock);
        self
    }

    /// How often the MDS's allocator refills pools and destroys removed objects.
    pub fn maintain_every(mut self, every: Duration) -> ClusterBuilder {
        self.maintain_every = every;
        self
    }

    fn attach(&self, name: &str) -> Attach {
        match &self.network {
            Network::Loopback => Attach::tcp(
                std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                self.server_security(),
            ),
            Network::Fabric(f) => Attach::sim(f, name),
        }
    }

    /// Formats the MDS's disk as `lode-mds format` does, unless it holds a filesystem
    /// already (a cluster started again on its scratch directory). A simulation's filesystem
    /// is named after its instance, so that a seed replays exactly.
    fn format_mds(&self, dir: &std::path::Path) -> Result<u128, ClusterError> {
        let disk: Arc<dyn mds::disk::MetaDisk> = match &self.mds_disk {
            Some(d) => d.clone(),
            None => Arc::new(mds::disk::DirDisk::new(dir)),
        };
        let name = dir.display().to_string();
        match mds::format::check(&*disk, &name, 0) {
            Err(mds::format::FormatError::NotFormatted { .. }) => {
                let uuid = self
                    .instance
                    .map_or_else(rand::random, |i| (0x0010_def5_u128 << 64) | u128::from(i));
                let now = self.clock.clone().unwrap_or_else(mds::store::wall_clock)();
                Ok(mds::format::format(&*disk, &name, "lode", uuid, now)?.uuid)
            }
            Err(e) => Err(e.into()),
            Ok(id) => Ok(id.uuid),
        }
    }

    /// Formats MDT `k`'s directory as `lode-mds format --mdt-index k --fs-uuid` does, unless it
    /// holds one already.
    fn format_mdt(&self, dir: &std::path::Path, k: u32, uuid: u128) -> Result<(), ClusterError> {
        let disk = self.disk_of_mdt(k, dir);
        let name = dir.display().to_string();
        match mds::format::check(&*disk, &name, 0) {
            Err(mds::format::FormatError::NotFormatted { .. }) => {
                let now = self.clock.clone().unwrap_or_else(mds::store::wall_clock)();
                mds::format::format_mdt(&*disk, &name, "lode", uuid, k, now)?;
                Ok(())
            }
            Err(e) => Err(e.into()),
            Ok(_) => Ok(()),
        }
    }

    /// Starts the MDS, formats every target (without an index) and starts the storage
    /// servers, which register and heartbeat. Returns once every server is serving; the
    /// allocator takes the targets into service shortly after ([`Cluster::wait_ready`]).
    pub async fn start(self) -> Result<Cluster, ClusterError> {
        let mds_dir = self.scratch.join("mds");
        std::fs::create_dir_all(&mds_dir).map_err(|source| ClusterError::Scratch {
            path: mds_dir.clone(),
            source,
        })?;
        let cfg = MdsConfig {
            maintain_every: self.maintain_every,
            heartbeat_timeout: self.heartbeat_timeout,
            disk: self.mds_disk.clone(),
            recovery_window: self.recovery_window,
            evict_after: self.evict_after,
            commit: self.commit,
            instance: self.instance,
            clock: self.clock.clone(),
            nodemap: self.nodemap.clone(),
            capability_lifetime: self.capability_lifetime,
            audit: self.audit.clone(),
            ..MdsConfig::new(&mds_dir)
        };
        let uuid = self.format_mds(&mds_dir)?;
        let mds = MdsServer::start(cfg.clone(), &self.attach("mds")).await?;
        let mut mdts = vec![];
        for k in 1..self.mdts {
            let dir = self.scratch.join(format!("mdt{k}"));
            std::fs::create_dir_all(&dir).map_err(|source| ClusterError::Scratch {
                path: dir.clone(),
                source,
            })?;
            self.format_mdt(&dir, k, uuid)?;
            // Its own disk (MDT0's crash-simulating one is MDT0's alone).
            let cfg = MdsConfig {
                disk: self.mdt_disks.get(k as usize - 1).cloned(),
                data_dir: dir,
                mdt0: Some(mds.nid()),
                mdt_heartbeat: self.heartbeat_every,
                ..cfg.clone()
            };
            let server = MdsServer::start(cfg.clone(), &self.attach(&format!("mdt{k}"))).await?;
            let attach = match server.nid() {
                Nid::Tcp(addr) => Attach::tcp(addr, self.server_security()),
                _ => self.attach(&format!("mdt{k}")),
            };
            mdts.push(OtherMdt {
                server: Some(server),
                cfg,
                attach,
            });
        }
        let mut oss = vec![];
        let mut all_homes = vec![];
        let oss_cfg = OssConfig {
            heartbeat_every: self.heartbeat_every,
            mds_timeout: Duration::from_secs(30),
            ..OssConfig::new(mds.nid())
        };
        for (i, engines) in self.servers.iter().enumerate() {
            let mut homes = vec![];
            for (k, engine) in engines.iter().enumerate() {
                let root = self.scratch.join(format!("oss{i}/ost-{k}"));
                let uuid = (0x10de_u128 << 112) | ((i as u128) << 32) | k as u128;
                Target::format(engine, &root, uuid, None).await?;
                homes.push(TargetHome {
                    engine: engine.clone(),
                    root,
                });
            }
            let server = OssServer::start(
                oss_cfg.clone(),
                homes.clone(),
                &self.attach(&format!("oss{i}")),
            )
            .await
            .map_err(|source| ClusterError::Oss {
                index: i,
                source: Box::new(source),
            })?;
            oss.push(Some(server));
            all_homes.push(homes);
        }
        // The MDS comes back where clients and servers know it: its node, or its port.
        let mds_attach = match mds.nid() {
            Nid::Tcp(addr) => Attach::tcp(addr, self.server_security()),
            _ => self.attach("mds"),
        };
        let mut cluster = Cluster {
            mds: Some(mds),
            mdts,
            healer: None,
            healers: 0,
            oss,
            homes: all_homes,
            oss_cfg,
            mds_cfg: cfg,
            mds_attach,
            builder: self,
        };
        cluster.start_healer()?;
        Ok(cluster)
    }
}

/// An MDS of a metadata target other than 0.
struct OtherMdt {
    server: Option<MdsServer>,
    cfg: MdsConfig,
    /// Where it comes back at a restart.
    attach: Attach,
}

/// A running cluster.
pub struct Cluster {
    builder: ClusterBuilder,
    mds: Option<MdsServer>,
    /// MDT 1, 2, ...'s servers.
    mdts: Vec<OtherMdt>,
    /// The MDS's mirror healer, when asked for: it stops and starts with the MDS.
    healer: Option<client::mirrors::HealerTask>,
    /// Healers started so far (each on a node of its own on the fabric).
    healers: u32,
    mds_cfg: MdsConfig,
    mds_attach: Attach,
    oss: Vec<Option<OssServer>>,
    homes: Vec<Vec<TargetHome>>,
    oss_cfg: OssConfig,
}

impl Cluster {
    /// The MDS. Panics between [`Cluster::stop_mds`] and [`Cluster::start_mds`].
    pub fn mds(&self) -> &MdsServer {
        self.mds.as_ref().expect("the MDS is running")
    }

    /// The MDS, if it runs.
    pub fn mds_running(&self) -> Option<&MdsServer> {
        self.mds.as_ref()
    }

    /// Storage server `i`, if it runs.
    pub fn oss(&self, i: usize) -> Option<&OssServer> {
        self.oss.get(i).and_then(Option::as_ref)
    }

    /// How many storage servers the cluster has (running or not).
    pub fn storage_servers(&self) -> usize {
        self.oss.len()
    }

    /// Stops storage server `i` as kill -9 would: no last sync; what its disks hold stays.
    pub fn kill_oss(&mut self, i: usize) {
        if let Some(s) = self.oss.get_mut(i).and_then(Option::take) {
            s.kill();
        }
    }

    /// Starts storage server `i` again on its targets.
    pub async fn start_oss(&mut self, i: usize) -> Result<(), ClusterError> {
        let attach = self.builder.attach(&format!("oss{i}"));
        let server = OssServer::start(self.oss_cfg.clone(), self.homes[i].clone(), &attach)
            .await
            .map_err(|source| ClusterError::Oss {
                index: i,
                source: Box::new(source),
            })?;
        self.oss[i] = Some(server);
        Ok(())
    }

    /// Starts the mirror healer of the running MDS, if the builder asked for one: a client
    /// holding the servers' key, as `lode-mds` runs it.
    fn start_healer(&mut self) -> Result<(), ClusterError> {
        let (Some((cfg, client)), Some(mds)) = (self.builder.heal.clone(), self.mds.as_ref())
        else {
            return Ok(());
        };
        self.healers += 1;
        let net: AnyNet = match &self.builder.network {
            Network::Loopback => TcpEndpoint::client(TcpConfig {
                security: self.builder.server_security(),
                ..TcpConfig::default()
            })
            .into(),
            Network::Fabric(f) => f
                .start_node(&format!("healer{}", self.healers), None)?
                .into(),
        };
        self.healer = Some(client::mirrors::Healer::spawn(
            net,
            mds.nid().to_string(),
            ClientConfig {
                id: client.id.map(|id| id + u128::from(self.healers)),
                ..client
            },
            cfg,
        ));
        Ok(())
    }

    /// The MDS of MDT `k` (0 is [`Cluster::mds`]), if it runs.
    pub fn mdt(&self, k: u32) -> Option<&MdsServer> {
        match k {
            0 => self.mds.as_ref(),
            k => self
                .mdts
                .get(k as usize - 1)
                .and_then(|m| m.server.as_ref()),
        }
    }

    /// Where MDT `k` (not 0) keeps its data.
    pub fn mdt_dir(&self, k: u32) -> Option<PathBuf> {
        let m = self.mdts.get((k as usize).checked_sub(1)?)?;
        Some(m.cfg.data_dir.clone())
    }

    /// Stops MDT `k`'s MDS (not 0's: [`Cluster::kill_mds`]) as kill -9 would.
    pub async fn kill_mdt(&mut self, k: u32) {
        let Some(m) = (k as usize)
            .checked_sub(1)
            .and_then(|i| self.mdts.get_mut(i))
        else {
            return;
        };
        if let Some(s) = m.server.take() {
            s.kill().await;
        }
    }

    /// Starts MDT `k`'s MDS again on its data directory, formatting it first if it holds
    /// nothing (an operator who formats a lost MDT's directory anew).
    pub async fn start_mdt(&mut self, k: u32) -> Result<(), ClusterError> {
        let uuid = self.builder.format_mds(&self.builder.scratch.join("mds"))?;
        let i = (k as usize).checked_sub(1).filter(|i| *i < self.mdts.len());
        let Some(i) = i else {
            return Ok(());
        };
        self.builder
            .format_mdt(&self.mdts[i].cfg.data_dir, k, uuid)?;
        let m = &mut self.mdts[i];
        // A new run, named anew (its requests to other MDSs are numbered by its run).
        if let Some(n) = m.cfg.instance.as_mut() {
            *n += 1 << 32;
        }
        m.server = Some(MdsServer::start(m.cfg.clone(), &m.attach).await?);
        Ok(())
    }

    /// Stops the MDS as kill -9 would (its journal holds what was committed).
    pub async fn kill_mds(&mut self) {
        self.healer = None;
        if let Some(m) = self.mds.take() {
            m.kill().await;
        }
    }

    /// Starts the MDS again on its data (recovering the journal).
    pub async fn start_mds(&mut self) -> Result<(), ClusterError> {
        if let Some(i) = self.mds_cfg.instance.as_mut() {
            *i += 1;
        }
        self.mds = Some(MdsServer::start(self.mds_cfg.clone(), &self.mds_attach).await?);
        self.start_healer()
    }

    /// A client connected to the MDS; on the fabric, a node named `name`.
    pub async fn client(&self, name: &str, cfg: ClientConfig) -> Result<Client, ClusterError> {
        let net: AnyNet = match &self.builder.network {
            Network::Loopback => TcpEndpoint::client(TcpConfig {
                security: self.client_security(),
                ..TcpConfig::default()
            })
            .into(),
            Network::Fabric(f) => f.start_node(name, None)?.into(),
        };
        Ok(Client::connect_on(net, &self.mds().nid().to_string(), cfg).await?)
    }

    /// The cluster's client key (what a client node holds), when authentication is on.
    pub fn client_key(&self) -> Option<KeyFile> {
        self.builder.key.as_ref().map(KeyFile::client_key)
    }

    /// What a client of this cluster authenticates with: the client key (derived from the
    /// cluster's), or nothing when the cluster runs without authentication.
    pub fn client_security(&self) -> Security {
        match &self.builder.key {
            Some(k) => Security::client(
                Arc::new(Keyring::new(&k.client_key())),
                self.builder.privacy,
            ),
            None => Security::Off,
        }
    }

    /// The servers' settings (a test acting as a server, or as the MDS).
    pub fn server_security(&self) -> Security {
        self.builder.server_security()
    }

    /// Waits until a new file can be striped over `targets` targets (registered, heard from,
    /// and taken into service by the allocator), for at most `within`.
    pub async fn wait_ready(
        &self,
        client: &Client,
        targets: u32,
        within: Duration,
    ) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if client.can_stripe_over(targets).await.unwrap_or(false) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                let up = client.statfs().await.map_or(0, |s| s.targets_up);
                return Err(ClusterError::NotReady {
                    up,
                    want: targets,
                    within,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every server.
    pub async fn stop(mut self) {
        self.healer = None;
        for s in self.oss.into_iter().flatten() {
            if let Err(e) = s.stop().await {
                tracing::warn!(error = %e, "stopping a storage server");
            }
        }
        for m in self.mdts {
            if let Some(s) = m.server {
                s.stop().await;
            }
        }
        if let Some(m) = self.mds {
            m.stop().await;
        }
    }
}
