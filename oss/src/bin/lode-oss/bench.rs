//! `lode-oss bench`: the I/O engines and a storage target against plain O_DIRECT file I/O on
//! the same disk, in the same run: sequential 1 MiB and 4 MiB writes and reads of one large
//! object, and 4 KiB random reads at a queue depth. Rounds rotate the order; the report gives
//! medians, GB/s (or IOPS) and CPU-seconds per GB, with the ratio to the plain baseline.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lnet::auth::capability::{READ, WRITE};
use lnet::auth::{CapabilityKey, KeyFile, Keyring, Security};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, Transport};
use oss::engine::psync::Psync;
use oss::engine::uring::Uring;
use oss::engine::{AlignedBuf, Engine, EngineConfig, FileHandle, OpenMode};
use oss::service::OssService;
use oss::Target;
use proto::capa::Capability;
use proto::ost::{OstRead, OstSync, OstWrite};
use proto::{Fid, Nid};
use rand::{Rng, SeedableRng};

#[derive(Args)]
pub struct BenchArgs {
    /// A directory on the disk to measure (files are created and removed there).
    #[arg(long)]
    dir: PathBuf,
    /// Size of the object, in MiB.
    #[arg(long, default_value_t = 2048)]
    mib: u64,
    /// Rounds of every measurement.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Queue depth of the random reads (and operations in flight for sequential engine I/O).
    #[arg(long, default_value_t = 16)]
    qd: usize,
    /// Random 4 KiB reads per measurement.
    #[arg(long, default_value_t = 50_000)]
    random_reads: u64,
}

#[derive(Clone, Copy)]
struct Sample {
    wall: f64,
    cpu: f64,
}

fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: initialised by the successful call.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[derive(Clone, Copy, PartialEq)]
enum Io {
    Write(usize),
    Read(usize),
    Random,
}

#[derive(Clone, Copy, PartialEq)]
enum Via {
    Plain,
    Engine(&'static str),
    Target(&'static str),
    /// A client over TCP loopback to a storage service on an io_uring target.
    Network,
}

/// The network case's two ends, in this process.
struct Net {
    _server: TcpEndpoint,
    client: Arc<TcpEndpoint>,
    nid: Nid,
    fid: Fid,
    /// The capability a client holds for `fid` (authentication is on, as in production).
    capa: Capability,
}

struct Case {
    io: Io,
    via: Via,
    samples: Vec<Sample>,
}

struct Bench {
    args: BenchArgs,
    raw_path: PathBuf,
    engines: Vec<(&'static str, Arc<dyn Engine>)>,
    files: Vec<(&'static str, FileHandle)>,
    targets: Vec<(&'static str, Arc<Target>, Fid)>,
    net: Net,
}

pub async fn run(args: BenchArgs) -> Result<()> {
    if args.mib < 4 || args.rounds == 0 || args.qd == 0 || args.random_reads == 0 {
        bail!("--mib must be at least 4; --rounds, --qd and --random-reads positive");
    }
    let root = args
        .dir
        .join(format!("lode-oss-bench-{}", std::process::id()));
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let cfg = EngineConfig {
        threads: 2,
        queue_depth: args.qd.max(4),
    };
    let engines: Vec<(&'static str, Arc<dyn Engine>)> = vec![
        ("io_uring", Arc::new(Uring::start(cfg)?)),
        ("psync", Arc::new(Psync::start(cfg))),
    ];
    let mut files = vec![];
    let mut targets = vec![];
    for (name, e) in &engines {
        files.push((
            *name,
            e.open(&root.join(format!("{name}.raw")), OpenMode::Create, true)?,
        ));
        let troot = root.join(format!("ost-{name}"));
        Target::format(e, &troot, 1, Some(0)).await?;
        let t = Arc::new(Target::open(e.clone(), &troot).await?);
        let fid = t.precreate(1).await?;
        targets.push((*name, t, fid));
    }
    let net_root = root.join("ost-net");
    let uring = engines[0].1.clone();
    Target::format(&uring, &net_root, 2, Some(1)).await?;
    let net_target = Arc::new(Target::open(uring, &net_root).await?);
    let fid = net_target.precreate(1).await?;
    let keys = Arc::new(Keyring::new(&KeyFile::generate()?));
    let capability = CapabilityKey::of(&keys).context("a cluster key signs capabilities")?;
    let grant = capability.grant([(1, fid)], READ | WRITE, u64::MAX);
    let server = TcpEndpoint::bind(
        "127.0.0.1:0".parse()?,
        OssService::new([net_target], Some(capability), None),
        TcpConfig {
            security: Security::server(keys.clone(), false)?,
            ..TcpConfig::default()
        },
    )
    .await?;
    let net = Net {
        nid: server.nid(),
        _server: server,
        client: Arc::new(TcpEndpoint::client(TcpConfig {
            security: Security::client(keys, false),
            ..TcpConfig::default()
        })),
        fid,
        capa: grant.for_object(1, fid).context("the grant")?,
    };
    let bench = Bench {
        net,
        raw_path: root.join("plain.raw"),
        args,
        engines,
        files,
        targets,
    };
    let result = bench.run_all().await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

impl Bench {
    fn bytes(&self) -> u64 {
        self.args.mib << 20
    }

    /// Every engine and baseline in rotated rounds (long by design: a script of timed steps).
    async fn run_all(&self) -> Result<()> {
        let mut cases = vec![];
        for io in [
            Io::Write(1 << 20),
            Io::Write(4 << 20),
            Io::Read(1 << 20),
            Io::Read(4 << 20),
            Io::Random,
        ] {
            cases.push(Case {
                io,
                via: Via::Plain,
                samples: vec![],
            });
            for (name, _) in &self.engines {
                cases.push(Case {
                    io,
                    via: Via::Engine(name),
                    samples: vec![],
                });
                cases.push(Case {
                    io,
                    via: Via::Target(name),
                    samples: vec![],
                });
            }
            cases.push(Case {
                io,
                via: Via::Network,
                samples: vec![],
            });
        }
        let bar = ProgressBar::new((cases.len() * self.args.rounds) as u64).with_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        // Writes first in every round, so reads always find the whole object written.
        let n = cases.len();
        for r in 0..self.args.rounds {
            for phase in [true, false] {
                let idx: Vec<usize> = (0..n)
                    .filter(|&i| matches!(cases[i].io, Io::Write(_)) == phase)
                    .collect();
                for k in 0..idx.len() {
                    let c = &mut cases[idx[(k + r) % idx.len()]];
                    bar.set_message(label(c.io, c.via));
                    let (w0, c0) = (Instant::now(), cpu_seconds());
                    self.one(c.io, c.via).await?;
                    c.samples.push(Sample {
                        wall: w0.elapsed().as_secs_f64(),
                        cpu: cpu_seconds() - c0,
                    });
                    bar.inc(1);
                }
            }
        }
        bar.finish_and_clear();
        println!(
            "lode-oss bench: {} MiB object in {}, {} rounds, medians; random reads: {} x 4 KiB at queue depth {}",
            self.args.mib,
            self.args.dir.display(),
            self.args.rounds,
            self.args.random_reads,
            self.args.qd
        );
        println!(
            "  {:<40} {:>10} {:>10} {:>8}",
            "", "GB/s|IOPS", "CPU s/GB", "ratio"
        );
        for io in [
            Io::Write(1 << 20),
            Io::Write(4 << 20),
            Io::Read(1 << 20),
            Io::Read(4 << 20),
            Io::Random,
        ] {
            let rows: Vec<&Case> = cases.iter().filter(|c| c.io == io).collect();
            let units = match io {
                Io::Random => self.args.random_reads as f64,
                _ => self.bytes() as f64,
            };
            let gb = match io {
                Io::Random => self.args.random_reads as f64 * 4096.0 / 1e9,
                _ => self.bytes() as f64 / 1e9,
            };
            let rate = |c: &Case| median(c.samples.iter().map(|s| units / s.wall).collect());
            let base = rate(rows[0]);
            for c in rows {
                let r = rate(c);
                let cpu = median(c.samples.iter().map(|s| s.cpu / gb).collect());
                let shown = if io == Io::Random {
                    format!("{r:.0}")
                } else {
                    format!("{:.2}", r / 1e9)
                };
                println!(
                    "  {:<40} {:>10} {:>10.3} {:>8.2}",
                    label(io, c.via),
                    shown,
                    cpu,
                    r / base
                );
            }
        }
        Ok(())
    }

    async fn one(&self, io: Io, via: Via) -> Result<()> {
        let (bytes, qd, n) = (self.bytes(), self.args.qd, self.args.random_reads);
        match via {
            Via::Plain => {
                let path = self.raw_path.clone();
                tokio::task::spawn_blocking(move || plain(&path, io, bytes, qd, n)).await??;
            }
            Via::Engine(name) => {
                let e = self
                    .engines
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, e)| e.clone())
                    .context("engine")?;
                let f = self
                    .files
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, f)| f.clone())
                    .context("file")?;
                engine_io(e, f, io, bytes, qd, n).await?;
            }
            Via::Target(name) => {
                let (_, t, fid) = self
                    .targets
                    .iter()
                    .find(|(k, _, _)| *k == name)
                    .context("target")?;
                target_io(t.clone(), *fid, io, bytes, qd, n).await?;
            }
            Via::Network => {
                net_io(&self.net, io, bytes, qd, n).await?;
            }
        }
        Ok(())
    }
}

fn label(io: Io, via: Via) -> String {
    let what = match io {
        Io::Write(s) => format!("seq write {} MiB", s >> 20),
        Io::Read(s) => format!("seq read {} MiB", s >> 20),
        Io::Random => "random read 4 KiB".to_owned(),
    };
    let how = match via {
        Via::Plain => "plain O_DIRECT".to_owned(),
        Via::Engine(e) => format!("engine {e}"),
        Via::Target(e) => format!("target {e}"),
        Via::Network => "network (TCP loopback)".to_owned(),
    };
    format!("{what}, {how}")
}

/// The baseline: pwrite/pread on an O_DIRECT file; sequential from one thread, random from
/// `qd` threads.
fn plain(path: &PathBuf, io: Io, bytes: u64, qd: usize, reads: u64) -> Result<()> {
    let f = Arc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(path)?,
    );
    match io {
        Io::Write(chunk) => {
            let mut buf = AlignedBuf::zeroed(chunk);
            buf.fill(0x5a);
            for off in (0..bytes).step_by(chunk) {
                f.write_all_at(&buf, off)?;
            }
            f.sync_all()?;
        }
        Io::Read(chunk) => {
            let mut buf = AlignedBuf::zeroed(chunk);
            for off in (0..bytes).step_by(chunk) {
                f.read_exact_at(&mut buf, off)?;
            }
        }
        Io::Random => {
            let threads: Vec<_> = (0..qd)
                .map(|t| {
                    let f = f.clone();
                    std::thread::spawn(move || -> std::io::Result<()> {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                        let mut buf = AlignedBuf::zeroed(4096);
                        for _ in 0..reads / qd as u64 {
                            let off = rng.gen_range(0..bytes / 4096) * 4096;
                            f.read_exact_at(&mut buf, off)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for t in threads {
                t.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
            }
        }
    }
    Ok(())
}

/// The same through an engine, with up to `qd` operations in flight.
async fn engine_io(
    e: Arc<dyn Engine>,
    f: FileHandle,
    io: Io,
    bytes: u64,
    qd: usize,
    reads: u64,
) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let workers = match io {
        Io::Random => qd,
        _ => 4,
    };
    for w in 0..workers {
        let (e, f) = (e.clone(), f.clone());
        tasks.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
            match io {
                Io::Write(chunk) | Io::Read(chunk) => {
                    let mut buf = AlignedBuf::zeroed(chunk);
                    buf.fill(0x5a);
                    let mut off = w as u64 * chunk as u64;
                    while off < bytes {
                        let (b, r) = if matches!(io, Io::Write(_)) {
                            e.write_at(&f, off, buf).await
                        } else {
                            e.read_at(&f, off, buf).await
                        };
                        r?;
                        buf = b;
                        off += (workers * chunk) as u64;
                    }
                }
                Io::Random => {
                    let mut buf = AlignedBuf::zeroed(4096);
                    for _ in 0..reads / qd as u64 {
                        let off = rng.gen_range(0..bytes / 4096) * 4096;
                        let (b, r) = e.read_at(&f, off, buf).await;
                        r?;
                        buf = b;
                    }
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    if matches!(io, Io::Write(_)) {
        e.sync(&f).await?;
    }
    Ok(())
}

/// The same through a storage target: checksums computed and verified, metadata kept.
async fn target_io(
    t: Arc<Target>,
    fid: Fid,
    io: Io,
    bytes: u64,
    qd: usize,
    reads: u64,
) -> Result<()> {
    match io {
        Io::Write(chunk) | Io::Read(chunk) => {
            // Four operations in flight, as a client pipelines them.
            let window = 4u64;
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..window {
                let t = t.clone();
                tasks.spawn(async move {
                    let data = vec![0x5au8; chunk];
                    let mut off = w * chunk as u64;
                    while off < bytes {
                        if matches!(io, Io::Write(_)) {
                            t.write(fid, off, &data, false, Default::default()).await?;
                        } else {
                            t.read(fid, off, chunk as u64).await?;
                        }
                        off += window * chunk as u64;
                    }
                    anyhow::Ok(())
                });
            }
            while let Some(r) = tasks.join_next().await {
                r??;
            }
            if matches!(io, Io::Write(_)) {
                t.sync(fid).await?;
            }
        }
        Io::Random => {
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..qd {
                let t = t.clone();
                tasks.spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                    for _ in 0..reads / qd as u64 {
                        let off = rng.gen_range(0..bytes / 4096) * 4096;
                        t.read(fid, off, 4096).await?;
                    }
                    anyhow::Ok(())
                });
            }
            while let Some(r) = tasks.join_next().await {
                r??;
            }
        }
    }
    Ok(())
}

/// The same through the network: OST_WRITE and OST_READ with bulk transfers, four in flight
/// for sequential I/O and `qd` for random reads. (Long by design: setup, three timed phases.)
async fn net_io(net: &Net, io: Io, bytes: u64, qd: usize, reads: u64) -> Result<()> {
    let (c, nid, fid, capa) = (net.client.clone(), net.nid.clone(), net.fid, net.capa);
    const T: std::time::Duration = std::time::Duration::from_secs(60);
    let (workers, chunk) = match io {
        Io::Write(c) | Io::Read(c) => (4usize, c),
        Io::Random => (qd, 4096),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (c, nid) = (c.clone(), nid.clone());
        tasks.spawn(async move {
            let region = c.register(vec![0x5au8; chunk])?;
            let desc = region.desc(0, chunk as u32, matches!(io, Io::Write(_)))?;
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
            match io {
                Io::Write(_) | Io::Read(_) => {
                    let mut off = (w * chunk) as u64;
                    while off < bytes {
                        if matches!(io, Io::Write(_)) {
                            call(
                                &*c,
                                &nid,
                                &OstWrite {
                                    target: 1,
                                    fid,
                                    offset: off,
                                    desc: desc.clone(),
                                    sync: false,
                                    stamp: Default::default(),
                                    capa: Some(capa),
                                },
                                T,
                            )
                            .await?;
                        } else {
                            call(
                                &*c,
                                &nid,
                                &OstRead {
                                    target: 1,
                                    fid,
                                    offset: off,
                                    desc: desc.clone(),
                                    capa: Some(capa),
                                },
                                T,
                            )
                            .await?;
                        }
                        off += (workers * chunk) as u64;
                    }
                }
                Io::Random => {
                    for _ in 0..reads / qd as u64 {
                        let off = rng.gen_range(0..bytes / 4096) * 4096;
                        call(
                            &*c,
                            &nid,
                            &OstRead {
                                target: 1,
                                fid,
                                offset: off,
                                desc: desc.clone(),
                                capa: Some(capa),
                            },
                            T,
                        )
                        .await?;
                    }
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    if matches!(io, Io::Write(_)) {
        call(
            &*c,
            &nid,
            &OstSync {
                target: 1,
                fid,
                capa: Some(capa),
            },
            T,
        )
        .await?;
    }
    Ok(())
}
