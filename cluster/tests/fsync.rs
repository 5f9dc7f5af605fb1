//! fsync is honest: it syncs every write the client made to the file, retries what failed,
//! and never reports success for writes a storage server lost.

use std::sync::Arc;
use std::time::Duration;

use client::{ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::sim::Fabric;
use oss::engine::mem::{MemEngine, Op};
use proto::FsErrorKind;

async fn one_server(name: &str) -> (Cluster, Arc<MemEngine>, client::Client) {
    let dir = std::env::temp_dir().join(format!("lode-fsync-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let engine = Arc::new(MemEngine::new(1 << 30));
    let cluster = ClusterBuilder::new(Network::Fabric(Fabric::new(7)), &dir)
        .storage_server(vec![engine.clone()])
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .start()
        .await
        .unwrap();
    let cfg = ClientConfig {
        creds: proto::md::Creds::root(),
        attempt: Duration::from_millis(500),
        ..ClientConfig::default()
    };
    let c = cluster.client("client", cfg).await.unwrap();
    cluster
        .wait_ready(&c, 1, Duration::from_secs(10))
        .await
        .unwrap();
    (cluster, engine, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_after_a_storage_server_lost_power_is_an_error_not_success() {
    let (mut cluster, engine, c) = one_server("power").await;
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .open(&c, "/ckpt")
        .await
        .unwrap();
    f.write_at(0, &[7u8; 100_000]).await.unwrap();
    // The server's machine loses power before the writes are synced, and comes back.
    cluster.kill_oss(0);
    engine.crash();
    cluster.start_oss(0).await.unwrap();
    let err = f
        .fsync()
        .await
        .expect_err("fsync said the lost writes were durable");
    assert!(err.is(FsErrorKind::Io), "{err}");
    assert!(f.fsync().await.is_err(), "and says so again");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_fails_again_until_the_writes_are_made_again_and_covers_every_handle() {
    let (mut cluster, engine, c) = one_server("retry").await;
    let opts = OpenOptions::new().write(true).create(true);
    let a = opts.open(&c, "/ckpt").await.unwrap();
    let b = opts.open(&c, "/ckpt").await.unwrap();
    a.write_at(0, &[1u8; 50_000]).await.unwrap();
    b.write_at(50_000, &[2u8; 50_000]).await.unwrap();
    b.close().await.unwrap();
    engine.fail_next(Op::Sync, libc::EIO);
    assert!(a.fsync().await.is_err(), "the disk failed the sync");
    // A kernel drops the pages of a failed write-back and its next fsync says Ok: the
    // writes are not on the disk, and no retry may say they are.
    assert!(
        a.fsync().await.is_err(),
        "a retry said lost writes were durable"
    );
    a.close().await.unwrap_or(());
    // Written again, from a new open: durable, both handles' bytes.
    let a = opts.open(&c, "/ckpt").await.unwrap();
    a.write_at(0, &[1u8; 50_000]).await.unwrap();
    a.write_at(50_000, &[2u8; 50_000]).await.unwrap();
    a.fsync().await.expect("the rewrite syncs");
    // Power loss now: everything the second fsync acknowledged is there, from both handles.
    cluster.kill_oss(0);
    engine.crash();
    cluster.start_oss(0).await.unwrap();
    let mut back = vec![0u8; 100_000];
    let r = OpenOptions::new()
        .read(true)
        .open(&c, "/ckpt")
        .await
        .unwrap();
    let mut at = 0;
    while at < back.len() {
        let n = r.read_at(at as u64, &mut back[at..]).await.unwrap();
        assert!(n > 0, "short file");
        at += n;
    }
    assert!(back[..50_000].iter().all(|b| *b == 1));
    assert!(back[50_000..].iter().all(|b| *b == 2));
    cluster.stop().await;
}
