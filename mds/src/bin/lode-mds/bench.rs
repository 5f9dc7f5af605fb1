//! `lode-mds bench`: create, stat, readdir, rename and unlink of empty files through the real
//! RPC path over TCP loopback, by 1 and 8 concurrent clients, against the same operations on a
//! local directory (by 1 and 8 threads) measured in the same run, with authentication off,
//! with integrity protection and with privacy (the cost of each reported as a ratio). Each client works in its own
//! directory. The MDS acknowledges a mutation only once it is durable; the local directory
//! does not fsync.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use lnet::auth::{CapabilityKey, KeyFile, Keyring, Security};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, Transport};
use mds::identity::{Granter, Nodemap};
use mds::registry::Registry;
use mds::service::{MdsService, Policy};
use mds::store::{Store, DEFAULT_CHECKPOINT_BYTES};
use proto::md::*;
use proto::Nid;

#[derive(Args)]
pub struct BenchArgs {
    /// A directory on the local disk for the MDS's data and the local baseline.
    #[arg(long)]
    dir: PathBuf,
    /// Files per client.
    #[arg(long, default_value_t = 5000)]
    files: usize,
    /// Rounds; the report gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Count into the metrics a server with `--metrics` keeps (to measure what they cost).
    #[arg(long)]
    metrics: bool,
    /// Measure what counting costs instead: two MDS services side by side in this process,
    /// one counting as a server does by default (requests, metrics, job statistics, with a job
    /// on every request) and one as with `--no-stats`, in rotated order, with the ratio.
    #[arg(long, conflicts_with = "metrics")]
    counting: bool,
}

use proto::fid::ROOT;
const T: Duration = Duration::from_secs(30);
const OPS: [&str; 5] = ["create", "stat", "readdir", "rename", "unlink"];

/// What a row measures: the local directory, or lode with each protection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Local,
    Off,
    Integrity,
    Privacy,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::Local, Mode::Off, Mode::Integrity, Mode::Privacy];

    fn name(self) -> &'static str {
        match self {
            Mode::Local => "local directory",
            Mode::Off => "lode, no auth",
            Mode::Integrity => "lode, integrity",
            Mode::Privacy => "lode, privacy",
        }
    }
}

/// (clients, mode) and, per operation, the rate of each round.
type Series = ((usize, Mode), Vec<Vec<f64>>);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// An MDS service with its own store under `dir`, trusting root on this machine (the bench's
/// clients); it counts into `metrics` when given one.
fn bench_service(
    dir: &Path,
    keys: &Arc<Keyring>,
    metrics: Option<&mut prometheus_client::registry::Registry>,
) -> Result<Arc<MdsService>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let disk = mds::disk::DirDisk::new(dir);
    let fs = mds::format::format(
        &disk,
        &dir.display().to_string(),
        "bench",
        rand::random(),
        mds::store::wall_clock()(),
    )?;
    let store = Arc::new(Store::open(dir, DEFAULT_CHECKPOINT_BYTES)?);
    let registry = Arc::new(Registry::open(dir, fs)?);
    let alloc = mds::alloc::Allocator::new(registry.clone());
    let clients = mds::recovery::Clients::open(store.disk(), store.clone(), Duration::ZERO)?;
    Ok(MdsService::new(
        registry,
        store,
        alloc,
        rand::random(),
        Policy {
            nodemap: Nodemap::trusting(vec!["127.0.0.0/8".parse().map_err(anyhow::Error::msg)?]),
            granter: Granter {
                key: CapabilityKey::of(keys),
                lifetime: mds::identity::CAPABILITY_LIFETIME,
            },
            audit: None,
            metrics: metrics.map(mds::metrics::MdsMetrics::register),
            mdt0: None,
        },
        clients,
    ))
}

/// A service with its own store under `dir`, served with integrity on; counting as a server
/// does by default when `counting`, else nothing.
async fn counted_service(dir: &Path, keys: &Arc<Keyring>, counting: bool) -> Result<TcpEndpoint> {
    let mut metrics = prometheus_client::registry::Registry::default();
    let service = bench_service(dir, keys, counting.then_some(&mut metrics))?;
    Ok(TcpEndpoint::bind(
        "127.0.0.1:0".parse()?,
        service,
        TcpConfig {
            security: Security::server(keys.clone(), false)?,
            metrics: counting.then(|| lnet::metrics::ServiceMetrics::register(&mut metrics)),
            jobs: counting.then(|| Arc::new(lnet::jobstats::JobTable::default())),
            ..TcpConfig::default()
        },
    )
    .await?)
}

/// Prints the table's head and one row of medians per series.
fn print_medians<'a>(title: &str, rows: impl Iterator<Item = (String, &'a Vec<Vec<f64>>)>) {
    println!("{title}");
    println!(
        "  {:<30} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "", OPS[0], OPS[1], OPS[2], OPS[3], OPS[4]
    );
    for (name, per_op) in rows {
        let row: Vec<String> = per_op
            .iter()
            .map(|v| format!("{:>10.0}", median(v.clone())))
            .collect();
        println!("  {name:<30} {}", row.join(" "));
    }
}

/// (clients, counting) and, per operation, the rate of each round.
type CountingSeries = ((usize, bool), Vec<Vec<f64>>);

/// `--counting`: the same operations against a counting and a silent service, rotated.
async fn counting_cost(args: &BenchArgs, root: &Path) -> Result<()> {
    let keys = Arc::new(Keyring::new(&KeyFile::generate()?));
    let on = counted_service(&root.join("counting"), &keys, true).await?;
    let off = counted_service(&root.join("silent"), &keys, false).await?;
    let cfg = TcpConfig {
        security: Security::client(keys.clone(), false),
        job: proto::JobId::new("bench.1").ok(),
        ..TcpConfig::default()
    };
    // [(clients, counting)][op] = rates per round
    let mut results: Vec<CountingSeries> = vec![];
    for clients in [1usize, 8] {
        for counting in [true, false] {
            results.push(((clients, counting), vec![vec![]; OPS.len()]));
        }
    }
    for round in 0..args.rounds {
        for k in 0..results.len() {
            let i = (k + round) % results.len();
            let ((clients, counting), _) = results[i];
            let (nid, tag) = if counting {
                (on.nid(), "on")
            } else {
                (off.nid(), "off")
            };
            let rates = lode_round(&nid, cfg.clone(), tag, clients, args.files, round).await?;
            for (op, r) in rates.into_iter().enumerate() {
                results[i].1[op].push(r);
            }
        }
    }
    print_medians(
        &format!(
            "lode-mds bench --counting: {} files per client, {} rounds, medians, ops/s",
            args.files, args.rounds
        ),
        results.iter().map(|((clients, counting), per_op)| {
            let name = if *counting { "counting" } else { "--no-stats" };
            (format!("{name} x{clients}"), per_op)
        }),
    );
    for clients in [1usize, 8] {
        let of = |counting: bool| {
            results
                .iter()
                .find(|((c, k), _)| *c == clients && *k == counting)
                .map(|(_, v)| v)
        };
        let (Some(with), Some(without)) = (of(true), of(false)) else {
            continue;
        };
        let ratios: Vec<String> = with
            .iter()
            .zip(without)
            .map(|(a, b)| format!("{:>10.3}", median(a.clone()) / median(b.clone())))
            .collect();
        println!(
            "  {:<30} {}",
            format!("counting / --no-stats x{clients}"),
            ratios.join(" ")
        );
    }
    drop((on, off));
    Ok(())
}

pub async fn run(args: BenchArgs) -> Result<()> {
    if args.files == 0 || args.rounds == 0 {
        bail!("--files and --rounds must be positive");
    }
    if args.counting {
        let root = args
            .dir
            .join(format!("lode-mds-bench-{}", std::process::id()));
        let out = counting_cost(&args, &root).await;
        let _ = std::fs::remove_dir_all(&root);
        return out;
    }
    let root = args
        .dir
        .join(format!("lode-mds-bench-{}", std::process::id()));
    let keys = Arc::new(Keyring::new(&KeyFile::generate()?));
    let mut registry_m = prometheus_client::registry::Registry::default();
    let service = bench_service(
        &root.join("mds"),
        &keys,
        args.metrics.then_some(&mut registry_m),
    )?;
    let rpc_metrics = args
        .metrics
        .then(|| lnet::metrics::ServiceMetrics::register(&mut registry_m));
    // The same service behind two listeners: one open, one authenticating; clients choose
    // integrity or privacy on the second.
    let open = TcpEndpoint::bind(
        "127.0.0.1:0".parse()?,
        service.clone(),
        TcpConfig {
            metrics: rpc_metrics.clone(),
            ..TcpConfig::default()
        },
    )
    .await?;
    let keyed = TcpEndpoint::bind(
        "127.0.0.1:0".parse()?,
        service,
        TcpConfig {
            security: Security::server(keys.clone(), false)?,
            metrics: rpc_metrics,
            ..TcpConfig::default()
        },
    )
    .await?;
    // results[(clients, mode)][op] = rates per round
    let mut results: Vec<Series> = vec![];
    for clients in [1usize, 8] {
        for mode in Mode::ALL {
            results.push(((clients, mode), vec![vec![]; OPS.len()]));
        }
    }
    for round in 0..args.rounds {
        for k in 0..results.len() {
            let i = (k + round) % results.len();
            let ((clients, mode), _) = results[i];
            let client_cfg = |security| TcpConfig {
                security,
                ..TcpConfig::default()
            };
            let rates = match mode {
                Mode::Local => local_round(&root.join("local"), clients, args.files, round).await?,
                Mode::Off => {
                    lode_round(
                        &open.nid(),
                        TcpConfig::default(),
                        "off",
                        clients,
                        args.files,
                        round,
                    )
                    .await?
                }
                Mode::Integrity | Mode::Privacy => {
                    let security = Security::client(keys.clone(), mode == Mode::Privacy);
                    let tag = if mode == Mode::Privacy { "p" } else { "i" };
                    lode_round(
                        &keyed.nid(),
                        client_cfg(security),
                        tag,
                        clients,
                        args.files,
                        round,
                    )
                    .await?
                }
            };
            for (op, r) in rates.into_iter().enumerate() {
                results[i].1[op].push(r);
            }
        }
    }
    print_medians(
        &format!(
            "lode-mds bench: {} files per client, {} rounds, medians, ops/s",
            args.files, args.rounds
        ),
        results
            .iter()
            .map(|((clients, mode), per_op)| (format!("{} x{clients}", mode.name()), per_op)),
    );
    // The cost of authentication: each mode against no authentication, same clients.
    for ((clients, mode), per_op) in &results {
        if !matches!(mode, Mode::Integrity | Mode::Privacy) {
            continue;
        }
        let Some((_, base)) = results
            .iter()
            .find(|((c, m), _)| c == clients && *m == Mode::Off)
        else {
            continue;
        };
        let ratios: Vec<String> = per_op
            .iter()
            .zip(base)
            .map(|(v, b)| format!("{:>10.2}", median(v.clone()) / median(b.clone())))
            .collect();
        println!(
            "  {:<30} {}",
            format!("{} / no auth x{clients}", mode.name()),
            ratios.join(" ")
        );
    }
    drop((open, keyed));
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// Runs `f` for each client at once and returns the aggregate rate of `n` operations each.
async fn timed<F, Fut>(clients: usize, n: usize, f: F) -> Result<f64>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..clients).map(|c| tokio::spawn(f(c))).collect();
    for t in tasks {
        t.await??;
    }
    Ok((clients * n) as f64 / t0.elapsed().as_secs_f64())
}

/// One round of every measured operation, in the order the report lists them (long by design:
/// a script of steps, each timed).
async fn lode_round(
    nid: &Nid,
    cfg: TcpConfig,
    tag: &str,
    clients: usize,
    files: usize,
    round: usize,
) -> Result<Vec<f64>> {
    let root = Creds::root();
    let eps: Vec<Arc<TcpEndpoint>> = (0..clients)
        .map(|_| Arc::new(TcpEndpoint::client(cfg.clone())))
        .collect();
    let mut dirs = vec![];
    for (c, ep) in eps.iter().enumerate() {
        let m = Mutation::Create {
            parent: ROOT,
            name: format!("r{round}c{c}-{clients}-{tag}").into_bytes(),
            kind: Kind::Dir,
            mode: 0o755,
            exclusive: true,
            target: vec![],
            layout: None,
        };
        let d = call(
            &**ep,
            nid,
            &MdsReint {
                creds: root.clone(),
                mutation: m,
                req: None,
                acked: 0,
                open: None,
                size_gen: None,
                behind: false,
                lease: false,
                time: None,
            },
            T,
        )
        .await?;
        dirs.push(d.inode.context("mkdir")?.fid);
    }
    let name = |i: usize| format!("f{i:07}").into_bytes();
    let mut rates = vec![];
    let ctx = |c: usize| (eps[c].clone(), nid.clone(), dirs[c], Creds::root());
    rates.push(
        timed(clients, files, |c| {
            let (ep, nid, dir, creds) = ctx(c);
            async move {
                for i in 0..files {
                    let m = Mutation::Create {
                        parent: dir,
                        name: name(i),
                        kind: Kind::File,
                        mode: 0o644,
                        exclusive: true,
                        target: vec![],
                        layout: None,
                    };
                    call(
                        &*ep,
                        &nid,
                        &MdsReint {
                            creds: creds.clone(),
                            mutation: m,
                            req: None,
                            acked: 0,
                            open: None,
                            size_gen: None,
                            behind: false,
                            lease: false,
                            time: None,
                        },
                        T,
                    )
                    .await?;
                }
                Ok(())
            }
        })
        .await?,
    );
    rates.push(
        timed(clients, files, |c| {
            let (ep, nid, dir, creds) = ctx(c);
            async move {
                for i in 0..files {
                    call(
                        &*ep,
                        &nid,
                        &MdsLookup {
                            creds: creds.clone(),
                            parent: dir,
                            name: name(i),
                            lease: None,
                        },
                        T,
                    )
                    .await?;
                }
                Ok(())
            }
        })
        .await?,
    );
    rates.push(
        timed(clients, files, |c| {
            let (ep, nid, dir, creds) = ctx(c);
            async move {
                let mut after = vec![];
                let mut seen = 0;
                loop {
                    let page = call(
                        &*ep,
                        &nid,
                        &MdsReaddir {
                            creds: creds.clone(),
                            dir,
                            after: after.clone(),
                            max: 1024,
                            plus: false,
                            lease: None,
                        },
                        T,
                    )
                    .await?;
                    seen += page.entries.len();
                    if let Some(last) = page.entries.last() {
                        after = last.name.clone();
                    }
                    if page.end {
                        break;
                    }
                }
                if seen != files {
                    bail!("readdir saw {seen} of {files}");
                }
                Ok(())
            }
        })
        .await?,
    );
    rates.push(
        timed(clients, files, |c| {
            let (ep, nid, dir, creds) = ctx(c);
            async move {
                for i in 0..files {
                    let mut to = name(i);
                    to.push(b'r');
                    let m = Mutation::Rename {
                        parent: dir,
                        name: name(i),
                        new_parent: dir,
                        new_name: to,
                        flags: RenameFlags::default(),
                    };
                    call(
                        &*ep,
                        &nid,
                        &MdsReint {
                            creds: creds.clone(),
                            mutation: m,
                            req: None,
                            acked: 0,
                            open: None,
                            size_gen: None,
                            behind: false,
                            lease: false,
                            time: None,
                        },
                        T,
                    )
                    .await?;
                }
                Ok(())
            }
        })
        .await?,
    );
    rates.push(
        timed(clients, files, |c| {
            let (ep, nid, dir, creds) = ctx(c);
            async move {
                for i in 0..files {
                    let mut n = name(i);
                    n.push(b'r');
                    let m = Mutation::Unlink {
                        parent: dir,
                        name: n,
                        dir: false,
                    };
                    call(
                        &*ep,
                        &nid,
                        &MdsReint {
                            creds: creds.clone(),
                            mutation: m,
                            req: None,
                            acked: 0,
                            open: None,
                            size_gen: None,
                            behind: false,
                            lease: false,
                            time: None,
                        },
                        T,
                    )
                    .await?;
                }
                Ok(())
            }
        })
        .await?,
    );
    Ok(rates)
}

async fn local_round(base: &Path, clients: usize, files: usize, round: usize) -> Result<Vec<f64>> {
    let dirs: Vec<PathBuf> = (0..clients)
        .map(|c| base.join(format!("r{round}c{c}-{clients}")))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d)?;
    }
    let dirs = Arc::new(dirs);
    let mut rates = vec![];
    type Step = fn(&Path, usize) -> std::io::Result<()>;
    let steps: [Step; 5] = [
        |d, i| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(d.join(format!("f{i:07}")))
                .map(|_| ())
        },
        |d, i| std::fs::metadata(d.join(format!("f{i:07}"))).map(|_| ()),
        |_, _| Ok(()),
        |d, i| std::fs::rename(d.join(format!("f{i:07}")), d.join(format!("f{i:07}r"))),
        |d, i| std::fs::remove_file(d.join(format!("f{i:07}r"))),
    ];
    for (op, step) in steps.into_iter().enumerate() {
        let dirs = dirs.clone();
        rates.push(
            timed(clients, files, move |c| {
                let dirs = dirs.clone();
                async move {
                    tokio::task::spawn_blocking(move || -> Result<()> {
                        let d = &dirs[c];
                        if op == 2 {
                            let n = std::fs::read_dir(d)?.count();
                            if n != files {
                                bail!("readdir saw {n} of {files}");
                            }
                            return Ok(());
                        }
                        for i in 0..files {
                            step(d, i)?;
                        }
                        Ok(())
                    })
                    .await?
                }
            })
            .await?,
        );
    }
    for d in dirs.iter() {
        let _ = std::fs::remove_dir(d);
    }
    Ok(rates)
}
