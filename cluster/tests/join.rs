//! Storage servers join a cluster the way they do in production, on the simulated fabric:
//! they register unindexed targets, the MDS assigns the indices, heartbeats keep them up, and
//! a server that goes silent is marked down and gets no new stripes until it is heard again.

use std::sync::Arc;
use std::time::Duration;

use client::{ClientConfig, OpenOptions};
use cluster::{ClusterBuilder, Network};
use lnet::sim::Fabric;
use oss::engine::mem::MemEngine;
use oss::engine::Engine;

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lode-cluster-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn memory() -> Arc<dyn Engine> {
    Arc::new(MemEngine::new(1 << 30))
}

/// Targets of the registry that are up, by index.
fn up(c: &cluster::Cluster) -> Vec<u32> {
    let list = c.mds().registry().list();
    list.iter().filter(|t| t.up).map(|t| t.index).collect()
}

/// The targets a new file made with `-c -1` at `path` gets, in stripe order.
async fn striped_over(c: &client::Client, path: &str) -> Vec<u32> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .stripe_all()
        .open(c, path)
        .await
        .unwrap();
    let on = f.inode().layout.unwrap().components[0]
        .objects
        .iter()
        .map(|o| o.target)
        .collect();
    f.close().await.unwrap();
    on
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_joins_goes_silent_is_marked_down_and_comes_back() {
    let dir = scratch("join");
    let fabric = Fabric::new(11);
    let cluster = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .heartbeat(Duration::from_millis(100), Duration::from_millis(800))
        .maintain_every(Duration::from_millis(50))
        .storage_server(vec![memory(), memory()])
        .storage_server(vec![memory()])
        .start()
        .await
        .unwrap();
    // Indices come from the MDS, in registration order.
    assert_eq!(cluster.oss(0).unwrap().indices(), vec![0, 1]);
    assert_eq!(cluster.oss(1).unwrap().indices(), vec![2]);
    let c = cluster
        .client("client", ClientConfig::default())
        .await
        .unwrap();
    cluster
        .wait_ready(&c, 3, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(up(&cluster), vec![0, 1, 2]);

    // The second server falls off the network: its heartbeats stop reaching the MDS, and
    // the MDS's probes of silent targets get no answer.
    fabric.partition("oss1-mgmt", "mds");
    fabric.partition("oss1", "mds-alloc");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(up(&cluster), vec![0, 1], "a silent target is down");
    assert_eq!(c.statfs().await.unwrap().targets_up, 2);
    let on = striped_over(&c, "/while-down").await;
    assert!(!on.contains(&2), "no new stripe on a down target: {on:?}");

    // Heard again: up again, and new files stripe over it.
    fabric.heal();
    cluster
        .wait_ready(&c, 3, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(up(&cluster), vec![0, 1, 2]);
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A target heard from but whose orphans the MDS could not clean up yet is up, yet takes
/// no new stripes, and the target list says so: `lode health` and the readiness checks rest
/// on it, so a file made with `-c -1` once they pass is striped over every target. Once the
/// server can be reached, the cleanup sent again takes it into service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_up_before_its_cleanup_is_listed_as_taking_no_stripes() {
    let dir = scratch("cleanup");
    let fabric = Fabric::new(12);
    // The MDS's allocator cannot reach the second server; its heartbeats still arrive.
    fabric.partition("oss1", "mds-alloc");
    let cluster = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .heartbeat(Duration::from_millis(100), Duration::from_secs(5))
        .maintain_every(Duration::from_millis(50))
        .storage_server(vec![memory()])
        .storage_server(vec![memory()])
        .start()
        .await
        .unwrap();
    let c = cluster
        .client("client", ClientConfig::default())
        .await
        .unwrap();
    cluster
        .wait_ready(&c, 1, Duration::from_secs(10))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let list = loop {
        let list = c.targets().await.unwrap();
        if list.iter().all(|t| t.up) || tokio::time::Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Several maintenance passes go by; the cleanup keeps failing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taking = |l: &[proto::registry::TargetInfo]| {
        l.iter()
            .filter(|t| t.takes_stripes)
            .map(|t| t.index)
            .collect::<Vec<_>>()
    };
    assert!(list.iter().all(|t| t.up), "both targets heard: {list:?}");
    assert_eq!(taking(&c.targets().await.unwrap()), vec![0]);
    assert!(!c.can_stripe_over(2).await.unwrap());
    assert_eq!(
        striped_over(&c, "/before-cleanup").await,
        vec![0],
        "no stripe on a target not cleaned up"
    );

    fabric.heal();
    cluster
        .wait_ready(&c, 2, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(taking(&c.targets().await.unwrap()), vec![0, 1]);
    assert_eq!(striped_over(&c, "/after-cleanup").await.len(), 2);

    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_cluster_runs_on_loopback_tcp() {
    let dir = scratch("tcp");
    let cluster = ClusterBuilder::new(Network::Loopback, &dir)
        .heartbeat(Duration::from_millis(200), Duration::from_secs(5))
        .storage_server(vec![memory(), memory()])
        .start()
        .await
        .unwrap();
    let c = cluster
        .client("client", ClientConfig::default())
        .await
        .unwrap();
    cluster
        .wait_ready(&c, 2, Duration::from_secs(10))
        .await
        .unwrap();
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 253) as u8).collect();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .stripe_all()
        .stripe_size(1 << 20)
        .open(&c, "/over-tcp")
        .await
        .unwrap();
    f.write_at(0, &data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(f.read_at(0, &mut back).await.unwrap(), data.len());
    assert!(back == data);
    f.close().await.unwrap();
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
