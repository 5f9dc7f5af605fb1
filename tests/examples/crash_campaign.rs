//! A crash campaign on real processes: an MDS and two storage servers on loopback, a writer
//! saving checkpoints the way training jobs do (write a temporary file striped over both
//! targets, fsync, close, rename over the checkpoint's name), and `kill -9` of a random server
//! at a random moment every round, which is then restarted. After every round the checkpoint
//! must hold one whole version, no older than the last acknowledged rename, byte for byte
//! (never zeros), and the writer must make progress again.
//!
//! `cargo run --release -p lode-tests --example crash_campaign -- [ROUNDS] [SEED]`
//! (defaults 100 and 1), after building the servers (`cargo build --release`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use lode_tests::{scratch, Server};

const MDS: &str = "127.0.0.1:19470";
const OSS: [&str; 2] = ["127.0.0.1:19471", "127.0.0.1:19472"];

/// The bytes of checkpoint version `v`: its number, then bytes only it has.
fn version(v: u64) -> Vec<u8> {
    let len = (1 << 20) + (v.wrapping_mul(7919) % (3 << 20)) as usize;
    let mut x = v.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&v.to_le_bytes());
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

async fn save(c: &Client, v: u64) -> client::Result<()> {
    let data = version(v);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(c, "/ckpt.tmp")
        .await?;
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        f.write_at((i << 20) as u64, piece).await?;
    }
    f.fsync().await?;
    f.close().await?;
    c.rename("/ckpt.tmp", "/ckpt").await
}

async fn read_all(c: &Client, path: &str) -> Result<Vec<u8>, String> {
    let f = OpenOptions::new()
        .read(true)
        .open(c, path)
        .await
        .map_err(|e| format!("opening {path}: {e}"))?;
    let size = f.size().await.map_err(|e| e.to_string())? as usize;
    let mut buf = vec![0u8; size];
    let mut at = 0;
    while at < size {
        let n = f
            .read_at(at as u64, &mut buf[at..])
            .await
            .map_err(|e| format!("reading {path} at {at}: {e}"))?;
        if n == 0 {
            break;
        }
        at += n;
    }
    buf.truncate(at);
    let _ = f.close().await;
    Ok(buf)
}

fn start_mds(root: &std::path::Path) -> Server {
    let dir = root.join("mds");
    Server::start(
        "lode-mds",
        &["--data-dir", dir.to_str().unwrap(), "--listen", MDS],
    )
    .expect("starting the MDS")
}

fn start_oss(root: &std::path::Path, i: usize) -> Server {
    let dir = root.join(format!("oss{i}"));
    Server::start(
        "lode-oss",
        &[
            "--data-dir",
            dir.to_str().unwrap(),
            "--mds",
            MDS,
            "--listen",
            OSS[i],
            "--targets",
            "1",
        ],
    )
    .expect("starting a storage server")
}

#[tokio::main]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: ROUNDS SEED"))
        .collect();
    let rounds = args.first().copied().unwrap_or(100);
    let mut seed = args.get(1).copied().unwrap_or(1) | 1;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let root = scratch("crash-campaign");
    let mut servers = vec![start_mds(&root), start_oss(&root, 0), start_oss(&root, 1)];
    let cfg = ClientConfig {
        creds: proto::md::Creds::root(),
        security: Some(lode_tests::client_security()),
        ..ClientConfig::default()
    };
    let c = Client::connect_with(MDS, cfg).await.expect("connecting");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !c.can_stripe_over(2).await.unwrap_or(false) {
        assert!(
            Instant::now() < deadline,
            "the targets never came into service"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.setstripe("/", client::raid0(Some(2), 1 << 20).unwrap())
        .await
        .expect("striping the root");

    let acked = Arc::new(AtomicU64::new(0));
    let tried = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let writer = {
        let (c, acked, tried, stop, errors) = (
            c.clone(),
            acked.clone(),
            tried.clone(),
            stop.clone(),
            errors.clone(),
        );
        tokio::spawn(async move {
            let mut v = 0;
            while !stop.load(Ordering::SeqCst) {
                v += 1;
                tried.store(v, Ordering::SeqCst);
                match save(&c, v).await {
                    Ok(()) => acked.store(v, Ordering::SeqCst),
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("checkpoint {v} failed: {e}");
                    }
                }
            }
        })
    };
    let started = Instant::now();
    let mut kills = [0u64; 3];
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(20 + rand(500))).await;
        let victim = rand(3) as usize;
        kills[victim] += 1;
        servers.remove(victim).kill();
        tokio::time::sleep(Duration::from_millis(rand(300))).await;
        let restarted = if victim == 0 {
            start_mds(&root)
        } else {
            start_oss(&root, victim - 1)
        };
        servers.insert(victim, restarted);
        // Progress: a checkpoint started after the restart is acknowledged.
        let from = tried.load(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(120);
        while acked.load(Ordering::SeqCst) <= from {
            if Instant::now() > deadline {
                eprintln!("round {round}: no checkpoint acknowledged for 120 s after a restart");
                std::process::exit(1);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The checkpoint holds one whole version, none older than the last acknowledged.
        let floor = acked.load(Ordering::SeqCst);
        let got = match read_all(&c, "/ckpt").await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("round {round}: {e}");
                std::process::exit(1);
            }
        };
        let v = got
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(0);
        if v < floor || got != version(v) {
            let zeros = got.iter().filter(|&&b| b == 0).count();
            eprintln!(
                "round {round}: /ckpt holds {} bytes naming version {v} (acknowledged up to {floor}), {zeros} zero bytes, not that version whole",
                got.len()
            );
            std::process::exit(1);
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = writer.await;
    println!(
        "{rounds} rounds in {:.0?}: kill -9 of the MDS {} times, of storage servers {} times; {} checkpoints acknowledged, {} failed; every round's checkpoint whole",
        started.elapsed(),
        kills[0],
        kills[1] + kills[2],
        acked.load(Ordering::SeqCst),
        errors.load(Ordering::Relaxed)
    );
    for s in servers {
        s.terminate();
    }
    let _ = std::fs::remove_dir_all(&root);
}
