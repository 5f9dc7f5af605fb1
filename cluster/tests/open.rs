//! Open files survive an MDS restart: a file whose last name goes while a client holds it open
//! stays readable, also when the MDS restarts in between (the client counts its open files
//! again), and a client that falls silent is evicted, after which its reads fail instead of
//! returning zeros.

use std::sync::Arc;
use std::time::Duration;

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::sim::Fabric;
use oss::engine::mem::MemEngine;

const SIZE: usize = 300_000;

async fn cluster(name: &str, window: Duration, evict: Duration) -> Cluster {
    let dir = std::env::temp_dir().join(format!("lode-open-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    ClusterBuilder::new(Network::Fabric(Fabric::new(11)), &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50))
        .open_recovery(window, evict)
        .start()
        .await
        .unwrap()
}

async fn client(cluster: &Cluster, name: &str, ping: Duration) -> Client {
    let cfg = ClientConfig {
        creds: proto::md::Creds::root(),
        attempt: Duration::from_millis(500),
        ping_every: ping,
        ..ClientConfig::default()
    };
    let c = cluster.client(name, cfg).await.unwrap();
    cluster
        .wait_ready(&c, 1, Duration::from_secs(10))
        .await
        .unwrap();
    c
}

/// Writes `data` to `path` through a temporary name renamed over it (a checkpoint).
async fn checkpoint(c: &Client, path: &str, data: &[u8]) {
    let tmp = format!("{path}.tmp");
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(c, &tmp)
        .await
        .unwrap();
    f.write_at(0, data).await.unwrap();
    f.fsync().await.unwrap();
    f.close().await.unwrap();
    c.rename(&tmp, path).await.unwrap();
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..SIZE)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_held_open_survives_its_replacement_and_an_mds_restart() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let window = Duration::from_secs(2);
    let mut cluster = cluster("restart", window, Duration::from_secs(60)).await;
    let writer = client(&cluster, "writer", Duration::from_millis(100)).await;
    let reader = client(&cluster, "reader", Duration::from_millis(100)).await;
    checkpoint(&writer, "/ckpt", &pattern(1)).await;
    let old = OpenOptions::new()
        .read(true)
        .open(&reader, "/ckpt")
        .await
        .unwrap();
    // A new checkpoint takes the name: the old file is kept for the reader.
    checkpoint(&writer, "/ckpt", &pattern(2)).await;
    cluster.kill_mds().await;
    cluster.start_mds().await.unwrap();
    // The recovery window passes, the target is back in service (its orphans cleaned up),
    // and several maintenance passes go by.
    tokio::time::sleep(window).await;
    cluster
        .wait_ready(&writer, 1, Duration::from_secs(60))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut back = vec![0u8; SIZE];
    let n = old.read_at(0, &mut back).await.unwrap();
    assert_eq!(n, SIZE);
    assert!(
        back == pattern(1),
        "the old checkpoint changed under its reader"
    );
    old.close().await.unwrap();
    let mut now = vec![0u8; SIZE];
    let f = OpenOptions::new()
        .read(true)
        .open(&reader, "/ckpt")
        .await
        .unwrap();
    assert_eq!(f.read_at(0, &mut now).await.unwrap(), SIZE);
    assert!(now == pattern(2));
    f.close().await.unwrap();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_evicted_and_then_reads_fail_instead_of_returning_zeros() {
    let evict = Duration::from_secs(1);
    let cluster = cluster("evict", Duration::ZERO, evict).await;
    let writer = client(&cluster, "writer", Duration::from_millis(100)).await;
    // This client never pings: to the MDS it is silent.
    let silent = client(&cluster, "silent", Duration::from_secs(3600)).await;
    checkpoint(&writer, "/ckpt", &pattern(1)).await;
    let old = OpenOptions::new()
        .read(true)
        .open(&silent, "/ckpt")
        .await
        .unwrap();
    // A client that pings keeps its file through the same wait.
    let kept = OpenOptions::new()
        .read(true)
        .open(&writer, "/ckpt")
        .await
        .unwrap();
    writer.unlink("/ckpt").await.unwrap();
    tokio::time::sleep(evict * 3).await;
    let mut back = vec![0u8; SIZE];
    assert_eq!(kept.read_at(0, &mut back).await.unwrap(), SIZE);
    assert!(
        back == pattern(1),
        "a pinging client's open file was destroyed"
    );
    kept.close().await.unwrap();
    // Once the last handle the MDS counts is gone, the objects go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut gone = vec![0u8; SIZE];
    match old.read_at(0, &mut gone).await {
        Err(_) => {}
        Ok(n) => panic!(
            "the evicted client read {n} bytes of a destroyed file ({} zeros)",
            gone[..n].iter().filter(|&&b| b == 0).count()
        ),
    }
    cluster.stop().await;
}

/// A writer whose handle is dropped without `close` (its process died) publishes its size in
/// the background. That publication, held up (here, by a partition from the MDS) until after
/// another writer truncated and rewrote the file, must not grow the file back: the rewritten
/// checkpoint would get a tail that is not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_size_publication_does_not_undo_a_later_truncate() {
    let fabric = Fabric::new(13);
    let dir = std::env::temp_dir().join(format!("lode-open-late-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let dead = client(&cluster, "dead", Duration::from_millis(100)).await;
    let alive = client(&cluster, "alive", Duration::from_millis(100)).await;
    let opts = OpenOptions::new().write(true).create(true).truncate(true);
    let f = opts.open(&dead, "/ckpt.tmp").await.unwrap();
    f.write_at(0, &pattern(1)).await.unwrap();
    fabric.partition("dead", "mds");
    drop(f);
    let g = opts.open(&alive, "/ckpt.tmp").await.unwrap();
    let mine = &pattern(2)[..36_296];
    g.write_at(0, mine).await.unwrap();
    g.fsync().await.unwrap();
    g.close().await.unwrap();
    alive.rename("/ckpt.tmp", "/ckpt").await.unwrap();
    fabric.heal();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let size = alive.stat("/ckpt").await.unwrap().size;
    assert_eq!(
        size,
        mine.len() as u64,
        "the checkpoint grew a tail that is not its own"
    );
    cluster.stop().await;
}
