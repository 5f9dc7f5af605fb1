//! Several metadata targets over the same storage servers: each MDT numbers its inodes and
//! precreates its objects in sequences of its own, so a FID names its MDT, no two MDTs ever
//! hand out one object, and an MDT started on a directory formatted anew (the operator's slip
//! that once destroyed a whole storage server's objects) cleans up only its own sequence.
//!
//! The cluster: MDT0 and MDT1, each on its own MDS, and two storage servers registered with
//! both, on loopback with authentication on. MDT0's files go through the client library; MDT1
//! is also spoken to over the wire, under its own root, as a hostile client would.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError};
use oss::engine::mem::MemEngine;
use proto::fid::{mdt_of, mdt_root, object_seq};
use proto::md::*;
use proto::{FsErrorKind, Nid, StatusCode};

const T: Duration = Duration::from_secs(10);

fn data(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i * 13 % 251) as u8))
        .collect()
}

/// MDT0 and MDT1 on two MDSs and two storage servers on loopback, as `tweak` leaves the
/// builder, and a root client of MDT0 once every target takes stripes there.
async fn two_mdts(
    name: &str,
    tweak: impl FnOnce(ClusterBuilder) -> ClusterBuilder,
) -> (std::path::PathBuf, Cluster, Client) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let b = ClusterBuilder::new(Network::Loopback, &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50))
        .mdts(2);
    let c = tweak(b).start().await.unwrap();
    let admin = root_client(&c, "admin").await;
    c.wait_ready(&admin, 2, Duration::from_secs(20))
        .await
        .unwrap();
    (dir, c, admin)
}

/// A client of `c` acting as root, named `name`.
async fn root_client(c: &Cluster, name: &str) -> Client {
    let cfg = ClientConfig {
        creds: Creds::root(),
        ..ClientConfig::default()
    };
    c.client(name, cfg).await.unwrap()
}

/// Creates `name` under MDT1's root over the raw protocol, striped over both targets,
/// retrying while MDT1's pools are still filling (ENOSPC), and resending, as a client does,
/// while MDT1 is out of reach (a connection to the run before a restart); returns the new
/// inode.
async fn create_on_mdt1(raw: &TcpEndpoint, mdt1: &Nid, name: &str, req: u64) -> Inode {
    let layout = client::raid0(Some(2), 1 << 20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut resent = false;
    loop {
        let r = MdsReint::durable(
            Creds::root(),
            Mutation::Create {
                parent: mdt_root(1),
                name: name.as_bytes().to_vec(),
                kind: Kind::File,
                mode: 0o644,
                exclusive: true,
                target: vec![],
                layout: Some(layout.clone()),
            },
        );
        match call(raw, mdt1, &r, T).await {
            Ok(reply) => return reply.inode.expect("a create returns its inode"),
            Err(NetError::Remote { err, .. })
                if err.code == StatusCode::NoSpace && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                resent = true;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // An exclusive create resent after it was carried out: the file it made.
            Err(NetError::Remote { err, .. })
                if resent && err.code == StatusCode::Fs(FsErrorKind::Exists) =>
            {
                let r = MdsLookup {
                    creds: Creds::root(),
                    parent: mdt_root(1),
                    name: name.as_bytes().to_vec(),
                    lease: None,
                };
                return call(raw, mdt1, &r, T).await.unwrap().inode;
            }
            Err(e) => panic!("create {name} on MDT1 (request {req}): {e}"),
        }
    }
}

/// The objects of `inode`'s layout, as (target, sequence).
fn objects(inode: &Inode) -> Vec<(u32, u64)> {
    inode
        .layout
        .iter()
        .flat_map(|l| &l.components)
        .flat_map(|c| &c.objects)
        .map(|o| (o.target, o.fid.seq))
        .collect()
}

async fn write_file(c: &Client, path: &str, bytes: &[u8]) -> Inode {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .layout(client::raid0(Some(2), 1 << 20).unwrap())
        .open(c, path)
        .await
        .unwrap();
    f.write_at(0, bytes).await.unwrap();
    f.fsync().await.unwrap();
    f.close().await.unwrap();
    c.stat(path).await.unwrap()
}

async fn read_file(c: &Client, path: &str, len: usize) -> Vec<u8> {
    let f = OpenOptions::new().read(true).open(c, path).await.unwrap();
    let mut got = vec![0u8; len];
    let n = f.read_at(0, &mut got).await.unwrap();
    got.truncate(n);
    f.close().await.unwrap();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mdt_allocates_from_its_own_sequences_and_a_reformatted_mdt_destroys_nothing_of_another(
) {
    let (dir, mut c, admin) = two_mdts("lode-mdts", |b| b).await;

    // MDT0's files: inodes in MDT0's sequence, objects in MDT0's sequence on each target.
    let mut mine = vec![];
    for k in 0..4u8 {
        let path = format!("/f{k}");
        let bytes = data(k, (3 << 20) + 4099 * usize::from(k));
        let inode = write_file(&admin, &path, &bytes).await;
        assert_eq!(mdt_of(inode.fid), Some(0));
        let objs = objects(&inode);
        assert_eq!(objs.len(), 2);
        for (t, seq) in objs {
            assert_eq!(
                seq,
                object_seq(t, 0),
                "{path}: an object of MDT0's sequence"
            );
        }
        mine.push((path, bytes));
    }

    // MDT1's files: inodes numbered in MDT1's sequence, under its own root, and objects
    // precreated in MDT1's sequence on both targets.
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let mdt1 = c.mdt(1).expect("MDT1 runs").nid();
    let mut theirs = vec![];
    for k in 0..3u64 {
        let inode = create_on_mdt1(&raw, &mdt1, &format!("g{k}"), k).await;
        assert_eq!(mdt_of(inode.fid), Some(1), "{}", inode.fid);
        let objs = objects(&inode);
        assert_eq!(objs.len(), 2, "striped over both targets");
        for (t, seq) in &objs {
            assert_eq!(*seq, object_seq(*t, 1), "an object of MDT1's sequence");
        }
        theirs.push(inode);
    }
    // A name under MDT1's root is MDT1's alone: MDT0 knows nothing of it.
    let looked = call(
        &raw,
        &mdt1,
        &MdsLookup {
            creds: Creds::root(),
            parent: mdt_root(1),
            name: b"g0".to_vec(),
            lease: None,
        },
        T,
    )
    .await
    .unwrap();
    assert_eq!(looked.inode.fid, theirs[0].fid);
    assert!(admin.stat("/g0").await.is_err());

    // MDT1 is lost and its directory formatted anew: its first cleanup on each target takes
    // every object of its own sequence (none is a file's any more), and none of MDT0's.
    c.kill_mdt(1).await;
    let mdt1_dir = c.mdt_dir(1).unwrap();
    std::fs::remove_dir_all(&mdt1_dir).unwrap();
    std::fs::create_dir_all(&mdt1_dir).unwrap();
    c.start_mdt(1).await.unwrap();
    let mdt1 = c.mdt(1).expect("MDT1 runs again").nid();
    let again = create_on_mdt1(&raw, &mdt1, "g0", 100).await;
    assert_eq!(mdt_of(again.fid), Some(1));
    for (t, seq) in objects(&again) {
        assert_eq!(seq, object_seq(t, 1));
    }
    for (path, bytes) in &mine {
        assert_eq!(
            read_file(&admin, path, bytes.len() + 10).await,
            *bytes,
            "{path} read back whole after MDT1 started anew"
        );
    }
    // And MDT0 goes on making files on the same targets.
    let after = write_file(&admin, "/after", &data(9, 1 << 20)).await;
    assert_eq!(objects(&after).len(), 2);
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mkdir -i`: a directory placed on MDT1 from MDT0's root, used through the library as any
/// other (files written and read in it, listed, a directory on MDT0 again below it), with
/// every right decided by the servers: a non-empty one is not removed, a rename across MDTs
/// is EXDEV, a client cannot send either half of the change itself, and after an rmdir both
/// namespaces check clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_on_another_mdt_is_made_used_and_removed_through_the_parents_mds() {
    let (dir, c, admin) = two_mdts("lode-mdts-remote", |b| b).await;
    // MDT1 takes stripes once the servers joined it.
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let mdt1 = c.mdt(1).expect("MDT1 runs").nid();
    create_on_mdt1(&raw, &mdt1, "warmup", 1).await;

    let made = admin.mkdir_on("/remote", 0o755, 1).await.unwrap();
    assert_eq!(mdt_of(made.fid), Some(1));
    assert_eq!(made.kind, Kind::Dir);
    let seen = admin.stat("/remote").await.unwrap();
    assert_eq!(seen.fid, made.fid);
    // Its `..` is the root, on MDT0, with the root's attributes.
    let up = admin.lookup(made.fid, b"..").await.unwrap();
    let root = admin.stat("/").await.unwrap();
    assert_eq!(
        (up.fid, up.mode, up.nlink),
        (root.fid, root.mode, root.nlink)
    );
    // Files in it: their inodes and objects are MDT1's.
    let bytes = data(3, (2 << 20) + 123);
    let f = write_file(&admin, "/remote/f", &bytes).await;
    assert_eq!(mdt_of(f.fid), Some(1));
    for (t, seq) in objects(&f) {
        assert_eq!(seq, object_seq(t, 1));
    }
    assert_eq!(read_file(&admin, "/remote/f", bytes.len() + 1).await, bytes);
    // Its closes reach MDT1 (through the client's session there): no handle stays counted
    // there but those the client keeps past their close for the next open.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.mdt(1).unwrap().open_handles() > admin.kept_opens() {
        assert!(Instant::now() < deadline, "a close never reached MDT1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its attributes are MDT1's: its times moved with the file made in it.
    let after = admin.stat("/remote").await.unwrap();
    assert!(after.mtime >= made.mtime && after.nlink == 2);
    let names = |l: Vec<DirEntry>| -> Vec<String> {
        let mut v: Vec<String> = l
            .into_iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(names(admin.readdir("/").await.unwrap()).contains(&"remote".to_string()));
    assert_eq!(names(admin.readdir("/remote").await.unwrap()), vec!["f"]);
    // A plain directory in it stays on MDT1; one placed on MDT0 below it goes back there.
    let sub = admin.mkdir("/remote/sub", 0o755).await.unwrap();
    assert_eq!(mdt_of(sub.fid), Some(1));
    let back = admin.mkdir_on("/remote/sub/back", 0o755, 0).await.unwrap();
    assert_eq!(mdt_of(back.fid), Some(0));
    let g = write_file(&admin, "/remote/sub/back/g", &data(4, 5000)).await;
    assert_eq!(mdt_of(g.fid), Some(0));
    assert_eq!(
        read_file(&admin, "/remote/sub/back/g", 6000).await,
        data(4, 5000)
    );

    // A file renamed across MDTs moves its name (the file stays on MDT1), and so does a
    // directory (its tree stays on MDT1); one within MDT1 works.
    admin.rename("/remote/f", "/f").await.unwrap();
    assert_eq!(admin.stat("/f").await.unwrap().fid, f.fid);
    admin.rename("/f", "/remote/f").await.unwrap();
    let sub = admin.stat("/remote/sub").await.unwrap();
    admin.rename("/remote/sub", "/sub").await.unwrap();
    assert_eq!(admin.stat("/sub").await.unwrap().fid, sub.fid);
    assert_eq!(read_file(&admin, "/sub/back/g", 6000).await, data(4, 5000));
    admin.rename("/sub", "/remote/sub").await.unwrap();
    admin.rename("/remote/f", "/remote/sub/f").await.unwrap();
    // Not empty: refused by MDT1, and the name stays.
    let e = admin.rmdir("/remote").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotEmpty), "{e}");
    assert!(admin.stat("/remote").await.is_ok());

    // A client cannot register itself as an MDT (MDT0 would send storage servers and
    // clients to it), and the list stays as it was.
    let before = admin.mdts().await.unwrap();
    let forged = proto::registry::RegisterMdt {
        mdt: 1,
        fs: 0,
        nid: "127.0.0.1:1@tcp".parse().unwrap(),
        rails: vec![],
        inodes: 0,
    };
    match call(&raw, &c.mds().nid(), &forged, T).await {
        Err(NetError::Remote { err, .. }) => assert_eq!(
            err.code,
            StatusCode::Fs(proto::FsErrorKind::NotPermitted),
            "{err:?}"
        ),
        other => panic!("a client registering an MDT: {other:?}"),
    }
    assert_eq!(admin.mdts().await.unwrap(), before);
    // A client cannot send the halves of the change itself.
    for m in [
        Mutation::MkdirForRemote {
            parent: proto::fid::ROOT,
            name: b"forged".to_vec(),
            mode: 0o755,
            gid: 0,
            layout: None,
        },
        Mutation::LinkRemoteDir {
            parent: proto::fid::ROOT,
            name: b"forged".to_vec(),
            inode: sub.clone(),
        },
        Mutation::RmdirRemote { fid: made.fid },
    ] {
        let to = if matches!(
            m,
            Mutation::RmdirRemote { .. } | Mutation::MkdirForRemote { .. }
        ) {
            mdt1.clone()
        } else {
            c.mds().nid()
        };
        let r = MdsReint::durable(Creds::root(), m);
        match call(&raw, &to, &r, T).await {
            Err(NetError::Remote { err, .. }) => assert_eq!(
                err.code,
                StatusCode::Fs(proto::FsErrorKind::NotPermitted),
                "{err:?}"
            ),
            other => panic!("a client's half of a change across MDTs: {other:?}"),
        }
    }

    // A name whose directory is gone (a crash between the halves of an rmdir, made here by
    // removing the directory as its MDS would): rmdir of it removes the name.
    admin.mkdir_on("/dangling", 0o755, 1).await.unwrap();
    let gone = admin.stat("/dangling").await.unwrap();
    let server = TcpEndpoint::client(TcpConfig {
        security: c.server_security(),
        ..TcpConfig::default()
    });
    let r = MdsReint::durable(Creds::root(), Mutation::RmdirRemote { fid: gone.fid });
    call(&server, &mdt1, &r, T).await.unwrap();
    admin.rmdir("/dangling").await.unwrap();
    assert!(admin.stat("/dangling").await.is_err());

    // Emptied, it goes; both namespaces check clean.
    admin.unlink("/remote/sub/back/g").await.unwrap();
    admin.rmdir("/remote/sub/back").await.unwrap();
    admin.unlink("/remote/sub/f").await.unwrap();
    admin.rmdir("/remote/sub").await.unwrap();
    admin.rmdir("/remote").await.unwrap();
    let e = admin.stat("/remote").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotFound), "{e}");
    assert!(c.mds().fsck().is_empty(), "{:?}", c.mds().fsck());
    let mdt1_fsck = c.mdt(1).unwrap().fsck();
    assert!(mdt1_fsck.is_empty(), "{mdt1_fsck:?}");
    // A mkdir across MDTs cut short (the directory made on MDT1, never named), then the
    // check of both MDTs against each other, offline, names it.
    let r = MdsReint::durable(
        Creds::root(),
        Mutation::MkdirForRemote {
            parent: proto::fid::ROOT,
            name: b"never".to_vec(),
            mode: 0o755,
            gid: 0,
            layout: None,
        },
    );
    let orphan = call(&server, &mdt1, &r, T).await.unwrap().inode.unwrap();
    let dirs = [dir.join("mds"), c.mdt_dir(1).unwrap()];
    c.stop().await;
    let out = std::process::Command::new(lode_tests::bin("lode-mds"))
        .arg("fsck")
        .args(
            dirs.iter()
                .flat_map(|d| ["--data-dir".as_ref(), d.as_os_str()]),
        )
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{printed}");
    assert!(
        printed.contains("across the 2 MDTs: 1 problems"),
        "{printed}"
    );
    assert!(
        printed.contains(&orphan.fid.to_string()) && printed.contains("cut short"),
        "{printed}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mkdir and an rmdir of directories on MDT1, and a mkdir a parent's default places there,
/// asked while MDT1 is down, their clients gone, and MDT0's MDS killed -9 meanwhile: each was
/// recorded on MDT0 before MDT1 was asked, so once both MDSs are back MDT0 ends each one whole
/// (the directories made and named, the default passed on, the other removed with its name),
/// and the two MDTs check clean against each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mkdir_and_an_rmdir_across_mdts_cut_short_by_kill_9_end_whole() {
    let (dir, mut c, admin) = two_mdts("lode-mdts-placing", |b| {
        b.open_recovery(Duration::from_millis(500), Duration::from_secs(120))
    })
    .await;
    admin.mkdir_on("/gone", 0o755, 1).await.unwrap();
    let gone = admin.stat("/gone").await.unwrap();
    // A parent whose default places subdirectories on MDT1 and goes two levels down.
    admin.mkdir_on("/dflt", 0o755, 0).await.unwrap();
    let default = proto::dirstripe::DirDefault {
        count: 1,
        offset: Some(1),
        hash: proto::dirstripe::HashType::Fnv1a64.code(),
        inherit: 2,
    };
    admin.set_dir_default("/dflt", Some(default)).await.unwrap();
    c.kill_mdt(1).await;
    let asker = c
        .client(
            "asker",
            ClientConfig {
                creds: Creds::root(),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    let making = {
        let asker = asker.clone();
        tokio::spawn(async move { asker.mkdir_on("/half", 0o750, 1).await.map(|_| ()) })
    };
    let removing = {
        let asker = asker.clone();
        tokio::spawn(async move { asker.rmdir("/gone").await })
    };
    let defaulted = {
        let asker = asker.clone();
        tokio::spawn(async move { asker.mkdir("/dflt/sub", 0o755).await.map(|_| ()) })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !making.is_finished() && !removing.is_finished() && !defaulted.is_finished(),
        "a change on a down MDT answered"
    );
    // The client goes, and MDT0's MDS is killed with the changes recorded and unanswered.
    making.abort();
    removing.abort();
    defaulted.abort();
    drop(asker);
    c.kill_mds().await;
    c.start_mds().await.unwrap();
    c.start_mdt(1).await.unwrap();
    let check = c
        .client(
            "check",
            ClientConfig {
                creds: Creds::root(),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let made = check.stat("/half").await;
        let removed = check.stat("/gone").await;
        let spaces = [c.mdt(0).unwrap().namespace(), c.mdt(1).unwrap().namespace()];
        let problems = mds::across::check_across(&[&spaces[0], &spaces[1]]);
        match (&made, &removed) {
            (Ok(h), Err(e)) if e.is(FsErrorKind::NotFound) && problems.is_empty() => {
                assert_eq!((h.kind, h.mode & 0o7777), (Kind::Dir, 0o750));
                assert_eq!(mdt_of(h.fid), Some(1));
                break;
            }
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "after the restarts: mkdir {:?}, rmdir {:?}, {problems:?}",
            made.map(|i| i.fid),
            removed.map(|i| i.fid)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The subdirectory made by the default, carried on after the crash, passes it on.
    let deadline = Instant::now() + Duration::from_secs(30);
    let sub = loop {
        match check.stat("/dflt/sub").await {
            Ok(i) => break i,
            Err(e) => {
                assert!(Instant::now() < deadline, "/dflt/sub never made: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(mdt_of(sub.fid), Some(1));
    assert_eq!(
        check.dir_default("/dflt/sub").await.unwrap(),
        Some(proto::dirstripe::DirDefault {
            inherit: 1,
            ..default
        })
    );
    // The directory removed is gone from MDT1 too.
    let e = check.getattr(gone.fid).await.unwrap_err();
    assert!(e.is(FsErrorKind::Stale), "{e}");
    write_file(&check, "/half/f", &data(3, 5000)).await;
    assert_eq!(read_file(&check, "/half/f", 6000).await, data(3, 5000));
    assert!(c.mdt(0).unwrap().fsck().is_empty());
    assert!(c.mdt(1).unwrap().fsck().is_empty());
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// kill -9 of MDT1's MDS: what it acknowledged in a directory placed there survives its
/// restart (its changes are answered once durable), a mkdir placed on it while it is down
/// waits for it and completes, and MDT0 serves its own files throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_directory_survives_kill_9_of_its_mds_and_a_mkdir_waits_for_it() {
    let (dir, mut c, admin) = two_mdts("lode-mdts-kill", |b| {
        b.open_recovery(Duration::from_millis(500), Duration::from_secs(120))
    })
    .await;
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let mdt1 = c.mdt(1).expect("MDT1 runs").nid();
    create_on_mdt1(&raw, &mdt1, "warmup", 1).await;
    admin.mkdir_on("/r", 0o755, 1).await.unwrap();
    let mut kept = vec![];
    for k in 0..5u8 {
        let path = format!("/r/f{k}");
        let bytes = data(k, 100_000 + 777 * usize::from(k));
        write_file(&admin, &path, &bytes).await;
        kept.push((path, bytes));
    }
    admin.mkdir("/r/d", 0o700).await.unwrap();
    let local = write_file(&admin, "/mine", &data(7, 4096)).await;

    c.kill_mdt(1).await;
    // MDT0 goes on serving its own.
    assert_eq!(read_file(&admin, "/mine", 5000).await, data(7, 4096));
    assert_eq!(admin.stat("/mine").await.unwrap().fid, local.fid);
    // A mkdir placed on MDT1 waits for it (its MDS is resent to) and completes.
    let waiting = {
        let admin = admin.clone();
        tokio::spawn(async move { admin.mkdir_on("/later", 0o755, 1).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a mkdir on a down MDT answered");
    c.start_mdt(1).await.unwrap();
    let later = waiting.await.unwrap().unwrap();
    assert_eq!(mdt_of(later.fid), Some(1));
    for (path, bytes) in &kept {
        assert_eq!(
            read_file(&admin, path, bytes.len() + 1).await,
            *bytes,
            "{path}"
        );
    }
    let d = admin.stat("/r/d").await.unwrap();
    assert_eq!((d.kind, d.mode & 0o7777), (Kind::Dir, 0o700));
    assert!(c.mdt(1).unwrap().fsck().is_empty());
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_top_level_directories_spread_over_the_mdts_and_their_trees_stay_on_theirs() {
    let (dir, c, admin) = two_mdts("lode-mdts-spread", |b| b).await;
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let mdt1 = c.mdt(1).expect("MDT1 runs").nid();
    create_on_mdt1(&raw, &mdt1, "warmup", 1).await;
    // MDT0 spreads over the MDTs it heard from lately.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !admin
        .mdts()
        .await
        .unwrap()
        .iter()
        .any(|m| m.index == 1 && m.up)
    {
        assert!(Instant::now() < deadline, "MDT1 never registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A plain mkdir in the root, as every tool makes one: the jobs' trees land on both MDTs,
    // in turn while the MDTs hold about as many inodes.
    let mut on = [0; 2];
    for i in 0..6 {
        let job = admin.mkdir(&format!("/job{i}"), 0o755).await.unwrap();
        let mdt = mdt_of(job.fid).expect("a FID of an MDT");
        on[mdt as usize] += 1;
        assert_eq!(admin.stat(&format!("/job{i}")).await.unwrap().fid, job.fid);
        // Below it, everything stays on its MDT.
        let sub = admin.mkdir(&format!("/job{i}/sub"), 0o755).await.unwrap();
        assert_eq!(mdt_of(sub.fid), Some(mdt));
        let bytes = data(i as u8, 10_000 + i);
        let f = write_file(&admin, &format!("/job{i}/sub/f"), &bytes).await;
        assert_eq!(mdt_of(f.fid), Some(mdt));
        assert_eq!(
            read_file(&admin, &format!("/job{i}/sub/f"), bytes.len() + 1).await,
            bytes
        );
    }
    assert_eq!(
        on,
        [3, 3],
        "six top-level directories over two balanced MDTs"
    );
    // A name already there is refused whichever MDT would have taken it.
    let e = admin.mkdir("/job0", 0o755).await.unwrap_err();
    assert!(e.is(FsErrorKind::Exists), "{e}");
    // One whose MDT is named stays there.
    for i in 0..2 {
        let pinned = admin
            .mkdir_on(&format!("/pinned{i}"), 0o755, 0)
            .await
            .unwrap();
        assert_eq!(mdt_of(pinned.fid), Some(0));
    }
    // Renamed in place (a job's output renamed when done), wherever it lives, and moved to
    // another directory and back (one of MDT1 learns its new parent there).
    for i in 0..6 {
        let before = admin.stat(&format!("/job{i}")).await.unwrap();
        admin
            .rename(&format!("/job{i}"), &format!("/done{i}"))
            .await
            .unwrap();
        assert_eq!(
            admin.stat(&format!("/done{i}")).await.unwrap().fid,
            before.fid
        );
        assert!(admin.stat(&format!("/job{i}")).await.is_err());
        admin
            .rename(&format!("/done{i}"), &format!("/job{i}"))
            .await
            .unwrap();
        admin
            .rename(&format!("/job{i}"), &format!("/pinned0/job{i}"))
            .await
            .unwrap();
        assert_eq!(
            admin.stat(&format!("/pinned0/job{i}")).await.unwrap().fid,
            before.fid
        );
        admin
            .rename(&format!("/pinned0/job{i}"), &format!("/job{i}"))
            .await
            .unwrap();
        assert_eq!(
            admin.stat(&format!("/job{i}/sub/f")).await.unwrap().size,
            10_000 + i as u64
        );
    }
    // Listed and removed as any directory.
    let names: Vec<String> = admin
        .readdir("/")
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    for i in 0..6 {
        assert!(names.contains(&format!("job{i}")), "{names:?}");
        admin.unlink(&format!("/job{i}/sub/f")).await.unwrap();
        admin.rmdir(&format!("/job{i}/sub")).await.unwrap();
        admin.rmdir(&format!("/job{i}")).await.unwrap();
    }
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client walking through a leased directory of MDT0 to a directory of MDT1 takes the
/// entry from its cache (its MDT asked only for what is in it), and sees the entry go as soon
/// as another client renames or removes it: the recall of the parent drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_through_a_leased_directory_to_another_mdt_follows_renames_and_removals() {
    let (dir, c, admin) = two_mdts("lode-mdts-walks", |b| b).await;
    admin.mkdir_on("/t", 0o755, 0).await.unwrap();
    admin.mkdir_on("/t/c", 0o755, 1).await.unwrap();
    let walker = c
        .client(
            "walker",
            ClientConfig {
                creds: Creds::root(),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    for i in 0..3 {
        write_file(&walker, &format!("/t/c/f{i}"), &data(i, 100)).await;
    }
    for i in 0..3 {
        assert_eq!(walker.stat(&format!("/t/c/f{i}")).await.unwrap().size, 100);
    }
    // Renamed by another client: the walker's cached entry goes with the recall.
    admin.rename("/t/c", "/t/d").await.unwrap();
    let e = walker.stat("/t/c/f0").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotFound), "{e}");
    assert_eq!(read_file(&walker, "/t/d/f0", 200).await, data(0, 100));
    // Removed, and a new directory of the same name made on MDT0: found there.
    for i in 0..3 {
        admin.unlink(&format!("/t/d/f{i}")).await.unwrap();
    }
    admin.rmdir("/t/d").await.unwrap();
    let e = walker.stat("/t/d/f1").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotFound), "{e}");
    let again = admin.mkdir_on("/t/d", 0o755, 0).await.unwrap();
    write_file(&admin, "/t/d/g", &data(9, 50)).await;
    assert_eq!(walker.stat("/t/d/g").await.unwrap().size, 50);
    assert_eq!(walker.stat("/t/d").await.unwrap().fid, again.fid);
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Commit-behind and leases on MDT1, as on MDT0: a client's changes in a directory of MDT1
/// are answered before they are durable (its session with MDT1 keeps them), the directory is
/// held under MDT1's lease, another client sees every change at once (the lease recalled, what
/// was answered ahead sent first), and after kill -9 of MDT1 (its journal's tail lost) the
/// client replays them to MDT1 alone: every name is back, and MDT1 checks clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_on_mdt1_are_answered_behind_under_its_leases_and_replayed_after_its_kill_9() {
    let (dir, mut c, admin) = two_mdts("lode-mdts-behind", |b| {
        b.deferred_commit()
            .open_recovery(Duration::from_millis(500), Duration::from_secs(120))
    })
    .await;
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let mdt1 = c.mdt(1).expect("MDT1 runs").nid();
    create_on_mdt1(&raw, &mdt1, "warmup", 1).await;
    let r = admin.mkdir_on("/r", 0o755, 1).await.unwrap();
    assert_eq!(mdt_of(r.fid), Some(1));
    admin.sync().await.unwrap();
    assert_eq!(admin.uncommitted(), 0);

    let mut names = BTreeSet::new();
    for k in 0..10 {
        admin.mkdir(&format!("/r/d{k}"), 0o750).await.unwrap();
        names.insert(format!("d{k}"));
    }
    for k in 0..30 {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .open(&admin, format!("/r/f{k}").as_str())
            .await
            .unwrap();
        f.write_at(0, format!("{k}").as_bytes()).await.unwrap();
        f.close().await.unwrap();
        names.insert(format!("f{k}"));
    }
    admin.unlink("/r/f0").await.unwrap();
    names.remove("f0");
    admin.settle_ahead().await.unwrap();
    assert!(
        admin.uncommitted() > 0,
        "MDT1 answered every change once durable"
    );
    assert!(admin.holds_lease(r.fid), "no lease from MDT1");
    // Answered from the lease cache: MDT1 holds it whole.
    assert!(admin.lookup_cached(r.fid, b"f1").is_some());
    assert!(admin
        .lookup_cached(r.fid, b"f0")
        .is_some_and(|l| l.is_err()));

    // Another client sees every change at once.
    let other = root_client(&c, "other").await;
    let seen: BTreeSet<String> = other
        .readdir("/r")
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    assert_eq!(seen, names);
    other.close().await.unwrap();
    drop(other);

    // MDT1 loses what it had not committed; the client replays it there.
    assert!(admin.uncommitted() > 0);
    c.kill_mdt(1).await;
    c.start_mdt(1).await.unwrap();
    let listed: BTreeSet<String> = admin
        .readdir("/r")
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    assert_eq!(listed, names, "the names after MDT1's restart");
    for k in 1..30 {
        let f = OpenOptions::new()
            .read(true)
            .open(&admin, format!("/r/f{k}").as_str())
            .await
            .unwrap();
        assert_eq!(f.inode().size, format!("{k}").len() as u64, "f{k}");
        f.close().await.unwrap();
    }
    let d = admin.stat("/r/d3").await.unwrap();
    assert_eq!((d.kind, d.mode & 0o7777), (Kind::Dir, 0o750));
    admin.sync().await.unwrap();
    assert_eq!(admin.uncommitted(), 0);
    assert!(c.mdt(1).unwrap().fsck().is_empty());
    admin.close().await.unwrap();
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
