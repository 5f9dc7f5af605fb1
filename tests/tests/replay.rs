//! Commit-behind and replay, with real processes: the MDS answers changes before they are
//! durable (here it commits only when asked), is killed with `kill -9`, and comes back; the
//! clients replay what it had not committed, in the order it was first applied.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use client::{Client, OpenOptions};
use lode_tests::{
    client_riding_restarts as connect, mds_committing_late as mds, oss_of as oss, scratch, Server,
};
use proto::Fid;

async fn create(c: &Client, path: &str) -> Fid {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .create_new(true)
        .open(c, path)
        .await
        .unwrap_or_else(|e| panic!("create {path}: {e}"));
    let fid = f.inode().fid;
    f.close().await.unwrap();
    fid
}

/// Waits until storage is in service: a file made then gets objects.
async fn storage_in_service(c: &Client) {
    let start = Instant::now();
    loop {
        let probe = OpenOptions::new()
            .write(true)
            .create(true)
            .open(c, "/probe")
            .await;
        if probe.is_ok_and(|f| {
            f.inode()
                .layout
                .is_some_and(|l| !l.components[0].objects.is_empty())
        }) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no storage in service"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn names(c: &Client, dir: &str) -> BTreeMap<String, Fid> {
    c.readdir(dir)
        .await
        .unwrap_or_else(|e| panic!("readdir {dir}: {e}"))
        .into_iter()
        .map(|e| (String::from_utf8(e.name).unwrap(), e.fid))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_changes_of_two_clients_are_replayed_in_order_after_kill_9_and_a_dead_clients_are_lost_alone(
) {
    let root = scratch("replay");
    let m = mds(&root, "127.0.0.1:0");
    let addr = m.nid.to_string();
    let listen = addr.trim_end_matches("@tcp").to_owned();
    let _oss: Vec<Server> = (0..2)
        .map(|i| oss(&root.join(format!("oss{i}")), &m.nid))
        .collect();
    let a = connect(&m.nid).await;
    let b = connect(&m.nid).await;
    let gone = connect(&m.nid).await;
    storage_in_service(&a).await;
    a.mkdir("/shared", 0o755).await.unwrap();
    // B's first create answered ahead sets inode numbers aside, which the MDS commits (with
    // everything before it): done here, so that what follows stays uncommitted.
    b.mkdir("/b", 0o755).await.unwrap();
    for i in 0..2 {
        create(&b, &format!("/b/setup{i}")).await;
    }
    b.settle_ahead().await.unwrap();
    a.sync().await.unwrap(); // the setup is durable; what follows is not
    let committed_before = a.uncommitted();
    assert_eq!(committed_before, 0);

    // Interleaved changes of two clients, some depending on the other's.
    let mut want: BTreeMap<String, Fid> = BTreeMap::new();
    a.mkdir("/a", 0o755).await.unwrap();
    for i in 0..40 {
        let fid = create(&a, &format!("/a/f{i}")).await;
        want.insert(format!("/a/f{i}"), fid);
        if i % 10 == 3 {
            let fid = create(&b, &format!("/shared/b{i}")).await;
            want.insert(format!("/shared/b{i}"), fid);
        }
    }
    // B moves a file A made; A renames one of its own over another; B removes one of A's.
    b.rename("/a/f5", "/shared/moved").await.unwrap();
    let fid = want.remove("/a/f5").unwrap();
    want.insert("/shared/moved".into(), fid);
    a.rename("/a/f6", "/a/f7").await.unwrap();
    let fid = want.remove("/a/f6").unwrap();
    want.insert("/a/f7".into(), fid);
    b.unlink("/a/f8").await.unwrap();
    want.remove("/a/f8");
    a.unlink("/shared/b13").await.unwrap();
    want.remove("/shared/b13");
    // A third client makes a directory and B a file in it; the third then dies holding its
    // change: B's depends on a change that is lost, and so is lost too (reported, not
    // silently wrong). A's file made after them keeps its own number.
    gone.mkdir("/lost", 0o755).await.unwrap();
    create(&b, "/lost/child").await;
    let fid = create(&a, "/a/after").await;
    want.insert("/a/after".into(), fid);
    // Changes answered ahead are in the MDS's hands (and held as tickets) once settled.
    a.settle_ahead().await.unwrap();
    b.settle_ahead().await.unwrap();
    assert!(
        a.uncommitted() > 40,
        "A's changes are answered before they commit"
    );
    assert!(b.uncommitted() > 4, "so are B's");
    // And some not yet sent or answered when the MDS dies: sent again once it is back.
    for i in 0..30 {
        let fid = create(&a, &format!("/a/q{i}")).await;
        want.insert(format!("/a/q{i}"), fid);
    }
    drop(gone);

    m.kill();
    let m = mds(&root, &listen);
    assert_eq!(m.nid.to_string(), addr);

    // Every acknowledged change of the clients that came back is there, once, with the FID
    // it was answered with.
    let started = Instant::now();
    let mut got = names(&a, "/a").await;
    let waited = started.elapsed();
    let mut all = BTreeMap::new();
    for (n, f) in std::mem::take(&mut got) {
        all.insert(format!("/a/{n}"), f);
    }
    for (n, f) in names(&b, "/shared").await {
        all.insert(format!("/shared/{n}"), f);
    }
    assert_eq!(all, want, "the namespace after replay");
    assert!(
        a.stat("/lost").await.is_err() && b.stat("/lost/child").await.is_err(),
        "the dead client's change, and what depended on it, are gone"
    );
    eprintln!("first answer after the restart: {waited:?}");
    // Nothing of it is held uncommitted any more once synced, and a new change works. B's
    // acknowledged change that could not be replayed is reported to it, once: never silent.
    a.sync().await.unwrap();
    let lost = b.sync().await.unwrap_err();
    assert!(lost.is(proto::FsErrorKind::Io), "{lost}");
    assert!(lost.to_string().contains("could not be replayed"), "{lost}");
    b.sync().await.unwrap();
    assert_eq!(a.uncommitted(), 0);
    let fid = create(&a, "/a/new").await;
    assert_ne!(Some(&fid), want.values().find(|f| **f == fid));

    // A second restart replays nothing twice: everything was committed by the syncs.
    a.sync().await.unwrap();
    m.kill();
    let m = mds(&root, &listen);
    let mut again = BTreeMap::new();
    for (n, f) in names(&a, "/a").await {
        again.insert(format!("/a/{n}"), f);
    }
    for (n, f) in names(&b, "/shared").await {
        again.insert(format!("/shared/{n}"), f);
    }
    want.insert("/a/new".into(), fid);
    assert_eq!(again, want);
    a.close().await.unwrap();
    b.close().await.unwrap();
    drop(m);
}

/// After an MDS restart, files created ahead while no storage target is in service yet (the
/// MDS answers their creates Busy) are sent again until one is, not failed: the caller was
/// told they exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_answered_ahead_wait_out_storage_not_yet_in_service_after_a_restart() {
    let root = scratch("replay-busy");
    let m = mds(&root, "127.0.0.1:0");
    let listen = m.nid.to_string().trim_end_matches("@tcp").to_owned();
    let oss_dir = root.join("oss0");
    let storage = oss(&oss_dir, &m.nid);
    let a = connect(&m.nid).await;
    storage_in_service(&a).await;
    a.mkdir("/d", 0o755).await.unwrap();
    a.sync().await.unwrap();

    // The storage server and then the MDS go; the MDS comes back alone: its only target is
    // registered but not heard from, so a create is refused for now.
    storage.kill();
    m.kill();
    let m = mds(&root, &listen);
    let dir = a.stat("/d").await.unwrap().fid;
    // The leases of the last run lapse (or go with the new run's first answer) before any of
    // this run's is granted.
    let start = Instant::now();
    while a.holds_lease(dir) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "a lease of the last run outlived its term"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while !a.holds_lease(dir) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no lease on the directory after the restart"
        );
        let _ = a.readdir("/d").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Answered here, ahead of the MDS: a create sent and waited for would wait for storage.
    let made = tokio::time::timeout(Duration::from_secs(10), async {
        let mut made = BTreeMap::new();
        for i in 0..20 {
            let p = format!("/d/f{i}");
            let fid = create(&a, &p).await;
            made.insert(format!("f{i}"), fid);
        }
        made
    })
    .await
    .expect("creates in a directory held alone are answered without waiting for storage");
    // Refused for now while no target is in service; the storage server's return lets them in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _storage = oss(&oss_dir, &m.nid);
    a.settle_ahead().await.unwrap();
    a.sync()
        .await
        .expect("no create answered ahead was failed for being refused for now");
    let b = connect(&m.nid).await;
    let mut seen = names(&b, "/d").await;
    assert_eq!(seen, made, "every file answered ahead is at the MDS");
    for n in std::mem::take(&mut seen).keys() {
        let i = b.stat(&format!("/d/{n}")).await.unwrap();
        assert!(
            i.layout
                .is_some_and(|l| !l.components[0].objects.is_empty()),
            "{n} got its objects once storage was in service"
        );
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}
