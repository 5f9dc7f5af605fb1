//! MDS recovery when the MDS's disk is full: a replay its journal cannot take is neither
//! applied nor lost.

use std::sync::Arc;
use std::time::Duration;

use client::ClientConfig;
use cluster::{ClusterBuilder, Network};
use lnet::sim::Fabric;
use mds::disk::MemDisk;
use oss::engine::mem::MemEngine;

/// The MDS dies with a client's change uncommitted, and comes back on a full disk: the
/// client's replay cannot be journaled, so the client keeps it; once the operator makes room
/// and restarts the MDS, the change is replayed and there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_the_full_journal_cannot_take_is_kept_for_the_next_run() {
    let dir = std::env::temp_dir().join(format!("lode-recovery-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let disk = Arc::new(MemDisk::new());
    let mut cluster = ClusterBuilder::new(Network::Fabric(Fabric::new(17)), &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .mds_disk(disk.clone())
        .deferred_commit()
        .open_recovery(Duration::from_secs(5), Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let cfg = ClientConfig {
        creds: proto::md::Creds::root(),
        attempt: Duration::from_millis(300),
        ping_every: Duration::from_millis(100),
        ..ClientConfig::default()
    };
    let c = cluster.client("client", cfg).await.unwrap();
    cluster
        .wait_ready(&c, 1, Duration::from_secs(10))
        .await
        .unwrap();
    c.sync().await.unwrap();
    c.mkdir("/kept", 0o755).await.unwrap();
    assert!(c.uncommitted() > 0, "answered before it commits");

    // The MDS dies before committing it, and restarts on a full disk.
    cluster.kill_mds().await;
    cluster.start_mds().await.unwrap();
    disk.set_capacity(Some(disk.used()));
    // The client's recovery replays the mkdir; the journal cannot take it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        c.uncommitted() > 0,
        "a replay the journal could not take was dropped"
    );

    // Room again, and the MDS restarted: the change is replayed.
    disk.set_capacity(None);
    cluster.kill_mds().await;
    cluster.start_mds().await.unwrap();
    let start = tokio::time::Instant::now();
    loop {
        match c.stat("/kept").await {
            Ok(st) => {
                assert_eq!(st.kind, proto::md::Kind::Dir);
                break;
            }
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(20),
                "the kept change never came back: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.sync().await.unwrap();
    assert_eq!(c.uncommitted(), 0);
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
