//! A client keeps at most its window of reads and writes in flight to each storage target, over
//! all of its calls at once; seen from the simulated fabric's record of every message, with the
//! real MDS, storage servers and client in this process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::sim::{Fabric, LinkParams};
use oss::engine::paced::{Pace, PacedEngine};

const WINDOW: usize = 3;

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("lode-windows-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An MDS and two storage servers of one slow target each (1 ms per I/O, so that requests
/// overlap), and a client with a window of `WINDOW`.
async fn cluster(fabric: &Fabric, dir: &std::path::Path) -> (Cluster, Client) {
    fabric
        .set_default_link(LinkParams {
            latency: Duration::from_micros(100),
            ..Default::default()
        })
        .unwrap();
    let mut builder = ClusterBuilder::new(Network::Fabric(fabric.clone()), dir)
        .maintain_every(Duration::from_millis(50));
    for _ in 0..2 {
        let engine: Arc<dyn oss::engine::Engine> = Arc::new(PacedEngine::new(
            Arc::new(oss::engine::mem::MemEngine::new(1 << 30)),
            Pace {
                read_bps: 1 << 30,
                write_bps: 1 << 30,
                io_latency: Duration::from_millis(1),
                queue_depth: 0,
            },
        ));
        builder = builder.storage_server(vec![engine]);
    }
    let cluster = builder.start().await.unwrap();
    let cfg = ClientConfig {
        window: WINDOW,
        ..Default::default()
    };
    let c = cluster.client("client", cfg).await.unwrap();
    cluster
        .wait_ready(&c, 2, Duration::from_secs(15))
        .await
        .unwrap();
    (cluster, c)
}

/// The most requests from the client that each storage server had unanswered at once.
fn most_in_flight(fabric: &Fabric) -> HashMap<String, usize> {
    let mut now = HashMap::<String, usize>::new();
    let mut most = HashMap::<String, usize>::new();
    for e in fabric.trace() {
        if e.from == "client" && e.to.starts_with("oss") && e.kind == "request" {
            let n = now.entry(e.to.clone()).or_default();
            *n += 1;
            let m = most.entry(e.to.clone()).or_default();
            *m = (*m).max(*n);
        } else if e.to == "client" && e.from.starts_with("oss") && e.kind == "reply" {
            *now.entry(e.from.clone()).or_default() -= 1;
        }
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_keeps_at_most_its_window_in_flight_to_each_target() {
    let dir = scratch();
    let fabric = Fabric::new(7);
    let (servers, c) = cluster(&fabric, &dir).await;
    let f = Arc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .stripe_count(2)
            .stripe_size(64 << 10)
            .open(&c, "/striped")
            .await
            .unwrap(),
    );
    // Four calls at once, each of 16 pieces over both targets: 32 pieces per target, at most
    // WINDOW of them on the wire at a time.
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut calls = tokio::task::JoinSet::new();
    for k in 0..4u64 {
        let (f, part) = (
            f.clone(),
            data[(k << 20) as usize..((k + 1) << 20) as usize].to_vec(),
        );
        calls.spawn(async move { f.write_at(k << 20, &part).await });
    }
    while let Some(r) = calls.join_next().await {
        r.unwrap().unwrap();
    }
    let writes = most_in_flight(&fabric);
    let mut back = vec![0u8; data.len()];
    let mut reads = tokio::task::JoinSet::new();
    for k in 0..4u64 {
        let f = f.clone();
        reads.spawn(async move {
            let mut part = vec![0u8; 1 << 20];
            f.read_at(k << 20, &mut part).await.map(|n| (k, n, part))
        });
    }
    while let Some(r) = reads.join_next().await {
        let (k, n, part) = r.unwrap().unwrap();
        assert_eq!(n, 1 << 20);
        back[(k << 20) as usize..((k + 1) << 20) as usize].copy_from_slice(&part);
    }
    assert!(back == data, "the file reads back as written");
    let all = most_in_flight(&fabric);
    for oss in ["oss0", "oss1"] {
        let (w, a) = (writes[oss], all[oss]);
        assert!(
            w <= WINDOW && a <= WINDOW,
            "{oss} had {w} writes and {a} requests in flight, past the window of {WINDOW}"
        );
        // The window is used, not only respected: the calls overlap up to it.
        assert_eq!(w, WINDOW, "{oss}: writes in flight");
    }
    servers.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
