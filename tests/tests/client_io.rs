//! The client library against a real cluster (an MDS and two storage servers with two targets
//! each, as processes on loopback): files of every shape read back byte for byte, close-to-open
//! between clients, a storage server killed mid-I/O, and the checkpoint pattern under readers.

use proto::FsErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use lode_tests::{mds_of, scratch, Server};
use proto::layout::{Component, Layout, StripeCount, EOF};

struct Cluster {
    root: std::path::PathBuf,
    mds: Server,
    oss: Vec<Option<Server>>,
}

impl Cluster {
    fn start(name: &str) -> Cluster {
        let root = scratch(name);
        let mds = mds_of(&root);
        let oss = (0..2)
            .map(|i| Some(Self::oss(&root, &mds, i, "127.0.0.1:0")))
            .collect();
        Cluster { root, mds, oss }
    }

    fn oss(root: &std::path::Path, mds: &Server, i: usize, listen: &str) -> Server {
        let dir = root.join(format!("oss{i}"));
        Server::start(
            "lode-oss",
            &[
                "--data-dir",
                dir.to_str().unwrap(),
                "--mds",
                &mds.nid.to_string(),
                "--listen",
                listen,
                "--targets",
                "2",
                "--heartbeat",
                "1",
            ],
        )
        .unwrap()
    }

    fn mds_addr(&self) -> String {
        self.mds.nid.to_string()
    }

    async fn client(&self) -> Client {
        Client::connect_with(&self.mds_addr(), config())
            .await
            .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A client with this test process's client key.
fn config() -> ClientConfig {
    ClientConfig {
        security: Some(lode_tests::client_security()),
        ..ClientConfig::default()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8).wrapping_mul(7))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_of_every_size_and_layout_read_back_byte_for_byte() {
    let cluster = Cluster::start("client-shapes");
    let c = cluster.client().await;
    let mib = 1u64 << 20;
    let progressive = Layout::new(vec![
        Component {
            end: mib,
            ..Component::raid0(StripeCount::Count(1), 64 << 10)
        },
        Component {
            start: mib,
            end: EOF,
            ..Component::raid0(StripeCount::All, 64 << 10)
        },
    ])
    .unwrap();
    let layouts: Vec<(&str, OpenOptions)> = vec![
        ("one", OpenOptions::new().stripe_count(1).stripe_size(mib)),
        (
            "four",
            OpenOptions::new().stripe_count(4).stripe_size(64 << 10),
        ),
        ("all", OpenOptions::new().stripe_all().stripe_size(mib)),
        ("progressive", OpenOptions::new().layout(progressive)),
    ];
    let sizes = [0usize, 1, (mib - 1) as usize, (5 * mib + 123) as usize];
    for (lname, opts) in &layouts {
        for (si, &size) in sizes.iter().enumerate() {
            let path = format!("/{lname}-{si}");
            let data = pattern(si as u8 + 1, size);
            let f = opts
                .clone()
                .write(true)
                .create_new(true)
                .open(&c, &path)
                .await
                .unwrap();
            f.write_at(0, &data).await.unwrap();
            f.fsync().await.unwrap();
            f.close().await.unwrap();
            let g = OpenOptions::new().open(&c, &path).await.unwrap();
            assert_eq!(g.size().await.unwrap(), size as u64, "{path}");
            let mut back = vec![0u8; size + 10];
            let n = g.read_at(0, &mut back).await.unwrap();
            assert_eq!(n, size, "{path}");
            assert!(back[..n] == data[..], "{path}: contents differ");
        }
    }
    // Sparse: a write far from the start leaves a hole that reads as zeros.
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .stripe_all()
        .stripe_size(64 << 10)
        .open(&c, "/sparse")
        .await
        .unwrap();
    f.write_at(10 * mib, b"tail").await.unwrap();
    f.close().await.unwrap();
    let g = OpenOptions::new().open(&c, "/sparse").await.unwrap();
    let mut buf = vec![1u8; (10 * mib + 4) as usize];
    assert_eq!(g.read_at(0, &mut buf).await.unwrap(), buf.len());
    assert!(buf[..(10 * mib) as usize].iter().all(|&b| b == 0));
    assert_eq!(&buf[(10 * mib) as usize..], b"tail");
    // Straight into registered memory, at an offset inside it.
    let region = c.register(vec![0u8; 64]).unwrap();
    assert_eq!(g.read_into(10 * mib, &region, 10, 4).await.unwrap(), 4);
    assert_eq!(region.read(10, 4).unwrap().as_slice(), b"tail");
}

// Long by design: one file through two writers, then a reader on another client, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disjoint_writers_of_one_file_and_close_to_open() {
    let cluster = Cluster::start("client-shared");
    let (a, b, reader) = (
        cluster.client().await,
        cluster.client().await,
        cluster.client().await,
    );
    let half = 3 << 20;
    let create = OpenOptions::new()
        .write(true)
        .create(true)
        .stripe_all()
        .stripe_size(1 << 20);
    create
        .open(&a, "/shared")
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let (pa, pb) = (pattern(1, half), pattern(2, half));
    let wa = async {
        let f = OpenOptions::new()
            .write(true)
            .open(&a, "/shared")
            .await
            .unwrap();
        f.write_at(0, &pa).await.unwrap();
        f.close().await.unwrap();
    };
    let wb = async {
        let f = OpenOptions::new()
            .write(true)
            .open(&b, "/shared")
            .await
            .unwrap();
        f.write_at(half as u64, &pb).await.unwrap();
        f.close().await.unwrap();
    };
    tokio::join!(wb, wa);
    let f = OpenOptions::new().open(&reader, "/shared").await.unwrap();
    assert_eq!(f.size().await.unwrap(), 2 * half as u64);
    let mut all = vec![0u8; 2 * half];
    f.read_at(0, &mut all).await.unwrap();
    assert!(all[..half] == pa[..] && all[half..] == pb[..]);

    // O_APPEND for one writer.
    let app = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&a, "/log")
        .await
        .unwrap();
    for line in ["one\n", "two\n", "three\n"] {
        app.write_at(0, line.as_bytes()).await.unwrap();
    }
    app.close().await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = OpenOptions::new()
        .open(&reader, "/log")
        .await
        .unwrap()
        .read_at(0, &mut buf)
        .await
        .unwrap();
    assert_eq!(&buf[..n], b"one\ntwo\nthree\n");

    // O_APPEND through several handles of one client at once (the processes of one mount):
    // each record lands whole at the end, none over another.
    let mut handles = vec![];
    for _ in 0..3 {
        let f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&a, "/shared-log")
            .await
            .unwrap();
        handles.push(Arc::new(f));
    }
    let writers: Vec<_> = handles
        .iter()
        .enumerate()
        .map(|(h, f)| {
            let f = f.clone();
            tokio::spawn(async move {
                for i in 0..40 {
                    f.write_at(0, format!("{h}:{i:02}\n").as_bytes())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    for f in handles {
        Arc::into_inner(f).unwrap().close().await.unwrap();
    }
    let log = OpenOptions::new()
        .open(&reader, "/shared-log")
        .await
        .unwrap();
    let mut all = vec![0u8; 1024];
    let n = log.read_at(0, &mut all).await.unwrap();
    let mut lines: Vec<&[u8]> = all[..n].split(|b| *b == b'\n').collect();
    assert_eq!(lines.pop(), Some(&b""[..]), "ends with a whole record");
    lines.sort();
    let want: Vec<String> = (0..3)
        .flat_map(|h| (0..40).map(move |i| format!("{h}:{i:02}")))
        .collect();
    assert_eq!(
        lines,
        want.iter().map(|w| w.as_bytes()).collect::<Vec<_>>(),
        "every append once, whole"
    );

    // The errors a caller expects.
    assert!(OpenOptions::new()
        .open(&a, "/missing")
        .await
        .unwrap_err()
        .is(FsErrorKind::NotFound));
    a.mkdir("/d", 0o755).await.unwrap();
    assert!(OpenOptions::new()
        .open(&a, "/d")
        .await
        .unwrap_err()
        .is(FsErrorKind::IsDir));
    assert!(create
        .clone()
        .create_new(true)
        .open(&a, "/log")
        .await
        .unwrap_err()
        .is(FsErrorKind::Exists));
    assert!(a
        .stat("relative")
        .await
        .unwrap_err()
        .is(FsErrorKind::Invalid));
    a.symlink("/loop2", "/loop1").await.unwrap();
    a.symlink("/loop1", "/loop2").await.unwrap();
    assert!(a.stat("/loop1").await.unwrap_err().is(FsErrorKind::Loop));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_server_killed_during_io_is_waited_for_and_nothing_is_lost() {
    let mut cluster = Cluster::start("client-kill");
    let c = cluster.client().await;
    let data = pattern(9, 8 << 20);
    let f = Arc::new(
        OpenOptions::new()
            .write(true)
            .create(true)
            .stripe_all()
            .stripe_size(1 << 20)
            .open(&c, "/big")
            .await
            .unwrap(),
    );
    f.write_at(0, &data).await.unwrap();
    f.fsync().await.unwrap();

    // Kill one server; start a write and a read that need it; bring it back.
    let victim = cluster.oss[1].take().unwrap();
    let addr = victim.nid.to_string().replace("@tcp", "");
    victim.kill();
    let writer = {
        let (f, d) = (f.clone(), pattern(10, 8 << 20));
        tokio::spawn(async move { f.write_at(8 << 20, &d).await.map(|_| ()) })
    };
    let reader = {
        let f = f.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8 << 20];
            f.read_at(0, &mut buf).await.map(|_| buf)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.oss[1] = Some(Cluster::oss(&cluster.root, &cluster.mds, 1, &addr));
    writer.await.unwrap().unwrap();
    assert!(
        reader.await.unwrap().unwrap() == data,
        "the read resent across the restart saw the data"
    );
    f.fsync().await.unwrap();
    let mut back = vec![0u8; 16 << 20];
    let g = OpenOptions::new().open(&c, "/big").await.unwrap();
    assert_eq!(g.read_at(0, &mut back).await.unwrap(), 16 << 20);
    assert!(back[..8 << 20] == data[..] && back[8 << 20..] == pattern(10, 8 << 20)[..]);

    // A server that stays dead is an error after the bounded retry, not a hang.
    let impatient = Client::connect_with(
        &cluster.mds_addr(),
        ClientConfig {
            retry_for: Duration::from_millis(500),
            ..config()
        },
    )
    .await
    .unwrap();
    cluster.oss[0].take().unwrap().kill();
    let h = OpenOptions::new().open(&impatient, "/big").await.unwrap();
    let t0 = Instant::now();
    let err = h.read_at(0, &mut back).await.unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "gave up after {:?}",
        t0.elapsed()
    );
    assert!(err.is(FsErrorKind::Io), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_a_checkpoint_see_one_whole_version_while_it_is_replaced() {
    let cluster = Cluster::start("client-ckpt");
    let writer = cluster.client().await;
    let size = (2 << 20) + 77;
    let write_version = |v: u8| {
        let c = writer.clone();
        async move {
            let tmp = format!("/ckpt.tmp.{v}");
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .stripe_all()
                .stripe_size(256 << 10)
                .open(&c, &tmp)
                .await
                .unwrap();
            f.write_at(0, &vec![v; size]).await.unwrap();
            f.fsync().await.unwrap();
            f.close().await.unwrap();
            c.rename(&tmp, "/ckpt").await.unwrap();
        }
    };
    write_version(1).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (addr, done) = (cluster.mds_addr(), done.clone());
            tokio::spawn(async move {
                let c = Client::connect_with(&addr, config()).await.unwrap();
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
                    let f = OpenOptions::new().open(&c, "/ckpt").await.unwrap();
                    let mut buf = vec![0u8; size + 1];
                    let n = f.read_at(0, &mut buf).await.unwrap();
                    assert_eq!(n, size, "a whole checkpoint");
                    let v = buf[0];
                    assert!(buf[..n].iter().all(|&b| b == v), "one version, not a mix");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for v in 2..8 {
        write_version(v).await;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for r in readers {
        assert!(r.await.unwrap() > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_open_file_stays_readable_until_closed() {
    let cluster = Cluster::start("client-unlinked");
    let c = cluster.client().await;
    let data = pattern(4, 3 << 20);
    let w = OpenOptions::new()
        .write(true)
        .create(true)
        .stripe_all()
        .stripe_size(1 << 20)
        .open(&c, "/doomed")
        .await
        .unwrap();
    w.write_at(0, &data).await.unwrap();
    w.close().await.unwrap();
    let f = OpenOptions::new().open(&c, "/doomed").await.unwrap();
    c.unlink("/doomed").await.unwrap();
    assert!(c
        .stat("/doomed")
        .await
        .unwrap_err()
        .is(FsErrorKind::NotFound));
    // Longer than a maintenance pass of the MDS, which destroys removed files' objects.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut back = vec![0u8; data.len()];
    assert_eq!(f.read_at(0, &mut back).await.unwrap(), data.len());
    assert!(back == data, "the open handle still reads the removed file");
    f.close().await.unwrap();
}

/// A file removed while open for writing, by this client or another, is still written, synced
/// and closed without error, and its handle reads what it wrote (POSIX keeps an unlinked open
/// file until its last close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_removed_while_open_for_writing_still_syncs_and_closes() {
    let cluster = Cluster::start("client-unlinked-writer");
    let (a, b) = (cluster.client().await, cluster.client().await);
    for (name, remover) in [("/by-other", &b), ("/by-self", &a)] {
        let first = pattern(5, 300_000);
        let w = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .open(&a, name)
            .await
            .unwrap();
        w.write_at(0, &first).await.unwrap();
        w.fsync().await.unwrap();
        remover.unlink(name).await.unwrap();
        let second = pattern(6, 200_000);
        w.write_at(first.len() as u64, &second).await.unwrap();
        w.fsync()
            .await
            .unwrap_or_else(|e| panic!("{name}: fsync after the unlink: {e}"));
        let mut back = vec![0u8; first.len() + second.len()];
        assert_eq!(w.read_at(0, &mut back).await.unwrap(), back.len(), "{name}");
        assert!(back[..first.len()] == first[..], "{name}: the first write");
        assert!(
            back[first.len()..] == second[..],
            "{name}: the second write"
        );
        w.close()
            .await
            .unwrap_or_else(|e| panic!("{name}: close after the unlink: {e}"));
        assert!(a.stat(name).await.unwrap_err().is(FsErrorKind::NotFound));
        assert!(b.stat(name).await.unwrap_err().is(FsErrorKind::NotFound));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_behind_and_readahead_stream_a_file_in_order() {
    let cluster = Cluster::start("client-stream");
    let c = cluster.client().await;
    let f = Arc::new(
        OpenOptions::new()
            .write(true)
            .create(true)
            .stripe_all()
            .stripe_size(256 << 10)
            .open(&c, "/stream")
            .await
            .unwrap(),
    );
    let data = pattern(3, (5 << 20) + 4321);
    let mut w = f.writer(0, 1 << 20, 3).unwrap();
    // Odd-sized pieces: the writer gathers them into 1 MiB transfers.
    for piece in data.chunks(77_777) {
        w.write(piece).await.unwrap();
    }
    assert_eq!(w.finish().await.unwrap(), data.len() as u64);
    f.fsync().await.unwrap();
    let g = Arc::new(OpenOptions::new().open(&c, "/stream").await.unwrap());
    let mut r = g.reader(0, 300_000, 4);
    let mut back = vec![];
    while let Some(chunk) = r.next_chunk().await.unwrap() {
        back.extend_from_slice(&chunk);
    }
    assert!(back == data, "{} bytes back of {}", back.len(), data.len());
}
