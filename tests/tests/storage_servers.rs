//! lode-mds and lode-oss as an operator runs them: separate processes on loopback, targets
//! registered with the MDS, data written through the network, and servers killed with
//! `kill -9` and restarted.

use std::time::Duration;

use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, Transport};
use lode_tests::{run, scratch, Server};
use proto::ost::*;
use proto::registry::ListTargets;

const T: Duration = Duration::from_secs(10);

fn mds(dir: &std::path::Path) -> Server {
    Server::start(
        "lode-mds",
        &[
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .unwrap()
}

fn oss(dir: &std::path::Path, mds: &Server, listen: &str, targets: &str) -> Result<Server, String> {
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
            targets,
            "--heartbeat",
            "1",
        ],
    )
}

// Long by design: one cluster through registration, writes, kill -9 and restart, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_register_and_acknowledged_writes_survive_kill_9() {
    let root = scratch("servers");
    let mds = mds(&root.join("mds"));
    let oss_dir = root.join("oss0");
    let server = oss(&oss_dir, &mds, "127.0.0.1:0", "2").unwrap();
    let oss_nid = server.nid.clone();

    let client = TcpEndpoint::client(TcpConfig {
        security: lode_tests::server_security(),
        ..TcpConfig::default()
    });
    let listed = call(&client, &mds.nid, &ListTargets {}, T).await.unwrap();
    let indices: Vec<u32> = listed.targets.iter().map(|t| t.index).collect();
    assert_eq!(indices, vec![0, 1]);
    // Under the default `--io auto`, each target measured its device and kept the figures.
    let targets = oss::server::target_dirs(&oss_dir).unwrap();
    assert_eq!(targets.len(), 2);
    for t in &targets {
        let p = oss::io_policy::IoProfile::load(t).expect("a kept device profile");
        assert!(p.direct_write > 0.0 && p.buffered_read > 0.0, "{p:?}");
    }
    assert!(listed
        .targets
        .iter()
        .all(|t| t.oss == oss_nid && t.up && t.total > 0));

    // The MDS first destroys each new target's objects above those it knows (orphans): the
    // objects this test makes for itself come after that, once a file can be created.
    let in_service = eventually(|| {
        let (c, nid) = (&client, mds.nid.clone());
        async move {
            call(
                c,
                &nid,
                &create(proto::fid::ROOT, "probe", Kind::File, None),
                T,
            )
            .await
            .is_ok()
        }
    })
    .await;
    assert!(in_service, "the targets never came into service");

    // Two files, each with one object the MDS handed out on this server: its cleanup at the
    // server's registration (after the restart below too) keeps them.
    let object = |name: &'static str| {
        let (c, nid) = (&client, mds.nid.clone());
        async move {
            let made = call(
                c,
                &nid,
                &create(proto::fid::ROOT, name, Kind::File, None),
                T,
            )
            .await
            .unwrap();
            let o = made.inode.unwrap().layout.unwrap().components[0].objects[0];
            (o.target, o.fid)
        }
    };
    // A synced write, then a write followed by a sync: both acknowledged as durable.
    let (t1, fid) = object("data1").await;
    let (t2, fid2) = object("data2").await;
    let data: Vec<u8> = (0..(3 << 20) + 123)
        .map(|i: u32| (i * 31 % 256) as u8)
        .collect();
    let src = client.register(data.clone()).unwrap();
    let desc = src.desc(0, data.len() as u32, true).unwrap();
    call(
        &client,
        &oss_nid,
        &OstWrite {
            capa: None,
            target: t1,
            fid,
            offset: 0,
            desc: desc.clone(),
            sync: true,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap();
    call(
        &client,
        &oss_nid,
        &OstWrite {
            capa: None,
            target: t2,
            fid: fid2,
            offset: 4096,
            desc,
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap();
    call(
        &client,
        &oss_nid,
        &OstSync {
            capa: None,
            target: t2,
            fid: fid2,
        },
        T,
    )
    .await
    .unwrap();

    // A second server on the same data directory is refused while the first runs.
    let second = oss(&oss_dir, &mds, "127.0.0.1:0", "2");
    assert!(
        second.is_err(),
        "a second lode-oss started on a directory in use"
    );
    let (ok, _, err) = run(
        "lode-oss",
        &["scrub", "--data-dir", oss_dir.to_str().unwrap()],
    );
    assert!(!ok && err.contains("in use"), "{err}");

    server.kill();
    let err = call(
        &client,
        &oss_nid,
        &OstGetattr {
            target: t1,
            fid,
            capa: None,
        },
        Duration::from_secs(2),
    )
    .await
    .unwrap_err();
    assert!(err.is_retryable(), "{err}");

    // Restart on the same address: the same targets, indices and data.
    let server = oss(
        &oss_dir,
        &mds,
        &oss_nid.to_string().replace("@tcp", ""),
        "2",
    )
    .unwrap();
    assert_eq!(server.nid, oss_nid);
    let dst = client.register(vec![0u8; 4 << 20]).unwrap();
    for (t, f, off) in [(t1, fid, 0u64), (t2, fid2, 4096)] {
        let read = OstRead {
            capa: None,
            target: t,
            fid: f,
            offset: off,
            desc: dst.desc(0, 4 << 20, false).unwrap(),
        };
        let done = call(&client, &oss_nid, &read, T).await.unwrap();
        assert_eq!(done.bytes as usize, data.len());
        assert_eq!(
            dst.read(0, data.len() as u64).unwrap().as_slice(),
            &data[..]
        );
    }
    let listed = call(&client, &mds.nid, &ListTargets {}, T).await.unwrap();
    assert_eq!(
        listed.targets.len(),
        2,
        "a restart registers the same targets, not new ones"
    );

    // SIGTERM stops the server cleanly, and then scrub finds every block intact.
    assert!(server.terminate().success());
    let (ok, out, err) = run(
        "lode-oss",
        &["scrub", "--data-dir", oss_dir.to_str().unwrap()],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("0 bad blocks"), "{out}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn the_mds_keeps_index_assignments_across_kill_9() {
    let root = scratch("mds-restart");
    let first = mds(&root.join("mds"));
    let oss_server = oss(&root.join("oss"), &first, "127.0.0.1:0", "3").unwrap();
    let addr = first.nid.to_string().replace("@tcp", "");
    first.kill();
    oss_server.kill();
    let again = Server::start(
        "lode-mds",
        &[
            "--data-dir",
            root.join("mds").to_str().unwrap(),
            "--listen",
            &addr,
        ],
    )
    .unwrap();
    let client = TcpEndpoint::client(TcpConfig {
        security: lode_tests::server_security(),
        ..TcpConfig::default()
    });
    let listed = call(&client, &again.nid, &ListTargets {}, T).await.unwrap();
    assert_eq!(
        listed.targets.iter().map(|t| t.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // A new server's targets get new indices.
    let other = oss(&root.join("oss-b"), &again, "127.0.0.1:0", "1").unwrap();
    assert!(other.first_line.contains("[3]"), "{}", other.first_line);
    std::fs::remove_dir_all(&root).unwrap();
}

use proto::layout::{Component, Layout, StripeCount};
use proto::md::*;

use proto::fid::ROOT;

fn reint(m: Mutation) -> MdsReint {
    MdsReint {
        creds: Creds::root(),
        mutation: m,
        req: None,
        acked: 0,
        open: None,
        size_gen: None,
        behind: false,
        lease: false,
        time: None,
    }
}

fn create(parent: proto::Fid, name: &str, kind: Kind, layout: Option<Layout>) -> MdsReint {
    reint(Mutation::Create {
        parent,
        name: name.into(),
        kind,
        mode: 0o755,
        exclusive: true,
        target: vec![],
        layout,
    })
}

/// Waits (bounded) until `check` holds; for effects of the MDS's background work.
async fn eventually<F: std::future::Future<Output = bool>>(mut check: impl FnMut() -> F) -> bool {
    for _ in 0..100 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

// Long by design: one cluster through create, remove, cleanup, restart and orphan removal, in
// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_get_objects_on_targets_and_removed_files_lose_them() {
    let root = scratch("alloc");
    let mds = mds(&root.join("mds"));
    let oss_server = oss(&root.join("oss"), &mds, "127.0.0.1:0", "2").unwrap();
    let c = TcpEndpoint::client(TcpConfig {
        security: lode_tests::server_security(),
        ..TcpConfig::default()
    });

    // A file without a layout gets the default: one object.
    let f = call(&c, &mds.nid, &create(ROOT, "plain", Kind::File, None), T)
        .await
        .unwrap()
        .inode
        .unwrap();
    let objects: Vec<_> = f.layout.as_ref().unwrap().components[0].objects.clone();
    assert_eq!(objects.len(), 1);
    call(
        &c,
        &oss_server.nid,
        &OstGetattr {
            capa: None,
            target: objects[0].target,
            fid: objects[0].fid,
        },
        T,
    )
    .await
    .unwrap();

    // A directory striping over every target passes that on; the objects land on distinct targets.
    let wide = Layout::new(vec![Component::raid0(StripeCount::All, 1 << 20)]).unwrap();
    let d = call(
        &c,
        &mds.nid,
        &create(ROOT, "wide", Kind::Dir, Some(wide)),
        T,
    )
    .await
    .unwrap()
    .inode
    .unwrap();
    let g = call(&c, &mds.nid, &create(d.fid, "striped", Kind::File, None), T)
        .await
        .unwrap()
        .inode
        .unwrap();
    let gobj = g.layout.as_ref().unwrap().components[0].objects.clone();
    let mut targets: Vec<u32> = gobj.iter().map(|o| o.target).collect();
    targets.sort();
    assert_eq!(targets, vec![0, 1]);

    // A client cannot name objects itself.
    let mut forged = g.layout.clone().unwrap();
    forged.generation = 1;
    let err = call(
        &c,
        &mds.nid,
        &create(ROOT, "forged", Kind::File, Some(forged)),
        T,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("cannot name objects"), "{err}");

    // Unlink: the objects are destroyed in the background.
    call(
        &c,
        &mds.nid,
        &reint(Mutation::Unlink {
            parent: d.fid,
            name: b"striped".to_vec(),
            dir: false,
        }),
        T,
    )
    .await
    .unwrap();
    let gone = eventually(|| {
        let (c, nid, gobj) = (&c, oss_server.nid.clone(), gobj.clone());
        async move {
            let mut all = true;
            for o in &gobj {
                all &= call(
                    c,
                    &nid,
                    &OstGetattr {
                        capa: None,
                        target: o.target,
                        fid: o.fid,
                    },
                    T,
                )
                .await
                .is_err();
            }
            all
        }
    })
    .await;
    assert!(gone, "the unlinked file's objects were never destroyed");
    let stats = call(&c, &mds.nid, &MdsStatfs {}, T).await.unwrap();
    assert_eq!((stats.targets, stats.targets_up), (2, 2));
    assert!(stats.free > 0 && stats.inodes >= 3);

    // The MDS dies with precreated objects in its pools; after it restarts, they are destroyed
    // as orphans, and the objects files hold stay.
    let kept = objects[0];
    // The last object of the first precreated batch: precreated, never given to a file.
    let orphan = proto::Fid::new(kept.fid.seq, mds::alloc::BATCH - 1, 0);
    call(
        &c,
        &oss_server.nid,
        &OstGetattr {
            capa: None,
            target: kept.target,
            fid: orphan,
        },
        T,
    )
    .await
    .unwrap();
    let addr = mds.nid.to_string().replace("@tcp", "");
    mds.kill();
    let mds = Server::start(
        "lode-mds",
        &[
            "--data-dir",
            root.join("mds").to_str().unwrap(),
            "--listen",
            &addr,
        ],
    )
    .unwrap();
    let cleaned = eventually(|| {
        let (c, nid) = (&c, oss_server.nid.clone());
        async move {
            call(
                c,
                &nid,
                &OstGetattr {
                    capa: None,
                    target: kept.target,
                    fid: orphan,
                },
                T,
            )
            .await
            .is_err()
        }
    })
    .await;
    assert!(cleaned, "orphan object {orphan} was never destroyed");
    call(
        &c,
        &oss_server.nid,
        &OstGetattr {
            capa: None,
            target: kept.target,
            fid: kept.fid,
        },
        T,
    )
    .await
    .unwrap();
    // Files still get objects after the restart.
    let h = call(&c, &mds.nid, &create(ROOT, "after", Kind::File, None), T)
        .await
        .unwrap()
        .inode
        .unwrap();
    assert_eq!(h.layout.unwrap().components[0].objects.len(), 1);
    // Servers stopped before their files go: a live server may still be writing there.
    drop(oss_server);
    drop(mds);
    let _ = std::fs::remove_dir_all(&root);
}
