//! Every engine behaves the same for what the targets use; the crash engine also crashes.

use std::path::Path;
use std::sync::Arc;

use oss::engine::mem::{MemEngine, Op};
use oss::engine::psync::Psync;
use oss::engine::uring::Uring;
use oss::engine::{AlignedBuf, Engine, EngineConfig, OpenMode};

fn block(fill: u8, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    b.fill(fill);
    b
}

async fn conformance(e: Arc<dyn Engine>, dir: &Path) {
    e.create_dir_all(dir).unwrap();
    let path = dir.join("obj");
    let f = e.open(&path, OpenMode::CreateNew, true).unwrap();
    assert!(e.open(&path, OpenMode::CreateNew, true).is_err());
    let (_, r) = e.write_at(&f, 8192, block(0xaa, 8192)).await;
    assert_eq!(r.unwrap(), 8192);
    e.sync(&f).await.unwrap();
    assert_eq!(e.len(&f).unwrap(), 16384);
    // The hole before the write reads as zeros; a read past the end is short.
    let (b, r) = e.read_at(&f, 0, AlignedBuf::zeroed(4096)).await;
    assert_eq!(r.unwrap(), 4096);
    assert!(b.iter().all(|&x| x == 0));
    let (b, r) = e.read_at(&f, 12288, AlignedBuf::zeroed(8192)).await;
    assert_eq!(r.unwrap(), 4096);
    assert!(b[..4096].iter().all(|&x| x == 0xaa));
    e.punch(&f, 8192, 4096).unwrap();
    let (b, _) = e.read_at(&f, 8192, AlignedBuf::zeroed(8192)).await;
    assert!(b[..4096].iter().all(|&x| x == 0) && b[4096..].iter().all(|&x| x == 0xaa));
    e.set_len(&f, 4096).unwrap();
    assert_eq!(e.len(&f).unwrap(), 4096);
    let space = e.space(dir).unwrap();
    assert!(space.free <= space.total && space.total > 0);
    e.remove(&path).unwrap();
    assert!(e.open(&path, OpenMode::Existing, true).is_err());
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lode-engine-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[tokio::test]
async fn psync_behaves() {
    let d = tmp("psync");
    conformance(Arc::new(Psync::start(EngineConfig::default())), &d).await;
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn io_uring_behaves() {
    let d = tmp("uring");
    conformance(Arc::new(Uring::start(EngineConfig::default()).unwrap()), &d).await;
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn mem_behaves() {
    conformance(Arc::new(MemEngine::new(1 << 30)), Path::new("/t")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_keeps_many_operations_in_flight() {
    let d = tmp("uring-qd");
    let e: Arc<dyn Engine> = Arc::new(
        Uring::start(EngineConfig {
            threads: 2,
            queue_depth: 8,
        })
        .unwrap(),
    );
    e.create_dir_all(&d).unwrap();
    let f = e.open(&d.join("o"), OpenMode::Create, true).unwrap();
    let writes: Vec<_> = (0..64u64)
        .map(|i| e.write_at(&f, i * 4096, block(i as u8, 4096)))
        .collect();
    for w in writes {
        w.await.1.unwrap();
    }
    let reads: Vec<_> = (0..64u64)
        .map(|i| e.read_at(&f, i * 4096, AlignedBuf::zeroed(4096)))
        .collect();
    for (i, r) in reads.into_iter().enumerate() {
        let (b, n) = r.await;
        assert_eq!(n.unwrap(), 4096);
        assert!(b.iter().all(|&x| x == i as u8));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn a_crash_loses_what_was_not_synced() {
    let e = MemEngine::new(1 << 20);
    e.create_dir_all(Path::new("/t")).unwrap();
    let a = e.open(Path::new("/t/a"), OpenMode::Create, true).unwrap();
    e.write_at(&a, 0, block(1, 4096)).await.1.unwrap();
    e.sync(&a).await.unwrap();
    e.sync_dir(Path::new("/t")).unwrap();
    e.write_at(&a, 0, block(2, 4096)).await.1.unwrap();
    let _b = e.open(Path::new("/t/b"), OpenMode::Create, true).unwrap();
    e.crash();
    let a = e.open(Path::new("/t/a"), OpenMode::Existing, true).unwrap();
    let (buf, _) = e.read_at(&a, 0, AlignedBuf::zeroed(4096)).await;
    assert!(
        buf.iter().all(|&x| x == 1),
        "the synced contents survive, the later write does not"
    );
    assert!(
        e.open(Path::new("/t/b"), OpenMode::Existing, true).is_err(),
        "an unsynced creation is gone"
    );
}

#[tokio::test]
async fn injected_failures_and_a_full_disk_fail_cleanly() {
    let e = MemEngine::new(8192);
    e.create_dir_all(Path::new("/t")).unwrap();
    let a = e.open(Path::new("/t/a"), OpenMode::Create, true).unwrap();
    e.fail_next(Op::Write, libc::EIO);
    assert_eq!(
        e.write_at(&a, 0, block(1, 4096))
            .await
            .1
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EIO)
    );
    e.write_at(&a, 0, block(1, 8192)).await.1.unwrap();
    let full = e.write_at(&a, 8192, block(2, 4096)).await.1.unwrap_err();
    assert_eq!(full.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(
        e.len(&a).unwrap(),
        8192,
        "nothing of the refused write landed"
    );
}
