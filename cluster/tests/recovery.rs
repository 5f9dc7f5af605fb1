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

/// The MDS restarts while a client holding an acknowledged, uncommitted change is cut off; its
/// recovery ends without the client, which is evicted and its change lost. The loss is never
/// silent: the client's next `sync`, and the next `fsync` and close of a file it held open,
/// fail with EIO (an MDS run's committed number once passed over the old run's change, and
/// every call said Ok).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_evicted_across_a_restart_is_told_its_acknowledged_changes_are_lost() {
    let dir = std::env::temp_dir().join(format!("lode-recovery-evict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fabric = Fabric::new(18);
    let mut cluster = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .mds_disk(Arc::new(MemDisk::new()))
        .deferred_commit()
        .open_recovery(Duration::from_secs(1), Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let cfg = ClientConfig {
        creds: proto::md::Creds::root(),
        attempt: Duration::from_millis(300),
        retry_for: Duration::from_secs(30),
        ping_every: Duration::from_millis(200),
        ..ClientConfig::default()
    };
    let a = cluster.client("a", cfg.clone()).await.unwrap();
    cluster
        .wait_ready(&a, 1, Duration::from_secs(10))
        .await
        .unwrap();
    let f = client::OpenOptions::new()
        .write(true)
        .create(true)
        .open(&a, "/held")
        .await
        .unwrap();
    f.write_at(0, b"data").await.unwrap();
    f.fsync().await.unwrap();
    a.mkdir("/lost", 0o755).await.unwrap();
    assert!(a.uncommitted() > 0, "answered before it commits");

    // Cut off while the MDS restarts and recovers without it.
    fabric.partition("a", "mds");
    cluster.kill_mds().await;
    cluster.start_mds().await.unwrap();
    // The recovery window (the lease term at least) passes; another client's changes move
    // the new run's committed number past the lost change's.
    tokio::time::sleep(mds::lease::TERM + Duration::from_secs(2)).await;
    let b = cluster.client("b", cfg).await.unwrap();
    for i in 0..8 {
        b.mkdir(&format!("/other{i}"), 0o755).await.unwrap();
    }
    b.sync().await.unwrap();
    fabric.heal();

    let err = a.sync().await.unwrap_err();
    assert_eq!(err.kind(), proto::FsErrorKind::Io, "{err}");
    assert!(err.to_string().contains("acknowledged"), "{err}");
    assert!(a.stat("/lost").await.is_err(), "the change was lost");
    // Reported once to each who asks: the client's next sync is clean, the held file's
    // fsync and close each report it.
    a.sync().await.unwrap();
    assert!(
        f.fsync().await.is_err(),
        "a file held open at the eviction synced clean"
    );
    f.fsync().await.unwrap();
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
