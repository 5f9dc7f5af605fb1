//! Leases with real processes: what one client caches under a lease is recalled before another
//! changes it (so the change shows at once, through the library and through a second mount),
//! and a client that never acknowledges a recall loses its leases without holding up the MDS
//! for longer than their term.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use lnet::call;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lode_tests::{mds_of, scratch, Server};
use proto::md::*;

fn cluster(name: &str) -> (std::path::PathBuf, Server, Server) {
    let root = scratch(name);
    let mds = mds_of(&root);
    let oss = Server::start(
        "lode-oss",
        &[
            "--data-dir",
            root.join("oss").to_str().unwrap(),
            "--mds",
            &mds.nid.to_string(),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .unwrap();
    (root, mds, oss)
}

async fn connect(mds: &proto::Nid) -> Client {
    let cfg = ClientConfig {
        security: Some(lode_tests::client_security()),
        retry_for: Duration::from_secs(30),
        ..Default::default()
    };
    Client::connect_with(&mds.to_string(), cfg).await.unwrap()
}

/// Waits until `c` holds leases (its channel is up).
async fn leased(c: &Client, probe: &str) {
    let t = Instant::now();
    while c.leases_held() == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "no lease granted");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = c.stat(probe).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_by_another_client_recalls_the_lease_and_shows_at_once() {
    let (root, mds, _oss) = cluster("leases-lib");
    let a = connect(&mds.nid).await;
    let b = connect(&mds.nid).await;
    a.mkdir("/d", 0o755).await.unwrap();
    OpenOptions::new()
        .write(true)
        .create(true)
        .open(&a, "/d/f")
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    leased(&a, "/d/f").await;
    // Answered from the cache now: a second stat and a negative lookup cost no round trip.
    assert!(a
        .stat("/d/x")
        .await
        .unwrap_err()
        .is(proto::FsErrorKind::NotFound));
    let f = a.stat("/d/f").await.unwrap();
    let held = a.leases_held();
    assert!(held >= 2, "the directory and the file are leased ({held})");
    let recalls = a.lease_recalls();

    for round in 0..20 {
        let name = format!("/d/x{round}");
        assert!(a.stat(&name).await.is_err());
        b.mkdir(&name, 0o700).await.unwrap();
        let seen = a.stat(&name).await.unwrap_or_else(|e| {
            panic!("round {round}: a change another client made is not seen at once: {e}")
        });
        assert_eq!(seen.kind, Kind::Dir);
    }
    b.setattr(
        "/d/f",
        SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(a.stat("/d/f").await.unwrap().mode, 0o600);
    b.rename("/d/f", "/d/g").await.unwrap();
    assert!(a.stat("/d/f").await.is_err());
    assert_eq!(a.stat("/d/g").await.unwrap().fid, f.fid);
    let names: Vec<Vec<u8>> = a
        .readdir("/d")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"g".to_vec()) && !names.contains(&b"f".to_vec()));
    assert!(a.lease_recalls() > recalls, "the leases were recalled");
    a.close().await.unwrap();
    b.close().await.unwrap();
    drop(mds);
    let _ = fs::remove_dir_all(&root);
}

/// A directory this client filled and holds alone, longer than its cache keeps a listing of:
/// reading it whole leaves the lease where it is (the MDS recalls a directory held alone from
/// any other reader, and each page says who reads it), so the creates there go on being
/// answered ahead, and the MDS grants no leases with the pages of such a directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_directory_held_alone_stays_held_through_its_own_listing() {
    let (root, mds, _oss) = cluster("leases-long-listing");
    let a = connect(&mds.nid).await;
    a.mkdir("/big", 0o755).await.unwrap();
    leased(&a, "/big").await;
    let dir = a.stat("/big").await.unwrap().fid;
    let n = proto::md::MAX_LEASED_LISTING + 100;
    let mut ahead = 0;
    for i in 0..n {
        let name = format!("f{i:06}");
        match a.create_ahead(dir, name.as_bytes(), 0o644, None).await {
            Some(r) => {
                r.unwrap();
                ahead += 1;
            }
            None => {
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .open(&a, &format!("/big/{name}"))
                    .await
                    .unwrap()
                    .close()
                    .await
                    .unwrap();
            }
        }
    }
    assert!(ahead > n / 2, "creates answered ahead: {ahead} of {n}");
    // The creates' answers in (with their leases), so that what the listing brings shows.
    a.sync_dir(dir).await.unwrap();
    let recalls = a.lease_recalls();
    let held = a.leases_held();
    let listed = a.readdir_plus(dir).await.unwrap();
    assert_eq!(listed.len(), n, "every file listed");
    assert!(listed.iter().all(|(e, i)| e.fid == i.fid));
    assert_eq!(a.lease_recalls(), recalls, "nothing was recalled");
    assert!(a.holds_lease(dir), "the directory is still held");
    assert!(
        a.create_ahead(dir, b"after", 0o644, None).await.is_some(),
        "and creates in it are still answered ahead"
    );
    assert!(
        a.leases_held() <= held + 1,
        "the listing brought no leases of its entries ({held} held before, {} after)",
        a.leases_held()
    );
    a.close().await.unwrap();
    drop(mds);
    let _ = fs::remove_dir_all(&root);
}

/// A directory one client holds alone, with an unlink it answered ahead not sent yet: another
/// client's `O_CREAT` of that name makes a new file (never opens the one removed), and its
/// exclusive create of it succeeds. The holder's changes come first, as before any read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_where_another_client_removed_the_name_ahead_makes_a_new_file() {
    let (root, mds, _oss) = cluster("leases-alone-create");
    let a = connect(&mds.nid).await;
    let b = connect(&mds.nid).await;
    a.mkdir("/d", 0o755).await.unwrap();
    leased(&a, "/d").await;
    let dir = a.stat("/d").await.unwrap().fid;
    let _ = b.stat("/d").await.unwrap();
    let mut ahead = 0;
    for i in 0..20 {
        let name = format!("f{i}");
        let path = format!("/d/{name}");
        let old = OpenOptions::new()
            .write(true)
            .create(true)
            .open(&a, path.as_str())
            .await
            .unwrap();
        let old_fid = old.inode().fid;
        old.close().await.unwrap();
        a.sync_dir(dir).await.unwrap();
        if !a.unlink_ahead(dir, name.as_bytes()).await {
            a.unlink(&path).await.unwrap();
        } else {
            ahead += 1;
        }
        // At once, while the unlink may still be on its way.
        let exclusive = i % 2 == 1;
        let made = OpenOptions::new()
            .write(true)
            .create(true)
            .create_new(exclusive)
            .open(&b, path.as_str())
            .await
            .unwrap_or_else(|e| panic!("{path} (exclusive: {exclusive}): {e}"));
        assert_ne!(
            made.inode().fid,
            old_fid,
            "{path}: the removed file was opened"
        );
        made.close().await.unwrap();
        assert_eq!(
            a.stat(&path).await.unwrap().fid,
            b.stat(&path).await.unwrap().fid
        );
    }
    assert!(ahead > 0, "no unlink was answered ahead");
    a.close().await.unwrap();
    b.close().await.unwrap();
    drop(mds);
    let _ = fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_begun_before_its_open_counts_only_if_the_open_finds_the_same_file() {
    let (root, mds, _oss) = cluster("leases-early");
    let a = connect(&mds.nid).await;
    let b = connect(&mds.nid).await;
    a.mkdir("/d", 0o755).await.unwrap();
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .open(&a, "/d/f")
        .await
        .unwrap();
    f.write_at(0, &[1u8; 5000]).await.unwrap();
    f.close().await.unwrap();
    leased(&a, "/d/f").await;
    let fid = a.stat("/d/f").await.unwrap().fid;
    assert!(
        b.read_early(fid, 65536).is_none(),
        "a client that holds neither the lease nor a grant reads nothing early"
    );

    // Nothing changed between: the bytes read early are the file's.
    let early = a
        .read_early(fid, 65536)
        .expect("leased, and granted at the create: read early");
    let opened = OpenOptions::new()
        .read(true)
        .open(&a, "/d/f")
        .await
        .unwrap();
    let got = early.take(&opened.inode()).await.expect("the same file");
    assert_eq!(&got[..], &[1u8; 5000][..]);
    opened.close().await.unwrap();
    assert!(
        a.read_early(fid, 4096).is_none(),
        "a file larger than asked for is not read early"
    );

    // Another client rewrites the same bytes between the read and the open: the read has the
    // old ones, and the open finds another file.
    for round in 0..3u8 {
        leased(&a, "/d/f").await;
        let early = a.read_early(fid, 65536).expect("read early");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let g = OpenOptions::new()
            .write(true)
            .open(&b, "/d/f")
            .await
            .unwrap();
        g.write_at(0, &[round + 2; 5000]).await.unwrap();
        g.close().await.unwrap();
        let opened = OpenOptions::new()
            .read(true)
            .open(&a, "/d/f")
            .await
            .unwrap();
        assert!(
            early.take(&opened.inode()).await.is_none(),
            "round {round}: bytes read before another client's change were used"
        );
        let mut buf = vec![0u8; 5000];
        assert_eq!(opened.read_at(0, &mut buf).await.unwrap(), 5000);
        assert!(buf.iter().all(|&x| x == round + 2), "round {round}");
        opened.close().await.unwrap();
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
    drop(mds);
    let _ = fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_ignores_recalls_loses_its_leases_and_holds_the_mds_up_for_a_term_at_most() {
    let (root, mds, _oss) = cluster("leases-deaf");
    let b = connect(&mds.nid).await;
    b.mkdir("/d", 0o755).await.unwrap();
    let dir = b.stat("/d").await.unwrap().fid;

    // A client that takes a lease and then never waits again (it never hears a recall).
    let deaf = TcpEndpoint::client(TcpConfig {
        security: lode_tests::client_security(),
        ..TcpConfig::default()
    });
    let id: u128 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let t = Duration::from_secs(10);
    call(&deaf, &mds.nid, &MdsConnect { client: id }, t)
        .await
        .unwrap();
    let wait = |acked: u64, epoch: u64| MdsLeaseWait {
        client: id,
        acked,
        epoch,
        nr: 0,
        cancel: vec![],
    };
    let getattr = || {
        let req = MdsGetattr {
            fid: dir,
            creds: Creds::root(),
            lease: Some(id),
        };
        let (deaf, nid) = (&deaf, &mds.nid);
        async move { call(deaf, nid, &req, t).await.unwrap() }
    };
    let first = call(&deaf, &mds.nid, &wait(0, 0), t).await.unwrap();
    call(&deaf, &mds.nid, &wait(0, first.epoch), t)
        .await
        .unwrap();
    let got = getattr().await;
    assert!(
        got.leased,
        "a client with a live channel is granted a lease"
    );

    // Another client's change waits for the deaf client's leases to run out, no longer.
    let start = Instant::now();
    b.mkdir("/d/sub", 0o755).await.unwrap();
    let waited = start.elapsed();
    let term = Duration::from_millis(LEASE_TERM_MS);
    assert!(
        waited <= term + Duration::from_secs(2),
        "the change waited {waited:?}, past the lease term {term:?}"
    );
    // Meanwhile the MDS answered others at once.
    let t0 = Instant::now();
    b.stat("/").await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1));

    // It lost every lease: its next wait tells it so, and it gets none until it says it saw.
    let again = call(&deaf, &mds.nid, &wait(0, first.epoch), t)
        .await
        .unwrap();
    assert_ne!(
        again.epoch, first.epoch,
        "the client was told it lost its leases"
    );
    let refused = getattr().await;
    assert!(!refused.leased, "no lease before it acknowledges the loss");
    call(&deaf, &mds.nid, &wait(again.seq, again.epoch), t)
        .await
        .unwrap();
    let back = getattr().await;
    assert!(back.leased, "leases again once the loss is acknowledged");
    // A later change is held up the same way, and only by this client.
    let start = Instant::now();
    b.rmdir("/d/sub").await.unwrap();
    assert!(start.elapsed() <= term + Duration::from_secs(2));
    b.close().await.unwrap();
    drop(mds);
    let _ = fs::remove_dir_all(&root);
}

fn mount(mds: &proto::Nid, at: &Path) -> Server {
    fs::create_dir_all(at).unwrap();
    let m = Server::start(
        "lode",
        &["--mds", &mds.to_string(), "mount", at.to_str().unwrap()],
    )
    .unwrap();
    m
}

/// Two mounts of one cluster, at `a` and `b`; unmounted, the cluster stopped and its files
/// removed when dropped. `None` without /dev/fuse or root.
struct TwoMounts {
    root: std::path::PathBuf,
    a: std::path::PathBuf,
    b: std::path::PathBuf,
    servers: Vec<Server>,
}

impl TwoMounts {
    fn start(name: &str) -> Option<TwoMounts> {
        // SAFETY: geteuid has no preconditions.
        if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs /dev/fuse and root");
            return None;
        }
        let (root, mds, oss) = cluster(name);
        let (a, b) = (root.join("a"), root.join("b"));
        let (ma, mb) = (mount(&mds.nid, &a), mount(&mds.nid, &b));
        Some(TwoMounts {
            root,
            a,
            b,
            servers: vec![ma, mb, oss, mds],
        })
    }
}

impl Drop for TwoMounts {
    fn drop(&mut self) {
        for m in [&self.a, &self.b] {
            let _ = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(m)
                .status();
        }
        self.servers.clear();
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Two mounts of one filesystem: what the first has cached (entries, absent names, and
/// attributes, the last with long kernel timeouts under its leases) is dropped when the second
/// changes it, so the first sees every change at once, not after a cache timeout.
#[test]
fn a_second_mounts_change_shows_at_once_on_the_first() {
    let Some(two) = TwoMounts::start("leases-mount") else {
        return;
    };
    let (a, b) = (&two.a, &two.b);
    fs::create_dir(a.join("d")).unwrap();
    fs::write(a.join("d/f"), b"one").unwrap();
    let listing = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    // The first mount's caches: the directory read (twice: the second listing comes from the
    // kernel's cache of it), the file's attributes, absent names (twice: the second from the
    // kernel's negative entry).
    for round in 0..30 {
        let x = format!("d/x{round}");
        assert!(fs::metadata(a.join(&x)).is_err());
        assert!(fs::metadata(a.join(&x)).is_err());
        assert_eq!(fs::metadata(a.join("d/f")).unwrap().len(), 3);
        assert_eq!(listing(&a.join("d")).len(), round + 1);
        assert_eq!(listing(&a.join("d")).len(), round + 1);
        // The change through the second mount...
        fs::write(b.join(&x), b"new").unwrap();
        // ...shows on the first at once.
        let m = fs::metadata(a.join(&x)).unwrap_or_else(|e| {
            panic!("round {round}: {x} made on the other mount is not seen: {e}")
        });
        assert_eq!(m.len(), 3);
        let listed = listing(&a.join("d"));
        assert!(
            listed.contains(&format!("x{round}")),
            "round {round}: {listed:?}"
        );
        // A change through the first mount itself shows in its next listing too.
        let mine = a.join(format!("d/mine{round}"));
        fs::write(&mine, b"").unwrap();
        assert!(listing(&a.join("d")).contains(&format!("mine{round}")));
        fs::remove_file(&mine).unwrap();
        assert!(!listing(&a.join("d")).contains(&format!("mine{round}")));
    }
    fs::write(b.join("d/f"), b"longer now").unwrap();
    assert_eq!(fs::metadata(a.join("d/f")).unwrap().len(), 10);
    fs::set_permissions(b.join("d"), fs::Permissions::from_mode(0o711)).unwrap();
    assert_eq!(fs::metadata(a.join("d")).unwrap().mode() & 0o777, 0o711);
    let _ = (listing(&a.join("d")), listing(&a.join("d")));
    fs::rename(b.join("d/f"), b.join("d/g")).unwrap();
    let listed = listing(&a.join("d"));
    assert!(listed.contains(&"g".to_string()) && !listed.contains(&"f".to_string()));
    assert!(fs::metadata(a.join("d/f")).is_err());
    assert_eq!(fs::read(a.join("d/g")).unwrap(), b"longer now");
    let _ = listing(&a.join("d"));
    fs::remove_file(b.join("d/g")).unwrap();
    assert!(!listing(&a.join("d")).contains(&"g".to_string()));
    assert!(fs::metadata(a.join("d/g")).is_err());
}

/// The first mount keeps a file's pages across its opens while it holds the file's lease; a
/// second mount that overwrites the file in place (same size: only the mtime changes at the
/// MDS) and closes it recalls that lease, so the first mount's next open reads the new bytes
/// (close-to-open), never the pages it kept; a handle it held open across that close reads
/// them too, its pages dropped with the lease.
#[test]
fn pages_kept_across_opens_give_way_to_another_mounts_write_at_its_close() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let Some(two) = TwoMounts::start("leases-pages") else {
        return;
    };
    let (a, b) = (&two.a, &two.b);
    let version = |v: u8| -> Vec<u8> { (0..200_000u32).map(|i| (i as u8) ^ v).collect() };
    fs::write(a.join("p"), version(0)).unwrap();
    for round in 1..=20u8 {
        // Read twice through the first mount: the second open may keep the pages.
        assert!(
            fs::read(a.join("p")).unwrap() == version(round - 1),
            "round {round}"
        );
        assert!(
            fs::read(a.join("p")).unwrap() == version(round - 1),
            "round {round}"
        );
        // An open handle on the first mount across the other mount's write and close.
        let held = fs::File::open(a.join("p")).unwrap();
        let mut w = fs::OpenOptions::new()
            .write(true)
            .open(b.join("p"))
            .unwrap();
        w.write_all(&version(round)).unwrap();
        drop(w);
        // The handle held open across the other mount's close reads the new bytes too: the
        // close recalled the lease, and its pages were dropped with it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let mut seen = vec![0u8; 200_000];
            held.read_exact_at(&mut seen, 0).unwrap();
            if seen == version(round) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: a handle open across the other mount's close still reads the \
                 pages of the older version"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        drop(held);
        let got = fs::read(a.join("p")).unwrap();
        assert!(
            got == version(round),
            "round {round}: the first mount read {} bytes of an older version",
            got.len()
        );
    }
}

/// Small files a mount creates and writes are closed behind their callers: their last writes
/// land, and their sizes are published, after close returns. A second mount that opens one
/// right after the close still reads every byte and the size (close-to-open), and so does the
/// first mount itself; a close whose writes then fail reports nothing itself: the failure
/// waits for the directory's fsync, and no size is published over bytes that were not kept.
#[test]
fn small_files_closed_behind_show_whole_at_once_and_their_failures_wait_for_fsync() {
    use std::io::Write;
    let Some(mut two) = TwoMounts::start("leases-close-behind") else {
        return;
    };
    let (a, b) = (two.a.clone(), two.b.clone());
    fs::create_dir(a.join("d")).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut made = vec![];
    for i in 0..240 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes: Vec<u8> = (0..x % 70_000).map(|j| (j ^ x) as u8).collect();
        let name = format!("d/f{i}");
        fs::write(a.join(&name), &bytes).unwrap();
        let same = |got: Vec<u8>, on: &str| {
            assert!(
                got == bytes,
                "{name} read on {on} right after its close: {} bytes, {} written",
                got.len(),
                bytes.len()
            )
        };
        match i % 4 {
            // The other mount, right after the close.
            0 => same(fs::read(b.join(&name)).unwrap(), "b"),
            1 => assert_eq!(
                fs::metadata(b.join(&name)).unwrap().len(),
                bytes.len() as u64
            ),
            // This mount, right after the close.
            2 => same(fs::read(a.join(&name)).unwrap(), "a"),
            _ => assert_eq!(
                fs::metadata(a.join(&name)).unwrap().len(),
                bytes.len() as u64
            ),
        }
        made.push(bytes);
    }
    // Renamed and listed right after their closes.
    for (i, bytes) in made.iter().enumerate().take(40) {
        fs::write(a.join(format!("d/g{i}")), bytes).unwrap();
        fs::rename(a.join(format!("d/g{i}")), a.join(format!("d/h{i}"))).unwrap();
    }
    let sizes: std::collections::HashMap<String, u64> = fs::read_dir(b.join("d"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    for (i, bytes) in made.iter().enumerate() {
        assert_eq!(sizes[&format!("f{i}")], bytes.len() as u64, "f{i}");
        if i < 40 {
            assert_eq!(sizes[&format!("h{i}")], bytes.len() as u64, "h{i}");
            assert!(
                &fs::read(b.join(format!("d/h{i}"))).unwrap() == bytes,
                "h{i}"
            );
        }
    }

    // A file removed while open: its close behind has no one to publish to, and the next
    // fsync (of another file) reports nothing.
    let mut gone = fs::File::create(a.join("d/gone")).unwrap();
    fs::remove_file(a.join("d/gone")).unwrap();
    gone.write_all(b"bytes").unwrap();
    drop(gone);
    fs::File::open(a.join("d/f0")).unwrap().sync_all().unwrap();

    // The storage server goes away after a file's create was answered and before its bytes
    // were sent: the close still returns at once, the directory's fsync reports the loss, and
    // the file shows empty rather than as zeros.
    fs::create_dir(a.join("e")).unwrap();
    fs::write(a.join("e/first"), b"").unwrap();
    let mut f = fs::File::create(a.join("e/x")).unwrap();
    // Its create answered (a stat of the file waits for it).
    assert_eq!(fs::metadata(a.join("e/x")).unwrap().len(), 0);
    two.servers.remove(2).kill();
    f.write_all(&[5u8; 4096]).unwrap();
    let closed = Instant::now();
    drop(f);
    assert!(
        closed.elapsed() < Duration::from_secs(5),
        "the close waited"
    );
    let err = fs::File::open(a.join("e")).unwrap().sync_all().unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EIO),
        "fsync of the directory: {err}"
    );
    assert_eq!(fs::metadata(b.join("e/x")).unwrap().len(), 0);
    assert_eq!(fs::metadata(a.join("e/x")).unwrap().len(), 0);
}
