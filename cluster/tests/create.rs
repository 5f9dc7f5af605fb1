//! The create path as the network sees it: opening a file of a known directory with `O_CREAT`
//! (as the mount does, and `OpenOptions::open` of an `At::Entry`) costs one round trip to the MDS whether the
//! file is new or already there (a checkpoint rewritten in place); with leases, creates in a
//! directory the client holds cost none, and reach the MDS in batches.

use proto::FsErrorKind;
use std::sync::Arc;
use std::time::Duration;

use client::{ClientConfig, OpenOptions};
use cluster::{ClusterBuilder, Network};
use lnet::sim::{Fabric, LinkParams};
use oss::engine::mem::MemEngine;
use proto::fid::ROOT;

/// Requests the client named `from` sent the MDS so far.
fn requests_to_mds(fabric: &Fabric, from: &str) -> usize {
    fabric
        .trace()
        .iter()
        .filter(|e| e.from == from && e.to == "mds" && e.kind == "request")
        .count()
}

/// A cluster of one storage server on a simulated fabric seeded `seed`, in a fresh scratch
/// directory named after `name`.
async fn on_fabric(name: &str, seed: u64) -> (cluster::Cluster, Fabric, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("lode-cluster-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fabric = Fabric::new(seed);
    let cluster = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .start()
        .await
        .unwrap();
    (cluster, fabric, dir)
}

/// Makes directory `path` with `c` and waits until its lease channel is up (once a wait was
/// answered, a stat leases the directory).
async fn mkdir_leased(c: &client::Client, path: &str) {
    c.mkdir(path, 0o755).await.unwrap();
    let up = tokio::time::Instant::now();
    while c.leases_held() == 0 && up.elapsed() < Duration::from_secs(5) {
        let _ = c.stat(path).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Client "a", answering changes ahead, holding directory `/d` alone: its first create there,
/// `/d/{first}`, read the directory and took FIDs, and was answered.
async fn ahead_in_d(cluster: &cluster::Cluster, first: &str) -> client::Client {
    let ahead = ClientConfig {
        ahead: true,
        ..ClientConfig::default()
    };
    let a = cluster.client("a", ahead).await.unwrap();
    cluster
        .wait_ready(&a, 1, Duration::from_secs(10))
        .await
        .unwrap();
    mkdir_leased(&a, "/d").await;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&a, &format!("/d/{first}"))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    a.settle_ahead().await.unwrap();
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o_creat_is_one_round_trip_for_a_new_file_and_for_an_existing_one() {
    let dir = std::env::temp_dir().join(format!("lode-cluster-create-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fabric = Fabric::new(3);
    let cluster = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .start()
        .await
        .unwrap();
    // Without leases: every create is sent and waited for.
    let cfg = ClientConfig {
        leases: false,
        ..ClientConfig::default()
    };
    let c = cluster.client("client", cfg).await.unwrap();
    cluster
        .wait_ready(&c, 1, Duration::from_secs(10))
        .await
        .unwrap();
    let create = OpenOptions::new().write(true).create(true).truncate(false);

    let before = requests_to_mds(&fabric, "client");
    let f = create
        .open(
            &c,
            client::At::Entry {
                parent: ROOT,
                name: b"ckpt",
            },
        )
        .await
        .unwrap();
    assert_eq!(requests_to_mds(&fabric, "client") - before, 1, "a new file");
    let objects = f.inode().layout.unwrap().components[0].objects.clone();
    f.write_at(0, b"version 1").await.unwrap();
    f.close().await.unwrap();

    let before = requests_to_mds(&fabric, "client");
    let f = create
        .open(
            &c,
            client::At::Entry {
                parent: ROOT,
                name: b"ckpt",
            },
        )
        .await
        .unwrap();
    assert_eq!(
        requests_to_mds(&fabric, "client") - before,
        1,
        "an existing file"
    );
    assert_eq!(
        f.inode().layout.unwrap().components[0].objects,
        objects,
        "the same file, not a new one"
    );
    let mut back = [0u8; 9];
    assert_eq!(f.read_at(0, &mut back).await.unwrap(), 9);
    assert_eq!(&back, b"version 1");
    f.close().await.unwrap();

    // Opening it by FID (as the mount does for a name the kernel looked up): one round trip,
    // with the file's attributes as of the open.
    let fid = c.stat("/ckpt").await.unwrap().fid;
    let before = requests_to_mds(&fabric, "client");
    let g = OpenOptions::new().read(true).open(&c, fid).await.unwrap();
    assert_eq!(
        requests_to_mds(&fabric, "client") - before,
        1,
        "an open by FID"
    );
    assert_eq!(g.inode().size, 9);
    g.close().await.unwrap();

    // O_EXCL still refuses it.
    let excl = OpenOptions::new().write(true).create_new(true);
    assert!(excl
        .open(&c, "/ckpt")
        .await
        .unwrap_err()
        .is(FsErrorKind::Exists));
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_a_leased_directory_are_answered_ahead_and_sent_in_batches() {
    let (cluster, fabric, dir) = on_fabric("ahead", 3).await;
    // The first create reads the directory and takes FIDs; the next ones are answered here.
    let a = ahead_in_d(&cluster, "f0").await;
    let b = cluster.client("b", ClientConfig::default()).await.unwrap();
    let create = OpenOptions::new().write(true).create_new(true);
    let before = requests_to_mds(&fabric, "a");
    const N: usize = 200;
    for i in 1..N {
        let f = create.open(&a, &format!("/d/f{i}")).await.unwrap();
        f.close().await.unwrap();
    }
    a.settle_ahead().await.unwrap();
    let sent = requests_to_mds(&fabric, "a") - before;
    assert!(
        sent < N / 4,
        "{} creates and closes took {sent} requests",
        N - 1
    );
    // Closed before or after their creates were sent: no open is left counted but those
    // kept past their close for the next open.
    assert_eq!(cluster.mds().open_handles(), a.kept_opens());
    // Another client sees every one; O_EXCL on one of them fails there and here.
    let names = b.readdir("/d").await.unwrap();
    assert_eq!(names.len(), N);
    assert!(create
        .open(&a, "/d/f7")
        .await
        .unwrap_err()
        .is(FsErrorKind::Exists));
    // A file created ahead is written and read back once its objects come.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&a, "/d/data")
        .await
        .unwrap();
    f.write_at(0, b"ahead").await.unwrap();
    f.close().await.unwrap();
    let g = OpenOptions::new().open(&b, "/d/data").await.unwrap();
    let mut back = [0u8; 5];
    assert_eq!(g.read_at(0, &mut back).await.unwrap(), 5);
    assert_eq!(&back, b"ahead");
    g.close().await.unwrap();
    // Unlinks too: answered here, seen by the other client once settled.
    for i in 0..N {
        a.unlink(&format!("/d/f{i}")).await.unwrap();
    }
    a.sync().await.unwrap();
    assert_eq!(b.readdir("/d").await.unwrap().len(), 1);
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client far ahead of a slow MDS: more creates answered and on their way than two of the
/// ranges of FIDs set aside for it. The MDS keeps only its last few ranges, so the client must
/// not ask for one more before the creates from the range it pushes out have been answered:
/// none of them may be refused after it was answered here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_far_ahead_of_a_slow_mds_all_land() {
    let (cluster, fabric, dir) = on_fabric("far-ahead", 11).await;
    let a = ahead_in_d(&cluster, "f0").await;
    // Requests held back at random, later ones overtaking them: as a batch the MDS is still
    // working through when the next request, on another task, is already done.
    fabric
        .set_link(
            "a",
            "mds",
            LinkParams {
                reorder: 0.5,
                reorder_window: Duration::from_millis(100),
                ..LinkParams::default()
            },
        )
        .unwrap();
    let n = proto::md::RESERVATIONS_KEPT * proto::md::MAX_RESERVE as usize + 2_000;
    let create = OpenOptions::new().write(true).create_new(true);
    let mut most = 0;
    for i in 1..n {
        let f = create.open(&a, &format!("/d/f{i}")).await.unwrap();
        f.close().await.unwrap();
        most = most.max(a.unanswered());
    }
    assert!(
        most > proto::md::MAX_RESERVE as u64,
        "the client ran only {most} changes ahead"
    );
    a.settle_ahead().await.unwrap();
    assert!(
        a.sync().await.is_ok(),
        "a create answered ahead failed at the MDS"
    );
    let b = cluster.client("b", ClientConfig::default()).await.unwrap();
    assert_eq!(b.readdir("/d").await.unwrap().len(), n);
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_answered_ahead_are_seen_at_once_by_a_client_without_leases() {
    let dir = std::env::temp_dir().join(format!("lode-cluster-alone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fabric = Fabric::new(4);
    let cluster = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .start()
        .await
        .unwrap();
    let a = cluster.client("a", ClientConfig::default()).await.unwrap();
    // No cache at all: every lookup and listing is the MDS's answer.
    let plain = ClientConfig {
        leases: false,
        ..ClientConfig::default()
    };
    let b = cluster.client("b", plain).await.unwrap();
    cluster
        .wait_ready(&a, 1, Duration::from_secs(10))
        .await
        .unwrap();
    a.mkdir("/d", 0o755).await.unwrap();
    let up = tokio::time::Instant::now();
    while a.leases_held() == 0 && up.elapsed() < Duration::from_secs(5) {
        let _ = a.stat("/d").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let create = OpenOptions::new().write(true).create_new(true);
    create
        .open(&a, "/d/first")
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    a.settle_ahead().await.unwrap();
    // Alone in the directory, A answers creates itself and sends them in batches...
    let before = requests_to_mds(&fabric, "a");
    for i in 0..100 {
        let f = create.open(&a, &format!("/d/f{i}")).await.unwrap();
        f.close().await.unwrap();
    }
    let sent = requests_to_mds(&fabric, "a") - before;
    assert!(sent < 50, "100 creates and closes took {sent} requests");
    // ...and B, asking the MDS with no lease of its own, sees every one at once: the MDS
    // recalls A's lease first, and A sends what it queued before acknowledging.
    assert_eq!(b.readdir("/d").await.unwrap().len(), 101);
    // Each change, read by B the moment A answered it, in turn.
    for i in 0..20 {
        let name = format!("/d/g{i}");
        create.open(&a, &name).await.unwrap().close().await.unwrap();
        b.stat(&name)
            .await
            .unwrap_or_else(|e| panic!("{name}, answered to A, not seen by B: {e}"));
        a.unlink(&name).await.unwrap();
        let gone = b.stat(&name).await.unwrap_err();
        assert!(
            gone.is(FsErrorKind::NotFound),
            "{name} after A's unlink: {gone}"
        );
        a.unlink(&format!("/d/f{i}")).await.unwrap();
        let listed = b.readdir("/d").await.unwrap().len();
        assert_eq!(listed, 100 - i, "B's listing after A's unlink of f{i}");
    }
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Files made while the MDS is bringing its targets into service (cleaning up each target's
/// orphans, then precreating) keep their objects: however many maintenance passes requests
/// and the MDS's own timer start at once, a target is cleaned up once, before any of its
/// objects is handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_made_while_targets_come_into_service_keep_their_objects() {
    for round in 0..4 {
        let dir =
            std::env::temp_dir().join(format!("lode-cluster-first-{}-{round}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The MDS's messages to the storage servers are held back at random, so that one
        // sent later may overtake one sent earlier, as on a congested network.
        let fabric = Fabric::new(round);
        let mut b = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
            .heartbeat(Duration::from_millis(20), Duration::from_secs(2))
            .maintain_every(Duration::from_millis(5));
        for i in 0..3 {
            b = b.storage_server(vec![
                Arc::new(MemEngine::new(1 << 28)),
                Arc::new(MemEngine::new(1 << 28)),
            ]);
            fabric
                .set_link(
                    "mds",
                    &format!("oss{i}"),
                    LinkParams {
                        reorder: 0.5,
                        reorder_window: Duration::from_millis(40),
                        ..LinkParams::default()
                    },
                )
                .unwrap();
        }
        let cluster = b.start().await.unwrap();
        let mut writers = vec![];
        for w in 0..6 {
            // Each create is its own request to the MDS, and starts a pass while no target
            // is in service.
            let cfg = ClientConfig {
                leases: false,
                ..ClientConfig::default()
            };
            let c = cluster.client(&format!("w{w}"), cfg).await.unwrap();
            writers.push(tokio::spawn(async move {
                for i in 0..12 {
                    let path = format!("/f-{w}-{i}");
                    let f = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .open(&c, &path)
                        .await
                        .unwrap();
                    f.write_at(0, path.as_bytes())
                        .await
                        .unwrap_or_else(|e| panic!("writing {path} (round {round}): {e}"));
                    f.close().await.unwrap();
                }
                c
            }));
        }
        let mut clients = vec![];
        for w in writers {
            clients.push(w.await.unwrap());
        }
        // Later passes clean nothing up again.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (w, c) in clients.iter().enumerate() {
            for i in 0..12 {
                let path = format!("/f-{w}-{i}");
                let f = OpenOptions::new().read(true).open(c, &path).await.unwrap();
                let mut back = vec![0u8; path.len()];
                f.read_at(0, &mut back)
                    .await
                    .unwrap_or_else(|e| panic!("reading {path} (round {round}): {e}"));
                assert_eq!(back, path.as_bytes());
            }
        }
        cluster.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A client's own changes in a directory it holds bring the directory's new attributes with
/// their answers: a stat of the directory right after needs nothing from the MDS, and shows
/// what another client reads there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_changed_here_is_stat_from_the_answers_of_its_changes() {
    let (cluster, fabric, dir) = on_fabric("after", 5).await;
    let a = cluster
        .client("client", ClientConfig::default())
        .await
        .unwrap();
    let b = cluster
        .client(
            "other",
            ClientConfig {
                leases: false,
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    cluster
        .wait_ready(&a, 1, Duration::from_secs(10))
        .await
        .unwrap();
    mkdir_leased(&a, "/d").await;
    // The stat is made with the MDS out of reach: only the cache can answer it.
    let stat_alone = |what: &'static str| {
        let (a, fabric) = (a.clone(), fabric.clone());
        async move {
            fabric.partition("client", "mds");
            let st = tokio::time::timeout(Duration::from_secs(2), a.stat("/d")).await;
            fabric.heal();
            st.unwrap_or_else(|_| panic!("a stat after {what} asked the MDS"))
                .unwrap()
        }
    };
    let create = OpenOptions::new().write(true).create_new(true);
    for name in ["/d/f0", "/d/f1"] {
        create.open(&a, name).await.unwrap().close().await.unwrap();
    }
    a.settle_ahead().await.unwrap();
    let created = stat_alone("creates answered ahead").await;
    a.mkdir("/d/sub", 0o755).await.unwrap();
    a.unlink("/d/f0").await.unwrap();
    a.settle_ahead().await.unwrap();
    let st = stat_alone("a mkdir and an unlink").await;
    assert!(st.mtime >= created.mtime);
    assert_eq!(st.nlink, created.nlink + 1, "the new subdirectory's link");
    let there = b.stat("/d").await.unwrap();
    assert_eq!(
        (st.mtime, st.ctime, st.nlink, st.size),
        (there.mtime, there.ctime, there.nlink, there.size)
    );
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file created ahead is its own attributes until the MDS answers: no other client can have
/// seen it, so a look at its extended attributes (the kernel's, before every write) waits for
/// nothing. Once the answer came they are the lease cache's or the MDS's again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_created_ahead_is_its_own_attributes_until_the_mds_answers() {
    let (cluster, fabric, dir) = on_fabric("made-here", 7).await;
    let a = cluster
        .client("client", ClientConfig::default())
        .await
        .unwrap();
    cluster
        .wait_ready(&a, 1, Duration::from_secs(10))
        .await
        .unwrap();
    mkdir_leased(&a, "/d").await;
    let create = OpenOptions::new().write(true).create_new(true);
    // The first create sets FIDs aside for this client; the next needs the MDS for nothing.
    let first = create.open(&a, "/d/first").await.unwrap();
    a.settle_ahead().await.unwrap();
    assert!(first.made_here().is_none(), "answered");
    first.close().await.unwrap();
    fabric.partition("client", "mds");
    let f = tokio::time::timeout(Duration::from_secs(2), create.open(&a, "/d/new"))
        .await
        .expect("a create in a leased directory asked the MDS")
        .unwrap();
    let made = f
        .made_here()
        .expect("no answer yet: the attributes made here");
    assert_eq!(made.fid, f.fid());
    assert!(made.xattrs.is_empty());
    assert!(made.layout.is_none(), "the layout comes with the answer");
    fabric.heal();
    a.settle_ahead().await.unwrap();
    assert!(f.made_here().is_none(), "answered");
    // The MDS stamped the create with the times the caller was shown, as another client
    // finds them.
    let b = cluster
        .client("other", ClientConfig::default())
        .await
        .unwrap();
    let seen = b.stat("/d/new").await.unwrap();
    assert_eq!(
        (seen.mtime, seen.ctime, seen.atime),
        (made.mtime, made.ctime, made.atime),
        "the MDS's times are the ones made here"
    );
    f.write_at(0, b"landed").await.unwrap();
    f.close().await.unwrap();
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_closed_under_its_lease_opens_again_without_the_mds_until_it_moves_on() {
    let (cluster, fabric, dir) = on_fabric("kept", 5).await;
    // Pings sweep kept handles of no use: often here, so that a removal's shows soon.
    let pinging = ClientConfig {
        ping_every: Duration::from_millis(200),
        ..ClientConfig::default()
    };
    let a = cluster.client("a", pinging).await.unwrap();
    let b = cluster.client("b", ClientConfig::default()).await.unwrap();
    cluster
        .wait_ready(&a, 1, Duration::from_secs(10))
        .await
        .unwrap();
    mkdir_leased(&a, "/d").await;
    let read = OpenOptions::new().read(true);
    let rw = OpenOptions::new().read(true).write(true);
    let f = rw.clone().create(true).open(&a, "/d/k").await.unwrap();
    f.write_at(0, b"first").await.unwrap();
    f.close().await.unwrap();
    a.settle_ahead().await.unwrap();
    read.open(&a, "/d/k").await.unwrap().close().await.unwrap();
    assert!(
        a.kept_opens() >= 1,
        "a close under the file's lease keeps its handle"
    );
    assert_eq!(cluster.mds().open_handles(), a.kept_opens());

    // Opened again here: no request to the MDS, and the bytes are those written.
    let mut buf = [0u8; 16];
    let before = requests_to_mds(&fabric, "a");
    let f = read.open(&a, "/d/k").await.unwrap();
    assert_eq!(
        requests_to_mds(&fabric, "a"),
        before,
        "an open of a kept handle"
    );
    let n = f.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"first");
    f.close().await.unwrap();

    // Another client's write recalls the lease: the next open asks the MDS and sees it
    // (close-to-open).
    let w = OpenOptions::new()
        .write(true)
        .open(&b, "/d/k")
        .await
        .unwrap();
    w.write_at(0, b"SECOND!").await.unwrap();
    w.close().await.unwrap();
    let before = requests_to_mds(&fabric, "a");
    let f = read.open(&a, "/d/k").await.unwrap();
    assert!(
        requests_to_mds(&fabric, "a") > before,
        "the lease was recalled"
    );
    let n = f.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"SECOND!");
    f.close().await.unwrap();

    // A handle kept for reading does not serve a write; one kept for writing does.
    rw.open(&a, "/d/k").await.unwrap().close().await.unwrap();
    let before = requests_to_mds(&fabric, "a");
    rw.open(&a, "/d/k").await.unwrap().close().await.unwrap();
    assert_eq!(
        requests_to_mds(&fabric, "a"),
        before,
        "a kept handle for writing"
    );

    // This client's own truncate moves the file on too: a handle kept from before it would
    // publish its next size under the old generation, which the MDS would ignore.
    let attr = proto::md::SetAttr {
        size: Some(0),
        ..Default::default()
    };
    a.setattr("/d/k", attr).await.unwrap();
    let f = rw.open(&a, "/d/k").await.unwrap();
    f.write_at(0, b"xy").await.unwrap();
    f.close().await.unwrap();
    a.settle_ahead().await.unwrap();
    assert_eq!(b.stat("/d/k").await.unwrap().size, 2);
    assert_eq!(a.stat("/d/k").await.unwrap().size, 2);

    // Another user's open takes no handle kept for this one.
    let other = a.as_user(proto::md::Creds {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    });
    let before = requests_to_mds(&fabric, "a");
    let f = read.open(&other, "/d/k").await.unwrap();
    assert!(
        requests_to_mds(&fabric, "a") > before,
        "another user's open asks the MDS"
    );
    f.close().await.unwrap();

    // Another client removes the file: the next ping closes the handles kept for it here, so
    // its objects go.
    rw.open(&a, "/d/k").await.unwrap().close().await.unwrap();
    let kept = a.kept_opens();
    b.unlink("/d/k").await.unwrap();
    let up = tokio::time::Instant::now();
    while a.kept_opens() >= kept && up.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(a.kept_opens() < kept, "the recall closed the kept handle");
    a.settle_ahead().await.unwrap();
    assert_eq!(
        cluster.mds().open_handles(),
        a.kept_opens() + b.kept_opens()
    );

    // Leaving closes every kept handle: what the MDS still counts is the other client's.
    a.close().await.unwrap();
    assert_eq!(a.kept_opens(), 0);
    assert_eq!(cluster.mds().open_handles(), b.kept_opens());
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_of_a_file_created_ahead_waits_for_its_create_and_asks_nothing_more() {
    let (cluster, fabric, dir) = on_fabric("ahead-lookup", 6).await;
    let a = ahead_in_d(&cluster, "first").await;
    let create = OpenOptions::new().write(true).create_new(true);
    let d = a.stat("/d").await.unwrap().fid;
    for i in 0..20 {
        let name = format!("n{i}");
        let f = create.open(&a, &format!("/d/{name}")).await.unwrap();
        let fid = f.fid();
        f.close().await.unwrap();
        // The create is still queued: the lookup takes its answer, and sends no lookup of
        // its own behind it.
        let before = requests_to_mds(&fabric, "a");
        let found = a.lookup(d, name.as_bytes()).await.unwrap();
        assert_eq!(found.fid, fid);
        assert!(
            requests_to_mds(&fabric, "a") - before <= 1,
            "a lookup of {name} sent more than the queued create"
        );
    }
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlink_of_a_file_whose_create_is_still_queued_is_answered_ahead_too() {
    let (cluster, _fabric, dir) = on_fabric("ahead-unlink", 8).await;
    let a = ahead_in_d(&cluster, "first").await;
    let b = cluster.client("b", ClientConfig::default()).await.unwrap();
    let create = OpenOptions::new().write(true).create_new(true);
    let d = a.stat("/d").await.unwrap().fid;
    let mut queued = 0;
    for i in 0..20 {
        let name = format!("u{i}");
        let f = create.open(&a, &format!("/d/{name}")).await.unwrap();
        if i % 2 == 1 {
            f.write_at(0, b"some bytes").await.unwrap();
        }
        f.close().await.unwrap();
        queued += usize::from(a.unanswered() > 0);
        // Its create's answer brings the file's lease: the unlink need not go alone.
        assert!(
            a.unlink_ahead(d, name.as_bytes()).await,
            "the unlink of {name} was sent alone"
        );
    }
    assert!(
        queued > 0,
        "no create was still queued at its file's unlink"
    );
    a.settle_ahead().await.unwrap();
    for i in 0..20 {
        let e = b.stat(&format!("/d/u{i}")).await.unwrap_err();
        assert!(e.is(FsErrorKind::NotFound), "u{i}: {e}");
    }
    b.stat("/d/first").await.unwrap();
    assert!(a.sync().await.is_ok(), "no change failed");
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_made_or_closed_behind_here_is_kept_for_its_next_open() {
    let (cluster, fabric, dir) = on_fabric("kept-ahead", 7).await;
    let a = ahead_in_d(&cluster, "first").await;
    let b = cluster.client("b", ClientConfig::default()).await.unwrap();
    let create = OpenOptions::new().write(true).create_new(true);
    let read = OpenOptions::new().read(true);
    let kept = a.kept_opens();

    // Created ahead and closed unused, as a mount's release closes it: its handle waits for
    // the create's answer and is kept.
    let f = create.open(&a, "/d/empty").await.unwrap();
    assert!(!f.answered(), "created ahead");
    f.close_unwaited().await.unwrap();
    assert_eq!(
        a.kept_opens(),
        kept + 1,
        "the handle of a file made here is kept"
    );

    // Created ahead, written and closed behind its caller: kept too, once its size is in.
    let f = Arc::new(create.open(&a, "/d/made").await.unwrap());
    f.write_at(0, b"made here").await.unwrap();
    let behind = f
        .close_behind()
        .expect("a small file made here closes behind");
    behind.finish(Ok(())).await;
    let f = Arc::into_inner(f).expect("the last reference");
    f.close_unwaited().await.unwrap();
    assert_eq!(a.kept_opens(), kept + 2);
    assert_eq!(
        cluster.mds().open_handles(),
        a.kept_opens(),
        "kept handles stay counted"
    );

    // Opened again here: neither open asks the MDS, and the bytes are those written.
    let before = requests_to_mds(&fabric, "a");
    let f = read.open(&a, "/d/made").await.unwrap();
    let e = read.open(&a, "/d/empty").await.unwrap();
    assert_eq!(
        requests_to_mds(&fabric, "a"),
        before,
        "opens of kept handles"
    );
    let mut buf = [0u8; 16];
    let n = f.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"made here");
    assert_eq!(e.read_at(0, &mut buf).await.unwrap(), 0);
    f.close().await.unwrap();
    e.close().await.unwrap();

    // Another client sees the file as closed (close-to-open), its open recalling the lease.
    let g = read.open(&b, "/d/made").await.unwrap();
    let n = g.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"made here");
    g.close().await.unwrap();

    a.close().await.unwrap();
    assert_eq!(cluster.mds().open_handles(), b.kept_opens());
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_writes_that_all_miss_the_target_list_read_it_once() {
    let (cluster, fabric, dir) = on_fabric("targets-once", 9).await;
    let c = cluster.client("c", ClientConfig::default()).await.unwrap();
    cluster
        .wait_ready(&c, 1, Duration::from_secs(10))
        .await
        .unwrap();
    c.mkdir("/w", 0o755).await.unwrap();
    let create = OpenOptions::new().write(true).create_new(true);
    let mut files = vec![];
    for i in 0..32 {
        files.push(Arc::new(
            create.open(&c, &format!("/w/f{i}")).await.unwrap(),
        ));
    }
    // A client that has not yet learnt where any target is writes 32 files at once: one
    // reading of the target list serves them all.
    let before = requests_to_mds(&fabric, "c");
    let mut writes = tokio::task::JoinSet::new();
    for f in &files {
        let f = f.clone();
        writes.spawn(async move { f.write_at(0, b"first bytes").await });
    }
    while let Some(w) = writes.join_next().await {
        w.unwrap().unwrap();
    }
    let asked = requests_to_mds(&fabric, "c") - before;
    assert!(
        asked <= 2,
        "{asked} requests to the MDS for 32 first writes"
    );
    for f in files {
        Arc::into_inner(f).unwrap().close().await.unwrap();
    }
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_the_mds_would_refuse_is_refused_here_not_answered_ahead() {
    let (cluster, _fabric, dir) = on_fabric("ahead-bad-name", 9).await;
    let a = ahead_in_d(&cluster, "first").await;
    let d = a.stat("/d").await.unwrap().fid;
    let create = OpenOptions::new().write(true).create_new(true);
    for bad in [&b"nul\0inside"[..], b"a/b", b"..", &[b'x'; 256]] {
        let e = create
            .open(
                &a,
                client::At::Entry {
                    parent: d,
                    name: bad,
                },
            )
            .await
            .unwrap_err();
        assert!(
            e.is(FsErrorKind::Invalid) || e.is(FsErrorKind::NameTooLong),
            "{bad:?}: {e}"
        );
        assert_eq!(a.unanswered(), 0, "{bad:?} was answered ahead");
    }
    a.settle_ahead().await.unwrap();
    assert!(a.sync().await.is_ok(), "no change failed after its answer");
    assert_eq!(
        a.readdir("/d").await.unwrap().len(),
        1,
        "only the first file is there"
    );
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
