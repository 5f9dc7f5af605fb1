//! The benchmarks, each beside a baseline measured in the same run: lnet bulk over TCP against
//! a raw socket copy, small-RPC rates, and sim-fabric bulk copies against memcpy. Rounds run in
//! rotated order; the report gives medians and CPU-seconds per GB (both sides of loopback run in
//! this process, so CPU time covers sender and receiver alike).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lnet::auth::{KeyFile, Keyring, Security};
use lnet::selftest::SelfTest;
use lnet::sim::Fabric;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, Transport};
use proto::msg::{BulkRead, BulkWrite, Echo};
use proto::Nid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Args)]
pub struct BenchArgs {
    /// A self-test server to measure against instead of a local one.
    #[arg(long)]
    peer: Option<Nid>,
    /// Rounds of every measurement; the report gives the median.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// MiB moved per bulk measurement.
    #[arg(long, default_value_t = 2048)]
    mib: u64,
    /// Calls per RPC-rate measurement.
    #[arg(long, default_value_t = 200_000)]
    calls: u64,
    /// Calls in flight for the RPC-rate measurements.
    #[arg(long, default_value_t = 64)]
    inflight: usize,
    /// With --peer: the key to authenticate with (else the peer must run with --no-auth).
    #[arg(long, requires = "peer")]
    key: Option<std::path::PathBuf>,
}

/// How a row's connections are protected.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Integrity,
    Privacy,
}

const CHUNK: usize = 1 << 20;
const BULK_INFLIGHT: usize = 8;
const T: Duration = Duration::from_secs(30);

/// One measurement: wall time and CPU time of this process.
#[derive(Clone, Copy)]
struct Sample {
    wall: f64,
    cpu: f64,
}

fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } == 0;
    if !ok {
        return 0.0;
    }
    // SAFETY: initialised by the successful call above.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

async fn measure<F: Future<Output = Result<()>>>(f: F) -> Result<Sample> {
    let (w0, c0) = (Instant::now(), cpu_seconds());
    f.await?;
    Ok(Sample {
        wall: w0.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - c0,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

type Job<'a> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Sample>> + 'a>> + 'a>;

struct Case<'a> {
    name: &'static str,
    /// Bytes moved (bulk) or calls made (RPC) per round.
    units: f64,
    job: Job<'a>,
    samples: Vec<Sample>,
}

/// Runs every case `rounds` times, starting each round one case further along.
async fn rotate(cases: &mut [Case<'_>], rounds: usize, bar: &ProgressBar) -> Result<()> {
    let n = cases.len();
    for r in 0..rounds {
        for i in 0..n {
            let c = &mut cases[(r + i) % n];
            bar.set_message(c.name);
            let s = (c.job)().await?;
            c.samples.push(s);
            bar.inc(1);
        }
    }
    Ok(())
}

fn report_bulk(title: &str, cases: &[Case<'_>]) {
    println!("\n{title}");
    println!(
        "  {:<34} {:>9} {:>10} {:>8}",
        "", "GB/s", "CPU s/GB", "ratio"
    );
    let base = median(
        cases[0]
            .samples
            .iter()
            .map(|s| cases[0].units / s.wall / 1e9)
            .collect(),
    );
    for c in cases {
        let gbs = median(c.samples.iter().map(|s| c.units / s.wall / 1e9).collect());
        let cpu = median(c.samples.iter().map(|s| s.cpu / (c.units / 1e9)).collect());
        println!(
            "  {:<34} {:>9.2} {:>10.3} {:>8.2}",
            c.name,
            gbs,
            cpu,
            gbs / base
        );
    }
}

fn report_rate(title: &str, cases: &[Case<'_>]) {
    println!("\n{title}");
    println!("  {:<34} {:>12} {:>14}", "", "calls/s", "CPU us/call");
    for c in cases {
        let rate = median(c.samples.iter().map(|s| c.units / s.wall).collect());
        let cpu = median(c.samples.iter().map(|s| s.cpu / c.units * 1e6).collect());
        println!("  {:<34} {:>12.0} {:>14.2}", c.name, rate, cpu);
    }
}

/// Every measurement in the order the report prints them (long by design: a script of timed
/// steps against their baselines).
pub async fn run(args: BenchArgs) -> Result<()> {
    if args.rounds == 0 || args.mib == 0 || args.calls == 0 || args.inflight == 0 {
        bail!("--rounds, --mib, --calls and --inflight must be positive");
    }
    // Two local servers: one open, one authenticating (clients choose integrity or privacy);
    // or the peer given, in the one mode it allows.
    let keys = Arc::new(Keyring::new(&KeyFile::generate()?));
    let mut local = vec![];
    let mut peers = std::collections::HashMap::new();
    let modes: Vec<Mode> = match (&args.peer, &args.key) {
        (Some(p), None) => {
            peers.insert(true, p.clone());
            vec![Mode::Off]
        }
        (Some(p), Some(_)) => {
            peers.insert(false, p.clone());
            vec![Mode::Integrity, Mode::Privacy]
        }
        (None, _) => {
            for open in [true, false] {
                let security = if open {
                    Security::Off
                } else {
                    Security::server(keys.clone(), false)?
                };
                let ep = TcpEndpoint::bind(
                    "127.0.0.1:0".parse()?,
                    SelfTest::new(),
                    TcpConfig {
                        security,
                        ..TcpConfig::default()
                    },
                )
                .await
                .context("starting the local self-test server")?;
                peers.insert(open, ep.nid());
                local.push(ep);
            }
            vec![Mode::Off, Mode::Integrity, Mode::Privacy]
        }
    };
    let client_keys = match &args.key {
        Some(path) => Arc::new(Keyring::load(path)?),
        None => keys.clone(),
    };
    let endpoint = |conns: usize, mode: Mode| {
        let security = match mode {
            Mode::Off => Security::Off,
            Mode::Integrity => Security::client(client_keys.clone(), false),
            Mode::Privacy => Security::client(client_keys.clone(), true),
        };
        (
            Arc::new(TcpEndpoint::client(TcpConfig {
                conns_per_peer: conns,
                security,
                ..TcpConfig::default()
            })),
            peers[&(mode == Mode::Off)].clone(),
        )
    };
    let peer = peers.values().next().cloned().context("a peer")?;
    let bytes = args.mib << 20;
    let bulk = |name, conns: usize, mode: Mode, write| -> Option<Case<'_>> {
        if !modes.contains(&mode) {
            return None;
        }
        let (ep, peer) = endpoint(conns, mode);
        Some(Case {
            name,
            units: bytes as f64,
            job: Box::new(move || {
                Box::pin(measure(lnet_bulk(ep.clone(), peer.clone(), bytes, write)))
            }),
            samples: vec![],
        })
    };
    let raw_peer = raw_sink_server().await?;
    let mut tcp_cases: Vec<Case<'_>> = [
        Some(Case {
            name: "raw tokio socket, 1 stream",
            units: bytes as f64,
            job: Box::new(move || Box::pin(measure(raw_socket_copy(raw_peer, bytes)))),
            samples: vec![],
        }),
        bulk("lnet bulk read, 1 conn, no auth", 1, Mode::Off, false),
        bulk("lnet bulk read, 2 conns, no auth", 2, Mode::Off, false),
        bulk(
            "lnet bulk read, 2 conns, integrity",
            2,
            Mode::Integrity,
            false,
        ),
        bulk("lnet bulk read, 2 conns, privacy", 2, Mode::Privacy, false),
        bulk("lnet bulk write, 2 conns, no auth", 2, Mode::Off, true),
        bulk(
            "lnet bulk write, 2 conns, integrity",
            2,
            Mode::Integrity,
            true,
        ),
        bulk("lnet bulk write, 2 conns, privacy", 2, Mode::Privacy, true),
    ]
    .into_iter()
    .flatten()
    .collect();
    let rpc = |name, conns: usize, mode: Mode| -> Option<Case<'_>> {
        if !modes.contains(&mode) {
            return None;
        }
        let (ep, peer) = endpoint(conns, mode);
        let (calls, inflight) = (args.calls, args.inflight);
        Some(Case {
            name,
            units: calls as f64,
            job: Box::new(move || {
                Box::pin(measure(rpc_rate(ep.clone(), peer.clone(), calls, inflight)))
            }),
            samples: vec![],
        })
    };
    let mut rpc_cases: Vec<Case<'_>> = [
        rpc("small RPC, 1 conn, no auth", 1, Mode::Off),
        rpc("small RPC, 1 conn, integrity", 1, Mode::Integrity),
        rpc("small RPC, 1 conn, privacy", 1, Mode::Privacy),
        rpc("small RPC, 4 conns, no auth", 4, Mode::Off),
        rpc("small RPC, 4 conns, integrity", 4, Mode::Integrity),
    ]
    .into_iter()
    .flatten()
    .collect();

    let fabric = Fabric::new(1);
    fabric.start_node("server", Some(SelfTest::new()))?;
    let sim_client = Arc::new(fabric.start_node("client", None)?);
    let sim_bytes = bytes;
    let mut sim_cases = vec![
        Case {
            name: "memcpy 1 MiB",
            units: sim_bytes as f64,
            job: Box::new(move || Box::pin(measure(memcpy(sim_bytes)))),
            samples: vec![],
        },
        Case {
            name: "sim fabric bulk read 1 MiB",
            units: sim_bytes as f64,
            job: Box::new({
                let c = sim_client.clone();
                move || {
                    Box::pin(measure(lnet_bulk(
                        c.clone(),
                        Nid::sim("server").unwrap(),
                        sim_bytes,
                        false,
                    )))
                }
            }),
            samples: vec![],
        },
    ];

    let total = (args.rounds * (tcp_cases.len() + rpc_cases.len() + sim_cases.len())) as u64;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    rotate(&mut tcp_cases, args.rounds, &bar).await?;
    rotate(&mut rpc_cases, args.rounds, &bar).await?;
    rotate(&mut sim_cases, args.rounds, &bar).await?;
    bar.finish_and_clear();

    println!(
        "lst bench: peer {peer}, {} MiB per bulk round in {} KiB transfers ({BULK_INFLIGHT} in flight), {} rounds, medians",
        args.mib,
        CHUNK >> 10,
        args.rounds
    );
    report_bulk(
        "Bulk over TCP loopback (ratio against the raw socket)",
        &tcp_cases,
    );
    report_rate(
        &format!("Small RPC, {} in flight", args.inflight),
        &rpc_cases,
    );
    report_bulk("Sim fabric bulk (ratio against memcpy)", &sim_cases);
    report_auth_cost(&tcp_cases, &rpc_cases);
    drop(local);
    Ok(())
}

/// Each authenticated row against the same row without authentication, as a ratio of
/// throughput (bytes or calls per second).
fn report_auth_cost<'a>(bulk: &[Case<'a>], rpc: &[Case<'a>]) {
    let rate = |c: &Case<'_>| median(c.samples.iter().map(|s| c.units / s.wall).collect());
    let mut lines = vec![];
    for c in bulk.iter().chain(rpc) {
        for mode in [", integrity", ", privacy"] {
            let Some(stem) = c.name.strip_suffix(mode) else {
                continue;
            };
            let base_name = format!("{stem}, no auth");
            if let Some(base) = bulk.iter().chain(rpc).find(|b| b.name == base_name) {
                lines.push(format!("  {:<34} {:>8.2}", c.name, rate(c) / rate(base)));
            }
        }
    }
    if !lines.is_empty() {
        println!("\nThe cost of authentication (throughput against the same row with no auth)");
        for l in lines {
            println!("{l}");
        }
    }
}

/// Moves `bytes` with 1 MiB bulk reads (server puts into our regions) or writes (server gets
/// from them), `BULK_INFLIGHT` at a time.
async fn lnet_bulk<T: Transport>(ep: Arc<T>, peer: Nid, bytes: u64, write: bool) -> Result<()> {
    let per_worker = bytes / CHUNK as u64 / BULK_INFLIGHT as u64;
    let mut workers = Vec::new();
    for w in 0..BULK_INFLIGHT {
        let (ep, peer) = (ep.clone(), peer.clone());
        workers.push(tokio::spawn(async move {
            let region = ep.register(vec![w as u8; CHUNK])?;
            let desc = region.desc(0, CHUNK as u32, write)?;
            for _ in 0..per_worker {
                let done = if write {
                    call(&*ep, &peer, &BulkWrite { desc: desc.clone() }, T).await?
                } else {
                    call(
                        &*ep,
                        &peer,
                        &BulkRead {
                            desc: desc.clone(),
                            seed: 1,
                        },
                        T,
                    )
                    .await?
                };
                if done.bytes != CHUNK as u64 {
                    bail!("short transfer: {} bytes", done.bytes);
                }
            }
            Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok(())
}

async fn rpc_rate(ep: Arc<TcpEndpoint>, peer: Nid, calls: u64, inflight: usize) -> Result<()> {
    let per_worker = calls / inflight as u64;
    let mut workers = Vec::new();
    for _ in 0..inflight {
        let (ep, peer) = (ep.clone(), peer.clone());
        workers.push(tokio::spawn(async move {
            let msg = Echo {
                payload: vec![0u8; 8],
            };
            for _ in 0..per_worker {
                call(&*ep, &peer, &msg, T).await?;
            }
            anyhow::Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok(())
}

/// A server that writes whatever is asked of it: 8 bytes of length in, that many bytes out.
async fn raw_sink_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let chunk = vec![7u8; CHUNK];
                let Ok(mut left) = s.read_u64_le().await else {
                    return;
                };
                while left > 0 {
                    let n = left.min(CHUNK as u64) as usize;
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            });
        }
    });
    Ok(addr)
}

async fn raw_socket_copy(addr: SocketAddr, bytes: u64) -> Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_u64_le(bytes).await?;
    let mut buf = vec![0u8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        s.read_exact(&mut buf[..n]).await?;
        left -= n as u64;
    }
    Ok(())
}

async fn memcpy(bytes: u64) -> Result<()> {
    let src = vec![3u8; CHUNK];
    let mut dst = vec![0u8; CHUNK];
    for _ in 0..bytes / CHUNK as u64 {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    Ok(())
}
