//! The testbed's real-code mode: the experiment's topology built from lode's own MDS, storage
//! servers and clients in this process, on the simulated fabric, through the same in-process
//! cluster builder the cross-crate tests use (targets join by registration and heartbeats).
//! Every node has a NIC of the topology's bandwidth, every link its latency, every target a
//! paced in-memory device of its bandwidths and I/O time; the clients run the workload through
//! the real library.
//!
//! Real code on two cores cannot move 100 GB/s, so the run is slowed down: every bandwidth is
//! divided by a factor and every latency multiplied by it, so that the whole run stays within
//! what this machine moves; times are divided by it again in the report. The timings therefore
//! depend on the machine; what the layouts put on each target does not.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::sim::{Fabric, LinkParams};
use oss::engine::mem::MemEngine;
use oss::engine::paced::{Pace, PacedEngine};
use oss::engine::Engine;
use tokio::task::JoinSet;

use crate::error::TestbedError;
use crate::experiment::{template, Access, Direction, Kind, Pattern, Topology, Workload};
use crate::{Point, Report};

/// Largest experiment the real mode takes.
const MAX_TARGETS: u32 = 64;
const MAX_CLIENTS: u32 = 64;
const MAX_BYTES: u64 = 4 << 30;
/// Requests per second of simulated traffic this machine carries with time to spare (each is
/// a real call through the fabric, the storage service and the paced device).
const IOPS_BUDGET: f64 = 4000.0;
const GB: f64 = 1e9;

type Progress = dyn Fn(u64, u64) + Send + Sync;

/// Who reads or writes which bytes of which file, and how large each file is.
struct Plan {
    /// Per client: (file, offset, length).
    jobs: Vec<Vec<(String, u64, u64)>>,
    sizes: BTreeMap<String, u64>,
    total: u64,
    direction: Direction,
    random: bool,
    request: u64,
    window: usize,
}

/// How much slower than the topology the run goes, and what that makes of its figures.
#[derive(Clone, Copy)]
struct Slowdown {
    factor: f64,
    /// The most the topology could move, bytes per second.
    ceiling: f64,
}

impl Slowdown {
    fn bw(&self, gbs: f64) -> u64 {
        (gbs * GB / self.factor) as u64
    }

    fn lat(&self, us: f64) -> Duration {
        Duration::from_secs_f64(us * 1e-6 * self.factor)
    }
}

/// Runs one point; `budget` is how many bytes per second of simulated traffic this machine
/// moves through real code comfortably (the slowdown keeps the run under it).
pub fn run_real(
    point: &Point,
    budget: f64,
    progress: impl Fn(u64, u64) + Send + Sync + 'static,
) -> Result<Report, TestbedError> {
    let t = &point.experiment.topology;
    let plan = plan(t, &point.experiment.workload)?;
    let slow = slowdown(t, &plan, budget);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(TestbedError::Runtime)?;
    let scratch = std::env::temp_dir().join(format!(
        "lode-sim-real-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let result = rt.block_on(run_on_fabric(
        point,
        &plan,
        slow,
        &scratch,
        Arc::new(progress),
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// The workload's files and each client's part of them.
fn plan(t: &Topology, w: &Workload) -> Result<Plan, TestbedError> {
    let unsupported = |s: String| TestbedError::Unsupported(s);
    if t.targets() > MAX_TARGETS || t.clients > MAX_CLIENTS {
        return Err(unsupported(format!(
            "runs up to {MAX_TARGETS} targets and {MAX_CLIENTS} clients"
        )));
    }
    let direction = match w.kind {
        Kind::Metadata => {
            return Err(unsupported(
                "runs data workloads (io, checkpoint, epoch)".into(),
            ))
        }
        Kind::Checkpoint => Direction::Write,
        Kind::Epoch => Direction::Read,
        Kind::Io => w.direction.unwrap_or(Direction::Read),
    };
    let mut jobs: Vec<Vec<(String, u64, u64)>> = vec![vec![]; t.clients as usize];
    let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
    let needs = |what: &str| unsupported(format!("needs {what} for this workload"));
    if w.kind == Kind::Epoch {
        let total = w.dataset_bytes.ok_or_else(|| needs("dataset_bytes"))?.0;
        let shard = w.shard_size.ok_or_else(|| needs("shard_size"))?.0.max(1);
        for s in 0..total.div_ceil(shard) {
            let name = format!("/shard-{s:05}");
            let len = shard.min(total - s * shard);
            jobs[(s % u64::from(t.clients)) as usize].push((name.clone(), 0, len));
            sizes.insert(name, len);
        }
    } else {
        let b = w
            .bytes_per_client
            .ok_or_else(|| needs("bytes_per_client"))?
            .0;
        for (i, j) in jobs.iter_mut().enumerate() {
            let (name, off) = match w.pattern.unwrap_or(Pattern::FilePerProcess) {
                Pattern::FilePerProcess => (format!("/file-{i:05}"), 0),
                Pattern::SharedFile => ("/shared".to_owned(), i as u64 * b),
            };
            j.push((name.clone(), off, b));
            let e = sizes.entry(name).or_default();
            *e = (*e).max(off + b);
        }
    }
    let total: u64 = jobs.iter().flatten().map(|j| j.2).sum();
    if total > MAX_BYTES {
        return Err(unsupported(format!(
            "moves up to {} GiB (this run: {total} B)",
            MAX_BYTES >> 30
        )));
    }
    Ok(Plan {
        jobs,
        sizes,
        total,
        direction,
        random: w.access == Some(Access::Random),
        request: w.request_size.0.max(1),
        window: w.window.max(1) as usize,
    })
}

/// The slowdown: the most the topology could move, brought within the host's budget, and no
/// more requests per second than the host can carry.
fn slowdown(t: &Topology, p: &Plan, budget: f64) -> Slowdown {
    let targets = f64::from(t.targets());
    let target_bw = match p.direction {
        Direction::Read => t.target_read_gbs,
        Direction::Write => t.target_write_gbs,
    };
    let ceiling = (targets * target_bw)
        .min(f64::from(t.clients) * t.client_nic_gbs)
        .min(f64::from(t.oss) * t.oss_nic_gbs)
        .min(
            t.oss_disk_gbs
                .map_or(f64::INFINITY, |d| f64::from(t.oss) * d),
        )
        * GB;
    let q = p.request as f64;
    let iops = if p.random {
        (targets * f64::from(t.target_queue_depth) / (t.target_io_latency_us * 1e-6).max(1e-9))
            .min(ceiling / q)
    } else {
        ceiling / q
    };
    Slowdown {
        factor: (ceiling / budget.max(1e6)).max(iops / IOPS_BUDGET).max(1.0),
        ceiling,
    }
}

/// Paced engines of one storage server's targets: each its own device over the server's
/// memory, behind the server's shared disk if the topology gives it one.
fn server_engines(
    t: &Topology,
    j: u32,
    slow: Slowdown,
    paces: &mut Vec<Arc<PacedEngine>>,
) -> Vec<Arc<dyn Engine>> {
    let mut device: Arc<dyn Engine> = Arc::new(MemEngine::new(64 << 30));
    if let Some(d) = t.oss_disk_gbs {
        let disk = Arc::new(PacedEngine::new(
            device,
            Pace {
                read_bps: slow.bw(d),
                write_bps: slow.bw(d),
                io_latency: Duration::ZERO,
                queue_depth: 0,
            },
        ));
        paces.push(disk.clone());
        device = disk;
    }
    (0..t.targets())
        .filter(|k| k % t.oss == j)
        .map(|_| {
            let paced = Arc::new(PacedEngine::new(
                device.clone(),
                Pace {
                    read_bps: slow.bw(t.target_read_gbs),
                    write_bps: slow.bw(t.target_write_gbs),
                    io_latency: slow.lat(t.target_io_latency_us),
                    queue_depth: t.target_queue_depth as usize,
                },
            ));
            paces.push(paced.clone());
            paced as Arc<dyn Engine>
        })
        .collect()
}

/// The topology as a cluster on a fabric: NICs, links, paced targets, connected clients.
async fn build(
    t: &Topology,
    p: &Plan,
    slow: Slowdown,
    scratch: &std::path::Path,
) -> Result<(Cluster, Vec<Client>, Vec<Arc<PacedEngine>>), TestbedError> {
    let fabric = Fabric::new(1);
    fabric
        .set_default_link(LinkParams {
            latency: slow.lat(t.link_latency_us),
            ..Default::default()
        })
        .map_err(cluster::ClusterError::from)?;
    let mut paces = vec![];
    let mut builder = ClusterBuilder::new(Network::Fabric(fabric.clone()), scratch);
    for j in 0..t.oss {
        builder = builder.storage_server(server_engines(t, j, slow, &mut paces));
    }
    let cluster = builder.start().await?;
    for j in 0..t.oss {
        fabric.set_nic(&format!("oss{j}"), slow.bw(t.oss_nic_gbs));
    }
    let mut clients = vec![];
    for i in 0..t.clients {
        let name = format!("client{i}");
        let cfg = ClientConfig {
            window: p.window,
            ..Default::default()
        };
        clients.push(cluster.client(&name, cfg).await?);
        fabric.set_nic(&name, slow.bw(t.client_nic_gbs));
    }
    cluster
        .wait_ready(&clients[0], t.targets(), Duration::from_secs(60))
        .await?;
    Ok((cluster, clients, paces))
}

/// Creates the files with the experiment's layout; a read workload's data is written first,
/// unpaced. Returns the bytes each target holds of the workload, as the MDS laid it out.
async fn lay_down(
    c: &Client,
    point: &Point,
    p: &Plan,
    paces: &[Arc<PacedEngine>],
) -> Result<BTreeMap<u32, u64>, TestbedError> {
    let layout = template(&point.experiment.workload.layout)?;
    for (name, size) in &p.sizes {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .layout(layout.clone())
            .open(c, name)
            .await?;
        if p.direction == Direction::Read {
            paces.iter().for_each(|e| e.set_enabled(false));
            let chunk = 8u64 << 20;
            let buf = Arc::new(c.register(vec![7u8; chunk as usize])?);
            let mut at = 0;
            while at < *size {
                let n = chunk.min(size - at);
                f.write_from(at, buf.clone(), 0, n).await?;
                at += n;
            }
            paces.iter().for_each(|e| e.set_enabled(true));
        }
        f.close().await?;
    }
    let mut per_target = BTreeMap::new();
    for (name, off, len) in p.jobs.iter().flatten() {
        if let Some(l) = c.getstripe(name).await? {
            l.bytes_per_target(*off, *len, &mut per_target);
        }
    }
    Ok(per_target)
}

/// One client's part: every request-sized block of its ranges once, in order or shuffled,
/// `window` requests in flight. Returns the bytes it moved.
async fn client_job(
    i: usize,
    c: Client,
    mine: Vec<(String, u64, u64)>,
    p: Arc<Plan>,
    done: Arc<AtomicU64>,
    progress: Arc<Progress>,
) -> Result<u64, TestbedError> {
    let q = p.request;
    let mut moved = 0u64;
    for (name, off, len) in mine {
        let read = p.direction == Direction::Read;
        let f = Arc::new(
            OpenOptions::new()
                .read(read)
                .write(!read)
                .open(&c, &name)
                .await?,
        );
        let mut blocks: Vec<u64> = (0..len.div_ceil(q)).map(|k| off + k * q).collect();
        if p.random {
            use rand::seq::SliceRandom;
            use rand::SeedableRng;
            blocks.shuffle(&mut rand::rngs::StdRng::seed_from_u64(i as u64));
        }
        let mut inflight = JoinSet::new();
        let mut landed = |n: u64| {
            moved += n;
            progress(done.fetch_add(n, Ordering::Relaxed) + n, p.total);
        };
        for at in blocks {
            if inflight.len() >= p.window {
                landed(joined(inflight.join_next().await)?);
            }
            let n = q.min(off + len - at);
            let (f, c) = (f.clone(), c.clone());
            inflight.spawn(async move {
                let region = Arc::new(c.register(vec![0u8; n as usize])?);
                if read {
                    Ok::<u64, TestbedError>(f.read_into(at, &region, 0, n).await? as u64)
                } else {
                    f.write_from(at, region, 0, n).await?;
                    Ok(n)
                }
            });
        }
        while let Some(r) = inflight.join_next().await {
            landed(joined(Some(r))?);
        }
        if let Ok(f) = Arc::try_unwrap(f) {
            f.close().await?;
        }
    }
    Ok(moved)
}

fn joined(
    r: Option<Result<Result<u64, TestbedError>, tokio::task::JoinError>>,
) -> Result<u64, TestbedError> {
    match r {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(TestbedError::Task(e.to_string())),
        None => Ok(0),
    }
}

/// The aggregate rate every 2% of the expected time, until every byte moved.
fn sample(
    done: Arc<AtomicU64>,
    total: u64,
    every: Duration,
) -> tokio::task::JoinHandle<Vec<(f64, f64)>> {
    let start = tokio::time::Instant::now();
    tokio::spawn(async move {
        let mut samples = vec![(0.0, 0.0)];
        let mut last = (0.0f64, 0u64);
        loop {
            tokio::time::sleep(every).await;
            let (now, d) = (start.elapsed().as_secs_f64(), done.load(Ordering::Relaxed));
            samples.push((last.0, (d - last.1) as f64 / (now - last.0)));
            last = (now, d);
            if d >= total {
                return samples;
            }
        }
    })
}

async fn run_on_fabric(
    point: &Point,
    p: &Plan,
    slow: Slowdown,
    scratch: &std::path::Path,
    progress: Arc<Progress>,
) -> Result<Report, TestbedError> {
    let t = &point.experiment.topology;
    let (cluster, clients, paces) = build(t, p, slow, scratch).await?;
    let per_target = lay_down(&clients[0], point, p, &paces).await?;
    let done = Arc::new(AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let every = Duration::from_secs_f64(
        (p.total as f64 / slow.ceiling * slow.factor / 50.0).clamp(0.005, 1.0),
    );
    let sampler = sample(done.clone(), p.total, every);
    let plan = Arc::new(Plan {
        jobs: vec![],
        sizes: BTreeMap::new(),
        ..*p
    });
    let mut runs = JoinSet::new();
    for (i, c) in clients.iter().enumerate() {
        let job = client_job(
            i,
            c.clone(),
            p.jobs[i].clone(),
            plan.clone(),
            done.clone(),
            progress.clone(),
        );
        runs.spawn(async move { job.await.map(|moved| (i, moved, start.elapsed())) });
    }
    let mut amount = vec![0.0; t.clients as usize];
    let mut finish = vec![0.0; t.clients as usize];
    while let Some(r) = runs.join_next().await {
        let (i, moved, at) = r.map_err(|e| TestbedError::Task(e.to_string()))??;
        amount[i] = moved as f64;
        finish[i] = at.as_secs_f64() / slow.factor;
    }
    let makespan = start.elapsed().as_secs_f64() / slow.factor;
    sampler.abort();
    let timeline = sampler.await.unwrap_or_default();
    cluster.stop().await;
    Ok(report(
        point, p, slow, per_target, amount, finish, makespan, timeline,
    ))
}

/// The run's figures in the model's units, times divided by the slowdown again.
#[allow(clippy::too_many_arguments)] // the parts of one report, gathered by one caller
fn report(
    point: &Point,
    p: &Plan,
    slow: Slowdown,
    per_target: BTreeMap<u32, u64>,
    client_amount: Vec<f64>,
    client_finish: Vec<f64>,
    makespan: f64,
    timeline: Vec<(f64, f64)>,
) -> Report {
    let t = &point.experiment.topology;
    let target_bw = match p.direction {
        Direction::Read => t.target_read_gbs,
        Direction::Write => t.target_write_gbs,
    };
    let target_amount: Vec<f64> = (0..t.targets())
        .map(|k| per_target.get(&k).copied().unwrap_or(0) as f64)
        .collect();
    let target_utilisation = target_amount
        .iter()
        .map(|a| a / (target_bw * GB * makespan).max(1e-12))
        .collect();
    Report {
        name: point.experiment.name.clone(),
        parameter: point.parameter.clone(),
        value: point.value.as_ref().map(|v| v.to_string()),
        total: client_amount.iter().sum(),
        makespan,
        client_amount,
        client_finish,
        target_amount,
        target_utilisation,
        timeline: timeline
            .into_iter()
            .map(|(t, r)| (t / slow.factor, r * slow.factor))
            .chain([(makespan, 0.0)])
            .collect(),
        unit: "B",
        flows: p.jobs.iter().map(|j| j.len()).sum(),
        events: 0,
    }
}
