//! The testbed's real-code mode: the experiment's topology built from lode's own MDS, storage
//! servers and clients in this process, on the simulated fabric. Every node has a NIC of the
//! topology's bandwidth, every link its latency, every target a paced in-memory device of its
//! bandwidths and I/O time; the clients run the workload through the real library.
//!
//! Real code on two cores cannot move 100 GB/s, so the run is slowed down: every bandwidth is
//! divided by a factor and every latency multiplied by it, so that the whole run stays within
//! what this machine moves; times are divided by it again in the report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use client::{Client, ClientConfig, OpenOptions};
use lnet::sim::{Fabric, LinkParams};
use lnet::testbed::experiment::{bytes_per_target, template, Access, Direction, Kind, Pattern};
use lnet::testbed::{Point, Report};
use lnet::Transport;
use proto::registry::{RegisterTargets, TargetReport};
use tokio::task::JoinSet;

/// Largest experiment the real mode takes.
const MAX_TARGETS: u32 = 64;
const MAX_CLIENTS: u32 = 64;
const MAX_BYTES: u64 = 4 << 30;
/// Requests per second of simulated traffic this machine carries with time to spare (each is
/// a real call through the fabric, the storage service and the paced device).
const IOPS_BUDGET: f64 = 4000.0;

/// Runs one point; `budget` is how many bytes per second of simulated traffic this machine moves
/// through real code comfortably (the slowdown keeps the run under it).
pub fn run_real(
    point: &Point,
    budget: f64,
    progress: impl Fn(u64, u64) + Send + Sync + 'static,
) -> Result<Report> {
    let x = &point.experiment;
    let t = &x.topology;
    let w = &x.workload;
    let targets = t.targets();
    if targets > MAX_TARGETS || t.clients > MAX_CLIENTS {
        bail!("the real-code mode runs up to {MAX_TARGETS} targets and {MAX_CLIENTS} clients");
    }
    if w.kind == Kind::Metadata {
        bail!("the real-code mode runs data workloads (io, checkpoint, epoch)");
    }
    let random = w.access == Some(Access::Random);
    let direction = match w.kind {
        Kind::Checkpoint => Direction::Write,
        Kind::Epoch => Direction::Read,
        _ => w.direction.unwrap_or(Direction::Read),
    };
    // Who reads or writes which bytes of which file.
    let mut jobs: Vec<Vec<(String, u64, u64)>> = vec![vec![]; t.clients as usize];
    let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
    match w.kind {
        Kind::Epoch => {
            let total = w.dataset_bytes.context("an epoch needs dataset_bytes")?.0;
            let shard = w.shard_size.context("an epoch needs shard_size")?.0.max(1);
            for s in 0..total.div_ceil(shard) {
                let name = format!("/shard-{s:05}");
                let len = shard.min(total - s * shard);
                jobs[(s % u64::from(t.clients)) as usize].push((name.clone(), 0, len));
                sizes.insert(name, len);
            }
        }
        _ => {
            let b = w
                .bytes_per_client
                .context("the workload needs bytes_per_client")?
                .0;
            for (i, j) in jobs.iter_mut().enumerate() {
                match w.pattern.unwrap_or(Pattern::FilePerProcess) {
                    Pattern::FilePerProcess => {
                        let name = format!("/file-{i:05}");
                        j.push((name.clone(), 0, b));
                        sizes.insert(name, b);
                    }
                    Pattern::SharedFile => {
                        j.push(("/shared".into(), i as u64 * b, b));
                        let e = sizes.entry("/shared".into()).or_default();
                        *e = (*e).max((i as u64 + 1) * b);
                    }
                }
            }
        }
    }
    let total_bytes: u64 = jobs.iter().flatten().map(|j| j.2).sum();
    if total_bytes > MAX_BYTES {
        bail!(
            "the real-code mode moves up to {} GiB (this run: {total_bytes} B)",
            MAX_BYTES >> 30
        );
    }
    // The slowdown: the most the topology could move, brought within the host's budget.
    let gb = 1e9;
    let target_bw = match direction {
        Direction::Read => t.target_read_gbs,
        Direction::Write => t.target_write_gbs,
    };
    let ceiling = (f64::from(targets) * target_bw)
        .min(f64::from(t.clients) * t.client_nic_gbs)
        .min(f64::from(t.oss) * t.oss_nic_gbs)
        .min(
            t.oss_disk_gbs
                .map_or(f64::INFINITY, |d| f64::from(t.oss) * d),
        )
        * gb;
    // Small random requests: also no more requests per second than the host can carry.
    let q = w.request_size.0.max(1);
    let iops = if random {
        (f64::from(targets) * f64::from(t.target_queue_depth)
            / (t.target_io_latency_us * 1e-6).max(1e-9))
        .min(ceiling / q as f64)
    } else {
        ceiling / q as f64
    };
    let slow = (ceiling / budget.max(1e6)).max(iops / IOPS_BUDGET).max(1.0);
    let bw = |gbs: f64| (gbs * gb / slow) as u64;
    let lat = |us: f64| Duration::from_secs_f64(us * 1e-6 * slow);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let scratch = tempdir()?;
    let result = rt.block_on(async {
        let fabric = Fabric::new(1);
        fabric.set_default_link(LinkParams {
            latency: lat(t.link_latency_us),
            ..Default::default()
        })?;
        // The MDS, with its registry and journal on disk, its allocator on a node of its own.
        let registry = Arc::new(mds::registry::Registry::open(&scratch)?);
        let store = Arc::new(mds::store::Store::open(&scratch, 64 << 20)?);
        let alloc_ep = fabric.start_node("mds-alloc", None)?;
        let alloc = mds::alloc::Allocator::with_net(registry.clone(), alloc_ep.into());
        tokio::spawn(alloc.clone().run(store.clone(), Duration::from_millis(200)));
        let service = mds::service::MdsService::new(registry, store, alloc);
        let mds_ep = fabric.start_node("mds", Some(service))?;
        let mds_nid = mds_ep.nid();
        // Storage servers: target k on OSS k mod oss, each a paced in-memory device.
        let mut paces = vec![];
        for j in 0..t.oss {
            let mut served = vec![];
            let mut reports = vec![];
            // The OSS's targets share its disk, if the topology gives it one.
            let mut device: Arc<dyn oss::engine::Engine> =
                Arc::new(oss::engine::mem::MemEngine::new(64 << 30));
            if let Some(d) = t.oss_disk_gbs {
                let disk = Arc::new(oss::engine::paced::PacedEngine::new(
                    device,
                    oss::engine::paced::Pace {
                        read_bps: bw(d),
                        write_bps: bw(d),
                        io_latency: Duration::ZERO,
                        queue_depth: 0,
                    },
                ));
                paces.push(disk.clone());
                device = disk;
            }
            for k in (0..targets).filter(|k| k % t.oss == j) {
                let mem = device.clone();
                let paced = Arc::new(oss::engine::paced::PacedEngine::new(
                    mem,
                    oss::engine::paced::Pace {
                        read_bps: bw(t.target_read_gbs),
                        write_bps: bw(t.target_write_gbs),
                        io_latency: lat(t.target_io_latency_us),
                        queue_depth: t.target_queue_depth as usize,
                    },
                ));
                paces.push(paced.clone());
                let engine: Arc<dyn oss::engine::Engine> = paced;
                let root = PathBuf::from(format!("/ost-{k}"));
                let uuid = 0x10de_0000_0000_0000_0000_0000_0000_0000u128 + u128::from(k);
                oss::target::Target::format(&engine, &root, uuid, Some(k)).await?;
                let target = Arc::new(oss::target::Target::open(engine.clone(), &root).await?);
                let space = engine.space(&root)?;
                reports.push(TargetReport {
                    index: Some(k),
                    uuid,
                    total: space.total,
                    free: space.free,
                });
                served.push(target);
            }
            let name = format!("oss{j}");
            let ep = fabric.start_node(&name, Some(oss::server::OssService::new(served)))?;
            let register = RegisterTargets {
                oss: ep.nid(),
                targets: reports,
            };
            lnet::call(&ep, &mds_nid, &register, Duration::from_secs(30)).await?;
            fabric.set_nic(&name, bw(t.oss_nic_gbs));
        }
        let mut clients = vec![];
        for i in 0..t.clients {
            let name = format!("client{i}");
            let ep = fabric.start_node(&name, None)?;
            fabric.set_nic(&name, bw(t.client_nic_gbs));
            let cfg = ClientConfig {
                window: w.window.max(1) as usize,
                ..Default::default()
            };
            clients.push(Client::connect_on(ep.into(), &mds_nid.to_string(), cfg).await?);
        }
        // Wait until the allocator has every target ready (orphans checked, pools filled).
        let c0 = clients[0].clone();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if c0.can_stripe_over(targets).await.unwrap_or(false) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the simulated servers did not all come up");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Files, with the experiment's layout; a read workload's data written first, unpaced.
        let layout = template(&w.layout)?;
        for (name, size) in &sizes {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .layout(layout.clone())
                .open(&c0, name)
                .await
                .with_context(|| format!("creating {name}"))?;
            if direction == Direction::Read {
                for p in &paces {
                    p.set_enabled(false);
                }
                let chunk = 8u64 << 20;
                let buf = Arc::new(c0.register(vec![7u8; chunk as usize])?);
                let mut at = 0;
                while at < *size {
                    let n = chunk.min(size - at);
                    f.write_from(at, buf.clone(), 0, n).await?;
                    at += n;
                }
                for p in &paces {
                    p.set_enabled(true);
                }
            }
            f.close().await?;
        }
        // Per-target bytes as the MDS laid the files out.
        let mut per_target = BTreeMap::new();
        for j in jobs.iter().flatten() {
            let l = c0
                .getstripe(&j.0)
                .await?
                .context("a file without a layout")?;
            bytes_per_target(&l, j.1, j.2, &mut per_target);
        }
        // The run: every client at once, `window` requests in flight each.
        let done = Arc::new(AtomicU64::new(0));
        let progress = Arc::new(progress);
        let start = tokio::time::Instant::now();
        let mut runs = JoinSet::new();
        for (i, c) in clients.iter().enumerate() {
            let (c, mine, done, progress) =
                (c.clone(), jobs[i].clone(), done.clone(), progress.clone());
            let window = w.window.max(1) as usize;
            runs.spawn(async move {
                let mut moved = 0u64;
                for (name, off, len) in mine {
                    let f = Arc::new(
                        OpenOptions::new()
                            .read(direction == Direction::Read)
                            .write(direction == Direction::Write)
                            .open(&c, &name)
                            .await?,
                    );
                    let mut inflight = JoinSet::new();
                    // Request-sized blocks of the range, in order or shuffled: every byte once.
                    let mut blocks: Vec<u64> = (0..len.div_ceil(q)).map(|k| off + k * q).collect();
                    if random {
                        use rand::seq::SliceRandom;
                        use rand::SeedableRng;
                        blocks.shuffle(&mut rand::rngs::StdRng::seed_from_u64(i as u64));
                    }
                    for at in blocks {
                        while inflight.len() >= window {
                            let n: u64 = inflight.join_next().await.expect("not empty")??;
                            moved += n;
                            progress(done.fetch_add(n, Ordering::Relaxed) + n, total_bytes);
                        }
                        let n = q.min(off + len - at);
                        let (f, c) = (f.clone(), c.clone());
                        inflight.spawn(async move {
                            let region = Arc::new(c.register(vec![0u8; n as usize])?);
                            if direction == Direction::Read {
                                let got = f.read_into(at, &region, 0, n).await?;
                                Ok::<u64, anyhow::Error>(got as u64)
                            } else {
                                f.write_from(at, region, 0, n).await?;
                                Ok(n)
                            }
                        });
                    }
                    while let Some(r) = inflight.join_next().await {
                        let n = r??;
                        moved += n;
                        progress(done.fetch_add(n, Ordering::Relaxed) + n, total_bytes);
                    }
                    if let Ok(f) = Arc::try_unwrap(f) {
                        f.close().await?;
                    }
                }
                Ok::<_, anyhow::Error>((i, moved, start.elapsed().as_secs_f64()))
            });
        }
        // A timeline: the aggregate rate every 2% of the expected time.
        let sampler = {
            let done = done.clone();
            let every = Duration::from_secs_f64(
                (total_bytes as f64 / ceiling * slow / 50.0).clamp(0.005, 1.0),
            );
            tokio::spawn(async move {
                let mut samples = vec![(0.0, 0.0)];
                let mut last = (0.0f64, 0u64);
                loop {
                    tokio::time::sleep(every).await;
                    let (now, d) = (start.elapsed().as_secs_f64(), done.load(Ordering::Relaxed));
                    samples.push((last.0, (d - last.1) as f64 / (now - last.0)));
                    last = (now, d);
                    if d >= total_bytes {
                        return samples;
                    }
                }
            })
        };
        let mut client_amount = vec![0.0; t.clients as usize];
        let mut client_finish = vec![0.0; t.clients as usize];
        while let Some(r) = runs.join_next().await {
            let (i, moved, at) = r??;
            client_amount[i] = moved as f64;
            client_finish[i] = at / slow;
        }
        let makespan = start.elapsed().as_secs_f64() / slow;
        sampler.abort();
        let timeline = sampler
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|(t, r)| (t / slow, r * slow))
            .chain([(makespan, 0.0)])
            .collect();
        let target_amount: Vec<f64> = (0..targets)
            .map(|k| per_target.get(&k).copied().unwrap_or(0) as f64)
            .collect();
        let target_utilisation = target_amount
            .iter()
            .map(|a| a / (target_bw * gb * makespan).max(1e-12))
            .collect();
        Ok::<Report, anyhow::Error>(Report {
            name: x.name.clone(),
            parameter: point.parameter.clone(),
            value: point.value.as_ref().map(|v| v.to_string()),
            total: client_amount.iter().sum(),
            makespan,
            client_amount,
            client_finish,
            target_amount,
            target_utilisation,
            timeline,
            unit: "B",
            flows: jobs.iter().map(|j| j.len()).sum(),
            events: 0,
        })
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn tempdir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!(
        "lode-sim-real-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
