//! A storage target through each operation and each error, on the crash-simulating engine
//! (and a real disk for the checksum test).

use std::path::Path;
use std::sync::Arc;

use oss::engine::mem::{MemEngine, Op};
use oss::engine::psync::Psync;
use oss::engine::{Engine, EngineConfig};
use oss::object::{BLOCK, MAX_IO, MAX_OBJECT_SIZE};
use oss::{Target, TargetError};
use proto::Fid;

const ROOT: &str = "/ost0";
/// The filesystem the tests' targets are bound to.
const FS: u128 = 0xf5;

async fn mem_target(capacity: u64) -> (Arc<MemEngine>, Target) {
    let mem = Arc::new(MemEngine::new(capacity));
    let engine: Arc<dyn Engine> = mem.clone();
    Target::format(&engine, Path::new(ROOT), 100, Some(0))
        .await
        .unwrap();
    Target::bind(&engine, Path::new(ROOT), 0, FS).await.unwrap();
    let t = Target::open(engine, Path::new(ROOT)).await.unwrap();
    (mem, t)
}

async fn reopen(mem: &Arc<MemEngine>) -> Target {
    Target::open(mem.clone(), Path::new(ROOT)).await.unwrap()
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i * 7 % 251) as u8))
        .collect()
}

#[tokio::test]
async fn precreated_objects_are_consecutive_and_empty() {
    let (_m, t) = mem_target(1 << 30).await;
    let first = t.precreate(10).await.unwrap();
    let next = t.precreate(5).await.unwrap();
    assert_eq!(next.oid, first.oid + 10);
    assert_eq!(t.size(first).await.unwrap(), 0);
    assert!(t.read(next, 0, 100).await.unwrap().is_empty());
    t.sync(next).await.unwrap();
    t.punch(next, 0, 100, Default::default()).await.unwrap();
    t.truncate(next, 0, Default::default()).await.unwrap();
    // Handed out, not written: no files yet.
    assert!(t.objects().unwrap().is_empty());
    t.write(first, 0, b"x", false, Default::default())
        .await
        .unwrap();
    t.truncate(next, 10, Default::default()).await.unwrap();
    assert_eq!(t.objects().unwrap(), vec![first, next]);
    assert_eq!(t.size(next).await.unwrap(), 10);
    assert!(matches!(t.precreate(0).await, Err(TargetError::Invalid(_))));
    assert!(matches!(
        t.precreate(20_001).await,
        Err(TargetError::Invalid(_))
    ));
}

#[tokio::test]
async fn writes_read_back_at_any_offset_with_holes_as_zeros() {
    let (_m, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    let a = bytes(1, 10_000);
    assert_eq!(
        t.write(o, 5000, &a, false, Default::default())
            .await
            .unwrap(),
        15_000
    );
    let got = t.read(o, 0, 20_000).await.unwrap();
    assert_eq!(got.len(), 15_000, "a read past the end is short");
    assert!(
        got[..5000].iter().all(|&b| b == 0),
        "the hole reads as zeros"
    );
    assert_eq!(&got[5000..], &a[..]);
    // An unaligned overwrite inside one block keeps its neighbours.
    t.write(o, 6001, b"xyz", false, Default::default())
        .await
        .unwrap();
    let got = t.read(o, 6000, 5).await.unwrap();
    assert_eq!(&got[..], &[a[1000], b'x', b'y', b'z', a[1004]]);
    assert!(t.read(o, 15_000, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn truncate_shrinks_and_grows_with_zeros() {
    let (_m, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    t.write(
        o,
        0,
        &bytes(3, 3 * BLOCK as usize),
        true,
        Default::default(),
    )
    .await
    .unwrap();
    t.truncate(o, 5000, Default::default()).await.unwrap();
    assert_eq!(t.size(o).await.unwrap(), 5000);
    t.truncate(o, 20_000, Default::default()).await.unwrap();
    let got = t.read(o, 0, 20_000).await.unwrap();
    assert_eq!(&got[..5000], &bytes(3, 3 * BLOCK as usize)[..5000]);
    assert!(
        got[5000..].iter().all(|&b| b == 0),
        "bytes past the old size come back as zeros"
    );
}

#[tokio::test]
async fn punch_zeroes_a_range_and_keeps_the_size() {
    let (_m, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    let data = bytes(9, 5 * BLOCK as usize);
    t.write(o, 0, &data, false, Default::default())
        .await
        .unwrap();
    t.punch(o, 100, 3 * BLOCK, Default::default())
        .await
        .unwrap();
    let got = t.read(o, 0, 5 * BLOCK).await.unwrap();
    assert_eq!(got.len(), data.len());
    assert_eq!(&got[..100], &data[..100]);
    assert!(got[100..100 + 3 * BLOCK as usize].iter().all(|&b| b == 0));
    assert_eq!(
        &got[100 + 3 * BLOCK as usize..],
        &data[100 + 3 * BLOCK as usize..]
    );
}

#[tokio::test]
async fn a_destroyed_or_unknown_object_is_not_found() {
    let (_m, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    t.write(o, 0, b"hello", true, Default::default())
        .await
        .unwrap();
    t.destroy(o).await.unwrap();
    assert!(matches!(
        t.read(o, 0, 5).await,
        Err(TargetError::NotFound(_))
    ));
    assert!(matches!(t.destroy(o).await, Err(TargetError::NotFound(_))));
    // A late write to it (a client holding an old layout) does not bring it back.
    assert!(matches!(
        t.write(o, 0, b"late", true, Default::default()).await,
        Err(TargetError::NotFound(_))
    ));
    assert!(t.objects().unwrap().is_empty());
    // Nor to one destroyed before it was ever written.
    let never = t.precreate(1).await.unwrap();
    t.destroy(never).await.unwrap();
    for r in [
        t.write(never, 0, b"late", false, Default::default())
            .await
            .map(|_| ()),
        t.truncate(never, 5, Default::default()).await,
        t.size(never).await.map(|_| ()),
    ] {
        assert!(matches!(r, Err(TargetError::NotFound(_))), "{r:?}");
    }
    let stranger = Fid::new(o.seq + 1, o.oid, 0);
    assert!(matches!(
        t.write(stranger, 0, b"x", false, Default::default()).await,
        Err(TargetError::NotFound(_))
    ));
    assert!(matches!(
        t.size(Fid::new(o.seq, 999_999, 0)).await,
        Err(TargetError::NotFound(_))
    ));
}

#[tokio::test]
async fn ranges_past_the_limits_are_refused_and_write_nothing() {
    let (_m, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    for (off, len) in [
        (u64::MAX - 2, 10u64),
        (MAX_OBJECT_SIZE - 1, 2),
        (0, MAX_IO + 1),
    ] {
        let err = t.read(o, off, len).await.unwrap_err();
        assert!(matches!(err, TargetError::Invalid(_)), "{err}");
    }
    let err = t
        .write(o, MAX_OBJECT_SIZE, b"x", false, Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, TargetError::Invalid(_)), "{err}");
    assert!(matches!(
        t.truncate(o, MAX_OBJECT_SIZE + 1, Default::default()).await,
        Err(TargetError::Invalid(_))
    ));
    assert!(matches!(
        t.punch(o, u64::MAX, 2, Default::default()).await,
        Err(TargetError::Invalid(_))
    ));
    assert_eq!(t.size(o).await.unwrap(), 0);
}

#[tokio::test]
async fn a_crash_keeps_synced_data_and_loses_unsynced_writes_whole() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(2).await.unwrap();
    let synced = bytes(1, 64 << 10);
    t.write(o, 0, &synced, true, Default::default())
        .await
        .unwrap();
    // Unsynced: an overwrite of part of it, and an extension.
    t.write(o, 10_000, &bytes(2, 30_000), false, Default::default())
        .await
        .unwrap();
    t.write(o, 64 << 10, &bytes(3, 8192), false, Default::default())
        .await
        .unwrap();
    // A second object written and synced after the first's unsynced writes.
    let o2 = Fid::new(o.seq, o.oid + 1, 0);
    t.write(o2, 0, b"durable", false, Default::default())
        .await
        .unwrap();
    t.sync(o2).await.unwrap();
    drop(t);
    mem.crash();
    let t = reopen(&mem).await;
    assert_eq!(
        t.size(o).await.unwrap(),
        synced.len() as u64,
        "the unsynced extension is gone"
    );
    assert_eq!(
        &t.read(o, 0, 1 << 20).await.unwrap()[..],
        &synced[..],
        "not a byte of the overwrite survived"
    );
    assert_eq!(&t.read(o2, 0, 100).await.unwrap()[..], b"durable");
    // Ids handed out before the crash are never handed out again.
    assert_eq!(t.precreate(1).await.unwrap().oid, o.oid + 2);
}

#[tokio::test]
async fn a_block_whose_new_data_was_lost_reads_as_its_old_contents() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    let old = bytes(5, BLOCK as usize);
    t.write(o, 0, &old, true, Default::default()).await.unwrap();
    t.write(o, 0, &bytes(6, BLOCK as usize), false, Default::default())
        .await
        .unwrap();
    // The disk kept the new checksum but not the new data (a real disk's writeback may do so).
    let data = format!("{ROOT}/O/{:x}/d{}/{:x}", o.seq, o.oid % 32, o.oid);
    mem.with_file(Path::new(&data), |img| {
        img[..old.len()].copy_from_slice(&old)
    })
    .unwrap();
    assert_eq!(&t.read(o, 0, BLOCK).await.unwrap()[..], &old[..]);
}

#[tokio::test]
async fn a_full_disk_refuses_the_write_and_keeps_what_was_there() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    let first = bytes(4, 32 << 10);
    t.write(o, 0, &first, true, Default::default())
        .await
        .unwrap();
    mem.set_capacity(
        mem.space(Path::new(ROOT)).unwrap().total - mem.space(Path::new(ROOT)).unwrap().free + 1000,
    );
    let err = t
        .write(o, 32 << 10, &bytes(5, 64 << 10), false, Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, TargetError::NoSpace), "{err}");
    assert_eq!(t.size(o).await.unwrap(), first.len() as u64);
    assert_eq!(&t.read(o, 0, 1 << 20).await.unwrap()[..], &first[..]);
    // An overwrite in place needs no new space and still works.
    t.write(o, 0, &bytes(6, 4096), true, Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn disk_errors_reach_the_caller_naming_the_object() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    t.write(o, 0, &bytes(1, 8192), true, Default::default())
        .await
        .unwrap();
    mem.fail_next(Op::Read, libc::EIO);
    let err = t.read(o, 0, 8192).await.unwrap_err();
    assert!(matches!(err, TargetError::Io { .. }), "{err}");
    assert!(err.to_string().contains(&o.to_string()), "{err}");
    // A failed sync with nothing unsynced loses nothing: the next one answers, under a new
    // epoch (the disk is failing; every writer learns it at its next sync).
    let epoch = t.epoch();
    mem.fail_next(Op::Sync, libc::EIO);
    assert!(t.sync(o).await.is_err());
    t.sync(o).await.unwrap();
    assert!(t.epoch() > epoch);
}

#[tokio::test]
async fn a_failed_sync_fails_every_later_sync_until_the_lost_writes_are_rewritten() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    t.write(
        o,
        0,
        &bytes(1, 3 * BLOCK as usize),
        true,
        Default::default(),
    )
    .await
    .unwrap();
    let before = t.epoch();
    t.write(
        o,
        BLOCK,
        &bytes(2, 2 * BLOCK as usize),
        false,
        Default::default(),
    )
    .await
    .unwrap();
    // The kernel fails the write-back and drops the pages: a retried fsync would say Ok.
    mem.fail_next(Op::Sync, libc::EIO);
    let err = t.sync(o).await.unwrap_err();
    assert!(matches!(err, TargetError::SyncFailed { .. }), "{err}");
    for _ in 0..3 {
        assert!(matches!(
            t.sync(o).await,
            Err(TargetError::SyncFailed { .. })
        ));
    }
    // The epoch moved, durably: clients whose writes were answered before it learn of the
    // loss at their sync, in this run or after a restart.
    let moved = t.epoch();
    assert!(moved > before);
    drop(t);
    let t = reopen(&mem).await;
    assert!(t.epoch() >= moved);
    // The writer, told, writes again: durable.
    t.write(
        o,
        BLOCK,
        &bytes(3, 2 * BLOCK as usize),
        true,
        Default::default(),
    )
    .await
    .unwrap();
    let mut want = bytes(1, 3 * BLOCK as usize);
    want[BLOCK as usize..].copy_from_slice(&bytes(3, 2 * BLOCK as usize));
    assert_eq!(&t.read(o, 0, 3 * BLOCK).await.unwrap()[..], &want[..]);
}

#[tokio::test]
async fn in_one_run_a_poisoned_object_syncs_again_only_once_every_lost_block_is_rewritten() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    t.write(
        o,
        0,
        &bytes(1, 4 * BLOCK as usize),
        false,
        Default::default(),
    )
    .await
    .unwrap();
    mem.fail_next(Op::Sync, libc::EIO);
    assert!(t.sync(o).await.is_err());
    // Half the lost blocks rewritten: still refused.
    t.write(
        o,
        0,
        &bytes(2, 2 * BLOCK as usize),
        false,
        Default::default(),
    )
    .await
    .unwrap();
    assert!(matches!(
        t.sync(o).await,
        Err(TargetError::SyncFailed { .. })
    ));
    t.write(
        o,
        2 * BLOCK,
        &bytes(3, 2 * BLOCK as usize),
        false,
        Default::default(),
    )
    .await
    .unwrap();
    t.sync(o).await.unwrap();
    drop(t);
    mem.crash();
    let t = reopen(&mem).await;
    let mut want = bytes(2, 2 * BLOCK as usize);
    want.extend_from_slice(&bytes(3, 2 * BLOCK as usize));
    assert_eq!(&t.read(o, 0, 4 * BLOCK).await.unwrap()[..], &want[..]);
}

#[tokio::test]
async fn contents_synced_in_an_earlier_run_survive_two_overwrites_and_a_lost_write_back() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    let synced = bytes(7, BLOCK as usize);
    t.write(o, 0, &synced, true, Default::default())
        .await
        .unwrap();
    // The storage server's process restarts (the machine does not).
    drop(t);
    let t = reopen(&mem).await;
    t.write(o, 0, &bytes(8, BLOCK as usize), false, Default::default())
        .await
        .unwrap();
    t.write(o, 0, &bytes(9, BLOCK as usize), false, Default::default())
        .await
        .unwrap();
    // Power is cut: the disk kept the checksums' write-back but not the data's, so the data
    // file holds what was last synced.
    let data = format!("{ROOT}/O/{:x}/d{}/{:x}", o.seq, o.oid % 32, o.oid);
    mem.with_file(Path::new(&data), |img| {
        img[..synced.len()].copy_from_slice(&synced)
    })
    .unwrap();
    drop(t);
    let t = reopen(&mem).await;
    assert_eq!(&t.read(o, 0, BLOCK).await.unwrap()[..], &synced[..]);
}

#[tokio::test]
async fn a_flipped_bit_on_disk_is_an_error_naming_object_and_offset_and_scrub_finds_it() {
    let dir = std::env::temp_dir().join(format!("lode-bitflip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let engine: Arc<dyn Engine> = Arc::new(Psync::start(EngineConfig::default()));
    Target::format(&engine, &dir, 103, Some(3)).await.unwrap();
    let t = Target::open(engine, &dir).await.unwrap();
    let o = t.precreate(1).await.unwrap();
    let data = bytes(7, 5 * BLOCK as usize);
    t.write(o, 0, &data, true, Default::default())
        .await
        .unwrap();
    assert_eq!(t.scrub().await.unwrap().bad, vec![]);

    let path = dir.join(format!("O/{:x}/d{}/{:x}", o.seq, o.oid % 32, o.oid));
    let mut raw = std::fs::read(&path).unwrap();
    raw[2 * BLOCK as usize + 77] ^= 0x10;
    std::fs::write(&path, &raw).unwrap();

    let err = t.read(o, 0, 5 * BLOCK).await.unwrap_err();
    match &err {
        TargetError::Checksum { fid, offset } => assert_eq!((*fid, *offset), (o, 2 * BLOCK)),
        other => panic!("expected a checksum error, got {other}"),
    }
    assert!(err.to_string().contains(&o.to_string()) && err.to_string().contains("8192"));
    // Blocks around it still read.
    assert_eq!(
        &t.read(o, 0, 2 * BLOCK).await.unwrap()[..],
        &data[..2 * BLOCK as usize]
    );
    let report = t.scrub().await.unwrap();
    assert_eq!(report.bad, vec![(o, 2 * BLOCK)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_to_one_object_all_land() {
    let (_m, t) = mem_target(1 << 30).await;
    let t = Arc::new(t);
    let o = t.precreate(1).await.unwrap();
    // 32 writers: unaligned, some sharing blocks with their neighbours.
    let chunk = 10_000usize;
    let writers: Vec<_> = (0..32u8)
        .map(|i| {
            let t = t.clone();
            tokio::spawn(async move {
                t.write(
                    o,
                    u64::from(i) * chunk as u64,
                    &vec![i + 1; chunk],
                    false,
                    Default::default(),
                )
                .await
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    let got = t.read(o, 0, 32 * chunk as u64).await.unwrap();
    assert_eq!(got.len(), 32 * chunk);
    for (i, part) in got.chunks(chunk).enumerate() {
        assert!(part.iter().all(|&b| b == i as u8 + 1), "writer {i}'s bytes");
    }
    t.sync(o).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_writes_on_a_real_disk_share_one_object() {
    let dir = std::env::temp_dir().join(format!("lode-first-writes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let engine: Arc<dyn Engine> = Arc::new(Psync::start(EngineConfig::default()));
    Target::format(&engine, &dir, 9, Some(9)).await.unwrap();
    let t = Arc::new(Target::open(engine, &dir).await.unwrap());
    for round in 0..20u32 {
        let o = t.precreate(1).await.unwrap();
        let tasks: Vec<_> = (0..16u64)
            .map(|i| {
                let t = t.clone();
                tokio::spawn(async move {
                    t.write(
                        o,
                        i * BLOCK,
                        &vec![i as u8 + 1; BLOCK as usize],
                        false,
                        Default::default(),
                    )
                    .await?;
                    t.read(o, 0, 16 * BLOCK).await.map(|_| ())
                })
            })
            .collect();
        for task in tasks {
            task.await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let all = t.read(o, 0, 16 * BLOCK).await.unwrap();
        for (i, b) in all.chunks(BLOCK as usize).enumerate() {
            assert!(
                b.iter().all(|&x| x == i as u8 + 1),
                "round {round}: block {i}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// How many of `path`'s pages are in the page cache.
fn resident_pages(path: &Path) -> usize {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    if len == 0 {
        return 0;
    }
    let page = 4096;
    let mut v = vec![0u8; len.div_ceil(page)];
    // SAFETY: a shared read-only map of a file this function holds open, unmapped before it
    // returns; mincore writes one byte per page into `v`, which has room for every page.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::mincore(p, len, v.as_mut_ptr()), 0);
        libc::munmap(p, len);
    }
    v.iter().filter(|&&b| b & 1 == 1).count()
}

/// The data file of object `o` in target directory `dir`.
fn data_file(dir: &Path, o: Fid) -> std::path::PathBuf {
    let name = format!("{:x}", o.oid);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap().to_str() == Some(name.as_str()) {
                return p;
            }
        }
    }
    panic!("no data file for {o}");
}

/// Small I/Os go through the page cache and large ones straight to the disk or through the
/// cache too, as the target's policy says: each sees what the other wrote, whichever came
/// first, and what was synced survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_and_direct_io_see_each_others_bytes_on_a_real_disk_under_every_policy() {
    use oss::io_policy::{IoPolicy, SMALL_IO};
    let mixed = IoPolicy {
        cache_max_read: u64::MAX,
        cache_max_write: SMALL_IO,
    };
    for (k, policy) in [IoPolicy::DIRECT, IoPolicy::BUFFERED, mixed]
        .into_iter()
        .enumerate()
    {
        let dir = std::env::temp_dir().join(format!("lode-cached-io-{}-{k}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let engine: Arc<dyn Engine> = Arc::new(Psync::start(EngineConfig::default()));
        Target::format(&engine, &dir, 11, Some(11)).await.unwrap();
        let t = Target::open(engine.clone(), &dir).await.unwrap();
        t.set_io(policy);
        let o = t.precreate(1).await.unwrap();
        let big = 1usize << 20;
        assert!(big as u64 > SMALL_IO && 8192 <= SMALL_IO);
        let mut want = bytes(1, big);
        t.write(o, 0, &want, false, Default::default())
            .await
            .unwrap();
        // A large write leaves its pages cached only where writes go buffered.
        let cached = resident_pages(&data_file(&dir, o));
        if policy.cache_max_write == u64::MAX {
            assert_eq!(cached, big / 4096, "{policy:?}");
        } else {
            assert_eq!(cached, 0, "{policy:?}");
        }
        // A small write into it, cached (and not on a block boundary), then a large read.
        let small = bytes(2, 8192);
        t.write(o, 100_001, &small, false, Default::default())
            .await
            .unwrap();
        want[100_001..100_001 + 8192].copy_from_slice(&small);
        // One of IOR's interleaved records: twelve blocks through the page cache, written
        // on the serving thread, its edge blocks merged with their neighbours.
        let record = bytes(3, 47_008);
        t.write(o, 300_000, &record, false, Default::default())
            .await
            .unwrap();
        want[300_000..300_000 + 47_008].copy_from_slice(&record);
        assert_eq!(
            &t.read(o, 0, big as u64).await.unwrap()[..],
            &want[..],
            "{policy:?}"
        );
        assert_eq!(&t.read(o, 100_001, 8192).await.unwrap()[..], &small[..]);
        // A large write over what the cache holds, then small cached reads.
        let want = bytes(3, big);
        t.write(o, 0, &want, false, Default::default())
            .await
            .unwrap();
        for at in [100_001usize, 0, 500_000, big - 4096] {
            let got = t.read(o, at as u64, 4096).await.unwrap();
            assert_eq!(&got[..], &want[at..at + 4096], "4 KiB at {at}, {policy:?}");
        }
        t.sync(o).await.unwrap();
        drop(t);
        let t = Target::open(engine, &dir).await.unwrap();
        t.set_io(policy);
        assert_eq!(&t.read(o, 0, big as u64).await.unwrap()[..], &want[..]);
        assert!(t.scrub().await.unwrap().bad.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[tokio::test]
async fn the_durability_epoch_moves_on_after_a_power_cut_and_not_after_a_restart() {
    let (mem, t) = mem_target(1 << 30).await;
    let first = t.epoch();
    drop(t);
    // The process restarted: the kernel still holds every write, nothing was lost.
    assert_eq!(reopen(&mem).await.epoch(), first);
    // The machine lost power: writes not synced may be gone, and clients must hear of it.
    mem.crash();
    let after = reopen(&mem).await.epoch();
    assert!(after > first, "{after} after {first}");
    assert_eq!(reopen(&mem).await.epoch(), after);
}

#[tokio::test]
async fn an_object_made_at_its_first_write_survives_a_power_cut_once_synced() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(3).await.unwrap();
    let (a, b, c) = (
        o,
        Fid::new(o.seq, o.oid + 1, 0),
        Fid::new(o.seq, o.oid + 2, 0),
    );
    t.write(a, 0, b"synced", true, Default::default())
        .await
        .unwrap();
    t.write(b, 0, b"synced later", false, Default::default())
        .await
        .unwrap();
    t.sync(b).await.unwrap();
    t.write(c, 0, b"never synced", false, Default::default())
        .await
        .unwrap();
    drop(t);
    mem.crash();
    let t = reopen(&mem).await;
    assert_eq!(&t.read(a, 0, 100).await.unwrap()[..], b"synced");
    assert_eq!(&t.read(b, 0, 100).await.unwrap()[..], b"synced later");
    // Made and written, never synced: as if never written (its writer was not told it was
    // durable, and resends it).
    assert_eq!(t.size(c).await.unwrap(), 0);
    t.write(c, 0, b"again", true, Default::default())
        .await
        .unwrap();
    assert_eq!(&t.read(c, 0, 100).await.unwrap()[..], b"again");
}

#[tokio::test]
async fn destroyed_ids_stay_dead_across_a_power_cut_and_an_orphan_cleanup() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(10).await.unwrap();
    let id = |k: u32| Fid::new(o.seq, o.oid + k, 0);
    t.write(id(0), 0, b"keep", true, Default::default())
        .await
        .unwrap();
    t.write(id(1), 0, b"gone", true, Default::default())
        .await
        .unwrap();
    t.destroy(id(1)).await.unwrap();
    t.destroy(id(2)).await.unwrap();
    t.write(id(7), 0, b"orphan", true, Default::default())
        .await
        .unwrap();
    // Objects above id(4) were never given to a file: an orphan cleanup takes them.
    assert_eq!(t.destroy_above(0, id(4).oid, 1, FS).await.unwrap(), 1);
    drop(t);
    mem.crash();
    let t = reopen(&mem).await;
    assert_eq!(&t.read(id(0), 0, 10).await.unwrap()[..], b"keep");
    for k in [1, 2, 5, 7, 9] {
        assert!(
            matches!(t.read(id(k), 0, 10).await, Err(TargetError::NotFound(_))),
            "id {k}"
        );
    }
    // Handed out, alive, never written.
    assert_eq!(t.size(id(3)).await.unwrap(), 0);
    assert_eq!(t.precreate(1).await.unwrap(), id(10));
}

#[tokio::test]
async fn a_second_cleanup_from_the_same_mds_run_spares_what_that_run_precreated_since() {
    let (_mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(4).await.unwrap();
    let id = |k: u32| Fid::new(o.seq, o.oid + k, 0);
    // Run 7 starts: the ids above id(1) were its predecessor's orphans.
    t.destroy_above(0, id(1).oid, 7, FS).await.unwrap();
    let fresh = t.precreate(4).await.unwrap();
    t.write(fresh, 0, b"new file", true, Default::default())
        .await
        .unwrap();
    // The same cleanup again (held back on the way): what run 7 precreated since stays.
    assert_eq!(t.destroy_above(0, id(1).oid, 7, FS).await.unwrap(), 0);
    assert_eq!(&t.read(fresh, 0, 100).await.unwrap()[..], b"new file");
    let unwritten = Fid::new(fresh.seq, fresh.oid + 1, 0);
    assert_eq!(t.size(unwritten).await.unwrap(), 0);
    assert!(matches!(
        t.read(id(2), 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
    // A new run's cleanup takes every id above the highest its files know.
    assert_eq!(t.destroy_above(0, id(1).oid, 8, FS).await.unwrap(), 1);
    assert!(matches!(
        t.read(fresh, 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
    assert!(matches!(
        t.read(unwritten, 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_target_made_before_dead_ids_were_recorded_learns_them_from_its_files() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(4).await.unwrap();
    let id = |k: u32| Fid::new(o.seq, o.oid + k, 0);
    for k in [0, 2] {
        t.write(id(k), 0, b"old", true, Default::default())
            .await
            .unwrap();
    }
    drop(t);
    // As an older target: every precreated object had files, and a destroyed one had none.
    mem.remove(&Path::new(ROOT).join("DEAD")).unwrap();
    let t = reopen(&mem).await;
    assert_eq!(&t.read(id(2), 0, 10).await.unwrap()[..], b"old");
    for k in [1, 3] {
        assert!(
            matches!(t.size(id(k)).await, Err(TargetError::NotFound(_))),
            "id {k}"
        );
    }
    let new = t.precreate(1).await.unwrap();
    assert_eq!(t.size(new).await.unwrap(), 0);
}

#[tokio::test]
async fn a_full_target_still_destroys_objects_and_so_frees_space() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(4000).await.unwrap();
    let id = |k: u32| Fid::new(o.seq, o.oid + k, 0);
    for k in [0, 3999] {
        t.write(id(k), 0, &[7u8; 65536], true, Default::default())
            .await
            .unwrap();
    }
    // Full: not one more byte.
    let space = oss::engine::Engine::space(&*mem, Path::new(ROOT)).unwrap();
    mem.set_capacity(space.total - space.free);
    assert!(matches!(
        t.write(id(5), 0, b"more", true, Default::default()).await,
        Err(TargetError::NoSpace)
    ));
    // Destroying needs no room: the ids handed out have their place in DEAD already.
    t.destroy(id(3999)).await.unwrap();
    t.destroy_many(&[id(0), id(1)]).await.unwrap();
    let after = oss::engine::Engine::space(&*mem, Path::new(ROOT)).unwrap();
    assert!(after.free >= 2 * 65536, "{after:?}");
    assert!(matches!(
        t.read(id(3999), 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
    // The room made takes new writes.
    t.write(id(5), 0, b"more", true, Default::default())
        .await
        .unwrap();
}

/// The files in one object directory whose names say "kept for reuse", and whether any object
/// file is there.
fn kept_files(mem: &Arc<MemEngine>, fid: Fid) -> usize {
    let dir = format!("{ROOT}/O/{:x}/d{}", fid.seq, fid.oid % 32);
    mem.list(Path::new(&dir))
        .unwrap()
        .iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("free.")
        })
        .count()
}

/// A destroyed object's files are kept, emptied, and a new object in the same directory takes
/// them instead of making files: it starts empty (a hole reads as zeros, never the old bytes).
/// A restart or a power cut drops what was kept.
#[tokio::test]
async fn a_new_object_takes_a_destroyed_ones_files_and_none_of_its_bytes() {
    let (mem, t) = mem_target(1 << 30).await;
    let first = t.precreate(200).await.unwrap();
    // Ids 32 apart share a directory.
    let fid = |i: u32| Fid::new(first.seq, first.oid + 32 * i, 0);
    let old = bytes(1, 3 * BLOCK as usize);
    t.write(fid(0), 0, &old, true, Default::default())
        .await
        .unwrap();
    t.destroy(fid(0)).await.unwrap();
    assert_eq!(kept_files(&mem, fid(0)), 2);
    assert!(t.objects().unwrap().is_empty());
    // A write past two blocks: they are holes of the new object.
    t.write(fid(1), 2 * BLOCK, b"new", false, Default::default())
        .await
        .unwrap();
    assert_eq!(kept_files(&mem, fid(1)), 0);
    let mut want = vec![0u8; 2 * BLOCK as usize];
    want.extend_from_slice(b"new");
    assert_eq!(&t.read(fid(1), 0, 4 * BLOCK).await.unwrap()[..], &want[..]);
    assert_eq!(t.size(fid(1)).await.unwrap(), 2 * BLOCK + 3);
    assert!(matches!(
        t.read(fid(0), 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
    t.sync(fid(1)).await.unwrap();

    // A power cut after a destroy: what was kept goes, the objects are as they were.
    t.destroy(fid(1)).await.unwrap();
    assert_eq!(kept_files(&mem, fid(1)), 2);
    t.write(fid(2), 0, b"never synced", false, Default::default())
        .await
        .unwrap();
    t.write(fid(3), 0, b"synced", true, Default::default())
        .await
        .unwrap();
    drop(t);
    mem.crash();
    let t = reopen(&mem).await;
    assert_eq!(kept_files(&mem, fid(2)), 0);
    assert_eq!(t.size(fid(2)).await.unwrap(), 0);
    assert_eq!(&t.read(fid(3), 0, BLOCK).await.unwrap()[..], b"synced");
    t.write(fid(2), 100, b"again", true, Default::default())
        .await
        .unwrap();
    let mut want = vec![0u8; 100];
    want.extend_from_slice(b"again");
    assert_eq!(&t.read(fid(2), 0, BLOCK).await.unwrap()[..], &want[..]);
    for i in 0..2 {
        assert!(matches!(
            t.size(fid(i)).await,
            Err(TargetError::NotFound(_))
        ));
    }
    // And a restart.
    t.destroy(fid(3)).await.unwrap();
    assert_eq!(kept_files(&mem, fid(3)), 2);
    drop(t);
    let t = reopen(&mem).await;
    assert_eq!(kept_files(&mem, fid(3)), 0);
    t.write(fid(4), 0, b"new files", true, Default::default())
        .await
        .unwrap();
    assert_eq!(&t.read(fid(4), 0, BLOCK).await.unwrap()[..], b"new files");
}

#[tokio::test]
async fn a_cleanup_from_another_filesystem_or_none_is_refused_and_destroys_nothing() {
    let (_mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(2).await.unwrap();
    t.write(o, 0, b"data", true, Default::default())
        .await
        .unwrap();
    assert!(matches!(
        t.destroy_above(0, 0, 1, FS + 1).await,
        Err(TargetError::Refused(_))
    ));
    assert_eq!(&t.read(o, 0, 10).await.unwrap()[..], b"data");
    // Bound once: a registration with another filesystem's MDS is refused too.
    let engine: Arc<dyn Engine> = _mem.clone();
    assert!(matches!(
        Target::bind(&engine, Path::new(ROOT), 0, FS + 1).await,
        Err(TargetError::Refused(_))
    ));
    assert_eq!(
        Target::label(&engine, Path::new(ROOT)).await.unwrap().fs,
        Some(FS)
    );
}

#[tokio::test]
async fn a_cleanup_that_would_destroy_a_targets_data_is_refused_until_an_operator_says_so() {
    let (_mem, t) = mem_target(1 << 30).await;
    let n = oss::target::MAX_ORPHANS as u32 + 10;
    let o = t.precreate(n).await.unwrap();
    for k in 0..n {
        t.write(
            Fid::new(o.seq, o.oid + k, 0),
            0,
            b"acknowledged",
            false,
            Default::default(),
        )
        .await
        .unwrap();
    }
    // An MDS whose namespace is empty (formatted afresh on a missing data directory): it
    // knows none of them.
    let err = t.destroy_above(0, 0, 1, FS).await.unwrap_err();
    assert!(
        matches!(&err, TargetError::Refused(m) if m.contains("lost its namespace")),
        "{err}"
    );
    for k in 0..n {
        let f = Fid::new(o.seq, o.oid + k, 0);
        assert_eq!(&t.read(f, 0, 100).await.unwrap()[..], b"acknowledged");
    }
    // A handful of orphans is an MDS crash's: cleaned up as before.
    assert_eq!(t.destroy_above(0, o.oid + n - 6, 2, FS).await.unwrap(), 5);
    // The operator's word lifts the bound.
    t.trust_mds_objects();
    assert_eq!(t.destroy_above(0, 0, 3, FS).await.unwrap(), n - 5);
}

#[tokio::test]
async fn a_rolled_back_last_id_is_refused_and_never_hands_out_an_id_twice() {
    let (mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(4).await.unwrap();
    // The filesystem references ids up to o + 9 (the target was restored from a copy taken
    // before the last six were handed out).
    let referenced = o.oid + 9;
    let err = t.destroy_above(0, referenced, 1, FS).await.unwrap_err();
    assert!(
        matches!(&err, TargetError::Refused(m) if m.contains("rolled back")),
        "{err}"
    );
    drop(t);
    let t = reopen(&mem).await;
    t.trust_mds_objects();
    assert_eq!(t.destroy_above(0, referenced, 2, FS).await.unwrap(), 0);
    // Ids past the referenced ones only; the lost ones read as errors, never as empty.
    assert_eq!(t.precreate(1).await.unwrap().oid, referenced + 1);
    assert!(matches!(
        t.read(Fid::new(o.seq, o.oid + 6, 0), 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
    drop(t);
    mem.crash();
    assert_eq!(
        reopen(&mem).await.precreate(1).await.unwrap().oid,
        referenced + 2
    );
}

#[tokio::test]
async fn a_late_truncate_or_punch_never_cuts_a_newer_write_of_its_client() {
    use proto::ost::WriteStamp;
    let (_mem, t) = mem_target(1 << 30).await;
    let o = t.precreate(1).await.unwrap();
    let st = |xid| WriteStamp {
        client: 9,
        xid,
        oldest: 1,
    };
    t.write(o, 0, &bytes(4, 3 * BLOCK as usize), false, st(5))
        .await
        .unwrap();
    // A truncate and a punch the client asked for before that write, held up on the way.
    assert!(matches!(
        t.truncate(o, 10, st(3)).await,
        Err(TargetError::Stale(_))
    ));
    assert!(matches!(
        t.punch(o, 0, BLOCK, st(4)).await,
        Err(TargetError::Stale(_))
    ));
    assert_eq!(
        &t.read(o, 0, 3 * BLOCK).await.unwrap()[..],
        &bytes(4, 3 * BLOCK as usize)[..]
    );
    // Asked for after it: applied.
    t.truncate(o, 10, st(6)).await.unwrap();
    assert_eq!(t.size(o).await.unwrap(), 10);
}

/// Each MDT precreates in a sequence of its own: ids counted apart, written and destroyed
/// apart, an orphan cleanup of one never reaching another's objects, and all of it kept
/// through a crash (the second sequence made at its first precreate).
#[tokio::test]
async fn each_mdt_has_its_own_sequence_and_one_mdts_cleanup_never_touches_anothers() {
    let (mem, t) = mem_target(1 << 30).await;
    let zero = t.precreate_for(0, 8).await.unwrap();
    let one = t.precreate_for(1, 8).await.unwrap();
    assert_eq!(zero.seq, proto::fid::object_seq(0, 0));
    assert_eq!(one.seq, proto::fid::object_seq(0, 1));
    assert_eq!(
        (zero.oid, one.oid),
        (1, 1),
        "each sequence counts its own ids"
    );
    let z = |k: u32| Fid::new(zero.seq, zero.oid + k, 0);
    let o = |k: u32| Fid::new(one.seq, one.oid + k, 0);
    for k in 0..8 {
        t.write(z(k), 0, &bytes(k as u8, 5000), true, Default::default())
            .await
            .unwrap();
        t.write(
            o(k),
            0,
            &bytes(100 + k as u8, 7000),
            true,
            Default::default(),
        )
        .await
        .unwrap();
    }
    // MDT1's cleanup takes its objects above id(5), and none of MDT0's.
    assert_eq!(t.destroy_above(1, o(5).oid, 3, FS).await.unwrap(), 2);
    // A destroy of MDT0's object leaves MDT1's of the same id.
    t.destroy(z(0)).await.unwrap();
    assert_eq!(t.objects().unwrap().len(), 7 + 6);
    drop(t);
    mem.crash();
    let t = reopen(&mem).await;
    assert!(matches!(
        t.read(z(0), 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
    assert_eq!(
        &t.read(o(0), 0, 7000).await.unwrap()[..],
        &bytes(100, 7000)[..]
    );
    for k in 1..8 {
        assert_eq!(
            &t.read(z(k), 0, 5000).await.unwrap()[..],
            &bytes(k as u8, 5000)[..]
        );
    }
    for k in 6..8 {
        assert!(matches!(
            t.read(o(k), 0, 10).await,
            Err(TargetError::NotFound(_))
        ));
    }
    // Both counters survived: no id is handed out twice.
    assert_eq!(t.precreate_for(0, 1).await.unwrap(), z(8));
    assert_eq!(t.precreate_for(1, 1).await.unwrap(), o(8));
    // An MDT past the most a filesystem has, or an object of no sequence here, is refused.
    assert!(matches!(
        t.precreate_for(proto::fid::MAX_MDTS, 1).await,
        Err(TargetError::Invalid(_))
    ));
    let stranger = Fid::new(proto::fid::object_seq(0, 9), 1, 0);
    assert!(matches!(
        t.write(stranger, 0, b"x", true, Default::default()).await,
        Err(TargetError::NotFound(_))
    ));
    let elsewhere = Fid::new(proto::fid::object_seq(3, 1), 1, 0);
    assert!(matches!(
        t.read(elsewhere, 0, 10).await,
        Err(TargetError::NotFound(_))
    ));
}
