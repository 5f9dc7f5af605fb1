//! Data-on-MDT with real processes: files whose first bytes the MDS keeps are written and read
//! byte for byte by two clients, across an MDS killed with `kill -9` before it committed some
//! of the writes (the clients replay them) and across a clean restart; and a file removed while
//! open stays whole for its handle until the last close, across a kill too.

use std::time::{Duration, Instant};

use client::{Client, OpenOptions};
use lode_tests::{
    client_riding_restarts as connect, mds_committing_late as mds, oss_of as oss, scratch, Server,
};
use proto::FsErrorKind;

/// Bytes that differ at every offset and from file to file.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

async fn write(c: &Client, path: &str, at: u64, data: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .open(c, path)
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    f.write_at(at, data).await.unwrap();
    f.close().await.unwrap();
}

async fn read(c: &Client, path: &str) -> Vec<u8> {
    let f = OpenOptions::new()
        .read(true)
        .open(c, path)
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    let size = f.size().await.unwrap();
    let mut buf = vec![0u8; size as usize + 100];
    let n = f.read_at(0, &mut buf).await.unwrap();
    buf.truncate(n);
    f.close().await.unwrap();
    buf
}

/// An MDS committing late (kill -9 loses what it answered), a storage server, two clients once
/// storage is in service, and `/dom` whose files keep their first 64 KiB on the MDS: the
/// scratch directory, the MDS, the address it listens on, the storage server and the clients.
async fn cluster(name: &str) -> (std::path::PathBuf, Server, String, Server, Client, Client) {
    let root = scratch(name);
    let m = mds(&root, "127.0.0.1:0");
    let addr = m.nid.to_string();
    let listen = addr.trim_end_matches("@tcp").to_owned();
    let oss = oss(&root.join("oss"), &m.nid);
    let a = connect(&m.nid).await;
    let b = connect(&m.nid).await;
    let start = Instant::now();
    while a.targets().await.map_or(true, |t| t.iter().all(|t| !t.up)) {
        assert!(start.elapsed() < Duration::from_secs(30), "no storage");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.mkdir("/dom", 0o755).await.unwrap();
    let opts: Vec<String> = "-E 64K -L mdt -E -1 -c -1"
        .split(' ')
        .map(String::from)
        .collect();
    a.setstripe("/dom", client::stripe_args::parse(&opts).unwrap())
        .await
        .unwrap();
    (root, m, listen, oss, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_on_the_mds_read_back_byte_exact_from_two_clients_across_kill_9_and_restart() {
    let (root, m, listen, _oss, a, b) = cluster("dom").await;
    let only: Vec<String> = "-E 128K -L mdt".split(' ').map(String::from).collect();
    a.mkdir("/small", 0o755).await.unwrap();
    a.setstripe("/small", client::stripe_args::parse(&only).unwrap())
        .await
        .unwrap();
    a.sync().await.unwrap();

    // Files all on the MDS, one ending exactly at its part, and ones reaching into objects.
    let sizes = [0usize, 1, 4095, 8192, 65_536, 65_537, 300_000];
    let mut want = vec![];
    for (i, n) in sizes.iter().enumerate() {
        let path = format!("/dom/f{i}");
        let data = pattern(i as u64 + 1, *n);
        write(&a, &path, 0, &data).await;
        want.push((path, data));
    }
    // Writes in pieces, straddling the end of the MDS's part, from both clients.
    let mut pieced = pattern(100, 100_000);
    write(&a, "/dom/pieced", 0, &pieced[..40_000]).await;
    write(&b, "/dom/pieced", 40_000, &pieced[40_000..]).await;
    pieced[10..20].copy_from_slice(&[7; 10]);
    write(&a, "/dom/pieced", 10, &[7; 10]).await;
    want.push(("/dom/pieced".into(), pieced));
    // A truncate inside the MDS's part, then a write past it: the gap reads as zeros.
    let mut cut = pattern(200, 30_000);
    write(&a, "/dom/cut", 0, &cut).await;
    let f = OpenOptions::new()
        .write(true)
        .open(&a, "/dom/cut")
        .await
        .unwrap();
    f.set_len(1000).await.unwrap();
    f.write_at(5000, b"tail").await.unwrap();
    f.close().await.unwrap();
    cut.truncate(1000);
    cut.resize(5000, 0);
    cut.extend_from_slice(b"tail");
    want.push(("/dom/cut".into(), cut));
    // A file of the MDS's part alone cannot grow past it.
    write(&a, "/small/s", 0, &pattern(300, 100_000)).await;
    want.push(("/small/s".into(), pattern(300, 100_000)));
    let f = OpenOptions::new()
        .write(true)
        .open(&a, "/small/s")
        .await
        .unwrap();
    let e = f.write_at(128 << 10, b"x").await.unwrap_err();
    assert!(e.is(FsErrorKind::FileTooLarge), "{e}");
    f.close().await.unwrap();

    for (path, data) in &want {
        assert_eq!(
            &read(&b, path).await,
            data,
            "{path} read by the other client"
        );
    }
    // A handle that read a file sees another client's later write to it.
    let held = OpenOptions::new()
        .read(true)
        .open(&a, "/dom/f3")
        .await
        .unwrap();
    let mut buf = vec![0u8; 8192];
    held.read_at(0, &mut buf).await.unwrap();
    assert_eq!(buf, want[3].1);
    write(&b, "/dom/f3", 100, b"changed").await;
    want[3].1[100..107].copy_from_slice(b"changed");
    held.read_at(0, &mut buf).await.unwrap();
    assert_eq!(
        buf, want[3].1,
        "the other client's write, seen through the open handle"
    );
    held.close().await.unwrap();

    // Half of it durable, the rest answered but not committed when the MDS is killed.
    a.sync().await.unwrap();
    write(&a, "/dom/late", 0, &pattern(400, 20_000)).await;
    write(&b, "/dom/f2", 0, b"overwritten").await;
    want[2].1[..11].copy_from_slice(b"overwritten");
    want.push(("/dom/late".into(), pattern(400, 20_000)));
    // Usually still uncommitted here; on a loaded machine the MDS may have committed them and
    // said so in a later answer. The bytes must read back either way (the replay of changes
    // answered and not committed is checked in replay.rs).
    m.kill();
    let m = mds(&root, &listen);
    for (path, data) in &want {
        assert_eq!(
            &read(&a, path).await,
            data,
            "{path} after kill -9, replayed"
        );
        assert_eq!(
            &read(&b, path).await,
            data,
            "{path} after kill -9, other client"
        );
        let size = a.stat(path).await.unwrap().size;
        assert_eq!(size, data.len() as u64, "{path}'s size");
    }

    // A clean stop and a client that never saw the files.
    a.sync().await.unwrap();
    b.sync().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
    assert!(m.terminate().success());
    let m = mds(&root, &listen);
    let c = connect(&m.nid).await;
    for (path, data) in &want {
        assert_eq!(&read(&c, path).await, data, "{path} after a restart");
    }
    let layout = c.getstripe("/dom/f1").await.unwrap().unwrap();
    assert_eq!(layout.mdt_end(), Some(64 << 10));
    // Removed with its name: a new file there starts empty.
    c.unlink("/dom/f4").await.unwrap();
    write(&c, "/dom/f4", 0, b"new").await;
    assert_eq!(read(&c, "/dom/f4").await, b"new");
    c.close().await.unwrap();
    drop(m);
}

/// POSIX keeps a removed file until its last close (a temporary file is made so: created,
/// removed at once, then used). The bytes the MDS keeps of one stay readable and writable
/// through the handle, across an MDS killed with the removal and the writes uncommitted, and
/// go once the handle is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_on_the_mds_removed_while_open_stays_whole_until_its_last_close() {
    let (root, m, listen, _oss, a, b) = cluster("dom-removed").await;
    a.sync().await.unwrap();

    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&a, "/dom/tmp")
        .await
        .unwrap();
    let mut want = pattern(7, 50_000);
    f.write_at(0, &want).await.unwrap();
    f.fsync().await.unwrap();
    // Removed by the other client, then written again through the handle: neither is
    // committed when the MDS is killed.
    b.unlink("/dom/tmp").await.unwrap();
    assert!(a
        .stat("/dom/tmp")
        .await
        .unwrap_err()
        .is(FsErrorKind::NotFound));
    f.write_at(1000, b"after the removal").await.unwrap();
    want[1000..1017].copy_from_slice(b"after the removal");
    let mut buf = vec![0u8; 60_000];
    let n = f.read_at(0, &mut buf).await.unwrap();
    assert_eq!(
        &buf[..n],
        &want[..],
        "read through the handle after the removal"
    );
    assert_eq!(a.getattr(f.fid()).await.unwrap().nlink, 0);

    m.kill();
    let m = mds(&root, &listen);
    let n = f.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf[..n], &want[..], "after kill -9, the removal replayed");
    f.write_at(60_000, b"past the MDS's part").await.unwrap();
    want.resize(60_000, 0);
    want.extend_from_slice(b"past the MDS's part");
    buf.resize(70_000, 0);
    let n = f.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf[..n], &want[..], "a write after the restart");
    assert!(b
        .stat("/dom/tmp")
        .await
        .unwrap_err()
        .is(FsErrorKind::NotFound));
    // A new file under the name is another file.
    write(&b, "/dom/tmp", 0, b"new").await;
    assert_eq!(read(&a, "/dom/tmp").await, b"new");
    let n = f.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf[..n], &want[..], "the old file, beside the new one");

    // The last close lets the MDS release it.
    let fid = f.fid();
    f.close().await.unwrap();
    let start = Instant::now();
    loop {
        match a.getattr(fid).await {
            Err(e) if e.is(FsErrorKind::Stale) || e.is(FsErrorKind::NotFound) => break,
            other => {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "still there 30 s after its last close: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
    drop(m);
}
