//! Floods of a hostile client holding the client key, against a real `lode-mds` process: what
//! each costs the MDS in memory (its resident set, and the tables' own counts against their
//! bounds), and an honest client's getattr latency during each, against the same getattr with
//! the MDS idle, in the same run.
//!
//! - **replies**: changes sent in batches of 512 from 64 client ids on each of 8 connections,
//!   never saying which replies came back (the reply cache keeps every one, up to its bound);
//! - **opens**: opens of one file under new handles from 64 ids on each of 8 connections (the
//!   table of open files, up to its bounds per client and in all);
//! - **waits**: lease waits held open, two per id from 64 ids on each of 8 connections (more
//!   than the MDS's request slots).
//!
//! `cargo build --release && cargo run --release -p lode-tests --example flood -- [SECONDS]`
//! (each flood lasts SECONDS, 30 by default).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lnet::call;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lode_tests::{scratch, Server};
use proto::md::*;
use proto::{Fid, Nid};

const T: Duration = Duration::from_secs(30);
const CONNS: usize = 8;
const IDS: u128 = 64;

fn me() -> Creds {
    Creds {
        uid: 2000,
        gid: 2000,
        groups: vec![],
    }
}

fn endpoint() -> Arc<TcpEndpoint> {
    Arc::new(TcpEndpoint::client(TcpConfig {
        security: lode_tests::client_security(),
        conns_per_peer: 1,
        ..TcpConfig::default()
    }))
}

/// The MDS's resident set, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The median and 99th percentile of `n` getattrs from an honest client: a process of its
/// own, as far as this one goes (its own thread and runtime, not the flood's).
async fn getattr_latency(mds: &Nid, fid: Fid, n: usize) -> (Duration, Duration) {
    let mds = mds.clone();
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let ep = endpoint();
                // Connected first: the handshake is not a getattr.
                let _ = measure(&ep, &mds, fid, 3).await;
                measure(&ep, &mds, fid, n).await
            })
    })
    .await
    .unwrap()
}

async fn measure(ep: &TcpEndpoint, mds: &Nid, fid: Fid, n: usize) -> (Duration, Duration) {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = MdsGetattr {
            fid,
            creds: me(),
            lease: None,
        };
        // A Busy answer is retried, as the library does: the time is the caller's.
        loop {
            match call(ep, mds, &r, T).await {
                Ok(_) => break,
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => panic!("getattr: {e}"),
            }
        }
        v.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    v.sort();
    (v[n / 2], v[n * 99 / 100])
}

fn create(parent: Fid, name: &str, id: u128, seq: u64) -> MdsReint {
    MdsReint {
        creds: me(),
        mutation: Mutation::Create {
            parent,
            name: name.as_bytes().to_vec(),
            kind: Kind::File,
            mode: 0o644,
            exclusive: false,
            target: vec![],
            layout: None,
        },
        req: Some(ReqId { client: id, seq }),
        acked: 0,
        open: None,
        size_gen: None,
        behind: false,
        lease: false,
        time: None,
    }
}

struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    async fn end(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        self.sent.load(Ordering::Relaxed)
    }
}

/// Starts `per_id` tasks for every id of every connection, each running `f(endpoint, id)`
/// until told to stop; `f` returns how many requests it made.
fn flood<F, Fut>(ids: &[(Arc<TcpEndpoint>, u128)], per_id: usize, f: F) -> Flood
where
    F: Fn(Arc<TcpEndpoint>, u128, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = u64> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = vec![];
    for (ep, id) in ids {
        for _ in 0..per_id {
            let fut = f(ep.clone(), *id, stop.clone());
            let sent = sent.clone();
            tasks.push(tokio::spawn(async move {
                let n = fut.await;
                sent.fetch_add(n, Ordering::Relaxed);
            }));
        }
    }
    Flood { stop, sent, tasks }
}

/// Lets flood `f` run for `secs`, measures an honest getattr during it, ends it, and prints
/// its row: requests made, getattr median and p99, their ratio to `idle`, the MDS's memory.
#[allow(clippy::too_many_arguments)]
async fn report(
    name: &str,
    f: Flood,
    secs: u64,
    mds: &Nid,
    file: Fid,
    pid: u32,
    idle: (Duration, Duration),
    what: &str,
) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let during = getattr_latency(mds, file, 200).await;
    let rss = rss_mib(pid);
    let sent = f.end().await;
    println!(
        "{name:9} {sent:>8}  {:>14?}  {:>9?}  {:>5.2}  {rss:>7.0}  {what}",
        during.0,
        during.1,
        during.0.as_secs_f64() / idle.0.as_secs_f64(),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let root = scratch("flood");
    let mds = Server::start(
        "lode-mds",
        &[
            "--data-dir",
            root.join("mds").to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            // Nothing trusted: this machine's clients are ordinary client nodes.
            "--trust",
            "10.255.255.1/32",
        ],
    )
    .expect("lode-mds (cargo build --release first)");
    let pid = mds.child.id();
    let nid = mds.nid.clone();
    let honest = endpoint();
    let admin = TcpEndpoint::client(TcpConfig {
        security: lode_tests::server_security(),
        ..TcpConfig::default()
    });
    let setup = call(
        &admin,
        &nid,
        &MdsReint {
            creds: Creds::root(),
            mutation: Mutation::Create {
                parent: proto::fid::ROOT,
                name: b"shared".to_vec(),
                kind: Kind::Dir,
                mode: 0o777,
                exclusive: false,
                target: vec![],
                layout: None,
            },
            ..create(proto::fid::ROOT, "", 1, 1)
        },
        T,
    )
    .await;
    let shared = match setup {
        Ok(r) => r.inode.unwrap().fid,
        Err(e) => panic!("mkdir /shared: {e}"),
    };
    let file = call(&*honest, &nid, &create(shared, "target", 2, 1), T)
        .await
        .unwrap()
        .inode
        .unwrap()
        .fid;
    // The attacker's ids: 64 on each of its connections, each joined.
    let mut ids = vec![];
    for c in 0..CONNS {
        let ep = endpoint();
        for i in 0..IDS {
            let id = (c as u128 + 1) << 64 | i | 1 << 120;
            call(&*ep, &nid, &MdsConnect { client: id }, T)
                .await
                .unwrap();
            ids.push((ep.clone(), id));
        }
    }
    let idle = getattr_latency(&nid, file, 200).await;
    let rss_idle = rss_mib(pid);
    println!(
        "idle: getattr median {:?}, p99 {:?}; MDS resident {rss_idle:.0} MiB",
        idle.0, idle.1
    );
    println!("flood     requests  getattr median  p99        ratio  MDS MiB  what grew");

    // Replies never acknowledged, in batches.
    let seq = Arc::new(AtomicU64::new(10));
    let (nid2, seq2) = (nid.clone(), seq.clone());
    let f = flood(&ids, 1, move |ep, id, stop| {
        let (nid, seq) = (nid2.clone(), seq2.clone());
        async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let first = seq.fetch_add(512, Ordering::Relaxed);
                let ops = (0..512)
                    .map(|k| {
                        BatchOp::Reint(MdsReint {
                            creds: me(),
                            mutation: Mutation::Setattr {
                                fid: file,
                                attr: SetAttr {
                                    times_now: true,
                                    ..SetAttr::default()
                                },
                            },
                            req: Some(ReqId {
                                client: id,
                                seq: first + k,
                            }),
                            acked: 0,
                            open: None,
                            size_gen: None,
                            behind: false,
                            lease: false,
                            time: None,
                        })
                    })
                    .collect();
                if call(&*ep, &nid, &MdsBatch { ops }, T).await.is_ok() {
                    n += 512;
                }
            }
            n
        }
    });
    let bound = format!(
        "reply cache (bound {} replies)",
        mds::namespace::MAX_REPLIES
    );
    report("replies", f, secs, &nid, file, pid, idle, &bound).await;

    // Opens under new handles.
    let nid2 = nid.clone();
    let f = flood(&ids, 1, move |ep, id, stop| {
        let nid = nid2.clone();
        async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = MdsOpen {
                    fid: file,
                    handle: OpenHandle {
                        client: id,
                        handle: n,
                    },
                    creds: me(),
                    path: None,
                    lease: None,
                };
                match call(&*ep, &nid, &r, T).await {
                    Ok(_) => n += 1,
                    // At its bound: the client holds as many as it may.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            n
        }
    });
    let bound = format!(
        "open handles (bounds {} per client, {} per node, {} in all)",
        mds::open::MAX_HANDLES_PER_CLIENT,
        mds::open::MAX_HANDLES_PER_NODE,
        mds::open::MAX_OPEN_HANDLES,
    );
    report("opens", f, secs, &nid, file, pid, idle, &bound).await;

    // Lease waits held open.
    let nid2 = nid.clone();
    let f = flood(&ids, 2, move |ep, id, stop| {
        let nid = nid2.clone();
        async move {
            let (mut epoch, mut nr, mut n) = (0, 0, 0);
            while !stop.load(Ordering::Relaxed) {
                nr += 1;
                let w = MdsLeaseWait {
                    client: id,
                    acked: 0,
                    epoch,
                    nr,
                    cancel: vec![],
                };
                match call(&*ep, &nid, &w, T).await {
                    Ok(r) => {
                        epoch = r.epoch;
                        n += 1;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            n
        }
    });
    let bound = format!(
        "lease waits held ({} per client, in {} slots of their own)",
        mds::lease::WAITS_HELD_PER_CLIENT,
        lnet::service::LONG_POLL_SLOTS,
    );
    report("waits", f, secs.min(10), &nid, file, pid, idle, &bound).await;
    drop(mds);
    let _ = std::fs::remove_dir_all(&root);
}
