//! The seeded whole-cluster simulator: the real MDS, storage servers and clients, started by
//! the calls the binaries make, on the simulated fabric, with the MDS's journal on a
//! crash-simulating disk and every target on a crash-simulating engine. Odd-numbered
//! checkpoints are mirrored, one copy on each storage server. The filesystem has two MDTs:
//! a quarter of the plain files live in `/m`, a directory placed on MDT1 (`mkdir -i 1`, its journal on
//! a crash-simulating disk too), so their creates, writes, truncates and removals go through
//! MDT1 while MDT0 and MDT1 are killed and lose power, and the end checks both MDTs against
//! each other.
//! Every third checkpoint is written in `/m` and renamed into place in `/`: a rename across
//! MDTs (the name moves to MDT0, the file stays on MDT1), coordinated by MDT1 while MDT0
//! crashes, and the checkpoint it replaces dropped at its own MDT. One plain file in four
//! lives in `/s`, a directory striped over both MDTs, and so do the second client's bursts of
//! creates answered ahead (each name on the MDT its hash gives). Jobs' trees (`/tK`) are made
//! striped over both MDTs, or on MDT1, or on MDT0 with a default that stripes each new
//! subdirectory over both, then filled with subdirectories and files, listed, read back and
//! removed, so striped mkdirs and rmdirs, and the defaults passed on, meet every crash.
//!
//! One seed chooses everything: the workload (checkpoints written to a temporary name,
//! fsynced and renamed into place; files written at random offsets and fsynced; truncates;
//! unlinks; from two clients), the faults between operations (a storage server killed and
//! restarted; one that loses power, losing everything not synced; the MDS killed; the MDS
//! losing power with its last journal write torn; MDT1's MDS killed or losing power; a storage server's disk full for a while;
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
//! shows as one of these); a tree lists exactly the names made in it, each file reads back
//! what was written, and a tree removed is gone; a client evicted with acknowledged changes is told by its next
//! sync (else they are held to the rules above, and found missing); after the faults stop, the
//! cluster makes progress (a new checkpoint commits); each
//! MDT's namespace passes `fsck`, the two pass the check across MDTs (every directory placed
//! on MDT1 named once on MDT0, every such name's directory there), and every target passes
//! `scrub`. A change is held to this until its
//! client knows it committed; a client dying with the MDS may take back its changes not yet
//! committed and, with them, changes other clients made after them (recovery.md: lode has no
//! commit-on-sharing yet), and nothing else.
//!
//! Run it on one thread under tokio's paused clock (`start_paused`), as the tests and the
//! `simulate` example do: the MDS then journals on the caller's thread
//! ([`mds::store::CommitMode::Deferred`]), clients and MDS runs are named from the seed, and a
//! seed replays exactly: the same messages at the same virtual times with the same fates
//! ([`Report::fingerprint`]). Waits cost no real time, so a seed takes a fraction of a second.

//!
//! The code: this file runs a seed (the cluster, the clients, the order of things); the
//! workload is `workload.rs` (a burst checks its own creates and removals as it goes), the
//! faults `faults.rs`, and each invariant checked at the end is a file of
//! its own: `check_contents.rs` (acknowledged bytes, mirrored copies),
//! `check_held.rs` (what an open reader sees), `check_progress.rs` (progress after the faults)
//! and `check_consistency.rs` (fsck and scrub).

mod check_consistency;
mod check_contents;
mod check_held;
mod check_progress;
mod faults;
mod workload;

use std::collections::{BTreeMap, BTreeSet};
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
    /// A plain file unlinked: it may be there again, with what it held (`len` bytes).
    Unlinked { name: String, len: usize },
}

impl Model {
    /// A crash of `client` together with the MDS: its changes not known committed may be
    /// lost, and so may every change made after the first of them.
    /// The checkpoints whose names changes lost with `client` may have given another file (its
    /// uncertain changes and every one after them, as [`Model::client_lost`] undoes).
    fn names_lost_with(&self, client: usize) -> Vec<String> {
        let Some(first) = self.uncertain.iter().position(|u| u.client == client) else {
            return vec![];
        };
        self.uncertain[first..]
            .iter()
            .filter_map(|u| match &u.undo {
                Undo::Checkpoint { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

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
                Undo::Unlinked { name, len } => {
                    let bytes = self.files.entry(name).or_default();
                    if bytes.len() < len {
                        bytes.resize(len, None);
                    }
                    bytes[..len].fill(None);
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
    /// MDT1's journal: plain files in `/m` live there.
    mdt1_disk: Arc<MemDisk>,
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
    let mdt1_disk = Arc::new(MemDisk::new());
    // One virtual clock for the MDS and the clients, which stamp the files they create ahead.
    let clock = virtual_clock();
    let engines: Vec<Arc<MemEngine>> = (0..SERVERS)
        .map(|_| Arc::new(MemEngine::new(1 << 30)))
        .collect();
    let mut builder = ClusterBuilder::new(Network::Fabric(fabric.clone()), &scratch)
        .mds_disk(disk.clone())
        .mdts(2)
        .mdt_disk(mdt1_disk.clone())
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
                mdt: None,
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
    // Virtual time: a message the fabric loses at setup costs a call's whole deadline (an
    // orphan cleanup's 10 s, a heartbeat's 5 s) before it is sent again.
    cluster
        .wait_ready(&clients[0], SERVERS as u32, Duration::from_secs(60))
        .await
        .map_err(|e| fail(e.to_string()))?;
    // Half the plain files live in `/m`, a directory on MDT1; MDT1 takes files once it has
    // registered with MDT0 and the storage servers joined it.
    let mut tries = 0;
    while !clients[0]
        .mdts()
        .await
        .is_ok_and(|m| m.iter().any(|m| m.index == 1 && m.up))
    {
        tries += 1;
        if tries > 200 {
            return Err(fail("MDT1 never registered with MDT0".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    clients[0]
        .mkdir_on(MDT1_DIR, 0o755, 1)
        .await
        .map_err(|e| fail(format!("mkdir -i 1 {MDT1_DIR}: {e}")))?;
    let striped = clients[0]
        .mkdir_striped(
            STRIPED_DIR,
            0o755,
            2,
            None,
            proto::dirstripe::HashType::Fnv1a64,
        )
        .await;
    match striped {
        Ok(_) => {}
        // Its shards wait for MDT1 (the network lost the step and its retry): the MDS makes
        // them, as a user who waits longer would see.
        Err(e) if e.is(proto::FsErrorKind::WouldBlock) => {
            let mut tries = 0;
            loop {
                let ready = match clients[0].stat(STRIPED_DIR).await {
                    Ok(i) => clients[0].dir_stripe(i.fid).await.is_ok_and(|s| {
                        s.is_some_and(|s| s.state == proto::dirstripe::StripeState::Ready)
                    }),
                    Err(_) => false,
                };
                if ready {
                    break;
                }
                tries += 1;
                if tries > 300 {
                    return Err(fail(format!("setdirstripe -c 2 {STRIPED_DIR}: {e}")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Err(e) => return Err(fail(format!("setdirstripe -c 2 {STRIPED_DIR}: {e}"))),
    }
    let probe = format!("{MDT1_DIR}/probe");
    let mut tries = 0;
    while let Err(e) = write_probe(&clients[0], &probe).await {
        tries += 1;
        if tries > 200 {
            return Err(fail(format!("MDT1 takes no file: {e}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut sim = Sim {
        seed,
        rng: ChaCha8Rng::seed_from_u64(seed),
        fabric,
        cluster,
        engines,
        disk,
        mdt1_disk,
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
}

/// The directory on MDT1 the odd plain files live in.
const MDT1_DIR: &str = "/m";

/// A directory striped over MDT0 and MDT1: its names live on either, by their hash.
const STRIPED_DIR: &str = "/s";

/// The plain file `k`: one in four in [`MDT1_DIR`], on MDT1, one in four in [`STRIPED_DIR`],
/// the rest in the root.
fn file_name(k: u32) -> String {
    match k % 4 {
        1 => format!("{MDT1_DIR}/f{k}"),
        3 => format!("{STRIPED_DIR}/f{k}"),
        _ => format!("/f{k}"),
    }
}

/// Makes, writes and removes `name`.
async fn write_probe(c: &Client, name: &str) -> client::Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .open(c, name)
        .await?;
    f.write_at(0, b"probe").await?;
    f.fsync().await?;
    f.close().await?;
    c.unlink(name).await
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
