//! The seeded whole-cluster simulator: the real MDS, storage servers and clients, started by
//! the calls the binaries make, on the simulated fabric, with the MDS's journal on a
//! crash-simulating disk and every target on a crash-simulating engine. Odd-numbered
//! checkpoints are mirrored, one copy on each storage server.
//!
//! One seed chooses everything: the workload (checkpoints written to a temporary name,
//! fsynced and renamed into place; files written at random offsets and fsynced; truncates;
//! unlinks; from two clients), the faults between operations (a storage server killed and
//! restarted; one that loses power, losing everything not synced; the MDS killed; the MDS
//! losing power with its last journal write torn; a storage server's disk full for a while;
//! the MDS's disk full, then room made and the MDS restarted; a client cut off from a server
//! for a while; a client dying together with the MDS, and a new client in its place; the
//! MDS's replies to a client lost for a while, so that whole batches of changes are resent
//! after they were carried out; a storage server's disk failing a sync, as Linux does (the
//! next sync says Ok without the dropped writes); a client cut off from the MDS across its
//! restart and recovery, and so evicted) and the network's own faults (loss, duplication,
//! reordering on every link). Bursts of up to 600 creates answered ahead, of names never used
//! before, then their removal, put more changes in flight per client than a reply cache that
//! keeps a fixed number per client would hold.
//!
//! The MDS commits behind, as the real one does: it answers changes before they are durable
//! and commits them when the seed says so or a caller waits for durability
//! ([`mds::store::CommitMode::Deferred`]), so an MDS crash loses what its clients must replay.
//! The clients run as the library does by default: commit-behind with replay, leases, and
//! creates and unlinks answered ahead in directories they hold alone.
//!
//! The checkers live here, apart from the code they check, and know only what the client was
//! told: every checkpoint whose rename was acknowledged holds exactly the acknowledged bytes
//! (or, where the rename's answer was lost, the old or the new version whole); a checkpoint a
//! reader holds open reads the same until it closes it, whatever is renamed over it and
//! however the MDS restarts; every range an fsync acknowledged reads back exactly, never as
//! zeros; the copies of a mirrored checkpoint whose layout calls both in sync hold the same
//! bytes; a burst's create of a name never used before never finds it there, nor its removal
//! finds it gone, and the burst's directory ends empty (a resent change carried out twice
//! shows as one of these); a client evicted with acknowledged changes is told by its next
//! sync (else they are held to the rules above, and found missing); after the faults stop, the cluster makes progress (a new checkpoint commits); the
//! namespace passes `fsck` and every target passes `scrub`. A change is held to this until its
//! client knows it committed; a client dying with the MDS may take back its changes not yet
//! committed and, with them, changes other clients made after them (recovery.md: lode has no
//! commit-on-sharing yet), and nothing else.
//!
//! Run it on one thread under tokio's paused clock (`start_paused`), as the tests and the
//! `simulate` example do: the MDS then journals on the caller's thread
//! ([`mds::store::CommitMode::Deferred`]), clients and MDS runs are named from the seed, and a
//! seed replays exactly: the same messages at the same virtual times with the same fates
//! ([`Report::fingerprint`]). Waits cost no real time, so a seed takes a fraction of a second.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use client::{Client, ClientConfig, OpenOptions};
use lnet::sim::{Fabric, LinkParams};
use mds::disk::MemDisk;
use oss::engine::mem::MemEngine;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Cluster, ClusterBuilder, Network};

/// Storage servers in a simulated cluster (one target each).
const SERVERS: usize = 2;
/// Checkpoint names and plain files the workload picks from.
const NAMES: u32 = 4;
/// Largest checkpoint, and the span of plain files' writes.
const MAX_BYTES: usize = 256 << 10;

/// What one seed did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub seed: u64,
    pub operations: usize,
    pub faults: usize,
    /// Operations that ended in an error (each allowed by the model, or the run fails).
    pub refused: usize,
    /// Messages the fabric carried, dropped, duplicated or reordered.
    pub messages: usize,
    /// A digest of everything the fabric decided (each message's ends, kind, xid, size, virtual
    /// time and fate): equal for two runs of one seed when the replay is exact.
    pub fingerprint: u64,
}

/// A run that broke a rule: its seed replays it.
#[derive(Debug, thiserror::Error)]
#[error("seed {seed}: {what}")]
pub struct Failure {
    pub seed: u64,
    pub what: String,
}

/// What a checkpoint name may hold: any one of these versions, whole (`None`: absent).
type Versions = Vec<Option<Vec<u8>>>;

#[derive(Default)]
struct Model {
    checkpoints: BTreeMap<String, Versions>,
    /// Plain files: per byte, what an acknowledged fsync put there (`None`: not promised).
    files: BTreeMap<String, Vec<Option<u8>>>,
    /// Acknowledged changes not yet known committed, in the order they were made: a crash of
    /// their client together with the MDS may take them back, and with them the changes of
    /// other clients made after them (which may have depended on them; see recovery.md).
    uncertain: Vec<Uncertain>,
}

/// An acknowledged change that a crash of its client and the MDS together may take back.
struct Uncertain {
    /// The client's slot.
    client: usize,
    undo: Undo,
}

/// What may be there again if a change is taken back.
enum Undo {
    /// A checkpoint name renamed over or unlinked: it may hold what it held before.
    Checkpoint { name: String, before: Versions },
    /// A plain file cut or extended between the two sizes: those bytes are not promised.
    Truncate { name: String, from: u64, to: u64 },
}

impl Model {
    /// A crash of `client` together with the MDS: its changes not known committed may be
    /// lost, and so may every change made after the first of them.
    fn client_lost(&mut self, client: usize) {
        let Some(first) = self.uncertain.iter().position(|u| u.client == client) else {
            return;
        };
        for u in self.uncertain.split_off(first) {
            match u.undo {
                Undo::Checkpoint { name, before } => {
                    let now = self.checkpoints.entry(name).or_insert(vec![None]);
                    for v in before {
                        if !now.contains(&v) {
                            now.push(v);
                        }
                    }
                }
                Undo::Truncate { name, from, to } => {
                    let Some(bytes) = self.files.get_mut(&name) else {
                        continue;
                    };
                    let (from, to) = (from as usize, to as usize);
                    if bytes.len() < to {
                        bytes.resize(to, None);
                    }
                    bytes[from..to].fill(None);
                }
            }
        }
    }
}

struct Sim {
    seed: u64,
    rng: ChaCha8Rng,
    fabric: Fabric,
    cluster: Cluster,
    engines: Vec<Arc<MemEngine>>,
    disk: Arc<MemDisk>,
    clients: Vec<Client>,
    /// The virtual clock of the MDS and the clients.
    clock: mds::store::Clock,
    model: Model,
    report: Report,
    /// The latest error an operation met, for a liveness failure's message.
    last_error: String,
    /// Checkpoints a reader holds open (with its client's slot), with the bytes it read when
    /// it opened them: they must read the same until closed, whatever is renamed over them
    /// and however the MDS restarts.
    held: Vec<(client::File, usize, String, Vec<u8>)>,
    /// Clients started so far (each crash starts one in the crashed one's slot).
    started: u64,
    /// The fabric names of the clients in their slots.
    names: Vec<String>,
    /// Names of bursts' files given out so far: none is ever given twice.
    unique: u64,
}

fn client_config(clock: &mds::store::Clock) -> ClientConfig {
    ClientConfig {
        attempt: Duration::from_millis(300),
        retry_for: Duration::from_secs(8),
        ping_every: Duration::from_millis(200),
        creds: proto::md::Creds::root(),
        clock: Some(client::Clock(clock.clone())),
        ..ClientConfig::default()
    }
}

/// The simulation's virtual time as a wall clock: 2026-01-01 plus the time since it started.
fn virtual_clock() -> mds::store::Clock {
    let start = tokio::time::Instant::now();
    Arc::new(move || {
        let d = start.elapsed();
        proto::md::Time {
            sec: 1_767_225_600 + d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    })
}

/// Runs one seed: `operations` random operations with faults among them, then the checks.
pub async fn run(seed: u64, operations: usize) -> Result<Report, Failure> {
    let fail = |what: String| Failure { seed, what };
    let scratch = std::env::temp_dir().join(format!("lode-sim-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let fabric = Fabric::new(seed);
    fabric
        .set_default_link(LinkParams {
            latency: Duration::from_micros(50),
            loss: 0.002,
            duplicate: 0.01,
            reorder: 0.02,
            reorder_window: Duration::from_millis(2),
            ..LinkParams::default()
        })
        .map_err(|e| fail(e.to_string()))?;
    let disk = Arc::new(MemDisk::new());
    // One virtual clock for the MDS and the clients, which stamp the files they create ahead.
    let clock = virtual_clock();
    let engines: Vec<Arc<MemEngine>> = (0..SERVERS)
        .map(|_| Arc::new(MemEngine::new(1 << 30)))
        .collect();
    let mut builder = ClusterBuilder::new(Network::Fabric(fabric.clone()), &scratch)
        .mds_disk(disk.clone())
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50))
        .open_recovery(Duration::from_secs(1), Duration::from_secs(20))
        .deferred_commit()
        .mds_instances(seed << 16 | 1)
        .mds_clock(clock.clone())
        // The MDS's mirror healer runs as in production, quicker: stale copies of mirrored
        // checkpoints are resynced behind the workload, and moved off a server gone a while.
        .heal(
            client::mirrors::HealConfig {
                rate: 0,
                move_after: Duration::from_secs(3),
                every: Duration::from_millis(500),
            },
            ClientConfig {
                id: Some(u128::from(seed) << 64 | 0x4ea1 << 16),
                ..client_config(&clock)
            },
        );
    for e in &engines {
        builder = builder.storage_server(vec![e.clone() as Arc<dyn oss::engine::Engine>]);
    }
    let cluster = builder.start().await.map_err(|e| fail(e.to_string()))?;
    let mut clients = vec![];
    for (i, name) in ["c0", "c1"].into_iter().enumerate() {
        let cfg = ClientConfig {
            id: Some(u128::from(seed) << 64 | (i as u128 + 1)),
            ..client_config(&clock)
        };
        clients.push(
            cluster
                .client(name, cfg)
                .await
                .map_err(|e| fail(e.to_string()))?,
        );
    }
    cluster
        .wait_ready(&clients[0], SERVERS as u32, Duration::from_secs(20))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut sim = Sim {
        seed,
        rng: ChaCha8Rng::seed_from_u64(seed),
        fabric,
        cluster,
        engines,
        disk,
        clients,
        clock,
        model: Model::default(),
        report: Report {
            seed,
            ..Report::default()
        },
        last_error: String::new(),
        held: vec![],
        started: 2,
        names: vec!["c0".into(), "c1".into()],
        unique: 0,
    };
    let result = sim.drive(operations).await;
    let Sim {
        cluster,
        mut report,
        fabric,
        ..
    } = sim;
    let trace = fabric.trace();
    report.messages = trace.len();
    if let Ok(path) = std::env::var("LODE_SIM_TRACE") {
        let lines: Vec<String> = trace.iter().map(|e| format!("{e:?}")).collect();
        let _ = std::fs::write(path, lines.join("\n"));
    }
    report.fingerprint = {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same digest in every process.
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new();
        for e in &trace {
            (
                e.at,
                &e.from,
                &e.to,
                e.kind,
                e.xid,
                e.bytes,
                format!("{:?}", e.fate),
            )
                .hash(&mut h);
        }
        h.finish()
    };
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&scratch);
    result.map(|()| report)
}

impl Sim {
    /// With `LODE_SIM_VERBOSE` set, says what the run does, step by step.
    fn note(&self, what: impl FnOnce() -> String) {
        if std::env::var_os("LODE_SIM_VERBOSE").is_some() {
            eprintln!(
                "seed {} op {}: {}",
                self.seed,
                self.report.operations,
                what()
            );
        }
    }

    fn fail(&self, what: impl Into<String>) -> Failure {
        Failure {
            seed: self.seed,
            what: what.into(),
        }
    }

    async fn drive(&mut self, operations: usize) -> Result<(), Failure> {
        for _ in 0..operations {
            // The MDS commits behind, when it gets to it.
            if self.rng.gen_bool(0.3) {
                if let Some(mds) = self.cluster.mds_running() {
                    mds.commit_queued();
                }
            }
            self.forget_committed();
            if self.rng.gen_bool(0.15) {
                self.fault().await?;
            }
            self.operation().await?;
            self.report.operations += 1;
        }
        // The faults stop: the network heals and every server runs.
        self.fabric.heal();
        self.fabric
            .set_default_link(LinkParams {
                latency: Duration::from_micros(50),
                ..LinkParams::default()
            })
            .map_err(|e| self.fail(e.to_string()))?;
        for i in 0..SERVERS {
            if self.cluster.oss(i).is_none() {
                self.cluster
                    .start_oss(i)
                    .await
                    .map_err(|e| self.fail(e.to_string()))?;
            }
        }
        self.check_progress().await?;
        self.check_contents().await?;
        self.check_consistency().await
    }

    async fn fault(&mut self) -> Result<(), Failure> {
        self.report.faults += 1;
        let server = self.rng.gen_range(0..SERVERS);
        let kind = self.rng.gen_range(0..11);
        self.note(|| {
            let what = [
                "kill",
                "power loss",
                "MDS kill",
                "MDS power loss",
                "disk full",
                "MDS disk full",
                "partition",
                "client and MDS crash",
                "lost replies",
                "failing sync",
                "eviction",
            ];
            format!("fault: {} (storage server {server})", what[kind])
        });
        match kind {
            0 => {
                self.cluster.kill_oss(server);
                self.restart_oss(server).await
            }
            1 => {
                self.cluster.kill_oss(server);
                self.engines[server].crash();
                self.restart_oss(server).await
            }
            2 => {
                self.cluster.kill_mds().await;
                self.restart_mds().await
            }
            3 => {
                self.cluster.kill_mds().await;
                self.disk.crash(Some(self.rng.gen()));
                self.restart_mds().await
            }
            4 => {
                // A storage server's disk fills up, and has room again a while later.
                let engine = self.engines[server].clone();
                let space = oss::engine::Engine::space(&*engine, std::path::Path::new("/"))
                    .map_err(|e| self.fail(format!("the engine's space: {e}")))?;
                engine.set_capacity(space.total - space.free);
                let after = Duration::from_millis(self.rng.gen_range(50..1500));
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    engine.set_capacity(1 << 30);
                });
                Ok(())
            }
            5 => {
                // The MDS's disk fills up: a journal write that needs room fails and the MDS
                // refuses changes from then on; the operator makes room and restarts it.
                self.disk.set_capacity(Some(self.disk.used()));
                let c = self.clients[self.rng.gen_range(0..2)].clone();
                let _ = c
                    .mkdir(&format!("/full{}", self.report.faults), 0o755)
                    .await;
                self.disk.set_capacity(None);
                self.cluster.kill_mds().await;
                self.restart_mds().await
            }
            7 => {
                // A client dies with changes the MDS has not committed, and the MDS dies
                // before committing them: those may be lost (and what depended on them), and
                // nothing else.
                let slot = self.rng.gen_range(0..2);
                self.held.retain(|(_, c, ..)| *c != slot);
                let id = u128::from(self.seed) << 64 | u128::from(self.started + 1);
                let name = format!("c{slot}-{}", self.started);
                self.started += 1;
                self.names[slot] = name.clone();
                // Its slot holds the other client until the MDS is back.
                let other = self.clients[1 - slot].clone();
                drop(std::mem::replace(&mut self.clients[slot], other));
                self.cluster.kill_mds().await;
                if self.rng.gen_bool(0.5) {
                    self.disk.crash(Some(self.rng.gen()));
                }
                self.model.client_lost(slot);
                self.restart_mds().await?;
                let cfg = ClientConfig {
                    id: Some(id),
                    ..client_config(&self.clock)
                };
                self.clients[slot] = self.connect(&name, cfg).await?;
                Ok(())
            }
            8 => {
                // The MDS's replies to a client are lost for a while: whatever it sends then
                // is carried out and sent again, batches of changes answered ahead included.
                let slot = self.rng.gen_range(0..2);
                let client = self.client_name(slot);
                self.fabric.cut_oneway("mds", &client);
                self.heal_later();
                Ok(())
            }
            9 => {
                // The next sync on a storage server's disk fails, and the writes it covered
                // are dropped from the write-back while the retry would say Ok.
                self.engines[server].fail_next(oss::engine::mem::Op::Sync, libc::EIO);
                Ok(())
            }
            10 => self.evict().await,
            _ => {
                let client = format!("c{}", self.rng.gen_range(0..2));
                self.fabric.partition(&client, &format!("oss{server}"));
                self.heal_later();
                Ok(())
            }
        }
    }

    /// Heals the fabric's cuts a while from now, as the seed says.
    fn heal_later(&mut self) {
        let fabric = self.fabric.clone();
        let heal_after = Duration::from_millis(self.rng.gen_range(50..1500));
        tokio::spawn(async move {
            tokio::time::sleep(heal_after).await;
            fabric.heal();
        });
    }

    /// The fabric name of the client in `slot` now.
    fn client_name(&self, slot: usize) -> String {
        self.names[slot].clone()
    }

    /// A client cut off from the MDS while it restarts and recovers without it: evicted, its
    /// acknowledged changes not committed are lost. It must say so at its next sync; if it
    /// says nothing, they are held to every rule still.
    async fn evict(&mut self) -> Result<(), Failure> {
        let slot = self.rng.gen_range(0..2);
        let name = self.client_name(slot);
        self.fabric.partition(&name, "mds");
        self.cluster.kill_mds().await;
        self.restart_mds().await?;
        // Past the recovery window (the lease term at least).
        tokio::time::sleep(mds::lease::TERM + Duration::from_secs(2)).await;
        self.fabric.heal();
        // Its held files may be gone with its handles.
        self.held.retain(|(_, c, ..)| *c != slot);
        let c = self.clients[slot].clone();
        let held = c.uncommitted();
        match c.sync().await {
            Ok(()) => self.note(|| {
                format!("client {slot} was cut off ({held} uncommitted), and not evicted")
            }),
            Err(e) => {
                self.note(|| format!("client {slot} evicted: {e}"));
                self.report.refused += 1;
                self.model.client_lost(slot);
            }
        }
        Ok(())
    }

    /// Creates `count` files of names never used, answered ahead where the client may, then
    /// removes them; a change carried out twice shows as a name found there, or found gone.
    async fn burst(&mut self, slot: usize, count: usize) -> Result<(), Failure> {
        let c = self.clients[slot].clone();
        let dir = format!("/u{slot}");
        match c.mkdir(&dir, 0o755).await {
            Ok(_) => {}
            Err(e) if e.is(proto::FsErrorKind::Exists) => {}
            Err(_) => {
                self.report.refused += 1;
                return Ok(());
            }
        }
        let first = self.unique;
        self.unique += count as u64;
        let mut made = vec![];
        let mut failed = false;
        for n in first..first + count as u64 {
            let path = format!("{dir}/n{n}");
            let opened = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&c, &path)
                .await;
            match opened {
                Ok(f) => {
                    let _ = f.close().await;
                    made.push(path);
                }
                Err(e) if e.is(proto::FsErrorKind::Exists) => {
                    return Err(self.fail(format!(
                        "{path}, a name never used, exists: a create was carried out twice ({e})"
                    )))
                }
                Err(_) => failed = true,
            }
        }
        match c.settle_ahead().await {
            Ok(()) => {}
            Err(e) if e.is(proto::FsErrorKind::Exists) => {
                return Err(self.fail(format!(
                    "a create answered ahead, of a name never used, failed with EEXIST: carried out twice ({e})"
                )))
            }
            Err(_) => failed = true,
        }
        for path in &made {
            match c.unlink(path).await {
                Ok(()) => {}
                Err(e) if e.is(proto::FsErrorKind::NotFound) && !failed => {
                    return Err(self.fail(format!(
                        "{path}, created and acknowledged, was gone before its removal: a change was carried out twice ({e})"
                    )))
                }
                Err(_) => failed = true,
            }
        }
        match c.settle_ahead().await {
            Ok(()) => {}
            Err(e) if e.is(proto::FsErrorKind::NotFound) && !failed => {
                return Err(self.fail(format!(
                    "a removal answered ahead found its file gone: carried out twice ({e})"
                )))
            }
            Err(_) => failed = true,
        }
        if failed {
            self.report.refused += 1;
        }
        Ok(())
    }

    /// Forgets the uncertainty of changes whose client knows them committed.
    fn forget_committed(&mut self) {
        let done: Vec<bool> = self.clients.iter().map(Client::all_committed).collect();
        self.model.uncertain.retain(|u| !done[u.client]);
    }

    /// A new client: while the MDS waits for the clients of its last run, connecting is
    /// refused for a while.
    async fn connect(&mut self, name: &str, cfg: ClientConfig) -> Result<Client, Failure> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match self.cluster.client(name, cfg.clone()).await {
                Ok(c) => return Ok(c),
                Err(e) if tokio::time::Instant::now() > deadline => {
                    return Err(self.fail(format!("client {name} cannot connect: {e}")))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    async fn restart_oss(&mut self, i: usize) -> Result<(), Failure> {
        let r = self.cluster.start_oss(i).await;
        r.map_err(|e| self.fail(format!("restarting storage server {i}: {e}")))
    }

    async fn restart_mds(&mut self) -> Result<(), Failure> {
        let r = self.cluster.start_mds().await;
        r.map_err(|e| self.fail(format!("restarting the MDS: {e}")))
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.rng.gen_range(0..=max);
        let mut v = vec![0u8; len];
        self.rng.fill(&mut v[..]);
        v
    }

    async fn operation(&mut self) -> Result<(), Failure> {
        let slot = self.rng.gen_range(0..2);
        let c = self.clients[slot].clone();
        let k = self.rng.gen_range(0..NAMES);
        if self.rng.gen_bool(0.1) {
            self.hold(slot, k).await;
        }
        if self.rng.gen_bool(0.1) {
            self.check_held().await?;
        }
        if self.rng.gen_bool(0.05) {
            let count = self.rng.gen_range(1..=600);
            return self.burst(slot, count).await;
        }
        match self.rng.gen_range(0..10) {
            0..=3 => {
                let data = self.bytes(MAX_BYTES);
                let chunk = self.rng.gen_range(1..=64) << 10;
                self.checkpoint(slot, k, data, chunk).await
            }
            4..=6 => {
                let data = self.bytes(64 << 10);
                let offset = self.rng.gen_range(0..MAX_BYTES as u64);
                self.write_file(&c, k, offset, data).await
            }
            7 => {
                let size = self.rng.gen_range(0..MAX_BYTES as u64);
                self.truncate_file(slot, k, size).await
            }
            8 => {
                let name = format!("/ck{k}");
                let done = c.unlink(&name).await;
                let versions = self
                    .model
                    .checkpoints
                    .entry(name.clone())
                    .or_insert(vec![None]);
                match done {
                    Ok(()) => {
                        let before = std::mem::replace(versions, vec![None]);
                        self.model.uncertain.push(Uncertain {
                            client: slot,
                            undo: Undo::Checkpoint { name, before },
                        });
                    }
                    Err(_) => {
                        self.report.refused += 1;
                        versions.push(None);
                    }
                }
                Ok(())
            }
            _ => {
                let name = format!("/f{k}");
                match c.unlink(&name).await {
                    Ok(()) => {
                        self.model.files.remove(&name);
                    }
                    Err(e) if e.is(proto::FsErrorKind::NotFound) => {}
                    Err(_) => {
                        // Removed or not: nothing about it is promised any more.
                        self.report.refused += 1;
                        self.model.files.insert(name, vec![]);
                    }
                }
                Ok(())
            }
        }
    }

    /// Writes a whole new version under a temporary name, fsyncs it and renames it into place.
    async fn checkpoint(
        &mut self,
        slot: usize,
        k: u32,
        data: Vec<u8>,
        chunk: usize,
    ) -> Result<(), Failure> {
        let c = &self.clients[slot].clone();
        let (tmp, name) = (format!("/ck{k}.tmp"), format!("/ck{k}"));
        let written = async {
            let mut o = OpenOptions::new().write(true).create(true).truncate(true);
            if k % 2 == 1 {
                // Odd checkpoints keep a copy on each storage server.
                o = o.layout(mirrored()?);
            }
            let f = o.open(c, &tmp).await?;
            for (i, piece) in data.chunks(chunk).enumerate() {
                f.write_at((i * chunk) as u64, piece).await?;
            }
            f.fsync().await?;
            f.close().await
        }
        .await;
        if let Err(e) = written {
            self.note(|| format!("checkpoint {tmp}: {} bytes not written: {e}", data.len()));
            self.last_error = e.to_string();
            self.report.refused += 1;
            return Ok(()); // a checkpointer gives up on a version it could not make durable
        }
        let renamed = c.rename(&tmp, &name).await;
        self.note(|| {
            format!(
                "checkpoint {name} (client {slot}): {} bytes written, rename {:?}",
                data.len(),
                renamed.as_ref().map_err(|e| e.to_string())
            )
        });
        let versions = self
            .model
            .checkpoints
            .entry(name.clone())
            .or_insert(vec![None]);
        match renamed {
            Ok(()) => {
                let before = std::mem::replace(versions, vec![Some(data)]);
                self.model.uncertain.push(Uncertain {
                    client: slot,
                    undo: Undo::Checkpoint { name, before },
                });
            }
            Err(e) => {
                self.last_error = e.to_string();
                self.report.refused += 1;
                versions.push(Some(data));
            }
        }
        Ok(())
    }

    /// A reader opens checkpoint `k` and keeps it open (at most two at once).
    async fn hold(&mut self, slot: usize, k: u32) {
        let c = &self.clients[slot].clone();
        if self.held.len() >= 2 {
            let (f, ..) = self.held.remove(0);
            let _ = f.close().await;
        }
        let name = format!("/ck{k}");
        let Ok(f) = OpenOptions::new().read(true).open(c, &name).await else {
            return;
        };
        match read_all(&f).await {
            Ok(bytes) => self.held.push((f, slot, name, bytes)),
            Err(e) => {
                self.last_error = e;
                self.report.refused += 1;
            }
        }
    }

    /// Every checkpoint held open reads as it did when it was opened.
    async fn check_held(&mut self) -> Result<(), Failure> {
        for (f, _, name, bytes) in &self.held {
            match read_all(f).await {
                Ok(now) if now == *bytes => {}
                Ok(now) => {
                    return Err(self.fail(format!(
                        "{name}, held open, read {} bytes and now {} ({})",
                        bytes.len(),
                        now.len(),
                        describe(&Some(now.clone()))
                    )))
                }
                Err(e) => return Err(self.fail(format!("{name}, held open: {e}"))),
            }
        }
        Ok(())
    }

    async fn write_file(
        &mut self,
        c: &Client,
        k: u32,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<(), Failure> {
        let name = format!("/f{k}");
        let done = async {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .open(c, &name)
                .await?;
            f.write_at(offset, &data).await?;
            f.fsync().await?;
            f.close().await
        }
        .await;
        let bytes = self.model.files.entry(name).or_default();
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, None);
        }
        let range = &mut bytes[offset as usize..end];
        match done {
            Ok(()) => {
                for (b, d) in range.iter_mut().zip(&data) {
                    *b = Some(*d);
                }
            }
            Err(_) => {
                self.report.refused += 1;
                range.fill(None);
            }
        }
        Ok(())
    }

    async fn truncate_file(&mut self, slot: usize, k: u32, size: u64) -> Result<(), Failure> {
        let c = &self.clients[slot].clone();
        let name = format!("/f{k}");
        if !self.model.files.contains_key(&name) {
            return Ok(());
        }
        let done = async {
            let f = OpenOptions::new().write(true).open(c, &name).await?;
            f.set_len(size).await?;
            f.close().await
        }
        .await;
        let bytes = self.model.files.entry(name.clone()).or_default();
        match done {
            Ok(()) => {
                let len = bytes.len() as u64;
                bytes.resize(size as usize, Some(0));
                self.model.uncertain.push(Uncertain {
                    client: slot,
                    undo: Undo::Truncate {
                        name,
                        from: len.min(size),
                        to: len.max(size),
                    },
                });
            }
            Err(_) => {
                self.report.refused += 1;
                // Cut or not: the bytes past `size` are no longer promised.
                let keep = bytes.len().min(size as usize);
                bytes[keep..].fill(None);
            }
        }
        Ok(())
    }

    /// Liveness: with the faults over, a new checkpoint commits.
    async fn check_progress(&mut self) -> Result<(), Failure> {
        let data = self.bytes(64 << 10);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let before = self.report.refused;
            self.checkpoint(0, NAMES, data.clone(), 16 << 10).await?;
            let committed = self
                .model
                .checkpoints
                .get(&format!("/ck{NAMES}"))
                .is_some_and(|v| v.len() == 1 && v[0].is_some());
            if self.report.refused == before && committed {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(self.fail(format!(
                    "no progress within 30 s after the faults stopped: {}",
                    self.last_error
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every acknowledged byte is there, exactly; checkpoint names hold one whole version.
    async fn check_contents(&mut self) -> Result<(), Failure> {
        self.check_held().await?;
        for (f, ..) in self.held.drain(..) {
            let _ = f.close().await;
        }
        let c = self.clients[1].clone();
        for (name, versions) in &self.model.checkpoints {
            let got = read_whole(&c, name).await.map_err(|e| self.fail(e))?;
            if !versions.contains(&got) {
                return Err(self.fail(format!(
                    "{name} holds {} ({} bytes) where the acknowledged version(s) are {}",
                    describe(&got),
                    got.as_ref().map_or(0, Vec::len),
                    versions
                        .iter()
                        .map(describe)
                        .collect::<Vec<_>>()
                        .join(" or ")
                )));
            }
        }
        // Copies a mirrored file's layout calls in sync hold the same bytes.
        for name in self.model.checkpoints.keys() {
            let Ok(f) = OpenOptions::new().read(true).open(&c, name).await else {
                continue;
            };
            let layout = c.getstripe(name).await.ok().flatten();
            if let Some(l) = layout.filter(|l| l.mirror_count() > 1 && l.stale_mirrors().is_empty())
            {
                let size = f
                    .size()
                    .await
                    .map_err(|e| self.fail(format!("{name}: {e}")))?;
                let a = f.read_copy(0, 0, size).await;
                let b = f.read_copy(1, 0, size).await;
                match (a, b) {
                    (Ok(a), Ok(b)) if a == b => {}
                    (Ok(_), Ok(_)) => {
                        return Err(self.fail(format!(
                            "{name}: its two copies differ while its layout (generation {}) calls both in sync",
                            l.generation
                        )))
                    }
                    (a, b) => {
                        return Err(self.fail(format!(
                            "{name}: a copy in sync cannot be read whole: {:?} / {:?}",
                            a.err().map(|e| e.to_string()),
                            b.err().map(|e| e.to_string())
                        )))
                    }
                }
            }
            let _ = f.close().await;
        }
        for (name, bytes) in &self.model.files {
            if bytes.iter().all(Option::is_none) {
                continue;
            }
            let got = read_whole(&c, name)
                .await
                .map_err(|e| self.fail(e))?
                .ok_or_else(|| self.fail(format!("{name} was acknowledged and is gone")))?;
            for (at, want) in bytes.iter().enumerate() {
                let Some(want) = want else { continue };
                if got.get(at) != Some(want) {
                    return Err(self.fail(format!(
                        "{name}: byte {at} reads {:?}, acknowledged {want} (file of {} bytes)",
                        got.get(at),
                        got.len()
                    )));
                }
            }
        }
        Ok(())
    }

    async fn check_consistency(&mut self) -> Result<(), Failure> {
        let problems = self.cluster.mds().fsck();
        if !problems.is_empty() {
            return Err(self.fail(format!("fsck: {}", problems.join("; "))));
        }
        for i in 0..SERVERS {
            let Some(s) = self.cluster.oss(i) else {
                continue;
            };
            let reports = s
                .scrub()
                .await
                .map_err(|e| self.fail(format!("scrub of server {i}: {e}")))?;
            for r in reports {
                if !r.bad.is_empty() {
                    return Err(self.fail(format!("scrub of server {i}: bad blocks {:?}", r.bad)));
                }
            }
        }
        Ok(())
    }
}

/// Two copies of one stripe, one on each storage server.
fn mirrored() -> client::Result<proto::layout::Layout> {
    Ok(client::raid0(Some(1), 1 << 20)?.with_mirrors(2)?)
}

fn describe(v: &Option<Vec<u8>>) -> String {
    match v {
        None => "nothing".into(),
        Some(b) => format!("{} bytes crc {:08x}", b.len(), crc(b)),
    }
}

fn crc(b: &[u8]) -> u32 {
    b.iter().fold(0x811c9dc5u32, |h, x| {
        (h ^ u32::from(*x)).wrapping_mul(0x01000193)
    })
}

/// The whole of an open file.
async fn read_all(f: &client::File) -> Result<Vec<u8>, String> {
    let size = f.size().await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; size as usize];
    let mut at = 0;
    while at < buf.len() {
        let n = f
            .read_at(at as u64, &mut buf[at..])
            .await
            .map_err(|e| format!("reading at {at}: {e}"))?;
        if n == 0 {
            break;
        }
        at += n;
    }
    buf.truncate(at);
    Ok(buf)
}

async fn read_whole(c: &Client, name: &str) -> Result<Option<Vec<u8>>, String> {
    let f = match OpenOptions::new().read(true).open(c, name).await {
        Ok(f) => f,
        Err(e) if e.is(proto::FsErrorKind::NotFound) => return Ok(None),
        Err(e) => return Err(format!("opening {name}: {e}")),
    };
    let size = f.size().await.map_err(|e| format!("{name}: {e}"))?;
    let mut buf = vec![0u8; size as usize];
    let mut at = 0;
    while at < buf.len() {
        let n = f
            .read_at(at as u64, &mut buf[at..])
            .await
            .map_err(|e| format!("reading {name} at {at}: {e}"))?;
        if n == 0 {
            break;
        }
        at += n;
    }
    buf.truncate(at);
    let _ = f.close().await;
    Ok(Some(buf))
}
